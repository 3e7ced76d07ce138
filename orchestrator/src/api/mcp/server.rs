//! The MCP server handler: `tools/list` and `tools/call` for one MCP session, through the same
//! policy, router and audit as SEAL and REST calls.
//!
//! rmcp makes one handler per MCP session (per request for the session-less revision); the
//! caller's identity comes from the HTTP request (the auth middleware puts it in the request's
//! extensions, rmcp hands the request parts to the handler). A call is evaluated against the
//! key's security context first (like a SEAL envelope: `policy::preview_seal`), so a refused call
//! never creates a sandbox; a refusal is a tool error (`isError`), audited like every other door.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Value};

use super::sandboxes::{Owner, SessionSandboxes};
use super::McpIdentity;
use crate::api::request_id::RequestId;
use crate::api::streaming::{chunk_json, Next, StreamingCall};
use crate::audit::{self, Entry, EntryKind};
use crate::caller::{Caller, CallerKind, SealScope};
use crate::metrics::{Decision, Door};
use crate::seal::context::RateLimiter;
use crate::state::AppState;
use crate::tools::{self, CallError, OutputChunk};
use tracing::Instrument;

/// What every handler of this node shares.
pub struct Shared {
    /// Service state.
    pub state: AppState,
    /// The sandboxes of live MCP sessions.
    pub sandboxes: SessionSandboxes,
    /// Rate-limit state of the contexts' capabilities, per MCP session.
    pub limiter: Arc<RateLimiter>,
    /// `mcp.session_idle_secs`.
    pub idle_secs: u64,
}

/// Ends the session's sandbox when rmcp drops the session's handler (DELETE or idle timeout).
struct SessionGuard {
    shared: Arc<Shared>,
    owner: Mutex<Option<Owner>>,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let owner = self.owner.lock().unwrap_or_else(|p| p.into_inner()).take();
        let (Some(owner), Ok(runtime)) = (owner, tokio::runtime::Handle::try_current()) else {
            return;
        };
        let shared = self.shared.clone();
        runtime.spawn(async move { shared.sandboxes.end(&shared.state, &owner).await });
    }
}

/// One MCP session's handler.
pub struct McpServer {
    shared: Arc<Shared>,
    guard: SessionGuard,
}

impl McpServer {
    /// A handler for a new session.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            guard: SessionGuard {
                shared: shared.clone(),
                owner: Mutex::new(None),
            },
            shared,
        }
    }

    /// The caller of this request and the sandbox owner it acts for.
    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Result<(Caller, Owner), ErrorData> {
        let parts = ctx
            .extensions
            .get::<axum::http::request::Parts>()
            .ok_or_else(|| ErrorData::internal_error("the HTTP request is not available", None))?;
        let identity = parts
            .extensions
            .get::<McpIdentity>()
            .cloned()
            .ok_or_else(|| ErrorData::internal_error("the request was not authenticated", None))?;
        let session = parts
            .headers
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let owner = Owner {
            key_id: identity.key.id,
            session: session.clone(),
        };
        if session.is_some() {
            let mut held = self.guard.owner.lock().unwrap_or_else(|p| p.into_inner());
            match held.as_ref() {
                None => *held = Some(owner.clone()),
                Some(first) if first.key_id != owner.key_id => {
                    return Err(ErrorData::invalid_request(
                        "this MCP session was opened with another API key",
                        None,
                    ))
                }
                Some(_) => {}
            }
        }
        let scope = SealScope {
            context: identity.context.clone(),
            limiter: self.shared.limiter.clone(),
            session_key: format!(
                "mcp:{}:{}",
                identity.key.id,
                session.as_deref().unwrap_or("-")
            ),
            ceilings: Vec::new(),
        };
        let caller = Caller {
            kind: CallerKind::ApiKey,
            id: identity.key.id.to_string(),
            label: format!("mcp:{}", identity.key.name),
            tier: identity.context.tier,
            role: None,
            tenant: crate::DEFAULT_TENANT.to_owned(),
            seal: Some(scope),
        };
        Ok((caller, owner))
    }

    /// Audits a refusal that happened before the router, and turns it into a tool error.
    async fn refuse(
        &self,
        caller: &Caller,
        name: &str,
        arguments: &Value,
        code: &str,
        message: String,
        started: Instant,
    ) -> Result<CallToolResponse, ErrorData> {
        let entry = Entry::denied(
            EntryKind::Tool,
            name,
            code,
            crate::arguments::scrub(&message, arguments),
            audit::digest(arguments),
            started.elapsed(),
        );
        // Refused at this door, before the router: counted like the router's refusals.
        crate::metrics::tool_call(name, Door::Mcp, Decision::Refused, started.elapsed());
        audit::record(&self.shared.state.pool, caller, entry)
            .await
            .map_err(|e| ErrorData::internal_error(format!("audit log unavailable: {e}"), None))?;
        tool_error(code, &message)
    }
}

