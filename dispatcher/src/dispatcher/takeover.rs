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
//!
//! A rolling restart (`shutdown.sandboxes: keep`) fails no call. The stopping replica first
//! lets the calls in flight into its sandboxes end and refuses new ones as stopping
//! ([`Serving`]), then lets go of its streams and records its stop; its peer listener answers
//! until then. A call that finds its holder stopped (recorded, or refusing as stopping, or its
//! port closed after the stop) is not failed: the caller's replica claims that one sandbox at
//! once ([`Inner::hand_over`]: the pass's conditional UPDATE with an epoch bump, only with a
//! valid lease and on the sandbox's engine) and makes the call itself; when another replica
//! claimed it first, the call goes there; when it cannot adopt it (another engine), it waits,
//! bounded by [`HANDOVER_WAIT`] and the call's deadline, for a replica that can, then says why.
//! While a holder is stopping but has not recorded its stop yet, the call waits likewise. A
//! holder whose port refuses without a recorded stop crashed: that call gets a clear error at
//! once, and the pass adopts the sandbox after `dead_after`. While a replica claims and
//! attaches a sandbox ([`Claiming`]), calls for it wait for the new stream instead of finding it
//! nowhere. Live processes and watches followed through a stopping replica end with a clear
//! error; plain calls go on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use uuid::Uuid;

use super::Inner;
use crate::error::{DispatchError, Result};
use crate::spec::SandboxId;
use crate::store;

/// Longest a call waits for its sandbox to be handed over from a stopping or stopped holder
/// (bounded by the call's own deadline too): a stop records itself within seconds, and a
/// replica on the sandbox's engine claims it at its next call or pass.
pub(crate) const HANDOVER_WAIT: Duration = Duration::from_secs(30);

/// Longest a stop that keeps its sandboxes waits for the calls in flight into them.
pub(crate) const DRAIN_WAIT: Duration = Duration::from_secs(30);

/// What [`Inner::hand_over`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handover {
    /// Another instance holds it now (this one, after a claim), or it ended: locate it again.
    Moved,
    /// Its holder is not recorded as stopped or fenced: it still holds it.
    Alive,
    /// Its holder stopped, and a replica on its engine may still adopt it (not this one).
    Elsewhere,
    /// Its holder stopped, and no replica adopts it (its work ran in the holder: the reaper's).
    Never,
}

/// Sandboxes being claimed and attached to by this instance, with how many claims of each
/// are under way (a call's and the pass's may overlap; the first to end must not unmark it).
#[derive(Default)]
pub(crate) struct Claiming {
    ids: Mutex<HashMap<SandboxId, usize>>,
    done: Notify,
}

/// While alive, `id` counts as being claimed.
pub(crate) struct ClaimMark<'a> {
    claiming: &'a Claiming,
    id: SandboxId,
}

impl Drop for ClaimMark<'_> {
    fn drop(&mut self) {
        let mut ids = self.claiming.ids.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = ids.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                ids.remove(&self.id);
            }
        }
        drop(ids);
        self.claiming.done.notify_waiters();
    }
}

impl Claiming {
    /// Marks `id` as being claimed until the mark is dropped.
    pub(crate) fn mark(&self, id: SandboxId) -> ClaimMark<'_> {
        *self
            .ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_default() += 1;
        ClaimMark { claiming: self, id }
    }

    fn contains(&self, id: SandboxId) -> bool {
        self.ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&id)
    }

    /// Waits, at most `bound`, until `id` is not being claimed.
    pub(crate) async fn wait_for(&self, id: SandboxId, bound: Duration) {
        let until = tokio::time::Instant::now() + bound;
        loop {
            // Created before the check, so a mark dropped in between still wakes it.
            let done = self.done.notified();
            if !self.contains(id) {
                return;
            }
            if tokio::time::timeout_at(until, done).await.is_err() {
                return;
            }
        }
    }
}

/// Calls in flight into held sandboxes, and whether new ones are taken.
#[derive(Default)]
pub(crate) struct Serving {
    closed: AtomicBool,
    in_flight: AtomicUsize,
    idle: Notify,
}

