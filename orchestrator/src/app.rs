//! Start-up and shutdown of one orchestrator instance.
//!
//! `Application::build` does everything that can fail before we accept traffic (database with
//! retries, migrations, engine handle, binding both listeners); `run` serves until the shutdown
//! token fires, then lets in-flight requests finish within the configured grace period. Tests use
//! the same two calls with port 0, so they exercise exactly what production runs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use dispatcher::{DockerEngine, EngineError};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::api;
use crate::auth::{self, AuthError, Bootstrap};
use crate::config::NodeConfig;
use crate::database::{self, StoreError};
use crate::state::AppState;

/// Why the instance could not start or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The database could not be reached or migrated.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The container engine address is unusable.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        /// Which surface.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The admin key could not be set up.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The embedded tool catalog is broken, or a tool has no handler (a packaging bug).
    #[error(transparent)]
    Catalog(#[from] crate::catalog::CatalogError),
    /// The `egress:` configuration is unusable.
    #[error(transparent)]
    Egress(#[from] crate::egress::EgressConfigError),
    /// The TLS listener's certificate or key is unusable (`server.tls`).
    #[error(transparent)]
    Tls(#[from] api::connection::tls::TlsError),
    /// A server failed while running.
    #[error("{what} server failed: {message}")]
    Serve {
        /// Which surface.
        what: &'static str,
        /// What went wrong.
        message: String,
    },
}

/// A fully initialised instance, ready to serve.
pub struct Application {
    state: AppState,
    http: TcpListener,
    grpc: TcpListener,
    /// The TLS listener and its certificate (`server.tls`), serving the HTTP port's routes.
    tls: Option<(TcpListener, Arc<api::connection::tls::rustls::ServerConfig>)>,
    /// The peer listener and the cluster secret (`cluster.listen`).
    cluster: Option<(TcpListener, crate::cluster::ClusterKey)>,
}

impl Application {
    /// Connects, migrates and binds; nothing is served yet.
    pub async fn build(config: NodeConfig) -> Result<Self, AppError> {
        Self::build_from(config, None).await
    }

    /// Like `build`, remembering the config file for `aegis.system.config`.
    pub async fn build_from(
        config: NodeConfig,
        config_path: Option<std::path::PathBuf>,
    ) -> Result<Self, AppError> {
        // The catalog builds, and it and the handlers agree (a packaging bug otherwise).
        crate::tools::check_handlers(&*crate::catalog::catalog()?)?;
        // The audit writer lives below the metrics registry; it reports its batches here.
        crate::audit::observe_batches(crate::metrics::audit_write);
        let pool = database::connect(&config.database).await?;
        database::migrate(&pool).await?;
        bootstrap_admin_key(&pool, &config).await?;

        let engine = DockerEngine::connect(config.docker.host.as_deref())?;
        match engine.version().await {
            Ok(v) => tracing::info!(docker_version = %v, "Docker engine answers"),
            Err(e) => {
                tracing::warn!(error = %e, "Docker engine not answering; not ready until it does")
            }
        }

        let Listeners {
            http,
            grpc,
            tls,
            cluster,
        } = Listeners::bind(&config).await?;

        let instance_id = Uuid::new_v4();
        let hostname = std::env::var("HOSTNAME").unwrap_or_else(|_| "unknown".to_owned());
        aegis_store::node_instances::register(
            &pool,
            instance_id,
            &hostname,
            env!("CARGO_PKG_VERSION"),
            cluster.as_ref().map(|(_, _, advertise)| advertise.as_str()),
        )
        .await
        .map_err(StoreError::from)?;
        let forwarder: Option<Arc<dyn dispatcher::Forwarder>> = match &cluster {
            Some((_, key, _)) => Some(Arc::new(
                crate::cluster::Peers::new(pool.clone(), key.clone()).map_err(|message| {
                    AppError::Serve {
                        what: "cluster",
                        message,
                    }
                })?,
            )),
            None => None,
        };

        let egress = Arc::new(crate::egress::Egress::from_config(&config.egress)?);
        let sandboxes = Arc::new(
            start_sandboxes(
                &config,
                &engine,
                &pool,
                instance_id,
                egress.clone(),
                forwarder,
            )
            .await,
        );
        let gateway = Arc::new(start_gateway(&config, &pool).await?);
        let llm = crate::llm::LlmClient::new(&config.llm).map_err(|e| e.to_string());
        if let Err(e) = &llm {
            tracing::warn!(error = %e, "no language model client: executions will fail until llm is configured");
        }
        let executions = Arc::new(crate::engine::Engine::new(llm, config.executions.clone()));
        let dead_after = config.sandbox.dead_after_secs as i64;
        let workflows = Arc::new(crate::workflow::Workflows::new(
            pool.clone(),
            instance_id,
            workflow_settings(&config),
        ));
        let mcp_servers = Arc::new(crate::mcp_servers::McpServers::new(
            &config.mcp_servers,
            egress.clone(),
        ));
        let state = AppState {
            workflows,
            executions,
            gateway,
            sandboxes,
            pool,
            docker: engine,
            config: Arc::new(config),
            instance_id,
            started_at: Utc::now(),
            config_path: config_path.map(Arc::new),
            egress,
            api_keys: Arc::default(),
            mcp_servers,
        };
        recover(&state, dead_after).await;
        let cluster = cluster.map(|(listener, key, _)| (listener, key));
        Ok(Self {
            state,
            http,
            grpc,
            tls,
            cluster,
        })
    }

    /// The bound REST address (useful when the config asked for port 0).
    pub fn http_addr(&self) -> SocketAddr {
        self.http
            .local_addr()
            .unwrap_or(self.state.config.server.http)
    }

    /// The bound TLS address, when `server.tls` is set.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc
            .local_addr()
            .unwrap_or(self.state.config.server.grpc)
    }

    /// The shared state, for tests that need the pool or the instance id.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves REST and gRPC until `shutdown` is cancelled, then drains within the grace period.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), AppError> {
        let Self {
            state,
            http,
            grpc,
            tls,
            cluster,
        } = self;
        let grace = Duration::from_secs(state.config.server.shutdown_grace_secs);
        tracing::info!(
            http = %http.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            grpc = %grpc.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            tls = %tls.as_ref().and_then(|(l, _)| l.local_addr().ok()).map(|a| a.to_string()).unwrap_or_default(),
            instance_id = %state.instance_id,
            "serving"
        );

        let mut background = crate::background::Background::spawn(&state, &shutdown);

        // `/mcp` ends its sessions (and their SSE streams) when the instance stops.
        // Every HTTP request (REST, SEAL over HTTP, MCP) gets its request id and span here.
        let rest = api::http_router(state.clone())
            .merge(api::mcp::routes(state.clone(), shutdown.child_token()));
        // A request to a sandbox's port never reaches the node's own routes, `/mcp` included.
        let rest = api::with_ports(rest, state.clone())
            .layer(api::request_id::RequestIdLayer::new("http"));
        // The TLS listener serves the very same routes (sandbox ports at
        // `https://<port>-<id>.<e2b.domain>` included); it stops with the HTTP port.
        let mut tls_task = tls.map(|(listener, certificate)| {
            serve_tls(listener, certificate, rest.clone(), shutdown.clone())
        });
        let mut http_task = tokio::spawn(serve_http(http, rest, shutdown.clone()));

        // Peers' forwarded calls, on their own listener. It serves on until this instance's
        // stop is recorded: a rolling restart fails no call (peers' calls into the sandboxes
        // held here are served while the rest drains, then refused as "stopping", which the
        // caller's replica takes as its cue to adopt the sandbox; `dispatcher::takeover`).
        // Forwarded live processes and watches still end at the start of the shutdown.
        let peers_stop = CancellationToken::new();
        let mut cluster_task = cluster.map(|(listener, key)| {
            let router = api::cluster::router(state.clone(), key, shutdown.child_token());
            serve_peers(listener, router, peers_stop.clone())
        });

        let grpc_router =
            api::grpc::router(state.clone(), shutdown.clone()).map_err(|e| AppError::Serve {
                what: "grpc",
                message: e.to_string(),
            })?;
        let mut grpc_task = tokio::spawn(serve_grpc(grpc, grpc_router, shutdown.clone()));

        // Phase 1: either a server dies on its own (then stop the other) or shutdown is
        // requested; then the servers drain within the grace period.
        let early = tokio::select! {
            _ = shutdown.cancelled() => None,
            r = &mut http_task => Some(("http", r)),
            r = &mut grpc_task => Some(("grpc", r)),
        };
        shutdown.cancel();
        tracing::info!(
            grace_secs = grace.as_secs(),
            "shutting down; draining in-flight requests"
        );

        // A task whose result the select above already took must not be awaited again.
        let mut result = Ok(());
        let mut http_done = false;
        let mut grpc_done = false;
        if let Some((what, r)) = early {
            http_done = what == "http";
            grpc_done = what == "grpc";
            result = flatten(what, r);
        }
        let drain = async {
            let mut out = Ok(());
            if !http_done {
                out = out.and(flatten("http", (&mut http_task).await));
            }
            if !grpc_done {
                out = out.and(flatten("grpc", (&mut grpc_task).await));
            }
            out
        };
        match tokio::time::timeout(grace, drain).await {
            Ok(r) => result = result.and(r),
            Err(_) => {
                tracing::warn!("grace period over; closing remaining connections");
                http_task.abort();
                grpc_task.abort();
            }
        }
        if let Some(task) = &mut tls_task {
            if tokio::time::timeout(grace, &mut *task).await.is_err() {
                task.abort();
            }
        }
        // Phases 2 to 7 (background.rs gives the order and why).
        background.stop_periodic();
        background.stop_workflows().await;
        background.stop_listeners();
        state.executions.stop_all(Duration::from_secs(10)).await;
        release_sandboxes(&state).await;
        record_stop(&state).await;
        peers_stop.cancel();
        if let Some(task) = &mut cluster_task {
            if tokio::time::timeout(grace, &mut *task).await.is_err() {
                task.abort();
            }
        }
        state.pool.close().await;
        tracing::info!("shutdown complete");
        result
    }
}

