//! The tool catalog's metadata: every tool this node implements, by name, with its description,
//! tier, argument schema (compiled once) and output shape, and nothing of how it runs.
//!
//! Metadata comes from `schemas/tools/index.json` and argument schemas from
//! `schemas/tools/<file>`, both embedded at build time. Policy, config validation, metrics,
//! sandboxes and the shipped definitions read tool names and tiers here without depending on the
//! handlers (which need the whole service); the handlers live in `tools/`, which checks at start
//! that every entry here has exactly one handler and every handler an entry
//! (`tools::check_handlers`), so a tool listed is a tool that runs.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use serde::Serialize;
use serde_json::Value;

use crate::caller::Tier;

/// The prefix of every external tool's name: `mcp:<server>/<tool>`.
pub const EXTERNAL_PREFIX: &str = "mcp:";

/// One tool of the catalog, as policy and listings see it.
pub struct ToolSpec {
    /// Dotted name (`cmd.run`, `aegis.agent.create`).
    pub name: String,
    pub description: String,
    /// Minimum caller tier.
    pub tier: Tier,
    /// Whether the inner-loop judge is skipped for it.
    pub skip_judge: bool,
    /// Group used for filtering (`fs`, `dispatch`, `agent`, ..., `mcp`).
    pub category: String,
    /// `builtin`, or the name of the external MCP server the tool belongs to
    /// (`tools::external` makes those entries from the servers' listings).
    pub source: String,
    /// The argument schema, as published.
    pub input_schema: Value,
    /// The documented structured output.
    pub output_schema: Value,
    /// `input_schema`, compiled once (shared by the entries made from one listing).
    pub validator: Arc<jsonschema::Validator>,
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
    /// `builtin` or the external MCP server's name.
    pub source: String,
    /// The catalog group the tool is listed under.
    pub category: String,
    /// JSON Schema of the arguments.
    #[serde(rename = "inputSchema")]
    pub input_schema: Value,
}

impl ToolSpec {
    /// The listing view.
    pub fn info(&self) -> ToolInfo {
        ToolInfo {
            name: self.name.clone(),
            description: self.description.clone(),
            tier: self.tier,
            skip_judge: self.skip_judge,
            source: self.source.clone(),
            category: self.category.clone(),
            input_schema: self.input_schema.clone(),
        }
    }
}

/// All implemented tools, by name.
pub struct Catalog {
    tools: BTreeMap<String, ToolSpec>,
}

/// Why the embedded catalog could not be built (a packaging bug; tests guard against it).
#[derive(Debug, thiserror::Error)]
#[error("tool catalog: {0}")]
pub struct CatalogError(pub String);

