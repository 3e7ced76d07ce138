//! Issue 48: the operator console at `/console`. A real browser (Debian's chromium through
//! chromium-driver and Selenium, `tests/python/console_browser.py`) signs in, finds a sandbox
//! made through REST and its `cmd.run` in the audit page, watches a workflow run advance live
//! to completion, fails to approve its own waiting call and approves it as a second key,
//! verifies the chain; screenshots of each page go to `target/console-screenshots/`. Plain HTTP
//! checks the session and form-token rules, and a source check holds that the console reaches
//! data only through the REST router.

use crate::common;
use crate::common::workflow::{end_state, workflow_manifest};

use std::time::Duration;

use common::{test_config, TestApp, TestDb, TEST_ADMIN_KEY};
use reqwest::{redirect, Method, StatusCode};
use serde_json::{json, Value};

fn workflow() -> String {
    let steps = "    FIRST:
      kind: System
      command: \"sleep 2\"
      transitions:
        - condition: on_success
          target: SECOND
    SECOND:
      kind: System
      command: \"sleep 2\"
      transitions:
        - condition: on_success
          target: DONE
";
    let states = format!("{steps}{}", end_state("DONE", "echo done"));
    workflow_manifest("console-steps", "FIRST", &states)
}

async fn app(db: &TestDb) -> TestApp {
    let mut config = test_config(&db.url);
    config.workflows.system_image = Some("aegis-runtime/busybox:1".to_owned());
    config.workflows.poll_interval_ms = 200;
    config.seal.security_contexts = vec![json!({
        "name": "privileged", "description": "calls that wait for a second person",
        "capabilities": [
            {"tool_pattern": "aegis.tools.search", "require_approval": true, "approval_timeout_secs": 300}],
        "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}})];
    TestApp::spawn_with(config).await
}

/// A client that shows redirects instead of following them, with a cookie jar of its own.
fn browser_like() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Signs in with `key` and returns the session cookie (`name=value`).
async fn sign_in(app: &TestApp, client: &reqwest::Client, key: &str) -> String {
    let r = client
        .post(format!("{}/console/sign-in", app.http_base))
        .form(&[("key", key)])
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::SEE_OTHER,
        "sign-in answers a redirect"
    );
    let cookie = r
        .headers()
        .get("set-cookie")
        .expect("a session cookie")
        .to_str()
        .unwrap()
        .to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    assert!(!cookie.contains(key), "the key is not in the cookie");
    cookie.split(';').next().unwrap().to_owned()
}

async fn page(
    app: &TestApp,
    client: &reqwest::Client,
    cookie: &str,
    path: &str,
) -> (StatusCode, String) {
    let r = get(app, client, Some(cookie), path).await;
    let status = r.status();
    let csp = r
        .headers()
        .get("content-security-policy")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    assert!(
        csp.contains("default-src 'self'") && csp.contains("script-src 'self'"),
        "{path}: {csp}"
    );
    (status, r.text().await.unwrap())
}

fn csrf_of(html: &str) -> String {
    let at = html
        .find("name=\"csrf\" value=\"")
        .expect("a form token in the page")
        + 19;
    html[at..at + 64].to_owned()
}

/// `GET path` with the session `cookie` when given: the response as it came.
async fn get(
    app: &TestApp,
    client: &reqwest::Client,
    cookie: Option<&str>,
    path: &str,
) -> reqwest::Response {
    let mut r = client.get(format!("{}{path}", app.http_base));
    if let Some(c) = cookie {
        r = r.header("cookie", c);
    }
    r.send().await.unwrap()
}

/// Asserts that `cookie` no longer opens a session: a page sends the browser to sign in.
async fn assert_signed_out(app: &TestApp, client: &reqwest::Client, cookie: &str, why: &str) {
    let r = get(app, client, Some(cookie), "/console/sandboxes").await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER, "{why}");
}

async fn post(
    app: &TestApp,
    client: &reqwest::Client,
    cookie: Option<&str>,
    path: &str,
    form: &[(&str, &str)],
) -> reqwest::Response {
    let mut r = client.post(format!("{}{path}", app.http_base)).form(form);
    if let Some(c) = cookie {
        r = r.header("cookie", c);
    }
    r.send().await.unwrap()
}

/// A sandbox of the admin key with a file, a finished `cmd.run`, and a background `cat` whose
/// output is whatever is written to its input (returned: the sandbox and the `cat`'s pid).
async fn sandbox_with_a_command(app: &TestApp) -> (String, u64) {
    let created = app
        .posted("/v1/sandboxes", json!({"runtime": "busybox"}), 201)
        .await;
    let id = created["sandbox_id"]
        .as_str()
        .expect("a sandbox")
        .to_owned();
    for (tool, arguments) in [
        (
            "fs.write",
            json!({"path": "/workspace/hello.txt", "content": "hello"}),
        ),
        ("cmd.run", json!({"command": "echo console"})),
    ] {
        tool_call(app, &id, tool, arguments).await;
    }
    let started = tool_call(
        app,
        &id,
        "cmd.run",
        json!({"command": "cat", "background": true, "stdin": true, "tag": "echoer"}),
    )
    .await;
    let pid = started["structuredContent"]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("a background process: {started}"));
    (id, pid)
}

