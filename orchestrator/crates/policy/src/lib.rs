//! The one place that decides whether a caller may call a tool.
//!
//! Today: the tier check (a caller may call tools of its tier and below). The SEAL security
//! context and the agent manifest's allowlists join here as further conjuncts; the effective
//! policy is always the intersection, and nothing else in the service makes this decision.

pub mod command;
pub mod executions;
pub mod paths;
pub mod sandboxes;

use serde::Serialize;
use serde_json::Value;

use crate::command::CommandPolicy;
use aegis_core::caller::Caller;
use aegis_core::catalog::ToolSpec as Tool;

/// Why a call was refused.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Denial {
    /// Stable code (`tier`, `path_not_allowed`, `command_not_allowed`, ...).
    pub code: &'static str,
    /// Human explanation naming the rule.
    pub message: String,
    /// The SEAL code (2000-2006) when a security context refused the call.
    pub seal_code: Option<u32>,
    /// For rate limits: when to try again.
    #[serde(skip)]
    pub retry_after_secs: Option<u64>,
}

/// Decides whether `caller` may call `tool` with `args`.
pub fn check_tool(caller: &Caller, tool: &Tool, args: &Value) -> Result<(), Denial> {
    check_action(caller, &tool.name, tool.tier, args)
}

/// Decides an action named `name` that needs `tier`, exactly as a tool call is decided: what
/// is not a catalog tool but must be decided like one (a connection to a sandbox port, E2B's
/// `get_host`) names itself here, so a security context grants or refuses it by that name.
pub fn check_action(
    caller: &Caller,
    name: &str,
    tier: aegis_core::caller::Tier,
    args: &Value,
) -> Result<(), Denial> {
    if caller.tier < tier {
        return Err(Denial {
            code: "tier",
            message: format!(
                "`{}` needs the {} tier; this caller has the {} tier",
                name,
                tier.as_str(),
                caller.tier.as_str()
            ),
            seal_code: Some(2000),
            retry_after_secs: None,
        });
    }
    // Every call, nested ones included (a generator's deploy, an intent's run), is decided here
    // in full: nothing a caller carries can skip the context, and this is where a rate limit
    // counts (once per call). Doors only preview the same decision (`preview_seal`).
    if let Some(scope) = &caller.seal {
        check_seal(scope, name, args)?;
    }
    Ok(())
}

/// Evaluates a SEAL security context for one call (deny list, capabilities, rate limits);
/// returns the granting capability's response-size limit, if it has one. Counts the call
/// against its rate limits: only the router calls this (through [`check_tool`]).
fn check_seal(
    scope: &aegis_core::caller::SealScope,
    tool: &str,
    args: &Value,
) -> Result<Option<u64>, Denial> {
    decide_seal(scope, tool, args, true)
}

/// The decision [`check_tool`] will make about the security context, without counting the
/// call against a rate limit: a door (SEAL, MCP) asks it before it prepares the call (a
/// sandbox, a response-size limit), so a refused call prepares nothing. The router still
/// decides the call itself.
pub fn preview_seal(
    scope: &aegis_core::caller::SealScope,
    tool: &str,
    args: &Value,
) -> Result<Option<u64>, Denial> {
    decide_seal(scope, tool, args, false)
}

