//! `spec.default_schedule` across replicas: two orchestrator processes (the real binary) on one
//! database both run their scheduler for a workflow that ticks every second; each tick starts
//! exactly one run cluster-wide, and every run completes.

use crate::common;

use std::time::{Duration, Instant};

use common::binary::{self, Node};
use common::{TestDb, TEST_ADMIN_KEY};
use uuid::Uuid;

/// One replica: the real binary on `db`, ready, its workflow poller at 200 ms.
pub(crate) async fn replica(db: &TestDb) -> Node {
    binary::start(db, &[("ORCHESTRATOR__WORKFLOWS__POLL_INTERVAL_MS", "200")]).await
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

/// Deploys the scheduled workflow `manifest` (named `name`) through `via.0`, waits (90 s) until
/// `ticks` of its ticks started a run, then deletes it through `via.1`, which stops its schedule.
pub(crate) async fn run_ticks(
    pool: &sqlx::PgPool,
    via: (&Node, &Node),
    manifest: &str,
    name: &str,
    ticks: i64,
) {
    let rest =
        |node: &Node| common::rest::Rest::new(reqwest::Client::new(), &node.base, TEST_ADMIN_KEY);
    rest(via.0).deployed("/v1/workflows", manifest).await;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let started = common::count(
            pool,
            "SELECT count(*) FROM workflow_schedule_ticks WHERE execution_id IS NOT NULL",
        )
        .await;
        if started >= ticks {
            break;
        }
        assert!(Instant::now() < deadline, "only {started} ticks fired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = rest(via.1)
        .response(
            reqwest::Method::DELETE,
            &format!("/v1/workflows/{name}"),
            None,
        )
        .await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
}

#[tokio::test]
async fn a_scheduled_workflow_runs_once_per_tick_across_two_replicas() {
    let db = TestDb::create().await;
    let pool = db.pool().await;
    let a = replica(&db).await;
    let b = replica(&db).await;
    // Let a few ticks fire, then stop the schedule by deleting the workflow.
    run_ticks(&pool, (&a, &b), TICKER, "ticker", TICKS).await;

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
    let instances = crate::common::count(&pool, "SELECT count(*) FROM node_instances").await;
    assert_eq!(instances, 2);
}
