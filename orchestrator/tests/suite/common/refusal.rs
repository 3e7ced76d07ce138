//! What a SEAL client's call must come to (approvals, secrets, seal, speed, ...): a refusal, or
//! an answer that is no tool error; one helper each instead of a copy per suite.

use aegis_cli::seal_client::{ClientError, SealClient};
use serde_json::Value;

/// The SEAL code, transport status and message of a call that must have been refused; fails the
/// test with what came back otherwise.
pub fn refused(result: Result<Value, ClientError>) -> (u32, u16, String) {
    refusal_of(result, "the call")
}

/// [`refused`] for a call shown as `what` in the failure.
fn refusal_of(result: Result<Value, ClientError>, what: &str) -> (u32, u16, String) {
    match result {
        Err(ClientError::Refused {
            code,
            status,
            message,
            ..
        }) => (code, status, message),
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

/// A tool call through the SEAL session of `client` that must be refused; its SEAL code,
/// transport status and message (a failure names the tool and its arguments).
pub async fn seal_refused(client: &SealClient, tool: &str, arguments: Value) -> (u32, u16, String) {
    let what = format!("{tool} {arguments}");
    refusal_of(client.call_tool(tool, arguments).await, &what)
}

/// A tool call through the SEAL session of `client` that must succeed (answered, and not
/// `isError`); the answer.
pub async fn seal_ok(client: &SealClient, tool: &str, arguments: Value) -> Value {
    let answer = client
        .call_tool(tool, arguments)
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e:?}"));
    assert_eq!(answer["isError"], false, "{tool}: {answer}");
    answer
}

/// Writes `content` to `path` through the SEAL session of `client` (`fs.write`), which must
/// succeed; the answer.
pub async fn seal_written(client: &SealClient, path: &str, content: &str) -> Value {
    let arguments = serde_json::json!({ "path": path, "content": content });
    seal_ok(client, "fs.write", arguments).await
}

/// Starts agent `agent` through the SEAL session of `client` (`aegis.task.execute`); the new
/// execution's id.
pub async fn seal_started(client: &SealClient, agent: &str) -> String {
    let started = client
        .call_tool(
            "aegis.task.execute",
            serde_json::json!({ "agent_id": agent }),
        )
        .await
        .unwrap_or_else(|e| panic!("{agent} not started: {e:?}"));
    started["structuredContent"]["execution_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{agent} not started: {started}"))
        .to_owned()
}
