//! Sandboxes through the real service: an agent's sandbox, every fs tool and cmd.run through
//! `POST /v1/tools/call`, the manifest's allowlists, and cleanup.
//!
//! Every refusal is checked from inside the sandbox too: the forbidden file was not written, the
//! forbidden command left no trace.

use crate::common;
use crate::common::agent::AgentManifest;

use common::sandbox::AgentSandbox;
use common::TestApp;
use reqwest::Method;
use serde_json::{json, Value};

/// A busybox agent that may read /workspace, write /workspace/out, and run a few commands.
fn agent(name: &str) -> String {
    AgentManifest::new(name)
        .instruction("Work in the sandbox.")
        .tools_listed(
            "cmd.run, fs.read, fs.write, fs.list, fs.create_dir, fs.delete, fs.edit, \
             fs.multi_edit, fs.grep, fs.glob",
        )
        .cmd(
            &["echo", "id", "cat", "ls", "sleep", "head", "find", "ps"],
            20,
            "          env_allowlist: [GREETING]\n          max_output_bytes: 65536\n",
        )
        .spec("  env:\n    PLANET: earth\n    GREETING: hello\n")
        .filesystem(&["/workspace"], &["/workspace/out"])
        .yaml()
}

fn docker(args: &[&str]) -> String {
    common::docker_out(args).1
}

