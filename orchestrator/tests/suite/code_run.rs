//! `code.run` and `code.contexts` on our own doors (issue 46): the code interpreter of a
//! `code-interpreter:1` sandbox, through the router. Over REST: state kept across calls, a
//! matplotlib figure as a PNG result, an exception with its traceback, a timeout that
//! interrupts while the context and its state survive, contexts made, used, listed and
//! removed, a cell of each other language the schema lists (Java's state, value, env vars and
//! exception; R, TypeScript, bash), a sandbox of another runtime told it has no interpreter.
//! Over MCP (raw JSON-RPC on `/mcp`, under a key bound to a context that lists the tools):
//! state across calls, a plot as MCP image content beside the text, a traceback; under a
//! context that lists programs, Java runs (the grant adds the kernels). Attacks: a bound key
//! whose security context does not list `code.run` is refused on REST, MCP and SEAL, each
//! refusal an audit row; another key's sandbox is "not found"; a JVM under a listed-programs
//! grant may start no other program. Over SEAL: state kept in the session's sandbox. In an
//! agent's loop (the scripted model): two calls sharing the kernel, the model reading a plot by
//! its size. Through another replica: the holder's server reached, started and used.

use reqwest::Method;
use serde_json::{json, Value};

use crate::common::sandbox::AgentSandbox as Sandbox;
use crate::common::{self, test_config, TestApp, TestDb};

/// The image the code interpreter runtime runs (built by runtime-images/build.sh).
const IMAGE: &str = "aegis-runtime/code-interpreter:1";

fn image_present() {
    let present = std::process::Command::new("docker")
        .args(["image", "inspect", IMAGE])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        present,
        "image {IMAGE} is missing: run runtime-images/build.sh --only code-interpreter"
    );
}

/// A runtime sandbox made by `key` over REST; its id.
async fn runtime_sandbox(app: &TestApp, key: &str, runtime: &str) -> String {
    let r = app
        .rest_as(key)
        .post_json("/v1/sandboxes", &json!({"runtime": runtime}))
        .await;
    let status = r.status();
    let body: Value = r.json().await.expect("json");
    assert_eq!(status, 201, "{body}");
    body["sandbox_id"].as_str().expect("sandbox_id").to_owned()
}

/// An operator key `name` on `app` and a code-interpreter sandbox it made; (key, sandbox id).
async fn interpreter_of(app: &TestApp, name: &str) -> (String, String) {
    image_present();
    let key = app.create_key(name, "operator").await;
    let id = runtime_sandbox(app, &key, "code-interpreter").await;
    (key, id)
}

/// The first `code.run` of `code` in a sandbox: it starts the server and prints `printed`;
/// its result.
async fn first_run(sb: &Sandbox, code: &str, printed: &str) -> Value {
    let first = run(sb, code).await;
    assert_eq!(first["server_started"], true, "{first}");
    assert_eq!(first["stdout"], printed, "{first}");
    first
}

/// Sandbox `id` through `app` for a new operator key `name`, not its owner: a `code.run` there
/// is not found.
async fn not_found_for_another_key(app: &TestApp, id: &str, name: &str) {
    let other = app.create_key(name, "operator").await;
    let theirs = Sandbox::with_key(app, id, &other);
    let (status, out) = theirs.call("code.run", json!({"code": "x"})).await;
    assert_eq!(status, 404, "{out}");
}

/// `code.run` of `code` in the sandbox, which must succeed as a call; its result.
async fn run(sb: &Sandbox, code: &str) -> Value {
    sb.ok("code.run", json!({"code": code})).await
}

/// `code.run` of `code` in `language` in the sandbox, which must succeed as a call; its result.
async fn run_in(sb: &Sandbox, language: &str, code: &str) -> Value {
    sb.ok("code.run", json!({"code": code, "language": language}))
        .await
}

/// A JavaScript context made in the sandbox (`code.contexts`); its id.
async fn javascript_context(sb: &Sandbox) -> String {
    let made = sb
        .ok(
            "code.contexts",
            json!({"action": "create", "language": "javascript"}),
        )
        .await;
    assert_eq!(made["context"]["language"], "javascript", "{made}");
    crate::common::json::string(&made["context"]["id"])
}

