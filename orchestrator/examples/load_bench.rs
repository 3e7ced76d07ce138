//! The load benchmark: C concurrent clients against one real orchestrator, on every transport.
//!
//! One run starts the orchestrator in this process (its own scratch database, real PostgreSQL,
//! real Docker), then, for each workload and each transport, lets C clients call as fast as they
//! can for a fixed time and prints calls/s, p50, p99 and errors:
//!
//! - `aegis.runtime.list` (no sandbox: router, policy and the audit chain are the whole cost);
//! - `cmd.run true` spread over 10 sandboxes (client i uses sandbox i mod 10);
//! - `fs.read` of a 64 KiB file, same spread.
//!
//! Beside them, in the same run and at the same concurrency, the bare Docker exec throughput into
//! the same containers (`/bin/true`, `cat` of the same file) with a minimal Engine API client:
//! what the engine alone costs. Every call through the orchestrator is audited (intent and
//! completion rows); at the end the benchmark counts the audit rows against the calls made and
//! verifies the hash chain through `/v1/audit/verify`.
//!
//! Transports are a list (`--transports rest,seal-http,seal-grpc,mcp`): one that this build does
//! not serve is skipped with a note. The load average is printed with the figures: the machine
//! may be shared.
//!
//! `scripts/load_bench.sh [--clients 50] [--seconds 5]` builds what it needs and runs this in
//! release mode.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aegis_cli::seal_client::{SealClient, Transport as SealTransport};
use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use orchestrator::state::AppState;
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

#[allow(dead_code)]
#[path = "../tests/suite/common/agent.rs"]
mod agent;
use agent::AgentManifest;
#[allow(dead_code)] // this benchmark serves its own node; it takes its config and build only
#[path = "support/bench_node.rs"]
mod bench_node;
use bench_node::interrupt;
#[path = "support/cpu_account.rs"]
mod cpu_account;
#[path = "support/cpu_groups.rs"]
mod cpu_groups;
#[path = "support/mcp_client.rs"]
mod mcp_client;
#[path = "support/raw_docker.rs"]
mod raw_docker;
use mcp_client::McpClient;
use raw_docker::Engine;

/// The runtime image of every sandbox (static busybox).
const IMAGE: &str = "aegis-runtime/busybox:1";
/// The user the bare exec runs as (the sandbox's unprivileged user).
const SANDBOX_USER: &str = "65534:65534";
/// Label of containers this benchmark makes (the raw client's cleanup looks for it).
const BENCH_LABEL: &str = "org.aegis.bench-run";
/// The file `fs.read` reads.
const READ_PATH: &str = "/workspace/load/64k.txt";
const READ_BYTES: usize = 64 * 1024;

