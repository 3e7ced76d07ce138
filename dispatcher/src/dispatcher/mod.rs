//! The [`Dispatcher`]: creates, serves, adopts and destroys sandboxes for one orchestrator
//! instance.
//!
//! The orchestrator holds one `Dispatcher` (a cheap clone around an `Arc`) and asks it for
//! sandboxes by spec; it never sees Docker. The order of every lifecycle step is chosen so that a
//! crash at any point leaves something the reaper can find:
//!
//! 1. the Postgres row is written (`creating`) before any Docker object exists;
//! 2. the workspace volume and the container are created with labels naming this database
//!    (scope), this instance and the sandbox;
//! 3. the container's stdin/stdout are attached *before* it starts, so the executor's ready line
//!    cannot be missed; then it starts, and the row becomes `running` once the executor is ready.
//!
//! Lifecycle operations run in their own tasks, so a caller that gives up halfway (an HTTP client
//! disconnecting) cannot leave a half-created sandbox: the task finishes, and if nobody waits for
//! the result any more the sandbox is destroyed.
//!
//! Background work (periodic reaper, pool refill) holds only a weak reference: dropping the last
//! `Dispatcher` clone stops it. Sandboxes themselves outlive the dispatcher; they are removed by
//! `destroy`, by the reaper once this instance is dead, or taken over by a later instance through
//! [`Dispatcher::adopt`].
//!
//! Its submodules are the dispatcher's own background duties, each an `impl` of the same
//! [`Dispatcher`] and its shared state: [`pool`] (warm sandboxes), [`reaper`] (what dead
//! instances left behind), [`beacon`] (this instance's liveness for other databases),
//! [`lease`] (holding sandboxes as a lease with an epoch: renewal, lapse, fencing) and
//! [`takeover`] (adopting the sandboxes of a holder that died).

mod adopt;
mod checkpoint;
mod copy;
pub use checkpoint::Checkpointed;
mod fork;
pub use fork::Forked;
pub(crate) mod beacon;
mod create;
pub(crate) mod lease;
mod live;
mod periodic;
pub(crate) mod pool;
mod port;
pub(crate) mod reaper;
mod removal;
pub(crate) mod takeover;
mod transfer;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bollard::query_parameters::{
    InspectContainerOptions, RemoveVolumeOptionsBuilder, WaitContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt;
use sandbox_executor::protocol::{Op, Response};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::DispatcherConfig;
use crate::engine::DockerEngine;
use crate::error::{engine, is_not_found, DispatchError, Result};
use crate::install::{self, ExecutorVolume};
use crate::placement::{self};
use crate::spec::{Owner, SandboxId, SandboxSpec};
use crate::store::{self, SandboxInfo};
use crate::stream::ExecutorStream;
use pool::Pool;

/// Extra time a `cmd.run` call waits beyond the command's own timeout and kill grace.
const RUN_DEADLINE_MARGIN: Duration = Duration::from_secs(5);
/// Kill grace the executor applies when a `cmd.run` does not say.
const DEFAULT_GRACE: Duration = Duration::from_millis(2000);

/// Handle on the sandboxes of one orchestrator instance. Cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("instance", &self.inner.instance)
            .field("scope", &self.inner.scope.label)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) docker: Docker,
    pub(crate) pg: PgPool,
    pub(crate) instance: Uuid,
    /// The ID of the Docker engine this instance drives (`placement.rs`).
    pub(crate) engine: String,
    pub(crate) scope: store::Scope,
    pub(crate) config: DispatcherConfig,
    pub(crate) executor: ExecutorVolume,
    /// Sandboxes whose stream this instance holds.
    pub(crate) sandboxes: RwLock<HashMap<SandboxId, Arc<Sandbox>>>,
    pub(crate) pool: Pool,
    pub(crate) shutdown: CancellationToken,
    /// New sandboxes get the socket channel (when `config.channel_dir` is set).
    pub(crate) socket_channel: std::sync::atomic::AtomicBool,
    /// Live processes of sandboxes held elsewhere that this instance follows (`relay.rs`).
    pub(crate) relays: crate::relay::Relays,
    /// The hold on the sandboxes above (`lease.rs`).
    pub(crate) lease: lease::Lease,
    /// Sandboxes this instance is claiming and attaching to right now (`takeover.rs`): a call
    /// for one waits for its stream instead of finding it nowhere.
    pub(crate) claiming: takeover::Claiming,
    /// The calls into held sandboxes in flight, and whether new ones are still taken
    /// (`takeover.rs`: a stop that keeps its sandboxes lets these end first).
    pub(crate) serving: takeover::Serving,
    /// Removals finishing in the background after [`Dispatcher::retire`] made their sandbox
    /// unreachable; shutdown waits for them, the reaper finishes any a crash cut short.
    pub(crate) removals: std::sync::Mutex<tokio::task::JoinSet<()>>,
    /// The bound on client data held in memory (`budget.rs`).
    pub(crate) memory: crate::budget::MemoryBudget,
    /// One freeze at a time per sandbox (`export_dir_frozen`): a second waits for the first.
    pub(crate) freezing: std::sync::Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// One sandbox this instance holds the stream of.
