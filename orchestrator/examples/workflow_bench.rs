//! The workflow benchmark: the engine's own cost per transition, beside the same steps done
//! directly through the router, measured in one run.
//!
//! Why a program and not a timed test: see `bench.rs` (DESIGN.md §7). This prints numbers and
//! says whether the targets of issue 9 are met; it exits 0 either way, non-zero only when
//! something failed.
//!
//! What runs: a real orchestrator, in-process, on its own database `bench_<uuid>`, with the
//! static executor of `SANDBOX_EXECUTOR_BIN`, `--executions` workers and System states in
//! `aegis-runtime/busybox:1`, whose sandboxes come from a warm pool filled before timing (the
//! baseline's sandboxes also exist before it is timed). Then:
//!
//! 1. **Engine**: `--executions` (default 50) runs at once of a workflow of `--states` (default
//!    20) System states `true`, each taking `always` to the next. Every state's commit is one
//!    transaction whose `state_exited` event records `work_us`, the time spent inside the state
//!    (rendering and the `cmd.run` in the execution's sandbox). For states 2..N (the first one
//!    also waits for a worker and creates the sandbox), the engine's cost of a committed
//!    transition is the time between two consecutive commits of an execution minus that work:
//!    claim-free continuation, condition evaluation, blackboard and event writes, the commit.
//!    Throughput is committed transitions per second over the same window.
//! 2. **Router baseline**: as many concurrent callers, each with its own agent sandbox, doing
//!    N-1 `cmd.run true` through `tools::invoke_in` (schema, policy, dispatcher, executor, audit
//!    row): latency per call and calls per second.
//!
//! Targets: engine overhead per committed transition p50 <= 5 ms; >= 200 transitions/s.
//!
//! Run it with `scripts/workflow_bench.sh [--executions N] [--states M]`.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use chrono::{DateTime, Utc};
use clap::Parser;
use orchestrator::caller::Caller;
use orchestrator::state::AppState;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[allow(dead_code)]
#[path = "../tests/suite/common/agent.rs"]
mod agent;
use agent::AgentManifest;
#[allow(dead_code)] // this benchmark serves its own node; it takes only the database
#[path = "support/bench_node.rs"]
mod bench_node;
use bench_node::BenchDb;
#[path = "support/entry.rs"]
mod entry;

const IMAGE: &str = "aegis-runtime/busybox:1";

/// Command-line options.
#[derive(Parser, Debug)]
#[command(about = "Measures the workflow engine's cost per transition against the router")]
struct Args {
    /// Executions run at once (and concurrent router callers in the baseline).
    #[arg(long, default_value_t = 50)]
    executions: usize,
    /// States per workflow (System `true`).
    #[arg(long, default_value_t = 20)]
    states: usize,
}

#[tokio::main]
async fn main() -> ExitCode {
    entry::run("workflow-bench", run(Args::parse())).await
}

fn say(msg: impl std::fmt::Display) {
    eprintln!("[workflow-bench] {msg}");
}

async fn run(args: Args) -> Result<()> {
    if args.executions == 0 || args.states < 2 {
        bail!("--executions must be at least 1 and --states at least 2");
    }
    let (admin_url, executor) = bench_node::node_environment("scripts/bench.sh")?;
    let db = BenchDb::create(&admin_url, &Uuid::new_v4().simple().to_string()).await?;
    say(format!("database {} created", db.name));

    let outcome = measure(&args, db.url(), &executor).await;

    db.drop().await;
    let report = outcome?;
    report.print(&args);
    Ok(())
}

struct Report {
    engine_overhead: Vec<Duration>,
    engine_cycle: Vec<Duration>,
    engine_rate: f64,
    engine_total_secs: f64,
    router_latency: Vec<Duration>,
    router_rate: f64,
}

