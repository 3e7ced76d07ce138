//! SEAL over HTTP: `POST /v1/seal/attest`, `POST /v1/seal/invoke`, `GET /v1/seal/tools`
//! (no API key: the envelope and token are the credentials), and the operator's views of
//! sessions and security contexts (`/v1/seal/sessions`, `/v1/security-contexts`, API key).

use std::time::Instant;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use uuid::Uuid;

use super::auth::{require, Call, Need};
use super::error::{ApiError, ErrorBody};
use crate::api::streaming::{seal_invoke, Next};
use crate::audit;
use crate::contexts::{self, ContextError};
use crate::gateway::attestation_tokens::{self, IssuedToken, TokenError, TokenInfo};
use crate::gateway::{sessions, AttestRequest, Session};
use crate::seal::context::SecurityContext;
use crate::seal::error::{SealCode, SealError};
use crate::state::AppState;

// The SEAL answers below are the gateway's own JSON (`aegis-gateway`, `aegis-seal`'s error
// bodies), sent as built: re-typing them here would copy each answer once more and could drop a
// field the protocol adds. These types describe that JSON for the OpenAPI document, and
// `openapi_complete::live_answers_match_the_document` checks live answers against them.

/// The signed request of `POST /v1/seal/invoke` (SEAL v1 envelope).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the gateway parses the envelope from the raw body
pub struct SealEnvelope {
    /// Always `seal/v1`.
    #[schema(example = "seal/v1")]
    protocol: String,
    /// The compact JWT from attestation.
    security_token: String,
    /// Standard Base64 of the Ed25519 signature over the canonical payload and timestamp.
    signature: String,
    /// The MCP JSON-RPC request (`tools/call`, `tools/list`).
    payload: JsonRpcRequest,
    /// ISO 8601 time of signing.
    timestamp: String,
}

/// An MCP JSON-RPC request inside an envelope.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the gateway reads the payload
pub struct JsonRpcRequest {
    /// `2.0`.
    jsonrpc: String,
    /// The request id, echoed in the answer (string or number).
    id: Option<Value>,
    /// `tools/call` or `tools/list`.
    method: String,
    /// For `tools/call`: `{name, arguments}`.
    #[schema(value_type = Option<Object>)]
    params: Option<Value>,
}

/// A SEAL success answer of `POST /v1/seal/invoke`.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the gateway builds this JSON
pub struct SealSuccess {
    /// `seal/v1`.
    protocol: String,
    /// `success`.
    status: String,
    /// The JSON-RPC answer.
    payload: JsonRpcResult,
}

/// The JSON-RPC answer inside a SEAL success.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the gateway builds this JSON
pub struct JsonRpcResult {
    /// `2.0`.
    jsonrpc: String,
    /// The request's id (null when it had none).
    id: Option<Value>,
    /// For `tools/call`, the MCP result (`content`, `structuredContent`, `isError`); for
    /// `tools/list`, `{tools}`.
    #[schema(value_type = Object)]
    result: Value,
}

/// A SEAL error answer (§8.2): envelope, session and policy refusals of invoke and tools.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: `SealError::error_body` builds this JSON
pub struct SealErrorAnswer {
    /// `seal/v1`.
    protocol: String,
    /// `error`.
    status: String,
    /// What was refused.
    error: SealErrorDetail,
}

/// The error of a SEAL refusal.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: `SealError::error_body` builds this JSON
pub struct SealErrorDetail {
    /// The SEAL code (1xxx envelope and session, 2xxx policy, 3xxx attestation).
    code: u32,
    /// The code's name, e.g. `RATE_LIMIT_EXCEEDED`.
    name: String,
    /// What happened.
    message: String,
    /// When refused (ISO 8601).
    timestamp: String,
    /// The JSON-RPC request id, when it could be read.
    request_id: Option<Value>,
    /// Code-specific details (`retry_after_seconds` for 2005).
    #[schema(value_type = Object)]
    details: Value,
}

