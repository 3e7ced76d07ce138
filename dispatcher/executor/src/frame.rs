//! Reading newline-delimited frames from stdin with a size bound.
//!
//! `BufRead::read_line` would grow without limit on a line that never ends; this reader keeps at
//! most `max` bytes of a line, discards the rest up to the newline, and reports the line as too
//! long, so one bad frame costs an error response, not the executor's memory. Of a line too long
//! it keeps the first [`PREFIX`] bytes, where its request id is ([`request_id`]), so that the
//! refusal reaches the caller waiting for that id instead of leaving it to time out.

use std::io::{self, BufRead};

/// What one read produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A line (without its newline) is in the buffer.
    Line,
    /// A line longer than the bound was skipped.
    TooLong,
    /// The stream ended.
    Eof,
}

/// Bytes of a too-long line kept for its request id.
pub const PREFIX: usize = 64;

/// The request id at the start of a (possibly cut) request line, `{"id":N,...`, as the
/// dispatcher writes it (`id` first).
pub fn request_id(prefix: &[u8]) -> Option<u64> {
    let rest = prefix.strip_prefix(b"{\"id\":")?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

/// Reads the next line into `line` (cleared first), keeping at most `max` bytes; of a line
/// longer than that, `line` holds its first [`PREFIX`] bytes.
pub fn read_frame(reader: &mut impl BufRead, max: usize, line: &mut Vec<u8>) -> io::Result<Frame> {
    line.clear();
    let mut overflow = false;
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(if overflow {
                Frame::TooLong
            } else if line.is_empty() {
                Frame::Eof
            } else {
                Frame::Line
            });
        }
        let (take, complete) = match memchr::memchr(b'\n', buf) {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if !overflow {
            if line.len() + take > max {
                overflow = true;
                let keep = PREFIX.saturating_sub(line.len()).min(take);
                line.extend_from_slice(&buf[..keep]);
                line.truncate(PREFIX);
            } else {
                line.extend_from_slice(&buf[..take]);
            }
        }
        reader.consume(if complete { take + 1 } else { take });
        if complete {
            return Ok(if overflow {
                Frame::TooLong
            } else {
                Frame::Line
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_long_lines_and_eof() {
        let input = b"{\"a\":1}\nxxxxxxxxxxxxxxxxxxxx\nlast".to_vec();
        let mut reader = io::BufReader::with_capacity(4, &input[..]);
        let mut line = Vec::new();
        assert_eq!(read_frame(&mut reader, 10, &mut line).unwrap(), Frame::Line);
        assert_eq!(line, b"{\"a\":1}");
        assert_eq!(
            read_frame(&mut reader, 10, &mut line).unwrap(),
            Frame::TooLong
        );
        assert_eq!(read_frame(&mut reader, 10, &mut line).unwrap(), Frame::Line);
        assert_eq!(line, b"last");
        assert_eq!(read_frame(&mut reader, 10, &mut line).unwrap(), Frame::Eof);
    }

    #[test]
    fn a_too_long_request_keeps_its_id() {
        let mut input = b"{\"id\":4711,\"op\":\"fs.write\",\"content\":\"".to_vec();
        input.extend(std::iter::repeat_n(b'x', 10_000));
        input.extend_from_slice(b"\"}\n{\"id\":2,\"op\":\"ping\"}\n");
        let mut reader = io::BufReader::with_capacity(16, &input[..]);
        let mut line = Vec::new();
        assert_eq!(
            read_frame(&mut reader, 100, &mut line).unwrap(),
            Frame::TooLong
        );
        assert_eq!(line.len(), PREFIX);
        assert_eq!(request_id(&line), Some(4711));
        assert_eq!(
            read_frame(&mut reader, 100, &mut line).unwrap(),
            Frame::Line
        );
        assert_eq!(request_id(&line), Some(2));
        assert_eq!(request_id(b"{\"op\":\"ping\",\"id\":3}"), None);
    }
}
