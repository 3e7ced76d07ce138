//! Typed reads of an agent manifest, for the dispatcher, the policy and the execution engine.
//!
//! A parsed manifest is kept as the JSON value it was validated as (that is what is stored and
//! exported), so instead of a parallel tree of Rust structs this is a thin view that reads the
//! fields those callers need and applies the documented defaults in one place. It assumes the
//! value passed the schema; on anything else it answers with defaults rather than panicking.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::units::{parse_duration, parse_quantity};

/// Name of the built-in dispatcher behind `cmd.run`.
pub const CMD_DISPATCHER: &str = "cmd";
/// Name of the tool that runs commands.
pub const CMD_RUN: &str = "cmd.run";

/// The tools an agent with memory on is offered (`spec.execution.memory`), whether or not its
/// `spec.tools` lists them; listed without memory on, the manifest is refused.
pub const MEMORY_TOOLS: [&str; 2] = ["aegis.memory.write", "aegis.memory.recall"];

/// Recall budget of a memory without `recall_tokens`, in estimated tokens.
pub const DEFAULT_RECALL_TOKENS: u32 = 1000;

/// `spec.execution.memory` when it is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySpec {
    /// One memory for every principal that runs the agent, instead of one per principal.
    pub shared: bool,
    /// Budget of the notes put into each prompt, in estimated tokens (0: none).
    pub recall_tokens: u32,
}

/// Which image an agent's sandbox is created from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeRef {
    /// A standard runtime, resolved through the runtime registry.
    Language {
        /// Language as written in the manifest (`python`).
        language: String,
        /// Version as written in the manifest (`3.11`).
        version: String,
    },
    /// A custom image reference, used as is.
    Image(String),
}

/// `spec.security.network.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkMode {
    /// No network at all (the default).
    None,
    /// Egress only to the allowlist.
    Deny,
    /// Egress anywhere except the denylist (narrowed to the allowlist when that is non-empty).
    Allow,
}

/// `spec.security.network`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkPolicy {
    /// The mode.
    pub mode: NetworkMode,
    /// Hosts or CIDR blocks egress may reach.
    pub allowlist: Vec<String>,
    /// Hosts or CIDR blocks that are never reachable.
    pub denylist: Vec<String>,
}

/// `spec.security.resources`, raw as written, with the defaults applied by the accessors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resources<'a> {
    /// CPU limit in millicores.
    pub cpu: Option<u64>,
    /// Memory limit (`512Mi` or bytes).
    pub memory: Option<&'a Value>,
    /// Workspace disk limit.
    pub disk: Option<&'a Value>,
    /// Deadline of the whole execution (`600s`, `5m` or seconds).
    pub timeout: Option<&'a Value>,
}

impl Resources<'_> {
    /// CPU limit in millicores (default 1000).
    pub fn cpu_millis(&self) -> u64 {
        self.cpu.unwrap_or(1000)
    }

    /// Memory limit in bytes (default 512 MiB).
    pub fn memory_bytes(&self) -> u64 {
        self.memory.and_then(parse_quantity).unwrap_or(512 << 20)
    }

    /// Disk limit in bytes (default 1 GiB).
    pub fn disk_bytes(&self) -> u64 {
        self.disk.and_then(parse_quantity).unwrap_or(1 << 30)
    }

    /// Deadline of the whole execution (default 1800 s).
    pub fn execution_timeout(&self) -> Duration {
        self.timeout
            .and_then(parse_duration)
            .unwrap_or(Duration::from_secs(1800))
    }
}

/// How iterations run, with defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionLimits {
    /// `true` for `iterative` mode, `false` for `one-shot`.
    pub iterative: bool,
    /// Attempts per execution: `max_iterations` (or its old name `max_retries`); 5 by default,
    /// 3 when the whole `execution` block is absent.
    pub max_iterations: u32,
    /// Deadline of one iteration (default 600 s).
    pub iteration_timeout: Duration,
    /// Deadline of one model call (default 300 s).
    pub llm_timeout: Duration,
    /// Deadline of the whole execution (`spec.security.resources.timeout`, default 1800 s).
    pub execution_timeout: Duration,
}

/// The per-agent limits of `cmd.run`
/// (`spec.builtin_dispatchers[name=cmd].capabilities[name=cmd.run]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdRunLimits {
    /// Allowed programs, optionally with a pinned subcommand (`git status`).
    pub subcommand_allowlist: Vec<String>,
    /// Pass shell metacharacters through as literal bytes instead of refusing them.
    pub allow_metacharacters: bool,
    /// Environment variables a caller may set.
    pub env_allowlist: Vec<String>,
    /// Per-command deadline ceiling, in seconds.
    pub timeout_seconds: Option<u64>,
    /// Cap of each output stream, in bytes.
    pub max_output_bytes: Option<u64>,
}

