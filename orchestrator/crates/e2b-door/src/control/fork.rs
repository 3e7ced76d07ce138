//! `POST /sandboxes/{id}/fork` on E2B's control API: `count` sandboxes started from a running
//! one, each reported on its own. A gVisor source on an engine that checkpoints is forked with
//! its processes and memory (`Dispatcher::fork`); any other with its files only (a snapshot
//! held for the request, restored into each fork through the router, as
//! [`crate::snapshots`] says). Leaves an admin audit row (`e2b.sandbox.fork`) and a line in
//! each sandbox's log.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use dispatcher::SandboxId;
use serde_json::json;
use uuid::Uuid;

use aegis_e2b::api::{
    parse_optional_body, ApiError, SandboxForkRequest, SandboxForkResult, DEFAULT_TIMEOUT_SECS,
};

use super::lifecycle::{
    checked_timeout, checkpoint_error, checkpointable, refusal, start_restored,
};
use super::{acting, created_answer, db, new_token, row_for, to_json, Held, WriteKey, MAX_BODY};
use crate::snapshots::{self, Quota};
use crate::store::{self, Row};
use crate::Refusal;
use aegis_core::caller::Caller;
use aegis_tools::state::AppState;
use aegis_tools::tools::control::{self, Permit};

type Answer = Result<Response, Refusal>;

/// `POST /sandboxes/{id}/fork`: 201 with one result per fork asked for, each a sandbox of the
/// source's runtime with its metadata and template, its own token and the asked timeout. A
/// gVisor source on an engine that checkpoints is forked with its memory (`Dispatcher::fork`):
/// each fork runs on from the source's processes, memory and files, the source too; the copies
/// of its checkpoint on disk at once are bounded by the room the key's snapshot quota leaves.
/// Any other source is forked with its files only: a snapshot held for this request only
/// (bounded by the key's snapshot bytes, not stored) restored into each fork. The answer's
/// `x-aegis-fork-kept` header (`memory` or `filesystem`), the audit row and the logs say which.
pub async fn fork(
    State(state): State<AppState>,
    WriteKey(caller): WriteKey,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: SandboxForkRequest = parse_optional_body(&body, MAX_BODY).map_err(Refusal)?;
    let count = req.count().map_err(Refusal)?;
    let timeout = checked_timeout(req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS))?;
    let row = row_for(&state, &caller, &id, FORK, Held::Running).await?;
    let uuid = row.sandbox_id;
    let asked = json!({"sandboxID": uuid, "count": count});
    let permit = acting(&state, &caller, &row, FORK, &asked).await?;
    match forked(&state, &permit, &caller, &row, count, timeout).await {
        // A fork that started: its audit row, the source's log line (`details` and the forks'
        // ids), and 201 saying what the forks kept.
        Ok(mut done) => {
            permit
                .finish(
                    &json!({"sandboxID": uuid, "count": count, "forks": done.forks, "kept": done.kept}),
                    !done.forks.is_empty(),
                )
                .await
                .map_err(db)?;
            let ids: Vec<String> = done.forks.iter().map(Uuid::to_string).collect();
            done.details["forks"] = json!(ids.join(","));
            store::log(&state.pool, uuid, "info", done.message, done.details).await;
            Ok(kept_header(
                to_json(StatusCode::CREATED, &done.results),
                done.kept,
            ))
        }
        // A fork that started nothing: its refusal's audit row, saying which kind it tried.
        Err((kept, refused)) => {
            permit
                .finish(
                    &json!({"sandboxID": uuid, "count": count, "started": 0, "kept": kept}),
                    false,
                )
                .await
                .map_err(db)?;
            Err(refused)
        }
    }
}

/// The audit action of a fork.
const FORK: &str = "e2b.sandbox.fork";

/// A fork that started, for its row, its log line and its answer.
struct Forked {
    /// `memory` or `filesystem`.
    kept: &'static str,
    results: Vec<SandboxForkResult>,
    forks: Vec<Uuid>,
    message: &'static str,
    details: serde_json::Value,
}

