//! The replicas' channel to each other: a call for a sandbox another live replica holds is
//! carried to it and answered as if local.
//!
//! Every replica of one database with `cluster.listen` set serves `POST /cluster/v1/call` on a
//! listener of its own (`api/cluster.rs`) and records where its peers reach it in its
//! `node_instances` row (`peer_url`). When the dispatcher finds a sandbox's stream held by
//! another instance, it hands the call to [`Peers`] (its [`Forwarder`]), which looks that
//! instance up and posts the executor request there; the holder runs it with
//! `Dispatcher::call_held` (only into a sandbox it holds; it never forwards again) and returns
//! the executor's response. The decision to make the call (the router's policy check, the audit
//! intent and completion) stays with the replica the caller reached: the holder is a relay to
//! its executor, nothing more.
//!
//! Each request is signed with the cluster secret: HMAC-SHA256 over the Unix time, a random
//! nonce and the body, in [`SIGNATURE_HEADER`] as `t=<secs>,n=<nonce hex>,s=<mac hex>`. The
//! holder refuses a missing or wrong signature, a time more than [`WINDOW_SECS`] away from its
//! clock, and a nonce it has already seen within that window ([`Nonces`]), so a captured request
//! cannot be replayed to run a command twice.
//!
//! Live processes and watches go over `POST /cluster/v1/subscribe`, signed and guarded alike: a
//! [`ForwardedSubscription`] (start a process, attach to one, watch a directory) whose answer
//! is a stream of newline-delimited JSON [`Frame`]s: first what was opened (or a refusal, as a
//! non-200 answer before any frame), then the events of the holder's handle as it reads them,
//! a beat every [`BEAT`] when there are none, and last the end (or why the holder stopped
//! serving it: it is shutting down). The caller's replica fills a feed of its own from them
//! (the dispatcher's `relay.rs`). A stream that breaks (the holder died, the connection was
//! cut) or stays silent for [`SILENCE`] ends the caller's handle at once with an end saying so;
//! a caller that goes away drops the connection, and with it the holder's handle (a watch is
//! removed then).
//!
//! With several Docker engines the same channel carries a sandbox's creation to a replica
//! driving the engine placement chose ([`CREATE_PATH`]; that replica then holds it) and its
//! destruction to a replica beside its engine ([`DESTROY_PATH`]), signed alike.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine;
use dispatcher::protocol::{ErrorKind, Op, Response};
use dispatcher::{
    DispatchError, Forwarder, Opened, ProcessEvent, Relay, Relayed, SandboxId, SandboxSpec,
    Subscription, WatchEvent,
};
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use uuid::Uuid;

mod messages;

pub use messages::{
    Created, ForwardRefusal, ForwardedCall, ForwardedCreate, ForwardedDestroy, ForwardedPort,
    ForwardedSubscription, Frame, Open,
};

/// The header carrying a forwarded call's signature.
pub const SIGNATURE_HEADER: &str = "x-aegis-cluster";

/// How far a signed time may be from the holder's clock, seconds; nonces are kept this long.
pub const WINDOW_SECS: i64 = 30;

/// Most nonces remembered at once; past it, signed requests are refused until old ones expire
/// (a flood of valid requests needs the secret, so this bounds memory, not an attacker's reach).
const MAX_NONCES: usize = 100_000;

/// The path of the route peers send executor calls to.
pub const CALL_PATH: &str = "/cluster/v1/call";

/// The path of the route peers open live processes and watches on.
pub const SUBSCRIBE_PATH: &str = "/cluster/v1/subscribe";

/// How often a holder sends a beat on a subscription with nothing else to send (so that a
/// caller that went away is noticed by the write, and a holder that went silent by the reader).
pub const BEAT: Duration = Duration::from_secs(5);

/// How long a caller waits for a frame before it takes the holder for gone.
pub const SILENCE: Duration = Duration::from_secs(20);

/// Longest frame a caller reads (a chunk of output, base64 in JSON, is far below it).
const MAX_FRAME: usize = 16 << 20;

/// The route a replica asks to create a sandbox on its own engine.
pub const CREATE_PATH: &str = "/cluster/v1/create";

/// The route a replica asks to destroy a sandbox on its own engine.
pub const DESTROY_PATH: &str = "/cluster/v1/destroy";

