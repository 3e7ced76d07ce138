//! The policy a sandbox runs under, made from what its caller brings: an agent manifest
//! ([`policy_of`]), a SEAL session's security context ([`policy_of_context`]), an operator's
//! runtime ([`policy_of_runtime`]) or an E2B create ([`policy_of_e2b`], [`e2b_spec`]), each
//! under the node's [`ToolCeilings`]. One place, so every door's sandbox is bounded alike.

use dispatcher::{Owner, SandboxSpec, WORKSPACE};
use serde_json::Value;

use aegis_manifest::AgentView;
use aegis_policy::command::CommandPolicy;

use crate::{
    SandboxError, SandboxPolicy, ToolCeilings, E2B_CONTEXT_LABEL, E2B_HOME, E2B_RUNTIME_LABEL,
};

/// The executor roots of a SEAL session's sandbox: the directories its context's path allowlists
/// name, so the executor, not only the policy, keeps every path inside them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextRoots {
    /// Roots of reading tools (and of `cmd.run`'s `cwd`), plus the write roots.
    pub read: Vec<String>,
    /// Roots of changing tools.
    pub write: Vec<String>,
    /// False when an entry is narrower than its root (`/a/b/*`, `/a/*/src`): symlinks are then
    /// refused, so a planted link cannot lead beyond what the entry names.
    pub follow_symlinks: bool,
}

/// The root an allowlist entry stands for: its components before the first wildcard; and
/// whether the entry is exactly that root's subtree (`/a/b`, `/a/b/**`).
fn entry_root(entry: &str) -> (String, bool) {
    let parts: Vec<&str> = entry.split('/').filter(|c| !c.is_empty()).collect();
    let fixed: Vec<&str> = parts
        .iter()
        .take_while(|c| !c.contains('*'))
        .copied()
        .collect();
    let rest = &parts[fixed.len()..];
    let whole_subtree = rest.is_empty() || rest == ["**"];
    (format!("/{}", fixed.join("/")), whole_subtree)
}

/// Derives the executor roots from a context (see [`ContextRoots`]). A capability without a path
/// allowlist grants the workspace; one with an empty allowlist grants nothing.
pub fn context_roots(context: &aegis_seal::context::SecurityContext) -> ContextRoots {
    let mut read = Vec::new();
    let mut write = Vec::new();
    let mut follow_symlinks = true;
    let tools: Vec<String> = aegis_core::catalog::catalog()
        .map(|c| {
            c.iter()
                .map(|t| t.name.clone())
                .filter(|n| aegis_policy::needs_sandbox(n))
                .collect()
        })
        .unwrap_or_default();
    for tool in &tools {
        // The code tools touch no path themselves, but the interpreter they start runs in
        // a root of their capability, as a command does (its working directory).
        let code = tool.starts_with("code.");
        if !context.covers_tool(tool) || (aegis_policy::is_pathless_sandbox_tool(tool) && !code) {
            continue;
        }
        let into = if aegis_policy::is_reading_tool(tool) || tool == "cmd.run" || code {
            &mut read
        } else {
            &mut write
        };
        for cap in context
            .capabilities
            .iter()
            .filter(|c| aegis_seal::context::tool_matches(&c.tool_pattern, tool))
        {
            match &cap.path_allowlist {
                None => into.push(WORKSPACE.to_owned()),
                Some(entries) => {
                    for entry in entries {
                        let (root, whole) = entry_root(entry);
                        follow_symlinks &= whole;
                        into.push(root);
                    }
                }
            }
        }
    }
    for w in &write {
        read.push(w.clone());
    }
    for list in [&mut read, &mut write] {
        list.sort();
        list.dedup();
    }
    ContextRoots {
        read,
        write,
        follow_symlinks,
    }
}

