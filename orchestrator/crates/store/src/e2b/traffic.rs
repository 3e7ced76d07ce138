//! Who may open a port of an E2B sandbox (`aegis_e2b_door::ports`): its traffic access token;
//! none, its ports are public.

use sqlx::PgPool;
use uuid::Uuid;

/// Makes the sandbox of E2B id `id` private: its ports answer only requests carrying `token`.
pub async fn set_token(pool: &PgPool, id: Uuid, token: &str) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE e2b_sandboxes SET traffic_access_token = $2 WHERE e2b_id = $1")
        .bind(id)
        .bind(token)
        .execute(pool)
        .await
        .map(|_| ())
}

/// The traffic access token of the sandbox of E2B id `id` (`None`: public, or no such row).
pub async fn token(pool: &PgPool, id: Uuid) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT traffic_access_token FROM e2b_sandboxes WHERE e2b_id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await
        .map(Option::flatten)
}

/// A new traffic access token (what create answers for a private sandbox): 24 random bytes, hex.
pub fn new_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
