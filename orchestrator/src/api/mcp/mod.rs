//! The MCP endpoint: Streamable HTTP at `/mcp` (rmcp, the official Rust SDK), for the clients
//! people use (editors, agent frameworks, the MCP SDKs).
//!
//! Requests pass, in order: the Origin check (403, against DNS rebinding from browsers), the
//! bearer API key (401 with `WWW-Authenticate: Bearer resource_metadata=...` so clients find the
//! RFC 9728 metadata document), the key's binding to a security context (403 when unbound), then
//! rmcp (Host check, protocol versions, sessions) and the handler in `server.rs`. Sessions
//! (revisions up to 2025-11-25) live in rmcp's local session manager and end on DELETE or after
//! `mcp.session_idle_secs`; the session-less revision (2026-07-28) is served too.

mod images;
mod sandboxes;
mod server;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, HOST, ORIGIN, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tower_http::trace::TraceLayer;

use crate::auth::{self, AuthError, BoundKey};
use crate::seal::context::{RateLimiter, SecurityContext};
use crate::state::AppState;

/// Path of the endpoint.
pub const MCP_PATH: &str = "/mcp";
/// Path of the OAuth protected resource metadata (RFC 9728) of `/mcp`.
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// Who is calling `/mcp`: the key and the security context it is bound to.
#[derive(Clone)]
pub struct McpIdentity {
    /// The presented key.
    pub key: BoundKey,
    /// Its security context.
    pub context: Arc<SecurityContext>,
}

/// The `/mcp` service and the metadata documents, to merge into the HTTP router; `shutdown`
/// closes every MCP session when the instance stops.
pub fn routes(state: AppState, shutdown: CancellationToken) -> Router {
    let config = state.config.mcp.clone();
    let shared = Arc::new(server::Shared {
        state: state.clone(),
        sandboxes: sandboxes::SessionSandboxes::default(),
        limiter: Arc::new(RateLimiter::new()),
        idle_secs: config.session_idle_secs,
    });
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(Duration::from_secs(config.session_idle_secs));
    let factory = shared.clone();
    let service = StreamableHttpService::new(
        move || Ok(server::McpServer::new(factory.clone())),
        Arc::new(sessions),
        // Origins are checked before authentication (below); rmcp checks Host.
        StreamableHttpServerConfig::default()
            .with_allowed_hosts(config.allowed_hosts.clone())
            .with_cancellation_token(shutdown),
    );
    let gate_state = Gate {
        state: state.clone(),
        contexts: Arc::new(ContextCache::default()),
        owners: Arc::new(SessionOwners::new(Duration::from_secs(
            config.session_idle_secs,
        ))),
    };
    let mcp = Router::new()
        .fallback_service(service)
        .layer(axum::middleware::from_fn_with_state(gate_state, gate));
    Router::new()
        .route(METADATA_PATH, get(metadata))
        .route(&format!("{METADATA_PATH}{MCP_PATH}"), get(metadata))
        .nest_service(MCP_PATH, mcp)
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// The public base URL: `mcp.public_url`, else `http://<Host>`.
fn base_url(state: &AppState, headers: &HeaderMap) -> String {
    if let Some(url) = &state.config.mcp.public_url {
        return url.trim_end_matches('/').to_owned();
    }
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    format!("http://{host}")
}

/// RFC 9728 protected resource metadata: the resource and how to present a token.
async fn metadata(State(state): State<AppState>, headers: HeaderMap) -> Json<serde_json::Value> {
    let base = base_url(&state, &headers);
    Json(json!({
        "resource": format!("{base}{MCP_PATH}"),
        "authorization_servers": [],
        "bearer_methods_supported": ["header"],
        "resource_name": "AEGIS orchestrator (MCP)",
        "resource_documentation": format!("{base}/openapi.json"),
    }))
}

/// True when `origin` matches an allowed entry (`scheme://host[:port]`, `:*` for any port).
fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    allowed.iter().any(|entry| match entry.strip_suffix(":*") {
        Some(base) => {
            origin.eq_ignore_ascii_case(base)
                || origin
                    .get(..base.len())
                    .is_some_and(|head| head.eq_ignore_ascii_case(base))
                    && origin[base.len()..].strip_prefix(':').is_some_and(|port| {
                        !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
                    })
        }
        None => origin.eq_ignore_ascii_case(entry),
    })
}

