//! Intents: the audit row that exists before a tool runs, completed whatever the caller does.
//!
//! When a call has passed every check, the router writes an intent row (outcome `running`) and
//! only then runs the handler; when the handler ends, a completion row names the intent and
//! carries the outcome, reason and result digest. Both rows are in the hash chain, so neither can
//! be dropped or edited unseen.
//!
//! The two writes run on the caller's task but never stop half way: axum drops a handler's
//! future when its client disconnects (and an execution's loop is dropped when it is
//! cancelled), which would otherwise leave the intent open. A write whose caller went away ends
//! in a task of its own (`group_commit::Finish`), and an intent whose handle is dropped before
//! its completion is completed `cancelled`, with the reason (`client_disconnected` or
//! `execution_ended`), from a task spawned then. Dropping the handler also drops its
//! dispatcher call, which cancels a running command in the sandbox. An intent left open because
//! the whole orchestrator stopped is completed `abandoned` at the next start.

use std::sync::Arc;
use std::time::Instant;

use sqlx::PgPool;
use uuid::Uuid;

use super::{append, Entry, EntryKind};
use crate::group_commit::Finish;
use aegis_core::caller::{Caller, CallerKind, Tier};

/// How a call that ran ended, for its completion row.
#[derive(Debug, Clone)]
pub struct Completion {
    /// `ok`, `error`, `cancelled`, `abandoned`.
    pub outcome: &'static str,
    /// Machine-readable reason of a failure.
    pub reason_code: Option<String>,
    /// Human-readable reason.
    pub reason: Option<String>,
    /// Digest of the result, when there was one.
    pub result_digest: Option<String>,
}

impl Completion {
    /// The completion of a call whose caller went away before the tool finished.
    fn caller_gone(caller: &Caller) -> Self {
        let (code, reason) = match caller.kind {
            CallerKind::Execution => (
                "execution_ended",
                "the execution ended (cancelled or timed out) before the tool finished; a running \
                 command was cancelled",
            ),
            _ => (
                "client_disconnected",
                "the client disconnected before the tool finished; a running command was cancelled",
            ),
        };
        Self {
            outcome: "cancelled",
            reason_code: Some(code.to_owned()),
            reason: Some(reason.to_owned()),
            result_digest: None,
        }
    }
}

/// An open intent: complete it with [`CallAudit::complete`]; dropping it completes it as
/// `cancelled`.
pub struct CallAudit {
    intent: Uuid,
    /// `None` once completed.
    call: Option<Arc<Call>>,
}

/// What both rows of one call say about it.
struct Call {
    intent: Uuid,
    pool: PgPool,
    caller: Caller,
    instance: Uuid,
    action: String,
    args_digest: String,
    sandbox: Option<Uuid>,
    started: Instant,
}

impl Call {
    fn entry(&self, outcome: &'static str, c: Option<Completion>) -> Entry {
        Entry {
            kind: EntryKind::Tool,
            action: self.action.clone(),
            allowed: true,
            reason_code: c.as_ref().and_then(|c| c.reason_code.clone()),
            reason: c.as_ref().and_then(|c| c.reason.clone()),
            args_digest: self.args_digest.clone(),
            outcome,
            result_digest: c.and_then(|c| c.result_digest),
            duration_ms: self.started.elapsed().as_millis() as i64,
            sandbox_id: self.sandbox,
        }
    }

    async fn write_intent(&self) -> Result<(), sqlx::Error> {
        let entry = self.entry("running", None);
        append(
            &self.pool,
            &self.caller,
            entry,
            self.intent,
            None,
            Some(self.instance),
        )
        .await
        .map(|_| ())
    }

    async fn write_completion(&self, completion: Completion) -> Result<(), sqlx::Error> {
        let entry = self.entry(completion.outcome, Some(completion));
        let written = append(
            &self.pool,
            &self.caller,
            entry,
            Uuid::new_v4(),
            Some(self.intent),
            Some(self.instance),
        )
        .await;
        if let Err(e) = &written {
            tracing::error!(intent = %self.intent, error = %e, "could not write the completion of an audited call");
        }
        written.map(|_| ())
    }

    /// Completes the intent as `cancelled` from a task of its own: the caller went away.
    fn cancel(self: Arc<Self>) {
        let completion = Completion::caller_gone(&self.caller);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = self.write_completion(completion).await;
                });
            }
            Err(_) => tracing::error!(
                intent = %self.intent,
                "an audited call's caller went away while the runtime stopped; its intent is \
                 completed `abandoned` at the next start"
            ),
        }
    }
}

