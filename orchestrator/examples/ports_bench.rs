//! The sandbox ports benchmark (issue 45): requests/s and p50/p99 of `GET /index.html` from
//! `python3 -m http.server` in an E2B sandbox, reached through the node's sandbox port
//! (`get_host(8000)`, relayed by the sandbox's executor) and reached directly (the same client
//! loop run in the sandbox's container by `docker exec`, on its loopback address: the container
//! has no other), in one run, printed with their ratio (never asserted: DESIGN.md §7).
//!
//! Run it with `scripts/ports_bench.sh [--requests N]`. Everything it makes is removed at the
//! end (the node destroys its sandboxes at shutdown; the database is dropped).

use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::Value;

#[path = "support/bench_node.rs"]
mod bench_node;
#[path = "support/entry.rs"]
mod entry;

use bench_node::{sdk_driver, serve_and_measure, RunningApp};

/// Command-line options.
#[derive(Parser, Debug)]
#[command(
    about = "Benchmarks a sandbox port through the node against the same server reached directly"
)]
struct Args {
    /// Requests measured each way (one client connection each).
    #[arg(long, default_value_t = 500)]
    requests: usize,
}

/// The client loop, as the direct baseline runs it inside the container.
const DIRECT_LOOP: &str = r#"
import http.client, time, json, sys
n = int(sys.argv[1])
c = http.client.HTTPConnection('127.0.0.1', 8000, timeout=30)
ts = []
t0 = time.perf_counter()
for _ in range(n):
    t = time.perf_counter()
    c.request('GET', '/index.html')
    r = c.getresponse()
    r.read()
    if r.will_close:
        c.close()
        c = http.client.HTTPConnection('127.0.0.1', 8000, timeout=30)
    ts.append(time.perf_counter() - t)
tot = time.perf_counter() - t0
ts.sort()
print(json.dumps({'rps': n / tot, 'p50_ms': ts[n // 2] * 1e3, 'p99_ms': ts[min(n - 1, n * 99 // 100)] * 1e3}))
"#;

fn say(msg: impl std::fmt::Display) {
    eprintln!("[ports-bench] {msg}");
}

#[tokio::main]
async fn main() -> ExitCode {
    entry::run("ports-bench", run(Args::parse())).await
}

async fn run(args: Args) -> Result<()> {
    if args.requests < 2 {
        bail!("--requests must be at least 2");
    }
    let report = serve_and_measure(
        "scripts/ports_bench.sh",
        |c| c.e2b.domain = "sandboxes.bench".to_owned(),
        async |app| measure(&args, app).await,
    )
    .await?;
    print(&args, &report);
    Ok(())
}

async fn measure(args: &Args, app: &RunningApp) -> Result<Value> {
    let key = app.operator_key("ports-bench").await?;
    say(format!(
        "{} requests through the sandbox port",
        args.requests
    ));
    let mut command = sdk_driver::command(app, &key, "tests/python/e2b_ports_client.py");
    command
        .arg("bench")
        .env("E2B_BENCH_REQUESTS", args.requests.to_string());
    let mut report = sdk_driver::report(command, "SDK driver", "`pip install e2b`").await?;
    let sandbox = report["sandbox_id"]
        .as_str()
        .context("no sandbox in the report")?
        .to_owned();
    say("the same requests directly, in the sandbox's container (docker exec)");
    let id = uuid::Uuid::parse_str(&sandbox).context("the sandbox id is not a UUID")?;
    let container = app
        .state
        .sandboxes
        .dispatcher()?
        .get(dispatcher::SandboxId(id))
        .await?
        .container_name;
    let direct = tokio::process::Command::new("docker")
        .args([
            "exec",
            "-u",
            "65534",
            &container,
            "python3",
            "-c",
            DIRECT_LOOP,
        ])
        .arg(args.requests.to_string())
        .output()
        .await
        .context("docker exec does not run")?;
    if !direct.status.success() {
        bail!(
            "the direct loop failed: {}",
            String::from_utf8_lossy(&direct.stderr)
        );
    }
    report["direct"] =
        serde_json::from_slice(&direct.stdout).context("the direct loop's report is not JSON")?;
    Ok(report)
}

fn print(args: &Args, r: &Value) {
    let figure = |side: &str, name: &str| r[side][name].as_f64().unwrap_or(f64::NAN);
    println!(
        "\nsandbox port vs direct, GET /index.html of python3 -m http.server, {} requests each, one client connection",
        args.requests
    );
    println!(
        "{:<22} {:>12} {:>12} {:>8}",
        "row", "port", "direct", "ratio"
    );
    for (name, unit) in [("rps", "req/s"), ("p50_ms", "ms"), ("p99_ms", "ms")] {
        let (port, direct) = (figure("through_port", name), figure("direct", name));
        println!(
            "{:<22} {:>8.1} {unit:<3} {:>8.1} {unit:<3} {:>7.2}x",
            name,
            port,
            direct,
            port / direct
        );
    }
}
