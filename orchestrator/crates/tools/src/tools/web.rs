//! `web.fetch` and `web.search`: the outside world, from the orchestrator, under allowlists.
//!
//! The handlers only gather the rules that apply to this caller and shape the answer; the
//! checks themselves live in `aegis_egress`. The domain rules are the intersection of the
//! caller's SEAL security context (the `domain_allowlist` of the capabilities covering the tool)
//! and, for an agent execution, its manifest's `spec.security.network`. An operator's own call
//! has neither and is bounded by the node's address rules only.
//!
//! A fetched HTML page is converted to Markdown by `aegis_egress::document`, under a depth and
//! a time limit and on a thread of its own: a hostile page gets a tool error
//! (`document_too_deep`, `document_timeout`), it cannot take a worker or the node down.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{args, Handler, HandlerFuture, ToolContext, ToolError};
use aegis_core::caller::CallerKind;
use aegis_egress::{self as egress, DomainEntry, DomainPolicy, DomainRule};
use aegis_manifest::AgentView;

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![("web.fetch", fetch), ("web.search", search)]
}

#[derive(Deserialize)]
struct FetchArgs {
    url: String,
    #[serde(default = "yes")]
    to_markdown: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct SearchArgs {
    query: String,
    #[serde(default = "ten")]
    max_results: usize,
}

fn ten() -> usize {
    10
}

fn fetch<'a>(ctx: &'a ToolContext<'a>, arguments: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        let a: FetchArgs = args(arguments)?;
        let domains = domain_policy(ctx, "web.fetch").await?;
        let fetched = egress::fetch::fetch(&ctx.state.egress, &domains, &a.url)
            .await
            .map_err(|e| {
                let details = json!({"url": a.url});
                ToolError::new(e.code(), e.to_string()).with_details(details)
            })?;
        let content_type = fetched.content_type.clone();
        let mime = content_type
            .as_deref()
            .and_then(|c| c.split(';').next())
            .map(|m| m.trim().to_ascii_lowercase())
            .unwrap_or_default();
        let html = mime == "text/html" || mime == "application/xhtml+xml";
        if !(html || is_textual(&mime)) {
            return Err(ToolError::new(
                "unsupported_content_type",
                format!(
                    "{} answered with `{mime}`, which is not text; web.fetch returns text and HTML only",
                    fetched.final_url
                ),
            )
            .with_details(json!({"url": fetched.final_url, "content_type": content_type})));
        }
        let text = String::from_utf8_lossy(&fetched.body).into_owned();
        let (format, content) = if html && a.to_markdown {
            // Off the async workers, with depth and time limits: the page is the site's.
            let markdown = egress::document::html_to_markdown(text)
                .await
                .map_err(|e| {
                    ToolError::new(e.code(), format!("{}: {e}", fetched.final_url)).with_details(
                        json!({"url": fetched.final_url, "bytes": fetched.body.len()}),
                    )
                })?;
            ("markdown", markdown)
        } else {
            ("text", text)
        };
        Ok(json!({
            "url": fetched.final_url,
            "status": fetched.status,
            "content_type": content_type,
            "format": format,
            "content": content,
            "bytes": fetched.body.len(),
            "truncated": fetched.truncated,
            "redirects": fetched.redirects,
        }))
    })
}

/// Types whose body is text a model can read (an absent type is treated as text).
fn is_textual(mime: &str) -> bool {
    mime.is_empty()
        || mime.starts_with("text/")
        || mime == "application/json"
        || mime.ends_with("+json")
        || mime == "application/xml"
        || mime.ends_with("+xml")
        || mime == "application/javascript"
}

fn search<'a>(ctx: &'a ToolContext<'a>, arguments: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        let a: SearchArgs = args(arguments)?;
        let domains = domain_policy(ctx, "web.search").await?;
        let found =
            egress::search::search(&ctx.state.config.web, &domains, &a.query, a.max_results)
                .await
                .map_err(|e| ToolError::new(e.code(), e.to_string()))?;
        Ok(json!({
            "query": a.query,
            "provider": found.provider,
            "results": found.results,
            "filtered_out": found.filtered_out,
        }))
    })
}

/// Every domain rule that bounds this caller's use of `tool`.
async fn domain_policy(ctx: &ToolContext<'_>, tool: &str) -> Result<DomainPolicy, ToolError> {
    let mut policy = DomainPolicy::default();
    if let Some(scope) = &ctx.caller.seal {
        if let Some(rule) = context_rule(&scope.context, tool)? {
            policy.push(rule);
        }
    }
    if ctx.caller.kind == CallerKind::Execution {
        policy.push(manifest_rule(ctx).await?);
    }
    Ok(policy)
}

/// The union of the `domain_allowlist`s of the capabilities covering `tool`; `None` when one
/// of them has no domain bound (that capability alone admits every host).
pub(super) fn context_rule(
    context: &aegis_seal::context::SecurityContext,
    tool: &str,
) -> Result<Option<DomainRule>, ToolError> {
    let mut allow = Vec::new();
    for cap in context
        .capabilities
        .iter()
        .filter(|c| aegis_seal::context::tool_matches(&c.tool_pattern, tool))
    {
        let Some(list) = &cap.domain_allowlist else {
            return Ok(None);
        };
        for entry in list {
            allow.push(DomainEntry::parse(entry).map_err(|m| {
                ToolError::new(
                    "invalid_policy",
                    format!("security context `{}`: domain_allowlist {m}", context.name),
                )
            })?);
        }
    }
    Ok(Some(DomainRule {
        source: format!("domain allowlist of security context `{}`", context.name),
        allow: Some(allow),
        deny: Vec::new(),
        exempt: Vec::new(),
    }))
}

/// The manifest's `spec.security.network` as a rule: `none` admits nothing, `deny` only the
/// allowlist, `allow` everything but the denylist (narrowed to the allowlist when one is given).
async fn manifest_rule(ctx: &ToolContext<'_>) -> Result<DomainRule, ToolError> {
    let execution = uuid::Uuid::parse_str(&ctx.caller.id).map_err(ToolError::internal)?;
    let row: Option<(Value, String)> = sqlx::query_as(
        "SELECT v.manifest, e.agent_name FROM executions e \
         JOIN definition_versions v ON v.id = e.agent_version_id WHERE e.id = $1",
    )
    .bind(execution)
    .fetch_optional(&ctx.state.pool)
    .await
    .map_err(ToolError::internal)?;
    let Some((manifest, agent)) = row else {
        return Err(ToolError::internal(format!(
            "execution {execution} has no agent manifest"
        )));
    };
    DomainRule::of_network(&agent, &AgentView(&manifest).network())
        .map_err(|m| ToolError::new("invalid_policy", m))
}
