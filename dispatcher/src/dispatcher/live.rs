//! The dispatcher's side of live processes and watches (`crate::live` holds their events and
//! handles): starting, attaching, watching and the calls by pid, here or relayed from the
//! replica holding the sandbox.

use std::sync::{Arc, Weak};
use std::time::Duration;

use base64::Engine;
use futures_util::future::BoxFuture;
use sandbox_executor::protocol::{
    Empty, InputParams, InputResult, LiveListResult, LiveProcess, Op, ProcTarget, ProcessSignal,
    PtySize, ResizeParams, Response, SignalParams, StartParams, StartResult, WatchParams,
    WatchResult,
};
use serde::de::DeserializeOwned;

use super::{run_detached, Dispatcher, Location, Sandbox};
use crate::error::{DispatchError, Result};
use crate::feed::{Feed, MAX_PROCESS_EVENTS};
use crate::forward::{Forwarder, Opened, Subscribed, Subscription};
use crate::live::{answer, ProcessHandle, ProcessSelector, WatchHandle, WatchedSandbox};
use crate::relay::Upstream;
use crate::spec::SandboxId;

impl WatchedSandbox for Sandbox {
    fn sandbox_id(&self) -> SandboxId {
        self.id
    }

    fn call(&self, op: Op, deadline: Duration) -> BoxFuture<'_, Result<Response>> {
        Box::pin(self.stream.call(op, deadline))
    }

    fn send_detached(&self, op: Op) {
        self.stream.send_detached(op);
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
                        _upstream: Some(
                            Arc::clone(&upstream) as Arc<dyn std::any::Any + Send + Sync>
                        ),
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
                    sandbox: Weak::<Sandbox>::new(),
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
        // A start is a call like any other: counted in flight, so a graceful stop lets it
        // answer before it lets go of the stream, and refused once the stop began.
        let _serving = self.inner.serving.enter()?;
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
            sandbox: Arc::downgrade(&sandbox) as Weak<dyn WatchedSandbox>,
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
