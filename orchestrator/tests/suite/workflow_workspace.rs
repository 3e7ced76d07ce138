//! Volumes shared by the states of one workflow run (`spec.storage`, issue 25 item 1), through
//! the running service with real PostgreSQL and Docker and the scripted model
//! (tests/suite/common/fake_llm.rs): an Agent state writes a program into the run's workspace and
//! a ContainerRun state runs its tests there, in the shapes AEGIS examples write; every run has
//! its own workspace, gone when the run ends (or kept for its TTL); the size limit; parallel
//! writers refused; and attacks: mounts outside what the manifest declares, links planted by one
//! state for the next, setuid bits, FIFOs, a volume replaced by a link. The crash test (a replica
//! killed mid-state) is at the end.

use crate::common;
use crate::common::workflow::workflow_manifest;

use std::time::{Duration, Instant};

use common::fake_llm::{answer, tool_calls, Step};
use common::harness::{of_type, Harness, HarnessBuilder};
use common::TestDb;
use reqwest::Method;
use serde_json::{json, Value};
use uuid::Uuid;

const BUSYBOX: &str = "aegis-runtime/busybox:1";

/// The node every test here starts from: workflow states run on busybox, and a run may take
/// 120 s (volumes are made and removed on the way).
fn node(script: Vec<Step>) -> HarnessBuilder {
    Harness::builder(script)
        .workflows()
        .ends_within(Duration::from_secs(120))
}

async fn harness(script: Vec<Step>) -> Harness {
    node(script).start().await
}

