//! The semantic stage: what a JSON Schema cannot say.
//!
//! Runs only on documents that passed the schema, so it may rely on the shape (and falls back
//! quietly where it cannot). It checks cross-references inside the manifest (initial state,
//! transition targets, reachability, template references, volume names) and references to the
//! node (tools in the catalog, runtimes in the registry), which the schema cannot know.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};

use serde_json::{Map, Value};

use super::agent::{AgentView, CMD_DISPATCHER, CMD_RUN, MEMORY_TOOLS};
use super::deployed::Deployed;
use super::error::{ManifestError, Stage};
use super::graph::StateGraph;
use super::normalise::MCP_PREFIX;
use super::template::path_refs;
use super::volumes::paths_overlap;
use super::{pointer, ManifestKind, NodeKnowledge};

/// What the semantic stage found: errors refuse the manifest, warnings do not.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    /// Problems that make the manifest unusable.
    pub(crate) errors: Vec<ManifestError>,
    /// Problems that a later deploy may fix (an agent not deployed yet), reported with the
    /// manifest accepted.
    pub(crate) warnings: Vec<ManifestError>,
    /// Blackboard keys a workflow's templates read that nothing in it writes: a run must be
    /// given them as blackboard overrides (see [`run_supplied_keys`]).
    pub(crate) run_supplied: BTreeSet<String>,
}

/// Every semantic problem of a schema-valid manifest, without positions. References to other
/// definitions are checked only when `deployed` (the registry as the caller sees it) is given.
pub(crate) fn check(
    kind: ManifestKind,
    value: &Value,
    node: &NodeKnowledge<'_>,
    deployed: Option<&Deployed>,
) -> Findings {
    let mut errors = Errors::default();
    metadata(value, &mut errors);
    match kind {
        ManifestKind::Agent => agent(value, node, &mut errors),
        ManifestKind::Workflow => workflow(value, node, deployed, &mut errors),
    }
    errors.0
}

/// The blackboard keys a workflow's templates read but nothing in it writes: a run of it must be
/// given each as a blackboard override (checked when the run starts).
pub fn run_supplied_keys(workflow: &Value) -> BTreeSet<String> {
    let mut errors = Errors::default();
    let empty = Map::new();
    let states = workflow
        .pointer("/spec/states")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let initial = workflow
        .pointer("/spec/initial_state")
        .and_then(Value::as_str);
    let graph = StateGraph::new(states, initial);
    let refs = References::new(workflow, states, &graph);
    for (name, state) in states {
        refs.state(
            &pointer::join("/spec/states", name),
            name,
            state,
            &mut errors,
        );
    }
    if let Some(template) = workflow.pointer("/metadata/output_template") {
        refs.walk(
            "/metadata/output_template",
            template,
            Scope::Final,
            &mut errors,
        );
    }
    errors.0.run_supplied
}

#[derive(Default)]
struct Errors(Findings);

impl Errors {
    fn push(&mut self, pointer: impl Into<String>, message: impl Into<String>) {
        self.0
            .errors
            .push(ManifestError::new(Stage::Semantic, pointer, message));
    }

    fn warn(&mut self, pointer: impl Into<String>, message: impl Into<String>) {
        self.0
            .warnings
            .push(ManifestError::new(Stage::Semantic, pointer, message));
    }
}

fn metadata(value: &Value, errors: &mut Errors) {
    if let Some(name) = value.pointer("/metadata/name").and_then(Value::as_str) {
        if let Err(problem) = check_name(name) {
            errors.push(
                "/metadata/name",
                format!("invalid name `{name}`: {problem}"),
            );
        }
    }
    if let Some(version) = value.pointer("/metadata/version").and_then(Value::as_str) {
        if let Err(e) = semver::Version::parse(version) {
            errors.push(
                "/metadata/version",
                format!("`{version}` is not a semantic version (MAJOR.MINOR.PATCH): {e}"),
            );
        }
    }
}

