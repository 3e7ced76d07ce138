//! The node's instances (`node_instances`): one row per start of the service, so replicas know
//! who is alive (`heartbeat_at`), who stopped gracefully (`stopped_at`) and where each takes
//! forwarded calls (`peer_url`).
//!
//! These are the node's own writes and reads of the rows: its start and stop, the heartbeat it
//! keeps when no dispatcher runs, what a restart re-attaches to, and the addresses the cluster's
//! forwarder looks up. The dispatcher renews and fences the same rows as the lease on its
//! sandboxes, with queries of its own (`dispatcher::store`), since it depends on no crate of the
//! service.

use sqlx::PgPool;
use uuid::Uuid;

/// Records a start of the service, before anything it starts may name it (sandboxes and
/// executions refer to their instance's row). `peer_url` is where peers forward calls, `None`
/// without `cluster.listen`.
pub async fn register(
    pool: &PgPool,
    id: Uuid,
    hostname: &str,
    version: &str,
    peer_url: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO node_instances (id, hostname, version, peer_url) VALUES ($1, $2, $3, $4)",
    )
    .bind(id)
    .bind(hostname)
    .bind(version)
    .bind(peer_url)
    .execute(pool)
    .await
    .map(|_| ())
}

/// Tells peers the instance is alive, for an instance with no dispatcher (a running dispatcher
/// renews the heartbeat itself, as its lease, and a second writer could keep an instance
/// looking alive while its dispatcher cannot renew).
pub async fn heartbeat(pool: &PgPool, id: Uuid) -> Result<(), sqlx::Error> {
    stamp(pool, id, "heartbeat_at").await
}

/// Records a graceful stop, so peers see it at once (no wait for the heartbeat to go stale) and
/// the next instance on the host may re-attach to the sandboxes it kept.
pub async fn record_stop(pool: &PgPool, id: Uuid) -> Result<(), sqlx::Error> {
    stamp(pool, id, "stopped_at").await
}

/// Sets the instance's timestamp `column` (the code's own name, never input) to now.
async fn stamp(pool: &PgPool, id: Uuid, column: &str) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE node_instances SET {column} = now() WHERE id = $1"
    ))
    .bind(id)
    .execute(pool)
    .await
    .map(|_| ())
}

/// Instances on `hostname` that stopped gracefully and left running sandboxes: a restart
/// re-attaches to those. Crashed instances (never marked stopped) are not among them; their
/// sandboxes are the reaper's, since their in-flight work is lost anyway.
pub async fn stopped_with_running_sandboxes(
    pool: &PgPool,
    hostname: &str,
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT DISTINCT s.instance_id FROM sandboxes s JOIN node_instances n ON n.id = s.instance_id \
         WHERE s.state = 'running' AND n.stopped_at IS NOT NULL AND n.hostname = $1",
    )
    .bind(hostname)
    .fetch_all(pool)
    .await
}

/// Where a live (not stopped) instance takes forwarded calls: `None` when it stopped or is
/// unknown, `Some(None)` when it runs without `cluster.listen` and so takes none.
pub async fn peer_url(pool: &PgPool, id: Uuid) -> Result<Option<Option<String>>, sqlx::Error> {
    let row: Option<(Option<String>,)> =
        sqlx::query_as("SELECT peer_url FROM node_instances WHERE id = $1 AND stopped_at IS NULL")
            .bind(id)
            .fetch_optional(pool)
            .await?;
    Ok(row.map(|(url,)| url))
}

/// Whether the instance is recorded as stopped (an unknown one is not).
pub async fn stopped(pool: &PgPool, id: Uuid) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM node_instances WHERE id = $1 AND stopped_at IS NOT NULL)",
    )
    .bind(id)
    .fetch_one(pool)
    .await
}
