//! Making a sandbox: where it goes (this engine, its warm pool, or another replica's), the
//! Docker objects in the order that lets the reaper find anything a crash leaves, the
//! executor's handshake, and its egress network.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Instant;

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::CreateContainerOptionsBuilder;

use super::{describe_exit, Inner, Sandbox};
use crate::error::{engine, is_not_found, DispatchError, Result};
use crate::placement::Target;
use crate::spec::{NetworkMode, Owner, SandboxId, SandboxSpec};
use crate::stream::ExecutorStream;
use crate::{hardening, install, labels, placement, store};

/// The names of one sandbox's Docker objects on this engine: its container and its workspace
/// volume. A new sandbox's are `aegis-sbx-<id>` and `aegis-ws-<id>` ([`Inner::record_creating`]);
/// a restored one moves to a container of a new name on the same volume.
#[derive(Debug, Clone)]
pub(super) struct ObjectNames {
    pub(super) id: SandboxId,
    pub(super) container: String,
    pub(super) volume: String,
}

/// How a failure to create one of sandbox `id`'s Docker objects (`what`: its workspace volume,
/// its container, a workspace holder, a fork copy helper) is told: [`DispatchError::Create`],
/// naming the image.
pub(super) fn create_failed<'s>(
    id: SandboxId,
    spec: &'s SandboxSpec,
    what: &'static str,
) -> impl Fn(bollard::errors::Error) -> DispatchError + 's {
    move |source| DispatchError::Create {
        id,
        image: spec.image.clone(),
        what,
        source,
    }
}

impl Inner {
    /// Creates (does not start) the container `name` from `body`; answers its id.
    pub(super) async fn create_named(
        &self,
        name: &str,
        body: ContainerCreateBody,
    ) -> std::result::Result<String, bollard::errors::Error> {
        self.docker
            .create_container(
                Some(CreateContainerOptionsBuilder::new().name(name).build()),
                body,
            )
            .await
            .map(|created| created.id)
    }

    /// Makes a sandbox for `spec` (validated) where there is room: on this engine (from the
    /// warm pool when `from_pool`), else on the other live replicas' engines, least loaded
    /// first. A full engine, one that cannot run the spec's isolation class (no `runsc`) or an
    /// unreachable replica sends it to the next; every other error is the answer. When no
    /// engine could run the class, that refusal is the answer.
    pub(crate) async fn place(
        self: &Arc<Self>,
        spec: SandboxSpec,
        from_pool: bool,
    ) -> Result<SandboxId> {
        let targets = placement::targets(
            &self.pg,
            &self.engine,
            self.config.dead_after,
            self.config.forwarder.is_some(),
        )
        .await?;
        let mut refusals = Vec::new();
        let (mut unavailable, mut lacking): (Option<DispatchError>, usize) = (None, 0);
        for target in targets {
            let attempt = match &target {
                Target::Here if from_pool => self.acquire(spec.clone()).await,
                Target::Here => self
                    .create_detached(spec.clone(), spec.owner.clone())
                    .await
                    .map(|sandbox| sandbox.id),
                Target::Peer {
                    instance,
                    engine,
                    live,
                } => {
                    let Some(forwarder) = &self.config.forwarder else {
                        continue;
                    };
                    tracing::debug!(target = %instance, %engine, live, "placing a sandbox on another engine");
                    forwarder.create(*instance, spec.clone()).await
                }
            };
            match attempt {
                Err(DispatchError::NoRoom { detail }) => refusals.push(detail),
                Err(e @ DispatchError::IsolationUnavailable { .. }) => {
                    refusals.push(e.to_string());
                    lacking += 1;
                    unavailable.get_or_insert(e);
                }
                Err(DispatchError::Forward { detail, holder, .. }) => {
                    refusals.push(format!("replica {holder} could not be asked: {detail}"))
                }
                Err(DispatchError::ForwardCreate { target, detail }) => {
                    refusals.push(format!("replica {target} could not be asked: {detail}"))
                }
                other => return other,
            }
        }
        match unavailable {
            // Every engine asked lacks the class's runtime: say what to install.
            Some(e) if lacking == refusals.len() => Err(e),
            _ => Err(DispatchError::NoRoom {
                detail: refusals.join("; "),
            }),
        }
    }

