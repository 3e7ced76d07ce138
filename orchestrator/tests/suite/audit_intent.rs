//! Every call is audited whatever the client does, and the audit chain is anchored outside the
//! database: attacks on both, checked in the audit log and from inside the sandbox.
//!
//! - A client that drops its connection during `cmd.run sleep 280`: the intent row existed while
//!   the command ran, its completion says `cancelled` / `client_disconnected`, and no `sleep`
//!   survives in the sandbox.
//! - A SEAL session whose first call is abandoned while its sandbox is being made: the sandbox
//!   is recorded on the session and destroyed with it; the abandoned call is in the log.
//! - An orchestrator that stopped mid-call: its open intent is completed `abandoned`.
//! - A caller dropped while its intent is being written: the intent is stored all the same and
//!   completed `cancelled`.
//! - Deleting the newest rows: detected against the published head and the last checkpoint.

use crate::common;
use crate::common::agent::AgentManifest;

use std::future::Future;
use std::time::{Duration, Instant};

use aegis_cli::seal_client::{ClientError, SealClient, Transport};
use common::{test_config, TestApp, TestDb, TEST_ADMIN_KEY};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use uuid::Uuid;

const IMAGE: &str = "aegis-runtime/busybox:1";
/// The advisory lock the audit chain's appends take ("audit" in ASCII).
const AUDIT_APPEND_LOCK: i64 = 0x0061_7564_6974;

fn docker(args: &[&str]) -> String {
    common::docker_out(args).1
}

/// The processes in a sandbox, as its own user sees them (`ps` inside the container).
fn processes(sandbox: &str) -> String {
    docker(&[
        "exec",
        "-u",
        "65534:65534",
        &format!("aegis-sbx-{sandbox}"),
        "ps",
    ])
}

/// Polls `check` until it yields a value (at most 60 s; the condition, not the time, is tested).
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends one HTTP/1.1 POST on a raw connection and returns the connection unread: dropping it
/// is a client that goes away mid-request.
async fn post_and_hold(app: &TestApp, path: &str, key: Option<&str>, body: &Value) -> TcpStream {
    let addr = app.http_base.trim_start_matches("http://").to_owned();
    let mut stream = TcpStream::connect(&addr).await.expect("connect");
    let body = body.to_string();
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .expect("request written");
    stream
}

fn agent(name: &str) -> String {
    AgentManifest::new(name)
        .instruction("Wait.")
        .tools(&["cmd.run", "fs.read"])
        .cmd(&["sleep", "echo"], 300, "")
        .yaml()
}

async fn verify(app: &TestApp, query: &str) -> Value {
    let r = app
        .response(Method::GET, &format!("/v1/audit/verify{query}"), None)
        .await;
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

#[tokio::test]
async fn a_client_that_disconnects_during_cmd_run_is_audited_as_cancelled_and_its_command_dies() {
    assert!(
        !docker(&["images", "-q", IMAGE]).is_empty(),
        "image {IMAGE} is missing: run runtime-images/build.sh --only busybox (scripts/test.sh does)"
    );
    let app = TestApp::spawn().await;
    app.deployed("/v1/agents", &agent("sleeper")).await;
    let created = app
        .posted("/v1/sandboxes", json!({"agent": "sleeper"}), 201)
        .await;
    let sandbox = created["sandbox_id"].as_str().unwrap().to_owned();
    let pool = app.state.pool.clone();

    let connection = post_and_hold(
        &app,
        "/v1/tools/call",
        Some(TEST_ADMIN_KEY),
        &json!({"name": "cmd.run", "arguments": {"command": "sleep 280"}, "sandbox_id": sandbox}),
    )
    .await;

    // While the command runs, its intent is already in the chain, not yet completed.
    let intent: Uuid = eventually("the cmd.run intent row", || {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar(
                "SELECT id FROM audit_log WHERE action = 'cmd.run' AND outcome = 'running'",
            )
            .fetch_optional(&pool)
            .await
            .unwrap()
        }
    })
    .await;
    eventually("sleep 280 running in the sandbox", || {
        let sandbox = sandbox.clone();
        async move { processes(&sandbox).contains("sleep 280").then_some(()) }
    })
    .await;
    let completions: i64 = common::one(
        &pool,
        "SELECT count(*) FROM audit_log WHERE intent_id = $1",
        intent,
    )
    .await;
    assert_eq!(completions, 0, "the call is still running");

    // The client goes away.
    drop(connection);

    let (outcome, code, reason): (String, Option<String>, Option<String>) =
        eventually("the completion row", || {
            let pool = pool.clone();
            async move {
                sqlx::query_as(
                    "SELECT outcome, reason_code, reason FROM audit_log WHERE intent_id = $1",
                )
                .bind(intent)
                .fetch_optional(&pool)
                .await
                .unwrap()
            }
        })
        .await;
    assert_eq!(outcome, "cancelled");
    assert_eq!(code.as_deref(), Some("client_disconnected"), "{reason:?}");
    // From inside: nothing of the command survives.
    eventually("no sleep left in the sandbox", || {
        let sandbox = sandbox.clone();
        async move {
            let ps = processes(&sandbox);
            (!ps.contains("sleep")).then_some(())
        }
    })
    .await;
    assert!(
        processes(&sandbox).contains("PID"),
        "the sandbox itself is alive"
    );

    let v = verify(&app, "?full=true").await;
    assert_eq!(v["valid"], true, "{v}");
}

