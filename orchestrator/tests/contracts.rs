//! What a run promises and what it ran, against the real service (PostgreSQL, Docker sandboxes,
//! the scripted model): a workflow's final output is held to `metadata.output_schema`, and a
//! deployed version keeps its meaning (a forced redeploy with other content is a new revision;
//! every execution records and reports the digest and revision of the manifest it ran).

mod common;

use std::time::{Duration, Instant};

use common::fake_llm::{FakeLlm, Step};
use common::{test_config, TestApp, TestDb};
use reqwest::Method;
use serde_json::{json, Value};

struct Harness {
    app: TestApp,
    _llm: FakeLlm,
    _db: TestDb,
}

async fn harness(script: Vec<Step>) -> Harness {
    let db = TestDb::create().await;
    let llm = FakeLlm::start(script).await;
    let mut config = test_config(&db.url);
    config.llm = llm.config();
    config.workflows.system_image = Some("aegis-runtime/busybox:1".to_owned());
    config.workflows.poll_interval_ms = 200;
    let app = TestApp::spawn_with(config).await;
    Harness {
        app,
        _llm: llm,
        _db: db,
    }
}

impl Harness {
    async fn send(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut r = self.app.admin(method, path);
        if let Some(body) = body {
            r = r.json(&body);
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn deploy(&self, path: &str, manifest: &str) -> (u16, Value) {
        let r = self
            .app
            .admin(Method::POST, path)
            .body(manifest.to_owned())
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    /// Polls `path` until its `status` is terminal.
    async fn ended(&self, path: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let (code, e) = self.send(Method::GET, path, None).await;
            assert_eq!(code, 200, "{e}");
            if ["completed", "failed", "cancelled", "timed_out"]
                .contains(&e["status"].as_str().unwrap_or_default())
            {
                return e;
            }
            assert!(Instant::now() < deadline, "never ended: {e}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
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
    let (_, events) = h
        .send(
            Method::GET,
            &format!("/v1/workflows/executions/{id}/events?limit=1000"),
            None,
        )
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
