//! Workflow executions against the real service: PostgreSQL, Docker sandboxes (busybox), and the
//! scripted model (tests/suite/common/fake_llm.rs) behind Agent states. Every state kind, the Human
//! gate's four endings, limits, ParallelContainerRun completion rules, both Subworkflow modes,
//! cancellation, and the refusals of `run` and `signal`.

use crate::common;
use crate::common::workflow::workflow_manifest;

use std::time::{Duration, Instant};

use common::agent::AgentManifest;
use common::docker_lines;
use common::fake_llm::{answer, Step};
use common::harness::{of_type, Harness, HarnessBuilder, WORKFLOWS};
use reqwest::Method;
use serde_json::{json, Value};

/// The node every test here starts from: workflow states run on busybox.
fn node(script: Vec<Step>) -> HarnessBuilder {
    Harness::builder(script).workflows()
}

async fn harness(script: Vec<Step>) -> Harness {
    node(script).start().await
}

impl Harness {
    async fn workflow_execution(&self, id: &str) -> Value {
        let r = self
            .app
            .response(Method::GET, &format!("/v1/workflows/executions/{id}"), None)
            .await;
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    }

    /// Polls until `pred` holds on the execution.
    async fn workflow_until(&self, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.app
            .until(
                &format!("/v1/workflows/executions/{id}"),
                what,
                Duration::from_secs(90),
                pred,
            )
            .await
    }

    async fn waiting(&self, id: &str) -> Value {
        self.workflow_until(id, "waiting", |e| e["status"] == "waiting")
            .await
    }

    /// Cancels workflow execution `id`, expecting `status` (the answer's body names any other).
    async fn cancel_workflow(&self, id: &str, status: u16) -> Value {
        let path = format!("/v1/workflows/executions/{id}/cancel");
        self.app
            .rest()
            .answered(Method::POST, &path, None, status)
            .await
    }

    async fn signal(&self, id: &str, response: &str) -> (u16, Value) {
        let path = format!("/v1/workflows/executions/{id}/signal");
        let answer = json!({"response": response});
        self.app.send_json(Method::POST, &path, Some(answer)).await
    }
}

/// The log is numbered 1..=n without gaps.
fn assert_gap_free(events: &[Value]) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e["seq"],
            json!(i as i64 + 1),
            "gap in the event log: {events:#?}"
        );
    }
}

/// The events of the ended workflow run `id`, which must be gap-free, with no container of
/// the run left.
async fn cleanly_ended(h: &Harness, id: &str) -> Vec<Value> {
    let events = h.workflow_events(id).await;
    assert_gap_free(&events);
    assert!(containers_of(id).is_empty(), "containers of {id} left");
    events
}

/// Containers (any status) of a workflow execution, by the label its sandboxes carry.
fn containers_of(execution: &str) -> Vec<String> {
    docker_lines(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=workflow_execution={execution}"),
    ])
}

const CHILD: &str = "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: child
  version: \"1.0.0\"
  output_template:
    echoed: \"child saw {{input.word}}\"
spec:
  initial_state: ECHO
  states:
    ECHO:
      kind: System
      command: \"echo child {{input.word}}\"
      transitions: []
";

/// Waits for the end of workflow run `id`, which must have failed saying `error`; the run.
async fn failed_with(h: &Harness, id: &str, error: &str) -> Value {
    let e = h.workflow_ended(id).await;
    assert_eq!(e["status"], "failed", "{e}");
    assert_eq!(e["error"], error, "{e}");
    e
}

