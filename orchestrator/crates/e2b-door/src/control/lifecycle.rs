//! Pause, resume and snapshots on E2B's control API ([`crate::snapshots`] says what a
//! filesystem snapshot saves and how it comes back; fork is [`super::fork`]):
//!
//! - `POST /sandboxes/{id}/pause`: a gVisor sandbox on an engine that checkpoints keeps its
//!   processes, open files and memory (`Dispatcher::checkpoint`) unless the SDK asks
//!   `keep_memory=False`; any other keeps its files, which become a `pause` snapshot, and its
//!   container is destroyed. Either way the sandbox is listed as `paused`.
//! - `POST /sandboxes/{id}/resume`, and `POST /sandboxes/{id}/connect` on a paused sandbox:
//!   a checkpointed sandbox is restored (`Dispatcher::restore`) and runs on; else a new
//!   sandbox of the same runtime under the same id and envd token gets its files back, and no
//!   process comes back (as after E2B's filesystem-only resume, a fresh boot).
//! - `POST /sandboxes/{id}/snapshots` (the sandbox keeps running), `GET /snapshots`,
//!   `DELETE /templates/{id}` (the SDK deletes snapshots there), and a create whose
//!   `templateID` names one of the key's snapshots (by id or name).
//!
//! Each leaves an admin audit row (`e2b.sandbox.pause`, `.resume`,
//! `e2b.snapshot.create`, `.delete`) and a line in the sandbox's log. Only the owner key sees
//! or uses a snapshot; another key's is "not found".

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, PoisonError, Weak};
use std::time::Instant;

use aegis_policy::sandboxes::SandboxAccess;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use dispatcher::SandboxId;
use serde_json::json;
use uuid::Uuid;

use aegis_e2b::api::{
    parse_optional_body, ApiError, Cursor, ResumedSandbox, SandboxPauseRequest,
    SandboxSnapshotRequest, SnapshotInfo, SnapshotsQuery, DEFAULT_TIMEOUT_SECS,
};

use super::{
    acting, created_answer, db, known, paged, permit, row_for, sandbox_error, to_json, Held, Key,
    WriteKey, MAX_BODY,
};
use crate::envd::Target;
use crate::snapshots::{self, NewSnapshot, Quota, Snapshot, SnapshotError};
use crate::store::{self, Row};
use crate::Refusal;
use aegis_core::caller::Caller;
use aegis_sandboxes::SandboxError;
use aegis_tools::state::AppState;
use aegis_tools::tools::control::{self, Control, Permit};

type Answer = Result<Response, Refusal>;

/// Longest snapshot name.
const MAX_NAME_BYTES: usize = 128;

pub(super) fn refusal(e: SnapshotError) -> Refusal {
    Refusal(e.to_api())
}

pub(super) async fn audit(
    state: &AppState,
    caller: &Caller,
    action: &str,
    args: serde_json::Value,
    ok: bool,
    started: Instant,
) -> Result<(), Refusal> {
    aegis_store::audit::record_admin(&state.pool, caller, action, &args, ok, started)
        .await
        .map(|_| ())
        .map_err(db)
}

/// A new sandbox of `runtime` for `caller` with the files of `archive` written into it through
/// the router ([`snapshots::restore`]); destroyed again when that fails.
pub(super) async fn start_restored(
    state: &AppState,
    caller: &Caller,
    runtime: &str,
    archive: &[u8],
    env: &BTreeMap<String, String>,
    network: bool,
) -> Result<(SandboxId, snapshots::Restored), Refusal> {
    let runtime = aegis_sandboxes::find_runtime(runtime).map_err(|e| Refusal(sandbox_error(e)))?;
    let (id, _) = control::create_for_e2b(state, caller, runtime, network)
        .await
        .map_err(|e| Refusal(sandbox_error(e)))?;
    // Restoring writes files only; no command runs, so no environment.
    let target = Target {
        id,
        caller: caller.clone(),
        env: Default::default(),
        user: dispatcher::protocol::RunAs::User,
    };
    let restored = match snapshots::restore(state, &target, archive).await {
        Ok(restored) => restored,
        Err(e) => {
            let _ = control::discard(state, caller, id, "its restore failed").await;
            return Err(refusal(e));
        }
    };
    // The files came back, the processes did not: the template's server (the code
    // interpreter's) starts again, as at create, before the sandbox is handed back.
    if let Err(e) = super::services::start(state, caller, id, env, runtime).await {
        tracing::warn!(sandbox = %id, error = %e, "E2B resume/fork: the template's server did not start; the sandbox goes");
        let _ = control::discard(state, caller, id, "its template's server did not start").await;
        return Err(Refusal(ApiError::new(503, e.to_string())));
    }
    Ok((id, restored))
}

