//! Workflow executions and their event log in PostgreSQL.
//!
//! Three rules hold every write here together:
//! - an event's sequence number is taken from the execution row's `next_seq`, bumped in the same
//!   statement or transaction that inserts the event, so the log is gap-free and ordered;
//! - whatever a worker writes while it holds an execution is fenced by `lease_owner = me AND
//!   lease_epoch = mine` (every claim bumps the epoch): a worker that lost its lease (it
//!   stalled, another replica or another worker of its own took over) writes nothing;
//! - a state's output, the events that describe it and the next state are one transaction
//!   ([`commit`]), so a state is either committed with everything it implies or not at all.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

/// The channel run, signal, cancel and child completions notify; workers listen on it.
pub const CHANNEL: &str = "aegis_workflows";

/// A workflow execution as stored.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct WorkflowExecution {
    /// Execution id.
    pub id: Uuid,
    #[serde(skip)]
    pub tenant_id: String,
    /// Workflow (definition) id.
    pub workflow_id: Uuid,
    /// The version row run.
    #[serde(skip)]
    pub workflow_version_id: Uuid,
    /// Workflow name.
    pub workflow_name: String,
    /// Workflow version.
    pub workflow_version: String,
    /// The revision of that version run (its exact registry row); `None` only for executions
    /// from before revisions whose version was overwritten after they started.
    pub workflow_revision: Option<i32>,
    /// `sha256:` of the manifest run (`registry::manifest_digest`), recorded at start; `None` as
    /// `workflow_revision`.
    pub manifest_digest: Option<String>,
    /// For Subworkflow children: the parent execution.
    pub parent_execution_id: Option<Uuid>,
    /// For Subworkflow children: the parent's state.
    pub parent_state: Option<String>,
    /// For Subworkflow children: the visit of the parent's state.
    pub parent_visit: Option<i32>,
    /// `pending`, `running`, `waiting`, `completed`, `failed`, `cancelled`, `timed_out`.
    pub status: String,
    /// The state being run (or the last one, once ended).
    pub current_state: String,
    /// State name -> times entered.
    pub visits: Value,
    /// Transitions taken.
    pub transition_count: i32,
    /// Every state's output by state name, plus the run's context and input.
    pub blackboard: Value,
    /// The caller's input.
    pub input: Value,
    /// The caller's intent.
    pub intent: Option<String>,
    /// Who started it.
    pub caller_kind: String,
    /// Who started it.
    pub caller_id: String,
    /// The starter's rights (`{"tier", "contexts"}`), a ceiling on the agents its states start;
    /// `None` when no ceiling applies (see `workflow::ceiling`).
    #[serde(skip)]
    pub ceiling: Option<Value>,
    /// The replica holding it.
    pub lease_owner: Option<Uuid>,
    /// Until when.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Attempts at the current entry of the current state.
    pub attempt: i32,
    /// Claims so far: the epoch of the current lease, which every fenced write names.
    #[serde(skip)]
    pub lease_epoch: i64,
    /// Feedback of the transition that entered the current state.
    pub state_feedback: Option<String>,
    /// When the current state was entered.
    pub state_entered_at: DateTime<Utc>,
    /// While waiting: `human` or `subworkflow`.
    pub waiting_for: Option<String>,
    /// While waiting: when a timeout is due.
    pub wake_at: Option<DateTime<Utc>>,
    /// A Human answer not yet consumed.
    #[serde(skip)]
    pub signal: Option<String>,
    /// Cancellation was asked for.
    pub cancel_requested: bool,
    /// `output_template` rendered at the end.
    pub final_output: Option<Value>,
    /// Why it failed.
    pub error: Option<String>,
    /// Sequence number of the next event.
    #[serde(skip)]
    pub next_seq: i64,
    /// When requested.
    pub created_at: DateTime<Utc>,
    /// When a worker first took it.
    pub started_at: Option<DateTime<Utc>>,
    /// When the last transition was taken.
    pub last_transition_at: Option<DateTime<Utc>>,
    /// When it ended.
    pub ended_at: Option<DateTime<Utc>>,
    /// It times out past this.
    pub deadline: DateTime<Utc>,
}

