//! The executor's life: start-up, the request stream, dispatch, shutdown.
//!
//! Start-up reads the configuration, opens the roots, drops privileges (`identity.rs`) and forks
//! the fork server (`spawn/forkserver.rs`) while the process is still single-threaded, starts the
//! reaper, binds the node's socket when configured (`channel.rs`; its connections are served
//! like stdin on threads of their own), and writes the ready line. Then the main
//! thread reads request frames from stdin. `ping` and `cancel` are answered inline (so a
//! cancellation always gets through, however busy the executor is); every other request runs on
//! a worker thread of its own (reused, `workers.rs`), at most [`MAX_IN_FLIGHT`] at once. Responses are written whole, one line each,
//! under a mutex, so lines never interleave; they may leave in any order.
//!
//! Shutdown is designed once: when stdin reaches EOF (the dispatcher closed the stream), every
//! running command's process group is killed (live processes' too), requests still in flight and
//! live processes get up to [`SHUTDOWN_GRACE`] in all to write their answers and `end` events
//! (killed commands answer with signal 9), and the process exits 0. As PID 1, its exit takes
//! down whatever else is left in the container.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::context::Context;
use crate::error::OpError;
use crate::frame::{read_frame, Frame};
use crate::output::{Events, Output};
use crate::protocol::{
    CancelResult, CreateDirResult, DeleteResult, EditResult, Empty, EnvGetResult, ErrorKind,
    GlobResult, GrepResult, InputResult, ListResult, LiveListResult, LogsReadResult, Op,
    PortOpenResult, ProcListResult, ReadResult, ReadStreamResult, Ready, Request, Response, RunAs,
    RunResult, StartResult, UnwatchResult, WatchResult, WatchSyncResult, WriteResult,
    PROTOCOL_VERSION, UNATTRIBUTED_ID,
};
use crate::roots::{open_beneath, Roots};
use crate::running::{Processes, Watches};
use crate::spawn::children::Children;
use crate::transfers::Transfers;
use crate::{cmd, fs, identity, live, port, proc, spawn, transfer};

/// Most requests handled at once (threads count against the container's pids limit).
pub const MAX_IN_FLIGHT: usize = 64;
/// How long, after stdin closed and commands were killed, requests in flight may still answer.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Any operation's result, serialized as the bare result object.
#[derive(Serialize)]
#[serde(untagged)]
enum Reply {
    Ready(Ready),
    Empty(Empty),
    Read(ReadResult),
    Write(WriteResult),
    List(ListResult),
    CreateDir(CreateDirResult),
    Delete(DeleteResult),
    Edit(EditResult),
    Grep(GrepResult),
    Glob(GlobResult),
    Run(RunResult),
    Cancel(CancelResult),
    ProcList(ProcListResult),
    LogsRead(LogsReadResult),
    EnvGet(EnvGetResult),
    Start(StartResult),
    Input(InputResult),
    Live(LiveListResult),
    Watch(WatchResult),
    Unwatch(UnwatchResult),
    WatchSync(WatchSyncResult),
    PortOpen(PortOpenResult),
    ReadStream(ReadStreamResult),
}