/// Agent and workflow names: 1-63 lowercase letters, digits and '-', starting with a letter or
/// digit and not ending with '-' (a DNS label, usable in container names; AEGIS allows a
/// leading digit, and so do we).
pub fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 63 {
        return Err("a name has 1 to 63 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err("a name has only lowercase letters, digits and '-'");
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit()) {
        return Err("a name starts with a lowercase letter or a digit");
    }
    if name.ends_with('-') {
        return Err("a name does not end with '-'");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Agents

fn agent(value: &Value, node: &NodeKnowledge<'_>, errors: &mut Errors) {
    let memory = AgentView(value).memory().is_some();
    for (i, tool) in strings_at(value, "/spec/tools") {
        let at = pointer::join_index("/spec/tools", i);
        if let Some(rest) = tool.strip_prefix(MCP_PREFIX) {
            if let Some(problem) = mcp_entry(rest, node) {
                errors.push(at, problem);
            }
        } else if !(node.tool_exists)(tool) {
            errors.push(
                at,
                format!("unknown tool `{tool}`: this node has no tool of that name"),
            );
        } else if MEMORY_TOOLS.contains(&tool) && !memory {
            errors.push(
                pointer::join_index("/spec/tools", i),
                format!(
                    "`{tool}` reads and writes the agent's memory across executions, which is \
                     off: set `spec.execution.memory: true` (the memory tools are then offered \
                     without being listed here)"
                ),
            );
        }
    }
    runtime(value, node, errors);
    for list in ["read", "write"] {
        let at = format!("/spec/security/filesystem/{list}");
        for (i, path) in strings_at(value, &at) {
            if let Err(problem) = check_path(path) {
                errors.push(pointer::join_index(&at, i), problem);
            }
        }
    }
    dispatchers(value, node, errors);
    volumes(value, node, errors);
    if let Some(schema) = value.pointer("/spec/input_schema") {
        check_json_schema("/spec/input_schema", schema, errors);
    }
    for (i, validator) in array_at(value, "/spec/execution/validation") {
        let at = format!("/spec/execution/validation/{i}");
        validator_rules(&at, validator, errors);
    }
    if let Some(handler) = value.pointer("/spec/output_handler") {
        output_handler("/spec/output_handler", handler, node, errors);
    }
}

/// `mcp:<server>` or `mcp:<server>/<tool>` (after normalisation, which rewrote `mcp:<built-in>`):
/// the server must be one of the node's. Whether the tool exists is the server's to say, at run
/// time (a server may be down at deploy time, and its tools change).
fn mcp_entry(rest: &str, node: &NodeKnowledge<'_>) -> Option<String> {
    let server = rest.split_once('/').map_or(rest, |(server, _)| server);
    if node.mcp_servers.iter().any(|s| s == server) {
        return None;
    }
    let configured = if node.mcp_servers.is_empty() {
        "this node has no external MCP servers (node config `mcp_servers`)".to_owned()
    } else {
        format!(
            "the node's MCP servers are: {} (node config `mcp_servers`)",
            node.mcp_servers.join(", ")
        )
    };
    Some(if server.contains('.') {
        format!(
            "`{MCP_PREFIX}{rest}` names neither a built-in tool (see aegis.tools.list) nor an \
             MCP server of this node; {configured}"
        )
    } else {
        format!(
            "`{MCP_PREFIX}{rest}` names the MCP server `{server}`, which this node does not \
             have; {configured}"
        )
    })
}

fn runtime(value: &Value, node: &NodeKnowledge<'_>, errors: &mut Errors) {
    let Some(runtime) = value.pointer("/spec/runtime") else {
        return;
    };
    if runtime.get("image").is_some() {
        return;
    }
    let language = runtime.get("language").and_then(Value::as_str);
    let version = runtime.get("version").and_then(Value::as_str);
    if let (Some(language), Some(version)) = (language, version) {
        if !(node.runtime_known)(language, version) {
            let versions = (node.runtime_versions)(language);
            let installed = if versions.is_empty() {
                format!("this node has no `{language}` runtime (see aegis.runtime.list)")
            } else {
                let list: Vec<String> = versions.iter().map(|v| format!("\"{v}\"")).collect();
                format!("write `version: {}` instead", list.join("` or `version: "))
            };
            errors.push(
                "/spec/runtime",
                format!(
                    "unknown runtime `{language}` `{version}`: not in this node's runtime registry \
                     and no custom `image` is given; {installed}, or ask the operator to map it to \
                     an installed runtime in the node config (`sandbox.runtime_aliases: \
                     {{\"{language}:{version}\": \"<language>:<version>\"}}`)"
                ),
            );
        }
    }
}

/// Allowlist paths: absolute or relative, but normalised and without `..`, so that what the
/// author reads is exactly what the sandbox resolves.
fn check_path(path: &str) -> Result<(), String> {
    let body = path.strip_prefix('/').unwrap_or(path);
    if path.is_empty() {
        return Err("a path must not be empty".to_owned());
    }
    if path == "/" {
        return Ok(());
    }
    for segment in body.split('/') {
        match segment {
            ".." => return Err(format!("path `{path}` must not contain `..`")),
            "." | "" => {
                return Err(format!(
                    "path `{path}` is not normalised (write it without `.`, `//` or a trailing `/`)"
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

fn dispatchers(value: &Value, node: &NodeKnowledge<'_>, errors: &mut Errors) {
    let mut names = HashSet::new();
    // Every tool's limits live in one place; two would be ambiguous.
    let mut configured = HashSet::new();
    for (i, dispatcher) in array_at(value, "/spec/builtin_dispatchers") {
        let at = pointer::join_index("/spec/builtin_dispatchers", i);
        let name = dispatcher
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !names.insert(name) {
            errors.push(
                pointer::join(&at, "name"),
                format!("dispatcher `{name}` is configured more than once"),
            );
        }
        for (j, capability) in indexed(dispatcher.get("capabilities")) {
            let cap_at = format!("{at}/capabilities/{j}/name");
            let tool = capability
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if !configured.insert(tool) {
                errors.push(cap_at, format!("`{tool}` is configured more than once"));
            } else if tool == CMD_RUN && name != CMD_DISPATCHER {
                errors.push(
                    cap_at,
                    format!(
                        "`{CMD_RUN}` belongs to the `{CMD_DISPATCHER}` dispatcher, not `{name}`"
                    ),
                );
            } else if !(node.tool_exists)(tool) {
                errors.push(
                    cap_at,
                    format!("unknown tool `{tool}`: this node has no tool of that name"),
                );
            }
        }
    }
    // cmd.run without an allowlist could never run anything: refuse the manifest rather than
    // fail every call.
    let has_allowlist = AgentView(value).subcommand_allowlist().is_some();
    for (i, tool) in strings_at(value, "/spec/tools") {
        if tool == CMD_RUN && !has_allowlist {
            errors.push(
                pointer::join_index("/spec/tools", i),
                format!(
                    "`{CMD_RUN}` is offered but has no subcommand_allowlist, and this node has \
                     no default for the agent's runtime (sandbox.default_command_allowlists): \
                     add a `{CMD_DISPATCHER}` entry to spec.builtin_dispatchers with a \
                     `{CMD_RUN}` capability"
                ),
            );
        }
    }
}

fn volumes(value: &Value, node: &NodeKnowledge<'_>, errors: &mut Errors) {
    // Volumes live in the execution's sandbox, which exists only for sandbox tools.
    if array_at(value, "/spec/volumes").next().is_some()
        && !strings_at(value, "/spec/tools").any(|(_, t)| (node.runs_in_sandbox)(t))
    {
        errors.warn(
            "/spec/volumes",
            "spec.volumes has no effect: the agent offers no tool that runs in a sandbox \
             (cmd.run, fs.*, ...), so its executions get no sandbox to mount them in",
        );
    }
    let mut seen: Vec<(&str, &str, usize)> = Vec::new();
    for (i, volume) in array_at(value, "/spec/volumes") {
        let at = pointer::join_index("/spec/volumes", i);
        let name = volume
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mount = volume
            .get("mount_path")
            .or_else(|| volume.get("mount_point"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        for (old, new) in [
            ("mount_point", "mount_path"),
            ("size_limit_mb", "size_limit"),
        ] {
            if volume.get(old).is_some() {
                errors.warn(
                    pointer::join(&at, old),
                    format!("`{old}` is the older spelling of `{new}`; read as `{new}`"),
                );
            }
        }
        let mount_trimmed = mount.trim_end_matches('/');
        for (other_name, other_mount, j) in &seen {
            if *other_name == name {
                errors.push(
                    pointer::join(&at, "name"),
                    format!("volume name `{name}` is already used by volume {j}"),
                );
            }
            if paths_overlap(mount_trimmed, other_mount) {
                errors.push(
                    pointer::join(&at, "mount_path"),
                    format!("mount path `{mount}` overlaps `{other_mount}` of volume {j}"),
                );
            }
        }
        seen.push((name, mount_trimmed, i));
    }
}

fn check_json_schema(at: &str, schema: &Value, errors: &mut Errors) {
    if let Err(e) = jsonschema::meta::validate(schema) {
        let inner = e.instance_path().as_str();
        let place = if inner.is_empty() {
            String::new()
        } else {
            format!(" (at {inner})")
        };
        errors.push(at, format!("not a valid JSON Schema{place}: {e}"));
        return;
    }
    if let Err(e) = jsonschema::options().build(schema) {
        errors.push(at, format!("not a usable JSON Schema: {e}"));
    }
}

/// Validator rules beyond the schema: a json_schema validator's schema compiles, and a
/// multi_judge validator can get the answers it requires.
fn validator_rules(at: &str, validator: &Value, errors: &mut Errors) {
    match validator.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            if let Some(schema) = validator.get("schema") {
                check_json_schema(&pointer::join(at, "schema"), schema, errors);
            }
        }
        Some("multi_judge") => {
            let judges = validator
                .get("judges")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let required = validator.get("min_judges_required").and_then(Value::as_u64);
            if let Some(required) = required.filter(|r| *r > judges as u64) {
                errors.push(
                    pointer::join(at, "min_judges_required"),
                    format!(
                        "min_judges_required ({required}) exceeds the number of judges ({judges})"
                    ),
                );
            }
        }
        _ => {}
    }
}

fn output_handler(at: &str, handler: &Value, node: &NodeKnowledge<'_>, errors: &mut Errors) {
    if handler.get("type").and_then(Value::as_str) == Some("mcp_tool") {
        if let Some(tool) = handler.get("tool_name").and_then(Value::as_str) {
            if !(node.tool_exists)(tool) {
                errors.push(
                    pointer::join(at, "tool_name"),
                    format!("unknown tool `{tool}`: this node has no tool of that name"),
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Workflows

/// Template roots that are always there: the run's variables (the input, the intent, the
/// feedback of the incoming transition, ...), the loop variables of agent prompts, and the
/// Handlebars helpers (a helper used without arguments looks like a path).
const TEMPLATE_ROOTS: &[&str] = &[
    "workflow",
    "input",
    "intent",
    "state",
    "execution",
    "tenant_id",
    "instruction",
    "context",
    "iteration_number",
    "previous_error",
    "feedback",
    "output",
    "this",
    "length",
    "upper",
    "lower",
    "trim",
    "json",
    "first_line",
    "default",
    "keys",
    "lookup",
];

/// Run variables a state's `update_blackboard` may not write (they would shadow them), besides
/// state names. `workflow::RESERVED_KEYS` plus `human` (written by Human states), less
/// `iteration_number` and `previous_error`: no workflow variable of that name exists (AEGIS
/// reserves them against start-time overrides only), and AEGIS's refine loops count their
/// rounds in `iteration_number`.
const UNWRITABLE_KEYS: &[&str] = &[
    "instruction",
    "input",
    "context",
    "workflow",
    "intent",
    "state",
    "state_output",
    "execution",
    "human",
    "blackboard",
    "states",
    "tenant_id",
];

/// The blackboard key a Human state writes its answer under (`{{human.feedback}}`).
const HUMAN_KEY: &str = "human";

/// The variable a transition's `custom` expression reads the state's own output from.
const STATE_OUTPUT: &str = "state_output";

/// Condition sets that together always match, so a state with all of them never ends a run.
/// (Exit-code conditions are not among them: a step may end without an exit code.)
const EXHAUSTIVE: &[&[&str]] = &[&["always"], &["on_success", "on_failure"]];

fn workflow(
    value: &Value,
    node: &NodeKnowledge<'_>,
    deployed: Option<&Deployed>,
    errors: &mut Errors,
) {
    let empty = Map::new();
    let states = value
        .pointer("/spec/states")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let names: BTreeSet<&str> = states.keys().map(String::as_str).collect();
    let initial = value.pointer("/spec/initial_state").and_then(Value::as_str);
    if let Some(initial) = initial {
        if !names.contains(initial) {
            errors.push(
                "/spec/initial_state",
                format!("unknown state `{initial}`{}", suggestion(initial, &names)),
            );
        }
    }

    let graph = StateGraph::new(states, initial);
    let refs = References::new(value, states, &graph);
    default_schedule(value, errors);
    for (name, state) in states {
        let at = pointer::join("/spec/states", name);
        blackboard_writes(&at, state, &names, errors);
        transitions(&at, state, &names, errors);
        state_kind_rules(&at, state, node, errors);
        refs.state(&at, name, state, errors);
        subworkflow_target(&at, state, value, deployed, errors);
        agent_references(&at, state, deployed, errors);
    }
    if let Some(Value::Object(outputs)) = value.pointer("/metadata/output_template") {
        for (key, template) in outputs {
            let at = pointer::join("/metadata/output_template", key);
            refs.walk(&at, template, Scope::Final, errors);
        }
    }

    if let Some(initial) = initial.filter(|i| names.contains(i)) {
        let reachable = reachable_from(initial, states);
        for name in names.iter().filter(|n| !reachable.contains(*n)) {
            errors.push(
                pointer::join("/spec/states", name),
                format!("state `{name}` is unreachable from the initial state `{initial}`"),
            );
        }
        let can_end = reachable.iter().any(|name| {
            states
                .get(*name)
                .is_some_and(|state| !always_moves_on(state))
        });
        if !can_end {
            errors.push(
                "/spec/states",
                "no reachable state can end a run: every one always takes a transition \
                 (add a terminal state with `transitions: []`)",
            );
        } else {
            inescapable_loops(&graph, errors);
        }
    }
    for key in ["input_schema", "output_schema"] {
        let at = pointer::join("/metadata", key);
        if let Some(schema) = value.pointer(&at) {
            check_json_schema(&at, schema, errors);
        }
    }
    for (at, problem) in super::volumes::volume_problems(value) {
        errors.push(at, problem);
    }
}

/// `spec.default_schedule` must be a cron expression the scheduler can read, in a time zone it
/// knows, with a jitter shorter than the time between ticks (else runs could start out of
/// order, or two ticks' runs at once).
fn default_schedule(value: &Value, errors: &mut Errors) {
    let Some(schedule) = super::WorkflowView(value).default_schedule() else {
        return;
    };
    let object = matches!(
        value.pointer("/spec/default_schedule"),
        Some(Value::Object(_))
    );
    let at = |key: &str| {
        if object {
            pointer::join("/spec/default_schedule", key)
        } else {
            "/spec/default_schedule".to_owned()
        }
    };
    if let Err(problem) = schedule.parse() {
        errors.push(at("cron"), problem);
        return;
    }
    let plan = match schedule.plan() {
        Ok(plan) => plan,
        Err(problem) => {
            errors.push(at("timezone"), problem);
            return;
        }
    };
    if schedule.jitter_seconds == 0 {
        return;
    }
    // The ticks of the coming year (at most 1000) stand for the expression's spacing.
    let from = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH + chrono::Duration::days(20_000);
    if let Some(gap) = plan.shortest_gap(from, 1000) {
        if i64::try_from(schedule.jitter_seconds).unwrap_or(i64::MAX) >= gap.num_seconds() {
            errors.push(
                at("jitter_seconds"),
                format!(
                    "jitter_seconds ({}) must be shorter than the time between two ticks of \
                     `{}` ({} s): give at most {}",
                    schedule.jitter_seconds,
                    schedule.cron,
                    gap.num_seconds(),
                    (gap.num_seconds() - 1).max(0)
                ),
            );
        }
    }
}

/// `update_blackboard` keys may not shadow a state's output or a run variable.
fn blackboard_writes(at: &str, state: &Value, names: &BTreeSet<&str>, errors: &mut Errors) {
    let Some(Value::Object(writes)) = state.get("update_blackboard") else {
        return;
    };
    for key in writes.keys() {
        let key_at = pointer::join(&pointer::join(at, "update_blackboard"), key);
        if names.contains(key.as_str()) {
            errors.push(
                key_at,
                format!("`{key}` is a state name: writing it would replace that state's output"),
            );
        } else if UNWRITABLE_KEYS.contains(&key.as_str()) {
            errors.push(
                key_at,
                format!("`{key}` is a run variable (reserved): choose another key"),
            );
        }
    }
}

/// A loop is normal (refine until a judge is satisfied), but only with a way out: a loop from
/// which no terminal state can be reached would burn `max_state_visits` and fail every run.
fn inescapable_loops(graph: &StateGraph<'_>, errors: &mut Errors) {
    for members in graph.inescapable_loops() {
        let Some(first) = members.first() else {
            continue;
        };
        let what = if members.len() == 1 {
            format!("state `{first}` forms a loop on itself")
        } else {
            let list: Vec<String> = members.iter().map(|m| format!("`{m}`")).collect();
            format!("states {} form a loop", list.join(", "))
        };
        errors.push(
            pointer::join(&pointer::join("/spec/states", first), "transitions"),
            format!(
                "{what} that no run can leave: no transition out of it leads to a terminal \
                 state (`transitions: []`), so every run ends failed at max_state_visits; add \
                 an exit, e.g. `{{condition: score_above, threshold: 0.8, target: DONE}}`"
            ),
        );
    }
}

fn transitions(at: &str, state: &Value, names: &BTreeSet<&str>, errors: &mut Errors) {
    let kind = state
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut always_at: Option<usize> = None;
    for (i, transition) in indexed(state.get("transitions")) {
        let t_at = pointer::join_index(&pointer::join(at, "transitions"), i);
        let condition = transition
            .get("condition")
            .and_then(Value::as_str)
            .unwrap_or_default();
        // A null target (`target: ~`) ends the run when taken; only names must exist.
        if let Some(target) = transition.get("target").and_then(Value::as_str) {
            if !names.contains(target) {
                errors.push(
                    pointer::join(&t_at, "target"),
                    format!("unknown state `{target}`{}", suggestion(target, names)),
                );
            }
        }
        if let Some(first) = always_at {
            errors.push(
                t_at.clone(),
                format!(
                    "this transition is never taken: it follows the unconditional `always` of \
                     transition {first}"
                ),
            );
        }
        if let Some(problem) = condition_misfit(condition, kind) {
            errors.push(pointer::join(&t_at, "condition"), problem);
        }
        if condition == "score_between" {
            let bound = |key: &str| transition.get(key).and_then(Value::as_f64);
            if let (Some(min), Some(max)) = (bound("min"), bound("max")) {
                if min > max {
                    errors.push(
                        pointer::join(&t_at, "min"),
                        format!(
                            "`min` ({min}) is greater than `max` ({max}): the condition can \
                             never hold"
                        ),
                    );
                }
            }
        }
        if condition == "always" && always_at.is_none() {
            always_at = Some(i);
        }
    }
}

/// The state kinds whose output a condition can be evaluated on (schemas/README.md, decision
/// 11): scores come from judges (Agent, ParallelAgents), exit codes from commands (System,
/// ContainerRun), votes from ParallelAgents, responses from Human. `None`: every kind.
fn condition_kinds(condition: &str) -> Option<&'static [&'static str]> {
    match condition {
        "score_above"
        | "score_below"
        | "score_between"
        | "confidence_above"
        | "score_and_confidence_above" => Some(&["Agent", "ParallelAgents"]),
        "exit_code_zero" | "exit_code_non_zero" | "exit_code" => Some(&["System", "ContainerRun"]),
        "consensus" | "all_approved" | "any_rejected" => Some(&["ParallelAgents"]),
        "input_equals" | "input_equals_yes" | "input_equals_no" => Some(&["Human"]),
        _ => None,
    }
}

/// Conditions that can never hold in a state of this kind, because its output never has what
/// they test.
fn condition_misfit(condition: &str, kind: &str) -> Option<String> {
    let kinds = condition_kinds(condition)?;
    if kinds.contains(&kind) {
        return None;
    }
    let article = if kind.starts_with(['A', 'E', 'I', 'O', 'U']) {
        "an"
    } else {
        "a"
    };
    let allowed = match kinds {
        [one] => format!("a {one} state"),
        [a, b] => format!("{a} and {b} states"),
        _ => kinds.join(", "),
    };
    Some(format!(
        "`{condition}` is only meaningful on {allowed} (this is {article} {kind} state, whose \
         output it can never match); use on_success, on_failure, always or custom here"
    ))
}

/// Rules that depend on the state kind and that the schema cannot express.
fn state_kind_rules(at: &str, state: &Value, node: &NodeKnowledge<'_>, errors: &mut Errors) {
    if let Some(handler) = state.get("output_handler") {
        output_handler(&pointer::join(at, "output_handler"), handler, node, errors);
    }
    match state.get("kind").and_then(Value::as_str) {
        Some("ParallelContainerRun") => {
            let mut names = HashSet::new();
            for (i, step) in indexed(state.get("steps")) {
                let step_at = pointer::join_index(&pointer::join(at, "steps"), i);
                if let Some(name) = step.get("name").and_then(Value::as_str) {
                    if !names.insert(name) {
                        errors.push(
                            pointer::join(&step_at, "name"),
                            format!("step name `{name}` is used more than once in this state"),
                        );
                    }
                }
            }
        }
        Some("Agent") => {
            if let Some(validator) = state.get("pre_execution_validator") {
                validator_rules(
                    &pointer::join(at, "pre_execution_validator"),
                    validator,
                    errors,
                );
            }
        }
        Some("ParallelAgents") => {
            let agents = state
                .get("agents")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let consensus = state.get("consensus");
            let field = |key: &str| consensus.and_then(|c| c.get(key)).and_then(Value::as_u64);
            let c_at = pointer::join(at, "consensus");
            if let Some(n) = field("n").filter(|n| *n > agents as u64) {
                errors.push(
                    pointer::join(&c_at, "n"),
                    format!("best_of_n keeps {n} results but only {agents} agents run"),
                );
            }
            if let Some(m) = field("min_judges_required").filter(|m| *m > agents as u64) {
                errors.push(
                    pointer::join(&c_at, "min_judges_required"),
                    format!("min_judges_required ({m}) exceeds the number of agents ({agents})"),
                );
            }
        }
        _ => {}
    }
}

/// Where a template is rendered, which decides what it may read.
#[derive(Debug, Clone, Copy)]
enum Scope<'a> {
    /// Before the state runs (its input, command, prompt, ...): only states that can have run
    /// before it, and the state itself only on a revisit.
    Before(&'a str),
    /// After the state ran (its judges and output handler): also the state itself.
    After(&'a str),
    /// In one of the state's transitions (`feedback`, a `custom` expression): also the state
    /// itself and `state_output`.
    Transition(&'a str),
    /// `metadata.output_template`, over the final blackboard: any state.
    Final,
}

/// What templates may name: states (in the order a run can reach them), `spec.context` keys,
/// Subworkflow `result_key`s (once their state can have run) and the workspace volume key.
struct References<'a> {
    states: BTreeSet<&'a str>,
    /// `spec.context` keys and the workspace volume key: on the blackboard from the start.
    keys: BTreeSet<&'a str>,
    /// `result_key` -> the Subworkflow states that write it.
    results: BTreeMap<&'a str, Vec<&'a str>>,
    graph: &'a StateGraph<'a>,
}

impl<'a> References<'a> {
    fn new(value: &'a Value, states: &'a Map<String, Value>, graph: &'a StateGraph<'a>) -> Self {
        let mut keys: BTreeSet<&str> = BTreeSet::new();
        if let Some(Value::Object(context)) = value.pointer("/spec/context") {
            keys.extend(context.keys().map(String::as_str));
        }
        keys.insert(
            value
                .pointer("/spec/storage/workspace/blackboard_key")
                .and_then(Value::as_str)
                .unwrap_or("workspace_volume_id"),
        );
        let mut results: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, state) in states {
            if let Some(key) = state.get("result_key").and_then(Value::as_str) {
                results.entry(key).or_default().push(name.as_str());
            }
            // Keys written at run time exist once a writer can have run.
            if let Some(Value::Object(writes)) = state.get("update_blackboard") {
                for key in writes.keys() {
                    results.entry(key.as_str()).or_default().push(name.as_str());
                }
            }
            if state.get("kind").and_then(Value::as_str) == Some("Human") {
                results.entry(HUMAN_KEY).or_default().push(name.as_str());
            }
        }
        References {
            states: states.keys().map(String::as_str).collect(),
            keys,
            results,
            graph,
        }
    }

    /// Checks the templates of one state, each in the scope it is rendered in.
    fn state(&self, at: &str, name: &'a str, state: &Value, errors: &mut Errors) {
        let Value::Object(fields) = state else {
            return;
        };
        for (key, field) in fields {
            let scope = match key.as_str() {
                "transitions" => Scope::Transition(name),
                "judges" | "judges_for_parallel" | "output_handler" => Scope::After(name),
                // Rendered after the state ran, with its output and `state_output`.
                "update_blackboard" => Scope::Transition(name),
                _ => Scope::Before(name),
            };
            self.walk(&pointer::join(at, key), field, scope, errors);
        }
        // A `custom` expression is the inside of `{{#if ...}}`, written without braces.
        for (i, transition) in indexed(state.get("transitions")) {
            let expression = transition.get("expression").and_then(Value::as_str);
            if let Some(expression) = expression.filter(|e| !e.contains("{{")) {
                let t_at = pointer::join_index(&pointer::join(at, "transitions"), i);
                let text = format!("{{{{{expression}}}}}");
                self.check_text(
                    &pointer::join(&t_at, "expression"),
                    &text,
                    Scope::Transition(name),
                    errors,
                );
            }
        }
    }

    /// Checks every template string under `value`.
    fn walk(&self, at: &str, value: &Value, scope: Scope<'a>, errors: &mut Errors) {
        match value {
            Value::String(text) if text.contains("{{") => self.check_text(at, text, scope, errors),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.walk(&pointer::join_index(at, i), item, scope, errors);
                }
            }
            Value::Object(map) => {
                for (key, item) in map {
                    self.walk(&pointer::join(at, key), item, scope, errors);
                }
            }
            _ => {}
        }
    }

    fn check_text(&self, at: &str, text: &str, scope: Scope<'a>, errors: &mut Errors) {
        for reference in path_refs(text) {
            if reference.scoped {
                continue;
            }
            if let Some(key) = self.unwritten_blackboard_key(&reference.segments) {
                if errors.0.run_supplied.insert(key.to_owned()) {
                    errors.warn(
                        at,
                        format!(
                            "template `{}` reads blackboard key `{key}`, which nothing in this \
                             workflow writes{}: a run must be given it as a blackboard override \
                             when it starts (a run without it is refused); a run's input is read \
                             as `{{{{input.{key}}}}}`",
                            reference.expression,
                            suggestion(key, &self.states)
                        ),
                    );
                }
                continue;
            }
            if let Some(problem) = self.problem(&reference.segments, scope) {
                errors.push(at, format!("template `{}` {problem}", reference.expression));
            }
        }
    }

    /// The key of a `blackboard.KEY` path that no state, `spec.context` key, `result_key` or
    /// `update_blackboard` writes (AEGIS pipelines read keys their caller puts on the blackboard).
    fn unwritten_blackboard_key<'s>(&self, segments: &'s [String]) -> Option<&'s str> {
        let (Some("blackboard"), Some(name)) = (
            segments.first().map(String::as_str),
            segments.get(1).map(String::as_str),
        ) else {
            return None;
        };
        let written = name == STATE_OUTPUT
            || name == HUMAN_KEY
            || self.states.contains(name)
            || self.results.contains_key(name)
            || self.keys.contains(name);
        (!written).then_some(name)
    }

    /// What is wrong with one path, in `scope`.
    ///
    /// `states.X` must name a state and `blackboard.X` a state or another blackboard key. A
    /// dotted path whose root is no known variable is read as `STATE.field`. A bare unknown word
    /// is let through: it may be a blackboard key given when the run starts.
    fn problem(&self, segments: &[String], scope: Scope<'a>) -> Option<String> {
        let root = segments.first()?.as_str();
        if root.starts_with(['@', '.']) {
            return None;
        }
        let (name, explicit) = match root {
            "states" | "blackboard" => (segments.get(1)?.as_str(), true),
            _ => (root, false),
        };
        if name == STATE_OUTPUT && !explicit {
            return match scope {
                Scope::Transition(_) => None,
                _ => Some(format!(
                    "reads `{STATE_OUTPUT}`, which exists only in a transition's `custom` \
                     expression (elsewhere read a state's output by its name, `STATE.output`)"
                )),
            };
        }
        if !explicit && TEMPLATE_ROOTS.contains(&name) {
            return None;
        }
        if self.states.contains(name) {
            return self.order(name, &[name], scope);
        }
        if root != "states" {
            if let Some(writers) = self.results.get(name) {
                return self.order(name, writers, scope);
            }
            if self.keys.contains(name) {
                return None;
            }
        }
        if name == HUMAN_KEY && !self.states.contains(name) {
            return Some(
                "reads `human` (the last Human state's answer, `human.feedback`), but this \
                 workflow has no Human state"
                    .to_owned(),
            );
        }
        if !explicit && segments.len() == 1 {
            return None;
        }
        let mut known = self.states.clone();
        if root != "states" {
            known.extend(self.keys.iter().copied());
            known.extend(self.results.keys().copied());
        }
        Some(format!(
            "names unknown state `{name}`{}",
            suggestion(name, &known)
        ))
    }

    /// Whether the blackboard entry `name`, written by one of `writers`, can exist when a
    /// template in `scope` is rendered.
    fn order(&self, name: &str, writers: &[&str], scope: Scope<'a>) -> Option<String> {
        let (current, itself_ok) = match scope {
            Scope::Final => return None,
            Scope::Before(s) => (s, false),
            Scope::After(s) | Scope::Transition(s) => (s, true),
        };
        // Unreachable states are reported as such; an order among them means nothing.
        if !self.graph.is_reachable(current) {
            return None;
        }
        let fine = writers.iter().any(|writer| {
            (itself_ok && *writer == current)
                || !self.graph.is_reachable(writer)
                || self.graph.can_run_before(writer, current)
        });
        if fine {
            return None;
        }
        let source = if writers == [name] {
            format!("state `{name}`")
        } else {
            let list: Vec<String> = writers.iter().map(|w| format!("`{w}`")).collect();
            format!("`{name}` (the result of {})", list.join(", "))
        };
        Some(if writers.contains(&current) {
            format!(
                "reads {source} before it has run: `{current}` is never revisited (no \
                 transition path leads back to it), so its output does not exist yet"
            )
        } else {
            format!(
                "reads {source}, which can never have run before state `{current}` (no \
                 transition path leads from it to `{current}`)"
            )
        })
    }
}

/// A Subworkflow's `workflow_id` must name a deployed workflow (when the registry is known),
/// and a blocking call may not lead back to this workflow: that run would wait for itself.
fn subworkflow_target(
    at: &str,
    state: &Value,
    value: &Value,
    deployed: Option<&Deployed>,
    errors: &mut Errors,
) {
    if state.get("kind").and_then(Value::as_str) != Some("Subworkflow") {
        return;
    }
    let Some(target) = state.get("workflow_id").and_then(Value::as_str) else {
        return;
    };
    if target.contains("{{") {
        return;
    }
    let own = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let blocking = state.get("mode").and_then(Value::as_str) == Some("blocking");
    let target_at = pointer::join(at, "workflow_id");
    let resolved = deployed.and_then(|d| d.workflow_name(target));
    if blocking && (target == own || resolved == Some(own)) {
        errors.push(
            target_at,
            format!(
                "a blocking Subworkflow may not call its own workflow `{own}`: every run would \
                 start another and wait for it, without end (use a loop transition, or mode \
                 fire_and_forget)"
            ),
        );
        return;
    }
    let Some(deployed) = deployed else {
        return;
    };
    match resolved {
        None if target != own => errors.push(
            target_at,
            format!(
                "workflow `{target}` is not deployed{}: deploy it before this workflow",
                suggestion(target, &deployed.workflow_names())
            ),
        ),
        Some(name) if blocking => {
            if let Some(path) = deployed.blocking_path(name, own) {
                let mut chain = vec![format!("`{own}`")];
                chain.extend(path.iter().map(|p| format!("`{p}`")));
                errors.push(
                    target_at,
                    format!(
                        "blocking Subworkflow calls would go round without end: {}",
                        chain.join(" waits for ")
                    ),
                );
            }
        }
        _ => {}
    }
}

/// Agents named by a state that are not deployed: a warning, since the agent may be deployed
/// before the first run reaches the state (the engine refuses the run then, if it is not).
fn agent_references<'v>(
    at: &str,
    state: &'v Value,
    deployed: Option<&Deployed>,
    errors: &mut Errors,
) {
    let Some(deployed) = deployed else {
        return;
    };
    let mut named: Vec<(String, &'v str)> = Vec::new();
    let mut add = |pointer: String, value: Option<&'v Value>| {
        if let Some(name) = value.and_then(Value::as_str) {
            named.push((pointer, name));
        }
    };
    add(pointer::join(at, "agent"), state.get("agent"));
    for (i, entry) in indexed(state.get("agents")) {
        let e_at = pointer::join_index(&pointer::join(at, "agents"), i);
        add(pointer::join(&e_at, "agent"), entry.get("agent"));
    }
    for list in ["judges", "judges_for_parallel"] {
        for (i, entry) in indexed(state.get(list)) {
            let e_at = pointer::join_index(&pointer::join(at, list), i);
            add(pointer::join(&e_at, "agent_id"), entry.get("agent_id"));
        }
    }
    if let Some(handler) = state.get("output_handler") {
        if handler.get("type").and_then(Value::as_str) == Some("agent") {
            let h_at = pointer::join(at, "output_handler");
            add(pointer::join(&h_at, "agent_id"), handler.get("agent_id"));
        }
    }
    let known = deployed.agent_names();
    for (pointer, name) in named {
        if !name.contains("{{") && !deployed.has_agent(name) {
            errors.warn(
                pointer,
                format!(
                    "agent `{name}` is not deployed{}: a run fails when it reaches this state \
                     unless the agent is deployed by then",
                    suggestion(name, &known)
                ),
            );
        }
    }
}

fn reachable_from<'a>(initial: &'a str, states: &'a Map<String, Value>) -> BTreeSet<&'a str> {
    let mut seen = BTreeSet::from([initial]);
    let mut queue = VecDeque::from([initial]);
    while let Some(name) = queue.pop_front() {
        let Some(state) = states.get(name) else {
            continue;
        };
        for (_, transition) in indexed(state.get("transitions")) {
            if let Some(target) = transition.get("target").and_then(Value::as_str) {
                if states.contains_key(target) && seen.insert(target) {
                    queue.push_back(target);
                }
            }
        }
    }
    seen
}

/// True when some transition of the state always matches, so a run never ends in it. A
/// transition with a null target ends the run, so it is no way on.
fn always_moves_on(state: &Value) -> bool {
    let conditions: Vec<&str> = indexed(state.get("transitions"))
        .filter(|(_, t)| !t.get("target").is_some_and(Value::is_null))
        .filter_map(|(_, t)| t.get("condition").and_then(Value::as_str))
        .collect();
    EXHAUSTIVE
        .iter()
        .any(|set| set.iter().all(|c| conditions.contains(c)))
}

/// " (did you mean `x`?)" when one known name is close to `name`.
fn suggestion(name: &str, known: &BTreeSet<&str>) -> String {
    known
        .iter()
        .map(|k| (distance(&name.to_lowercase(), &k.to_lowercase()), *k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| format!(" (did you mean `{k}`?)"))
        .unwrap_or_default()
}

/// Levenshtein distance, counting an adjacent swap as one edit.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

// ---------------------------------------------------------------------------------------------
// Small readers

fn indexed(value: Option<&Value>) -> impl Iterator<Item = (usize, &Value)> {
    value
        .and_then(Value::as_array)
        .map(|items| items.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
}

fn array_at<'v>(value: &'v Value, at: &str) -> impl Iterator<Item = (usize, &'v Value)> {
    indexed(value.pointer(at))
}

fn strings_at<'v>(value: &'v Value, at: &str) -> impl Iterator<Item = (usize, &'v str)> {
    array_at(value, at).filter_map(|(i, v)| Some((i, v.as_str()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(check_name("hello-world2").is_ok());
        assert!(check_name("2fast").is_ok());
        assert!(check_name("-fast").is_err());
        assert!(check_name("Hello").is_err());
        assert!(check_name("trailing-").is_err());
        assert!(check_name(&"a".repeat(64)).is_err());
    }

    #[test]
    fn paths() {
        assert!(check_path("/workspace").is_ok());
        assert!(check_path("/").is_ok());
        assert!(check_path("data/in").is_ok());
        assert!(check_path("/workspace/../etc").is_err());
        assert!(check_path("/workspace//x").is_err());
        assert!(check_path("/workspace/").is_err());
        assert!(check_path("./x").is_err());
        assert!(paths_overlap("/workspace", "/workspace/out"));
        assert!(!paths_overlap("/workspace/a", "/workspace/ab"));
    }

    #[test]
    fn suggestions() {
        let known = BTreeSet::from(["review", "WRITE_CODE"]);
        assert_eq!(suggestion("reveiw", &known), " (did you mean `review`?)");
        assert_eq!(
            suggestion("write_code", &known),
            " (did you mean `WRITE_CODE`?)"
        );
        assert_eq!(suggestion("deploy", &known), "");
    }
}