/// Restores `snapshot` into the freshly created sandbox of `row` (a create naming a snapshot).
pub(super) async fn restore_into(
    state: &AppState,
    caller: &Caller,
    row: &Row,
    snapshot: &Snapshot,
) -> Result<snapshots::Restored, Refusal> {
    let archive = snapshots::archive(state, snapshot.id)
        .await
        .map_err(refusal)?
        .ok_or_else(|| Refusal(ApiError::new(404, "the snapshot expired meanwhile")))?;
    let target = Target {
        id: SandboxId(row.current),
        caller: caller.clone(),
        env: row.env_vars.0.clone(),
        user: dispatcher::protocol::RunAs::User,
    };
    let restored = snapshots::restore(state, &target, &archive)
        .await
        .map_err(refusal)?;
    store::log(
        &state.pool,
        row.sandbox_id,
        "info",
        "sandbox started from a snapshot: its files were restored; no process was",
        json!({"snapshot": snapshot.id.to_string(), "written": restored.written.to_string(),
               "left_out": restored.left_out.to_string()}),
    )
    .await;
    Ok(restored)
}

/// `POST /sandboxes/{id}/pause`: 204, 409 when already paused, 404 when the key has no such
/// sandbox.
pub async fn pause(
    State(state): State<AppState>,
    WriteKey(caller): WriteKey,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: SandboxPauseRequest = parse_optional_body(&body, MAX_BODY).map_err(Refusal)?;
    let row = row_for(&state, &caller, &id, PAUSE, Held::Known).await?;
    let uuid = row.sandbox_id;
    if row.paused_snapshot.is_some() {
        return Err(Refusal(ApiError::new(
            409,
            format!("sandbox \"{id}\" is already paused"),
        )));
    }
    let asked = json!({"sandboxID": uuid, "memory": req.keeps_memory()});
    let permit = acting(&state, &caller, &row, PAUSE, &asked).await?;
    let paused = pause_row(&state, &permit, &row, Why::Asked, req.keeps_memory()).await;
    let kept = match &paused {
        Ok(Some(Kept::Memory)) => "memory",
        _ => "filesystem",
    };
    permit
        .finish(
            &json!({"sandboxID": uuid, "memory": req.keeps_memory(), "kept": kept}),
            paused.is_ok(),
        )
        .await
        .map_err(db)?;
    paused?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The audit action of a pause.
const PAUSE: &str = "e2b.sandbox.pause";

/// Why a sandbox is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// `POST /sandboxes/{id}/pause`.
    Asked,
    /// Its timeout passed and it pauses then (`autoPause`).
    Timeout,
}

/// What a pause kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// The files: a `pause` snapshot holds them, the container is gone.
    Files,
    /// Processes, open files and memory: the container is checkpointed by its engine
    /// (`Dispatcher::checkpoint`, gVisor sandboxes only), its workspace held beside it.
    Memory,
}

