//! SEAL error codes and the error bodies the gateway sends.
//!
//! Every refusal on the SEAL surface carries one of the RFC's numeric codes (notes §5.1), so
//! a client can tell a tampered envelope (1001) from an expired token (1003) or a path outside the
//! allowlist (2002) without parsing prose. The code also decides the HTTP status (and, for the
//! lead's gRPC adapter, the status class): 1xxx and 3xxx are "who are you" failures (401), 2xxx
//! are "you may not" (403), except a rate limit, which is 429 with `Retry-After` as RFC §9.5
//! asks. `ScopeNotFound` (3001) is 403, as in the integration guide.
//!
//! Two body shapes exist: the nested RFC §8.2 body for invocation errors, and for attestation a
//! body carrying both the flat §6.3.1 fields (`error_code`, `message`, read by the Python SDK)
//! and the nested ones (`error.message`, read by the TypeScript SDK).

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Map, Value};

/// The protocol identifier carried by every envelope and every gateway answer.
pub const PROTOCOL: &str = "seal/v1";

/// The numeric SEAL error codes of the RFC registry (§8.1, §14.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum SealCode {
    /// The envelope's structure is invalid (missing or wrong-typed field, bad protocol,
    /// unparseable timestamp, bad Base64).
    MalformedEnvelope = 1000,
    /// The Ed25519 signature does not verify over the canonical message.
    InvalidSignature = 1001,
    /// Reserved by the RFC; overlaps 1001, which is what this gateway sends.
    SignatureVerificationFailed = 1002,
    /// The security token (or the session) has expired, or the envelope's timestamp is outside
    /// the freshness window.
    TokenExpired = 1003,
    /// The security token is malformed or its signature is invalid.
    TokenVerificationFailed = 1004,
    /// No session is known for the token.
    SessionNotFound = 1005,
    /// The session exists but is revoked or expired.
    SessionInactive = 1006,
    /// No capability's `tool_pattern` covers the tool.
    ToolNotAllowed = 2000,
    /// The tool is on the context's deny list.
    ToolDenied = 2001,
    /// The path is outside every allowlist entry, or tries to traverse upwards.
    PathNotAllowed = 2002,
    /// The command (or its subcommand) is not on the allowlist.
    CommandNotAllowed = 2003,
    /// The URL's host is not on the domain allowlist.
    DomainNotAllowed = 2004,
    /// Too many calls within the capability's rate-limit window.
    RateLimitExceeded = 2005,
    /// No capability grants the call (generic policy refusal).
    NoMatchingCapability = 2006,
    /// The workload's identity could not be verified at attestation.
    WorkloadVerificationFailed = 3000,
    /// The requested security context does not exist.
    ScopeNotFound = 3001,
    /// Any other attestation failure (for example an unreadable public key).
    AttestationFailed = 3002,
}

