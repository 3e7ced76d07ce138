//! Evaluating one call against a security context: deny list, matching capabilities, their
//! constraints and rate limits, in the order and with the codes the parent module documents.

use std::time::Instant;

use serde_json::{json, Value};

use super::grammar::{
    domain_matches, normalise_path, path_matches, split_deny_entry, tool_matches,
};
use super::{ApprovalRule, Capability, Grant, RateLimiter, SecurityContext, WORKSPACE};
use crate::error::{SealCode, SealError};

impl SecurityContext {
    /// Decides whether a session of this context may call `tool` with `args` now (see the
    /// module doc for the rules). With `count`, an allowed call counts against its capability's
    /// rate limit, in `limiter` under `session_key`; without, nothing is counted: a door asks so
    /// before it prepares a call (a sandbox, a size limit), so that a refused call costs nothing,
    /// and the router's own evaluation of the same call is the one that counts.
    pub fn evaluate(
        &self,
        tool: &str,
        args: &Value,
        limiter: &RateLimiter,
        session_key: &str,
        now: Instant,
        count: bool,
    ) -> Result<Grant, SealError> {
        let subject = Subject::of(tool, args);
        let base_details = || self.base_details(tool);

        self.check_deny_list(tool, &subject)?;
        let matching = self.matching_capabilities(tool)?;

        if let Some(Err(problem)) = &subject.path {
            let mut details = base_details();
            details["attempted_path"] = json!(subject.raw_path);
            return Err(
                SealError::new(SealCode::PathNotAllowed, problem.clone()).with_details(details)
            );
        }

        let mut first_failure: Option<SealError> = None;
        for index in matching {
            let cap = &self.capabilities[index];
            let outcome = self
                .check_constraints(cap, tool, &subject)
                .map_err(|e| {
                    let mut details = base_details();
                    if let (Value::Object(into), Value::Object(from)) = (&mut details, e.details) {
                        into.extend(from);
                    }
                    details["capability_index"] = json!(index);
                    SealError { details, ..e }
                })
                .and_then(|()| match cap.rate_limit {
                    None => Ok(()),
                    Some(limit) => {
                        let acquired = limiter.acquire(session_key, index, limit, now, count);
                        acquired.map_err(|retry| {
                            let mut details = base_details();
                            details["capability_index"] = json!(index);
                            details["rate_limit"] = json!(limit);
                            SealError::new(
                                SealCode::RateLimitExceeded,
                                format!(
                                    "rate limit of {} calls per {} s reached for `{tool}`; \
                                     retry in {retry} s",
                                    limit.calls, limit.per_seconds
                                ),
                            )
                            .with_details(details)
                            .with_retry_after(retry)
                        })
                    }
                });
            match outcome {
                Ok(()) => {
                    return Ok(Grant {
                        capability_index: index,
                        max_response_size: cap.max_response_size,
                    })
                }
                Err(e) => {
                    first_failure.get_or_insert(e);
                }
            }
        }
        Err(first_failure.unwrap_or_else(|| {
            SealError::new(
                SealCode::NoMatchingCapability,
                format!(
                    "no capability of security context `{}` grants this call of `{tool}`",
                    self.name
                ),
            )
            .with_details(base_details())
        }))
    }

    /// The details every refusal of this call starts from: the tool and this context's name.
    fn base_details(&self, tool: &str) -> Value {
        json!({
            "tool": tool,
            "security_context": self.name,
        })
    }

    /// The deny list is checked first: a denied call is refused whatever a capability grants.
    fn check_deny_list(&self, tool: &str, subject: &Subject) -> Result<(), SealError> {
        if let Some(entry) = self
            .deny_list
            .iter()
            .find(|entry| deny_entry_matches(entry, tool, subject))
        {
            let mut details = self.base_details(tool);
            details["deny_entry"] = json!(entry);
            return Err(SealError::new(
                SealCode::ToolDenied,
                format!(
                    "`{tool}` is refused by the deny list of security context `{}` (entry `{entry}`)",
                    self.name
                ),
            )
            .with_details(details));
        }
        Ok(())
    }

