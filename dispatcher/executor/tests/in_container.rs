//! The executor in a real hardened container, driven over its stdin/stdout like the dispatcher.
//!
//! These tests build nothing. They need the static binary in `SANDBOX_EXECUTOR_BIN`, a reachable
//! Docker engine and the image `SANDBOX_TEST_IMAGE` (default `aegis-runtime/busybox:1`); without
//! any of these they fail with a message saying what is missing. Each test starts its own
//! container (hardened as the design requires) with its own volumes, labelled
//! `org.aegis.test=executor`, and removes them at the end, even when it fails.
//!
//! Security checks are concrete attacks with expected refusals, checked from inside the sandbox
//! too where there is something to see (the file was not written, the process is gone).
//!
//! Run: see `dispatcher/executor/README.md` ("Testing").

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const DEFAULT_IMAGE: &str = "aegis-runtime/busybox:1";
const LABEL: &str = "org.aegis.test=executor";
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(120);

fn random_suffix() -> String {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("{:012x}", hasher.finish() & 0xffff_ffff_ffff)
}

fn docker(args: &[&str]) -> std::process::Output {
    Command::new("docker")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the docker CLI ({e}); these tests need Docker"))
}

fn docker_ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(
        out.status.success(),
        "docker {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the tests need from the environment, checked loudly.
struct Requirements {
    binary: String,
    image: String,
}

fn requirements() -> Requirements {
    let binary = std::env::var("SANDBOX_EXECUTOR_BIN").unwrap_or_else(|_| {
        panic!(
            "SANDBOX_EXECUTOR_BIN is not set: build the static executor and point it there, e.g.\n  \
             RUSTFLAGS=\"-C target-feature=+crt-static\" cargo build --release -p sandbox-executor \
             --target x86_64-unknown-linux-gnu\n  \
             export SANDBOX_EXECUTOR_BIN=$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/sandbox-executor"
        )
    });
    assert!(
        std::path::Path::new(&binary).is_file(),
        "SANDBOX_EXECUTOR_BIN={binary} does not name a file"
    );
    let image = std::env::var("SANDBOX_TEST_IMAGE").unwrap_or_else(|_| DEFAULT_IMAGE.to_string());
    let version = docker(&["version", "--format", "{{.Server.Version}}"]);
    assert!(
        version.status.success(),
        "the Docker engine is not reachable: {}",
        String::from_utf8_lossy(&version.stderr)
    );
    let inspect = docker(&["image", "inspect", "--format", "{{.Id}}", &image]);
    assert!(
        inspect.status.success(),
        "the test image {image} does not exist (set SANDBOX_TEST_IMAGE, or build it with runtime-images/build.sh)"
    );
    Requirements { binary, image }
}

type Inbox = Arc<(Mutex<HashMap<u64, (Value, Instant)>>, Condvar)>;
/// Event lines (`{"event":ID,...}`) in the order they came.
type Events = Arc<(Mutex<Vec<Value>>, Condvar)>;

/// One hardened container running the executor, with the protocol stream attached.
struct Sandbox {
    name: String,
    volumes: [String; 2],
    image: String,
    docker_run: Child,
    stdin: Mutex<Option<ChildStdin>>,
    inbox: Inbox,
    events: Events,
    stderr: Arc<Mutex<String>>,
    next_id: AtomicU64,
}

impl Sandbox {
    fn start() -> Sandbox {
        Self::start_with(&[])
    }

    /// [`Sandbox::start`] with more `docker run` arguments (a config, capabilities).
    fn start_with(extra: &[&str]) -> Sandbox {
        let req = requirements();
        let suffix = random_suffix();
        let name = format!("executor-test-{suffix}");
        let exec_volume = format!("executor-test-bin-{suffix}");
        let ws_volume = format!("executor-test-ws-{suffix}");
        for volume in [&exec_volume, &ws_volume] {
            docker_ok(&["volume", "create", "--label", LABEL, volume]);
        }
        // Deliver the binary: a stopped helper container mounts the volume, `docker cp` fills it.
        let helper = format!("executor-test-helper-{suffix}");
        docker_ok(&[
            "create",
            "--name",
            &helper,
            "--label",
            LABEL,
            "-v",
            &format!("{exec_volume}:/opt/sandbox"),
            &req.image,
        ]);
        let copied = docker(&[
            "cp",
            &req.binary,
            &format!("{helper}:/opt/sandbox/sandbox-executor"),
        ]);
        docker(&["rm", "-f", &helper]);
        assert!(
            copied.status.success(),
            "docker cp failed: {}",
            String::from_utf8_lossy(&copied.stderr)
        );

        let mut docker_run = Command::new("docker")
            .args([
                "run",
                "-i",
                "--rm",
                "--name",
                &name,
                "--label",
                LABEL,
                "--cap-drop",
                "ALL",
                "--cap-add",
                "SETUID",
                "--cap-add",
                "SETGID",
                "--cap-add",
                "KILL",
                "--cap-add",
                "CHOWN",
                "--security-opt",
                "no-new-privileges",
                "--read-only",
                "--tmpfs",
                "/tmp",
                "--network",
                "none",
                "--pids-limit",
                "256",
                "--memory",
                "256m",
                "-v",
                &format!("{exec_volume}:/opt/sandbox:ro"),
                "-v",
                // nocopy: the workspace starts root-owned, so the executor's chown is exercised.
                &format!("{ws_volume}:/workspace:nocopy"),
            ])
            .args(extra)
            .args(["--entrypoint", "/opt/sandbox/sandbox-executor", &req.image])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start docker run");
        let stdin = docker_run.stdin.take();
        let stdout = docker_run.stdout.take().expect("piped stdout");
        let stderr_pipe = docker_run.stderr.take().expect("piped stderr");

        let inbox: Inbox = Arc::default();
        let reader_inbox = Arc::clone(&inbox);
        let events: Events = Arc::default();
        let reader_events = Arc::clone(&events);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("executor wrote a non-JSON line ({e}): {line}"));
                if line.starts_with("{\"event\":") {
                    let (list, cv) = &*reader_events;
                    list.lock().unwrap().push(value);
                    cv.notify_all();
                    continue;
                }
                let id = value["id"].as_u64().expect("every response has an id");
                let (map, cv) = &*reader_inbox;
                map.lock().unwrap().insert(id, (value, Instant::now()));
                cv.notify_all();
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let stderr_sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr_pipe).lines().map_while(Result::ok) {
                let mut log = stderr_sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });

        let sandbox = Sandbox {
            name,
            volumes: [exec_volume, ws_volume],
            image: req.image,
            docker_run,
            stdin: Mutex::new(stdin),
            inbox,
            events,
            stderr,
            next_id: AtomicU64::new(1),
        };
        let ready = sandbox.wait(0);
        assert_eq!(ready["ok"]["ready"], json!(true), "bad ready line: {ready}");
        assert_eq!(ready["ok"]["pid"], json!(1), "the executor must be PID 1");
        sandbox
    }

    /// Sends a request (an object without `id`); returns the id used.
    fn send(&self, mut request: Value) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        request["id"] = json!(id);
        self.send_raw(&request.to_string());
        id
    }

    fn send_raw(&self, line: &str) {
        let mut guard = self.stdin.lock().unwrap();
        let stdin = guard.as_mut().expect("stdin is open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .expect("cannot write to the executor");
    }

    /// Waits (up to [`RESPONSE_TIMEOUT`]) until `take` finds what it looks for in what `shared`
    /// guards, woken by its condition variable; fails with `missing` (what is there so far) and
    /// the executor's stderr otherwise.
    fn wait_on<T, R>(
        &self,
        shared: &(Mutex<T>, Condvar),
        missing: impl Fn(&T) -> String,
        mut take: impl FnMut(&mut T) -> Option<R>,
    ) -> R {
        let (lock, cv) = shared;
        let deadline = Instant::now() + RESPONSE_TIMEOUT;
        let mut guard = lock.lock().unwrap();
        loop {
            if let Some(found) = take(&mut guard) {
                return found;
            }
            let now = Instant::now();
            assert!(
                now < deadline,
                "{} within {RESPONSE_TIMEOUT:?}; executor stderr:\n{}",
                missing(&guard),
                self.stderr.lock().unwrap()
            );
            guard = cv.wait_timeout(guard, deadline - now).unwrap().0;
        }
    }

    fn wait_timed(&self, id: u64) -> (Value, Instant) {
        self.wait_on(
            &self.inbox,
            |_| format!("no response to request {id}"),
            |inbox| inbox.remove(&id),
        )
    }

    /// Waits until the events of request `id` satisfy `done`; returns them all.
    fn events_until(&self, id: u64, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let of_id = |all: &Vec<Value>| -> Vec<Value> {
            all.iter()
                .filter(|e| e["event"] == json!(id))
                .cloned()
                .collect()
        };
        self.wait_on(
            &self.events,
            |all| format!("events of {id} incomplete: {:?}", of_id(all)),
            |all| Some(of_id(all)).filter(|mine| done(mine)),
        )
    }

    fn wait(&self, id: u64) -> Value {
        self.wait_timed(id).0
    }

    fn call(&self, request: Value) -> Value {
        let id = self.send(request);
        self.wait(id)
    }

    /// Calls and expects success; returns the `ok` object.
    fn ok(&self, request: Value) -> Value {
        let response = self.call(request.clone());
        match response.get("ok") {
            Some(ok) => ok.clone(),
            None => panic!("{request} failed: {response}"),
        }
    }

    /// Calls and expects an error of `kind`; returns the message.
    fn refused(&self, request: Value, kind: &str) -> String {
        let response = self.call(request.clone());
        assert_eq!(
            response["error"]["kind"],
            json!(kind),
            "{request} should fail with {kind}, got {response}"
        );
        response["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// [`Sandbox::refused`] for each of `cases`: (request, the kind of error it must get).
    fn refuses_each(&self, cases: &[(Value, &str)]) {
        for (request, kind) in cases {
            self.refused(request.clone(), kind);
        }
    }

    /// A `cmd.run` that may execute any program (test scaffolding: listings, set-up); the
    /// kernel-held execute rules are tested with explicit grants.
    fn run_request(argv: &[&str]) -> Value {
        json!({"op": "cmd.run", "argv": argv, "timeout_ms": 30000, "exec": "any",
               "max_stdout_bytes": 1048576, "max_stderr_bytes": 65536})
    }

    /// Runs a command (expected to be spawned); returns the result object.
    fn run(&self, argv: &[&str]) -> Value {
        self.ok(Self::run_request(argv))
    }

    /// Runs a command and returns its stdout, asserting exit 0.
    fn sh(&self, argv: &[&str]) -> String {
        let result = self.run(argv);
        assert_eq!(result["exit_code"], json!(0), "{argv:?}: {result}");
        result["stdout"].as_str().unwrap_or_default().to_string()
    }

    fn close_stdin(&self) {
        self.stdin.lock().unwrap().take();
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- executor stderr ({}) ---\n{}",
                self.name,
                self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
            );
        }
        self.close_stdin();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.docker_run.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = docker(&["rm", "-f", &self.name]);
        let _ = self.docker_run.kill();
        let _ = self.docker_run.wait();
        for volume in &self.volumes {
            let _ = docker(&["volume", "rm", "-f", volume]);
        }
    }
}

