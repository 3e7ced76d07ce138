//! The HTTP underneath rmcp's Streamable HTTP client: our reqwest, pinned by the egress gate.
//!
//! rmcp's client transport speaks MCP (initialise, sessions, request ids, SSE responses) over
//! any [`StreamableHttpClient`]. This one is a reqwest 0.12 client built for one connection to
//! one server: it knows only the addresses [`crate::Egress::admit`] checked for the
//! server's host (any other name is refused, nothing resolves twice), takes no proxy from the
//! environment, follows no redirect, and carries the server's credential headers. Every
//! response body is read under a byte cap, counted chunk by chunk; a response over it fails,
//! and the cap hit is counted so the caller can name the failure (rmcp reports a broken event
//! stream only as "closed before its final response").
//!
//! The standalone GET stream (server-initiated messages) is declined as a server without SSE
//! would decline it: nothing here listens for notifications; tool listings are refreshed by age.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, BoxStream, StreamExt};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use reqwest::StatusCode;
use rmcp::model::{ClientJsonRpcMessage, JsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    HttpStatusError, SseError, StreamableHttpClient, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use sse_stream::{Sse, SseStream};

/// The session header of Streamable HTTP.
const SESSION_HEADER: &str = "mcp-session-id";
/// Bytes of a failed response's body kept for the error message.
const ERROR_BODY_PREFIX: usize = 512;

/// A failure of the HTTP layer, as rmcp's transport carries it to the caller.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HttpError {
    /// Connection, TLS or protocol failure (the error and its causes, on one line).
    #[error("{0}")]
    Request(String),
    /// A response body was larger than the cap.
    #[error("the server's response is larger than {max} bytes (mcp_servers max_response_bytes)")]
    TooLarge {
        /// The cap, bytes.
        max: usize,
    },
    /// A status the transport cannot use, with the start of the body.
    #[error("HTTP {status}{}", if .body.is_empty() { String::new() } else { format!(": {}", .body) })]
    Status {
        /// The status code.
        status: u16,
        /// The first bytes of the body, as text.
        body: String,
    },
}

/// The HTTP client of one connection to one MCP server.
#[derive(Clone)]
pub struct PinnedHttp {
    client: reqwest::Client,
    headers: HeaderMap,
    /// The credential values, to take out of anything a server sends back.
    redactor: Arc<super::redact::Redactor>,
    max_response_bytes: usize,
    oversize: Arc<AtomicU64>,
}

impl PinnedHttp {
    /// A client that reaches `host` only at `addrs` (the egress gate's answer), sending
    /// `headers` (the server's credentials) with every request.
    pub fn new(
        host: &str,
        host_is_name: bool,
        addrs: &[SocketAddr],
        headers: HeaderMap,
        connect_timeout: Duration,
        max_response_bytes: usize,
    ) -> Result<Self, HttpError> {
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(connect_timeout)
            .user_agent(concat!("aegis-orchestrator/", env!("CARGO_PKG_VERSION")))
            .dns_resolver(Arc::new(crate::fetch::PinnedOnly));
        if host_is_name {
            builder = builder.resolve_to_addrs(host, addrs);
        }
        let client = builder
            .build()
            .map_err(|e| HttpError::Request(crate::fetch::error_chain(&e)))?;
        let redactor = super::redact::Redactor::for_headers(&headers);
        Ok(Self {
            client,
            headers,
            redactor: Arc::new(redactor),
            max_response_bytes,
            oversize: Arc::new(AtomicU64::new(0)),
        })
    }

    /// `text` with every credential value of this connection masked, in every form a client
    /// could undo (a server may echo a header; what it says goes to callers, models and audit
    /// reasons).
    pub fn redact(&self, text: &str) -> String {
        self.redactor.text(text)
    }

    /// The redactor of this connection's credentials, for values (results, listings).
    pub fn redactor(&self) -> &Arc<super::redact::Redactor> {
        &self.redactor
    }

    /// How many responses were refused for their size so far (read before and after a call).
    pub fn oversize_count(&self) -> u64 {
        self.oversize.load(Ordering::SeqCst)
    }

    fn too_large(&self) -> HttpError {
        self.oversize.fetch_add(1, Ordering::SeqCst);
        HttpError::TooLarge {
            max: self.max_response_bytes,
        }
    }

    fn request(
        &self,
        method: reqwest::Method,
        uri: &str,
        session_id: Option<&str>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .request(method, uri)
            .headers(self.headers.clone());
        // rmcp's protocol headers (MCP-Protocol-Version and the like).
        for (name, value) in custom_headers {
            request = request.header(name, value);
        }
        if let Some(id) = session_id {
            request = request.header(SESSION_HEADER, id);
        }
        request
    }

