//! Turning SIGTERM and SIGINT into one cancellation token that every task watches.
//!
//! Shutdown is designed once: servers stop accepting, in-flight requests get a grace period,
//! background tasks observe the same token, and the instance records that it stopped.

use tokio_util::sync::CancellationToken;

/// Cancels `token` on the first SIGTERM or SIGINT.
pub fn on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot install SIGTERM handler");
                    return;
                }
            };
        let which = tokio::select! {
            _ = term.recv() => "SIGTERM",
            r = tokio::signal::ctrl_c() => if r.is_ok() { "SIGINT" } else { "signal handler error" },
        };
        tracing::info!(signal = which, "shutdown requested");
        token.cancel();
    });
}
