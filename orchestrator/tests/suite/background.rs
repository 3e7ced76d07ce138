//! Background processes through the router: `cmd.run` with `background: true`, then
//! `proc.output`, `proc.input` and `proc.signal` on the caller's own sandbox, under the same
//! manifest allowlists as `cmd.run`; each process leaves a start and an end row in the audit
//! chain. Checked from inside the sandbox (`docker exec`) where a process must or must not run.

use crate::common;
use crate::common::agent::AgentManifest;

use std::time::Duration;

use common::sandbox::AgentSandbox;
use common::TestApp;
use reqwest::Method;
use serde_json::json;

/// A busybox agent that may run `cat`, `sleep`, `sh` and `stty` in the background.
fn agent(name: &str, tools: &str) -> String {
    AgentManifest::new(name)
        .instruction("Run things in the background.")
        .tools_listed(tools)
        .cmd(&["cat", "sleep", "sh", "stty"], 60, "")
        .yaml()
}

const ALL: &str = "cmd.run, proc.output, proc.input, proc.signal";

fn running_in(container: &str, pattern: &str) -> bool {
    common::docker_lines(&["exec", container, "ps", "-o", "args"])
        .iter()
        .any(|l| l.contains(pattern))
}

#[tokio::test]
async fn a_background_process_takes_input_streams_output_and_is_audited_from_start_to_end() {
    let app = TestApp::spawn().await;
    let sb = AgentSandbox::start(&app, agent("bg-cat", ALL)).await;

    // `cat` with a stdin pipe, found by its tag.
    let started = sb.start_echoer().await;
    assert_eq!(started["background"], true, "{started}");
    let pid = started["pid"].as_u64().expect("a pid");
    assert_eq!(started["tag"], "echoer");
    assert!(
        running_in(&sb.container(), "cat"),
        "cat runs in the sandbox after its call returned"
    );

    let wrote = sb
        .ok("proc.input", json!({"tag": "echoer", "data": "hello\n"}))
        .await;
    assert_eq!(wrote["written"], 6, "{wrote}");
    assert_eq!(wrote["pid"], pid);
    let first = sb
        .ok("proc.output", json!({"pid": pid, "wait_ms": 5000}))
        .await;
    assert_eq!(first["stdout"], "hello\n", "{first}");
    assert!(first["ended"].is_null(), "still running: {first}");
    // Output is returned once.
    let again = sb.ok("proc.output", json!({"pid": pid})).await;
    assert_eq!(again["stdout"], "", "{again}");

    let ended = sb.end_echoer(pid).await;
    assert_eq!(ended["stdout_bytes"], 10, "{ended}");

    // One row for the start (the cmd.run call) and one for the end.
    let body = app
        .until(
            "/v1/audit?limit=500",
            "audited the end",
            Duration::from_secs(20),
            |b| {
                b["rows"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|row| row["reason_code"] == "process_ended"))
            },
        )
        .await;
    let rows = body["rows"].as_array().unwrap();
    let end = rows
        .iter()
        .find(|r| r["reason_code"] == "process_ended")
        .unwrap();
    assert_eq!(end["action"], "cmd.run");
    assert_eq!(end["outcome"], "ok", "{end}");
    assert!(
        common::json::text(&end["reason"]).contains(&format!("background process {pid}")),
        "{end}"
    );
    let starts = rows
        .iter()
        .filter(|r| r["action"] == "cmd.run" && r["outcome"] == "ok" && r["reason_code"].is_null())
        .count();
    assert!(
        starts >= 1,
        "the start is the cmd.run call's own row: {rows:?}"
    );
}

#[tokio::test]
async fn signals_stop_a_process_and_a_terminal_has_the_size_asked_for() {
    let app = TestApp::spawn().await;
    let sb = AgentSandbox::start(&app, agent("bg-sig", ALL)).await;

    let sleeper = sb
        .ok(
            "cmd.run",
            json!({"command": "sleep 300", "background": true}),
        )
        .await;
    let pid = sleeper["pid"].as_u64().unwrap();
    assert!(running_in(&sb.container(), "sleep 300"));
    sb.ok("proc.signal", json!({"pid": pid, "signal": "kill"}))
        .await;
    let (_, ended) = sb
        .read_to_end(json!({"pid": pid}), Duration::from_secs(20))
        .await;
    assert_eq!(ended["signal"], 9, "{ended}");
    assert!(
        !running_in(&sb.container(), "sleep 300"),
        "the killed process is gone from the sandbox"
    );

    let tty = sb
        .ok(
            "cmd.run",
            json!({"command": "stty size", "background": true, "pty": {"cols": 91, "rows": 27}}),
        )
        .await;
    let (text, ended) = sb
        .read_to_end(json!({"pid": tty["pid"]}), Duration::from_secs(20))
        .await;
    assert_eq!(text.trim(), "27 91", "{ended}");
}

