//! The long-lived request stream to one sandbox's executor: the hot path of every tool call.
//!
//! Two transports carry the same lines. The **socket** (`connect`): a Unix socket the executor
//! listens on in a directory the node shares with the sandbox (`channel.rs`), so a call passes
//! no Docker process. The **attach stream** (`attach`): the container's stdin and stdout,
//! attached once when the sandbox is created (or adopted), relayed by dockerd and the shim; it
//! carries the ready line, and every call when the socket is off or unreachable. Requests are JSON lines carrying ids; many may be in
//! flight at once and the executor answers in any order. Two tasks own the two halves:
//!
//! - the **writer** takes encoded lines from a channel and writes them to stdin, batching what
//!   is queued before each flush, so callers never contend on the socket;
//! - the **reader** splits stdout into lines, decodes each [`Response`] and hands it to the
//!   waiting caller through a one-shot channel found by id; stderr lines (executor diagnostics)
//!   go to `tracing`, and the last few KiB are kept to explain a failed start.
//!
//! Live processes and directory watches also send **events**, unsolicited lines tagged with the
//! id of the request that started them (`{"event":7,...}`). Whoever starts one registers a
//! [`Feed`] under the request's id before the request is written (its first events may come
//! before its answer); the reader appends each event to its feed, which never blocks the reader
//! (feeds are bounded rings, `feed.rs`), and forgets the feed after its last event.
//!
//! When the stream ends (container exited, killed, removed) or breaks, every pending call fails
//! at once with the reason, every feed ends with it, later calls fail immediately, and the owner
//! is told once. A tool call therefore costs one line each way on an open connection: no
//! `docker exec`, no container API request.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::query_parameters::AttachContainerOptionsBuilder;
use bollard::Docker;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use sandbox_executor::protocol::{
    parse_block_header, CancelParams, Event, EventBody, LiveListResult, Op, Outcome, Ready,
    Request, Response, BLOCK_HEADER, BLOCK_MARK, EVENT_PREFIX, MAX_BLOCK, PROTOCOL_VERSION,
    UNATTRIBUTED_ID,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

use crate::error::{DispatchError, Result};
use crate::feed::{Feed, Item, MakeFeed};
use crate::spec::SandboxId;

mod transfer;
pub use transfer::UploadPiece;

/// How much of the executor's stderr is kept for error messages.
const STDERR_TAIL_BYTES: usize = 4096;
/// Lines queued for the writer before senders wait.
const WRITE_QUEUE: usize = 1024;
/// Requests the executor runs at once; more are answered `busy`, so callers queue here instead
/// (`ping` and `cancel` are answered inline by the executor and bypass the queue).
pub(crate) const MAX_IN_FLIGHT: usize = 64;

/// Called once when the stream ends without having been closed on purpose.
pub(crate) type OnBreak = Box<dyn FnOnce(String) + Send + 'static>;

/// What a waiting caller receives: the response, or why the stream ended.
type Reply = std::result::Result<Response, String>;

struct State {
    pending: HashMap<u64, oneshot::Sender<Reply>>,
    /// Set once the stream is unusable; the reason every later call reports.
    closed: Option<String>,
    /// Waiting for the ready line (only on a fresh start).
    ready: Option<oneshot::Sender<std::result::Result<Ready, String>>>,
    on_break: Option<OnBreak>,
    stderr_tail: VecDeque<u8>,
    /// Closed with the stream, so callers queued for a slot fail at once.
    slots: Option<Arc<Semaphore>>,
    /// Live processes and watches, by the id of the request that started them.
    feeds: HashMap<u64, Arc<Feed>>,
    /// `proc.live` requests whose answer gives every listed process a feed, made by the reader
    /// as it routes the answer (so no later event of theirs can pass it).
    follow_answers: HashMap<u64, MakeFeed>,
    /// File transfers in progress (`transfer.rs`): their blocks and credit, by request id.
    transfers: HashMap<u64, mpsc::UnboundedSender<transfer::Moved>>,
}

struct Shared {
    sandbox: SandboxId,
    state: Mutex<State>,
}

/// Request `id` as the line the executor reads (JSON and a newline).
fn request_line(sandbox: SandboxId, id: u64, op: Op) -> Result<Vec<u8>> {
    let op_name = op.name();
    let mut line =
        serde_json::to_vec(&Request { id, op }).map_err(|e| DispatchError::Protocol {
            id: sandbox,
            detail: format!("cannot encode {op_name} request: {e}"),
        })?;
    line.push(b'\n');
    Ok(line)
}

impl Shared {
    fn new(sandbox: SandboxId, on_break: OnBreak) -> (Arc<Self>, ReadyWaiter) {
        let (ready_tx, ready_rx) = oneshot::channel();
        let shared = Arc::new(Shared {
            sandbox,
            state: Mutex::new(State {
                pending: HashMap::new(),
                closed: None,
                ready: Some(ready_tx),
                on_break: Some(on_break),
                stderr_tail: VecDeque::with_capacity(STDERR_TAIL_BYTES),
                slots: None,
                feeds: HashMap::new(),
                follow_answers: HashMap::new(),
                transfers: HashMap::new(),
            }),
        });
        (shared, ready_rx)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves plain maps behind; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `answer` as the waiter of request `id`, refused once the stream has closed;
    /// the state, still locked, for what else the request records (its feed, its transfer).
    fn register(&self, id: u64, answer: oneshot::Sender<Reply>) -> Result<MutexGuard<'_, State>> {
        let mut state = self.lock();
        if let Some(reason) = &state.closed {
            return Err(DispatchError::SandboxGone {
                id: self.sandbox,
                reason: reason.clone(),
            });
        }
        state.pending.insert(id, answer);
        Ok(state)
    }

    /// Marks the stream closed and fails everyone waiting. `expected` suppresses `on_break`.
    fn close(&self, reason: String, expected: bool) {
        let (pending, ready, on_break, tail, feeds) = {
            let mut state = self.lock();
            if state.closed.is_some() {
                return;
            }
            state.closed = Some(reason.clone());
            let on_break = if expected {
                state.on_break.take();
                None
            } else {
                state.on_break.take()
            };
            let tail = String::from_utf8_lossy(state.stderr_tail.make_contiguous()).into_owned();
            if let Some(slots) = &state.slots {
                slots.close();
            }
            // Their receivers see the end and fail with the reason of the pending answer.
            state.transfers.clear();
            (
                std::mem::take(&mut state.pending),
                state.ready.take(),
                on_break,
                tail,
                std::mem::take(&mut state.feeds),
            )
        };
        for feed in feeds.into_values() {
            feed.end_with(&reason);
        }
        if !pending.is_empty() {
            tracing::warn!(sandbox = %self.sandbox, pending = pending.len(), %reason, "executor stream closed with calls in flight");
        }
        for (_, waiter) in pending {
            let _ = waiter.send(Err(reason.clone()));
        }
        if let Some(ready) = ready {
            let detail = if tail.trim().is_empty() {
                reason.clone()
            } else {
                format!("{reason}; executor stderr: {}", tail.trim())
            };
            let _ = ready.send(Err(detail));
        }
        if let Some(on_break) = on_break {
            on_break(reason);
        }
    }

    fn closed_reason(&self) -> Option<String> {
        self.lock().closed.clone()
    }
}

/// How calls reach a sandbox's executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The executor's Unix socket in the sandbox's channel directory: no Docker relay.
    Socket,
    /// The container's stdin and stdout, relayed by dockerd and containerd-shim.
    Attach,
}

