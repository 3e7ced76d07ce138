//! Sandboxes as the orchestrator sees them: a dispatcher sandbox plus the agent policy it runs under.
//!
//! The dispatcher knows containers; this module knows which agent a sandbox was made for and
//! therefore which paths, commands and tools its calls may use. The policy is derived from the
//! agent's manifest version, whose id is recorded in the sandbox's labels, so it can be rebuilt
//! after a restart; a small in-memory cache keeps the hot path free of database reads. A
//! sandbox whose manifest grants network gets an egress network and proxy of its own
//! ([`egress`]).

/// The way out of an E2B sandbox: the operator's grant and the sandbox's own rules.
pub mod e2b_egress;
pub mod egress;
pub mod health;
pub mod live;
pub mod policies;
pub mod volumes;
pub mod workspaces;

use std::collections::HashMap;
use std::sync::Arc;

use dispatcher::{Dispatcher, Limits, NetworkMode, Owner, SandboxId, SandboxSpec};
use serde_json::Value;
use sqlx::PgPool;
use tokio::sync::RwLock;
use uuid::Uuid;

use aegis_manifest::{AgentView, ManifestKind, RuntimeRef};
pub use aegis_policy::sandboxes::SandboxOwner;
pub use aegis_policy::SandboxPolicy;
use aegis_store::registry::{self, RegistryError};
/// The isolation classes (`container`, `gvisor`), as the node config names them.
pub use dispatcher::Isolation;
pub use policies::{
    context_roots, e2b_spec, find_runtime, policy_of, policy_of_context, policy_of_e2b,
    policy_of_runtime, ContextRoots,
};

/// Label naming the agent version a sandbox was made for.
pub const AGENT_VERSION_LABEL: &str = "agent_version_id";
/// Label naming the agent.
pub const AGENT_LABEL: &str = "agent";
/// Label naming the SEAL session a sandbox belongs to.
pub const SESSION_LABEL: &str = "seal_session";
/// Label naming the session's security context.
pub const CONTEXT_LABEL: &str = "seal_context";
/// Label naming the runtime (`language:version`) of a sandbox an operator made from a runtime.
pub const RUNTIME_LABEL: &str = "operator_runtime";
/// Label holding the JSON command allowlist of such a sandbox (`[]`: any program).
pub const ALLOW_LABEL: &str = "operator_allow";
/// Label naming the runtime (`language:version`) of a sandbox made through the E2B door.
pub const E2B_RUNTIME_LABEL: &str = "e2b_runtime";
/// Label naming the security context an E2B sandbox's key is bound to (absent: unbound).
pub const E2B_CONTEXT_LABEL: &str = "e2b_context";
/// Label naming the API key of the MCP conversation a session sandbox was made for: its owner
/// (`aegis_policy::sandboxes::owns`), since the session row the MCP door opens holds no key.
pub const MCP_KEY_LABEL: &str = "mcp_key";
/// Where an E2B sandbox's workspace is: the home E2B's SDK and its users expect.
pub const E2B_HOME: &str = "/home/user";

/// Server-side ceilings of sandbox tools; a caller may lower them, never raise them.
#[derive(Debug, Clone)]
pub struct ToolCeilings {
    /// Longest `cmd.run`, seconds.
    pub cmd_timeout_secs: u64,
    /// Largest captured output per stream, bytes.
    pub max_output_bytes: u64,
}

/// What the kernel offers the command policy on this node (reported by `/health/ready`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct KernelPolicy {
    /// The kernel's Landlock ABI (0: none).
    pub landlock_abi: u32,
    /// `sandbox.require_landlock`: sandboxes are refused without Landlock.
    pub required: bool,
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
        agent: String,
        language: String,
        version: String,
    },
    /// No runtime of the registry matches what an operator asked for.
    #[error(
        "no runtime `{asked}` on this node (known: {known}); give LANGUAGE or LANGUAGE:VERSION"
    )]
    NoSuchRuntime {
        /// What was asked for.
        asked: String,
        /// `language:version` of every runtime.
        known: String,
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
    /// A live-sandbox quota is reached; nothing was created.
    #[error(
        "sandbox quota reached: {scope} already has {live} live sandbox(es) (limit {limit}); \
         destroy one (DELETE /v1/sandboxes/<id>) or end a session, then try again"
    )]
    QuotaExceeded {
        /// Which quota: `this node`, `security context `x``, `API key `y``.
        scope: String,
        /// Live sandboxes counted (including creations in flight on this instance).
        live: u64,
        /// The configured limit.
        limit: u64,
    },
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Limits on live sandboxes (`sandbox.max_live_sandboxes`, `max_sandboxes_per_context`,
/// `max_sandboxes_per_api_key`), so no caller can exhaust the Docker host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    /// Live sandboxes on the node, every owner (warm-pool spares not counted).
    pub node: u64,
    /// Live sandboxes of SEAL sessions in one security context.
    pub per_context: u64,
    /// Live sandboxes an operator API key created.
    pub per_api_key: u64,
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            node: u64::MAX,
            per_context: u64::MAX,
            per_api_key: u64::MAX,
        }
    }
}

