//! The chain's head, published so that removing the newest rows is detectable.
//!
//! No hash inside the database can reveal that the last rows were deleted: what remains is still
//! a valid chain. So the head (chain position and hash of the last row) leaves the database: it
//! is served by `GET /v1/audit/head` for operators to record, and written to the service log at
//! start and periodically (logs are shipped elsewhere). A later `GET /v1/audit/verify` with that
//! position and hash proves the row is still there.

use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::GENESIS;

/// The last row of a tenant's chain.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Head {
    /// Rows in the chain (the chain position of the last row); 0 when empty.
    pub count: i64,
    /// Hash of the last row (the genesis hash when empty).
    pub head_hash: String,
    /// Sequence number of the last row.
    pub head_seq: Option<i64>,
    /// When the last row was recorded.
    pub at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The head of `tenant`'s chain.
pub async fn head(pool: &PgPool, tenant: &str) -> Result<Head, sqlx::Error> {
    let last: Option<(i64, Option<i64>, String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT seq, chain_index, hash, at FROM audit_log WHERE tenant_id = $1 ORDER BY tenant_id DESC, seq DESC LIMIT 1",
    )
    .bind(tenant)
    .fetch_optional(pool)
    .await?;
    Ok(match last {
        None => Head {
            count: 0,
            head_hash: GENESIS.to_owned(),
            head_seq: None,
            at: None,
        },
        Some((seq, index, hash, at)) => {
            let count = match index {
                Some(i) => i,
                None => {
                    sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE tenant_id = $1")
                        .bind(tenant)
                        .fetch_one(pool)
                        .await?
                }
            };
            Head {
                count,
                head_hash: hash,
                head_seq: Some(seq),
                at: Some(at),
            }
        }
    })
}

/// Logs every tenant's head at start and then every `every`, until `shutdown`.
pub async fn log_head_periodically(pool: PgPool, every: Duration, shutdown: CancellationToken) {
    loop {
        let tenants: Result<Vec<String>, _> =
            sqlx::query_scalar("SELECT id FROM tenants ORDER BY id")
                .fetch_all(&pool)
                .await;
        match tenants {
            Ok(tenants) => {
                for tenant in tenants {
                    match head(&pool, &tenant).await {
                        Ok(h) => tracing::info!(
                            tenant = %tenant, count = h.count, head_hash = %h.head_hash,
                            head_seq = h.head_seq.unwrap_or_default(), "audit chain head"
                        ),
                        Err(e) => {
                            tracing::warn!(tenant = %tenant, error = %e, "audit chain head unavailable")
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "audit chain head unavailable"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
