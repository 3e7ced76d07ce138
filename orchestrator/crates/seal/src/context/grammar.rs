//! The pattern grammar of security contexts (tool patterns, paths, domains, wildcards), as
//! documented in the parent module. Pure string functions, shared by validation and evaluation.

use super::{MAX_PATH, WORKSPACE};

/// Longest accepted component of a path, bytes (Linux NAME_MAX).
pub const MAX_COMPONENT: usize = 255;

/// Normalises a requested path: relative paths are under `/workspace`, `.` and empty
/// components dropped; `..`, NUL bytes, overlong paths and overlong components are refused.
/// The one normaliser of the service: the tool policy (`aegis_policy::paths`) uses it too, so
/// a security context and a manifest never read one path two ways.
pub fn normalise_path(path: &str) -> Result<String, String> {
    if path.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    if path.len() > MAX_PATH {
        return Err(format!(
            "the path is {} bytes long; the limit is {MAX_PATH}",
            path.len()
        ));
    }
    let full = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{WORKSPACE}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in full.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(format!(
                    "path traversal: `{path}` contains `..`; name a path inside the allowlist \
                     without parent steps"
                ))
            }
            part if part.len() > MAX_COMPONENT => {
                return Err(format!(
                    "a component of `{path}` is longer than {MAX_COMPONENT} bytes"
                ))
            }
            part => parts.push(part),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// True when the normalised `path` matches the allowlist `entry` (grammar in the module doc).
pub fn path_matches(entry: &str, path: &str) -> bool {
    let pattern: Vec<&str> = entry.split('/').filter(|c| !c.is_empty()).collect();
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let prefix_matches = |n: usize| {
        pattern[..n]
            .iter()
            .zip(&parts)
            .all(|(p, c)| wildcard_match(p, c))
    };
    match pattern.last() {
        Some(&"**") => parts.len() >= pattern.len() && prefix_matches(pattern.len() - 1),
        Some(last) if last.contains('*') => {
            parts.len() == pattern.len() && prefix_matches(pattern.len())
        }
        _ => parts.len() >= pattern.len() && prefix_matches(pattern.len()),
    }
}

/// True when `host` (lowercase, no trailing dot) matches the domain `entry`.
pub fn domain_matches(entry: &str, host: &str) -> bool {
    let entry = entry.trim_end_matches('.').to_ascii_lowercase();
    match entry.strip_prefix("*.") {
        Some(suffix) => host
            .strip_suffix(suffix)
            .and_then(|rest| rest.strip_suffix('.'))
            .is_some_and(|label| !label.is_empty()),
        None => host == entry,
    }
}

/// Tool names that are one tool under two names (the catalog's aliases). A pattern that names
/// either name names both, so a deny entry `fs.create_dir` also refuses `fs.create.dir`.
pub const ALIASES: &[&[&str]] = &[
    &["fs.create_dir", "fs.create.dir"],
    &["aegis.task.wait", "aegis.agent.wait"],
];

/// `tool` and its aliases.
pub fn names_of(tool: &str) -> Vec<&str> {
    match ALIASES.iter().find(|group| group.contains(&tool)) {
        Some(group) => group.to_vec(),
        None => vec![tool],
    }
}

/// True when `tool`, or an alias of it, matches `pattern` (`*`, dot-bounded `prefix.*`, or exact).
pub fn tool_matches(pattern: &str, tool: &str) -> bool {
    names_of(tool)
        .iter()
        .any(|name| name_matches(pattern, name))
}

/// True when the one name `tool` matches `pattern`.
fn name_matches(pattern: &str, tool: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    match pattern.strip_suffix(".*") {
        Some(prefix) => tool
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('.'))
            .is_some_and(|rest| !rest.is_empty()),
        None => pattern == tool,
    }
}

/// Splits a deny entry into its tool pattern and optional argument pattern.
pub(super) fn split_deny_entry(entry: &str) -> (&str, Option<&str>) {
    match entry.split_once(':') {
        Some((tool, arg)) => (tool, Some(arg)),
        None => (entry, None),
    }
}

