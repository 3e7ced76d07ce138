//! The one path a sandbox's lifecycle takes, beside the tools' ([`super::router`]): create,
//! destroy, pause (a checkpoint), resume (a restore), fork and usage samples; and the handles a
//! door follows a sandbox by once a call was decided (a process, a watch, a port).
//!
//! A door never reaches the dispatcher for these. It asks [`admit`] for the sandbox it means;
//! the router decides with the one ownership rule (`aegis_policy::check_sandbox_access`, on the
//! owner the dispatcher recorded, never on anything the caller says), audits a refusal once
//! (the same denied row a tool call's refusal leaves), and hands back a [`Permit`]: the only
//! handle on that sandbox's lifecycle. [`Permit::finish`] writes the call's one admin row, so a
//! lifecycle call leaves one row whether it was refused, failed or done.
//!
//! Creation has no sandbox to decide on yet: [`create_for_e2b`] takes the owner from the
//! caller (a key's sandboxes are its own), which is the same rule seen from the other side.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use uuid::Uuid;

use crate::state::AppState;
use aegis_core::caller::Caller;
use aegis_policy::sandboxes::{check_sandbox_access, SandboxAccess};
use aegis_policy::{Denial, SandboxPolicy};
use aegis_sandboxes::SandboxError;
use aegis_store::audit::{self, Entry, EntryKind};
use dispatcher::{DispatchError, Owner, OwnerKind, SandboxId};

/// One lifecycle call on a live sandbox, as its audit row names it.
#[derive(Debug, Clone, Copy)]
pub struct Control<'a> {
    /// The audit action (`sandbox.destroy`, `e2b.sandbox.pause`, ...).
    pub action: &'a str,
    /// The sandbox it acts on.
    pub sandbox: SandboxId,
    /// What it does to the sandbox: decides who may.
    pub access: SandboxAccess,
    /// Its arguments, digested into the row.
    pub args: &'a Value,
}

/// Why [`admit`] gave no permit. `Unknown` and `Refused` are told alike to a caller ("not
/// found").
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// No live sandbox of that id on this node's dispatcher. No row is written: a door whose
    /// own record names a sandbox that is gone meanwhile finishes without it (a kill), and one
    /// that refuses records the refusal with [`refused`].
    #[error("sandbox {0} not found")]
    Unknown(SandboxId),
    /// The sandbox is another principal's; its denied row is written.
    #[error("{0}")]
    Refused(String),
    /// Sandboxes are unavailable, or the dispatcher failed while looking the owner up.
    #[error(transparent)]
    Sandbox(SandboxError),
    /// The refusal's row could not be written.
    #[error("audit: {0}")]
    Audit(#[from] sqlx::Error),
}

/// Decides `call` for `caller`: a [`Permit`] when the caller may, else one denied row and the
/// refusal.
pub async fn admit<'a>(
    state: &'a AppState,
    caller: &'a Caller,
    call: Control<'_>,
) -> Result<Permit<'a>, ControlError> {
    let started = Instant::now();
    let decided = decide(state, caller, call.sandbox, call.access)
        .await
        .map_err(|e| unknown_or(e, call.sandbox))?;
    if let Err(denial) = decided {
        refused(
            state,
            caller,
            call.action,
            call.args,
            Some(call.sandbox.0),
            denial.code,
            &denial.message,
        )
        .await?;
        return Err(ControlError::Refused(denial.message));
    }
    Ok(Permit {
        state,
        caller,
        action: call.action.to_owned(),
        sandbox: call.sandbox,
        started,
    })
}

/// The one ownership decision every call here makes: `check_sandbox_access` on the owner the
/// dispatcher recorded for `id`. The outer error is the owner's lookup (no such sandbox, no
/// dispatcher); the inner one the policy's refusal.
async fn decide(
    state: &AppState,
    caller: &Caller,
    id: SandboxId,
    access: SandboxAccess,
) -> Result<Result<(), Denial>, SandboxError> {
    let owner = state.sandboxes.owner(id).await?;
    Ok(check_sandbox_access(
        caller,
        &owner,
        access,
        &id.to_string(),
    ))
}

/// Another principal's sandbox as a handle is told of it: "not found", as the dispatcher says
/// of one that does not exist.
fn not_found(id: SandboxId) -> SandboxError {
    SandboxError::Dispatch(DispatchError::SandboxNotFound {
        id,
        attached_elsewhere: false,
    })
}

/// A dispatcher's "no such sandbox" as [`ControlError::Unknown`]; any other failure as it is.
fn unknown_or(e: SandboxError, id: SandboxId) -> ControlError {
    match e {
        SandboxError::Dispatch(
            DispatchError::SandboxNotFound { .. } | DispatchError::SandboxGone { .. },
        ) => ControlError::Unknown(id),
        other => ControlError::Sandbox(other),
    }
}