/// Runs the executor; returns the process exit code.
pub fn main() -> i32 {
    let output = Arc::new(Output::default());
    let fatal = |message: String| {
        crate::log_event!("fatal: {message}");
        output.error(UNATTRIBUTED_ID, OpError::invalid(message));
        2
    };
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(e) => return fatal(e.to_string()),
    };
    let mut roots = Roots::open(&config);
    // While the filesystem identity is still root's: the socket must be root's, not the user's.
    let listener = config.channel_dir.as_deref().and_then(|dir| {
        crate::channel::bind(dir)
            .inspect_err(|e| crate::log_event!("no socket channel, stdin only: {e}"))
            .ok()
    });
    if let Err(e) = identity::drop_privileges(&config, &roots) {
        return fatal(format!("cannot drop privileges: {e}"));
    }
    roots.create_missing_in_workspace();
    if let Some(Ok(fd)) = roots.root_at(roots.workspace()).map(|r| r.fd()) {
        if let Err(errno) = open_beneath(fd, "", OFlags::PATH | OFlags::DIRECTORY, Mode::empty()) {
            return fatal(format!(
                "resolving beneath the workspace is unusable here ({:?}: {errno}); refusing to run",
                crate::roots::path_rules()
            ));
        }
    }
    if crate::roots::path_rules() == crate::protocol::PathRules::Walk {
        crate::log_event!(
            "the kernel has no openat2: paths resolve by the executor's walk beneath each root"
        );
    }
    // Before the reaper or any request thread exists: the fork server must be single-threaded.
    let fork_server = if !config.fork_server {
        crate::log_event!("no fork server (fork_server: false): sub-reapers are forked directly");
        spawn::forkserver::ForkServer::disabled()
    } else {
        spawn::forkserver::ForkServer::start().unwrap_or_else(|e| {
            crate::log_event!(
                "cannot start the fork server ({e}); sub-reapers are forked directly"
            );
            spawn::forkserver::ForkServer::disabled()
        })
    };
    let children = match Children::start() {
        Ok(children) => children,
        Err(e) => return fatal(format!("cannot start the reaper: {e}")),
    };
    let landlock_abi = spawn::confine::kernel_abi();
    if landlock_abi == 0 && config.require_landlock {
        crate::log_event!(
            "the kernel has no Landlock: every cmd.run will be refused (require_landlock)"
        );
    }
    let context = Arc::new(Context {
        config,
        roots,
        children: Arc::clone(&children),
        grants: spawn::grant::Grants::default(),
        held: spawn::confine::Held::default(),
        landlock_abi,
        fork_server,
        events: Events::new(Arc::clone(&output)),
        live: Processes::default(),
        watches: Watches::default(),
        ports: crate::running::Ports::default(),
        transfers: crate::transfers::Transfers::default(),
    });
    crate::log_event!(
        "ready: uid {} gid {}, pid {}, landlock abi {}, fork server pid {}",
        context.config.uid,
        context.config.gid,
        identity::own_pid(),
        context.landlock_abi,
        context
            .fork_server
            .pid()
            .map_or(0, rustix::process::Pid::as_raw_pid)
    );
    output.send(&Response::ok(
        UNATTRIBUTED_ID,
        Reply::Ready(Ready {
            ready: true,
            version: env!("CARGO_PKG_VERSION").to_string(),
            protocol: PROTOCOL_VERSION,
            pid: identity::own_pid(),
            landlock_abi: context.landlock_abi,
            channel: listener.is_some(),
            path_rules: crate::roots::path_rules(),
        }),
    ));

    let in_flight = Arc::new(InFlight::default());
    if let Some(listener) = listener {
        let (context, in_flight) = (Arc::clone(&context), Arc::clone(&in_flight));
        let spawned = std::thread::Builder::new()
            .name("channel".to_owned())
            .spawn(move || {
                crate::channel::accept_loop(listener, |stream| {
                    serve_connection(&context, &in_flight, stream)
                })
            });
        if let Err(e) = spawned {
            crate::log_event!("cannot start the channel thread ({e}); stdin only");
        }
    }
    serve(
        &context,
        BufReader::with_capacity(256 * 1024, io::stdin().lock()),
        &output,
        &in_flight,
    );

    children.kill_all();
    let started = Instant::now();
    let unanswered = in_flight.wait_idle(SHUTDOWN_GRACE);
    let unended = context
        .live
        .wait_ended(SHUTDOWN_GRACE.saturating_sub(started.elapsed()));
    crate::log_event!(
        "stdin closed; killed running commands; {unanswered} requests unanswered, \
         {unended} live processes without their end event; exiting"
    );
    0
}

