//! The LLM client against the scripted fake provider: what goes on the wire, what comes back,
//! which failures are retried and which are not, and that the API key never leaks.
//!
//! No database and no Docker: only `common::fake_llm` is used.

use crate::common;

use std::time::{Duration, Instant};

use common::fake_llm::{answer, rate_limited, tool_calls, FakeLlm, Step};
use orchestrator::llm::{
    ChatRequest, LlmClient, LlmConfig, LlmError, Message, Role, ToolCall, ToolSpec,
};
use serde_json::json;

/// Upper bound for any single call in these tests: a hang fails the test instead of CI.
const CALL_BOUND: Duration = Duration::from_secs(20);

fn client(config: &LlmConfig) -> LlmClient {
    LlmClient::new(config).expect("client")
}

async fn chat(
    client: &LlmClient,
    alias: Option<&str>,
    request: &ChatRequest,
) -> Result<orchestrator::llm::ChatResponse, LlmError> {
    tokio::time::timeout(CALL_BOUND, client.chat(alias, request))
        .await
        .expect("the call returned within its bound")
}

fn hello() -> ChatRequest {
    ChatRequest {
        messages: vec![Message::user("hello")],
        tools: vec![],
        temperature: None,
    }
}

/// `hello()` sent to `fake` through a client of its configuration: the answer, or the error.
async fn hello_to(fake: &FakeLlm) -> Result<orchestrator::llm::ChatResponse, LlmError> {
    chat(&client(&fake.config()), None, &hello()).await
}

fn spec(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("the {name} tool"),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
    }
}

#[tokio::test]
async fn a_tool_call_round_trip_sends_and_reads_the_openai_shapes() {
    let fake = FakeLlm::start(vec![
        // A real model answers with the names it was given on the wire (`fs_write`); the
        // scripted `cmd.run` checks that names it was not given pass through untouched.
        tool_calls(&[
            ("fs_write", json!({"path": "a.py", "content": "print(1)"})),
            ("cmd.run", json!({"command": "python a.py"})),
        ]),
        answer("done: 1"),
    ])
    .await;
    let mut config = fake.config();
    let m = config.models.get_mut("default").expect("alias");
    m.temperature = Some(0.25);
    m.max_tokens = Some(256);
    let client = client(&config);

    let mut request = ChatRequest {
        messages: vec![Message::system("be brief"), Message::user("write and run")],
        tools: vec![spec("fs.write"), spec("cmd.run")],
        temperature: None,
    };
    let first = chat(&client, None, &request).await.expect("first call");
    assert_eq!(first.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(first.message.role, Role::Assistant);
    assert_eq!(first.message.content, None);
    assert_eq!(
        first.message.tool_calls,
        vec![
            ToolCall {
                id: "call_1".into(),
                name: "fs.write".into(),
                arguments: json!({"path": "a.py", "content": "print(1)"}).to_string(),
            },
            ToolCall {
                id: "call_2".into(),
                name: "cmd.run".into(),
                arguments: json!({"command": "python a.py"}).to_string(),
            },
        ]
    );
    assert_eq!(
        (
            first.usage.prompt_tokens,
            first.usage.completion_tokens,
            first.usage.total_tokens
        ),
        (20, 10, 30)
    );
    assert_eq!(first.provider, "fake");
    assert_eq!(first.model, "scripted");
    assert_eq!(first.attempts, 1);

    request.messages.push(first.message.clone());
    request
        .messages
        .push(Message::tool("call_1", "wrote 8 bytes"));
    request.messages.push(Message::tool("call_2", "exit 0: 1"));
    // The agent's own temperature (spec.runtime.temperature) wins over the model's.
    request.temperature = Some(0.9);
    let second = chat(&client, Some("default"), &request)
        .await
        .expect("second call");
    assert_eq!(second.message.content.as_deref(), Some("done: 1"));
    assert!(second.message.tool_calls.is_empty());
    assert_eq!(second.finish_reason.as_deref(), Some("stop"));

    let sent = fake.requests();
    assert_eq!(sent.len(), 2);
    let body = &sent[0];
    assert_eq!(body["model"], "scripted");
    assert_eq!(body["temperature"], 0.25);
    assert_eq!(sent[1]["temperature"], 0.9);
    assert_eq!(body["max_tokens"], 256);
    assert_eq!(body["tool_choice"], "auto");
    assert_eq!(
        body["tools"][0],
        json!({"type": "function", "function": {
            "name": "fs_write",
            "description": "the fs.write tool",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        }})
    );
    assert_eq!(body["tools"][1]["function"]["name"], "cmd_run");
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "write and run"},
        ])
    );
    let messages = &sent[1]["messages"];
    assert_eq!(
        messages[2],
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {
                "name": "fs_write",
                "arguments": json!({"path": "a.py", "content": "print(1)"}).to_string(),
            }},
            {"id": "call_2", "type": "function", "function": {
                "name": "cmd_run",
                "arguments": json!({"command": "python a.py"}).to_string(),
            }},
        ]})
    );
    assert_eq!(
        messages[3],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "wrote 8 bytes"})
    );
    assert_eq!(
        messages[4],
        json!({"role": "tool", "tool_call_id": "call_2", "content": "exit 0: 1"})
    );
}

