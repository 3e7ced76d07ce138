//! Takeover and fencing (issue 23): replicas as real processes on one database, with a short
//! `dead_after` (3 s) and lease (2 s) (`common/replicas.rs`).
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
//! - A rolling restart (`shutdown.sandboxes: keep`): each of three replicas in turn is stopped
//!   with SIGTERM and started again while clients call every sandbox through every replica in
//!   turn; no call fails (the sandboxes of the stopping replica are handed over to the caller's
//!   replica at the call), and what was written before is still there.
//! - Past one machine, all at once: three replicas on one database and two Docker engines (the
//!   second started by the test, `scripts/lib/second_engine.sh`; it fails when that cannot
//!   start), sandboxes on both and a SEAL session used through every replica in turn; one
//!   replica killed with `kill -9` mid-calls (every call answered or refused at once, the
//!   sandbox adopted by the replica on its engine), one stopped with SIGSTOP past `dead_after`
//!   then woken (it acts on nothing it lost), then a rolling restart of all three with no
//!   failed call; at the end the files are there, the audit chain is valid and nothing is left
//!   on either engine.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::binary::Node;
use common::docker_lines;
use common::replicas::{
    audit_valid, call, call_ok, client, deploy, destroy_leaving_nothing, destroyed, holder,
    make_sandbox, ok_result, read_file, replica, sandbox_on, seal_round, signal, write_file,
    SecondEngine, KEEP,
};
use common::{TestDb, TEST_ADMIN_KEY};
use serde_json::json;

/// When instance `id` was marked in `column` (`fenced_at`, `stopped_at`), if it is.
async fn instance_mark(
    pool: &sqlx::PgPool,
    column: &str,
    id: uuid::Uuid,
) -> Option<chrono::DateTime<chrono::Utc>> {
    let sql = format!("SELECT {column} FROM node_instances WHERE id = $1");
    common::one(pool, &sql, id).await
}

/// Instances not recorded as stopped.
async fn running_instances(pool: &sqlx::PgPool) -> usize {
    sqlx::query_scalar::<_, i64>("SELECT count(*) FROM node_instances WHERE stopped_at IS NULL")
        .fetch_one(pool)
        .await
        .expect("instances") as usize
}

