//! The streaming form of a tool call as every door runs it (SSE on REST, `InvokeStream` on gRPC,
//! progress notifications on MCP): the call in a task of its own, the output it sends on a
//! channel, and the call aborted as soon as the door drops it, which is when its client went
//! away. Aborting drops the router's future: the command's tree is killed and its intent row
//! completed `cancelled` (`client_disconnected`), as for a dropped call that does not stream.
//!
//! A door reads [`StreamingCall::next`] before it answers anything: a refusal ends the call
//! before its first chunk, so the door answers it exactly as the call that does not stream.

use std::future::Future;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::tools::{OutputChunk, OutputSink};

/// What a streaming call gives next.
#[derive(Debug)]
pub enum Next<T> {
    /// Output (or the command's start), while the call runs.
    Chunk(OutputChunk),
    /// The call's answer, last; `Err` when its task failed (a panic).
    End(Result<T, String>),
}

/// A running streaming call; dropping it aborts the call.
pub struct StreamingCall<T> {
    output: mpsc::UnboundedReceiver<OutputChunk>,
    task: Option<JoinHandle<T>>,
}

impl<T: Send + 'static> StreamingCall<T> {
    /// Starts `call` with the sink its output goes to.
    pub fn start<F, Fut>(call: F) -> Self
    where
        F: FnOnce(OutputSink) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
    {
        let (sink, output) = mpsc::unbounded_channel();
        // In the caller's span, so the call's logs keep its request id.
        let work = call(sink).instrument(tracing::Span::current());
        Self {
            output,
            task: Some(tokio::spawn(work)),
        }
    }

    /// The next chunk; once the call has ended and its chunks are read, its answer; then `None`.
    pub async fn next(&mut self) -> Option<Next<T>> {
        // The call holds the sink until it ends, so the channel closes only after its last chunk.
        if let Some(chunk) = self.output.recv().await {
            return Some(Next::Chunk(chunk));
        }
        // Awaited by reference: if this future is dropped meanwhile, `Drop` still aborts the task.
        let task = self.task.as_mut()?;
        let ended = task.await.map_err(|e| e.to_string());
        self.task = None;
        Some(Next::End(ended))
    }
}

impl<T> Drop for StreamingCall<T> {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// A SEAL envelope invoked in its streaming form through the gateway, its calls counted under
/// `door` (`SealHttp`, `SealGrpc`): what both SEAL doors start before they answer anything.
pub fn seal_invoke(
    state: crate::state::AppState,
    door: crate::metrics::Door,
    envelope: String,
) -> StreamingCall<Result<serde_json::Value, crate::gateway::Refusal>> {
    StreamingCall::start(move |sink| async move {
        let services = state.gateway_services();
        let call = state.gateway.invoke_streaming(&services, &envelope, sink);
        crate::metrics::through(door, call).await
    })
}

/// An output chunk as JSON text: `{"data": ..., "encoding": "utf8"|"base64"}` (text as is,
/// other bytes as base64, like `cmd.run`'s own `stdout_encoding`).
pub fn chunk_json(bytes: &[u8]) -> serde_json::Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::json!({"data": text, "encoding": "utf8"}),
        Err(_) => serde_json::json!({
            "data": dispatcher::encoding::base64_encode(bytes),
            "encoding": "base64",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn chunks_come_before_the_answer_and_a_dropped_call_is_aborted() {
        let mut call = StreamingCall::start(|sink| async move {
            let _ = sink.send(OutputChunk::Stdout(b"a".to_vec()));
            7
        });
        assert!(
            matches!(call.next().await, Some(Next::Chunk(OutputChunk::Stdout(b))) if b == b"a")
        );
        assert!(matches!(call.next().await, Some(Next::End(Ok(7)))));
        assert!(call.next().await.is_none());

        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let call = StreamingCall::start(|_sink| async move {
            // Held until the task is dropped.
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        drop(call);
        assert!(rx.await.is_err(), "the aborted call dropped what it held");
    }

    #[test]
    fn chunks_are_text_or_base64() {
        assert_eq!(chunk_json(b"hi\n")["encoding"], "utf8");
        assert_eq!(chunk_json(b"\xff")["data"], "/w==");
    }
}