fn decide_seal(
    scope: &aegis_core::caller::SealScope,
    tool: &str,
    args: &Value,
    count: bool,
) -> Result<Option<u64>, Denial> {
    let now = std::time::Instant::now();
    let mut limit: Option<u64> = None;
    // The caller's own context, then those of whoever started it (each counts its own limits).
    let contexts = std::iter::once((scope.context.as_ref(), scope.session_key.clone())).chain(
        scope
            .ceilings
            .iter()
            .enumerate()
            .map(|(i, c)| (c.as_ref(), format!("{}#ceiling{i}", scope.session_key))),
    );
    for (context, key) in contexts {
        let decided = context.evaluate(tool, args, &scope.limiter, &key, now, count);
        let grant = decided.map_err(|e| Denial {
            code: e.code.name(),
            message: e.message,
            seal_code: Some(e.code.as_u32()),
            retry_after_secs: e.retry_after_secs,
        })?;
        limit = match (limit, grant.max_response_size) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(limit)
}

/// Tools that read files (need a read root); other `fs.*` tools change files (need a write root).
const READING_TOOLS: &[&str] = &[
    "fs.read",
    "fs.list",
    "fs.grep",
    "fs.glob",
    "logs.read",
    "env.get",
];

/// Sandbox tools that touch no path (no root is derived for them); `code.*` act on the sandbox's
/// interpreter server only.
const PATHLESS_SANDBOX_TOOLS: &[&str] = &[
    "proc.list",
    "proc.output",
    "proc.input",
    "proc.signal",
    "code.run",
    "code.contexts",
];

/// True for sandbox tools that take no path at all (`proc.list`, and the background process
/// tools, which act only on processes of the caller's own sandbox).
pub fn is_pathless_sandbox_tool(tool: &str) -> bool {
    PATHLESS_SANDBOX_TOOLS.contains(&tool)
}

/// True for sandbox tools that only read (they need a read root; the others need a write root).
pub fn is_reading_tool(tool: &str) -> bool {
    READING_TOOLS.contains(&tool)
}

/// True for tools that run inside a sandbox.
pub fn needs_sandbox(tool: &str) -> bool {
    tool.starts_with("fs.")
        || tool == "cmd.run"
        || tool == "logs.read"
        || tool == "env.get"
        || PATHLESS_SANDBOX_TOOLS.contains(&tool)
}

/// Decides a sandbox tool call under the sandbox's agent policy: the tool must be in the
/// manifest's `spec.tools`, paths inside the allowlist, commands on the command allowlist.
pub fn check_sandbox_call(tool: &str, args: &Value, policy: &SandboxPolicy) -> Result<(), Denial> {
    let canonical = if tool == "fs.create.dir" {
        "fs.create_dir"
    } else {
        tool
    };
    if !policy.tools.iter().any(|t| t == tool || t == canonical) {
        return Err(Denial {
            code: "tool_not_in_manifest",
            message: format!(
                "agent `{}` does not list `{tool}` in spec.tools",
                policy.agent
            ),
            seal_code: Some(2000),
            retry_after_secs: None,
        });
    }
    let deny_path = |message: String| Denial {
        code: "path_not_allowed",
        message,
        seal_code: Some(2002),
        retry_after_secs: None,
    };
    if tool == "cmd.run" {
        let command = args["command"].as_str().unwrap_or_default();
        let extra: Vec<String> = args["args"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        policy.command.argv(command, &extra).map_err(|r| Denial {
            code: "command_not_allowed",
            message: r.message,
            seal_code: Some(2003),
            retry_after_secs: None,
        })?;
        if let Some(env) = args["env_additions"].as_object() {
            policy
                .command
                .env(env.keys().map(String::as_str))
                .map_err(|r| Denial {
                    code: "command_not_allowed",
                    message: r.message,
                    seal_code: Some(2003),
                    retry_after_secs: None,
                })?;
        }
        if let Some(cwd) = args["cwd"].as_str() {
            paths::check(cwd, &policy.read_roots, "read").map_err(deny_path)?;
        }
        return Ok(());
    }
    if let Some(path) = args["path"].as_str() {
        let (roots, access) = if READING_TOOLS.contains(&tool) {
            (&policy.read_roots, "read")
        } else {
            (&policy.write_roots, "write")
        };
        paths::check(path, roots, access).map_err(deny_path)?;
    }
    Ok(())
}

/// Decides a call of an agent's own memory tool (`aegis.memory.write|recall`): only an agent
/// execution whose agent has memory on (`spec.execution.memory`) may make one. `memory_on` is
/// whether the router found such a memory for the caller; which memory it is comes from the
/// execution, never from the arguments.
pub fn check_memory_call(tool: &str, caller: &Caller, memory_on: bool) -> Result<(), Denial> {
    if memory_on {
        return Ok(());
    }
    let message = if caller.kind == aegis_core::caller::CallerKind::Execution {
        format!(
            "`{tool}` works on the memory of an agent with `spec.execution.memory`; the agent of \
             this execution has memory off"
        )
    } else {
        format!(
            "`{tool}` is called by agent executions with `spec.execution.memory`, on their own \
             memory; this caller is {} `{}` (operators list and erase memories with \
             aegis.memory.list|erase)",
            match caller.kind {
                aegis_core::caller::CallerKind::ApiKey => "API key",
                aegis_core::caller::CallerKind::Session => "SEAL session",
                _ => "the system",
            },
            caller.label
        )
    };
    Err(Denial {
        code: "memory_off",
        message,
        seal_code: Some(2000),
        retry_after_secs: None,
    })
}

/// True when `caller` would pass the checks that do not depend on arguments (for listings).
pub fn may_see(caller: &Caller, tool: &Tool) -> bool {
    caller.tier >= tool.tier
        && caller.seal.as_ref().is_none_or(|s| {
            s.context.covers_tool(&tool.name)
                && s.ceilings.iter().all(|c| c.covers_tool(&tool.name))
        })
}

/// What calls in one sandbox may do: derived from the agent's manifest, its security context or
/// its runtime by `sandboxes`, decided here by [`check_sandbox_call`].
#[derive(Debug, Clone)]
pub struct SandboxPolicy {
    /// The agent's name.
    pub agent: String,
    /// Tools the manifest lists in `spec.tools`.
    pub tools: Vec<String>,
    /// Paths reading tools may touch.
    pub read_roots: Vec<String>,
    /// Paths changing tools may touch.
    pub write_roots: Vec<String>,
    /// `cmd.run` rules.
    pub command: CommandPolicy,
    /// `cmd.run` deadline ceiling (manifest AND server).
    pub cmd_timeout_secs: u64,
    /// Output cap ceiling (manifest AND server).
    pub max_output_bytes: u64,
    /// `env.get` may return secret-looking values unmasked when asked (default masked).
    pub unmask_env: bool,
    /// The agent's `spec.env`: the environment every `cmd.run` command starts with.
    pub env: std::collections::BTreeMap<String, String>,
}