#[derive(Parser, Clone)]
#[command(about = "Concurrent load on REST, SEAL and MCP, beside bare Docker exec")]
struct Args {
    /// Concurrent clients.
    #[arg(long, default_value_t = 50)]
    clients: usize,
    /// Measured seconds per row.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Unmeasured warm-up seconds before each row.
    #[arg(long, default_value_t = 1)]
    warmup: u64,
    /// Sandboxes the sandbox workloads are spread over.
    #[arg(long, default_value_t = 10)]
    sandboxes: usize,
    /// Transports, comma-separated: rest, seal-http, seal-grpc, mcp.
    #[arg(
        long,
        default_value = "rest,seal-http,seal-grpc,mcp",
        value_delimiter = ','
    )]
    transports: Vec<String>,
    /// Workloads, comma-separated: runtime, cmd, read.
    #[arg(long, default_value = "runtime,cmd,read", value_delimiter = ',')]
    workloads: Vec<String>,
    /// Also print, per row, the CPU time each process spent per call (from /proc): stable on a
    /// shared machine where rates are not.
    #[arg(long)]
    cpu: bool,
    /// How calls reach the executors, comma-separated, measured one after the other in this
    /// run: `socket` (the direct channel) and `attach` (Docker's attach stream, the fallback).
    #[arg(long, default_value = "socket,attach", value_delimiter = ',')]
    channels: Vec<String>,
    /// Where the node and PostgreSQL sit among the CPU groups: `compose` (each in a group of
    /// its own beside the sandboxes', as `docker compose up` runs them; root and a cgroupfs
    /// layout needed, else the host's stays) or `host` (where they were started).
    #[arg(long, default_value = "compose")]
    layout: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("load_bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn say(msg: impl std::fmt::Display) {
    eprintln!("[load] {msg}");
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// What one row measured.
#[derive(Default)]
struct Stats {
    samples: Vec<Duration>,
    errors: usize,
    first_error: Option<String>,
    elapsed: Duration,
}

impl Stats {
    fn calls(&self) -> usize {
        self.samples.len() + self.errors
    }

    fn rate(&self) -> f64 {
        self.samples.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn pct(&self, q: f64) -> f64 {
        if self.samples.is_empty() {
            return f64::NAN;
        }
        let mut s = self.samples.clone();
        s.sort();
        let i = ((s.len() as f64 * q).ceil() as usize).clamp(1, s.len()) - 1;
        s[i].as_secs_f64() * 1000.0
    }
}

/// One call of a client: `Ok` when the answer was the expected one.
type CallFn = Arc<
    dyn Fn(usize) -> futures_util::future::BoxFuture<'static, Result<()>> + Send + Sync + 'static,
>;

/// `clients` tasks call `call` back to back until `secs` are over.
async fn drive(clients: usize, secs: u64, call: CallFn) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut s = Stats::default();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    match call(i).await {
                        Ok(()) => s.samples.push(t.elapsed()),
                        Err(e) => {
                            s.errors += 1;
                            s.first_error.get_or_insert_with(|| format!("{e:#}"));
                        }
                    }
                }
                s
            })
        })
        .collect();
    let mut all = Stats::default();
    for t in tasks {
        match t.await {
            Ok(s) => {
                all.samples.extend(s.samples);
                all.errors += s.errors;
                if all.first_error.is_none() {
                    all.first_error = s.first_error;
                }
            }
            Err(e) => {
                all.errors += 1;
                all.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    all.elapsed = started.elapsed();
    all
}

/// Processes whose CPU time `--cpu` shows (everything else on the machine is a neighbour).
const CPU_NAMES: [&str; 10] = [
    "this process",
    "postgres (ours)",
    "dockerd",
    "containerd",
    "executor (ours)",
    "fork-server (ours)",
    "in sandboxes (ours)",
    "fuse-overlayfs",
    "runc",
    "docker-proxy",
];

/// Warm-up, then the measured row; with `--cpu`, where the CPU time of the row went.
async fn measure(args: &Args, db_name: &str, call: CallFn) -> (Stats, Option<String>) {
    if args.warmup > 0 {
        drive(args.clients, args.warmup, call.clone()).await;
    }
    let before = args.cpu.then(|| cpu_account::snapshot(db_name));
    let machine_before = machine_ticks();
    let stats = drive(args.clients, args.seconds, call).await;
    let steal = steal_note(machine_before, machine_ticks());
    let cpu = before.map(|before| {
        let spent = cpu_account::spent(&before, &cpu_account::snapshot(db_name));
        cpu_account::per_call(&spent, stats.samples.len(), &CPU_NAMES)
    });
    let note = match (cpu, steal) {
        (Some(c), Some(s)) => Some(format!("{c}; {s}")),
        (c, s) => c.or(s),
    };
    (stats, note)
}

/// (all ticks, stolen ticks) of the machine so far, from the `cpu` line of /proc/stat.
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    Some((fields.iter().take(8).sum(), *fields.get(7)?))
}

/// On a virtual machine the hypervisor may give our CPUs to another guest ("steal"): rates then
/// fall while nothing of ours changed. Named with the row when it took 2% or more.
fn steal_note(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<String> {
    let ((total0, steal0), (total1, steal1)) = (before?, after?);
    let share = (steal1 - steal0) as f64 * 100.0 / (total1 - total0).max(1) as f64;
    (share >= 2.0)
        .then(|| format!("the hypervisor took {share:.0}% of the machine's CPU time (steal)"))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    RuntimeList,
    CmdTrue,
    FsRead,
}

impl Workload {
    const ALL: [Workload; 3] = [Workload::RuntimeList, Workload::CmdTrue, Workload::FsRead];

    /// The `--workloads` name.
    fn key(self) -> &'static str {
        match self {
            Workload::RuntimeList => "runtime",
            Workload::CmdTrue => "cmd",
            Workload::FsRead => "read",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Workload::RuntimeList => "aegis.runtime.list",
            Workload::CmdTrue => "cmd.run true",
            Workload::FsRead => "fs.read 64 KiB",
        }
    }

    fn call(self) -> (&'static str, Value) {
        match self {
            Workload::RuntimeList => ("aegis.runtime.list", json!({})),
            Workload::CmdTrue => ("cmd.run", json!({"command": "true"})),
            Workload::FsRead => ("fs.read", json!({"path": READ_PATH})),
        }
    }

    /// Checks a structured result.
    fn check(self, out: &Value) -> Result<()> {
        let ok = match self {
            Workload::RuntimeList => out.is_object() || out.is_array(),
            Workload::CmdTrue => out["exit_code"] == 0,
            Workload::FsRead => out["content"].as_str().map(str::len) == Some(READ_BYTES),
        };
        if !ok {
            let mut text = out.to_string();
            text.truncate(300);
            bail!("{}: unexpected result {text}", self.label());
        }
        Ok(())
    }
}

/// The MCP result shape (`isError`, `structuredContent`) checked for a workload.
fn check_mcp(w: Workload, result: &Value) -> Result<()> {
    if result["isError"] != false {
        let mut text = result.to_string();
        text.truncate(300);
        bail!("{}: tool error {text}", w.label());
    }
    w.check(&result["structuredContent"])
}

/// The orchestrator under load and what the clients need to reach it.
struct Node {
    state: AppState,
    http_base: String,
    grpc_base: String,
    admin_key: String,
    http: reqwest::Client,
    /// The sandboxes REST calls use (made through `POST /v1/sandboxes`).
    sandboxes: Vec<uuid::Uuid>,
}

impl Node {
    async fn rest(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let node = (self.http_base.as_str(), self.admin_key.as_str());
        bench_node::admin_rest(&self.http, node, method, path, |req| match body {
            Some(b) => req.json(&b),
            None => req,
        })
        .await
    }

    /// Deletes the REST sandboxes this node made (failures are left to the cleanup by label).
    async fn delete_sandboxes(&self) {
        for id in &self.sandboxes {
            let _ = self
                .rest(
                    reqwest::Method::DELETE,
                    &format!("/v1/sandboxes/{id}"),
                    None,
                )
                .await;
        }
    }

    async fn deploy_agent_yaml(&self, yaml: String) -> Result<()> {
        let r = self
            .http
            .post(format!("{}/v1/agents", self.http_base))
            .bearer_auth(&self.admin_key)
            .header("content-type", "application/yaml")
            .body(yaml)
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("deploying the agent: {}: {}", r.status(), r.text().await?);
        }
        Ok(())
    }
}

