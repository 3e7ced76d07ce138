//! `aegis.task.*`, `aegis.agent.wait` and `aegis.agent.logs`: run agents and watch them.
//!
//! Every tool that names an execution acts on it only if `policy::executions::may_act_on`
//! allows it (the caller's own executions and their children, unless operator tier); listings
//! show only those.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::definitions::definition_id_of;
use super::runs::RunId;
use super::{args, Handler, HandlerFuture, ToolContext, ToolError};
use aegis_engines::engine::{store, ExecError, ExecuteRequest};
use aegis_engines::runs;
use aegis_manifest::ManifestKind;

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![
        ("aegis.task.execute", execute),
        ("aegis.task.status", status),
        ("aegis.task.list", list),
        ("aegis.task.cancel", cancel),
        ("aegis.task.remove", remove),
        ("aegis.task.logs", logs),
        ("aegis.task.wait", wait),
        ("aegis.agent.wait", wait),
        ("aegis.agent.logs", agent_logs),
    ]
}

/// Maps an engine refusal to a tool error.
pub(crate) fn exec_error(e: ExecError) -> ToolError {
    match e {
        ExecError::Registry(r) => super::registry_error(r),
        ExecError::InvalidInput(errors) => super::runs::invalid_input("agent", errors),
        ExecError::Unsupported(m) => ToolError::new("unsupported", m),
        ExecError::Limit { code, message } => ToolError::new(code, message),
        ExecError::Db(e) => ToolError::internal(e),
    }
}

fn uuid(s: &str, what: &str) -> Result<Uuid, ToolError> {
    Uuid::parse_str(s).map_err(|_| {
        ToolError::new(
            "invalid_arguments",
            format!("`{what}` must be a UUID, got `{s}`"),
        )
    })
}

/// The status view the tool reference documents.
pub(crate) fn view(e: &store::Execution) -> Value {
    json!({
        "execution_id": e.id, "agent_id": e.agent_id, "agent": e.agent_name, "version": e.agent_version,
        "revision": e.agent_revision, "manifest_digest": e.manifest_digest,
        "status": e.status, "iteration_count": e.iteration_count, "last_output": e.last_output,
        "last_error": e.last_error, "started_at": e.started_at, "ended_at": e.ended_at, "created_at": e.created_at,
    })
}

/// Loads an execution the caller may act on; `forbidden` for someone else's.
async fn load(ctx: &ToolContext<'_>, id: &str) -> Result<store::Execution, ToolError> {
    let id = uuid(id, "execution_id")?;
    let not_found = || ToolError::new("not_found", format!("execution {id} not found"));
    let scope = store::scope(&ctx.state.pool, &ctx.caller.tenant, id)
        .await
        .map_err(ToolError::internal)?
        .ok_or_else(not_found)?;
    aegis_policy::executions::may_act_on(ctx.caller, &scope)
        .map_err(|d| ToolError::new("forbidden", d.message))?;
    store::get(&ctx.state.pool, &ctx.caller.tenant, id)
        .await
        .map_err(ToolError::internal)?
        .ok_or_else(not_found)
}

fn execute<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            agent_id: String,
            intent: Option<String>,
            input: Option<Value>,
            version: Option<String>,
        }
        let a: A = args(a)?;
        let parent = (ctx.caller.kind == aegis_core::caller::CallerKind::Execution)
            .then(|| Uuid::parse_str(&ctx.caller.id).ok())
            .flatten();
        let request = ExecuteRequest {
            agent: a.agent_id,
            version: a.version,
            input: a.input.unwrap_or_else(|| json!({})),
            intent: a.intent,
            parent,
            workflow: None,
            model: None,
        };
        // Started in a task of its own: a caller that goes away mid-start cannot leave a stored
        // execution that nothing runs.
        let (state, caller) = (ctx.state.clone(), ctx.caller.clone());
        let id = tokio::spawn(async move {
            state
                .executions
                .start(&state.engine_services(), &caller, request)
                .await
        })
        .await
        .map_err(ToolError::internal)?
        .map_err(exec_error)?;
        Ok(json!({"tool": "aegis.task.execute", "execution_id": id, "status": "started"}))
    })
}

