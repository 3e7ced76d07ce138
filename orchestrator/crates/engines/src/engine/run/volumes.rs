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
        let holder = self.volume_holder(&owner);
        let restored =
            aegis_sandboxes::volumes::restore(&self.volume_store(), sandbox, &holder, &volumes)
                .await
                .map_err(|e| format!("could not mount spec.volumes: {e}"));
        let names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
        let mounted = |restored: Vec<String>| json!({"volumes": names, "restored": restored});
        self.report_copy(restored, "volumes_mounted", "volumes_failed", mounted)
            .await
    }

    /// Copies the persistent volumes out of the sandbox into their rows.
    pub(super) async fn save_volumes(&self, sandbox: SandboxId) -> Result<(), String> {
        let volumes = aegis_sandboxes::volumes::of_manifest(&self.def.manifest);
        if !volumes.iter().any(|v| v.persistent) {
            return Ok(());
        }
        let owner = self.volume_owner().await?;
        let holder = self.volume_holder(&owner);
        let store = self.volume_store();
        let saved = aegis_sandboxes::volumes::save(&store, sandbox, &holder, &volumes, self.id)
            .await
            .map_err(|e| e.to_string());
        self.report_copy(saved, "volumes_saved", "volumes_failed", saved_volumes)
            .await
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
        let restored =
            aegis_sandboxes::workspaces::restore(dispatcher, &self.services.pool, sandbox, ws)
                .await
                .map_err(|e| format!("could not mount the workflow's volumes: {e}"));
        if restored.is_ok() {
            self.workspace_restored
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let mounted = |restored: Vec<String>| json!({"volumes": names, "restored": restored, "state": ws.state});
        let (done, failed) = ("workflow_volumes_mounted", "workflow_volumes_failed");
        self.report_copy(restored, done, failed, mounted).await
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
        let saved = aegis_sandboxes::workspaces::save(dispatcher, &self.services.pool, sandbox, ws)
            .await
            .map_err(|e| e.to_string());
        let (done, failed) = ("workflow_volumes_saved", "workflow_volumes_failed");
        self.report_copy(saved, done, failed, saved_volumes).await
    }

    /// Whose volumes this execution's are: its tenant, its agent, and `owner`
    /// ([`Job::volume_owner`]).
    fn volume_holder<'a>(&'a self, owner: &'a str) -> aegis_sandboxes::volumes::Holder<'a> {
        aegis_sandboxes::volumes::Holder {
            tenant: &self.tenant,
            agent_id: self.def.id,
            owner,
        }
    }

    /// Records how a copy of volumes into or out of the sandbox went, as each of them does:
    /// the event `done` with what `payload` makes of its result, or `failed` with the reason,
    /// which is also the answer (the execution fails with it).
    async fn report_copy<T>(
        &self,
        copied: Result<T, String>,
        done: &str,
        failed: &str,
        payload: impl FnOnce(T) -> Value,
    ) -> Result<(), String> {
        match copied {
            Ok(result) => {
                self.event(done, payload(result)).await;
                Ok(())
            }
            Err(reason) => {
                self.event(failed, json!({"reason": reason})).await;
                Err(reason)
            }
        }
    }
}

/// The volumes a save copied out, as its event lists them: each name with its size in bytes.
fn saved_volumes(saved: Vec<(String, u64)>) -> Value {
    let saved: Vec<Value> = saved
        .iter()
        .map(|(name, bytes)| json!({"name": name, "bytes": bytes}))
        .collect();
    json!({"volumes": saved})
}