/// The route a replica opens a connection to a port of a sandbox the receiver holds: an HTTP
/// upgrade (`Upgrade: aegis-port`) whose signed request rides in [`PORT_REQUEST_HEADER`]; after
/// `101 Switching Protocols` the connection carries the server's bytes both ways.
pub const PORT_PATH: &str = "/cluster/v1/port";

/// The header carrying a [`ForwardedPort`] as JSON (signed like a body: the request has none).
pub const PORT_REQUEST_HEADER: &str = "x-aegis-port";

/// The `Upgrade` protocol of [`PORT_PATH`].
pub const PORT_PROTOCOL: &str = "aegis-port";

/// How long a forwarded creation may take (image check, pool or a fresh container and its
/// executor's ready line, an egress network and its proxy).
const CREATE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a forwarded destruction may take.
const DESTROY_TIMEOUT: Duration = Duration::from_secs(60);

/// Added to a call's own deadline for the trip to the holder and back.
const TRIP_MARGIN: Duration = Duration::from_secs(5);

/// How long a holder's address is reused before its row is read again. A holder that stops
/// within it is still noticed at once: its listener refuses the connection.
const PEER_TTL: Duration = Duration::from_secs(2);

/// The secret all replicas share.
#[derive(Clone)]
pub struct ClusterKey(Arc<[u8]>);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(***)")
    }
}

impl ClusterKey {
    /// The key from `cluster.secret` (its length is checked when the config loads).
    pub fn new(secret: &str) -> Self {
        Self(Arc::from(secret.as_bytes()))
    }

    fn mac(&self, time: i64, nonce: &str, body: &[u8]) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC accepts keys of any length");
        mac.update(time.to_string().as_bytes());
        mac.update(b"\n");
        mac.update(nonce.as_bytes());
        mac.update(b"\n");
        mac.update(body);
        mac
    }

    /// The signature header for `body`, sent at `time`.
    pub fn sign(&self, time: i64, body: &[u8]) -> Result<String, String> {
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|e| format!("no randomness for a nonce: {e}"))?;
        let nonce = hex(&raw);
        let mac = self.mac(time, &nonce, body).finalize().into_bytes();
        Ok(format!("t={time},n={nonce},s={}", hex(&mac)))
    }

    /// Checks a signature header against `body` at `now`; the nonce is remembered in `seen`.
    pub fn verify(
        &self,
        header: Option<&str>,
        body: &[u8],
        now: i64,
        seen: &Nonces,
    ) -> Result<(), Unsigned> {
        let header = header.ok_or(Unsigned::Missing)?;
        let mut time = None;
        let mut nonce = None;
        let mut sig = None;
        for part in header.split(',') {
            match part.split_once('=') {
                Some(("t", v)) => time = v.parse::<i64>().ok(),
                Some(("n", v)) => nonce = Some(v),
                Some(("s", v)) => sig = unhex(v),
                _ => return Err(Unsigned::Malformed),
            }
        }
        let (Some(time), Some(nonce), Some(sig)) = (time, nonce, sig) else {
            return Err(Unsigned::Malformed);
        };
        if nonce.len() != 32 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Unsigned::Malformed);
        }
        self.mac(time, nonce, body)
            .verify_slice(&sig)
            .map_err(|_| Unsigned::WrongSignature)?;
        if (now - time).abs() > WINDOW_SECS {
            return Err(Unsigned::Stale);
        }
        seen.admit(nonce, now)
    }
}

/// Why a request on the peer listener was not accepted as a peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unsigned {
    /// No signature header.
    #[error("no {SIGNATURE_HEADER} signature")]
    Missing,
    /// The header is not `t=..,n=..,s=..`.
    #[error("malformed {SIGNATURE_HEADER} signature")]
    Malformed,
    /// Signed with another secret, or the body was changed.
    #[error("wrong signature (another cluster secret, or a changed body)")]
    WrongSignature,
    /// Signed too long ago (or in the future).
    #[error("signature time is more than {WINDOW_SECS} s away from this replica's clock")]
    Stale,
    /// The nonce was used already: a replay.
    #[error("nonce already used (a replayed request)")]
    Replayed,
    /// Too many nonces are remembered right now.
    #[error("too many forwarded calls at once; retry")]
    Busy,
}

