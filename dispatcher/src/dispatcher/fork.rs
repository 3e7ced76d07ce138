//! Fork that keeps memory: a gVisor sandbox's processes, open files and memory copied into new
//! sandboxes of their own, each running on from the source's state, the source running on too.
//!
//! What was measured on these machines (Docker 20.10, runsc 2022-12, ptrace platform) and why
//! the steps are what they are:
//!
//! - `docker checkpoint create --leave-running` fails under runsc (`panic: invalid state
//!   transition: paused => stopped`, the container left paused): the source is checkpointed
//!   as a pause is ([`Inner::checkpoint`], it stops) and restored right after the copy below
//!   ([`Inner::restore`]); it is unreachable for that while (calls answer `Checkpointed`).
//! - `docker start --checkpoint-dir` is refused by Docker 20.10 ("custom checkpointdir is not
//!   supported"): a container starts only from a checkpoint in its own directory
//!   (`<data root>/containers/<id>/checkpoints/<name>`). runsc restores a checkpoint into a
//!   container of another id (same spec, other volume) without complaint, so each fork's
//!   container is created first and the source's checkpoint copied into its directory.
//! - The workspace is a tmpfs volume, unmounted (files gone) when its last container stops:
//!   each fork's new volume is held by a holder (`checkpoint.rs`) from before the copy to after
//!   its start, as a paused sandbox's is.
//! - The copy (the source's workspace files into each fork's volume, the checkpoint into each
//!   fork's directory) is made on the engine by a short-lived helper container
//!   (`aegis-fcopy-<source>`: the source's image under runc, no network, read-only root, only
//!   the capabilities `cp -a` needs as root), so it works wherever the engine is (the node never
//!   reads the engine's data root itself). It runs while the source is stopped, so files and
//!   memory are of the same moment.
//! - Each fork starts from its copy (`start_from_checkpoint`), is re-attached and pinged as a restore is
//!   (`adopt.rs`'s `reattach`: its live processes followed, its egress proxy opened on its own
//!   network), then its copy of the checkpoint and its holder are removed: no checkpoint data
//!   is left on disk once the forks run (the source's own goes with its restore).
//! - A source whose container was itself started from a checkpoint is refused
//!   (`checkpoint::RESTORED_ONCE`, checked by `can_checkpoint`): this engine cannot restore it
//!   after a second checkpoint. The forks and the source are such containers afterwards.

use std::sync::Arc;

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::{CreateContainerOptionsBuilder, InspectContainerOptions};
use futures_util::StreamExt;

use super::checkpoint::CHECKPOINT;
use super::{Dispatcher, Inner, Location};
use crate::error::{engine, DispatchError, Result};
use crate::spec::{SandboxId, SandboxSpec};
use crate::{labels, placement, store};

/// What a fork that keeps memory made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forked {
    /// The new sandboxes, each running on from the source's state (held by this instance).
    pub forks: Vec<SandboxId>,
    /// Why each fork that did not start failed (the others run).
    pub failed: Vec<String>,
    /// The memory the source held: what each copy of its checkpoint took on disk, about.
    pub memory_bytes: u64,
}

/// A fork's objects, made before the source stops.
struct Made {
    id: SandboxId,
    container: String,
    container_id: String,
}

impl Dispatcher {
    /// Forks sandbox `id` (held here, gVisor class, on an engine that checkpoints) into
    /// `count` new sandboxes with its spec and owner, each running on from its processes,
    /// open files, memory and workspace files; the source is stopped for the copy and restored.
    /// Refused, with nothing changed, when its class or the engine cannot
    /// ([`DispatchError::CheckpointUnavailable`]) or when its memory times `count + 1` (the
    /// copies on disk at once) is more than `max_bytes`.
    pub async fn fork(&self, id: SandboxId, count: usize, max_bytes: u64) -> Result<Forked> {
        let inner = self.inner.clone();
        super::run_detached(async move { inner.fork(id, count, max_bytes).await }).await
    }
}

