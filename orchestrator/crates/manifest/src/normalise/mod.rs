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

mod agent_forms;
mod workflow_forms;

use serde_json::{Map, Value};

use super::error::{ManifestError, Stage};
use super::{ManifestKind, NodeKnowledge};
use agent_forms::{
    default_command_allowlist, mcp_builtin_names, memory_off, misplaced_security, runtime_alias,
    validation_mapping,
};
use workflow_forms::{
    container_step_names, shared_workspace, state_volume_mounts, storage_size_limits,
    system_blackboard_updates, workflow_volume_list,
};

/// The mapping at `pointer` of a manifest, for a rewrite in place; `None` when it is missing or
/// not a mapping (then there is nothing to rewrite: the schema judges its shape).
fn mapping_at<'v>(value: &'v mut Value, pointer: &str) -> Option<&'v mut Map<String, Value>> {
    value.pointer_mut(pointer).and_then(Value::as_object_mut)
}

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

/// The node's own judge agent (`orchestrator/builtin/semantic-judge.yaml`): what an older
/// `semantic` validation (a model and a prompt, no judge agent) is judged by.
pub const SEMANTIC_JUDGE: &str = "aegis-semantic-judge";

/// The System command that writes the blackboard instead of running anything.
pub const UPDATE_BLACKBOARD_COMMAND: &str = "update_blackboard";

#[cfg(test)]
mod tests {
    use super::agent_forms::{OLDER_SEMANTIC_CRITERIA, VALIDATION};
    use super::workflow_forms::slug;
    use super::*;
    use serde_json::json;

    fn node(default: Option<Vec<String>>) -> impl Fn(&str) -> Option<Vec<String>> {
        move |language| (language == "python").then(|| default.clone()).flatten()
    }

    /// Asserts that normalisation refused at exactly `pointers`, in order, the first refusal
    /// saying `first_says`.
    fn assert_refused(out: &Normalised, pointers: &[&str], first_says: &str) {
        let at: Vec<&str> = out.errors.iter().map(|e| e.pointer.as_str()).collect();
        assert_eq!(at, pointers);
        assert!(
            out.errors[0].message.contains(first_says),
            "{:?}",
            out.errors
        );
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
        let at = [
            "/spec/execution/validation/semantic/fallback_on_unavailable",
            "/spec/execution/validation/nonsense",
        ];
        assert_refused(&out, &at, "never passes");
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
        let at = [
            "/spec/states/A/volumes/0/volume",
            "/spec/states/A/volumes/1/volume",
            "/spec/states/A/volumes/2/access_mode",
        ];
        assert_refused(&out, &at, "chosen at run time");

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
