//! Snapshots of E2B sandboxes, with E2B's filesystem-only semantics: the files of a sandbox,
//! never its processes or memory. A pause, `POST /sandboxes/{id}/snapshots` and a fork all take
//! one ([`capture`]); a resume, a create whose `templateID` names a snapshot, and a fork start a
//! sandbox from one ([`restore`]).
//!
//! What is saved: the sandbox's workspace (`/home/user`), the only place it keeps files: its
//! root filesystem is read-only, and `/tmp` is a tmpfs that, like memory, does not survive.
//! The dispatcher archives the workspace as plain data (owners the sandbox user's, no set-id or
//! sticky bits, no devices or FIFOs, no links pointing out of it, see `dispatcher::archive`).
//!
//! Where: a row of `e2b_snapshots` holding the tar archive, in PostgreSQL rather than in a
//! directory of the node, so every replica can resume or fork from it and it outlives a
//! replica's restart or disk. Bounded: per API key, in number and bytes (config `e2b`), counted
//! under a lock of the key so concurrent snapshots cannot overshoot together, and expiring
//! (`e2b.snapshot_ttl_secs`, [`sweep`]).
//!
//! How it comes back: never around the policy. The archive is read again through the same
//! rewriting ([`dispatcher::data_entries`]), then every directory and file is written by
//! `fs.create_dir` and `fs.write` tool calls through the router, as the owner key (confined by
//! its security context) on the new sandbox's policy: the decision, audit rows, path allowlist
//! and kernel-held rules of an upload. What the policy refuses is left out and counted; a
//! symbolic link is left out too (no tool makes one, as no upload can), and a hard link is
//! written as a copy of its file.

use std::collections::HashMap;

use base64::Engine as _;
use dispatcher::{DataKind, SandboxId};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use aegis_e2b::api::ApiError;
use aegis_e2b::connect::Code;

use super::envd::{self, Target};
use aegis_sandboxes::{SandboxError, E2B_HOME, E2B_RUNTIME_LABEL};
use aegis_store::e2b::snapshots as rows;
/// The rows, read and written by the storage crate.
pub use aegis_store::e2b::snapshots::{delete, delete_owned, find, list, NewSnapshot, Snapshot};
use aegis_tools::state::AppState;
use aegis_tools::tools::control::{self, Permit};

/// Most entries one snapshot may hold (each is a tool call when restored).
pub const MAX_ENTRIES: usize = 20_000;

/// Why a snapshot could not be taken, stored or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The key holds as many snapshots, or bytes of them, as the node allows.
    #[error("snapshot quota reached: this API key holds {count} snapshot(s) of {bytes} bytes (limits: {max_count} snapshots, {max_bytes} bytes); delete one (Sandbox.delete_snapshot) or wait for one to expire")]
    Quota {
        count: u64,
        bytes: u64,
        max_count: u64,
        max_bytes: u64,
    },
    /// The sandbox's files are more than the key's quota leaves room for.
    #[error(
        "the sandbox's files are larger than the {room} bytes this API key's snapshot quota leaves"
    )]
    TooLarge { room: u64 },
    /// The node holds as much client data in memory as it allows: nothing was stored.
    #[error(transparent)]
    NodeBusy(dispatcher::budget::Exhausted),
    /// More entries than [`MAX_ENTRIES`].
    #[error("the snapshot holds more than 20000 files and directories")]
    TooManyEntries,
    /// The sandbox could not be read or written.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// A restore failed for another reason than the policy.
    #[error("restoring {path}: {message}")]
    Restore { path: String, message: String },
    /// The archive is not one this node wrote.
    #[error("the snapshot cannot be read: {0}")]
    Unreadable(String),
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

impl SnapshotError {
    /// The control API's answer.
    pub fn to_api(&self) -> ApiError {
        match self {
            SnapshotError::Quota { .. } | SnapshotError::TooLarge { .. } => {
                ApiError::new(429, self.to_string()).with_error_code("snapshot_quota_exceeded")
            }
            SnapshotError::TooManyEntries => ApiError::bad_request(self.to_string()),
            SnapshotError::NodeBusy(_) => {
                ApiError::new(503, self.to_string()).with_error_code("node_memory_bound")
            }
            SnapshotError::Sandbox(SandboxError::Dispatch(
                dispatcher::DispatchError::SandboxNotFound {
                    attached_elsewhere: true,
                    ..
                },
            )) => ApiError::new(
                409,
                "the sandbox is served by another replica of this node; ask it",
            ),
            SnapshotError::Sandbox(SandboxError::Dispatch(
                dispatcher::DispatchError::SandboxNotFound { .. }
                | dispatcher::DispatchError::SandboxGone { .. },
            )) => ApiError::new(404, "the sandbox is gone"),
            SnapshotError::Db(e) => {
                tracing::error!(error = %e, "E2B snapshots: database failure");
                ApiError::new(503, "the node's database is unavailable")
            }
            other => {
                tracing::warn!(error = %other, "E2B snapshot failed");
                ApiError::new(500, other.to_string())
            }
        }
    }
}

