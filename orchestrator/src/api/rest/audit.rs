//! `/v1/audit` (filtered, paginated rows), `/v1/audit/head` (the anchor to publish) and
//! `/v1/audit/verify` (recompute the hash chain; admin only).

use axum::extract::Query;
use axum::Json;
use serde::Serialize;

use super::auth::{require, Call, Need};
use super::error::{ApiError, ErrorBody};
use crate::audit::{self, Anchor, AuditRow, Head, Verification};

/// A page of audit rows.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AuditPage {
    /// Rows, oldest first.
    pub rows: Vec<AuditRow>,
    /// Pass as `after` to get the next page; absent on the last page.
    pub next_after: Option<i64>,
}

/// Audit rows matching the filters.
#[utoipa::path(get, path = "/v1/audit", operation_id = "list_audit", tag = "audit", params(audit::Query),
    responses((status = 200, description = "Rows", body = AuditPage)), security(("api_key" = [])))]
pub async fn list(
    Call { state, caller }: Call,
    Query(q): Query<audit::Query>,
) -> Result<Json<AuditPage>, ApiError> {
    let limit = q.limit.unwrap_or(100).clamp(1, 500);
    let rows = audit::list(&state.pool, &caller.tenant, &q).await?;
    let next_after = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|r| r.seq))
        .flatten();
    Ok(Json(AuditPage { rows, next_after }))
}

/// The chain's head: its row count and last hash. Record it somewhere the database's users
/// cannot write; `GET /v1/audit/verify?anchor_count=..&anchor_hash=..` later proves that no row
/// up to it was removed.
#[utoipa::path(get, path = "/v1/audit/head", operation_id = "audit_head", tag = "audit",
    responses((status = 200, description = "Head", body = Head)), security(("api_key" = [])))]
pub async fn head(Call { state, caller }: Call) -> Result<Json<Head>, ApiError> {
    Ok(Json(audit::head(&state.pool, &caller.tenant).await?))
}

/// Recomputes the chain from the last checkpoint (or from the first row with `full=true`),
/// checks an anchor if one is given, and names the first problem. Admin only.
#[utoipa::path(get, path = "/v1/audit/verify", operation_id = "verify_audit", tag = "audit", params(Anchor),
    responses((status = 200, description = "Verification", body = Verification),
              (status = 400, description = "Half an anchor", body = ErrorBody),
              (status = 403, description = "Not an admin key", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn verify(
    Call { state, caller }: Call,
    Query(anchor): Query<Anchor>,
) -> Result<Json<Verification>, ApiError> {
    require(&caller, Need::Admin)?;
    Ok(Json(
        audit::verify(&state.pool, &caller.tenant, &anchor).await?,
    ))
}
