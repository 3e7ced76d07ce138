//! `/v1/sandboxes/{id}/previews`: preview URLs of one's own sandbox. A preview opens one port of
//! the sandbox to whoever holds its URL, until it expires or is revoked, decided and audited as
//! the key that made it (`aegis_e2b_door::ports`); the URL carries a random secret, never the
//! caller's API key, and only the secret's SHA-256 is stored (`aegis_store::previews`).

use std::time::Instant;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::Json;
use dispatcher::SandboxId;
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

use super::auth::{require, Call, Need};
use super::error::{ApiError, ErrorBody};
use crate::audit;
use crate::caller::Caller;
use crate::policy::sandboxes::{check_sandbox_access, SandboxAccess};
use crate::state::AppState;
use aegis_store::previews::{self, Preview};

/// The longest a preview may live: a day.
pub const MAX_TTL_SECS: u32 = 24 * 60 * 60;
/// A preview's life when the request names none: an hour.
pub const DEFAULT_TTL_SECS: u32 = 60 * 60;
/// The port E2B's SDKs give envd: the port layer leaves it to the E2B door, so no preview.
const ENVD_PORT: u16 = 49983;

/// Body of `POST /v1/sandboxes/{id}/previews`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePreview {
    /// The port inside the sandbox (1-65535, not 49983).
    pub port: u16,
    /// Seconds it opens the port (1-86400, default 3600).
    pub ttl_secs: Option<u32>,
}

/// The answer of `POST /v1/sandboxes/{id}/previews`: the only time the URL is shown.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PreviewCreated {
    /// The preview, to revoke it.
    pub id: Uuid,
    /// The URL that opens the port: `http://<port>-<sandbox>.<e2b.domain>/?aegis_preview=<secret>`;
    /// its first answer sets a cookie for that host, so the page's relative links work.
    pub url: String,
    /// The port it opens.
    pub port: u16,
    /// When it stops opening it.
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

/// The answer of `DELETE /v1/sandboxes/{id}/previews/{preview_id}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PreviewRevoked {
    /// The preview.
    pub id: Uuid,
    /// Always true: a failure is an error answer.
    pub revoked: bool,
}

/// The sandbox, when `caller` may act in it (its maker); else the same 404 as an unknown one,
/// with the refusal audited as `action`.
async fn own(
    state: &AppState,
    caller: &Caller,
    id: Uuid,
    action: &str,
    args: &serde_json::Value,
    started: Instant,
) -> Result<(), ApiError> {
    let owner = state.sandboxes.owner(SandboxId(id)).await?;
    if let Err(denial) = check_sandbox_access(caller, &owner, SandboxAccess::Act, &id.to_string()) {
        audit::record_admin_of(&state.pool, caller, action, args, false, started, Some(id)).await?;
        return Err(ApiError::not_found(denial.message));
    }
    Ok(())
}

/// Makes a preview URL of a port of one's own sandbox.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/previews", operation_id = "create_preview", tag = "sandboxes", request_body = CreatePreview,
    params(("id" = Uuid, Path, description = "Sandbox id")),
    responses((status = 201, description = "Created", body = PreviewCreated),
              (status = 400, description = "A bad port or ttl", body = ErrorBody),
              (status = 404, description = "Unknown sandbox, another's, or not running", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn create(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
    Json(req): Json<CreatePreview>,
) -> Result<(StatusCode, Json<PreviewCreated>), ApiError> {
    require(&caller, Need::Write)?;
    let started = Instant::now();
    let ttl = req.ttl_secs.unwrap_or(DEFAULT_TTL_SECS);
    if req.port == 0 || req.port == ENVD_PORT {
        return Err(ApiError::bad_request(format!(
            "port: {} cannot be previewed (1-65535, not envd's {ENVD_PORT})",
            req.port
        )));
    }
    if ttl == 0 || ttl > MAX_TTL_SECS {
        return Err(ApiError::bad_request(format!(
            "ttl_secs: {ttl} is out of range (1-{MAX_TTL_SECS})"
        )));
    }
    let args = json!({"sandbox_id": id, "port": req.port, "ttl_secs": ttl});
    own(
        &state,
        &caller,
        id,
        "sandbox.preview.create",
        &args,
        started,
    )
    .await?;
    let secret = previews::new_secret().map_err(ApiError::internal)?;
    let made = previews::create(&state.pool, id, req.port, &caller.id, &secret, ttl).await;
    let ok = matches!(made, Ok(Some(_)));
    audit::record_admin_of(
        &state.pool,
        &caller,
        "sandbox.preview.create",
        &args,
        ok,
        started,
        Some(id),
    )
    .await?;
    let Some(preview) = made? else {
        return Err(ApiError::not_found(format!("sandbox {id} is not running")));
    };
    let url = format!(
        "http://{}-{id}.{}/?{}={secret}",
        req.port,
        state.config.e2b.domain,
        previews::PARAM
    );
    Ok((
        StatusCode::CREATED,
        Json(PreviewCreated {
            id: preview.id,
            url,
            port: req.port,
            expires_at: preview.expires_at,
        }),
    ))
}

/// The previews of one's own sandbox (expired and revoked ones marked; never their secrets).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/previews", operation_id = "list_previews", tag = "sandboxes",
    params(("id" = Uuid, Path, description = "Sandbox id")),
    responses((status = 200, description = "Previews", body = Vec<Preview>), (status = 404, description = "Unknown sandbox, or another's", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn list(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
) -> Result<Json<Vec<Preview>>, ApiError> {
    let owner = state.sandboxes.owner(SandboxId(id)).await?;
    check_sandbox_access(&caller, &owner, SandboxAccess::Act, &id.to_string())
        .map_err(|d| ApiError::not_found(d.message))?;
    Ok(Json(previews::list(&state.pool, id).await?))
}

/// Revokes a preview of one's own sandbox: its URL opens nothing from the next request on.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/previews/{preview_id}", operation_id = "revoke_preview", tag = "sandboxes",
    params(("id" = Uuid, Path, description = "Sandbox id"), ("preview_id" = Uuid, Path, description = "Preview id")),
    responses((status = 200, description = "Revoked", body = PreviewRevoked), (status = 404, description = "Unknown sandbox or preview, or another's", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn revoke(
    Call { state, caller }: Call,
    Path((id, preview_id)): Path<(Uuid, Uuid)>,
) -> Result<Json<PreviewRevoked>, ApiError> {
    require(&caller, Need::Write)?;
    let started = Instant::now();
    let args = json!({"sandbox_id": id, "preview_id": preview_id});
    own(
        &state,
        &caller,
        id,
        "sandbox.preview.revoke",
        &args,
        started,
    )
    .await?;
    let done = previews::revoke(&state.pool, id, preview_id).await;
    audit::record_admin_of(
        &state.pool,
        &caller,
        "sandbox.preview.revoke",
        &args,
        matches!(done, Ok(true)),
        started,
        Some(id),
    )
    .await?;
    if !done? {
        return Err(ApiError::not_found(format!(
            "sandbox {id} has no preview {preview_id}"
        )));
    }
    Ok(Json(PreviewRevoked {
        id: preview_id,
        revoked: true,
    }))
}
