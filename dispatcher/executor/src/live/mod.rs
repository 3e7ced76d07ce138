//! Live processes: programs that run past the request that started them (`proc.start`), fed
//! with input, signalled, resized and listed by pid while their output streams out as events.
//!
//! A live process is started exactly like `cmd.run` (`cmd/run.rs`'s `launch`: the same
//! `argv[0]` lookup, exec grant, Landlock domain, sub-reaper and process group, registered with
//! the same reaper) and supervised by the same poll loop (`supervise`), on a thread of its own
//! that sends each chunk of output as a `data` event and, last, an `end` event (`start.rs`).
//! Nothing here spawns or signals by itself: signals go through the sub-reaper
//! ([`Children::stop`](crate::spawn::children::Children::stop)), so a live process's tree dies
//! with it, with the executor (stdin closed: every sub-reaper is told to kill its tree) and with
//! the container.
//!
//! Bounds: at most `max_live_processes` at once (counting those being started; more are refused
//! with `limit_reached`), `max_output_bytes` forwarded per stream (the rest is read, counted and
//! reported in `end`), 1 MiB per `proc.input`, and an input that the process does not read
//! within [`INPUT_TIMEOUT`] fails rather than holding a handler thread.
//!
//! `pty.rs` opens a pseudo-terminal through the kernel (`/dev/ptmx`, `TIOCGPTPEER`).

pub mod pty;
pub mod start;

use std::sync::PoisonError;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;

use crate::cmd::run::duration_to_timespec;
use crate::context::Context;
use crate::encoding;
use crate::error::{OpError, OpResult};
use crate::protocol::{
    Empty, Encoding, ErrorKind, InputParams, InputResult, ProcTarget, ProcessSignal, ResizeParams,
    SignalParams,
};
use crate::spawn::children::Stop;

/// Longest a `proc.input` waits for the process to read what it was sent.
pub const INPUT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes one `proc.input` carries.
pub const MAX_INPUT_BYTES: usize = 1024 * 1024;

/// `proc.input`: writes all the bytes, or fails saying how many went in.
pub fn input(ctx: &Context, params: InputParams) -> OpResult<InputResult> {
    let bytes = encoding::decode(params.data, Encoding::Base64, "data")?;
    if bytes.len() > MAX_INPUT_BYTES {
        return Err(OpError::new(
            ErrorKind::TooLarge,
            format!(
                "input of {} bytes is over the {MAX_INPUT_BYTES}-byte limit of one proc.input",
                bytes.len()
            ),
        ));
    }
    let process = ctx.live.get(params.pid)?;
    let _writing = process
        .writing
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let fd = process
        .input
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let Some(fd) = fd else {
        return Err(OpError::invalid(if process.takes_input {
            format!("the stdin of pid {} is closed", params.pid)
        } else {
            format!(
                "pid {} was started without stdin (start it with stdin: true)",
                params.pid
            )
        }));
    };
    let deadline = Instant::now() + INPUT_TIMEOUT;
    let mut written = 0;
    while written < bytes.len() {
        match rustix::io::write(&*fd, &bytes[written..]) {
            Ok(n) => written += n,
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(OpError::new(
                        ErrorKind::Busy,
                        format!(
                            "pid {} did not read its input within {INPUT_TIMEOUT:?}; {written} of {} bytes were written",
                            params.pid,
                            bytes.len()
                        ),
                    ));
                }
                let mut fds = [PollFd::new(&*fd, PollFlags::OUT)];
                let _ = poll(&mut fds, Some(&duration_to_timespec(left)));
            }
            Err(Errno::PIPE) | Err(Errno::IO) => {
                return Err(OpError::new(
                    ErrorKind::Io,
                    format!(
                        "pid {} no longer reads its input; {written} of {} bytes were written",
                        params.pid,
                        bytes.len()
                    ),
                ))
            }
            Err(e) => {
                return Err(OpError::new(
                    ErrorKind::Io,
                    format!(
                        "cannot write the input of pid {}: {}; {written} of {} bytes were written",
                        params.pid,
                        std::io::Error::from(e),
                        bytes.len()
                    ),
                ))
            }
        }
    }
    Ok(InputResult {
        written: written as u64,
    })
}

/// `proc.close_stdin`: the process reads end-of-file once it has read what was sent.
pub fn close_stdin(ctx: &Context, params: ProcTarget) -> OpResult<Empty> {
    let process = ctx.live.get(params.pid)?;
    if process.terminal.is_some() {
        return Err(OpError::invalid(format!(
            "pid {} runs under a terminal, which has no stdin of its own to close; send end-of-file as input (Ctrl-D, byte 4)",
            params.pid
        )));
    }
    if !process.takes_input {
        return Err(OpError::invalid(format!(
            "pid {} was started without stdin",
            params.pid
        )));
    }
    // A writer in progress keeps its copy until it returns; the pipe closes then.
    process
        .input
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    Ok(Empty {})
}

/// `proc.signal`: SIGTERM to the process group, or SIGKILL to the whole tree, through the
/// sub-reaper.
pub fn signal(ctx: &Context, params: SignalParams) -> OpResult<Empty> {
    let process = ctx.live.get(params.pid)?;
    let stop = match params.signal {
        ProcessSignal::Term => Stop::Terminate,
        ProcessSignal::Kill => Stop::Kill,
    };
    ctx.children.stop(&process.slot, stop);
    Ok(Empty {})
}

/// `proc.resize`: the terminal's new size (the process group gets SIGWINCH from the kernel).
pub fn resize(ctx: &Context, params: ResizeParams) -> OpResult<Empty> {
    pty::check_size(params.size)?;
    let process = ctx.live.get(params.pid)?;
    let Some((master, size)) = &process.terminal else {
        return Err(OpError::invalid(format!(
            "pid {} has no terminal to resize (start it with pty)",
            params.pid
        )));
    };
    pty::resize(master, params.size)?;
    *size.lock().unwrap_or_else(PoisonError::into_inner) = params.size;
    Ok(Empty {})
}
