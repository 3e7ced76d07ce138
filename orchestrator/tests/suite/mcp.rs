//! The MCP endpoint (`/mcp`): driven by the official MCP Python SDK, and by raw HTTP for the
//! transport rules (Origin, keys, session end) that a well-behaved client never breaks.

use crate::common;

use std::time::Duration;

use common::{test_config, TestApp, TestDb};
use serde_json::{json, Value};

/// A context name of its own, so Docker label filters see only this test's sandboxes.
fn unique_context() -> String {
    format!("mcp-{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

async fn app_with_context(context: &str) -> (TestApp, TestDb) {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.seal.security_contexts = vec![json!({
        "name": context, "description": "what MCP clients of this test may do",
        "runtime": {"language": "busybox", "version": "1"},
        "capabilities": [
            {"tool_pattern": "fs.*", "path_allowlist": ["/workspace"]},
            {"tool_pattern": "cmd.run", "command_allowlist": ["cat"]},
            {"tool_pattern": "aegis.runtime.list"}],
        "attestation": {"allow_unverified": true}})];
    (TestApp::spawn_with(config).await, db)
}

/// Creates a key bound to `context`; returns (secret, key id).
async fn bound_key(app: &TestApp, context: &str) -> (String, String) {
    let r = app
        .response(
            reqwest::Method::POST,
            "/v1/api-keys",
            Some(&json!({"name": "mcp-client", "role": "readonly", "security_context": context})),
        )
        .await;
    assert_eq!(r.status(), 201);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["security_context"], context);
    (
        body["key"].as_str().expect("key").to_owned(),
        body["id"].as_str().expect("id").to_owned(),
    )
}

/// Containers of a context's sessions (running or not).
fn sandboxes_of(context: &str) -> Vec<String> {
    let label = format!("label=seal_context={context}");
    common::docker_lines(&["ps", "-aq", "--filter", &label])
}

/// Polls until the context has no container (bounded).
async fn wait_no_sandbox(context: &str) -> Vec<String> {
    for _ in 0..100 {
        let left = sandboxes_of(context);
        if left.is_empty() {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sandboxes_of(context)
}

#[tokio::test]
async fn the_official_python_client_lists_writes_reads_runs_and_is_refused() {
    let context = unique_context();
    let (app, _db) = app_with_context(&context).await;
    let (key, key_id) = bound_key(&app, &context).await;

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/mcp_client.py");
    let report = common::python_client::report(
        script,
        &[&app.http_base, &key],
        "the MCP Python client failed (needs `pip install mcp==2.3.0`, which scripts/test.sh does)",
    )
    .await;

    // tools/list: exactly what the context grants, with both schemas.
    let names = common::json::present_strs(&report["tools"], "name");
    assert!(
        names.contains(&"fs.read") && names.contains(&"cmd.run"),
        "{names:?}"
    );
    assert!(names.contains(&"aegis.runtime.list"), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("aegis.agent")),
        "{names:?}"
    );
    let fs_read = common::json::find(&report["tools"], "name", "fs.read");
    assert_eq!(fs_read["inputSchema"]["type"], "object", "{fs_read}");
    assert_eq!(fs_read["outputSchema"]["type"], "object", "{fs_read}");

    common::python_client::assert_wrote_read_and_ran(&report, "héllo from mcp ✓\n");
    // The policy refusal is a tool error the model can read, not a transport failure.
    assert_eq!(report["refused"]["isError"], true, "{report}");
    let refused = report["refused"]["content"][0]["text"]
        .as_str()
        .unwrap_or("");
    assert!(
        refused.contains("/etc/passwd") || refused.contains("path"),
        "{refused}"
    );

    // The session-less revision works with the same key.
    assert!(
        report["sessionless"]["tool_count"].as_u64().unwrap_or(0) >= 3,
        "{}",
        report["sessionless"]
    );
    assert_eq!(
        report["sessionless"]["runtime_list"]["isError"], false,
        "{}",
        report["sessionless"]
    );

    // Without a key: 401 pointing at the protected resource metadata, which exists.
    assert_eq!(report["no_key"]["status"], 401, "{report}");
    let hint = report["no_key"]["www_authenticate"].as_str().unwrap_or("");
    assert!(
        hint.starts_with("Bearer resource_metadata=\"")
            && hint.contains("/.well-known/oauth-protected-resource"),
        "{hint}"
    );
    let metadata: Value = app
        .get("/.well-known/oauth-protected-resource/mcp")
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(metadata["resource"], format!("{}/mcp", app.http_base));
    assert_eq!(metadata["bearer_methods_supported"], json!(["header"]));

    // Every call is audited under the key: 4 calls in the session + 1 session-less that ran
    // (intent + completion rows each), the refusal as a denial.
    let pool = &app.state.pool;
    let completed: i64 = common::one(
        pool,
        "SELECT count(*) FROM audit_log WHERE caller_id = $1 AND kind = 'tool' AND decision = 'allowed' AND outcome = 'ok'",
        &key_id,
    )
    .await;
    assert_eq!(
        completed, 4,
        "fs.write, fs.read, cmd.run, aegis.runtime.list"
    );
    let denied: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT action, reason_code FROM audit_log WHERE caller_id = $1 AND decision = 'denied'",
    )
    .bind(&key_id)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!(denied[0].0, "fs.read");

    // The client closed its session (DELETE): its sandbox is gone.
    assert_eq!(wait_no_sandbox(&context).await, Vec::<String>::new());
}

/// POSTs one JSON-RPC message; returns (status, session id header, the JSON-RPC answer if any).
async fn post(
    app: &TestApp,
    key: &str,
    session: Option<&str>,
    body: Value,
) -> (u16, Option<String>, Option<Value>) {
    common::mcp::request(app, reqwest::Method::POST, key, session, Some(body)).await
}

/// A node with a context of its own, a key bound to it and an MCP session of that key;
/// (the context, the node, its database, the key, the session).
async fn opened() -> (String, TestApp, TestDb, String, String) {
    let context = unique_context();
    let (app, db) = app_with_context(&context).await;
    let (key, _) = bound_key(&app, &context).await;
    let session = common::mcp::open_session(&app, &key).await;
    (context, app, db, key, session)
}

/// Writes a file through `session` (`fs.write` in the session's sandbox), which must succeed.
async fn write_a_file(app: &TestApp, key: &str, session: &str) {
    let result = common::mcp::call_tool(
        app,
        key,
        session,
        "fs.write",
        json!({"path": "/workspace/a.txt", "content": "x"}),
    )
    .await;
    assert_eq!(result["isError"], false, "{result}");
}

/// The status of a `tools/list` with `key` in `session`.
async fn list_status(app: &TestApp, key: &str, session: &str) -> u16 {
    let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"});
    post(app, key, Some(session), list).await.0
}

/// The `isError` of one `tools/call` of `aegis.runtime.list` in `session`.
async fn runtime_list_is_error(app: &TestApp, key: &str, session: &str, id: u64) -> Value {
    let (status, _, answer) = post(
        app,
        key,
        Some(session),
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "aegis.runtime.list", "arguments": {}}}),
    )
    .await;
    assert_eq!(status, 200);
    let answer = answer.expect("an answer");
    answer["result"]["isError"].clone()
}

