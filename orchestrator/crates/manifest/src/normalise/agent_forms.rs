//! Older forms of an agent manifest rewritten to the current one: `mcp:` names of built-in
//! tools, the validation mapping and the older semantic judge, security keys in the wrong
//! place, memory off; and the node's runtime aliases and default `cmd.run` allowlist applied.

use serde_json::{json, Map, Value};

use super::{mapping_at, Normalised, MCP_PREFIX, SEMANTIC_JUDGE};
use crate::agent::{AgentView, RuntimeRef, CMD_DISPATCHER, CMD_RUN};
use crate::{pointer, NodeKnowledge};

/// AEGIS served its built-in tools over MCP, and manifests written for it name some of them
/// with the `mcp:` prefix (`mcp:aegis.agent.search`). Such an entry names a built-in tool of this
/// node: it becomes the plain name, with a note; when the plain name is listed too, the entry
/// is dropped (a tool is offered once). `mcp:<server>` entries of external servers, and names
/// that are no built-in tool, are left for the semantic stage.
pub(super) fn mcp_builtin_names(value: &mut Value, node: &NodeKnowledge<'_>, out: &mut Normalised) {
    let Some(tools) = value
        .pointer_mut("/spec/tools")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let builtin_of = |entry: &Value| {
        entry
            .as_str()
            .and_then(|t| t.strip_prefix(MCP_PREFIX))
            .filter(|name| (node.tool_exists)(name))
            .map(str::to_owned)
    };
    if !tools.iter().any(|t| builtin_of(t).is_some()) {
        return;
    }
    let mut offered: Vec<String> = tools
        .iter()
        .filter_map(|t| t.as_str())
        .filter(|t| !t.starts_with(MCP_PREFIX))
        .map(str::to_owned)
        .collect();
    let mut kept = Vec::with_capacity(tools.len());
    for (i, entry) in std::mem::take(tools).into_iter().enumerate() {
        let Some(builtin) = builtin_of(&entry) else {
            kept.push(entry);
            continue;
        };
        let at = pointer::join_index("/spec/tools", i);
        if offered.contains(&builtin) {
            out.note(
                at,
                format!(
                    "`{MCP_PREFIX}{builtin}` names the built-in tool `{builtin}` (AEGIS served its \
                     built-in tools over MCP), which is already offered: the entry was dropped"
                ),
            );
            continue;
        }
        out.note(
            at,
            format!(
                "`{MCP_PREFIX}{builtin}` names the built-in tool `{builtin}` (AEGIS served its \
                 built-in tools over MCP): it is offered as `{builtin}`; `{MCP_PREFIX}` names \
                 external MCP servers here (`{MCP_PREFIX}<server>`, `{MCP_PREFIX}<server>/<tool>`)"
            ),
        );
        offered.push(builtin.clone());
        kept.push(Value::String(builtin));
    }
    *tools = kept;
}

// ---------------------------------------------------------------------------------------------
// `spec.execution.validation` as a mapping

pub(super) const VALIDATION: &str = "/spec/execution/validation";

