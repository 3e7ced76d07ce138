//! The intent pipeline (`aegis.execute.intent|status|wait`) against the real service:
//! PostgreSQL, Docker sandboxes from the runtime images (aegis-runtime/python:3.11 and
//! aegis-runtime/shell:bookworm, built by runtime-images/build.sh), and the scripted model as the
//! writer agent. A draft that fails the syntax check or exits non-zero goes back to the writer
//! with the error; the result is the program's real output.

use crate::common;

use common::fake_llm::{answer, FakeLlm, Step};
use common::{test_config, TestApp, TestDb};
use serde_json::{json, Value};

async fn app_with(script: Vec<Step>) -> (TestApp, FakeLlm, TestDb) {
    let db = TestDb::create().await;
    let llm = FakeLlm::start(script).await;
    let mut config = test_config(&db.url);
    config.llm = llm.config();
    config.workflows.poll_interval_ms = 200;
    let app = TestApp::spawn_with(config).await;
    (app, llm, db)
}

fn require_image(image: &str) {
    let present = std::process::Command::new("docker")
        .args(["image", "inspect", image])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        present,
        "image {image} is missing: build it with runtime-images/build.sh (scripts/test.sh does)"
    );
}

/// Starts the intent pipeline with `arguments` (`aegis.execute.intent`) and waits up to 180 s
/// for its end (`aegis.execute.wait`); (the run's id, what the start said, what the wait said).
async fn intent_run(app: &TestApp, arguments: Value) -> (String, Value, Value) {
    let started = app.tool_ok("aegis.execute.intent", arguments).await;
    let id = started["pipeline_execution_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no pipeline id: {started}"))
        .to_owned();
    let waited = app
        .tool_ok(
            "aegis.execute.wait",
            json!({"execution_id": id, "timeout_seconds": 180}),
        )
        .await;
    (id, started, waited)
}

/// Every user message the writer agent received, in order.
fn writer_prompts(llm: &FakeLlm) -> Vec<String> {
    llm.requests()
        .iter()
        .map(|r| r["messages"].to_string())
        .collect()
}

#[tokio::test]
async fn an_intent_becomes_a_python_program_whose_syntax_error_is_fed_back_and_fixed() {
    require_image("aegis-runtime/python:3.11");
    let (app, llm, _db) = app_with(vec![
        // First draft: a syntax error (the parenthesis is never closed).
        answer("```python\nimport json, os\nn = json.loads(os.environ['AEGIS_INPUTS'])['n']\nprint('sum:', sum(range(1, n + 1))\n```"),
        // Second draft, after the checker's error was fed back; it also reports whether the
        // sandbox has any network interface besides loopback (it must not: no network).
        answer("```python\nimport json, os, socket\nn = json.loads(os.environ['AEGIS_INPUTS'])['n']\nnet = ','.join(sorted(name for _, name in socket.if_nameindex()))\nprint('sum:', sum(range(1, n + 1)), 'interfaces:', net)\n```"),
    ])
    .await;
    let (id, started, waited) = intent_run(
        &app,
        json!({"intent": "add up the numbers from 1 to n", "inputs": {"n": 10}}),
    )
    .await;
    assert_eq!(started["status"], "started");
    assert_eq!(waited["status"], "completed", "{waited}");
    let status = app
        .tool_ok("aegis.execute.status", json!({"pipeline_execution_id": id}))
        .await;
    assert_eq!(status["status"], "completed", "{status}");
    // The real output of the program, run in the python image.
    assert_eq!(
        status["final_result"], "sum: 55 interfaces: lo\n",
        "{status}"
    );
    assert_eq!(status["exit_code"], 0);
    assert_eq!(status["drafts"], 2);
    assert!(status["duration_ms"].as_i64().is_some());
    assert_eq!(
        waited["pipeline"]["final_result"],
        "sum: 55 interfaces: lo\n"
    );

    // The syntax check's error went back to the writer with its previous program.
    let prompts = writer_prompts(&llm);
    assert_eq!(prompts.len(), 2, "{prompts:?}");
    assert!(!prompts[0].contains("SyntaxError"));
    assert!(prompts[1].contains("SyntaxError"), "{}", prompts[1]);
    assert!(
        prompts[1].contains("syntax check rejected it"),
        "{}",
        prompts[1]
    );
    assert!(
        prompts[1].contains("sum(range(1, n + 1))"),
        "{}",
        prompts[1]
    );

    // It is an ordinary workflow execution of the built-in pipeline, in the caller's registry.
    let detail = app
        .tool_ok("aegis.workflow.executions.get", json!({"execution_id": id}))
        .await;
    assert_eq!(detail["execution"]["workflow"], "aegis-intent-pipeline");
    assert_eq!(detail["execution"]["visits"]["CHECK"], 2);
    assert_eq!(detail["execution"]["visits"]["RUN"], 1);
    let searched = app
        .tool_ok(
            "aegis.agent.search",
            json!({"query": "python program intent", "include_platform_templates": false}),
        )
        .await;
    assert_eq!(
        searched["total"], 0,
        "built-ins are platform templates: {searched}"
    );
}

#[tokio::test]
async fn a_bash_program_that_fails_at_run_time_is_rewritten_and_its_output_returned() {
    require_image("aegis-runtime/shell:bookworm");
    let (app, llm, _db) = app_with(vec![
        answer("```bash\necho 'no such thing' >&2\nexit 3\n```"),
        answer("```bash\nprintf 'hello from %s\\n' \"$(uname -s)\"\n```"),
    ])
    .await;
    let (_, _, waited) = intent_run(
        &app,
        json!({"intent": "greet from the kernel's name", "language": "bash", "timeout_seconds": 30}),
    )
    .await;
    assert_eq!(waited["pipeline"]["status"], "completed", "{waited}");
    assert_eq!(waited["pipeline"]["final_result"], "hello from Linux\n");
    let prompts = writer_prompts(&llm);
    assert_eq!(prompts.len(), 2);
    assert!(
        prompts[1].contains("exited with status 3"),
        "{}",
        prompts[1]
    );
    assert!(prompts[1].contains("no such thing"), "{}", prompts[1]);
}

