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
//! Every process and watch has one [`Feed`], filled by the stream's reader task (`stream.rs`):
//! a ring of its events bounded in bytes (`live_buffer_bytes`) and count, shared by its handles.
//! The reader never waits for a handle; a handle that falls behind the ring is told how many
//! events and bytes it missed ([`ProcessEvent::Dropped`]), never silently. The last event (end
//! of the process or of the watch) is never dropped: the ring always keeps its newest event.
//!
//! The executor keeps the kernel-held part (sub-reaper, Landlock, process group, limits on
//! processes and watches per sandbox) and this module only follows. When a sandbox is adopted,
//! the live processes the previous instance started get feeds too ([`adopted_feeds`]), from the
//! adoption on (their earlier output is not replayed); its watches are not followed, and run
//! until the sandbox ends.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use sandbox_executor::protocol::{
    Empty, Enforcement, EventBody, FsEvent, InputParams, InputResult, LiveListResult, LiveProcess,
    Op, OutputStream, ProcTarget, ProcessEnd, ProcessSignal, PtySize, ResizeParams, Response,
    SignalParams, StartParams, StartResult, Truncation, UnwatchParams, WatchParams, WatchResult,
};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::dispatcher::{run_detached, Dispatcher, Sandbox};
use crate::error::{DispatchError, Result};
use crate::spec::SandboxId;
use crate::stream::MakeFeed;

/// Most events a process's feed keeps (besides its byte bound).
const MAX_PROCESS_EVENTS: usize = 16 * 1024;

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

/// One event as a feed keeps it (decoded from the wire by the stream's reader).
#[derive(Debug, Clone)]
pub(crate) enum Item {
    Data(OutputStream, Bytes),
    End(ProcessEnd),
    Fs(FsEvent),
    WatchEnd(String),
}

impl Item {
    /// The wire event as an item; `data` is base64.
    pub(crate) fn from_wire(body: EventBody) -> std::result::Result<Item, String> {
        Ok(match body {
            EventBody::Data { stream, data } => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .map_err(|e| format!("data is not base64: {e}"))?;
                Item::Data(stream, Bytes::from(bytes))
            }
            EventBody::End(end) => Item::End(end),
            EventBody::Fs(event) => Item::Fs(event),
            EventBody::WatchEnd { reason } => Item::WatchEnd(reason),
        })
    }

    /// The last event of its feed.
    pub(crate) fn is_last(&self) -> bool {
        matches!(self, Item::End(_) | Item::WatchEnd(_))
    }

    fn bytes(&self) -> u64 {
        match self {
            Item::Data(_, bytes) => bytes.len() as u64,
            _ => 0,
        }
    }
}

struct Entry {
    seq: u64,
    /// Output bytes of every earlier event.
    bytes_before: u64,
    item: Item,
}

#[derive(Default)]
struct Ring {
    entries: VecDeque<Entry>,
    next_seq: u64,
    /// Output bytes of every event pushed.
    bytes_total: u64,
    /// Output bytes of the entries kept.
    bytes_kept: u64,
    ended: bool,
}

/// The events of one process or watch, bounded, shared by its handles (see the module doc).
pub(crate) struct Feed {
    ring: Mutex<Ring>,
    changed: watch::Sender<u64>,
    max_bytes: u64,
    max_events: usize,
    /// Set when it is a process: its pid and tag, once started.
    process: OnceLock<(u32, Option<String>)>,
    watch: bool,
}

