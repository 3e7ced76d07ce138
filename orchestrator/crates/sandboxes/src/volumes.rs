//! Agent volumes (`spec.volumes`): named directories under `/workspace` that outlive an
//! execution.
//!
//! A volume is a directory of the execution's workspace, the size-limited, `noexec` tmpfs that
//! every sandbox has, so while it runs it has the workspace's guarantees (a fill stops with
//! `ENOSPC`, nothing in it can be executed). Between executions a `persistent` volume is a row
//! of `agent_volumes` holding its tar archive: copied into the sandbox when an execution starts
//! and copied back when it ends (completed, failed, timed out or cancelled; not after a crash,
//! which keeps the previous content). An `ephemeral` volume is only the directory, gone with the
//! sandbox. A volume belongs to (tenant, agent, owner, name), the owner being the principal at
//! the root of the execution tree, so callers of one agent never share files. Its `size_limit`
//! is checked when it is saved: an archive over the limit is not saved and fails the execution,
//! saying so. Rows expire `ttl_hours` (or `volumes.default_ttl_hours`) after their last save
//! and are deleted by [`sweep_periodically`]. Concurrent executions of one volume: the last to
//! end wins.
//!
//! A volume is data only, both ways (`dispatcher::archive`): it is saved only when its path is
//! a real directory beneath `/workspace` with no symbolic link on the way (a volume replaced by
//! a link is not saved, keeps its previous content and fails the execution, saying so), and
//! what is restored belongs to the sandbox user, with no setuid/setgid bits, devices, FIFOs or
//! links that point out of the volume. A volume is saved only from a sandbox into which every
//! volume of the execution was restored: when a restore fails (or never happened: cancelled or
//! timed out before it), the saved content is left as it was rather than overwritten with
//! whatever partial directory the sandbox holds; the execution's events say so
//! (`volumes_failed`) and so does the log.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use dispatcher::SandboxId;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::Sandboxes;
use aegis_manifest::parse_quantity;

/// One entry of `spec.volumes`, older spellings resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// Name, unique in the manifest.
    pub name: String,
    /// `/workspace` or a directory beneath it.
    pub mount_path: String,
    /// Kept between executions (`storage_class: persistent`).
    pub persistent: bool,
    /// Largest archive that is saved, bytes.
    pub size_limit: u64,
    /// Lifetime after the last save (`ttl_hours`), if given.
    pub ttl_hours: Option<u64>,
    /// `access_mode: read-only`.
    pub read_only: bool,
}

/// Why a volume could not be restored or saved.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The manifest asks for what this node does not do.
    #[error("{0}")]
    Unsupported(String),
    /// The volume's content is larger than its `size_limit`.
    #[error("volume `{name}` holds more than its size_limit of {limit} bytes; its content was not saved")]
    TooLarge {
        /// Volume name.
        name: String,
        /// The limit.
        limit: u64,
    },
    /// The volume's path is not a real directory (a symbolic link, a file, missing), or its
    /// saved archive is not a tar archive; the saved content was not changed.
    #[error("volume `{name}`: {reason}; its saved content was kept")]
    Refused {
        /// Volume name.
        name: String,
        /// What the dispatcher refused.
        reason: String,
    },
    /// The execution's volumes were not all restored into this sandbox, so what it holds is not
    /// the volumes' content and is not saved.
    #[error(
        "spec.volumes were not restored into this sandbox, so they were not saved; \
         their saved content was kept"
    )]
    NotRestored,
    /// Sandboxes are unavailable on this node.
    #[error("volumes need a sandbox: {0}")]
    NoSandboxes(String),
    /// Copying into or out of the sandbox failed.
    #[error("volume `{name}`: {source}")]
    Sandbox {
        /// Volume name.
        name: String,
        /// What the sandbox layer said.
        #[source]
        source: Box<crate::SandboxError>,
    },
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// The volumes of a manifest (`spec.volumes`); `mount_point` and `size_limit_mb` are the older
/// spellings of `mount_path` and `size_limit`.
pub fn of_manifest(manifest: &Value) -> Vec<Volume> {
    let Some(list) = manifest.pointer("/spec/volumes").and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .map(|v| {
            let size_limit = v
                .get("size_limit")
                .and_then(parse_quantity)
                .or_else(|| {
                    v.get("size_limit_mb")
                        .and_then(Value::as_u64)
                        .map(|mb| mb << 20)
                })
                .unwrap_or(0);
            Volume {
                name: v["name"].as_str().unwrap_or_default().to_owned(),
                mount_path: v
                    .get("mount_path")
                    .or_else(|| v.get("mount_point"))
                    .and_then(Value::as_str)
                    .unwrap_or("/workspace")
                    .trim_end_matches('/')
                    .to_owned(),
                persistent: v["storage_class"] == "persistent",
                size_limit,
                ttl_hours: v["ttl_hours"].as_u64(),
                read_only: v["access_mode"] == "read-only",
            }
        })
        .collect()
}

