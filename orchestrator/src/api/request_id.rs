//! The request id of every call through every door (REST, SEAL over HTTP, MCP, gRPC).
//!
//! One tower layer, put around both servers: it takes the caller's `x-request-id` when it is
//! well-formed (so a client or a proxy can correlate its own logs with ours) or makes one, runs the
//! request inside a `request` tracing span carrying it (so every log line of the call names it),
//! hands it to handlers as a [`RequestId`] extension, and returns it in the response's
//! `x-request-id` header. A malformed id is replaced rather than refused: logs must never carry
//! what a caller typed into them unchecked, and a request is not wrong because of its label.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::http::{HeaderValue, Request, Response};
use tracing::Instrument;

/// The header that carries the id, both ways.
pub const HEADER: &str = "x-request-id";

/// The longest caller-provided id we keep.
const MAX_LEN: usize = 128;

/// The id of the current request, as a request extension for handlers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

/// True for an id we accept from a caller: 1 to 128 of `A-Z a-z 0-9 - _ . : /`.
pub fn well_formed(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'/'))
}

/// The layer; `surface` names the listener in the span (`http` or `grpc`).
#[derive(Debug, Clone, Copy)]
pub struct RequestIdLayer {
    surface: &'static str,
}

impl RequestIdLayer {
    /// A layer for the listener called `surface`.
    pub fn new(surface: &'static str) -> Self {
        Self { surface }
    }
}

impl<S> tower::Layer<S> for RequestIdLayer {
    type Service = RequestIdService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestIdService {
            inner,
            surface: self.surface,
        }
    }
}

/// The service the layer wraps around a server.
#[derive(Debug, Clone)]
pub struct RequestIdService<S> {
    inner: S,
    surface: &'static str,
}

impl<S, B, RB> tower::Service<Request<B>> for RequestIdService<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: 'static,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let id = req
            .headers()
            .get(HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| well_formed(v))
            .map(str::to_owned)
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        // Well-formed ids are visible ASCII, so this conversion cannot fail.
        let header = HeaderValue::from_str(&id).ok();
        if let Some(h) = &header {
            req.headers_mut().insert(HEADER, h.clone());
        }
        // A span's level decides whether it exists under the log filter: at ERROR it is there
        // whenever any line is logged, so a warning of a node at `log.level: warn` still names
        // its request.
        let span = tracing::error_span!(
            "request",
            request_id = %id,
            surface = self.surface,
        );
        req.extensions_mut().insert(RequestId(id));
        let future = {
            let _entered = span.enter();
            self.inner.call(req)
        };
        Box::pin(
            async move {
                let mut response = future.await?;
                if let Some(h) = header {
                    response.headers_mut().insert(HEADER, h);
                }
                Ok(response)
            }
            .instrument(span),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::well_formed;

    #[test]
    fn accepts_ordinary_ids_and_refuses_the_rest() {
        assert!(well_formed("3f1c2a9e-0000-4000-8000-000000000000"));
        assert!(well_formed("trace:abc/1.2_x"));
        assert!(!well_formed(""));
        assert!(!well_formed("has space"));
        assert!(!well_formed("new\nline"));
        assert!(!well_formed(&"a".repeat(129)));
    }
}
