//! Workflow executions: the second engine, a durable state machine that lives in PostgreSQL.
//!
//! A run is one row (`store.rs`: status, current state, visit counts, transition count, the
//! blackboard, lease) plus an append-only, gap-free event log. Nothing about a run lives only in
//! memory: any replica's workers (`worker.rs`) claim runnable rows with `FOR UPDATE SKIP LOCKED`
//! under a lease they renew, run the current state (`states/`), pick the first matching
//! transition (`conditions.rs`), and commit the state's output, its events and the next state in
//! one transaction fenced by the lease. A replica that dies stops renewing; once its leases
//! expire another replica continues, first removing whatever the interrupted state had started
//! (its sandboxes and child executions are labelled with execution, state and visit). A state
//! whose output is committed never runs again.
//!
//! The engine reaches the rest of the service through narrow handles: the pool, the sandboxes
//! (dispatcher), and [`AgentHost`] to start and cancel agent executions; it never sees the
//! whole `AppState`. Run, signal and cancel are plain database writes plus a NOTIFY, so the
//! tools that call them (`tools/workflows.rs`) work on any replica.

mod ceiling;
pub mod conditions;
mod contract;
mod runtime;
mod schedule;
mod start;
mod states;
pub mod store;
mod worker;

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::engine::{ExecError, ExecuteRequest};
use aegis_core::caller::Caller;
use aegis_store::registry::RegistryError;

use futures_util::future::BoxFuture;

pub use start::RunRequest;
pub use worker::spawn_workers;

/// What the workflow engine needs from the agent engine: start a child agent execution and
/// cancel one. Implemented over the application state (see `state.rs`), so this module does not
/// depend on it.
pub trait AgentHost: Send + Sync + 'static {
    /// Starts an agent execution (validated and stored before this returns).
    fn start_agent(
        &self,
        caller: Caller,
        request: ExecuteRequest,
    ) -> BoxFuture<'_, Result<Uuid, ExecError>>;
    /// Cancels an agent execution (wherever it runs); errors are logged, not returned.
    fn cancel_agent(&self, tenant: String, id: Uuid) -> BoxFuture<'_, ()>;
}

/// Why a workflow operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    /// The workflow (or an agent or workflow it names) does not exist.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The input does not satisfy `metadata.input_schema`.
    #[error("the input does not match the workflow's input_schema: {}", .0.join("; "))]
    InvalidInput(Vec<String>),
    /// Run-time blackboard overrides use reserved keys.
    #[error("blackboard overrides may not set the reserved key(s) {}", .0.join(", "))]
    ReservedKeys(Vec<String>),
    /// The workflow cannot run on this node as it stands (missing agents, unsupported fields).
    #[error("the workflow cannot run: {}", .0.join("; "))]
    NotRunnable(Vec<String>),
    /// No such execution (or not visible to the caller).
    #[error("workflow execution {0} not found")]
    NotFound(Uuid),
    /// The execution is in a state that does not allow the operation.
    #[error("{0}")]
    Conflict(String),
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// The node's workflow settings, resolved at start.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Worker tasks on this replica.
    pub workers: u32,
    /// Lease length, seconds.
    pub lease_ttl_secs: u64,
    /// Fallback poll period.
    pub poll_interval: std::time::Duration,
    /// Longest execution, seconds.
    pub max_execution_secs: u64,
    /// Network modes ContainerRun may use besides `none`.
    pub allow_network_modes: Vec<String>,
    /// Image of System states' sandbox.
    pub system_image: String,
    /// Largest size limit of a workflow volume, MiB (`volumes.max_size_mb`).
    pub volume_max_mb: u64,
    /// How long a persistent workflow volume outlives its run without `ttl_hours`.
    pub volume_ttl_hours: u64,
}

/// The workflow engine's handle: what tools and workers share on one replica.
pub struct Workflows {
    pool: PgPool,
    instance_id: Uuid,
    settings: Settings,
    wake: Notify,
    running: Mutex<HashMap<Uuid, CancellationToken>>,
}