impl Inner {
    async fn fork(self: &Arc<Self>, id: SandboxId, count: usize, max_bytes: u64) -> Result<Forked> {
        let sandbox = match self.locate(id).await? {
            Location::Here(sandbox) => sandbox,
            Location::Elsewhere(_) => {
                return Err(DispatchError::SandboxNotFound {
                    id,
                    attached_elsewhere: true,
                })
            }
        };
        self.can_checkpoint(id, &sandbox.spec, &sandbox.container)
            .await?;
        let memory_bytes = self.memory_in_use(id, &sandbox.container).await?;
        let copies = u64::try_from(count).unwrap_or(u64::MAX).saturating_add(1);
        let bytes = memory_bytes.saturating_mul(copies);
        if bytes > max_bytes {
            return Err(DispatchError::CheckpointTooLarge {
                id,
                bytes,
                max_bytes,
            });
        }
        let root = self
            .docker
            .info()
            .await
            .map_err(engine("reading the engine's data root (docker info)"))?
            .docker_root_dir
            .ok_or_else(|| DispatchError::CheckpointUnavailable {
                id,
                detail: "the engine does not say where its data root is".to_owned(),
            })?;
        let source_container_id = self.container_id(&sandbox.container).await?;

        // The forks' objects first, so the source is stopped only for the copy.
        let mut made = Vec::new();
        for _ in 0..count {
            match self.make_fork(&sandbox.spec).await {
                Ok(fork) => made.push(fork),
                Err(e) => {
                    self.drop_forks(&made, "its fork failed").await;
                    return Err(e);
                }
            }
        }
        if let Err(e) = self.checkpoint(id, u64::MAX).await {
            self.drop_forks(&made, "its source could not be checkpointed")
                .await;
            return Err(e);
        }
        let copied = self
            .copy_into_forks(id, &sandbox.spec, &root, &source_container_id, &made)
            .await;
        // The source runs on whatever the copy did.
        let restored = self.restore(id).await;
        if let Err(e) = copied.and(restored) {
            self.drop_forks(&made, "the copy of its source failed")
                .await;
            return Err(e);
        }
        let mut forks = Vec::new();
        let mut failed = Vec::new();
        for fork in &made {
            match self.start_fork(fork).await {
                Ok(()) => forks.push(fork.id),
                Err(e) => {
                    tracing::warn!(sandbox = %fork.id, source = %id, error = %e, "a fork with memory did not start; destroying it");
                    let _ = store::mark_failed(
                        &self.pg,
                        fork.id,
                        self.instance,
                        store::FIRST_EPOCH,
                        &format!("its start from the checkpoint failed: {e}"),
                    )
                    .await;
                    let _ = self.destroy(fork.id, "its start failed").await;
                    failed.push(e.to_string());
                }
            }
        }
        tracing::info!(sandbox = %id, forks = forks.len(), memory_bytes, "sandbox forked with its memory");
        Ok(Forked {
            forks,
            failed,
            memory_bytes,
        })
    }

    /// The full id of `container` (its directory's name in the engine's data root).
    async fn container_id(&self, container: &str) -> Result<String> {
        self.docker
            .inspect_container(container, None::<InspectContainerOptions>)
            .await
            .map_err(engine(format!("inspecting container {container}")))?
            .id
            .ok_or_else(|| DispatchError::Engine {
                action: format!("inspecting container {container}"),
                source: bollard::errors::Error::DockerResponseServerError {
                    status_code: 500,
                    message: "the engine gave no container id".to_owned(),
                },
            })
    }