fn flatten(
    what: &'static str,
    r: Result<Result<(), AppError>, tokio::task::JoinError>,
) -> Result<(), AppError> {
    match r {
        Ok(inner) => inner,
        Err(e) if e.is_cancelled() => Ok(()),
        Err(e) => Err(AppError::Serve {
            what,
            message: e.to_string(),
        }),
    }
}

/// The workflow engine's settings from the node config (System image: the configured one, else
/// the runtime registry's default).
fn workflow_settings(config: &NodeConfig) -> crate::workflow::Settings {
    let w = &config.workflows;
    let system_image = w.system_image.clone().unwrap_or_else(|| {
        crate::runtimes::registry()
            .ok()
            .and_then(|r| crate::runtimes::lookup(&r.default.language, &r.default.version))
            .map(|r| r.image.clone())
            .unwrap_or_else(|| "aegis-runtime/shell:bookworm".to_owned())
    });
    crate::workflow::Settings {
        workers: w.workers,
        lease_ttl_secs: w.lease_ttl_secs,
        poll_interval: Duration::from_millis(w.poll_interval_ms),
        max_execution_secs: w.max_execution_secs,
        allow_network_modes: w.allow_network_modes.clone(),
        system_image,
        volume_max_mb: config.volumes.max_size_mb,
        volume_ttl_hours: config.volumes.default_ttl_hours,
    }
}

