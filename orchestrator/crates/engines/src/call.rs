//! The vocabulary of one tool call, shared by the router that runs it and the services that
//! ask for it (the agent loop, the SEAL gateway): what a call may end in (`CallError` before
//! the tool ran, `ToolOutcome` after), the last gate before it runs, and `ToolInvoker`, the
//! one call those services make upward to the router. They hold an invoker, never the router
//! or the application state, so the router can sit above them.

use std::sync::Arc;

use dispatcher::SandboxId;
use futures_util::future::BoxFuture;
use serde::Serialize;
use serde_json::{json, Value};

use aegis_core::arguments::{to_json_vec, to_json_within};
use aegis_core::caller::Caller;
use aegis_core::catalog::ToolSpec;

/// One schema violation in a call's arguments.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct ArgViolation {
    /// JSON pointer into the arguments (`""` for the whole object).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// A call refused before its tool ran.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No such tool in the catalog.
    #[error("unknown tool `{name}`; see aegis.tools.list for the tools this node implements")]
    UnknownTool {
        /// The requested name.
        name: String,
    },
    /// Arguments do not match the tool's schema.
    #[error("invalid arguments for `{tool}`: {}", .violations.iter().map(|v| format!("{}: {}", if v.path.is_empty() { "(root)" } else { &v.path }, v.message)).collect::<Vec<_>>().join("; "))]
    InvalidArguments {
        /// The tool.
        tool: String,
        /// Every violation, with its JSON pointer.
        violations: Vec<ArgViolation>,
    },
    /// Policy refused the call.
    #[error("{tool} denied: {denial}")]
    Denied {
        /// The tool.
        tool: String,
        /// The decision of the one policy path, with its code and message.
        denial: aegis_policy::Denial,
    },
    /// The tool belongs to an external MCP server whose tools cannot be listed now.
    #[error("`{tool}` is not available now: {reason}")]
    Unavailable {
        /// The tool.
        tool: String,
        /// Why (the server's failure).
        reason: String,
    },
    /// The audit row could not be written; the call's result is withheld.
    #[error("audit log unavailable: {0}")]
    Audit(#[source] sqlx::Error),
    /// The catalog could not be loaded (packaging bug).
    #[error(transparent)]
    Catalog(#[from] aegis_core::catalog::CatalogError),
}

/// Results up to this size are repeated as JSON text in the MCP `content` block.
pub const TEXT_COPY_MAX_BYTES: usize = 16 * 1024;

/// The answer of a tool that ran.
#[derive(Debug, Clone)]
pub struct ToolOutcome {
    /// The tool's output or its failure.
    pub result: Result<Value, ToolError>,
    /// Time spent in the handler.
    pub duration_ms: u64,
    /// The output's canonical JSON (`aegis_store::audit::canonical`), which the router made
    /// for the completion row's digest: the MCP text copy and a door that answers JSON
    /// ([`ToolOutcome::into_mcp_json`]) reuse these bytes instead of serialising the output
    /// again. `None` for a failure. It must be the canonical text of `result`'s value.
    pub canonical: Option<Arc<String>>,
}

impl ToolOutcome {
    /// The MCP result shape: text content, structured content, and the error flag.
    ///
    /// MCP asks for the structured result to be repeated as JSON text for older clients; we do
    /// that up to [`TEXT_COPY_MAX_BYTES`]. A larger result (a 64 KiB file read, a long command
    /// output) is not serialised, sent and parsed twice: its text block says where it is.
    pub fn into_mcp(self) -> Value {
        match self.result {
            Ok(output) => {
                let text = text_copy(&output, self.canonical.as_deref().map(String::as_str));
                // Built by hand: `json!` would copy the (possibly large) output once more.
                let mut result = serde_json::Map::with_capacity(3);
                result.insert(
                    "content".to_owned(),
                    json!([{"type": "text", "text": text}]),
                );
                result.insert("structuredContent".to_owned(), output);
                result.insert("isError".to_owned(), Value::Bool(false));
                Value::Object(result)
            }
            Err(e) => {
                let error = json!({"code": e.code, "message": e.message, "details": e.details});
                json!({
                    "content": [{"type": "text", "text": format!("error ({}): {}", e.code, e.message)}],
                    "structuredContent": {"error": error},
                    "isError": true,
                })
            }
        }
    }

    /// The compact JSON of [`ToolOutcome::into_mcp`], byte for byte, for a door that answers
    /// with it (REST). A result whose canonical text the router kept is not serialised again:
    /// those bytes are the `structuredContent`, and the text copy when it is small enough.
    pub fn into_mcp_json(self) -> Vec<u8> {
        let (Ok(output), Some(canonical)) = (&self.result, &self.canonical) else {
            return to_json_vec(&self.into_mcp());
        };
        let text = text_copy(output, Some(canonical.as_str()));
        // The value is not needed any more: only its text is sent.
        drop(self.result);
        // The keys in the order serde_json writes a map's (sorted), as `into_mcp` would.
        let mut out = Vec::with_capacity(canonical.len() + text.len() + 96);
        out.extend_from_slice(br#"{"content":[{"text":"#);
        // A string always serialises, and writing to memory cannot fail.
        let _ = serde_json::to_writer(&mut out, &text);
        out.extend_from_slice(br#","type":"text"}],"isError":false,"structuredContent":"#);
        out.extend_from_slice(canonical.as_bytes());
        out.push(b'}');
        out
    }

    /// [`ToolOutcome::into_mcp`] for a caller that still needs the outcome.
    pub fn to_mcp(&self) -> Value {
        self.clone().into_mcp()
    }
}

/// The MCP text copy of a result: its JSON when at most [`TEXT_COPY_MAX_BYTES`] long (the
/// canonical text when the router kept it, else serialised only as far as the bound, so a
/// large result is not escaped in full just to learn that it is large), else where it is.
fn text_copy(output: &Value, canonical: Option<&str>) -> String {
    let within = match canonical {
        Some(text) => (text.len() <= TEXT_COPY_MAX_BYTES).then(|| text.to_owned()),
        None => to_json_within(output, TEXT_COPY_MAX_BYTES),
    };
    within.unwrap_or_else(|| {
        format!(
            "The result is more than {TEXT_COPY_MAX_BYTES} bytes of JSON; it is in \
             structuredContent (not repeated here)."
        )
    })
}

/// A failure inside a tool that ran: reported to the caller as an `isError` result.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("{message}")]
pub struct ToolError {
    /// Stable machine-readable code (`not_found`, `conflict`, `invalid_manifest`, ...).
    pub code: &'static str,
    /// What went wrong, for people and models.
    pub message: String,
    /// Structured details (e.g. every manifest error with path and line).
    pub details: Option<Value>,
}

impl ToolError {
    /// A failure with no details.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: None,
        }
    }

    /// Adds structured details.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// An unexpected internal failure; the message is logged, the caller gets a generic text.
    pub fn internal(e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "tool failed internally");
        Self::new("internal", format!("internal error: {e}"))
    }
}

