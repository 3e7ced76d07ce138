//! Prometheus metrics of the node: what `/metrics` renders.
//!
//! One process-wide registry, as Prometheus expects of a process. Each thing is counted at the
//! one place it happens: tool calls in the router (`tools::invoke_in`), SEAL refusals in the
//! gateway, audit write latency in the audit writer, warm-pool hand-outs in the dispatcher. The
//! hot path touches atomics only: the counter and histogram of a (tool, door, decision) are
//! resolved once into a fixed slot table and reused, so a call never takes the registry's lock.
//!
//! What is a state rather than an event (sandboxes by state, executions and workflow executions by
//! status) is read from PostgreSQL when scraped, at most once per [`REFRESH`]: a storm of scrapes
//! costs one query set. Those gauges describe the database, so every replica reports the same
//! numbers (aggregate them with `max`, not `sum`).

use std::collections::HashMap;
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Database-derived gauges are refreshed at most this often.
pub const REFRESH: Duration = Duration::from_secs(5);

/// Which door a tool call came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// `POST /v1/tools/call` and the REST routes that run a tool (deploys, deletes).
    Rest,
    /// SEAL envelopes over HTTP (`/v1/seal/invoke`).
    SealHttp,
    /// SEAL envelopes over gRPC.
    SealGrpc,
    /// MCP `tools/call` at `/mcp`.
    Mcp,
    /// An agent execution's inner loop.
    Execution,
    /// An agent execution started by a workflow state.
    Workflow,
    /// E2B's control API and envd under `/e2b` (E2B's SDKs).
    E2b,
}

impl Door {
    const ALL: [Door; 7] = [
        Door::Rest,
        Door::SealHttp,
        Door::SealGrpc,
        Door::Mcp,
        Door::Execution,
        Door::Workflow,
        Door::E2b,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Door::Rest => "rest",
            Door::SealHttp => "seal_http",
            Door::SealGrpc => "seal_grpc",
            Door::Mcp => "mcp",
            Door::Execution => "execution",
            Door::Workflow => "workflow",
            Door::E2b => "e2b",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

tokio::task_local! {
    /// The door of the call running in this task, set by the edge that received it.
    static DOOR: Door;
}

/// Runs `work` as a call that came through `door` (the router labels its metrics with it).
pub async fn through<F: std::future::Future>(door: Door, work: F) -> F::Output {
    DOOR.scope(door, work).await
}

/// The door of the current call: the one an edge set, else what the caller kind implies.
pub fn current_door(caller: &aegis_core::caller::Caller) -> Door {
    DOOR.try_with(|d| *d).unwrap_or(match caller.kind {
        aegis_core::caller::CallerKind::Session => Door::SealHttp,
        aegis_core::caller::CallerKind::Execution => Door::Execution,
        aegis_core::caller::CallerKind::ApiKey | aegis_core::caller::CallerKind::System => {
            Door::Rest
        }
    })
}

/// What became of a tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The tool ran and succeeded.
    Allowed,
    /// Refused before the tool ran (unknown tool, invalid arguments, policy, approval).
    Refused,
    /// The tool ran and failed, or the audit log could not be written.
    Error,
}

impl Decision {
    const ALL: [Decision; 3] = [Decision::Allowed, Decision::Refused, Decision::Error];

    fn as_str(self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Refused => "refused",
            Decision::Error => "error",
        }
    }
}

/// Latency buckets of tool calls (seconds): from an in-process `aegis.*` call to a long command.
const CALL_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    120.0,
];

/// Latency buckets of audit batch writes (seconds).
const AUDIT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The `tool` label of every call of an external MCP server's tool.
const EXTERNAL_TOOLS: &str = "mcp";
const SANDBOX_STATES: [&str; 3] = ["creating", "running", "destroying"];
/// The isolation classes, each reported even at 0.
const ISOLATION_CLASSES: [&str; 2] = ["container", "gvisor"];
const EXECUTION_STATUSES: [&str; 6] = [
    "pending",
    "running",
    "completed",
    "failed",
    "cancelled",
    "timed_out",
];
const WORKFLOW_STATUSES: [&str; 7] = [
    "pending",
    "running",
    "waiting",
    "completed",
    "failed",
    "cancelled",
    "timed_out",
];

