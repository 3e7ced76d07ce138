//! The direct channel: calls over the executor's socket, its fallback to the attach stream, and
//! the attacks on it from inside a sandbox.
//!
//! Needs what `lifecycle.rs` needs, run as root (the channel directory is root's), plus the
//! image `aegis-runtime/python:3.11` for a real `connect` attempt from inside.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::time::Duration;

use common::{adoptable, called, created, finish, spec, within, TestEnv};
use dispatcher::protocol::{Op, PathParams, ReadParams, Response, RunResult};
use dispatcher::{Owner, OwnerKind, SandboxSpec, Transport};

const PYTHON: &str = "aegis-runtime/python:3.11";
const IN_SANDBOX: &str = "/run/aegis-channel";

fn run(argv: &[&str]) -> Op {
    common::run_for(argv, 20_000)
}

fn refused(response: Response, what: &str) -> String {
    match response.into_result() {
        Ok(value) => panic!("{what} succeeded: {value}"),
        Err(body) => format!("{}: {}", body.kind, body.message),
    }
}

/// A channel base of this test's own.
fn base(name: &str) -> PathBuf {
    let unique = uuid::Uuid::new_v4().simple().to_string();
    PathBuf::from(format!("/run/aegis-test-channels/{name}-{}", &unique[..8]))
}

