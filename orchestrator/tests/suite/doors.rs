//! One decision per call, on every door (issue 20, items 6-9): a key or session bound to a
//! security context is confined by it on REST, SEAL over HTTP and gRPC, and MCP alike, directly
//! and through tools that call other tools (a generator's deploy); an MCP session belongs to the
//! key that opened it; a caller never approves its own privileged call. Each test is the attack
//! as it was reproduced against the running service, with the refusal and its effect checked.

use crate::common;
use crate::common::workflow::workflow_manifest;

use std::time::Duration;

use aegis_cli::seal_client::{ClientError, SealClient, Transport};
use common::agent::AgentManifest;
use common::fake_llm::{answer, FakeLlm};
use common::{mcp, test_config, TestApp, TestDb};
use reqwest::Method;
use serde_json::{json, Value};

/// The context every door of the matrix is bound to: the `aegis.agent.*` family is covered,
/// but creating and listing agents are on the deny list, and the tier would allow creating.
const CONFINED: &str = "confined";

/// A valid agent a generator drafts; deploying it would need `aegis.agent.create`.
fn draft() -> String {
    AgentManifest::new("smuggled")
        .metadata("  description: Deployed through a generator\n")
        .instruction("Say hello.")
        .yaml()
}

fn contexts() -> Vec<Value> {
    vec![
        json!({
            "name": CONFINED, "description": "may draft agents, never create or list them",
            "tier": "system",
            "runtime": {"language": "busybox", "version": "1"},
            "capabilities": [
                {"tool_pattern": "aegis.agent.*"},
                {"tool_pattern": "aegis.runtime.list"},
                {"tool_pattern": "fs.*", "path_allowlist": ["/workspace"]}],
            "deny_list": ["aegis.agent.create", "aegis.agent.list"],
            "attestation": {"workload_patterns": ["door-*"], "allow_unverified": true}}),
        json!({
            "name": "privileged", "description": "runtime listings wait for an operator",
            "capabilities": [
                {"tool_pattern": "aegis.runtime.list", "require_approval": true, "approval_timeout_secs": 60}],
            "attestation": {"workload_patterns": ["door-*"], "allow_unverified": true}}),
    ]
}

async fn app_with_llm(drafts: usize) -> (TestApp, FakeLlm, TestDb) {
    let db = TestDb::create().await;
    let llm = FakeLlm::start(
        (0..drafts)
            .map(|_| answer(&format!("```yaml\n{}```\n", draft())))
            .collect(),
    )
    .await;
    let mut config = test_config(&db.url);
    config.llm = llm.config();
    config.seal.security_contexts = contexts();
    (TestApp::spawn_with(config).await, llm, db)
}

/// An API key of `role` bound to `context`; returns (secret, id).
async fn bound_key(app: &TestApp, name: &str, role: &str, context: &str) -> (String, String) {
    app.create_bound_key(name, role, context).await
}

/// True when no agent named `smuggled` was deployed (asked as admin, who may list).
async fn nothing_deployed(app: &TestApp) -> bool {
    let r = app.response(Method::GET, "/v1/agents/smuggled", None).await;
    r.status() == 404
}

/// A `tools/call` over MCP; returns the JSON-RPC result (with `isError`).
async fn mcp_call(app: &TestApp, key: &str, session: &str, name: &str, arguments: Value) -> Value {
    mcp::call_tool(app, key, session, name, arguments).await
}

fn generate_and_deploy() -> Value {
    json!({"input": "an agent that says hello", "deploy": true, "max_attempts": 1})
}

