//! `cmd.run`: one program, no shell, as the sandbox user, confined by the kernel, supervised.
//!
//! Its two halves, [`launch`] (checks, confinement, sub-reaper, start) and [`supervise`] (the
//! poll loop below, handing each chunk of output to a sink), are also how a live process
//! (`live/start.rs`) starts and runs: there is one spawn path and one supervision loop.
//!
//! The executor resolves `argv[0]` and the programs the command may execute (`grant.rs`), opens
//! the working directory beneath its root, builds the command's Landlock ruleset (`confine.rs`)
//! and has the fork server (`forkserver.rs`) clone the command's **sub-reaper** (`subreaper.rs`:
//! a copy of the executor, as root, whose parent is the executor) with a [`Plan`], the ruleset
//! and the pipes; without a fork server, it forks the sub-reaper itself. The sub-reaper enters
//! the working directory, confines itself with Landlock, starts the command as the sandbox user
//! in its own process group and answers on a status pipe (`started`, or why not). Being non-root
//! after `setuid` with no-new-privileges set, the command has no capabilities at all; its
//! environment is built from scratch.
//!
//! The supervising thread then runs one `poll` loop over the stdout pipe, the stderr pipe and the
//! command's wake-up eventfd (exit or cancel), with a timeout computed from the next deadline:
//!
//! * output is read as it comes and capped while streaming (`capture.rs`);
//! * at the timeout (or on cancel) the command's group gets SIGTERM (through the sub-reaper), and
//!   `grace_ms` later the sub-reaper kills the whole tree;
//! * when the leader exits, the sub-reaper kills everything the command left (background jobs,
//!   `setsid` daemons, double forks) and exits with the leader's status; the loop then drains the
//!   pipes until EOF but at most [`DRAIN_AFTER_EXIT`].

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fd::OwnedFd;
use rustix::fs::OFlags;
use rustix::io::Errno;
use rustix::pipe::PipeFlags;
use rustix::process::Pid;

use crate::context::Context;
use crate::encoding;
use crate::error::{OpError, OpResult};
use crate::protocol::{
    Encoding, Enforcement, ErrorKind, ExecGrant, RunAs, RunParams, RunResult, Truncation,
};
use crate::roots::Access;
use crate::spawn::capture::CappedBuffer;
use crate::spawn::children::{Slot, Stop};
use crate::spawn::confine::{self, Confinement};
use crate::spawn::forkserver::SpawnError;
use crate::spawn::subreaper::{self, Handshake, Plan};

/// Most bytes kept per stream, whatever the request asks (the rest is still counted).
pub const MAX_KEPT_BYTES: u64 = 16 * 1024 * 1024;
/// Grace between SIGTERM and SIGKILL when the request gives none.
pub const DEFAULT_GRACE: Duration = Duration::from_millis(2000);
/// Longest grace accepted.
const MAX_GRACE: Duration = Duration::from_secs(60);
/// How long pipes are still read after the leader exited.
pub const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);
/// How long to wait for the leader after SIGKILL before answering without its status.
const KILL_BACKSTOP: Duration = Duration::from_secs(5);
/// How long the sub-reaper may take to confine and start the command.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
const CHUNK: usize = 64 * 1024;

/// What to start: a request's program, working directory, environment and exec grant (shared
/// by `cmd.run` and `proc.start`, so both confine and supervise alike).
pub(crate) struct Launch<'a> {
    /// Program and arguments.
    pub argv: &'a [String],
    /// Working directory as requested (default the workspace).
    pub cwd: Option<&'a str>,
    /// Requested environment, over `PATH`, `HOME`, `LANG` and `defaults`.
    pub env: &'a BTreeMap<String, String>,
    /// Variables set before the requested ones (a terminal's `TERM`).
    pub defaults: &'a [(&'a str, &'a str)],
    /// Programs it may execute.
    pub exec: &'a ExecGrant,
    /// Who it runs as (root only where the config allows it; checked by the server).
    pub user: RunAs,
}

/// Where a launched command's standard streams go.
pub(crate) struct Stdio {
    /// Write end of its stdout (a pipe, or a terminal's slave).
    pub stdout: OwnedFd,
    /// Write end of its stderr.
    pub stderr: OwnedFd,
    /// Its stdin (`/dev/null` when `None`).
    pub stdin: Option<OwnedFd>,
    /// The three are a terminal's slave: a new session with it as controlling terminal.
    pub pty: bool,
}

