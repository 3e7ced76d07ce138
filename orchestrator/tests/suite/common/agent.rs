//! Agent manifests for tests and benchmarks: one builder instead of a `fn agent` per suite (the
//! benchmarks in `orchestrator/examples` include this file too).
//!
//! `AgentManifest::new("a").yaml()` is an agent on the busybox runtime whose instruction is
//! "Answer."; the other parts are named options, and `task` and `spec` append raw YAML lines under
//! `spec.task:` and `spec:` (indented as written in the manifest) for what has no option.

/// An agent manifest being built.
#[derive(Clone, Debug)]
pub struct AgentManifest {
    name: String,
    version: String,
    language: String,
    language_version: String,
    instruction: String,
    metadata: String,
    task: String,
    spec: String,
    security: String,
}

impl AgentManifest {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            version: "1.0.0".to_owned(),
            language: "busybox".to_owned(),
            language_version: "1".to_owned(),
            instruction: "Answer.".to_owned(),
            metadata: String::new(),
            task: String::new(),
            spec: String::new(),
            security: String::new(),
        }
    }

    /// `metadata.version` ("1.0.0" unless told).
    pub fn version(mut self, version: &str) -> Self {
        self.version = version.to_owned();
        self
    }

    /// `spec.runtime` (busybox 1 unless told).
    pub fn runtime(mut self, language: &str, version: &str) -> Self {
        self.language = language.to_owned();
        self.language_version = version.to_owned();
        self
    }

    /// `spec.task.instruction` ("Answer." unless told); one line.
    pub fn instruction(mut self, instruction: &str) -> Self {
        self.instruction = instruction.to_owned();
        self
    }

    /// Raw lines under `metadata:`, each indented by two spaces and ending in a newline.
    pub fn metadata(mut self, lines: &str) -> Self {
        self.metadata.push_str(lines);
        self
    }

    /// Raw lines under `spec.task:` after the instruction, each indented by four spaces and
    /// ending in a newline.
    pub fn task(mut self, lines: &str) -> Self {
        self.task.push_str(lines);
        self
    }

    /// Raw lines under `spec:` after the runtime and the task, each indented by two spaces and
    /// ending in a newline.
    pub fn spec(mut self, lines: &str) -> Self {
        self.spec.push_str(lines);
        self
    }

    /// `spec.tools`.
    pub fn tools(self, tools: &[&str]) -> Self {
        let line = format!("  tools: {}\n", flow(tools));
        self.spec(&line)
    }

    /// `spec.tools` from a comma-separated list (`"cmd.run, fs.read"`; empty for none), as
    /// suites that pass their tools as one string write them.
    pub fn tools_listed(self, tools: &str) -> Self {
        let tools: Vec<&str> = tools
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .collect();
        self.tools(&tools)
    }

    /// `spec.builtin_dispatchers` with one `cmd.run` capability: its subcommand allowlist, its
    /// timeout, and raw lines under the capability (each indented by ten spaces and ending in a
    /// newline) for the rest (`max_output_bytes`, `env_allowlist`, ...).
    pub fn cmd(self, allowlist: &[&str], timeout_seconds: u32, lines: &str) -> Self {
        let block = format!(
            "  builtin_dispatchers:\n    - name: cmd\n      capabilities:\n        - name: cmd.run\n          \
             subcommand_allowlist: {}\n          timeout_seconds: {timeout_seconds}\n{lines}",
            flow(allowlist)
        );
        self.spec(&block)
    }

    /// `spec.builtin_dispatchers` with one `cmd.run` capability: its subcommand allowlist and
    /// nothing else (the server's default timeout).
    pub fn cmd_allowing(self, allowlist: &[&str]) -> Self {
        let block = format!(
            "  builtin_dispatchers:\n    - name: cmd\n      capabilities:\n        - name: cmd.run\n          \
             subcommand_allowlist: {}\n",
            flow(allowlist)
        );
        self.spec(&block)
    }

    /// `spec.security.filesystem`: the roots tools may read and write.
    pub fn filesystem(mut self, read: &[&str], write: &[&str]) -> Self {
        self.security += &format!(
            "    filesystem:\n      read: {}\n      write: {}\n",
            flow(read),
            flow(write)
        );
        self
    }

    /// `spec.security.network`: its `mode` and one list (`list` is `allowlist` or `denylist`).
    pub fn network(mut self, mode: &str, list: &str, items: &[&str]) -> Self {
        self.security += &format!(
            "    network:\n      mode: {mode}\n      {list}: {}\n",
            flow(items)
        );
        self
    }

    /// Raw lines under `spec.security:` after the options above, each indented by four spaces
    /// and ending in a newline.
    pub fn security(mut self, lines: &str) -> Self {
        self.security.push_str(lines);
        self
    }

    /// `spec.security.unmask_env`.
    pub fn unmask_env(mut self, unmask: bool) -> Self {
        self.security += &format!("    unmask_env: {unmask}\n");
        self
    }

    /// The manifest's YAML.
    pub fn yaml(&self) -> String {
        let Self {
            name,
            version,
            language,
            language_version,
            instruction,
            metadata,
            task,
            spec,
            security,
        } = self;
        let security = if security.is_empty() {
            String::new()
        } else {
            format!("  security:\n{security}")
        };
        format!(
            "apiVersion: 100monkeys.ai/v1
kind: Agent
metadata:
  name: {name}
  version: \"{version}\"
{metadata}spec:
  runtime:
    language: {language}
    version: \"{language_version}\"
  task:
    instruction: {instruction}
{task}{spec}{security}"
        )
    }
}

/// A busybox agent named `name` told `instruction` whose only tool is `cmd.run`, allowed to
/// run `programs`.
pub fn command_agent(name: &str, instruction: &str, programs: &[&str]) -> String {
    AgentManifest::new(name)
        .instruction(instruction)
        .tools(&["cmd.run"])
        .cmd_allowing(programs)
        .yaml()
}

/// A busybox agent named `name` whose only tool is `fs.read` (no `cmd.run`, no process tools).
pub fn reader_agent(name: &str) -> String {
    AgentManifest::new(name)
        .instruction("Only read files.")
        .tools(&["fs.read"])
        .yaml()
}

/// A YAML flow sequence of strings, each quoted as JSON (which YAML reads alike).
fn flow(items: &[&str]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|i| serde_json::Value::from(*i).to_string())
        .collect();
    format!("[{}]", quoted.join(", "))
}