/// Forks the sandbox of `permit` (`row`) `count` times: with its memory when its class and
/// engine can, else with its files. A fork that started nothing is what it tried and why.
async fn forked(
    state: &AppState,
    permit: &Permit<'_>,
    caller: &Caller,
    row: &Row,
    count: u32,
    timeout: u32,
) -> Result<Forked, (&'static str, Refusal)> {
    let mut files_why = None;
    // Each fork has its source's network rules (its own copy, changed apart from then on).
    let of = Forks {
        state,
        caller,
        source: row,
        timeout,
        network: super::networked(state, caller, row),
    };
    if checkpointable(permit).await.map_err(|e| ("memory", e))? {
        match fork_with_memory(&of, permit, count).await {
            Ok(MemoryFork::Done { results, forks }) => {
                return Ok(Forked {
                    kept: "memory",
                    results,
                    forks,
                    message: "sandbox forked with its memory: each fork runs on from its processes, memory and files",
                    details: json!({}),
                });
            }
            // The engine cannot: the files are forked, and the log says why.
            Ok(MemoryFork::FilesOnly(why)) => files_why = Some(why),
            Err(e) => return Err(("memory", e)),
        }
    }
    let (archive, runtime) = snapshots::capture(permit, Quota::of(state).bytes)
        .await
        .map_err(|e| ("filesystem", refusal(e)))?;
    let mut results = Vec::new();
    let mut forks = Vec::new();
    for _ in 0..count {
        let outcome = of.start_restored(&runtime, &archive).await;
        tally(state, outcome, &mut results, &mut forks);
    }
    Ok(Forked {
        kept: "filesystem",
        results,
        forks,
        message: "sandbox forked (files only)",
        details: match files_why {
            None => json!({}),
            Some(why) => json!({"files_only_because": why}),
        },
    })
}

/// `response` with the `x-aegis-fork-kept` header saying what a fork kept.
fn kept_header(mut response: Response, kept: &'static str) -> Response {
    response.headers_mut().insert(
        "x-aegis-fork-kept",
        axum::http::HeaderValue::from_static(kept),
    );
    response
}

/// What a fork with memory came to.
enum MemoryFork {
    /// Forked: one result per fork asked for, and the forks that started.
    Done {
        results: Vec<SandboxForkResult>,
        forks: Vec<Uuid>,
    },
    /// The engine cannot checkpoint (why): nothing was done, the files are forked instead.
    FilesOnly(String),
}

/// Forks the gVisor sandbox of `source` with its memory (`Sandboxes::fork_with_memory`) and
/// writes each fork's row, as a files-only fork's; a fork whose row cannot be written is
/// destroyed and reported failed.
async fn fork_with_memory(
    of: &Forks<'_>,
    permit: &Permit<'_>,
    count: u32,
) -> Result<MemoryFork, Refusal> {
    let (state, source) = (of.state, of.source);
    let room = snapshots::room(&state.pool, &source.owner_key_id, Quota::of(state))
        .await
        .map_err(refusal)?;
    // The source's row is held as a pause holds it while its sandbox is checkpointed for the
    // copy: the timeout sweep would take the row of a sandbox not running for one gone, and a
    // pause or resume waits for the fork.
    let mut tx = state.pool.begin().await.map_err(db)?;
    if !store::lock_for_pause(&mut tx, source.sandbox_id, false)
        .await
        .map_err(db)?
    {
        return Err(Refusal(ApiError::new(
            409,
            format!("sandbox \"{}\" is paused", source.sandbox_id),
        )));
    }
    let forked = match permit.fork_with_memory(count as usize, room).await {
        Ok(forked) => forked,
        Err(aegis_sandboxes::SandboxError::Dispatch(
            e @ dispatcher::DispatchError::CheckpointUnavailable { .. },
        )) => return Ok(MemoryFork::FilesOnly(e.to_string())),
        Err(e) => return Err(Refusal(checkpoint_error(e, room))),
    };
    tx.rollback().await.map_err(db)?;
    let mut results = Vec::new();
    let mut forks = Vec::new();
    for id in forked.forks {
        let details = json!({"source": source.sandbox_id.to_string(),
                             "memory_bytes": forked.memory_bytes.to_string()});
        let outcome = of
            .row(
                id,
                "sandbox forked from another with its memory: its processes run on from the source's state",
                details,
            )
            .await;
        tally(state, outcome, &mut results, &mut forks);
    }
    for why in forked.failed {
        results.push(SandboxForkResult::failed(ApiError::new(
            503,
            format!("the fork did not start: {why}"),
        )));
    }
    Ok(MemoryFork::Done { results, forks })
}

