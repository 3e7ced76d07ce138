//! The usage samples of E2B sandboxes (`e2b_sandbox_metrics`), one per sandbox per 5 s bucket,
//! kept an hour: what `GET /sandboxes/{id}/metrics` reports for a time range.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

/// One kept sample: its 5 s bucket and what was measured then.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Sample {
    pub at: DateTime<Utc>,
    #[sqlx(flatten)]
    pub figures: Figures,
}

/// What one sample measured (stored under the bucket the database's clock is in when it is
/// written, so replicas with drifting clocks share buckets).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Figures {
    pub cpu_count: i32,
    pub cpu_used_pct: f64,
    pub mem_used: i64,
    pub mem_total: i64,
    pub mem_cache: i64,
    pub disk_used: i64,
    pub disk_total: i64,
}

/// The kept samples of sandbox `id` (its E2B id) between `start` and `end`, oldest first.
pub async fn kept(
    pool: &PgPool,
    id: Uuid,
    start: Option<DateTime<Utc>>,
    end: Option<DateTime<Utc>>,
) -> Result<Vec<Sample>, sqlx::Error> {
    sqlx::query_as(
        "SELECT at, cpu_count, cpu_used_pct, mem_used, mem_total, mem_cache, disk_used, disk_total \
         FROM e2b_sandbox_metrics WHERE e2b_id = $1 \
         AND ($2::timestamptz IS NULL OR at >= $2) AND ($3::timestamptz IS NULL OR at <= $3) \
         ORDER BY at",
    )
    .bind(id)
    .bind(start)
    .bind(end)
    .fetch_all(pool)
    .await
}

/// The running, unpaused E2B sandboxes `instance` holds: `(e2b id, the dispatcher's sandbox)`.
pub async fn held_by(pool: &PgPool, instance: Uuid) -> Result<Vec<(Uuid, Uuid)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT e.e2b_id, e.sandbox_id FROM e2b_sandboxes e JOIN sandboxes s ON s.id = e.sandbox_id \
         WHERE s.state = 'running' AND s.instance_id = $1 AND e.paused_snapshot IS NULL",
    )
    .bind(instance)
    .fetch_all(pool)
    .await
}

/// Stores a sample of sandbox `e2b_id` under the current 5 s bucket; false when that bucket
/// has one already or the sandbox's row is gone.
pub async fn insert(pool: &PgPool, e2b_id: Uuid, s: &Figures) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO e2b_sandbox_metrics (e2b_id, at, cpu_count, cpu_used_pct, mem_used, \
         mem_total, mem_cache, disk_used, disk_total) \
         SELECT $1, to_timestamp(floor(extract(epoch FROM now()) / 5) * 5), $2, $3, $4, $5, $6, $7, $8 \
         WHERE EXISTS (SELECT 1 FROM e2b_sandboxes WHERE e2b_id = $1) \
         ON CONFLICT (e2b_id, at) DO NOTHING",
    )
    .bind(e2b_id)
    .bind(s.cpu_count)
    .bind(s.cpu_used_pct)
    .bind(s.mem_used)
    .bind(s.mem_total)
    .bind(s.mem_cache)
    .bind(s.disk_used)
    .bind(s.disk_total)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Forgets the samples older than `kept_secs`.
pub async fn forget_older_than(pool: &PgPool, kept_secs: f64) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM e2b_sandbox_metrics WHERE at < now() - make_interval(secs => $1)")
        .bind(kept_secs)
        .execute(pool)
        .await
        .map(|_| ())
}
