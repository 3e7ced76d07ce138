//! `aegis.workflow.run|signal|cancel|wait|logs|status|executions.list|executions.get|remove`:
//! the workflow engine as tools, so every caller (REST, SEAL, agents) goes through the router.
//!
//! Callers below the operator tier see only the executions they started (and the Subworkflow
//! children of those, which inherit their caller); anything else is "not found", never
//! "forbidden", so ids of other callers' runs are not confirmed.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::definitions::definition_id_of;
use super::runs::RunId;
use super::{args, Handler, HandlerFuture, ToolContext, ToolError};
use aegis_core::caller::Tier;
use aegis_engines::runs;
use aegis_engines::workflow::store::{self, Visibility, WorkflowExecution};
use aegis_engines::workflow::{RunRequest, WorkflowError};
use aegis_manifest::ManifestKind;
use aegis_policy::executions::{may_act_on, ExecutionOwner, ExecutionScope};

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![
        ("aegis.workflow.run", run),
        ("aegis.workflow.signal", signal),
        ("aegis.workflow.cancel", cancel),
        ("aegis.workflow.wait", wait),
        ("aegis.workflow.logs", logs),
        ("aegis.workflow.status", status),
        ("aegis.workflow.executions.list", list),
        ("aegis.workflow.executions.get", get),
        ("aegis.workflow.remove", remove),
    ]
}

/// Maps an engine refusal to a tool error.
pub(crate) fn workflow_error(e: WorkflowError) -> ToolError {
    match e {
        WorkflowError::Registry(r) => super::registry_error(r),
        WorkflowError::InvalidInput(errors) => super::runs::invalid_input("workflow", errors),
        WorkflowError::ReservedKeys(keys) => ToolError::new(
            "invalid_arguments",
            format!(
                "blackboard overrides may not set the reserved key(s) {}",
                keys.join(", ")
            ),
        ),
        WorkflowError::NotRunnable(problems) => ToolError::new(
            "unsupported",
            format!("the workflow cannot run: {}", problems.join("; ")),
        )
        .with_details(json!(problems)),
        WorkflowError::NotFound(id) => {
            ToolError::new("not_found", format!("workflow execution {id} not found"))
        }
        WorkflowError::Conflict(m) => ToolError::new("conflict", m),
        WorkflowError::Db(e) => ToolError::internal(e),
    }
}

/// What this caller may see.
fn visibility<'a>(ctx: &'a ToolContext<'a>) -> Visibility<'a> {
    Visibility {
        tenant: &ctx.caller.tenant,
        owner: (ctx.caller.tier < Tier::Operator)
            .then(|| (ctx.caller.kind.as_str(), ctx.caller.id.as_str())),
    }
}

fn uuid(s: &str) -> Result<Uuid, ToolError> {
    Uuid::parse_str(s).map_err(|_| {
        ToolError::new(
            "invalid_arguments",
            format!("`execution_id` must be a UUID, got `{s}`"),
        )
    })
}

/// An execution the caller may see.
pub(super) async fn load(ctx: &ToolContext<'_>, id: &str) -> Result<WorkflowExecution, ToolError> {
    let id = uuid(id)?;
    let not_found = || ToolError::new("not_found", format!("workflow execution {id} not found"));
    let e = store::get(&ctx.state.pool, &ctx.caller.tenant, id)
        .await
        .map_err(ToolError::internal)?
        .ok_or_else(not_found)?;
    // The same rule as for agent executions (Subworkflow children carry their starter as
    // caller, so the execution itself is its whole lineage); a refusal stays "not found".
    let scope = ExecutionScope {
        principal: None,
        lineage: vec![ExecutionOwner {
            id: e.id,
            caller_kind: e.caller_kind.clone(),
            caller_id: e.caller_id.clone(),
        }],
    };
    may_act_on(ctx.caller, &scope).map_err(|_| not_found())?;
    Ok(e)
}