/// A refused attestation (§6.3.1's flat fields and §8.2's nested ones).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: `SealError::attestation_error_body` builds this JSON
pub struct AttestRefused {
    /// `seal/v1`.
    protocol: String,
    /// `error`.
    status: String,
    /// The SEAL code (3000 not admitted, 3001 unknown context, ...).
    error_code: u32,
    /// What happened.
    message: String,
    /// The same, nested.
    error: AttestErrorDetail,
}

/// The nested error of a refused attestation.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: `SealError::attestation_error_body` builds this JSON
pub struct AttestErrorDetail {
    /// The SEAL code.
    code: u32,
    /// The code's name.
    name: String,
    /// What happened.
    message: String,
    /// Code-specific details.
    #[schema(value_type = Object)]
    details: Value,
}

/// An admitted workload's session (`POST /v1/seal/attest`).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the gateway builds this JSON
pub struct Attested {
    /// `success`.
    status: String,
    /// The session's JWT, to put in every envelope.
    security_token: String,
    /// When the token expires (ISO 8601).
    expires_at: String,
    /// The session.
    session_id: Uuid,
}

/// The tools a session may call (`GET /v1/seal/tools`).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the gateway builds this JSON
pub struct SealTools {
    /// `seal/v1`.
    protocol: String,
    /// `/v1/seal/attest`.
    attestation_endpoint: String,
    /// `/v1/seal/invoke`.
    invoke_endpoint: String,
    /// The session's security context.
    security_context: String,
    /// Each tool the context covers.
    tools: Vec<SealTool>,
}

/// One tool as MCP's `tools/list` names it.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema only: the gateway builds this JSON
pub struct SealTool {
    /// Tool name.
    name: String,
    /// What it does.
    description: String,
    /// JSON Schema of its arguments.
    #[schema(value_type = Object, rename = "inputSchema")]
    input_schema: Value,
}

/// A SEAL session as operators see it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionView {
    /// Session id.
    pub id: Uuid,
    /// The security context it is bound to.
    pub security_context: String,
    /// The workload that attested.
    pub workload_id: String,
    /// `active`, `revoked` or `expired`.
    pub state: String,
    /// When attested.
    pub created_at: DateTime<Utc>,
    /// When its token expires.
    pub expires_at: DateTime<Utc>,
    /// When revoked.
    pub revoked_at: Option<DateTime<Utc>>,
    /// Its sandbox, once it has one.
    pub sandbox_id: Option<Uuid>,
    /// Only in a revocation's answer: whether the session's sandbox was destroyed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_destroyed: Option<bool>,
}

impl SessionView {
    /// A session as operators see it, its state as of now.
    fn of(s: &Session) -> Self {
        SessionView {
            id: s.id,
            security_context: s.context_name.clone(),
            workload_id: s.workload_id.clone(),
            state: s.state(Utc::now()).to_owned(),
            created_at: s.created_at,
            expires_at: s.expires_at,
            revoked_at: s.revoked_at,
            sandbox_id: s.sandbox_id,
            sandbox_destroyed: None,
        }
    }
}

/// The answer of `POST /v1/security-contexts`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ContextStored {
    /// The context created or replaced.
    pub name: String,
    /// Always true: a refusal is an error answer.
    pub stored: bool,
}

/// The answer of `DELETE /v1/security-contexts/{name}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ContextDeleted {
    /// The context that is gone.
    pub name: String,
    /// Always true: a refusal is an error answer.
    pub deleted: bool,
}

fn seal_response(status: u16, body: Value, retry_after: Option<u64>) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    let mut response = (code, Json(body)).into_response();
    if let Some(secs) = retry_after {
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            response.headers_mut().insert("retry-after", v);
        }
    }
    response
}

