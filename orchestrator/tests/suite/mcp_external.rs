//! External MCP servers as tools (`mcp_servers`, `mcp:<server>/<tool>`), against a real MCP
//! server this file starts: tests/python/mcp_test_server.py, written with the official Python
//! SDK (`mcp` 2.3.0), Streamable HTTP on 127.0.0.1 with a port the kernel picks, demanding a
//! bearer token the node reads from its environment. Loopback is reachable only because these
//! nodes open it on purpose (`egress.allow_cidrs: [127.0.0.1/32]`), as an operator opens an
//! internal range; the egress tests below show what happens without that.

use crate::common;
use crate::common::agent::AgentManifest;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::fake_llm::{answer, tool_calls, FakeLlm};
use common::net::trap;
use common::{test_config, TestApp, TestDb};
use orchestrator::config::NodeConfig;
use orchestrator::mcp_servers::McpServerConfig;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

/// The test MCP server, stopped when dropped.
struct McpTestServer {
    child: tokio::process::Child,
    port: u16,
    calls: tempfile::NamedTempFile,
}

impl McpTestServer {
    /// Starts the server demanding `token`; returns once its socket listens.
    async fn start(token: &str) -> Self {
        Self::start_in(token, "sse-session").await
    }

    /// [`McpTestServer::start`] in a transport mode of the script (`json-stateless`).
    async fn start_in(token: &str, mode: &str) -> Self {
        Self::start_with(token, mode, None).await
    }

    /// [`McpTestServer::start`] with the careless tools that repeat `leaked`, the value of a
    /// header the node sends, and the token.
    async fn start_leaky(token: &str, leaked: &str) -> Self {
        Self::start_with(token, "sse-session", Some(leaked)).await
    }

    async fn start_with(token: &str, mode: &str, leaky: Option<&str>) -> Self {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/mcp_test_server.py"
        );
        let calls = tempfile::NamedTempFile::new().expect("calls file");
        let mut child = tokio::process::Command::new("python3")
            .arg(script)
            .arg(token)
            .env("MCP_TEST_CALLS", calls.path())
            .env("MCP_TEST_MODE", mode)
            .env("MCP_TEST_LEAKY", leaky.unwrap_or_default())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs (mcp==2.3.0 installed by scripts/test.sh)");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the MCP test server starts within 60 s")
            .expect("read its stdout")
            .expect("it prints its port (is `mcp` 2.3.0 installed?)");
        let port = line
            .strip_prefix("PORT ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line: {line}"));
        Self { child, port, calls }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// The tool calls that reached the server, in order.
    fn calls(&self) -> Vec<Value> {
        std::fs::read_to_string(self.calls.path())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    async fn stop(&mut self) {
        let _ = self.child.kill().await;
    }
}

/// A token in a variable of this process (the node's environment) under a name of its own.
fn token_variable() -> (String, String) {
    let var = format!("MCP_EXT_TOKEN_{}", uuid::Uuid::new_v4().simple());
    let token = format!("tok-{}", uuid::Uuid::new_v4().simple());
    std::env::set_var(&var, &token);
    (var, token)
}

fn server_config(name: &str, url: &str, token_var: &str, extra: Value) -> McpServerConfig {
    let mut entry = json!({"name": name, "url": url, "bearer_token_env": token_var});
    if let (Some(entry), Value::Object(extra)) = (entry.as_object_mut(), extra) {
        entry.extend(extra);
    }
    serde_json::from_value(entry).expect("a server entry")
}

/// A node that may reach loopback, with `servers`.
fn node(db: &TestDb, servers: Vec<McpServerConfig>) -> NodeConfig {
    let mut config = test_config(&db.url);
    config.egress.allow_cidrs = vec!["127.0.0.1/32".to_owned()];
    config.mcp_servers = servers;
    config
}