/// Loads the token signing key and the configured security contexts.
/// Serves `rest` over TLS on `listener` until `shutdown`, as a task of its own.
fn serve_tls(
    listener: TcpListener,
    certificate: Arc<api::connection::tls::rustls::ServerConfig>,
    rest: axum::Router,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let listener = api::connection::tls::tls_listener(listener, certificate);
    let service = rest.into_make_service_with_connect_info::<api::connection::Connection>();
    let serving = axum::serve(listener, service).with_graceful_shutdown(shutdown.cancelled_owned());
    spawn_listener("TLS", serving)
}

/// `serving` (a listener's `axum::serve`, until its shutdown) as a task of its own, which logs
/// it when the listener fails: the TLS and peer listeners run beside the HTTP port so.
fn spawn_listener<S, E>(what: &'static str, serving: S) -> tokio::task::JoinHandle<()>
where
    S: std::future::IntoFuture<Output = Result<(), E>> + Send + 'static,
    S::IntoFuture: Send,
    E: std::fmt::Display,
{
    tokio::spawn(async move {
        if let Err(e) = serving.await {
            tracing::error!(error = %e, "the {what} listener failed");
        }
    })
}

/// Serves `rest` on the HTTP port until `shutdown`. Every accepted socket is NODELAY
/// (`api::connection::http_listener`), and the connection reaches handlers: its peer address
/// (the attestation limit per source address), and its reset (a stream the E2B door cuts).
async fn serve_http(
    http: TcpListener,
    rest: axum::Router,
    shutdown: CancellationToken,
) -> Result<(), AppError> {
    let http = api::connection::http_listener(http);
    axum::serve(
        http,
        rest.into_make_service_with_connect_info::<api::connection::Connection>(),
    )
    .with_graceful_shutdown(shutdown.cancelled_owned())
    .await
    .map_err(|e| AppError::Serve {
        what: "http",
        message: e.to_string(),
    })
}

/// Peers' forwarded calls, on their own listener, as a task of its own. It serves on until
/// `stop`, which fires once this instance's stop is recorded: a rolling restart fails no call
/// (peers' calls into the sandboxes held here are served while the rest drains, then refused
/// as "stopping", which the caller's replica takes as its cue to adopt the sandbox;
/// `dispatcher::takeover`). Forwarded live processes and watches still end at the start of the
/// shutdown (the router's own token).
fn serve_peers(
    listener: TcpListener,
    router: axum::Router,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    // As for HTTP: a subscription's small frames must not wait for a delayed ACK.
    let listener = api::connection::http_listener(listener);
    let serving = axum::serve(listener, router).with_graceful_shutdown(stop.cancelled_owned());
    spawn_listener("peer", serving)
}

/// Serves gRPC on `grpc` until `shutdown`.
async fn serve_grpc(
    grpc: TcpListener,
    router: api::grpc::GrpcRouter,
    shutdown: CancellationToken,
) -> Result<(), AppError> {
    // As for HTTP: without NODELAY a unary gRPC answer waits ~40 ms for a delayed ACK.
    let incoming = tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true));
    router
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
        .map_err(|e| AppError::Serve {
            what: "grpc",
            message: e.to_string(),
        })
}

