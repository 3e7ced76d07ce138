//! Executions and their event log in PostgreSQL.
//!
//! The event log is append-only and gap-free per execution: each append takes the execution row's
//! lock, so the sequence numbers follow the order in which things happened, whoever writes them
//! (the engine task, a cancel request, the start-up recovery).

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

/// An execution as stored and shown.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Execution {
    /// Execution id.
    pub id: Uuid,
    /// Agent (definition) id.
    pub agent_id: Uuid,
    /// Agent name.
    pub agent_name: String,
    /// Agent version run.
    pub agent_version: String,
    /// The judge's parent, for child executions.
    pub parent_execution_id: Option<Uuid>,
    /// `pending`, `running`, `completed`, `failed`, `cancelled`, `timed_out`.
    pub status: String,
    /// The caller's input.
    pub input: Value,
    /// The caller's intent.
    pub intent: Option<String>,
    /// Iterations started so far.
    pub iteration_count: i32,
    /// The final (or latest) answer.
    pub last_output: Option<String>,
    /// Why it failed.
    pub last_error: Option<String>,
    /// Its sandbox while it runs.
    pub sandbox_id: Option<Uuid>,
    /// When requested.
    pub created_at: DateTime<Utc>,
    /// When it started running.
    pub started_at: Option<DateTime<Utc>>,
    /// When it ended.
    pub ended_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, agent_id, agent_name, agent_version, parent_execution_id, status, input, \
     intent, iteration_count, last_output, last_error, sandbox_id, created_at, started_at, ended_at";

/// One event.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Event {
    /// Position in the execution's log (1-based, gap-free).
    pub seq: i64,
    /// `execution_started`, `iteration_started`, `llm_call`, `tool_call`, ...
    pub event_type: String,
    /// Details.
    pub payload: Value,
    /// When recorded.
    pub recorded_at: DateTime<Utc>,
}

/// True for statuses that never change again.
pub fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled" | "timed_out")
}

/// What a new execution row holds.
pub struct NewExecution<'a> {
    /// Id.
    pub id: Uuid,
    /// Tenant.
    pub tenant: &'a str,
    /// Agent id.
    pub agent_id: Uuid,
    /// Version row id.
    pub agent_version_id: Uuid,
    /// Agent name.
    pub agent_name: &'a str,
    /// Version.
    pub agent_version: &'a str,
    /// Parent execution.
    pub parent: Option<Uuid>,
    /// Input.
    pub input: &'a Value,
    /// Intent.
    pub intent: Option<&'a str>,
    /// Caller kind.
    pub caller_kind: &'a str,
    /// Caller id.
    pub caller_id: &'a str,
    /// Running instance.
    pub instance_id: Uuid,
    /// The workflow state that started it.
    pub workflow: Option<&'a super::WorkflowLink>,
}

/// Inserts a pending execution and its first event in one transaction.
pub async fn insert(pool: &PgPool, new: &NewExecution<'_>) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO executions (id, tenant_id, agent_id, agent_version_id, agent_name, agent_version, \
         parent_execution_id, input, intent, caller_kind, caller_id, instance_id, \
         workflow_execution_id, workflow_state, workflow_visit) \
         VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15)",
    )
    .bind(new.id)
    .bind(new.tenant)
    .bind(new.agent_id)
    .bind(new.agent_version_id)
    .bind(new.agent_name)
    .bind(new.agent_version)
    .bind(new.parent)
    .bind(new.input)
    .bind(new.intent)
    .bind(new.caller_kind)
    .bind(new.caller_id)
    .bind(new.instance_id)
    .bind(new.workflow.map(|w| w.execution_id))
    .bind(new.workflow.map(|w| w.state.as_str()))
    .bind(new.workflow.map(|w| w.visit))
    .execute(&mut *tx)
    .await?;
    sqlx::query("INSERT INTO execution_events (execution_id, seq, event_type, payload) VALUES ($1, 1, 'execution_requested', $2)")
        .bind(new.id)
        .bind(serde_json::json!({"agent": new.agent_name, "version": new.agent_version, "caller": new.caller_id}))
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// Appends an event (serialised per execution by the row lock).
pub async fn event(
    pool: &PgPool,
    id: Uuid,
    event_type: &str,
    payload: Value,
) -> Result<i64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT 1 FROM executions WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let seq: i64 = sqlx::query_scalar(
        "INSERT INTO execution_events (execution_id, seq, event_type, payload) \
         SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3 FROM execution_events WHERE execution_id = $1 RETURNING seq",
    )
    .bind(id)
    .bind(event_type)
    .bind(payload)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(seq)
}

