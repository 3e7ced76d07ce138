//! Operator authentication: API keys that are random, shown once, and stored only as hashes.
//!
//! A key looks like `aok_<64 hex chars>` (256 random bits). The database keeps its SHA-256 and a
//! short prefix for listings. The first admin key comes from `ORCHESTRATOR_ADMIN_KEY` / `auth.admin_key`
//! when set; else from the key file `auth.admin_key_file` (generated into it at the first start
//! when the file is missing); otherwise, when no admin key exists at all, one is generated and
//! printed once.

pub mod key_cache;
pub mod key_file;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use aegis_core::caller::{Caller, Role};

/// Prefix of every key, so leaked keys are recognisable by secret scanners.
pub const KEY_PREFIX: &str = aegis_proto::API_KEY_PREFIX;

/// Why a key could not be used or managed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization: Bearer` header.
    #[error("missing `Authorization: Bearer <api key>` header")]
    Missing,
    /// The header is there but the key is unknown, revoked or expired.
    #[error("invalid API key: {0}")]
    Invalid(&'static str),
    /// A configured bootstrap key is malformed.
    #[error("the admin key from {origin} is unusable: {reason}")]
    BadBootstrapKey {
        /// Where it came from.
        origin: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The admin key file could not be read or written.
    #[error(transparent)]
    KeyFile(#[from] key_file::KeyFileError),
    /// The random generator failed.
    #[error("cannot generate a key: {0}")]
    Random(String),
    /// The key is bound to a security context that cannot be used (missing or invalid): the
    /// key is refused rather than let through unconfined.
    #[error("the key's security context `{name}` is unusable: {reason}")]
    ContextUnusable {
        /// The context's name.
        name: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// A key as listings show it (never the secret).
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct ApiKeyInfo {
    /// Key id.
    pub id: Uuid,
    /// Operator-chosen name.
    pub name: String,
    /// `admin`, `operator` or `readonly`.
    pub role: String,
    /// First characters of the key.
    pub key_prefix: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Expiry, if any.
    pub expires_at: Option<DateTime<Utc>>,
    /// Revocation time, if revoked.
    pub revoked_at: Option<DateTime<Utc>>,
    /// Last successful use.
    pub last_used_at: Option<DateTime<Utc>>,
    /// The security context the key is bound to (it then opens MCP sessions under it).
    pub security_context: Option<String>,
}

/// A freshly created key: the only time the secret is visible.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CreatedKey {
    /// Listing information.
    #[serde(flatten)]
    pub info: ApiKeyInfo,
    /// The secret; store it now, it cannot be shown again.
    pub key: String,
}

fn hash(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn generate() -> Result<String, AuthError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| AuthError::Random(e.to_string()))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{KEY_PREFIX}{hex}"))
}

/// Checks that a key has our shape (used for configured bootstrap keys).
fn check_shape(key: &str) -> Result<(), String> {
    let Some(rest) = key.strip_prefix(KEY_PREFIX) else {
        return Err(format!("it must start with `{KEY_PREFIX}`"));
    };
    if rest.len() < 32 || !rest.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "after `{KEY_PREFIX}` it needs at least 32 letters or digits (got {})",
            rest.len()
        ));
    }
    Ok(())
}

/// Creates a key and returns its secret once.
pub async fn create(
    pool: &PgPool,
    name: &str,
    role: Role,
    expires_at: Option<DateTime<Utc>>,
    security_context: Option<&str>,
) -> Result<CreatedKey, AuthError> {
    let key = generate()?;
    let info = insert(pool, name, role, expires_at, &key, security_context).await?;
    Ok(CreatedKey { info, key })
}

async fn insert(
    pool: &PgPool,
    name: &str,
    role: Role,
    expires_at: Option<DateTime<Utc>>,
    key: &str,
    security_context: Option<&str>,
) -> Result<ApiKeyInfo, AuthError> {
    Ok(sqlx::query_as(
        "INSERT INTO api_keys (id, name, role, key_hash, key_prefix, expires_at, security_context) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) \
         RETURNING id, name, role, key_prefix, created_at, expires_at, revoked_at, last_used_at, security_context",
    )
    .bind(Uuid::new_v4())
    .bind(name)
    .bind(role.as_str())
    .bind(hash(key))
    .bind(&key[..KEY_PREFIX.len() + 8])
    .bind(expires_at)
    .bind(security_context)
    .fetch_one(pool)
    .await?)
}

