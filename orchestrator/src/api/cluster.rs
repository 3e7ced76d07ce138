//! The peer listener (`cluster.listen`): the routes other replicas of this database call to
//! run an executor request in a sandbox this replica holds, and to start, attach to or watch a
//! live process or directory there and follow its events (`crate::cluster` gives the protocol
//! and why). Not mounted on the callers' HTTP port; every request must carry a valid, fresh,
//! unused signature made with the cluster secret, or it is refused before its body is read as
//! a call. Two more routes serve placement across Docker engines: a sandbox created on this
//! replica's engine for a peer (this replica then holds it), and one destroyed here for a peer.
//! One more opens a port of a sandbox held here for a peer whose client asked for it, as an
//! HTTP upgrade that then carries the server's bytes (`PORT_PATH`).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use dispatcher::protocol::Op;
use dispatcher::{DispatchError, Dispatcher, Relayed, SandboxId, Subscribed};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::cluster::{
    ClusterKey, Created, ForwardRefusal, ForwardedCall, ForwardedCreate, ForwardedDestroy,
    ForwardedPort, ForwardedSubscription, Frame, Nonces, BEAT, CALL_PATH, CREATE_PATH,
    DESTROY_PATH, PORT_PATH, PORT_PROTOCOL, PORT_REQUEST_HEADER, SUBSCRIBE_PATH,
};
use crate::state::AppState;

/// What the routes but `call` and `subscribe` name their request in a refusal of its body.
const ROUTE: &str = "a request of this route";

/// Longest deadline a peer may ask for (a `cmd.run`'s own ceiling is below it).
const MAX_DEADLINE: Duration = Duration::from_secs(3600);

#[derive(Clone)]
struct Peer {
    state: AppState,
    key: ClusterKey,
    nonces: Arc<Nonces>,
    /// Cancelled when this replica stops: its subscriptions end with a `stopped` frame then,
    /// rather than holding the listener's drain open.
    shutdown: CancellationToken,
}

/// The peer listener's routes; `shutdown` ends the open subscriptions.
pub fn router(state: AppState, key: ClusterKey, shutdown: CancellationToken) -> Router {
    // A forwarded fs.write carries the file JSON-escaped (up to six bytes per byte).
    let limit = usize::try_from(state.config.sandbox.max_file_bytes)
        .unwrap_or(usize::MAX / 8)
        .saturating_mul(6)
        .saturating_add(1 << 20);
    Router::new()
        .route(CALL_PATH, post(call))
        .route(SUBSCRIBE_PATH, post(subscribe))
        .route(CREATE_PATH, post(create))
        .route(DESTROY_PATH, post(destroy))
        .route(PORT_PATH, get(port))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(Peer {
            state,
            key,
            nonces: Arc::default(),
            shutdown,
        })
}

fn refusal(status: StatusCode, error: &str, message: String) -> Response {
    (
        status,
        Json(ForwardRefusal {
            error: error.to_owned(),
            message,
            kind: None,
        }),
    )
        .into_response()
}

/// The refusal a dispatcher error is answered with (the caller's `cluster::refused` reads it).
fn refusal_of(e: DispatchError) -> Response {
    match e {
        e @ DispatchError::SandboxNotFound { .. } => {
            refusal(StatusCode::NOT_FOUND, "not_found", e.to_string())
        }
        DispatchError::SandboxGone { reason, .. } => refusal(StatusCode::GONE, "gone", reason),
        e @ DispatchError::Timeout { .. } => {
            refusal(StatusCode::GATEWAY_TIMEOUT, "timeout", e.to_string())
        }
        DispatchError::Refused { kind, message, .. } => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(ForwardRefusal {
                error: "refused".to_owned(),
                message,
                kind: Some(kind),
            }),
        )
            .into_response(),
        // Stopping: it let go of its sandboxes (or is about to), so the caller's replica
        // takes the sandbox over and calls again (`dispatcher::takeover`).
        e @ DispatchError::ShuttingDown => {
            refusal(StatusCode::SERVICE_UNAVAILABLE, "stopping", e.to_string())
        }
        e => refusal(StatusCode::BAD_GATEWAY, "error", e.to_string()),
    }
}

/// The outcome a served request counts under.
fn outcome<T>(result: &Result<T, DispatchError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(
            DispatchError::SandboxNotFound { .. }
            | DispatchError::SandboxGone { .. }
            | DispatchError::Timeout { .. }
            | DispatchError::Refused { .. },
        ) => "refused",
        Err(_) => "error",
    }
}

