//! The egress proxy: the only way out of a sandbox that was granted network.
//!
//! Such a sandbox sits on an internal Docker network with no route out; one listener of this
//! proxy is bound on that network's gateway address, so the listener a connection arrives on
//! names the sandbox (no client-supplied identity). It speaks the two forms HTTP clients use
//! through `HTTP_PROXY`/`HTTPS_PROXY`: `CONNECT host:port` (a TLS tunnel, the proxy never sees
//! inside) and absolute-form plain HTTP (`GET http://host/path`, forwarded with
//! `Connection: close` so one connection carries one checked host). The target passes the same
//! gates as `web.fetch` ([`Egress::admit`]): the sandbox's domain rules (entries without a port
//! admit 80 and 443 only), then resolve-once with every address checked against the blocked
//! ranges and the denylist's CIDR blocks, and the connection is made to the checked address. Every connection, admitted or refused, becomes one audit row with the
//! sandbox, host, port, bytes each way and the decision.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::domains::DomainPolicy;
use super::Egress;
use aegis_core::caller::{Caller, CallerKind, Tier};
use aegis_store::audit::{self, Entry, EntryKind};

/// Ports a host entry without an explicit port admits through the proxy.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];
/// Largest request head read before the target is known.
const MAX_HEAD: usize = 16 * 1024;
/// Time a client has to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Who a listener serves and under which rules.
#[derive(Debug, Clone)]
pub struct ProxyScope {
    /// The sandbox (recorded as the audit caller `sandbox:<id>`).
    pub sandbox: String,
    /// Its domain rules (from its manifest's `spec.security.network`).
    pub domains: DomainPolicy,
}

/// Rules read afresh for every connection, so they can change while the proxy runs (E2B's
/// `PUT /sandboxes/{id}/network`, on whichever replica it arrives). An error refuses the
/// connection (fail closed), with the message as the reason.
pub trait LiveRules: Send + Sync {
    /// The domain rules that apply to a connection opened now.
    fn current(
        &self,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<DomainPolicy, String>> + Send + '_>,
    >;
}

/// Where a listener's rules come from.
enum Rules {
    /// Fixed for its life (an agent version's, a workflow step's).
    Fixed(DomainPolicy),
    /// Read for each connection.
    Live(Arc<dyn LiveRules>),
}

/// One running listener; stops when dropped or stopped.
pub struct EgressProxy {
    addr: SocketAddr,
    stop: CancellationToken,
}

impl EgressProxy {
    /// Binds `bind` and serves connections for `scope` until stopped.
    pub async fn start(
        bind: SocketAddr,
        scope: ProxyScope,
        egress: Arc<Egress>,
        pool: PgPool,
    ) -> std::io::Result<Self> {
        let shared = Shared {
            sandbox: scope.sandbox,
            rules: Rules::Fixed(scope.domains.with_default_ports(&DEFAULT_PORTS)),
            egress,
            pool,
        };
        Self::listen(bind, shared).await
    }

    /// Binds `bind` and serves connections of `sandbox` until stopped, each under the rules
    /// `rules` gives when it opens.
    pub async fn start_live(
        bind: SocketAddr,
        sandbox: String,
        rules: Arc<dyn LiveRules>,
        egress: Arc<Egress>,
        pool: PgPool,
    ) -> std::io::Result<Self> {
        let shared = Shared {
            sandbox,
            rules: Rules::Live(rules),
            egress,
            pool,
        };
        Self::listen(bind, shared).await
    }

    async fn listen(bind: SocketAddr, shared: Shared) -> std::io::Result<Self> {
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let shared = Arc::new(shared);
        let sandbox = shared.sandbox.clone();
        let token = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = token.cancelled() => break,
                    accepted = listener.accept() => match accepted {
                        Ok((stream, peer)) => {
                            let shared = shared.clone();
                            let token = token.clone();
                            tokio::spawn(async move {
                                tokio::select! {
                                    _ = token.cancelled() => {}
                                    _ = shared.serve(stream, peer) => {}
                                }
                            });
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "egress proxy: accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }
        });
        tracing::info!(%addr, %sandbox, "egress proxy listening");
        Ok(Self { addr, stop })
    }