#[tokio::test]
async fn kill_9_of_the_holder_mid_calls_the_survivor_adopts_and_the_session_goes_on() {
    let db = TestDb::create().await;
    let pool = db.pool().await;
    let mut a = replica(&db, &[]).await;
    let b = replica(&db, &[]).await;
    let id = sandbox_on(&a).await;
    let (a_id, epoch, _) = holder(&pool, &id).await;
    let label = format!("label=org.aegis.sandbox={id}");

    // Written through B (forwarded to A, which holds the stream).
    write_file(
        &b.base,
        &id,
        "/workspace/before.txt",
        "written before the crash",
    )
    .await;

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
    assert_eq!(
        call_ok(
            &b.base,
            &id,
            "cmd.run",
            json!({"command": "cat /workspace/before.txt"}),
        )
        .await["stdout"],
        json!("written before the crash")
    );
    write_file(&b.base, &id, "/workspace/after.txt", "after").await;
    assert_eq!(docker_lines(&["ps", "-q", "--filter", &label]).len(), 1);

    // The audit chain both replicas wrote (A's last intent rows included) is valid.
    audit_valid(&b.base).await;

    // Destroyed through B: nothing of it is left.
    destroy_leaving_nothing(&b.base, &id, &[]).await;
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
    let a = replica(&db, &env).await;
    let b = replica(&db, &env).await;
    let id = sandbox_on(&a).await;
    let (a_id, epoch, _) = holder(&pool, &id).await;
    write_file(&a.base, &id, "/workspace/kept.txt", "kept").await;

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
    assert_eq!(
        read_file(&b.base, &id, "/workspace/kept.txt").await,
        json!("kept")
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
    let sent = common::metric(
        &metrics,
        "aegis_forwarded_calls_total{direction=\"sent\",outcome=\"ok\"}",
    );
    assert!(sent >= 1.0, "A forwarded the call: {metrics}");
    // B wrote the file: the executor B holds serves it.
    assert_eq!(
        read_file(&b.base, &id, "/workspace/woken.txt").await,
        json!("through the woken replica")
    );
    // A rejoined: not fenced any more, alive again, holding nothing.
    let fenced = instance_mark(&pool, "fenced_at", a_id).await;
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
    destroyed(&b.base, &id).await;
    b.terminate().await;
    let _ = std::fs::remove_dir_all(&channels);
}

/// A client of the rolling restart: calls every sandbox through the replicas in `rotation`, in
/// turn, until `stop`; (calls made, what failed). A call holds the rotation while it runs, so
/// a replica taken out of it (a load balancer's drain) has no call of these clients pending.
async fn keep_calling(
    which: usize,
    ids: Vec<String>,
    rotation: Arc<tokio::sync::RwLock<Vec<String>>>,
    stop: Arc<AtomicBool>,
) -> (usize, Vec<String>) {
    let mut made = 0usize;
    let mut failed = Vec::new();
    let mut turn = which;
    while !stop.load(Ordering::SeqCst) {
        for (i, id) in ids.iter().enumerate() {
            turn += 1;
            let bases = rotation.read().await;
            let base = bases[turn % bases.len()].clone();
            let expected = format!("before {i}");
            // Each sandbox gets each kind of call in turn.
            let (name, arguments) = match (made / ids.len() + i) % 3 {
                0 => (
                    "fs.write",
                    json!({"path": format!("/workspace/c{which}-{made}.txt"), "content": "x"}),
                ),
                1 => ("fs.read", json!({"path": "/workspace/before.txt"})),
                _ => (
                    "cmd.run",
                    json!({"command": "cat", "args": ["/workspace/before.txt"]}),
                ),
            };
            let answer = call(&base, id, name, arguments).await;
            drop(bases);
            let served = match (name, ok_result(&answer)) {
                (_, None) => false,
                ("fs.read", Some(r)) => r["content"] == expected.as_str(),
                ("cmd.run", Some(r)) => r["stdout"] == expected.as_str(),
                (_, Some(_)) => true,
            };
            if !served {
                failed.push(format!("{name} into {id} through {base}: {answer:?}"));
            }
            made += 1;
        }
    }
    (made, failed)
}

#[tokio::test]
async fn a_rolling_restart_fails_no_call() {
    let db = TestDb::create().await;
    let pool = db.pool().await;
    let env = [KEEP];
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(replica(&db, &env).await);
    }
    deploy(&nodes[0]).await;
    let mut ids = Vec::new();
    for node in &nodes {
        ids.push(make_sandbox(node).await);
    }
    let mut first = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        call_ok(
            &nodes[i].base,
            id,
            "fs.write",
            json!({"path": "/workspace/before.txt", "content": format!("before {i}")}),
        )
        .await;
        first.push(holder(&pool, id).await);
    }

    // Each replica in turn: out of the rotation, SIGTERM (a clean exit, its sandboxes kept),
    // a new one started and put in the rotation.
    let mut nodes: Vec<_> = nodes
        .into_iter()
        .map(|node| (node, vec![(KEEP.0, KEEP.1.to_owned())]))
        .collect();
    let failed = roll(&db, &mut nodes, &ids).await;
    assert!(
        failed.is_empty(),
        "{} failed calls: {failed:#?}",
        failed.len()
    );
    let nodes: Vec<Node> = nodes.into_iter().map(|(node, _)| node).collect();

    // Every sandbox is held by a replica that runs, one epoch or more later, and what was
    // written before the restart is still there, through every replica.
    for (i, id) in ids.iter().enumerate() {
        let (now, epoch, state) = holder(&pool, id).await;
        assert_eq!(state, "running");
        assert!(
            epoch > first[i].1,
            "handed over: {epoch} after {}",
            first[i].1
        );
        let stopped = instance_mark(&pool, "stopped_at", now).await;
        assert!(stopped.is_none(), "held by a running replica");
    }
    read_everywhere(&nodes.iter().collect::<Vec<_>>(), &ids).await;
    audit_valid(&nodes[0].base).await;
    for id in &ids {
        destroy_leaving_nothing(&nodes[0].base, id, &[]).await;
    }
    for node in nodes {
        node.terminate().await;
    }
}

/// Writes `before {i}` into `/workspace/before.txt` of the `i`th sandbox, through `base`.
async fn write_before(base: &str, ids: &[String]) {
    for (i, id) in ids.iter().enumerate() {
        call_ok(
            base,
            id,
            "fs.write",
            json!({"path": "/workspace/before.txt", "content": format!("before {i}")}),
        )
        .await;
    }
}

/// A SEAL session (attested through `node` against the `ops` context, made here), continued
/// through any replica.
async fn seal_session(node: &Node) -> aegis_cli::seal_client::SavedSession {
    use aegis_cli::seal_client::{SealClient, Transport};
    let r = client()
        .post(format!("{}/v1/security-contexts", node.base))
        .bearer_auth(TEST_ADMIN_KEY)
        .json(&common::replicas::ops_context())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let mut seal = SealClient::new(Transport::Http(node.base.clone())).expect("client");
    let attested = seal.attest("test-worker-1", "ops").await.expect("attests");
    assert_eq!(attested["status"], "success", "{attested}");
    seal.save().expect("a session to continue")
}

