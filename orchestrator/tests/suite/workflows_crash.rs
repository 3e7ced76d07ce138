//! Two orchestrator processes (the real binary) on one database run 20 workflows together; one is
//! killed with `kill -9` while it holds executions mid-state. The survivor takes them over when
//! their leases expire: every execution completes, no committed state runs again (proved from
//! the gap-free event log), and no sandbox is left behind.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::binary::{self, free_port};
use common::{docker_lines, TestDb, TEST_ADMIN_KEY};
use serde_json::{json, Value};
use uuid::Uuid;

async fn start(db: &TestDb, http: u16) -> tokio::process::Child {
    let env = [
        // A dead replica's leases expire after 2 s, its sandboxes are reaped a few seconds later
        // (not sooner: on a loaded machine a live replica's heartbeat can be late by a second or
        // two, and a replica wrongly thought dead loses its sandboxes).
        ("ORCHESTRATOR__WORKFLOWS__LEASE_TTL_SECS", "2"),
        ("ORCHESTRATOR__WORKFLOWS__POLL_INTERVAL_MS", "200"),
        ("ORCHESTRATOR__WORKFLOWS__WORKERS", "4"),
        (
            "ORCHESTRATOR__WORKFLOWS__SYSTEM_IMAGE",
            "aegis-runtime/busybox:1",
        ),
        ("ORCHESTRATOR__SANDBOX__DEAD_AFTER_SECS", "5"),
        ("ORCHESTRATOR__SANDBOX__REAP_INTERVAL_SECS", "2"),
    ];
    binary::start_on(db, http, &env).await.child
}

const WORKFLOW: &str = "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: relay
  version: \"1.0.0\"
spec:
  initial_state: ONE
  states:
    ONE:
      kind: System
      shell: true
      command: \"sleep 1; echo one-{{input.n}}\"
      transitions:
        - {condition: on_success, target: TWO}
    TWO:
      kind: ContainerRun
      name: two
      image: aegis-runtime/busybox:1
      command: [\"sh\", \"-c\", \"sleep 1; echo two-{{input.n}}\"]
      transitions:
        - {condition: on_success, target: THREE}
    THREE:
      kind: System
      command: \"echo {{trim ONE.stdout}}+{{trim TWO.stdout}}\"
      transitions: []
";

#[tokio::test]
async fn two_replicas_one_killed_every_workflow_completes_once() {
    let db = TestDb::create().await;
    let db_name = url::Url::parse(&db.url)
        .unwrap()
        .path()
        .trim_start_matches('/')
        .to_owned();
    let pool = db.pool().await;
    let client = reqwest::Client::new();
    let (port_a, port_b) = (free_port(), free_port());
    let mut a = start(&db, port_a).await;
    let instance_a: Uuid = sqlx::query_scalar("SELECT id FROM node_instances")
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut b = start(&db, port_b).await;

    let rest = |port: u16| {
        common::rest::Rest::new(
            client.clone(),
            &format!("http://127.0.0.1:{port}"),
            TEST_ADMIN_KEY,
        )
    };
    rest(port_a).deployed("/v1/workflows", WORKFLOW).await;
    let mut ids = Vec::new();
    for n in 0..20 {
        let port = if n % 2 == 0 { port_a } else { port_b };
        let body = rest(port)
            .posted("/v1/workflows/relay/run", json!({"input": {"n": n}}), 201)
            .await;
        ids.push(body["execution_id"].as_str().unwrap().to_owned());
    }

    // Kill A while it is in the middle of states it holds.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let held: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workflow_executions WHERE lease_owner = $1 AND status = 'running' \
             AND transition_count >= 1",
        )
        .bind(instance_a)
        .fetch_one(&pool)
        .await
        .unwrap();
        if held >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "replica A never held work");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    common::binary::crash(&mut a).await;
    let orphaned: i64 = common::one(
        &pool,
        "SELECT count(*) FROM workflow_executions WHERE lease_owner = $1 AND status = 'running'",
        instance_a,
    )
    .await;
    assert!(orphaned >= 1, "the kill left no execution mid-run");

    // B finishes everything.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let live = crate::common::count(&pool, "SELECT count(*) FROM workflow_executions WHERE status NOT IN ('completed', 'failed', 'cancelled', 'timed_out')").await;
        if live == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{live} executions never ended");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let mut retried = 0;
    for (n, id) in ids.iter().enumerate() {
        let (status, blackboard): (String, Value) = sqlx::query_as(
            "SELECT status, blackboard FROM workflow_executions WHERE id = $1::uuid",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(status, "completed", "{id}: {blackboard}");
        assert_eq!(blackboard["THREE"]["stdout"], format!("one-{n}+two-{n}\n"));
        let events: Vec<(i64, String, Option<String>, Value)> = sqlx::query_as(
            "SELECT seq, event_type, state_name, payload FROM workflow_execution_events \
             WHERE execution_id = $1::uuid ORDER BY seq",
        )
        .bind(id)
        .fetch_all(&pool)
        .await
        .unwrap();
        // Gap-free.
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e.0, i as i64 + 1, "{id}: gap in {events:?}");
        }
        // Each state committed exactly once, and nothing of a committed state ran after its
        // commit: every start of its container (or retry of it) comes before its single exit.
        let mut exited: HashMap<String, i64> = HashMap::new();
        for (seq, kind, state, _) in &events {
            if kind == "state_exited" {
                let previous = exited.insert(state.clone().unwrap(), *seq);
                assert!(
                    previous.is_none(),
                    "{id}: {state:?} committed twice: {events:?}"
                );
            }
        }
        assert_eq!(exited.len(), 3, "{id}: {events:?}");
        for (seq, kind, state, _) in &events {
            if matches!(kind.as_str(), "container_run_started" | "state_retried") {
                let state = state.clone().unwrap();
                assert!(
                    *seq < exited[&state],
                    "{id}: {kind} of {state} after its commit: {events:?}"
                );
            }
        }
        retried += events.iter().filter(|e| e.1 == "state_retried").count();
        assert_eq!(events.last().unwrap().1, "execution_completed");
    }
    assert!(retried >= 1, "no state was taken over after the kill");

    // No sandbox is left: the survivor removed what the dead replica's attempts left.
    let label = format!("label=org.aegis.db-name={db_name}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let containers = docker_lines(&[
            "ps",
            "-aq",
            "--filter",
            &label,
            "--filter",
            "label=org.aegis.component=sandbox",
        ]);
        let volumes = docker_lines(&[
            "volume",
            "ls",
            "-q",
            "--filter",
            &label,
            "--filter",
            "label=org.aegis.component=workspace",
        ]);
        if containers.is_empty() && volumes.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: containers {containers:?} volumes {volumes:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    b.kill().await.ok();
}
