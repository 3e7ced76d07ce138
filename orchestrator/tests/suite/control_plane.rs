//! The control plane through the real service: registry, tools via the router, API keys, audit,
//! and the OpenAPI document.

use crate::common;
use crate::common::workflow::workflow_manifest;

use common::TestApp;
use reqwest::Method;
use serde_json::{json, Value};

const AGENT_V1: &str = "apiVersion: 100monkeys.ai/v1
kind: Agent
metadata:
  name: greeter
  version: \"1.0.0\"
  description: Greets people.
  labels:
    team: platform
spec:
  runtime:
    language: python
    version: \"3.11\"
  task:
    instruction: Greet the person named in the input.
  tools: [aegis.schema.get]
";

fn workflow_v1() -> String {
    workflow_manifest(
        "two-steps",
        "START",
        "    START:
      kind: Agent
      agent: greeter
      input: \"{{input}}\"
      transitions:
        - {condition: on_success, target: DONE}
        - {condition: on_failure, target: FAILED}
    DONE: {kind: System, command: \"echo done\", transitions: []}
    FAILED: {kind: System, command: \"echo failed\", transitions: []}
",
    )
}

fn bump(manifest: &str, from: &str, to: &str) -> String {
    manifest.replacen(
        &format!("version: \"{from}\""),
        &format!("version: \"{to}\""),
        1,
    )
}

async fn get(app: &TestApp, path: &str) -> (u16, Value) {
    let r = app.response(Method::GET, path, None).await;
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn agents_deploy_version_export_and_delete_over_rest() {
    let app = TestApp::spawn().await;

    let (status, body) = app.post_yaml("/v1/agents", AGENT_V1).await;
    assert_eq!(status, 201, "{body}");
    let id = body["agent_id"].as_str().unwrap().to_owned();
    assert_eq!(body["name"], "greeter");
    assert_eq!(body["version"], "1.0.0");

    // Same version again: refused, then accepted with force; the same manifest changes nothing
    // (a changed one would be a new revision: tests/suite/contracts.rs).
    let (status, body) = app.post_yaml("/v1/agents", AGENT_V1).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("immutable"),
        "{body}"
    );
    let (status, body) = app.post_yaml("/v1/agents?force=true", AGENT_V1).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["replaced"].clone(), body["unchanged"].clone()),
        (json!(false), json!(true))
    );

    // A second version is kept beside the first; the latest wins lookups by name.
    let (status, body) = app
        .post_yaml("/v1/agents", &bump(AGENT_V1, "1.0.0", "1.10.0"))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["agent_id"], id.as_str(), "versions share the agent id");
    let (status, _) = app
        .post_yaml("/v1/agents", &bump(AGENT_V1, "1.0.0", "1.2.0"))
        .await;
    assert_eq!(status, 201);
    let (_, by_name) = get(&app, "/v1/agents/greeter").await;
    assert_eq!(by_name["version"], "1.10.0", "semver order, not text order");
    let (_, by_id) = get(&app, &format!("/v1/agents/{id}?version=1.0.0")).await;
    assert_eq!(by_id["version"], "1.0.0");
    let (_, versions) = get(&app, "/v1/agents/greeter/versions").await;
    let versions = common::json::strs(&versions, "version");
    assert_eq!(versions, ["1.10.0", "1.2.0", "1.0.0"]);
    let (_, list) = get(&app, "/v1/agents").await;
    assert_eq!(list.as_array().unwrap().len(), 1);

    // Export round-trips to an equal manifest.
    let (status, exported) = app
        .call_tool("aegis.agent.export", json!({"name": "greeter"}))
        .await;
    assert_eq!(status, 200);
    let yaml = common::json::string(&exported["structuredContent"]["manifest_yaml"]);
    let (_, valid) = app
        .call_tool(
            "aegis.schema.validate",
            json!({"kind": "agent", "manifest_yaml": yaml}),
        )
        .await;
    assert_eq!(valid["structuredContent"]["valid"], true, "{valid}");
    let (status, _) = app.post_yaml("/v1/agents?force=true", &yaml).await;
    assert_eq!(status, 200);
    let (_, again) = get(&app, "/v1/agents/greeter").await;
    assert_eq!(
        again["manifest"], by_name["manifest"],
        "export -> deploy keeps the manifest equal"
    );

    // Delete: gone for lookups, rows kept for history.
    app.answered(Method::DELETE, &format!("/v1/agents/{id}"), None, 200)
        .await;
    let (status, body) = get(&app, "/v1/agents/greeter").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        app.count("SELECT count(*) FROM definition_versions").await,
        3
    );
    app.answered(Method::DELETE, &format!("/v1/agents/{id}"), None, 404)
        .await;
}

