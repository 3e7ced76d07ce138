//! The streaming form of `cmd.run` on every door that can carry it: Server-Sent Events on
//! `POST /v1/tools/call` (and `/v1/seal/invoke`), `seal.v1.Gateway/InvokeStream` on gRPC, and
//! progress notifications on `/mcp` (through the official MCP Python SDK's progress callback).
//!
//! That chunks come before the end is shown without clocks: the command prints `one`, then
//! waits until `/workspace/go` exists, which the test creates (by another call) only once it
//! has received `one`; a door that held the output to the end would never see it, and the
//! test fails on its bounded wait. The final answer equals the answer of the same call made
//! without streaming; caps, refusals, keys without the tool and a client that goes away (its
//! command killed, checked from inside the sandbox, and audited as such) are covered per door.

use crate::common;
use crate::common::agent::AgentManifest;

use std::time::Duration;

use aegis_cli::seal_client::{SealClient, Transport};
use common::sandbox::AgentSandbox;
use common::{test_config, TestApp, TestDb};
use orchestrator::api::grpc::pb::seal::gateway_client::GatewayClient;
use orchestrator::api::grpc::pb::seal::{invoke_stream_response, InvokeRequest};
use serde_json::{json, Value};

/// Prints `one`, waits for the marker, then `two` on stderr and `three`.
const WAITS: &str =
    "echo one; while [ ! -e /workspace/go ]; do sleep 0.1; done; echo two >&2; echo three";
/// Prints forever (until killed, or its 60 s timeout).
const TICKS: &str = "echo started; while true; do echo tick-tock; sleep 0.2; done";
/// 390 bytes of stdout.
const MANY: &str = "i=0; while [ $i -lt 50 ]; do echo line-$i; i=$((i+1)); done";

/// `cmd.run` arguments that run `script` with `sh -c`.
pub(crate) fn sh(script: &str) -> Value {
    json!({"command": "sh", "args": ["-c", script]})
}

/// A busybox agent that may run `sh -c` (and write the marker).
fn agent(name: &str, tools: &str) -> String {
    AgentManifest::new(name)
        .instruction("Stream commands.")
        .tools_listed(tools)
        .cmd(&["sh", "sh -c"], 60, "")
        .filesystem(&["/workspace"], &["/workspace"])
        .yaml()
}

/// Server-Sent Events read as they arrive.
pub(crate) struct Events {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Events {
    /// The events of `response`, read as they arrive.
    fn of(response: reqwest::Response) -> Self {
        Events {
            response,
            buffer: Vec::new(),
        }
    }

    /// The first event, which must be `start`; its data.
    pub(crate) async fn started(&mut self) -> Value {
        let (name, start) = self.next().await.expect("a first event");
        assert_eq!(name, "start", "{start}");
        start
    }

    /// The next event (name, JSON data); `None` at the end of the body. Fails the test when
    /// nothing comes for 60 s.
    pub(crate) async fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(at) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buffer.drain(..at + 2).collect();
                let block = String::from_utf8(block).expect("events are UTF-8");
                let mut name = "message".to_owned();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                if data.is_empty() {
                    // A keep-alive comment.
                    continue;
                }
                let data = serde_json::from_str(&data).expect("event data is JSON");
                return Some((name, data));
            }
            let chunk = tokio::time::timeout(Duration::from_secs(60), self.response.chunk())
                .await
                .expect("an event within 60 s")
                .expect("the body is readable")?;
            self.buffer.extend_from_slice(&chunk);
        }
    }
}

/// `POST /v1/tools/call` with `Accept: text/event-stream`.
async fn post_streaming(app: &TestApp, key: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/v1/tools/call", app.http_base))
        .bearer_auth(key)
        .header("Accept", "text/event-stream")
        .json(&body)
        .send()
        .await
        .expect("request sent")
}

