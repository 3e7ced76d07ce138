//! Preview URLs of our own sandboxes (`/v1/sandboxes/{id}/previews`, the port layer of
//! `aegis-e2b-door`): a random secret per sandbox and port, kept only as its SHA-256, with an
//! expiry and a revocation; the rows go when their sandbox ends (a trigger, see the migration).

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

/// The name of the query parameter and cookie a preview secret travels in.
pub const PARAM: &str = "aegis_preview";

/// A preview as listed: never its secret.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize, utoipa::ToSchema)]
pub struct Preview {
    /// The preview, for `DELETE /v1/sandboxes/{id}/previews/{preview_id}`.
    pub id: Uuid,
    /// The sandbox.
    pub sandbox_id: Uuid,
    /// The port it opens.
    pub port: i32,
    /// The key that made it, as which its connections are decided and audited.
    pub key_id: String,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When it stops opening the port.
    pub expires_at: DateTime<Utc>,
    /// When it was revoked (then it opens nothing).
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A new secret: 32 random bytes, hex (what the URL carries).
pub fn new_secret() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// What is stored and looked up for a secret.
pub fn digest(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// Records a preview of `port` of `sandbox` made by `key_id`, valid `ttl_secs` from now;
/// `None` when the sandbox is not running (an ended one's previews are gone with it).
pub async fn create(
    pool: &PgPool,
    sandbox: Uuid,
    port: u16,
    key_id: &str,
    secret: &str,
    ttl_secs: u32,
) -> Result<Option<Preview>, sqlx::Error> {
    sqlx::query_as(
        "INSERT INTO sandbox_previews (id, sandbox_id, port, secret_sha256, key_id, expires_at) \
         SELECT $1, s.id, $3, $4, $5, now() + make_interval(secs => $6) FROM sandboxes s \
         WHERE s.id = $2 AND s.state IN ('creating', 'running') \
         RETURNING id, sandbox_id, port, key_id, created_at, expires_at, revoked_at",
    )
    .bind(Uuid::new_v4())
    .bind(sandbox)
    .bind(i32::from(port))
    .bind(digest(secret))
    .bind(key_id)
    .bind(f64::from(ttl_secs))
    .fetch_optional(pool)
    .await
}

/// The previews of `sandbox`, newest first (expired and revoked ones included, marked so).
pub async fn list(pool: &PgPool, sandbox: Uuid) -> Result<Vec<Preview>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, sandbox_id, port, key_id, created_at, expires_at, revoked_at \
         FROM sandbox_previews WHERE sandbox_id = $1 ORDER BY created_at DESC, id",
    )
    .bind(sandbox)
    .fetch_all(pool)
    .await
}

/// Revokes preview `id` of `sandbox`; `false` when there is no such preview of that sandbox.
pub async fn revoke(pool: &PgPool, sandbox: Uuid, id: Uuid) -> Result<bool, sqlx::Error> {
    sqlx::query(
        "UPDATE sandbox_previews SET revoked_at = coalesce(revoked_at, now()) \
         WHERE id = $1 AND sandbox_id = $2",
    )
    .bind(id)
    .bind(sandbox)
    .execute(pool)
    .await
    .map(|r| r.rows_affected() == 1)
}

/// The preview a secret names, with its key, as the port layer needs it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct PreviewTarget {
    /// The preview.
    pub id: Uuid,
    /// Its sandbox.
    pub sandbox_id: Uuid,
    /// Its port.
    pub port: i32,
    /// Not expired and not revoked.
    pub live: bool,
    /// The sandbox is running.
    pub running: bool,
    /// The key that made it.
    pub key_id: Uuid,
    /// Its name.
    pub key_name: String,
    /// Its role.
    pub key_role: String,
    /// Revoked or expired: the preview opens nothing.
    pub key_unusable: bool,
    /// Its security context, when bound.
    pub key_context: Option<String>,
}

/// The preview whose secret is `secret`, if any (whatever its state: the caller tells why not).
pub async fn by_secret(pool: &PgPool, secret: &str) -> Result<Option<PreviewTarget>, sqlx::Error> {
    sqlx::query_as(
        "SELECT p.id, p.sandbox_id, p.port, \
         (p.revoked_at IS NULL AND p.expires_at > now()) AS live, \
         s.state = 'running' AS running, \
         k.id AS key_id, k.name AS key_name, k.role AS key_role, \
         (k.revoked_at IS NOT NULL OR coalesce(k.expires_at <= now(), false)) AS key_unusable, \
         k.security_context AS key_context \
         FROM sandbox_previews p JOIN sandboxes s ON s.id = p.sandbox_id \
         JOIN api_keys k ON k.id::text = p.key_id \
         WHERE p.secret_sha256 = $1",
    )
    .bind(digest(secret))
    .fetch_optional(pool)
    .await
}

/// Whether preview `id` still opens its port (a kept connection asks before each request, so
/// a revocation or the expiry takes effect on the next request).
pub async fn still_live(pool: &PgPool, id: Uuid) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sandbox_previews \
         WHERE id = $1 AND revoked_at IS NULL AND expires_at > now())",
    )
    .bind(id)
    .fetch_one(pool)
    .await
}

/// Whether `sandbox` is a running sandbox of our own doors (REST, agents, SEAL): not an E2B
/// one (by either of its ids) and not a warm pool's. Its ports open only with a preview, so
/// the port layer answers a request without one 403 saying so, rather than "not found".
pub async fn is_own_running(pool: &PgPool, sandbox: Uuid) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sandboxes s WHERE s.id = $1 AND s.state = 'running' \
         AND s.owner_kind <> 'pool' AND NOT EXISTS (SELECT 1 FROM e2b_sandboxes e \
         WHERE e.sandbox_id = s.id OR e.e2b_id = s.id))",
    )
    .bind(sandbox)
    .fetch_one(pool)
    .await
}