impl CallAudit {
    /// The intent row's id.
    pub fn intent_id(&self) -> Uuid {
        self.intent
    }

    /// Writes the completion row; an error means the row could not be written. Once begun, the
    /// row is written even if this future is dropped.
    pub async fn complete(mut self, completion: Completion) -> Result<(), sqlx::Error> {
        let Some(call) = self.call.take() else {
            return Err(sqlx::Error::Protocol(
                "the call was completed already".into(),
            ));
        };
        Finish::new(async move { call.write_completion(completion).await }).await
    }
}

impl Drop for CallAudit {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            call.cancel();
        }
    }
}

/// Writes the intent row of a call about to run and returns the handle that completes it.
/// Returns only once the intent is stored; the tool must not run before. If this future is
/// dropped while the intent is being written, the intent is still stored and then completed
/// `cancelled` (its tool never ran).
///
/// Both rows are written from the caller's own task (through the chain's group commit), not
/// from a task per call: that was two hops between tasks per row.
pub async fn begin_call(
    pool: &PgPool,
    caller: &Caller,
    instance: Uuid,
    action: &str,
    args_digest: &str,
    sandbox: Option<Uuid>,
    started: Instant,
) -> Result<CallAudit, sqlx::Error> {
    let call = Arc::new(Call {
        intent: Uuid::new_v4(),
        pool: pool.clone(),
        caller: caller.clone(),
        instance,
        action: action.to_owned(),
        args_digest: args_digest.to_owned(),
        sandbox,
        started,
    });
    let writing = Arc::clone(&call);
    let abandoned = Arc::clone(&call);
    Finish::new(async move { writing.write_intent().await })
        .if_abandoned(move |began| async move {
            if began.is_ok() {
                abandoned.cancel();
            }
        })
        .await?;
    Ok(CallAudit {
        intent: call.intent,
        call: Some(call),
    })
}

/// An intent without a completion: id, tenant, caller kind and id, action, args digest, time,
/// sandbox.
type OpenIntent = (
    Uuid,
    String,
    String,
    String,
    String,
    String,
    chrono::DateTime<chrono::Utc>,
    Option<Uuid>,
);

fn caller_kind(s: &str) -> CallerKind {
    match s {
        "api_key" => CallerKind::ApiKey,
        "session" => CallerKind::Session,
        "execution" => CallerKind::Execution,
        _ => CallerKind::System,
    }
}

/// At start-up: completes, as `abandoned`, the intents of instances that stopped or fell silent
/// for `dead_after_secs` (their tool may or may not have finished; nobody recorded it).
pub async fn recover_abandoned(
    pool: &PgPool,
    current: Uuid,
    dead_after_secs: i64,
) -> Result<usize, sqlx::Error> {
    let open: Vec<OpenIntent> = sqlx::query_as(
        "SELECT a.id, a.tenant_id, a.caller_kind, a.caller_id, a.action, a.args_digest, a.at, \
             a.sandbox_id \
             FROM audit_log a WHERE a.outcome = 'running' AND a.intent_id IS NULL \
             AND NOT EXISTS (SELECT 1 FROM audit_log c WHERE c.intent_id = a.id) \
             AND (a.instance_id IS NULL OR (a.instance_id <> $1 AND NOT EXISTS ( \
               SELECT 1 FROM node_instances n WHERE n.id = a.instance_id AND n.stopped_at IS NULL \
               AND n.heartbeat_at > now() - make_interval(secs => $2)))) ORDER BY a.seq",
    )
    .bind(current)
    .bind(dead_after_secs as f64)
    .fetch_all(pool)
    .await?;
    let mut completed = 0;
    for (intent, tenant, kind, id, action, args_digest, at, sandbox_id) in open {
        let caller = Caller {
            kind: caller_kind(&kind),
            id: id.clone(),
            label: id,
            tier: Tier::User,
            role: None,
            tenant,
            seal: None,
        };
        let entry = Entry {
            kind: EntryKind::Tool,
            action,
            allowed: true,
            reason_code: Some("orchestrator_stopped".into()),
            reason: Some(
                "the orchestrator instance running this call stopped before recording its end"
                    .into(),
            ),
            args_digest,
            outcome: "abandoned",
            result_digest: None,
            duration_ms: (chrono::Utc::now() - at).num_milliseconds().max(0),
            sandbox_id,
        };
        match append(
            pool,
            &caller,
            entry,
            Uuid::new_v4(),
            Some(intent),
            Some(current),
        )
        .await
        {
            Ok(_) => completed += 1,
            // Another replica completed it first (unique completion per intent).
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(completed)
}
