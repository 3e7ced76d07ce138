//! The semantic rules of a workflow manifest: its states and their kinds, transitions and their
//! conditions, loops it cannot leave, schedule, sub-workflows and the agents it names.

use std::collections::{BTreeSet, HashSet, VecDeque};

use serde_json::{Map, Value};

use super::agent_rules::{check_json_schema, output_handler, validator_rules};
use super::references::{is_unwritable, References, Scope};
use super::{indexed, suggestion, Errors};
use crate::deployed::Deployed;
use crate::graph::StateGraph;
use crate::{pointer, NodeKnowledge};

/// Condition sets that together always match, so a state with all of them never ends a run.
/// (Exit-code conditions are not among them: a step may end without an exit code.)
pub(super) const EXHAUSTIVE: &[&[&str]] = &[&["always"], &["on_success", "on_failure"]];

pub(super) fn workflow(
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
    for (at, problem) in crate::volumes::volume_problems(value) {
        errors.push(at, problem);
    }
}

/// `spec.default_schedule` must be a cron expression the scheduler can read, in a time zone it
/// knows, with a jitter shorter than the time between ticks (else runs could start out of
/// order, or two ticks' runs at once).
pub(super) fn default_schedule(value: &Value, errors: &mut Errors) {
    let Some(schedule) = crate::WorkflowView(value).default_schedule() else {
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
pub(super) fn blackboard_writes(
    at: &str,
    state: &Value,
    names: &BTreeSet<&str>,
    errors: &mut Errors,
) {
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
        } else if is_unwritable(key) {
            errors.push(
                key_at,
                format!("`{key}` is a run variable (reserved): choose another key"),
            );
        }
    }
}

/// A loop is normal (refine until a judge is satisfied), but only with a way out: a loop from
/// which no terminal state can be reached would burn `max_state_visits` and fail every run.
pub(super) fn inescapable_loops(graph: &StateGraph<'_>, errors: &mut Errors) {
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

pub(super) fn transitions(at: &str, state: &Value, names: &BTreeSet<&str>, errors: &mut Errors) {
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
pub(super) fn condition_kinds(condition: &str) -> Option<&'static [&'static str]> {
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
pub(super) fn condition_misfit(condition: &str, kind: &str) -> Option<String> {
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
pub(super) fn state_kind_rules(
    at: &str,
    state: &Value,
    node: &NodeKnowledge<'_>,
    errors: &mut Errors,
) {
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

/// A Subworkflow's `workflow_id` must name a deployed workflow (when the registry is known),
/// and a blocking call may not lead back to this workflow: that run would wait for itself.
pub(super) fn subworkflow_target(
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
pub(super) fn agent_references<'v>(
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

pub(super) fn reachable_from<'a>(
    initial: &'a str,
    states: &'a Map<String, Value>,
) -> BTreeSet<&'a str> {
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
pub(super) fn always_moves_on(state: &Value) -> bool {
    let conditions: Vec<&str> = indexed(state.get("transitions"))
        .filter(|(_, t)| !t.get("target").is_some_and(Value::is_null))
        .filter_map(|(_, t)| t.get("condition").and_then(Value::as_str))
        .collect();
    EXHAUSTIVE
        .iter()
        .any(|set| set.iter().all(|c| conditions.contains(c)))
}
