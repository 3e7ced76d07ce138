//! `/v1/audit` (filtered, paginated rows) and `/v1/audit/verify` (recompute the hash chain).

use axum::extract::{Query, State};
use axum::{Extension, Json};
use serde::Serialize;

use super::error::ApiError;
use crate::audit::{self, AuditRow, Verification};
use crate::caller::Caller;
use crate::state::AppState;

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
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<audit::Query>,
) -> Result<Json<AuditPage>, ApiError> {
    let limit = q.limit.unwrap_or(100).clamp(1, 500);
    let rows = audit::list(&state.pool, &caller.tenant, &q).await?;
    let next_after = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|r| r.seq))
        .flatten();
    Ok(Json(AuditPage { rows, next_after }))
}

/// Recomputes the chain and names the first row that does not match.
#[utoipa::path(get, path = "/v1/audit/verify", operation_id = "verify_audit", tag = "audit",
    responses((status = 200, description = "Verification", body = Verification)), security(("api_key" = [])))]
pub async fn verify(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Verification>, ApiError> {
    Ok(Json(audit::verify(&state.pool, &caller.tenant).await?))
}
