//! What AEGIS users bring moves in unchanged: manifests shaped like the templates AEGIS ships
//! validate and deploy, older forms are normalised with a note, `cmd.run` without an allowlist
//! gets the node's default for the runtime (or is refused when there is none), and workflow
//! blackboard writes and `{{human.feedback}}` reach later states.
//!
//! The manifests here are our own, written to exercise each construct the AEGIS templates
//! (`cli/templates/agents`, `cli/templates/workflows`) use; the templates themselves are checked
//! by `scripts/check_aegis_templates.sh` against a fetched checkout (not in CI: no network).

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{test_config, TestApp, TestDb};
use serde_json::{json, Value};

/// A node whose config gives Python agents a default `cmd.run` allowlist (and bash none).
async fn app() -> TestApp {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.sandbox.default_command_allowlists = BTreeMap::from([(
        "python".to_owned(),
        vec!["python".to_owned(), "pytest".to_owned()],
    )]);
    let mut app = TestApp::spawn_with(config).await;
    app.db = Some(db);
    app
}

/// `manifest` through the create tool `tool` (`aegis.agent.create`, `aegis.workflow.create`),
/// which must deploy it; the answer.
async fn created(app: &TestApp, tool: &str, manifest: &str) -> Value {
    let created = app
        .tool_result(tool, json!({ "manifest_yaml": manifest }))
        .await;
    assert_eq!(created["deployed"], true, "{tool}: {created}");
    created
}

/// What `aegis.workflow.validate` says of `manifest`.
async fn validated(app: &TestApp, manifest: &str) -> Value {
    app.tool_result(
        "aegis.workflow.validate",
        json!({ "manifest_yaml": manifest }),
    )
    .await
}

/// The stored manifest of `name` as the export tool `tool` gives it, parsed.
async fn exported(app: &TestApp, tool: &str, name: &str) -> Value {
    let exported = app.tool_result(tool, json!({ "name": name })).await;
    let yaml = exported["manifest_yaml"]
        .as_str()
        .unwrap_or_else(|| panic!("{tool} {name}: {exported}"));
    serde_yaml::from_str(yaml).expect("the export is YAML")
}

