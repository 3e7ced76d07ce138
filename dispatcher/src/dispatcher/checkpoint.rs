//! Pause that keeps memory: a gVisor sandbox's container checkpointed by its engine (every
//! process, open file and byte of memory, `docker checkpoint create`) and restored later on the
//! same engine (`docker start --checkpoint`), its executor reached again as an adoption does.
//!
//! What was measured on these machines (Docker 20.10, runsc 2022-12 on the ptrace platform,
//! `"experimental": true` in the engine's daemon.json) and why the steps are what they are:
//!
//! - gVisor checkpoints the sandbox's kernel, so the hardened container (read-only root,
//!   capabilities dropped, tmpfs `/tmp`, the executor volume) comes back as it was; `/tmp`, a
//!   tmpfs inside gVisor, is part of the checkpoint. runc containers cannot be checkpointed here
//!   (no CRIU), so only the gVisor class offers it.
//! - The workspace is a tmpfs *volume* on the host, which the local driver unmounts when the
//!   last container using it stops: a checkpoint alone would lose its files, and the restored
//!   sandbox then finds its workspace broken (`EINVAL`). So a *holder* container
//!   (`aegis-hold-<id>`, runc, no network, the executor idle as its only process) mounts the
//!   volume before the checkpoint and keeps it, and its files, until the restore. The paused
//!   sandbox therefore keeps its workspace's pages (at most `limits.workspace_bytes`) in host
//!   memory; its processes' memory is on the engine's disk.
//! - The executor's stdin/stdout are new pipes after a restore (gVisor re-binds them): the
//!   stream is attached again and pinged, as an adoption does (`adopt.rs`). The socket channel
//!   is not reachable in gVisor sandboxes anyway (its socket lives in gVisor's own filesystem).
//! - A container that was started from a checkpoint can be checkpointed again, but the engine
//!   cannot start it from that second checkpoint: containerd keeps its task (runsc calls it
//!   "paused"; "id already in use"). A *new* container of the same spec started from a copy of
//!   the checkpoint works every time (measured: four cycles by hand). So each restore creates
//!   the sandbox's container anew (`aegis-sbx-<id>-r<epoch>`, [`restored_name`]) on the same
//!   held volume, has the fork's copy helper (`copy.rs`) copy the checkpoint into its
//!   directory, moves the row to it and removes the old container; the sandbox's identity
//!   (id, E2B id, token, policy, owner, network, volume) stays. containerd keeps the task and
//!   shim of each container checkpointed after a restore until the engine restarts (not
//!   removable through Docker's API).
//! - The checkpoint lives in the engine's data root (`containers/<id>/checkpoints/`, root's,
//!   mode 0700): only the engine reads it, only a replica driving that engine restores it, and
//!   it goes with the container when the sandbox is destroyed.
//! - bollard 0.21 offers checkpoint create and delete but no `checkpoint` parameter on
//!   container start; the restore passes it in the start request's path (see
//!   [`start_path`]), over the same connection bollard uses for every call.

use std::sync::Arc;

use bollard::container::CreateCheckpointOptions;
use bollard::query_parameters::{StatsOptionsBuilder, WaitContainerOptionsBuilder};
use futures_util::StreamExt;

use super::copy::{CopyTo, CHECKPOINT};
use super::create::create_failed;
use super::{Dispatcher, Inner};
use crate::error::{engine, DispatchError, Result};
use crate::isolation::Isolation;
use crate::spec::{NetworkMode, SandboxId, SandboxSpec};
use crate::store::{self, SandboxState};
use crate::{hardening, labels};

/// The name of the container sandbox `id` is restored into by the restore of epoch `epoch`
/// (each restore starts a new container; the first container is `aegis-sbx-<id>`).
pub(crate) fn restored_name(id: SandboxId, epoch: i64) -> String {
    format!("aegis-sbx-{id}-r{epoch}")
}

/// The `org.aegis.component` value of a holder container.
pub(crate) const HOLDER_COMPONENT: &str = "holder";

/// The container that keeps a checkpointed sandbox's workspace volume mounted.
pub(crate) fn holder_name(id: SandboxId) -> String {
    format!("aegis-hold-{id}")
}

/// The path of a start request that restores `container` from its checkpoint. bollard joins
/// the path it is given to the engine's address and adds no query of its own when no options
/// are passed, so the query written here reaches the engine as is (`&from=` takes the `/start`
/// bollard appends as a harmless value).
fn start_path(container: &str) -> String {
    format!("{container}/start?checkpoint={CHECKPOINT}&from=")
}

/// What a checkpoint saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpointed {
    /// The memory the sandbox held when it was saved (its container's usage, gVisor's own
    /// included): what its checkpoint is bounded by, and about what it takes on disk.
    pub memory_bytes: u64,
}