/// A command that runs, under its sub-reaper.
pub(crate) struct Launched {
    /// Its sub-reaper's slot in the registry.
    pub slot: Arc<Slot>,
    /// The command's own pid (and process group).
    pub pid: i32,
    /// What the kernel enforced.
    pub landlock: Enforcement,
    /// The working directory, absolute.
    pub cwd: String,
    /// When the spawn began.
    pub started: Instant,
}

/// Checks, resolves, confines and starts a command for request `request` under its own
/// sub-reaper; `None` when the request was cancelled before anything started.
pub(crate) fn launch(
    ctx: &Context,
    request: u64,
    what: &Launch<'_>,
    stdio: Stdio,
) -> OpResult<Option<Launched>> {
    let name = check_launch(what)?;
    // Cached like the grants: the image is read-only, and each lookup walks `PATH` on it.
    let program = ctx.grants.resolve(name, &ctx.config.path)?.path;
    let exec = ctx.grants.exec_paths(what.exec, name, &ctx.config.path)?;
    let cwd_target = ctx.roots.resolve(what.cwd.unwrap_or("."), Access::Read)?;
    let cwd = cwd_target.open(OFlags::PATH | OFlags::DIRECTORY)?;
    let env = environment(ctx, what);
    let (status_read, status_write) = pipe()?;
    let confinement = Confinement {
        exec,
        write_roots: ctx.config.write_roots.clone(),
        egress: ctx.config.egress,
    };
    let ruleset = confine::prepare(
        &confinement,
        ctx.landlock_abi,
        |path| ctx.grants.opened(path),
        &ctx.held,
    )
    .map_err(|e| {
        OpError::new(
            ErrorKind::SpawnFailed,
            format!("cannot build the command's Landlock rules: {e}"),
        )
    })?;
    let child = subreaper::Child {
        plan: Plan {
            program: program.clone(),
            argv: what.argv.to_vec(),
            cwd_display: cwd_target.display.to_string(),
            env,
            uid: match what.user {
                RunAs::User => ctx.config.uid,
                RunAs::Root => 0,
            },
            gid: match what.user {
                RunAs::User => ctx.config.gid,
                RunAs::Root => 0,
            },
            exec_restricted: confinement.exec.is_some(),
            require_landlock: ctx.config.require_landlock,
            pty: stdio.pty,
        },
        ruleset,
        program_dir: program
            .rsplit_once('/')
            .and_then(|(dir, _)| ctx.grants.opened(if dir.is_empty() { "/" } else { dir })),
        cwd,
        stdout: stdio.stdout,
        stderr: stdio.stderr,
        status: status_write,
        stdin: stdio.stdin,
    };

    let started = Instant::now();
    // The fork server clones the sub-reaper (as our child) from copies of `child`'s descriptors;
    // without it, this thread forks it. Our copies are dropped with `child` when the closure
    // returns.
    let spawned = ctx
        .children
        .spawn_with(request, move || match ctx.fork_server.spawn(&child) {
            Ok(pid) => Ok(pid),
            Err(SpawnError::Failed(e)) => Err(e),
            Err(SpawnError::Unavailable) => fork_subreaper(child),
        })
        .map_err(|e| {
            OpError::new(
                ErrorKind::SpawnFailed,
                format!(
                    "cannot start the sub-reaper for '{name}' in '{}': {e}",
                    cwd_target.display
                ),
            )
        })?;
    let Some(slot) = spawned else {
        return Ok(None);
    };
    match read_handshake(&status_read) {
        Ok(Handshake::Started { landlock, pid }) => Ok(Some(Launched {
            slot,
            pid,
            landlock,
            cwd: cwd_target.display.to_string(),
            started,
        })),
        Ok(Handshake::Failed { kind, message }) => {
            wait_for_exit(ctx, &slot);
            Err(OpError::new(kind, message))
        }
        Err(why) => {
            ctx.children.stop(&slot, Stop::KillSubreaper);
            wait_for_exit(ctx, &slot);
            Err(OpError::new(
                ErrorKind::SpawnFailed,
                format!("cannot start '{name}' ({program}): {why}"),
            ))
        }
    }
}

