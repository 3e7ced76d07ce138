//! Workflow volumes at run time: the files the states of one run share (`spec.storage`).
//!
//! A volume belongs to one workflow execution, so a second run never sees the first's files.
//! It is the same machinery as an agent's persistent volumes (`volumes.rs`), at the scale of
//! one run: between states the volume is a tar archive in PostgreSQL (`workflow_volumes`), so
//! whichever replica runs the next state finds it, also after a crash; while a state runs it is
//! a directory of that state's sandbox workspace (Agent, System and ContainerRun states, each
//! step of a ParallelContainerRun), copied in after the sandbox is ready and, for read-write
//! mounts, copied out before the sandbox is destroyed (`dispatcher::archive`). So it has the
//! hardening of every sandbox volume: it is data only both ways (owner forced to the sandbox
//! user, no setuid/setgid bits, devices, FIFOs, or links that leave it; a volume whose path was
//! replaced by a link is not saved), it lives on the size-limited, `noexec` workspace, and its
//! `size_limit` is checked when it is saved: a state that leaves more fails, naming the volume,
//! and its changes are not kept.
//!
//! Exactly once: what a state's attempt saves is a draft of (state, visit, attempt)
//! (`workflow_volume_drafts`), and it becomes the volume's content only in the transaction that
//! commits the state, fenced by the lease ([`promote`], called from `workflow::store::commit`).
//! An interrupted attempt, or a stalled replica that lost its lease, leaves a draft nobody
//! promotes; the retry starts from the committed content. Within one attempt a later sandbox
//! (the next iteration of a judged Agent state, a step's retry) reads the attempt's draft, as
//! it would read a disk. A read-only mount is restored and never saved.
//!
//! Lifetime: an `ephemeral` volume is removed in the transaction that ends its execution; a
//! `persistent` one is kept `ttl_hours` after that (default `volumes.default_ttl_hours`) and
//! removed by [`sweep`]; both go with their execution when it is removed (`ON DELETE CASCADE`).

use dispatcher::{DispatchError, Dispatcher, SandboxId};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::volumes::import_saved;
use aegis_manifest::{declared_volumes, volume_mounts, volume_problems, WORKSPACE_VOLUME};

/// One volume of the run as one state mounts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The volume's name (`workspace` or a shared volume).
    pub name: String,
    /// `/workspace` or a directory beneath it.
    pub mount_path: String,
    /// Restored, never saved.
    pub read_only: bool,
    /// Largest archive that is saved, bytes.
    pub size_limit: u64,
    /// Hours the volume outlives its execution (0: ephemeral).
    pub keep_hours: u32,
}

/// The volumes one attempt of one state mounts: whose drafts it reads and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    /// Tenant of the execution.
    pub tenant: String,
    /// The workflow execution.
    pub execution: Uuid,
    /// The state.
    pub state: String,
    /// Its visit.
    pub visit: i32,
    /// The attempt at that visit (the execution's `attempt`).
    pub attempt: i32,
    /// What it mounts.
    pub mounts: Vec<Mount>,
}

impl Workspace {
    /// Whether the sandbox's whole workspace is a read-only mount (then nothing in it may be
    /// written: a command's write roots leave it out).
    pub fn whole_workspace_read_only(&self) -> bool {
        self.mounts
            .iter()
            .any(|m| m.read_only && m.mount_path == dispatcher::WORKSPACE)
    }
}

/// Why a volume could not be restored or saved.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The content left in the volume is larger than its `size_limit`.
    #[error(
        "workflow volume `{name}` holds more than its size_limit of {limit} bytes; \
         this state's changes to it were not kept"
    )]
    TooLarge {
        /// Volume name.
        name: String,
        /// The limit.
        limit: u64,
    },
    /// The volume's path is not a real directory any more (a link, a file, gone), or an
    /// archive is not a tar archive.
    #[error("workflow volume `{name}`: {reason}; this state's changes to it were not kept")]
    Refused {
        /// Volume name.
        name: String,
        /// What the dispatcher refused.
        reason: String,
    },
    /// Copying into or out of the sandbox failed.
    #[error("workflow volume `{name}`: {source}")]
    Sandbox {
        /// Volume name.
        name: String,
        /// What the dispatcher said.
        #[source]
        source: Box<DispatchError>,
    },
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Maps a dispatcher error about volume `name`: a refused archive is the volume's fault, the
/// rest the sandbox's.
fn sandbox_error(name: &str, e: DispatchError) -> WorkspaceError {
    match e {
        DispatchError::ArchiveRefused { reason, .. } => WorkspaceError::Refused {
            name: name.to_owned(),
            reason,
        },
        e => WorkspaceError::Sandbox {
            name: name.to_owned(),
            source: Box::new(e),
        },
    }
}

