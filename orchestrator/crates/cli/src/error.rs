//! Why a client verb failed, and the one mapping from a node's failed answer to it (and so to an
//! exit code). Its own module so that every verb, the credentials file included, can fail
//! without depending on the HTTP client.

use reqwest::StatusCode;
use serde_json::Value;

/// Why a client verb failed; each variant is one documented exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The node answered with a failure or refusal, or an execution did not complete (exit 1).
    #[error("{0}")]
    Failed(String),
    /// The command line or a local input is wrong (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The node could not be reached (exit 3).
    #[error("cannot reach the node at {url}: {reason} (is it running? point --url or ORCHESTRATOR_URL at it)")]
    Unreachable {
        /// The URL tried.
        url: String,
        /// The transport error.
        reason: String,
    },
    /// No key, an unknown or revoked key, a role too low, or an unsafe credentials file (exit 4).
    #[error("{0}")]
    Auth(String),
    /// The thing named does not exist (exit 5).
    #[error("{0}")]
    NotFound(String),
}

impl CliError {
    /// The process exit code of this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Failed(_) => 1,
            CliError::Usage(_) => 2,
            CliError::Unreachable { .. } => 3,
            CliError::Auth(_) => 4,
            CliError::NotFound(_) => 5,
        }
    }

    /// The error for a non-success answer: status and the node's `{error, code}` body.
    pub fn from_answer(what: &str, status: StatusCode, body: &Value) -> Self {
        let message = error_message(body);
        let code = body["code"]
            .as_str()
            .or(body["error"]["code"].as_str())
            .unwrap_or("");
        let text = if code.is_empty() {
            format!("{what}: {message} (HTTP {})", status.as_u16())
        } else {
            format!("{what}: {message} ({code}, HTTP {})", status.as_u16())
        };
        match status {
            StatusCode::UNAUTHORIZED => CliError::Auth(format!(
                "{text}; give a valid key with --key, ORCHESTRATOR_KEY or the credentials file"
            )),
            StatusCode::FORBIDDEN if matches!(code, "forbidden" | "tier" | "unauthorized") => {
                CliError::Auth(text)
            }
            StatusCode::NOT_FOUND => CliError::NotFound(text),
            _ => CliError::Failed(text),
        }
    }
}

/// The human message of an error body, whatever its exact shape (`{"error": "..."}`,
/// `{"error": {"message": "..."}}`, `{"message": "..."}`, or plain text).
pub fn error_message(body: &Value) -> String {
    body["error"]
        .as_str()
        .or(body["error"]["message"].as_str())
        .or(body["message"].as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| match body {
            Value::String(s) if !s.trim().is_empty() => s.trim().to_owned(),
            Value::Null => "no details".to_owned(),
            other => other.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_map_to_the_documented_exit_codes() {
        let body = json!({"error": "unknown key", "code": "unauthorized"});
        let e = CliError::from_answer("GET /v1/agents", StatusCode::UNAUTHORIZED, &body);
        assert_eq!(e.exit_code(), 4);
        assert!(e.to_string().contains("unknown key"), "{e}");
        let body = json!({"error": "needs an admin key", "code": "forbidden"});
        assert_eq!(
            CliError::from_answer("x", StatusCode::FORBIDDEN, &body).exit_code(),
            4
        );
        let body = json!({"error": "`rm` is not allowed", "code": "command_not_allowed"});
        assert_eq!(
            CliError::from_answer("x", StatusCode::FORBIDDEN, &body).exit_code(),
            1
        );
        let body = json!({"error": "no agent `x`", "code": "not_found"});
        let e = CliError::from_answer("GET /v1/agents/x", StatusCode::NOT_FOUND, &body);
        assert_eq!(e.exit_code(), 5);
        assert_eq!(
            e.to_string(),
            "GET /v1/agents/x: no agent `x` (not_found, HTTP 404)"
        );
        let e = CliError::from_answer("x", StatusCode::CONFLICT, &json!("plain text"));
        assert_eq!(e.exit_code(), 1);
        assert!(e.to_string().contains("plain text"));
    }

    #[test]
    fn error_messages_are_found_in_every_body_shape() {
        assert_eq!(error_message(&json!({"error": "a"})), "a");
        assert_eq!(error_message(&json!({"error": {"message": "b"}})), "b");
        assert_eq!(error_message(&json!({"message": "c"})), "c");
        assert_eq!(error_message(&Value::Null), "no details");
    }
}
