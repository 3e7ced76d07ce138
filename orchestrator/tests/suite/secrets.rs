//! Issue 10, items 2 and 3, as attacks on the real service: secrets never leave (listings, gets,
//! audit, system.config, validation messages), attestation needs proof (enrolment secret,
//! one-time token, or an explicit opt-out), attestation floods are refused per source and
//! node-wide, and live-sandbox quotas refuse with a clear message.

use crate::common;

use aegis_cli::seal_client::{ClientError, Proof, SealClient, Transport};
use common::agent::command_agent;
use common::refusal::refused;
use common::{test_config, TestApp, TestDb};
use orchestrator::config::NodeConfig;
use reqwest::Method;
use serde_json::{json, Value};

const CONFIG_SECRET: &str = "cfg-enrolment-SECRET-0001";
const API_SECRET: &str = "api-enrolment-SECRET-0002";
const ARG_SECRET: &str = "sk-live-ARGUMENT-SECRET-0003";

fn contexts() -> Vec<Value> {
    vec![
        json!({"name": "guarded", "description": "patterns are only a filter",
               "capabilities": [{"tool_pattern": "aegis.*"}],
               "attestation": {"workload_patterns": ["ci-*"]}}),
        json!({"name": "enrolled", "description": "a shared secret proves identity",
               "capabilities": [{"tool_pattern": "aegis.*"}],
               "attestation": {"enrolment_secret": CONFIG_SECRET}}),
        json!({"name": "open", "description": "explicitly unverified",
               "capabilities": [{"tool_pattern": "aegis.*"}, {"tool_pattern": "cmd.run", "command_allowlist": ["id"]}],
               "runtime": {"language": "busybox", "version": "1"},
               "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}}),
    ]
}

fn config(db: &TestDb) -> NodeConfig {
    let mut config = test_config(&db.url);
    config.seal.security_contexts = contexts();
    config.seal.attest_per_minute = 1000;
    config.seal.attest_per_minute_per_source = 1000;
    config.seal.attest_per_minute_node = 1000;
    config
}

fn http(app: &TestApp) -> Transport {
    Transport::Http(app.http_base.clone())
}

fn grpc(app: &TestApp) -> Transport {
    Transport::Grpc(format!("http://{}", app.grpc_addr))
}

async fn attest(
    transport: Transport,
    workload: &str,
    context: &str,
    proof: Proof,
) -> Result<Value, ClientError> {
    let mut client = SealClient::new(transport).unwrap();
    client.attest_with(workload, context, &proof).await
}

fn token(secret: Option<&str>, token: Option<&str>) -> Proof {
    Proof {
        secret: secret.map(str::to_owned),
        token: token.map(str::to_owned),
    }
}

async fn issue_token(app: &TestApp, key: &str, context: &str, body: Value) -> (u16, Value) {
    let r = app
        .rest_as(key)
        .post_json(
            &format!("/v1/security-contexts/{context}/attestation-tokens"),
            &body,
        )
        .await;
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn a_readonly_key_never_sees_a_secret_anywhere() {
    let db = TestDb::create().await;
    let app = TestApp::spawn_with(config(&db)).await;
    let readonly = app.create_key("auditor", "readonly").await;

    // A context with a secret stored through the API, too.
    let body = json!({
        "name": "api-made",
        "description": "",
        "capabilities": [],
        "attestation": {"enrolment_secret": API_SECRET},
    });
    let r = app.post_json("/v1/security-contexts", &body).await;
    assert_eq!(r.status(), 200);

    // Attacks that try to get secrets into messages and the audit log: a secret as a wrongly
    // typed argument, a wrong enrolment secret, a correct one.
    let (status, body) = app
        .call_tool("aegis.tools.list", json!({"limit": ARG_SECRET}))
        .await;
    assert_eq!(status, 422, "{body}");
    let text = body.to_string();
    assert!(!text.contains(ARG_SECRET), "{text}");
    assert!(text.contains("/limit") && text.contains("integer") && text.contains("got string"));
    let (code, _, message) = refused(
        attest(
            http(&app),
            "w1",
            "enrolled",
            token(Some("not-the-secret-at-all"), None),
        )
        .await,
    );
    assert_eq!(code, 3000);
    assert!(!message.contains(CONFIG_SECRET));
    attest(
        http(&app),
        "w1",
        "enrolled",
        token(Some(CONFIG_SECRET), None),
    )
    .await
    .expect("the right secret admits");

    let mut seen = String::new();
    for path in [
        "/v1/security-contexts",
        "/v1/security-contexts/enrolled",
        "/v1/security-contexts/api-made",
        "/v1/audit?limit=500",
        "/v1/seal/sessions?all=true",
    ] {
        let r = app
            .rest_as(&readonly)
            .response(Method::GET, path, None)
            .await;
        assert_eq!(r.status(), 200, "{path}");
        seen.push_str(&r.text().await.unwrap());
    }
    for secret in [CONFIG_SECRET, API_SECRET, ARG_SECRET] {
        assert!(!seen.contains(secret), "{secret} leaked");
    }
    let one = app
        .rest_as(&readonly)
        .get_value("/v1/security-contexts/enrolled")
        .await;
    assert_eq!(one["attestation"]["enrolment_secret"], "set", "{one}");
    let list = app
        .rest_as(&readonly)
        .get_value("/v1/security-contexts")
        .await;
    let guarded = common::json::find(&list, "name", "guarded");
    assert_eq!(guarded["attestation"]["enrolment_secret"], "not set");

    // The admin sees the same redacted views (secrets are write-only for every role).
    let admin_view = app
        .response(Method::GET, "/v1/security-contexts", None)
        .await
        .text()
        .await
        .unwrap();
    assert!(!admin_view.contains(CONFIG_SECRET) && !admin_view.contains(API_SECRET));

    // A readonly key may not call tools at all; system.config shown to an operator is redacted.
    let r = app
        .rest_as(&readonly)
        .post_json(
            "/v1/tools/call",
            &json!({"name": "aegis.system.config", "arguments": {}}),
        )
        .await;
    assert_eq!(r.status(), 403);
    let (status, body) = app.call_tool("aegis.system.config", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let text = body.to_string();
    assert!(!text.contains(CONFIG_SECRET), "{text}");
    assert!(text.contains("enrolment_secret: set"), "{text}");

    // The audit rows themselves (as stored) hold no secret either.
    let pool = db.pool().await;
    let stored: Vec<(Option<String>, String)> =
        sqlx::query_as("SELECT reason, args_digest FROM audit_log")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(stored.iter().any(|(r, _)| r
        .as_deref()
        .is_some_and(|r| r.contains("invalid arguments"))));
    for (reason, _) in &stored {
        let reason = reason.as_deref().unwrap_or_default();
        for secret in [CONFIG_SECRET, API_SECRET, ARG_SECRET] {
            assert!(!reason.contains(secret), "{reason}");
        }
    }

    // check-config prints the contexts of the config file with the secret replaced.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.yaml");
    std::fs::write(
        &file,
        format!(
            "seal:\n  security_contexts:\n    - name: c\n      description: d\n      capabilities: []\n      attestation:\n        enrolment_secret: {CONFIG_SECRET}\n"
        ),
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args(["--config", &file.display().to_string(), "check-config"])
        .env_remove("DATABASE_URL")
        .output()
        .await
        .unwrap();
    let printed = common::succeeded(out, "check-config");
    assert!(printed.contains("enrolment_secret: set"), "{printed}");
    assert!(!printed.contains(CONFIG_SECRET));
}

#[tokio::test]
async fn a_workload_needs_a_secret_a_one_time_token_or_an_explicit_opt_out() {
    let db = TestDb::create().await;
    let app = TestApp::spawn_with(config(&db)).await;

    for transport in [http(&app), grpc(&app)] {
        // Patterns alone are not proof: refused, and told how to get in.
        let (code, status, message) =
            refused(attest(transport.clone(), "ci-1", "guarded", Proof::default()).await);
        assert_eq!(code, 3000, "{message}");
        if matches!(transport, Transport::Http(_)) {
            assert_eq!(status, 401);
        }
        assert!(message.contains("attestation_token"), "{message}");
        // A secret where the context has none is refused, not ignored.
        let (code, _, _) = refused(
            attest(
                transport.clone(),
                "ci-1",
                "guarded",
                token(Some("0123456789abcdef0123"), None),
            )
            .await,
        );
        assert_eq!(code, 3000);
        // The explicit opt-out admits without proof.
        attest(transport.clone(), "test-1", "open", Proof::default())
            .await
            .expect("allow_unverified admits");
    }

    // Only operators issue tokens.
    let readonly = app.create_key("viewer", "readonly").await;
    let (status, _) = issue_token(&app, &readonly, "guarded", json!({})).await;
    assert_eq!(status, 403);
    let (status, body) = issue_token(&app, common::TEST_ADMIN_KEY, "nope", json!({})).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = issue_token(
        &app,
        common::TEST_ADMIN_KEY,
        "guarded",
        json!({"ttl_secs": 0}),
    )
    .await;
    assert_eq!(status, 422, "{body}");

    // A token works once and only once, over either transport.
    for transport in [http(&app), grpc(&app)] {
        let (status, issued) =
            issue_token(&app, common::TEST_ADMIN_KEY, "guarded", json!({})).await;
        assert_eq!(status, 201, "{issued}");
        let secret = issued["token"].as_str().unwrap().to_owned();
        assert!(secret.starts_with("aat_"));
        // `workload` attests to `guarded` with the access token `with`.
        let attest_with = |workload: &'static str, with: &str| {
            attest(
                transport.clone(),
                workload,
                "guarded",
                token(None, Some(with)),
            )
        };
        let ok = attest_with("ci-7", &secret)
            .await
            .expect("a fresh token admits");
        assert_eq!(ok["status"], "success");
        let (code, _, message) = refused(attest_with("ci-7", &secret).await);
        assert_eq!(code, 3000);
        assert!(message.contains("already used"), "{message}");
        // The filter still holds for a token holder.
        let (status, issued) =
            issue_token(&app, common::TEST_ADMIN_KEY, "guarded", json!({})).await;
        assert_eq!(status, 201);
        let other = issued["token"].as_str().unwrap().to_owned();
        let (code, _, _) = refused(attest_with("intruder", &other).await);
        assert_eq!(code, 3000);
    }

    // Bound to one workload: another workload is refused without burning it.
    let (_, issued) = issue_token(
        &app,
        common::TEST_ADMIN_KEY,
        "guarded",
        json!({"workload_id": "ci-bound"}),
    )
    .await;
    let bound = issued["token"].as_str().unwrap().to_owned();
    let (code, _, message) =
        refused(attest(http(&app), "ci-other", "guarded", token(None, Some(&bound))).await);
    assert_eq!(code, 3000);
    assert!(message.contains("another workload"), "{message}");
    attest(http(&app), "ci-bound", "guarded", token(None, Some(&bound)))
        .await
        .expect("the bound workload gets in");

    // A token for another context, an expired one, an unknown one.
    let (_, issued) = issue_token(&app, common::TEST_ADMIN_KEY, "enrolled", json!({})).await;
    let foreign = issued["token"].as_str().unwrap().to_owned();
    let (code, _, message) =
        refused(attest(http(&app), "ci-1", "guarded", token(None, Some(&foreign))).await);
    assert_eq!(code, 3000);
    assert!(message.contains("not issued for"), "{message}");
    let (_, issued) = issue_token(&app, common::TEST_ADMIN_KEY, "guarded", json!({})).await;
    let expiring = issued["token"].as_str().unwrap().to_owned();
    let pool = db.pool().await;
    sqlx::query(
        "UPDATE seal_attestation_tokens SET expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind(uuid::Uuid::parse_str(issued["id"].as_str().unwrap()).unwrap())
    .execute(&pool)
    .await
    .unwrap();
    let (_, _, message) =
        refused(attest(http(&app), "ci-1", "guarded", token(None, Some(&expiring))).await);
    assert!(message.contains("expired"), "{message}");
    let (_, _, message) =
        refused(attest(http(&app), "ci-1", "guarded", token(None, Some("aat_0000"))).await);
    assert!(message.contains("unknown"), "{message}");

    // Concurrent redemption of one token: exactly one session.
    let (_, issued) = issue_token(&app, common::TEST_ADMIN_KEY, "guarded", json!({})).await;
    let raced = issued["token"].as_str().unwrap().to_owned();
    let attempts = (0..6).map(|i| {
        let transport = http(&app);
        let raced = raced.clone();
        async move {
            attest(
                transport,
                &format!("ci-race-{i}"),
                "guarded",
                token(None, Some(&raced)),
            )
            .await
        }
    });
    let results = futures_util::future::join_all(attempts).await;
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );

    // Listings never show a token, only its prefix and use.
    let r = app
        .rest_as(&readonly)
        .response(
            Method::GET,
            "/v1/security-contexts/guarded/attestation-tokens",
            None,
        )
        .await;
    let text = r.text().await.unwrap();
    for t in [&raced, &bound, &expiring] {
        assert!(!text.contains(t.as_str()), "{text}");
    }
    let stored: Vec<String> = sqlx::query_scalar("SELECT token_hash FROM seal_attestation_tokens")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(stored
        .iter()
        .all(|h| h.len() == 64 && !h.starts_with("aat_")));
    let sessions = crate::common::count(
        &pool,
        "SELECT count(*) FROM seal_sessions WHERE context_name = 'guarded'",
    )
    .await;
    assert_eq!(sessions, 4, "two tokens, the bound one, the race winner");
}

async fn attest_from(app: &TestApp, local: &str, workload: &str) -> (u16, Option<String>, Value) {
    let client = reqwest::Client::builder()
        .local_address(local.parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let probe = SealClient::new(http(app)).unwrap();
    let r = client
        .post(format!("{}/v1/seal/attest", app.http_base))
        .json(
            &json!({"public_key": probe.public_key_b64(), "workload_id": workload,
                      "security_context": "open"}),
        )
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let retry = common::rest::header(&r, "retry-after");
    (status, retry, r.json().await.unwrap())
}

#[tokio::test]
async fn attestation_floods_are_refused_per_source_and_node_wide() {
    // Per source address: 127.0.0.1 is cut off at 3, 127.0.0.2 still gets in.
    let db = TestDb::create().await;
    let mut c = config(&db);
    c.seal.attest_per_minute_per_source = 3;
    let app = TestApp::spawn_with(c).await;
    for i in 0..3 {
        let (status, _, body) = attest_from(&app, "127.0.0.1", &format!("test-a{i}")).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, retry, body) = attest_from(&app, "127.0.0.1", "test-a9").await;
    assert_eq!(status, 429, "{body}");
    assert!(retry.is_some_and(|r| r.parse::<u64>().unwrap() > 0));
    assert!(
        common::json::text(&body["message"]).contains("source address 127.0.0.1"),
        "{body}"
    );
    let (status, _, body) = attest_from(&app, "127.0.0.2", "test-b0").await;
    assert_eq!(status, 200, "{body}");
    app.stop().await.unwrap();

    // Node-wide: 3 attempts from anywhere, then everyone waits.
    let db = TestDb::create().await;
    let mut c = config(&db);
    c.seal.attest_per_minute_node = 3;
    let app = TestApp::spawn_with(c).await;
    for (i, source) in ["127.0.0.1", "127.0.0.2", "127.0.0.3"].iter().enumerate() {
        let (status, _, body) = attest_from(&app, source, &format!("test-n{i}")).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, retry, body) = attest_from(&app, "127.0.0.4", "test-n9").await;
    assert_eq!(status, 429, "{body}");
    assert!(retry.is_some());
    assert!(
        body["message"].as_str().unwrap().contains("this node"),
        "{body}"
    );
    // Over gRPC too.
    let (code, status, _) = refused(attest(grpc(&app), "test-g", "open", Proof::default()).await);
    assert_eq!(code, 3002);
    assert_eq!(status, tonic::Code::ResourceExhausted as u16);
}

fn quota_agent() -> String {
    command_agent("quota-agent", "Work in the sandbox.", &["id"])
}

async fn create_sandbox(app: &TestApp, key: &str) -> (u16, Value) {
    let r = app
        .rest_as(key)
        .post_json("/v1/sandboxes", &json!({"agent": "quota-agent"}))
        .await;
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn sandbox_quotas_refuse_with_a_clear_message() {
    let db = TestDb::create().await;
    let mut c = config(&db);
    c.sandbox.max_sandboxes_per_api_key = 1;
    c.sandbox.max_sandboxes_per_context = 1;
    c.sandbox.max_live_sandboxes = 2;
    let app = TestApp::spawn_with(c).await;
    let (status, body) = app.post_yaml("/v1/agents", &quota_agent()).await;
    assert_eq!(status, 201, "{body}");
    let alice = app.create_key("alice", "operator").await;
    let bob = app.create_key("bob", "operator").await;
    let carol = app.create_key("carol", "operator").await;
    let pool = db.pool().await;
    let live = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM sandboxes WHERE state IN ('creating', 'running')",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };

    // Per API key: alice's second sandbox is refused, nothing is created.
    let (status, first) = create_sandbox(&app, &alice).await;
    assert_eq!(status, 201, "{first}");
    let (status, body) = create_sandbox(&app, &alice).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["code"], "quota_exceeded", "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.contains("API key") && message.contains("limit 1"),
        "{message}"
    );
    assert_eq!(live().await, 1);

    // Node-wide: bob fills the node, carol is refused.
    let (status, _) = create_sandbox(&app, &bob).await;
    assert_eq!(status, 201);
    let (status, body) = create_sandbox(&app, &carol).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("this node"),
        "{body}"
    );
    assert_eq!(live().await, 2);

    // Once alice destroys hers, carol gets one.
    let id = first["sandbox_id"].as_str().unwrap();
    app.rest_as(&alice)
        .answered(Method::DELETE, &format!("/v1/sandboxes/{id}"), None, 200)
        .await;
    let (status, body) = create_sandbox(&app, &carol).await;
    assert_eq!(status, 201, "{body}");

    // Per security context: clear the node, then a second session of `open` is refused.
    for sandbox in sqlx::query_scalar::<_, uuid::Uuid>(
        "SELECT id FROM sandboxes WHERE state IN ('creating', 'running')",
    )
    .fetch_all(&pool)
    .await
    .unwrap()
    {
        app.answered(
            Method::DELETE,
            &format!("/v1/sandboxes/{sandbox}"),
            None,
            200,
        )
        .await;
    }
    let mut one = SealClient::new(http(&app)).unwrap();
    one.attest("test-q1", "open").await.unwrap();
    let r = one
        .call_tool("cmd.run", json!({"command": "id -u"}))
        .await
        .unwrap();
    assert_eq!(r["structuredContent"]["stdout"], "65534\n", "{r}");
    let mut two = SealClient::new(http(&app)).unwrap();
    two.attest("test-q2", "open").await.unwrap();
    let (_, status, message) = refused(two.call_tool("cmd.run", json!({"command": "id -u"})).await);
    assert_eq!(status, 403);
    assert!(
        message.contains("security context `open`") && message.contains("limit 1"),
        "{message}"
    );
    assert_eq!(live().await, 1);
}

#[tokio::test]
async fn the_cli_issues_a_token_that_admits_once() {
    let db = TestDb::create().await;
    let app = TestApp::spawn_with(config(&db)).await;
    let dir = tempfile::tempdir().unwrap();
    let session = dir.path().join("session.json");
    let run = |args: Vec<String>| {
        let base = app.http_base.clone();
        async move {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"))
                .args(&args)
                .env("ORCHESTRATOR_URL", base)
                .env("ORCHESTRATOR_API_KEY", common::TEST_ADMIN_KEY)
                .env_remove("DATABASE_URL")
                .output()
                .await
                .unwrap()
        }
    };
    let out = run(vec![
        "seal".into(),
        "token".into(),
        "issue".into(),
        "--context".into(),
        "guarded".into(),
        "--workload".into(),
        "ci-cli".into(),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let issued: Value = serde_json::from_slice(&out.stdout).unwrap();
    let token = issued["token"].as_str().unwrap().to_owned();
    let attest = |token: String| {
        let args = vec![
            "seal".to_owned(),
            "attest".into(),
            "--url".into(),
            app.http_base.clone(),
            "--workload".into(),
            "ci-cli".into(),
            "--context".into(),
            "guarded".into(),
            "--session-file".into(),
            session.display().to_string(),
            "--token".into(),
            token,
        ];
        run(args)
    };
    let first = attest(token.clone()).await;
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let second = attest(token).await;
    assert!(!second.status.success());
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("already used"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
}
