//! Agent and workflow manifests: parsing, validation and export.
//!
//! A manifest is accepted in three stages, each only when the previous one passed, and each
//! reporting every problem it finds with the JSON pointer and (for text) the line:
//!
//! 1. **YAML** ([`yaml`]): the text becomes a `serde_json::Value` plus a map from pointers to
//!    positions. Strict on purpose: YAML 1.2 core scalars, no duplicate keys, one document.
//! 2. **Schema** ([`schema`]): the hand-written JSON Schema of the kind (`schemas/`), the same
//!    document `aegis.schema.get` serves.
//! 3. **Semantic** ([`semantic`]): what a schema cannot express, including references to the
//!    node (tools, runtimes) given as [`NodeKnowledge`] so this module stays free of the catalog
//!    and the registry.
//!
//! The accepted manifest stays a JSON value ([`ParsedManifest::value`]): that is what is stored,
//! versioned and exported. Callers that need typed fields read them through [`AgentView`] and
//! [`WorkflowView`]. Export ([`to_yaml`]) is written against the same loader, so it round-trips.

mod agent;
mod deployed;
mod emit;
mod error;
mod graph;
mod normalise;
mod pointer;
mod schema;
mod semantic;
mod template;
mod units;
mod volumes;
mod workflow;
mod yaml;

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

pub use agent::{
    AgentView, CmdRunLimits, ExecutionLimits, MemorySpec, NetworkMode, NetworkPolicy, Resources,
    RuntimeRef, CMD_DISPATCHER, CMD_RUN, DEFAULT_RECALL_TOKENS, MEMORY_TOOLS,
};
pub use deployed::Deployed;
pub use emit::to_yaml;
pub use error::{ManifestError, ManifestErrors, Stage};
pub use normalise::{SEMANTIC_JUDGE, UPDATE_BLACKBOARD_COMMAND};
pub use schema::schema;
pub use semantic::{check_name, run_supplied_keys, RUN_VARIABLES};
pub use units::{parse_duration, parse_quantity};
pub use volumes::{
    declared_volumes, mount_path_problem, mounts_volumes, paths_overlap, volume_mounts,
    volume_problems, DeclaredVolume, VolumeMount, DEFAULT_VOLUME_MB, WORKSPACE_VOLUME,
};
pub use workflow::{parse_cron, Firing, Plan, Schedule, TransitionView, WorkflowView};
pub use yaml::MAX_TEXT_BYTES;

/// The manifest `apiVersion` this service accepts.
pub const API_VERSION: &str = "100monkeys.ai/v1";

/// The two kinds of manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ManifestKind {
    /// `kind: Agent`.
    Agent,
    /// `kind: Workflow`.
    Workflow,
}

impl ManifestKind {
    /// The `kind` value in a manifest (`Agent`, `Workflow`).
    pub fn as_str(self) -> &'static str {
        match self {
            ManifestKind::Agent => "Agent",
            ManifestKind::Workflow => "Workflow",
        }
    }

    /// The key of this kind's schema (`agent/manifest/v1`, `workflow/manifest/v1`).
    pub fn schema_key(self) -> &'static str {
        match self {
            ManifestKind::Agent => "agent/manifest/v1",
            ManifestKind::Workflow => "workflow/manifest/v1",
        }
    }
}

impl fmt::Display for ManifestKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `(language, version)` -> the installed `(language, version)` the operator maps it to.
pub type RuntimeAlias<'a> = dyn Fn(&str, &str) -> Option<(String, String)> + 'a;

