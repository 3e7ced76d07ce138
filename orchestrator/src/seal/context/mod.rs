//! Security contexts: the named policies a SEAL session is bound to, and their evaluation.
//!
//! A session attests into one security context (the token's `scp`). Every call it makes is
//! evaluated here before the router sees it, and the answer is either a [`Grant`] or a SEAL
//! policy error whose code names the real reason (2000-2005), so an operator reading the audit
//! log, or a client reading the error, learns *which* rule refused the call.
//!
//! # Evaluation (RFC §5.3, made precise)
//!
//! 1. **Deny list first.** An entry that matches the tool refuses it (2001), whatever the
//!    capabilities say.
//! 2. **Capabilities in order.** Only capabilities whose `tool_pattern` matches are considered;
//!    if none matches, 2000. A capability allows the call when *all* of its constraints pass
//!    (AND); any one allowing capability is enough (OR). If none allows, the error is the first
//!    constraint failure seen, with its own code: 2002 path, 2003 command, 2004 domain,
//!    2005 rate limit (with `retry_after_secs`).
//! 3. Before any capability is tried, a path that tries to climb with `..` is refused (2002):
//!    this layer refuses traversal even under a capability without a path allowlist.
//!
//! # Grammar
//!
//! **Tool patterns** (`tool_pattern`, deny entries): `*` matches every tool; `prefix.*` matches
//! tools that start with `prefix.` and have at least one more character, so `fs.*` matches
//! `fs.read` and `fs.create.dir` but neither `fsx.read` nor `fs`; anything else is an exact name.
//! A tool with two names (`fs.create_dir` and `fs.create.dir`, `aegis.task.wait` and
//! `aegis.agent.wait`) is matched under both, in deny entries and capabilities alike.
//!
//! **Deny entries** are a tool pattern, optionally followed by `:` and an argument pattern, as in
//! the RFC's Appendix A (`fs.read:/etc/*`, `cmd.run:rm`). With an argument pattern the entry
//! only denies calls whose subject matches it: for `fs.*` the path (path grammar below), for
//! `cmd.run` the leading words of the command line (`cmd.run:rm` denies `rm -rf x`,
//! `cmd.run:git push` denies `git push origin`), for `web.*` the URL's host (domain grammar).
//!
//! **Subjects.** Paths are `arguments.path` for `fs.*` tools and `arguments.cwd` for `cmd.run`;
//! when absent they are `/workspace` (where the tool acts by default). Relative paths are under
//! `/workspace`; `.` and empty components are dropped; `..` is refused. The command is
//! `arguments.command` split with POSIX word rules, followed by `arguments.args`. The domain is
//! the host of `arguments.url` for `web.*` tools; a `web.*` call without `url` (`web.search`
//! takes a query) is not subject to the domain allowlist. Constraints apply only to tools that
//! carry their kind of subject: a `*` capability's path allowlist does not restrict
//! `aegis.agent.list`.
//!
//! **Path allowlist entries** are absolute and compared component by component, so
//! `/workspacex` is never under `/workspace`:
//! - `/a/b` matches `/a/b` itself and everything below it;
//! - `/a/b/*` matches the direct children of `/a/b` (not `/a/b`, not grandchildren);
//! - `/a/b/**` matches everything strictly below `/a/b`;
//! - inside a component, `*` matches any run of characters (`/a/*.csv`, `/a/*/src`).
//!
//! **Commands.** `command_allowlist` holds bare program names; `argv[0]` must equal one (a path
//! such as `/bin/rm` never matches `rm`). `subcommand_allowlist` entries are `"git status"` pairs
//! (program and first argument) or a bare program (any subcommand); when set, the call must
//! match one.
//!
//! **Domains.** `example.org` matches that host only. `*.example.org` matches any host below it
//! at a label boundary (`a.example.org`, `a.b.example.org`) but **not the apex**
//! `example.org` (list both to allow both), never `evilexample.org` and never
//! `example.org.evil.com`. Hosts compare case-insensitively with a trailing dot ignored; only
//! `http` and `https` URLs are accepted; internationalised names are compared in their
//! ASCII (punycode) form, which is how entries must be written.
//!
//! **Rate limits** are a sliding window per (session, capability): a call is allowed when fewer
//! than `calls` calls were allowed by that capability for that session in the last
//! `per_seconds` seconds. Refused calls do not count. The retry-after is the time until the
//! oldest counted call leaves the window, rounded up to whole seconds.
//!
//! `max_response_size` is not enforced here (the size is known only after the call); the
//! [`Grant`] carries it to the router.

