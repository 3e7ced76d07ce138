//! Executions over REST: start (`POST /v1/agents/{id}/execute`), list, read, cancel, remove, and
//! the event log as JSON pages or live Server-Sent Events (`?follow=true`).
//!
//! Starting, cancelling and removing are the `aegis.task.*` tools called through the router, so
//! they are authorised and audited like any other call. Reads are scoped by the same rule
//! (`policy::executions`): a key below the operator tier sees only the executions it started.

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;

use super::auth::{require, Call, Need};
use super::error::{ApiError, ErrorBody};
use super::event_log::{self, AgentEventPage, EventsQuery};
use crate::caller::Caller;
use crate::delivery::DeliveryRecord;
use crate::engine::store;
use crate::runs;
use crate::state::AppState;

/// Body of `POST /v1/agents/{id}/execute`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteBody {
    /// Input, validated against the agent's `spec.input_schema`.
    #[serde(default)]
    pub input: Option<Value>,
    /// Natural-language intent.
    pub intent: Option<String>,
}

/// `?version=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ExecuteQuery {
    /// Agent version (default latest).
    pub version: Option<String>,
}

/// The answer of a start (`POST /v1/agents/{id}/execute`, `POST /v1/workflows/{name}/run`):
/// the execution exists and waits for a worker.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Started {
    /// The new execution: its events, status and cancel routes take this id.
    pub execution_id: Uuid,
    /// Always `pending` at this point.
    #[schema(example = "pending")]
    pub status: String,
}

impl Started {
    /// The answer for the start tool's output (`{execution_id, ...}`); a tool answer without an
    /// id is the node's own fault, so a 500 rather than a guess.
    pub fn from_tool(out: &Value) -> Result<Self, ApiError> {
        let id = out["execution_id"]
            .as_str()
            .and_then(|s| Uuid::parse_str(s).ok())
            .ok_or_else(|| ApiError::internal("the start tool answered no execution id"))?;
        Ok(Started {
            execution_id: id,
            status: "pending".to_owned(),
        })
    }
}

/// The answer of `POST /v1/executions/{id}/cancel`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Cancelled {
    /// Always true: a refusal is an error answer.
    pub success: bool,
    /// The execution asked to stop.
    pub execution_id: Uuid,
}

/// The answer of `DELETE /v1/executions/{id}` (the tool `aegis.task.remove`, passed through:
/// this describes its JSON for the OpenAPI document).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct ExecutionRemoved {
    /// The tool that answered, `aegis.task.remove`.
    tool: String,
    /// The execution that is gone, with its events.
    execution_id: Uuid,
    /// Always true: a refusal is an error answer.
    removed: bool,
}

/// The answer of `GET /v1/executions/{id}/deliveries`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Deliveries {
    /// The execution.
    pub execution_id: Uuid,
    /// Each destination its result was sent to, oldest first.
    pub deliveries: Vec<DeliveryRecord>,
}

/// Starts an execution of an agent; answers at once with its id.
#[utoipa::path(post, path = "/v1/agents/{id}/execute", operation_id = "execute_agent", tag = "executions",
    params(("id" = String, Path, description = "Agent id or name"), ExecuteQuery), request_body = ExecuteBody,
    responses((status = 201, description = "Started", body = Started), (status = 404, description = "Unknown agent", body = ErrorBody),
              (status = 422, description = "Input does not match input_schema; nothing started", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn execute(
    Call { state, caller }: Call,
    Path(id): Path<String>,
    Query(q): Query<ExecuteQuery>,
    Json(body): Json<ExecuteBody>,
) -> Result<(StatusCode, Json<Started>), ApiError> {
    require(&caller, Need::Write)?;
    let args = json!({"agent_id": id, "input": body.input.unwrap_or_else(|| json!({}))});
    let given = [
        ("intent", body.intent.map(Value::from)),
        ("version", q.version.map(Value::from)),
    ];
    let args = super::with_given(args, given);
    let out = super::call_tool(&state, &caller, "aegis.task.execute", args).await?;
    Ok((StatusCode::CREATED, Json(Started::from_tool(&out)?)))
}

/// `GET /v1/executions` filters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ListQuery {
    /// Only executions of this agent (id).
    pub agent_id: Option<Uuid>,
    /// Only this status.
    pub status: Option<String>,
    /// Page size (default 50).
    pub limit: Option<i64>,
    /// Rows to skip.
    pub offset: Option<i64>,
}

/// Executions, newest first.
#[utoipa::path(get, path = "/v1/executions", operation_id = "list_executions", tag = "executions", params(ListQuery),
    responses((status = 200, description = "Executions", body = Vec<store::Execution>)), security(("api_key" = [])))]
