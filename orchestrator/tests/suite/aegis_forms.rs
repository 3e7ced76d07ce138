//! AEGIS users' own pipelines (issue 25, item 4): the older forms their manifests use, through
//! the running service. The older `semantic` validation is judged by the node's judge agent with
//! the model it names; `spec.type: user` is accepted and shown, `system` refused; `target: ~`
//! ends a run; schedules run in their IANA time zone with a jitter every replica computes alike;
//! operators map runtime versions with `sandbox.runtime_aliases`.
//!
//! `shapes::` validates our own manifests written in the shapes of the public AEGIS examples
//! (`tests/aegis-shapes/`, one per example) on a node configured like `config/compose.yaml`, in
//! process and with `orchestrator validate`, and prints how many pass.

use crate::common;
use crate::common::agent::AgentManifest;
use crate::common::workflow::workflow_manifest;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use common::fake_llm::{answer, FakeLlm};
use common::{test_config, TestApp, TestDb};
use orchestrator::llm::ModelRef;
use orchestrator::manifest::{Schedule, WorkflowView};
use reqwest::Method;
use serde_json::{json, Value};
use uuid::Uuid;

/// A node on its own database, its model the scripted server (aliases `default` and `judge`).
async fn app(
    llm: Option<&FakeLlm>,
    edit: impl FnOnce(&mut orchestrator::config::NodeConfig),
) -> TestApp {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    if let Some(llm) = llm {
        config.llm = llm.config();
        config.llm.models.insert(
            "judge".to_owned(),
            ModelRef {
                provider: "fake".into(),
                model: "scripted-judge".into(),
                temperature: None,
                max_tokens: None,
            },
        );
    }
    edit(&mut config);
    let mut app = TestApp::spawn_with(config).await;
    app.db = Some(db);
    app
}

/// Deploys a manifest; returns the status and the body.
async fn deploy(app: &TestApp, path: &str, manifest: &str) -> (u16, Value) {
    let r = app
        .admin(Method::POST, path)
        .body(manifest.to_owned())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn get(app: &TestApp, path: &str) -> Value {
    let r = app.response(Method::GET, path, None).await;
    assert_eq!(r.status(), 200, "{path}");
    r.json().await.unwrap()
}

/// Polls `path` until its `status` is terminal.
async fn ended(app: &TestApp, path: &str) -> Value {
    app.until_ended(path, Duration::from_secs(90)).await
}

// ---------------------------------------------------------------------------------------------
// The older `semantic` validation

// An agent in the older form: a model and a prompt judge it, no judge agent is named.
fn older_semantic() -> String {
    AgentManifest::new("tide-writer")
        .instruction("Explain the tides in two sentences.")
        .spec(
            "  execution:\n    mode: iterative\n    max_iterations: 3\n    validation:\n      \
             semantic:\n        enabled: true\n        model: judge\n        threshold: 0.8\n        \
             prompt: |\n          The explanation must name the moon.\n          {criteria}\n",
        )
        .yaml()
}

/// Deploys agent `manifest`, which must be accepted with a `normalised:` note that says
/// `says`; the answer.
async fn deployed_normalised(app: &TestApp, manifest: &str, says: &str) -> Value {
    let (status, body) = deploy(app, "/v1/agents", manifest).await;
    assert_eq!(status, 201, "{body}");
    let notes = body["warnings"].to_string();
    assert!(
        notes.contains("normalised:") && notes.contains(says),
        "{body}"
    );
    body
}

#[tokio::test]
async fn an_older_semantic_validation_is_judged_by_the_node_judge_with_its_model() {
    let llm = FakeLlm::start(vec![
        answer("The sea rises and falls."),
        answer("{\"score\": 0.3, \"confidence\": 0.9, \"reasoning\": \"the moon is missing\"}"),
        answer("The moon pulls the sea, so it rises and falls twice a day."),
        answer("{\"score\": 0.9, \"confidence\": 0.8, \"reasoning\": \"names the moon\"}"),
    ])
    .await;
    let app = app(Some(&llm), |_| {}).await;
    deployed_normalised(&app, &older_semantic(), "aegis-semantic-judge").await;
    let stored = get(&app, "/v1/agents/tide-writer").await;
    assert_eq!(
        stored["manifest"]["spec"]["execution"]["validation"],
        json!([{"type": "semantic", "judge_agent": "aegis-semantic-judge", "min_score": 0.8,
                "model": "judge",
                "criteria": "The explanation must name the moon.\n{criteria}\n"}])
    );
    // The node's judge is not there before it is needed.
    app.answered(Method::GET, "/v1/agents/aegis-semantic-judge", None, 404)
        .await;

    let id = app
        .started("/v1/agents/tide-writer/execute", json!({}))
        .await;
    let e = ended(&app, &format!("/v1/executions/{id}")).await;
    assert_eq!(e["status"], "completed", "{e}");
    assert_eq!(
        e["last_output"],
        "The moon pulls the sea, so it rises and falls twice a day."
    );
    let requests = llm.requests();
    assert_eq!(requests.len(), 4, "two answers, two judgements");
    // The judge was asked with the model the older form named, on the author's criteria and
    // the answer; its reasoning went back to the writer.
    for judged in [&requests[1], &requests[3]] {
        assert_eq!(judged["model"], "scripted-judge", "{judged}");
        assert!(
            judged.to_string().contains("must name the moon"),
            "{judged}"
        );
    }
    assert_eq!(requests[0]["model"], "scripted");
    assert!(requests[1].to_string().contains("The sea rises and falls."));
    assert!(requests[2].to_string().contains("the moon is missing"));
    // The judge is the node's built-in agent, deployed into the tenant when first needed.
    let judge = get(&app, "/v1/agents/aegis-semantic-judge").await;
    assert_eq!(judge["labels"]["aegis/builtin"], "true", "{judge}");
    let judged: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM executions WHERE parent_execution_id = $1::uuid \
         AND agent_name = 'aegis-semantic-judge' AND status = 'completed'",
    )
    .bind(&id)
    .fetch_one(&app.state.pool)
    .await
    .unwrap();
    assert_eq!(judged, 2);
}

