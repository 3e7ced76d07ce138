//! What happens when an E2B sandbox's time is up: the sweep every [`SWEEP_EVERY`] pauses the
//! sandboxes whose timeout pauses them, kills those whose timeout kills them, forgets rows
//! whose sandbox is gone, and removes expired snapshots. Started by the node's background
//! tasks; every replica runs it, and a row is claimed before it is acted on.

use std::time::Duration;

use dispatcher::SandboxId;
use tokio_util::sync::CancellationToken;

use crate::store;
use aegis_tools::state::AppState;
use aegis_tools::tools::control;

/// How often the sweep looks for sandboxes past their deadline.
pub const SWEEP_EVERY: Duration = Duration::from_secs(2);
/// Most sandboxes one sweep kills (the next sweep takes the rest).
const SWEEP_BATCH: i64 = 64;

/// How long a sweep's claim on a due sandbox lasts: another sweep (of any replica) retries
/// it after this if the first could not destroy it.
const CLAIM_SECS: f64 = 60.0;

/// Kills the sandboxes whose deadline passed and forgets rows whose sandbox is gone. A due
/// row is claimed by moving its deadline [`CLAIM_SECS`] ahead (`FOR UPDATE SKIP LOCKED`, so
/// two replicas never take the same one), its sandbox destroyed, and only then the row
/// deleted: a destroy that fails is retried by a later sweep, never forgotten. A paused
/// sandbox has no deadline (its snapshot's expiry ends it); nor is one whose timeout pauses it
/// ([`crate::control::lifecycle::pause_due`] does that) while its sandbox runs; a paused row is only claimed when the
/// sandbox it was paused from still runs (the pause could not destroy it), which is destroyed
/// while the row stays.
pub async fn sweep(state: &AppState) -> Result<usize, sqlx::Error> {
    let due = store::claim_due(&state.pool, SWEEP_BATCH, CLAIM_SECS).await?;
    let mut ended = 0;
    for (e2b_id, current, paused) in &due {
        let sandbox = SandboxId(*current);
        let started = std::time::Instant::now();
        let system = aegis_core::caller::Caller::system();
        match control::discard(state, &system, sandbox, "its E2B timeout passed").await {
            Ok(()) if *paused => {
                tracing::info!(sandbox = %e2b_id, "the container of a paused E2B sandbox was removed");
                continue;
            }
            Ok(()) => {
                tracing::info!(sandbox = %e2b_id, "E2B sandbox ended: its timeout passed");
                // The node ended it, not a caller: one admin row by the system says so.
                let _ = aegis_store::audit::record_admin(
                    &state.pool,
                    &aegis_core::caller::Caller::system(),
                    "e2b.sandbox.timeout",
                    &serde_json::json!({"sandbox_id": e2b_id}),
                    true,
                    started,
                )
                .await;
            }
            Err(aegis_sandboxes::SandboxError::Dispatch(
                dispatcher::DispatchError::SandboxNotFound { .. },
            )) if *paused => continue,
            Err(aegis_sandboxes::SandboxError::Dispatch(
                dispatcher::DispatchError::SandboxNotFound { .. },
            )) => {}
            Err(e) => {
                tracing::warn!(sandbox = %e2b_id, error = %e, "could not end an E2B sandbox past its timeout; the next sweep retries");
                continue;
            }
        }
        store::delete(&state.pool, *e2b_id).await?;
        ended += 1;
    }
    Ok(ended)
}

/// Runs [`crate::control::lifecycle::pause_due`], [`sweep`] and [`crate::snapshots::sweep`] every
/// [`SWEEP_EVERY`] until `shutdown`.
pub async fn sweep_periodically(state: AppState, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(SWEEP_EVERY) => {}
        }
        if let Err(e) = crate::control::lifecycle::pause_due(&state, SWEEP_BATCH).await {
            tracing::warn!(error = %e, "could not pause E2B sandboxes past their timeout");
        }
        if let Err(e) = sweep(&state).await {
            tracing::warn!(error = %e, "could not sweep E2B sandboxes past their timeout");
        }
        if let Err(e) = crate::snapshots::sweep(&state).await {
            tracing::warn!(error = %e, "could not sweep expired E2B snapshots");
        }
    }
}
