//! Security contexts in PostgreSQL (storage layer): loaded from the node config at start,
//! managed by operators, read by the gateway, API-key auth, sandboxes, executions and workflows.
//!
//! A context's definition is stored whole (JSONB) and parsed with the same strict rules as the
//! config file, so a context that reached the database is always a valid one.

use serde_json::Value;
use sqlx::PgPool;

use aegis_seal::context::SecurityContext;

/// Why a context could not be stored or read.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    /// The definition is not a valid security context.
    #[error("invalid security context: {0}")]
    Invalid(String),
    /// No context by that name.
    #[error("security context `{0}` not found")]
    NotFound(String),
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Parses and validates a definition.
pub fn parse(definition: &Value) -> Result<SecurityContext, ContextError> {
    let ctx: SecurityContext = serde_json::from_value(definition.clone())
        .map_err(|e| ContextError::Invalid(e.to_string()))?;
    ctx.validate()
        .map_err(|e| ContextError::Invalid(e.to_string()))?;
    Ok(ctx)
}

/// Inserts or replaces a context.
pub async fn upsert(
    pool: &PgPool,
    tenant: &str,
    ctx: &SecurityContext,
    source: &str,
) -> Result<(), ContextError> {
    let definition = serde_json::to_value(ctx).map_err(|e| ContextError::Invalid(e.to_string()))?;
    sqlx::query(
        "INSERT INTO security_contexts (tenant_id, name, definition, source) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (tenant_id, name) DO UPDATE SET definition = EXCLUDED.definition, \
         source = EXCLUDED.source, updated_at = now()",
    )
    .bind(tenant)
    .bind(&ctx.name)
    .bind(definition)
    .bind(source)
    .execute(pool)
    .await?;
    Ok(())
}

/// One context by name.
pub async fn get(pool: &PgPool, tenant: &str, name: &str) -> Result<SecurityContext, ContextError> {
    let row: Option<Value> = sqlx::query_scalar(
        "SELECT definition FROM security_contexts WHERE tenant_id = $1 AND name = $2",
    )
    .bind(tenant)
    .bind(name)
    .fetch_optional(pool)
    .await?;
    parse(&row.ok_or_else(|| ContextError::NotFound(name.to_owned()))?)
}

/// One context by name with the version the gateway's session admission reports (a digest of its
/// stored definition), so a cached copy can be checked for staleness.
pub async fn get_versioned(
    pool: &PgPool,
    tenant: &str,
    name: &str,
) -> Result<(SecurityContext, String), ContextError> {
    let row: Option<(Value, String)> = sqlx::query_as(
        "SELECT definition, md5(definition::text) FROM security_contexts WHERE tenant_id = $1 AND name = $2",
    )
    .bind(tenant)
    .bind(name)
    .fetch_optional(pool)
    .await?;
    let (definition, version) = row.ok_or_else(|| ContextError::NotFound(name.to_owned()))?;
    Ok((parse(&definition)?, version))
}

/// Every context, by name.
pub async fn list(pool: &PgPool, tenant: &str) -> Result<Vec<SecurityContext>, ContextError> {
    let rows: Vec<Value> = sqlx::query_scalar(
        "SELECT definition FROM security_contexts WHERE tenant_id = $1 ORDER BY name",
    )
    .bind(tenant)
    .fetch_all(pool)
    .await?;
    rows.iter().map(parse).collect()
}

/// Removes a context; live sessions under it stop working (their context is gone).
pub async fn delete(pool: &PgPool, tenant: &str, name: &str) -> Result<(), ContextError> {
    let done = sqlx::query("DELETE FROM security_contexts WHERE tenant_id = $1 AND name = $2")
        .bind(tenant)
        .bind(name)
        .execute(pool)
        .await?;
    if done.rows_affected() == 0 {
        return Err(ContextError::NotFound(name.to_owned()));
    }
    Ok(())
}