const COLUMNS: &str = "id, tenant_id, workflow_id, workflow_version_id, workflow_name, workflow_version, \
    parent_execution_id, parent_state, parent_visit, status, current_state, visits, transition_count, \
    blackboard, input, intent, caller_kind, caller_id, ceiling, lease_owner, lease_expires_at, attempt, lease_epoch, \
    state_feedback, state_entered_at, waiting_for, wake_at, signal, cancel_requested, final_output, \
    error, next_seq, created_at, started_at, last_transition_at, ended_at, deadline, \
    workflow_revision, manifest_digest";

/// One event of the log.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Event {
    /// Position in the execution's log (1-based, gap-free).
    pub seq: i64,
    /// `state_entered`, `transition_taken`, `human_input_requested`, ...
    pub event_type: String,
    /// The state it concerns, if any.
    pub state_name: Option<String>,
    pub payload: Value,
    /// When recorded.
    pub recorded_at: DateTime<Utc>,
}

/// An event to append.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub event_type: &'static str,
    /// State, if any.
    pub state: Option<String>,
    pub payload: Value,
}

impl NewEvent {
    /// An event about `state`.
    pub fn state(event_type: &'static str, state: &str, payload: Value) -> Self {
        Self {
            event_type,
            state: Some(state.to_owned()),
            payload,
        }
    }
}

fn events_json(events: &[NewEvent]) -> Value {
    Value::Array(
        events
            .iter()
            .map(|e| json!({"t": e.event_type, "s": e.state, "p": e.payload}))
            .collect(),
    )
}

pub use crate::runs::is_terminal;

impl crate::runs::RunEvent for Event {
    fn seq(&self) -> i64 {
        self.seq
    }
}

/// A new execution row.
pub struct NewExecution<'a> {
    pub id: Uuid,
    pub tenant: &'a str,
    /// Definition id.
    pub workflow_id: Uuid,
    /// Version row id.
    pub workflow_version_id: Uuid,
    pub workflow_name: &'a str,
    pub workflow_version: &'a str,
    /// Parent (execution, state, visit) of a Subworkflow child.
    pub parent: Option<(Uuid, &'a str, i32)>,
    /// Initial state.
    pub initial_state: &'a str,
    /// Initial blackboard.
    pub blackboard: &'a Value,
    pub input: &'a Value,
    pub intent: Option<&'a str>,
    /// Caller kind.
    pub caller_kind: &'a str,
    /// Caller id.
    pub caller_id: &'a str,
    /// The starter's rights, a ceiling on the agents the states start.
    pub ceiling: Option<&'a Value>,
    /// Whole-execution ceiling, seconds.
    pub max_secs: u64,
}

/// Inserts a pending execution with its first events (requested, entered the initial state)
/// and wakes the workers; one transaction.
pub async fn insert(pool: &PgPool, new: &NewExecution<'_>) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    let events = [
        NewEvent {
            event_type: "execution_requested",
            state: None,
            payload: json!({"workflow": new.workflow_name, "version": new.workflow_version,
                "caller": new.caller_id, "parent_execution_id": new.parent.map(|p| p.0)}),
        },
        NewEvent::state(
            "state_entered",
            new.initial_state,
            json!({"visit": 1, "from": null}),
        ),
    ];
    let inserted = sqlx::query(
        "INSERT INTO workflow_executions (id, tenant_id, workflow_id, workflow_version_id, workflow_name, \
         workflow_version, parent_execution_id, parent_state, parent_visit, current_state, visits, blackboard, \
         input, intent, caller_kind, caller_id, next_seq, deadline, ceiling, workflow_revision, manifest_digest) \
         SELECT $1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,3, now() + make_interval(secs => $17), $18, \
         v.revision, v.manifest_digest FROM definition_versions v WHERE v.id = $4",
    )
    .bind(new.id)
    .bind(new.tenant)
    .bind(new.workflow_id)
    .bind(new.workflow_version_id)
    .bind(new.workflow_name)
    .bind(new.workflow_version)
    .bind(new.parent.map(|p| p.0))
    .bind(new.parent.map(|p| p.1))
    .bind(new.parent.map(|p| p.2))
    .bind(new.initial_state)
    .bind(json!({ new.initial_state: 1 }))
    .bind(new.blackboard)
    .bind(new.input)
    .bind(new.intent)
    .bind(new.caller_kind)
    .bind(new.caller_id)
    .bind(new.max_secs as f64)
    .bind(new.ceiling)
    .execute(&mut *tx)
    .await?;
    // The revision and digest come from the very row the execution points at; no row, no run.
    if inserted.rows_affected() != 1 {
        return Err(sqlx::Error::RowNotFound);
    }
    insert_events(&mut tx, new.id, 1, &events).await?;
    notify(&mut *tx, "wake").await?;
    tx.commit().await
}