    /// The capabilities whose tool pattern covers `tool`, in order; none is a refusal.
    fn matching_capabilities(&self, tool: &str) -> Result<Vec<usize>, SealError> {
        let matching: Vec<usize> = self
            .capabilities
            .iter()
            .enumerate()
            .filter(|(_, c)| tool_matches(&c.tool_pattern, tool))
            .map(|(i, _)| i)
            .collect();
        if matching.is_empty() {
            let mut details = self.base_details(tool);
            details["tool_patterns"] = json!(self
                .capabilities
                .iter()
                .map(|c| c.tool_pattern.as_str())
                .collect::<Vec<_>>());
            return Err(SealError::new(
                SealCode::ToolNotAllowed,
                format!(
                    "no capability of security context `{}` covers `{tool}`",
                    self.name
                ),
            )
            .with_details(details));
        }
        Ok(matching)
    }

    /// Whether an allowed call of `tool` with `args` must first be approved by an operator: the
    /// first capability (in order) whose pattern matches and whose path, command and domain
    /// constraints pass decides, as it is the one that grants the call. Rate limits are not
    /// consulted (they cannot make a call need less approval).
    pub fn approval_for(&self, tool: &str, args: &Value) -> Option<ApprovalRule> {
        let subject = Subject::of(tool, args);
        self.capabilities
            .iter()
            .enumerate()
            .filter(|(_, c)| tool_matches(&c.tool_pattern, tool))
            .find(|(_, c)| self.check_constraints(c, tool, &subject).is_ok())
            .filter(|(_, c)| c.require_approval)
            .map(|(index, c)| ApprovalRule {
                capability_index: index,
                timeout_secs: c.approval_timeout_secs,
            })
    }

    /// Checks a capability's path, command and domain constraints (not the rate limit).
    fn check_constraints(
        &self,
        cap: &Capability,
        tool: &str,
        subject: &Subject,
    ) -> Result<(), SealError> {
        if let (Some(allow), Some(Ok(path))) = (&cap.path_allowlist, &subject.path) {
            if !allow.iter().any(|entry| path_matches(entry, path)) {
                return Err(SealError::new(
                    SealCode::PathNotAllowed,
                    format!(
                        "path `{path}` is outside the path allowlist ({})",
                        list_or_empty(allow)
                    ),
                )
                .with_details(json!({"attempted_path": path, "allowed_paths": allow})));
            }
            // Tools that walk below their path need an entry that reaches there too: `/a/b/*`
            // names direct children only, so it grants no search inside `/a/b/c` (listing
            // `/a/b/c` shows the names of its entries, which `fs.list` is granted on the dir).
            if matches!(tool, "fs.grep" | "fs.glob") {
                // NUL never occurs in an entry, so these names stand for "any name, any depth".
                let below = format!("{path}/\u{0}/\u{0}");
                if !allow
                    .iter()
                    .any(|entry| path_matches(entry, path) && path_matches(entry, &below))
                {
                    return Err(SealError::new(
                        SealCode::PathNotAllowed,
                        format!(
                            "`{tool}` reads below `{path}`, and no entry of the path allowlist ({}) \
                             reaches below it (`/a/*` names direct children only)",
                            list_or_empty(allow)
                        ),
                    )
                    .with_details(json!({"attempted_path": path, "allowed_paths": allow})));
                }
            }
        }
        if tool == "cmd.run"
            && (cap.command_allowlist.is_some() || cap.subcommand_allowlist.is_some())
        {
            check_command(cap, subject)?;
        }
        if let (Some(allow), Some(host)) = (&cap.domain_allowlist, &subject.host) {
            let host = host.as_ref().map_err(|problem| {
                SealError::new(SealCode::DomainNotAllowed, problem.clone())
                    .with_details(json!({"allowed_domains": allow}))
            })?;
            if !allow.iter().any(|entry| domain_matches(entry, host)) {
                return Err(SealError::new(
                    SealCode::DomainNotAllowed,
                    format!(
                        "host `{host}` is not on the domain allowlist ({})",
                        list_or_empty(allow)
                    ),
                )
                .with_details(json!({"attempted_domain": host, "allowed_domains": allow})));
            }
        }
        Ok(())
    }
}

fn list_or_empty(list: &[String]) -> String {
    if list.is_empty() {
        "empty".into()
    } else {
        list.join(", ")
    }
}

