//! The form token of a console session: every state-changing request (`POST`) must carry it in
//! its `csrf` field, or it is refused with 403 before anything is sent to REST.
//!
//! The token is derived from the session's secret (HMAC-SHA256 of a fixed label keyed by it), so
//! it needs no storage, differs per session, and reveals nothing of the cookie it stands beside.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::ConsoleError;

/// The form field every console form carries.
pub const FIELD: &str = "csrf";

/// The form token of the session whose secret is `secret`.
pub fn token_of(secret: &[u8]) -> String {
    hex(&mac(secret, b"aegis console csrf v1"))
}

/// Ok when `presented` is the session's token (compared in constant time), else [`ConsoleError::Csrf`].
pub fn check(expected: &str, presented: Option<&str>) -> Result<(), ConsoleError> {
    let Some(presented) = presented else {
        return Err(ConsoleError::Csrf);
    };
    let (a, b) = (expected.as_bytes(), presented.as_bytes());
    if a.len() != b.len() {
        return Err(ConsoleError::Csrf);
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    if diff == 0 {
        Ok(())
    } else {
        Err(ConsoleError::Csrf)
    }
}

/// HMAC-SHA256 of `label` keyed by `key`.
pub fn mac(key: &[u8], label: &[u8]) -> [u8; 32] {
    // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    m.update(label);
    m.finalize().into_bytes().into()
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