/// The sandbox policy of a SEAL session: the security context decides tools, paths and commands
/// (it is evaluated on every call); the sandbox adds the no-shell argv rules and the context's
/// roots.
pub fn policy_of_context(
    context: &aegis_seal::context::SecurityContext,
    ceilings: &ToolCeilings,
) -> SandboxPolicy {
    let roots = context_roots(context);
    let mut allowlist = Vec::new();
    let mut any_program = false;
    for cap in &context.capabilities {
        let pattern = cap.tool_pattern.as_str();
        if !(pattern == "*" || pattern == "cmd.run" || pattern == "cmd.*") {
            continue;
        }
        match (&cap.command_allowlist, &cap.subcommand_allowlist) {
            (None, None) => any_program = true,
            (commands, subcommands) => {
                allowlist.extend(commands.iter().flatten().cloned());
                allowlist.extend(subcommands.iter().flatten().cloned());
            }
        }
    }
    SandboxPolicy {
        agent: format!("seal-context:{}", context.name),
        tools: sandbox_tools(),
        read_roots: roots.read,
        write_roots: roots.write,
        command: CommandPolicy {
            subcommand_allowlist: allowlist,
            allow_metacharacters: false,
            env_allowlist: Vec::new(),
            any_program,
        },
        cmd_timeout_secs: ceilings.cmd_timeout_secs,
        max_output_bytes: ceilings.max_output_bytes,
        unmask_env: context
            .capabilities
            .iter()
            .any(|c| c.unmask_env && aegis_seal::context::tool_matches(&c.tool_pattern, "env.get")),
        env: Default::default(),
    }
}

/// The names of the tools that act in a sandbox (`cmd.run`, `fs.*`, ...).
fn sandbox_tools() -> Vec<String> {
    aegis_core::catalog::catalog()
        .map(|c| {
            c.iter()
                .map(|t| t.name.clone())
                .filter(|n| aegis_policy::needs_sandbox(n))
                .collect()
        })
        .unwrap_or_default()
}

