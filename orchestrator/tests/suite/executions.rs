//! Agent executions with a scripted language model (tests/suite/common/fake_llm.rs): the model's tool
//! calls run through the router in the execution's own sandbox; limits, cancellation, provider
//! failures and input validation behave as documented; every step is in the event log.

use crate::common;

use std::time::{Duration, Instant};

use common::agent::AgentManifest;
use common::fake_llm::{answer, tool_calls, Step};
use common::harness::{of_type, tool_decisions, Harness, AGENTS};
use reqwest::Method;
use serde_json::{json, Value};

/// An agent that computes in its sandbox with the file tools and `cmd.run`; `extra_spec` is
/// more of its `spec`.
fn worker(name: &str, extra_spec: &str) -> String {
    AgentManifest::new(name)
        .instruction("Compute things in the sandbox.")
        .task("    prompt_template: \"{{instruction}} Input: {{input.topic}}\"\n")
        .spec(
            "  tools: [fs.write, fs.read, fs.list, cmd.run]
  builtin_dispatchers:
    - name: cmd
      capabilities:
        - name: cmd.run
          subcommand_allowlist: [sh, sleep, cat, echo]
",
        )
        .spec(extra_spec)
        .yaml()
}

async fn harness(script: Vec<Step>) -> Harness {
    Harness::start(script).await
}

/// A node whose scripted model has `sleep seconds` run and then never answers, and agent
/// `name` (with `extra` under `spec`) on it, started; (the node, the execution's id).
async fn sleeping(name: &str, seconds: u32, extra: &str) -> (Harness, String) {
    let h = harness(vec![
        tool_calls(&[("cmd__run", json!({"command": format!("sleep {seconds}")}))]),
        answer("never"),
    ])
    .await;
    h.deployed(AGENTS, &worker(name, extra)).await;
    let id = h.started(name, json!({"input": {}})).await;
    (h, id)
}

fn containers_of(execution: &str) -> usize {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=org.aegis.owner-id={execution}"),
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[tokio::test]
async fn an_agent_writes_runs_and_reads_in_its_sandbox_then_completes() {
    let h = harness(vec![
        tool_calls(&[("fs__write", json!({"path": "/workspace/run.sh", "content": "echo computed > /workspace/result.txt\n"}))]),
        tool_calls(&[("cmd__run", json!({"command": "sh /workspace/run.sh"}))]),
        tool_calls(&[("fs__read", json!({"path": "/workspace/result.txt"}))]),
        answer("computed"),
    ])
    .await;
    h.deployed(AGENTS, &worker("worker", "")).await;
    let (status, body) = h.execute("worker", json!({"topic": "arithmetic"})).await;
    assert_eq!(status, 201, "{body}");
    let id = body["execution_id"].as_str().unwrap().to_owned();
    let e = h.wait_end(&id, Duration::from_secs(60)).await;
    assert_eq!(e["status"], "completed", "{e}");
    assert_eq!(e["last_output"], "computed");

    let events = h.events(&id).await;
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as i64).collect::<Vec<_>>(),
        "gap-free sequence"
    );
    let calls = of_type(&events, "tool_call");
    let tools: Vec<&str> = calls
        .iter()
        .map(|c| c["payload"]["tool"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["fs.write", "cmd.run", "fs.read"]);
    assert!(calls.iter().all(
        |c| c["payload"]["decision"] == "allowed" && c["payload"]["result_digest"].is_string()
    ));
    assert_eq!(of_type(&events, "llm_call").len(), 4);
    assert!(of_type(&events, "llm_call")[0]["payload"]["prompt_tokens"].is_number());
    assert_eq!(of_type(&events, "sandbox_created").len(), 1);
    assert_eq!(of_type(&events, "sandbox_destroyed").len(), 1);
    assert_eq!(of_type(&events, "console_output").len(), 1);
    assert_eq!(events.last().unwrap()["event_type"], "execution_completed");
    assert_eq!(containers_of(&id), 0, "the sandbox is gone");

    // The same log as Server-Sent Events: every event, then `end` (the stream closes itself).
    let r = h
        .app
        .response(
            Method::GET,
            &format!("/v1/executions/{id}/events?follow=true"),
            None,
        )
        .await;
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let sse = tokio::time::timeout(Duration::from_secs(20), r.text())
        .await
        .expect("the stream ends")
        .unwrap();
    assert!(
        sse.contains("event: events") && sse.contains("execution_completed"),
        "{sse}"
    );
    assert!(
        sse.trim_end().ends_with("data: {}") && sse.contains("event: end"),
        "{sse}"
    );

    // What the model saw: the rendered prompt, dotted tool names mapped, the tool results.
    let requests = h.llm.requests();
    assert_eq!(requests.len(), 4);
    let first = requests[0].to_string();
    assert!(
        first.contains("Compute things in the sandbox. Input: arithmetic"),
        "{first}"
    );
    assert!(
        first.contains("fs__read") && !first.contains("\"fs.read\""),
        "{first}"
    );
    let last = requests[3]["messages"].as_array().unwrap();
    let tool_msg = last.iter().rev().find(|m| m["role"] == "tool").unwrap();
    assert!(
        tool_msg["content"].as_str().unwrap().contains("computed"),
        "{tool_msg}"
    );
    // Tool calls are audited under the execution.
    let audited = "SELECT count(*) FROM audit_log WHERE caller_kind = 'execution' \
                   AND caller_id = $1 AND outcome <> 'running'";
    h.app.assert_counts(audited, &id, 3).await;
}

