//! Connect's error codes, their HTTP statuses, and the error's JSON form (the body of a failed
//! unary call and the `error` of a stream's end message).

use serde::{Deserialize, Serialize};

/// The Connect error codes (the gRPC codes, spelled in snake case on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// Every code, for exhaustive tests and lookups.
    pub const ALL: [Code; 16] = [
        Code::Canceled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// The code as the wire spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The code a wire string names, if any.
    pub fn parse(text: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.as_str() == text)
    }

    /// The HTTP status of a failed unary call with this code (the Connect protocol's table).
    /// The SDK branches on the code in the body, so the status matters to proxies and logs.
    pub fn http_status(self) -> u16 {
        match self {
            Code::Canceled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        }
    }

    /// What a Connect client makes of an HTTP error status that came without a Connect error
    /// body (a proxy answering instead of the server).
    pub fn from_http_status(status: u16) -> Code {
        match status {
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One typed detail of an error: a protobuf type name and the message's bytes, base64 without
/// padding. Carried through as it came; this node sends none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    #[serde(rename = "type")]
    pub type_name: String,
    pub value: String,
}

/// A failed call: its code, a message for people, and optional details.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
    pub details: Vec<ErrorDetail>,
}

/// The JSON form. A code the reader does not know becomes `unknown`, as Connect clients do.
#[derive(Serialize, Deserialize)]
struct Wire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    code: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    details: Vec<ErrorDetail>,
}

impl ConnectError {
    /// An error with this code and message.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }

    /// The content type of a failed unary call's body (JSON whatever the call's codec).
    pub const CONTENT_TYPE: &'static str = "application/json";

    /// The HTTP status a failed unary call answers with.
    pub fn http_status(&self) -> u16 {
        self.code.http_status()
    }

    /// The JSON value `{"code", "message", "details"}` (empty message and details left out).
    pub fn to_json_value(&self) -> serde_json::Value {
        serde_json::to_value(Wire {
            code: Some(self.code.as_str().to_owned()),
            message: self.message.clone(),
            details: self.details.clone(),
        })
        .unwrap_or_else(|_| serde_json::json!({ "code": self.code.as_str() }))
    }

    /// The body of a failed unary call.
    pub fn to_json(&self) -> Vec<u8> {
        self.to_json_value().to_string().into_bytes()
    }

    /// Reads the JSON form; a missing or unknown code is `unknown`.
    pub fn from_json_value(value: serde_json::Value) -> Result<Self, serde_json::Error> {
        let wire: Wire = serde_json::from_value(value)?;
        Ok(ConnectError {
            code: wire
                .code
                .as_deref()
                .and_then(Code::parse)
                .unwrap_or(Code::Unknown),
            message: wire.message,
            details: wire.details,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_map_to_the_protocol_statuses() {
        let table = [
            ("canceled", 499),
            ("unknown", 500),
            ("invalid_argument", 400),
            ("deadline_exceeded", 504),
            ("not_found", 404),
            ("already_exists", 409),
            ("permission_denied", 403),
            ("resource_exhausted", 429),
            ("failed_precondition", 400),
            ("aborted", 409),
            ("out_of_range", 400),
            ("unimplemented", 501),
            ("internal", 500),
            ("unavailable", 503),
            ("data_loss", 500),
            ("unauthenticated", 401),
        ];
        for (code, (name, status)) in Code::ALL.into_iter().zip(table) {
            assert_eq!(code.as_str(), name);
            assert_eq!(Code::parse(name), Some(code));
            assert_eq!(code.http_status(), status, "{name}");
            assert_eq!(serde_json::to_value(code).unwrap(), serde_json::json!(name));
        }
        assert_eq!(Code::parse("cancelled"), None);
        assert_eq!(Code::from_http_status(404), Code::Unimplemented);
        assert_eq!(Code::from_http_status(418), Code::Unknown);
    }

    #[test]
    fn error_json_as_connect_clients_read_it() {
        let err = ConnectError::new(Code::NotFound, "process with pid 7 not found");
        assert_eq!(
            String::from_utf8(err.to_json()).unwrap(),
            r#"{"code":"not_found","message":"process with pid 7 not found"}"#
        );
        assert_eq!(err.http_status(), 404);
        let back = ConnectError::from_json_value(err.to_json_value()).unwrap();
        assert_eq!(back, err);

        let with_detail = serde_json::json!({
            "code": "invalid_argument",
            "message": "bad",
            "details": [{"type": "google.rpc.ErrorInfo", "value": "CgNmb28"}]
        });
        let parsed = ConnectError::from_json_value(with_detail.clone()).unwrap();
        assert_eq!(parsed.details[0].type_name, "google.rpc.ErrorInfo");
        assert_eq!(parsed.to_json_value(), with_detail);

        let strange = ConnectError::from_json_value(serde_json::json!({"code": "teapot"})).unwrap();
        assert_eq!(strange.code, Code::Unknown);
        assert!(ConnectError::from_json_value(serde_json::json!({"code": 5})).is_err());
    }
}
