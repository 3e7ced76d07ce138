//! Human approval of privileged tool calls.
//!
//! A security-context capability may set `require_approval: true` (the privileged tier of the
//! owlette reference: "pause for confirmation first"). A call granted by such a capability does
//! not run at once: [`await_approval`] stores a pending request in PostgreSQL (durable, visible to
//! every replica), audits it, and waits, bounded by the capability's `approval_timeout_secs` or
//! the node's `seal.approval_timeout_secs`, for an operator to approve or reject it through
//! `POST /v1/approvals/{id}/approve|reject` or `orchestrator approvals approve|reject`. Approved,
//! the call continues through the router; rejected or timed out, it is refused (SEAL 2001, like a
//! deny-list entry) and the router audits the refusal. Every step leaves an audit row: the
//! request (by the caller), the decision (by the operator) or the timeout (by the orchestrator).
//!
//! The waiter polls the row (every [`POLL_INTERVAL`]), so a decision taken on any replica is
//! seen. A pending request whose deadline passed is `timed_out` for everyone, even if its waiter
//! died, and can no longer be approved. The arguments are kept only while the request is pending
//! (the operator must see what they approve; read-only keys never do) and erased with the
//! decision.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::audit::{self, Entry, EntryKind};
use aegis_core::caller::Caller;
use aegis_policy::Denial;
use aegis_seal::error::SealCode;

/// How often a waiting call looks for a decision.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// An approval request as operators see it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Approval {
    /// Request id.
    pub id: Uuid,
    /// The tool the caller wants to run.
    pub tool: String,
    /// Its arguments while pending (erased once decided; hidden from read-only keys).
    pub arguments: Option<Value>,
    /// SHA-256 of the arguments (as in the audit log).
    pub args_digest: String,
    /// `session`, `execution`, ...
    pub caller_kind: String,
    /// Session or execution id.
    pub caller_id: String,
    /// The caller's label (context or agent name).
    pub caller_label: String,
    /// The security context that asks for approval.
    pub security_context: Option<String>,
    /// `pending`, `approved`, `rejected` or `timed_out`.
    pub status: String,
    /// When the call asked.
    pub created_at: DateTime<Utc>,
    /// When it stops waiting.
    pub expires_at: DateTime<Utc>,
    /// When decided.
    pub decided_at: Option<DateTime<Utc>>,
    /// The API key that decided.
    pub decided_by: Option<String>,
    /// The operator's note.
    pub decision_note: Option<String>,
}

impl Approval {
    /// The status as of `now`: a pending request past its deadline is `timed_out`.
    pub fn state(&self, now: DateTime<Utc>) -> &str {
        if self.status == "pending" && self.expires_at <= now {
            "timed_out"
        } else {
            &self.status
        }
    }
}

const COLUMNS: &str = "id, tool, arguments, args_digest, caller_kind, caller_id, caller_label, \
    security_context, status, created_at, expires_at, decided_at, decided_by, decision_note";

/// Why an operator's decision could not be recorded.
#[derive(Debug, thiserror::Error)]
pub enum DecisionError {
    /// No such request.
    #[error("no approval request {0}")]
    NotFound(Uuid),
    /// Already decided, or timed out.
    #[error("approval request {id} is already {state}; nothing was changed")]
    Closed {
        /// The request.
        id: Uuid,
        /// Its state.
        state: String,
    },
    /// The decider is the principal whose call waits: approval needs someone else.
    #[error(
        "approval request {id} is for a call made by this same caller ({kind} {caller}); \
         another operator must decide it"
    )]
    OwnCall {
        /// The request.
        id: Uuid,
        /// The caller kind of the waiting call.
        kind: String,
        /// The caller id of the waiting call (and of the decider).
        caller: String,
    },
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// An operator's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Let the call run.
    Approve,
    /// Refuse it.
    Reject,
}

impl Decision {
    /// The status it records.
    pub fn status(self) -> &'static str {
        match self {
            Decision::Approve => "approved",
            Decision::Reject => "rejected",
        }
    }
}

