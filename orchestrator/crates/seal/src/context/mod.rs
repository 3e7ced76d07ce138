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
use crate::Tier;

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
    /// A call granted by this capability waits for an operator's approval before it runs
    /// (the "privileged" tier of the owlette reference).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_approval: bool,
    /// How long such a call waits for a decision, seconds (default `seal.approval_timeout_secs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout_secs: Option<u64>,
    /// `env.get` calls granted by this capability may ask for secret values unmasked
    /// (`mask_secrets: false`); without it they are always masked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unmask_env: bool,
}

/// Largest `approval_timeout_secs` accepted (a day).
pub const MAX_APPROVAL_TIMEOUT_SECS: u64 = 86_400;

/// A call that needs an operator's approval, and how long it may wait for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApprovalRule {
    /// The capability that grants the call and asks for approval.
    pub capability_index: usize,
    /// Its own timeout, if it sets one.
    pub timeout_secs: Option<u64>,
}

/// A rate limit: `calls` per `per_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Calls allowed in the window (1..=[`MAX_RATE_CALLS`]).
    pub calls: u32,
    /// Window length, seconds (> 0).
    pub per_seconds: u32,
}

/// The runtime (language and version, resolved by the runtime registry) of a session's sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSpec {
    /// Language, e.g. `python`.
    pub language: String,
    /// Version, e.g. `3.11`.
    pub version: String,
}

/// Which workloads may attest into a context, and what they must prove.
///
/// `workload_patterns` is a filter, not a proof: any client can claim any workload id. A
/// workload is admitted only when it passes the filter (if there is one) *and* proves itself in
/// one of three ways: the context's `enrolment_secret`, a one-time attestation token an operator
/// issued for this context (checked by the gateway, which stores them), or the context opting out
/// with `allow_unverified: true`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttestationPolicy {
    /// Workload-id patterns; `*` matches any run of characters (`docker://*`, `ci-*`). Empty
    /// means any workload id.
    #[serde(default)]
    pub workload_patterns: Vec<String>,
    /// A pre-shared secret the attesting workload may present as proof (at least 16 bytes).
    /// Answers never show it: they say `set` or `not set` in its place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrolment_secret: Option<String>,
    /// Admit workloads that pass the filter without any proof (development, trusted networks).
    #[serde(default)]
    pub allow_unverified: bool,
}

/// What an attesting workload presented as proof of who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof<'a> {
    /// Nothing.
    None,
    /// An enrolment secret.
    Secret(&'a str),
    /// A one-time attestation token the gateway has already redeemed for this context.
    RedeemedToken,
}

impl AttestationPolicy {
    /// Refuses (3000) a workload id that does not pass `workload_patterns`.
    pub fn filter(&self, context: &str, workload_id: &str) -> Result<(), SealError> {
        if self.workload_patterns.is_empty()
            || self
                .workload_patterns
                .iter()
                .any(|p| wildcard_match(p, workload_id))
        {
            return Ok(());
        }
        Err(refusal(
            context,
            workload_id,
            format!(
                "workload `{workload_id}` does not match the workload patterns of security \
                 context `{context}`"
            ),
        ))
    }

    /// Decides whether `workload_id`, presenting `proof`, may attest into the context named
    /// `context`: the filter, then the proof. Refusals are 3000 and say what was missing.
    pub fn admits(
        &self,
        context: &str,
        workload_id: &str,
        proof: Proof<'_>,
    ) -> Result<(), SealError> {
        self.filter(context, workload_id)?;
        match proof {
            Proof::RedeemedToken => Ok(()),
            Proof::Secret(given) => match &self.enrolment_secret {
                Some(expected) if constant_time_eq(given, expected) => Ok(()),
                Some(_) => Err(refusal(
                    context,
                    workload_id,
                    format!("the enrolment secret for security context `{context}` is wrong"),
                )),
                None => Err(refusal(
                    context,
                    workload_id,
                    format!(
                        "security context `{context}` has no enrolment secret; attest with a \
                         one-time attestation token instead"
                    ),
                )),
            },
            Proof::None if self.allow_unverified => Ok(()),
            Proof::None => Err(refusal(
                context,
                workload_id,
                format!(
                    "security context `{context}` admits only verified workloads: present {}an \
                     operator-issued one-time `attestation_token` (POST \
                     /v1/security-contexts/{context}/attestation-tokens), or have the context set \
                     `attestation.allow_unverified: true`",
                    if self.enrolment_secret.is_some() {
                        "its `attestation_secret`, "
                    } else {
                        ""
                    }
                ),
            )),
        }
    }
}