#[tokio::test]
async fn every_door_confines_a_bound_caller_directly_and_through_a_generator() {
    let (app, llm, _db) = app_with_llm(4).await;
    let manifest = json!({"manifest_yaml": draft()});

    // REST, with an operator-role key bound to the context (the role alone would allow all).
    let (key, _) = bound_key(&app, "door-rest", "operator", CONFINED).await;
    let (status, body) = app
        .call_tool_as(&key, "aegis.agent.create", manifest.clone())
        .await;
    assert_eq!(status, 403, "REST direct create: {body}");
    let (status, body) = app.call_tool_as(&key, "aegis.agent.list", json!({})).await;
    assert_eq!(status, 403, "REST direct list: {body}");
    let (status, body) = app
        .call_tool_as(&key, "aegis.agent.generate", generate_and_deploy())
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["isError"], true, "REST generate+deploy: {body}");
    assert!(
        nothing_deployed(&app).await,
        "deployed through REST generate"
    );
    // The REST deploy route is a tool call too.
    let r = app
        .with_key(Method::POST, "/v1/agents", &key)
        .header("content-type", "application/yaml")
        .body(draft())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "{}", r.text().await.unwrap_or_default());
    assert!(nothing_deployed(&app).await);

    // SEAL over HTTP and over gRPC.
    for transport in [
        Transport::Http(app.http_base.clone()),
        Transport::Grpc(format!("http://{}", app.grpc_addr)),
    ] {
        let label = format!("{transport:?}");
        let mut client = SealClient::new(transport).unwrap();
        client.attest("door-seal", CONFINED).await.unwrap();
        for (tool, args) in [
            ("aegis.agent.create", manifest.clone()),
            ("aegis.agent.list", json!({})),
        ] {
            match client.call_tool(tool, args).await {
                Err(ClientError::Refused { code, .. }) => {
                    assert!((2000..3000).contains(&code), "{label} {tool}: code {code}")
                }
                other => panic!("{label} {tool} was not refused: {other:?}"),
            }
        }
        let out = client
            .call_tool("aegis.agent.generate", generate_and_deploy())
            .await
            .unwrap();
        assert_eq!(out["isError"], true, "{label} generate+deploy: {out}");
        assert!(nothing_deployed(&app).await, "deployed through {label}");
    }

    // MCP.
    let (key, _) = bound_key(&app, "door-mcp", "operator", CONFINED).await;
    let session = mcp::open_session(&app, &key).await;
    let direct = mcp_call(&app, &key, &session, "aegis.agent.create", manifest.clone()).await;
    assert_eq!(direct["isError"], true, "MCP direct create: {direct}");
    let nested = mcp_call(
        &app,
        &key,
        &session,
        "aegis.agent.generate",
        generate_and_deploy(),
    )
    .await;
    assert_eq!(nested["isError"], true, "MCP generate+deploy: {nested}");
    assert!(
        nothing_deployed(&app).await,
        "deployed through MCP generate"
    );

    // Every generator ran (the refusal came from the nested create, not from the generator),
    // and the nested creates were refused by the context, audited as such.
    assert_eq!(llm.remaining(), 0, "each door's generator drafted once");
    let nested_refusals = app
        .count("SELECT count(*) FROM audit_log WHERE action = 'aegis.agent.create' AND decision = 'denied'")
        .await;
    assert!(
        nested_refusals >= 8,
        "direct and nested creates audited: {nested_refusals}"
    );
}