/// The status view (`aegis.workflow.status`, list rows).
pub(crate) fn summary(e: &WorkflowExecution) -> Value {
    json!({
        "execution_id": e.id, "workflow_id": e.workflow_id, "workflow": e.workflow_name,
        "version": e.workflow_version, "revision": e.workflow_revision,
        "manifest_digest": e.manifest_digest, "status": e.status, "current_state": e.current_state,
        "transition_count": e.transition_count, "visits": e.visits, "error": e.error,
        "parent_execution_id": e.parent_execution_id, "waiting_for": e.waiting_for,
        "created_at": e.created_at, "started_at": e.started_at,
        "last_transition_at": e.last_transition_at, "ended_at": e.ended_at,
    })
}

/// The full view (`aegis.workflow.executions.get`, REST).
pub(crate) fn detail(e: &WorkflowExecution) -> Value {
    let mut v = summary(e);
    let states: serde_json::Map<String, Value> = e
        .blackboard
        .as_object()
        .map(|bb| {
            bb.iter()
                .filter(|(k, _)| e.visits.get(k.as_str()).is_some())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    v["input"] = e.input.clone();
    v["intent"] = json!(e.intent);
    v["blackboard"] = e.blackboard.clone();
    v["state_outputs"] = Value::Object(states);
    v["final_output"] = e.final_output.clone().unwrap_or(Value::Null);
    v["last_output"] = e.final_output.clone().unwrap_or(Value::Null);
    v
}

/// Starts a workflow execution as the caller (`aegis.workflow.run`, the intent pipeline); its id.
pub(super) async fn start(ctx: &ToolContext<'_>, request: RunRequest) -> Result<Uuid, ToolError> {
    ctx.state
        .workflows
        .run(ctx.caller, request)
        .await
        .map_err(workflow_error)
}

fn run<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        super::check_tenant(ctx, &a)?;
        #[derive(Deserialize)]
        struct A {
            name: String,
            input: Option<Value>,
            blackboard: Option<serde_json::Map<String, Value>>,
            intent: Option<String>,
            version: Option<String>,
        }
        let a: A = args(a)?;
        let request = RunRequest {
            name: a.name,
            version: a.version,
            input: a.input.unwrap_or_else(|| json!({})),
            blackboard: a.blackboard,
            intent: a.intent,
        };
        let id = start(ctx, request).await?;
        Ok(json!({"tool": "aegis.workflow.run", "execution_id": id, "status": "started"}))
    })
}

fn signal<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        super::check_tenant(ctx, &a)?;
        #[derive(Deserialize)]
        struct A {
            execution_id: String,
            response: String,
        }
        let a: A = args(a)?;
        let e = load(ctx, &a.execution_id).await?;
        let state = ctx
            .state
            .workflows
            .signal(&ctx.caller.tenant, e.id, &a.response)
            .await
            .map_err(workflow_error)?;
        Ok(
            json!({"tool": "aegis.workflow.signal", "signalled": true, "execution_id": e.id, "state": state}),
        )
    })
}

fn cancel<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        super::check_tenant(ctx, &a)?;
        let a: RunId = args(a)?;
        let e = load(ctx, &a.execution_id).await?;
        if !ctx
            .state
            .workflows
            .cancel(&ctx.caller.tenant, e.id)
            .await
            .map_err(workflow_error)?
        {
            return Err(ToolError::new(
                "conflict",
                format!(
                    "workflow execution {} has already ended ({})",
                    e.id, e.status
                ),
            ));
        }
        Ok(json!({"tool": "aegis.workflow.cancel", "cancelled": true, "execution_id": e.id}))
    })
}

fn wait<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(wait_for(ctx, a))
}