fn agent_manifest(name: &str) -> String {
    AgentManifest::new(name)
        .instruction("Load benchmark.")
        .tools(&["cmd.run", "fs.read", "fs.write"])
        .cmd_allowing(&["true", "cat"])
        .filesystem(&["/workspace"], &["/workspace"])
        .yaml()
}

fn content_64k() -> String {
    let line = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_\n";
    line.repeat(READ_BYTES / line.len())
}

/// The calls of one transport, or why it is skipped.
enum Door {
    Rest,
    Seal(Vec<Arc<SealClient>>),
    /// One MCP session per sandbox (each session has its own), under a key bound to `load`.
    Mcp(Vec<Arc<McpClient>>),
}

async fn open_door(node: &Arc<Node>, args: &Args, name: &str) -> Result<Door, String> {
    match name {
        "rest" => Ok(Door::Rest),
        "seal-http" | "seal-grpc" => {
            let mut clients = Vec::new();
            for i in 0..args.sandboxes {
                let transport = if name == "seal-http" {
                    SealTransport::Http(node.http_base.clone())
                } else {
                    SealTransport::Grpc(node.grpc_base.clone())
                };
                let mut c = SealClient::new(transport).map_err(|e| e.to_string())?;
                c.attest(&format!("load-{name}-{i}"), "load")
                    .await
                    .map_err(|e| format!("attestation: {e}"))?;
                // The session's sandbox is made on its first sandbox call: the file to read.
                let out = c
                    .call_tool(
                        "fs.write",
                        json!({"path": READ_PATH, "content": content_64k()}),
                    )
                    .await
                    .map_err(|e| format!("fs.write over {name}: {e}"))?;
                if out["isError"] != false {
                    return Err(format!("fs.write over {name} failed: {out}"));
                }
                clients.push(Arc::new(c));
            }
            Ok(Door::Seal(clients))
        }
        "mcp" => {
            let probe = node
                .http
                .post(format!("{}/mcp", node.http_base))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if probe.status() == reqwest::StatusCode::NOT_FOUND {
                return Err("this build serves no /mcp endpoint (404); MCP rows skipped".into());
            }
            let key = node
                .rest(
                    reqwest::Method::POST,
                    "/v1/api-keys",
                    Some(
                        json!({"name": "load-mcp", "role": "readonly", "security_context": "load"}),
                    ),
                )
                .await
                .map_err(|e| format!("a key bound to the `load` context: {e:#}"))?;
            let key = key["key"]
                .as_str()
                .ok_or_else(|| format!("POST /v1/api-keys answered without a key: {key}"))?
                .to_owned();
            let mut clients = Vec::new();
            for _ in 0..args.sandboxes {
                let c = McpClient::connect(
                    node.http.clone(),
                    format!("{}/mcp", node.http_base),
                    key.clone(),
                )
                .await
                .map_err(|e| format!("{e:#}"))?;
                // The session's sandbox is made on its first sandbox call: the file to read.
                let out = c
                    .call_tool(
                        "fs.write",
                        json!({"path": READ_PATH, "content": content_64k()}),
                    )
                    .await
                    .map_err(|e| format!("fs.write over MCP: {e:#}"))?;
                if out["isError"] != false {
                    return Err(format!("fs.write over MCP failed: {out}"));
                }
                clients.push(Arc::new(c));
            }
            Ok(Door::Mcp(clients))
        }
        other => Err(format!("unknown transport `{other}`")),
    }
}