/// Pauses the running sandbox of `row` (see the module's documentation): with its memory when
/// `keep_memory` and its class can (gVisor, on an engine that checkpoints), else its files;
/// `None` when a timeout pause found it no longer due (connected meanwhile, or another sweep
/// took it). The row is locked from before its files are read until it says paused, so a
/// connect or timeout change waits for the pause and then sees it.
async fn pause_row(
    state: &AppState,
    permit: &Permit<'_>,
    row: &Row,
    why: Why,
    keep_memory: bool,
) -> Result<Option<Kept>, Refusal> {
    let quota = Quota::of(state);
    let room = snapshots::room(&state.pool, &row.owner_key_id, quota)
        .await
        .map_err(refusal)?;
    let checkpointable = keep_memory && checkpointable(permit).await?;
    let mut tx = state.pool.begin().await.map_err(db)?;
    if !store::lock_for_pause(&mut tx, row.sandbox_id, why == Why::Timeout)
        .await
        .map_err(db)?
    {
        return match why {
            Why::Asked => Err(Refusal(ApiError::new(
                409,
                format!("sandbox \"{}\" is already paused", row.sandbox_id),
            ))),
            Why::Timeout => Ok(None),
        };
    }
    let mut kept = Kept::Files;
    let mut files_why = None;
    let mut checkpoint = None;
    if checkpointable {
        match permit.checkpoint(room).await {
            Ok(saved) => {
                kept = Kept::Memory;
                checkpoint = Some(saved.memory_bytes);
            }
            // The engine cannot: the files are kept, as for a container sandbox, and the log
            // says why.
            Err(SandboxError::Dispatch(
                e @ dispatcher::DispatchError::CheckpointUnavailable { .. },
            )) => {
                files_why = Some(e.to_string());
            }
            Err(e) => return Err(Refusal(checkpoint_error(e, room))),
        }
    }
    let (archive, runtime) = match kept {
        Kept::Memory => (None, runtime_of(permit).await?),
        Kept::Files => {
            let (archive, runtime) = snapshots::capture(permit, room).await.map_err(refusal)?;
            (Some(archive), runtime)
        }
    };
    let stored = store_pause(tx, row, &runtime, archive.as_deref(), checkpoint, quota).await;
    let snapshot = match stored {
        Ok(snapshot) => snapshot,
        Err(e) => {
            if kept == Kept::Memory {
                restore_after_failed_pause(permit).await;
            }
            return Err(e);
        }
    };
    if kept == Kept::Files {
        // The row says paused from here on. The container is made unreachable before the
        // answer and removed off the caller's path (`retire`, as a kill is); one the retire
        // misses is removed by the sweep.
        if let Err(e) = permit.retire().await {
            tracing::warn!(sandbox = %row.sandbox_id, error = %e, "a paused sandbox's container could not be destroyed yet; the sweep retries");
        }
    }
    let message = match (kept, why) {
        (Kept::Memory, Why::Asked) => {
            "sandbox paused with its memory: its processes, open files and memory were checkpointed"
        }
        (Kept::Memory, Why::Timeout) => {
            "sandbox paused at its timeout (autoPause) with its memory: its processes, open files and memory were checkpointed"
        }
        (Kept::Files, Why::Asked) => "sandbox paused: its files were saved, its processes ended",
        (Kept::Files, Why::Timeout) => {
            "sandbox paused at its timeout (autoPause): its files were saved, its processes ended"
        }
    };
    store::log(
        &state.pool,
        row.sandbox_id,
        "info",
        message,
        match files_why {
            None => {
                json!({"snapshot": snapshot.id.to_string(), "bytes": snapshot.bytes.to_string()})
            }
            Some(why) => {
                json!({"snapshot": snapshot.id.to_string(), "bytes": snapshot.bytes.to_string(),
                                "files_only_because": why})
            }
        },
    )
    .await;
    Ok(Some(kept))
}

/// Stores the pause of `row` in `tx` and commits: its `pause` snapshot (the files' `archive`,
/// or the memory of its `checkpoint`) and the row saying paused.
async fn store_pause(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    row: &Row,
    runtime: &str,
    archive: Option<&[u8]>,
    checkpoint: Option<u64>,
    quota: Quota,
) -> Result<Snapshot, Refusal> {
    let snapshot = snapshots::insert(
        &mut tx,
        &NewSnapshot {
            tenant: &row.tenant,
            owner_key_id: &row.owner_key_id,
            pause: true,
            source_sandbox: row.sandbox_id,
            template_id: &row.template_id,
            runtime,
            name: None,
            archive: archive.unwrap_or_default(),
            checkpoint,
        },
        quota,
    )
    .await
    .map_err(refusal)?;
    if !store::set_paused(&mut tx, row.sandbox_id, snapshot.id)
        .await
        .map_err(db)?
    {
        return Err(Refusal(ApiError::new(
            409,
            format!("sandbox \"{}\" is already paused", row.sandbox_id),
        )));
    }
    tx.commit().await.map_err(db)?;
    Ok(snapshot)
}

