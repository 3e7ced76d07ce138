//! The walking skeleton: start-up, readiness, configuration errors, migrations, shutdown, gRPC.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::proxy::TcpProxy;
use common::{test_config, TestApp, TestDb};
use serde_json::Value;

/// Polls `/health/ready` until `want` status or the deadline; returns the last body.
async fn wait_ready_status(app: &TestApp, want: u16, within: Duration) -> Value {
    let every = Duration::from_millis(200);
    common::eventually("/health/ready never answered it", within, every, || async {
        let r = app.get("/health/ready").await;
        let status = r.status().as_u16();
        let body: Value = r.json().await.expect("json body");
        if status == want {
            Ok(body)
        } else {
            Err(format!("{status} (wanted {want}): {body}"))
        }
    })
    .await
}

#[tokio::test]
async fn live_and_ready_answer() {
    let app = TestApp::spawn().await;
    let live = app.get("/health/live").await;
    assert_eq!(live.status(), 200);
    let body: Value = live.json().await.unwrap();
    assert_eq!(body["status"], "live");

    let body = wait_ready_status(&app, 200, Duration::from_secs(10)).await;
    assert_eq!(body["status"], "ready", "{body}");
    for c in ["database", "migrations", "docker"] {
        assert_eq!(body["checks"][c]["status"], "ok", "{c}: {body}");
    }
}

