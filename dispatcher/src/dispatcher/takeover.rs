//! Takeover: a live replica adopts the sandboxes of a holder that died.
//!
//! After each renewal of its own lease (`lease.rs`), an instance with a lease fences off every
//! peer silent for longer than `dead_after` that still has live sandboxes, then claims the
//! running sandboxes of fenced (or stopped) holders whose owners live outside any one replica:
//! SEAL sessions and operators (which includes the E2B door's sandboxes). Each claim is one
//! conditional UPDATE moving `instance_id` to this instance and bumping the epoch, so two
//! survivors never both adopt one sandbox. The claimed sandbox gets a new stream to the same
//! executor (its socket, else the attach stream: the executor outlives its node's connection,
//! and its workspace is untouched), so callers go on where they were, through any replica.
//! A sandbox whose container is gone or stopped, or whose executor does not answer, is marked
//! lost (`failed`, reason `lost: ...`) and removed: its callers get `SandboxGone` at once.
//!
//! What is not adopted stays the reaper's: sandboxes of executions and workflow states (their
//! work ran in the dead holder's process; the execution is failed by the next start's recovery,
//! the workflow state retried by the next lease holder, which destroys them first) and the warm
//! pool's. The reaper leaves the running sandboxes a takeover adopts alone
//! (`reaper.rs`, `judge_row`), so it never removes one a survivor could keep serving.
//!
//! With several Docker engines (`placement.rs`) only a replica on the sandbox's engine adopts
//! it (`store::adoptable` filters by engine): the others cannot reach its container.

use std::sync::Arc;

use super::Inner;
use crate::error::Result;
use crate::spec::SandboxId;
use crate::store;

/// What one takeover pass did.
#[derive(Debug, Default)]
pub(crate) struct TakeoverReport {
    /// Peers fenced off in this pass.
    pub fenced: usize,
    /// Sandboxes claimed (adopted, or found lost).
    pub claimed: Vec<SandboxId>,
}

impl Inner {
    /// Fences silent peers and claims the adoptable sandboxes of fenced or stopped holders.
    /// Does nothing without a valid lease: a replica that may itself be taken for dead adopts
    /// nothing.
    pub(crate) async fn take_over(self: &Arc<Self>) -> Result<TakeoverReport> {
        let mut report = TakeoverReport::default();
        if !self.lease.takes_over() || !self.lease.valid() || self.shutdown.is_cancelled() {
            return Ok(report);
        }
        let fenced = store::fence_silent(&self.pg, self.instance, self.config.dead_after).await?;
        for peer in &fenced {
            tracing::warn!(peer = %peer, dead_after = ?self.config.dead_after, "fenced off a silent instance; taking over its sandboxes");
        }
        report.fenced = fenced.len();
        for row in store::adoptable(&self.pg, self.instance, &self.engine).await? {
            if !self.lease.valid() || self.shutdown.is_cancelled() {
                break;
            }
            let id = row.info.id;
            let previous = row.info.instance_id;
            let Some(epoch) =
                store::claim_takeover(&self.pg, id, (previous, row.epoch), self.instance).await?
            else {
                continue;
            };
            report.claimed.push(id);
            self.reattach_taken(id, epoch, &format!("taken over from instance {previous}"))
                .await;
        }
        Ok(report)
    }
}
