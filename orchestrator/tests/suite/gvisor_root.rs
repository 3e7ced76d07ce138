//! Root inside gVisor only (issue 44): E2B's own Python SDK (`tests/python/e2b_root_client.py`)
//! runs commands, files and a terminal as `root` in a sandbox of the `base` template on a node
//! whose sandboxes run in gVisor (the runsc engine of `common::gvisor`), and gets root there:
//! uid 0 with the root capability set, files that belong to root in a directory only root may
//! enter. The sandbox user of that same sandbox cannot become root (a set-uid root program root
//! made, `su`) nor read what root keeps, checked from inside; root itself stays held by the
//! files API's path rules and the read-only image and executor. The same calls in a
//! container-class sandbox are refused with a message saying why and how. Our own doors'
//! `cmd.run` keeps its user rules in a gVisor sandbox unless the agent's manifest asks for root
//! (`spec.security.allow_root`), which a container-class sandbox never grants.

use serde_json::{json, Value};

use crate::common::{
    self, agent::AgentManifest, gvisor::GvisorEngine, sandbox::AgentSandbox, TestApp, TestDb,
};
use dispatcher::Isolation;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/python/e2b_root_client.py"
);

/// The `base` template's image (E2B's sandboxes) and the agent runtime of [`agent`].
const BASE_IMAGE: &str = "aegis-runtime/base:bookworm";
const BUSYBOX_IMAGE: &str = "aegis-runtime/busybox:1";

/// The root capability set as `/proc/self/status` prints it (`CapEff`): CHOWN, DAC_OVERRIDE,
/// FOWNER, FSETID, KILL, SETGID, SETUID, NET_BIND_SERVICE, SYS_CHROOT, AUDIT_WRITE.
const ROOT_CAPS: &str = "00000000200404fb";

/// An agent named `name` with a shell, whose manifest asks for root (`spec.security.allow_root`)
/// when `root` says so and nothing about users otherwise.
fn agent(name: &str, root: bool) -> String {
    let manifest = AgentManifest::new(name)
        .instruction("Try to be root.")
        .tools(&["cmd.run", "fs.read", "fs.write"])
        .cmd(
            &["id", "sh", "sh -c"],
            30,
            "          allow_metacharacters: true\n          max_output_bytes: 65536\n",
        )
        .filesystem(&["/workspace"], &["/workspace"]);
    if root {
        manifest.security("    allow_root: true\n").yaml()
    } else {
        manifest.yaml()
    }
}

/// `id -u` as root through our own door, which must be refused (`permission_denied`); the
/// error.
async fn root_refused(sb: &AgentSandbox) -> Value {
    let as_root = json!({"command": "id -u", "user": "root"});
    sb.tool_error("cmd.run", as_root, "permission_denied").await
}

async fn scenario(app: &TestApp, name: &str) -> Value {
    let key = app.create_key("e2b-root", "operator").await;
    let needs = "`pip install e2b==2.45.1`, which scripts/test.sh does";
    common::python_client::run(common::python_client::Scenario::on(
        app,
        SCRIPT,
        &[name],
        &key,
        needs,
    ))
    .await
}

fn ok<'a>(report: &'a Value, step: &str) -> &'a Value {
    assert_eq!(report[step]["ok"], true, "{step}: {}", report[step]);
    &report[step]["value"]
}

/// A step that raised, with `needles` in its error.
fn refused(report: &Value, step: &str, needles: &[&str]) {
    assert_eq!(
        report[step]["ok"], false,
        "{step} must fail: {}",
        report[step]
    );
    let error = report[step]["error"].as_str().unwrap_or_default();
    for needle in needles {
        assert!(
            error.contains(needle),
            "{step}: {error} (wanted {needle:?})"
        );
    }
}

