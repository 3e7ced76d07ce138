//! The tool catalog: every tool this node actually implements, with its metadata and schema.
//!
//! Metadata (description, tier, skip_judge, output shape) comes from `schemas/tools/index.json`
//! and argument schemas from `schemas/tools/<name>.json`, both embedded at build time; the code
//! contributes only the handler. A tool without a handler is not in the catalog, so callers never
//! see a tool that would fail with "not implemented".

mod definitions;
mod discovery;
mod execute;
mod generate;
mod process;
mod router;
mod sandbox;
mod schema;
mod scopes;
mod search;
mod system;
mod tasks;
mod web;
mod workflows;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};

use serde::Serialize;
use serde_json::Value;

use crate::caller::{Caller, Tier};
use crate::state::AppState;

pub(crate) use definitions::registry_error;
pub use definitions::validate_offline;
pub use router::{
    invoke, invoke_gated, invoke_in, serialized_len, ArgViolation, CallError, CallGate,
    ToolOutcome, TEXT_COPY_MAX_BYTES,
};
pub(crate) use schema::lookup as schema_by_key;

/// What a handler sees besides its arguments.
pub struct ToolContext<'a> {
    /// Shared service state.
    pub state: &'a AppState,
    /// Who is calling.
    pub caller: &'a Caller,
    /// The sandbox of a `cmd.run` / `fs.*` call and the policy it runs under.
    pub sandbox: Option<(dispatcher::SandboxId, Arc<crate::policy::SandboxPolicy>)>,
}

/// A failure inside a tool that ran: reported to the caller as an `isError` result.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("{message}")]
pub struct ToolError {
    /// Stable machine-readable code (`not_found`, `conflict`, `invalid_manifest`, ...).
    pub code: &'static str,
    /// What went wrong, for people and models.
    pub message: String,
    /// Structured details (e.g. every manifest error with path and line).
    pub details: Option<Value>,
}

impl ToolError {
    /// A failure with no details.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: None,
        }
    }

    /// Adds structured details.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// An unexpected internal failure; the message is logged, the caller gets a generic text.
    pub fn internal(e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "tool failed internally");
        Self::new("internal", format!("internal error: {e}"))
    }
}

/// The future a handler returns.
pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Result<Value, ToolError>> + Send + 'a>>;
/// A tool's implementation.
pub type Handler = for<'a> fn(&'a ToolContext<'a>, Value) -> HandlerFuture<'a>;

/// One tool of the catalog.
pub struct Tool {
    /// Dotted name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Minimum caller tier.
    pub tier: Tier,
    /// Whether the inner-loop judge is skipped for it.
    pub skip_judge: bool,
    /// Group used for filtering (`fs`, `dispatch`, `agent`, ...).
    pub category: String,
    /// The argument schema, as published.
    pub input_schema: Value,
    /// The documented structured output.
    pub output_schema: Value,
    validator: jsonschema::Validator,
    handler: Handler,
}

/// Catalog entry as listings show it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ToolInfo {
    /// Dotted name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// `user`, `system` or `operator`.
    pub tier: Tier,
    /// Whether the inner-loop judge is skipped.
    pub skip_judge: bool,
    /// Always `builtin` for now.
    pub source: &'static str,
    /// The catalog group the tool is listed under.
    pub category: String,
    /// JSON Schema of the arguments.
    #[serde(rename = "inputSchema")]
    pub input_schema: Value,
}

impl Tool {
    /// The listing view.
    pub fn info(&self) -> ToolInfo {
        ToolInfo {
            name: self.name.clone(),
            description: self.description.clone(),
            tier: self.tier,
            skip_judge: self.skip_judge,
            source: "builtin",
            category: self.category.clone(),
            input_schema: self.input_schema.clone(),
        }
    }
}

/// All implemented tools, by name.
pub struct Catalog {
    tools: BTreeMap<String, Tool>,
}