use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use super::error::{SealCode, SealError};
use crate::caller::Tier;

mod evaluate;
mod grammar;
mod rate_limit;

pub use grammar::{domain_matches, normalise_path, path_matches, tool_matches};
pub use rate_limit::RateLimiter;

use grammar::{split_deny_entry, wildcard_match};

/// Where relative paths are resolved, and the path a tool uses when it is given none.
pub const WORKSPACE: &str = "/workspace";

/// Largest `rate_limit.calls` accepted (the sliding window remembers one instant per call).
pub const MAX_RATE_CALLS: u32 = 10_000;

/// Longest accepted path, bytes (Linux `PATH_MAX`).
pub const MAX_PATH: usize = 4096;

/// Shortest accepted enrolment secret, bytes.
pub const MIN_SECRET_LEN: usize = 16;

/// A named policy a SEAL session is bound to (RFC §5.1, plus tier, runtime and attestation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecurityContext {
    /// `^[a-z][a-z0-9-]*$`, unique on the node.
    pub name: String,
    /// What the context is for.
    pub description: String,
    /// What the context grants; empty means nothing.
    pub capabilities: Vec<Capability>,
    /// Tools (or `tool:argument` pairs) refused before any capability is considered.
    #[serde(default)]
    pub deny_list: Vec<String>,
    /// The caller tier of sessions in this context (bounds which tools exist for them at all).
    #[serde(default = "default_tier")]
    pub tier: Tier,
    /// The runtime of the session's sandbox; the node default when absent.
    #[serde(default)]
    pub runtime: Option<RuntimeSpec>,
    /// Which workloads may attest into this context.
    #[serde(default)]
    pub attestation: AttestationPolicy,
}

fn default_tier() -> Tier {
    Tier::User
}

/// One grant of a security context: a tool pattern and the constraints calls must meet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capability {
    /// `*`, `prefix.*` or an exact tool name.
    pub tool_pattern: String,
    /// Allowed paths for `fs.*` (and `cmd.run`'s `cwd`); see the module doc for the grammar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_allowlist: Option<Vec<String>>,
    /// Allowed programs for `cmd.run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_allowlist: Option<Vec<String>>,
    /// Allowed `"program subcommand"` pairs for `cmd.run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subcommand_allowlist: Option<Vec<String>>,
    /// Allowed URL hosts for `web.*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_allowlist: Option<Vec<String>>,
    /// At most `calls` allowed calls per `per_seconds`, per session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// Largest response, bytes, the router may return for a call granted by this capability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_response_size: Option<u64>,
}

/// A rate limit: `calls` per `per_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Calls allowed in the window (1..=[`MAX_RATE_CALLS`]).
    pub calls: u32,
    /// Window length, seconds (> 0).
    pub per_seconds: u32,
}

/// The runtime (language and version, resolved by the runtime registry) of a session's sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSpec {
    /// Language, e.g. `python`.
    pub language: String,
    /// Version, e.g. `3.11`.
    pub version: String,
}

/// Which workloads may attest into a context. Every configured condition must hold; a context
/// with neither admits nobody.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttestationPolicy {
    /// Workload-id patterns; `*` matches any run of characters (`docker://*`, `ci-*`).
    #[serde(default)]
    pub workload_patterns: Vec<String>,
    /// A pre-shared secret the attesting workload must present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrolment_secret: Option<String>,
}

