//! The page shell every console page shares: HTML escaping, the navigation, the security
//! headers (a strict Content-Security-Policy: only this node's own stylesheet and script, no
//! inline code, no frames), and the two static assets, compiled into the binary so the console
//! works without any network.

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::session::Session;

/// Every console answer's policy: nothing from elsewhere, no inline script or style, forms only
/// back to this node, never framed.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; \
                   object-src 'none'";

const STYLESHEET: &str = include_str!("static/console.css");
const SCRIPT: &str = include_str!("static/console.js");
const FAVICON: &str = include_str!("static/favicon.svg");

/// Escapes text for HTML element content and quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes one URL path segment (ids and names in links), then for HTML.
pub fn seg(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// Adds the headers every console answer carries.
pub fn secure_headers(h: &mut HeaderMap) {
    h.insert(
        HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static(CSP),
    );
    h.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        HeaderName::from_static("referrer-policy"),
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        HeaderName::from_static("x-frame-options"),
        HeaderValue::from_static("DENY"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// The pages in the navigation: (path, label, admin only).
const NAV: &[(&str, &str, bool)] = &[
    ("/console/sandboxes", "Sandboxes", false),
    ("/console/runs", "Runs", false),
    ("/console/approvals", "Approvals", false),
    ("/console/audit", "Audit", false),
    ("/console/keys", "Keys", true),
    ("/console/node", "Node", false),
];

/// A whole page: `body` is already-escaped HTML; `active` is the navigation entry to mark.
pub fn page(
    status: StatusCode,
    title: &str,
    session: Option<&Session>,
    active: &str,
    body: &str,
) -> Response {
    let nav = match session {
        Some(s) => {
            let links: String = NAV
                .iter()
                .filter(|(_, _, admin)| !admin || s.is_admin())
                .map(|(href, label, _)| {
                    let current = if *href == active {
                        " aria-current=\"page\""
                    } else {
                        ""
                    };
                    format!("<li><a href=\"{href}\"{current}>{label}</a></li>")
                })
                .collect();
            let role = s.caller.role.map(|r| r.as_str()).unwrap_or("none");
            let bound = s
                .caller
                .seal
                .as_ref()
                .map(|scope| format!(", bound to {}", esc(&scope.context.name)))
                .unwrap_or_default();
            format!(
                "<nav aria-label=\"Console\"><ul>{links}</ul>\
                 <div class=\"who\"><span id=\"who\">{} ({role}{bound})</span>\
                 <form method=\"post\" action=\"/console/sign-out\">{}\
                 <button type=\"submit\" id=\"sign-out\">Sign out</button></form></div></nav>",
                esc(&s.caller.label),
                csrf_field(s)
            )
        }
        None => String::new(),
    };
    let html = format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · orchestrator console</title>\
         <link rel=\"icon\" href=\"/console/static/favicon.svg\">\
         <link rel=\"stylesheet\" href=\"/console/static/console.css\">\
         <script src=\"/console/static/console.js\" defer></script></head>\
         <body><header><a class=\"brand\" href=\"/console\">orchestrator console</a>{nav}</header>\
         <main id=\"main\">{body}</main></body></html>",
        esc(title)
    );
    let mut response = (status, html).into_response();
    let h = response.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    secure_headers(h);
    response
}

/// A page with one message (errors, refusals), without the navigation.
pub fn message(status: StatusCode, title: &str, text: &str) -> Response {
    let body = format!(
        "<h1>{}</h1><p class=\"error\" role=\"alert\">{}</p><p><a href=\"/console\">Back to the console</a></p>",
        esc(title),
        esc(text)
    );
    page(status, title, None, "", &body)
}

/// The hidden form-token field of `session`.
pub fn csrf_field(session: &Session) -> String {
    format!(
        "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
        super::csrf::FIELD,
        esc(&session.csrf)
    )
}

/// `GET /console/static/console.css`.
pub async fn stylesheet() -> Response {
    asset("text/css; charset=utf-8", STYLESHEET)
}

/// `GET /console/static/favicon.svg`: a browser asks for an icon; one of our own, so it never
/// asks elsewhere (and no 404 lands in its console).
pub async fn favicon() -> Response {
    asset("image/svg+xml", FAVICON)
}

/// `GET /console/static/console.js`.
pub async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

fn asset(content_type: &'static str, text: &'static str) -> Response {
    let mut response = text.into_response();
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    secure_headers(h);
    h.insert(CACHE_CONTROL, HeaderValue::from_static("max-age=300"));
    response
}
