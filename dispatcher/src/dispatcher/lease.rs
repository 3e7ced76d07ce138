//! The lease: holding sandboxes is a lease, renewed by the heartbeat and fenced by an epoch.
//!
//! With [`DispatcherConfig::lease`](crate::DispatcherConfig::lease) set, this instance renews its
//! heartbeat (`node_instances.heartbeat_at`) every quarter of the lease, and holds its sandboxes
//! only while its last renewal is younger than the lease, measured on its own monotonic clock
//! from the moment that renewal was *sent*. Peers take an instance for dead only when its
//! heartbeat, recorded by the database when the renewal *arrived*, is older than `dead_after`,
//! which exceeds the lease by a margin (`aegis-config` checks it). So an instance that cannot
//! renew (the database is unreachable, the process was stopped with SIGSTOP, the runtime
//! stalled) has stopped using what it held before anyone may take it over:
//!
//! - every call into a held sandbox checks the lease first (`Inner::locate`), and a lapsed one
//!   is refused at once with [`DispatchError::LeaseLapsed`]; no sandbox is created either;
//! - the lease task drops the streams of the held sandboxes (no write to their rows) and
//!   remembers them with the epoch it held;
//! - a peer that finds the instance silent past `dead_after` *fences* it (`fenced_at`, in one
//!   UPDATE of the instance's row conditional on the stale heartbeat, so it and the instance's
//!   own renewal, an UPDATE of the same row, cannot both win) before taking over its
//!   sandboxes (`takeover.rs`);
//! - when the instance runs again, its renewal tells it whether it was fenced. Either way it
//!   lets go of every held sandbox whose row now names another holder or epoch (without
//!   writing), clears its fence if it had one, and takes back, with a conditional UPDATE that
//!   bumps the epoch, only the dropped sandboxes nobody claimed meanwhile. Calls for the others
//!   are forwarded to their new holder.
//!
//! Every write a holder makes on a sandbox row says `instance_id = me AND epoch = mine`
//! (`store.rs`), and every change of holder bumps the epoch, so the stale writes of a replica
//! that woke up (the stream it lost broke, the pool hand-over it started) change nothing.
//! Without a lease (the default of the library, for embedders that beat themselves) nothing
//! lapses, nothing is fenced and nothing is taken over: the reaper collects dead instances'
//! sandboxes as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::Inner;
use crate::error::{DispatchError, Result};
use crate::spec::{OwnerKind, SandboxId};
use crate::store::{self, Renewal};

/// This instance's hold on its sandboxes.
pub(crate) struct Lease {
    /// How long one renewal holds; `None`: no lease (nothing lapses, nothing is taken over).
    term: Option<Duration>,
    /// Until when the last renewal holds (its send time plus the term); `None`: lapsed.
    valid_until: Mutex<Option<Instant>>,
    /// Sandboxes whose streams were dropped when the lease lapsed, with the epoch held then.
    dropped: Mutex<HashMap<SandboxId, i64>>,
}

impl Lease {
    pub(crate) fn new(term: Option<Duration>) -> Self {
        Lease {
            term,
            valid_until: Mutex::new(None),
            dropped: Mutex::new(HashMap::new()),
        }
    }

    /// Whether this instance takes over the sandboxes of fenced peers (it has a lease).
    pub(crate) fn takes_over(&self) -> bool {
        self.term.is_some()
    }

    /// True while the last renewal holds (always, without a lease).
    pub(crate) fn valid(&self) -> bool {
        self.term.is_none()
            || self
                .valid_until
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some_and(|until| Instant::now() < until)
    }

    /// Refuses when the lease does not hold (for sandbox `id`, or for a new one).
    pub(crate) fn check(&self, id: Option<SandboxId>) -> Result<()> {
        if self.valid() {
            return Ok(());
        }
        Err(DispatchError::LeaseLapsed {
            id,
            reason: self.lapse_reason(),
        })
    }

    /// Refuses a sandbox this instance dropped and has not taken back yet.
    pub(crate) fn check_dropped(&self, id: SandboxId) -> Result<()> {
        if !self.dropped().contains_key(&id) {
            return Ok(());
        }
        Err(DispatchError::LeaseLapsed {
            id: Some(id),
            reason: "its stream was dropped when this instance's lease lapsed and it has not \
                     been taken back yet"
                .to_owned(),
        })
    }