/// The pre-list form `validation: {system: {...}, output: {...}, script: {...}, semantic: {...}}`
/// becomes the ordered validator list: `system.must_succeed` -> `exit_code`, `output` ->
/// `json_schema` and/or `regex`, `semantic` (a model and a prompt) -> a `semantic` validator
/// judged by the node's own judge agent ([`SEMANTIC_JUDGE`]) with the prompt as its criteria and
/// the model as its model. `script` has no current equivalent (validators run no host scripts)
/// and is refused.
pub(super) fn validation_mapping(value: &mut Value, out: &mut Normalised) {
    let Some(Value::Object(old)) = value.pointer(VALIDATION) else {
        return;
    };
    let old = old.clone();
    let mut list = Vec::new();
    let mut parts = Vec::new();
    // The order validators ran in AEGIS: the exit status, then the output, then the judges.
    let rank = |k: &str| {
        ["system", "output", "script", "semantic"]
            .iter()
            .position(|x| *x == k)
            .unwrap_or(usize::MAX)
    };
    let mut sections: Vec<(&String, &Value)> = old.iter().collect();
    sections.sort_by_key(|(k, _)| rank(k));
    for (key, section) in sections {
        let at = pointer::join(VALIDATION, key);
        match (key.as_str(), section) {
            ("system", Value::Object(system)) => {
                let must_succeed = system
                    .get("must_succeed")
                    .and_then(Value::as_bool)
                    .unwrap_or(true);
                if must_succeed {
                    list.push(json!({"type": "exit_code", "expected": 0}));
                    parts.push("`system.must_succeed` became an `exit_code` validator".to_owned());
                } else {
                    parts.push(
                        "`system` without `must_succeed` checks nothing and was dropped".to_owned(),
                    );
                }
            }
            ("output", Value::Object(output)) => {
                let format = output.get("format").and_then(Value::as_str).unwrap_or("");
                if let Some(schema) = output.get("schema") {
                    list.push(json!({"type": "json_schema", "schema": schema}));
                    parts.push("`output.schema` became a `json_schema` validator".to_owned());
                } else if format == "json" {
                    list.push(json!({"type": "json_schema", "schema": {}}));
                    parts.push(
                        "`output.format: json` became a `json_schema` validator accepting any JSON"
                            .to_owned(),
                    );
                }
                if let Some(pattern) = output.get("regex") {
                    list.push(json!({"type": "regex", "pattern": pattern, "target": "stdout"}));
                    parts.push("`output.regex` became a `regex` validator on stdout".to_owned());
                }
            }
            ("semantic", Value::Object(semantic))
                if semantic.get("enabled").and_then(Value::as_bool) == Some(false) =>
            {
                parts.push("`semantic` with `enabled: false` was dropped".to_owned());
            }
            ("semantic", Value::Object(semantic)) => match semantic_judge(semantic) {
                Ok((validator, part)) => {
                    list.push(validator);
                    parts.push(part);
                }
                Err((key, message)) => out.refuse(
                    key.map_or_else(|| at.clone(), |k| pointer::join(&at, k)),
                    message,
                ),
            },
            ("semantic", _) => out.refuse(
                at,
                "the older `semantic` validation must be a mapping (`model`, `prompt`, \
                 `threshold`); or write the current form, a list item \
                 `{type: semantic, judge_agent: <agent>, criteria: <text>}`",
            ),
            ("script", _) => out.refuse(
                at,
                "`script` validation (a host script) is not supported: validators never run \
                 programs on the node; use `exit_code`, `json_schema`, `regex`, `semantic` or \
                 `multi_judge` list items",
            ),
            _ => out.refuse(
                at,
                format!(
                    "unknown key `{key}` in the older `validation` mapping (known: system, \
                     output, script, semantic); the current form is a list of validators"
                ),
            ),
        }
    }
    if !out.errors.is_empty() {
        return;
    }
    if let Some(slot) = value.pointer_mut(VALIDATION) {
        *slot = Value::Array(list);
    }
    out.note(
        VALIDATION,
        format!(
            "`validation` was a mapping (older AEGIS form) and is now a list of validators: {}",
            if parts.is_empty() {
                "the mapping was empty".to_owned()
            } else {
                parts.join("; ")
            }
        ),
    );
}

/// The score an older `semantic` validation needed when it gave no `threshold` (AEGIS's default).
pub(super) const OLDER_SEMANTIC_THRESHOLD: f64 = 0.8;

/// The criteria of an older `semantic` validation without a `prompt` (what AEGIS asked then).
pub(super) const OLDER_SEMANTIC_CRITERIA: &str =
    "Evaluate whether the output meets the task requirements.";

