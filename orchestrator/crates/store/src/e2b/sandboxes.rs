//! The rows of E2B sandboxes (`e2b_sandboxes`, beside the dispatcher's `sandboxes` row): what
//! the control API reports, who owns each sandbox, its envd token and its deadline (the sweep
//! that acts on the deadline is the E2B door's `timeouts`).
//!
//! A row is inserted only after its sandbox runs and deleted when it is killed; every read
//! joins the dispatcher's row and sees only running sandboxes, so a sandbox the reaper removed
//! is never reported (its row goes with the `sandboxes` row, `ON DELETE CASCADE`, or with the
//! next sweep). The exception is a paused sandbox (`paused_snapshot` set): its dispatcher
//! sandbox is gone and its files are a snapshot (`e2b_snapshots`); only the reads that say
//! so see it. The id clients see is `e2b_id`, stable across a pause and a resume; `sandbox_id`
//! is the dispatcher's sandbox serving it now (a new one after each resume).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

/// One E2B sandbox as stored. `sandbox_id` is the id clients see (`e2b_id`); `current` the
/// dispatcher's sandbox behind it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Row {
    pub sandbox_id: Uuid,
    pub current: Uuid,
    /// Set while the sandbox is paused: the snapshot it resumes from.
    pub paused_snapshot: Option<Uuid>,
    pub owner_key_id: String,
    pub template_id: String,
    pub metadata: sqlx::types::Json<BTreeMap<String, String>>,
    /// `envVars`: the environment every command starts with (kept across pause and fork).
    pub env_vars: sqlx::types::Json<BTreeMap<String, String>>,
    pub allow_internet_access: Option<bool>,
    pub envd_access_token: Option<String>,
    pub started_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    /// The tenant of its owner key (a pause's snapshot is charged there).
    pub tenant: String,
    /// Whether its timeout pauses it (`autoPause`) rather than kills it.
    pub pause_on_timeout: bool,
    /// Whether that pause keeps memory where the sandbox's class can (false:
    /// `autoPauseMemory: false`, its files only).
    pub pause_keeps_memory: bool,
    /// A private sandbox's traffic access token (`traffic`); `None`: its ports are public.
    pub traffic_access_token: Option<String>,
    /// Its own egress rules (`aegis_sandboxes::e2b_egress::NetworkRules` as JSON); `None`: it
    /// has no network.
    pub egress: Option<sqlx::types::Json<serde_json::Value>>,
    /// `autoResume`: a request to one of its ports while it is paused resumes it.
    pub auto_resume: bool,
    /// `network.maskRequestHost`: the `Host` its servers see (`${PORT}`: the port).
    pub mask_request_host: Option<String>,
}

impl Row {
    /// The state E2B reports: paused once its pause snapshot is stored, and also from the
    /// moment a timeout that pauses it passed (the sweep is taking the snapshot; envd already
    /// refuses it, as [`envd_target`] serves no sandbox past its deadline).
    pub fn paused(&self) -> bool {
        self.paused_snapshot.is_some() || (self.pause_on_timeout && self.end_at <= Utc::now())
    }
}

const COLUMNS: &str = "e.e2b_id AS sandbox_id, e.sandbox_id AS current, e.paused_snapshot, e.owner_key_id, e.template_id, e.metadata, \
     e.env_vars, e.allow_internet_access, e.envd_access_token, e.started_at, e.end_at, e.tenant_id AS tenant, \
     e.on_timeout = 'pause' AS pause_on_timeout, e.pause_keeps_memory, e.traffic_access_token, e.egress, e.auto_resume, e.mask_request_host";

/// What a new row records.
pub struct NewRow<'a> {
    /// The dispatcher's sandbox (its id is also the id clients see, `e2b_id`).
    pub sandbox_id: Uuid,
    pub tenant: &'a str,
    pub owner_key_id: &'a str,
    pub template_id: &'a str,
    pub metadata: &'a BTreeMap<String, String>,
    /// `envVars`: the environment every command of the sandbox starts with.
    pub env_vars: &'a BTreeMap<String, String>,
    pub allow_internet_access: Option<bool>,
    pub envd_access_token: &'a str,
    pub timeout_secs: u32,
    /// Its timeout pauses it (`autoPause`) rather than kills it.
    pub pause_on_timeout: bool,
    /// That pause keeps memory where the class can (`autoPauseMemory` not false).
    pub pause_keeps_memory: bool,
    /// Its own egress rules when it has a network.
    pub egress: Option<&'a serde_json::Value>,
    /// `autoResume`: traffic to its ports resumes it when paused.
    pub auto_resume: bool,
    /// `network.maskRequestHost`.
    pub mask_request_host: Option<&'a str>,
}