fn notes(result: &Value) -> Vec<(String, String)> {
    result["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .map(|w| {
                    (
                        w["pointer"].as_str().unwrap_or_default().to_owned(),
                        w["message"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

// A judge as the AEGIS judge templates write it: judge model alias, JSON-schema validation of
// its verdict, a fixed runtime, no tools.
const JUDGE: &str = r#"apiVersion: 100monkeys.ai/v1
kind: Agent
metadata:
  name: quality-judge
  version: "1.0.0"
  description: Scores code.
  labels: {role: judge, category: validation, stability: stable}
spec:
  runtime: {language: "python", version: "3.11", model: "judge", isolation: "inherit", temperature: 0.1}
  task:
    instruction: "Score the code you are given from 0 to 1 and explain why."
  execution:
    mode: one-shot
    max_retries: 2
    llm_timeout_seconds: 120
    validation:
      - type: json_schema
        schema:
          type: object
          required: [score, reasoning]
          properties:
            score: {type: number, minimum: 0, maximum: 1}
            reasoning: {type: string, minLength: 1}
            issues:
              type: array
              maxItems: 10
              items:
                type: object
                required: [severity]
                properties:
                  severity: {type: string, enum: [low, high]}
  tools: []
"#;

// An executor as the AEGIS executor templates write it: iterative, tool_validation by a judge,
// exit_code and semantic validation, security block, cmd.run offered with no allowlist.
const EXECUTOR: &str = r#"apiVersion: 100monkeys.ai/v1
kind: Agent
metadata:
  name: py-executor
  version: "1.0.0"
  description: Writes and runs Python.
  labels: {type: executor, builtin: "false"}
spec:
  runtime:
    language: python
    version: "3.11"
    model: smart
    isolation: inherit
  task:
    instruction: "Write /workspace/main.py for the intent, run it with cmd.run, fix it until it works."
    prompt_template: "{{instruction}}\n\nTask: {{intent}}\n\nInput: {{input}}"
  execution:
    mode: iterative
    max_iterations: 5
    iteration_timeout: "300s"
    llm_timeout_seconds: 300
    validation:
      - type: exit_code
        expected: 0
      - type: semantic
        judge_agent: quality-judge
        criteria: "The program does what the intent asks."
        min_score: 0.7
        min_confidence: 0.5
        timeout_seconds: 120
    tool_validation:
      - type: semantic
        judge_agent: quality-judge
        criteria: "Only run the program under /workspace."
        min_score: 0.8
        timeout_seconds: 60
  security:
    network: {mode: none}
    filesystem: {read: [/workspace], write: [/workspace]}
    resources: {cpu: 500, memory: 512Mi, disk: 1Gi, timeout: 600s}
  tools: [fs.write, cmd.run, fs.read]
  input_schema:
    type: object
    properties: {task: {type: string}}
"#;

/// The end states both template-shaped workflows finish in: `DONE` and `FAILED`, System
/// states that only echo.
macro_rules! end_states {
    () => {
        r#"    DONE:
      kind: System
      command: "echo done"
      transitions: []
    FAILED:
      kind: System
      command: "echo failed"
      transitions: []
"#
    };
}

// The intent-to-execution shape: templated agent name, intent, custom condition on the
// validator's output, a hardened ContainerRun, loops bounded by max_state_visits,
// output_template, input/output schema, max_total_transitions.
const INTENT_WORKFLOW: &str = concat!(
    r#"apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: intent-pipeline
  version: "1.0.0"
  description: Intent to code to result.
  labels: {builtin: "false", pattern: pipeline}
  input_schema:
    type: object
    required: [intent, language]
    properties:
      intent: {type: string}
      language: {type: string, enum: [python]}
      image: {type: string}
  output_schema:
    type: object
    properties: {result: {type: string}}
  output_template:
    result: "{{RUN.stdout}}"
    exit_code: "{{RUN.exit_code}}"
spec:
  initial_state: WRITE
  max_total_transitions: 20
  context: {attempts: 3}
  states:
    WRITE:
      kind: Agent
      agent: "{{input.language}}-executor"
      intent: "{{input.intent}}"
      input: "{{input.intent}}{{#if state.feedback}}\nPrevious error: {{state.feedback}}{{/if}}"
      max_state_visits: 3
      transitions:
        - {condition: on_success, target: CHECK}
        - {condition: on_failure, target: FAILED}
    CHECK:
      kind: Agent
      agent: quality-judge
      input: "{{WRITE.output}}"
      transitions:
        - condition: custom
          expression: "state_output.output.valid"
          target: RUN
        - condition: always
          target: WRITE
          feedback: "{{CHECK.output}}"
    RUN:
      kind: ContainerRun
      name: run-code
      image: "{{input.image}}"
      command: ["python", "/workspace/main.py"]
      workdir: /workspace
      shell: false
      network_mode: none
      run_as_user: "65534:65534"
      read_only_root_filesystem: true
      resources: {cpu: 500, memory: 256Mi, timeout: 600s}
      transitions:
        - {condition: exit_code_zero, target: DONE}
        - condition: exit_code_non_zero
          target: WRITE
          feedback: "{{RUN.stderr}}"
"#,
    end_states!()
);

// The skill-import shape: System states with env, exit codes, score thresholds with feedback,
// spec.context, and a judge scoring in between.
const IMPORT_WORKFLOW: &str = concat!(
    r#"apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: import-skill
  version: "1.0.0"
spec:
  initial_state: FETCH
  context: {source_kind: url}
  states:
    FETCH:
      kind: System
      command: "printf '%s' \"$SOURCE\""
      env: {SOURCE: "{{input.source}}", REASON: "{{source_kind}}"}
      timeout: 60s
      transitions:
        - {condition: exit_code_zero, target: SCORE}
        - {condition: exit_code_non_zero, target: FAILED}
    SCORE:
      kind: Agent
      agent: quality-judge
      input: "{{FETCH.stdout}}"
      transitions:
        - {condition: score_above, threshold: 0.7, target: DONE}
        - condition: score_below
          threshold: 0.7
          target: FAILED
          feedback: "too low: {{SCORE.output}}"
"#,
    end_states!()
);

#[tokio::test]
async fn manifests_shaped_like_the_aegis_templates_validate_and_deploy() {
    let app = app().await;
    created(&app, "aegis.agent.create", JUDGE).await;

    // cmd.run without an allowlist: the node's default for python applies, said plainly.
    let executor = created(&app, "aegis.agent.create", EXECUTOR).await;
    let notes = notes(&executor);
    let note = notes
        .iter()
        .find(|(p, _)| p == "/spec/tools/1")
        .unwrap_or_else(|| panic!("a note on cmd.run: {notes:?}"));
    assert!(
        note.1.contains("sandbox.default_command_allowlists.python")
            && note.1.contains("[python, pytest]"),
        "{note:?}"
    );
    // ... and is written into the deployed manifest, where the sandbox policy reads it.
    let yaml = exported(&app, "aegis.agent.export", "py-executor").await;
    assert_eq!(
        yaml["spec"]["builtin_dispatchers"],
        json!([{"name": "cmd", "capabilities": [
            {"name": "cmd.run", "subcommand_allowlist": ["python", "pytest"]}]}])
    );

    for workflow in [INTENT_WORKFLOW, IMPORT_WORKFLOW] {
        let checked = validated(&app, workflow).await;
        assert_eq!(checked["valid"], true, "{checked}");
        created(&app, "aegis.workflow.create", workflow).await;
    }
}

#[tokio::test]
async fn cmd_run_without_an_allowlist_is_refused_when_the_node_has_no_default() {
    let app = app().await;
    // This node has a default for python only.
    let bash = EXECUTOR
        .replace("name: py-executor", "name: sh-executor")
        .replace("language: python", "language: bash")
        .replace("version: \"3.11\"", "version: \"5\"")
        .replace("judge_agent: quality-judge", "judge_agent: someone");
    let (status, out) = app
        .call_tool("aegis.agent.create", json!({"manifest_yaml": bash}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(out["isError"], true, "{out}");
    let details = &out["structuredContent"]["error"]["details"];
    let refusal = details
        .as_array()
        .and_then(|d| d.iter().find(|e| e["path"] == "/spec/tools/1"))
        .unwrap_or_else(|| panic!("refused at /spec/tools/1: {out}"));
    assert!(
        common::json::text(&refusal["message"]).contains("no default for the agent's runtime"),
        "{refusal}"
    );
    // Nothing was stored.
    let (_, list) = app.call_tool("aegis.agent.list", json!({})).await;
    assert_eq!(list["structuredContent"]["agents"], json!([]), "{list}");
}

// Older forms: `validation` as a mapping, a digit-first name, a ContainerRun step named with a
// phrase, and a System `update_blackboard` state.
const OLD_AGENT: &str = r#"apiVersion: 100monkeys.ai/v1
kind: Agent
metadata:
  name: 2fast-agent
  version: "0.1.0"
spec:
  runtime: {language: python, version: "3.11"}
  task: {instruction: "Answer in JSON."}
  execution:
    mode: iterative
    memory: false
    validation:
      system: {must_succeed: true, allow_stderr: true}
      output:
        format: json
        schema: {type: object, required: [answer]}
        regex: "answer"
"#;

const OLD_WORKFLOW: &str = r#"apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: 3-step-build
  version: "0.1.0"
spec:
  initial_state: BUILD
  states:
    BUILD:
      kind: ParallelContainerRun
      completion: all_succeed
      steps:
        - name: "Run unit tests"
          image: aegis-runtime/busybox:1
          command: ["true"]
        - name: lint
          image: aegis-runtime/busybox:1
          command: ["true"]
      transitions:
        - {condition: on_success, target: COUNT}
    COUNT:
      kind: System
      command: update_blackboard
      env:
        TESTS_STDOUT: "{{BUILD.output.run-unit-tests.stdout}}"
      transitions:
        - {condition: always, target: SHIP}
    SHIP:
      kind: ContainerRun
      name: "Publish the build"
      image: aegis-runtime/busybox:1
      command: ["echo", "{{tests_stdout}}"]
      transitions: []
"#;

#[tokio::test]
async fn older_forms_are_normalised_with_a_note_and_stored_in_the_current_form() {
    let app = app().await;
    let agent = created(&app, "aegis.agent.create", OLD_AGENT).await;
    assert_eq!(agent["name"], "2fast-agent");
    let agent_notes = notes(&agent);
    assert!(
        agent_notes
            .iter()
            .any(|(p, m)| p == "/spec/execution/validation"
                && m.starts_with("normalised:")
                && m.contains("`system.must_succeed` became an `exit_code` validator")),
        "{agent_notes:?}"
    );
    assert!(
        agent_notes
            .iter()
            .any(|(p, m)| p == "/spec/execution/memory" && m.contains("dropped")),
        "{agent_notes:?}"
    );
    let yaml = exported(&app, "aegis.agent.export", "2fast-agent").await;
    assert!(yaml["spec"]["execution"].get("memory").is_none());
    assert_eq!(
        yaml["spec"]["execution"]["validation"],
        json!([
            {"type": "exit_code", "expected": 0},
            {"type": "json_schema", "schema": {"type": "object", "required": ["answer"]}},
            {"type": "regex", "pattern": "answer", "target": "stdout"},
        ])
    );

    // An older form without a current equivalent is refused with the replacement named.
    let scripted = OLD_AGENT.replace(
        "      system: {must_succeed: true, allow_stderr: true}",
        "      script: {path: /opt/check.sh}",
    );
    let (_, out) = app
        .call_tool("aegis.agent.create", json!({"manifest_yaml": scripted}))
        .await;
    assert_eq!(out["isError"], true, "{out}");
    let text = out["structuredContent"]["error"].to_string();
    assert!(
        text.contains("/spec/execution/validation/script") && text.contains("not supported"),
        "{text}"
    );

    let workflow = validated(&app, OLD_WORKFLOW).await;
    assert_eq!(workflow["valid"], true, "{workflow}");
    let wf_notes = notes(&workflow);
    for (pointer, gist) in [
        ("/spec/states/BUILD/steps/0/name", "named `run-unit-tests`"),
        ("/spec/states/SHIP/name", "named `publish-the-build`"),
        ("/spec/states/COUNT/command", "`tests_stdout`"),
    ] {
        assert!(
            wf_notes
                .iter()
                .any(|(p, m)| p == pointer && m.contains(gist)),
            "{pointer}: {wf_notes:?}"
        );
    }
    created(&app, "aegis.workflow.create", OLD_WORKFLOW).await;
    let yaml = exported(&app, "aegis.workflow.export", "3-step-build").await;
    let states = &yaml["spec"]["states"];
    assert_eq!(states["BUILD"]["steps"][0]["name"], "run-unit-tests");
    assert_eq!(
        states["BUILD"]["steps"][0]["display_name"],
        "Run unit tests"
    );
    assert_eq!(states["SHIP"]["display_name"], "Publish the build");
    assert_eq!(
        states["COUNT"]["update_blackboard"],
        json!({"tests_stdout": "{{BUILD.output.run-unit-tests.stdout}}"})
    );
    assert!(states["COUNT"].get("env").is_none());
}

// Blackboard keys written at run time and the Human answer, read by later states. Nothing here
// needs a container: `update_blackboard` System states run nothing.
const NOTES_WORKFLOW: &str = r#"apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: review-notes
  version: "1.0.0"
  output_template:
    summary: "{{summary}}"
    feedback: "{{human.feedback}}"
    rounds: "{{blackboard.rounds}}"
spec:
  initial_state: ASK
  states:
    ASK:
      kind: Human
      prompt: "Approve {{input.what}}?"
      update_blackboard:
        first_answer: "{{state_output.response}}"
      transitions:
        - {condition: always, target: RECORD}
    RECORD:
      kind: System
      command: update_blackboard
      env:
        VERDICT: "{{human.feedback}} from {{human.state}}"
        ROUNDS: "{{length input.what}}"
      transitions:
        - {condition: always, target: DONE}
    DONE:
      kind: System
      command: update_blackboard
      update_blackboard:
        summary: "{{verdict}} ({{first_answer}}, {{rounds}} rounds)"
      transitions: []
"#;

#[tokio::test]
async fn blackboard_writes_and_the_human_answer_reach_later_states() {
    let app = app().await;
    created(&app, "aegis.workflow.create", NOTES_WORKFLOW).await;
    let id = app
        .started("/v1/workflows/review-notes/run", json!({"what": "abc"}))
        .await;
    let path = format!("/v1/workflows/executions/{id}");
    app.until(
        &path,
        "waited for the human",
        Duration::from_secs(60),
        |e| e["status"] == "waiting",
    )
    .await;
    let r = app
        .post_json(
            &format!("/v1/workflows/executions/{id}/signal"),
            &json!({"response": "approve"}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let ended = app.until_ended(&path, Duration::from_secs(60)).await;
    assert_eq!(ended["status"], "completed", "{ended}");
    assert_eq!(
        ended["final_output"],
        json!({"summary": "approve from ASK (approve, 3 rounds)", "feedback": "approve", "rounds": "3"}),
        "{ended}"
    );
    // `rounds` rendered as JSON text is stored as a number.
    assert_eq!(ended["blackboard"]["rounds"], json!(3), "{ended}");
    assert_eq!(
        ended["blackboard"]["human"],
        json!({"feedback": "approve", "state": "ASK", "timeout": false})
    );
}

#[tokio::test]
async fn templates_reading_what_nothing_writes_are_refused() {
    let app = app().await;
    // No Human state: `human.feedback` would always be empty.
    let no_human = NOTES_WORKFLOW
        .replace(
            "      kind: Human\n      prompt: \"Approve {{input.what}}?\"\n",
            "      kind: System\n      command: update_blackboard\n",
        )
        .replace("{{state_output.response}}", "yes");
    // A blackboard write may not replace a state's output or a run variable.
    let shadowing = NOTES_WORKFLOW.replace("first_answer:", "RECORD:");
    // A schedule must be a cron expression.
    let bad_cron = NOTES_WORKFLOW.replace(
        "  initial_state: ASK\n",
        "  initial_state: ASK\n  default_schedule: \"every 5 minutes\"\n",
    );
    for (what, manifest, reason) in [
        ("no human", no_human, "no Human state"),
        ("shadowing", shadowing, "is a state name"),
        ("bad cron", bad_cron, "is not a cron expression"),
    ] {
        let checked = validated(&app, &manifest).await;
        assert_eq!(checked["valid"], false, "{what}: {checked}");
        assert!(
            checked["errors"].to_string().contains(reason),
            "{what}: {checked}"
        );
    }
}