pub(crate) struct Sandbox {
    pub(crate) id: SandboxId,
    pub(crate) container: String,
    /// The spec it was created with (limits clamped; owner at creation).
    pub(crate) spec: SandboxSpec,
    pub(crate) stream: ExecutorStream,
    /// The row's epoch this instance holds it at: every write on the row says it.
    pub(crate) epoch: i64,
}

/// What [`Dispatcher::adopt`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdoptReport {
    /// Sandboxes now served by this instance.
    pub adopted: Vec<SandboxId>,
    /// Sandboxes that could not be taken over and were destroyed, with the reason.
    pub destroyed: Vec<(SandboxId, String)>,
}

impl Dispatcher {
    /// Starts the dispatcher of one orchestrator instance.
    ///
    /// `instance_id` must have a row in `node_instances` (the orchestrator writes one per start
    /// and heartbeats it). In order: settles the engine API version, installs the executor
    /// volume, renews its lease when it has one (and takes over the sandboxes of fenced peers),
    /// adopts the running sandboxes of `config.adopt_from`, runs the reaper once (so
    /// sandboxes of dead instances are gone before new ones are made), then starts the periodic
    /// lease renewal, reaper and the warm-pool refill in the background.
    pub async fn start(
        engine_handle: DockerEngine,
        pg: PgPool,
        instance_id: Uuid,
        config: DispatcherConfig,
    ) -> Result<Dispatcher> {
        // bollard speaks the newest API by default; older engines (20.10 speaks 1.41) refuse it.
        let docker = engine_handle
            .client()
            .clone()
            .negotiate_version()
            .await
            .map_err(engine("negotiating the Docker API version"))?;
        let scope = store::scope(&pg).await?;
        let engine_id =
            crate::engine::engine_id(&docker)
                .await
                .map_err(|e| DispatchError::EngineUnknown {
                    detail: e.to_string(),
                })?;
        placement::record_engine(&pg, instance_id, &engine_id).await?;
        let executor = install::install(&docker, &pg, &config, &scope, instance_id).await?;
        let pool = Pool::new(&config);
        let memory = crate::budget::MemoryBudget::new(config.max_buffered_bytes);
        let lease = lease::Lease::new(config.lease);
        let dispatcher = Dispatcher {
            inner: Arc::new(Inner {
                docker,
                pg,
                instance: instance_id,
                engine: engine_id,
                scope,
                config,
                executor,
                sandboxes: RwLock::new(HashMap::new()),
                pool,
                shutdown: CancellationToken::new(),
                socket_channel: std::sync::atomic::AtomicBool::new(true),
                relays: crate::relay::Relays::default(),
                lease,
                claiming: takeover::Claiming::default(),
                serving: takeover::Serving::default(),
                removals: std::sync::Mutex::new(tokio::task::JoinSet::new()),
                memory,
                freezing: std::sync::Mutex::new(HashMap::new()),
            }),
        };
        tracing::info!(instance = %instance_id, engine = %dispatcher.inner.engine, scope = %dispatcher.inner.scope.label, executor_volume = %dispatcher.inner.executor.name, "dispatcher starting");
        crate::cpu_groups::warn_if_starving();
        // Held from here on; a first takeover pass before the first reap.
        dispatcher.inner.tend_lease().await;
        let previous = dispatcher.inner.config.adopt_from.clone();
        for prev in previous {
            match dispatcher.adopt(prev).await {
                Ok(r) => {
                    tracing::info!(previous = %prev, adopted = r.adopted.len(), destroyed = r.destroyed.len(), "took over the sandboxes of a previous instance")
                }
                Err(e) => {
                    tracing::warn!(previous = %prev, error = %e, "could not adopt the sandboxes of a previous instance; the reaper will collect them")
                }
            }
        }
        // Alive for the reapers of other databases on this host before anything is created.
        if let Err(e) = dispatcher.inner.beat().await {
            tracing::warn!(error = %e, "no beacon published; other stacks on this host cannot tell this node is alive");
        }
        let report = dispatcher.reap().await?;
        tracing::info!(
            removed_containers = report.containers_removed,
            removed_volumes = report.volumes_removed,
            rows_closed = report.rows_closed,
            "start-up reaper done"
        );
        reaper::spawn_periodic(Arc::downgrade(&dispatcher.inner));
        lease::spawn_periodic(Arc::downgrade(&dispatcher.inner));
        beacon::spawn_periodic(Arc::downgrade(&dispatcher.inner));
        pool::spawn_refill(Arc::downgrade(&dispatcher.inner));
        Ok(dispatcher)
    }

