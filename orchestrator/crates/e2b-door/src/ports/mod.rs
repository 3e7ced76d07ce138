//! Ports in: a request to a port of an E2B sandbox, through the node, never through a port
//! published on the host and without giving the sandbox a network. E2B's `get_host(port)` is
//! `<port>-<sandbox id>.<domain>` (`e2b.domain`, the `sandbox_domain` create and get answer);
//! E2B's headers `E2b-Sandbox-Id` + `E2b-Sandbox-Port` name the same on any host
//! ([`address`]). Such a request never reaches the node's own routes: this layer answers it.
//!
//! The connection to the port is made by the sandbox's executor (`port.open`, inside the
//! sandbox's network namespace, to `127.0.0.1:<port>`) and carried over the executor channel
//! ([`pipe`]); hyper's HTTP/1.1 client speaks over it, so requests, streamed responses and
//! WebSocket (any `Upgrade`) pass through unchanged. Who may open one is decided once per
//! connection ([`admit`]: the sandbox's traffic token when it is private, the owner key's
//! policy, one audit row); a client's later requests on the same connection reuse it
//! ([`pool`]). As E2B's edge answers: a port nothing listens on is 502 at once, an unknown or
//! ended sandbox 502 "The sandbox was not found", a paused one 409 "The sandbox is paused"
//! (woken instead when made with `autoResume`), a private one without its token 403.
//! A sandbox another replica holds is reached through it: this replica admits and audits the
//! connection, the holder opens the port and relays the bytes over the peer channel
//! (`Dispatcher::open_port_anywhere`, the orchestrator's `cluster` port route).

pub mod address;
pub mod admit;
pub mod pipe;
pub mod pool;
pub mod preview;

use std::sync::{Arc, Weak};

use aegis_sandboxes::SandboxError;
use aegis_tools::state::AppState;
use aegis_tools::tools::control;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, StatusCode, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::Limited;
use hyper_util::rt::TokioIo;
use serde_json::json;

use address::{PortAddress, TRAFFIC_TOKEN};
use admit::{Admitted, Refused};
use pool::{Pool, Sender};

/// What the layer holds: the node's state and the kept connections.
#[derive(Clone)]
pub struct Ports {
    state: AppState,
    pool: Arc<Pool>,
}

impl Ports {
    /// The layer's state; starts the sweep of idle kept connections (it ends with the pool).
    pub fn new(state: AppState) -> Self {
        let pool = Arc::new(Pool::default());
        let weak = Arc::downgrade(&pool);
        tokio::spawn(sweep(weak));
        Ports { state, pool }
    }
}

async fn sweep(pool: Weak<Pool>) {
    let mut every = tokio::time::interval(pool::IDLE / 2);
    loop {
        every.tick().await;
        match pool.upgrade() {
            Some(pool) => pool.sweep(),
            None => return,
        }
    }
}

/// The middleware: a request addressed to a sandbox port is served here, any other goes on.
pub async fn route(State(ports): State<Ports>, request: Request, next: Next) -> Response {
    let domain = &ports.state.config.e2b.domain;
    match address::of_request(request.headers(), domain) {
        Ok(None) => next.run(request).await,
        Ok(Some(to)) => serve(&ports, to, request).await,
        Err(e) => edge(
            StatusCode::BAD_REQUEST,
            json!({"code": 400, "message": e.to_string()}),
        ),
    }
}

