//! One test node driven through REST, shared by the suites that deploy agents or workflows and
//! run them against the scripted model (fake_llm.rs): a fresh database, the scripted model as
//! the node's LLM, and the few requests every such test makes (deploy, execute, wait for the
//! end, read the events). What differs between suites is a named option of [`HarnessBuilder`].

use std::fmt::Display;
use std::time::Duration;

use orchestrator::config::NodeConfig;
use reqwest::Method;
use serde_json::{json, Value};

use super::fake_llm::{FakeLlm, Step};
use super::{test_config, TestApp, TestDb, TEST_ADMIN_KEY};

/// Where agents are deployed.
pub const AGENTS: &str = "/v1/agents";
/// Where workflows are deployed.
pub const WORKFLOWS: &str = "/v1/workflows";
/// The image of System and ContainerRun states when [`HarnessBuilder::workflows`] is asked for.
pub const BUSYBOX: &str = "aegis-runtime/busybox:1";

/// A running node with its own database and scripted model.
pub struct Harness {
    pub app: TestApp,
    pub llm: FakeLlm,
    /// How long [`Harness::run`] waits for an execution's end.
    pub ends_within: Duration,
    _db: TestDb,
}

/// The options of a [`Harness`]; [`HarnessBuilder::start`] starts it.
pub struct HarnessBuilder {
    script: Vec<Step>,
    workflows: bool,
    ends_within: Duration,
}

impl HarnessBuilder {
    /// Workflow states run on busybox (`workflows.system_image`) and the workflow engine polls
    /// every 200 ms.
    pub fn workflows(mut self) -> Self {
        self.workflows = true;
        self
    }

    /// How long [`Harness::run`] waits for an execution's end (90 s unless told).
    pub fn ends_within(mut self, within: Duration) -> Self {
        self.ends_within = within;
        self
    }

    pub async fn start(self) -> Harness {
        self.start_tuned(|_| {}).await
    }

    /// Starts the node after `tune` changed its configuration (last, after the options above).
    pub async fn start_tuned(self, tune: impl FnOnce(&mut NodeConfig)) -> Harness {
        let db = TestDb::create().await;
        let llm = FakeLlm::start(self.script).await;
        let mut config = test_config(&db.url);
        config.llm = llm.config();
        if self.workflows {
            config.workflows.system_image = Some(BUSYBOX.to_owned());
            config.workflows.poll_interval_ms = 200;
        }
        tune(&mut config);
        let app = TestApp::spawn_with(config).await;
        Harness {
            app,
            llm,
            ends_within: self.ends_within,
            _db: db,
        }
    }
}

impl Harness {
    /// A node with no option set.
    pub async fn start(script: Vec<Step>) -> Harness {
        Self::builder(script).start().await
    }

    pub fn builder(script: Vec<Step>) -> HarnessBuilder {
        HarnessBuilder {
            script,
            workflows: false,
            ends_within: Duration::from_secs(90),
        }
    }

    /// `method` on `path` with `body` as JSON, as the administrator; (status, answer).
    pub async fn send(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        self.app.send(method, path, body).await
    }

    /// Polls the execution at `path` until its `status` is terminal (within `ends_within`).
    pub async fn ended(&self, path: &str) -> Value {
        self.app.until_ended(path, self.ends_within).await
    }

    /// Posts a manifest to `path` ([`AGENTS`], [`WORKFLOWS`], ...); (status, answer).
    pub async fn deploy(&self, path: &str, manifest: &str) -> (u16, Value) {
        self.app.rest().post_manifest(path, manifest).await
    }

    /// Deploys a manifest that must be accepted (201); the answer.
    pub async fn deployed(&self, path: &str, manifest: &str) -> Value {
        self.app.deployed(path, manifest).await
    }

    /// Posts `body` to `agent`'s execute as the holder of `key`; (status, answer).
    pub async fn execute_as(&self, key: &str, agent: &str, body: Value) -> (u16, Value) {
        self.app
            .rest_as(key)
            .send(
                Method::POST,
                &format!("{AGENTS}/{agent}/execute"),
                Some(body),
            )
            .await
    }