/// The request's own checks, before anything is resolved: an argv, and no NUL in it or in the
/// environment (nor `=` in a variable's name). Gives the program's name.
fn check_launch<'a>(what: &Launch<'a>) -> OpResult<&'a String> {
    let Some(name) = what.argv.first() else {
        return Err(OpError::invalid("argv is empty"));
    };
    if let Some(i) = what.argv.iter().position(|a| a.contains('\0')) {
        return Err(OpError::invalid(format!("argv[{i}] contains a NUL byte")));
    }
    for (key, value) in what.env {
        if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
            return Err(OpError::invalid(format!(
                "env entry '{}' is not a valid variable (no '=' or NUL in names, no NUL in values)",
                key.escape_default()
            )));
        }
    }
    Ok(name)
}

/// The command's environment, built in the parent before the spawn: the node's `PATH`, `HOME`
/// and `LANG`, then the launcher's defaults, then the request's own variables (each replacing
/// one of the same name).
fn environment(ctx: &Context, what: &Launch<'_>) -> Vec<(String, String)> {
    let mut env = vec![
        ("PATH".to_owned(), ctx.config.path.clone()),
        ("HOME".to_owned(), ctx.config.home.clone()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
    ];
    env.extend(
        what.defaults
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    for (key, value) in what.env {
        env.retain(|(k, _)| k != key);
        env.push((key.clone(), value.clone()));
    }
    env
}

/// Runs `cmd.run` for request `request`.
pub fn run(ctx: &Context, request: u64, params: RunParams) -> OpResult<RunResult> {
    if params.timeout_ms == 0 {
        return Err(OpError::invalid("timeout_ms must be positive"));
    }
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    let what = Launch {
        argv: &params.argv,
        cwd: params.cwd.as_deref(),
        env: &params.env,
        defaults: &[],
        exec: &params.exec,
        user: params.user,
    };
    let stdio = Stdio {
        stdout: stdout_write,
        stderr: stderr_write,
        stdin: None,
        pty: false,
    };
    let Some(launched) = launch(ctx, request, &what, stdio)? else {
        return Ok(cancelled_before_start());
    };
    let Launched {
        slot,
        landlock,
        started,
        ..
    } = launched;
    let name = params.argv.first().map_or("", String::as_str);

    let limits = Limits {
        deadline: started.checked_add(Duration::from_millis(params.timeout_ms)),
        grace: grace(params.grace_ms),
        drain_while_reading: false,
    };
    let cap = |n: u64| usize::try_from(n.min(MAX_KEPT_BYTES)).unwrap_or(usize::MAX);
    let mut buffers = [
        CappedBuffer::new(cap(params.max_stdout_bytes)),
        CappedBuffer::new(cap(params.max_stderr_bytes)),
    ];
    let outcome = supervise(
        ctx,
        &slot,
        [Some(stdout_read), Some(stderr_read)],
        &limits,
        &mut |index, bytes| buffers[index].push(bytes),
    );
    ctx.children.release(&slot);
    if outcome.timed_out || outcome.cancelled || outcome.status.is_none() {
        crate::log_event!(
            "cmd.run id={request} pid={} '{name}' ended: timed_out={} cancelled={} reaped={}",
            slot.pid().as_raw_pid(),
            outcome.timed_out,
            outcome.cancelled,
            outcome.status.is_some()
        );
    }

    let [out, err] = buffers;
    let truncated = Truncation {
        stdout: out.truncated(),
        stderr: err.truncated(),
    };
    let (stdout_bytes, stderr_bytes) = (out.total(), err.total());
    let (stdout, stdout_encoding) = encoding::encode(out.into_kept(), truncated.stdout);
    let (stderr, stderr_encoding) = encoding::encode(err.into_kept(), truncated.stderr);
    Ok(RunResult {
        exit_code: outcome.status.and_then(|s| s.exit_status()),
        signal: outcome.status.and_then(|s| s.terminating_signal()),
        stdout,
        stdout_encoding,
        stderr,
        stderr_encoding,
        stdout_bytes,
        stderr_bytes,
        truncated,
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        timed_out: outcome.timed_out,
        cancelled: outcome.cancelled,
        landlock,
    })
}

/// The SIGTERM-to-SIGKILL delay a request asks for, within bounds.
pub(crate) fn grace(grace_ms: Option<u64>) -> Duration {
    grace_ms
        .map_or(DEFAULT_GRACE, Duration::from_millis)
        .min(MAX_GRACE)
}

/// Forks the sub-reaper from this (multi-threaded) process: the path when the fork server is
/// gone or the plan is too large for it (`forkserver.rs`), and how it was always done before.
fn fork_subreaper(child: subreaper::Child) -> io::Result<Pid> {
    let launch = subreaper::Launch::prepare(&child, None, None);
    // SAFETY: the child runs `run_forked`, which never returns into this thread's frames and
    // ends with `exit_group`; see `subreaper.rs` for what it may touch after `fork`. Our copies
    // of the descriptors (`child`) are closed when this returns.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => subreaper::run_forked(&launch),
        pid => Pid::from_raw(pid).ok_or_else(|| io::Error::other("fork returned an invalid pid")),
    }
}

/// A pipe whose both ends close on `exec`.
pub(crate) fn pipe() -> OpResult<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(PipeFlags::CLOEXEC)
        .map_err(|e| OpError::new(ErrorKind::SpawnFailed, format!("cannot create a pipe: {e}")))
}