/// Whether the sandbox of `permit` can be paused with its memory: a gVisor sandbox (the
/// engine's own refusal, when it cannot checkpoint, comes from its checkpoint).
pub(super) async fn checkpointable(permit: &Permit<'_>) -> Result<bool, Refusal> {
    let info = permit.info().await.map_err(|e| Refusal(sandbox_error(e)))?;
    Ok(info
        .spec
        .is_some_and(|s| s.isolation == dispatcher::Isolation::Gvisor))
}

/// The runtime (`language:version`) the sandbox of `permit` runs, from its labels.
async fn runtime_of(permit: &Permit<'_>) -> Result<String, Refusal> {
    snapshots::runtime_of(permit).await.map_err(|e| match e {
        SandboxError::NoPolicy(current) => Refusal(ApiError::new(
            500,
            format!("sandbox {current} names no runtime"),
        )),
        other => Refusal(sandbox_error(other)),
    })
}

/// A checkpoint's refusal as the control API says it.
pub(super) fn checkpoint_error(e: SandboxError, room: u64) -> ApiError {
    match e {
        SandboxError::Dispatch(dispatcher::DispatchError::CheckpointTooLarge { bytes, .. }) => {
            ApiError::new(
                429,
                format!(
                    "the sandbox holds {bytes} bytes of memory, more than the {room} bytes this \
                     API key's snapshot quota leaves; free some, delete a snapshot, or pause \
                     with keep_memory=False to keep its files only"
                ),
            )
            .with_error_code("snapshot_quota_exceeded")
        }
        // As a filesystem pause's capture answers (`SnapshotError::to_api`).
        SandboxError::Dispatch(dispatcher::DispatchError::SandboxNotFound {
            attached_elsewhere: true,
            ..
        }) => ApiError::new(
            409,
            "the sandbox is served by another replica of this node; ask it",
        ),
        other => sandbox_error(other),
    }
}

/// After a pause whose checkpoint was taken but could not be recorded: the sandbox is
/// restored so that it runs on as before (or, when that fails, destroyed by the restore).
async fn restore_after_failed_pause(permit: &Permit<'_>) {
    if let Err(e) = permit.restore().await {
        tracing::warn!(sandbox = %permit.sandbox(), error = %e, "a checkpointed sandbox whose pause could not be recorded could not be restored");
    }
}

/// Pauses the sandboxes whose timeout passed and whose timeout pauses them (`autoPause`),
/// as [`pause`] does, at most `limit` per call; run by the sweep beside the one that kills
/// the others. A pause that fails (the owner key's snapshot quota, the database) turns the
/// sandbox's timeout into a kill, which the next sweep carries out, and says so in its log:
/// a sandbox is never left running past its timeout. Each pause is an admin audit row of the
/// system (`e2b.sandbox.pause`). Returns how many were paused.
pub async fn pause_due(state: &AppState, limit: i64) -> Result<usize, sqlx::Error> {
    let mut paused = 0;
    let system = Caller::system();
    for row in store::due_for_pause(&state.pool, limit).await? {
        let started = Instant::now();
        let asked = json!({"sandboxID": row.sandbox_id, "at": "timeout"});
        // E2B's autoPause keeps memory where the sandbox's class can, unless it was made with
        // `autoPauseMemory: false`.
        let (done, permit) = match acting(state, &system, &row, PAUSE, &asked).await {
            Ok(permit) => (
                pause_row(state, &permit, &row, Why::Timeout, row.pause_keeps_memory).await,
                Some(permit),
            ),
            Err(refused) => (Err(refused), None),
        };
        match &done {
            Ok(None) => continue,
            Ok(Some(_)) => paused += 1,
            Err(Refusal(e)) => {
                tracing::warn!(sandbox = %row.sandbox_id, error = %e.message, "the pause at an E2B sandbox's timeout failed; it is killed instead");
                store::kill_on_timeout(&state.pool, row.sandbox_id).await?;
                store::log(
                    &state.pool,
                    row.sandbox_id,
                    "warn",
                    "the pause at the sandbox's timeout failed: it is killed instead",
                    json!({"error": e.message.clone()}),
                )
                .await;
            }
        }
        let args = json!({"sandboxID": row.sandbox_id, "at": "timeout",
                "kept": if matches!(done, Ok(Some(Kept::Memory))) { "memory" } else { "filesystem" }});
        let ok = matches!(done, Ok(Some(_)));
        let _ = match permit {
            Some(permit) => permit.finish(&args, ok).await,
            None => {
                aegis_store::audit::record_admin(&state.pool, &system, PAUSE, &args, ok, started)
                    .await
            }
        };
    }
    Ok(paused)
}

