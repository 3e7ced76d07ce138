//! The control API's error body, `{"code": <HTTP status>, "message": "..."}` (and an optional
//! machine-readable `error_code`), and the reading of request bodies into typed requests with
//! the offending field named. The SDK shows `"<status>: <message>"` to its caller and maps 401
//! and 429 to their own exceptions, so the message is what a user reads.

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// A failed control API call: its HTTP status (repeated in `code`) and a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    /// The HTTP status the error is answered with.
    pub code: u16,
    pub message: String,
    /// A stable machine-readable reason, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
}

impl ApiError {
    /// An error answered with `status`.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError {
            code: status,
            message: message.into(),
            error_code: None,
        }
    }

    /// 400: the request is malformed or out of range.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, message)
    }

    /// The same error with a machine-readable reason.
    pub fn with_error_code(mut self, error_code: impl Into<String>) -> Self {
        self.error_code = Some(error_code.into());
        self
    }

    /// The HTTP status to answer with.
    pub fn status(&self) -> u16 {
        self.code
    }

    /// The JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_else(|_| br#"{"code":500,"message":"error"}"#.to_vec())
    }
}

/// Longest part of a parser's message repeated in an error.
const DETAIL_LIMIT: usize = 200;

/// Reads a JSON request body of at most `max` bytes into `T`. Errors are 400 (413 for size)
/// and name the JSON path of the field that was wrong.
pub fn parse_body<T: DeserializeOwned>(body: &[u8], max: usize) -> Result<T, ApiError> {
    if body.len() > max {
        return Err(ApiError::new(
            413,
            format!(
                "request body of {} bytes is larger than the limit of {max} bytes",
                body.len()
            ),
        ));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "request body is empty; a JSON object is required",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        json_error(&path, e.into_inner())
    })?;
    de.end().map_err(|e| json_error(".", e))?;
    Ok(value)
}

/// As [`parse_body`], but an empty body (the API marks some bodies optional) is `T::default()`.
pub fn parse_optional_body<T: DeserializeOwned + Default>(
    body: &[u8],
    max: usize,
) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) && body.len() <= max {
        return Ok(T::default());
    }
    parse_body(body, max)
}

fn json_error(path: &str, e: serde_json::Error) -> ApiError {
    let mut text = e.to_string();
    if let Some(i) = text.rfind(" at line ") {
        text.truncate(i);
    }
    if text.len() > DETAIL_LIMIT {
        let mut end = DETAIL_LIMIT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    if path == "." {
        ApiError::bad_request(format!("invalid JSON body: {text}"))
    } else {
        ApiError::bad_request(format!("invalid JSON body at `{path}`: {text}"))
    }
}
