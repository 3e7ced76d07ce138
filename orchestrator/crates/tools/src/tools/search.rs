//! `aegis.agent.search` and `aegis.workflow.search`: the registry's search (`registry::search`)
//! as tools.
//!
//! What a search may find is what the matching list tool shows: agents of the caller's tenant;
//! workflows of the caller's tenant, or with `scope` the global ones or everything visible, as
//! `aegis.workflow.list` takes it. Results are sorted by score, best first, with the total of
//! matches for pagination (`limit`, `offset`).

use serde::Deserialize;
use serde_json::{json, Value};

use super::check_tenant;
use super::definitions::{registry_error, ListScope};
use super::{args, Handler, HandlerFuture, ToolContext, ToolError};
use aegis_manifest::ManifestKind;
use aegis_store::registry::{self, SearchQuery};

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![
        ("aegis.agent.search", agent_search),
        ("aegis.workflow.search", workflow_search),
    ]
}

#[derive(Deserialize)]
struct A {
    query: String,
    limit: Option<i64>,
    offset: Option<i64>,
    min_score: Option<f64>,
    labels: Option<Value>,
    include_platform_templates: Option<bool>,
    status: Option<String>,
    scope: Option<ListScope>,
}

fn agent_search<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(search(ctx, a, ManifestKind::Agent))
}

fn workflow_search<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(search(ctx, a, ManifestKind::Workflow))
}

async fn search(ctx: &ToolContext<'_>, a: Value, kind: ManifestKind) -> Result<Value, ToolError> {
    check_tenant(ctx, &a)?;
    let a: A = args(a)?;
    if a.query.trim().is_empty() {
        return Err(ToolError::new(
            "invalid_arguments",
            "`query` is blank: say in words what you are looking for",
        ));
    }
    let filter = ListScope::filter(a.scope);
    let tool = match kind {
        ManifestKind::Agent => "aegis.agent.search",
        ManifestKind::Workflow => "aegis.workflow.search",
    };
    let limit = a.limit.unwrap_or(10).clamp(1, 100);
    let offset = a.offset.unwrap_or(0).max(0);
    // Every deployed agent is active on this node: other statuses match nothing.
    let page = if a.status.as_deref().is_some_and(|s| s != "active") {
        registry::SearchPage {
            hits: Vec::new(),
            total: 0,
        }
    } else {
        registry::search(
            &ctx.state.pool,
            &ctx.caller.tenant,
            kind,
            &SearchQuery {
                text: a.query.trim(),
                filter,
                labels: a.labels.as_ref(),
                exclude_builtin: !a.include_platform_templates.unwrap_or(true),
                min_score: a.min_score.unwrap_or(0.3).clamp(0.0, 1.0),
                limit,
                offset,
            },
        )
        .await
        .map_err(registry_error)?
    };
    let results: Vec<Value> = page
        .hits
        .iter()
        .map(|h| {
            let mut r = json!({
                "id": h.id, "name": h.name, "version": h.version, "description": h.description,
                "labels": h.labels, "score": (h.score * 1000.0).round() / 1000.0,
            });
            match kind {
                ManifestKind::Agent => r["status"] = json!("active"),
                ManifestKind::Workflow => r["scope"] = json!(h.scope),
            }
            r
        })
        .collect();
    Ok(json!({
        "tool": tool, "query": a.query, "results": results, "total": page.total,
        "count": page.hits.len(), "limit": limit, "offset": offset,
    }))
}