#[tokio::test]
async fn a_bound_key_on_rest_reaches_only_what_its_context_grants() {
    let (app, _llm, _db) = app_with_llm(0).await;
    let (key, key_id) = bound_key(&app, "bound-operator", "operator", CONFINED).await;

    // Granted by the context: answered.
    let (status, body) = app
        .call_tool_as(&key, "aegis.runtime.list", json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["isError"], false, "{body}");
    // Listed tools are the context's.
    let listed = app.rest_as(&key).get_value("/v1/tools").await;
    let names = common::json::present_strs(&listed, "name");
    assert!(names.contains(&"aegis.runtime.list"), "{names:?}");
    assert!(!names.contains(&"aegis.agent.list"), "{names:?}");
    assert!(!names.contains(&"cmd.run"), "{names:?}");

    // Denied by the context: refused with the SEAL reason, nothing listed.
    let (status, body) = app.call_tool_as(&key, "aegis.agent.list", json!({})).await;
    assert_eq!(status, 403, "{body}");

    // Routes that act outside the router are closed to a confined key.
    // Containers first owned by this key (tests beside this one make sandboxes of their own).
    let owned = || {
        common::docker_lines(&[
            "ps",
            "-aq",
            "--filter",
            &format!("label=org.aegis.owner-id={key_id}"),
        ])
    };
    let body = app
        .rest_as(&key)
        .posted("/v1/sandboxes", json!({"runtime": "busybox"}), 403)
        .await;
    assert_eq!(body["code"], "key_bound", "{body}");
    assert_eq!(owned(), Vec::<String>::new(), "no container was made");
    // Refused before any handler, and still one audited row, as the router's refusals are.
    let bound_refusals: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'POST /v1/sandboxes' AND outcome = 'denied' \
         AND decision = 'denied' AND reason_code = 'key_bound' AND caller_id = $1",
    )
    .bind(&key_id)
    .fetch_one(&app.state.pool)
    .await
    .unwrap();
    assert_eq!(bound_refusals, 1, "the bound key's refusal is audited");
    for (method, path) in [
        (Method::GET, "/v1/agents"),
        (Method::GET, "/v1/sandboxes"),
        (Method::GET, "/v1/audit"),
        (Method::GET, "/v1/security-contexts"),
        (Method::POST, "/v1/api-keys"),
    ] {
        let r = app
            .rest_as(&key)
            .response(method.clone(), path, Some(&json!({})))
            .await;
        assert_eq!(r.status(), 403, "{method} {path}");
    }

    // An operator's sandbox cannot be borrowed by naming it.
    let sandbox = app
        .posted("/v1/sandboxes", json!({"runtime": "busybox"}), 201)
        .await;
    let id = sandbox["sandbox_id"].as_str().unwrap().to_owned();
    let body = json!({
        "name": "fs.write",
        "sandbox_id": id,
        "arguments": {"path": "/workspace/planted.txt", "content": "x"},
    });
    let r = app.rest_as(&key).post_json("/v1/tools/call", &body).await;
    assert_eq!(r.status(), 404, "another's sandbox is not found");
    // The router refused it, so the refusal is one audited row like any other.
    let refused: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'fs.write' AND outcome = 'denied' \
         AND reason_code = 'sandbox_unavailable' AND caller_id = $1",
    )
    .bind(&key_id)
    .fetch_one(&app.state.pool)
    .await
    .unwrap();
    assert_eq!(refused, 1, "the refusal is audited");
    // Checked from inside the sandbox: nothing was written.
    let (status, listing) = {
        let body = json!({
            "name": "fs.list",
            "sandbox_id": id,
            "arguments": {"path": "/workspace"},
        });
        let r = app.post_json("/v1/tools/call", &body).await;
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(status, 200, "{listing}");
    assert!(!listing.to_string().contains("planted.txt"), "{listing}");
    let r = app
        .response(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert!(r.status().is_success());

    // An unbound operator key keeps its full reach.
    let plain = app.create_key("plain-operator", "operator").await;
    let (status, body) = app
        .call_tool_as(&plain, "aegis.agent.list", json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn an_mcp_session_answers_only_the_key_that_opened_it() {
    let (app, _llm, _db) = app_with_llm(0).await;
    let (owner, _) = bound_key(&app, "mcp-owner", "operator", CONFINED).await;
    let (intruder, _) = bound_key(&app, "mcp-intruder", "operator", CONFINED).await;
    let session = mcp::open_session(&app, &owner).await;
    let wrote = mcp_call(
        &app,
        &owner,
        &session,
        "fs.write",
        json!({"path": "/workspace/mine.txt", "content": "kept"}),
    )
    .await;
    assert_eq!(wrote["isError"], false, "{wrote}");

    // Another key: every method on the session is answered as for an unknown session.
    for method in [Method::POST, Method::GET, Method::DELETE] {
        let body = (method == Method::POST)
            .then(|| json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}));
        let (status, _, _) =
            mcp::request(&app, method.clone(), &intruder, Some(&session), body).await;
        assert_eq!(status, 404, "{method} with another key's session");
    }

    // The owner's session and its sandbox are untouched: the file is still there.
    let read = mcp_call(
        &app,
        &owner,
        &session,
        "fs.read",
        json!({"path": "/workspace/mine.txt"}),
    )
    .await;
    assert_eq!(read["isError"], false, "{read}");
    assert!(read.to_string().contains("kept"), "{read}");

    // The owner may end it.
    let (status, _, _) = mcp::request(&app, Method::DELETE, &owner, Some(&session), None).await;
    assert!((200..300).contains(&status), "{status}");
}

#[tokio::test]
async fn a_caller_cannot_approve_its_own_privileged_call() {
    let (app, _llm, _db) = app_with_llm(0).await;
    let (key, key_id) = bound_key(&app, "self-approver", "operator", "privileged").await;
    let session = mcp::open_session(&app, &key).await;

    // The call waits for an operator.
    let waiting = {
        let base = app.http_base.clone();
        let key = key.clone();
        let session = session.clone();
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{base}/mcp"))
                .bearer_auth(&key)
                .header("Accept", "application/json, text/event-stream")
                .header("MCP-Protocol-Version", "2025-11-25")
                .header("Mcp-Session-Id", &session)
                .json(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                    "params": {"name": "aegis.runtime.list", "arguments": {}}}))
                .send()
                .await
                .expect("sent")
                .text()
                .await
                .unwrap_or_default()
        })
    };
    let mut id = None;
    for _ in 0..300 {
        id = sqlx::query_scalar::<_, uuid::Uuid>(
            "SELECT id FROM tool_approvals WHERE caller_id = $1 AND status = 'pending'",
        )
        .bind(&key_id)
        .fetch_optional(&app.state.pool)
        .await
        .unwrap();
        if id.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let id = id.expect("the call waits for approval");

    // The same key tries to approve it over REST: refused.
    app.rest_as(&key)
        .posted(
            &format!("/v1/approvals/{id}/approve"),
            json!({"note": "looks fine to me"}),
            403,
        )
        .await;
    // And the rule holds in the core, whatever door a decider comes through: the principal
    // whose call waits is refused.
    let same = orchestrator::caller::Caller {
        kind: orchestrator::caller::CallerKind::ApiKey,
        id: key_id.clone(),
        label: "self-approver".into(),
        tier: orchestrator::caller::Tier::Operator,
        role: Some(orchestrator::caller::Role::Operator),
        tenant: orchestrator::DEFAULT_TENANT.into(),
        seal: None,
    };
    let own = orchestrator::approvals::decide(
        &app.state.pool,
        orchestrator::DEFAULT_TENANT,
        id,
        orchestrator::approvals::Decision::Approve,
        &same,
        None,
    )
    .await;
    assert!(
        matches!(
            own,
            Err(orchestrator::approvals::DecisionError::OwnCall { .. })
        ),
        "{own:?}"
    );
    let status: String = app
        .one("SELECT status FROM tool_approvals WHERE id = $1", id)
        .await;
    assert_eq!(status, "pending", "nothing was decided");
    assert!(!waiting.is_finished(), "the call still waits");

    // Someone else decides it.
    let other = app.create_key("second-person", "operator").await;
    app.rest_as(&other)
        .posted(
            &format!("/v1/approvals/{id}/reject"),
            json!({"note": "no"}),
            200,
        )
        .await;
    let answer = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the call ends once decided")
        .unwrap();
    assert!(answer.contains("\"isError\":true"), "{answer}");
    let decided_by: String = app
        .one("SELECT decided_by FROM tool_approvals WHERE id = $1", id)
        .await;
    assert_ne!(decided_by, key_id);
}

