//! The operator console at `/console`: server-rendered pages over the node's own REST API.
//!
//! One more door, with no powers of its own. A browser signs in with an API key (`session.rs`);
//! every page and every button is then a request to the node's REST router, made in-process as
//! that key (`rest.rs`): the same routes, auth middleware, role checks, policy, router and audit
//! as a client of `/v1/` gets, so what a key sees and may do here is exactly what it may do
//! there (a readonly key gets no buttons, and REST refuses the request anyway). The console
//! reads and writes only its own sessions table; nothing else is reached around the router.
//!
//! Files: `session.rs` (sign-in, the session cookie and row, sign-out), `csrf.rs` (the per-session
//! form token), `rest.rs` (the in-process REST client), `layout.rs` (HTML escaping, the page
//! shell, security headers, static assets), `pages.rs` (one handler per page or form).

mod csrf;
mod layout;
mod pages;
mod rest;
mod session;
mod sign_in;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};

use crate::state::AppState;

/// Where every console route lives.
pub const PREFIX: &str = "/console";

/// The console's routes, mounted beside the REST API (`api/rest/mod.rs`). Every data-reaching
/// handler goes through [`rest::Rest`], which sends the request into a router built by
/// [`crate::api::rest::router`] for this same state.
pub fn routes(state: AppState) -> Router<AppState> {
    let rest = rest::Rest::new(state);
    Router::new()
        .route("/console", get(pages::home))
        .route("/console/", get(pages::home))
        .route(
            "/console/sign-in",
            get(sign_in::sign_in_form).post(sign_in::sign_in),
        )
        .route("/console/sign-out", post(sign_in::sign_out))
        .route("/console/static/console.css", get(layout::stylesheet))
        .route("/console/static/console.js", get(layout::script))
        .route("/console/static/favicon.svg", get(layout::favicon))
        .route("/console/sandboxes", get(pages::sandboxes))
        .route("/console/sandboxes/usage", get(pages::sandbox_usage))
        .route("/console/sandboxes/{id}", get(pages::sandbox))
        .route("/console/sandboxes/{id}/file", get(pages::download))
        .route(
            "/console/sandboxes/{id}/processes/{pid}",
            get(pages::process),
        )
        .route(
            "/console/sandboxes/{id}/processes/{pid}/output",
            get(pages::process_output),
        )
        .route(
            "/console/sandboxes/{id}/destroy",
            post(pages::destroy_sandbox),
        )
        .route("/console/audit", get(pages::audit))
        .route("/console/audit/verify", get(pages::verify_audit))
        .route("/console/runs", get(pages::runs))
        .route("/console/runs/{id}", get(pages::run))
        .route("/console/runs/{id}/events", get(pages::run_events))
        .route("/console/runs/{id}/cancel", post(pages::cancel_run))
        .route("/console/runs/{id}/signal", post(pages::signal_run))
        .route("/console/executions/{id}", get(pages::execution))
        .route(
            "/console/executions/{id}/cancel",
            post(pages::cancel_execution),
        )
        .route("/console/approvals", get(pages::approvals))
        .route(
            "/console/approvals/{id}/{verdict}",
            post(pages::decide_approval),
        )
        .route("/console/keys", get(pages::keys).post(pages::create_key))
        .route("/console/keys/{id}/revoke", post(pages::revoke_key))
        .route("/console/node", get(pages::node))
        .layer(Extension(rest))
}

/// Why a console request was not served.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// No live session (none, expired, revoked, or its key no longer authenticates).
    #[error("sign in first")]
    SignIn,
    /// A state-changing request without this session's form token.
    #[error("the form token is missing or wrong: reload the page and try again")]
    Csrf,
    /// A form that cannot be read.
    #[error("bad form: {0}")]
    BadForm(String),
    /// The console's own sessions table failed.
    #[error("session store: {0}")]
    Db(#[from] crate::database::DbError),
    /// Something the console relies on failed (logged, shown without detail).
    #[error("internal error: {0}")]
    Internal(String),
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        match self {
            ConsoleError::SignIn => {
                let mut r = Redirect::to("/console/sign-in").into_response();
                layout::secure_headers(r.headers_mut());
                r
            }
            ConsoleError::Csrf => {
                layout::message(StatusCode::FORBIDDEN, "Refused", &self.to_string())
            }
            ConsoleError::BadForm(_) => {
                layout::message(StatusCode::BAD_REQUEST, "Bad request", &self.to_string())
            }
            ConsoleError::Db(_) | ConsoleError::Internal(_) => {
                tracing::error!(error = %self, "console request failed");
                layout::message(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Error",
                    "the console could not serve this page; see the node's log",
                )
            }
        }
    }
}

/// The fields of an `application/x-www-form-urlencoded` body (the last value of a repeated name).
pub(crate) fn form_fields(body: &[u8]) -> std::collections::HashMap<String, String> {
    url::form_urlencoded::parse(body).into_owned().collect()
}
