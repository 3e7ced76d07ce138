//! Reading newline-delimited frames from stdin with a size bound.
//!
//! `BufRead::read_line` would grow without limit on a line that never ends; this reader keeps at
//! most `max` bytes of a line, discards the rest up to the newline, and reports the line as too
//! long, so one bad frame costs an error response, not the executor's memory. Of a line too long
//! it keeps the first [`PREFIX`] bytes, where its request id is ([`request_id`]), so that the
//! refusal reaches the caller waiting for that id instead of leaving it to time out.

use std::io::{self, BufRead, Read};

use crate::protocol::{parse_block_header, BLOCK_HEADER, BLOCK_MARK, MAX_BLOCK};

/// What one read produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A line (without its newline) is in the buffer.
    Line,
    /// A line longer than the bound was skipped.
    TooLong,
    /// The stream ended.
    Eof,
    /// A block of transfer `id` (`protocol::transfer`): its payload is in the buffer.
    Block {
        /// The transfer's request id.
        id: u64,
    },
    /// A block of transfer `id` longer than [`MAX_BLOCK`] was skipped.
    BlockTooLong {
        /// The transfer's request id.
        id: u64,
    },
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
    // A frame that starts with the block mark is a block, read by its length.
    loop {
        match reader.fill_buf() {
            Ok([BLOCK_MARK, ..]) => return read_block(reader, line),
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
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

/// Reads one block (its mark is next) into `line`; a block longer than [`MAX_BLOCK`] is
/// skipped. A stream that ends inside a block is an error (a cut transfer).
fn read_block(reader: &mut impl BufRead, line: &mut Vec<u8>) -> io::Result<Frame> {
    let mut header = [0u8; BLOCK_HEADER];
    reader.read_exact(&mut header)?;
    let (id, len) = parse_block_header(&header)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed block header"))?;
    if len > MAX_BLOCK {
        let skipped = io::copy(&mut reader.take(len as u64), &mut io::sink())?;
        if skipped < len as u64 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        return Ok(Frame::BlockTooLong { id });
    }
    line.resize(len, 0);
    reader.read_exact(line)?;
    Ok(Frame::Block { id })
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

    #[test]
    fn blocks_sit_between_lines_whatever_bytes_they_hold() {
        let payload: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let mut input = b"{\"id\":1,\"op\":\"ping\"}\n".to_vec();
        input.extend_from_slice(&crate::protocol::block_header(7, payload.len()));
        input.extend_from_slice(&payload);
        input.extend_from_slice(&crate::protocol::block_header(7, 0));
        input.extend_from_slice(&crate::protocol::block_header(8, MAX_BLOCK + 1));
        input.extend(std::iter::repeat_n(b'\n', MAX_BLOCK + 1));
        input.extend_from_slice(b"{\"id\":2,\"op\":\"ping\"}\n");
        input.extend_from_slice(&crate::protocol::block_header(9, 10));
        input.extend_from_slice(b"cut");
        let mut reader = io::BufReader::with_capacity(64, &input[..]);
        let mut line = Vec::new();
        assert_eq!(
            read_frame(&mut reader, 100, &mut line).unwrap(),
            Frame::Line
        );
        assert_eq!(
            read_frame(&mut reader, 100, &mut line).unwrap(),
            Frame::Block { id: 7 }
        );
        assert_eq!(line, payload, "a block is not bound by the line limit");
        assert_eq!(
            read_frame(&mut reader, 100, &mut line).unwrap(),
            Frame::Block { id: 7 }
        );
        assert!(line.is_empty(), "the empty block that ends an upload");
        assert_eq!(
            read_frame(&mut reader, 100, &mut line).unwrap(),
            Frame::BlockTooLong { id: 8 }
        );
        assert_eq!(
            read_frame(&mut reader, 100, &mut line).unwrap(),
            Frame::Line
        );
        assert_eq!(request_id(&line), Some(2));
        assert!(
            read_frame(&mut reader, 100, &mut line).is_err(),
            "a cut block"
        );
    }
}
