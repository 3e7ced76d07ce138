//! The Python drivers that measure a node through E2B's own SDK (`support/*_client.py`,
//! `tests/python/e2b_ports_client.py`): each is aimed at the node's E2B door with an operator
//! key and prints its report as one JSON document. Shared by the benchmarks that run one, so
//! each says only what it measures (its script, its `BENCH_*` settings).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::RunningApp;

/// `python3 <script>` (a path below the orchestrator crate) aimed at `app`'s E2B door with
/// `key`, in E2B's form; the caller adds its arguments and settings.
pub fn command(app: &RunningApp, key: &str, script: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("python3");
    command
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join(script))
        .env("E2B_API_URL", format!("{}/e2b", app.http_base))
        .env("E2B_SANDBOX_URL", format!("{}/e2b", app.http_base))
        .env(
            "E2B_API_KEY",
            orchestrator::api::e2b::keys::to_e2b_form(key),
        );
    command
}

/// Runs a driver to its end and reads its report; when it fails, its stderr under `driver`'s
/// name and what it `needs` installed.
pub async fn report(
    mut command: tokio::process::Command,
    driver: &str,
    needs: &str,
) -> Result<Value> {
    let out = command.output().await.context("python3 does not run")?;
    if !out.status.success() {
        bail!(
            "the {driver} failed (needs {needs}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "the {driver}'s report is not JSON: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Waits until the dispatcher's warm pool `pool` holds an idle sandbox (`image` names what it
/// needs built when it never does), polling every `every`.
#[allow(dead_code)] // the benchmarks whose driver makes its own sandboxes do not wait
pub async fn pool_filled(
    app: &RunningApp,
    pool: &str,
    image: &str,
    within: Duration,
    every: Duration,
) -> Result<()> {
    let dispatcher = app.state.sandboxes.dispatcher()?;
    let waited = Instant::now();
    while dispatcher.pool_sizes().get(pool).copied().unwrap_or(0) == 0 {
        if waited.elapsed() > within {
            bail!("the warm pool {pool} never filled (is {image} built?)");
        }
        tokio::time::sleep(every).await;
    }
    Ok(())
}

/// A series of a driver's report (milliseconds, or bytes): its numbers, none when absent.
pub fn series(report: &Value) -> Vec<f64> {
    report
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// The `q` quantile (nearest rank) of a series of a driver's report; NaN when it is empty.
#[allow(dead_code)] // the benchmarks that print ratios of their own figures do not use it
pub fn quantile(series_of: &Value, q: f64) -> f64 {
    let mut v = series(series_of);
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}