/// Every key, newest first.
pub async fn list(pool: &PgPool) -> Result<Vec<ApiKeyInfo>, AuthError> {
    Ok(sqlx::query_as(
        "SELECT id, name, role, key_prefix, created_at, expires_at, revoked_at, last_used_at, \
         security_context FROM api_keys ORDER BY created_at DESC",
    )
    .fetch_all(pool)
    .await?)
}

/// Revokes a key by id or by name; returns the revoked key, or None when nothing matched.
pub async fn revoke(pool: &PgPool, id_or_name: &str) -> Result<Option<ApiKeyInfo>, AuthError> {
    let id = Uuid::parse_str(id_or_name).ok();
    Ok(sqlx::query_as(
        "UPDATE api_keys SET revoked_at = now() \
         WHERE revoked_at IS NULL AND (id = $1 OR ($1 IS NULL AND name = $2)) \
         RETURNING id, name, role, key_prefix, created_at, expires_at, revoked_at, last_used_at, security_context",
    )
    .bind(id)
    .bind(id_or_name)
    .fetch_optional(pool)
    .await?)
}

/// id, name, role, expires_at, revoked_at, security_context of a key row.
type KeyRow = (
    Uuid,
    String,
    String,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<String>,
);

/// Resolves a presented key to its caller; unknown, revoked and expired keys are refused.
/// A key bound to a security context gets that context as its scope (and its tier as a
/// ceiling), so the key is confined on REST exactly as on `/mcp`; a bound key whose context is
/// missing is refused. A key the database accepted is remembered in `cache` (see
/// [`key_cache`] for why that is safe: an edit of the key or its context drops it).
pub async fn authenticate(
    pool: &PgPool,
    cache: &key_cache::KeyCache,
    presented: &str,
) -> Result<Caller, AuthError> {
    let hashed = hash(presented);
    if let Some(caller) = cache_hit(pool, cache.get(&hashed)) {
        return Ok(caller);
    }
    let seen = cache.generation();
    // `last_used_at` is refreshed at most every 30 s: updating the row on every request made
    // concurrent requests with one key queue on its row lock (and write WAL each time).
    let row: Option<KeyRow> = sqlx::query_as(
        "WITH k AS (SELECT id, name, role, expires_at, revoked_at, last_used_at, security_context \
             FROM api_keys WHERE key_hash = $1), \
         touched AS (UPDATE api_keys a SET last_used_at = now() FROM k WHERE a.id = k.id \
             AND (k.last_used_at IS NULL OR k.last_used_at < now() - interval '30 seconds')) \
         SELECT id, name, role, expires_at, revoked_at, security_context FROM k",
    )
    .bind(&hashed)
    .fetch_optional(pool)
    .await?;
    let Some((id, name, role, expires_at, revoked_at, security_context)) = row else {
        return Err(AuthError::Invalid("unknown key"));
    };
    live(revoked_at, expires_at)?;
    let role: Role = role
        .parse()
        .map_err(|_| AuthError::Invalid("the key has an unknown role"))?;
    let mut caller = Caller::operator(id, &name, role);
    if let Some(context_name) = &security_context {
        let context = crate::contexts::get(pool, &caller.tenant, context_name)
            .await
            .map_err(|e| match e {
                crate::contexts::ContextError::Db(db) => AuthError::Db(db),
                other => AuthError::ContextUnusable {
                    name: context_name.clone(),
                    reason: other.to_string(),
                },
            })?;
        caller.tier = caller.tier.min(context.tier);
        caller.seal = Some(aegis_core::caller::SealScope {
            context: std::sync::Arc::new(context),
            limiter: cache.limiter(),
            session_key: format!("key:{id}"),
            ceilings: Vec::new(),
        });
    }
    cache.put(
        seen,
        hashed,
        key_cache::Verified {
            value: caller.clone(),
            key_id: id,
            context: security_context,
            expires_at,
        },
    );
    Ok(caller)
}