/// The answer to a request its client cancelled (which the client no longer reads).
fn cancelled() -> ErrorData {
    ErrorData::internal_error("the request was cancelled by the client", None)
}

impl McpServer {
    /// The streaming form of a call whose request carries a `progressToken`
    /// (`api/streaming.rs`): a foreground `cmd.run`'s output goes to the client as
    /// `notifications/progress` of that token as it comes (`progress` = output bytes so far,
    /// `message` = the chunk, `_meta` `aegis/stream` = `stdout` or `stderr` and `aegis/encoding`
    /// = `utf8` or `base64`), then the call answers as it would without them. A cancelled
    /// request drops the call, which kills the command.
    async fn streamed(
        &self,
        ctx: &RequestContext<RoleServer>,
        token: ProgressToken,
        caller: &Caller,
        name: &str,
        arguments: Value,
        sandbox: Option<dispatcher::SandboxId>,
    ) -> Result<Result<tools::ToolOutcome, CallError>, ErrorData> {
        let (state, caller, name) = (self.shared.state.clone(), caller.clone(), name.to_owned());
        let mut call = StreamingCall::start(move |sink| async move {
            crate::metrics::through(
                Door::Mcp,
                tools::invoke_streaming(&state, &caller, &name, arguments, sandbox, sink),
            )
            .await
        });
        let mut progress = 0u64;
        loop {
            let next = tokio::select! {
                next = call.next() => next,
                () = ctx.ct.cancelled() => return Err(cancelled()),
            };
            let (stream, bytes) = match next {
                Some(Next::Chunk(OutputChunk::Stdout(bytes))) => ("stdout", bytes),
                Some(Next::Chunk(OutputChunk::Stderr(bytes))) => ("stderr", bytes),
                Some(Next::Chunk(OutputChunk::Started { .. })) => continue,
                Some(Next::End(ended)) => {
                    return ended.map_err(|e| ErrorData::internal_error(e, None))
                }
                None => {
                    return Err(ErrorData::internal_error(
                        "the call ended without an answer",
                        None,
                    ))
                }
            };
            progress += bytes.len() as u64;
            let mut chunk = chunk_json(&bytes);
            let param = json!({
                "progressToken": token,
                "progress": progress as f64,
                "message": chunk["data"].take(),
                "_meta": {"aegis/stream": stream, "aegis/encoding": chunk["encoding"]},
            });
            match serde_json::from_value::<ProgressNotificationParam>(param) {
                // A client that stopped reading still gets the answer (or cancels).
                Ok(param) => {
                    let _ = ctx.peer.notify_progress(param).await;
                }
                Err(e) => tracing::warn!(error = %e, "a progress notification could not be built"),
            }
        }
    }
}

/// A refusal as an MCP tool result (`isError: true`), so the model sees why.
fn tool_error(code: &str, message: &str) -> Result<CallToolResponse, ErrorData> {
    to_response(json!({
        "content": [{"type": "text", "text": format!("refused ({code}): {message}")}],
        "isError": true,
    }))
}