/// The resumes under way on this replica, one lock per E2B id: many requests to a paused
/// sandbox's ports (or connects) arriving together resume it once; the others wait for that
/// resume and take its row. Across replicas the row decides (`store::set_resumed` takes only
/// the paused row, a losing resume's sandbox goes), which is correct but makes a sandbox per
/// replica; this keeps a burst on one replica to one.
static RESUMING: LazyLock<std::sync::Mutex<HashMap<Uuid, Weak<tokio::sync::Mutex<()>>>>> =
    LazyLock::new(Default::default);

/// The lock of `id`'s resume, shared by everyone resuming it now.
fn resume_lock(id: Uuid) -> Arc<tokio::sync::Mutex<()>> {
    let mut held = RESUMING.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(lock) = held.get(&id).and_then(Weak::upgrade) {
        return lock;
    }
    held.retain(|_, lock| lock.strong_count() > 0);
    let lock = Arc::new(tokio::sync::Mutex::new(()));
    held.insert(id, Arc::downgrade(&lock));
    lock
}

/// Resumes a paused sandbox of `caller` (see the module's documentation): the row, running
/// again for `timeout_secs`. One resume per id at a time ([`RESUMING`]): one that waited for
/// another answers the row that one left, resuming nothing and writing no row.
pub(super) async fn resume_row(
    state: &AppState,
    caller: &Caller,
    row: &Row,
    timeout_secs: u32,
) -> Result<Row, Refusal> {
    if row.paused_snapshot.is_none() {
        return Ok(row.clone());
    }
    let lock = resume_lock(row.sandbox_id);
    let _only_one = lock.lock().await;
    let row = store::get_known(&state.pool, row.sandbox_id, &caller.id)
        .await
        .map_err(db)?
        .ok_or_else(|| {
            Refusal(ApiError::new(
                404,
                format!("paused sandbox \"{}\" not found", row.sandbox_id),
            ))
        })?;
    let Some(snapshot_id) = row.paused_snapshot else {
        // Resumed meanwhile: it lives at least what this resume asked.
        let extended =
            store::set_deadline(&state.pool, row.sandbox_id, &caller.id, timeout_secs, true)
                .await
                .map_err(db)?;
        return Ok(extended.unwrap_or(row));
    };
    let row = &row;
    let started = Instant::now();
    let args = json!({"sandboxID": row.sandbox_id, "timeout": timeout_secs});
    let (resumed, permit) = resume_from(state, caller, row, snapshot_id, timeout_secs, &args).await;
    match permit {
        // A sandbox paused with its memory: the router's permit for its restore writes the row.
        Some(permit) => permit
            .finish(&args, resumed.is_ok())
            .await
            .map(|_| ())
            .map_err(db)?,
        // One paused with its files: a new sandbox (made through the router) takes them.
        None => audit(state, caller, RESUME, args, resumed.is_ok(), started).await?,
    }
    resumed
}

/// The audit action of a resume.
const RESUME: &str = "e2b.sandbox.resume";

