//! Ports in (issue 45): servers started in E2B sandboxes answer at `get_host(port)` through the
//! node, driven by E2B's own Python SDK (unmodified; `tests/python/e2b_ports_client.py`), by
//! `Host` and by E2B's `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers: `python3 -m http.server`,
//! a WebSocket echo, a closed port (502), private sandboxes and their traffic tokens, another
//! key's sandbox, a gone one; one audit row and one counted connection per client connection.

use serde_json::Value;

use crate::common::{python_client, test_config, TestApp, TestDb};
use crate::e2b::ok;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/python/e2b_ports_client.py"
);

/// The domain the node reports; the client sends `<port>-<id>.<domain>` as `Host`.
const DOMAIN: &str = "sandboxes.test";

async fn run(app: &TestApp, scenario: &str, key: &str, extra: &[(&str, String)]) -> Value {
    python_client::run(python_client::Scenario {
        script: SCRIPT,
        args: &[scenario],
        api: app,
        envd: app,
        key,
        sdk_dir: None,
        extra,
        needs: "E2B's SDK, which scripts/test.sh installs",
    })
    .await
}

/// `[status, body]` of a step.
fn answer(report: &Value, step: &str) -> (u64, String) {
    let value = ok(report, step);
    (
        value[0].as_u64().unwrap_or_default(),
        value[1].as_str().unwrap_or_default().to_owned(),
    )
}

async fn port_rows(app: &TestApp, sandbox: &str, decision: &str) -> i64 {
    let id = uuid::Uuid::parse_str(sandbox).expect("a sandbox id");
    sqlx::query_scalar(
        "SELECT count(*) FROM audit_log WHERE action = 'sandbox.port' AND sandbox_id = $1 \
         AND decision = $2",
    )
    .bind(id)
    .bind(decision)
    .fetch_one(&app.state.pool)
    .await
    .expect("count audit rows")
}

