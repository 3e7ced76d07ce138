//! Issue 10, item 8: a privileged call (its capability sets `require_approval`) waits for an
//! operator, who approves or rejects it through REST or the CLI; a timeout refuses it; every
//! step is audited; read-only keys never see the arguments.

use crate::common;

use std::time::Duration;

use aegis_cli::seal_client::{SealClient, Transport};
use common::refusal::refused;
use common::{test_config, TestApp, TestDb};
use reqwest::Method;
use serde_json::{json, Value};

const ARG_SECRET: &str = "needs-approval-SECRET";

async fn app(db: &TestDb) -> TestApp {
    let mut config = test_config(&db.url);
    config.seal.security_contexts = vec![json!({
        "name": "privileged", "description": "tier 3: pause for confirmation first",
        "capabilities": [
            {"tool_pattern": "aegis.tools.search", "require_approval": true, "approval_timeout_secs": 60},
            {"tool_pattern": "aegis.schema.get", "require_approval": true, "approval_timeout_secs": 1},
            {"tool_pattern": "aegis.agent.list"}],
        "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}})];
    TestApp::spawn_with(config).await
}

/// Polls `GET /v1/approvals` until a pending request for `tool` shows up.
async fn pending(app: &TestApp, key: &str, tool: &str) -> Value {
    for _ in 0..300 {
        let list = app.rest_as(key).get_value("/v1/approvals").await;
        if let Some(found) = common::json::items(&list)
            .iter()
            .find(|a| a["tool"] == tool && a["state"] == "pending")
        {
            return found.clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no pending approval for {tool} appeared");
}

async fn decide(app: &TestApp, key: &str, id: &str, verdict: &str, note: &str) -> (u16, Value) {
    let path = format!("/v1/approvals/{id}/{verdict}");
    let note = json!({"note": note});
    app.rest_as(key)
        .send_json(Method::POST, &path, Some(note))
        .await
}

async fn session(app: &TestApp) -> std::sync::Arc<SealClient> {
    let mut client = SealClient::new(Transport::Http(app.http_base.clone())).unwrap();
    client.attest("test-p", "privileged").await.unwrap();
    std::sync::Arc::new(client)
}

#[tokio::test]
async fn a_privileged_call_waits_and_is_approved_rejected_or_times_out_each_audited() {
    let db = TestDb::create().await;
    let app = app(&db).await;
    let readonly = app.create_key("viewer", "readonly").await;
    let operator = app.create_key("oncall", "operator").await;
    let client = session(&app).await;

    // Calls without require_approval do not wait.
    let r = client
        .call_tool("aegis.agent.list", json!({}))
        .await
        .unwrap();
    assert_eq!(r["isError"], false);

    // 1. Approved through the CLI.
    let waiting = {
        let c = client.clone();
        tokio::spawn(async move {
            c.call_tool("aegis.tools.search", json!({"query": ARG_SECRET}))
                .await
        })
    };
    let seen_by_readonly = pending(&app, &readonly, "aegis.tools.search").await;
    assert_eq!(
        seen_by_readonly["arguments"],
        Value::Null,
        "{seen_by_readonly}"
    );
    assert!(!seen_by_readonly.to_string().contains(ARG_SECRET));
    assert_eq!(seen_by_readonly["security_context"], "privileged");
    let id = seen_by_readonly["id"].as_str().unwrap().to_owned();
    let seen_by_operator = app
        .rest_as(&operator)
        .get_value(&format!("/v1/approvals/{id}"))
        .await;
    assert_eq!(seen_by_operator["arguments"]["query"], ARG_SECRET);
    let (status, _) = decide(&app, &readonly, &id, "approve", "").await;
    assert_eq!(status, 403, "a readonly key cannot approve");
    assert!(!waiting.is_finished());
    let cli = |args: Vec<String>| {
        let base = app.http_base.clone();
        let key = operator.clone();
        async move {
            let mut all = vec!["approvals".to_owned()];
            all.extend(args);
            all.extend(["--url".to_owned(), base, "--json".to_owned()]);
            common::cli_json(&all, &[("ORCHESTRATOR_API_KEY", &key)]).await
        }
    };
    let listed = cli(vec!["list".into()]).await;
    assert!(common::json::items(&listed)
        .iter()
        .any(|a| a["id"] == id.as_str()));
    let approved = cli(vec![
        "approve".into(),
        id.clone(),
        "--note".into(),
        "looked fine".into(),
    ])
    .await;
    assert_eq!(approved["state"], "approved", "{approved}");
    assert_eq!(approved["arguments"], Value::Null, "erased once decided");
    let result = waiting.await.unwrap().expect("the approved call ran");
    assert_eq!(result["isError"], false, "{result}");
    let (status, body) = decide(&app, &operator, &id, "reject", "too late").await;
    assert_eq!(status, 409, "{body}");

    // 2. Rejected through REST: refused with 2001 and the operator's note.
    let waiting = {
        let c = client.clone();
        tokio::spawn(async move {
            c.call_tool("aegis.tools.search", json!({"query": "rm everything"}))
                .await
        })
    };
    let id = pending(&app, &operator, "aegis.tools.search").await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = decide(&app, &operator, &id, "reject", "not today").await;
    assert_eq!(status, 200, "{body}");
    let (code, status, message) = refused(waiting.await.unwrap());
    assert_eq!((code, status), (2001, 403), "{message}");
    assert!(
        message.contains("rejected") && message.contains("not today"),
        "{message}"
    );

    // 3. Nobody decides: refused after the capability's 1 s, and it cannot be approved later.
    let (code, _, message) = refused(
        client
            .call_tool("aegis.schema.get", json!({"key": "agent/manifest/v1"}))
            .await,
    );
    assert_eq!(code, 2001, "{message}");
    assert!(message.contains("within 1 s"), "{message}");
    let all = app
        .rest_as(&operator)
        .get_value("/v1/approvals?all=true")
        .await;
    let timed_out = common::json::find(&all, "tool", "aegis.schema.get");
    assert_eq!(timed_out["state"], "timed_out");
    let (status, _) = decide(
        &app,
        &operator,
        timed_out["id"].as_str().unwrap(),
        "approve",
        "",
    )
    .await;
    assert_eq!(status, 409);
    let pending_now = app.rest_as(&operator).get_value("/v1/approvals").await;
    assert_eq!(pending_now, json!([]));

    // Every step is in the audit log, which still verifies.
    let audit = app.get_value("/v1/audit?limit=500").await;
    let rows = audit["rows"].as_array().unwrap();
    // A call that runs leaves an intent row (outcome `running`) and a completion row: count
    // completions and refusals.
    let count = |action: &str, decision: &str| {
        rows.iter()
            .filter(|r| r["action"] == action && r["decision"] == decision)
            .filter(|r| r["outcome"] != "running")
            .count()
    };
    assert_eq!(count("approval.request", "allowed"), 3, "{audit}");
    let outcomes = |action: &str| {
        let mut o: Vec<String> = rows
            .iter()
            .filter(|r| r["action"] == action && r["outcome"] != "running")
            .map(|r| r["outcome"].as_str().unwrap().to_owned())
            .collect();
        o.sort();
        o
    };
    // The decisions refused as too late (409) are audited as well.
    assert_eq!(outcomes("approval.approve"), ["error", "ok"]);
    assert_eq!(outcomes("approval.reject"), ["error", "ok"]);
    assert_eq!(count("approval.timeout", "allowed"), 1);
    assert_eq!(count("aegis.tools.search", "allowed"), 1);
    assert_eq!(count("aegis.tools.search", "denied"), 1);
    assert_eq!(count("aegis.schema.get", "denied"), 1);
    assert!(!audit.to_string().contains(ARG_SECRET));
    let verify = app.get_value("/v1/audit/verify").await;
    assert_eq!(verify["valid"], true, "{verify}");

    // Decided requests keep no arguments in the database.
    let pool = db.pool().await;
    let kept = crate::common::count(
        &pool,
        "SELECT count(*) FROM tool_approvals WHERE arguments IS NOT NULL",
    )
    .await;
    assert_eq!(kept, 0);
}
