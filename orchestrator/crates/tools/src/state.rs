//! The composition root of the API layer: what one running instance holds, built once by
//! `app::Application::build` and cloned into every adapter (REST, gRPC, MCP). Core services take
//! the narrow handles they use (a pool, a config section, a trait), not this.

use chrono::{DateTime, Utc};
use dispatcher::DockerEngine;
use sqlx::PgPool;
use uuid::Uuid;

use aegis_config::NodeConfig;

/// Cheap to clone; one per running instance.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    /// The Docker engine this instance drives (not to be confused with `executions`, the engine
    /// of agent executions).
    pub docker: DockerEngine,
    /// The configuration after the file, the environment and validation.
    pub config: std::sync::Arc<NodeConfig>,
    /// Unique id of this running instance; owner label of everything it creates.
    pub instance_id: Uuid,
    /// When this instance started (uptime in readiness and metrics).
    pub started_at: DateTime<Utc>,
    /// The engine of agent executions (the agent loop, its recovery and cancellation).
    pub executions: std::sync::Arc<aegis_engines::engine::Engine>,
    /// The SEAL gateway (token issuer, rate limiter).
    pub gateway: std::sync::Arc<aegis_gateway::Gateway>,
    /// Sandboxes and their agent policies.
    pub sandboxes: std::sync::Arc<aegis_sandboxes::Sandboxes>,
    /// The egress rules of `web.*` (resolver, address policy, limits).
    pub egress: std::sync::Arc<aegis_egress::Egress>,
    /// The config file this instance was started with, if any (`aegis.system.config` names it,
    /// so operators see which file is in force).
    pub config_path: Option<std::sync::Arc<std::path::PathBuf>>,
    /// Workflow executions.
    pub workflows: std::sync::Arc<aegis_engines::workflow::Workflows>,
    /// Verified API keys, used while this node hears of every key change.
    pub api_keys: std::sync::Arc<aegis_store::auth::key_cache::KeyCache>,
    /// The external MCP servers of `mcp_servers` (sessions, tool listings).
    pub mcp_servers: std::sync::Arc<aegis_egress::mcp_servers::McpServers>,
}

impl AppState {
    /// What the agent engine uses of this node, with this state as its router.
    pub fn engine_services(&self) -> aegis_engines::engine::Services {
        aegis_engines::engine::Services {
            pool: self.pool.clone(),
            instance_id: self.instance_id,
            config: self.config.clone(),
            sandboxes: self.sandboxes.clone(),
            mcp_servers: self.mcp_servers.clone(),
            executions: self.executions.clone(),
            tools: std::sync::Arc::new(self.clone()),
        }
    }

    /// What the SEAL gateway uses of this node, with this state as its router.
    pub fn gateway_services(&self) -> aegis_gateway::Services {
        aegis_gateway::Services {
            pool: self.pool.clone(),
            sandboxes: self.sandboxes.clone(),
            tools: std::sync::Arc::new(self.clone()),
        }
    }
}

/// The workflow engine reaches the agent engine through this narrow handle only.
impl aegis_engines::workflow::AgentHost for AppState {
    fn start_agent(
        &self,
        caller: aegis_core::caller::Caller,
        request: aegis_engines::engine::ExecuteRequest,
    ) -> futures_util::future::BoxFuture<'_, Result<Uuid, aegis_engines::engine::ExecError>> {
        Box::pin(async move {
            self.executions
                .start(&self.engine_services(), &caller, request)
                .await
        })
    }

    fn cancel_agent(&self, tenant: String, id: Uuid) -> futures_util::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Err(e) = self
                .executions
                .cancel(&self.engine_services(), &tenant, id)
                .await
            {
                tracing::warn!(execution = %id, error = %e, "could not cancel an agent execution");
            }
        })
    }
}
