//! `/v1/sandboxes`: operators create a sandbox for an agent or from a runtime, list them,
//! destroy them.
//!
//! A sandbox made here is owned by the operator key that made it; tool calls reach it through
//! `POST /v1/tools/call` with `sandbox_id`, under the agent's manifest policy, or for a runtime
//! sandbox under the operator policy of `sandboxes::policy_of_runtime` (the workspace, any
//! program or the `allow` list, no shell, no network).

use std::time::Instant;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use dispatcher::{Owner, OwnerKind, SandboxId, SandboxInfo};
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::auth::{require, Need};
use super::error::{ApiError, ErrorBody};
use crate::audit;
use crate::caller::Caller;
use crate::policy::sandboxes::{check_sandbox_access, SandboxAccess};
use crate::sandboxes::SandboxError;
use crate::state::AppState;

/// Body of `POST /v1/sandboxes`: `agent` (with an optional `version`) or `runtime` (with an
/// optional `allow` list), not both.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Agent name or id whose manifest decides image, limits and allowlists.
    pub agent: Option<String>,
    /// A specific agent version (default: latest).
    pub version: Option<String>,
    /// A runtime of the registry, `language` or `language:version` (e.g. `shell`,
    /// `python:3.11`): a sandbox of its image where any program may run (no shell, no network).
    pub runtime: Option<String>,
    /// With `runtime`: only these programs (or `program subcommand` entries) may run.
    #[serde(default)]
    pub allow: Vec<String>,
}

impl From<SandboxError> for ApiError {
    fn from(e: SandboxError) -> Self {
        match e {
            SandboxError::Registry(r) => r.into(),
            SandboxError::Dispatch(dispatcher::DispatchError::SandboxNotFound { .. }) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", e.to_string())
            }
            SandboxError::NoSuchRuntime { .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown_runtime",
                e.to_string(),
            ),
            SandboxError::Dispatch(dispatcher::DispatchError::ImageMissing { .. })
            | SandboxError::UnknownRuntime { .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "runtime_unavailable",
                e.to_string(),
            ),
            SandboxError::QuotaExceeded { .. } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "quota_exceeded",
                e.to_string(),
            ),
            // The node cannot give this sandbox its network (no proxy, no firewall): nothing
            // was created; an operator must fix the node.
            SandboxError::Dispatch(dispatcher::DispatchError::Network { .. }) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "egress_unavailable",
                e.to_string(),
            ),
            // Every engine of the cluster is at its bound (`sandbox.max_per_engine`).
            SandboxError::Dispatch(dispatcher::DispatchError::NoRoom { .. }) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_engine_room",
                e.to_string(),
            ),
            SandboxError::Unavailable(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                e.to_string(),
            ),
            other => ApiError::internal(other),
        }
    }
}

/// Creates a sandbox for an agent or from a runtime (from the warm pool when one matches).
#[utoipa::path(post, path = "/v1/sandboxes", operation_id = "create_sandbox", tag = "sandboxes", request_body = CreateSandbox,
    responses((status = 201, description = "Created", body = Value), (status = 404, description = "Unknown agent", body = ErrorBody),
              (status = 400, description = "Neither or both of agent and runtime", body = ErrorBody),
              (status = 422, description = "Unknown runtime, or its image is missing", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<CreateSandbox>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    require(&caller, Need::Write)?;
    let started = Instant::now();
    let owner = Owner::new(OwnerKind::Operator, caller.id.clone());
    let made =
        match (&req.agent, &req.runtime) {
            (Some(agent), None) if req.allow.is_empty() => {
                state
                    .sandboxes
                    .create_for_agent(
                        &state.pool,
                        &caller.tenant,
                        agent,
                        req.version.as_deref(),
                        owner,
                    )
                    .await
            }
            (None, Some(runtime)) if req.version.is_none() => {
                state
                    .sandboxes
                    .create_for_runtime(&state.pool, runtime, &req.allow, owner)
                    .await
            }
            _ => return Err(ApiError::bad_request(
                "give `agent` (and optionally `version`) or `runtime` (and optionally `allow`), \
                 not both and not neither",
            )),
        };
    audit::record_admin(
        &state.pool,
        &caller,
        "sandbox.create",
        &json!({"agent": req.agent, "version": req.version, "runtime": req.runtime, "allow": req.allow}),
        made.is_ok(),
        started,
    )
    .await?;
    let (id, policy) = made?;
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "sandbox_id": id.0, "agent": policy.agent,
            "read_roots": policy.read_roots, "write_roots": policy.write_roots,
            "subcommand_allowlist": policy.command.subcommand_allowlist,
        })),
    ))
}

/// The live sandboxes the caller may see: its own (those its key made: REST, E2B, its MCP
/// conversations), or every one for an unbound admin key (`policy::sandboxes`).
#[utoipa::path(get, path = "/v1/sandboxes", operation_id = "list_sandboxes", tag = "sandboxes",
    responses((status = 200, description = "Sandboxes", body = Value)), security(("api_key" = [])))]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<SandboxInfo>>, ApiError> {
    let d = state.sandboxes.dispatcher()?;
    let all = d.list().await.map_err(SandboxError::from)?;
    Ok(Json(
        all.into_iter()
            .filter(|info| {
                let owner = crate::sandboxes::owner_of(info);
                check_sandbox_access(&caller, &owner, SandboxAccess::See, "").is_ok()
            })
            .collect(),
    ))
}

/// Destroys a sandbox with its workspace: the caller's own, or any for an unbound admin key.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", operation_id = "destroy_sandbox", tag = "sandboxes", params(("id" = Uuid, Path, description = "Sandbox id")),
    responses((status = 200, description = "Destroyed", body = Value), (status = 404, description = "Unknown sandbox", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn destroy(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<Uuid>,
) -> Result<Json<Value>, ApiError> {
    require(&caller, Need::Write)?;
    let started = Instant::now();
    let id = SandboxId(id);
    let owner = state.sandboxes.owner(id).await?;
    // Another principal's sandbox is "not found", like one that does not exist; the refusal
    // is audited like any other admin change.
    if let Err(denial) =
        check_sandbox_access(&caller, &owner, SandboxAccess::Destroy, &id.to_string())
    {
        audit::record_admin(
            &state.pool,
            &caller,
            "sandbox.destroy",
            &json!({"sandbox_id": id.0}),
            false,
            started,
        )
        .await?;
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            denial.message,
        ));
    }
    let done = state.sandboxes.destroy(id).await;
    audit::record_admin(
        &state.pool,
        &caller,
        "sandbox.destroy",
        &json!({"sandbox_id": id.0}),
        done.is_ok(),
        started,
    )
    .await?;
    done?;
    Ok(Json(json!({"sandbox_id": id.0, "destroyed": true})))
}
