//! `aegis.agent.generate` and `aegis.workflow.generate` against the real service, PostgreSQL and
//! the scripted model (tests/suite/common/fake_llm.rs): drafts that fail the schema and the semantic
//! checks are answered with their errors (pointer and line) until a valid one comes; nothing is
//! deployed unless asked; the attempts are bounded.

use crate::common;
use crate::common::agent::AgentManifest;
use crate::common::workflow::workflow_manifest;

use common::fake_llm::{answer, FakeLlm, Step};
use common::{test_config, TestApp, TestDb};
use serde_json::{json, Value};

async fn app_with(script: Vec<Step>) -> (TestApp, FakeLlm, TestDb) {
    let db = TestDb::create().await;
    let llm = FakeLlm::start(script).await;
    let mut config = test_config(&db.url);
    config.llm = llm.config();
    let app = TestApp::spawn_with(config).await;
    (app, llm, db)
}

/// Unknown key `instructions` (schema error at /spec/task/...).
fn schema_error() -> String {
    AgentManifest::new("greeter")
        .runtime("python", "3.11")
        .instruction("Greet the user.")
        .yaml()
        .replace("    instruction:", "    instructions:")
}

/// Valid shape, but a runtime this node does not have (semantic error).
fn semantic_error() -> String {
    AgentManifest::new("greeter")
        .runtime("cobol", "85")
        .instruction("Greet the user.")
        .yaml()
}

fn valid() -> String {
    AgentManifest::new("greeter")
        .metadata("  description: Greets people\n")
        .runtime("python", "3.11")
        .instruction("Greet the user.")
        .yaml()
}