/// Whose quotas a creation counts against (besides the node's).
#[derive(Debug, Clone, PartialEq, Eq)]
enum QuotaScope {
    /// An agent execution: the node quota only.
    Node,
    /// A SEAL session of this context.
    Context(String),
    /// An operator API key (its id).
    ApiKey(String),
}

/// Creations checked against the quotas but not yet recorded by the dispatcher: counted as live
/// so that concurrent requests on this instance cannot overshoot a quota together.
#[derive(Default)]
struct InFlight {
    next: u64,
    entries: Vec<(u64, QuotaScope)>,
}

/// Removes its creation from [`InFlight`] when the creation is over (recorded or failed).
struct Reservation<'a> {
    id: u64,
    in_flight: &'a std::sync::Mutex<InFlight>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Ok(mut f) = self.in_flight.lock() {
            f.entries.retain(|(id, _)| *id != self.id);
        }
    }
}

/// The orchestrator's sandbox service.
pub struct Sandboxes {
    dispatcher: Result<Dispatcher, String>,
    /// The egress proxies of networked sandboxes (also the dispatcher's egress host).
    proxies: Option<Arc<egress::ProxyHost>>,
    ceilings: ToolCeilings,
    kernel: KernelPolicy,
    policies: RwLock<HashMap<SandboxId, Arc<SandboxPolicy>>>,
    /// Who made each sandbox this instance was asked about (fixed once it is handed out).
    owners: RwLock<HashMap<SandboxId, Arc<SandboxOwner>>>,
    quotas: Quotas,
    /// Serialises quota checks on this instance (one short query each).
    quota_check: tokio::sync::Mutex<()>,
    in_flight: std::sync::Mutex<InFlight>,
    /// Readers of the background processes started through this instance.
    live: live::LiveProcesses,
}

