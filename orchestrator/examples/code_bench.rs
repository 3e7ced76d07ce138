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
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;
use serde_json::Value;

#[path = "support/bench_node.rs"]
mod bench_node;
#[path = "support/entry.rs"]
mod entry;

use bench_node::{sdk_driver, serve_and_measure, RunningApp};

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
    let (within, every) = (Duration::from_secs(180), Duration::from_millis(100));
    sdk_driver::pool_filled(app, &pool, IMAGE, within, every).await?;
    say(format!(
        "measuring {n} creates of each kind and {m} warm round trips of each kind",
        n = args.iterations,
        m = args.iterations * 5
    ));
    let mut command = sdk_driver::command(app, &key, "examples/support/code_bench_client.py");
    command
        .env("NODE_URL", &app.http_base)
        .env("NODE_KEY", &key)
        .env("BENCH_IMAGE", IMAGE)
        .env("BENCH_POOL", &pool)
        .env("BENCH_ITERATIONS", args.iterations.to_string());
    if let Some(sdk) = &args.sdk {
        command.env("PYTHONPATH", sdk);
    }
    sdk_driver::report(command, "SDK driver", "e2b-code-interpreter and requests").await
}

fn print(args: &Args, r: &Value) {
    let row = |name: &str, ours: &str, base: &str| {
        let (p50, p95) = (
            sdk_driver::quantile(&r[ours], 0.5),
            sdk_driver::quantile(&r[ours], 0.95),
        );
        let (b50, b95) = (
            sdk_driver::quantile(&r[base], 0.5),
            sdk_driver::quantile(&r[base], 0.95),
        );
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