/// Nonces seen within the signature window.
#[derive(Debug, Default)]
pub struct Nonces(Mutex<HashMap<String, i64>>);

impl Nonces {
    fn admit(&self, nonce: &str, now: i64) -> Result<(), Unsigned> {
        let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() >= MAX_NONCES / 2 {
            seen.retain(|_, at| now - *at <= 2 * WINDOW_SECS);
        }
        if seen.len() >= MAX_NONCES {
            return Err(Unsigned::Busy);
        }
        if seen.insert(nonce.to_owned(), now).is_some() {
            return Err(Unsigned::Replayed);
        }
        Ok(())
    }
}

/// Why a holder's address could not be had.
#[derive(Debug)]
struct NoAddress {
    /// It is recorded as stopped.
    stopped: bool,
    detail: String,
}

impl NoAddress {
    fn other(detail: String) -> Self {
        Self {
            stopped: false,
            detail,
        }
    }
}

/// The [`Forwarder`] the dispatcher uses: finds the holder's `peer_url` and posts the call.
#[derive(Debug)]
pub struct Peers {
    pool: crate::database::PgPool,
    key: ClusterKey,
    http: reqwest::Client,
    /// Holders' `peer_url`s as last read, with when.
    known: Mutex<HashMap<Uuid, (String, std::time::Instant)>>,
}

impl Peers {
    /// Peers of this database, reached with `key`.
    pub fn new(pool: crate::database::PgPool, key: ClusterKey) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| format!("cannot build the peer HTTP client: {e}"))?;
        Ok(Self {
            pool,
            key,
            http,
            known: Mutex::default(),
        })
    }

    /// Where `holder` takes forwarded calls: from the cache while fresh, else its row.
    async fn address_of(&self, holder: Uuid) -> Result<String, NoAddress> {
        let cached = self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&holder)
            .filter(|(_, at)| at.elapsed() < PEER_TTL)
            .map(|(url, _)| url.clone());
        if let Some(url) = cached {
            return Ok(url);
        }
        let row = aegis_store::node_instances::peer_url(&self.pool, holder)
            .await
            .map_err(|e| NoAddress::other(format!("looking the holder up failed: {e}")))?;
        let url = match row {
            None => {
                return Err(NoAddress {
                    stopped: true,
                    detail: "that instance has stopped; its sandboxes are adopted by a replica \
                             on the same engine or reaped"
                        .to_owned(),
                })
            }
            Some(None) => {
                return Err(NoAddress::other(
                    "that instance takes no forwarded calls (it has no cluster.listen)".to_owned(),
                ))
            }
            Some(Some(url)) => url,
        };
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        known.retain(|_, (_, at)| at.elapsed() < PEER_TTL);
        known.insert(holder, (url.clone(), std::time::Instant::now()));
        Ok(url)
    }

    /// Whether `holder` is recorded as stopped (a failed lookup says no).
    async fn stopped(&self, holder: Uuid) -> bool {
        aegis_store::node_instances::stopped(&self.pool, holder)
            .await
            .unwrap_or(false)
    }

    async fn forward_call(
        &self,
        holder: Uuid,
        id: SandboxId,
        op: Op,
        deadline: Duration,
    ) -> Result<Response, DispatchError> {
        let fail = |detail: String| DispatchError::Forward { id, holder, detail };
        // It took no call: the dispatcher hands the sandbox over and calls again.
        let unavailable = |detail: String| DispatchError::HolderUnavailable {
            id,
            holder,
            detail,
            stopping: false,
        };
        let peer = match self.address_of(holder).await {
            Ok(peer) => peer,
            Err(NoAddress {
                stopped: true,
                detail,
            }) => return Err(unavailable(detail)),
            Err(e) => return Err(fail(e.detail)),
        };
        let op_name = op.name();
        let body = serde_json::to_vec(&ForwardedCall {
            sandbox: id.0,
            deadline_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
            op,
        })
        .map_err(|e| fail(format!("cannot encode the call: {e}")))?;
        let answer = self
            .signed_request(&peer, CALL_PATH, body)
            .map_err(fail)?
            .timeout(deadline + TRIP_MARGIN)
            .send()
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            // Refused before anything was sent: nothing ran there.
            Err(e) if e.is_connect() => {
                return Err(unavailable(format!("{peer} refused the connection: {e}")))
            }
            // A kept-alive connection the holder closed as it stopped: a stopped holder ran
            // nothing unanswered (it let the calls in flight end, answered, before it let go
            // of its sandboxes and recorded its stop), so this call did not run there.
            Err(e) if !e.is_timeout() && self.stopped(holder).await => {
                return Err(unavailable(format!(
                    "{peer} closed the connection as it stopped: {e}"
                )))
            }
            Err(e) => return Err(fail(format!("{peer} did not answer: {e}"))),
        };
        let status = answer.status();
        let bytes = answer
            .bytes()
            .await
            .map_err(|e| fail(format!("{peer} broke off its answer: {e}")))?;
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map_err(|e| fail(format!("{peer} answered something unreadable: {e}")));
        }
        let refusal = refused(&peer, holder, id, op_name, deadline, status, &bytes);
        if matches!(refusal, DispatchError::HolderUnavailable { .. }) {
            // Stopping: its row is read again next time, so its recorded stop is seen at once.
            self.known
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&holder);
        }
        Err(refusal)
    }

    async fn open_subscription(
        &self,
        holder: Uuid,
        id: SandboxId,
        subscription: Subscription,
        deadline: Duration,
    ) -> Result<(Opened, Relay), DispatchError> {
        let fail = |detail: String| DispatchError::Forward { id, holder, detail };
        let peer = self.address_of(holder).await.map_err(|e| fail(e.detail))?;
        let op_name = subscription.op();
        let body = serde_json::to_vec(&ForwardedSubscription {
            sandbox: id.0,
            deadline_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
            open: subscription.into(),
        })
        .map_err(|e| fail(format!("cannot encode the subscription: {e}")))?;
        // No timeout on the request as a whole: its answer lasts as long as the process.
        let send = self
            .signed_request(&peer, SUBSCRIBE_PATH, body)
            .map_err(fail)?
            .send();
        let opens = |status: reqwest::StatusCode| status.is_success();
        let answer = opened(send, &peer, holder, id, op_name, deadline, opens).await?;
        let mut frames = Frames {
            answer,
            buffer: Vec::new(),
            scanned: 0,
            peer: peer.clone(),
            holder,
            id,
        };
        let opened = match frames.next(deadline + TRIP_MARGIN).await.map_err(fail)? {
            Some(Frame::Process { pid, tag, landlock }) => Opened::Process { pid, tag, landlock },
            Some(Frame::Watch { path }) => Opened::Watch { path },
            Some(Frame::Stopped { reason }) => return Err(fail(reason)),
            Some(other) => return Err(fail(format!("{peer} began with {other:?}"))),
            None => return Err(fail(format!("{peer} answered nothing"))),
        };
        Ok((opened, frames.relay(SILENCE)))
    }
}

