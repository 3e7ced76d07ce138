//! The process tools through the real service: `proc.list`, `logs.read` and `env.get` in an
//! agent's sandbox via `POST /v1/tools/call`, under the manifest's tools and path allowlist.
//!
//! The listener is a real `httpd` started by a concurrent `cmd.run`; what `proc.list` reports
//! is checked from inside the sandbox (its pid is the process that `docker exec` then stops).

use crate::common;
use crate::common::agent::AgentManifest;

use std::time::Duration;

use common::refusal::{seal_refused, seal_written};
use common::sandbox::AgentSandbox as Sandbox;
use common::TestApp;
use serde_json::{json, Value};

/// A busybox agent with the process tools; `unmask` sets `spec.security.unmask_env`.
fn agent(name: &str, unmask: bool) -> String {
    let roots = ["/workspace/logs", "/workspace/app"];
    AgentManifest::new(name)
        .instruction("Debug what runs in the sandbox.")
        .tools(&["cmd.run", "fs.write", "proc.list", "logs.read", "env.get"])
        .cmd(&["httpd", "sleep"], 60, "")
        .unmask_env(unmask)
        .filesystem(&roots, &roots)
        .yaml()
}

#[tokio::test]
async fn proc_list_finds_the_process_listening_on_a_port() {
    let app = TestApp::spawn().await;
    let sb = Sandbox::start(&app, agent("proc-agent", false)).await;

    // The listener runs for the length of its own cmd.run, in a concurrent call.
    let server = {
        let sb = sb.clone();
        tokio::spawn(async move {
            sb.ok(
                "cmd.run",
                json!({"command": "httpd", "args": ["-f", "-p", "8080", "-h", "/workspace/app"],
                       "cwd": "/workspace/app", "timeout_secs": 60}),
            )
            .await
        })
    };
    let mut found = Value::Null;
    for _ in 0..300 {
        found = sb.ok("proc.list", json!({"port": 8080})).await;
        if found["total"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(found["total"], 1, "nothing listens on 8080: {found}");
    let p = &found["processes"][0];
    assert_eq!(p["name"], "httpd", "{found}");
    assert_eq!(p["listening_ports"], json!([8080]));
    assert_eq!(p["uid"], 65534);
    assert_eq!(p["role"], "command");
    let pid = p["pid"].as_u64().unwrap();

    // The same process, seen from inside the sandbox: that pid is httpd.
    let (ran, comm) =
        common::docker_out(&["exec", &sb.container(), "cat", &format!("/proc/{pid}/comm")]);
    assert_eq!((ran, comm.as_str()), (true, "httpd"));
    let by_name = sb.ok("proc.list", json!({"name": "HTTP"})).await;
    assert_eq!(by_name["processes"][0]["pid"], pid, "{by_name}");
    let nothing = sb.ok("proc.list", json!({"port": 9})).await;
    assert_eq!(nothing["total"], 0);
    let all = sb.ok("proc.list", json!({})).await;
    assert!(
        common::json::items(&all["processes"])
            .iter()
            .all(|p| p["role"] == "command" && p["pid"] != 1),
        "the executor is hidden by default: {all}"
    );
    let internal = sb.ok("proc.list", json!({"include_internal": true})).await;
    assert!(
        common::json::items(&internal["processes"])
            .iter()
            .any(|p| p["pid"] == 1 && p["role"] == "executor"),
        "{internal}"
    );

    // Limits are checked before the sandbox is asked.
    sb.refuses_each(vec![
        ("proc.list", json!({"limit": 201}), 422, "invalid_arguments"),
        (
            "proc.list",
            json!({"port": 70000}),
            422,
            "invalid_arguments",
        ),
    ])
    .await;

    // Stop the listener from inside; its cmd.run then ends with the signal.
    let (code, _) = sb.inside(&["kill", &pid.to_string()]);
    assert_eq!(code, 0);
    let ran = server.await.unwrap();
    assert_eq!(ran["signal"], 15, "{ran}");
    let gone = sb.ok("proc.list", json!({"port": 8080})).await;
    assert_eq!(gone["total"], 0, "{gone}");
}

#[tokio::test]
async fn logs_read_returns_a_filtered_tail_inside_the_allowlist() {
    let app = TestApp::spawn().await;
    let sb = Sandbox::start(&app, agent("logs-agent", false)).await;
    let mut log = String::new();
    for i in 1..=500 {
        let level = if i % 5 == 0 { "error" } else { "info" };
        log.push_str(&format!(
            "{{\"seq\":{i},\"level\":\"{level}\",\"req\":{{\"path\":\"/p{i}\"}}}}\n"
        ));
    }
    sb.ok(
        "fs.write",
        json!({"path": "/workspace/logs/app.log", "content": log}),
    )
    .await;

    let tail = sb
        .ok("logs.read", json!({"path": "logs/app.log", "lines": 3}))
        .await;
    assert_eq!(tail["path"], "/workspace/logs/app.log");
    assert_eq!(tail["lines_returned"], 3);
    assert!(tail["lines"][2].as_str().unwrap().contains("\"seq\":500"));
    assert_eq!(tail["truncated"], true);

    let literal = sb
        .ok(
            "logs.read",
            json!({"path": "/workspace/logs/app.log", "filter": "\"level\":\"error\"", "lines": 2}),
        )
        .await;
    assert_eq!(literal["lines_returned"], 2);
    assert!(common::json::text(&literal["lines"][0]).contains("\"seq\":495"));

    let regex = sb
        .ok(
            "logs.read",
            json!({"path": "/workspace/logs/app.log", "filter": "\"seq\":4[0-9]0,", "regex": true,
                   "json_field": "req.path", "lines": 100}),
        )
        .await;
    assert_eq!(
        regex["lines"],
        json!([
            "/p400", "/p410", "/p420", "/p430", "/p440", "/p450", "/p460", "/p470", "/p480",
            "/p490"
        ]),
        "{regex}"
    );
    assert_eq!(regex["lines_scanned"], 500);
    assert_eq!(regex["truncated"], false);

    // Outside the read allowlist: refused by policy, before the sandbox is asked.
    sb.refuses_each(vec![
        (
            "logs.read",
            json!({"path": "/etc/passwd"}),
            403,
            "path_not_allowed",
        ),
        (
            "logs.read",
            json!({"path": "/workspace/secret/x.log"}),
            403,
            "path_not_allowed",
        ),
    ])
    .await;
    // A symlink inside the allowlist that points out of it is refused by the executor.
    let (code, _) = sb.inside(&["ln", "-s", "/etc/passwd", "/workspace/logs/evil.log"]);
    assert_eq!(code, 0);
    sb.tool_error(
        "logs.read",
        json!({"path": "/workspace/logs/evil.log"}),
        "path_not_allowed",
    )
    .await;
    sb.tool_error(
        "logs.read",
        json!({"path": "/workspace/logs/app.log", "filter": "(", "regex": true}),
        "invalid_arguments",
    )
    .await;
    sb.refused(
        "logs.read",
        json!({"path": "/workspace/logs/app.log", "lines": 5001}),
        422,
        "invalid_arguments",
    )
    .await;
}

/// The sandbox of agent `name` (allowed to unmask secrets or not) with a `.env` in
/// `/workspace/app` holding a plain value and three secrets.
async fn with_dotenv(app: &TestApp, name: &str, unmask: bool) -> Sandbox {
    let sandbox = Sandbox::start(app, agent(name, unmask)).await;
    let dotenv =
        "DB_HOST=db\nAPI_KEY=sk-live-123\nexport DB_PASSWORD='hunter2'\nSESSION_TOKEN=\"t0k\"\n";
    sandbox
        .ok(
            "fs.write",
            json!({"path": "/workspace/app/.env", "content": dotenv}),
        )
        .await;
    sandbox
}

#[tokio::test]
async fn env_get_masks_secrets_unless_the_manifest_allows_unmasking() {
    let app = TestApp::spawn().await;
    let masked = with_dotenv(&app, "env-masked", false).await;
    let env = masked
        .ok("env.get", json!({"path": "/workspace/app/.env"}))
        .await;
    assert_eq!(env["variables"]["DB_HOST"], "db");
    for name in ["API_KEY", "DB_PASSWORD", "SESSION_TOKEN"] {
        assert_eq!(env["variables"][name], "***MASKED***", "{env}");
    }
    assert_eq!(
        env["masked"],
        json!(["API_KEY", "DB_PASSWORD", "SESSION_TOKEN"])
    );
    assert!(!env.to_string().contains("hunter2"));
    let refused = masked
        .tool_error(
            "env.get",
            json!({"path": "/workspace/app/.env", "mask_secrets": false}),
            "unmask_not_allowed",
        )
        .await;
    assert!(!refused.to_string().contains("hunter2"));
    let own = masked
        .ok("env.get", json!({"keys": ["HOME", "NOPE"]}))
        .await;
    assert_eq!(own["source"], "environment");
    assert_eq!(own["variables"], json!({"HOME": "/workspace"}));
    assert_eq!(own["missing"], json!(["NOPE"]));
    masked
        .refused(
            "env.get",
            json!({"path": "/workspace/secret/.env"}),
            403,
            "path_not_allowed",
        )
        .await;

    let unmasked = with_dotenv(&app, "env-unmasked", true).await;
    let still_masked = unmasked
        .ok("env.get", json!({"path": "/workspace/app/.env"}))
        .await;
    assert_eq!(
        still_masked["variables"]["DB_PASSWORD"], "***MASKED***",
        "masking is the default even when unmasking is allowed"
    );
    let clear = unmasked
        .ok(
            "env.get",
            json!({"path": "/workspace/app/.env", "mask_secrets": false, "keys": ["DB_PASSWORD"]}),
        )
        .await;
    assert_eq!(clear["variables"], json!({"DB_PASSWORD": "hunter2"}));
    assert_eq!(clear["masked"], json!([]));
}

#[tokio::test]
async fn the_process_tools_need_the_manifest_to_list_them() {
    let app = TestApp::spawn().await;
    let sb = Sandbox::start(&app, common::agent::reader_agent("no-proc-tools")).await;
    for (tool, args) in [
        ("proc.list", json!({})),
        ("logs.read", json!({"path": "/workspace/a.log"})),
        ("env.get", json!({})),
    ] {
        sb.refused(tool, args, 403, "tool_not_in_manifest").await;
    }
}

/// SEAL contexts for the process tools: one that may unmask, one that may not.
fn seal_contexts() -> Vec<Value> {
    let caps = |unmask: bool| {
        json!([
            {"tool_pattern": "fs.write", "path_allowlist": ["/workspace/logs/**"]},
            {"tool_pattern": "logs.read", "path_allowlist": ["/workspace/logs/**"]},
            {"tool_pattern": "env.get", "path_allowlist": ["/workspace/logs/**"], "unmask_env": unmask},
            {"tool_pattern": "proc.list"}
        ])
    };
    vec![
        json!({"name": "debugger", "description": "process tools, may unmask",
               "runtime": {"language": "busybox", "version": "1"}, "capabilities": caps(true),
               "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}}),
        json!({"name": "viewer", "description": "process tools, always masked",
               "runtime": {"language": "busybox", "version": "1"}, "capabilities": caps(false),
               "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}}),
    ]
}

#[tokio::test]
async fn seal_sessions_call_the_process_tools_under_their_context() {
    use aegis_cli::seal_client::{SealClient, Transport};

    let db = common::TestDb::create().await;
    let mut config = common::test_config(&db.url);
    config.seal.security_contexts = seal_contexts();
    let app = TestApp::spawn_with(config).await;
    for (context, unmask_allowed) in [("debugger", true), ("viewer", false)] {
        let mut client = SealClient::new(Transport::Http(app.http_base.clone())).unwrap();
        client.attest("test-proc", context).await.unwrap();
        seal_written(&client, "/workspace/logs/.env", "TOKEN=abc\nMODE=debug\n").await;

        let tail = client
            .call_tool(
                "logs.read",
                json!({"path": "/workspace/logs/.env", "filter": "MODE"}),
            )
            .await
            .unwrap();
        assert_eq!(
            tail["structuredContent"]["lines"],
            json!(["MODE=debug"]),
            "{tail}"
        );
        let listed = client.call_tool("proc.list", json!({})).await.unwrap();
        assert_eq!(listed["isError"], false, "{listed}");

        // Outside the context's path allowlist: refused with SEAL code 2002.
        let outside = json!({"path": "/workspace/other.log"});
        let (code, _, _) = seal_refused(&client, "logs.read", outside).await;
        assert_eq!(code, 2002, "{context}: read outside the allowlist");

        let masked = client
            .call_tool("env.get", json!({"path": "/workspace/logs/.env"}))
            .await
            .unwrap();
        assert_eq!(
            masked["structuredContent"]["variables"],
            json!({"MODE": "debug", "TOKEN": "***MASKED***"}),
            "{context}: {masked}"
        );
        let unmasked = client
            .call_tool(
                "env.get",
                json!({"path": "/workspace/logs/.env", "mask_secrets": false}),
            )
            .await
            .unwrap();
        if unmask_allowed {
            assert_eq!(
                unmasked["structuredContent"]["variables"]["TOKEN"], "abc",
                "{unmasked}"
            );
        } else {
            assert_eq!(unmasked["isError"], true, "{unmasked}");
            assert_eq!(
                unmasked["structuredContent"]["error"]["code"], "unmask_not_allowed",
                "{unmasked}"
            );
            assert!(!unmasked.to_string().contains("abc"));
        }
    }
}