fn refusal(context: &str, workload_id: &str, message: String) -> SealError {
    SealError::new(SealCode::WorkloadVerificationFailed, message).with_details(json!({
        "security_context": context,
        "workload_id": workload_id,
    }))
}

/// Compares two secrets without an early exit on the first differing byte.
fn constant_time_eq(a: &str, b: &str) -> bool {
    let (da, db) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    da.iter()
        .zip(db.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Replaces `attestation.enrolment_secret` in a context definition (as stored or configured) by
/// `"set"` or `"not set"`; anything else is left as it is. For every place a definition is shown.
pub fn redact_definition(definition: &mut serde_json::Value) {
    let Some(object) = definition.as_object_mut() else {
        return;
    };
    let attestation = object.entry("attestation").or_insert_with(|| json!({}));
    if let Some(attestation) = attestation.as_object_mut() {
        let set = attestation
            .get("enrolment_secret")
            .is_some_and(|v| !v.is_null());
        attestation.insert(
            "enrolment_secret".to_owned(),
            json!(if set { "set" } else { "not set" }),
        );
    }
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
            if let Some(t) = cap.approval_timeout_secs {
                if t == 0 || t > MAX_APPROVAL_TIMEOUT_SECS {
                    return Err(invalid(
                        at("approval_timeout_secs"),
                        format!("must be between 1 and {MAX_APPROVAL_TIMEOUT_SECS}"),
                    ));
                }
                if !cap.require_approval {
                    return Err(invalid(
                        at("approval_timeout_secs"),
                        "is only meaningful with `require_approval: true`",
                    ));
                }
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

    /// Decides whether `workload_id`, presenting `proof`, may attest into this context; see
    /// [`AttestationPolicy::admits`]. Refusals are 3000.
    pub fn admits(&self, workload_id: &str, proof: Proof<'_>) -> Result<(), SealError> {
        self.attestation.admits(&self.name, workload_id, proof)
    }

    /// The definition as every role sees it: the enrolment secret is never shown, only whether
    /// one is set (`"set"` / `"not set"`), so a listing cannot leak it to a read-only key.
    pub fn redacted(&self) -> serde_json::Value {
        let mut shown = serde_json::to_value(self).unwrap_or_else(|_| json!({"name": self.name}));
        redact_definition(&mut shown);
        shown
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

    /// A context from its JSON, parsed and validated as a stored one is; the tests of this
    /// module's children build theirs with it too.
    pub(super) fn context(json: Value) -> SecurityContext {
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
        // One capability `{"tool_pattern": "*"}` with `key` set to `value`, refused for the field
        // `key` and then `below`.
        let bad_capability = |key: &str, value: Value, below: &str| {
            let mut capability = json!({"tool_pattern": "*"});
            capability[key] = value;
            bad(
                json!({ "capabilities": [capability] }),
                &format!("capabilities[0].{key}{below}"),
            );
        };
        bad(json!({"name": "Bad"}), "name");
        bad(json!({"name": "1abc"}), "name");
        bad(json!({"name": ""}), "name");
        bad(json!({"name": "a_b"}), "name");
        bad_capability("tool_pattern", json!(""), "");
        bad_capability("tool_pattern", json!("fs*"), "");
        bad_capability("tool_pattern", json!(".*"), "");
        bad_capability(
            "rate_limit",
            json!({"calls": 0, "per_seconds": 1}),
            ".calls",
        );
        bad_capability(
            "rate_limit",
            json!({"calls": 1, "per_seconds": 0}),
            ".per_seconds",
        );
        bad_capability("path_allowlist", json!(["/a", "relative"]), "[1]");
        bad_capability("path_allowlist", json!(["/a/../b"]), "[0]");
        bad_capability("path_allowlist", json!(["/a/**/b"]), "[0]");
        bad_capability("domain_allowlist", json!(["https://x.org"]), "[0]");
        bad_capability("domain_allowlist", json!(["a.*.org"]), "[0]");
        bad_capability("command_allowlist", json!(["git status"]), "[0]");
        bad_capability("subcommand_allowlist", json!(["git a b"]), "[0]");
        bad_capability("max_response_size", json!(0), "");
        bad(
            json!({"capabilities": [{"tool_pattern": "*", "require_approval": true, "approval_timeout_secs": 0}]}),
            "capabilities[0].approval_timeout_secs",
        );
        bad_capability("approval_timeout_secs", json!(5), "");
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
        let shown = full.redacted();
        assert_eq!(shown["attestation"]["enrolment_secret"], "set");
        assert!(!shown.to_string().contains("0123456789abcdef"));
        let minimal = ctx.redacted();
        assert_eq!(minimal["attestation"]["enrolment_secret"], "not set");
    }

    #[test]
    fn attestation_policy() {
        use Proof::{RedeemedToken, Secret};
        let nobody = AttestationPolicy::default();
        assert_eq!(
            nobody
                .admits("c", "docker://a", Proof::None)
                .unwrap_err()
                .code,
            SealCode::WorkloadVerificationFailed
        );
        assert!(
            nobody.admits("c", "docker://a", RedeemedToken).is_ok(),
            "an operator's one-time token is proof enough"
        );

        // Patterns alone are a filter, never a proof.
        let patterns_only = AttestationPolicy {
            workload_patterns: vec!["docker://*".into(), "ci-runner-?".into()],
            ..Default::default()
        };
        let e = patterns_only
            .admits("c", "docker://8a9f", Proof::None)
            .unwrap_err();
        assert!(e.message.contains("attestation_token"), "{}", e.message);
        assert!(patterns_only
            .admits("c", "docker://8a9f", RedeemedToken)
            .is_ok());
        assert!(
            patterns_only
                .admits("c", "ci-runner-1", RedeemedToken)
                .is_err(),
            "the filter holds even with a token"
        );
        assert!(
            patterns_only
                .admits("c", "ci-runner-?", RedeemedToken)
                .is_ok(),
            "only `*` is special"
        );
        assert!(patterns_only
            .admits("c", "vm://docker://x", RedeemedToken)
            .is_err());

        let open = AttestationPolicy {
            workload_patterns: vec!["docker://*".into()],
            allow_unverified: true,
            ..Default::default()
        };
        assert!(open.admits("c", "docker://x", Proof::None).is_ok());
        assert!(open.admits("c", "host://x", Proof::None).is_err());
        assert!(
            open.admits("c", "docker://x", Secret("guess-guess-guess"))
                .is_err(),
            "a secret where none exists is refused, not ignored"
        );

        let secret = AttestationPolicy {
            enrolment_secret: Some("0123456789abcdef".into()),
            ..Default::default()
        };
        assert!(secret
            .admits("c", "anything", Secret("0123456789abcdef"))
            .is_ok());
        assert!(secret
            .admits("c", "anything", Secret("0123456789abcdeF"))
            .is_err());
        assert!(secret.admits("c", "anything", Proof::None).is_err());

        let both = AttestationPolicy {
            workload_patterns: vec!["docker://*".into()],
            enrolment_secret: Some("0123456789abcdef".into()),
            allow_unverified: false,
        };
        assert!(both
            .admits("c", "docker://x", Secret("0123456789abcdef"))
            .is_ok());
        assert!(both.admits("c", "docker://x", Proof::None).is_err());
        assert!(both
            .admits("c", "host://x", Secret("0123456789abcdef"))
            .is_err());
    }
}