/// The error a holder's non-200 answer stands for (`op`: what was asked).
/// The head of an answer that stays open (a subscription's frames, a port's bytes) to the
/// request `send` makes of `holder`: it must come within `deadline` and the trip margin, with a
/// status that `opens`; any other status is the refusal its body carries (read within the trip
/// margin), as [`refused`] reads one of `op`.
async fn opened(
    send: impl std::future::Future<Output = reqwest::Result<reqwest::Response>>,
    peer: &str,
    holder: Uuid,
    id: SandboxId,
    op: &'static str,
    deadline: Duration,
    opens: impl Fn(reqwest::StatusCode) -> bool,
) -> Result<reqwest::Response, DispatchError> {
    let fail = |detail: String| DispatchError::Forward { id, holder, detail };
    let answer = tokio::time::timeout(deadline + TRIP_MARGIN, send)
        .await
        .map_err(|_| fail(format!("{peer} did not answer within {deadline:?}")))?
        .map_err(|e| fail(format!("{peer} did not answer: {e}")))?;
    let status = answer.status();
    if opens(status) {
        return Ok(answer);
    }
    let bytes = tokio::time::timeout(TRIP_MARGIN, answer.bytes())
        .await
        .map_err(|_| fail(format!("{peer} did not finish its refusal")))?
        .map_err(|e| fail(format!("{peer} broke off its answer: {e}")))?;
    Err(refused(peer, holder, id, op, deadline, status, &bytes))
}

