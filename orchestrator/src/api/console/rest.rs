//! The console's only way to data: requests into the node's own REST router, in-process, carrying
//! the signed-in key as a bearer token, so the auth middleware, role checks, bound-key rules,
//! the router's policy and its audit rows are the ones every REST client meets.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{Method, Request, StatusCode};
use axum::response::Response;
use axum::Router;
use serde_json::Value;
use tower::Service;

use super::ConsoleError;
use crate::state::AppState;

/// Largest JSON answer the console reads from REST (an audit page, a file listing).
const ANSWER_MAX: usize = 16 * 1024 * 1024;

/// A handle on the node's REST router, built once on first use from the same state.
#[derive(Clone)]
pub struct Rest {
    state: AppState,
    router: Arc<OnceLock<Router>>,
}

/// One REST answer: its status and JSON body (`Null` when the body was not JSON).
#[derive(Debug)]
pub struct Answer {
    /// The HTTP status REST answered.
    pub status: StatusCode,
    /// The body as JSON.
    pub body: Value,
}

impl Answer {
    /// True for a 2xx answer.
    pub fn ok(&self) -> bool {
        self.status.is_success()
    }

    /// REST's error message (`error`) and code, for showing a refusal as REST gave it.
    pub fn refusal(&self) -> String {
        let message = self.body["error"].as_str().unwrap_or("no message");
        match self.body["code"].as_str() {
            Some(code) => format!("{} {code}: {message}", self.status.as_u16()),
            None => format!("{}: {message}", self.status.as_u16()),
        }
    }
}

impl Rest {
    /// A client of the REST router for `state`; the router is built lazily (it contains the
    /// console's own routes too, which build theirs only if ever used, which they never are).
    pub fn new(state: AppState) -> Self {
        Self {
            state,
            router: Arc::new(OnceLock::new()),
        }
    }

    /// Sends `method path` with an optional JSON body as `key` and returns REST's response.
    pub async fn send(
        &self,
        key: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Response, ConsoleError> {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(AUTHORIZATION, format!("Bearer {key}"));
        let body = match body {
            Some(v) => {
                builder = builder.header(CONTENT_TYPE, "application/json");
                Body::from(
                    serde_json::to_vec(v).map_err(|e| ConsoleError::Internal(e.to_string()))?,
                )
            }
            None => Body::empty(),
        };
        let request = builder
            .body(body)
            .map_err(|e| ConsoleError::Internal(format!("request to {path}: {e}")))?;
        let mut router = self
            .router
            .get_or_init(|| crate::api::rest::router(self.state.clone()))
            .clone();
        std::future::poll_fn(|cx| <Router as Service<Request<Body>>>::poll_ready(&mut router, cx))
            .await
            .map_err(|e| ConsoleError::Internal(e.to_string()))?;
        router
            .call(request)
            .await
            .map_err(|e| ConsoleError::Internal(e.to_string()))
    }

    /// Sends a request and reads its JSON answer. A 401 means the key no longer authenticates
    /// (revoked, expired): the caller ends the session.
    pub async fn json(
        &self,
        key: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, ConsoleError> {
        let response = self.send(key, method, path, body).await?;
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED {
            return Err(ConsoleError::SignIn);
        }
        let bytes = axum::body::to_bytes(response.into_body(), ANSWER_MAX)
            .await
            .map_err(|e| ConsoleError::Internal(format!("reading {path}: {e}")))?;
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok(Answer { status, body })
    }

    /// `GET path` as `key`, its body as text (`/metrics`, whose answer is not JSON).
    pub async fn text(&self, key: &str, path: &str) -> Result<(StatusCode, String), ConsoleError> {
        let response = self.send(key, Method::GET, path, None).await?;
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), ANSWER_MAX)
            .await
            .map_err(|e| ConsoleError::Internal(format!("reading {path}: {e}")))?;
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// `GET path` as `key`.
    pub async fn get(&self, key: &str, path: &str) -> Result<Answer, ConsoleError> {
        self.json(key, Method::GET, path, None).await
    }
}
