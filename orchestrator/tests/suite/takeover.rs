//! Takeover and fencing (issue 23): replicas as real processes on one database and one Docker
//! engine, with a short `dead_after` (3 s) and lease (2 s).
//!
//! - `kill -9` of the replica holding a sandbox while calls reach it through the other: each
//!   call gets its answer or a clear error at once (none hangs), the survivor adopts the sandbox
//!   within seconds (same container, files written before still there), the session goes on
//!   through it, nothing is left in Docker after a destroy, and the audit chain is valid.
//! - SIGSTOP of the holder past `dead_after`: the other replica fences it off and takes the
//!   sandbox over (a new stream to the same executor's socket, which shuts the stopped
//!   replica's connection); after SIGCONT the woken replica refuses or forwards calls for it
//!   and acts on nothing it lost: its stream's end, seen on waking, writes nothing to the row
//!   (the epoch fence), and it rejoins holding nothing.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::binary::{self, free_port, Node};
use common::{docker_lines, TestDb, TEST_ADMIN_KEY};
use serde_json::{json, Value};

const SECRET: &str = "the-cluster-secret-shared-by-all-replicas";

/// One replica: its own callers' and peers' ports, a short `dead_after` and lease.
async fn replica(db: &TestDb, extra: &[(&str, &str)], capture: bool) -> Node {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut env = vec![
        ("ORCHESTRATOR__SANDBOX__DEAD_AFTER_SECS", "3"),
        ("ORCHESTRATOR__SANDBOX__LEASE_SECS", "2"),
        ("ORCHESTRATOR__CLUSTER__LISTEN", listen.as_str()),
        ("ORCHESTRATOR__CLUSTER__SECRET", SECRET),
    ];
    env.extend_from_slice(extra);
    binary::start_on(db, free_port(), &env, capture).await
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("http client")
}

const AGENT: &str = "apiVersion: 100monkeys.ai/v1
kind: Agent
metadata:
  name: survivor
  version: \"1.0.0\"
spec:
  runtime:
    language: busybox
    version: \"1\"
  task:
    instruction: Work in the workspace.
  tools: [cmd.run, fs.read, fs.write]
  builtin_dispatchers:
    - name: cmd
      capabilities:
        - name: cmd.run
          subcommand_allowlist: [cat, echo, sleep]
          timeout_seconds: 30
  security:
    filesystem:
      read: [/workspace]
      write: [/workspace]
";