/// A lifecycle call a door refused before any sandbox was decided on (the key has no such
/// sandbox in the door's own records): the same denied row [`admit`] writes.
pub async fn refused(
    state: &AppState,
    caller: &Caller,
    action: &str,
    args: &Value,
    sandbox: Option<Uuid>,
    code: &str,
    reason: &str,
) -> Result<(), sqlx::Error> {
    let mut entry = Entry::denied(
        EntryKind::Admin,
        action,
        code,
        reason,
        audit::digest(args),
        std::time::Duration::ZERO,
    );
    entry.sandbox_id = sandbox;
    audit::record(&state.pool, caller, entry).await.map(|_| ())
}

/// The right to one lifecycle call on one sandbox, from [`admit`]; its steps run through it and
/// [`Permit::finish`] writes the call's row.
#[must_use = "a lifecycle call's row is written by Permit::finish"]
pub struct Permit<'a> {
    state: &'a AppState,
    caller: &'a Caller,
    action: String,
    sandbox: SandboxId,
    started: Instant,
}

impl Permit<'_> {
    /// The sandbox this permit is for.
    pub fn sandbox(&self) -> SandboxId {
        self.sandbox
    }

    /// The sandbox as the dispatcher records it (spec, labels, isolation).
    pub async fn info(&self) -> Result<dispatcher::SandboxInfo, SandboxError> {
        Ok(self.state.sandboxes.dispatcher()?.get(self.sandbox).await?)
    }

    /// Checkpoints the sandbox with its processes and memory (`Dispatcher::checkpoint`),
    /// refused past `max_bytes`.
    pub async fn checkpoint(
        &self,
        max_bytes: u64,
    ) -> Result<dispatcher::Checkpointed, SandboxError> {
        Ok(self
            .state
            .sandboxes
            .dispatcher()?
            .checkpoint(self.sandbox, max_bytes)
            .await?)
    }

    /// The directory `dir` of the sandbox as a tar archive of at most `max_bytes`, read with the
    /// sandbox frozen so it is the files at one moment (`Dispatcher::export_dir_frozen`).
    pub async fn export_dir_frozen(
        &self,
        dir: &str,
        max_bytes: u64,
    ) -> Result<(Vec<u8>, dispatcher::budget::Reservation), SandboxError> {
        Ok(self
            .state
            .sandboxes
            .dispatcher()?
            .export_dir_frozen(self.sandbox, dir, max_bytes)
            .await?)
    }

    /// Restores the checkpointed sandbox (`Dispatcher::restore`): it runs on where it was.
    pub async fn restore(&self) -> Result<(), SandboxError> {
        Ok(self
            .state
            .sandboxes
            .dispatcher()?
            .restore(self.sandbox)
            .await?)
    }

    /// Makes the sandbox unreachable now and removes it in the background (`Sandboxes::retire`).
    pub async fn retire(&self) -> Result<(), SandboxError> {
        self.state.sandboxes.retire(self.sandbox).await
    }

    /// Destroys the sandbox with its workspace before answering (`Sandboxes::destroy`).
    pub async fn destroy(&self) -> Result<(), SandboxError> {
        self.state.sandboxes.destroy(self.sandbox).await
    }

    /// Forks the sandbox with its processes and memory into `count` sandboxes, each counted
    /// against the caller's key quota (`Sandboxes::fork_with_memory`).
    pub async fn fork_with_memory(
        &self,
        count: usize,
        max_bytes: u64,
    ) -> Result<dispatcher::Forked, SandboxError> {
        self.state
            .sandboxes
            .fork_with_memory(
                &self.state.pool,
                &self.caller.id,
                self.sandbox,
                count,
                max_bytes,
            )
            .await
    }

    /// Writes the call's one admin row: its `args` as they ended (what a pause kept, say) and
    /// whether it did what was asked.
    pub async fn finish(self, args: &Value, ok: bool) -> Result<Uuid, sqlx::Error> {
        audit::record_admin_of(
            &self.state.pool,
            self.caller,
            &self.action,
            args,
            ok,
            self.started,
            Some(self.sandbox.0),
        )
        .await
    }
}

/// A usage sample of the caller's sandbox `id` (a read: no row); another's is [`ControlError::Refused`]
/// without a row, as a listing hides it.
pub async fn usage(
    state: &AppState,
    caller: &Caller,
    id: SandboxId,
) -> Result<dispatcher::Usage, ControlError> {
    decide(state, caller, id, SandboxAccess::See)
        .await
        .map_err(|e| unknown_or(e, id))?
        .map_err(|d| ControlError::Refused(d.message))?;
    let dispatcher = state
        .sandboxes
        .dispatcher()
        .map_err(ControlError::Sandbox)?;
    dispatcher
        .usage(id)
        .await
        .map_err(|e| unknown_or(e.into(), id))
}

