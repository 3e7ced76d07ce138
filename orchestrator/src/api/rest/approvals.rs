//! `/v1/approvals`: operators list the privileged calls waiting for a decision and approve or
//! reject them. Read-only keys may list them but never see their arguments.

use std::time::Instant;

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;

use super::auth::{require, Call, Need};
use super::error::{ApiError, ErrorBody};
use crate::approvals::{self, Approval, Decision, DecisionError};
use crate::audit;
use crate::caller::{Caller, Role};
use crate::state::AppState;

impl From<DecisionError> for ApiError {
    fn from(e: DecisionError) -> Self {
        match e {
            DecisionError::NotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", e.to_string())
            }
            DecisionError::Closed { .. } => {
                ApiError::new(StatusCode::CONFLICT, "approval_closed", e.to_string())
            }
            DecisionError::OwnCall { .. } => {
                ApiError::new(StatusCode::FORBIDDEN, "own_call", e.to_string())
            }
            DecisionError::Db(e) => ApiError::internal(e),
        }
    }
}

fn may_see_arguments(caller: &Caller) -> bool {
    caller.role.is_some_and(Role::may_write)
}

/// Who asked for a call that waits.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApprovalCaller {
    /// `session`, `execution`, ...
    pub kind: String,
    /// Session or execution id.
    pub id: String,
    /// The caller's label (context or agent name).
    pub label: String,
}

/// An approval request as the caller's role may see it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApprovalView {
    /// Request id.
    pub id: Uuid,
    /// The tool the caller wants to run.
    pub tool: String,
    /// Its arguments while pending; null once decided, and always for read-only keys.
    #[schema(value_type = Option<Object>)]
    pub arguments: Option<Value>,
    /// SHA-256 of the arguments (as in the audit log).
    pub args_digest: String,
    /// Who asked.
    pub caller: ApprovalCaller,
    /// The security context that asks for approval.
    pub security_context: Option<String>,
    /// `pending`, `approved`, `rejected` or `timed_out` (a pending request past its deadline).
    pub state: String,
    /// When the call asked.
    pub created_at: DateTime<Utc>,
    /// When it stops waiting.
    pub expires_at: DateTime<Utc>,
    /// When decided.
    pub decided_at: Option<DateTime<Utc>>,
    /// The API key that decided.
    pub decided_by: Option<String>,
    /// The operator's note.
    pub note: Option<String>,
}

impl ApprovalView {
    /// The request as a caller sees it: the arguments only when `may_see_arguments`.
    fn of(a: &Approval, may_see_arguments: bool) -> Self {
        ApprovalView {
            id: a.id,
            tool: a.tool.clone(),
            arguments: may_see_arguments.then(|| a.arguments.clone()).flatten(),
            args_digest: a.args_digest.clone(),
            caller: ApprovalCaller {
                kind: a.caller_kind.clone(),
                id: a.caller_id.clone(),
                label: a.caller_label.clone(),
            },
            security_context: a.security_context.clone(),
            state: a.state(Utc::now()).to_owned(),
            created_at: a.created_at,
            expires_at: a.expires_at,
            decided_at: a.decided_at,
            decided_by: a.decided_by.clone(),
            note: a.decision_note.clone(),
        }
    }
}

/// `?all=true` includes decided and timed-out requests.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ListQuery {
    /// Include closed requests.
    #[serde(default)]
    pub all: bool,
}

/// Approval requests (pending ones unless `?all=true`), newest first.
#[utoipa::path(get, path = "/v1/approvals", operation_id = "list_approvals", tag = "approvals", params(ListQuery),
    responses((status = 200, description = "Requests", body = Vec<ApprovalView>)), security(("api_key" = [])))]
pub async fn list(
    Call { state, caller }: Call,
    Query(q): Query<ListQuery>,
) -> Result<Json<Vec<ApprovalView>>, ApiError> {
    let rows = approvals::list(&state.pool, &caller.tenant, !q.all).await?;
    let show = may_see_arguments(&caller);
    Ok(Json(
        rows.iter().map(|a| ApprovalView::of(a, show)).collect(),
    ))
}

/// One approval request.
#[utoipa::path(get, path = "/v1/approvals/{id}", operation_id = "get_approval", tag = "approvals",
    params(("id" = Uuid, Path, description = "Request id")),
    responses((status = 200, description = "Request", body = ApprovalView), (status = 404, description = "Unknown", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn get(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
) -> Result<Json<ApprovalView>, ApiError> {
    let a = approvals::get(&state.pool, &caller.tenant, id)
        .await?
        .ok_or(DecisionError::NotFound(id))?;
    Ok(Json(ApprovalView::of(&a, may_see_arguments(&caller))))
}

/// Body of approve / reject.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// Why (shown to the caller on rejection, kept with the request).
    #[serde(default)]
    pub note: Option<String>,
}

async fn decide(
    state: &AppState,
    caller: &Caller,
    id: Uuid,
    decision: Decision,
    body: Option<Json<DecisionBody>>,
) -> Result<Json<ApprovalView>, ApiError> {
    require(caller, Need::Write)?;
    let started = Instant::now();
    let note = body.and_then(|Json(b)| b.note).filter(|n| !n.is_empty());
    if note.as_ref().is_some_and(|n| n.len() > 1000) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            "note: at most 1000 bytes",
        ));
    }
    let decided = approvals::decide(
        &state.pool,
        &caller.tenant,
        id,
        decision,
        caller,
        note.as_deref(),
    )
    .await;
    audit::record_admin(
        &state.pool,
        caller,
        match decision {
            Decision::Approve => "approval.approve",
            Decision::Reject => "approval.reject",
        },
        &json!({"approval_id": id, "note": note}),
        decided.is_ok(),
        started,
    )
    .await?;
    Ok(Json(ApprovalView::of(&decided?, true)))
}

/// Lets a waiting call run.
#[utoipa::path(post, path = "/v1/approvals/{id}/approve", operation_id = "approve_call", tag = "approvals",
    params(("id" = Uuid, Path, description = "Request id")), request_body = DecisionBody,
    responses((status = 200, description = "Approved", body = ApprovalView), (status = 404, description = "Unknown", body = ErrorBody),
              (status = 409, description = "Already decided or timed out", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn approve(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
    body: Option<Json<DecisionBody>>,
) -> Result<Json<ApprovalView>, ApiError> {
    decide(&state, &caller, id, Decision::Approve, body).await
}

/// Refuses a waiting call.
#[utoipa::path(post, path = "/v1/approvals/{id}/reject", operation_id = "reject_call", tag = "approvals",
    params(("id" = Uuid, Path, description = "Request id")), request_body = DecisionBody,
    responses((status = 200, description = "Rejected", body = ApprovalView), (status = 404, description = "Unknown", body = ErrorBody),
              (status = 409, description = "Already decided or timed out", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn reject(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
    body: Option<Json<DecisionBody>>,
) -> Result<Json<ApprovalView>, ApiError> {
    decide(&state, &caller, id, Decision::Reject, body).await
}
