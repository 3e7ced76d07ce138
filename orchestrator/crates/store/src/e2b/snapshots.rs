//! The rows of E2B snapshots (`e2b_snapshots`): a sandbox's files as one archive, owned by a
//! key, counted against its quota and expiring. The door captures, restores and sweeps them;
//! here they are only read and written, the quota checked under a lock of the key so that two
//! snapshots taken at once cannot pass it together.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// A snapshot's row, without its archive.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Snapshot {
    pub id: Uuid,
    pub owner_key_id: String,
    /// `snapshot` (a client's) or `pause` (a paused sandbox's files).
    pub kind: String,
    pub source_sandbox: Uuid,
    pub template_id: String,
    pub runtime: String,
    pub name: Option<String>,
    pub bytes: i64,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// A pause that kept memory: the archive is empty, the paused sandbox's checkpoint (the
    /// dispatcher's sandbox its E2B row names) is what it keeps, `bytes` its memory.
    pub keeps_memory: bool,
}

const COLUMNS: &str = "id, owner_key_id, kind, source_sandbox, template_id, runtime, name, \
     bytes, created_at, expires_at, keeps_memory";

/// What a key holds now: snapshots and their bytes (expired ones not counted).
pub async fn held(conn: &mut PgConnection, key: &str) -> Result<(u64, u64), sqlx::Error> {
    let (count, bytes): (i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(bytes), 0)::bigint FROM e2b_snapshots \
         WHERE owner_key_id = $1 AND expires_at > now()",
    )
    .bind(key)
    .fetch_one(conn)
    .await?;
    Ok((count.max(0) as u64, bytes.max(0) as u64))
}

/// A snapshot to store.
pub struct NewSnapshot<'a> {
    pub tenant: &'a str,
    pub owner_key_id: &'a str,
    pub pause: bool,
    pub source_sandbox: Uuid,
    pub template_id: &'a str,
    pub runtime: &'a str,
    pub name: Option<&'a str>,
    pub archive: &'a [u8],
    /// A pause that keeps memory: the memory its checkpoint holds, counted as its bytes (the
    /// archive is then empty). `None`: a snapshot of files.
    pub checkpoint: Option<u64>,
}

/// The bounds a key's snapshots are stored within.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_count: u64,
    pub max_bytes: u64,
    pub ttl_secs: u64,
}

/// A snapshot that would take its key past its limits: what the key held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverQuota {
    pub count: u64,
    pub bytes: u64,
}

/// Stores a snapshot in `tx` when the key stays within `limits` (counted under a transaction
/// lock of the key), else says what the key holds.
pub async fn insert(
    tx: &mut PgConnection,
    new: &NewSnapshot<'_>,
    limits: Limits,
) -> Result<Result<Snapshot, OverQuota>, sqlx::Error> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('e2b-snapshots:' || $1, 0))")
        .bind(new.owner_key_id)
        .execute(&mut *tx)
        .await?;
    let (count, bytes) = held(&mut *tx, new.owner_key_id).await?;
    let size = (new.archive.len() as u64).saturating_add(new.checkpoint.unwrap_or(0));
    if count + 1 > limits.max_count || bytes.saturating_add(size) > limits.max_bytes {
        return Ok(Err(OverQuota { count, bytes }));
    }
    let row = sqlx::query_as(&format!(
        "INSERT INTO e2b_snapshots (id, tenant_id, owner_key_id, kind, source_sandbox, template_id, \
         runtime, name, archive, bytes, expires_at, keeps_memory) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now() + make_interval(secs => $11), $12) \
         RETURNING {COLUMNS}"
    ))
    .bind(Uuid::new_v4())
    .bind(new.tenant)
    .bind(new.owner_key_id)
    .bind(if new.pause { "pause" } else { "snapshot" })
    .bind(new.source_sandbox)
    .bind(new.template_id)
    .bind(new.runtime)
    .bind(new.name)
    .bind(new.archive)
    .bind(size as i64)
    .bind(limits.ttl_secs as f64)
    .bind(new.checkpoint.is_some())
    .fetch_one(&mut *tx)
    .await?;
    Ok(Ok(row))
}

/// A snapshot of `key` named by its id or its name (the newest of that name), not expired;
/// `pause` snapshots are never named by a client.
pub async fn find(
    pool: &PgPool,
    key: &str,
    id_or_name: &str,
) -> Result<Option<Snapshot>, sqlx::Error> {
    let id = Uuid::parse_str(id_or_name).ok();
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM e2b_snapshots WHERE owner_key_id = $1 AND kind = 'snapshot' \
         AND expires_at > now() AND (id = $2 OR name = $3) ORDER BY created_at DESC LIMIT 1"
    ))
    .bind(key)
    .bind(id)
    .bind(id_or_name)
    .fetch_optional(pool)
    .await
}

/// Snapshot `id`, whoever owns it and whatever its kind (a paused sandbox's, found from its row).
pub async fn get(pool: &PgPool, id: Uuid) -> Result<Option<Snapshot>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM e2b_snapshots WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await
}

/// The size of snapshot `id`'s archive, to reserve memory before loading it.
pub async fn archive_size(pool: &PgPool, id: Uuid) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT bytes FROM e2b_snapshots WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
}

/// Snapshot `id`'s archive.
pub async fn archive(pool: &PgPool, id: Uuid) -> Result<Option<Vec<u8>>, sqlx::Error> {
    sqlx::query_scalar("SELECT archive FROM e2b_snapshots WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
}

/// A page of `key`'s snapshots, newest first, after `(at, id)` when given.
pub async fn list(
    pool: &PgPool,
    key: &str,
    source: Option<Uuid>,
    name: Option<&str>,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<Vec<Snapshot>, sqlx::Error> {
    let (at, after_id) = after.unzip();
    let name_id = name.and_then(|n| Uuid::parse_str(n).ok());
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM e2b_snapshots WHERE owner_key_id = $1 AND kind = 'snapshot' \
         AND expires_at > now() AND ($2::uuid IS NULL OR source_sandbox = $2) \
         AND ($3::text IS NULL OR name = $3 OR id = $4) \
         AND ($5::timestamptz IS NULL OR (created_at, id) < ($5::timestamptz, $6::uuid)) \
         ORDER BY created_at DESC, id DESC LIMIT $7"
    ))
    .bind(key)
    .bind(source)
    .bind(name)
    .bind(name_id)
    .bind(at)
    .bind(after_id)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Deletes a snapshot of `key` (a listed one); false when it has none of that id.
pub async fn delete_owned(pool: &PgPool, key: &str, id: Uuid) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "DELETE FROM e2b_snapshots WHERE id = $1 AND owner_key_id = $2 AND kind = 'snapshot'",
    )
    .bind(id)
    .bind(key)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Deletes snapshot `id` (a paused sandbox's, once it resumed or was killed).
pub async fn delete(pool: &PgPool, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM e2b_snapshots WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .map(|_| ())
}

/// Deletes up to `batch` expired snapshots (a paused sandbox whose snapshot expired goes with
/// it, by the foreign key; `SKIP LOCKED`, so replicas sweeping at once take different ones),
/// and says which: `(id, kind)`.
pub async fn delete_expired(pool: &PgPool, batch: i64) -> Result<Vec<(Uuid, String)>, sqlx::Error> {
    sqlx::query_as(
        "DELETE FROM e2b_snapshots WHERE id IN (SELECT id FROM e2b_snapshots \
         WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
         RETURNING id, kind",
    )
    .bind(batch)
    .fetch_all(pool)
    .await
}