/// Resumes `row` from its pause snapshot; with the router's permit when the sandbox kept its
/// memory (its checkpointed sandbox is restored), without when a new sandbox takes its files.
async fn resume_from<'a>(
    state: &'a AppState,
    caller: &'a Caller,
    row: &Row,
    snapshot_id: Uuid,
    timeout_secs: u32,
    args: &serde_json::Value,
) -> (Result<Row, Refusal>, Option<Permit<'a>>) {
    let snapshot = match aegis_store::e2b::snapshots::get(&state.pool, snapshot_id).await {
        Ok(Some(snapshot)) => snapshot,
        Ok(None) => return (Err(paused_gone(row)), None),
        Err(e) => return (Err(db(e)), None),
    };
    if !snapshot.keeps_memory {
        return (
            resume_files(state, caller, row, &snapshot, timeout_secs).await,
            None,
        );
    }
    let call = Control {
        action: RESUME,
        sandbox: SandboxId(row.current),
        access: SandboxAccess::Act,
        args,
    };
    match permit(state, caller, call).await {
        Ok(Some(permit)) => (
            resume_checkpointed(state, &permit, row, snapshot_id, timeout_secs).await,
            Some(permit),
        ),
        Ok(None) => (Err(paused_gone(row)), None),
        Err(refused) => (Err(refused), None),
    }
}

fn paused_gone(row: &Row) -> Refusal {
    Refusal(ApiError::new(
        404,
        format!("paused sandbox \"{}\" not found", row.sandbox_id),
    ))
}

/// Resumes `row` paused with its files: a new sandbox of its runtime takes them back.
async fn resume_files(
    state: &AppState,
    caller: &Caller,
    row: &Row,
    snapshot: &aegis_store::e2b::snapshots::Snapshot,
    timeout_secs: u32,
) -> Result<Row, Refusal> {
    let snapshot_id = snapshot.id;
    let gone = || paused_gone(row);
    let archive = snapshots::archive(state, snapshot_id)
        .await
        .map_err(refusal)?
        .ok_or_else(gone)?;
    // The sandbox keeps its network rules: they are its row's, which the resume keeps.
    let network = super::networked(state, caller, row);
    let (new_id, restored) = start_restored(
        state,
        caller,
        &snapshot.runtime,
        &archive,
        &row.env_vars.0,
        network,
    )
    .await?;
    let updated = store::set_resumed(
        &state.pool,
        row.sandbox_id,
        snapshot_id,
        new_id.0,
        timeout_secs,
    )
    .await
    .map_err(db)?;
    let Some(updated) = updated else {
        // Another resume won: its sandbox serves the id, ours goes.
        let _ = control::discard(state, caller, new_id, "another resume won").await;
        return store::get_known(&state.pool, row.sandbox_id, &caller.id)
            .await
            .map_err(db)?
            .ok_or_else(gone);
    };
    snapshots::delete(&state.pool, snapshot_id)
        .await
        .map_err(db)?;
    store::log(
        &state.pool,
        row.sandbox_id,
        "info",
        "sandbox resumed from its files (filesystem only): processes from before the pause were not restored",
        json!({"written": restored.written.to_string(), "left_out": restored.left_out.to_string()}),
    )
    .await;
    Ok(updated)
}

/// Resumes a sandbox paused with its memory: its checkpointed sandbox restored on this
/// replica's engine (the same dispatcher sandbox, its processes running on where they were);
/// refused, with the sandbox left paused, when the checkpoint is on another engine.
async fn resume_checkpointed(
    state: &AppState,
    permit: &Permit<'_>,
    row: &Row,
    snapshot_id: Uuid,
    timeout_secs: u32,
) -> Result<Row, Refusal> {
    permit.restore().await.map_err(|e| match e {
        SandboxError::Dispatch(e @ dispatcher::DispatchError::CheckpointElsewhere { .. }) => {
            Refusal(ApiError::new(503, e.to_string()).with_error_code("checkpoint_elsewhere"))
        }
        SandboxError::Dispatch(
            e @ (dispatcher::DispatchError::SandboxGone { .. }
            | dispatcher::DispatchError::SandboxNotFound { .. }),
        ) => Refusal(ApiError::new(
            404,
            format!(
                "paused sandbox \"{}\" could not be resumed: {e}",
                row.sandbox_id
            ),
        )),
        other => Refusal(sandbox_error(other)),
    })?;
    let updated = store::set_resumed(
        &state.pool,
        row.sandbox_id,
        snapshot_id,
        row.current,
        timeout_secs,
    )
    .await
    .map_err(db)?;
    snapshots::delete(&state.pool, snapshot_id)
        .await
        .map_err(db)?;
    store::log(
        &state.pool,
        row.sandbox_id,
        "info",
        "sandbox resumed with its memory: its processes run on from where they were paused",
        json!({}),
    )
    .await;
    match updated {
        Some(updated) => Ok(updated),
        None => store::get_known(&state.pool, row.sandbox_id, &row.owner_key_id)
            .await
            .map_err(db)?
            .ok_or_else(|| {
                Refusal(ApiError::new(
                    404,
                    format!("paused sandbox \"{}\" not found", row.sandbox_id),
                ))
            }),
    }
}

