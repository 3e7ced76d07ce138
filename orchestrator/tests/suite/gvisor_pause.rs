//! Pause that keeps memory (issue 44): an E2B sandbox of the gVisor class is paused through
//! E2B's own Python SDK (its default keeps memory) while a background shell loop counts in a
//! shell variable and a Python REPL holds a value; its container is checkpointed by the engine
//! (`Dispatcher::checkpoint`) and, resumed by `connect()`, restored: both processes run on,
//! same pids, with their state. Paused and resumed twice more, it keeps its memory each time
//! (each resume starts a new container from the checkpoint, the old one removed); paused a
//! fourth time and killed, nothing of it is left on the engine (containers, checkpoints,
//! workspace holder, volume). A pause at the timeout (`autoPause`)
//! keeps memory too; `keep_memory=False`, at a pause or in the lifecycle, keeps the files only
//! (as a container-class sandbox's pause does, which `e2b.rs` covers).
//!
//! A gVisor sandbox forked through E2B's SDK (`Sandbox.fork(count=2)`) gives two forks that run
//! on from its processes and memory, each with a workspace of its own, the source running on
//! too, and nothing of the copy left on the engine.
//!
//! The engine is a runsc-enabled dockerd started beside the host's with `"experimental": true`
//! (`scripts/lib/second_engine.sh` with `AEGIS_ENGINE2_RUNSC=1`), under names of its own so it
//! never meets the one `gvisor.rs` starts; the host's dockerd config is never touched.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common;
use crate::common::rest::JsonAnswer;

use common::gvisor::{GvisorEngine, Place};
use common::{e2b_key, test_config, TestApp, TestDb};
use dispatcher::Isolation;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const DIR: &str = "/var/lib/aegis-gvisor-pause";

/// One test at a time on each of this module's engines.
static CHECKPOINTS_ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
static NO_CHECKPOINTS_ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The engine whose checkpoints work.
const CHECKPOINTS: Place = Place {
    dir: DIR,
    run: "/run/aegis-gvisor-pause",
    bridge: "aegis-gvpause",
    range: "10.215.0.0/16",
    tag: "aegis-gvisor-pause",
    experimental: true,
    alone: &CHECKPOINTS_ALONE,
};

/// One without the engine's experimental features, so without checkpoints.
const NO_CHECKPOINTS: Place = Place {
    dir: "/var/lib/aegis-gvisor-nockpt",
    run: "/run/aegis-gvisor-nockpt",
    bridge: "aegis-gvnockpt",
    range: "10.216.0.0/16",
    tag: "aegis-gvisor-nockpt",
    experimental: false,
    alone: &NO_CHECKPOINTS_ALONE,
};

/// This module's engine (`place`) with the `base` template's image.
fn engine(place: &'static Place) -> GvisorEngine {
    GvisorEngine::start_at(place, &["aegis-runtime/base:bookworm"])
}

/// The dispatcher sandbox behind an E2B id, and its state.
async fn current(app: &TestApp, e2b_id: &str) -> (String, String) {
    sqlx::query_as(
        "SELECT s.id::text, s.state FROM e2b_sandboxes e JOIN sandboxes s ON s.id = e.sandbox_id \
         WHERE e.e2b_id::text = $1",
    )
    .bind(e2b_id)
    .fetch_one(&app.state.pool)
    .await
    .unwrap()
}

/// A stepwise client started: its stdin, where the test says `go`, and its stderr's lines,
/// where it says `STEP <name>` ([`next_step`]); killed if the test ends first.
fn stepwise(
    command: &mut tokio::process::Command,
) -> (
    tokio::process::Child,
    tokio::process::ChildStdin,
    tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
) {
    let mut client = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs");
    let told = client.stdin.take().expect("stdin piped");
    let steps = BufReader::new(client.stderr.take().expect("stderr piped")).lines();
    (client, told, steps)
}