#[tokio::test]
async fn an_older_semantic_validation_that_would_pass_unjudged_is_refused() {
    let app = app(None, |_| {}).await;
    let open = older_semantic().replace(
        "        threshold: 0.8\n",
        "        threshold: 0.8\n        fallback_on_unavailable: skip\n",
    );
    let (status, body) = deploy(&app, "/v1/agents", &open).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("never passes"), "{body}");
}

// ---------------------------------------------------------------------------------------------
// `spec.type`

fn typed() -> String {
    AgentManifest::new("greeter")
        .instruction("Greet the person named in the input.")
        .spec("  type: user\n")
        .yaml()
}

#[tokio::test]
async fn spec_type_user_is_stored_and_shown_and_system_is_refused() {
    let app = app(None, |_| {}).await;
    let (status, body) = deploy(&app, "/v1/agents", &typed()).await;
    assert_eq!(status, 201, "{body}");
    let untyped = typed()
        .replace("  type: user\n", "")
        .replace("name: greeter", "name: plain");
    let (status, body) = deploy(&app, "/v1/agents", &untyped).await;
    assert_eq!(status, 201, "{body}");

    let listed = app.tool_result("aegis.agent.list", json!({})).await;
    let types: BTreeMap<String, String> = common::json::items(&listed["agents"])
        .iter()
        .map(|a| {
            (
                a["name"].as_str().unwrap().to_owned(),
                a["type"].as_str().unwrap_or("(none)").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        types,
        BTreeMap::from([
            ("greeter".to_owned(), "user".to_owned()),
            ("plain".to_owned(), "user".to_owned())
        ])
    );
    let stored = get(&app, "/v1/agents/greeter").await;
    assert_eq!(stored["manifest"]["spec"]["type"], "user");
    let exported = app
        .tool_result("aegis.agent.export", json!({"name": "greeter"}))
        .await;
    assert!(
        common::json::text(&exported["manifest_yaml"]).contains("type: user"),
        "{exported}"
    );

    // The privileged tier AEGIS has is not a way to more rights here, on any door.
    let system = typed()
        .replace("type: user", "type: system")
        .replace("name: greeter", "name: root-greeter");
    let (status, body) = deploy(&app, "/v1/agents", &system).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("spec.security_context"), "{body}");
    let (status, out) = app
        .call_tool("aegis.agent.create", json!({"manifest_yaml": system}))
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["isError"], true, "{out}");
    let r = app
        .response(Method::GET, "/v1/agents/root-greeter", None)
        .await;
    assert_eq!(r.status(), 404, "nothing was stored");
}

