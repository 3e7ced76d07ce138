//! The one mapping from internal errors to HTTP statuses and JSON error bodies.
//!
//! Every error body has the same shape: `{"error": "<message>", "code": "<code>", "details": ...}`
//! (`error` as a plain string, as AEGIS clients expect).

use axum::http::StatusCode;
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
            other => Self::internal(other),
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
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