/// `POST /sandboxes/{id}/resume` (deprecated by E2B for connect): 201 with the sandbox, 409
/// when it runs; `autoPause`, when given, sets what its timeout does from now on (pause or
/// kill).
pub async fn resume(
    State(state): State<AppState>,
    WriteKey(caller): WriteKey,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: ResumedSandbox = parse_optional_body(&body, MAX_BODY).map_err(Refusal)?;
    let timeout = checked_timeout(req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS))?;
    let row = known(&state, &caller, &id).await?;
    if row.paused_snapshot.is_none() {
        return Err(Refusal(ApiError::new(
            409,
            format!("sandbox \"{id}\" is already running"),
        )));
    }
    let row = resume_row(&state, &caller, &row, timeout).await?;
    if let Some(pause) = req.auto_pause {
        store::set_on_timeout(&state.pool, row.sandbox_id, &caller.id, pause)
            .await
            .map_err(db)?;
    }
    Ok(to_json(
        StatusCode::CREATED,
        &created_answer(&row, &state.config.e2b.domain),
    ))
}

pub(super) fn checked_timeout(secs: u32) -> Result<u32, Refusal> {
    let max = aegis_e2b::api::Limits::default().max_timeout_secs;
    if secs > max {
        return Err(Refusal(ApiError::bad_request(format!(
            "timeout {secs} s is longer than this node's limit of {max} s"
        ))));
    }
    Ok(secs)
}

fn checked_name(name: Option<&str>) -> Result<Option<&str>, Refusal> {
    let Some(name) = name.filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    let ok = name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:".contains(&b));
    if !ok {
        return Err(Refusal(ApiError::bad_request(format!(
            "name must be 1 to {MAX_NAME_BYTES} letters, digits and . _ - / :"
        ))));
    }
    // A create names a runtime or a snapshot by the same field: a snapshot may not take a
    // runtime's name, nor look like another snapshot's id.
    if aegis_sandboxes::find_runtime(name).is_ok() || Uuid::parse_str(name).is_ok() {
        return Err(Refusal(ApiError::bad_request(format!(
            "name {name:?} is a template (runtime) name or an id; choose another"
        ))));
    }
    Ok(Some(name))
}

/// `POST /sandboxes/{id}/snapshots`: 201 with the snapshot; the sandbox keeps running.
pub async fn create_snapshot(
    State(state): State<AppState>,
    WriteKey(caller): WriteKey,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: SandboxSnapshotRequest = parse_optional_body(&body, MAX_BODY).map_err(Refusal)?;
    let name = checked_name(req.name.as_deref())?;
    const SNAPSHOT: &str = "e2b.snapshot.create";
    let row = row_for(&state, &caller, &id, SNAPSHOT, Held::Running).await?;
    let uuid = row.sandbox_id;
    let asked = json!({"sandboxID": uuid, "named": name.is_some()});
    let permit = acting(&state, &caller, &row, SNAPSHOT, &asked).await?;
    let taken = take_snapshot(&state, &permit, &caller, &row, name).await;
    permit
        .finish(
            &json!({"sandboxID": uuid, "named": name.is_some(),
                    "snapshotID": taken.as_ref().ok().map(|s| s.id)}),
            taken.is_ok(),
        )
        .await
        .map_err(db)?;
    let snapshot = taken?;
    store::log(
        &state.pool,
        uuid,
        "info",
        "snapshot taken (files only)",
        json!({"snapshot": snapshot.id.to_string(), "bytes": snapshot.bytes.to_string()}),
    )
    .await;
    Ok(to_json(StatusCode::CREATED, &info(&snapshot)))
}