    /// A fork's row (`creating`), workspace volume (held), network and container, not started.
    async fn make_fork(self: &Arc<Self>, spec: &SandboxSpec) -> Result<Made> {
        let id = SandboxId::new();
        let container = format!("aegis-sbx-{id}");
        let volume = format!("aegis-ws-{id}");
        let mut tx = self
            .pg
            .begin()
            .await
            .map_err(crate::error::db("recording a fork"))?;
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
            &spec.owner,
            &container,
            &volume,
        )
        .await?;
        tx.commit()
            .await
            .map_err(crate::error::db("recording a fork"))?;
        let made = async {
            // No socket channel under gVisor; the proxy opens at the re-attach.
            let container_id = self
                .make_objects(id, spec, &spec.owner, &container, &volume, None, false)
                .await?;
            self.start_holder(id, spec).await?;
            Ok::<_, DispatchError>(container_id)
        };
        match made.await {
            Ok(container_id) => Ok(Made {
                id,
                container,
                container_id,
            }),
            Err(e) => {
                let _ = store::mark_failed(
                    &self.pg,
                    id,
                    self.instance,
                    store::FIRST_EPOCH,
                    &e.to_string(),
                )
                .await;
                let _ = self.destroy(id, "its fork failed").await;
                Err(e)
            }
        }
    }

    /// Destroys forks made but not started.
    async fn drop_forks(&self, made: &[Made], reason: &str) {
        for fork in made {
            let _ =
                store::mark_failed(&self.pg, fork.id, self.instance, store::FIRST_EPOCH, reason)
                    .await;
            if let Err(e) = self.destroy(fork.id, reason).await {
                tracing::warn!(sandbox = %fork.id, error = %e, "an unstarted fork could not be destroyed; the reaper removes it");
            }
        }
    }

    /// Copies the checkpointed source's workspace files into each fork's volume and its
    /// checkpoint into each fork's checkpoint directory, with one helper container.
    async fn copy_into_forks(
        &self,
        id: SandboxId,
        spec: &SandboxSpec,
        root: &str,
        source_container_id: &str,
        made: &[Made],
    ) -> Result<()> {
        let name = format!("aegis-fcopy-{id}");
        let mut mounts = vec![
            volume_mount(&format!("aegis-ws-{id}"), "/from/ws", true),
            bind_mount(
                &format!("{root}/containers/{source_container_id}/checkpoints/{CHECKPOINT}"),
                "/from/ckpt",
                true,
            ),
        ];
        for (i, fork) in made.iter().enumerate() {
            mounts.push(volume_mount(
                &format!("aegis-ws-{}", fork.id),
                &format!("/to/{i}/ws"),
                false,
            ));
            mounts.push(bind_mount(
                &format!("{root}/containers/{}", fork.container_id),
                &format!("/to/{i}/ctr"),
                false,
            ));
        }
        // `/.` copies the directory's own owner and mode too; the checkpoint directory is
        // root's, 0700, as the engine makes its own. Each copy gets a file naming its fork
        // (runsc reads only `checkpoint.img`): the engine hands a checkpoint to containerd as
        // a blob named by its digest, and a second blob of the same digest while the first is
        // still stored fails the start ("content sha256:... already exists").
        let mut script = "set -e".to_owned();
        for (i, fork) in made.iter().enumerate() {
            let (d, ckpt) = (
                format!("/to/{i}"),
                format!("/to/{i}/ctr/checkpoints/{CHECKPOINT}"),
            );
            script.push_str(&format!(
                "; cp -a /from/ws/. {d}/ws/; mkdir -p -m 0700 {ckpt}; cp -a /from/ckpt/. {ckpt}/; \
                 echo {} > {ckpt}/fork",
                fork.id
            ));
        }
        let mut helper_labels = self.labels(id, &spec.owner);
        helper_labels.insert(labels::COMPONENT.to_owned(), FORK_COPY_COMPONENT.to_owned());
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            entrypoint: Some(vec!["/bin/sh".to_owned(), "-c".to_owned(), script]),
            cmd: Some(Vec::new()),
            user: Some("0:0".to_owned()),
            network_disabled: Some(true),
            labels: Some(helper_labels),
            host_config: Some(HostConfig {
                mounts: Some(mounts),
                network_mode: Some("none".to_owned()),
                readonly_rootfs: Some(true),
                cap_drop: Some(vec!["ALL".to_owned()]),
                // `cp -a` as root: read the sandbox user's files, keep owners and modes.
                cap_add: Some(
                    ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID"]
                        .map(str::to_owned)
                        .to_vec(),
                ),
                security_opt: Some(vec!["no-new-privileges".to_owned()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let failed = |source| DispatchError::Create {
            id,
            image: spec.image.clone(),
            what: "fork copy helper",
            source,
        };
        self.docker
            .create_container(
                Some(CreateContainerOptionsBuilder::new().name(&name).build()),
                body,
            )
            .await
            .map_err(failed)?;
        let ran = async {
            self.docker
                .start_container(&name, None)
                .await
                .map_err(failed)?;
            let mut waited = self.docker.wait_container(
                &name,
                None::<bollard::query_parameters::WaitContainerOptions>,
            );
            let code = match tokio::time::timeout(self.config.call_timeout, waited.next()).await {
                Ok(Some(Ok(exit))) => exit.status_code,
                // bollard answers a non-zero exit as an error carrying the code.
                Ok(Some(Err(bollard::errors::Error::DockerContainerWaitError {
                    code, ..
                }))) => code,
                Ok(Some(Err(e))) => return Err(engine(format!("waiting for {name}"))(e)),
                Ok(None) | Err(_) => -1,
            };
            if code != 0 {
                let exit = super::describe_exit(&self.docker, &name).await;
                return Err(DispatchError::CheckpointUnavailable {
                    id,
                    detail: format!(
                        "copying its files and checkpoint for the forks failed (exit {code}){exit}"
                    ),
                });
            }
            Ok(())
        };
        let result = ran.await;
        if let Err(e) = self.remove_container(&name).await {
            tracing::warn!(sandbox = %id, error = %e, "could not remove the fork copy helper; the reaper will");
        }
        result
    }

    /// Starts a fork from its copy of the checkpoint, re-attaches and holds it, then removes
    /// that copy and its holder.
    async fn start_fork(self: &Arc<Self>, fork: &Made) -> Result<()> {
        let id = fork.id;
        self.start_from_checkpoint(&fork.container)
            .await
            .map_err(|source| DispatchError::Start { id, source })?;
        let row = store::get(&self.pg, id)
            .await?
            .ok_or(DispatchError::SandboxGone {
                id,
                reason: "its row is gone".to_owned(),
            })?;
        let sandbox = self.reattach(&row, store::FIRST_EPOCH).await?;
        self.hold(sandbox.clone());
        if !store::mark_running(&self.pg, id, self.instance, &fork.container_id).await? {
            self.release(id);
            sandbox.stream.close("destroyed while being forked");
            return Err(DispatchError::SandboxGone {
                id,
                reason: "destroyed while being forked".to_owned(),
            });
        }
        if let Err(e) = self
            .docker
            .delete_checkpoint(&fork.container, CHECKPOINT, None)
            .await
        {
            // It goes with the container at the latest.
            tracing::warn!(sandbox = %id, error = %e, "could not delete a fork's used checkpoint");
        }
        self.remove_holder(id).await;
        Ok(())
    }
}

/// The `org.aegis.component` value of a fork's copy helper.
pub(crate) const FORK_COPY_COMPONENT: &str = "fork-copy";

fn volume_mount(volume: &str, target: &str, read_only: bool) -> Mount {
    Mount {
        target: Some(target.to_owned()),
        source: Some(volume.to_owned()),
        typ: Some(MountType::VOLUME),
        read_only: Some(read_only),
        ..Default::default()
    }
}

fn bind_mount(path: &str, target: &str, read_only: bool) -> Mount {
    Mount {
        target: Some(target.to_owned()),
        source: Some(path.to_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(read_only),
        ..Default::default()
    }
}
