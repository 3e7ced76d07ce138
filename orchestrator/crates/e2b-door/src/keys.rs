//! API keys on the E2B door: E2B's SDK refuses a key that is not `e2b_` and lowercase hex
//! (unless `E2B_VALIDATE_API_KEY=false`), so a node key is presented as `e2b_` followed by the
//! hex of its bytes. The conversion is reversible and public: the `e2b_` form is the key
//! itself, as secret as the key, and authenticates exactly like it (same cache, same
//! revocation, same security context).
//!
//! ```text
//! E2B_API_KEY=e2b_$(printf %s "$AEGIS_API_KEY" | od -An -tx1 | tr -d ' \n')
//! ```

use axum::http::HeaderMap;

use aegis_e2b::api::{ApiError, API_KEY_HEADER};

use aegis_core::caller::Caller;
use aegis_tools::state::AppState;

/// The prefix of E2B's key form.
pub const E2B_KEY_PREFIX: &str = "e2b_";
/// Longest `X-API-KEY` value read (a node key is far shorter).
const MAX_KEY_BYTES: usize = 512;

/// The `e2b_` form of a node API key.
pub fn to_e2b_form(key: &str) -> String {
    let mut out = String::with_capacity(E2B_KEY_PREFIX.len() + key.len() * 2);
    out.push_str(E2B_KEY_PREFIX);
    for b in key.bytes() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The node key a presented value stands for: the `e2b_` form decoded, or the value itself.
pub fn from_presented(value: &str) -> Result<String, ApiError> {
    let Some(hex) = value.strip_prefix(E2B_KEY_PREFIX) else {
        return Ok(value.to_owned());
    };
    let bad = || {
        ApiError::new(
            401,
            "X-API-KEY: an `e2b_` key must be `e2b_` followed by the hex of a node API key",
        )
    };
    if hex.len() % 2 != 0 || hex.is_empty() {
        return Err(bad());
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| bad())?;
    String::from_utf8(bytes).map_err(|_| bad())
}

/// Authenticates a control API call by its `X-API-KEY`.
pub async fn caller(state: &AppState, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let value = headers
        .get(API_KEY_HEADER)
        .ok_or_else(|| ApiError::new(401, "missing X-API-KEY header (export E2B_API_KEY)"))?
        .to_str()
        .map_err(|_| ApiError::new(401, "X-API-KEY is not ASCII"))?
        .trim();
    if value.len() > MAX_KEY_BYTES {
        return Err(ApiError::new(401, "X-API-KEY is too long"));
    }
    let key = from_presented(value)?;
    aegis_store::auth::authenticate(&state.pool, &state.api_keys, &key)
        .await
        .map_err(|e| match e {
            aegis_store::auth::AuthError::Db(_) => {
                ApiError::new(503, "the key store is unavailable")
            }
            other => ApiError::new(401, format!("invalid API key: {other}")),
        })
}

/// Refuses a caller whose role may not change anything (read-only keys list and get only).
pub fn require_write(caller: &Caller) -> Result<(), ApiError> {
    if caller.role.is_some_and(|r| r.may_write()) {
        Ok(())
    } else {
        Err(ApiError::new(
            403,
            "this API key is read-only; sandboxes are created and changed by operator or admin keys",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_e2b_form_round_trips_and_refuses_garbage() {
        let key = "aok_3fA9-xyz";
        let form = to_e2b_form(key);
        assert!(form.starts_with("e2b_"));
        assert!(form[4..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_eq!(from_presented(&form).unwrap(), key);
        assert_eq!(from_presented(key).unwrap(), key);
        for bad in ["e2b_", "e2b_0", "e2b_zz", "e2b_ff"] {
            assert_eq!(from_presented(bad).unwrap_err().code, 401, "{bad}");
        }
    }
}