/// The text of the last message of a recorded chat request.
fn last_message(request: &Value) -> String {
    request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn an_agent_manifest_becomes_valid_after_two_refused_drafts_and_is_deployed_when_asked() {
    let (app, llm, db) = app_with(vec![
        answer(&schema_error()),
        answer(&semantic_error()),
        answer(&format!("Here it is:\n```yaml\n{}```\n", valid())),
    ])
    .await;
    let (status, out) = app
        .call_tool(
            "aegis.agent.generate",
            json!({"input": "an agent that greets people", "deploy": true}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["isError"], false, "{out}");
    let result = &out["structuredContent"];
    assert_eq!(result["valid"], true);
    assert_eq!(result["name"], "greeter");
    assert_eq!(
        result["manifest_yaml"].as_str().map(str::trim),
        Some(valid().trim())
    );
    let attempts = result["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 3, "{result}");
    assert_eq!(attempts[2]["valid"], true);

    // Each refused draft's errors, with pointer and line, went back to the model.
    let requests = llm.requests();
    assert_eq!(requests.len(), 3);
    for (i, attempt) in attempts[..2].iter().enumerate() {
        assert_eq!(attempt["valid"], false);
        let errors = attempt["errors"].as_array().expect("errors");
        assert!(!errors.is_empty(), "{attempt}");
        let fed_back = last_message(&requests[i + 1]);
        for e in errors {
            let pointer = e["path"].as_str().expect("path");
            assert!(pointer.starts_with("/spec/"), "{e}");
            assert!(fed_back.contains(pointer), "{pointer} not in {fed_back}");
            let line = e["line"].as_u64().expect("line of a YAML draft");
            assert!(fed_back.contains(&format!("line {line}")), "{fed_back}");
        }
    }
    assert!(
        last_message(&requests[1]).contains("/spec/task/instructions"),
        "{}",
        last_message(&requests[1])
    );
    assert!(last_message(&requests[2]).contains("semantic"));
    // The model saw its own drafts in the conversation.
    assert!(requests[2]["messages"].to_string().contains("cobol"));

    // Deployed through aegis.agent.create: listed, exported as generated, and audited as such.
    assert_eq!(result["deployed"], true);
    assert_eq!(result["deployment"]["name"], "greeter");
    let (_, list) = app.call_tool("aegis.agent.list", json!({})).await;
    assert_eq!(list["structuredContent"]["agents"][0]["name"], "greeter");
    let pool = db.pool().await;
    let actions: Vec<String> =
        sqlx::query_scalar("SELECT action FROM audit_log WHERE kind = 'tool' ORDER BY seq")
            .fetch_all(&pool)
            .await
            .expect("audit rows");
    let generate = actions.iter().position(|a| a == "aegis.agent.generate");
    let create = actions.iter().position(|a| a == "aegis.agent.create");
    assert!(generate.is_some() && create.is_some(), "{actions:?}");
}

#[tokio::test]
async fn nothing_is_deployed_unless_asked_and_the_attempts_are_bounded() {
    let (app, llm, _db) = app_with(vec![
        answer(&valid()),
        answer(&schema_error()),
        answer(&schema_error()),
        answer(&valid()),
    ])
    .await;
    // A valid first draft, not deployed.
    let (_, out) = app
        .call_tool("aegis.agent.generate", json!({"input": "a greeter"}))
        .await;
    assert_eq!(out["isError"], false, "{out}");
    assert_eq!(out["structuredContent"]["deployed"], false);
    assert_eq!(
        out["structuredContent"]["attempts"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    let (_, list) = app.call_tool("aegis.agent.list", json!({})).await;
    assert_eq!(list["structuredContent"]["agents"], json!([]), "{list}");

    // Two attempts allowed, two invalid drafts: a failure with every attempt's errors.
    let (_, out) = app
        .call_tool(
            "aegis.agent.generate",
            json!({"input": "a greeter", "max_attempts": 2, "deploy": true}),
        )
        .await;
    assert_eq!(out["isError"], true, "{out}");
    let error = &out["structuredContent"]["error"];
    assert_eq!(error["code"], "generation_failed");
    let attempts = error["details"]["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2);
    assert!(attempts.iter().all(|a| a["valid"] == false));
    // The third draft of the script was never asked for, and nothing was deployed.
    assert_eq!(llm.remaining(), 1);
    let (_, list) = app.call_tool("aegis.agent.list", json!({})).await;
    assert_eq!(list["structuredContent"]["agents"], json!([]));

    // An unknown model alias is refused before any draft.
    let (_, out) = app
        .call_tool(
            "aegis.agent.generate",
            json!({"input": "a greeter", "model": "nonexistent"}),
        )
        .await;
    assert_eq!(out["isError"], true);
    assert!(out.to_string().contains("nonexistent"), "{out}");
    assert_eq!(llm.remaining(), 1);
}

#[tokio::test]
async fn a_workflow_manifest_is_generated_against_the_callers_registry() {
    // The first draft has a state kind that does not exist (schema); the second a transition to
    // a state that does not exist (semantic); the third is valid.
    let draft = |kind: &str, target: &str| {
        workflow_manifest(
            "greet-flow",
            "GREET",
            &format!(
                "    GREET:
      kind: {kind}
      agent: greeter
      input: \"Greet {{{{input.name}}}}\"
      transitions:
        - condition: on_success
          target: {target}
    DONE:
      kind: System
      command: \"echo done\"
      transitions: []
"
            ),
        )
    };
    let (app, llm, _db) = app_with(vec![
        answer(&draft("Robot", "DONE")),
        answer(&draft("Agent", "NOWHERE")),
        answer(&draft("Agent", "DONE")),
    ])
    .await;
    let (_, out) = app
        .call_tool("aegis.agent.create", json!({"manifest_yaml": valid()}))
        .await;
    assert_eq!(out["isError"], false, "{out}");
    let (_, out) = app
        .call_tool(
            "aegis.workflow.generate",
            json!({"input": "greet someone, then finish", "deploy": true}),
        )
        .await;
    assert_eq!(out["isError"], false, "{out}");
    let result = &out["structuredContent"];
    let attempts = result["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 3, "{result}");
    let requests = llm.requests();
    assert!(
        last_message(&requests[1]).contains("/spec/states/GREET/kind"),
        "{}",
        last_message(&requests[1])
    );
    assert!(
        last_message(&requests[2]).contains("/spec/states/GREET/transitions/0/target"),
        "{}",
        last_message(&requests[2])
    );
    assert_eq!(result["deployed"], true);
    let (_, list) = app.call_tool("aegis.workflow.list", json!({})).await;
    assert_eq!(
        list["structuredContent"]["workflows"][0]["name"],
        "greet-flow"
    );
}
