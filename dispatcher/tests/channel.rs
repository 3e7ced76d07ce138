//! The direct channel: calls over the executor's socket, its fallback to the attach stream, and
//! the attacks on it from inside a sandbox.
//!
//! Needs what `lifecycle.rs` needs, run as root (the channel directory is root's), plus the
//! image `aegis-runtime/python:3.11` for a real `connect` attempt from inside.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::time::Duration;

use common::{ok, within, TestEnv, IMAGE};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_take_the_socket_and_no_sandbox_can_reach_one() {
    let env = TestEnv::new().await;
    let instance = env.new_instance().await;
    let mut config = env.config();
    let base = base("attacks");
    config.channel_dir = Some(base.clone());
    let d = env.start(instance, config).await;

    // The attacker may read everywhere (a manifest can ask for `/`), and has Python.
    let mut attacker = SandboxSpec::new(PYTHON, Owner::new(OwnerKind::Execution, "chan-a"));
    attacker.read_roots = vec!["/".into()];
    let a = within(90, "create attacker", d.create(attacker))
        .await
        .expect("create attacker");
    let b = within(
        60,
        "create neighbour",
        d.create(SandboxSpec::new(
            IMAGE,
            Owner::new(OwnerKind::Execution, "chan-b"),
        )),
    )
    .await
    .expect("create neighbour");
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
    let ran: RunResult = ok(
        within(30, "attack", d.call(a, run(&["python3", "-c", &script])))
            .await
            .expect("cmd.run"),
    );
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
    let echoed: RunResult = ok(within(20, "echo", d.call(b, run(&["echo", "fine"])))
        .await
        .expect("cmd.run"));
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
    let previous = env.new_instance().await;
    let mut config = env.config();
    let base = base("adopt");
    config.channel_dir = Some(base.clone());
    config.dead_after = Duration::from_secs(120);
    let first = env.start(previous, config.clone()).await;
    let id = within(
        60,
        "create",
        first.create(SandboxSpec::new(
            IMAGE,
            Owner::new(OwnerKind::Execution, "chan-adopt"),
        )),
    )
    .await
    .expect("create");
    assert_eq!(first.transport(id), Some(Transport::Socket));
    drop(first);

    let next = env.new_instance().await;
    let second = env.start(next, config).await;
    let report = within(30, "adopt", second.adopt(previous))
        .await
        .expect("adopt");
    assert_eq!(report.adopted, vec![id]);
    assert_eq!(second.transport(id), Some(Transport::Socket));
    let ran: RunResult = ok(
        within(20, "run", second.call(id, run(&["echo", "adopted"])))
            .await
            .expect("run after adopt"),
    );
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
    let instance = env.new_instance().await;
    let mut config = env.config();
    // Beneath a file: the node cannot make the sandbox's directory.
    config.channel_dir = Some(PathBuf::from("/proc/version/channels"));
    let d = env.start(instance, config).await;
    let id = within(
        60,
        "create",
        d.create(SandboxSpec::new(
            IMAGE,
            Owner::new(OwnerKind::Execution, "chan-fallback"),
        )),
    )
    .await
    .expect("create");
    assert_eq!(d.transport(id), Some(Transport::Attach));
    let ran: RunResult = ok(within(20, "run", d.call(id, run(&["echo", "attached"])))
        .await
        .expect("cmd.run"));
    assert_eq!(ran.stdout.trim(), "attached");
    common::destroyed(&d, id).await;
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reaper_sweeps_channel_directories_whose_container_is_gone() {
    let env = TestEnv::new().await;
    let instance = env.new_instance().await;
    let mut config = env.config();
    let base = base("sweep");
    config.channel_dir = Some(base.clone());
    let d = env.start(instance, config).await;
    let live = within(
        60,
        "create",
        d.create(SandboxSpec::new(
            IMAGE,
            Owner::new(OwnerKind::Execution, "chan-sweep"),
        )),
    )
    .await
    .expect("create");
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
    let ran: RunResult = ok(within(20, "run", d.call(live, run(&["echo", "alive"])))
        .await
        .expect("cmd.run"));
    assert_eq!(ran.stdout.trim(), "alive");

    common::destroyed(&d, live).await;
    let _ = std::fs::remove_dir(&young);
    d.shutdown().await;
    let _ = std::fs::remove_dir(&base);
}
