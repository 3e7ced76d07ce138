//! How a benchmark starts and ends: tracing on stderr (`RUST_LOG`, `warn` by default), its body
//! on a worker thread of the runtime, and an exit code that says whether it failed (why, on
//! stderr, under the benchmark's tag).

use std::future::Future;
use std::process::ExitCode;

/// Runs `body` as the benchmark `tag` (`bench`, `e2b-bench`, ...). On a worker thread, like a
/// request handler: the future `main` blocks on runs on a thread of its own, and every wake-up
/// from the runtime's workers would cross threads and add latency to what is measured.
pub async fn run<F>(tag: &str, body: F) -> ExitCode
where
    F: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    match tokio::spawn(body).await {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("[{tag}] ERROR: {e:#}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("[{tag}] ERROR: the benchmark task failed: {e}");
            ExitCode::FAILURE
        }
    }
}