    /// Creates a sandbox in its own task; destroys it if the caller stopped waiting meanwhile.
    pub(crate) async fn create_detached(
        self: &Arc<Self>,
        spec: SandboxSpec,
        owner: Owner,
    ) -> Result<Arc<Sandbox>> {
        if self.shutdown.is_cancelled() {
            return Err(DispatchError::ShuttingDown);
        }
        // An instance that may be taken for dead makes nothing it could not hold.
        self.lease.check(None)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let inner = self.clone();
        tokio::spawn(async move {
            let result = inner.create_sandbox(spec, owner).await;
            if let Err(Ok(orphan)) = tx.send(result) {
                tracing::info!(sandbox = %orphan.id, "creator gave up waiting; destroying the new sandbox");
                let _ = inner.destroy(orphan.id, "creator gave up waiting").await;
            }
        });
        rx.await.map_err(|_| DispatchError::ShuttingDown)?
    }

    pub(super) async fn create_sandbox(
        self: &Arc<Self>,
        spec: SandboxSpec,
        owner: Owner,
    ) -> Result<Arc<Sandbox>> {
        let started = Instant::now();
        self.check_isolation(&spec).await?;
        match self.docker.inspect_image(&spec.image).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {
                return Err(DispatchError::ImageMissing {
                    image: spec.image.clone(),
                })
            }
            Err(e) => return Err(engine(format!("inspecting image {}", spec.image))(e)),
        }
        let names = self
            .record_creating(&spec, &owner, "recording a new sandbox")
            .await?;
        let id = names.id;