fn pct(samples: &[Duration], p: f64) -> Duration {
    let mut v = samples.to_vec();
    v.sort();
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

impl Report {
    fn print(&self, args: &Args) {
        println!();
        println!(
            "Workflow engine: {} executions at once x {} System states (`true`), busybox",
            args.executions, args.states
        );
        println!(
            "{:<46} {:>10} {:>10} {:>12}",
            "", "p50", "p95", "per second"
        );
        println!(
            "{:<46} {:>10} {:>10} {:>12}",
            "engine overhead per committed transition",
            ms(pct(&self.engine_overhead, 0.5)),
            ms(pct(&self.engine_overhead, 0.95)),
            ""
        );
        println!(
            "{:<46} {:>10} {:>10} {:>12.0}",
            "engine: one transition incl. the state's work",
            ms(pct(&self.engine_cycle, 0.5)),
            ms(pct(&self.engine_cycle, 0.95)),
            self.engine_rate
        );
        println!(
            "{:<46} {:>10} {:>10} {:>12.0}",
            "router: cmd.run true (same concurrency)",
            ms(pct(&self.router_latency, 0.5)),
            ms(pct(&self.router_latency, 0.95)),
            self.router_rate
        );
        println!(
            "(engine samples: {}, router samples: {}; whole engine run incl. sandbox creation: {:.1} s)",
            self.engine_overhead.len(),
            self.router_latency.len(),
            self.engine_total_secs
        );
        let p50 = pct(&self.engine_overhead, 0.5);
        let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
        println!(
            "target engine overhead p50 <= 5 ms: {} ({}); target >= 200 transitions/s: {} ({:.0}/s)",
            verdict(p50 <= Duration::from_millis(5)),
            ms(p50),
            verdict(self.engine_rate >= 200.0),
            self.engine_rate
        );
    }
}

async fn measure(args: &Args, db_url: &str, executor: &std::path::Path) -> Result<Report> {
    let (mut c, _admin_key) = bench_node::bench_config(db_url, executor)?;
    c.database.max_connections = args.executions as u32 + 10;
    // System sandboxes come from a warm pool, as the baseline's sandboxes exist before it is
    // timed: both sides then measure steps, not container creation.
    c.sandbox.pool = std::collections::BTreeMap::from([(IMAGE.to_owned(), args.executions)]);
    c.workflows.workers = args.executions as u32;
    c.workflows.system_image = Some(IMAGE.to_owned());
    let (app, state) = bench_node::built_node(c).await?;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(app.run(shutdown.clone()));
    let result = async {
        let d = state.sandboxes.dispatcher()?;
        let filled = Instant::now();
        while d.pool_sizes().get(IMAGE).copied().unwrap_or(0) < args.executions {
            if filled.elapsed() > Duration::from_secs(300) {
                bail!("the warm pool did not fill within 5 minutes");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        say(format!("warm pool of {} sandboxes ready", args.executions));
        let engine = engine(args, &state).await?;
        let router = router(args, &state).await?;
        Ok::<_, anyhow::Error>((engine, router))
    }
    .await;
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(60), task).await;
    let (
        (engine_overhead, engine_cycle, engine_rate, engine_total_secs),
        (router_latency, router_rate),
    ) = result?;
    Ok(Report {
        engine_overhead,
        engine_cycle,
        engine_rate,
        engine_total_secs,
        router_latency,
        router_rate,
    })
}

fn workflow(states: usize) -> String {
    let mut y = String::from(
        "apiVersion: 100monkeys.ai/v1\nkind: Workflow\nmetadata:\n  name: bench\n  version: \"1.0.0\"\nspec:\n  initial_state: S1\n  max_total_transitions: 100\n  states:\n",
    );
    for i in 1..=states {
        y.push_str(&format!(
            "    S{i}:\n      kind: System\n      command: \"true\"\n"
        ));
        if i < states {
            y.push_str(&format!(
                "      transitions:\n        - condition: always\n          target: S{}\n",
                i + 1
            ));
        } else {
            y.push_str("      transitions: []\n");
        }
    }
    y
}

type EngineNumbers = (Vec<Duration>, Vec<Duration>, f64, f64);
/// One execution's state commits: when, and the state's own work (µs).
type Commits = Vec<(DateTime<Utc>, u64)>;

async fn engine(args: &Args, state: &AppState) -> Result<EngineNumbers> {
    let caller = Caller::system();
    let deploy = orchestrator::tools::invoke(
        state,
        &caller,
        "aegis.workflow.create",
        json!({"manifest_yaml": workflow(args.states)}),
    )
    .await?;
    deploy
        .result
        .map_err(|e| anyhow!("deploying the workflow: {}", e.message))?;
    say(format!("running {} executions", args.executions));
    let started = Instant::now();
    let runs = (0..args.executions).map(|_| {
        let state = state.clone();
        let caller = caller.clone();
        async move {
            orchestrator::tools::invoke(
                &state,
                &caller,
                "aegis.workflow.run",
                json!({"name": "bench"}),
            )
            .await?
            .result
            .map_err(|e| anyhow!("run: {}", e.message))
        }
    });
    for r in futures_util::future::join_all(runs).await {
        r?;
    }
    say(format!(
        "{} runs started in {:.2} s",
        args.executions,
        started.elapsed().as_secs_f64()
    ));
    loop {
        let live: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workflow_executions WHERE status NOT IN ('completed','failed','cancelled','timed_out')",
        )
        .fetch_one(&state.pool)
        .await?;
        if live == 0 {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("{live} executions still running after 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let total = started.elapsed().as_secs_f64();
    let failed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM workflow_executions WHERE status <> 'completed'")
            .fetch_one(&state.pool)
            .await?;
    if failed > 0 {
        let error: Option<String> = sqlx::query_scalar(
            "SELECT error FROM workflow_executions WHERE status <> 'completed' LIMIT 1",
        )
        .fetch_one(&state.pool)
        .await?;
        bail!("{failed} executions did not complete: {error:?}");
    }
    let rows: Vec<(Uuid, String, DateTime<Utc>, Value)> = sqlx::query_as(
        "SELECT execution_id, state_name, recorded_at, payload FROM workflow_execution_events \
         WHERE event_type = 'state_exited' ORDER BY execution_id, seq",
    )
    .fetch_all(&state.pool)
    .await?;
    let mut by_exec: HashMap<Uuid, Commits> = HashMap::new();
    for (id, _, at, payload) in rows {
        by_exec
            .entry(id)
            .or_default()
            .push((at, payload["work_us"].as_u64().unwrap_or(0)));
    }
    let (mut overhead, mut cycle) = (Vec::new(), Vec::new());
    let (mut first, mut last): (Option<DateTime<Utc>>, Option<DateTime<Utc>>) = (None, None);
    for commits in by_exec.values() {
        for pair in commits.windows(2) {
            let between = (pair[1].0 - pair[0].0).to_std().unwrap_or_default();
            let work = Duration::from_micros(pair[1].1);
            cycle.push(between);
            overhead.push(between.saturating_sub(work));
        }
        if let (Some(f), Some(l)) = (commits.first(), commits.last()) {
            first = Some(first.map_or(f.0, |x| x.min(f.0)));
            last = Some(last.map_or(l.0, |x| x.max(l.0)));
        }
    }
    let spread = |pick: fn(&Commits) -> Option<DateTime<Utc>>| {
        let mut v: Vec<DateTime<Utc>> = by_exec.values().filter_map(pick).collect();
        v.sort();
        match (v.first(), v.last(), first) {
            (Some(a), Some(b), Some(f)) => format!(
                "{:.2}..{:.2} s",
                (*a - f).num_milliseconds() as f64 / 1000.0,
                (*b - f).num_milliseconds() as f64 / 1000.0
            ),
            _ => "-".into(),
        }
    };
    say(format!(
        "first states committed at {}, last states at {} (from the first commit)",
        spread(|c| c.first().map(|x| x.0)),
        spread(|c| c.last().map(|x| x.0))
    ));
    let window = match (first, last) {
        (Some(f), Some(l)) => (l - f).to_std().unwrap_or_default().as_secs_f64(),
        _ => 0.0,
    };
    let rate = if window > 0.0 {
        cycle.len() as f64 / window
    } else {
        0.0
    };
    Ok((overhead, cycle, rate, total))
}

async fn router(args: &Args, state: &AppState) -> Result<(Vec<Duration>, f64)> {
    let caller = Caller::system();
    let agent = AgentManifest::new("bench-caller")
        .instruction("Run true.")
        .tools(&["cmd.run"])
        .cmd_allowing(&["true"])
        .yaml();
    orchestrator::tools::invoke(
        state,
        &caller,
        "aegis.agent.create",
        json!({"manifest_yaml": agent}),
    )
    .await?
    .result
    .map_err(|e| anyhow!("deploying the baseline agent: {}", e.message))?;
    say(format!("router baseline: {} sandboxes", args.executions));
    let mut sandboxes = Vec::new();
    for i in 0..args.executions {
        let (id, _) = state
            .sandboxes
            .create_for_agent(
                &state.pool,
                orchestrator::DEFAULT_TENANT,
                "bench-caller",
                None,
                dispatcher::Owner::new(dispatcher::OwnerKind::Operator, format!("bench-{i}")),
            )
            .await?;
        sandboxes.push(id);
    }
    let started = Instant::now();
    let calls = args.states - 1;
    let tasks = sandboxes.iter().map(|id| {
        let state = state.clone();
        let caller = caller.clone();
        let id = *id;
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            for _ in 0..calls {
                let t = Instant::now();
                let out = orchestrator::tools::invoke_in(
                    &state,
                    &caller,
                    "cmd.run",
                    json!({"command": "true"}),
                    Some(id),
                )
                .await
                .map_err(|e| anyhow!("cmd.run refused: {e}"))?;
                out.result
                    .map_err(|e| anyhow!("cmd.run failed: {}", e.message))?;
                latencies.push(t.elapsed());
            }
            Ok::<_, anyhow::Error>(latencies)
        })
    });
    let mut latencies = Vec::new();
    for r in futures_util::future::join_all(tasks).await {
        latencies.extend(r??);
    }
    let rate = latencies.len() as f64 / started.elapsed().as_secs_f64();
    for id in sandboxes {
        let _ = state.sandboxes.destroy(id).await;
    }
    Ok((latencies, rate))
}
