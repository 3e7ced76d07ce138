//! What a run promises and what it ran, against the real service (PostgreSQL, Docker sandboxes,
//! the scripted model): a workflow's final output is held to `metadata.output_schema`, and a
//! deployed version keeps its meaning (a forced redeploy with other content is a new revision;
//! every execution records and reports the digest and revision of the manifest it ran).

use crate::common;

use common::agent::AgentManifest;
use common::fake_llm::{answer, Step};
use common::harness::Harness;
use reqwest::Method;
use serde_json::{json, Value};

async fn harness(script: Vec<Step>) -> Harness {
    Harness::builder(script).workflows().start().await
}

const DIGITS: &str = "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: digits
  version: \"1.0.0\"
  input_schema:
    type: object
    required: [value]
    properties:
      value: {type: string}
  output_schema:
    type: object
    required: [result]
    properties:
      result: {type: string, pattern: \"^[0-9]+$\"}
  output_template:
    result: \"{{trim START.stdout}}\"
spec:
  initial_state: START
  states:
    START:
      kind: System
      command: \"echo {{input.value}}\"
      transitions: []
";

/// Where agent `speaker` is started.
const EXECUTE: &str = "/v1/agents/speaker/execute";

/// The fields `names` of `value`, in order.
fn picked(value: &Value, names: &[&str]) -> Vec<Value> {
    names.iter().map(|name| value[*name].clone()).collect()
}

#[tokio::test]
async fn a_final_output_that_breaks_output_schema_fails_naming_the_pointer() {
    let h = harness(vec![]).await;
    let (code, body) = h.deploy("/v1/workflows", DIGITS).await;
    assert_eq!(code, 201, "{body}");

    let run = |value: &'static str| {
        let h = &h;
        async move {
            let (code, body) = h
                .send(
                    Method::POST,
                    "/v1/workflows/digits/run",
                    Some(json!({"input": {"value": value}})),
                )
                .await;
            assert_eq!(code, 201, "{body}");
            let id = body["execution_id"].as_str().unwrap().to_owned();
            h.ended(&format!("/v1/workflows/executions/{id}")).await
        }
    };

    // The contract kept: completed with the output.
    let kept = run("42").await;
    assert_eq!(kept["status"], "completed", "{kept}");
    assert_eq!(kept["final_output"], json!({"result": "42"}));

    // The contract broken: failed, naming the pointer and what was expected, not the value.
    let broken = run("forty-two").await;
    assert_eq!(broken["status"], "failed", "{broken}");
    let error = broken["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("does not match metadata.output_schema"),
        "{error}"
    );
    assert!(error.contains("/result: "), "{error}");
    assert!(error.contains("^[0-9]+$"), "{error}");
    assert!(!error.contains("forty-two"), "{error}");
    assert_eq!(broken["final_output"], Value::Null, "{broken}");

    // The event log keeps what was produced and why it was refused.
    let id = broken["execution_id"].as_str().unwrap();
    let events = h
        .app
        .get_value(&format!("/v1/workflows/executions/{id}/events?limit=1000"))
        .await;
    let events = events["events"].as_array().cloned().unwrap_or_default();
    let rejected = events
        .iter()
        .find(|e| e["event_type"] == "output_rejected")
        .unwrap_or_else(|| panic!("no output_rejected event: {events:?}"));
    assert_eq!(
        rejected["payload"]["final_output"],
        json!({"result": "forty-two"})
    );
}

fn speaker(instruction: &str) -> String {
    AgentManifest::new("speaker")
        .instruction(instruction)
        .yaml()
}

fn workflow(word: &str) -> String {
    format!(
        "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: say
  version: \"1.0.0\"
  output_template:
    said: \"{{{{trim START.stdout}}}}\"
spec:
  initial_state: START
  states:
    START:
      kind: System
      command: \"echo {word}\"
      transitions: []
"
    )
}