/// Opens the event stream of a call in `sb`'s sandbox; it must be one.
pub(crate) async fn stream(app: &TestApp, sb: &AgentSandbox, arguments: Value) -> Events {
    let response = post_streaming(
        app,
        common::TEST_ADMIN_KEY,
        json!({"name": "cmd.run", "arguments": arguments, "sandbox_id": sb.id}),
    )
    .await;
    assert_eq!(response.status(), 200);
    let kind = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(kind.starts_with("text/event-stream"), "{kind}");
    Events::of(response)
}

/// A node, the sandbox of agent `name` (with `tools`) on it, and the event stream of `cmd.run`
/// with `arguments` there, past its `start` event; (node, sandbox, stream, the start's data).
async fn streaming(
    name: &str,
    tools: &str,
    arguments: Value,
) -> (TestApp, AgentSandbox, Events, Value) {
    let app = TestApp::spawn().await;
    let sb = AgentSandbox::start(&app, agent(name, tools)).await;
    let mut events = stream(&app, &sb, arguments).await;
    let start = events.started().await;
    (app, sb, events, start)
}

/// The event stream of `sh -c script` in `sb`'s sandbox through `app`, past its `start` event.
pub(crate) async fn started_shell(app: &TestApp, sb: &AgentSandbox, script: &str) -> Events {
    let mut events = stream(app, sb, sh(script)).await;
    events.started().await;
    events
}

/// What a streamed call sent: stdout and stderr as concatenated, how many output events came,
/// and the `result` event's data.
#[derive(Default)]
struct Streamed {
    stdout: String,
    stderr: String,
    chunks: usize,
    result: Value,
}

/// Reads events to the `result` event.
async fn to_the_end(events: &mut Events, mut got: Streamed) -> Streamed {
    while let Some((name, data)) = events.next().await {
        match name.as_str() {
            "stdout" | "stderr" => {
                assert_eq!(data["encoding"], "utf8", "{data}");
                let text = data["data"].as_str().unwrap();
                if name == "stdout" {
                    got.stdout.push_str(text);
                } else {
                    got.stderr.push_str(text);
                }
                got.chunks += 1;
            }
            "result" => {
                got.result = data;
                assert!(events.next().await.is_none(), "result is the last event");
                return got;
            }
            other => panic!("unexpected event {other}: {data}"),
        }
    }
    panic!("the stream ended without a result event");
}

/// A `cmd.run` result without its duration (the one field two runs never share).
fn timeless(result: &Value) -> Value {
    let mut r = result["structuredContent"].clone();
    r.as_object_mut()
        .expect("a result object")
        .remove("duration_ms");
    r
}

/// Lines of `ps` in `container` naming `pattern`.
fn running(container: &str, pattern: &str) -> Vec<String> {
    common::docker_lines(&["exec", container, "ps", "-o", "pid,args"])
        .into_iter()
        .filter(|l| l.contains(pattern))
        .collect()
}