/// The embedded `schemas/tools/*` files: name -> schema text. Only implemented tools are listed.
fn implemented() -> Vec<(&'static str, &'static str, Handler)> {
    let mut v = Vec::new();
    v.extend(schema::handlers());
    v.extend(definitions::handlers());
    v.extend(discovery::handlers());
    v.extend(system::handlers());
    v.extend(sandbox::handlers());
    v.extend(process::handlers());
    v.extend(tasks::handlers());
    v.extend(workflows::handlers());
    v.extend(scopes::handlers());
    v.extend(search::handlers());
    v.extend(generate::handlers());
    v.extend(execute::handlers());
    v.extend(web::handlers());
    v
}

/// Why the embedded catalog could not be built (a packaging bug; tests guard against it).
#[derive(Debug, thiserror::Error)]
#[error("tool catalog: {0}")]
pub struct CatalogError(String);

impl Catalog {
    /// Builds the catalog from the embedded index and schemas.
    pub fn builtin() -> Result<Self, CatalogError> {
        let index: Value = serde_json::from_str(include_str!("../../../schemas/tools/index.json"))
            .map_err(|e| CatalogError(format!("index.json: {e}")))?;
        let entries = index["tools"]
            .as_array()
            .ok_or_else(|| CatalogError("index.json has no `tools` array".into()))?;
        let mut tools = BTreeMap::new();
        for (name, schema_text, handler) in implemented() {
            let meta = entries
                .iter()
                .find(|e| e["name"] == name)
                .ok_or_else(|| CatalogError(format!("{name} is missing from index.json")))?;
            let input_schema: Value = serde_json::from_str(schema_text)
                .map_err(|e| CatalogError(format!("{name} schema: {e}")))?;
            let validator = jsonschema::draft202012::new(&input_schema)
                .map_err(|e| CatalogError(format!("{name} schema does not compile: {e}")))?;
            let tier = meta["tier"]
                .as_str()
                .unwrap_or("operator")
                .parse()
                .map_err(|e| CatalogError(format!("{name}: {e}")))?;
            let category = meta["group"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| category_of(name));
            tools.insert(
                name.to_owned(),
                Tool {
                    name: name.to_owned(),
                    description: meta["description"].as_str().unwrap_or_default().to_owned(),
                    tier,
                    skip_judge: meta["skip_judge"].as_bool().unwrap_or(false),
                    category,
                    input_schema,
                    output_schema: meta["output"].clone(),
                    validator,
                    handler,
                },
            );
        }
        Ok(Self { tools })
    }

    /// A tool by name.
    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.get(name)
    }

    /// Every tool, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = &Tool> {
        self.tools.values()
    }

    /// True when `name` is implemented here.
    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }
}

/// `fs.read` -> `fs`, `aegis.agent.create` -> `agent`, `cmd.run` -> `dispatch`.
fn category_of(name: &str) -> String {
    let mut parts = name.split('.');
    match (parts.next(), parts.next()) {
        (Some("cmd"), _) => "dispatch".to_owned(),
        (Some("aegis"), Some(group)) => group.to_owned(),
        (Some(first), _) => first.to_owned(),
        _ => name.to_owned(),
    }
}

static BUILTIN: LazyLock<Result<Arc<Catalog>, String>> =
    LazyLock::new(|| Catalog::builtin().map(Arc::new).map_err(|e| e.to_string()));

/// The process-wide catalog.
pub fn catalog() -> Result<Arc<Catalog>, CatalogError> {
    BUILTIN.clone().map_err(CatalogError)
}

/// Deserialises tool arguments that already passed the schema.
pub(crate) fn args<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, ToolError> {
    serde_json::from_value(value).map_err(|e| ToolError::new("invalid_arguments", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_catalog_builds_and_every_tool_has_metadata() {
        let c = Catalog::builtin().expect("catalog");
        assert!(c.contains("aegis.schema.get"));
        for t in c.iter() {
            assert!(!t.description.is_empty(), "{}", t.name);
            assert_eq!(t.input_schema["type"], "object", "{}", t.name);
        }
    }
}
