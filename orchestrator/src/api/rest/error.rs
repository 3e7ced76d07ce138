//! The one mapping from internal errors to HTTP statuses and JSON error bodies.
//!
//! Every error body has the same shape: `{"error": "<message>", "code": "<code>", "details": ...}`
//! (`error` as a plain string, as AEGIS clients expect). Errors that axum produces before a
//! handler runs (a body that is not JSON, a wrong content type, a body too large, a path or query
//! that does not parse, a wrong method) and unknown routes get the same shape through
//! [`json_errors`] and [`no_route`], so a client needs one error parser for the whole API.

use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::Value;

use crate::auth::AuthError;
use crate::registry::RegistryError;
use crate::tools::{CallError, ToolError};

/// An error answer of the REST API.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable code.
    pub code: String,
    /// Human message.
    pub message: String,
    /// Structured details.
    pub details: Option<Value>,
}

/// The JSON body of every error.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: String,
    /// Stable machine-readable code.
    pub code: String,
    /// Structured details (violations with paths and lines, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

impl ApiError {
    /// An error with a status, code and message.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code.to_owned(),
            message: message.into(),
            details: None,
        }
    }

    /// 403 for a role that may not do something.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// 404 for something the caller named that is not there (or not theirs to see).
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 400 for a malformed request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 500, logging the cause.
    pub fn internal(e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "request failed");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("internal error: {e}"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.message,
            code: self.code,
            details: self.details,
        };
        (self.status, Json(body)).into_response()
    }
}

/// Status for a tool failure code.
pub fn status_of_tool_code(code: &str) -> StatusCode {
    match code {
        "not_found" => StatusCode::NOT_FOUND,
        "conflict" => StatusCode::CONFLICT,
        "invalid_manifest" | "invalid_arguments" | "invalid_input" | "unsupported" => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        "forbidden" | "path_not_allowed" | "command_not_allowed" | "tool_not_in_manifest" => {
            StatusCode::FORBIDDEN
        }
        "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
        "depth_limit" => StatusCode::FORBIDDEN,
        "concurrency_limit" => StatusCode::TOO_MANY_REQUESTS,
        "internal" => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::BAD_REQUEST,
    }
}

impl From<ToolError> for ApiError {
    fn from(e: ToolError) -> Self {
        Self {
            status: status_of_tool_code(e.code),
            code: e.code.to_owned(),
            message: e.message,
            details: e.details,
        }
    }
}

impl From<CallError> for ApiError {
    fn from(e: CallError) -> Self {
        let message = e.to_string();
        match e {
            CallError::UnknownTool { .. } => {
                Self::new(StatusCode::NOT_FOUND, "unknown_tool", message)
            }
            CallError::InvalidArguments { violations, .. } => Self {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                code: "invalid_arguments".to_owned(),
                message,
                details: serde_json::to_value(violations).ok(),
            },
            CallError::Denied { denial, .. } => match denial.code {
                "sandbox_required" => Self::new(StatusCode::BAD_REQUEST, denial.code, message),
                "sandbox_unavailable" => Self::new(StatusCode::NOT_FOUND, denial.code, message),
                code => Self::new(StatusCode::FORBIDDEN, code, message),
            },
            CallError::Unavailable { .. } => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "tool_unavailable", message)
            }
            CallError::Audit(e) => Self::internal(e),
            CallError::Catalog(e) => Self::internal(e),
        }
    }
}

impl From<RegistryError> for ApiError {
    fn from(e: RegistryError) -> Self {
        crate::tools::registry_error(e).into()
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Missing | AuthError::Invalid(_) => {
                Self::new(StatusCode::UNAUTHORIZED, "unauthorized", e.to_string())
            }
            AuthError::ContextUnusable { .. } => {
                Self::new(StatusCode::FORBIDDEN, "context_unavailable", e.to_string())
            }
            other => Self::internal(other),
        }
    }
}

impl From<crate::database::DbError> for ApiError {
    fn from(e: crate::database::DbError) -> Self {
        Self::internal(e)
    }
}

impl From<crate::audit::VerifyError> for ApiError {
    fn from(e: crate::audit::VerifyError) -> Self {
        match e {
            crate::audit::VerifyError::IncompleteAnchor => Self::bad_request(e.to_string()),
            crate::audit::VerifyError::Db(db) => db.into(),
        }
    }
}

/// The largest request body axum accepts by default (its `DefaultBodyLimit`), for the message.
const BODY_LIMIT_MIB: usize = 2;

