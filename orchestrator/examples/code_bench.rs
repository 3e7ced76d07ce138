//! The code interpreter benchmark (issue 46): E2B's code-interpreter SDK against a node served
//! in this process, beside the same Python run as a command and through our own REST
//! `code.run`, measured in one run and printed as p50/p95 with ratios (never asserted:
//! DESIGN.md §7).
//!
//! The node keeps a warm pool of one `code-interpreter` sandbox (`e2b.pool`); the SDK driver
//! (`support/code_bench_client.py`) measures, iteration by iteration: create -> first
//! `run_code("1+1")` result, pooled and made while the pool is empty, beside the same create ->
//! first `commands.run("python3 -c 'print(1+1)'")` output and `docker run --rm` of the image
//! running that command; REST create -> first `code.run`; then warm round trips in one sandbox:
//! `run_code` vs `commands.run("python3 -c ...")` vs REST `code.run`.
//!
//! Run it with `scripts/code_bench.sh [--iterations N]`. Everything it makes is removed at the
//! end (the node destroys its sandboxes at shutdown; the database is dropped).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::Value;

#[path = "support/bench_node.rs"]
mod bench_node;
#[path = "support/entry.rs"]
mod entry;
#[path = "support/interrupt.rs"]
mod interrupt;

use bench_node::{serve_and_measure, RunningApp};

/// The runtime measured (E2B's template `code-interpreter-v1`), and its image.
const RUNTIME: &str = "code-interpreter";
const IMAGE: &str = "aegis-runtime/code-interpreter:1";

/// Command-line options.
#[derive(Parser, Debug)]
#[command(
    about = "Benchmarks the code interpreter through E2B's code-interpreter SDK and REST code.run \
             against commands.run and docker run"
)]
struct Args {
    /// Measured creates of each kind; the warm rows take five times as many round trips.
    #[arg(long, default_value_t = 10)]
    iterations: usize,
    /// Where E2B's code-interpreter SDK is installed (`pip install --target`), put on
    /// PYTHONPATH for the driver.
    #[arg(long)]
    sdk: Option<PathBuf>,
}

fn say(msg: impl std::fmt::Display) {
    eprintln!("[code-bench] {msg}");
}

#[tokio::main]
async fn main() -> ExitCode {
    entry::run("code-bench", run(Args::parse())).await
}

async fn run(args: Args) -> Result<()> {
    if args.iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    let report = serve_and_measure(
        "scripts/code_bench.sh",
        |c| {
            c.e2b.pool.insert(RUNTIME.to_owned(), 1);
            c.sandbox.max_sandboxes_per_api_key = 64;
        },
        async |app| measure(&args, app).await,
    )
    .await?;
    print(&args, &report);
    Ok(())
}

async fn measure(args: &Args, app: &RunningApp) -> Result<Value> {
    let key = app.operator_key("code-bench").await?;
    // The pool's first sandbox is made at start; the driver waits for each refill itself.
    let pool = format!("e2b:{RUNTIME}");
    let dispatcher = app.state.sandboxes.dispatcher()?;
    let ready = std::time::Instant::now();
    while dispatcher.pool_sizes().get(&pool).copied().unwrap_or(0) == 0 {
        if ready.elapsed() > std::time::Duration::from_secs(180) {
            bail!("the warm pool {pool} never filled (is {IMAGE} built?)");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    say(format!(
        "measuring {n} creates of each kind and {m} warm round trips of each kind",
        n = args.iterations,
        m = args.iterations * 5
    ));
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/support/code_bench_client.py"
    );
    let mut command = tokio::process::Command::new("python3");
    command
        .arg(script)
        .env("E2B_API_URL", format!("{}/e2b", app.http_base))
        .env("E2B_SANDBOX_URL", format!("{}/e2b", app.http_base))
        .env(
            "E2B_API_KEY",
            orchestrator::api::e2b::keys::to_e2b_form(&key),
        )
        .env("NODE_URL", &app.http_base)
        .env("NODE_KEY", &key)
        .env("BENCH_IMAGE", IMAGE)
        .env("BENCH_POOL", &pool)
        .env("BENCH_ITERATIONS", args.iterations.to_string());
    if let Some(sdk) = &args.sdk {
        command.env("PYTHONPATH", sdk);
    }
    let out = command.output().await.context("python3 does not run")?;
    if !out.status.success() {
        bail!(
            "the SDK driver failed (needs e2b-code-interpreter and requests): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).context("the SDK driver's report is not JSON")
}

/// The `q` quantile (nearest rank) of a series of milliseconds.
fn quantile(series: &Value, q: f64) -> f64 {
    let mut v: Vec<f64> = series
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn print(args: &Args, r: &Value) {
    let row = |name: &str, ours: &str, base: &str| {
        let (p50, p95) = (quantile(&r[ours], 0.5), quantile(&r[ours], 0.95));
        let (b50, b95) = (quantile(&r[base], 0.5), quantile(&r[base], 0.95));
        println!(
            "{name:<44} {p50:>8.1} {p95:>8.1}   {b50:>8.1} {b95:>8.1}   {:>6.2}x",
            p50 / b50
        );
    };
    println!(
        "Code interpreter through E2B's SDK and REST (ms; {} creates of each kind, {} warm round trips)",
        args.iterations,
        args.iterations * 5
    );
    println!(
        "{:<44} {:>8} {:>8}   {:>8} {:>8}   {:>7}",
        "row (baseline)", "p50", "p95", "base p50", "base p95", "ratio"
    );
    println!("create -> first result, from the warm pool:");
    row(
        "  run_code('1+1') (vs commands.run python3)",
        "create_code_pooled",
        "create_command_pooled",
    );
    row(
        "  commands.run python3 -c (vs docker run)",
        "create_command_pooled",
        "docker_run",
    );
    println!("create -> first result, pool empty:");
    row(
        "  run_code('1+1') (vs commands.run python3)",
        "create_code_cold",
        "create_command_cold",
    );
    row(
        "  run_code('1+1') (vs docker run)",
        "create_code_cold",
        "docker_run",
    );
    row(
        "  REST create + code.run (vs docker run)",
        "rest_create_code",
        "docker_run",
    );
    println!("warm round trip in one sandbox:");
    row(
        "  run_code('1+1') (vs commands.run python3)",
        "warm_code",
        "warm_command",
    );
    row(
        "  REST code.run (vs commands.run python3)",
        "warm_rest_code",
        "warm_command",
    );
}
