//! The code interpreter (issue 46): an E2B sandbox of the template `code-interpreter-v1` is the
//! `code-interpreter` runtime with its server started by the create, which answers only once
//! the server's default contexts are ready. Driven from tests/python/code_interpreter_client.py
//! two ways: E2B's code-interpreter SDK (`e2b-code-interpreter`, unmodified) from outside, through
//! the node's port route; and from inside the sandbox (`commands.run` of a Python program doing
//! HTTP on the server's Unix socket, as a command without egress may not connect over TCP): state kept across calls, two contexts apart, a matplotlib
//! figure as PNG without `plt.show()`, a pandas DataFrame as HTML, an exception with its
//! traceback, stdout and stderr apart, env vars for one execution only, a context's cwd,
//! JavaScript, TypeScript, R, Java and bash contexts, a timed-out execution interrupted (the kernel and its state
//! survive), a context restarted, unknown languages and contexts refused, and the bound on
//! contexts per sandbox.

use serde_json::{json, Value};

use crate::common::{python_client, TestApp};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/python/code_interpreter_client.py"
);

/// Where scripts/test.sh installs E2B's code-interpreter SDK (with the `e2b` it needs).
fn sdk_dir() -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2b-ci-sdk");
    assert!(
        dir.join("e2b_code_interpreter").is_dir(),
        "e2b-code-interpreter is not installed in {} (scripts/test.sh installs it)",
        dir.display()
    );
    dir
}

async fn run_client(app: &TestApp, scenario: &str, key: &str) -> Value {
    // The from-inside scenario needs only the pinned `e2b`; the SDK one the code interpreter's.
    let sdk_dir = (scenario == "sdk").then(sdk_dir);
    let needs = "e2b and e2b-code-interpreter, which scripts/test.sh installs";
    python_client::run(python_client::Scenario {
        sdk_dir: sdk_dir.as_deref(),
        ..python_client::Scenario::on(app, SCRIPT, &[scenario], key, needs)
    })
    .await
}

#[tokio::test]
async fn a_code_interpreter_sandbox_serves_stateful_contexts_from_inside() {
    let app = TestApp::spawn().await;
    let key = app.create_key("ci-user", "operator").await;
    let report = run_client(&app, "inside", &key).await;
    let r = &report["inside"];

    // The create answered with the server ready and both default contexts made.
    assert_eq!(r["health"], json!([200, "\"OK\""]), "{r}");
    assert_eq!(
        r["listed_languages"],
        json!(["javascript", "python"]),
        "{r}"
    );
    assert_eq!(r["stateful"], json!(["42"]), "{r}");
    assert_eq!(r["counts"], json!([2]), "{r}");
    assert_eq!(
        r["apart"],
        json!([["NameError", "name 'x' is not defined"]]),
        "{r}"
    );
    assert_eq!(r["plot_pngs"], 1, "{r}");
    assert_eq!(r["plot_is_png"], true, "{r}");
    assert_eq!(r["dataframe_html"], true, "{r}");
    assert_eq!(r["error"], json!([["ValueError", "boom"]]), "{r}");
    assert_eq!(r["traceback_names_f"], true, "{r}");
    assert_eq!(r["streams"], json!(["out\n", "err\n"]), "{r}");
    assert_eq!(r["env_set"], json!(["bar"]), "{r}");
    assert_eq!(r["env_after"], json!(["unset"]), "{r}");
    assert_eq!(r["cwd"], json!(["/tmp", "/tmp"]), "{r}");
    assert_eq!(r["js"], json!(["from js\n", "42"]), "{r}");
    assert_eq!(r["js_error"], json!(["TypeError"]), "{r}");
    assert_eq!(r["bash"], "7 /tmp\n", "{r}");
    // The caller gave up after 3 s; the kernel was interrupted and kept its state.
    assert_eq!(r["timeout"], "timed_out", "{r}");
    assert_eq!(r["after_timeout"], json!(["42"]), "{r}");
    // A restarted context is a new kernel: its variables are gone.
    assert_eq!(r["restart"], 200, "{r}");
    assert_eq!(r["after_restart"], json!(["NameError"]), "{r}");
    assert_eq!(r["unknown_language"], 400, "{r}");
    assert_eq!(r["unknown_context"]["status"], 404, "{r}");
    // Eight contexts per sandbox: six were made above, two more bash ones fit, then 429.
    assert_eq!(r["context_bound"], json!([2, 429]), "{r}");
}

