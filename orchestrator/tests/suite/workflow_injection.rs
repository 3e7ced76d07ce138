//! Issue 20, items 2-4, as the attacks were made: through the HTTP API of a real service
//! (PostgreSQL, Docker sandboxes from the busybox runtime image), checked from what the command
//! printed and from the host.
//!
//! - A System `command` fills a run's input into one argument: shell syntax in the value is
//!   printed, never run (and `shell: true` gets the value as data too).
//! - A ContainerRun with `shell: true` gets the value as data the same way.
//! - A ContainerRun with `network_mode: bridge` is not on Docker's default bridge: a service of
//!   the Docker host (bound on every interface, so on the docker0 address as well) is never
//!   reached, directly or through the step's proxy; the proxy admits exactly the step's
//!   `network_allowlist` and audits each connection.

use crate::common;
use crate::common::workflow::workflow_manifest;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::docker_lines;
use common::harness::{Harness, WORKFLOWS};
use common::net::web_host;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

/// The value the attacker sends: a command separator, arithmetic expansion, a command
/// substitution in backquotes and one in `$(...)`, quotes, and a template (which must not be
/// rendered a second time).
const ATTACK: &str = "v1; echo INJ$((6*7)) `echo BT` $(echo SUB) 'sq' \"dq\" {{input.secret}}";

async fn harness(adjust: impl FnOnce(&mut orchestrator::config::NodeConfig)) -> Harness {
    Harness::builder(vec![])
        .workflows()
        .ends_within(Duration::from_secs(120))
        .start_tuned(adjust)
        .await
}

/// What a state printed, failing with the whole execution when it printed nothing.
fn stdout<'a>(e: &'a Value, state: &str) -> &'a str {
    e["blackboard"][state]["stdout"]
        .as_str()
        .unwrap_or_else(|| panic!("state {state} has no stdout: {e}"))
}

/// Deploys the workflow `name` (its `states`, the first `initial`), runs it with the attack as
/// `input.tag` (and a secret it must not reach as `input.secret`), which must complete; the
/// ended execution.
async fn attacked(h: &Harness, name: &str, initial: &str, states: &str) -> Value {
    let manifest = workflow_manifest(name, initial, states);
    let input = json!({"tag": ATTACK, "secret": "TOP-SECRET"});
    completed(h, name, &manifest, input).await
}

/// Deploys `manifest` (the workflow `name`) and runs it with `input`, which must complete; the
/// ended execution.
async fn completed(h: &Harness, name: &str, manifest: &str, input: Value) -> Value {
    h.deployed(WORKFLOWS, manifest).await;
    let e = h.workflow_to_end(name, input).await.1;
    assert_eq!(e["status"], "completed", "{e}");
    e
}

/// Starts the workflow `name` with `input`, which must be refused (422) before anything runs;
/// the answer.
async fn refused_at_run(h: &Harness, name: &str, input: Value) -> String {
    let r = h
        .app
        .post_json(
            &format!("/v1/workflows/{name}/run"),
            &json!({ "input": input }),
        )
        .await;
    let status = r.status().as_u16();
    let body = r.text().await.unwrap_or_default();
    assert_eq!(status, 422, "{name}: {body}");
    body
}

/// State `state` of `e` printed `expected` through a shell that ran nothing of the attack: no
/// arithmetic and no secret in what it printed.
fn assert_shell_printed(e: &Value, state: &str, expected: String) {
    let out = stdout(e, state);
    assert_eq!(out, expected, "{e}");
    assert!(
        !out.contains("INJ42") && !out.contains("TOP-SECRET"),
        "{out}"
    );
}

/// The injected value came out as text: all of it, and nothing it asked a shell to do.
fn assert_literal(out: &str, prefix: &str, e: &Value) {
    assert_eq!(out, format!("{prefix}{ATTACK}\n"), "{e}");
    for ran in ["INJ42", "\nBT", " BT ", "SUB\n", " SUB ", "TOP-SECRET"] {
        assert!(!out.contains(ran), "`{ran}` in {out:?}");
    }
}

