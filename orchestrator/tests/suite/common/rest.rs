//! REST requests to a node as the holder of one key, answered as (status, body): one place for
//! the request chain (method, path, key, body, send) every suite otherwise writes out per call.

use reqwest::Method;
use serde_json::Value;

/// A node's REST API (by base URL) as the holder of `key`.
pub struct Rest {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Rest {
    /// The node at `base` (`http://host:port`), reached with `http`, as `key`.
    pub fn new(http: reqwest::Client, base: &str, key: &str) -> Self {
        Self {
            http,
            base: base.to_owned(),
            key: key.to_owned(),
        }
    }

    /// A request builder for `method path` with the key attached.
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{}", self.base, path))
            .bearer_auth(&self.key)
    }

    /// `method path` with `body` as JSON when given: the response as it came, for a test that
    /// reads its status, headers or body itself.
    pub async fn response(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> reqwest::Response {
        let mut r = self.request(method, path);
        if let Some(body) = body {
            r = r.json(body);
        }
        r.send().await.expect("request sent")
    }

    /// `POST path` with `body` as JSON: the response as it came.
    pub async fn post_json(&self, path: &str, body: &Value) -> reqwest::Response {
        self.response(Method::POST, path, Some(body)).await
    }

    /// `method path` with `body` as JSON when given; (status, the answer's text).
    pub async fn text(&self, method: Method, path: &str, body: Option<Value>) -> (u16, String) {
        let r = self.response(method, path, body.as_ref()).await;
        let status = r.status().as_u16();
        (status, r.text().await.unwrap_or_default())
    }

    /// `method path` with `body` as JSON when given; (status, answer as [`body_of`] reads it).
    pub async fn send(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let (status, text) = self.text(method, path, body).await;
        (status, lenient(text))
    }

    /// [`Rest::send`] whose answer must be JSON; (status, answer).
    pub async fn send_json(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let shown = format!("{method} {path}");
        let (status, text) = self.text(method, path, body).await;
        let answer = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{shown}: {status}, not JSON ({e}): {text}"));
        (status, answer)
    }

    /// The answer to `GET path`, which must be JSON, whatever its status (a test that cares
    /// checks the body).
    pub async fn get_value(&self, path: &str) -> Value {
        self.send_json(Method::GET, path, None).await.1
    }

    /// [`Rest::send`] that must be answered with `status` and, unless the answer is empty, with
    /// JSON; the answer (`null` when empty).
    pub async fn answered(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        status: u16,
    ) -> Value {
        let shown = format!("{method} {path}");
        let (got, text) = self.text(method, path, body).await;
        assert_eq!(got, status, "{shown}: {text}");
        if text.is_empty() {
            return Value::Null;
        }
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{shown}: not JSON ({e}): {text}"))
    }

    /// `POST path` with `body` as JSON, which must be answered with `status`; the answer (see
    /// [`Rest::answered`]).
    pub async fn posted(&self, path: &str, body: Value, status: u16) -> Value {
        self.answered(Method::POST, path, Some(body), status).await
    }

    /// Cancels agent execution `id`, which must be answered with `status`; the answer.
    pub async fn cancel_execution(&self, id: &str, status: u16) -> Value {
        let path = format!("/v1/executions/{id}/cancel");
        self.answered(Method::POST, &path, None, status).await
    }

    /// `POST path` (an agent's `execute`, a workflow's `run`) with `{"input": input}`, which
    /// must be accepted (201); the new execution's id.
    pub async fn started(&self, path: &str, input: Value) -> String {
        let body = self
            .answered(
                Method::POST,
                path,
                Some(serde_json::json!({ "input": input })),
                201,
            )
            .await;
        body["execution_id"]
            .as_str()
            .unwrap_or_else(|| panic!("POST {path}: no execution id in {body}"))
            .to_owned()
    }

    /// `POST path` with `manifest` (YAML, no content type: the deploy routes read any) as the
    /// body; (status, answer).
    pub async fn post_manifest(&self, path: &str, manifest: &str) -> (u16, Value) {
        let r = self
            .request(Method::POST, path)
            .body(manifest.to_owned())
            .send()
            .await
            .expect("request sent");
        body_of(r).await
    }

    /// Deploys `manifest` to `path` (`/v1/agents`, `/v1/workflows`), which must be accepted
    /// (201); the answer.
    pub async fn deployed(&self, path: &str, manifest: &str) -> Value {
        let (status, body) = self.post_manifest(path, manifest).await;
        assert_eq!(status, 201, "{body}");
        body
    }
}

/// The header `name` of a response, when it is there and is text.
pub fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A body as JSON, or as a JSON string when it is not JSON (`null` when empty).
pub async fn body_of(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    (status, lenient(r.text().await.unwrap_or_default()))
}

/// `text` as JSON, or as a JSON string when it is not JSON (`null` when empty).
fn lenient(text: String) -> Value {
    if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    }
}

/// A request written out by hand (another header, another client), or the response to one,
/// read as JSON whatever its status: one call for the send, read and parse chain.
pub trait JsonAnswer {
    /// The answer as JSON (as `T`); fails the test when nothing came back or it is not that.
    fn json_answer<T: serde::de::DeserializeOwned + Send>(
        self,
    ) -> impl std::future::Future<Output = T> + Send;
}

impl JsonAnswer for reqwest::RequestBuilder {
    async fn json_answer<T: serde::de::DeserializeOwned + Send>(self) -> T {
        self.send().await.expect("request sent").json_answer().await
    }
}

impl JsonAnswer for reqwest::Response {
    async fn json_answer<T: serde::de::DeserializeOwned + Send>(self) -> T {
        self.json().await.expect("a JSON answer")
    }
}