/// Registers the admin key (configured, from its file, or generated and shown once).
async fn bootstrap_admin_key(pool: &database::PgPool, config: &NodeConfig) -> Result<(), AppError> {
    match auth::bootstrap_with_file(
        pool,
        config.auth.admin_key.as_deref(),
        config.auth.admin_key_file.as_deref(),
    )
    .await?
    {
        Bootstrap::Generated(key) => {
            tracing::warn!("no admin API key existed: generated one (printed once on stderr)");
            eprintln!(
                "\n  First admin API key (shown only now; store it safely):\n\n    {key}\n\n  \
                 Use it as `Authorization: Bearer {key}`.\n"
            );
        }
        Bootstrap::Configured => {
            tracing::info!("admin API key from configuration is registered")
        }
        Bootstrap::GeneratedToFile(path) => tracing::warn!(
            path = %path.display(),
            "no admin API key file existed: generated a key into it (mode 0600); \
             print it with `orchestrator admin-key`"
        ),
        Bootstrap::FromFile(path) => {
            tracing::info!(path = %path.display(), "admin API key from the key file is registered")
        }
        Bootstrap::Existing => {}
    }
    Ok(())
}

/// Every listener of the node, bound before anything is served (so a port in use stops the
/// start with its address named).
struct Listeners {
    http: TcpListener,
    grpc: TcpListener,
    tls: Option<(TcpListener, Arc<api::connection::tls::rustls::ServerConfig>)>,
    /// The peer listener, the cluster secret and the URL peers are told to use.
    cluster: Option<(TcpListener, crate::cluster::ClusterKey, String)>,
}

impl Listeners {
    async fn bind(config: &NodeConfig) -> Result<Self, AppError> {
        let http = bind("http", config.server.http).await?;
        let grpc = bind("grpc", config.server.grpc).await?;
        // The certificate is read before anything is served: a bad one stops the start.
        let tls = match &config.server.tls {
            Some(tls) => {
                let certificate =
                    api::connection::tls::server_config(&tls.cert_file, &tls.key_file)?;
                Some((bind("tls", tls.listen).await?, certificate))
            }
            None => None,
        };
        let cluster = match (config.cluster.listen, &config.cluster.secret) {
            (Some(addr), Some(secret)) => {
                let listener = bind("cluster", addr).await?;
                let bound = listener.local_addr().unwrap_or(addr);
                let advertise = config
                    .cluster
                    .advertise
                    .clone()
                    .unwrap_or_else(|| format!("http://{bound}"));
                tracing::info!(listen = %bound, advertise = %advertise, "peers reach this replica here");
                Some((listener, crate::cluster::ClusterKey::new(secret), advertise))
            }
            _ => None,
        };
        Ok(Self {
            http,
            grpc,
            tls,
            cluster,
        })
    }
}

