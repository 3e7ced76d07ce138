//! `/v1/sandboxes`: operators create a sandbox for an agent or from a runtime, list them,
//! destroy them.
//!
//! A sandbox made here is owned by the operator key that made it; tool calls reach it through
//! `POST /v1/tools/call` with `sandbox_id`, under the agent's manifest policy, or for a runtime
//! sandbox under the operator policy of `sandboxes::policy_of_runtime` (the workspace, any
//! program or the `allow` list, no shell, no network).

use std::time::Instant;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use dispatcher::{Owner, OwnerKind, SandboxId};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

use super::auth::{require, Need};
use super::error::{ApiError, ErrorBody};
use crate::audit;
use crate::caller::Caller;
use crate::policy::sandboxes::SandboxAccess;
use crate::sandboxes::SandboxError;
use crate::state::AppState;
use crate::tools::control::{self, Control, ControlError};

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

/// The answer of `POST /v1/sandboxes`: the sandbox and the policy it runs under.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SandboxCreated {
    /// The sandbox, for `POST /v1/tools/call`'s `sandbox_id`.
    pub sandbox_id: Uuid,
    /// The agent whose manifest decides its policy (`runtime:<name>` for a runtime sandbox).
    pub agent: String,
    /// Where its tools may read.
    pub read_roots: Vec<String>,
    /// Where its tools may write.
    pub write_roots: Vec<String>,
    /// The programs `cmd.run` may start (empty with a runtime sandbox: any program).
    pub subcommand_allowlist: Vec<String>,
}

/// The answer of `DELETE /v1/sandboxes/{id}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SandboxDestroyed {
    /// The sandbox that is gone.
    pub sandbox_id: Uuid,
    /// Always true: a failure is an error answer.
    pub destroyed: bool,
}

/// One sandbox of `GET /v1/sandboxes`, as the dispatcher records it (the schema of
/// `dispatcher::SandboxInfo`'s JSON, which the handler sends).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the handler serialises `SandboxInfo` itself
pub struct SandboxListed {
    /// The sandbox.
    id: Uuid,
    /// Its tenant.
    tenant_id: String,
    /// The node instance holding its executor stream.
    instance_id: Uuid,
    /// Its runtime image.
    image: String,
    /// Who made it: the only principal that may act in it.
    owner: SandboxOwnerView,
    /// Where it is in its life.
    #[schema(pattern = "^(creating|running|destroying|destroyed|failed)$")]
    state: String,
    /// Its Docker container (`aegis-sbx-<id>`; `aegis-sbx-<id>-r<n>` once resumed with memory).
    container_name: String,
    /// Its workspace volume (`aegis-ws-<id>`).
    volume_name: String,
    /// The limits, network, roots and labels it was made with (absent when unreadable).
    spec: Option<SandboxSpecView>,
    /// Why it failed or was destroyed.
    reason: Option<String>,
    /// When its row was written.
    created_at: chrono::DateTime<chrono::Utc>,
    /// When its executor became ready.
    ready_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When its Docker objects were removed.
    destroyed_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The Docker engine it lives on (`<ID>@<name>:<data root>`; null for rows from before
    /// engines were recorded).
    engine: Option<String>,
    /// With `?usage=true`: one sample of what it uses (null when it could not be read).
    usage: Option<SandboxUsageView>,
}

/// One sample of what a sandbox uses (`dispatcher::Usage`, the figures the E2B door's
/// metrics report): its cgroup read through the engine's stats, two readings a second apart.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the handler writes this JSON
pub struct SandboxUsageView {
    /// CPUs it may use (its limit, rounded up).
    cpu_count: u32,
    /// Percent of those CPUs used over the sample.
    cpu_used_pct: f32,
    /// Memory its processes use, bytes (page cache and tmpfs contents not counted).
    mem_used: u64,
    /// Its memory limit, bytes.
    mem_total: u64,
    /// Bytes stored in its workspace and `/tmp`.
    disk_used: u64,
    /// Its workspace's size limit plus `/tmp`'s, bytes.
    disk_total: u64,
}

/// The query of `GET /v1/sandboxes`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ListQuery {
    /// Add each sandbox's `usage` (about a second longer: the samples are taken in parallel).
    #[serde(default)]
    pub usage: bool,
}

/// Who made a sandbox.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only
pub struct SandboxOwnerView {
    /// `operator` (an API key, REST or E2B), `session` (SEAL or an MCP conversation),
    /// `execution`, `workflow` or `pool`.
    #[schema(pattern = "^(operator|session|execution|workflow|pool)$")]
    kind: String,
    /// The key, session, execution or workflow run.
    id: String,
}

/// What a sandbox was made with.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only
pub struct SandboxSpecView {
    /// Effective (clamped) limits.
    limits: SandboxLimitsView,
    /// `none`, `bridge` or `egress`.
    network: String,
    /// The executor's read roots.
    read_roots: Vec<String>,
    /// The executor's write roots.
    write_roots: Vec<String>,
    /// Whether the executor follows symbolic links beneath its roots.
    follow_symlinks: bool,
    /// Where the workspace is mounted (absent: `/workspace`).
    workspace: Option<String>,
    /// The node's labels (agent version, context, runtime, ...).
    labels: std::collections::BTreeMap<String, String>,
    /// Its isolation class: `container` (runc on the host's kernel) or `gvisor` (gVisor's
    /// `runsc`, a kernel of its own).
    #[schema(pattern = "^(container|gvisor)$")]
    isolation: String,
}

