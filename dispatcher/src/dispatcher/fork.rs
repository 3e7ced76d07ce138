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
//!   fork's directory) is made on the engine (`copy.rs`) by a short-lived helper container
//!   (`aegis-fcopy-<source>`: the source's image under runc, no network, read-only root, only
//!   the capabilities `cp -a` needs as root), so it works wherever the engine is (the node never
//!   reads the engine's data root itself). It runs while the source is stopped, so files and
//!   memory are of the same moment.
//! - Each fork starts from its copy (`start_from_checkpoint`), is re-attached and pinged as a restore is
//!   (`adopt.rs`'s `reattach`: its live processes followed, its egress proxy opened on its own
//!   network), then its copy of the checkpoint and its holder are removed: no checkpoint data
//!   is left on disk once the forks run (the source's own goes with its restore).
//! - The source's restore starts it in a new container (`checkpoint.rs`), as each fork is
//!   started: any of them can be checkpointed, forked and paused with memory again.

use std::sync::Arc;

use super::copy::{CopyTo, CHECKPOINT};
use super::{Dispatcher, Inner};
use crate::error::{DispatchError, Result};
use crate::spec::{SandboxId, SandboxSpec};
use crate::store;

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
        // The source's checkpoint and each fork's copy of it are on disk at once.
        let copies = u64::try_from(count).unwrap_or(u64::MAX).saturating_add(1);
        let (sandbox, memory_bytes) = self.checkpoint_source(id, copies, max_bytes).await?;
        let root = self.data_root(id).await?;
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
        let targets: Vec<CopyTo> = made
            .iter()
            .map(|fork| CopyTo {
                workspace: Some(format!("aegis-ws-{}", fork.id)),
                container_id: fork.container_id.clone(),
                mark: fork.id.to_string(),
            })
            .collect();
        let copied = self
            .copy_checkpoint(id, &sandbox.spec, &root, &source_container_id, &targets)
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
                    let _ = self
                        .mark_new_failed(
                            fork.id,
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

    /// A fork's row (`creating`), workspace volume (held), network and container, not started.
    async fn make_fork(self: &Arc<Self>, spec: &SandboxSpec) -> Result<Made> {
        let names = self
            .record_creating(spec, &spec.owner, "recording a fork")
            .await?;
        let id = names.id;
        let made = async {
            // No socket channel under gVisor; the proxy opens at the re-attach.
            let container_id = self
                .make_objects(&names, spec, &spec.owner, None, false)
                .await?;
            self.start_holder(id, spec).await?;
            Ok::<_, DispatchError>(container_id)
        };
        match made.await {
            Ok(container_id) => Ok(Made {
                id,
                container: names.container,
                container_id,
            }),
            Err(e) => {
                let _ = self.mark_new_failed(id, &e.to_string()).await;
                let _ = self.destroy(id, "its fork failed").await;
                Err(e)
            }
        }
    }

    /// Destroys forks made but not started.
    async fn drop_forks(&self, made: &[Made], reason: &str) {
        for fork in made {
            let _ = self.mark_new_failed(fork.id, reason).await;
            if let Err(e) = self.destroy(fork.id, reason).await {
                tracing::warn!(sandbox = %fork.id, error = %e, "an unstarted fork could not be destroyed; the reaper removes it");
            }
        }
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