impl Harness {
    /// Posts a manifest as YAML; (status, body).
    async fn post(&self, path: &str, manifest: &str) -> (u16, Value) {
        let r = self
            .app
            .admin(Method::POST, path)
            .header("content-type", "application/yaml")
            .body(manifest.to_owned())
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    /// Deploys a manifest as YAML, which must be accepted (201); the answer.
    async fn deployed_yaml(&self, path: &str, manifest: &str) -> Value {
        let (status, body) = self.post(path, manifest).await;
        assert_eq!(status, 201, "{body}");
        body
    }

    /// Starts a run and waits (120 s) for its end; (id, execution).
    async fn run_to_end(&self, name: &str, input: Value) -> (Uuid, Value) {
        let (id, e) = self.workflow_to_end(name, input).await;
        (id.parse().unwrap(), e)
    }

    /// Rows of the run's volumes and drafts still in PostgreSQL.
    async fn stored(&self, id: Uuid) -> (i64, i64) {
        let pool = &self.app.state.pool;
        let volumes: i64 = common::one(
            pool,
            "SELECT count(*) FROM workflow_volumes WHERE execution_id = $1",
            id,
        )
        .await;
        let drafts: i64 = common::one(
            pool,
            "SELECT count(*) FROM workflow_volume_drafts WHERE execution_id = $1",
            id,
        )
        .await;
        (volumes, drafts)
    }
}

const CODER: &str = "apiVersion: 100monkeys.ai/v1
kind: Agent
metadata:
  name: coder
  version: \"1.0.0\"
spec:
  runtime: {language: python, version: \"3.11\"}
  task:
    instruction: Write the program and its tests into /workspace.
  tools: [fs.write, fs.read]
  security:
    filesystem: {read: [/workspace], write: [/workspace]}
";

/// The pipeline of AEGIS's examples, in their own spellings: `spec.storage.workspace` with
/// `size_limit`, an Agent state mounting `{{workflow.storage.workspace}}` with `mount_point` and
/// `access_mode`, a ContainerRun state mounting `workspace` read-only to run the tests.
const WRITE_AND_TEST: &str = "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: write-and-test
  version: \"1.0.0\"
spec:
  initial_state: WRITE_CODE
  storage:
    workspace:
      storage_class: ephemeral
      ttl_hours: 1
      size_limit: 16Mi
  states:
    WRITE_CODE:
      kind: Agent
      agent: coder
      input: \"Write calc.py with add(a, b) and its unittest test_calc.py.\"
      volumes:
        - volume: \"{{workflow.storage.workspace}}\"
          mount_point: /workspace
          access_mode: read-write
      transitions:
        - {condition: on_success, target: TEST}
        - {condition: on_failure, target: FAILED}
    TEST:
      kind: ContainerRun
      name: unit-tests
      image: aegis-runtime/python:3.11
      command: [python3, -m, unittest, -v, test_calc]
      workdir: /workspace
      volumes:
        - {name: workspace, mount_path: /workspace, read_only: true}
      transitions:
        - {condition: exit_code_zero, target: PASSED}
        - {condition: exit_code_non_zero, target: FAILED}
    PASSED: {kind: System, command: \"echo passed\", transitions: []}
    FAILED: {kind: System, command: \"echo failed\", transitions: []}
";

const TEST_CALC: &str = "import unittest\n\nfrom calc import add\n\n\nclass CalcTest(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n\nif __name__ == \"__main__\":\n    unittest.main()\n";

fn writes(calc: &str) -> Step {
    tool_calls(&[
        (
            "fs__write",
            json!({"path": "/workspace/calc.py", "content": calc}),
        ),
        (
            "fs__write",
            json!({"path": "/workspace/test_calc.py", "content": TEST_CALC}),
        ),
    ])
}

#[tokio::test]
async fn an_agent_writes_a_program_and_a_container_run_tests_it_in_the_same_workspace() {
    let h = harness(vec![
        writes("def add(a, b):\n    return a + b\n"),
        answer("calc.py and test_calc.py written"),
        // The second run's agent writes a wrong program: its tests must fail there.
        writes("def add(a, b):\n    return a - b\n"),
        answer("written again"),
    ])
    .await;
    h.deployed_yaml("/v1/agents", CODER).await;
    let deployed = h.deployed_yaml("/v1/workflows", WRITE_AND_TEST).await;
    // The older spellings were rewritten, each with a `normalised:` note at its place.
    let notes: Vec<(&str, &str)> = common::json::items(&deployed["warnings"])
        .iter()
        .map(|w| {
            (
                w["pointer"].as_str().unwrap_or_default(),
                w["message"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        notes.contains(&(
            "/spec/storage/workspace/size_limit",
            "normalised: `size_limit: 16Mi` (older AEGIS spelling) is `size_limit_mb: 16`"
        )),
        "{deployed}"
    );
    assert!(
        notes
            .iter()
            .any(|(at, m)| *at == "/spec/states/WRITE_CODE/volumes/0"
                && m.starts_with("normalised: ")
                && m.contains("is `name: workspace`")),
        "{deployed}"
    );
    let export = h.app.get_value("/v1/workflows/write-and-test").await;
    let manifest = export.to_string();
    assert!(
        manifest.contains("size_limit_mb") && !manifest.contains("mount_point"),
        "{export}"
    );

    let (id, e) = h.run_to_end("write-and-test", json!({})).await;
    assert_eq!(e["status"], "completed", "{e}");
    assert_eq!(e["current_state"], "PASSED", "{e}");
    let test = &e["blackboard"]["TEST"];
    assert_eq!(test["exit_code"], 0, "{test}");
    let report = test["stderr"].as_str().unwrap();
    assert!(
        report.contains("test_add") && report.contains("Ran 1 test") && report.ends_with("OK\n"),
        "{report}"
    );
    // The agent's execution saved the workspace as its state's draft; the commit made it the
    // volume; the end of the run removed it (ephemeral).
    let agent_run = e["blackboard"]["WRITE_CODE"]["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let agent_events: Value = h
        .app
        .response(
            Method::GET,
            &format!("/v1/executions/{agent_run}/events?limit=1000"),
            None,
        )
        .await
        .json()
        .await
        .unwrap();
    let kinds: Vec<&str> = common::json::items(&agent_events["events"])
        .iter()
        .map(|e| e["event_type"].as_str().unwrap_or_default())
        .collect();
    assert!(
        kinds.contains(&"workflow_volumes_mounted") && kinds.contains(&"workflow_volumes_saved"),
        "{kinds:?}"
    );
    let events = h.workflow_events(id).await;
    let mounted = of_type(&events, "volumes_mounted");
    assert_eq!(mounted.len(), 1, "{events:#?}");
    assert_eq!(mounted[0]["payload"]["restored"], json!(["workspace"]));
    // Read-only: the test step saved nothing.
    assert!(of_type(&events, "volumes_saved").is_empty(), "{events:#?}");
    assert_eq!(h.stored(id).await, (0, 0));

    // The tests really ran on what the agent wrote: a wrong program fails them.
    let (_, e) = h.run_to_end("write-and-test", json!({})).await;
    assert_eq!(e["current_state"], "FAILED", "{e}");
    let test = &e["blackboard"]["TEST"];
    assert_eq!(test["exit_code"], 1, "{test}");
    assert!(
        common::json::text(&test["stderr"]).contains("AssertionError: -1 != 5"),
        "{test}"
    );
}

const MARKS: &str = "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: marks
  version: \"1.0.0\"
spec:
  initial_state: WRITE
  storage:
    shared_volumes:
      - {name: keep, storage_class: persistent, ttl_hours: 2}
  states:
    WRITE:
      kind: ContainerRun
      name: write
      image: aegis-runtime/busybox:1
      command: [touch, \"/workspace/run/mark-{{input.n}}\", \"/workspace/keep/kept-{{input.n}}\"]
      volumes:
        - {name: workspace, mount_path: /workspace/run}
        - {name: keep, mount_path: /workspace/keep}
      transitions: [{condition: on_success, target: LIST}]
    LIST:
      kind: System
      command: \"ls -A /workspace/keep /workspace/run\"
      volumes:
        - {name: workspace, mount_path: /workspace/run, read_only: true}
        - {name: keep, mount_path: /workspace/keep, read_only: true}
      transitions: []
";

#[tokio::test]
async fn every_run_has_its_own_volumes_removed_at_its_end_or_kept_for_their_ttl() {
    let h = node(Vec::new())
        .start_tuned(|c| c.volumes.sweep_interval_secs = 1)
        .await;
    h.deployed_yaml("/v1/workflows", MARKS).await;

    let (first, e) = h.run_to_end("marks", json!({"n": 1})).await;
    assert_eq!(e["status"], "completed", "{e}");
    assert_eq!(
        e["blackboard"]["LIST"]["stdout"],
        "/workspace/keep:\nkept-1\n\n/workspace/run:\nmark-1\n"
    );
    let (second, e) = h.run_to_end("marks", json!({"n": 2})).await;
    assert_eq!(e["status"], "completed", "{e}");
    // Neither the ephemeral workspace nor the persistent volume of the first run is seen.
    assert_eq!(
        e["blackboard"]["LIST"]["stdout"],
        "/workspace/keep:\nkept-2\n\n/workspace/run:\nmark-2\n"
    );
    // The blackboard publishes no workspace id: the manifest declares no spec.storage.workspace.
    assert!(e["blackboard"].get("workspace_volume_id").is_none());

    // The ephemeral workspace went with the end of each run; the persistent volume stays, with
    // its expiry two hours after the end.
    let pool = &h.app.state.pool;
    for id in [first, second] {
        let rows: Vec<(String, f64)> = sqlx::query_as(
            "SELECT name, EXTRACT(EPOCH FROM expires_at - now())::float8 / 3600 \
             FROM workflow_volumes WHERE execution_id = $1",
        )
        .bind(id)
        .fetch_all(pool)
        .await
        .unwrap();
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].0, "keep");
        assert!((1.9..=2.0).contains(&rows[0].1), "{rows:?}");
        assert_eq!(h.stored(id).await, (1, 0));
    }
    // Past its expiry the sweep removes it.
    sqlx::query("UPDATE workflow_volumes SET expires_at = now() - interval '1 second' WHERE execution_id = $1")
        .bind(first)
        .execute(pool)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while h.stored(first).await != (0, 0) {
        assert!(
            Instant::now() < deadline,
            "the expired volume was never swept"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(h.stored(second).await, (1, 0));
    // Removing a run removes its volumes.
    let (status, out) = h
        .app
        .call_tool(
            "aegis.workflow.remove",
            json!({"execution_id": second.to_string()}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(h.stored(second).await, (0, 0));
}

#[tokio::test]
async fn a_state_that_leaves_more_than_the_size_limit_fails_and_its_changes_are_not_kept() {
    let h = harness(Vec::new()).await;
    let manifest = "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: filler
  version: \"1.0.0\"
spec:
  initial_state: SEED
  storage:
    workspace: {size_limit: 1Mi}
  states:
    SEED:
      kind: ContainerRun
      name: seed
      image: aegis-runtime/busybox:1
      command: [sh, -c, \"echo small > /workspace/seed\"]
      volumes: [{name: workspace, mount_path: /workspace}]
      transitions: [{condition: on_success, target: FILL}]
    FILL:
      kind: ContainerRun
      name: fill
      image: aegis-runtime/busybox:1
      command: [dd, if=/dev/zero, of=/workspace/big, bs=1024, count=2048]
      volumes: [{name: workspace, mount_path: /workspace}]
      transitions:
        - {condition: exit_code_zero, target: WRONG}
        - {condition: on_failure, target: CHECK}
    CHECK:
      kind: ContainerRun
      name: check
      image: aegis-runtime/busybox:1
      command: [ls, -A, /workspace]
      volumes: [{name: workspace, mount_path: /workspace, read_only: true}]
      transitions: []
    WRONG: {kind: System, command: \"echo kept\", transitions: []}
";
    h.deployed_yaml("/v1/workflows", manifest).await;
    let (id, e) = h.run_to_end("filler", json!({})).await;
    assert_eq!(e["current_state"], "CHECK", "{e}");
    let fill = &e["blackboard"]["FILL"];
    // The write itself succeeded; what it left could not be kept, and the state says why.
    assert_eq!(fill["status"], "failed", "{fill}");
    assert_eq!(fill["command_exit_code"], 0, "{fill}");
    assert!(fill["exit_code"].is_null(), "{fill}");
    assert_eq!(
        fill["error"],
        "workflow volume `workspace` holds more than its size_limit of 1048576 bytes; this \
         state's changes to it were not kept"
    );
    assert_eq!(e["blackboard"]["CHECK"]["stdout"], "seed\n");
    let failed = of_type(&h.workflow_events(id).await, "volumes_failed")
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["payload"]["step"], "fill");
}

#[tokio::test]
async fn parallel_steps_share_a_volume_with_one_writer_and_two_writers_are_refused() {
    let h = harness(Vec::new()).await;
    let manifest = |lint_read_only: bool| {
        workflow_manifest(
            "checks",
            "SEED",
            &format!(
                "    SEED:
      kind: ContainerRun
      name: seed
      image: aegis-runtime/busybox:1
      command: [touch, /workspace/seed]
      volumes: [{{name: workspace, mount_path: /workspace}}]
      transitions: [{{condition: on_success, target: CHECK}}]
    CHECK:
      kind: ParallelContainerRun
      steps:
        - name: test
          image: aegis-runtime/busybox:1
          command: [touch, /workspace/from-test]
          volumes: [{{name: workspace, mount_path: /workspace}}]
        - name: lint
          image: aegis-runtime/busybox:1
          command: [sh, -c, \"ls -A /workspace; touch /workspace/from-lint 2>/dev/null && echo wrote || echo refused\"]
          volumes: [{{name: workspace, mount_path: /workspace, read_only: {lint_read_only}}}]
      transitions: [{{condition: on_success, target: LIST}}]
    LIST:
      kind: ContainerRun
      name: list
      image: aegis-runtime/busybox:1
      command: [ls, -A, /workspace]
      volumes: [{{name: workspace, mount_path: /workspace, read_only: true}}]
      transitions: []
"
            ),
        )
    };
    // Two steps writing one volume at the same time: refused at deploy, naming both and it.
    let (status, body) = h.post("/v1/workflows", &manifest(false)).await;
    assert_eq!(status, 422, "{body}");
    let text = body.to_string();
    assert!(
        text.contains("/spec/states/CHECK/steps/1/volumes/0")
            && text.contains("volume `workspace` is mounted read-write by steps `test` and `lint` of ParallelContainerRun state `CHECK`"),
        "{body}"
    );

    // One writer and one reader: both see the content before the state; only the writer's
    // changes are kept, and the reader cannot even write (the workspace is its read-only mount).
    h.deployed_yaml("/v1/workflows", &manifest(true)).await;
    let (_, e) = h.run_to_end("checks", json!({})).await;
    assert_eq!(e["status"], "completed", "{e}");
    assert_eq!(
        e["blackboard"]["CHECK"]["output"]["lint"]["stdout"],
        "seed\nrefused\n"
    );
    assert_eq!(e["blackboard"]["LIST"]["stdout"], "from-test\nseed\n");
}

#[tokio::test]
async fn mounts_outside_what_the_manifest_declares_are_refused() {
    let h = node(Vec::new())
        .start_tuned(|c| c.volumes.max_size_mb = 64)
        .await;
    let workflow = |storage: &str, volumes: &str| {
        format!(
            "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: reach
  version: \"1.0.0\"
spec:
  initial_state: RUN
{storage}  states:
    RUN:
      kind: ContainerRun
      name: run
      image: aegis-runtime/busybox:1
      command: [ls, /workspace]
      volumes: {volumes}
      transitions: []
"
        )
    };
    for (volumes, pointer, says) in [
        (
            "[{name: workspace, mount_path: /etc}]",
            "/spec/states/RUN/volumes/0/mount_path",
            "",
        ),
        (
            "[{name: workspace, mount_path: /workspace/../etc}]",
            "/spec/states/RUN/volumes/0/mount_path",
            "",
        ),
        (
            "[{name: secrets, mount_path: /workspace/secrets}]",
            "/spec/states/RUN/volumes/0/name",
            "volume `secrets` is not declared",
        ),
        (
            "[{volume: \"{{input.volume}}\", mount_path: /workspace}]",
            "/spec/states/RUN/volumes/0/volume",
            "chosen at run time is not supported",
        ),
        (
            "[{name: workspace, mount_path: /workspace}, {name: workspace, mount_path: /workspace/again}]",
            "/spec/states/RUN/volumes/1/name",
            "mounted twice",
        ),
        (
            "[{name: workspace, mount_path: /workspace, host_path: /}]",
            "/spec/states/RUN/volumes/0/host_path",
            "",
        ),
    ] {
        let (status, body) = h.post("/v1/workflows", &workflow("", volumes)).await;
        assert_eq!(status, 422, "{volumes}: {body}");
        let text = body.to_string();
        assert!(text.contains(pointer) && text.contains(says), "{volumes}: {body}");
    }
    // What the node cannot give is refused when a run starts, by name, and nothing is stored.
    for (name, storage, says) in [
        (
            "too-big",
            "  storage:\n    workspace: {size_limit_mb: 128}\n",
            "over this node's ceiling of 64 MiB (volumes.max_size_mb)",
        ),
        (
            "attached",
            "  storage:\n    workspace: {volume_id: 7d3c1f}\n",
            "attaching an existing volume is not supported",
        ),
    ] {
        let manifest = workflow(storage, "[{name: workspace, mount_path: /workspace}]")
            .replace("name: reach", &format!("name: {name}"));
        h.deployed_yaml("/v1/workflows", &manifest).await;
        let (status, body) = h.run_workflow(name, json!({"input": {}})).await;
        assert!((400..500).contains(&status), "{body}");
        assert!(body.to_string().contains(says), "{body}");
    }
    let runs = h
        .app
        .count("SELECT count(*) FROM workflow_executions")
        .await;
    assert_eq!(runs, 0);
}

#[tokio::test]
async fn what_one_state_plants_in_a_volume_reaches_the_next_as_plain_data_only() {
    let h = harness(Vec::new()).await;
    let manifest = workflow_manifest(
        "planted",
        "SEED",
        "    SEED:
      kind: ContainerRun
      name: seed
      image: aegis-runtime/busybox:1
      command: [sh, -c, \"echo seed > /workspace/data/seed.txt\"]
      volumes: [{name: workspace, mount_path: /workspace/data}]
      transitions: [{condition: on_success, target: PLANT}]
    PLANT:
      kind: ContainerRun
      name: plant
      image: aegis-runtime/busybox:1
      command:
        - sh
        - -c
        - >-
          cd /workspace/data &&
          ln -s /etc etc && ln -s ../../../bin up && ln -s seed.txt alias &&
          mkfifo pipe && touch suid && chmod 6755 suid && mkdir sticky && chmod 1777 sticky &&
          ls etc/passwd up/busybox
      volumes: [{name: workspace, mount_path: /workspace/data}]
      transitions: [{condition: on_success, target: CHECK}]
    CHECK:
      kind: ContainerRun
      name: check
      image: aegis-runtime/busybox:1
      command:
        - sh
        - -c
        - \"cd /workspace/data && cat alias && ls -A && stat -c '%n %a %u:%g %F' *\"
      volumes: [{name: workspace, mount_path: /workspace/data, read_only: true}]
      transitions: [{condition: on_success, target: REPLACE}]
    REPLACE:
      kind: ContainerRun
      name: replace
      image: aegis-runtime/busybox:1
      command: [sh, -c, \"rm -r /workspace/data && ln -s /bin /workspace/data && ls /workspace/data/busybox\"]
      volumes: [{name: workspace, mount_path: /workspace/data}]
      transitions: [{condition: always, target: AFTER}]
    AFTER:
      kind: ContainerRun
      name: after
      image: aegis-runtime/busybox:1
      command: [sh, -c, \"ls -A /workspace/data; test -d /workspace/data && test ! -L /workspace/data\"]
      volumes: [{name: workspace, mount_path: /workspace/data, read_only: true}]
      transitions: []
",
    );
    h.deployed_yaml("/v1/workflows", &manifest).await;
    let (_, e) = h.run_to_end("planted", json!({})).await;
    assert_eq!(e["status"], "completed", "{e}");
    let bb = &e["blackboard"];
    // The attack ran as written: the links resolved in the planting sandbox.
    assert_eq!(bb["PLANT"]["exit_code"], 0, "{}", bb["PLANT"]);
    assert_eq!(bb["PLANT"]["stdout"], "etc/passwd\nup/busybox\n");
    // The next state got data only: the link inside the volume, no link out of it (absolute
    // or climbing), no FIFO, no setuid/setgid/sticky bit, everything the sandbox user's.
    assert_eq!(bb["CHECK"]["exit_code"], 0, "{}", bb["CHECK"]);
    assert_eq!(
        bb["CHECK"]["stdout"],
        "seed\nalias\nseed.txt\nsticky\nsuid\n\
         alias 777 65534:65534 symbolic link\n\
         seed.txt 644 65534:65534 regular file\n\
         sticky 777 65534:65534 directory\n\
         suid 755 65534:65534 regular empty file\n"
    );
    // A volume replaced by a link into the image is not saved: the state fails saying so and
    // the next state finds the volume as it was, a directory, none of the image's files.
    let replace = &bb["REPLACE"];
    assert_eq!(replace["status"], "failed", "{replace}");
    assert_eq!(replace["command_exit_code"], 0, "{replace}");
    let error = replace["error"].as_str().unwrap();
    assert!(
        error.contains("workflow volume `workspace`")
            && error.contains("/workspace/data is a symbolic link, not a directory"),
        "{error}"
    );
    assert_eq!(bb["AFTER"]["exit_code"], 0, "{}", bb["AFTER"]);
    assert_eq!(bb["AFTER"]["stdout"], "alias\nseed.txt\nsticky\nsuid\n");
}

/// The SQL of the exactly-once rule on the real database: the commit of a state promotes the
/// drafts of its attempt only; the end removes what is ephemeral and starts the TTL of the rest.
#[tokio::test]
async fn only_the_committed_attempts_draft_becomes_the_volume() {
    // The node's own sweep stays out of the way: this test calls it.
    let h = node(Vec::new())
        .start_tuned(|c| c.volumes.sweep_interval_secs = 3600)
        .await;
    let pool = &h.app.state.pool;
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO workflow_executions (id, workflow_id, workflow_version_id, workflow_name, \
         workflow_version, current_state, caller_kind, caller_id, deadline) \
         VALUES ($1, $2, $2, 'w', '1.0.0', 'S', 'test', 'test', now() + interval '1 hour')",
    )
    .bind(id)
    .bind(Uuid::new_v4())
    .execute(pool)
    .await
    .unwrap();
    let draft = |name: &'static str, state: &'static str, attempt: i32, content: &'static str| {
        let keep = if name == "keep" { 3 } else { 0 };
        sqlx::query(
            "INSERT INTO workflow_volume_drafts (execution_id, name, state, visit, attempt, \
             tenant_id, size_limit_bytes, keep_hours, content, content_bytes) \
             VALUES ($1, $2, $3, 1, $4, 'default', 1024, $5, $6, 1)",
        )
        .bind(id)
        .bind(name)
        .bind(state)
        .bind(attempt)
        .bind(keep)
        .bind(content.as_bytes())
        .execute(pool)
    };
    // An interrupted attempt's draft, the retry's, and a stale one of another state.
    draft("workspace", "S", 1, "interrupted").await.unwrap();
    draft("workspace", "S", 2, "retried").await.unwrap();
    draft("keep", "S", 2, "kept").await.unwrap();
    draft("workspace", "T", 1, "other state").await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    orchestrator::workspaces::promote(&mut tx, id, "S", 1, 2)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let rows: Vec<(String, Vec<u8>, String)> = sqlx::query_as(
        "SELECT name, content, written_by_state FROM workflow_volumes WHERE execution_id = $1 ORDER BY name",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            ("keep".to_owned(), b"kept".to_vec(), "S".to_owned()),
            ("workspace".to_owned(), b"retried".to_vec(), "S".to_owned()),
        ]
    );
    assert_eq!(h.stored(id).await, (2, 0));
    // The end: the ephemeral workspace goes, the persistent volume expires in 3 hours.
    let mut tx = pool.begin().await.unwrap();
    orchestrator::workspaces::ended(&mut tx, id).await.unwrap();
    tx.commit().await.unwrap();
    let left: Vec<(String, f64)> = sqlx::query_as(
        "SELECT name, EXTRACT(EPOCH FROM expires_at - now())::float8 / 3600 FROM workflow_volumes \
         WHERE execution_id = $1",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0, "keep");
    assert!((2.9..=3.0).contains(&left[0].1), "{left:?}");
    // A draft written after the end (a stalled replica) is swept once the run has ended.
    draft("workspace", "S", 3, "late").await.unwrap();
    sqlx::query("UPDATE workflow_executions SET status = 'failed', ended_at = now() WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(orchestrator::workspaces::sweep(pool).await.unwrap(), 1);
    assert_eq!(h.stored(id).await, (1, 0));
}

/// Two orchestrator processes (the real binary) on one database: the one running a state that
/// mounts the workspace is killed with `kill -9`; the other retries the state from the content
/// the previous state committed, without what the killed attempt wrote.
#[tokio::test]
async fn a_replica_that_takes_over_a_run_finds_the_committed_workspace() {
    use common::binary::{self, free_port};

    let db = TestDb::create().await;
    let pool = db.pool().await;
    let env = [
        ("ORCHESTRATOR__WORKFLOWS__LEASE_TTL_SECS", "2"),
        ("ORCHESTRATOR__WORKFLOWS__POLL_INTERVAL_MS", "200"),
        ("ORCHESTRATOR__WORKFLOWS__SYSTEM_IMAGE", BUSYBOX),
        ("ORCHESTRATOR__SANDBOX__DEAD_AFTER_SECS", "5"),
        ("ORCHESTRATOR__SANDBOX__REAP_INTERVAL_SECS", "2"),
    ];
    let (port_a, port_b) = (free_port(), free_port());
    let mut a = binary::start_on(&db, port_a, &env).await.child;
    let instance_a: Uuid = sqlx::query_scalar("SELECT id FROM node_instances")
        .fetch_one(&pool)
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let manifest = workflow_manifest(
        "relay",
        "WRITE",
        "    WRITE:
      kind: ContainerRun
      name: write
      image: aegis-runtime/busybox:1
      command: [sh, -c, \"echo committed > /workspace/a\"]
      volumes: [{name: workspace, mount_path: /workspace}]
      transitions: [{condition: on_success, target: SLOW}]
    SLOW:
      kind: ContainerRun
      name: slow
      image: aegis-runtime/busybox:1
      command: [sh, -c, \"ls -A /workspace; echo partial > /workspace/b; sleep 4\"]
      volumes: [{name: workspace, mount_path: /workspace}]
      transitions: [{condition: on_success, target: FINAL}]
    FINAL:
      kind: ContainerRun
      name: final
      image: aegis-runtime/busybox:1
      command: [sh, -c, \"ls -A /workspace; cat /workspace/a\"]
      volumes: [{name: workspace, mount_path: /workspace, read_only: true}]
      transitions: []
",
    );
    let a_rest = common::rest::Rest::new(
        client.clone(),
        &format!("http://127.0.0.1:{port_a}"),
        common::TEST_ADMIN_KEY,
    );
    a_rest.deployed("/v1/workflows", &manifest).await;
    let id: Uuid = a_rest
        .started("/v1/workflows/relay/run", json!({}))
        .await
        .parse()
        .unwrap();

    // A is inside SLOW (its container started) when it dies.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let started: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workflow_execution_events e JOIN workflow_executions x \
             ON x.id = e.execution_id WHERE x.id = $1 AND x.lease_owner = $2 \
             AND e.event_type = 'volumes_mounted' AND e.state_name = 'SLOW'",
        )
        .bind(id)
        .bind(instance_a)
        .fetch_one(&pool)
        .await
        .unwrap();
        if started == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "replica A never ran SLOW");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    common::binary::crash(&mut a).await;
    let _b = binary::start_on(&db, port_b, &env).await;

    let deadline = Instant::now() + Duration::from_secs(90);
    let (status, blackboard) = loop {
        let (status, blackboard): (String, Value) =
            sqlx::query_as("SELECT status, blackboard FROM workflow_executions WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap();
        if ["completed", "failed", "cancelled", "timed_out"].contains(&status.as_str()) {
            break (status, blackboard);
        }
        assert!(Instant::now() < deadline, "the run never ended: {status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status, "completed", "{blackboard}");
    // The retry saw what WRITE committed and nothing of the killed attempt's `b`.
    assert_eq!(blackboard["SLOW"]["stdout"], "a\n");
    assert_eq!(blackboard["FINAL"]["stdout"], "a\nb\ncommitted\n");
    let retried: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM workflow_execution_events WHERE execution_id = $1 \
         AND event_type = 'state_retried' AND state_name = 'SLOW'",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(retried, 1);
    let left = crate::common::count(&pool, "SELECT (SELECT count(*) FROM workflow_volumes) + (SELECT count(*) FROM workflow_volume_drafts)").await;
    assert_eq!(left, 0, "the ended run left volume rows");
}

/// An Agent state's read-only mount keeps nothing of what the agent writes; an agent without a
/// sandbox tool gets nothing mounted (and says so); a workflow volume on top of the agent's own
/// `spec.volumes` is refused when the agent starts, naming both.
#[tokio::test]
async fn agent_states_mount_only_where_it_is_safe() {
    let h = harness(vec![
        tool_calls(&[(
            "fs__write",
            json!({"path": "/workspace/ignored.txt", "content": "not kept"}),
        )]),
        answer("wrote into a read-only mount"),
        answer("nothing to write with"),
    ])
    .await;
    let agent = |name: &str, extra: &str| {
        format!(
            "apiVersion: 100monkeys.ai/v1
kind: Agent
metadata:
  name: {name}
  version: \"1.0.0\"
spec:
  runtime: {{language: busybox, version: \"1\"}}
  task:
    instruction: Work.
{extra}"
        )
    };
    h.deployed_yaml(
        "/v1/agents",
        &agent(
            "reader",
            "  tools: [fs.write]\n  security:\n    filesystem: {read: [/workspace], write: [/workspace]}\n",
        ),
    )
    .await;
    h.deployed_yaml("/v1/agents", &agent("talker", "")).await;
    h.deployed_yaml(
        "/v1/agents",
        &agent(
            "keeper",
            "  tools: [fs.read]\n  volumes:\n    - {name: own, storage_class: ephemeral, mount_path: /workspace/own, access_mode: read-write, size_limit: 1Mi}\n",
        ),
    )
    .await;
    let manifest = workflow_manifest(
        "agents",
        "READ",
        "    READ:
      kind: Agent
      agent: reader
      input: write
      volumes: [{name: workspace, mount_path: /workspace, read_only: true}]
      transitions: [{condition: on_success, target: TALK}]
    TALK:
      kind: Agent
      agent: talker
      input: talk
      volumes: [{name: workspace, mount_path: /workspace}]
      transitions: [{condition: on_success, target: KEEP}]
    KEEP:
      kind: Agent
      agent: keeper
      input: keep
      volumes: [{name: workspace, mount_path: /workspace}]
      transitions: [{condition: on_failure, target: LIST}]
    LIST:
      kind: ContainerRun
      name: list
      image: aegis-runtime/busybox:1
      command: [ls, -A, /workspace]
      volumes: [{name: workspace, mount_path: /workspace, read_only: true}]
      transitions: []
",
    );
    h.deployed_yaml("/v1/workflows", &manifest).await;
    let (_, e) = h.run_to_end("agents", json!({})).await;
    assert_eq!(e["status"], "completed", "{e}");
    let bb = &e["blackboard"];
    // The write happened in the reader's sandbox and was not kept.
    assert_eq!(bb["READ"]["status"], "completed", "{}", bb["READ"]);
    assert_eq!(bb["LIST"]["stdout"], "", "{}", bb["LIST"]);
    let agent_events = |id: Value| {
        let app = &h.app;
        async move {
            let body = app
                .get_value(&format!(
                    "/v1/executions/{}/events?limit=1000",
                    id.as_str().unwrap()
                ))
                .await;
            body["events"].as_array().unwrap().clone()
        }
    };
    let read = agent_events(bb["READ"]["execution_id"].clone()).await;
    let kinds: Vec<&str> = read
        .iter()
        .map(|e| e["event_type"].as_str().unwrap_or_default())
        .collect();
    assert!(kinds.contains(&"workflow_volumes_mounted"), "{kinds:?}");
    assert!(!kinds.contains(&"workflow_volumes_saved"), "{kinds:?}");
    let talk = agent_events(bb["TALK"]["execution_id"].clone()).await;
    let unmounted: Vec<&Value> = talk
        .iter()
        .filter(|e| e["event_type"] == "workflow_volumes_not_mounted")
        .collect();
    assert_eq!(unmounted.len(), 1, "{talk:#?}");
    assert!(common::json::text(&unmounted[0]["payload"]["reason"])
        .contains("no tool that runs in a sandbox"));
    // The keeper never started: its own volume sits where the workflow volume would go.
    let keep = &bb["KEEP"];
    assert_eq!(keep["status"], "failed", "{keep}");
    assert!(
        keep["error"].as_str().unwrap().contains(
            "mounts volume `workspace` at /workspace, which overlaps agent `keeper`'s own volume `own` at /workspace/own"
        ),
        "{keep}"
    );
}