    fn lapse_reason(&self) -> String {
        match self.term {
            Some(term) => format!("no renewal of its lease recorded within {term:?}"),
            None => "no lease".to_owned(),
        }
    }

    /// A renewal sent at `sent` was recorded.
    fn extend(&self, sent: Instant) {
        if let Some(term) = self.term {
            let mut until = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
            // A late answer to an older renewal never shortens a newer one.
            *until = Some(until.map_or(sent + term, |u| u.max(sent + term)));
        }
    }

    /// The lease no longer holds (fenced off, or stopped).
    fn lapse(&self) {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn dropped(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, i64>> {
        self.dropped.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    /// Renews the lease once and acts on the answer: keeps, lets go of or takes back sandboxes,
    /// then takes over the sandboxes of fenced peers. Errors are logged; the next tick retries.
    pub(crate) async fn tend_lease(self: &Arc<Self>) {
        let Some(term) = self.lease.term else { return };
        if !self.lease.valid() {
            self.drop_held(&self.lease.lapse_reason());
        }
        let sent = Instant::now();
        let renewal = match tokio::time::timeout(term / 4, store::renew(&self.pg, self.instance))
            .await
        {
            Ok(Ok(renewal)) => renewal,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "lease not renewed; the held sandboxes are dropped if it lapses");
                return;
            }
            Err(_) => {
                tracing::warn!(waited = ?term / 4, "lease renewal got no answer; the held sandboxes are dropped if it lapses");
                return;
            }
        };
        match renewal {
            Renewal::Renewed => self.lease.extend(sent),
            Renewal::Stopped => {
                self.lease.lapse();
                self.drop_held("this instance is recorded as stopped");
                return;
            }
            Renewal::Fenced => {
                // A peer took this instance for dead: whatever it held may be someone else's.
                self.lease.lapse();
                self.drop_held("a peer fenced this instance off as silent");
                let sent = Instant::now();
                match store::rejoin(&self.pg, self.instance).await {
                    Ok(true) => {
                        tracing::warn!("this instance was fenced off by a peer while silent; rejoined, holding only what it takes back");
                        self.lease.extend(sent);
                    }
                    Ok(false) => return,
                    Err(e) => {
                        tracing::warn!(error = %e, "could not rejoin after a fence; retrying");
                        return;
                    }
                }
            }
        }
        if let Err(e) = self.let_go_of_lost().await {
            tracing::warn!(error = %e, "could not check the holders of this instance's sandboxes");
        }
        self.take_back().await;
        if let Err(e) = self.take_over().await {
            tracing::warn!(error = %e, "takeover pass failed; retrying next tick");
        }
    }

    /// Drops the streams of every held sandbox but idle pool ones (which serve no calls), with
    /// no write to their rows, remembering the epoch each was held at.
    fn drop_held(&self, reason: &str) {
        let held: Vec<Arc<super::Sandbox>> = {
            let mut map = self.sandboxes.write().unwrap_or_else(|p| p.into_inner());
            let ids: Vec<SandboxId> = map
                .keys()
                .copied()
                .filter(|id| !self.pool.is_idle(*id))
                .collect();
            ids.iter().filter_map(|id| map.remove(id)).collect()
        };
        if held.is_empty() {
            return;
        }
        tracing::warn!(sandboxes = held.len(), %reason, "this instance stops using the sandboxes it held");
        let mut dropped = self.lease.dropped();
        for sandbox in held {
            sandbox.stream.close(&format!(
                "this instance no longer holds the sandbox: {reason}"
            ));
            dropped.insert(sandbox.id, sandbox.epoch);
        }
    }

    /// Lets go (without writing) of held sandboxes whose row names another holder or epoch:
    /// taken over while this instance was silent.
    async fn let_go_of_lost(&self) -> Result<()> {
        let held: Vec<(SandboxId, i64)> = self
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|s| (s.id, s.epoch))
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = held.iter().map(|(id, _)| id.0).collect();
        let rows = store::holders(&self.pg, &ids).await?;
        for (id, epoch) in held {
            let Some((holder, now, _)) = rows.get(&id) else {
                continue;
            };
            if *holder == self.instance && *now == epoch {
                continue;
            }
            let released = {
                let mut map = self.sandboxes.write().unwrap_or_else(|p| p.into_inner());
                match map.get(&id) {
                    Some(s) if s.epoch == epoch => map.remove(&id),
                    _ => None,
                }
            };
            if let Some(sandbox) = released {
                self.pool.forget(id);
                sandbox
                    .stream
                    .close(&format!("the sandbox was taken over by instance {holder}"));
                tracing::warn!(sandbox = %id, new_holder = %holder, epoch = now, "a sandbox this instance held was taken over; calls for it are forwarded");
            }
        }
        Ok(())
    }