/// Every metric of the process.
struct Metrics {
    registry: Registry,
    tool_calls: IntCounterVec,
    tool_seconds: HistogramVec,
    /// Tool name -> slot row; unknown names share the last row (label `unknown`).
    tool_index: HashMap<String, usize>,
    tool_names: Vec<String>,
    /// Resolved handles, `[(tool * doors + door) * decisions + decision]`.
    call_slots: Box<[OnceLock<IntCounter>]>,
    /// Resolved handles, `[tool * doors + door]`.
    time_slots: Box<[OnceLock<Histogram>]>,
    seal_refusals: IntCounterVec,
    audit_write_seconds: Histogram,
    audit_rows: IntCounter,
    sandboxes: IntGaugeVec,
    executions: IntGaugeVec,
    workflow_executions: IntGaugeVec,
    pool_idle: IntGaugeVec,
    pool_acquired: IntCounterVec,
    pool_acquired_by_pool: IntCounterVec,
    db_connections: IntGaugeVec,
    forwarded: IntCounterVec,
    port_connections: IntCounterVec,
    peers: IntGaugeVec,
    engine_sandboxes: IntGaugeVec,
    engine_replicas: IntGaugeVec,
    sandboxes_by_isolation: IntGaugeVec,
    /// Engines seen so far: one that has nothing left reads 0 rather than vanishing.
    engines_seen: std::sync::Mutex<std::collections::BTreeSet<String>>,
    gauges_refreshed: tokio::sync::Mutex<Option<Instant>>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The metric `name` as `made`, registered in `registry`. Names, labels and buckets are this
/// file's constants, so a failure to make or register one is a programming error that the
/// first test to render catches: it panics, naming the metric.
fn registered<M>(registry: &Registry, name: &str, made: prometheus::Result<M>) -> M
where
    M: prometheus::core::Collector + Clone + 'static,
{
    let metric = made.unwrap_or_else(|e| panic!("metric {name}: {e}"));
    registry
        .register(Box::new(metric.clone()))
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    metric
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    registered(
        registry,
        name,
        IntCounterVec::new(Opts::new(name, help), labels),
    )
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    registered(
        registry,
        name,
        IntGaugeVec::new(Opts::new(name, help), labels),
    )
}

/// The tool calls' counter and duration histogram, the metrics the slot table resolves into.
fn tool_call_metrics(registry: &Registry) -> (IntCounterVec, HistogramVec) {
    let tool_calls = counter_vec(
        registry,
        "aegis_tool_calls_total",
        "Tool calls by tool, door (rest, seal_http, seal_grpc, mcp, execution, workflow) and decision (allowed, refused, error).",
        &["tool", "door", "decision"],
    );
    let name = "aegis_tool_call_duration_seconds";
    let help = "Time from the router receiving a tool call to its answer, refusals included.";
    let opts = HistogramOpts::new(name, help).buckets(CALL_BUCKETS.to_vec());
    let tool_seconds = registered(registry, name, HistogramVec::new(opts, &["tool", "door"]));
    (tool_calls, tool_seconds)
}

/// The tool rows of the slot table (see [`Metrics`]'s fields of the same names).
struct ToolTable {
    tool_names: Vec<String>,
    tool_index: HashMap<String, usize>,
    call_slots: Box<[OnceLock<IntCounter>]>,
    time_slots: Box<[OnceLock<Histogram>]>,
}

/// The tool label values (the catalog's names, then the shared external and `unknown` rows),
/// their index, and the empty slots the hot path fills once per (tool, door, decision).
fn tool_table() -> ToolTable {
    let mut tool_names: Vec<String> = aegis_core::catalog::catalog()
        .map(|c| c.iter().map(|t| t.name.clone()).collect())
        .unwrap_or_default();
    // Every tool of an external MCP server (`mcp:<server>/<tool>`) under one label: their
    // names come from servers and callers, not from this build.
    tool_names.push(EXTERNAL_TOOLS.to_owned());
    tool_names.push("unknown".to_owned());
    let tool_index = tool_names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), i))
        .collect();
    let doors = Door::ALL.len();
    let decisions = Decision::ALL.len();
    let call_slots = (0..tool_names.len() * doors * decisions)
        .map(|_| OnceLock::new())
        .collect();
    let time_slots = (0..tool_names.len() * doors)
        .map(|_| OnceLock::new())
        .collect();
    ToolTable {
        tool_names,
        tool_index,
        call_slots,
        time_slots,
    }
}

