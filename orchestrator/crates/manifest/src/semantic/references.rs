//! The template references of a workflow: each `{{...}}` path must name something that exists
//! where it is read (a state's output written before it, the blackboard, the input, a Human
//! answer), with the roots and keys that may be read or written.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::{indexed, suggestion, Errors};
use crate::graph::StateGraph;
use crate::pointer;
use crate::template::path_refs;

/// Template roots that are always there: the run's variables (the input, the intent, the
/// feedback of the incoming transition, ...), the loop variables of agent prompts, and the
/// Handlebars helpers (a helper used without arguments looks like a path).
pub(super) const TEMPLATE_ROOTS: &[&str] = &[
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

/// The variables a workflow run gives its templates (`human` is what Human states write):
/// neither a start-time blackboard override (the engine's start) nor an `update_blackboard`
/// write (`is_unwritable`) may shadow one, so both lists begin here.
pub const RUN_VARIABLES: [&str; 9] = [
    "instruction",
    "input",
    "context",
    "workflow",
    "intent",
    "state",
    "state_output",
    "execution",
    "human",
];

/// Whether a state's `update_blackboard` may not write `key` (it would shadow a run variable),
/// besides state names: [`RUN_VARIABLES`] and the run's own fields (`blackboard`, `states`,
/// `tenant_id`). Not AEGIS's `iteration_number` and `previous_error`, which it reserves
/// against start-time overrides only: its refine loops count their rounds in
/// `iteration_number`.
pub(super) fn is_unwritable(key: &str) -> bool {
    RUN_VARIABLES.contains(&key) || ["blackboard", "states", "tenant_id"].contains(&key)
}

/// The blackboard key a Human state writes its answer under (`{{human.feedback}}`).
pub(super) const HUMAN_KEY: &str = "human";

/// The variable a transition's `custom` expression reads the state's own output from.
pub(super) const STATE_OUTPUT: &str = "state_output";

/// Where a template is rendered, which decides what it may read.
#[derive(Debug, Clone, Copy)]
pub(super) enum Scope<'a> {
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
pub(super) struct References<'a> {
    pub(super) states: BTreeSet<&'a str>,
    /// `spec.context` keys and the workspace volume key: on the blackboard from the start.
    pub(super) keys: BTreeSet<&'a str>,
    /// `result_key` -> the Subworkflow states that write it.
    pub(super) results: BTreeMap<&'a str, Vec<&'a str>>,
    pub(super) graph: &'a StateGraph<'a>,
}

impl<'a> References<'a> {
    pub(super) fn new(
        value: &'a Value,
        states: &'a Map<String, Value>,
        graph: &'a StateGraph<'a>,
    ) -> Self {
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
    pub(super) fn state(&self, at: &str, name: &'a str, state: &Value, errors: &mut Errors) {
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
    pub(super) fn walk(&self, at: &str, value: &Value, scope: Scope<'a>, errors: &mut Errors) {
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

    pub(super) fn check_text(&self, at: &str, text: &str, scope: Scope<'a>, errors: &mut Errors) {
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
    pub(super) fn unwritten_blackboard_key<'s>(&self, segments: &'s [String]) -> Option<&'s str> {
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
    pub(super) fn problem(&self, segments: &[String], scope: Scope<'a>) -> Option<String> {
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
    pub(super) fn order(&self, name: &str, writers: &[&str], scope: Scope<'a>) -> Option<String> {
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