/// Requests being handled, by id, with their op names; at most [`MAX_IN_FLIGHT`].
///
/// Lock order: this set, then the children registry. `cancel` checks here that a `cmd.run` is
/// in flight before marking it cancelled ahead of its spawn, and `finish` forgets such a mark
/// under the same lock, so a mark can never outlive its request and hit a later one.
#[derive(Default)]
struct InFlight {
    ids: Mutex<HashMap<u64, &'static str>>,
    /// Requests that left `ids` (so their id may be reused) but whose answer is still being
    /// written; shutdown waits for these too, or an answer could be lost at exit.
    replying: Mutex<usize>,
    idle: Condvar,
    /// The threads that run them (`workers.rs`).
    workers: crate::workers::Workers,
}

impl InFlight {
    fn begin(&self, id: u64, op: &'static str) -> Result<(), OpError> {
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        if ids.contains_key(&id) {
            return Err(OpError::invalid(format!(
                "request id {id} is already in flight"
            )));
        }
        if ids.len() >= MAX_IN_FLIGHT {
            return Err(OpError::new(
                ErrorKind::Busy,
                format!("{MAX_IN_FLIGHT} requests are already in flight; retry later"),
            ));
        }
        ids.insert(id, op);
        Ok(())
    }

    fn finish(&self, id: u64, context: &Context) {
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        ids.remove(&id);
        context.children.forget_request(id);
        context.transfers.forget(id);
        self.idle.notify_all();
    }

    /// Like `finish`, for a request whose answer is written next; call `replied` afterwards.
    fn finish_before_reply(&self, id: u64, context: &Context) {
        *self.replying.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.finish(id, context);
    }

    /// The answer of a `finish_before_reply` request is written.
    fn replied(&self) {
        let mut replying = self.replying.lock().unwrap_or_else(PoisonError::into_inner);
        *replying = replying.saturating_sub(1);
        drop(replying);
        let _ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        self.idle.notify_all();
    }