/// What instances that stopped or died left behind: their executions, their calls' audit
/// intents, and built-in definitions older than this binary.
async fn recover(state: &AppState, dead_after: i64) {
    state
        .executions
        .recover(&state.engine_services(), dead_after)
        .await;
    match crate::builtin::upgrade(&state.pool).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            tenants = n,
            "built-in definitions are at the shipped version"
        ),
        Err(e) => tracing::error!(error = %e, "could not upgrade the built-in definitions"),
    }
    match crate::audit::recover_abandoned(&state.pool, state.instance_id, dead_after).await {
        Ok(0) => {}
        Ok(n) => tracing::warn!(
            calls = n,
            "audited calls of stopped instances completed as abandoned"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "could not complete the audit intents of stopped instances")
        }
    }
}

async fn start_gateway(
    config: &NodeConfig,
    pool: &database::PgPool,
) -> Result<crate::gateway::Gateway, AppError> {
    for definition in &config.seal.security_contexts {
        // Validated at config load; parse again to get the typed value.
        if let Ok(ctx) = crate::contexts::parse(definition) {
            crate::contexts::upsert(pool, crate::DEFAULT_TENANT, &ctx, "config")
                .await
                .map_err(|e| AppError::Serve {
                    what: "seal",
                    message: e.to_string(),
                })?;
        }
    }
    let (_kid, seed) = crate::gateway::sessions::signing_seed(pool)
        .await
        .map_err(StoreError::from)?;
    Ok(crate::gateway::Gateway::new(
        seed,
        crate::gateway::GatewayConfig {
            token_ttl_secs: config.seal.token_ttl_secs as i64,
            freshness_secs: config.seal.freshness_secs as i64,
            attest_per_minute: config.seal.attest_per_minute as i64,
            attest_per_minute_per_source: config.seal.attest_per_minute_per_source as i64,
            attest_per_minute_node: config.seal.attest_per_minute_node as i64,
        },
    ))
}

/// Starts the dispatcher; a failure leaves the service up with sandboxes unavailable (readiness
/// reports it) rather than refusing every other capability.
async fn start_sandboxes(
    config: &NodeConfig,
    engine: &DockerEngine,
    pool: &database::PgPool,
    instance_id: Uuid,
    egress: Arc<crate::egress::Egress>,
    forwarder: Option<Arc<dyn dispatcher::Forwarder>>,
) -> crate::sandboxes::Sandboxes {
    let s = &config.sandbox;
    let landlock = crate::sandboxes::KernelPolicy {
        landlock_abi: dispatcher::kernel::landlock_abi(),
        required: s.require_landlock,
    };
    let ceilings = crate::sandboxes::ToolCeilings {
        cmd_timeout_secs: s.cmd_timeout_secs,
        max_output_bytes: s.max_output_bytes,
    };
    let quotas = crate::sandboxes::Quotas {
        node: s.max_live_sandboxes,
        per_context: s.max_sandboxes_per_context,
        per_api_key: s.max_sandboxes_per_api_key,
    };
    if landlock.landlock_abi > 0 {
        tracing::info!(
            abi = landlock.landlock_abi,
            "the kernel has Landlock: every command's policy is held by the kernel too"
        );
    } else if landlock.required {
        let reason = "the kernel has no Landlock, so the command policy could not be held by the \
                      kernel; sandboxes are refused (set sandbox.require_landlock: false to run \
                      them with the argv policy alone)";
        tracing::error!("{reason}");
        return crate::sandboxes::Sandboxes::new(Err(reason.to_owned()), ceilings, landlock)
            .with_quotas(quotas);
    } else {
        tracing::warn!("the kernel has no Landlock; sandbox.require_landlock is false, so commands run with the argv policy alone");
    }
    let mut d = dispatcher::DispatcherConfig::new(&s.executor_path);
    d.require_landlock = s.require_landlock;
    d.ceilings.workspace_bytes = s.max_workspace_mb * 1024 * 1024;
    d.ceilings.memory_bytes = s.max_memory_mb * 1024 * 1024;
    d.ceilings.nano_cpus = s.max_cpu_millis * 1_000_000;
    d.ceilings.pids = s.max_pids;
    d.pool = s.pool.clone();
    d.pool_refill_delay = std::time::Duration::from_millis(s.pool_refill_delay_ms);
    e2b_pools(config, &ceilings, &mut d);
    d.max_file_bytes = s.max_file_bytes;
    d.max_buffered_bytes = s.max_buffered_mb.saturating_mul(1024 * 1024);
    d.dead_after = Duration::from_secs(s.dead_after_secs);
    // The replica holds its sandboxes as a lease, renewed by the dispatcher's heartbeat, and
    // takes over those of peers that fell silent (issue 23).
    d.lease = Some(s.lease());
    d.reap_interval = Duration::from_secs(s.reap_interval_secs);
    d.call_timeout = Duration::from_secs(60);
    d.adopt_from = gracefully_stopped_owners(pool).await;
    d.channel_dir = s.channel_dir().map(std::path::Path::to_path_buf);
    d.forwarder = forwarder;
    d.isolation = dispatcher::IsolationPolicy {
        default: s.isolation,
        by_image: s.isolation_by_image(),
    };
    d.engine_limit = dispatcher::EngineLimit {
        sandboxes: s.max_per_engine,
        memory_bytes: s.max_memory_per_engine_mb.map(|mb| mb * 1024 * 1024),
    };
    // Networked sandboxes get a proxy of their own, audited into this database.
    let proxies = Arc::new(
        crate::sandboxes::egress::ProxyHost::new(egress, pool.clone())
            .with_e2b_grants(config.e2b.egress.clone()),
    );
    d.egress_host = Some(proxies.clone());
    let started = dispatcher::Dispatcher::start(engine.clone(), pool.clone(), instance_id, d)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "sandboxes unavailable: the dispatcher did not start");
            e.to_string()
        });
    crate::sandboxes::Sandboxes::new(started, ceilings, landlock)
        .with_quotas(quotas)
        .with_proxies(proxies)
}