/// Reads the sub-reaper's one status line (it closes the pipe right after, or dies).
fn read_handshake(pipe: &OwnedFd) -> Result<Handshake, String> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let mut line = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = line.iter().position(|b| *b == b'\n') {
            return serde_json::from_slice(&line[..end])
                .map_err(|e| format!("the sub-reaper answered something unexpected: {e}"));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("the sub-reaper did not answer in time".into());
        }
        let mut fds = [PollFd::new(pipe, PollFlags::IN)];
        match poll(&mut fds, Some(&duration_to_timespec(left))) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(format!("poll failed: {e}")),
        }
        match rustix::io::read(pipe, &mut chunk[..]) {
            Ok(0) => return Err("the sub-reaper ended before starting the command".into()),
            Ok(n) => line.extend_from_slice(&chunk[..n]),
            Err(Errno::INTR) | Err(Errno::AGAIN) => {}
            Err(e) => return Err(format!("reading the sub-reaper's answer failed: {e}")),
        }
    }
}

/// Waits (bounded) until the reaper has collected a sub-reaper that is ending on its own.
pub(crate) fn wait_for_exit(ctx: &Context, slot: &Arc<Slot>) {
    let deadline = Instant::now() + KILL_BACKSTOP;
    while slot.exit_status().is_none() && Instant::now() < deadline {
        let wake = slot.wake_fd();
        let mut fds = [PollFd::new(&wake, PollFlags::IN)];
        let left = deadline.saturating_duration_since(Instant::now());
        let _ = poll(&mut fds, Some(&duration_to_timespec(left)));
        slot.clear_wake();
    }
    ctx.children.release(slot);
}

fn cancelled_before_start() -> RunResult {
    RunResult {
        exit_code: None,
        signal: None,
        stdout: String::new(),
        stdout_encoding: Encoding::Utf8,
        stderr: String::new(),
        stderr_encoding: Encoding::Utf8,
        stdout_bytes: 0,
        stderr_bytes: 0,
        truncated: Truncation::default(),
        duration_ms: 0,
        timed_out: false,
        cancelled: true,
        landlock: Enforcement::None,
    }
}

/// When to stop a supervised command.
pub(crate) struct Limits {
    /// Its timeout, if it has one.
    pub deadline: Option<Instant>,
    /// SIGTERM to SIGKILL.
    pub grace: Duration,
    /// After the leader's exit, drain for [`DRAIN_AFTER_EXIT`] after the last read that brought
    /// bytes rather than after the exit: a sink that may wait (a live process's events, behind
    /// the protocol's stdout) must not lose what is still in the pipes. Every writer is gone by
    /// then (the sub-reaper killed the tree), so the pipes end.
    pub drain_while_reading: bool,
}

/// How a supervised command ended.
pub(crate) struct Outcome {
    /// The leader's status (`None`: never reaped, the sub-reaper was killed).
    pub status: Option<rustix::process::WaitStatus>,
    /// Its timeout expired.
    pub timed_out: bool,
    /// `cancel` stopped it.
    pub cancelled: bool,
}

