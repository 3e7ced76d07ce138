//! Executions and their event log in PostgreSQL.
//!
//! The event log is append-only and gap-free per execution: each append takes the execution row's
//! lock, so the sequence numbers follow the order in which things happened, whoever writes them
//! (the engine task, a cancel request, the start-up recovery).

use aegis_policy::executions::ExecutionOwner;
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
    /// The revision of that version run (its exact registry row); `None` only for executions
    /// from before revisions whose version was overwritten after they started.
    pub agent_revision: Option<i32>,
    /// `sha256:` of the manifest run (`registry::manifest_digest`), recorded at start; `None` as
    /// `agent_revision`.
    pub manifest_digest: Option<String>,
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
    /// Kind of the caller that started it.
    pub caller_kind: String,
    /// Id of the caller that started it.
    pub caller_id: String,
    /// The API key or session at the root of its tree of executions (`kind:id`).
    pub principal: Option<String>,
    /// 0 for an execution a key or session started; its parent's depth + 1 for a child.
    pub depth: i32,
}

const COLUMNS: &str = "id, agent_id, agent_name, agent_version, agent_revision, manifest_digest, \
     parent_execution_id, status, input, \
     intent, iteration_count, last_output, last_error, sandbox_id, created_at, started_at, ended_at, \
     caller_kind, caller_id, principal, depth";

/// One event.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Event {
    /// Position in the execution's log (1-based, gap-free).
    pub seq: i64,
    /// `execution_started`, `iteration_started`, `llm_call`, `tool_call`, ...
    pub event_type: String,
    pub payload: Value,
    /// When recorded.
    pub recorded_at: DateTime<Utc>,
}

pub use crate::runs::is_terminal;

impl crate::runs::RunEvent for Event {
    fn seq(&self) -> i64 {
        self.seq
    }
}

/// What a new execution row holds.
pub struct NewExecution<'a> {
    pub id: Uuid,
    pub tenant: &'a str,
    /// Agent id.
    pub agent_id: Uuid,
    /// Version row id.
    pub agent_version_id: Uuid,
    /// Agent name.
    pub agent_name: &'a str,
    pub agent_version: &'a str,
    /// Parent execution.
    pub parent: Option<Uuid>,
    pub input: &'a Value,
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

/// The bounds a new execution must fit in (checked and inserted atomically).
#[derive(Debug, Clone)]
pub struct Bounds {
    /// Depth of the new execution.
    pub depth: i32,
    /// Its principal (`kind:id`).
    pub principal: String,
    /// Deepest allowed.
    pub max_depth: u32,
    /// Live executions allowed per principal.
    pub max_per_principal: u32,
    /// Live executions allowed on this instance.
    pub max_on_node: u32,
}

