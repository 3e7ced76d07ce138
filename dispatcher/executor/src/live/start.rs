//! `proc.start`: launch a process like `cmd.run`, answer its pid, then stream its life as events.
//!
//! The handler launches the process (`cmd::run::launch`), registers it, starts its supervising
//! thread and answers. The thread runs `cmd::run::supervise` (the same loop as `cmd.run`: the
//! timeout, SIGTERM then SIGKILL after the grace, the drain after exit) and turns each chunk it
//! reads into a `data` event, up to `max_output_bytes` per stream (then it only counts); when the
//! process has ended it forgets it and sends the `end` event, the last of that id.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::fd::OwnedFd;
use rustix::fs::OFlags;

use crate::cmd::run::{self, Launch, Launched, Limits, Stdio};
use crate::context::Context;
use crate::encoding::base64_encode;
use crate::error::{OpError, OpResult};
use crate::live::pty;
use crate::protocol::{
    ErrorKind, Event, EventBody, OutputStream, ProcessEnd, PtySize, RunAs, StartParams,
    StartResult, Truncation,
};
use crate::running::Proc;
use crate::spawn::children::Stop;

/// Longest tag accepted.
const MAX_TAG_BYTES: usize = 256;
/// The terminal type a PTY process gets unless its `env` says otherwise.
const TERM: &str = "xterm-256color";

/// Runs `proc.start` for request `request`.
pub fn start(ctx: &Arc<Context>, request: u64, params: StartParams) -> OpResult<StartResult> {
    check(&params)?;
    let reservation = ctx
        .live
        .reserve(ctx.config.max_live_processes, params.tag.as_deref())?;
    let max_output = params
        .max_output_bytes
        .unwrap_or(ctx.config.max_live_output_bytes)
        .min(ctx.config.max_live_output_bytes);

    let Plumbing {
        stdio,
        reads,
        input,
        terminal,
    } = plumbing(ctx, &params)?;
    let what = Launch {
        argv: &params.argv,
        cwd: params.cwd.as_deref(),
        env: &params.env,
        defaults: if params.pty.is_some() {
            &[("TERM", TERM)]
        } else {
            &[]
        },
        exec: &params.exec,
        user: params.user,
    };
    // A root process: root from here (its terminal, made above, stays root's with mode 0600),
    // so its working directory is opened as root, as `cmd.run`'s is.
    let _root = match params.user {
        RunAs::Root => Some(crate::identity::as_root(&ctx.config)?),
        RunAs::User => None,
    };
    let Some(launched) = run::launch(ctx, request, &what, stdio)? else {
        // Only `cmd.run` requests can be cancelled before they spawn.
        return Err(OpError::new(
            ErrorKind::Internal,
            "the process was cancelled before it started",
        ));
    };
    let Launched {
        slot,
        pid,
        landlock,
        cwd,
        started,
    } = launched;
    let pid = u32::try_from(pid).unwrap_or_default();
    let process = Arc::new(Proc {
        events: request,
        pid,
        tag: params.tag.clone(),
        argv: params.argv.clone(),
        cwd,
        env: params.env.clone(),
        takes_input: input.is_some(),
        slot: Arc::clone(&slot),
        terminal,
        input: Mutex::new(input),
        writing: Mutex::new(()),
    });
    ctx.live.insert(reservation, Arc::clone(&process));
    let limits = Limits {
        deadline: params
            .timeout_ms
            .and_then(|ms| started.checked_add(Duration::from_millis(ms))),
        grace: run::grace(params.grace_ms),
        drain_while_reading: true,
    };
    let streams = if params.pty.is_some() {
        [OutputStream::Pty, OutputStream::Stderr]
    } else {
        [OutputStream::Stdout, OutputStream::Stderr]
    };
    let thread_ctx = Arc::clone(ctx);
    ctx.live.supervisor_starts();
    let spawned = std::thread::Builder::new()
        .name(format!("live-{pid}"))
        .spawn(move || {
            supervise(&thread_ctx, &process, reads, &limits, streams, max_output);
            thread_ctx.live.supervisor_ended();
        });
    if let Err(e) = spawned {
        ctx.live.supervisor_ended();
        // Nobody would read its output or report its end: it must not run.
        ctx.children.stop(&slot, Stop::Kill);
        ctx.live.remove(pid);
        run::wait_for_exit(ctx, &slot);
        return Err(OpError::new(
            ErrorKind::Busy,
            format!("cannot start the thread that supervises the process: {e}"),
        ));
    }
    Ok(StartResult {
        pid,
        tag: params.tag,
        landlock,
    })
}