#[tokio::test]
async fn a_batch_of_tool_calls_runs_in_order_and_a_refusal_is_fed_back() {
    let h = harness(vec![
        tool_calls(&[
            ("fs__write", json!({"path": "/workspace/a", "content": "1"})),
            ("cmd__run", json!({"command": "rm -rf /workspace"})),
            ("fs__write", json!({"path": "/workspace/b", "content": "2"})),
            ("fs__list", json!({"path": "/workspace"})),
        ]),
        answer("listed"),
    ])
    .await;
    h.deployed(AGENTS, &worker("batcher", "")).await;
    let id = h.started("batcher", json!({"input": {}})).await;
    let e = h.wait_end(&id, Duration::from_secs(60)).await;
    assert_eq!(e["status"], "completed", "{e}");
    let events = h.events(&id).await;
    let seen = tool_decisions(&events);
    assert_eq!(
        seen,
        [
            ("fs.write", "allowed"),
            ("cmd.run", "denied"),
            ("fs.write", "allowed"),
            ("fs.list", "allowed")
        ]
    );
    let second = &h.llm.requests()[1];
    let tool_messages: Vec<&Value> = common::json::items(&second["messages"])
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(
        tool_messages.len(),
        4,
        "every call of the batch got an answer"
    );
    let ids: Vec<&str> = tool_messages
        .iter()
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["call_1", "call_2", "call_3", "call_4"]);
    assert!(
        common::json::text(&tool_messages[1]["content"]).contains("refused"),
        "{}",
        tool_messages[1]
    );
    assert!(
        common::json::text(&tool_messages[3]["content"]).contains("\"b\""),
        "the listing saw both files"
    );
}

#[tokio::test]
async fn validation_failures_iterate_until_max_iterations() {
    let h = harness(vec![answer("nope"), answer("still nope")]).await;
    let extra = "  execution:\n    mode: iterative\n    max_iterations: 2\n    validation:\n      - type: regex\n        pattern: \"^DONE$\"\n";
    h.deployed(AGENTS, &worker("picky", extra)).await;
    let id = h.started("picky", json!({"input": {}})).await;
    let e = h.wait_end(&id, Duration::from_secs(60)).await;
    assert_eq!(e["status"], "failed", "{e}");
    assert!(
        common::json::text(&e["last_error"]).contains("maximum iterations"),
        "{e}"
    );
    assert_eq!(e["iteration_count"], 2);
    let events = h.events(&id).await;
    assert_eq!(of_type(&events, "validation").len(), 2);
    let second = h.llm.requests()[1].to_string();
    assert!(
        second.contains("Previous attempts") && second.contains("does not match"),
        "{second}"
    );
}

