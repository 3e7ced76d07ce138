//! The chain writer: appends audit rows in batches, one transaction per batch.
//!
//! Every row is chained to the one before it under one advisory lock (so several replicas still
//! build one order). Taking that lock, reading the head and committing cost several PostgreSQL
//! round trips that, done per row, capped the whole node at roughly one audited call per
//! millisecond: the lock serialises them. Here the rows of one database go through one group
//! commit (`group_commit`): a row that finds the writer idle is stored at once from its caller's
//! task, and the rows that arrive meanwhile are chained in memory in arrival order and stored
//! with a single INSERT, so the lock is held once per batch. Nothing about a row changes: each still carries its own
//! `prev_hash` and `hash`, verification is unchanged, and `append` returns only once the row's
//! transaction committed (an intent row still exists before its tool runs).
//!
//! A batch costs one round trip: the writer remembers the head it last wrote (hash and index per
//! tenant), chains the batch to it, and calls `audit_append` (a SQL function, see its migration)
//! in autocommit: it takes the lock, then inserts the batch unless a head is no longer the one
//! chained to. When another replica (or anything else) appended meanwhile, nothing is stored and
//! the batch goes the long way: `BEGIN` with the lock, read the heads, chain again, the same
//! `audit_append` call, COMMIT.
//!
//! A batch that fails (say a second completion of one intent hits the unique index) is retried
//! row by row by the group commit, so only the offending row reports the error.
//!
//! While rows keep arriving, the writer keeps its connection from one batch to the next
//! (`group_commit::HeldConnection`), and gives it back as soon as nothing waits and after any
//! failure.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use chrono::{SubsecRound, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{row_hash, AuditRow, APPEND_LOCK, GENESIS};
use crate::group_commit::{Batch, GroupCommit, HeldConnection, Storing};

/// Told of every stored batch (rows, time taken): the node's metrics, which live above this
/// crate, register here once at start (`observe_batches`).
static BATCH_OBSERVER: OnceLock<fn(usize, std::time::Duration)> = OnceLock::new();

/// Registers what is told of every stored batch; the first registration of the process wins
/// (the writer is process-wide, as is the metrics registry it feeds).
pub fn observe_batches(observe: fn(usize, std::time::Duration)) {
    let _ = BATCH_OBSERVER.set(observe);
}

/// A row waiting for its place in the chain.
struct Pending {
    pool: PgPool,
    tenant: String,
    instance: Option<Uuid>,
    row: AuditRow,
}

type Writers = Mutex<HashMap<String, Arc<GroupCommit<Chain>>>>;

fn writers() -> &'static Writers {
    static WRITERS: OnceLock<Writers> = OnceLock::new();
    WRITERS.get_or_init(Default::default)
}

/// One writer per database (host, port, name): rows of one database share one chain.
fn key(pool: &PgPool) -> String {
    let o = pool.connect_options();
    format!(
        "{}:{}/{}",
        o.get_host(),
        o.get_port(),
        o.get_database().unwrap_or_default()
    )
}

/// Queues a row and waits until its batch committed. The writer sets `seq`, `at`,
/// `chain_index`, `prev_hash` and `hash`; the rest of `row` is stored as given. Once begun, the
/// row is stored even if this future is dropped (see `group_commit`).
pub(super) async fn submit(
    pool: &PgPool,
    tenant: &str,
    instance: Option<Uuid>,
    row: AuditRow,
) -> Result<AuditRow, sqlx::Error> {
    let pending = Pending {
        pool: pool.clone(),
        tenant: tenant.to_owned(),
        instance,
        row,
    };
    let writer = {
        let mut map = writers().lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key(pool)).or_default().clone()
    };
    writer.submit(pending).await.unwrap_or_else(|| {
        Err(sqlx::Error::Protocol(
            "the audit writer stopped before storing the row".into(),
        ))
    })
}

/// The head of each tenant's chain as this writer last committed it: (hash, next index).
type Heads = HashMap<String, (String, i64)>;

/// What the chain's writer keeps from one batch to the next: the heads it wrote last, and its
/// connection while rows keep arriving.
#[derive(Default)]
struct Chain {
    heads: Heads,
    held: HeldConnection,
}

