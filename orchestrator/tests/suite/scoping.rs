//! Executions are scoped and bounded: another caller (a second SEAL session, a readonly key)
//! cannot read, wait for, cancel or remove an execution it did not start; child executions are
//! bounded in depth and never have more rights than their parent; concurrent executions are
//! bounded per caller and per node, with clear refusals.

use crate::common;
use crate::common::agent::AgentManifest;

use std::time::{Duration, Instant};

use aegis_cli::seal_client::{SealClient, Transport};
use common::fake_llm::{answer, tool_calls, FakeLlm, Step};
use common::refusal::seal_ok;
use common::{test_config, TestApp, TestDb};
use orchestrator::config::NodeConfig;
use reqwest::Method;
use serde_json::{json, Value};

fn agent(name: &str, tools: &str, extra: &str) -> String {
    AgentManifest::new(name)
        .instruction("Do the task.")
        .tools_listed(tools)
        .spec(extra)
        .yaml()
}

fn contexts() -> Vec<Value> {
    vec![
        json!({"name": "tasker", "description": "runs and watches executions",
               "capabilities": [{"tool_pattern": "aegis.task.*"}, {"tool_pattern": "aegis.agent.*"}],
               "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}}),
        json!({"name": "wide", "description": "an agent's own, broad context",
               "capabilities": [{"tool_pattern": "*"}],
               "attestation": {"workload_patterns": ["nobody-*"], "allow_unverified": true}}),
    ]
}

struct Setup {
    app: TestApp,
    llm: FakeLlm,
    _db: TestDb,
}

async fn setup(script: Vec<Step>, tune: impl FnOnce(&mut NodeConfig)) -> Setup {
    let db = TestDb::create().await;
    let llm = FakeLlm::start(script).await;
    let mut config = test_config(&db.url);
    config.llm = llm.config();
    config.seal.security_contexts = contexts();
    tune(&mut config);
    let app = TestApp::spawn_with(config).await;
    Setup { app, llm, _db: db }
}

impl Setup {
    async fn deploy(&self, manifest: &str) {
        self.app.deployed("/v1/agents", manifest).await;
    }

    async fn execute_as(&self, key: &str, agent: &str) -> (u16, Value) {
        let r = self
            .app
            .rest_as(key)
            .post_json(
                &format!("/v1/agents/{agent}/execute"),
                &json!({"input": {}}),
            )
            .await;
        (r.status().as_u16(), r.json().await.unwrap())
    }

    /// Starts agent `agent` as the administrator, which must be accepted; the execution's id.
    async fn started(&self, agent: &str) -> String {
        let path = format!("/v1/agents/{agent}/execute");
        self.app.started(&path, json!({})).await
    }

    /// Waits for execution `id` to complete; its model's tool call must have been `decision`
    /// (`allowed`, `denied`). Its events.
    async fn completed_with_decision(&self, id: &str, decision: &str) -> Vec<Value> {
        self.wait_status(id, "completed").await;
        let events = self.events(id).await;
        let call = events
            .iter()
            .find(|e| e["event_type"] == "tool_call")
            .expect("the model's call is recorded");
        assert_eq!(call["payload"]["decision"], decision, "{call}");
        events
    }

    async fn status_of(&self, id: &str) -> String {
        self.app
            .one("SELECT status FROM executions WHERE id = $1::uuid", id)
            .await
    }

    async fn wait_status(&self, id: &str, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = self.status_of(id).await;
            if status == want {
                return;
            }
            assert!(Instant::now() < deadline, "execution {id} still {status}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn events(&self, id: &str) -> Vec<Value> {
        let r = self
            .app
            .response(
                Method::GET,
                &format!("/v1/executions/{id}/events?limit=1000"),
                None,
            )
            .await;
        let body: Value = r.json().await.unwrap();
        body["events"].as_array().unwrap().clone()
    }
}

async fn tasker(app: &TestApp, workload: &str) -> SealClient {
    let mut client = SealClient::new(Transport::Http(app.http_base.clone())).unwrap();
    client.attest(workload, "tasker").await.unwrap();
    client
}

fn refused_as_forbidden(result: &Value) {
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(
        result["structuredContent"]["error"]["code"], "forbidden",
        "{result}"
    );
}

#[tokio::test]
async fn another_caller_cannot_read_wait_for_cancel_or_remove_an_execution() {
    let s = setup(vec![Step::Hang], |_| {}).await;
    s.deploy(&agent("worker", "", "")).await;
    let owner = tasker(&s.app, "test-owner").await;
    let other = tasker(&s.app, "test-other").await;
    let id = common::refusal::seal_started(&owner, "worker").await;
    s.wait_status(&id, "running").await;

    // The other session: every tool that names the execution is refused.
    for (tool, args) in [
        ("aegis.task.status", json!({"execution_id": id})),
        ("aegis.task.logs", json!({"execution_id": id})),
        ("aegis.task.cancel", json!({"execution_id": id})),
        (
            "aegis.task.wait",
            json!({"execution_id": id, "timeout_seconds": 1}),
        ),
        (
            "aegis.agent.wait",
            json!({"execution_id": id, "timeout_seconds": 1}),
        ),
    ] {
        refused_as_forbidden(&other.call_tool(tool, args).await.unwrap());
    }
    let listed = other.call_tool("aegis.task.list", json!({})).await.unwrap();
    assert_eq!(listed["structuredContent"]["total"], 0, "{listed}");
    let agent_id: String = s
        .app
        .one(
            "SELECT agent_id::text FROM executions WHERE id = $1::uuid",
            &id,
        )
        .await;
    let logs = other
        .call_tool("aegis.agent.logs", json!({"agent_id": agent_id}))
        .await
        .unwrap();
    assert_eq!(logs["structuredContent"]["total"], 0, "{logs}");
    assert_eq!(s.status_of(&id).await, "running", "the cancel did nothing");

    // A readonly key sees nothing of it over REST either; an operator sees it.
    let readonly = s.app.create_key("ro", "readonly").await;
    let run = format!("/v1/executions/{id}");
    s.app.assert_run_hidden(&run, &readonly, 403).await;
    let r = s
        .app
        .rest_as(&readonly)
        .response(Method::GET, "/v1/executions", None)
        .await;
    assert_eq!(r.json::<Value>().await.unwrap(), json!([]));
    for (method, path) in [
        (Method::POST, format!("/v1/executions/{id}/cancel")),
        (Method::DELETE, format!("/v1/executions/{id}")),
    ] {
        let r = s.app.rest_as(&readonly).response(method, &path, None).await;
        assert_eq!(r.status(), 403, "{path}");
    }
    let operator = s.app.create_key("op", "operator").await;
    s.app
        .rest_as(&operator)
        .answered(Method::GET, &format!("/v1/executions/{id}"), None, 200)
        .await;

    // The owner sees and cancels it.
    let mine = owner.call_tool("aegis.task.list", json!({})).await.unwrap();
    assert_eq!(mine["structuredContent"]["total"], 1, "{mine}");
    seal_ok(&owner, "aegis.task.status", json!({"execution_id": id})).await;
    seal_ok(&owner, "aegis.task.cancel", json!({"execution_id": id})).await;
    s.wait_status(&id, "cancelled").await;
}

#[tokio::test]
async fn child_executions_stop_at_the_depth_limit() {
    let execute = || tool_calls(&[("aegis__task__execute", json!({"agent_id": "recurse"}))]);
    // Parent: two rounds, each starts a child; each child tries twice to start a grandchild.
    let s = setup((0..6).map(|_| execute()).collect(), |c| {
        c.executions.max_depth = 1;
        c.executions.max_tool_rounds = 2;
        c.executions.max_iterations = 1;
    })
    .await;
    s.deploy(&agent("recurse", "aegis.task.execute", "")).await;
    let root = s.started("recurse").await;

    let deadline = Instant::now() + Duration::from_secs(60);
    let rows: Vec<(String, i32, Option<String>, String)> = loop {
        let rows: Vec<(String, i32, Option<String>, String)> = sqlx::query_as(
            "SELECT id::text, depth, parent_execution_id::text, status FROM executions ORDER BY depth",
        )
        .fetch_all(&s.app.state.pool)
        .await
        .unwrap();
        let ended = rows
            .iter()
            .all(|r| ["completed", "failed", "cancelled", "timed_out"].contains(&r.3.as_str()));
        if rows.len() == 3 && ended {
            break rows;
        }
        assert!(Instant::now() < deadline, "executions: {rows:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(rows[0].0, root);
    assert_eq!(rows[0].1, 0);
    for child in &rows[1..] {
        assert_eq!(child.1, 1, "{rows:?}");
        assert_eq!(child.2.as_deref(), Some(root.as_str()));
        let refusals: Vec<Value> = s
            .events(&child.0)
            .await
            .into_iter()
            .filter(|e| e["event_type"] == "tool_call" && e["payload"]["error"] == "depth_limit")
            .collect();
        assert_eq!(refusals.len(), 2, "{child:?}");
    }
    assert_eq!(s.llm.remaining(), 0);
}

#[tokio::test]
async fn concurrent_executions_are_bounded_per_caller_and_per_node() {
    let s = setup(vec![Step::Hang, Step::Hang, Step::Hang], |c| {
        c.executions.max_concurrent_per_caller = 1;
        c.executions.max_concurrent = 2;
    })
    .await;
    s.deploy(&agent("waiter", "", "")).await;
    let (status, first) = s.execute_as(common::TEST_ADMIN_KEY, "waiter").await;
    assert_eq!(status, 201, "{first}");
    let (status, refused) = s.execute_as(common::TEST_ADMIN_KEY, "waiter").await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["code"], "concurrency_limit");
    assert!(
        common::json::text(&refused["error"]).contains("executions.max_concurrent_per_caller"),
        "{refused}"
    );
    let one = s.app.create_key("one", "operator").await;
    let two = s.app.create_key("two", "operator").await;
    let (status, second) = s.execute_as(&one, "waiter").await;
    assert_eq!(status, 201, "{second}");
    let (status, refused) = s.execute_as(&two, "waiter").await;
    assert_eq!(status, 429, "{refused}");
    assert!(
        common::json::text(&refused["error"]).contains("executions.max_concurrent"),
        "{refused}"
    );
    let live = s
        .app
        .count("SELECT count(*) FROM executions WHERE status IN ('pending', 'running')")
        .await;
    assert_eq!(live, 2, "refused executions were not stored");

    // When one ends, its caller may start again.
    let id = first["execution_id"].as_str().unwrap();
    s.app.cancel_execution(id, 200).await;
    s.wait_status(id, "cancelled").await;
    let (status, third) = s.execute_as(common::TEST_ADMIN_KEY, "waiter").await;
    assert_eq!(status, 201, "{third}");
}

#[tokio::test]
async fn an_execution_never_has_more_rights_than_the_session_that_started_it() {
    let list = || tool_calls(&[("fs__list", json!({"path": "/workspace"}))]);
    let s = setup(vec![list(), answer("done"), list(), answer("done")], |_| {}).await;
    s.deploy(&agent("lister", "fs.list", "  security_context: wide\n"))
        .await;

    // Started by a session whose context grants no fs.*: the agent's own broad context does
    // not lift it.
    let session = tasker(&s.app, "test-limited").await;
    let limited = common::refusal::seal_started(&session, "lister").await;
    let events = s.completed_with_decision(&limited, "denied").await;
    assert!(
        events.iter().all(|e| e["event_type"] != "sandbox_created"),
        "no sandbox for tools it may not use"
    );

    // Started by an operator, the same agent uses its own context.
    let free = s.started("lister").await;
    s.completed_with_decision(&free, "allowed").await;
}