    /// Executes `agent` on `input` as the administrator; (status, answer).
    pub async fn execute(&self, agent: &str, input: Value) -> (u16, Value) {
        self.execute_as(TEST_ADMIN_KEY, agent, json!({ "input": input }))
            .await
    }

    /// Starts `agent` with the request `body` as the holder of `key`, which must be accepted;
    /// the execution's id.
    pub async fn started_as(&self, key: &str, agent: &str, body: Value) -> String {
        let (status, body) = self.execute_as(key, agent, body).await;
        assert!((200..300).contains(&status), "{status}: {body}");
        body["execution_id"]
            .as_str()
            .expect("execution id")
            .to_owned()
    }

    /// [`Harness::started_as`] as the administrator.
    pub async fn started(&self, agent: &str, body: Value) -> String {
        self.started_as(TEST_ADMIN_KEY, agent, body).await
    }

    /// Runs `agent` on `input` as the holder of `key` and waits for the end; (id, execution).
    pub async fn run_as(&self, key: &str, agent: &str, input: Value) -> (String, Value) {
        let id = self.started_as(key, agent, json!({ "input": input })).await;
        let e = self.wait_end(&id, self.ends_within).await;
        (id, e)
    }

    /// [`Harness::run_as`] as the administrator.
    pub async fn run(&self, agent: &str, input: Value) -> (String, Value) {
        self.run_as(TEST_ADMIN_KEY, agent, input).await
    }

    /// Posts the request `body` to workflow `name`'s run; (status, answer).
    pub async fn run_workflow(&self, name: &str, body: Value) -> (u16, Value) {
        self.send(Method::POST, &format!("{WORKFLOWS}/{name}/run"), Some(body))
            .await
    }

    /// Starts workflow `name` on `input`, which must be accepted (201); the execution's id.
    pub async fn workflow_started(&self, name: &str, input: Value) -> String {
        let (status, body) = self.run_workflow(name, json!({ "input": input })).await;
        assert_eq!(status, 201, "{body}");
        body["execution_id"]
            .as_str()
            .expect("execution id")
            .to_owned()
    }

    /// Runs workflow `name` on `input` and waits (`ends_within`) for its end; (id, execution).
    pub async fn workflow_to_end(&self, name: &str, input: Value) -> (String, Value) {
        let id = self.workflow_started(name, input).await;
        let e = self.ended(&format!("{WORKFLOWS}/executions/{id}")).await;
        (id, e)
    }

    /// Waits (`ends_within`) for workflow execution `id` to end; the execution.
    pub async fn workflow_ended(&self, id: impl Display) -> Value {
        self.ended(&format!("{WORKFLOWS}/executions/{id}")).await
    }

    /// Waits for agent execution `id` to end; the execution.
    pub async fn wait_end(&self, id: &str, within: Duration) -> Value {
        self.app
            .until_ended(&format!("/v1/executions/{id}"), within)
            .await
    }

    /// The events of agent execution `id`, oldest first.
    pub async fn events(&self, id: impl Display) -> Vec<Value> {
        self.events_at(&format!("/v1/executions/{id}/events?limit=1000"))
            .await
    }

    /// The events of workflow execution `id`, oldest first.
    pub async fn workflow_events(&self, id: impl Display) -> Vec<Value> {
        self.events_at(&format!("/v1/workflows/executions/{id}/events?limit=1000"))
            .await
    }

    async fn events_at(&self, path: &str) -> Vec<Value> {
        let body: Value = self
            .app
            .response(Method::GET, path, None)
            .await
            .json()
            .await
            .expect("events answer");
        body["events"].as_array().expect("events").clone()
    }
}

/// The events of `kind` among `events`.
pub fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event_type"] == kind).collect()
}

/// (tool, decision) of each `tool_call` event among `events`, in order.
pub fn tool_decisions(events: &[Value]) -> Vec<(&str, &str)> {
    of_type(events, "tool_call")
        .iter()
        .map(|c| {
            (
                c["payload"]["tool"].as_str().unwrap_or_default(),
                c["payload"]["decision"].as_str().unwrap_or_default(),
            )
        })
        .collect()
}
