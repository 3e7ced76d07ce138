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
    let needs = "E2B's SDK, which scripts/test.sh installs";
    python_client::run(python_client::Scenario {
        extra,
        ..python_client::Scenario::on(app, SCRIPT, &[scenario], key, needs)
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

async fn admin_rows(app: &TestApp, action: &str) -> i64 {
    app.one("SELECT count(*) FROM audit_log WHERE action = $1", action)
        .await
}

/// Auto-resume on traffic, through E2B's SDK: a sandbox made with `lifecycle` `auto_resume`
/// and paused by its timeout is woken by a burst of requests to its port, once (one resume
/// row for six requests); its files come back, its processes do not (a pause here keeps the
/// files only), so the requests reach a closed port (502) until its server is started again.
/// Without `auto_resume` a request is E2B's edge's 409 and the sandbox stays paused; a private
/// one is woken only by a request carrying its own token.
#[tokio::test]
async fn traffic_wakes_a_paused_sandbox_once_only_when_it_asked_and_may_reach_it() {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.e2b.domain = DOMAIN.to_owned();
    let app = TestApp::spawn_with(config).await;
    let key = app.create_key("ports-wake", "operator").await;
    let other = app.create_key("ports-wake-other", "operator").await;
    let r = run(
        &app,
        "wake",
        &key,
        &[(
            "E2B_OTHER_KEY",
            orchestrator::api::e2b::keys::to_e2b_form(&other),
        )],
    )
    .await;
    assert_eq!(
        ok(&r, "lifecycle"),
        &serde_json::json!({"on_timeout": "pause", "auto_resume": true}),
        "{r}"
    );
    assert_eq!(ok(&r, "served"), 200, "{r}");
    assert_eq!(ok(&r, "paused"), "paused", "{r}");
    // Every request of the burst was answered after the one wake: the port, now closed.
    let burst = ok(&r, "burst").as_array().expect("the burst's answers");
    assert_eq!(burst.len(), 6);
    for answer in burst {
        assert_eq!(answer[0], 502, "{r}");
        assert!(
            answer[1]
                .as_str()
                .is_some_and(|b| b.contains("port is not open")),
            "{r}"
        );
    }
    assert_eq!(ok(&r, "state_after_burst"), "running", "{r}");
    assert_eq!(ok(&r, "running_after_burst"), true, "{r}");
    assert_eq!(
        ok(&r, "served_again"),
        &serde_json::json!([200, "hello from a sandbox port ✓\n"]),
        "the files came back with the wake: {r}"
    );

    // Without auto_resume: 409 as E2B's edge, not woken.
    assert_eq!(ok(&r, "still_paused"), "paused", "{r}");
    let (status, body) = answer(&r, "no_auto_resume");
    assert_eq!(status, 409, "{r}");
    let body: Value = serde_json::from_str(&body).expect("a JSON answer");
    assert_eq!(body["code"], 409);
    assert_eq!(body["canAutoResume"], false);
    assert_eq!(body["sandboxId"], r["still_id"]);
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("The sandbox is paused")),
        "{body}"
    );
    assert_eq!(ok(&r, "still_state"), "paused", "{r}");

    // Private: refused without its own token, and not woken by the refused requests.
    assert_eq!(ok(&r, "private_paused"), "paused", "{r}");
    for step in [
        "private_no_token",
        "private_made_up_token",
        "private_other_keys_token",
    ] {
        let (status, body) = answer(&r, step);
        assert_eq!(status, 403, "{step}: {r}");
        assert!(body.contains("traffic access token"), "{step}: {body}");
    }
    assert_eq!(ok(&r, "private_state_refused"), "paused", "{r}");
    let (status, body) = answer(&r, "private_own_token");
    assert_eq!(status, 502, "woken, its port closed: {r}");
    assert!(body.contains("port is not open"), "{body}");
    assert_eq!(ok(&r, "private_state_woken"), "running", "{r}");

    // One resume per woken sandbox, however many requests: the burst's and the private one's.
    assert_eq!(
        admin_rows(&app, "e2b.sandbox.resume").await,
        2,
        "one resume each for the burst and the private sandbox"
    );
    // Each woken connection was decided as the owner key, with a row; refusals for a token none.
    let private = r["private_id"].as_str().expect("private id");
    assert_eq!(port_rows(&app, private, "denied").await, 0);
    // The burst's six connections were each decided (and one woke it): a row each, allowed.
    let id = r["sandbox_id"].as_str().expect("sandbox id");
    assert!(port_rows(&app, id, "allowed").await >= 6, "{r}");
}

