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
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use sandbox_executor::protocol::{
    Empty, Enforcement, FsEvent, InputParams, InputResult, LiveListResult, LiveProcess, Op,
    OutputStream, ProcTarget, ProcessEnd, ProcessSignal, PtySize, ResizeParams, Response,
    SignalParams, StartParams, StartResult, UnwatchParams, WatchParams, WatchResult,
    WatchSyncParams, WatchSyncResult,
};
use serde::de::DeserializeOwned;

use crate::dispatcher::{run_detached, Dispatcher, Location, Sandbox};
use crate::error::{DispatchError, Result};
use crate::feed::{Feed, Item, Read, Reader, MAX_PROCESS_EVENTS};
use crate::forward::{Forwarder, Opened, Subscribed, Subscription};
use crate::relay::Upstream;
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
    sandbox: SandboxId,
    pid: u32,
    tag: Option<String>,
    landlock: Option<Enforcement>,
    reader: Reader,
    /// Set when the sandbox is held elsewhere: what keeps its events coming (`relay.rs`).
    _upstream: Option<Arc<Upstream>>,
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
    /// Set when the sandbox is held elsewhere: dropping it closes the watch on the holder.
    _upstream: Option<Arc<Upstream>>,
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
        let id = sandbox.id;
        let response = sandbox
            .stream
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

/// A new handle on a live process this instance follows, by pid or tag (see
/// [`Dispatcher::attach_process`]).
fn attach_here(id: SandboxId, sandbox: &Sandbox, select: ProcessSelector) -> Result<ProcessHandle> {
    let feed = sandbox
        .stream
        .find_feed(|feed| match (feed.process(), &select) {
            (Some((pid, _)), ProcessSelector::Pid(wanted)) => pid == *wanted,
            (Some((_, Some(tag))), ProcessSelector::Tag(wanted)) => tag == wanted,
            _ => false,
        })
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
        _upstream: None,
    })
}

/// The holder answered a process subscription with a watch, or the other way round.
fn unexpected(id: SandboxId, holder: uuid::Uuid, op: &'static str) -> DispatchError {
    DispatchError::Forward {
        id,
        holder,
        detail: format!("it answered {op} with another kind of stream"),
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
        match self.inner.locate(id).await? {
            Location::Here(sandbox) => self.start_here(id, sandbox, params).await,
            Location::Elsewhere(holder) => {
                self.relay_process(holder, id, Subscription::Start(params))
                    .await
            }
        }
    }

    /// A new handle on a live process, by pid or tag; it reads from the oldest output still
    /// buffered. A process of a sandbox held elsewhere that this instance follows already
    /// shares that feed; otherwise the holder is asked.
    pub async fn attach_process(
        &self,
        id: SandboxId,
        select: ProcessSelector,
    ) -> Result<ProcessHandle> {
        match self.inner.locate(id).await? {
            Location::Here(sandbox) => attach_here(id, &sandbox, select),
            Location::Elsewhere(holder) => {
                if let Some(upstream) = self.inner.relays.find(id, &select) {
                    let feed = upstream.feed();
                    let (pid, tag) = feed.process.get().cloned().unwrap_or_default();
                    return Ok(ProcessHandle {
                        sandbox: id,
                        pid,
                        tag,
                        landlock: None,
                        reader: feed.reader(),
                        _upstream: Some(Arc::clone(&upstream)),
                    });
                }
                self.relay_process(holder, id, Subscription::Attach(select))
                    .await
            }
        }
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
        match self.inner.locate(id).await? {
            Location::Here(sandbox) => self.watch_here(id, sandbox, path, recursive).await,
            Location::Elsewhere(holder) => {
                let subscription = Subscription::Watch {
                    path: path.to_owned(),
                    recursive,
                };
                let (opened, upstream) = self.relay(holder, id, subscription).await?;
                let Opened::Watch { path } = opened else {
                    return Err(unexpected(id, holder, "fs.watch"));
                };
                let reader = upstream.feed().reader_from_start();
                Ok(WatchHandle {
                    id: 0,
                    path,
                    sandbox: Weak::new(),
                    reader,
                    _upstream: Some(upstream),
                })
            }
        }
    }

    /// Serves a peer's [`Subscription`]: only in a sandbox this instance holds, never forwarded
    /// again (as [`Dispatcher::call_held`]). The handle's events are the peer's to relay.
    pub async fn subscribe_held(
        &self,
        id: SandboxId,
        subscription: Subscription,
    ) -> Result<Subscribed> {
        let sandbox = self.inner.attached(id).await?;
        Ok(match subscription {
            Subscription::Start(params) => {
                Subscribed::Process(self.start_here(id, sandbox, params).await?)
            }
            Subscription::Attach(select) => Subscribed::Process(attach_here(id, &sandbox, select)?),
            Subscription::Watch { path, recursive } => {
                Subscribed::Watch(self.watch_here(id, sandbox, &path, recursive).await?)
            }
        })
    }

    async fn start_here(
        &self,
        id: SandboxId,
        sandbox: Arc<Sandbox>,
        params: StartParams,
    ) -> Result<ProcessHandle> {
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
            _upstream: None,
        })
    }

    async fn watch_here(
        &self,
        id: SandboxId,
        sandbox: Arc<Sandbox>,
        path: &str,
        recursive: bool,
    ) -> Result<WatchHandle> {
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
            _upstream: None,
        })
    }

    /// A process of a sandbox `holder` holds, started or attached to there, followed here.
    async fn relay_process(
        &self,
        holder: uuid::Uuid,
        id: SandboxId,
        subscription: Subscription,
    ) -> Result<ProcessHandle> {
        let op = subscription.op();
        let (opened, upstream) = self.relay(holder, id, subscription).await?;
        let Opened::Process { pid, tag, landlock } = opened else {
            return Err(unexpected(id, holder, op));
        };
        let _ = upstream.feed().process.set((pid, tag.clone()));
        self.inner.relays.keep(id, pid, tag.clone(), &upstream);
        Ok(ProcessHandle {
            sandbox: id,
            pid,
            tag,
            landlock,
            reader: upstream.feed().reader_from_start(),
            _upstream: Some(upstream),
        })
    }

    /// Opens `subscription` on `holder` and follows its events into a feed of this instance.
    async fn relay(
        &self,
        holder: uuid::Uuid,
        id: SandboxId,
        subscription: Subscription,
    ) -> Result<(Opened, Arc<Upstream>)> {
        let forwarder: &Arc<dyn Forwarder> =
            self.inner
                .config
                .forwarder
                .as_ref()
                .ok_or(DispatchError::SandboxNotFound {
                    id,
                    attached_elsewhere: true,
                })?;
        let feed = match &subscription {
            Subscription::Watch { .. } => {
                Feed::new(usize::MAX, self.inner.config.watch_buffer_events, true)
            }
            _ => Feed::new(
                self.inner.config.live_buffer_bytes,
                MAX_PROCESS_EVENTS,
                false,
            ),
        };
        let (opened, events) = forwarder
            .subscribe(holder, id, subscription, self.inner.config.call_timeout)
            .await?;
        Ok((opened, Upstream::start(feed, events)))
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
