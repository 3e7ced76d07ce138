//! The isolation-class benchmark (issue 44): the same calls against a container sandbox (runc on
//! the host's kernel) and a gVisor sandbox (`runsc`, a kernel of its own), measured in one run on
//! one Docker engine and printed as ratios, gVisor over container (never asserted: DESIGN.md §7).
//!
//! Both classes run on the runsc-enabled engine `scripts/lib/gvisor_engine.sh` starts beside the
//! host's (`--engine`), so the only difference between the rows is the runtime: a node of each
//! class is started in turn in this process, each on its own database. Rows, each against
//! `aegis-runtime/busybox:1` through REST (`POST /v1/sandboxes`, `POST /v1/tools/call`):
//! - create -> first `cmd.run` answered, from a warm pool of one (`sandbox.pool`) and cold;
//! - `cmd.run true`;
//! - `fs.read` of a 1 MiB file;
//! - a 64 MiB upload, as 64 `fs.write` calls of 1 MiB (the first replaces, the rest append);
//! - what one idle sandbox costs the host: the proportional set size (PSS) of every host process
//!   in its memory cgroup (for gVisor: the sentry, the gofer and their ptrace stubs, with the
//!   guest's memory that the sentry maps; for runc: the executor), read from `/proc`;
//! - through the E2B door and E2B's own SDK (`support/pause_bench_client.py`, template `base`,
//!   a fresh sandbox each time): `pause()` then `connect()` of a sandbox whose Python REPL holds
//!   256 MiB (gVisor keeps its processes and memory; the container class keeps its files only),
//!   and `fork(count=1)` of one (gVisor: with its memory; container: its files).
//!
//! Run it with `scripts/isolation_bench.sh [--iterations N] [--uploads M] [--pauses P]`. Everything it makes is removed at
//! the end (each node destroys its sandboxes at shutdown; the databases are dropped).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use base64::Engine as _;
use clap::Parser;
use dispatcher::Isolation;
use serde_json::{json, Value};

#[path = "support/bench_node.rs"]
mod bench_node;
#[path = "support/entry.rs"]
mod entry;

use bench_node::{interrupt, sdk_driver, BenchDb, RunningApp};

/// The runtime measured, and its image.
const RUNTIME: &str = "busybox:1";
const IMAGE: &str = "aegis-runtime/busybox:1";

/// Command-line options.
#[derive(Parser, Debug)]
#[command(about = "Benchmarks gVisor sandboxes against container sandboxes on one engine")]
struct Args {
    /// The runsc-enabled Docker engine (`unix:///run/aegis-gvisor/docker.sock`, printed by
    /// `scripts/lib/gvisor_engine.sh start`).
    #[arg(long)]
    engine: String,
    /// Measured creates of each kind and class; the call rows take ten times as many.
    #[arg(long, default_value_t = 10)]
    iterations: usize,
    /// Measured 64 MiB uploads per class.
    #[arg(long, default_value_t = 2)]
    uploads: usize,
    /// Measured pause+resume and forks of a sandbox holding 256 MiB, per class.
    #[arg(long, default_value_t = 3)]
    pauses: usize,
}

fn say(msg: impl std::fmt::Display) {
    eprintln!("[isolation-bench] {msg}");
}

#[tokio::main]
async fn main() -> ExitCode {
    entry::run("isolation-bench", run(Args::parse())).await
}

/// What one class measured: milliseconds per call of each row, and the host's bytes per
/// sandbox.
#[derive(Default)]
struct Figures {
    create_pooled: Vec<f64>,
    create_cold: Vec<f64>,
    cmd_true: Vec<f64>,
    read_1mib: Vec<f64>,
    upload_64mib: Vec<f64>,
    host_bytes: Vec<f64>,
    pause_resume_256mib: Vec<f64>,
    fork_256mib: Vec<f64>,
    /// Whether the pause (and the fork) kept the REPL's memory.
    kept_memory: Option<(bool, bool)>,
}

async fn run(args: Args) -> Result<()> {
    if args.iterations == 0 || args.uploads == 0 {
        bail!("--iterations and --uploads must be at least 1");
    }
    let (admin_url, executor) = bench_node::node_environment("scripts/isolation_bench.sh")?;
    let mut results = Vec::new();
    for class in [Isolation::Container, Isolation::Gvisor] {
        let figures = tokio::select! {
            r = measure_class(&args, &admin_url, &executor, class) => r?,
            why = interrupt::interrupted() => bail!("interrupted by {why}"),
        };
        results.push((class, figures));
    }
    print(&args, &results);
    Ok(())
}