/// (outcome, reason_code) of the audit rows of `action`, in order.
/// The audit rows of one call refused for `reason`: (decision, outcome, reason code).
fn denied_once(reason: &str) -> Vec<(String, String, Option<String>)> {
    vec![("denied".into(), "denied".into(), Some(reason.into()))]
}

/// A tool call as the holder of `key` that must fail with the error `code`; the answer.
async fn tool_failed(app: &TestApp, key: &str, tool: &str, arguments: Value, code: &str) -> Value {
    let (_, body) = app.call_tool_as(key, tool, arguments).await;
    assert_eq!(
        body["structuredContent"]["error"]["code"], code,
        "{tool}: {body}"
    );
    body
}

async fn audit_rows(app: &TestApp, action: &str) -> Vec<(String, String, Option<String>)> {
    sqlx::query_as(
        "SELECT decision, outcome, reason_code FROM audit_log WHERE action = $1 ORDER BY seq",
    )
    .bind(action)
    .fetch_all(&app.state.pool)
    .await
    .expect("audit rows")
}

fn adder() -> String {
    AgentManifest::new("adder")
        .instruction("Add the numbers with the tool.")
        .tools(&["mcp:tools/add"])
        .yaml()
}

#[tokio::test]
async fn an_agent_calls_a_tool_of_an_external_mcp_server_and_a_tool_outside_its_manifest_is_refused(
) {
    let (var, token) = token_variable();
    let server = McpTestServer::start(&token).await;
    let db = TestDb::create().await;
    let llm = FakeLlm::start(vec![
        tool_calls(&[("mcp_tools__add", json!({"a": 2, "b": 3}))]),
        // The server has `shout`, but the manifest offers only `add`.
        tool_calls(&[("mcp_tools__shout", json!({"text": "hi"}))]),
        answer("5"),
    ])
    .await;
    let mut config = node(
        &db,
        vec![server_config("tools", &server.url(), &var, json!({}))],
    );
    config.llm = llm.config();
    let app = TestApp::spawn_with(config).await;

    app.deployed("/v1/agents", &adder()).await;
    let r = app
        .post_json("/v1/agents/adder/execute", &json!({"input": {}}))
        .await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    let id = r.json::<Value>().await.unwrap()["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let ended = app
        .until_ended(&format!("/v1/executions/{id}"), Duration::from_secs(60))
        .await;
    assert_eq!(ended["status"], "completed", "{ended}");

    // The model was offered the server's `add` with the schema the server listed, nothing else.
    let requests = llm.requests();
    let offered = &requests[0]["tools"];
    let names: Vec<&str> = common::json::items(offered)
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert_eq!(names, ["mcp_tools__add"], "{offered}");
    let schema = &offered[0]["function"]["parameters"];
    assert_eq!(schema["properties"]["a"]["type"], "integer", "{schema}");
    assert_eq!(schema["required"], json!(["a", "b"]), "{schema}");

    // The server's answer came back to the model.
    let tool_message = common::json::items(&requests[1]["messages"])
        .iter()
        .rfind(|m| m["role"] == "tool")
        .cloned()
        .unwrap();
    let content: Value = serde_json::from_str(tool_message["content"].as_str().unwrap()).unwrap();
    assert_eq!(content["content"][0]["text"], "5", "{content}");
    assert_eq!(content["truncated"], false);
    // The refusal of the tool outside the manifest came back too.
    let refusal = requests[2]["messages"].to_string();
    assert!(
        refusal.contains("mcp:tools/shout") && refusal.contains("not available to this agent"),
        "{refusal}"
    );

    // Audited as every tool call is: intent, then completion; the refusal as a denial.
    assert_eq!(
        audit_rows(&app, "mcp:tools/add").await,
        vec![
            ("allowed".into(), "running".into(), None),
            ("allowed".into(), "ok".into(), None)
        ]
    );
    let completion_names_intent: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM audit_log c JOIN audit_log i ON c.intent_id = i.id \
         WHERE c.action = 'mcp:tools/add' AND i.action = 'mcp:tools/add' AND c.outcome = 'ok')",
    )
    .fetch_one(&app.state.pool)
    .await
    .unwrap();
    assert!(completion_names_intent);
    assert_eq!(
        audit_rows(&app, "mcp:tools/shout").await,
        denied_once("tool_not_offered")
    );
    // Only `add` reached the server, with the node's credential (the server refuses others).
    assert_eq!(
        server.calls(),
        vec![json!({"tool": "add", "arguments": {"a": 2, "b": 3}})]
    );
}