/// `sha256:` of a text, as the registry names a manifest.
fn sha256(text: &str) -> String {
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(text.as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[tokio::test]
async fn a_forced_deploy_never_changes_what_a_version_meant_to_the_executions_that_ran_it() {
    let h = harness(vec![answer("first words"), answer("second words")]).await;

    // Version 1.0.0, revision 1, and an execution of it.
    let (code, first) = h.deploy("/v1/agents", &speaker("Say A.")).await;
    assert_eq!(code, 201, "{first}");
    assert_eq!(
        (first["revision"].clone(), first["replaced"].clone()),
        (json!(1), json!(false))
    );
    let digest_1 = first["manifest_digest"].as_str().unwrap().to_owned();
    let run_1 = h.app.started(EXECUTE, json!({})).await;
    let ended = h.ended(&format!("/v1/executions/{run_1}")).await;
    assert_eq!(ended["status"], "completed", "{ended}");

    // The same version again: refused without force; with force and another manifest, a new
    // revision; with force and the same manifest, nothing.
    let (code, refused) = h.deploy("/v1/agents", &speaker("Say B.")).await;
    assert_eq!(code, 409, "{refused}");
    let (code, second) = h.deploy("/v1/agents?force=true", &speaker("Say B.")).await;
    assert_eq!(code, 200, "{second}");
    assert_eq!(
        picked(&second, &["revision", "replaced", "unchanged"]),
        [json!(2), json!(true), json!(false)],
        "{second}"
    );
    let digest_2 = second["manifest_digest"].as_str().unwrap().to_owned();
    assert_ne!(digest_1, digest_2);
    let (code, again) = h.deploy("/v1/agents?force=true", &speaker("Say B.")).await;
    assert_eq!(code, 200, "{again}");
    assert_eq!(
        (again["revision"].clone(), again["unchanged"].clone()),
        (json!(2), json!(true))
    );

    // The first execution still records and reports what it ran: REST and the status tool.
    let e = h.app.get_value(&format!("/v1/executions/{run_1}")).await;
    assert_eq!(
        picked(&e, &["agent_version", "agent_revision", "manifest_digest"]),
        [json!("1.0.0"), json!(1), json!(digest_1)],
        "{e}"
    );
    let status = h
        .app
        .tool_result("aegis.task.status", json!({"execution_id": run_1}))
        .await;
    assert_eq!(
        picked(&status, &["revision", "manifest_digest"]),
        [json!(1), json!(digest_1)],
        "{status}"
    );

    // A new execution runs the new revision.
    let run_2 = h.app.started(EXECUTE, json!({})).await;
    let ended = h.ended(&format!("/v1/executions/{run_2}")).await;
    assert_eq!(
        picked(&ended, &["agent_revision", "manifest_digest"]),
        [json!(2), json!(digest_2)],
        "{ended}"
    );

    // The original content is still there, by version and revision, and its digest is the
    // SHA-256 of its export; lookups by version take the newest revision.
    let (code, original) = h
        .send(
            Method::GET,
            "/v1/agents/speaker?version=1.0.0&revision=1",
            None,
        )
        .await;
    assert_eq!(code, 200, "{original}");
    assert_eq!(
        original["manifest"]["spec"]["task"]["instruction"],
        "Say A."
    );
    assert_eq!(original["manifest_digest"], json!(digest_1));
    assert_eq!(
        sha256(original["manifest_yaml"].as_str().unwrap()),
        digest_1
    );
    let (_, exported) = h
        .app
        .call_tool(
            "aegis.agent.export",
            json!({"name": "speaker", "version": "1.0.0", "revision": 1}),
        )
        .await;
    assert_eq!(
        exported["structuredContent"]["manifest_yaml"], original["manifest_yaml"],
        "{exported}"
    );
    let current = h.app.get_value("/v1/agents/speaker?version=1.0.0").await;
    assert_eq!(current["manifest"]["spec"]["task"]["instruction"], "Say B.");
    assert_eq!(current["revision"], 2);
    let versions = h.app.get_value("/v1/agents/speaker/versions").await;
    let listed: Vec<(Value, Value)> = common::json::items(&versions)
        .iter()
        .map(|v| (v["version"].clone(), v["revision"].clone()))
        .collect();
    assert_eq!(
        listed,
        [(json!("1.0.0"), json!(2)), (json!("1.0.0"), json!(1))]
    );

    // Not even a direct write can change what a deployed row means.
    let rewrite = sqlx::query("UPDATE definition_versions SET manifest_yaml = 'rewritten'")
        .execute(&h.app.state.pool)
        .await;
    let refusal = rewrite.expect_err("rows are immutable").to_string();
    assert!(refusal.contains("immutable"), "{refusal}");
}

#[tokio::test]
async fn a_workflow_execution_reports_the_revision_it_ran() {
    let h = harness(vec![]).await;
    let (code, first) = h.deploy("/v1/workflows", &workflow("before")).await;
    assert_eq!(code, 201, "{first}");
    let digest_1 = first["manifest_digest"].as_str().unwrap().to_owned();
    let start = |body: Value| {
        let h = &h;
        async move {
            let (code, started) = h
                .send(Method::POST, "/v1/workflows/say/run", Some(body))
                .await;
            assert_eq!(code, 201, "{started}");
            let id = started["execution_id"].as_str().unwrap().to_owned();
            (
                id.clone(),
                h.ended(&format!("/v1/workflows/executions/{id}")).await,
            )
        }
    };
    let (run_1, ended) = start(json!({"input": {}})).await;
    assert_eq!(ended["final_output"], json!({"said": "before"}), "{ended}");

    let (code, second) = h
        .deploy("/v1/workflows?force=true", &workflow("after"))
        .await;
    assert_eq!(code, 200, "{second}");
    assert_eq!(second["revision"], 2, "{second}");
    let digest_2 = second["manifest_digest"].as_str().unwrap().to_owned();

    // REST and both status tools still name what the first run ran.
    let e = h
        .app
        .get_value(&format!("/v1/workflows/executions/{run_1}"))
        .await;
    assert_eq!(
        picked(&e, &["revision", "manifest_digest", "final_output"]),
        [json!(1), json!(digest_1), json!({"said": "before"})],
        "{e}"
    );
    for tool in ["aegis.workflow.status", "aegis.workflow.executions.get"] {
        let (code, status) = h.app.call_tool(tool, json!({"execution_id": run_1})).await;
        assert_eq!(code, 200, "{status}");
        let text = status["structuredContent"].to_string();
        assert!(
            text.contains(&digest_1) && !text.contains(&digest_2),
            "{tool}: {text}"
        );
    }

    // A new run runs the new revision.
    let (_, ended) = start(json!({"input": {}})).await;
    assert_eq!(
        picked(&ended, &["revision", "manifest_digest", "final_output"]),
        [json!(2), json!(digest_2), json!({"said": "after"})],
        "{ended}"
    );
}
