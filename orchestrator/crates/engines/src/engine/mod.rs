//! Agent executions: start, run, cancel, recover.
//!
//! An execution takes an agent version and an input, gets its own sandbox, and runs the inner
//! loop (`run.rs`): the model proposes tool calls, every call goes through the same router as
//! any other caller (policy, audit), results go back to the model, until it answers; then the
//! manifest's validators decide success or another iteration with feedback. Everything that
//! happens is an event in the execution's append-only log (`store.rs`). Cancellation and
//! timeouts end the task and destroy the sandbox, which kills whatever command was running.

mod run;
pub mod store;
pub mod validate;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::call::ToolInvoker;
use aegis_config::{ExecutionsConfig, NodeConfig};
use aegis_core::caller::Caller;
use aegis_llm::LlmClient;
use aegis_manifest::{AgentView, ManifestKind};
use aegis_store::registry::{self, RegistryError};

/// What the agent engine uses of the node: its rows, its sandboxes, the settings it reads, the
/// external MCP servers' settings, the engine itself (judges are child executions), and the
/// router through [`ToolInvoker`], the one call it makes upward. Built by the API layer's
/// composition root (`AppState::engine_services`); cheap to clone (handles only).
#[derive(Clone)]
pub struct Services {
    /// Executions, their events and everything they read.
    pub pool: sqlx::PgPool,
    /// This instance (owner of the executions it runs).
    pub instance_id: Uuid,
    /// The node's settings (`executions`, `volumes`, `memory`, `delivery`).
    pub config: Arc<NodeConfig>,
    /// The sandboxes executions run their tools in.
    pub sandboxes: Arc<aegis_sandboxes::Sandboxes>,
    /// The external MCP servers' settings (`skip_judge`).
    pub mcp_servers: Arc<aegis_egress::mcp_servers::McpServers>,
    /// The engine (child executions, the running set).
    pub executions: Arc<Engine>,
    /// The router.
    pub tools: Arc<dyn ToolInvoker>,
}

/// Why an execution could not start (nothing was stored then).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The agent or version does not exist.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The input does not satisfy the agent's `spec.input_schema`.
    #[error("the input does not match the agent's input_schema: {}", .0.join("; "))]
    InvalidInput(Vec<String>),
    /// The manifest asks for something this node cannot do.
    #[error("{0}")]
    Unsupported(String),
    /// A bound of the node refused it: `depth_limit` (executions.max_depth) or
    /// `concurrency_limit` (executions.max_concurrent_per_caller / max_concurrent).
    #[error("{message}")]
    Limit {
        /// `depth_limit` or `concurrency_limit`.
        code: &'static str,
        /// Which bound, its value, and what to do.
        message: String,
    },
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl From<store::BoundError> for ExecError {
    fn from(e: store::BoundError) -> Self {
        match e {
            store::BoundError::Db(db) => ExecError::Db(db),
            e @ store::BoundError::TooDeep { .. } => ExecError::Limit {
                code: "depth_limit",
                message: e.to_string(),
            },
            e @ store::BoundError::TooMany { .. } => ExecError::Limit {
                code: "concurrency_limit",
                message: e.to_string(),
            },
        }
    }
}

/// The rights of whoever started an execution; the execution never gets more (its tier is
/// lowered to this tier, and its calls must pass these contexts as well as its own).
#[derive(Clone)]
pub(crate) struct Ceiling {
    pub tier: aegis_core::caller::Tier,
    pub contexts: Vec<std::sync::Arc<aegis_seal::context::SecurityContext>>,
}

impl Ceiling {
    /// The ceiling a caller imposes on what it starts; none for an operator without a context.
    fn of(caller: &Caller) -> Option<Self> {
        if caller.tier >= aegis_core::caller::Tier::Operator && caller.seal.is_none() {
            return None;
        }
        let contexts = caller
            .seal
            .as_ref()
            .map(|s| {
                std::iter::once(s.context.clone())
                    .chain(s.ceilings.iter().cloned())
                    .collect()
            })
            .unwrap_or_default();
        Some(Self {
            tier: caller.tier,
            contexts,
        })
    }
}

