//! Sandbox lifecycle against a real Docker engine, a real PostgreSQL and the real executor.
//!
//! Needs `DATABASE_URL` (admin URL; a database is created per test), `SANDBOX_EXECUTOR_BIN` (the
//! static executor) and the image `aegis-runtime/busybox:1`; see `common` for the exact commands.
//! Every await is bounded; every test removes what it created, also when it fails.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::CreateContainerOptionsBuilder;
use common::{
    adoptable, called, created, eventually, finish, label, ok, read, run_for, spec, within, write,
    TestEnv, IMAGE,
};
use dispatcher::protocol::{Op, ReadResult, RunResult, WriteResult};
use dispatcher::{
    labels, DispatchError, Limits, Owner, OwnerKind, SandboxId, SandboxSpec, SandboxState,
};
use uuid::Uuid;

fn run(argv: &[&str]) -> Op {
    run_for(argv, 10_000)
}

/// Waits until a process named `name` runs in the sandbox (the request reached the executor).
async fn wait_for_process(d: &dispatcher::Dispatcher, id: SandboxId, name: &str) {
    eventually(20, &format!("{name} running in the sandbox"), || async {
        match d.call(id, run(&["pidof", name])).await {
            Ok(r) => r
                .into_result()
                .ok()
                .and_then(|v| serde_json::from_value::<RunResult>(v).ok())
                .is_some_and(|r| r.exit_code == Some(0)),
            Err(_) => false,
        }
    })
    .await;
}

/// A new sandbox of `owner` with a call of `sleep 60` running in it once this returns; (the
/// sandbox, the call's task).
async fn sleeping_in_a_new_sandbox(
    d: &dispatcher::Dispatcher,
    owner: &str,
) -> (
    SandboxId,
    tokio::task::JoinHandle<Result<dispatcher::protocol::Response, DispatchError>>,
) {
    let id = created(d, spec(owner)).await;
    let call = {
        let d = d.clone();
        tokio::spawn(async move { d.call(id, run_for(&["sleep", "60"], 120_000)).await })
    };
    wait_for_process(d, id, "sleep").await;
    (id, call)
}