/// Registers an ephemeral key for a workload under a security context.
#[utoipa::path(post, path = "/v1/seal/attest", operation_id = "seal_attest", tag = "seal",
    request_body = AttestRequest,
    responses((status = 200, description = "Admitted: the session and its token", body = Attested),
              (status = 400, description = "Not an attestation request", body = AttestRefused),
              (status = 401, description = "Workload not admitted (3000)", body = AttestRefused),
              (status = 403, description = "Unknown security context (3001)", body = AttestRefused),
              (status = 429, description = "Too many attestations from this address, with Retry-After", body = AttestRefused)))]
pub async fn attest(
    State(state): State<AppState>,
    peer: Option<Extension<ConnectInfo<crate::api::connection::Connection>>>,
    body: String,
) -> Response {
    let request: AttestRequest = match serde_json::from_str(&body) {
        Ok(r) => r,
        Err(e) => {
            let err = SealError::new(
                SealCode::AttestationFailed,
                format!("the attestation request must be {{public_key, workload_id, security_context}}: {e}"),
            );
            return seal_response(400, err.attestation_error_body(), None);
        }
    };
    let source = peer.map(|Extension(ConnectInfo(connection))| connection.addr.ip());
    match state
        .gateway
        .attest(&state.gateway_services(), request, source)
        .await
    {
        Ok(body) => seal_response(200, body, None),
        Err(e) => {
            let status = if e.retry_after_secs.is_some() {
                429
            } else {
                e.http_status()
            };
            seal_response(status, e.attestation_error_body(), e.retry_after_secs)
        }
    }
}

/// Runs one signed MCP request (`tools/call`, `tools/list`).
///
/// **Streaming form** (`Accept: text/event-stream`): refusals are the same error answers, before
/// any event; then Server-Sent Events `start`, `stdout`, `stderr` as a foreground `cmd.run`
/// writes its output, and last `result` carrying the answer of the call without streaming.
#[utoipa::path(post, path = "/v1/seal/invoke", operation_id = "seal_invoke", tag = "seal",
    request_body(content = SealEnvelope, description = "SEAL envelope"),
    responses((status = 200, description = "The JSON-RPC answer in a SEAL success; with `Accept: text/event-stream`, events `start`, `stdout`, `stderr`, then `result` carrying that same body",
                content((SealSuccess = "application/json"), (String = "text/event-stream"))),
              (status = 401, description = "Envelope or session refused (1xxx)", body = SealErrorAnswer),
              (status = 403, description = "Policy refused (2xxx)", body = SealErrorAnswer),
              (status = 429, description = "Rate limit (2005), with Retry-After", body = SealErrorAnswer)))]
pub async fn invoke(State(state): State<AppState>, headers: HeaderMap, body: String) -> Response {
    if super::tool_stream::wanted(&headers) {
        return invoke_streaming(state, body).await;
    }
    let invoked = crate::metrics::through(
        crate::metrics::Door::SealHttp,
        state.gateway.invoke(&state.gateway_services(), &body),
    )
    .await;
    match invoked {
        Ok(body) => seal_response(200, body, None),
        Err(refusal) => {
            let e = refusal.error;
            seal_response(
                e.http_status(),
                e.error_body(refusal.request_id.as_ref(), Utc::now()),
                e.retry_after_secs,
            )
        }
    }
}

