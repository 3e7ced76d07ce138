//! `logs.read`: the filtered tail of a log file, read backwards in blocks.
//!
//! The file is resolved and opened like `fs.read` (openat2 beneath a read root, as the sandbox
//! user) and read from its end in 64 KiB blocks with `pread`, so memory stays bounded whatever
//! the file's size: the lines being assembled (a line longer than 64 KiB keeps only its first
//! 64 KiB), plus the result. Each line, newest first, is kept when it contains the literal
//! `filter` (or matches it as a `regex`-crate pattern: linear time, no backtracking); with
//! `json_field` the line is parsed as JSON and that dot-path field is returned instead, lines
//! without it being counted in `json_missing`. The scan stops when enough lines matched, after
//! [`MAX_SCAN_BYTES`], or when the result reaches [`MAX_RESULT_BYTES`]; lines come back oldest
//! first, like `tail`.

use std::fs::File;
use std::os::unix::fs::FileExt;

use regex::bytes::{Regex, RegexBuilder};
use serde_json::Value;

use crate::context::Context;
use crate::error::{OpError, OpResult};
use crate::fs::{require_regular, READ_FLAGS};
use crate::protocol::{LogsReadParams, LogsReadResult};
use crate::roots::Access;

/// Lines returned when the caller does not say.
pub const DEFAULT_LINES: u64 = 100;
/// Most lines returned.
pub const MAX_LINES: u64 = 5000;
/// Bytes read from the end of the file at most, per call.
pub const MAX_SCAN_BYTES: u64 = 64 << 20;
/// Most bytes of lines returned in total.
pub const MAX_RESULT_BYTES: usize = 4 << 20;
/// Bytes of one returned line kept.
const MAX_LINE_RETURNED: usize = 8 << 10;
/// Bytes of one line kept while scanning (its beginning).
const MAX_LINE_SCANNED: usize = 64 << 10;
/// Size of one backward read.
const BLOCK: u64 = 64 << 10;
/// Ceiling on the compiled size of a filter pattern.
const MAX_REGEX_SIZE: usize = 1 << 20;

/// Runs `logs.read`.
pub fn run(ctx: &Context, params: LogsReadParams) -> OpResult<LogsReadResult> {
    let want = params.lines.unwrap_or(DEFAULT_LINES);
    if want == 0 || want > MAX_LINES {
        return Err(OpError::invalid(format!(
            "lines must be between 1 and {MAX_LINES}, got {want}"
        )));
    }
    let filter = params
        .filter
        .as_deref()
        .map(|f| compile_filter(f, params.regex))
        .transpose()?;
    let field = params.json_field.as_deref().map(parse_field).transpose()?;
    let target = ctx.roots.resolve(&params.path, Access::Read)?;
    let fd = target.open(READ_FLAGS)?;
    let stat = require_regular(&fd, &target.display)?;
    let size_bytes = u64::try_from(stat.st_size).unwrap_or(0);
    let file = File::from(fd);
    let io_err = |e: std::io::Error| OpError::io(&e, "cannot read", &target.display);

    let mut reader = Backward::new(&file, size_bytes).map_err(io_err)?;
    let selection = Selection {
        want,
        filter: filter.as_ref(),
        field: field.as_deref(),
        max_scan_bytes: MAX_SCAN_BYTES,
    };
    let mut result = selection.collect(&mut reader).map_err(io_err)?;
    result.size_bytes = size_bytes;
    Ok(result)
}

/// What to take from the tail of a file.
struct Selection<'a> {
    want: u64,
    filter: Option<&'a Regex>,
    field: Option<&'a [String]>,
    max_scan_bytes: u64,
}