#[tokio::test]
async fn fs_tools_work_inside_the_allowlist_and_refuse_outside_it() {
    let app = TestApp::spawn().await;
    let sb = AgentSandbox::start(&app, agent("fs-agent")).await;

    let w = sb
        .ok(
            "fs.write",
            json!({"path": "/workspace/out/notes/a.txt", "content": "alpha\nbeta\n"}),
        )
        .await;
    assert_eq!(w["bytes_written"], 11);
    let r = sb.ok("fs.read", json!({"path": "out/notes/a.txt"})).await;
    assert_eq!(r["content"], "alpha\nbeta\n");
    assert_eq!(r["path"], "/workspace/out/notes/a.txt");
    sb.ok("fs.create_dir", json!({"path": "/workspace/out/d1/d2"}))
        .await;
    sb.ok("fs.create.dir", json!({"path": "/workspace/out/d3"}))
        .await;
    let l = sb.ok("fs.list", json!({"path": "/workspace/out"})).await;
    let names = common::json::strs(&l["entries"], "name");
    assert_eq!(names, ["d1", "d3", "notes"]);
    sb.ok("fs.edit", json!({"path": "/workspace/out/notes/a.txt", "target_content": "beta", "replacement_content": "gamma"})).await;
    let out = sb.tool_error("fs.edit", json!({"path": "/workspace/out/notes/a.txt", "target_content": "zzz", "replacement_content": "y"}), "edit_target_not_found").await;
    assert!(out.to_string().contains("does not occur"), "{out}");
    sb.ok(
        "fs.write",
        json!({"path": "/workspace/out/twice.txt", "content": "x x"}),
    )
    .await;
    let out = sb.tool_error("fs.edit", json!({"path": "/workspace/out/twice.txt", "target_content": "x", "replacement_content": "y"}), "edit_target_ambiguous").await;
    assert!(out.to_string().contains('2'), "says how many times: {out}");
    // multi_edit is all or nothing.
    sb.tool_error(
        "fs.multi_edit",
        json!({"path": "/workspace/out/notes/a.txt", "edits": [
        {"target_content": "alpha", "replacement_content": "ALPHA"},
        {"target_content": "missing", "replacement_content": "x"}]}),
        "edit_target_not_found",
    )
    .await;
    assert_eq!(
        sb.ok("fs.read", json!({"path": "/workspace/out/notes/a.txt"}))
            .await["content"],
        "alpha\ngamma\n"
    );
    let m = sb
        .ok(
            "fs.multi_edit",
            json!({"path": "/workspace/out/notes/a.txt", "edits": [
        {"target_content": "alpha", "replacement_content": "ALPHA"},
        {"target_content": "gamma", "replacement_content": "GAMMA"}]}),
        )
        .await;
    assert_eq!(m["applied"], 2);
    for (tool, pattern, count) in [("fs.grep", "GAM+A", 1), ("fs.glob", "**/*.txt", 2)] {
        let found = sb
            .ok(tool, json!({"pattern": pattern, "path": "/workspace/out"}))
            .await;
        assert_eq!(found["count"], count, "{tool}: {found}");
    }
    sb.tool_error(
        "fs.delete",
        json!({"path": "/workspace/out/notes"}),
        "invalid_target",
    )
    .await;
    sb.ok(
        "fs.delete",
        json!({"path": "/workspace/out/notes", "recursive": true}),
    )
    .await;
    sb.tool_error(
        "fs.read",
        json!({"path": "/workspace/out/notes/a.txt"}),
        "not_found",
    )
    .await;

    // Invalid arguments: schema refusals name the path.
    for (tool, bad) in [
        ("fs.read", json!({})),
        ("fs.write", json!({"path": "/workspace/out/x"})),
        ("fs.list", json!({"path": 1})),
        ("fs.create_dir", json!({"path": ""})),
        ("fs.delete", json!({"path": "x", "recursive": "yes"})),
        ("fs.edit", json!({"path": "x", "target_content": "a"})),
        ("fs.multi_edit", json!({"path": "x", "edits": [{}]})),
        ("fs.grep", json!({"pattern": "a"})),
        ("fs.glob", json!({"path": "/workspace"})),
    ] {
        sb.refused(tool, bad, 422, "invalid_arguments").await;
    }

    // Writes outside the write allowlist, reads outside the read allowlist, escapes.
    for path in [
        "/workspace/x.txt",
        "/workspacex/a",
        "../etc/passwd",
        "/etc/passwd",
        "/tmp/x",
        "/proc/self/root/etc/x",
        "/workspace/out/../x",
    ] {
        sb.refused(
            "fs.write",
            json!({"path": path, "content": "pwned"}),
            403,
            "path_not_allowed",
        )
        .await;
    }
    for path in [
        "/etc/passwd",
        "/workspacex",
        "/proc/self/root/etc/passwd",
        "/workspace/../etc/passwd",
    ] {
        sb.refused("fs.read", json!({"path": path}), 403, "path_not_allowed")
            .await;
    }
    // ... and from inside: nothing was written.
    let (_, listing) = sb.inside(&["/bin/ls", "-a", "/workspace", "/tmp"]);
    assert!(!listing.contains("x.txt"), "{listing}");
    let (code, _) = sb.inside(&["/bin/ls", "/tmp/x"]);
    assert_ne!(code, 0, "/tmp/x must not exist");

    // Symlinks planted in the workspace cannot lead out (the executor resolves beneath the root).
    sb.ok("fs.create_dir", json!({"path": "/workspace/out/links"}))
        .await;
    let (code, _) = sb.inside(&["/bin/ln", "-s", "/etc", "/workspace/out/links/etc"]);
    assert_eq!(code, 0);
    let (code, _) = sb.inside(&[
        "/bin/ln",
        "-s",
        "../../../etc/passwd",
        "/workspace/out/links/rel",
    ]);
    assert_eq!(code, 0);
    sb.tool_errors_each(vec![
        (
            "fs.read",
            json!({"path": "/workspace/out/links/etc/passwd"}),
            "path_not_allowed",
        ),
        (
            "fs.read",
            json!({"path": "/workspace/out/links/rel"}),
            "path_not_allowed",
        ),
        (
            "fs.write",
            json!({"path": "/workspace/out/links/etc/evil", "content": "x"}),
            "path_not_allowed",
        ),
    ])
    .await;
    let (code, _) = sb.inside(&["/bin/ls", "/etc/evil"]);
    assert_ne!(code, 0, "nothing written through the symlink");
    // A file with two hard links is refused for writing.
    sb.ok(
        "fs.write",
        json!({"path": "/workspace/out/h1", "content": "one"}),
    )
    .await;
    let (code, _) = sb.inside(&["/bin/ln", "/workspace/out/h1", "/workspace/out/h2"]);
    assert_eq!(code, 0);
    sb.tool_error(
        "fs.write",
        json!({"path": "/workspace/out/h2", "content": "two"}),
        "hard_link_refused",
    )
    .await;
    let (_, content) = sb.inside(&["/bin/cat", "/workspace/out/h1"]);
    assert_eq!(content, "one");

    // Files belong to the unprivileged sandbox user.
    let (_, owner) = sb.inside(&["/bin/stat", "-c", "%u:%g", "/workspace/out/h1"]);
    assert_eq!(owner.trim(), "65534:65534");
}