/// Checks the request's signature (and remembers its nonce): `None` when it is a peer's, else
/// the refusal to answer.
fn unsigned(peer: &Peer, headers: &HeaderMap, body: &[u8]) -> Option<Response> {
    let header = headers
        .get(crate::cluster::SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok());
    let e = peer
        .key
        .verify(header, body, chrono::Utc::now().timestamp(), &peer.nonces)
        .err()?;
    tracing::warn!(error = %e, "refused a request on the peer listener");
    crate::metrics::forwarded_call("served", "refused");
    Some(refusal(StatusCode::UNAUTHORIZED, "unsigned", e.to_string()))
}

async fn call(State(peer): State<Peer>, headers: HeaderMap, body: Bytes) -> Response {
    let admitted = admitted::<ForwardedCall>(&peer, &headers, &body, "a forwarded call");
    let (forwarded, dispatcher) = match admitted {
        Ok(admitted) => admitted,
        Err(refused) => return *refused,
    };
    let id = SandboxId(forwarded.sandbox);
    let deadline = Duration::from_millis(forwarded.deadline_ms).min(MAX_DEADLINE);
    let mut op = forwarded.op;
    if let Op::CmdRun(run) = &mut op {
        // A networked sandbox's only way out is its proxy, which runs here beside its engine:
        // the caller's replica cannot know its address, so it is set here (last, so it wins).
        run.env.extend(peer.state.sandboxes.proxy_env(id));
    }
    let result = dispatcher.call_held(id, op, deadline).await;
    crate::metrics::forwarded_call("served", outcome(&result));
    match result {
        Ok(response) => Json(response).into_response(),
        Err(e) => refusal_of(e),
    }
}

/// Opens a live process or watch for a peer and streams its handle's events as frames.
async fn subscribe(State(peer): State<Peer>, headers: HeaderMap, body: Bytes) -> Response {
    let what = "a forwarded subscription";
    let admitted = admitted::<ForwardedSubscription>(&peer, &headers, &body, what);
    let (asked, dispatcher) = match admitted {
        Ok(admitted) => admitted,
        Err(refused) => return *refused,
    };
    let id = SandboxId(asked.sandbox);
    let mut subscription: dispatcher::Subscription = asked.open.into();
    if let dispatcher::Subscription::Start(params) = &mut subscription {
        // As for a forwarded cmd.run: the proxy of a networked sandbox runs here.
        params.env.extend(peer.state.sandboxes.proxy_env(id));
    }
    let op = subscription.op();
    let deadline = Duration::from_millis(asked.deadline_ms).min(MAX_DEADLINE);
    let result =
        match tokio::time::timeout(deadline, dispatcher.subscribe_held(id, subscription)).await {
            Ok(result) => result,
            Err(_) => Err(DispatchError::Timeout {
                id,
                op,
                after: deadline,
            }),
        };
    crate::metrics::forwarded_call("served", outcome(&result));
    let (first, handle) = match result {
        Ok(Subscribed::Process(handle)) => (
            Frame::Process {
                pid: handle.pid(),
                tag: handle.tag().map(str::to_owned),
                landlock: handle.landlock(),
            },
            Subscribed::Process(handle),
        ),
        Ok(Subscribed::Watch(handle)) => (
            Frame::Watch {
                path: handle.path().to_owned(),
            },
            Subscribed::Watch(handle),
        ),
        Err(e) => return refusal_of(e),
    };
    let opened = first.line();
    let events =
        futures_util::stream::unfold(Some((handle, peer.shutdown.clone())), |open| async move {
            let (mut handle, shutdown) = open?;
            let next = tokio::select! {
                _ = shutdown.cancelled() => {
                    let stopped = Frame::Stopped {
                        reason: "it is shutting down".to_owned(),
                    };
                    return Some((Ok::<_, std::convert::Infallible>(stopped.line()), None));
                }
                next = tokio::time::timeout(BEAT, next_event(&mut handle)) => next,
            };
            let frame = match next {
                Err(_) => Frame::Beat,
                Ok(Some(event)) => Frame::of(event),
                // Its end was read by this handle already: nothing more can come.
                Ok(None) => return None,
            };
            let last = matches!(frame, Frame::End { .. } | Frame::WatchEnd { .. });
            Some((Ok(frame.line()), (!last).then_some((handle, shutdown))))
        });
    let body = futures_util::stream::once(async move { Ok(opened) }).chain(events);
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(body),
    )
        .into_response()
}

/// The next event of the handle a subscription relays.
async fn next_event(handle: &mut Subscribed) -> Option<Relayed> {
    match handle {
        Subscribed::Process(handle) => handle.next().await.map(Relayed::Process),
        Subscribed::Watch(handle) => handle.next().await.map(Relayed::Watch),
    }
}

