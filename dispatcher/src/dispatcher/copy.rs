//! Copies of a checkpoint into new containers: a gVisor sandbox's checkpoint (and, for a fork,
//! its workspace files) copied on the engine into the checkpoint directory of containers made
//! for it, which then start from it. Used by the fork (`fork.rs`: one copy per fork) and by
//! every restore (`checkpoint.rs`: the sandbox's new container), because this engine starts a
//! container only from a checkpoint in its own directory (`--checkpoint-dir` is refused by
//! Docker 20.10) and cannot restore a container checkpointed a second time.
//!
//! The copy is made by a short-lived helper container (`aegis-fcopy-<source>`: the source's
//! image under runc, no network, read-only root, only the capabilities `cp -a` needs as root),
//! so it works wherever the engine is (the node never reads the engine's data root itself).

use bollard::models::{ContainerCreateBody, HostConfig, MountType};
use bollard::query_parameters::InspectContainerOptions;
use futures_util::StreamExt;

use super::create::create_failed;
use super::Inner;
use crate::error::{engine, DispatchError, Result};
use crate::hardening::mount;
use crate::labels;
use crate::spec::{SandboxId, SandboxSpec};

/// The name of the one checkpoint a sandbox has while it is paused (and of each copy of it).
pub(super) const CHECKPOINT: &str = "aegis-pause";

impl Inner {
    /// The engine's data root (where its containers' checkpoint directories are).
    pub(super) async fn data_root(&self, id: SandboxId) -> Result<String> {
        self.docker
            .info()
            .await
            .map_err(engine("reading the engine's data root (docker info)"))?
            .docker_root_dir
            .ok_or_else(|| DispatchError::CheckpointUnavailable {
                id,
                detail: "the engine does not say where its data root is".to_owned(),
            })
    }

    /// The full id of `container` (its directory's name in the engine's data root).
    pub(super) async fn container_id(&self, container: &str) -> Result<String> {
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

    /// Copies checkpointed sandbox `id`'s checkpoint into each target container's checkpoint
    /// directory (and its workspace files into the target's volume, when it has one of its
    /// own), with one helper container: for the forks, and for the new container a pause's
    /// resume starts (`checkpoint.rs`).
    pub(super) async fn copy_checkpoint(
        &self,
        id: SandboxId,
        spec: &SandboxSpec,
        root: &str,
        source_container_id: &str,
        targets: &[CopyTo],
    ) -> Result<()> {
        let name = format!("aegis-fcopy-{id}");
        let mut mounts = vec![mount(
            MountType::BIND,
            &format!("{root}/containers/{source_container_id}/checkpoints/{CHECKPOINT}"),
            "/from/ckpt",
            true,
        )];
        if targets.iter().any(|t| t.workspace.is_some()) {
            mounts.push(mount(
                MountType::VOLUME,
                &format!("aegis-ws-{id}"),
                "/from/ws",
                true,
            ));
        }
        for (i, target) in targets.iter().enumerate() {
            if let Some(volume) = &target.workspace {
                mounts.push(mount(
                    MountType::VOLUME,
                    volume,
                    &format!("/to/{i}/ws"),
                    false,
                ));
            }
            mounts.push(mount(
                MountType::BIND,
                &format!("{root}/containers/{}", target.container_id),
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
        for (i, target) in targets.iter().enumerate() {
            let (d, ckpt) = (
                format!("/to/{i}"),
                format!("/to/{i}/ctr/checkpoints/{CHECKPOINT}"),
            );
            if target.workspace.is_some() {
                script.push_str(&format!("; cp -a /from/ws/. {d}/ws/"));
            }
            script.push_str(&format!(
                "; mkdir -p -m 0700 {ckpt}; cp -a /from/ckpt/. {ckpt}/; echo {} > {ckpt}/fork",
                target.mark
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
        let failed = create_failed(id, spec, "fork copy helper");
        self.create_named(&name, body).await.map_err(&failed)?;
        let ran = async {
            self.docker
                .start_container(&name, None)
                .await
                .map_err(&failed)?;
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
                        "copying its checkpoint (and files) into new containers failed (exit {code}){exit}"
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
}

/// Where [`Inner::copy_checkpoint`] puts one copy.
pub(super) struct CopyTo {
    /// The volume the source's workspace files are copied into (a fork's); `None` when the
    /// target keeps the source's own volume (a resume's new container).
    pub(super) workspace: Option<String>,
    /// The target container's full id (its directory in the engine's data root).
    pub(super) container_id: String,
    /// Written beside the copy so that each copy's digest differs (see the script).
    pub(super) mark: String,
}

/// The `org.aegis.component` value of a checkpoint copy helper (a fork's, a resume's).
pub(crate) const FORK_COPY_COMPONENT: &str = "fork-copy";
