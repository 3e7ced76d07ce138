//! Sandboxes as the orchestrator sees them: a dispatcher sandbox plus the agent policy it runs under.
//!
//! The dispatcher knows containers; this module knows which agent a sandbox was made for and
//! therefore which paths, commands and tools its calls may use. The policy is derived from the
//! agent's manifest version, whose id is recorded in the sandbox's labels, so it can be rebuilt
//! after a restart; a small in-memory cache keeps the hot path free of database reads.

use std::collections::HashMap;
use std::sync::Arc;

use dispatcher::{Dispatcher, Limits, NetworkMode, Owner, SandboxId, SandboxSpec, WORKSPACE};
use serde_json::Value;
use sqlx::PgPool;
use tokio::sync::RwLock;
use uuid::Uuid;

use crate::manifest::{AgentView, ManifestKind, RuntimeRef};
use crate::policy::command::CommandPolicy;
use crate::registry::{self, RegistryError};

/// Label naming the agent version a sandbox was made for.
pub const AGENT_VERSION_LABEL: &str = "agent_version_id";
/// Label naming the agent.
pub const AGENT_LABEL: &str = "agent";
/// Label naming the SEAL session a sandbox belongs to.
pub const SESSION_LABEL: &str = "seal_session";
/// Label naming the session's security context.
pub const CONTEXT_LABEL: &str = "seal_context";

/// The sandbox policy of a SEAL session: the security context decides tools, paths and commands
/// (it is evaluated on every call); the sandbox adds the no-shell argv rules and /workspace.
pub fn policy_of_context(
    context: &crate::seal::context::SecurityContext,
    ceilings: &ToolCeilings,
) -> SandboxPolicy {
    let mut allowlist = Vec::new();
    let mut any_program = false;
    for cap in &context.capabilities {
        let pattern = cap.tool_pattern.as_str();
        if !(pattern == "*" || pattern == "cmd.run" || pattern == "cmd.*") {
            continue;
        }
        match (&cap.command_allowlist, &cap.subcommand_allowlist) {
            (None, None) => any_program = true,
            (commands, subcommands) => {
                allowlist.extend(commands.iter().flatten().cloned());
                allowlist.extend(subcommands.iter().flatten().cloned());
            }
        }
    }
    SandboxPolicy {
        agent: format!("seal-context:{}", context.name),
        tools: crate::tools::catalog()
            .map(|c| {
                c.iter()
                    .map(|t| t.name.clone())
                    .filter(|n| crate::policy::needs_sandbox(n))
                    .collect()
            })
            .unwrap_or_default(),
        read_roots: vec![WORKSPACE.to_owned()],
        write_roots: vec![WORKSPACE.to_owned()],
        command: CommandPolicy {
            subcommand_allowlist: allowlist,
            allow_metacharacters: false,
            env_allowlist: Vec::new(),
            any_program,
        },
        cmd_timeout_secs: ceilings.cmd_timeout_secs,
        max_output_bytes: ceilings.max_output_bytes,
    }
}

/// Server-side ceilings of sandbox tools; a caller may lower them, never raise them.
#[derive(Debug, Clone)]
pub struct ToolCeilings {
    /// Longest `cmd.run`, seconds.
    pub cmd_timeout_secs: u64,
    /// Largest captured output per stream, bytes.
    pub max_output_bytes: u64,
}

/// What the kernel offers the command policy on this node (reported by `/health/ready`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct KernelPolicy {
    /// The kernel's Landlock ABI (0: none).
    pub landlock_abi: u32,
    /// `sandbox.require_landlock`: sandboxes are refused without Landlock.
    pub required: bool,
}

/// What calls in one sandbox may do.
#[derive(Debug, Clone)]
pub struct SandboxPolicy {
    /// The agent's name.
    pub agent: String,
    /// Tools the manifest lists in `spec.tools`.
    pub tools: Vec<String>,
    /// Paths reading tools may touch.
    pub read_roots: Vec<String>,
    /// Paths changing tools may touch.
    pub write_roots: Vec<String>,
    /// `cmd.run` rules.
    pub command: CommandPolicy,
    /// `cmd.run` deadline ceiling (manifest AND server).
    pub cmd_timeout_secs: u64,
    /// Output cap ceiling (manifest AND server).
    pub max_output_bytes: u64,
}

