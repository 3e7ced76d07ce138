//! The E2B path benchmark (issue 47): E2B's own Python SDK against a node served in this
//! process, beside the baselines it replaces, measured in one run and printed as ratios (never
//! asserted: DESIGN.md §7).
//!
//! The node has a warm pool of one `base` sandbox (`e2b.pool`); the SDK driver
//! (`support/e2b_bench_client.py`) measures, iteration by iteration against its baseline:
//! create -> first output (pooled, and made while the pool is empty) vs `docker run --rm` of the
//! same image; a command round trip vs REST `cmd.run` on a kept-alive connection; kill; 64 MiB
//! up and down vs `docker cp`. Targets (issue 47): pooled create -> first output <= 0.15x
//! `docker run --rm`, a command round trip <= 1.5x REST, up and down >= 0.5x `docker cp`, kill
//! p50 <= 20 ms.
//!
//! With `--engine <runsc-enabled engine>` the node's sandboxes run in the gVisor class there,
//! and the baselines too (`docker run --runtime runsc`, `docker cp` on that engine), so each
//! ratio compares like with like; `scripts/e2b_bench.sh --gvisor` starts such an engine.
//!
//! Run it with `scripts/e2b_bench.sh [--gvisor] [--iterations N] [--transfers M]`. Everything it
//! makes is removed at the end (the node destroys its sandboxes at shutdown; the database is
//! dropped).

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

/// The template measured, and its image.
const TEMPLATE: &str = "base";
const IMAGE: &str = "aegis-runtime/base:bookworm";

/// Command-line options.
#[derive(Parser, Debug)]
#[command(
    about = "Benchmarks the E2B door through E2B's SDK against docker run, REST and docker cp"
)]
struct Args {
    /// Measured creates (each pooled, then one made while the pool is empty); the command row
    /// takes five times as many round trips.
    #[arg(long, default_value_t = 20)]
    iterations: usize,
    /// Measured 64 MiB uploads and downloads.
    #[arg(long, default_value_t = 3)]
    transfers: usize,
    /// A runsc-enabled Docker engine (`scripts/lib/gvisor_engine.sh start` prints it): the
    /// sandboxes run in the gVisor class there, and so do the baselines' containers.
    #[arg(long)]
    engine: Option<String>,
    /// The node's `sandbox.pool_refill_delay_ms` (its default when left out): 0 measures the
    /// pooled create with its replacement made beside its first command.
    #[arg(long)]
    pool_refill_delay_ms: Option<u64>,
}

fn say(msg: impl std::fmt::Display) {
    eprintln!("[e2b-bench] {msg}");
}

#[tokio::main]
async fn main() -> ExitCode {
    entry::run("e2b-bench", run(Args::parse())).await
}

async fn run(args: Args) -> Result<()> {
    if args.iterations == 0 || args.transfers == 0 {
        bail!("--iterations and --transfers must be at least 1");
    }
    let report = serve_and_measure(
        "scripts/e2b_bench.sh",
        |c| {
            c.e2b.pool.insert(TEMPLATE.to_owned(), 1);
            c.sandbox.max_sandboxes_per_api_key = 64;
            if let Some(ms) = args.pool_refill_delay_ms {
                c.sandbox.pool_refill_delay_ms = ms;
            }
            if let Some(engine) = &args.engine {
                c.docker.host = Some(engine.clone());
                c.sandbox.isolation = dispatcher::Isolation::Gvisor;
                // gVisor's kernel has no Landlock (ARCHITECTURE.md, "The gVisor class").
                c.sandbox.require_landlock = false;
            }
        },
        async |app| measure(&args, app).await,
    )
    .await?;
    print(&args, &report);
    Ok(())
}

