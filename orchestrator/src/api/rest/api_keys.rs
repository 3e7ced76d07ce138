//! `/v1/api-keys`: create (secret shown once), list, revoke. Admin only; every change audited.

use std::time::Instant;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;

use super::auth::{require, Call, Need};
use super::error::{ApiError, ErrorBody};
use crate::audit;
use crate::auth::{self, ApiKeyInfo, CreatedKey};
use crate::caller::Role;

/// Body of `POST /v1/api-keys`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    /// A name to recognise the key by.
    pub name: String,
    /// `admin`, `operator` or `readonly`.
    pub role: Role,
    /// Optional expiry (RFC 3339).
    pub expires_at: Option<DateTime<Utc>>,
    /// Binds the key to this security context: the key then opens MCP sessions (`/mcp`) whose
    /// tools and calls the context decides, with a sandbox of the context's runtime.
    #[serde(default)]
    pub security_context: Option<String>,
}

/// Creates a key; the response holds the secret, which is never shown again.
#[utoipa::path(post, path = "/v1/api-keys", operation_id = "create_api_key", tag = "api-keys", request_body = CreateKey,
    responses((status = 201, description = "Created", body = CreatedKey), (status = 403, description = "Not an admin", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn create(
    Call { state, caller }: Call,
    Json(req): Json<CreateKey>,
) -> Result<(StatusCode, Json<CreatedKey>), ApiError> {
    require(&caller, Need::Admin)?;
    let started = Instant::now();
    if req.name.trim().is_empty() || req.name.len() > 100 {
        return Err(ApiError::bad_request("`name` must be 1 to 100 characters"));
    }
    if req.expires_at.is_some_and(|t| t <= Utc::now()) {
        return Err(ApiError::bad_request("`expires_at` is in the past"));
    }
    if let Some(context) = &req.security_context {
        crate::contexts::get(&state.pool, crate::DEFAULT_TENANT, context)
            .await
            .map_err(|e| match e {
                crate::contexts::ContextError::NotFound(_) => ApiError::bad_request(format!(
                    "`security_context`: no security context `{context}` exists"
                )),
                other => ApiError::internal(other),
            })?;
    }
    let created = auth::create(
        &state.pool,
        &req.name,
        req.role,
        req.expires_at,
        req.security_context.as_deref(),
    )
    .await?;
    audit::record_admin(
        &state.pool,
        &caller,
        "api_key.create",
        &json!({"name": req.name, "role": req.role, "id": created.info.id, "security_context": req.security_context}),
        true,
        started,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Every key (never the secrets).
#[utoipa::path(get, path = "/v1/api-keys", operation_id = "list_api_keys", tag = "api-keys",
    responses((status = 200, description = "Keys", body = Vec<ApiKeyInfo>)), security(("api_key" = [])))]
pub async fn list(Call { state, caller }: Call) -> Result<Json<Vec<ApiKeyInfo>>, ApiError> {
    require(&caller, Need::Admin)?;
    Ok(Json(auth::list(&state.pool).await?))
}

/// Revokes a key by id or name; later requests with it get 401.
#[utoipa::path(delete, path = "/v1/api-keys/{id}", operation_id = "revoke_api_key", tag = "api-keys", params(("id" = String, Path, description = "Key id or name")),
    responses((status = 200, description = "Revoked", body = ApiKeyInfo), (status = 404, description = "No such active key", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn revoke(
    Call { state, caller }: Call,
    Path(id): Path<String>,
) -> Result<Json<ApiKeyInfo>, ApiError> {
    require(&caller, Need::Admin)?;
    let started = Instant::now();
    let revoked = auth::revoke(&state.pool, &id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no active API key `{id}`")))?;
    // Every node drops it when the change is announced; this one at once, before answering.
    state.api_keys.forget(revoked.id);
    audit::record_admin(
        &state.pool,
        &caller,
        "api_key.revoke",
        &json!({"id": revoked.id}),
        true,
        started,
    )
    .await?;
    Ok(Json(revoked))
}
