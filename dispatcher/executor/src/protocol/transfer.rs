//! The transfer half of the protocol: a whole file carried as raw bytes, without base64 or JSON
//! per chunk (the E2B door's `/files` uploads and downloads).
//!
//! Bytes travel in **blocks**, binary frames that sit between the JSON lines on either
//! direction of the channel: a zero byte (no JSON line starts with one), the transfer's request
//! id (u64, big-endian), the payload's length (u32, big-endian, at most [`MAX_BLOCK`]), then the
//! payload. A block is written whole, like a line, so it never interleaves with another.
//!
//! `fs.write_stream` resolves its path exactly as `fs.write` does and opens a fresh temporary
//! file beside it, then grants credit (`credit` events, [`WINDOW`] at first): the node sends
//! blocks of that id within the credit, and an empty block to end. Only then is the temporary
//! file renamed over the name; anything else (a `cancel` of the id, the connection closing,
//! [`IDLE_LIMIT`] without a block, a failed write) removes it and answers an error: a file is
//! replaced whole or not at all. `fs.read_stream` resolves like `fs.read`, sends the file as
//! blocks within the credit the node grants back (`fs.stream_ack`, answered inline like `ping`),
//! then answers.
//!
//! ```text
//! {"id":9,"op":"fs.write_stream","path":"/workspace/a.bin"}
//! {"event":9,"kind":"credit","bytes":2097152}
//! \0 <9: 8 bytes> <len: 4 bytes> <len bytes> ...  \0 <9> <0>
//! {"id":9,"ok":{"bytes_written":5242880,"created":true}}
//!
//! {"id":10,"op":"fs.read_stream","path":"/workspace/a.bin"}
//! \0 <10> <len> <bytes> ...
//! {"id":11,"op":"fs.stream_ack","target":10,"bytes":1048576}
//! {"id":10,"ok":{"bytes_read":5242880,"size_bytes":5242880}}
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The first byte of a block (no JSON line starts with it).
pub const BLOCK_MARK: u8 = 0;
/// Bytes of a block's header: the mark, the id (8), the length (4).
pub const BLOCK_HEADER: usize = 13;
/// Most payload bytes of one block.
pub const MAX_BLOCK: usize = 256 * 1024;
/// Bytes a transfer may have in flight unacknowledged (the initial credit, and the most the
/// receiving side ever holds of it).
pub const WINDOW: u64 = 2 * 1024 * 1024;
/// How long a transfer waits for a block or for credit before it gives up.
pub const IDLE_LIMIT: Duration = Duration::from_secs(60);

/// A block's header for `len` payload bytes of transfer `id`.
pub fn block_header(id: u64, len: usize) -> [u8; BLOCK_HEADER] {
    let mut header = [0u8; BLOCK_HEADER];
    header[0] = BLOCK_MARK;
    header[1..9].copy_from_slice(&id.to_be_bytes());
    // A length over u32 is never made: blocks are at most MAX_BLOCK.
    header[9..13].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    header
}

/// The id and payload length of a block's header (`None` when it is not one).
pub fn parse_block_header(header: &[u8]) -> Option<(u64, usize)> {
    if header.len() < BLOCK_HEADER || header[0] != BLOCK_MARK {
        return None;
    }
    let id = u64::from_be_bytes(header[1..9].try_into().ok()?);
    let len = u32::from_be_bytes(header[9..13].try_into().ok()?);
    Some((id, usize::try_from(len).ok()?))
}

/// Parameters of `fs.write_stream`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteStreamParams {
    /// The file to create or replace (resolved like `fs.write`'s).
    pub path: String,
    /// Create missing parent directories; default `true`.
    #[serde(default = "super::default_true")]
    pub create_dirs: bool,
    /// User metadata, as `fs.write`'s.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Who performs it: the sandbox user (default) or root, which only an executor whose
    /// config has `allow_root` accepts (gVisor-class sandboxes that asked for it).
    #[serde(default, skip_serializing_if = "super::RunAs::is_user")]
    pub user: super::RunAs,
}

/// Parameters of `fs.stream_ack`: the node handed on `bytes` more of a read stream's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamAckParams {
    /// The id of the `fs.read_stream` request.
    pub target: u64,
    /// Payload bytes handed on since the last ack.
    pub bytes: u64,
}

/// Result of `fs.read_stream`, after its last block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadStreamResult {
    /// Payload bytes sent in blocks.
    pub bytes_read: u64,
    /// The file's size when it was opened.
    pub size_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_header_round_trips_and_nothing_else_parses_as_one() {
        let header = block_header(0x0102_0304_0506_0708, 262_144);
        assert_eq!(
            parse_block_header(&header),
            Some((0x0102_0304_0506_0708, 262_144))
        );
        assert_eq!(parse_block_header(&header[..12]), None);
        assert_eq!(parse_block_header(b"{\"id\":1,\"op\":\"ping\"}"), None);
    }
}
