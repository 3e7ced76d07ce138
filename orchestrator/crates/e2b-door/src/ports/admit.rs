//! Whether a connection to a sandbox port may open, decided once per connection: the sandbox
//! must run here, the request must carry the sandbox's traffic access token when it is private,
//! and the policy must allow the owner key `sandbox.port` on it (`aegis_policy::check_tool`,
//! the decision every tool call gets: tier, the key's security context, its deny list,
//! capabilities and rate limit). An admitted or policy-refused connection leaves one audit row
//! as the owner key, with the sandbox; a request with a missing or wrong token is counted in
//! metrics and told nothing more, but leaves no row (anyone can send one: rows would let an
//! anonymous client flood the owner's chain).
//!
//! A paused sandbox answers as E2B's edge does: 409 "The sandbox is paused"; one made with
//! `autoResume` is woken instead, after its token and the policy admitted the request (so
//! traffic that may not reach it never wakes it), by `control::wake` as its owner key: the
//! resume `connect()` does, once per id however many requests arrive together, with its
//! `e2b.sandbox.resume` row beside the connection's own.
//!
//! A sandbox made through our own doors (REST, agents, SEAL) has no E2B row: its ports open
//! only with a preview secret ([`admit_preview`], `aegis_store::previews`), decided and audited
//! the same way as the key that made the preview. A missing, unknown, expired or revoked secret,
//! or one for another sandbox or port, is likewise counted and not a row; a request without a
//! secret to such a sandbox is 403 saying it needs one (an unknown sandbox stays E2B's 502).

use std::time::Instant;

use aegis_core::caller::Caller;
use aegis_store::audit::{self, Entry, EntryKind};
use aegis_tools::state::AppState;
use serde_json::json;

use super::address::PortAddress;
use crate::envd::{key_caller, owner, same_secret, SANDBOX_NOT_FOUND};
use crate::store;

/// The name the policy and the audit rows give a connection to a sandbox port.
pub const PORT_ACTION: &str = "sandbox.port";

/// A connection to a port of one's own sandbox is a user-tier action, like `cmd.run`; a bound
/// key's security context must grant it by this name, as any tool.
const PORT_TIER: aegis_core::caller::Tier = aegis_core::caller::Tier::User;

/// A connection that may open: where, as whom, and what a pooled request must still show.
#[derive(Clone)]
pub struct Admitted {
    /// The dispatcher's sandbox serving the E2B id.
    pub sandbox: dispatcher::SandboxId,
    /// The owner key, as which the connection is audited.
    pub caller: Caller,
    /// The private sandbox's token, which every request on the connection must carry.
    pub token: Option<String>,
    /// The preview that admitted it: every request on the connection must carry its secret,
    /// and it must still be live.
    pub preview: Option<Held>,
    /// The `Host` the server is shown instead of the client's (`network.maskRequestHost`,
    /// `${PORT}` already replaced).
    pub host: Option<String>,
}

/// The preview a connection was admitted under.
#[derive(Clone)]
pub struct Held {
    /// The preview's id (its liveness is asked again per request).
    pub id: uuid::Uuid,
    /// The SHA-256 of its secret.
    pub digest: Vec<u8>,
}

/// Why not (each answered as E2B's edge answers it, `mod.rs`).
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// No such sandbox, or not running now (killed, past a timeout that kills it).
    #[error("{SANDBOX_NOT_FOUND}: {0}")]
    NotRunning(String),
    /// Paused, and not made with `autoResume`: only a connect resumes it (E2B's edge: 409,
    /// `canAutoResume: false`).
    #[error("{SANDBOX_PAUSED}: {0}")]
    Paused(String),
    /// Paused with `autoResume`, and waking it failed (E2B's edge: 409, `canAutoResume: true`).
    #[error("{SANDBOX_PAUSED}: waking it failed: {0}")]
    Wake(String),
    /// A private sandbox, and the request's token is missing or another's.
    #[error("{0}")]
    Token(String),
    /// A preview secret that opens nothing here: unknown, expired, revoked, another sandbox's or
    /// port's, or its key is gone (counted, not audited).
    #[error("{0}")]
    Preview(String),
    /// The owner key's policy refuses it (audited).
    #[error("{0}")]
    Policy(String),
    /// The database failed.
    #[error("the node's database is unavailable")]
    Database(#[from] sqlx::Error),
}

/// E2B's edge's message for a paused sandbox.
pub const SANDBOX_PAUSED: &str = "The sandbox is paused";