#[tokio::test]
async fn the_loop_is_bounded_and_what_cannot_run_here_is_refused_with_the_reason() {
    require_image("aegis-runtime/shell:bookworm");
    // Every draft fails the syntax check: the writer is asked four times, then the run fails.
    let broken = "```bash\nif then fi\n```";
    let (app, llm, _db) = app_with(vec![
        answer(broken),
        answer(broken),
        answer(broken),
        answer(broken),
        answer(broken),
    ])
    .await;
    let (_, _, waited) = intent_run(
        &app,
        json!({"intent": "something impossible", "language": "bash"}),
    )
    .await;
    let pipeline = &waited["pipeline"];
    assert_eq!(pipeline["status"], "failed", "{waited}");
    assert_eq!(pipeline["failed_at_state"], "CHECK", "{pipeline}");
    assert!(
        common::json::text(&pipeline["reason"]).contains("max_state_visits"),
        "{pipeline}"
    );
    assert_eq!(llm.remaining(), 1, "four drafts, no more");

    // A language whose runtime this node lacks (no javascript image is built for the tests),
    // a persistent volume, another tenant: refused before anything starts.
    let javascript_present = std::process::Command::new("docker")
        .args([
            "images",
            "-q",
            "--filter",
            "label=org.aegis.runtime.language=javascript",
        ])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    if !javascript_present {
        let (_, out) = app
            .call_tool(
                "aegis.execute.intent",
                json!({"intent": "print 1", "language": "javascript"}),
            )
            .await;
        assert_eq!(out["isError"], true, "{out}");
        let error = &out["structuredContent"]["error"];
        assert_eq!(error["code"], "runtime_missing", "{out}");
        assert!(
            common::json::text(&error["message"]).contains("javascript"),
            "{out}"
        );
    }
    for (args, code) in [
        (
            json!({"intent": "print 1", "volume_id": "vol-1"}),
            "unsupported",
        ),
        (
            json!({"intent": "print 1", "tenant_id": "elsewhere"}),
            "forbidden",
        ),
    ] {
        let (_, out) = app.call_tool("aegis.execute.intent", args).await;
        assert_eq!(out["isError"], true, "{out}");
        assert_eq!(out["structuredContent"]["error"]["code"], code, "{out}");
    }
    let (status, out) = app
        .call_tool(
            "aegis.execute.intent",
            json!({"intent": "x", "language": "cobol"}),
        )
        .await;
    assert_eq!(status, 422, "{out}");
    // Status of something that is not a pipeline run: not found.
    let (_, out) = app
        .call_tool(
            "aegis.execute.status",
            json!({"pipeline_execution_id": uuid::Uuid::new_v4().to_string()}),
        )
        .await;
    assert_eq!(
        out["structuredContent"]["error"]["code"], "not_found",
        "{out}"
    );
}

#[tokio::test]
async fn the_shipped_definitions_deploy_once_and_are_restored_to_the_shipped_text_at_start() {
    let app = TestApp::spawn().await;
    let pool = &app.state.pool;
    // Nothing is deployed into a tenant before it needs the pipeline.
    assert_eq!(
        orchestrator::builtin::upgrade(pool).await.expect("upgrade"),
        0
    );
    let count = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM definition_versions v JOIN definitions d ON d.id = v.definition_id \
             WHERE d.name LIKE 'aegis-intent-%'",
        )
        .fetch_one(pool)
        .await
        .expect("count")
    };
    // Twice, and twice at once (two replicas): one version of each of the four definitions.
    orchestrator::builtin::ensure(pool, "default")
        .await
        .expect("ensure");
    let (a, b) = tokio::join!(
        orchestrator::builtin::ensure(pool, "default"),
        orchestrator::builtin::ensure(pool, "default")
    );
    a.expect("ensure");
    b.expect("ensure");
    assert_eq!(count().await, 4);

    // A version whose current text differs from the shipped one (a forced deploy of an edited
    // copy: its new revision) gets the shipped text back at the next start, as one more
    // revision; no deployed row is rewritten.
    let shipped = app.get_value("/v1/workflows/aegis-intent-pipeline").await;
    let mut edited = shipped["manifest"].clone();
    edited["metadata"]["labels"]["edited"] = json!("locally");
    let r = app
        .admin(reqwest::Method::POST, "/v1/workflows?force=true")
        .body(edited.to_string())
        .send()
        .await
        .expect("deploy");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    assert_eq!(
        orchestrator::builtin::upgrade(pool).await.expect("upgrade"),
        1
    );
    let current = app.get_value("/v1/workflows/aegis-intent-pipeline").await;
    assert_eq!(
        current["manifest_yaml"], shipped["manifest_yaml"],
        "{current}"
    );
    assert_eq!(current["revision"], 3, "{current}");
    assert_eq!(
        count().await,
        6,
        "two more revisions of one version, nothing rewritten"
    );

    // The built-ins are found by search unless platform templates are left out.
    let found = app
        .tool_ok("aegis.agent.search", json!({"query": "python program"}))
        .await;
    assert!(found.to_string().contains("aegis-intent-python"), "{found}");
    let without = app
        .tool_ok(
            "aegis.agent.search",
            json!({"query": "python program", "include_platform_templates": false}),
        )
        .await;
    assert_eq!(without["total"], 0, "{without}");
}