/// `code.run` of `code` in the context `context` of the sandbox, which must succeed as a call;
/// its result.
async fn run_in_context(sb: &Sandbox, context: &str, code: &str) -> Value {
    sb.ok("code.run", json!({"code": code, "context_id": context}))
        .await
}

/// The text of the main result of a `code.run` result.
fn main_text(out: &Value) -> Value {
    out["results"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["is_main_result"] == true))
        .map(|r| r["text"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn code_run_over_rest_keeps_state_plots_reports_tracebacks_and_survives_a_timeout() {
    let app = TestApp::spawn().await;
    let (key, id) = interpreter_of(&app, "code-user").await;
    let sb = Sandbox::with_key(&app, &id, &key);

    // The first call starts the server; state stays for the next.
    let first = first_run(&sb, "x = 41\nprint('set')", "set\n").await;
    assert_eq!(first["error"], Value::Null, "{first}");
    let second = run(&sb, "x + 1").await;
    assert_eq!(second["server_started"], false, "{second}");
    assert_eq!(main_text(&second), "42", "{second}");
    assert!(
        second["execution_count"].as_i64() > first["execution_count"].as_i64(),
        "{first} {second}"
    );

    // A figure without plt.show() is a PNG result (base64 of the PNG signature).
    let plot = run(
        &sb,
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')",
    )
    .await;
    let pngs = crate::common::json::present_strs(&plot["results"], "png");
    assert_eq!(pngs.len(), 1, "{plot}");
    assert!(
        pngs[0].starts_with("iVBORw0KGgo"),
        "a PNG: {}",
        &pngs[0][..16]
    );
    assert_eq!(plot["truncated"], false);

    // An exception: its name, value and traceback naming the frame.
    let failed = run(&sb, "def f():\n    raise ValueError('boom')\nf()").await;
    assert_eq!(failed["error"]["name"], "ValueError", "{failed}");
    assert_eq!(failed["error"]["value"], "boom", "{failed}");
    let traceback = failed["error"]["traceback"].as_str().expect("traceback");
    assert!(
        traceback.contains("f()") && traceback.contains("ValueError"),
        "{traceback}"
    );

    // A timeout interrupts the execution; the context and what it set survive.
    let slow = sb
        .ok(
            "code.run",
            json!({"code": "import time\ny = 7\ntime.sleep(120)", "timeout_secs": 2}),
        )
        .await;
    assert_eq!(slow["timed_out"], true, "{slow}");
    assert_eq!(slow["error"]["name"], "TimeoutError", "{slow}");
    let started = std::time::Instant::now();
    let after = run(&sb, "x + y").await;
    assert_eq!(main_text(&after), "48", "{after}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "the sleep was interrupted, not waited out: {:?}",
        started.elapsed()
    );

    // env_vars for one execution only.
    let env = sb
        .ok(
            "code.run",
            json!({"code": "import os\nprint(os.environ.get('GREETING'))", "env_vars": {"GREETING": "hi"}}),
        )
        .await;
    assert_eq!(env["stdout"], "hi\n", "{env}");
    let unset = run(&sb, "import os\nprint(os.environ.get('GREETING'))").await;
    assert_eq!(unset["stdout"], "None\n", "{unset}");

    // Contexts: a JavaScript one, apart from the default Python one; listed, then removed.
    let ctx = javascript_context(&sb).await;
    let js = run_in_context(&sb, &ctx, "let a = 6; a * 7").await;
    assert_eq!(main_text(&js), "42", "{js}");
    let listed = sb.ok("code.contexts", json!({"action": "list"})).await;
    let ids = crate::common::json::present_strs(&listed["contexts"], "id");
    assert!(ids.contains(&ctx.as_str()), "{listed}");
    sb.ok(
        "code.contexts",
        json!({"action": "remove", "context_id": ctx}),
    )
    .await;
    sb.tool_error(
        "code.run",
        json!({"code": "1", "context_id": ctx}),
        "not_found",
    )
    .await;
    sb.tool_error(
        "code.run",
        json!({"code": "1", "context_id": "abc", "language": "python"}),
        "invalid_arguments",
    )
    .await;
    // The schema refuses what no interpreter offers, before anything runs.
    sb.refused(
        "code.run",
        json!({"code": "1", "language": "cobol"}),
        422,
        "invalid_arguments",
    )
    .await;

    // Every language the schema lists runs. Java (a JVM running JShell): state across calls,
    // println on stdout, an expression's value, env_vars as system properties for one
    // execution, an exception by its class name.
    let java = run_in(
        &sb,
        "java",
        "int n = 6;\nSystem.out.println(\"hi\");\nn * 7",
    )
    .await;
    assert_eq!(java["stdout"], "hi\n", "{java}");
    assert_eq!(main_text(&java), "42", "{java}");
    let prop = sb
        .ok(
            "code.run",
            json!({"code": "System.getProperty(\"GREETING\", \"none\") + n", "language": "java",
                   "env_vars": {"GREETING": "hi"}}),
        )
        .await;
    assert_eq!(main_text(&prop), "hi6", "{prop}");
    let prop = run_in(
        &sb,
        "java",
        "System.getProperty(\"GREETING\", \"none\") + n",
    )
    .await;
    assert_eq!(main_text(&prop), "none6", "{prop}");
    let thrown = run_in(&sb, "java", "Integer.parseInt(\"x\")").await;
    assert_eq!(
        thrown["error"]["name"], "java.lang.NumberFormatException",
        "{thrown}"
    );
    for (language, code, text) in [
        ("r", "x <- c(1, 2, 3)\nsum(x)", "[1] 6"),
        ("typescript", "const t: number = 6 * 7; t", "42"),
    ] {
        let out = sb
            .ok("code.run", json!({"code": code, "language": language}))
            .await;
        assert_eq!(main_text(&out), text, "{language}: {out}");
    }
    let bash = run_in(&sb, "bash", "echo $((6 * 7))").await;
    assert_eq!(bash["stdout"], "42\n", "{bash}");

    // Audited: every call an intent and a completion with the result's digest.
    let rows: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT outcome, result_digest FROM audit_log WHERE action = 'code.run' AND outcome = 'ok'",
    )
    .fetch_all(&app.state.pool)
    .await
    .expect("audit rows");
    assert!(rows.len() >= 7, "{rows:?}");
    assert!(rows.iter().all(|(_, digest)| digest.is_some()), "{rows:?}");

    // Another key's sandbox is not found for this key.
    not_found_for_another_key(&app, &id, "code-other").await;
}

#[tokio::test]
async fn a_sandbox_without_the_interpreter_is_told_so() {
    let app = TestApp::spawn().await;
    let key = app.create_key("code-shell", "operator").await;
    let id = runtime_sandbox(&app, &key, "shell").await;
    let sb = Sandbox::with_key(&app, &id, &key);
    let out = sb
        .tool_error("code.run", json!({"code": "1+1"}), "no_interpreter")
        .await;
    let message = out["structuredContent"]["error"]["message"]
        .as_str()
        .expect("message");
    assert!(message.contains("code-interpreter"), "{message}");
}

#[tokio::test]
async fn code_run_reaches_a_sandbox_another_replica_holds() {
    use crate::common::replicas::{in_process, SECRET};

    let db = TestDb::create().await;
    let holder = TestApp::spawn_with(in_process(&db, Some(SECRET))).await;
    let other = TestApp::spawn_with(in_process(&db, Some(SECRET))).await;
    let (key, id) = interpreter_of(&holder, "code-remote").await;

    // Through the replica that does not hold it: the server is started there by the holder,
    // the state kept, a plot's PNG carried whole, a context made and used.
    let remote = Sandbox::with_key(&other, &id, &key);
    first_run(&remote, "x = 20\nprint('remote')", "remote\n").await;
    let here = Sandbox::with_key(&holder, &id, &key);
    let second = run(&here, "x * 2 + 2").await;
    assert_eq!(
        main_text(&second),
        "42",
        "the same kernel on the holder: {second}"
    );
    let plot = run(
        &remote,
        "import matplotlib.pyplot as plt\nplt.plot(range(50), [i * i for i in range(50)])",
    )
    .await;
    let png = plot["results"]
        .as_array()
        .and_then(|r| r.iter().find_map(|r| r["png"].as_str()))
        .expect("a PNG result");
    assert!(png.starts_with("iVBORw0KGgo"), "{}", &png[..16]);
    let context_id = javascript_context(&remote).await;
    let sum = "[1, 2, 3].map(n => n * 2).reduce((a, b) => a + b)";
    let js = run_in_context(&remote, &context_id, sum).await;
    assert_eq!(main_text(&js), "12", "{js}");

    // Another key through the same replica: not found, nothing run.
    not_found_for_another_key(&other, &id, "code-remote-other").await;
}

#[tokio::test]
async fn an_agent_runs_code_and_its_model_reads_plots_by_size() {
    use common::agent::AgentManifest;
    use common::fake_llm::{answer, tool_calls};
    use common::harness::{tool_decisions, Harness, AGENTS};

    image_present();
    let h = Harness::builder(vec![
        tool_calls(&[(
            "code__run",
            json!({"code": "import matplotlib.pyplot as plt\nvalues = [3, 1, 2]\nplt.bar(range(3), values)\nprint(sum(values))"}),
        )]),
        tool_calls(&[("code__run", json!({"code": "values[0] * 14"}))]),
        answer("done"),
    ])
    .ends_within(std::time::Duration::from_secs(180))
    .start()
    .await;
    let manifest = AgentManifest::new("analyst")
        .runtime("code-interpreter", "1")
        .instruction("Analyse the numbers.")
        .tools(&["code.run"])
        .yaml();
    h.deployed(AGENTS, &manifest).await;
    let (id, e) = h.run("analyst", json!({})).await;
    assert_eq!(e["status"], "completed", "{e}");

    // Both calls ran through the router, allowed, in the execution's own sandbox: the kernel
    // kept `values` from the first call to the second.
    let events = h.events(&id).await;
    let decided = tool_decisions(&events);
    assert_eq!(decided, [("code.run", "allowed"), ("code.run", "allowed")]);

    // What the model read: the stdout and the plot by its size, never the PNG's base64; then
    // the value the kept state gave.
    let requests = h.llm.requests();
    let tool_message = |request: &Value| {
        request["messages"]
            .as_array()
            .and_then(|m| m.iter().rev().find(|m| m["role"] == "tool"))
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let first = tool_message(&requests[1]);
    assert!(first.contains("<png image, "), "{first}");
    assert!(first.contains(r#""stdout":"6\n""#), "{first}");
    assert!(
        !first.contains("iVBORw0KGgo"),
        "the model never gets the image bytes: {first}"
    );
    let second = tool_message(&requests[2]);
    assert!(second.contains(r#""text":"42""#), "{second}");

    // The audit rows: the code's digest in, the result's digest out, as the execution.
    let rows: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT outcome, result_digest FROM audit_log WHERE action = 'code.run' \
         AND caller_kind = 'execution' AND caller_id = $1 AND outcome <> 'running' ORDER BY seq",
    )
    .bind(&id)
    .fetch_all(&h.app.state.pool)
    .await
    .expect("audit rows");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter().all(|(o, d)| o == "ok" && d.is_some()),
        "{rows:?}"
    );
}

/// A node with two contexts: `with` lists the code tools, `without` only cmd.run.
async fn app_with_contexts(with: &str, without: &str) -> (TestApp, TestDb) {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    let runtime = json!({"language": "code-interpreter", "version": "1"});
    config.seal.security_contexts = vec![
        json!({"name": with, "description": "may run code",
            "runtime": runtime,
            "capabilities": [{"tool_pattern": "code.*"}],
            "attestation": {"allow_unverified": true}}),
        json!({"name": without, "description": "may not run code",
            "runtime": runtime,
            "capabilities": [{"tool_pattern": "cmd.run", "command_allowlist": ["echo"]}],
            "attestation": {"allow_unverified": true}}),
    ];
    (TestApp::spawn_with(config).await, db)
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

/// A `tools/call` of `code.run` on an MCP session, waiting up to three minutes.
async fn first_call(app: &TestApp, key: &str, session: &str, arguments: Value) -> Value {
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(180))
        .build()
        .expect("client");
    let text = client
        .post(format!("{}/mcp", app.http_base))
        .bearer_auth(key)
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2025-11-25")
        .header("Mcp-Session-Id", session)
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "code.run", "arguments": arguments}}))
        .send()
        .await
        .expect("request sent")
        .text()
        .await
        .expect("an answer");
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("id").is_some())
        .unwrap_or_else(|| panic!("no JSON-RPC answer in {text}"))["result"]
        .clone()
}

