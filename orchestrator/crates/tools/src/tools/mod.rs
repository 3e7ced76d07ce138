//! The tools' handlers, one file per family, and the router every call takes.
//!
//! What tools exist (names, tiers, schemas) is `aegis_core::catalog`, which knows nothing of handlers;
//! each family here registers its handlers by tool name, and [`check_handlers`] (run at start)
//! refuses a catalog entry without exactly one handler, so callers never see a tool that would
//! fail with "not implemented".

mod code;
pub mod control;
mod definitions;
mod discovery;
mod dispatch;
mod execute;
pub mod external;
mod generate;
mod live;
mod memory;
mod process;
mod router;
mod runs;
mod sandbox;
mod schema;
mod scopes;
mod search;
mod stream;
mod system;
mod tasks;
mod transfer;
mod web;
mod workflows;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};

use serde_json::Value;

use crate::state::AppState;
use aegis_core::caller::Caller;

pub use aegis_core::catalog::{catalog, Catalog, CatalogError, ToolInfo, ToolSpec};

pub use definitions::registry_error;
pub use definitions::validate_offline;
pub use router::{
    invoke, invoke_gated, invoke_in, invoke_started, invoke_streaming, invoke_transfer,
    serialized_len, ArgViolation, CallError, CallGate, OutputChunk, OutputSink, Started, ToolError,
    ToolOutcome, Transfer, TEXT_COPY_MAX_BYTES,
};
pub use schema::lookup as schema_by_key;

/// What a handler sees besides its arguments.
pub struct ToolContext<'a> {
    /// Shared service state.
    pub state: &'a AppState,
    /// Who is calling.
    pub caller: &'a Caller,
    /// The tool's name (one handler serves every tool of an external MCP server).
    pub name: &'a str,
    /// The sandbox of a `cmd.run` / `fs.*` call and the policy it runs under.
    pub sandbox: Option<(dispatcher::SandboxId, Arc<aegis_policy::SandboxPolicy>)>,
    /// The calling execution's memory, for `aegis.memory.write|recall` (resolved and admitted by
    /// the router).
    pub memory: Option<aegis_store::memory::Scope>,
    /// Where a streaming call's output goes (`invoke_streaming`); only a foreground `cmd.run`
    /// sends to it.
    pub output: Option<aegis_engines::call::OutputSink>,
    /// The bytes of a file transfer (`invoke_transfer`): taken once by the `fs.write` or
    /// `fs.read` handler, which then moves the whole file as one call.
    pub transfer: std::sync::Mutex<Option<Transfer>>,
    /// Where a background `cmd.run` hands back the process it started (`invoke_started`).
    pub(crate) started: Option<&'a router::StartedSlot>,
}

impl ToolContext<'_> {
    /// The call's transfer, if it has one (only the first caller gets it).
    pub fn take_transfer(&self) -> Option<Transfer> {
        self.transfer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// The future a handler returns.
pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Result<Value, ToolError>> + Send + 'a>>;
/// A tool's implementation.
pub type Handler = for<'a> fn(&'a ToolContext<'a>, Value) -> HandlerFuture<'a>;

/// The handlers of every family, by tool name. Which tools exist is the catalog's business
/// (`aegis_core::catalog`); [`check_handlers`] makes sure the two agree.
fn implemented() -> Vec<(&'static str, Handler)> {
    let mut v = Vec::new();
    v.extend(schema::handlers());
    v.extend(definitions::handlers());
    v.extend(discovery::handlers());
    v.extend(system::handlers());
    v.extend(sandbox::handlers());
    v.extend(process::handlers());
    v.extend(live::handlers());
    v.extend(tasks::handlers());
    v.extend(workflows::handlers());
    v.extend(scopes::handlers());
    v.extend(search::handlers());
    v.extend(generate::handlers());
    v.extend(execute::handlers());
    v.extend(web::handlers());
    v.extend(memory::handlers());
    v.extend(code::handlers());
    v
}

static HANDLERS: LazyLock<HashMap<&'static str, Handler>> =
    LazyLock::new(|| implemented().into_iter().collect());

/// The handler of a catalog tool.
pub(crate) fn handler(name: &str) -> Option<Handler> {
    HANDLERS.get(name).copied()
}

/// Start-up check: every catalog tool has exactly one handler and every handler a catalog
/// entry, so the catalog lists only tools that run and no handler is unreachable.
pub fn check_handlers(catalog: &Catalog) -> Result<(), CatalogError> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (name, _) in implemented() {
        *seen.entry(name).or_default() += 1;
    }
    let mut problems = Vec::new();
    for spec in catalog.iter() {
        match seen.get(spec.name.as_str()) {
            None => problems.push(format!("{} has no handler", spec.name)),
            Some(n) if *n > 1 => problems.push(format!("{} has {n} handlers", spec.name)),
            Some(_) => {}
        }
    }
    for name in seen.keys() {
        if !catalog.contains(name) {
            problems.push(format!(
                "the handler of {name} has no catalog entry (index.json)"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        problems.sort();
        Err(CatalogError(problems.join("; ")))
    }
}

/// Deserialises tool arguments that already passed the schema.
pub(crate) fn args<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, ToolError> {
    serde_json::from_value(value).map_err(|e| ToolError::new("invalid_arguments", e.to_string()))
}

/// Refuses a call whose `tenant_id` argument names another tenant than the caller's (the tools
/// that take one: definitions, workflows, executions, search, scopes, generation).
pub(crate) fn check_tenant(ctx: &ToolContext<'_>, a: &Value) -> Result<(), ToolError> {
    match a.get("tenant_id").and_then(Value::as_str) {
        Some(t) if t != ctx.caller.tenant => Err(ToolError::new(
            "forbidden",
            format!(
                "tenant_id `{t}` is not the caller's tenant `{}`",
                ctx.caller.tenant
            ),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalog_tool_has_exactly_one_handler() {
        let catalog = Catalog::builtin().expect("catalog");
        check_handlers(&catalog).expect("catalog and handlers agree");
    }
}