/// A multiplexed request stream to one executor.
pub(crate) struct ExecutorStream {
    shared: Arc<Shared>,
    transport: Transport,
    next_id: AtomicU64,
    writer: mpsc::Sender<Bytes>,
    /// One permit per request the executor may run at once.
    slots: Arc<Semaphore>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// Resolves with the executor's ready line (fresh starts only).
pub(crate) type ReadyWaiter = oneshot::Receiver<std::result::Result<Ready, String>>;

impl ExecutorStream {
    /// Attaches to the container's stdin, stdout and stderr and starts the two tasks.
    ///
    /// `first_id` is where request ids start: 1 for a new sandbox; a random high base after
    /// adoption, so answers to requests the previous instance sent cannot be taken for ours.
    pub(crate) async fn attach(
        docker: &Docker,
        container: &str,
        sandbox: SandboxId,
        first_id: u64,
        max_line: usize,
        on_break: OnBreak,
    ) -> Result<(Self, ReadyWaiter)> {
        let options = AttachContainerOptionsBuilder::new()
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .stream(true)
            // Never replay: old output would be taken for answers (and the log driver is off).
            .logs(false)
            .build();
        let attached = docker
            .attach_container(container, Some(options))
            .await
            .map_err(|source| DispatchError::Attach {
                id: sandbox,
                source,
            })?;
        let (shared, ready) = Shared::new(sandbox, on_break);
        let reader = tokio::spawn(read_attached(shared.clone(), attached.output, max_line));
        Ok((
            Self::start(shared, Transport::Attach, first_id, attached.input, reader),
            ready,
        ))
    }