/// Requests, newest first; `pending_only` keeps those still waiting.
pub async fn list(
    pool: &PgPool,
    tenant: &str,
    pending_only: bool,
) -> Result<Vec<Approval>, sqlx::Error> {
    let pending = pending_only.then_some("pending");
    crate::database::tenant_rows(pool, "tool_approvals", COLUMNS, tenant, pending).await
}

/// One request.
pub async fn get(pool: &PgPool, tenant: &str, id: Uuid) -> Result<Option<Approval>, sqlx::Error> {
    crate::database::tenant_row(pool, "tool_approvals", COLUMNS, tenant, id).await
}

/// Records an operator's decision on a pending request that has not timed out (atomically: a
/// decision and a timeout can never both win). The arguments are erased. The principal whose
/// call waits can never decide it (same caller kind and id): a privileged call needs a second
/// person, whatever role the caller's key has.
pub async fn decide(
    pool: &PgPool,
    tenant: &str,
    id: Uuid,
    decision: Decision,
    decider: &Caller,
    note: Option<&str>,
) -> Result<Approval, DecisionError> {
    let updated: Option<Approval> = sqlx::query_as(&format!(
        "UPDATE tool_approvals SET status = $3, decided_at = now(), decided_by = $4, \
         decision_note = $5, arguments = NULL \
         WHERE tenant_id = $1 AND id = $2 AND status = 'pending' AND expires_at > now() \
         AND NOT (caller_kind = $6 AND caller_id = $4) \
         RETURNING {COLUMNS}"
    ))
    .bind(tenant)
    .bind(id)
    .bind(decision.status())
    .bind(&decider.id)
    .bind(note)
    .bind(decider.kind.as_str())
    .fetch_optional(pool)
    .await?;
    if let Some(a) = updated {
        return Ok(a);
    }
    match get(pool, tenant, id).await? {
        None => Err(DecisionError::NotFound(id)),
        Some(a) if a.caller_kind == decider.kind.as_str() && a.caller_id == decider.id => {
            Err(DecisionError::OwnCall {
                id,
                kind: a.caller_kind,
                caller: a.caller_id,
            })
        }
        Some(a) => Err(DecisionError::Closed {
            id,
            state: a.state(Utc::now()).to_owned(),
        }),
    }
}

fn refusal(code: &'static str, message: String) -> Denial {
    Denial {
        code,
        message,
        seal_code: Some(SealCode::ToolDenied.as_u32()),
        retry_after_secs: None,
    }
}

/// The router's approval step: when the caller's security context makes `tool` with `args` a
/// privileged call, waits for an operator's decision (see the module doc). `Ok` means the call
/// may run now; a `Denial` means it was rejected or timed out (the router audits it).
///
/// Takes the pool and `seal.approval_timeout_secs` (a rule without its own timeout waits that
/// long), not the application state.
pub async fn await_approval(
    pool: &sqlx::PgPool,
    default_timeout_secs: u64,
    caller: &Caller,
    tool: &str,
    args: &Value,
) -> Result<(), Denial> {
    let Some(scope) = &caller.seal else {
        return Ok(());
    };
    let Some(rule) = scope.context.approval_for(tool, args) else {
        return Ok(());
    };
    let started = Instant::now();
    let timeout = rule.timeout_secs.unwrap_or(default_timeout_secs).max(1);
    let pending = Pending {
        id: Uuid::new_v4(),
        tool,
        timeout,
        args_digest: audit::digest(args),
        started,
    };
    let deadline = pending
        .insert(pool, caller, &scope.context.name, args)
        .await
        .map_err(|e| unavailable(tool, e))?;
    audit::record(
        pool,
        caller,
        pending.entry(
            "approval.request",
            "pending",
            format!(
                "`{tool}` waits up to {timeout} s for an operator's approval (capability {} of \
                 security context `{}`)",
                rule.capability_index, scope.context.name
            ),
        ),
    )
    .await
    .map_err(|e| unavailable(tool, e))?;
    tracing::info!(approval = %pending.id, tool, caller = %caller.id, timeout_secs = timeout, "call waits for approval");
    pending.decision(pool, caller, deadline).await
}

