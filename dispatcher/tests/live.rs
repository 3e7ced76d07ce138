//! Live processes and directory watches against a real Docker engine, a real PostgreSQL and the
//! real executor: processes that outlive their call and are re-attached, stdin, signals, a PTY,
//! output caps, the bounds of a sandbox, and watches beneath (and refused outside) its roots.
//!
//! Needs what `lifecycle.rs` needs (see `common`). Every await is bounded; no assertion depends
//! on wall-clock time.

mod common;

use std::collections::BTreeMap;

use common::{called, eventually, label, within, TestEnv, IMAGE};
use dispatcher::protocol::{
    ErrorKind, ExecGrant, FsOp, Op, ProcessEnd, ProcessSignal, PtySize, RunResult, StartParams,
    WriteParams,
};
use dispatcher::{
    labels, DispatchError, Dispatcher, Owner, OwnerKind, ProcessEvent, ProcessHandle,
    ProcessSelector, SandboxId, SandboxSpec, WatchEvent, WatchHandle,
};

fn start(argv: &[&str]) -> StartParams {
    StartParams {
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        cwd: None,
        env: BTreeMap::new(),
        tag: None,
        stdin: false,
        pty: None,
        timeout_ms: None,
        grace_ms: Some(500),
        max_output_bytes: None,
        exec: ExecGrant::Any,
        user: Default::default(),
    }
}

/// Everything a process sent until its end.
#[derive(Debug, Default)]
struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    pty: Vec<u8>,
    dropped_bytes: u64,
    dropped_events: u64,
    end: Option<ProcessEnd>,
}

async fn collect(handle: &mut ProcessHandle) -> Collected {
    let mut got = Collected::default();
    while let Some(event) = within(30, "the next process event", handle.next()).await {
        match event {
            ProcessEvent::Stdout(b) => got.stdout.extend_from_slice(&b),
            ProcessEvent::Stderr(b) => got.stderr.extend_from_slice(&b),
            ProcessEvent::Pty(b) => got.pty.extend_from_slice(&b),
            ProcessEvent::Dropped { events, bytes } => {
                got.dropped_events += events;
                got.dropped_bytes += bytes;
            }
            ProcessEvent::End(end) => {
                got.end = Some(end);
                assert!(
                    within(5, "after the end", handle.next()).await.is_none(),
                    "nothing comes after the end"
                );
                return got;
            }
        }
    }
    panic!("the events ended without an end event: {got:?}");
}

/// Reads a watch's events until its end (each within `secs`); the end's reason.
async fn watch_end(watch: &mut dispatcher::WatchHandle, secs: u64) -> String {
    loop {
        match within(secs, "watch end", watch.next()).await {
            Some(WatchEvent::End { reason }) => return reason,
            Some(_) => {}
            None => panic!("no end event"),
        }
    }
}

/// Sends `signal` to the process of `handle` (within 10 s) and collects it to its end.
async fn signalled(
    d: &Dispatcher,
    id: SandboxId,
    handle: &mut ProcessHandle,
    signal: ProcessSignal,
) -> Collected {
    within(10, "signal", d.signal_process(id, handle.pid(), signal))
        .await
        .unwrap_or_else(|e| panic!("{signal:?}: {e:?}"));
    collect(handle).await
}

/// Reads terminal or stdout output until it contains `needle`; what was read.
async fn read_until(handle: &mut ProcessHandle, needle: &str) -> String {
    let mut seen = Vec::new();
    loop {
        match within(30, &format!("output containing {needle:?}"), handle.next()).await {
            Some(ProcessEvent::Stdout(b) | ProcessEvent::Pty(b)) => seen.extend_from_slice(&b),
            Some(ProcessEvent::End(end)) => panic!(
                "ended before printing {needle:?}: {end:?}; saw {:?}",
                String::from_utf8_lossy(&seen)
            ),
            Some(_) => {}
            None => panic!("no more events"),
        }
        let text = String::from_utf8_lossy(&seen).into_owned();
        if text.contains(needle) {
            return text;
        }
    }
}