/// An answer in the shape of E2B's edge: JSON `{code, message, ...}`.
fn edge(status: StatusCode, body: serde_json::Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

fn refused(to: PortAddress, e: &Refused) -> Response {
    let paused = |can_auto_resume: bool, outcome| {
        aegis_metrics::port_connection(outcome);
        edge(
            StatusCode::CONFLICT,
            json!({"code": 409, "message": e.to_string(), "sandboxId": to.sandbox.to_string(),
                   "canAutoResume": can_auto_resume}),
        )
    };
    let (status, outcome) = match e {
        Refused::Paused(_) => return paused(false, "not_running"),
        Refused::Wake(_) => return paused(true, "error"),
        Refused::NotRunning(_) => (StatusCode::BAD_GATEWAY, "not_running"),
        Refused::Token(_) | Refused::Preview(_) | Refused::Policy(_) => {
            (StatusCode::FORBIDDEN, "denied")
        }
        Refused::Database(db) => {
            tracing::error!(error = %db, "sandbox port: database failure");
            (StatusCode::SERVICE_UNAVAILABLE, "error")
        }
    };
    aegis_metrics::port_connection(outcome);
    edge(
        status,
        json!({"code": status.as_u16(), "message": e.to_string(), "sandboxId": to.sandbox.to_string()}),
    )
}

async fn serve(ports: &Ports, to: PortAddress, mut request: Request) -> Response {
    let token = request
        .headers()
        .get(TRAFFIC_TOKEN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let preview = preview::take(&mut request);
    let bounds = bounds(&ports.state);
    if request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > bounds.to_server)
    {
        return edge(
            StatusCode::PAYLOAD_TOO_LARGE,
            json!({"code": 413, "message": format!("a request to a sandbox port carries at most {} bytes (e2b.port_max_request_mb)", bounds.to_server)}),
        );
    }
    let client = request
        .extensions()
        .get::<ConnectInfo<aegis_http::Connection>>()
        .map(|c| c.0.addr);
    let upgrade = is_upgrade(&request);
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
    let addressed_by_header = by_header(&request);
    origin_form(&mut request, addressed_by_header);
    request.headers_mut().remove(TRAFFIC_TOKEN);
    let mut request = request.map(|body| Limited::new(body, limit(bounds.to_server)));
    // A kept connection of this client to this port, while its token still holds.
    let kept = match (client, upgrade) {
        (Some(client), false) => ports.pool.take(client, to),
        _ => None,
    };
    let shown = Shown {
        token: token.as_deref(),
        preview: preview.as_ref().map(|p| p.secret.as_str()),
    };
    let (mut sender, mut admitted, reused) =
        match sender_for(ports, kept, to, shown, bounds, upgrade).await {
            Ok(found) => found,
            Err(answer) => return *answer,
        };
    mask_host(&mut request, &admitted);
    let response = match send(&mut sender, request).await {
        Ok(response) => response,
        // A kept connection the server closed meanwhile (an HTTP/1.0 server closes after each
        // answer): the request was not sent; it goes on a new one, under the same admission.
        Err((Some(request), _)) if reused => {
            let reopened = reopen(&ports.state, &admitted, to, shown, bounds, upgrade);
            (sender, admitted) = match reopened.await {
                Ok(found) => found,
                Err(answer) => return *answer,
            };
            match send(&mut sender, request).await {
                Ok(response) => response,
                Err((_, why)) => return unreachable_answer(to, why),
            }
        }
        Err((_, why)) => return unreachable_answer(to, why),
    };
    if let (Some(client), false) = (client, upgrade) {
        ports.pool.keep(client, to, sender, admitted);
    }
    let mut response = response;
    if let Some(client_upgrade) = client_upgrade {
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            let server_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(splice(client_upgrade, server_upgrade));
        }
    }
    if !upgrade {
        // The client's connection is the node's, not the server's: an HTTP/1.0 server that
        // closes after each answer must not close it too (the next request gets a new
        // connection to the port under the same admission).
        *response.version_mut() = Version::HTTP_11;
        for hop in [
            header::CONNECTION,
            header::HeaderName::from_static("keep-alive"),
        ] {
            response.headers_mut().remove(hop);
        }
    }
    if let Some(preview) = &preview {
        preview::remember(&mut response, preview);
    }
    response
        .map(|body| Body::new(Limited::new(body, limit(bounds.to_client))))
        .into_response()
}

/// E2B's `maskRequestHost`: the server sees the sandbox's chosen `Host`, not the client's.
fn mask_host(request: &mut axum::http::Request<Limited<Body>>, admitted: &Admitted) {
    if let Some(host) = admitted
        .host
        .as_deref()
        .and_then(|h| HeaderValue::from_str(h).ok())
    {
        request.headers_mut().insert(header::HOST, host);
    }
}

/// What a request shows to be admitted: a private E2B sandbox's traffic token, a preview secret.
#[derive(Clone, Copy)]
struct Shown<'a> {
    token: Option<&'a str>,
    preview: Option<&'a str>,
}

