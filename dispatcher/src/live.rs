//! Live processes and directory watches: the public API over the executor's `proc.*` and
//! `fs.watch` operations and the events they stream.
//!
//! A process started with [`Dispatcher::start_process`] runs in the background, confined like
//! `cmd.run`, until it ends, is signalled, times out, or its sandbox goes; the call returns once
//! the executor has started it, with a [`ProcessHandle`] whose [`ProcessHandle::next`] yields its
//! output as it comes and, last, how it ended. Dropping the handle leaves the process running;
//! [`Dispatcher::attach_process`] gives a new handle by pid or tag (it starts with the output
//! still buffered). Input, stdin's end, signals and terminal size go by pid. The start's answer
//! (pid, tag, `landlock`) and [`ProcessHandle::wait_end`] (a handle that skips to the end, so it
//! never falls behind) are what an audit row of the start and of the end needs.
//!
//! Every process and watch has one feed (`feed.rs`), filled by the stream's reader task
//! (`stream.rs`): a ring of its events bounded in bytes (`live_buffer_bytes`) and count, shared
//! by its handles. The reader never waits for a handle; a handle that falls behind the ring is
//! told how many events and bytes it missed ([`ProcessEvent::Dropped`]), never silently. The
//! last event (end of the process or of the watch) is never dropped.
//!
//! The executor keeps the kernel-held part (sub-reaper, Landlock, process group, limits on
//! processes and watches per sandbox) and this module only follows. When a sandbox is adopted,
//! the live processes the previous instance started get feeds too (`feed::adopted_feeds`), from the
//! adoption on (their earlier output is not replayed); its watches are not followed, and run
//! until the sandbox ends.
//!
//! A sandbox another live instance holds is served the same way through it: a start, an attach
//! or a watch is a [`Subscription`] the [`Forwarder`](crate::Forwarder) opens on the holder,
//! whose events fill a feed of this instance (`relay.rs`); the handle reads it as it would a
//! local one, and its end says so at once if the holder stops. Input, stdin's end, signals,
//! terminal size and listings are calls, forwarded as calls.

use std::sync::{Arc, Weak};

use futures_util::future::BoxFuture;
use std::time::Duration;

use bytes::Bytes;
use sandbox_executor::protocol::{
    Enforcement, FsEvent, Op, OutputStream, ProcessEnd, Response, UnwatchParams, WatchSyncParams,
    WatchSyncResult,
};
use serde::de::DeserializeOwned;

use crate::error::{DispatchError, Result};
use crate::feed::{Item, Read, Reader};
use crate::spec::SandboxId;

/// What happened to a live process, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    /// Bytes it wrote to stdout.
    Stdout(Bytes),
    /// Bytes it wrote to stderr.
    Stderr(Bytes),
    /// Bytes it wrote to its terminal.
    Pty(Bytes),
    /// This handle fell behind the buffer: so many events (and output bytes) were dropped
    /// before the next one.
    Dropped {
        /// Events missed.
        events: u64,
        /// Output bytes among them.
        bytes: u64,
    },
    /// It ended (the last event). With `error` set, its end was not observed (the sandbox went
    /// away, the executor stream broke).
    End(ProcessEnd),
}

/// What happened beneath a watched directory, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// One change.
    Fs(FsEvent),
    /// This handle fell behind the buffer: so many events were dropped before the next one.
    Dropped {
        /// Events missed.
        events: u64,
    },
    /// The watch stopped (the last event), and why.
    End {
        /// Why.
        reason: String,
    },
}

/// Which live process to attach to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessSelector {
    /// Its pid in the sandbox.
    Pid(u32),
    /// The tag it was started with.
    Tag(String),
}

/// A live process's events, from one handle. Dropping it leaves the process running.
pub struct ProcessHandle {
    pub(crate) sandbox: SandboxId,
    pub(crate) pid: u32,
    pub(crate) tag: Option<String>,
    pub(crate) landlock: Option<Enforcement>,
    pub(crate) reader: Reader,
    /// Set when the sandbox is held elsewhere: what keeps its events coming (`relay.rs`).
    pub(crate) _upstream: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for ProcessHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessHandle")
            .field("sandbox", &self.sandbox)
            .field("pid", &self.pid)
            .field("tag", &self.tag)
            .finish_non_exhaustive()
    }
}

impl ProcessHandle {
    /// Its pid in the sandbox.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its tag.
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// What the kernel enforced of its policy (known to the handle that started it).
    pub fn landlock(&self) -> Option<Enforcement> {
        self.landlock
    }

    /// The next event; `None` once [`ProcessEvent::End`] was returned.
    pub async fn next(&mut self) -> Option<ProcessEvent> {
        Self::event(self.reader.next().await?)
    }

    /// Waits for the process's end, skipping the output still to be read (what an audit of its
    /// end needs: a handle that never falls behind, however much the process writes). `None`
    /// only after the end was already read.
    pub async fn wait_end(&mut self) -> Option<ProcessEnd> {
        match self.reader.last().await? {
            Item::End(end) => Some(end),
            _ => None,
        }
    }

