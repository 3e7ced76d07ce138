//! The one place that decides whether a caller may call a tool.
//!
//! Today: the tier check (a caller may call tools of its tier and below). The SEAL security
//! context and the agent manifest's allowlists join here as further conjuncts; the effective
//! policy is always the intersection, and nothing else in the service makes this decision.

pub mod command;

use serde::Serialize;
use serde_json::Value;

use crate::caller::Caller;
use crate::tools::Tool;

/// Why a call was refused.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Denial {
    /// Stable code (`tier`, ...).
    pub code: &'static str,
    /// Human explanation naming the rule.
    pub message: String,
}

/// Decides whether `caller` may call `tool` with `args`.
pub fn check_tool(caller: &Caller, tool: &Tool, _args: &Value) -> Result<(), Denial> {
    if caller.tier < tool.tier {
        return Err(Denial {
            code: "tier",
            message: format!(
                "`{}` needs the {} tier; this caller has the {} tier",
                tool.name,
                tool.tier.as_str(),
                caller.tier.as_str()
            ),
        });
    }
    Ok(())
}

/// True when `caller` would pass the checks that do not depend on arguments (for listings).
pub fn may_see(caller: &Caller, tool: &Tool) -> bool {
    caller.tier >= tool.tier
}
