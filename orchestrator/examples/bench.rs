//! The sandbox benchmark: our tool-call path against a raw Docker baseline, measured in one run.
//!
//! Why a program and not timed tests (DESIGN.md §7): wall-clock numbers depend on the machine and
//! on whatever else it runs, so a test asserting on them is either flaky or meaningless. What is
//! stable is the *ratio* between our path and the raw Docker operation it replaces, measured in
//! the same run, on the same machine, interleaved iteration by iteration so background load hits
//! both sides alike. This program prints those ratios and says, per target of issue 4 point 7,
//! whether it is met; it exits 0 either way (a miss is a measurement, not an error) and non-zero
//! only when something failed.
//!
//! What runs: a real orchestrator, in-process (`Application::build` + `run`, as the integration
//! tests start it), against its own database `bench_<uuid>` on the server named by
//! `DATABASE_URL`, with the static executor of `SANDBOX_EXECUTOR_BIN`, a warm pool of
//! [`POOL_SIZE`] sandboxes of `aegis-runtime/busybox:1`, and one busybox agent sandbox made over
//! REST. Then:
//!
//! 1. `cmd.run` of `true` through the router (`tools::invoke_in` as an operator: schema, policy,
//!    dispatcher, executor, audit row) vs a bare Docker Engine exec of `/bin/true` in the same
//!    sandbox container (exec create + start, attached, + inspect for the exit code: what
//!    `docker exec` does). Target: ours/bare at p50 <= 0.25.
//! 2. `fs.read` of a 1 MiB file through the router vs a bare exec of `cat` of that file, all
//!    output captured. Target: <= 0.5.
//! 3. `Dispatcher::acquire` served by the warm pool (refilled before every iteration, so each is
//!    a hit) vs a bare create+start of an identically hardened container of the same image.
//!    Target: p50 <= 10 ms.
//! 4. Peak RSS growth of this process (the orchestrator) while a `cmd.run` prints 200 MiB under
//!    the default output cap. The peak (`VmHWM`) is reset through `/proc/self/clear_refs` first.
//!    Target: < 50 MiB.
//!
//! Informational rows show where the time goes (the dispatcher alone, the REST surface).
//!
//! The baseline speaks the Engine API over the Unix socket itself (the three requests bollard's
//! `create_exec`/`start_exec`/`inspect_exec` send), because the orchestrator crate does not depend
//! on bollard: only the dispatcher talks to Docker. A client with no pooling, no negotiation and
//! no extra layers is, if anything, a slightly *faster* baseline than `docker exec` itself.
//!
//! Everything created is removed at the end, also after an error, Ctrl-C or SIGTERM: sandboxes
//! (destroyed, then anything left with this run's scope label), baseline containers (by this
//! run's label), the database. Only the content-addressed executor volume stays; it is shared by
//! design.
//!
//! Run it with `scripts/bench.sh [--iterations N] [--pool-iterations M]`.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use dispatcher::protocol::{Op, ReadParams, RunParams};
use dispatcher::{Dispatcher, Limits, Owner, OwnerKind, SandboxId, SandboxSpec};
use orchestrator::caller::Caller;
use serde_json::{json, Value};

/// The runtime image every sandbox and baseline container runs.
const IMAGE: &str = "aegis-runtime/busybox:1";
/// Warm-pool size for [`IMAGE`].
const POOL_SIZE: usize = 3;
/// The file `fs.read` reads: exactly 1 MiB of text.
const READ_PATH: &str = "/workspace/bench/1mib.txt";
const READ_BYTES: usize = 1024 * 1024;
/// What the memory measurement makes the command print.
const FLOOD_BYTES: u64 = 200 * 1024 * 1024;
/// Label on the baseline containers, valued with this run's id, for cleanup.
const BENCH_LABEL: &str = "org.aegis.bench-run";
/// The uid:gid agent commands run as (the executor steps down to it; the bare exec uses it too).
const SANDBOX_USER: &str = "65534:65534";

/// Command-line options.
#[derive(Parser, Debug)]
#[command(
    about = "Benchmarks cmd.run, fs.read, warm-pool acquisition and output memory against a raw Docker baseline"
)]
struct Args {
    /// Measured iterations of each latency row (cmd.run, fs.read).
    #[arg(long, default_value_t = 200)]
    iterations: usize,
    /// Un-measured iterations before them.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Measured pool acquisitions (each waits for the pool to refill first).
    #[arg(long, default_value_t = 20)]
    pool_iterations: usize,
}

