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

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use rustix::fd::AsFd;

use crate::context::Context;
use crate::error::{OpError, OpResult};
use crate::fs::write::{check_metadata, check_replaceable, Temp};
use crate::fs::{create_dir, require_regular, READ_FLAGS};
use crate::output::Output;
use crate::paths;
use crate::protocol::{
    ErrorKind, Event, EventBody, PathParams, ReadStreamResult, WriteResult, WriteStreamParams,
    IDLE_LIMIT, MAX_BLOCK, WINDOW,
};
use crate::roots::Access;

/// Credit an upload hands back at once, after writing this much.
const GRANT_EVERY: u64 = WINDOW / 4;

/// What one transfer has: blocks received and not yet written (uploads), credit (downloads),
/// whether it ended or was abandoned.
#[derive(Default)]
struct State {
    blocks: VecDeque<Vec<u8>>,
    /// Payload bytes in `blocks`.
    queued: u64,
    /// The upload's end block came.
    ended: bool,
    /// Why the transfer must stop (cancel, channel closed, credit overrun).
    abandoned: Option<String>,
    /// Bytes a download may send before the next ack.
    credit: u64,
}

/// One transfer in progress, shared by its handler thread and the channel's reader.
struct Transfer {
    state: Mutex<State>,
    changed: Condvar,
    /// The channel its request came on: its blocks and credit go there, and its end abandons
    /// the transfer.
    channel: Arc<Output>,
}

impl Transfer {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn abandon(&self, why: String) {
        let mut state = self.lock();
        state.abandoned.get_or_insert(why);
        drop(state);
        self.changed.notify_all();
    }

    /// Waits until `ready` holds, the transfer was abandoned (its reason) or [`IDLE_LIMIT`]
    /// passed without a change.
    fn wait(
        &self,
        what: &str,
        mut ready: impl FnMut(&State) -> bool,
    ) -> Result<MutexGuard<'_, State>, String> {
        let mut state = self.lock();
        let mut since = Instant::now();
        loop {
            if let Some(why) = &state.abandoned {
                return Err(why.clone());
            }
            if ready(&state) {
                return Ok(state);
            }
            let left = IDLE_LIMIT.saturating_sub(since.elapsed());
            if left.is_zero() {
                return Err(format!("no {what} came for {}s", IDLE_LIMIT.as_secs()));
            }
            let (next, timeout) = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner);
            state = next;
            if !timeout.timed_out() {
                since = Instant::now();
            }
        }
    }
}

/// The transfers in progress, by request id.
#[derive(Default)]
pub struct Transfers {
    table: Mutex<HashMap<u64, Arc<Transfer>>>,
}

impl Transfers {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Transfer>>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn begin(&self, id: u64, channel: &Arc<Output>) -> Registered<'_> {
        let transfer = Arc::new(Transfer {
            state: Mutex::new(State {
                credit: WINDOW,
                ..State::default()
            }),
            changed: Condvar::new(),
            channel: Arc::clone(channel),
        });
        self.lock().insert(id, Arc::clone(&transfer));
        Registered {
            transfers: self,
            id,
            transfer,
        }
    }

    /// A block from the node, handed over without waiting (the reader thread calls this); an
    /// empty block ends the upload. A block of a transfer that is over is dropped.
    pub fn deliver(&self, id: u64, payload: Vec<u8>) {
        let Some(transfer) = self.lock().get(&id).cloned() else {
            return;
        };
        let mut state = transfer.lock();
        if payload.is_empty() {
            state.ended = true;
        } else {
            state.queued += payload.len() as u64;
            if state.queued > WINDOW {
                state.abandoned.get_or_insert_with(|| {
                    format!("the node sent more than the {WINDOW} bytes of credit it had")
                });
                state.blocks.clear();
            } else {
                state.blocks.push_back(payload);
            }
        }
        drop(state);
        transfer.changed.notify_all();
    }

    /// `fs.stream_ack`: a download may send `bytes` more. Unknown targets are ignored (the
    /// download may have just ended).
    pub fn ack(&self, target: u64, bytes: u64) {
        if let Some(transfer) = self.lock().get(&target).cloned() {
            let mut state = transfer.lock();
            state.credit = state.credit.saturating_add(bytes).min(WINDOW);
            drop(state);
            transfer.changed.notify_all();
        }
    }

    /// `cancel` of a transfer: whether one had that id.
    pub fn cancel(&self, target: u64) -> bool {
        let found = self.lock().get(&target).cloned();
        if let Some(transfer) = &found {
            transfer.abandon("the node cancelled the transfer".to_owned());
        }
        found.is_some()
    }

    /// The channel `channel` ended: every transfer that came on it stops.
    pub fn channel_closed(&self, channel: &Arc<Output>) {
        let ended: Vec<Arc<Transfer>> = self
            .lock()
            .values()
            .filter(|t| Arc::ptr_eq(&t.channel, channel))
            .cloned()
            .collect();
        for transfer in ended {
            transfer.abandon("the channel of the transfer closed".to_owned());
        }
    }
}

/// A transfer in the table for as long as its handler runs.
struct Registered<'a> {
    transfers: &'a Transfers,
    id: u64,
    transfer: Arc<Transfer>,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.transfers.lock().remove(&self.id);
    }
}

/// `fs.write_stream`: resolves like `fs.write`, grants credit, writes the blocks to a temporary
/// file and renames it over the name after the end block.
pub fn write(
    ctx: &Context,
    id: u64,
    params: WriteStreamParams,
    channel: &Arc<Output>,
) -> OpResult<WriteResult> {
    let target = ctx.roots.resolve(&params.path, Access::Write)?;
    if target.is_root() {
        return Err(OpError::new(
            ErrorKind::IsADirectory,
            format!("'{}' is an allowed root directory", target.display),
        ));
    }
    check_metadata(&params.metadata)?;
    let (parent_rel, name) = paths::split_parent(&target.rel);
    let parent = if params.create_dirs {
        create_dir::create_all(&target, parent_rel)?.0
    } else {
        target.parent()?.0
    };
    let existing = check_replaceable(parent.as_fd(), name, &target.display)?;
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