/// The answer of a key the cache holds, its `last_used_at` refreshed in the background when
/// due; `None` on a miss (then the database decides). Both doors' authentications start so.
fn cache_hit<T>(pool: &PgPool, cached: key_cache::Cached<T>) -> Option<T> {
    let key_cache::Cached::Hit { value, touch } = cached else {
        return None;
    };
    touch_later(pool, touch);
    Some(value)
}

/// Refuses a key that was revoked or has expired, as both doors' authentications do.
fn live(
    revoked_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
) -> Result<(), AuthError> {
    if revoked_at.is_some() {
        return Err(AuthError::Invalid("the key was revoked"));
    }
    if expires_at.is_some_and(|t| t <= Utc::now()) {
        return Err(AuthError::Invalid("the key has expired"));
    }
    Ok(())
}

/// Refreshes a cached key's `last_used_at` in the background when it is due (`touch`).
fn touch_later(pool: &PgPool, touch: Option<Uuid>) {
    let Some(id) = touch else {
        return;
    };
    let pool = pool.clone();
    tokio::spawn(async move {
        let touched = sqlx::query("UPDATE api_keys SET last_used_at = now() WHERE id = $1")
            .bind(id)
            .execute(&pool)
            .await;
        if let Err(e) = touched {
            tracing::debug!(error = %e, key = %id, "cannot refresh last_used_at");
        }
    });
}

/// A live key bound to a security context, as the MCP endpoint uses it.
#[derive(Debug, Clone)]
pub struct BoundKey {
    /// Key id (the audit log's caller id for MCP calls).
    pub id: Uuid,
    /// Key name.
    pub name: String,
    /// The security context the key's MCP calls run under; None when the key is not bound.
    pub security_context: Option<String>,
    /// The version (a digest of the stored definition) of that context, read in the same
    /// statement so a caller may keep the parsed context cached; None when no such context.
    pub context_version: Option<String>,
}

/// Resolves a presented key for `/mcp`: unknown, revoked and expired keys are refused, like
/// `authenticate`; the caller decides what an unbound key may do (nothing, on `/mcp`). A key
/// bound to an existing context is remembered in `cache` with that context's version (an edit
/// of the context, or of the key, drops it: see [`key_cache`]).
pub async fn authenticate_bound(
    pool: &PgPool,
    cache: &key_cache::KeyCache,
    presented: &str,
) -> Result<BoundKey, AuthError> {
    let hashed = hash(presented);
    if let Some(key) = cache_hit(pool, cache.get_bound(&hashed)) {
        return Ok(key);
    }
    let seen = cache.generation();
    type Row = (
        Uuid,
        String,
        Option<DateTime<Utc>>,
        Option<DateTime<Utc>>,
        Option<String>,
        Option<String>,
    );
    // Like `authenticate`: `last_used_at` at most every 30 s, or every concurrent request of an
    // MCP client (one key, many calls in flight) queues on the key's row lock. The context's
    // version comes in the same round trip (the digest `contexts::get_versioned` gives).
    let row: Option<Row> = sqlx::query_as(
        "WITH k AS (SELECT id, name, expires_at, revoked_at, security_context, last_used_at \
             FROM api_keys WHERE key_hash = $1), \
         touched AS (UPDATE api_keys a SET last_used_at = now() FROM k WHERE a.id = k.id \
             AND (k.last_used_at IS NULL OR k.last_used_at < now() - interval '30 seconds')) \
         SELECT k.id, k.name, k.expires_at, k.revoked_at, k.security_context, \
             md5(c.definition::text) FROM k LEFT JOIN security_contexts c \
             ON c.tenant_id = $2 AND c.name = k.security_context",
    )
    .bind(&hashed)
    .bind(aegis_core::DEFAULT_TENANT)
    .fetch_optional(pool)
    .await?;
    let Some((id, name, expires_at, revoked_at, security_context, context_version)) = row else {
        return Err(AuthError::Invalid("unknown key"));
    };
    live(revoked_at, expires_at)?;
    let key = BoundKey {
        id,
        name,
        security_context,
        context_version,
    };
    // Only a key the endpoint will accept: bound, to a context that exists.
    if key.context_version.is_some() {
        cache.put_bound(
            seen,
            hashed,
            key_cache::Verified {
                value: key.clone(),
                key_id: id,
                context: key.security_context.clone(),
                expires_at,
            },
        );
    }
    Ok(key)
}