/// The mounts of `item` (a state, or a step of a ParallelContainerRun) with their volumes'
/// settings; an undeclared name or a path outside the workspace is an error (a version stored
/// before the deploy checks refused them).
pub fn mounts(
    manifest: &Value,
    item: &Value,
    default_ttl_hours: u64,
) -> Result<Vec<Mount>, String> {
    let declared = declared_volumes(manifest);
    volume_mounts(item)
        .into_iter()
        .map(|m| {
            if let Some(problem) = aegis_manifest::mount_path_problem(&m.mount_path) {
                return Err(problem);
            }
            let volume = declared
                .iter()
                .find(|d| d.name == m.name)
                .ok_or_else(|| format!("volume `{}` is not declared in spec.storage", m.name))?;
            let keep_hours = if volume.persistent {
                volume
                    .ttl_hours
                    .unwrap_or(default_ttl_hours)
                    .clamp(1, 24 * 365 * 10) as u32
            } else {
                0
            };
            Ok(Mount {
                name: m.name,
                mount_path: m.mount_path,
                read_only: m.read_only,
                size_limit: volume.size_limit_bytes,
                keep_hours,
            })
        })
        .collect()
}

/// What keeps a workflow's volumes from running on this node, each naming the field: the
/// manifest's own rules (for versions stored before they were checked at deploy), an
/// existing volume to attach (`volume_id`), and a size over `volumes.max_size_mb`.
pub fn problems(manifest: &Value, max_size_mb: u64) -> Vec<String> {
    let at = |pointer: &str| pointer.trim_start_matches('/').replace('/', ".");
    let mut out: Vec<String> = volume_problems(manifest)
        .into_iter()
        .map(|(pointer, problem)| format!("{}: {problem}", at(&pointer)))
        .collect();
    if manifest
        .pointer("/spec/storage/workspace/volume_id")
        .is_some()
    {
        out.push(
            "spec.storage.workspace.volume_id: attaching an existing volume is not supported: \
             a run's volumes belong to it (remove volume_id to give the run its own workspace)"
                .to_owned(),
        );
    }
    let ceiling = max_size_mb.saturating_mul(1 << 20);
    for volume in declared_volumes(manifest) {
        if volume.size_limit_bytes > ceiling {
            out.push(format!(
                "spec.storage: the size limit of volume `{}` ({} bytes) is over this node's \
                 ceiling of {max_size_mb} MiB (volumes.max_size_mb)",
                volume.name, volume.size_limit_bytes
            ));
        }
    }
    out
}

/// Refuses workflow volumes that would land on the agent's own `spec.volumes` (one directory
/// cannot be two volumes: each save would carry the other's files).
pub fn clash_with_agent_volumes(
    ws: &Workspace,
    agent: &str,
    own: &[crate::volumes::Volume],
) -> Result<(), String> {
    for m in &ws.mounts {
        if let Some(v) = own
            .iter()
            .find(|v| aegis_manifest::paths_overlap(&v.mount_path, &m.mount_path))
        {
            return Err(format!(
                "workflow state `{}` mounts volume `{}` at {}, which overlaps agent `{agent}`'s \
                 own volume `{}` at {}: mount the workflow volume at another path beneath \
                 /workspace",
                ws.state, m.name, m.mount_path, v.name, v.mount_path
            ));
        }
    }
    Ok(())
}

/// The id a run's workspace is published under on its blackboard
/// (`spec.storage.workspace.blackboard_key`): opaque, for templates and logs.
pub fn workspace_id(execution: Uuid) -> String {
    format!("{execution}/{WORKSPACE_VOLUME}")
}

