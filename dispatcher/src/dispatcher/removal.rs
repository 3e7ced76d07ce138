//! Removing a sandbox: claimed first (so no call reaches it any more), then its container,
//! volume, channel directory and egress network, then its row; removals a retire hands to the
//! background finish before shutdown.

use std::sync::Arc;
use std::time::Duration;

use bollard::query_parameters::{RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder};

use super::Inner;
use crate::error::{engine, is_conflict, is_not_found, DispatchError, Result};
use crate::spec::{NetworkMode, Owner, SandboxId, SandboxSpec};
use crate::store::DestroyClaim;
use crate::{labels, network, store};

/// What is left of a sandbox no call reaches any more: its Docker objects and its row.
pub(super) struct Removal {
    pub(super) id: SandboxId,
    pub(super) container: String,
    pub(super) volume: String,
    /// Whether it had an egress network (`None`: not known here, looked up).
    pub(super) egress: Option<bool>,
    pub(super) reason: String,
}

impl Inner {
    /// Closes, removes and records: the body of every destroy.
    pub(crate) async fn destroy(&self, id: SandboxId, reason: &str) -> Result<()> {
        match self.unreachable(id, reason).await? {
            Some(removal) => self.remove(removal).await,
            None => Ok(()),
        }
    }

    /// The first half of a destruction: the row says `destroying` and this instance lets go of
    /// the stream, so no call reaches the sandbox any more; what is left to remove comes back
    /// (`None`: nothing, it was already gone).
    pub(super) async fn unreachable(&self, id: SandboxId, reason: &str) -> Result<Option<Removal>> {
        // The row first: if the database cannot record the intent, nothing has changed and the
        // sandbox keeps serving (the caller may retry). Once it says `destroying`, the reaper
        // finishes the job should this instance die halfway.
        let claim = store::claim_destroy(&self.pg, id).await?;
        self.pool.forget(id);
        let held = self.release(id);
        if let Some(sandbox) = &held {
            sandbox.stream.close(&format!("sandbox {reason}"));
        }
        match claim {
            DestroyClaim::Missing => {
                if let Some(sandbox) = held {
                    // Should not happen (rows are never deleted); still remove what we know.
                    self.remove_objects(id, &sandbox.container, &format!("aegis-ws-{id}"))
                        .await;
                    return Ok(None);
                }
                Err(DispatchError::SandboxNotFound {
                    id,
                    attached_elsewhere: false,
                })
            }
            DestroyClaim::AlreadyDestroyed => Ok(None),
            DestroyClaim::Remove { container, volume } => Ok(Some(Removal {
                id,
                container,
                volume,
                egress: held.as_ref().map(|s| s.spec.network == NetworkMode::Egress),
                reason: reason.to_owned(),
            })),
        }
    }

    /// The second half: its Docker objects go, then the row says `destroyed`.
    pub(super) async fn remove(&self, r: Removal) -> Result<()> {
        self.remove_container(&r.container).await?;
        // A checkpointed sandbox's workspace holder (`checkpoint.rs`), before its volume.
        self.remove_container(&super::checkpoint::holder_name(r.id))
            .await?;
        self.remove_egress(r.id, r.egress).await?;
        self.remove_volume(&r.volume).await?;
        store::mark_destroyed(&self.pg, r.id, &r.reason).await?;
        tracing::info!(sandbox = %r.id, reason = %r.reason, "sandbox destroyed");
        Ok(())
    }

    /// The lock of one sandbox's freezes.
    pub(crate) fn freeze_lock(&self, id: SandboxId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.freezing.lock().unwrap_or_else(|p| p.into_inner());
        locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        locks.entry(id).or_default().clone()
    }

    /// Waits for the removals [`Dispatcher::retire`] left in the background.
    pub(crate) async fn finish_removals(&self) {
        let mut removals =
            std::mem::take(&mut *self.removals.lock().unwrap_or_else(|p| p.into_inner()));
        while removals.join_next().await.is_some() {}
    }

    /// Best-effort removal after a failed creation (errors logged; the reaper retries).
    pub(super) async fn remove_objects(&self, id: SandboxId, container: &str, volume: &str) {
        if let Err(e) = self.remove_container(container).await {
            tracing::warn!(sandbox = %id, error = %e, "could not remove container; the reaper will");
        }
        if let Err(e) = self.remove_egress(id, None).await {
            tracing::warn!(sandbox = %id, error = %e, "could not remove the egress network; the reaper will");
        }
        if let Err(e) = self.remove_volume(volume).await {
            tracing::warn!(sandbox = %id, error = %e, "could not remove volume; the reaper will");
        }
    }

