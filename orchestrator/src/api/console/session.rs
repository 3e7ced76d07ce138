//! Signing in to the console: an API key posted once in a form becomes a session.
//!
//! The key is checked with the same `auth::authenticate` the REST middleware runs. The session
//! is a row of `console_sessions`: the SHA-256 of a random 32-byte secret (the browser holds the
//! secret in an HttpOnly, SameSite=Strict cookie scoped to `/console`), the key's id, times, a
//! revocation mark, and the key itself sealed by the secret (XOR with an HMAC-SHA256 pad keyed by
//! it; each secret seals exactly one key once), so the console can act as the key on later
//! requests while neither the table alone nor the cookie alone gives the key back. The key is
//! never put in a URL or a page. Each request re-authenticates the key: a revoked or expired key
//! ends the session there and then (the row is marked revoked).

use axum::body::Bytes;
use axum::extract::FromRequestParts;
use axum::extract::State;
use axum::http::header::{COOKIE, HOST, ORIGIN, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::{csrf, form_fields, layout, ConsoleError};
use crate::auth;
use crate::caller::Caller;
use crate::state::AppState;

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
        let row: Option<(Uuid, Vec<u8>)> = sqlx::query_as(
            "SELECT id, key_sealed FROM console_sessions \
             WHERE token_hash = $1 AND revoked_at IS NULL AND expires_at > now()",
        )
        .bind(token_hash(&secret))
        .fetch_optional(&state.pool)
        .await?;
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

/// `GET /console/sign-in`: the form (or the console, for a browser already signed in).
pub async fn sign_in_form(session: Result<Session, ConsoleError>) -> Response {
    if session.is_ok() {
        return Redirect::to("/console/sandboxes").into_response();
    }
    form_page(StatusCode::OK, None)
}

/// `POST /console/sign-in` (`key=`): checks the key as REST does and starts a session.
pub async fn sign_in(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    if cross_site(&headers) {
        return Err(ConsoleError::Csrf);
    }
    let fields = form_fields(&body);
    let key = fields.get("key").map(|k| k.trim()).unwrap_or_default();
    if key.is_empty() {
        return Ok(form_page(
            StatusCode::BAD_REQUEST,
            Some("Enter an API key."),
        ));
    }
    let caller = match auth::authenticate(&state.pool, &state.api_keys, key).await {
        Ok(caller) => caller,
        Err(auth::AuthError::Db(e)) => return Err(ConsoleError::Db(e)),
        Err(_) => {
            return Ok(form_page(
                StatusCode::UNAUTHORIZED,
                Some("That key was not accepted (unknown, revoked or expired)."),
            ))
        }
    };
    let key_id: Uuid = caller
        .id
        .parse()
        .map_err(|_| ConsoleError::Internal("an API key caller without a key id".into()))?;
    // Ended sessions go a day after their end, so the table holds only what could be live.
    sqlx::query(
        "DELETE FROM console_sessions WHERE expires_at < now() - interval '1 day' \
         OR revoked_at < now() - interval '1 day'",
    )
    .execute(&state.pool)
    .await?;
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| ConsoleError::Internal(e.to_string()))?;
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO console_sessions (id, tenant_id, token_hash, api_key_id, key_sealed, expires_at) \
         VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))",
    )
    .bind(id)
    .bind(&caller.tenant)
    .bind(token_hash(&secret))
    .bind(key_id)
    .bind(seal(&secret, key.as_bytes()))
    .bind(SESSION_SECS as f64)
    .execute(&state.pool)
    .await?;
    tracing::info!(session = %id, key = %caller.label, "console session started");
    let cookie = format!(
        "{COOKIE_NAME}={}; HttpOnly; SameSite=Strict; Path=/console; Max-Age={SESSION_SECS}",
        csrf::hex(&secret)
    );
    let mut response = Redirect::to("/console/sandboxes").into_response();
    response.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_str(&cookie).map_err(|e| ConsoleError::Internal(e.to_string()))?,
    );
    layout::secure_headers(response.headers_mut());
    Ok(response)
}

/// `POST /console/sign-out`: revokes the session and clears the cookie.
pub async fn sign_out(
    State(state): State<AppState>,
    session: Session,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    session.check_csrf(&form_fields(&body))?;
    revoke(&state, session.id).await?;
    let mut response = Redirect::to("/console/sign-in").into_response();
    response.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_static(
            "aegis_console=; HttpOnly; SameSite=Strict; Path=/console; Max-Age=0",
        ),
    );
    layout::secure_headers(response.headers_mut());
    Ok(response)
}

/// Marks a session revoked.
async fn revoke(state: &AppState, id: Uuid) -> Result<(), ConsoleError> {
    sqlx::query(
        "UPDATE console_sessions SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL",
    )
    .bind(id)
    .execute(&state.pool)
    .await?;
    Ok(())
}

/// The sign-in page, with an optional message.
fn form_page(status: StatusCode, message: Option<&str>) -> Response {
    let note = message
        .map(|m| format!("<p class=\"error\" role=\"alert\">{}</p>", layout::esc(m)))
        .unwrap_or_default();
    let body = format!(
        "<h1>Sign in</h1>{note}\
         <form method=\"post\" action=\"/console/sign-in\" class=\"signin\">\
         <label for=\"key\">API key</label>\
         <input id=\"key\" name=\"key\" type=\"password\" autocomplete=\"off\" required autofocus>\
         <button type=\"submit\">Sign in</button></form>\
         <p class=\"hint\">The key stays on the node: the browser keeps only a session cookie.</p>"
    );
    layout::page(status, "Sign in", None, "", &body)
}

/// True when the request says it comes from another site, so no other site can sign a browser
/// in to a key of its choosing: by the browser's `Sec-Fetch-Site` when sent, else by an
/// `Origin` naming another host (`null`, which browsers send under `no-referrer`, says nothing).
fn cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        return !matches!(site, "same-origin" | "none");
    }
    let Some(origin) = headers
        .get(ORIGIN)
        .and_then(|o| o.to_str().ok())
        .filter(|o| *o != "null")
    else {
        return false;
    };
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let origin_host = origin.split_once("://").map(|(_, h)| h).unwrap_or(origin);
    origin_host != host
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
