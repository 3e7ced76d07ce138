//! The gVisor isolation class (issue 44): a node whose `sandbox.isolation` is `gvisor` runs its
//! sandboxes under `runsc` on a Docker engine this test starts beside the host's
//! (`scripts/lib/gvisor_engine.sh`: gVisor registered as the runtime `runsc`; the host's dockerd
//! config is never touched). Its sandboxes have a kernel of their own, `cmd.run` and `fs.*` work
//! there under the allowlists, and the attacks `security.rs`, `seal_paths.rs` and
//! `volume_attacks.rs` make against container sandboxes are refused there too, checked from
//! inside. A node whose engine has no `runsc` refuses a gVisor sandbox with an error naming what
//! to install, and leaves no row and no container behind.
//!
//! Not skipped: `scripts/test.sh` installs `runsc` when it is missing, so an engine that cannot
//! start fails the test with the script's reason.

use std::process::Command;

use crate::common;
use crate::common::agent::AgentManifest;
use crate::common::rest::JsonAnswer;

use common::gvisor::GvisorEngine;

use common::sandbox::AgentSandbox;
use common::{TestApp, TestDb};
use dispatcher::Isolation;
use reqwest::Method;
use serde_json::{json, Value};

/// A permissive agent, as `security.rs`'s attacker (a shell with metacharacters), that may read
/// the workspace but write only beneath `/workspace/out`.
fn agent() -> String {
    AgentManifest::new("gvisor-attacker")
        .instruction("Try to get out.")
        .tools(&[
            "cmd.run",
            "fs.read",
            "fs.write",
            "fs.list",
            "proc.output",
            "proc.input",
        ])
        .cmd(
            &[
                "sh", "sh -c", "echo", "cat", "ls", "uname", "dmesg", "id", "stty",
            ],
            30,
            "          allow_metacharacters: true\n          max_output_bytes: 65536\n",
        )
        .filesystem(&["/workspace"], &["/workspace/out"])
        .yaml()
}

async fn run(sb: &AgentSandbox, command: &str) -> Value {
    sb.ok("cmd.run", json!({"command": command, "timeout_secs": 20}))
        .await
}