/// Starts a node of `class` on the engine (with or without a warm pool) and measures it.
async fn measure_class(
    args: &Args,
    admin_url: &str,
    executor: &std::path::Path,
    class: Isolation,
) -> Result<Figures> {
    let mut figures = Figures::default();
    for pooled in [false, true] {
        let run_id = uuid::Uuid::new_v4().simple().to_string();
        let db = BenchDb::create(admin_url, &run_id).await?;
        say(format!(
            "{class}: a node {} a warm pool (database {})",
            if pooled { "with" } else { "without" },
            db.name
        ));
        let outcome = async {
            let app = RunningApp::start(&db, executor, |c| {
                c.docker.host = Some(args.engine.clone());
                c.sandbox.isolation = class;
                // gVisor's kernel has no Landlock (ARCHITECTURE.md, "The gVisor class"); the
                // container class keeps it, as a node of that class would.
                c.sandbox.require_landlock = class == Isolation::Container;
                c.sandbox.max_sandboxes_per_api_key = 64;
                if pooled {
                    c.sandbox.pool.insert(IMAGE.to_owned(), 1);
                }
            })
            .await?;
            let measured = if pooled {
                measure_pooled(args, &app, &mut figures).await
            } else {
                match measure_calls(args, &app, &mut figures).await {
                    Ok(()) => measure_pause(args, &app, &mut figures).await,
                    Err(e) => Err(e),
                }
            };
            app.stop().await;
            measured
        }
        .await;
        db.drop().await;
        outcome?;
    }
    Ok(figures)
}

/// A sandbox made through REST, and the client that made it.
struct Sandbox<'a> {
    app: &'a RunningApp,
    id: String,
}

impl<'a> Sandbox<'a> {
    async fn create(app: &'a RunningApp) -> Result<Sandbox<'a>> {
        let answer = app
            .http
            .post(format!("{}/v1/sandboxes", app.http_base))
            .bearer_auth(&app.admin_key)
            .json(&json!({"runtime": RUNTIME}))
            .send()
            .await?;
        let status = answer.status();
        let body: Value = answer.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("POST /v1/sandboxes answered {status}: {body}");
        }
        let id = body["sandbox_id"]
            .as_str()
            .with_context(|| format!("no id in {body}"))?
            .to_owned();
        Ok(Sandbox { app, id })
    }

    /// A tool call in this sandbox; its structured result, or why it failed.
    async fn call(&self, tool: &str, arguments: Value) -> Result<Value> {
        let answer = self
            .app
            .http
            .post(format!("{}/v1/tools/call", self.app.http_base))
            .bearer_auth(&self.app.admin_key)
            .json(&json!({"name": tool, "arguments": arguments, "sandbox_id": self.id}))
            .send()
            .await?;
        let status = answer.status();
        let body: Value = answer.json().await.unwrap_or(Value::Null);
        if !status.is_success() || body["isError"] == true {
            bail!("{tool} answered {status}: {body}");
        }
        Ok(body["structuredContent"].clone())
    }

    async fn destroy(self) -> Result<()> {
        let answer = self
            .app
            .http
            .delete(format!("{}/v1/sandboxes/{}", self.app.http_base, self.id))
            .bearer_auth(&self.app.admin_key)
            .send()
            .await?;
        if !answer.status().is_success() {
            bail!(
                "DELETE /v1/sandboxes/{} answered {}",
                self.id,
                answer.status()
            );
        }
        Ok(())
    }
}

/// Milliseconds since `start`.
fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