/// What the semantic checks need to know about the node.
pub struct NodeKnowledge<'a> {
    /// Whether the tool catalog has a tool of this exact name.
    pub tool_exists: &'a dyn Fn(&str) -> bool,
    /// Whether the runtime registry has this language and version.
    pub runtime_known: &'a dyn Fn(&str, &str) -> bool,
    /// The node's default `cmd.run` allowlist for a runtime language, applied to an agent that
    /// offers `cmd.run` without its own (`sandbox.default_command_allowlists`).
    pub default_command_allowlist: &'a dyn Fn(&str) -> Option<Vec<String>>,
    /// Whether a tool runs inside a sandbox (so an agent offering it gets one, and its volumes
    /// have somewhere to live): the policy's classification, asked, not copied.
    pub runs_in_sandbox: &'a dyn Fn(&str) -> bool,
    /// The installed runtime the operator maps a language and version to
    /// (`sandbox.runtime_aliases`), applied to a runtime the registry does not have.
    pub runtime_alias: &'a RuntimeAlias<'a>,
    /// The versions of a language the runtime registry has, for refusals that say what to use.
    pub runtime_versions: &'a dyn Fn(&str) -> Vec<String>,
    /// Names of the external MCP servers the node has (its `mcp_servers` config): what
    /// `mcp:<server>` and `mcp:<server>/<tool>` in `spec.tools` may name.
    pub mcp_servers: &'a [String],
}

impl fmt::Debug for NodeKnowledge<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeKnowledge").finish_non_exhaustive()
    }
}