#[tokio::test]
async fn a_system_command_passes_input_as_one_literal_argument() {
    let h = harness(|_| {}).await;
    let e = attacked(
        &h,
        "ship",
        "SHIP",
        r#"    SHIP:
      kind: System
      command: "echo shipping {{input.tag}}"
      transitions:
        - {condition: always, target: QUOTED}
    QUOTED:
      kind: System
      command: "echo \"tag: {{input.tag}}\""
      transitions: []
"#,
    )
    .await;
    assert_literal(stdout(&e, "SHIP"), "shipping ", &e);
    assert_literal(stdout(&e, "QUOTED"), "tag: ", &e);

    let e = attacked(
        &h,
        "ship-shell",
        "SHELL",
        r#"    SHELL:
      kind: System
      shell: true
      command: "echo shipping {{input.tag}} && echo \"tag: {{input.tag}}\" | tr a-z A-Z >/dev/null; echo 'sq: {{input.tag}}'"
      transitions: []
"#,
    )
    .await;
    // With a shell the template's own `&&`, pipe and redirection work; the value stays data
    // in plain text, inside double quotes and inside single quotes.
    assert_shell_printed(&e, "SHELL", format!("shipping {ATTACK}\nsq: {ATTACK}\n"));

    // A command that would let a value past the quoting, or that reads as shell syntax but
    // would run without a shell, is refused before anything is stored.
    for (name, command, expected) in [
        ("raw", "echo {{{input.tag}}}", "{{{...}}}"),
        (
            "ops",
            "echo {{input.tag}} && rm -rf /workspace",
            "shell: true",
        ),
    ] {
        h.deployed(
            WORKFLOWS,
            &format!(
                r#"apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: {name}
  version: "1.0.0"
spec:
  initial_state: RUN
  states:
    RUN: {{kind: System, command: "{command}", transitions: []}}
"#
            ),
        )
        .await;
        let body = refused_at_run(&h, name, json!({ "tag": ATTACK })).await;
        assert!(body.contains("spec.states.RUN.command"), "{body}");
        assert!(body.contains(expected), "{body}");
    }
    let stored = h
        .app
        .count("SELECT count(*) FROM workflow_executions")
        .await;
    assert_eq!(stored, 2, "only the two runs above were stored");
}

#[tokio::test]
async fn a_container_run_with_shell_passes_input_as_data() {
    let h = harness(|_| {}).await;
    let e = attacked(
        &h,
        "build",
        "BUILD",
        r#"    BUILD:
      kind: ContainerRun
      name: build
      image: aegis-runtime/busybox:1
      shell: true
      command: ["echo", "built", "{{input.tag}};", "echo", "\"tag: {{input.tag}}\""]
      transitions:
        - {condition: always, target: STEPS}
    STEPS:
      kind: ParallelContainerRun
      steps:
        - name: one
          image: aegis-runtime/busybox:1
          shell: true
          command: ["printf '%s\\n'", "'{{input.tag}}'"]
        - name: argv
          image: aegis-runtime/busybox:1
          command: ["echo", "{{input.tag}}"]
      transitions: []
"#,
    )
    .await;
    assert_shell_printed(&e, "BUILD", format!("built {ATTACK}\ntag: {ATTACK}\n"));
    let steps = &e["blackboard"]["STEPS"]["output"];
    assert_literal(steps["one"]["stdout"].as_str().unwrap_or_default(), "", &e);
    // Without a shell each element was always literal (that held before): it still is.
    assert_literal(steps["argv"]["stdout"].as_str().unwrap_or_default(), "", &e);
}

/// A service of the Docker host on every interface (so on the docker0 address too), counting
/// the connections it accepts and greeting each one.
async fn host_service() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("0.0.0.0:0")
        .await
        .expect("bind host service");
    let port = listener.local_addr().expect("addr").port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let _ = s.write_all(b"HOST-SERVICE-ANSWERED\n").await;
        }
    });
    (port, hits)
}

