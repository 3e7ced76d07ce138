//! Typed reads of a workflow manifest, for the workflow engine.
//!
//! Like [`super::AgentView`], a thin view over the validated JSON value rather than a struct
//! tree: the engine needs the state graph and a few limits; state bodies stay JSON because they
//! are rendered as templates anyway.

use serde_json::Value;

/// One outgoing transition of a state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransitionView<'a> {
    /// The condition tag (`on_success`, `score_above`, ...).
    pub condition: &'a str,
    /// The target state.
    pub target: &'a str,
    /// The whole transition object (condition parameters, feedback template).
    pub raw: &'a Value,
}

/// `spec.default_schedule`, in either of its two forms.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// The cron expression (5 fields, or 6 with seconds first; UTC).
    pub cron: String,
    /// Input of every scheduled run.
    pub input: Value,
    /// False: written down, but no runs start.
    pub enabled: bool,
}

impl Schedule {
    /// The parsed expression, or why it is not one.
    pub fn parse(&self) -> Result<croner::Cron, String> {
        parse_cron(&self.cron)
    }
}

/// Parses a cron expression the way schedules are read: seconds field optional, UTC.
pub fn parse_cron(expression: &str) -> Result<croner::Cron, String> {
    croner::Cron::new(expression)
        .with_seconds_optional()
        .parse()
        .map_err(|e| format!("`{expression}` is not a cron expression: {e}"))
}

/// A read-only view of a validated workflow manifest.
#[derive(Debug, Clone, Copy)]
pub struct WorkflowView<'a>(pub &'a Value);

impl<'a> WorkflowView<'a> {
    /// `metadata.name`.
    pub fn name(&self) -> &'a str {
        self.0
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// `spec.initial_state`.
    pub fn initial_state(&self) -> &'a str {
        self.0
            .pointer("/spec/initial_state")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// The names of all states.
    pub fn state_names(&self) -> Vec<&'a str> {
        self.0
            .pointer("/spec/states")
            .and_then(Value::as_object)
            .map(|states| states.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// One state's object.
    pub fn state(&self, name: &str) -> Option<&'a Value> {
        self.0.pointer("/spec/states")?.get(name)
    }

    /// `spec.default_schedule`, if any.
    pub fn default_schedule(&self) -> Option<Schedule> {
        match self.0.pointer("/spec/default_schedule")? {
            Value::String(cron) => Some(Schedule {
                cron: cron.clone(),
                input: Value::Object(Default::default()),
                enabled: true,
            }),
            Value::Object(o) => Some(Schedule {
                cron: o.get("cron")?.as_str()?.to_owned(),
                input: o
                    .get("input")
                    .cloned()
                    .unwrap_or_else(|| Value::Object(Default::default())),
                enabled: o.get("enabled").and_then(Value::as_bool).unwrap_or(true),
            }),
            _ => None,
        }
    }

    /// One state's `update_blackboard`: key -> template, in key order.
    pub fn blackboard_updates(&self, name: &str) -> Vec<(&'a str, &'a str)> {
        self.state(name)
            .and_then(|s| s.get("update_blackboard"))
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// One state's `kind` (`Agent`, `System`, ...).
    pub fn state_kind(&self, name: &str) -> Option<&'a str> {
        self.state(name)?.get("kind")?.as_str()
    }

    /// One state's transitions, in evaluation order; empty for a terminal state.
    pub fn transitions(&self, name: &str) -> Vec<TransitionView<'a>> {
        self.state(name)
            .and_then(|s| s.get("transitions"))
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(|raw| {
                        Some(TransitionView {
                            condition: raw.get("condition")?.as_str()?,
                            target: raw.get("target")?.as_str()?,
                            raw,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `spec.max_total_transitions` (default 50).
    pub fn max_total_transitions(&self) -> u64 {
        self.0
            .pointer("/spec/max_total_transitions")
            .and_then(Value::as_u64)
            .unwrap_or(50)
    }

    /// `metadata.input_schema`.
    pub fn input_schema(&self) -> Option<&'a Value> {
        self.0.pointer("/metadata/input_schema")
    }

    /// `metadata.output_schema`: the contract of the final output, checked when a run ends.
    pub fn output_schema(&self) -> Option<&'a Value> {
        self.0.pointer("/metadata/output_schema")
    }

    /// One state's `max_state_visits` (default 5).
    pub fn max_state_visits(&self, name: &str) -> u64 {
        self.state(name)
            .and_then(|s| s.get("max_state_visits"))
            .and_then(Value::as_u64)
            .unwrap_or(5)
    }

    /// `(state, workflow_id)` of every Subworkflow state in `blocking` mode: the child
    /// workflows a run of this one waits for (deploy-time validation follows these to refuse
    /// recursion that never ends).
    pub fn blocking_subworkflows(&self) -> Vec<(&'a str, &'a str)> {
        self.0
            .pointer("/spec/states")
            .and_then(Value::as_object)
            .map(|states| {
                states
                    .iter()
                    .filter(|(_, s)| {
                        s.get("kind").and_then(Value::as_str) == Some("Subworkflow")
                            && s.get("mode").and_then(Value::as_str) == Some("blocking")
                    })
                    .filter_map(|(name, s)| Some((name.as_str(), s.get("workflow_id")?.as_str()?)))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_state_graph() {
        let value = json!({"spec": {"initial_state": "a", "states": {
            "a": {"kind": "System", "command": "true",
                  "transitions": [{"condition": "on_success", "target": "b"}]},
            "b": {"kind": "System", "command": "true", "transitions": []}}}});
        let wf = WorkflowView(&value);
        assert_eq!(wf.initial_state(), "a");
        assert_eq!(wf.state_names(), ["a", "b"]);
        assert_eq!(wf.state_kind("a"), Some("System"));
        let t = wf.transitions("a");
        assert_eq!((t[0].condition, t[0].target), ("on_success", "b"));
        assert!(wf.transitions("b").is_empty());
        assert_eq!(wf.max_total_transitions(), 50);
        assert_eq!(wf.max_state_visits("a"), 5);
        assert!(wf.blocking_subworkflows().is_empty());
    }
}