/// Moves a non-terminal execution to `status`; false when it had already ended.
pub async fn transition(
    pool: &PgPool,
    id: Uuid,
    status: &str,
    output: Option<&str>,
    error: Option<&str>,
) -> Result<bool, sqlx::Error> {
    let ended = is_terminal(status);
    let done = sqlx::query(
        "UPDATE executions SET status = $2, last_output = COALESCE($3, last_output), \
         last_error = COALESCE($4, last_error), \
         started_at = CASE WHEN $2 = 'running' THEN now() ELSE started_at END, \
         ended_at = CASE WHEN $5 THEN now() ELSE ended_at END \
         WHERE id = $1 AND status NOT IN ('completed', 'failed', 'cancelled', 'timed_out')",
    )
    .bind(id)
    .bind(status)
    .bind(output)
    .bind(error)
    .bind(ended)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Records the iteration count and the sandbox.
pub async fn progress(
    pool: &PgPool,
    id: Uuid,
    iteration: i32,
    sandbox: Option<Uuid>,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE executions SET iteration_count = $2, sandbox_id = $3 WHERE id = $1")
        .bind(id)
        .bind(iteration)
        .bind(sandbox)
        .execute(pool)
        .await?;
    Ok(())
}

/// One execution.
pub async fn get(pool: &PgPool, tenant: &str, id: Uuid) -> Result<Option<Execution>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM executions WHERE tenant_id = $1 AND id = $2"
    ))
    .bind(tenant)
    .bind(id)
    .fetch_optional(pool)
    .await
}

/// Executions, newest first, optionally of one agent and/or status.
pub async fn list(
    pool: &PgPool,
    tenant: &str,
    agent: Option<Uuid>,
    status: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<Vec<Execution>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM executions WHERE tenant_id = $1 AND ($2::uuid IS NULL OR agent_id = $2) \
         AND ($3::text IS NULL OR status = $3) ORDER BY created_at DESC LIMIT $4 OFFSET $5"
    ))
    .bind(tenant)
    .bind(agent)
    .bind(status)
    .bind(limit.clamp(1, 500))
    .bind(offset.max(0))
    .fetch_all(pool)
    .await
}

/// Events after `after`, oldest first.
pub async fn events(
    pool: &PgPool,
    id: Uuid,
    after: i64,
    limit: i64,
) -> Result<Vec<Event>, sqlx::Error> {
    sqlx::query_as(
        "SELECT seq, event_type, payload, recorded_at FROM execution_events WHERE execution_id = $1 \
         AND seq > $2 ORDER BY seq LIMIT $3",
    )
    .bind(id)
    .bind(after)
    .bind(limit.clamp(1, 1000))
    .fetch_all(pool)
    .await
}

/// Number of events of an execution.
pub async fn event_count(pool: &PgPool, id: Uuid) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM execution_events WHERE execution_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
}

/// Deletes a terminal execution and its events; false when it is not terminal or unknown.
pub async fn remove(pool: &PgPool, tenant: &str, id: Uuid) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "DELETE FROM executions WHERE tenant_id = $1 AND id = $2 AND status IN ('completed', 'failed', 'cancelled', 'timed_out')",
    )
    .bind(tenant)
    .bind(id)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Fails the executions that were running on instances that stopped or fell silent for
/// `dead_after_secs`; returns their ids and sandboxes.
pub async fn fail_orphans(
    pool: &PgPool,
    current: Uuid,
    dead_after_secs: i64,
) -> Result<Vec<(Uuid, Option<Uuid>)>, sqlx::Error> {
    sqlx::query_as(
        "UPDATE executions e SET status = 'failed', last_error = 'orchestrator restarted', ended_at = now() \
         WHERE e.status IN ('pending', 'running') AND e.instance_id <> $1 AND NOT EXISTS ( \
           SELECT 1 FROM node_instances n WHERE n.id = e.instance_id AND n.stopped_at IS NULL \
           AND n.heartbeat_at > now() - make_interval(secs => $2)) RETURNING e.id, e.sandbox_id",
    )
    .bind(current)
    .bind(dead_after_secs as f64)
    .fetch_all(pool)
    .await
}