async fn insert_events(
    tx: &mut sqlx::PgConnection,
    id: Uuid,
    first_seq: i64,
    events: &[NewEvent],
) -> Result<(), sqlx::Error> {
    if events.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO workflow_execution_events (execution_id, seq, event_type, state_name, payload) \
         SELECT $1, $2 + x.ord - 1, x.e->>'t', x.e->>'s', COALESCE(x.e->'p', '{}'::jsonb) \
         FROM jsonb_array_elements($3) WITH ORDINALITY AS x(e, ord)",
    )
    .bind(id)
    .bind(first_seq)
    .bind(events_json(events))
    .execute(tx)
    .await?;
    Ok(())
}

/// Sends `payload` on [`CHANNEL`] (delivered when the surrounding transaction commits).
pub async fn notify<'e, E>(executor: E, payload: &str) -> Result<(), sqlx::Error>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(payload)
        .execute(executor)
        .await?;
    Ok(())
}

/// Claims one runnable execution for `me` under a lease of `ttl_secs`: a pending one, a
/// running one whose lease expired, or a waiting one that has an answer, a due timeout, a
/// cancel request or (waiting on a Subworkflow) a child that has ended. The last is read from
/// the rows, not only heard: a child that ends while its parent is parking commits its wake-up
/// against a parent not yet `waiting`, and the parent's own look at the child can run before the
/// child's commit is visible; the poll sees the ended child either way. A resumed waiting execution still shows `waiting_for` (until its state
/// commits); its attempt count is unchanged, any other claim counts one more attempt.
pub async fn claim(
    pool: &PgPool,
    me: Uuid,
    ttl_secs: u64,
) -> Result<Option<WorkflowExecution>, sqlx::Error> {
    sqlx::query_as(&format!(
        "WITH c AS ( \
           SELECT id, status AS was FROM workflow_executions p \
           WHERE status IN ('pending', 'running', 'waiting') AND ( \
             (status IN ('pending', 'running') AND (lease_owner IS NULL OR lease_expires_at < now())) \
             OR (status = 'waiting' AND (signal IS NOT NULL OR wake_at <= now() OR cancel_requested \
               OR (waiting_for = 'subworkflow' AND (SELECT k.status FROM workflow_executions k \
                 WHERE k.parent_execution_id = p.id AND k.parent_state = p.current_state \
                 AND k.parent_visit = COALESCE((p.visits->>p.current_state)::int, 1) \
                 ORDER BY k.created_at DESC LIMIT 1) \
                 IN ('completed', 'failed', 'cancelled', 'timed_out'))))) \
           ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED) \
         UPDATE workflow_executions w SET lease_owner = $1, lease_expires_at = now() + make_interval(secs => $2), \
           status = 'running', started_at = COALESCE(w.started_at, now()), \
           lease_epoch = w.lease_epoch + 1, \
           attempt = CASE WHEN c.was = 'waiting' THEN w.attempt ELSE w.attempt + 1 END \
         FROM c WHERE w.id = c.id RETURNING {}",
        COLUMNS
            .split(", ")
            .map(|c| format!("w.{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .bind(me)
    .bind(ttl_secs as f64)
    .fetch_optional(pool)
    .await
}

/// Extends a held lease; `None` when it is no longer ours, else whether cancel was asked for.
pub async fn renew(
    pool: &PgPool,
    id: Uuid,
    (me, epoch): (Uuid, i64),
    ttl_secs: u64,
) -> Result<Option<bool>, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE workflow_executions SET lease_expires_at = now() + make_interval(secs => $3) \
         WHERE id = $1 AND lease_owner = $2 AND lease_epoch = $4 AND status = 'running' \
         RETURNING cancel_requested",
    )
    .bind(id)
    .bind(me)
    .bind(ttl_secs as f64)
    .bind(epoch)
    .fetch_optional(pool)
    .await
}

/// Appends one event if `me` still holds the execution; false when the lease was lost.
pub async fn append(
    pool: &PgPool,
    id: Uuid,
    (me, epoch): (Uuid, i64),
    event: &NewEvent,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "WITH s AS (UPDATE workflow_executions SET next_seq = next_seq + 1 \
           WHERE id = $1 AND lease_owner = $2 AND lease_epoch = $6 RETURNING next_seq - 1 AS seq) \
         INSERT INTO workflow_execution_events (execution_id, seq, event_type, state_name, payload) \
         SELECT $1, seq, $3, $4, $5 FROM s",
    )
    .bind(id)
    .bind(me)
    .bind(event.event_type)
    .bind(event.state.as_deref())
    .bind(&event.payload)
    .bind(epoch)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// [`append`] as the worker and its states record their events: fenced by the lease (dropped
/// silently once it is lost) and a database failure only logged, since an event tells of a
/// step and is not the step.
pub async fn record(pool: &PgPool, id: Uuid, lease: (Uuid, i64), event: &NewEvent) {
    if let Err(err) = append(pool, id, lease, event).await {
        tracing::warn!(execution = %id, error = %err, "could not record a workflow event");
    }
}

/// Everything one state's end changes, written in one fenced transaction.
pub struct Commit<'a> {
    /// The execution.
    pub id: Uuid,
    /// The lease holder.
    pub me: Uuid,
    /// The epoch of its lease.
    pub epoch: i64,
    /// New status.
    pub status: &'a str,
    /// The state now current.
    pub current_state: &'a str,
    /// Visit counts.
    pub visits: &'a Value,
    /// Transitions taken.
    pub transition_count: i32,
    /// The whole blackboard.
    pub blackboard: &'a Value,
    /// True when `current_state` was just entered (resets attempt, feedback, timers).
    pub entered: bool,
    /// Feedback of the entering transition.
    pub feedback: Option<&'a str>,
    /// While waiting: what for.
    pub waiting_for: Option<&'a str>,
    /// While waiting: when to look again.
    pub wake_at: Option<DateTime<Utc>>,
    /// Final output.
    pub final_output: Option<&'a Value>,
    /// Failure reason.
    pub error: Option<&'a str>,
    /// Give the lease up (waiting or ended).
    pub release: bool,
    /// Lease length when kept.
    pub ttl_secs: u64,
    /// Events, in order.
    pub events: Vec<NewEvent>,
    /// A parent to wake (this child ended).
    pub wake_parent: Option<Uuid>,
    /// The run's volumes, for a workflow that mounts any (`None`: nothing to do).
    pub volumes: Option<VolumeCommit<'a>>,
}

/// What a commit does to the run's volumes (`workspaces`), in its transaction.
#[derive(Debug, Clone, Copy, Default)]
pub struct VolumeCommit<'a> {
    /// (state, visit, attempt) whose drafts become the volumes' content: the state committed.
    pub promote: Option<(&'a str, i32, i32)>,
}

/// Writes a commit if `me` still holds the lease; false (nothing written) when it does not.
///
/// The row update and the event inserts are one statement (data-modifying CTE), so the commit
/// of a state costs a single round trip; waking a parent, or promoting the state's volume drafts
/// (and removing the volumes when the run ends), adds statements to the same transaction.
pub async fn commit(pool: &PgPool, c: &Commit<'_>) -> Result<bool, sqlx::Error> {
    let n = c.events.len() as i64;
    let sql = "WITH u AS (UPDATE workflow_executions SET status = $3, current_state = $4, visits = $5, \
           transition_count = $6, blackboard = $7, \
           state_feedback = CASE WHEN $8 THEN $9 ELSE state_feedback END, \
           state_entered_at = CASE WHEN $8 THEN now() ELSE state_entered_at END, \
           attempt = CASE WHEN $8 THEN 1 ELSE attempt END, \
           last_transition_at = CASE WHEN $8 THEN now() ELSE last_transition_at END, \
           signal = CASE WHEN $8 THEN NULL ELSE signal END, \
           waiting_for = $10, wake_at = $11, \
           final_output = COALESCE($12, final_output), error = COALESCE($13, error), \
           ended_at = CASE WHEN $3 IN ('completed', 'failed', 'cancelled', 'timed_out') THEN now() ELSE NULL END, \
           lease_owner = CASE WHEN $14 THEN NULL ELSE lease_owner END, \
           lease_expires_at = CASE WHEN $14 THEN NULL ELSE now() + make_interval(secs => $15) END, \
           next_seq = next_seq + $16 \
         WHERE id = $1 AND lease_owner = $2 AND lease_epoch = $18 RETURNING next_seq - $16 AS first), \
         i AS (INSERT INTO workflow_execution_events (execution_id, seq, event_type, state_name, payload) \
         SELECT $1, u.first + x.ord - 1, x.e->>'t', x.e->>'s', COALESCE(x.e->'p', '{}'::jsonb) \
         FROM u, jsonb_array_elements($17) WITH ORDINALITY AS x(e, ord) RETURNING 1) \
         SELECT count(*) FROM u";
    let query = sqlx::query_scalar::<_, i64>(sql)
        .bind(c.id)
        .bind(c.me)
        .bind(c.status)
        .bind(c.current_state)
        .bind(c.visits)
        .bind(c.transition_count)
        .bind(c.blackboard)
        .bind(c.entered)
        .bind(c.feedback)
        .bind(c.waiting_for)
        .bind(c.wake_at)
        .bind(c.final_output)
        .bind(c.error)
        .bind(c.release)
        .bind(c.ttl_secs as f64)
        .bind(n)
        .bind(events_json(&c.events))
        .bind(c.epoch);
    if c.wake_parent.is_none() && c.volumes.is_none() {
        return Ok(query.fetch_one(pool).await? > 0);
    }
    let mut tx = pool.begin().await?;
    if query.fetch_one(&mut *tx).await? == 0 {
        return Ok(false);
    }
    // The volumes' new content (and, at the end, their removal) commits with the state.
    if let Some(volumes) = c.volumes {
        if let Some((state, visit, attempt)) = volumes.promote {
            aegis_sandboxes::workspaces::promote(&mut tx, c.id, state, visit, attempt).await?;
        }
        if is_terminal(c.status) {
            aegis_sandboxes::workspaces::ended(&mut tx, c.id).await?;
        }
    }
    if let Some(parent) = c.wake_parent {
        sqlx::query(
            "UPDATE workflow_executions SET wake_at = now() \
             WHERE id = $1 AND status = 'waiting' AND waiting_for = 'subworkflow'",
        )
        .bind(parent)
        .execute(&mut *tx)
        .await?;
        notify(&mut *tx, "wake").await?;
    }
    tx.commit().await?;
    Ok(true)
}

/// Gives a held lease up without changing anything else (shutdown): another replica continues.
pub async fn release(pool: &PgPool, id: Uuid, (me, epoch): (Uuid, i64)) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE workflow_executions SET lease_owner = NULL, lease_expires_at = NULL \
         WHERE id = $1 AND lease_owner = $2 AND lease_epoch = $3",
    )
    .bind(id)
    .bind(me)
    .bind(epoch)
    .execute(&mut *tx)
    .await?;
    notify(&mut *tx, "wake").await?;
    tx.commit().await
}