impl Dispatcher {
    /// Saves sandbox `id` (held here, gVisor class) with its processes and memory and stops it;
    /// refused, with nothing changed, when its class or the engine cannot do it or it holds
    /// more than `max_bytes` of memory. Until [`Dispatcher::restore`] no call reaches it
    /// ([`DispatchError::Checkpointed`]); a destroy removes it with its checkpoint.
    pub async fn checkpoint(&self, id: SandboxId, max_bytes: u64) -> Result<Checkpointed> {
        let inner = self.inner.clone();
        super::run_detached(async move { inner.checkpoint(id, max_bytes).await }).await
    }

    /// The class a sandbox of `image` runs in on this node when it asks for none: whether its
    /// pause can keep memory (only gVisor's can).
    pub fn isolation_of(&self, image: &str) -> Isolation {
        self.inner.config.isolation.of_image(image)
    }

    /// Restores a checkpointed sandbox on this instance's engine and serves it from here (this
    /// instance holds it afterwards, whichever replica paused it). A sandbox checkpointed on
    /// another engine is [`DispatchError::CheckpointElsewhere`]; one that cannot be restored
    /// is destroyed and the error says why.
    pub async fn restore(&self, id: SandboxId) -> Result<()> {
        let inner = self.inner.clone();
        super::run_detached(async move { inner.restore(id).await }).await
    }
}

impl Inner {
    pub(super) async fn checkpoint(
        self: &Arc<Self>,
        id: SandboxId,
        max_bytes: u64,
    ) -> Result<Checkpointed> {
        let (sandbox, memory_bytes) = self.checkpoint_source(id, 1, max_bytes).await?;
        // One freeze or checkpoint at a time per sandbox.
        let lock = self.freeze_lock(id);
        let _frozen_by_us = lock.lock().await;
        self.start_holder(id, &sandbox.spec).await?;
        if !store::mark_checkpointed(&self.pg, id, (self.instance, sandbox.epoch)).await? {
            self.remove_holder(id).await;
            return Err(DispatchError::SandboxGone {
                id,
                reason: "destroyed or taken over while being paused".to_owned(),
            });
        }
        // Unreachable from here: calls find the row checkpointed.
        self.release(id);
        sandbox.stream.close("sandbox checkpointed");
        // Its egress proxy stops while nothing runs in it; the restore (or, when the
        // checkpoint fails, serving it again) opens one, as an adoption does.
        if sandbox.spec.network == NetworkMode::Egress {
            if let Some(host) = &self.config.egress_host {
                host.close(id);
            }
        }
        let saved = self
            .docker
            .create_checkpoint(
                &sandbox.container,
                CreateCheckpointOptions {
                    checkpoint_id: CHECKPOINT.to_owned(),
                    checkpoint_dir: None,
                    exit: true,
                },
            )
            .await;
        if let Err(source) = saved {
            let error = DispatchError::Engine {
                action: format!("checkpointing sandbox {id}"),
                source,
            };
            self.undo_checkpoint(id, &sandbox, &error).await;
            return Err(error);
        }
        // The engine answers before it has recorded the container's exit (measured: `running`
        // just after), and a restore of a container it still calls running is refused: wait
        // for the exit here, so a resume right after the pause finds it stopped.
        let mut exited = self.docker.wait_container(
            &sandbox.container,
            Some(
                WaitContainerOptionsBuilder::new()
                    .condition("not-running")
                    .build(),
            ),
        );
        if tokio::time::timeout(self.config.ready_timeout, exited.next())
            .await
            .is_err()
        {
            tracing::warn!(sandbox = %id, "the engine did not record the checkpointed container's exit in time");
        }
        tracing::info!(sandbox = %id, memory_bytes, "sandbox checkpointed");
        Ok(Checkpointed { memory_bytes })
    }

    /// What a checkpoint and a fork both check before anything changes: sandbox `id` is held
    /// here, its class and this engine can checkpoint it, and its memory times `copies` (the
    /// checkpoints of it on disk at once) is at most `max_bytes`. Answers the sandbox and the
    /// memory it holds.
    pub(super) async fn checkpoint_source(
        &self,
        id: SandboxId,
        copies: u64,
        max_bytes: u64,
    ) -> Result<(Arc<super::Sandbox>, u64)> {
        let sandbox = self.attached(id).await?;
        self.can_checkpoint(id, &sandbox.spec).await?;
        let memory_bytes = self.memory_in_use(id, &sandbox.container).await?;
        let bytes = memory_bytes.saturating_mul(copies);
        if bytes > max_bytes {
            return Err(DispatchError::CheckpointTooLarge {
                id,
                bytes,
                max_bytes,
            });
        }
        Ok((sandbox, memory_bytes))
    }