/// Waits until the execution ends or the wait times out (`aegis.workflow.wait`, and
/// `aegis.execute.wait` on a pipeline run).
pub(super) async fn wait_for(ctx: &ToolContext<'_>, a: Value) -> Result<Value, ToolError> {
    {
        super::check_tenant(ctx, &a)?;
        let a: super::runs::WaitArgs = args(a)?;
        // Polls every 250 ms: finer than any `poll_interval_seconds`, which only bounds lateness.
        let deadline = a.deadline();
        loop {
            let e = load(ctx, &a.execution_id).await?;
            if store::is_terminal(&e.status) {
                let mut v = detail(&e);
                v["tool"] = json!("aegis.workflow.wait");
                v["timed_out"] = json!(false);
                return Ok(v);
            }
            if tokio::time::Instant::now() >= deadline {
                let mut v = summary(&e);
                v["tool"] = json!("aegis.workflow.wait");
                v["timed_out"] = json!(true);
                v["message"] = json!(format!(
                    "the execution is still {} in state `{}`",
                    e.status, e.current_state
                ));
                return Ok(v);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

fn logs<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        super::check_tenant(ctx, &a)?;
        #[derive(Deserialize)]
        struct A {
            execution_id: String,
            limit: Option<i64>,
            offset: Option<i64>,
        }
        let a: A = args(a)?;
        let e = load(ctx, &a.execution_id).await?;
        let limit = a.limit.unwrap_or(50).clamp(1, 200);
        let offset = a.offset.unwrap_or(0).max(0);
        let (events, total): (Vec<store::Event>, _) =
            super::runs::events_page(ctx, runs::WORKFLOW, e.id, offset, limit).await?;
        let events: Vec<Value> = events
            .into_iter()
            .map(|ev| {
                json!({"sequence": ev.seq, "event_type": ev.event_type, "state_name": ev.state_name,
                       "iteration_number": ev.payload.get("visit"), "payload": ev.payload,
                       "recorded_at": ev.recorded_at})
            })
            .collect();
        Ok(
            json!({"tool": "aegis.workflow.logs", "execution_id": e.id, "status": e.status,
            "workflow_id": e.workflow_id, "events": events, "total": total, "limit": limit, "offset": offset}),
        )
    })
}

fn status<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        super::check_tenant(ctx, &a)?;
        let a: RunId = args(a)?;
        let mut v = summary(&load(ctx, &a.execution_id).await?);
        v["tool"] = json!("aegis.workflow.status");
        Ok(v)
    })
}

fn get<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        super::check_tenant(ctx, &a)?;
        let a: RunId = args(a)?;
        let e = load(ctx, &a.execution_id).await?;
        Ok(json!({"tool": "aegis.workflow.executions.get", "execution": detail(&e)}))
    })
}

fn list<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        super::check_tenant(ctx, &a)?;
        #[derive(Deserialize)]
        struct A {
            limit: Option<i64>,
            offset: Option<i64>,
            workflow_id: Option<String>,
            status: Option<String>,
        }
        let a: A = args(a)?;
        let workflow = definition_id_of(ctx, ManifestKind::Workflow, a.workflow_id).await?;
        let limit = a.limit.unwrap_or(20).clamp(1, 200);
        let offset = a.offset.unwrap_or(0).max(0);
        let (rows, total) = store::list(
            &ctx.state.pool,
            &visibility(ctx),
            workflow,
            a.status.as_deref(),
            limit,
            offset,
        )
        .await
        .map_err(ToolError::internal)?;
        Ok(
            json!({"tool": "aegis.workflow.executions.list", "count": rows.len(), "total": total,
            "executions": rows.iter().map(summary).collect::<Vec<_>>(), "limit": limit, "offset": offset}),
        )
    })
}

fn remove<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        super::check_tenant(ctx, &a)?;
        let a: RunId = args(a)?;
        let e = load(ctx, &a.execution_id).await?;
        super::runs::remove_ended(ctx, runs::WORKFLOW, e.id, &e.status).await?;
        Ok(json!({"tool": "aegis.workflow.remove", "removed": true, "execution_id": e.id}))
    })
}