#[tokio::test]
async fn external_tools_are_listed_with_schemas_checked_decided_bounded_and_fail_clearly() {
    let (var, token) = token_variable();
    let mut server = McpTestServer::start(&token).await;
    let db = TestDb::create().await;
    let mut config = node(
        &db,
        vec![
            server_config(
                "tools",
                &server.url(),
                &var,
                json!({"timeout_secs": 2, "max_result_bytes": 1000, "max_response_bytes": 20000}),
            ),
            // The same server again, for operators only.
            server_config(
                "admin-tools",
                &server.url(),
                &var,
                json!({"tier": "operator"}),
            ),
        ],
    );
    config.seal.security_contexts = vec![
        json!({"name": "user-mcp", "description": "user tier, every tool", "tier": "user",
               "capabilities": [{"tool_pattern": "*"}],
               "attestation": {"allow_unverified": true}}),
        json!({"name": "elsewhere", "description": "add, but only towards another host",
               "capabilities": [{"tool_pattern": "aegis.tools.list"},
                                {"tool_pattern": "mcp:tools/add", "domain_allowlist": ["mcp.example.org"]}],
               "attestation": {"allow_unverified": true}}),
    ];
    let app = TestApp::spawn_with(config).await;
    let admin = common::TEST_ADMIN_KEY;

    // Listed, with the schemas the server gave, under their server's name.
    let (status, listed) = app
        .call_tool("aegis.tools.list", json!({"source": "tools"}))
        .await;
    assert_eq!(status, 200, "{listed}");
    let tools = listed["structuredContent"]["tools"]
        .as_array()
        .unwrap()
        .clone();
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "mcp:tools/add",
            "mcp:tools/big",
            "mcp:tools/fail",
            "mcp:tools/leak",
            "mcp:tools/shout",
            "mcp:tools/slow"
        ]
    );
    let add = &tools[0];
    assert_eq!(add["source"], "tools");
    assert_eq!(add["category"], "mcp");
    assert_eq!(add["description"], "Adds two integers.");
    assert_eq!(
        add["inputSchema"]["properties"]["b"]["type"], "integer",
        "{add}"
    );

    // A call that works, and one whose arguments break the listed schema (never sent).
    let (status, body) = app
        .call_tool_as(admin, "mcp:tools/add", json!({"a": 40, "b": 2}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["structuredContent"]["content"][0]["text"], "42",
        "{body}"
    );
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("aegis_tool_calls_total{")
                && l.contains(r#"tool="mcp""#)
                && l.contains(r#"decision="allowed""#)),
        "external tools are counted under one label"
    );
    let (status, body) = app
        .call_tool_as(admin, "mcp:tools/add", json!({"a": "forty"}))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        server.calls().len(),
        1,
        "the invalid call never reached the server"
    );

    // Unknown names: a tool the server does not list, a server the node does not have.
    for name in ["mcp:tools/teleport", "mcp:nowhere/add", "mcp:tools"] {
        let (status, body) = app.call_tool_as(admin, name, json!({})).await;
        assert_eq!(status, 404, "{name}: {body}");
    }

    // The server's tool error, a result cut to max_result_bytes, one over max_response_bytes.
    let (status, body) = app.call_tool_as(admin, "mcp:tools/fail", json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["isError"], true);
    let error = &body["structuredContent"]["error"];
    assert_eq!(error["code"], "mcp_tool_error", "{body}");
    assert!(
        common::json::text(&error["message"]).contains("failed on purpose"),
        "{body}"
    );
    // A server that repeats the node's credential in an error: the caller and the audit log
    // see `***`.
    let (_, body) = app.call_tool_as(admin, "mcp:tools/leak", json!({})).await;
    let message = body["structuredContent"]["error"]["message"]
        .as_str()
        .unwrap();
    assert!(
        message.contains("Authorization: ***") && !body.to_string().contains(&token),
        "{body}"
    );
    let reasons: Vec<Option<String>> =
        sqlx::query_scalar("SELECT reason FROM audit_log WHERE action = 'mcp:tools/leak'")
            .fetch_all(&app.state.pool)
            .await
            .unwrap();
    assert!(
        reasons.iter().flatten().all(|r| !r.contains(&token)),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().flatten().any(|r| r.contains("***")),
        "{reasons:?}"
    );
    let fails = |tool, arguments, code| tool_failed(&app, admin, tool, arguments, code);
    let (_, body) = app
        .call_tool_as(admin, "mcp:tools/big", json!({"n": 5000}))
        .await;
    let out = &body["structuredContent"];
    assert_eq!(out["truncated"], true, "{body}");
    assert!(
        out["content"][0]["text"].as_str().unwrap().len() <= 1000,
        "{body}"
    );
    fails("mcp:tools/big", json!({"n": 50000}), "mcp_result_too_large").await;

    // A call that outlives the server's timeout ends at the timeout, with a clear error.
    let started = Instant::now();
    fails("mcp:tools/slow", json!({"seconds": 30}), "mcp_timeout").await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let (_, body) = app
        .call_tool_as(admin, "mcp:tools/add", json!({"a": 1, "b": 1}))
        .await;
    assert_eq!(
        body["structuredContent"]["content"][0]["text"], "2",
        "the session still works: {body}"
    );

    // The tier of the server: a caller of the user tier sees and calls `tools`, not `admin-tools`.
    let (user, _) = app
        .create_bound_key("user-key", "operator", "user-mcp")
        .await;
    let (status, body) = app.call_tool_as(&user, "aegis.tools.list", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let seen = body["structuredContent"]["tools"].to_string();
    assert!(
        seen.contains("mcp:tools/add") && !seen.contains("mcp:admin-tools/"),
        "{seen}"
    );
    let (status, body) = app
        .call_tool_as(&user, "mcp:admin-tools/add", json!({"a": 1, "b": 1}))
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "tier", "{body}");
    let (status, body) = app
        .call_tool_as(admin, "mcp:admin-tools/add", json!({"a": 1, "b": 1}))
        .await;
    assert_eq!(status, 200, "an operator may: {body}");

    // A security context bounds the call: tools it does not cover are refused and unlisted,
    // and its domain allowlist holds against the server's host.
    let (confined, _) = app
        .create_bound_key("confined-key", "operator", "elsewhere")
        .await;
    let (_, body) = app
        .call_tool_as(&confined, "aegis.tools.list", json!({}))
        .await;
    let names: Vec<String> = common::json::items(&body["structuredContent"]["tools"])
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["aegis.tools.list", "mcp:tools/add"]);
    let (status, body) = app
        .call_tool_as(&confined, "mcp:tools/shout", json!({"text": "x"}))
        .await;
    assert_eq!(status, 403, "{body}");
    let calls_before = server.calls().len();
    let (status, body) = app
        .call_tool_as(&confined, "mcp:tools/add", json!({"a": 1, "b": 2}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["structuredContent"]["error"]["code"], "domain_not_allowed",
        "{body}"
    );
    assert_eq!(
        server.calls().len(),
        calls_before,
        "refused before anything was sent"
    );

    // Every call above was audited under its tool's name.
    let rows = audit_rows(&app, "mcp:tools/fail").await;
    assert_eq!(
        rows,
        vec![
            ("allowed".into(), "running".into(), None),
            (
                "allowed".into(),
                "error".into(),
                Some("mcp_tool_error".into())
            )
        ]
    );
    let shout = audit_rows(&app, "mcp:tools/shout").await;
    assert_eq!(shout.len(), 1, "{shout:?}");
    assert_eq!(shout[0].0, "denied");

    // The server goes away: the next call fails at once, clearly, and is audited.
    server.stop().await;
    let started = Instant::now();
    let (status, body) = app
        .call_tool_as(admin, "mcp:tools/add", json!({"a": 1, "b": 1}))
        .await;
    assert_eq!(status, 200, "{body}");
    let error = &body["structuredContent"]["error"];
    assert_eq!(error["code"], "mcp_unreachable", "{body}");
    assert!(
        error["message"].as_str().unwrap().contains("`tools`"),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let last = audit_rows(&app, "mcp:tools/add").await.pop().unwrap();
    assert_eq!(
        last,
        (
            "allowed".into(),
            "error".into(),
            Some("mcp_unreachable".into())
        )
    );
}

#[tokio::test]
async fn a_server_answering_plain_json_without_sessions_is_called_the_same_way() {
    let (var, token) = token_variable();
    let server = McpTestServer::start_in(&token, "json-stateless").await;
    let db = TestDb::create().await;
    let app = TestApp::spawn_with(node(
        &db,
        vec![server_config("plain", &server.url(), &var, json!({}))],
    ))
    .await;
    for (a, b, sum) in [(1, 2, "3"), (20, 22, "42")] {
        let (status, body) = app
            .call_tool("mcp:plain/add", json!({"a": a, "b": b}))
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["structuredContent"]["content"][0]["text"], sum,
            "{body}"
        );
    }
    let (_, body) = app.call_tool("mcp:plain/fail", json!({})).await;
    assert_eq!(
        body["structuredContent"]["error"]["code"], "mcp_tool_error",
        "{body}"
    );
    assert_eq!(server.calls().len(), 3);
}