/// The client's next step (its other stderr lines kept in `said` for a failure's message).
async fn next_step(
    steps: &mut tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
    said: &mut Vec<String>,
) -> String {
    let wait = tokio::time::timeout(Duration::from_secs(600), async {
        while let Some(line) = steps.next_line().await.unwrap() {
            match line.strip_prefix("STEP ") {
                Some(step) => return step.to_owned(),
                None => said.push(line),
            }
        }
        String::new()
    });
    wait.await.unwrap_or_default()
}

/// A node of the gVisor class on `engine`'s runsc engine.
fn gvisor_node(config: &mut orchestrator::config::NodeConfig, engine: &GvisorEngine) {
    common::gvisor::place_sandboxes(config, Some(&engine.host), Isolation::Gvisor);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_sandbox_paused_through_e2b_keeps_its_processes_and_memory() {
    let engine = engine(&CHECKPOINTS);
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    gvisor_node(&mut config, &engine);
    // A grant: the first sandbox has a network, whose egress proxy stops at the pause and
    // starts again at the resume.
    config.e2b.egress.default = vec!["granted.test".to_owned()];
    let app = TestApp::spawn_with(config).await;
    let key = app.create_key("gvisor-pause", "operator").await;

    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/e2b_gvisor_pause_client.py"
    );
    let (client, mut told, mut steps) = stepwise(
        tokio::process::Command::new("python3")
            .arg(script)
            .env("E2B_API_URL", format!("{}/e2b", app.http_base))
            .env("E2B_SANDBOX_URL", format!("{}/e2b", app.http_base))
            .env("E2B_API_KEY", e2b_key(&key)),
    );
    let mut said = Vec::new();

    // Paused: the sandbox's container is saved and stopped, its workspace held beside it.
    let step = next_step(&mut steps, &mut said).await;
    assert_eq!(step, "paused", "the client did not get to its pause");
    let e2b_id: String = sqlx::query_scalar("SELECT e2b_id::text FROM e2b_sandboxes")
        .fetch_one(&app.state.pool)
        .await
        .unwrap();
    let (sandbox, state) = current(&app, &e2b_id).await;
    assert_eq!(state, "checkpointed");
    let network: String = app
        .one(
            "SELECT spec->>'network' FROM sandboxes WHERE id::text = $1",
            &sandbox,
        )
        .await;
    assert_eq!(network, "egress");
    let (keeps_memory, bytes, archive): (bool, i64, i32) = sqlx::query_as(
        "SELECT p.keeps_memory, p.bytes, length(p.archive) FROM e2b_snapshots p \
         JOIN e2b_sandboxes e ON e.paused_snapshot = p.id",
    )
    .fetch_one(&app.state.pool)
    .await
    .unwrap();
    assert!(
        keeps_memory && bytes > 0 && archive == 0,
        "{bytes} {archive}"
    );
    let detail: Value = app
        .http
        .get(format!("{}/e2b/sandboxes/{e2b_id}", app.http_base))
        .header("X-API-KEY", e2b_key(&key))
        .json_answer()
        .await;
    assert_eq!(detail["state"], "paused", "{detail}");
    assert_eq!(detail["pauseMode"], "full", "{detail}");
    let container = format!("aegis-sbx-{sandbox}");
    let holder = format!("aegis-hold-{sandbox}");
    let (_, listed) = engine.docker(&["ps", "-a", "--format", "{{.Names}} {{.State}}"]);
    assert!(
        listed.contains(&format!("{container} exited"))
            && listed.contains(&format!("{holder} running")),
        "{listed}"
    );
    let (code, checkpoints) = engine.docker(&["checkpoint", "ls", &container]);
    assert!(
        code == 0 && checkpoints.contains("aegis-pause"),
        "{checkpoints}"
    );
    let (_, container_id) = engine.docker(&["inspect", "-f", "{{.Id}}", &container]);
    let saved = format!("{DIR}/data/containers/{container_id}/checkpoints/aegis-pause");
    let mode = std::fs::metadata(&saved)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .unwrap_or_else(|e| panic!("the checkpoint is at {saved}: {e}"));
    assert_eq!(
        mode & 0o077,
        0,
        "only the engine reads the checkpoint: {mode:o}"
    );
    // The loop's count when it was paused, from the workspace the holder keeps.
    let (code, at_pause) = engine.docker(&["exec", &holder, "cat", "/home/user/counter"]);
    assert_eq!(code, 0, "the holder keeps the workspace");
    let at_pause: i64 = at_pause.parse().unwrap();
    told.write_all(b"go\n").await.unwrap();

    // Paused again after each resume (the client's report below says what ran on): checkpointed
    // each time, in the new container the previous resume started (the old one removed), its
    // workspace held; the fourth pause is followed by the kill.
    let mut containers = vec![container.clone()];
    for expected in ["paused_2", "paused_3", "paused_again"] {
        let step = next_step(&mut steps, &mut said).await;
        assert_eq!(
            step, expected,
            "the client did not get to {expected}: {said:?}"
        );
        let (state, now_in): (String, String) =
            sqlx::query_as("SELECT state, container_name FROM sandboxes WHERE id::text = $1")
                .bind(&sandbox)
                .fetch_one(&app.state.pool)
                .await
                .unwrap();
        assert_eq!(state, "checkpointed", "{expected}");
        assert!(!containers.contains(&now_in), "a new container: {now_in}");
        let mut listed = engine.containers(&sandbox);
        listed.sort();
        assert_eq!(
            listed,
            vec![format!("{holder} running"), format!("{now_in} exited")],
            "{expected}: only its checkpointed container and its holder"
        );
        let (code, checkpoints) = engine.docker(&["checkpoint", "ls", &now_in]);
        assert!(
            code == 0 && checkpoints.contains("aegis-pause"),
            "{expected}: {checkpoints}"
        );
        containers.push(now_in);
        told.write_all(b"go\n").await.unwrap();
    }

    // A sandbox holding 256 MiB, paused: what its checkpoint takes on the engine's disk
    // (measured and printed, not judged).
    let step = next_step(&mut steps, &mut said).await;
    assert_eq!(
        step, "big_paused",
        "the client did not get to the big pause: {said:?}"
    );
    let big: (String, i64) = sqlx::query_as(
        "SELECT s.container_name, p.bytes FROM e2b_sandboxes e \
         JOIN sandboxes s ON s.id = e.sandbox_id JOIN e2b_snapshots p ON p.id = e.paused_snapshot",
    )
    .fetch_one(&app.state.pool)
    .await
    .unwrap();
    let (_, big_id) = engine.docker(&["inspect", "-f", "{{.Id}}", &big.0]);
    let du = Command::new("du")
        .args([
            "-sb",
            &format!("{DIR}/data/containers/{big_id}/checkpoints"),
        ])
        .output()
        .expect("du runs");
    eprintln!(
        "256 MiB sandbox: memory counted {} bytes, checkpoint on disk {}",
        big.1,
        String::from_utf8_lossy(&du.stdout).trim()
    );
    told.write_all(b"go\n").await.unwrap();

    // The rest of its stderr (a failure's traceback), until it ends.
    let rest = next_step(&mut steps, &mut said).await;
    assert!(rest.is_empty(), "an unexpected step {rest}");
    let out = tokio::time::timeout(Duration::from_secs(600), client.wait_with_output())
        .await
        .expect("the client ends")
        .unwrap();
    assert!(
        out.status.success(),
        "the E2B gVisor pause scenario failed (needs the e2b package, which scripts/test.sh \
         installs): {said:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    eprintln!("paused at {at_pause}, {bytes} bytes of memory; {report}");
    let paused = report["state_paused"].as_str().unwrap_or_default();
    assert!(paused.to_lowercase().contains("paused"), "{report}");
    assert_eq!(report["running_after_connect"], true, "{report}");
    // The same two processes, and the loop counted on from where it was paused (a loop
    // started again would count from 1; a filesystem-only pause leaves no process).
    let pids_before = report["pids"].as_array().unwrap();
    let pids_after = report["pids_after"].as_array().unwrap();
    for pid in pids_before {
        assert!(pids_after.contains(pid), "{report}");
    }
    let resumed = report["counter_at_resume"].as_i64().unwrap();
    let later = report["counter_later"].as_i64().unwrap();
    assert!(
        resumed >= at_pause,
        "the loop counted on from {at_pause}: {report}"
    );
    assert!(later > resumed, "the loop runs after the resume: {report}");
    // The REPL's list, made before the pause, answered by the same process after it.
    assert_eq!(report["repl_before"], "42", "{report}");
    assert_eq!(report["repl_after"], "42 True", "{report}");
    assert_eq!(report["command_after"], "again", "{report}");
    assert_eq!(report["killed"], true, "{report}");
    // The second and third pauses kept memory too: no files-only reason, the same processes,
    // the loop counting on from where it was, the REPL's values.
    let cycles = report["cycles"].as_array().unwrap();
    assert_eq!(cycles.len(), 2, "{report}");
    for cycle in cycles {
        assert_eq!(cycle["files_only_because"], Value::Null, "{report}");
        for pid in pids_before {
            assert!(cycle["pids"].as_array().unwrap().contains(pid), "{report}");
        }
        let at = cycle["counter_at_resume"].as_i64().unwrap();
        assert!(
            at >= cycle["counter_before"].as_i64().unwrap(),
            "the loop counted on: {report}"
        );
        assert!(
            cycle["counter_later"].as_i64().unwrap() > at,
            "the loop runs: {report}"
        );
        assert_eq!(cycle["repl"], "42 True", "{report}");
    }
    // autoPause keeps memory; keep_memory=False (at a pause, or in the lifecycle) the files.
    let auto = report["auto_pause_log"].as_str().unwrap_or_default();
    assert!(auto.contains("with its memory"), "{report}");
    assert_eq!(report["auto_repl_after"], "42", "{report}");
    assert_eq!(
        report["files_pause_pids_after"],
        serde_json::json!([]),
        "{report}"
    );
    assert_eq!(report["files_pause_file_kept"], "42", "{report}");
    let cold = report["cold_pause_log"].as_str().unwrap_or_default();
    assert!(cold.contains("files were saved"), "{report}");
    assert_eq!(report["cold_pids_after"], serde_json::json!([]), "{report}");
    assert_eq!(report["cold_file_kept"], "42", "{report}");
    assert_eq!(report["big_same"], true, "{report}");

    // Killed while paused: its containers (and the checkpoints inside the engine's data root),
    // its holder, its workspace volume and its network are gone, and so are the rows.
    assert!(
        engine.containers(&sandbox).is_empty(),
        "{:?}",
        engine.containers(&sandbox)
    );
    assert!(!std::path::Path::new(&saved).exists(), "{saved} is left");
    assert_eq!(
        checkpoint_files(),
        Vec::<String>::new(),
        "no checkpoint is left"
    );
    let (_, all) = engine.docker(&["ps", "-a", "--format", "{{.Names}}"]);
    assert!(
        !all.contains("aegis-hold-") && !all.contains("aegis-fcopy-"),
        "{all}"
    );
    // Measured, not judged: containerd tasks this engine keeps of containers it removed (runsc
    // 2022-12 leaves a container checkpointed after a restore "paused" in its own state, so
    // containerd keeps its task and shim until the engine restarts).
    let tasks = Command::new("ctr")
        .args([
            "-a",
            &format!("{}/exec/containerd/containerd.sock", engine.place.run),
            "-n",
            "moby",
            "tasks",
            "ls",
            "-q",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
        .unwrap_or_default();
    eprintln!("containerd tasks left on the engine after the kills: {tasks}");
    let (_, volumes) = engine.docker(&["volume", "ls", "-q"]);
    assert!(!volumes.contains(&sandbox), "{volumes}");
    let (_, networks) = engine.docker(&["network", "ls", "--format", "{{.Name}}"]);
    assert!(!networks.contains(&sandbox), "{networks}");
    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM e2b_sandboxes) + (SELECT count(*) FROM e2b_snapshots) \
         + (SELECT count(*) FROM sandboxes WHERE state NOT IN ('destroyed', 'destroying') \
            AND owner_kind <> 'pool')",
    )
    .fetch_one(&app.state.pool)
    .await
    .unwrap();
    assert_eq!(left, 0, "no row of it is left");
    app.stop().await.expect("the node stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_paused_on_one_replica_resumes_on_another_beside_the_same_engine() {
    use common::replicas::{in_process, SECRET};
    let engine = engine(&CHECKPOINTS);
    let db = TestDb::create().await;
    let mut a = in_process(&db, Some(SECRET));
    gvisor_node(&mut a, &engine);
    let mut b = in_process(&db, Some(SECRET));
    gvisor_node(&mut b, &engine);
    // A grant, so that its sandbox has a network and an egress proxy (on the replica that
    // serves it) to move with it.
    for config in [&mut a, &mut b] {
        config.e2b.egress.default = vec!["granted.test".to_owned()];
    }
    let (a, b) = (TestApp::spawn_with(a).await, TestApp::spawn_with(b).await);
    let key = a.create_key("gvisor-moved", "operator").await;
    let (client, mut told, mut steps) = stepwise(
        tokio::process::Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/python/e2b_gvisor_pause_client.py"
            ))
            .arg("replicas")
            .env("E2B_URL_A", format!("{}/e2b", a.http_base))
            .env("E2B_URL_B", format!("{}/e2b", b.http_base))
            .env("E2B_API_URL", format!("{}/e2b", a.http_base))
            .env("E2B_API_KEY", e2b_key(&key)),
    );
    let mut said = Vec::new();
    let step = next_step(&mut steps, &mut said).await;
    assert_eq!(
        step, "resumed_on_b",
        "the client did not resume through B: {said:?}"
    );
    // B restored it and holds it now.
    let holder: uuid::Uuid = sqlx::query_scalar(
        "SELECT s.instance_id FROM e2b_sandboxes e JOIN sandboxes s ON s.id = e.sandbox_id",
    )
    .fetch_one(&a.state.pool)
    .await
    .unwrap();
    let b_id = b.state.sandboxes.dispatcher().unwrap().instance_id();
    assert_eq!(holder, b_id, "the replica that resumed it holds it");
    let network: String = sqlx::query_scalar(
        "SELECT s.spec->>'network' FROM e2b_sandboxes e JOIN sandboxes s ON s.id = e.sandbox_id",
    )
    .fetch_one(&a.state.pool)
    .await
    .unwrap();
    assert_eq!(
        network, "egress",
        "it has its network (and so an egress proxy to move)"
    );
    told.write_all(b"go\n").await.unwrap();
    let rest = next_step(&mut steps, &mut said).await;
    assert!(rest.is_empty(), "an unexpected step {rest}");
    let out = tokio::time::timeout(Duration::from_secs(600), client.wait_with_output())
        .await
        .expect("the client ends")
        .unwrap();
    assert!(out.status.success(), "the scenario failed: {said:?}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    assert_eq!(report["pids_after"], serde_json::json!([true]), "{report}");
    assert_eq!(report["repl_after"], "42", "{report}");
    b.stop().await.expect("B stops");
    a.stop().await.expect("A stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_without_checkpoints_pauses_a_gvisor_sandbox_with_its_files_and_says_why() {
    let engine = engine(&NO_CHECKPOINTS);
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    gvisor_node(&mut config, &engine);
    let app = TestApp::spawn_with(config).await;
    let key = app.create_key("gvisor-files", "operator").await;
    let out = tokio::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/e2b_gvisor_pause_client.py"
        ))
        .arg("fallback")
        .env("E2B_API_URL", format!("{}/e2b", app.http_base))
        .env("E2B_SANDBOX_URL", format!("{}/e2b", app.http_base))
        .env("E2B_API_KEY", e2b_key(&key))
        .output()
        .await
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "the scenario failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    // The caller kept memory (the SDK's default), the engine could not: the files were kept,
    // the log says why, and nothing of a checkpoint is left.
    assert_eq!(report["pids_after"], serde_json::json!([]), "{report}");
    assert_eq!(report["file_kept"], "42", "{report}");
    let why = report["files_only_because"].as_str().unwrap_or_default();
    assert!(why.contains("\"experimental\": true"), "{report}");
    // So does a fork, and its answer and the source's log say so.
    assert_eq!(report["fork_kept"], "filesystem", "{report}");
    assert_eq!(report["fork_file_kept"], "42", "{report}");
    assert_eq!(report["fork_pids"], serde_json::json!([]), "{report}");
    let why = report["fork_files_only_because"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("\"experimental\": true"), "{report}");
    let (_, all) = engine.docker(&["ps", "-a", "--format", "{{.Names}}"]);
    assert!(!all.contains("aegis-hold-"), "{all}");
    app.stop().await.expect("the node stops");
}