impl SealCode {
    /// The numeric code as sent on the wire.
    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// The RFC's SCREAMING_SNAKE name of the code.
    pub fn name(self) -> &'static str {
        match self {
            SealCode::MalformedEnvelope => "MALFORMED_ENVELOPE",
            SealCode::InvalidSignature => "INVALID_SIGNATURE",
            SealCode::SignatureVerificationFailed => "SIGNATURE_VERIFICATION_FAILED",
            SealCode::TokenExpired => "TOKEN_EXPIRED",
            SealCode::TokenVerificationFailed => "TOKEN_VERIFICATION_FAILED",
            SealCode::SessionNotFound => "SESSION_NOT_FOUND",
            SealCode::SessionInactive => "SESSION_INACTIVE",
            SealCode::ToolNotAllowed => "POLICY_VIOLATION_TOOL_NOT_ALLOWED",
            SealCode::ToolDenied => "POLICY_VIOLATION_TOOL_DENIED",
            SealCode::PathNotAllowed => "POLICY_VIOLATION_PATH_NOT_ALLOWED",
            SealCode::CommandNotAllowed => "POLICY_VIOLATION_COMMAND_NOT_ALLOWED",
            SealCode::DomainNotAllowed => "POLICY_VIOLATION_DOMAIN_NOT_ALLOWED",
            SealCode::RateLimitExceeded => "POLICY_VIOLATION_RATE_LIMIT_EXCEEDED",
            SealCode::NoMatchingCapability => "POLICY_VIOLATION_NO_MATCHING_CAPABILITY",
            SealCode::WorkloadVerificationFailed => "ATTESTATION_WORKLOAD_VERIFICATION_FAILED",
            SealCode::ScopeNotFound => "ATTESTATION_SCOPE_NOT_FOUND",
            SealCode::AttestationFailed => "ATTESTATION_FAILED",
        }
    }

    /// The HTTP status for this code: 1xxx → 401, 2xxx → 403 (2005 → 429), 3xxx → 401
    /// (3001 → 403).
    pub fn http_status(self) -> u16 {
        match self {
            SealCode::RateLimitExceeded => 429,
            SealCode::ScopeNotFound => 403,
            code if (2000..3000).contains(&code.as_u32()) => 403,
            _ => 401,
        }
    }

    /// True for the 2xxx policy codes (the caller is known but may not do this).
    pub fn is_policy(self) -> bool {
        (2000..3000).contains(&self.as_u32())
    }

    /// The code with this number, if the registry has one.
    pub fn from_u32(n: u32) -> Option<SealCode> {
        ALL.iter().copied().find(|c| c.as_u32() == n)
    }
}

/// Every code, in numeric order.
const ALL: [SealCode; 17] = [
    SealCode::MalformedEnvelope,
    SealCode::InvalidSignature,
    SealCode::SignatureVerificationFailed,
    SealCode::TokenExpired,
    SealCode::TokenVerificationFailed,
    SealCode::SessionNotFound,
    SealCode::SessionInactive,
    SealCode::ToolNotAllowed,
    SealCode::ToolDenied,
    SealCode::PathNotAllowed,
    SealCode::CommandNotAllowed,
    SealCode::DomainNotAllowed,
    SealCode::RateLimitExceeded,
    SealCode::NoMatchingCapability,
    SealCode::WorkloadVerificationFailed,
    SealCode::ScopeNotFound,
    SealCode::AttestationFailed,
];

impl std::fmt::Display for SealCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.as_u32())
    }
}

/// A refusal with its SEAL code, a human message, structured details and, for rate limits, how
/// long to wait.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {}: {message}", code.name())]
pub struct SealError {
    /// The RFC code.
    pub code: SealCode,
    /// What went wrong, for a human; names the rule or the field.
    pub message: String,
    /// Structured context (tool, attempted path, allowed paths, ...); an object, or `{}`.
    pub details: Value,
    /// Seconds until a rate-limited call may succeed (sent as `Retry-After`).
    pub retry_after_secs: Option<u64>,
}

impl SealError {
    /// An error with empty details.
    pub fn new(code: SealCode, message: impl Into<String>) -> SealError {
        SealError {
            code,
            message: message.into(),
            details: Value::Object(Map::new()),
            retry_after_secs: None,
        }
    }

    /// Replaces the details (should be an object).
    pub fn with_details(mut self, details: Value) -> SealError {
        self.details = details;
        self
    }

    /// Sets the retry-after hint.
    pub fn with_retry_after(mut self, secs: u64) -> SealError {
        self.retry_after_secs = Some(secs);
        self
    }

    /// The HTTP status for this error (see [`SealCode::http_status`]).
    pub fn http_status(&self) -> u16 {
        self.code.http_status()
    }

    /// The RFC §8.2 error body for an invocation:
    /// `{"protocol":"seal/v1","status":"error","error":{code,message,timestamp,request_id,details}}`.
    ///
    /// `request_id` is the payload's `id` when the envelope got far enough to have one, else
    /// `null`. A rate-limit refusal also carries `retry_after_seconds` in `details`.
    pub fn error_body(&self, request_id: Option<&Value>, now: DateTime<Utc>) -> Value {
        json!({
            "protocol": PROTOCOL,
            "status": "error",
            "error": {
                "code": self.code.as_u32(),
                "name": self.code.name(),
                "message": self.message,
                "timestamp": now.to_rfc3339_opts(SecondsFormat::Millis, true),
                "request_id": request_id.cloned().unwrap_or(Value::Null),
                "details": self.details_with_retry(),
            }
        })
    }