/// A tool call of the admin key in `sandbox`, through REST.
async fn tool_call(app: &TestApp, sandbox: &str, name: &str, arguments: Value) -> Value {
    let (_, body) = app
        .send_json(
            Method::POST,
            "/v1/tools/call",
            Some(json!({"name": name, "arguments": arguments, "sandbox_id": sandbox})),
        )
        .await;
    assert_eq!(body["isError"], false, "{name}: {body}");
    body
}

#[tokio::test]
async fn a_browser_signs_in_watches_a_run_approves_as_a_second_person_and_verifies_the_chain() {
    let db = TestDb::create().await;
    let app = app(&db).await;
    let second = app.create_key("second-person", "operator").await;
    let (own, own_id) = app
        .create_bound_key("self-approver", "operator", "privileged")
        .await;
    let (sandbox, pid) = sandbox_with_a_command(&app).await;
    // Output the process wrote before anyone looked, for the page to show when it opens.
    tool_call(
        &app,
        &sandbox,
        "proc.input",
        json!({"pid": pid, "data": "before-the-page\n"}),
    )
    .await;
    app.deployed("/v1/workflows", &workflow()).await;

    // A call of the bound key waits for a second person.
    let waiting = {
        let base = app.http_base.clone();
        let own = own.clone();
        tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(format!("{base}/v1/tools/call"))
                .bearer_auth(own)
                .json(&json!({"name": "aegis.tools.search", "arguments": {"query": "sandbox"}}))
                .send()
                .await
                .expect("sent");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        })
    };
    let pending = app
        .until(
            "/v1/approvals",
            "a pending approval",
            Duration::from_secs(30),
            |a| {
                a.as_array()
                    .is_some_and(|rows| rows.iter().any(|r| r["caller"]["id"] == own_id.as_str()))
            },
        )
        .await;
    let approval = common::json::items(&pending)
        .iter()
        .find(|r| r["caller"]["id"] == own_id.as_str())
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/console_browser.py"
    );
    let shots = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/console-screenshots");
    let out = tokio::process::Command::new("python3")
        .arg(script)
        .env("CONSOLE_BASE", &app.http_base)
        .env("ADMIN_KEY", TEST_ADMIN_KEY)
        .env("SECOND_KEY", &second)
        .env("SELF_KEY", &own)
        .env("SANDBOX_ID", &sandbox)
        .env("PROC_PID", pid.to_string())
        .env("APPROVAL_ID", &approval)
        .env("WORKFLOW", "console-steps")
        .env("SCREENSHOT_DIR", shots)
        .output()
        .await
        .expect("python3 runs (scripts/test.sh installs chromium, chromium-driver and selenium)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stdout.lines().last().unwrap_or_default();
    let result: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("no JSON from the browser script ({e}): {stdout}\n{stderr}"));
    assert!(
        result["error"].is_null(),
        "the browser script failed: {result:#}\n{stderr}"
    );
    let s = &result["steps"];
    assert_eq!(s["no_session_redirected"], true, "{result:#}");
    assert_eq!(s["no_session_shows_no_data"], true, "{result:#}");
    assert_eq!(s["key_not_in_page"], true, "{result:#}");
    assert_eq!(s["sandbox_listed"], true, "{result:#}");
    assert_eq!(s["sandbox_page_processes"], true, "{result:#}");
    assert_eq!(s["sandbox_page_files"], true, "{result:#}");
    assert_eq!(s["sandbox_page_process_link"], true, "{result:#}");
    // The list's CPU and memory, from the dispatcher's sample through REST (`usage=true`).
    let cpu = s["sandbox_cpu"].as_str().unwrap_or("");
    assert!(cpu.contains("% of") && cpu.ends_with("CPU"), "{result:#}");
    let memory = s["sandbox_memory"].as_str().unwrap_or("");
    assert!(memory.contains("MiB of"), "{result:#}");
    assert_eq!(s["process_output_at_open"], true, "{result:#}");
    assert_eq!(s["process_output_live"], true, "{result:#}");
    assert_eq!(s["download_status"], 200, "{result:#}");
    assert_eq!(s["download_body"], "hello", "{result:#}");
    assert!(
        s["download_disposition"]
            .as_str()
            .unwrap_or("")
            .starts_with("attachment"),
        "{result:#}"
    );
    // Its isolation class (the node's default here).
    assert_eq!(s["sandbox_class"], "container", "{result:#}");
    // Where it runs: the replica holding it and its engine, by name.
    assert_eq!(
        s["sandbox_replica"],
        json!(app.state.instance_id.to_string()),
        "{result:#}"
    );
    assert!(
        s["sandbox_engine"]
            .as_str()
            .is_some_and(|e| !e.is_empty() && !e.contains('@')),
        "{result:#}"
    );
    assert_eq!(s["node_replicas"], 1, "{result:#}");
    assert!(
        s["node_metrics_rows"].as_u64().unwrap_or(0) >= 1,
        "{result:#}"
    );
    // Another key: the sandbox is not found, and neither its files nor its process reach it.
    assert_eq!(s["other_sandbox_status"], 404, "{result:#}");
    assert_eq!(s["other_sandbox_shows_files"], false, "{result:#}");
    assert_ne!(s["other_download_status"], 200, "{result:#}");
    assert_eq!(s["other_download_has_content"], false, "{result:#}");
    assert_ne!(s["other_output_status"], 200, "{result:#}");
    assert!(
        s["audit_cmd_run_rows"].as_u64().unwrap_or(0) >= 1,
        "{result:#}"
    );
    // The sandbox page's link to its audit rows: its cmd.run calls and only its rows.
    assert!(
        s["sandbox_audit_cmd_run"].as_u64().unwrap_or(0) >= 1,
        "{result:#}"
    );
    assert_eq!(s["sandbox_audit_other_rows"], 0, "{result:#}");
    assert_eq!(s["run_followed_live"], true, "{result:#}");
    assert_eq!(s["run_events_arrived_live"], true, "{result:#}");
    assert_eq!(s["run_completed_in_page"], true, "{result:#}");
    // The mark moved with the run: at least one state before the last was marked while live.
    let marked = s["run_states_marked"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        marked.len() >= 2 && marked.contains(&json!("DONE")),
        "{result:#}"
    );
    assert_eq!(s["run_current_state"], json!(["DONE"]), "{result:#}");
    assert!(s["run_events"].as_u64().unwrap_or(0) >= 3, "{result:#}");
    assert_eq!(s["runs_list_has_run"], true, "{result:#}");
    assert_eq!(s["verify_result"], "The chain is valid.", "{result:#}");
    assert_eq!(s["keys_page_lists_second"], true, "{result:#}");
    assert_eq!(s["node_ready"], "ready", "{result:#}");
    for (path, status) in s["without_token"].as_object().expect("refusals") {
        assert_eq!(status, 403, "{path} without the form token: {result:#}");
    }
    assert_eq!(s["self_approve_buttons"], 0, "{result:#}");
    assert_eq!(s["self_approve_status"], 403, "{result:#}");
    assert_eq!(s["self_approve_refusal"], true, "{result:#}");
    assert!(
        s["second_approve_outcome"]
            .as_str()
            .unwrap_or("")
            .starts_with("Done"),
        "{result:#}"
    );
    assert_eq!(s["second_sees_no_keys_link"], true, "{result:#}");
    assert_eq!(s["after_sign_out_redirected"], true, "{result:#}");
    assert_eq!(
        result["console_errors"],
        json!([]),
        "script errors in the browser: {result:#}"
    );
    assert!(
        result["screenshots"].as_array().unwrap().len() >= 14,
        "{result:#}"
    );

    // The approved call ran.
    let (status, body) = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the waiting call ends")
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let decided = app.get_value(&format!("/v1/approvals/{approval}")).await;
    assert_eq!(decided["state"], "approved", "{decided}");
}