/// The connection a request goes on: the one kept for its client connection while its
/// admission holds (`true`: reused), a new one under that admission, or a new admission.
async fn sender_for(
    ports: &Ports,
    kept: Option<pool::Kept>,
    to: PortAddress,
    shown: Shown<'_>,
    bounds: pipe::Bounds,
    upgrade: bool,
) -> Result<(Sender, Admitted, bool), Box<Response>> {
    // A kept connection admitted by a preview serves only while the preview is live: a
    // revocation or the expiry takes effect on the next request, which is decided afresh.
    let kept = match kept {
        Some(kept) if kept.admitted.preview.is_some() => {
            let live = match &kept.admitted.preview {
                Some(held) => aegis_store::previews::still_live(&ports.state.pool, held.id)
                    .await
                    .map_err(|e| Box::new(refused(to, &Refused::Database(e))))?,
                None => true,
            };
            live.then_some(kept)
        }
        other => other,
    };
    match kept {
        Some(kept) if admit::still_admitted(&kept.admitted, shown.token, shown.preview) => {
            match kept.sender {
                Some(sender) => Ok((sender, kept.admitted, true)),
                None => {
                    let (sender, admitted) =
                        reopen(&ports.state, &kept.admitted, to, shown, bounds, upgrade).await?;
                    Ok((sender, admitted, false))
                }
            }
        }
        Some(kept) if kept.admitted.preview.is_some() => {
            let (sender, admitted) = connect(&ports.state, to, shown, bounds, upgrade).await?;
            Ok((sender, admitted, false))
        }
        Some(_) => Err(Box::new(refused(
            to,
            &Refused::Token(format!(
                "sandbox {} is private: its ports need its traffic access token",
                to.sandbox
            )),
        ))),
        None => {
            let (sender, admitted) = connect(&ports.state, to, shown, bounds, upgrade).await?;
            Ok((sender, admitted, false))
        }
    }
}

/// Sends `request` once the connection is ready; on failure, why, and the request back when it
/// was not sent.
async fn send(
    sender: &mut Sender,
    request: axum::http::Request<Limited<Body>>,
) -> Result<
    axum::http::Response<hyper::body::Incoming>,
    (Option<axum::http::Request<Limited<Body>>>, String),
> {
    if let Err(e) = sender.ready().await {
        return Err((
            Some(request),
            format!("the connection to the port closed: {e}"),
        ));
    }
    sender.try_send_request(request).await.map_err(|mut e| {
        let why = format!("the server on the port answered no HTTP: {}", e.error());
        (e.take_message(), why)
    })
}

/// Admits a client connection to `to` and opens a connection to the port for it.
async fn connect(
    state: &AppState,
    to: PortAddress,
    shown: Shown<'_>,
    bounds: pipe::Bounds,
    upgrade: bool,
) -> Result<(Sender, Admitted), Box<Response>> {
    let admitted = match shown.preview {
        Some(secret) => admit::admit_preview(state, to, secret).await,
        None => admit::admit(state, to, shown.token).await,
    }
    .map_err(|e| Box::new(refused(to, &e)))?;
    aegis_metrics::port_connection("opened");
    let sender = open(state, &admitted, to, bounds, upgrade).await?;
    Ok((sender, admitted))
}

/// Opens a connection to the port of an admitted request, with hyper's client over it.
async fn open(
    state: &AppState,
    admitted: &Admitted,
    to: PortAddress,
    bounds: pipe::Bounds,
    upgrade: bool,
) -> Result<Sender, Box<Response>> {
    let connection = control::open_port(state, &admitted.caller, admitted.sandbox, to.port)
        .await
        .map_err(|e| Box::new(port_failed(to, e)))?;
    handshake(connection, to, bounds, upgrade).await
}

/// A new connection to the port under a kept admission; when the sandbox that admission named
/// is gone (the E2B id was paused and resumed into a new sandbox, or killed), the request is
/// admitted afresh, so a client's kept connection follows the id and is decided again.
async fn reopen(
    state: &AppState,
    admitted: &Admitted,
    to: PortAddress,
    shown: Shown<'_>,
    bounds: pipe::Bounds,
    upgrade: bool,
) -> Result<(Sender, Admitted), Box<Response>> {
    use dispatcher::DispatchError as D;
    match control::open_port(state, &admitted.caller, admitted.sandbox, to.port).await {
        Ok(connection) => {
            let sender = handshake(connection, to, bounds, upgrade).await?;
            Ok((sender, admitted.clone()))
        }
        Err(SandboxError::Dispatch(
            D::SandboxNotFound {
                attached_elsewhere: false,
                ..
            }
            | D::SandboxGone { .. },
        )) => connect(state, to, shown, bounds, upgrade).await,
        Err(e) => Err(Box::new(port_failed(to, e))),
    }
}

/// hyper's HTTP/1.1 client over a port connection (upgrades kept for a WebSocket).
async fn handshake(
    connection: dispatcher::OpenedPort,
    to: PortAddress,
    bounds: pipe::Bounds,
    upgrade: bool,
) -> Result<Sender, Box<Response>> {
    let io = TokioIo::new(connection.into_stream(bounds));
    // Header names go out in their canonical case (`Host`, `User-Agent`), as E2B's edge (Go)
    // sends them: a server that reads names as written (Python's `http.server`) sees the same.
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake(io)
        .await
        .map_err(|e| Box::new(unreachable_answer(to, e.to_string())))?;
    let port = to.port;
    tokio::spawn(async move {
        let served = if upgrade {
            conn.with_upgrades().await
        } else {
            conn.await
        };
        if let Err(e) = served {
            tracing::debug!(port, error = %e, "a sandbox port's HTTP connection ended");
        }
    });
    Ok(sender)
}

