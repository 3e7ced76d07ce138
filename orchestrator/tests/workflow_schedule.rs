//! `spec.default_schedule` across replicas: two orchestrator processes (the real binary) on one
//! database both run their scheduler for a workflow that ticks every second; each tick starts
//! exactly one run cluster-wide, and every run completes.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{executor_bin, TestDb, TEST_ADMIN_KEY};
use uuid::Uuid;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn replica(db: &TestDb, http: u16) -> tokio::process::Child {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .env_remove("ORCHESTRATOR_CONFIG")
        .env("DATABASE_URL", &db.url)
        .env("ORCHESTRATOR_ADMIN_KEY", TEST_ADMIN_KEY)
        .env("ORCHESTRATOR__SANDBOX__EXECUTOR_PATH", executor_bin())
        .env("ORCHESTRATOR__WORKFLOWS__POLL_INTERVAL_MS", "200")
        .env("RUST_LOG", "warn")
        .args([
            "serve",
            "--http",
            &format!("127.0.0.1:{http}"),
            "--grpc",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("orchestrator starts");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = client
            .get(format!("http://127.0.0.1:{http}/health/ready"))
            .send()
            .await
        {
            if r.status() == 200 {
                return child;
            }
        }
        assert!(Instant::now() < deadline, "orchestrator never became ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// Every second (cron with a seconds field); the one state writes the blackboard and ends, so no
// container is needed.
const TICKER: &str = "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: ticker
  version: \"1.0.0\"
  output_template: {note: \"{{note}}\"}
spec:
  initial_state: NOTE
  default_schedule:
    cron: \"* * * * * *\"
    input: {who: scheduler}
  states:
    NOTE:
      kind: System
      command: update_blackboard
      update_blackboard: {note: \"ran for {{input.who}}\"}
      transitions: []
";

const TICKS: i64 = 4;

#[tokio::test]
async fn a_scheduled_workflow_runs_once_per_tick_across_two_replicas() {
    let db = TestDb::create().await;
    let pool = db.pool().await;
    let (port_a, port_b) = (free_port(), free_port());
    let _a = replica(&db, port_a).await;
    let _b = replica(&db, port_b).await;
    let client = reqwest::Client::new();
    let r = client
        .post(format!("http://127.0.0.1:{port_a}/v1/workflows"))
        .bearer_auth(TEST_ADMIN_KEY)
        .body(TICKER)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());

    // Let a few ticks fire, then stop the schedule by deleting the workflow.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let started: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workflow_schedule_ticks WHERE execution_id IS NOT NULL",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if started >= TICKS {
            break;
        }
        assert!(Instant::now() < deadline, "only {started} ticks fired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = client
        .delete(format!("http://127.0.0.1:{port_b}/v1/workflows/ticker"))
        .bearer_auth(TEST_ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());

    // Wait until every claimed tick has its outcome and every run has ended.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (open_ticks, live_runs): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM workflow_schedule_ticks \
                     WHERE execution_id IS NULL AND error IS NULL), \
                    (SELECT count(*) FROM workflow_executions \
                     WHERE workflow_name = 'ticker' \
                       AND status NOT IN ('completed', 'failed', 'cancelled', 'timed_out'))",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if open_ticks == 0 && live_runs == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open_ticks} ticks without outcome, {live_runs} runs still live"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // One run per tick: as many runs as ticks that started one, each tick's run distinct.
    let ticks: Vec<(chrono::DateTime<chrono::Utc>, Option<Uuid>, Uuid)> = sqlx::query_as(
        "SELECT tick, execution_id, instance_id FROM workflow_schedule_ticks ORDER BY tick",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let started: Vec<Uuid> = ticks.iter().filter_map(|(_, e, _)| *e).collect();
    assert!(started.len() as i64 >= TICKS, "{ticks:?}");
    let runs: Vec<(Uuid, String, String, Option<serde_json::Value>)> = sqlx::query_as(
        "SELECT id, status, caller_kind, final_output FROM workflow_executions \
         WHERE workflow_name = 'ticker' ORDER BY created_at",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        runs.len(),
        started.len(),
        "runs {runs:?} vs ticks that started one {ticks:?}"
    );
    for (id, status, caller_kind, final_output) in &runs {
        assert!(started.contains(id), "run {id} belongs to no tick");
        assert_eq!(status, "completed");
        assert_eq!(caller_kind, "schedule");
        assert_eq!(
            final_output,
            &Some(serde_json::json!({"note": "ran for scheduler"}))
        );
    }
    // Both replicas were there to compete: each registered itself.
    let instances: i64 = sqlx::query_scalar("SELECT count(*) FROM node_instances")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(instances, 2);
}