/// An agent that runs `echo` in its sandbox, and a workflow whose one state runs it.
fn runner() -> String {
    AgentManifest::new("runner")
        .instruction("Run echo.")
        .tools(&["cmd.run"])
        .cmd_allowing(&["echo"])
        .yaml()
}

fn runs_runner() -> String {
    workflow_manifest(
        "runs-runner",
        "RUN",
        "    RUN:
      kind: Agent
      agent: runner
      input: go
      transitions: []
",
    )
}

#[tokio::test]
async fn a_workflow_started_by_a_confined_key_runs_its_agents_under_that_key_s_context() {
    let db = TestDb::create().await;
    let llm = FakeLlm::start(vec![
        common::fake_llm::tool_calls(&[("cmd__run", json!({"command": "echo escaped"}))]),
        answer("done"),
    ])
    .await;
    let mut config = test_config(&db.url);
    config.llm = llm.config();
    config.workflows.poll_interval_ms = 200;
    let mut contexts = contexts();
    contexts.push(json!({
        "name": "runs-workflows", "description": "may start workflows, may not run commands",
        "capabilities": [{"tool_pattern": "aegis.workflow.*"}],
        "attestation": {"allow_unverified": true}}));
    config.seal.security_contexts = contexts;
    let app = TestApp::spawn_with(config).await;
    for (path, manifest) in [("/v1/agents", runner()), ("/v1/workflows", runs_runner())] {
        app.deployed(path, &manifest).await;
    }

    let (key, _) = bound_key(&app, "starts-workflows", "operator", "runs-workflows").await;
    let id = app
        .rest_as(&key)
        .started("/v1/workflows/runs-runner/run", json!({}))
        .await;

    let ended = app
        .until_ended(
            &format!("/v1/workflows/executions/{id}"),
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(
        llm.remaining(),
        0,
        "the agent asked for the command: {ended}"
    );

    // The agent was not given the command (the starter's context does not grant it): the
    // model's call was answered as unavailable, and no command ran.
    let requests = llm.requests();
    let last = requests.last().expect("requests").to_string();
    assert!(last.contains("is not available to this agent"), "{last}");
    let offered = requests[0]["tools"].to_string();
    assert!(!offered.contains("cmd__run"), "offered: {offered}");
    let refused: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT caller_kind, reason_code FROM audit_log WHERE action = 'cmd.run' AND decision = 'denied'",
    )
    .fetch_all(&app.state.pool)
    .await
    .unwrap();
    assert_eq!(
        refused,
        vec![("execution".to_owned(), Some("tool_not_offered".to_owned()))],
        "the refusal is audited"
    );
    let ran = app
        .count("SELECT count(*) FROM audit_log WHERE action = 'cmd.run' AND decision = 'allowed'")
        .await;
    assert_eq!(ran, 0, "{ended}");
}