/// One fork's outcome in the answer: a started fork's sandbox (and its id in `forks`, for the
/// audit row), or the refusal that kept it from starting.
fn tally(
    state: &AppState,
    outcome: Result<Row, Refusal>,
    results: &mut Vec<SandboxForkResult>,
    forks: &mut Vec<Uuid>,
) {
    match outcome {
        Ok(row) => {
            forks.push(row.sandbox_id);
            results.push(SandboxForkResult::started(created_answer(
                &row,
                &state.config.e2b.domain,
            )));
        }
        Err(Refusal(e)) => results.push(SandboxForkResult::failed(e)),
    }
}

/// What the forks of one request share: who asks, the source's row, the forks' timeout, and
/// whether they keep the source's network rules.
struct Forks<'a> {
    state: &'a AppState,
    caller: &'a Caller,
    source: &'a Row,
    timeout: u32,
    network: bool,
}

impl Forks<'_> {
    /// A files-only fork: a new sandbox of `runtime` with the source's files (`archive`).
    async fn start_restored(&self, runtime: &str, archive: &[u8]) -> Result<Row, Refusal> {
        let (state, caller, source) = (self.state, self.caller, self.source);
        let env = &source.env_vars.0;
        let (id, restored) =
            start_restored(state, caller, runtime, archive, env, self.network).await?;
        let details = json!({"source": source.sandbox_id.to_string(), "written": restored.written.to_string(),
                             "left_out": restored.left_out.to_string()});
        self.row(
            id,
            "sandbox forked from another (files only, no process)",
            details,
        )
        .await
    }

    /// Writes the E2B row of fork `id` (its own token, the source's metadata, template,
    /// lifecycle and, when `network`, its network rules) and its first log line; destroys the
    /// fork when the row cannot be written.
    async fn row(
        &self,
        id: SandboxId,
        message: &str,
        details: serde_json::Value,
    ) -> Result<Row, Refusal> {
        let (state, caller, source) = (self.state, self.caller, self.source);
        let inserted = match new_token() {
            Ok(token) => store::insert(
                &state.pool,
                &store::NewRow {
                    sandbox_id: id.0,
                    tenant: &caller.tenant,
                    owner_key_id: &caller.id,
                    template_id: &source.template_id,
                    metadata: &source.metadata.0,
                    env_vars: &source.env_vars.0,
                    allow_internet_access: source.allow_internet_access,
                    envd_access_token: &token,
                    timeout_secs: self.timeout,
                    pause_on_timeout: source.pause_on_timeout,
                    pause_keeps_memory: source.pause_keeps_memory,
                    auto_resume: source.auto_resume,
                    mask_request_host: source.mask_request_host.as_deref(),
                    egress: source
                        .egress
                        .as_ref()
                        .filter(|_| self.network)
                        .map(|e| &e.0),
                },
            )
            .await
            .map_err(db),
            Err(e) => Err(e),
        };
        match inserted {
            Ok(row) => {
                store::log(&state.pool, row.sandbox_id, "info", message, details).await;
                Ok(row)
            }
            Err(e) => {
                let _ =
                    control::discard(state, caller, id, "its fork row could not be written").await;
                Err(e)
            }
        }
    }
}
