//! Deploy-time validation of workflows: what the messages say, the checks that need the
//! registry (Subworkflow targets, agents), and the warnings of the real service's validate and
//! deploy answers. (Pointer and line of each check are covered by the examples in
//! `schemas/examples/semantic/`, run by tests/suite/manifests.rs.)

use crate::common;
use crate::common::agent::AgentManifest;
use crate::common::workflow::workflow_manifest;

use common::{any_node, TestApp};
use orchestrator::manifest::{parse, parse_checked, Deployed, ManifestError, ManifestKind};
use serde_json::{json, Value};

/// The errors of a manifest that must be refused.
fn refused(text: &str) -> Vec<ManifestError> {
    parse(ManifestKind::Workflow, text, &any_node())
        .expect_err("refused")
        .0
}

fn example(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../schemas/examples")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One error, at `pointer` and `line`, whose message has every fragment.
fn assert_one(errors: &[ManifestError], pointer: &str, line: usize, fragments: &[&str]) {
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let e = &errors[0];
    assert_eq!((e.pointer.as_str(), e.line), (pointer, Some(line)), "{e}");
    for fragment in fragments {
        assert!(e.message.contains(fragment), "`{fragment}` not in: {e}");
    }
}

#[test]
fn loops_without_exit_are_named_and_refine_loops_pass() {
    let errors = refused(&example("semantic/workflow-loop-without-exit.yaml"));
    assert_one(
        &errors,
        "/spec/states/check/transitions",
        20,
        &["states `check`, `fix` form a loop", "terminal state"],
    );
    let errors = refused(&example("semantic/workflow-self-loop-without-exit.yaml"));
    assert_one(
        &errors,
        "/spec/states/poll/transitions",
        21,
        &["state `poll` forms a loop on itself"],
    );
    for valid in [
        "valid/workflow-refine-loop.yaml",
        "valid/workflow-human-gate.yaml",
        "valid/workflow-every-state-kind.yaml",
    ] {
        parse(ManifestKind::Workflow, &example(valid), &any_node())
            .unwrap_or_else(|e| panic!("{valid}: {e}"));
    }
    // Adding an exit to the broken loop fixes it.
    let fixed = example("semantic/workflow-loop-without-exit.yaml").replace(
        "{condition: exit_code_zero, target: fix}",
        "{condition: exit_code_zero, target: end}",
    );
    parse(ManifestKind::Workflow, &fixed, &any_node()).expect("a loop with an exit");
}

#[test]
fn templates_may_read_only_what_can_exist_there() {
    let errors = refused(&example(
        "semantic/workflow-template-reads-later-state.yaml",
    ));
    assert_one(
        &errors,
        "/spec/states/write/input",
        14,
        &[
            "`{{review.output}}`",
            "state `review`, which can never have run before state `write`",
        ],
    );
    let errors = refused(&example(
        "semantic/workflow-template-reads-itself-first-visit.yaml",
    ));
    assert_one(
        &errors,
        "/spec/states/build/command",
        13,
        &["`build` is never revisited"],
    );
    let errors = refused(&example("semantic/workflow-template-unknown-key.yaml"));
    assert_one(
        &errors,
        "/spec/states/end/env/SUMMARY",
        23,
        &["unknown state `reveiw` (did you mean `review`?)"],
    );
    let errors = refused(&example(
        "semantic/workflow-state-output-outside-transition.yaml",
    ));
    assert_one(
        &errors,
        "/spec/states/end/command",
        19,
        &["`state_output`", "custom"],
    );
    let errors = refused(&example(
        "semantic/workflow-custom-expression-unknown-state.yaml",
    ));
    assert_one(
        &errors,
        "/spec/states/start/transitions/0/expression",
        15,
        &["unknown state `strat` (did you mean `start`?)"],
    );
    let errors = refused(&example(
        "semantic/workflow-result-key-before-subworkflow.yaml",
    ));
    assert_one(
        &errors,
        "/spec/states/announce/input",
        14,
        &[
            "`report` (the result of `publish`)",
            "before state `announce`",
        ],
    );
}

#[test]
fn conditions_must_fit_the_state_kind() {
    for (file, fragment) in [
        (
            "workflow-exit-code-on-agent-state.yaml",
            "`exit_code_zero` is only meaningful on System and ContainerRun states (this is an Agent state",
        ),
        (
            "workflow-consensus-on-system-state.yaml",
            "`consensus` is only meaningful on a ParallelAgents state (this is a System state",
        ),
        (
            "workflow-score-on-container-state.yaml",
            "`score_above` is only meaningful on Agent and ParallelAgents states",
        ),
        (
            "workflow-input-equals-on-agent-state.yaml",
            "`input_equals_yes` is only meaningful on a Human state",
        ),
    ] {
        let errors = refused(&example(&format!("semantic/{file}")));
        assert_eq!(errors.len(), 1, "{file}: {errors:?}");
        assert!(errors[0].message.contains(fragment), "{file}: {}", errors[0]);
    }
}

#[test]
fn limits_are_refused_with_the_ceiling_named() {
    for (file, ceiling) in [
        ("workflow-max-state-visits-over-20.yaml", "maximum 20"),
        (
            "workflow-max-total-transitions-over-100.yaml",
            "maximum 100",
        ),
    ] {
        let errors = refused(&example(&format!("invalid/{file}")));
        assert!(
            errors.iter().all(|e| e.message.contains(ceiling)),
            "{file}: {errors:?}"
        );
    }
}

fn caller() -> String {
    workflow_manifest(
        "caller",
        "work",
        "    work:
      kind: Agent
      agent: worker
      input: \"{{input}}\"
      judges: [{agent_id: grader}, {agent_id: \"{{input.judge}}\"}]
      transitions:
        - {condition: on_success, target: child}
        - {condition: on_failure, target: done}
    child:
      kind: Subworkflow
      workflow_id: publisher
      mode: blocking
      result_key: published
      transitions: [{condition: always, target: done}]
    done: {kind: System, command: \"echo {{published.url}}\", transitions: []}
",
    )
}

fn publisher() -> String {
    workflow_manifest(
        "publisher",
        "publish",
        "    publish:
      kind: Subworkflow
      workflow_id: caller
      mode: blocking
      result_key: r
      transitions: []
",
    )
}

#[test]
fn registry_checks_need_deployed_workflows_and_warn_about_agents() {
    // Offline (no registry): nothing to say about other definitions.
    parse(ManifestKind::Workflow, &caller(), &any_node()).expect("valid without a registry");

    let mut deployed = Deployed::new();
    deployed.add_agent("6f1c0d52-6c1e-4d56-9d1a-2f0b1c1e0a01", "grader");
    deployed.add_workflow(
        "0b8e2a7c-1111-4c3b-9a55-000000000001",
        "publisherr",
        &json!({}),
    );
    let checked = parse_checked(
        ManifestKind::Workflow,
        &caller(),
        &any_node(),
        Some(&deployed),
    );
    let errors = checked.manifest.clone().expect_err("unknown workflow").0;
    assert_one(
        &errors,
        "/spec/states/child/workflow_id",
        19,
        &["workflow `publisher` is not deployed (did you mean `publisherr`?)"],
    );
    // Warnings come with the errors too; the templated judge is not checked.
    let warned: Vec<(&str, Option<usize>)> = checked
        .warnings
        .iter()
        .map(|w| (w.pointer.as_str(), w.line))
        .collect();
    assert_eq!(
        warned,
        [("/spec/states/work/agent", Some(11))],
        "{checked:?}"
    );
    assert!(checked.warnings[0]
        .message
        .contains("agent `worker` is not deployed"));

    // A deployed publisher that calls back `caller` in blocking mode closes a recursion.
    let publisher = parse(ManifestKind::Workflow, &publisher(), &any_node()).expect("publisher");
    deployed.add_workflow(
        "0b8e2a7c-1111-4c3b-9a55-000000000002",
        "publisher",
        &publisher.value,
    );
    let errors = parse_checked(
        ManifestKind::Workflow,
        &caller(),
        &any_node(),
        Some(&deployed),
    )
    .manifest
    .expect_err("recursion")
    .0;
    assert_one(
        &errors,
        "/spec/states/child/workflow_id",
        19,
        &["`caller` waits for `publisher` waits for `caller`"],
    );

    // fire_and_forget does not wait, so it is no recursion.
    let detached = caller()
        .replace(
            "mode: blocking\n      result_key: published\n",
            "mode: fire_and_forget\n",
        )
        .replace("{{published.url}}", "done");
    let checked = parse_checked(
        ManifestKind::Workflow,
        &detached,
        &any_node(),
        Some(&deployed),
    );
    checked.manifest.expect("fire and forget");
    assert_eq!(checked.warnings.len(), 1);
}

fn child() -> String {
    workflow_manifest(
        "publisher",
        "publish",
        "    publish: {kind: System, command: \"echo published\", transitions: []}
",
    )
}

fn worker() -> String {
    AgentManifest::new("worker")
        .runtime("python", "3.11")
        .instruction("Work.")
        .yaml()
}

#[tokio::test]
async fn the_service_reports_warnings_and_refuses_unknown_subworkflows() {
    let app = TestApp::spawn().await;

    // The child workflow is not deployed: refused by validate and by deploy, nothing stored.
    let validate = json!({"manifest_yaml": caller()});
    let report = app.tool_result("aegis.workflow.validate", validate).await;
    assert_eq!(report["valid"], false, "{report}");
    assert_eq!(
        report["details"][0]["path"],
        "/spec/states/child/workflow_id"
    );
    assert_eq!(report["details"][0]["line"], 19);
    let (status, body) = app.post_yaml("/v1/workflows", &caller()).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.to_string().contains("`publisher` is not deployed"),
        "{body}"
    );

    // With the child deployed it passes, and the undeployed agents are warnings.
    let (status, body) = app.post_yaml("/v1/workflows", &child()).await;
    assert_eq!(status, 201, "{body}");
    let validate = json!({"manifest_yaml": caller()});
    let report = app.tool_result("aegis.workflow.validate", validate).await;
    assert_eq!(report["valid"], true, "{report}");
    let warnings = report["warnings"].as_array().expect("warnings");
    let places: Vec<(&str, i64)> = warnings
        .iter()
        .map(|w| {
            (
                w["pointer"].as_str().unwrap_or(""),
                w["line"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        places,
        [
            ("/spec/states/work/agent", 11),
            ("/spec/states/work/judges/0/agent_id", 13)
        ],
        "{report}"
    );
    assert!(warnings[0]["message"]
        .as_str()
        .is_some_and(|m| m.contains("agent `worker` is not deployed")));
    let (_, out) = app
        .call_tool(
            "aegis.schema.validate",
            json!({"kind": "workflow", "manifest_yaml": caller()}),
        )
        .await;
    assert_eq!(
        out["structuredContent"]["warnings"],
        Value::Array(warnings.clone()),
        "{out}"
    );

    // Deploy succeeds and carries the warnings; once the agent exists its warning is gone.
    let (status, body) = app.post_yaml("/v1/workflows", &caller()).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["warnings"].as_array().map(Vec::len), Some(2), "{body}");
    let (status, body) = app.post_yaml("/v1/agents", &worker()).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["warnings"], json!([]), "{body}");
    let (_, out) = app
        .call_tool(
            "aegis.workflow.validate",
            json!({"manifest_yaml": caller()}),
        )
        .await;
    let warnings = &out["structuredContent"]["warnings"];
    assert_eq!(warnings.as_array().map(Vec::len), Some(1), "{out}");
    assert_eq!(
        warnings[0]["pointer"],
        "/spec/states/work/judges/0/agent_id"
    );

    // The deployed caller now closes a blocking cycle for a publisher that calls it back.
    let (_, out) = app
        .call_tool(
            "aegis.workflow.update",
            json!({"manifest_yaml": &publisher().replace("1.0.0", "1.1.0")}),
        )
        .await;
    assert_eq!(out["isError"], true, "{out}");
    assert!(
        out.to_string()
            .contains("`publisher` waits for `caller` waits for `publisher`"),
        "{out}"
    );
}
