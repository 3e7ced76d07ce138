//! `Subworkflow`: a child workflow execution, linked to (execution, state, visit).
//!
//! The child is looked up by that link before one is started, so a state that runs again after
//! a crash reuses the child its earlier attempt started instead of starting a second one.
//! `fire_and_forget` answers at once with the child's id. `blocking` parks the parent until the
//! child ends (the child's final commit wakes it) or the state's timeout passes, then writes the
//! child's result (its `final_output`, else its blackboard) to `blackboard[result_key]`.

use chrono::Utc;
use serde_json::{json, Value};

use super::{StateCtx, Step};
use crate::workflow::start::{self, RunRequest, Starter};
use crate::workflow::store::{self, NewEvent};
use crate::workflow::WorkflowError;

pub(super) async fn subworkflow(ctx: &StateCtx<'_>) -> Step {
    let mode = ctx.body["mode"].as_str().unwrap_or("blocking");
    let target = ctx.body["workflow_id"].as_str().unwrap_or_default();
    let existing = match store::child_of(&ctx.rt.pool, ctx.exec.id, ctx.name, ctx.visit).await {
        Ok(c) => c,
        Err(e) => return Step::Fail(format!("state `{}`: database error: {e}", ctx.name)),
    };
    let mut events = Vec::new();
    let child = match existing {
        Some(child) => child,
        None => match start_child(ctx, mode, target).await {
            Ok((child, started)) => {
                events.push(started);
                child
            }
            Err(step) => return step,
        },
    };
    if mode != "blocking" {
        return Step::Output(
            json!({"status": "completed", "child_execution_id": child.id, "mode": "fire_and_forget"}),
            Vec::new(),
        );
    }
    if store::is_terminal(&child.status) {
        return child_finished(ctx, &child).await;
    }
    wait_for_child(ctx, &child, events).await
}

/// The child's input: the state's `input` rendered (text that is no JSON object is wrapped as
/// `{"input": text}`), or the parent's own input when the state gives none.
fn child_input(ctx: &StateCtx<'_>) -> Result<Value, String> {
    Ok(match ctx.body.get("input") {
        None => ctx.exec.input.clone(),
        Some(Value::String(t)) => {
            let text = ctx.render("input", t)?;
            serde_json::from_str::<Value>(&text)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({"input": text}))
        }
        Some(other) => ctx.render_value("input", other)?,
    })
}

/// Starting the child is a step of its own, reached only when no earlier attempt started one.
/// Ok: the (blocking) child as stored and its `child_started` event, to be committed with the
/// wait. Err: the state's step at once (it failed, or a `fire_and_forget` child was started).
async fn start_child(
    ctx: &StateCtx<'_>,
    mode: &str,
    target: &str,
) -> Result<(store::WorkflowExecution, NewEvent), Step> {
    let input = child_input(ctx).map_err(Step::Fail)?;
    let who = Starter {
        tenant: &ctx.exec.tenant_id,
        caller_kind: &ctx.exec.caller_kind,
        caller_id: &ctx.exec.caller_id,
        ceiling: ctx.exec.ceiling.as_ref(),
        allow_network_modes: &ctx.rt.allow_network_modes,
        max_execution_secs: ctx.rt.max_execution_secs,
        volume_max_mb: ctx.rt.workflows.settings().volume_max_mb,
    };
    let request = RunRequest {
        name: target.to_owned(),
        version: None,
        input,
        blackboard: None,
        intent: ctx.exec.intent.clone(),
    };
    let id = match start::start(
        &ctx.rt.pool,
        &who,
        request,
        Some((ctx.exec.id, ctx.name, ctx.visit)),
    )
    .await
    {
        Ok(id) => id,
        Err(WorkflowError::Db(e)) => {
            return Err(Step::Fail(format!(
                "state `{}`: database error: {e}",
                ctx.name
            )))
        }
        Err(e) => {
            return Err(Step::Output(
                json!({"status": "failed", "mode": mode, "error": format!("the child workflow `{target}` could not start: {e}")}),
                Vec::new(),
            ))
        }
    };
    ctx.rt.wake();
    let started = NewEvent::state(
        "child_started",
        ctx.name,
        json!({"kind": "workflow", "workflow": target, "execution_id": id, "mode": mode, "visit": ctx.visit}),
    );
    if mode != "blocking" {
        ctx.event("child_started", started.payload).await;
        return Err(Step::Output(
            json!({"status": "completed", "child_execution_id": id, "mode": "fire_and_forget"}),
            Vec::new(),
        ));
    }
    match store::get(&ctx.rt.pool, &ctx.exec.tenant_id, id).await {
        Ok(Some(c)) => Ok((c, started)),
        Ok(None) => Err(Step::Fail(format!(
            "state `{}`: the child {id} vanished",
            ctx.name
        ))),
        Err(e) => Err(Step::Fail(format!(
            "state `{}`: database error: {e}",
            ctx.name
        ))),
    }
}

/// A blocking child that has ended: its result (final output, else blackboard) is the state's
/// output and goes to `blackboard[result_key]`.
async fn child_finished(ctx: &StateCtx<'_>, child: &store::WorkflowExecution) -> Step {
    let result = child
        .final_output
        .clone()
        .unwrap_or_else(|| child.blackboard.clone());
    let ok = child.status == "completed";
    ctx.event(
        "child_finished",
        json!({"kind": "workflow", "execution_id": child.id, "status": child.status, "error": child.error}),
    )
    .await;
    let mut writes = Vec::new();
    if let Some(key) = ctx.body["result_key"].as_str() {
        writes.push((key.to_owned(), result.clone()));
    }
    Step::Output(
        json!({"status": if ok { "completed" } else { "failed" }, "mode": "blocking",
               "child_execution_id": child.id, "child_status": child.status,
               "result": result, "error": child.error}),
        writes,
    )
}

/// A blocking child still running: park until it ends or the state's timeout, which (once
/// passed) cancels the child and fails the state.
async fn wait_for_child(
    ctx: &StateCtx<'_>,
    child: &store::WorkflowExecution,
    events: Vec<NewEvent>,
) -> Step {
    let deadline = ctx.timeout.map(|t| {
        ctx.exec.state_entered_at + chrono::Duration::from_std(t).unwrap_or(chrono::Duration::MAX)
    });
    if deadline.is_some_and(|d| Utc::now() >= d) {
        if let Err(e) = store::request_cancel(&ctx.rt.pool, child.id).await {
            tracing::warn!(child = %child.id, error = %e, "could not cancel a timed-out child workflow");
        }
        return Step::Fail(format!(
            "state `{}` timed out after {} s waiting for its child workflow {} (its `timeout`)",
            ctx.name,
            ctx.timeout.map(|t| t.as_secs()).unwrap_or_default(),
            child.id
        ));
    }
    Step::Wait {
        waiting_for: "subworkflow",
        wake_at: deadline,
        events,
    }
}