/// A read-only view of a validated agent manifest.
#[derive(Debug, Clone, Copy)]
pub struct AgentView<'a>(pub &'a Value);

impl<'a> AgentView<'a> {
    fn at(&self, pointer: &str) -> Option<&'a Value> {
        self.0.pointer(pointer)
    }

    fn str_at(&self, pointer: &str) -> Option<&'a str> {
        self.at(pointer).and_then(Value::as_str)
    }

    fn strings_at(&self, pointer: &str) -> Vec<String> {
        strings(self.at(pointer))
    }

    /// `metadata.name`.
    pub fn name(&self) -> &'a str {
        self.str_at("/metadata/name").unwrap_or_default()
    }

    /// The runtime: the custom image when given, else language and version.
    pub fn runtime(&self) -> RuntimeRef {
        match self.str_at("/spec/runtime/image") {
            Some(image) => RuntimeRef::Image(image.to_owned()),
            None => RuntimeRef::Language {
                language: self
                    .str_at("/spec/runtime/language")
                    .unwrap_or_default()
                    .to_owned(),
                version: self
                    .str_at("/spec/runtime/version")
                    .unwrap_or_default()
                    .to_owned(),
            },
        }
    }

    /// `spec.type`, AEGIS's execution tier: `user` unless written (the only tier accepted).
    pub fn agent_type(&self) -> &'a str {
        self.str_at("/spec/type").unwrap_or("user")
    }

    /// LLM alias (`spec.runtime.model`, default `default`).
    pub fn model(&self) -> &'a str {
        self.str_at("/spec/runtime/model").unwrap_or("default")
    }

    /// `spec.runtime.temperature`.
    pub fn temperature(&self) -> Option<f64> {
        self.at("/spec/runtime/temperature").and_then(Value::as_f64)
    }

    /// `spec.task.instruction`.
    pub fn instruction(&self) -> &'a str {
        self.str_at("/spec/task/instruction").unwrap_or_default()
    }

    /// `spec.task.prompt_template`.
    pub fn prompt_template(&self) -> Option<&'a str> {
        self.str_at("/spec/task/prompt_template")
    }

    /// `spec.task.input_data`: the input an execution gets when it is started without one.
    pub fn input_data(&self) -> Option<&'a Value> {
        self.at("/spec/task/input_data")
    }

    /// `spec.execution.tool_validation`: the judges asked before each tool call runs.
    pub fn tool_validation(&self) -> Vec<Value> {
        self.at("/spec/execution/tool_validation")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    }

    /// Exact names of the tools offered to the model (`spec.tools`).
    pub fn tools(&self) -> Vec<String> {
        self.strings_at("/spec/tools")
    }

    /// Paths the agent may read (`spec.security.filesystem.read`).
    pub fn read_paths(&self) -> Vec<String> {
        self.strings_at("/spec/security/filesystem/read")
    }

    /// Paths the agent may write (`spec.security.filesystem.write`).
    pub fn write_paths(&self) -> Vec<String> {
        self.strings_at("/spec/security/filesystem/write")
    }

    /// `spec.security.unmask_env`: `env.get` may return secret values unmasked when asked.
    pub fn unmask_env(&self) -> bool {
        self.at("/spec/security/unmask_env")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// `spec.security.allow_root`: the agent's calls may ask to run as root, granted only in a
    /// gVisor-class sandbox (the dispatcher's `SandboxSpec::root_allowed`).
    pub fn allow_root(&self) -> bool {
        self.at("/spec/security/allow_root")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// `spec.security.filesystem.read_only`: every write refused.
    pub fn read_only(&self) -> bool {
        self.at("/spec/security/filesystem/read_only")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// The `cmd.run` capability object of the `cmd` dispatcher, if configured.
    pub fn cmd_run_capability(&self) -> Option<&'a Value> {
        self.at("/spec/builtin_dispatchers")?
            .as_array()?
            .iter()
            .filter(|d| d.get("name").and_then(Value::as_str) == Some(CMD_DISPATCHER))
            .filter_map(|d| d.get("capabilities")?.as_array())
            .flatten()
            .find(|c| c.get("name").and_then(Value::as_str) == Some(CMD_RUN))
    }

    /// The limits of `cmd.run`; `None` means the agent configured none (so it may run nothing).
    pub fn cmd_run(&self) -> Option<CmdRunLimits> {
        let capability = self.cmd_run_capability()?;
        Some(CmdRunLimits {
            subcommand_allowlist: strings(capability.get("subcommand_allowlist")),
            allow_metacharacters: capability
                .get("allow_metacharacters")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            env_allowlist: strings(capability.get("env_allowlist")),
            timeout_seconds: capability.get("timeout_seconds").and_then(Value::as_u64),
            max_output_bytes: capability.get("max_output_bytes").and_then(Value::as_u64),
        })
    }

    /// The command allowlist of `cmd.run`, if configured.
    pub fn subcommand_allowlist(&self) -> Option<Vec<String>> {
        self.cmd_run().map(|c| c.subcommand_allowlist)
    }

    /// Whether `cmd.run` passes shell metacharacters through (default false).
    pub fn allow_metacharacters(&self) -> bool {
        self.cmd_run().is_some_and(|c| c.allow_metacharacters)
    }

    /// Environment variables `cmd.run` callers may set (default none).
    pub fn env_allowlist(&self) -> Vec<String> {
        self.cmd_run().map(|c| c.env_allowlist).unwrap_or_default()
    }

    /// `spec.security.network`, defaulting to mode `none`.
    pub fn network(&self) -> NetworkPolicy {
        let mode = match self.str_at("/spec/security/network/mode") {
            Some("allow") => NetworkMode::Allow,
            Some("deny") => NetworkMode::Deny,
            _ => NetworkMode::None,
        };
        NetworkPolicy {
            mode,
            allowlist: self.strings_at("/spec/security/network/allowlist"),
            denylist: self.strings_at("/spec/security/network/denylist"),
        }
    }

    /// Whether the sandbox gets any network egress: mode `allow`, or mode `deny` with a
    /// non-empty allowlist.
    pub fn network_egress(&self) -> bool {
        let network = self.network();
        match network.mode {
            NetworkMode::Allow => true,
            NetworkMode::Deny => !network.allowlist.is_empty(),
            NetworkMode::None => false,
        }
    }

    /// `spec.security.resources`.
    pub fn resources(&self) -> Resources<'a> {
        Resources {
            cpu: self
                .at("/spec/security/resources/cpu")
                .and_then(Value::as_u64),
            memory: self.at("/spec/security/resources/memory"),
            disk: self.at("/spec/security/resources/disk"),
            timeout: self.at("/spec/security/resources/timeout"),
        }
    }

    /// Iteration count and timeouts, with defaults.
    pub fn execution(&self) -> ExecutionLimits {
        let execution = self.at("/spec/execution");
        let field = |key: &str| execution.and_then(|e| e.get(key));
        let max_iterations = field("max_iterations")
            .or_else(|| field("max_retries"))
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(if execution.is_some() { 5 } else { 3 });
        ExecutionLimits {
            iterative: field("mode").and_then(Value::as_str) == Some("iterative"),
            max_iterations,
            iteration_timeout: field("iteration_timeout")
                .and_then(parse_duration)
                .unwrap_or(Duration::from_secs(600)),
            llm_timeout: Duration::from_secs(
                field("llm_timeout_seconds")
                    .and_then(Value::as_u64)
                    .unwrap_or(300),
            ),
            execution_timeout: self.resources().execution_timeout(),
        }
    }

    /// `spec.execution.memory`: `Some` when memory is on (`true`, or an object whose `enabled`
    /// is not false), with the defaults applied.
    pub fn memory(&self) -> Option<MemorySpec> {
        match self.at("/spec/execution/memory")? {
            Value::Bool(true) => Some(MemorySpec {
                shared: false,
                recall_tokens: DEFAULT_RECALL_TOKENS,
            }),
            Value::Object(m) if m.get("enabled").and_then(Value::as_bool) != Some(false) => {
                Some(MemorySpec {
                    shared: m.get("shared").and_then(Value::as_bool).unwrap_or(false),
                    recall_tokens: m
                        .get("recall_tokens")
                        .and_then(Value::as_u64)
                        .map_or(DEFAULT_RECALL_TOKENS, |n| {
                            u32::try_from(n).unwrap_or(u32::MAX)
                        }),
                })
            }
            _ => None,
        }
    }

    /// `spec.input_schema`: the JSON Schema every execution's input must satisfy.
    pub fn input_schema(&self) -> Option<&'a Value> {
        self.at("/spec/input_schema")
    }

    /// `spec.security_context`: the security context that replaces the caller's.
    pub fn security_context(&self) -> Option<&'a str> {
        self.str_at("/spec/security_context")
    }

    /// `spec.env`.
    pub fn env(&self) -> BTreeMap<String, String> {
        self.at("/spec/env")
            .and_then(Value::as_object)
            .map(|map| {
                map.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_fields_with_defaults() {
        let value = json!({"spec": {
            "runtime": {"language": "python", "version": "3.11"},
            "tools": ["fs.read", "cmd.run"],
            "security": {"filesystem": {"read": ["/workspace"], "write": ["/workspace/out"]},
                "network": {"mode": "deny", "allowlist": ["pypi.org"]},
                "resources": {"cpu": 500, "memory": "256Mi", "timeout": "5m"}},
            "execution": {"max_retries": 7, "iteration_timeout": "90s"},
            "builtin_dispatchers": [{"name": "cmd", "capabilities": [
                {"name": "cmd.run", "subcommand_allowlist": ["ls", "git status"],
                 "env_allowlist": ["LANG"], "timeout_seconds": 30}]}],
            "security_context": "aegis-system-agent-runtime",
            "input_schema": {"type": "object"}}});
        let agent = AgentView(&value);
        assert_eq!(
            agent.runtime(),
            RuntimeRef::Language {
                language: "python".into(),
                version: "3.11".into()
            }
        );
        assert_eq!(agent.tools(), ["fs.read", "cmd.run"]);
        assert_eq!(agent.read_paths(), ["/workspace"]);
        assert_eq!(agent.write_paths(), ["/workspace/out"]);
        assert_eq!(
            agent.subcommand_allowlist(),
            Some(vec!["ls".into(), "git status".into()])
        );
        assert!(!agent.allow_metacharacters());
        assert_eq!(agent.env_allowlist(), ["LANG"]);
        assert_eq!(agent.cmd_run().and_then(|c| c.timeout_seconds), Some(30));
        assert!(agent.network_egress());
        let resources = agent.resources();
        assert_eq!(resources.cpu_millis(), 500);
        assert_eq!(resources.memory_bytes(), 256 << 20);
        assert_eq!(resources.disk_bytes(), 1 << 30);
        let limits = agent.execution();
        assert_eq!(limits.max_iterations, 7);
        assert_eq!(limits.iteration_timeout, Duration::from_secs(90));
        assert_eq!(limits.llm_timeout, Duration::from_secs(300));
        assert_eq!(limits.execution_timeout, Duration::from_secs(300));
        assert_eq!(agent.security_context(), Some("aegis-system-agent-runtime"));
        assert_eq!(agent.input_schema(), Some(&json!({"type": "object"})));
        assert_eq!(agent.model(), "default");
    }

    #[test]
    fn memory_is_on_for_true_and_for_an_object_not_disabled() {
        let on =
            |memory: Value| AgentView(&json!({"spec": {"execution": {"memory": memory}}})).memory();
        let default = Some(MemorySpec {
            shared: false,
            recall_tokens: DEFAULT_RECALL_TOKENS,
        });
        assert_eq!(on(json!(true)), default);
        assert_eq!(on(json!({})), default);
        assert_eq!(on(json!({"enabled": true})), default);
        assert_eq!(
            on(json!({"shared": true, "recall_tokens": 0})),
            Some(MemorySpec {
                shared: true,
                recall_tokens: 0
            })
        );
        assert_eq!(on(json!(false)), None);
        assert_eq!(on(json!({"enabled": false, "shared": true})), None);
        assert_eq!(AgentView(&json!({"spec": {}})).memory(), None);
    }

    #[test]
    fn absent_blocks_mean_the_safe_defaults() {
        let value = json!({"spec": {"runtime": {"image": "ghcr.io/acme/agent:1"}}});
        let agent = AgentView(&value);
        assert_eq!(
            agent.runtime(),
            RuntimeRef::Image("ghcr.io/acme/agent:1".into())
        );
        assert_eq!(agent.subcommand_allowlist(), None);
        assert!(agent.env_allowlist().is_empty());
        assert!(!agent.network_egress());
        assert_eq!(agent.network().mode, NetworkMode::None);
        assert_eq!(agent.execution().max_iterations, 3);
        assert_eq!(
            agent.execution().execution_timeout,
            Duration::from_secs(1800)
        );
        assert!(agent.tools().is_empty());
    }
}