/// A process seen in the sandbox's `/proc`.
#[derive(Debug)]
struct Process {
    state: String,
    cmdline: String,
}

/// The sandbox's processes, read from `/proc` by its own shell (images need not have `ps`).
fn processes(sandbox: &Sandbox) -> Vec<Process> {
    let listing = sandbox.sh(&[
        "sh",
        "-c",
        "for d in /proc/[0-9]*; do printf '%s|' \"$(cat $d/stat 2>/dev/null)\"; \
         tr '\\0' ' ' < $d/cmdline 2>/dev/null; echo; done",
    ]);
    listing
        .lines()
        .filter_map(|line| {
            let (stat, cmdline) = line.split_once('|')?;
            let state = stat.rsplit_once(')')?.1.split_whitespace().next()?;
            Some(Process {
                state: state.to_string(),
                cmdline: cmdline.trim().to_string(),
            })
        })
        .collect()
}

#[test]
fn every_fs_operation_works() {
    let s = Sandbox::start();

    let w = s.ok(json!({"op":"fs.write","path":"src/main.rs","content":"fn main() {\n    println!(\"hi\");\n}\n"}));
    assert_eq!(w, json!({"bytes_written": 34, "created": true}));
    let w = s.ok(json!({"op":"fs.write","path":"/workspace/src/main.rs","content":"fn main() {\n    println!(\"hello\");\n}\n"}));
    assert_eq!(w["created"], json!(false));

    let r = s.ok(json!({"op":"fs.read","path":"src/main.rs"}));
    assert_eq!(
        r["content"],
        json!("fn main() {\n    println!(\"hello\");\n}\n")
    );
    assert_eq!(r["encoding"], json!("utf8"));
    assert_eq!(r["size_bytes"], json!(37));
    assert_eq!(r["truncated"], json!(false));
    let r = s.ok(json!({"op":"fs.read","path":"src/main.rs","offset":1,"limit":1}));
    assert_eq!(r["content"], json!("    println!(\"hello\");\n"));
    assert_eq!(
        (r["lines_read"].clone(), r["truncated"].clone()),
        (json!(1), json!(true))
    );
    let r = s.ok(json!({"op":"fs.read","path":"src/main.rs","max_bytes":4}));
    assert_eq!(
        (r["content"].clone(), r["truncated"].clone()),
        (json!("fn m"), json!(true))
    );

    // Binary content round-trips as base64.
    s.ok(json!({"op":"fs.write","path":"bin/blob","content":"AP+AAQ==","encoding":"base64"}));
    let r = s.ok(json!({"op":"fs.read","path":"bin/blob"}));
    assert_eq!(
        (r["content"].clone(), r["encoding"].clone()),
        (json!("AP+AAQ=="), json!("base64"))
    );

    s.refuses_each(&[
        (
            json!({"op":"fs.write","path":"nodir/x","content":"","create_dirs":false}),
            "not_found",
        ),
        (
            json!({"op":"fs.write","path":"src","content":"x"}),
            "is_a_directory",
        ),
        (
            json!({"op":"fs.write","path":"big","content":"x".repeat(10 * 1024 * 1024 + 1)}),
            "too_large",
        ),
        (json!({"op":"fs.read","path":"missing.txt"}), "not_found"),
        (json!({"op":"fs.read","path":"src"}), "is_a_directory"),
    ]);

    assert_eq!(
        s.ok(json!({"op":"fs.create_dir","path":"a/b/c"})),
        json!({"created": true})
    );
    assert_eq!(
        s.ok(json!({"op":"fs.create_dir","path":"a/b/c"})),
        json!({"created": false})
    );
    s.refused(
        json!({"op":"fs.create_dir","path":"src/main.rs"}),
        "already_exists",
    );

    // Name, type and size; the stat details are checked below.
    let brief =
        |e: &Value| json!({"name": e["name"], "type": e["type"], "size_bytes": e["size_bytes"]});
    let l = s.ok(json!({"op":"fs.list","path":"."}));
    assert_eq!(
        l["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(brief)
            .collect::<Vec<_>>(),
        [
            json!({"name":"a","type":"directory","size_bytes":0}),
            json!({"name":"bin","type":"directory","size_bytes":0}),
            json!({"name":"src","type":"directory","size_bytes":0}),
        ]
    );
    let dir = &l["entries"][2];
    assert!(dir["inode_size"].as_u64().unwrap() > 0, "{dir}");
    assert_eq!(dir["mode"].as_u64().unwrap() & 0o700, 0o700, "{dir}");
    s.sh(&["ln", "-s", "main.rs", "src/link.rs"]);
    let l = s.ok(json!({"op":"fs.list","path":"src"}));
    assert_eq!(
        brief(&l["entries"][0]),
        json!({"name":"link.rs","type":"symlink","size_bytes":0})
    );
    assert_eq!(l["entries"][0]["link_target"], json!("main.rs"));
    let file = &l["entries"][1];
    assert_eq!(
        brief(file),
        json!({"name":"main.rs","type":"file","size_bytes":37})
    );
    assert_eq!(file["mode"], json!(0o644), "{file}");
    assert_eq!(file["inode_size"], json!(37));
    assert!(file.get("link_target").is_none(), "{file}");
    // Written within the last day, by the clock the sandbox shares with this host.
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let modified = file["modified_ns"].as_i64().unwrap();
    assert!((now_ns - modified).abs() < 86_400 * 1_000_000_000, "{file}");
    // A relative symlink that stays inside the root is followed for reading.
    let r = s.ok(json!({"op":"fs.read","path":"src/link.rs","limit":1}));
    assert_eq!(r["content"], json!("fn main() {\n"));
    s.refused(
        json!({"op":"fs.list","path":"src/main.rs"}),
        "not_a_directory",
    );

    let e = s
        .ok(json!({"op":"fs.edit","path":"src/main.rs","old_string":"hello","new_string":"world"}));
    assert_eq!(e, json!({"replacements": 1}));
    let msg = s.refused(
        json!({"op":"fs.edit","path":"src/main.rs","old_string":"absent","new_string":"x"}),
        "edit_target_not_found",
    );
    assert!(msg.contains("src/main.rs"), "{msg}");
    s.ok(json!({"op":"fs.write","path":"dup.txt","content":"x x x\n"}));
    let msg = s.refused(
        json!({"op":"fs.edit","path":"dup.txt","old_string":"x","new_string":"y"}),
        "edit_target_ambiguous",
    );
    assert!(msg.contains("3 times"), "{msg}");
    let m = s.ok(json!({"op":"fs.multi_edit","path":"src/main.rs","edits":[
        {"old_string":"world","new_string":"there"},
        {"old_string":"fn main","new_string":"pub fn main"}]}));
    assert_eq!(m, json!({"replacements": 2}));
    let msg = s.refused(
        json!({"op":"fs.multi_edit","path":"src/main.rs","edits":[
        {"old_string":"there","new_string":"again"},
        {"old_string":"not present","new_string":"x"}]}),
        "edit_target_not_found",
    );
    assert!(msg.starts_with("edit 1:"), "{msg}");
    let r = s.ok(json!({"op":"fs.read","path":"src/main.rs"}));
    assert_eq!(
        r["content"],
        json!("pub fn main() {\n    println!(\"there\");\n}\n"),
        "all or nothing"
    );

    s.ok(json!({"op":"fs.write","path":"a/b/notes.md","content":"one\nTwo there\nthree\n"}));
    let g = s.ok(json!({"op":"fs.grep","pattern":"there","path":"."}));
    // src/link.rs is a symlink to main.rs: grep does not follow it.
    assert_eq!(
        g["matches"],
        json!([
            {"file":"/workspace/a/b/notes.md","line":2,"text":"Two there"},
            {"file":"/workspace/src/main.rs","line":2,"text":"    println!(\"there\");"}
        ]),
        "{g}"
    );
    assert_eq!(g["truncated"], json!(false));
    let g = s.ok(json!({"op":"fs.grep","pattern":"^two","path":".","case_insensitive":true,"include":"*.md"}));
    assert_eq!(g["matches"].as_array().map(Vec::len), Some(1), "{g}");
    assert_eq!(g["files_scanned"], json!(1));
    let g = s.ok(json!({"op":"fs.grep","pattern":"e","path":".","max_matches":2}));
    assert_eq!(
        (
            g["matches"].as_array().map(Vec::len),
            g["truncated"].clone()
        ),
        (Some(2), json!(true))
    );
    let g = s.ok(json!({"op":"fs.grep","pattern":".","path":"bin"}));
    assert_eq!(
        g["files_scanned"],
        json!(0),
        "binary files are skipped: {g}"
    );
    s.refused(
        json!({"op":"fs.grep","pattern":"(","path":"."}),
        "invalid_request",
    );

    let gl = s.ok(json!({"op":"fs.glob","pattern":"**/*.rs"}));
    assert_eq!(
        gl["matches"],
        json!(["/workspace/src/link.rs", "/workspace/src/main.rs"])
    );
    let gl = s.ok(json!({"op":"fs.glob","pattern":"*/b","path":"/workspace"}));
    assert_eq!(gl["matches"], json!(["/workspace/a/b"]));
    let gl = s.ok(json!({"op":"fs.glob","pattern":"*.md","path":"a/b"}));
    assert_eq!(gl["matches"], json!(["/workspace/a/b/notes.md"]));

    // Files created through the executor belong to the sandbox user.
    let owners = s.sh(&[
        "stat",
        "-c",
        "%u:%g %n",
        "src/main.rs",
        "a/b/c",
        "a",
        "bin/blob",
        "/workspace",
    ]);
    for line in owners.lines() {
        assert!(line.starts_with("65534:65534 "), "wrong owner: {owners}");
    }

    s.refused(json!({"op":"fs.delete","path":"a"}), "directory_not_empty");
    assert_eq!(
        s.ok(json!({"op":"fs.delete","path":"a/b/c"})),
        json!({"deleted": true})
    );
    s.sh(&["ln", "-s", "/workspace/src", "srclink"]);
    assert_eq!(
        s.ok(json!({"op":"fs.delete","path":"srclink","recursive":true})),
        json!({"deleted": true})
    );
    assert!(
        s.sh(&["ls", "src"]).contains("main.rs"),
        "deleting a symlink keeps its target"
    );
    assert_eq!(
        s.ok(json!({"op":"fs.delete","path":"a","recursive":true})),
        json!({"deleted": true})
    );
    assert_eq!(
        s.ok(json!({"op":"fs.delete","path":"src/main.rs"})),
        json!({"deleted": true})
    );
    s.refuses_each(&[
        (json!({"op":"fs.delete","path":"src/main.rs"}), "not_found"),
        (
            json!({"op":"fs.delete","path":"/workspace","recursive":true}),
            "path_not_allowed",
        ),
        (json!({"op":"fs.delete","path":"."}), "path_not_allowed"),
    ]);
    assert_eq!(s.sh(&["ls"]), "bin\ndup.txt\nsrc\n");
}

#[test]
fn byte_ranges_and_appends_move_files_in_chunks() {
    let s = Sandbox::start();
    // "aé" is 61 c3 a9: a chunk that ends inside the é comes back exactly, as base64.
    s.ok(json!({"op":"fs.write","path":"c.txt","content":"aéz"}));
    for (offset, content, truncated) in [(0, "YcM=", true), (2, "qXo=", false)] {
        let r = s.ok(json!({"op":"fs.read","path":"c.txt","byte_offset":offset,"max_bytes":2}));
        assert_eq!(
            (
                r["content"].clone(),
                r["encoding"].clone(),
                r["truncated"].clone()
            ),
            (json!(content), json!("base64"), json!(truncated)),
            "from byte {offset}"
        );
    }
    let r = s.ok(json!({"op":"fs.read","path":"c.txt","byte_offset":9}));
    assert_eq!(
        (r["content"].clone(), r["truncated"].clone()),
        (json!(""), json!(false))
    );
    assert!(s
        .refused(
            json!({"op":"fs.read","path":"c.txt","byte_offset":0,"limit":1}),
            "invalid_request"
        )
        .contains("byte_offset"));

    // Appends add to the file; they never create one, nor write through a link.
    s.ok(json!({"op":"fs.write","path":"c.txt","content":"!!","append":true}));
    let r = s.ok(json!({"op":"fs.read","path":"c.txt"}));
    assert_eq!(r["content"], json!("aéz!!"));
    s.refused(
        json!({"op":"fs.write","path":"missing.txt","content":"x","append":true}),
        "not_found",
    );
    s.sh(&["ln", "-s", "c.txt", "l.txt"]);
    s.refused(
        json!({"op":"fs.write","path":"l.txt","content":"x","append":true}),
        "path_not_allowed",
    );
    s.sh(&["ln", "c.txt", "h.txt"]);
    s.refused(
        json!({"op":"fs.write","path":"h.txt","content":"x","append":true}),
        "hard_link_refused",
    );
}

#[test]
fn path_escapes_are_refused() {
    let s = Sandbox::start();
    s.ok(json!({"op":"fs.write","path":"ok.txt","content":"fine\n"}));
    s.sh(&["ln", "-s", "/etc/passwd", "abs"]);
    s.sh(&["ln", "-s", "../etc/passwd", "rel"]);
    s.sh(&["ln", "-s", "/etc", "etcdir"]);
    s.sh(&["ln", "-s", "/tmp", "tmpdir"]);
    s.sh(&["ln", "-s", "../../../../tmp", "reltmp"]);
    s.sh(&["ln", "-s", "/proc/self/root", "procroot"]);
    s.sh(&["ln", "-s", "ok.txt", "inside"]);

    for path in [
        "../etc/passwd",
        "/etc/passwd",
        "/workspacex/a",
        "/workspace/../etc/passwd",
        "abs",
        "rel",
        "etcdir/passwd",
        "procroot/etc/passwd",
        "/proc/self/root/etc/passwd",
        "/proc/1/root/etc/passwd",
    ] {
        let msg = s.refused(json!({"op":"fs.read","path":path}), "path_not_allowed");
        assert!(!msg.contains("root:x:0"), "{msg}");
    }
    s.refuses_each(&[
        (json!({"op":"fs.list","path":"etcdir"}), "path_not_allowed"),
        (
            json!({"op":"fs.list","path":"procroot"}),
            "path_not_allowed",
        ),
        (
            json!({"op":"fs.read","path":"ok\u{0}.txt"}),
            "invalid_request",
        ),
        (
            json!({"op":"fs.read","path":"x".repeat(256)}),
            "invalid_request",
        ),
        (
            json!({"op":"fs.read","path":"a/".repeat(2100)}),
            "invalid_request",
        ),
    ]);
    // A symlink that stays inside is fine.
    assert_eq!(
        s.ok(json!({"op":"fs.read","path":"inside"}))["content"],
        json!("fine\n")
    );

    // Writes through links that leave the root land nowhere; /tmp is writable by the sandbox
    // user, so an escape would be visible there.
    for path in [
        "tmpdir/escaped",
        "reltmp/escaped",
        "/tmp/escaped",
        "procroot/tmp/escaped",
    ] {
        s.refuses_each(&[
            (
                json!({"op":"fs.write","path":path,"content":"x"}),
                "path_not_allowed",
            ),
            (
                json!({"op":"fs.create_dir","path":path}),
                "path_not_allowed",
            ),
        ]);
    }
    s.refuses_each(&[
        (
            json!({"op":"fs.write","path":"abs","content":"x"}),
            "path_not_allowed",
        ),
        (
            json!({"op":"fs.edit","path":"abs","old_string":"root","new_string":"x"}),
            "path_not_allowed",
        ),
        (
            json!({"op":"fs.delete","path":"tmpdir/x"}),
            "path_not_allowed",
        ),
    ]);
    assert_eq!(s.sh(&["ls", "-A", "/tmp"]), "", "nothing escaped into /tmp");

    // Hard links: the write is refused and the original is untouched.
    s.sh(&["ln", "ok.txt", "hard.txt"]);
    let msg = s.refused(
        json!({"op":"fs.write","path":"hard.txt","content":"changed"}),
        "hard_link_refused",
    );
    assert!(msg.contains("hard.txt"), "{msg}");
    s.refused(
        json!({"op":"fs.edit","path":"ok.txt","old_string":"fine","new_string":"x"}),
        "hard_link_refused",
    );
    assert_eq!(s.sh(&["cat", "ok.txt"]), "fine\n");

    // Searching never follows links out of the root.
    let g = s.ok(json!({"op":"fs.grep","pattern":"root:","path":"."}));
    assert_eq!(g["matches"], json!([]), "{g}");
    let gl = s.ok(json!({"op":"fs.glob","pattern":"**/passwd"}));
    assert_eq!(gl["matches"], json!([]), "{gl}");
    s.refuses_each(&[
        (json!({"op":"fs.glob","pattern":"../*"}), "path_not_allowed"),
        (
            json!({"op":"fs.grep","pattern":"x","path":"etcdir"}),
            "path_not_allowed",
        ),
    ]);

    // cmd.run: no paths as argv[0], cwd beneath a root.
    s.refuses_each(&[
        (json!({"op":"cmd.run","argv":["/bin/sh","-c","id"],"timeout_ms":1000,"max_stdout_bytes":100,"max_stderr_bytes":100}), "invalid_request"),
        (json!({"op":"cmd.run","argv":["id"],"cwd":"etcdir","timeout_ms":1000,"max_stdout_bytes":100,"max_stderr_bytes":100}), "path_not_allowed"),
        (json!({"op":"cmd.run","argv":["id"],"cwd":"/etc","timeout_ms":1000,"max_stdout_bytes":100,"max_stderr_bytes":100}), "path_not_allowed"),
    ]);
}

#[test]
fn commands_run_unprivileged() {
    let s = Sandbox::start();
    assert_eq!(s.sh(&["id", "-u"]), "65534\n");
    assert_eq!(s.sh(&["id", "-G"]), "65534\n", "no supplementary groups");
    let status = s.sh(&["cat", "/proc/self/status"]);
    for field in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        let line = status
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_else(|| panic!("no {field} in {status}"));
        assert!(line.ends_with("0000000000000000"), "{line}");
    }
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    // Nothing blocked, ignored or caught: the executor's signal state stays with the executor
    // (spawn.rs: every disposition reset to default before the mask is emptied).
    for field in ["SigBlk", "SigIgn", "SigCgt"] {
        let line = status
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_else(|| panic!("no {field} in {status}"));
        assert!(line.ends_with("0000000000000000"), "{line}");
    }

    // The agent cannot signal the executor (uid 0) nor read its memory.
    let kill = s.run(&["sh", "-c", "kill -9 1"]);
    assert_ne!(kill["exit_code"], json!(0), "{kill}");
    assert_eq!(s.ok(json!({"op":"ping"})), json!({}));
    let environ = s.run(&["cat", "/proc/1/environ"]);
    assert_ne!(environ["exit_code"], json!(0), "{environ}");

    // Environment: clean, with the given variables; PATH in env does not change the lookup.
    let env = s.ok(
        json!({"op":"cmd.run","argv":["env"],"env":{"FOO":"bar","PATH":"/nowhere"},
        "timeout_ms":5000,"max_stdout_bytes":4096,"max_stderr_bytes":4096}),
    );
    let mut lines: Vec<&str> = env["stdout"].as_str().unwrap_or_default().lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        vec![
            "FOO=bar",
            "HOME=/workspace",
            "LANG=C.UTF-8",
            "PATH=/nowhere"
        ]
    );

    let pwd = s.ok(json!({"op":"cmd.run","argv":["pwd"],"cwd":"/workspace",
        "timeout_ms":5000,"max_stdout_bytes":4096,"max_stderr_bytes":4096}));
    assert_eq!(pwd["stdout"], json!("/workspace\n"));
    s.ok(json!({"op":"fs.create_dir","path":"sub"}));
    let pwd = s.ok(json!({"op":"cmd.run","argv":["pwd"],"cwd":"sub",
        "timeout_ms":5000,"max_stdout_bytes":4096,"max_stderr_bytes":4096}));
    assert_eq!(pwd["stdout"], json!("/workspace/sub\n"));

    let fail = s.run(&["sh", "-c", "echo oops >&2; exit 3"]);
    assert_eq!(
        (fail["exit_code"].clone(), fail["stderr"].clone()),
        (json!(3), json!("oops\n"))
    );
    let killed = s.run(&["sh", "-c", "kill -TERM $$"]);
    assert_eq!(
        (killed["exit_code"].clone(), killed["signal"].clone()),
        (Value::Null, json!(15))
    );

    s.refuses_each(&[
        (json!({"op":"cmd.run","argv":["no-such-program"],"timeout_ms":1000,"max_stdout_bytes":1,"max_stderr_bytes":1}), "command_not_found"),
        (json!({"op":"cmd.run","argv":[],"timeout_ms":1000,"max_stdout_bytes":1,"max_stderr_bytes":1}), "invalid_request"),
    ]);

    // Binary output comes back as base64.
    let bin = s.run(&["printf", "\\377\\000a"]);
    assert_eq!(
        (bin["stdout"].clone(), bin["stdout_encoding"].clone()),
        (json!("/wBh"), json!("base64"))
    );

    // A malformed line gets an error, and the stream goes on.
    s.send_raw("{not json");
    assert_eq!(s.wait(0)["error"]["kind"], json!("invalid_request"));
    let bad = s.call(json!({"op":"fs.read","path":"x","bogus":1}));
    assert_eq!(bad["error"]["kind"], json!("invalid_request"), "{bad}");
    assert_eq!(s.ok(json!({"op":"ping"})), json!({}));
}