#[tokio::test]
async fn background_commands_keep_every_rule_of_cmd_run() {
    let app = TestApp::spawn().await;
    let sb = AgentSandbox::start(&app, agent("bg-rules", ALL)).await;

    // A program outside the allowlist is refused by the router, as for cmd.run.
    sb.refused(
        "cmd.run",
        json!({"command": "rm -rf /workspace", "background": true}),
        403,
        "command_not_allowed",
    )
    .await;
    assert!(!running_in(&sb.container(), "rm -rf"));
    // A working directory outside the path allowlist is refused, as for cmd.run.
    sb.refused(
        "cmd.run",
        json!({"command": "sleep 1", "cwd": "/etc", "background": true}),
        403,
        "path_not_allowed",
    )
    .await;

    // Background-only fields on a plain call are a clear error.
    let out = sb
        .tool_error(
            "cmd.run",
            json!({"command": "cat", "stdin": true}),
            "invalid_arguments",
        )
        .await;
    assert!(out.to_string().contains("background"), "{out}");

    // A pid the sandbox does not have (the executor's own, 1) is not found.
    sb.tool_error(
        "proc.signal",
        json!({"pid": 1, "signal": "kill"}),
        "not_found",
    )
    .await;
    sb.tool_error("proc.output", json!({"tag": "nobody"}), "not_found")
        .await;
    assert_eq!(
        common::docker_lines(&["inspect", "-f", "{{.State.Running}}", &sb.container()]),
        vec!["true".to_owned()],
        "the sandbox still runs"
    );
}

#[tokio::test]
async fn one_sandbox_cannot_touch_the_processes_of_another_and_unlisted_tools_are_refused() {
    let app = TestApp::spawn().await;
    let a = AgentSandbox::start(&app, agent("bg-owner", ALL)).await;
    let b = AgentSandbox::start(&app, agent("bg-other", ALL)).await;
    let mine = a
        .ok(
            "cmd.run",
            json!({"command": "sleep 300", "background": true, "tag": "mine", "stdin": true}),
        )
        .await;
    let pid = mine["pid"].as_u64().unwrap();
    // From the other sandbox, neither its pid nor its tag reaches it.
    b.tool_error(
        "proc.signal",
        json!({"pid": pid, "signal": "kill"}),
        "not_found",
    )
    .await;
    b.tool_error(
        "proc.input",
        json!({"tag": "mine", "data": "x"}),
        "not_found",
    )
    .await;
    assert!(
        running_in(&a.container(), "sleep 300"),
        "still running in its own sandbox"
    );

    // An agent whose manifest lists cmd.run but not the process tools cannot use them.
    let c = AgentSandbox::start(&app, agent("bg-plain", "cmd.run")).await;
    let started = c
        .ok(
            "cmd.run",
            json!({"command": "sleep 300", "background": true}),
        )
        .await;
    c.refused(
        "proc.signal",
        json!({"pid": started["pid"], "signal": "kill"}),
        403,
        "tool_not_in_manifest",
    )
    .await;

    // Killing the sandbox ends its processes: nothing survives on the host.
    let r = app
        .response(Method::DELETE, &format!("/v1/sandboxes/{}", a.id), None)
        .await;
    assert!(r.status().is_success(), "{}", r.status());
    let left = common::docker_lines(&["ps", "-q", "--filter", &format!("name={}", a.container())]);
    assert!(left.is_empty(), "the sandbox is gone: {left:?}");
}

#[tokio::test]
async fn ended_processes_nobody_reads_are_kept_within_a_bound() {
    let app = TestApp::spawn().await;
    let sb = AgentSandbox::start(&app, agent("bg-bound", ALL)).await;
    let mut pids = Vec::new();
    for _ in 0..40 {
        let out = sb
            .ok("cmd.run", json!({"command": "sleep 0", "background": true}))
            .await;
        pids.push(out["pid"].clone());
    }
    // Every one ended (their end rows are written by the node once it sees each end).
    app.until(
        "/v1/audit?limit=500",
        "audited 40 ends",
        Duration::from_secs(30),
        |b| {
            b["rows"].as_array().is_some_and(|r| {
                r.iter()
                    .filter(|row| row["reason_code"] == "process_ended")
                    .count()
                    >= 40
            })
        },
    )
    .await;
    // The newest are still readable to their end; the oldest were let go, and say so.
    let last = sb.ok("proc.output", json!({"pid": pids[39]})).await;
    assert_eq!(last["ended"]["exit_code"], 0, "{last}");
    sb.tool_error("proc.output", json!({"pid": pids[0]}), "not_found")
        .await;
}