    /// This instance's id (the `org.aegis.instance` label of what it creates).
    pub fn instance_id(&self) -> Uuid {
        self.inner.instance
    }

    /// This database's scope (the `org.aegis.scope` label); the reaper judges only this scope.
    pub fn scope(&self) -> &str {
        &self.inner.scope.label
    }

    /// The ID of the Docker engine this instance drives (`docker info`'s `ID`), as recorded in
    /// its `node_instances` row and in the rows of the sandboxes it creates.
    pub fn engine_id(&self) -> &str {
        &self.inner.engine
    }

    /// The executor volume mounted read-only into every sandbox.
    pub fn executor_volume(&self) -> &str {
        &self.inner.executor.name
    }

    /// Creates, starts and connects a new sandbox; returns when its executor is ready.
    ///
    /// It goes to this instance's engine while that has room, else to another replica's
    /// engine through that replica (`placement.rs`), which then holds it.
    /// On any failure what was created is removed, the row is marked `failed` with the reason,
    /// and the error says which step failed.
    pub async fn create(&self, spec: SandboxSpec) -> Result<SandboxId> {
        let spec = self.inner.config.admitted(spec)?;
        let inner = self.inner.clone();
        run_detached(async move { inner.place(spec, false).await }).await
    }

    /// Serves a creation a peer forwarded ([`Forwarder::create`](crate::Forwarder::create)):
    /// on this instance's own engine only, from its warm pool or fresh, never forwarded again;
    /// [`DispatchError::NoRoom`] when this engine is full.
    pub async fn create_held(&self, spec: SandboxSpec) -> Result<SandboxId> {
        let spec = self.inner.config.admitted(spec)?;
        let inner = self.inner.clone();
        run_detached(async move { inner.acquire(spec).await }).await
    }

    /// Sends one request to a sandbox's executor and returns its response.
    ///
    /// The deadline is the configured call timeout; for `cmd.run` it is the command's own
    /// `timeout_ms` plus its kill grace plus a margin. Many calls may be in flight on one sandbox.
    /// An executor-side failure (path refused, not found) is a normal [`Response`] with an
    /// `error` outcome; `Err` means the call could not be made or answered. A `proc.start` or
    /// `fs.watch` sent here gets its answer but not its events: use
    /// [`Dispatcher::start_process`] and [`Dispatcher::watch_dir`].
    pub async fn call(&self, id: SandboxId, op: Op) -> Result<Response> {
        let deadline = self.deadline_for(&op);
        self.call_with_deadline(id, op, deadline).await
    }