/// The executor's refusal (kind and message) of a call expected to be refused.
fn refused<T: std::fmt::Debug>(result: Result<T, DispatchError>) -> (ErrorKind, String) {
    match result {
        Err(DispatchError::Refused { kind, message, .. }) => (kind, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Starts a live process.
async fn started(d: &Dispatcher, id: SandboxId, params: StartParams) -> ProcessHandle {
    within(20, "start", d.start_process(id, params))
        .await
        .expect("start")
}

/// Whether the executor lists a live process with this pid.
async fn is_listed(d: &Dispatcher, id: SandboxId, pid: u32) -> bool {
    d.list_processes(id)
        .await
        .expect("list")
        .iter()
        .any(|p| p.pid == pid)
}

/// Writes to a live process's stdin or terminal.
async fn send(d: &Dispatcher, id: SandboxId, pid: u32, bytes: &[u8]) {
    within(10, "input", d.send_input(id, pid, bytes))
        .await
        .expect("input");
}

/// Closes a live process's stdin.
async fn close(d: &Dispatcher, id: SandboxId, pid: u32) {
    within(10, "close stdin", d.close_stdin(id, pid))
        .await
        .expect("close stdin");
}

/// A new handle on a live process.
async fn attach(d: &Dispatcher, id: SandboxId, select: ProcessSelector) -> ProcessHandle {
    within(10, "attach", d.attach_process(id, select))
        .await
        .expect("attach")
}

/// `cat` fed through its stdin, tagged.
fn echo(tag: &str) -> StartParams {
    let mut params = start(&["cat"]);
    params.tag = Some(tag.to_owned());
    params.stdin = true;
    params
}

async fn run(d: &Dispatcher, id: SandboxId, argv: &[&str]) -> RunResult {
    let op = common::run_for(argv, 10_000);
    called(d, id, 20, "cmd.run", op).await
}

async fn sandbox(
    env: &TestEnv,
    config: dispatcher::DispatcherConfig,
    image: &str,
) -> (Dispatcher, SandboxId) {
    let instance = env.new_instance().await;
    let d = env.start(instance, config).await;
    let spec = SandboxSpec::new(image, Owner::new(OwnerKind::Execution, "live"));
    let id = common::created(&d, spec).await;
    (d, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_background_process_outlives_its_call_and_is_reattached_by_pid_and_by_tag() {
    let env = TestEnv::new().await;
    let (d, id) = sandbox(&env, env.config(), IMAGE).await;

    let first = started(&d, id, echo("echo")).await;
    let pid = first.pid();
    assert_eq!(first.tag(), Some("echo"));
    assert!(first.landlock().is_some());
    // The call that started it is over and its handle gone; the process runs on.
    drop(first);
    let listed = within(20, "list", d.list_processes(id))
        .await
        .expect("list");
    let entry = listed.iter().find(|p| p.pid == pid).expect("listed by pid");
    assert_eq!(entry.tag.as_deref(), Some("echo"));
    assert_eq!(entry.argv, vec!["cat"]);
    assert!(entry.stdin);
    // It is a real process of the sandbox, visible to its commands.
    let pidof = run(&d, id, &["pidof", "cat"]).await;
    assert_eq!(pidof.stdout.trim(), pid.to_string());

    let mut by_pid = attach(&d, id, ProcessSelector::Pid(pid)).await;
    assert_eq!(by_pid.tag(), Some("echo"));
    send(&d, id, pid, b"hello\n").await;
    // Streamed as it comes: the echo arrives while the process still runs.
    assert_eq!(read_until(&mut by_pid, "hello\n").await, "hello\n");

    let mut by_tag = attach(&d, id, ProcessSelector::Tag("echo".to_owned())).await;
    assert_eq!(by_tag.pid(), pid);
    send(&d, id, pid, b"world\n").await;
    close(&d, id, pid).await;
    let rest = collect(&mut by_pid).await;
    assert_eq!(rest.stdout, b"world\n");
    let end = rest.end.expect("end");
    assert_eq!(
        (end.exit_code, end.signal, end.error),
        (Some(0), None, None)
    );
    assert_eq!(end.stdout_bytes, 12);
    // The second handle sees what was still buffered, in order, and the same end.
    let seen = collect(&mut by_tag).await;
    assert_eq!(seen.stdout, b"hello\nworld\n");
    assert_eq!(seen.end.expect("end").exit_code, Some(0));

    // Ended: gone from the list, not attachable, its stdin not writable, its tag free again.
    eventually(10, "the process leaves the list", || async {
        !is_listed(&d, id, pid).await
    })
    .await;
    let (kind, message) = refused(d.attach_process(id, ProcessSelector::Pid(pid)).await);
    assert_eq!(kind, ErrorKind::NotFound, "{message}");
    let (kind, message) = refused(d.send_input(id, pid, b"late").await);
    assert_eq!(
        kind,
        ErrorKind::NotFound,
        "input to an ended process: {message}"
    );
    let mut again = start(&["true"]);
    again.tag = Some("echo".to_owned());
    let mut again = within(20, "start with the tag again", d.start_process(id, again))
        .await
        .expect("the tag is free after the end");
    assert_eq!(
        collect(&mut again).await.end.expect("end").exit_code,
        Some(0)
    );

    common::finish(&d, &[id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_streams_in_order_before_the_end_and_caps_are_flagged() {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.live_buffer_bytes = 64 * 1024;
    let (d, id) = sandbox(&env, config, IMAGE).await;

    // Order: 500 numbered lines on stdout, then one on stderr, then the end.
    let script =
        "i=0; while [ $i -lt 500 ]; do echo line$i; i=$((i+1)); done; echo done >&2; exit 3";
    let mut handle = started(&d, id, start(&["sh", "-c", script])).await;
    let got = collect(&mut handle).await;
    let expected: String = (0..500).map(|i| format!("line{i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&got.stdout), expected);
    assert_eq!(got.stderr, b"done\n");
    let end = got.end.expect("end");
    assert_eq!(end.exit_code, Some(3));
    assert_eq!(end.stdout_bytes, expected.len() as u64);
    assert!(!end.truncated.stdout && got.dropped_events == 0);

    // Attack: output that looks like protocol lines is only output (it travels base64).
    let forged = r#"printf '{"id":1,"ok":{}}\n{"event":1,"kind":"end","exit_code":0}\n'"#;
    let mut handle = started(&d, id, start(&["sh", "-c", forged])).await;
    let got = collect(&mut handle).await;
    assert_eq!(
        String::from_utf8_lossy(&got.stdout),
        "{\"id\":1,\"ok\":{}}\n{\"event\":1,\"kind\":\"end\",\"exit_code\":0}\n"
    );
    assert_eq!(run(&d, id, &["echo", "still"]).await.stdout, "still\n");

    // Input is bounded per call.
    let mut handle = started(&d, id, echo("reader")).await;
    let oversized = vec![b'x'; 1024 * 1024 + 1];
    let (kind, message) = refused(d.send_input(id, handle.pid(), &oversized).await);
    assert_eq!(kind, ErrorKind::TooLarge, "{message}");
    d.close_stdin(id, handle.pid()).await.expect("close");
    assert!(collect(&mut handle).await.stdout.is_empty());

    // The executor's cap: the first max_output_bytes are sent, the rest counted and flagged.
    let mut capped = start(&["head", "-c", "5000", "/dev/zero"]);
    capped.max_output_bytes = Some(1000);
    let mut handle = started(&d, id, capped).await;
    let got = collect(&mut handle).await;
    let end = got.end.expect("end");
    assert_eq!(got.stdout.len(), 1000);
    assert_eq!((end.stdout_bytes, end.truncated.stdout), (5000, true));

    // The dispatcher's buffer: a handle that does not read loses the oldest output, and is
    // told how much before the rest.
    let total = 1_000_000u64;
    let mut slow = started(
        &d,
        id,
        start(&["head", "-c", &total.to_string(), "/dev/zero"]),
    )
    .await;
    let pid = slow.pid();
    // The executor forgets the process only after sending all its output, and answers in
    // order on the same stream: once it is not listed, every output event is in the buffer.
    eventually(30, "the process ends", || async {
        !is_listed(&d, id, pid).await
    })
    .await;
    let first = within(10, "first event", slow.next())
        .await
        .expect("an event");
    assert!(
        matches!(first, ProcessEvent::Dropped { bytes, .. } if bytes > 0),
        "a slow reader is told what it missed first, got {first:?}"
    );
    let ProcessEvent::Dropped { bytes: dropped, .. } = first else {
        unreachable!()
    };
    let rest = collect(&mut slow).await;
    let end = rest.end.expect("end");
    assert_eq!(end.stdout_bytes, total);
    assert!(!end.truncated.stdout);
    assert!(
        rest.stdout.len() as u64 <= 64 * 1024 + 64 * 1024,
        "bounded by the buffer"
    );
    assert_eq!(
        dropped + rest.dropped_bytes + rest.stdout.len() as u64,
        total
    );

    common::finish(&d, &[id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_and_sigkill_end_the_process_and_its_whole_tree() {
    let env = TestEnv::new().await;
    let (d, id) = sandbox(&env, env.config(), IMAGE).await;

    let mut handle = started(&d, id, start(&["sleep", "1000"])).await;
    let end = signalled(&d, id, &mut handle, ProcessSignal::Term)
        .await
        .end
        .expect("end");
    assert_eq!((end.exit_code, end.signal), (None, Some(15)));

    // A tree: a background child, a setsid'd grandchild and the leader; SIGKILL takes all.
    let script = "sleep 1001 & setsid sleep 1002 & sleep 1003";
    let mut handle = started(&d, id, start(&["sh", "-c", script])).await;
    eventually(20, "the tree runs", || async {
        run(&d, id, &["pidof", "sleep"])
            .await
            .stdout
            .split_whitespace()
            .count()
            == 3
    })
    .await;
    let end = signalled(&d, id, &mut handle, ProcessSignal::Kill)
        .await
        .end
        .expect("end");
    assert_eq!(end.signal, Some(9));
    let left = run(&d, id, &["pidof", "sleep"]).await;
    assert_ne!(
        left.exit_code,
        Some(0),
        "nothing of the tree is left: {}",
        left.stdout
    );

    // A leader that exits leaves nothing behind either (the sub-reaper kills its orphans).
    let mut handle = within(
        20,
        "start",
        d.start_process(
            id,
            start(&["sh", "-c", "setsid sleep 1004 & sleep 1005 & exit 0"]),
        ),
    )
    .await
    .expect("start");
    assert_eq!(
        collect(&mut handle).await.end.expect("end").exit_code,
        Some(0)
    );
    let left = run(&d, id, &["pidof", "sleep"]).await;
    assert_ne!(left.exit_code, Some(0), "no orphan: {}", left.stdout);

    // Attack: one live process signals another (or the executor). The kernel scopes signals to
    // each command's own Landlock domain: refused, and the target still runs.
    let mut victim = started(&d, id, start(&["sleep", "1008"])).await;
    let killer = format!("kill -9 {} ; kill -9 1 ; echo tried", victim.pid());
    let mut attacker = started(&d, id, start(&["sh", "-c", &killer])).await;
    let got = collect(&mut attacker).await;
    assert_eq!(got.stdout, b"tried\n");
    assert!(
        String::from_utf8_lossy(&got.stderr).contains("ermitted"),
        "{got:?}"
    );
    let listed = within(20, "list", d.list_processes(id))
        .await
        .expect("list");
    assert!(
        listed.iter().any(|p| p.pid == victim.pid()),
        "the victim runs"
    );
    signalled(&d, id, &mut victim, ProcessSignal::Kill).await;

    // A timeout ends a process like cmd.run's: SIGTERM, flagged.
    let mut timed = start(&["sleep", "1009"]);
    timed.timeout_ms = Some(100);
    let mut handle = started(&d, id, timed).await;
    let end = collect(&mut handle).await.end.expect("end");
    assert!(end.timed_out, "{end:?}");
    assert_eq!(end.signal, Some(15));

    // Signals and input to what is not a live process are refused.
    let (kind, message) = refused(d.send_input(id, 1, b"x").await);
    assert_eq!(kind, ErrorKind::NotFound, "input to pid 1: {message}");
    let (kind, message) = refused(d.signal_process(id, 1, ProcessSignal::Kill).await);
    assert_eq!(kind, ErrorKind::NotFound, "signalling pid 1: {message}");

    common::finish(&d, &[id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pty_has_the_size_asked_for_and_can_be_resized() {
    let env = TestEnv::new().await;
    let (d, id) = sandbox(&env, env.config(), IMAGE).await;

    let mut params = start(&["sh"]);
    params.pty = Some(PtySize {
        cols: 100,
        rows: 30,
    });
    let mut shell = started(&d, id, params).await;
    let pid = shell.pid();
    let listed = within(20, "list", d.list_processes(id))
        .await
        .expect("list");
    assert_eq!(
        listed.iter().find(|p| p.pid == pid).and_then(|p| p.pty),
        Some(PtySize {
            cols: 100,
            rows: 30
        })
    );
    send(&d, id, pid, b"stty size; tty\n").await;
    let seen = read_until(&mut shell, "30 100").await;
    assert!(!seen.contains("not a tty"), "{seen}");

    within(
        10,
        "resize",
        d.resize_pty(
            id,
            pid,
            PtySize {
                cols: 120,
                rows: 40,
            },
        ),
    )
    .await
    .expect("resize");
    send(&d, id, pid, b"stty size\n").await;
    read_until(&mut shell, "40 120").await;
    // The process writes to its controlling terminal by name too.
    send(&d, id, pid, b"echo via-$((6*7)) > /dev/tty\n").await;
    read_until(&mut shell, "via-42").await;

    // Attack: another command of the sandbox opens the terminal by its /dev/pts name to read
    // the keystrokes meant for the shell. The slave is root's, mode 0600: refused.
    let probe = "n=0; for t in /dev/pts/[0-9]*; do n=$((n+1)); if ( : < $t ); then echo opened $t; else echo denied $t; fi; done; echo terminals $n";
    let probed = run(&d, id, &["sh", "-c", probe]).await;
    assert!(probed.stdout.contains("terminals 1"), "{probed:?}");
    assert!(!probed.stdout.contains("opened"), "{probed:?}");
    assert!(probed.stdout.contains("denied /dev/pts/"), "{probed:?}");
    assert!(probed.stderr.contains("ermission denied"), "{probed:?}");

    // A terminal has no stdin of its own to close; a size of zero is refused.
    let (kind, message) = refused(d.close_stdin(id, pid).await);
    assert_eq!(kind, ErrorKind::InvalidRequest, "{message}");
    assert!(message.contains("terminal"), "{message}");
    let (kind, message) = refused(d.resize_pty(id, pid, PtySize { cols: 0, rows: 10 }).await);
    assert_eq!(kind, ErrorKind::InvalidRequest, "a zero size: {message}");
    send(&d, id, pid, b"exit 7\n").await;
    let end = collect(&mut shell).await.end.expect("end");
    assert_eq!(end.exit_code, Some(7));

    // Without a terminal, resizing is refused.
    let mut plain = started(&d, id, start(&["sleep", "1000"])).await;
    let size = PtySize { cols: 80, rows: 24 };
    let (kind, message) = refused(d.resize_pty(id, plain.pid(), size).await);
    assert_eq!(kind, ErrorKind::InvalidRequest, "{message}");
    signalled(&d, id, &mut plain, ProcessSignal::Kill).await;

    common::finish(&d, &[id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_bounds_and_the_policy_refuse_with_clear_errors() {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.max_live_processes = 3;
    let (d, id) = sandbox(&env, config, "aegis-runtime/shell:bookworm").await;

    let mut running = Vec::new();
    for i in 0..3 {
        let mut params = start(&["sleep", "1000"]);
        params.tag = Some(format!("s{i}"));
        running.push(started(&d, id, params).await);
    }
    let (kind, message) = refused(d.start_process(id, start(&["sleep", "1000"])).await);
    assert_eq!(kind, ErrorKind::LimitReached);
    assert!(message.contains("3 live processes"), "{message}");

    // Once one ends, there is room again; a tag in use is refused.
    signalled(&d, id, &mut running[0], ProcessSignal::Kill).await;
    let mut dup = start(&["sleep", "1000"]);
    dup.tag = Some("s1".to_owned());
    let (kind, message) = refused(d.start_process(id, dup).await);
    assert_eq!(kind, ErrorKind::AlreadyExists, "{message}");

    // The program lookup and the kernel's execute rule hold as for cmd.run.
    let (kind, _) = refused(d.start_process(id, start(&["no-such-program"])).await);
    assert_eq!(kind, ErrorKind::CommandNotFound);
    let (kind, _) = refused(d.start_process(id, start(&["/bin/sh"])).await);
    assert_eq!(kind, ErrorKind::InvalidRequest);
    let mut outside = start(&["sh", "-c", "id -u"]);
    outside.exec = ExecGrant::Only(vec!["sh".to_owned()]);
    let mut handle = started(&d, id, outside).await;
    let got = collect(&mut handle).await;
    let end = got.end.clone().expect("end");
    assert_eq!(
        end.exit_code,
        Some(126),
        "the kernel refused to run id: {got:?}"
    );
    assert!(
        String::from_utf8_lossy(&got.stderr).contains("ermission denied"),
        "{got:?}"
    );
    // A working directory outside the read roots.
    let mut elsewhere = start(&["true"]);
    elsewhere.cwd = Some("/etc".to_owned());
    let (kind, _) = refused(d.start_process(id, elsewhere).await);
    assert_eq!(kind, ErrorKind::PathNotAllowed);
    // A process does not run as root.
    let mut handle = started(&d, id, start(&["id", "-u"])).await;
    assert_eq!(collect(&mut handle).await.stdout, b"65534\n");

    common::finish(&d, &[id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn processes_die_with_the_sandbox() {
    let env = TestEnv::new().await;
    let (d, id) = sandbox(&env, env.config(), IMAGE).await;

    let mut handle = started(
        &d,
        id,
        start(&["sh", "-c", "setsid sleep 1006 & sleep 1007"]),
    )
    .await;
    // What an audit of the process's end would hold on to: a handle that only waits for it.
    let mut audit = attach(&d, id, ProcessSelector::Pid(handle.pid())).await;
    within(60, "destroy", d.destroy(id)).await.expect("destroy");
    let audited = within(10, "the end", audit.wait_end())
        .await
        .expect("an end");
    assert!(audited.error.is_some(), "{audited:?}");
    let end = collect(&mut handle).await.end.expect("end");
    assert!(
        end.error
            .as_deref()
            .is_some_and(|e| e.contains("sandbox is gone")),
        "{end:?}"
    );
    assert_eq!(end.exit_code, None);
    let sandbox_label = label(labels::SANDBOX, id);
    assert!(env.containers_with(&[&sandbox_label]).await.is_empty());
    // Nothing of the sandbox runs on the host any more (its processes lived in its pid
    // namespace, which went with the container).
    let host = std::process::Command::new("pgrep")
        .args(["-f", "sleep 100[67]"])
        .output()
        .expect("pgrep on the host");
    assert!(
        host.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&host.stdout)
    );
    match d.start_process(id, start(&["true"])).await {
        Err(DispatchError::SandboxGone { .. } | DispatchError::SandboxNotFound { .. }) => {}
        other => panic!("starting in a destroyed sandbox: {other:?}"),
    }
    d.shutdown().await;
}

/// The next change a watch reports (skipping `chmod`s, which some writes cause too).
async fn next_change(watch: &mut WatchHandle) -> (FsOp, String) {
    loop {
        match within(20, "the next watch event", watch.next()).await {
            Some(WatchEvent::Fs(event)) if event.op == FsOp::Chmod => {}
            Some(WatchEvent::Fs(event)) => return (event.op, event.path),
            other => panic!("expected a change, got {other:?}"),
        }
    }
}

/// The next changes are these, in order (paths relative to `/workspace`).
async fn expect_changes(watch: &mut WatchHandle, expected: &[(FsOp, &str)]) {
    for (op, path) in expected {
        let want = (*op, format!("/workspace/{path}"));
        assert_eq!(next_change(watch).await, want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watch_sees_changes_beneath_its_root_and_nothing_outside_the_roots_is_watched() {
    let env = TestEnv::new().await;
    let mut config = env.config();
    config.max_watches = 2;
    let (d, id) = sandbox(&env, config, IMAGE).await;
    let write = |path: &str| {
        Op::FsWrite(WriteParams {
            path: path.to_owned(),
            content: "x".to_owned(),
            encoding: dispatcher::protocol::Encoding::Utf8,
            create_dirs: true,
            append: false,
            metadata: Default::default(),
            user: Default::default(),
        })
    };

    let mut watch = within(10, "watch", d.watch_dir(id, "/workspace", true))
        .await
        .expect("watch");
    assert_eq!(watch.path(), "/workspace");
    within(10, "write", d.call(id, write("a.txt")))
        .await
        .expect("write");
    // fs.write writes a temporary file and renames it over the name: the watch reports the
    // name created and written, never the temporary file.
    let written = [(FsOp::Create, "a.txt"), (FsOp::Write, "a.txt")];
    expect_changes(&mut watch, &written).await;
    // A command's changes, in a new subdirectory (watched because the watch is recursive).
    run(&d, id, &["mkdir", "sub"]).await;
    expect_changes(&mut watch, &[(FsOp::Create, "sub")]).await;
    run(&d, id, &["sh", "-c", "echo hi > sub/b.txt"]).await;
    let written = [(FsOp::Create, "sub/b.txt"), (FsOp::Write, "sub/b.txt")];
    expect_changes(&mut watch, &written).await;
    run(&d, id, &["mv", "sub/b.txt", "c.txt"]).await;
    let moved = [(FsOp::Rename, "sub/b.txt"), (FsOp::Create, "c.txt")];
    expect_changes(&mut watch, &moved).await;
    run(&d, id, &["rm", "c.txt"]).await;
    expect_changes(&mut watch, &[(FsOp::Remove, "c.txt")]).await;

    // Outside the read roots, through `..` or a symlink: refused.
    let (kind, _) = refused(d.watch_dir(id, "/etc", false).await);
    assert_eq!(kind, ErrorKind::PathNotAllowed);
    let (kind, _) = refused(d.watch_dir(id, "../etc", false).await);
    assert_eq!(kind, ErrorKind::PathNotAllowed);
    run(&d, id, &["ln", "-s", "/etc", "link"]).await;
    let (kind, _) = refused(d.watch_dir(id, "link", false).await);
    assert_eq!(kind, ErrorKind::PathNotAllowed);
    let (kind, _) = refused(d.watch_dir(id, "missing", false).await);
    assert_eq!(kind, ErrorKind::NotFound);

    // The bound: two watches at once.
    let second = within(10, "watch", d.watch_dir(id, "sub", false))
        .await
        .expect("second");
    let (kind, message) = refused(d.watch_dir(id, "/workspace", false).await);
    assert_eq!(kind, ErrorKind::LimitReached, "{message}");
    // Dropping a handle removes its watch, which makes room again.
    drop(second);
    eventually(20, "room for a watch again", || async {
        match d.watch_dir(id, "sub", false).await {
            Ok(mut third) => {
                // Removing its directory ends it.
                run(&d, id, &["rm", "-r", "sub"]).await;
                let reason = watch_end(&mut third, 20).await;
                assert!(reason.contains("removed"), "{reason}");
                true
            }
            Err(_) => false,
        }
    })
    .await;

    // The sandbox going ends the watch.
    within(60, "destroy", d.destroy(id)).await.expect("destroy");
    let reason = watch_end(&mut watch, 10).await;
    assert!(reason.contains("sandbox is gone"), "{reason}");
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recursive_watch_misses_nothing_made_beneath_it_and_a_sync_drains_what_came_before() {
    let env = TestEnv::new().await;
    let (d, id) = sandbox(&env, env.config(), IMAGE).await;
    let mut watch = within(10, "watch", d.watch_dir(id, "/workspace", true))
        .await
        .expect("watch");
    // One command makes a tree and a file in it, before any watch of theirs can exist.
    run(
        &d,
        id,
        &["sh", "-c", "mkdir -p deep/er && echo hi > deep/er/f.txt"],
    )
    .await;
    // Once synced, every change made before is there, read without waiting.
    let synced = within(10, "sync", watch.sync(std::time::Duration::from_secs(10)))
        .await
        .expect("sync");
    assert!(synced);
    let mut seen = Vec::new();
    while let Some(event) = watch.try_next() {
        match event {
            WatchEvent::Fs(e) => seen.push((e.op, e.path)),
            other => panic!("unexpected {other:?}"),
        }
    }
    for (op, path) in [
        (FsOp::Create, "deep"),
        (FsOp::Create, "deep/er"),
        (FsOp::Create, "deep/er/f.txt"),
        (FsOp::Write, "deep/er/f.txt"),
    ] {
        let want = (op, format!("/workspace/{path}"));
        assert!(seen.contains(&want), "{want:?} in {seen:?}");
    }
    // ... and the new directories are watched: a change deep in them comes as usual.
    run(&d, id, &["sh", "-c", "echo more > deep/er/g.txt"]).await;
    assert_eq!(
        next_change(&mut watch).await,
        (FsOp::Create, "/workspace/deep/er/g.txt".to_owned())
    );
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_export_reads_the_files_and_thaws_the_sandbox() {
    let env = TestEnv::new().await;
    let (d, id) = sandbox(&env, env.config(), IMAGE).await;
    run(&d, id, &["sh", "-c", "echo hi > kept.txt"]).await;
    let (archive, held) = within(
        30,
        "frozen export",
        d.export_dir_frozen(id, "/workspace", 1 << 20),
    )
    .await
    .expect("export");
    assert!(archive.windows(8).any(|w| w == b"kept.txt"));
    // What it read is counted against the node's memory bound until dropped.
    assert!(held.bytes() >= archive.len() as u64);
    let before = d.memory().available();
    drop(held);
    assert!(d.memory().available() > before);
    // Thawed: the engine says so, and calls run again.
    let paused = std::process::Command::new("docker")
        .args([
            "ps",
            "-q",
            "--filter",
            &format!("label=org.aegis.sandbox={id}"),
            "--filter",
            "status=paused",
        ])
        .output()
        .expect("docker runs");
    assert!(paused.stdout.is_empty(), "left paused");
    run(&d, id, &["true"]).await;
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_adopting_instance_follows_the_live_processes_of_the_previous_one() {
    let env = TestEnv::new().await;
    let (previous, first, config) = env.started_with(common::adoptable).await;
    let spec = SandboxSpec::new(IMAGE, Owner::new(OwnerKind::Execution, "live-adopt"));
    let id = within(60, "create", first.create(spec))
        .await
        .expect("create");
    let handle = started(&first, id, echo("kept")).await;
    let pid = handle.pid();
    drop(handle);
    drop(first);

    let second = env.start(env.new_instance().await, config).await;
    let report = common::adopted(&second, previous).await;
    assert_eq!(report.adopted, vec![id]);
    let mut kept = attach(&second, id, ProcessSelector::Tag("kept".to_owned())).await;
    assert_eq!(kept.pid(), pid);
    send(&second, id, pid, b"after\n").await;
    assert_eq!(read_until(&mut kept, "after\n").await, "after\n");
    close(&second, id, pid).await;
    assert_eq!(
        collect(&mut kept).await.end.expect("end").exit_code,
        Some(0)
    );

    within(60, "destroy", second.destroy(id))
        .await
        .expect("destroy");
    second.shutdown().await;
}

/// A process start is a call in flight like any other: once a graceful stop began, a start in
/// a sandbox this instance still holds is refused as `ShuttingDown` (which a peer takes as "hand
/// it over"), while the stop waits for the call already running, which still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_start_during_a_graceful_stop_is_refused_as_shutting_down() {
    let env = TestEnv::new().await;
    let (d, id) = sandbox(&env, env.config(), IMAGE).await;
    let d = std::sync::Arc::new(d);
    // A call in flight holds the stop's drain open.
    let slow = tokio::spawn({
        let d = d.clone();
        async move { d.call(id, common::run_for(&["sleep", "4"], 20_000)).await }
    });
    let container = format!("aegis-sbx-{id}");
    eventually(20, "the slow call runs", || async {
        let ps = std::process::Command::new("docker")
            .args(["exec", &container, "ps", "-o", "args"])
            .output()
            .expect("docker exec");
        String::from_utf8_lossy(&ps.stdout).contains("sleep 4")
    })
    .await;
    let stopping = tokio::spawn({
        let d = d.clone();
        async move { d.shutdown().await }
    });
    eventually(10, "new calls are refused", || {
        let d = d.clone();
        async move {
            matches!(
                d.call(id, common::run_for(&["true"], 5_000)).await,
                Err(DispatchError::ShuttingDown)
            )
        }
    })
    .await;
    match d.start_process(id, start(&["true"])).await {
        Err(DispatchError::ShuttingDown) => {}
        other => panic!("a process start during the stop: {other:?}"),
    }
    let answered = within(30, "the call in flight", slow)
        .await
        .expect("the slow call's task");
    assert!(
        answered.is_ok(),
        "the call in flight answered: {answered:?}"
    );
    within(60, "the stop", stopping).await.expect("the stop");
}