/// A command step that ran and failed (its exit code is not 0).
fn failed(report: &Value, step: &str) -> String {
    let value = ok(report, step);
    assert!(
        value["exit_code"].as_i64().is_some_and(|c| c != 0),
        "{step} succeeded: {value}"
    );
    value.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_runs_root_in_a_gvisor_sandbox_and_its_user_cannot_become_root() {
    let engine = GvisorEngine::start_with(&[BASE_IMAGE, BUSYBOX_IMAGE]);
    let db = TestDb::create().await;
    let app = TestApp::spawn_with(engine.node(&db)).await;
    let r = scenario(&app, "gvisor").await;

    // Root, with the root set and no-new-privs; the sandbox user beside it has nothing.
    assert_eq!(ok(&r, "whoami_root"), "root");
    assert_eq!(ok(&r, "id_root"), "0");
    assert_eq!(ok(&r, "whoami_user"), "user");
    let caps = ok(&r, "caps_root").as_str().unwrap_or_default();
    assert!(caps.contains(&format!("CapEff:\t{ROOT_CAPS}")), "{caps}");
    let caps = ok(&r, "caps_user").as_str().unwrap_or_default();
    // (gVisor's status has no NoNewPrivs line; the set-uid attempt below shows it holds.)
    for line in ["CapEff:\t0000000000000000", "CapPrm:\t0000000000000000"] {
        assert!(caps.contains(line), "{line} in {caps}");
    }

    // Root's files: a root-only directory, a file written through the files API as root that
    // belongs to root, read and listed as root.
    assert_eq!(ok(&r, "vault"), "root:root 700");
    ok(&r, "write_root");
    assert_eq!(ok(&r, "owner"), "root:root 644");
    assert_eq!(ok(&r, "read_root"), "root's secret");
    assert_eq!(ok(&r, "list_root"), &json!(["secret"]));
    ok(&r, "mkdir_root");
    assert_eq!(ok(&r, "sub_owner"), "root:root 755");
    ok(&r, "remove_root");
    // ... closed to the sandbox user, by command and by the files API.
    assert!(failed(&r, "cat_user").contains("Permission denied"));
    refused(&r, "read_user", &["ermission"]);
    refused(&r, "list_user", &["ermission"]);
    // A root terminal.
    let pty = ok(&r, "pty_root");
    assert_eq!(pty["exit_code"], 3, "{pty}");
    assert!(
        pty["output"]
            .as_str()
            .unwrap_or_default()
            .split(['\r', '\n'])
            .any(|l| l == "0"),
        "{pty}"
    );

    // The sandbox user cannot become root: the set-uid root program root made runs as the
    // user (no-new-privs), `su` has no way up, root's directory stays root's.
    assert_eq!(ok(&r, "setuid_made"), "root:root 4755");
    // What they print (no uid 0); under this gVisor a program copied into the workspace dies of
    // SIGSEGV before `main`, set-uid or not (`plain_run`), so runc's in_container.rs shows the
    // set-uid copy running as the user.
    assert_eq!(ok(&r, "setuid_python"), "made\n");
    for step in ["setuid_run", "setuid_python_run", "plain_run"] {
        let out = ok(&r, step).as_str().unwrap_or_default();
        assert!(out.contains("rc="), "{step}: {out}");
        assert!(
            !out.lines().any(|l| l == "0" || l.ends_with(" 0")),
            "{step} became root: {out}"
        );
    }
    eprintln!(
        "set-uid id: {}; plain copy: {}; set-uid python: {}",
        r["setuid_run"], r["plain_run"], r["setuid_python_run"]
    );
    let su = ok(&r, "su");
    assert!(su.get("exit_code").is_some(), "su succeeded: {su}");
    assert_ne!(su["stdout"], "0\n", "{su}");
    failed(&r, "chmod_user");
    // No tracing of the executor (root, not dumpable): EPERM (1).
    assert_eq!(ok(&r, "ptrace_user"), "-1 1", "{}", r["ptrace_user"]);
    eprintln!(
        "the executor's environment read by the user: {}",
        r["environ_user"]
    );

    // Root is held: the files API's roots, the read-only image and executor, no mount.
    refused(&r, "write_etc_root", &["path_not_allowed"]);
    failed(&r, "image_root");
    failed(&r, "executor_root");
    failed(&r, "mount_root");
    assert_eq!(ok(&r, "alive"), "alive");

    // Our own doors keep their user rules in a gVisor sandbox: no manifest asks root.
    let sb = AgentSandbox::start_on(&app, agent("gvisor-root-agent", false), BUSYBOX_IMAGE).await;
    let out = root_refused(&sb).await;
    let message = out.to_string();
    for needed in ["root", "gVisor", "allow_root"] {
        assert!(message.contains(needed), "`{needed}` in {message}");
    }
    sb.tool_error(
        "fs.write",
        json!({"path": "/workspace/rooted", "content": "x", "user": "root"}),
        "permission_denied",
    )
    .await;
    let id = sb.ok("cmd.run", json!({"command": "id -u"})).await;
    assert_eq!(id["stdout"], "65534\n", "{id}");
    let (code, _) = engine.inside(&sb, &["ls", "/workspace/rooted"]);
    assert_ne!(code, 0, "the refused write left a file");

    // ... unless its manifest asks for root, in this gVisor sandbox.
    let asker = agent("gvisor-root-asker", true);
    assert!(asker.contains("allow_root: true"), "{asker}");
    let sb = AgentSandbox::start_on(&app, asker, BUSYBOX_IMAGE).await;
    let id = sb
        .ok("cmd.run", json!({"command": "id -u", "user": "root"}))
        .await;
    assert_eq!(id["stdout"], "0\n", "{id}");
    sb.ok(
        "fs.write",
        json!({"path": "/workspace/rooted", "content": "x", "user": "root"}),
    )
    .await;
    let owner = sb
        .ok(
            "cmd.run",
            json!({"command": "sh -c 'ls -ln /workspace/rooted'"}),
        )
        .await;
    let line = owner["stdout"].as_str().unwrap_or_default();
    assert_eq!(
        line.split_whitespace().nth(2),
        Some("0"),
        "root's file belongs to root: {owner}"
    );
    let id = sb.ok("cmd.run", json!({"command": "id -u"})).await;
    assert_eq!(id["stdout"], "65534\n", "{id}");
}

#[tokio::test]
async fn e2b_root_is_refused_in_a_container_sandbox_with_how_to_get_it() {
    let db = TestDb::create().await;
    let app =
        TestApp::spawn_with(common::gvisor::node_config(&db, None, Isolation::Container)).await;
    let r = scenario(&app, "container").await;
    let why = ["container isolation class", "gVisor", "no root"];
    refused(&r, "whoami_root", &why);
    refused(&r, "write_root", &why);
    refused(&r, "pty_root", &why);
    assert_eq!(ok(&r, "whoami_user"), "user");
    assert!(
        !ok(&r, "left")
            .as_str()
            .unwrap_or_default()
            .contains("rooted"),
        "{r}"
    );

    // An agent whose manifest asks for root gets none in a container-class sandbox.
    let sb = AgentSandbox::start_on(&app, agent("gvisor-root-asker", true), BUSYBOX_IMAGE).await;
    let out = root_refused(&sb).await;
    assert!(out.to_string().contains("gVisor"), "{out}");
    let caps = sb.inspect("{{.HostConfig.CapAdd}}");
    for cap in ["SETUID", "SETGID", "KILL", "CHOWN"] {
        assert!(caps.contains(cap), "{caps}");
    }
    assert!(
        !caps.contains("DAC_OVERRIDE"),
        "root's set in a container sandbox: {caps}"
    );
}