async fn measure(args: &Args, app: &RunningApp) -> Result<Value> {
    let key = app.operator_key("e2b-bench").await?;
    // The first pooled sandbox is made at start; the driver waits for each refill itself.
    let pool = format!("e2b:{TEMPLATE}");
    let (within, every) = (Duration::from_secs(120), Duration::from_millis(100));
    sdk_driver::pool_filled(app, &pool, IMAGE, within, every).await?;
    say(format!(
        "measuring {} creates, {} command round trips, {} transfers of 64 MiB",
        args.iterations * 2,
        args.iterations * 5,
        args.transfers
    ));
    let mut command = sdk_driver::command(app, &key, "examples/support/e2b_bench_client.py");
    command
        .env("NODE_URL", &app.http_base)
        .env("NODE_KEY", &key)
        .env("BENCH_IMAGE", IMAGE)
        .env("BENCH_POOL", &pool)
        .env("BENCH_ITERATIONS", args.iterations.to_string())
        .env("BENCH_TRANSFERS", args.transfers.to_string())
        .envs(
            args.engine
                .as_ref()
                .map(|engine| ("BENCH_DOCKER_HOST", engine.as_str())),
        )
        .envs(
            args.engine
                .as_ref()
                .map(|_| ("BENCH_DOCKER_RUNTIME", "runsc")),
        );
    sdk_driver::report(command, "SDK driver", "`pip install e2b requests`").await
}

/// The median of a series of milliseconds (the nearest rank below the middle of an even count).
fn p50(series: &Value) -> f64 {
    sdk_driver::quantile(series, 0.5)
}

fn print(args: &Args, r: &Value) {
    let row = |name: &str, ours: &str, base: &str, target: &str, lower_is_better: bool| {
        let (o, b) = (p50(&r[ours]), p50(&r[base]));
        let ratio = o / b;
        let met = target
            .parse::<f64>()
            .map(|t| {
                if lower_is_better {
                    ratio <= t
                } else {
                    ratio >= t
                }
            })
            .ok();
        let verdict = match met {
            Some(true) => format!("{} {target} met", if lower_is_better { "<=" } else { ">=" }),
            Some(false) => format!(
                "{} {target} MISSED",
                if lower_is_better { "<=" } else { ">=" }
            ),
            None => "(informational)".to_owned(),
        };
        println!("{name:<34} {o:>9.1} ms {b:>9.1} ms {ratio:>7.2}x  {verdict}");
    };
    println!(
        "E2B door vs baselines (p50, {} creates, {} transfers, {} class, pool refill delay {})",
        args.iterations,
        args.transfers,
        if args.engine.is_some() {
            "gVisor"
        } else {
            "container"
        },
        match args.pool_refill_delay_ms {
            Some(ms) => format!("{ms} ms"),
            None => "the node's default".to_owned(),
        }
    );
    println!(
        "{:<34} {:>12} {:>12} {:>8}  target",
        "row", "ours", "baseline", "ratio"
    );
    row(
        "create -> first output (pool)",
        "create_pooled",
        "docker_run",
        "0.15",
        true,
    );
    row(
        "create -> first output (no pool)",
        "create_cold",
        "docker_run",
        "-",
        true,
    );
    row(
        "command round trip vs REST",
        "sdk_command",
        "rest_command",
        "1.5",
        true,
    );
    // Throughput is the inverse of time: ours/base in MiB/s is base time / our time.
    let throughput = |name: &str, ours: &str, base: &str| {
        let (o, b) = (p50(&r[ours]), p50(&r[base]));
        let (mo, mb) = (64_000.0 / o, 64_000.0 / b);
        let ratio = mo / mb;
        println!(
            "{name:<34} {mo:>6.1} MiB/s {mb:>6.1} MiB/s {ratio:>6.2}x  >= 0.5 {}",
            if ratio >= 0.5 { "met" } else { "MISSED" }
        );
    };
    throughput("64 MiB upload vs docker cp", "upload", "docker_cp_in");
    throughput("64 MiB download vs docker cp", "download", "docker_cp_out");
    let kill = p50(&r["kill"]);
    println!(
        "{:<34} {kill:>9.1} ms {:>12} {:>8}  <= 20 ms {}",
        "kill",
        "-",
        "-",
        if kill <= 20.0 { "met" } else { "MISSED" }
    );
}
