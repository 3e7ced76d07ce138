//! `/v1/agents/{name}/memories`: operators list and erase what an agent remembers across
//! executions (`crate::memory`).
//!
//! Both are tool calls through the router (`aegis.memory.list`, `aegis.memory.erase`, operator
//! tier), so they are decided and audited like the same tools called any other way. A memory
//! outlives its agent: the name of a deleted agent is accepted.

use axum::extract::{Path, Query};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::auth::Call;
use super::error::{ApiError, ErrorBody};
use super::with_given;

/// `?owner=&limit=&offset=` of the listing.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ListQuery {
    /// Only this principal's notes (`api_key:<key id>`, `session:<session id>`, ...), or `*` for
    /// the agent's shared memory.
    pub owner: Option<String>,
    /// Page size (1-500, default 100).
    pub limit: Option<i64>,
    /// Notes skipped before the page.
    pub offset: Option<i64>,
}

/// `?owner=` of an erase.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct OwnerQuery {
    /// Only this principal's notes, or `*` for the agent's shared memory.
    pub owner: Option<String>,
}

// The answers are the tools' own, passed through as the router gave them; these types describe
// that JSON for the OpenAPI document, and `openapi_complete::live_answers_match_the_document`
// checks live answers against them.

/// One note as operators list it.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct MemoryNote {
    /// The note.
    note_id: Uuid,
    /// The principal whose note it is, or `*` for the agent's shared memory.
    owner: String,
    /// What was saved.
    content: String,
    /// Its keywords.
    tags: Vec<String>,
    /// When it was saved.
    created_at: DateTime<Utc>,
    /// The execution that saved it.
    execution_id: Option<Uuid>,
}

/// The answer of `GET /v1/agents/{id}/memories` (the tool `aegis.memory.list`).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct MemoryPage {
    /// The agent.
    agent: String,
    /// The owner asked for, if any.
    owner: Option<String>,
    /// Newest first.
    notes: Vec<MemoryNote>,
    /// Notes matching, on every page.
    total: i64,
    /// Notes on this page.
    count: i64,
    /// Page size used.
    limit: i64,
    /// Notes skipped.
    offset: i64,
}

/// The answer of the erasing routes (the tool `aegis.memory.erase`).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the tool builds this JSON
pub struct MemoryErased {
    /// The agent.
    agent: String,
    /// The owner asked for, if any.
    owner: Option<String>,
    /// The one note asked for, if any.
    note_id: Option<Uuid>,
    /// How many notes are gone.
    erased: i64,
}

/// An agent's notes, newest first, with their owners.
#[utoipa::path(get, path = "/v1/agents/{id}/memories", operation_id = "list_agent_memories", tag = "agents",
    params(("id" = String, Path, description = "Agent name"), ListQuery),
    responses((status = 200, description = "Notes (aegis.memory.list)", body = MemoryPage),
              (status = 403, description = "Not an operator", body = ErrorBody),
              (status = 422, description = "Invalid name, owner or page", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn list(
    Call { state, caller }: Call,
    Path(agent): Path<String>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let given = [
        ("owner", q.owner.map(Value::from)),
        ("limit", q.limit.map(Value::from)),
        ("offset", q.offset.map(Value::from)),
    ];
    let args = with_given(json!({"agent": agent}), given);
    Ok(Json(
        super::call_tool(&state, &caller, "aegis.memory.list", args).await?,
    ))
}

/// Erases an agent's notes for good: all, or one owner's with `?owner=`.
#[utoipa::path(delete, path = "/v1/agents/{id}/memories", operation_id = "erase_agent_memories", tag = "agents",
    params(("id" = String, Path, description = "Agent name"), OwnerQuery),
    responses((status = 200, description = "Erased (aegis.memory.erase)", body = MemoryErased),
              (status = 403, description = "Not an operator", body = ErrorBody),
              (status = 422, description = "Invalid name or owner", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn erase(
    Call { state, caller }: Call,
    Path(agent): Path<String>,
    Query(q): Query<OwnerQuery>,
) -> Result<Json<Value>, ApiError> {
    let args = with_given(
        json!({"agent": agent}),
        [("owner", q.owner.map(Value::from))],
    );
    Ok(Json(
        super::call_tool(&state, &caller, "aegis.memory.erase", args).await?,
    ))
}

/// Erases one note for good.
#[utoipa::path(delete, path = "/v1/agents/{id}/memories/{note_id}", operation_id = "erase_agent_memory", tag = "agents",
    params(("id" = String, Path, description = "Agent name"), ("note_id" = Uuid, Path, description = "Note id"), OwnerQuery),
    responses((status = 200, description = "Erased (aegis.memory.erase)", body = MemoryErased),
              (status = 403, description = "Not an operator", body = ErrorBody),
              (status = 404, description = "Not one of the agent's notes", body = ErrorBody),
              (status = 422, description = "Invalid name or owner", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn erase_one(
    Call { state, caller }: Call,
    Path((agent, note)): Path<(String, Uuid)>,
    Query(q): Query<OwnerQuery>,
) -> Result<Json<Value>, ApiError> {
    let owner = [("owner", q.owner.map(Value::from))];
    let args = with_given(json!({"agent": agent, "note_id": note}), owner);
    Ok(Json(
        super::call_tool(&state, &caller, "aegis.memory.erase", args).await?,
    ))
}