/// Polls (bounded) until nothing in `container` runs `pattern`; what still runs otherwise.
async fn until_gone(container: &str, pattern: &str) -> Vec<String> {
    for _ in 0..150 {
        let left = running(container, pattern);
        if left.is_empty() {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    running(container, pattern)
}

/// The audit rows of `action` as (outcome, reason_code).
async fn audited(app: &TestApp, action: &str) -> Vec<(String, Option<String>)> {
    sqlx::query_as("SELECT outcome, reason_code FROM audit_log WHERE action = $1 ORDER BY seq")
        .bind(action)
        .fetch_all(&app.state.pool)
        .await
        .expect("audit rows")
}

/// Polls (bounded) until a `cmd.run` completion says its client disconnected.
async fn cancelled_is_audited(app: &TestApp) {
    let wanted = (
        "cancelled".to_owned(),
        Some("client_disconnected".to_owned()),
    );
    let mut rows = Vec::new();
    for _ in 0..100 {
        rows = audited(app, "cmd.run").await;
        if rows.contains(&wanted) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no cmd.run completion says the client disconnected: {rows:?}");
}

#[tokio::test]
async fn rest_chunks_arrive_before_the_end_and_the_result_is_the_unary_one() {
    let (app, sb, mut events, start) =
        streaming("stream-rest", "cmd.run, fs.write", sh(WAITS)).await;
    assert!(start["pid"].as_u64().is_some(), "{start}");
    let (name, first) = events.next().await.expect("the first output");
    assert_eq!(
        (name.as_str(), &first),
        ("stdout", &json!({"data": "one\n", "encoding": "utf8"}))
    );
    // The command is still running: it waits for the marker written now.
    assert!(
        !running(&sb.container(), "workspace/go").is_empty(),
        "the command waits"
    );
    sb.ok("fs.write", json!({"path": "/workspace/go", "content": ""}))
        .await;
    let got = to_the_end(
        &mut events,
        Streamed {
            stdout: "one\n".into(),
            stderr: String::new(),
            chunks: 1,
            result: Value::Null,
        },
    )
    .await;
    assert!(got.chunks >= 3, "one, two and three came as chunks");
    assert_eq!(
        (got.stdout.as_str(), got.stderr.as_str()),
        ("one\nthree\n", "two\n")
    );
    assert_eq!(got.result["isError"], false, "{}", got.result);
    assert_eq!(got.result["structuredContent"]["stdout"], "one\nthree\n");

    // The same call without streaming answers the same.
    let (status, plain) = sb.call("cmd.run", sh(WAITS)).await;
    assert_eq!(status, 200);
    assert_eq!(timeless(&got.result), timeless(&plain));

    // One decision, an intent and a completion per call, like any other call.
    let rows = audited(&app, "cmd.run").await;
    let count = |outcome: &str| rows.iter().filter(|(o, _)| o == outcome).count();
    assert_eq!((count("running"), count("ok")), (2, 2), "{rows:?}");

    // The signed door over HTTP has the same form: see the gRPC test for SEAL itself.
}

#[tokio::test]
async fn rest_output_caps_hold_with_their_truncation_flags() {
    let mut arguments = sh(MANY);
    arguments["max_output_bytes"] = json!(64);
    let (_app, sb, mut events, _) = streaming("stream-cap", "cmd.run", arguments.clone()).await;
    let got = to_the_end(&mut events, Streamed::default()).await;
    assert_eq!(got.stdout.len(), 64, "only the capped bytes are sent");
    let result = &got.result["structuredContent"];
    assert_eq!(result["truncated"], true, "{result}");
    assert_eq!(result["truncated_streams"]["stdout"], true, "{result}");
    assert_eq!(result["stdout_bytes"], 390, "{result}");
    assert_eq!(result["stdout"], got.stdout.as_str());
    let (_, plain) = sb.call("cmd.run", arguments).await;
    assert_eq!(timeless(&got.result), timeless(&plain));
}

#[tokio::test]
async fn rest_a_client_that_disconnects_kills_the_command_and_the_audit_says_so() {
    let (app, sb, mut events, start) = streaming("stream-gone", "cmd.run", sh(TICKS)).await;
    let pid = start["pid"].as_u64().expect("a pid");
    let (name, first) = events.next().await.expect("output");
    assert_eq!(name, "stdout");
    let text = first["data"].as_str().unwrap_or_default();
    assert!(text.starts_with("started\n"), "{first}");
    assert!(
        common::docker_lines(&["exec", &sb.container(), "ls", &format!("/proc/{pid}")]).len() > 1,
        "the command runs"
    );
    drop(events);

    assert_eq!(
        until_gone(&sb.container(), "tick-tock").await,
        Vec::<String>::new(),
        "the command's tree is killed"
    );
    let exists = std::process::Command::new("docker")
        .args([
            "exec",
            &sb.container(),
            "test",
            "-e",
            &format!("/proc/{pid}"),
        ])
        .status()
        .expect("docker runs");
    assert_eq!(exists.code(), Some(1), "pid {pid} is gone");
    cancelled_is_audited(&app).await;
}

#[tokio::test]
async fn rest_refusals_come_before_any_stream_with_the_unary_error() {
    let app = TestApp::spawn().await;
    let sb = AgentSandbox::start(&app, agent("stream-refused", "cmd.run")).await;
    let without = AgentSandbox::start(&app, common::agent::reader_agent("stream-no-cmd")).await;
    let readonly = app.create_key("stream-reader", "readonly").await;

    let cases = [
        // Outside the allowlist.
        (
            common::TEST_ADMIN_KEY.to_owned(),
            &sb,
            json!({"command": "rm -rf /workspace"}),
        ),
        // A sandbox whose agent does not have the tool.
        (common::TEST_ADMIN_KEY.to_owned(), &without, sh(WAITS)),
        // A key whose role may not call it.
        (readonly, &sb, sh(WAITS)),
    ];
    for (key, sandbox, arguments) in cases {
        let body = json!({"name": "cmd.run", "arguments": arguments, "sandbox_id": sandbox.id});
        let streamed = post_streaming(&app, &key, body.clone()).await;
        let status = streamed.status();
        let kind = streamed.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        let streamed: Value = streamed.json().await.expect("a JSON error body");
        let plain = app.rest_as(&key).post_json("/v1/tools/call", &body).await;
        assert_eq!(status, plain.status(), "{streamed}");
        assert_eq!(status, 403, "{streamed}");
        assert!(kind.starts_with("application/json"), "{kind}");
        assert_eq!(streamed, plain.json::<Value>().await.unwrap());
    }
    assert!(running(&sb.container(), "rm -rf").is_empty());
}

/// A node with two SEAL contexts: one that may run `sh -c` and `ps` and write files, one that may
/// only write files. Context names are unique so label filters see only this test's sandboxes.
async fn seal_app(db: &TestDb, with_cmd: &str, without_cmd: &str) -> TestApp {
    let mut config = test_config(&db.url);
    config.seal.security_contexts = vec![
        json!({"name": with_cmd, "description": "streams commands",
               "runtime": {"language": "busybox", "version": "1"},
               "capabilities": [
                   {"tool_pattern": "fs.*", "path_allowlist": ["/workspace"]},
                   {"tool_pattern": "cmd.run", "command_allowlist": ["sh", "ps"],
                    "subcommand_allowlist": ["sh -c", "ps -o"]}],
               "attestation": {"allow_unverified": true}}),
        json!({"name": without_cmd, "description": "no commands",
               "runtime": {"language": "busybox", "version": "1"},
               "capabilities": [{"tool_pattern": "fs.*", "path_allowlist": ["/workspace"]}],
               "attestation": {"allow_unverified": true}}),
    ];
    config.seal.attest_per_minute = 100;
    TestApp::spawn_with(config).await
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

/// A signed `tools/call` envelope of `client`'s session.
fn envelope(client: &SealClient, name: &str, arguments: Value) -> InvokeRequest {
    let payload = json!({"jsonrpc": "2.0", "id": unique("req"), "method": "tools/call",
                         "params": {"name": name, "arguments": arguments}});
    let envelope = client
        .envelope(&payload, chrono::Utc::now())
        .expect("signed");
    InvokeRequest {
        envelope_json: envelope.to_string().into_bytes(),
    }
}

#[tokio::test]
async fn grpc_invoke_stream_sends_chunks_then_the_unary_answer_and_refuses_like_invoke() {
    let db = TestDb::create().await;
    let (ctx, bare) = (unique("stream-ctx"), unique("stream-bare"));
    let app = seal_app(&db, &ctx, &bare).await;
    let endpoint = Transport::Grpc(format!("http://{}", app.grpc_addr));
    let mut client = SealClient::new(endpoint.clone()).unwrap();
    client.attest("test-streamer", &ctx).await.expect("attests");
    let mut grpc = GatewayClient::new(app.grpc_channel().await);

    // The command's output before its end, then Invoke's answer.
    let mut messages = grpc
        .invoke_stream(envelope(&client, "cmd.run", sh(WAITS)))
        .await
        .expect("the stream opens")
        .into_inner();
    let next = |m: Option<orchestrator::api::grpc::pb::seal::InvokeStreamResponse>| {
        m.expect("a message").event.expect("an event")
    };
    use invoke_stream_response::Event;
    let first = next(messages.message().await.unwrap());
    assert!(matches!(first, Event::StartedPid(_)), "{first:?}");
    let output = next(messages.message().await.unwrap());
    assert_eq!(output, Event::Stdout(b"one\n".to_vec()));
    client
        .call_tool("fs.write", json!({"path": "/workspace/go", "content": ""}))
        .await
        .expect("the marker is written");
    let (mut stdout, mut stderr, mut chunks) = (b"one\n".to_vec(), Vec::new(), 1);
    let answer = loop {
        match next(messages.message().await.unwrap()) {
            Event::Stdout(b) => {
                stdout.extend(b);
                chunks += 1;
            }
            Event::Stderr(b) => {
                stderr.extend(b);
                chunks += 1;
            }
            Event::ResponseJson(json) => break serde_json::from_slice::<Value>(&json).unwrap(),
            other => panic!("{other:?}"),
        }
    };
    assert!(
        messages.message().await.unwrap().is_none(),
        "the answer is last"
    );
    assert!(chunks >= 3);
    assert_eq!(
        (stdout.as_slice(), stderr.as_slice()),
        (&b"one\nthree\n"[..], &b"two\n"[..])
    );
    assert_eq!(answer["status"], "success", "{answer}");
    let plain = client.call_tool("cmd.run", sh(WAITS)).await.unwrap();
    assert_eq!(timeless(&answer["payload"]["result"]), timeless(&plain));

    // Refusals are InvokeStream's status, the one Invoke gives, before any message.
    let refused = |arguments: Value| envelope(&client, "cmd.run", arguments);
    let streamed = grpc
        .invoke_stream(refused(json!({"command": "rm -rf /workspace"})))
        .await
        .expect_err("refused");
    let unary = grpc
        .invoke(refused(json!({"command": "rm -rf /workspace"})))
        .await
        .expect_err("refused");
    assert_eq!(streamed.code(), tonic::Code::PermissionDenied);
    assert_eq!(
        (streamed.code(), streamed.message()),
        (unary.code(), unary.message())
    );

    // A session whose context does not grant cmd.run cannot stream it.
    let mut other = SealClient::new(endpoint).unwrap();
    other.attest("test-streamer", &bare).await.expect("attests");
    let streamed = grpc
        .invoke_stream(envelope(&other, "cmd.run", sh(WAITS)))
        .await
        .expect_err("refused");
    let unary = grpc
        .invoke(envelope(&other, "cmd.run", sh(WAITS)))
        .await
        .expect_err("refused");
    assert_eq!(streamed.code(), tonic::Code::PermissionDenied);
    assert_eq!(streamed.message(), unary.message());

    // A client that goes away: the command is killed, from inside the sandbox's view.
    let mut messages = grpc
        .invoke_stream(envelope(&client, "cmd.run", sh(TICKS)))
        .await
        .expect("the stream opens")
        .into_inner();
    assert!(matches!(
        next(messages.message().await.unwrap()),
        Event::StartedPid(_)
    ));
    let started = next(messages.message().await.unwrap());
    assert!(
        matches!(&started, Event::Stdout(b) if b.starts_with(b"started\n")),
        "{started:?}"
    );
    let container =
        common::docker_lines(&["ps", "-q", "--filter", &format!("label=seal_context={ctx}")]);
    assert_eq!(container.len(), 1, "the session's sandbox: {container:?}");
    assert!(!running(&container[0], "tick-tock").is_empty());
    drop(messages);
    drop(grpc);
    assert_eq!(
        until_gone(&container[0], "tick-tock").await,
        Vec::<String>::new()
    );
    cancelled_is_audited(&app).await;
}

#[tokio::test]
async fn seal_over_http_streams_with_the_same_events() {
    let db = TestDb::create().await;
    let (ctx, bare) = (unique("stream-ctx"), unique("stream-bare"));
    let app = seal_app(&db, &ctx, &bare).await;
    let mut client = SealClient::new(Transport::Http(app.http_base.clone())).unwrap();
    client.attest("test-streamer", &ctx).await.expect("attests");
    let invoke = |arguments: Value| {
        let request = envelope(&client, "cmd.run", arguments);
        reqwest::Client::new()
            .post(format!("{}/v1/seal/invoke", app.http_base))
            .header("Accept", "text/event-stream")
            .header("content-type", "application/json")
            .body(request.envelope_json)
            .send()
    };
    let response = invoke(sh(MANY)).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut events = Events::of(response);
    events.started().await;
    let got = to_the_end(&mut events, Streamed::default()).await;
    assert_eq!(got.result["status"], "success", "{}", got.result);
    assert_eq!(got.stdout.len(), 390);
    assert_eq!(
        got.result["payload"]["result"]["structuredContent"]["stdout"],
        got.stdout.as_str()
    );

    // A refusal is the SEAL error answer, not a stream.
    let response = invoke(json!({"command": "rm -rf /workspace"}))
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    let body: Value = response.json().await.expect("a JSON error");
    assert!(body.to_string().contains("2003"), "{body}");
}

#[tokio::test]
async fn mcp_progress_notifications_carry_the_output_through_the_python_sdk() {
    let db = TestDb::create().await;
    let (ctx, bare) = (unique("stream-ctx"), unique("stream-bare"));
    let app = seal_app(&db, &ctx, &bare).await;
    let key = |context: String| {
        let app = &app;
        async move {
            let r = app.post_json("/v1/api-keys", &json!({"name": "mcp-streamer", "role": "readonly", "security_context": context})).await;
            assert_eq!(r.status(), 201);
            r.json::<Value>().await.unwrap()["key"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let (with_cmd, without_cmd) = (key(ctx.clone()).await, key(bare.clone()).await);

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/mcp_streaming.py");
    let report = common::python_client::report(
        script,
        &[&app.http_base, &with_cmd, &without_cmd],
        "the MCP streaming client failed (needs `pip install mcp==2.3.0`)",
    )
    .await;

    // Chunks as progress, `one` before the end (the marker was written from its callback).
    let streamed = &report["streamed"];
    assert_eq!(streamed["marker_before_answer"], true, "{streamed}");
    let messages = common::json::present_strs(&streamed["chunks"], "message");
    assert_eq!(messages.first(), Some(&"one\n"), "{streamed}");
    assert!(messages.len() >= 3, "{streamed}");
    let mut sorted = messages.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["one\n", "three\n", "two\n"], "{streamed}");
    let progress: Vec<f64> = common::json::items(&streamed["chunks"])
        .iter()
        .filter_map(|c| c["progress"].as_f64())
        .collect();
    assert!(progress.windows(2).all(|w| w[0] < w[1]), "{progress:?}");
    assert_eq!(streamed["result"]["isError"], false, "{streamed}");
    assert_eq!(timeless(&streamed["result"]), timeless(&report["plain"]));

    // The cap, with its flags, and the same answer as without progress.
    let capped = &report["capped"];
    let sent: usize = common::json::items(&capped["chunks"])
        .iter()
        .filter_map(|c| c["message"].as_str())
        .map(str::len)
        .sum();
    assert_eq!(sent, 64, "{capped}");
    assert_eq!(capped["result"]["structuredContent"]["truncated"], true);
    assert_eq!(timeless(&capped["result"]), timeless(&capped["plain"]));

    // Refused before any progress, with the error the call without progress gets.
    let refused = &report["refused"];
    assert_eq!(refused["chunks"], json!([]), "{refused}");
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert_eq!(refused["result"], refused["plain"]);
    let without = &report["without_tool"];
    assert_eq!(without["chunks"], json!([]), "{without}");
    assert_eq!(without["result"]["isError"], true, "{without}");

    // Cancelled after its first chunk: gone from the sandbox (seen with `ps` inside it).
    let cancelled = &report["cancelled"];
    assert_eq!(cancelled["got_a_chunk"], true, "{cancelled}");
    assert_eq!(cancelled["still_running"], json!([]), "{cancelled}");
    cancelled_is_audited(&app).await;
}