fn door_call(node: &Arc<Node>, door: &Door, w: Workload) -> CallFn {
    let (tool, arguments) = w.call();
    match door {
        Door::Rest => {
            let node = node.clone();
            Arc::new(move |i| {
                let node = node.clone();
                let arguments = arguments.clone();
                Box::pin(async move {
                    let mut body = json!({"name": tool, "arguments": arguments});
                    if w != Workload::RuntimeList {
                        body["sandbox_id"] = json!(node.sandboxes[i % node.sandboxes.len()]);
                    }
                    let out = node
                        .rest(reqwest::Method::POST, "/v1/tools/call", Some(body))
                        .await?;
                    check_mcp(w, &out)
                })
            })
        }
        Door::Seal(clients) => {
            let clients = clients.clone();
            Arc::new(move |i| {
                let client = clients[i % clients.len()].clone();
                let arguments = arguments.clone();
                Box::pin(async move {
                    let out = client
                        .call_tool(tool, arguments)
                        .await
                        .map_err(|e| anyhow!("{e}"))?;
                    check_mcp(w, &out)
                })
            })
        }
        Door::Mcp(clients) => {
            let clients = clients.clone();
            Arc::new(move |i| {
                let client = clients[i % clients.len()].clone();
                let arguments = arguments.clone();
                Box::pin(async move {
                    let out = client.call_tool(tool, arguments).await?;
                    check_mcp(w, &out)
                })
            })
        }
    }
}

