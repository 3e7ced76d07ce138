//! Crash safety of sandboxes: after `kill -9` of the orchestrator during a running `cmd.run`, a
//! restart takes the operator's sandbox over (the same container, one epoch later) and its stop
//! leaves no container and no volume behind.

use crate::common;

use std::time::{Duration, Instant};

use common::agent::AgentManifest;
use common::binary::{self, free_port};
use common::{docker_lines, TestDb, TEST_ADMIN_KEY};
use serde_json::{json, Value};

async fn start(db: &TestDb, http: u16) -> tokio::process::Child {
    start_with(db, http, None).await
}

async fn start_with(
    db: &TestDb,
    http: u16,
    config: Option<&std::path::Path>,
) -> tokio::process::Child {
    let config = config.map(|p| p.display().to_string());
    let mut env = vec![
        // A silent previous instance counts as dead after one second (default two minutes).
        ("ORCHESTRATOR__SANDBOX__DEAD_AFTER_SECS", "1"),
    ];
    if let Some(path) = config.as_deref() {
        env.push(("ORCHESTRATOR_CONFIG", path));
    }
    binary::start_on(db, http, &env).await.child
}

#[tokio::test]
async fn kill_9_during_cmd_run_then_restart_takes_over_and_leaves_nothing_behind() {
    let db = TestDb::create().await;
    let http = free_port();
    let base = format!("http://127.0.0.1:{http}");
    let client = reqwest::Client::new();
    let mut first = start(&db, http).await;

    let agent = crate::common::agent::command_agent("sleeper", "Sleep.", &["sleep"]);
    crate::common::rest::Rest::new(client.clone(), &base, TEST_ADMIN_KEY)
        .deployed("/v1/agents", &agent)
        .await;
    let r = client
        .post(format!("{base}/v1/sandboxes"))
        .bearer_auth(TEST_ADMIN_KEY)
        .json(&json!({"agent": "sleeper"}))
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    let id = body["sandbox_id"].as_str().expect("sandbox id").to_owned();
    let label = format!("label=org.aegis.sandbox={id}");
    assert_eq!(docker_lines(&["ps", "-aq", "--filter", &label]).len(), 1);
    assert_eq!(
        docker_lines(&["volume", "ls", "-q", "--filter", &label]).len(),
        1
    );

    // A long command is running when the orchestrator is killed without warning.
    let call = tokio::spawn({
        let client = client.clone();
        let base = base.clone();
        let id = id.clone();
        async move {
            client
                .post(format!("{base}/v1/tools/call"))
                .bearer_auth(TEST_ADMIN_KEY)
                .json(&json!({"name": "cmd.run", "arguments": {"command": "sleep 60"}, "sandbox_id": id}))
                .send()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    common::binary::crash(&mut first).await;
    assert!(
        call.await.unwrap().is_err(),
        "the in-flight call died with the process"
    );
    // The sandbox survived its owner: that is what the restart must clean up.
    assert_eq!(docker_lines(&["ps", "-aq", "--filter", &label]).len(), 1);

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second_http = free_port();
    let second = binary::start_on(
        &db,
        second_http,
        &[("ORCHESTRATOR__SANDBOX__DEAD_AFTER_SECS", "1")],
    )
    .await;
    // The restart fences the silent instance off and adopts the operator's sandbox: nobody
    // else could (its owner is a caller, not a process that died).
    let pool = db.pool().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (state, epoch, holder_fenced): (String, i64, bool) = sqlx::query_as(
            "SELECT s.state, s.epoch, n.fenced_at IS NOT NULL FROM sandboxes s \
             JOIN node_instances n ON n.id = s.instance_id WHERE s.id = $1::uuid",
        )
        .bind(&id)
        .fetch_one(&pool)
        .await
        .unwrap();
        if epoch == 2 && !holder_fenced {
            assert_eq!(state, "running");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not taken over: {state} epoch {epoch}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(docker_lines(&["ps", "-q", "--filter", &label]).len(), 1);
    let r = client
        .post(format!("http://127.0.0.1:{second_http}/v1/tools/call"))
        .bearer_auth(TEST_ADMIN_KEY)
        .json(&json!({"name": "cmd.run", "arguments": {"command": "sleep 0"}, "sandbox_id": id}))
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["isError"], false, "the adopted sandbox serves: {body}");

    // A stop that destroys (the default) leaves nothing of it.
    second.terminate().await;
    let containers = docker_lines(&["ps", "-aq", "--filter", &label]);
    let volumes = docker_lines(&["volume", "ls", "-q", "--filter", &label]);
    assert!(
        containers.is_empty() && volumes.is_empty(),
        "left behind: containers {containers:?} volumes {volumes:?}"
    );
    let state: String = common::one(
        &pool,
        "SELECT state FROM sandboxes WHERE id = $1::uuid",
        &id,
    )
    .await;
    assert_eq!(state, "destroyed");
}

#[tokio::test]
async fn executions_running_at_a_crash_fail_with_the_reason_after_restart() {
    // A model that never answers keeps the execution running when the orchestrator dies.
    let llm = common::fake_llm::FakeLlm::start(vec![common::fake_llm::Step::Hang]).await;
    let mut config = tempfile::NamedTempFile::new().unwrap();
    let mut llm_config = llm.config();
    llm_config.providers[0].timeout_secs = 300;
    let yaml = serde_yaml::to_string(&serde_json::json!({"llm": llm_config})).unwrap();
    std::io::Write::write_all(&mut config, yaml.as_bytes()).unwrap();

    let db = TestDb::create().await;
    let http = free_port();
    let base = format!("http://127.0.0.1:{http}");
    let client = reqwest::Client::new();
    let mut first = start_with(&db, http, Some(config.path())).await;
    let agent = AgentManifest::new("thinker")
        .instruction("Think forever.")
        .yaml();
    let rest = crate::common::rest::Rest::new(client.clone(), &base, TEST_ADMIN_KEY);
    rest.deployed("/v1/agents", &agent).await;
    let (_, body) = rest
        .send_json(
            reqwest::Method::POST,
            "/v1/agents/thinker/execute",
            Some(json!({"input": {}})),
        )
        .await;
    let id = body["execution_id"].as_str().expect("started").to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let page = rest.get_value(&format!("/v1/executions/{id}/events")).await;
        let started = page["events"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["event_type"] == "iteration_started"));
        if started {
            tokio::time::sleep(Duration::from_millis(300)).await;
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the execution never started an iteration: {page}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    common::binary::crash(&mut first).await;

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut second = start_with(&db, free_port(), Some(config.path())).await;
    let pool = db.pool().await;
    let (status, error): (String, Option<String>) =
        sqlx::query_as("SELECT status, last_error FROM executions WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(status, "failed");
    assert_eq!(error.as_deref(), Some("orchestrator restarted"));
    let sql = "SELECT event_type FROM execution_events WHERE execution_id = $1::uuid \
               ORDER BY seq DESC LIMIT 1";
    let last: String = common::one(&pool, sql, &id).await;
    assert_eq!(last, "execution_failed");
    second.kill().await.ok();
}