/// The owner the dispatcher recorded for a sandbox, in the policy's words.
pub fn owner_of(info: &dispatcher::SandboxInfo) -> SandboxOwner {
    SandboxOwner {
        kind: info.owner.kind.as_str().to_owned(),
        id: info.owner.id.clone(),
        key: info
            .spec
            .as_ref()
            .and_then(|s| s.labels.get(MCP_KEY_LABEL))
            .cloned(),
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
            proxies: None,
            ceilings,
            kernel,
            policies: RwLock::new(HashMap::new()),
            owners: RwLock::new(HashMap::new()),
            quotas: Quotas::default(),
            quota_check: tokio::sync::Mutex::new(()),
            in_flight: std::sync::Mutex::new(InFlight::default()),
            live: live::LiveProcesses::default(),
        }
    }

    /// Readers of the background processes started through this instance.
    pub fn live(&self) -> &live::LiveProcesses {
        &self.live
    }

    /// The same service with the egress proxies the dispatcher was started with.
    pub fn with_proxies(mut self, proxies: Arc<egress::ProxyHost>) -> Self {
        self.proxies = Some(proxies);
        self
    }

    /// The environment that sends a sandbox's commands through its egress proxy (empty when
    /// the sandbox has no network, or its proxy runs on another instance).
    pub fn proxy_env(&self, id: SandboxId) -> std::collections::BTreeMap<String, String> {
        self.proxies
            .as_ref()
            .and_then(|p| p.addr(id))
            .map(egress::proxy_env)
            .unwrap_or_default()
    }

    /// The same service under live-sandbox quotas.
    pub fn with_quotas(mut self, quotas: Quotas) -> Self {
        self.quotas = quotas;
        self
    }

    /// Refuses a creation that would exceed a quota; otherwise reserves its place until the
    /// returned guard is dropped (by then the dispatcher has recorded the sandbox, or failed).
    /// Live sandboxes are counted in PostgreSQL, so every replica's are included.
    async fn reserve(
        &self,
        pool: &PgPool,
        scope: QuotaScope,
    ) -> Result<Reservation<'_>, SandboxError> {
        let _serial = self.quota_check.lock().await;
        let (context, key) = match &scope {
            QuotaScope::Node => (None, None),
            QuotaScope::Context(c) => (Some(c.as_str()), None),
            QuotaScope::ApiKey(k) => (None, Some(k.as_str())),
        };
        let (node, by_context, by_key): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE owner_kind <> 'pool'), \
             count(*) FILTER (WHERE owner_kind = 'session' AND owner_id IN \
                 (SELECT id::text FROM seal_sessions WHERE context_name = $1)), \
             count(*) FILTER (WHERE owner_kind = 'operator' AND owner_id = $2) \
             FROM sandboxes WHERE state IN ('creating', 'running')",
        )
        .bind(context)
        .bind(key)
        .fetch_one(pool)
        .await?;
        let mut in_flight = self
            .in_flight
            .lock()
            .map_err(|_| SandboxError::Unavailable("quota bookkeeping poisoned".into()))?;
        let pending = |want: &QuotaScope| {
            in_flight
                .entries
                .iter()
                .filter(|(_, s)| matches!(want, QuotaScope::Node) || s == want)
                .count() as u64
        };
        let mut checks = vec![(
            node as u64 + pending(&QuotaScope::Node),
            self.quotas.node,
            "this node".to_owned(),
        )];
        match &scope {
            QuotaScope::Node => {}
            QuotaScope::Context(c) => checks.push((
                by_context as u64 + pending(&scope),
                self.quotas.per_context,
                format!("security context `{c}`"),
            )),
            QuotaScope::ApiKey(k) => checks.push((
                by_key as u64 + pending(&scope),
                self.quotas.per_api_key,
                format!("API key {k}"),
            )),
        }
        for (live, limit, scope) in checks {
            if live >= limit {
                return Err(SandboxError::QuotaExceeded { scope, live, limit });
            }
        }
        in_flight.next += 1;
        let id = in_flight.next;
        in_flight.entries.push((id, scope));
        Ok(Reservation {
            id,
            in_flight: &self.in_flight,
        })
    }

    /// Makes the sandbox of `spec` within the quota of `scope` and remembers its policy and its
    /// owner (the one its row was written with, created or handed out of a pool under it), so
    /// its first call does not read the row again to learn them.
    async fn acquire(
        &self,
        pool: &PgPool,
        scope: QuotaScope,
        spec: SandboxSpec,
        policy: Arc<SandboxPolicy>,
    ) -> Result<(SandboxId, Arc<SandboxPolicy>), SandboxError> {
        let dispatcher = self.dispatcher()?;
        let owner = Arc::new(SandboxOwner {
            kind: spec.owner.kind.as_str().to_owned(),
            id: spec.owner.id.clone(),
            key: spec.labels.get(MCP_KEY_LABEL).cloned(),
        });
        let reservation = self.reserve(pool, scope).await?;
        let id = dispatcher.acquire(spec).await;
        drop(reservation);
        let id = id?;
        self.policies.write().await.insert(id, policy.clone());
        self.owners.write().await.insert(id, owner);
        Ok((id, policy))
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
        self.dispatcher()?;
        let def = registry::get(pool, tenant, ManifestKind::Agent, agent, version).await?;
        self.create_for_definition(pool, &def, owner).await
    }

    /// Creates a sandbox for this exact agent version row (an execution's: a revision deployed
    /// since it started must not change the policy it runs under), owned by `owner`.
    pub async fn create_for_definition(
        &self,
        pool: &PgPool,
        def: &registry::Definition,
        owner: Owner,
    ) -> Result<(SandboxId, Arc<SandboxPolicy>), SandboxError> {
        self.dispatcher()?;
        let scope = match owner.kind {
            dispatcher::OwnerKind::Operator => QuotaScope::ApiKey(owner.id.clone()),
            _ => QuotaScope::Node,
        };
        let view = AgentView(&def.manifest);
        let image = match view.runtime() {
            RuntimeRef::Image(image) => image,
            RuntimeRef::Language { language, version } => {
                match aegis_core::runtimes::lookup(&language, &version) {
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
        // Network means an internal network of its own whose only way out is our proxy.
        spec.network = if view.network_egress() {
            NetworkMode::Egress
        } else {
            NetworkMode::None
        };
        spec.read_roots = policy.read_roots.clone();
        spec.write_roots = policy.write_roots.clone();
        // Asked by the manifest; granted by the dispatcher only in the gVisor class.
        spec.allow_root = view.allow_root();
        spec.labels.insert(AGENT_LABEL.to_owned(), def.name.clone());
        spec.labels
            .insert(AGENT_VERSION_LABEL.to_owned(), def.version_id.to_string());
        self.acquire(pool, scope, spec, policy).await
    }

    /// Creates a sandbox from a runtime for an operator key (see [`policy_of_runtime`]).
    pub async fn create_for_runtime(
        &self,
        pool: &PgPool,
        runtime: &str,
        allow: &[String],
        owner: Owner,
    ) -> Result<(SandboxId, Arc<SandboxPolicy>), SandboxError> {
        self.dispatcher()?;
        let runtime = find_runtime(runtime)?;
        let policy = Arc::new(policy_of_runtime(runtime, allow, &self.ceilings));
        let scope = QuotaScope::ApiKey(owner.id.clone());
        let mut spec = SandboxSpec::new(runtime.image.clone(), owner);
        spec.read_roots = policy.read_roots.clone();
        spec.write_roots = policy.write_roots.clone();
        spec.labels.insert(
            RUNTIME_LABEL.to_owned(),
            format!("{}:{}", runtime.language, runtime.version),
        );
        spec.labels.insert(
            ALLOW_LABEL.to_owned(),
            serde_json::to_string(allow).unwrap_or_else(|_| "[]".to_owned()),
        );
        self.acquire(pool, scope, spec, policy).await
    }

    /// Creates a sandbox of an E2B template (a runtime) for an API key, with its workspace at
    /// [`E2B_HOME`], under [`policy_of_e2b`]; counted against the key's quota. With
    /// `network`, it sits on an egress network of its own behind a proxy applying its row's
    /// rules ([`e2b_egress`]); such a spec never matches a warm pool's (which have none).
    pub async fn create_for_e2b(
        &self,
        pool: &PgPool,
        runtime: &aegis_core::runtimes::Runtime,
        context: Option<&aegis_seal::context::SecurityContext>,
        owner: Owner,
        network: bool,
    ) -> Result<(SandboxId, Arc<SandboxPolicy>), SandboxError> {
        self.dispatcher()?;
        let scope = QuotaScope::ApiKey(owner.id.clone());
        let (mut spec, policy) = e2b_spec(runtime, context, owner, &self.ceilings);
        if network {
            spec.network = NetworkMode::Egress;
        }
        self.acquire(pool, scope, spec, Arc::new(policy)).await
    }

    /// Forks the E2B sandbox `id` of API key `key` with its processes and memory (gVisor class,
    /// `Dispatcher::fork`) into `count` sandboxes, each counted against the key's quota as a
    /// create is; their policy and owner are the source's (its labels and owner are copied).
    /// `max_bytes` bounds the checkpoint copies on disk at once.
    pub async fn fork_with_memory(
        &self,
        pool: &PgPool,
        key: &str,
        id: SandboxId,
        count: usize,
        max_bytes: u64,
    ) -> Result<dispatcher::Forked, SandboxError> {
        let dispatcher = self.dispatcher()?;
        let mut reservations = Vec::with_capacity(count);
        for _ in 0..count {
            reservations.push(
                self.reserve(pool, QuotaScope::ApiKey(key.to_owned()))
                    .await?,
            );
        }
        let forked = dispatcher.fork(id, count, max_bytes).await;
        drop(reservations);
        Ok(forked?)
    }

    /// Creates the sandbox of a SEAL session (runtime from its context, else the default runtime);
    /// `mcp_key` is the API key of the MCP conversation the session row was opened for, which
    /// then owns the sandbox (`aegis_policy::sandboxes`).
    pub async fn create_for_session(
        &self,
        pool: &PgPool,
        session: Uuid,
        context: &aegis_seal::context::SecurityContext,
        mcp_key: Option<Uuid>,
    ) -> Result<SandboxId, SandboxError> {
        let dispatcher = self.dispatcher()?;
        let registry = aegis_core::runtimes::registry()
            .map_err(|e| SandboxError::Unavailable(e.to_owned()))?;
        let (language, version) = match &context.runtime {
            Some(r) => (r.language.clone(), r.version.clone()),
            None => (
                registry.default.language.clone(),
                registry.default.version.clone(),
            ),
        };
        let image = aegis_core::runtimes::lookup(&language, &version)
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
        let roots = context_roots(context);
        spec.read_roots = roots.read;
        spec.write_roots = roots.write;
        spec.follow_symlinks = roots.follow_symlinks;
        spec.labels
            .insert(SESSION_LABEL.to_owned(), session.to_string());
        spec.labels
            .insert(CONTEXT_LABEL.to_owned(), context.name.clone());
        if let Some(key) = mcp_key {
            spec.labels
                .insert(MCP_KEY_LABEL.to_owned(), key.to_string());
        }
        let reservation = self
            .reserve(pool, QuotaScope::Context(context.name.clone()))
            .await?;
        let id = dispatcher.acquire(spec).await;
        drop(reservation);
        let id = id?;
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
        if let Some(labels) = info.spec.as_ref().map(|s| &s.labels) {
            if let Some(runtime) = labels.get(E2B_RUNTIME_LABEL) {
                let runtime = find_runtime(runtime).map_err(|_| SandboxError::NoPolicy(id))?;
                let context = match labels.get(E2B_CONTEXT_LABEL) {
                    Some(name) => Some(
                        aegis_store::contexts::get(pool, aegis_core::DEFAULT_TENANT, name)
                            .await
                            .map_err(|_| SandboxError::NoPolicy(id))?,
                    ),
                    None => None,
                };
                let policy = Arc::new(policy_of_e2b(runtime, context.as_ref(), &self.ceilings));
                self.policies.write().await.insert(id, policy.clone());
                return Ok(policy);
            }
        }
        if let Some(name) = info.spec.as_ref().and_then(|s| s.labels.get(CONTEXT_LABEL)) {
            let context = aegis_store::contexts::get(pool, aegis_core::DEFAULT_TENANT, name)
                .await
                .map_err(|_| SandboxError::NoPolicy(id))?;
            let policy = Arc::new(policy_of_context(&context, &self.ceilings));
            self.policies.write().await.insert(id, policy.clone());
            return Ok(policy);
        }
        if let Some(labels) = info.spec.as_ref().map(|s| &s.labels) {
            if let Some(runtime) = labels.get(RUNTIME_LABEL) {
                let runtime = find_runtime(runtime).map_err(|_| SandboxError::NoPolicy(id))?;
                let allow: Vec<String> = labels
                    .get(ALLOW_LABEL)
                    .map(|a| serde_json::from_str(a))
                    .transpose()
                    .map_err(|_| SandboxError::NoPolicy(id))?
                    .unwrap_or_default();
                let policy = Arc::new(policy_of_runtime(runtime, &allow, &self.ceilings));
                self.policies.write().await.insert(id, policy.clone());
                return Ok(policy);
            }
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

    /// Who made the sandbox `id`, as the dispatcher recorded it (cached: an owner never changes
    /// once the sandbox is handed out). The one input of every ownership decision
    /// (`aegis_policy::sandboxes::check_sandbox_access`): never taken from a caller.
    pub async fn owner(&self, id: SandboxId) -> Result<Arc<SandboxOwner>, SandboxError> {
        if let Some(owner) = self.owners.read().await.get(&id) {
            return Ok(owner.clone());
        }
        let info = self.dispatcher()?.get(id).await?;
        let owner = Arc::new(owner_of(&info));
        // A pool sandbox is not handed out yet: its owner will change, so it is not kept.
        if info.owner.kind != dispatcher::OwnerKind::Pool {
            self.owners.write().await.insert(id, owner.clone());
        }
        Ok(owner)
    }

    /// Destroys a sandbox off the caller's path (`Dispatcher::retire`): it is unreachable when
    /// this returns, its objects go in the background; forgets its policy like `destroy`.
    pub async fn retire(&self, id: SandboxId) -> Result<(), SandboxError> {
        self.dispatcher()?.retire(id).await?;
        self.policies.write().await.remove(&id);
        self.owners.write().await.remove(&id);
        self.live.forget_sandbox(id);
        Ok(())
    }

    /// Destroys a sandbox and forgets its policy.
    pub async fn destroy(&self, id: SandboxId) -> Result<(), SandboxError> {
        self.dispatcher()?.destroy(id).await?;
        self.policies.write().await.remove(&id);
        self.owners.write().await.remove(&id);
        self.live.forget_sandbox(id);
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