    /// Connects to the executor's socket at `path` (the direct channel: no Docker relay in the
    /// path of a call). Its ready line came on the attach stream, or the caller pings.
    pub(crate) async fn connect(
        path: &Path,
        sandbox: SandboxId,
        first_id: u64,
        max_line: usize,
        on_break: OnBreak,
    ) -> std::io::Result<Self> {
        let socket = tokio::net::UnixStream::connect(path).await?;
        let (read, write) = socket.into_split();
        let (shared, _ready) = Shared::new(sandbox, on_break);
        shared.lock().ready = None;
        let reader = tokio::spawn(read_socket(shared.clone(), read, max_line));
        Ok(Self::start(
            shared,
            Transport::Socket,
            first_id,
            Box::pin(write),
            reader,
        ))
    }

    fn start(
        shared: Arc<Shared>,
        transport: Transport,
        first_id: u64,
        input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
        reader: JoinHandle<()>,
    ) -> Self {
        let (writer_tx, writer_rx) = mpsc::channel(WRITE_QUEUE);
        let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        shared.lock().slots = Some(slots.clone());
        let writer = tokio::spawn(write_loop(shared.clone(), input, writer_rx));
        ExecutorStream {
            shared,
            transport,
            next_id: AtomicU64::new(first_id.max(1)),
            writer: writer_tx,
            slots,
            tasks: Mutex::new(vec![reader, writer]),
        }
    }

    /// Sends one request and waits for its response until `deadline`.
    pub(crate) async fn call(&self, op: Op, deadline: Duration) -> Result<Response> {
        self.call_feeding(op, deadline, None).await
    }

    /// [`ExecutorStream::call`] for a request that starts a live process or a watch: `feed`
    /// receives its events from before the request is written, and is dropped again unless the
    /// answer is a success.
    pub(crate) async fn call_feeding(
        &self,
        op: Op,
        deadline: Duration,
        feed: Option<Arc<Feed>>,
    ) -> Result<Response> {
        self.call_feeding_with_id(op, deadline, feed).await.1
    }

    /// [`ExecutorStream::call_feeding`], also returning the request's id (which its events
    /// carry).
    pub(crate) async fn call_feeding_with_id(
        &self,
        op: Op,
        deadline: Duration,
        feed: Option<Arc<Feed>>,
    ) -> (u64, Result<Response>) {
        let fed = feed.is_some();
        let (id, result) = self.call_inner(op, deadline, feed).await;
        if fed
            && !result
                .as_ref()
                .is_ok_and(|r| matches!(r.outcome, Outcome::Ok(_)))
        {
            self.shared.lock().feeds.remove(&id);
        }
        (id, result)
    }