/// The live sandboxes `caller` may see (its own, or every one for an unbound admin key), as
/// the dispatcher records them: the one rule a listing filters by.
pub async fn visible(
    state: &AppState,
    caller: &Caller,
) -> Result<Vec<dispatcher::SandboxInfo>, SandboxError> {
    let all = state.sandboxes.dispatcher()?.list().await?;
    Ok(all
        .into_iter()
        .filter(|info| {
            let owner = aegis_sandboxes::owner_of(info);
            check_sandbox_access(caller, &owner, SandboxAccess::See, "").is_ok()
        })
        .collect())
}

/// Creates a sandbox of the E2B template `runtime` owned by `caller`'s key (its SEAL context,
/// when it has one, bounds it), counted against the key's quota; with `network`, behind an
/// egress proxy of its own (`Sandboxes::create_for_e2b`).
pub async fn create_for_e2b(
    state: &AppState,
    caller: &Caller,
    runtime: &aegis_core::runtimes::Runtime,
    network: bool,
) -> Result<(SandboxId, Arc<SandboxPolicy>), SandboxError> {
    let owner = Owner::new(OwnerKind::Operator, caller.id.clone());
    let context = caller.seal.as_ref().map(|s| s.context.as_ref());
    state
        .sandboxes
        .create_for_e2b(&state.pool, runtime, context, owner, network)
        .await
}

/// Destroys a sandbox without a row of its own: one a door made for `caller` but could not
/// hand out (its restore or its template's server failed, another resume won), or one the
/// node's sweeps end as the system (whose own rows say what they did). Decided as any destroy;
/// a failure is logged with `why` and returned (the reaper removes what is left).
pub async fn discard(
    state: &AppState,
    caller: &Caller,
    id: SandboxId,
    why: &str,
) -> Result<(), SandboxError> {
    if let Err(denial) = decide(state, caller, id, SandboxAccess::Destroy).await? {
        tracing::error!(sandbox = %id, caller = %caller.id, why, code = denial.code, "a door asked to discard a sandbox that is not its caller's; refused");
        return Err(not_found(id));
    }
    let done = state.sandboxes.destroy(id).await;
    if let Err(e) = &done {
        tracing::warn!(sandbox = %id, error = %e, why, "a sandbox could not be destroyed yet; the reaper or the next sweep removes it");
    }
    done
}

/// The class a sandbox of `image` runs in on this node when it asks for none (whether a pause
/// can keep its memory); `None` when sandboxes are unavailable here.
pub fn isolation_of(state: &AppState, image: &str) -> Option<dispatcher::Isolation> {
    state
        .sandboxes
        .dispatcher()
        .ok()
        .map(|d| d.isolation_of(image))
}

// The handles a door follows a sandbox by, once the router decided the call that opened them
// (a `Connect` to a process the caller's `cmd.run` started, a watch after its `fs.list`, a
// port after its admission): checked against the same ownership rule, with no row of their
// own (the deciding call's row stands for them). Another's sandbox is "not found", as the
// dispatcher says of one that does not exist.

/// The dispatcher, once `caller` may act on `id`.
async fn dispatcher_for<'a>(
    state: &'a AppState,
    caller: &Caller,
    id: SandboxId,
) -> Result<&'a dispatcher::Dispatcher, SandboxError> {
    decide(state, caller, id, SandboxAccess::Act)
        .await?
        .map_err(|_| not_found(id))?;
    state.sandboxes.dispatcher()
}

/// A handle of its own on a live process of `caller`'s sandbox `id`, by pid or tag.
pub async fn attach_process(
    state: &AppState,
    caller: &Caller,
    id: SandboxId,
    select: dispatcher::ProcessSelector,
) -> Result<dispatcher::ProcessHandle, SandboxError> {
    Ok(dispatcher_for(state, caller, id)
        .await?
        .attach_process(id, select)
        .await?)
}

/// The live processes of `caller`'s sandbox `id`, as its executor knows them.
pub async fn list_processes(
    state: &AppState,
    caller: &Caller,
    id: SandboxId,
) -> Result<Vec<dispatcher::protocol::LiveProcess>, SandboxError> {
    Ok(dispatcher_for(state, caller, id)
        .await?
        .list_processes(id)
        .await?)
}

/// A watch of `path` in `caller`'s sandbox `id` (its `fs.list` already decided by the router).
pub async fn watch_dir(
    state: &AppState,
    caller: &Caller,
    id: SandboxId,
    path: &str,
    recursive: bool,
) -> Result<dispatcher::WatchHandle, SandboxError> {
    Ok(dispatcher_for(state, caller, id)
        .await?
        .watch_dir(id, path, recursive)
        .await?)
}

/// A connection to `port` of `caller`'s sandbox `id` (its request already admitted by the
/// port's rules), wherever the sandbox is held.
pub async fn open_port(
    state: &AppState,
    caller: &Caller,
    id: SandboxId,
    port: u16,
) -> Result<dispatcher::OpenedPort, SandboxError> {
    Ok(dispatcher_for(state, caller, id)
        .await?
        .open_port_anywhere(id, port)
        .await?)
}