/// Records a running sandbox.
pub async fn insert(pool: &PgPool, row: &NewRow<'_>) -> Result<Row, sqlx::Error> {
    sqlx::query_as(&format!(
        "INSERT INTO e2b_sandboxes AS e (sandbox_id, e2b_id, tenant_id, owner_key_id, template_id, metadata, \
         allow_internet_access, envd_access_token, end_at, env_vars, on_timeout, egress, auto_resume, \
         mask_request_host, pause_keeps_memory) \
         VALUES ($1, $1, $2, $3, $4, $5, $6, $7, now() + make_interval(secs => $8), $9, \
         CASE WHEN $10 THEN 'pause' ELSE 'kill' END, $11, $12, $13, $14) RETURNING {COLUMNS}"
    ))
    .bind(row.sandbox_id)
    .bind(row.tenant)
    .bind(row.owner_key_id)
    .bind(row.template_id)
    .bind(sqlx::types::Json(row.metadata))
    .bind(row.allow_internet_access)
    .bind(row.envd_access_token)
    .bind(f64::from(row.timeout_secs))
    .bind(sqlx::types::Json(row.env_vars))
    .bind(row.pause_on_timeout)
    .bind(row.egress.map(sqlx::types::Json))
    .bind(row.auto_resume)
    .bind(row.mask_request_host)
    .bind(row.pause_keeps_memory)
    .fetch_one(pool)
    .await
}

/// The owner key and egress rules of the E2B sandbox whose current container is `current`
/// (the dispatcher's id), read by its egress proxy for every connection; `None`: no such row.
pub async fn egress_of(
    pool: &PgPool,
    current: Uuid,
) -> Result<Option<(String, Option<sqlx::types::Json<serde_json::Value>>)>, sqlx::Error> {
    sqlx::query_as("SELECT owner_key_id, egress FROM e2b_sandboxes WHERE sandbox_id = $1")
        .bind(current)
        .fetch_optional(pool)
        .await
}

/// Replaces the egress rules of the E2B sandbox `id` of `owner_key_id` that has a network;
/// false when there is no such sandbox with a network.
pub async fn set_egress(
    pool: &PgPool,
    id: Uuid,
    owner_key_id: &str,
    rules: &serde_json::Value,
) -> Result<bool, sqlx::Error> {
    sqlx::query(
        "UPDATE e2b_sandboxes SET egress = $3 \
         WHERE e2b_id = $1 AND owner_key_id = $2 AND egress IS NOT NULL",
    )
    .bind(id)
    .bind(owner_key_id)
    .bind(sqlx::types::Json(rules))
    .execute(pool)
    .await
    .map(|done| done.rows_affected() == 1)
}

/// The running sandbox `id` if `owner_key_id` owns it. Another key's sandbox is "not found":
/// its existence is not told.
pub async fn get_owned(
    pool: &PgPool,
    id: Uuid,
    owner_key_id: &str,
) -> Result<Option<Row>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM e2b_sandboxes e JOIN sandboxes s ON s.id = e.sandbox_id \
         WHERE e.e2b_id = $1 AND e.owner_key_id = $2 AND s.state = 'running' \
         AND e.paused_snapshot IS NULL"
    ))
    .bind(id)
    .bind(owner_key_id)
    .fetch_optional(pool)
    .await
}

/// The running sandboxes of a key, oldest first, after `(after_at, after_id)` when given; at
/// most `limit`.
pub async fn list_owned(
    pool: &PgPool,
    owner_key_id: &str,
    after: Option<(DateTime<Utc>, String)>,
    limit: i64,
) -> Result<Vec<Row>, sqlx::Error> {
    let (at, id) = after.unzip();
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM e2b_sandboxes e JOIN sandboxes s ON s.id = e.sandbox_id \
         WHERE e.owner_key_id = $1 AND s.state = 'running' AND e.paused_snapshot IS NULL \
         AND ($2::timestamptz IS NULL OR (e.started_at, e.e2b_id::text) > ($2, $3)) \
         ORDER BY e.started_at, e.e2b_id LIMIT $4"
    ))
    .bind(owner_key_id)
    .bind(at)
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Sets what the timeout of a key's sandbox does: pause it (`autoPause`) or kill it. Returns
/// whether the key owns such a sandbox.
pub async fn set_on_timeout(
    pool: &PgPool,
    id: Uuid,
    owner_key_id: &str,
    pause: bool,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE e2b_sandboxes SET on_timeout = CASE WHEN $3 THEN 'pause' ELSE 'kill' END \
         WHERE e2b_id = $1 AND owner_key_id = $2",
    )
    .bind(id)
    .bind(owner_key_id)
    .bind(pause)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Sets the deadline of a key's sandbox to `secs` from now; with `extend_only`, only when that