/// Copies every mounted volume into `sandbox`: this attempt's draft if it saved one, else the
/// committed content, else an empty directory; returns the names restored with content. Only
/// after this succeeded may [`save`] copy the volumes back out of `sandbox`.
pub async fn restore(
    dispatcher: &Dispatcher,
    pool: &PgPool,
    sandbox: SandboxId,
    ws: &Workspace,
) -> Result<Vec<String>, WorkspaceError> {
    let mut restored = Vec::new();
    for m in &ws.mounts {
        let content: Option<Vec<u8>> = sqlx::query_scalar(
            "SELECT COALESCE( \
               (SELECT content FROM workflow_volume_drafts WHERE execution_id = $1 AND name = $2 \
                  AND state = $3 AND visit = $4 AND attempt = $5), \
               (SELECT content FROM workflow_volumes WHERE execution_id = $1 AND name = $2))",
        )
        .bind(ws.execution)
        .bind(&m.name)
        .bind(&ws.state)
        .bind(ws.visit)
        .bind(ws.attempt)
        .fetch_one(pool)
        .await?;
        let imported = import_saved(dispatcher, sandbox, &m.mount_path, content).await;
        if imported.map_err(|e| sandbox_error(&m.name, e))? {
            restored.push(m.name.clone());
        }
    }
    Ok(restored)
}

/// Copies each read-write mount out of `sandbox` into this attempt's draft; returns (name,
/// bytes) of each saved. A volume over its `size_limit`, or whose path is no longer a real
/// directory, is not saved (its content stays what it was) and the first such is the error;
/// the others are still saved. Call only for a sandbox [`restore`] filled.
pub async fn save(
    dispatcher: &Dispatcher,
    pool: &PgPool,
    sandbox: SandboxId,
    ws: &Workspace,
) -> Result<Vec<(String, u64)>, WorkspaceError> {
    let mut saved = Vec::new();
    let mut refused = None;
    for m in ws.mounts.iter().filter(|m| !m.read_only) {
        let archive = match dispatcher
            .export_dir(sandbox, &m.mount_path, m.size_limit)
            .await
        {
            Ok(a) => a,
            Err(DispatchError::ArchiveTooLarge { .. }) => {
                refused.get_or_insert(WorkspaceError::TooLarge {
                    name: m.name.clone(),
                    limit: m.size_limit,
                });
                continue;
            }
            Err(e @ DispatchError::ArchiveRefused { .. }) => {
                let e = sandbox_error(&m.name, e);
                tracing::warn!(execution = %ws.execution, state = %ws.state, sandbox = %sandbox.0,
                    volume = %m.name, error = %e, "workflow volume not saved");
                refused.get_or_insert(e);
                continue;
            }
            Err(e) => return Err(sandbox_error(&m.name, e)),
        };
        sqlx::query(
            "INSERT INTO workflow_volume_drafts (execution_id, name, state, visit, attempt, \
             tenant_id, size_limit_bytes, keep_hours, content, content_bytes) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT (execution_id, name, state, visit, attempt) DO UPDATE SET \
             content = EXCLUDED.content, content_bytes = EXCLUDED.content_bytes, written_at = now()",
        )
        .bind(ws.execution)
        .bind(&m.name)
        .bind(&ws.state)
        .bind(ws.visit)
        .bind(ws.attempt)
        .bind(&ws.tenant)
        .bind(m.size_limit as i64)
        .bind(m.keep_hours as i32)
        .bind(&archive)
        .bind(archive.len() as i64)
        .execute(pool)
        .await?;
        saved.push((m.name.clone(), archive.len() as u64));
    }
    match refused {
        Some(e) => Err(e),
        None => Ok(saved),
    }
}

