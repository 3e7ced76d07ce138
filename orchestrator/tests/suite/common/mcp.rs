//! Raw MCP over HTTP (`/mcp`, revision 2025-11-25): what the tests need beyond a well-behaved
//! client (other keys' sessions, methods out of turn, the transport's own answers).

use reqwest::Method;
use serde_json::{json, Value};

use super::TestApp;

/// One JSON-RPC message (or a bodiless GET/DELETE) to `/mcp`; returns (status, the session
/// header, the answer if any).
pub async fn request(
    app: &TestApp,
    method: Method,
    key: &str,
    session: Option<&str>,
    body: Option<Value>,
) -> (u16, Option<String>, Option<Value>) {
    let mut request = app
        .http
        .request(method, format!("{}/mcp", app.http_base))
        .bearer_auth(key)
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2025-11-25");
    if let Some(body) = body {
        request = request.json(&body);
    }
    if let Some(id) = session {
        request = request.header("Mcp-Session-Id", id);
    }
    let response = request.send().await.expect("request sent");
    let status = response.status().as_u16();
    let session = super::rest::header(&response, "mcp-session-id");
    let text = response.text().await.unwrap_or_default();
    let answer = serde_json::from_str::<Value>(&text).ok().or_else(|| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("id").is_some())
    });
    (status, session, answer)
}

/// `initialize` then `notifications/initialized` with `key`; returns the session id.
pub async fn open_session(app: &TestApp, key: &str) -> String {
    let (status, session, _) = request(
        app,
        Method::POST,
        key,
        None,
        Some(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}),
        ),
    )
    .await;
    assert_eq!(status, 200);
    let session = session.expect("a session id");
    let (status, _, _) = request(
        app,
        Method::POST,
        key,
        Some(&session),
        Some(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
    )
    .await;
    assert_eq!(status, 202);
    session
}

/// A `tools/call` on an open session; returns the JSON-RPC result (with `isError`).
pub async fn call_tool(
    app: &TestApp,
    key: &str,
    session: &str,
    name: &str,
    arguments: Value,
) -> Value {
    let (status, _, answer) = request(
        app,
        Method::POST,
        key,
        Some(session),
        Some(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}})),
    )
    .await;
    assert_eq!(status, 200, "{answer:?}");
    answer.expect("an answer")["result"].clone()
}

/// An MCP session one key opened ([`open_session`]): tool calls in it.
pub struct Session<'a> {
    app: &'a TestApp,
    key: String,
    /// The session's id.
    pub id: String,
}

impl<'a> Session<'a> {
    /// Opens a session on `app` with `key`.
    pub async fn open(app: &'a TestApp, key: &str) -> Session<'a> {
        let id = open_session(app, key).await;
        Session {
            app,
            key: key.to_owned(),
            id,
        }
    }

    /// A `tools/call` in this session; the JSON-RPC result (with `isError`).
    pub async fn call(&self, name: &str, arguments: Value) -> Value {
        call_tool(self.app, &self.key, &self.id, name, arguments).await
    }

    /// A call whose answer must be a tool error (`isError`); the result.
    pub async fn tool_error(&self, name: &str, arguments: Value) -> Value {
        self.expect(name, arguments, true).await
    }

    /// A call that must succeed (no `isError`); the result.
    pub async fn tool_ok(&self, name: &str, arguments: Value) -> Value {
        self.expect(name, arguments, false).await
    }

    async fn expect(&self, name: &str, arguments: Value, is_error: bool) -> Value {
        let shown = format!("{name} {arguments}");
        let result = self.call(name, arguments).await;
        assert_eq!(result["isError"], is_error, "{shown}: {result}");
        result
    }
}