#[tokio::test]
async fn code_run_over_mcp_keeps_state_and_returns_plots_as_image_content() {
    image_present();
    let (with, without) = (unique("code-mcp"), unique("code-none"));
    let (app, _db) = app_with_contexts(&with, &without).await;
    let (key, _) = app.create_bound_key("mcp-coder", "readonly", &with).await;
    let session = common::mcp::Session::open(&app, &key).await;
    let call = |code: &str| session.call("code.run", json!({"code": code}));

    // The first call makes the session's sandbox and starts its interpreter (seconds; more on
    // a loaded machine than the harness client's 30 s allow): sent with a longer wait.
    let set = first_call(&app, &key, &session.id, json!({"code": "x = 5"})).await;
    assert_eq!(set["isError"], false, "{set}");
    assert_eq!(set["structuredContent"]["server_started"], true, "{set}");
    let read = call("x * 2").await;
    assert_eq!(read["isError"], false, "{read}");
    assert_eq!(main_text(&read["structuredContent"]), "10", "{read}");
    let text = read["content"][0]["text"].as_str().expect("text");
    assert!(text.contains("10"), "{text}");

    let plot = call("import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 5])").await;
    let images: Vec<&Value> = crate::common::json::items(&plot["content"])
        .iter()
        .filter(|c| c["type"] == "image")
        .collect();
    assert_eq!(images.len(), 1, "{plot}");
    assert_eq!(images[0]["mimeType"], "image/png");
    assert!(
        images[0]["data"]
            .as_str()
            .is_some_and(|d| d.starts_with("iVBORw0KGgo")),
        "a base64 PNG"
    );
    assert_eq!(plot["content"][0]["type"], "text", "{plot}");

    let failed = call("1/0").await;
    assert_eq!(
        failed["isError"], false,
        "an exception is a result: {failed}"
    );
    assert_eq!(
        failed["structuredContent"]["error"]["name"], "ZeroDivisionError",
        "{failed}"
    );
    let text = failed["content"][0]["text"].as_str().expect("text");
    assert!(
        text.contains("ZeroDivisionError") && text.contains("1/0"),
        "{text}"
    );
}