/// A sandbox's limits.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only
pub struct SandboxLimitsView {
    /// Memory of its processes.
    memory_bytes: u64,
    /// CPU, in billionths of a CPU.
    nano_cpus: u64,
    /// Processes and threads.
    pids: u64,
    /// The `/tmp` tmpfs.
    tmpfs_bytes: u64,
    /// The workspace.
    workspace_bytes: u64,
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
            // The class needs a runtime the engine lacks (gVisor's `runsc`): nothing was
            // created; the message names what to install and register.
            SandboxError::Dispatch(dispatcher::DispatchError::IsolationUnavailable { .. }) => {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "isolation_unavailable",
                    e.to_string(),
                )
            }
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

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> Self {
        match e {
            ControlError::Unknown(_) | ControlError::Refused(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", e.to_string())
            }
            ControlError::Sandbox(e) => e.into(),
            ControlError::Audit(e) => ApiError::internal(e),
        }
    }
}

/// Creates a sandbox for an agent or from a runtime (from the warm pool when one matches).
#[utoipa::path(post, path = "/v1/sandboxes", operation_id = "create_sandbox", tag = "sandboxes", request_body = CreateSandbox,
    responses((status = 201, description = "Created", body = SandboxCreated), (status = 404, description = "Unknown agent", body = ErrorBody),
              (status = 400, description = "Neither or both of agent and runtime", body = ErrorBody),
              (status = 422, description = "Unknown runtime, or its image is missing", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Json(req): Json<CreateSandbox>,
) -> Result<(StatusCode, Json<SandboxCreated>), ApiError> {
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
    audit::record_admin_of(
        &state.pool,
        &caller,
        "sandbox.create",
        &json!({"agent": req.agent, "version": req.version, "runtime": req.runtime, "allow": req.allow}),
        made.is_ok(),
        started,
        made.as_ref().ok().map(|(id, _)| id.0),
    )
    .await?;
    let (id, policy) = made?;
    Ok((
        StatusCode::CREATED,
        Json(SandboxCreated {
            sandbox_id: id.0,
            agent: policy.agent.clone(),
            read_roots: policy.read_roots.clone(),
            write_roots: policy.write_roots.clone(),
            subcommand_allowlist: policy.command.subcommand_allowlist.clone(),
        }),
    ))
}

/// How many sandboxes one `usage=true` listing samples at once (the E2B door's metrics use the
/// same bound).
const SAMPLED_AT_ONCE: usize = 16;

/// The live sandboxes the caller may see: its own (those its key made: REST, E2B, its MCP
/// conversations), or every one for an unbound admin key (`policy::sandboxes`); with
/// `usage=true`, each with one sample of its CPU, memory and disk use.
#[utoipa::path(get, path = "/v1/sandboxes", operation_id = "list_sandboxes", tag = "sandboxes", params(ListQuery),
    responses((status = 200, description = "Sandboxes", body = Vec<SandboxListed>)), security(("api_key" = [])))]
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Vec<serde_json::Value>>, ApiError> {
    let visible = control::visible(&state, &caller).await?;
    let usage = if q.usage {
        // One sample each, taken together (each waits about a second between its readings), at
        // most SAMPLED_AT_ONCE at a time: a node with hundreds of sandboxes does not open
        // hundreds of engine streams for one listing.
        let (state, caller) = (&state, &caller);
        let ids: Vec<SandboxId> = visible.iter().map(|info| info.id).collect();
        futures_util::stream::iter(ids)
            .map(|id| control::usage(state, caller, id))
            .buffered(SAMPLED_AT_ONCE)
            .collect::<Vec<_>>()
            .await
    } else {
        Vec::new()
    };
    let mut rows = Vec::with_capacity(visible.len());
    for (i, info) in visible.iter().enumerate() {
        let mut row = serde_json::to_value(info).map_err(ApiError::internal)?;
        if q.usage {
            row["usage"] = match &usage[i] {
                Ok(u) => json!({
                    "cpu_count": u.cpu_count, "cpu_used_pct": u.cpu_used_pct,
                    "mem_used": u.mem_used, "mem_total": u.mem_total,
                    "disk_used": u.disk_used, "disk_total": u.disk_total,
                }),
                // Gone meanwhile, or its engine did not answer: no figure rather than no list.
                Err(_) => serde_json::Value::Null,
            };
        }
        rows.push(row);
    }
    Ok(Json(rows))
}

/// Destroys a sandbox with its workspace: the caller's own, or any for an unbound admin key.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}", operation_id = "destroy_sandbox", tag = "sandboxes", params(("id" = Uuid, Path, description = "Sandbox id")),
    responses((status = 200, description = "Destroyed", body = SandboxDestroyed), (status = 404, description = "Unknown sandbox", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn destroy(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<Uuid>,
) -> Result<Json<SandboxDestroyed>, ApiError> {
    require(&caller, Need::Write)?;
    let id = SandboxId(id);
    let args = json!({"sandbox_id": id.0});
    // Another principal's sandbox is "not found", like one that does not exist; the router
    // audits the refusal as it does any other.
    let call = Control {
        action: "sandbox.destroy",
        sandbox: id,
        access: SandboxAccess::Destroy,
        args: &args,
    };
    let permit = match control::admit(&state, &caller, call).await {
        Err(e @ ControlError::Unknown(_)) => {
            let why = e.to_string();
            control::refused(
                &state,
                &caller,
                call.action,
                &args,
                Some(id.0),
                "sandbox_unavailable",
                &why,
            )
            .await?;
            return Err(e.into());
        }
        admitted => admitted?,
    };
    let done = permit.destroy().await;
    permit.finish(&args, done.is_ok()).await?;
    done?;
    Ok(Json(SandboxDestroyed {
        sandbox_id: id.0,
        destroyed: true,
    }))
}
