//! Reading newline-delimited frames from stdin with a size bound.
//!
//! `BufRead::read_line` would grow without limit on a line that never ends; this reader keeps at
//! most `max` bytes of a line, discards the rest up to the newline, and reports the line as too
//! long, so one bad frame costs an error response, not the executor's memory.

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

/// Reads the next line into `line` (cleared first), keeping at most `max` bytes.
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
        let (take, complete) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if !overflow {
            if line.len() + take > max {
                overflow = true;
                line.clear();
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
}
