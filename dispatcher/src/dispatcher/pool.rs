//! The warm pool: started, unused sandboxes per image, so an owner does not wait for Docker.
//!
//! A pool sandbox is an ordinary sandbox whose row says `owner_kind = 'pool'`, created with the
//! pool's limits, no network and `/workspace` readable and writable; or, for a named pool of a
//! given shape (`DispatcherConfig::pool_shapes`, e.g. an E2B template's), with that shape's
//! workspace, roots and labels. [`Dispatcher::acquire`] hands
//! one out only when the requested spec would have produced exactly the same container (image,
//! limits, network, roots: these are fixed at creation); the hand-over is one conditional
//! `UPDATE` of the row, which is why it takes milliseconds. Docker labels cannot change, so the
//! container keeps `org.aegis.owner-kind=pool` and the row is the truth about the owner.
//!
//! A sandbox is handed to exactly one owner and never comes back: when its owner is done it is
//! destroyed, and a background task creates a replacement. Pool sandboxes are reaped like any
//! other when their instance dies, and destroyed at [`Dispatcher::shutdown`].

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use super::{run_detached, Dispatcher, Inner};
use crate::config::DispatcherConfig;
use crate::error::Result;
use crate::spec::{Limits, Owner, OwnerKind, SandboxId, SandboxSpec};
use crate::store;

/// The owner id recorded for pool sandboxes.
pub const POOL_OWNER_ID: &str = "warm-pool";

/// How long the refill task sleeps when nothing wakes it (it also re-checks after failures).
const IDLE_RECHECK: Duration = Duration::from_secs(30);

pub(crate) struct Pool {
    /// Pool name (the image, or a shape's name) -> the spec its sandboxes are created with,
    /// and how many to keep.
    specs: BTreeMap<String, (SandboxSpec, usize)>,
    /// Pool name -> the command run once in each of its new sandboxes before it is offered
    /// (`DispatcherConfig::pool_warmup`).
    warmup: BTreeMap<String, Vec<String>>,
    idle: Mutex<HashMap<String, VecDeque<SandboxId>>>,
    /// Ids ever put in the pool and not yet handed out or forgotten (for `forget`).
    members: Mutex<HashSet<SandboxId>>,
    wake: Arc<Notify>,
    /// Acquisitions served from the pool / by creating a sandbox (for the node's metrics).
    hits: AtomicU64,
    misses: AtomicU64,
    /// The same, per pool, for acquisitions whose spec one of the pools serves.
    by_pool: Mutex<BTreeMap<String, PoolStats>>,
}

/// How often the warm pool served an acquisition, since the dispatcher started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Acquisitions handed an idle pool sandbox.
    pub hits: u64,
    /// Acquisitions that had to create a sandbox (no idle one matched, or none was usable).
    pub misses: u64,
}

impl Pool {
    pub(crate) fn new(config: &DispatcherConfig) -> Self {
        let limits = config
            .pool_limits
            .clamp_to(&config.ceilings)
            .or_else(|_| Limits::default().clamp_to(&config.ceilings))
            .unwrap_or(config.ceilings);
        let specs = config
            .pool
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(image, n)| {
                let mut spec =
                    SandboxSpec::new(image.clone(), Owner::new(OwnerKind::Pool, POOL_OWNER_ID));
                spec.limits = limits;
                spec.isolation = Some(config.isolation.of_image(image));
                (image.clone(), (spec, *n))
            });
        // A shape keeps what makes it that sandbox (workspace, roots, labels); its owner and
        // limits are the pool's, as for an image's pool.
        let shapes =
            config
                .pool_shapes
                .iter()
                .filter(|(_, (_, n))| *n > 0)
                .map(|(name, (shape, n))| {
                    let mut spec = shape.clone();
                    spec.owner = Owner::new(OwnerKind::Pool, POOL_OWNER_ID);
                    spec.limits = limits;
                    spec.isolation = spec
                        .isolation
                        .or(Some(config.isolation.of_image(&spec.image)));
                    (name.clone(), (spec, *n))
                });
        Pool {
            specs: specs.chain(shapes).collect(),
            warmup: config
                .pool_warmup
                .iter()
                .filter(|(_, argv)| !argv.is_empty())
                .map(|(name, argv)| (name.clone(), argv.clone()))
                .collect(),
            idle: Mutex::new(HashMap::new()),
            members: Mutex::new(HashSet::new()),
            wake: Arc::new(Notify::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            by_pool: Mutex::new(BTreeMap::new()),
        }
    }