/// What start-up did about the first admin key.
#[derive(Debug, PartialEq, Eq)]
pub enum Bootstrap {
    /// The configured key was registered (or already was).
    Configured,
    /// An admin key already existed; nothing was generated.
    Existing,
    /// A key was generated; the caller must show it once.
    Generated(String),
    /// The key of the admin key file was registered (or already was).
    FromFile(std::path::PathBuf),
    /// No key file existed: a key was generated, written to it (0600) and registered.
    GeneratedToFile(std::path::PathBuf),
}

/// Like [`bootstrap`], with the key file as the second source: a configured key wins; else the
/// file's key is registered, or, when the file is missing, a new key is generated into it and
/// registered (deleting the file and restarting is how a lost compose key is replaced).
pub async fn bootstrap_with_file(
    pool: &PgPool,
    configured: Option<&str>,
    file: Option<&std::path::Path>,
) -> Result<Bootstrap, AuthError> {
    let (Some(path), None) = (file, configured) else {
        return bootstrap(pool, configured).await;
    };
    let (key, outcome) = match key_file::read(path)? {
        Some(key) => (key, Bootstrap::FromFile(path.to_owned())),
        None => (
            key_file::create(path, &generate()?)?,
            Bootstrap::GeneratedToFile(path.to_owned()),
        ),
    };
    register(pool, &key).await?;
    Ok(outcome)
}

/// Registers `key` as an admin key unless it is known already.
async fn register(pool: &PgPool, key: &str) -> Result<(), AuthError> {
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM api_keys WHERE key_hash = $1)")
            .bind(hash(key))
            .fetch_one(pool)
            .await?;
    if !exists {
        insert(pool, "bootstrap-admin", Role::Admin, None, key, None).await?;
    }
    Ok(())
}

/// Makes sure an admin can log in: registers the configured key, or generates one when none exists.
pub async fn bootstrap(pool: &PgPool, configured: Option<&str>) -> Result<Bootstrap, AuthError> {
    if let Some(key) = configured {
        check_shape(key).map_err(|reason| AuthError::BadBootstrapKey {
            origin: "ORCHESTRATOR_ADMIN_KEY / auth.admin_key",
            reason,
        })?;
        register(pool, key).await?;
        return Ok(Bootstrap::Configured);
    }
    let mut tx = pool.begin().await?;
    // Serialise concurrent first starts of several replicas.
    sqlx::query("SELECT pg_advisory_xact_lock(7311)")
        .execute(&mut *tx)
        .await?;
    let any_admin: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM api_keys WHERE role = 'admin' AND revoked_at IS NULL)",
    )
    .fetch_one(&mut *tx)
    .await?;
    if any_admin {
        return Ok(Bootstrap::Existing);
    }
    let key = generate()?;
    sqlx::query(
        "INSERT INTO api_keys (id, name, role, key_hash, key_prefix) VALUES ($1, 'bootstrap-admin', 'admin', $2, $3)",
    )
    .bind(Uuid::new_v4())
    .bind(hash(&key))
    .bind(&key[..KEY_PREFIX.len() + 8])
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Bootstrap::Generated(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_have_the_documented_shape() {
        let k = generate().unwrap();
        assert!(check_shape(&k).is_ok());
        assert_eq!(k.len(), KEY_PREFIX.len() + 64);
        assert_ne!(k, generate().unwrap());
    }

    #[test]
    fn malformed_bootstrap_keys_are_explained() {
        assert!(check_shape("secret").unwrap_err().contains("aok_"));
        assert!(check_shape("aok_short")
            .unwrap_err()
            .contains("at least 32"));
    }
}