fn check_command(cap: &Capability, subject: &Subject) -> Result<(), SealError> {
    let argv = subject.argv.as_ref().ok_or_else(|| {
        SealError::new(
            SealCode::CommandNotAllowed,
            "`cmd.run` needs a `command` string",
        )
    })?;
    let argv = argv
        .as_ref()
        .map_err(|problem| SealError::new(SealCode::CommandNotAllowed, problem.clone()))?;
    let Some(program) = argv.first() else {
        return Err(SealError::new(
            SealCode::CommandNotAllowed,
            "the command is empty",
        ));
    };
    if let Some(allow) = &cap.command_allowlist {
        if !allow.iter().any(|a| a == program) {
            return Err(SealError::new(
                SealCode::CommandNotAllowed,
                format!(
                    "command `{program}` is not on the command allowlist ({})",
                    list_or_empty(allow)
                ),
            )
            .with_details(json!({"attempted_command": program, "allowed_commands": allow})));
        }
    }
    if let Some(allow) = &cap.subcommand_allowlist {
        let sub = argv.get(1).map(String::as_str);
        let ok = allow.iter().any(|entry| {
            let mut words = entry.split_whitespace();
            match (words.next(), words.next()) {
                (Some(p), None) => p == program,
                (Some(p), Some(s)) => p == program && sub == Some(s),
                _ => false,
            }
        });
        if !ok {
            let attempted = match sub {
                Some(s) => format!("{program} {s}"),
                None => program.clone(),
            };
            return Err(SealError::new(
                SealCode::CommandNotAllowed,
                format!(
                    "`{attempted}` is not on the subcommand allowlist ({})",
                    list_or_empty(allow)
                ),
            )
            .with_details(json!({"attempted_command": attempted, "allowed_subcommands": allow})));
        }
    }
    Ok(())
}

/// What a call acts on, extracted once per evaluation.
struct Subject {
    /// Normalised path (fs.* `path`, cmd.run `cwd`), or why it is refused.
    path: Option<Result<String, String>>,
    /// The path as given, for error details.
    raw_path: Option<String>,
    /// cmd.run argv (`command` split, then `args`), or why it cannot be built.
    argv: Option<Result<Vec<String>, String>>,
    /// web.* URL host, or why there is none.
    host: Option<Result<String, String>>,
}

impl Subject {
    fn of(tool: &str, args: &Value) -> Subject {
        let path_key = if reads_a_path(tool) && (tool != "env.get" || args.get("path").is_some()) {
            // `env.get` without a path reads the commands' environment, no file.
            Some("path")
        } else if tool == "cmd.run" {
            Some("cwd")
        } else {
            None
        };
        let (path, raw_path) = match path_key {
            None => (None, None),
            Some(key) => match args.get(key) {
                None | Some(Value::Null) => (Some(Ok(WORKSPACE.to_owned())), None),
                Some(Value::String(p)) => (Some(normalise_path(p)), Some(p.clone())),
                Some(_) => (Some(Err(format!("`{key}` must be a string"))), None),
            },
        };
        let argv = (tool == "cmd.run").then(|| command_argv(args)).flatten();
        let host = if tool.starts_with("web.") {
            args.get("url").map(url_host)
        } else {
            None
        };
        Subject {
            path,
            raw_path,
            argv,
            host,
        }
    }
}

fn command_argv(args: &Value) -> Option<Result<Vec<String>, String>> {
    let command = args.get("command")?;
    let Some(command) = command.as_str() else {
        return Some(Err("`command` must be a string".into()));
    };
    let mut argv = match shell_words::split(command) {
        Ok(words) => words,
        Err(e) => return Some(Err(format!("cannot split the command into words: {e}"))),
    };
    match args.get("args") {
        None | Some(Value::Null) => {}
        Some(Value::Array(extra)) => {
            for arg in extra {
                match arg.as_str() {
                    Some(s) => argv.push(s.to_owned()),
                    None => return Some(Err("every item of `args` must be a string".into())),
                }
            }
        }
        Some(_) => return Some(Err("`args` must be an array of strings".into())),
    }
    Some(Ok(argv))
}

fn url_host(url: &Value) -> Result<String, String> {
    let text = url.as_str().ok_or("`url` must be a string")?;
    let parsed =
        url::Url::parse(text).map_err(|e| format!("cannot parse the URL `{text}`: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "only http and https URLs are allowed, not `{}`",
            parsed.scheme()
        ));
    }
    let host = parsed
        .host_str()
        .ok_or_else(|| format!("the URL `{text}` has no host"))?;
    Ok(host.trim_end_matches('.').to_ascii_lowercase())
}

/// Tools whose `path` argument is checked against path allowlists and deny entries.
fn reads_a_path(tool: &str) -> bool {
    tool.starts_with("fs.") || tool == "logs.read" || tool == "env.get"
}