    /// Where the proxy listens (what `HTTP_PROXY` points at).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and cuts open tunnels.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

struct Shared {
    /// The sandbox (recorded as the audit caller `sandbox:<id>`).
    sandbox: String,
    rules: Rules,
    egress: Arc<Egress>,
    pool: PgPool,
}

/// What the client asked for.
struct Target {
    method: String,
    host: String,
    port: u16,
    /// For plain HTTP: the rewritten head to send upstream.
    forward_head: Option<Vec<u8>>,
}

/// A refusal: the status sent to the client and the audit reason code.
struct Refusal {
    status: u16,
    code: &'static str,
    message: String,
}

impl Shared {
    async fn serve(&self, mut client: TcpStream, peer: SocketAddr) {
        let started = Instant::now();
        let (head, rest) = match read_head(&mut client).await {
            Ok(v) => v,
            Err(message) => {
                let refusal = Refusal {
                    status: 400,
                    code: "bad_request",
                    message,
                };
                self.refuse(&mut client, None, refusal, started).await;
                return;
            }
        };
        let target = match parse_target(&head) {
            Ok(t) => t,
            Err(refusal) => {
                self.refuse(&mut client, None, refusal, started).await;
                return;
            }
        };
        let live;
        let domains = match &self.rules {
            Rules::Fixed(domains) => domains,
            Rules::Live(rules) => match rules.current().await {
                Ok(domains) => {
                    live = domains.with_default_ports(&DEFAULT_PORTS);
                    &live
                }
                Err(message) => {
                    let refusal = Refusal {
                        status: 403,
                        code: "rules_unavailable",
                        message,
                    };
                    self.refuse(&mut client, Some(&target), refusal, started)
                        .await;
                    return;
                }
            },
        };
        let addrs = match self.egress.admit(domains, &target.host, target.port).await {
            Ok(a) => a,
            Err(e) => {
                let code = e.code();
                let refusal = Refusal {
                    status: if code == "name_not_resolved" {
                        502
                    } else {
                        403
                    },
                    code,
                    message: e.to_string(),
                };
                self.refuse(&mut client, Some(&target), refusal, started)
                    .await;
                return;
            }
        };
        let (upstream, last_error) = self.connect(&addrs).await;
        let Some(mut upstream) = upstream else {
            let refusal = Refusal {
                status: 502,
                code: "connect_failed",
                message: format!(
                    "cannot connect to {}:{}: {last_error}",
                    target.host, target.port
                ),
            };
            self.refuse(&mut client, Some(&target), refusal, started)
                .await;
            return;
        };
        let (outcome, sent, received) = relay(&mut client, &mut upstream, &target, &rest).await;
        tracing::debug!(%peer, host = %target.host, port = target.port, sent, received, "egress proxy: connection closed");
        self.record(
            Some(&target),
            true,
            None,
            format!(
                "{} {}:{} (connected to {}): {sent} bytes sent, {received} bytes received",
                target.method,
                target.host,
                target.port,
                addrs.first().map(|a| a.to_string()).unwrap_or_default()
            ),
            outcome,
            json!({"bytes_sent": sent, "bytes_received": received}),
            started,
        )
        .await;
    }

    /// Connecting is tried on each admitted address in turn, each within the connect timeout;
    /// gives the first connection, or none and the last failure.
    async fn connect(&self, addrs: &[SocketAddr]) -> (Option<TcpStream>, String) {
        let mut last_error = String::new();
        for addr in addrs {
            match tokio::time::timeout(self.egress.connect_timeout, TcpStream::connect(addr)).await
            {
                Ok(Ok(s)) => return (Some(s), last_error),
                Ok(Err(e)) => last_error = format!("{addr}: {e}"),
                Err(_) => last_error = format!("{addr}: connect timed out"),
            }
        }
        (None, last_error)
    }

    async fn refuse(
        &self,
        client: &mut TcpStream,
        target: Option<&Target>,
        refusal: Refusal,
        started: Instant,
    ) {
        let reason = match refusal.status {
            400 => "Bad Request",
            403 => "Forbidden",
            _ => "Bad Gateway",
        };
        let body = format!("egress proxy: {}\n", refusal.message);
        let response = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            refusal.status,
            body.len()
        );
        let _ = client.write_all(response.as_bytes()).await;
        let _ = client.shutdown().await;
        self.record(
            target,
            false,
            Some(refusal.code),
            refusal.message,
            "denied",
            json!({"status": refusal.status}),
            started,
        )
        .await;
    }