#[tokio::test]
async fn code_run_over_seal_keeps_state_in_the_sessions_sandbox_and_another_context_is_refused() {
    use aegis_cli::seal_client::{SealClient, Transport};

    image_present();
    let (with, without) = (unique("seal-code-yes"), unique("seal-code-no"));
    let (app, _db) = app_with_contexts(&with, &without).await;
    let mut client = SealClient::new(Transport::Http(app.http_base.clone())).expect("client");
    client.attest("seal-coder", &with).await.expect("attested");
    // The session's sandbox runs the context's runtime; the first call starts its server.
    let first = client
        .call_tool("code.run", json!({"code": "x = 2 ** 10\nprint('kept')"}))
        .await
        .expect("answered");
    assert_eq!(first["isError"], false, "{first}");
    assert_eq!(first["structuredContent"]["stdout"], "kept\n", "{first}");
    let second = client
        .call_tool("code.run", json!({"code": "x + 0"}))
        .await
        .expect("answered");
    assert_eq!(main_text(&second["structuredContent"]), "1024", "{second}");

    // A session under the context that does not list code.run: refused, nothing run.
    let mut other = SealClient::new(Transport::Http(app.http_base.clone())).expect("client");
    other
        .attest("seal-no-coder", &without)
        .await
        .expect("attested");
    match other
        .call_tool("code.run", json!({"code": "open('/workspace/ran', 'w')"}))
        .await
    {
        Ok(answer) => assert_eq!(answer["isError"], true, "{answer}"),
        Err(refusal) => assert!(
            refusal.to_string().contains("code.run"),
            "the refusal names the tool: {refusal}"
        ),
    }
    let denied = app
        .count("SELECT count(*) FROM audit_log WHERE action = 'code.run' AND outcome = 'denied'")
        .await;
    assert_eq!(denied, 1, "the refusal is a denied row");
}

