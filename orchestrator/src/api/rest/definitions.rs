//! `/v1/agents` and `/v1/workflows`: deploy, list, read, version history, delete.
//!
//! Deploys and deletes go through the tool router (`aegis.agent.create`, `aegis.workflow.delete`,
//! ...) so they are validated, authorised and audited exactly like the same tools called by a
//! SEAL client or an agent. Reads come straight from the registry.

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::auth::{require, Call, Need};
use super::error::{ApiError, ErrorBody};
use crate::caller::Caller;
use crate::manifest::ManifestKind;
use crate::registry::{self, Definition, VersionInfo};
use crate::state::AppState;

/// `?force=` on deploys.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct DeployQuery {
    /// Deploy a version that exists already: a different manifest becomes a new revision of it
    /// (the deployed revisions stay as they are), the same manifest changes nothing.
    #[serde(default)]
    pub force: bool,
}

/// `?version=` (and `&revision=`) on reads.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct VersionQuery {
    /// A specific version instead of the latest.
    pub version: Option<String>,
    /// A specific revision of `version` instead of its current one.
    pub revision: Option<i32>,
}

// The answers below are the deploy and delete tools' own (`aegis.agent.create`, ...), passed
// through as the router gave them: re-typing them here would copy every answer once more and
// could drop a field the tool adds. These types describe that JSON for the OpenAPI document;
// `openapi_complete::live_answers_match_the_document` checks live answers against them.

/// One warning of a deploy (`normalised:` rewrites among them): where and what.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct DeployWarning {
    /// JSON pointer of the manifest node it concerns.
    pointer: String,
    /// 1-based line of that node in the manifest text, when known.
    line: Option<u32>,
    /// What was noted.
    message: String,
}

/// The answer of `POST /v1/agents` (the tool `aegis.agent.create`).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct AgentDeployed {
    /// The agent (stable across versions).
    agent_id: Uuid,
    /// Always true: a refusal is an error answer.
    deployed: bool,
    /// `metadata.name`.
    name: String,
    /// `metadata.version`.
    version: String,
    /// The revision of that version now current (1 for a new version).
    revision: i32,
    /// `sha256:` of the normalised manifest.
    manifest_digest: String,
    /// With `force`: a different manifest became a new revision of an existing version.
    replaced: bool,
    /// With `force`: the manifest was the current revision's, nothing was stored.
    unchanged: bool,
    /// Warnings and `normalised:` notes.
    warnings: Vec<DeployWarning>,
}

/// The answer of `POST /v1/workflows` (the tool `aegis.workflow.create`).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct WorkflowDeployed {
    /// The workflow (stable across versions).
    workflow_id: Uuid,
    /// Always true: a refusal is an error answer.
    deployed: bool,
    /// `metadata.name`.
    name: String,
    /// `metadata.version`.
    version: String,
    /// The revision of that version now current (1 for a new version).
    revision: i32,
    /// `sha256:` of the normalised manifest.
    manifest_digest: String,
    /// With `force`: a different manifest became a new revision of an existing version.
    replaced: bool,
    /// With `force`: the manifest was the current revision's, nothing was stored.
    unchanged: bool,
    /// Warnings and `normalised:` notes.
    warnings: Vec<DeployWarning>,
}

/// The answer of `DELETE /v1/agents/{id}` (the tool `aegis.agent.delete`).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct AgentDeleted {
    /// The agent that is gone, with all its versions.
    agent_id: Uuid,
    /// Always true: a failure is an error answer.
    deleted: bool,
}

/// The answer of `DELETE /v1/workflows/{id}` (the tool `aegis.workflow.delete`).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct WorkflowDeleted {
    /// The workflow that is gone, with all its versions.
    workflow_id: Uuid,
    /// Always true: a failure is an error answer.
    deleted: bool,
}

async fn deploy(
    state: AppState,
    caller: Caller,
    kind: ManifestKind,
    force: bool,
    body: String,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    require(&caller, Need::Write)?;
    if body.trim().is_empty() {
        return Err(ApiError::bad_request(
            "the request body is empty; send the manifest as YAML or JSON",
        ));
    }
    let tool = match kind {
        ManifestKind::Agent => "aegis.agent.create",
        ManifestKind::Workflow => "aegis.workflow.create",
    };
    let out = super::call_tool(
        &state,
        &caller,
        tool,
        json!({"manifest_yaml": body, "force": force}),
    )
    .await?;
    // 201 only when a new version was stored; a new revision or nothing at all is a 200.
    let status = if out["replaced"] == true || out["unchanged"] == true {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(out)))
}