fn bare_call(engine: &Arc<Engine>, containers: &[String], w: Workload) -> CallFn {
    let engine = engine.clone();
    let containers = containers.to_vec();
    Arc::new(move |i| {
        let engine = engine.clone();
        let container = containers[i % containers.len()].clone();
        Box::pin(async move {
            let argv: &[&str] = match w {
                Workload::FsRead => &["cat", READ_PATH],
                _ => &["/bin/true"],
            };
            let out = engine.exec(&container, argv).await?;
            if out.exit_code != 0 {
                bail!(
                    "bare exec exited {}: {}",
                    out.exit_code,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            if w == Workload::FsRead && out.stdout.len() != READ_BYTES {
                bail!("bare cat gave {} bytes", out.stdout.len());
            }
            Ok(())
        })
    })
}

struct Row {
    workload: Workload,
    way: String,
    stats: Stats,
    /// `--cpu`: CPU per call by process.
    cpu: Option<String>,
}

async fn run(args: Args) -> Result<()> {
    if args.clients == 0 || args.sandboxes == 0 || args.seconds == 0 {
        bail!("--clients, --sandboxes and --seconds must be at least 1");
    }
    if let Some(w) = args
        .workloads
        .iter()
        .find(|k| !Workload::ALL.iter().any(|w| w.key() == k.as_str()))
    {
        bail!("--workloads: unknown workload `{w}` (runtime, cmd, read)");
    }
    if let Some(c) = args
        .channels
        .iter()
        .find(|c| !matches!(c.as_str(), "socket" | "attach"))
    {
        bail!("--channels: unknown channel `{c}` (socket, attach)");
    }
    let admin_url = std::env::var("DATABASE_URL")
        .map_err(|_| anyhow!("DATABASE_URL is not set (scripts/load_bench.sh provides one)"))?;
    let executor = PathBuf::from(std::env::var("SANDBOX_EXECUTOR_BIN").map_err(|_| {
        anyhow!("SANDBOX_EXECUTOR_BIN is not set (scripts/load_bench.sh builds the executor)")
    })?);
    let engine = Arc::new(Engine::from_env()?);

    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let db_name = format!("load_{run_id}");
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&admin_url)
        .await
        .context("cannot reach PostgreSQL at DATABASE_URL")?;
    let layout = match args.layout.as_str() {
        "host" => Err("the host's, as started (--layout host)".to_owned()),
        "compose" => {
            let backend: Option<i32> = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&admin)
                .await
                .ok();
            cpu_groups::compose(backend).map_err(|why| format!("the host's, as started: {why}"))
        }
        other => bail!("--layout is compose or host, not {other:?}"),
    };
    let layout_note = match &layout {
        Ok(layout) => layout.description.clone(),
        Err(why) => why.clone(),
    };
    say(format!("CPU groups: {layout_note}"));
    sqlx::query(&format!("CREATE DATABASE {db_name}"))
        .execute(&admin)
        .await
        .context("CREATE DATABASE (the role in DATABASE_URL needs CREATEDB)")?;
    let mut url = url::Url::parse(&admin_url)?;
    url.set_path(&db_name);

    let (mut c, admin_key) = bench_node::bench_config(url.as_str(), &executor)?;
    // The direct channel's host directory (this process is the node, on the Docker host).
    c.sandbox.channel_dir = Some(PathBuf::from(format!("/run/aegis-bench/{}", &run_id[..8])));
    c.sandbox.pool = BTreeMap::from([(IMAGE.to_owned(), 0)]);
    c.seal.attest_per_minute_node = 10_000;
    c.seal.attest_per_minute_per_source = 10_000;
    c.seal.security_contexts = vec![json!({
        "name": "load", "description": "load benchmark",
        "runtime": {"language": "busybox", "version": "1"},
        "capabilities": [
            {"tool_pattern": "aegis.runtime.list"},
            {"tool_pattern": "cmd.run", "command_allowlist": ["true"]},
            {"tool_pattern": "fs.*", "path_allowlist": ["/workspace/load/*"]}],
        "attestation": {"workload_patterns": ["load-*"], "allow_unverified": true}})];
    let (app, state) = bench_node::built_node(c).await?;
    let http_base = format!("http://{}", app.http_addr());
    let grpc_base = format!("http://{}", app.grpc_addr());
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(app.run(shutdown.clone()));

    let mut node = Node {
        state,
        http_base,
        grpc_base,
        admin_key,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(args.clients * 2)
            .build()?,
        sandboxes: Vec::new(),
    };
    let outcome = tokio::select! {
        outcome = measure_all(&args, &mut node, &engine, &db_name, &layout_note) => outcome,
        why = interrupt::interrupted() => Err(anyhow!("interrupted by {why}")),
    };

    say("stopping the orchestrator");
    let scope = bench_node::label_scope(&node.state);
    node.delete_sandboxes().await;
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(90), server).await;
    if let Err(e) = engine.remove_labelled(scope.as_deref(), &run_id).await {
        say(format!("cleanup: {e:#}"));
    }
    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"))
        .execute(&admin)
        .await;
    drop(layout);
    outcome
}