/// Why a signal was not stored.
#[derive(Debug, Clone, PartialEq)]
pub enum SignalRefusal {
    /// No such execution.
    NotFound,
    /// It is not waiting in a Human state.
    NotWaiting {
        /// Its status.
        status: String,
        /// Its current state.
        state: String,
        /// What it waits for, if it waits.
        waiting_for: Option<String>,
    },
    /// An answer is already waiting to be consumed.
    AlreadyAnswered {
        /// The state.
        state: String,
    },
}

/// Stores a Human answer, with its event, if the execution waits in a Human state.
pub async fn signal(
    pool: &PgPool,
    tenant: &str,
    id: Uuid,
    response: &str,
) -> Result<Result<String, SignalRefusal>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let state: Option<String> = sqlx::query_scalar(
        "WITH s AS (UPDATE workflow_executions SET signal = $3, next_seq = next_seq + 1 \
           WHERE tenant_id = $1 AND id = $2 AND status = 'waiting' AND waiting_for = 'human' \
           AND signal IS NULL AND NOT cancel_requested RETURNING next_seq - 1 AS seq, current_state) \
         INSERT INTO workflow_execution_events (execution_id, seq, event_type, state_name, payload) \
         SELECT $2, seq, 'human_input_received', current_state, jsonb_build_object('response', $3::text) FROM s \
         RETURNING state_name",
    )
    .bind(tenant)
    .bind(id)
    .bind(response)
    .fetch_optional(&mut *tx)
    .await?;
    match state {
        Some(state) => {
            notify(&mut *tx, "wake").await?;
            tx.commit().await?;
            Ok(Ok(state))
        }
        None => {
            drop(tx);
            let row: Option<(String, String, Option<String>, Option<String>)> = sqlx::query_as(
                "SELECT status, current_state, waiting_for, signal FROM workflow_executions WHERE tenant_id = $1 AND id = $2",
            )
            .bind(tenant)
            .bind(id)
            .fetch_optional(pool)
            .await?;
            Ok(Err(match row {
                None => SignalRefusal::NotFound,
                Some((status, state, waiting_for, signal))
                    if status == "waiting"
                        && waiting_for.as_deref() == Some("human")
                        && signal.is_some() =>
                {
                    let _ = status;
                    SignalRefusal::AlreadyAnswered { state }
                }
                Some((status, state, waiting_for, _)) => SignalRefusal::NotWaiting {
                    status,
                    state,
                    waiting_for,
                },
            }))
        }
    }
}