/// One call in flight while alive.
pub(crate) struct InFlight<'a>(&'a Serving);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Serving {
    /// Counts one call in flight; refused with `ShuttingDown` once closed.
    pub(crate) fn enter(&self) -> Result<InFlight<'_>> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let call = InFlight(self);
        if self.closed.load(Ordering::SeqCst) {
            return Err(DispatchError::ShuttingDown);
        }
        Ok(call)
    }

    /// True once new calls are refused.
    pub(crate) fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Refuses new calls, then waits (at most `bound`) for those in flight to end.
    pub(crate) async fn close_and_wait(&self, bound: Duration) {
        self.closed.store(true, Ordering::SeqCst);
        let until = tokio::time::Instant::now() + bound;
        loop {
            let idle = self.idle.notified();
            let left = self.in_flight.load(Ordering::SeqCst);
            if left == 0 {
                return;
            }
            if tokio::time::timeout_at(until, idle).await.is_err() {
                tracing::warn!(
                    calls = left,
                    "calls still in flight after {bound:?}; letting go of the sandboxes anyway"
                );
                return;
            }
        }
    }
}

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
        if !self.lease.takes_over()
            || !self.lease.valid()
            || self.shutdown.is_cancelled()
            || self.serving.closed()
        {
            return Ok(report);
        }
        let fenced = store::fence_silent(&self.pg, self.instance, self.config.dead_after).await?;
        for peer in &fenced {
            tracing::warn!(peer = %peer, dead_after = ?self.config.dead_after, "fenced off a silent instance; taking over its sandboxes");
        }
        report.fenced = fenced.len();
        for row in store::adoptable(&self.pg, self.instance, &self.engine).await? {
            if !self.lease.valid() || self.shutdown.is_cancelled() || self.serving.closed() {
                break;
            }
            let id = row.info.id;
            let previous = row.info.instance_id;
            let _claiming = self.claiming.mark(id);
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

impl Inner {
    /// For a call whose holder took no call: claims the sandbox at once when its holder is
    /// recorded as stopped or fenced and this instance may adopt it (a valid lease, its engine,
    /// an owner a takeover adopts), attaching to its executor before answering. Says where the
    /// sandbox stands then.
    pub(crate) async fn hand_over(
        self: &Arc<Self>,
        id: SandboxId,
        holder: Uuid,
    ) -> Result<Handover> {
        let Some(row) = store::get(&self.pg, id).await? else {
            return Ok(Handover::Moved);
        };
        if row.instance_id != holder || row.state.is_terminal() {
            return Ok(Handover::Moved);
        }
        if !store::holds_nothing(&self.pg, holder).await? {
            return Ok(Handover::Alive);
        }
        if !store::adopted_on_takeover(row.owner.kind) {
            return Ok(Handover::Never);
        }
        if !self.lease.takes_over()
            || !self.lease.valid()
            || self.shutdown.is_cancelled()
            || self.serving.closed()
        {
            return Ok(Handover::Elsewhere);
        }
        // In its own task: a caller that gives up cannot leave a claim without its stream.
        let inner = self.clone();
        let claimed = super::run_detached(async move {
            let _claiming = inner.claiming.mark(id);
            let engine = inner.engine.clone();
            let Some(epoch) =
                store::claim_handover(&inner.pg, id, holder, inner.instance, &engine).await?
            else {
                return Ok(false);
            };
            inner
                .reattach_taken(
                    id,
                    epoch,
                    &format!("taken over from stopped instance {holder} for a call"),
                )
                .await;
            Ok(true)
        })
        .await?;
        if claimed {
            return Ok(Handover::Moved);
        }
        // Another replica may have claimed it meanwhile; else it is on another engine.
        Ok(match store::get(&self.pg, id).await? {
            Some(row) if row.instance_id == holder && !row.state.is_terminal() => {
                Handover::Elsewhere
            }
            _ => Handover::Moved,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sandbox_stays_claimed_until_the_last_of_overlapping_claims_ends() {
        let claiming = Claiming::default();
        let id = SandboxId::new();
        let call = claiming.mark(id);
        let pass = claiming.mark(id);
        drop(pass);
        assert!(claiming.contains(id), "the call's claim is still under way");
        let waiter = claiming.wait_for(id, Duration::from_secs(30));
        tokio::pin!(waiter);
        assert!(
            futures_util::poll!(&mut waiter).is_pending(),
            "a call waits for the claim"
        );
        drop(call);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken when the last claim ends");
        assert!(!claiming.contains(id));
    }

    #[tokio::test]
    async fn a_closed_dispatcher_refuses_new_calls_and_waits_for_those_in_flight() {
        let serving = Arc::new(Serving::default());
        let in_flight = serving.enter().expect("open");
        let closing = {
            let serving = serving.clone();
            tokio::spawn(async move { serving.close_and_wait(Duration::from_secs(30)).await })
        };
        while !serving.closed() {
            tokio::task::yield_now().await;
        }
        assert!(matches!(serving.enter(), Err(DispatchError::ShuttingDown)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!closing.is_finished(), "it waits for the call in flight");
        drop(in_flight);
        tokio::time::timeout(Duration::from_secs(5), closing)
            .await
            .expect("done once the call ended")
            .expect("task");
    }
}