impl Selection<'_> {
    /// Reads lines backwards until enough matched or a bound is reached (`size_bytes` left 0).
    fn collect(&self, reader: &mut Backward<'_>) -> std::io::Result<LogsReadResult> {
        let mut newest_first = Vec::new();
        let mut result_bytes = 0usize;
        let mut result = LogsReadResult {
            lines: Vec::new(),
            lines_scanned: 0,
            lines_matched: 0,
            lines_returned: 0,
            json_missing: 0,
            truncated: false,
            size_bytes: 0,
        };
        // The scan bound is checked before every line, matching or not.
        while reader.scanned() < self.max_scan_bytes {
            let Some(line) = reader.next_line()? else {
                break;
            };
            result.lines_scanned += 1;
            if self.filter.is_some_and(|f| !f.is_match(&line)) {
                continue;
            }
            let text = match self.field {
                None => String::from_utf8_lossy(&line).into_owned(),
                Some(path) => match extract(&line, path) {
                    Some(text) => text,
                    None => {
                        result.json_missing += 1;
                        continue;
                    }
                },
            };
            let text = cut(text, MAX_LINE_RETURNED);
            result.lines_matched += 1;
            if result_bytes + text.len() > MAX_RESULT_BYTES {
                result.truncated = true;
                break;
            }
            result_bytes += text.len();
            newest_first.push(text);
            if newest_first.len() as u64 >= self.want {
                break;
            }
        }
        result.truncated |= reader.has_more();
        newest_first.reverse();
        result.lines_returned = newest_first.len() as u64;
        result.lines = newest_first;
        Ok(result)
    }
}

fn compile_filter(filter: &str, is_regex: bool) -> OpResult<Regex> {
    let pattern = if is_regex {
        filter.to_owned()
    } else {
        regex::escape(filter)
    };
    RegexBuilder::new(&pattern)
        .size_limit(MAX_REGEX_SIZE)
        .build()
        .map_err(|e| OpError::invalid(format!("filter is not a valid regular expression: {e}")))
}

/// Splits `a.b.0` into segments; empty segments are refused.
fn parse_field(path: &str) -> OpResult<Vec<String>> {
    let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
    if segments.iter().any(String::is_empty) {
        return Err(OpError::invalid(format!(
            "json_field '{path}' has an empty segment (write it as a.b.c)"
        )));
    }
    Ok(segments)
}

