//! Signing in and out of the console: the form, the key checked as REST checks it, and the
//! session started (`session.rs`) or ended.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::{HOST, ORIGIN, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};

use super::session::{self, Session};
use super::{form_fields, layout, ConsoleError};
use crate::auth;
use crate::state::AppState;

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
    let cookie = session::open(&state, &caller, key).await?;
    let mut response = Redirect::to("/console/sandboxes").into_response();
    response.headers_mut().insert(SET_COOKIE, cookie);
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
    session::revoke(&state, session.id).await?;
    let mut response = Redirect::to("/console/sign-in").into_response();
    response
        .headers_mut()
        .insert(SET_COOKIE, HeaderValue::from_static(session::CLEAR_COOKIE));
    layout::secure_headers(response.headers_mut());
    Ok(response)
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
