//! The tools of external MCP servers (`mcp:<server>/<tool>`) as catalog entries, and their one
//! handler.
//!
//! The built-in catalog is fixed at build time; these entries come from the servers' listings
//! (`aegis_egress::mcp_servers`) and are made when they are looked up, so the router treats them as
//! it treats any tool: the listed input schema validates the arguments, the server's
//! configured tier and the caller's security context decide, the call is audited (intent and
//! completion) under its full name. The handler adds the caller's domain rules (the
//! `domain_allowlist` of the capabilities covering the tool, in the caller's context and its
//! starters') to the egress gate the server's connection already passed, and turns the
//! server's failures into tool errors with stable codes.

use serde_json::{json, Value};

use super::{Handler, HandlerFuture, ToolContext, ToolError, ToolSpec};
use crate::state::AppState;
use aegis_egress::mcp_servers::{self, McpError, RemoteTool};
use aegis_egress::DomainPolicy;

/// The category of every external tool.
pub(crate) const CATEGORY: &str = "mcp";

/// The handler of every external tool.
pub(crate) const HANDLER: Handler = call;

/// An external tool's catalog entry, built from its listing and its server's configuration.
fn entry(remote: &RemoteTool, config: &mcp_servers::McpServerConfig) -> ToolSpec {
    ToolSpec {
        name: remote.full_name.clone(),
        description: remote.description.clone(),
        tier: config.tier,
        skip_judge: config.skip_judge,
        category: CATEGORY.to_owned(),
        source: remote.server.clone(),
        input_schema: remote.input_schema.clone(),
        output_schema: output_schema(),
        validator: remote.validator.clone(),
    }
}

/// What every external tool answers on success (`aegis_egress::mcp_servers::result`).
fn output_schema() -> Value {
    json!({"type": "object", "properties": {
        "content": {"type": "array", "description": "The server's content blocks: text (cut to the server's max_result_bytes), binary blocks described only."},
        "structuredContent": {"description": "The server's structured result, when it sent one that fits."},
        "truncated": {"type": "boolean", "description": "True when anything was cut or left out."}
    }, "required": ["content", "truncated"], "additionalProperties": true})
}

/// Why a name that looks like an external tool could not be looked up.
#[derive(Debug)]
pub(crate) struct Unavailable(pub(crate) String);

/// The catalog entry of `name` if it is a tool of a configured server's listing; `Ok(None)`
/// for names that are not (the router's unknown tool); `Err` when the server's tools cannot
/// be listed now.
pub(crate) async fn lookup(state: &AppState, name: &str) -> Result<Option<ToolSpec>, Unavailable> {
    let Some((server, _)) = mcp_servers::split_name(name) else {
        return Ok(None);
    };
    let Some(config) = state.mcp_servers.config(server) else {
        return Ok(None);
    };
    match state.mcp_servers.find(name).await {
        Ok(found) => Ok(found.map(|remote| entry(&remote, config))),
        Err(e) => Err(Unavailable(e.to_string())),
    }
}

/// What a manifest's `spec.tools` entry `mcp:<server>` (every tool of the server) or
/// `mcp:<server>/<tool>` (one) offers now.
pub(crate) async fn offered(state: &AppState, entry_name: &str) -> Result<Vec<ToolSpec>, String> {
    let Some(rest) = entry_name.strip_prefix(mcp_servers::PREFIX) else {
        return Ok(Vec::new());
    };
    let server = rest.split_once('/').map_or(rest, |(server, _)| server);
    let Some(config) = state.mcp_servers.config(server) else {
        return Err(format!("this node has no MCP server `{server}`"));
    };
    let tools = state
        .mcp_servers
        .tools(server)
        .await
        .map_err(|e| e.to_string())?;
    Ok(tools
        .iter()
        .filter(|t| rest == server || t.full_name == entry_name)
        .map(|t| entry(t, config))
        .collect())
}

/// Every configured server's tools, and the servers that cannot be listed now (with why).
/// Servers are asked at the same time, so a slow one costs its timeout once.
pub async fn all(state: &AppState) -> (Vec<ToolSpec>, Vec<Value>) {
    let names = state.mcp_servers.names();
    let listings =
        futures_util::future::join_all(names.iter().map(|server| state.mcp_servers.tools(server)))
            .await;
    let mut tools = Vec::new();
    let mut unavailable = Vec::new();
    for (server, listed) in names.iter().zip(listings) {
        let Some(config) = state.mcp_servers.config(server) else {
            continue;
        };
        match listed {
            Ok(listed) => tools.extend(listed.iter().map(|t| entry(t, config))),
            Err(e) => unavailable
                .push(json!({"server": server, "code": e.code(), "error": e.to_string()})),
        }
    }
    (tools, unavailable)
}

/// The handler of every external tool: the call, on the server, under the caller's domains.
fn call<'a>(ctx: &'a ToolContext<'a>, arguments: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        let Some((server, tool)) = mcp_servers::split_name(ctx.name) else {
            return Err(ToolError::internal(format!(
                "`{}` is not an external tool name",
                ctx.name
            )));
        };
        let details = json!({"server": server, "tool": tool});
        let Value::Object(arguments) = arguments else {
            return Err(ToolError::new(
                "invalid_arguments",
                "the arguments of an MCP tool are a JSON object",
            ));
        };
        let domains = domain_rules(ctx)?;
        let shaped = ctx
            .state
            .mcp_servers
            .call(server, tool, arguments, &domains)
            .await
            .map_err(|e: McpError| {
                ToolError::new(e.code(), e.to_string()).with_details(details.clone())
            })?;
        if shaped.is_error {
            let said = if shaped.text.is_empty() {
                "(no text)".to_owned()
            } else {
                shaped.text.clone()
            };
            return Err(ToolError::new(
                "mcp_tool_error",
                format!("the tool `{tool}` of MCP server `{server}` failed: {said}"),
            )
            .with_details(json!({"server": server, "tool": tool, "result": shaped.output})));
        }
        Ok(shaped.output)
    })
}

/// The domain rules of the caller's security context and its starters' that cover this tool.
fn domain_rules(ctx: &ToolContext<'_>) -> Result<DomainPolicy, ToolError> {
    let mut policy = DomainPolicy::default();
    if let Some(scope) = &ctx.caller.seal {
        let contexts = std::iter::once(&scope.context).chain(scope.ceilings.iter());
        for context in contexts {
            if let Some(rule) = super::web::context_rule(context, ctx.name)? {
                policy.push(rule);
            }
        }
    }
    Ok(policy)
}