#[tokio::main]
async fn main() -> ExitCode {
    entry::run("bench", run(Args::parse())).await
}

fn say(msg: impl std::fmt::Display) {
    eprintln!("[bench] {msg}");
}

/// Sets up, measures, and always cleans up.
async fn run(args: Args) -> Result<()> {
    if args.iterations == 0 || args.pool_iterations == 0 {
        bail!("--iterations and --pool-iterations must be at least 1");
    }
    let admin_url = std::env::var("DATABASE_URL").map_err(|_| {
        anyhow!("DATABASE_URL is not set: give a PostgreSQL URL whose role may CREATE DATABASE (scripts/bench.sh provides one)")
    })?;
    let executor = PathBuf::from(std::env::var("SANDBOX_EXECUTOR_BIN").map_err(|_| {
        anyhow!(
            "SANDBOX_EXECUTOR_BIN is not set: build the static executor (scripts/bench.sh does)"
        )
    })?);
    if !executor.is_file() {
        bail!(
            "SANDBOX_EXECUTOR_BIN={} is not a file: build the static executor (scripts/bench.sh does)",
            executor.display()
        );
    }
    let engine = Engine::from_env()?;
    let docker_version = engine.json("GET", "/version", None).await.context(
        "the Docker engine does not answer; the benchmark needs a real engine (is dockerd running?)",
    )?;
    if engine
        .request("GET", &format!("/images/{IMAGE}/json"), None, false)
        .await?
        .status
        != 200
    {
        bail!("image {IMAGE} is missing: run `runtime-images/build.sh --only busybox`");
    }

    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let db = BenchDb::create(&admin_url, &run_id).await?;
    say(format!("database {} created", db.name));

    let outcome = async {
        let app = RunningApp::start(&db, &executor, |c| {
            c.sandbox.pool = BTreeMap::from([(IMAGE.to_owned(), POOL_SIZE)]);
        })
        .await?;
        let scope = bench_node::label_scope(&app.state);
        let measured = tokio::select! {
            r = measure(&args, &app, &engine, &run_id) => r,
            why = interrupt::interrupted() => Err(anyhow!("interrupted by {why}")),
        };
        say("stopping the orchestrator (drains the warm pool)");
        app.stop().await;
        Ok::<_, anyhow::Error>((measured, scope))
    }
    .await;

    // Safety net: whatever is still labelled with this run's scope or id goes.
    let scope = outcome.as_ref().ok().and_then(|(_, s)| s.clone());
    let leftovers = engine.remove_labelled(scope.as_deref(), &run_id).await;
    match leftovers {
        Ok(0) => {}
        Ok(n) => say(format!(
            "cleanup removed {n} leftover container(s)/volume(s)"
        )),
        Err(e) => say(format!("cleanup could not list leftovers: {e:#}")),
    }
    db.drop().await;
    say(format!("database {} dropped", db.name));

    let report = outcome?.0?;
    report.print(&args, &docker_version);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The orchestrator under test.

/// The benchmark's own calls on the node.
impl RunningApp {
    fn dispatcher(&self) -> Result<&Dispatcher> {
        Ok(self.state.sandboxes.dispatcher()?)
    }

    /// An admin REST request; returns the JSON body of a 2xx answer.
    async fn rest(&self, method: reqwest::Method, path: &str, body: RestBody) -> Result<Value> {
        let node = (self.http_base.as_str(), self.admin_key.as_str());
        bench_node::admin_rest(&self.http, node, method, path, |req| match body {
            RestBody::Json(v) => req.json(&v),
            RestBody::Yaml(s) => req.header("content-type", "application/yaml").body(s),
        })
        .await
    }
}

enum RestBody {
    Json(Value),
    Yaml(String),
}

/// The agent the measured sandbox is made for: the commands of the benchmark, the whole
/// workspace, and no output cap of its own (the server default applies).
fn agent_manifest(name: &str) -> String {
    AgentManifest::new(name)
        .instruction("Benchmark the sandbox tools.")
        .tools(&["cmd.run", "fs.read", "fs.write"])
        .cmd(&["true", "cat", "head"], 300, "")
        .filesystem(&["/workspace"], &["/workspace"])
        .yaml()
}

// ---------------------------------------------------------------------------------------------
// Measurements.

/// Latencies of one row.
#[derive(Default)]
struct Series(Vec<Duration>);

impl Series {
    fn pct(&self, p: f64) -> Duration {
        let mut v = self.0.clone();
        v.sort();
        if v.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1]
    }
    fn p50(&self) -> Duration {
        self.pct(0.50)
    }
    fn p95(&self) -> Duration {
        self.pct(0.95)
    }
    fn mean(&self) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        self.0.iter().sum::<Duration>() / self.0.len() as u32
    }
}