#[tokio::test]
async fn a_bound_key_whose_context_does_not_list_code_run_is_refused_and_audited() {
    let (with, without) = (unique("code-yes"), unique("code-no"));
    let (app, _db) = app_with_contexts(&with, &without).await;
    let (key, _) = app.create_bound_key("no-coder", "operator", &without).await;

    // REST: refused before any sandbox is looked at, whatever sandbox the call names.
    for sandbox in [None, Some(uuid::Uuid::new_v4().to_string())] {
        let call = json!({"name": "code.run", "arguments": {"code": "import os; os.system('id')"},
                "sandbox_id": sandbox});
        let r = app.rest_as(&key).post_json("/v1/tools/call", &call).await;
        let status = r.status().as_u16();
        let body: Value = r.json().await.expect("json");
        assert_eq!(status, 403, "{body}");
    }
    // MCP: not offered, and refused when called anyway.
    let session = common::mcp::Session::open(&app, &key).await;
    let (_, _, listed) = common::mcp::request(
        &app,
        Method::POST,
        &key,
        Some(&session.id),
        Some(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})),
    )
    .await;
    let names: Vec<String> = listed.expect("a listing")["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect();
    assert!(!names.iter().any(|n| n.starts_with("code.")), "{names:?}");
    session
        .tool_error("code.run", json!({"code": "print(1)"}))
        .await;
    for tool in ["code.run", "code.contexts"] {
        session
            .tool_error(tool, json!({"action": "list", "code": "1"}))
            .await;
    }

    // Every refusal left a denied row of the key.
    let denied = app
        .count("SELECT count(*) FROM audit_log WHERE action = 'code.run' AND outcome = 'denied'")
        .await;
    assert!(denied >= 4, "denied code.run rows: {denied}");
    // Nothing ran: no sandbox for this context's key was even made for code.run.
    let ran = app
        .count("SELECT count(*) FROM audit_log WHERE action = 'code.run' AND outcome = 'ok'")
        .await;
    assert_eq!(ran, 0);
}