/// The checkpoint files left in the engine's data root (`containers/*/checkpoints/*`).
fn checkpoint_files() -> Vec<String> {
    let out = Command::new("find")
        .args([
            &format!("{DIR}/data/containers"),
            "-path",
            "*/checkpoints/*",
        ])
        .output()
        .expect("find runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_sandbox_forked_through_e2b_runs_on_in_each_fork_with_its_memory() {
    let engine = engine(&CHECKPOINTS);
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    gvisor_node(&mut config, &engine);
    // A grant: the source has a network, and so each fork its own, with its own proxy.
    config.e2b.egress.default = vec!["granted.test".to_owned()];
    let app = TestApp::spawn_with(config).await;
    let key = app.create_key("gvisor-fork", "operator").await;
    let other = app.create_key("gvisor-fork-other", "operator").await;
    let (client, mut told, mut steps) = stepwise(
        tokio::process::Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/python/e2b_gvisor_fork_client.py"
            ))
            .env("E2B_API_URL", format!("{}/e2b", app.http_base))
            .env("E2B_SANDBOX_URL", format!("{}/e2b", app.http_base))
            .env("E2B_API_KEY", e2b_key(&key))
            .env("E2B_OTHER_API_KEY", e2b_key(&other)),
    );
    let mut said = Vec::new();

    // Forked: three sandboxes of their own (ids, tokens, containers, networks), nothing of
    // the copy left (no checkpoint file, holder or copy helper).
    let step = next_step(&mut steps, &mut said).await;
    assert_eq!(
        step, "forked",
        "the client did not get to its fork: {said:?}"
    );
    let rows: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT e.e2b_id::text, e.envd_access_token, s.id::text, s.state FROM e2b_sandboxes e \
         JOIN sandboxes s ON s.id = e.sandbox_id",
    )
    .fetch_all(&app.state.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 3, "{rows:?}");
    let distinct = |f: fn(&(String, String, String, String)) -> &String| {
        rows.iter()
            .map(f)
            .collect::<std::collections::HashSet<_>>()
            .len()
    };
    assert_eq!(distinct(|r| &r.0), 3, "{rows:?}");
    assert_eq!(distinct(|r| &r.1), 3, "{rows:?}");
    assert_eq!(distinct(|r| &r.2), 3, "{rows:?}");
    assert!(rows.iter().all(|r| r.3 == "running"), "{rows:?}");
    let listed = engine.containers("aegis-");
    for (_, _, sandbox, _) in &rows {
        // The source runs on in the new container its restore started.
        let container: String = app
            .one(
                "SELECT container_name FROM sandboxes WHERE id::text = $1",
                sandbox,
            )
            .await;
        assert!(
            listed.contains(&format!("{container} running"))
                && listed
                    .iter()
                    .filter(|c| c.contains(sandbox.as_str()))
                    .count()
                    == 1,
            "{listed:?}"
        );
    }
    assert!(
        !listed
            .iter()
            .any(|c| c.starts_with("aegis-hold-") || c.starts_with("aegis-fcopy-")),
        "{listed:?}"
    );
    assert_eq!(
        checkpoint_files(),
        Vec::<String>::new(),
        "no checkpoint is left"
    );
    let (_, networks) = engine.docker(&["network", "ls", "--format", "{{.Name}}"]);
    for (_, _, sandbox, _) in &rows {
        assert!(networks.contains(sandbox.as_str()), "{networks}");
    }
    let said_memory: i64 = app
        .count("SELECT count(*) FROM e2b_sandbox_logs WHERE message LIKE '%with its memory%'")
        .await;
    assert_eq!(said_memory, 3, "the source's log and each fork's say so");
    let sandboxes: Vec<String> = rows.iter().map(|r| r.2.clone()).collect();
    told.write_all(b"go\n").await.unwrap();

    // The forks killed: nothing of theirs on the engine; the source runs on.
    let step = next_step(&mut steps, &mut said).await;
    assert_eq!(
        step, "forks_killed",
        "the client did not kill its forks: {said:?}"
    );
    let source: String = sqlx::query_scalar("SELECT sandbox_id::text FROM e2b_sandboxes")
        .fetch_one(&app.state.pool)
        .await
        .unwrap();
    // A kill removes the container off the caller's path (`retire`): wait for it.
    let forks: Vec<&String> = sandboxes.iter().filter(|f| **f != source).collect();
    let waited = std::time::Instant::now();
    let left = || {
        let (_, volumes) = engine.docker(&["volume", "ls", "-q"]);
        let (_, networks) = engine.docker(&["network", "ls", "--format", "{{.Name}}"]);
        let left = forks.iter().any(|f| {
            !engine.containers(f).is_empty()
                || volumes.contains(f.as_str())
                || networks.contains(f.as_str())
        });
        (left, volumes, networks)
    };
    while left().0 && waited.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, volumes, networks) = left();
    for fork in forks {
        assert!(
            engine.containers(fork).is_empty(),
            "{:?}",
            engine.containers(fork)
        );
        assert!(!volumes.contains(fork.as_str()), "{volumes}");
        assert!(!networks.contains(fork.as_str()), "{networks}");
    }
    assert_eq!(
        checkpoint_files(),
        Vec::<String>::new(),
        "no checkpoint is left"
    );
    told.write_all(b"go\n").await.unwrap();

    let rest = next_step(&mut steps, &mut said).await;
    assert!(rest.is_empty(), "an unexpected step {rest}");
    let out = tokio::time::timeout(Duration::from_secs(600), client.wait_with_output())
        .await
        .expect("the client ends")
        .unwrap();
    assert!(
        out.status.success(),
        "the E2B gVisor fork scenario failed: {said:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    eprintln!("{report}");
    let before = report["counter_before_fork"].as_i64().unwrap();
    for name in ["source", "fork0", "fork1"] {
        let seen = &report[name];
        // The same processes (a filesystem fork has none), the loop counting on from where
        // the source was (a loop started again would count from 1), the REPL's value.
        for pid in report["pids"].as_array().unwrap() {
            assert!(
                seen["pids"].as_array().unwrap().contains(pid),
                "{name}: {report}"
            );
        }
        let counted = seen["counter"].as_i64().unwrap();
        assert!(
            counted >= before,
            "{name} counted on from {before}: {report}"
        );
        assert!(
            seen["counter_later"].as_i64().unwrap() > counted,
            "{name}'s loop runs: {report}"
        );
        assert_eq!(seen["repl"], "42", "{name}: {report}");
    }
    assert_eq!(
        report["has_fork0_file"],
        serde_json::json!({"source": false, "fork0": true, "fork1": false}),
        "{report}"
    );
    assert_eq!(report["command_in_fork1"], "forked", "{report}");
    assert_eq!(report["other_key_fork"], 404, "{report}");
    // The source, restored by the fork into a new container, is forked again with its memory.
    assert_eq!(report["second_fork_kept"], "memory", "{report}");
    assert_eq!(
        report["second_fork_files_only_because"],
        Value::Null,
        "{report}"
    );
    assert_eq!(report["source_after_kills"], true, "{report}");
    app.stop().await.expect("the node stops");
}