/// The AEGIS-shaped manifests that name external MCP servers (tests/aegis-shapes) validate on a
/// node that declares those servers; nothing is contacted to validate.
#[test]
fn the_aegis_shaped_manifests_with_mcp_servers_validate_where_the_servers_are_declared() {
    let compose = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/compose.yaml");
    let mut config = orchestrator::config::load(Some(std::path::Path::new(compose)), &[])
        .expect("compose config")
        .config;
    for name in ["mailbox", "filesystem", "codehost", "browser", "search"] {
        config.mcp_servers.push(server_config(
            name,
            &format!("https://{name}.mcp.example.org/mcp"),
            "UNUSED_TOKEN",
            json!({}),
        ));
    }
    for file in [
        "inbox-digest-mcp.yaml",
        "pull-request-reviewer-mcp.yaml",
        "topic-researcher-mcp.yaml",
        "writer-finder.yaml",
    ] {
        let path = format!("{}/tests/aegis-shapes/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("shape");
        let (_, checked) =
            orchestrator::tools::validate_offline(&text, &config).expect("a manifest kind");
        if let Err(errors) = checked.manifest {
            panic!("{file}: {errors:?}");
        }
    }
}

#[tokio::test]
async fn a_server_outside_the_egress_rules_is_refused_at_config_or_before_any_connection() {
    let (addr, accepted) = trap().await;

    // An address literal in a blocked range: refused when the config is loaded, naming the key
    // and its line.
    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(
        &mut file,
        format!("mcp_servers:\n  - name: local\n    url: http://{addr}/mcp\n").as_bytes(),
    )
    .unwrap();
    let err = orchestrator::config::load(Some(file.path()), &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("mcp_servers[0].url") && err.contains("line 3") && err.contains("loopback"),
        "{err}"
    );

    // A name, judged when it is resolved: it resolves into loopback, which this node has not
    // opened, so nothing connects; listings and calls say why.
    let db = TestDb::create().await;
    let (var, _) = token_variable();
    let mut config = test_config(&db.url);
    config
        .egress
        .hosts
        .insert("mcp.internal".to_owned(), vec![addr.ip()]);
    config.mcp_servers = vec![server_config(
        "internal",
        &format!("http://mcp.internal:{}/mcp", addr.port()),
        &var,
        json!({}),
    )];
    let app = TestApp::spawn_with(config).await;
    let (status, listed) = app.call_tool("aegis.tools.list", json!({})).await;
    assert_eq!(status, 200, "{listed}");
    let unavailable = &listed["structuredContent"]["unavailable_servers"];
    assert_eq!(unavailable[0]["server"], "internal", "{listed}");
    assert_eq!(unavailable[0]["code"], "address_blocked", "{listed}");
    let (status, body) = app
        .call_tool("mcp:internal/add", json!({"a": 1, "b": 2}))
        .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "tool_unavailable", "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("blocked"),
        "{body}"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "no connection was made");
    assert_eq!(
        audit_rows(&app, "mcp:internal/add").await,
        denied_once("tool_unavailable")
    );
}

