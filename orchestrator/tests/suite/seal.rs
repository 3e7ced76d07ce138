//! The SEAL gateway through the real service, over HTTP and over gRPC: the RFC's normative
//! policy example, every refusal code the issue names, replay, sessions that survive a restart,
//! revocation, the session's own sandbox, and the audit trail.

use crate::common;

use aegis_cli::seal_client::{ClientError, SealClient, Transport};
use chrono::{Duration, Utc};
use common::refusal::{refused, seal_refused, seal_written};
use common::{test_config, TestApp, TestDb};
use reqwest::Method;
use serde_json::{json, Value};

fn contexts() -> Vec<Value> {
    vec![
        json!({"name": "research-safe", "description": "RFC 5.3.4 normative example",
               "capabilities": [{"tool_pattern": "fs.*", "path_allowlist": ["/workspace/shared/*"]}],
               "deny_list": ["fs.delete"],
               "runtime": {"language": "busybox", "version": "1"},
               "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}}),
        json!({"name": "ops", "description": "Tests every kind of constraint",
               "runtime": {"language": "busybox", "version": "1"},
               "capabilities": [
                   {"tool_pattern": "fs.*", "path_allowlist": ["/workspace"]},
                   {"tool_pattern": "cmd.run", "command_allowlist": ["echo", "id", "cat", "ls"]},
                   {"tool_pattern": "web.*", "domain_allowlist": ["*.example.org"]},
                   {"tool_pattern": "aegis.tools.list", "rate_limit": {"calls": 3, "per_seconds": 60}},
                   {"tool_pattern": "aegis.agent.list"},
                   {"tool_pattern": "aegis.runtime.list", "max_response_size": 64}],
               "deny_list": ["fs.delete"],
               "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}}),
    ]
}

/// The node's configuration with the test security contexts and room to attest often.
fn seal_config(db: &TestDb) -> orchestrator::config::NodeConfig {
    let mut config = test_config(&db.url);
    config.seal.security_contexts = contexts();
    config.seal.attest_per_minute = 100;
    config
}

async fn app_on(db: &TestDb) -> TestApp {
    TestApp::spawn_with(seal_config(db)).await
}

/// A node whose sandboxes outlive its stop (`shutdown.sandboxes: keep`), for restart tests.
async fn app_keeping_sandboxes(db: &TestDb) -> TestApp {
    let mut config = seal_config(db);
    config.shutdown.sandboxes = orchestrator::config::ShutdownSandboxes::Keep;
    TestApp::spawn_with(config).await
}

fn transports(app: &TestApp) -> [Transport; 2] {
    [
        Transport::Http(app.http_base.clone()),
        Transport::Grpc(format!("http://{}", app.grpc_addr)),
    ]
}

async fn attested(transport: &Transport, context: &str) -> SealClient {
    let mut client = SealClient::new(transport.clone()).unwrap();
    let body = client
        .attest("test-worker-1", context)
        .await
        .expect("attests");
    assert_eq!(body["status"], "success", "{body}");
    assert!(body["expires_at"].as_str().unwrap().ends_with('Z'));
    client
}

fn is_http(t: &Transport) -> bool {
    matches!(t, Transport::Http(_))
}

#[tokio::test]
async fn the_rfc_normative_policy_example_holds_over_both_transports() {
    let db = TestDb::create().await;
    let app = app_on(&db).await;
    for transport in transports(&app) {
        let client = attested(&transport, "research-safe").await;
        seal_written(&client, "/workspace/shared/output.txt", "x").await;
        let r = client
            .call_tool("fs.read", json!({"path": "/workspace/shared/output.txt"}))
            .await
            .unwrap();
        assert_eq!(r["structuredContent"]["content"], "x");
        let (code, status, _) = seal_refused(
            &client,
            "fs.delete",
            json!({"path": "/workspace/shared/temp.txt"}),
        )
        .await;
        assert_eq!(code, 2001);
        if is_http(&transport) {
            assert_eq!(status, 403)
        } else {
            assert_eq!(status, tonic::Code::PermissionDenied as u16)
        }
        let (code, _, message) =
            seal_refused(&client, "fs.read", json!({"path": "/etc/passwd"})).await;
        assert_eq!(code, 2002, "{message}");
        let (code, _, _) = seal_refused(&client, "web.search", json!({"query": "example"})).await;
        assert_eq!(code, 2000);
    }
}

#[tokio::test]
async fn every_refusal_code_over_both_transports() {
    let db = TestDb::create().await;
    let app = app_on(&db).await;
    for transport in transports(&app) {
        let http = is_http(&transport);
        let unauthenticated = if http {
            401
        } else {
            tonic::Code::Unauthenticated as u16
        };
        let client = attested(&transport, "ops").await;

        // Allowed calls work, including the session's sandbox.
        let r = client
            .call_tool("cmd.run", json!({"command": "id -u"}))
            .await
            .unwrap();
        assert_eq!(r["structuredContent"]["stdout"], "65534\n", "{r}");
        let r = client
            .call_tool("aegis.agent.list", json!({}))
            .await
            .unwrap();
        assert_eq!(r["isError"], false);

        // Policy: deny list, path, command, domain, rate limit.
        for (tool, arguments, expected) in [
            ("fs.delete", json!({"path": "/workspace/a"}), 2001),
            ("fs.read", json!({"path": "/workspace/../etc/passwd"}), 2002),
            ("fs.read", json!({"path": "/workspacex/a"}), 2002),
            ("cmd.run", json!({"command": "rm -rf /workspace"}), 2003),
            (
                "web.fetch",
                json!({"url": "https://example.org.evil.com/x"}),
                2004,
            ),
            (
                "web.fetch",
                json!({"url": "https://evilexample.org/"}),
                2004,
            ),
            ("aegis.system.config", json!({}), 2000),
        ] {
            let shown = format!("{tool} {arguments}");
            let (code, _, _) = seal_refused(&client, tool, arguments).await;
            assert_eq!(code, expected, "{shown}");
        }
        for _ in 0..3 {
            client
                .call_tool("aegis.tools.list", json!({}))
                .await
                .expect("within the rate limit");
        }
        let limited = client.call_tool("aegis.tools.list", json!({})).await;
        match limited {
            Err(ClientError::Refused {
                code,
                status,
                ref body,
                ..
            }) => {
                assert_eq!(code, 2005, "{body}");
                if http {
                    assert_eq!(status, 429)
                } else {
                    assert_eq!(status, tonic::Code::ResourceExhausted as u16)
                }
            }
            other => panic!("expected 2005, got {other:?}"),
        }

        // Envelope: tampered payload, wrong key, stale and future timestamps, replay.
        let payload = json!({"jsonrpc": "2.0", "id": "req-t1", "method": "tools/call",
                             "params": {"name": "fs.list", "arguments": {"path": "/workspace"}}});
        let mut tampered = client.envelope(&payload, Utc::now()).unwrap();
        tampered["payload"]["params"]["arguments"]["path"] = json!("/etc");
        let (code, status, _) = refused(client.send(&tampered).await);
        assert_eq!((code, status), (1001, unauthenticated));
        let mut stranger = SealClient::new(transport.clone()).unwrap();
        stranger.set_token(client.token().unwrap().to_owned());
        assert_eq!(
            refused(
                stranger
                    .send(&stranger.envelope(&payload, Utc::now()).unwrap())
                    .await
            )
            .0,
            1001
        );
        for skew in [-31i64, 31] {
            let env = client
                .envelope(&payload, Utc::now() + Duration::seconds(skew))
                .unwrap();
            assert_eq!(refused(client.send(&env).await).0, 1003, "skew {skew}");
        }
        let fresh = client.envelope(&payload, Utc::now()).unwrap();
        client.send(&fresh).await.expect("first use");
        let (code, status, message) = refused(client.send(&fresh).await);
        assert_eq!((code, status), (1002, unauthenticated), "{message}");
        assert!(message.contains("replay"), "{message}");
        // Copies sent at once (so they meet in one batch of the replay guard) pass once.
        let mut other = payload.clone();
        other["id"] = json!("req-t2");
        let twin = client.envelope(&other, Utc::now()).unwrap();
        let copies = futures_util::future::join_all((0..12).map(|_| client.send(&twin))).await;
        let passed = copies.iter().filter(|r| r.is_ok()).count();
        assert_eq!(passed, 1, "{copies:?}");
        for copy in copies.into_iter().filter(|r| r.is_err()) {
            assert_eq!(refused(copy).0, 1002);
        }
        // The same, one level down: a signature twice in one batch is fresh once.
        let request = orchestrator::gateway::sessions::AdmitRequest {
            tenant: orchestrator::DEFAULT_TENANT.to_owned(),
            session: uuid::Uuid::parse_str(client.session_id().unwrap()).unwrap(),
            signature: format!("sig-{}", uuid::Uuid::new_v4()),
            context_name: "ops".to_owned(),
        };
        let unknown = orchestrator::gateway::sessions::AdmitRequest {
            session: uuid::Uuid::new_v4(),
            signature: format!("sig-{}", uuid::Uuid::new_v4()),
            ..request.clone()
        };
        let batch = [request.clone(), unknown, request.clone()];
        let answers: Vec<Option<bool>> =
            orchestrator::gateway::sessions::admit(&app.state.pool, &batch)
                .await
                .unwrap()
                .into_iter()
                .map(|a| a.map(|a| a.fresh))
                .collect();
        assert_eq!(answers, [Some(true), None, Some(false)]);
        let again = orchestrator::gateway::sessions::admit(&app.state.pool, &[request])
            .await
            .unwrap();
        assert!(matches!(&again[..], [Some(a)] if !a.fresh && a.status == "active"));
        let mut malformed = fresh.clone();
        malformed["protocol"] = json!("seal/v0");
        assert_eq!(refused(client.send(&malformed).await).0, 1000);

        // Token: expired (signed by the node, exp in the past) and forged.
        let claims = orchestrator::seal::Claims {
            sub: client.session_id().unwrap().to_owned(),
            iat: Utc::now().timestamp() - 7200,
            exp: Utc::now().timestamp() - 3600,
            scp: "ops".into(),
            wid: "test-worker-1".into(),
            jti: "whatever".into(),
            exec_id: None,
            iss: None,
        };
        let expired = app.state.gateway.issuer().issue(&claims).unwrap();
        let mut late = SealClient::from_saved(&client.save().unwrap()).unwrap();
        late.set_token(expired);
        let list = || json!({"path": "/workspace"});
        assert_eq!(seal_refused(&late, "fs.list", list()).await.0, 1003);
        let mut forged = SealClient::from_saved(&client.save().unwrap()).unwrap();
        let token = client.token().unwrap();
        forged.set_token(format!("{}x", &token[..token.len() - 1]));
        assert_eq!(seal_refused(&forged, "fs.list", list()).await.0, 1004);

        // Attestation: unknown context (3001), workload not admitted (3000).
        let mut other = SealClient::new(transport.clone()).unwrap();
        match other.attest("test-worker-1", "no-such-context").await {
            Err(ClientError::Refused { code, body, .. }) => {
                assert_eq!(code, 3001);
                assert_eq!(body["error_code"], 3001, "flat field: {body}");
                assert_eq!(body["error"]["code"], 3001, "nested field: {body}");
            }
            other => panic!("expected 3001, got {other:?}"),
        }
        assert_eq!(refused(other.attest("intruder", "ops").await).0, 3000);

        // Revocation is immediate; the session's sandbox goes with it.
        let session = client.session_id().unwrap().to_owned();
        let (_, body) = app
            .send_json(
                Method::DELETE,
                &format!("/v1/seal/sessions/{session}"),
                None,
            )
            .await;
        assert_eq!(body["state"], "revoked", "{body}");
        assert_eq!(body["sandbox_destroyed"], true, "{body}");
        assert_eq!(seal_refused(&client, "fs.list", list()).await.0, 1006);
    }

    // Every decision is in the audit log with the session and the SEAL code.
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT caller_id, decision, reason_code FROM audit_log WHERE caller_kind = 'session' ORDER BY seq",
    )
    .fetch_all(&app.state.pool)
    .await
    .unwrap();
    for code in [
        "2001", "2002", "2003", "2004", "2005", "2000", "1001", "1003", "1002", "1000", "1004",
        "1006", "3001", "3000",
    ] {
        assert!(
            rows.iter()
                .any(|(_, d, c)| d == "denied" && c.as_deref() == Some(code)),
            "no audit row with SEAL code {code}"
        );
    }
    assert!(
        rows.iter()
            .any(|(id, d, _)| d == "allowed" && id != "unauthenticated"),
        "allowed calls are audited with the session"
    );
}

#[tokio::test]
async fn sessions_survive_a_restart_and_tools_are_listed_per_session() {
    let db = TestDb::create().await;
    let app = app_keeping_sandboxes(&db).await;
    let transport = Transport::Http(app.http_base.clone());
    let client = attested(&transport, "ops").await;
    let saved = client.save().unwrap();
    let listed = client.list_tools().await.unwrap();
    let names = common::json::strs(&listed["tools"], "name");
    assert!(
        names.contains(&"cmd.run") && names.contains(&"aegis.agent.list"),
        "{names:?}"
    );
    assert!(
        !names.contains(&"aegis.system.config") && !names.contains(&"fs.delete"),
        "{names:?}"
    );
    // tools/list inside an envelope.
    let payload = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"});
    let body = client
        .send(&client.envelope(&payload, Utc::now()).unwrap())
        .await
        .unwrap();
    assert_eq!(body["payload"]["id"], 7);
    assert!(body["payload"]["result"]["tools"].as_array().unwrap().len() == names.len());

    client
        .call_tool(
            "fs.write",
            json!({"path": "/workspace/note", "content": "kept"}),
        )
        .await
        .unwrap();
    app.stop().await.unwrap();

    let app = app_keeping_sandboxes(&db).await;
    let mut saved = saved;
    saved.transport = Transport::Http(app.http_base.clone());
    let again = SealClient::from_saved(&saved).unwrap();
    let r = again
        .call_tool("fs.read", json!({"path": "/workspace/note"}))
        .await
        .expect("the session is still valid");
    assert_eq!(r["structuredContent"]["content"], "kept", "{r}");

    let sessions = app.get_value("/v1/seal/sessions").await;
    assert_eq!(sessions.as_array().unwrap().len(), 1, "{sessions}");
    assert_eq!(sessions[0]["security_context"], "ops");
}

#[tokio::test]
async fn security_contexts_are_managed_by_operators() {
    let db = TestDb::create().await;
    let app = app_on(&db).await;
    let list = app.get_value("/v1/security-contexts").await;
    assert_eq!(list.as_array().unwrap().len(), 2);
    let bad = json!({"name": "Bad Name", "description": "x", "capabilities": []});
    app.posted("/v1/security-contexts", bad, 422).await;
    let unknown_key =
        json!({"name": "x", "description": "x", "capabilities": [], "privileged": true});
    app.posted("/v1/security-contexts", unknown_key, 422).await;
    let good = json!({"name": "readonly", "description": "reads", "capabilities": [{"tool_pattern": "fs.read"}],
                      "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}});
    app.posted("/v1/security-contexts", good, 200).await;
    let mut client = SealClient::new(Transport::Http(app.http_base.clone())).unwrap();
    client
        .attest("test-x", "readonly")
        .await
        .expect("new context usable at once");
    app.answered(Method::DELETE, "/v1/security-contexts/readonly", None, 200)
        .await;
    app.answered(Method::GET, "/v1/security-contexts/readonly", None, 404)
        .await;
}

#[tokio::test]
async fn the_orchestrator_seal_subcommands_attest_and_call() {
    let db = TestDb::create().await;
    let app = app_on(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let session = dir.path().join("session.json");
    let run = |args: Vec<String>| async move { common::cli_json(&args, &[]).await };
    for (grpc, url) in [
        (false, app.http_base.clone()),
        (true, format!("http://{}", app.grpc_addr)),
    ] {
        let mut args = vec![
            "seal".to_owned(),
            "attest".into(),
            "--url".into(),
            url,
            "--workload".into(),
            "test-cli".into(),
            "--context".into(),
            "ops".into(),
            "--session-file".into(),
            session.display().to_string(),
        ];
        if grpc {
            args.push("--grpc".into());
        }
        let attested = run(args).await;
        assert_eq!(attested["status"], "success");
        let result = run(vec![
            "seal".into(),
            "call".into(),
            "aegis.agent.list".into(),
            "{}".into(),
            "--session-file".into(),
            session.display().to_string(),
        ])
        .await;
        assert_eq!(result["isError"], false, "{result}");
        let tools = run(vec![
            "seal".into(),
            "tools".into(),
            "--session-file".into(),
            session.display().to_string(),
        ])
        .await;
        assert!(
            tools["tools"].as_array().is_some_and(|t| !t.is_empty()),
            "{tools}"
        );
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&session).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the saved session holds a private key");
    }
}