    /// The pool whose sandboxes serve `spec` exactly, if any.
    fn serving(&self, spec: &SandboxSpec) -> Option<&str> {
        self.specs
            .iter()
            .find(|(_, (pool_spec, _))| pool_spec.same_sandbox_as(spec))
            .map(|(name, _)| name.as_str())
    }

    /// Counts an acquisition: a hit or a miss overall, and for the pool that serves `spec`.
    fn count(&self, spec: &SandboxSpec, hit: bool) {
        let total = if hit { &self.hits } else { &self.misses };
        total.fetch_add(1, Ordering::Relaxed);
        if let Some(name) = self.serving(spec) {
            let mut by_pool = self.by_pool.lock().unwrap_or_else(|p| p.into_inner());
            let stats = by_pool.entry(name.to_owned()).or_default();
            if hit {
                stats.hits += 1;
            } else {
                stats.misses += 1;
            }
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, HashMap<String, VecDeque<SandboxId>>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes an idle sandbox that serves `spec` exactly, if there is one.
    fn take(&self, spec: &SandboxSpec) -> Option<SandboxId> {
        let name = self.serving(spec)?;
        let id = self.idle().get_mut(name)?.pop_front()?;
        self.members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        Some(id)
    }

    fn put(&self, name: &str, id: SandboxId) {
        self.members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id);
        self.idle()
            .entry(name.to_owned())
            .or_default()
            .push_back(id);
    }

    /// Drops a sandbox from the idle lists (its stream broke, or it is being destroyed).
    pub(crate) fn forget(&self, id: SandboxId) {
        let was_member = self
            .members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if was_member {
            for queue in self.idle().values_mut() {
                queue.retain(|x| *x != id);
            }
            self.wake.notify_one();
        }
    }

    /// True while `id` waits in the pool (not handed out yet): it serves no calls.
    pub(crate) fn is_idle(&self, id: SandboxId) -> bool {
        self.members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&id)
    }

    /// Empties the pool, returning the idle sandboxes (for shutdown).
    pub(crate) fn drain(&self) -> Vec<SandboxId> {
        self.members
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.idle().drain().flat_map(|(_, q)| q).collect()
    }

    /// Idle sandboxes per pool (image, or shape name).
    pub(crate) fn sizes(&self) -> BTreeMap<String, usize> {
        let idle = self.idle();
        self.specs
            .keys()
            .map(|name| (name.clone(), idle.get(name).map_or(0, VecDeque::len)))
            .collect()
    }
}

impl Dispatcher {
    /// A sandbox for `spec`, from the warm pool when one matches exactly, else freshly created.
    ///
    /// A pooled sandbox is handed to this owner alone (its row is re-owned in one conditional
    /// update) and a replacement is created in the background. Destroy it when done, like any
    /// sandbox: it never returns to the pool.
    ///
    /// With several engines (`placement.rs`): from this engine's pool or fresh here while this
    /// engine has room, else on another replica's engine (from its pool or fresh there).
    pub async fn acquire(&self, spec: SandboxSpec) -> Result<SandboxId> {
        let spec = self.inner.config.admitted(spec)?;
        let inner = self.inner.clone();
        run_detached(async move { inner.place(spec, true).await }).await
    }

    /// Idle warm-pool sandboxes per configured pool: its image, or a shape's name.
    pub fn pool_sizes(&self) -> BTreeMap<String, usize> {
        self.inner.pool.sizes()
    }

    /// Pool hits and misses of [`Dispatcher::acquire`] so far.
    pub fn pool_stats(&self) -> PoolStats {
        PoolStats {
            hits: self.inner.pool.hits.load(Ordering::Relaxed),
            misses: self.inner.pool.misses.load(Ordering::Relaxed),
        }
    }