/// The audit writer's batch latency and row count.
fn audit_metrics(registry: &Registry) -> (Histogram, IntCounter) {
    let name = "aegis_audit_write_duration_seconds";
    let help =
        "Time the audit writer takes to chain and store one batch of rows (lock, INSERT, commit).";
    let opts = HistogramOpts::new(name, help).buckets(AUDIT_BUCKETS.to_vec());
    let audit_write_seconds = registered(registry, name, Histogram::with_opts(opts));
    let name = "aegis_audit_rows_written_total";
    let help = "Audit rows stored by the batched writer.";
    let audit_rows = registered(registry, name, IntCounter::new(name, help));
    (audit_write_seconds, audit_rows)
}

impl Metrics {
    // The names, labels and buckets below are constants of this file: a registration failure is
    // a programming error caught by the first test that renders, hence the panics.
    fn new() -> Self {
        let registry = Registry::new();
        let (tool_calls, tool_seconds) = tool_call_metrics(&registry);
        let ToolTable {
            tool_names,
            tool_index,
            call_slots,
            time_slots,
        } = tool_table();
        let seal_refusals = counter_vec(
            &registry,
            "aegis_seal_refusals_total",
            "SEAL envelopes and attestations refused by the gateway, by SEAL error code.",
            &["code"],
        );
        let (audit_write_seconds, audit_rows) = audit_metrics(&registry);
        Self {
            tool_calls,
            tool_seconds,
            tool_index,
            tool_names,
            call_slots,
            time_slots,
            seal_refusals,
            audit_write_seconds,
            audit_rows,
            sandboxes: gauge_vec(
                &registry,
                "aegis_sandboxes",
                "Live sandboxes recorded in the database, by state (warm-pool spares included).",
                &["state"],
            ),
            executions: gauge_vec(
                &registry,
                "aegis_executions",
                "Agent executions in the database, by status.",
                &["status"],
            ),
            workflow_executions: gauge_vec(
                &registry,
                "aegis_workflow_executions",
                "Workflow executions in the database, by status.",
                &["status"],
            ),
            pool_idle: gauge_vec(
                &registry,
                "aegis_pool_idle_sandboxes",
                "Idle warm-pool sandboxes held by this instance, by pool: an image, or `e2b:<template>`.",
                &["image"],
            ),
            pool_acquired: counter_vec(
                &registry,
                "aegis_pool_acquisitions_total",
                "Sandbox acquisitions by this instance: `hit` when the warm pool served it, `miss` when a sandbox was created.",
                &["result"],
            ),
            pool_acquired_by_pool: counter_vec(
                &registry,
                "aegis_pool_acquisitions_by_pool_total",
                "Acquisitions whose sandbox a warm pool serves, by pool (an image, or `e2b:<template>`): `hit` when it was handed an idle one, `miss` when the pool was empty.",
                &["pool", "result"],
            ),
            db_connections: gauge_vec(
                &registry,
                "aegis_db_pool_connections",
                "PostgreSQL pool connections of this instance: `idle`, `in_use`, and the pool's `max`.",
                &["state"],
            ),
            forwarded: counter_vec(
                &registry,
                "aegis_forwarded_calls_total",
                "Executor calls and live-process or watch subscriptions carried between replicas: `sent` by this one for a sandbox a peer holds, `served` for a peer; by outcome (`ok`, `refused`: the holder or the signature check said no, `error`: the peer could not be reached or answered badly).",
                &["direction", "outcome"],
            ),
            port_connections: counter_vec(
                &registry,
                "aegis_port_connections_total",
                "Connections to a sandbox's port through the node (E2B's `get_host`), one per client connection whatever the requests on it: `opened`, `denied` (no or another sandbox's traffic token, the owner key's policy), `unreachable` (nothing listens: 502), `not_running` (paused, gone, or on another replica), `error`.",
                &["outcome"],
            ),
            peers: gauge_vec(
                &registry,
                "aegis_cluster_replicas",
                "Running instances of this database (heartbeat within a minute), by whether peers can reach them (`reachable`: with a peer URL) or not (`alone`).",
                &["kind"],
            ),
            engine_sandboxes: gauge_vec(
                &registry,
                "aegis_engine_sandboxes",
                "Live sandboxes (creating, running, destroying) by the Docker engine they are on (`<ID>@<name>:<data root>` from `docker info`; `unrecorded` for rows written before engines were recorded).",
                &["engine"],
            ),
            engine_replicas: gauge_vec(
                &registry,
                "aegis_engine_replicas",
                "Running instances of this database (heartbeat within a minute) by the Docker engine they drive.",
                &["engine"],
            ),
            sandboxes_by_isolation: gauge_vec(
                &registry,
                "aegis_sandboxes_by_isolation",
                "Live sandboxes (creating, running, destroying) by isolation class: `container` (runc on the host's kernel) or `gvisor` (gVisor's runsc, a kernel of its own).",
                &["isolation"],
            ),
            engines_seen: std::sync::Mutex::default(),
            gauges_refreshed: tokio::sync::Mutex::new(None),
            registry,
        }
    }