/// A port the router's handle could not open, as E2B's edge answers: sandboxes unavailable on
/// this node is unreachable, a dispatcher refusal as [`open_failed`] says it.
fn port_failed(to: PortAddress, e: SandboxError) -> Response {
    match e {
        SandboxError::Dispatch(e) => open_failed(to, e),
        other => unreachable_answer(to, other.to_string()),
    }
}

fn open_failed(to: PortAddress, e: dispatcher::DispatchError) -> Response {
    use dispatcher::DispatchError as D;
    match e {
        D::Refused {
            kind: dispatcher::protocol::ErrorKind::NotFound,
            ..
        } => {
            aegis_metrics::port_connection("unreachable");
            edge(
                StatusCode::BAD_GATEWAY,
                json!({
                    "code": 502,
                    "message": format!("The sandbox is running but port is not open: nothing listens on port {} in sandbox {}", to.port, to.sandbox),
                    "sandboxId": to.sandbox.to_string(),
                    "port": to.port,
                }),
            )
        }
        D::SandboxNotFound {
            attached_elsewhere: true,
            ..
        } => refused(
            to,
            &Refused::NotRunning(format!(
                "sandbox {} runs on another replica; its ports are served by that replica",
                to.sandbox
            )),
        ),
        D::SandboxNotFound { .. } | D::SandboxGone { .. } => refused(
            to,
            &Refused::NotRunning(format!("sandbox {} is not running", to.sandbox)),
        ),
        other => unreachable_answer(to, other.to_string()),
    }
}

fn unreachable_answer(to: PortAddress, why: String) -> Response {
    aegis_metrics::port_connection("error");
    edge(
        StatusCode::BAD_GATEWAY,
        json!({"code": 502, "message": format!("port {} of sandbox {}: {why}", to.port, to.sandbox), "sandboxId": to.sandbox.to_string(), "port": to.port}),
    )
}

/// After a `101 Switching Protocols`, the client's and the server's upgraded connections are
/// joined byte for byte (a WebSocket's frames), bounded by the relay under them.
async fn splice(client: hyper::upgrade::OnUpgrade, server: hyper::upgrade::OnUpgrade) {
    let (client, server) = match tokio::try_join!(client, server) {
        Ok(both) => both,
        Err(e) => {
            tracing::debug!(error = %e, "a sandbox port's upgrade did not complete");
            return;
        }
    };
    let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut server).await {
        tracing::debug!(error = %e, "a sandbox port's upgraded connection ended");
    }
}

fn is_upgrade(request: &Request) -> bool {
    request.headers().contains_key(header::UPGRADE)
        && request
            .headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// Whether E2B's headers address the request (sent to the sandbox URL, `http://<node>/e2b`),
/// rather than its host.
fn by_header(request: &Request) -> bool {
    request.headers().contains_key(address::SANDBOX_PORT)
}

/// The request as HTTP/1.1 sends it to the server: the path and query only, the host in `Host`
/// (an HTTP/2 request carries it in its URI). A request addressed by E2B's headers went to the
/// sandbox URL, which is the door's [`crate::PREFIX`] here: the server gets the path after it.
fn origin_form(request: &mut Request, by_header: bool) {
    if !request.headers().contains_key(header::HOST) {
        if let Some(host) = request
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            request.headers_mut().insert(header::HOST, host);
        }
    }
    if let Some(path) = request.uri().path_and_query().cloned() {
        let mut path = path.as_str();
        if by_header {
            if let Some(rest) = path.strip_prefix(crate::PREFIX) {
                if rest.is_empty() || rest.starts_with(['/', '?']) {
                    path = rest;
                }
            }
        }
        let path = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        *request.uri_mut() = path.parse().unwrap_or_default();
    }
    *request.version_mut() = Version::HTTP_11;
}

/// The bytes one port connection may carry each way on this node (`e2b.port_max_*_mb`); a
/// holder relaying a peer's connection holds it to its own.
pub fn bounds(state: &AppState) -> pipe::Bounds {
    let mb = |n: u64| n.saturating_mul(1024 * 1024);
    pipe::Bounds {
        to_server: mb(state.config.e2b.port_max_request_mb),
        to_client: mb(state.config.e2b.port_max_response_mb),
    }
}

fn limit(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
}
