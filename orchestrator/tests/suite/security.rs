//! Concrete attacks against a sandbox, through the real service. The agent here is deliberately
//! permissive (it may run `sh -c` with metacharacters) to show that the container contains what
//! the allowlist lets through: each attack is followed by a check from inside the sandbox.
//! (Refusals by the allowlist itself are in tests/suite/sandboxes.rs and policy::command's unit tests.)

use crate::common;

use common::agent::AgentManifest;
use common::sandbox::AgentSandbox;
use common::TestApp;
use serde_json::{json, Value};

fn attacker_manifest() -> String {
    AgentManifest::new("attacker")
        .instruction("Try to get out.")
        .tools(&["cmd.run", "fs.read", "fs.write"])
        .cmd(
            &["sh", "sh -c", "echo", "cat", "ls", "ps", "head", "dd", "id"],
            30,
            "          allow_metacharacters: true\n          max_output_bytes: 65536\n",
        )
        .filesystem(&["/workspace"], &["/workspace"])
        .security("    resources:\n      memory: 128Mi\n      disk: 64Mi\n")
        .yaml()
}

/// The attacker's sandbox; its commands go through `cmd.run` with the admin key.
struct Sb {
    sandbox: AgentSandbox,
}

impl Sb {
    async fn run(&self, command: &str, timeout: u64) -> Value {
        self.sandbox
            .ok(
                "cmd.run",
                json!({"command": command, "timeout_secs": timeout}),
            )
            .await
    }

    async fn alive(&self) {
        let r = self.run("echo alive", 10).await;
        assert_eq!(r["stdout"], "alive\n", "the sandbox still answers: {r}");
    }
}

async fn attacker(app: &TestApp) -> Sb {
    Sb {
        sandbox: AgentSandbox::start(app, attacker_manifest()).await,
    }
}

#[tokio::test]
async fn escape_attempts_find_nothing_to_escape_with() {
    let app = TestApp::spawn().await;
    let sb = attacker(&app).await;

    // No Docker socket anywhere an agent could reach.
    let r = sb
        .run("ls -la /var/run/docker.sock /run/docker.sock", 10)
        .await;
    assert_ne!(r["exit_code"], 0, "{r}");
    // Agent processes run as 65534 with every capability set empty and no_new_privs.
    let r = sb.run("cat /proc/self/status", 10).await;
    let status = r["stdout"].as_str().unwrap();
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let line = status.lines().find(|l| l.starts_with(cap)).unwrap();
        if cap != "CapBnd" {
            assert!(line.ends_with("0000000000000000"), "{line}");
        }
    }
    assert!(
        status.lines().any(|l| l.starts_with("NoNewPrivs:\t1")),
        "{status}"
    );
    assert!(
        status.lines().any(|l| l.starts_with("Uid:\t65534")),
        "{status}"
    );
    // The root filesystem is read-only; nothing lands in it.
    let r = sb
        .run("sh -c 'echo x > /etc/pwned; echo x > /bin/pwned'", 10)
        .await;
    assert_ne!(r["exit_code"], 0, "{r}");
    let r = sb.run("ls /etc/pwned /bin/pwned", 10).await;
    assert_ne!(r["exit_code"], 0, "nothing was written: {r}");
    // No network interface but loopback when none was granted.
    let r = sb.run("ls /sys/class/net", 10).await;
    assert_eq!(r["stdout"], "lo\n", "{r}");
    // The executor (PID 1, uid 0) cannot be signalled or read by agent code.
    let r = sb.run("sh -c 'kill -9 1; cat /proc/1/environ'", 10).await;
    assert_ne!(r["exit_code"], 0, "{r}");
    sb.alive().await;
    // What Docker was told.
    assert_eq!(sb.sandbox.inspect("{{.HostConfig.Privileged}}"), "false");
    assert_eq!(sb.sandbox.inspect("{{.HostConfig.ReadonlyRootfs}}"), "true");
    assert_eq!(sb.sandbox.inspect("{{.HostConfig.NetworkMode}}"), "none");
    let binds = sb.sandbox.inspect("{{json .HostConfig.Binds}}");
    assert!(binds == "null" || binds == "[]", "{binds}");
    let devices = sb.sandbox.inspect("{{json .HostConfig.Devices}}");
    assert!(devices == "null" || devices == "[]", "{devices}");
    assert!(sb
        .sandbox
        .inspect("{{json .HostConfig.SecurityOpt}}")
        .contains("no-new-privileges"));
}