/// What a streaming call sends while its tool runs: the streaming form of a foreground
/// `cmd.run` sends `Started`, then its output as the command writes it (each chunk ends on a
/// UTF-8 character boundary when the output is text). The call's result comes after, as for a
/// call that does not stream; other tools send nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputChunk {
    /// The command runs, with this pid in its sandbox: a door may open its stream.
    Started {
        /// Its pid in the sandbox.
        pid: u32,
    },
    /// Bytes it wrote to stdout (within its output cap).
    Stdout(Vec<u8>),
    /// Bytes it wrote to stderr (within its output cap).
    Stderr(Vec<u8>),
}

/// Where a streaming call's chunks go. Unbounded because what it carries is already bounded by
/// the command's output cap (per stream), which the result holds again anyway; a slow client
/// therefore never makes the node drop output the result would have had.
pub type OutputSink = tokio::sync::mpsc::UnboundedSender<OutputChunk>;

/// A last check of a call that policy allowed, made just before it runs: an agent's
/// `spec.execution.tool_validation` judges. It sees the validated arguments; a refusal is a
/// denial like any other (audited with code `tool_validation`, its reasoning in the answer).
pub trait CallGate: Send + Sync {
    /// `Ok` lets the call run; `Err` refuses it with the reason.
    fn admit<'a>(
        &'a self,
        tool: &'a str,
        arguments: &'a Value,
    ) -> futures_util::future::BoxFuture<'a, Result<(), aegis_policy::Denial>>;
}