// ---------------------------------------------------------------------------------------------
// `target: ~`

fn ends_on_null() -> String {
    workflow_manifest(
        "ends-on-null",
        "ASK",
        "    ASK:
      kind: Human
      prompt: Go on?
      transitions:
        - condition: input_equals_yes
          target: NOTE
        - condition: input_equals_no
          target: ~
    NOTE:
      kind: System
      command: update_blackboard
      update_blackboard: {note: \"went on\"}
      transitions:
        - condition: always
          target: ~  # the end, as AEGIS writes it
",
    )
}

#[tokio::test]
async fn a_transition_to_nothing_ends_the_run_completed() {
    let app = app(None, |_| {}).await;
    let (status, body) = deploy(&app, "/v1/workflows", &ends_on_null()).await;
    assert_eq!(status, 201, "{body}");
    let run = |answer: &'static str| {
        let app = &app;
        async move {
            let id = app
                .started("/v1/workflows/ends-on-null/run", json!({}))
                .await;
            let deadline = Instant::now() + Duration::from_secs(60);
            while get(app, &format!("/v1/workflows/executions/{id}")).await["status"] != "waiting" {
                assert!(Instant::now() < deadline, "never waited");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let r = app
                .post_json(
                    &format!("/v1/workflows/executions/{id}/signal"),
                    &json!({"response": answer}),
                )
                .await;
            assert!(r.status().is_success(), "{}", r.text().await.unwrap());
            let e = ended(app, &format!("/v1/workflows/executions/{id}")).await;
            let events = get(
                app,
                &format!("/v1/workflows/executions/{id}/events?limit=1000"),
            )
            .await;
            (e, events["events"].as_array().unwrap().clone())
        }
    };

    // Unconditional, after the last state.
    let (e, events) = run("yes").await;
    assert_eq!(e["status"], "completed", "{e}");
    let taken: Vec<&Value> = events
        .iter()
        .filter(|e| e["event_type"] == "transition_taken")
        .collect();
    assert_eq!(taken.len(), 2, "{events:?}");
    assert_eq!(taken[1]["payload"]["from"], "NOTE");
    assert!(taken[1]["payload"]["to"].is_null(), "{:?}", taken[1]);

    // Conditional: a `no` ends the run at the Human state; NOTE never runs.
    let (e, events) = run("no").await;
    assert_eq!(e["status"], "completed", "{e}");
    assert!(
        !events
            .iter()
            .any(|e| e["event_type"] == "state_entered" && e["state_name"] == "NOTE"),
        "{events:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// `default_schedule` with a time zone and a jitter

// Once a year, 09:00 in New York (14:00 UTC: 1 January is in winter), up to an hour late.
const YEARLY: &str = "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: new-year-note
  version: \"1.0.0\"
spec:
  initial_state: NOTE
  default_schedule:
    cron: \"0 9 1 1 *\"
    timezone: America/New_York
    jitter_seconds: 3600
  states:
    NOTE:
      kind: System
      command: update_blackboard
      update_blackboard: {note: \"happy new year\"}
      transitions: []
";

#[tokio::test]
async fn a_schedule_shows_its_next_run_in_its_time_zone_with_its_jitter() {
    let app = app(None, |_| {}).await;
    let (status, body) = deploy(&app, "/v1/workflows", YEARLY).await;
    assert_eq!(status, 201, "{body}");
    let before = Utc::now();
    let shown = get(&app, "/v1/workflows/new-year-note").await;
    let id = shown["id"].as_str().unwrap().to_owned();
    let schedule = &shown["schedule"];
    assert_eq!(schedule["timezone"], "America/New_York", "{shown}");
    assert_eq!(schedule["jitter_seconds"], 3600);

    // The tick: the coming 1 January, 09:00 EST = 14:00 UTC.
    let year = if before
        < format!("{}-01-01T14:00:00Z", before.format("%Y"))
            .parse::<DateTime<Utc>>()
            .unwrap()
    {
        before.format("%Y").to_string().parse::<i32>().unwrap()
    } else {
        before.format("%Y").to_string().parse::<i32>().unwrap() + 1
    };
    let tick: DateTime<Utc> = format!("{year}-01-01T14:00:00Z").parse().unwrap();
    let next_tick: DateTime<Utc> = schedule["next_tick"].as_str().unwrap().parse().unwrap();
    assert_eq!(next_tick, tick, "{schedule}");
    // Its run: the tick plus the delay derived from the workflow and the tick, as every
    // replica derives it.
    let plan = WorkflowView(&shown["manifest"])
        .default_schedule()
        .unwrap()
        .plan()
        .unwrap();
    let delay = plan.delay(&id, tick);
    assert!((0..=3600).contains(&delay.num_seconds()), "{delay}");
    let run_at: DateTime<Utc> = schedule["next_run_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(run_at, tick + delay, "{schedule}");

    // The tool shows the same.
    let listed = app.tool_result("aegis.workflow.list", json!({})).await;
    assert_eq!(listed["workflows"][0]["schedule"], *schedule);

    // A zone that is not one, and a jitter as long as the ticks' spacing, are refused.
    for (bad, says) in [
        ("timezone: America/New_York", "timezone: America/Gotham"),
        ("cron: \"0 9 1 1 *\"", "cron: \"0 * * * *\""),
    ] {
        let manifest = YEARLY.replace(bad, says).replace("new-year-note", "other");
        let (status, body) = deploy(&app, "/v1/workflows", &manifest).await;
        assert_eq!(status, 422, "{body}");
        let text = body.to_string();
        assert!(
            text.contains("IANA") || text.contains("must be shorter than the time between"),
            "{body}"
        );
    }
}

// Every 2 seconds, each run up to a second late.
const JITTERED: &str = "apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: jittered
  version: \"1.0.0\"
spec:
  initial_state: NOTE
  default_schedule:
    cron: \"*/2 * * * * *\"
    timezone: Asia/Kolkata
    jitter_seconds: 1
  states:
    NOTE:
      kind: System
      command: update_blackboard
      update_blackboard: {note: \"ran\"}
      transitions: []
";

#[tokio::test]
async fn two_replicas_start_each_jittered_tick_once_and_not_before_its_delay() {
    let db = TestDb::create().await;
    let pool = db.pool().await;
    let a = crate::workflow_schedule::replica(&db).await;
    let _b = crate::workflow_schedule::replica(&db).await;
    crate::workflow_schedule::run_ticks(&pool, (&a, &a), JITTERED, "jittered", 3).await;

    let (definition, manifest): (Uuid, Value) = sqlx::query_as(
        "SELECT d.id, v.manifest FROM definitions d JOIN definition_versions v \
         ON v.definition_id = d.id WHERE d.name = 'jittered'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let schedule: Schedule = WorkflowView(&manifest).default_schedule().unwrap();
    let plan = schedule.plan().unwrap();
    let ticks: Vec<(DateTime<Utc>, Uuid, DateTime<Utc>)> = sqlx::query_as(
        "SELECT t.tick, t.execution_id, e.created_at FROM workflow_schedule_ticks t \
         JOIN workflow_executions e ON e.id = t.execution_id ORDER BY t.tick",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(ticks.len() >= 3, "{ticks:?}");
    let runs = crate::common::count(
        &pool,
        "SELECT count(*) FROM workflow_executions WHERE workflow_name = 'jittered'",
    )
    .await;
    assert_eq!(runs as usize, ticks.len(), "one run per tick: {ticks:?}");
    for (tick, _, started) in &ticks {
        assert_eq!(tick.timestamp() % 2, 0, "a cron instant: {tick}");
        let due = *tick + plan.delay(&definition.to_string(), *tick);
        assert!(
            *started >= due,
            "the run of {tick} started at {started}, before its jittered time {due}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// `sandbox.runtime_aliases`

const PY310: &str = "apiVersion: 100monkeys.ai/v1
kind: Agent
metadata:
  name: old-python
  version: \"1.0.0\"
spec:
  runtime:
    language: python
    version: \"3.10\"
  task:
    instruction: Answer in one line.
";

#[tokio::test]
async fn a_runtime_the_operator_maps_is_deployed_as_the_installed_one() {
    let app = app(None, |c| {
        c.sandbox.runtime_aliases =
            BTreeMap::from([("python:3.10".to_owned(), "python:3.11".to_owned())]);
    })
    .await;
    deployed_normalised(&app, PY310, "sandbox.runtime_aliases").await;
    let stored = get(&app, "/v1/agents/old-python").await;
    assert_eq!(
        stored["manifest"]["spec"]["runtime"],
        json!({"language": "python", "version": "3.11"})
    );
    // A version nobody mapped is refused, saying what to write and what an operator can do.
    let (status, body) = deploy(
        &app,
        "/v1/agents",
        &PY310
            .replace("3.10", "3.9")
            .replace("old-python", "older-python"),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    let text = body.to_string();
    assert!(
        text.contains("version: \\\"3.11\\\"") && text.contains("runtime_aliases"),
        "{body}"
    );
}

// ---------------------------------------------------------------------------------------------
// The count

mod shapes {
    use super::*;
    use std::path::{Path, PathBuf};

    #[derive(serde::Deserialize)]
    struct Expected {
        mirrors: String,
        outcome: String,
        refusal: Option<String>,
        waits_for: Option<String>,
    }

    fn dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/aegis-shapes")
    }

    fn compose_config() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/compose.yaml")
    }

    fn expected() -> BTreeMap<String, Expected> {
        let text = std::fs::read_to_string(dir().join("expected.yaml")).unwrap();
        serde_yaml::from_str(&text).unwrap()
    }

    #[test]
    fn every_shape_gets_its_expected_outcome_on_a_compose_node() {
        let loaded = orchestrator::config::load(Some(&compose_config()), &[]).expect("config");
        let expected = expected();
        let mut files: Vec<String> = std::fs::read_dir(dir())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".yaml") && n != "expected.yaml")
            .collect();
        files.sort();
        assert_eq!(files.len(), 48, "one file per public example");
        assert_eq!(
            files,
            expected.keys().cloned().collect::<Vec<_>>(),
            "expected.yaml names every file"
        );
        let mut wrong = Vec::new();
        let mut passed = 0;
        let mut by_cause: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for file in &files {
            let want = &expected[file];
            assert!(!want.mirrors.is_empty());
            let text = std::fs::read_to_string(dir().join(file)).unwrap();
            let errors: Vec<String> =
                match orchestrator::tools::validate_offline(&text, &loaded.config) {
                    Ok((_, v)) => match v.manifest {
                        Ok(_) => Vec::new(),
                        Err(e) => {
                            e.0.iter()
                                .map(|e| format!("{}: {}", e.pointer, e.message))
                                .collect()
                        }
                    },
                    Err(e) => e.0.iter().map(|e| e.message.clone()).collect(),
                };
            match (want.outcome.as_str(), errors.is_empty()) {
                ("PASS", true) => passed += 1,
                ("FAIL", false) => {
                    let refusal = want.refusal.as_deref().unwrap_or_default();
                    if !errors.iter().any(|e| e.contains(refusal)) {
                        wrong.push(format!(
                            "{file}: refused, but not with `{refusal}`: {errors:?}"
                        ));
                    }
                    let cause = match &want.waits_for {
                        Some(feature) => format!("waits for {feature}"),
                        None => format!("refused for good: {refusal}"),
                    };
                    by_cause.entry(cause).or_default().push(file);
                }
                (want, _) => wrong.push(format!("{file}: expected {want}, got {errors:?}")),
            }
        }
        println!(
            "AEGIS example shapes: {passed} of {} validate on a compose node",
            files.len()
        );
        for (cause, files) in &by_cause {
            println!("  {} {cause}: {}", files.len(), files.join(", "));
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn orchestrator_validate_gives_the_same_answers() {
        let expected = expected();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"));
        command
            .arg("--config")
            .arg(compose_config())
            .arg("validate");
        for file in expected.keys() {
            command.arg(dir().join(file));
        }
        let out = command.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let fails = expected.values().filter(|e| e.outcome == "FAIL").count();
        assert_eq!(out.status.success(), fails == 0, "{stdout}");
        for (file, want) in &expected {
            let line = stdout
                .lines()
                .find(|l| l.contains(&format!("/{file} (")))
                .unwrap_or_else(|| panic!("no line for {file}: {stdout}"));
            assert!(line.starts_with(&want.outcome), "{line}");
        }
        assert!(
            stdout.contains(&format!("{} of 48 valid", 48 - fails)),
            "{stdout}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// `{{workflow.KEY}}`: the run's input under `workflow`, as AEGIS spreads it

/// A workflow `name` of one System state, `NOTE`, that writes `note` (a template) to the
/// blackboard key `note`.
fn writes_a_note(name: &str, note: &str) -> String {
    let state = format!(
        "    NOTE:
      kind: System
      command: update_blackboard
      update_blackboard: {{note: \"{note}\"}}
      transitions: []
"
    );
    workflow_manifest(name, "NOTE", &state)
}

fn reads_workflow_task() -> String {
    writes_a_note(
        "reads-workflow-task",
        "{{workflow.task}} in {{workflow.name}}",
    )
}

#[tokio::test]
async fn input_keys_are_read_under_workflow_and_the_runs_own_facts_win() {
    let app = app(None, |_| {}).await;
    let (status, body) = deploy(&app, "/v1/workflows", &reads_workflow_task()).await;
    assert_eq!(status, 201, "{body}");
    let id = app
        .started(
            "/v1/workflows/reads-workflow-task/run",
            json!({"task": "ship the fix", "name": "an input key"}),
        )
        .await;
    let e = ended(&app, &format!("/v1/workflows/executions/{id}")).await;
    assert_eq!(e["status"], "completed", "{e}");
    assert_eq!(
        e["blackboard"]["note"], "ship the fix in reads-workflow-task",
        "{e}"
    );
    assert_eq!(e["blackboard"]["workflow"]["input"]["task"], "ship the fix");
}

// ---------------------------------------------------------------------------------------------
// `{{blackboard.KEY}}` that nothing writes: the caller puts it on the blackboard when it starts

fn reads_caller_key() -> String {
    writes_a_note("reads-caller-key", "task: {{blackboard.task}}")
}

#[tokio::test]
async fn a_blackboard_key_nothing_writes_is_a_note_at_deploy_and_required_of_every_run() {
    let app = app(None, |_| {}).await;
    let (status, body) = deploy(&app, "/v1/workflows", &reads_caller_key()).await;
    assert_eq!(status, 201, "{body}");
    let warnings = body["warnings"].to_string();
    assert!(
        warnings.contains("blackboard key `task`") && warnings.contains("blackboard override"),
        "the deploy says the run must supply it: {body}"
    );
    // Without the key: refused before anything is stored, naming the key and how to give it.
    let r = app
        .post_json("/v1/workflows/reads-caller-key/run", &json!({"input": {}}))
        .await;
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert!(status.is_client_error(), "{status} {body}");
    assert!(body.to_string().contains("blackboard key `task`"), "{body}");
    let listed = app.get_value("/v1/workflows/executions").await;
    assert!(
        !listed.to_string().contains("reads-caller-key"),
        "a refused run leaves no row: {listed}"
    );
    // With it: the template reads the caller's value.
    let (_, body) = app
        .send_json(
            Method::POST,
            "/v1/workflows/reads-caller-key/run",
            Some(json!({"input": {}, "blackboard": {"task": "tidy the docs"}})),
        )
        .await;
    let id = body["execution_id"].as_str().expect("a run").to_owned();
    let e = ended(&app, &format!("/v1/workflows/executions/{id}")).await;
    assert_eq!(e["status"], "completed", "{e}");
    assert_eq!(e["blackboard"]["note"], "task: tidy the docs", "{e}");
}
