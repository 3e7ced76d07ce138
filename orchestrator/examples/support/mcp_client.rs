//! A minimal MCP client over Streamable HTTP (JSON-RPC in a POST, the answer as JSON or as an SSE
//! stream), for the load benchmark's MCP rows. It does what every MCP client does for a tool call:
//! `initialize` (the server names the session in `Mcp-Session-Id`), `notifications/initialized`,
//! then `tools/call` with the session id and the protocol version on every request, and `DELETE`
//! at the end. Hand-written rather than rmcp's client: rmcp's HTTP client transport needs
//! reqwest 0.13, a second major version beside the 0.12 the tree already has.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

/// The protocol revision this client speaks (with sessions).
pub const PROTOCOL: &str = "2025-11-25";

/// One MCP session of one API key.
pub struct McpClient {
    http: reqwest::Client,
    url: String,
    key: String,
    session: String,
    next_id: AtomicU64,
}

impl McpClient {
    /// Opens a session at `url` (`http://host:port/mcp`) with a bearer key bound to a context.
    pub async fn connect(http: reqwest::Client, url: String, key: String) -> Result<Self> {
        let mut client = Self {
            http,
            url,
            key,
            session: String::new(),
            next_id: AtomicU64::new(1),
        };
        let (session, answer) = client
            .post(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": PROTOCOL, "capabilities": {},
                "clientInfo": {"name": "load-bench", "version": "0"}}}),
            )
            .await
            .context("MCP initialize")?;
        answer
            .and_then(|a| a.get("result").cloned())
            .ok_or_else(|| anyhow!("MCP initialize: no result"))?;
        client.session = session.ok_or_else(|| anyhow!("MCP initialize: no Mcp-Session-Id"))?;
        client
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await
            .context("MCP notifications/initialized")?;
        Ok(client)
    }

    /// The session id the server gave.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// `tools/call`: the tool's MCP result (`content`, `structuredContent`, `isError`).
    pub async fn call_tool(&self, name: &str, arguments: Value) -> Result<Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (_, answer) = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                         "params": {"name": name, "arguments": arguments}}))
            .await?;
        let mut answer = answer.ok_or_else(|| anyhow!("tools/call {name}: no answer"))?;
        if let Some(error) = answer.get("error") {
            bail!("tools/call {name}: JSON-RPC error {error}");
        }
        if answer["id"] != id {
            bail!(
                "tools/call {name}: answer for id {} instead of {id}",
                answer["id"]
            );
        }
        Ok(answer["result"].take())
    }

    /// Ends the session (the server destroys its sandbox).
    pub async fn close(&self) -> Result<()> {
        let r = self
            .http
            .delete(&self.url)
            .bearer_auth(&self.key)
            .header("Mcp-Session-Id", &self.session)
            .header("MCP-Protocol-Version", PROTOCOL)
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("DELETE {}: {}", self.url, r.status());
        }
        Ok(())
    }

    /// POSTs one message; returns the session header and the JSON-RPC answer (none for a
    /// notification, which gets 202).
    async fn post(&self, body: Value) -> Result<(Option<String>, Option<Value>)> {
        let mut request = self
            .http
            .post(&self.url)
            .bearer_auth(&self.key)
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", PROTOCOL)
            .json(&body);
        if !self.session.is_empty() {
            request = request.header("Mcp-Session-Id", &self.session);
        }
        let response = request.send().await?;
        let status = response.status();
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let sse = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("text/event-stream"));
        let text = response.text().await?;
        if !status.is_success() {
            let mut text = text;
            text.truncate(300);
            bail!("POST {}: {status}: {text}", self.url);
        }
        if status == reqwest::StatusCode::ACCEPTED || text.trim().is_empty() {
            return Ok((session, None));
        }
        let answer = if sse {
            // Each event's `data:` lines joined; the answer is the event that carries an id.
            let mut found = None;
            for event in text.split("\n\n") {
                let data: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue;
                }
                if let Ok(v) = serde_json::from_str::<Value>(&data.join("\n")) {
                    if v.get("id").is_some() {
                        found = Some(v);
                        break;
                    }
                }
            }
            found.ok_or_else(|| anyhow!("an SSE answer without a JSON-RPC response"))?
        } else {
            serde_json::from_str(&text).context("a JSON answer that does not parse")?
        };
        Ok((session, Some(answer)))
    }
}
