//! Where a request to a port carries a preview secret, and how it is taken off before the
//! request reaches the server: the query parameter `aegis_preview=<secret>` (the URL a preview
//! answers) or, on the requests a browser makes next, the cookie of the same name that the first
//! answer sets. The cookie has no `Domain`: it goes back only to that `<port>-<sandbox>` host, so
//! relative links, scripts and fetches of the page keep working and no other sandbox's host
//! gets it. Neither ever reaches the server in the sandbox.

use aegis_store::previews::PARAM;
use axum::extract::Request;
use axum::http::{header, HeaderValue};

/// A preview secret a request carried.
pub struct Found {
    /// The secret.
    pub secret: String,
    /// From the query (then the answer sets the cookie), not the cookie.
    pub from_query: bool,
}

/// Takes the preview secret off `request` (query first, then cookie), leaving the rest of its
/// query and cookies as they were.
pub fn take(request: &mut Request) -> Option<Found> {
    let mut found = None;
    if let Some(query) = request.uri().query() {
        let (ours, rest) = split_query(query);
        if let Some(secret) = ours {
            found = Some(Found {
                secret,
                from_query: true,
            });
            let path = request.uri().path();
            let uri = if rest.is_empty() {
                path.to_owned()
            } else {
                format!("{path}?{rest}")
            };
            let mut parts = request.uri().clone().into_parts();
            parts.path_and_query = uri.parse().ok();
            if let Ok(uri) = axum::http::Uri::from_parts(parts) {
                *request.uri_mut() = uri;
            }
        }
    }
    let cookies: Vec<String> = request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect();
    if cookies.is_empty() {
        return found;
    }
    let (ours, rest) = split_cookies(&cookies);
    if ours.is_none() {
        return found;
    }
    request.headers_mut().remove(header::COOKIE);
    if !rest.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&rest) {
            request.headers_mut().insert(header::COOKIE, v);
        }
    }
    found.or(ours.map(|secret| Found {
        secret,
        from_query: false,
    }))
}

/// When the secret came in the query, the answer sets the cookie the page's next requests carry.
pub fn remember<B>(response: &mut axum::http::Response<B>, found: &Found) {
    if !found.from_query {
        return;
    }
    let cookie = format!("{PARAM}={}; Path=/; HttpOnly; SameSite=Lax", found.secret);
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        response.headers_mut().append(header::SET_COOKIE, v);
    }
}

/// Our parameter's value, and the query without it.
fn split_query(query: &str) -> (Option<String>, String) {
    let mut ours = None;
    let mut rest = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((name, value)) if name == PARAM => ours = Some(value.to_owned()),
            _ if pair == PARAM => ours = Some(String::new()),
            _ => rest.push(pair),
        }
    }
    (ours, rest.join("&"))
}

/// Our cookie's value, and the other cookies as one `Cookie` value.
fn split_cookies(headers: &[String]) -> (Option<String>, String) {
    let mut ours = None;
    let mut rest = Vec::new();
    for cookie in headers.iter().flat_map(|h| h.split(';')) {
        let cookie = cookie.trim();
        match cookie.split_once('=') {
            Some((name, value)) if name.trim() == PARAM => ours = Some(value.trim().to_owned()),
            _ if cookie.is_empty() => {}
            _ => rest.push(cookie),
        }
    }
    (ours, rest.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_is_taken_off_the_query_and_the_cookies_and_nothing_else() {
        assert_eq!(
            split_query("a=1&aegis_preview=s3&b=2"),
            (Some("s3".to_owned()), "a=1&b=2".to_owned())
        );
        assert_eq!(split_query("a=1"), (None, "a=1".to_owned()));
        assert_eq!(
            split_cookies(&["x=1; aegis_preview=s3".to_owned(), "y=2".to_owned()]),
            (Some("s3".to_owned()), "x=1; y=2".to_owned())
        );
        assert_eq!(split_cookies(&["x=1".to_owned()]), (None, "x=1".to_owned()));
    }

    #[test]
    fn a_request_loses_its_secret_before_the_server() {
        let mut request = Request::builder()
            .uri("/page?aegis_preview=abc&q=1")
            .header(header::COOKIE, "aegis_preview=old; theme=dark")
            .body(axum::body::Body::empty())
            .expect("request");
        let found = take(&mut request).expect("found");
        assert_eq!(found.secret, "abc");
        assert!(found.from_query);
        assert_eq!(request.uri().to_string(), "/page?q=1");
        assert_eq!(request.headers()[header::COOKIE], "theme=dark");
        let mut only_cookie = Request::builder()
            .uri("/style.css")
            .header(header::COOKIE, "aegis_preview=abc")
            .body(axum::body::Body::empty())
            .expect("request");
        let found = take(&mut only_cookie).expect("found");
        assert!(!found.from_query);
        assert!(only_cookie.headers().get(header::COOKIE).is_none());
    }
}
