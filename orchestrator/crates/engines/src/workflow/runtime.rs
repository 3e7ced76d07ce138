//! What the workflow workers, the scheduler and the states of one replica share: the database,
//! the hosts they run agents and sandboxes on, the engine's limits, and the system sandboxes
//! of the executions running here. Its own module so that the worker, the scheduler and the
//! states each depend on it rather than on one another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dispatcher::SandboxId;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{AgentHost, Workflows};
use aegis_sandboxes::Sandboxes;

/// What workers share on one replica.
pub(super) struct Runtime {
    pub pool: PgPool,
    pub me: Uuid,
    pub host: Arc<dyn AgentHost>,
    pub sandboxes: Arc<Sandboxes>,
    pub workflows: Arc<Workflows>,
    pub shutdown: CancellationToken,
    pub lease_ttl_secs: u64,
    pub allow_network_modes: Vec<String>,
    pub max_execution_secs: u64,
    pub system_image: String,
    pub cmd_timeout_secs: u64,
    pub max_output_bytes: u64,
    system_sandboxes: Mutex<HashMap<Uuid, SandboxId>>,
}

impl Runtime {
    /// The runtime of this replica's workers, from the engine's settings and the node's
    /// sandbox ceilings.
    pub fn new(
        workflows: Arc<Workflows>,
        host: Arc<dyn AgentHost>,
        sandboxes: Arc<Sandboxes>,
        shutdown: CancellationToken,
    ) -> Self {
        let ceilings = sandboxes.ceilings().clone();
        let settings = workflows.settings.clone();
        Runtime {
            pool: workflows.pool.clone(),
            me: workflows.instance_id,
            host,
            sandboxes,
            workflows,
            shutdown,
            lease_ttl_secs: settings.lease_ttl_secs,
            allow_network_modes: settings.allow_network_modes.clone(),
            max_execution_secs: settings.max_execution_secs,
            system_image: settings.system_image.clone(),
            cmd_timeout_secs: ceilings.cmd_timeout_secs,
            max_output_bytes: ceilings.max_output_bytes,
            system_sandboxes: Mutex::new(HashMap::new()),
        }
    }

    pub fn system_sandbox(&self, execution: Uuid) -> Option<SandboxId> {
        self.system_sandboxes
            .lock()
            .ok()
            .and_then(|m| m.get(&execution).copied())
    }

    pub fn remember_system_sandbox(&self, execution: Uuid, id: SandboxId) {
        if let Ok(mut m) = self.system_sandboxes.lock() {
            m.insert(execution, id);
        }
    }

    pub fn forget_system_sandbox(&self, execution: Uuid) {
        if let Ok(mut m) = self.system_sandboxes.lock() {
            m.remove(&execution);
        }
    }

    /// Wakes this replica's idle workers (a child was started here).
    pub fn wake(&self) {
        self.workflows.wake.notify_waiters();
    }
}
