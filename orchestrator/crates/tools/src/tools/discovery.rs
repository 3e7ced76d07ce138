//! `aegis.tools.list`, `aegis.tools.search` and `aegis.runtime.list`: what a caller can use.
//!
//! Listings show only what the caller may call, so a model is never offered a tool that policy
//! would refuse on sight. They include the tools of the node's external MCP servers
//! (`mcp:<server>/<tool>`, source = the server) with their input schemas, which no other tool
//! serves; a server that cannot be listed now is named in `unavailable_servers`.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{args, catalog, Handler, HandlerFuture, ToolContext, ToolError, ToolInfo};
use aegis_policy as policy;

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![
        ("aegis.tools.list", list),
        ("aegis.tools.search", search),
        ("aegis.runtime.list", runtimes),
    ]
}

/// The tools `ctx.caller` may call, filtered by source and category, and the external servers
/// that could not be listed.
pub(crate) async fn visible(
    ctx: &ToolContext<'_>,
    source: Option<&str>,
    category: Option<&str>,
) -> Result<(Vec<ToolInfo>, Vec<Value>), ToolError> {
    let catalog = catalog().map_err(ToolError::internal)?;
    let (external, unavailable) = if source == Some("builtin") {
        (Vec::new(), Vec::new())
    } else {
        super::external::all(ctx.state).await
    };
    let tools = catalog
        .iter()
        .chain(external.iter())
        .filter(|t| policy::may_see(ctx.caller, t))
        .filter(|t| source.is_none_or(|s| s == t.source))
        .filter(|t| category.is_none_or(|c| c == t.category))
        .map(|t| t.info())
        .collect();
    let unavailable = unavailable
        .into_iter()
        .filter(|u| source.is_none_or(|s| u["server"] == s))
        .collect();
    Ok((tools, unavailable))
}

/// A listing entry; an external tool's carries its input schema (built-in schemas are fixed
/// and documented, an external server's are only known from its listing).
fn short(t: &ToolInfo) -> Value {
    let mut entry = json!({"name": t.name, "description": t.description, "source": t.source,
           "skip_judge": t.skip_judge, "category": t.category, "tier": t.tier});
    if t.source != "builtin" {
        entry["inputSchema"] = t.input_schema.clone();
    }
    entry
}

#[derive(Deserialize)]
struct Page {
    source: Option<String>,
    category: Option<String>,
    limit: Option<usize>,
    offset: Option<usize>,
}

fn list<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        let p: Page = args(a)?;
        let (all, unavailable) = visible(ctx, p.source.as_deref(), p.category.as_deref()).await?;
        let total = all.len();
        let tools: Vec<Value> = all
            .iter()
            .skip(p.offset.unwrap_or(0))
            .take(p.limit.unwrap_or(usize::MAX))
            .map(short)
            .collect();
        let mut listed = json!({"tool": "aegis.tools.list", "tools": tools, "total": total});
        if !unavailable.is_empty() {
            listed["unavailable_servers"] = Value::Array(unavailable);
        }
        Ok(listed)
    })
}

fn search<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            query: Option<String>,
            #[serde(flatten)]
            page: Page,
        }
        let a: A = args(a)?;
        let query = a.query.unwrap_or_default();
        let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
        let (all, _) = visible(ctx, a.page.source.as_deref(), a.page.category.as_deref()).await?;
        let hits: Vec<Value> = all
            .iter()
            .filter(|t| {
                let hay = format!("{} {}", t.name, t.description).to_lowercase();
                words.iter().all(|w| hay.contains(w.as_str()))
            })
            .skip(a.page.offset.unwrap_or(0))
            .take(a.page.limit.unwrap_or(usize::MAX))
            .map(short)
            .collect();
        Ok(
            json!({"tool": "aegis.tools.search", "query": query, "total": hits.len(), "tools": hits}),
        )
    })
}

fn runtimes<'a>(_: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            language: Option<String>,
        }
        let a: A = args(a)?;
        let registry = aegis_core::runtimes::registry().map_err(ToolError::internal)?;
        let runtimes: Vec<Value> = registry
            .runtimes
            .iter()
            .filter(|r| a.language.as_deref().is_none_or(|l| l == r.language))
            .map(|r| {
                json!({"language": r.language, "version": r.version, "image": r.image,
                            "description": r.description, "deprecated": false})
            })
            .collect();
        Ok(
            json!({"tool": "aegis.runtime.list", "runtimes": runtimes, "custom_runtime_supported": true}),
        )
    })
}
