//! One tool call through the router (`POST /v1/tools/call`), as `tools call` and the sandbox
//! verbs make it, and how its MCP-shaped answer becomes a value or a [`CliError`].

use serde_json::{json, Value};

use super::client::Client;
use super::error::CliError;

/// Calls a sandbox tool; a tool error (`isError`) is a failed call.
pub async fn call(
    client: &Client,
    id: &str,
    tool: &str,
    arguments: Value,
) -> Result<Value, CliError> {
    let sandbox: uuid::Uuid = id.parse().map_err(|_| {
        CliError::Usage(format!(
            "`{id}` is not a sandbox id (a UUID, as `sandbox create` prints)"
        ))
    })?;
    let out = client
        .post(
            "/v1/tools/call",
            json!({"name": tool, "arguments": arguments, "sandbox_id": sandbox}),
        )
        .await?;
    result(tool, out)
}

/// Calls a tool that acts in no sandbox (`aegis.*`, `web.*`).
pub async fn call_outside_sandboxes(
    client: &Client,
    tool: &str,
    arguments: Value,
) -> Result<Value, CliError> {
    let out = client
        .post(
            "/v1/tools/call",
            json!({"name": tool, "arguments": arguments}),
        )
        .await?;
    result(tool, out)
}

/// The structured result of an MCP-shaped tool answer; `isError` becomes a failed call.
pub fn result(tool: &str, answer: Value) -> Result<Value, CliError> {
    if answer["isError"] == true {
        let error = &answer["structuredContent"]["error"];
        let code = error["code"].as_str().unwrap_or("error");
        let message = error["message"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| answer["content"][0]["text"].to_string());
        let text = format!("{tool} failed ({code}): {message}");
        return Err(
            if matches!(code, "not_found" | "sandbox_gone" | "sandbox_unavailable") {
                CliError::NotFound(text)
            } else {
                CliError::Failed(text)
            },
        );
    }
    Ok(match answer.get("structuredContent") {
        Some(v) => v.clone(),
        None => answer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_errors_are_failed_calls_and_results_are_unwrapped() {
        let ok = json!({"content": [], "structuredContent": {"a": 1}, "isError": false});
        assert_eq!(result("t", ok).unwrap(), json!({"a": 1}));
        let bad = json!({"isError": true, "structuredContent": {"error": {"code": "not_found", "message": "no file x"}}});
        let e = result("fs.read", bad).unwrap_err();
        assert_eq!(e.exit_code(), 5);
        assert_eq!(e.to_string(), "fs.read failed (not_found): no file x");
    }
}