/// The poll loop described in the module documentation; every chunk read from pipe `i` goes to
/// `sink(i, chunk)` as it comes. A pipe that reports `EIO` (a terminal whose slave is closed)
/// counts as ended.
pub(crate) fn supervise(
    ctx: &Context,
    slot: &Arc<Slot>,
    pipes: [Option<OwnedFd>; 2],
    limits: &Limits,
    sink: &mut dyn FnMut(usize, &[u8]),
) -> Outcome {
    let mut pipes = pipes;
    let mut status = None;
    let mut exited_at: Option<Instant> = None;
    let mut term_sent: Option<Instant> = None;
    let mut kill_sent = false;
    let mut timed_out = false;
    let mut cancelled = false;
    let mut chunk = vec![0u8; CHUNK];

    loop {
        let now = Instant::now();
        if status.is_none() {
            status = slot.exit_status();
            if status.is_some() {
                exited_at = Some(now);
            }
        }
        if status.is_none() {
            if !cancelled && slot.cancel_requested() {
                cancelled = true;
            }
            if !timed_out && !cancelled && limits.deadline.is_some_and(|d| now >= d) {
                timed_out = true;
            }
            if (timed_out || cancelled) && term_sent.is_none() {
                ctx.children.stop(slot, Stop::Terminate);
                term_sent = Some(now);
            }
            if let Some(term) = term_sent {
                if !kill_sent && now >= term + limits.grace {
                    ctx.children.stop(slot, Stop::Kill);
                    kill_sent = true;
                }
                if kill_sent && now >= term + limits.grace + KILL_BACKSTOP {
                    ctx.children.stop(slot, Stop::KillSubreaper);
                    break;
                }
            }
        }
        if status.is_some() && pipes.iter().all(Option::is_none) {
            break;
        }
        if exited_at.is_some_and(|at| now >= at + DRAIN_AFTER_EXIT) {
            break;
        }

        let next = next_wake(exited_at, term_sent, kill_sent, limits);
        let timeout = next.map(|n| duration_to_timespec(n.saturating_duration_since(now)));
        let (ready, which) = wait_ready(slot, &pipes, timeout);
        for (slot_index, &index) in which.iter().enumerate() {
            if !ready[slot_index] {
                continue;
            }
            let Some(fd) = &pipes[index] else { continue };
            match rustix::io::read(fd, &mut chunk[..]) {
                Ok(0) => pipes[index] = None,
                Ok(n) => {
                    sink(index, &chunk[..n]);
                    if limits.drain_while_reading && exited_at.is_some() {
                        exited_at = Some(Instant::now());
                    }
                }
                Err(Errno::INTR) | Err(Errno::AGAIN) => {}
                Err(_) => pipes[index] = None,
            }
        }
    }
    Outcome {
        status,
        timed_out,
        cancelled,
    }
}

/// When the loop must next look without being woken: the end of the drain after exit, the
/// grace (then the backstop) after SIGTERM (then SIGKILL), else the deadline, if any.
fn next_wake(
    exited_at: Option<Instant>,
    term_sent: Option<Instant>,
    kill_sent: bool,
    limits: &Limits,
) -> Option<Instant> {
    if let Some(at) = exited_at {
        Some(at + DRAIN_AFTER_EXIT)
    } else if let Some(term) = term_sent {
        Some(
            term + limits.grace
                + if kill_sent {
                    KILL_BACKSTOP
                } else {
                    Duration::ZERO
                },
        )
    } else {
        limits.deadline
    }
}

/// The wait of one turn: polls the open pipes and the slot's wake descriptor (clearing it when
/// it fired) until one is ready or `timeout` passes. Gives which poll entries are ready and
/// the pipe index of each pipe entry.
fn wait_ready(
    slot: &Slot,
    pipes: &[Option<OwnedFd>; 2],
    timeout: Option<Timespec>,
) -> (Vec<bool>, Vec<usize>) {
    let mut fds = Vec::with_capacity(3);
    let mut which = Vec::with_capacity(2);
    for (index, pipe) in pipes.iter().enumerate() {
        if let Some(fd) = pipe {
            fds.push(PollFd::new(fd, PollFlags::IN));
            which.push(index);
        }
    }
    let wake_index = fds.len();
    let wake = slot.wake_fd();
    fds.push(PollFd::new(&wake, PollFlags::IN));
    match poll(&mut fds, timeout.as_ref()) {
        Ok(_) | Err(Errno::INTR) => {}
        Err(errno) => {
            crate::log_event!("poll failed: {errno}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
    drop(fds);
    if ready[wake_index] {
        slot.clear_wake();
    }
    (ready, which)
}

pub(crate) fn duration_to_timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: d.subsec_nanos().into(),
    }
}