/// An execution's input with the agent's `spec.task.input_data` as defaults: used whole when
/// the caller gave no input (`null` or `{}`), and under the caller's keys when both are
/// objects (the caller wins key by key); any other input is taken as given.
pub fn with_defaults(defaults: Option<&Value>, input: Value) -> Value {
    let Some(defaults) = defaults else {
        return input;
    };
    match (defaults, input) {
        (d, Value::Null) => d.clone(),
        (Value::Object(d), Value::Object(given)) => {
            let mut merged = d.clone();
            merged.extend(given);
            Value::Object(merged)
        }
        (d, Value::Object(given)) if given.is_empty() => d.clone(),
        (_, input) => input,
    }
}

/// The engine: the model client and the running executions' cancel handles.
pub struct Engine {
    llm: Result<LlmClient, String>,
    running: Mutex<HashMap<Uuid, CancellationToken>>,
    /// The node's ceilings on agent executions (`executions:`), as configured.
    config: ExecutionsConfig,
}

/// What a caller asks to run.
#[derive(Debug, Clone)]
pub struct ExecuteRequest {
    /// Agent name or id.
    pub agent: String,
    /// Version (default latest).
    pub version: Option<String>,
    /// Input, validated against `spec.input_schema`.
    pub input: Value,
    /// Natural-language intent.
    pub intent: Option<String>,
    /// Parent execution (judges).
    pub parent: Option<Uuid>,
    /// The workflow state that started it, if any (recorded so a re-run can cancel it).
    pub workflow: Option<WorkflowLink>,
    /// An LLM alias its model calls use instead of the agent's `spec.runtime.model`: a judge
    /// asked with the model its validator names (`semantic.model`).
    pub model: Option<String>,
}

/// The workflow state an agent execution was started for: (execution, state, visit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowLink {
    /// Workflow execution id.
    pub execution_id: Uuid,
    /// State name.
    pub state: String,
    /// Visit number of that state.
    pub visit: i32,
    /// The run's volumes the state mounts into the agent's sandbox (`workspaces`).
    pub workspace: Option<aegis_sandboxes::workspaces::Workspace>,
}

impl Engine {
    /// An engine around the configured model client (or the reason there is none).
    pub fn new(llm: Result<LlmClient, String>, config: ExecutionsConfig) -> Self {
        Self {
            llm,
            running: Mutex::new(HashMap::new()),
            config,
        }
    }

    /// The node's model client, or why there is none; the generators (`tools/generate.rs`) draft
    /// manifests with the same client and aliases the agents use.
    pub fn llm(&self) -> Result<&LlmClient, &str> {
        self.llm.as_ref().map_err(String::as_str)
    }

    /// Validates and stores a new execution, then runs it in the background.
    pub async fn start(
        &self,
        services: &Services,
        caller: &Caller,
        req: ExecuteRequest,
    ) -> Result<Uuid, ExecError> {
        let def = registry::get(
            &services.pool,
            &caller.tenant,
            ManifestKind::Agent,
            &req.agent,
            req.version.as_deref(),
        )
        .await?;
        let view = AgentView(&def.manifest);
        let mut req = req;
        req.input = with_defaults(view.input_data(), req.input);
        if let Some(schema) = view.input_schema() {
            check_input(schema, &req.input)?;
        }
        check_validators(&def.manifest)?;
        let own_volumes = aegis_sandboxes::volumes::of_manifest(&def.manifest);
        aegis_sandboxes::volumes::check(&own_volumes, &services.config.volumes)
            .map_err(|e| ExecError::Unsupported(e.to_string()))?;
        let workspace = req.workflow.as_ref().and_then(|w| w.workspace.clone());
        if let Some(ws) = &workspace {
            aegis_sandboxes::workspaces::clash_with_agent_volumes(ws, &def.name, &own_volumes)
                .map_err(ExecError::Unsupported)?;
        }
        let id = Uuid::new_v4();
        let bounds = self.bounds(services, caller, req.parent).await?;
        store::insert_bounded(
            &services.pool,
            &store::NewExecution {
                id,
                tenant: &caller.tenant,
                agent_id: def.id,
                agent_version_id: def.version_id,
                agent_name: &def.name,
                agent_version: &def.version,
                parent: req.parent,
                input: &req.input,
                intent: req.intent.as_deref(),
                caller_kind: caller.kind.as_str(),
                caller_id: &caller.id,
                instance_id: services.instance_id,
                workflow: req.workflow.as_ref(),
            },
            &bounds,
        )
        .await?;
        self.launch(services, caller, id, def, req, workspace);
        Ok(id)
    }