    /// Follows the live processes the executor runs already (started through another stream:
    /// an adopted sandbox's): each gets a feed from `make`, receiving its events from the
    /// answer on (earlier output is not replayed). Returns how many are followed.
    pub(crate) async fn follow_live_processes(
        &self,
        deadline: Duration,
        make: MakeFeed,
    ) -> Result<usize> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.shared.lock().follow_answers.insert(id, make);
        let result = self.call_with_id(id, Op::ProcLive, deadline, None).await;
        self.shared.lock().follow_answers.remove(&id);
        match result?.into_result() {
            Ok(value) => Ok(serde_json::from_value::<LiveListResult>(value)
                .map(|listed| listed.processes.len())
                .unwrap_or_default()),
            Err(body) => Err(DispatchError::Protocol {
                id: self.shared.sandbox,
                detail: format!("proc.live refused: {}: {}", body.kind, body.message),
            }),
        }
    }

    /// The live feeds matching `select`, a process's pid and tag (or a watch's).
    pub(crate) fn find_feed(&self, select: impl Fn(&Feed) -> bool) -> Option<Arc<Feed>> {
        self.shared
            .lock()
            .feeds
            .values()
            .find(|feed| select(feed))
            .cloned()
    }

    /// Sends a request nobody waits for (its answer is dropped): a watch removed because its
    /// handle was dropped.
    pub(crate) fn send_detached(&self, op: Op) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut line) = serde_json::to_vec(&Request { id, op }) {
            line.push(b'\n');
            let _ = self.writer.try_send(Bytes::from(line));
        }
    }

    async fn call_inner(
        &self,
        op: Op,
        deadline: Duration,
        feed: Option<Arc<Feed>>,
    ) -> (u64, Result<Response>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        (id, self.call_with_id(id, op, deadline, feed).await)
    }

    async fn call_with_id(
        &self,
        id: u64,
        op: Op,
        deadline: Duration,
        feed: Option<Arc<Feed>>,
    ) -> Result<Response> {
        let sandbox = self.shared.sandbox;
        let op_name = op.name();
        let is_run = matches!(op, Op::CmdRun(_));
        let started = tokio::time::Instant::now();
        let timeout = || DispatchError::Timeout {
            id: sandbox,
            op: op_name,
            after: deadline,
        };
        let _slot = if matches!(op, Op::Ping | Op::Cancel(_)) {
            None
        } else {
            match tokio::time::timeout(deadline, self.slots.clone().acquire_owned()).await {
                Ok(Ok(permit)) => Some(permit),
                Ok(Err(_)) => {
                    return Err(DispatchError::SandboxGone {
                        id: sandbox,
                        reason: self
                            .shared
                            .closed_reason()
                            .unwrap_or_else(|| "the executor stream is closed".to_owned()),
                    })
                }
                Err(_) => return Err(timeout()),
            }
        };
        let deadline_left = deadline.saturating_sub(started.elapsed());
        let line = request_line(sandbox, id, op)?;

        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.shared.register(id, tx)?;
            if let Some(feed) = feed {
                state.feeds.insert(id, feed);
            }
        }
        // Removes the pending entry however this future ends (answer, timeout, caller gone).
        let guard = PendingGuard {
            shared: &self.shared,
            id,
        };
        let gone = |shared: &Shared| DispatchError::SandboxGone {
            id: sandbox,
            reason: shared
                .closed_reason()
                .unwrap_or_else(|| "the executor stream is closed".to_owned()),
        };
        if self.writer.send(Bytes::from(line)).await.is_err() {
            return Err(gone(&self.shared));
        }
        // From here the command may be running: if this future is dropped before its answer
        // (the caller's client disconnected, its execution was cancelled), cancel it.
        let mut cancel_on_drop = CancelOnDrop {
            stream: self,
            target: id,
            armed: is_run,
        };
        let answer = tokio::time::timeout(deadline_left, rx).await;
        cancel_on_drop.armed = false;
        match answer {
            Ok(Ok(Ok(response))) => Ok(response),
            Ok(Ok(Err(reason))) => Err(DispatchError::SandboxGone {
                id: sandbox,
                reason,
            }),
            Ok(Err(_)) => Err(gone(&self.shared)),
            Err(_) => {
                drop(guard);
                if is_run {
                    // Best effort: stop the command instead of letting it run to its own limit.
                    self.send_cancel(id);
                }
                Err(timeout())
            }
        }
    }

    /// Fire-and-forget `cancel` of a `cmd.run` whose caller stopped waiting (timed out or
    /// dropped the call).
    fn send_cancel(&self, target: u64) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = Request {
            id,
            op: Op::Cancel(CancelParams { target }),
        };
        if let Ok(mut line) = serde_json::to_vec(&request) {
            line.push(b'\n');
            let _ = self.writer.try_send(Bytes::from(line));
        }
    }

    /// How this stream reaches the executor.
    pub(crate) fn transport(&self) -> Transport {
        self.transport
    }

    /// Why the stream is closed, if it is.
    pub(crate) fn closed_reason(&self) -> Option<String> {
        self.shared.closed_reason()
    }

    /// Closes the stream on purpose: pending calls fail with `reason`, the tasks stop, and the
    /// break callback is not called. Our side of the connection is dropped; the container's
    /// stdin stays open (StdinOnce=false), so the caller removes the container itself.
    pub(crate) fn close(&self, reason: &str) {
        self.shared.close(reason.to_owned(), true);
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            task.abort();
        }
    }
}