async fn measure_all(
    args: &Args,
    node: &mut Node,
    engine: &Arc<Engine>,
    db_name: &str,
    layout_note: &str,
) -> Result<()> {
    node.deploy_agent_yaml(agent_manifest("load-agent")).await?;
    let rows_before = audit_rows(node).await?;
    let load_before = loadavg();
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for (pass, channel) in args.channels.iter().enumerate() {
        let dispatcher = node
            .state
            .sandboxes
            .dispatcher()
            .map_err(|e| anyhow!("sandboxes unavailable: {e}"))?;
        dispatcher.set_socket_channel(channel == "socket");
        let pass = Pass {
            channel,
            first: pass == 0,
        };
        measure_pass(args, node, engine, db_name, pass, &mut rows, &mut notes).await?;
    }
    let load_after = loadavg();
    let rows_after = audit_rows(node).await?;
    report(
        args,
        node,
        rows,
        notes,
        (rows_before, rows_after),
        (load_before, load_after),
        layout_note,
    )
    .await
}

/// One channel's turn: its sandboxes and doors, its rows.
struct Pass<'a> {
    channel: &'a str,
    /// The first pass also measures what no channel changes (`aegis.runtime.list`, bare exec).
    first: bool,
}

async fn measure_pass(
    args: &Args,
    node: &mut Node,
    engine: &Arc<Engine>,
    db_name: &str,
    pass: Pass<'_>,
    rows: &mut Vec<Row>,
    notes: &mut Vec<String>,
) -> Result<()> {
    let expected = if pass.channel == "socket" {
        dispatcher::Transport::Socket
    } else {
        dispatcher::Transport::Attach
    };
    say(format!(
        "making {} sandboxes for REST ({} channel)",
        args.sandboxes, pass.channel
    ));
    let first_sandbox = node.sandboxes.len();
    for _ in 0..args.sandboxes {
        let created = node
            .rest(
                reqwest::Method::POST,
                "/v1/sandboxes",
                Some(json!({"agent": "load-agent"})),
            )
            .await?;
        let id: uuid::Uuid = created["sandbox_id"]
            .as_str()
            .ok_or_else(|| anyhow!("POST /v1/sandboxes answered without sandbox_id: {created}"))?
            .parse()?;
        node.sandboxes.push(id);
        let transport = node
            .state
            .sandboxes
            .dispatcher()
            .ok()
            .and_then(|d| d.transport(dispatcher::SandboxId(id)));
        if transport != Some(expected) {
            bail!("sandbox {id} is served over {transport:?}, not the {} channel (is this run root, and the channel directory usable?)", pass.channel);
        }
        let out = node
            .rest(
                reqwest::Method::POST,
                "/v1/tools/call",
                Some(json!({"name": "fs.write", "sandbox_id": id,
                            "arguments": {"path": READ_PATH, "content": content_64k()}})),
            )
            .await?;
        if out["isError"] != false {
            bail!("fs.write of the 64 KiB file failed: {out}");
        }
    }
    let node = Arc::new(Node {
        state: node.state.clone(),
        http_base: node.http_base.clone(),
        grpc_base: node.grpc_base.clone(),
        admin_key: node.admin_key.clone(),
        http: node.http.clone(),
        sandboxes: node.sandboxes[first_sandbox..].to_vec(),
    });
    let containers: Vec<String> = node
        .sandboxes
        .iter()
        .map(|id| format!("aegis-sbx-{id}"))
        .collect();

    let mut doors = Vec::new();
    for name in &args.transports {
        match open_door(&node, args, name).await {
            Ok(d) => doors.push((name.clone(), d)),
            Err(note) => notes.push(format!("{name} ({}): {note}", pass.channel)),
        }
    }

    for w in Workload::ALL
        .into_iter()
        .filter(|w| args.workloads.iter().any(|k| k == w.key()))
        .filter(|w| pass.first || *w != Workload::RuntimeList)
    {
        for (name, door) in &doors {
            let way = if w == Workload::RuntimeList {
                name.clone()
            } else {
                format!("{name} {}", pass.channel)
            };
            say(format!("{} over {way}", w.label()));
            let (stats, cpu) = measure(args, db_name, door_call(&node, door, w)).await;
            rows.push(Row {
                workload: w,
                way,
                stats,
                cpu,
            });
        }
        if w != Workload::RuntimeList && pass.first {
            say(format!("{}: bare Docker exec", w.label()));
            let (stats, cpu) = measure(args, db_name, bare_call(engine, &containers, w)).await;
            rows.push(Row {
                workload: w,
                way: "bare docker exec".into(),
                stats,
                cpu,
            });
        }
    }
    // Ending the SEAL and MCP sessions destroys their sandboxes.
    for (_, door) in &doors {
        if let Door::Mcp(clients) = door {
            for c in clients {
                if let Err(e) = c.close().await {
                    say(format!("ending MCP session {}: {e:#}", c.session()));
                }
            }
        }
        if let Door::Seal(clients) = door {
            for c in clients {
                if let Some(id) = c.session_id() {
                    let _ = node
                        .rest(
                            reqwest::Method::DELETE,
                            &format!("/v1/seal/sessions/{id}"),
                            None,
                        )
                        .await;
                }
            }
        }
    }
    // This pass's REST sandboxes go too: the next pass makes its own.
    node.delete_sandboxes().await;
    Ok(())
}

