//! One-time attestation tokens: an operator's proof, handed to one workload, good for one session.
//!
//! A workload id alone proves nothing (any client can claim `docker://anything`). When a context
//! has no enrolment secret shared with its workloads, and is not open to unverified workloads, an
//! operator issues a token for it (`POST /v1/security-contexts/{name}/attestation-tokens` or
//! `orchestrator seal token issue`), optionally bound to one workload id, and passes it to the
//! workload out of band. The token is shown once, stored only as its SHA-256, expires, and is
//! redeemed atomically inside the transaction that creates the session: it works once and only
//! once, even under concurrent attempts, and a failed attestation does not burn it.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

/// Prefix of every token, so a leaked one is recognisable.
pub const TOKEN_PREFIX: &str = "aat_";

/// Longest lifetime an operator may give a token, seconds.
pub const MAX_TTL_SECS: i64 = 7 * 24 * 3600;

/// Lifetime when none is asked for, seconds.
pub const DEFAULT_TTL_SECS: i64 = 3600;

/// A token as listings show it (never the secret).
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct TokenInfo {
    /// Token id.
    pub id: Uuid,
    /// The context it admits into.
    pub context_name: String,
    /// The only workload that may use it, if bound.
    pub workload_id: Option<String>,
    /// First characters of the token.
    pub token_prefix: String,
    /// The API key that issued it.
    pub issued_by: String,
    /// Issue time.
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// When it was used, if it was.
    pub used_at: Option<DateTime<Utc>>,
    /// The workload that used it.
    pub used_by: Option<String>,
    /// The session it opened.
    pub session_id: Option<Uuid>,
}

/// A freshly issued token: the only time the secret is visible.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct IssuedToken {
    /// Listing information.
    #[serde(flatten)]
    pub info: TokenInfo,
    /// The token; hand it to the workload now, it cannot be shown again.
    pub token: String,
}

/// Why a token could not be issued or redeemed.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The lifetime asked for is out of range.
    #[error("ttl_secs must be between 1 and {MAX_TTL_SECS}")]
    BadTtl,
    /// The random generator failed.
    #[error("cannot generate a token: {0}")]
    Random(String),
    /// The token cannot be redeemed; the text says why.
    #[error("{0}")]
    Refused(String),
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

fn hash(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

const COLUMNS: &str = "id, context_name, workload_id, token_prefix, issued_by, created_at, \
    expires_at, used_at, used_by, session_id";

/// Issues a token for `context` (which the caller has checked exists).
pub async fn issue(
    pool: &PgPool,
    tenant: &str,
    context: &str,
    workload_id: Option<&str>,
    ttl_secs: Option<i64>,
    issued_by: &str,
) -> Result<IssuedToken, TokenError> {
    let ttl = ttl_secs.unwrap_or(DEFAULT_TTL_SECS);
    if !(1..=MAX_TTL_SECS).contains(&ttl) {
        return Err(TokenError::BadTtl);
    }
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).map_err(|e| TokenError::Random(e.to_string()))?;
    let token = format!(
        "{TOKEN_PREFIX}{}",
        raw.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    let info: TokenInfo = sqlx::query_as(&format!(
        "INSERT INTO seal_attestation_tokens (id, tenant_id, context_name, workload_id, token_hash, \
         token_prefix, issued_by, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, now() + make_interval(secs => $8)) RETURNING {COLUMNS}"
    ))
    .bind(Uuid::new_v4())
    .bind(tenant)
    .bind(context)
    .bind(workload_id)
    .bind(hash(&token))
    .bind(&token[..TOKEN_PREFIX.len() + 8])
    .bind(issued_by)
    .bind(ttl as f64)
    .fetch_one(pool)
    .await?;
    Ok(IssuedToken { info, token })
}

/// The tokens of a context, newest first.
pub async fn list(
    pool: &PgPool,
    tenant: &str,
    context: &str,
) -> Result<Vec<TokenInfo>, sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM seal_attestation_tokens WHERE tenant_id = $1 AND context_name = $2 \
         ORDER BY created_at DESC LIMIT 1000"
    ))
    .bind(tenant)
    .bind(context)
    .fetch_all(pool)
    .await
}

/// Redeems `token` for `context` and `workload` inside `tx` (the session's transaction), so the
/// token is spent exactly when the session is created. A refusal says why, without revealing
/// anything the holder of the token does not already know.
pub async fn redeem(
    tx: &mut Transaction<'_, Postgres>,
    tenant: &str,
    context: &str,
    workload: &str,
    token: &str,
    session: Uuid,
) -> Result<(), TokenError> {
    let token_hash = hash(token);
    let spent = sqlx::query(
        "UPDATE seal_attestation_tokens SET used_at = now(), used_by = $4, session_id = $5 \
         WHERE tenant_id = $1 AND token_hash = $2 AND context_name = $3 AND used_at IS NULL \
         AND expires_at > now() AND (workload_id IS NULL OR workload_id = $4)",
    )
    .bind(tenant)
    .bind(&token_hash)
    .bind(context)
    .bind(workload)
    .bind(session)
    .execute(&mut **tx)
    .await?;
    if spent.rows_affected() == 1 {
        return Ok(());
    }
    let found: Option<(String, Option<String>, bool, bool)> = sqlx::query_as(
        "SELECT context_name, workload_id, used_at IS NOT NULL, expires_at <= now() \
         FROM seal_attestation_tokens WHERE tenant_id = $1 AND token_hash = $2",
    )
    .bind(tenant)
    .bind(&token_hash)
    .fetch_optional(&mut **tx)
    .await?;
    let why = match found {
        None => "the attestation token is unknown".to_owned(),
        Some((_, _, true, _)) => "the attestation token was already used (tokens work once)".into(),
        Some((_, _, _, true)) => "the attestation token has expired".to_owned(),
        Some((ctx, _, _, _)) if ctx != context => {
            format!("the attestation token was not issued for security context `{context}`")
        }
        Some(_) => {
            format!("the attestation token was issued for another workload than `{workload}`")
        }
    };
    Err(TokenError::Refused(why))
}