/// Marks a live execution for cancellation and tells every replica; false when it had ended.
pub async fn request_cancel(pool: &PgPool, id: Uuid) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let done = sqlx::query(
        "UPDATE workflow_executions SET cancel_requested = TRUE \
         WHERE id = $1 AND status IN ('pending', 'running', 'waiting')",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() == 1 {
        notify(&mut *tx, &format!("cancel:{id}")).await?;
    }
    tx.commit().await?;
    Ok(done.rows_affected() == 1)
}

/// One execution of the tenant.
pub async fn get(
    pool: &PgPool,
    tenant: &str,
    id: Uuid,
) -> Result<Option<WorkflowExecution>, sqlx::Error> {
    aegis_store::database::tenant_row(pool, "workflow_executions", COLUMNS, tenant, id).await
}

/// Who may see what: operators everything of their tenant, others what they started (children
/// of their executions inherit their caller).
#[derive(Debug, Clone)]
pub struct Visibility<'a> {
    pub tenant: &'a str,
    /// `None` for operators; else (caller kind, caller id).
    pub owner: Option<(&'a str, &'a str)>,
}

/// Executions newest first, optionally of one workflow and/or status.
pub async fn list(
    pool: &PgPool,
    who: &Visibility<'_>,
    workflow: Option<Uuid>,
    status: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<(Vec<WorkflowExecution>, i64), sqlx::Error> {
    let filter = "tenant_id = $1 AND ($2::uuid IS NULL OR workflow_id = $2) AND ($3::text IS NULL OR status = $3) \
        AND ($4::text IS NULL OR (caller_kind = $4 AND caller_id = $5))";
    let rows = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM workflow_executions WHERE {filter} ORDER BY created_at DESC LIMIT $6 OFFSET $7"
    ))
    .bind(who.tenant)
    .bind(workflow)
    .bind(status)
    .bind(who.owner.map(|o| o.0))
    .bind(who.owner.map(|o| o.1))
    .bind(limit.clamp(1, 200))
    .bind(offset.max(0))
    .fetch_all(pool)
    .await?;
    let total: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM workflow_executions WHERE {filter}"
    ))
    .bind(who.tenant)
    .bind(workflow)
    .bind(status)
    .bind(who.owner.map(|o| o.0))
    .bind(who.owner.map(|o| o.1))
    .fetch_one(pool)
    .await?;
    Ok((rows, total))
}