    /// The limits the new row is inserted under (its depth, its principal, the configured
    /// maxima): a step of its own because they are read from the parent's row.
    async fn bounds(
        &self,
        services: &Services,
        caller: &Caller,
        parent: Option<Uuid>,
    ) -> Result<store::Bounds, ExecError> {
        // Depth and principal come from the parent; a key or session is its own principal.
        let (principal, depth) = match parent {
            Some(parent) => match store::principal_of(&services.pool, parent).await? {
                Some((principal, depth)) => (principal, depth + 1),
                None => (
                    aegis_policy::executions::principal_key(caller.kind.as_str(), &caller.id),
                    1,
                ),
            },
            None => (
                aegis_policy::executions::principal_key(caller.kind.as_str(), &caller.id),
                0,
            ),
        };
        Ok(store::Bounds {
            depth,
            principal,
            max_depth: self.config.max_depth,
            max_per_principal: self.config.max_concurrent_per_caller,
            max_on_node: self.config.max_concurrent,
        })
    }

    /// The last step of [`Engine::start`], once the row is stored: its cancel handle is kept
    /// and the run is spawned in the background.
    fn launch(
        &self,
        services: &Services,
        caller: &Caller,
        id: Uuid,
        def: registry::Definition,
        req: ExecuteRequest,
        workspace: Option<aegis_sandboxes::workspaces::Workspace>,
    ) {
        let token = CancellationToken::new();
        if let Ok(mut running) = self.running.lock() {
            running.insert(id, token.clone());
        }
        // Its tool calls are counted under the door it came through.
        let door = if req.workflow.is_some() {
            aegis_metrics::Door::Workflow
        } else {
            aegis_metrics::Door::Execution
        };
        let job = run::Job {
            services: services.clone(),
            id,
            tenant: caller.tenant.clone(),
            def,
            input: req.input,
            intent: req.intent,
            token,
            llm: self.llm.clone(),
            config: self.config.clone(),
            ceiling: Ceiling::of(caller),
            model: req.model,
            workspace,
            workspace_restored: std::sync::atomic::AtomicBool::new(false),
        };
        tokio::spawn(aegis_metrics::through(door, job.run()));
    }

    /// Asks a running execution to stop; a pending or running one that this instance does not
    /// run is marked cancelled directly. False when it had already ended.
    pub async fn cancel(
        &self,
        services: &Services,
        tenant: &str,
        id: Uuid,
    ) -> Result<Option<bool>, sqlx::Error> {
        let Some(exec) = store::get(&services.pool, tenant, id).await? else {
            return Ok(None);
        };
        if store::is_terminal(&exec.status) {
            return Ok(Some(false));
        }
        let token = self.running.lock().ok().and_then(|r| r.get(&id).cloned());
        match token {
            Some(t) => t.cancel(),
            None => {
                let mut tx = services.pool.begin().await?;
                let ended =
                    store::transition(&mut *tx, id, "cancelled", None, Some("cancelled")).await?;
                if ended {
                    aegis_egress::delivery::enqueue(&mut tx, id, &services.config.delivery).await?;
                }
                tx.commit().await?;
                if ended {
                    store::event(
                        &services.pool,
                        id,
                        "execution_cancelled",
                        json!({"by": "request"}),
                    )
                    .await?;
                }
            }
        }
        Ok(Some(true))
    }