fn deny_entry_matches(entry: &str, tool: &str, subject: &Subject) -> bool {
    let (pattern, arg) = split_deny_entry(entry);
    if !tool_matches(pattern, tool) {
        return false;
    }
    let Some(arg) = arg else {
        return true;
    };
    if reads_a_path(tool) {
        return matches!(&subject.path, Some(Ok(path)) if path_matches(arg, path));
    }
    if tool == "cmd.run" {
        // The program compares by its base name, so `/bin/rm` is denied by `cmd.run:rm` too.
        let words: Vec<&str> = arg.split_whitespace().collect();
        return matches!(&subject.argv, Some(Ok(argv))
        if argv.len() >= words.len()
            && argv.iter().zip(&words).enumerate().all(|(i, (a, w))| {
                let a = if i == 0 { a.rsplit('/').next().unwrap_or(a) } else { a };
                a == *w
            }));
    }
    if tool.starts_with("web.") {
        return matches!(&subject.host, Some(Ok(host)) if domain_matches(arg, host));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::tests::context;
    use std::time::Duration;

    fn research_safe() -> SecurityContext {
        // RFC §5.3.4, verbatim but for the description the example leaves out.
        context(
            json!({"name":"research-safe","description":"normative example","capabilities":[{"tool_pattern":"fs.*","path_allowlist":["/workspace/shared/*"]}],"deny_list":["fs.delete"]}),
        )
    }

    fn read_only_research() -> SecurityContext {
        context(json!({
          "name": "read-only-research",
          "description": "Read-only context for research agents. Can search web from safe domains, read shared files, but cannot modify filesystem or execute commands.",
          "capabilities": [
            {"tool_pattern": "web.search",
             "domain_allowlist": ["*.google.com", "*.wikipedia.org", "*.arxiv.org", "*.github.com"],
             "rate_limit": {"calls": 10, "per_seconds": 60}},
            {"tool_pattern": "fs.read",
             "path_allowlist": ["/workspace/shared/*", "/workspace/docs/*"],
             "max_response_size": 10485760},
            {"tool_pattern": "fs.list", "path_allowlist": ["/workspace/*"]}
          ],
          "deny_list": ["fs.write", "fs.delete", "cmd.run", "net.connect"]
        }))
    }

    fn code_assistant() -> SecurityContext {
        context(json!({
          "name": "code-assistant",
          "description": "Full access for code generation agents. Can read/write source files, run build tools, but cannot access system files.",
          "capabilities": [
            {"tool_pattern": "fs.*",
             "path_allowlist": ["/workspace/src/*", "/workspace/tests/*", "/workspace/docs/*"],
             "max_response_size": 52428800},
            {"tool_pattern": "cmd.run",
             "command_allowlist": ["git", "npm", "cargo", "pytest", "make"],
             "subcommand_allowlist": null},
            {"tool_pattern": "web.search",
             "domain_allowlist": ["*.stackoverflow.com", "*.github.com", "docs.rs", "crates.io"],
             "rate_limit": {"calls": 20, "per_seconds": 60}}
          ],
          "deny_list": ["fs.read:/etc/*", "fs.read:/var/*", "cmd.run:rm", "cmd.run:dd", "cmd.run:curl"]
        }))
    }

    fn unrestricted() -> SecurityContext {
        context(json!({
          "name": "unrestricted",
          "description": "Full system access. Use only for highly trusted administrative agents with human oversight.",
          "capabilities": [{"tool_pattern": "*"}],
          "deny_list": []
        }))
    }

    fn unrestricted_with(deny: &[&str]) -> SecurityContext {
        context(
            json!({"name": "u", "description": "", "capabilities": [{"tool_pattern": "*"}], "deny_list": deny}),
        )
    }

    fn eval(ctx: &SecurityContext, tool: &str, args: Value) -> Result<Grant, SealError> {
        ctx.evaluate(tool, &args, &RateLimiter::new(), "s", Instant::now(), true)
    }

    fn code(ctx: &SecurityContext, tool: &str, args: Value) -> Option<SealCode> {
        eval(ctx, tool, args).err().map(|e| e.code)
    }

    #[test]
    fn approval_follows_the_granting_capability() {
        let ctx = context(json!({"name": "ops", "description": "", "capabilities": [
            {"tool_pattern": "fs.read", "path_allowlist": ["/workspace/public/**"]},
            {"tool_pattern": "fs.*", "require_approval": true, "approval_timeout_secs": 30},
            {"tool_pattern": "cmd.run", "command_allowlist": ["ls"]},
            {"tool_pattern": "cmd.run", "require_approval": true}]}));
        assert_eq!(
            ctx.approval_for("fs.read", &json!({"path": "/workspace/public/a"})),
            None,
            "the first capability grants it without approval"
        );
        assert_eq!(
            ctx.approval_for("fs.read", &json!({"path": "/workspace/secret"})),
            Some(ApprovalRule {
                capability_index: 1,
                timeout_secs: Some(30)
            })
        );
        assert_eq!(
            ctx.approval_for("fs.write", &json!({"path": "/workspace/x"})),
            Some(ApprovalRule {
                capability_index: 1,
                timeout_secs: Some(30)
            })
        );
        assert_eq!(
            ctx.approval_for("cmd.run", &json!({"command": "ls -l"})),
            None
        );
        assert_eq!(
            ctx.approval_for("cmd.run", &json!({"command": "rm -rf /workspace"})),
            Some(ApprovalRule {
                capability_index: 3,
                timeout_secs: None
            })
        );
        assert_eq!(ctx.approval_for("aegis.agent.list", &json!({})), None);
    }

    #[test]
    fn normative_example() {
        let ctx = research_safe();
        assert_eq!(
            eval(
                &ctx,
                "fs.read",
                json!({"path": "/workspace/shared/data.csv"})
            ),
            Ok(Grant {
                capability_index: 0,
                max_response_size: None
            })
        );
        assert!(eval(
            &ctx,
            "fs.write",
            json!({"path": "/workspace/shared/output.txt"})
        )
        .is_ok());
        let denied = eval(
            &ctx,
            "fs.delete",
            json!({"path": "/workspace/shared/temp.txt"}),
        )
        .unwrap_err();
        assert_eq!(denied.code, SealCode::ToolDenied);
        assert_eq!(denied.details["deny_entry"], "fs.delete");
        let path = eval(&ctx, "fs.read", json!({"path": "/etc/passwd"})).unwrap_err();
        assert_eq!(path.code, SealCode::PathNotAllowed);
        assert_eq!(path.details["attempted_path"], "/etc/passwd");
        assert_eq!(
            path.details["allowed_paths"],
            json!(["/workspace/shared/*"])
        );
        assert_eq!(path.details["security_context"], "research-safe");
        assert_eq!(path.details["tool"], "fs.read");
        let none = eval(&ctx, "web.search", json!({"query": "example"})).unwrap_err();
        assert_eq!(none.code, SealCode::ToolNotAllowed);
        assert_eq!(none.details["tool_patterns"], json!(["fs.*"]));
    }

    #[test]
    fn appendix_a_read_only_research() {
        let ctx = read_only_research();
        assert_eq!(
            eval(&ctx, "fs.read", json!({"path": "/workspace/docs/guide.md"})),
            Ok(Grant {
                capability_index: 1,
                max_response_size: Some(10485760)
            })
        );
        assert_eq!(
            code(&ctx, "fs.read", json!({"path": "/workspace/docs/a/b.md"})),
            Some(SealCode::PathNotAllowed)
        );
        assert!(eval(&ctx, "fs.list", json!({"path": "/workspace/shared"})).is_ok());
        assert!(eval(&ctx, "web.search", json!({"query": "rust ed25519"})).is_ok());
        // `/a/*` names direct children: no recursive search from one of them.
        let walker = context(json!({"name": "w", "description": "",
            "capabilities": [{"tool_pattern": "fs.*", "path_allowlist": ["/workspace/shared/*", "/workspace/src"]}]}));
        for tool in ["fs.grep", "fs.glob"] {
            assert_eq!(
                code(
                    &walker,
                    tool,
                    json!({"path": "/workspace/shared/dir", "pattern": "x"})
                ),
                Some(SealCode::PathNotAllowed),
                "{tool}"
            );
            assert!(eval(
                &walker,
                tool,
                json!({"path": "/workspace/src/a", "pattern": "x"})
            )
            .is_ok());
        }
        assert!(eval(&walker, "fs.read", json!({"path": "/workspace/shared/dir"})).is_ok());
        for tool in ["fs.write", "fs.delete", "cmd.run", "net.connect"] {
            assert_eq!(
                code(
                    &ctx,
                    tool,
                    json!({"path": "/workspace/shared/x", "command": "ls"})
                ),
                Some(SealCode::ToolDenied),
                "{tool}"
            );
        }
        assert_eq!(
            code(
                &ctx,
                "web.fetch",
                json!({"url": "https://en.wikipedia.org/"})
            ),
            Some(SealCode::ToolNotAllowed)
        );
        assert!(ctx.covers_tool("fs.read"));
        assert!(!ctx.covers_tool("fs.write"));
        assert!(!ctx.covers_tool("aegis.agent.list"));
    }

    #[test]
    fn appendix_a_code_assistant() {
        let ctx = code_assistant();
        assert!(eval(&ctx, "fs.write", json!({"path": "src/main.rs"})).is_ok());
        assert_eq!(
            eval(&ctx, "fs.read", json!({"path": "/workspace/tests/a.py"}))
                .map(|g| g.max_response_size),
            Ok(Some(52428800))
        );
        assert_eq!(
            code(&ctx, "fs.read", json!({"path": "/etc/hosts"})),
            Some(SealCode::ToolDenied)
        );
        assert_eq!(
            code(&ctx, "fs.write", json!({"path": "/etc/hosts"})),
            Some(SealCode::PathNotAllowed)
        );
        assert!(eval(&ctx, "cmd.run", json!({"command": "git status"})).is_ok());
        assert!(eval(
            &ctx,
            "cmd.run",
            json!({"command": "cargo", "args": ["test", "--lib"]})
        )
        .is_ok());
        assert_eq!(
            code(&ctx, "cmd.run", json!({"command": "rm -rf /workspace"})),
            Some(SealCode::ToolDenied)
        );
        assert_eq!(
            code(&ctx, "cmd.run", json!({"command": "curl https://x"})),
            Some(SealCode::ToolDenied)
        );
        let deny_rm = unrestricted_with(&["cmd.run:rm"]);
        assert_eq!(
            code(&deny_rm, "cmd.run", json!({"command": "/bin/rm x"})),
            Some(SealCode::ToolDenied)
        );
        assert!(eval(&deny_rm, "cmd.run", json!({"command": "rmdir x"})).is_ok());
        let python =
            eval(&ctx, "cmd.run", json!({"command": "python3 -c 'print(1)'"})).unwrap_err();
        assert_eq!(python.code, SealCode::CommandNotAllowed);
        assert_eq!(python.details["attempted_command"], "python3");
        assert_eq!(
            code(&ctx, "cmd.run", json!({"command": "/usr/bin/git status"})),
            Some(SealCode::CommandNotAllowed)
        );
        assert!(eval(&ctx, "web.search", json!({"query": "serde"})).is_ok());
        assert!(
            ctx.covers_tool("fs.read"),
            "tool:argument entries do not hide a tool"
        );
    }

    #[test]
    fn appendix_a_unrestricted() {
        let ctx = unrestricted();
        for tool in ["fs.read", "cmd.run", "aegis.agent.delete", "web.fetch"] {
            assert!(
                eval(
                    &ctx,
                    tool,
                    json!({"path": "/etc/passwd", "command": "rm -rf /", "url": "file:///"})
                )
                .is_ok(),
                "{tool}"
            );
        }
        // Traversal is refused even where no capability restricts paths.
        let e = eval(&ctx, "fs.read", json!({"path": "/workspace/../etc/passwd"})).unwrap_err();
        assert_eq!(e.code, SealCode::PathNotAllowed);
        assert!(e.message.contains("path traversal"), "{}", e.message);
        assert_eq!(
            code(&ctx, "cmd.run", json!({"command": "ls", "cwd": "../.."})),
            Some(SealCode::PathNotAllowed)
        );
    }

    #[test]
    fn tool_patterns_have_a_dot_boundary_in_evaluation() {
        let ctx = research_safe();
        assert_eq!(
            code(&ctx, "fsx.read", json!({"path": "/workspace/shared/a"})),
            Some(SealCode::ToolNotAllowed)
        );
    }

    #[test]
    fn deny_list_wins_and_understands_prefix_patterns() {
        let ctx = context(json!({
            "name": "d", "description": "",
            "capabilities": [{"tool_pattern": "*"}],
            "deny_list": ["aegis.*", "fs.delete", "web.fetch:*.evil.com", "cmd.run:git push"]
        }));
        assert_eq!(
            code(&ctx, "aegis.agent.delete", json!({})),
            Some(SealCode::ToolDenied)
        );
        assert!(eval(&ctx, "aegisx.tool", json!({})).is_ok());
        assert_eq!(
            code(&ctx, "fs.delete", json!({"path": "x"})),
            Some(SealCode::ToolDenied)
        );
        assert!(
            eval(&ctx, "fs.delete.all", json!({"path": "x"})).is_ok(),
            "exact entries are exact"
        );
        assert_eq!(
            code(&ctx, "web.fetch", json!({"url": "https://a.evil.com/"})),
            Some(SealCode::ToolDenied)
        );
        assert!(eval(
            &ctx,
            "web.fetch",
            json!({"url": "https://evil.com.example/"})
        )
        .is_ok());
        assert_eq!(
            code(
                &ctx,
                "cmd.run",
                json!({"command": "git", "args": ["push", "origin"]})
            ),
            Some(SealCode::ToolDenied)
        );
        assert!(eval(&ctx, "cmd.run", json!({"command": "git pull"})).is_ok());
        assert!(!ctx.covers_tool("aegis.agent.list"));
        assert!(ctx.covers_tool("web.fetch"));
    }

    #[test]
    fn paths_are_normalised_then_matched_by_component_in_evaluation() {
        let ctx = context(json!({"name": "p", "description": "",
            "capabilities": [{"tool_pattern": "fs.*", "path_allowlist": ["/workspace"]}]}));
        assert!(eval(&ctx, "fs.read", json!({"path": "notes/today.md"})).is_ok());
        assert!(
            eval(&ctx, "fs.list", json!({})).is_ok(),
            "no path means /workspace"
        );
        assert_eq!(
            code(&ctx, "fs.read", json!({"path": "/workspacex/secret"})),
            Some(SealCode::PathNotAllowed)
        );
        assert_eq!(
            code(&ctx, "fs.read", json!({"path": "../etc/passwd"})),
            Some(SealCode::PathNotAllowed)
        );
        assert_eq!(
            code(&ctx, "fs.read", json!({"path": 5})),
            Some(SealCode::PathNotAllowed)
        );
    }

    #[test]
    fn commands_and_subcommands() {
        let ctx = context(json!({"name": "c", "description": "",
            "capabilities": [{"tool_pattern": "cmd.run", "command_allowlist": ["git", "ls"],
                              "subcommand_allowlist": ["git status", "git diff", "ls"],
                              "path_allowlist": ["/workspace/repo"]}]}));
        let ok = |args: Value| eval(&ctx, "cmd.run", args).is_ok();
        assert!(ok(
            json!({"command": "git status", "cwd": "/workspace/repo"})
        ));
        assert!(ok(
            json!({"command": "git", "args": ["diff", "HEAD"], "cwd": "repo/sub"})
        ));
        assert!(ok(json!({"command": "ls -la", "cwd": "/workspace/repo"})));
        assert!(ok(
            json!({"command": "'git' \"status\"", "cwd": "/workspace/repo"})
        ));
        let refused = |args: Value| code(&ctx, "cmd.run", args);
        assert_eq!(
            refused(json!({"command": "git push", "cwd": "/workspace/repo"})),
            Some(SealCode::CommandNotAllowed)
        );
        assert_eq!(
            refused(json!({"command": "git", "cwd": "/workspace/repo"})),
            Some(SealCode::CommandNotAllowed)
        );
        assert_eq!(
            refused(json!({"command": "git -c core.pager=sh status", "cwd": "/workspace/repo"})),
            Some(SealCode::CommandNotAllowed)
        );
        assert_eq!(
            refused(json!({"command": "cat /etc/passwd", "cwd": "/workspace/repo"})),
            Some(SealCode::CommandNotAllowed)
        );
        assert_eq!(
            refused(json!({"command": "git 'status", "cwd": "/workspace/repo"})),
            Some(SealCode::CommandNotAllowed)
        );
        assert_eq!(
            refused(json!({"command": "", "cwd": "/workspace/repo"})),
            Some(SealCode::CommandNotAllowed)
        );
        assert_eq!(
            refused(json!({"cwd": "/workspace/repo"})),
            Some(SealCode::CommandNotAllowed)
        );
        assert_eq!(
            refused(json!({"command": "git", "args": [1], "cwd": "/workspace/repo"})),
            Some(SealCode::CommandNotAllowed)
        );
        // The cwd is a path like any other; without one it is /workspace, outside this list.
        assert_eq!(
            refused(json!({"command": "git status", "cwd": "/tmp"})),
            Some(SealCode::PathNotAllowed)
        );
        assert_eq!(
            refused(json!({"command": "git status"})),
            Some(SealCode::PathNotAllowed)
        );
    }

    #[test]
    fn domains_match_at_label_boundaries_in_evaluation() {
        let ctx = context(json!({"name": "w", "description": "",
            "capabilities": [{"tool_pattern": "web.*", "domain_allowlist": ["example.org", "*.wikipedia.org"]}]}));
        let ok = |url: &str| eval(&ctx, "web.fetch", json!({"url": url})).is_ok();
        assert!(ok("https://example.org/x"));
        assert!(ok("https://EXAMPLE.org./x"));
        assert!(ok("http://en.wikipedia.org/wiki/Rust"));
        assert!(ok("https://user@example.org:8443/"));
        let refused = |url: Value| code(&ctx, "web.fetch", json!({"url": url}));
        for url in [
            "https://example.org.evil.com/",
            "https://evilexample.org/",
            "https://wikipedia.org/",
            "https://example.org@evil.com/",
            "ftp://example.org/",
            "file:///etc/passwd",
            "not a url",
        ] {
            assert_eq!(
                refused(json!(url)),
                Some(SealCode::DomainNotAllowed),
                "{url}"
            );
        }
        assert_eq!(refused(json!(5)), Some(SealCode::DomainNotAllowed));
        // A search without a URL is not subject to the domain list.
        assert!(eval(&ctx, "web.search", json!({"query": "x"})).is_ok());
    }

    #[test]
    fn first_specific_failure_is_reported() {
        let ctx = context(json!({"name": "f", "description": "",
        "capabilities": [
            {"tool_pattern": "fs.read", "path_allowlist": ["/workspace/a"]},
            {"tool_pattern": "fs.*", "path_allowlist": ["/workspace/b"]},
            {"tool_pattern": "cmd.run", "command_allowlist": ["ls"]}
        ]}));
        let e = eval(&ctx, "fs.read", json!({"path": "/workspace/c"})).unwrap_err();
        assert_eq!(e.code, SealCode::PathNotAllowed);
        assert_eq!(e.details["capability_index"], 0);
        assert_eq!(
            eval(&ctx, "fs.read", json!({"path": "/workspace/b/x"})).map(|g| g.capability_index),
            Ok(1)
        );
        assert_eq!(
            code(&ctx, "cmd.run", json!({"command": "rm x"})),
            Some(SealCode::CommandNotAllowed)
        );
        assert_eq!(
            code(&ctx, "web.fetch", json!({"url": "https://x"})),
            Some(SealCode::ToolNotAllowed)
        );
        let empty = context(json!({"name": "e", "description": "", "capabilities": []}));
        assert_eq!(
            code(&empty, "fs.read", json!({})),
            Some(SealCode::ToolNotAllowed)
        );
    }

    #[test]
    fn rate_limit_three_per_minute() {
        let ctx = context(json!({"name": "r", "description": "",
            "capabilities": [{"tool_pattern": "web.search", "rate_limit": {"calls": 3, "per_seconds": 60}}]}));
        let limiter = RateLimiter::new();
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let call = |session: &str, t: Instant| {
            ctx.evaluate(
                "web.search",
                &json!({"query": "q"}),
                &limiter,
                session,
                t,
                true,
            )
        };
        assert!(call("s1", at(0)).is_ok());
        assert!(call("s1", at(10)).is_ok());
        assert!(call("s1", at(20)).is_ok());
        let fourth = call("s1", at(30)).unwrap_err();
        assert_eq!(fourth.code, SealCode::RateLimitExceeded);
        assert_eq!(fourth.retry_after_secs, Some(30));
        assert_eq!(fourth.code.http_status(), 429);
        // Another session has its own window.
        assert!(call("s2", at(30)).is_ok());
        // The window slides: at 60 s the first call has left it, the second has not.
        assert!(call("s1", at(60)).is_ok());
        assert_eq!(call("s1", at(61)).unwrap_err().retry_after_secs, Some(9));
        // Refused calls did not count.
        assert!(call("s1", at(70)).is_ok());
    }

    #[test]
    fn rate_limited_capability_falls_through_to_the_next() {
        let ctx = context(json!({"name": "r", "description": "",
        "capabilities": [
            {"tool_pattern": "fs.read", "rate_limit": {"calls": 1, "per_seconds": 60}},
            {"tool_pattern": "fs.read", "path_allowlist": ["/workspace/public"]}
        ]}));
        let limiter = RateLimiter::new();
        let now = Instant::now();
        let call =
            |path: &str| ctx.evaluate("fs.read", &json!({"path": path}), &limiter, "s", now, true);
        assert_eq!(
            call("/workspace/private").map(|g| g.capability_index),
            Ok(0)
        );
        assert_eq!(
            call("/workspace/public/a").map(|g| g.capability_index),
            Ok(1)
        );
        let e = call("/workspace/private").unwrap_err();
        assert_eq!(e.code, SealCode::RateLimitExceeded);
        assert!(e.retry_after_secs.is_some());
    }
}