/// One older `semantic` mapping as a current `semantic` validator and the note's part, or the
/// key (None: the mapping) and why it cannot be rewritten.
pub(super) fn semantic_judge(
    old: &Map<String, Value>,
) -> Result<(Value, String), (Option<&'static str>, String)> {
    const KNOWN: [&str; 6] = [
        "enabled",
        "model",
        "prompt",
        "threshold",
        "timeout_seconds",
        "fallback_on_unavailable",
    ];
    if let Some(unknown) = old.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err((
            None,
            format!(
                "unknown key `{unknown}` in the older `semantic` validation (known: {})",
                KNOWN.join(", ")
            ),
        ));
    }
    let criteria = match old.get("prompt") {
        None => OLDER_SEMANTIC_CRITERIA.to_owned(),
        Some(Value::String(p)) if !p.trim().is_empty() => p.clone(),
        Some(_) => {
            return Err((
                Some("prompt"),
                "`prompt` must be the judge's instructions as non-blank text".to_owned(),
            ))
        }
    };
    let threshold = match old.get("threshold") {
        None => OLDER_SEMANTIC_THRESHOLD,
        Some(t) => match t.as_f64().filter(|t| (0.0..=1.0).contains(t)) {
            Some(t) => t,
            None => {
                return Err((
                    Some("threshold"),
                    "`threshold` must be a number from 0.0 to 1.0 (the score needed to pass)"
                        .to_owned(),
                ))
            }
        },
    };
    let mut validator = Map::new();
    validator.insert("type".into(), "semantic".into());
    validator.insert("judge_agent".into(), SEMANTIC_JUDGE.into());
    validator.insert("criteria".into(), criteria.into());
    validator.insert("min_score".into(), json!(threshold));
    let mut part = format!(
        "`semantic` (a model and a prompt) became a `semantic` validator judged by the node's \
         judge agent `{SEMANTIC_JUDGE}`, with the prompt as its criteria and min_score {threshold}"
    );
    if let Some(timeout) = old.get("timeout_seconds") {
        match timeout.as_u64().filter(|t| (1..=86_400).contains(t)) {
            Some(t) => {
                validator.insert("timeout_seconds".into(), t.into());
            }
            None => {
                return Err((
                    Some("timeout_seconds"),
                    "`timeout_seconds` must be a whole number of seconds from 1 to 86400"
                        .to_owned(),
                ))
            }
        }
    }
    match old.get("model") {
        None => {}
        Some(Value::String(m)) if !m.trim().is_empty() => {
            validator.insert("model".into(), m.clone().into());
            part.push_str(&format!(", asked with model `{m}`"));
        }
        Some(_) => {
            return Err((
                Some("model"),
                "`model` must name an LLM alias of the node configuration".to_owned(),
            ))
        }
    }
    match old.get("fallback_on_unavailable") {
        None => {}
        Some(Value::String(f)) if f == "fail" => {}
        Some(_) => {
            return Err((
                Some("fallback_on_unavailable"),
                "`fallback_on_unavailable: skip` (pass when the judge cannot be asked) is not \
                 supported: a validator that did not run never passes on this node; remove the \
                 key (judges fail closed, as `fail` says)"
                    .to_owned(),
            ))
        }
    }
    Ok((Value::Object(validator), part))
}

// ---------------------------------------------------------------------------------------------
// `spec.execution.resources|network|filesystem`

/// The entry `key` of `spec`, made by `empty` when it is missing (a form moved or completed
/// there needs its home); `None` when `spec` is not a mapping (the schema refuses that later).
fn spec_entry<'v>(
    value: &'v mut Value,
    key: &str,
    empty: impl FnOnce() -> Value,
) -> Option<&'v mut Value> {
    let spec = mapping_at(value, "/spec")?;
    Some(spec.entry(key).or_insert_with(empty))
}

/// Keys of `spec.security` that AEGIS manifests sometimes write one level too high, under
/// `spec.execution`, where AEGIS ignores them (so their limits never applied there).
pub(super) const SECURITY_KEYS: [&str; 3] = ["resources", "network", "filesystem"];