#[tokio::test]
async fn cmd_run_runs_without_a_shell_under_the_allowlist() {
    let app = TestApp::spawn().await;
    let sb = AgentSandbox::start(&app, agent("cmd-agent")).await;

    let r = sb.ok("cmd.run", json!({"command": "id -u"})).await;
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["stdout"], "65534\n");
    let r = sb
        .ok(
            "cmd.run",
            json!({"command": "echo 'a  b' c", "args": ["$HOME", ";id"]}),
        )
        .await;
    assert_eq!(
        r["stdout"], "a  b c $HOME ;id\n",
        "args are passed verbatim, nothing expanded"
    );
    let r = sb
        .ok("cmd.run", json!({"command": "cat /workspace/nope"}))
        .await;
    assert_ne!(r["exit_code"], 0, "a failing command is a normal result");
    assert!(r["stderr"].as_str().unwrap().contains("nope"));
    // The agent's spec.env is every command's environment ...
    let r = sb
        .ok("cmd.run", json!({"command": "cat /proc/self/environ"}))
        .await;
    let environ = r["stdout"].as_str().unwrap();
    assert!(
        environ.contains("PLANET=earth") && environ.contains("GREETING=hello"),
        "{r}"
    );
    // ... and the caller's allowlisted additions override it.
    let r = sb
        .ok(
            "cmd.run",
            json!({"command": "cat /proc/self/environ", "env_additions": {"GREETING": "hi"}}),
        )
        .await;
    let environ = r["stdout"].as_str().unwrap();
    assert!(
        environ.contains("GREETING=hi") && !environ.contains("GREETING=hello"),
        "{r}"
    );
    assert!(environ.contains("PLANET=earth"), "{r}");
    let r = sb
        .ok("cmd.run", json!({"command": "ls", "cwd": "/workspace"}))
        .await;
    assert_eq!(r["exit_code"], 0);

    // Shell syntax, wrappers, paths, unlisted programs, forbidden environment.
    for command in [
        "echo hi; id",
        "echo hi | cat",
        "echo $(id)",
        "echo `id`",
        "echo hi > /workspace/out/f",
        "echo hi && id",
        "sh -c id",
        "busybox sh",
        "env id",
        "xargs id",
        "timeout 5 id",
        "/bin/id",
        "rm -rf /workspace",
        "find . -exec id {} +",
    ] {
        sb.refused(
            "cmd.run",
            json!({"command": command}),
            403,
            "command_not_allowed",
        )
        .await;
    }
    for env in [
        json!({"LD_PRELOAD": "/tmp/x.so"}),
        json!({"PATH": "/tmp"}),
        json!({"SECRET": "x"}),
    ] {
        sb.refused(
            "cmd.run",
            json!({"command": "id", "env_additions": env}),
            403,
            "command_not_allowed",
        )
        .await;
    }
    sb.refuses_each(vec![
        (
            "cmd.run",
            json!({"command": "ls", "cwd": "/etc"}),
            403,
            "path_not_allowed",
        ),
        ("cmd.run", json!({"command": ""}), 422, "invalid_arguments"),
        (
            "cmd.run",
            json!({"command": "id", "timeout_secs": 0}),
            422,
            "invalid_arguments",
        ),
    ])
    .await;
    let (code, _) = sb.inside(&["/bin/ls", "/workspace/out/f"]);
    assert_ne!(code, 0, "the refused redirection wrote nothing");

    // Timeout: the caller may lower the ceiling; the process group dies.
    let r = sb
        .ok("cmd.run", json!({"command": "sleep 30", "timeout_secs": 1}))
        .await;
    assert_eq!(r["timed_out"], true, "{r}");
    let (_, ps) = sb.inside(&["/bin/ps"]);
    assert!(
        !ps.contains("sleep 30"),
        "the timed-out command is gone: {ps}"
    );
    // A caller cannot raise the manifest's ceiling (20 s): 1000 s is clamped, not honoured.
    let r = sb
        .ok(
            "cmd.run",
            json!({"command": "echo ok", "timeout_secs": 1000}),
        )
        .await;
    assert_eq!(r["exit_code"], 0);

    // Output is capped while streaming, with the full count and a flag.
    let r = sb
        .ok("cmd.run", json!({"command": "head -c 1048576 /dev/zero"}))
        .await;
    assert_eq!(r["truncated"], true, "{}", r["notice"]);
    assert_eq!(r["stdout_bytes"], 1048576);
    assert!(r["notice"].is_string());
    let r = sb
        .ok(
            "cmd.run",
            json!({"command": "head -c 100000 /dev/zero", "max_output_bytes": 10}),
        )
        .await;
    assert_eq!(r["truncated"], true);

    // Tools outside spec.tools and sandbox tools without a sandbox are refused.
    let (status, out) = app.call_tool("cmd.run", json!({"command": "id"})).await;
    assert_eq!(status, 400, "{out}");
    assert_eq!(out["code"], "sandbox_required");
}

