//! The console's sessions (`console_sessions`): a browser signed in with an API key, found by
//! the hash of the secret its cookie holds, with the key sealed by that secret. The console
//! decides and seals; these functions only read and write the rows.

use sqlx::PgPool;
use uuid::Uuid;

/// A session to record.
pub struct NewSession<'a> {
    pub id: Uuid,
    pub tenant: &'a str,
    /// The hash of the cookie's secret, by which the session is found.
    pub token_hash: &'a str,
    pub api_key_id: Uuid,
    /// The key, sealed by the cookie's secret.
    pub key_sealed: &'a [u8],
    pub lifetime_secs: i64,
}

/// Forgets sessions that ended (expired or revoked) more than a day ago, so the table holds
/// only what could be live.
pub async fn forget_ended(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query(
        "DELETE FROM console_sessions WHERE expires_at < now() - interval '1 day' \
         OR revoked_at < now() - interval '1 day'",
    )
    .execute(pool)
    .await
    .map(|_| ())
}

/// Records a session.
pub async fn insert(pool: &PgPool, s: &NewSession<'_>) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO console_sessions (id, tenant_id, token_hash, api_key_id, key_sealed, expires_at) \
         VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))",
    )
    .bind(s.id)
    .bind(s.tenant)
    .bind(s.token_hash)
    .bind(s.api_key_id)
    .bind(s.key_sealed)
    .bind(s.lifetime_secs as f64)
    .execute(pool)
    .await
    .map(|_| ())
}

/// The live session of `token_hash` (not revoked, not expired): its id and sealed key.
pub async fn find_live(
    pool: &PgPool,
    token_hash: &str,
) -> Result<Option<(Uuid, Vec<u8>)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, key_sealed FROM console_sessions \
         WHERE token_hash = $1 AND revoked_at IS NULL AND expires_at > now()",
    )
    .bind(token_hash)
    .fetch_optional(pool)
    .await
}

/// Marks a session revoked.
pub async fn revoke(pool: &PgPool, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE console_sessions SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL",
    )
    .bind(id)
    .execute(pool)
    .await
    .map(|_| ())
}
