//! `fs.grep`: regular-expression search over a file or a directory tree, bounded everywhere.
//!
//! Patterns are compiled by the `regex` crate, whose matching time is linear in the input, with
//! size limits on the compiled program, so a hostile pattern cannot stall the executor. The tree is
//! walked by descriptors without following symlinks (`walk.rs`); each file is opened
//! `O_NOFOLLOW`, read up to a per-file ceiling, skipped if it looks binary (a NUL byte in its
//! first 8 KiB), and searched as a whole buffer in multi-line mode. Bounds on matches, files,
//! bytes and depth end the search early with `truncated: true`, and so does a time limit
//! (`timed_out: true` as well), so a huge tree cannot hold a request thread for long.

use std::time::{Duration, Instant};

use globset::{GlobBuilder, GlobMatcher};
use regex::bytes::{Regex, RegexBuilder};
use rustix::fs::{FileType, Mode, OFlags};

use crate::context::Context;
use crate::error::{OpError, OpResult};
use crate::fs::walk::{self, Limits, Step};
use crate::fs::{read_capped, require_regular, READ_FLAGS};
use crate::paths::floor_char_boundary;
use crate::protocol::{GrepMatch, GrepParams, GrepResult};
use crate::roots::Access;

const DEFAULT_MAX_MATCHES: u64 = 1000;
const MAX_MATCHES: u64 = 10_000;
const DEFAULT_BYTES_PER_FILE: u64 = 1024 * 1024;
const MAX_FILES: u64 = 50_000;
const MAX_TOTAL_BYTES: u64 = 512 * 1024 * 1024;
const MAX_LINE_BYTES: usize = 2000;
const BINARY_SNIFF_BYTES: usize = 8192;
/// Default and ceiling of the search's wall-clock time.
pub const MAX_GREP_TIME: Duration = Duration::from_secs(30);
const LIMITS: Limits = Limits {
    max_depth: 64,
    max_entries: 200_000,
};

/// Runs `fs.grep`.
pub fn run(ctx: &Context, params: GrepParams) -> OpResult<GrepResult> {
    let regex = compile(&params.pattern, params.case_insensitive)?;
    let include = params.include.as_deref().map(Include::new).transpose()?;
    let target = ctx.roots.resolve(&params.path, Access::Read)?;
    let deadline = Instant::now()
        + params
            .timeout_ms
            .map_or(MAX_GREP_TIME, Duration::from_millis)
            .min(MAX_GREP_TIME);
    let mut search = Search {
        regex,
        max_matches: params
            .max_matches
            .unwrap_or(DEFAULT_MAX_MATCHES)
            .clamp(1, MAX_MATCHES),
        bytes_per_file: params
            .max_bytes_per_file
            .unwrap_or(DEFAULT_BYTES_PER_FILE)
            .min(ctx.config.max_file_bytes),
        result: GrepResult {
            matches: Vec::new(),
            truncated: false,
            files_scanned: 0,
            timed_out: false,
        },
        bytes_total: 0,
    };

    let fd = target.open(READ_FLAGS)?;
    let stat =
        rustix::fs::fstat(&fd).map_err(|e| OpError::os(e, "cannot stat", &target.display))?;
    if crate::fs::file_type(&stat) != FileType::Directory {
        require_regular(&fd, &target.display)?;
        search.file(fd, &target.display);
        return Ok(search.result);
    }
    let dir = target.open(OFlags::RDONLY | OFlags::DIRECTORY)?;
    let outcome = walk::walk(dir, LIMITS, |entry| {
        if Instant::now() >= deadline {
            search.result.timed_out = true;
            search.result.truncated = true;
            return Step::Stop;
        }
        if entry.file_type != FileType::RegularFile {
            return Step::Continue;
        }
        if include.as_ref().is_some_and(|inc| !inc.matches(entry.rel)) {
            return Step::Continue;
        }
        if search.result.files_scanned >= MAX_FILES || search.bytes_total >= MAX_TOTAL_BYTES {
            return Step::Stop;
        }
        let Ok(fd) = rustix::fs::openat(
            entry.dir,
            entry.name.as_c_str(),
            READ_FLAGS | OFlags::NOFOLLOW,
            Mode::empty(),
        ) else {
            return Step::Continue;
        };
        if require_regular(&fd, entry.rel).is_err() {
            return Step::Continue;
        }
        search.file(fd, &target.child_display(entry.rel));
        if search.done() {
            Step::Stop
        } else {
            Step::Continue
        }
    });
    search.result.truncated |= outcome.truncated;
    Ok(search.result)
}

/// Compiles a pattern with bounded program sizes; `^`/`$` match at line boundaries.
fn compile(pattern: &str, case_insensitive: bool) -> OpResult<Regex> {
    RegexBuilder::new(pattern)
        .case_insensitive(case_insensitive)
        .multi_line(true)
        .size_limit(8 * 1024 * 1024)
        .dfa_size_limit(16 * 1024 * 1024)
        .build()
        .map_err(|e| OpError::invalid(format!("pattern is not a valid regular expression: {e}")))
}