/// `spec.execution.resources` (and `network`, `filesystem`) is moved to `spec.security`, where
/// it means what its author wrote; given in both places it is refused.
pub(super) fn misplaced_security(value: &mut Value, out: &mut Normalised) {
    let Some(execution) = mapping_at(value, "/spec/execution") else {
        return;
    };
    let mut moved: Vec<(&str, Value)> = Vec::new();
    for key in SECURITY_KEYS {
        if let Some(v) = execution.remove(key) {
            moved.push((key, v));
        }
    }
    if moved.is_empty() {
        return;
    }
    let security = spec_entry(value, "security", || Value::Object(Map::new()));
    let Some(security) = security.and_then(Value::as_object_mut) else {
        return;
    };
    for (key, v) in moved {
        let at = pointer::join("/spec/execution", key);
        if security.contains_key(key) {
            out.refuse(
                at,
                format!(
                    "`{key}` belongs under spec.security, and spec.security.{key} is given too: \
                     remove this one (under spec.execution AEGIS ignores it)"
                ),
            );
            continue;
        }
        security.insert(key.to_owned(), v);
        out.note(
            at,
            format!(
                "`{key}` under spec.execution (where AEGIS ignores it) belongs to spec.security: \
                 it was moved to spec.security.{key}, so it applies"
            ),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// `sandbox.runtime_aliases`

/// A runtime the registry does not have, which the operator maps to one it has: the manifest
/// names the installed one from now on (the refusal of an unmapped one is the semantic stage's).
pub(super) fn runtime_alias(value: &mut Value, node: &NodeKnowledge<'_>, out: &mut Normalised) {
    let RuntimeRef::Language { language, version } = AgentView(value).runtime() else {
        return;
    };
    if language.is_empty() || (node.runtime_known)(&language, &version) {
        return;
    }
    let Some((to_language, to_version)) = (node.runtime_alias)(&language, &version) else {
        return;
    };
    let Some(runtime) = mapping_at(value, "/spec/runtime") else {
        return;
    };
    runtime.insert("language".into(), to_language.clone().into());
    runtime.insert("version".into(), to_version.clone().into());
    out.note(
        "/spec/runtime",
        format!(
            "runtime `{language}` `{version}` is not installed on this node; the node config maps \
             it to `{to_language}` `{to_version}` (sandbox.runtime_aliases), which the deployed \
             manifest names"
        ),
    );
}

// ---------------------------------------------------------------------------------------------
// `spec.execution.memory: false`

/// `memory: false` (as in AEGIS's hello-world template), or `{enabled: false, ...}`, asks for
/// the default: no memory across executions. It is dropped with a note, so the stored manifest
/// says `memory` only when memory is on; any other value is left for the schema to judge.
pub(super) fn memory_off(value: &mut Value, out: &mut Normalised) {
    let Some(execution) = mapping_at(value, "/spec/execution") else {
        return;
    };
    let off = match execution.get("memory") {
        Some(Value::Bool(false)) => true,
        Some(Value::Object(m)) => m.get("enabled") == Some(&Value::Bool(false)),
        _ => false,
    };
    if off {
        execution.remove("memory");
        out.note(
            "/spec/execution/memory",
            "`memory` turned off is the default (no memory across executions): the key was \
             dropped",
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The node's default cmd.run allowlist

/// `cmd.run` offered without an allowlist: the node's default for the agent's runtime language
/// is written into `spec.builtin_dispatchers`. Without a default nothing changes and the
/// semantic stage refuses the manifest, as it always has.
pub(super) fn default_command_allowlist(
    value: &mut Value,
    node: &NodeKnowledge<'_>,
    out: &mut Normalised,
) {
    let view = AgentView(value);
    let Some(index) = view.tools().iter().position(|t| t == CMD_RUN) else {
        return;
    };
    if view.subcommand_allowlist().is_some_and(|l| !l.is_empty()) {
        return;
    }
    let RuntimeRef::Language { language, .. } = view.runtime() else {
        return;
    };
    let Some(default) = (node.default_command_allowlist)(&language) else {
        return;
    };
    if default.is_empty() {
        return;
    }
    let dispatchers = spec_entry(value, "builtin_dispatchers", || Value::Array(Vec::new()));
    let Some(dispatchers) = dispatchers.and_then(Value::as_array_mut) else {
        return;
    };
    let allowlist = Value::from(default.clone());
    let existing = dispatchers
        .iter_mut()
        .filter(|d| d.get("name").and_then(Value::as_str) == Some(CMD_DISPATCHER))
        .find_map(|d| d.get_mut("capabilities")?.as_array_mut());
    match existing {
        Some(capabilities) => {
            match capabilities
                .iter_mut()
                .find(|c| c.get("name").and_then(Value::as_str) == Some(CMD_RUN))
                .and_then(Value::as_object_mut)
            {
                Some(capability) => {
                    capability.insert("subcommand_allowlist".into(), allowlist);
                }
                None => {
                    capabilities.push(json!({"name": CMD_RUN, "subcommand_allowlist": allowlist}))
                }
            }
        }
        None => {
            let mut dispatcher = Map::new();
            dispatcher.insert("name".into(), CMD_DISPATCHER.into());
            dispatcher.insert(
                "capabilities".into(),
                json!([{"name": CMD_RUN, "subcommand_allowlist": allowlist}]),
            );
            dispatchers.push(Value::Object(dispatcher));
        }
    }
    out.note(
        pointer::join_index("/spec/tools", index),
        format!(
            "`{CMD_RUN}` is offered without a subcommand_allowlist, so the node's default for \
             runtime `{language}` applies: [{}] (node config \
             `sandbox.default_command_allowlists.{language}`); it is written into \
             spec.builtin_dispatchers of the deployed manifest. Give your own allowlist to \
             choose the commands.",
            default.join(", ")
        ),
    );
}

// ---------------------------------------------------------------------------------------------
// System `command: update_blackboard`