impl Feed {
    fn new(max_bytes: usize, max_events: usize, watch: bool) -> Arc<Feed> {
        Arc::new(Feed {
            ring: Mutex::new(Ring::default()),
            changed: watch::Sender::new(0),
            max_bytes: max_bytes as u64,
            max_events: max_events.max(1),
            process: OnceLock::new(),
            watch,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends an event, dropping the oldest ones over the bounds (never the newest).
    pub(crate) fn push(&self, item: Item) {
        let mut ring = self.lock();
        if ring.ended {
            return;
        }
        let bytes = item.bytes();
        ring.ended = item.is_last();
        let entry = Entry {
            seq: ring.next_seq,
            bytes_before: ring.bytes_total,
            item,
        };
        ring.entries.push_back(entry);
        ring.next_seq += 1;
        ring.bytes_total += bytes;
        ring.bytes_kept += bytes;
        while ring.entries.len() > 1
            && (ring.bytes_kept > self.max_bytes || ring.entries.len() > self.max_events)
        {
            if let Some(old) = ring.entries.pop_front() {
                ring.bytes_kept -= old.item.bytes();
            }
        }
        let seq = ring.next_seq;
        drop(ring);
        self.changed.send_replace(seq);
    }

    /// Ends the feed because its events can no longer come (the stream closed).
    pub(crate) fn end_with(&self, reason: &str) {
        let item = if self.watch {
            Item::WatchEnd(format!("the sandbox is gone: {reason}"))
        } else {
            Item::End(ProcessEnd {
                exit_code: None,
                signal: None,
                stdout_bytes: 0,
                stderr_bytes: 0,
                truncated: Truncation::default(),
                timed_out: false,
                error: Some(format!("the sandbox is gone: {reason}")),
            })
        };
        self.push(item);
    }

    /// The feed of a process whose pid and tag are known.
    fn of_process(max_bytes: usize, pid: u32, tag: Option<String>) -> Arc<Feed> {
        let feed = Feed::new(max_bytes, MAX_PROCESS_EVENTS, false);
        let _ = feed.process.set((pid, tag));
        feed
    }

    /// Whether this is the live process `select` names.
    pub(crate) fn is_process(&self, select: &ProcessSelector) -> bool {
        match (self.process.get(), select) {
            (Some((pid, _)), ProcessSelector::Pid(wanted)) => pid == wanted,
            (Some((_, Some(tag))), ProcessSelector::Tag(wanted)) => tag == wanted,
            _ => false,
        }
    }

    /// A reader from the very first event: the handle of the start, which is told of anything
    /// dropped before it was made (the output may outrun the start's answer).
    fn reader_from_start(self: &Arc<Self>) -> Reader {
        Reader {
            feed: Arc::clone(self),
            next_seq: 0,
            bytes_read: 0,
            changed: self.changed.subscribe(),
        }
    }

    /// A reader from the oldest event kept (an attached handle).
    fn reader(self: &Arc<Self>) -> Reader {
        let ring = self.lock();
        let (next_seq, bytes_read) = match ring.entries.front() {
            Some(front) => (front.seq, front.bytes_before),
            None => (ring.next_seq, ring.bytes_total),
        };
        drop(ring);
        Reader {
            feed: Arc::clone(self),
            next_seq,
            bytes_read,
            changed: self.changed.subscribe(),
        }
    }
}

/// How an adopted sandbox's live processes get their feeds (`stream.rs`,
/// `follow_live_processes`).
pub(crate) fn adopted_feeds(max_bytes: usize) -> MakeFeed {
    Box::new(move |process: &LiveProcess| {
        Feed::of_process(max_bytes, process.pid, process.tag.clone())
    })
}

/// What a reader gets next.
enum Read {
    Item(Item),
    Dropped { events: u64, bytes: u64 },
}

/// One handle's position in a feed.
struct Reader {
    feed: Arc<Feed>,
    next_seq: u64,
    bytes_read: u64,
    changed: watch::Receiver<u64>,
}

/// What a reader finds without waiting.
enum Poll {
    Ready(Read),
    Ended,
    Empty,
}

impl Reader {
    /// The next event if one is there.
    fn poll(&mut self) -> Poll {
        let ring = self.feed.lock();
        let (front_seq, front_bytes) = match ring.entries.front() {
            Some(front) => (front.seq, front.bytes_before),
            None => (ring.next_seq, ring.bytes_total),
        };
        if self.next_seq < front_seq {
            let missed = Read::Dropped {
                events: front_seq - self.next_seq,
                bytes: front_bytes.saturating_sub(self.bytes_read),
            };
            self.next_seq = front_seq;
            self.bytes_read = front_bytes;
            return Poll::Ready(missed);
        }
        let index = usize::try_from(self.next_seq - front_seq).unwrap_or(usize::MAX);
        if let Some(entry) = ring.entries.get(index) {
            self.next_seq += 1;
            self.bytes_read = entry.bytes_before + entry.item.bytes();
            return Poll::Ready(Read::Item(entry.item.clone()));
        }
        if ring.ended {
            Poll::Ended
        } else {
            Poll::Empty
        }
    }

    /// The next event; `None` after the last one.
    async fn next(&mut self) -> Option<Read> {
        loop {
            self.changed.borrow_and_update();
            match self.poll() {
                Poll::Ready(read) => return Some(read),
                Poll::Ended => return None,
                Poll::Empty => {}
            }
            if self.changed.changed().await.is_err() {
                return None;
            }
        }
    }

    /// Waits for the feed's last event, skipping everything before it; `None` if the feed is
    /// gone without one.
    async fn last(&mut self) -> Option<Item> {
        loop {
            self.changed.borrow_and_update();
            {
                let ring = self.feed.lock();
                if ring.ended {
                    let last = ring.entries.back()?;
                    self.next_seq = last.seq + 1;
                    self.bytes_read = ring.bytes_total;
                    return Some(last.item.clone());
                }
            }
            if self.changed.changed().await.is_err() {
                return None;
            }
        }
    }

    /// The next event if one is there, without waiting; `None` if none is (yet).
    fn try_next(&mut self) -> Option<Read> {
        match self.poll() {
            Poll::Ready(read) => Some(read),
            Poll::Ended | Poll::Empty => None,
        }
    }
}

/// A live process's events, from one handle. Dropping it leaves the process running.
pub struct ProcessHandle {
    sandbox: SandboxId,
    pid: u32,
    tag: Option<String>,
    landlock: Option<Enforcement>,
    reader: Reader,
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
            Read::Dropped { events, bytes } => ProcessEvent::Dropped { events, bytes },
            Read::Item(Item::Data(OutputStream::Stdout, bytes)) => ProcessEvent::Stdout(bytes),
            Read::Item(Item::Data(OutputStream::Stderr, bytes)) => ProcessEvent::Stderr(bytes),
            Read::Item(Item::Data(OutputStream::Pty, bytes)) => ProcessEvent::Pty(bytes),
            Read::Item(Item::End(end)) => ProcessEvent::End(end),
            // A process's feed holds no watch events.
            Read::Item(Item::Fs(_) | Item::WatchEnd(_)) => return None,
        })
    }
}

