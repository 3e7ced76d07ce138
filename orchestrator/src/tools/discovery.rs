//! `aegis.tools.list`, `aegis.tools.search` and `aegis.runtime.list`: what a caller can use.
//!
//! Listings show only what the caller may call, so a model is never offered a tool that policy
//! would refuse on sight.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{args, catalog, Handler, HandlerFuture, ToolContext, ToolError, ToolInfo};
use crate::policy;

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![
        ("aegis.tools.list", list),
        ("aegis.tools.search", search),
        ("aegis.runtime.list", runtimes),
    ]
}

/// The tools `ctx.caller` may call, filtered by source and category.
pub(crate) fn visible(
    ctx: &ToolContext<'_>,
    source: Option<&str>,
    category: Option<&str>,
) -> Result<Vec<ToolInfo>, ToolError> {
    let catalog = catalog().map_err(ToolError::internal)?;
    Ok(catalog
        .iter()
        .filter(|t| policy::may_see(ctx.caller, t))
        .filter(|_| source.is_none_or(|s| s == "builtin"))
        .filter(|t| category.is_none_or(|c| c == t.category))
        .map(|t| t.info())
        .collect())
}

fn short(t: &ToolInfo) -> Value {
    json!({"name": t.name, "description": t.description, "source": t.source,
           "skip_judge": t.skip_judge, "category": t.category, "tier": t.tier})
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
        let all = visible(ctx, p.source.as_deref(), p.category.as_deref())?;
        let total = all.len();
        let tools: Vec<Value> = all
            .iter()
            .skip(p.offset.unwrap_or(0))
            .take(p.limit.unwrap_or(usize::MAX))
            .map(short)
            .collect();
        Ok(json!({"tool": "aegis.tools.list", "tools": tools, "total": total}))
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
        let all = visible(ctx, a.page.source.as_deref(), a.page.category.as_deref())?;
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
        let registry = crate::runtimes::registry().map_err(ToolError::internal)?;
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