/// Decides whether a connection to `to` may open for a request carrying `token`. A paused
/// sandbox made with `autoResume` is woken first, as its owner key, once the token and the
/// policy admitted the request: traffic that may not reach the port never wakes it.
pub async fn admit(
    state: &AppState,
    to: PortAddress,
    token: Option<&str>,
) -> Result<Admitted, Refused> {
    let started = Instant::now();
    let Some(row) = store::envd_target(&state.pool, to.sandbox).await? else {
        if aegis_store::previews::is_own_running(&state.pool, to.sandbox).await? {
            return Err(Refused::Preview(format!(
                "sandbox {id} is not an E2B sandbox: its ports open only with a preview URL \
                 its maker makes (POST /v1/sandboxes/{id}/previews)",
                id = to.sandbox
            )));
        }
        return Err(Refused::NotRunning(format!(
            "sandbox {} is not known",
            to.sandbox
        )));
    };
    let expected = aegis_store::e2b::traffic::token(&state.pool, to.sandbox).await?;
    if let Some(expected) = &expected {
        let given = token.unwrap_or_default();
        if given.is_empty() || !same_secret(expected, given) {
            return Err(Refused::Token(format!(
                "sandbox {} is private: its ports need its traffic access token in the \
                 e2b-traffic-access-token header",
                to.sandbox
            )));
        }
    }
    if !row.serving && !row.paused {
        return Err(Refused::NotRunning(format!(
            "sandbox {} is not running",
            to.sandbox
        )));
    }
    if !row.serving && !row.auto_resume {
        return Err(Refused::Paused(format!(
            "sandbox {} is paused; connect() resumes it (it was not made with autoResume)",
            to.sandbox
        )));
    }
    let caller = owner(state, &row)
        .await
        .map_err(|e| Refused::Policy(e.message))?;
    let wakes = !row.serving;
    let mut args = json!({"sandbox_id": to.sandbox.to_string(), "port": to.port});
    if wakes {
        args["wakes"] = json!(true);
    }
    decide(state, &caller, &args, row.sandbox_id, started).await?;
    let serving = if wakes {
        woken(state, &caller, to).await?
    } else {
        row.sandbox_id
    };
    Ok(Admitted {
        sandbox: dispatcher::SandboxId(serving),
        caller,
        token: expected,
        preview: None,
        host: row
            .mask_request_host
            .as_deref()
            .map(|mask| mask.replace("${PORT}", &to.port.to_string())),
    })
}

/// Wakes the paused sandbox `to` names as its owner (`control::wake`, what `connect()` does)
/// and answers the dispatcher's sandbox now serving it.
async fn woken(state: &AppState, owner: &Caller, to: PortAddress) -> Result<uuid::Uuid, Refused> {
    crate::control::wake(state, owner, to.sandbox)
        .await
        .map_err(|e| Refused::Wake(e.0.message))?;
    match store::envd_target(&state.pool, to.sandbox).await? {
        Some(row) if row.serving => Ok(row.sandbox_id),
        Some(_) => Err(Refused::Wake("it was paused again at once".to_owned())),
        None => Err(Refused::NotRunning(format!(
            "sandbox {} ended while it was woken",
            to.sandbox
        ))),
    }
}

/// Decides a connection admitted by a preview secret: the preview must name this sandbox and
/// port, be neither expired nor revoked, its sandbox running and its key usable; then the key's
/// policy decides `sandbox.port` as for any port connection, with one audit row.
pub async fn admit_preview(
    state: &AppState,
    to: PortAddress,
    secret: &str,
) -> Result<Admitted, Refused> {
    let started = Instant::now();
    let Some(p) = aegis_store::previews::by_secret(&state.pool, secret).await? else {
        return Err(Refused::Preview(
            "this preview URL opens nothing: it is not known (never made, or its sandbox ended)"
                .to_owned(),
        ));
    };
    if p.sandbox_id != to.sandbox || p.port != i32::from(to.port) {
        return Err(Refused::Preview(format!(
            "this preview URL is not for port {} of sandbox {}",
            to.port, to.sandbox
        )));
    }
    if !p.live {
        return Err(Refused::Preview(
            "this preview URL has expired or was revoked".to_owned(),
        ));
    }
    if !p.running {
        return Err(Refused::NotRunning(format!(
            "sandbox {} is not running",
            to.sandbox
        )));
    }
    if p.key_unusable {
        return Err(Refused::Preview(
            "the API key that made this preview URL was revoked or has expired".to_owned(),
        ));
    }
    let caller = key_caller(
        state,
        p.key_id,
        &p.key_name,
        &p.key_role,
        p.key_context.as_deref(),
    )
    .await
    .map_err(|(_, message)| Refused::Policy(message))?;
    let args = json!({"sandbox_id": to.sandbox.to_string(), "port": to.port, "preview_id": p.id});
    decide(state, &caller, &args, p.sandbox_id, started).await?;
    Ok(Admitted {
        sandbox: dispatcher::SandboxId(p.sandbox_id),
        caller,
        token: None,
        preview: Some(Held {
            id: p.id,
            digest: aegis_store::previews::digest(secret),
        }),
        host: None,
    })
}

/// The owner key's policy on `sandbox.port`, as a tool call's, and its one audit row.
async fn decide(
    state: &AppState,
    caller: &Caller,
    args: &serde_json::Value,
    sandbox_id: uuid::Uuid,
    started: Instant,
) -> Result<(), Refused> {
    let decision = aegis_policy::check_action(caller, PORT_ACTION, PORT_TIER, args);
    let (allowed, reason_code, reason) = match &decision {
        Ok(()) => (true, None, None),
        Err(d) => (false, Some(d.code.to_owned()), Some(d.message.clone())),
    };
    audit::record(
        &state.pool,
        caller,
        Entry {
            kind: EntryKind::Tool,
            action: PORT_ACTION.to_owned(),
            allowed,
            reason_code,
            reason,
            args_digest: audit::digest(args),
            outcome: if allowed { "ok" } else { "denied" },
            result_digest: None,
            duration_ms: i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX),
            sandbox_id: Some(sandbox_id),
        },
    )
    .await?;
    decision.map_err(|d| Refused::Policy(d.message))
}

/// Whether a request on a pooled connection still shows what its admission required.
pub fn still_admitted(admitted: &Admitted, token: Option<&str>, preview: Option<&str>) -> bool {
    if let Some(held) = &admitted.preview {
        return preview.is_some_and(|p| aegis_store::previews::digest(p) == held.digest);
    }
    match &admitted.token {
        None => true,
        Some(expected) => token.is_some_and(|t| !t.is_empty() && same_secret(expected, t)),
    }
}
