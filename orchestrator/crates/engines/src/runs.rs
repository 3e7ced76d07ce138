//! What agent executions and workflow executions share as stored runs: a row per run in a table
//! of its own, an append-only event log beside it, the same terminal statuses, and the same
//! reading, counting and removal of ended runs. The two engines differ in how they run (a model
//! loop on one replica, a durable state machine on any), not in how a finished run is read or
//! removed, so those are written once here and each engine's store names only its [`Kind`].

use sqlx::postgres::PgRow;
use sqlx::PgPool;
use uuid::Uuid;

/// The statuses a run never leaves (both engines use the same four).
pub const TERMINAL: [&str; 4] = ["completed", "failed", "cancelled", "timed_out"];

/// True for a status a run never leaves.
pub fn is_terminal(status: &str) -> bool {
    TERMINAL.contains(&status)
}

/// What differs between the two kinds of run where they are stored alike.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    /// The runs' table.
    pub runs: &'static str,
    /// Their event log's table (`execution_id`, `seq` gap-free from 1).
    pub events: &'static str,
    /// The columns an event is read with (its `FromRow` type's fields).
    pub event_columns: &'static str,
    /// How a message names one run ("execution", "workflow execution").
    pub noun: &'static str,
}

/// Agent executions (`engine::store`).
pub const AGENT: Kind = Kind {
    runs: "executions",
    events: "execution_events",
    event_columns: "seq, event_type, payload, recorded_at",
    noun: "execution",
};

/// Workflow executions (`workflow::store`).
pub const WORKFLOW: Kind = Kind {
    runs: "workflow_executions",
    events: "workflow_execution_events",
    event_columns: "seq, event_type, state_name, payload, recorded_at",
    noun: "workflow execution",
};

/// One event of a run's log, whichever kind: read by [`Kind::events`], sent by the doors, and
/// placed in the log by its sequence number (where a page or a stream resumes).
pub trait RunEvent:
    for<'r> sqlx::FromRow<'r, PgRow> + serde::Serialize + Send + Sync + Unpin + 'static
{
    /// Its sequence number in the run's log (1-based, gap-free).
    fn seq(&self) -> i64;
}

/// The largest page of events one read returns.
pub const MAX_EVENTS_PAGE: i64 = 1000;

impl Kind {
    /// Events of run `id` after `after`, oldest first, at most `limit` (1 to
    /// [`MAX_EVENTS_PAGE`]).
    pub async fn events<E>(
        &self,
        pool: &PgPool,
        id: Uuid,
        after: i64,
        limit: i64,
    ) -> Result<Vec<E>, sqlx::Error>
    where
        E: RunEvent,
    {
        sqlx::query_as(&format!(
            "SELECT {} FROM {} WHERE execution_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            self.event_columns, self.events
        ))
        .bind(id)
        .bind(after)
        .bind(limit.clamp(1, MAX_EVENTS_PAGE))
        .fetch_all(pool)
        .await
    }

    /// How many events run `id` has.
    pub async fn event_count(&self, pool: &PgPool, id: Uuid) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {} WHERE execution_id = $1",
            self.events
        ))
        .bind(id)
        .fetch_one(pool)
        .await
    }

    /// The status of run `id` of `tenant` (`None`: unknown there), for a reader that only
    /// needs to know whether it has ended.
    pub async fn status(
        &self,
        pool: &PgPool,
        tenant: &str,
        id: Uuid,
    ) -> Result<Option<String>, sqlx::Error> {
        sqlx::query_scalar(&format!(
            "SELECT status FROM {} WHERE tenant_id = $1 AND id = $2",
            self.runs
        ))
        .bind(tenant)
        .bind(id)
        .fetch_optional(pool)
        .await
    }

    /// Deletes an ended run of `tenant` with its events (their foreign key cascades); false
    /// when it is still live or unknown, so a live run is never removed under its engine.
    pub async fn remove(&self, pool: &PgPool, tenant: &str, id: Uuid) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(&format!(
            "DELETE FROM {} WHERE tenant_id = $1 AND id = $2 AND status = ANY($3)",
            self.runs
        ))
        .bind(tenant)
        .bind(id)
        .bind(&TERMINAL[..])
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_kinds_end_in_the_same_statuses() {
        for status in TERMINAL {
            assert!(is_terminal(status));
        }
        for live in ["pending", "running", "waiting", "cancelling", ""] {
            assert!(!is_terminal(live), "{live}");
        }
        assert_ne!(AGENT.runs, WORKFLOW.runs);
        assert_ne!(AGENT.events, WORKFLOW.events);
    }
}