impl Workflows {
    /// A handle for this replica.
    pub fn new(pool: PgPool, instance_id: Uuid, settings: Settings) -> Self {
        Self {
            pool,
            instance_id,
            settings,
            wake: Notify::new(),
            running: Mutex::new(HashMap::new()),
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Validates and stores a new execution (workers pick it up at once); nothing is stored
    /// when validation fails.
    pub async fn run(&self, caller: &Caller, request: RunRequest) -> Result<Uuid, WorkflowError> {
        let ceiling = ceiling::of(caller);
        let id = start::start(
            &self.pool,
            &start::Starter {
                tenant: &caller.tenant,
                caller_kind: caller.kind.as_str(),
                caller_id: &caller.id,
                ceiling: ceiling.as_ref(),
                allow_network_modes: &self.settings.allow_network_modes,
                max_execution_secs: self.settings.max_execution_secs,
                volume_max_mb: self.settings.volume_max_mb,
            },
            request,
            None,
        )
        .await?;
        self.wake.notify_waiters();
        Ok(id)
    }

    /// Delivers a Human answer; refused with the reason when the execution is not waiting in a
    /// Human state (the answer is never silently dropped). Returns the state answered.
    pub async fn signal(
        &self,
        tenant: &str,
        id: Uuid,
        response: &str,
    ) -> Result<String, WorkflowError> {
        match store::signal(&self.pool, tenant, id, response).await? {
            Ok(state) => {
                self.wake.notify_waiters();
                Ok(state)
            }
            Err(store::SignalRefusal::NotFound) => Err(WorkflowError::NotFound(id)),
            Err(store::SignalRefusal::AlreadyAnswered { state }) => Err(WorkflowError::Conflict(
                format!("execution {id} already has an answer for Human state `{state}` that is being processed"),
            )),
            Err(store::SignalRefusal::NotWaiting {
                status,
                state,
                waiting_for,
            }) => Err(WorkflowError::Conflict(match (status.as_str(), waiting_for) {
                ("waiting", Some(what)) => format!(
                    "execution {id} is not waiting for human input: state `{state}` waits for a {what}"
                ),
                (s, _) if store::is_terminal(s) => {
                    format!("execution {id} has ended ({s}) in state `{state}`; nothing waits for input")
                }
                (s, _) => format!(
                    "execution {id} is not waiting for human input: it is {s} in state `{state}`"
                ),
            })),
        }
    }

    /// Asks an execution to stop: whatever its current state runs is destroyed or cancelled by
    /// the replica that holds it, then it ends as `cancelled`. False when it had already ended.
    pub async fn cancel(&self, tenant: &str, id: Uuid) -> Result<bool, WorkflowError> {
        if store::get(&self.pool, tenant, id).await?.is_none() {
            return Err(WorkflowError::NotFound(id));
        }
        let asked = store::request_cancel(&self.pool, id).await?;
        if asked {
            if let Some(token) = self.running.lock().ok().and_then(|r| r.get(&id).cloned()) {
                token.cancel();
            }
            self.wake.notify_waiters();
        }
        Ok(asked)
    }

    fn track(&self, id: Uuid, token: CancellationToken) {
        if let Ok(mut r) = self.running.lock() {
            r.insert(id, token);
        }
    }

    fn untrack(&self, id: Uuid) {
        if let Ok(mut r) = self.running.lock() {
            r.remove(&id);
        }
    }

    fn interrupt(&self, id: Uuid) {
        if let Some(token) = self.running.lock().ok().and_then(|r| r.get(&id).cloned()) {
            token.cancel();
        }
    }
}

/// Whether a run may not override blackboard key `key`, and a state may not take its name: the
/// run's variables ([`aegis_manifest::RUN_VARIABLES`]) and the two AEGIS reserves against
/// start-time overrides (`iteration_number`, `previous_error`).
pub fn is_reserved_key(key: &str) -> bool {
    aegis_manifest::RUN_VARIABLES.contains(&key)
        || ["iteration_number", "previous_error"].contains(&key)
}

/// `{key: value}` pairs of an object (empty for anything else).
fn object(v: &Value) -> serde_json::Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}