/// The request's own checks, before anything is reserved or opened.
fn check(params: &StartParams) -> OpResult<()> {
    if let Some(tag) = &params.tag {
        if tag.is_empty() || tag.len() > MAX_TAG_BYTES || tag.contains('\0') {
            return Err(OpError::invalid(format!(
                "tag must be 1 to {MAX_TAG_BYTES} bytes without NUL"
            )));
        }
    }
    if params.timeout_ms == Some(0) {
        return Err(OpError::invalid("timeout_ms must be positive when given"));
    }
    if params.max_output_bytes == Some(0) {
        return Err(OpError::invalid(
            "max_output_bytes must be positive when given",
        ));
    }
    Ok(())
}

/// The process's descriptors: its stdio, the ends the supervisor reads, where input goes and
/// the terminal (when it has one).
struct Plumbing {
    stdio: Stdio,
    reads: [Option<OwnedFd>; 2],
    input: Option<Arc<OwnedFd>>,
    terminal: Option<(Arc<OwnedFd>, Mutex<PtySize>)>,
}

/// Opening the descriptors is a step of its own, before the launch: a PTY (its slave as the
/// three stdio, its master read and written), or pipes (stdin only when asked for, written
/// without blocking).
fn plumbing(ctx: &Context, params: &StartParams) -> OpResult<Plumbing> {
    Ok(match params.pty {
        Some(size) => {
            let (master, slave) = pty::open(size, (ctx.config.uid, ctx.config.gid))?;
            let copy = |fd: &OwnedFd| {
                fd.try_clone().map_err(|e| {
                    OpError::new(
                        ErrorKind::SpawnFailed,
                        format!("cannot duplicate a terminal descriptor: {e}"),
                    )
                })
            };
            let stdio = Stdio {
                stdout: copy(&slave)?,
                stderr: copy(&slave)?,
                stdin: Some(slave),
                pty: true,
            };
            let reads = [Some(copy(&master)?), None];
            let master = Arc::new(master);
            Plumbing {
                stdio,
                reads,
                input: Some(Arc::clone(&master)),
                terminal: Some((master, Mutex::new(size))),
            }
        }
        None => {
            let (stdout_read, stdout_write) = run::pipe()?;
            let (stderr_read, stderr_write) = run::pipe()?;
            let (stdin, input) = if params.stdin {
                let (read, write) = run::pipe()?;
                let status = rustix::fs::fcntl_getfl(&write)
                    .and_then(|s| rustix::fs::fcntl_setfl(&write, s | OFlags::NONBLOCK));
                if let Err(e) = status {
                    return Err(OpError::new(
                        ErrorKind::SpawnFailed,
                        format!("cannot configure the stdin pipe: {e}"),
                    ));
                }
                (Some(read), Some(Arc::new(write)))
            } else {
                (None, None)
            };
            let stdio = Stdio {
                stdout: stdout_write,
                stderr: stderr_write,
                stdin,
                pty: false,
            };
            Plumbing {
                stdio,
                reads: [Some(stdout_read), Some(stderr_read)],
                input,
                terminal: None,
            }
        }
    })
}

/// The supervising thread's body: `data` events while it runs, `end` last.
fn supervise(
    ctx: &Context,
    process: &Proc,
    reads: [Option<OwnedFd>; 2],
    limits: &Limits,
    streams: [OutputStream; 2],
    max_output: u64,
) {
    let mut totals = [0u64; 2];
    let outcome = run::supervise(ctx, &process.slot, reads, limits, &mut |index, bytes| {
        let before = totals[index];
        totals[index] += bytes.len() as u64;
        let room = usize::try_from(max_output.saturating_sub(before)).unwrap_or(usize::MAX);
        let forwarded = &bytes[..bytes.len().min(room)];
        if !forwarded.is_empty() {
            ctx.events.event(&Event {
                event: process.events,
                body: EventBody::Data {
                    stream: streams[index],
                    data: base64_encode(forwarded),
                },
            });
        }
    });
    ctx.live.remove(process.pid);
    ctx.children.release(&process.slot);
    let error = outcome.status.is_none().then(|| {
        "the process's sub-reaper did not end after SIGKILL and was killed; its exit status is unknown"
            .to_owned()
    });
    if outcome.timed_out || error.is_some() {
        crate::log_event!(
            "live pid={} '{}' ended: timed_out={} reaped={}",
            process.pid,
            process.argv.first().map_or("", String::as_str),
            outcome.timed_out,
            error.is_none()
        );
    }
    ctx.events.event(&Event {
        event: process.events,
        body: EventBody::End(ProcessEnd {
            exit_code: outcome.status.and_then(|s| s.exit_status()),
            signal: outcome.status.and_then(|s| s.terminating_signal()),
            stdout_bytes: totals[0],
            stderr_bytes: totals[1],
            truncated: Truncation {
                stdout: totals[0] > max_output,
                stderr: totals[1] > max_output,
            },
            timed_out: outcome.timed_out,
            error,
        }),
    });
}