fn refusal(status: StatusCode, code: &str, message: String) -> Response {
    (
        status,
        Json(json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32001, "message": message, "data": {"code": code}}})),
    )
        .into_response()
}

/// What the gate needs: the service state, the parsed contexts and who opened each session.
#[derive(Clone)]
struct Gate {
    state: AppState,
    contexts: Arc<ContextCache>,
    owners: Arc<SessionOwners>,
}

/// The API key that opened each live MCP session of this node. A session id is not a secret
/// a key may borrow: a request (POST, GET, DELETE) that names a session this key did not open
/// (another key's, or one this node does not know) is answered exactly as rmcp answers for a
/// session that does not exist, before rmcp sees it, and changes nothing.
struct SessionOwners {
    by_session: Mutex<HashMap<String, (uuid::Uuid, std::time::Instant)>>,
    /// rmcp closes a session idle this long: its entry may be forgotten after it.
    idle: Duration,
}

/// Entries kept before idle ones are pruned; and at most (past it new sessions are refused:
/// an owner is never forgotten while its session may live).
const PRUNE_SESSIONS_AT: usize = 4_096;
const MAX_REMEMBERED_SESSIONS: usize = 100_000;

impl SessionOwners {
    fn new(idle: Duration) -> Self {
        Self {
            by_session: Mutex::default(),
            idle,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (uuid::Uuid, std::time::Instant)>> {
        self.by_session.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True when `key` opened `session` (and the session is then marked as used now).
    fn may_use(&self, session: &str, key: uuid::Uuid) -> bool {
        match self.lock().get_mut(session) {
            Some((owner, seen)) if *owner == key => {
                *seen = std::time::Instant::now();
                true
            }
            _ => false,
        }
    }

    fn opened(&self, session: String, key: uuid::Uuid) {
        let mut owners = self.lock();
        if owners.len() >= PRUNE_SESSIONS_AT {
            // With a margin past rmcp's own idle close, so a live session is never forgotten.
            let horizon = self.idle + Duration::from_secs(60);
            owners.retain(|_, (_, seen)| seen.elapsed() < horizon);
        }
        if owners.len() >= MAX_REMEMBERED_SESSIONS {
            tracing::warn!(
                sessions = owners.len(),
                "too many live MCP sessions; the new one is refused on its next request"
            );
            return;
        }
        owners.insert(session, (key, std::time::Instant::now()));
    }

    fn ended(&self, session: &str) {
        self.lock().remove(session);
    }
}

/// rmcp's answer for a session it does not have, given for another key's session too.
fn no_such_session() -> Response {
    (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response()
}

/// Parsed security contexts by name, with the version (digest of the stored definition) each
/// was parsed from: a request reads the version with its key, so an edited context is parsed
/// again on its next request and an unchanged one is not parsed on every request.
#[derive(Default)]
struct ContextCache {
    by_name: Mutex<HashMap<String, (String, Arc<SecurityContext>)>>,
}

impl ContextCache {
    /// The context `name` at `version`: cached, or read and parsed (and cached).
    async fn get(
        &self,
        state: &AppState,
        name: &str,
        version: &str,
    ) -> Result<Arc<SecurityContext>, crate::contexts::ContextError> {
        if let Some((v, context)) = self.lock().get(name) {
            if v == version {
                return Ok(context.clone());
            }
        }
        let (context, version) =
            crate::contexts::get_versioned(&state.pool, crate::DEFAULT_TENANT, name).await?;
        let context = Arc::new(context);
        self.lock()
            .insert(name.to_owned(), (version, context.clone()));
        Ok(context)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Arc<SecurityContext>)>> {
        self.by_name.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Origin, bearer key and context binding, before rmcp sees the request.
async fn gate(
    State(Gate {
        state,
        contexts,
        owners,
    }): State<Gate>,
    mut request: Request,
    next: Next,
) -> Response {
    if let Some(origin) = request.headers().get(ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !origin_allowed(origin, &state.config.mcp.allowed_origins) {
            return refusal(
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                format!("Origin `{origin}` is not allowed on /mcp (mcp.allowed_origins)"),
            );
        }
    }
    let presented = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
        })
        .map(|k| k.trim().to_owned());
    // Built before any await: the request body is not Sync, so no borrow of it may cross one.
    let hint = format!(
        "Bearer resource_metadata=\"{}{METADATA_PATH}{MCP_PATH}\"",
        base_url(&state, request.headers())
    );
    let unauthorized = |why: String| {
        let mut response = refusal(StatusCode::UNAUTHORIZED, "unauthorized", why);
        if let Ok(value) = HeaderValue::from_str(&hint) {
            response.headers_mut().insert(WWW_AUTHENTICATE, value);
        }
        response
    };
    let Some(presented) = presented else {
        return unauthorized(AuthError::Missing.to_string());
    };
    let key = match auth::authenticate_bound(&state.pool, &state.api_keys, &presented).await {
        Ok(key) => key,
        Err(e @ AuthError::Invalid(_)) => return unauthorized(e.to_string()),
        Err(e) => {
            tracing::error!(error = %e, "MCP authentication failed");
            return refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "authentication is unavailable; retry later".to_owned(),
            );
        }
    };
    let Some(context_name) = key.security_context.clone() else {
        return refusal(
            StatusCode::FORBIDDEN,
            "key_not_bound",
            format!(
                "API key `{}` is not bound to a security context; an admin creates MCP keys with \
                 POST /v1/api-keys {{\"security_context\": \"<name>\", ...}}",
                key.name
            ),
        );
    };
    let unusable = |e: String| {
        refusal(
            StatusCode::FORBIDDEN,
            "context_unavailable",
            format!("the key's security context `{context_name}` is unusable: {e}"),
        )
    };
    let Some(version) = key.context_version.clone() else {
        return unusable(crate::contexts::ContextError::NotFound(context_name.clone()).to_string());
    };
    let context = match contexts.get(&state, &context_name, &version).await {
        Ok(c) => c,
        Err(e) => return unusable(e.to_string()),
    };
    let session = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let key_id = key.id;
    if let Some(session) = &session {
        if !owners.may_use(session, key_id) {
            tracing::warn!(key = %key_id, "an MCP request named a session its key did not open; answered as unknown");
            return no_such_session();
        }
    }
    let ending = request.method() == axum::http::Method::DELETE;
    request
        .extensions_mut()
        .insert(McpIdentity { key, context });
    let mut response = next.run(request).await;
    if ending && response.status() == StatusCode::ACCEPTED {
        // rmcp answers a session's end with 202; the official SDKs take only 200 or 204 as
        // success (Python logs "Session termination failed: 202"). Nothing follows: 204.
        response = StatusCode::NO_CONTENT.into_response();
    }
    match &session {
        // A new session (the answer to `initialize`) belongs to the key that opened it.
        None => {
            if let Some(opened) = response
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
            {
                owners.opened(opened.to_owned(), key_id);
            }
        }
        Some(session) => {
            if (ending && response.status().is_success())
                || response.status() == StatusCode::NOT_FOUND
            {
                owners.ended(session);
            }
        }
    }
    response
}

/// The header that carries an MCP session's id.
const SESSION_HEADER: &str = "mcp-session-id";

#[cfg(test)]
mod tests {
    use super::origin_allowed;

    #[test]
    fn origins_match_scheme_host_and_port() {
        let allowed = vec![
            "http://localhost:*".to_owned(),
            "https://app.example".to_owned(),
        ];
        assert!(origin_allowed("http://localhost:8080", &allowed));
        assert!(origin_allowed("http://localhost", &allowed));
        assert!(origin_allowed("https://app.example", &allowed));
        assert!(!origin_allowed("http://localhost.evil.example", &allowed));
        assert!(!origin_allowed("http://localhost:80x", &allowed));
        assert!(!origin_allowed("https://app.example:444", &allowed));
        assert!(!origin_allowed("http://evil.example", &allowed));
        assert!(!origin_allowed("null", &allowed));
    }
}
