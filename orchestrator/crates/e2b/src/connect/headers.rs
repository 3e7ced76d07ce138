//! The Connect protocol's own request headers: its version and the caller's deadline.

use std::time::Duration;

use super::error::{Code, ConnectError};

/// Names the protocol version; optional, but when present it must be [`PROTOCOL_VERSION`].
pub const PROTOCOL_VERSION_HEADER: &str = "connect-protocol-version";
/// The only Connect protocol version.
pub const PROTOCOL_VERSION: &str = "1";
/// The caller's deadline in milliseconds (at most 10 digits).
pub const TIMEOUT_HEADER: &str = "connect-timeout-ms";

/// Refuses a call that names another protocol version.
pub fn check_protocol_version(value: Option<&str>) -> Result<(), ConnectError> {
    match value.map(str::trim) {
        None | Some(PROTOCOL_VERSION) => Ok(()),
        Some(_) => Err(ConnectError::new(
            Code::InvalidArgument,
            format!("{PROTOCOL_VERSION_HEADER} must be \"{PROTOCOL_VERSION}\""),
        )),
    }
}

/// The deadline of `connect-timeout-ms`, if the call has one: 1 to 10 decimal digits.
/// Zero is a deadline that has already passed.
pub fn timeout(value: Option<&str>) -> Result<Option<Duration>, ConnectError> {
    let Some(value) = value.map(str::trim) else {
        return Ok(None);
    };
    if value.is_empty() || value.len() > 10 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            format!("{TIMEOUT_HEADER} must be 1 to 10 decimal digits"),
        ));
    }
    let ms: u64 = value.parse().map_err(|_| {
        ConnectError::new(
            Code::InvalidArgument,
            format!("{TIMEOUT_HEADER} is not a number"),
        )
    })?;
    Ok(Some(Duration::from_millis(ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_and_timeout() {
        assert!(check_protocol_version(None).is_ok());
        assert!(check_protocol_version(Some("1")).is_ok());
        let err = check_protocol_version(Some("2")).unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);

        assert_eq!(timeout(None).unwrap(), None);
        // The SDK's default command timeout, 60 s.
        assert_eq!(
            timeout(Some("60000")).unwrap(),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            timeout(Some("9999999999")).unwrap(),
            Some(Duration::from_millis(9_999_999_999))
        );
        for bad in ["", "12345678901", "-1", "1.5", "1e3"] {
            let err = timeout(Some(bad)).unwrap_err();
            assert!(err.message.contains(TIMEOUT_HEADER), "{bad}: {err}");
        }
    }
}