/// The per-key bounds of the `e2b` config section.
#[derive(Debug, Clone, Copy)]
pub struct Quota {
    pub count: u64,
    pub bytes: u64,
    pub ttl_secs: u64,
}

impl Quota {
    /// The node's.
    pub fn of(state: &AppState) -> Quota {
        let c = &state.config.e2b;
        Quota {
            count: c.max_snapshots_per_api_key,
            bytes: c.max_snapshot_mb_per_api_key.saturating_mul(1024 * 1024),
            ttl_secs: c.snapshot_ttl_secs,
        }
    }
}

/// Bytes the key may still store, or the quota refusal when it may store no more snapshots.
pub async fn room(pool: &PgPool, key: &str, quota: Quota) -> Result<u64, SnapshotError> {
    let mut conn = pool.acquire().await?;
    let (count, bytes) = rows::held(&mut conn, key).await?;
    if count >= quota.count || bytes >= quota.bytes {
        return Err(SnapshotError::Quota {
            count,
            bytes,
            max_count: quota.count,
            max_bytes: quota.bytes,
        });
    }
    Ok(quota.bytes - bytes)
}

/// The runtime (`language:version`) the sandbox of `permit` runs, from its labels;
/// `NoPolicy` when it names none (not an E2B sandbox).
pub async fn runtime_of(permit: &Permit<'_>) -> Result<String, SandboxError> {
    permit
        .info()
        .await?
        .spec
        .and_then(|s| s.labels.get(E2B_RUNTIME_LABEL).cloned())
        .ok_or(SandboxError::NoPolicy(permit.sandbox()))
}

/// The files of the running sandbox of `permit`, at most `room` bytes, read with the sandbox
/// frozen (`Permit::export_dir_frozen`), and the runtime it runs.
pub async fn capture(permit: &Permit<'_>, room: u64) -> Result<(Held, String), SnapshotError> {
    let runtime = runtime_of(permit).await?;
    // Frozen while read: the snapshot is the files at one moment.
    let (bytes, reserved) =
        permit
            .export_dir_frozen(E2B_HOME, room)
            .await
            .map_err(|e| match e {
                SandboxError::Dispatch(dispatcher::DispatchError::ArchiveTooLarge { .. }) => {
                    SnapshotError::TooLarge { room }
                }
                SandboxError::Dispatch(dispatcher::DispatchError::MemoryBound(e)) => {
                    SnapshotError::NodeBusy(e)
                }
                other => SnapshotError::Sandbox(other),
            })?;
    Ok((
        Held {
            bytes,
            _reserved: reserved,
        },
        runtime,
    ))
}

/// Stores a snapshot in `tx`, within the key's quota: counted under a transaction lock of the
/// key, so two snapshots taken at once cannot pass the quota together.
pub async fn insert(
    tx: &mut sqlx::PgConnection,
    new: &NewSnapshot<'_>,
    quota: Quota,
) -> Result<Snapshot, SnapshotError> {
    let limits = rows::Limits {
        max_count: quota.count,
        max_bytes: quota.bytes,
        ttl_secs: quota.ttl_secs,
    };
    rows::insert(tx, new, limits)
        .await?
        .map_err(|held| SnapshotError::Quota {
            count: held.count,
            bytes: held.bytes,
            max_count: quota.count,
            max_bytes: quota.bytes,
        })
}

/// A snapshot's archive in the node's memory, counted against its bound until dropped.
pub struct Held {
    bytes: Vec<u8>,
    _reserved: dispatcher::budget::Reservation,
}