#[tokio::test]
async fn the_whole_execution_times_out_and_its_sandbox_goes() {
    let extra = "  security:\n    resources:\n      timeout: 3s\n";
    let (h, id) = sleeping("slow", 30, extra).await;
    let e = h.wait_end(&id, Duration::from_secs(60)).await;
    assert_eq!(e["status"], "timed_out", "{e}");
    assert_eq!(containers_of(&id), 0);
    assert_eq!(
        h.events(&id).await.last().unwrap()["event_type"],
        "execution_timed_out"
    );
}

#[tokio::test]
async fn cancel_while_a_command_runs_kills_it_and_removes_the_sandbox() {
    let (h, id) = sleeping("sleeper", 60, "").await;
    // Wait until the command is running in the sandbox.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if of_type(&h.events(&id).await, "llm_call").len() == 1 && containers_of(&id) == 1 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            break;
        }
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.app.cancel_execution(&id, 200).await;
    let e = h.wait_end(&id, Duration::from_secs(30)).await;
    assert_eq!(e["status"], "cancelled", "{e}");
    assert_eq!(
        containers_of(&id),
        0,
        "the sandbox (and the sleep in it) is gone"
    );
    let r = h
        .app
        .response(Method::POST, &format!("/v1/executions/{id}/cancel"), None)
        .await;
    assert_eq!(
        r.status(),
        409,
        "cancelling an ended execution is a conflict"
    );
    h.app
        .answered(Method::DELETE, &format!("/v1/executions/{id}"), None, 200)
        .await;
    h.app
        .answered(Method::GET, &format!("/v1/executions/{id}"), None, 404)
        .await;
}

#[tokio::test]
async fn input_that_fails_the_schema_starts_nothing() {
    let h = harness(vec![]).await;
    let extra = "  input_schema:\n    type: object\n    required: [topic]\n    properties:\n      topic: {type: string}\n";
    h.deployed(AGENTS, &worker("strict", extra)).await;
    let (status, body) = h.execute("strict", json!({"topic": 5})).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap().contains("topic"), "{body}");
    let rows = h.app.count("SELECT count(*) FROM executions").await;
    assert_eq!(rows, 0);
    assert!(h.llm.requests().is_empty());
}

#[tokio::test]
async fn a_provider_that_fails_then_recovers_and_one_that_never_answers() {
    let h = harness(vec![
        Step::Status(500, json!({"error": "boom"})),
        Step::Status(503, json!({"error": "busy"})),
        answer("fine"),
    ])
    .await;
    let plain = &AgentManifest::new("plain").instruction("Say fine.").yaml();
    h.deployed(AGENTS, plain).await;
    let id = h.started("plain", json!({"input": {}})).await;
    let e = h.wait_end(&id, Duration::from_secs(60)).await;
    assert_eq!(e["status"], "completed", "{e}");
    assert_eq!(
        of_type(&h.events(&id).await, "llm_call")[0]["payload"]["attempts"],
        3
    );

    let hang = harness(vec![
        Step::Hang,
        Step::Hang,
        Step::Hang,
        Step::Hang,
        Step::Hang,
    ])
    .await;
    hang.deployed(AGENTS, plain).await;
    let (_, body) = hang.execute("plain", json!({})).await;
    let id = body["execution_id"].as_str().unwrap().to_owned();
    let e = hang.wait_end(&id, Duration::from_secs(90)).await;
    assert_eq!(e["status"], "failed", "{e}");
    assert!(
        e["last_error"].as_str().unwrap().contains("provider"),
        "{e}"
    );
}