/// In the transaction that commits a state: the drafts of its attempt become the volumes'
/// content, and every other draft of the execution (interrupted attempts, earlier states) goes.
pub async fn promote(
    conn: &mut PgConnection,
    execution: Uuid,
    state: &str,
    visit: i32,
    attempt: i32,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "WITH d AS (DELETE FROM workflow_volume_drafts WHERE execution_id = $1 \
           RETURNING name, state, visit, attempt, tenant_id, size_limit_bytes, keep_hours, \
           content, content_bytes) \
         INSERT INTO workflow_volumes (execution_id, name, tenant_id, size_limit_bytes, keep_hours, \
           content, content_bytes, written_by_state, written_by_visit) \
         SELECT $1, name, tenant_id, size_limit_bytes, keep_hours, content, content_bytes, state, visit \
         FROM d WHERE state = $2 AND visit = $3 AND attempt = $4 \
         ON CONFLICT (execution_id, name) DO UPDATE SET content = EXCLUDED.content, \
           content_bytes = EXCLUDED.content_bytes, size_limit_bytes = EXCLUDED.size_limit_bytes, \
           keep_hours = EXCLUDED.keep_hours, written_by_state = EXCLUDED.written_by_state, \
           written_by_visit = EXCLUDED.written_by_visit, updated_at = now()",
    )
    .bind(execution)
    .bind(state)
    .bind(visit)
    .bind(attempt)
    .execute(conn)
    .await?;
    Ok(())
}

/// In the transaction that ends an execution: drafts and ephemeral volumes go, persistent ones
/// start their `keep_hours`.
pub async fn ended(conn: &mut PgConnection, execution: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(
        "WITH drafts AS (DELETE FROM workflow_volume_drafts WHERE execution_id = $1), \
         ephemeral AS (DELETE FROM workflow_volumes WHERE execution_id = $1 AND keep_hours = 0) \
         UPDATE workflow_volumes SET expires_at = now() + make_interval(hours => keep_hours) \
         WHERE execution_id = $1 AND keep_hours > 0",
    )
    .bind(execution)
    .execute(conn)
    .await?;
    Ok(())
}

/// Removes expired volumes, and whatever an execution that ended left (drafts written after its
/// end by a stalled replica, volumes of an end that was recorded without them); returns how
/// many rows went.
pub async fn sweep(pool: &PgPool) -> Result<u64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let drafts = sqlx::query(
        "DELETE FROM workflow_volume_drafts d USING workflow_executions e \
         WHERE d.execution_id = e.id AND e.ended_at IS NOT NULL",
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let volumes = sqlx::query(
        "DELETE FROM workflow_volumes v USING workflow_executions e \
         WHERE v.execution_id = e.id AND e.ended_at IS NOT NULL \
           AND COALESCE(v.expires_at, e.ended_at + make_interval(hours => v.keep_hours)) <= now()",
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(drafts + volumes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mounts_take_their_volumes_settings() {
        let manifest = json!({"spec": {"storage": {
            "workspace": {"size_limit_mb": 4},
            "shared_volumes": [{"name": "keep", "storage_class": "persistent", "ttl_hours": 2}]}}});
        let state = json!({"volumes": [
            {"name": "workspace", "mount_path": "/workspace/"},
            {"name": "keep", "mount_path": "/workspace/keep", "read_only": true}]});
        let m = mounts(&manifest, &state, 168).unwrap();
        assert_eq!(
            m,
            [
                Mount {
                    name: "workspace".into(),
                    mount_path: "/workspace".into(),
                    read_only: false,
                    size_limit: 4 << 20,
                    keep_hours: 0
                },
                Mount {
                    name: "keep".into(),
                    mount_path: "/workspace/keep".into(),
                    read_only: true,
                    size_limit: 256 << 20,
                    keep_hours: 2
                },
            ]
        );
        let outside = json!({"volumes": [{"name": "workspace", "mount_path": "/etc"}]});
        assert!(mounts(&manifest, &outside, 168)
            .unwrap_err()
            .contains("outside"));
        let unknown = json!({"volumes": [{"name": "other", "mount_path": "/workspace"}]});
        assert!(mounts(&manifest, &unknown, 168)
            .unwrap_err()
            .contains("not declared"));
    }

    #[test]
    fn problems_name_the_field() {
        let manifest = json!({"spec": {"storage": {"workspace": {"size_limit_mb": 512, "volume_id": "v"}},
            "states": {"S": {"kind": "System", "volumes": [{"name": "x", "mount_path": "/workspace"}]}}}});
        let p = problems(&manifest, 256);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(
            p[0].starts_with("spec.states.S.volumes.0.name: volume `x`"),
            "{p:?}"
        );
        assert!(p[1].contains("volume_id"), "{p:?}");
        assert!(p[2].contains("volumes.max_size_mb"), "{p:?}");
    }
}