/// is later than the current one. Returns the row, or None when the key owns no such sandbox.
pub async fn set_deadline(
    pool: &PgPool,
    id: Uuid,
    owner_key_id: &str,
    secs: u32,
    extend_only: bool,
) -> Result<Option<Row>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE e2b_sandboxes e SET end_at = CASE WHEN $4 THEN greatest(e.end_at, now() + make_interval(secs => $3)) \
             ELSE now() + make_interval(secs => $3) END \
         FROM sandboxes s WHERE s.id = e.sandbox_id AND s.state = 'running' \
         AND e.paused_snapshot IS NULL AND e.e2b_id = $1 AND e.owner_key_id = $2 RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(owner_key_id)
    .bind(f64::from(secs))
    .bind(extend_only)
    .fetch_optional(pool)
    .await
}

/// The sandbox `id` of `owner_key_id`, running or paused (see [`Row::paused_snapshot`]; a
/// sandbox being paused with its memory is `checkpointed` before its pause is stored).
pub async fn get_known(
    pool: &PgPool,
    id: Uuid,
    owner_key_id: &str,
) -> Result<Option<Row>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM e2b_sandboxes e JOIN sandboxes s ON s.id = e.sandbox_id \
         WHERE e.e2b_id = $1 AND e.owner_key_id = $2 \
         AND (e.paused_snapshot IS NOT NULL OR s.state IN ('running', 'checkpointed'))"
    ))
    .bind(id)
    .bind(owner_key_id)
    .fetch_optional(pool)
    .await
}

/// The paused sandboxes of a key, oldest first; at most `limit`.
pub async fn list_paused(
    pool: &PgPool,
    owner_key_id: &str,
    limit: i64,
) -> Result<Vec<Row>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM e2b_sandboxes e JOIN sandboxes s ON s.id = e.sandbox_id \
         WHERE e.owner_key_id = $1 AND e.paused_snapshot IS NOT NULL \
         ORDER BY e.started_at, e.e2b_id LIMIT $2"
    ))
    .bind(owner_key_id)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Marks a running sandbox paused on `snapshot` (in the transaction that stored it). False when
/// it was not running any more (killed or paused meanwhile).
pub async fn set_paused(
    tx: &mut sqlx::PgConnection,
    id: Uuid,
    snapshot: Uuid,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE e2b_sandboxes SET paused_snapshot = $2 WHERE e2b_id = $1 AND paused_snapshot IS NULL",
    )
    .bind(id)
    .bind(snapshot)
    .execute(tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Locks the row of a running sandbox for its pause (in the transaction that stores the pause).
/// With `due`, a pause at its timeout: only a row whose timeout pauses it and passed, skipped
/// when another sweep holds it. False when there is no such row to pause.
pub async fn lock_for_pause(
    tx: &mut sqlx::PgConnection,
    id: Uuid,
    due: bool,
) -> Result<bool, sqlx::Error> {
    let locked: Option<Uuid> = sqlx::query_scalar(if due {
        "SELECT e2b_id FROM e2b_sandboxes WHERE e2b_id = $1 AND paused_snapshot IS NULL \
         AND on_timeout = 'pause' AND end_at <= now() FOR UPDATE SKIP LOCKED"
    } else {
        "SELECT e2b_id FROM e2b_sandboxes WHERE e2b_id = $1 AND paused_snapshot IS NULL FOR UPDATE"
    })
    .bind(id)
    .fetch_optional(tx)
    .await?;
    Ok(locked.is_some())
}

/// Waits until no pause holds the row of `id` ([`lock_for_pause`] keeps it locked while it
/// checkpoints or captures the sandbox, seconds under gVisor): a resume or a wake that came
/// meanwhile then reads the pause it must undo, never the half-paused row. Immediate otherwise.
pub async fn wait_for_pause(pool: &PgPool, id: Uuid) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT 1 FROM e2b_sandboxes WHERE e2b_id = $1 FOR SHARE")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// Running sandboxes whose timeout passed and pauses them, oldest deadline first; at most
/// `limit`.
pub async fn due_for_pause(pool: &PgPool, limit: i64) -> Result<Vec<Row>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM e2b_sandboxes e JOIN sandboxes s ON s.id = e.sandbox_id \
         WHERE e.paused_snapshot IS NULL AND e.on_timeout = 'pause' AND e.end_at <= now() \
         AND s.state = 'running' ORDER BY e.end_at LIMIT $1"
    ))
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Makes a sandbox's timeout kill it (its pause failed), for the next [`sweep`].
pub async fn kill_on_timeout(pool: &PgPool, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE e2b_sandboxes SET on_timeout = 'kill' WHERE e2b_id = $1")
        .bind(id)
        .execute(pool)
        .await
        .map(|_| ())
}