fn refused(
    peer: &str,
    holder: Uuid,
    id: SandboxId,
    op: &'static str,
    deadline: Duration,
    status: reqwest::StatusCode,
    bytes: &[u8],
) -> DispatchError {
    let fail = |detail: String| DispatchError::Forward { id, holder, detail };
    let Ok(refusal) = serde_json::from_slice::<ForwardRefusal>(bytes) else {
        return fail(format!(
            "{peer} answered {status}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        ));
    };
    match refusal.error.as_str() {
        "not_found" => DispatchError::SandboxNotFound {
            id,
            attached_elsewhere: false,
        },
        "gone" => DispatchError::SandboxGone {
            id,
            reason: refusal.message,
        },
        // It is stopping: it records its stop shortly, and the caller's replica takes over.
        "stopping" => DispatchError::HolderUnavailable {
            id,
            holder,
            detail: format!("{peer} is stopping: {}", refusal.message),
            stopping: true,
        },
        "timeout" => DispatchError::Timeout {
            id,
            op,
            after: deadline,
        },
        "refused" => DispatchError::Refused {
            id,
            op,
            kind: refusal.kind.unwrap_or(ErrorKind::Unknown),
            message: refusal.message,
        },
        _ => fail(format!("{peer} refused: {}", refusal.message)),
    }
}

/// The frames of a subscription's answer, read as they come.
struct Frames {
    answer: reqwest::Response,
    buffer: Vec<u8>,
    /// Bytes at the front of `buffer` already searched for a newline (a large frame arriving
    /// in many chunks is then searched once, not again from its start per chunk).
    scanned: usize,
    peer: String,
    holder: Uuid,
    id: SandboxId,
}

impl Frames {
    /// The next frame within `within`; `None` at the end of the answer; `Err` when it broke,
    /// stayed silent or sent something unreadable.
    async fn next(&mut self, within: Duration) -> Result<Option<Frame>, String> {
        let peer = &self.peer;
        loop {
            if let Some(at) = memchr::memchr(b'\n', &self.buffer[self.scanned..]) {
                let at = self.scanned + at;
                self.scanned = 0;
                let line: Vec<u8> = self.buffer.drain(..=at).collect();
                return serde_json::from_slice(&line)
                    .map(Some)
                    .map_err(|e| format!("{peer} sent an unreadable frame: {e}"));
            }
            if self.buffer.len() > MAX_FRAME {
                return Err(format!("{peer} sent a frame over {MAX_FRAME} bytes"));
            }
            match tokio::time::timeout(within, self.answer.chunk()).await {
                Err(_) => return Err(format!("{peer} sent nothing for {within:?}")),
                Ok(Err(e)) => return Err(format!("{peer} broke off the stream: {e}")),
                Ok(Ok(None)) if self.buffer.is_empty() => return Ok(None),
                Ok(Ok(None)) => return Err(format!("{peer} broke off the stream mid-frame")),
                Ok(Ok(Some(chunk))) => {
                    self.scanned = self.buffer.len();
                    self.buffer.extend_from_slice(&chunk);
                }
            }
        }
    }

    /// The events after the first frame, as the dispatcher follows them; `silence` without a
    /// frame (not even a beat) ends them with an error.
    fn relay(self, silence: Duration) -> Relay {
        futures_util::stream::unfold(Some(self), move |frames| async move {
            let mut frames = frames?;
            let (id, holder) = (frames.id, frames.holder);
            let why = move |detail: String| {
                format!("instance {holder}, which holds sandbox {id}, stopped serving it: {detail}")
            };
            loop {
                let frame = match frames.next(silence).await {
                    Ok(Some(frame)) => frame,
                    Ok(None) => {
                        let reason = why("the stream ended before its last event".to_owned());
                        return Some((Err(reason), None));
                    }
                    Err(detail) => return Some((Err(why(detail)), None)),
                };
                let data = |text: &str| base64::engine::general_purpose::STANDARD.decode(text);
                let event = match frame {
                    Frame::Beat => continue,
                    Frame::Stopped { reason } => return Some((Err(why(reason)), None)),
                    Frame::Stdout { data: d } => data(&d).map(|b| ProcessEvent::Stdout(b.into())),
                    Frame::Stderr { data: d } => data(&d).map(|b| ProcessEvent::Stderr(b.into())),
                    Frame::Pty { data: d } => data(&d).map(|b| ProcessEvent::Pty(b.into())),
                    Frame::Dropped { events, bytes } => Ok(ProcessEvent::Dropped { events, bytes }),
                    Frame::End { end } => Ok(ProcessEvent::End(end)),
                    Frame::Fs { event } => {
                        return Some((Ok(Relayed::Watch(WatchEvent::Fs(event))), Some(frames)))
                    }
                    Frame::WatchEnd { reason } => {
                        return Some((Ok(Relayed::Watch(WatchEvent::End { reason })), None))
                    }
                    Frame::Process { .. } | Frame::Watch { .. } => {
                        let reason = why("it opened the stream twice".to_owned());
                        return Some((Err(reason), None));
                    }
                };
                return match event {
                    Ok(event) => {
                        let last = matches!(event, ProcessEvent::End(_));
                        Some((Ok(Relayed::Process(event)), (!last).then_some(frames)))
                    }
                    Err(e) => Some((Err(why(format!("output that is not base64: {e}"))), None)),
                };
            }
        })
        .boxed()
    }
}

/// A signed post's answer: its status and body.
type Answer = (reqwest::StatusCode, axum::body::Bytes);

impl Peers {
    /// A POST of the JSON `body` to `path` on `peer`, signed now with the cluster key, as every
    /// posted peer request is made (the caller sets its timeout and sends it); `Err` when there
    /// is no randomness for the signature's nonce.
    fn signed_request(
        &self,
        peer: &str,
        path: &str,
        body: Vec<u8>,
    ) -> Result<reqwest::RequestBuilder, String> {
        let signature = self.key.sign(chrono::Utc::now().timestamp(), &body)?;
        Ok(self
            .http
            .post(format!("{}{path}", peer.trim_end_matches('/')))
            .header(SIGNATURE_HEADER, signature)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body))
    }

    /// Posts `request` as JSON to `path` on instance `to`, signed, within `timeout`: the peer's
    /// address and its answer, or why it could not be asked (a forward error's detail).
    async fn post_to(
        &self,
        to: Uuid,
        path: &str,
        request: &impl serde::Serialize,
        timeout: Duration,
    ) -> Result<(String, Answer), String> {
        let peer = self.address_of(to).await.map_err(|e| e.detail)?;
        let body =
            serde_json::to_vec(request).map_err(|e| format!("cannot encode the request: {e}"))?;
        let answer = self
            .signed_request(&peer, path, body)?
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| format!("{peer} did not answer: {e}"))?;
        let status = answer.status();
        let bytes = answer
            .bytes()
            .await
            .map_err(|e| format!("{peer} broke off its answer: {e}"))?;
        Ok((peer, (status, bytes)))
    }

    /// A refusal's body, or the raw answer when it is not one.
    fn refusal(peer: &str, status: reqwest::StatusCode, bytes: &[u8]) -> ForwardRefusal {
        serde_json::from_slice(bytes).unwrap_or_else(|_| ForwardRefusal {
            error: "error".to_owned(),
            message: format!(
                "{peer} answered {status}: {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
            ),
            kind: None,
        })
    }

    async fn forward_create(
        &self,
        target: Uuid,
        spec: SandboxSpec,
    ) -> Result<SandboxId, DispatchError> {
        let fail = |detail: String| DispatchError::ForwardCreate { target, detail };
        let image = spec.image.clone();
        let spec_isolation = spec.isolation();
        let (peer, (status, bytes)) = self
            .post_to(
                target,
                CREATE_PATH,
                &ForwardedCreate { spec },
                CREATE_TIMEOUT,
            )
            .await
            .map_err(fail)?;
        if status.is_success() {
            let created: Created = serde_json::from_slice(&bytes)
                .map_err(|e| fail(format!("{peer} answered something unreadable: {e}")))?;
            return Ok(SandboxId(created.sandbox));
        }
        let refusal = Self::refusal(&peer, status, &bytes);
        Err(match refusal.error.as_str() {
            "no_room" => DispatchError::NoRoom {
                detail: refusal.message,
            },
            "image_missing" => DispatchError::ImageMissing { image },
            "invalid" => DispatchError::InvalidSpec {
                reason: refusal.message,
            },
            // The peer's engine cannot run the sandbox's class: its refusal, named, not a
            // failed forward.
            "isolation_unavailable" => DispatchError::IsolationUnavailable {
                isolation: spec_isolation,
                detail: format!("replica {target}: {}", refusal.message),
            },
            _ => fail(format!("{peer} refused: {}", refusal.message)),
        })
    }

    async fn forward_destroy(&self, holder: Uuid, id: SandboxId) -> Result<(), DispatchError> {
        let fail = |detail: String| DispatchError::Forward { id, holder, detail };
        let request = ForwardedDestroy { sandbox: id.0 };
        let (peer, (status, bytes)) = self
            .post_to(holder, DESTROY_PATH, &request, DESTROY_TIMEOUT)
            .await
            .map_err(fail)?;
        if status.is_success() {
            return Ok(());
        }
        Err(refused(
            &peer,
            holder,
            id,
            "sandbox.destroy",
            DESTROY_TIMEOUT,
            status,
            &bytes,
        ))
    }
}

