//! The peer listener (`cluster.listen`): the one route other replicas of this database call to
//! run an executor request in a sandbox this replica holds (`crate::cluster` gives the protocol
//! and why). Not mounted on the callers' HTTP port; every request must carry a valid, fresh,
//! unused signature made with the cluster secret, or it is refused before its body is read as
//! a call.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use dispatcher::{DispatchError, SandboxId};

use crate::cluster::{ClusterKey, ForwardRefusal, ForwardedCall, Nonces, CALL_PATH};
use crate::state::AppState;

/// Longest deadline a peer may ask for (a `cmd.run`'s own ceiling is below it).
const MAX_DEADLINE: Duration = Duration::from_secs(3600);

#[derive(Clone)]
struct Peer {
    state: AppState,
    key: ClusterKey,
    nonces: Arc<Nonces>,
}

/// The peer listener's routes.
pub fn router(state: AppState, key: ClusterKey) -> Router {
    // A forwarded fs.write carries the file JSON-escaped (up to six bytes per byte).
    let limit = usize::try_from(state.config.sandbox.max_file_bytes)
        .unwrap_or(usize::MAX / 8)
        .saturating_mul(6)
        .saturating_add(1 << 20);
    Router::new()
        .route(CALL_PATH, post(call))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(Peer {
            state,
            key,
            nonces: Arc::default(),
        })
}

fn refusal(status: StatusCode, error: &str, message: String) -> Response {
    (
        status,
        Json(ForwardRefusal {
            error: error.to_owned(),
            message,
        }),
    )
        .into_response()
}

async fn call(State(peer): State<Peer>, headers: HeaderMap, body: Bytes) -> Response {
    let header = headers
        .get(crate::cluster::SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok());
    if let Err(e) = peer
        .key
        .verify(header, &body, chrono::Utc::now().timestamp(), &peer.nonces)
    {
        tracing::warn!(error = %e, "refused a call on the peer listener");
        crate::metrics::forwarded_call("served", "refused");
        return refusal(StatusCode::UNAUTHORIZED, "unsigned", e.to_string());
    }
    let forwarded: ForwardedCall = match serde_json::from_slice(&body) {
        Ok(call) => call,
        Err(e) => {
            return refusal(
                StatusCode::BAD_REQUEST,
                "invalid",
                format!("not a forwarded call: {e}"),
            )
        }
    };
    let dispatcher = match peer.state.sandboxes.dispatcher() {
        Ok(dispatcher) => dispatcher,
        Err(e) => return refusal(StatusCode::SERVICE_UNAVAILABLE, "error", e.to_string()),
    };
    let id = SandboxId(forwarded.sandbox);
    let deadline = Duration::from_millis(forwarded.deadline_ms).min(MAX_DEADLINE);
    let result = dispatcher.call_held(id, forwarded.op, deadline).await;
    crate::metrics::forwarded_call(
        "served",
        match &result {
            Ok(_) => "ok",
            Err(
                DispatchError::SandboxNotFound { .. }
                | DispatchError::SandboxGone { .. }
                | DispatchError::Timeout { .. },
            ) => "refused",
            Err(_) => "error",
        },
    );
    match result {
        Ok(response) => Json(response).into_response(),
        Err(e @ DispatchError::SandboxNotFound { .. }) => {
            refusal(StatusCode::NOT_FOUND, "not_found", e.to_string())
        }
        Err(DispatchError::SandboxGone { reason, .. }) => refusal(StatusCode::GONE, "gone", reason),
        Err(e @ DispatchError::Timeout { .. }) => {
            refusal(StatusCode::GATEWAY_TIMEOUT, "timeout", e.to_string())
        }
        Err(e) => refusal(StatusCode::BAD_GATEWAY, "error", e.to_string()),
    }
}