    /// The sandbox's own internal network, its proxy (started by the egress host on the
    /// network's gateway) and the host firewall admitting only that proxy; fails closed.
    /// Without `with_proxy` only the network: a sandbox started from a checkpoint has its
    /// proxy opened by its re-attach (`adopt.rs`), as a restored one does.
    pub(super) async fn open_egress(
        &self,
        id: SandboxId,
        spec: &SandboxSpec,
        owner: &Owner,
        with_proxy: bool,
    ) -> Result<()> {
        let fail = |detail: String| DispatchError::Network { id, detail };
        let host = self.config.egress_host.clone().ok_or_else(|| {
            fail("this node runs no egress proxy, so no sandbox can be given network".to_owned())
        })?;
        let mut labels = self.labels(id, owner);
        labels.insert(labels::COMPONENT.to_owned(), "network".to_owned());
        let net = network::create_on(
            &self.docker,
            &network::network_name(id),
            &id.0.simple().to_string(),
            labels,
        )
        .await
        .map_err(|e| fail(e.to_string()))?;
        if !with_proxy {
            return Ok(());
        }
        self.guard_egress(id, spec, &host, net).await
    }

    /// Starts the proxy of an existing network and lets the host admit only it (rules left by
    /// an earlier proxy of the same network are removed first).
    pub(super) async fn guard_egress(
        &self,
        id: SandboxId,
        spec: &SandboxSpec,
        host: &Arc<dyn network::EgressHost>,
        net: network::EgressNetwork,
    ) -> Result<()> {
        let fail = |detail: String| DispatchError::Network { id, detail };
        let port = host.open(id, spec, net.gateway).await.map_err(|e| {
            fail(format!(
                "its egress proxy cannot listen on {}: {e}",
                net.gateway
            ))
        })?;
        tokio::task::spawn_blocking(move || {
            network::remove_rules(&net.name);
            network::isolate_host(&net, port)
        })
        .await
        .map_err(|e| fail(format!("the firewall task failed: {e}")))?
        .map_err(|e| fail(e.to_string()))
    }

    /// Stops the sandbox's proxy and removes its network and firewall rules (nothing when it
    /// had none). `egress`: whether the sandbox is known to have had a network.
    pub(crate) async fn remove_egress(&self, id: SandboxId, egress: Option<bool>) -> Result<()> {
        if egress == Some(false) {
            return Ok(());
        }
        if let Some(host) = &self.config.egress_host {
            host.close(id);
        }
        network::remove_on(
            &self.docker,
            &network::network_name(id),
            egress.unwrap_or(false),
        )
        .await
        .map(|_| ())
        .map_err(|e| DispatchError::Network {
            id,
            detail: e.to_string(),
        })
    }

    /// Removes the channel directory of a removed sandbox container (nothing without one).
    pub(super) fn remove_channel_dir(&self, container: &str) {
        if let Some(base) = &self.config.channel_dir {
            crate::channel::remove(base, container);
        }
    }

    /// Removes a container by force (kills it first); gone already is fine.
    pub(crate) async fn remove_container(&self, container: &str) -> Result<()> {
        // `v`: anonymous volumes from the image's VOLUME instructions go with the container
        // (the named workspace volume is removed separately).
        let options = RemoveContainerOptionsBuilder::new()
            .force(true)
            .v(true)
            .build();
        for attempt in 0..5u32 {
            match self
                .docker
                .remove_container(container, Some(options.clone()))
                .await
            {
                Ok(()) => {
                    self.remove_channel_dir(container);
                    return Ok(());
                }
                Err(e) if is_not_found(&e) => {
                    self.remove_channel_dir(container);
                    return Ok(());
                }
                // "removal already in progress": wait for the other remover.
                Err(e) if is_conflict(&e) && attempt < 4 => {
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                Err(e) => return Err(engine(format!("removing container {container}"))(e)),
            }
        }
        Ok(())
    }

    /// Removes a volume; gone already is fine; in use is retried briefly (container removal
    /// releases it asynchronously).
    pub(crate) async fn remove_volume(&self, volume: &str) -> Result<()> {
        for attempt in 0..6u32 {
            match self
                .docker
                .remove_volume(
                    volume,
                    Some(RemoveVolumeOptionsBuilder::new().force(false).build()),
                )
                .await
            {
                Ok(()) => return Ok(()),
                Err(e) if is_not_found(&e) => return Ok(()),
                Err(e) if is_conflict(&e) && attempt < 5 => {
                    tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                }
                Err(e) => return Err(engine(format!("removing volume {volume}"))(e)),
            }
        }
        Ok(())
    }
}