/// Deploys the agent and makes an operator sandbox through `node`; its id.
async fn sandbox_on(node: &Node) -> String {
    let http = client();
    let r = http
        .post(format!("{}/v1/agents", node.base))
        .bearer_auth(TEST_ADMIN_KEY)
        .body(AGENT)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let r = http
        .post(format!("{}/v1/sandboxes", node.base))
        .bearer_auth(TEST_ADMIN_KEY)
        .json(&json!({"agent": "survivor"}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, 201, "{body}");
    body["sandbox_id"].as_str().expect("sandbox id").to_owned()
}

/// One tool call into `sandbox` through `base`: (HTTP status, body).
async fn call(base: &str, sandbox: &str, name: &str, arguments: Value) -> (u16, Value) {
    let r = client()
        .post(format!("{base}/v1/tools/call"))
        .bearer_auth(TEST_ADMIN_KEY)
        .json(&json!({"name": name, "arguments": arguments, "sandbox_id": sandbox}))
        .send()
        .await
        .expect("the replica answers");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The tool's result when the call succeeded.
fn ok_result(answer: &(u16, Value)) -> Option<&Value> {
    (answer.0 == 200 && answer.1["isError"] == false).then(|| &answer.1["structuredContent"])
}

/// `(instance_id, epoch, state)` of a sandbox's row.
async fn holder(pool: &sqlx::PgPool, sandbox: &str) -> (uuid::Uuid, i64, String) {
    sqlx::query_as("SELECT instance_id, epoch, state FROM sandboxes WHERE id = $1::uuid")
        .bind(sandbox)
        .fetch_one(pool)
        .await
        .expect("sandbox row")
}

/// Instances not recorded as stopped.
async fn running_instances(pool: &sqlx::PgPool) -> usize {
    sqlx::query_scalar::<_, i64>("SELECT count(*) FROM node_instances WHERE stopped_at IS NULL")
        .fetch_one(pool)
        .await
        .expect("instances") as usize
}

fn signal(node: &Node, sig: &str) {
    let pid = node.child.id().expect("running").to_string();
    assert!(Command::new("kill")
        .args([sig, &pid])
        .status()
        .expect("kill runs")
        .success());
}

async fn audit_valid(base: &str) {
    let verify: Value = client()
        .get(format!("{base}/v1/audit/verify?full=true"))
        .bearer_auth(TEST_ADMIN_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(verify["valid"], true, "{verify}");
}

#[tokio::test]
async fn kill_9_of_the_holder_mid_calls_the_survivor_adopts_and_the_session_goes_on() {
    let db = TestDb::create().await;
    let pool = db.pool().await;
    let mut a = replica(&db, &[], false).await;
    let b = replica(&db, &[], false).await;
    let id = sandbox_on(&a).await;
    let (a_id, epoch, _) = holder(&pool, &id).await;
    let label = format!("label=org.aegis.sandbox={id}");

    // Written through B (forwarded to A, which holds the stream).
    let wrote = call(
        &b.base,
        &id,
        "fs.write",
        json!({"path": "/workspace/before.txt", "content": "written before the crash"}),
    )
    .await;
    assert!(ok_result(&wrote).is_some(), "{wrote:?}");

    // Calls keep coming through B while A dies: one long command in flight on A, and a stream
    // of short ones; each is timed.
    let in_flight = tokio::spawn({
        let (base, id) = (b.base.clone(), id.clone());
        async move {
            let started = Instant::now();
            let answer = call(&base, &id, "cmd.run", json!({"command": "sleep 20"})).await;
            (started.elapsed(), answer)
        }
    });
    let stream = tokio::spawn({
        let (base, id) = (b.base.clone(), id.clone());
        async move {
            let mut seen = Vec::new();
            let until = Instant::now() + Duration::from_secs(25);
            while Instant::now() < until {
                let started = Instant::now();
                let answer = call(
                    &base,
                    &id,
                    "fs.read",
                    json!({"path": "/workspace/before.txt"}),
                )
                .await;
                let ok = ok_result(&answer).is_some();
                seen.push((started, started.elapsed(), answer));
                // Once served again after failures, the session has gone on: enough.
                if ok && seen.iter().any(|(_, _, a)| ok_result(a).is_none()) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            seen
        }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let killed_at = Instant::now();
    signal(&a, "-KILL");
    a.child.wait().await.expect("A is gone");

    let seen = stream.await.expect("calls task");
    for (_, took, answer) in &seen {
        // Served, or a clear error at once: never a hang.
        assert!(
            *took < Duration::from_secs(5),
            "a call took {took:?}: {answer:?}"
        );
        if ok_result(answer).is_none() {
            let text = answer.1.to_string();
            assert!(
                text.contains(&id) || text.contains("instance"),
                "the error names what failed: {text}"
            );
        }
    }
    let (served_at, _, last) = seen.last().expect("calls were made");
    let back = ok_result(last).expect("the session goes on through B after the takeover");
    assert_eq!(back["content"], "written before the crash");
    let gap = served_at.saturating_duration_since(killed_at);
    eprintln!("served again {gap:?} after kill -9 (dead_after 3 s)");
    assert!(
        gap < Duration::from_secs(12),
        "adopted within seconds: {gap:?}"
    );
    let (in_flight_took, in_flight) = in_flight.await.expect("in-flight task");
    assert!(
        in_flight_took < Duration::from_secs(15),
        "the call in flight on A ended at once, not at its deadline: {in_flight_took:?}"
    );
    assert!(ok_result(&in_flight).is_none(), "{in_flight:?}");

    // B holds it now, one epoch later; the same container, the same workspace.
    let (now_holder, now_epoch, state) = holder(&pool, &id).await;
    assert_ne!(now_holder, a_id);
    assert_eq!(now_epoch, epoch + 1);
    assert_eq!(state, "running");
    assert_eq!(running_instances(&pool).await, 2, "A never recorded a stop");
    let ran = call(
        &b.base,
        &id,
        "cmd.run",
        json!({"command": "cat /workspace/before.txt"}),
    )
    .await;
    assert_eq!(
        ok_result(&ran).map(|r| r["stdout"].clone()),
        Some(json!("written before the crash")),
        "{ran:?}"
    );
    let wrote = call(
        &b.base,
        &id,
        "fs.write",
        json!({"path": "/workspace/after.txt", "content": "after"}),
    )
    .await;
    assert!(ok_result(&wrote).is_some(), "{wrote:?}");
    assert_eq!(docker_lines(&["ps", "-q", "--filter", &label]).len(), 1);

    // The audit chain both replicas wrote (A's last intent rows included) is valid.
    audit_valid(&b.base).await;

    // Destroyed through B: nothing of it is left.
    let r = client()
        .delete(format!("{}/v1/sandboxes/{id}", b.base))
        .bearer_auth(TEST_ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    assert!(docker_lines(&["ps", "-aq", "--filter", &label]).is_empty());
    assert!(docker_lines(&["volume", "ls", "-q", "--filter", &label]).is_empty());
    b.terminate().await;
}

#[tokio::test]
async fn a_replica_stopped_past_dead_after_acts_on_nothing_it_lost_when_it_wakes() {
    let db = TestDb::create().await;
    let pool = db.pool().await;
    // The socket channel: the takeover's connection shuts the stopped replica's down, which it
    // sees (and must not record) when it wakes.
    let channels = format!(
        "/tmp/aegis-fence-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let env = [
        ("ORCHESTRATOR__SANDBOX__CHANNEL_DIR", channels.as_str()),
        ("RUST_LOG", "warn,dispatcher=info"),
    ];
    let a = replica(&db, &env, true).await;
    let b = replica(&db, &env, false).await;
    let id = sandbox_on(&a).await;
    let (a_id, epoch, _) = holder(&pool, &id).await;
    let wrote = call(
        &a.base,
        &id,
        "fs.write",
        json!({"path": "/workspace/kept.txt", "content": "kept"}),
    )
    .await;
    assert!(ok_result(&wrote).is_some(), "{wrote:?}");

    signal(&a, "-STOP");
    let stopped_at = Instant::now();
    // B fences A off and takes the sandbox over.
    let b_id = loop {
        let (now, now_epoch, state) = holder(&pool, &id).await;
        if now != a_id {
            assert_eq!(now_epoch, epoch + 1);
            assert_eq!(state, "running");
            break now;
        }
        assert!(
            stopped_at.elapsed() < Duration::from_secs(20),
            "B never took the sandbox over"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Fenced only after dead_after of silence, counted from A's last renewal (which may be
    // older than the SIGSTOP on a loaded machine), on the database's one clock.
    let (fenced, silent): (Option<chrono::DateTime<chrono::Utc>>, Option<f64>) = sqlx::query_as(
        "SELECT fenced_at, extract(epoch FROM fenced_at - heartbeat_at)::float8 \
         FROM node_instances WHERE id = $1",
    )
    .bind(a_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(fenced.is_some(), "A was fenced off before the takeover");
    assert!(
        silent.unwrap_or_default() >= 3.0,
        "not before dead_after of silence: {silent:?}"
    );
    let read = call(
        &b.base,
        &id,
        "fs.read",
        json!({"path": "/workspace/kept.txt"}),
    )
    .await;
    assert_eq!(
        ok_result(&read).map(|r| r["content"].clone()),
        Some(json!("kept")),
        "{read:?}"
    );

    // A wakes up. Whatever it answers, it never acts on the sandbox itself: a refusal at once
    // (its lease lapsed) or the call forwarded to B.
    signal(&a, "-CONT");
    let woke = Instant::now();
    let mut forwarded = false;
    while woke.elapsed() < Duration::from_secs(15) {
        let started = Instant::now();
        let answer = call(
            &a.base,
            &id,
            "fs.write",
            json!({"path": "/workspace/woken.txt", "content": "through the woken replica"}),
        )
        .await;
        assert!(started.elapsed() < Duration::from_secs(5), "{answer:?}");
        if ok_result(&answer).is_some() {
            forwarded = true;
            break;
        }
        let text = answer.1.to_string();
        assert!(
            text.contains("does not hold") || text.contains("held by"),
            "a clear refusal: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(forwarded, "the woken replica forwards to the new holder");
    // Its stale write (the end of the stream it lost) changed nothing: B's, same epoch.
    assert_eq!(
        holder(&pool, &id).await,
        (b_id, epoch + 1, "running".to_owned())
    );
    let metrics = client()
        .get(format!("{}/metrics", a.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let sent = metrics
        .lines()
        .find(|l| l.starts_with("aegis_forwarded_calls_total{direction=\"sent\",outcome=\"ok\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_default();
    assert!(sent >= 1.0, "A forwarded the call: {metrics}");
    // B wrote the file: the executor B holds serves it.
    let read = call(
        &b.base,
        &id,
        "fs.read",
        json!({"path": "/workspace/woken.txt"}),
    )
    .await;
    assert_eq!(
        ok_result(&read).map(|r| r["content"].clone()),
        Some(json!("through the woken replica"))
    );
    // A rejoined: not fenced any more, alive again, holding nothing.
    let fenced: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT fenced_at FROM node_instances WHERE id = $1")
            .bind(a_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(fenced.is_none(), "A rejoined");

    let log = a.terminate().await;
    assert!(
        log.contains("fenced off by a peer"),
        "A noticed it was fenced off: {log}"
    );
    // On waking, either the end of the stream it lost (shut by the executor when B connected)
    // was seen first, and not recorded, or the lapsed lease dropped the stream first.
    assert!(
        log.contains("no longer holds ended; nothing recorded")
            || log.contains("stops using the sandboxes it held"),
        "A let go of the sandbox without acting on it: {log}"
    );
    // A's stop destroyed nothing of B's.
    assert_eq!(holder(&pool, &id).await.2, "running");
    audit_valid(&b.base).await;
    let r = client()
        .delete(format!("{}/v1/sandboxes/{id}", b.base))
        .bearer_auth(TEST_ADMIN_KEY)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    b.terminate().await;
    let _ = std::fs::remove_dir_all(&channels);
}