impl AttestationPolicy {
    /// Decides whether `workload_id`, presenting `secret` (if any), may attest into the context
    /// named `context`. Refusals are 3000 and say which condition failed.
    pub fn admits(
        &self,
        context: &str,
        workload_id: &str,
        secret: Option<&str>,
    ) -> Result<(), SealError> {
        let refuse = |message: String| {
            SealError::new(SealCode::WorkloadVerificationFailed, message).with_details(json!({
                "security_context": context,
                "workload_id": workload_id,
            }))
        };
        if self.workload_patterns.is_empty() && self.enrolment_secret.is_none() {
            return Err(refuse(format!(
                "security context `{context}` admits no workloads (it has neither workload \
                 patterns nor an enrolment secret)"
            )));
        }
        if !self.workload_patterns.is_empty()
            && !self
                .workload_patterns
                .iter()
                .any(|p| wildcard_match(p, workload_id))
        {
            return Err(refuse(format!(
                "workload `{workload_id}` does not match the workload patterns of security \
                 context `{context}`"
            )));
        }
        if let Some(expected) = &self.enrolment_secret {
            let ok = secret.is_some_and(|given| constant_time_eq(given, expected));
            if !ok {
                return Err(refuse(format!(
                    "security context `{context}` requires a valid enrolment secret"
                )));
            }
        }
        Ok(())
    }
}

/// Compares two secrets without an early exit on the first differing byte.
fn constant_time_eq(a: &str, b: &str) -> bool {
    let (da, db) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    da.iter()
        .zip(db.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// A context definition that does not hold together; `field` is its path
/// (`capabilities[1].rate_limit.calls`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ContextError {
    /// Path of the offending field.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ContextError {
    ContextError {
        field: field.into(),
        message: message.into(),
    }
}

/// What a successful evaluation hands to the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Index in `capabilities` of the capability that allowed the call.
    pub capability_index: usize,
    /// That capability's response size limit.
    pub max_response_size: Option<u64>,
}

fn check_tool_pattern(field: &str, pattern: &str) -> Result<(), ContextError> {
    if pattern.is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if pattern.chars().any(char::is_whitespace) {
        return Err(invalid(field, format!("`{pattern}` contains whitespace")));
    }
    if pattern == "*" {
        return Ok(());
    }
    let name = pattern.strip_suffix(".*").unwrap_or(pattern);
    if name.is_empty() || name.contains('*') {
        return Err(invalid(
            field,
            format!("`{pattern}` is not `*`, `prefix.*` or an exact tool name"),
        ));
    }
    Ok(())
}

fn check_path_entry(field: &str, entry: &str) -> Result<(), ContextError> {
    if !entry.starts_with('/') {
        return Err(invalid(
            field,
            format!("`{entry}` must be an absolute path"),
        ));
    }
    if entry.contains('\0') {
        return Err(invalid(field, "contains a NUL byte"));
    }
    let parts: Vec<&str> = entry.split('/').filter(|c| !c.is_empty()).collect();
    for (i, part) in parts.iter().enumerate() {
        if *part == "." || *part == ".." {
            return Err(invalid(field, format!("`{entry}` contains `{part}`")));
        }
        if part.contains("**") && (*part != "**" || i + 1 != parts.len()) {
            return Err(invalid(
                field,
                format!("`{entry}`: `**` is only allowed as the whole last component"),
            ));
        }
    }
    Ok(())
}

fn check_domain_entry(field: &str, entry: &str) -> Result<(), ContextError> {
    let host = entry.strip_prefix("*.").unwrap_or(entry);
    let host = host.strip_suffix('.').unwrap_or(host);
    let ok = !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("`{entry}` is not a host name or `*.` followed by a host name"),
        ))
    }
}