        match self.materialize(&names, &spec, &owner).await {
            Ok((stream, container_id)) => {
                let sandbox = Arc::new(Sandbox {
                    id,
                    container: names.container.clone(),
                    spec,
                    stream,
                    epoch: store::FIRST_EPOCH,
                });
                // Held before the row says running, so a call right after cannot miss it.
                self.hold(sandbox.clone());
                match store::mark_running(&self.pg, id, self.instance, &container_id).await {
                    Ok(true) => {
                        tracing::info!(sandbox = %id, owner = %owner, image = %sandbox.spec.image, elapsed_ms = started.elapsed().as_millis() as u64, "sandbox ready");
                        Ok(sandbox)
                    }
                    Ok(false) => {
                        // Destroyed (or reaped) while it was being created.
                        self.release(id);
                        sandbox.stream.close("destroyed while being created");
                        self.remove_objects(id, &names.container, &names.volume)
                            .await;
                        Err(DispatchError::SandboxGone {
                            id,
                            reason: "destroyed while being created".to_owned(),
                        })
                    }
                    Err(e) => {
                        self.release(id);
                        sandbox.stream.close("could not be recorded as running");
                        self.remove_objects(id, &names.container, &names.volume)
                            .await;
                        let _ = self.mark_new_failed(id, &e.to_string()).await;
                        Err(e)
                    }
                }
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, image = %spec.image, error = %e, "sandbox creation failed; cleaning up");
                self.remove_objects(id, &names.container, &names.volume)
                    .await;
                if let Err(db_error) = self.mark_new_failed(id, &e.to_string()).await {
                    tracing::warn!(sandbox = %id, error = %db_error, "could not record the failure");
                }
                Err(e)
            }
        }
    }

    /// A new sandbox's id and object names, and its `creating` row, inserted in the same
    /// transaction that admits it against this engine's bound (`placement.rs`): the one way a
    /// sandbox made on this engine is recorded, whether created or forked. `action` names the
    /// step in a database error.
    pub(super) async fn record_creating(
        &self,
        spec: &SandboxSpec,
        owner: &Owner,
        action: &'static str,
    ) -> Result<ObjectNames> {
        let id = SandboxId::new();
        let names = ObjectNames {
            id,
            container: format!("aegis-sbx-{id}"),
            volume: format!("aegis-ws-{id}"),
        };
        let mut tx = self.pg.begin().await.map_err(crate::error::db(action))?;
        placement::admit(
            &mut tx,
            &self.engine,
            &self.config.engine_limit,
            placement::reserved_bytes(&spec.limits),
        )
        .await?;
        store::insert_creating(
            &mut *tx,
            id,
            self.instance,
            &self.engine,
            spec,
            owner,
            &names.container,
            &names.volume,
        )
        .await?;
        tx.commit().await.map_err(crate::error::db(action))?;
        Ok(names)
    }

    /// Records that a sandbox this instance was making (still in its first epoch) failed, for
    /// `reason`; whether its row said so.
    pub(super) async fn mark_new_failed(&self, id: SandboxId, reason: &str) -> Result<bool> {
        store::mark_failed(&self.pg, id, (self.instance, store::FIRST_EPOCH), reason).await
    }

    /// Refuses a class this engine cannot run (its runtime not in `docker info`), before any
    /// row or object exists: a gVisor sandbox never silently becomes a runc one.
    async fn check_isolation(&self, spec: &SandboxSpec) -> Result<()> {
        let isolation = spec.isolation();
        if isolation.docker_runtime().is_none() {
            return Ok(());
        }
        let info = self
            .docker
            .info()
            .await
            .map_err(engine("reading the engine's runtimes (docker info)"))?;
        let runtimes: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
        match crate::isolation::missing_runtime(isolation, &runtimes) {
            None => Ok(()),
            Some(detail) => Err(DispatchError::IsolationUnavailable { isolation, detail }),
        }
    }

    /// Volume, container, attach, start, ready: the Docker half of a creation.
    pub(super) async fn materialize(
        self: &Arc<Self>,
        names: &ObjectNames,
        spec: &SandboxSpec,
        owner: &Owner,
    ) -> Result<(ExecutorStream, String)> {
        let id = names.id;
        let channel = self
            .config
            .channel_dir
            .as_deref()
            // Not where root may run: the executor trusts any uid-0 peer of its socket as the
            // node, and a root command would be one (the attach stream serves instead).
            .filter(|_| {
                self.socket_channel
                    .load(std::sync::atomic::Ordering::Relaxed)
                    && !spec.root_allowed()
            })
            .and_then(|base| crate::channel::prepare(base, id));
        let created = self
            .make_objects(names, spec, owner, channel.as_deref(), true)
            .await?;
        self.start_made(id, spec, &names.container, created, channel.as_deref())
            .await
    }

    /// The Docker objects of a new sandbox, nothing started: its workspace volume, its network
    /// (and its egress proxy when `open_proxy`; else the caller's re-attach opens it), the
    /// executor volume when it is gone, and its container. Returns the container's id.
    pub(super) async fn make_objects(
        self: &Arc<Self>,
        names: &ObjectNames,
        spec: &SandboxSpec,
        owner: &Owner,
        channel: Option<&std::path::Path>,
        open_proxy: bool,
    ) -> Result<String> {
        let id = names.id;
        let mut volume_labels = self.labels(id, owner);
        volume_labels.insert(labels::COMPONENT.to_owned(), "workspace".to_owned());
        self.docker
            .create_volume(hardening::workspace_volume(
                spec,
                &names.volume,
                volume_labels,
            ))
            .await
            .map_err(create_failed(id, spec, "workspace volume"))?;

        if spec.network == NetworkMode::Egress {
            self.open_egress(id, spec, owner, open_proxy).await?;
        }

        // The executor volume is shared by the nodes of this engine and removed by a node that
        // stops with `destroy` when no container uses it; a node still running puts it back.
        if let Err(e) = self.docker.inspect_volume(&self.executor.name).await {
            if is_not_found(&e) {
                tracing::info!(volume = %self.executor.name, "executor volume gone; installing it again");
                install::install(
                    &self.docker,
                    &self.pg,
                    &self.config,
                    &self.scope,
                    self.instance,
                )
                .await?;
            }
        }

        self.create_container_of(names, spec, owner, channel).await
    }

    /// Creates (does not start) the hardened container `names.container` of sandbox `names.id`
    /// on its volume: a new sandbox's, a fork's, or the one a checkpointed sandbox is restored
    /// into.
    pub(super) async fn create_container_of(
        &self,
        names: &ObjectNames,
        spec: &SandboxSpec,
        owner: &Owner,
        channel: Option<&std::path::Path>,
    ) -> Result<String> {
        let id = names.id;
        let mut container_labels = self.labels(id, owner);
        container_labels.insert(labels::COMPONENT.to_owned(), "sandbox".to_owned());
        for (k, v) in &spec.labels {
            container_labels.insert(k.clone(), v.clone());
        }
        let body = hardening::sandbox_container(
            id,
            spec,
            &self.executor,
            &names.volume,
            container_labels,
            &self.config,
            channel,
        );
        self.create_named(&names.container, body)
            .await
            .map_err(|source| {
                if is_not_found(&source) {
                    DispatchError::ImageMissing {
                        image: spec.image.clone(),
                    }
                } else {
                    create_failed(id, spec, "container")(source)
                }
            })
    }

    /// Attach, start, ready: a sandbox made by [`Inner::make_objects`] (container `created`)
    /// started fresh.
    async fn start_made(
        self: &Arc<Self>,
        id: SandboxId,
        spec: &SandboxSpec,
        container: &str,
        created: String,
        channel: Option<&std::path::Path>,
    ) -> Result<(ExecutorStream, String)> {
        let (stream, ready) = ExecutorStream::attach(
            &self.docker,
            container,
            id,
            1,
            self.config.max_response_bytes,
            self.on_break(id, container, store::FIRST_EPOCH),
        )
        .await?;
        self.docker
            .start_container(container, None)
            .await
            .map_err(|source| DispatchError::Start { id, source })?;

        let timeout = self.config.ready_timeout;
        let detail = match tokio::time::timeout(timeout, ready).await {
            Ok(Ok(Ok(ready))) if ready.landlock_abi == 0 && self.config.require_landlock => {
                if spec.isolation() == crate::isolation::Isolation::Gvisor {
                    "gVisor's kernel offers no Landlock (runsc 2022 lacks landlock_create_ruleset), \
                     so commands could not be confined by it (sandbox.require_landlock is on; \
                     set it to false to run gVisor sandboxes under gVisor's boundary, the \
                     executor's path rules and the argv policy, see ARCHITECTURE.md \
                     \"The gVisor class\")"
                        .to_owned()
                } else {
                    "the kernel offers no Landlock inside the sandbox, so commands could not be \
                     confined (sandbox.require_landlock is on)"
                        .to_owned()
                }
            }
            Ok(Ok(Ok(ready))) => {
                tracing::debug!(sandbox = %id, isolation = %spec.isolation(), path_rules = ?ready.path_rules, landlock_abi = ready.landlock_abi, "executor ready");
                let stream = match (&self.config.channel_dir, channel) {
                    (Some(base), Some(_)) if ready.channel => {
                        self.switch_to_socket(id, container, base, stream).await
                    }
                    _ => stream,
                };
                return Ok((stream, created));
            }
            Ok(Ok(Err(detail))) => detail,
            Ok(Err(_)) => "the stream closed before the ready line".to_owned(),
            Err(_) => "no ready line".to_owned(),
        };
        stream.close("the executor did not become ready");
        let exit = describe_exit(&self.docker, container).await;
        Err(DispatchError::ExecutorNotReady {
            id,
            timeout,
            detail: format!("{detail}{exit}"),
        })
    }

    /// Connects to the executor's socket and closes the attach stream (which carried the ready
    /// line); keeps the attach stream when the socket cannot be reached.
    pub(super) async fn switch_to_socket(
        self: &Arc<Self>,
        id: SandboxId,
        container: &str,
        base: &std::path::Path,
        attached: ExecutorStream,
    ) -> ExecutorStream {
        let path = crate::channel::socket_of(base, id);
        match ExecutorStream::connect(
            &path,
            id,
            1,
            self.config.max_response_bytes,
            self.on_break(id, container, store::FIRST_EPOCH),
        )
        .await
        {
            Ok(socket) => {
                attached.close("the sandbox is served over its socket");
                socket
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, socket = %path.display(), error = %e, "cannot connect to the executor's socket; serving over the attach stream");
                attached
            }
        }
    }

    /// The labels every object of sandbox `id` carries.
    pub(super) fn labels(&self, id: SandboxId, owner: &Owner) -> HashMap<String, String> {
        let mut labels = HashMap::from([
            (labels::MANAGED.to_owned(), "true".to_owned()),
            (labels::INSTANCE.to_owned(), self.instance.to_string()),
            (labels::SANDBOX.to_owned(), id.to_string()),
            (
                labels::OWNER_KIND.to_owned(),
                owner.kind.as_str().to_owned(),
            ),
            (labels::OWNER_ID.to_owned(), owner.id.clone()),
            (
                labels::CREATED_AT.to_owned(),
                chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            ),
        ]);
        labels.extend(self.scope.labels());
        labels
    }

    /// What to do when a sandbox's stream ends unasked: record why in its row, if this instance
    /// still holds it at `epoch` (a stream that broke because another instance took the
    /// sandbox over records nothing).
    pub(super) fn on_break(
        self: &Arc<Self>,
        id: SandboxId,
        container: &str,
        epoch: i64,
    ) -> crate::stream::OnBreak {
        let weak: Weak<Inner> = Arc::downgrade(self);
        let container = container.to_owned();
        Box::new(move |reason: String| {
            tokio::spawn(async move {
                let Some(inner) = weak.upgrade() else { return };
                let exit = describe_exit(&inner.docker, &container).await;
                let reason = format!("{reason}{exit}");
                match store::mark_failed(&inner.pg, id, (inner.instance, epoch), &reason).await {
                    Ok(true) => tracing::warn!(sandbox = %id, %reason, "sandbox stream broke"),
                    Ok(false) => {
                        tracing::info!(sandbox = %id, %reason, "stream of a sandbox this instance no longer holds ended; nothing recorded")
                    }
                    Err(e) => {
                        tracing::warn!(sandbox = %id, error = %e, "could not record the broken stream")
                    }
                }
                inner.pool.forget(id);
            });
        })
    }
}
