//! The rows of E2B sandboxes (`e2b_sandboxes`, beside the dispatcher's `sandboxes` row): what
//! the control API reports, who owns each sandbox, its envd token and its deadline; and the
//! sweep that kills a sandbox whose deadline passed.
//!
//! A row is inserted only after its sandbox runs and deleted when it is killed; every read
//! joins the dispatcher's row and sees only running sandboxes, so a sandbox the reaper removed
//! is never reported (its row goes with the `sandboxes` row, `ON DELETE CASCADE`, or with the
//! next sweep).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use dispatcher::SandboxId;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::state::AppState;

/// How often the sweep looks for sandboxes past their deadline.
pub const SWEEP_EVERY: Duration = Duration::from_secs(2);
/// Most sandboxes one sweep kills (the next sweep takes the rest).
const SWEEP_BATCH: i64 = 64;

/// One E2B sandbox as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Row {
    pub sandbox_id: Uuid,
    pub owner_key_id: String,
    pub template_id: String,
    pub metadata: sqlx::types::Json<BTreeMap<String, String>>,
    pub allow_internet_access: Option<bool>,
    pub envd_access_token: Option<String>,
    pub started_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
}

const COLUMNS: &str = "e.sandbox_id, e.owner_key_id, e.template_id, e.metadata, \
     e.allow_internet_access, e.envd_access_token, e.started_at, e.end_at";

/// What a new row records.
pub struct NewRow<'a> {
    pub sandbox_id: SandboxId,
    pub tenant: &'a str,
    pub owner_key_id: &'a str,
    pub template_id: &'a str,
    pub metadata: &'a BTreeMap<String, String>,
    /// `envVars`: the environment every command of the sandbox starts with.
    pub env_vars: &'a BTreeMap<String, String>,
    pub allow_internet_access: Option<bool>,
    pub envd_access_token: &'a str,
    pub timeout_secs: u32,
}

/// Records a running sandbox.
pub async fn insert(pool: &PgPool, row: &NewRow<'_>) -> Result<Row, sqlx::Error> {
    sqlx::query_as(&format!(
        "INSERT INTO e2b_sandboxes AS e (sandbox_id, tenant_id, owner_key_id, template_id, metadata, \
         allow_internet_access, envd_access_token, end_at, env_vars) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, now() + make_interval(secs => $8), $9) RETURNING {COLUMNS}"
    ))
    .bind(row.sandbox_id.0)
    .bind(row.tenant)
    .bind(row.owner_key_id)
    .bind(row.template_id)
    .bind(sqlx::types::Json(row.metadata))
    .bind(row.allow_internet_access)
    .bind(row.envd_access_token)
    .bind(f64::from(row.timeout_secs))
    .bind(sqlx::types::Json(row.env_vars))
    .fetch_one(pool)
    .await
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
         WHERE e.sandbox_id = $1 AND e.owner_key_id = $2 AND s.state = 'running'"
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
    let (at, id) = match after {
        Some((at, id)) => (Some(at), Some(id)),
        None => (None, None),
    };
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM e2b_sandboxes e JOIN sandboxes s ON s.id = e.sandbox_id \
         WHERE e.owner_key_id = $1 AND s.state = 'running' \
         AND ($2::timestamptz IS NULL OR (e.started_at, e.sandbox_id::text) > ($2, $3)) \
         ORDER BY e.started_at, e.sandbox_id LIMIT $4"
    ))
    .bind(owner_key_id)
    .bind(at)
    .bind(id)
    .bind(limit)
    .fetch_all(pool)
    .await
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
         AND e.sandbox_id = $1 AND e.owner_key_id = $2 RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(owner_key_id)
    .bind(f64::from(secs))
    .bind(extend_only)
    .fetch_optional(pool)
    .await
}

/// Deletes a row (after its sandbox was destroyed, or when its create failed).
pub async fn delete(pool: &PgPool, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM e2b_sandboxes WHERE sandbox_id = $1")
        .bind(id)
        .execute(pool)
        .await
        .map(|_| ())
}

