//! Workflow executions over REST: run (`POST /v1/workflows/{name}/run`), list, read, signal,
//! cancel, remove, and the event log as JSON pages or live Server-Sent Events (`?follow=true`).
//!
//! Every route is an `aegis.workflow.*` tool called through the router, so it is authorised,
//! scoped to the caller's own executions (operators see all) and audited like any other call.

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;

use super::auth::{require, Call, Need};
use super::error::{ApiError, ErrorBody};
use super::event_log::{self, EventsQuery, WorkflowEventPage};
use super::executions::Started;
use super::with_given;
use crate::runs;

/// Body of `POST /v1/workflows/{name}/run`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunBody {
    /// Input, validated against `metadata.input_schema`.
    #[serde(default)]
    pub input: Option<Value>,
    /// Blackboard overrides (reserved keys refused).
    #[serde(default)]
    pub blackboard: Option<Value>,
    /// Natural-language intent.
    pub intent: Option<String>,
    /// Version (default latest).
    pub version: Option<String>,
}

// Most answers below are the `aegis.workflow.*` tools' own, passed through as the router gave
// them: re-typing them here would copy every answer once more and could drop a field the tool
// adds. These types describe that JSON for the OpenAPI document (built by `summary` and `detail`
// in the tools crate); `openapi_complete::live_answers_match_the_document` checks live answers
// against them.

/// A workflow execution as listings show it (the tool's `summary`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct WorkflowExecutionSummary {
    /// The execution.
    execution_id: Uuid,
    /// The workflow (definition) id.
    workflow_id: Uuid,
    /// The workflow's name.
    workflow: String,
    /// The version run.
    version: String,
    /// The revision of that version run.
    revision: Option<i32>,
    /// `sha256:` of the manifest run.
    manifest_digest: Option<String>,
    /// `pending`, `running`, `waiting`, `completed`, `failed`, `cancelled`, `timed_out`.
    status: String,
    /// The state being run (or the last one, once ended).
    current_state: String,
    /// Transitions taken.
    transition_count: i32,
    /// State name -> times entered.
    #[schema(value_type = std::collections::HashMap<String, i64>)]
    visits: Value,
    /// Why it failed.
    error: Option<String>,
    /// For a Subworkflow child: its parent execution.
    parent_execution_id: Option<Uuid>,
    /// While waiting: `human` or `subworkflow`.
    waiting_for: Option<String>,
    /// When requested.
    created_at: DateTime<Utc>,
    /// When a worker first took it.
    started_at: Option<DateTime<Utc>>,
    /// When the last transition was taken.
    last_transition_at: Option<DateTime<Utc>>,
    /// When it ended.
    ended_at: Option<DateTime<Utc>>,
}

/// One workflow execution in full (the tool's `detail`): the summary and what the run holds.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct WorkflowExecutionDetail {
    /// What listings show.
    #[serde(flatten)]
    summary: WorkflowExecutionSummary,
    /// The caller's input.
    input: Value,
    /// The caller's intent.
    intent: Option<String>,
    /// Every state's output by state name, plus the run's context and input.
    #[schema(value_type = Object)]
    blackboard: Value,
    /// The output of each state entered so far, by state name.
    #[schema(value_type = Object)]
    state_outputs: Value,
    /// The run's result (`output_template` rendered, else the last state's output); null
    /// until it ends.
    final_output: Value,
    /// The same as `final_output` (the name AEGIS clients read).
    last_output: Value,
}

/// The answer of `GET /v1/workflows/executions` (the tool `aegis.workflow.executions.list`).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct WorkflowExecutionPage {
    /// The tool that answered.
    tool: String,
    /// Executions on this page.
    count: i64,
    /// Executions matching the filters, on every page.
    total: i64,
    /// Newest first.
    executions: Vec<WorkflowExecutionSummary>,
    /// Page size used.
    limit: i64,
    /// Rows skipped.
    offset: i64,
}

/// The answer of `POST /v1/workflows/executions/{id}/signal` (`aegis.workflow.signal`).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct WorkflowSignalled {
    /// The tool that answered.
    tool: String,
    /// Always true: a refusal is an error answer.
    signalled: bool,
    /// The execution.
    execution_id: Uuid,
    /// The Human state that received the answer.
    state: String,
}

/// The answer of `POST /v1/workflows/executions/{id}/cancel` (`aegis.workflow.cancel`).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct WorkflowCancelled {
    /// The tool that answered.
    tool: String,
    /// Always true: a refusal is an error answer.
    cancelled: bool,
    /// The execution.
    execution_id: Uuid,
}

/// The answer of `DELETE /v1/workflows/executions/{id}` (`aegis.workflow.remove`).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct WorkflowExecutionRemoved {
    /// The tool that answered.
    tool: String,
    /// Always true: a refusal is an error answer.
    removed: bool,
    /// The execution that is gone, with its events.
    execution_id: Uuid,
}