/// The streaming form of [`invoke`] (`Accept: text/event-stream`, `tool_stream.rs`): a refusal
/// is the SEAL error answer, before any event; then `start`, `stdout`, `stderr` as a foreground
/// `cmd.run` writes, and `result` with the SEAL answer `invoke` gives.
async fn invoke_streaming(state: AppState, body: String) -> Response {
    let mut call = seal_invoke(state, crate::metrics::Door::SealHttp, body);
    match call.next().await {
        Some(Next::Chunk(first)) => super::tool_stream::respond(first, call, |ended| match ended {
            Ok(Ok(body)) => super::tool_stream::json_event("result", &body),
            Ok(Err(refusal)) => super::tool_stream::json_event(
                "error",
                &refusal
                    .error
                    .error_body(refusal.request_id.as_ref(), Utc::now()),
            ),
            Err(failed) => {
                super::tool_stream::json_event("error", &serde_json::json!({"error": failed}))
            }
        }),
        Some(Next::End(Ok(Ok(body)))) => {
            super::tool_stream::only(super::tool_stream::json_event("result", &body))
        }
        Some(Next::End(Ok(Err(refusal)))) => {
            let e = refusal.error;
            seal_response(
                e.http_status(),
                e.error_body(refusal.request_id.as_ref(), Utc::now()),
                e.retry_after_secs,
            )
        }
        Some(Next::End(Err(failed))) => ApiError::internal(failed).into_response(),
        None => ApiError::internal("the call ended without an answer").into_response(),
    }
}

/// `?security_token=` (or `Authorization: Bearer <security token>`).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ToolsQuery {
    /// The session's security token.
    pub security_token: Option<String>,
}

/// The tools a session may call.
#[utoipa::path(get, path = "/v1/seal/tools", operation_id = "seal_tools", tag = "seal", params(ToolsQuery),
    responses((status = 200, description = "The session's tools", body = SealTools),
              (status = 401, description = "Missing or invalid token", body = SealErrorAnswer),
              (status = 403, description = "The session's context is gone", body = SealErrorAnswer)))]
pub async fn tools(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<ToolsQuery>,
) -> Response {
    let token = q.security_token.or_else(|| {
        headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_owned)
    });
    let Some(token) = token else {
        let e = SealError::new(
            SealCode::TokenVerificationFailed,
            "give the session's security token (?security_token= or Authorization: Bearer)",
        );
        return seal_response(401, e.error_body(None, Utc::now()), None);
    };
    match state
        .gateway
        .tools_for_token(&state.gateway_services(), &token)
        .await
    {
        Ok(body) => seal_response(200, body, None),
        Err(e) => seal_response(e.http_status(), e.error_body(None, Utc::now()), None),
    }
}

/// `?all=true` includes revoked and expired sessions.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct SessionsQuery {
    /// Include ended sessions.
    #[serde(default)]
    pub all: bool,
}

/// SEAL sessions (live ones unless `?all=true`).
#[utoipa::path(get, path = "/v1/seal/sessions", operation_id = "list_seal_sessions", tag = "seal", params(SessionsQuery),
    responses((status = 200, description = "Sessions", body = Vec<SessionView>)), security(("api_key" = [])))]
pub async fn list_sessions(
    Call { state, caller }: Call,
    Query(q): Query<SessionsQuery>,
) -> Result<Json<Vec<SessionView>>, ApiError> {
    let list = sessions::list(&state.pool, &caller.tenant, !q.all).await?;
    Ok(Json(list.iter().map(SessionView::of).collect()))
}

/// One SEAL session.
#[utoipa::path(get, path = "/v1/seal/sessions/{id}", operation_id = "get_seal_session", tag = "seal", params(("id" = Uuid, Path, description = "Session id")),
    responses((status = 200, description = "Session", body = SessionView), (status = 404, description = "Unknown", body = ErrorBody)), security(("api_key" = [])))]
pub async fn get_session(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
) -> Result<Json<SessionView>, ApiError> {
    let s = sessions::get(&state.pool, &caller.tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no SEAL session {id}")))?;
    Ok(Json(SessionView::of(&s)))
}

/// Revokes a session at once (later calls get 1006) and destroys its sandbox.
#[utoipa::path(delete, path = "/v1/seal/sessions/{id}", operation_id = "revoke_seal_session", tag = "seal", params(("id" = Uuid, Path, description = "Session id")),
    responses((status = 200, description = "Revoked, with `sandbox_destroyed`", body = SessionView), (status = 404, description = "Unknown", body = ErrorBody)), security(("api_key" = [])))]
