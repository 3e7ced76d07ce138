//! The E2B door: E2B's control API and the sandbox daemon (envd) its SDK talks to, served on the
//! node's HTTP port under `/e2b`, so code written for E2B's Python SDK runs against this node
//! with three exports and no change:
//!
//! ```text
//! E2B_API_URL=http://<node>/e2b  E2B_SANDBOX_URL=http://<node>/e2b  E2B_API_KEY=e2b_<hex of an API key>
//! ```
//!
//! - [`control`]: `POST /sandboxes` (a template is a runtime of the registry; `base` is E2B's
//!   general image; or one of the key's snapshots), get, list (v1 and v2), kill, timeout,
//!   refresh, connect. Rows in `e2b_sandboxes` ([`store`]) hold what E2B reports (metadata, the
//!   deadline, the owner key, the envd token); a sandbox whose deadline passes is killed by
//!   [`timeouts::sweep`].
//! - [`control::lifecycle`]: pause, resume (and connect on a paused sandbox), snapshots (create, list,
//!   delete, start a sandbox from one) and fork, with E2B's filesystem-only semantics: the
//!   sandbox's files are kept ([`snapshots`]: the workspace as a data-only tar in PostgreSQL,
//!   bounded per key and expiring), its processes are not: a resumed or forked sandbox is a
//!   new container whose files are written back through the router as the owner key, like an
//!   upload. [`control::observe`]: metrics from the container's cgroup, and the sandbox's lifecycle log.
//! - [`control::network`]: `PUT /sandboxes/{id}/network`, the sandbox's egress rules replaced
//!   live (E2B's `allowOut`/`denyOut`, bounded by the operator's `e2b.egress` grant; the
//!   sandbox's egress proxy reads them for every connection).
//! - [`unoffered`]: the rest of E2B's API: template aliases served, the template build service, teams, keys, volumes, secrets, administration
//!   and envd's internal routes refused (501, naming what is not offered and why).
//! - [`envd`]: envd's services over the Connect protocol, for the sandbox named in
//!   `E2b-Sandbox-Id`: `filesystem.Filesystem/*`, with [`envd::watch`] for its watches, and
//!   [`envd::process`] for `process.Process/*` (live processes: streamed output, background
//!   commands, stdin, signals, terminals, re-attaching); [`files`]: `GET`/`POST /files`.
//!   Every one of them is one or more tool calls through `tools::invoke_in`, as the owner key
//!   (confined by its security context when bound) on the sandbox's own policy: the same
//!   decision, audit rows and kernel-held rules as `cmd.run` and `fs.*` on any other door.
//!
//! - [`ports`]: a sandbox's ports, at `<port>-<sandbox id>.<e2b.domain>` or with E2B's
//!   `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers, relayed by the sandbox's executor (no network,
//!   nothing published on the host), public or behind the sandbox's traffic access token.
//!
//! Keys: E2B's SDK accepts only keys of the form `e2b_[0-9a-f]+`, so a node key is presented
//! as `e2b_` followed by the hex of its bytes ([`keys`]); the plain key works too (with
//! `E2B_VALIDATE_API_KEY=false`). Every sandbox made here is secure: its create answer carries
//! an envd access token, which the SDK then sends on every envd call, and without which the
//! node answers nothing about the sandbox.

pub mod control;
pub mod envd;
pub mod files;
pub mod keys;
pub mod ports;
pub mod snapshots;
/// The door's rows live in the storage crate (`aegis_store::e2b`).
pub use aegis_store::e2b::sandboxes as store;
pub mod timeouts;
pub mod unoffered;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;

use aegis_tools::state::AppState;

/// The envd version sandboxes report; the SDK turns features on by it, and every one it turns
/// on up to here is served: recursive watches (0.1.4), no user named unless its caller does
/// (0.4.0; every command runs as the sandbox user anyway), closing stdin (0.5.2),
/// octet-stream and gzip uploads (0.5.7, [`files`]), file metadata (0.6.2, `X-Metadata-*` kept
/// as `user.e2b.*` extended attributes), entries in watch events (0.6.3, [`envd::watch`]), watching
/// network mounts (0.6.4: there are none in a sandbox).
pub const ENVD_VERSION: &str = "0.6.4";

/// The path prefix of the door on the HTTP port.
pub const PREFIX: &str = "/e2b";

/// The E2B routes, to be nested under [`PREFIX`]: what E2B's SDK calls, the simple rest of
/// E2B's API, and [`unoffered`]'s refusals (501) of what is not offered, each in E2B's error
/// shape, as are a wrong method (405) and an unknown path (404).
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/sandboxes", post(control::create).get(control::list_v1))
        .route(
            "/v2/sandboxes",
            get(control::list_v2).post(control::create_v2),
        )
        .route("/v2/sandboxes/{id}/connect", post(control::connect_v2))
        .route(
            "/sandboxes/{id}",
            get(control::detail).delete(control::kill),
        )
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/sandboxes/{id}/refreshes", post(control::refresh))
        .route("/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/pause", post(control::lifecycle::pause))
        .route("/sandboxes/{id}/resume", post(control::lifecycle::resume))
        .route(
            "/sandboxes/{id}/snapshots",
            post(control::lifecycle::create_snapshot),
        )
        .route("/sandboxes/{id}/fork", post(control::fork::fork))
        .route("/sandboxes/{id}/network", put(control::network::update))
        .route("/snapshots", get(control::lifecycle::list_snapshots))
        .route(
            "/templates/{id}",
            unoffered::template_by_id(delete(control::lifecycle::delete_snapshot)),
        )
        .route("/sandboxes/metrics", get(control::observe::metrics_of_many))
        .route("/sandboxes/{id}/metrics", get(control::observe::metrics))
        .route("/sandboxes/{id}/logs", get(control::observe::logs_v1))
        .route("/v2/sandboxes/{id}/logs", get(control::observe::logs))
        .route("/process.Process/{method}", post(envd::process))
        .route("/filesystem.Filesystem/{method}", post(envd::filesystem))
        .route("/files", get(files::download).post(files::upload))
        .route("/health", get(envd::health))
        .route("/envs", get(envd::envs))
        .merge(unoffered::refused())
        .method_not_allowed_fallback(unoffered::wrong_method)
        .fallback(unoffered::no_route)
        .layer(axum::middleware::from_fn(labelled))
}

/// `/files` at the root, where the SDK's `urljoin` sends signed URLs: [`files`]'s routes, as
/// this door's.
pub fn signed_files() -> Router<AppState> {
    Router::new()
        .route("/files", get(files::download).post(files::upload))
        .layer(axum::middleware::from_fn(labelled))
}

/// Spawns `work` as this door's: a task does not inherit its request's door, and a router call
/// made in it (a file's transfer, a streamed process) must be counted as E2B's too.
pub(crate) fn spawn_labelled<F>(work: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(aegis_metrics::through(aegis_metrics::Door::E2b, work))
}

/// Runs a request as this door's (`aegis_metrics::Door::E2b`), so the router's metrics count
/// E2B's calls under their own door rather than REST's.
async fn labelled(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    aegis_metrics::through(aegis_metrics::Door::E2b, next.run(request)).await
}

/// A control API or `/files` error as E2B's SDK reads it: `{"code", "message"}` with the status.
pub(crate) fn api_error(e: aegis_e2b::api::ApiError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        e.to_json(),
    )
        .into_response()
}

/// A refused control API or `/files` request, answered by [`api_error`].
#[derive(Debug)]
pub struct Refusal(pub aegis_e2b::api::ApiError);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        api_error(self.0)
    }
}

/// A JSON answer with a status.
pub(crate) fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}
