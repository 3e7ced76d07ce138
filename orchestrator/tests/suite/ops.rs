//! Day-two operations against the real service: Prometheus metrics, request ids, the one JSON
//! error shape, the OpenAPI document under a schemathesis run, SIGTERM and sandboxes, and the
//! reaping of sandboxes whose database vanished.

use crate::common;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use common::agent::command_agent;
use common::binary;
use common::{docker_lines, TestApp, TestDb, TEST_ADMIN_KEY};
use reqwest::Method;
use serde_json::{json, Value};

fn sleeper() -> String {
    command_agent("sleeper", "Sleep.", &["sleep", "echo"])
}

/// One parsed sample: name, labels, value.
type Sample = (String, HashMap<String, String>, f64);

/// Scrapes `/metrics` and parses it with the Prometheus client's own parser (Python).
async fn scrape(base: &str) -> (HashMap<String, String>, Vec<Sample>) {
    let r = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("scrape");
    assert_eq!(r.status(), 200);
    let content_type = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let text = r.text().await.unwrap();
    let mut child = tokio::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/parse_metrics.py"
        ))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs (scripts/test.sh installs prometheus-client)");
    tokio::io::AsyncWriteExt::write_all(child.stdin.as_mut().unwrap(), text.as_bytes())
        .await
        .unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser rejected /metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let families = parsed["families"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    let samples = common::json::items(&parsed["samples"])
        .iter()
        .map(|s| {
            let labels = s[1]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect();
            (
                s[0].as_str().unwrap().to_owned(),
                labels,
                s[2].as_f64().unwrap(),
            )
        })
        .collect();
    (families, samples)
}

/// The value of the sample `name` whose labels include `labels` (0 when absent).
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| *v)
        .sum()
}

#[tokio::test]
async fn metrics_parse_as_prometheus_text_and_move_with_calls() {
    let app = TestApp::spawn().await;
    let (families, before) = scrape(&app.http_base).await;
    // Families with labels appear with their first series (tool calls come below).
    for (name, kind) in [
        ("aegis_audit_write_duration_seconds", "histogram"),
        ("aegis_sandboxes", "gauge"),
        ("aegis_executions", "gauge"),
        ("aegis_workflow_executions", "gauge"),
        ("aegis_db_pool_connections", "gauge"),
        ("aegis_pool_acquisitions", "counter"),
    ] {
        assert_eq!(
            families.get(name).map(String::as_str),
            Some(kind),
            "{name} in {families:?}"
        );
    }
    assert!(value(&before, "aegis_db_pool_connections", &[("state", "max")]) >= 1.0);

    let allowed = [
        ("tool", "aegis.tools.list"),
        ("door", "rest"),
        ("decision", "allowed"),
    ];
    let refused = [
        ("tool", "unknown"),
        ("door", "rest"),
        ("decision", "refused"),
    ];
    for _ in 0..3 {
        let (status, _) = app.call_tool("aegis.tools.list", json!({})).await;
        assert_eq!(status, 200);
    }
    // An unknown name is counted under `unknown`: callers cannot mint label values.
    let (status, _) = app.call_tool("no.such.tool.ever", json!({})).await;
    assert_eq!(status, 404);
    // A SEAL envelope that is not one: refused by the gateway with a 1xxx code.
    let r = app
        .http
        .post(format!("{}/v1/seal/invoke", app.http_base))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error());
    let seal_code = r.json::<Value>().await.unwrap()["error"]["code"]
        .as_u64()
        .expect("a SEAL error code")
        .to_string();

    let (families, after) = scrape(&app.http_base).await;
    for (name, kind) in [
        ("aegis_tool_calls", "counter"),
        ("aegis_tool_call_duration_seconds", "histogram"),
        ("aegis_seal_refusals", "counter"),
    ] {
        assert_eq!(families.get(name).map(String::as_str), Some(kind), "{name}");
    }
    let moved = |name: &str, labels: &[(&str, &str)]| {
        value(&after, name, labels) - value(&before, name, labels)
    };
    // Other tests in this binary may call tools too: at least our calls were counted.
    assert!(
        moved("aegis_tool_calls_total", &allowed) >= 3.0,
        "{after:?}"
    );
    assert!(moved("aegis_tool_calls_total", &refused) >= 1.0);
    assert!(
        moved(
            "aegis_tool_call_duration_seconds_count",
            &[("tool", "aegis.tools.list"), ("door", "rest")]
        ) >= 3.0
    );
    assert!(moved("aegis_seal_refusals_total", &[("code", &seal_code)]) >= 1.0);
    // Every tool call writes audit rows through the batched writer.
    assert!(moved("aegis_audit_rows_written_total", &[]) >= 4.0);
    assert!(moved("aegis_audit_write_duration_seconds_count", &[]) >= 1.0);
    assert!(
        after
            .iter()
            .all(|(n, l, _)| n != "aegis_tool_calls_total" || l["tool"] != "no.such.tool.ever"),
        "no series for a name the caller made up"
    );

    // Database gauges: an execution row appears within the refresh period.
    sqlx::query(
        "INSERT INTO executions (id, agent_id, agent_version_id, agent_name, agent_version, \
         status, caller_kind, caller_id, instance_id) VALUES (gen_random_uuid(), \
         gen_random_uuid(), gen_random_uuid(), 'x', '1.0.0', 'failed', 'api_key', 'test', $1)",
    )
    .bind(app.state.instance_id)
    .execute(&app.state.pool)
    .await
    .expect("a failed execution row");
    let failed = app
        .count("SELECT count(*) FROM executions WHERE status = 'failed'")
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, now) = scrape(&app.http_base).await;
        if value(&now, "aegis_executions", &[("status", "failed")]) == failed as f64 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "aegis_executions{{status=failed}} never reached {failed}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Checks one error answer: status, JSON content type, the body shape and the code.