/// The `include` filter: a glob on the relative path, or on the name when it has no `/`.
struct Include {
    matcher: GlobMatcher,
    name_only: bool,
}

impl Include {
    fn new(glob: &str) -> OpResult<Self> {
        let matcher = GlobBuilder::new(glob)
            .literal_separator(true)
            .build()
            .map_err(|e| OpError::invalid(format!("include '{glob}' is not a valid glob: {e}")))?
            .compile_matcher();
        Ok(Include {
            matcher,
            name_only: !glob.contains('/'),
        })
    }

    fn matches(&self, rel: &str) -> bool {
        let subject = if self.name_only {
            rel.rsplit('/').next().unwrap_or(rel)
        } else {
            rel
        };
        self.matcher.is_match(subject)
    }
}

struct Search {
    regex: Regex,
    max_matches: u64,
    bytes_per_file: u64,
    result: GrepResult,
    bytes_total: u64,
}

impl Search {
    fn done(&self) -> bool {
        self.result.matches.len() as u64 >= self.max_matches
    }

    /// Searches one opened regular file; unreadable or binary files are skipped.
    fn file(&mut self, fd: rustix::fd::OwnedFd, display: &str) {
        let Ok((bytes, cut)) = read_capped(fd, self.bytes_per_file, display) else {
            return;
        };
        self.bytes_total += bytes.len() as u64;
        let sniff = &bytes[..bytes.len().min(BINARY_SNIFF_BYTES)];
        if sniff.contains(&0) {
            return;
        }
        self.result.files_scanned += 1;
        self.result.truncated |= cut;
        let room =
            usize::try_from(self.max_matches).unwrap_or(usize::MAX) - self.result.matches.len();
        let (found, more) = matching_lines(&self.regex, &bytes, room);
        self.result.truncated |= more;
        self.result
            .matches
            .extend(found.into_iter().map(|(line, text)| GrepMatch {
                file: display.to_string(),
                line,
                text,
            }));
    }
}

/// Finds up to `room` lines of `haystack` containing a match: (1-based line number, text). The
/// flag says more matching lines were left.
fn matching_lines(regex: &Regex, haystack: &[u8], room: usize) -> (Vec<(u64, String)>, bool) {
    let mut found = Vec::new();
    let mut line_number = 1u64;
    let mut counted_to = 0;
    let mut from = 0;
    while from <= haystack.len() {
        let Some(m) = regex.find_at(haystack, from) else {
            break;
        };
        if found.len() == room {
            return (found, true);
        }
        let start = m.start();
        line_number += haystack[counted_to..start]
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
        counted_to = start;
        let line_start = haystack[..start]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let line_end = haystack[start..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(haystack.len(), |i| start + i);
        let mut line = &haystack[line_start..line_end];
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        let text = String::from_utf8_lossy(line);
        let text = &text[..floor_char_boundary(&text, MAX_LINE_BYTES)];
        found.push((line_number, text.to_string()));
        from = line_end + 1;
    }
    (found, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(pattern: &str, text: &str, room: usize) -> (Vec<(u64, String)>, bool) {
        matching_lines(&compile(pattern, false).unwrap(), text.as_bytes(), room)
    }

    #[test]
    fn one_result_per_matching_line_with_numbers() {
        let (found, more) = lines("o", "foo\nbar\nbob\r\n", 10);
        assert_eq!(found, vec![(1, "foo".to_string()), (3, "bob".to_string())]);
        assert!(!more);
        let (found, _) = lines("^b", "foo\nbar\nbob", 10);
        assert_eq!(found.iter().map(|f| f.0).collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    fn empty_matches_do_not_loop() {
        let (found, _) = lines("^", "a\nb\n", 10);
        assert_eq!(found.len(), 3);
        let (found, more) = lines("x*", "a\nb", 1);
        assert_eq!(found, vec![(1, "a".to_string())]);
        assert!(more);
    }

    #[test]
    fn includes_match_names_or_relative_paths() {
        let by_name = Include::new("*.rs").unwrap();
        assert!(by_name.matches("src/deep/main.rs"));
        assert!(!by_name.matches("src/main.rsx"));
        let by_path = Include::new("src/*.rs").unwrap();
        assert!(by_path.matches("src/main.rs"));
        assert!(!by_path.matches("src/deep/main.rs"));
        assert!(Include::new("[").is_err());
    }

    #[test]
    fn bad_patterns_are_invalid_requests() {
        let err = compile("(", false).unwrap_err();
        assert_eq!(err.kind, crate::protocol::ErrorKind::InvalidRequest);
        assert!(compile("a{100000}{100000}", false).is_err());
    }
}
