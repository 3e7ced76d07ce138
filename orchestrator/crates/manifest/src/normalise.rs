//! Older forms AEGIS users write, rewritten to the current form before the schema sees them.
//!
//! AEGIS manifests in the wild predate parts of today's format. Rather than refuse them, this
//! stage rewrites each older form it knows into its current equivalent and says so in a note
//! (a warning with the pointer of what was rewritten), so the stored and exported manifest is
//! the current form and the author learns how to write it. An older form with no faithful
//! equivalent is refused here with a message naming the replacement.
//!
//! Two node facts are applied here too, each with a note: the operator's runtime aliases
//! (`sandbox.runtime_aliases`: a runtime version the node does not have, mapped to one it has)
//! and the node's default `cmd.run` allowlist (`sandbox.default_command_allowlists`)
//! to an agent that offers `cmd.run` without one of its own. Both are written into the manifest
//! at deploy time, so what the agent runs is visible in its export and does not change when the
//! node's config does.

use serde_json::{json, Map, Value};

use super::agent::{AgentView, RuntimeRef, CMD_DISPATCHER, CMD_RUN};
use super::error::{ManifestError, Stage};
use super::units::parse_quantity;
use super::volumes::WORKSPACE_VOLUME;
use super::{pointer, ManifestKind, NodeKnowledge};

/// What normalisation did: notes for each rewrite, errors for older forms it cannot rewrite.
#[derive(Debug, Default)]
pub(crate) struct Normalised {
    /// One per rewrite, pointing at the rewritten node (in the text as written).
    pub(crate) notes: Vec<ManifestError>,
    /// Older forms without a current equivalent.
    pub(crate) errors: Vec<ManifestError>,
}

impl Normalised {
    fn note(&mut self, at: impl Into<String>, message: impl Into<String>) {
        self.notes.push(ManifestError::new(
            Stage::Semantic,
            at,
            format!("normalised: {}", message.into()),
        ));
    }

    fn refuse(&mut self, at: impl Into<String>, message: impl Into<String>) {
        self.errors
            .push(ManifestError::new(Stage::Schema, at, message));
    }
}