#[tokio::test]
async fn java_runs_under_a_policy_that_lists_programs_and_starts_no_other() {
    image_present();
    let name = unique("code-java");
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    // The context lists one program for cmd.run: the interpreter's exec grant is that program
    // plus the kernels' (python3, node, java, bash), enforced by the kernel.
    config.seal.security_contexts = vec![json!({"name": name, "description": "code, echo",
        "runtime": {"language": "code-interpreter", "version": "1"},
        "capabilities": [{"tool_pattern": "code.*"},
                         {"tool_pattern": "cmd.run", "command_allowlist": ["echo"]}],
        "attestation": {"allow_unverified": true}})];
    let app = TestApp::spawn_with(config).await;
    let (key, _) = app.create_bound_key("java-coder", "readonly", &name).await;
    let session = common::mcp::Session::open(&app, &key).await;
    let first = first_call(
        &app,
        &key,
        &session.id,
        json!({"code": "int n = 6;\nn * 7", "language": "java"}),
    )
    .await;
    assert_eq!(first["isError"], false, "{first}");
    assert_eq!(main_text(&first["structuredContent"]), "42", "{first}");
    // The JVM may not start a program the grant does not list.
    let spawned = session
        .call(
            "code.run",
            json!({"code": "new ProcessBuilder(\"id\").start()", "language": "java"}),
        )
        .await;
    assert_eq!(
        spawned["structuredContent"]["error"]["name"], "java.io.IOException",
        "{spawned}"
    );
    let kept = session
        .call("code.run", json!({"code": "n", "language": "java"}))
        .await;
    assert_eq!(main_text(&kept["structuredContent"]), "6", "{kept}");
}