/// The argument schema files `index.json` names, embedded.
const SCHEMA_FILES: &[(&str, &str)] = &[
    (
        "cmd.run.json",
        include_str!("../../../../schemas/tools/cmd.run.json"),
    ),
    (
        "fs.read.json",
        include_str!("../../../../schemas/tools/fs.read.json"),
    ),
    (
        "fs.write.json",
        include_str!("../../../../schemas/tools/fs.write.json"),
    ),
    (
        "fs.list.json",
        include_str!("../../../../schemas/tools/fs.list.json"),
    ),
    (
        "fs.create_dir.json",
        include_str!("../../../../schemas/tools/fs.create_dir.json"),
    ),
    (
        "fs.create.dir.json",
        include_str!("../../../../schemas/tools/fs.create.dir.json"),
    ),
    (
        "fs.delete.json",
        include_str!("../../../../schemas/tools/fs.delete.json"),
    ),
    (
        "fs.edit.json",
        include_str!("../../../../schemas/tools/fs.edit.json"),
    ),
    (
        "fs.multi_edit.json",
        include_str!("../../../../schemas/tools/fs.multi_edit.json"),
    ),
    (
        "fs.grep.json",
        include_str!("../../../../schemas/tools/fs.grep.json"),
    ),
    (
        "fs.glob.json",
        include_str!("../../../../schemas/tools/fs.glob.json"),
    ),
    (
        "proc.list.json",
        include_str!("../../../../schemas/tools/proc.list.json"),
    ),
    (
        "proc.output.json",
        include_str!("../../../../schemas/tools/proc.output.json"),
    ),
    (
        "proc.input.json",
        include_str!("../../../../schemas/tools/proc.input.json"),
    ),
    (
        "proc.signal.json",
        include_str!("../../../../schemas/tools/proc.signal.json"),
    ),
    (
        "code.run.json",
        include_str!("../../../../schemas/tools/code.run.json"),
    ),
    (
        "code.contexts.json",
        include_str!("../../../../schemas/tools/code.contexts.json"),
    ),
    (
        "logs.read.json",
        include_str!("../../../../schemas/tools/logs.read.json"),
    ),
    (
        "env.get.json",
        include_str!("../../../../schemas/tools/env.get.json"),
    ),
    (
        "aegis.schema.get.json",
        include_str!("../../../../schemas/tools/aegis.schema.get.json"),
    ),
    (
        "aegis.schema.validate.json",
        include_str!("../../../../schemas/tools/aegis.schema.validate.json"),
    ),
    (
        "aegis.agent.create.json",
        include_str!("../../../../schemas/tools/aegis.agent.create.json"),
    ),
    (
        "aegis.agent.update.json",
        include_str!("../../../../schemas/tools/aegis.agent.update.json"),
    ),
    (
        "aegis.agent.list.json",
        include_str!("../../../../schemas/tools/aegis.agent.list.json"),
    ),
    (
        "aegis.agent.export.json",
        include_str!("../../../../schemas/tools/aegis.agent.export.json"),
    ),
    (
        "aegis.agent.delete.json",
        include_str!("../../../../schemas/tools/aegis.agent.delete.json"),
    ),
    (
        "aegis.agent.search.json",
        include_str!("../../../../schemas/tools/aegis.agent.search.json"),
    ),
    (
        "aegis.agent.generate.json",
        include_str!("../../../../schemas/tools/aegis.agent.generate.json"),
    ),
    (
        "aegis.workflow.create.json",
        include_str!("../../../../schemas/tools/aegis.workflow.create.json"),
    ),
    (
        "aegis.workflow.update.json",
        include_str!("../../../../schemas/tools/aegis.workflow.update.json"),
    ),
    (
        "aegis.workflow.list.json",
        include_str!("../../../../schemas/tools/aegis.workflow.list.json"),
    ),
    (
        "aegis.workflow.validate.json",
        include_str!("../../../../schemas/tools/aegis.workflow.validate.json"),
    ),
    (
        "aegis.workflow.export.json",
        include_str!("../../../../schemas/tools/aegis.workflow.export.json"),
    ),
    (
        "aegis.workflow.delete.json",
        include_str!("../../../../schemas/tools/aegis.workflow.delete.json"),
    ),
    (
        "aegis.workflow.search.json",
        include_str!("../../../../schemas/tools/aegis.workflow.search.json"),
    ),
    (
        "aegis.workflow.generate.json",
        include_str!("../../../../schemas/tools/aegis.workflow.generate.json"),
    ),
    (
        "aegis.workflow.promote.json",
        include_str!("../../../../schemas/tools/aegis.workflow.promote.json"),
    ),
    (
        "aegis.workflow.demote.json",
        include_str!("../../../../schemas/tools/aegis.workflow.demote.json"),
    ),
    (
        "aegis.runtime.list.json",
        include_str!("../../../../schemas/tools/aegis.runtime.list.json"),
    ),
    (
        "aegis.tools.list.json",
        include_str!("../../../../schemas/tools/aegis.tools.list.json"),
    ),
    (
        "aegis.tools.search.json",
        include_str!("../../../../schemas/tools/aegis.tools.search.json"),
    ),
    (
        "aegis.system.info.json",
        include_str!("../../../../schemas/tools/aegis.system.info.json"),
    ),
    (
        "aegis.system.config.json",
        include_str!("../../../../schemas/tools/aegis.system.config.json"),
    ),
    (
        "aegis.task.execute.json",
        include_str!("../../../../schemas/tools/aegis.task.execute.json"),
    ),
    (
        "aegis.task.status.json",
        include_str!("../../../../schemas/tools/aegis.task.status.json"),
    ),
    (
        "aegis.task.list.json",
        include_str!("../../../../schemas/tools/aegis.task.list.json"),
    ),
    (
        "aegis.task.cancel.json",
        include_str!("../../../../schemas/tools/aegis.task.cancel.json"),
    ),
    (
        "aegis.task.remove.json",
        include_str!("../../../../schemas/tools/aegis.task.remove.json"),
    ),
    (
        "aegis.task.logs.json",
        include_str!("../../../../schemas/tools/aegis.task.logs.json"),
    ),
    (
        "aegis.task.wait.json",
        include_str!("../../../../schemas/tools/aegis.task.wait.json"),
    ),
    (
        "aegis.agent.wait.json",
        include_str!("../../../../schemas/tools/aegis.agent.wait.json"),
    ),
    (
        "aegis.agent.logs.json",
        include_str!("../../../../schemas/tools/aegis.agent.logs.json"),
    ),
    (
        "aegis.workflow.run.json",
        include_str!("../../../../schemas/tools/aegis.workflow.run.json"),
    ),
    (
        "aegis.workflow.signal.json",
        include_str!("../../../../schemas/tools/aegis.workflow.signal.json"),
    ),
    (
        "aegis.workflow.cancel.json",
        include_str!("../../../../schemas/tools/aegis.workflow.cancel.json"),
    ),
    (
        "aegis.workflow.wait.json",
        include_str!("../../../../schemas/tools/aegis.workflow.wait.json"),
    ),
    (
        "aegis.workflow.logs.json",
        include_str!("../../../../schemas/tools/aegis.workflow.logs.json"),
    ),
    (
        "aegis.workflow.status.json",
        include_str!("../../../../schemas/tools/aegis.workflow.status.json"),
    ),
    (
        "aegis.workflow.executions.list.json",
        include_str!("../../../../schemas/tools/aegis.workflow.executions.list.json"),
    ),
    (
        "aegis.workflow.executions.get.json",
        include_str!("../../../../schemas/tools/aegis.workflow.executions.get.json"),
    ),
    (
        "aegis.workflow.remove.json",
        include_str!("../../../../schemas/tools/aegis.workflow.remove.json"),
    ),
    (
        "aegis.execute.intent.json",
        include_str!("../../../../schemas/tools/aegis.execute.intent.json"),
    ),
    (
        "aegis.execute.status.json",
        include_str!("../../../../schemas/tools/aegis.execute.status.json"),
    ),
    (
        "aegis.execute.wait.json",
        include_str!("../../../../schemas/tools/aegis.execute.wait.json"),
    ),
    (
        "web.fetch.json",
        include_str!("../../../../schemas/tools/web.fetch.json"),
    ),
    (
        "web.search.json",
        include_str!("../../../../schemas/tools/web.search.json"),
    ),
    (
        "aegis.memory.write.json",
        include_str!("../../../../schemas/tools/aegis.memory.write.json"),
    ),
    (
        "aegis.memory.recall.json",
        include_str!("../../../../schemas/tools/aegis.memory.recall.json"),
    ),
    (
        "aegis.memory.list.json",
        include_str!("../../../../schemas/tools/aegis.memory.list.json"),
    ),
    (
        "aegis.memory.erase.json",
        include_str!("../../../../schemas/tools/aegis.memory.erase.json"),
    ),
];