/// A dispatcher whose channels are beneath a base of this test's own; (it, the base).
async fn on_channels(env: &TestEnv, name: &str) -> (dispatcher::Dispatcher, PathBuf) {
    let base = base(name);
    let (_, d, _) = env
        .started_with(|c| c.channel_dir = Some(base.clone()))
        .await;
    (d, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_take_the_socket_and_no_sandbox_can_reach_one() {
    let env = TestEnv::new().await;
    let (d, base) = on_channels(&env, "attacks").await;

    // The attacker may read everywhere (a manifest can ask for `/`), and has Python.
    let mut attacker = SandboxSpec::new(PYTHON, Owner::new(OwnerKind::Execution, "chan-a"));
    attacker.read_roots = vec!["/".into()];
    let a = within(90, "create attacker", d.create(attacker))
        .await
        .expect("create attacker");
    let b = created(&d, spec("chan-b")).await;
    assert_eq!(d.transport(a), Some(Transport::Socket));
    assert_eq!(d.transport(b), Some(Transport::Socket));

    // On the node: root's directory, 0700; root's socket, 0600.
    for id in [a, b] {
        let dir = base.join(id.to_string());
        let meta = std::fs::metadata(&dir).expect("channel directory");
        assert_eq!((meta.uid(), meta.permissions().mode() & 0o777), (0, 0o700));
        let sock = std::fs::metadata(dir.join("executor.sock")).expect("socket");
        assert_eq!((sock.uid(), sock.permissions().mode() & 0o777), (0, 0o600));
    }

    // From inside, as the agent: the directory cannot be listed, the socket neither reached nor
    // connected to, the neighbour's socket and the node's directory are not there at all.
    let script = format!(
        r#"
import os, socket
def attempt(name, f):
    try:
        f()
        print(name, "ALLOWED")
    except Exception as e:
        print(name, type(e).__name__)
def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(b'{{"id":1,"op":"ping"}}\n')
    print(s.recv(100))
attempt("list", lambda: os.listdir("{IN_SANDBOX}"))
attempt("stat", lambda: os.stat("{IN_SANDBOX}/executor.sock"))
attempt("connect", lambda: connect("{IN_SANDBOX}/executor.sock"))
attempt("neighbour", lambda: connect("{neighbour}"))
attempt("node", lambda: os.listdir("{node}"))
print("mounts", open("/proc/self/mountinfo").read().count("aegis-channel"))
print("neighbour-mounted", "{b}" in open("/proc/self/mountinfo").read())
"#,
        neighbour = base.join(b.to_string()).join("executor.sock").display(),
        node = base.display(),
    );
    let ran: RunResult = called(&d, a, 30, "attack", run(&["python3", "-c", &script])).await;
    let lines: Vec<&str> = ran.stdout.lines().collect();
    assert_eq!(
        lines,
        vec![
            "list PermissionError",
            "stat PermissionError",
            "connect PermissionError",
            "neighbour FileNotFoundError",
            "node FileNotFoundError",
            "mounts 1",
            "neighbour-mounted False",
        ],
        "stderr: {}",
        ran.stderr
    );

    // Through the executor's own file operations (the user's filesystem identity): refused.
    let listed = within(
        10,
        "fs.list",
        d.call(
            a,
            Op::FsList(PathParams {
                path: IN_SANDBOX.into(),
                user: Default::default(),
            }),
        ),
    )
    .await
    .expect("fs.list answered");
    eprintln!(
        "fs.list refused: {}",
        refused(listed, "fs.list of the channel")
    );
    let read = within(
        10,
        "fs.read",
        d.call(
            a,
            Op::FsRead(ReadParams {
                path: format!("{IN_SANDBOX}/executor.sock"),
                ..ReadParams::default()
            }),
        ),
    )
    .await
    .expect("fs.read answered");
    eprintln!(
        "fs.read refused: {}",
        refused(read, "fs.read of the socket")
    );

    // The executor still answers its node, and destroy takes the directories away.
    let echoed: RunResult = called(&d, b, 20, "echo", run(&["echo", "fine"])).await;
    assert_eq!(echoed.stdout.trim(), "fine");
    for id in [a, b] {
        common::destroyed(&d, id).await;
        assert!(
            !base.join(id.to_string()).exists(),
            "channel directory left"
        );
    }
    d.shutdown().await;
    let _ = std::fs::remove_dir(&base);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adoption_reconnects_to_the_socket() {
    let env = TestEnv::new().await;
    let base = base("adopt");
    let (previous, first, config) = env
        .started_with(|c| {
            c.channel_dir = Some(base.clone());
            adoptable(c);
        })
        .await;
    let id = created(&first, spec("chan-adopt")).await;
    assert_eq!(first.transport(id), Some(Transport::Socket));
    drop(first);

    let next = env.new_instance().await;
    let second = env.start(next, config).await;
    let report = common::adopted(&second, previous).await;
    assert_eq!(report.adopted, vec![id]);
    assert_eq!(second.transport(id), Some(Transport::Socket));
    let ran: RunResult = called(&second, id, 20, "run", run(&["echo", "adopted"])).await;
    assert_eq!(ran.stdout.trim(), "adopted");
    within(30, "destroy", second.destroy(id))
        .await
        .expect("destroy");
    assert!(!base.join(id.to_string()).exists());
    second.shutdown().await;
    let _ = std::fs::remove_dir(&base);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_usable_directory_calls_use_the_attach_stream() {
    let env = TestEnv::new().await;
    // Beneath a file: the node cannot make the sandbox's directory.
    let unusable = PathBuf::from("/proc/version/channels");
    let (_, d, _) = env.started_with(|c| c.channel_dir = Some(unusable)).await;
    let id = created(&d, spec("chan-fallback")).await;
    assert_eq!(d.transport(id), Some(Transport::Attach));
    let ran: RunResult = called(&d, id, 20, "run", run(&["echo", "attached"])).await;
    assert_eq!(ran.stdout.trim(), "attached");
    finish(&d, &[id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reaper_sweeps_channel_directories_whose_container_is_gone() {
    let env = TestEnv::new().await;
    let (d, base) = on_channels(&env, "sweep").await;
    let live = created(&d, spec("chan-sweep")).await;
    let two_minutes_ago = std::time::SystemTime::now() - Duration::from_secs(120);
    let age = |dir: &PathBuf| {
        std::fs::File::open(dir)
            .and_then(|f| f.set_modified(two_minutes_ago))
            .expect("backdating a directory");
    };
    // Left by a container removed behind the dispatcher's back, old: swept.
    let stale = base.join(uuid::Uuid::new_v4().to_string());
    std::fs::create_dir(&stale).expect("mkdir");
    age(&stale);
    // Of a sandbox being made (no container yet), young: kept.
    let young = base.join(uuid::Uuid::new_v4().to_string());
    std::fs::create_dir(&young).expect("mkdir");
    // A live sandbox's, even old: kept.
    age(&base.join(live.to_string()));

    within(60, "reap", d.reap()).await.expect("reap");
    assert!(!stale.exists(), "a stale channel directory was kept");
    assert!(young.exists(), "a young channel directory was swept");
    assert!(
        base.join(live.to_string()).exists(),
        "a live sandbox lost its directory"
    );
    let ran: RunResult = called(&d, live, 20, "run", run(&["echo", "alive"])).await;
    assert_eq!(ran.stdout.trim(), "alive");

    common::destroyed(&d, live).await;
    let _ = std::fs::remove_dir(&young);
    d.shutdown().await;
    let _ = std::fs::remove_dir(&base);
}
