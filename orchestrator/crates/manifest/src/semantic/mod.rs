//! The semantic stage: what a JSON Schema cannot say.
//!
//! Runs only on documents that passed the schema, so it may rely on the shape (and falls back
//! quietly where it cannot). It checks cross-references inside the manifest (initial state,
//! transition targets, reachability, template references, volume names) and references to the
//! node (tools in the catalog, runtimes in the registry), which the schema cannot know.

mod agent_rules;
mod references;
mod workflow_rules;

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use agent_rules::agent;
pub use references::RUN_VARIABLES;
use references::{References, Scope};
use workflow_rules::workflow;

use super::deployed::Deployed;
use super::error::{ManifestError, Stage};
use super::graph::StateGraph;
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
    use super::agent_rules::check_path;
    use super::*;
    use crate::volumes::paths_overlap;

    /// Asserts that `check` accepts each of `good` and refuses each of `bad`.
    fn sorts<E>(check: impl Fn(&str) -> Result<(), E>, good: &[&str], bad: &[&str]) {
        for name in good {
            assert!(check(name).is_ok(), "{name} is accepted");
        }
        for name in bad {
            assert!(check(name).is_err(), "{name} is refused");
        }
    }

    #[test]
    fn names() {
        let too_long = "a".repeat(64);
        sorts(
            check_name,
            &["hello-world2", "2fast"],
            &["-fast", "Hello", "trailing-", &too_long],
        );
    }

    #[test]
    fn paths() {
        sorts(
            check_path,
            &["/workspace", "/", "data/in"],
            &["/workspace/../etc", "/workspace//x", "/workspace/", "./x"],
        );
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