#[tokio::test]
async fn workflows_deploy_through_rest_and_tools() {
    let app = TestApp::spawn().await;
    let (status, body) = app.post_yaml("/v1/workflows", &workflow_v1()).await;
    assert_eq!(status, 201, "{body}");
    assert!(body["workflow_id"].is_string());

    let v2 = bump(&workflow_v1(), "1.0.0", "1.1.0");
    let (status, out) = app
        .call_tool("aegis.workflow.update", json!({"manifest_yaml": v2}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(out["isError"], false, "{out}");
    assert_eq!(out["structuredContent"]["version"], "1.1.0");

    let (_, listed) = app.call_tool("aegis.workflow.list", json!({})).await;
    let wf = &listed["structuredContent"]["workflows"][0];
    assert_eq!(wf["name"], "two-steps");
    assert_eq!(wf["version"], "1.1.0");
    assert_eq!(wf["initial_state"], "START");

    let (_, exported) = app
        .call_tool("aegis.workflow.export", json!({"name": "two-steps"}))
        .await;
    let yaml = exported["structuredContent"]["manifest_yaml"]
        .as_str()
        .unwrap();
    let (_, check) = app
        .call_tool("aegis.workflow.validate", json!({"manifest_yaml": yaml}))
        .await;
    assert_eq!(check["structuredContent"]["valid"], true, "{check}");

    let (_, versions) = get(&app, "/v1/workflows/two-steps/versions").await;
    assert_eq!(versions.as_array().unwrap().len(), 2);

    let (_, deleted) = app
        .call_tool("aegis.workflow.delete", json!({"name": "two-steps"}))
        .await;
    assert_eq!(deleted["structuredContent"]["deleted"], true, "{deleted}");
    let (status, _) = get(&app, "/v1/workflows/two-steps").await;
    assert_eq!(status, 404);

    // Update of something that does not exist is an error, not a create.
    let (_, out) = app
        .call_tool(
            "aegis.workflow.update",
            json!({"manifest_yaml": workflow_v1()}),
        )
        .await;
    assert_eq!(out["isError"], true);
    assert_eq!(out["structuredContent"]["error"]["code"], "not_found");
}

#[tokio::test]
async fn agent_tools_create_update_list_export_delete() {
    let app = TestApp::spawn().await;
    let (status, out) = app
        .call_tool("aegis.agent.create", json!({"manifest_yaml": AGENT_V1}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(out["isError"], false, "{out}");
    assert_eq!(out["structuredContent"]["deployed"], true);
    assert!(common::json::text(&out["content"][0]["text"]).contains("greeter"));
    let id = common::json::string(&out["structuredContent"]["agent_id"]);

    let (_, out) = app
        .call_tool(
            "aegis.agent.update",
            json!({"manifest_yaml": bump(AGENT_V1, "1.0.0", "2.0.0")}),
        )
        .await;
    assert_eq!(out["structuredContent"]["version"], "2.0.0", "{out}");
    let (_, out) = app
        .call_tool(
            "aegis.agent.update",
            json!({"manifest_yaml": bump(AGENT_V1, "1.0.0", "2.0.0")}),
        )
        .await;
    assert_eq!(
        out["structuredContent"]["error"]["code"], "conflict",
        "{out}"
    );

    let (_, out) = app.call_tool("aegis.agent.list", json!({})).await;
    let agents = out["structuredContent"]["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 1);
    assert_eq!(agents[0]["version"], "2.0.0");
    assert_eq!(agents[0]["labels"]["team"], "platform");

    let (_, out) = app
        .call_tool("aegis.agent.delete", json!({"agent_id": id}))
        .await;
    assert_eq!(out["structuredContent"]["deleted"], true);
    let (_, out) = app
        .call_tool("aegis.agent.export", json!({"name": "greeter"}))
        .await;
    assert_eq!(out["structuredContent"]["error"]["code"], "not_found");
}

#[tokio::test]
async fn a_bad_manifest_is_explained_and_writes_nothing() {
    let app = TestApp::spawn().await;
    let bad = AGENT_V1.replace(
        "    language: python",
        "    language: python\n    privileged: true",
    );
    let (status, body) = app.post_yaml("/v1/agents", &bad).await;
    assert_eq!(status, 422, "{body}");
    let details = body["details"].as_array().expect("details");
    assert!(
        details
            .iter()
            .any(|d| d["path"] == "/spec/runtime/privileged" && d["line"] == 12),
        "{body}"
    );
    let (status, body) = app
        .post_yaml("/v1/agents", "kind: Agent\nmetadata: [unclosed\n")
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body["details"][0]["line"].is_number(), "{body}");

    // A tool that the catalog does not have is refused at deploy time.
    let unknown = AGENT_V1.replace("[aegis.schema.get]", "[aegis.schema.get, web.teleport]");
    let (status, body) = app.post_yaml("/v1/agents", &unknown).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("web.teleport"), "{body}");

    assert_eq!(app.count("SELECT count(*) FROM definitions").await, 0);
    assert_eq!(
        app.count("SELECT count(*) FROM definition_versions").await,
        0
    );
}

/// Every tool of the catalog, once with valid and once with invalid arguments.
/// Tested with real executions in tests/suite/workflows.rs.
const WORKFLOW_EXECUTION_TOOLS: &[&str] = &[
    "aegis.workflow.run",
    "aegis.workflow.signal",
    "aegis.workflow.cancel",
    "aegis.workflow.wait",
    "aegis.workflow.logs",
    "aegis.workflow.status",
    "aegis.workflow.executions.list",
    "aegis.workflow.executions.get",
    "aegis.workflow.remove",
];

#[tokio::test]
async fn every_tool_answers_valid_and_refuses_invalid_arguments() {
    let app = TestApp::spawn().await;
    let deployed = app
        .tool_result("aegis.agent.create", json!({"manifest_yaml": AGENT_V1}))
        .await;
    let agent_id = common::json::string(&deployed["agent_id"]);
    app.call_tool(
        "aegis.workflow.create",
        json!({"manifest_yaml": workflow_v1()}),
    )
    .await;

    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "aegis.schema.get",
            json!({"key": "agent/manifest/v1"}),
            json!({"key": 7}),
        ),
        (
            "aegis.schema.validate",
            json!({"kind": "workflow", "manifest_yaml": workflow_v1()}),
            json!({"kind": "agent"}),
        ),
        ("aegis.agent.list", json!({}), json!({"bogus": 1})),
        ("aegis.agent.export", json!({"name": "greeter"}), json!({})),
        (
            "aegis.agent.create",
            json!({"manifest_yaml": bump(AGENT_V1, "1.0.0", "3.0.0")}),
            json!({"manifest_yaml": 1}),
        ),
        (
            "aegis.agent.update",
            json!({"manifest_yaml": bump(AGENT_V1, "1.0.0", "3.1.0")}),
            json!({"force": true}),
        ),
        (
            "aegis.workflow.create",
            json!({"manifest_yaml": bump(&workflow_v1(), "1.0.0", "2.0.0")}),
            json!({"manifest_yaml": []}),
        ),
        (
            "aegis.workflow.update",
            json!({"manifest_yaml": bump(&workflow_v1(), "1.0.0", "2.1.0")}),
            json!({}),
        ),
        ("aegis.workflow.list", json!({}), json!({"scope": 5})),
        (
            "aegis.workflow.validate",
            json!({"manifest_yaml": workflow_v1()}),
            json!({"manifest": workflow_v1()}),
        ),
        (
            "aegis.workflow.export",
            json!({"name": "two-steps"}),
            json!({"name": false}),
        ),
        (
            "aegis.runtime.list",
            json!({"language": "python"}),
            json!({"language": 3}),
        ),
        ("aegis.tools.list", json!({"limit": 2}), json!({"limit": 0})),
        (
            "aegis.tools.search",
            json!({"query": "workflow"}),
            json!({"query": ["x"]}),
        ),
        ("aegis.system.info", json!({}), json!({"verbose": true})),
        ("aegis.system.config", json!({}), json!({"reveal": true})),
        (
            "aegis.workflow.promote",
            json!({"name": "two-steps"}),
            json!({"name": "two-steps", "target_scope": "user"}),
        ),
        (
            "aegis.workflow.demote",
            json!({"name": "two-steps"}),
            json!({"roles": ["aegis:operator"]}),
        ),
        (
            "aegis.workflow.delete",
            json!({"name": "two-steps"}),
            json!({"id": "x"}),
        ),
        (
            "aegis.agent.delete",
            json!({"agent_id": agent_id}),
            json!({"agent": "x"}),
        ),
        (
            "aegis.agent.search",
            json!({"query": "answer"}),
            json!({"query": "answer", "limit": 500}),
        ),
        (
            "aegis.workflow.search",
            json!({"query": "answer", "scope": "visible"}),
            json!({"query": "answer", "scope": "everything"}),
        ),
        (
            "aegis.memory.list",
            json!({"agent": "greeter", "owner": "*"}),
            json!({"agent": "Greeter"}),
        ),
        (
            "aegis.memory.erase",
            json!({"agent": "greeter"}),
            json!({"agent": "greeter", "note_id": "not-a-uuid"}),
        ),
    ];
    let (_, listed) = app.call_tool("aegis.tools.list", json!({})).await;
    let listed: Vec<String> = common::json::items(&listed["structuredContent"]["tools"])
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    for name in &listed {
        if orchestrator::policy::needs_sandbox(name)
            || name.starts_with("aegis.task.")
            || name == "aegis.agent.wait"
            || name == "aegis.agent.logs"
            || WORKFLOW_EXECUTION_TOOLS.contains(&name.as_str())
            || name.starts_with("web.")
            || name.starts_with("aegis.execute.")
            || name.ends_with(".generate")
            || orchestrator::memory::is_agent_tool(name)
        {
            // cmd.run and fs.* run in a real sandbox in tests/suite/sandboxes.rs; the execution
            // tools need a language model and are exercised in tests/suite/executions.rs; the
            // workflow execution tools need executions, in tests/suite/workflows.rs; web.* need
            // test sites and a search provider, in tests/suite/web.rs; the generators and the intent
            // pipeline need a model (and runtime images), in tests/suite/generate.rs and tests/suite/intent.rs;
            // an agent's memory tools need an execution with memory, in tests/suite/agent_memory.rs.
            continue;
        }
        assert!(
            cases.iter().any(|(n, _, _)| n == name),
            "catalog tool {name} has no test case here"
        );
    }
    for (name, good, bad) in cases {
        let (status, out) = app.call_tool(name, good.clone()).await;
        assert_eq!(status, 200, "{name} {good}: {out}");
        assert_eq!(out["isError"], false, "{name} {good}: {out}");
        assert!(out["structuredContent"].is_object(), "{name}: {out}");
        let (status, out) = app.call_tool(name, bad.clone()).await;
        assert_eq!(status, 422, "{name} {bad}: {out}");
        assert_eq!(out["code"], "invalid_arguments", "{name}: {out}");
        assert!(
            out["details"].as_array().is_some_and(|d| !d.is_empty()),
            "{name}: {out}"
        );
    }

    // Specific outputs the tool reference documents.
    let (_, out) = app
        .call_tool("aegis.schema.get", json!({"key": "workflow/manifest/v1"}))
        .await;
    assert!(out["structuredContent"]["properties"]["spec"].is_object());
    let (status, out) = app
        .call_tool("aegis.schema.get", json!({"key": "nope/v9"}))
        .await;
    assert_eq!(
        status, 422,
        "unknown schema keys are refused by the argument schema: {out}"
    );
    assert!(
        out["error"].as_str().unwrap().contains("agent/manifest/v1"),
        "{out}"
    );
    let (_, out) = app
        .call_tool("aegis.tools.search", json!({"query": "workflow"}))
        .await;
    let hits = out["structuredContent"]["tools"].as_array().unwrap();
    assert!(
        !hits.is_empty()
            && hits
                .iter()
                .all(|t| t["name"].as_str().unwrap().contains("workflow")
                    || t["description"]
                        .as_str()
                        .unwrap()
                        .to_lowercase()
                        .contains("workflow"))
    );
    let (_, out) = app.call_tool("aegis.system.config", json!({})).await;
    let yaml = out["structuredContent"]["content_yaml"].as_str().unwrap();
    assert!(
        !yaml.contains(common::TEST_ADMIN_KEY),
        "admin key leaked: {yaml}"
    );
    assert!(yaml.contains("***"));
    let (_, out) = app.call_tool("aegis.system.info", json!({})).await;
    assert_eq!(out["structuredContent"]["status"], "healthy", "{out}");
    let (status, out) = app.call_tool("web.teleport", json!({})).await;
    assert_eq!(status, 404, "{out}");
    assert_eq!(out["code"], "unknown_tool");
}

#[tokio::test]
async fn tiers_bound_what_a_caller_may_call() {
    use orchestrator::caller::{Caller, CallerKind, Tier};
    use orchestrator::tools::{invoke, CallError};

    let app = TestApp::spawn().await;
    let user = Caller {
        kind: CallerKind::Session,
        id: "session-under-test".into(),
        label: "test".into(),
        tier: Tier::User,
        role: None,
        tenant: orchestrator::DEFAULT_TENANT.into(),
        seal: None,
    };
    // User tier: user tools run; system and operator tools are refused with the reason.
    let ok = invoke(&app.state, &user, "aegis.agent.list", json!({}))
        .await
        .unwrap();
    assert!(ok.result.is_ok());
    for (tool, args, needs) in [
        (
            "aegis.agent.create",
            json!({"manifest_yaml": AGENT_V1}),
            "system",
        ),
        ("aegis.system.config", json!({}), "operator"),
        (
            "aegis.agent.delete",
            json!({"agent_id": uuid::Uuid::new_v4()}),
            "operator",
        ),
    ] {
        match invoke(&app.state, &user, tool, args).await {
            Err(CallError::Denied { denial, .. }) => {
                assert_eq!(denial.code, "tier");
                assert!(denial.message.contains(needs), "{}", denial.message);
            }
            other => panic!("{tool}: expected a tier refusal, got {other:?}"),
        }
    }
    // The system tier may deploy but not delete.
    let system = Caller {
        tier: Tier::System,
        ..user.clone()
    };
    let out = invoke(
        &app.state,
        &system,
        "aegis.agent.create",
        json!({"manifest_yaml": AGENT_V1}),
    )
    .await
    .unwrap();
    assert!(out.result.is_ok(), "{:?}", out.result);
    assert!(matches!(
        invoke(&app.state, &system, "aegis.system.info", json!({})).await,
        Err(CallError::Denied { .. })
    ));
    // Listings only show what the caller may call.
    let listed = invoke(&app.state, &user, "aegis.tools.list", json!({}))
        .await
        .unwrap()
        .result
        .unwrap();
    let names = common::json::strs(&listed["tools"], "name");
    assert!(names.contains(&"aegis.agent.list"));
    assert!(
        !names.contains(&"aegis.agent.create") && !names.contains(&"aegis.system.config"),
        "{names:?}"
    );
    // Refusals are audited with their reason.
    let denied = app
        .count("SELECT count(*) FROM audit_log WHERE caller_id = 'session-under-test' AND decision = 'denied' AND reason_code = 'tier'")
        .await;
    assert_eq!(denied, 4);
}

#[tokio::test]
async fn api_keys_authenticate_and_roles_authorise() {
    let app = TestApp::spawn().await;
    // No key, a malformed header, an unknown key: 401.
    let r = app
        .http
        .get(format!("{}/v1/agents", app.http_base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("Authorization"),
        "{body}"
    );
    let r = app
        .http
        .get(format!("{}/v1/agents", app.http_base))
        .header("authorization", "Basic abc")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    app.rest_as("aok_unknown")
        .answered(Method::GET, "/v1/agents", None, 401)
        .await;
    // Health and the OpenAPI document stay open.
    assert_eq!(app.get("/health/live").await.status(), 200);
    assert_eq!(app.get("/openapi.json").await.status(), 200);

    let readonly = app.create_key("viewer", "readonly").await;
    let operator = app.create_key("deployer", "operator").await;
    assert!(readonly.starts_with("aok_"));

    app.rest_as(&readonly)
        .answered(Method::GET, "/v1/agents", None, 200)
        .await;
    let r = app
        .with_key(Method::POST, "/v1/agents", &readonly)
        .body(AGENT_V1)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    app.rest_as(&readonly)
        .posted(
            "/v1/tools/call",
            json!({"name": "aegis.agent.list", "arguments": {}}),
            403,
        )
        .await;
    app.rest_as(&operator)
        .deployed("/v1/agents", AGENT_V1)
        .await;
    let r = app
        .rest_as(&operator)
        .response(Method::GET, "/v1/api-keys", None)
        .await;
    assert_eq!(r.status(), 403, "only admins manage keys");

    // Listings never show secrets; revocation is immediate.
    let (_, keys) = get(&app, "/v1/api-keys").await;
    assert!(
        !keys.to_string().contains(&operator[4..]),
        "secret leaked in listing"
    );
    let stored = app
        .count("SELECT count(*) FROM api_keys WHERE key_hash LIKE 'aok_%'")
        .await;
    assert_eq!(stored, 0, "keys are stored hashed");
    app.answered(Method::DELETE, "/v1/api-keys/deployer", None, 200)
        .await;
    let body = app
        .rest_as(&operator)
        .answered(Method::GET, "/v1/agents", None, 401)
        .await;
    assert!(
        body["error"].as_str().unwrap().contains("revoked"),
        "{body}"
    );

    // Expired keys are refused.
    let soon = (chrono::Utc::now() + chrono::Duration::seconds(1)).to_rfc3339();
    let (_, brief) = app
        .send_json(
            Method::POST,
            "/v1/api-keys",
            Some(json!({"name": "brief", "role": "operator", "expires_at": soon})),
        )
        .await;
    let brief = brief["key"].as_str().unwrap().to_owned();
    sqlx::query(
        "UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE name = 'brief'",
    )
    .execute(&app.state.pool)
    .await
    .unwrap();
    app.rest_as(&brief)
        .answered(Method::GET, "/v1/agents", None, 401)
        .await;

    // Key changes are audited as admin actions.
    let (_, page) = get(&app, "/v1/audit?tool=api_key.create").await;
    assert_eq!(page["rows"].as_array().unwrap().len(), 3);
}

/// A key this node has cached is refused soon after it is revoked elsewhere (another replica, or
/// psql): the change is announced by the `api_keys` trigger and the node drops the key, well
/// before the cache's own 60 s limit would.
#[tokio::test]
async fn a_key_revoked_behind_the_nodes_back_is_refused() {
    let app = TestApp::spawn().await;
    let key = app.create_key("elsewhere", "operator").await;
    let id: uuid::Uuid = sqlx::query_scalar("SELECT id FROM api_keys WHERE name = 'elsewhere'")
        .fetch_one(&app.state.pool)
        .await
        .unwrap();
    // Accepted, and so cached (once the node listens for key changes, just after it starts).
    for _ in 0..100 {
        answer_within(&app, Method::GET, "/v1/agents", &key, 200).await;
        if app.state.api_keys.holds(id) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(app.state.api_keys.holds(id), "the key was not cached");
    sqlx::query("UPDATE api_keys SET revoked_at = now() WHERE name = 'elsewhere'")
        .execute(&app.state.pool)
        .await
        .unwrap();
    let body = answer_within(&app, Method::GET, "/v1/agents", &key, 401).await;
    assert!(
        body["error"].as_str().unwrap().contains("revoked"),
        "{body}"
    );
    assert!(
        !app.state.api_keys.holds(id),
        "the revoked key is still cached"
    );

    // A role change is announced too: a demoted key loses its rights.
    let key = app.create_key("demoted", "operator").await;
    app.rest_as(&key).deployed("/v1/agents", AGENT_V1).await;
    sqlx::query("UPDATE api_keys SET role = 'readonly' WHERE name = 'demoted'")
        .execute(&app.state.pool)
        .await
        .unwrap();
    answer_within(&app, Method::DELETE, "/v1/agents/x-never-there", &key, 403).await;
}

/// Repeats a request with `key` until it answers `wanted` (at most 100 times, 50 ms apart);
/// the answer's body.
async fn answer_within(app: &TestApp, method: Method, path: &str, key: &str, wanted: u16) -> Value {
    let mut last = (0, Value::Null);
    for _ in 0..100 {
        let r = app.rest_as(key).response(method.clone(), path, None).await;
        let status = r.status().as_u16();
        last = (status, r.json().await.unwrap_or(Value::Null));
        if status == wanted {
            return last.1;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!(
        "{method} {path} still answered {} after 5 s (wanted {wanted}): {}",
        last.0, last.1
    );
}

#[tokio::test]
async fn the_audit_log_is_filterable_and_detects_an_edited_row() {
    let app = TestApp::spawn().await;
    app.call_tool("aegis.agent.create", json!({"manifest_yaml": AGENT_V1}))
        .await;
    app.call_tool("aegis.agent.list", json!({})).await;
    app.call_tool("aegis.agent.list", json!({"nope": 1})).await;
    app.call_tool("aegis.no.such", json!({})).await;

    let (_, all) = get(&app, "/v1/audit").await;
    let rows = all["rows"].as_array().unwrap();
    // Calls that ran: an intent before the tool, then its completion; refusals: one row.
    assert_eq!(rows.len(), 6, "{all}");
    let first = &rows[0];
    assert_eq!(first["action"], "aegis.agent.create");
    assert_eq!(first["outcome"], "running");
    assert_eq!(rows[1]["intent_id"], first["id"]);
    assert_eq!(rows[1]["outcome"], "ok");
    assert_eq!(first["caller_kind"], "api_key");
    assert!(common::json::text(&first["args_digest"]).starts_with("sha256:"));
    assert!(
        !all.to_string().contains("Greet the person"),
        "raw arguments must not be stored"
    );
    let (_, denied) = get(&app, "/v1/audit?decision=denied").await;
    let codes = common::json::strs(&denied["rows"], "reason_code");
    assert_eq!(codes, ["invalid_arguments", "unknown_tool"]);
    let (_, one) = get(&app, "/v1/audit?tool=aegis.agent.list&limit=1").await;
    assert_eq!(one["rows"].as_array().unwrap().len(), 1);
    let next = one["next_after"].as_i64().unwrap();
    let (_, two) = get(
        &app,
        &format!("/v1/audit?tool=aegis.agent.list&limit=1&after={next}"),
    )
    .await;
    assert_eq!(two["rows"].as_array().unwrap().len(), 1);
    assert_ne!(one["rows"][0]["seq"], two["rows"][0]["seq"]);
    let (_, none) = get(&app, "/v1/audit?since=2999-01-01T00:00:00Z").await;
    assert!(none["rows"].as_array().unwrap().is_empty());

    let (_, ok) = get(&app, "/v1/audit/verify").await;
    assert_eq!(ok["valid"], true, "{ok}");
    assert_eq!(ok["rows_checked"], 6);

    // Someone with database access rewrites history.
    let victim = rows[1]["seq"].as_i64().unwrap();
    sqlx::query("UPDATE audit_log SET decision = 'denied' WHERE seq = $1")
        .bind(victim)
        .execute(&app.state.pool)
        .await
        .unwrap();
    let (_, broken) = get(&app, "/v1/audit/verify?full=true").await;
    assert_eq!(broken["valid"], false, "{broken}");
    assert_eq!(broken["first_broken"]["seq"], victim);
    assert_eq!(broken["first_broken"]["problem"], "content_changed");
}

#[tokio::test]
async fn schemas_tools_and_openapi_are_served() {
    let app = TestApp::spawn().await;
    let (status, schema) = get(&app, "/v1/schemas/agent/manifest/v1").await;
    assert_eq!(status, 200);
    assert_eq!(schema["properties"]["kind"]["const"], "Agent", "{schema}");
    let (status, _) = get(&app, "/v1/schemas/agent/manifest/v9").await;
    assert_eq!(status, 404);

    let (_, tools) = get(&app, "/v1/tools").await;
    let tools = tools.as_array().unwrap();
    assert!(tools.iter().all(|t| t["inputSchema"]["type"] == "object"));

    let doc: Value = app.get("/openapi.json").await.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/v1/agents",
        "/v1/tools/call",
        "/v1/audit/verify",
        "/v1/api-keys",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }
    // Validate with an independent OpenAPI validator (installed by scripts/test.sh).
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), doc.to_string()).unwrap();
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; from openapi_spec_validator import validate; from openapi_spec_validator.readers import read_from_filename; validate(read_from_filename(sys.argv[1])[0]); print('valid')"])
        .arg(file.path())
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "openapi.json is not valid OpenAPI 3 (or openapi-spec-validator is missing: pip install openapi-spec-validator):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