    fn tool_row(&self, tool: &str) -> usize {
        let tool = if tool.starts_with(aegis_core::catalog::EXTERNAL_PREFIX) {
            EXTERNAL_TOOLS
        } else {
            tool
        };
        self.tool_index
            .get(tool)
            .copied()
            .unwrap_or(self.tool_names.len() - 1)
    }
}

/// Counts one tool call (called by the router only).
pub fn tool_call(tool: &str, door: Door, decision: Decision, elapsed: Duration) {
    let m = &*METRICS;
    let row = m.tool_row(tool);
    let doors = Door::ALL.len();
    let decisions = Decision::ALL.len();
    let call = (row * doors + door.index()) * decisions + decision as usize;
    let time = row * doors + door.index();
    if let Some(slot) = m.call_slots.get(call) {
        slot.get_or_init(|| {
            m.tool_calls
                .with_label_values(&[&m.tool_names[row], door.as_str(), decision.as_str()])
        })
        .inc();
    }
    if let Some(slot) = m.time_slots.get(time) {
        slot.get_or_init(|| {
            m.tool_seconds
                .with_label_values(&[&m.tool_names[row], door.as_str()])
        })
        .observe(elapsed.as_secs_f64());
    }
}

/// Counts one SEAL refusal (called by the gateway only).
pub fn seal_refusal(code: u32) {
    // Refusals are rare next to calls; the label lookup is the registry's read lock.
    METRICS
        .seal_refusals
        .with_label_values(&[&code.to_string()])
        .inc();
}

/// Counts one call forwarded between replicas: `sent` or `served`, `ok`, `refused` or `error`.
pub fn forwarded_call(direction: &'static str, outcome: &'static str) {
    METRICS
        .forwarded
        .with_label_values(&[direction, outcome])
        .inc();
}

/// Counts one connection to a sandbox port by how it went (see `aegis_port_connections_total`).
pub fn port_connection(outcome: &'static str) {
    METRICS.port_connections.with_label_values(&[outcome]).inc();
}

/// Records one batch stored by the audit writer.
pub fn audit_write(rows: usize, elapsed: Duration) {
    METRICS.audit_write_seconds.observe(elapsed.as_secs_f64());
    METRICS.audit_rows.inc_by(rows as u64);
}

/// Renders every metric in the Prometheus text format, refreshing the database gauges when they
/// are older than [`REFRESH`] (one refresher at a time; concurrent scrapes get the last values).
/// Takes what it reads (the pool, and the dispatcher when sandboxes are available), not the
/// application state.
pub async fn render(
    pool: &sqlx::PgPool,
    dispatcher: Option<&dispatcher::Dispatcher>,
) -> Result<String, String> {
    let m = &*METRICS;
    if let Ok(mut refreshed) = m.gauges_refreshed.try_lock() {
        if refreshed.is_none_or(|at| at.elapsed() >= REFRESH) {
            match refresh_from_db(m, pool).await {
                Ok(()) => *refreshed = Some(Instant::now()),
                Err(e) => tracing::warn!(error = %e, "metrics: database gauges not refreshed"),
            }
        }
    }
    refresh_local(m, pool, dispatcher);
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&m.registry.gather(), &mut out)
        .map_err(|e| e.to_string())?;
    String::from_utf8(out).map_err(|e| e.to_string())
}

/// Sets `gauges` from `(label, count)` rows, zeroing the known labels that have no row.
fn set_all(gauges: &IntGaugeVec, known: &[&str], rows: Vec<(String, i64)>) {
    for label in known {
        gauges.with_label_values(&[label]).set(0);
    }
    for (label, n) in rows {
        gauges.with_label_values(&[&label]).set(n);
    }
}

