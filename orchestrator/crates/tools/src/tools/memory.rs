//! `aegis.memory.*`: an agent's memory across executions (`aegis_store::memory`) as tools.
//!
//! `write` and `recall` act on the calling execution's own memory (`aegis_store::memory::Scope`),
//! which the router resolved and the policy admitted before the handler runs
//! (`ToolContext::memory`); their arguments name no agent and no owner. `list` and `erase` are
//! the operators' (operator tier): any agent name of the caller's tenant, optionally one owner.

use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::{args, Handler, HandlerFuture, ToolContext, ToolError};
use aegis_store::memory::{store, MemoryError, Scope};

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![
        ("aegis.memory.write", write),
        ("aegis.memory.recall", recall),
        ("aegis.memory.list", list),
        ("aegis.memory.erase", erase),
    ]
}

fn memory_error(e: MemoryError) -> ToolError {
    match e {
        MemoryError::TooLarge { .. } => ToolError::new("note_too_large", e.to_string()),
        MemoryError::Full { notes, max, .. } => ToolError::new("memory_full", e.to_string())
            .with_details(json!({"notes": notes, "max_notes": max})),
        MemoryError::NoSuchNote { .. } => ToolError::new("not_found", e.to_string()),
        MemoryError::NoExecution(_) => ToolError::new("unavailable", e.to_string()),
        MemoryError::Db(e) => ToolError::internal(e),
    }
}

/// The caller's memory; the router only runs these handlers with one (see the module doc).
fn scope<'a>(ctx: &'a ToolContext<'a>) -> Result<&'a Scope, ToolError> {
    ctx.memory.as_ref().ok_or_else(|| {
        ToolError::new(
            "memory_off",
            "this caller has no memory: only executions of agents with spec.execution.memory have one",
        )
    })
}

fn write<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            content: String,
            #[serde(default)]
            tags: Vec<String>,
        }
        let a: A = args(a)?;
        let scope = scope(ctx)?;
        let limits = &ctx.state.config.memory;
        let written = store::write(&ctx.state.pool, scope, &a.content, &a.tags, limits)
            .await
            .map_err(memory_error)?;
        Ok(json!({
            "note_id": written.id, "created": written.created, "notes": written.notes,
            "max_notes": limits.max_notes_per_scope,
        }))
    })
}

fn recall<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            query: Option<String>,
            limit: Option<i64>,
        }
        let a: A = args(a)?;
        let scope = scope(ctx)?;
        let limit = a.limit.unwrap_or(10).clamp(1, 50);
        let (order, notes) = store::recall(&ctx.state.pool, scope, a.query.as_deref(), limit, true)
            .await
            .map_err(memory_error)?;
        Ok(json!({"order": order, "notes": notes}))
    })
}

fn list<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            agent: String,
            owner: Option<String>,
            limit: Option<i64>,
            offset: Option<i64>,
        }
        let a: A = args(a)?;
        let limit = a.limit.unwrap_or(100).clamp(1, 500);
        let offset = a.offset.unwrap_or(0).max(0);
        let (notes, total) = store::list(
            &ctx.state.pool,
            &ctx.caller.tenant,
            &a.agent,
            a.owner.as_deref(),
            limit,
            offset,
        )
        .await
        .map_err(memory_error)?;
        Ok(json!({
            "agent": a.agent, "owner": a.owner, "notes": notes, "total": total,
            "count": notes.len(), "limit": limit, "offset": offset,
        }))
    })
}

fn erase<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            agent: String,
            owner: Option<String>,
            note_id: Option<Uuid>,
        }
        let a: A = args(a)?;
        let erased = store::erase(
            &ctx.state.pool,
            &ctx.caller.tenant,
            &a.agent,
            a.owner.as_deref(),
            a.note_id,
        )
        .await
        .map_err(memory_error)?;
        tracing::info!(agent = %a.agent, owner = ?a.owner, note = ?a.note_id, erased, caller = %ctx.caller.id, "memory erased");
        Ok(json!({"agent": a.agent, "owner": a.owner, "note_id": a.note_id, "erased": erased}))
    })
}
