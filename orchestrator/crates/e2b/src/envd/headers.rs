//! The E2B-specific request headers of envd calls, as the SDK sends them when one URL
//! (`E2B_SANDBOX_URL`) serves every sandbox: which sandbox and port, the secure sandbox's
//! token, the user a call acts as, and how often an idle stream wants a keepalive event.
//! Parsing only; whether a token or user is acceptable is the node's decision.

use std::time::Duration;

use base64::Engine as _;

/// Names the sandbox a call is for (the SDK sets it on every envd call).
pub const SANDBOX_ID: &str = "e2b-sandbox-id";
/// The port inside the sandbox the call is for; envd's own is [`ENVD_PORT`].
pub const SANDBOX_PORT: &str = "e2b-sandbox-port";
/// A secure sandbox's envd access token (from the create response's `envdAccessToken`).
pub const ACCESS_TOKEN: &str = "x-access-token";
/// Seconds between keepalive events the client wants on an idle server stream.
pub const KEEPALIVE_PING_INTERVAL: &str = "keepalive-ping-interval";
/// `Basic base64("<user>:")`: the sandbox user a process or file call acts as.
pub const AUTHORIZATION: &str = "authorization";

/// The port envd listens on in an E2B sandbox; the SDK names it in [`SANDBOX_PORT`].
pub const ENVD_PORT: u16 = 49983;

/// Longest `Authorization` value read; a user name is short.
const MAX_AUTHORIZATION_LEN: usize = 512;
/// Longest keepalive interval honoured: an hour.
const MAX_KEEPALIVE_SECS: u64 = 3600;

/// A header that could not be read. Messages name the header and the rule, never the value
/// (an `Authorization` header is a credential in other contexts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("header {header}: {problem}")]
    Invalid {
        header: &'static str,
        problem: &'static str,
    },
}

fn invalid(header: &'static str, problem: &'static str) -> HeaderError {
    HeaderError::Invalid { header, problem }
}

/// The port of [`SANDBOX_PORT`]: decimal, 1 to 65535.
pub fn sandbox_port(value: &str) -> Result<u16, HeaderError> {
    let digits = value.trim();
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(SANDBOX_PORT, "must be a decimal port number"));
    }
    match digits.parse::<u16>() {
        Ok(0) | Err(_) => Err(invalid(SANDBOX_PORT, "must be between 1 and 65535")),
        Ok(port) => Ok(port),
    }
}

/// The user named by envd's `Authorization: Basic base64("<user>:")`. The password part is
/// empty in what the SDK sends and must stay so: envd authenticates with the access token,
/// never with a password. The name must be a plain POSIX user name (`[a-z_][a-z0-9_-]*`, at
/// most 32 bytes).
pub fn basic_user(value: &str) -> Result<String, HeaderError> {
    if value.len() > MAX_AUTHORIZATION_LEN {
        return Err(invalid(AUTHORIZATION, "is too long"));
    }
    let Some((scheme, encoded)) = value.trim().split_once(' ') else {
        return Err(invalid(AUTHORIZATION, "must be `Basic <base64 of user:>`"));
    };
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(invalid(AUTHORIZATION, "scheme must be Basic"));
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| invalid(AUTHORIZATION, "credentials are not valid base64"))?;
    let text = String::from_utf8(decoded)
        .map_err(|_| invalid(AUTHORIZATION, "credentials are not UTF-8"))?;
    let Some((user, password)) = text.split_once(':') else {
        return Err(invalid(AUTHORIZATION, "credentials must be `user:`"));
    };
    if !password.is_empty() {
        return Err(invalid(
            AUTHORIZATION,
            "a password is not accepted; use the access token",
        ));
    }
    if !is_user_name(user) {
        return Err(invalid(
            AUTHORIZATION,
            "user must match [a-z_][a-z0-9_-]* and be at most 32 bytes",
        ));
    }
    Ok(user.to_owned())
}

fn is_user_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    match bytes.first() {
        Some(b) if b.is_ascii_lowercase() || *b == b'_' => {}
        _ => return false,
    }
    bytes.len() <= 32
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_' || *b == b'-')
}

/// The interval of [`KEEPALIVE_PING_INTERVAL`]: whole seconds, 1 to 3600.
pub fn keepalive_interval(value: &str) -> Result<Duration, HeaderError> {
    let digits = value.trim();
    if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(KEEPALIVE_PING_INTERVAL, "must be whole seconds"));
    }
    match digits.parse::<u64>() {
        Ok(secs) if (1..=MAX_KEEPALIVE_SECS).contains(&secs) => Ok(Duration::from_secs(secs)),
        _ => Err(invalid(
            KEEPALIVE_PING_INTERVAL,
            "must be between 1 and 3600 seconds",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_user_the_sdk_sends() {
        // The SDK: base64("user:") and base64("root:").
        assert_eq!(basic_user("Basic dXNlcjo=").unwrap(), "user");
        assert_eq!(basic_user("Basic cm9vdDo=").unwrap(), "root");
    }

    #[test]
    fn refuses_malformed_authorization() {
        let cases = [
            ("Bearer dXNlcjo=", "scheme must be Basic"),
            ("Basic", "must be `Basic <base64 of user:>`"),
            ("Basic !!!", "not valid base64"),
            // base64("user") has no colon.
            ("Basic dXNlcg==", "must be `user:`"),
            // base64("user:secret")
            ("Basic dXNlcjpzZWNyZXQ=", "password is not accepted"),
            // base64("../x:")
            ("Basic Li4veDo=", "user must match"),
            // base64(":") -> empty user
            ("Basic Og==", "user must match"),
        ];
        for (value, want) in cases {
            let err = basic_user(value).unwrap_err().to_string();
            assert!(err.contains(want), "{value}: {err}");
            assert!(err.starts_with("header authorization:"), "{err}");
        }
        assert!(basic_user(&format!("Basic {}", "A".repeat(600))).is_err());
    }

    #[test]
    fn ports_and_keepalive() {
        assert_eq!(sandbox_port("49983").unwrap(), ENVD_PORT);
        for bad in ["", "0", "65536", "-1", "49983x", "123456"] {
            assert!(sandbox_port(bad).is_err(), "{bad}");
        }
        assert_eq!(keepalive_interval("50").unwrap(), Duration::from_secs(50));
        for bad in ["0", "3601", "", "1.5", "99999"] {
            let err = keepalive_interval(bad).unwrap_err().to_string();
            assert!(err.contains("keepalive-ping-interval"), "{err}");
        }
    }
}