impl Drop for ExecutorStream {
    fn drop(&mut self) {
        for task in self
            .tasks
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
    }
}

/// Sends `cancel` for a `cmd.run` whose caller dropped the call before its answer came.
struct CancelOnDrop<'a> {
    stream: &'a ExecutorStream,
    target: u64,
    armed: bool,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            tracing::debug!(sandbox = %self.stream.shared.sandbox, request = self.target, "call dropped by its caller; cancelling the command");
            self.stream.send_cancel(self.target);
        }
    }
}

struct PendingGuard<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared.lock().pending.remove(&self.id);
    }
}

/// Writes queued lines to the executor's stdin, flushing once per batch.
async fn write_loop(
    shared: Arc<Shared>,
    mut input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    mut queue: mpsc::Receiver<Bytes>,
) {
    while let Some(first) = queue.recv().await {
        let mut result = input.write_all(&first).await;
        while result.is_ok() {
            match queue.try_recv() {
                Ok(next) => result = input.write_all(&next).await,
                Err(_) => break,
            }
        }
        if result.is_ok() {
            result = input.flush().await;
        }
        if let Err(e) = result {
            shared.close(format!("writing to the executor failed: {e}"), false);
            return;
        }
    }
}

/// Splits the executor's output into lines and routes each.
struct Lines {
    buffer: BytesMut,
    /// Bytes of `buffer` already searched for a newline.
    scanned: usize,
    max_line: usize,
}

impl Lines {
    fn new(max_line: usize) -> Self {
        Lines {
            buffer: BytesMut::with_capacity(64 * 1024),
            scanned: 0,
            max_line,
        }
    }

