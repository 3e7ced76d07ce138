//! How a sandbox tool reaches the node's dispatcher, and the one mapping of what the dispatcher
//! and the executor refuse to tool errors with stable codes: shared by the one-shot tools
//! (`sandbox.rs`), live processes (`live.rs`) and streamed commands (`stream.rs`).

use dispatcher::DispatchError;

use super::{ToolContext, ToolError};

/// The tool error code of an executor's error kind: the one mapping of the executor's
/// refusals, for `fs.*` and `cmd.run` answers here and the live processes' (`live.rs`).
pub(super) fn executor_code(kind: &str) -> &'static str {
    match kind {
        "path_not_allowed" => "path_not_allowed",
        "not_found" => "not_found",
        "already_exists" => "conflict",
        "too_large" => "too_large",
        "no_space" => "no_space",
        "limit_reached" => "limit_reached",
        "hard_link_refused" => "hard_link_refused",
        "edit_target_not_found" => "edit_target_not_found",
        "edit_target_ambiguous" => "edit_target_ambiguous",
        "command_not_found" => "command_not_found",
        "not_a_directory" | "is_a_directory" | "not_a_regular_file" | "directory_not_empty" => {
            "invalid_target"
        }
        "permission_denied" => "permission_denied",
        "invalid_request" => "invalid_arguments",
        "busy" => "busy",
        _ => "sandbox_error",
    }
}

/// The node's dispatcher, or why sandbox tools are unavailable on it.
pub(super) fn dispatcher_of<'a>(
    ctx: &'a ToolContext<'_>,
) -> Result<&'a dispatcher::Dispatcher, ToolError> {
    ctx.state
        .sandboxes
        .dispatcher()
        .map_err(|e| ToolError::new("unavailable", e.to_string()))
}

/// The tool error of a dispatcher failure that is not an executor's refusal.
pub(super) fn dispatch_error(e: DispatchError) -> ToolError {
    match e {
        DispatchError::SandboxNotFound { .. } => ToolError::new("not_found", e.to_string()),
        DispatchError::SandboxGone { .. } => ToolError::new("sandbox_gone", e.to_string()),
        DispatchError::Timeout { .. } => ToolError::new("timeout", e.to_string()),
        // This replica's lease lapsed: another may hold the sandbox now, so a retry can work.
        DispatchError::LeaseLapsed { .. } => ToolError::new("unavailable", e.to_string()),
        // Its holder stopped or crashed and nobody took the sandbox over in time: a takeover
        // (after `dead_after` at most) may still, so a retry can work.
        DispatchError::HolderUnavailable { .. } => ToolError::new("unavailable", e.to_string()),
        other => ToolError::new("sandbox_error", other.to_string()),
    }
}

/// A refusal of the executor or dispatcher as a tool error with a stable code.
pub(super) fn refused(e: DispatchError) -> ToolError {
    match e {
        DispatchError::Refused { kind, message, .. } => {
            ToolError::new(executor_code(kind.as_str()), message)
        }
        other => dispatch_error(other),
    }
}