impl Batch for Chain {
    type Request = Pending;
    type Stored = AuditRow;
    const WHAT: &'static str = "audit rows";

    fn store<'a>(&'a mut self, batch: &'a [Pending]) -> Storing<'a, AuditRow> {
        Box::pin(async move {
            // Rows of a closed pool are stored with another row's pool, when there is one.
            let pool = batch
                .iter()
                .map(|p| &p.pool)
                .find(|p| !p.is_closed())
                .ok_or(sqlx::Error::PoolClosed)?;
            store(pool, batch, &mut self.heads, &mut self.held).await
        })
    }

    fn idle(&mut self) {
        self.held.release();
    }
}

/// Chains and inserts `batch` in one transaction; the stored rows, in the batch's order.
/// `heads` is the cache of chain heads: used if still true, refreshed otherwise, forgotten on
/// failure. The time of each stored batch is the `aegis_audit_write_duration_seconds` metric.
async fn store(
    pool: &PgPool,
    batch: &[Pending],
    heads: &mut Heads,
    held: &mut HeldConnection,
) -> Result<Vec<AuditRow>, sqlx::Error> {
    let started = std::time::Instant::now();
    let result = match held.get(pool).await {
        Ok(conn) => store_locked(conn, batch, heads).await,
        Err(e) => Err(e),
    };
    match &result {
        Ok(rows) => {
            if let Some(observe) = BATCH_OBSERVER.get() {
                observe(rows.len(), started.elapsed());
            }
        }
        Err(_) => {
            heads.clear();
            // Back to the pool, which checks it (a failed transaction is rolled back there).
            held.release();
        }
    }
    result
}

async fn store_locked(
    conn: &mut PgConnection,
    batch: &[Pending],
    heads: &mut Heads,
) -> Result<Vec<AuditRow>, sqlx::Error> {
    let mut tenants: Vec<&str> = batch.iter().map(|p| p.tenant.as_str()).collect();
    tenants.sort_unstable();
    tenants.dedup();
    if tenants.iter().all(|t| heads.contains_key(*t)) {
        // The usual case: one round trip in autocommit, `audit_append` takes the lock itself.
        if let Some(rows) = append(&mut *conn, batch, &tenants, heads).await? {
            return Ok(rows);
        }
        // Someone else appended since our last batch: read the heads under the lock below.
    }
    // One round trip: a simple query may hold two statements.
    let mut tx = sqlx::Connection::begin_with(
        &mut *conn,
        format!("BEGIN; SELECT pg_advisory_xact_lock({APPEND_LOCK})"),
    )
    .await?;
    for tenant in &tenants {
        let head = read_head(&mut tx, tenant).await?;
        heads.insert((*tenant).to_owned(), head);
    }
    // The heads were just read under the lock this transaction holds: nothing to check (a
    // tenant without rows has no newest row to compare its genesis head with).
    let rows = append(&mut *tx, batch, &[], heads).await?.ok_or_else(|| {
        sqlx::Error::Protocol("the audit chain's head moved under its lock".into())
    })?;
    tx.commit().await?;
    Ok(rows)
}