impl Peers {
    /// Asks `holder` to open `port` in sandbox `id` and keeps the upgraded connection as the
    /// byte stream to the server there.
    async fn forward_port(
        &self,
        holder: Uuid,
        id: SandboxId,
        port: u16,
        deadline: Duration,
    ) -> Result<dispatcher::PortStream, DispatchError> {
        let fail = |detail: String| DispatchError::Forward { id, holder, detail };
        let peer = self.address_of(holder).await.map_err(|e| fail(e.detail))?;
        let asked = serde_json::to_string(&ForwardedPort {
            sandbox: id.0,
            port,
        })
        .map_err(|e| fail(format!("cannot encode the port request: {e}")))?;
        let signature = self
            .key
            .sign(chrono::Utc::now().timestamp(), asked.as_bytes())
            .map_err(fail)?;
        let send = self
            .http
            .get(format!("{}{PORT_PATH}", peer.trim_end_matches('/')))
            .header(SIGNATURE_HEADER, signature)
            .header(PORT_REQUEST_HEADER, asked)
            .header(reqwest::header::CONNECTION, "upgrade")
            .header(reqwest::header::UPGRADE, PORT_PROTOCOL)
            .send();
        let opens =
            |status: reqwest::StatusCode| status == reqwest::StatusCode::SWITCHING_PROTOCOLS;
        let answer = opened(send, &peer, holder, id, "port.open", deadline, opens).await?;
        let upgraded = answer
            .upgrade()
            .await
            .map_err(|e| fail(format!("{peer} did not switch to the port's bytes: {e}")))?;
        Ok(Box::new(upgraded))
    }
}