/// E2B's code-interpreter SDK, unmodified, from outside: `run_code` and the context calls reach
/// the server through the node's port route (`E2b-Sandbox-Id` + `E2b-Sandbox-Port: 49999`).
/// Prints the benchmark (create to first result, warm `run_code`, `commands.run` of python3).
#[tokio::test]
async fn the_code_interpreter_sdk_runs_code_unmodified() {
    let app = TestApp::spawn().await;
    let key = app.create_key("ci-sdk", "operator").await;
    let r = run_client(&app, "sdk", &key).await;
    eprintln!(
        "code interpreter benchmark: create to first result {} ms; warm run_code {}; commands.run python3 {}",
        r["create_to_first_result_ms"], r["warm_run_code"], r["commands_run_python"]
    );
    assert_eq!(r["first"], "2", "{r}");
    assert_eq!(r["stateful"], "42", "{r}");
    assert_eq!(
        r["apart"],
        json!(["NameError", "name 'x' is not defined"]),
        "{r}"
    );
    assert_eq!(r["plot_pngs"], 1, "{r}");
    assert_eq!(r["dataframe_html"], true, "{r}");
    assert_eq!(r["error"], json!(["ValueError", "boom", true]), "{r}");
    assert_eq!(
        r["callbacks"],
        json!({"stdout": ["out\n"], "stderr": ["err\n"], "result": ["7"], "error": []}),
        "{r}"
    );
    // Each kind of matplotlib figure comes back with its `chart` data beside the PNG.
    let c = &r["charts"];
    assert_eq!(
        c["line"],
        json!({"type": "line", "title": "Two lines", "x_unit": "s", "elements": [
            ["squares", [[0.0, 0.0], [1.0, 1.0], [2.0, 4.0]]],
            ["flat", [[0.0, 2.0], [1.0, 2.0], [2.0, 2.0]]]]}),
        "{r}"
    );
    assert_eq!(
        c["bar"],
        json!({"type": "bar", "title": "Three bars", "elements": [
            ["a", "counts", 3.0], ["b", "counts", 1.0], ["c", "counts", 2.0]]}),
        "{r}"
    );
    assert_eq!(
        c["scatter"],
        json!({"type": "scatter", "title": null, "x_unit": null, "elements": [
            ["dots", [[1.0, 4.0], [2.0, 3.0], [3.0, 2.0], [4.0, 1.0]]]]}),
        "{r}"
    );
    assert_eq!(
        c["pie"],
        json!({"type": "pie", "title": "Pie", "elements": [["big", 270.0], ["small", 90.0]]}),
        "{r}"
    );
    // 100 is beyond Q3 + 1.5 IQR: an outlier, and the upper whisker stops at 5.
    assert_eq!(
        c["box"],
        json!({"type": "box_and_whisker", "title": null, "elements": [
            ["one", 1.0, 2.25, 3.5, 4.75, 5.0, [100.0]]]}),
        "{r}"
    );
    assert_eq!(
        c["super"],
        json!({"type": "superchart", "title": "Both", "elements": ["line", "bar"]}),
        "{r}"
    );
    assert_eq!(
        c["unknown"],
        json!({"type": "unknown", "title": "Circle", "elements": []}),
        "{r}"
    );
    assert_eq!(r["dataframe_data"], json!({"a": {"0": 1, "1": 2}}), "{r}");
    assert_eq!(r["ts"], "42", "{r}");
    assert_eq!(r["r"], json!(["[1] 6", null]), "{r}");
    assert_eq!(r["js"], json!(["Hello, World!\n"]), "{r}");
    assert_eq!(r["bash"], json!(["42\n"]), "{r}");
    assert_eq!(
        r["java"],
        json!([
            ["Hello, World!", "\n"],
            "42",
            "bar",
            "unset",
            "java.lang.NumberFormatException",
            "TimeoutException",
            "6"
        ]),
        "{r}"
    );
    assert_eq!(r["timeout"], "TimeoutException", "{r}");
    assert_eq!(r["after_timeout"], "42", "{r}");
    // The two made at start, and the defaults made by the runs above.
    assert_eq!(
        r["contexts"],
        json!(["bash", "java", "javascript", "python", "r", "typescript"]),
        "{r}"
    );
    assert_eq!(r["restarted"], "1", "{r}");
    assert_eq!(r["removed"], true, "{r}");
    // Resumed from a pause: the server answers again (files kept, kernels new).
    assert_eq!(r["after_resume"], "kept", "{r}");
    assert_eq!(r["state_after_resume"], "NameError", "{r}");
}