fn status<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        let a: RunId = args(a)?;
        Ok(view(&load(ctx, &a.execution_id).await?))
    })
}

fn list<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            agent_id: Option<String>,
            limit: Option<i64>,
        }
        let a: A = args(a)?;
        let agent = definition_id_of(ctx, ManifestKind::Agent, a.agent_id).await?;
        let rows = store::list_visible(
            &ctx.state.pool,
            &ctx.caller.tenant,
            &store::Visible::of(ctx.caller),
            agent,
            None,
            a.limit.unwrap_or(50),
            0,
        )
        .await
        .map_err(ToolError::internal)?;
        Ok(
            json!({"tool": "aegis.task.list", "executions": rows.iter().map(view).collect::<Vec<_>>(), "total": rows.len()}),
        )
    })
}

fn cancel<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        let a: RunId = args(a)?;
        let id = load(ctx, &a.execution_id).await?.id;
        match ctx
            .state
            .executions
            .cancel(&ctx.state.engine_services(), &ctx.caller.tenant, id)
            .await
            .map_err(ToolError::internal)?
        {
            None => Err(ToolError::new(
                "not_found",
                format!("execution {id} not found"),
            )),
            Some(false) => Err(ToolError::new(
                "conflict",
                format!("execution {id} has already ended"),
            )),
            Some(true) => {
                Ok(json!({"tool": "aegis.task.cancel", "execution_id": id, "cancelled": true}))
            }
        }
    })
}

fn remove<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        let a: RunId = args(a)?;
        let e = load(ctx, &a.execution_id).await?;
        super::runs::remove_ended(ctx, runs::AGENT, e.id, &e.status).await?;
        Ok(json!({"tool": "aegis.task.remove", "execution_id": e.id, "removed": true}))
    })
}

fn logs<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            execution_id: String,
            limit: Option<i64>,
            offset: Option<i64>,
        }
        let a: A = args(a)?;
        let e = load(ctx, &a.execution_id).await?;
        let limit = a.limit.unwrap_or(50);
        let offset = a.offset.unwrap_or(0);
        let (events, total): (Vec<store::Event>, _) =
            super::runs::events_page(ctx, runs::AGENT, e.id, offset, limit).await?;
        Ok(
            json!({"tool": "aegis.task.logs", "execution_id": e.id, "events": events, "total": total, "limit": limit, "offset": offset}),
        )
    })
}

fn wait<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        let a: super::runs::WaitArgs = args(a)?;
        // Polls every 500 ms: `poll_interval_seconds` (at least 1 s) is only an upper bound on
        // how late the answer may come, and finer polling always satisfies it.
        let poll = Duration::from_millis(500);
        let deadline = a.deadline();
        loop {
            let e = load(ctx, &a.execution_id).await?;
            if store::is_terminal(&e.status) {
                return Ok(view(&e));
            }
            if tokio::time::Instant::now() >= deadline {
                let mut v = view(&e);
                v["execution_status"] = json!(e.status);
                v["status"] = json!("timed_out");
                v["wait_timed_out"] = json!(true);
                return Ok(v);
            }
            tokio::time::sleep(poll).await;
        }
    })
}

fn agent_logs<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            agent_id: String,
            limit: Option<i64>,
            offset: Option<i64>,
        }
        let a: A = args(a)?;
        let agent = uuid(&a.agent_id, "agent_id")?;
        let limit = a.limit.unwrap_or(50).clamp(1, 500);
        let offset = a.offset.unwrap_or(0).max(0);
        let (rows, total) = store::agent_events(
            &ctx.state.pool,
            &ctx.caller.tenant,
            &store::Visible::of(ctx.caller),
            agent,
            limit,
            offset,
        )
        .await
        .map_err(ToolError::internal)?;
        let events: Vec<Value> = rows
            .into_iter()
            .map(|(id, t, p, at)| json!({"execution_id": id, "event_type": t, "payload": p, "recorded_at": at}))
            .collect();
        Ok(
            json!({"tool": "aegis.agent.logs", "agent_id": agent, "events": events, "total": total, "limit": limit, "offset": offset}),
        )
    })
}