    fn replying(&self) -> usize {
        *self.replying.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until no request is in flight or `limit` passed; returns how many are left.
    fn wait_idle(&self, limit: Duration) -> usize {
        let deadline = Instant::now() + limit;
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        while !ids.is_empty() || self.replying() > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            ids = self
                .idle
                .wait_timeout(ids, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        ids.len() + self.replying()
    }

    /// Cancels `target`: a transfer (also one whose handler has not registered it yet) or a
    /// `cmd.run` (also one not spawned yet). Under this set's lock, so that `finish` cannot
    /// forget a mark before it is made.
    fn cancel(&self, target: u64, children: &Children, transfers: &Transfers) -> bool {
        let ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        let op = ids.get(&target).copied();
        let transfer_in_flight = matches!(op, Some("fs.write_stream" | "fs.read_stream"));
        transfers.cancel(target, transfer_in_flight)
            | children.cancel(target, op == Some("cmd.run"))
    }
}

/// Serves one connection on the socket on a thread of its own; its events follow it.
fn serve_connection(
    context: &Arc<Context>,
    in_flight: &Arc<InFlight>,
    stream: std::os::unix::net::UnixStream,
) {
    let writer = match stream.try_clone() {
        Ok(writer) => writer,
        Err(e) => {
            crate::log_event!("channel: cannot split a connection: {e}");
            return;
        }
    };
    let output = Arc::new(Output::new(Box::new(writer)));
    context.events.follow(&output);
    let (context, in_flight) = (Arc::clone(context), Arc::clone(in_flight));
    let spawned = std::thread::Builder::new()
        .name("channel-conn".to_owned())
        .spawn(move || {
            serve(
                &context,
                BufReader::with_capacity(256 * 1024, stream),
                &output,
                &in_flight,
            );
            crate::log_event!("channel: a connection ended");
        });
    if let Err(e) = spawned {
        crate::log_event!("channel: cannot serve a connection: {e}");
    }
}

/// Reads and dispatches requests until the channel (stdin or a connection) ends.
fn serve(
    context: &Arc<Context>,
    mut reader: impl BufRead,
    output: &Arc<Output>,
    in_flight: &Arc<InFlight>,
) {
    // JSON escaping can turn one content byte into six (`\u0001`).
    let max_frame = usize::try_from(context.config.max_file_bytes)
        .unwrap_or(usize::MAX / 8)
        .saturating_mul(6)
        .saturating_add(1 << 20);
    let mut line = Vec::new();
    loop {
        match read_frame(&mut reader, max_frame, &mut line) {
            Ok(Frame::Line) => handle_line(context, output, in_flight, &line),
            // Answered under the request's own id when its start names one, so its caller
            // gets the refusal rather than a timeout.
            Ok(Frame::TooLong) => output.error(
                crate::frame::request_id(&line).unwrap_or(UNATTRIBUTED_ID),
                OpError::new(
                    ErrorKind::TooLarge,
                    format!("request line longer than {max_frame} bytes was skipped"),
                ),
            ),
            Ok(Frame::Block { id }) => context.transfers.deliver(id, std::mem::take(&mut line)),
            Ok(Frame::BlockTooLong { id }) => {
                context.transfers.cancel(id, false);
                output.error(
                    id,
                    OpError::new(
                        ErrorKind::TooLarge,
                        format!(
                            "a block longer than {} bytes was skipped",
                            crate::protocol::MAX_BLOCK
                        ),
                    ),
                );
            }
            Ok(Frame::Eof) => break,
            Err(e) => {
                crate::log_event!("cannot read a request: {e}");
                break;
            }
        }
    }
    // Whatever was moving on this channel stops (a half upload is removed).
    context.transfers.channel_closed(output);
}

#[derive(Deserialize)]
struct IdOnly {
    id: u64,
}

fn handle_line(
    context: &Arc<Context>,
    output: &Arc<Output>,
    in_flight: &Arc<InFlight>,
    line: &[u8],
) {
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    let request: Request = match serde_json::from_slice(line) {
        Ok(request) => request,
        Err(e) => {
            let id = serde_json::from_slice::<IdOnly>(line).map_or(UNATTRIBUTED_ID, |r| r.id);
            output.error(id, OpError::invalid(format!("malformed request: {e}")));
            return;
        }
    };
    let id = request.id;
    if id == UNATTRIBUTED_ID {
        output.error(id, OpError::invalid("request id must be at least 1"));
        return;
    }
    // Answered inline, so that they get through however busy the executor is.
    match request.op {
        Op::Ping => return output.send(&Response::ok(id, Reply::Empty(Empty {}))),
        // An adopting dispatcher follows the live processes from here on: so do their events.
        Op::ProcLive => context.events.follow(output),
        Op::FsStreamAck(params) => {
            context.transfers.ack(params.target, params.bytes);
            return output.send(&Response::ok(id, Reply::Empty(Empty {})));
        }
        Op::Cancel(params) => {
            let cancelled = in_flight.cancel(params.target, &context.children, &context.transfers);
            return output.send(&Response::ok(id, Reply::Cancel(CancelResult { cancelled })));
        }
        _ => {}
    }
    let op = request.op;
    let name = op.name();
    if let Err(e) = in_flight.begin(id, name) {
        return output.error(id, e);
    }
    let (thread_context, thread_output, thread_in_flight) = (
        Arc::clone(context),
        Arc::clone(output),
        Arc::clone(in_flight),
    );
    let spawned = in_flight.workers.run(Box::new(move || {
        let result = catch_unwind(AssertUnwindSafe(|| {
            dispatch(&thread_context, id, op, &thread_output)
        }))
        .unwrap_or_else(|_| {
            crate::log_event!("handler for {name} id={id} panicked");
            Err(OpError::new(
                ErrorKind::Internal,
                format!("{name} failed unexpectedly"),
            ))
        });
        // Before answering, so that the caller may reuse the id as soon as it has the answer;
        // shutdown still waits for the answer to be written (`replying`).
        thread_in_flight.finish_before_reply(id, &thread_context);
        match result {
            Ok(reply) => thread_output.send(&Response::ok(id, reply)),
            Err(e) => thread_output.error(id, e),
        }
        thread_in_flight.replied();
    }));
    if let Err(e) = spawned {
        in_flight.finish(id, context);
        output.error(
            id,
            OpError::new(
                ErrorKind::Busy,
                format!("cannot start a handler thread: {e}"),
            ),
        );
    }
}

fn dispatch(
    context: &Arc<Context>,
    id: u64,
    op: Op,
    output: &Arc<Output>,
) -> Result<Reply, OpError> {
    let c = context;
    // A root request acts as root on this thread for its whole handling (a live process's
    // terminal is opened first, see `live/start.rs`), or is refused before anything happens.
    let _root = match (op.user(), &op) {
        (RunAs::User, _) => None,
        (RunAs::Root, _) if !c.config.allow_root => return Err(identity::root_refused(&c.config)),
        (RunAs::Root, Op::ProcStart(_)) => None,
        (RunAs::Root, _) => Some(identity::as_root(&c.config)?),
    };
    Ok(match op {
        Op::Ping => Reply::Empty(Empty {}),
        Op::FsRead(p) => Reply::Read(fs::read::run(c, p)?),
        Op::FsWrite(p) => Reply::Write(fs::write::run(c, p)?),
        Op::FsList(p) => Reply::List(fs::list::run(c, p)?),
        Op::FsCreateDir(p) => Reply::CreateDir(fs::create_dir::run(c, p)?),
        Op::FsDelete(p) => Reply::Delete(fs::delete::run(c, p)?),
        Op::FsEdit(p) => Reply::Edit(fs::edit::run_single(c, p)?),
        Op::FsMultiEdit(p) => Reply::Edit(fs::edit::run_multi(c, p)?),
        Op::FsGrep(p) => Reply::Grep(fs::grep::run(c, p)?),
        Op::FsGlob(p) => Reply::Glob(fs::glob::run(c, p)?),
        Op::CmdRun(p) => Reply::Run(cmd::run::run(c, id, p)?),
        Op::ProcList(p) => Reply::ProcList(proc::list::run(c, p)?),
        Op::LogsRead(p) => Reply::LogsRead(proc::logs::run(c, p)?),
        Op::EnvGet(p) => Reply::EnvGet(proc::env::run(c, p)?),
        Op::ProcStart(p) => Reply::Start(live::start::start(c, id, p)?),
        Op::ProcInput(p) => Reply::Input(live::input(c, p)?),
        Op::ProcCloseStdin(p) => Reply::Empty(live::close_stdin(c, p)?),
        Op::ProcSignal(p) => Reply::Empty(live::signal(c, p)?),
        Op::ProcResize(p) => Reply::Empty(live::resize(c, p)?),
        Op::ProcLive => Reply::Live(c.live.list()),
        Op::FsWatch(p) => Reply::Watch(fs::watch::start(c, id, p)?),
        Op::FsUnwatch(p) => Reply::Unwatch(fs::watch::stop(c, p)),
        Op::FsWatchSync(p) => Reply::WatchSync(fs::watch::sync(c, p)),
        Op::PortOpen(p) => Reply::PortOpen(port::open(c, id, p)?),
        Op::PortWrite(p) => Reply::Empty(port::write(c, p)?),
        Op::PortAck(p) => Reply::Empty(port::ack(c, p)?),
        Op::PortClose(p) => Reply::Empty(port::close(c, p)?),
        Op::FsWriteStream(p) => Reply::Write(transfer::write(c, id, p, output)?),
        Op::FsReadStream(p) => Reply::ReadStream(transfer::read(c, id, p, output)?),
        // Answered inline by `handle_line`, like `cancel`.
        Op::FsStreamAck(_) => Reply::Empty(Empty {}),
        // Answered inline by `handle_line`; never reaches a handler thread.
        Op::Cancel(_) => Reply::Cancel(CancelResult { cancelled: false }),
    })
}