/// Rewrites the older forms in `value` in place.
pub(crate) fn normalise(
    kind: ManifestKind,
    value: &mut Value,
    node: &NodeKnowledge<'_>,
) -> Normalised {
    let mut out = Normalised::default();
    match kind {
        ManifestKind::Agent => {
            mcp_builtin_names(value, node, &mut out);
            validation_mapping(value, &mut out);
            memory_off(value, &mut out);
            misplaced_security(value, &mut out);
            runtime_alias(value, node, &mut out);
            default_command_allowlist(value, node, &mut out);
        }
        ManifestKind::Workflow => {
            container_step_names(value, &mut out);
            system_blackboard_updates(value, &mut out);
            workflow_volume_list(value, &mut out);
            shared_workspace(value, &mut out);
            storage_size_limits(value, &mut out);
            state_volume_mounts(value, &mut out);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// `mcp:<built-in tool>` in `spec.tools`

/// The prefix of external MCP tools in `spec.tools` (`mcp:<server>`, `mcp:<server>/<tool>`).
pub const MCP_PREFIX: &str = "mcp:";

/// AEGIS served its built-in tools over MCP, and manifests written for it name some of them
/// with the `mcp:` prefix (`mcp:aegis.agent.search`). Such an entry names a built-in tool of this
/// node: it becomes the plain name, with a note; when the plain name is listed too, the entry
/// is dropped (a tool is offered once). `mcp:<server>` entries of external servers, and names
/// that are no built-in tool, are left for the semantic stage.
fn mcp_builtin_names(value: &mut Value, node: &NodeKnowledge<'_>, out: &mut Normalised) {
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

const VALIDATION: &str = "/spec/execution/validation";

/// The pre-list form `validation: {system: {...}, output: {...}, script: {...}, semantic: {...}}`
/// becomes the ordered validator list: `system.must_succeed` -> `exit_code`, `output` ->
/// `json_schema` and/or `regex`, `semantic` (a model and a prompt) -> a `semantic` validator
/// judged by the node's own judge agent ([`SEMANTIC_JUDGE`]) with the prompt as its criteria and
/// the model as its model. `script` has no current equivalent (validators run no host scripts)
/// and is refused.
fn validation_mapping(value: &mut Value, out: &mut Normalised) {
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

/// The node's own judge agent (`orchestrator/builtin/semantic-judge.yaml`): what an older
/// `semantic` validation (a model and a prompt, no judge agent) is judged by.
pub const SEMANTIC_JUDGE: &str = "aegis-semantic-judge";

/// The score an older `semantic` validation needed when it gave no `threshold` (AEGIS's default).
const OLDER_SEMANTIC_THRESHOLD: f64 = 0.8;

/// The criteria of an older `semantic` validation without a `prompt` (what AEGIS asked then).
const OLDER_SEMANTIC_CRITERIA: &str = "Evaluate whether the output meets the task requirements.";

/// One older `semantic` mapping as a current `semantic` validator and the note's part, or the
/// key (None: the mapping) and why it cannot be rewritten.
fn semantic_judge(
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

/// Keys of `spec.security` that AEGIS manifests sometimes write one level too high, under
/// `spec.execution`, where AEGIS ignores them (so their limits never applied there).
const SECURITY_KEYS: [&str; 3] = ["resources", "network", "filesystem"];

/// `spec.execution.resources` (and `network`, `filesystem`) is moved to `spec.security`, where
/// it means what its author wrote; given in both places it is refused.
fn misplaced_security(value: &mut Value, out: &mut Normalised) {
    let Some(execution) = value
        .pointer_mut("/spec/execution")
        .and_then(Value::as_object_mut)
    else {
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
    let Some(spec) = value.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let security = spec
        .entry("security")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(security) = security.as_object_mut() else {
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
fn runtime_alias(value: &mut Value, node: &NodeKnowledge<'_>, out: &mut Normalised) {
    let RuntimeRef::Language { language, version } = AgentView(value).runtime() else {
        return;
    };
    if language.is_empty() || (node.runtime_known)(&language, &version) {
        return;
    }
    let Some((to_language, to_version)) = (node.runtime_alias)(&language, &version) else {
        return;
    };
    let Some(runtime) = value
        .pointer_mut("/spec/runtime")
        .and_then(Value::as_object_mut)
    else {
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
fn memory_off(value: &mut Value, out: &mut Normalised) {
    let Some(execution) = value
        .pointer_mut("/spec/execution")
        .and_then(Value::as_object_mut)
    else {
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
fn default_command_allowlist(value: &mut Value, node: &NodeKnowledge<'_>, out: &mut Normalised) {
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
    let Some(spec) = value.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let dispatchers = spec
        .entry("builtin_dispatchers")
        .or_insert_with(|| Value::Array(Vec::new()));
    let Some(dispatchers) = dispatchers.as_array_mut() else {
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

/// The System command that writes the blackboard instead of running anything.
pub const UPDATE_BLACKBOARD_COMMAND: &str = "update_blackboard";

/// Older AEGIS manifests wrote blackboard keys with a System state whose command is
/// `update_blackboard` and whose `env` holds the values (`ITERATION_NUMBER: "{{...}}"`). That
/// becomes the state's `update_blackboard` mapping (keys in lower case, as the templates of those
/// manifests read them); the state runs nothing.
fn system_blackboard_updates(value: &mut Value, out: &mut Normalised) {
    let Some(states) = value
        .pointer_mut("/spec/states")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for (name, state) in states.iter_mut() {
        let Some(object) = state.as_object_mut() else {
            continue;
        };
        let is_update = object.get("kind").and_then(Value::as_str) == Some("System")
            && object.get("command").and_then(Value::as_str).map(str::trim)
                == Some(UPDATE_BLACKBOARD_COMMAND);
        if !is_update || object.contains_key("update_blackboard") {
            continue;
        }
        let env = match object.remove("env") {
            Some(Value::Object(env)) => env,
            Some(other) => {
                object.insert("env".into(), other);
                continue;
            }
            None => Map::new(),
        };
        let keys: Vec<String> = env.keys().map(|k| k.to_lowercase()).collect();
        let writes: Map<String, Value> = env
            .into_iter()
            .map(|(k, v)| (k.to_lowercase(), v))
            .collect();
        object.insert("update_blackboard".into(), Value::Object(writes));
        out.note(
            pointer::join(&pointer::join("/spec/states", name), "command"),
            format!(
                "a System state with `command: {UPDATE_BLACKBOARD_COMMAND}` (older AEGIS form) \
                 runs nothing and writes its `env` to the blackboard: it now has \
                 `update_blackboard` with the keys {} (lower case)",
                if keys.is_empty() {
                    "(none)".to_owned()
                } else {
                    keys.iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// ContainerRun step names

/// A ContainerRun name (or ParallelContainerRun step name) written as a phrase (`Run unit
/// tests`) becomes a name (`run-unit-tests`) and keeps the phrase as `display_name`.
fn container_step_names(value: &mut Value, out: &mut Normalised) {
    let Some(states) = value
        .pointer_mut("/spec/states")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for (state_name, state) in states.iter_mut() {
        let at = pointer::join("/spec/states", state_name);
        match state.get("kind").and_then(Value::as_str) {
            Some("ContainerRun") => step_name(&at, state, out),
            Some("ParallelContainerRun") => {
                if let Some(steps) = state.get_mut("steps").and_then(Value::as_array_mut) {
                    for (i, step) in steps.iter_mut().enumerate() {
                        step_name(&format!("{at}/steps/{i}"), step, out);
                    }
                }
            }
            _ => {}
        }
    }
}

fn step_name(at: &str, step: &mut Value, out: &mut Normalised) {
    let Some(object) = step.as_object_mut() else {
        return;
    };
    let Some(name) = object.get("name").and_then(Value::as_str) else {
        return;
    };
    if !name.contains(char::is_whitespace) || object.contains_key("display_name") {
        return;
    }
    let slug = slug(name);
    if slug.is_empty() {
        return;
    }
    let display = name.to_owned();
    object.insert("display_name".into(), Value::String(display.clone()));
    object.insert("name".into(), Value::String(slug.clone()));
    out.note(
        pointer::join(at, "name"),
        format!(
            "the step name `{display}` has spaces: it is kept as `display_name` and the step is \
             named `{slug}` (its key in the state's output)"
        ),
    );
}

/// Lower case, runs of anything but letters and digits as one '-', no '-' at either end, at
/// most 63 characters.
fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.truncate(63);
    out.trim_end_matches('-').to_owned()
}

// ---------------------------------------------------------------------------------------------
// Workflow volumes: `spec.volumes`, `size_limit`, and the mounts of Agent and System states

/// AEGIS examples declare a workflow's volumes as `spec.volumes: [{name, persistent}]`; the
/// current form is `spec.storage`: the entry named `workspace` becomes `spec.storage.workspace`,
/// the others `spec.storage.shared_volumes`, `persistent` becomes `storage_class`.
fn workflow_volume_list(value: &mut Value, out: &mut Normalised) {
    let Some(spec) = value.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let Some(list) = spec.get("volumes") else {
        return;
    };
    let Some(items) = list.as_array() else {
        out.refuse(
            "/spec/volumes",
            "`spec.volumes` (older AEGIS form) is a list of volumes `{name, persistent}`; the \
             current form is `spec.storage`",
        );
        return;
    };
    let mut workspace: Option<Map<String, Value>> = None;
    let mut shared: Vec<Value> = Vec::new();
    let errors_before = out.errors.len();
    let has_workspace = spec
        .get("storage")
        .and_then(|s| s.get(WORKSPACE_VOLUME))
        .is_some();
    for (i, item) in items.iter().enumerate() {
        let at = pointer::join_index("/spec/volumes", i);
        let Some(fields) = item.as_object() else {
            out.refuse(at, "a volume is an object `{name, persistent}`");
            continue;
        };
        let Some(name) = fields.get("name").and_then(Value::as_str) else {
            out.refuse(pointer::join(&at, "name"), "a volume needs a `name`");
            continue;
        };
        let is_workspace = name == WORKSPACE_VOLUME;
        let mut volume = Map::new();
        if !is_workspace {
            volume.insert("name".into(), name.into());
        }
        let class = match (fields.get("persistent"), fields.get("storage_class")) {
            (Some(_), Some(_)) => {
                out.refuse(
                    pointer::join(&at, "persistent"),
                    "give `persistent` or `storage_class`, not both",
                );
                continue;
            }
            (Some(Value::Bool(true)), None) => "persistent",
            (Some(Value::Bool(false)), None) | (None, None) => "ephemeral",
            (Some(_), None) => {
                out.refuse(
                    pointer::join(&at, "persistent"),
                    "`persistent` is true or false",
                );
                continue;
            }
            (None, Some(class)) => match class.as_str() {
                Some(c @ ("ephemeral" | "persistent")) => c,
                _ => {
                    out.refuse(
                        pointer::join(&at, "storage_class"),
                        "`storage_class` is `ephemeral` or `persistent`",
                    );
                    continue;
                }
            },
        };
        volume.insert("storage_class".into(), class.into());
        for (key, v) in fields {
            match key.as_str() {
                "name" | "persistent" | "storage_class" => {}
                "ttl_hours" => {
                    volume.insert(key.clone(), v.clone());
                }
                // Sizes are converted with spec.storage's own (see storage_size_limits).
                "size_limit" | "size_limit_mb" | "size_limit_bytes" => {
                    volume.insert(key.clone(), v.clone());
                }
                other => out.refuse(
                    pointer::join(&at, other),
                    format!(
                        "`{other}` is not a setting of a workflow volume (name, persistent or \
                         storage_class, size_limit, ttl_hours); where a volume is mounted is \
                         said by each state's own `volumes`"
                    ),
                ),
            }
        }
        if is_workspace {
            if workspace.is_some() || has_workspace {
                out.refuse(
                    pointer::join(&at, "name"),
                    "the workspace volume is declared twice (spec.storage.workspace and \
                     spec.volumes, or twice in spec.volumes)",
                );
                continue;
            }
            workspace = Some(volume);
        } else {
            shared.push(Value::Object(volume));
        }
    }
    if out.errors.len() > errors_before {
        return;
    }
    spec.remove("volumes");
    let storage = spec
        .entry("storage")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(storage) = storage.as_object_mut() else {
        return;
    };
    if let Some(w) = workspace {
        storage.insert(WORKSPACE_VOLUME.into(), Value::Object(w));
    }
    if !shared.is_empty() {
        let list = storage
            .entry("shared_volumes")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Some(list) = list.as_array_mut() {
            list.extend(shared);
        }
    }
    out.note(
        "/spec/volumes",
        "`spec.volumes` (older AEGIS form) declares the run's volumes: it is now `spec.storage` \
         (the volume `workspace` as `spec.storage.workspace`, the others as \
         `spec.storage.shared_volumes`, `persistent` as `storage_class`)",
    );
}

/// AEGIS examples also declare the workspace as a shared volume named `workspace` (AEGIS wants
/// every mounted name in `shared_volumes` once that list is used); it is the run's workspace,
/// `spec.storage.workspace`, with `size_limit_bytes` as `size_limit_mb` (rounded up).
fn shared_workspace(value: &mut Value, out: &mut Normalised) {
    let Some(storage) = value
        .pointer_mut("/spec/storage")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    if storage.contains_key(WORKSPACE_VOLUME) {
        return; // declared twice: the semantic stage names the duplicate
    }
    let Some(list) = storage
        .get_mut("shared_volumes")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let Some(index) = list
        .iter()
        .position(|v| v.get("name").and_then(Value::as_str) == Some(WORKSPACE_VOLUME))
    else {
        return;
    };
    let Value::Object(mut fields) = list.remove(index) else {
        return;
    };
    if list.is_empty() {
        storage.remove("shared_volumes");
    }
    fields.remove("name");
    let mut parts = Vec::new();
    if let Some(bytes) = fields.remove("size_limit_bytes") {
        match bytes.as_u64().filter(|b| *b > 0) {
            Some(b) => {
                let mb = b.div_ceil(1 << 20);
                fields.insert("size_limit_mb".into(), mb.into());
                parts.push(format!("`size_limit_bytes: {b}` is `size_limit_mb: {mb}`"));
            }
            // Not a size: left for the schema to name.
            None => {
                fields.insert("size_limit_bytes".into(), bytes);
            }
        }
    }
    storage.insert(WORKSPACE_VOLUME.into(), Value::Object(fields));
    out.note(
        pointer::join_index("/spec/storage/shared_volumes", index),
        format!(
            "a shared volume named `workspace` (older AEGIS form) is the run's workspace: it is \
             now `spec.storage.workspace`{}",
            if parts.is_empty() {
                String::new()
            } else {
                format!(" ({})", parts.join("; "))
            }
        ),
    );
}

/// `size_limit` written as a quantity (`2Gi`, as AEGIS examples do) is the current
/// `size_limit_mb` of the workspace (rounded up to whole MiB) and `size_limit_bytes` of a
/// shared volume.
fn storage_size_limits(value: &mut Value, out: &mut Normalised) {
    let mut volumes: Vec<(String, &mut Value, bool)> = Vec::new();
    let Some(storage) = value
        .pointer_mut("/spec/storage")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for (key, entry) in storage.iter_mut() {
        match key.as_str() {
            WORKSPACE_VOLUME => volumes.push(("/spec/storage/workspace".into(), entry, true)),
            "shared_volumes" => {
                if let Some(list) = entry.as_array_mut() {
                    for (i, v) in list.iter_mut().enumerate() {
                        volumes.push((format!("/spec/storage/shared_volumes/{i}"), v, false));
                    }
                }
            }
            _ => {}
        }
    }
    for (at, volume, is_workspace) in volumes {
        let Some(fields) = volume.as_object_mut() else {
            continue;
        };
        let Some(limit) = fields.get("size_limit").cloned() else {
            continue;
        };
        let current = if is_workspace {
            "size_limit_mb"
        } else {
            "size_limit_bytes"
        };
        let limit_at = pointer::join(&at, "size_limit");
        if fields.contains_key(current) {
            out.refuse(
                limit_at,
                format!("`size_limit` is the older spelling of `{current}`: give only one"),
            );
            continue;
        }
        let Some(bytes) = parse_quantity(&limit) else {
            out.refuse(
                limit_at,
                "`size_limit` is a size: bytes, or a number with Ki, Mi, Gi or Ti (e.g. 2Gi)",
            );
            continue;
        };
        fields.remove("size_limit");
        let written = match &limit {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if is_workspace {
            let mb = bytes.div_ceil(1 << 20);
            fields.insert(current.into(), mb.into());
            let rounded = if bytes % (1 << 20) != 0 {
                " (rounded up to whole MiB)"
            } else {
                ""
            };
            out.note(
                limit_at,
                format!(
                    "`size_limit: {written}` (older AEGIS spelling) is `size_limit_mb: {mb}`{rounded}"
                ),
            );
        } else {
            fields.insert(current.into(), bytes.into());
            out.note(
                limit_at,
                format!(
                    "`size_limit: {written}` (older AEGIS spelling) is `size_limit_bytes: {bytes}`"
                ),
            );
        }
    }
}

/// The template AEGIS manifests mount the run's workspace with.
const WORKSPACE_TEMPLATE: &str = "workflow.storage.workspace";

/// The volume a `volume:` value names: the workspace template, or a plain volume name.
fn mounted_volume(text: &str) -> Result<String, String> {
    let t = text.trim();
    if let Some(inner) = t.strip_prefix("{{").and_then(|r| r.strip_suffix("}}")) {
        if inner.trim() == WORKSPACE_TEMPLATE {
            return Ok(WORKSPACE_VOLUME.to_owned());
        }
    }
    if t.contains("{{") || t.contains("}}") {
        return Err(format!(
            "`{text}`: a state mounts a volume its workflow declares, by name (`workspace` or a \
             name of spec.storage.shared_volumes) or as `{{{{{WORKSPACE_TEMPLATE}}}}}`; a volume \
             chosen at run time is not supported"
        ));
    }
    Ok(t.to_owned())
}

/// Agent and System states of AEGIS examples mount the workspace as `{volume:
/// "{{workflow.storage.workspace}}", mount_point | mount_path, access_mode}`; the current form of
/// every state's mount is `{name, mount_path, read_only}`.
fn state_volume_mounts(value: &mut Value, out: &mut Normalised) {
    let Some(states) = value
        .pointer_mut("/spec/states")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for (name, state) in states.iter_mut() {
        let at = pointer::join("/spec/states", name);
        match state.get("kind").and_then(Value::as_str) {
            Some("Agent" | "System" | "ContainerRun") => mounts_of(&at, state, out),
            Some("ParallelContainerRun") => {
                if let Some(steps) = state.get_mut("steps").and_then(Value::as_array_mut) {
                    for (i, step) in steps.iter_mut().enumerate() {
                        mounts_of(&format!("{at}/steps/{i}"), step, out);
                    }
                }
            }
            _ => {}
        }
    }
}

fn mounts_of(at: &str, item: &mut Value, out: &mut Normalised) {
    let Some(list) = item.get_mut("volumes").and_then(Value::as_array_mut) else {
        return;
    };
    for (i, entry) in list.iter_mut().enumerate() {
        let v_at = pointer::join_index(&pointer::join(at, "volumes"), i);
        let Some(fields) = entry.as_object_mut() else {
            continue;
        };
        let mut changes = Vec::new();
        let mut refused = false;
        if let Some(volume) = fields.get("volume").cloned() {
            if fields.contains_key("name") {
                out.refuse(
                    pointer::join(&v_at, "volume"),
                    "`volume` is the older spelling of `name`: give only one",
                );
                refused = true;
            } else {
                match volume.as_str().map(mounted_volume) {
                    Some(Ok(name)) => {
                        changes.push(format!(
                            "`volume: {}` is `name: {name}`",
                            volume.as_str().unwrap_or_default()
                        ));
                        fields.remove("volume");
                        fields.insert("name".into(), name.into());
                    }
                    Some(Err(problem)) => {
                        out.refuse(pointer::join(&v_at, "volume"), problem);
                        refused = true;
                    }
                    None => {
                        out.refuse(pointer::join(&v_at, "volume"), "`volume` is a volume name");
                        refused = true;
                    }
                }
            }
        }
        if let Some(point) = fields.get("mount_point").cloned() {
            if fields.contains_key("mount_path") {
                out.refuse(
                    pointer::join(&v_at, "mount_point"),
                    "`mount_point` is the older spelling of `mount_path`: give only one",
                );
                refused = true;
            } else {
                fields.remove("mount_point");
                fields.insert("mount_path".into(), point);
                changes.push("`mount_point` is `mount_path`".to_owned());
            }
        }
        if let Some(mode) = fields.get("access_mode").cloned() {
            let read_only = match mode.as_str() {
                Some("read-only") => Some(true),
                Some("read-write") => Some(false),
                _ => None,
            };
            match read_only {
                _ if fields.contains_key("read_only") => {
                    out.refuse(
                        pointer::join(&v_at, "access_mode"),
                        "`access_mode` is the older spelling of `read_only`: give only one",
                    );
                    refused = true;
                }
                Some(ro) => {
                    fields.remove("access_mode");
                    fields.insert("read_only".into(), ro.into());
                    changes.push(format!(
                        "`access_mode: {}` is `read_only: {ro}`",
                        mode.as_str().unwrap_or_default()
                    ));
                }
                None => {
                    out.refuse(
                        pointer::join(&v_at, "access_mode"),
                        "`access_mode` is `read-write` or `read-only`",
                    );
                    refused = true;
                }
            }
        }
        if !changes.is_empty() && !refused {
            out.note(
                v_at,
                format!(
                    "this mount was written in the older AEGIS form: {}",
                    changes.join("; ")
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(default: Option<Vec<String>>) -> impl Fn(&str) -> Option<Vec<String>> {
        move |language| (language == "python").then(|| default.clone()).flatten()
    }

    fn run(
        kind: ManifestKind,
        mut value: Value,
        default: Option<Vec<String>>,
    ) -> (Value, Normalised) {
        let defaults = node(default);
        let knowledge = NodeKnowledge {
            tool_exists: &|_| true,
            runtime_known: &|language, version| (language, version) == ("python", "3.11"),
            default_command_allowlist: &defaults,
            runs_in_sandbox: &|_| true,
            runtime_alias: &|language, version| {
                ((language, version) == ("python", "3.10"))
                    .then(|| ("python".to_owned(), "3.11".to_owned()))
            },
            runtime_versions: &|_| vec!["3.11".to_owned()],
            mcp_servers: &[],
        };
        let out = normalise(kind, &mut value, &knowledge);
        (value, out)
    }

    #[test]
    fn validation_mapping_becomes_a_list_or_is_refused() {
        let agent = json!({"spec": {"execution": {"validation": {
            "semantic": {"enabled": false, "model": "m", "prompt": "p"},
            "output": {"format": "json"},
            "system": {"must_succeed": false}}}}});
        let (value, out) = run(ManifestKind::Agent, agent, None);
        assert!(out.errors.is_empty());
        assert_eq!(
            value.pointer(VALIDATION),
            Some(&json!([{"type": "json_schema", "schema": {}}]))
        );
        assert_eq!(out.notes.len(), 1);
        assert!(out.notes[0].message.contains("dropped"), "{:?}", out.notes);

        let judged = json!({"spec": {"execution": {"validation": {
            "semantic": {"model": "m", "prompt": "p", "fallback_on_unavailable": "skip"},
            "nonsense": {}}}}});
        let (value, out) = run(ManifestKind::Agent, judged.clone(), None);
        assert_eq!(value, judged, "nothing is rewritten when a part is refused");
        let at: Vec<&str> = out.errors.iter().map(|e| e.pointer.as_str()).collect();
        assert_eq!(
            at,
            [
                "/spec/execution/validation/semantic/fallback_on_unavailable",
                "/spec/execution/validation/nonsense"
            ]
        );
        assert!(
            out.errors[0].message.contains("never passes"),
            "{:?}",
            out.errors
        );
    }

    #[test]
    fn the_older_semantic_validation_becomes_the_node_judge() {
        let agent = json!({"spec": {"execution": {"validation": {
            "semantic": {"enabled": true, "model": "smart", "threshold": 0.85,
                         "timeout_seconds": 45, "fallback_on_unavailable": "fail",
                         "prompt": "Check the design:\n{criteria}"},
            "system": {"must_succeed": true}}}}});
        let (value, out) = run(ManifestKind::Agent, agent, None);
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(
            value.pointer(VALIDATION),
            Some(&json!([
                {"type": "exit_code", "expected": 0},
                {"type": "semantic", "judge_agent": SEMANTIC_JUDGE,
                 "criteria": "Check the design:\n{criteria}", "min_score": 0.85,
                 "timeout_seconds": 45, "model": "smart"}
            ]))
        );
        let note = &out.notes[0].message;
        assert!(note.starts_with("normalised: "), "{note}");
        assert!(
            note.contains(SEMANTIC_JUDGE) && note.contains("model `smart`"),
            "{note}"
        );

        // AEGIS's defaults: threshold 0.8, its standard criteria, the judge's own model.
        let bare = json!({"spec": {"execution": {"validation": {"semantic": {"enabled": true}}}}});
        let (value, _) = run(ManifestKind::Agent, bare, None);
        assert_eq!(
            value.pointer(VALIDATION),
            Some(&json!([{"type": "semantic", "judge_agent": SEMANTIC_JUDGE,
                          "criteria": OLDER_SEMANTIC_CRITERIA, "min_score": 0.8}]))
        );

        for (bad, key) in [
            (json!({"threshold": 1.5}), "threshold"),
            (json!({"prompt": ""}), "prompt"),
            (json!({"model": 3}), "model"),
            (json!({"timeout_seconds": 0}), "timeout_seconds"),
        ] {
            let agent = json!({"spec": {"execution": {"validation": {"semantic": bad}}}});
            let (_, out) = run(ManifestKind::Agent, agent, None);
            assert_eq!(
                out.errors[0].pointer,
                format!("{VALIDATION}/semantic/{key}"),
                "{:?}",
                out.errors
            );
        }
        let agent = json!({"spec": {"execution": {"validation": {"semantic": {"judge": "x"}}}}});
        let (_, out) = run(ManifestKind::Agent, agent, None);
        assert!(out.errors[0].message.contains("unknown key `judge`"));
    }

    #[test]
    fn security_keys_written_under_execution_move_to_security() {
        let agent = json!({"spec": {"execution": {"mode": "iterative",
            "network": {"mode": "none"}, "resources": {"cpu": 500}}}});
        let (value, out) = run(ManifestKind::Agent, agent, None);
        assert!(out.errors.is_empty());
        assert_eq!(value["spec"]["execution"], json!({"mode": "iterative"}));
        assert_eq!(
            value["spec"]["security"],
            json!({"network": {"mode": "none"}, "resources": {"cpu": 500}})
        );
        let at: Vec<&str> = out.notes.iter().map(|n| n.pointer.as_str()).collect();
        assert_eq!(at, ["/spec/execution/resources", "/spec/execution/network"]);
        // Given in both places: which one was meant is not for us to guess.
        let twice = json!({"spec": {"execution": {"resources": {"cpu": 500}},
                                    "security": {"resources": {"cpu": 250}}}});
        let (value, out) = run(ManifestKind::Agent, twice, None);
        assert_eq!(out.errors[0].pointer, "/spec/execution/resources");
        assert_eq!(value["spec"]["security"]["resources"], json!({"cpu": 250}));
    }

    #[test]
    fn a_runtime_the_node_maps_is_rewritten_with_a_note() {
        let agent = |version: &str| json!({"spec": {"runtime": {"language": "python", "version": version}}});
        let (value, out) = run(ManifestKind::Agent, agent("3.10"), None);
        assert_eq!(
            value["spec"]["runtime"],
            json!({"language": "python", "version": "3.11"})
        );
        assert_eq!(out.notes[0].pointer, "/spec/runtime");
        assert!(
            out.notes[0].message.contains("sandbox.runtime_aliases"),
            "{:?}",
            out.notes
        );
        // Installed, or neither installed nor mapped: left for the semantic stage.
        for version in ["3.11", "2.7"] {
            let (value, out) = run(ManifestKind::Agent, agent(version), None);
            assert_eq!(value, agent(version));
            assert!(out.notes.is_empty());
        }
    }

    #[test]
    fn the_node_default_allowlist_fills_in_only_what_is_missing() {
        let agent = |dispatchers: Value| {
            json!({"spec": {"runtime": {"language": "python", "version": "3.11"},
                            "tools": ["fs.read", "cmd.run"], "builtin_dispatchers": dispatchers}})
        };
        let default = Some(vec!["python".to_owned()]);
        // No cmd dispatcher: one is added.
        let (value, out) = run(ManifestKind::Agent, agent(json!([])), default.clone());
        assert_eq!(
            value["spec"]["builtin_dispatchers"],
            json!([{"name": "cmd", "capabilities": [
                {"name": "cmd.run", "subcommand_allowlist": ["python"]}]}])
        );
        assert_eq!(out.notes[0].pointer, "/spec/tools/1");
        // A cmd.run capability with limits but no allowlist keeps its limits.
        let partial = json!([{"name": "cmd", "capabilities": [
            {"name": "cmd.run", "timeout_seconds": 5}]}]);
        let (value, _) = run(ManifestKind::Agent, agent(partial), default.clone());
        assert_eq!(
            value["spec"]["builtin_dispatchers"][0]["capabilities"][0],
            json!({"name": "cmd.run", "timeout_seconds": 5, "subcommand_allowlist": ["python"]})
        );
        // The agent's own allowlist wins; no default: nothing changes.
        let own = json!([{"name": "cmd", "capabilities": [
            {"name": "cmd.run", "subcommand_allowlist": ["ls"]}]}]);
        let (value, out) = run(ManifestKind::Agent, agent(own.clone()), default);
        assert_eq!(value["spec"]["builtin_dispatchers"], own);
        assert!(out.notes.is_empty());
        let (value, out) = run(ManifestKind::Agent, agent(json!([])), None);
        assert_eq!(value["spec"]["builtin_dispatchers"], json!([]));
        assert!(out.notes.is_empty());
    }

    #[test]
    fn mcp_names_of_builtin_tools_become_the_builtin_names() {
        let knowledge = NodeKnowledge {
            tool_exists: &|name| matches!(name, "aegis.agent.search" | "cmd.run" | "fs.read"),
            runtime_known: &|_, _| true,
            default_command_allowlist: &|_| None,
            runs_in_sandbox: &|_| true,
            runtime_alias: &|_, _| None,
            runtime_versions: &|_| Vec::new(),
            mcp_servers: &[],
        };
        let mut agent = json!({"spec": {"tools": [
            "mcp:aegis.agent.search", "fs.read", "mcp:fs.read", "mcp:gmail", "mcp:gmail/send",
            "mcp:aegis.nothing"]}});
        let out = normalise(ManifestKind::Agent, &mut agent, &knowledge);
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(
            agent["spec"]["tools"],
            json!([
                "aegis.agent.search",
                "fs.read",
                "mcp:gmail",
                "mcp:gmail/send",
                "mcp:aegis.nothing"
            ]),
            "built-in names rewritten, a duplicate dropped, the rest left for the semantic stage"
        );
        let notes: Vec<(&str, &str)> = out
            .notes
            .iter()
            .map(|n| (n.pointer.as_str(), n.message.as_str()))
            .collect();
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert_eq!(notes[0].0, "/spec/tools/0");
        assert!(
            notes[0]
                .1
                .starts_with("normalised: `mcp:aegis.agent.search` names the built-in tool")
                && notes[0].1.contains("offered as `aegis.agent.search`"),
            "{notes:?}"
        );
        assert_eq!(notes[1].0, "/spec/tools/2");
        assert!(notes[1].1.contains("already offered"), "{notes:?}");

        // `mcp:cmd.run` becomes `cmd.run` before the node's default allowlist is considered.
        let mut agent = json!({"spec": {"tools": ["mcp:cmd.run"]}});
        let out = normalise(ManifestKind::Agent, &mut agent, &knowledge);
        assert_eq!(agent["spec"]["tools"], json!(["cmd.run"]));
        assert_eq!(out.notes.len(), 1);
    }

    #[test]
    fn the_workspace_size_limit_alias_is_normalised_with_a_note() {
        let workflow = json!({"spec": {"storage": {
            "workspace": {"storage_class": "ephemeral", "ttl_hours": 6, "size_limit": "2Gi"},
            "shared_volumes": [{"name": "cache", "storage_class": "persistent", "size_limit": "1500Ki"}]}}});
        let (value, out) = run(ManifestKind::Workflow, workflow, None);
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(
            value["spec"]["storage"],
            json!({"workspace": {"storage_class": "ephemeral", "ttl_hours": 6, "size_limit_mb": 2048},
                   "shared_volumes": [{"name": "cache", "storage_class": "persistent", "size_limit_bytes": 1_536_000}]})
        );
        let mut notes: Vec<(&str, &str)> = out
            .notes
            .iter()
            .map(|n| (n.pointer.as_str(), n.message.as_str()))
            .collect();
        notes.sort();
        assert_eq!(
            notes,
            [
                (
                    "/spec/storage/shared_volumes/0/size_limit",
                    "normalised: `size_limit: 1500Ki` (older AEGIS spelling) is `size_limit_bytes: 1536000`"
                ),
                (
                    "/spec/storage/workspace/size_limit",
                    "normalised: `size_limit: 2Gi` (older AEGIS spelling) is `size_limit_mb: 2048`"
                ),
            ]
        );

        // Not whole MiB: rounded up, and the note says so.
        let odd = json!({"spec": {"storage": {"workspace": {"size_limit": "1536Ki"}}}});
        let (value, out) = run(ManifestKind::Workflow, odd, None);
        assert_eq!(value["spec"]["storage"]["workspace"]["size_limit_mb"], 2);
        assert!(
            out.notes[0].message.contains("rounded up"),
            "{:?}",
            out.notes
        );

        // Both spellings, or a size that is not one: refused at the key, nothing rewritten.
        for (bad, says) in [
            (
                json!({"size_limit": "2Gi", "size_limit_mb": 10}),
                "give only one",
            ),
            (json!({"size_limit": "lots"}), "is a size"),
        ] {
            let w = json!({"spec": {"storage": {"workspace": bad.clone()}}});
            let (value, out) = run(ManifestKind::Workflow, w, None);
            assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
            assert_eq!(out.errors[0].pointer, "/spec/storage/workspace/size_limit");
            assert!(out.errors[0].message.contains(says), "{:?}", out.errors);
            assert_eq!(value["spec"]["storage"]["workspace"], bad);
        }
    }

    #[test]
    fn older_volume_declarations_and_mounts_become_the_current_form() {
        let workflow = json!({"spec": {
            "volumes": [{"name": "workspace", "persistent": true, "size_limit": "64Mi"},
                        {"name": "cache", "persistent": false}],
            "states": {
                "WRITE": {"kind": "Agent", "volumes": [
                    {"volume": "{{ workflow.storage.workspace }}", "mount_point": "/workspace", "access_mode": "read-write"}]},
                "TEST": {"kind": "System", "volumes": [
                    {"volume": "cache", "mount_path": "/workspace/cache", "access_mode": "read-only"}]},
                "CHECK": {"kind": "ParallelContainerRun", "steps": [
                    {"name": "a", "volumes": [{"name": "workspace", "mount_path": "/workspace", "read_only": true}]}]}}}});
        let (value, out) = run(ManifestKind::Workflow, workflow, None);
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert!(value["spec"].get("volumes").is_none());
        assert_eq!(
            value["spec"]["storage"],
            json!({"workspace": {"storage_class": "persistent", "size_limit_mb": 64},
                   "shared_volumes": [{"name": "cache", "storage_class": "ephemeral"}]})
        );
        assert_eq!(
            value["spec"]["states"]["WRITE"]["volumes"],
            json!([{"name": "workspace", "mount_path": "/workspace", "read_only": false}])
        );
        assert_eq!(
            value["spec"]["states"]["TEST"]["volumes"],
            json!([{"name": "cache", "mount_path": "/workspace/cache", "read_only": true}])
        );
        // The current form is left alone.
        assert_eq!(
            value["spec"]["states"]["CHECK"]["steps"][0]["volumes"][0]["read_only"],
            true
        );
        let at: Vec<&str> = out.notes.iter().map(|n| n.pointer.as_str()).collect();
        assert!(at.contains(&"/spec/volumes"), "{at:?}");
        assert!(at.contains(&"/spec/storage/workspace/size_limit"), "{at:?}");
        assert!(at.contains(&"/spec/states/WRITE/volumes/0"), "{at:?}");
        assert!(out
            .notes
            .iter()
            .all(|n| n.message.starts_with("normalised: ")));

        // A volume chosen at run time, or both spellings: refused by pointer.
        let runtime = json!({"spec": {"states": {"A": {"kind": "Agent", "volumes": [
            {"volume": "{{input.volume_id}}", "mount_path": "/workspace"},
            {"volume": "x", "name": "x", "mount_path": "/workspace/x"},
            {"name": "y", "mount_path": "/workspace/y", "access_mode": "sometimes"}]}}}});
        let (_, out) = run(ManifestKind::Workflow, runtime, None);
        let at: Vec<&str> = out.errors.iter().map(|e| e.pointer.as_str()).collect();
        assert_eq!(
            at,
            [
                "/spec/states/A/volumes/0/volume",
                "/spec/states/A/volumes/1/volume",
                "/spec/states/A/volumes/2/access_mode"
            ]
        );
        assert!(
            out.errors[0].message.contains("chosen at run time"),
            "{:?}",
            out.errors
        );

        // The workspace declared as a shared volume named `workspace`.
        let shared = json!({"spec": {"storage": {"shared_volumes": [
            {"name": "cache", "storage_class": "ephemeral"},
            {"name": "workspace", "storage_class": "persistent", "size_limit_bytes": 3_000_000}]}}});
        let (value, out) = run(ManifestKind::Workflow, shared, None);
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert_eq!(
            value["spec"]["storage"],
            json!({"workspace": {"storage_class": "persistent", "size_limit_mb": 3},
                   "shared_volumes": [{"name": "cache", "storage_class": "ephemeral"}]})
        );
        assert_eq!(out.notes[0].pointer, "/spec/storage/shared_volumes/1");

        // The workspace declared twice, or a key that is not a volume setting.
        let twice = json!({"spec": {"storage": {"workspace": {}},
                                    "volumes": [{"name": "workspace", "mount_path": "/x"}]}});
        let (value, out) = run(ManifestKind::Workflow, twice.clone(), None);
        let at: Vec<&str> = out.errors.iter().map(|e| e.pointer.as_str()).collect();
        assert_eq!(at, ["/spec/volumes/0/mount_path", "/spec/volumes/0/name"]);
        assert_eq!(value, twice);
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("Run unit tests"), "run-unit-tests");
        assert_eq!(slug("  Lint & Format (ruff) "), "lint-format-ruff");
        assert_eq!(slug("***"), "");
    }
}
