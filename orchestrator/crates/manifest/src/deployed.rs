//! What validation may know about the registry: the agents and workflows already deployed.
//!
//! A manifest names other definitions (a workflow's Agent states name agents, its Subworkflow
//! states name workflows). Whether those exist is not a property of the text, so the semantic
//! stage only checks it when the caller hands it a [`Deployed`] snapshot of the registry (the
//! deploy and validate tools do; the offline example tests do not). Keeping it a plain value,
//! filled by the caller, leaves the manifest module free of the database.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde_json::Value;

use super::workflow::WorkflowView;

/// A snapshot of the deployed definitions of one tenant, as validation needs them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Deployed {
    /// Agent names and ids.
    agents: HashSet<String>,
    /// Workflow names and ids, each mapped to the workflow's name.
    workflows: HashMap<String, String>,
    /// Workflow name -> the `workflow_id`s its blocking Subworkflow states wait for.
    blocking: HashMap<String, Vec<String>>,
}

impl Deployed {
    /// An empty registry (nothing deployed yet).
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a deployed agent, known by its id and its name.
    pub fn add_agent(&mut self, id: &str, name: &str) {
        self.agents.insert(id.to_owned());
        self.agents.insert(name.to_owned());
    }

    /// Records a deployed workflow (its latest manifest), known by its id and its name.
    pub fn add_workflow(&mut self, id: &str, name: &str, manifest: &Value) {
        self.workflows.insert(id.to_owned(), name.to_owned());
        self.workflows.insert(name.to_owned(), name.to_owned());
        let targets = WorkflowView(manifest)
            .blocking_subworkflows()
            .into_iter()
            .map(|(_, target)| target.to_owned())
            .collect();
        self.blocking.insert(name.to_owned(), targets);
    }

    /// Whether an agent of this name or id is deployed.
    pub fn has_agent(&self, name_or_id: &str) -> bool {
        self.agents.contains(name_or_id)
    }

    /// The name of the deployed workflow with this name or id.
    pub fn workflow_name(&self, name_or_id: &str) -> Option<&str> {
        self.workflows.get(name_or_id).map(String::as_str)
    }

    /// Names of the deployed workflows (for "did you mean" suggestions).
    pub fn workflow_names(&self) -> BTreeSet<&str> {
        self.blocking.keys().map(String::as_str).collect()
    }

    /// Names of the deployed agents and their ids (for suggestions).
    pub fn agent_names(&self) -> BTreeSet<&str> {
        self.agents.iter().map(String::as_str).collect()
    }

    /// A chain of blocking calls from the deployed workflow `from` back to `to`, if any:
    /// `[from, ..., to]`. `to` is the workflow being validated, so a chain means that deploying
    /// it would close a recursion that never ends.
    pub fn blocking_path(&self, from: &str, to: &str) -> Option<Vec<String>> {
        let mut seen = HashSet::new();
        let mut stack = vec![vec![from.to_owned()]];
        while let Some(path) = stack.pop() {
            let Some(last) = path.last() else { continue };
            if last == to {
                return Some(path);
            }
            if !seen.insert(last.clone()) {
                continue;
            }
            for target in self.blocking.get(last).into_iter().flatten() {
                let Some(name) = self.workflow_name(target).or_else(|| {
                    // A workflow that names `to` before `to` is deployed.
                    (target == to).then_some(to)
                }) else {
                    continue;
                };
                let mut next = path.clone();
                next.push(name.to_owned());
                stack.push(next);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn calls(target: &str) -> Value {
        json!({"spec": {"initial_state": "s", "states": {
            "s": {"kind": "Subworkflow", "workflow_id": target, "mode": "blocking",
                  "result_key": "r", "transitions": []}}}})
    }

    #[test]
    fn finds_blocking_chains_by_name_and_id() {
        let mut deployed = Deployed::new();
        deployed.add_agent("a1", "coder");
        deployed.add_workflow("w1", "outer", &calls("w2"));
        deployed.add_workflow("w2", "inner", &calls("new-one"));
        assert!(deployed.has_agent("coder") && deployed.has_agent("a1"));
        assert_eq!(deployed.workflow_name("w2"), Some("inner"));
        assert_eq!(
            deployed.blocking_path("outer", "new-one"),
            Some(vec!["outer".into(), "inner".into(), "new-one".into()])
        );
        assert_eq!(deployed.blocking_path("inner", "outer"), None);
    }
}
