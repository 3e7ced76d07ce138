//! The seven state kinds: what running one state of a workflow does, and what it leaves behind.
//!
//! A state runner gets the rendered context and returns a [`Step`]: an output (written to
//! `blackboard[STATE]` by the worker, with the events, in one commit), a wait (Human answers,
//! blocking Subworkflow children), or a failure of the whole execution. Runners never commit
//! anything themselves; the only writes they make are events (fenced by the lease) and the
//! things they start, which carry the label (execution, state, visit) that [`cleanup`] uses to
//! remove them when an interrupted attempt is retried or the execution is cancelled.

mod agent;
mod container;
mod human;
mod subworkflow;

use chrono::{DateTime, Utc};
use dispatcher::{Owner, OwnerKind};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::runtime::Runtime;
use super::store::{self, NewEvent, WorkflowExecution};
use aegis_sandboxes::workspaces::Workspace;

pub(super) use container::destroy_system_sandbox;

/// What a state's run came to.
pub(super) enum Step {
    /// The state's output, plus extra blackboard keys to write (Subworkflow `result_key`).
    Output(Value, Vec<(String, Value)>),
    /// Park the execution until an answer, a child's end, or `wake_at`.
    Wait {
        /// `human` or `subworkflow`.
        waiting_for: &'static str,
        /// When to look again (a timeout), if ever.
        wake_at: Option<DateTime<Utc>>,
        /// Events recorded with the park (e.g. the Human prompt, once).
        events: Vec<NewEvent>,
    },
    /// The execution fails with this reason.
    Fail(String),
}

/// What a runner can see and use.
pub(super) struct StateCtx<'a> {
    pub rt: &'a Runtime,
    pub exec: &'a WorkflowExecution,
    /// The workflow version's manifest.
    pub manifest: &'a Value,
    pub name: &'a str,
    pub visit: i32,
    pub body: &'a Value,
    /// Blackboard plus `state` (name, visit, feedback) and `execution` (id).
    pub context: &'a Value,
    /// Cancelled when the run must stop (cancel request, lease lost, shutdown).
    pub token: &'a CancellationToken,
    /// The state's `timeout`, if set.
    pub timeout: Option<std::time::Duration>,
}

impl StateCtx<'_> {
    /// Renders a template of this state, naming the field on error.
    pub fn render(&self, field: &str, template: &str) -> Result<String, String> {
        aegis_core::render::render(template, self.context)
            .map_err(|e| format!("spec.states.{}.{field}: {e}", self.name))
    }

    /// Renders every string inside `v` (objects and arrays recursively).
    pub fn render_value(&self, field: &str, v: &Value) -> Result<Value, String> {
        Ok(match v {
            Value::String(s) => Value::String(self.render(field, s)?),
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|i| self.render_value(field, i))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, i)| Ok((k.clone(), self.render_value(field, i)?)))
                    .collect::<Result<_, String>>()?,
            ),
            other => other.clone(),
        })
    }

    /// Records an event (fenced by the lease; dropped silently once the lease is lost).
    pub async fn event(&self, event_type: &'static str, payload: Value) {
        let e = NewEvent::state(event_type, self.name, payload);
        let lease = (self.rt.me, self.exec.lease_epoch);
        store::record(&self.rt.pool, self.exec.id, lease, &e).await;
    }

    /// The run's volumes `item` (this state, or its step `field`, e.g. `steps[0].`) mounts,
    /// for this attempt; `None` when it mounts none.
    pub fn workspace(&self, item: &Value, field: &str) -> Result<Option<Workspace>, String> {
        let ttl = self.rt.workflows.settings().volume_ttl_hours;
        let mounts = aegis_sandboxes::workspaces::mounts(self.manifest, item, ttl)
            .map_err(|e| format!("spec.states.{}.{field}volumes: {e}", self.name))?;
        Ok((!mounts.is_empty()).then(|| Workspace {
            tenant: self.exec.tenant_id.clone(),
            execution: self.exec.id,
            state: self.name.to_owned(),
            visit: self.visit,
            attempt: self.exec.attempt,
            mounts,
        }))
    }

    /// The owner label of what this state's visit starts.
    pub fn owner(&self) -> Owner {
        state_owner(self.exec, self.name, self.visit)
    }

    /// The caller child executions are started as: the workflow execution, confined by the
    /// rights of whoever started it (`workflow::ceiling`).
    pub async fn caller(&self) -> Result<aegis_core::caller::Caller, String> {
        crate::workflow::ceiling::caller(
            &self.rt.pool,
            &self.exec.tenant_id,
            self.exec.id,
            format!("workflow:{}", self.exec.workflow_name),
            self.exec.ceiling.as_ref(),
        )
        .await
    }
}