#[tokio::test]
async fn sessions_and_form_tokens_hold_over_plain_http() {
    let db = TestDb::create().await;
    let app = app(&db).await;
    let client = browser_like();
    let (sandbox, pid) = sandbox_with_a_command(&app).await;

    // Without a session: every page and every form sends to the sign-in page, shows nothing.
    for path in [
        "/console",
        "/console/sandboxes",
        &format!("/console/sandboxes/{sandbox}"),
        "/console/audit",
        "/console/audit/verify",
        "/console/runs",
        "/console/approvals",
        "/console/keys",
        "/console/node",
    ] {
        let r = get(&app, &client, None, path).await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{path}");
        assert_eq!(r.headers()["location"], "/console/sign-in", "{path}");
        assert!(!r.text().await.unwrap().contains(&sandbox));
    }
    let forms = [
        "/console/sign-out".to_owned(),
        format!("/console/sandboxes/{sandbox}/destroy"),
        format!("/console/runs/{sandbox}/cancel"),
        format!("/console/runs/{sandbox}/signal"),
        format!("/console/executions/{sandbox}/cancel"),
        format!("/console/approvals/{sandbox}/approve"),
        format!("/console/approvals/{sandbox}/reject"),
        "/console/keys".to_owned(),
        format!("/console/keys/{sandbox}/revoke"),
    ];
    for path in &forms {
        let r = post(&app, &client, None, path, &[("csrf", "0")]).await;
        assert_eq!(
            r.status(),
            StatusCode::SEE_OTHER,
            "{path} without a session"
        );
    }

    // A wrong key signs nobody in.
    let r = post(
        &app,
        &client,
        None,
        "/console/sign-in",
        &[("key", "aok_wrong")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.headers().get("set-cookie").is_none());
    // Another site cannot sign a browser in.
    let r = client
        .post(format!("{}/console/sign-in", app.http_base))
        .header("origin", "http://evil.example")
        .form(&[("key", TEST_ADMIN_KEY)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    // Signed in: every form without the token, or with another, is refused; nothing changed.
    let cookie = sign_in(&app, &client, TEST_ADMIN_KEY).await;
    let (status, html) = page(&app, &client, &cookie, "/console/sandboxes").await;
    assert_eq!(status, 200);
    assert!(html.contains(&sandbox), "the admin key lists the sandbox");
    assert!(!html.contains(TEST_ADMIN_KEY), "the key is not in the page");
    let token = csrf_of(&html);
    for path in &forms {
        let r = post(&app, &client, Some(&cookie), path, &[("note", "x")]).await;
        assert_eq!(
            r.status(),
            StatusCode::FORBIDDEN,
            "{path} without the form token"
        );
        let r = post(
            &app,
            &client,
            Some(&cookie),
            path,
            &[("csrf", &"0".repeat(64))],
        )
        .await;
        assert_eq!(
            r.status(),
            StatusCode::FORBIDDEN,
            "{path} with a wrong form token"
        );
    }
    let listed = app.get_value("/v1/sandboxes").await;
    assert!(
        listed.to_string().contains(&sandbox),
        "the sandbox is still there"
    );
    let destroy = format!("/console/sandboxes/{sandbox}/destroy");
    // Another session's token does not fit this one.
    let other = sign_in(&app, &client, TEST_ADMIN_KEY).await;
    let (_, other_html) = page(&app, &client, &other, "/console/sandboxes").await;
    assert_ne!(csrf_of(&other_html), token);
    let r = post(&app, &client, Some(&other), &destroy, &[("csrf", &token)]).await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    // A readonly key gets a read-only console, and REST refuses what it would post.
    let readonly = app.create_key("viewer", "readonly").await;
    let ro = sign_in(&app, &client, &readonly).await;
    let (_, html) = page(&app, &client, &ro, &format!("/console/sandboxes/{sandbox}")).await;
    assert!(
        !html.contains("id=\"destroy\""),
        "no destroy button for a readonly key"
    );
    let ro_token = csrf_of(&html);
    let r = post(&app, &client, Some(&ro), &destroy, &[("csrf", &ro_token)]).await;
    assert!(
        r.status().is_client_error(),
        "REST refuses a readonly key's destroy: {}",
        r.status()
    );
    // What the sandbox page adds is a tool call each, refused to a readonly key as on REST.
    let download = format!("/console/sandboxes/{sandbox}/file?path=/workspace/hello.txt");
    let output = format!("/console/sandboxes/{sandbox}/processes/{pid}/output");
    let (status, html) = page(&app, &client, &ro, &download).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{html}");
    assert!(html.contains("Refused: 403"), "{html}");
    let (status, _) = page(&app, &client, &ro, &output).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Another operator key: not found, like on REST.
    let other_key = app.create_key("other-operator", "operator").await;
    let op = sign_in(&app, &client, &other_key).await;
    let (status, html) = page(&app, &client, &op, &format!("/console/sandboxes/{sandbox}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(!html.contains("hello.txt"), "{html}");
    let (status, html) = page(&app, &client, &op, &download).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{html}");
    assert!(html.contains("not found"), "{html}");
    let (status, text) = page(&app, &client, &op, &output).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    let (status, text) = page(&app, &client, &op, "/console/sandboxes/usage").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !text.contains(&sandbox),
        "another key measures only its own: {text}"
    );
    let (_, text) = page(&app, &client, &cookie, "/console/sandboxes/usage").await;
    let usage: Value = serde_json::from_str(&text).unwrap();
    assert!(
        usage[&sandbox]["mem_total"].as_u64().unwrap_or(0) > 0,
        "the owner's sandbox is measured: {text}"
    );
    // A key bound to a security context: REST refuses its list, and the router the sandbox.
    let (bound, _) = app
        .create_bound_key("bound-operator", "operator", "privileged")
        .await;
    let bo = sign_in(&app, &client, &bound).await;
    let (_, html) = page(&app, &client, &bo, &format!("/console/sandboxes/{sandbox}")).await;
    assert!(!html.contains("hello.txt"), "{html}");
    assert!(html.contains("REST refused"), "{html}");
    let (status, html) = page(&app, &client, &bo, &download).await;
    assert!(status.is_client_error(), "{status}: {html}");
    assert!(!html.contains(">hello<"), "{html}");
    // The owner downloads the file itself, as an attachment.
    let r = get(&app, &client, Some(&cookie), &download).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .starts_with("attachment; filename=\"hello.txt\""));
    assert_eq!(r.text().await.unwrap(), "hello");

    let (_, html) = page(&app, &client, &ro, "/console/keys").await;
    assert!(
        html.contains("REST refused: 403"),
        "keys are admin-only on REST: {html}"
    );

    // A revoked key ends its session on the next request.
    let ids = app.get_value("/v1/api-keys").await;
    let viewer = common::json::find(&ids, "name", "viewer")["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .response(Method::DELETE, &format!("/v1/api-keys/{viewer}"), None)
        .await;
    assert!(r.status().is_success());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_signed_out(&app, &client, &ro, "a revoked key's session has ended").await;

    // Signing out with the token ends the session for good.
    let r = post(
        &app,
        &client,
        Some(&cookie),
        "/console/sign-out",
        &[("csrf", &token)],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_signed_out(&app, &client, &cookie, "a signed-out session shows nothing").await;
    let (status, _) = page(&app, &client, &other, "/console/sandboxes").await;
    assert_eq!(status, 200, "the other session lives on");
}

/// The console reaches data only through the REST router: outside `session.rs` and
/// `sign_in.rs` (its own `console_sessions` rows and the same `auth::authenticate` REST runs) no console file names
/// the database, the tool router, the dispatcher or any store; every page handler takes the
/// REST client (`Extension<Rest>`) and nothing else with data.
#[test]
fn the_console_reaches_data_only_through_the_rest_router() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/api/console");
    let forbidden = [
        "sqlx",
        ".pool",
        "crate::tools",
        "dispatcher",
        "crate::audit",
        "crate::approvals",
        "crate::registry",
        "crate::workflow",
        "crate::engine",
        "crate::sandboxes",
        "state.docker",
        "crate::contexts",
        "State<AppState>",
    ];
    let mut checked = 0;
    // The console's files, and those of its folders (`pages/`), each checked as itself.
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            for inner in std::fs::read_dir(&path).unwrap() {
                files.push(inner.unwrap().path());
            }
        } else {
            files.push(path);
        }
    }
    for path in files {
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        // The error type names the session store's error; that is not a way to data.
        let text: String = text
            .lines()
            .filter(|l| !l.contains("sqlx::Error"))
            .collect::<Vec<_>>()
            .join("\n");
        checked += 1;
        if name == "session.rs" || name == "sign_in.rs" {
            // The session pair: its own rows (`aegis_store::console_sessions`) and the key
            // check REST's middleware makes (`auth::authenticate`), nothing else with data.
            for line in text.lines().filter(|l| l.contains(".pool")) {
                assert!(
                    line.contains("console_sessions") || line.contains("auth::authenticate"),
                    "{name} reaches the database for something else: {line}"
                );
            }
            for word in forbidden
                .iter()
                .filter(|w| !matches!(**w, ".pool" | "State<AppState>"))
            {
                assert!(
                    !text.contains(word),
                    "{name} names `{word}`: the console must go through REST"
                );
            }
            continue;
        }
        if name == "rest.rs" {
            assert!(
                text.contains("crate::api::rest::router"),
                "the REST client sends into the REST router"
            );
            continue;
        }
        for word in forbidden {
            assert!(
                !text.contains(word),
                "{name} names `{word}`: the console must go through REST"
            );
        }
    }
    assert_eq!(
        checked, 11,
        "mod, csrf, layout, rest, session, sign_in; pages/: mod, sandboxes, runs, oversight, node"
    );
}