/// A directory watch's events. Dropping it removes the watch.
pub struct WatchHandle {
    id: u64,
    path: String,
    sandbox: Weak<Sandbox>,
    reader: Reader,
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

    fn event(read: Read) -> Option<WatchEvent> {
        Some(match read {
            Read::Dropped { events, .. } => WatchEvent::Dropped { events },
            Read::Item(Item::Fs(event)) => WatchEvent::Fs(event),
            Read::Item(Item::WatchEnd(reason)) => WatchEvent::End { reason },
            // A watch's feed holds no process events.
            Read::Item(Item::Data(..) | Item::End(_)) => return None,
        })
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        if let Some(sandbox) = self.sandbox.upgrade() {
            sandbox
                .stream
                .send_detached(Op::FsUnwatch(UnwatchParams { target: self.id }));
        }
    }
}

/// The executor's answer as `T`, or its refusal as [`DispatchError::Refused`].
fn answer<T: DeserializeOwned>(id: SandboxId, op: &'static str, response: Response) -> Result<T> {
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

impl Dispatcher {
    /// Starts a live process in a sandbox and returns once it runs (see the module doc).
    ///
    /// Refusals of the executor (program not found or not allowed by the kernel, the sandbox's
    /// process limit, a tag in use, a `cwd` outside the read roots) are
    /// [`DispatchError::Refused`] with the executor's kind and message.
    pub async fn start_process(&self, id: SandboxId, params: StartParams) -> Result<ProcessHandle> {
        let sandbox = self.inner.attached(id).await?;
        let feed = Feed::new(
            self.inner.config.live_buffer_bytes,
            MAX_PROCESS_EVENTS,
            false,
        );
        let deadline = self.inner.config.call_timeout;
        let task_feed = Arc::clone(&feed);
        // Detached: once sent, the process runs; a caller giving up must not lose its feed.
        let response = run_detached(async move {
            sandbox
                .stream
                .call_feeding(Op::ProcStart(params), deadline, Some(task_feed))
                .await
        })
        .await?;
        let started: StartResult = answer(id, "proc.start", response)?;
        let _ = feed.process.set((started.pid, started.tag.clone()));
        Ok(ProcessHandle {
            sandbox: id,
            pid: started.pid,
            tag: started.tag,
            landlock: Some(started.landlock),
            reader: feed.reader_from_start(),
        })
    }

    /// A new handle on a live process started through this instance, by pid or tag; it reads
    /// from the oldest output still buffered.
    pub async fn attach_process(
        &self,
        id: SandboxId,
        select: ProcessSelector,
    ) -> Result<ProcessHandle> {
        let sandbox = self.inner.attached(id).await?;
        let feed = sandbox
            .stream
            .find_feed(|feed| feed.is_process(&select))
            .ok_or_else(|| DispatchError::Refused {
                id,
                op: "attach",
                kind: sandbox_executor::protocol::ErrorKind::NotFound,
                message: match &select {
                    ProcessSelector::Pid(pid) => format!("no live process has pid {pid}"),
                    ProcessSelector::Tag(tag) => format!("no live process has tag '{tag}'"),
                },
            })?;
        let (pid, tag) = feed.process.get().cloned().unwrap_or_default();
        Ok(ProcessHandle {
            sandbox: id,
            pid,
            tag,
            landlock: None,
            reader: feed.reader(),
        })
    }

    /// Writes bytes to a live process's stdin (or terminal); all of them, or an error saying
    /// how many went in. Sequential calls arrive in order.
    pub async fn send_input(&self, id: SandboxId, pid: u32, data: &[u8]) -> Result<u64> {
        let op = Op::ProcInput(InputParams {
            pid,
            data: base64::engine::general_purpose::STANDARD.encode(data),
        });
        let result: InputResult = self.live_call(id, "proc.input", op).await?;
        Ok(result.written)
    }

    /// Closes a live process's stdin pipe: it reads end-of-file after what was sent.
    pub async fn close_stdin(&self, id: SandboxId, pid: u32) -> Result<()> {
        let _: Empty = self
            .live_call(
                id,
                "proc.close_stdin",
                Op::ProcCloseStdin(ProcTarget { pid }),
            )
            .await?;
        Ok(())
    }

    /// Sends SIGTERM to a live process's group, or SIGKILL to its whole tree.
    pub async fn signal_process(
        &self,
        id: SandboxId,
        pid: u32,
        signal: ProcessSignal,
    ) -> Result<()> {
        let op = Op::ProcSignal(SignalParams { pid, signal });
        let _: Empty = self.live_call(id, "proc.signal", op).await?;
        Ok(())
    }

    /// Resizes a live process's terminal.
    pub async fn resize_pty(&self, id: SandboxId, pid: u32, size: PtySize) -> Result<()> {
        let op = Op::ProcResize(ResizeParams { pid, size });
        let _: Empty = self.live_call(id, "proc.resize", op).await?;
        Ok(())
    }

    /// The sandbox's live processes, as its executor knows them.
    pub async fn list_processes(&self, id: SandboxId) -> Result<Vec<LiveProcess>> {
        let listed: LiveListResult = self.live_call(id, "proc.live", Op::ProcLive).await?;
        Ok(listed.processes)
    }

    /// Watches a directory beneath the sandbox's read roots (and, with `recursive`, its
    /// subdirectories); dropping the handle removes the watch.
    pub async fn watch_dir(
        &self,
        id: SandboxId,
        path: &str,
        recursive: bool,
    ) -> Result<WatchHandle> {
        let sandbox = self.inner.attached(id).await?;
        let feed = Feed::new(usize::MAX, self.inner.config.watch_buffer_events, true);
        let deadline = self.inner.config.call_timeout;
        let (task_sandbox, task_feed) = (Arc::clone(&sandbox), Arc::clone(&feed));
        let params = WatchParams {
            path: path.to_owned(),
            recursive,
        };
        let (watch_id, response) = run_detached(async move {
            let (watch_id, response) = task_sandbox
                .stream
                .call_feeding_with_id(Op::FsWatch(params), deadline, Some(task_feed))
                .await;
            Ok((watch_id, response?))
        })
        .await?;
        let watched: WatchResult = answer(id, "fs.watch", response)?;
        Ok(WatchHandle {
            id: watch_id,
            path: watched.path,
            sandbox: Arc::downgrade(&sandbox),
            reader: feed.reader_from_start(),
        })
    }

    async fn live_call<T: DeserializeOwned>(
        &self,
        id: SandboxId,
        name: &'static str,
        op: Op,
    ) -> Result<T> {
        let response = self
            .call_with_deadline(
                id,
                op,
                self.inner.config.call_timeout + Duration::from_secs(5),
            )
            .await?;
        answer(id, name, response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Item {
        Item::Data(OutputStream::Stdout, Bytes::from(vec![b'x'; n]))
    }

    fn end() -> Item {
        Item::End(ProcessEnd {
            exit_code: Some(0),
            signal: None,
            stdout_bytes: 0,
            stderr_bytes: 0,
            truncated: Truncation::default(),
            timed_out: false,
            error: None,
        })
    }

    async fn read(reader: &mut Reader) -> Option<Read> {
        tokio::time::timeout(Duration::from_secs(5), reader.next())
            .await
            .expect("a read that has something to return does not wait")
    }

    #[tokio::test]
    async fn a_reader_behind_the_bound_is_told_what_it_missed_and_the_end_is_kept() {
        let feed = Feed::new(100, 1000, false);
        let mut early = feed.reader();
        for _ in 0..5 {
            feed.push(data(40));
        }
        feed.push(end());
        // 200 bytes went by, at most 100 are kept: the first three chunks are gone.
        match read(&mut early).await {
            Some(Read::Dropped { events, bytes }) => assert_eq!((events, bytes), (3, 120)),
            _ => panic!("expected a drop report first"),
        }
        for _ in 0..2 {
            assert!(
                matches!(read(&mut early).await, Some(Read::Item(Item::Data(_, b))) if b.len() == 40)
            );
        }
        assert!(matches!(
            read(&mut early).await,
            Some(Read::Item(Item::End(_)))
        ));
        assert!(read(&mut early).await.is_none());
        // A reader made now starts at the oldest kept event, missing nothing it could have had.
        let mut late = feed.reader();
        assert!(matches!(
            read(&mut late).await,
            Some(Read::Item(Item::Data(..)))
        ));
        // Nothing after the end, not even a second end.
        feed.end_with("gone");
        assert!(matches!(
            read(&mut late).await,
            Some(Read::Item(Item::Data(..)))
        ));
        assert!(
            matches!(read(&mut late).await, Some(Read::Item(Item::End(e))) if e.error.is_none())
        );
        assert!(read(&mut late).await.is_none());
    }

    #[tokio::test]
    async fn the_newest_event_is_kept_whatever_its_size_and_counts_bound_watches() {
        let feed = Feed::new(10, 1000, false);
        feed.push(data(50));
        let mut reader = feed.reader();
        assert!(
            matches!(read(&mut reader).await, Some(Read::Item(Item::Data(_, b))) if b.len() == 50)
        );
        let watch = Feed::new(usize::MAX, 2, true);
        let mut reader = watch.reader();
        for i in 0..4 {
            watch.push(Item::Fs(FsEvent {
                op: sandbox_executor::protocol::FsOp::Create,
                path: format!("/workspace/{i}"),
                is_dir: false,
            }));
        }
        watch.end_with("the stream broke");
        match read(&mut reader).await {
            Some(Read::Dropped { events, bytes }) => assert_eq!((events, bytes), (3, 0)),
            _ => panic!("expected a drop report"),
        }
        assert!(
            matches!(read(&mut reader).await, Some(Read::Item(Item::Fs(e))) if e.path == "/workspace/3")
        );
        assert!(
            matches!(read(&mut reader).await, Some(Read::Item(Item::WatchEnd(r))) if r.contains("stream broke"))
        );
        assert!(read(&mut reader).await.is_none());
    }

    #[tokio::test]
    async fn wait_end_skips_to_the_end() {
        let feed = Feed::new(1000, 1000, false);
        let mut reader = feed.reader();
        let pushing = Arc::clone(&feed);
        let waiter = tokio::spawn(async move {
            let last = reader.last().await;
            (last, reader.try_next().is_none())
        });
        for _ in 0..10 {
            pushing.push(data(10));
        }
        pushing.push(end());
        let (last, then_nothing) = waiter.await.expect("the waiting task");
        assert!(matches!(last, Some(Item::End(e)) if e.exit_code == Some(0)));
        assert!(then_nothing, "nothing is read after the end");
    }

    #[tokio::test]
    async fn the_starting_handle_is_told_of_what_went_before_it_existed() {
        let feed = Feed::new(100, 1000, false);
        for _ in 0..5 {
            feed.push(data(40));
        }
        let mut first = feed.reader_from_start();
        match read(&mut first).await {
            Some(Read::Dropped { events, bytes }) => assert_eq!((events, bytes), (3, 120)),
            _ => panic!("expected a drop report first"),
        }
        // An attached handle starts at what is kept, with nothing to report.
        let mut attached = feed.reader();
        assert!(matches!(
            read(&mut attached).await,
            Some(Read::Item(Item::Data(..)))
        ));
    }

    #[test]
    fn try_next_returns_at_once() {
        let feed = Feed::new(1000, 1000, false);
        let mut reader = feed.reader();
        assert!(reader.try_next().is_none(), "nothing yet");
        feed.push(data(3));
        assert!(matches!(reader.try_next(), Some(Read::Item(Item::Data(_, b))) if b.len() == 3));
        assert!(reader.try_next().is_none());
        feed.push(end());
        assert!(matches!(reader.try_next(), Some(Read::Item(Item::End(_)))));
        assert!(reader.try_next().is_none(), "nothing after the end");
    }

    #[tokio::test]
    async fn a_waiting_reader_wakes_for_the_next_event() {
        let feed = Feed::new(1000, 1000, false);
        let mut reader = feed.reader();
        let pushing = Arc::clone(&feed);
        let waiter = tokio::spawn(async move { read(&mut reader).await.is_some() });
        tokio::task::yield_now().await;
        pushing.push(data(1));
        assert!(waiter.await.expect("the reader task"));
    }
}