/// The command's sub-reaper shares its memory with the executor's fork server (and with every
/// other sub-reaper): a command can neither read that memory nor trace or signal either of
/// them, nor the executor; each step is checked from inside the sandbox.
#[tokio::test]
async fn a_command_cannot_read_or_signal_its_sub_reaper_or_the_fork_server() {
    let app = TestApp::spawn().await;
    let sb = attacker(&app).await;
    let script = r#"sh -c 'server=$(for d in /proc/[0-9]*; do [ "$(cat $d/comm 2>/dev/null)" = fork-server ] && echo ${d#/proc/}; done); for p in 1 $PPID $server; do echo "pid $p"; (exec 3</proc/$p/mem) 2>/dev/null && echo "OPENED mem $p"; cat /proc/$p/maps >/dev/null 2>&1 && echo "READ maps $p"; cat /proc/$p/environ >/dev/null 2>&1 && echo "READ environ $p"; kill -9 $p 2>/dev/null && echo "KILLED $p"; done; echo done'"#;
    let r = sb.run(script, 20).await;
    let out = r["stdout"].as_str().unwrap_or_default();
    let pids: Vec<&str> = out.lines().filter(|l| l.starts_with("pid ")).collect();
    assert_eq!(
        pids.len(),
        3,
        "the executor, this command's sub-reaper and the fork server were all tried: {r}"
    );
    assert!(
        pids.iter().all(|l| l != &"pid " && l != &"pid 1 "),
        "every pid was found: {r}"
    );
    for forbidden in ["OPENED", "READ", "KILLED"] {
        assert!(!out.contains(forbidden), "{forbidden}: {r}");
    }
    assert!(out.ends_with("done\n"), "{r}");
    // Both still serve: the next commands start, confined as before.
    sb.alive().await;
    let r = sb.run("cat /proc/self/status", 10).await;
    assert!(
        r["stdout"]
            .as_str()
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with("NoNewPrivs:\t1")),
        "{r}"
    );
}

#[tokio::test]
async fn resource_attacks_are_contained() {
    let app = TestApp::spawn().await;
    let sb = attacker(&app).await;

    // Fork bomb: the pids limit stops it, the timeout kills what is left, the sandbox survives.
    // (The shell reports failed forks once the limit is reached; the leader may still exit 0.)
    sb.run("sh -c 'b(){ b|b& }; b'", 5).await;
    sb.alive().await;
    assert_eq!(sb.sandbox.inspect("{{.HostConfig.PidsLimit}}"), "256");
    let r = sb.run("ps", 10).await;
    let lines = r["stdout"].as_str().unwrap().lines().count();
    assert!(lines < 10, "the bomb's processes are gone: {r}");

    // Memory balloon: the cgroup limit kills the balloon, not the sandbox.
    let r = sb
        .run(
            "sh -c 'head -c 1000000000 /dev/zero | tail -c 1000000000 > /dev/null'",
            20,
        )
        .await;
    assert_ne!(r["exit_code"], 0, "{r}");
    sb.alive().await;

    // Filling /tmp stops at its tmpfs size.
    let r = sb
        .run("dd if=/dev/zero of=/tmp/fill bs=1048576 count=1024", 20)
        .await;
    assert_ne!(r["exit_code"], 0, "{r}");
    assert!(r["stderr"].as_str().unwrap().contains("space"), "{r}");
    sb.alive().await;

    // 200 MiB of output: capped while streaming, counted in full.
    let r = sb.run("head -c 209715200 /dev/zero", 30).await;
    assert_eq!(r["truncated"], true);
    assert_eq!(r["stdout_bytes"], 209_715_200u64);
    assert!(r["stdout"].as_str().unwrap().len() <= 65536);

    // A child that outlives its parent does not hang the call and does not survive it.
    let r = sb.run("sh -c 'sleep 100 & echo started'", 20).await;
    assert_eq!(r["stdout"], "started\n", "{r}");
    assert!(r["duration_ms"].as_u64().unwrap() < 15_000, "{r}");
    let r = sb.run("ps", 10).await;
    assert!(
        !r["stdout"].as_str().unwrap().contains("sleep 100"),
        "orphan killed: {r}"
    );
}
