//! Workflow manifests for tests: the header every workflow manifest repeats (apiVersion, kind,
//! name, version 1.0.0, initial state) written once; the states stay each test's own YAML,
//! since they are what the test is about. A workflow with more under `metadata` or `spec` than
//! that is written out whole where it is used.

/// A workflow manifest named `name`, version 1.0.0, that starts in `initial_state`; `states` is
/// the YAML under `spec.states` (each line indented by four spaces, as written in the manifest).
pub fn workflow_manifest(name: &str, initial_state: &str, states: &str) -> String {
    format!(
        "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: {name}
  version: \"1.0.0\"
spec:
  initial_state: {initial_state}
  states:
{states}"
    )
}

/// A System state `name` that runs `command` and ends the run, as YAML under `spec.states`: the
/// last state most test workflows share.
pub fn end_state(name: &str, command: &str) -> String {
    format!(
        "    {name}:\n      kind: System\n      command: \"{command}\"\n      transitions: []\n"
    )
}