/// Starts an execution of a workflow; answers at once with its id.
#[utoipa::path(post, path = "/v1/workflows/{name}/run", operation_id = "run_workflow", tag = "workflow executions",
    params(("name" = String, Path, description = "Workflow name or id")), request_body = RunBody,
    responses((status = 201, description = "Started", body = Started), (status = 404, description = "Unknown workflow", body = ErrorBody),
              (status = 422, description = "Input does not match input_schema, reserved blackboard keys, or the workflow cannot run here; nothing stored", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn run(
    Call { state, caller }: Call,
    Path(name): Path<String>,
    Json(body): Json<RunBody>,
) -> Result<(StatusCode, Json<Started>), ApiError> {
    require(&caller, Need::Write)?;
    let args = json!({"name": name, "input": body.input.unwrap_or_else(|| json!({}))});
    let args = with_given(
        args,
        [
            ("blackboard", body.blackboard),
            ("intent", body.intent.map(Value::String)),
            ("version", body.version.map(Value::String)),
        ],
    );
    let out = super::call_tool(&state, &caller, "aegis.workflow.run", args).await?;
    Ok((StatusCode::CREATED, Json(Started::from_tool(&out)?)))
}

/// `GET /v1/workflows/executions` filters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ListQuery {
    /// Only executions of this workflow (id or name).
    pub workflow_id: Option<String>,
    /// Only this status.
    pub status: Option<String>,
    /// Page size (default 20, at most 200).
    pub limit: Option<i64>,
    /// Rows to skip.
    pub offset: Option<i64>,
}

/// Workflow executions, newest first.
#[utoipa::path(get, path = "/v1/workflows/executions", operation_id = "list_workflow_executions", tag = "workflow executions", params(ListQuery),
    responses((status = 200, description = "A page of executions", body = WorkflowExecutionPage)), security(("api_key" = [])))]
pub async fn list(
    Call { state, caller }: Call,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let given = [
        ("workflow_id", q.workflow_id.map(Value::from)),
        ("status", q.status.map(Value::from)),
        ("limit", q.limit.map(Value::from)),
        ("offset", q.offset.map(Value::from)),
    ];
    let args = with_given(json!({}), given);
    Ok(Json(
        super::call_tool(&state, &caller, "aegis.workflow.executions.list", args).await?,
    ))
}

/// One workflow execution in full (input, blackboard, state outputs, final output).
#[utoipa::path(get, path = "/v1/workflows/executions/{id}", operation_id = "get_workflow_execution", tag = "workflow executions",
    params(("id" = Uuid, Path, description = "Execution id")),
    responses((status = 200, description = "Execution", body = WorkflowExecutionDetail), (status = 404, description = "Unknown", body = ErrorBody)), security(("api_key" = [])))]
pub async fn get(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
) -> Result<Json<Value>, ApiError> {
    let out = super::call_tool(
        &state,
        &caller,
        "aegis.workflow.executions.get",
        json!({"execution_id": id}),
    )
    .await?;
    Ok(Json(out["execution"].clone()))
}

/// Body of `POST .../{id}/signal`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalBody {
    /// The answer to the waiting Human state.
    pub response: String,
}

/// Answers the Human state an execution waits in; 409 with the reason when it waits for none.
#[utoipa::path(post, path = "/v1/workflows/executions/{id}/signal", operation_id = "signal_workflow_execution", tag = "workflow executions",
    params(("id" = Uuid, Path, description = "Execution id")), request_body = SignalBody,
    responses((status = 200, description = "Signalled", body = WorkflowSignalled), (status = 409, description = "Not waiting for human input", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn signal(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
    Json(body): Json<SignalBody>,
) -> Result<Json<Value>, ApiError> {
    super::tool_answer(
        &state,
        &caller,
        Need::Write,
        "aegis.workflow.signal",
        json!({"execution_id": id, "response": body.response}),
    )
    .await
}

/// Cancels an execution (its sandboxes are destroyed, its child executions cancelled).
#[utoipa::path(post, path = "/v1/workflows/executions/{id}/cancel", operation_id = "cancel_workflow_execution", tag = "workflow executions",
    params(("id" = Uuid, Path, description = "Execution id")),
    responses((status = 200, description = "Cancelled", body = WorkflowCancelled), (status = 409, description = "Already ended", body = ErrorBody)), security(("api_key" = [])))]
pub async fn cancel(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
) -> Result<Json<Value>, ApiError> {
    super::execution_tool(&state, &caller, "aegis.workflow.cancel", id).await
}

/// Removes an ended execution and its events.
#[utoipa::path(delete, path = "/v1/workflows/executions/{id}", operation_id = "remove_workflow_execution", tag = "workflow executions",
    params(("id" = Uuid, Path, description = "Execution id")),
    responses((status = 200, description = "Removed", body = WorkflowExecutionRemoved), (status = 409, description = "Still live", body = ErrorBody)), security(("api_key" = [])))]
pub async fn remove(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
) -> Result<Json<Value>, ApiError> {
    super::execution_tool(&state, &caller, "aegis.workflow.remove", id).await
}

/// The event log: a JSON page, or live Server-Sent Events with `?follow=true`.
#[utoipa::path(get, path = "/v1/workflows/executions/{id}/events", operation_id = "workflow_execution_events", tag = "workflow executions",
    params(("id" = Uuid, Path, description = "Execution id"), EventsQuery),
    responses((status = 200, description = event_log::EVENTS_ANSWERED,
                content((WorkflowEventPage = "application/json"), (String = "text/event-stream"))),
              (status = 404, description = "Unknown", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn events(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
    Query(q): Query<EventsQuery>,
) -> Result<Response, ApiError> {
    // Visibility (and the audit row) through the router.
    super::call_tool(
        &state,
        &caller,
        "aegis.workflow.status",
        json!({"execution_id": id}),
    )
    .await?;
    event_log::answer::<WorkflowEventPage>(state, caller.tenant, runs::WORKFLOW, id, &q).await
}