/// Owner of the sandboxes of one visit of one state.
fn state_owner(exec: &WorkflowExecution, state: &str, visit: i32) -> Owner {
    Owner::new(OwnerKind::Workflow, format!("{}/{state}/{visit}", exec.id))
}

/// Runs the state.
pub(super) async fn run(ctx: &StateCtx<'_>) -> Step {
    let kind = ctx.body.get("kind").and_then(Value::as_str).unwrap_or("");
    match kind {
        "System" => container::system(ctx).await,
        "ContainerRun" => container::container_run(ctx).await,
        "ParallelContainerRun" => container::parallel(ctx).await,
        "Agent" => agent::agent(ctx).await,
        "ParallelAgents" => agent::parallel(ctx).await,
        "Human" => human::human(ctx).await,
        "Subworkflow" => subworkflow::subworkflow(ctx).await,
        other => Step::Fail(format!("state `{}` has unknown kind `{other}`", ctx.name)),
    }
}

/// Why leftovers are being removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cleanup {
    /// An earlier attempt of this very visit was interrupted; the state runs again next.
    Retry,
    /// The execution ends here (cancelled, timed out, failed): stop everything it runs.
    End,
}

/// Removes what (execution, state, visit) started: sandboxes, live agent executions, and (when
/// the execution ends) a blocking Subworkflow child. Returns a summary for the event log.
pub(super) async fn cleanup(
    rt: &Runtime,
    exec: &WorkflowExecution,
    state: &str,
    visit: i32,
    body: Option<&Value>,
    why: Cleanup,
) -> Value {
    let mut sandboxes = 0usize;
    if let Ok(d) = rt.sandboxes.dispatcher() {
        match d.destroy_owned_by(&state_owner(exec, state, visit)).await {
            Ok(n) => sandboxes += n,
            Err(e) => {
                tracing::warn!(execution = %exec.id, state, error = %e, "could not destroy a state's sandboxes")
            }
        }
    }
    // A command of the interrupted attempt may still run in the System sandbox.
    sandboxes += destroy_system_sandbox(rt, exec.id).await;
    let mut agents = Vec::new();
    match store::live_agent_children(&rt.pool, exec.id, state, visit).await {
        Ok(ids) => {
            for id in ids {
                rt.host.cancel_agent(exec.tenant_id.clone(), id).await;
                agents.push(id);
            }
        }
        Err(e) => {
            tracing::warn!(execution = %exec.id, error = %e, "could not list a state's agent executions")
        }
    }
    let mut workflows = Vec::new();
    if why == Cleanup::End {
        if let Ok(Some(child)) = store::child_of(&rt.pool, exec.id, state, visit).await {
            let blocking =
                body.and_then(|b| b.get("mode")).and_then(Value::as_str) == Some("blocking");
            if blocking && !store::is_terminal(&child.status) {
                if let Err(e) = store::request_cancel(&rt.pool, child.id).await {
                    tracing::warn!(execution = %exec.id, error = %e, "could not cancel a child workflow");
                }
                workflows.push(child.id);
            }
        }
    }
    json!({"sandboxes": sandboxes, "agent_executions": agents, "workflow_executions": workflows})
}