#[tokio::test]
async fn task_tools_and_a_seal_session_start_executions_too() {
    let h = Harness::builder(vec![answer("one"), answer("two")])
        .start_tuned(|config| {
            config.seal.security_contexts = vec![json!({"name": "runner", "description": "may run agents",
                "capabilities": [{"tool_pattern": "aegis.task.*"}], "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}})];
        })
        .await;
    let app = &h.app;
    h.deployed(AGENTS, &AgentManifest::new("plain").yaml())
        .await;

    let (_, out) = app
        .call_tool(
            "aegis.task.execute",
            json!({"agent_id": "plain", "input": {}}),
        )
        .await;
    let id = out["structuredContent"]["execution_id"]
        .as_str()
        .expect("started")
        .to_owned();
    let (_, waited) = app
        .call_tool(
            "aegis.task.wait",
            json!({"execution_id": id, "timeout_seconds": 30}),
        )
        .await;
    assert_eq!(
        waited["structuredContent"]["status"], "completed",
        "{waited}"
    );
    let (_, logs) = app
        .call_tool("aegis.task.logs", json!({"execution_id": id, "limit": 2}))
        .await;
    assert_eq!(
        logs["structuredContent"]["events"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let (_, listed) = app.call_tool("aegis.task.list", json!({})).await;
    assert_eq!(listed["structuredContent"]["total"], 1);
    let (_, status) = app
        .call_tool("aegis.task.status", json!({"execution_id": id}))
        .await;
    assert_eq!(status["structuredContent"]["last_output"], "one");
    let (_, removed) = app
        .call_tool("aegis.task.remove", json!({"execution_id": id}))
        .await;
    assert_eq!(removed["structuredContent"]["removed"], true, "{removed}");

    let mut client = aegis_cli::seal_client::SealClient::new(
        aegis_cli::seal_client::Transport::Http(app.http_base.clone()),
    )
    .unwrap();
    client.attest("test-runner", "runner").await.unwrap();
    let id = common::refusal::seal_started(&client, "plain").await;
    let waited = client
        .call_tool(
            "aegis.task.wait",
            json!({"execution_id": id, "timeout_seconds": 30}),
        )
        .await
        .unwrap();
    assert_eq!(
        waited["structuredContent"]["status"], "completed",
        "{waited}"
    );
    assert_eq!(waited["structuredContent"]["last_output"], "two");
}

#[tokio::test]
async fn a_semantic_validator_runs_the_judge_as_a_child_execution() {
    let h = harness(vec![
        answer("draft"),
        answer("{\"score\": 0.2, \"confidence\": 0.9, \"reasoning\": \"too short\"}"),
        answer("a much better answer"),
        answer("Verdict: {\"score\": 0.9, \"confidence\": 0.8, \"reasoning\": \"good\"}"),
    ])
    .await;
    let judge = AgentManifest::new("judge")
        .instruction(
            "Judge the output against the criteria; answer JSON {score, confidence, reasoning}.",
        )
        .yaml();
    h.deployed(AGENTS, &judge).await;
    let extra = "  execution:\n    mode: iterative\n    max_iterations: 3\n    validation:\n      - type: semantic\n        judge_agent: judge\n        criteria: The answer is thorough.\n        min_score: 0.8\n";
    h.deployed(AGENTS, &worker("writer", extra)).await;
    let id = h.started("writer", json!({"input": {}})).await;
    let e = h.wait_end(&id, Duration::from_secs(60)).await;
    assert_eq!(e["status"], "completed", "{e}");
    assert_eq!(e["last_output"], "a much better answer");
    let events = h.events(&id).await;
    assert_eq!(of_type(&events, "child_execution_started").len(), 2);
    let third = h.llm.requests()[2].to_string();
    assert!(
        third.contains("too short"),
        "the judge's reasoning is fed back: {third}"
    );
    let judge_input = h.llm.requests()[1].to_string();
    assert!(
        judge_input.contains("draft") && judge_input.contains("thorough"),
        "{judge_input}"
    );
    // The judges are child executions of the writer.
    let children: i64 = h.app
        .one(
            "SELECT count(*) FROM executions WHERE parent_execution_id = $1::uuid AND status = 'completed'",
            &id,
        )
        .await;
    assert_eq!(children, 2);
}