    /// Routes the complete lines and blocks in the buffer; `Err` when a line outgrew the
    /// bound or a block is malformed.
    fn route_complete(&mut self, shared: &Shared) -> std::result::Result<(), String> {
        loop {
            // A block (`protocol::transfer`) starts where a line would: at the buffer's start.
            if self.scanned == 0 && self.buffer.first() == Some(&BLOCK_MARK) {
                if self.buffer.len() < BLOCK_HEADER {
                    return Ok(());
                }
                let Some((id, len)) = parse_block_header(&self.buffer[..BLOCK_HEADER]) else {
                    return Err("the executor sent a malformed block header".to_owned());
                };
                if len > MAX_BLOCK {
                    return Err(format!(
                        "the executor sent a block of {len} bytes, over the {MAX_BLOCK}-byte bound"
                    ));
                }
                if self.buffer.len() < BLOCK_HEADER + len {
                    self.buffer.reserve(BLOCK_HEADER + len - self.buffer.len());
                    return Ok(());
                }
                let mut block = self.buffer.split_to(BLOCK_HEADER + len);
                let payload = block.split_off(BLOCK_HEADER).freeze();
                transfer::route_block(shared, id, payload);
                continue;
            }
            let Some(pos) = memchr::memchr(b'\n', &self.buffer[self.scanned..]) else {
                break;
            };
            let line = self.buffer.split_to(self.scanned + pos + 1);
            self.scanned = 0;
            route(shared, &line[..line.len() - 1]);
        }
        self.scanned = self.buffer.len();
        if self.buffer.len() > self.max_line {
            return Err(format!(
                "the executor sent a line longer than {} bytes; stream abandoned",
                self.max_line
            ));
        }
        Ok(())
    }
}

/// Reads the attach stream: stdout lines are routed, stderr lines logged; ends the stream
/// when the output ends.
async fn read_attached(
    shared: Arc<Shared>,
    mut output: std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
    >,
    max_line: usize,
) {
    let mut lines = Lines::new(max_line);
    let mut stderr_line = BytesMut::new();
    let reason = loop {
        match output.next().await {
            None => {
                break "the executor's output ended (the container exited or was removed)"
                    .to_owned()
            }
            Some(Err(e)) => break format!("the attach connection broke: {e}"),
            Some(Ok(LogOutput::StdOut { message })) | Some(Ok(LogOutput::Console { message })) => {
                lines.buffer.extend_from_slice(&message);
                if let Err(reason) = lines.route_complete(&shared) {
                    shared.close(reason, false);
                    return;
                }
            }
            Some(Ok(LogOutput::StdErr { message })) => {
                stderr_line.extend_from_slice(&message);
                while let Some(pos) = stderr_line.iter().position(|b| *b == b'\n') {
                    let line = stderr_line.split_to(pos + 1);
                    log_stderr(&shared, &line);
                }
                if stderr_line.len() > STDERR_TAIL_BYTES {
                    let line = stderr_line.split();
                    log_stderr(&shared, &line);
                }
            }
            Some(Ok(LogOutput::StdIn { .. })) => {}
        }
    };
    if !stderr_line.is_empty() {
        log_stderr(&shared, &stderr_line);
    }
    shared.close(reason, false);
}

/// Reads the socket straight into the line buffer (no frame headers, no copy); ends the
/// stream when the connection ends.
async fn read_socket(shared: Arc<Shared>, mut socket: OwnedReadHalf, max_line: usize) {
    let mut lines = Lines::new(max_line);
    let reason = loop {
        if lines.buffer.capacity() - lines.buffer.len() < 16 * 1024 {
            lines.buffer.reserve(64 * 1024);
        }
        match socket.read_buf(&mut lines.buffer).await {
            Ok(0) => {
                break "the executor's output ended (its socket closed: the container exited or \
                       was removed)"
                    .to_owned()
            }
            Ok(_) => {
                if let Err(reason) = lines.route_complete(&shared) {
                    break reason;
                }
            }
            Err(e) => break format!("reading the executor's socket failed: {e}"),
        }
    };
    shared.close(reason, false);
}

/// Records one executor stderr line in the log and in the tail kept for error messages.
fn log_stderr(shared: &Shared, line: &[u8]) {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end();
    tracing::debug!(sandbox = %shared.sandbox, line = %text, "executor stderr");
    let mut state = shared.lock();
    let tail = &mut state.stderr_tail;
    tail.extend(line);
    while tail.len() > STDERR_TAIL_BYTES {
        tail.pop_front();
    }
}

