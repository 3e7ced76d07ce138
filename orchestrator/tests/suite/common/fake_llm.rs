//! A scripted OpenAI-compatible chat-completions server, so tests drive the LLM loop exactly.
//!
//! Each `POST /v1/chat/completions` takes the next [`Step`] of the script: a whole answer, an
//! error status, or a connection that is accepted and never answered. Every request body and
//! its `Authorization` header is recorded, so a test can check what the service sent. When the
//! script runs out the server answers 500, which a test sees as a failure rather than a hang.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use orchestrator::llm::{LlmConfig, ModelRef, ProviderConfig};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What the server does with one request.
#[derive(Debug, Clone)]
pub enum Step {
    /// 200 with this body (a whole `chat.completion` object).
    Reply(Value),
    /// This status with this JSON body.
    Status(u16, Value),
    /// This status, these headers (e.g. `Retry-After`), this JSON body.
    Respond(u16, Vec<(String, String)>, Value),
    /// Accept the request and never answer (until the server is dropped).
    Hang,
}

/// Usage reported by the helpers' answers.
const USAGE: (u64, u64) = (20, 10);

/// An assistant message calling `calls` in order (ids `call_1`, `call_2`, ... within this step;
/// arguments as JSON text), finish reason `tool_calls`.
pub fn tool_calls(calls: &[(&str, Value)]) -> Step {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({
                "id": format!("call_{}", i + 1),
                "type": "function",
                "function": {"name": name, "arguments": args.to_string()},
            })
        })
        .collect();
    Step::Reply(completion(
        json!({"role": "assistant", "content": null, "tool_calls": calls}),
        "tool_calls",
    ))
}

/// A final assistant answer `text`, finish reason `stop`.
pub fn answer(text: &str) -> Step {
    Step::Reply(completion(
        json!({"role": "assistant", "content": text}),
        "stop",
    ))
}

/// 429 with `Retry-After: <secs>`.
pub fn rate_limited(retry_after_secs: u64) -> Step {
    Step::Respond(
        429,
        vec![("retry-after".into(), retry_after_secs.to_string())],
        json!({"error": {"message": "rate limited", "type": "rate_limit_error"}}),
    )
}

fn completion(message: Value, finish_reason: &str) -> Value {
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": USAGE.0,
            "completion_tokens": USAGE.1,
            "total_tokens": USAGE.0 + USAGE.1,
        },
    })
}

#[derive(Default)]
struct Recorded {
    script: VecDeque<Step>,
    bodies: Vec<Value>,
    authorizations: Vec<Option<String>>,
}

#[derive(Clone)]
struct Shared {
    recorded: Arc<Mutex<Recorded>>,
    stop: CancellationToken,
}

/// A running fake provider; stops when dropped.
pub struct FakeLlm {
    /// `http://127.0.0.1:PORT/v1`, what a provider's `base_url` should be.
    pub base_url: String,
    /// The listening address.
    pub addr: SocketAddr,
    shared: Shared,
    server: JoinHandle<()>,
}

impl FakeLlm {
    /// Serves `script` on a random loopback port.
    pub async fn start(script: Vec<Step>) -> FakeLlm {
        let shared = Shared {
            recorded: Arc::new(Mutex::new(Recorded {
                script: script.into(),
                ..Recorded::default()
            })),
            stop: CancellationToken::new(),
        };
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake llm");
        let addr = listener.local_addr().expect("fake llm addr");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeLlm {
            base_url: format!("http://{addr}/v1"),
            addr,
            shared,
            server,
        }
    }

    /// Every request body received, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.lock().bodies.clone()
    }

    /// The `Authorization` header of every request, in order.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.lock().authorizations.clone()
    }

    /// Steps not served yet.
    pub fn remaining(&self) -> usize {
        self.lock().script.len()
    }

    /// One provider `fake` at this server, alias `default` -> model `scripted` (the default),
    /// timeout 2 s, 3 retries from 50 ms.
    pub fn config(&self) -> LlmConfig {
        LlmConfig {
            providers: vec![ProviderConfig {
                name: "fake".into(),
                base_url: self.base_url.clone(),
                api_key_env: None,
                timeout_secs: 2,
                max_retries: 3,
                initial_backoff_ms: 50,
            }],
            models: [(
                "default".to_owned(),
                ModelRef {
                    provider: "fake".into(),
                    model: "scripted".into(),
                    temperature: None,
                    max_tokens: None,
                },
            )]
            .into(),
            default_model: Some("default".into()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.shared
            .recorded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.shared.stop.cancel();
        self.server.abort();
    }
}

async fn complete(State(shared): State<Shared>, headers: HeaderMap, body: Json<Value>) -> Response {
    let step = {
        let mut r = shared.recorded.lock().unwrap_or_else(|e| e.into_inner());
        r.bodies.push(body.0);
        r.authorizations.push(
            headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
        );
        r.script.pop_front()
    };
    match step {
        Some(Step::Reply(body)) => Json(body).into_response(),
        Some(Step::Status(status, body)) => with_status(status, Vec::new(), body),
        Some(Step::Respond(status, headers, body)) => with_status(status, headers, body),
        Some(Step::Hang) => {
            shared.stop.cancelled().await;
            with_status(503, Vec::new(), json!({"error": "fake llm stopped"}))
        }
        None => with_status(500, Vec::new(), json!({"error": "script exhausted"})),
    }
}

fn with_status(status: u16, headers: Vec<(String, String)>, body: Value) -> Response {
    let status = StatusCode::from_u16(status).expect("a valid status in the script");
    let mut response = (status, Json(body)).into_response();
    for (name, value) in headers {
        response.headers_mut().insert(
            HeaderName::try_from(name).expect("a valid header name in the script"),
            HeaderValue::try_from(value).expect("a valid header value in the script"),
        );
    }
    response
}
