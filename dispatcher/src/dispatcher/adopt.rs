//! Adopting the sandboxes a previous start of this same instance left (`Dispatcher::adopt`),
//! and re-attaching a stream to a sandbox's executor (also a takeover's step, `takeover.rs`).

use std::sync::Arc;

use bollard::models::ContainerStateStatusEnum;
use bollard::query_parameters::InspectContainerOptions;
use sandbox_executor::protocol::Op;
use uuid::Uuid;

use super::{rand_u32, AdoptReport, Inner, Sandbox};
use crate::error::{engine, DispatchError, Result};
use crate::spec::{NetworkMode, SandboxSpec};
use crate::store::SandboxInfo;
use crate::stream::ExecutorStream;
use crate::{network, placement, store};

impl Inner {
    /// Claims each running sandbox of `previous` (on this engine) and re-attaches to its
    /// executor; one that cannot be re-attached, and an unused pool sandbox, is destroyed.
    pub(super) async fn adopt(self: &Arc<Self>, previous: Uuid) -> Result<AdoptReport> {
        let mut report = AdoptReport::default();
        if previous == self.instance {
            return Ok(report);
        }
        // Its containers are on its engine: only a replica driving that engine can attach.
        if !placement::drives_engine(&self.pg, previous, &self.engine).await? {
            tracing::info!(previous = %previous, "not adopting: that instance drove another Docker engine");
            return Ok(report);
        }
        let rows = store::running_of_instance(&self.pg, previous).await?;
        tracing::info!(previous = %previous, sandboxes = rows.len(), "adopting sandboxes of a previous instance");
        for row in rows {
            let id = row.id;
            let _claiming = self.claiming.mark(id);
            let Some(epoch) = store::claim_adoption(&self.pg, id, previous, self.instance).await?
            else {
                continue;
            };
            match self.reattach(&row, epoch).await {
                Ok(sandbox) => {
                    if row.owner.kind == crate::spec::OwnerKind::Pool {
                        // Unused, but not ours to re-pool blindly: fresh ones are cheap.
                        self.hold(sandbox);
                        let _ = self
                            .destroy(id, "pool sandbox of a previous instance")
                            .await;
                        report
                            .destroyed
                            .push((id, "pool sandbox of a previous instance".to_owned()));
                        continue;
                    }
                    self.hold(sandbox);
                    tracing::info!(sandbox = %id, owner = %row.owner, "sandbox adopted");
                    report.adopted.push(id);
                }
                Err(e) => {
                    let reason = format!("could not be adopted: {e}");
                    tracing::warn!(sandbox = %id, %reason, "destroying a sandbox that could not be adopted");
                    let _ = store::mark_failed(&self.pg, id, (self.instance, epoch), &reason).await;
                    self.destroy(id, "could not be adopted").await?;
                    report.destroyed.push((id, reason));
                }
            }
        }
        Ok(report)
    }

    /// Attaches to a running container again and checks that its executor answers; this
    /// instance holds it at `epoch` (claimed by the caller).
    pub(crate) async fn reattach(
        self: &Arc<Self>,
        row: &SandboxInfo,
        epoch: i64,
    ) -> Result<Arc<Sandbox>> {
        let id = row.id;
        let inspect = self
            .docker
            .inspect_container(&row.container_name, None::<InspectContainerOptions>)
            .await
            .map_err(engine(format!(
                "inspecting container {}",
                row.container_name
            )))?;
        let status = inspect.state.as_ref().and_then(|s| s.status);
        if status != Some(ContainerStateStatusEnum::RUNNING) {
            return Err(DispatchError::SandboxGone {
                id,
                reason: format!("its container is {status:?}, not running"),
            });
        }
        // Ids far above anything the previous instance used, so its late answers are ignored.
        let first_id = (1u64 << 40) + u64::from(rand_u32()) * (1 << 20);
        let socket = match &self.config.channel_dir {
            Some(base) => ExecutorStream::connect(
                &crate::channel::socket_of(base, id),
                id,
                first_id,
                self.config.max_response_bytes,
                self.on_break(id, &row.container_name, epoch),
            )
            .await
            .inspect_err(|e| tracing::debug!(sandbox = %id, error = %e, "no socket to adopt over; attaching"))
            .ok(),
            None => None,
        };
        let stream = match socket {
            Some(stream) => stream,
            None => {
                ExecutorStream::attach(
                    &self.docker,
                    &row.container_name,
                    id,
                    first_id,
                    self.config.max_response_bytes,
                    self.on_break(id, &row.container_name, epoch),
                )
                .await?
                .0
            }
        };
        let pong = stream.call(Op::Ping, self.config.ready_timeout).await?;
        if let Err(body) = pong.into_result() {
            return Err(DispatchError::Protocol {
                id,
                detail: format!("ping refused: {}: {}", body.kind, body.message),
            });
        }
        // The live processes the previous instance started are followed from here on.
        let make = crate::feed::adopted_feeds(self.config.live_buffer_bytes);
        match stream
            .follow_live_processes(self.config.call_timeout, make)
            .await
        {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(sandbox = %id, processes = n, "following the live processes of the adopted sandbox")
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "cannot list the adopted sandbox's live processes; they run on unfollowed")
            }
        }
        let spec = spec_of(row);
        if spec.network == NetworkMode::Egress {
            // The previous instance's proxy ended with it: this instance starts its own.
            let fail = |detail: String| DispatchError::Network { id, detail };
            let host =
                self.config.egress_host.clone().ok_or_else(|| {
                    fail("this node runs no egress proxy to take over".to_owned())
                })?;
            let net = network::inspect_on(&self.docker, &network::network_name(id))
                .await
                .map_err(|e| fail(e.to_string()))?
                .ok_or_else(|| fail("its network is gone".to_owned()))?;
            if let Err(e) = self.guard_egress(id, &spec, &host, net).await {
                stream.close("its egress proxy could not be taken over");
                return Err(e);
            }
        }
        Ok(Arc::new(Sandbox {
            id,
            container: row.container_name.clone(),
            spec,
            stream,
            epoch,
        }))
    }
}

/// The spec sandbox `row` was made with (as recorded; its image and owner alone for a row
/// older than the recorded spec): what its container is created again from.
pub(super) fn spec_of(row: &store::SandboxInfo) -> SandboxSpec {
    let recorded = row.spec.clone().unwrap_or_else(|| {
        store::RecordedSpec::from(&SandboxSpec::new(row.image.clone(), row.owner.clone()))
    });
    SandboxSpec {
        image: row.image.clone(),
        owner: row.owner.clone(),
        limits: recorded.limits,
        network: recorded.network,
        read_roots: recorded.read_roots,
        write_roots: recorded.write_roots,
        follow_symlinks: recorded.follow_symlinks,
        workspace: recorded.workspace,
        labels: recorded.labels,
        isolation: Some(recorded.isolation),
        allow_root: recorded.allow_root,
    }
}