    /// The whole body, refused past `max` bytes.
    async fn read_bounded(
        &self,
        mut response: reqwest::Response,
        max: usize,
    ) -> Result<Vec<u8>, HttpError> {
        if response
            .content_length()
            .is_some_and(|length| length > max as u64)
        {
            return Err(self.too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(request_error)? {
            if chunk.len() > max - body.len() {
                return Err(self.too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// An event stream whose bytes are counted; past `max` it ends with an error.
    fn bounded_events(
        &self,
        response: reqwest::Response,
        max: usize,
    ) -> BoxStream<'static, Result<Sse, SseError>> {
        let this = self.clone();
        let bytes = stream::unfold(
            (response, 0usize, false),
            move |(mut response, read, failed)| {
                let this = this.clone();
                async move {
                    if failed {
                        return None;
                    }
                    match response.chunk().await {
                        Ok(Some(chunk)) if chunk.len() > max.saturating_sub(read) => {
                            Some((Err(this.too_large()), (response, read, true)))
                        }
                        Ok(Some(chunk)) => {
                            let read = read + chunk.len();
                            Some((Ok(chunk), (response, read, false)))
                        }
                        Ok(None) => None,
                        Err(e) => Some((Err(request_error(e)), (response, read, true))),
                    }
                }
            },
        );
        SseStream::from_bytes_stream(bytes).boxed()
    }
}

fn request_error(e: reqwest::Error) -> HttpError {
    HttpError::Request(crate::fetch::error_chain(&e))
}

fn client_error(e: HttpError) -> StreamableHttpError<HttpError> {
    StreamableHttpError::Client(e)
}

fn is_media_type(value: Option<&HeaderValue>, expected: &str) -> bool {
    value
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case(expected))
}

impl StreamableHttpClient for PinnedHttp {
    type Error = HttpError;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        _limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let with_session = session_id.is_some();
        let response = self
            .request(
                reqwest::Method::POST,
                &uri,
                session_id.as_deref(),
                custom_headers,
            )
            .header(ACCEPT, "application/json, text/event-stream")
            .json(&message)
            .send()
            .await
            .map_err(|e| client_error(request_error(e)))?;
        let status = response.status();
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && with_session {
            return Err(StreamableHttpError::SessionExpired);
        }
        let awaits_nothing = !matches!(message, JsonRpcMessage::Request(_));
        let new_session = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let content_type = response.headers().get(CONTENT_TYPE).cloned();
        if !status.is_success() {
            if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
                return Err(HttpStatusError::new(status.as_u16(), None).into());
            }
            let body = self
                .read_bounded(response, self.max_response_bytes)
                .await
                .map_err(client_error)?;
            // A JSON-RPC error in a 4xx body is the server's answer to the request.
            if is_media_type(content_type.as_ref(), "application/json") {
                if let Ok(error @ JsonRpcMessage::Error(_)) =
                    serde_json::from_slice::<ServerJsonRpcMessage>(&body)
                {
                    return Ok(StreamableHttpPostResponse::Json(error, new_session));
                }
            }
            // Redacted whole, then cut: a cut through a credential would leave its start.
            let text = self.redact(String::from_utf8_lossy(&body).trim());
            return Err(client_error(HttpError::Status {
                status: status.as_u16(),
                body: super::result::cut(&text, ERROR_BODY_PREFIX).to_owned(),
            }));
        }
        if is_media_type(content_type.as_ref(), "text/event-stream") {
            let events = self.bounded_events(response, self.max_response_bytes);
            return Ok(StreamableHttpPostResponse::Sse(events, new_session));
        }
        if is_media_type(content_type.as_ref(), "application/json") {
            let body = self
                .read_bounded(response, self.max_response_bytes)
                .await
                .map_err(client_error)?;
            return match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
                Ok(parsed) => Ok(StreamableHttpPostResponse::Json(parsed, new_session)),
                Err(_) if awaits_nothing => Ok(StreamableHttpPostResponse::Accepted),
                Err(e) => Err(StreamableHttpError::Deserialize(e)),
            };
        }
        if awaits_nothing {
            // A notification answered 200 with an empty or odd body: nothing is waited for.
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        Err(StreamableHttpError::UnexpectedContentType(
            content_type.and_then(|v| v.to_str().ok().map(str::to_owned)),
        ))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        _auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        let response = self
            .request(
                reqwest::Method::DELETE,
                &uri,
                Some(&session_id),
                custom_headers,
            )
            .send()
            .await
            .map_err(|e| client_error(request_error(e)))?;
        let status = response.status();
        if status.is_success() || status == StatusCode::METHOD_NOT_ALLOWED {
            Ok(())
        } else {
            Err(client_error(HttpError::Status {
                status: status.as_u16(),
                body: String::new(),
            }))
        }
    }

    async fn get_stream(
        &self,
        _uri: Arc<str>,
        _session_id: Option<Arc<str>>,
        _last_event_id: Option<String>,
        _auth_header: Option<String>,
        _custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        Err(StreamableHttpError::ServerDoesNotSupportSse)
    }
}
