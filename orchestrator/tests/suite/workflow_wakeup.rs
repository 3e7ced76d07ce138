//! A parked workflow is woken by what it waits for, whether or not anyone tells it (issue 24,
//! item 1). A blocking Subworkflow parent used to be woken only by its child's commit (and by its
//! own look at the child right after parking): when the child ended while the parent was parking,
//! each transaction could miss the other's uncommitted change and the parent waited until its
//! deadline. These tests put the rows in exactly the states that race leaves behind, with no
//! notification at all, and require the parent to continue: the poll re-examines waiting rows.

use crate::common;
use crate::common::workflow::{end_state, workflow_manifest};

use std::time::Duration;

use common::{test_config, TestApp, TestDb};
use reqwest::Method;
use serde_json::{json, Value};

/// A child that parks in a Human state (no lease, no worker), so the test can end it by hand.
fn child() -> String {
    workflow_manifest(
        "slow-child",
        "ASK",
        "    ASK:
      kind: Human
      prompt: \"Continue?\"
      timeout: 1h
      transitions: []
",
    )
}

fn parent() -> String {
    let block = "    BLOCK:
      kind: Subworkflow
      workflow_id: slow-child
      mode: blocking
      result_key: waited
      transitions:
        - {condition: on_success, target: DONE}
";
    let states = format!("{block}{}", end_state("DONE", "echo after {{waited.note}}"));
    workflow_manifest("waits-for-child", "BLOCK", &states)
}

async fn app() -> (TestApp, TestDb) {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.workflows.system_image = Some("aegis-runtime/busybox:1".to_owned());
    config.workflows.poll_interval_ms = 200;
    let app = TestApp::spawn_with(config).await;
    for manifest in [child(), parent()] {
        app.deployed("/v1/workflows", &manifest).await;
    }
    (app, db)
}

async fn execution(app: &TestApp, id: &str) -> Value {
    app.response(Method::GET, &format!("/v1/workflows/executions/{id}"), None)
        .await
        .json()
        .await
        .unwrap()
}

async fn until(app: &TestApp, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    app.until(
        &format!("/v1/workflows/executions/{id}"),
        what,
        Duration::from_secs(60),
        pred,
    )
    .await
}

/// Starts the parent and returns (parent id, child id) once both are parked.
async fn both_parked(app: &TestApp) -> (String, String) {
    let parent = app
        .started("/v1/workflows/waits-for-child/run", json!({}))
        .await;
    until(app, &parent, "parked on its child", |e| {
        e["status"] == "waiting" && e["waiting_for"] == "subworkflow"
    })
    .await;
    let child: uuid::Uuid = app
        .one(
            "SELECT id FROM workflow_executions WHERE parent_execution_id = $1::uuid",
            &parent,
        )
        .await;
    let child = child.to_string();
    until(app, &child, "parked in its Human state", |e| {
        e["status"] == "waiting"
    })
    .await;
    (parent, child)
}

/// Ends the child as its own worker would, but without waking anyone: the parent's wake-up of
/// the child's commit is the one the race loses, and nothing is notified.
async fn end_child_silently(app: &TestApp, child: &str, parent: &str) {
    let mut tx = app.state.pool.begin().await.unwrap();
    let n = sqlx::query(
        "UPDATE workflow_executions SET status = 'completed', waiting_for = NULL, wake_at = NULL, \
         final_output = '{\"note\": \"ended\"}'::jsonb, ended_at = now() WHERE id = $1::uuid",
    )
    .bind(child)
    .execute(&mut *tx)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(n, 1);
    // The parent's timer is far away: only noticing the ended child can move it.
    sqlx::query(
        "UPDATE workflow_executions SET wake_at = now() + interval '1 day' WHERE id = $1::uuid",
    )
    .bind(parent)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn a_parent_whose_child_ended_unannounced_continues() {
    let (app, _db) = app().await;
    let (parent, child) = both_parked(&app).await;
    end_child_silently(&app, &child, &parent).await;
    let e = until(&app, &parent, "continued after its child ended", |e| {
        e["status"] == "completed" || e["status"] == "failed"
    })
    .await;
    assert_eq!(e["status"], "completed", "{e}");
    assert_eq!(e["blackboard"]["waited"]["note"], "ended", "{e}");
    assert_eq!(e["blackboard"]["DONE"]["stdout"], "after ended\n", "{e}");
}

#[tokio::test]
async fn a_spurious_wake_leaves_a_parent_parked_and_the_real_end_still_moves_it() {
    let (app, _db) = app().await;
    let (parent, child) = both_parked(&app).await;
    // Wake-ups with nothing behind them: the parent stays parked, its child untouched.
    for _ in 0..3 {
        sqlx::query("SELECT pg_notify('aegis_workflows', 'wake')")
            .execute(&app.state.pool)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    let e = execution(&app, &parent).await;
    assert_eq!(e["status"], "waiting", "{e}");
    assert_eq!(e["waiting_for"], "subworkflow", "{e}");
    let events: Vec<String> = sqlx::query_scalar(
        "SELECT event_type FROM workflow_execution_events WHERE execution_id = $1::uuid \
         ORDER BY seq",
    )
    .bind(&parent)
    .fetch_all(&app.state.pool)
    .await
    .unwrap();
    assert_eq!(
        events.iter().filter(|t| *t == "child_finished").count(),
        0,
        "{events:?}"
    );
    // Then the child ends, unannounced, at the same moment as another spurious wake.
    end_child_silently(&app, &child, &parent).await;
    sqlx::query("SELECT pg_notify('aegis_workflows', 'wake')")
        .execute(&app.state.pool)
        .await
        .unwrap();
    let e = until(&app, &parent, "continued", |e| {
        e["status"] == "completed" || e["status"] == "failed"
    })
    .await;
    assert_eq!(e["status"], "completed", "{e}");
}