/// What this node refuses before an execution starts.
pub fn check(volumes: &[Volume], config: &VolumesConfig) -> Result<(), VolumeError> {
    let ceiling = config.max_size_mb << 20;
    for v in volumes {
        if v.read_only {
            return Err(VolumeError::Unsupported(format!(
                "spec.volumes `{}`: access_mode read-only is not supported: a volume belongs to \
                 one agent and its callers, so a read-only one could never be filled",
                v.name
            )));
        }
        if v.persistent && v.size_limit > ceiling {
            return Err(VolumeError::Unsupported(format!(
                "spec.volumes `{}`: size_limit {} bytes is over this node's ceiling of {} MiB \
                 (volumes.max_size_mb)",
                v.name, v.size_limit, config.max_size_mb
            )));
        }
    }
    Ok(())
}

/// Persistent agent volumes: what a manifest may ask for and how long they live.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct VolumesConfig {
    /// Largest `size_limit` of one volume, MiB (its archive is stored in PostgreSQL).
    pub max_size_mb: u64,
    /// Lifetime of a persistent volume without `ttl_hours`, counted from its last use.
    pub default_ttl_hours: u64,
    /// Seconds between sweeps that delete expired volumes.
    pub sweep_interval_secs: u64,
}

impl VolumesConfig {
    /// The `volumes:` section on its own: sizes and intervals of at least 1.
    pub fn check(&self) -> Result<(), aegis_core::settings::Invalid> {
        aegis_core::settings::at_least_one(&[
            ("max_size_mb", self.max_size_mb),
            ("default_ttl_hours", self.default_ttl_hours),
            ("sweep_interval_secs", self.sweep_interval_secs),
        ])
    }
}

impl Default for VolumesConfig {
    fn default() -> Self {
        Self {
            max_size_mb: 256,
            default_ttl_hours: 168,
            sweep_interval_secs: 60,
        }
    }
}

/// What restoring and saving volumes use: the rows, the sandboxes they are copied into and out
/// of, the volume settings, and the longest an execution may run (how long a restore is
/// remembered for its save).
#[derive(Clone, Copy)]
pub struct VolumeStore<'a> {
    /// Where `agent_volumes` rows live.
    pub pool: &'a sqlx::PgPool,
    /// The sandboxes, for their dispatcher.
    pub sandboxes: &'a Sandboxes,
    /// The node's `volumes:` settings.
    pub config: &'a VolumesConfig,
    /// `executions.max_execution_secs`.
    pub longest_execution: Duration,
}

impl VolumeStore<'_> {
    /// The dispatcher that restores and saves go through.
    fn dispatcher(&self) -> Result<&dispatcher::Dispatcher, VolumeError> {
        self.sandboxes
            .dispatcher()
            .map_err(|e| VolumeError::NoSandboxes(e.to_string()))
    }
}

/// Who owns an execution's volumes.
#[derive(Debug, Clone)]
pub struct Holder<'a> {
    pub tenant: &'a str,
    /// Agent (definition id).
    pub agent_id: Uuid,
    /// The principal at the root of the execution tree.
    pub owner: &'a str,
}