pub async fn revoke_session(
    Call { state, caller }: Call,
    Path(id): Path<Uuid>,
) -> Result<Json<SessionView>, ApiError> {
    require(&caller, Need::Write)?;
    let started = Instant::now();
    let s = sessions::revoke(&state.pool, &caller.tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no SEAL session {id}")))?;
    let mut sandbox_destroyed = false;
    if let Some(sandbox) = s.sandbox_id {
        if state
            .sandboxes
            .destroy(dispatcher::SandboxId(sandbox))
            .await
            .is_ok()
        {
            sessions::clear_sandbox(&state.pool, id).await?;
            sandbox_destroyed = true;
        }
    }
    audit::record_admin(
        &state.pool,
        &caller,
        "seal.session.revoke",
        &json!({"session_id": id}),
        true,
        started,
    )
    .await?;
    Ok(Json(SessionView {
        sandbox_destroyed: Some(sandbox_destroyed),
        ..SessionView::of(&s)
    }))
}

impl From<ContextError> for ApiError {
    fn from(e: ContextError) -> Self {
        match e {
            ContextError::Invalid(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_security_context",
                e.to_string(),
            ),
            ContextError::NotFound(_) => ApiError::not_found(e.to_string()),
            ContextError::Db(e) => ApiError::internal(e),
        }
    }
}

/// Every security context, enrolment secrets shown only as `set` / `not set` (for every role).
#[utoipa::path(get, path = "/v1/security-contexts", operation_id = "list_security_contexts", tag = "seal",
    responses((status = 200, description = "Contexts, `attestation.enrolment_secret` as `set` or `not set`", body = Vec<SecurityContext>)), security(("api_key" = [])))]
pub async fn list_contexts(Call { state, caller }: Call) -> Result<Json<Value>, ApiError> {
    let list = contexts::list(&state.pool, &caller.tenant).await?;
    Ok(Json(Value::Array(
        list.iter().map(|c| c.redacted()).collect(),
    )))
}

/// One security context, its enrolment secret shown only as `set` / `not set`.
#[utoipa::path(get, path = "/v1/security-contexts/{name}", operation_id = "get_security_context", tag = "seal", params(("name" = String, Path, description = "Context name")),
    responses((status = 200, description = "Context, `attestation.enrolment_secret` as `set` or `not set`", body = SecurityContext), (status = 404, description = "Unknown", body = ErrorBody)), security(("api_key" = [])))]
pub async fn get_context(
    Call { state, caller }: Call,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let ctx = contexts::get(&state.pool, &caller.tenant, &name).await?;
    Ok(Json(ctx.redacted()))
}

/// Creates or replaces a security context (validated before anything is stored).
///
/// The body is read as JSON and parsed by `contexts::parse`, the config file's strict rules, so
/// a refusal names the field (`capabilities[1].rate_limit.calls`) as the config check does.
#[utoipa::path(post, path = "/v1/security-contexts", operation_id = "put_security_context", tag = "seal", request_body = SecurityContext,
    responses((status = 200, description = "Stored", body = ContextStored), (status = 422, description = "Invalid", body = ErrorBody)), security(("api_key" = [])))]
pub async fn put_context(
    Call { state, caller }: Call,
    Json(definition): Json<Value>,
) -> Result<Json<ContextStored>, ApiError> {
    require(&caller, Need::Write)?;
    let started = Instant::now();
    let ctx = contexts::parse(&definition)?;
    contexts::upsert(&state.pool, &caller.tenant, &ctx, "api").await?;
    // Other nodes hear of the edit; this one applies it before answering.
    state.api_keys.forget_context(&ctx.name);
    audit::record_admin(
        &state.pool,
        &caller,
        "security_context.put",
        &json!({"name": ctx.name}),
        true,
        started,
    )
    .await?;
    Ok(Json(ContextStored {
        name: ctx.name,
        stored: true,
    }))
}

