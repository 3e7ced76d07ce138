//! SEAL overhead per call: the same tool through a signed envelope (HTTP and gRPC: signature,
//! token, session, replay guard, context policy, audit) versus the same tool through the router
//! in-process (schema, policy, audit), measured in one run against one real service. A REST row
//! (an operator key over HTTP) shows how much of the overhead is the transport's.
//!
//! `DATABASE_URL=postgres://... cargo run --release -p orchestrator --example seal_bench [-- N]`
//! (the database named by the URL gets a scratch database of its own, dropped at the end).

use std::time::Instant;

use aegis_cli::seal_client::{SealClient, Transport};
use orchestrator::app::Application;
use orchestrator::caller::{Caller, Role};
use orchestrator::config::NodeConfig;
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[allow(dead_code)] // this benchmark serves its own node; it takes only the database
#[path = "support/bench_node.rs"]
mod bench_node;
use bench_node::BenchDb;
#[path = "support/plain.rs"]
mod plain;
use plain::percentiles;

/// The operator key this benchmark's node is configured with.
fn config_admin_key() -> String {
    format!("aok_{}", "0".repeat(64))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = plain::count_arg(300);
    let db = BenchDb::from_env().await?;

    let mut config = NodeConfig::default();
    config.server.http = "127.0.0.1:0".parse()?;
    config.server.grpc = "127.0.0.1:0".parse()?;
    config.database.url = db.url().to_owned();
    config.auth.admin_key = Some(config_admin_key());
    config.seal.attest_per_minute = 1000;
    config.seal.security_contexts = vec![json!({"name": "bench", "description": "benchmark",
        "capabilities": [{"tool_pattern": "aegis.*"}], "attestation": {"workload_patterns": ["bench-*"], "allow_unverified": true}})];
    let app = Application::build(config).await?;
    let http = format!("http://{}", app.http_addr());
    let grpc = format!("http://{}", app.grpc_addr());
    let state = app.state().clone();
    let token = CancellationToken::new();
    let server = tokio::spawn(app.run(token.clone()));

    let caller = Caller::operator(uuid::Uuid::new_v4(), "bench", Role::Admin);
    let tool = "aegis.runtime.list";
    let args = json!({});
    let mut results = Vec::new();

    // In-process router: validation, policy, handler, audit row.
    for _ in 0..20 {
        orchestrator::tools::invoke(&state, &caller, tool, args.clone()).await?;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        orchestrator::tools::invoke(&state, &caller, tool, args.clone()).await?;
        samples.push(t.elapsed());
    }
    results.push(("router in-process", percentiles(samples)));

    // The same call over REST with an operator key: HTTP's own cost, so that SEAL's overhead
    // splits into the transport's and its own (signatures, replay guard, context).
    let http_client = reqwest::Client::new();
    let admin_key = config_admin_key();
    let rest_call = || {
        http_client
            .post(format!("{http}/v1/tools/call"))
            .bearer_auth(&admin_key)
            .json(&json!({"name": tool, "arguments": args}))
            .send()
    };
    for _ in 0..20 {
        rest_call().await?.error_for_status()?;
    }
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let answer = rest_call().await?.error_for_status()?;
        answer.bytes().await?;
        samples.push(t.elapsed());
    }
    results.push(("REST (operator key)", percentiles(samples)));

    for (label, transport) in [
        ("SEAL over HTTP", Transport::Http(http)),
        ("SEAL over gRPC", Transport::Grpc(grpc)),
    ] {
        let mut client = SealClient::new(transport)?;
        client.attest("bench-1", "bench").await?;
        for _ in 0..20 {
            client.call_tool(tool, args.clone()).await?;
        }
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            client.call_tool(tool, args.clone()).await?;
            samples.push(t.elapsed());
        }
        results.push((label, percentiles(samples)));
    }

    let (base50, base95) = results[0].1;
    println!("{n} calls of {tool} each (client and server in one process, loopback)\n");
    println!(
        "{:<20} {:>10} {:>10} {:>14} {:>10}",
        "path", "p50 ms", "p95 ms", "overhead p50", "ratio"
    );
    for (label, (p50, p95)) in &results {
        println!(
            "{label:<20} {p50:>10.3} {p95:>10.3} {:>11.3} ms {:>9.2}x",
            p50 - base50,
            p50 / base50
        );
    }
    let _ = base95;

    token.cancel();
    let _ = server.await;
    db.drop().await;
    Ok(())
}