/// The field at `path` of `line` parsed as JSON: strings as they are, anything else as JSON.
fn extract(line: &[u8], path: &[String]) -> Option<String> {
    let value: Value = serde_json::from_slice(line).ok()?;
    let mut at = &value;
    for segment in path {
        at = match at {
            Value::Object(map) => map.get(segment)?,
            Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(match at {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// Cuts `text` to at most `max` bytes on a character boundary.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// Lines of a file from its end backwards, with bounded memory.
struct Backward<'f> {
    file: &'f File,
    /// File offset of the first byte of `pending`.
    pos: u64,
    /// Bytes not yet returned, starting at `pos`.
    pending: Vec<u8>,
    /// The line being assembled in `pending` was cut to its first bytes.
    cut: bool,
    /// The first line of the file was returned.
    done: bool,
    /// Bytes read so far.
    read: u64,
}

impl<'f> Backward<'f> {
    fn new(file: &'f File, size: u64) -> std::io::Result<Self> {
        // A final newline ends the last line; it does not start an empty one.
        let mut end = size;
        if size > 0 {
            let mut last = [0u8; 1];
            file.read_exact_at(&mut last, size - 1)?;
            if last[0] == b'\n' {
                end -= 1;
            }
        }
        Ok(Backward {
            file,
            pos: end,
            pending: Vec::new(),
            cut: false,
            done: size == 0,
            read: 0,
        })
    }

    fn scanned(&self) -> u64 {
        self.read
    }

    /// Whether earlier lines remain.
    fn has_more(&self) -> bool {
        !self.done
    }

    fn next_line(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        loop {
            if self.done {
                return Ok(None);
            }
            if let Some(i) = self.pending.iter().rposition(|&b| b == b'\n') {
                let line = self.pending.split_off(i + 1);
                self.pending.truncate(i);
                self.cut = false;
                return Ok(Some(line));
            }
            if self.pos == 0 {
                self.done = true;
                return Ok(Some(std::mem::take(&mut self.pending)));
            }
            let n = BLOCK.min(self.pos);
            self.pos -= n;
            let mut block = vec![0u8; usize::try_from(n).unwrap_or(0)];
            self.file.read_exact_at(&mut block, self.pos)?;
            self.read += n;
            // The line in `pending` continues (backwards) into this block.
            let newline_in_block = block.iter().rposition(|&b| b == b'\n');
            block.extend_from_slice(&self.pending);
            self.pending = block;
            if newline_in_block.is_none() && self.pending.len() > MAX_LINE_SCANNED {
                // Still no start of line: keep the bytes nearest to it, drop the rest.
                self.pending.truncate(MAX_LINE_SCANNED);
                self.cut = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn lines_of(content: &[u8]) -> Vec<Vec<u8>> {
        let mut file = tempfile_with(content);
        let size = file.metadata().unwrap().len();
        file.flush().unwrap();
        let mut reader = Backward::new(&file, size).unwrap();
        let mut out = Vec::new();
        while let Some(line) = reader.next_line().unwrap() {
            out.push(line);
        }
        out
    }

    fn tempfile_with(content: &[u8]) -> File {
        let path = std::env::temp_dir().join(format!(
            "logs-read-test-{}-{}",
            std::process::id(),
            content.len()
        ));
        std::fs::write(&path, content).unwrap();
        let file = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }

    #[test]
    fn lines_come_newest_first() {
        assert_eq!(
            lines_of(b"a\nbb\nccc\n"),
            vec![b"ccc".to_vec(), b"bb".to_vec(), b"a".to_vec()]
        );
        assert_eq!(
            lines_of(b"a\n\nb"),
            vec![b"b".to_vec(), b"".to_vec(), b"a".to_vec()]
        );
        assert!(lines_of(b"").is_empty());
        assert_eq!(lines_of(b"\n"), vec![b"".to_vec()]);
    }

    #[test]
    fn lines_spanning_blocks_are_whole() {
        let long = "x".repeat(150_000);
        let content = format!("first\n{long}\nlast\n");
        let lines = lines_of(content.as_bytes());
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], b"last");
        // Kept: the beginning of the overlong line, at most MAX_LINE_SCANNED + one block.
        assert!(lines[1].len() <= MAX_LINE_SCANNED + BLOCK as usize);
        assert!(lines[1].iter().all(|&b| b == b'x'));
        assert_eq!(lines[2], b"first");
    }

    #[test]
    fn the_scan_stops_at_its_byte_bound_even_without_matches() {
        let content: String = (0..100_000).map(|i| format!("line {i}\n")).collect();
        let file = tempfile_with(content.as_bytes());
        let size = file.metadata().unwrap().len();
        let mut reader = Backward::new(&file, size).unwrap();
        let nothing = compile_filter("no such text", false).unwrap();
        let selection = Selection {
            want: 10,
            filter: Some(&nothing),
            field: None,
            max_scan_bytes: 2 * BLOCK,
        };
        let result = selection.collect(&mut reader).unwrap();
        assert_eq!(result.lines_returned, 0);
        assert!(result.truncated, "earlier lines were not examined");
        assert!(reader.scanned() <= 3 * BLOCK, "read {}", reader.scanned());
        assert!(result.lines_scanned > 0 && result.lines_scanned < 100_000);
    }

    #[test]
    fn json_fields_by_dot_path() {
        let path = parse_field("a.b.1").unwrap();
        assert_eq!(
            extract(br#"{"a":{"b":["x","y"]}}"#, &path),
            Some("y".into())
        );
        assert_eq!(
            extract(br#"{"a":{"b":[1,{"c":2}]}}"#, &path),
            Some(r#"{"c":2}"#.into())
        );
        assert_eq!(extract(b"not json", &path), None);
        assert!(parse_field("a..b").is_err());
    }

    #[test]
    fn literal_filters_are_not_patterns() {
        let literal = compile_filter("a.c", false).unwrap();
        assert!(literal.is_match(b"xa.cx"));
        assert!(!literal.is_match(b"abc"));
        assert!(compile_filter("a.c", true).unwrap().is_match(b"abc"));
        assert!(compile_filter("(", true).is_err());
    }
}