fn to_response(mut value: Value) -> Result<CallToolResponse, ErrorData> {
    value["resultType"] = json!("complete");
    serde_json::from_value::<CallToolResult>(value)
        .map(CallToolResponse::from)
        .map_err(|e| ErrorData::internal_error(format!("result shape: {e}"), None))
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "aegis-orchestrator",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Tools of an AEGIS orchestrator node. cmd.run and fs.* act in this session's \
                 own sandbox; what you may call is decided by the API key's security context.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let (caller, _) = self.caller(&ctx)?;
        let catalog =
            tools::catalog().map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let (external, _) = tools::external::all(&self.shared.state).await;
        let listed: Vec<Value> = catalog
            .iter()
            .chain(external.iter())
            .filter(|t| crate::policy::may_see(&caller, t))
            .map(|t| {
                let mut tool = json!({
                    "name": t.name,
                    "description": t.description,
                    "inputSchema": t.input_schema,
                    "_meta": {"aegis/tier": t.tier, "aegis/skip_judge": t.skip_judge},
                });
                if t.output_schema["type"] == "object" {
                    tool["outputSchema"] = t.output_schema.clone();
                }
                tool
            })
            .collect();
        // `resultType` is required by the session-less revision; rmcp drops it for older peers.
        serde_json::from_value(json!({ "tools": listed, "resultType": "complete" }))
            .map_err(|e| ErrorData::internal_error(format!("tool listing: {e}"), None))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // rmcp runs the call in its session's task: the HTTP request's span does not reach it,
        // so the call gets its own span with the request id the HTTP layer assigned.
        let request_id = ctx
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<RequestId>())
            .map(|r| r.0.clone())
            .unwrap_or_default();
        let span = tracing::error_span!("mcp_call", request_id = %request_id, tool = %request.name);
        crate::metrics::through(Door::Mcp, self.call_tool_traced(request, ctx))
            .instrument(span)
            .await
    }
}

impl McpServer {
    async fn call_tool_traced(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let started = Instant::now();
        let (caller, owner) = self.caller(&ctx)?;
        let name = request.name.to_string();
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let shared = &self.shared;

        // The security context previewed first, for every tool (implemented or not), like SEAL;
        // the router decides the call itself.
        let Some(scope) = caller.seal.as_ref() else {
            return Err(ErrorData::internal_error("no security context", None));
        };
        let size_limit = match crate::policy::preview_seal(scope, &name, &arguments) {
            Ok(limit) => limit,
            Err(denial) => {
                let code = denial.code.to_owned();
                return self
                    .refuse(&caller, &name, &arguments, &code, denial.message, started)
                    .await;
            }
        };

        let sandbox = if crate::policy::needs_sandbox(&name) {
            let context = scope.context.clone();
            let key_name = caller.label.trim_start_matches("mcp:").to_owned();
            match shared
                .sandboxes
                .sandbox_for(&shared.state, &owner, &key_name, &context, shared.idle_secs)
                .await
            {
                Ok(id) => Some(id),
                Err(message) => {
                    return self
                        .refuse(
                            &caller,
                            &name,
                            &arguments,
                            "sandbox_unavailable",
                            message,
                            started,
                        )
                        .await
                }
            }
        } else {
            None
        };

        let invoked = match ctx.meta.get_progress_token() {
            // Progress asked for, and no capability judges the whole result's size (output sent
            // as it comes would escape `max_response_size`): the streaming form.
            Some(token) if size_limit.is_none() => {
                self.streamed(&ctx, token, &caller, &name, arguments, sandbox)
                    .await?
            }
            _ => {
                tokio::select! {
                    invoked = tools::invoke_in(&shared.state, &caller, &name, arguments, sandbox) => invoked,
                    // The client cancelled the request: the call is dropped (a running command
                    // is cancelled, its intent completed `cancelled`).
                    () = ctx.ct.cancelled() => return Err(cancelled()),
                }
            }
        };
        match invoked {
            Ok(outcome) => {
                let mcp = super::images::with_images(&name, outcome.into_mcp());
                if let Some(limit) = size_limit {
                    let size = tools::serialized_len(&mcp) as u64;
                    if size > limit {
                        // The capability's max_response_size: withheld, not truncated.
                        return tool_error(
                            "response_too_large",
                            &format!("the result of {name} is {size} bytes; the security context allows {limit} (max_response_size)"),
                        );
                    }
                }
                to_response(mcp)
            }
            Err(e @ (CallError::Audit(_) | CallError::Catalog(_))) => {
                Err(ErrorData::internal_error(e.to_string(), None))
            }
            // Refused by the router (already audited there): a tool error the model can read.
            Err(e) => {
                let code = match &e {
                    CallError::Denied { denial, .. } => denial.code,
                    CallError::UnknownTool { .. } => "unknown_tool",
                    CallError::InvalidArguments { .. } => "invalid_arguments",
                    CallError::Unavailable { .. } => "tool_unavailable",
                    _ => "refused",
                };
                tool_error(code, &e.to_string())
            }
        }
    }
}
