//! Replicas of one database serve each other's sandboxes: a call for a sandbox another live
//! replica holds is forwarded to it over the peer listener (`cluster.listen`, signed with the
//! cluster secret) and answered as if local; the policy decision and the audit rows stay with
//! the replica the caller reached. Attacks on the peer listener (no signature, another secret,
//! a replayed or altered request, the route on the callers' port) are refused.
//!
//! Live processes, their streams and watches go the same way: background processes started,
//! fed, signalled and re-attached through the replica that does not hold the sandbox, a streamed
//! `cmd.run` over its SSE door, E2B's SDK on its envd door, a watch; unsigned and replayed
//! subscriptions refused; a holder killed mid-stream ends the caller's stream at once.

use crate::common;
use crate::common::agent::AgentManifest;

use common::replicas::{in_process as replica, SECRET};
use common::sandbox::AgentSandbox;
use common::{TestApp, TestDb};
use orchestrator::cluster::{
    ClusterKey, ForwardedCall, ForwardedSubscription, Open, CALL_PATH, SIGNATURE_HEADER,
    SUBSCRIBE_PATH,
};
use reqwest::Method;
use serde_json::{json, Value};

fn agent() -> String {
    AgentManifest::new("shared")
        .instruction("Work in the workspace.")
        .tools(&["cmd.run", "fs.read", "fs.write"])
        .cmd(
            &["cat", "echo", "id"],
            30,
            "          max_output_bytes: 65536\n",
        )
        .filesystem(&["/workspace"], &["/workspace"])
        .yaml()
}

/// Where peers reach `app` (its `node_instances.peer_url`).
async fn peer_url(app: &TestApp) -> String {
    app.one::<Option<String>, _>(
        "SELECT peer_url FROM node_instances WHERE id = $1",
        app.state.instance_id,
    )
    .await
    .expect("a replica with cluster.listen records its peer URL")
}

/// Two replicas of `db` with the cluster secret; (A, B).
async fn two_replicas(db: &TestDb) -> (TestApp, TestApp) {
    let a = TestApp::spawn_with(replica(db, Some(SECRET))).await;
    let b = TestApp::spawn_with(replica(db, Some(SECRET))).await;
    (a, b)
}

/// [`two_replicas`] and a sandbox of `manifest` made on A (which holds it); (A, B, the sandbox).
async fn holding_on_a(db: &TestDb, manifest: String) -> (TestApp, TestApp, AgentSandbox) {
    let (a, b) = two_replicas(db).await;
    let made = AgentSandbox::start(&a, manifest).await;
    (a, b, made)
}

/// A watch of `/workspace` (`recursive` or not) in the sandbox `made`, opened through `b`'s
/// dispatcher; (the sandbox's id, the watch).
async fn watch_through(
    b: &TestApp,
    made: &AgentSandbox,
    recursive: bool,
) -> (dispatcher::SandboxId, dispatcher::WatchHandle) {
    let id = dispatcher::SandboxId(made.id.parse().expect("uuid"));
    let dispatcher = b.state.sandboxes.dispatcher().expect("a dispatcher");
    let watch = dispatcher
        .watch_dir(id, "/workspace", recursive)
        .await
        .expect("a watch through B");
    (id, watch)
}

/// A replica with the cluster secret and a sandbox of [`agent`] on it; (the replica, the
/// sandbox, where peers reach `path` on it).
async fn holder_of_a_sandbox(db: &TestDb, path: &str) -> (TestApp, AgentSandbox, String) {
    let holder = TestApp::spawn_with(replica(db, Some(SECRET))).await;
    let made = AgentSandbox::start(&holder, agent()).await;
    let url = format!("{}{path}", peer_url(&holder).await);
    (holder, made, url)
}

/// `body` signed at `at` (a Unix time) with the cluster secret.
fn signed_at(at: i64, body: &[u8]) -> String {
    ClusterKey::new(SECRET).sign(at, body).expect("sign")
}

/// `body` signed now with the cluster secret.
fn signed(body: &[u8]) -> String {
    signed_at(chrono::Utc::now().timestamp(), body)
}

/// `body` signed now with a secret other than the cluster's.
fn signed_with_another_secret(body: &[u8]) -> String {
    ClusterKey::new(&"w".repeat(40))
        .sign(chrono::Utc::now().timestamp(), body)
        .expect("sign")
}

/// A peer route asked on the callers' port instead (`request`, with the admin key), signed
/// with the cluster secret: it is not there (404).
async fn assert_not_on_callers_port(request: reqwest::RequestBuilder, signature: String) {
    let r = request
        .header(SIGNATURE_HEADER, signature)
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 404);
}