#[tokio::test]
async fn a_plain_request_sends_no_tools_and_no_sampling_defaults() {
    let fake = FakeLlm::start(vec![answer("hi")]).await;
    let reply = hello_to(&fake).await.expect("answer");
    assert_eq!(reply.message.content.as_deref(), Some("hi"));
    let body = &fake.requests()[0];
    for absent in ["tools", "tool_choice", "temperature", "max_tokens"] {
        assert!(body.get(absent).is_none(), "{absent} sent: {body}");
    }
    assert_eq!(fake.authorizations(), vec![None]);
}

#[tokio::test]
async fn server_errors_are_retried_until_success() {
    let fake = FakeLlm::start(vec![
        Step::Status(500, json!({"error": "boom"})),
        Step::Status(502, json!({"error": "bad gateway"})),
        answer("recovered"),
    ])
    .await;
    let reply = hello_to(&fake).await.expect("third attempt succeeds");
    assert_eq!(reply.attempts, 3);
    assert_eq!(reply.message.content.as_deref(), Some("recovered"));
    assert_eq!(fake.requests().len(), 3);
}

#[tokio::test]
async fn retries_end_with_the_last_error() {
    // An empty script answers 500 every time.
    let fake = FakeLlm::start(vec![]).await;
    let err = hello_to(&fake).await.expect_err("never succeeds");
    match &err {
        LlmError::RetriesExhausted {
            provider,
            attempts,
            last,
        } => {
            assert_eq!(provider, "fake");
            assert_eq!(*attempts, 4);
            assert!(
                matches!(**last, LlmError::Http { status: 500, .. }),
                "{last:?}"
            );
        }
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
    assert!(err.to_string().contains("script exhausted"), "{err}");
    assert_eq!(fake.requests().len(), 4);
}

#[tokio::test]
async fn retry_after_is_honoured_instead_of_the_backoff() {
    let fake = FakeLlm::start(vec![rate_limited(0), answer("ok")]).await;
    let mut config = fake.config();
    // Were Retry-After ignored, the first backoff alone would take 5 s.
    config.providers[0].initial_backoff_ms = 5_000;
    let started = Instant::now();
    let reply = chat(&client(&config), None, &hello())
        .await
        .expect("second attempt succeeds");
    assert_eq!(reply.attempts, 2);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_provider_that_never_answers_times_out() {
    let fake = FakeLlm::start(vec![Step::Hang]).await;
    let mut config = fake.config();
    config.providers[0].timeout_secs = 1;
    config.providers[0].max_retries = 0;
    let started = Instant::now();
    let err = chat(&client(&config), None, &hello())
        .await
        .expect_err("times out");
    let took = started.elapsed();
    match &err {
        LlmError::Timeout { provider, after } => {
            assert_eq!(provider, "fake");
            assert_eq!(*after, Duration::from_secs(1));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(4),
        "took {took:?}"
    );
    assert!(err.to_string().contains("did not answer"), "{err}");
}

#[tokio::test]
async fn a_client_error_is_not_retried() {
    let fake = FakeLlm::start(vec![
        Step::Status(400, json!({"error": {"message": "tools[0] is invalid"}})),
        answer("never reached"),
    ])
    .await;
    let err = hello_to(&fake).await.expect_err("400 is final");
    match &err {
        LlmError::Http {
            status,
            body_excerpt,
            ..
        } => {
            assert_eq!(*status, 400);
            assert!(
                body_excerpt.contains("tools[0] is invalid"),
                "{body_excerpt}"
            );
        }
        other => panic!("expected Http 400, got {other:?}"),
    }
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(fake.remaining(), 1);
}

#[tokio::test]
async fn an_unreachable_provider_is_a_transport_error_after_retries() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let fake = FakeLlm::start(vec![]).await;
    let mut config = fake.config();
    config.providers[0].base_url = format!("http://127.0.0.1:{port}/v1");
    config.providers[0].max_retries = 1;
    let err = chat(&client(&config), None, &hello())
        .await
        .expect_err("nothing listens");
    match &err {
        LlmError::RetriesExhausted { attempts, last, .. } => {
            assert_eq!(*attempts, 2);
            assert!(matches!(**last, LlmError::Transport { .. }), "{last:?}");
        }
        other => panic!("expected RetriesExhausted, got {other:?}"),
    }
}

#[tokio::test]
async fn aliases_are_resolved_or_listed() {
    let fake = FakeLlm::start(vec![]).await;
    let mut config = fake.config();
    config.models.insert(
        "fast".into(),
        config.models.get("default").expect("alias").clone(),
    );
    let c = client(&config);
    assert_eq!(c.aliases(), vec!["default".to_owned(), "fast".to_owned()]);

    let err = chat(&c, Some("gpt-9"), &hello())
        .await
        .expect_err("unknown");
    match &err {
        LlmError::UnknownAlias { alias, known } => {
            assert_eq!(alias, "gpt-9");
            assert_eq!(known, &["default".to_owned(), "fast".to_owned()]);
        }
        other => panic!("expected UnknownAlias, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("gpt-9") && text.contains("default, fast"),
        "{text}"
    );
    assert!(fake.requests().is_empty());

    config.default_model = None;
    let err = chat(&client(&config), None, &hello())
        .await
        .expect_err("no default");
    assert!(matches!(err, LlmError::Config(_)), "{err:?}");
    assert!(err.to_string().contains("default_model"), "{err}");

    let err = chat(&client(&LlmConfig::default()), None, &hello())
        .await
        .expect_err("nothing configured");
    assert!(matches!(err, LlmError::NoProviders), "{err:?}");
}

#[tokio::test]
async fn the_api_key_is_sent_and_never_shown() {
    let var = format!("ORCHESTRATOR_TEST_LLM_KEY_{}", std::process::id());
    let key = format!("sk-test-{}", uuid::Uuid::new_v4().simple());
    let fake = FakeLlm::start(vec![
        answer("authorised"),
        Step::Status(
            401,
            json!({"error": {"message": format!("Incorrect API key provided: {key}.")}}),
        ),
    ])
    .await;
    let mut config = fake.config();
    config.providers[0].api_key_env = Some(var.clone());

    let err = LlmClient::new(&config).expect_err("the variable is not set yet");
    assert!(matches!(err, LlmError::Config(_)), "{err:?}");
    assert!(err.to_string().contains(&var), "{err}");

    std::env::set_var(&var, &key);
    let c = client(&config);
    assert!(!format!("{c:?}").contains(&key));
    chat(&c, None, &hello()).await.expect("first call");
    let err = chat(&c, None, &hello()).await.expect_err("401");
    assert!(matches!(err, LlmError::Http { status: 401, .. }), "{err:?}");
    for shown in [err.to_string(), format!("{err:?}")] {
        assert!(!shown.contains(&key), "the key leaked: {shown}");
        assert!(shown.contains("[redacted]"), "{shown}");
    }
    assert_eq!(
        fake.authorizations(),
        vec![Some(format!("Bearer {key}")), Some(format!("Bearer {key}"))]
    );
    std::env::remove_var(&var);
}