/// What an envd call needs of its sandbox: the owner key's row, the sandbox's token and its
/// environment.
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
}

/// The running sandbox `id` with its owner key, in one statement. A sandbox past its deadline
/// is not running any more (the sweep ends it within [`SWEEP_EVERY`]), so it is not found.
pub async fn envd_target(pool: &PgPool, id: Uuid) -> Result<Option<EnvdTarget>, sqlx::Error> {
    sqlx::query_as(
        "SELECT e.sandbox_id, e.envd_access_token, e.env_vars, k.id AS key_id, k.name AS key_name, \
         k.role AS key_role, k.revoked_at IS NOT NULL AS key_revoked, \
         coalesce(k.expires_at <= now(), false) AS key_expired, k.security_context AS key_context \
         FROM e2b_sandboxes e JOIN sandboxes s ON s.id = e.sandbox_id \
         JOIN api_keys k ON k.id::text = e.owner_key_id \
         WHERE e.sandbox_id = $1 AND s.state = 'running' AND e.end_at > now()",
    )
    .bind(id)
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
        "SELECT e.sandbox_id, e.envd_access_token FROM e2b_sandboxes e \
         JOIN sandboxes s ON s.id = e.sandbox_id \
         WHERE s.state = 'running' AND e.envd_access_token IS NOT NULL \
         ORDER BY e.started_at DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// How long a sweep's claim on a due sandbox lasts: another sweep (of any replica) retries
/// it after this if the first could not destroy it.
const CLAIM_SECS: f64 = 60.0;

/// Kills the sandboxes whose deadline passed and forgets rows whose sandbox is gone. A due
/// row is claimed by moving its deadline [`CLAIM_SECS`] ahead (`FOR UPDATE SKIP LOCKED`, so
/// two replicas never take the same one), its sandbox destroyed, and only then the row
/// deleted: a destroy that fails is retried by a later sweep, never forgotten.
pub async fn sweep(state: &AppState) -> Result<usize, sqlx::Error> {
    let due: Vec<(Uuid,)> = sqlx::query_as(
        "UPDATE e2b_sandboxes SET end_at = now() + make_interval(secs => $2) WHERE sandbox_id IN ( \
             SELECT e.sandbox_id FROM e2b_sandboxes e LEFT JOIN sandboxes s ON s.id = e.sandbox_id \
             WHERE e.end_at <= now() OR s.state IS NULL OR s.state NOT IN ('creating', 'running') \
             ORDER BY e.end_at LIMIT $1 FOR UPDATE OF e SKIP LOCKED) \
         RETURNING sandbox_id",
    )
    .bind(SWEEP_BATCH)
    .bind(CLAIM_SECS)
    .fetch_all(&state.pool)
    .await?;
    let mut ended = 0;
    for (id,) in &due {
        let sandbox = SandboxId(*id);
        let started = std::time::Instant::now();
        match state.sandboxes.destroy(sandbox).await {
            Ok(()) => {
                tracing::info!(sandbox = %id, "E2B sandbox ended: its timeout passed");
                // The node ended it, not a caller: one admin row by the system says so.
                let _ = crate::audit::record_admin(
                    &state.pool,
                    &crate::caller::Caller::system(),
                    "e2b.sandbox.timeout",
                    &serde_json::json!({"sandbox_id": id}),
                    true,
                    started,
                )
                .await;
            }
            Err(crate::sandboxes::SandboxError::Dispatch(
                dispatcher::DispatchError::SandboxNotFound { .. },
            )) => {}
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "could not end an E2B sandbox past its timeout; the next sweep retries");
                continue;
            }
        }
        delete(&state.pool, *id).await?;
        ended += 1;
    }
    Ok(ended)
}

/// Runs [`sweep`] every [`SWEEP_EVERY`] until `shutdown`.
pub async fn sweep_periodically(state: AppState, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(SWEEP_EVERY) => {}
        }
        if let Err(e) = sweep(&state).await {
            tracing::warn!(error = %e, "could not sweep E2B sandboxes past their timeout");
        }
    }
}