    /// The next event if one has come, without waiting.
    pub fn try_next(&mut self) -> Option<ProcessEvent> {
        Self::event(self.reader.try_next()?)
    }

    fn event(read: Read) -> Option<ProcessEvent> {
        Some(match read {
            Read::Dropped { events, bytes } | Read::Item(Item::Gap { events, bytes }) => {
                ProcessEvent::Dropped { events, bytes }
            }
            Read::Item(Item::Data(OutputStream::Stdout, bytes)) => ProcessEvent::Stdout(bytes),
            Read::Item(Item::Data(OutputStream::Stderr, bytes)) => ProcessEvent::Stderr(bytes),
            Read::Item(Item::Data(OutputStream::Pty, bytes)) => ProcessEvent::Pty(bytes),
            Read::Item(Item::End(end)) => ProcessEvent::End(end),
            // A process's feed holds no watch events.
            Read::Item(Item::Fs(_) | Item::WatchEnd(_) | Item::PortData(_) | Item::PortEnd(_)) => {
                return None
            }
        })
    }
}

/// A directory watch's events. Dropping it removes the watch.
pub struct WatchHandle {
    pub(crate) id: u64,
    pub(crate) path: String,
    pub(crate) sandbox: Weak<dyn WatchedSandbox>,
    pub(crate) reader: Reader,
    /// Set when the sandbox is held elsewhere: dropping it closes the watch on the holder.
    pub(crate) _upstream: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for WatchHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchHandle")
            .field("id", &self.id)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl WatchHandle {
    /// The watched directory, absolute.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The next event; `None` once [`WatchEvent::End`] was returned.
    pub async fn next(&mut self) -> Option<WatchEvent> {
        Self::event(self.reader.next().await?)
    }

    /// The next event if one has come, without waiting (a polling watcher drains with this).
    pub fn try_next(&mut self) -> Option<WatchEvent> {
        Self::event(self.reader.try_next()?)
    }

    /// Returns once every change made before this call is among the handle's events (the
    /// executor's `fs.watch_sync`: its watch reads the kernel's queue and sends what it holds
    /// before answering, on the stream whose reader fills this handle's feed first). A
    /// polling watcher syncs before draining, so a change whose own call has returned is never
    /// left for a later poll. `Ok(false)` when the watch has ended, or when it is relayed from
    /// the replica holding the sandbox (its events come as the relay brings them; no sync).
    pub async fn sync(&self, deadline: Duration) -> Result<bool> {
        let Some(sandbox) = self.sandbox.upgrade() else {
            return Ok(false);
        };
        let id = sandbox.sandbox_id();
        let response = sandbox
            .call(
                Op::FsWatchSync(WatchSyncParams { target: self.id }),
                deadline,
            )
            .await?;
        let synced: WatchSyncResult = answer(id, "fs.watch_sync", response)?;
        Ok(synced.synced)
    }

    fn event(read: Read) -> Option<WatchEvent> {
        Some(match read {
            Read::Dropped { events, .. } | Read::Item(Item::Gap { events, .. }) => {
                WatchEvent::Dropped { events }
            }
            Read::Item(Item::Fs(event)) => WatchEvent::Fs(event),
            Read::Item(Item::WatchEnd(reason)) => WatchEvent::End { reason },
            // A watch's feed holds no process events.
            Read::Item(Item::Data(..) | Item::End(_) | Item::PortData(_) | Item::PortEnd(_)) => {
                return None
            }
        })
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        if let Some(sandbox) = self.sandbox.upgrade() {
            sandbox.send_detached(Op::FsUnwatch(UnwatchParams { target: self.id }));
        }
    }
}

/// The executor's answer as `T`, or its refusal as [`DispatchError::Refused`].
pub(crate) fn answer<T: DeserializeOwned>(
    id: SandboxId,
    op: &'static str,
    response: Response,
) -> Result<T> {
    match response.into_result() {
        Ok(value) => serde_json::from_value(value).map_err(|e| DispatchError::Protocol {
            id,
            detail: format!("the answer to {op} has an unexpected shape: {e}"),
        }),
        Err(body) => Err(DispatchError::Refused {
            id,
            op,
            kind: body.kind,
            message: body.message,
        }),
    }
}

/// What a local watch needs of its sandbox: its executor stream, for the watch's sync and its
/// removal when the handle drops. Implemented by the dispatcher's sandbox, so that this module
/// (below the dispatcher, the forwarder and the relay) names none of them.
pub(crate) trait WatchedSandbox: Send + Sync {
    /// The sandbox's id.
    fn sandbox_id(&self) -> SandboxId;
    /// A request to its executor, answered.
    fn call(&self, op: Op, deadline: Duration) -> BoxFuture<'_, Result<Response>>;
    /// A request to its executor whose answer nobody waits for.
    fn send_detached(&self, op: Op);
}