/// A manifest that passed all three stages.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedManifest {
    /// Agent or workflow.
    pub kind: ManifestKind,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.version`.
    pub version: semver::Version,
    /// `metadata.description`.
    pub description: Option<String>,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// The whole manifest.
    pub value: Value,
    /// The manifest as normalised YAML (what export returns).
    pub yaml: String,
}

impl ParsedManifest {
    /// Typed reads of an agent manifest (meaningful only when `kind` is `Agent`).
    pub fn agent(&self) -> AgentView<'_> {
        AgentView(&self.value)
    }

    /// Typed reads of a workflow manifest (meaningful only when `kind` is `Workflow`).
    pub fn workflow(&self) -> WorkflowView<'_> {
        WorkflowView(&self.value)
    }
}

/// The full outcome of validating a manifest: the manifest or every error, and the warnings
/// (problems that do not refuse it, such as an agent that is not deployed yet) either way.
#[derive(Debug, Clone, PartialEq)]
pub struct Validation {
    /// The accepted manifest, or why it is refused.
    pub manifest: Result<ParsedManifest, ManifestErrors>,
    /// Warnings with pointer (and line, for text), ordered like errors.
    pub warnings: Vec<ManifestError>,
}

/// Parses and validates a manifest given as YAML or JSON text (JSON is YAML).
pub fn parse(
    kind: ManifestKind,
    text: &str,
    node: &NodeKnowledge<'_>,
) -> Result<ParsedManifest, ManifestErrors> {
    parse_checked(kind, text, node, None).manifest
}

/// Like [`parse`], and also checks references to other definitions against `deployed` (the
/// registry the caller sees): Subworkflow targets must exist (an error), agents should (a
/// warning). Without `deployed` those checks are skipped.
pub fn parse_checked(
    kind: ManifestKind,
    text: &str,
    node: &NodeKnowledge<'_>,
    deployed: Option<&Deployed>,
) -> Validation {
    let loaded = match yaml::load(text) {
        Ok(loaded) => loaded,
        Err(errors) => {
            return Validation {
                manifest: Err(errors),
                warnings: Vec::new(),
            }
        }
    };
    let positions = loaded.positions;
    validate(kind, loaded.value, node, deployed, |errors| {
        positions.place(errors)
    })
}

/// Refuses a manifest that passed validation for facts of this node checked afterwards (the
/// delivery destinations it can serve): each problem is (pointer, message), placed on the
/// text's lines like any semantic error.
pub fn refuse_after(validation: &mut Validation, text: &str, problems: Vec<(String, String)>) {
    if problems.is_empty() {
        return;
    }
    let errors: Vec<ManifestError> = problems
        .into_iter()
        .map(|(pointer, message)| ManifestError::new(Stage::Semantic, pointer, message))
        .collect();
    let placed = match yaml::load(text) {
        Ok(loaded) => loaded.positions.place(errors),
        Err(_) => errors,
    };
    validation.manifest = Err(ManifestErrors::sorted(placed));
}

/// Validates a manifest given as a JSON value (errors have pointers but no lines).
pub fn parse_value(
    kind: ManifestKind,
    value: Value,
    node: &NodeKnowledge<'_>,
) -> Result<ParsedManifest, ManifestErrors> {
    validate(kind, value, node, None, |errors| errors).manifest
}

fn validate(
    kind: ManifestKind,
    mut value: Value,
    node: &NodeKnowledge<'_>,
    deployed: Option<&Deployed>,
    place: impl Fn(Vec<ManifestError>) -> Vec<ManifestError>,
) -> Validation {
    let refuse = |errors: Vec<ManifestError>, warnings: Vec<ManifestError>| Validation {
        manifest: Err(ManifestErrors::sorted(place(errors))),
        warnings: ManifestErrors::sorted(place(warnings)).0,
    };
    // Older forms first, so that the schema judges (and the registry stores) the current form.
    let normalised = normalise::normalise(kind, &mut value, node);
    if !normalised.errors.is_empty() {
        return refuse(normalised.errors, normalised.notes);
    }
    let mut notes = normalised.notes;
    let errors = schema::validate(kind, &value);
    if !errors.is_empty() {
        return refuse(errors, notes);
    }
    let mut findings = semantic::check(kind, &value, node, deployed);
    findings.warnings.append(&mut notes);
    if !findings.errors.is_empty() {
        return refuse(findings.errors, findings.warnings);
    }
    let warnings = ManifestErrors::sorted(place(findings.warnings)).0;
    let text = |pointer: &str| value.pointer(pointer).and_then(Value::as_str);
    // The schema requires name and version, and the semantic stage checked the version.
    let name = text("/metadata/name").unwrap_or_default().to_owned();
    let version = match semver::Version::parse(text("/metadata/version").unwrap_or_default()) {
        Ok(version) => version,
        Err(e) => {
            return refuse(
                vec![ManifestError::new(
                    Stage::Semantic,
                    "/metadata/version",
                    e.to_string(),
                )],
                Vec::new(),
            )
        }
    };
    let description = text("/metadata/description").map(str::to_owned);
    let labels = value
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|map| {
            map.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let yaml = to_yaml(&value);
    Validation {
        manifest: Ok(ParsedManifest {
            kind,
            name,
            version,
            description,
            labels,
            value,
            yaml,
        }),
        warnings,
    }
}

/// The kind a manifest text declares in its top-level `kind` key, for callers that take files
/// of either kind (`orchestrator validate`). `None` when the text does not load or names
/// neither kind; [`parse`] then reports why.
pub fn kind_of(text: &str) -> Option<ManifestKind> {
    let loaded = yaml::load(text).ok()?;
    match loaded.value.get("kind").and_then(Value::as_str)? {
        "Agent" => Some(ManifestKind::Agent),
        "Workflow" => Some(ManifestKind::Workflow),
        _ => None,
    }
}

/// Keys of the schemas [`schema`] serves.
pub fn schema_keys() -> &'static [&'static str] {
    schema::SCHEMA_KEYS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The errors of `text` read as a manifest of `kind` (the test fails if it is valid).
    fn errors_of(kind: ManifestKind, text: &str) -> Vec<ManifestError> {
        parse(kind, text, &node()).expect_err("invalid").0
    }

    /// Asserts that the agent manifest `text` is refused at `placed` (each error's pointer and
    /// line, in order), every error by the checks of `stage`.
    fn assert_agent_refused(text: &str, placed: &[(&str, Option<usize>)], stage: Stage) {
        let errors = errors_of(ManifestKind::Agent, text);
        let at: Vec<(&str, Option<usize>)> = errors
            .iter()
            .map(|e| (e.pointer.as_str(), e.line))
            .collect();
        assert_eq!(at, placed, "{errors:?}");
        assert!(errors.iter().all(|e| e.stage == stage), "{errors:?}");
    }

    fn node() -> NodeKnowledge<'static> {
        NodeKnowledge {
            tool_exists: &|name| matches!(name, "fs.read" | "fs.write" | "cmd.run"),
            runtime_known: &|language, version| (language, version) == ("python", "3.11"),
            default_command_allowlist: &|_| None,
            runs_in_sandbox: &|name| name.starts_with("fs.") || name == "cmd.run",
            runtime_alias: &|_, _| None,
            runtime_versions: &|language| {
                if language == "python" {
                    vec!["3.11".to_owned()]
                } else {
                    Vec::new()
                }
            },
            mcp_servers: &[],
        }
    }

    const AGENT: &str = "\
apiVersion: 100monkeys.ai/v1
kind: Agent
metadata:
  name: coder
  version: 1.2.0
  description: Writes code
  labels: {team: core}
spec:
  runtime: {language: python, version: \"3.11\"}
  task:
    instruction: |
      Write the code.
      Then test it.
  tools: [fs.read, cmd.run]
  security:
    filesystem: {read: [/workspace], write: [/workspace]}
  builtin_dispatchers:
    - name: cmd
      capabilities: [{name: cmd.run, subcommand_allowlist: [python, pytest]}]
";

    #[test]
    fn parses_an_agent_and_round_trips_its_export() {
        let parsed = parse(ManifestKind::Agent, AGENT, &node()).expect("valid");
        assert_eq!(parsed.name, "coder");
        assert_eq!(parsed.version, semver::Version::new(1, 2, 0));
        assert_eq!(parsed.description.as_deref(), Some("Writes code"));
        assert_eq!(parsed.labels.get("team").map(String::as_str), Some("core"));
        assert_eq!(parsed.agent().tools(), ["fs.read", "cmd.run"]);
        let again = parse(ManifestKind::Agent, &parsed.yaml, &node()).expect("export parses");
        assert_eq!(again.value, parsed.value);
        let from_json =
            parse_value(ManifestKind::Agent, parsed.value.clone(), &node()).expect("json");
        assert_eq!(from_json, parsed);
    }

    #[test]
    fn semantic_errors_carry_lines() {
        let text = AGENT
            .replace("cmd.run]", "cmd.rnu]")
            .replace("\"3.11\"", "\"3.12\"");
        let placed = [("/spec/runtime", Some(9)), ("/spec/tools/1", Some(14))];
        assert_agent_refused(&text, &placed, Stage::Semantic);
    }

    #[test]
    fn schema_errors_come_with_lines_and_stop_semantic_checks() {
        let text = AGENT
            .replace("  description:", "  descripton:")
            .replace("cmd.run]", "cmd.rnu]");
        assert_agent_refused(&text, &[("/metadata/descripton", Some(6))], Stage::Schema);
        let errors = parse_value(
            ManifestKind::Agent,
            serde_json::json!({"kind": "Agent"}),
            &node(),
        )
        .expect_err("invalid")
        .0;
        assert!(errors.iter().all(|e| e.line.is_none()));
        assert!(errors
            .iter()
            .any(|e| e.pointer == "/metadata" && e.message.contains("`metadata`")));
    }

    #[test]
    fn spec_type_user_is_accepted_and_system_refused_with_what_to_do() {
        let typed = AGENT.replace("spec:\n", "spec:\n  type: user\n");
        let parsed = parse(ManifestKind::Agent, &typed, &node()).expect("user is accepted");
        assert_eq!(parsed.agent().agent_type(), "user");
        let plain = parse(ManifestKind::Agent, AGENT, &node()).expect("valid");
        assert_eq!(plain.agent().agent_type(), "user", "the default");
        let system = AGENT.replace("spec:\n", "spec:\n  type: system\n");
        let errors = errors_of(ManifestKind::Agent, &system);
        assert_eq!(errors[0].pointer, "/spec/type");
        assert!(
            errors[0].message.contains("spec.security_context"),
            "{errors:?}"
        );
    }

    #[test]
    fn an_unknown_runtime_is_refused_saying_what_to_write() {
        let errors = errors_of(ManifestKind::Agent, &AGENT.replace("\"3.11\"", "\"3.10\""));
        assert!(
            errors[0].message.contains("`version: \"3.11\"`")
                && errors[0].message.contains("sandbox.runtime_aliases"),
            "{errors:?}"
        );
    }

    const WORKFLOW: &str = "\
apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata: {name: flow, version: 1.0.0}
spec:
  initial_state: ask
  states:
    ask:
      kind: Human
      prompt: go on?
      transitions:
        - {condition: input_equals_yes, target: count}
        - {condition: always, target: ~}
    count:
      kind: System
      command: update_blackboard
      update_blackboard: {iteration_number: '1'}
      transitions:
        - {condition: always, target: ~}