    /// The attestation error body: the flat §6.3.1 fields (`error_code`, `message`) and the
    /// nested §8.2 ones (`error.code`, `error.message`), so both SDKs and the RFC are satisfied.
    pub fn attestation_error_body(&self) -> Value {
        json!({
            "protocol": PROTOCOL,
            "status": "error",
            "error_code": self.code.as_u32(),
            "message": self.message,
            "error": {
                "code": self.code.as_u32(),
                "name": self.code.name(),
                "message": self.message,
                "details": self.details_with_retry(),
            }
        })
    }

    fn details_with_retry(&self) -> Value {
        let mut details = match &self.details {
            Value::Object(map) => map.clone(),
            Value::Null => Map::new(),
            other => {
                let mut map = Map::new();
                map.insert("detail".into(), other.clone());
                map
            }
        };
        if let Some(secs) = self.retry_after_secs {
            details.insert("retry_after_seconds".into(), json!(secs));
        }
        Value::Object(details)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn codes_have_rfc_numbers_names_and_statuses() {
        assert_eq!(SealCode::MalformedEnvelope as u32, 1000);
        assert_eq!(SealCode::AttestationFailed as u32, 3002);
        assert_eq!(
            SealCode::PathNotAllowed.name(),
            "POLICY_VIOLATION_PATH_NOT_ALLOWED"
        );
        assert_eq!(SealCode::InvalidSignature.http_status(), 401);
        assert_eq!(SealCode::SessionInactive.http_status(), 401);
        assert_eq!(SealCode::ToolDenied.http_status(), 403);
        assert_eq!(SealCode::NoMatchingCapability.http_status(), 403);
        assert_eq!(SealCode::RateLimitExceeded.http_status(), 429);
        assert_eq!(SealCode::WorkloadVerificationFailed.http_status(), 401);
        assert_eq!(SealCode::ScopeNotFound.http_status(), 403);
        assert_eq!(SealCode::AttestationFailed.http_status(), 401);
        for code in ALL {
            assert_eq!(SealCode::from_u32(code.as_u32()), Some(code));
        }
        assert_eq!(SealCode::from_u32(4000), None);
    }

    #[test]
    fn display_names_code_and_reason() {
        let e = SealError::new(SealCode::InvalidSignature, "signature verification failed");
        assert_eq!(
            e.to_string(),
            "1001 INVALID_SIGNATURE: signature verification failed"
        );
    }

    #[test]
    fn invocation_body_is_nested() {
        let now = Utc.with_ymd_and_hms(2026, 2, 17, 14, 32, 1).unwrap();
        let e = SealError::new(SealCode::RateLimitExceeded, "slow down")
            .with_details(json!({"tool": "web.search"}))
            .with_retry_after(42);
        let body = e.error_body(Some(&json!("req-1")), now);
        assert_eq!(body["protocol"], "seal/v1");
        assert_eq!(body["status"], "error");
        assert_eq!(body["error"]["code"], 2005);
        assert_eq!(body["error"]["message"], "slow down");
        assert_eq!(body["error"]["timestamp"], "2026-02-17T14:32:01.000Z");
        assert_eq!(body["error"]["request_id"], "req-1");
        assert_eq!(body["error"]["details"]["tool"], "web.search");
        assert_eq!(body["error"]["details"]["retry_after_seconds"], 42);
        let anonymous = e.error_body(None, now);
        assert_eq!(anonymous["error"]["request_id"], Value::Null);
    }

    #[test]
    fn attestation_body_is_flat_and_nested() {
        let e = SealError::new(SealCode::ScopeNotFound, "no security context `x`");
        let body = e.attestation_error_body();
        assert_eq!(body["status"], "error");
        assert_eq!(body["error_code"], 3001);
        assert_eq!(body["message"], "no security context `x`");
        assert_eq!(body["error"]["code"], 3001);
        assert_eq!(body["error"]["message"], "no security context `x`");
    }
}
