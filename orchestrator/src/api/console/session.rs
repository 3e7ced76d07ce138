//! The console's sessions: an API key posted once in a form (`sign_in.rs`) becomes a session.
//!
//! The key is checked with the same `auth::authenticate` the REST middleware runs. The session
//! is a row of `console_sessions`: the SHA-256 of a random 32-byte secret (the browser holds the
//! secret in an HttpOnly, SameSite=Strict cookie scoped to `/console`), the key's id, times, a
//! revocation mark, and the key itself sealed by the secret (XOR with an HMAC-SHA256 pad keyed by
//! it; each secret seals exactly one key once), so the console can act as the key on later
//! requests while neither the table alone nor the cookie alone gives the key back. The key is
//! never put in a URL or a page. Each request re-authenticates the key: a revoked or expired key
//! ends the session there and then (the row is marked revoked).

use axum::extract::FromRequestParts;
use axum::http::header::COOKIE;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::{csrf, ConsoleError};
use crate::auth;
use crate::caller::Caller;
use crate::state::AppState;
use aegis_store::console_sessions;

/// The session cookie's name.
const COOKIE_NAME: &str = "aegis_console";
/// How long a session lives (it ends earlier when signed out or when its key stops working).
const SESSION_SECS: i64 = 12 * 3600;
/// Label of the pad that seals the key.
const SEAL_LABEL: &[u8] = b"aegis console key seal v1";

/// A signed-in browser: the key it acts as and who that key is.
#[derive(Clone)]
pub struct Session {
    /// The session row.
    pub id: Uuid,
    /// The API key, only ever sent to REST as a bearer token.
    pub key: String,
    /// The key as REST sees it (role, label, bound context), for what the pages offer.
    pub caller: Caller,
    /// This session's form token.
    pub csrf: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("caller", &self.caller.label)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// True when the key's role may change things (operator or admin) and it is not bound to a
    /// context (bound keys reach only tool-call routes); decides which buttons a page shows.
    /// REST decides again on every request.
    pub fn may_write(&self) -> bool {
        self.caller.role.is_some_and(|r| r.may_write()) && self.caller.seal.is_none()
    }

    /// True for an unbound admin key (key management).
    pub fn is_admin(&self) -> bool {
        self.caller.role == Some(crate::caller::Role::Admin) && self.caller.seal.is_none()
    }

    /// Ok when `fields` carries this session's form token.
    pub fn check_csrf(
        &self,
        fields: &std::collections::HashMap<String, String>,
    ) -> Result<(), ConsoleError> {
        csrf::check(&self.csrf, fields.get(csrf::FIELD).map(String::as_str))
    }
}

impl FromRequestParts<AppState> for Session {
    type Rejection = ConsoleError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let secret = cookie_secret(&parts.headers).ok_or(ConsoleError::SignIn)?;
        let row = console_sessions::find_live(&state.pool, &token_hash(&secret)).await?;
        let (id, sealed) = row.ok_or(ConsoleError::SignIn)?;
        let key = String::from_utf8(seal(&secret, &sealed)).map_err(|_| ConsoleError::SignIn)?;
        let caller = match auth::authenticate(&state.pool, &state.api_keys, &key).await {
            Ok(caller) => caller,
            Err(auth::AuthError::Db(e)) => return Err(ConsoleError::Db(e)),
            Err(_) => {
                revoke(state, id).await?;
                return Err(ConsoleError::SignIn);
            }
        };
        Ok(Session {
            id,
            key,
            caller,
            csrf: csrf::token_of(&secret),
        })
    }
}

/// Starts a session for `caller`, who signed in with `key`: forgets ended sessions, records
/// the new one with the key sealed by a fresh secret, and returns the `Set-Cookie` value that
/// gives the browser that secret.
pub(super) async fn open(
    state: &AppState,
    caller: &Caller,
    key: &str,
) -> Result<HeaderValue, ConsoleError> {
    let key_id: Uuid = caller
        .id
        .parse()
        .map_err(|_| ConsoleError::Internal("an API key caller without a key id".into()))?;
    console_sessions::forget_ended(&state.pool).await?;
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| ConsoleError::Internal(e.to_string()))?;
    let id = Uuid::new_v4();
    let row = console_sessions::NewSession {
        id,
        tenant: &caller.tenant,
        token_hash: &token_hash(&secret),
        api_key_id: key_id,
        key_sealed: &seal(&secret, key.as_bytes()),
        lifetime_secs: SESSION_SECS,
    };
    console_sessions::insert(&state.pool, &row).await?;
    tracing::info!(session = %id, key = %caller.label, "console session started");
    let cookie = format!(
        "{COOKIE_NAME}={}; HttpOnly; SameSite=Strict; Path=/console; Max-Age={SESSION_SECS}",
        csrf::hex(&secret)
    );
    HeaderValue::from_str(&cookie).map_err(|e| ConsoleError::Internal(e.to_string()))
}

/// The `Set-Cookie` value that clears the session cookie.
pub(super) const CLEAR_COOKIE: &str =
    "aegis_console=; HttpOnly; SameSite=Strict; Path=/console; Max-Age=0";

/// Marks a session revoked.
pub(super) async fn revoke(state: &AppState, id: Uuid) -> Result<(), ConsoleError> {
    Ok(console_sessions::revoke(&state.pool, id).await?)
}

/// The session secret from the request's cookie, if well-formed.
fn cookie_secret(headers: &HeaderMap) -> Option<[u8; 32]> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .and_then(|(_, value)| unhex32(value))
}

fn unhex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// What the table stores to find a session by its secret.
fn token_hash(secret: &[u8]) -> String {
    csrf::hex(&Sha256::digest(secret))
}

/// XOR of `data` with the pad keyed by `secret` (sealing and unsealing are the same operation).
fn seal(secret: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    for (block, chunk) in data.chunks(32).enumerate() {
        let mut label = SEAL_LABEL.to_vec();
        label.extend_from_slice(&(block as u64).to_be_bytes());
        let pad = csrf::mac(secret, &label);
        out.extend(chunk.iter().zip(pad).map(|(d, p)| d ^ p));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealing_twice_gives_the_key_back_and_another_secret_does_not() {
        let key = "aok_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let sealed = seal(&[7; 32], key.as_bytes());
        assert_ne!(sealed, key.as_bytes());
        assert_eq!(seal(&[7; 32], &sealed), key.as_bytes());
        assert_ne!(seal(&[8; 32], &sealed), key.as_bytes());
    }

    #[test]
    fn the_cookie_is_read_among_others_and_malformed_ones_are_ignored() {
        let mut h = HeaderMap::new();
        let hexed = "ab".repeat(32);
        h.insert(
            COOKIE,
            HeaderValue::from_str(&format!("x=1; aegis_console={hexed}")).unwrap(),
        );
        assert_eq!(cookie_secret(&h), Some([0xab; 32]));
        h.insert(COOKIE, HeaderValue::from_static("aegis_console=zz"));
        assert_eq!(cookie_secret(&h), None);
    }
}