/// Prints the table, the audit check and the target lines.
async fn report(
    args: &Args,
    node: &Node,
    rows: Vec<Row>,
    notes: Vec<String>,
    (rows_before, rows_after): (i64, i64),
    (load_before, load_after): (String, String),
    layout_note: &str,
) -> Result<()> {
    let verified = node
        .rest(reqwest::Method::GET, "/v1/audit/verify", None)
        .await?;

    println!(
        "\nLoad: {} clients, {} s per row after {} s of warm-up, {} sandboxes; load average {} before, {} after ({} cores)\n",
        args.clients,
        args.seconds,
        args.warmup,
        args.sandboxes,
        load_before,
        load_after,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("CPU groups: {layout_note}\n");
    println!(
        "{:<20} {:<22} {:>8} {:>10} {:>9} {:>9} {:>7}",
        "workload", "way", "calls", "calls/s", "p50 ms", "p99 ms", "errors"
    );
    let mut audited_calls = 0;
    for r in &rows {
        println!(
            "{:<20} {:<22} {:>8} {:>10.0} {:>9.2} {:>9.2} {:>7}",
            r.workload.label(),
            r.way,
            r.stats.calls(),
            r.stats.rate(),
            r.stats.pct(0.5),
            r.stats.pct(0.99),
            r.stats.errors
        );
        if let Some(e) = &r.stats.first_error {
            println!("    first error: {e}");
        }
        if let Some(cpu) = &r.cpu {
            println!("    {cpu}");
        }
        if r.way != "bare docker exec" {
            audited_calls += r.stats.calls();
        }
    }
    for n in &notes {
        println!("skipped {n}");
    }
    println!(
        "\nAudit: {} tool rows written during the rows (warm-up calls included; each call that \
         runs leaves an intent and a completion); at least {} measured calls; chain verification: {}",
        rows_after - rows_before,
        audited_calls,
        if verified["valid"] == true {
            "valid".to_owned()
        } else {
            format!("NOT VALID: {verified}")
        }
    );

    let verdict = |b: bool| if b { "met" } else { "NOT met" };
    println!();
    for r in rows.iter().filter(|r| r.way != "bare docker exec") {
        let (target, label) = match r.workload {
            Workload::RuntimeList => (3000.0, ">= 3000 audited aegis.* calls/s"),
            Workload::CmdTrue => (500.0, ">= 500 cmd.run true/s over 10 sandboxes"),
            Workload::FsRead => (0.0, "no throughput target"),
        };
        let p99 = r.stats.pct(0.99);
        let met = r.stats.rate() >= target && p99 <= 50.0 && r.stats.errors == 0;
        println!(
            "TARGET {:<16} {:<16} {label}, p99 <= 50 ms, 0 errors: {} ({:.0}/s, p99 {:.1} ms, {} errors)",
            r.workload.label(),
            r.way,
            verdict(met),
            r.stats.rate(),
            p99,
            r.stats.errors
        );
    }
    Ok(())
}

/// Tool rows in the audit log so far.
async fn audit_rows(node: &Node) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE kind = 'tool'")
            .fetch_one(&node.state.pool)
            .await?,
    )
}