    /// Hits and misses per pool (image, or shape name), for acquisitions a pool serves.
    pub fn pool_stats_by_pool(&self) -> BTreeMap<String, PoolStats> {
        self.inner
            .pool
            .by_pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Inner {
    /// From this engine's pool, else created on this engine (no placement).
    pub(crate) async fn acquire(self: &Arc<Self>, spec: SandboxSpec) -> Result<SandboxId> {
        self.lease.check(None)?;
        while let Some(id) = self.pool.take(&spec) {
            self.pool.wake.notify_one();
            let usable = self
                .held(id)
                .filter(|s| s.stream.closed_reason().is_none())
                .map(|s| s.epoch);
            let handed = match usable {
                Some(epoch) => {
                    store::reown_from_pool(
                        &self.pg,
                        id,
                        (self.instance, epoch),
                        &spec.owner,
                        &spec.labels,
                    )
                    .await?
                }
                None => false,
            };
            if handed {
                tracing::debug!(sandbox = %id, owner = %spec.owner, "sandbox handed out from the warm pool");
                self.pool.count(&spec, true);
                return Ok(id);
            }
            // Broken or reaped while idle: not worth handing out.
            let _ = self.destroy(id, "pool sandbox unusable at hand-out").await;
        }
        self.pool.count(&spec, false);
        let owner = spec.owner.clone();
        Ok(self.create_detached(spec, owner).await?.id)
    }

    /// Creates pool sandboxes until every pool has its target; false if a creation failed.
    async fn refill_once(self: &Arc<Self>) -> bool {
        for (name, (spec, target)) in &self.pool.specs {
            loop {
                if self.shutdown.is_cancelled() {
                    return true;
                }
                let have = self.pool.idle().get(name).map_or(0, VecDeque::len);
                if have >= *target {
                    break;
                }
                tracing::info!(pool = %name, image = %spec.image, "warming pool {name} {}/{target}", have + 1);
                match self.create_detached(spec.clone(), spec.owner.clone()).await {
                    Ok(sandbox) => {
                        if self.shutdown.is_cancelled() {
                            let _ = self.destroy(sandbox.id, "pool drained at shutdown").await;
                            return true;
                        }
                        if let Some(argv) = self.pool.warmup.get(name) {
                            warm_up(&sandbox, name, argv).await;
                        }
                        self.pool.put(name, sandbox.id);
                    }
                    Err(e) => {
                        tracing::warn!(pool = %name, image = %spec.image, error = %e, "warm pool could not create a sandbox; retrying later");
                        return false;
                    }
                }
            }
        }
        true
    }
}

/// How long a pool's warm-up command may run.
const WARMUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs a pool's warm-up command once in its new sandbox, before anyone can be handed it
/// (`DispatcherConfig::pool_warmup`): the node's own call on its executor channel, as the
/// sandbox user under the sandbox's kernel rules, granted `argv[0]` alone, no output kept.
/// Not a tool call: the sandbox has no owner yet, and nothing of it outlives the command.
async fn warm_up(sandbox: &super::Sandbox, pool: &str, argv: &[String]) {
    use sandbox_executor::protocol::{ExecGrant, Op, Outcome, RunParams};
    let op = Op::CmdRun(RunParams {
        argv: argv.to_vec(),
        cwd: None,
        env: BTreeMap::new(),
        timeout_ms: WARMUP_TIMEOUT.as_millis() as u64,
        grace_ms: None,
        max_stdout_bytes: 1024,
        max_stderr_bytes: 1024,
        exec: ExecGrant::default(),
        user: Default::default(),
    });
    let started = std::time::Instant::now();
    match sandbox
        .stream
        .call(op, WARMUP_TIMEOUT + Duration::from_secs(5))
        .await
    {
        Ok(response) if matches!(response.outcome, Outcome::Ok(_)) => {
            tracing::debug!(pool = %pool, sandbox = %sandbox.id, ms = started.elapsed().as_millis() as u64, "pool sandbox warmed up");
        }
        Ok(response) => {
            tracing::warn!(pool = %pool, sandbox = %sandbox.id, outcome = ?response.outcome, "the pool's warm-up command failed; the sandbox is offered unwarmed")
        }
        Err(e) => {
            tracing::warn!(pool = %pool, sandbox = %sandbox.id, error = %e, "the pool's warm-up command could not run; the sandbox is offered unwarmed")
        }
    }
}

/// Keeps the pool full: wakes on every hand-out and loss (and starts
/// `DispatcherConfig::pool_refill_delay` later), and every 30 s; backs off on failure.
pub(crate) fn spawn_refill(weak: Weak<Inner>) {
    let Some(inner) = weak.upgrade() else { return };
    if inner.pool.specs.is_empty() {
        return;
    }
    let wake = inner.pool.wake.clone();
    let shutdown = inner.shutdown.clone();
    let settle = inner.config.pool_refill_delay;
    drop(inner);
    tokio::spawn(async move {
        let mut backoff = Duration::from_secs(1);
        loop {
            let Some(inner) = weak.upgrade() else { return };
            let ok = inner.refill_once().await;
            drop(inner);
            let pause = if ok {
                backoff = Duration::from_secs(1);
                IDLE_RECHECK
            } else {
                backoff = (backoff * 2).min(Duration::from_secs(60));
                backoff
            };
            let woken = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = wake.notified(), if ok => true,
                _ = tokio::time::sleep(pause) => false,
            };
            if woken {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(settle) => {}
                }
            }
        }
    });
}
