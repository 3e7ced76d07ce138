//! The benchmarks' stop signal: Ctrl-C or SIGTERM (what `kill` and `timeout` send), so that
//! either ends the measurement and the benchmark's clean-up (sandboxes, containers, database,
//! CPU groups) still runs.

/// Resolves on Ctrl-C or SIGTERM, naming which.
pub async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return "Ctrl-C";
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "Ctrl-C",
        _ = term.recv() => "SIGTERM",
    }
}