async fn opened_connections(app: &TestApp) -> f64 {
    let text = app.get("/metrics").await.text().await.expect("metrics");
    text.lines()
        .find(|l| l.starts_with("aegis_port_connections_total{outcome=\"opened\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn sandbox_ports_answer_at_get_host_under_their_traffic_rules() {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.e2b.domain = DOMAIN.to_owned();
    let app = TestApp::spawn_with(config).await;
    let key = app.create_key("ports-owner", "operator").await;
    let other = app.create_key("ports-other", "operator").await;
    let opened_before = opened_connections(&app).await;
    let r = run(
        &app,
        "ports",
        &key,
        &[(
            "E2B_OTHER_KEY",
            orchestrator::api::e2b::keys::to_e2b_form(&other),
        )],
    )
    .await;

    // The domain is the configured one, and get_host names the port and the sandbox.
    let id = r["sandbox_id"].as_str().expect("sandbox id").to_owned();
    assert_eq!(r["domain"], DOMAIN);
    assert_eq!(r["host"], format!("8000-{id}.{DOMAIN}"));
    assert_eq!(ok(&r, "listening"), 200);
    // `python3 -m http.server` answers by Host and by E2B's headers.
    let (status, body) = answer(&r, "by_host");
    assert_eq!(
        (status, body.as_str()),
        (200, "hello from a sandbox port ✓\n")
    );
    assert_eq!(ok(&r, "keep_alive"), &serde_json::json!([200, 200, 200]));
    let (status, body) = answer(&r, "by_headers");
    assert_eq!(
        (status, body.as_str()),
        (200, "hello from a sandbox port ✓\n")
    );
    assert_eq!(ok(&r, "missing_file"), 404, "the server's own answers pass");
    // Nothing listens: 502 at once, saying so.
    for step in ["closed_port", "closed_port_headers"] {
        let (status, body) = answer(&r, step);
        assert_eq!(status, 502, "{step}");
        assert!(body.contains("port is not open"), "{step}: {body}");
        assert!(body.contains("8999"), "{step}: {body}");
    }
    assert_eq!(
        ok(&r, "envd_port_is_the_door"),
        204,
        "E2B's headers naming envd's port reach the door's envd"
    );
    // A WebSocket round trip through the node.
    let ws = ok(&r, "websocket");
    assert_eq!(ws["status"], "HTTP/1.1 101 Switching Protocols");
    assert_eq!(ws["accepted"], true);
    assert_eq!(ws["echo"], "ping ✓ through the node");

    // Private: the token of its create answer, and only it.
    assert_eq!(r["private_token_given"], true);
    assert_eq!(r["public_token"], Value::Null);
    assert_eq!(ok(&r, "private_listening"), 200);
    let (status, denied_body) = answer(&r, "private_without_token");
    assert_eq!(status, 403);
    assert!(
        denied_body.contains("traffic access token"),
        "{denied_body}"
    );
    assert_eq!(answer(&r, "private_with_token").0, 200);
    assert_eq!(
        answer(&r, "private_with_other_token"),
        (403, denied_body.clone())
    );
    assert_eq!(ok(&r, "private_by_headers_with_token"), 200);
    assert_eq!(ok(&r, "private_by_headers_without"), 403);
    assert_eq!(ok(&r, "private_info"), DOMAIN);
    // Another key learns nothing: its SDK finds no such sandbox, and its own private
    // sandbox's token gets exactly what no token gets.
    let connect = ok(&r, "other_key_connect").as_str().unwrap_or_default();
    assert!(
        connect.to_lowercase().contains("not found"),
        "another key's connect finds nothing: {connect}"
    );
    assert_eq!(answer(&r, "other_key_token"), (403, denied_body));
    // Gone or never there: E2B's "not found".
    for step in ["unknown_sandbox", "killed_sandbox"] {
        let (status, body) = answer(&r, step);
        assert_eq!(status, 502, "{step}");
        assert!(body.contains("The sandbox was not found"), "{step}: {body}");
    }

    // One audit row per client connection, as the owner key, with the sandbox: the readiness
    // probes and WebSocket attempts one each, then by_host, keep_alive (three requests),
    // by_headers, missing_file and the two closed-port requests one each; envd's port none.
    // Refusals for a token are not rows.
    let public_rows = port_rows(&app, &id, "allowed").await;
    let private = r["private_id"].as_str().expect("private id");
    let probes = r["probes"].as_i64().expect("probes");
    let ws = r["websocket_attempts"]
        .as_i64()
        .expect("websocket attempts");
    assert_eq!(
        public_rows,
        probes + ws + 6,
        "one row per client connection, not per request"
    );
    assert!(port_rows(&app, private, "allowed").await >= 2);
    assert_eq!(port_rows(&app, private, "denied").await, 0);
    let opened = opened_connections(&app).await - opened_before;
    assert!(
        opened >= (public_rows + 2) as f64,
        "every admitted connection is counted: {opened}"
    );
}

/// The keep-alive client of `keep_alive` makes one row: run it alone and count exactly.
#[tokio::test]
async fn a_client_connections_requests_are_one_audit_row() {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.e2b.domain = DOMAIN.to_owned();
    let app = TestApp::spawn_with(config).await;
    let key = app.create_key("ports-bench", "operator").await;
    let r = run(
        &app,
        "bench",
        &key,
        &[("E2B_BENCH_REQUESTS", "20".to_owned())],
    )
    .await;
    assert_eq!(r["listening"], 200);
    let id = r["sandbox_id"].as_str().expect("sandbox id");
    // The probes of `wait_listening` are connections of their own; the 20 requests one.
    let rows = port_rows(&app, id, "allowed").await;
    let probes = r["probes"].as_i64().expect("probes");
    assert_eq!(
        rows,
        probes + 1,
        "20 requests on one connection are one row (plus one per readiness probe)"
    );
}

/// A port of a sandbox one replica holds, reached through another: the replica the client
/// reached admits and audits the connection, the holder opens the port and relays the bytes
/// over the peer channel. By E2B's headers and by `Host`; a closed port is still 502.
#[tokio::test]
async fn a_sandbox_port_answers_through_another_replica() {
    use crate::common::replicas::{in_process, SECRET};

    let db = TestDb::create().await;
    let config = || {
        let mut config = in_process(&db, Some(SECRET));
        config.e2b.domain = DOMAIN.to_owned();
        config
    };
    let holder = TestApp::spawn_with(config()).await;
    let other = TestApp::spawn_with(config()).await;
    let key = holder.create_key("ports-remote", "operator").await;
    let r = run(
        &holder,
        "remote",
        &key,
        &[("E2B_REMOTE_URL", format!("{}/e2b", other.http_base))],
    )
    .await;
    let sandbox = r["sandbox_id"].as_str().expect("a sandbox id").to_owned();
    assert_eq!(ok(&r, "listening"), 200, "{r}");
    for step in ["remote_by_headers", "remote_by_host"] {
        let (status, body) = answer(&r, step);
        assert_eq!(status, 200, "{step}: {r}");
        assert!(body.contains("hello from a sandbox port"), "{step}: {body}");
    }
    let (status, body) = answer(&r, "remote_closed");
    assert_eq!(status, 502, "{r}");
    assert!(body.contains("port is not open"), "{body}");

    // Each connection was decided once, by the replica the client reached: one row each for
    // the holder's probes and the three through the other replica, naming the sandbox; the
    // three went over the peer channel.
    let probes = r["probes"].as_i64().expect("the probes' count");
    assert_eq!(
        port_rows(&holder, &sandbox, "allowed").await,
        probes + 3,
        "one audit row per connection: {r}"
    );
    let metrics = other.get("/metrics").await.text().await.expect("metrics");
    assert!(
        metrics.lines().any(
            |l| l.starts_with("aegis_forwarded_calls_total{direction=\"sent\",outcome=\"ok\"}")
        ),
        "{metrics}"
    );
}