    /// [`Dispatcher::call`] with an explicit deadline.
    /// A sandbox another live instance holds is reached through the configured
    /// [`Forwarder`](crate::Forwarder) (see `forward.rs`).
    pub async fn call_with_deadline(
        &self,
        id: SandboxId,
        op: Op,
        deadline: Duration,
    ) -> Result<Response> {
        // A holder that stopped (or is stopping) took no call: the sandbox is handed over to
        // a live replica, this one when it can (`takeover.rs`), and the call made again, within
        // a bounded wait.
        let give_up = Instant::now() + deadline.min(takeover::HANDOVER_WAIT);
        let mut pause = Duration::from_millis(50);
        loop {
            let holder = match self.inner.locate(id).await? {
                Location::Here(sandbox) => {
                    let _serving = self.inner.serving.enter()?;
                    return sandbox.stream.call(op, deadline).await;
                }
                Location::Elsewhere(holder) => holder,
            };
            let Some(forwarder) = &self.inner.config.forwarder else {
                return Err(DispatchError::SandboxNotFound {
                    id,
                    attached_elsewhere: true,
                });
            };
            let unavailable = match forwarder.forward(holder, id, op.clone(), deadline).await {
                Err(e @ DispatchError::HolderUnavailable { .. }) => e,
                other => return other,
            };
            let stopping = matches!(
                unavailable,
                DispatchError::HolderUnavailable { stopping: true, .. }
            );
            match self.inner.hand_over(id, holder).await? {
                takeover::Handover::Moved if Instant::now() < give_up => continue,
                takeover::Handover::Moved => return Err(unavailable),
                // Crashed rather than stopping (its port refuses, it recorded no stop): a
                // clear error now; the takeover pass adopts the sandbox after `dead_after`.
                takeover::Handover::Alive if !stopping => return Err(unavailable),
                takeover::Handover::Never => return Err(unavailable),
                takeover::Handover::Alive | takeover::Handover::Elsewhere => {}
            }
            if Instant::now() + pause > give_up {
                return Err(unavailable);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Serves a call a peer forwarded: only into a sandbox this instance holds, never forwarded
    /// again (so two instances that disagree about the holder cannot bounce a call forever).
    pub async fn call_held(&self, id: SandboxId, op: Op, deadline: Duration) -> Result<Response> {
        // Refused as stopping first: after the stop lets go of its streams, "not found" would
        // be the wrong answer.
        let _serving = self.inner.serving.enter()?;
        let sandbox = self.inner.attached(id).await?;
        sandbox.stream.call(op, deadline).await
    }

    /// The deadline [`Dispatcher::call`] gives `op` (for a forwarding peer to pass along).
    pub fn deadline_of(&self, op: &Op) -> Duration {
        self.deadline_for(op)
    }

    /// Whether sandboxes created from now on get the socket channel (`config.channel_dir` must
    /// be set; on by default): off, they are served over the attach stream, as without a
    /// channel directory. Sandboxes already made keep theirs. For an operator turning the
    /// channel off without a restart, and for measuring both transports in one run.
    pub fn set_socket_channel(&self, on: bool) {
        self.inner
            .socket_channel
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// How calls reach sandbox `id`'s executor, if this instance holds it: its socket, or the
    /// attach stream (socket channel off, or its socket unreachable).
    pub fn transport(&self, id: SandboxId) -> Option<crate::Transport> {
        self.inner
            .held(id)
            .map(|sandbox| sandbox.stream.transport())
    }

    fn deadline_for(&self, op: &Op) -> Duration {
        match op {
            Op::CmdRun(run) => {
                let grace = run.grace_ms.map_or(DEFAULT_GRACE, Duration::from_millis);
                Duration::from_millis(run.timeout_ms) + grace + RUN_DEADLINE_MARGIN
            }
            _ => self.inner.config.call_timeout,
        }
    }

    /// Destroys a sandbox: its stream is closed (pending calls fail with `SandboxGone`), its
    /// container is removed by force and its workspace volume removed, its row marked
    /// `destroyed`. Idempotent; works for sandboxes held by other instances too.
    /// A sandbox on another engine is destroyed by a replica beside that engine: its holder,
    /// or another live replica driving the same engine when the holder is gone.
    pub async fn destroy(&self, id: SandboxId) -> Result<()> {
        if self.inner.held(id).is_none() {
            let there = placement::elsewhere(
                &self.inner.pg,
                id,
                &self.inner.engine,
                self.inner.config.dead_after,
            )
            .await?;
            if let Some(there) = there {
                let Some(forwarder) = &self.inner.config.forwarder else {
                    return Err(DispatchError::SandboxNotFound {
                        id,
                        attached_elsewhere: true,
                    });
                };
                let Some(via) = there.via else {
                    return Err(DispatchError::Forward {
                        id,
                        holder: there.holder,
                        detail: format!(
                            "no live replica drives its engine {} any more; the reaper of the \
                             next one to start there removes it",
                            there.engine
                        ),
                    });
                };
                return forwarder.destroy(via, id).await;
            }
        }
        let inner = self.inner.clone();
        run_detached(async move { inner.destroy(id, "destroyed by owner").await }).await
    }

    /// Destroys a sandbox off the caller's path: answers once no call can reach it any more
    /// (its row says `destroying`, its stream is closed) and removes its container, network and
    /// workspace in the background. Nothing leaks: shutdown waits for those removals, and the
    /// reaper finishes one a crash cut short (a `destroying` row). A sandbox this instance does
    /// not hold is destroyed as [`Dispatcher::destroy`] does.
    pub async fn retire(&self, id: SandboxId) -> Result<()> {
        if self.inner.held(id).is_none() {
            return self.destroy(id).await;
        }
        let inner = self.inner.clone();
        // Detached, both halves: a caller that goes away cannot leave it half-retired.
        run_detached(async move {
            let Some(removal) = inner.unreachable(id, "destroyed by owner").await? else {
                return Ok(());
            };
            let remover = inner.clone();
            let mut removals = inner.removals.lock().unwrap_or_else(|p| p.into_inner());
            // Forget the ones that ended, so the set holds only what is in flight.
            while removals.try_join_next().is_some() {}
            removals.spawn(async move {
                if let Err(e) = remover.remove(removal).await {
                    tracing::warn!(sandbox = %id, error = %e, "could not finish removing a retired sandbox; the reaper will");
                }
            });
            Ok(())
        })
        .await
    }

    /// Serves a destruction a peer forwarded ([`Forwarder::destroy`](crate::Forwarder::destroy)):
    /// only a sandbox on this instance's own engine, never forwarded again.
    pub async fn destroy_held(&self, id: SandboxId) -> Result<()> {
        if self.inner.held(id).is_none()
            && placement::elsewhere(
                &self.inner.pg,
                id,
                &self.inner.engine,
                self.inner.config.dead_after,
            )
            .await?
            .is_some()
        {
            return Err(DispatchError::SandboxNotFound {
                id,
                attached_elsewhere: true,
            });
        }
        let inner = self.inner.clone();
        run_detached(async move { inner.destroy(id, "destroyed by owner").await }).await
    }

    /// Destroys every live sandbox of `owner` (execution ended, session revoked); returns how
    /// many were destroyed.
    pub async fn destroy_owned_by(&self, owner: &Owner) -> Result<usize> {
        let ids = store::owned_by(&self.inner.pg, owner).await?;
        let mut destroyed = 0;
        for id in ids {
            match self.destroy(id).await {
                Ok(()) => destroyed += 1,
                Err(DispatchError::SandboxNotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(destroyed)
    }

    /// Live sandboxes (creating, running, destroying) of every instance of this database.
    pub async fn list(&self) -> Result<Vec<SandboxInfo>> {
        store::list_live(&self.inner.pg).await
    }

    /// One sandbox, whatever its state.
    pub async fn get(&self, id: SandboxId) -> Result<SandboxInfo> {
        self.inner.row(id).await
    }

    /// Takes over the running sandboxes of a previous instance of this orchestrator.
    ///
    /// Each one's row is moved to this instance (a conditional update, so the reaper or another
    /// adopter cannot take it at the same time), its container's stdin/stdout are attached again
    /// and the executor is pinged. Sandboxes whose container is no longer running, that do not
    /// answer, or that belonged to the previous instance's warm pool are destroyed instead.
    ///
    /// When to call it is the orchestrator's decision: after a restart, if executions that owned
    /// sandboxes are to be resumed, adopt before the previous instance counts as dead
    /// (`dead_after`); otherwise do nothing and the reaper collects them. Requests the previous
    /// instance had in flight are lost; their answers are ignored.
    pub async fn adopt(&self, previous_instance: Uuid) -> Result<AdoptReport> {
        let inner = self.inner.clone();
        run_detached(async move { inner.adopt(previous_instance).await }).await
    }

    /// Stops the background tasks and destroys the idle warm-pool sandboxes. Sandboxes handed
    /// to owners are left running (detached) for a later [`Dispatcher::adopt`] or the reaper.
    /// Stops like [`Dispatcher::shutdown`], destroying first every sandbox this instance holds
    /// or has recorded as live, then its beacons: a stopped node leaves nothing in Docker.
    /// Returns how many sandboxes were destroyed.
    pub async fn shutdown_destroying(&self) -> usize {
        self.inner.shutdown.cancel();
        self.inner.finish_removals().await;
        let mut ids: HashSet<SandboxId> = self
            .inner
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect();
        match store::live_of_instance(&self.inner.pg, self.inner.instance).await {
            Ok(rows) => ids.extend(rows),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list this instance's sandboxes; destroying the ones it holds")
            }
        }
        let inner = &self.inner;
        let results = futures_util::future::join_all(ids.iter().map(|id| async move {
            let r = inner.destroy(*id, "destroyed at shutdown").await;
            if let Err(e) = &r {
                tracing::warn!(sandbox = %id, error = %e, "could not destroy a sandbox at shutdown; the next reaper will");
            }
            r.is_ok()
        }))
        .await;
        let destroyed = results.into_iter().filter(|ok| *ok).count();
        self.shutdown().await;
        self.inner.silence().await;
        // Leave nothing of ours on the engine: the executor volume goes too when no other node
        // on this engine is alive (beacons) and no container mounts it (Docker refuses then).
        if !self.inner.others_alive().await {
            let name = &self.inner.executor.name;
            match self
                .inner
                .docker
                .remove_volume(
                    name,
                    Some(RemoveVolumeOptionsBuilder::new().force(false).build()),
                )
                .await
            {
                Ok(()) => tracing::info!(volume = %name, "executor volume removed"),
                Err(e) => {
                    tracing::debug!(volume = %name, error = %e, "executor volume kept (in use or gone)")
                }
            }
        }
        tracing::info!(
            destroyed,
            "sandboxes of this instance destroyed at shutdown"
        );
        destroyed
    }

    /// Stops the background tasks, destroys the idle pool and lets go of the held sandboxes,
    /// which keep running for adoption by the next instance (see `shutdown_destroying`).
    pub async fn shutdown(&self) {
        // Calls in flight end first (a peer's forwarded ones too); new ones are refused as
        // `ShuttingDown`, which a peer takes as "hand it over" (`takeover.rs`).
        self.inner
            .serving
            .close_and_wait(takeover::DRAIN_WAIT)
            .await;
        self.inner.finish_removals().await;
        self.inner.shutdown.cancel();
        let idle = self.inner.pool.drain();
        for id in idle {
            if let Err(e) = self.inner.destroy(id, "pool drained at shutdown").await {
                tracing::warn!(sandbox = %id, error = %e, "could not destroy an idle pool sandbox at shutdown");
            }
        }
        let held: Vec<Arc<Sandbox>> = self
            .inner
            .sandboxes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, s)| s)
            .collect();
        for sandbox in held {
            sandbox.stream.close("the dispatcher shut down");
        }
    }
}

/// Runs a lifecycle step in its own task so that a caller giving up cannot cut it in half.
pub(crate) async fn run_detached<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    match tokio::spawn(work).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(DispatchError::ShuttingDown),
    }
}

/// Where a live sandbox's stream is held.
pub(crate) enum Location {
    /// By this instance.
    Here(Arc<Sandbox>),
    /// By another instance (its id), according to the sandbox's row.
    Elsewhere(Uuid),
}

impl Inner {
    /// Sandbox `id`'s row, whatever its state and holder, or "not found".
    pub(crate) async fn row(&self, id: SandboxId) -> Result<SandboxInfo> {
        store::get(&self.pg, id)
            .await?
            .ok_or(DispatchError::SandboxNotFound {
                id,
                attached_elsewhere: false,
            })
    }

    /// The sandbox this instance holds, or a precise "not found".
    pub(crate) async fn attached(&self, id: SandboxId) -> Result<Arc<Sandbox>> {
        match self.locate(id).await? {
            Location::Here(sandbox) => Ok(sandbox),
            Location::Elsewhere(_) => Err(DispatchError::SandboxNotFound {
                id,
                attached_elsewhere: true,
            }),
        }
    }

    /// Who holds sandbox `id`'s stream: this instance, another one, or nobody (a precise error).
    pub(crate) async fn locate(&self, id: SandboxId) -> Result<Location> {
        if let Some(here) = self.held_here(id)? {
            return Ok(here);
        }
        self.lease.check_dropped(id)?;
        match store::get(&self.pg, id).await? {
            Some(info) if info.state.is_terminal() => Err(DispatchError::SandboxGone {
                id,
                reason: info
                    .reason
                    .unwrap_or_else(|| info.state.as_str().to_owned()),
            }),
            Some(info) if info.state == store::SandboxState::Checkpointed => {
                Err(DispatchError::Checkpointed { id })
            }
            Some(info) if info.instance_id != self.instance => {
                Ok(Location::Elsewhere(info.instance_id))
            }
            Some(_) => {
                // Its row names this instance but its stream is not held: claimed here right
                // now (`takeover.rs`; marked before the claim, unmarked after the hold), so
                // wait for the stream rather than answer "not found".
                self.claiming
                    .wait_for(id, self.config.ready_timeout * 2)
                    .await;
                self.held_here(id)?.ok_or(DispatchError::SandboxNotFound {
                    id,
                    attached_elsewhere: false,
                })
            }
            None => Err(DispatchError::SandboxNotFound {
                id,
                attached_elsewhere: false,
            }),
        }
    }

    /// The sandbox when this instance holds its stream and may serve it; `None` when it does
    /// not hold it.
    fn held_here(&self, id: SandboxId) -> Result<Option<Location>> {
        let Some(sandbox) = self.held(id) else {
            return Ok(None);
        };
        // An idle pool sandbox has no owner yet, so nobody may use it.
        if self.pool.is_idle(id) {
            return Err(DispatchError::SandboxNotFound {
                id,
                attached_elsewhere: false,
            });
        }
        // Held only while the lease holds: a lapsed one may be another's by now.
        self.lease.check(Some(id))?;
        Ok(Some(Location::Here(sandbox)))
    }

    pub(crate) fn held(&self, id: SandboxId) -> Option<Arc<Sandbox>> {
        self.sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    pub(crate) fn hold(&self, sandbox: Arc<Sandbox>) {
        self.sandboxes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(sandbox.id, sandbox);
    }

    pub(crate) fn release(&self, id: SandboxId) -> Option<Arc<Sandbox>> {
        self.sandboxes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id)
    }
}

/// A random number without a dependency on `rand`: the low bits of a v4 UUID.
fn rand_u32() -> u32 {
    let bytes = Uuid::new_v4().into_bytes();
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// `"; container exited with code 137 (OOM killed)"`, or empty when it cannot be told.
pub(crate) async fn describe_exit(docker: &Docker, container: &str) -> String {
    // Give the engine a moment to record the exit that closed the stream.
    let mut wait = docker.wait_container(
        container,
        Some(
            WaitContainerOptionsBuilder::new()
                .condition("not-running")
                .build(),
        ),
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), wait.next()).await;
    match docker
        .inspect_container(container, None::<InspectContainerOptions>)
        .await
    {
        Ok(inspect) => match inspect.state {
            Some(state) if state.running != Some(true) => {
                let mut s = format!(
                    "; container exited with code {}",
                    state.exit_code.unwrap_or(-1)
                );
                if state.oom_killed == Some(true) {
                    s.push_str(" (OOM killed: memory limit reached)");
                }
                if let Some(error) = state.error.filter(|e| !e.is_empty()) {
                    s.push_str(&format!(" ({error})"));
                }
                s
            }
            _ => String::new(),
        },
        Err(e) if is_not_found(&e) => "; container removed".to_owned(),
        Err(_) => String::new(),
    }
}