/// Sandboxes into which every volume of their execution was restored, with when: the only
/// sandboxes [`save`] copies volumes out of. Process-wide because a sandbox is restored and
/// saved by the one replica that runs its execution, and the engine's job holds no slot for it;
/// an entry is taken by [`save`], and one whose save never came (the job ended before it) is
/// dropped once older than the longest execution.
static RESTORED: LazyLock<Mutex<HashMap<SandboxId, Instant>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Notes that `sandbox` holds its execution's volumes, forgetting entries older than `stale`.
fn mark_restored(sandbox: SandboxId, stale: Duration) {
    let mut restored = RESTORED.lock().unwrap_or_else(|p| p.into_inner());
    restored.retain(|_, at| at.elapsed() < stale);
    restored.insert(sandbox, Instant::now());
}

/// Whether `sandbox`'s volumes were restored (forgetting it: a sandbox is saved once).
fn take_restored(sandbox: SandboxId) -> bool {
    RESTORED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&sandbox)
        .is_some()
}

/// Maps a dispatcher error about volume `name`: a refused archive is the volume's fault, the
/// rest the sandbox's.
fn sandbox_error(name: &str, e: dispatcher::DispatchError) -> VolumeError {
    match e {
        dispatcher::DispatchError::ArchiveRefused { reason, .. } => VolumeError::Refused {
            name: name.to_owned(),
            reason,
        },
        e => VolumeError::Sandbox {
            name: name.to_owned(),
            source: Box::new(e.into()),
        },
    }
}

/// Creates every volume's directory in `sandbox` and copies in the saved content of the
/// persistent ones, as the sandbox user's plain data; returns the names restored with content.
/// Only when every volume was restored may [`save`] later copy them out of `sandbox`.
pub async fn restore(
    store: &VolumeStore<'_>,
    sandbox: SandboxId,
    holder: &Holder<'_>,
    volumes: &[Volume],
) -> Result<Vec<String>, VolumeError> {
    let dispatcher = store.dispatcher()?;
    let mut restored = Vec::new();
    for v in volumes {
        let content: Option<Vec<u8>> = if v.persistent {
            sqlx::query_scalar(
                "SELECT content FROM agent_volumes WHERE tenant_id = $1 AND agent_id = $2 \
                 AND owner = $3 AND name = $4 AND expires_at > now()",
            )
            .bind(holder.tenant)
            .bind(holder.agent_id)
            .bind(holder.owner)
            .bind(&v.name)
            .fetch_optional(store.pool)
            .await?
        } else {
            None
        };
        let imported = import_saved(dispatcher, sandbox, &v.mount_path, content).await;
        if imported.map_err(|e| sandbox_error(&v.name, e))? {
            restored.push(v.name.clone());
        }
    }
    if volumes.iter().any(|v| v.persistent) {
        let longest = store.longest_execution;
        mark_restored(sandbox, longest + Duration::from_secs(3600));
    }
    Ok(restored)
}

/// Copies a saved archive into `sandbox` at `mount_path` (none, or an empty one: an empty
/// directory); true when there was content. Agent volumes and workflow workspaces are restored
/// so alike.
pub(crate) async fn import_saved(
    dispatcher: &dispatcher::Dispatcher,
    sandbox: SandboxId,
    mount_path: &str,
    content: Option<Vec<u8>>,
) -> Result<bool, dispatcher::DispatchError> {
    let had_content = content.as_ref().is_some_and(|c| !c.is_empty());
    dispatcher
        .import_dir(sandbox, mount_path, content.unwrap_or_default())
        .await?;
    Ok(had_content)
}