    #[allow(clippy::too_many_arguments)]
    async fn record(
        &self,
        target: Option<&Target>,
        allowed: bool,
        code: Option<&str>,
        reason: String,
        outcome: &'static str,
        result: serde_json::Value,
        started: Instant,
    ) {
        let caller = Caller {
            kind: CallerKind::System,
            id: format!("sandbox:{}", self.sandbox),
            label: "egress proxy".to_owned(),
            tier: Tier::User,
            role: None,
            tenant: aegis_core::DEFAULT_TENANT.to_owned(),
            seal: None,
        };
        let args = json!({
            "sandbox": self.sandbox,
            "method": target.map(|t| t.method.as_str()),
            "host": target.map(|t| t.host.as_str()),
            "port": target.map(|t| t.port),
        });
        let entry = Entry {
            kind: EntryKind::Tool,
            action: "egress.connect".to_owned(),
            allowed,
            reason_code: code.map(str::to_owned),
            reason: Some(format!("sandbox {}: {reason}", self.sandbox)),
            args_digest: audit::digest(&args),
            outcome,
            result_digest: Some(audit::digest(&result)),
            duration_ms: started.elapsed().as_millis() as i64,
            sandbox_id: self.sandbox.parse().ok(),
        };
        if let Err(e) = audit::record(&self.pool, &caller, entry).await {
            tracing::error!(error = %e, sandbox = %self.sandbox, "egress proxy: audit row not written");
        }
    }
}

/// The relay, once connected: the proxy's answer (CONNECT) or the forwarded request head, the
/// bytes read past the head, then both directions until either side closes. Gives the outcome
/// and the bytes sent and received.
async fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    target: &Target,
    rest: &[u8],
) -> (&'static str, u64, u64) {
    let mut up_bytes = 0u64;
    let setup = async {
        match &target.forward_head {
            None => {
                client
                    .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                    .await?;
            }
            Some(head) => {
                upstream.write_all(head).await?;
                up_bytes += head.len() as u64;
            }
        }
        upstream.write_all(rest).await?;
        up_bytes += rest.len() as u64;
        Ok::<(), std::io::Error>(())
    };
    let relayed = match setup.await {
        Ok(()) => tokio::io::copy_bidirectional(client, upstream).await,
        Err(e) => Err(e),
    };
    match relayed {
        Ok((to_upstream, to_client)) => ("ok", up_bytes + to_upstream, to_client),
        Err(_) => ("error", up_bytes, 0),
    }
}

/// Reads up to the end of the request head; returns the head and any bytes after it.
async fn read_head(client: &mut TcpStream) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut buf = Vec::with_capacity(2048);
    let read = async {
        loop {
            if let Some(end) = find_head_end(&buf) {
                let rest = buf.split_off(end);
                return Ok((buf, rest));
            }
            if buf.len() >= MAX_HEAD {
                return Err(format!("request head longer than {MAX_HEAD} bytes"));
            }
            let mut chunk = [0u8; 4096];
            let n = client
                .read(&mut chunk)
                .await
                .map_err(|e| format!("reading the request: {e}"))?;
            if n == 0 {
                return Err("connection closed before a complete request head".to_owned());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(HEAD_TIMEOUT, read)
        .await
        .map_err(|_| format!("no request head within {} s", HEAD_TIMEOUT.as_secs()))?
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

fn bad(message: impl Into<String>) -> Refusal {
    Refusal {
        status: 400,
        code: "bad_request",
        message: message.into(),
    }
}

/// Parses the head into a target; plain HTTP heads are rewritten for the origin server.
fn parse_target(head: &[u8]) -> Result<Target, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err(bad("incomplete request head")),
        Err(e) => return Err(bad(format!("malformed request head: {e}"))),
    }
    let method = request.method.unwrap_or_default().to_owned();
    let path = request.path.unwrap_or_default();
    if method == "CONNECT" {
        let (host, port) = split_authority(path)
            .ok_or_else(|| bad(format!("CONNECT needs host:port, not `{path}`")))?;
        return Ok(Target {
            method,
            host,
            port,
            forward_head: None,
        });
    }
    let url = url::Url::parse(path).map_err(|_| {
        bad(format!(
            "a proxy request needs an absolute http:// URL, not `{path}` (use CONNECT for https)"
        ))
    })?;
    if url.scheme() != "http" {
        return Err(bad(format!(
            "only http:// is forwarded in plain form, not `{}:` (use CONNECT for https)",
            url.scheme()
        )));
    }
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.trim_end_matches('.').to_ascii_lowercase(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        None => return Err(bad(format!("`{path}` has no host"))),
    };
    let port = url.port_or_known_default().unwrap_or(80);
    let mut origin_form = url.path().to_owned();
    if let Some(q) = url.query() {
        origin_form.push('?');
        origin_form.push_str(q);
    }
    let mut out = format!(
        "{method} {origin_form} HTTP/1.{}\r\n",
        request.version.unwrap_or(1)
    );
    let authority = match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_owned(),
    };
    out.push_str(&format!("Host: {authority}\r\n"));
    for h in request.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if name == "host"
            || name == "connection"
            || name.starts_with("proxy-")
            || name == "keep-alive"
        {
            continue;
        }
        out.push_str(h.name);
        out.push_str(": ");
        out.push_str(&String::from_utf8_lossy(h.value));
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    Ok(Target {
        method,
        host,
        port,
        forward_head: Some(out.into_bytes()),
    })
}

/// `host:port` or `[v6]:port` -> (host, port).
fn split_authority(authority: &str) -> Option<(String, u16)> {
    let (host, port) = authority.rsplit_once(':')?;
    let port = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return None;
    }
    Some((host.trim_end_matches('.').to_ascii_lowercase(), port))
}