#[test]
fn timeouts_kill_the_whole_process_group() {
    let s = Sandbox::start();
    let started = Instant::now();
    let r = s.ok(
        json!({"op":"cmd.run","argv":["sleep","100"],"timeout_ms":500,"grace_ms":500,
        "max_stdout_bytes":100,"max_stderr_bytes":100}),
    );
    assert_eq!(r["timed_out"], json!(true), "{r}");
    assert_eq!(r["signal"], json!(15), "{r}");
    assert!(started.elapsed() < Duration::from_secs(20));

    // A group whose members ignore SIGTERM: SIGKILL after the grace period, for all of them.
    let r = s.ok(json!({"op":"cmd.run","exec":"any",
        "argv":["sh","-c","trap '' TERM; sleep 101 & sleep 102 & wait"],
        "timeout_ms":500,"grace_ms":300,"max_stdout_bytes":100,"max_stderr_bytes":100}));
    assert_eq!(
        (r["timed_out"].clone(), r["signal"].clone()),
        (json!(true), json!(9)),
        "{r}"
    );
    let ps = processes(&s);
    assert!(
        !ps.iter().any(|p| p.cmdline.starts_with("sleep 10")),
        "group members survived: {ps:?}"
    );
}

#[test]
fn background_children_neither_hang_nor_linger() {
    let s = Sandbox::start();
    let started = Instant::now();
    let r = s.run(&["sh", "-c", "sleep 100 & echo started"]);
    assert_eq!(
        (r["exit_code"].clone(), r["stdout"].clone()),
        (json!(0), json!("started\n"))
    );
    assert_eq!(r["timed_out"], json!(false));
    assert!(started.elapsed() < Duration::from_secs(10), "{r}");

    // Escaping the group with setsid or a double fork does not escape the command's sub-reaper:
    // when the leader exits, everything it started is killed, and the call returns promptly.
    // (The outer shell waits a second so that the escapes happen before it exits.)
    let started = Instant::now();
    let r = s.run(&[
        "sh",
        "-c",
        "setsid sleep 103 & (sleep 104 &) ; nohup sleep 105 >/dev/null 2>&1 & sleep 1; echo escaped",
    ]);
    assert_eq!(r["stdout"], json!("escaped\n"), "{r}");
    assert!(started.elapsed() < Duration::from_secs(10), "{r}");

    // Orphans are reaped: nothing is left, not even as a zombie.
    let ps = processes(&s);
    assert!(ps.len() > 1, "cannot read /proc: {ps:?}");
    for survivor in ["sleep 100", "sleep 103", "sleep 104", "sleep 105"] {
        assert!(
            !ps.iter().any(|p| p.cmdline == survivor),
            "`{survivor}` outlived its command: {ps:?}"
        );
    }
    assert!(!ps.iter().any(|p| p.state == "Z"), "zombies: {ps:?}");
}