/// A new instance and its dispatcher keeping a warm pool of `size` sandboxes of the test
/// image; (the instance, its dispatcher).
async fn with_pool(env: &TestEnv, size: usize) -> (Uuid, dispatcher::Dispatcher) {
    let (instance, d, _) = env
        .started_with(|c| c.pool = BTreeMap::from([(IMAGE.to_owned(), size)]))
        .await;
    (instance, d)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_call_destroy_leaves_nothing_behind() {
    let (env, instance, d) = TestEnv::with_dispatcher().await;

    let started = Instant::now();
    let id = created(&d, spec("exec-1")).await;
    eprintln!("create+start+ready: {:?}", started.elapsed());

    let info = within(10, "get", d.get(id)).await.expect("get");
    assert_eq!(info.state, SandboxState::Running);
    assert_eq!(info.instance_id, instance);
    assert_eq!(info.owner, Owner::new(OwnerKind::Execution, "exec-1"));
    assert_eq!(info.image, IMAGE);
    let listed = within(10, "list", d.list()).await.expect("list");
    assert!(listed.iter().any(|s| s.id == id));

    let sandbox_label = label(labels::SANDBOX, id);
    let container = env.containers_with(&[&sandbox_label]).await;
    assert_eq!(container, vec![format!("aegis-sbx-{id}")]);
    assert_eq!(
        env.volumes_with(&[&sandbox_label]).await,
        vec![format!("aegis-ws-{id}")]
    );

    let pong = within(10, "ping", d.call(id, Op::Ping))
        .await
        .expect("ping");
    assert!(pong.into_result().is_ok());

    let written: WriteResult = called(
        &d,
        id,
        10,
        "fs.write",
        write("notes/a.txt", "hello sandbox\n"),
    )
    .await;
    assert_eq!(written.bytes_written, 14);
    assert!(written.created);
    let back: ReadResult = called(&d, id, 10, "fs.read", read("/workspace/notes/a.txt")).await;
    assert_eq!(back.content, "hello sandbox\n");

    let ran: RunResult = called(&d, id, 20, "cmd.run", run(&["cat", "notes/a.txt"])).await;
    assert_eq!(ran.exit_code, Some(0));
    assert_eq!(ran.stdout, "hello sandbox\n");
    let who: RunResult = called(&d, id, 20, "cmd.run id", run(&["id", "-u"])).await;
    assert_eq!(
        who.stdout.trim(),
        "65534",
        "commands run as the sandbox user"
    );

    // An executor-side refusal is a normal response, not a dispatcher error.
    let refused = within(10, "fs.read outside", d.call(id, read("/etc/passwd")))
        .await
        .expect("call itself works");
    let body = refused
        .into_result()
        .expect_err("reading outside the roots is refused");
    assert_eq!(body.kind.as_str(), "path_not_allowed");

    common::destroyed(&d, id).await;
    env.assert_nothing_with(&sandbox_label).await;
    let (state, reason) = env.row_state(id).await;
    assert_eq!(state, "destroyed");
    assert_eq!(reason.as_deref(), Some("destroyed by owner"));

    // Idempotent, and calls afterwards say the sandbox is gone.
    within(30, "destroy again", d.destroy(id))
        .await
        .expect("second destroy is a no-op");
    match within(10, "call after destroy", d.call(id, Op::Ping)).await {
        Err(DispatchError::SandboxGone { id: gone, .. }) => assert_eq!(gone, id),
        other => panic!("expected SandboxGone, got {other:?}"),
    }
    match within(10, "destroy unknown", d.destroy(SandboxId::new())).await {
        Err(DispatchError::SandboxNotFound { .. }) => {}
        other => panic!("expected SandboxNotFound, got {other:?}"),
    }
    let all = env
        .containers_with(&[
            &label(labels::INSTANCE, instance),
            &label(labels::MANAGED, true),
        ])
        .await;
    assert!(all.is_empty(), "nothing of this instance is left: {all:?}");
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retire_answers_once_the_sandbox_is_unreachable_and_shutdown_waits_for_its_removal() {
    let (env, _, d) = TestEnv::with_dispatcher().await;
    let first = created(&d, spec("retire-1")).await;
    let second = created(&d, spec("retire-2")).await;
    // A command that would outlive a slow destruction.
    let sleeping = d.clone();
    let pending = tokio::spawn(async move {
        sleeping
            .call(first, run_for(&["sleep", "30"], 60_000))
            .await
    });
    wait_for_process(&d, first, "sleep").await;

    within(30, "retire", d.retire(first)).await.expect("retire");
    // Unreachable at once: its row says so, calls are refused, the running one is cut.
    let (state, _) = env.row_state(first).await;
    assert!(state == "destroying" || state == "destroyed", "{state}");
    match within(10, "call after retire", d.call(first, Op::Ping)).await {
        Err(DispatchError::SandboxGone { .. } | DispatchError::SandboxNotFound { .. }) => {}
        other => panic!("expected the sandbox gone, got {other:?}"),
    }
    assert!(
        within(40, "the cut call", pending)
            .await
            .expect("joined")
            .is_err(),
        "the command in flight did not survive"
    );
    // Then gone from Docker, its row destroyed.
    let first_label = label(labels::SANDBOX, first);
    eventually(30, "the retired sandbox removed", || async {
        env.containers_with(&[&first_label]).await.is_empty()
            && env.volumes_with(&[&first_label]).await.is_empty()
            && env.row_state(first).await.0 == "destroyed"
    })
    .await;

    // Retired right before shutdown: shutdown finishes the removal, nothing is left.
    within(30, "retire", d.retire(second))
        .await
        .expect("retire");
    d.shutdown().await;
    let second_label = label(labels::SANDBOX, second);
    assert!(env.containers_with(&[&second_label]).await.is_empty());
    assert!(env.volumes_with(&[&second_label]).await.is_empty());
    assert_eq!(env.row_state(second).await.0, "destroyed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn container_has_every_hardening_setting() {
    let (env, _, d) = TestEnv::with_dispatcher().await;
    let mut s = spec("exec-hard");
    s.limits = Limits {
        memory_bytes: 300 * 1024 * 1024,
        nano_cpus: 500_000_000,
        pids: 64,
        tmpfs_bytes: 16 * 1024 * 1024,
        workspace_bytes: 32 * 1024 * 1024,
    };
    // Asking above the ceiling is lowered, not refused.
    s.limits.pids = 1_000_000;
    let id = created(&d, s).await;
    let inspect = env.inspect(id).await;
    let host = inspect.host_config.expect("host config");
    let config = inspect.config.expect("config");

    let strip = |caps: Option<Vec<String>>| -> HashSet<String> {
        caps.unwrap_or_default()
            .into_iter()
            .map(|c| c.trim_start_matches("CAP_").to_owned())
            .collect()
    };
    assert_eq!(
        strip(host.cap_drop.clone()),
        HashSet::from(["ALL".to_owned()])
    );
    assert_eq!(
        strip(host.cap_add.clone()),
        ["SETUID", "SETGID", "KILL", "CHOWN"]
            .iter()
            .map(|s| s.to_string())
            .collect::<HashSet<_>>()
    );
    assert_eq!(host.readonly_rootfs, Some(true));
    assert!(host
        .security_opt
        .clone()
        .unwrap_or_default()
        .iter()
        .any(|o| o == "no-new-privileges" || o == "no-new-privileges:true"));
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    assert!(
        host.binds.clone().unwrap_or_default().is_empty(),
        "no binds"
    );
    assert_eq!(host.privileged, Some(false));
    assert_eq!(host.pids_limit, Some(512), "pids clamped to the ceiling");
    // The workspace tmpfs is charged to the container: memory + workspace, no swap.
    assert_eq!(host.memory, Some((300 + 32) * 1024 * 1024));
    assert_eq!(host.memory_swap, Some((300 + 32) * 1024 * 1024), "no swap");
    let ulimits: Vec<(String, i64)> = host
        .ulimits
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|u| (u.name.unwrap_or_default(), u.hard.unwrap_or(-1)))
        .collect();
    for name in ["core", "nofile", "nproc"] {
        assert!(
            ulimits.iter().any(|(n, _)| n == name),
            "{name} in {ulimits:?}"
        );
    }
    assert_eq!(
        config.healthcheck.as_ref().and_then(|h| h.test.clone()),
        Some(vec!["NONE".to_owned()]),
        "the image's HEALTHCHECK is disabled"
    );
    let workspace = within(
        10,
        "volume",
        env.docker.inspect_volume(&format!("aegis-ws-{id}")),
    )
    .await
    .expect("inspect volume");
    let options = workspace.options;
    assert_eq!(options.get("type").map(String::as_str), Some("tmpfs"));
    let o = options.get("o").cloned().unwrap_or_default();
    for flag in ["size=33554432", "noexec", "nosuid", "nodev"] {
        assert!(o.contains(flag), "workspace options {o} lack {flag}");
    }
    assert_eq!(host.nano_cpus, Some(500_000_000));
    assert_eq!(host.init, Some(false));
    assert_eq!(host.ipc_mode.as_deref(), Some("private"));
    assert_eq!(host.auto_remove, Some(false));
    assert!(host.devices.clone().unwrap_or_default().is_empty());
    let tmp = host.tmpfs.clone().unwrap_or_default();
    let tmp = tmp.get("/tmp").expect("tmpfs /tmp");
    for flag in ["noexec", "nosuid", "nodev", "size=16777216"] {
        assert!(tmp.contains(flag), "/tmp options {tmp} lack {flag}");
    }
    assert_eq!(config.user.as_deref(), Some("0:0"));
    assert_eq!(config.tty, Some(false));
    assert_eq!(config.open_stdin, Some(true));
    assert_eq!(config.stdin_once, Some(false));
    assert_eq!(
        config.entrypoint,
        Some(vec!["/opt/sandbox/sandbox-executor".to_owned()])
    );
    let mounts = inspect.mounts.unwrap_or_default();
    // With the socket channel on, one bind more: this sandbox's own channel directory.
    let channel = env
        .config()
        .channel_dir
        .map(|base| base.join(id.to_string()));
    assert_eq!(
        mounts.len(),
        2 + usize::from(channel.is_some()),
        "only the executor and workspace volumes (and the channel directory): {mounts:?}"
    );
    for m in &mounts {
        let source = m.source.clone().unwrap_or_default();
        assert!(!source.contains("docker.sock"));
        match m.destination.as_deref() {
            Some("/opt/sandbox") => assert_eq!(m.rw, Some(false), "executor volume is read-only"),
            Some("/workspace") => assert_eq!(m.rw, Some(true)),
            Some("/run/aegis-channel") => {
                assert_eq!(m.typ.as_deref(), Some("bind"), "{m:?}");
                assert_eq!(
                    Some(std::path::PathBuf::from(&source)),
                    channel,
                    "only this sandbox's channel directory is bound: {m:?}"
                );
                continue;
            }
            other => panic!("unexpected mount at {other:?}"),
        }
        assert_eq!(m.typ.as_deref(), Some("volume"), "no bind mounts: {m:?}");
    }

    // And from inside: unprivileged, capability-free, read-only root, no socket, no network.
    let status: RunResult = called(&d, id, 20, "status", run(&["cat", "/proc/self/status"])).await;
    for cap in ["CapPrm", "CapEff", "CapAmb"] {
        let line = status
            .stdout
            .lines()
            .find(|l| l.starts_with(cap))
            .unwrap_or_else(|| panic!("{cap} missing"));
        assert!(line.ends_with("0000000000000000"), "{line}");
    }
    let touch: RunResult = called(&d, id, 20, "touch", run(&["touch", "/planted"])).await;
    assert_ne!(touch.exit_code, Some(0), "root filesystem is read-only");
    let sock: RunResult = called(&d, id, 20, "ls sock", run(&["ls", "/var/run/docker.sock"])).await;
    assert_ne!(sock.exit_code, Some(0), "no Docker socket");
    let ifaces: RunResult = called(&d, id, 20, "ifaces", run(&["cat", "/proc/net/dev"])).await;
    let names: Vec<&str> = ifaces
        .stdout
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(names, vec!["lo"], "only loopback");

    finish(&d, &[id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn network_only_when_granted() {
    let (env, _, d) = TestEnv::with_dispatcher().await;
    let mut s = spec("exec-net");
    s.network = dispatcher::NetworkMode::Bridge;
    let id = created(&d, s).await;
    let inspect = env.inspect(id).await;
    let host = inspect.host_config.expect("host config");
    assert_eq!(host.network_mode.as_deref(), Some("bridge"));
    // Everything else stays hardened.
    assert_eq!(host.readonly_rootfs, Some(true));
    assert_eq!(host.privileged, Some(false));
    let ifaces: RunResult = called(&d, id, 20, "ifaces", run(&["cat", "/proc/net/dev"])).await;
    assert!(ifaces.stdout.contains("eth0"), "{}", ifaces.stdout);
    finish(&d, &[id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_calls_share_one_stream() {
    let (_env, _, d) = TestEnv::with_dispatcher().await;
    let id = created(&d, spec("exec-many")).await;

    let mut tasks = Vec::new();
    for i in 0..150u32 {
        let d = d.clone();
        tasks.push(tokio::spawn(async move {
            match i % 3 {
                0 => {
                    let r = d.call(id, Op::Ping).await.expect("ping");
                    assert!(r.into_result().is_ok());
                }
                1 => {
                    let path = format!("f/{i}.txt");
                    let body = format!("content {i}");
                    let _: WriteResult = ok(d.call(id, write(&path, &body)).await.expect("write"));
                    let back: ReadResult = ok(d.call(id, read(&path)).await.expect("read"));
                    assert_eq!(back.content, body, "response matched to its own request");
                }
                _ => {
                    let word = format!("word-{i}");
                    let r: RunResult = ok(d.call(id, run(&["echo", &word])).await.expect("run"));
                    assert_eq!(r.stdout.trim(), word);
                }
            }
        }));
    }
    within(120, "150 concurrent calls", async {
        for t in tasks {
            t.await.expect("call task panicked");
        }
    })
    .await;
    finish(&d, &[id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_container_fails_pending_calls_with_sandbox_gone() {
    let (env, _, d) = TestEnv::with_dispatcher().await;
    // Once the command runs, kill the container behind the dispatcher's back.
    let (id, pending) = sleeping_in_a_new_sandbox(&d, "exec-kill").await;
    within(
        20,
        "docker kill",
        env.docker.kill_container(&format!("aegis-sbx-{id}"), None),
    )
    .await
    .expect("kill");
    let result = within(15, "pending call to fail", pending)
        .await
        .expect("task");
    match result {
        Err(DispatchError::SandboxGone { id: gone, reason }) => {
            assert_eq!(gone, id);
            eprintln!("pending call failed with: {reason}");
        }
        other => panic!("expected SandboxGone, got {other:?}"),
    }
    match within(10, "later call", d.call(id, Op::Ping)).await {
        Err(DispatchError::SandboxGone { .. }) => {}
        other => panic!("expected SandboxGone for a later call, got {other:?}"),
    }
    eventually(15, "row marked failed", || async {
        env.row_state(id).await.0 == "failed"
    })
    .await;
    // The reaper collects the dead sandbox's container and volume.
    let report = within(30, "reap", d.reap()).await.expect("reap");
    assert!(report.containers_removed >= 1, "{report:?}");
    let sandbox_label = label(labels::SANDBOX, id);
    assert!(env.containers_with(&[&sandbox_label]).await.is_empty());
    assert!(env.volumes_with(&[&sandbox_label]).await.is_empty());
    let (state, reason) = env.row_state(id).await;
    assert_eq!(state, "destroyed");
    assert!(
        reason.unwrap_or_default().contains("output ended"),
        "failure reason kept"
    );
    d.shutdown().await;
}

/// Creates a labelled container outside the dispatcher, as a crashed instance would leave it.
async fn fake_container(
    env: &TestEnv,
    name: String,
    labels: HashMap<String, String>,
    cmd: &[&str],
) -> String {
    let body = ContainerCreateBody {
        image: Some(IMAGE.to_owned()),
        cmd: Some(cmd.iter().map(|s| (*s).to_owned()).collect()),
        labels: Some(labels),
        host_config: Some(HostConfig {
            network_mode: Some("none".to_owned()),
            ..Default::default()
        }),
        ..Default::default()
    };
    within(
        20,
        "create fake container",
        env.docker.create_container(
            Some(CreateContainerOptionsBuilder::new().name(&name).build()),
            body,
        ),
    )
    .await
    .expect("create fake container");
    env.extra_containers.lock().unwrap().push(name.clone());
    name
}

/// Starts the fake container `name` (within 20 s).
async fn start_fake(env: &TestEnv, name: &str) {
    within(
        20,
        "start fake container",
        env.docker.start_container(name, None),
    )
    .await
    .unwrap_or_else(|e| panic!("start {name}: {e}"));
}

async fn insert_row(env: &TestEnv, id: Uuid, instance: Uuid, state: &str) {
    sqlx::query(
        "INSERT INTO sandboxes (id, instance_id, image, owner_kind, owner_id, state, \
         container_name, volume_name, spec) VALUES ($1, $2, $3, 'execution', 'x', $4, $5, $6, '{}')",
    )
    .bind(id)
    .bind(instance)
    .bind(IMAGE)
    .bind(state)
    .bind(format!("aegis-sbx-{id}"))
    .bind(format!("aegis-ws-{id}"))
    .execute(&env.pg)
    .await
    .expect("insert sandbox row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reaper_removes_orphans_whatever_their_status_and_nothing_else() {
    let (env, instance, d) = TestEnv::with_dispatcher().await;
    let scope = d.scope().to_owned();
    let live = created(&d, spec("exec-live")).await;

    // Two dead instances: one whose heartbeat stopped (kill -9), one that stopped cleanly.
    let silent = env.new_instance().await;
    env.silence(silent).await;
    let stopped = env.new_instance().await;
    env.on_instance(
        "UPDATE node_instances SET stopped_at = now() WHERE id = $1",
        stopped,
    )
    .await;
    let managed = |instance: Uuid, sandbox: Uuid, scope: &str| {
        HashMap::from([
            (labels::MANAGED.to_owned(), "true".to_owned()),
            (labels::SCOPE.to_owned(), scope.to_owned()),
            (labels::INSTANCE.to_owned(), instance.to_string()),
            (labels::SANDBOX.to_owned(), sandbox.to_string()),
        ])
    };
    let tag = Uuid::new_v4().simple().to_string();
    let fake = |letter: &str, labels, cmd: &'static [&'static str]| {
        fake_container(&env, format!("t-{letter}-{tag}"), labels, cmd)
    };

    // (a) created but never started, row running under the silent instance.
    let a = Uuid::new_v4();
    insert_row(&env, a, silent, "running").await;
    let a_name = fake("a", managed(silent, a, &scope), &["sleep", "300"]).await;
    // (b) exited, no row at all.
    let b = Uuid::new_v4();
    let b_name = fake("b", managed(silent, b, &scope), &["true"]).await;
    start_fake(&env, &b_name).await;
    eventually(20, "b exited", || async {
        env.docker
            .inspect_container(&b_name, None)
            .await
            .ok()
            .and_then(|i| i.state)
            .and_then(|s| s.running)
            == Some(false)
    })
    .await;
    // (c) running, row under the cleanly stopped instance.
    let c = Uuid::new_v4();
    insert_row(&env, c, stopped, "running").await;
    let c_name = fake("c", managed(stopped, c, &scope), &["sleep", "300"]).await;
    start_fake(&env, &c_name).await;
    // (d) a volume whose row is destroyed.
    let dvol = Uuid::new_v4();
    insert_row(&env, dvol, instance, "destroyed").await;
    let d_volume = format!("t-d-{tag}");
    within(
        20,
        "create volume d",
        env.docker
            .create_volume(bollard::models::VolumeCreateRequest {
                name: Some(d_volume.clone()),
                labels: Some(managed(instance, dvol, &scope)),
                ..Default::default()
            }),
    )
    .await
    .unwrap();
    // (e) unlabelled, running: never touched.
    let e_name = fake("e", HashMap::new(), &["sleep", "300"]).await;
    start_fake(&env, &e_name).await;
    // (f) managed, dead instance, but another database's scope: never touched.
    let f_name = fake(
        "f",
        managed(silent, Uuid::new_v4(), "another-db/0000"),
        &["sleep", "300"],
    )
    .await;
    // (g) a row of the silent instance with nothing left in Docker: closed.
    let g = Uuid::new_v4();
    insert_row(&env, g, silent, "running").await;
    // (h) another database of this cluster that was dropped: nobody else can collect it.
    // (i) another database of this cluster that still exists: its own reaper's business.
    let cluster: i64 = sqlx::query_scalar("SELECT system_identifier FROM pg_control_system()")
        .fetch_one(&env.pg)
        .await
        .unwrap();
    let of_database = |db: &str| {
        let mut l = managed(silent, Uuid::new_v4(), &format!("{db}/{}", Uuid::new_v4()));
        l.insert(labels::DB_CLUSTER.to_owned(), cluster.to_string());
        l.insert(labels::DB_NAME.to_owned(), db.to_owned());
        l
    };
    let h_name = fake(
        "h",
        of_database(&format!("test_dropped_{tag}")),
        &["sleep", "300"],
    )
    .await;
    let i_name = fake("i", of_database("postgres"), &["sleep", "300"]).await;

    let report = within(60, "reap", d.reap()).await.expect("reap");
    eprintln!("{report:?}");
    for (name, kept, what) in [
        (&a_name, false, "never-started orphan removed"),
        (&b_name, false, "exited orphan removed"),
        (&c_name, false, "running orphan removed"),
        (&e_name, true, "unlabelled container left alone"),
        (&f_name, true, "other scope left alone"),
        (&h_name, false, "object of a dropped database removed"),
        (&i_name, true, "object of an existing database left alone"),
    ] {
        assert_eq!(env.container_exists(name).await, kept, "{what}");
    }
    assert!(
        !env.volume_exists(&d_volume).await,
        "volume of a destroyed sandbox removed"
    );
    // (h) may have been collected by a parallel test's reaper: same cluster, same rule.
    assert!(
        report.containers_removed >= 3 && report.volumes_removed >= 1,
        "{report:?}"
    );
    for id in [a, c, g] {
        let (state, reason) = env.row_state(SandboxId(id)).await;
        assert_eq!(state, "destroyed", "row {id}");
        assert!(reason.unwrap_or_default().starts_with("reaped"), "row {id}");
    }
    // The live sandbox of this instance is untouched and still answers.
    let pong = within(10, "ping live", d.call(live, Op::Ping))
        .await
        .expect("live sandbox answers");
    assert!(pong.into_result().is_ok());
    finish(&d, &[live]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_after_a_crash_leaves_no_container_or_volume() {
    let (env, crashed, first) = TestEnv::with_dispatcher().await;
    let (id, in_flight) = sleeping_in_a_new_sandbox(&first, "exec-crash").await;
    // The crash: the instance vanishes without destroying anything, and its heartbeat stops.
    drop(first);
    env.silence(crashed).await;

    let (_, second) = env.started().await;
    let of_crashed = label(labels::INSTANCE, crashed);
    env.assert_nothing_with(&of_crashed).await;
    let (state, reason) = env.row_state(id).await;
    assert_eq!(state, "destroyed");
    assert!(reason.unwrap_or_default().contains("dead"));
    // The call that was running when the instance died ends, it does not hang.
    match within(15, "in-flight call", in_flight).await.expect("task") {
        Err(DispatchError::SandboxGone { .. }) => {}
        other => panic!("expected SandboxGone, got {other:?}"),
    }
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adopt_reattaches_to_a_running_sandbox_of_a_previous_instance() {
    let env = TestEnv::new().await;
    let (previous, first, config) = env.started_with(adoptable).await;
    let id = created(&first, spec("exec-adopt")).await;
    let _: WriteResult = called(&first, id, 10, "write", write("kept.txt", "still here")).await;
    drop(first);

    let next = env.new_instance().await;
    let second = env.start(next, config).await;
    // Not attached here until adopted.
    match within(10, "call before adopt", second.call(id, Op::Ping)).await {
        Err(DispatchError::SandboxNotFound {
            attached_elsewhere: true,
            ..
        }) => {}
        other => panic!("expected SandboxNotFound(attached elsewhere), got {other:?}"),
    }
    let report = common::adopted(&second, previous).await;
    assert_eq!(report.adopted, vec![id]);
    assert!(report.destroyed.is_empty());
    let back: ReadResult = called(&second, id, 10, "read", read("kept.txt")).await;
    assert_eq!(back.content, "still here");
    let ran: RunResult = called(&second, id, 20, "run", run(&["echo", "adopted"])).await;
    assert_eq!(ran.stdout.trim(), "adopted");
    assert_eq!(
        within(10, "get", second.get(id)).await.unwrap().instance_id,
        next
    );
    // A second adoption finds nothing left to take.
    let again = within(30, "adopt again", second.adopt(previous))
        .await
        .expect("adopt");
    assert!(again.adopted.is_empty());

    within(30, "destroy", second.destroy(id))
        .await
        .expect("destroy");
    assert!(env
        .containers_with(&[&label(labels::SANDBOX, id)])
        .await
        .is_empty());
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn warm_pool_hands_out_distinct_sandboxes_refills_and_misses_still_work() {
    let env = TestEnv::new().await;
    let (instance, d) = with_pool(&env, 2).await;
    let full =
        |d: dispatcher::Dispatcher| async move { d.pool_sizes().get(IMAGE).copied() == Some(2) };
    eventually(90, "pool warmed to 2", || full(d.clone())).await;

    let pool_members: HashSet<SandboxId> = within(10, "list", d.list())
        .await
        .unwrap()
        .into_iter()
        .filter(|s| s.owner.kind == OwnerKind::Pool)
        .map(|s| s.id)
        .collect();
    assert_eq!(pool_members.len(), 2);
    // A sandbox still waiting in the pool has no owner: it serves nobody.
    let idle = *pool_members.iter().next().unwrap();
    match within(10, "call idle pool sandbox", d.call(idle, Op::Ping)).await {
        Err(DispatchError::SandboxNotFound { .. }) => {}
        other => panic!("expected SandboxNotFound for an idle pool sandbox, got {other:?}"),
    }

    let mut timings = Vec::new();
    let mut got = Vec::new();
    for owner in ["exec-p1", "exec-p2"] {
        let started = Instant::now();
        let id = within(30, "acquire", d.acquire(spec(owner)))
            .await
            .expect("acquire");
        timings.push(started.elapsed());
        assert!(pool_members.contains(&id), "served from the pool");
        let info = d.get(id).await.unwrap();
        assert_eq!(
            info.owner,
            Owner::new(OwnerKind::Execution, owner),
            "row re-owned"
        );
        got.push(id);
    }
    eprintln!("pool acquire times: {timings:?}");
    assert_ne!(got[0], got[1], "each sandbox handed to one owner");
    for id in &got {
        let pong = within(10, "ping", d.call(*id, Op::Ping))
            .await
            .expect("ping");
        assert!(pong.into_result().is_ok());
    }
    eventually(90, "pool refilled", || full(d.clone())).await;

    // A spec the pool cannot serve exactly: created on the spot.
    let mut other = spec("exec-miss");
    other.limits.pids = 100;
    let miss = within(60, "acquire miss", d.acquire(other))
        .await
        .expect("pool miss");
    assert!(!pool_members.contains(&miss));
    let pong = within(10, "ping miss", d.call(miss, Op::Ping))
        .await
        .expect("ping");
    assert!(pong.into_result().is_ok());

    // Owners are done: destroyed, never returned to the pool.
    for id in got.iter().chain([&miss]) {
        within(30, "destroy", d.destroy(*id))
            .await
            .expect("destroy");
    }
    let after: HashSet<SandboxId> = within(10, "list", d.list())
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert!(got.iter().all(|id| !after.contains(id)));
    within(60, "shutdown", d.shutdown()).await;
    eventually(30, "pool drained at shutdown", || async {
        env.containers_with(&[&label(labels::INSTANCE, instance)])
            .await
            .is_empty()
    })
    .await;
}

/// A pool's warm-up command (`DispatcherConfig::pool_warmup`) runs in each new sandbox before
/// it is offered: what it leaves is there when the owner gets the sandbox, pooled or refilled;
/// a pool without one runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pools_warm_up_runs_before_its_sandbox_is_handed_out() {
    let env = TestEnv::new().await;
    let instance = env.new_instance().await;
    let mut config = env.config();
    config.pool = BTreeMap::from([(IMAGE.to_owned(), 1)]);
    config.pool_warmup = BTreeMap::from([(
        IMAGE.to_owned(),
        vec!["touch".to_owned(), "warmed".to_owned()],
    )]);
    let d = env.start(instance, config).await;
    let full =
        |d: dispatcher::Dispatcher| async move { d.pool_sizes().get(IMAGE).copied() == Some(1) };
    for owner in ["exec-w1", "exec-w2"] {
        eventually(90, "pool warmed to 1", || full(d.clone())).await;
        let id = within(30, "acquire", d.acquire(spec(owner)))
            .await
            .expect("acquire");
        assert_eq!(d.pool_stats().misses, 0, "served from the pool");
        let found: RunResult = called(&d, id, 10, "test -f", run(&["test", "-f", "warmed"])).await;
        assert_eq!(
            found.exit_code,
            Some(0),
            "the warm-up ran before the hand-out"
        );
        common::destroyed(&d, id).await;
    }
    // A pool without a warm-up runs nothing in its sandboxes.
    let mut other = env.config();
    other.pool = BTreeMap::from([(IMAGE.to_owned(), 1)]);
    within(60, "shutdown", d.shutdown()).await;
    let second = env.new_instance().await;
    let d = env.start(second, other).await;
    eventually(90, "pool warmed to 1", || full(d.clone())).await;
    let id = within(30, "acquire", d.acquire(spec("exec-w3")))
        .await
        .expect("acquire");
    let found: RunResult = called(&d, id, 10, "test -f", run(&["test", "-f", "warmed"])).await;
    assert_eq!(found.exit_code, Some(1), "no warm-up configured, none ran");
    within(60, "shutdown", d.shutdown()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn destroy_owned_by_removes_only_that_owners_sandboxes() {
    let (env, _, d) = TestEnv::with_dispatcher().await;
    let owner = Owner::new(OwnerKind::Session, "session-7");
    let mut mine = Vec::new();
    for _ in 0..2 {
        let s = SandboxSpec::new(IMAGE, owner.clone());
        mine.push(created(&d, s).await);
    }
    let other = created(&d, spec("exec-other")).await;
    let n = within(60, "destroy_owned_by", d.destroy_owned_by(&owner))
        .await
        .expect("destroy_owned_by");
    assert_eq!(n, 2);
    for id in mine {
        assert_eq!(env.row_state(id).await.0, "destroyed");
    }
    assert!(within(10, "ping other", d.call(other, Op::Ping))
        .await
        .is_ok());
    finish(&d, &[other]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_are_typed_and_leave_nothing() {
    let env = TestEnv::new().await;
    let instance = env.new_instance().await;

    // A dispatcher with `executor` as its executor: it must not start.
    let start_with = |executor: &str, what: &'static str| {
        let mut config = env.config();
        config.executor_path = executor.into();
        let starting =
            dispatcher::Dispatcher::start(env.engine.clone(), env.pg.clone(), instance, config);
        within(30, what, starting)
    };
    match start_with(
        "/nonexistent/sandbox-executor",
        "start with missing executor",
    )
    .await
    {
        Err(DispatchError::ExecutorMissing { path }) => {
            assert_eq!(path.to_str(), Some("/nonexistent/sandbox-executor"))
        }
        other => panic!("expected ExecutorMissing, got {other:?}"),
    }
    match start_with("/bin/sh", "start with a dynamic binary").await {
        Err(DispatchError::ExecutorInvalid { reason, .. }) => {
            assert!(reason.contains("dynamically linked"), "{reason}")
        }
        other => panic!("expected ExecutorInvalid, got {other:?}"),
    }

    let d = env.start(instance, env.config()).await;
    match within(
        30,
        "missing image",
        d.create(SandboxSpec::new(
            "aegis-runtime/absent:0",
            Owner::new(OwnerKind::Operator, "op"),
        )),
    )
    .await
    {
        Err(e @ DispatchError::ImageMissing { .. }) => {
            assert!(e.to_string().contains("runtime-images/build.sh"), "{e}")
        }
        other => panic!("expected ImageMissing, got {other:?}"),
    }
    let mut reserved = spec("exec-x");
    reserved
        .labels
        .insert("org.aegis.managed".into(), "false".into());
    assert!(matches!(
        d.create(reserved).await,
        Err(DispatchError::InvalidSpec { .. })
    ));

    // An executor that refuses its configuration: the failure is reported, recorded, cleaned up.
    let mut relative = spec("exec-bad-roots");
    relative.read_roots = vec!["/workspace/../..".into()];
    match within(60, "executor refusing to start", d.create(relative)).await {
        Err(DispatchError::ExecutorNotReady { id, detail, .. }) => {
            eprintln!("not ready: {detail}");
            let (state, reason) = env.row_state(id).await;
            assert_eq!(state, "failed");
            assert!(reason.is_some());
            env.assert_nothing_with(&label(labels::SANDBOX, id)).await;
        }
        other => panic!("expected ExecutorNotReady, got {other:?}"),
    }
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn measurements() {
    let env = TestEnv::new().await;
    let d = Arc::new(with_pool(&env, 3).await.1);

    let mut creates = Vec::new();
    let mut ids = Vec::new();
    for i in 0..5 {
        let started = Instant::now();
        let mut s = spec(&format!("exec-m{i}"));
        s.limits.pids = 200; // not a pool match
        ids.push(created(&d, s).await);
        creates.push(started.elapsed());
    }
    let mut pings = Vec::new();
    for _ in 0..300 {
        let started = Instant::now();
        within(10, "ping", d.call(ids[0], Op::Ping))
            .await
            .expect("ping");
        pings.push(started.elapsed());
    }
    let mut runs = Vec::new();
    for _ in 0..30 {
        let started = Instant::now();
        within(10, "true", d.call(ids[0], run(&["true"])))
            .await
            .expect("run");
        runs.push(started.elapsed());
    }
    eventually(120, "pool warm", || {
        let d = d.clone();
        async move { d.pool_sizes().get(IMAGE).copied() == Some(3) }
    })
    .await;
    let mut acquires = Vec::new();
    for i in 0..3 {
        let started = Instant::now();
        ids.push(
            within(30, "acquire", d.acquire(spec(&format!("exec-a{i}"))))
                .await
                .expect("acquire"),
        );
        acquires.push(started.elapsed());
    }
    let p50 = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    eprintln!(
        "MEASURED create+start+ready p50={:?} (all {:?}); ping p50={:?} p95={:?}; cmd.run true p50={:?}; pool acquire p50={:?} (all {:?})",
        p50(&mut creates.clone()),
        creates,
        p50(&mut pings.clone()),
        { pings.sort(); pings[pings.len() * 95 / 100] },
        p50(&mut runs),
        p50(&mut acquires.clone()),
        acquires
    );
    for id in ids {
        common::destroyed(&d, id).await;
    }
    within(60, "shutdown", d.shutdown()).await;
}

/// An image's `VOLUME` gives the container an anonymous volume (unbounded, outside the write
/// roots); it is removed with the sandbox, not left behind on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn anonymous_volumes_of_the_image_go_with_the_sandbox() {
    let env = TestEnv::new().await;
    let image = "aegis-test/with-volume:1";
    let mut build = std::process::Command::new("docker")
        .args(["build", "-q", "-t", image, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("the docker CLI runs");
    if let Some(mut stdin) = build.stdin.take() {
        use std::io::Write;
        stdin
            .write_all(format!("FROM {IMAGE}\nVOLUME /data\n").as_bytes())
            .expect("Dockerfile written");
    }
    assert!(build.wait().expect("docker build").success(), "image built");

    let (_, d) = env.started().await;
    let s = SandboxSpec::new(image, Owner::new(OwnerKind::Execution, "exec-volume"));
    let id = created(&d, s).await;
    let inspect = env.inspect(id).await;
    let anonymous = inspect
        .mounts
        .unwrap_or_default()
        .into_iter()
        .find(|m| m.destination.as_deref() == Some("/data"))
        .and_then(|m| m.name)
        .expect("the image's VOLUME is mounted");
    assert!(env.volume_exists(&anonymous).await);
    within(60, "destroy", d.destroy(id)).await.expect("destroy");
    eventually(20, "the anonymous volume is removed", || async {
        !env.volume_exists(&anonymous).await
    })
    .await;
    d.shutdown().await;
}
