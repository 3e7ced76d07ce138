//! `fs.write_stream` and `fs.read_stream`: a whole file carried as blocks (binary frames,
//! `protocol::transfer`), without base64 or JSON per chunk.
//!
//! Paths are resolved exactly as `fs.write` and `fs.read` resolve them (the same roots, the
//! same kernel-held rules, the same refusals of symlinks, directories, special files and hard
//! links), before a byte moves. A write goes to a fresh temporary file beside the name
//! ([`Temp`]) and becomes the name only after the node's end block: a cancel, the channel
//! closing, a stall of [`IDLE_LIMIT`] or a failed write removes it, so a transfer cut part way
//! never leaves a half file under the name.
//!
//! Credit bounds both directions: the node never has more than [`WINDOW`] bytes of an upload
//! queued here (the reader thread hands blocks over without waiting; more than the credit ends
//! the transfer), and a download never sends more than the node acknowledged, so neither side's
//! memory grows with a file and tool calls on the same channel are never starved behind it.

use std::io::Read;
use std::sync::Arc;

use rustix::fd::AsFd;

use crate::context::Context;
use crate::error::{OpError, OpResult};
use crate::fs::write::{write_place, write_target, Temp};
use crate::fs::{require_regular, READ_FLAGS};
use crate::output::Output;
use crate::protocol::{
    ErrorKind, Event, EventBody, PathParams, ReadStreamResult, WriteResult, WriteStreamParams,
    MAX_BLOCK, WINDOW,
};
use crate::roots::Access;

/// Credit an upload hands back at once, after writing this much.
const GRANT_EVERY: u64 = WINDOW / 4;

/// `fs.write_stream`: resolves like `fs.write`, grants credit, writes the blocks to a temporary
/// file and renames it over the name after the end block.
pub fn write(
    ctx: &Context,
    id: u64,
    params: WriteStreamParams,
    channel: &Arc<Output>,
) -> OpResult<WriteResult> {
    let target = write_target(ctx, &params.path, &params.metadata)?;
    let (parent, name, existing) = write_place(&target, params.create_dirs)?;
    let mode = existing.as_ref().map_or(0o644, |s| s.st_mode & 0o777);
    let mut temp = Temp::create(parent.as_fd(), &target.display)?;
    let registered = ctx.transfers.begin(id, channel);
    let transfer = &registered.transfer;
    grant(channel, id, WINDOW);
    let mut written = 0u64;
    let mut ungranted = 0u64;
    loop {
        let mut state = transfer
            .wait("block", |s| !s.blocks.is_empty() || s.ended)
            .map_err(|why| abandoned(&target.display, written, &why))?;
        let Some(block) = state.blocks.pop_front() else {
            break;
        };
        state.queued -= block.len() as u64;
        drop(state);
        temp.write(&block)?;
        written += block.len() as u64;
        ungranted += block.len() as u64;
        if ungranted >= GRANT_EVERY {
            grant(channel, id, ungranted);
            ungranted = 0;
        }
    }
    temp.commit(name, mode, &params.metadata)?;
    Ok(WriteResult {
        bytes_written: written,
        created: existing.is_none(),
    })
}

fn grant(channel: &Output, id: u64, bytes: u64) {
    channel.event(&Event {
        event: id,
        body: EventBody::Credit { bytes },
    });
}

fn abandoned(display: &str, written: u64, why: &str) -> OpError {
    OpError::new(
        ErrorKind::Io,
        format!(
            "the upload of '{display}' stopped after {written} bytes ({why}); the partial file \
             was removed and '{display}' is as it was"
        ),
    )
}

/// `fs.read_stream`: resolves like `fs.read`, sends the file as blocks within the credit, then
/// answers how many bytes went.
pub fn read(
    ctx: &Context,
    id: u64,
    params: PathParams,
    channel: &Arc<Output>,
) -> OpResult<ReadStreamResult> {
    let target = ctx.roots.resolve(&params.path, Access::Read)?;
    let fd = target.open(READ_FLAGS)?;
    let stat = require_regular(&fd, &target.display)?;
    let size_bytes = u64::try_from(stat.st_size).unwrap_or(0);
    let registered = ctx.transfers.begin(id, channel);
    let transfer = &registered.transfer;
    let mut file = std::fs::File::from(fd);
    let mut buf = vec![0u8; MAX_BLOCK];
    let mut sent = 0u64;
    let stopped = |why: &str, sent: u64| {
        OpError::new(
            ErrorKind::Io,
            format!(
                "the download of '{}' stopped after {sent} bytes: {why}",
                target.display
            ),
        )
    };
    loop {
        let room = {
            let state = transfer
                .wait("credit", |s| s.credit > 0)
                .map_err(|why| stopped(&why, sent))?;
            usize::try_from(state.credit)
                .unwrap_or(MAX_BLOCK)
                .min(MAX_BLOCK)
        };
        let n = match file.read(&mut buf[..room]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(OpError::io(&e, "cannot read", &target.display)),
        };
        transfer.lock().credit -= n as u64;
        channel
            .block(id, &buf[..n])
            .map_err(|e| stopped(&format!("the channel broke: {e}"), sent))?;
        sent += n as u64;
    }
    Ok(ReadStreamResult {
        bytes_read: sent,
        size_bytes,
    })
}