    /// Takes back the dropped sandboxes nobody claimed meanwhile (a conditional UPDATE bumping
    /// the epoch), reattaching their executors; the others are forgotten.
    async fn take_back(self: &Arc<Self>) {
        let dropped: Vec<(SandboxId, i64)> = self.lease.dropped().drain().collect();
        let mut keep = Vec::new();
        for (id, epoch) in dropped {
            if !self.lease.valid() {
                keep.push((id, epoch));
                continue;
            }
            let _claiming = self.claiming.mark(id);
            match store::reclaim(&self.pg, id, (self.instance, epoch)).await {
                Ok(Some(epoch)) => self.reattach_taken(id, epoch, "taken back").await,
                Ok(None) => {
                    tracing::info!(sandbox = %id, "a dropped sandbox was taken over or ended meanwhile; not taken back")
                }
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %e, "could not take back a dropped sandbox; retrying");
                    keep.push((id, epoch));
                }
            }
        }
        self.lease.dropped().extend(keep);
    }

    /// After a claim that made this instance the holder at `epoch`: a new stream to the same
    /// executor, or, when that cannot be had, the sandbox marked lost (and destroyed when its
    /// engine answers). `how` names the claim in logs.
    pub(crate) async fn reattach_taken(self: &Arc<Self>, id: SandboxId, epoch: i64, how: &str) {
        let row = match store::get(&self.pg, id).await {
            Ok(Some(row)) => row,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "cannot read a claimed sandbox; the reaper will judge it");
                return;
            }
        };
        match self.reattach(&row, epoch).await {
            Ok(sandbox) => {
                let pool = row.owner.kind == OwnerKind::Pool;
                self.hold(sandbox);
                if pool {
                    // Idle, and no longer in any pool list: fresh ones are cheap.
                    let _ = self
                        .destroy(id, "pool sandbox dropped by a lapsed lease")
                        .await;
                    return;
                }
                tracing::info!(sandbox = %id, owner = %row.owner, epoch, "sandbox {how}");
            }
            Err(e) => {
                self.lose(id, epoch, &format!("{how} failed: {e}"), &e)
                    .await
            }
        }
    }

    /// Marks a sandbox this instance claimed at `epoch` as lost, so its callers get a clear
    /// error at once, and removes its objects unless the engine itself failed to answer (then
    /// the reaper removes them once it answers again).
    pub(crate) async fn lose(
        &self,
        id: SandboxId,
        epoch: i64,
        reason: &str,
        cause: &DispatchError,
    ) {
        tracing::warn!(sandbox = %id, %reason, "sandbox lost");
        if let Err(e) = store::mark_lost(&self.pg, id, (self.instance, epoch), reason).await {
            tracing::warn!(sandbox = %id, error = %e, "could not mark a sandbox lost");
            return;
        }
        if engine_unreachable(cause) {
            return;
        }
        if let Err(e) = self.destroy(id, "lost").await {
            tracing::warn!(sandbox = %id, error = %e, "could not remove a lost sandbox; the reaper will");
        }
    }
}

/// True when an error says the engine did not answer (as opposed to "the container is gone").
fn engine_unreachable(e: &DispatchError) -> bool {
    match e {
        DispatchError::Engine { source, .. } | DispatchError::Attach { source, .. } => {
            !crate::error::is_not_found(source)
        }
        _ => false,
    }
}

/// Tends the lease every quarter of its term until the dispatcher shuts down or is dropped.
pub(crate) fn spawn_periodic(weak: Weak<Inner>) {
    let Some(inner) = weak.upgrade() else { return };
    let Some(term) = inner.lease.term else { return };
    let every = (term / 4).max(Duration::from_millis(100));
    drop(inner);
    super::periodic::every(weak, every, |inner| async move {
        // A tend in progress stops at shutdown.
        let shutdown = inner.shutdown.clone();
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = inner.tend_lease() => {}
        }
    });
}