impl std::ops::Deref for Held {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// The archive of snapshot `id`, loaded only when the node's memory bound has room for it
/// twice (the archive, and its entries parsed for the restore).
pub async fn archive(state: &AppState, id: Uuid) -> Result<Option<Held>, SnapshotError> {
    let size = rows::archive_size(&state.pool, id).await?;
    let Some(size) = size else {
        return Ok(None);
    };
    let reserved = state
        .sandboxes
        .dispatcher()?
        .memory()
        .reserve(u64::try_from(size).unwrap_or(0).saturating_mul(2))
        .map_err(SnapshotError::NodeBusy)?;
    let bytes = rows::archive(&state.pool, id).await?;
    Ok(bytes.map(|bytes| Held {
        bytes,
        _reserved: reserved,
    }))
}

/// Most snapshots one sweep deletes.
const SWEEP_BATCH: i64 = 64;

/// Deletes expired snapshots (a paused sandbox whose snapshot expired goes with it, by the
/// foreign key, and the checkpoint of one paused with its memory right after), with one admin
/// row by the system naming how many.
pub async fn sweep(state: &AppState) -> Result<usize, sqlx::Error> {
    let started = std::time::Instant::now();
    let gone = rows::delete_expired(&state.pool, SWEEP_BATCH).await?;
    // A pause that kept memory leaves its sandbox (the checkpoint) behind the rows: once no
    // row names it (expired, or a kill cut short) it goes too.
    for sandbox in
        aegis_store::e2b::sandboxes::orphaned_checkpoints(&state.pool, SWEEP_BATCH).await?
    {
        let _ = control::discard(
            state,
            &aegis_core::caller::Caller::system(),
            SandboxId(sandbox),
            "a checkpointed sandbox no E2B sandbox names",
        )
        .await;
    }
    if !gone.is_empty() {
        let ids: Vec<String> = gone
            .iter()
            .map(|(id, kind)| format!("{kind}:{id}"))
            .collect();
        tracing::info!(count = gone.len(), "expired E2B snapshots deleted");
        let _ = aegis_store::audit::record_admin(
            &state.pool,
            &aegis_core::caller::Caller::system(),
            "e2b.snapshot.expired",
            &json!({"snapshots": ids}),
            true,
            started,
        )
        .await;
    }
    Ok(gone.len())
}

/// What a restore did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Restored {
    /// Directories and files written.
    pub written: usize,
    /// Entries left out: refused by the policy, symbolic links, names that are not UTF-8.
    pub left_out: usize,
}

/// Writes the files of `archive` into the workspace of `target`'s sandbox through the router
/// (see the module's documentation).
pub async fn restore(
    state: &AppState,
    target: &Target,
    archive: &[u8],
) -> Result<Restored, SnapshotError> {
    let (entries, dropped) =
        dispatcher::data_entries(archive).map_err(SnapshotError::Unreadable)?;
    if entries.len() > MAX_ENTRIES {
        return Err(SnapshotError::TooManyEntries);
    }
    let mut done = Restored {
        written: 0,
        left_out: dropped,
    };
    let files: HashMap<&str, usize> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == DataKind::File)
        .map(|(i, e)| (e.path.as_str(), i))
        .collect();
    let chunk = usize::try_from(super::files::chunk(state)).unwrap_or(usize::MAX);
    for entry in &entries {
        if entry.path.is_empty() {
            continue;
        }
        let path = format!("{E2B_HOME}/{}", entry.path);
        let outcome = match entry.kind {
            DataKind::Dir => envd::call(state, target, "fs.create_dir", json!({"path": path}))
                .await
                .map(|_| ()),
            DataKind::File => write_file(state, target, &path, &entry.data, chunk).await,
            DataKind::HardLink => match files.get(entry.link.as_str()) {
                Some(&i) => write_file(state, target, &path, &entries[i].data, chunk).await,
                None => {
                    done.left_out += 1;
                    continue;
                }
            },
            DataKind::Symlink => {
                done.left_out += 1;
                continue;
            }
        };
        match outcome {
            Ok(()) => done.written += 1,
            Err(e) if e.code == Code::AlreadyExists => done.written += 1,
            Err(e) if e.code == Code::PermissionDenied => done.left_out += 1,
            Err(e) => {
                return Err(SnapshotError::Restore {
                    path,
                    message: e.message,
                })
            }
        }
    }
    Ok(done)
}

/// One file by `fs.write` calls of at most `chunk` bytes (the first replaces, the rest append),
/// text as text and anything else as base64, as an upload writes it.
async fn write_file(
    state: &AppState,
    target: &Target,
    path: &str,
    data: &[u8],
    chunk: usize,
) -> Result<(), aegis_e2b::connect::ConnectError> {
    let mut first = true;
    let pieces: Vec<&[u8]> = if data.is_empty() {
        vec![data]
    } else {
        data.chunks(chunk.max(1)).collect()
    };
    for piece in pieces {
        let text = std::str::from_utf8(piece)
            .ok()
            .filter(|t| !t.bytes().any(|b| b < 0x20 && !b"\t\n\r".contains(&b)));
        let (content, encoding) = match text {
            Some(t) => (t.to_owned(), "utf8"),
            None => (
                base64::engine::general_purpose::STANDARD.encode(piece),
                "base64",
            ),
        };
        envd::call(
            state,
            target,
            "fs.write",
            json!({"path": path, "content": content, "encoding": encoding, "append": !first}),
        )
        .await?;
        first = false;
    }
    Ok(())
}