/// A CA of the suite's own and a certificate for `*.<DOMAIN>` signed by it, as PEM files in
/// `dir`: (CA, certificate, key).
fn suite_ca(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "aegis suite CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().expect("CA key");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let mut leaf_params =
        CertificateParams::new(vec![format!("*.{DOMAIN}")]).expect("certificate params");
    leaf_params.use_authority_key_identifier_extension = true;
    leaf_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_key = KeyPair::generate().expect("key");
    let leaf = leaf_params
        .signed_by(&leaf_key, &ca, &ca_key)
        .expect("certificate");
    let paths = (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("key.pem"),
    );
    std::fs::write(&paths.0, ca.pem()).expect("write CA");
    std::fs::write(&paths.1, leaf.pem()).expect("write certificate");
    std::fs::write(&paths.2, leaf_key.serialize_pem()).expect("write key");
    (paths.0, paths.1, paths.2)
}

/// The TLS listener (`server.tls`) with a wildcard certificate the suite's CA signed: E2B's
/// `https://<get_host(port)>` reaches the port (by name and by E2B's headers), the node's own
/// routes answer there too, a client that does not trust the CA or asks another name is
/// refused at the handshake, and a private sandbox needs its own token over TLS as in clear
/// (403 without it and with another key's sandbox's). A certificate that cannot be read stops
/// the start, naming the key.
#[tokio::test]
async fn the_tls_listener_serves_sandbox_ports_under_the_operators_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, cert, key_file) = suite_ca(dir.path());
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.e2b.domain = DOMAIN.to_owned();
    config.server.tls = Some(orchestrator::config::TlsConfig {
        listen: "127.0.0.1:0".parse().expect("address"),
        cert_file: dir.path().join("missing.pem"),
        key_file: key_file.clone(),
    });
    let refused = orchestrator::app::Application::build(config.clone())
        .await
        .err()
        .expect("a start without its certificate fails")
        .to_string();
    assert!(
        refused.contains("server.tls.cert_file") && refused.contains("missing.pem"),
        "{refused}"
    );
    config.server.tls = Some(orchestrator::config::TlsConfig {
        listen: "127.0.0.1:0".parse().expect("address"),
        cert_file: cert,
        key_file,
    });
    let app = TestApp::spawn_with(config).await;
    let tls = app.tls_addr.expect("the TLS listener is bound");
    let key = app.create_key("ports-tls", "operator").await;
    let other = app.create_key("ports-tls-other", "operator").await;
    let r = run(
        &app,
        "tls",
        &key,
        &[
            (
                "E2B_OTHER_KEY",
                orchestrator::api::e2b::keys::to_e2b_form(&other),
            ),
            ("E2B_TLS_ADDR", tls.to_string()),
            ("E2B_TLS_CA", ca.display().to_string()),
        ],
    )
    .await;
    assert_eq!(ok(&r, "listening"), 200, "{r}");
    for step in ["tls_by_host", "tls_by_headers"] {
        assert_eq!(
            answer(&r, step),
            (200, "hello from a sandbox port ✓\n".to_owned()),
            "{step}: {r}"
        );
    }
    assert_eq!(ok(&r, "tls_node_routes"), 200, "{r}");
    for step in ["tls_untrusted", "tls_other_name"] {
        let error = r[step]["error"].as_str().unwrap_or_default();
        assert!(error.starts_with("SSLCertVerificationError"), "{step}: {r}");
    }
    assert_eq!(ok(&r, "private_listening"), 200, "{r}");
    for step in ["tls_private_without_token", "tls_private_other_keys_token"] {
        let (status, body) = answer(&r, step);
        assert_eq!(status, 403, "{step}: {r}");
        assert!(body.contains("traffic access token"), "{step}: {body}");
    }
    assert_eq!(answer(&r, "tls_private_with_token").0, 200, "{r}");
    let private = r["private_id"].as_str().expect("private id");
    assert_eq!(
        port_rows(&app, private, "denied").await,
        0,
        "token refusals are no rows"
    );
    // maskRequestHost: the server saw the sandbox's Host, its port in place of ${PORT}, the
    // header's name in its canonical case (as E2B's edge sends it).
    assert_eq!(
        answer(&r, "masked_host"),
        (200, "Host: custom-host.example.com:8080".to_owned()),
        "{r}"
    );
    assert_eq!(
        ok(&r, "masked_detail"),
        "custom-host.example.com:${PORT}",
        "{r}"
    );
}
