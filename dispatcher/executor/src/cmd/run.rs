//! `cmd.run`: one program, no shell, as the sandbox user, in its own process group, supervised.
//!
//! The child is prepared by std's `Command` (fork, then in the child: stdio, `setgid`,
//! `setgroups([])`, `setuid`, `setpgid(0, 0)`, our `fchdir` to the already-resolved working
//! directory descriptor, `execve`). Being non-root after `setuid` with no-new-privileges set, it has
//! no capabilities at all. Its environment is built from scratch.
//!
//! The supervising thread then runs one `poll` loop over the stdout pipe, the stderr pipe and the
//! command's wake-up eventfd (exit or cancel), with a timeout computed from the next deadline:
//!
//! * output is read as it comes and capped while streaming (`capture.rs`);
//! * at the timeout (or on cancel) the whole group gets SIGTERM, and SIGKILL `grace_ms` later;
//! * when the leader exits, the reaper has already SIGKILLed the rest of its group; the loop then
//!   drains the pipes until EOF but at most [`DRAIN_AFTER_EXIT`], so a process that escaped the
//!   group with `setsid` and still holds a pipe cannot hang the call.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fd::{BorrowedFd, OwnedFd};
use rustix::fs::OFlags;
use rustix::io::Errno;
use rustix::process::Signal;

use crate::cmd::capture::CappedBuffer;
use crate::cmd::children::Slot;
use crate::cmd::program;
use crate::encoding;
use crate::error::{OpError, OpResult};
use crate::protocol::{Encoding, ErrorKind, RunParams, RunResult, Truncation};
use crate::roots::Access;
use crate::server::Context;

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
const CHUNK: usize = 64 * 1024;

/// Runs `cmd.run` for request `request`.
pub fn run(ctx: &Context, request: u64, params: RunParams) -> OpResult<RunResult> {
    let Some((name, args)) = params.argv.split_first() else {
        return Err(OpError::invalid("argv is empty"));
    };
    if let Some(i) = params.argv.iter().position(|a| a.contains('\0')) {
        return Err(OpError::invalid(format!("argv[{i}] contains a NUL byte")));
    }
    for (key, value) in &params.env {
        if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
            return Err(OpError::invalid(format!(
                "env entry '{}' is not a valid variable (no '=' or NUL in names, no NUL in values)",
                key.escape_default()
            )));
        }
    }
    if params.timeout_ms == 0 {
        return Err(OpError::invalid("timeout_ms must be positive"));
    }
    let program = program::find(name, &ctx.config.path)?;
    let cwd_target = ctx
        .roots
        .resolve(params.cwd.as_deref().unwrap_or("."), Access::Read)?;
    let cwd = cwd_target.open(OFlags::PATH | OFlags::DIRECTORY)?;

    let mut command = Command::new(&program);
    command
        .arg0(name)
        .args(args)
        .env_clear()
        .env("PATH", &ctx.config.path)
        .env("HOME", &ctx.config.home)
        .env("LANG", "C.UTF-8")
        .envs(&params.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .gid(ctx.config.gid)
        .uid(ctx.config.uid)
        .process_group(0);
    let cwd_raw = cwd.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only calls fchdir(2), which is
    // async-signal-safe. `cwd` outlives the spawn below, so the descriptor number stays valid.
    unsafe {
        command.pre_exec(move || {
            rustix::process::fchdir(BorrowedFd::borrow_raw(cwd_raw)).map_err(io::Error::from)
        });
    }

    let started = Instant::now();
    let spawned = ctx.children.spawn(request, &mut command).map_err(|e| {
        let kind = match e.kind() {
            io::ErrorKind::NotFound => ErrorKind::CommandNotFound,
            _ => ErrorKind::SpawnFailed,
        };
        OpError::new(
            kind,
            format!(
                "cannot start '{name}' ({program}) in '{}': {e}",
                cwd_target.display
            ),
        )
    })?;
    drop(cwd);
    let Some((mut child, slot)) = spawned else {
        return Ok(cancelled_before_start(started));
    };
    let stdout = child.stdout.take().map(OwnedFd::from);
    let stderr = child.stderr.take().map(OwnedFd::from);
    drop(child);

    let limits = Limits {
        deadline: started.checked_add(Duration::from_millis(params.timeout_ms)),
        grace: params
            .grace_ms
            .map_or(DEFAULT_GRACE, Duration::from_millis)
            .min(MAX_GRACE),
        max_stdout: params.max_stdout_bytes.min(MAX_KEPT_BYTES),
        max_stderr: params.max_stderr_bytes.min(MAX_KEPT_BYTES),
    };
    let outcome = supervise(ctx, &slot, [stdout, stderr], &limits);
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

    let [out, err] = outcome.streams;
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
    })
}

fn cancelled_before_start(started: Instant) -> RunResult {
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
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        timed_out: false,
        cancelled: true,
    }
}

struct Limits {
    deadline: Option<Instant>,
    grace: Duration,
    max_stdout: u64,
    max_stderr: u64,
}

struct Outcome {
    status: Option<rustix::process::WaitStatus>,
    streams: [CappedBuffer; 2],
    timed_out: bool,
    cancelled: bool,
}

/// The poll loop described in the module documentation.
fn supervise(
    ctx: &Context,
    slot: &Arc<Slot>,
    pipes: [Option<OwnedFd>; 2],
    limits: &Limits,
) -> Outcome {
    let cap = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let mut buffers = [
        CappedBuffer::new(cap(limits.max_stdout)),
        CappedBuffer::new(cap(limits.max_stderr)),
    ];
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
                ctx.children.signal_group(slot, Signal::TERM);
                term_sent = Some(now);
            }
            if let Some(term) = term_sent {
                if !kill_sent && now >= term + limits.grace {
                    ctx.children.signal_group(slot, Signal::KILL);
                    kill_sent = true;
                }
                if kill_sent && now >= term + limits.grace + KILL_BACKSTOP {
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

        let next = if let Some(at) = exited_at {
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
        };
        let timeout = next.map(|n| duration_to_timespec(n.saturating_duration_since(now)));

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
        for (slot_index, &index) in which.iter().enumerate() {
            if !ready[slot_index] {
                continue;
            }
            let Some(fd) = &pipes[index] else { continue };
            match rustix::io::read(fd, &mut chunk[..]) {
                Ok(0) => pipes[index] = None,
                Ok(n) => buffers[index].push(&chunk[..n]),
                Err(Errno::INTR) | Err(Errno::AGAIN) => {}
                Err(_) => pipes[index] = None,
            }
        }
    }
    Outcome {
        status,
        streams: buffers,
        timed_out,
        cancelled,
    }
}

fn duration_to_timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: d.subsec_nanos().into(),
    }
}