    /// Forgets a finished execution's cancel handle.
    pub(crate) fn finished(&self, id: Uuid) {
        if let Ok(mut running) = self.running.lock() {
            running.remove(&id);
        }
    }

    /// Cancels every execution of this instance and waits (up to `grace`) for their tasks to
    /// record the end and destroy their sandboxes (graceful shutdown).
    pub async fn stop_all(&self, grace: std::time::Duration) {
        if let Ok(running) = self.running.lock() {
            for t in running.values() {
                t.cancel();
            }
        }
        let deadline = tokio::time::Instant::now() + grace;
        while self.running.lock().map(|r| !r.is_empty()).unwrap_or(false)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// At start-up: executions left running by an instance that is gone fail with the reason
    /// `orchestrator restarted`, and their sandboxes are destroyed.
    pub async fn recover(&self, services: &Services, dead_after_secs: i64) {
        // Failed, with their deliveries queued, in one transaction.
        let failed = async {
            let mut tx = services.pool.begin().await?;
            let orphans =
                store::fail_orphans(&mut *tx, services.instance_id, dead_after_secs).await?;
            for (id, _) in &orphans {
                aegis_egress::delivery::enqueue(&mut tx, *id, &services.config.delivery).await?;
            }
            tx.commit().await?;
            Ok::<_, sqlx::Error>(orphans)
        };
        let orphans = match failed.await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "could not recover executions of previous instances");
                return;
            }
        };
        for (id, sandbox) in orphans {
            tracing::warn!(execution = %id, "execution failed: orchestrator restarted");
            let _ = store::event(
                &services.pool,
                id,
                "execution_failed",
                json!({"reason": "orchestrator restarted"}),
            )
            .await;
            if let Some(sandbox) = sandbox {
                let _ = services
                    .sandboxes
                    .destroy(dispatcher::SandboxId(sandbox))
                    .await;
            }
        }
    }
}

/// Checking the input against the agent's `input_schema` (after its defaults are filled in):
/// every error, each prefixed with where in the input it is.
fn check_input(schema: &Value, input: &Value) -> Result<(), ExecError> {
    let validator = jsonschema::validator_for(schema).map_err(|e| {
        ExecError::Unsupported(format!("the agent's input_schema does not compile: {e}"))
    })?;
    let errors: Vec<String> = validator
        .iter_errors(input)
        .map(|e| {
            format!(
                "{}: {e}",
                if e.instance_path().to_string().is_empty() {
                    "(input)".to_owned()
                } else {
                    e.instance_path().to_string()
                }
            )
        })
        .collect();
    if !errors.is_empty() {
        return Err(ExecError::InvalidInput(errors));
    }
    Ok(())
}

/// Refusing at start an agent whose `spec.execution.validation` names a validator kind this
/// engine does not have, rather than failing it after its first answer.
fn check_validators(manifest: &Value) -> Result<(), ExecError> {
    let validators = manifest
        .pointer("/spec/execution/validation")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let unsupported = validate::unsupported(&validators);
    if !unsupported.is_empty() {
        return Err(ExecError::Unsupported(format!(
            "unknown validator kind(s) {}; supported: {}",
            unsupported.join(", "),
            validate::SUPPORTED.join(", ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_data_fills_what_the_caller_left_out() {
        let defaults = json!({"topic": "cats", "n": 3});
        assert_eq!(with_defaults(Some(&defaults), json!({})), defaults);
        assert_eq!(with_defaults(Some(&defaults), Value::Null), defaults);
        assert_eq!(
            with_defaults(Some(&defaults), json!({"n": 5, "extra": true})),
            json!({"topic": "cats", "n": 5, "extra": true})
        );
        assert_eq!(with_defaults(Some(&defaults), json!("text")), json!("text"));
        assert_eq!(with_defaults(None, json!({})), json!({}));
        assert_eq!(
            with_defaults(Some(&json!("plain")), json!({})),
            json!("plain")
        );
    }
}