/// Copies each persistent volume out of `sandbox` into its row (created on first save) and
/// moves its expiry; a volume over its `size_limit` or whose path is not a real directory is
/// not saved (its row keeps its content) and the first such is the error. Nothing is saved, and
/// [`VolumeError::NotRestored`] is the answer, unless [`restore`] restored every volume into
/// `sandbox`: a failed restore never overwrites a saved volume.
pub async fn save(
    store: &VolumeStore<'_>,
    sandbox: SandboxId,
    holder: &Holder<'_>,
    volumes: &[Volume],
    execution: Uuid,
) -> Result<Vec<(String, u64)>, VolumeError> {
    let dispatcher = store.dispatcher()?;
    if !take_restored(sandbox) {
        tracing::warn!(%execution, sandbox = %sandbox.0, agent = %holder.agent_id,
            "persistent volumes not saved: they were not restored into this sandbox; the saved content is kept");
        return Err(VolumeError::NotRestored);
    }
    let mut saved = Vec::new();
    let mut over = None;
    for v in volumes.iter().filter(|v| v.persistent) {
        let archive = match dispatcher
            .export_dir(sandbox, &v.mount_path, v.size_limit)
            .await
        {
            Ok(a) => a,
            Err(dispatcher::DispatchError::ArchiveTooLarge { .. }) => {
                over.get_or_insert(VolumeError::TooLarge {
                    name: v.name.clone(),
                    limit: v.size_limit,
                });
                continue;
            }
            Err(e @ dispatcher::DispatchError::ArchiveRefused { .. }) => {
                let refused = sandbox_error(&v.name, e);
                tracing::warn!(%execution, sandbox = %sandbox.0, agent = %holder.agent_id,
                    volume = %v.name, error = %refused, "persistent volume not saved");
                over.get_or_insert(refused);
                continue;
            }
            Err(e) => return Err(sandbox_error(&v.name, e)),
        };
        let ttl = v
            .ttl_hours
            .unwrap_or(store.config.default_ttl_hours)
            .min(24 * 365 * 10) as i64;
        sqlx::query(
            "INSERT INTO agent_volumes (id, tenant_id, agent_id, owner, name, size_limit_bytes, \
             content, content_bytes, last_execution_id, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now() + make_interval(hours => $10::int)) \
             ON CONFLICT (tenant_id, agent_id, owner, name) DO UPDATE SET \
             size_limit_bytes = EXCLUDED.size_limit_bytes, content = EXCLUDED.content, \
             content_bytes = EXCLUDED.content_bytes, last_execution_id = EXCLUDED.last_execution_id, \
             updated_at = now(), expires_at = EXCLUDED.expires_at",
        )
        .bind(Uuid::new_v4())
        .bind(holder.tenant)
        .bind(holder.agent_id)
        .bind(holder.owner)
        .bind(&v.name)
        .bind(v.size_limit as i64)
        .bind(&archive)
        .bind(archive.len() as i64)
        .bind(execution)
        .bind(ttl as i32)
        .execute(store.pool)
        .await?;
        saved.push((v.name.clone(), archive.len() as u64));
    }
    match over {
        Some(e) => Err(e),
        None => Ok(saved),
    }
}

/// Deletes expired volumes; returns how many.
pub async fn sweep(pool: &PgPool) -> Result<u64, sqlx::Error> {
    let done = sqlx::query("DELETE FROM agent_volumes WHERE expires_at <= now()")
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn older_spellings_are_read_and_limits_checked() {
        let m = json!({"spec": {"volumes": [
            {"name": "a", "storage_class": "persistent", "mount_path": "/workspace/a/", "access_mode": "read-write", "size_limit": "1Mi", "ttl_hours": 2},
            {"name": "b", "storage_class": "ephemeral", "mount_point": "/workspace/b", "access_mode": "read-write", "size_limit_mb": 3},
        ]}});
        let v = of_manifest(&m);
        assert_eq!(v[0].mount_path, "/workspace/a");
        assert_eq!(v[0].size_limit, 1 << 20);
        assert!(v[0].persistent && !v[1].persistent);
        assert_eq!(v[1].mount_path, "/workspace/b");
        assert_eq!(v[1].size_limit, 3 << 20);
        let config = VolumesConfig {
            max_size_mb: 1,
            ..VolumesConfig::default()
        };
        assert!(check(&v, &config).is_ok());
        let mut big = v.clone();
        big[0].size_limit = 2 << 20;
        assert!(check(&big, &config)
            .unwrap_err()
            .to_string()
            .contains("max_size_mb"));
        big[0].size_limit = 1;
        big[0].read_only = true;
        assert!(check(&big, &config)
            .unwrap_err()
            .to_string()
            .contains("read-only"));
    }
}