/// Deletes a security context; sessions under it can no longer call anything.
#[utoipa::path(delete, path = "/v1/security-contexts/{name}", operation_id = "delete_security_context", tag = "seal", params(("name" = String, Path, description = "Context name")),
    responses((status = 200, description = "Deleted", body = ContextDeleted), (status = 404, description = "Unknown", body = ErrorBody)), security(("api_key" = [])))]
pub async fn delete_context(
    Call { state, caller }: Call,
    Path(name): Path<String>,
) -> Result<Json<ContextDeleted>, ApiError> {
    require(&caller, Need::Write)?;
    let started = Instant::now();
    contexts::delete(&state.pool, &caller.tenant, &name).await?;
    state.api_keys.forget_context(&name);
    audit::record_admin(
        &state.pool,
        &caller,
        "security_context.delete",
        &json!({"name": name}),
        true,
        started,
    )
    .await?;
    Ok(Json(ContextDeleted {
        name,
        deleted: true,
    }))
}

/// Body of `POST /v1/security-contexts/{name}/attestation-tokens`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueToken {
    /// Only this workload id may use the token (default: any workload the context's patterns
    /// admit).
    #[serde(default)]
    pub workload_id: Option<String>,
    /// Lifetime, seconds (default 3600, at most 7 days).
    #[serde(default)]
    pub ttl_secs: Option<i64>,
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        match e {
            TokenError::BadTtl | TokenError::Refused(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                e.to_string(),
            ),
            TokenError::Random(_) => ApiError::internal(e),
            TokenError::Db(e) => ApiError::internal(e),
        }
    }
}

/// Issues a one-time attestation token for a context: shown once, stored hashed, expires.
#[utoipa::path(post, path = "/v1/security-contexts/{name}/attestation-tokens", operation_id = "issue_attestation_token", tag = "seal",
    params(("name" = String, Path, description = "Context name")), request_body = IssueToken,
    responses((status = 201, description = "The token (shown only now) and its listing data", body = IssuedToken),
              (status = 404, description = "Unknown context", body = ErrorBody),
              (status = 422, description = "Bad lifetime", body = ErrorBody)),
    security(("api_key" = [])))]
pub async fn issue_token(
    Call { state, caller }: Call,
    Path(name): Path<String>,
    body: Option<Json<IssueToken>>,
) -> Result<(StatusCode, Json<IssuedToken>), ApiError> {
    require(&caller, Need::Write)?;
    let started = Instant::now();
    let req = body.map(|Json(b)| b).unwrap_or_default();
    contexts::get(&state.pool, &caller.tenant, &name).await?;
    let issued = attestation_tokens::issue(
        &state.pool,
        &caller.tenant,
        &name,
        req.workload_id.as_deref().filter(|w| !w.is_empty()),
        req.ttl_secs,
        &caller.id,
    )
    .await;
    audit::record_admin(
        &state.pool,
        &caller,
        "security_context.attestation_token.issue",
        &json!({"security_context": name, "workload_id": req.workload_id,
                "token_id": issued.as_ref().ok().map(|t| t.info.id)}),
        issued.is_ok(),
        started,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(issued?)))
}

/// The attestation tokens of a context (never the tokens themselves).
#[utoipa::path(get, path = "/v1/security-contexts/{name}/attestation-tokens", operation_id = "list_attestation_tokens", tag = "seal",
    params(("name" = String, Path, description = "Context name")),
    responses((status = 200, description = "Tokens, newest first", body = Vec<TokenInfo>)),
    security(("api_key" = [])))]
pub async fn list_tokens(
    Call { state, caller }: Call,
    Path(name): Path<String>,
) -> Result<Json<Vec<TokenInfo>>, ApiError> {
    let list = attestation_tokens::list(&state.pool, &caller.tenant, &name)
        .await
        .map_err(ApiError::internal)?;
    Ok(Json(list))
}