/// Chains `batch` to `heads` and stores it with `audit_append` (which takes the chain's lock;
/// inside a transaction that already holds it, that is immediate). `None`, with nothing stored,
/// when the head of one of `check` is no longer the one in `heads`; otherwise `heads` advance
/// past the batch.
async fn append<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    batch: &[Pending],
    check: &[&str],
    heads: &mut Heads,
) -> Result<Option<Vec<AuditRow>>, sqlx::Error> {
    let mut next = heads.clone();
    let rows = chain(batch, &mut next)?;
    let (expect_tenants, expect_hashes): (Vec<String>, Vec<String>) = check
        .iter()
        .map(|t| ((*t).to_owned(), heads[*t].0.clone()))
        .unzip();
    let col = |f: fn(&AuditRow) -> String| rows.iter().map(f).collect::<Vec<_>>();
    let opt = |f: fn(&AuditRow) -> Option<String>| rows.iter().map(f).collect::<Vec<_>>();
    // The function emits rows in ordinal order, so `seq` (a sequence default) follows the chain.
    let stored: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT stored_id, stored_seq FROM audit_append($1, $2, $3, $4, $5, $6, $7, $8, $9, \
         $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)",
    )
    .bind(APPEND_LOCK)
    .bind(expect_tenants)
    .bind(expect_hashes)
    .bind(rows.iter().map(|r| r.id).collect::<Vec<_>>())
    .bind(batch.iter().map(|p| p.tenant.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.at).collect::<Vec<_>>())
    .bind(col(|r| r.caller_kind.clone()))
    .bind(col(|r| r.caller_id.clone()))
    .bind(col(|r| r.kind.clone()))
    .bind(col(|r| r.action.clone()))
    .bind(col(|r| r.decision.clone()))
    .bind(opt(|r| r.reason_code.clone()))
    .bind(opt(|r| r.reason.clone()))
    .bind(col(|r| r.args_digest.clone()))
    .bind(col(|r| r.outcome.clone()))
    .bind(opt(|r| r.result_digest.clone()))
    .bind(rows.iter().map(|r| r.duration_ms).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.intent_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|r| r.chain_index).collect::<Vec<_>>())
    .bind(batch.iter().map(|p| p.instance).collect::<Vec<_>>())
    .bind(col(|r| r.prev_hash.clone()))
    .bind(col(|r| r.hash.clone()))
    .bind(rows.iter().map(|r| r.sandbox_id).collect::<Vec<_>>())
    .fetch_all(executor)
    .await?;
    if stored.is_empty() {
        return Ok(None);
    }
    let rows = number(rows, stored)?;
    *heads = next;
    Ok(Some(rows))
}

/// The head of `tenant`'s chain: (hash, next index).
async fn read_head(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    tenant: &str,
) -> Result<(String, i64), sqlx::Error> {
    let prev: Option<(String, Option<i64>)> = sqlx::query_as(
        "SELECT hash, chain_index FROM audit_log WHERE tenant_id = $1 ORDER BY tenant_id DESC, seq DESC LIMIT 1",
    )
    .bind(tenant)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(match prev {
        None => (GENESIS.to_owned(), 1),
        Some((hash, Some(index))) => (hash, index + 1),
        Some((hash, None)) => {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE tenant_id = $1")
                .bind(tenant)
                .fetch_one(&mut **tx)
                .await?;
            (hash, n + 1)
        }
    })
}

/// Chains the batch's rows in order from `heads`, advancing them.
fn chain(batch: &[Pending], heads: &mut Heads) -> Result<Vec<AuditRow>, sqlx::Error> {
    // Postgres keeps microseconds; truncate now so the hashed time equals the stored time.
    let at = Utc::now().trunc_subsecs(6);
    let mut rows = Vec::with_capacity(batch.len());
    for p in batch {
        let head = heads
            .get_mut(p.tenant.as_str())
            .ok_or_else(|| sqlx::Error::Protocol("audit chain head missing".into()))?;
        let mut row = p.row.clone();
        row.at = at;
        row.chain_index = Some(head.1);
        row.prev_hash = head.0.clone();
        row.hash = row_hash(&row);
        *head = (row.hash.clone(), head.1 + 1);
        rows.push(row);
    }
    Ok(rows)
}

/// Puts the stored `seq` on each row, refusing (rolling back) a batch numbered out of order.
fn number(mut rows: Vec<AuditRow>, stored: Vec<(Uuid, i64)>) -> Result<Vec<AuditRow>, sqlx::Error> {
    let seqs: HashMap<Uuid, i64> = stored.into_iter().collect();
    let mut last = 0;
    for row in &mut rows {
        row.seq = seqs
            .get(&row.id)
            .copied()
            .ok_or_else(|| sqlx::Error::Protocol("an audit row was not stored".into()))?;
        // The chain is verified in `seq` order: refuse (roll back) rather than store it shuffled.
        if row.seq <= last {
            return Err(sqlx::Error::Protocol(
                "audit rows were numbered out of chain order".into(),
            ));
        }
        last = row.seq;
    }
    Ok(rows)
}