#[test]
fn a_request_line_over_the_bound_is_refused_under_its_own_id() {
    let s = Sandbox::start();
    // Over max_file_bytes * 6 + 1 MiB (JSON escaping can make one byte six): skipped, and the
    // refusal carries the request's id, so its caller is answered rather than left to time out.
    let id = 900_001;
    let mut line = format!(r#"{{"id":{id},"op":"fs.write","path":"big","content":""#);
    line.push_str(&"x".repeat(62 * 1024 * 1024));
    line.push_str("\"}");
    s.send_raw(&line);
    let answer = s.wait(id);
    assert_eq!(answer["error"]["kind"], "too_large", "{answer}");
    // Nothing was written, and the executor still answers.
    s.refused(json!({"op":"fs.read","path":"big"}), "not_found");
    s.ok(json!({"op":"ping"}));
}

#[test]
fn failures_and_special_files_are_reported_cleanly() {
    let s = Sandbox::start();
    s.sh(&["mkdir", "locked"]);
    s.sh(&["sh", "-c", "echo secret > locked/x && chmod 000 locked"]);
    s.refuses_each(&[
        (
            json!({"op":"fs.read","path":"locked/x"}),
            "permission_denied",
        ),
        (json!({"op":"fs.list","path":"locked"}), "permission_denied"),
        (
            json!({"op":"fs.write","path":"locked/y","content":"x"}),
            "permission_denied",
        ),
    ]);
    // grep walks past what it cannot read and says the result may be incomplete.
    let g = s.ok(json!({"op":"fs.grep","pattern":"secret","path":"."}));
    assert_eq!(
        (g["matches"].clone(), g["truncated"].clone()),
        (json!([]), json!(true))
    );

    // A sub-reaper that fails before starting the command (here its fchdir) exits at once; the
    // reaper must neither lose that status nor later ones.
    for _ in 0..20 {
        let msg = s.refused(
            json!({"op":"cmd.run","argv":["true"],"cwd":"locked","timeout_ms":5000,
                   "max_stdout_bytes":10,"max_stderr_bytes":10}),
            "spawn_failed",
        );
        assert!(msg.contains("/workspace/locked"), "{msg}");
        assert_eq!(s.run(&["true"])["exit_code"], json!(0));
    }

    s.sh(&["mkfifo", "fifo"]);
    s.refuses_each(&[
        (json!({"op":"fs.read","path":"fifo"}), "not_a_regular_file"),
        (
            json!({"op":"fs.write","path":"fifo","content":"x"}),
            "not_a_regular_file",
        ),
        (
            json!({"op":"fs.grep","pattern":"x","path":"fifo"}),
            "not_a_regular_file",
        ),
    ]);
    let g = s.ok(json!({"op":"fs.grep","pattern":"x","path":"."}));
    assert_eq!(
        g["matches"],
        json!([]),
        "a FIFO in the tree is skipped, not opened: {g}"
    );
}

#[test]
fn output_is_capped_while_streaming() {
    let s = Sandbox::start();
    let total: u64 = 200 * 1024 * 1024;
    let started = Instant::now();
    let r = s.ok(
        json!({"op":"cmd.run","argv":["head","-c",total.to_string(),"/dev/zero"],
        "timeout_ms":120000,"max_stdout_bytes":65536,"max_stderr_bytes":1024}),
    );
    println!("200 MiB through a 64 KiB cap: {:?}", started.elapsed());
    assert_eq!(r["exit_code"], json!(0));
    assert_eq!(r["stdout_bytes"], json!(total));
    assert_eq!(r["truncated"], json!({"stdout": true, "stderr": false}));
    assert_eq!(r["stdout"].as_str().map(str::len), Some(65536));

    let r = s.ok(
        json!({"op":"cmd.run","exec":"any","argv":["sh","-c","yes | head -c 100000 >&2"],
        "timeout_ms":60000,"max_stdout_bytes":10,"max_stderr_bytes":10}),
    );
    assert_eq!(
        (r["stderr"].clone(), r["stderr_bytes"].clone()),
        (json!("y\ny\ny\ny\ny\n"), json!(100000))
    );
    assert_eq!(r["truncated"]["stderr"], json!(true));
}

#[test]
fn requests_run_concurrently_and_can_be_cancelled() {
    let s = Sandbox::start();
    let started = Instant::now();
    let sleeps: Vec<u64> = (0..4)
        .map(|_| s.send(Sandbox::run_request(&["sleep", "2"])))
        .collect();
    let ping = s.send(json!({"op":"ping"}));
    let (_, ping_at) = s.wait_timed(ping);
    let mut last = ping_at;
    for id in sleeps {
        let (r, at) = s.wait_timed(id);
        assert_eq!(r["ok"]["exit_code"], json!(0), "{r}");
        last = last.max(at);
    }
    assert!(
        ping_at < last,
        "the ping answered while the sleeps ran (out of order)"
    );
    let elapsed = started.elapsed();
    println!("4 concurrent `sleep 2`: {elapsed:?}");
    assert!(
        elapsed < Duration::from_secs(7),
        "requests did not overlap: {elapsed:?}"
    );

    let target = s.send(Sandbox::run_request(&[
        "sh",
        "-c",
        "echo partial; exec sleep 100",
    ]));
    std::thread::sleep(Duration::from_millis(500));
    let c = s.ok(json!({"op":"cancel","target":target}));
    assert_eq!(c, json!({"cancelled": true}));
    let r = s.wait(target);
    assert_eq!(r["ok"]["cancelled"], json!(true), "{r}");
    assert_eq!(r["ok"]["stdout"], json!("partial\n"), "{r}");
    assert_eq!(
        s.ok(json!({"op":"cancel","target":target})),
        json!({"cancelled": false})
    );

    // A cancel that arrives right behind its cmd.run (maybe before the spawn) still stops it.
    for _ in 0..10 {
        let target = s.send(Sandbox::run_request(&["sleep", "100"]));
        assert_eq!(
            s.ok(json!({"op":"cancel","target":target})),
            json!({"cancelled": true})
        );
        let r = s.wait(target);
        assert_eq!(r["ok"]["cancelled"], json!(true), "{r}");
    }
    // Cancelling something that is not a running command is a no.
    let ping_id = s.send(json!({"op":"ping"}));
    s.wait(ping_id);
    assert_eq!(
        s.ok(json!({"op":"cancel","target":ping_id})),
        json!({"cancelled": false})
    );
}

#[test]
fn closing_stdin_stops_everything() {
    let mut s = Sandbox::start();
    let sleeping = s.send(Sandbox::run_request(&["sleep", "100"]));
    // Lines are read in order and a ping is answered by the reader itself: once the ping is
    // answered, the executor has taken the command in (under load, docker's stdin relay can lag).
    s.ok(json!({"op": "ping"}));
    std::thread::sleep(Duration::from_millis(500));
    s.close_stdin();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = s.docker_run.try_wait().expect("docker run") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the executor did not exit after stdin closed"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}");
    // The command in flight was killed and still answered before the executor exited (the
    // executor waits for answers being written, not only for handlers, before it exits).
    let r = s.wait(sleeping);
    assert_eq!(r["ok"]["signal"], json!(9), "{r}");
}