/// Each E2B template's warm pool (`e2b.pool`) in the dispatcher's config: made of the very spec
/// its creates ask for (unbound keys), and warmed before hand-out.
fn e2b_pools(
    config: &NodeConfig,
    ceilings: &crate::sandboxes::ToolCeilings,
    d: &mut dispatcher::DispatcherConfig,
) {
    for (template, size) in &config.e2b.pool {
        match crate::sandboxes::find_runtime(template) {
            Ok(runtime) => {
                let owner =
                    dispatcher::Owner::new(dispatcher::OwnerKind::Pool, dispatcher::POOL_OWNER_ID);
                let (spec, _) = crate::sandboxes::e2b_spec(runtime, None, owner, ceilings);
                d.pool_shapes
                    .insert(format!("e2b:{template}"), (spec, *size));
                // Every E2B command runs under `bash -c`: its first start in a new sandbox
                // (the program, its libraries, the files it reads at start) is paid before
                // the hand-out, not by the owner's first command.
                d.pool_warmup.insert(
                    format!("e2b:{template}"),
                    vec!["bash".to_owned(), "-c".to_owned(), "true".to_owned()],
                );
            }
            // The config check refuses unknown templates; a registry that changed since is
            // reported, not fatal.
            Err(e) => {
                tracing::warn!(template = %template, error = %e, "no warm pool for this E2B template")
            }
        }
    }
}

/// Previous instances on this host that stopped gracefully and left running sandboxes: a restart
/// re-attaches to those. Crashed instances (never marked stopped) are not adopted; the reaper
/// removes their sandboxes, since their in-flight work is lost anyway.
async fn gracefully_stopped_owners(pool: &database::PgPool) -> Vec<Uuid> {
    let hostname = std::env::var("HOSTNAME").unwrap_or_else(|_| "unknown".to_owned());
    aegis_store::node_instances::stopped_with_running_sandboxes(pool, &hostname)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot look for sandboxes to re-attach");
            Vec::new()
        })
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, AppError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AppError::Bind { what, addr, source })
}

/// Phase 6 of shutdown: this instance's sandboxes destroyed, or kept for the next instance to
/// adopt (`shutdown.sandboxes: keep`, a rolling restart).
async fn release_sandboxes(state: &AppState) {
    let Ok(d) = state.sandboxes.dispatcher() else {
        return;
    };
    match state.config.shutdown.sandboxes {
        crate::config::ShutdownSandboxes::Destroy => {
            let destroyed = d.shutdown_destroying().await;
            tracing::info!(destroyed, "this instance's sandboxes destroyed");
        }
        crate::config::ShutdownSandboxes::Keep => {
            tracing::info!(
                "shutdown.sandboxes is keep: this instance's sandboxes stay running for adoption"
            );
            d.shutdown().await;
        }
    }
}

/// Phase 7 of shutdown: peers see at once that this instance stopped (no wait for `dead_after`).
async fn record_stop(state: &AppState) {
    if let Err(e) = aegis_store::node_instances::record_stop(&state.pool, state.instance_id).await {
        tracing::warn!(error = %e, "could not record the stop of this instance");
    }
}