impl Catalog {
    /// Builds the catalog from the embedded index and schemas.
    pub fn builtin() -> Result<Self, CatalogError> {
        let index: Value =
            serde_json::from_str(include_str!("../../../../schemas/tools/index.json"))
                .map_err(|e| CatalogError(format!("index.json: {e}")))?;
        let entries = index["tools"]
            .as_array()
            .ok_or_else(|| CatalogError("index.json has no `tools` array".into()))?;
        let mut tools = BTreeMap::new();
        for meta in entries {
            let name = meta["name"]
                .as_str()
                .ok_or_else(|| CatalogError("an index.json entry has no name".into()))?;
            let file = meta["input"].as_str().unwrap_or_default();
            let (_, schema_text) =
                SCHEMA_FILES
                    .iter()
                    .find(|(f, _)| *f == file)
                    .ok_or_else(|| {
                        CatalogError(format!("{name}: schema file `{file}` is not embedded"))
                    })?;
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
            let spec = ToolSpec {
                name: name.to_owned(),
                description: meta["description"].as_str().unwrap_or_default().to_owned(),
                tier,
                skip_judge: meta["skip_judge"].as_bool().unwrap_or(false),
                category,
                source: "builtin".to_owned(),
                input_schema,
                output_schema: meta["output"].clone(),
                validator: Arc::new(validator),
            };
            if tools.insert(name.to_owned(), spec).is_some() {
                return Err(CatalogError(format!(
                    "{name} is listed twice in index.json"
                )));
            }
        }
        Ok(Self { tools })
    }

    /// A tool by name.
    pub fn get(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.get(name)
    }

    /// Every tool, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = &ToolSpec> {
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

    #[test]
    fn every_schema_file_is_named_by_the_index_once() {
        let c = Catalog::builtin().expect("catalog");
        assert_eq!(c.iter().count(), SCHEMA_FILES.len());
    }
}
