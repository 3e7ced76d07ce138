//! One sandbox's history in the audit chain: every call that ran in it or was refused for it,
//! and its admin changes, carry its id; `GET /v1/audit?sandbox=` reads them and nothing else;
//! the id is under the row's hash, so moving a row to another sandbox in the database breaks
//! the chain.

use crate::common::{test_config, TestApp, TestDb};

use reqwest::Method;
use serde_json::{json, Value};

async fn made(app: &TestApp, key: &str, allow: &[&str]) -> String {
    let r = app
        .rest_as(key)
        .post_json(
            "/v1/sandboxes",
            &json!({"runtime": "busybox", "allow": allow}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let body: Value = r.json().await.expect("json");
    body["sandbox_id"].as_str().expect("sandbox id").to_owned()
}

async fn run(app: &TestApp, key: &str, sandbox: &str, command: &str) -> (u16, Value) {
    let r = app
        .rest_as(key)
        .post_json(
            "/v1/tools/call",
            &json!({"name": "cmd.run", "arguments": {"command": command}, "sandbox_id": sandbox}),
        )
        .await;
    (r.status().as_u16(), r.json().await.expect("json"))
}

async fn rows(app: &TestApp, query: &str) -> (u16, Value) {
    let r = app
        .response(Method::GET, &format!("/v1/audit?{query}"), None)
        .await;
    (r.status().as_u16(), r.json().await.expect("json"))
}

/// The whole chain verified.
async fn verify(app: &TestApp) -> Value {
    app.response(Method::GET, "/v1/audit/verify?full=true", None)
        .await
        .json()
        .await
        .expect("json")
}

/// (action, decision, outcome) of each row, in chain order.
fn summary(page: &Value) -> Vec<(String, String, String)> {
    crate::common::json::items(&page["rows"])
        .iter()
        .map(|r| {
            (
                r["action"].as_str().unwrap_or("").to_owned(),
                r["decision"].as_str().unwrap_or("").to_owned(),
                r["outcome"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_sandboxs_rows_are_found_by_its_id_and_moving_one_breaks_the_chain() {
    let db = TestDb::create().await;
    let app = TestApp::spawn_with(test_config(&db.url)).await;
    let owner = app.create_key("owner", "operator").await;
    let intruder = app.create_key("intruder", "operator").await;
    let ours = made(&app, &owner, &["echo"]).await;
    let theirs = made(&app, &intruder, &["echo"]).await;

    // In ours: a command that runs, one outside its allowlist, and another key's attempt.
    let (status, body) = run(&app, &owner, &ours, "echo hello").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = run(&app, &owner, &ours, "cat /etc/passwd").await;
    assert_eq!(status, 403, "not in the allowlist: {body}");
    let (status, body) = run(&app, &intruder, &ours, "echo in").await;
    assert!(
        status == 403 || status == 404,
        "another key is refused: {status} {body}"
    );
    // In theirs: a command of its own key, which must not show in ours.
    let (status, body) = run(&app, &intruder, &theirs, "echo elsewhere").await;
    assert_eq!(status, 200, "{body}");

    let (status, page) = rows(&app, &format!("sandbox={ours}")).await;
    assert_eq!(status, 200, "{page}");
    let every = page["rows"].as_array().expect("rows");
    assert!(
        every.iter().all(|r| r["sandbox_id"] == json!(ours)),
        "only rows of {ours}: {page:#}"
    );
    let own = |what: (&str, &str, &str)| (what.0.into(), what.1.into(), what.2.into());
    assert_eq!(
        summary(&page),
        vec![
            own(("sandbox.create", "allowed", "ok")),
            own(("cmd.run", "allowed", "running")),
            own(("cmd.run", "allowed", "ok")),
            own(("cmd.run", "denied", "denied")),
            own(("cmd.run", "denied", "denied")),
        ],
        "{page:#}"
    );
    let callers: Vec<&str> = every
        .iter()
        .filter_map(|r| r["caller_id"].as_str())
        .collect();
    assert_eq!(
        callers.iter().filter(|c| **c == callers[0]).count(),
        4,
        "four rows are the owner's, one the intruder's: {callers:?}"
    );
    // The filter composes with the others.
    let (_, denied) = rows(&app, &format!("sandbox={ours}&decision=denied")).await;
    assert_eq!(summary(&denied).len(), 2, "{denied:#}");
    let (_, elsewhere) = rows(&app, &format!("sandbox={theirs}&tool=cmd.run")).await;
    assert_eq!(summary(&elsewhere).len(), 2, "{elsewhere:#}");
    // Calls outside any sandbox carry none.
    let (_, keys) = rows(&app, "tool=api_key.create").await;
    assert!(
        crate::common::json::items(&keys["rows"])
            .iter()
            .all(|r| r["sandbox_id"].is_null()),
        "{keys:#}"
    );

    // A bad id is refused, naming the parameter.
    let (status, body) = rows(&app, "sandbox=not-a-uuid").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("sandbox"), "{body}");

    // Destroyed: the change is in its history too.
    app.rest_as(&owner)
        .answered(Method::DELETE, &format!("/v1/sandboxes/{ours}"), None, 200)
        .await;
    let (_, page) = rows(&app, &format!("sandbox={ours}&tool=sandbox.destroy")).await;
    assert_eq!(
        summary(&page),
        vec![own(("sandbox.destroy", "allowed", "ok"))],
        "{page:#}"
    );

    // The chain holds; a row moved to another sandbox in the database breaks it at that row.
    let verified = verify(&app).await;
    assert_eq!(verified["valid"], json!(true), "{verified:#}");
    let moved = every[1]["seq"].as_i64().expect("seq");
    let pool = db.pool().await;
    sqlx::query("UPDATE audit_log SET sandbox_id = $1::uuid WHERE seq = $2")
        .bind(&theirs)
        .bind(moved)
        .execute(&pool)
        .await
        .expect("the row is moved");
    let verified = verify(&app).await;
    assert_eq!(verified["valid"], json!(false), "{verified:#}");
    assert_eq!(
        verified["first_broken"]["seq"],
        json!(moved),
        "{verified:#}"
    );
}