fn runner_context() -> Value {
    json!({"name": "runner", "description": "runs sleep",
           "runtime": {"language": "busybox", "version": "1"},
           "capabilities": [{"tool_pattern": "cmd.run", "command_allowlist": ["sleep"]}],
           "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}})
}

#[tokio::test]
async fn a_session_whose_first_call_is_abandoned_keeps_no_orphan_sandbox() {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.seal.security_contexts = vec![runner_context()];
    let app = TestApp::spawn_with(config).await;
    let pool = app.state.pool.clone();
    let mut client = SealClient::new(Transport::Http(app.http_base.clone())).unwrap();
    client.attest("test-abandon", "runner").await.unwrap();
    let session = client.session_id().unwrap().to_owned();

    let payload = json!({"jsonrpc": "2.0", "id": "req-1", "method": "tools/call",
        "params": {"name": "cmd.run", "arguments": {"command": "sleep 280"}}});
    let envelope = client.envelope(&payload, chrono::Utc::now()).unwrap();
    let connection = post_and_hold(&app, "/v1/seal/invoke", None, &envelope).await;

    // The first call makes the session's sandbox; the client leaves while it is being made.
    let sandbox: Uuid = eventually("the session's sandbox row", || {
        let (pool, session) = (pool.clone(), session.clone());
        async move {
            sqlx::query_scalar(
                "SELECT id FROM sandboxes WHERE owner_kind = 'session' AND owner_id = $1",
            )
            .bind(session)
            .fetch_optional(&pool)
            .await
            .unwrap()
        }
    })
    .await;
    drop(connection);

    // The sandbox is recorded on the session, so it cannot outlive it.
    let session_id = Uuid::parse_str(&session).unwrap();
    eventually("the sandbox recorded on the session", || {
        let pool = pool.clone();
        async move {
            let recorded: Option<Uuid> = common::one(
                &pool,
                "SELECT sandbox_id FROM seal_sessions WHERE id = $1",
                session_id,
            )
            .await;
            (recorded == Some(sandbox)).then_some(())
        }
    })
    .await;
    // The abandoned call is in the log, and says why.
    let outcome: String = eventually("an audit row for the abandoned call", || {
        let (pool, session) = (pool.clone(), session.clone());
        async move {
            sqlx::query_scalar(
                "SELECT outcome FROM audit_log WHERE caller_id = $1 AND action = 'cmd.run' \
                 AND reason_code = 'client_disconnected'",
            )
            .bind(session)
            .fetch_optional(&pool)
            .await
            .unwrap()
        }
    })
    .await;
    assert_eq!(outcome, "cancelled");
    // From inside: whatever point the call reached, no sleep is left running.
    eventually("no sleep in the session's sandbox", || {
        let sandbox = sandbox.to_string();
        async move {
            let ps = processes(&sandbox);
            (ps.contains("PID") && !ps.contains("sleep")).then_some(())
        }
    })
    .await;

    // Revocation destroys it, and the revoked token learns nothing more, not even its tools.
    let (_, revoked) = app
        .send_json(
            Method::DELETE,
            &format!("/v1/seal/sessions/{session}"),
            None,
        )
        .await;
    assert_eq!(revoked["sandbox_destroyed"], true, "{revoked}");
    assert!(
        docker(&[
            "ps",
            "-aq",
            "--filter",
            &format!("name=aegis-sbx-{sandbox}")
        ])
        .is_empty(),
        "the session's container is gone"
    );
    match client.list_tools().await {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, 1006),
        other => panic!("a revoked session listed its tools: {other:?}"),
    }
}

#[tokio::test]
async fn an_intent_left_open_by_a_stopped_instance_is_completed_as_abandoned() {
    let app = TestApp::spawn().await;
    let pool = app.state.pool.clone();
    let caller = orchestrator::caller::Caller::system();
    // An instance that is gone (no live node_instances row) opened this intent and never
    // completed it: its completion channel is leaked, as a killed process would leave it.
    let gone = Uuid::new_v4();
    let sandbox = Uuid::new_v4();
    let open = orchestrator::audit::begin_call(
        &pool,
        &caller,
        gone,
        "cmd.run",
        "sha256:00",
        Some(sandbox),
        Instant::now(),
    )
    .await
    .unwrap();
    let intent = open.intent_id();
    std::mem::forget(open);

    let completed = orchestrator::audit::recover_abandoned(&pool, app.state.instance_id, 60)
        .await
        .unwrap();
    assert_eq!(completed, 1);
    let (outcome, code, in_sandbox): (String, Option<String>, Option<Uuid>) = sqlx::query_as(
        "SELECT outcome, reason_code, sandbox_id FROM audit_log WHERE intent_id = $1",
    )
    .bind(intent)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(outcome, "abandoned");
    assert_eq!(code.as_deref(), Some("orchestrator_stopped"));
    // The completion is found with the intent's sandbox.
    assert_eq!(in_sandbox, Some(sandbox));
    // Recovering again finds nothing more; intents of this live instance are left alone.
    assert_eq!(
        orchestrator::audit::recover_abandoned(&pool, app.state.instance_id, 60)
            .await
            .unwrap(),
        0
    );
    let v = verify(&app, "?full=true").await;
    assert_eq!(v["valid"], true, "{v}");
}

/// The intent and completion rows are written from the caller's own task: a caller dropped
/// while its intent is being written (a client gone at that very moment) must neither lose the
/// intent nor leave it open. The write ends in a task of its own and the intent is completed
/// `cancelled`; a handle dropped without completing completes it `cancelled` too.
#[tokio::test]
async fn an_intent_whose_caller_is_dropped_mid_write_is_stored_and_completed_cancelled() {
    let app = TestApp::spawn().await;
    let pool = app.state.pool.clone();
    let caller = orchestrator::caller::Caller::system();
    let digest = format!("sha256:{}", Uuid::new_v4().simple());
    // The chain's lock held elsewhere: the intent's statement waits in PostgreSQL.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(AUDIT_APPEND_LOCK)
        .execute(&mut *holder)
        .await
        .unwrap();
    // A `cmd.run` call's intent, told apart by its arguments' digest.
    let begin = |digest: &str| {
        let (pool, caller, digest) = (pool.clone(), caller.clone(), digest.to_owned());
        let instance = app.state.instance_id;
        async move {
            orchestrator::audit::begin_call(
                &pool,
                &caller,
                instance,
                "cmd.run",
                &digest,
                None,
                Instant::now(),
            )
            .await
        }
    };
    let mut write = Box::pin(begin(&digest));
    // Polled until its statement is in flight, then dropped: its client went away.
    let polled = tokio::time::timeout(Duration::from_millis(300), write.as_mut()).await;
    assert!(polled.is_err(), "the intent was written under a held lock");
    drop(write);
    holder.commit().await.unwrap();
    let rows_of = |digest: String| {
        let pool = pool.clone();
        async move {
            let rows: Vec<(String, Option<String>)> = sqlx::query_as(
                "SELECT outcome, reason_code FROM audit_log WHERE args_digest = $1 ORDER BY seq",
            )
            .bind(digest)
            .fetch_all(&pool)
            .await
            .unwrap();
            (rows.len() == 2).then_some(rows)
        }
    };
    let rows = eventually("the dropped intent is stored and completed", || {
        rows_of(digest.clone())
    })
    .await;
    assert_eq!(rows[0], ("running".to_owned(), None));
    assert_eq!(
        rows[1],
        (
            "cancelled".to_owned(),
            Some("client_disconnected".to_owned())
        )
    );

    // A handle dropped after its intent was stored, before the tool ended.
    let digest = format!("sha256:{}", Uuid::new_v4().simple());
    let open = begin(&digest).await.unwrap();
    drop(open);
    let rows = eventually("the dropped handle's intent is completed", || {
        rows_of(digest.clone())
    })
    .await;
    assert_eq!(rows[1].0, "cancelled");
    let v = verify(&app, "?full=true").await;
    assert_eq!(v["valid"], true, "{v}");
}

#[tokio::test]
async fn deleting_the_newest_rows_is_detected_against_the_published_anchor() {
    let app = TestApp::spawn().await;
    for _ in 0..3 {
        app.call_tool("aegis.agent.list", json!({})).await;
    }
    let head = app.get_value("/v1/audit/head").await;
    assert_eq!(
        head["count"], 6,
        "three calls, intent and completion each: {head}"
    );
    let anchor = format!(
        "?anchor_count={}&anchor_hash={}",
        head["count"],
        head["head_hash"].as_str().unwrap()
    );
    let ok = verify(&app, &anchor).await;
    assert_eq!(ok["valid"], true, "{ok}");
    assert_eq!(ok["count"], 6);

    // Verification is admin-only, and half an anchor is refused with the reason.
    let readonly = app.create_key("ro", "readonly").await;
    let operator = app.create_key("op", "operator").await;
    for key in [&readonly, &operator] {
        app.rest_as(key)
            .answered(Method::GET, "/v1/audit/verify", None, 403)
            .await;
    }
    app.answered(Method::GET, "/v1/audit/verify?anchor_count=3", None, 400)
        .await;

    // Later calls; the next verification starts from the checkpoint the last one left.
    app.call_tool("aegis.agent.list", json!({})).await;
    let incremental = verify(&app, "").await;
    assert_eq!(incremental["valid"], true, "{incremental}");
    assert_eq!(incremental["from_count"], 6, "{incremental}");
    let head_now = app.get_value("/v1/audit/head").await;

    // Someone with database access removes the newest rows (what hashes alone cannot show).
    sqlx::query(
        "DELETE FROM audit_log WHERE seq IN (SELECT seq FROM audit_log ORDER BY seq DESC LIMIT 3)",
    )
    .execute(&app.state.pool)
    .await
    .unwrap();
    // The remaining chain is internally consistent...
    let full = verify(&app, "?full=true").await;
    assert_eq!(full["valid"], true, "{full}");
    // ...but not against what was published.
    let anchored = verify(
        &app,
        &format!(
            "?full=true&anchor_count={}&anchor_hash={}",
            head_now["count"],
            head_now["head_hash"].as_str().unwrap()
        ),
    )
    .await;
    assert_eq!(anchored["valid"], false, "{anchored}");
    assert_eq!(anchored["first_broken"]["problem"], "rows_missing");
    // The old anchor still holds (rows up to it are intact).
    assert_eq!(
        verify(&app, &format!("{anchor}&full=true")).await["valid"],
        true
    );

    // A checkpoint row that disappears is reported without any anchor.
    let app2 = TestApp::spawn().await;
    app2.call_tool("aegis.agent.list", json!({})).await;
    assert_eq!(verify(&app2, "").await["valid"], true);
    sqlx::query("DELETE FROM audit_log WHERE seq = (SELECT max(seq) FROM audit_log)")
        .execute(&app2.state.pool)
        .await
        .unwrap();
    let missing = verify(&app2, "").await;
    assert_eq!(missing["valid"], false, "{missing}");
    assert_eq!(missing["first_broken"]["problem"], "checkpoint_missing");
}