/// Create -> first output while the pool is empty, then the calls and the host's cost in
/// sandboxes of this class.
async fn measure_calls(args: &Args, app: &RunningApp, figures: &mut Figures) -> Result<()> {
    for _ in 0..args.iterations {
        let start = Instant::now();
        let sandbox = Sandbox::create(app).await?;
        sandbox
            .call("cmd.run", json!({"command": "echo ready"}))
            .await?;
        figures.create_cold.push(ms(start));
        sandbox.destroy().await?;
    }

    let sandbox = Sandbox::create(app).await?;
    // Warm up the channel once, then the rows.
    sandbox.call("cmd.run", json!({"command": "true"})).await?;
    for _ in 0..args.iterations * 10 {
        let start = Instant::now();
        sandbox.call("cmd.run", json!({"command": "true"})).await?;
        figures.cmd_true.push(ms(start));
    }

    let mib = "a".repeat(1 << 20);
    sandbox
        .call(
            "fs.write",
            json!({"path": "/workspace/one-mib", "content": mib}),
        )
        .await?;
    for _ in 0..args.iterations * 10 {
        let start = Instant::now();
        let read = sandbox
            .call("fs.read", json!({"path": "/workspace/one-mib"}))
            .await?;
        figures.read_1mib.push(ms(start));
        let got = read["content"].as_str().map_or(0, str::len);
        if got != 1 << 20 {
            bail!("fs.read gave {got} bytes of 1 MiB");
        }
    }

    // 1 MiB of incompressible bytes, base64 (the REST body limit is 2 MB).
    let mut chunk = vec![0u8; 1 << 20];
    for (i, b) in chunk.iter_mut().enumerate() {
        *b = (i.wrapping_mul(2_654_435_761) >> 13) as u8;
    }
    let chunk = base64::engine::general_purpose::STANDARD.encode(&chunk);
    for _ in 0..args.uploads {
        let start = Instant::now();
        for i in 0..64 {
            sandbox
                .call(
                    "fs.write",
                    json!({"path": "/workspace/upload", "content": chunk,
                           "encoding": "base64", "append": i > 0}),
                )
                .await?;
        }
        figures.upload_64mib.push(ms(start));
    }
    let listed = sandbox
        .call("cmd.run", json!({"command": "ls -l /workspace/upload"}))
        .await?;
    if !listed["stdout"]
        .as_str()
        .unwrap_or_default()
        .contains(&(64u64 << 20).to_string())
    {
        bail!("the upload is not 64 MiB: {listed}");
    }
    sandbox
        .call("fs.delete", json!({"path": "/workspace/upload"}))
        .await?;

    // The host's cost of an idle sandbox, after its calls settled.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for _ in 0..3 {
        figures
            .host_bytes
            .push(host_pss(&args.engine, &sandbox.id).await? as f64);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    sandbox.destroy().await
}

/// Create -> first output from a warm pool of one, waiting for its refill before each.
async fn measure_pooled(args: &Args, app: &RunningApp, figures: &mut Figures) -> Result<()> {
    let (within, every) = (Duration::from_secs(120), Duration::from_millis(50));
    for _ in 0..args.iterations {
        sdk_driver::pool_filled(app, IMAGE, IMAGE, within, every).await?;
        let start = Instant::now();
        let sandbox = Sandbox::create(app).await?;
        sandbox
            .call("cmd.run", json!({"command": "echo ready"}))
            .await?;
        figures.create_pooled.push(ms(start));
        sandbox.destroy().await?;
    }
    Ok(())
}

/// Pause+resume and fork of an E2B sandbox holding 256 MiB, timed by E2B's SDK in
/// `support/pause_bench_client.py`.
async fn measure_pause(args: &Args, app: &RunningApp, figures: &mut Figures) -> Result<()> {
    let key = app.operator_key("pause-bench").await?;
    let mut command = sdk_driver::command(app, &key, "examples/support/pause_bench_client.py");
    command.env("BENCH_PAUSES", args.pauses.to_string());
    let report = sdk_driver::report(command, "pause driver", "`pip install e2b`").await?;
    let series = |name: &str| sdk_driver::series(&report[name]);
    figures.pause_resume_256mib = series("pause_resume_ms");
    figures.fork_256mib = series("fork_ms");
    figures.kept_memory = Some((
        report["kept_memory"] == true,
        report["fork_kept_memory"] == true,
    ));
    Ok(())
}

/// The container's name on the engine: the dispatcher names containers after their sandbox.
async fn container_of(engine: &str, sandbox: &str) -> Result<String> {
    let out = tokio::process::Command::new("docker")
        .args(["-H", engine, "ps", "-q", "--no-trunc", "--filter"])
        .arg(format!("label=org.aegis.sandbox={sandbox}"))
        .output()
        .await
        .context("docker does not run")?;
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if id.is_empty() || id.contains('\n') {
        bail!("no single container labelled with sandbox {sandbox}: {id:?}");
    }
    Ok(id)
}