/// The router, as the services below it see it: run one call (in a sandbox for `cmd.run` and
/// `fs.*`, behind an optional gate), and list what an external MCP server entry of a manifest
/// offers. Implemented by the API layer's composition root, which holds the router.
pub trait ToolInvoker: Send + Sync {
    /// Runs one tool call for `caller` through the one policy path.
    fn invoke<'a>(
        &'a self,
        caller: &'a Caller,
        tool: &'a str,
        arguments: Value,
        sandbox: Option<SandboxId>,
        gate: Option<&'a dyn CallGate>,
    ) -> BoxFuture<'a, Result<ToolOutcome, CallError>>;

    /// [`ToolInvoker::invoke`] in its streaming form (no gate: a door's call): the same
    /// decision, audit rows and result, with a foreground `cmd.run`'s output sent to `output`
    /// as it comes. Dropping the future kills the command, like a dropped call cancels one.
    fn invoke_streaming<'a>(
        &'a self,
        caller: &'a Caller,
        tool: &'a str,
        arguments: Value,
        sandbox: Option<SandboxId>,
        output: OutputSink,
    ) -> BoxFuture<'a, Result<ToolOutcome, CallError>>;

    /// The tools a manifest's `mcp:<server>` / `mcp:<server>/<tool>` entry offers.
    fn offered<'a>(&'a self, entry: &'a str) -> BoxFuture<'a, Result<Vec<ToolSpec>, String>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(value: &Value, canonical: bool) -> ToolOutcome {
        ToolOutcome {
            result: Ok(value.clone()),
            duration_ms: 3,
            canonical: canonical.then(|| Arc::new(aegis_store::audit::canonical(value))),
        }
    }

    /// The REST answer made from the router's canonical text is byte for byte the one made by
    /// serialising the MCP shape, for small and large results, escapes, non-ASCII text, nested
    /// maps built out of key order, numbers, and failures.
    #[test]
    fn the_mcp_json_from_the_canonical_text_is_the_serialised_mcp_shape() {
        let mut unordered = serde_json::Map::new();
        unordered.insert("zeta".into(), json!(1));
        unordered.insert("alpha".into(), json!({"y": [1.5, -2, null], "b": true}));
        let values = [
            json!({"status": "ok", "content": "line 1\nline \"2\"\t\u{7f}\u{1}", "size_bytes": 17}),
            json!({"text": "grüße, 東京, 🦀", "n": 1e-7, "big": u64::MAX}),
            Value::Object(unordered),
            json!({"content": "x".repeat(TEXT_COPY_MAX_BYTES - 14)}),
            json!({"content": "x".repeat(TEXT_COPY_MAX_BYTES - 13)}),
            json!({"content": "a\n".repeat(40_000)}),
            json!([]),
            json!("just text"),
            Value::Null,
        ];
        for value in &values {
            let expected = to_json_vec(&outcome(value, false).into_mcp());
            assert_eq!(
                String::from_utf8(outcome(value, true).into_mcp_json()).unwrap(),
                String::from_utf8(expected.clone()).unwrap(),
                "{value}"
            );
            assert_eq!(outcome(value, false).into_mcp_json(), expected);
            assert_eq!(
                outcome(value, true).into_mcp(),
                outcome(value, false).into_mcp()
            );
        }
        // The boundary of the text copy is the serialised length, inclusive.
        let at_bound = json!({"content": "x".repeat(TEXT_COPY_MAX_BYTES - 14)});
        assert_eq!(
            aegis_store::audit::canonical(&at_bound).len(),
            TEXT_COPY_MAX_BYTES
        );
        let copied = outcome(&at_bound, true).into_mcp();
        assert_eq!(
            copied["content"][0]["text"].as_str().unwrap().len(),
            TEXT_COPY_MAX_BYTES
        );
        let failed = ToolOutcome {
            result: Err(ToolError::new("not_found", "no such file")),
            duration_ms: 1,
            canonical: None,
        };
        assert_eq!(
            failed.clone().into_mcp_json(),
            to_json_vec(&failed.into_mcp())
        );
    }
}