/// One tool measured four ways.
#[derive(Default)]
struct ToolRows {
    router: Series,
    dispatcher: Series,
    rest: Series,
    bare: Series,
}

struct MemoryResult {
    reset: bool,
    rss_before_kib: u64,
    hwm_after_kib: u64,
    elapsed: Duration,
    exit_code: i64,
    produced: u64,
    kept: usize,
    truncated: bool,
}

impl MemoryResult {
    fn growth_mib(&self) -> f64 {
        self.hwm_after_kib.saturating_sub(self.rss_before_kib) as f64 / 1024.0
    }
}

struct PoolRows {
    acquire: Series,
    hits: usize,
    bare: Series,
    miss: Series,
}

struct Report {
    cmd: ToolRows,
    read: ToolRows,
    pool: PoolRows,
    memory: MemoryResult,
    load_before: String,
    load_after: String,
}

/// The sandbox the latency rows run in.
struct Target<'a> {
    app: &'a RunningApp,
    engine: &'a Engine,
    caller: Caller,
    sandbox: SandboxId,
    container: String,
}

#[derive(Clone, Copy)]
enum Way {
    Router,
    Dispatcher,
    Rest,
    Bare,
}

const WAYS: [Way; 4] = [Way::Router, Way::Dispatcher, Way::Rest, Way::Bare];

#[derive(Clone, Copy)]
enum Tool {
    True,
    Read,
}