/// The summed PSS, in bytes, of every host process in the memory cgroup of `sandbox`'s
/// container (cgroup v1 or v2).
async fn host_pss(engine: &str, sandbox: &str) -> Result<u64> {
    let container = container_of(engine, sandbox).await?;
    let out = tokio::process::Command::new("docker")
        .args(["-H", engine, "inspect", "-f", "{{.State.Pid}}", &container])
        .output()
        .await
        .context("docker does not run")?;
    let pid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .with_context(|| format!("reading /proc/{pid}/cgroup"))?;
    let procs = groups
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            if controllers.split(',').any(|c| c == "memory") {
                Some(format!("/sys/fs/cgroup/memory{path}/cgroup.procs"))
            } else if controllers.is_empty() {
                Some(format!("/sys/fs/cgroup{path}/cgroup.procs"))
            } else {
                None
            }
        })
        .with_context(|| format!("no memory cgroup in /proc/{pid}/cgroup"))?;
    let pids = std::fs::read_to_string(&procs).with_context(|| format!("reading {procs}"))?;
    let mut total = 0u64;
    for p in pids.split_whitespace() {
        // A process may end between the listing and the read.
        let Ok(rollup) = std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")) else {
            continue;
        };
        let kib = rollup
            .lines()
            .find_map(|l| l.strip_prefix("Pss:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0);
        total += kib * 1024;
    }
    Ok(total)
}

/// `(p50, p95)` of a series.
fn percentiles(series: &[f64]) -> (f64, f64) {
    if series.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mut v = series.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.95))
}

fn print(args: &Args, results: &[(Isolation, Figures)]) {
    let [(_, c), (_, g)] = results else {
        return;
    };
    println!(
        "gVisor vs container sandboxes on one engine ({IMAGE}; {} creates, {} calls, {} uploads)",
        args.iterations,
        args.iterations * 10,
        args.uploads
    );
    println!(
        "{:<36} {:>20} {:>20} {:>8}  aim",
        "row (p50 / p95)", "container", "gvisor", "ratio"
    );
    let row = |name: &str, a: &[f64], b: &[f64], aim: &str| {
        let ((a50, a95), (b50, b95)) = (percentiles(a), percentiles(b));
        println!(
            "{name:<36} {a50:>8.1} / {a95:>6.1} ms {b50:>8.1} / {b95:>6.1} ms {:>7.2}x  {aim}",
            b50 / a50
        );
    };
    row(
        "create -> first output (pool)",
        &c.create_pooled,
        &g.create_pooled,
        "gvisor < 300 ms",
    );
    row(
        "create -> first output (no pool)",
        &c.create_cold,
        &g.create_cold,
        "-",
    );
    row("cmd.run true", &c.cmd_true, &g.cmd_true, "<= 2x");
    row("fs.read 1 MiB", &c.read_1mib, &g.read_1mib, "<= 2x");
    row(
        "upload 64 MiB (64 fs.write of 1 MiB)",
        &c.upload_64mib,
        &g.upload_64mib,
        "<= 2x",
    );
    let (cm, gm) = (
        percentiles(&c.host_bytes).0 / f64::from(1 << 20),
        percentiles(&g.host_bytes).0 / f64::from(1 << 20),
    );
    println!(
        "{:<36} {cm:>17.1} MiB {gm:>17.1} MiB {:>7.2}x  (PSS of its host processes)",
        "host memory of an idle sandbox",
        gm / cm
    );
    row(
        "pause+resume, 256 MiB held (E2B SDK)",
        &c.pause_resume_256mib,
        &g.pause_resume_256mib,
        "gvisor < 2000 ms",
    );
    row(
        "fork, 256 MiB held (E2B SDK)",
        &c.fork_256mib,
        &g.fork_256mib,
        "-",
    );
    let kept = |k: Option<(bool, bool)>| match k {
        Some((true, true)) => "processes and memory",
        Some((true, false)) => "memory at pause, files at fork",
        Some((false, _)) => "files only",
        None => "not measured",
    };
    println!(
        "  what they kept: container {}; gvisor {}",
        kept(c.kept_memory),
        kept(g.kept_memory)
    );
}