    /// After a failed checkpoint: serve the sandbox again if its container still runs, else
    /// destroy it (nothing half-saved is kept).
    async fn undo_checkpoint(
        self: &Arc<Self>,
        id: SandboxId,
        sandbox: &super::Sandbox,
        error: &DispatchError,
    ) {
        let back = async {
            let row = self.row(id).await?;
            let again = self.reattach(&row, sandbox.epoch).await?;
            if !store::mark_running_again(&self.pg, id, (self.instance, sandbox.epoch)).await? {
                again.stream.close("destroyed while its checkpoint failed");
                return Err(DispatchError::SandboxGone {
                    id,
                    reason: "destroyed while its checkpoint failed".to_owned(),
                });
            }
            self.hold(again);
            Ok(())
        };
        match back.await {
            Ok(()) => {
                tracing::warn!(sandbox = %id, %error, "checkpoint failed; the sandbox runs on");
                self.remove_holder(id).await;
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, %error, again = %e, "checkpoint failed and the sandbox cannot be served again; destroying it");
                let _ = self
                    .destroy(id, &format!("its checkpoint failed: {error}"))
                    .await;
            }
        }
    }

    pub(super) async fn restore(self: &Arc<Self>, id: SandboxId) -> Result<()> {
        let row = self.row(id).await?;
        if row.state != SandboxState::Checkpointed {
            return Err(match row.state {
                SandboxState::Running => DispatchError::InvalidSpec {
                    reason: format!("sandbox {id} is running, not checkpointed"),
                },
                state => DispatchError::SandboxGone {
                    id,
                    reason: row.reason.unwrap_or_else(|| state.as_str().to_owned()),
                },
            });
        }
        if let Some(theirs) = row.engine.as_deref().filter(|e| *e != self.engine) {
            return Err(DispatchError::CheckpointElsewhere {
                id,
                engine: theirs.to_owned(),
            });
        }
        let _claiming = self.claiming.mark(id);
        let Some(epoch) = store::claim_restore(&self.pg, id, self.instance).await? else {
            return Err(DispatchError::SandboxGone {
                id,
                reason: "restored or destroyed meanwhile".to_owned(),
            });
        };
        match self.restore_claimed(&row, epoch).await {
            Ok(()) => {
                tracing::info!(sandbox = %id, "sandbox restored from its checkpoint");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "restoring a checkpointed sandbox failed; destroying it");
                let reason = format!("its restore failed: {e}");
                let _ = store::mark_failed(&self.pg, id, (self.instance, epoch), &reason).await;
                let _ = self.destroy(id, "its restore failed").await;
                Err(e)
            }
        }
    }

    /// Restores into a new container: this engine cannot restore a container that was started
    /// from a checkpoint and checkpointed again (module doc), so every resume starts a fresh
    /// container of the sandbox's spec from a copy of the checkpoint, moves the sandbox's row
    /// to it, and removes the old one (its checkpoint with it).
    async fn restore_claimed(self: &Arc<Self>, row: &store::SandboxInfo, epoch: i64) -> Result<()> {
        let id = row.id;
        let spec = super::adopt::spec_of(row);
        let root = self.data_root(id).await?;
        let old = row.container_name.clone();
        let old_id = self.container_id(&old).await?;
        let new = restored_name(id, epoch);
        let names = super::create::ObjectNames {
            id,
            container: new.clone(),
            volume: row.volume_name.clone(),
        };
        let new_id = self
            .create_container_of(&names, &spec, &row.owner, None)
            .await?;
        let target = CopyTo {
            workspace: None,
            container_id: new_id.clone(),
            mark: new.clone(),
        };
        let moved = async {
            self.copy_checkpoint(id, &spec, &root, &old_id, std::slice::from_ref(&target))
                .await?;
            if !store::move_container(&self.pg, id, (self.instance, epoch), &new, &new_id).await? {
                return Err(DispatchError::SandboxGone {
                    id,
                    reason: "destroyed while being restored".to_owned(),
                });
            }
            Ok(())
        };
        if let Err(e) = moved.await {
            // The row still names the old container (its destroy removes that one).
            if let Err(removing) = self.remove_container(&new).await {
                tracing::warn!(sandbox = %id, error = %removing, "could not remove an unused restore container; the reaper will");
            }
            return Err(e);
        }
        // The row names the new container: the old one, checkpoint and all, is not needed.
        if let Err(e) = self.remove_container(&old).await {
            tracing::warn!(sandbox = %id, container = %old, error = %e, "could not remove a restored sandbox's old container");
        }
        self.start_from_checkpoint(&new)
            .await
            .map_err(engine(format!(
                "restoring sandbox {id} from its checkpoint"
            )))?;
        let mut moved_row = row.clone();
        moved_row.container_name = new.clone();
        let sandbox = self.reattach(&moved_row, epoch).await?;
        if !store::mark_running_again(&self.pg, id, (self.instance, epoch)).await? {
            sandbox.stream.close("destroyed while being restored");
            return Err(DispatchError::SandboxGone {
                id,
                reason: "destroyed while being restored".to_owned(),
            });
        }
        self.hold(sandbox);
        if let Err(e) = self.docker.delete_checkpoint(&new, CHECKPOINT, None).await {
            // It goes with the container at the latest.
            tracing::warn!(sandbox = %id, error = %e, "could not delete a used checkpoint");
        }
        self.remove_holder(id).await;
        Ok(())
    }

    /// Starts `container` from its checkpoint (`aegis-pause` in its own checkpoint directory).
    pub(super) async fn start_from_checkpoint(
        &self,
        container: &str,
    ) -> std::result::Result<(), bollard::errors::Error> {
        self.docker
            .start_container(&start_path(container), None)
            .await
    }

    /// Refuses, with [`DispatchError::CheckpointUnavailable`] saying why, a sandbox whose class
    /// or engine cannot be checkpointed (only gVisor's, on an engine with experimental features).
    pub(super) async fn can_checkpoint(&self, id: SandboxId, spec: &SandboxSpec) -> Result<()> {
        let unavailable = |detail: String| DispatchError::CheckpointUnavailable { id, detail };
        if spec.isolation() != Isolation::Gvisor {
            return Err(unavailable(
                "only gVisor sandboxes can be checkpointed (runc containers cannot be saved on \
                 this engine); its class is container"
                    .to_owned(),
            ));
        }
        let info = self.docker.info().await.map_err(engine(
            "reading whether the engine can checkpoint (docker info)",
        ))?;
        if info.experimental_build != Some(true) {
            return Err(unavailable(
                "the Docker engine does not offer checkpoints: add \"experimental\": true to its \
                 daemon.json and restart it"
                    .to_owned(),
            ));
        }
        Ok(())
    }

    /// The memory sandbox `id`'s container uses now.
    pub(super) async fn memory_in_use(&self, id: SandboxId, container: &str) -> Result<u64> {
        let mut stats = Box::pin(
            self.docker.stats(
                container,
                Some(
                    StatsOptionsBuilder::new()
                        .stream(false)
                        .one_shot(true)
                        .build(),
                ),
            ),
        );
        let stats = stats
            .next()
            .await
            .ok_or_else(|| DispatchError::SandboxGone {
                id,
                reason: "its container gave no statistics".to_owned(),
            })?
            .map_err(engine(format!("reading the memory of sandbox {id}")))?;
        Ok(stats.memory_stats.and_then(|m| m.usage).unwrap_or_default())
    }

    /// Creates and starts the holder of `id`'s workspace volume: the sandbox's own hardening
    /// (`hardening.rs`), under runc, without network, the executor idle on its unread stdin.
    pub(super) async fn start_holder(&self, id: SandboxId, spec: &SandboxSpec) -> Result<()> {
        let name = holder_name(id);
        let mut holder_spec = spec.clone();
        holder_spec.isolation = Some(Isolation::Container);
        holder_spec.network = NetworkMode::None;
        // Never root's: nothing runs in the holder (and runc sandboxes may not have root).
        holder_spec.allow_root = false;
        let mut holder_labels = self.labels(id, &spec.owner);
        holder_labels.insert(labels::COMPONENT.to_owned(), HOLDER_COMPONENT.to_owned());
        let body = hardening::sandbox_container(
            id,
            &holder_spec,
            &self.executor,
            &format!("aegis-ws-{id}"),
            holder_labels,
            &self.config,
            None,
        );
        let failed = create_failed(id, spec, "workspace holder");
        self.create_named(&name, body).await.map_err(&failed)?;
        if let Err(source) = self.docker.start_container(&name, None).await {
            self.remove_holder(id).await;
            return Err(failed(source));
        }
        Ok(())
    }

    /// Removes `id`'s holder, if any (gone already is fine; a failure is logged and left to the
    /// sandbox's destroy or the reaper).
    pub(super) async fn remove_holder(&self, id: SandboxId) {
        if let Err(e) = self.remove_container(&holder_name(id)).await {
            tracing::warn!(sandbox = %id, error = %e, "could not remove the workspace holder; the sandbox's destroy or the reaper will");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restore_path_carries_the_checkpoint_as_a_query() {
        assert_eq!(
            start_path("aegis-sbx-1"),
            "aegis-sbx-1/start?checkpoint=aegis-pause&from="
        );
        assert_eq!(
            holder_name(SandboxId(uuid::Uuid::nil())),
            "aegis-hold-00000000-0000-0000-0000-000000000000"
        );
    }
}
