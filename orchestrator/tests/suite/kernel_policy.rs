//! The allowlist holds in the kernel: concrete attacks through the real service against the
//! Debian shell runtime (`aegis-runtime/shell:bookworm`, built by scripts/test.sh), once with an
//! allowlist that names no interpreter and once with one that names bash.
//!
//! Each attack passes the argv policy on purpose (or shows its clear refusal first) and is then
//! stopped by what the executor's Landlock domain and per-command sub-reaper hold for every
//! process a command starts; each outcome is checked from inside the sandbox: the marker was not
//! created, nothing was written outside the write root, no process survived.

use crate::common;
use crate::common::agent::AgentManifest;

use std::process::Command;

use common::sandbox::AgentSandbox;
use common::TestApp;
use serde_json::{json, Value};

const SHELL_IMAGE: &str = "aegis-runtime/shell:bookworm";

/// An agent on the shell runtime with the file tools and `cmd.run` allowing `programs`, that
/// reads the workspace, writes beneath `/workspace/out`, in 128 MiB of memory and 16 MiB of disk.
fn shell_agent(name: &str, instruction: &str, programs: &[&str]) -> String {
    AgentManifest::new(name)
        .runtime("shell", "bookworm")
        .instruction(instruction)
        .tools(&["cmd.run", "fs.read", "fs.write", "fs.list"])
        .cmd(programs, 30, "          max_output_bytes: 65536\n")
        .filesystem(&["/workspace"], &["/workspace/out"])
        .security("    resources:\n      memory: 128Mi\n      disk: 16Mi\n")
        .yaml()
}

/// Programs that run no code of their own choosing; git reads a config the agent can plant,
/// tar and sort have options that run programs (granted here explicitly, as an operator might).
fn no_interpreter() -> String {
    shell_agent(
        "lister",
        "List and archive files.",
        &[
            "ls",
            "cat",
            "touch",
            "dd",
            "git",
            "sort",
            "sort -o",
            "tar",
            "tar --checkpoint-action",
        ],
    )
}

/// The same, with an interpreter on the allowlist.
fn with_interpreter() -> String {
    shell_agent(
        "scripter",
        "Run scripts.",
        &["bash", "bash -c", "ls", "cat", "sleep"],
    )
}

/// An agent's sandbox on the shell runtime, with the checks these attacks repeat.
struct Sb {
    sandbox: AgentSandbox,
}

impl Sb {
    async fn call(&self, name: &str, arguments: Value) -> (u16, Value) {
        self.sandbox.call(name, arguments).await
    }

    /// A command the policy accepts; returns its result (exit code, output, ...).
    async fn run(&self, command: &str, args: &[&str]) -> Value {
        let arguments = json!({"command": command, "args": args, "timeout_secs": 20});
        let (status, out) = self.call("cmd.run", arguments.clone()).await;
        assert_eq!(status, 200, "{arguments}: {out}");
        assert_eq!(out["isError"], false, "{arguments}: {out}");
        out["structuredContent"].clone()
    }

    /// A command the argv policy refuses, with the refusal's message.
    async fn refused(&self, command: &str, args: &[&str]) -> String {
        let arguments = json!({"command": command, "args": args});
        let (status, out) = self.call("cmd.run", arguments.clone()).await;
        assert_eq!(status, 403, "{arguments}: {out}");
        assert_eq!(out["code"], "command_not_allowed", "{arguments}: {out}");
        out["error"].as_str().unwrap_or_default().to_owned()
    }

    /// Names in a directory, from inside the sandbox.
    async fn names(&self, path: &str) -> Vec<String> {
        let (status, out) = self.call("fs.list", json!({"path": path})).await;
        assert_eq!(status, 200, "{out}");
        out["structuredContent"]["entries"]
            .as_array()
            .unwrap_or(&Vec::new())
            .iter()
            .filter_map(|e| e["name"].as_str().map(str::to_owned))
            .collect()
    }

    /// Pids in the sandbox's /proc, from inside (via `ls`, granted to both agents).
    async fn pids(&self) -> Vec<u32> {
        let r = self.run("ls /proc", &[]).await;
        r["stdout"]
            .as_str()
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect()
    }

    /// Nothing runs but the executor, its fork server, the listing's sub-reaper and the listing.
    async fn assert_nothing_survived(&self) {
        let pids = self.pids().await;
        assert_eq!(pids.len(), 4, "processes outlived their command: {pids:?}");
    }
}

async fn sandbox(app: &TestApp, manifest: &str) -> Sb {
    Sb {
        sandbox: AgentSandbox::start_on(app, manifest.to_owned(), SHELL_IMAGE).await,
    }
}