/// `result` of a call sent to a peer, counted by outcome (`aegis_forwarded_calls_total`): the
/// peer answered, refused, or could not be reached.
fn counted<T>(result: Result<T, DispatchError>) -> Result<T, DispatchError> {
    let outcome = match &result {
        Ok(_) => "ok",
        Err(DispatchError::Forward { .. }) => "error",
        Err(_) => "refused",
    };
    crate::metrics::forwarded_call("sent", outcome);
    result
}

impl Forwarder for Peers {
    fn open_port(
        &self,
        holder: Uuid,
        id: SandboxId,
        port: u16,
        deadline: Duration,
    ) -> BoxFuture<'_, Result<dispatcher::PortStream, DispatchError>> {
        Box::pin(async move { counted(self.forward_port(holder, id, port, deadline).await) })
    }

    fn subscribe(
        &self,
        holder: Uuid,
        id: SandboxId,
        subscription: Subscription,
        deadline: Duration,
    ) -> BoxFuture<'_, Result<(Opened, Relay), DispatchError>> {
        Box::pin(async move {
            counted(
                self.open_subscription(holder, id, subscription, deadline)
                    .await,
            )
        })
    }

    fn forward(
        &self,
        holder: Uuid,
        id: SandboxId,
        op: Op,
        deadline: Duration,
    ) -> BoxFuture<'_, Result<Response, DispatchError>> {
        Box::pin(async move { counted(self.forward_call(holder, id, op, deadline).await) })
    }

    fn create(
        &self,
        target: Uuid,
        spec: SandboxSpec,
    ) -> BoxFuture<'_, Result<SandboxId, DispatchError>> {
        Box::pin(self.forward_create(target, spec))
    }

    fn destroy(&self, holder: Uuid, id: SandboxId) -> BoxFuture<'_, Result<(), DispatchError>> {
        Box::pin(self.forward_destroy(holder, id))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dispatcher::protocol::FsEvent;

    /// Serves one HTTP answer on a local port: a chunked body of `lines` (one chunk each),
    /// then nothing more, the connection held open (a holder that went silent, not one that
    /// closed).
    async fn silent_after(lines: Vec<Frame>) -> (String, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut request = [0u8; 4096];
            let _ = socket.read(&mut request).await;
            let mut answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n\
                               transfer-encoding: chunked\r\n\r\n"
                .to_vec();
            // The frames cut into chunks of 7 bytes, so that one chunk may end a frame and
            // begin the next, and a frame spans several chunks.
            let frames: Vec<u8> = lines.iter().flat_map(Frame::line).collect();
            for chunk in frames.chunks(7) {
                answer.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                answer.extend_from_slice(chunk);
                answer.extend_from_slice(b"\r\n");
            }
            socket.write_all(&answer).await.expect("write");
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(socket);
        });
        (url, server)
    }

    #[tokio::test]
    async fn a_holder_that_goes_silent_ends_the_relay_with_why_instead_of_a_hang() {
        let (url, server) = silent_after(vec![
            Frame::Watch {
                path: "/workspace".to_owned(),
            },
            Frame::Fs {
                event: FsEvent {
                    op: dispatcher::protocol::FsOp::Create,
                    path: "/workspace/a".to_owned(),
                    is_dir: false,
                },
            },
            Frame::Beat,
        ])
        .await;
        let answer = reqwest::Client::new()
            .get(&url)
            .send()
            .await
            .expect("answered");
        let mut frames = Frames {
            answer,
            buffer: Vec::new(),
            scanned: 0,
            peer: url.clone(),
            holder: Uuid::nil(),
            id: SandboxId(Uuid::nil()),
        };
        let first = frames.next(Duration::from_secs(5)).await.expect("a frame");
        assert_eq!(
            first,
            Some(Frame::Watch {
                path: "/workspace".to_owned()
            })
        );
        let started = std::time::Instant::now();
        let mut relay = frames.relay(Duration::from_millis(300));
        let next = relay.next().await.expect("an event");
        assert!(
            matches!(&next, Ok(Relayed::Watch(WatchEvent::Fs(e))) if e.path == "/workspace/a"),
            "{next:?}"
        );
        // The beat is skipped; then nothing comes, and the relay says so once, then ends.
        let silent = tokio::time::timeout(Duration::from_secs(5), relay.next())
            .await
            .expect("no hang")
            .expect("an item");
        let reason = silent.expect_err("an error");
        assert!(
            reason.contains("stopped serving it") && reason.contains("sent nothing for"),
            "{reason}"
        );
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(relay.next().await.is_none(), "nothing after the error");
        server.abort();
    }

    #[test]
    fn a_signature_holds_once_within_its_window_for_its_body_and_key() {
        let key = ClusterKey::new(&"k".repeat(32));
        let seen = Nonces::default();
        let header = key.sign(1000, b"body").expect("signed");
        assert_eq!(key.verify(Some(&header), b"body", 1010, &seen), Ok(()));
        assert_eq!(
            key.verify(Some(&header), b"body", 1010, &seen),
            Err(Unsigned::Replayed)
        );
        let header = key.sign(1000, b"body").expect("signed");
        assert_eq!(
            key.verify(Some(&header), b"other", 1000, &seen),
            Err(Unsigned::WrongSignature)
        );
        assert_eq!(
            ClusterKey::new(&"x".repeat(32)).verify(Some(&header), b"body", 1000, &seen),
            Err(Unsigned::WrongSignature)
        );
        assert_eq!(
            key.verify(Some(&header), b"body", 1000 + WINDOW_SECS + 1, &seen),
            Err(Unsigned::Stale)
        );
        assert_eq!(
            key.verify(None, b"body", 1000, &seen),
            Err(Unsigned::Missing)
        );
        assert_eq!(
            key.verify(Some("t=1000,n=zz,s=00"), b"body", 1000, &seen),
            Err(Unsigned::Malformed)
        );
    }
}