/// Hands one decoded response line to whoever waits for it, or an event to its feed.
fn route(shared: &Shared, line: &[u8]) {
    if line.starts_with(EVENT_PREFIX) {
        return route_event(shared, line);
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    let Some(response) = parsed::<Response>(
        shared,
        line,
        "executor wrote a line that is not a response; ignored",
    ) else {
        return;
    };
    if response.id == UNATTRIBUTED_ID {
        let ready = shared.lock().ready.take();
        match (ready, response.outcome) {
            (Some(waiter), Outcome::Ok(value)) => {
                let result = serde_json::from_value::<Ready>(value)
                    .map_err(|e| format!("the ready line is malformed: {e}"))
                    .and_then(|ready| {
                        if ready.protocol == PROTOCOL_VERSION {
                            Ok(ready)
                        } else {
                            Err(format!(
                                "the executor speaks protocol {} but the dispatcher speaks {}",
                                ready.protocol, PROTOCOL_VERSION
                            ))
                        }
                    });
                let _ = waiter.send(result);
            }
            (Some(waiter), Outcome::Error(body)) => {
                let _ = waiter.send(Err(format!(
                    "the executor refused to start: {}: {}",
                    body.kind, body.message
                )));
            }
            (None, Outcome::Error(body)) => {
                tracing::warn!(sandbox = %shared.sandbox, kind = %body.kind, message = %body.message, "executor reported an error it could not attribute to a request");
            }
            (None, Outcome::Ok(_)) => {
                tracing::debug!(sandbox = %shared.sandbox, "unexpected second ready line ignored");
            }
        }
        return;
    }
    let waiter = {
        let mut state = shared.lock();
        if let Some(make) = state.follow_answers.remove(&response.id) {
            if let Outcome::Ok(value) = &response.outcome {
                if let Ok(listed) = serde_json::from_value::<LiveListResult>(value.clone()) {
                    for process in &listed.processes {
                        state
                            .feeds
                            .entry(process.events)
                            .or_insert_with(|| make(process));
                    }
                }
            }
        }
        state.pending.remove(&response.id)
    };
    match waiter {
        Some(waiter) => {
            let _ = waiter.send(Ok(response));
        }
        None => {
            // A caller that gave up, or a request of the instance we adopted this sandbox from.
            tracing::debug!(sandbox = %shared.sandbox, id = response.id, "response nobody waits for; dropped");
        }
    }
}

/// An executor's line read as `T`; `None` when it is not one, after a warning (`ignored`) with
/// its first 200 bytes: a line the dispatcher cannot read is dropped, never fatal.
fn parsed<T: serde::de::DeserializeOwned>(
    shared: &Shared,
    line: &[u8],
    ignored: &str,
) -> Option<T> {
    match serde_json::from_slice(line) {
        Ok(value) => Some(value),
        Err(e) => {
            let shown = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
            tracing::warn!(sandbox = %shared.sandbox, error = %e, line = %shown, "{ignored}");
            None
        }
    }
}

/// Appends one event to its feed; the feed is forgotten after its last event.
fn route_event(shared: &Shared, line: &[u8]) {
    let ignored = "executor wrote an event line that does not parse; ignored";
    let Some(event) = parsed::<Event>(shared, line, ignored) else {
        return;
    };
    let id = event.event;
    if let EventBody::Credit { bytes } = event.body {
        return transfer::route_credit(shared, id, bytes);
    }
    let item = match Item::from_wire(event.body) {
        Ok(item) => item,
        Err(why) => {
            tracing::warn!(sandbox = %shared.sandbox, event = id, %why, "executor event refused");
            return;
        }
    };
    let last = item.is_last();
    let feed = {
        let mut state = shared.lock();
        if last {
            state.feeds.remove(&id)
        } else {
            state.feeds.get(&id).cloned()
        }
    };
    match feed {
        Some(feed) => feed.push(item),
        // A process or watch of the instance this sandbox was adopted from.
        None => {
            tracing::debug!(sandbox = %shared.sandbox, event = id, "event nobody follows; dropped")
        }
    }
}
