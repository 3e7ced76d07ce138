//! Signed file URLs: how a secure sandbox's `/files` link is authorised without headers. The
//! SDK's `download_url` and `upload_url` sign `path:operation:user:token[:expiration]` with
//! SHA-256 (the envd access token is the secret), base64 without padding, prefixed `v1_`, and
//! put it in the query (`signature`, `signature_expiration` in seconds since the epoch). The
//! one who holds the link may read (or write) that one path until it expires.

use base64::Engine as _;
use sha2::{Digest, Sha256};

/// What a signed URL allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Read,
    Write,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }
}

/// A signed URL that does not authorise the request. The messages are the ones envd answers
/// with (HTTP 401, in its `{"code", "message"}` body); E2B's tests compare the expired one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("signature is already expired")]
    Expired,
    #[error("invalid signature")]
    Invalid,
    #[error("signature_expiration is not a number")]
    BadExpiration,
}

impl SignatureError {
    /// The HTTP status to answer with.
    pub const HTTP_STATUS: u16 = 401;
}

/// The signature the SDK computes for `path` (as given, relative or absolute), `operation`,
/// `user` (absent: the sandbox's default user, signed as the empty string), the sandbox's
/// access token, and an optional expiration.
pub fn sign(
    path: &str,
    operation: Operation,
    user: Option<&str>,
    access_token: &str,
    expiration: Option<i64>,
) -> String {
    let user = user.unwrap_or("");
    let raw = match expiration {
        None => format!("{path}:{}:{user}:{access_token}", operation.as_str()),
        Some(at) => format!("{path}:{}:{user}:{access_token}:{at}", operation.as_str()),
    };
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

/// Checks a request's `signature` and `signature_expiration` query values against the
/// sandbox's token, at `now` (seconds since the epoch). The comparison takes the same time
/// whatever the signature, so a guess learns nothing from timing.
pub fn verify(
    path: &str,
    operation: Operation,
    user: Option<&str>,
    access_token: &str,
    signature: &str,
    expiration: Option<&str>,
    now: i64,
) -> Result<(), SignatureError> {
    let expiration = match expiration.filter(|e| !e.is_empty()) {
        None => None,
        Some(text) => Some(
            text.parse::<i64>()
                .map_err(|_| SignatureError::BadExpiration)?,
        ),
    };
    let expected = sign(path, operation, user, access_token, expiration);
    if !constant_time_eq(expected.as_bytes(), signature.as_bytes()) {
        return Err(SignatureError::Invalid);
    }
    match expiration {
        Some(at) if at < now => Err(SignatureError::Expired),
        _ => Ok(()),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_sdk_and_refuses_what_it_must() {
        // sha256("test.txt:read:user:tok") and with ":1700000000", base64 without padding,
        // as the SDK's get_signature computes them.
        let plain = sign("test.txt", Operation::Read, Some("user"), "tok", None);
        assert_eq!(plain, "v1_/1gxHnPykwSXvBIP0s92+u2DOwbYMHJG5TbPHfQbaNs");
        let timed = sign(
            "test.txt",
            Operation::Read,
            Some("user"),
            "tok",
            Some(1_700_000_000),
        );
        assert_eq!(timed, "v1_+61CNwpVEox6W2xVKyGeRcU6PDXei/8d8t8G0TjTnUg");

        let ok = |sig: &str, exp: Option<&str>, now: i64| {
            verify(
                "test.txt",
                Operation::Read,
                Some("user"),
                "tok",
                sig,
                exp,
                now,
            )
        };
        assert_eq!(ok(&plain, None, 0), Ok(()));
        assert_eq!(ok(&timed, Some("1700000000"), 1_700_000_000), Ok(()));
        assert_eq!(
            ok(&timed, Some("1700000000"), 1_700_000_001),
            Err(SignatureError::Expired)
        );
        assert_eq!(
            SignatureError::Expired.to_string(),
            "signature is already expired"
        );
        // A later expiration than the one signed, another path, operation, user or token.
        assert_eq!(
            ok(&timed, Some("1800000000"), 0),
            Err(SignatureError::Invalid)
        );
        let others = [
            ("other.txt", Operation::Read, "user", "tok"),
            ("test.txt", Operation::Write, "user", "tok"),
            ("test.txt", Operation::Read, "root", "tok"),
            ("test.txt", Operation::Read, "user", "tok2"),
        ];
        for (path, op, user, token) in others {
            let got = verify(path, op, Some(user), token, &plain, None, 0);
            assert_eq!(
                got,
                Err(SignatureError::Invalid),
                "{path} {op:?} {user} {token}"
            );
        }
        assert_eq!(ok("", None, 0), Err(SignatureError::Invalid));
        assert_eq!(
            ok(&timed, Some("soon"), 0),
            Err(SignatureError::BadExpiration)
        );
        // No user signs as the empty string.
        assert_eq!(
            sign("a", Operation::Write, None, "t", None),
            sign("a", Operation::Write, Some(""), "t", None)
        );
    }
}
