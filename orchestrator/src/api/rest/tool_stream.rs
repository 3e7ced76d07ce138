//! The streaming form of `POST /v1/tools/call`, asked for with `Accept: text/event-stream`:
//! the same request body, the same router call (decision, audit rows, result), answered as
//! Server-Sent Events.
//!
//! - A refusal (role, policy, allowlists, arguments) is answered before any event, exactly as
//!   the call that does not stream answers it: the same HTTP status and JSON error body.
//! - Otherwise: `start` (`{"pid": N}`, the command runs) and `stdout` / `stderr` events
//!   (`{"data": ..., "encoding": "utf8"|"base64"}`) as a foreground `cmd.run` writes, then one
//!   `result` event whose data is exactly the body the call that does not stream answers (the
//!   MCP result shape, with the same output caps and truncation flags). Other tools send only
//!   `result`. If the result cannot be audited, an `error` event with the error body instead.
//! - `POST /v1/seal/invoke` has the same form for a signed `tools/call` (`seal.rs`): its
//!   `result` event carries the SEAL answer, a refusal is the SEAL error answer.
//! - A client that disconnects drops the call (`api/streaming.rs`): the command's tree is
//!   killed and its audit intent completed `cancelled` (`client_disconnected`).

use std::convert::Infallible;

use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};

use super::error::{ApiError, ErrorBody};
use crate::api::streaming::{chunk_json, Next, StreamingCall};
use crate::caller::Caller;
use crate::state::AppState;
use crate::tools::{self, CallError, OutputChunk, ToolOutcome};

/// Whether the request asks for the streaming form: its `Accept` names `text/event-stream`.
pub fn wanted(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|media| media.split(';').next())
        .any(|media| media.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// Runs the call and answers its events (or its refusal, before any event).
pub async fn call(
    state: AppState,
    caller: Caller,
    name: String,
    arguments: Value,
    sandbox: Option<dispatcher::SandboxId>,
) -> Result<Response, ApiError> {
    let mut call = StreamingCall::start(move |sink| async move {
        tools::invoke_streaming(&state, &caller, &name, arguments, sandbox, sink).await
    });
    match call.next().await {
        Some(Next::Chunk(first)) => Ok(respond(first, call, |answer| match ended(answer) {
            Ok(outcome) => result_event(outcome),
            Err(e) => error_event(e),
        })),
        Some(Next::End(answer)) => Ok(only(result_event(ended(answer)?))),
        None => Err(ApiError::internal("the call ended without an answer")),
    }
}

/// The events of a call that sent its first chunk: that chunk's, the others as they come, and
/// last the event `last` makes of the call's answer. Dropped with the response (the client
/// left), it drops the call.
pub fn respond<T: Send + 'static>(
    first: OutputChunk,
    call: StreamingCall<T>,
    last: fn(Result<T, String>) -> Event,
) -> Response {
    let rest = stream::unfold(Some(call), move |call| async move {
        let mut call = call?;
        match call.next().await {
            Some(Next::Chunk(chunk)) => Some((chunk_event(chunk), Some(call))),
            Some(Next::End(answer)) => Some((last(answer), None)),
            None => None,
        }
    });
    let first = chunk_event(first);
    let events = stream::once(async move { first })
        .chain(rest)
        .map(Ok::<_, Infallible>);
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The answer of a call that ended before any chunk: its one event.
pub fn only(event: Event) -> Response {
    Sse::new(stream::iter([Ok::<_, Infallible>(event)])).into_response()
}

/// The call's answer, or its refusal as the HTTP error the call that does not stream gives.
fn ended(answer: Result<Result<ToolOutcome, CallError>, String>) -> Result<ToolOutcome, ApiError> {
    match answer {
        Ok(Ok(outcome)) => Ok(outcome),
        Ok(Err(refused)) => Err(ApiError::from(refused)),
        Err(failed) => Err(ApiError::internal(failed)),
    }
}

fn chunk_event(chunk: OutputChunk) -> Event {
    let (name, data) = match chunk {
        OutputChunk::Started { pid } => ("start", json!({ "pid": pid })),
        OutputChunk::Stdout(bytes) => ("stdout", chunk_json(&bytes)),
        OutputChunk::Stderr(bytes) => ("stderr", chunk_json(&bytes)),
    };
    Event::default().event(name).data(data.to_string())
}

fn result_event(outcome: ToolOutcome) -> Event {
    json_event("result", &outcome.into_mcp())
}

/// An event whose data is `value` as JSON.
pub fn json_event(name: &str, value: &Value) -> Event {
    // The `result` event carries the same body as the call without streaming: serialised the
    // same way, into a buffer of its size. serde_json writes UTF-8 only.
    let data = String::from_utf8(aegis_core::arguments::to_json_vec(value)).unwrap_or_default();
    Event::default().event(name).data(data)
}

fn error_event(e: ApiError) -> Event {
    let body = ErrorBody {
        error: e.message,
        code: e.code,
        details: e.details,
    };
    Event::default()
        .event("error")
        .data(serde_json::to_string(&body).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_stream_is_asked_for_by_accept() {
        let with = |accept: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT, accept.parse().unwrap());
            wanted(&h)
        };
        assert!(with("text/event-stream"));
        assert!(with("application/json, Text/Event-Stream;q=0.5"));
        assert!(!with("application/json"));
        assert!(!with("*/*"));
        assert!(!wanted(&HeaderMap::new()));
    }
}