/// A sandbox's lifecycle is one path too (issue 43): E2B's pause, snapshot, fork and kill and
/// REST's destroy of another key's sandbox are refused by the router's one ownership rule,
/// each refusal leaves one denied row, and the sandbox runs on, checked from inside it.
#[tokio::test]
async fn another_keys_lifecycle_calls_are_refused_by_the_router_and_audited() {
    let app = TestApp::spawn().await;
    let owner = app.create_key("lifecycle-owner", "operator").await;
    let other = app.create_key("lifecycle-other", "operator").await;
    let other_id: String = app
        .one(
            "SELECT id::text FROM api_keys WHERE name = $1",
            "lifecycle-other",
        )
        .await;
    let (e2b_id, token, current) = common::e2b_base_sandbox(&app, &owner).await;
    let e2b = |method: Method, path: String| {
        app.http
            .request(method, format!("{}/e2b{path}", app.http_base))
            .header("X-API-KEY", common::e2b_key(&other))
            .json(&json!({}))
            .send()
    };
    let attempts = [
        (
            Method::POST,
            format!("/sandboxes/{e2b_id}/pause"),
            "e2b.sandbox.pause",
        ),
        (
            Method::POST,
            format!("/sandboxes/{e2b_id}/snapshots"),
            "e2b.snapshot.create",
        ),
        (
            Method::POST,
            format!("/sandboxes/{e2b_id}/fork"),
            "e2b.sandbox.fork",
        ),
        (
            Method::DELETE,
            format!("/sandboxes/{e2b_id}"),
            "e2b.sandbox.kill",
        ),
    ];
    for (method, path, _) in &attempts {
        let r = e2b(method.clone(), path.clone())
            .await
            .expect("request sent");
        assert_eq!(r.status(), 404, "{method} {path} with another key");
    }
    // REST names the dispatcher's sandbox: another key's, and one that does not exist.
    let unknown = uuid::Uuid::new_v4().to_string();
    for id in [&current, &unknown] {
        app.rest_as(&other)
            .answered(Method::DELETE, &format!("/v1/sandboxes/{id}"), None, 404)
            .await;
    }

    // One denied row per refusal, each the router's shape, none allowed.
    for (_, _, action) in &attempts {
        app.assert_counts(
            &format!(
                "SELECT count(*) FROM audit_log WHERE action = '{action}' AND caller_id = $1 \
                 AND decision = 'denied' AND outcome = 'denied' \
                 AND reason_code = 'sandbox_unavailable'"
            ),
            &other_id,
            1,
        )
        .await;
    }
    let destroys = audit_rows(&app, "sandbox.destroy", "=", &other_id).await;
    assert_eq!(
        destroys,
        vec![
            (
                "denied".to_owned(),
                "denied".to_owned(),
                Some(current.clone())
            ),
            ("denied".to_owned(), "denied".to_owned(), Some(unknown)),
        ],
        "each refusal names the sandbox it was asked for"
    );
    app.assert_counts(
        "SELECT count(*) FROM audit_log WHERE caller_id = $1 AND decision = 'allowed' \
         AND (action LIKE 'e2b.%' OR action = 'sandbox.destroy')",
        &other_id,
        0,
    )
    .await;

    // From inside: the owner's sandbox still runs its first container, with no snapshot
    // taken and no fork made.
    let alive = common::docker_lines(&[
        "exec",
        &format!("aegis-sbx-{current}"),
        "sh",
        "-c",
        "echo alive",
    ]);
    assert_eq!(alive, vec!["alive".to_owned()]);
    assert_eq!(
        app.e2b_sandbox(&e2b_id).await,
        current,
        "not paused or moved"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM e2b_snapshots").await,
        0,
        "no snapshot was taken"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM e2b_sandboxes").await,
        1,
        "no fork was made"
    );

    // The owner's calls are counted under the E2B door's own label, not REST's.
    let e2b_writes = || async {
        let (_, text) = app
            .rest_as(&owner)
            .text(Method::GET, "/metrics", None)
            .await;
        text.lines()
            .filter(|l| {
                l.starts_with("aegis_tool_calls_total{")
                    && l.contains("door=\"e2b\"")
                    && l.contains("tool=\"fs.write\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let before = e2b_writes().await;
    let r = app
        .http
        .post(format!(
            "{}/e2b/files?path=/home/user/counted",
            app.http_base
        ))
        .header("E2b-Sandbox-Id", &e2b_id)
        .header("X-Access-Token", &token)
        .header("Content-Type", "application/octet-stream")
        .body("counted")
        .send()
        .await
        .expect("request sent");
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert!(
        e2b_writes().await > before,
        "an E2B upload is counted as door=\"e2b\""
    );

    // The owner's own kill goes through the same path: allowed, one row, the container gone.
    let r = app
        .http
        .delete(format!("{}/e2b/sandboxes/{e2b_id}", app.http_base))
        .header("X-API-KEY", common::e2b_key(&owner))
        .send()
        .await
        .expect("request sent");
    assert_eq!(r.status(), 204);
    assert_eq!(
        audit_rows(&app, "e2b.sandbox.kill", "<>", &other_id).await,
        vec![("allowed".to_owned(), "ok".to_owned(), Some(current.clone()))]
    );
}

/// (decision, outcome, sandbox id) of the `action` rows whose caller is (`=`) or is not (`<>`)
/// `caller_id`, oldest first.
async fn audit_rows(
    app: &TestApp,
    action: &str,
    caller_is: &str,
    caller_id: &str,
) -> Vec<(String, String, Option<String>)> {
    sqlx::query_as(&format!(
        "SELECT decision, outcome, sandbox_id::text FROM audit_log \
         WHERE action = $1 AND caller_id {caller_is} $2 ORDER BY seq"
    ))
    .bind(action)
    .bind(caller_id)
    .fetch_all(&app.state.pool)
    .await
    .expect("audit rows")
}