fn check_words(field: &str, entry: &str, max_words: usize) -> Result<(), ContextError> {
    let words = entry.split_whitespace().count();
    if words == 0 || words > max_words {
        return Err(invalid(
            field,
            if max_words == 1 {
                format!("`{entry}` must be one program name")
            } else {
                format!("`{entry}` must be a program, optionally followed by one subcommand")
            },
        ));
    }
    Ok(())
}

impl SecurityContext {
    /// Checks the definition; the error names the offending field.
    pub fn validate(&self) -> Result<(), ContextError> {
        let name_ok = self.name.len() <= 64
            && self
                .name
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_lowercase())
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !name_ok {
            return Err(invalid(
                "name",
                format!(
                    "`{}` must match ^[a-z][a-z0-9-]*$ (at most 64 characters)",
                    self.name
                ),
            ));
        }
        for (i, entry) in self.deny_list.iter().enumerate() {
            let field = format!("deny_list[{i}]");
            let (tool, arg) = split_deny_entry(entry);
            check_tool_pattern(&field, tool)?;
            if arg.is_some_and(|a| a.trim().is_empty()) {
                return Err(invalid(
                    field,
                    format!("`{entry}` has an empty argument pattern"),
                ));
            }
        }
        for (i, cap) in self.capabilities.iter().enumerate() {
            let at = |f: &str| format!("capabilities[{i}].{f}");
            check_tool_pattern(&at("tool_pattern"), &cap.tool_pattern)?;
            for (j, entry) in cap.path_allowlist.iter().flatten().enumerate() {
                check_path_entry(&at(&format!("path_allowlist[{j}]")), entry)?;
            }
            for (j, entry) in cap.command_allowlist.iter().flatten().enumerate() {
                check_words(&at(&format!("command_allowlist[{j}]")), entry, 1)?;
            }
            for (j, entry) in cap.subcommand_allowlist.iter().flatten().enumerate() {
                check_words(&at(&format!("subcommand_allowlist[{j}]")), entry, 2)?;
            }
            for (j, entry) in cap.domain_allowlist.iter().flatten().enumerate() {
                check_domain_entry(&at(&format!("domain_allowlist[{j}]")), entry)?;
            }
            if let Some(limit) = cap.rate_limit {
                if limit.calls == 0 || limit.calls > MAX_RATE_CALLS {
                    return Err(invalid(
                        at("rate_limit.calls"),
                        format!("must be between 1 and {MAX_RATE_CALLS}"),
                    ));
                }
                if limit.per_seconds == 0 {
                    return Err(invalid(at("rate_limit.per_seconds"), "must be at least 1"));
                }
            }
            if cap.max_response_size == Some(0) {
                return Err(invalid(at("max_response_size"), "must be at least 1"));
            }
        }
        if let Some(runtime) = &self.runtime {
            if runtime.language.trim().is_empty() {
                return Err(invalid("runtime.language", "must not be empty"));
            }
            if runtime.version.trim().is_empty() {
                return Err(invalid("runtime.version", "must not be empty"));
            }
        }
        for (i, pattern) in self.attestation.workload_patterns.iter().enumerate() {
            if pattern.is_empty() {
                return Err(invalid(
                    format!("attestation.workload_patterns[{i}]"),
                    "must not be empty",
                ));
            }
        }
        if let Some(secret) = &self.attestation.enrolment_secret {
            if secret.len() < MIN_SECRET_LEN {
                return Err(invalid(
                    "attestation.enrolment_secret",
                    format!("must be at least {MIN_SECRET_LEN} bytes"),
                ));
            }
        }
        Ok(())
    }

    /// Decides whether `workload_id`, presenting `secret` (if any), may attest into this
    /// context; see [`AttestationPolicy::admits`]. Refusals are 3000.
    pub fn admits(&self, workload_id: &str, secret: Option<&str>) -> Result<(), SealError> {
        self.attestation.admits(&self.name, workload_id, secret)
    }

    /// A copy safe to show: the enrolment secret replaced by `"********"`.
    pub fn redacted(&self) -> SecurityContext {
        let mut copy = self.clone();
        if copy.attestation.enrolment_secret.is_some() {
            copy.attestation.enrolment_secret = Some("********".into());
        }
        copy
    }

    /// True when some call of `tool` could be allowed: no plain deny entry matches it and a
    /// capability's pattern does. For listing the tools a session may call.
    pub fn covers_tool(&self, tool: &str) -> bool {
        let denied = self.deny_list.iter().any(|entry| {
            let (pattern, arg) = split_deny_entry(entry);
            arg.is_none() && tool_matches(pattern, tool)
        });
        !denied
            && self
                .capabilities
                .iter()
                .any(|c| tool_matches(&c.tool_pattern, tool))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn context(json: Value) -> SecurityContext {
        let ctx: SecurityContext = serde_json::from_value(json).expect("context parses");
        ctx.validate().expect("context is valid");
        ctx
    }

    #[test]
    fn validation_names_the_field() {
        let base = json!({"name": "ok-name", "description": "", "capabilities": [{"tool_pattern": "fs.*"}]});
        assert!(context(base.clone()).validate().is_ok());
        let bad = |patch: Value, field: &str| {
            let mut v = base.clone();
            for (k, val) in patch.as_object().unwrap() {
                v[k] = val.clone();
            }
            let ctx: SecurityContext = serde_json::from_value(v).unwrap();
            let e = ctx.validate().unwrap_err();
            assert_eq!(e.field, field, "{e}");
        };
        bad(json!({"name": "Bad"}), "name");
        bad(json!({"name": "1abc"}), "name");
        bad(json!({"name": ""}), "name");
        bad(json!({"name": "a_b"}), "name");
        bad(
            json!({"capabilities": [{"tool_pattern": ""}]}),
            "capabilities[0].tool_pattern",
        );
        bad(
            json!({"capabilities": [{"tool_pattern": "fs*"}]}),
            "capabilities[0].tool_pattern",
        );
        bad(
            json!({"capabilities": [{"tool_pattern": ".*"}]}),
            "capabilities[0].tool_pattern",
        );
        bad(
            json!({"capabilities": [{"tool_pattern": "*", "rate_limit": {"calls": 0, "per_seconds": 1}}]}),
            "capabilities[0].rate_limit.calls",
        );
        bad(
            json!({"capabilities": [{"tool_pattern": "*", "rate_limit": {"calls": 1, "per_seconds": 0}}]}),
            "capabilities[0].rate_limit.per_seconds",
        );
        bad(
            json!({"capabilities": [{"tool_pattern": "*", "path_allowlist": ["/a", "relative"]}]}),
            "capabilities[0].path_allowlist[1]",
        );
        bad(
            json!({"capabilities": [{"tool_pattern": "*", "path_allowlist": ["/a/../b"]}]}),
            "capabilities[0].path_allowlist[0]",
        );
        bad(
            json!({"capabilities": [{"tool_pattern": "*", "path_allowlist": ["/a/**/b"]}]}),
            "capabilities[0].path_allowlist[0]",
        );
        bad(
            json!({"capabilities": [{"tool_pattern": "*", "domain_allowlist": ["https://x.org"]}]}),
            "capabilities[0].domain_allowlist[0]",
        );
        bad(
            json!({"capabilities": [{"tool_pattern": "*", "domain_allowlist": ["a.*.org"]}]}),
            "capabilities[0].domain_allowlist[0]",
        );
        bad(
            json!({"capabilities": [{"tool_pattern": "*", "command_allowlist": ["git status"]}]}),
            "capabilities[0].command_allowlist[0]",
        );
        bad(
            json!({"capabilities": [{"tool_pattern": "*", "subcommand_allowlist": ["git a b"]}]}),
            "capabilities[0].subcommand_allowlist[0]",
        );
        bad(
            json!({"capabilities": [{"tool_pattern": "*", "max_response_size": 0}]}),
            "capabilities[0].max_response_size",
        );
        bad(json!({"deny_list": ["fs.read", ""]}), "deny_list[1]");
        bad(json!({"deny_list": ["fs.read:"]}), "deny_list[0]");
        bad(
            json!({"runtime": {"language": "", "version": "3"}}),
            "runtime.language",
        );
        bad(
            json!({"attestation": {"workload_patterns": [""]}}),
            "attestation.workload_patterns[0]",
        );
        bad(
            json!({"attestation": {"enrolment_secret": "short"}}),
            "attestation.enrolment_secret",
        );

        // Unknown fields are refused at every level.
        for v in [
            json!({"name": "a", "description": "", "capabilities": [], "extra": 1}),
            json!({"name": "a", "description": "", "capabilities": [{"tool_pattern": "*", "paths": []}]}),
            json!({"name": "a", "description": "", "capabilities": [{"tool_pattern": "*", "rate_limit": {"calls": 1, "per_seconds": 1, "burst": 2}}]}),
        ] {
            assert!(serde_json::from_value::<SecurityContext>(v).is_err());
        }
    }

    #[test]
    fn defaults_and_serialisation() {
        let ctx = context(json!({"name": "minimal", "description": "", "capabilities": []}));
        assert_eq!(ctx.tier, Tier::User);
        assert_eq!(ctx.runtime, None);
        assert_eq!(ctx.attestation, AttestationPolicy::default());
        let full = context(
            json!({"name": "full", "description": "d", "capabilities": [],
            "tier": "system", "runtime": {"language": "python", "version": "3.11"},
            "attestation": {"workload_patterns": ["docker://*"], "enrolment_secret": "0123456789abcdef"}}),
        );
        assert_eq!(full.tier, Tier::System);
        let back: SecurityContext =
            serde_json::from_value(serde_json::to_value(&full).unwrap()).unwrap();
        assert_eq!(back, full);
        let shown = serde_json::to_value(full.redacted()).unwrap();
        assert_eq!(shown["attestation"]["enrolment_secret"], "********");
        assert!(!shown.to_string().contains("0123456789abcdef"));
    }

    #[test]
    fn attestation_policy() {
        let nobody = AttestationPolicy::default();
        assert_eq!(
            nobody.admits("c", "docker://a", None).unwrap_err().code,
            SealCode::WorkloadVerificationFailed
        );

        let docker = AttestationPolicy {
            workload_patterns: vec!["docker://*".into(), "ci-runner-?".into()],
            enrolment_secret: None,
        };
        assert!(docker.admits("c", "docker://8a9f", None).is_ok());
        assert!(
            docker.admits("c", "ci-runner-?", None).is_ok(),
            "only `*` is special"
        );
        assert!(docker.admits("c", "ci-runner-1", None).is_err());
        assert!(docker.admits("c", "vm://docker://x", None).is_err());

        let secret = AttestationPolicy {
            workload_patterns: vec![],
            enrolment_secret: Some("0123456789abcdef".into()),
        };
        assert!(secret
            .admits("c", "anything", Some("0123456789abcdef"))
            .is_ok());
        assert!(secret
            .admits("c", "anything", Some("0123456789abcdeF"))
            .is_err());
        assert!(secret.admits("c", "anything", None).is_err());

        let both = AttestationPolicy {
            workload_patterns: vec!["docker://*".into()],
            enrolment_secret: Some("0123456789abcdef".into()),
        };
        assert!(both
            .admits("c", "docker://x", Some("0123456789abcdef"))
            .is_ok());
        assert!(both.admits("c", "docker://x", None).is_err());
        assert!(both
            .admits("c", "host://x", Some("0123456789abcdef"))
            .is_err());
    }
}