";

    #[test]
    fn a_null_target_ends_the_run_and_iteration_number_may_be_written() {
        let parsed = parse(ManifestKind::Workflow, WORKFLOW, &node()).expect("valid");
        let again = parse(ManifestKind::Workflow, &parsed.yaml, &node()).expect("export parses");
        assert!(again.value["spec"]["states"]["count"]["transitions"][0]["target"].is_null());
        // A state whose every transition goes on cannot end a run; `~` is a way out.
        let stuck = WORKFLOW.replace("target: ~}", "target: ask}");
        let errors = errors_of(ManifestKind::Workflow, &stuck);
        assert!(
            errors.iter().any(|e| e.message.contains("can end a run")),
            "{errors:?}"
        );
        // Reserved run variables stay unwritable.
        let input = WORKFLOW.replace("iteration_number", "input");
        let errors = errors_of(ManifestKind::Workflow, &input);
        assert!(errors[0].message.contains("reserved"), "{errors:?}");
    }

    #[test]
    fn a_schedule_object_takes_a_time_zone_and_a_jitter_shorter_than_its_ticks() {
        let with = |schedule: &str| {
            WORKFLOW.replace(
                "spec:\n",
                &format!("spec:\n  default_schedule: {schedule}\n"),
            )
        };
        let parsed = parse(
            ManifestKind::Workflow,
            &with("{cron: '0 16 * * 1-5', timezone: Europe/Berlin, jitter_seconds: 1800}"),
            &node(),
        )
        .expect("valid");
        let schedule = parsed.workflow().default_schedule().expect("a schedule");
        assert_eq!(
            (schedule.timezone.as_str(), schedule.jitter_seconds),
            ("Europe/Berlin", 1800)
        );
        for (bad, at, says) in [
            (
                "{cron: '*/30 * * * *', timezone: Mars/Olympus}",
                "/spec/default_schedule/timezone",
                "IANA",
            ),
            (
                "{cron: '*/30 * * * *', jitter_seconds: 1800}",
                "/spec/default_schedule/jitter_seconds",
                "at most 1799",
            ),
        ] {
            let errors = parse(ManifestKind::Workflow, &with(bad), &node())
                .expect_err(bad)
                .0;
            assert_eq!(errors[0].pointer, at, "{errors:?}");
            assert!(errors[0].message.contains(says), "{errors:?}");
        }
    }

    #[test]
    fn schema_lookup() {
        assert_eq!(schema_keys(), ["agent/manifest/v1", "workflow/manifest/v1"]);
        for key in schema_keys() {
            assert!(schema(key).is_some());
        }
        assert_eq!(ManifestKind::Workflow.schema_key(), "workflow/manifest/v1");
    }
}