/// The refusal when the approval cannot be requested or followed (a database failure).
fn unavailable(tool: &str, e: sqlx::Error) -> Denial {
    refusal(
        "approval_unavailable",
        format!("`{tool}` needs an operator's approval, which cannot be requested now: {e}"),
    )
}

/// One call waiting for approval: what its row and its audit entries are keyed by.
struct Pending<'a> {
    id: Uuid,
    tool: &'a str,
    timeout: u64,
    args_digest: String,
    started: Instant,
}

impl Pending<'_> {
    /// The request's row, the step that opens it to operators; gives when it expires.
    async fn insert(
        &self,
        pool: &sqlx::PgPool,
        caller: &Caller,
        context: &str,
        args: &Value,
    ) -> Result<DateTime<Utc>, sqlx::Error> {
        sqlx::query_scalar(
            "INSERT INTO tool_approvals (id, tenant_id, tool, arguments, args_digest, caller_kind, \
             caller_id, caller_label, security_context, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now() + make_interval(secs => $10)) \
             RETURNING expires_at",
        )
        .bind(self.id)
        .bind(&caller.tenant)
        .bind(self.tool)
        .bind(args)
        .bind(&self.args_digest)
        .bind(caller.kind.as_str())
        .bind(&caller.id)
        .bind(&caller.label)
        .bind(context)
        .bind(self.timeout as f64)
        .fetch_one(pool)
        .await
    }

    /// An audit entry of this approval's life (request, timeout), timed from the call's start.
    fn entry(&self, action: &str, outcome: &'static str, reason: String) -> Entry {
        Entry {
            kind: EntryKind::Admin,
            action: action.to_owned(),
            allowed: true,
            reason_code: Some(format!("approval:{}", self.id)),
            reason: Some(reason),
            args_digest: self.args_digest.clone(),
            outcome,
            result_digest: None,
            duration_ms: self.started.elapsed().as_millis() as i64,
            sandbox_id: None,
        }
    }

    /// Waiting is the last step: the row is read until an operator decides or `deadline`
    /// passes, when this call closes it as timed out (unless a decision won the race).
    async fn decision(
        &self,
        pool: &sqlx::PgPool,
        caller: &Caller,
        deadline: DateTime<Utc>,
    ) -> Result<(), Denial> {
        let (id, tool, timeout) = (self.id, self.tool, self.timeout);
        loop {
            let row = get(pool, &caller.tenant, id)
                .await
                .map_err(|e| unavailable(tool, e))?;
            let Some(row) = row else {
                return Err(refusal(
                    "approval_rejected",
                    format!("approval request {id} for `{tool}` disappeared"),
                ));
            };
            match row.status.as_str() {
                "approved" => return Ok(()),
                "rejected" => {
                    return Err(refusal(
                        "approval_rejected",
                        format!(
                            "an operator rejected this call of `{tool}` (approval {id}{})",
                            row.decision_note
                                .as_deref()
                                .map(|n| format!(": {n}"))
                                .unwrap_or_default()
                        ),
                    ))
                }
                "timed_out" => return Err(timed_out(tool, id, timeout)),
                _ => {}
            }
            if Utc::now() >= deadline {
                let closed = sqlx::query(
                    "UPDATE tool_approvals SET status = 'timed_out', arguments = NULL \
                     WHERE id = $1 AND status = 'pending'",
                )
                .bind(id)
                .execute(pool)
                .await
                .map_err(|e| unavailable(tool, e))?;
                if closed.rows_affected() == 1 {
                    audit::record(
                        pool,
                        &Caller::system(),
                        self.entry(
                            "approval.timeout",
                            "timed_out",
                            format!("no operator decided on `{tool}` within {timeout} s"),
                        ),
                    )
                    .await
                    .map_err(|e| unavailable(tool, e))?;
                    return Err(timed_out(tool, id, timeout));
                }
                // Decided at the last moment: read the decision on the next turn.
                continue;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

fn timed_out(tool: &str, id: Uuid, timeout: u64) -> Denial {
    refusal(
        "approval_timed_out",
        format!(
            "`{tool}` needs an operator's approval and none came within {timeout} s (approval \
             {id}); ask an operator, then call again"
        ),
    )
}
