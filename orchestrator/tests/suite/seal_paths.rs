//! SEAL context paths hold inside the sandbox: a session's executor roots are its context's
//! path allowlist, so a symlink planted in /workspace cannot reach past a narrower entry, and
//! `/a/b/*` does not recurse. Deny lists cover tool aliases.

use crate::common;

use aegis_cli::seal_client::{ClientError, SealClient, Transport};
use common::refusal::{seal_ok, seal_refused, seal_written};
use common::{test_config, TestApp, TestDb};
use serde_json::{json, Value};
use uuid::Uuid;

/// Runs argv in the sandbox as its user (what agent code can do), asserting success.
fn inside(sandbox: Uuid, argv: &[&str]) -> String {
    let container = format!("aegis-sbx-{sandbox}");
    let mut args = vec!["exec", "-u", "65534:65534", container.as_str()];
    args.extend_from_slice(argv);
    let (ok, out) = common::docker_out(&args);
    assert!(ok, "{argv:?} failed in the sandbox");
    out
}

fn contexts() -> Vec<Value> {
    vec![
        json!({"name": "shared-only", "description": "direct children of /workspace/shared",
               "runtime": {"language": "busybox", "version": "1"},
               "capabilities": [{"tool_pattern": "fs.*", "path_allowlist": ["/workspace/shared/*"]}],
               "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}}),
        json!({"name": "aliased", "description": "denies by one name of two",
               "runtime": {"language": "busybox", "version": "1"},
               "capabilities": [{"tool_pattern": "*"}],
               "deny_list": ["fs.create_dir", "aegis.task.wait"],
               "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}}),
    ]
}

async fn session(app: &TestApp, context: &str) -> SealClient {
    let mut client = SealClient::new(Transport::Http(app.http_base.clone())).unwrap();
    client.attest("test-paths", context).await.unwrap();
    client
}

fn tool_error_code(result: &Value) -> &str {
    assert_eq!(result["isError"], true, "{result}");
    result["structuredContent"]["error"]["code"]
        .as_str()
        .unwrap_or_default()
}

/// A node on a database of its own with this file's security contexts.
async fn node() -> TestApp {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.seal.security_contexts = contexts();
    let mut app = TestApp::spawn_with(config).await;
    app.db = Some(db);
    app
}

#[tokio::test]
async fn symlinks_planted_in_the_workspace_cannot_reach_past_a_narrower_entry() {
    let app = node().await;
    let client = session(&app, "shared-only").await;

    // The first call makes the session's sandbox.
    seal_written(&client, "/workspace/shared/ok.txt", "shared").await;
    let session_id = Uuid::parse_str(client.session_id().unwrap()).unwrap();
    let sandbox: Uuid = app
        .one(
            "SELECT sandbox_id FROM seal_sessions WHERE id = $1",
            session_id,
        )
        .await;

    // From inside: the executor was given the allowlist's root, not /workspace, and no symlinks.
    let (_, env) = common::docker_out(&[
        "inspect",
        "-f",
        "{{json .Config.Env}}",
        &format!("aegis-sbx-{sandbox}"),
    ]);
    assert!(
        env.contains(r#"\"read_roots\":[\"/workspace/shared\"]"#)
            && env.contains(r#"\"follow_symlinks\":false"#),
        "{env}"
    );

    // Agent code plants a secret next to the allowed directory and links to it from inside.
    inside(
        sandbox,
        &["sh", "-c", "echo top-secret > /workspace/secret.txt"],
    );
    inside(
        sandbox,
        &[
            "sh",
            "-c",
            "mkdir -p /workspace/shared/sub && echo deep > /workspace/shared/sub/file && \
             ln -s ../secret.txt /workspace/shared/up && ln -s /workspace/secret.txt /workspace/shared/abs && \
             ln -s sub/file /workspace/shared/down",
        ],
    );

    // Each link is a direct child of /workspace/shared, so the policy lets the call through;
    // the executor refuses to follow it.
    for link in ["up", "abs", "down"] {
        let r = client
            .call_tool(
                "fs.read",
                json!({"path": format!("/workspace/shared/{link}")}),
            )
            .await
            .unwrap();
        assert_eq!(tool_error_code(&r), "path_not_allowed", "{link}: {r}");
        assert!(!r.to_string().contains("top-secret") && !r.to_string().contains("deep"));
    }
    // Writing through a link does not reach the target either.
    let r = client
        .call_tool(
            "fs.write",
            json!({"path": "/workspace/shared/up", "content": "overwritten"}),
        )
        .await
        .unwrap();
    assert_eq!(r["isError"], true, "{r}");
    assert_eq!(
        inside(sandbox, &["cat", "/workspace/secret.txt"]),
        "top-secret"
    );
    // `/workspace/shared/*` does not recurse: neither directly nor by searching a child.
    let (code, _) = match client
        .call_tool("fs.read", json!({"path": "/workspace/shared/sub/file"}))
        .await
    {
        Err(ClientError::Refused { code, message, .. }) => (code, message),
        other => panic!("a grandchild was read: {other:?}"),
    };
    assert_eq!(code, 2002);
    let below = json!({"path": "/workspace/shared/sub", "pattern": "deep"});
    let (code, _, _) = seal_refused(&client, "fs.grep", below).await;
    assert_eq!(code, 2002, "a search below a direct child");
    // What the entry names still works.
    let r = client
        .call_tool("fs.read", json!({"path": "/workspace/shared/ok.txt"}))
        .await
        .unwrap();
    assert_eq!(r["structuredContent"]["content"], "shared", "{r}");
}

#[tokio::test]
async fn a_deny_entry_covers_both_names_of_an_aliased_tool() {
    let app = node().await;
    let client = session(&app, "aliased").await;
    for (tool, args) in [
        ("fs.create_dir", json!({"path": "/workspace/d"})),
        ("fs.create.dir", json!({"path": "/workspace/d"})),
        (
            "aegis.task.wait",
            json!({"execution_id": Uuid::new_v4().to_string()}),
        ),
        (
            "aegis.agent.wait",
            json!({"execution_id": Uuid::new_v4().to_string()}),
        ),
    ] {
        match client.call_tool(tool, args).await {
            Err(ClientError::Refused { code, .. }) => assert_eq!(code, 2001, "{tool}"),
            other => panic!("{tool} was not refused: {other:?}"),
        }
    }
    // Neither name is listed for the session.
    let listed = client.list_tools().await.unwrap().to_string();
    assert!(!listed.contains("\"fs.create.dir\"") && !listed.contains("\"aegis.agent.wait\""));
    // Nothing was created, checked from inside the sandbox (made by an allowed call).
    let r = seal_ok(&client, "fs.list", json!({"path": "/workspace"})).await;
    assert!(!r.to_string().contains("\"d\""), "{r}");
}