/// The host's kernel release.
fn host_kernel() -> String {
    let out = Command::new("uname")
        .arg("-r")
        .output()
        .expect("uname runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_sandbox_has_its_own_kernel_and_keeps_every_rule() {
    let engine = GvisorEngine::start();
    let db = TestDb::create().await;
    let app = TestApp::spawn_with(engine.node(&db)).await;
    let sb = AgentSandbox::start(&app, agent()).await;

    // The class is in the answer, and the container runs under runsc.
    let listed: Value = app.admin(Method::GET, "/v1/sandboxes").json_answer().await;
    let mine = listed
        .as_array()
        .or_else(|| listed["sandboxes"].as_array())
        .unwrap_or_else(|| panic!("a list: {listed}"))
        .iter()
        .find(|s| s["id"] == sb.id.as_str())
        .unwrap_or_else(|| panic!("the sandbox is listed: {listed}"))
        .clone();
    assert_eq!(mine["spec"]["isolation"], "gvisor", "{mine}");
    let (_, runtime) =
        engine.docker(&["inspect", "-f", "{{.HostConfig.Runtime}}", &sb.container()]);
    assert_eq!(runtime, "runsc");
    gvisor_counted(&app).await;

    // A kernel that is not the host's, seen by cmd.run inside.
    let uname = run(&sb, "uname -r").await;
    let release = uname["stdout"].as_str().unwrap_or_default().trim();
    assert!(!release.is_empty(), "{uname}");
    assert_ne!(release, host_kernel(), "the sandbox's kernel is the host's");
    let dmesg = run(&sb, "dmesg").await;
    assert!(
        common::json::text(&dmesg["stdout"]).contains("gVisor"),
        "{dmesg}"
    );

    // fs.* and cmd.run work under the allowlists.
    sb.ok(
        "fs.write",
        json!({"path": "/workspace/out/a.txt", "content": "hello"}),
    )
    .await;
    let read = sb
        .ok("fs.read", json!({"path": "/workspace/out/a.txt"}))
        .await;
    assert_eq!(read["content"], "hello", "{read}");
    let cat = run(&sb, "cat /workspace/out/a.txt").await;
    assert_eq!(cat["stdout"], "hello", "{cat}");
    let listed = sb.ok("fs.list", json!({"path": "/workspace/out"})).await;
    assert!(listed.to_string().contains("a.txt"), "{listed}");

    live_processes(&sb).await;
    path_attacks(&engine, &sb).await;
    command_attacks(&engine, &sb).await;

    // Nothing above broke the sandbox.
    let alive = run(&sb, "echo alive").await;
    assert_eq!(alive["stdout"], "alive\n", "{alive}");
}

/// `/metrics` counts the sandbox under its class. The registry is the process's and other
/// tests' nodes refresh its database gauges from their own databases (at most every 5 s), so
/// this asks until a scrape shows this node's count.
async fn gvisor_counted(app: &TestApp) {
    let line = "aegis_sandboxes_by_isolation{isolation=\"gvisor\"}";
    let mut last = String::new();
    for _ in 0..20 {
        let metrics = app.get("/metrics").await.text().await.unwrap();
        last = metrics
            .lines()
            .find(|l| l.starts_with(line))
            .unwrap_or_default()
            .to_owned();
        if common::metric(&last, line) >= 1.0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    panic!("/metrics never counted the gVisor sandbox; last line: {last:?}");
}

/// Reads a live process's output until it ended: (everything it wrote, its end).
async fn until_ended(sb: &AgentSandbox, pid: u64) -> (String, Value) {
    let mut text = String::new();
    for _ in 0..40 {
        let out = sb
            .ok("proc.output", json!({"pid": pid, "wait_ms": 500}))
            .await;
        text.push_str(out["stdout"].as_str().unwrap_or_default());
        text.push_str(out["pty"].as_str().unwrap_or_default());
        if !out["ended"].is_null() {
            return (text, out["ended"].clone());
        }
    }
    panic!("process {pid} never ended; so far: {text:?}");
}

/// Live processes work under gVisor: one with a stdin pipe, one under a terminal of the size
/// asked for (PTYs).
async fn live_processes(sb: &AgentSandbox) {
    let started = sb
        .ok(
            "cmd.run",
            json!({"command": "cat", "background": true, "stdin": true}),
        )
        .await;
    let pid = started["pid"].as_u64().expect("a pid");
    sb.ok(
        "proc.input",
        json!({"pid": pid, "data": "through gvisor\n", "close": true}),
    )
    .await;
    let (text, ended) = until_ended(sb, pid).await;
    assert_eq!(text, "through gvisor\n");
    assert_eq!(ended["exit_code"], 0, "{ended}");
    let started = sb
        .ok(
            "cmd.run",
            json!({"command": "stty size", "background": true, "pty": {"cols": 91, "rows": 27}}),
        )
        .await;
    let pid = started["pid"].as_u64().expect("a pid");
    let (text, ended) = until_ended(sb, pid).await;
    assert_eq!(text.trim(), "27 91", "{ended}");
}

/// Path escapes by `..`, by links planted in the workspace, and writes outside the allowlist:
/// all refused by the executor's path rules (its walk, under gVisor), none leaving a trace.
async fn path_attacks(engine: &GvisorEngine, sb: &AgentSandbox) {
    for path in ["../etc/passwd", "/workspace/../etc/passwd", "/etc/passwd"] {
        sb.refused("fs.read", json!({"path": path}), 403, "path_not_allowed")
            .await;
    }
    // Links planted by agent code (as in volume_attacks.rs): absolute, relative climbing out,
    // and a directory link; reading or writing through them stays beneath the root.
    let (code, _) = engine.inside(
        sb,
        &[
            "sh",
            "-c",
            "ln -s /etc /workspace/out/etc && ln -s ../../../etc/passwd /workspace/out/up && \
             ln -s /etc/passwd /workspace/out/abs && ln -s /tmp /workspace/out/tmp && \
             echo secret > /tmp/planted",
        ],
    );
    assert_eq!(code, 0, "the links were planted");
    for path in [
        "/workspace/out/etc/passwd",
        "/workspace/out/up",
        "/workspace/out/abs",
        "/workspace/out/tmp/planted",
    ] {
        let (status, out) = sb.call("fs.read", json!({"path": path})).await;
        assert_eq!(status, 200, "{path}: {out}");
        assert_eq!(
            out["isError"], true,
            "{path} was read through a link: {out}"
        );
        let text = out.to_string();
        assert!(!text.contains("root:x:0:0"), "{path}: {out}");
        assert!(!text.contains("secret"), "{path}: {out}");
    }
    for path in ["/workspace/out/tmp/written", "/workspace/out/etc/written"] {
        let (_, out) = sb
            .call("fs.write", json!({"path": path, "content": "x"}))
            .await;
        assert_eq!(
            out["isError"], true,
            "{path} was written through a link: {out}"
        );
    }
    let (code, _) = engine.inside(sb, &["ls", "/tmp/written"]);
    assert_ne!(code, 0, "a write through the link reached /tmp");
    // Outside the write allowlist, inside the readable workspace: refused.
    for path in ["/workspace/top.txt", "/etc/x"] {
        let write = json!({"path": path, "content": "x"});
        sb.refused("fs.write", write, 403, "path_not_allowed").await;
    }
    let (code, _) = engine.inside(sb, &["ls", "/workspace/top.txt"]);
    assert_ne!(code, 0, "the refused write left a file");
}

/// Commands: argv injection refused by the router; what an allowed shell tries, held by the
/// sandbox (read-only root, noexec workspace and /tmp, no capabilities, the executor's
/// descriptors closed), checked from inside.
async fn command_attacks(engine: &GvisorEngine, sb: &AgentSandbox) {
    // Programs off the allowlist, and paths for programs, are refused before the sandbox.
    for command in [
        "rm -rf /workspace",
        "/bin/sh -c id",
        "wget http://example.com",
    ] {
        let (status, out) = sb
            .call("cmd.run", json!({"command": command, "timeout_secs": 5}))
            .await;
        assert_eq!(status, 403, "{command}: {out}");
    }
    // The root is read-only, whatever gVisor's kernel allows otherwise.
    let r = run(sb, "sh -c 'echo x > /etc/planted; echo $?'").await;
    assert_ne!(r["stdout"], "0\n", "wrote to the image: {r}");
    let (code, _) = engine.inside(sb, &["ls", "/etc/planted"]);
    assert_ne!(code, 0);
    // A file written to /tmp does not run: its noexec holds under gVisor too. (The workspace
    // volume's noexec does not: ARCHITECTURE.md, "The gVisor class", lists it as open.)
    let r = run(
        sb,
        "sh -c 'printf \"#!/bin/sh\\necho ran\\n\" > /tmp/x.sh; chmod +x /tmp/x.sh; /tmp/x.sh'",
    )
    .await;
    assert!(
        !r["stdout"].as_str().unwrap_or_default().contains("ran"),
        "a file written to /tmp ran: {r}"
    );
    assert!(
        common::json::text(&r["stderr"]).contains("Permission denied"),
        "{r}"
    );
    // The sandbox user, no capabilities, no_new_privs.
    let status = run(sb, "cat /proc/self/status").await;
    let status = status["stdout"].as_str().unwrap_or_default().to_owned();
    assert!(status.contains("Uid:\t65534"), "{status}");
    for line in ["CapEff:\t0000000000000000", "CapPrm:\t0000000000000000"] {
        assert!(status.contains(line), "{line} in {status}");
    }
    // A command inherits no descriptor of the executor (its streams, its roots): only its own
    // stdin, stdout, stderr and the directory `ls` reads.
    let fds = run(sb, "ls /proc/self/fd").await;
    let listed: Vec<&str> = fds["stdout"]
        .as_str()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert!(
        listed.len() <= 4,
        "descriptors leaked into the command: {fds}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_without_runsc_places_a_gvisor_sandbox_on_an_engine_that_has_it() {
    let engine = GvisorEngine::start();
    let db = TestDb::create().await;
    let replica = |host: Option<&str>| {
        let mut config = common::replicas::in_process(&db, Some(common::replicas::SECRET));
        common::gvisor::place_sandboxes(&mut config, host, Isolation::Gvisor);
        config
    };
    // A drives the host's engine (no runsc), B the gVisor one.
    let a = TestApp::spawn_with(replica(None)).await;
    let b = TestApp::spawn_with(replica(Some(&engine.host))).await;
    let sb = AgentSandbox::start(&a, agent()).await;
    let (placed_on, holder): (String, uuid::Uuid) =
        sqlx::query_as("SELECT engine, instance_id FROM sandboxes WHERE id = $1::uuid")
            .bind(&sb.id)
            .fetch_one(&a.state.pool)
            .await
            .expect("a sandbox row");
    assert_eq!(placed_on, b.engine_id(), "placed on the engine with runsc");
    assert_eq!(holder, b.state.instance_id);
    // Served through A, run by gVisor's kernel on B's engine.
    let uname = run(&sb, "uname -r").await;
    let release = uname["stdout"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .to_owned();
    assert!(!release.is_empty(), "{uname}");
    assert_ne!(release, host_kernel(), "{uname}");
    let (_, runtime) =
        engine.docker(&["inspect", "-f", "{{.HostConfig.Runtime}}", &sb.container()]);
    assert_eq!(runtime, "runsc");
}

#[tokio::test]
async fn a_node_without_runsc_refuses_a_gvisor_sandbox_and_leaves_nothing() {
    let db = TestDb::create().await;
    // The host's engine, which lists no `runsc` runtime here.
    let runtimes = common::docker_lines(&["info", "--format", "{{json .Runtimes}}"]).join("");
    assert!(
        !runtimes.contains("\"runsc\""),
        "this check needs an engine without runsc: {runtimes}"
    );
    let app = TestApp::spawn_with(common::gvisor::node_config(&db, None, Isolation::Gvisor)).await;
    let r = app
        .admin(Method::POST, "/v1/agents")
        .body(agent())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let r = app
        .admin(Method::POST, "/v1/sandboxes")
        .json(&json!({"agent": "gvisor-attacker"}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "isolation_unavailable", "{body}");
    let message = body["error"].as_str().unwrap_or_default();
    for needed in ["runsc", "apt-get install runsc", "daemon.json"] {
        assert!(message.contains(needed), "`{needed}` in {body}");
    }
    // No row, no container: it was never made as a runc container either.
    let rows: i64 = app.count("SELECT count(*) FROM sandboxes").await;
    assert_eq!(rows, 0);
    let instance = format!("label=org.aegis.instance={}", app.state.instance_id);
    assert!(
        common::docker_lines(&["ps", "-a", "-q", "--filter", &instance]).is_empty(),
        "a container was left"
    );
}