async fn refresh_from_db(m: &Metrics, pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
    let sandboxes: Vec<(String, i64)> = sqlx::query_as(
        "SELECT state, count(*) FROM sandboxes \
         WHERE state IN ('creating', 'running', 'destroying') GROUP BY state",
    )
    .fetch_all(pool)
    .await?;
    let executions: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM executions GROUP BY status")
            .fetch_all(pool)
            .await?;
    let workflows: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM workflow_executions GROUP BY status")
            .fetch_all(pool)
            .await?;
    let (reachable, alone): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE peer_url IS NOT NULL), count(*) FILTER (WHERE peer_url IS NULL) \
         FROM node_instances WHERE stopped_at IS NULL AND heartbeat_at > now() - interval '1 minute'",
    )
    .fetch_one(pool)
    .await?;
    m.peers.with_label_values(&["reachable"]).set(reachable);
    m.peers.with_label_values(&["alone"]).set(alone);
    let by_engine: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT engine, sum(sandboxes)::BIGINT, sum(replicas)::BIGINT FROM ( \
           SELECT COALESCE(engine, 'unrecorded') AS engine, count(*) AS sandboxes, 0 AS replicas \
           FROM sandboxes WHERE state IN ('creating', 'running', 'destroying') GROUP BY 1 \
           UNION ALL \
           SELECT COALESCE(engine, 'unrecorded'), 0, count(*) FROM node_instances \
           WHERE stopped_at IS NULL AND heartbeat_at > now() - interval '1 minute' GROUP BY 1 \
         ) e GROUP BY engine",
    )
    .fetch_all(pool)
    .await?;
    {
        let mut seen = m
            .engines_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for engine in seen.iter() {
            m.engine_sandboxes.with_label_values(&[engine]).set(0);
            m.engine_replicas.with_label_values(&[engine]).set(0);
        }
        for (engine, sandboxes, replicas) in by_engine {
            m.engine_sandboxes
                .with_label_values(&[&engine])
                .set(sandboxes);
            m.engine_replicas
                .with_label_values(&[&engine])
                .set(replicas);
            seen.insert(engine);
        }
    }
    // Rows written before classes existed have none in their spec: they are containers.
    let by_isolation: Vec<(String, i64)> = sqlx::query_as(
        "SELECT COALESCE(spec->>'isolation', 'container'), count(*) FROM sandboxes \
         WHERE state IN ('creating', 'running', 'destroying') GROUP BY 1",
    )
    .fetch_all(pool)
    .await?;
    set_all(&m.sandboxes, &SANDBOX_STATES, sandboxes);
    set_all(&m.sandboxes_by_isolation, &ISOLATION_CLASSES, by_isolation);
    set_all(&m.executions, &EXECUTION_STATUSES, executions);
    set_all(&m.workflow_executions, &WORKFLOW_STATUSES, workflows);
    Ok(())
}

/// What this instance knows without a query: its connection pool and its warm pool.
fn refresh_local(m: &Metrics, pool: &sqlx::PgPool, dispatcher: Option<&dispatcher::Dispatcher>) {
    let size = i64::from(pool.size());
    let idle = pool.num_idle() as i64;
    m.db_connections.with_label_values(&["idle"]).set(idle);
    m.db_connections
        .with_label_values(&["in_use"])
        .set((size - idle).max(0));
    m.db_connections
        .with_label_values(&["max"])
        .set(i64::from(pool.options().get_max_connections()));
    if let Some(d) = dispatcher {
        for (image, n) in d.pool_sizes() {
            m.pool_idle.with_label_values(&[&image]).set(n as i64);
        }
        let stats = d.pool_stats();
        catch_up(&m.pool_acquired.with_label_values(&["hit"]), stats.hits);
        catch_up(&m.pool_acquired.with_label_values(&["miss"]), stats.misses);
        for (pool, stats) in d.pool_stats_by_pool() {
            let counter = |result: &str| {
                m.pool_acquired_by_pool
                    .with_label_values(&[pool.as_str(), result])
            };
            catch_up(&counter("hit"), stats.hits);
            catch_up(&counter("miss"), stats.misses);
        }
    }
}

/// Advances a counter to a total kept elsewhere (the dispatcher's own atomics).
fn catch_up(counter: &IntCounter, total: u64) {
    let have = counter.get();
    if total > have {
        counter.inc_by(total - have);
    }
}
