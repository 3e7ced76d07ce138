//! Issue 10, item 10: what real SDK clients send works. Integers written as `30.0` (Python
//! floats) are accepted wherever the schema says integer, `30.5` is not; envelopes signed over
//! non-ASCII text escaped either way (`ensure_ascii` on or off) verify.

use crate::common;

use aegis_cli::seal_client::{ClientError, SealClient, Transport};
use chrono::Utc;
use common::refusal::seal_ok;
use common::{test_config, TestApp, TestDb};
use orchestrator::seal::canonical::Escaping;
use serde_json::{json, Value};

async fn app(db: &TestDb) -> TestApp {
    let mut config = test_config(&db.url);
    config.seal.security_contexts = vec![json!({
        "name": "sdk", "description": "what SDK clients call",
        "runtime": {"language": "busybox", "version": "1"},
        "capabilities": [{"tool_pattern": "aegis.*"}, {"tool_pattern": "fs.*", "path_allowlist": ["/workspace"]},
                         {"tool_pattern": "cmd.run", "command_allowlist": ["echo"]}],
        "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}})];
    TestApp::spawn_with(config).await
}

#[tokio::test]
async fn integral_floats_are_integers_and_fractions_are_refused_everywhere() {
    let db = TestDb::create().await;
    let app = app(&db).await;

    // REST.
    let (status, body) = app
        .call_tool("aegis.tools.list", json!({"limit": 3.0, "offset": 0.0}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["isError"], false, "{body}");
    let (status, body) = app
        .call_tool("aegis.tools.list", json!({"limit": 3.5}))
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("/limit"), "{body}");
    assert!(
        !body.to_string().contains("3.5"),
        "the value is not echoed: {body}"
    );

    // SEAL: the signed text keeps `30.0` as the client wrote it; the handler gets 30.
    let mut client = SealClient::new(Transport::Http(app.http_base.clone())).unwrap();
    client.attest("test-sdk", "sdk").await.unwrap();
    let r = client
        .call_tool(
            "cmd.run",
            json!({"command": "echo hi", "timeout_secs": 30.0, "max_output_bytes": 1024.0}),
        )
        .await
        .unwrap();
    assert_eq!(r["structuredContent"]["stdout"], "hi\n", "{r}");
    seal_ok(&client, "aegis.tools.list", json!({"limit": 2.0})).await;
    match client
        .call_tool(
            "cmd.run",
            json!({"command": "echo hi", "timeout_secs": 30.5}),
        )
        .await
    {
        Err(ClientError::Refused { code, message, .. }) => {
            assert_eq!(code, 1000, "{message}");
            assert!(message.contains("/timeout_secs"), "{message}");
        }
        other => panic!("30.5 must be refused: {other:?}"),
    }
}

#[tokio::test]
async fn envelopes_signed_with_ensure_ascii_on_or_off_both_verify() {
    let db = TestDb::create().await;
    let app = app(&db).await;
    for transport in [
        Transport::Http(app.http_base.clone()),
        Transport::Grpc(format!("http://{}", app.grpc_addr)),
    ] {
        let mut client = SealClient::new(transport).unwrap();
        client.attest("test-ascii", "sdk").await.unwrap();
        for (i, escaping) in [Escaping::Utf8, Escaping::Ascii].into_iter().enumerate() {
            let content = format!("café 日本 😀 \u{7f} #{i}");
            let payload = json!({"jsonrpc": "2.0", "id": format!("req-{i}"), "method": "tools/call",
                "params": {"name": "fs.write", "arguments": {"path": "/workspace/ü.txt", "content": content}}});
            let envelope = client
                .envelope_with(&payload, Utc::now(), escaping)
                .unwrap();
            let body = client.send(&envelope).await.unwrap_or_else(|e| {
                panic!("{escaping:?} signature refused: {e}");
            });
            assert_eq!(body["payload"]["result"]["isError"], false, "{body}");
            let read = client
                .call_tool("fs.read", json!({"path": "/workspace/ü.txt"}))
                .await
                .unwrap();
            assert_eq!(read["structuredContent"]["content"], Value::String(content));
        }
        // Still bound to the content: the escaped signature over other text fails.
        let payload = json!({"jsonrpc": "2.0", "id": "req-x", "method": "tools/call",
            "params": {"name": "fs.write", "arguments": {"path": "/workspace/ü.txt", "content": "é"}}});
        let mut envelope = client
            .envelope_with(&payload, Utc::now(), Escaping::Ascii)
            .unwrap();
        envelope["payload"]["params"]["arguments"]["content"] = json!("è");
        match client.send(&envelope).await {
            Err(ClientError::Refused { code, .. }) => assert_eq!(code, 1001),
            other => panic!("a changed payload must be refused: {other:?}"),
        }
    }
}