/// A refusal of the peer listener: `status`, with a message that says `said`.
async fn assert_refused_saying(r: reqwest::Response, status: u16, said: &str) {
    assert_eq!(r.status(), status);
    let out: Value = r.json().await.expect("json");
    assert!(common::json::text(&out["message"]).contains(said), "{out}");
}

async fn audit_valid(app: &TestApp) {
    let verify = app.get_value("/v1/audit/verify").await;
    assert_eq!(verify["valid"], true, "{verify}");
}

#[tokio::test]
async fn a_sandbox_made_through_one_replica_is_served_through_another() {
    let db = TestDb::create().await;
    let (a, b, made) = holding_on_a(&db, agent()).await;
    let via_b = AgentSandbox::of(&b, &made.id);

    // Files and commands through B reach the executor A holds, and the other way round.
    let wrote = via_b
        .ok(
            "fs.write",
            json!({"path": "/workspace/from-b.txt", "content": "written through b"}),
        )
        .await;
    assert_eq!(wrote["bytes_written"], 17, "{wrote}");
    let read = made
        .ok("fs.read", json!({"path": "/workspace/from-b.txt"}))
        .await;
    assert_eq!(read["content"], "written through b");
    let ran = via_b
        .ok(
            "cmd.run",
            json!({"command": "cat", "args": ["/workspace/from-b.txt"]}),
        )
        .await;
    assert_eq!(ran["stdout"], "written through b");
    assert_eq!(ran["exit_code"], 0);
    let uid = via_b.ok("cmd.run", json!({"command": "id -u"})).await;
    assert_eq!(uid["stdout"], "65534\n", "the sandbox user, as on A");
    // Checked from inside the container: one sandbox, one file.
    let (code, inside) = made.inside(&["/bin/cat", "/workspace/from-b.txt"]);
    assert_eq!((code, inside.as_str()), (0, "written through b"));

    // The policy is B's: what the allowlist refuses is refused by B's router, before any
    // forwarding, with the same answer as on A.
    let mut refusals = Vec::new();
    for sandbox in [&via_b, &made] {
        let refusal = sandbox
            .refused(
                "cmd.run",
                json!({"command": "rm", "args": ["-rf", "/workspace"]}),
                403,
                "command_not_allowed",
            )
            .await;
        refusals.push(refusal["error"].clone());
    }
    assert_eq!(refusals[0], refusals[1], "B's answer, then A's");
    // Executor errors come back as the executor said them.
    via_b
        .tool_error(
            "fs.read",
            json!({"path": "/workspace/missing.txt"}),
            "not_found",
        )
        .await;

    // B audited the calls it decided (intent and completion rows under B's instance id), and
    // the one chain both replicas write stays valid.
    let b_rows: i64 = b
        .one(
            "SELECT count(*) FROM audit_log WHERE instance_id = $1 AND action = 'cmd.run'",
            b.state.instance_id,
        )
        .await;
    assert!(b_rows >= 1, "B audited its cmd.run calls: {b_rows}");
    audit_valid(&a).await;
    audit_valid(&b).await;

    // /metrics shows the two replicas and the calls carried between them.
    let metrics = b.get("/metrics").await.text().await.unwrap();
    // (The registry is the process's: other tests' nodes scrape it too, so only presence here.)
    assert!(
        metrics.contains("aegis_cluster_replicas{kind=\"reachable\"}"),
        "{metrics}"
    );
    // Both replicas drive this machine's engine and A's sandbox is on it.
    let engine_line = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{engine=")) && !l.contains("unrecorded"))
            .map(str::to_owned)
    };
    assert!(engine_line("aegis_engine_replicas").is_some(), "{metrics}");
    assert!(engine_line("aegis_engine_sandboxes").is_some(), "{metrics}");
    let sent = common::metric(
        &metrics,
        "aegis_forwarded_calls_total{direction=\"sent\",outcome=\"ok\"}",
    );
    assert!(sent >= 4.0, "B sent its calls to A: {sent}");

    // /health/ready names both replicas, where peers reach them and what each holds.
    let ready: Value = b.get("/health/ready").await.json().await.unwrap();
    let replicas = ready["checks"]["cluster"]["replicas"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(replicas.len(), 2, "{ready}");
    let entry = |app: &TestApp| {
        replicas
            .iter()
            .find(|r| r["instance_id"] == app.state.instance_id.to_string())
            .cloned()
            .unwrap_or_else(|| panic!("{} missing: {ready}", app.state.instance_id))
    };
    let (on_a, on_b) = (entry(&a), entry(&b));
    assert_eq!(
        (on_a["this"].clone(), on_b["this"].clone()),
        (json!(false), json!(true))
    );
    assert_eq!(on_a["sandboxes_held"], 1, "{ready}");
    assert_eq!(on_b["sandboxes_held"], 0, "{ready}");
    assert_eq!(on_a["peer_url"], json!(peer_url(&a).await), "{ready}");
    assert_eq!(ready["status"], "ready", "{ready}");
}

#[tokio::test]
async fn replicas_without_the_channel_or_with_another_secret_get_a_clear_error() {
    let db = TestDb::create().await;
    let a = TestApp::spawn_with(replica(&db, Some(SECRET))).await;
    let alone = TestApp::spawn_with(replica(&db, None)).await;
    let stranger =
        TestApp::spawn_with(replica(&db, Some("another-secret-another-secret-another"))).await;
    let made = AgentSandbox::start(&a, agent()).await;

    // A replica with no forwarder says the sandbox is held by another instance.
    let (status, out) = AgentSandbox::of(&alone, &made.id)
        .call("fs.read", json!({"path": "/workspace"}))
        .await;
    let text = out.to_string();
    assert!(text.contains("held by another"), "{status}: {out}");
    // One signing with another secret is refused by the holder, and says so; nothing ran.
    let (status, out) = AgentSandbox::of(&stranger, &made.id)
        .call(
            "fs.write",
            json!({"path": "/workspace/marker", "content": "should not exist"}),
        )
        .await;
    assert!(
        out.to_string().contains("wrong signature"),
        "{status}: {out}"
    );
    let (code, _) = made.inside(&["/bin/ls", "/workspace/marker"]);
    assert_ne!(code, 0, "the refused call wrote nothing");
}

#[tokio::test]
async fn the_peer_listener_refuses_unsigned_altered_replayed_and_stale_calls() {
    let db = TestDb::create().await;
    let (a, made, url) = holder_of_a_sandbox(&db, CALL_PATH).await;
    let http = reqwest::Client::new();
    let id: uuid::Uuid = made.id.parse().expect("uuid");
    let body = serde_json::to_vec(&ForwardedCall {
        sandbox: id,
        deadline_ms: 10_000,
        op: dispatcher::protocol::Op::Ping,
    })
    .expect("json");
    let post = |header: Option<String>, body: Vec<u8>| {
        let mut request = http.post(&url).body(body);
        if let Some(header) = header {
            request = request.header(SIGNATURE_HEADER, header);
        }
        async move {
            let r = request.send().await.expect("peer listener answers");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let now = chrono::Utc::now().timestamp();

    // Unsigned, and signed with another secret.
    let (status, out) = post(None, body.clone()).await;
    assert_eq!(
        (status, out["error"].as_str()),
        (401, Some("unsigned")),
        "{out}"
    );
    let wrong = signed_with_another_secret(&body);
    let (status, out) = post(Some(wrong), body.clone()).await;
    assert_eq!(status, 401, "{out}");
    assert!(common::json::text(&out["message"]).contains("wrong signature"));

    // A good signature works once; the same request again is a replay; a changed body fails.
    let good = signed_at(now, &body);
    let (status, out) = post(Some(good.clone()), body.clone()).await;
    assert_eq!(status, 200, "{out}");
    let (status, out) = post(Some(good.clone()), body.clone()).await;
    assert_eq!(status, 401, "{out}");
    assert!(common::json::text(&out["message"]).contains("replayed"));
    let mut altered = body.clone();
    altered.extend_from_slice(b" ");
    let (status, _) = post(Some(signed_at(now, &body)), altered).await;
    assert_eq!(status, 401);

    // Signed long ago (a captured request kept for later).
    let old = signed_at(now - 3600, &body);
    let (status, out) = post(Some(old), body.clone()).await;
    assert_eq!(status, 401, "{out}");
    assert!(common::json::text(&out["message"]).contains("clock"));

    // The route is not on the callers' port, even with the admin key.
    let on_callers_port = a.admin(Method::POST, CALL_PATH).body(body.clone());
    assert_not_on_callers_port(on_callers_port, signed_at(now, &body)).await;
}

/// `cargo test --workspace --test suite -- cluster::figures --ignored --nocapture`: a forwarded
/// call's added latency beside a local one (p50, p99 of `cmd.run true` and `fs.read` through
/// the replica that holds the sandbox and through another), and tool-call throughput
/// (`aegis.runtime.list`, `cmd.run`) with one, two and three replicas (processes) taking the
/// calls of 8 concurrent clients in turn. One run on this machine; the replicas share its two
/// cores, so throughput shows what forwarding costs, not what more hosts would add.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures"]
async fn figures() {
    use std::time::{Duration, Instant};
    let db = TestDb::create().await;
    let replicas = [
        TestApp::spawn_with(replica(&db, Some(SECRET))).await,
        TestApp::spawn_with(replica(&db, Some(SECRET))).await,
        TestApp::spawn_with(replica(&db, Some(SECRET))).await,
    ];
    let made = AgentSandbox::start(&replicas[0], agent()).await;
    made.ok(
        "fs.write",
        json!({"path": "/workspace/f.txt", "content": "x".repeat(4096)}),
    )
    .await;
    let pct = |values: &mut Vec<f64>, p: f64| {
        values.sort_by(f64::total_cmp);
        values[((p * values.len() as f64) as usize).min(values.len() - 1)]
    };
    for (name, arguments) in [
        ("cmd.run", json!({"command": "id", "args": ["-u"]})),
        ("fs.read", json!({"path": "/workspace/f.txt"})),
    ] {
        let mut line = format!("{name:<8}");
        for (label, app) in [("local", &replicas[0]), ("forwarded", &replicas[1])] {
            let sandbox = AgentSandbox::of(app, &made.id);
            for _ in 0..20 {
                sandbox.ok(name, arguments.clone()).await;
            }
            let mut times = Vec::new();
            for _ in 0..300 {
                let t = Instant::now();
                sandbox.ok(name, arguments.clone()).await;
                times.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            line += &format!(
                "  {label}: p50 {:.2} ms p99 {:.2} ms",
                pct(&mut times, 0.5),
                pct(&mut times, 0.99)
            );
        }
        eprintln!("{line}");
    }
    // A streamed `cmd.run` (SSE): its first output and its answer, through the holder and
    // through another replica (the output relayed over a subscription).
    let mut line = "cmd.run streamed (echo)".to_owned();
    for (label, app) in [("local", &replicas[0]), ("forwarded", &replicas[1])] {
        let sandbox = AgentSandbox::of(app, &made.id);
        let (mut first, mut whole) = (Vec::new(), Vec::new());
        for run in 0..120 {
            let t = Instant::now();
            let mut events =
                crate::streaming::stream(app, &sandbox, json!({"command": "echo", "args": ["hi"]}))
                    .await;
            let mut first_at = None;
            while let Some((name, _)) = events.next().await {
                if name == "stdout" && first_at.is_none() {
                    first_at = Some(t.elapsed());
                }
                if name == "result" {
                    break;
                }
            }
            if run >= 20 {
                first.push(first_at.expect("output").as_secs_f64() * 1000.0);
                whole.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }
        line += &format!(
            "  {label}: first output p50 {:.2} ms, answer p50 {:.2} ms p99 {:.2} ms",
            pct(&mut first, 0.5),
            pct(&mut whole, 0.5),
            pct(&mut whole, 0.99)
        );
    }
    eprintln!("{line}");
    // Throughput with the replicas as processes, each on its own runtime as deployed (the
    // in-process ones above share the test's): 8 concurrent clients spread over the first n
    // replicas for 5 s, calling one sandbox held by the first (so with n replicas, (n-1)/n
    // of the calls are forwarded).
    drop(replicas);
    let nodes = [
        common::replicas::replica(&db, &[]).await,
        common::replicas::replica(&db, &[]).await,
        common::replicas::replica(&db, &[]).await,
    ];
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("http client");
    let held = crate::common::rest::Rest::new(http.clone(), &nodes[0].base, common::TEST_ADMIN_KEY)
        .posted("/v1/sandboxes", json!({"agent": "shared"}), 201)
        .await;
    let sandbox = held["sandbox_id"].as_str().expect("sandbox id").to_owned();
    let one = |base: String, name: &'static str, arguments: Value| {
        let (http, sandbox) = (http.clone(), sandbox.clone());
        async move {
            let r = http
                .post(format!("{base}/v1/tools/call"))
                .bearer_auth(common::TEST_ADMIN_KEY)
                .json(&json!({"name": name, "arguments": arguments, "sandbox_id": sandbox}))
                .send()
                .await
                .unwrap();
            let status = r.status();
            let out: Value = r.json().await.unwrap_or(Value::Null);
            assert!(status == 200 && out["isError"] != true, "{name}: {out}");
        }
    };
    eprintln!("throughput, calls/s (8 clients over n replicas as processes, 5 s each):");
    for (name, arguments) in [
        ("aegis.runtime.list", json!({})),
        ("cmd.run", json!({"command": "id", "args": ["-u"]})),
    ] {
        for node in &nodes {
            for _ in 0..10 {
                one(node.base.clone(), name, arguments.clone()).await;
            }
        }
        let mut line = format!("{name:<18}");
        for n in 1..=3 {
            let deadline = Instant::now() + Duration::from_secs(5);
            let clients: Vec<_> = (0..8)
                .map(|c| {
                    let base = nodes[c % n].base.clone();
                    let arguments = arguments.clone();
                    let one = &one;
                    async move {
                        let mut done = 0u64;
                        while Instant::now() < deadline {
                            one(base.clone(), name, arguments.clone()).await;
                            done += 1;
                        }
                        done
                    }
                })
                .collect();
            let total: u64 = futures_util::future::join_all(clients).await.iter().sum();
            line += &format!("  {n} replica(s): {:>6.0}", total as f64 / 5.0);
        }
        eprintln!("{line}");
    }
    for node in nodes {
        node.terminate().await;
    }
}

/// A busybox agent with the background-process tools, for the live tests.
fn live_agent(name: &str) -> String {
    AgentManifest::new(name)
        .instruction("Run things in the background.")
        .tools(&[
            "cmd.run",
            "fs.write",
            "proc.output",
            "proc.input",
            "proc.signal",
        ])
        .cmd(&["cat", "sleep", "sh", "sh -c"], 60, "")
        .filesystem(&["/workspace"], &["/workspace"])
        .yaml()
}

fn running_in(sb: &AgentSandbox, pattern: &str) -> bool {
    common::docker_lines(&["exec", &sb.container(), "ps", "-o", "args"])
        .iter()
        .any(|l| l.contains(pattern))
}

#[tokio::test]
async fn live_processes_streams_and_watches_are_served_through_a_replica_that_does_not_hold_them() {
    use std::time::Duration;
    let db = TestDb::create().await;
    let (a, b, made) = holding_on_a(&db, live_agent("live-shared")).await;
    let via_b = AgentSandbox::of(&b, &made.id);

    // A background process started through B runs in the sandbox A holds; its stdin, output
    // and end go through B.
    let started = via_b.start_echoer().await;
    let pid = started["pid"].as_u64().expect("a pid");
    assert_eq!(started["tag"], "echoer", "{started}");
    assert!(running_in(&made, "cat"), "cat runs in A's sandbox");
    let wrote = via_b
        .ok("proc.input", json!({"tag": "echoer", "data": "hello\n"}))
        .await;
    assert_eq!(wrote["written"], 6, "{wrote}");
    let first = via_b
        .ok("proc.output", json!({"pid": pid, "wait_ms": 5000}))
        .await;
    assert_eq!(first["stdout"], "hello\n", "{first}");
    assert!(first["ended"].is_null(), "{first}");
    // The holder serves the same process to its own callers (re-attached from its buffer).
    let on_a = made
        .ok("proc.output", json!({"tag": "echoer", "wait_ms": 5000}))
        .await;
    assert_eq!(on_a["stdout"], "hello\n", "{on_a}");
    let ended = via_b.end_echoer(pid).await;
    assert_eq!(ended["stdout_bytes"], 10, "{ended}");
    // B decided the start, so B followed it to its end and wrote the end's row, once.
    let mut end_rows = 0i64;
    for _ in 0..100 {
        end_rows = sqlx::query_scalar(
            "SELECT count(*) FROM audit_log WHERE reason_code = 'process_ended' \
             AND reason LIKE $1 AND outcome = 'ok'",
        )
        .bind(format!("background process {pid} (`cat`)%"))
        .fetch_one(&b.state.pool)
        .await
        .expect("audit rows");
        if end_rows > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(end_rows, 1, "B audited the end of the process it started");

    // A process started through A is re-attached through B (from A's buffer), and a signal
    // through B stops it.
    let long = made
        .ok(
            "cmd.run",
            json!({"command": "sh", "args": ["-c", "echo before; sleep 300"],
                "background": true, "tag": "long"}),
        )
        .await;
    let long_pid = long["pid"].as_u64().expect("a pid");
    let attached = via_b
        .ok("proc.output", json!({"tag": "long", "wait_ms": 5000}))
        .await;
    assert_eq!(attached["pid"], long_pid, "{attached}");
    assert_eq!(attached["stdout"], "before\n", "{attached}");
    via_b
        .ok("proc.signal", json!({"pid": long_pid, "signal": "kill"}))
        .await;
    let (_, ended) = via_b
        .read_to_end(json!({"pid": long_pid}), Duration::from_secs(20))
        .await;
    assert_eq!(ended["signal"], 9, "{ended}");
    assert!(
        !running_in(&made, "sleep 300"),
        "the killed process is gone"
    );
    // A process the holder does not have is refused through B as it is on A.
    via_b
        .tool_error("proc.output", json!({"pid": 99999}), "not_found")
        .await;

    // A streamed cmd.run on B's REST door: its first line arrives while the command still
    // waits for the marker, which is written through A only once it has.
    let mut events = crate::streaming::stream(
        &b,
        &via_b,
        crate::streaming::sh(
            "echo one; while [ ! -e /workspace/go ]; do sleep 0.1; done; echo two",
        ),
    )
    .await;
    events.started().await;
    let (name, one) = events.next().await.expect("the first output");
    assert_eq!((name.as_str(), &one["data"]), ("stdout", &json!("one\n")));
    made.ok(
        "fs.write",
        json!({"path": "/workspace/go", "content": "go"}),
    )
    .await;
    let mut rest = String::new();
    let result = loop {
        match events.next().await.expect("an event before the end") {
            (name, data) if name == "stdout" => rest.push_str(data["data"].as_str().unwrap()),
            (name, data) if name == "result" => break data,
            (name, data) => panic!("unexpected {name}: {data}"),
        }
    };
    assert_eq!(rest, "two\n");
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["structuredContent"]["exit_code"], 0, "{result}");
    assert_eq!(
        result["structuredContent"]["stdout"], "one\ntwo\n",
        "{result}"
    );

    // A watch opened through B sees a file written through A; dropping it ends it on A.
    let (id, mut watch) = watch_through(&b, &made, false).await;
    let dispatcher = b.state.sandboxes.dispatcher().expect("a dispatcher");
    assert_eq!(watch.path(), "/workspace");
    made.ok(
        "fs.write",
        json!({"path": "/workspace/watched.txt", "content": "x"}),
    )
    .await;
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match watch.next().await {
                Some(dispatcher::WatchEvent::Fs(e)) if e.path.ends_with("watched.txt") => return e,
                Some(dispatcher::WatchEvent::End { reason }) => panic!("ended: {reason}"),
                Some(_) => {}
                None => panic!("the watch ended"),
            }
        }
    })
    .await
    .expect("the change arrives through B");
    assert_eq!(seen.path, "/workspace/watched.txt");
    // A path outside the sandbox's read roots is refused by the holder's executor, as locally.
    let refused = dispatcher.watch_dir(id, "/etc", false).await;
    assert!(
        matches!(refused, Err(dispatcher::DispatchError::Refused { .. })),
        "{refused:?}"
    );
    drop(watch);
    // Dropped watches are removed on the holder: the sandbox's executor allows 8 at once, and
    // after 8 opened through B and dropped, a new one is admitted again (within a beat). The
    // watch dropped just above is removed on the holder as soon as it hears of it, which under
    // load may come after the next 8 are asked for: they are asked again until it has.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let eight = loop {
        let attempt = futures_util::future::join_all(
            (0..8).map(|_| dispatcher.watch_dir(id, "/workspace", false)),
        )
        .await;
        if attempt.iter().all(Result::is_ok) || std::time::Instant::now() > deadline {
            break attempt;
        }
        drop(attempt);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(eight.iter().all(Result::is_ok), "{eight:?}");
    let ninth = dispatcher.watch_dir(id, "/workspace", false).await;
    assert!(
        matches!(&ninth, Err(dispatcher::DispatchError::Refused { .. })),
        "the holder's limit holds through B: {ninth:?}"
    );
    drop(eight);
    let dropped = std::time::Instant::now();
    loop {
        match dispatcher.watch_dir(id, "/workspace", false).await {
            Ok(_) => break,
            Err(e) => assert!(
                dropped.elapsed() < Duration::from_secs(15),
                "the dropped watches were never removed on the holder: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A client leaving B's SSE stream kills its command on A, as it does locally.
    let mut events = crate::streaming::started_shell(
        &b,
        &via_b,
        "while true; do echo left-behind; sleep 0.2; done",
    )
    .await;
    events.next().await.expect("output");
    assert!(running_in(&made, "left-behind"));
    drop(events);
    let left = std::time::Instant::now();
    while running_in(&made, "left-behind") {
        assert!(
            left.elapsed() < Duration::from_secs(30),
            "the abandoned command still runs on the holder"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    audit_valid(&a).await;
    audit_valid(&b).await;
}

#[tokio::test]
async fn the_e2b_sdk_drives_processes_and_watches_through_a_replica_that_does_not_hold_them() {
    let db = TestDb::create().await;
    let (a, b) = two_replicas(&db).await;
    let key = a.create_key("e2b-cluster", "operator").await;
    // The control API (create, kill) on A, which holds the sandbox; envd's calls on B.
    let r = crate::e2b::run_sdk_through(&a, &b, "live", &key, &[]).await;
    let id = r["sandbox_id"].as_str().expect("a sandbox id");
    let holder: uuid::Uuid = sqlx::query_scalar("SELECT instance_id FROM sandboxes WHERE id = $1")
        .bind(uuid::Uuid::parse_str(id).expect("our sandbox ids are UUIDs"))
        .fetch_one(&a.state.pool)
        .await
        .expect("the sandbox's row");
    assert_eq!(holder, a.state.instance_id, "A held the sandbox B served");

    crate::e2b::assert_live_report(&r);
}

#[tokio::test]
async fn the_peer_listener_refuses_unsigned_and_replayed_subscriptions() {
    let db = TestDb::create().await;
    let (a, made, url) = holder_of_a_sandbox(&db, SUBSCRIBE_PATH).await;
    let http = reqwest::Client::new();
    let body = serde_json::to_vec(&ForwardedSubscription {
        sandbox: made.id.parse().expect("uuid"),
        deadline_ms: 10_000,
        open: Open::Watch {
            path: "/workspace".to_owned(),
            recursive: false,
        },
    })
    .expect("json");
    let post = |header: Option<String>| {
        let mut request = http.post(&url).body(body.clone());
        if let Some(header) = header {
            request = request.header(SIGNATURE_HEADER, header);
        }
        request.send()
    };

    let r = post(None).await.expect("peer listener answers");
    assert_eq!(r.status(), 401);
    let r = post(Some(signed_with_another_secret(&body)))
        .await
        .expect("answers");
    assert_eq!(r.status(), 401);

    // Signed, it opens the watch: the first frame says so.
    let good = signed(&body);
    let mut r = post(Some(good.clone())).await.expect("answers");
    assert_eq!(r.status(), 200);
    let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), r.chunk())
        .await
        .expect("the first frame comes at once")
        .expect("readable")
        .expect("a frame");
    let first: Value =
        serde_json::from_slice(chunk.split(|b| *b == b'\n').next().unwrap_or_default())
            .expect("a JSON frame");
    assert_eq!(first, json!({"frame": "watch", "path": "/workspace"}));
    drop(r);
    // The same request again is a replay.
    let r = post(Some(good)).await.expect("answers");
    assert_refused_saying(r, 401, "replayed").await;
    // The route is not on the callers' port, even with the admin key.
    let on_callers_port = a.admin(Method::POST, SUBSCRIBE_PATH).body(body.clone());
    assert_not_on_callers_port(on_callers_port, signed(&body)).await;
}

#[tokio::test]
async fn the_peer_listener_opens_a_port_only_for_a_signed_fresh_upgrade() {
    use orchestrator::cluster::{ForwardedPort, PORT_PATH, PORT_PROTOCOL, PORT_REQUEST_HEADER};
    let db = TestDb::create().await;
    let (a, made, url) = holder_of_a_sandbox(&db, PORT_PATH).await;
    let http = reqwest::Client::new();
    let asked = |port: u16| {
        serde_json::to_string(&ForwardedPort {
            sandbox: made.id.parse().expect("uuid"),
            port,
        })
        .expect("json")
    };
    let open = |asked: String, header: Option<String>, upgrade: bool| {
        let mut request = http.get(&url).header(PORT_REQUEST_HEADER, asked);
        if upgrade {
            request = request
                .header(reqwest::header::CONNECTION, "upgrade")
                .header(reqwest::header::UPGRADE, PORT_PROTOCOL);
        }
        if let Some(header) = header {
            request = request.header(SIGNATURE_HEADER, header);
        }
        request.send()
    };

    // Unsigned, signed with another secret, or signed for another port: refused, nothing opened.
    let r = open(asked(8000), None, true).await.expect("answers");
    assert_eq!(r.status(), 401);
    let wrong = signed_with_another_secret(asked(8000).as_bytes());
    let r = open(asked(8000), Some(wrong), true).await.expect("answers");
    assert_eq!(r.status(), 401);
    let other = signed(asked(9000).as_bytes());
    let r = open(asked(8000), Some(other), true).await.expect("answers");
    assert_eq!(r.status(), 401);
    // Signed but not an upgrade: refused, saying what it must be.
    let good = signed(asked(8000).as_bytes());
    let r = open(asked(8000), Some(good), false).await.expect("answers");
    assert_refused_saying(r, 400, PORT_PROTOCOL).await;
    // Signed, fresh, an upgrade: the holder opens the port; nothing listens there, which is
    // the executor's refusal, as a forwarded call's.
    let good = signed(asked(8000).as_bytes());
    let r = open(asked(8000), Some(good.clone()), true)
        .await
        .expect("answers");
    assert_eq!(r.status(), 422);
    let out: Value = r.json().await.expect("json");
    assert_eq!(out["error"], "refused", "{out}");
    assert_eq!(out["kind"], "not_found", "{out}");
    // The same request again is a replay.
    let r = open(asked(8000), Some(good), true).await.expect("answers");
    assert_eq!(r.status(), 401);
    // The route is not on the callers' port, even with the admin key.
    let on_callers_port = a
        .admin(Method::GET, PORT_PATH)
        .header(PORT_REQUEST_HEADER, asked(8000));
    assert_not_on_callers_port(on_callers_port, signed(asked(8000).as_bytes())).await;
}

#[tokio::test]
async fn a_holder_killed_mid_stream_ends_the_callers_stream_at_once_with_why() {
    use std::time::{Duration, Instant};
    let db = TestDb::create().await;
    // A is the binary, so that it can be killed outright (SIGKILL: no drain, no goodbye).
    let mut holder = common::binary::start_fresh(&db, || {
        vec![
            (
                "ORCHESTRATOR__CLUSTER__LISTEN".to_owned(),
                format!("127.0.0.1:{}", common::binary::free_port()),
            ),
            (
                "ORCHESTRATOR__CLUSTER__SECRET".to_owned(),
                SECRET.to_owned(),
            ),
        ]
    })
    .await;
    let b = TestApp::spawn_with(replica(&db, Some(SECRET))).await;
    let admin = |method: Method, path: &str| {
        reqwest::Client::new()
            .request(method, format!("{}{path}", holder.base))
            .bearer_auth(common::TEST_ADMIN_KEY)
    };
    let r = admin(Method::POST, "/v1/agents")
        .body(live_agent("killed-holder"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let r = admin(Method::POST, "/v1/sandboxes")
        .json(&json!({"agent": "killed-holder"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let made: Value = r.json().await.unwrap();
    let via_b = AgentSandbox::of(&b, made["sandbox_id"].as_str().unwrap());

    let mut events = crate::streaming::started_shell(
        &b,
        &via_b,
        "echo started; while true; do echo tick; sleep 0.2; done",
    )
    .await;
    let (name, data) = events.next().await.expect("output");
    assert_eq!(name, "stdout", "{data}");
    assert!(
        common::json::text(&data["data"]).starts_with("started\n"),
        "{data}"
    );

    holder.child.start_kill().expect("SIGKILL");
    let _ = holder.child.wait().await;
    let killed = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.next().await.expect("an event before the end") {
                (name, data) if name == "result" => return data,
                _ => {}
            }
        }
    })
    .await
    .expect("the caller hears of the holder's death within seconds, not never");
    assert!(killed.elapsed() < Duration::from_secs(5));
    assert_eq!(result["isError"], true, "{result}");
    let text = result.to_string();
    assert!(
        text.contains("stopped serving it") && text.contains("was not observed"),
        "{text}"
    );
    // Later calls through B fail with the holder named, at once.
    let (_, out) = via_b
        .call("cmd.run", json!({"command": "cat", "args": ["/dev/null"]}))
        .await;
    assert!(out.to_string().contains("held by instance"), "{out}");
}

#[tokio::test]
async fn a_holder_that_stops_ends_the_callers_streams_with_why_without_holding_its_drain() {
    use std::time::{Duration, Instant};
    let db = TestDb::create().await;
    let (a, b, made) = holding_on_a(&db, live_agent("stopping-holder")).await;
    let (id, mut watch) = watch_through(&b, &made, true).await;
    let dispatcher = b.state.sandboxes.dispatcher().expect("a dispatcher");
    let process = dispatcher
        .start_process(
            id,
            dispatcher::protocol::StartParams {
                argv: vec!["sleep".to_owned(), "300".to_owned()],
                cwd: None,
                env: Default::default(),
                tag: None,
                stdin: false,
                pty: None,
                timeout_ms: None,
                grace_ms: None,
                max_output_bytes: None,
                exec: Default::default(),
                user: Default::default(),
            },
        )
        .await
        .expect("a process through B");
    let mut process = process;

    // A stops (grace 5 s): the open subscriptions end at once rather than hold its drain.
    let stopping = Instant::now();
    a.stop().await.expect("A stops cleanly");
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "the peer listener's drain waited for the subscriptions: {:?}",
        stopping.elapsed()
    );
    let end = tokio::time::timeout(Duration::from_secs(5), process.wait_end())
        .await
        .expect("the process's handle ends at once")
        .expect("an end");
    let error = end.error.unwrap_or_default();
    assert!(
        error.contains("stopped serving it"),
        "the end says the holder stopped: {error}"
    );
    let reason = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match watch.next().await {
                Some(dispatcher::WatchEvent::End { reason }) => return reason,
                Some(_) => {}
                None => return "no end".to_owned(),
            }
        }
    })
    .await
    .expect("the watch ends at once");
    assert!(reason.contains("stopped serving it"), "{reason}");
}