#[tokio::test]
async fn mcp_names_of_built_in_tools_are_normalised_and_unknown_servers_refused_at_deploy() {
    let db = TestDb::create().await;
    let (var, _) = token_variable();
    // A server that is not running: deploys name servers, they do not need them up.
    let app = TestApp::spawn_with(node(
        &db,
        vec![server_config(
            "gmail",
            "http://127.0.0.1:9/mcp",
            &var,
            json!({}),
        )],
    ))
    .await;
    let manifest = |tools: &str| {
        format!(
            "apiVersion: 100monkeys.ai/v1\nkind: Agent\nmetadata:\n  name: searcher\n  version: \"1.0.0\"\n\
             spec:\n  runtime:\n    language: busybox\n    version: \"1\"\n  task:\n    instruction: Search.\n  tools: {tools}\n"
        )
    };

    // `mcp:aegis.agent.search` (as AEGIS's examples write it) is the built-in tool.
    let r = app
        .admin(Method::POST, "/v1/agents")
        .body(manifest(r#"["mcp:aegis.agent.search", "mcp:gmail"]"#))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, 201, "{body}");
    let warning = common::json::items(&body["warnings"])
        .iter()
        .find(|w| w["pointer"] == "/spec/tools/0")
        .cloned()
        .unwrap_or_else(|| panic!("a note for /spec/tools/0: {body}"));
    let message = warning["message"].as_str().unwrap();
    assert!(
        message.starts_with("normalised:") && message.contains("`aegis.agent.search`"),
        "{warning}"
    );
    let (status, exported) = app
        .call_tool("aegis.agent.export", json!({"name": "searcher"}))
        .await;
    assert_eq!(status, 200, "{exported}");
    let yaml: Value = serde_yaml::from_str(
        exported["structuredContent"]["manifest_yaml"]
            .as_str()
            .unwrap(),
    )
    .expect("yaml");
    assert_eq!(
        yaml["spec"]["tools"],
        json!(["aegis.agent.search", "mcp:gmail"]),
        "stored as normalised"
    );

    // A server the node does not have: refused, naming those it has.
    let r = app
        .admin(Method::POST, "/v1/agents")
        .body(manifest(r#"["mcp:github"]"#).replace("searcher", "other"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("/spec/tools/0") && body.contains("`github`") && body.contains("gmail"),
        "{body}"
    );
}
/// A node with the careless test server (`careless`), whose credentials are a bearer token and
/// an `X-Team` header holding `"` and `\`, and a security context under which a bound key may
/// list and call every tool.
struct Careless {
    app: TestApp,
    server: McpTestServer,
    token: String,
    team: String,
    _db: TestDb,
}

impl Careless {
    async fn start() -> Self {
        let (var, token) = token_variable();
        let team_var = format!("MCP_EXT_TEAM_{}", uuid::Uuid::new_v4().simple());
        let team = format!(
            "team-{}\"q\\z",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        std::env::set_var(&team_var, &team);
        let server = McpTestServer::start_leaky(&token, &team).await;
        let db = TestDb::create().await;
        let mut config = node(
            &db,
            vec![server_config(
                "careless",
                &server.url(),
                &var,
                json!({"headers_from_env": {"X-Team": team_var}}),
            )],
        );
        config.seal.security_contexts = vec![json!({
            "name": "mcp-reader", "description": "every tool", "tier": "operator",
            "capabilities": [{"tool_pattern": "*"}], "attestation": {"allow_unverified": true}})];
        let app = TestApp::spawn_with(config).await;
        Self {
            app,
            server,
            token,
            team,
            _db: db,
        }
    }

    /// The forms of the credentials found in `text`: the token, the header value as it is, its
    /// random part (so any escaping or percent-encoding that keeps it readable), and its base64
    /// at every offset (the characters carrying only its bits).
    fn leaked(&self, text: &str) -> Vec<String> {
        use base64::Engine as _;
        let random_part = self.team.split('"').next().unwrap_or_default().to_owned();
        let mut forms = vec![self.token.clone(), self.team.clone(), random_part];
        for offset in 0..3usize {
            let mut bytes = vec![b'x'; offset];
            bytes.extend_from_slice(self.team.as_bytes());
            let encoded = base64::engine::general_purpose::STANDARD.encode(&bytes);
            let first = (8 * offset).div_ceil(6);
            let end = 8 * bytes.len() / 6;
            forms.push(encoded[first..end].to_owned());
        }
        forms
            .into_iter()
            .filter(|form| text.contains(form.as_str()))
            .collect()
    }

    /// `encoded` (standard base64) decoded, with the credentials' forms found in the bytes.
    fn leaked_in_base64(&self, encoded: &str) -> Vec<String> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap_or_else(|e| panic!("{encoded} is base64: {e}"));
        self.leaked(&String::from_utf8_lossy(&bytes))
    }
}

/// Issue 41, item 3: a server that puts the node's bearer token and a configured header value
/// into a tool's title, description, input schema (a default, an example, a description, a
/// keyword named by the header value) and output schema. No listing shows them: `GET /v1/tools`
/// for an admin and for a readonly key, `/mcp` `tools/list`. Before the fix the description
/// and the schema reached every caller verbatim.
#[tokio::test]
async fn listings_of_a_careless_server_never_show_the_node_s_credentials() {
    let mut careless = Careless::start().await;
    let app = &careless.app;

    let reader = app.create_key("reader", "readonly").await;
    for key in [common::TEST_ADMIN_KEY, reader.as_str()] {
        let r = app
            .rest_as(key)
            .response(Method::GET, "/v1/tools", None)
            .await;
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        let listed: Value = serde_json::from_str(&text).unwrap();
        let tool = listed
            .as_array()
            .unwrap_or_else(|| panic!("an array of tools: {listed}"))
            .iter()
            .find(|t| t["name"] == "mcp:careless/leaky_listing")
            .unwrap_or_else(|| panic!("leaky_listing in {text}"));
        // Listed, with its credentials masked in place.
        let description = tool["description"].as_str().unwrap();
        assert!(
            description.contains("Authorization: ***") && description.contains("X-Team: ***"),
            "{tool}"
        );
        assert_eq!(careless.leaked(&text), Vec::<String>::new(), "{text}");
    }

    let (bound, _) = app
        .create_bound_key("mcp-lister", "operator", "mcp-reader")
        .await;
    let session = common::mcp::open_session(app, &bound).await;
    let (status, _, listed) = common::mcp::request(
        app,
        Method::POST,
        &bound,
        Some(&session),
        Some(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})),
    )
    .await;
    assert_eq!(status, 200);
    let listed = listed.expect("a listing").to_string();
    assert!(listed.contains("leaky_listing"), "{listed}");
    assert_eq!(careless.leaked(&listed), Vec::<String>::new(), "{listed}");
    careless.server.stop().await;
}

/// Issue 41, item 4: a header value holding `"` and `\`, echoed by the server in a result: as
/// text, JSON-escaped and `\u`-escaped inside texts, percent-encoded (wholly, and in part with
/// lower-case hex), in base64 inside a text and a `data:` URL, as image and blob bytes, and in
/// `structuredContent` as a value, a key, a JSON text and `blob`/`data` base64 fields; and in a
/// tool error. None of it reaches the caller or the audit log. Before the fix redaction ran on
/// the serialised result, where the value is escaped, so it came back verbatim.
#[tokio::test]
async fn a_credential_with_quotes_echoed_in_results_is_redacted_in_every_encoding() {
    let mut careless = Careless::start().await;
    let app = &careless.app;
    let admin = common::TEST_ADMIN_KEY;

    // Content blocks: text, JSON-escaped, percent-encoded, an image.
    let (status, body) = app
        .call_tool_as(admin, "mcp:careless/echo_team", json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let text = body.to_string();
    assert!(text.contains("team=***"), "{text}");
    assert_eq!(careless.leaked(&text), Vec::<String>::new(), "{text}");
    let image = common::json::items(&body["structuredContent"]["content"])
        .iter()
        .find(|c| c["type"] == "image")
        .unwrap_or_else(|| panic!("an image in {body}"));
    // Bytes are described, never passed on (and were redacted before that).
    assert!(image.get("data").is_none(), "{image}");

    // A result built by hand, structuredContent included.
    let (status, body) = app
        .call_tool_as(admin, "mcp:careless/echo_team_structured", json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_ne!(body["isError"], true, "{body}");
    let text = body.to_string();
    assert_eq!(careless.leaked(&text), Vec::<String>::new(), "{text}");
    let output = &body["structuredContent"];
    let structured = &output["structuredContent"];
    assert_eq!(structured["team"], "***", "{body}");
    assert_eq!(structured["***"]["nested"][0], "x-team: ***", "{body}");
    assert_eq!(structured["json"], r#"{"team": "***"}"#, "{body}");
    for field in ["/blob", "/image/data"] {
        let encoded = structured
            .pointer(field)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("{field} in {body}"));
        assert_eq!(
            careless.leaked_in_base64(encoded),
            Vec::<String>::new(),
            "{field}"
        );
    }
    use base64::Engine as _;
    let blob = base64::engine::general_purpose::STANDARD
        .decode(structured["blob"].as_str().unwrap_or_default())
        .unwrap();
    assert_eq!(blob, b"bytes *** end");
    let texts = common::json::present_strs(&output["content"], "text");
    assert_eq!(texts[0], r#"{"team": "***"}"#, "{body}");
    assert_eq!(texts[1], "https://example.test/?team=***&x=1", "{body}");
    let data_url = texts[2].strip_prefix("data:text/plain;base64,").unwrap();
    let data = base64::engine::general_purpose::STANDARD
        .decode(data_url)
        .unwrap();
    assert_eq!(data, b"xy***", "{body}");
    assert!(
        texts[3].starts_with("raw: ") && texts[3].contains("***"),
        "{body}"
    );

    // A tool error that repeats it, also as JSON.
    let (status, body) = app
        .call_tool_as(admin, "mcp:careless/fail_team", json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["isError"], true, "{body}");
    let message = body["structuredContent"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains("team *** is not allowed"), "{body}");
    assert_eq!(
        careless.leaked(&body.to_string()),
        Vec::<String>::new(),
        "{body}"
    );

    // Nor in the audit log (reasons, and whatever else a row holds as text).
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT row_to_json(a)::text FROM audit_log a WHERE action LIKE 'mcp:careless/%'",
    )
    .fetch_all(&app.state.pool)
    .await
    .unwrap();
    assert!(rows.len() >= 3, "{rows:?}");
    let all = rows.join("\n");
    assert!(all.contains("***"), "{all}");
    assert_eq!(careless.leaked(&all), Vec::<String>::new(), "{all}");
    careless.server.stop().await;
}