/// The bytes of a process's `data` events (base64) of `stream`, in order.
fn streamed(events: &[Value], stream: &str) -> Vec<u8> {
    use base64::Engine;
    events
        .iter()
        .filter(|e| e["kind"] == json!("data") && e["stream"] == json!(stream))
        .flat_map(|e| {
            base64::engine::general_purpose::STANDARD
                .decode(e["data"].as_str().unwrap_or_default())
                .expect("data is base64")
        })
        .collect()
}

fn has_end(events: &[Value]) -> bool {
    events.last().is_some_and(|e| e["kind"] == json!("end"))
}

#[test]
fn live_processes_stream_events_and_end_with_the_executor() {
    let mut s = Sandbox::start();
    let cat = s.send(json!({"op": "proc.start", "argv": ["cat"], "stdin": true, "tag": "c"}));
    let started = s.wait(cat);
    let pid = started["ok"]["pid"].as_u64().expect("a pid");
    assert_eq!(started["ok"]["tag"], json!("c"));
    s.ok(json!({"op": "proc.input", "pid": pid, "data": "aGkK"}));
    // Streamed while it runs: the echo comes before any end.
    let events = s.events_until(cat, |e| streamed(e, "stdout") == b"hi\n");
    assert!(!has_end(&events), "{events:?}");
    let listed = s.ok(json!({"op": "proc.live"}));
    assert_eq!(listed["processes"][0]["pid"], json!(pid));
    assert_eq!(listed["processes"][0]["events"], json!(cat));
    // It runs as the sandbox user, in its own process group, in the sandbox's pid namespace.
    let status = s.sh(&["cat", &format!("/proc/{pid}/status")]);
    assert!(status.contains("Uid:\t65534"), "{status}");
    let stat = s.sh(&["cat", &format!("/proc/{pid}/stat")]);
    let pgrp = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().nth(2));
    assert_eq!(pgrp, Some(pid.to_string().as_str()), "{stat}");

    // A watch: the kernel's instance is made as the sandbox user (never charged to root), and
    // its events come as lines of its own id.
    let watch = s.send(json!({"op": "fs.watch", "path": "/workspace"}));
    assert_eq!(s.wait(watch)["ok"]["directories"], json!(1));
    s.ok(json!({"op": "fs.write", "path": "w.txt", "content": "x"}));
    s.events_until(watch, |events| {
        events
            .iter()
            .any(|e| e["op"] == json!("create") && e["path"] == json!("/workspace/w.txt"))
    });
    let log = s.stderr.lock().unwrap().clone();
    assert!(!log.contains("sandbox user's uid"), "{log}");
    let unwatched = s.ok(json!({"op": "fs.unwatch", "target": watch}));
    assert_eq!(unwatched["removed"], json!(true));
    let ended = s.events_until(watch, |e| {
        e.last().is_some_and(|e| e["kind"] == json!("watch_end"))
    });
    assert!(ended.last().unwrap()["reason"]
        .as_str()
        .unwrap()
        .contains("fs.unwatch"));

    // A tree under a terminal; closing the executor's stdin ends both processes, each with its
    // end event, before the executor exits.
    let tree = s.send(
        json!({"op": "proc.start", "argv": ["sh", "-c", "sleep 1000 & sleep 1001"],
                             "exec": "any", "pty": {"cols": 80, "rows": 24}}),
    );
    s.wait(tree)["ok"]["pid"].as_u64().expect("a pid");
    s.ok(json!({"op": "ping"}));
    s.close_stdin();
    let cat_events = s.events_until(cat, has_end);
    let tree_events = s.events_until(tree, has_end);
    let end = cat_events.last().expect("an end");
    assert_eq!(end["signal"], json!(9), "{end}");
    assert_eq!(end["stdout_bytes"], json!(3));
    assert_eq!(tree_events.last().expect("an end")["signal"], json!(9));
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.docker_run.try_wait().expect("docker run").is_none() {
        assert!(Instant::now() < deadline, "the executor did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn p50(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[test]
fn latency_compared_with_docker_exec() {
    let s = Sandbox::start();
    for _ in 0..20 {
        s.ok(json!({"op":"ping"}));
    }
    let ping = p50((0..300)
        .map(|_| {
            let t = Instant::now();
            s.ok(json!({"op":"ping"}));
            t.elapsed()
        })
        .collect());
    s.ok(json!({"op":"fs.write","path":"f.txt","content":"hello\n"}));
    let read = p50((0..200)
        .map(|_| {
            let t = Instant::now();
            s.ok(json!({"op":"fs.read","path":"f.txt"}));
            t.elapsed()
        })
        .collect());
    let run_true = p50((0..100)
        .map(|_| {
            let t = Instant::now();
            let r = s.run(&["true"]);
            assert_eq!(r["exit_code"], json!(0));
            t.elapsed()
        })
        .collect());
    let exec_true = p50((0..20)
        .map(|_| {
            let t = Instant::now();
            let out = docker(&["exec", "-u", "65534:65534", &s.name, "true"]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            t.elapsed()
        })
        .collect());
    println!(
        "p50 over the stream ({}): ping {ping:?}, fs.read {read:?}, cmd.run true {run_true:?}; \
         docker exec true {exec_true:?} (cmd.run is {:.1}x faster)",
        s.image,
        exec_true.as_secs_f64() / run_true.as_secs_f64()
    );
}

#[test]
fn the_kernel_confines_every_command() {
    let s = Sandbox::start();
    let ready_abi = s.ok(json!({"op":"ping"}));
    assert_eq!(ready_abi, json!({}));

    // Writing outside the write roots and /tmp is refused by the kernel, whatever the program:
    // /dev/shm is a writable tmpfs in every container, but not a write root.
    let r = s.run(&[
        "sh",
        "-c",
        "echo x > /dev/shm/marker; echo x > /tmp/ok; echo x > ok",
    ]);
    assert_eq!(r["landlock"], json!("full"), "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap_or_default()
            .contains("/dev/shm/marker"),
        "the write to /dev/shm was refused with a message: {r}"
    );
    let shm = s.sh(&["ls", "-a", "/dev/shm"]);
    assert!(!shm.contains("marker"), "the marker was created: {shm}");
    assert_eq!(s.sh(&["cat", "/tmp/ok", "ok"]), "x\nx\n");

    // A command cannot signal another command (each has its own Landlock domain) nor the
    // executor; the victim keeps running until it is cancelled.
    let victim_id = s.send(json!({"op":"cmd.run","exec":"any","argv":["sleep","41"],
        "timeout_ms":60000,"max_stdout_bytes":100,"max_stderr_bytes":100}));
    let deadline = Instant::now() + Duration::from_secs(20);
    let victim_pid = loop {
        let listing = s.sh(&[
            "sh",
            "-c",
            "for d in /proc/[0-9]*; do echo \"${d#/proc/} $(tr '\\0' ' ' < $d/cmdline)\"; done",
        ]);
        if let Some(line) = listing.lines().find(|l| l.trim_end().ends_with("sleep 41")) {
            break line
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the victim never started: {listing}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let attack = s.run(&["sh", "-c", &format!("kill -9 {victim_pid}; kill -9 1")]);
    let stderr = attack["stderr"].as_str().unwrap_or_default();
    assert_eq!(
        stderr.matches("not permitted").count(),
        2,
        "both kills were refused: {attack}"
    );
    let alive = s.sh(&[
        "sh",
        "-c",
        &format!("cat /proc/{victim_pid}/cmdline | tr '\\0' ' '"),
    ]);
    assert_eq!(alive.trim(), "sleep 41", "the victim was killed");
    assert_eq!(
        s.ok(json!({"op":"cancel","target":victim_id})),
        json!({"cancelled": true})
    );
    assert_eq!(s.wait(victim_id)["ok"]["cancelled"], json!(true));
}

/// Polls `proc.list` until a process listens on `port` (or the bounded attempts run out).
fn wait_for_listener(s: &Sandbox, port: u16) -> Value {
    for _ in 0..200 {
        let listed = s.ok(json!({"op": "proc.list", "port": port}));
        if listed["total"] == json!(1) {
            return listed;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no process was seen listening on port {port}");
}

#[test]
fn proc_list_finds_listeners_and_hides_the_executor() {
    let s = Sandbox::start();
    let server = s.send(Sandbox::run_request(&[
        "httpd",
        "-f",
        "-p",
        "8080",
        "-h",
        "/workspace",
    ]));
    let listed = wait_for_listener(&s, 8080);
    let p = &listed["processes"][0];
    assert_eq!(p["name"], json!("httpd"), "{listed}");
    assert_eq!(p["listening_ports"], json!([8080]), "{listed}");
    assert_eq!(
        p["uid"],
        json!(65534),
        "commands run as the sandbox user: {listed}"
    );
    assert_eq!(p["role"], json!("command"));
    assert!(
        p["command"].as_str().unwrap().contains("-p 8080"),
        "{listed}"
    );
    assert!(p["memory_rss_bytes"].as_u64().unwrap() > 0, "{listed}");
    assert!(p["cpu_time_ms"].is_u64() && p["cpu_percent"].is_number());

    // By default the executor and the sub-reapers are not listed; on request they are marked.
    let all = s.ok(json!({"op": "proc.list"}));
    let roles: Vec<&Value> = all["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["role"])
        .collect();
    assert!(roles.iter().all(|r| **r == json!("command")), "{all}");
    let internal = s.ok(json!({"op": "proc.list", "include_internal": true}));
    let executor = internal["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == json!(1))
        .unwrap_or_else(|| panic!("PID 1 missing: {internal}"));
    assert_eq!(executor["role"], json!("executor"));
    assert_eq!(executor["listening_ports"], json!([]));
    assert!(
        internal["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["role"] == json!("sub_reaper") && p["name"] != json!("fork-server")),
        "the running httpd has a sub-reaper (the fork server does not count): {internal}"
    );

    // Filters and limits.
    let by_name = s.ok(json!({"op": "proc.list", "name": "HTTPD"}));
    assert_eq!(by_name["total"], json!(1), "{by_name}");
    let none = s.ok(json!({"op": "proc.list", "port": 9})); // nothing listens there
    assert_eq!(none["total"], json!(0));
    assert_eq!(none["processes"], json!([]));
    for _ in 0..3 {
        s.send(Sandbox::run_request(&["sleep", "30"]));
    }
    let mut limited = json!(null);
    for _ in 0..200 {
        limited = s.ok(json!({"op": "proc.list", "name": "sleep", "limit": 2}));
        if limited["total"] == json!(3) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(limited["total"], json!(3), "{limited}");
    assert_eq!(limited["processes"].as_array().unwrap().len(), 2);
    assert_eq!(limited["truncated"], json!(true));
    s.refuses_each(&[
        (json!({"op": "proc.list", "limit": 201}), "invalid_request"),
        (json!({"op": "proc.list", "limit": 0}), "invalid_request"),
    ]);

    s.ok(json!({"op": "cancel", "target": server}));
    let r = s.wait(server);
    assert_eq!(r["ok"]["cancelled"], json!(true), "{r}");
}

#[test]
fn logs_read_tails_and_filters_with_bounded_reads() {
    let s = Sandbox::start();
    let mut log = String::new();
    for i in 1..=3000 {
        let level = if i % 3 == 0 { "ERROR" } else { "INFO" };
        log.push_str(&format!(
            "{{\"n\":{i},\"level\":\"{level}\",\"ctx\":{{\"user\":\"u{i}\"}}}}\n"
        ));
    }
    log.push_str("plain text line with a.b inside\n");
    s.ok(json!({"op": "fs.write", "path": "app.log", "content": log}));

    let tail = s.ok(json!({"op": "logs.read", "path": "app.log", "lines": 2}));
    assert_eq!(tail["lines_returned"], json!(2), "{tail}");
    assert_eq!(
        tail["lines"][1],
        json!("plain text line with a.b inside"),
        "{tail}"
    );
    assert!(tail["lines"][0].as_str().unwrap().contains("\"n\":3000"));
    assert_eq!(tail["truncated"], json!(true));

    // Literal filter: the dot is a dot.
    let literal = s.ok(json!({"op": "logs.read", "path": "app.log", "filter": "a.b"}));
    assert_eq!(literal["lines"], json!(["plain text line with a.b inside"]));
    assert_eq!(
        literal["truncated"],
        json!(false),
        "the whole file was read"
    );
    assert_eq!(literal["lines_scanned"], json!(3001));

    // Regex filter plus a JSON field by dot path.
    let users = s.ok(
        json!({"op": "logs.read", "path": "app.log", "filter": "\"level\":\"(ERROR|FATAL)\"",
        "regex": true, "json_field": "ctx.user", "lines": 3}),
    );
    assert_eq!(
        users["lines"],
        json!(["u2994", "u2997", "u3000"]),
        "{users}"
    );
    assert_eq!(users["lines_matched"], json!(3));

    // A JSON field over lines that are not all JSON: those are counted, not returned.
    let fields = s.ok(json!({"op": "logs.read", "path": "app.log", "json_field": "n", "lines": 1}));
    assert_eq!(fields["lines"], json!(["3000"]));
    assert_eq!(fields["json_missing"], json!(1));

    // Refusals: outside the roots, bad limits, bad patterns, not a file.
    s.refuses_each(&[
        (
            json!({"op": "logs.read", "path": "/etc/passwd"}),
            "path_not_allowed",
        ),
        (
            json!({"op": "logs.read", "path": "../../proc/1/environ"}),
            "path_not_allowed",
        ),
        (
            json!({"op": "logs.read", "path": "app.log", "lines": 5001}),
            "invalid_request",
        ),
        (
            json!({"op": "logs.read", "path": "app.log", "filter": "(", "regex": true}),
            "invalid_request",
        ),
    ]);
    s.ok(json!({"op": "fs.create_dir", "path": "dir"}));
    s.refuses_each(&[
        (json!({"op": "logs.read", "path": "dir"}), "is_a_directory"),
        (
            json!({"op": "logs.read", "path": "missing.log"}),
            "not_found",
        ),
    ]);
    // A symlink out of the workspace is not followed out of it.
    s.sh(&["ln", "-s", "/etc/passwd", "/workspace/evil.log"]);
    s.refused(
        json!({"op": "logs.read", "path": "evil.log"}),
        "path_not_allowed",
    );
}

#[test]
fn env_get_masks_secrets() {
    let s = Sandbox::start();
    let env = s.ok(json!({"op": "env.get"}));
    assert_eq!(env["source"], json!("environment"));
    assert_eq!(env["variables"]["HOME"], json!("/workspace"));
    assert!(env["variables"]["PATH"].as_str().unwrap().contains("/bin"));

    s.ok(json!({"op": "fs.write", "path": "app/.env", "content":
        "# settings\nDATABASE_HOST=db\nexport API_KEY=sk-live-123\ndb_password='hunter2'\nGITHUB_TOKEN=\"ghp_x\"\n"}));
    let masked = s.ok(json!({"op": "env.get", "path": "app/.env"}));
    assert_eq!(masked["source"], json!("/workspace/app/.env"));
    assert_eq!(masked["variables"]["DATABASE_HOST"], json!("db"));
    for name in ["API_KEY", "db_password", "GITHUB_TOKEN"] {
        assert_eq!(masked["variables"][name], json!("***MASKED***"), "{masked}");
    }
    assert_eq!(
        masked["masked"],
        json!(["API_KEY", "GITHUB_TOKEN", "db_password"])
    );
    assert!(!masked.to_string().contains("hunter2"));

    let unmasked = s.ok(json!({"op": "env.get", "path": "app/.env", "unmask": true,
        "keys": ["db_password", "NOPE"]}));
    assert_eq!(unmasked["variables"], json!({"db_password": "hunter2"}));
    assert_eq!(unmasked["missing"], json!(["NOPE"]));

    s.ok(json!({"op": "fs.write", "path": "bad.env", "content": "A=1\nthis is not a variable\n"}));
    let message = s.refused(
        json!({"op": "env.get", "path": "bad.env"}),
        "invalid_request",
    );
    assert!(message.contains("line 2"), "{message}");
    s.refused(
        json!({"op": "env.get", "path": "/proc/self/environ"}),
        "path_not_allowed",
    );
}

/// The fork server as `proc.list` shows it (an internal process named `fork-server`), if any.
fn fork_server(s: &Sandbox) -> Option<Value> {
    let listed = s.ok(json!({"op": "proc.list", "name": "fork-server", "include_internal": true}));
    listed["processes"]
        .as_array()
        .and_then(|all| all.iter().find(|p| p["name"] == json!("fork-server")))
        .cloned()
}

/// Waits until `cmdline` shows up among the sandbox's processes.
fn wait_for_process(s: &Sandbox, cmdline: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !processes(s).iter().any(|p| p.cmdline == cmdline) {
        assert!(Instant::now() < deadline, "`{cmdline}` never started");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A command whose tree (two background sleeps) outlives its leader unless something kills it.
fn tree_request(a: u32, b: u32, timeout_ms: u64) -> Value {
    json!({"op":"cmd.run","exec":"any","argv":["sh","-c",format!("sleep {a} & sleep {b} & wait")],
           "timeout_ms":timeout_ms,"grace_ms":300,"max_stdout_bytes":100,"max_stderr_bytes":100})
}

/// Cancelling and timing out a command kills its whole tree; checked after each.
fn cancel_and_timeout_kill_trees(s: &Sandbox, first: u32) {
    let (a, b) = (first, first + 1);
    let running = s.send(tree_request(a, b, 60000));
    wait_for_process(s, &format!("sleep {a}"));
    wait_for_process(s, &format!("sleep {b}"));
    assert_eq!(
        s.ok(json!({"op":"cancel","target":running})),
        json!({"cancelled": true})
    );
    let r = s.wait(running);
    assert_eq!(r["ok"]["cancelled"], json!(true), "{r}");
    let (c, d) = (first + 2, first + 3);
    let r = s.ok(tree_request(c, d, 700));
    assert_eq!(r["timed_out"], json!(true), "{r}");
    let ps = processes(s);
    for n in [a, b, c, d] {
        assert!(
            !ps.iter().any(|p| p.cmdline == format!("sleep {n}")),
            "`sleep {n}` outlived its command: {ps:?}"
        );
    }
}

#[test]
fn many_concurrent_commands_get_their_own_statuses() {
    let s = Sandbox::start();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..20u32 {
            let s = &s;
            scope.spawn(move || {
                for i in 0..10u32 {
                    let n = thread * 10 + i;
                    if n % 2 == 0 {
                        let r = s.run(&["true"]);
                        assert_eq!(r["exit_code"], json!(0), "{r}");
                        assert_eq!(r["stdout"], json!(""), "{r}");
                    } else {
                        let r = s.run(&["sh", "-c", &format!("echo {n}; exit {}", n % 100)]);
                        assert_eq!(r["exit_code"], json!(n % 100), "{r}");
                        assert_eq!(r["stdout"], json!(format!("{n}\n")), "{r}");
                    }
                }
            });
        }
    });
    println!("200 commands over 20 threads: {:?}", started.elapsed());
    // A plan too large for one message to the fork server (a 100 kB argument) is forked directly.
    let big = "x".repeat(100_000);
    let r = s.run(&["sh", "-c", "printf %s \"$1\" | wc -c", "sh", &big]);
    assert_eq!(
        (r["exit_code"].clone(), r["stdout"].as_str().map(str::trim)),
        (json!(0), Some("100000")),
        "{r}"
    );
    let server = fork_server(&s).unwrap_or_else(|| panic!("no fork server"));
    assert_eq!(server["ppid"], json!(1), "{server}");
    let log = s.stderr.lock().unwrap().clone();
    assert!(!log.contains("is gone"), "the fork server was lost: {log}");
    assert!(!processes(&s).iter().any(|p| p.state == "Z"));
}

#[test]
fn the_fork_server_is_out_of_reach_and_its_loss_is_survived() {
    let s = Sandbox::start();
    let server = fork_server(&s).unwrap_or_else(|| panic!("no fork server"));
    assert_eq!(
        (
            server["uid"].clone(),
            server["ppid"].clone(),
            server["role"].clone()
        ),
        (json!(0), json!(1), json!("sub_reaper")),
        "{server}"
    );
    let pid = server["pid"].as_u64().unwrap_or_default();
    assert!(pid > 1, "{server}");

    // A command can neither signal it nor see its descriptors.
    let attack = s.run(&[
        "sh",
        "-c",
        &format!("kill -9 {pid}; kill -STOP {pid}; ls /proc/{pid}/fd"),
    ]);
    let stderr = attack["stderr"].as_str().unwrap_or_default();
    assert_eq!(
        stderr.matches("not permitted").count(),
        2,
        "both signals were refused: {attack}"
    );
    assert!(stderr.contains("ermission denied"), "{attack}");
    assert_eq!(fork_server(&s).map(|p| p["pid"].clone()), Some(json!(pid)));

    // Sub-reapers are the executor's children (it reaps and signals them), not the server's.
    let running = s.send(tree_request(301, 302, 60000));
    wait_for_process(&s, "sleep 301");
    let internal = s.ok(json!({"op": "proc.list", "include_internal": true, "limit": 200}));
    let reapers: Vec<&Value> = internal["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == json!("sub_reaper") && p["name"] != json!("fork-server"))
        .collect();
    assert!(!reapers.is_empty(), "{internal}");
    assert!(reapers.iter().all(|p| p["ppid"] == json!(1)), "{internal}");
    s.ok(json!({"op":"cancel","target":running}));
    s.wait(running);
    cancel_and_timeout_kill_trees(&s, 310);

    // Killed (only root can: here from outside) while a command runs: the command still answers
    // and later commands are forked directly.
    let long = s.send(Sandbox::run_request(&["sh", "-c", "sleep 1; echo done"]));
    wait_for_process(&s, "sleep 1");
    docker_ok(&["exec", &s.name, "kill", "-9", &pid.to_string()]);
    let r = s.wait(long);
    assert_eq!(
        (r["ok"]["exit_code"].clone(), r["ok"]["stdout"].clone()),
        (json!(0), json!("done\n")),
        "{r}"
    );
    std::thread::scope(|scope| {
        for _ in 0..5 {
            let s = &s;
            scope.spawn(move || {
                for _ in 0..10 {
                    assert_eq!(s.run(&["true"])["exit_code"], json!(0));
                }
            });
        }
    });
    assert_eq!(fork_server(&s), None, "the killed server is reaped");
    let log = s.stderr.lock().unwrap().clone();
    assert_eq!(
        log.matches(&format!("fork server pid {pid} is gone"))
            .count(),
        1,
        "its loss is logged once: {log}"
    );
    cancel_and_timeout_kill_trees(&s, 320);
    assert!(!processes(&s).iter().any(|p| p.state == "Z"));
}

/// The container settings of a sandbox whose requests may run as root, as the dispatcher makes a
/// gVisor sandbox that asked for it (`hardening::capabilities`), here on runc: what the executor
/// does with them is the same under both kernels.
/// (SETUID, SETGID, KILL and CHOWN every test sandbox has already: see [`Sandbox::start_with`].)
const ROOT_SANDBOX: [&str; 14] = [
    "-e",
    r#"SANDBOX_EXECUTOR_CONFIG={"allow_root":true}"#,
    "--cap-add",
    "DAC_OVERRIDE",
    "--cap-add",
    "FOWNER",
    "--cap-add",
    "FSETID",
    "--cap-add",
    "NET_BIND_SERVICE",
    "--cap-add",
    "SYS_CHROOT",
    "--cap-add",
    "AUDIT_WRITE",
];

/// `CapEff` of `/proc/self/status` text, as a number.
fn cap_eff(status: &str) -> u64 {
    let line = status
        .lines()
        .find(|l| l.starts_with("CapEff:"))
        .unwrap_or_else(|| panic!("no CapEff in {status}"));
    u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).expect("hex")
}

/// The root set by bit (capabilities(7) numbers): CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4,
/// KILL 5, SETGID 6, SETUID 7, NET_BIND_SERVICE 10, SYS_CHROOT 18, AUDIT_WRITE 29.
const ROOT_SET: u64 =
    1 | 1 << 1 | 1 << 3 | 1 << 4 | 1 << 5 | 1 << 6 | 1 << 7 | 1 << 10 | 1 << 18 | 1 << 29;

#[test]
fn root_is_refused_unless_the_config_allows_it() {
    let s = Sandbox::start();
    for request in [
        json!({"op":"cmd.run","argv":["id","-u"],"timeout_ms":5000,"max_stdout_bytes":64,
               "max_stderr_bytes":64,"user":"root"}),
        json!({"op":"proc.start","argv":["id","-u"],"user":"root"}),
        json!({"op":"fs.write","path":"rooted.txt","content":"x","user":"root"}),
        json!({"op":"fs.create_dir","path":"rooted","user":"root"}),
        json!({"op":"fs.read","path":"/workspace","user":"root"}),
    ] {
        let message = s.refused(request.clone(), "permission_denied");
        for needed in ["root", "gVisor", "allow_root"] {
            assert!(
                message.contains(needed),
                "`{needed}` in {message} ({request})"
            );
        }
    }
    // Nothing was made, and the sandbox user's requests work as before.
    assert_eq!(s.sh(&["ls", "-A", "/workspace"]), "");
    assert_eq!(s.sh(&["id", "-u"]), "65534\n");
}

#[test]
fn a_root_request_is_root_and_the_sandbox_user_gains_nothing() {
    let s = Sandbox::start_with(&ROOT_SANDBOX);
    let root = |argv: &[&str]| {
        let mut request = Sandbox::run_request(argv);
        request["user"] = json!("root");
        s.ok(request)
    };
    // Root: uid and gid 0, the root set effective and nothing more, no-new-privs still set.
    let id = root(&["id"]);
    assert!(
        id["stdout"]
            .as_str()
            .unwrap_or_default()
            .starts_with("uid=0(root) gid=0(root)"),
        "{id}"
    );
    let status = root(&["cat", "/proc/self/status"]);
    let status = status["stdout"].as_str().unwrap_or_default();
    assert_eq!(cap_eff(status), ROOT_SET, "{status}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");

    // Root makes a root-only directory and a file in it, through a command and through fs.*.
    root(&["mkdir", "-m", "700", "/workspace/vault"]);
    let mut write = json!({"op":"fs.write","path":"/workspace/vault/secret","content":"root's"});
    write["user"] = json!("root");
    s.ok(write);
    let owners = root(&[
        "stat",
        "-c",
        "%u:%g %a",
        "/workspace/vault",
        "/workspace/vault/secret",
    ]);
    assert_eq!(owners["stdout"], json!("0:0 700\n0:0 644\n"), "{owners}");
    let mut read = json!({"op":"fs.read","path":"/workspace/vault/secret"});
    read["user"] = json!("root");
    assert_eq!(s.ok(read)["content"], json!("root's"));
    // ... which the sandbox user can neither read nor list, by command or by fs.*.
    let denied = s.run(&["cat", "/workspace/vault/secret"]);
    assert_ne!(denied["exit_code"], json!(0), "{denied}");
    s.refuses_each(&[
        (
            json!({"op":"fs.read","path":"/workspace/vault/secret"}),
            "permission_denied",
        ),
        (
            json!({"op":"fs.list","path":"/workspace/vault"}),
            "permission_denied",
        ),
    ]);

    // The sandbox user's commands keep no capability and cannot become root: a set-uid root
    // copy of busybox made by root runs as the user (no-new-privs), `su` is no way either.
    let status = s.sh(&["cat", "/proc/self/status"]);
    assert_eq!(cap_eff(&status), 0, "{status}");
    assert!(status.contains("CapPrm:\t0000000000000000"), "{status}");
    root(&["mkdir", "/workspace/suid"]);
    root(&["cp", "/bin/busybox", "/workspace/suid/id"]);
    root(&["chmod", "4755", "/workspace/suid/id"]);
    let mode = root(&["stat", "-c", "%u %a", "/workspace/suid/id"]);
    assert_eq!(mode["stdout"], json!("0 4755\n"), "{mode}");
    let setuid = s.run(&["sh", "-c", "/workspace/suid/id -u"]);
    assert_eq!(
        setuid["stdout"],
        json!("65534\n"),
        "the set-uid bit made root: {setuid}"
    );
    let su = s.run(&["su", "-c", "id -u", "root"]);
    assert_ne!(su["stdout"], json!("0\n"), "su made root: {su}");
    // The user's fs.* stays the user's: a file it writes is its own.
    s.ok(json!({"op":"fs.write","path":"mine.txt","content":"x"}));
    assert_eq!(
        root(&["stat", "-c", "%u", "/workspace/mine.txt"])["stdout"],
        json!("65534\n")
    );

    // A root command keeps the path rules and the exec grant: Landlock still holds it here.
    let mut outside = json!({"op":"fs.write","path":"/etc/passwd","content":"x"});
    outside["user"] = json!("root");
    s.refused(outside, "path_not_allowed");
    // Landlock's write rule holds root too (DAC_OVERRIDE does not pass it): /dev/shm is a
    // writable tmpfs of every container but not a write root.
    let shm = root(&["sh", "-c", "echo x > /dev/shm/rooted"]);
    assert_ne!(
        shm["exit_code"],
        json!(0),
        "root wrote outside the write roots: {shm}"
    );
    assert_eq!(shm["landlock"], json!("full"), "{shm}");
    assert!(!s.sh(&["ls", "-a", "/dev/shm"]).contains("rooted"));
    let ro = root(&["sh", "-c", "echo x > /etc/planted"]);
    assert_ne!(
        ro["exit_code"],
        json!(0),
        "root wrote to the read-only image: {ro}"
    );
}
