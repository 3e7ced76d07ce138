//! `fs.read`: a file's content, whole or a window of lines, never more than a byte ceiling.
//!
//! The file is streamed, never loaded past the ceiling: the whole-file mode reads at most
//! `max_bytes + 1` bytes (the extra byte only tells whether the file goes on), and line mode
//! skips `offset` lines without keeping them. Content that is not UTF-8 comes back as base64.

use std::fs::File;
use std::io::{BufRead, BufReader};

use crate::context::Context;
use crate::encoding;
use crate::error::{OpError, OpResult};
use crate::fs::{find_newline, read_capped, require_regular, READ_FLAGS};
use crate::protocol::{ErrorKind, ReadParams, ReadResult};
use crate::roots::Access;

/// Most bytes line mode scans while skipping `offset` lines (a sparse file could be huge).
const MAX_SKIP_SCAN_BYTES: u64 = 1 << 30;

/// Runs `fs.read`.
pub fn run(ctx: &Context, params: ReadParams) -> OpResult<ReadResult> {
    let target = ctx.roots.resolve(&params.path, Access::Read)?;
    let fd = target.open(READ_FLAGS)?;
    let stat = require_regular(&fd, &target.display)?;
    let max_bytes = params
        .max_bytes
        .unwrap_or(ctx.config.max_file_bytes)
        .min(ctx.config.max_file_bytes);
    let size_bytes = u64::try_from(stat.st_size).unwrap_or(0);

    if params.byte_offset.is_some() || (params.offset.is_none() && params.limit.is_none()) {
        if let Some(start) = params.byte_offset {
            if params.offset.is_some() || params.limit.is_some() {
                return Err(OpError::new(
                    ErrorKind::InvalidRequest,
                    "byte_offset reads bytes; it cannot be combined with offset or limit (lines)",
                ));
            }
            rustix::fs::seek(&fd, rustix::fs::SeekFrom::Start(start))
                .map_err(|e| OpError::os(e, "cannot seek in", &target.display))?;
        }
        let (bytes, truncated) = read_capped(fd, max_bytes, &target.display)?;
        // Byte mode never drops a cut character: it may continue in the next chunk.
        let cut = truncated && params.byte_offset.is_none();
        let (content, encoding) = encoding::encode(bytes, cut);
        return Ok(ReadResult {
            content,
            encoding,
            size_bytes,
            lines_read: None,
            truncated,
        });
    }

    let mut reader = BufReader::with_capacity(64 * 1024, File::from(fd));
    let io_err = |e: std::io::Error| OpError::io(&e, "cannot read", &target.display);
    let window = read_lines(
        &mut reader,
        params.offset.unwrap_or(0),
        params.limit,
        max_bytes,
    )
    .map_err(io_err)?;
    let (content, encoding) = encoding::encode(window.bytes, window.truncated);
    Ok(ReadResult {
        content,
        encoding,
        size_bytes,
        lines_read: Some(window.lines),
        truncated: window.truncated,
    })
}

/// A window of lines taken from a stream.
#[derive(Debug, PartialEq, Eq)]
struct Window {
    bytes: Vec<u8>,
    lines: u64,
    truncated: bool,
}

/// Skips `offset` lines, then keeps up to `limit` lines and at most `max_bytes` bytes.
fn read_lines(
    reader: &mut impl BufRead,
    offset: u64,
    limit: Option<u64>,
    max_bytes: u64,
) -> std::io::Result<Window> {
    let mut skipped = 0u64;
    let mut scanned = 0u64;
    while skipped < offset {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        let step = match find_newline(buf) {
            Some(i) => {
                skipped += 1;
                i + 1
            }
            None => buf.len(),
        };
        reader.consume(step);
        scanned += step as u64;
        if scanned > MAX_SKIP_SCAN_BYTES {
            return Ok(Window {
                bytes: Vec::new(),
                lines: 0,
                truncated: true,
            });
        }
    }

    let max_bytes = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    let mut bytes = Vec::new();
    let mut complete_lines = 0u64;
    let mut truncated = false;
    loop {
        if limit.is_some_and(|l| complete_lines >= l) {
            truncated = !reader.fill_buf()?.is_empty();
            break;
        }
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        let (take, ends_line) = match find_newline(buf) {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let room = max_bytes - bytes.len();
        if take > room {
            bytes.extend_from_slice(&buf[..room]);
            truncated = true;
            break;
        }
        bytes.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if ends_line {
            complete_lines += 1;
        }
    }
    let partial = u64::from(bytes.last().is_some_and(|&b| b != b'\n'));
    Ok(Window {
        lines: complete_lines + partial,
        bytes,
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(text: &str, offset: u64, limit: Option<u64>, max: u64) -> (String, u64, bool) {
        let mut reader = BufReader::with_capacity(4, text.as_bytes());
        let w = read_lines(&mut reader, offset, limit, max).unwrap();
        (String::from_utf8(w.bytes).unwrap(), w.lines, w.truncated)
    }

    #[test]
    fn windows_of_lines() {
        let text = "one\ntwo\nthree\nfour";
        assert_eq!(
            window(text, 0, Some(2), 100),
            ("one\ntwo\n".into(), 2, true)
        );
        assert_eq!(
            window(text, 1, Some(2), 100),
            ("two\nthree\n".into(), 2, true)
        );
        assert_eq!(window(text, 2, None, 100), ("three\nfour".into(), 2, false));
        assert_eq!(window(text, 3, Some(5), 100), ("four".into(), 1, false));
        assert_eq!(window(text, 9, Some(5), 100), (String::new(), 0, false));
        assert_eq!(window("a\n", 0, Some(1), 100), ("a\n".into(), 1, false));
    }

    #[test]
    fn the_byte_ceiling_cuts_lines() {
        assert_eq!(window("abcdef\ngh\n", 0, None, 4), ("abcd".into(), 1, true));
        assert_eq!(window("ab\ncd\n", 0, None, 3), ("ab\n".into(), 1, true));
        assert_eq!(
            window("ab\ncd\n", 0, None, 6),
            ("ab\ncd\n".into(), 2, false)
        );
    }
}
