//! The REST client of the command line: one request and the node's JSON answer (a failure is
//! mapped to a [`CliError`] by `error.rs`).

use reqwest::Method;
use serde_json::Value;

use super::credentials;
use super::error::CliError;
use super::Connection;

/// Where a node is when nothing says otherwise.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8088";

/// What a request carries.
pub enum Body {
    /// Nothing.
    Empty,
    /// A JSON document.
    Json(Value),
    /// A manifest as YAML (or JSON) text.
    Yaml(String),
}

/// A node and the key to talk to it with.
pub struct Client {
    base: String,
    key: String,
    http: reqwest::Client,
    /// `--json`: print the node's answers as they are.
    pub json: bool,
}

impl Client {
    /// Resolves the URL and key (flag, environment, credentials file) for `conn`.
    pub fn new(conn: &Connection) -> Result<Self, CliError> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let given = conn
            .key
            .clone()
            .filter(|k| !k.trim().is_empty())
            .or_else(|| env("ORCHESTRATOR_API_KEY"));
        // The file matters only when no key was given (and for its url); a missing or unsafe
        // file is an error only then.
        let file = match credentials::load(conn.credentials.as_deref()) {
            Ok(f) => f,
            Err(_) if given.is_some() => None,
            Err(e) => return Err(e),
        };
        let key = credentials::pick_key(given, file.as_ref())?;
        let base = conn
            .url
            .clone()
            .filter(|u| !u.trim().is_empty())
            .or_else(|| file.as_ref().and_then(|f| f.url.clone()))
            .unwrap_or_else(|| DEFAULT_URL.to_owned());
        let base = base.trim().trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(CliError::Usage(format!(
                "--url: `{base}` is not an http:// or https:// URL"
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| CliError::Failed(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            base,
            key,
            http,
            json: conn.json,
        })
    }

    /// The node's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<Value, CliError> {
        self.send(Method::GET, path, Body::Empty).await
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: Value) -> Result<Value, CliError> {
        self.send(Method::POST, path, Body::Json(body)).await
    }

    /// `DELETE path`.
    pub async fn delete(&self, path: &str) -> Result<Value, CliError> {
        self.send(Method::DELETE, path, Body::Empty).await
    }

    /// One request; the JSON answer of a success, else the mapped error.
    pub async fn send(&self, method: Method, path: &str, body: Body) -> Result<Value, CliError> {
        let what = format!("{method} {path}");
        let response = self.request(method, path, body).await?;
        let status = response.status();
        let text = response.text().await.map_err(|e| CliError::Unreachable {
            url: self.base.clone(),
            reason: format!("the answer to {what} broke off: {e}"),
        })?;
        let value: Value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if !status.is_success() {
            return Err(CliError::from_answer(&what, status, &value));
        }
        Ok(value)
    }

    /// A request whose answer the caller reads itself (a stream); non-success answers are
    /// mapped to errors here.
    pub async fn open(&self, path: &str) -> Result<reqwest::Response, CliError> {
        let response = self.request(Method::GET, path, Body::Empty).await?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let text = response.text().await.unwrap_or_default();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Err(CliError::from_answer(
            &format!("GET {path}"),
            status,
            &value,
        ))
    }

    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Body,
    ) -> Result<reqwest::Response, CliError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method, &url).bearer_auth(&self.key);
        request = match body {
            Body::Empty => request,
            Body::Json(v) => request.json(&v),
            Body::Yaml(text) => request
                .header(reqwest::header::CONTENT_TYPE, "application/yaml")
                .body(text),
        };
        request.send().await.map_err(|e| CliError::Unreachable {
            url: self.base.clone(),
            reason: transport_reason(&e),
        })
    }
}

/// The innermost cause of a transport error (reqwest's own text is only "error sending request").
fn transport_reason(e: &reqwest::Error) -> String {
    let mut reason = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        reason = s.to_string();
        source = s.source();
    }
    reason
}

/// Percent-encodes one path segment (names and ids the user typed).
pub fn segment(raw: &str) -> String {
    url::form_urlencoded::byte_serialize(raw.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// `?a=b&c=d` from the pairs that have a value.
pub fn query(pairs: &[(&str, Option<String>)]) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    let mut any = false;
    for (k, v) in pairs {
        if let Some(v) = v {
            q.append_pair(k, v);
            any = true;
        }
    }
    if any {
        format!("?{}", q.finish())
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_queries_are_encoded() {
        assert_eq!(segment("a b/c"), "a%20b%2Fc");
        assert_eq!(
            query(&[("tool", Some("cmd.run".into())), ("x", None)]),
            "?tool=cmd.run"
        );
        assert_eq!(query(&[("x", None)]), "");
    }
}