pub async fn list(
    Call { state, caller }: Call,
    Query(q): Query<ListQuery>,
) -> Result<Json<Vec<store::Execution>>, ApiError> {
    Ok(Json(
        store::list_visible(
            &state.pool,
            &caller.tenant,
            &store::Visible::of(&caller),
            q.agent_id,
            q.status.as_deref(),
            q.limit.unwrap_or(50),
            q.offset.unwrap_or(0),
        )
        .await?,
    ))
}

/// One execution.
#[utoipa::path(get, path = "/v1/executions/{id}", operation_id = "get_execution", tag = "executions", params(("id" = Uuid, Path, description = "Execution id")),
    responses((status = 200, description = "Execution", body = store::Execution), (status = 404, description = "Unknown", body = ErrorBody)), security(("api_key" = [])))]
pub async fn get(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
) -> Result<Json<store::Execution>, ApiError> {
    may_act_on(&state, &caller, id).await?;
    store::get(&state.pool, &caller.tenant, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("execution {id} not found")))
}

/// Cancels an execution (its running command dies with its sandbox).
#[utoipa::path(post, path = "/v1/executions/{id}/cancel", operation_id = "cancel_execution", tag = "executions", params(("id" = Uuid, Path, description = "Execution id")),
    responses((status = 200, description = "Cancelled", body = Cancelled), (status = 409, description = "Already ended", body = ErrorBody)), security(("api_key" = [])))]
pub async fn cancel(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
) -> Result<Json<Cancelled>, ApiError> {
    // The tool's own answer is not this route's: REST answers `Cancelled`.
    let _ = super::execution_tool(&state, &caller, "aegis.task.cancel", id).await?;
    Ok(Json(Cancelled {
        success: true,
        execution_id: id,
    }))
}

/// Removes an ended execution and its events.
#[utoipa::path(delete, path = "/v1/executions/{id}", operation_id = "remove_execution", tag = "executions", params(("id" = Uuid, Path, description = "Execution id")),
    responses((status = 200, description = "Removed", body = ExecutionRemoved), (status = 409, description = "Still running", body = ErrorBody)), security(("api_key" = [])))]
pub async fn remove(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
) -> Result<Json<Value>, ApiError> {
    super::execution_tool(&state, &caller, "aegis.task.remove", id).await
}

/// The event log: a JSON page, or live Server-Sent Events with `?follow=true`.
#[utoipa::path(get, path = "/v1/executions/{id}/events", operation_id = "execution_events", tag = "executions",
    params(("id" = Uuid, Path, description = "Execution id"), EventsQuery),
    responses((status = 200, description = event_log::EVENTS_ANSWERED,
                content((AgentEventPage = "application/json"), (String = "text/event-stream"))),
              (status = 404, description = "Unknown", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn events(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
    Query(q): Query<EventsQuery>,
) -> Result<Response, ApiError> {
    may_act_on(&state, &caller, id).await?;
    event_log::answer::<AgentEventPage>(state, caller.tenant, runs::AGENT, id, &q).await
}

/// The delivery log: each destination the result was sent to, its status and every attempt.
#[utoipa::path(get, path = "/v1/executions/{id}/deliveries", operation_id = "execution_deliveries", tag = "executions",
    params(("id" = Uuid, Path, description = "Execution id")),
    responses((status = 200, description = "The delivery log", body = Deliveries), (status = 404, description = "Unknown", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn deliveries(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
) -> Result<Json<Deliveries>, ApiError> {
    may_act_on(&state, &caller, id).await?;
    let deliveries = crate::delivery::list(&state.pool, id).await?;
    Ok(Json(Deliveries {
        execution_id: id,
        deliveries,
    }))
}

/// 404 for an unknown execution, 403 for one the caller may not act on.
async fn may_act_on(state: &AppState, caller: &Caller, id: Uuid) -> Result<(), ApiError> {
    let scope = store::scope(&state.pool, &caller.tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("execution {id} not found")))?;
    crate::policy::executions::may_act_on(caller, &scope)
        .map_err(|d| ApiError::forbidden(d.message))
}