#[tokio::test]
async fn readiness_follows_the_database() {
    let db = TestDb::create().await;
    let (proxy, url) = TcpProxy::before_database(&db.url).await;
    let app = TestApp::spawn_with(test_config(&url)).await;

    wait_ready_status(&app, 200, Duration::from_secs(10)).await;

    proxy.cut().await;
    let body = wait_ready_status(&app, 503, Duration::from_secs(20)).await;
    assert_eq!(body["status"], "not_ready");
    let failing: Vec<&str> = common::json::items(&body["failing"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(failing.contains(&"database"), "{body}");
    assert!(!failing.contains(&"docker"), "{body}");
    assert_eq!(body["checks"]["database"]["status"], "failing");
    assert!(body["checks"]["database"]["error"].is_string());
    // Liveness is independent of dependencies.
    assert_eq!(app.get("/health/live").await.status(), 200);

    proxy.restore().await;
    let body = wait_ready_status(&app, 200, Duration::from_secs(30)).await;
    assert_eq!(body["checks"]["database"]["status"], "ok");
    drop(db);
}

#[tokio::test]
async fn startup_waits_for_a_database_that_comes_up_late() {
    let db = TestDb::create().await;
    let (proxy, url) = TcpProxy::before_database(&db.url).await;
    proxy.cut().await;

    let config = test_config(&url);
    let starting = tokio::spawn(orchestrator::app::Application::build(config));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !starting.is_finished(),
        "start-up must keep retrying while the database is down"
    );
    proxy.restore().await;
    let app = tokio::time::timeout(Duration::from_secs(30), starting)
        .await
        .expect("start-up finishes once the database is back")
        .unwrap()
        .expect("start-up succeeds");
    assert!(
        orchestrator::database::migrations_current(&app.state().pool)
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn startup_gives_up_on_an_unreachable_database_with_a_clear_error() {
    let mut config = test_config("postgres://nobody@127.0.0.1:1/nothing");
    config.database.connect_timeout_secs = 1;
    let err = match orchestrator::app::Application::build(config).await {
        Ok(_) => panic!("start-up must fail"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("not reachable"), "{err}");
    assert!(err.contains("127.0.0.1:1"), "{err}");
}

#[tokio::test]
async fn migrations_apply_once_and_restart_is_a_no_op() {
    let db = TestDb::create().await;
    let expected = orchestrator::database::MIGRATOR.iter().count() as i64;

    let app = TestApp::spawn_with(test_config(&db.url)).await;
    let pool = db.pool().await;
    let rows: Vec<(i64, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT version, installed_on FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len() as i64, expected);
    app.stop().await.expect("clean stop");

    // Applying again directly reports nothing new.
    assert_eq!(orchestrator::database::migrate(&pool).await.unwrap(), 0);

    // A restart leaves the bookkeeping untouched.
    let app = TestApp::spawn_with(test_config(&db.url)).await;
    let again: Vec<(i64, chrono::DateTime<chrono::Utc>)> =
        sqlx::query_as("SELECT version, installed_on FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows, again);
    let tenants = crate::common::count(&pool, "SELECT count(*) FROM tenants").await;
    assert_eq!(tenants, 1, "seed rows are not duplicated by a restart");
    app.stop().await.expect("clean stop");
}

#[tokio::test]
async fn grpc_serves_health_and_reflection() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let app = TestApp::spawn().await;
    let channel = app.grpc_channel().await;

    let mut health = HealthClient::new(channel.clone());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health check answers")
            .into_inner();
        if r.status == ServingStatus::Serving as i32 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "gRPC health never turned SERVING"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let mut reflection = ServerReflectionClient::new(channel.clone());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = reflection
        .server_reflection_info(futures_util::stream::iter([request]))
        .await
        .expect("reflection answers")
        .into_inner();
    let response = stream.message().await.unwrap().expect("one response");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer: {response:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in [
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "orchestrator.v1.Node",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }

    let mut node = orchestrator::api::grpc::pb::orchestrator::node_client::NodeClient::new(channel);
    let info = node
        .get_info(orchestrator::api::grpc::pb::orchestrator::GetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.instance_id, app.state.instance_id.to_string());
    assert!(info.ready, "{info:?}");
}

// ---- the real binary: configuration errors and signals ----

fn binary() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_orchestrator"));
    c.env_remove("DATABASE_URL")
        .env_remove("ORCHESTRATOR_CONFIG")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null());
    c
}

fn write_config(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    f
}

#[test]
fn a_bad_config_file_is_refused_with_key_and_line() {
    let cases: [(&str, &str, &[&str]); 3] = [
        (
            "server:\n  http: 127.0.0.1:8088\n  grpc: 127.0.0.1:50051\nlog:\n  levle: debug\n",
            "check-config",
            &["levle", "line 5", "expected `level` or `format`"],
        ),
        (
            "server:\n  http: not-an-address\n",
            "serve",
            &["server.http", "line 2"],
        ),
        (
            "log:\n  format: xml\n",
            "serve",
            &["log.format", "text", "json"],
        ),
    ];
    for (config, command, said) in cases {
        let f = write_config(config);
        let out = binary()
            .arg("--config")
            .arg(f.path())
            .arg(command)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{config}");
        let err = String::from_utf8_lossy(&out.stderr);
        for part in said {
            assert!(err.contains(part), "{config}: {part}: {err}");
        }
    }
}

#[test]
fn a_bad_database_url_says_which_part_is_wrong() {
    let cases = [
        ("mysql://u:p@127.0.0.1:5432/db", "scheme"),
        ("postgres://u:p@127.0.0.1:port/db", "port"),
        ("postgres://u:p@127.0.0.1:5432", "database name"),
    ];
    for (url, part) in cases {
        let out = binary()
            .env("DATABASE_URL", url)
            .arg("check-config")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{url}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("DATABASE_URL"), "{url}: {err}");
        assert!(err.contains(part), "{url}: {err}");
        assert!(!err.contains(":p@"), "password leaked: {err}");
    }
}

#[test]
fn help_documents_every_subcommand_and_flag() {
    let out = binary().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for word in ["serve", "check-config", "migrate", "--config"] {
        assert!(help.contains(word), "{word} missing from help:\n{help}");
    }
    let out = binary().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for word in ["--http", "--grpc"] {
        assert!(
            help.contains(word),
            "{word} missing from serve help:\n{help}"
        );
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn sigterm_shuts_down_gracefully() {
    let db = TestDb::create().await;
    let (http, grpc) = (free_port(), free_port());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .env("DATABASE_URL", &db.url)
        .env("SANDBOX_EXECUTOR_BIN", common::executor_bin())
        .env("RUST_LOG", "info")
        .env_remove("ORCHESTRATOR_CONFIG")
        .args([
            "serve",
            "--http",
            &format!("127.0.0.1:{http}"),
            "--grpc",
            &format!("127.0.0.1:{grpc}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = client
            .get(format!("http://127.0.0.1:{http}/health/ready"))
            .send()
            .await
        {
            if r.status() == 200 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "binary never became ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    common::binary::send_signal(&child, "-TERM");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exits within the grace period")
        .unwrap();
    assert_eq!(status.code(), Some(0), "graceful exit");
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr)
        .await
        .unwrap();
    assert!(stderr.contains("SIGTERM"), "{stderr}");
    assert!(stderr.contains("shutdown complete"), "{stderr}");

    let pool = db.pool().await;
    let stopped = crate::common::count(
        &pool,
        "SELECT count(*) FROM node_instances WHERE stopped_at IS NOT NULL",
    )
    .await;
    assert_eq!(stopped, 1, "the instance recorded its stop");
    assert!(client
        .get(format!("http://127.0.0.1:{http}/health/live"))
        .send()
        .await
        .is_err());
}