async fn assert_error(r: reqwest::Response, status: u16, code: &str) -> String {
    assert_eq!(r.status().as_u16(), status);
    let content_type = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert_eq!(content_type, "application/json");
    assert!(r.headers().contains_key("x-request-id"));
    let body: Value = r.json().await.expect("a JSON body");
    assert_eq!(body["code"], code, "{body}");
    let message = body["error"]
        .as_str()
        .expect("error is a string")
        .to_owned();
    assert!(!message.is_empty());
    message
}

/// `POST /v1/tools/call` as the administrator with `body` sent as it is, of `content_type`.
async fn raw_tool_call(app: &TestApp, content_type: &str, body: &'static str) -> reqwest::Response {
    app.admin(Method::POST, "/v1/tools/call")
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn every_error_is_the_json_error_body() {
    let app = TestApp::spawn().await;
    let call = format!("{}/v1/tools/call", app.http_base);

    let r = raw_tool_call(&app, "application/json", "{not json").await;
    let m = assert_error(r, 400, "invalid_json").await;
    assert!(m.contains("well-formed JSON"), "{m}");

    let r = raw_tool_call(&app, "text/plain", "{}").await;
    let m = assert_error(r, 415, "unsupported_media_type").await;
    assert!(m.contains("Content-Type: application/json"), "{m}");

    let r = app
        .post_json("/v1/tools/call", &json!({"arguments": {}}))
        .await;
    let m = assert_error(r, 422, "invalid_body").await;
    assert!(m.contains("name"), "names the missing field: {m}");

    let r = app
        .admin(Method::POST, "/v1/tools/call")
        .header("content-type", "application/json")
        .body(vec![b' '; 3 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_error(r, 413, "payload_too_large").await;

    let r = app
        .response(Method::GET, "/v1/executions/not-a-uuid", None)
        .await;
    let m = assert_error(r, 400, "invalid_path").await;
    assert!(m.contains("not-a-uuid"), "{m}");

    let r = app
        .response(Method::GET, "/v1/audit?limit=many", None)
        .await;
    assert_error(r, 400, "invalid_query").await;

    let r = app.get("/v1/no/such/route").await;
    let m = assert_error(r, 404, "not_found").await;
    assert!(m.contains("/openapi.json"), "{m}");

    let r = app.response(Method::PUT, "/v1/tools", None).await;
    let allow = r.headers()["allow"].to_str().unwrap().to_owned();
    assert!(allow.contains("GET"), "{allow}");
    let m = assert_error(r, 405, "method_not_allowed").await;
    assert!(
        m.contains("Allow"),
        "says where the methods to use are: {m}"
    );

    let r = app.http.post(&call).json(&json!({})).send().await.unwrap();
    assert_error(r, 401, "unauthorized").await;
}

#[tokio::test]
async fn request_ids_are_taken_or_made_and_returned_on_every_door() {
    let app = TestApp::spawn().await;
    let with_id = |id: &'static str| {
        app.admin(Method::GET, "/v1/tools")
            .header("x-request-id", id)
            .send()
    };
    let r = with_id("client-trace:42/a.b_c").await.unwrap();
    assert_eq!(r.headers()["x-request-id"], "client-trace:42/a.b_c");

    // Not well-formed: replaced by one of ours, never echoed.
    let r = with_id("has spaces and \"quotes\"").await.unwrap();
    let made = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert!(uuid::Uuid::parse_str(&made).is_ok(), "{made}");

    let a = app.get("/health/live").await.headers()["x-request-id"].clone();
    let b = app.get("/health/live").await.headers()["x-request-id"].clone();
    assert_ne!(a, b, "each request gets its own id");

    // gRPC answers carry it in their metadata.
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let mut health = HealthClient::new(app.grpc_channel().await);
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    request
        .metadata_mut()
        .insert("x-request-id", "grpc-call-7".parse().unwrap());
    let response = health.check(request).await.expect("health answers");
    assert_eq!(
        response.metadata().get("x-request-id").unwrap(),
        "grpc-call-7"
    );
}

/// An HTTP client whose requests cannot hang a test forever.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("http client")
}

/// Deploys the sleeper agent and creates a sandbox for it; returns the sandbox id.
async fn sandbox_on(base: &str) -> String {
    let client = client();
    crate::common::rest::Rest::new(client.clone(), base, TEST_ADMIN_KEY)
        .deployed("/v1/agents", &sleeper())
        .await;
    let body = crate::common::rest::Rest::new(client.clone(), base, TEST_ADMIN_KEY)
        .posted("/v1/sandboxes", json!({"agent": "sleeper"}), 201)
        .await;
    body["sandbox_id"].as_str().expect("sandbox id").to_owned()
}

fn running(container: &str) -> bool {
    docker_lines(&["inspect", "-f", "{{.State.Running}}", container]) == ["true"]
}

#[tokio::test]
async fn sigterm_destroys_the_nodes_sandboxes_and_logs_carry_request_ids() {
    let db = TestDb::create().await;
    let node = binary::start(&db, &[("RUST_LOG", "warn,tower_http=debug")]).await;
    let id = sandbox_on(&node.base).await;
    let container = format!("aegis-sbx-{id}");
    assert!(running(&container));
    let db_label = format!(
        "label=org.aegis.db-name={}",
        db.url.rsplit('/').next().unwrap()
    );
    assert!(
        !docker_lines(&["volume", "ls", "-q", "--filter", &db_label]).is_empty(),
        "workspace and beacon volumes exist"
    );
    let r = client()
        .post(format!("{}/v1/tools/call", node.base))
        .bearer_auth(TEST_ADMIN_KEY)
        .header("x-request-id", "sigterm-test-call-1")
        .json(&json!({"name": "cmd.run", "arguments": {"command": "echo hi"}, "sandbox_id": id}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "sigterm-test-call-1");

    let stderr = node.terminate().await;
    assert!(
        stderr.contains("request{request_id=sigterm-test-call-1"),
        "the call's log lines name its request id: {stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "no colour codes when stderr is not a terminal: {stderr:?}"
    );
    assert!(
        docker_lines(&["ps", "-aq", "--filter", &db_label]).is_empty(),
        "no container of this node is left after SIGTERM"
    );
    assert!(
        docker_lines(&["volume", "ls", "-q", "--filter", &db_label]).is_empty(),
        "no volume (workspace, beacon) of this node is left after SIGTERM"
    );
    let pool = db.pool().await;
    let live = crate::common::live_sandboxes(&pool).await;
    assert_eq!(live, 0, "every row says destroyed");
}

#[tokio::test]
async fn sigterm_with_shutdown_sandboxes_keep_leaves_them_running() {
    let db = TestDb::create().await;
    let node = binary::start(&db, &[("ORCHESTRATOR__SHUTDOWN__SANDBOXES", "keep")]).await;
    let id = sandbox_on(&node.base).await;
    node.terminate().await;
    assert!(
        running(&format!("aegis-sbx-{id}")),
        "kept for the next instance to adopt"
    );
    // TestDb's drop removes it (by its database label).
}

/// A Docker object made by this test, labelled as if a stack with `scope` had made it.
fn fake_object(
    kind: &str,
    scope: &str,
    db_name: &str,
    beat_at: Option<i64>,
    marker: &str,
) -> String {
    let mut labels = vec![
        "org.aegis.managed=true".to_owned(),
        format!("org.aegis.scope={scope}"),
        format!("org.aegis.db-name={db_name}"),
        "org.aegis.db-cluster=0".to_owned(),
        format!("org.aegis.test-marker={marker}"),
    ];
    match beat_at {
        Some(at) => {
            labels.push("org.aegis.component=beacon".to_owned());
            labels.push(format!("org.aegis.beat-at={at}"));
        }
        None => labels.push(format!("org.aegis.sandbox={}", uuid::Uuid::new_v4())),
    }
    let mut args: Vec<String> = match kind {
        "container" => vec!["create".into()],
        _ => vec!["volume".into(), "create".into()],
    };
    for l in &labels {
        args.push("--label".into());
        args.push(l.clone());
    }
    if kind == "container" {
        args.push(std::env::var("SANDBOX_TEST_IMAGE").unwrap_or("aegis-runtime/busybox:1".into()));
        args.push("sleep".into());
        args.push("600".into());
    }
    let out = Command::new("docker")
        .args(&args)
        .output()
        .expect("docker runs");
    common::succeeded(out, &format!("docker {}", args.join(" ")))
        .trim()
        .to_owned()
}

fn exists(kind: &str, id: &str) -> bool {
    let args: &[&str] = match kind {
        "container" => &["container", "inspect", id],
        _ => &["volume", "inspect", id],
    };
    Command::new("docker")
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[tokio::test]
async fn sandboxes_of_a_vanished_database_are_removed_at_start_and_no_live_stack_is_touched() {
    // A live stack on another database of this host, with a real sandbox.
    let live = TestApp::spawn().await;
    let live_id = sandbox_on(&live.http_base).await;

    // Three other stacks, as `docker-compose down -v` leaves them (another cluster, their
    // database gone): one silent for an hour, one that beat just now, one from a version that
    // never beat (unknowable: left alone).
    let marker = uuid::Uuid::new_v4().simple().to_string();
    let now = chrono::Utc::now().timestamp();
    let silent = format!("gone_{marker}/{}", uuid::Uuid::new_v4());
    let beating = format!("alive_{marker}/{}", uuid::Uuid::new_v4());
    let old = format!("old_{marker}/{}", uuid::Uuid::new_v4());
    let silent_container = fake_object("container", &silent, "gone", None, &marker);
    let silent_volume = fake_object("volume", &silent, "gone", None, &marker);
    let silent_beacon = fake_object("volume", &silent, "gone", Some(now - 3600), &marker);
    let beating_container = fake_object("container", &beating, "alive", None, &marker);
    // Half a minute since its last beat: late, but alive (eight beats may be missed).
    let beating_beacon = fake_object("volume", &beating, "alive", Some(now - 30), &marker);
    let old_container = fake_object("container", &old, "old", None, &marker);

    // The next start on this host, by a node that takes its own silent instances for dead
    // after one second: that must not shorten the patience it has with other stacks.
    let next_db = TestDb::create().await;
    let mut config = common::test_config(&next_db.url);
    config.sandbox.dead_after_secs = 1;
    let next = TestApp::spawn_with(config).await;
    assert!(
        !exists("container", &silent_container),
        "orphan container removed"
    );
    assert!(!exists("volume", &silent_volume), "orphan volume removed");
    assert!(!exists("volume", &silent_beacon), "its beacon removed last");
    assert!(
        exists("container", &beating_container),
        "a beating stack is left alone"
    );
    assert!(exists("volume", &beating_beacon));
    assert!(
        exists("container", &old_container),
        "a scope without beacons is never judged"
    );
    assert!(
        running(&format!("aegis-sbx-{live_id}")),
        "the live stack's sandbox runs on"
    );
    // The new node beats too.
    let beacons = docker_lines(&[
        "volume",
        "ls",
        "-q",
        "--filter",
        &format!("label=org.aegis.instance={}", next.state.instance_id),
        "--filter",
        "label=org.aegis.component=beacon",
    ]);
    assert_eq!(beacons.len(), 1, "{beacons:?}");

    let mine = format!("label=org.aegis.test-marker={marker}");
    let containers = docker_lines(&["ps", "-aq", "--filter", &mine]);
    if !containers.is_empty() {
        let _ = Command::new("docker")
            .args(["rm", "-f"])
            .args(&containers)
            .output();
    }
    let volumes = docker_lines(&["volume", "ls", "-q", "--filter", &mine]);
    if !volumes.is_empty() {
        let _ = Command::new("docker")
            .args(["volume", "rm", "-f"])
            .args(&volumes)
            .output();
    }
}

#[tokio::test]
async fn schemathesis_finds_no_server_error_in_the_live_api() {
    let app = TestApp::spawn().await;
    // Its cache of examples goes to a scratch directory, not into the source tree.
    let scratch = tempfile::tempdir().expect("scratch directory");
    let out = tokio::process::Command::new("schemathesis")
        .current_dir(scratch.path())
        .args([
            "run",
            &format!("{}/openapi.json", app.http_base),
            "--checks",
            "not_a_server_error",
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            "8",
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--seed",
            "20261124",
            "--no-color",
            "-H",
            &format!("Authorization: Bearer {TEST_ADMIN_KEY}"),
        ])
        .output()
        .await
        .expect("schemathesis runs (scripts/test.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found failures:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("passed"), "{stdout}");
}