async fn take_snapshot(
    state: &AppState,
    permit: &Permit<'_>,
    caller: &Caller,
    row: &Row,
    name: Option<&str>,
) -> Result<Snapshot, Refusal> {
    let quota = Quota::of(state);
    let room = snapshots::room(&state.pool, &caller.id, quota)
        .await
        .map_err(refusal)?;
    let (archive, runtime) = snapshots::capture(permit, room).await.map_err(refusal)?;
    let mut tx = state.pool.begin().await.map_err(db)?;
    let snapshot = snapshots::insert(
        &mut tx,
        &NewSnapshot {
            tenant: &caller.tenant,
            owner_key_id: &caller.id,
            pause: false,
            source_sandbox: row.sandbox_id,
            template_id: &row.template_id,
            runtime: &runtime,
            name,
            archive: &archive,
            checkpoint: None,
        },
        quota,
    )
    .await
    .map_err(refusal)?;
    tx.commit().await.map_err(db)?;
    Ok(snapshot)
}

fn info(s: &Snapshot) -> SnapshotInfo {
    SnapshotInfo {
        snapshot_id: s.id.to_string(),
        names: s.name.iter().cloned().collect(),
    }
}

/// `GET /snapshots`: the key's snapshots, newest first, filtered by source sandbox and by name
/// or id, one page at a time (`X-Next-Token`).
pub async fn list_snapshots(
    State(state): State<AppState>,
    Key(caller): Key,
    RawQuery(query): RawQuery,
) -> Answer {
    let q = SnapshotsQuery::parse(query.as_deref().unwrap_or("")).map_err(Refusal)?;
    let source = match &q.sandbox_id {
        None => None,
        Some(raw) => match Uuid::parse_str(raw) {
            Ok(id) => Some(id),
            // No sandbox of this node has such an id: nothing was taken from it.
            Err(_) => return Ok(to_json(StatusCode::OK, &Vec::<SnapshotInfo>::new())),
        },
    };
    let after = match &q.next_token {
        None => None,
        Some(c) => Some((
            c.at,
            Uuid::parse_str(&c.id).map_err(|_| {
                Refusal(ApiError::bad_request(
                    "nextToken is not a page token of this node",
                ))
            })?,
        )),
    };
    let limit = i64::from(q.limit);
    let mut rows = snapshots::list(
        &state.pool,
        &caller.id,
        source,
        q.name.as_deref(),
        after,
        limit + 1,
    )
    .await
    .map_err(db)?;
    let more = rows.len() as i64 > limit;
    rows.truncate(q.limit as usize);
    let page: Vec<SnapshotInfo> = rows.iter().map(info).collect();
    let next = rows.last().filter(|_| more).map(|last| Cursor {
        at: last.created_at,
        id: last.id.to_string(),
    });
    Ok(paged(to_json(StatusCode::OK, &page), next))
}

/// `DELETE /templates/{id}`, where the SDK deletes snapshots: 204, or 404 when the key has no
/// snapshot of that id (templates themselves are the node's runtimes and are not deleted).
pub async fn delete_snapshot(
    State(state): State<AppState>,
    WriteKey(caller): WriteKey,
    Path(id): Path<String>,
) -> Answer {
    let missing = || Refusal(ApiError::new(404, format!("snapshot \"{id}\" not found")));
    let uuid = Uuid::parse_str(&id).map_err(|_| missing())?;
    let started = Instant::now();
    let deleted = snapshots::delete_owned(&state.pool, &caller.id, uuid)
        .await
        .map_err(db)?;
    if !deleted {
        return Err(missing());
    }
    audit(
        &state,
        &caller,
        "e2b.snapshot.delete",
        json!({"snapshotID": uuid}),
        true,
        started,
    )
    .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