/// The session used through each of `nodes` in turn, the file of the n-th named `{tag}{n}`
/// (`seal_round`): a write may be refused while a killed holder's sandbox is taken over, and
/// the session goes on within 15 s.
async fn session_round(
    saved: &aegis_cli::seal_client::SavedSession,
    nodes: &[&Node],
    tag: &str,
    written: &mut Vec<String>,
) {
    let through: Vec<(String, String)> = nodes
        .iter()
        .enumerate()
        .map(|(n, node)| (format!("{tag}{n}"), node.base.clone()))
        .collect();
    seal_round(saved, &through, written, Some(Duration::from_secs(15))).await;
}

/// Reads each sandbox's `before.txt` through every replica in turn: all served.
async fn read_everywhere(nodes: &[&Node], ids: &[String]) {
    for (i, id) in ids.iter().enumerate() {
        for node in nodes {
            assert_eq!(
                read_file(&node.base, id, "/workspace/before.txt").await,
                json!(format!("before {i}")),
                "{id} through {}",
                node.base
            );
        }
    }
}

/// Replicas as `(node, its environment)`, restarted one after the other (SIGTERM, a clean
/// exit, a new one with the same environment) while clients call `ids` through the ones in
/// the rotation; what failed.
async fn roll(
    db: &TestDb,
    nodes: &mut Vec<(Node, Vec<(&'static str, String)>)>,
    ids: &[String],
) -> Vec<String> {
    let rotation = Arc::new(tokio::sync::RwLock::new(
        nodes
            .iter()
            .map(|(n, _)| n.base.clone())
            .collect::<Vec<_>>(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..2)
        .map(|which| {
            tokio::spawn(keep_calling(
                which,
                ids.to_vec(),
                rotation.clone(),
                stop.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for _ in 0..nodes.len() {
        let (old, env) = nodes.remove(0);
        rotation.write().await.retain(|base| base != &old.base);
        old.terminate().await;
        let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let new = replica(db, &pairs).await;
        rotation.write().await.push(new.base.clone());
        nodes.push((new, env));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let mut made = 0;
    let mut failed = Vec::new();
    for client in clients {
        let (n, f) = client.await.expect("client task");
        made += n;
        failed.extend(f);
    }
    eprintln!(
        "{made} calls through a rolling restart of {} replicas",
        nodes.len()
    );
    assert!(made >= 30, "the clients kept calling: {made}");
    failed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_one_machine_a_kill_a_stall_and_a_rolling_restart_on_two_engines() {
    let second = SecondEngine::start_or_fail();
    let db = TestDb::create().await;
    let pool = db.pool().await;
    let host_env = || vec![(KEEP.0, KEEP.1.to_owned())];
    let other_env = || {
        vec![
            (KEEP.0, KEEP.1.to_owned()),
            ("ORCHESTRATOR__DOCKER__HOST", second.host.clone()),
        ]
    };
    let start = |env: Vec<(&'static str, String)>| {
        let db = &db;
        async move {
            let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let node = replica(db, &pairs).await;
            (node, env)
        }
    };
    let (mut a, a_env) = start(host_env()).await;
    let (b, b_env) = start(host_env()).await;
    let (c, c_env) = start(other_env()).await;
    deploy(&a).await;
    // One sandbox made through each: A's and B's on the host's engine, C's on the second.
    let ids = vec![
        make_sandbox(&a).await,
        make_sandbox(&b).await,
        make_sandbox(&c).await,
    ];
    let engines: Vec<Option<String>> = {
        let mut v = Vec::new();
        for id in &ids {
            v.push(
                common::one(
                    &pool,
                    "SELECT engine FROM sandboxes WHERE id = $1::uuid",
                    id,
                )
                .await,
            );
        }
        v
    };
    assert_eq!(engines[0], engines[1], "A and B share the host's engine");
    assert_ne!(
        engines[0], engines[2],
        "C's sandbox is on the second engine"
    );
    assert_eq!(
        second
            .lines(&[
                "ps",
                "-q",
                "--filter",
                &format!("label=org.aegis.sandbox={}", ids[2])
            ])
            .len(),
        1
    );
    write_before(&b.base, &ids).await;
    read_everywhere(&[&a, &b, &c], &ids).await;
    // A SEAL session whose sandbox A makes (its first call goes through A), used through all.
    let saved = seal_session(&a).await;
    let mut written = Vec::new();
    session_round(&saved, &[&a, &b, &c], "start", &mut written).await;

    // kill -9 of A while B and C call every sandbox: each call is answered or refused at once;
    // B (on A's engine) adopts A's sandbox, and it is served through both again.
    let (a_id, a_epoch, _) = holder(&pool, &ids[0]).await;
    let killer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        signal(&a, "-KILL");
        let _ = a.child.wait().await;
        Instant::now()
    });
    let started = Instant::now();
    let mut served_again = 0;
    let mut refused = 0;
    while served_again < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "A's sandbox never served again"
        );
        for (i, id) in ids.iter().enumerate() {
            for node in [&b, &c] {
                let asked = Instant::now();
                let read = call(
                    &node.base,
                    id,
                    "fs.read",
                    json!({"path": "/workspace/before.txt"}),
                )
                .await;
                let took = asked.elapsed();
                assert!(
                    took < Duration::from_secs(5),
                    "a call took {took:?}: {read:?}"
                );
                match ok_result(&read) {
                    Some(r) => {
                        assert_eq!(r["content"], format!("before {i}"));
                        if i == 0 && killer.is_finished() && refused > 0 {
                            served_again += 1;
                        }
                    }
                    None => {
                        assert_eq!(i, 0, "only A's sandbox is refused: {read:?}");
                        let text = read.1.to_string();
                        assert!(
                            text.contains("instance"),
                            "the error names the holder: {text}"
                        );
                        refused += 1;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let killed_at = killer.await.expect("killer");
    eprintln!(
        "A's sandbox served again {:?} after kill -9",
        killed_at.elapsed()
    );
    let (now, epoch, state) = holder(&pool, &ids[0]).await;
    assert_ne!(now, a_id);
    assert!(epoch > a_epoch && state == "running");
    let (b_id, ..) = holder(&pool, &ids[1]).await;
    assert_eq!(
        now, b_id,
        "adopted by B, the replica on its engine, not by C"
    );
    // The session goes on through the survivors (its sandbox adopted by B too).
    session_round(&saved, &[&b, &c], "killed", &mut written).await;

    // A replacement for A; then B stopped past dead_after: the new A fences it and adopts
    // both sandboxes B held; woken, B acts on nothing it lost and forwards.
    let (a2, a2_env) = start(a_env).await;
    let held_by_b = [ids[0].clone(), ids[1].clone()];
    let before: Vec<_> = {
        let mut v = Vec::new();
        for id in &held_by_b {
            v.push(holder(&pool, id).await);
        }
        v
    };
    signal(&b, "-STOP");
    let stalled = Instant::now();
    let mut after = Vec::new();
    for (id, (_, epoch, _)) in held_by_b.iter().zip(&before) {
        loop {
            let (now, now_epoch, state) = holder(&pool, id).await;
            if now != b_id {
                assert_eq!((now_epoch, state.as_str()), (epoch + 1, "running"));
                after.push((now, now_epoch));
                break;
            }
            assert!(
                stalled.elapsed() < Duration::from_secs(20),
                "B's sandboxes never taken over"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    read_everywhere(&[&a2, &c], &ids).await;
    session_round(&saved, &[&a2, &c], "stalled", &mut written).await;
    signal(&b, "-CONT");
    let woke = Instant::now();
    loop {
        let asked = Instant::now();
        let read = call(
            &b.base,
            &ids[1],
            "fs.read",
            json!({"path": "/workspace/before.txt"}),
        )
        .await;
        assert!(asked.elapsed() < Duration::from_secs(5), "{read:?}");
        if ok_result(&read).is_some() {
            break;
        }
        let text = read.1.to_string();
        assert!(
            text.contains("does not hold") || text.contains("held by"),
            "{text}"
        );
        assert!(
            woke.elapsed() < Duration::from_secs(15),
            "the woken replica never forwarded"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (id, was) in held_by_b.iter().zip(&after) {
        let (now, epoch, _) = holder(&pool, id).await;
        assert_eq!(
            (now, epoch),
            *was,
            "the woken replica changed nothing of {id}"
        );
    }

    // A rolling restart of all three (C comes back on the second engine): no call fails.
    let mut nodes = vec![(a2, a2_env), (b, b_env), (c, c_env)];
    let failed = roll(&db, &mut nodes, &ids).await;
    assert!(
        failed.is_empty(),
        "{} failed calls: {failed:#?}",
        failed.len()
    );
    let now: Vec<&Node> = nodes.iter().map(|(n, _)| n).collect();
    read_everywhere(&now, &ids).await;
    session_round(&saved, &now, "rolled", &mut written).await;
    audit_valid(&now[0].base).await;
    let other = ["-H", second.host.as_str()];
    for (i, id) in ids.iter().enumerate() {
        let docker: &[&str] = if i == 2 { &other } else { &[] };
        destroy_leaving_nothing(&now[i % 3].base, id, docker).await;
    }
    // The session's sandbox, destroyed through a replica, leaves nothing either.
    let session_sandbox: String = sqlx::query_scalar(
        "SELECT id::text FROM sandboxes WHERE owner_kind = 'session' AND state = 'running'",
    )
    .fetch_one(&pool)
    .await
    .expect("the session's one sandbox");
    destroy_leaving_nothing(&now[0].base, &session_sandbox, &[]).await;
    for (node, _) in nodes {
        node.terminate().await;
    }
    drop(second);
}