#[tokio::test]
async fn listed_programs_cannot_run_unlisted_ones_or_write_outside() {
    let app = TestApp::spawn().await;
    let ready: Value = app.get("/health/ready").await.json().await.unwrap();
    assert!(
        ready["checks"]["kernel_policy"]["landlock_abi"].as_u64() >= Some(1),
        "readiness reports the kernel's Landlock: {ready}"
    );
    let sb = sandbox(&app, &no_interpreter()).await;

    // The argv policy refuses what it knows, with a clear message: abbreviated long options,
    // option letters without a dash, git options before the subcommand, the loader.
    for (command, args) in [
        (
            "tar",
            &["-cf", "out/a.tar", "--use-compress-prog=touch", "out"][..],
        ),
        ("tar", &["cIf", "touch", "out/a.tar", "out"][..]),
        ("git", &["-c", "core.fsmonitor=touch", "status"][..]),
        ("sort", &["--compress-prog=touch", "/etc/hostname"][..]),
    ] {
        let message = sb.refused(command, args).await;
        assert!(
            message.contains("run code"),
            "{command} {args:?}: {message}"
        );
    }
    let message = sb.refused("ls", &["/lib64/ld-linux-x86-64.so.2"]).await;
    assert!(message.contains("dynamic loader"), "{message}");
    let (status, out) = sb
        .call(
            "cmd.run",
            json!({"command": "git status", "env_additions": {"GIT_CONFIG_COUNT": "1"}}),
        )
        .await;
    assert_eq!(
        (status, out["code"].as_str()),
        (403, Some("command_not_allowed")),
        "{out}"
    );

    // 1. tar's checkpoint action (granted by an over-generous entry) runs /bin/sh: the kernel
    //    refuses to execute it, so the marker is never created.
    let r = sb
        .run(
            "tar",
            &[
                "-cf",
                "/workspace/out/a.tar",
                "--checkpoint=1",
                "--checkpoint-action=exec=touch /workspace/out/tar-marker",
                "/etc/hostname",
            ],
        )
        .await;
    assert!(
        common::json::text(&r["stderr"]).contains("Permission denied"),
        "tar could not run the shell: {r}"
    );
    assert!(!sb
        .names("/workspace/out")
        .await
        .contains(&"tar-marker".to_owned()));

    // 2. sort -o (granted) writes where it is told, but the kernel holds the write root.
    let r = sb
        .run("sort", &["-o", "/workspace/sorted", "/etc/hostname"])
        .await;
    assert_ne!(r["exit_code"], 0, "{r}");
    let r = sb
        .run("sort", &["-o", "/dev/shm/sorted", "/etc/hostname"])
        .await;
    assert_ne!(r["exit_code"], 0, "{r}");
    let r = sb.run("touch", &["/workspace/touched"]).await;
    assert_ne!(r["exit_code"], 0, "{r}");
    let names = sb.names("/workspace").await;
    assert!(
        !names.contains(&"sorted".to_owned()) && !names.contains(&"touched".to_owned()),
        "nothing was written outside the write root: {names:?}"
    );
    let r = sb.run("ls", &["-a", "/dev/shm"]).await;
    assert!(
        !r["stdout"].as_str().unwrap_or_default().contains("sorted"),
        "{r}"
    );
    // ... and inside it, writing works.
    let r = sb
        .run("sort", &["-o", "/workspace/out/sorted", "/etc/hostname"])
        .await;
    assert_eq!(r["exit_code"], 0, "{r}");

    // 3. A planted .git/config whose core.fsmonitor names a program: `git status` (allowed) runs
    //    it, directly (`mkdir`, no shell needed) or through sh; the kernel refuses both.
    let r = sb.run("git", &["init", "-q", "/workspace/out/repo"]).await;
    assert_eq!(r["exit_code"], 0, "{r}");
    for (fsmonitor, marker) in [
        ("/usr/bin/mkdir", "2"),
        ("touch /workspace/out/repo/sh-marker", "sh-marker"),
    ] {
        let config = format!(
            "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tfsmonitor = {fsmonitor}\n"
        );
        let (status, out) = sb
            .call(
                "fs.write",
                json!({"path": "/workspace/out/repo/.git/config", "content": config}),
            )
            .await;
        assert_eq!(status, 200, "{out}");
        let r = sb
            .call(
                "cmd.run",
                json!({"command": "git status", "cwd": "/workspace/out/repo", "timeout_secs": 20}),
            )
            .await;
        assert_eq!(r.0, 200, "{r:?}");
        let names = sb.names("/workspace/out/repo").await;
        assert!(
            !names.contains(&marker.to_owned()),
            "fsmonitor `{fsmonitor}` ran: {names:?} {r:?}"
        );
    }

    // 4. Disk: the workspace has a size limit (16Mi here) that neither a command nor fs.write
    //    passes; the sandbox keeps serving.
    let r = sb
        .run(
            "dd",
            &[
                "if=/dev/zero",
                "of=/workspace/out/fill",
                "bs=1M",
                "count=64",
            ],
        )
        .await;
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(common::json::text(&r["stderr"]).contains("No space"), "{r}");
    let (status, out) = sb
        .call(
            "fs.write",
            json!({"path": "/workspace/out/more", "content": "x".repeat(1 << 20)}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["isError"], true, "{out}");
    assert_eq!(
        out["structuredContent"]["error"]["code"], "no_space",
        "{out}"
    );
    let r = sb
        .run("ls", &["-s", "--block-size=1M", "/workspace/out/fill"])
        .await;
    let size: u64 = r["stdout"]
        .as_str()
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(size <= 16, "the fill stopped at the limit: {r}");

    sb.assert_nothing_survived().await;

    // What Docker was told: no HEALTHCHECK, descriptor and process limits, a sized noexec
    // tmpfs workspace.
    assert_eq!(
        sb.sandbox.inspect("{{json .Config.Healthcheck.Test}}"),
        "[\"NONE\"]"
    );
    let ulimits = sb.sandbox.inspect("{{json .HostConfig.Ulimits}}");
    assert!(
        ulimits.contains("nofile") && ulimits.contains("nproc"),
        "{ulimits}"
    );
    let volume = format!("aegis-ws-{}", sb.sandbox.id);
    let out = Command::new("docker")
        .args(["volume", "inspect", "-f", "{{json .Options}}", &volume])
        .output()
        .unwrap();
    let options = String::from_utf8_lossy(&out.stdout);
    assert!(
        options.contains("tmpfs")
            && options.contains("size=16777216")
            && options.contains("noexec"),
        "{options}"
    );
}

#[tokio::test]
async fn an_allowlisted_interpreter_is_held_by_the_kernel_too() {
    let app = TestApp::spawn().await;
    let sb = sandbox(&app, &with_interpreter()).await;

    let bash = |script: &'static str| (script, ["-c", script]);

    // Executing an unlisted program, directly or through its path, is refused by the kernel.
    let (_, args) = bash("touch /workspace/out/marker; /usr/bin/id; perl -e 'print 1'");
    let r = sb.run("bash", &args).await;
    let stderr = r["stderr"].as_str().unwrap_or_default();
    assert_eq!(stderr.matches("Permission denied").count(), 3, "{r}");
    assert!(!sb
        .names("/workspace/out")
        .await
        .contains(&"marker".to_owned()));

    // A planted binary cannot run: the workspace is mounted noexec, so even the dynamic loader
    // (named in pieces, which the argv policy cannot see through) cannot map it.
    let (_, args) = bash(
        "cat /usr/bin/true > /workspace/out/t; L=/lib64/ld-lin; ${L}ux-x86-64.so.2 /workspace/out/t",
    );
    let r = sb.run("bash", &args).await;
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(
        common::json::text(&r["stderr"]).contains("failed to map segment"),
        "{r}"
    );

    // Writes outside the write root and /tmp are refused; /tmp works.
    let (_, args) = bash(
        "echo x > /workspace/outside; echo x > /dev/shm/outside; echo x > /tmp/ok && cat /tmp/ok",
    );
    let r = sb.run("bash", &args).await;
    assert_eq!(r["stdout"], "x\n", "{r}");
    assert_eq!(
        r["stderr"]
            .as_str()
            .unwrap_or_default()
            .matches("Permission denied")
            .count(),
        2,
        "{r}"
    );
    assert!(!sb.names("/workspace").await.contains(&"outside".to_owned()));

    // No TCP without egress (refused by Landlock before the network is even tried).
    let (_, args) = bash("echo > /dev/tcp/127.0.0.1/9");
    let r = sb.run("bash", &args).await;
    assert!(
        common::json::text(&r["stderr"]).contains("Permission denied"),
        "{r}"
    );

    // No signal leaves the command: the executor (PID 1) stays untouchable.
    let (_, args) = bash("kill -9 1");
    let r = sb.run("bash", &args).await;
    assert_ne!(r["exit_code"], 0, "{r}");

    // Nothing a command starts outlives it: background jobs, setsid, double forks, nohup.
    let (_, args) = bash(
        "sleep 300 & setsid sleep 301 & (sleep 302 &) ; nohup sleep 303 >/dev/null 2>&1 & \
         sleep 0.5; echo started",
    );
    let r = sb.run("bash", &args).await;
    assert_eq!(r["stdout"], "started\n", "{r}");
    sb.assert_nothing_survived().await;

    // A timeout whose command ignores SIGTERM and escaped its group: everything is killed.
    let arguments = json!({"command": "bash -c", "args": ["trap '' TERM; setsid sleep 304 & sleep 305"], "timeout_secs": 1});
    let (status, out) = sb.call("cmd.run", arguments).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["structuredContent"]["timed_out"], true, "{out}");
    sb.assert_nothing_survived().await;

    // The loader as a program is refused by the argv policy wherever it is named.
    let message = sb
        .refused("bash", &["-c", "/lib64/ld-linux-x86-64.so.2 /usr/bin/id"])
        .await;
    assert!(message.contains("dynamic loader"), "{message}");
}