/// Deploys an agent manifest (YAML or JSON body).
#[utoipa::path(post, path = "/v1/agents", tag = "agents", params(DeployQuery),
    request_body(content = String, description = "Agent manifest, YAML or JSON", content_type = "application/yaml"),
    responses((status = 201, description = "Deployed", body = AgentDeployed), (status = 200, description = "With force: a new revision of an existing version, or nothing to change", body = AgentDeployed),
              (status = 409, description = "Version already deployed", body = ErrorBody), (status = 422, description = "Invalid manifest", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn create_agent(
    Call { state, caller }: Call,
    Query(q): Query<DeployQuery>,
    body: String,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    deploy(state, caller, ManifestKind::Agent, q.force, body).await
}

/// Deploys a workflow manifest (YAML or JSON body).
#[utoipa::path(post, path = "/v1/workflows", tag = "workflows", params(DeployQuery),
    request_body(content = String, description = "Workflow manifest, YAML or JSON", content_type = "application/yaml"),
    responses((status = 201, description = "Deployed", body = WorkflowDeployed), (status = 200, description = "With force: a new revision of an existing version, or nothing to change", body = WorkflowDeployed),
              (status = 409, description = "Version already deployed", body = ErrorBody), (status = 422, description = "Invalid manifest", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn create_workflow(
    Call { state, caller }: Call,
    Query(q): Query<DeployQuery>,
    body: String,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    deploy(state, caller, ManifestKind::Workflow, q.force, body).await
}

/// Lists agents with their latest version.
#[utoipa::path(get, path = "/v1/agents", tag = "agents",
    responses((status = 200, description = "Agents", body = Vec<Definition>)), security(("api_key" = [])))]
pub async fn list_agents(Call { state, caller }: Call) -> Result<Json<Vec<Definition>>, ApiError> {
    Ok(Json(
        registry::list(&state.pool, &caller.tenant, ManifestKind::Agent).await?,
    ))
}

/// Lists workflows with their latest version.
#[utoipa::path(get, path = "/v1/workflows", tag = "workflows",
    responses((status = 200, description = "Workflows", body = Vec<Definition>)), security(("api_key" = [])))]
pub async fn list_workflows(
    Call { state, caller }: Call,
) -> Result<Json<Vec<Definition>>, ApiError> {
    Ok(Json(
        registry::list(&state.pool, &caller.tenant, ManifestKind::Workflow)
            .await?
            .into_iter()
            .map(Definition::with_schedule)
            .collect(),
    ))
}

/// One agent by id or name (latest version unless `?version=`, its current revision unless `&revision=`).
#[utoipa::path(get, path = "/v1/agents/{id}", tag = "agents", params(("id" = String, Path, description = "Agent id or name"), VersionQuery),
    responses((status = 200, description = "Agent", body = Definition), (status = 404, description = "Not found", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn get_agent(
    Call { state, caller }: Call,
    Path(id): Path<String>,
    Query(q): Query<VersionQuery>,
) -> Result<Json<Definition>, ApiError> {
    Ok(Json(
        registry::get_revision(
            &state.pool,
            &caller.tenant,
            ManifestKind::Agent,
            &id,
            q.version.as_deref(),
            q.revision,
        )
        .await?,
    ))
}

/// One workflow by id or name (latest version unless `?version=`, its current revision unless `&revision=`).
#[utoipa::path(get, path = "/v1/workflows/{id}", tag = "workflows", params(("id" = String, Path, description = "Workflow id or name"), VersionQuery),
    responses((status = 200, description = "Workflow", body = Definition), (status = 404, description = "Not found", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn get_workflow(
    Call { state, caller }: Call,
    Path(id): Path<String>,
    Query(q): Query<VersionQuery>,
) -> Result<Json<Definition>, ApiError> {
    Ok(Json(
        registry::get_revision(
            &state.pool,
            &caller.tenant,
            ManifestKind::Workflow,
            &id,
            q.version.as_deref(),
            q.revision,
        )
        .await?
        .with_schedule(),
    ))
}

/// Every version of an agent and every revision of each, latest first.
#[utoipa::path(get, path = "/v1/agents/{id}/versions", tag = "agents", params(("id" = String, Path, description = "Agent id or name")),
    responses((status = 200, description = "Versions", body = Vec<VersionInfo>), (status = 404, description = "Not found", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn agent_versions(
    Call { state, caller }: Call,
    Path(id): Path<String>,
) -> Result<Json<Vec<VersionInfo>>, ApiError> {
    Ok(Json(
        registry::versions(&state.pool, &caller.tenant, ManifestKind::Agent, &id).await?,
    ))
}

/// Every version of a workflow and every revision of each, latest first.
#[utoipa::path(get, path = "/v1/workflows/{id}/versions", tag = "workflows", params(("id" = String, Path, description = "Workflow id or name")),
    responses((status = 200, description = "Versions", body = Vec<VersionInfo>), (status = 404, description = "Not found", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn workflow_versions(
    Call { state, caller }: Call,
    Path(id): Path<String>,
) -> Result<Json<Vec<VersionInfo>>, ApiError> {
    Ok(Json(
        registry::versions(&state.pool, &caller.tenant, ManifestKind::Workflow, &id).await?,
    ))
}

/// Deletes an agent (all versions); running executions keep their copy.
///
/// The tool takes the agent's UUID; a name is resolved to it first, as `GET` does, so both
/// forms the path documents work.
#[utoipa::path(delete, path = "/v1/agents/{id}", tag = "agents", params(("id" = String, Path, description = "Agent id or name")),
    responses((status = 200, description = "Deleted", body = AgentDeleted), (status = 404, description = "Not found", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn delete_agent(
    Call { state, caller }: Call,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    require(&caller, Need::Write)?;
    let id = match Uuid::parse_str(&id) {
        Ok(uuid) => uuid,
        Err(_) => {
            registry::get(&state.pool, &caller.tenant, ManifestKind::Agent, &id, None)
                .await?
                .id
        }
    };
    Ok(Json(
        super::call_tool(
            &state,
            &caller,
            "aegis.agent.delete",
            json!({"agent_id": id}),
        )
        .await?,
    ))
}

/// Deletes a workflow (all versions); running executions keep their copy.
#[utoipa::path(delete, path = "/v1/workflows/{id}", tag = "workflows", params(("id" = String, Path, description = "Workflow id or name")),
    responses((status = 200, description = "Deleted", body = WorkflowDeleted), (status = 404, description = "Not found", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn delete_workflow(
    Call { state, caller }: Call,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    super::tool_answer(
        &state,
        &caller,
        Need::Write,
        "aegis.workflow.delete",
        json!({"name": id}),
    )
    .await
}
