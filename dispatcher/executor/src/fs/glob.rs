//! `fs.glob`: paths under a directory that match a glob, found by a bounded descriptor walk.
//!
//! The pattern is relative to the search directory and may not contain `..` or start with `/`;
//! `*` and `?` stay within one component and `**` crosses them (globset with a literal
//! separator). The walk starts at the pattern's literal directory prefix and, for patterns without
//! `**`, does not descend deeper than the pattern has components. Symlinks are matched as entries
//! but never followed.

use globset::{GlobBuilder, GlobMatcher};
use rustix::fs::{FileType, OFlags};

use crate::context::Context;
use crate::error::{OpError, OpResult};
use crate::fs::walk::{self, Limits, Step};
use crate::protocol::{ErrorKind, GlobParams, GlobResult};
use crate::roots::Access;

const DEFAULT_MAX_MATCHES: u64 = 1000;
const MAX_MATCHES: u64 = 10_000;
const MAX_DEPTH: usize = 64;
const MAX_ENTRIES: u64 = 200_000;

/// Runs `fs.glob`.
pub fn run(ctx: &Context, params: GlobParams) -> OpResult<GlobResult> {
    let pattern = Pattern::parse(&params.pattern)?;
    let base = params.path.as_deref().unwrap_or(".");
    let target = ctx.roots.resolve(base, Access::Read)?;
    let max_matches = params
        .max_matches
        .unwrap_or(DEFAULT_MAX_MATCHES)
        .clamp(1, MAX_MATCHES);

    let start_rel = join_rel(&target.rel, &pattern.prefix);
    let start_display = target.root_display(&start_rel);
    let dir = match target.open_rel(&start_rel, OFlags::RDONLY | OFlags::DIRECTORY) {
        Ok(fd) => fd,
        // A literal prefix that does not exist simply matches nothing.
        Err(e)
            if !pattern.prefix.is_empty()
                && matches!(e.kind, ErrorKind::NotFound | ErrorKind::NotADirectory) =>
        {
            return Ok(GlobResult {
                matches: Vec::new(),
                truncated: false,
            })
        }
        Err(e) => return Err(e),
    };
    let limits = Limits {
        max_depth: MAX_DEPTH,
        max_entries: MAX_ENTRIES,
    };
    let mut matches = Vec::new();
    let outcome = walk::walk(dir, limits, |entry| {
        let rel = join_rel(&pattern.prefix, entry.rel);
        if pattern.matcher.is_match(&rel) {
            if matches.len() as u64 >= max_matches {
                return Step::Stop;
            }
            matches.push(crate::paths::join(&start_display, entry.rel));
        }
        // A pattern without `**` cannot match below its depth: do not descend there.
        if entry.file_type == FileType::Directory
            && pattern.max_depth.is_some_and(|d| entry.depth >= d)
        {
            return Step::Skip;
        }
        Step::Continue
    });
    matches.sort();
    Ok(GlobResult {
        matches,
        truncated: outcome.truncated,
    })
}

fn join_rel(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}/{b}"),
    }
}

/// A validated glob with its literal directory prefix and depth bound.
struct Pattern {
    matcher: GlobMatcher,
    /// Leading components without glob syntax, e.g. `src/bin` for `src/bin/*.rs`.
    prefix: String,
    /// Components below the prefix the pattern can reach; `None` with `**`.
    max_depth: Option<usize>,
}

impl Pattern {
    fn parse(glob: &str) -> OpResult<Self> {
        if glob.is_empty() {
            return Err(OpError::invalid("pattern is empty"));
        }
        if glob.starts_with('/') || glob.contains('\0') {
            return Err(OpError::invalid(format!(
                "pattern '{}' must be relative to path (no leading '/', no NUL)",
                glob.escape_default()
            )));
        }
        let components: Vec<&str> = glob
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        if components.contains(&"..") {
            return Err(OpError::new(
                ErrorKind::PathNotAllowed,
                format!("pattern '{glob}' contains '..'"),
            ));
        }
        let is_literal = |c: &str| !c.contains(['*', '?', '[', ']', '{', '}', '\\']);
        let literal = components.iter().take_while(|c| is_literal(c)).count();
        // Keep at least the last component in the matcher, so `a/b` still matches `a/b`.
        let prefix_len = literal.min(components.len().saturating_sub(1));
        let prefix = components[..prefix_len].join("/");
        let max_depth = if components.iter().any(|c| c.contains("**")) {
            None
        } else {
            Some(components.len() - prefix_len)
        };
        let matcher = GlobBuilder::new(&components.join("/"))
            .literal_separator(true)
            .build()
            .map_err(|e| OpError::invalid(format!("pattern '{glob}' is not a valid glob: {e}")))?
            .compile_matcher();
        Ok(Pattern {
            matcher,
            prefix,
            max_depth,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_prefixes_and_depths() {
        let p = Pattern::parse("src/bin/*.rs").unwrap();
        assert_eq!(p.prefix, "src/bin");
        assert_eq!(p.max_depth, Some(1));
        assert!(p.matcher.is_match("src/bin/main.rs"));
        assert!(!p.matcher.is_match("src/bin/x/main.rs"));
        let p = Pattern::parse("**/*.rs").unwrap();
        assert_eq!(p.prefix, "");
        assert_eq!(p.max_depth, None);
        assert!(p.matcher.is_match("a/b/c.rs"));
        assert!(p.matcher.is_match("c.rs"));
        let p = Pattern::parse("a/b").unwrap();
        assert_eq!((p.prefix.as_str(), p.max_depth), ("a", Some(1)));
        let p = Pattern::parse("./x/*").unwrap();
        assert_eq!(p.prefix, "x");
    }

    #[test]
    fn escaping_patterns_are_refused() {
        assert_eq!(
            Pattern::parse("../*").err().map(|e| e.kind),
            Some(ErrorKind::PathNotAllowed)
        );
        assert_eq!(
            Pattern::parse("/etc/*").err().map(|e| e.kind),
            Some(ErrorKind::InvalidRequest)
        );
        assert!(Pattern::parse("a/[").is_err());
    }
}