/// How much of a plain-text rejection we read to explain it.
const REJECTION_TEXT_MAX: usize = 8 * 1024;

/// True when a response already carries a JSON body (ours, or a JSON-RPC answer).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .is_some_and(|v| v == "application/json" || v.ends_with("+json"))
}

/// Middleware: rewrites every error response that is not JSON into the one error body.
///
/// axum's extractors answer their rejections in plain text (or with no body at all for a wrong
/// method); this is the one place that turns them into `ErrorBody` with a stable code and a
/// message saying what to change. Responses that are already JSON pass untouched.
pub async fn json_errors(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) || is_json(response.headers()) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, REJECTION_TEXT_MAX)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let allow = parts.headers.get(header::ALLOW).cloned();
    let allowed = allow
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mut out = explain(status, &method, &path, &text, &allowed).into_response();
    if let Some(allow) = allow {
        out.headers_mut().insert(header::ALLOW, allow);
    }
    out
}

/// The error body for a rejection axum answered with `status` and plain `text`.
fn explain(status: StatusCode, method: &Method, path: &str, text: &str, allow: &str) -> ApiError {
    let text = text.trim_end_matches('.');
    match status {
        StatusCode::BAD_REQUEST if text.starts_with("Failed to parse the request body as JSON") => {
            ApiError::new(
                status,
                "invalid_json",
                format!("{text}. Send a well-formed JSON document as the request body."),
            )
        }
        StatusCode::BAD_REQUEST if text.starts_with("Failed to deserialize query string") => {
            ApiError::new(
                status,
                "invalid_query",
                format!(
                    "{text}. The query parameters of {method} {path} are listed in /openapi.json."
                ),
            )
        }
        StatusCode::BAD_REQUEST if text.starts_with("Invalid URL") => {
            ApiError::new(
                status,
                "invalid_path",
                format!("{text}. Check the identifiers in the path of {method} {path} (UUIDs where /openapi.json says uuid)."),
            )
        }
        StatusCode::BAD_REQUEST => ApiError::new(
            status,
            "bad_request",
            format!("{}. Fix the request and send it again.", or_default(text, "the request is malformed")),
        ),
        StatusCode::NOT_FOUND => no_route_error(method, path),
        StatusCode::METHOD_NOT_ALLOWED => ApiError::new(
            status,
            "method_not_allowed",
            if allow.is_empty() {
                // axum adds `Allow` outside this middleware: point at it.
                format!("{path} does not accept {method}; the `Allow` header of this answer lists the methods it does accept")
            } else {
                format!("{path} does not accept {method}; use {allow}")
            },
        ),
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            status,
            "payload_too_large",
            format!("the request body is larger than the {BODY_LIMIT_MIB} MiB limit; send a smaller body"),
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(
            status,
            "unsupported_media_type",
            format!(
                "{}; send the body as JSON with the header `Content-Type: application/json`",
                or_default(text, "this content type is not accepted")
            ),
        ),
        StatusCode::UNPROCESSABLE_ENTITY => ApiError::new(
            status,
            "invalid_body",
            format!(
                "{}. The body {method} {path} expects is described in /openapi.json.",
                or_default(text, "the request body does not have the expected shape")
            ),
        ),
        StatusCode::UNAUTHORIZED => ApiError::new(
            status,
            "unauthorized",
            "send an API key as `Authorization: Bearer <key>`",
        ),
        other if other.is_server_error() => {
            tracing::error!(status = %other, body = %text, "a server error without a JSON body");
            ApiError::new(
                other,
                "internal",
                format!("internal error ({}); the server log has the details", or_default(text, other.as_str())),
            )
        }
        other => ApiError::new(
            other,
            &other
                .canonical_reason()
                .unwrap_or("error")
                .to_ascii_lowercase()
                .replace([' ', '-'], "_"),
            or_default(text, other.canonical_reason().unwrap_or("request refused")),
        ),
    }
}

fn or_default<'a>(text: &'a str, default: &'a str) -> &'a str {
    if text.is_empty() {
        default
    } else {
        text
    }
}

fn no_route_error(method: &Method, path: &str) -> ApiError {
    ApiError::not_found(format!(
        "there is no route {method} {path}; the routes of this API are listed in /openapi.json"
    ))
}

/// The fallback of the router: an unknown route is a JSON 404 like any other error.
pub async fn no_route(method: Method, uri: Uri) -> ApiError {
    no_route_error(&method, uri.path())
}
