//! The REST surface (axum): health, the operator API under `/v1/`, and the OpenAPI document.
//!
//! Handlers are adapters: they parse, authorise the role, call the core (router, registry, audit),
//! and map errors once (`error.rs`). Every `/v1/` route needs an API key; health and the OpenAPI
//! document do not.

mod api_keys;
mod approvals;
mod audit;
mod auth;
mod definitions;
mod error;
mod event_log;
mod executions;
mod health;
mod memories;
mod metrics;
mod openapi;
mod previews;
mod sandboxes;
mod schemas;
mod seal;
mod tool_stream;
mod tools;
mod workflow_executions;

use axum::routing::{delete, get, post};
use axum::{middleware, Router};
use tower_http::trace::TraceLayer;

pub use error::{ApiError, ErrorBody};

use crate::caller::Caller;
use crate::state::AppState;

/// Runs a tool through the router for a REST route and unwraps its result (refusals and tool
/// failures become HTTP errors), so deploys, deletes and executions are audited like any call.
pub(super) async fn call_tool(
    state: &AppState,
    caller: &Caller,
    tool: &str,
    args: serde_json::Value,
) -> Result<serde_json::Value, ApiError> {
    let outcome = crate::tools::invoke(state, caller, tool, args).await?;
    outcome.result.map_err(ApiError::from)
}

/// A tool's arguments `args` with each optional one the request gave (a query or body field it
/// left out stays out, so the tool applies its own default): how every route that passes
/// optional fields on builds its call.
pub(super) fn with_given<'k>(
    mut args: serde_json::Value,
    given: impl IntoIterator<Item = (&'k str, Option<serde_json::Value>)>,
) -> serde_json::Value {
    for (key, value) in given {
        if let Some(value) = value {
            args[key] = value;
        }
    }
    args
}

/// A route that is one tool call and nothing else: the role check, the call through the
/// router, and its result as the answer.
pub(super) async fn tool_answer(
    state: &AppState,
    caller: &Caller,
    need: auth::Need,
    tool: &str,
    args: serde_json::Value,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    auth::require(caller, need)?;
    Ok(axum::Json(call_tool(state, caller, tool, args).await?))
}

/// A route that is one write tool on one execution of either engine (cancel, remove), which
/// takes its id as `execution_id`: [`tool_answer`] with that argument.
pub(super) async fn execution_tool(
    state: &AppState,
    caller: &Caller,
    tool: &str,
    id: uuid::Uuid,
) -> Result<axum::Json<serde_json::Value>, ApiError> {
    let args = serde_json::json!({ "execution_id": id });
    tool_answer(state, caller, auth::Need::Write, tool, args).await
}

/// The REST routes (health, OpenAPI, SEAL over HTTP, the operator API, metrics), without the
/// error layers of [`with_errors`].
pub fn routes(state: &AppState) -> Router<AppState> {
    let operator = Router::new()
        .route(
            "/v1/agents",
            post(definitions::create_agent).get(definitions::list_agents),
        )
        .route(
            "/v1/agents/{id}",
            get(definitions::get_agent).delete(definitions::delete_agent),
        )
        .route("/v1/agents/{id}/versions", get(definitions::agent_versions))
        .route("/v1/agents/{id}/execute", post(executions::execute))
        .route(
            "/v1/agents/{id}/memories",
            get(memories::list).delete(memories::erase),
        )
        .route(
            "/v1/agents/{id}/memories/{note_id}",
            delete(memories::erase_one),
        )
        .route("/v1/executions", get(executions::list))
        .route(
            "/v1/executions/{id}",
            get(executions::get).delete(executions::remove),
        )
        .route("/v1/executions/{id}/cancel", post(executions::cancel))
        .route("/v1/executions/{id}/events", get(executions::events))
        .route(
            "/v1/executions/{id}/deliveries",
            get(executions::deliveries),
        )
        .route(
            "/v1/workflows",
            post(definitions::create_workflow).get(definitions::list_workflows),
        )
        .route(
            "/v1/workflows/{id}",
            get(definitions::get_workflow).delete(definitions::delete_workflow),
        )
        .route(
            "/v1/workflows/{id}/versions",
            get(definitions::workflow_versions),
        )
        .route("/v1/workflows/{id}/run", post(workflow_executions::run))
        .route("/v1/workflows/executions", get(workflow_executions::list))
        .route(
            "/v1/workflows/executions/{id}",
            get(workflow_executions::get).delete(workflow_executions::remove),
        )
        .route(
            "/v1/workflows/executions/{id}/signal",
            post(workflow_executions::signal),
        )
        .route(
            "/v1/workflows/executions/{id}/cancel",
            post(workflow_executions::cancel),
        )
        .route(
            "/v1/workflows/executions/{id}/events",
            get(workflow_executions::events),
        )
        .route("/v1/schemas/{*key}", get(schemas::get))
        .route("/v1/tools", get(tools::list))
        .route("/v1/tools/call", post(tools::call))
        .route("/v1/audit", get(audit::list))
        .route("/v1/audit/head", get(audit::head))
        .route("/v1/audit/verify", get(audit::verify))
        .route("/v1/api-keys", post(api_keys::create).get(api_keys::list))
        .route("/v1/api-keys/{id}", delete(api_keys::revoke))
        .route(
            "/v1/sandboxes",
            post(sandboxes::create).get(sandboxes::list),
        )
        .route("/v1/sandboxes/{id}", delete(sandboxes::destroy))
        .route(
            "/v1/sandboxes/{id}/previews",
            post(previews::create).get(previews::list),
        )
        .route(
            "/v1/sandboxes/{id}/previews/{preview_id}",
            delete(previews::revoke),
        )
        .route("/v1/approvals", get(approvals::list))
        .route("/v1/approvals/{id}", get(approvals::get))
        .route("/v1/approvals/{id}/approve", post(approvals::approve))
        .route("/v1/approvals/{id}/reject", post(approvals::reject))
        .route("/v1/seal/sessions", get(seal::list_sessions))
        .route(
            "/v1/seal/sessions/{id}",
            get(seal::get_session).delete(seal::revoke_session),
        )
        .route(
            "/v1/security-contexts",
            get(seal::list_contexts).post(seal::put_context),
        )
        .route(
            "/v1/security-contexts/{name}",
            get(seal::get_context).delete(seal::delete_context),
        )
        .route(
            "/v1/security-contexts/{name}/attestation-tokens",
            post(seal::issue_token).get(seal::list_tokens),
        )
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ));
    Router::new()
        .merge(health::routes())
        .route("/openapi.json", get(openapi::document))
        .route("/v1/seal/attest", post(seal::attest))
        .route("/v1/seal/invoke", post(seal::invoke))
        .route("/v1/seal/tools", get(seal::tools))
        .merge(operator)
        .route("/metrics", get(metrics::render))
}

/// What every route of the HTTP port answers through: REST's JSON error for an unknown route
/// and for errors without a body of their own, and a trace span per request.
pub fn with_errors(routes: Router<AppState>) -> Router<AppState> {
    routes
        .fallback(error::no_route)
        .layer(middleware::from_fn(error::json_errors))
        .layer(TraceLayer::new_for_http())
}

/// The REST API alone (no other door), ready to serve: what the console sends its requests
/// into, in-process.
pub fn router(state: AppState) -> Router {
    with_errors(routes(&state)).with_state(state)
}
