//! Egress proxy cost: the same HTTP requests to a local test host, directly and through the
//! sandboxes' egress proxy (domain rules, resolve-once address checks, one audit row per
//! connection), measured in one run: added latency per request and bulk throughput.
//!
//! `scripts/egress_bench.sh [N]`, or `DATABASE_URL=postgres://... cargo run --release -p
//! orchestrator --example egress_bench [-- N]` (a scratch database is created for the audit rows
//! and dropped at the end). The proxied path is what a sandbox's `cmd.run` gets through
//! `HTTP_PROXY`, minus the sandbox network's bridge hop; a sandbox has no direct path to compare. The test host
//! listens on 127.0.0.2 and is reached by name through `egress.hosts`; nothing leaves the machine.

use std::collections::BTreeMap;
use std::time::Instant;

use axum::routing::get;
use axum::Router;
use orchestrator::app::Application;
use orchestrator::config::NodeConfig;
use orchestrator::egress::proxy::{EgressProxy, ProxyScope};
use orchestrator::egress::{DomainEntry, DomainPolicy, DomainRule};
use tokio_util::sync::CancellationToken;

#[allow(dead_code)] // this benchmark serves its own node; it takes only the database
#[path = "support/bench_node.rs"]
mod bench_node;
use bench_node::BenchDb;
#[path = "support/plain.rs"]
mod plain;
use plain::percentiles;

const BULK_BYTES: usize = 32 * 1024 * 1024;

/// Fresh connection per request on both paths: the proxy gives each connection one checked
/// host, so connection reuse would flatter the direct path.
fn client(proxy: Option<&str>) -> Result<reqwest::Client, reqwest::Error> {
    let mut b = reqwest::Client::builder().pool_max_idle_per_host(0);
    b = match proxy {
        Some(p) => b.proxy(reqwest::Proxy::http(p)?),
        None => b.no_proxy(),
    };
    b.build()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = plain::count_arg(500);
    let db = BenchDb::from_env().await?;

    let host = tokio::net::TcpListener::bind("127.0.0.2:0").await?;
    let port = host.local_addr()?.port();
    let bulk = vec![b'x'; BULK_BYTES];
    let app = Router::new()
        .route("/small", get(|| async { "ok" }))
        .route("/bulk", get(move || async move { bulk.clone() }));
    tokio::spawn(async move {
        let _ = axum::serve(host, app).await;
    });

    let mut config = NodeConfig::default();
    config.server.http = "127.0.0.1:0".parse()?;
    config.server.grpc = "127.0.0.1:0".parse()?;
    config.database.url = db.url().to_owned();
    config.auth.admin_key = Some(format!("aok_{}", "0".repeat(64)));
    config.egress.allow_cidrs = vec!["127.0.0.2/32".to_owned()];
    config.egress.hosts = BTreeMap::from([("bench.test".to_owned(), vec!["127.0.0.2".parse()?])]);
    let app = Application::build(config).await?;
    let state = app.state().clone();
    let token = CancellationToken::new();
    let server = tokio::spawn(app.run(token.clone()));

    let mut domains = DomainPolicy::default();
    domains.push(DomainRule {
        source: "benchmark".to_owned(),
        allow: Some(vec![DomainEntry::parse(&format!("bench.test:{port}"))?]),
        deny: vec![],
        exempt: Vec::new(),
    });
    let proxy = EgressProxy::start(
        "127.0.0.1:0".parse()?,
        ProxyScope {
            sandbox: "bench".to_owned(),
            domains,
        },
        state.egress.clone(),
        state.pool.clone(),
    )
    .await?;
    let proxy_url = format!("http://{}", proxy.addr());
    // Direct requests use the address, as the proxy would after resolving bench.test.
    let direct_base = format!("http://127.0.0.2:{port}");
    let proxied_base = format!("http://bench.test:{port}");

    let mut rows = Vec::new();
    for (label, c, base) in [
        ("direct", client(None)?, direct_base.as_str()),
        (
            "through proxy",
            client(Some(&proxy_url))?,
            proxied_base.as_str(),
        ),
    ] {
        for _ in 0..20 {
            c.get(format!("{base}/small")).send().await?.bytes().await?;
        }
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            c.get(format!("{base}/small")).send().await?.bytes().await?;
            samples.push(t.elapsed());
        }
        let (p50, p95) = percentiles(samples);
        let rounds = 5;
        let t = Instant::now();
        let mut got = 0usize;
        for _ in 0..rounds {
            got += c
                .get(format!("{base}/bulk"))
                .send()
                .await?
                .bytes()
                .await?
                .len();
        }
        let mib_s = got as f64 / (1024.0 * 1024.0) / t.elapsed().as_secs_f64();
        rows.push((label, p50, p95, mib_s));
    }

    println!(
        "{n} small GETs (new connection each) and 5 x {} MiB downloads per path, loopback\n",
        BULK_BYTES / (1024 * 1024)
    );
    println!(
        "{:<15} {:>9} {:>9} {:>13} {:>10} {:>12}",
        "path", "p50 ms", "p95 ms", "added p50 ms", "p50 ratio", "MiB/s"
    );
    let (_, base50, _, base_tp) = rows[0];
    for (label, p50, p95, mib_s) in &rows {
        println!(
            "{label:<15} {p50:>9.3} {p95:>9.3} {:>13.3} {:>9.2}x {mib_s:>12.1}",
            p50 - base50,
            p50 / base50
        );
    }
    println!(
        "\nthroughput through the proxy: {:.2}x of direct",
        rows[1].3 / base_tp
    );

    proxy.stop();
    token.cancel();
    let _ = server.await;
    state.pool.close().await;
    db.drop().await;
    Ok(())
}