/// Finds a runtime by `language` (when it has one version) or `language:version`.
pub fn find_runtime(asked: &str) -> Result<&'static aegis_core::runtimes::Runtime, SandboxError> {
    let registry =
        aegis_core::runtimes::registry().map_err(|e| SandboxError::Unavailable(e.to_owned()))?;
    let (language, version) = match asked.split_once(':') {
        Some((l, v)) => (l.trim(), Some(v.trim())),
        None => (asked.trim(), None),
    };
    let matching: Vec<&aegis_core::runtimes::Runtime> = registry
        .runtimes
        .iter()
        .filter(|r| r.language == language && version.is_none_or(|v| r.version == v))
        .collect();
    match matching.as_slice() {
        [one] => Ok(one),
        _ => Err(SandboxError::NoSuchRuntime {
            asked: asked.to_owned(),
            known: registry
                .runtimes
                .iter()
                .map(|r| format!("{}:{}", r.language, r.version))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// The policy of a sandbox an operator made from a runtime: every sandbox tool, the workspace
/// for reading and writing, and the given programs (none given: any program; still no shell,
/// no metacharacters, no network, and the kernel-held write rules).
pub fn policy_of_runtime(
    runtime: &aegis_core::runtimes::Runtime,
    allow: &[String],
    ceilings: &ToolCeilings,
) -> SandboxPolicy {
    SandboxPolicy {
        agent: format!("runtime:{}:{}", runtime.language, runtime.version),
        tools: sandbox_tools(),
        read_roots: vec![WORKSPACE.to_owned()],
        write_roots: vec![WORKSPACE.to_owned()],
        command: CommandPolicy {
            subcommand_allowlist: allow.to_vec(),
            allow_metacharacters: false,
            env_allowlist: Vec::new(),
            any_program: allow.is_empty(),
        },
        cmd_timeout_secs: ceilings.cmd_timeout_secs,
        max_output_bytes: ceilings.max_output_bytes,
        unmask_env: false,
        env: Default::default(),
    }
}

/// The policy of a sandbox made through the E2B door: under a bound key, its security context's
/// (whose `/workspace` roots stand for the sandbox's home, [`E2B_HOME`]); otherwise the
/// runtime policy on that home, where any program may run and `bash -c` (E2B's way of running
/// a command line) is named explicitly. Either way no shell metacharacters in `command`, the
/// kernel-held write rules, and no network.
pub fn policy_of_e2b(
    runtime: &aegis_core::runtimes::Runtime,
    context: Option<&aegis_seal::context::SecurityContext>,
    ceilings: &ToolCeilings,
) -> SandboxPolicy {
    let home = |roots: Vec<String>| -> Vec<String> {
        roots
            .into_iter()
            .map(|r| match r.strip_prefix(WORKSPACE) {
                Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                    format!("{E2B_HOME}{rest}")
                }
                _ => r,
            })
            .collect()
    };
    let mut policy = match context {
        Some(context) => policy_of_context(context, ceilings),
        None => {
            let mut p = policy_of_runtime(runtime, &[], ceilings);
            p.command.subcommand_allowlist = vec!["bash -c".to_owned()];
            p
        }
    };
    policy.agent = format!("e2b:{}:{}", runtime.language, runtime.version);
    policy.read_roots = home(policy.read_roots);
    policy.write_roots = home(policy.write_roots);
    policy
}

/// The sandbox an E2B create of `runtime` asks the dispatcher for, and the policy it runs
/// under: its workspace at [`E2B_HOME`], the roots of [`policy_of_e2b`]. The warm pool of an
/// E2B template is made of this very spec (`e2b.pool`), so a create finds it there.
pub fn e2b_spec(
    runtime: &aegis_core::runtimes::Runtime,
    context: Option<&aegis_seal::context::SecurityContext>,
    owner: Owner,
    ceilings: &ToolCeilings,
) -> (SandboxSpec, SandboxPolicy) {
    let policy = policy_of_e2b(runtime, context, ceilings);
    let mut spec = SandboxSpec::new(runtime.image.clone(), owner);
    spec.workspace = Some(E2B_HOME.to_owned());
    spec.read_roots = policy.read_roots.clone();
    spec.write_roots = policy.write_roots.clone();
    // E2B's contract: a sandbox may run as root. Granted only where the class is gVisor (the
    // dispatcher's `SandboxSpec::root_allowed`), and never under a key bound to a security
    // context, whose confinement root's capabilities would void inside the sandbox.
    spec.allow_root = context.is_none();
    if let Some(context) = context {
        spec.follow_symlinks = context_roots(context).follow_symlinks;
        spec.labels
            .insert(E2B_CONTEXT_LABEL.to_owned(), context.name.clone());
    }
    spec.labels.insert(
        E2B_RUNTIME_LABEL.to_owned(),
        format!("{}:{}", runtime.language, runtime.version),
    );
    (spec, policy)
}

/// Normalises manifest paths: relative ones are under /workspace.
fn absolute(paths: Vec<String>) -> Vec<String> {
    paths
        .into_iter()
        .map(|p| {
            if p.starts_with('/') {
                p
            } else {
                format!("{WORKSPACE}/{}", p.trim_start_matches("./"))
            }
        })
        .collect()
}

/// The policy of an agent manifest under the server's ceilings.
pub fn policy_of(agent: &str, manifest: &Value, ceilings: &ToolCeilings) -> SandboxPolicy {
    let view = AgentView(manifest);
    let mut read_roots = absolute(view.read_paths());
    let mut write_roots = absolute(view.write_paths());
    if read_roots.is_empty() && write_roots.is_empty() {
        read_roots = vec![WORKSPACE.to_owned()];
        write_roots = vec![WORKSPACE.to_owned()];
    }
    // Whatever may be written may be read back.
    for w in &write_roots {
        if !read_roots.contains(w) {
            read_roots.push(w.clone());
        }
    }
    let cmd = view.cmd_run();
    let command = CommandPolicy {
        subcommand_allowlist: view.subcommand_allowlist().unwrap_or_default(),
        allow_metacharacters: view.allow_metacharacters(),
        env_allowlist: view.env_allowlist(),
        any_program: false,
    };
    let cmd_timeout_secs = cmd
        .as_ref()
        .and_then(|c| c.timeout_seconds)
        .unwrap_or(ceilings.cmd_timeout_secs)
        .min(ceilings.cmd_timeout_secs);
    let max_output_bytes = cmd
        .as_ref()
        .and_then(|c| c.max_output_bytes)
        .unwrap_or(ceilings.max_output_bytes)
        .min(ceilings.max_output_bytes);
    SandboxPolicy {
        agent: agent.to_owned(),
        tools: view.tools(),
        read_roots,
        write_roots,
        command,
        cmd_timeout_secs,
        max_output_bytes,
        unmask_env: view.unmask_env(),
        env: view.env(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(json: Value) -> aegis_seal::context::SecurityContext {
        serde_json::from_value(json).expect("context parses")
    }

    #[test]
    fn entries_become_roots_and_wildcards_refuse_symlinks() {
        assert_eq!(
            entry_root("/workspace/shared"),
            ("/workspace/shared".into(), true)
        );
        assert_eq!(
            entry_root("/workspace/shared/**"),
            ("/workspace/shared".into(), true)
        );
        assert_eq!(
            entry_root("/workspace/shared/*"),
            ("/workspace/shared".into(), false)
        );
        assert_eq!(entry_root("/workspace/*/src"), ("/workspace".into(), false));
        assert_eq!(entry_root("/*"), ("/".into(), false));

        let ctx = context(
            serde_json::json!({"name": "n", "description": "", "capabilities": [
            {"tool_pattern": "fs.read", "path_allowlist": ["/workspace/shared/*"]},
            {"tool_pattern": "fs.write", "path_allowlist": ["/workspace/out"]}]}),
        );
        let roots = context_roots(&ctx);
        assert_eq!(roots.read, ["/workspace/out", "/workspace/shared"]);
        assert_eq!(roots.write, ["/workspace/out"]);
        assert!(!roots.follow_symlinks);

        let open = context(serde_json::json!({"name": "n", "description": "",
            "capabilities": [{"tool_pattern": "*"}], "deny_list": ["fs.write"]}));
        let roots = context_roots(&open);
        assert_eq!(roots.read, ["/workspace"]);
        assert_eq!(roots.write, ["/workspace"]);
        assert!(roots.follow_symlinks);
    }

    #[test]
    fn runtimes_are_found_by_language_or_pair_and_misses_list_them() {
        assert_eq!(
            find_runtime("shell").unwrap().image,
            "aegis-runtime/shell:bookworm"
        );
        assert_eq!(find_runtime("python:3.11").unwrap().version, "3.11");
        for bad in ["cobol", "shell:9", ""] {
            let e = find_runtime(bad).unwrap_err().to_string();
            assert!(e.contains("known: busybox:1, shell:bookworm"), "{bad}: {e}");
        }
        let ceilings = ToolCeilings {
            cmd_timeout_secs: 60,
            max_output_bytes: 1024,
        };
        let shell = find_runtime("shell").unwrap();
        let open = policy_of_runtime(shell, &[], &ceilings);
        assert!(open.command.any_program && open.command.programs().is_none());
        assert!(open.tools.iter().any(|t| t == "cmd.run"));
        let narrow = policy_of_runtime(shell, &["git status".to_owned()], &ceilings);
        assert_eq!(narrow.command.programs(), Some(vec!["git".to_owned()]));
        assert_eq!(narrow.write_roots, ["/workspace"]);
    }

    #[test]
    fn e2b_sandboxes_work_in_the_home_under_the_key_or_its_context() {
        let ceilings = ToolCeilings {
            cmd_timeout_secs: 60,
            max_output_bytes: 1024,
        };
        let base = find_runtime("base").unwrap();
        let open = policy_of_e2b(base, None, &ceilings);
        assert_eq!(open.read_roots, [E2B_HOME]);
        assert_eq!(open.write_roots, [E2B_HOME]);
        assert!(open.command.any_program);
        // `bash -c` is named, so E2B's `bash -l -c <line>` passes; metacharacters in the
        // command itself are still refused.
        let argv = ["-l".to_owned(), "-c".to_owned(), "echo a | wc".to_owned()];
        assert!(open.command.argv("bash", &argv).is_ok());
        assert!(open.command.argv("echo a | wc", &[]).is_err());

        let narrow = context(
            serde_json::json!({"name": "n", "description": "", "capabilities": [
            {"tool_pattern": "fs.*", "path_allowlist": ["/home/user/shared/**"]},
            {"tool_pattern": "cmd.run", "command_allowlist": ["echo"]}]}),
        );
        let confined = policy_of_e2b(base, Some(&narrow), &ceilings);
        assert_eq!(confined.write_roots, ["/home/user/shared"]);
        assert!(!confined.command.any_program);
        assert!(confined.command.argv("bash", &argv).is_err());
        assert!(confined.command.argv("echo hi", &[]).is_ok());

        // A context without path allowlists grants the sandbox's workspace: here the home.
        let wide = context(serde_json::json!({"name": "w", "description": "",
            "capabilities": [{"tool_pattern": "*"}]}));
        let home = policy_of_e2b(base, Some(&wide), &ceilings);
        assert_eq!(home.read_roots, [E2B_HOME]);
        assert_eq!(home.write_roots, [E2B_HOME]);
    }
}