/// The live Subworkflow child of (parent, state, visit), if one was started.
pub async fn child_of(
    pool: &PgPool,
    parent: Uuid,
    state: &str,
    visit: i32,
) -> Result<Option<WorkflowExecution>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM workflow_executions WHERE parent_execution_id = $1 AND parent_state = $2 \
         AND parent_visit = $3 ORDER BY created_at DESC LIMIT 1"
    ))
    .bind(parent)
    .bind(state)
    .bind(visit)
    .fetch_optional(pool)
    .await
}

/// The workflow manifest of a version row.
pub async fn manifest(pool: &PgPool, version_id: Uuid) -> Result<Option<Value>, sqlx::Error> {
    sqlx::query_scalar("SELECT manifest FROM definition_versions WHERE id = $1")
        .bind(version_id)
        .fetch_optional(pool)
        .await
}

/// Agent executions started for (execution, state, visit) that have not ended.
pub async fn live_agent_children(
    pool: &PgPool,
    id: Uuid,
    state: &str,
    visit: i32,
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM executions WHERE workflow_execution_id = $1 AND workflow_state = $2 \
         AND workflow_visit = $3 AND status IN ('pending', 'running')",
    )
    .bind(id)
    .bind(state)
    .bind(visit)
    .fetch_all(pool)
    .await
}