/// Glob match where `*` matches any run of characters (including none) and everything else is
/// literal.
pub(super) fn wildcard_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == '*' {
            backtrack = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((star, matched)) = backtrack {
            pi = star + 1;
            ti = matched + 1;
            backtrack = Some((star, matched + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_patterns_have_a_dot_boundary() {
        assert!(tool_matches("fs.*", "fs.read"));
        assert!(tool_matches("fs.*", "fs.create.dir"));
        assert!(!tool_matches("fs.*", "fsx.read"));
        assert!(!tool_matches("fs.*", "fs"));
        assert!(!tool_matches("fs.*", "fs."));
        assert!(!tool_matches("fs.*", "xfs.read"));
        assert!(tool_matches("*", "anything"));
        assert!(tool_matches("fs.read", "fs.read"));
        assert!(!tool_matches("fs.read", "fs.read.more"));
        assert!(tool_matches("aegis.agent.*", "aegis.agent.list"));
        assert!(!tool_matches("aegis.agent.*", "aegis.agents.list"));
    }

    #[test]
    fn aliases_are_one_tool() {
        assert!(tool_matches("fs.create_dir", "fs.create.dir"));
        assert!(tool_matches("fs.create.dir", "fs.create_dir"));
        assert!(tool_matches("aegis.task.wait", "aegis.agent.wait"));
        assert!(tool_matches("aegis.task.*", "aegis.agent.wait"));
        assert!(tool_matches("aegis.agent.wait", "aegis.task.wait"));
        assert!(!tool_matches("aegis.task.wait", "aegis.agent.logs"));
        assert!(!tool_matches("fs.create_dir", "fs.create.file"));
    }

    #[test]
    fn paths_are_normalised_then_matched_by_component() {
        assert_eq!(normalise_path("a/./b//c").unwrap(), "/workspace/a/b/c");
        assert_eq!(normalise_path("/workspace/").unwrap(), "/workspace");
        assert_eq!(normalise_path(".").unwrap(), "/workspace");
        assert_eq!(normalise_path("//workspace//x/.").unwrap(), "/workspace/x");
        assert!(normalise_path(&format!("/workspace/{}", "a".repeat(255))).is_ok());
        assert!(normalise_path(&format!("/workspace/{}", "a".repeat(256)))
            .unwrap_err()
            .contains("longer than 255 bytes"));
        for bad in [
            "..",
            "../etc/passwd",
            "/workspace/a/../../etc",
            "a/..",
            "a\0b",
        ] {
            assert!(normalise_path(bad).is_err(), "{bad:?}");
        }
        assert!(normalise_path(&"a/".repeat(3000)).is_err());

        assert!(path_matches("/workspace", "/workspace"));
        assert!(path_matches("/workspace", "/workspace/a/b"));
        assert!(!path_matches("/workspace", "/workspacex"));
        assert!(!path_matches("/workspace", "/workspacex/a"));
        assert!(!path_matches("/workspace", "/"));
        assert!(path_matches(
            "/workspace/shared/*",
            "/workspace/shared/a.csv"
        ));
        assert!(!path_matches("/workspace/shared/*", "/workspace/shared"));
        assert!(!path_matches(
            "/workspace/shared/*",
            "/workspace/shared/a/b.csv"
        ));
        assert!(!path_matches("/workspace/shared/*", "/workspace/sharedx/a"));
        assert!(path_matches(
            "/workspace/shared/**",
            "/workspace/shared/a/b/c"
        ));
        assert!(path_matches("/workspace/shared/**", "/workspace/shared/a"));
        assert!(!path_matches("/workspace/shared/**", "/workspace/shared"));
        assert!(!path_matches(
            "/workspace/shared/**",
            "/workspace/sharedx/a"
        ));
        assert!(path_matches("/workspace/*.csv", "/workspace/data.csv"));
        assert!(!path_matches("/workspace/*.csv", "/workspace/data.csv.exe"));
        assert!(path_matches(
            "/workspace/*/src",
            "/workspace/app/src/main.rs"
        ));
        assert!(!path_matches(
            "/workspace/*/src",
            "/workspace/app/lib/main.rs"
        ));
        assert!(path_matches("/", "/etc"));
    }

    #[test]
    fn domains_match_at_label_boundaries() {
        assert!(domain_matches("*.example.org", "a.example.org"));
        assert!(domain_matches("*.example.org", "a.b.example.org"));
        assert!(!domain_matches("*.example.org", "example.org"));
        assert!(!domain_matches("*.example.org", "evilexample.org"));
        assert!(!domain_matches("*.example.org", "example.org.evil.com"));
        assert!(!domain_matches("*.example.org", ".example.org"));
        assert!(domain_matches("example.org", "example.org"));
        assert!(!domain_matches("example.org", "a.example.org"));
        assert!(domain_matches("Example.ORG.", "example.org"));
    }

    #[test]
    fn wildcard() {
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("a*c", "abbbc"));
        assert!(wildcard_match("a*c*", "abcxc"));
        assert!(!wildcard_match("a*c", "abcx"));
        assert!(wildcard_match("*.csv", ".csv"));
        assert!(wildcard_match("日*", "日本"));
        assert!(!wildcard_match("abc", "ab"));
    }
}
