//! The MCP door's sessions as rows of `seal_sessions`: each MCP conversation that uses a
//! sandbox holds one, so the SEAL sessions' machinery (quotas, the sweeper of ended sessions)
//! owns its sandbox's life. The rows are created and revoked like any SEAL session's (the
//! gateway's `sessions`); what is the MCP door's own is keeping a row alive while its
//! conversation calls, which SEAL sessions never do (their lifetime is their token's).

use sqlx::PgPool;
use uuid::Uuid;

/// The sandbox of a live row (`Some(None)`: it has none yet; `None`: the row was revoked or
/// expired), pushing its expiry to `idle_secs` from now once a tenth of that has passed since
/// the last push: the calls of one conversation in flight together would otherwise queue on
/// the row's lock, so a conversation may end at most a tenth of `idle_secs` early.
pub async fn touch(
    pool: &PgPool,
    row: Uuid,
    idle_secs: u64,
) -> Result<Option<Option<Uuid>>, sqlx::Error> {
    sqlx::query_scalar(
        "WITH s AS (SELECT sandbox_id, expires_at FROM seal_sessions \
             WHERE id = $1 AND status = 'active' AND expires_at > now()), \
         t AS (UPDATE seal_sessions SET expires_at = now() + make_interval(secs => $2) \
             FROM s WHERE seal_sessions.id = $1 \
             AND s.expires_at < now() + make_interval(secs => $2 * 0.9)) \
         SELECT sandbox_id FROM s",
    )
    .bind(row)
    .bind(idle_secs as f64)
    .fetch_optional(pool)
    .await
}