#[tokio::test]
async fn an_edited_context_applies_to_the_next_request() {
    // The gate keeps parsed contexts; an edit must still reach the very next request.
    let (context, app, _db, key, session) = opened().await;
    assert_eq!(runtime_list_is_error(&app, &key, &session, 2).await, false);
    let edit = |tools: &str| {
        json!({"name": context, "description": "edited",
               "capabilities": [{"tool_pattern": tools}],
               "attestation": {"allow_unverified": true}})
    };
    app.posted("/v1/security-contexts", edit("fs.*"), 200).await;
    assert_eq!(runtime_list_is_error(&app, &key, &session, 3).await, true);
    app.posted("/v1/security-contexts", edit("aegis.runtime.*"), 200)
        .await;
    assert_eq!(runtime_list_is_error(&app, &key, &session, 4).await, false);

    // The node keeps the verified key with its context's version; an edit made behind its back
    // (another replica, psql) is announced and applies within moments, not after a TTL.
    let key_id: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM api_keys WHERE name = 'mcp-client'")
            .fetch_one(&app.state.pool)
            .await
            .expect("the key's row");
    let mut id = 5;
    while !app.state.api_keys.holds(key_id) && id < 105 {
        assert_eq!(runtime_list_is_error(&app, &key, &session, id).await, false);
        tokio::time::sleep(Duration::from_millis(50)).await;
        id += 1;
    }
    assert!(
        app.state.api_keys.holds(key_id),
        "the bound key was not cached"
    );
    sqlx::query(
        "UPDATE security_contexts SET definition = jsonb_set(definition, '{capabilities}',          '[{\"tool_pattern\": \"fs.*\"}]') WHERE name = $1",
    )
    .bind(&context)
    .execute(&app.state.pool)
    .await
    .expect("edited with SQL");
    let mut refused = false;
    for _ in 0..100 {
        id += 1;
        if runtime_list_is_error(&app, &key, &session, id).await == true {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused, "an edit made with SQL never reached the MCP door");
}

#[tokio::test]
async fn ending_the_session_destroys_its_sandbox() {
    let (context, app, _db, key, session) = opened().await;
    write_a_file(&app, &key, &session).await;
    assert_eq!(
        sandboxes_of(&context).len(),
        1,
        "one sandbox for the session"
    );

    // Another key may not use this session: it is answered as an unknown session.
    let (other, _) = bound_key(&app, &context).await;
    assert_eq!(list_status(&app, &other, &session).await, 404);

    let r = app
        .http
        .delete(format!("{}/mcp", app.http_base))
        .bearer_auth(&key)
        .header("Mcp-Session-Id", &session)
        .header("MCP-Protocol-Version", "2025-11-25")
        .send()
        .await
        .expect("request sent");
    // 204: what the official SDKs take as a successful end (rmcp's own answer is 202).
    assert_eq!(r.status(), 204, "{}", r.status());
    assert_eq!(wait_no_sandbox(&context).await, Vec::<String>::new());
    // Operators see the session ended.
    let live = "SELECT count(*) FROM seal_sessions WHERE context_name = $1 AND status = 'active'";
    app.assert_counts(live, &context, 0).await;
}

#[tokio::test]
async fn a_foreign_origin_an_unbound_key_and_an_unknown_context_are_refused() {
    let context = unique_context();
    let (app, _db) = app_with_context(&context).await;
    let (key, _) = bound_key(&app, &context).await;
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "o", "version": "0"}}});

    // A page on another site (DNS rebinding, CSRF) is refused before anything else; a local
    // origin passes; a name that resolves here by DNS rebinding is not this node's name.
    for (what, header, value, status, said) in [
        (
            "another site",
            "Origin",
            "http://evil.example",
            403,
            Some("evil.example"),
        ),
        (
            "a local origin",
            "Origin",
            "http://localhost:3000",
            200,
            None,
        ),
        ("a rebound name", "Host", "evil.example", 403, None),
    ] {
        let r = app
            .http
            .post(format!("{}/mcp", app.http_base))
            .bearer_auth(&key)
            .header(header, value)
            .header("Accept", "application/json, text/event-stream")
            .json(&initialize)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{what}");
        if let Some(said) = said {
            let body: Value = r.json().await.unwrap();
            assert!(
                common::json::text(&body["error"]["message"]).contains(said),
                "{what}: {body}"
            );
        }
    }

    // An operator key without a context has no business on /mcp.
    let plain = app.create_key("plain", "operator").await;
    let (status, _, answer) = post(&app, &plain, None, initialize.clone()).await;
    assert_eq!(status, 403);
    assert!(answer.unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not bound"));

    // A wrong key: 401 with the metadata hint.
    let (status, _, _) = post(&app, "aok_nope", None, initialize).await;
    assert_eq!(status, 401);

    // Binding to a context that does not exist is refused at creation.
    let body = app
        .posted(
            "/v1/api-keys",
            json!({"name": "k", "role": "readonly", "security_context": "no-such-context"}),
            400,
        )
        .await;
    assert!(body.to_string().contains("no-such-context"), "{body}");
}

#[tokio::test]
async fn an_idle_session_expires_with_its_sandbox() {
    let context = unique_context();
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.mcp.session_idle_secs = 1;
    config.seal.security_contexts = vec![json!({
        "name": context, "description": "idle sessions",
        "runtime": {"language": "busybox", "version": "1"},
        "capabilities": [{"tool_pattern": "fs.*", "path_allowlist": ["/workspace"]}],
        "attestation": {"allow_unverified": true}})];
    let app = TestApp::spawn_with(config).await;
    let (key, _) = bound_key(&app, &context).await;
    let session = common::mcp::open_session(&app, &key).await;
    write_a_file(&app, &key, &session).await;
    assert_eq!(sandboxes_of(&context).len(), 1);
    // No request for longer than the idle time: the session and its sandbox end.
    assert_eq!(wait_no_sandbox(&context).await, Vec::<String>::new());
    assert_eq!(
        list_status(&app, &key, &session).await,
        404,
        "an expired session is unknown; the client re-initializes"
    );
}