impl Target<'_> {
    /// A tool call through the router, as `POST /v1/tools/call` makes it; the structured result.
    async fn router(&self, name: &str, arguments: Value) -> Result<Value> {
        let outcome = orchestrator::tools::invoke_in(
            &self.app.state,
            &self.caller,
            name,
            arguments,
            Some(self.sandbox),
        )
        .await
        .map_err(|e| anyhow!("{name} refused: {e}"))?;
        outcome
            .result
            .map_err(|e| anyhow!("{name} failed: {} ({})", e.message, e.code))
    }

    /// One call of `tool` the given way, checked, and how long it took.
    async fn once(&self, tool: Tool, way: Way) -> Result<Duration> {
        let started = Instant::now();
        match (tool, way) {
            (Tool::True, Way::Router) => {
                let out = self.router("cmd.run", json!({"command": "true"})).await?;
                let elapsed = started.elapsed();
                expect(out["exit_code"] == 0, "cmd.run true via router", &out)?;
                Ok(elapsed)
            }
            (Tool::True, Way::Dispatcher) => {
                let op = Op::CmdRun(RunParams {
                    argv: vec!["true".to_owned()],
                    cwd: None,
                    env: BTreeMap::new(),
                    timeout_ms: 60_000,
                    grace_ms: None,
                    max_stdout_bytes: 1024 * 1024,
                    max_stderr_bytes: 1024 * 1024,
                    exec: Default::default(),
                    user: Default::default(),
                });
                let out = self.dispatch(op).await?;
                let elapsed = started.elapsed();
                expect(out["exit_code"] == 0, "cmd.run true via dispatcher", &out)?;
                Ok(elapsed)
            }
            (Tool::True, Way::Rest) => {
                let out = self.rest("cmd.run", json!({"command": "true"})).await?;
                let elapsed = started.elapsed();
                expect(out["exit_code"] == 0, "cmd.run true via REST", &out)?;
                Ok(elapsed)
            }
            (Tool::True, Way::Bare) => {
                let out = self.engine.exec(&self.container, &["/bin/true"]).await?;
                let elapsed = started.elapsed();
                if out.exit_code != 0 {
                    bail!("bare exec of /bin/true exited {}", out.exit_code);
                }
                Ok(elapsed)
            }
            (Tool::Read, Way::Router) => {
                let out = self.router("fs.read", json!({"path": READ_PATH})).await?;
                let elapsed = started.elapsed();
                check_read(&out, "router")?;
                Ok(elapsed)
            }
            (Tool::Read, Way::Dispatcher) => {
                let op = Op::FsRead(ReadParams {
                    path: READ_PATH.to_owned(),
                    ..ReadParams::default()
                });
                let out = self.dispatch(op).await?;
                let elapsed = started.elapsed();
                check_read(&out, "dispatcher")?;
                Ok(elapsed)
            }
            (Tool::Read, Way::Rest) => {
                let out = self.rest("fs.read", json!({"path": READ_PATH})).await?;
                let elapsed = started.elapsed();
                check_read(&out, "REST")?;
                Ok(elapsed)
            }
            (Tool::Read, Way::Bare) => {
                let out = self
                    .engine
                    .exec(&self.container, &["cat", READ_PATH])
                    .await?;
                let elapsed = started.elapsed();
                if out.exit_code != 0 || out.stdout.len() != READ_BYTES {
                    bail!(
                        "bare exec of cat exited {} with {} bytes (expected {READ_BYTES}): {}",
                        out.exit_code,
                        out.stdout.len(),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                Ok(elapsed)
            }
        }
    }

    async fn dispatch(&self, op: Op) -> Result<Value> {
        let response = self.app.dispatcher()?.call(self.sandbox, op).await?;
        response
            .into_result()
            .map_err(|e| anyhow!("executor refused: {}", e.message))
    }

    async fn rest(&self, name: &str, arguments: Value) -> Result<Value> {
        let body = json!({"name": name, "arguments": arguments, "sandbox_id": self.sandbox.0});
        let out = self
            .app
            .rest(
                reqwest::Method::POST,
                "/v1/tools/call",
                RestBody::Json(body),
            )
            .await?;
        expect(out["isError"] == false, "REST tool call", &out)?;
        Ok(out["structuredContent"].clone())
    }

    /// Warm-up, then `n` iterations of every way, in a fresh random order each iteration.
    ///
    /// A fixed or rotated order would always put the same way right after the bare exec, whose
    /// aftermath (the engine reaping the exec process) would then be charged to that way alone.
    async fn rows(&self, tool: Tool, warmup: usize, n: usize) -> Result<ToolRows> {
        let mut rows = ToolRows::default();
        let mut rng = Shuffle::seeded();
        for i in 0..warmup + n {
            let mut order = WAYS;
            rng.shuffle(&mut order);
            for way in order {
                let took = self.once(tool, way).await?;
                if i >= warmup {
                    match way {
                        Way::Router => rows.router.0.push(took),
                        Way::Dispatcher => rows.dispatcher.0.push(took),
                        Way::Rest => rows.rest.0.push(took),
                        Way::Bare => rows.bare.0.push(took),
                    }
                }
            }
        }
        Ok(rows)
    }

    /// Peak RSS growth while `head` floods stdout with 200 MiB under the default cap.
    async fn memory(&self) -> Result<MemoryResult> {
        for _ in 0..5 {
            self.once(Tool::True, Way::Router).await?;
        }
        // Writing 5 resets VmHWM to the current RSS (Linux >= 4.0), so the peak measured below is
        // this command's, not start-up's.
        let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        let before = proc_status()?;
        let started = Instant::now();
        let out = self
            .router(
                "cmd.run",
                json!({"command": format!("head -c {FLOOD_BYTES} /dev/zero"), "timeout_secs": 300}),
            )
            .await?;
        let elapsed = started.elapsed();
        let after = proc_status()?;
        let produced = out["stdout_bytes"].as_u64().unwrap_or(0);
        if produced != FLOOD_BYTES {
            bail!("the flood command reported {produced} stdout bytes, expected {FLOOD_BYTES}");
        }
        Ok(MemoryResult {
            reset,
            rss_before_kib: before.rss_kib,
            hwm_after_kib: after.hwm_kib,
            elapsed,
            exit_code: out["exit_code"].as_i64().unwrap_or(-1),
            produced,
            kept: out["stdout"].as_str().map_or(0, str::len),
            truncated: out["truncated"] == true,
        })
    }
}

/// A small xorshift generator for the measurement order (statistical quality is irrelevant here).
struct Shuffle(u64);

impl Shuffle {
    fn seeded() -> Self {
        Shuffle(uuid::Uuid::new_v4().as_u64_pair().0 | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Fisher-Yates.
    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

fn expect(ok: bool, what: &str, out: &Value) -> Result<()> {
    if ok {
        return Ok(());
    }
    let mut text = out.to_string();
    text.truncate(400);
    bail!("{what}: unexpected result {text}")
}

fn check_read(out: &Value, way: &str) -> Result<()> {
    let len = out["content"].as_str().map_or(0, str::len);
    if len != READ_BYTES || out["truncated"] == true || out["encoding"] != "utf8" {
        bail!(
            "fs.read via {way} returned {len} bytes (truncated {}, encoding {}), expected {READ_BYTES}",
            out["truncated"],
            out["encoding"]
        );
    }
    Ok(())
}

struct ProcStatus {
    rss_kib: u64,
    hwm_kib: u64,
}

fn proc_status() -> Result<ProcStatus> {
    let text = std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let field = |name: &str| -> Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| anyhow!("no {name} in /proc/self/status"))
    };
    Ok(ProcStatus {
        rss_kib: field("VmRSS:")?,
        hwm_kib: field("VmHWM:")?,
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

/// Waits until the warm pool holds `POOL_SIZE` idle sandboxes, then a moment for the last
/// container to settle, so nothing is being created while the next measurement runs.
async fn pool_full(d: &Dispatcher) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(180);
    while d.pool_sizes().get(IMAGE).copied().unwrap_or(0) < POOL_SIZE {
        if Instant::now() > deadline {
            bail!("the warm pool did not fill to {POOL_SIZE} within 180 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    Ok(())
}

/// Pool hand-out vs bare create+start, then a few pool misses for reference.
async fn pool_rows(
    d: &Dispatcher,
    engine: &Engine,
    run_id: &str,
    n: usize,
    dispatcher_limits: Limits,
) -> Result<PoolRows> {
    let warmup = 2;
    let mut rows = PoolRows {
        acquire: Series::default(),
        hits: 0,
        bare: Series::default(),
        miss: Series::default(),
    };
    let bare_body = bare_container(run_id, &dispatcher_limits);
    for i in 0..warmup + n {
        pool_full(d).await?;
        let idle: HashSet<SandboxId> = d
            .list()
            .await?
            .into_iter()
            .filter(|s| s.owner.kind == OwnerKind::Pool)
            .map(|s| s.id)
            .collect();
        let spec = SandboxSpec::new(IMAGE, Owner::new(OwnerKind::Operator, format!("bench-{i}")));
        let started = Instant::now();
        let id = d.acquire(spec).await?;
        let took = started.elapsed();
        d.destroy(id).await?;
        if i >= warmup {
            rows.acquire.0.push(took);
            rows.hits += usize::from(idle.contains(&id));
        }

        pool_full(d).await?;
        let name = format!("aegis-bench-{run_id}-{i}");
        let started = Instant::now();
        let container = engine.create_and_start(&name, &bare_body).await?;
        let took = started.elapsed();
        engine.remove_container(&container).await?;
        if i >= warmup {
            rows.bare.0.push(took);
        }
    }
    // A spec the pool cannot serve (other pids limit): the full create path, for reference.
    pool_full(d).await?;
    for i in 0..n.min(5) {
        let mut spec = SandboxSpec::new(
            IMAGE,
            Owner::new(OwnerKind::Operator, format!("bench-miss-{i}")),
        );
        spec.limits.pids = dispatcher_limits.pids / 2;
        let started = Instant::now();
        let id = d.acquire(spec).await?;
        rows.miss.0.push(started.elapsed());
        d.destroy(id).await?;
    }
    Ok(rows)
}

/// A container hardened like a sandbox (same image, capabilities, read-only root, tmpfs, limits,
/// no network), minus what only the dispatcher needs (volumes, executor, attached stdin).
fn bare_container(run_id: &str, limits: &Limits) -> Value {
    json!({
        "Image": IMAGE,
        "Entrypoint": ["/bin/sleep"],
        "Cmd": ["3600"],
        "User": SANDBOX_USER,
        "WorkingDir": "/workspace",
        "NetworkDisabled": true,
        "Labels": {BENCH_LABEL: run_id},
        "HostConfig": {
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges"],
            "ReadonlyRootfs": true,
            "Tmpfs": {"/tmp": format!("rw,noexec,nosuid,nodev,size={}", limits.tmpfs_bytes)},
            "PidsLimit": limits.pids,
            "Memory": limits.memory_bytes,
            "MemorySwap": limits.memory_bytes,
            "NanoCpus": limits.nano_cpus,
            "NetworkMode": "none",
            "IpcMode": "private",
            "Init": false,
            "LogConfig": {"Type": "none", "Config": {}},
            "ShmSize": limits.tmpfs_bytes,
        }
    })
}

/// Everything measured, in order; the measured sandbox is destroyed whatever happens.
async fn measure(args: &Args, app: &RunningApp, engine: &Engine, run_id: &str) -> Result<Report> {
    let d = app.dispatcher()?;
    say(format!("waiting for the warm pool ({POOL_SIZE} x {IMAGE})"));
    pool_full(d).await?;

    let agent = "bench-agent";
    app.rest(
        reqwest::Method::POST,
        "/v1/agents",
        RestBody::Yaml(agent_manifest(agent)),
    )
    .await?;
    let created = app
        .rest(
            reqwest::Method::POST,
            "/v1/sandboxes",
            RestBody::Json(json!({"agent": agent})),
        )
        .await?;
    let sandbox: SandboxId = created["sandbox_id"]
        .as_str()
        .ok_or_else(|| anyhow!("POST /v1/sandboxes answered without sandbox_id: {created}"))?
        .parse()?;
    let caller =
        orchestrator::auth::authenticate(&app.state.pool, &app.state.api_keys, &app.admin_key)
            .await
            .map_err(|e| anyhow!("admin key: {e}"))?;
    let target = Target {
        app,
        engine,
        caller,
        sandbox,
        container: format!("aegis-sbx-{sandbox}"),
    };

    let result = async {
        // The agent's sandbox may have come from the pool: let the refill finish first.
        pool_full(d).await?;
        let load_before = loadavg();
        say("4. memory: cmd.run printing 200 MiB");
        let memory = target.memory().await?;

        say(format!(
            "1. cmd.run true: {} + {} warm-up iterations x 4 ways",
            args.iterations, args.warmup
        ));
        let cmd = target.rows(Tool::True, args.warmup, args.iterations).await?;

        say("2. fs.read 1 MiB: writing the file");
        let line = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_\n";
        let content = line.repeat(READ_BYTES / line.len());
        let written = target
            .router("fs.write", json!({"path": READ_PATH, "content": content}))
            .await?;
        expect(
            written["bytes_written"] == READ_BYTES,
            "fs.write of 1 MiB",
            &written,
        )?;
        say(format!(
            "2. fs.read 1 MiB: {} + {} warm-up iterations x 4 ways",
            args.iterations, args.warmup
        ));
        let read = target.rows(Tool::Read, args.warmup, args.iterations).await?;

        say(format!(
            "3. pool: {} (+2 warm-up) acquisitions, each after a refill, and as many bare create+start",
            args.pool_iterations
        ));
        let limits = Limits::default();
        let pool = pool_rows(d, engine, run_id, args.pool_iterations, limits).await?;
        let load_after = loadavg();
        Ok(Report {
            cmd,
            read,
            pool,
            memory,
            load_before,
            load_after,
        })
    }
    .await;
    if let Err(e) = app.state.sandboxes.destroy(sandbox).await {
        say(format!("could not destroy sandbox {sandbox}: {e}"));
    }
    result
}

// ---------------------------------------------------------------------------------------------
// The report.

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        f64::INFINITY
    } else {
        a.as_secs_f64() / b.as_secs_f64()
    }
}

fn row(label: &str, s: &Series) {
    println!(
        "  {label:<58} {:>5} {:>12} {:>12} {:>12}",
        s.0.len(),
        ms(s.p50()),
        ms(s.p95()),
        ms(s.mean())
    );
}

fn ratio_row(label: &str, ours: &Series, bare: &Series) {
    println!(
        "  {label:<58} {:>5} {:>12.3} {:>12.3} {:>12.3}",
        "",
        ratio(ours.p50(), bare.p50()),
        ratio(ours.p95(), bare.p95()),
        ratio(ours.mean(), bare.mean())
    );
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT MET"
    }
}

impl Report {
    fn print(&self, args: &Args, docker: &Value) {
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        println!();
        println!("aegis orchestrator sandbox benchmark (orchestrator in-process, release build)");
        println!(
            "machine: {cpus} CPUs, Linux {kernel}, Docker {} (API {}); load average {} at start, {} at end",
            docker["Version"].as_str().unwrap_or("?"),
            docker["ApiVersion"].as_str().unwrap_or("?"),
            self.load_before,
            self.load_after
        );
        println!(
            "iterations: {} measured (+{} warm-up) per latency row, ways interleaved in random order; pool: {} (+2 warm-up)",
            args.iterations, args.warmup, args.pool_iterations
        );
        println!();
        println!(
            "  {:<58} {:>5} {:>12} {:>12} {:>12}",
            "", "n", "p50", "p95", "mean"
        );
        println!("1. cmd.run `true`");
        row(
            "ours: router (tools::invoke_in, operator, audited)",
            &self.cmd.router,
        );
        row(
            "  info: dispatcher.call only (no router)",
            &self.cmd.dispatcher,
        );
        row("  info: REST POST /v1/tools/call", &self.cmd.rest);
        row(
            "bare: Docker exec /bin/true (create+start+inspect)",
            &self.cmd.bare,
        );
        ratio_row("ratio ours/bare", &self.cmd.router, &self.cmd.bare);
        println!("2. fs.read of a 1 MiB file");
        row(
            "ours: router (tools::invoke_in, operator, audited)",
            &self.read.router,
        );
        row(
            "  info: dispatcher.call only (no router)",
            &self.read.dispatcher,
        );
        row("  info: REST POST /v1/tools/call", &self.read.rest);
        row(
            "bare: Docker exec cat, all output captured",
            &self.read.bare,
        );
        ratio_row("ratio ours/bare", &self.read.router, &self.read.bare);
        println!("3. sandbox acquisition");
        row(
            &format!(
                "ours: Dispatcher::acquire, warm pool ({}/{} hits)",
                self.pool.hits,
                self.pool.acquire.0.len()
            ),
            &self.pool.acquire,
        );
        row(
            "bare: Docker create+start, same image, hardened",
            &self.pool.bare,
        );
        ratio_row("ratio ours/bare", &self.pool.acquire, &self.pool.bare);
        row(
            "  info: Dispatcher::acquire, pool miss (full create+ready)",
            &self.pool.miss,
        );
        let m = &self.memory;
        println!("4. orchestrator memory while cmd.run prints 200 MiB (default output cap)");
        println!(
            "  VmRSS before {:.1} MiB, VmHWM after {:.1} MiB: peak growth {:.1} MiB{}",
            m.rss_before_kib as f64 / 1024.0,
            m.hwm_after_kib as f64 / 1024.0,
            m.growth_mib(),
            if m.reset {
                " (peak reset via /proc/self/clear_refs)"
            } else {
                " (peak NOT resettable here: upper bound, includes start-up)"
            }
        );
        println!(
            "  command: exit {}, {} bytes produced, {} kept{}, {:.2} s",
            m.exit_code,
            m.produced,
            m.kept,
            if m.truncated { " (truncated)" } else { "" },
            m.elapsed.as_secs_f64()
        );
        println!();

        let cmd_ratio = ratio(self.cmd.router.p50(), self.cmd.bare.p50());
        println!(
            "TARGET cmd.run true: ours/bare at p50 = {} / {} = {cmd_ratio:.3} (<= 0.25): {}",
            ms(self.cmd.router.p50()),
            ms(self.cmd.bare.p50()),
            verdict(cmd_ratio <= 0.25)
        );
        let read_ratio = ratio(self.read.router.p50(), self.read.bare.p50());
        println!(
            "TARGET fs.read 1 MiB: ours/bare at p50 = {} / {} = {read_ratio:.3} (<= 0.5): {}",
            ms(self.read.router.p50()),
            ms(self.read.bare.p50()),
            verdict(read_ratio <= 0.5)
        );
        let acquire = self.pool.acquire.p50();
        println!(
            "TARGET pool acquisition: p50 = {} (<= 10 ms; bare create+start p50 {}): {}",
            ms(acquire),
            ms(self.pool.bare.p50()),
            verdict(acquire <= Duration::from_millis(10))
        );
        println!(
            "TARGET RSS growth during 200 MiB of output: {:.1} MiB (< 50 MiB): {}",
            m.growth_mib(),
            verdict(m.growth_mib() < 50.0)
        );
    }
}

#[allow(dead_code)]
#[path = "../tests/suite/common/agent.rs"]
mod agent;
use agent::AgentManifest;
#[path = "support/bench_node.rs"]
mod bench_node;
#[path = "support/entry.rs"]
mod entry;
#[path = "support/raw_docker.rs"]
mod raw_docker;
use bench_node::{interrupt, BenchDb, RunningApp};
use raw_docker::Engine;