/// Why an execution was not stored.
#[derive(Debug, thiserror::Error)]
pub enum BoundError {
    /// Too deep a chain of child executions.
    #[error("execution depth {depth} exceeds the limit of {max} (executions.max_depth): a child execution may not start another this deep")]
    TooDeep {
        /// The depth asked for.
        depth: i32,
        /// The limit.
        max: u32,
    },
    /// Too many live executions.
    #[error("{live} executions are already pending or running {whose}; the limit is {max} ({key}); retry when one ends")]
    TooMany {
        /// Live count.
        live: i64,
        /// `for this caller` or `on this node`.
        whose: &'static str,
        /// The limit.
        max: u32,
        /// The config key.
        key: &'static str,
    },
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Advisory lock key serialising the bound checks of new executions ("execs" in ASCII).
const BOUNDS_LOCK: i64 = 0x0065_7865_6373;

/// Inserts a pending execution (with its workflow link, when a workflow state started it) and
/// its first event in one transaction, after checking `bounds` under a lock, so two concurrent
/// starts cannot both pass the last free slot.
pub async fn insert_bounded(
    pool: &PgPool,
    new: &NewExecution<'_>,
    bounds: &Bounds,
) -> Result<(), BoundError> {
    if bounds.depth > bounds.max_depth as i32 {
        return Err(BoundError::TooDeep {
            depth: bounds.depth,
            max: bounds.max_depth,
        });
    }
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(BOUNDS_LOCK)
        .execute(&mut *tx)
        .await?;
    let (mine, node): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE principal = $1), count(*) FILTER (WHERE instance_id = $2) \
         FROM executions WHERE status IN ('pending', 'running')",
    )
    .bind(&bounds.principal)
    .bind(new.instance_id)
    .fetch_one(&mut *tx)
    .await?;
    if mine >= i64::from(bounds.max_per_principal) {
        return Err(BoundError::TooMany {
            live: mine,
            whose: "for this caller",
            max: bounds.max_per_principal,
            key: "executions.max_concurrent_per_caller",
        });
    }
    if node >= i64::from(bounds.max_on_node) {
        return Err(BoundError::TooMany {
            live: node,
            whose: "on this node",
            max: bounds.max_on_node,
            key: "executions.max_concurrent",
        });
    }
    let inserted = sqlx::query(
        "INSERT INTO executions (id, tenant_id, agent_id, agent_version_id, agent_name, agent_version, \
         parent_execution_id, input, intent, caller_kind, caller_id, instance_id, depth, principal, \
         workflow_execution_id, workflow_state, workflow_visit, agent_revision, manifest_digest) \
         SELECT $1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17, v.revision, v.manifest_digest \
         FROM definition_versions v WHERE v.id = $4",
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
    .bind(bounds.depth)
    .bind(&bounds.principal)
    .bind(new.workflow.map(|w| w.execution_id))
    .bind(new.workflow.map(|w| w.state.as_str()))
    .bind(new.workflow.map(|w| w.visit))
    .execute(&mut *tx)
    .await?;
    // The revision and digest come from the very row the execution points at; no row, no run.
    if inserted.rows_affected() != 1 {
        return Err(sqlx::Error::RowNotFound.into());
    }
    sqlx::query("INSERT INTO execution_events (execution_id, seq, event_type, payload) VALUES ($1, 1, 'execution_requested', $2)")
        .bind(new.id)
        .bind(serde_json::json!({"agent": new.agent_name, "version": new.agent_version, "caller": new.caller_id, "depth": bounds.depth}))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// What scoping needs of one execution: its principal and lineage (itself first).
pub async fn scope(
    pool: &PgPool,
    tenant: &str,
    id: Uuid,
) -> Result<Option<aegis_policy::executions::ExecutionScope>, sqlx::Error> {
    let principal: Option<Option<String>> =
        sqlx::query_scalar("SELECT principal FROM executions WHERE tenant_id = $1 AND id = $2")
            .bind(tenant)
            .bind(id)
            .fetch_optional(pool)
            .await?;
    let Some(principal) = principal else {
        return Ok(None);
    };
    let lineage: Vec<(Uuid, String, String)> = sqlx::query_as(
        "WITH RECURSIVE chain (id, parent, caller_kind, caller_id, n) AS ( \
           SELECT id, parent_execution_id, caller_kind, caller_id, 0 FROM executions \
           WHERE tenant_id = $1 AND id = $2 \
           UNION ALL \
           SELECT e.id, e.parent_execution_id, e.caller_kind, e.caller_id, c.n + 1 \
           FROM executions e JOIN chain c ON e.id = c.parent WHERE c.n < 64) \
         SELECT id, caller_kind, caller_id FROM chain ORDER BY n",
    )
    .bind(tenant)
    .bind(id)
    .fetch_all(pool)
    .await?;
    Ok(Some(aegis_policy::executions::ExecutionScope {
        principal,
        lineage: lineage
            .into_iter()
            .map(|(id, caller_kind, caller_id)| ExecutionOwner {
                id,
                caller_kind,
                caller_id,
            })
            .collect(),
    }))
}

/// The principal of an execution (`kind:id` of the key or session at the root of its tree).
pub async fn principal_of(pool: &PgPool, id: Uuid) -> Result<Option<(String, i32)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT COALESCE(principal, caller_kind || ':' || caller_id), depth FROM executions WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
}

/// Which executions a listing shows: all (operators) or those a caller may act on.
#[derive(Debug, Clone)]
pub enum Visible {
    /// Every execution of the tenant.
    All,
    /// Those started by (`kind`, `id`), or whose principal is `principal`, and their descendants;
    /// for an execution caller also itself.
    Of {
        /// Caller kind.
        kind: String,
        /// Caller id.
        id: String,
        /// Principal key, for callers that are not executions.
        principal: Option<String>,
    },
}

impl Visible {
    /// The listing scope of `caller` (the same rule as `policy::executions::may_act_on`).
    pub fn of(caller: &aegis_core::caller::Caller) -> Self {
        use aegis_core::caller::{CallerKind, Tier};
        if caller.tier >= Tier::Operator {
            return Visible::All;
        }
        let kind = caller.kind.as_str().to_owned();
        let principal = (caller.kind != CallerKind::Execution)
            .then(|| aegis_policy::executions::principal_key(&kind, &caller.id));
        Visible::Of {
            kind,
            id: caller.id.clone(),
            principal,
        }
    }