/// A peer's request of type `T` (`what` names it in the refusal of a body that is none), once
/// its signature holds; else the refusal to answer with.
fn verified<T: serde::de::DeserializeOwned>(
    peer: &Peer,
    headers: &HeaderMap,
    body: &[u8],
    what: &str,
) -> Result<T, Box<Response>> {
    if let Some(refused) = unsigned(peer, headers, body) {
        return Err(Box::new(refused));
    }
    serde_json::from_slice(body).map_err(|e| {
        Box::new(refusal(
            StatusCode::BAD_REQUEST,
            "invalid",
            format!("not {what}: {e}"),
        ))
    })
}

/// This replica's dispatcher, which serves every peer request; without one (its sandboxes are
/// unavailable) the refusal to answer with.
fn dispatcher_of(peer: &Peer) -> Result<&Dispatcher, Box<Response>> {
    peer.state.sandboxes.dispatcher().map_err(|e| {
        Box::new(refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "error",
            e.to_string(),
        ))
    })
}

/// A peer's verified request of type `T` and the dispatcher to serve it, in that order, as the
/// routes that run something here take them; else the refusal to answer with.
fn admitted<'p, T: serde::de::DeserializeOwned>(
    peer: &'p Peer,
    headers: &HeaderMap,
    body: &[u8],
    what: &str,
) -> Result<(T, &'p Dispatcher), Box<Response>> {
    let request = verified(peer, headers, body, what)?;
    Ok((request, dispatcher_of(peer)?))
}

/// Creates a sandbox on this replica's engine for a peer whose placement chose it.
async fn create(State(peer): State<Peer>, headers: HeaderMap, body: Bytes) -> Response {
    let (request, dispatcher) = match admitted::<ForwardedCreate>(&peer, &headers, &body, ROUTE) {
        Ok(admitted) => admitted,
        Err(refused) => return *refused,
    };
    match dispatcher.create_held(request.spec).await {
        Ok(id) => Json(Created { sandbox: id.0 }).into_response(),
        Err(e @ DispatchError::NoRoom { .. }) => {
            refusal(StatusCode::CONFLICT, "no_room", e.to_string())
        }
        Err(e @ DispatchError::ImageMissing { .. }) => refusal(
            StatusCode::UNPROCESSABLE_ENTITY,
            "image_missing",
            e.to_string(),
        ),
        Err(e @ DispatchError::InvalidSpec { .. }) => {
            refusal(StatusCode::BAD_REQUEST, "invalid", e.to_string())
        }
        // This replica's engine lacks the class's runtime (runsc): said as such to the asker.
        Err(DispatchError::IsolationUnavailable { detail, .. }) => refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "isolation_unavailable",
            detail,
        ),
        Err(e) => refusal(StatusCode::BAD_GATEWAY, "error", e.to_string()),
    }
}

/// Destroys a sandbox on this replica's engine for a peer.
async fn destroy(State(peer): State<Peer>, headers: HeaderMap, body: Bytes) -> Response {
    let (request, dispatcher) = match admitted::<ForwardedDestroy>(&peer, &headers, &body, ROUTE) {
        Ok(admitted) => admitted,
        Err(refused) => return *refused,
    };
    match dispatcher.destroy_held(SandboxId(request.sandbox)).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => refusal_of(e),
    }
}

/// Opens a port of a sandbox this replica holds for a peer (which admitted and audited the
/// client's connection) and, once the `101` is sent, joins it to the upgraded connection.
async fn port(State(peer): State<Peer>, mut request: axum::extract::Request) -> Response {
    let asked = request
        .headers()
        .get(PORT_REQUEST_HEADER)
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    let asked: ForwardedPort = match verified(&peer, request.headers(), &asked, ROUTE) {
        Ok(asked) => asked,
        Err(refused) => return *refused,
    };
    let upgrade = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(PORT_PROTOCOL));
    if !upgrade {
        return refusal(
            StatusCode::BAD_REQUEST,
            "invalid",
            format!("a port connection is an HTTP upgrade to {PORT_PROTOCOL}"),
        );
    }
    let dispatcher = match dispatcher_of(&peer) {
        Ok(dispatcher) => dispatcher,
        Err(refused) => return *refused,
    };
    // Held here or refused: never forwarded again.
    let result = dispatcher
        .open_port(SandboxId(asked.sandbox), asked.port)
        .await;
    crate::metrics::forwarded_call("served", outcome(&result));
    let connection = match result {
        Ok(connection) => connection,
        Err(e) => return refusal_of(e),
    };
    let bounds = crate::api::e2b::ports::bounds(&peer.state);
    crate::api::e2b::ports::pipe::join_upgrade(&mut request, connection, bounds);
    (
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::CONNECTION, "upgrade"),
            (header::UPGRADE, PORT_PROTOCOL),
        ],
    )
        .into_response()
}
