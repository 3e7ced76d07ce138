//! An execution's volumes and its workflow workspace: restored into its sandbox before the
//! first iteration, saved from it at the end.

use dispatcher::SandboxId;
use serde_json::{json, Value};

use super::Job;
use crate::engine::store;

impl Job {
    /// Who owns this execution's volumes: its tenant, agent and root principal.
    pub(super) async fn volume_owner(&self) -> Result<String, String> {
        match store::principal_of(&self.services.pool, self.id).await {
            Ok(Some((principal, _))) => Ok(principal),
            Ok(None) => Err("the execution's row is gone".to_owned()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// What the volume functions use of the node.
    pub(super) fn volume_store(&self) -> aegis_sandboxes::volumes::VolumeStore<'_> {
        aegis_sandboxes::volumes::VolumeStore {
            pool: &self.services.pool,
            sandboxes: &self.services.sandboxes,
            config: &self.services.config.volumes,
            longest_execution: std::time::Duration::from_secs(
                self.services.config.executions.max_execution_secs,
            ),
        }
    }

    /// Makes the directories of `spec.volumes` and copies in the persistent ones' content.
    pub(super) async fn restore_volumes(&self, sandbox: SandboxId) -> Result<(), String> {
        let volumes = aegis_sandboxes::volumes::of_manifest(&self.def.manifest);
        if volumes.is_empty() {
            return Ok(());
        }
        let owner = self.volume_owner().await?;
        let holder = aegis_sandboxes::volumes::Holder {
            tenant: &self.tenant,
            agent_id: self.def.id,
            owner: &owner,
        };
        match aegis_sandboxes::volumes::restore(&self.volume_store(), sandbox, &holder, &volumes)
            .await
        {
            Ok(restored) => {
                let names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
                self.event(
                    "volumes_mounted",
                    json!({"volumes": names, "restored": restored}),
                )
                .await;
                Ok(())
            }
            Err(e) => {
                let reason = format!("could not mount spec.volumes: {e}");
                self.event("volumes_failed", json!({"reason": reason}))
                    .await;
                Err(reason)
            }
        }
    }

    /// Copies the persistent volumes out of the sandbox into their rows.
    pub(super) async fn save_volumes(&self, sandbox: SandboxId) -> Result<(), String> {
        let volumes = aegis_sandboxes::volumes::of_manifest(&self.def.manifest);
        if !volumes.iter().any(|v| v.persistent) {
            return Ok(());
        }
        let owner = self.volume_owner().await?;
        let holder = aegis_sandboxes::volumes::Holder {
            tenant: &self.tenant,
            agent_id: self.def.id,
            owner: &owner,
        };
        match aegis_sandboxes::volumes::save(
            &self.volume_store(),
            sandbox,
            &holder,
            &volumes,
            self.id,
        )
        .await
        {
            Ok(saved) => {
                let saved: Vec<Value> = saved
                    .iter()
                    .map(|(name, bytes)| json!({"name": name, "bytes": bytes}))
                    .collect();
                self.event("volumes_saved", json!({"volumes": saved})).await;
                Ok(())
            }
            Err(e) => {
                let reason = e.to_string();
                self.event("volumes_failed", json!({"reason": reason}))
                    .await;
                Err(reason)
            }
        }
    }

    /// Copies the workflow volumes its state mounts into the sandbox.
    pub(super) async fn restore_workspace(&self, sandbox: SandboxId) -> Result<(), String> {
        let Some(ws) = &self.workspace else {
            return Ok(());
        };
        let dispatcher = self
            .services
            .sandboxes
            .dispatcher()
            .map_err(|e| format!("could not mount the workflow's volumes: {e}"))?;
        let names: Vec<&str> = ws.mounts.iter().map(|m| m.name.as_str()).collect();
        match aegis_sandboxes::workspaces::restore(dispatcher, &self.services.pool, sandbox, ws)
            .await
        {
            Ok(restored) => {
                self.workspace_restored
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                self.event(
                    "workflow_volumes_mounted",
                    json!({"volumes": names, "restored": restored, "state": ws.state}),
                )
                .await;
                Ok(())
            }
            Err(e) => {
                let reason = format!("could not mount the workflow's volumes: {e}");
                self.event("workflow_volumes_failed", json!({"reason": reason}))
                    .await;
                Err(reason)
            }
        }
    }

    /// Copies the read-write workflow volumes out of the sandbox (if they were copied in).
    pub(super) async fn save_workspace(&self, sandbox: SandboxId) -> Result<(), String> {
        let Some(ws) = &self.workspace else {
            return Ok(());
        };
        if !ws.mounts.iter().any(|m| !m.read_only)
            || !self
                .workspace_restored
                .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(());
        }
        let dispatcher = self
            .services
            .sandboxes
            .dispatcher()
            .map_err(|e| e.to_string())?;
        match aegis_sandboxes::workspaces::save(dispatcher, &self.services.pool, sandbox, ws).await
        {
            Ok(saved) => {
                let saved: Vec<Value> = saved
                    .iter()
                    .map(|(name, bytes)| json!({"name": name, "bytes": bytes}))
                    .collect();
                self.event("workflow_volumes_saved", json!({"volumes": saved}))
                    .await;
                Ok(())
            }
            Err(e) => {
                let reason = e.to_string();
                self.event("workflow_volumes_failed", json!({"reason": reason}))
                    .await;
                Err(reason)
            }
        }
    }
}