/// Points a paused sandbox at the sandbox that now serves it, running again for `timeout_secs`.
/// None when it was not paused on `snapshot` any more (another resume won).
pub async fn set_resumed(
    pool: &PgPool,
    id: Uuid,
    snapshot: Uuid,
    current: Uuid,
    timeout_secs: u32,
) -> Result<Option<Row>, sqlx::Error> {
    sqlx::query_as(&format!(
        "UPDATE e2b_sandboxes AS e SET sandbox_id = $3, paused_snapshot = NULL, \
         end_at = now() + make_interval(secs => $4) \
         WHERE e.e2b_id = $1 AND e.paused_snapshot = $2 RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(snapshot)
    .bind(current)
    .bind(f64::from(timeout_secs))
    .fetch_optional(pool)
    .await
}

/// One line of a sandbox's log (`GET /v2/sandboxes/{id}/logs`); a failure to write it is
/// logged, never the caller's error.
pub async fn log(pool: &PgPool, id: Uuid, level: &str, message: &str, fields: serde_json::Value) {
    let written = sqlx::query(
        "INSERT INTO e2b_sandbox_logs (e2b_id, level, message, fields) VALUES ($1, $2, $3, $4)",
    )
    .bind(id)
    .bind(level)
    .bind(message)
    .bind(fields)
    .execute(pool)
    .await;
    if let Err(e) = written {
        tracing::warn!(sandbox = %id, error = %e, "could not write an E2B sandbox log line");
    }
}

/// One stored log line.
#[derive(Debug, sqlx::FromRow)]
pub struct LogLine {
    pub at: DateTime<Utc>,
    pub level: String,
    pub message: String,
    pub fields: sqlx::types::Json<BTreeMap<String, String>>,
}

/// The log lines of sandbox `id` from `from` on (or up to it, `backward`), at most `limit`.
pub async fn logs(
    pool: &PgPool,
    id: Uuid,
    from: Option<DateTime<Utc>>,
    backward: bool,
    limit: i64,
) -> Result<Vec<LogLine>, sqlx::Error> {
    sqlx::query_as(
        "SELECT at, level, message, fields FROM e2b_sandbox_logs WHERE e2b_id = $1 \
         AND ($2::timestamptz IS NULL OR (CASE WHEN $3 THEN at <= $2 ELSE at >= $2 END)) \
         ORDER BY CASE WHEN $3 THEN -extract(epoch FROM at) ELSE extract(epoch FROM at) END, seq \
         LIMIT $4",
    )
    .bind(id)
    .bind(from)
    .bind(backward)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Deletes a row by its E2B id (after its sandbox was destroyed, or when its create failed).
pub async fn delete(pool: &PgPool, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM e2b_sandboxes WHERE e2b_id = $1")
        .bind(id)
        .execute(pool)
        .await
        .map(|_| ())
}

/// What an envd call needs of its sandbox: the owner key's row, the sandbox's token and its
/// environment, and whether it serves envd now. `sandbox_id` is the dispatcher's sandbox
/// serving the E2B id asked for.
#[derive(Debug, sqlx::FromRow)]
pub struct EnvdTarget {
    pub sandbox_id: Uuid,
    pub envd_access_token: Option<String>,
    pub env_vars: sqlx::types::Json<BTreeMap<String, String>>,
    pub key_id: Uuid,
    pub key_name: String,
    pub key_role: String,
    pub key_revoked: bool,
    pub key_expired: bool,
    pub key_context: Option<String>,
    /// Running, not paused, and before its deadline (a sandbox past it is not running any
    /// more: the sweep ends or pauses it within [`SWEEP_EVERY`]).
    pub serving: bool,
    /// Paused, or being paused (its timeout pauses it and passed): a connect resumes it.
    pub paused: bool,
    /// `autoResume`: a request to one of its ports resumes it when paused.
    pub auto_resume: bool,
    /// `network.maskRequestHost`: the `Host` its servers see (`${PORT}`: the port).
    pub mask_request_host: Option<String>,
    /// Its requests may run as root (the dispatcher's recorded spec: asked for, gVisor class).
    pub root_allowed: bool,
    /// Its isolation class as recorded (`container`, `gvisor`), for the refusal of root.
    pub isolation: String,
}

/// The sandbox of E2B id `id` with its owner key, in one statement: running, paused, or past
/// its deadline and not yet swept (see [`EnvdTarget::serving`]).
pub async fn envd_target(pool: &PgPool, id: Uuid) -> Result<Option<EnvdTarget>, sqlx::Error> {
    sqlx::query_as(
        "SELECT e.sandbox_id, e.envd_access_token, e.env_vars, k.id AS key_id, k.name AS key_name, \
         k.role AS key_role, k.revoked_at IS NOT NULL AS key_revoked, \
         coalesce(k.expires_at <= now(), false) AS key_expired, k.security_context AS key_context, \
         (s.state = 'running' AND e.paused_snapshot IS NULL AND e.end_at > now()) AS serving, \
         (e.paused_snapshot IS NOT NULL OR (e.on_timeout = 'pause' AND e.end_at <= now())) AS paused, \
         e.auto_resume, e.mask_request_host, \
         coalesce((s.spec->>'allow_root')::boolean, false) AS root_allowed, \
         coalesce(s.spec->>'isolation', 'container') AS isolation \
         FROM e2b_sandboxes e JOIN sandboxes s ON s.id = e.sandbox_id \
         JOIN api_keys k ON k.id::text = e.owner_key_id \
         WHERE e.e2b_id = $1 AND (e.paused_snapshot IS NOT NULL \
                                  OR s.state IN ('running', 'checkpointed'))",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
}

/// Whether the dispatcher's sandbox `sandbox_id` may run as root (its recorded spec: asked for,
/// gVisor class) and its isolation class; `None`: no such sandbox.
pub async fn root_of(
    pool: &PgPool,
    sandbox_id: Uuid,
) -> Result<Option<(bool, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT coalesce((spec->>'allow_root')::boolean, false), \
         coalesce(spec->>'isolation', 'container') FROM sandboxes WHERE id = $1",
    )
    .bind(sandbox_id)
    .fetch_optional(pool)
    .await
}

/// The running sandboxes that carry an envd token, for a signed `/files` URL that names none
/// (it is checked against each; bounded).
pub async fn secure_sandboxes(
    pool: &PgPool,
    limit: i64,
) -> Result<Vec<(Uuid, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT e.e2b_id, e.envd_access_token FROM e2b_sandboxes e \
         JOIN sandboxes s ON s.id = e.sandbox_id \
         WHERE s.state = 'running' AND e.envd_access_token IS NOT NULL AND e.paused_snapshot IS NULL \
         ORDER BY e.started_at DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Claims up to `batch` rows due for the timeout sweep (the E2B door's timeout sweep) for
/// `claim_secs` (their deadline moved that far ahead; `FOR UPDATE SKIP LOCKED`, so two replicas
/// never take the same one): a running sandbox whose timeout kills it and whose deadline
/// passed, a row whose sandbox is gone, and a paused row whose old sandbox still runs (not
/// one paused with its memory: its sandbox is the same one, running again while it resumes). Each is
/// `(e2b_id, the dispatcher's sandbox, paused)`.
pub async fn claim_due(
    pool: &PgPool,
    batch: i64,
    claim_secs: f64,
) -> Result<Vec<(Uuid, Uuid, bool)>, sqlx::Error> {
    sqlx::query_as(
        "UPDATE e2b_sandboxes SET end_at = now() + make_interval(secs => $2) WHERE e2b_id IN ( \
             SELECT e.e2b_id FROM e2b_sandboxes e LEFT JOIN sandboxes s ON s.id = e.sandbox_id \
             WHERE (e.paused_snapshot IS NULL AND ((e.end_at <= now() AND e.on_timeout = 'kill') \
                    OR s.state IS NULL OR s.state NOT IN ('creating', 'running'))) \
                OR (e.paused_snapshot IS NOT NULL AND s.state IN ('creating', 'running') \
                    AND NOT EXISTS (SELECT 1 FROM e2b_snapshots p \
                                    WHERE p.id = e.paused_snapshot AND p.keeps_memory)) \
             ORDER BY e.end_at LIMIT $1 FOR UPDATE OF e SKIP LOCKED) \
         RETURNING e2b_id, sandbox_id, paused_snapshot IS NOT NULL",
    )
    .bind(batch)
    .bind(claim_secs)
    .fetch_all(pool)
    .await
}

/// Up to `batch` checkpointed dispatcher sandboxes (a pause that kept memory) that no E2B row
/// names any more: their pause expired (the row went with its snapshot) or a kill was cut
/// short. The door's sweep destroys them, with their checkpoints. A pause under way cannot be
/// one: its row names the sandbox throughout.
pub async fn orphaned_checkpoints(pool: &PgPool, batch: i64) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT s.id FROM sandboxes s WHERE s.state = 'checkpointed' \
         AND NOT EXISTS (SELECT 1 FROM e2b_sandboxes e WHERE e.sandbox_id = s.id) LIMIT $1",
    )
    .bind(batch)
    .fetch_all(pool)
    .await
}

/// How long an `Idempotency-Key` is remembered (E2B keeps them a day).
pub const IDEMPOTENCY_HOURS: i32 = 24;

/// What an `Idempotency-Key` of a v2 create found.
#[derive(Debug)]
pub enum Claim {
    /// Nobody used it: this create runs, and records its answer with [`answer_claim`].
    New,
    /// A create with it made this sandbox: its answer, again.
    Done(serde_json::Value),
    /// A create with it is running now.
    Running,
    /// It was used with another body.
    Mismatch,
}

/// Claims `key` for a create by `owner` with a body of `digest`; forgets claims older than
/// [`IDEMPOTENCY_HOURS`] first.
pub async fn claim(
    pool: &PgPool,
    owner: &str,
    key: &str,
    digest: &str,
) -> Result<Claim, sqlx::Error> {
    sqlx::query(
        "DELETE FROM e2b_idempotency WHERE owner_key_id = $1 \
         AND created_at < now() - make_interval(hours => $2)",
    )
    .bind(owner)
    .bind(IDEMPOTENCY_HOURS)
    .execute(pool)
    .await?;
    let inserted = sqlx::query(
        "INSERT INTO e2b_idempotency (owner_key_id, idempotency_key, body_digest) \
         VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
    )
    .bind(owner)
    .bind(key)
    .bind(digest)
    .execute(pool)
    .await?;
    if inserted.rows_affected() == 1 {
        return Ok(Claim::New);
    }
    let found: Option<(String, Option<serde_json::Value>)> = sqlx::query_as(
        "SELECT body_digest, answer FROM e2b_idempotency \
         WHERE owner_key_id = $1 AND idempotency_key = $2",
    )
    .bind(owner)
    .bind(key)
    .fetch_optional(pool)
    .await?;
    Ok(match found {
        // Forgotten between the two statements: as if running (the client retries).
        None => Claim::Running,
        Some((d, _)) if d != digest => Claim::Mismatch,
        Some((_, Some(answer))) => Claim::Done(answer),
        Some((_, None)) => Claim::Running,
    })
}

/// Records the answer of the create that holds the claim.
pub async fn answer_claim(
    pool: &PgPool,
    owner: &str,
    key: &str,
    answer: &serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE e2b_idempotency SET answer = $3 WHERE owner_key_id = $1 AND idempotency_key = $2",
    )
    .bind(owner)
    .bind(key)
    .bind(answer)
    .execute(pool)
    .await
    .map(|_| ())
}

/// Gives up a claim whose create failed, so a retry may try again.
pub async fn release_claim(pool: &PgPool, owner: &str, key: &str) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM e2b_idempotency WHERE owner_key_id = $1 AND idempotency_key = $2")
        .bind(owner)
        .bind(key)
        .execute(pool)
        .await
        .map(|_| ())
}