/// Why a sandbox could not be made or found.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The agent (or version) does not exist.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The agent's runtime is not in the registry (deployed before the registry changed).
    #[error(
        "agent `{agent}` names runtime {language} {version}, which this node does not provide"
    )]
    UnknownRuntime {
        /// Agent.
        agent: String,
        /// Language.
        language: String,
        /// Version.
        version: String,
    },
    /// The sandbox has no agent label (made by something else) or its manifest is gone.
    #[error("sandbox {0} has no agent policy")]
    NoPolicy(SandboxId),
    /// The dispatcher refused or failed.
    #[error(transparent)]
    Dispatch(#[from] dispatcher::DispatchError),
    /// Sandboxes are unavailable on this node (the dispatcher did not start).
    #[error("sandboxes are unavailable on this node: {0}")]
    Unavailable(String),
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// The orchestrator's sandbox service.
pub struct Sandboxes {
    dispatcher: Result<Dispatcher, String>,
    ceilings: ToolCeilings,
    kernel: KernelPolicy,
    policies: RwLock<HashMap<SandboxId, Arc<SandboxPolicy>>>,
}

/// Normalises manifest paths: relative ones are under /workspace.
fn absolute(paths: Vec<String>) -> Vec<String> {
    paths
        .into_iter()
        .map(|p| {
            if p.starts_with('/') {
                p
            } else {
                format!("{WORKSPACE}/{}", p.trim_start_matches("./"))
            }
        })
        .collect()
}

/// The policy of an agent manifest under the server's ceilings.
pub fn policy_of(agent: &str, manifest: &Value, ceilings: &ToolCeilings) -> SandboxPolicy {
    let view = AgentView(manifest);
    let mut read_roots = absolute(view.read_paths());
    let mut write_roots = absolute(view.write_paths());
    if read_roots.is_empty() && write_roots.is_empty() {
        read_roots = vec![WORKSPACE.to_owned()];
        write_roots = vec![WORKSPACE.to_owned()];
    }
    // Whatever may be written may be read back.
    for w in &write_roots {
        if !read_roots.contains(w) {
            read_roots.push(w.clone());
        }
    }
    let cmd = view.cmd_run();
    let command = CommandPolicy {
        subcommand_allowlist: view.subcommand_allowlist().unwrap_or_default(),
        allow_metacharacters: view.allow_metacharacters(),
        env_allowlist: view.env_allowlist(),
        any_program: false,
    };
    let cmd_timeout_secs = cmd
        .as_ref()
        .and_then(|c| c.timeout_seconds)
        .unwrap_or(ceilings.cmd_timeout_secs)
        .min(ceilings.cmd_timeout_secs);
    let max_output_bytes = cmd
        .as_ref()
        .and_then(|c| c.max_output_bytes)
        .unwrap_or(ceilings.max_output_bytes)
        .min(ceilings.max_output_bytes);
    SandboxPolicy {
        agent: agent.to_owned(),
        tools: view.tools(),
        read_roots,
        write_roots,
        command,
        cmd_timeout_secs,
        max_output_bytes,
    }
}

impl Sandboxes {
    /// Wraps a started dispatcher (or the reason it could not start).
    pub fn new(
        dispatcher: Result<Dispatcher, String>,
        ceilings: ToolCeilings,
        kernel: KernelPolicy,
    ) -> Self {
        Self {
            dispatcher,
            ceilings,
            kernel,
            policies: RwLock::new(HashMap::new()),
        }
    }

    /// The dispatcher, or why there is none.
    pub fn dispatcher(&self) -> Result<&Dispatcher, SandboxError> {
        self.dispatcher
            .as_ref()
            .map_err(|e| SandboxError::Unavailable(e.clone()))
    }

    /// What the kernel offers the command policy.
    pub fn kernel_policy(&self) -> KernelPolicy {
        self.kernel
    }

    /// Why sandboxes are unavailable, if they are.
    pub fn unavailable_reason(&self) -> Option<&str> {
        self.dispatcher.as_ref().err().map(String::as_str)
    }

    /// Creates a sandbox for an agent (latest version unless given), owned by `owner`.
    pub async fn create_for_agent(
        &self,
        pool: &PgPool,
        tenant: &str,
        agent: &str,
        version: Option<&str>,
        owner: Owner,
    ) -> Result<(SandboxId, Arc<SandboxPolicy>), SandboxError> {
        let dispatcher = self.dispatcher()?;
        let def = registry::get(pool, tenant, ManifestKind::Agent, agent, version).await?;
        let view = AgentView(&def.manifest);
        let image = match view.runtime() {
            RuntimeRef::Image(image) => image,
            RuntimeRef::Language { language, version } => {
                match crate::runtimes::lookup(&language, &version) {
                    Some(r) => r.image.clone(),
                    None => {
                        return Err(SandboxError::UnknownRuntime {
                            agent: def.name.clone(),
                            language,
                            version,
                        })
                    }
                }
            }
        };
        let policy = Arc::new(policy_of(&def.name, &def.manifest, &self.ceilings));
        let resources = view.resources();
        let defaults = Limits::default();
        let mut spec = SandboxSpec::new(image, owner);
        spec.limits = Limits {
            memory_bytes: nonzero(resources.memory_bytes(), defaults.memory_bytes),
            nano_cpus: nonzero(
                resources.cpu_millis().saturating_mul(1_000_000),
                defaults.nano_cpus,
            ),
            pids: defaults.pids,
            tmpfs_bytes: defaults.tmpfs_bytes,
            workspace_bytes: nonzero(resources.disk_bytes(), defaults.workspace_bytes),
        };
        spec.network = if view.network_egress() {
            NetworkMode::Bridge
        } else {
            NetworkMode::None
        };
        spec.read_roots = policy.read_roots.clone();
        spec.write_roots = policy.write_roots.clone();
        spec.labels.insert(AGENT_LABEL.to_owned(), def.name.clone());
        spec.labels
            .insert(AGENT_VERSION_LABEL.to_owned(), def.version_id.to_string());
        let id = dispatcher.acquire(spec).await?;
        self.policies.write().await.insert(id, policy.clone());
        Ok((id, policy))
    }

    /// Creates the sandbox of a SEAL session (runtime from its context, else the default runtime).
    pub async fn create_for_session(
        &self,
        session: Uuid,
        context: &crate::seal::context::SecurityContext,
    ) -> Result<SandboxId, SandboxError> {
        let dispatcher = self.dispatcher()?;
        let registry =
            crate::runtimes::registry().map_err(|e| SandboxError::Unavailable(e.to_owned()))?;
        let (language, version) = match &context.runtime {
            Some(r) => (r.language.clone(), r.version.clone()),
            None => (
                registry.default.language.clone(),
                registry.default.version.clone(),
            ),
        };
        let image = crate::runtimes::lookup(&language, &version)
            .ok_or_else(|| SandboxError::UnknownRuntime {
                agent: format!("seal-context:{}", context.name),
                language: language.clone(),
                version: version.clone(),
            })?
            .image
            .clone();
        let policy = Arc::new(policy_of_context(context, &self.ceilings));
        let mut spec = SandboxSpec::new(
            image,
            Owner::new(dispatcher::OwnerKind::Session, session.to_string()),
        );
        spec.labels
            .insert(SESSION_LABEL.to_owned(), session.to_string());
        spec.labels
            .insert(CONTEXT_LABEL.to_owned(), context.name.clone());
        let id = dispatcher.acquire(spec).await?;
        self.policies.write().await.insert(id, policy);
        Ok(id)
    }

    /// The policy of a sandbox: from the cache, else rebuilt from its recorded agent version.
    pub async fn policy(
        &self,
        pool: &PgPool,
        id: SandboxId,
    ) -> Result<Arc<SandboxPolicy>, SandboxError> {
        if let Some(p) = self.policies.read().await.get(&id) {
            return Ok(p.clone());
        }
        let info = self.dispatcher()?.get(id).await?;
        if let Some(name) = info.spec.as_ref().and_then(|s| s.labels.get(CONTEXT_LABEL)) {
            let context = crate::gateway::contexts::get(pool, crate::DEFAULT_TENANT, name)
                .await
                .map_err(|_| SandboxError::NoPolicy(id))?;
            let policy = Arc::new(policy_of_context(&context, &self.ceilings));
            self.policies.write().await.insert(id, policy.clone());
            return Ok(policy);
        }
        let version_id = info
            .spec
            .as_ref()
            .and_then(|s| s.labels.get(AGENT_VERSION_LABEL))
            .and_then(|v| Uuid::parse_str(v).ok())
            .ok_or(SandboxError::NoPolicy(id))?;
        let row: Option<(String, Value)> = sqlx::query_as(
            "SELECT d.name, v.manifest FROM definition_versions v JOIN definitions d ON d.id = v.definition_id WHERE v.id = $1",
        )
        .bind(version_id)
        .fetch_optional(pool)
        .await?;
        let (name, manifest) = row.ok_or(SandboxError::NoPolicy(id))?;
        let policy = Arc::new(policy_of(&name, &manifest, &self.ceilings));
        self.policies.write().await.insert(id, policy.clone());
        Ok(policy)
    }

    /// Destroys a sandbox and forgets its policy.
    pub async fn destroy(&self, id: SandboxId) -> Result<(), SandboxError> {
        self.dispatcher()?.destroy(id).await?;
        self.policies.write().await.remove(&id);
        Ok(())
    }

    /// The server ceilings.
    pub fn ceilings(&self) -> &ToolCeilings {
        &self.ceilings
    }
}

fn nonzero(v: u64, default: u64) -> u64 {
    if v == 0 {
        default
    } else {
        v
    }
}