/// The Docker host's address on the default bridge (docker0).
fn docker0_address() -> String {
    let lines = docker_lines(&[
        "network",
        "inspect",
        "bridge",
        "--format",
        "{{range .IPAM.Config}}{{.Gateway}} {{end}}",
    ]);
    lines
        .iter()
        .flat_map(|l| l.split_whitespace())
        .find(|a| a.parse::<std::net::Ipv4Addr>().is_ok())
        .unwrap_or("172.17.0.1")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_networked_container_run_gets_an_egress_network_not_the_default_bridge() {
    let (host_port, host_hits) = host_service().await;
    let allowed = web_host("allowed host says hi").await;
    let denied = web_host("denied host").await;
    let h = harness(|config| {
        config.workflows.allow_network_modes = vec!["bridge".to_owned()];
        config.egress.allow_cidrs = vec!["127.0.0.2/32".to_owned()];
        let ip: IpAddr = "127.0.0.2".parse().expect("ip");
        config.egress.hosts = BTreeMap::from([
            ("allowed.test".to_owned(), vec![ip]),
            ("denied.test".to_owned(), vec![ip]),
        ]);
    })
    .await;
    let docker0 = docker0_address();

    // The attack: a step on `bridge` with no allowlist tries the host's service on the docker0
    // address and on its own gateway, directly and through its proxy.
    let reach = format!(
        r#"echo "proxy=$HTTP_PROXY"
echo "== docker0"; echo x | nc -w 3 {docker0} {host_port} 2>&1
gw=$(ip route 2>/dev/null | awk '/default/ {{print $3}}')
p=${{HTTP_PROXY#http://}}; ph=${{p%:*}}; pp=${{p##*:}}
[ -n "$gw" ] && {{ echo "== gateway"; echo x | nc -w 3 "$gw" {host_port} 2>&1; }}
[ -n "$ph" ] && {{ echo "== proxy host"; echo x | nc -w 3 "$ph" {host_port} 2>&1; }}
[ -n "$ph" ] && {{ echo "== via proxy"; (printf 'CONNECT {docker0}:{host_port} HTTP/1.1\r\n\r\n'; sleep 2) | nc -w 3 "$ph" "$pp" 2>&1; }}
[ -n "$ph" ] && {{ echo "== allowed without allowlist"; wget -q -O - http://allowed.test:{a}/ 2>&1; }}
echo "== end""#,
        a = allowed.port()
    );
    let e = completed(
        &h,
        "reach-host",
        &workflow_manifest(
            "reach-host",
            "REACH",
            &format!(
                r#"    REACH:
      kind: ContainerRun
      name: reach
      image: aegis-runtime/busybox:1
      network_mode: bridge
      command: ["sh", "-c", {script}]
      transitions: []
"#,
                script = serde_json::to_string(&reach).expect("script")
            ),
        ),
        json!({}),
    )
    .await;
    let out = stdout(&e, "REACH");
    // The host's service never saw a connection, on any address, by any path ...
    assert!(!out.contains("HOST-SERVICE-ANSWERED"), "{out}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(host_hits.load(Ordering::SeqCst), 0, "{out}");
    // ... because the step ran on a network of its own behind a proxy, not the default bridge,
    // and a step without an allowlist reaches no host at all.
    assert!(out.starts_with("proxy=http://"), "{out}");
    assert!(
        out.contains("== via proxy") && out.ends_with("== end\n"),
        "{out}"
    );
    assert!(!out.contains("allowed host says hi"), "{out}");
    assert!(
        out.contains("HTTP/1.1 403"),
        "the proxy refuses the docker0 address: {out}"
    );

    // The documented way out: the step's allowlist (within the workflow's), through its proxy.
    let fetch = format!(
        r#"echo "== allowed"; wget -q -O - http://allowed.test:{a}/ 2>&1; echo
echo "== denied"; wget -q -O - http://denied.test:{d}/ 2>&1; echo
echo "== end""#,
        a = allowed.port(),
        d = denied.port()
    );
    let e = completed(
        &h,
        "fetch",
        &format!(
            r#"apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: fetch
  version: "1.0.0"
spec:
  initial_state: FETCH
  network_allowlist: ["allowed.test:{a}", "denied.test:{d}"]
  states:
    FETCH:
      kind: ContainerRun
      name: fetch
      image: aegis-runtime/busybox:1
      network_mode: bridge
      network_allowlist: ["allowed.test:{a}", "other.test"]
      command: ["sh", "-c", {script}]
      transitions: []
"#,
            a = allowed.port(),
            d = denied.port(),
            script = serde_json::to_string(&fetch).expect("script")
        ),
        json!({}),
    )
    .await;
    let out = stdout(&e, "FETCH");
    let section = |name: &str| crate::common::section(out, name);
    assert!(section("allowed").contains("allowed host says hi"), "{out}");
    // The workflow admits denied.test, the step does not: rules intersect.
    assert!(!section("denied").contains("denied host"), "{out}");
    assert_eq!(host_hits.load(Ordering::SeqCst), 0);

    // Every connection that reached a step's proxy is audited with its decision.
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT decision, reason FROM audit_log WHERE action = 'egress.connect' ORDER BY seq",
    )
    .fetch_all(&h.app.state.pool)
    .await
    .expect("audit rows");
    assert!(
        rows.iter()
            .any(|(d, r)| d == "allowed" && r.contains(&format!("allowed.test:{}", allowed.port()))),
        "{rows:?}"
    );
    assert!(rows.iter().any(|(d, _)| d == "denied"), "{rows:?}");

    // An allowlist on a step without network, or an entry that is not a host, is refused at run.
    h.deployed(
        WORKFLOWS,
        &workflow_manifest(
            "misleading",
            "S",
            r#"    S:
      kind: ContainerRun
      name: s
      image: aegis-runtime/busybox:1
      network_allowlist: ["example.org"]
      command: ["true"]
      transitions: []
"#,
        ),
    )
    .await;
    let body = refused_at_run(&h, "misleading", json!({})).await;
    assert!(body.contains("network_allowlist"), "{body}");
}
