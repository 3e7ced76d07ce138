//! `/v1/tools` (the catalog this caller may use) and `/v1/tools/call` (any tool, via the router).

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::{require, Call, Need};
use super::error::{ApiError, ErrorBody};
use crate::policy;
use crate::tools::{self, ToolInfo};

/// Body of `POST /v1/tools/call`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CallRequest {
    /// Tool name, e.g. `aegis.agent.list`.
    pub name: String,
    /// Arguments object (validated against the tool's schema).
    #[serde(default = "empty_object")]
    pub arguments: Value,
    /// The sandbox `cmd.run` and `fs.*` run in (from `POST /v1/sandboxes`).
    pub sandbox_id: Option<uuid::Uuid>,
}

/// The answer of `POST /v1/tools/call`: MCP's `CallToolResult`, built by the router
/// (`ToolOutcome::into_mcp_json`); this describes it for the OpenAPI document.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the router writes this JSON
pub struct CallResult {
    /// One text item: the result's JSON (or a note that it is too large to repeat), or
    /// `error (<code>): <message>`.
    content: Vec<TextContent>,
    /// The tool's result; for a tool that failed, `{error: {code, message, details}}`.
    #[schema(rename = "structuredContent", value_type = Object)]
    structured_content: Value,
    /// True when the tool ran and failed.
    #[schema(rename = "isError")]
    is_error: bool,
}

/// A text item of an MCP result.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the router writes this JSON
pub struct TextContent {
    /// `text`.
    #[schema(rename = "type")]
    kind: String,
    /// The text.
    text: String,
}

fn empty_object() -> Value {
    json!({})
}

/// The tools this caller may call, with their argument schemas (the tools of the node's
/// external MCP servers included, as far as their servers can be listed now).
#[utoipa::path(get, path = "/v1/tools", operation_id = "list_tools", tag = "tools",
    responses((status = 200, description = "Catalog", body = Vec<ToolInfo>)), security(("api_key" = [])))]
pub async fn list(Call { state, caller }: Call) -> Result<Json<Vec<ToolInfo>>, ApiError> {
    let catalog = tools::catalog().map_err(ApiError::internal)?;
    let (external, _) = tools::external::all(&state).await;
    Ok(Json(
        catalog
            .iter()
            .chain(external.iter())
            .filter(|t| policy::may_see(&caller, t))
            .map(|t| t.info())
            .collect(),
    ))
}

/// Calls a tool through the router; answers the MCP result shape.
///
/// A tool that ran answers 200 even when it failed (`isError: true`), as MCP does; refusals before
/// the tool runs are HTTP errors: 404 unknown tool, 422 invalid arguments, 403 denied.
///
/// **Streaming form** (`Accept: text/event-stream`): the same call answered as Server-Sent
/// Events. A refusal is still the HTTP error above, before any event. Then `start`
/// (`{"pid": N}`) and `stdout` / `stderr` events (`{"data": "...", "encoding": "utf8"|"base64"}`)
/// as a foreground `cmd.run` writes its output, and last one `result` event whose data is
/// exactly the JSON body of the call without streaming (same output caps, `truncated` flags);
/// other tools send only `result`. A client that disconnects ends the command (its process
/// group is killed) and its audit row says `cancelled` (`client_disconnected`).
#[utoipa::path(post, path = "/v1/tools/call", operation_id = "call_tool", tag = "tools", request_body = CallRequest,
    responses((status = 200, description = "MCP result: content, structuredContent, isError; with `Accept: text/event-stream`, events `start`, `stdout`, `stderr`, then `result` carrying that same body",
                content((CallResult = "application/json"), (String = "text/event-stream"))),
              (status = 404, description = "Unknown tool", body = ErrorBody),
              (status = 422, description = "Invalid arguments", body = ErrorBody),
              (status = 403, description = "Denied by policy or role", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn call(
    Call { state, caller }: Call,
    headers: HeaderMap,
    Json(req): Json<CallRequest>,
) -> Result<Response, ApiError> {
    require(&caller, Need::Write)?;
    // A named sandbox must be the caller's own: the router decides it (`policy::sandboxes`) and
    // audits a refusal like any other. A key bound to a context owns only the sandboxes of its
    // MCP conversations and its E2B creates, never an operator's.
    let sandbox = req.sandbox_id.map(dispatcher::SandboxId);
    if super::tool_stream::wanted(&headers) {
        return super::tool_stream::call(state, caller, req.name, req.arguments, sandbox).await;
    }
    let outcome = tools::invoke_in(&state, &caller, &req.name, req.arguments, sandbox).await?;
    // The router's canonical text of the result, not a second serialisation, in a buffer of
    // the answer's size (axum's `Json` grows from 128 bytes, copying at every doubling).
    let body = outcome.into_mcp_json();
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response())
}