    /// A SQL condition on the execution id `column`, with `$1` the tenant and `$2`..`$4` the
    /// parts of `self`.
    fn condition(column: &str) -> String {
        format!(
            "($2::text IS NULL OR {column} IN ( \
           WITH RECURSIVE mine (id) AS ( \
             SELECT id FROM executions WHERE tenant_id = $1 AND ( \
               (caller_kind = $2 AND caller_id = $3) OR principal = $4 \
               OR ($2 = 'execution' AND id::text = $3)) \
             UNION \
             SELECT e.id FROM executions e JOIN mine m ON e.parent_execution_id = m.id) \
           SELECT id FROM mine))"
        )
    }

    fn parts(&self) -> (Option<&str>, Option<&str>, Option<&str>) {
        match self {
            Visible::All => (None, None, None),
            Visible::Of {
                kind,
                id,
                principal,
            } => (Some(kind), Some(id), principal.as_deref()),
        }
    }
}

/// Executions `visible` shows, newest first, optionally of one agent and/or status.
pub async fn list_visible(
    pool: &PgPool,
    tenant: &str,
    visible: &Visible,
    agent: Option<Uuid>,
    status: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<Vec<Execution>, sqlx::Error> {
    let (kind, id, principal) = visible.parts();
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM executions WHERE tenant_id = $1 AND {} \
         AND ($5::uuid IS NULL OR agent_id = $5) AND ($6::text IS NULL OR status = $6) \
         ORDER BY created_at DESC LIMIT $7 OFFSET $8",
        Visible::condition("id")
    ))
    .bind(tenant)
    .bind(kind)
    .bind(id)
    .bind(principal)
    .bind(agent)
    .bind(status)
    .bind(limit.clamp(1, 500))
    .bind(offset.max(0))
    .fetch_all(pool)
    .await
}

/// Events of the executions of `agent` that `visible` shows, oldest first, and their total.
pub async fn agent_events(
    pool: &PgPool,
    tenant: &str,
    visible: &Visible,
    agent: Uuid,
    limit: i64,
    offset: i64,
) -> Result<(Vec<(Uuid, String, Value, DateTime<Utc>)>, i64), sqlx::Error> {
    let (kind, id, principal) = visible.parts();
    let scoped = format!(
        "FROM execution_events e JOIN executions x ON x.id = e.execution_id \
         WHERE x.tenant_id = $1 AND x.agent_id = $5 AND {}",
        Visible::condition("x.id")
    );
    let rows = sqlx::query_as(&format!(
        "SELECT e.execution_id, e.event_type, e.payload, e.recorded_at {scoped} \
         ORDER BY e.recorded_at, e.seq LIMIT $6 OFFSET $7"
    ))
    .bind(tenant)
    .bind(kind)
    .bind(id)
    .bind(principal)
    .bind(agent)
    .bind(limit.clamp(1, 500))
    .bind(offset.max(0))
    .fetch_all(pool)
    .await?;
    let total = sqlx::query_scalar(&format!("SELECT count(*) {scoped}"))
        .bind(tenant)
        .bind(kind)
        .bind(id)
        .bind(principal)
        .bind(agent)
        .fetch_one(pool)
        .await?;
    Ok((rows, total))
}

/// Appends an event (serialised per execution by the row lock).
pub async fn event(
    pool: &PgPool,
    id: Uuid,
    event_type: &str,
    payload: Value,
) -> Result<i64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let seq = event_in(&mut tx, id, event_type, payload).await?;
    tx.commit().await?;
    Ok(seq)
}

/// Appends an event inside the caller's transaction, so it commits with what it reports (the
/// end of an execution and its last event are seen together, never one without the other).
pub async fn event_in(
    tx: &mut sqlx::PgConnection,
    id: Uuid,
    event_type: &str,
    payload: Value,
) -> Result<i64, sqlx::Error> {
    sqlx::query("SELECT 1 FROM executions WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    sqlx::query_scalar(
        "INSERT INTO execution_events (execution_id, seq, event_type, payload) \
         SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3 FROM execution_events WHERE execution_id = $1 RETURNING seq",
    )
    .bind(id)
    .bind(event_type)
    .bind(payload)
    .fetch_one(&mut *tx)
    .await
}

/// Moves a non-terminal execution to `status`; false when it had already ended.
pub async fn transition<'e>(
    pool: impl sqlx::PgExecutor<'e>,
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
    aegis_store::database::tenant_row(pool, "executions", COLUMNS, tenant, id).await
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
    list_visible(pool, tenant, &Visible::All, agent, status, limit, offset).await
}

/// Fails the executions that were running on instances that stopped or fell silent for
/// `dead_after_secs`; returns their ids and sandboxes.
pub async fn fail_orphans<'e>(
    pool: impl sqlx::PgExecutor<'e>,
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