#[tokio::test]
async fn every_state_kind_passes_data_through_the_blackboard() {
    let h = harness(vec![
        // AGENT, first iteration: the judge rejects it.
        answer("Hello Ada"),
        answer("{\"score\": 0.2, \"confidence\": 0.9, \"reasoning\": \"too terse\"}"),
        // AGENT, second iteration with the judge's reasoning fed back: accepted.
        answer("Hello, dear Ada"),
        answer("{\"score\": 0.9, \"confidence\": 0.8, \"reasoning\": \"warm\"}"),
        // PANEL: two reviewers (they run at once, so they answer alike).
        answer("{\"score\": 0.7, \"confidence\": 0.9, \"reasoning\": \"fine\"}"),
        answer("{\"score\": 0.7, \"confidence\": 0.9, \"reasoning\": \"fine\"}"),
    ])
    .await;
    for a in ["writer", "critic", "reviewer"] {
        h.deployed("/v1/agents", &AgentManifest::new(a).yaml())
            .await;
    }
    h.deployed(WORKFLOWS, CHILD).await;
    h.deployed(
        WORKFLOWS,
        "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: tour
  version: \"1.0.0\"
  input_schema:
    type: object
    required: [name]
    properties:
      name: {type: string}
  output_template:
    greeting: \"{{AGENT.output}}\"
    child: \"{{child_result.echoed}}\"
spec:
  initial_state: START
  context:
    punctuation: \"!\"
  states:
    START:
      kind: System
      command: \"echo {{input.name}}{{punctuation}}\"
      transitions:
        - condition: exit_code_zero
          target: AGENT
    AGENT:
      kind: Agent
      agent: writer
      input: \"Greet {{first_line START.stdout}}\"
      judges:
        - agent_id: critic
          weight: 2
      max_iterations: 3
      transitions:
        - condition: score_above
          threshold: 0.8
          target: PANEL
        - condition: on_failure
          target: REJECTED
    PANEL:
      kind: ParallelAgents
      agents:
        - agent: reviewer
          input: \"Review: {{AGENT.output}}\"
        - agent: reviewer
          input: \"Review again: {{AGENT.output}}\"
      consensus:
        strategy: weighted_average
        threshold: 0.6
      transitions:
        - condition: consensus
          threshold: 0.6
          agreement: 0.5
          target: CONTAINER
        - condition: always
          target: REJECTED
    CONTAINER:
      kind: ContainerRun
      name: shout
      image: aegis-runtime/busybox:1
      command: [\"echo\", \"{{upper AGENT.output}}\"]
      transitions:
        - condition: on_success
          target: BOTH
    BOTH:
      kind: ParallelContainerRun
      completion: all_succeed
      steps:
        - name: left
          image: aegis-runtime/busybox:1
          command: [\"echo\", \"left\"]
        - name: right
          image: aegis-runtime/busybox:1
          command: [\"sh\", \"-c\", \"echo right-$GREETING\"]
          env:
            GREETING: \"{{trim CONTAINER.stdout}}\"
      transitions:
        - condition: on_success
          target: SUB
    SUB:
      kind: Subworkflow
      workflow_id: child
      mode: blocking
      result_key: child_result
      input: '{\"word\": \"{{trim BOTH.output.left.stdout}}\"}'
      transitions:
        - condition: on_success
          target: GATE
    GATE:
      kind: Human
      prompt: \"Send '{{AGENT.output}}'?\"
      timeout: 60s
      transitions:
        - condition: input_equals_yes
          target: DONE
          feedback: \"approved by a human\"
        - condition: always
          target: REJECTED
    DONE:
      kind: System
      command: \"echo {{state.feedback}}: {{child_result.echoed}}\"
      transitions: []
    REJECTED:
      kind: System
      command: \"false\"
      transitions: []
",
    )
    .await;

    let id = h.workflow_started("tour", json!({"name": "Ada"})).await;
    // It waits twice: for the blocking child (SUB), then for a human (GATE).
    h.workflow_until(&id, "waiting at the gate", |e| {
        e["status"] == "waiting" && e["current_state"] == "GATE" || e["status"] == "failed"
    })
    .await;
    let events = h.workflow_events(&id).await;
    let prompt = of_type(&events, "human_input_requested");
    assert_eq!(prompt.len(), 1);
    assert_eq!(prompt[0]["payload"]["prompt"], "Send 'Hello, dear Ada'?");
    let (status, body) = h.signal(&id, "yes").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "GATE");

    let e = h.workflow_ended(&id).await;
    assert_eq!(e["status"], "completed", "{e}");
    let bb = &e["blackboard"];
    assert_eq!(bb["START"]["stdout"], "Ada!\n");
    assert_eq!(bb["AGENT"]["output"], "Hello, dear Ada");
    assert_eq!(bb["AGENT"]["iterations"], 2);
    assert!(bb["AGENT"]["score"].as_f64().unwrap() > 0.8);
    assert_eq!(bb["PANEL"]["individual_scores"], json!([0.7, 0.7]));
    assert!((bb["PANEL"]["consensus"]["score"].as_f64().unwrap() - 0.7).abs() < 1e-9);
    assert_eq!(bb["CONTAINER"]["stdout"], "HELLO, DEAR ADA\n");
    assert_eq!(
        bb["BOTH"]["output"]["right"]["stdout"],
        "right-HELLO, DEAR ADA\n"
    );
    assert_eq!(bb["child_result"]["echoed"], "child saw left");
    assert_eq!(bb["GATE"]["response"], "yes");
    assert_eq!(
        bb["DONE"]["stdout"],
        "approved by a human: child saw left\n"
    );
    assert_eq!(e["final_output"]["greeting"], "Hello, dear Ada");
    assert_eq!(e["final_output"]["child"], "child saw left");

    // The judge's reasoning reached the second attempt of the agent.
    let prompts: Vec<String> = h
        .llm
        .requests()
        .iter()
        .map(|r| r["messages"].to_string())
        .collect();
    assert!(
        prompts
            .iter()
            .any(|p| p.contains("too terse") && p.contains("Greet Ada!")),
        "{prompts:#?}"
    );

    let events = h.workflow_events(&id).await;
    assert_gap_free(&events);
    let entered: Vec<&str> = of_type(&events, "state_entered")
        .iter()
        .map(|e| e["state_name"].as_str().unwrap())
        .collect();
    assert_eq!(
        entered,
        [
            "START",
            "AGENT",
            "PANEL",
            "CONTAINER",
            "BOTH",
            "SUB",
            "GATE",
            "DONE"
        ]
    );
    assert_eq!(of_type(&events, "transition_taken").len(), 7);
    assert_eq!(events.last().unwrap()["event_type"], "execution_completed");
    // The child is linked to its parent state, and everything was cleaned up.
    let child_id = bb["SUB"]["child_execution_id"].as_str().unwrap();
    let child = h.workflow_execution(child_id).await;
    assert_eq!(child["parent_execution_id"], json!(id));
    assert_eq!(child["status"], "completed");
    assert!(containers_of(&id).is_empty());
    assert!(containers_of(child_id).is_empty());

    // A signal to an execution that no longer waits is refused with the reason, not lost.
    let (status, body) = h.signal(&id, "yes").await;
    assert_eq!(status, 409, "{body}");
    assert!(
        common::json::text(&body["error"]).contains("has ended (completed)"),
        "{body}"
    );
}

fn gate() -> String {
    workflow_manifest(
        "NAME",
        "ASK",
        "    ASK:
      kind: Human
      prompt: \"Deploy {{input.what}}?\"
      timeout: 2sDEFAULT
      transitions:
        - condition: input_equals_yes
          target: YES
        - condition: input_equals_no
          target: NO
    YES:
      kind: System
      command: \"echo yes\"
      transitions: []
    NO:
      kind: System
      command: \"echo no\"
      transitions: []
",
    )
}

#[tokio::test]
async fn a_human_gate_answered_yes_no_by_default_and_not_at_all() {
    let h = harness(vec![]).await;
    h.deployed(
        WORKFLOWS,
        &gate()
            .replace("NAME", "gate-default")
            .replace("DEFAULT", "\n      default_response: \"no\""),
    )
    .await;
    h.deployed(
        WORKFLOWS,
        &gate().replace("NAME", "gate-none").replace("DEFAULT", ""),
    )
    .await;
    let yes = h
        .workflow_started("gate-default", json!({"what": "v1"}))
        .await;
    let no = h
        .workflow_started("gate-default", json!({"what": "v2"}))
        .await;
    let by_default = h
        .workflow_started("gate-default", json!({"what": "v3"}))
        .await;
    let unanswered = h.workflow_started("gate-none", json!({"what": "v4"})).await;
    h.waiting(&yes).await;
    h.waiting(&no).await;
    // Another caller below the operator tier does not see someone else's run, nor its log.
    let stranger = h.app.create_key("stranger", "readonly").await;
    let run = format!("/v1/workflows/executions/{yes}");
    h.app.assert_run_hidden(&run, &stranger, 404).await;
    h.waiting(&yes).await;
    assert_eq!(h.signal(&yes, "Yes").await.0, 200);
    assert_eq!(h.signal(&no, "n").await.0, 200);

    let e = h.workflow_ended(&yes).await;
    assert_eq!(
        (e["status"].as_str(), e["current_state"].as_str()),
        (Some("completed"), Some("YES"))
    );
    assert_eq!(
        e["blackboard"]["ASK"],
        json!({"status": "completed", "response": "Yes", "timeout": false})
    );
    let e = h.workflow_ended(&no).await;
    assert_eq!(
        (e["status"].as_str(), e["current_state"].as_str()),
        (Some("completed"), Some("NO"))
    );

    let e = h.workflow_ended(&by_default).await;
    assert_eq!(e["status"], "completed", "{e}");
    assert_eq!(e["current_state"], "NO");
    assert_eq!(
        e["blackboard"]["ASK"],
        json!({"status": "completed", "response": "no", "timeout": true})
    );
    let events = h.workflow_events(&by_default).await;
    assert_eq!(of_type(&events, "human_input_timed_out").len(), 1);
    assert_eq!(
        of_type(&events, "human_input_requested")[0]["payload"]["prompt"],
        "Deploy v3?"
    );

    failed_with(
        &h,
        &unanswered,
        "Human state `ASK` timed out after 2 s with no answer and no default_response",
    )
    .await;
    // A late answer is refused, with the reason.
    let (status, body) = h.signal(&unanswered, "yes").await;
    assert_eq!(status, 409);
    assert!(
        common::json::text(&body["error"]).contains("has ended (failed)"),
        "{body}"
    );
    for id in [&yes, &no, &by_default, &unanswered] {
        assert_gap_free(&h.workflow_events(id).await);
    }
}

#[tokio::test]
async fn a_refine_loop_is_stopped_by_max_state_visits() {
    let h = harness(vec![]).await;
    h.deployed(
        WORKFLOWS,
        &workflow_manifest(
            "refine",
            "WORK",
            "    WORK:
      kind: System
      command: \"echo attempt {{state.visit}} {{state.feedback}}\"
      max_state_visits: 3
      transitions:
        - condition: always
          target: CHECK
    CHECK:
      kind: System
      command: \"false\"
      transitions:
        - condition: exit_code
          value: 1
          target: WORK
          feedback: \"check said {{CHECK.exit_code}}\"
        - condition: on_success
          target: DONE
    DONE:
      kind: System
      command: \"echo done\"
      transitions: []
",
        ),
    )
    .await;
    let id = h.workflow_started("refine", json!({})).await;
    let e = failed_with(
        &h,
        &id,
        "max_state_visits (3) of state `WORK` reached: entering it from `CHECK` would be visit 4",
    )
    .await;
    assert_eq!(e["visits"], json!({"WORK": 3, "CHECK": 3}));
    assert_eq!(
        e["blackboard"]["WORK"]["stdout"],
        "attempt 3 check said 1\n"
    );
    let events = cleanly_ended(&h, &id).await;
    assert_eq!(of_type(&events, "state_exited").len(), 6);
}

#[tokio::test]
async fn state_transition_and_execution_limits_name_the_limit_and_the_state() {
    let h = node(vec![])
        .start_tuned(|c| c.workflows.max_execution_secs = 3)
        .await;
    h.deployed(
        WORKFLOWS,
        &workflow_manifest(
            "slow",
            "SLOW",
            "    SLOW:
      kind: System
      command: \"sleep 60\"
      timeout: 1s
      transitions: []
",
        ),
    )
    .await;
    h.deployed(
        WORKFLOWS,
        "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: pingpong
  version: \"1.0.0\"
spec:
  initial_state: PING
  max_total_transitions: 3
  states:
    PING:
      kind: System
      command: \"true\"
      transitions:
        - {condition: on_success, target: PONG}
        - {condition: on_failure, target: END}
    PONG:
      kind: System
      command: \"true\"
      transitions:
        - {condition: always, target: PING}
    END:
      kind: System
      command: \"true\"
      transitions: []
",
    )
    .await;
    h.deployed(
        WORKFLOWS,
        &workflow_manifest(
            "patient",
            "ASK",
            "    ASK:
      kind: Human
      prompt: \"Anyone?\"
      timeout: 1h
      transitions: []
",
        ),
    )
    .await;
    let slow = h.workflow_started("slow", json!({})).await;
    let pingpong = h.workflow_started("pingpong", json!({})).await;
    let patient = h.workflow_started("patient", json!({})).await;
    failed_with(
        &h,
        &slow,
        "state `SLOW` timed out after 1 s (its `timeout`)",
    )
    .await;
    let e = failed_with(
        &h,
        &pingpong,
        "max_total_transitions (3) reached: state `PONG` could not go on to `PING`",
    )
    .await;
    assert_eq!(e["transition_count"], 3);
    let e = h.workflow_ended(&patient).await;
    assert_eq!(e["status"], "timed_out");
    assert_eq!(
        e["error"],
        "execution timeout (workflows.max_execution_secs = 3 s) reached in state `ASK`"
    );
    for id in [&slow, &pingpong, &patient] {
        assert_gap_free(&h.workflow_events(id).await);
        assert!(containers_of(id).is_empty());
    }
}

#[tokio::test]
async fn parallel_container_runs_follow_their_completion_rule() {
    let h = harness(vec![]).await;
    h.deployed(
        WORKFLOWS,
        &workflow_manifest(
            "rules",
            "ALL",
            "    ALL:
      kind: ParallelContainerRun
      completion: all_succeed
      steps:
        - {name: ok, image: aegis-runtime/busybox:1, command: [\"true\"]}
        - {name: bad, image: aegis-runtime/busybox:1, command: [\"sh\", \"-c\", \"echo broken >&2; exit 3\"]}
      transitions:
        - {condition: on_failure, target: ANY}
    ANY:
      kind: ParallelContainerRun
      completion: any_succeed
      steps:
        - {name: ok, image: aegis-runtime/busybox:1, command: [\"true\"]}
        - {name: bad, image: aegis-runtime/busybox:1, command: [\"false\"]}
      transitions:
        - {condition: on_success, target: BEST}
    BEST:
      kind: ParallelContainerRun
      completion: best_effort
      steps:
        - {name: bad1, image: aegis-runtime/busybox:1, command: [\"false\"]}
        - {name: bad2, image: aegis-runtime/does-not-exist:1, command: [\"true\"]}
      transitions:
        - {condition: on_success, target: ALL_OK}
    ALL_OK:
      kind: ParallelContainerRun
      steps:
        - {name: a, image: aegis-runtime/busybox:1, command: [\"echo\", \"a\"]}
        - {name: b, image: aegis-runtime/busybox:1, command: [\"echo\", \"b\"], retry: {max_attempts: 2, backoff: 100ms}}
      transitions: []
",
        ),
    )
    .await;
    let id = h.workflow_started("rules", json!({})).await;
    let e = h.workflow_ended(&id).await;
    assert_eq!(e["status"], "completed", "{e}");
    let bb = &e["blackboard"];
    assert_eq!(bb["ALL"]["status"], "failed");
    assert_eq!(bb["ALL"]["overall_success"], false);
    assert_eq!(bb["ALL"]["failed"], json!(["bad"]));
    assert_eq!(bb["ALL"]["output"]["bad"]["exit_code"], 3);
    assert_eq!(bb["ALL"]["output"]["bad"]["stderr"], "broken\n");
    assert_eq!(bb["ANY"]["status"], "success");
    assert_eq!(bb["ANY"]["succeeded"], json!(["ok"]));
    assert_eq!(bb["BEST"]["status"], "success");
    assert_eq!(bb["BEST"]["overall_success"], false);
    assert!(
        common::json::text(&bb["BEST"]["output"]["bad2"]["error"])
            .contains("is not present on this node"),
        "{}",
        bb["BEST"]
    );
    assert_eq!(bb["ALL_OK"]["status"], "success");
    assert_eq!(bb["ALL_OK"]["output"]["b"]["stdout"], "b\n");
    let events = cleanly_ended(&h, &id).await;
    // Every step ran once per state (no retries were needed: ALL_OK's retry policy is unused).
    assert_eq!(of_type(&events, "container_run_started").len(), 8);
}

#[tokio::test]
async fn subworkflows_block_or_fire_and_forget() {
    let h = harness(vec![]).await;
    h.deployed(WORKFLOWS, CHILD).await;
    h.deployed(
        WORKFLOWS,
        &workflow_manifest(
            "parent",
            "FIRE",
            "    FIRE:
      kind: Subworkflow
      workflow_id: child
      mode: fire_and_forget
      input:
        word: forgotten
      transitions:
        - {condition: on_success, target: BLOCK}
    BLOCK:
      kind: Subworkflow
      workflow_id: child
      mode: blocking
      result_key: waited
      input: '{\"word\": \"{{input.word}}\"}'
      transitions:
        - {condition: on_success, target: USE}
    USE:
      kind: System
      command: \"echo got {{waited.echoed}}\"
      transitions: []
",
        ),
    )
    .await;
    let id = h
        .workflow_started("parent", json!({"word": "awaited"}))
        .await;
    let e = h.workflow_ended(&id).await;
    assert_eq!(e["status"], "completed", "{e}");
    let bb = &e["blackboard"];
    assert_eq!(bb["FIRE"]["mode"], "fire_and_forget");
    assert_eq!(bb["BLOCK"]["child_status"], "completed");
    assert_eq!(bb["waited"]["echoed"], "child saw awaited");
    assert_eq!(bb["USE"]["stdout"], "got child saw awaited\n");
    let fired = bb["FIRE"]["child_execution_id"].as_str().unwrap();
    let fired = h.workflow_ended(fired).await;
    assert_eq!(fired["status"], "completed");
    assert_eq!(fired["parent_execution_id"], json!(id));
    assert_eq!(fired["blackboard"]["ECHO"]["stdout"], "child forgotten\n");
    let events = h.workflow_events(&id).await;
    assert_gap_free(&events);
    let children = of_type(&events, "child_started");
    assert_eq!(children.len(), 2, "{events:#?}");
    // The parent waited (no lease held) while the blocking child ran.
    assert!(of_type(&events, "child_finished").len() == 1);
}

#[tokio::test]
async fn cancel_stops_a_sleeping_container_and_the_child_workflow_running_it() {
    let h = harness(vec![]).await;
    h.deployed(
        WORKFLOWS,
        &workflow_manifest(
            "sleeper",
            "SLEEP",
            "    SLEEP:
      kind: ContainerRun
      name: nap
      image: aegis-runtime/busybox:1
      command: [\"sleep\", \"300\"]
      transitions: []
",
        ),
    )
    .await;
    h.deployed(
        WORKFLOWS,
        &workflow_manifest(
            "outer",
            "INNER",
            "    INNER:
      kind: Subworkflow
      workflow_id: sleeper
      mode: blocking
      result_key: r
      transitions: []
",
        ),
    )
    .await;
    let direct = h.workflow_started("sleeper", json!({})).await;
    let outer = h.workflow_started("outer", json!({})).await;
    // Both containers are up and sleeping.
    let deadline = Instant::now() + Duration::from_secs(60);
    let child = loop {
        let e = h.workflow_execution(&outer).await;
        let child = h
            .workflow_events(&outer)
            .await
            .iter()
            .find(|e| e["event_type"] == "child_started")
            .map(|e| e["payload"]["execution_id"].as_str().unwrap().to_owned());
        if let Some(child) = child {
            if containers_of(&child).len() == 1 && containers_of(&direct).len() == 1 {
                break child;
            }
        }
        assert!(Instant::now() < deadline, "containers never started: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for id in [&direct, &outer] {
        h.cancel_workflow(id, 200).await;
    }
    for id in [&direct, &outer, &child] {
        let e = h.workflow_ended(id).await;
        assert_eq!(e["status"], "cancelled", "{e}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(containers_of(&direct).is_empty() && containers_of(&child).is_empty()) {
        assert!(Instant::now() < deadline, "containers survived the cancel");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let events = h.workflow_events(&direct).await;
    assert_gap_free(&events);
    assert_eq!(events.last().unwrap()["event_type"], "execution_cancelled");
    assert_eq!(events.last().unwrap()["payload"]["removed"]["sandboxes"], 1);
    // Cancelling again says it has ended.
    h.cancel_workflow(&direct, 409).await;
}

#[tokio::test]
async fn cancel_stops_the_agent_execution_its_running_agent_state_started() {
    // The agent's model never answers, and the provider waits for it longer than this test
    // runs (the scripted provider's 2 s timeout would fail the execution first on a busy
    // machine): the state runs until it is cancelled.
    let h = node(vec![Step::Hang])
        .start_tuned(|config| {
            for provider in &mut config.llm.providers {
                provider.timeout_secs = 600;
                provider.max_retries = 0;
            }
        })
        .await;
    h.deployed("/v1/agents", &AgentManifest::new("stuck").yaml())
        .await;
    h.deployed(
        WORKFLOWS,
        &workflow_manifest(
            "waits-on-agent",
            "THINK",
            "    THINK:
      kind: Agent
      agent: stuck
      input: \"ponder\"
      transitions: []
",
        ),
    )
    .await;
    let run = h.workflow_started("waits-on-agent", json!({})).await;
    let listed = h
        .app
        .until(
            "/v1/executions",
            "the agent state's execution",
            Duration::from_secs(60),
            |l| {
                l.as_array().is_some_and(|l| {
                    l.iter()
                        .any(|e| e["agent_name"] == "stuck" && e["status"] == "running")
                })
            },
        )
        .await;
    let child = listed
        .as_array()
        .and_then(|l| l.iter().find(|e| e["agent_name"] == "stuck"))
        .and_then(|e| e["id"].as_str())
        .expect("the agent execution")
        .to_owned();
    h.cancel_workflow(&run, 200).await;
    assert_eq!(h.workflow_ended(&run).await["status"], "cancelled");
    // The state's clean-up found its agent execution by the workflow link and cancelled it.
    let events = h.workflow_events(&run).await;
    let removed = &events.last().unwrap()["payload"]["removed"];
    assert_eq!(removed["agent_executions"], json!([child]), "{removed}");
    let ended = h
        .app
        .until_ended(&format!("/v1/executions/{child}"), Duration::from_secs(60))
        .await;
    assert_eq!(ended["status"], "cancelled", "{ended}");
}

#[tokio::test]
async fn bad_runs_are_refused_and_nothing_is_stored() {
    let h = harness(vec![]).await;
    h.deployed(
        WORKFLOWS,
        "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: strict
  version: \"1.0.0\"
  input_schema:
    type: object
    required: [count]
    properties:
      count: {type: integer}
spec:
  initial_state: A
  states:
    A:
      kind: Agent
      agent: ghost
      input: \"{{input.count}}\"
      transitions: []
",
    )
    .await;
    let (status, body) = h
        .run_workflow("strict", json!({"input": {"count": "many"}}))
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap().contains("/count"), "{body}");
    let (status, body) = h
        .run_workflow(
            "strict",
            json!({"input": {"count": 1}, "blackboard": {"workflow": {}, "fine": 1}}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        common::json::text(&body["error"]).contains("reserved key(s) workflow"),
        "{body}"
    );
    let (status, body) = h
        .run_workflow("strict", json!({"input": {"count": 1}}))
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        common::json::text(&body["error"])
            .contains("spec.states.A.agent: agent `ghost` is not deployed"),
        "{body}"
    );
    let (status, _) = h.run_workflow("nope", json!({})).await;
    assert_eq!(status, 404);
    let r = h
        .app
        .response(Method::GET, "/v1/workflows/executions", None)
        .await;
    let list: Value = r.json().await.unwrap();
    assert_eq!(list["total"], 0, "{list}");
    let r = h
        .app
        .post_json(
            &format!("/v1/workflows/executions/{}/signal", uuid::Uuid::new_v4()),
            &json!({"response": "yes"}),
        )
        .await;
    assert_eq!(r.status(), 404);

    // Every workflow execution tool refuses bad arguments with the JSON pointer of the problem.
    let bad = [
        ("aegis.workflow.run", json!({"input": {}})),
        (
            "aegis.workflow.signal",
            json!({"execution_id": uuid::Uuid::new_v4()}),
        ),
        (
            "aegis.workflow.cancel",
            json!({"execution_id": "not-a-uuid"}),
        ),
        (
            "aegis.workflow.wait",
            json!({"execution_id": uuid::Uuid::new_v4(), "timeout_seconds": 0}),
        ),
        (
            "aegis.workflow.logs",
            json!({"execution_id": uuid::Uuid::new_v4(), "limit": 500}),
        ),
        ("aegis.workflow.status", json!({})),
        (
            "aegis.workflow.executions.list",
            json!({"status": "sleeping"}),
        ),
        ("aegis.workflow.executions.get", json!({"execution_id": 7})),
        (
            "aegis.workflow.remove",
            json!({"execution_id": uuid::Uuid::new_v4(), "force": true}),
        ),
    ];
    for (tool, args) in bad {
        let (status, out) = h.app.call_tool(tool, args.clone()).await;
        assert_eq!(status, 422, "{tool} {args}: {out}");
        assert_eq!(out["code"], "invalid_arguments", "{tool}: {out}");
    }
    // And answers well-formed calls about unknown executions with not_found.
    let (status, out) = h
        .app
        .call_tool(
            "aegis.workflow.status",
            json!({"execution_id": uuid::Uuid::new_v4()}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["isError"], true);
    assert_eq!(out["structuredContent"]["error"]["code"], "not_found");
}