#[tokio::test]
async fn sandboxes_are_listed_and_destroyed_with_their_workspace() {
    let app = TestApp::spawn().await;
    let sb = AgentSandbox::start(&app, agent("life-agent")).await;
    let container = sb.container();
    assert_eq!(sb.inspect("{{.State.Running}}"), "true");
    let hardening = sb.inspect("{{json .HostConfig}}");
    let host: Value = serde_json::from_str(&hardening).unwrap();
    assert_eq!(host["ReadonlyRootfs"], true);
    assert_eq!(host["NetworkMode"], "none");
    assert_eq!(host["Privileged"], false);
    assert_eq!(host["CapDrop"], json!(["ALL"]));
    assert!(
        host["Binds"].is_null() || host["Binds"] == json!([]),
        "{host}"
    );

    let list = app.get_value("/v1/sandboxes").await;
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == sb.id.as_str()),
        "{list}"
    );

    app.answered(
        Method::DELETE,
        &format!("/v1/sandboxes/{}", sb.id),
        None,
        200,
    )
    .await;
    assert!(
        docker(&["ps", "-aq", "--filter", &format!("name={container}")]).is_empty(),
        "container removed"
    );
    assert!(
        docker(&[
            "volume",
            "ls",
            "-q",
            "--filter",
            &format!("label=org.aegis.sandbox={}", sb.id)
        ])
        .is_empty(),
        "workspace removed"
    );
    let (status, out) = sb.call("fs.list", json!({"path": "/workspace"})).await;
    assert!(status == 404 || out["isError"] == true, "{status} {out}");
    let r = app
        .response(Method::DELETE, &format!("/v1/sandboxes/{}", sb.id), None)
        .await;
    assert!(r.status() == 404 || r.status() == 200);

    app.posted("/v1/sandboxes", json!({"agent": "nobody"}), 404)
        .await;
}

#[tokio::test]
async fn a_graceful_restart_reattaches_to_running_sandboxes() {
    let db = common::TestDb::create().await;
    // Rolling restarts keep the sandboxes (the default destroys them; see tests/suite/ops.rs).
    let mut config = common::test_config(&db.url);
    config.shutdown.sandboxes = orchestrator::config::ShutdownSandboxes::Keep;
    let app = TestApp::spawn_with(config).await;
    let sb = AgentSandbox::start(&app, agent("keeper")).await;
    let id = sb.id.clone();
    sb.ok(
        "fs.write",
        json!({"path": "/workspace/out/kept.txt", "content": "still here"}),
    )
    .await;
    drop(sb);
    app.stop().await.expect("graceful stop");
    assert_eq!(
        docker(&[
            "inspect",
            "-f",
            "{{.State.Running}}",
            &format!("aegis-sbx-{id}")
        ]),
        "true",
        "the sandbox outlives a graceful stop"
    );

    let app = TestApp::spawn_with(common::test_config(&db.url)).await;
    let sb = AgentSandbox::of(&app, &id);
    let r = sb
        .ok("fs.read", json!({"path": "/workspace/out/kept.txt"}))
        .await;
    assert_eq!(
        r["content"], "still here",
        "the new instance serves the old sandbox"
    );
    let r = sb.ok("cmd.run", json!({"command": "id -u"})).await;
    assert_eq!(r["stdout"], "65534\n");
    let owner: String = app
        .one(
            "SELECT instance_id::text FROM sandboxes WHERE id = $1::uuid",
            &id,
        )
        .await;
    assert_eq!(owner, app.state.instance_id.to_string());
}
