//! Live processes: programs that run past the request that started them (`proc.start`), fed
//! with input, signalled, resized and listed by pid while their output streams out as events.
//!
//! A live process is started exactly like `cmd.run` (`cmd/run.rs`'s `launch`: the same
//! `argv[0]` lookup, exec grant, Landlock domain, sub-reaper and process group, registered with
//! the same reaper) and supervised by the same poll loop (`supervise`), on a thread of its own
//! that sends each chunk of output as a `data` event and, last, an `end` event (`start.rs`).
//! Nothing here spawns or signals by itself: signals go through the sub-reaper
//! ([`Children::stop`](crate::cmd::children::Children::stop)), so a live process's tree dies
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use rustix::fd::OwnedFd;
use rustix::io::Errno;

use crate::cmd::children::{Slot, Stop};
use crate::cmd::run::duration_to_timespec;
use crate::encoding;
use crate::error::{OpError, OpResult};
use crate::protocol::{
    Empty, Encoding, ErrorKind, InputParams, InputResult, LiveListResult, LiveProcess, ProcTarget,
    ProcessSignal, PtySize, ResizeParams, SignalParams,
};
use crate::server::Context;

/// Longest a `proc.input` waits for the process to read what it was sent.
pub const INPUT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes one `proc.input` carries.
pub const MAX_INPUT_BYTES: usize = 1024 * 1024;

/// One live process.
pub struct Proc {
    /// The `proc.start` request whose id its events carry.
    pub events: u64,
    /// Its pid in the sandbox.
    pub pid: u32,
    /// Its tag.
    pub tag: Option<String>,
    /// What it runs.
    pub argv: Vec<String>,
    /// Its working directory.
    pub cwd: String,
    /// Its extra environment.
    pub env: BTreeMap<String, String>,
    /// Whether it was given a stdin pipe (or a terminal).
    pub takes_input: bool,
    slot: Arc<Slot>,
    /// The terminal's master (resize), with its current size.
    terminal: Option<(Arc<OwnedFd>, Mutex<PtySize>)>,
    /// Where input goes (stdin pipe's write end, or the terminal's master); `None` once closed.
    input: Mutex<Option<Arc<OwnedFd>>>,
    /// Serializes writers, so two inputs never interleave.
    writing: Mutex<()>,
}

impl Proc {
    fn listed(&self) -> LiveProcess {
        LiveProcess {
            pid: self.pid,
            tag: self.tag.clone(),
            events: self.events,
            argv: self.argv.clone(),
            cwd: self.cwd.clone(),
            env: self.env.clone(),
            pty: self
                .terminal
                .as_ref()
                .map(|(_, size)| *size.lock().unwrap_or_else(PoisonError::into_inner)),
            stdin: self.takes_input,
        }
    }
}

#[derive(Default)]
struct Table {
    by_pid: HashMap<u32, Arc<Proc>>,
    /// Processes being started (counted against the bound) and their tags.
    starting: usize,
    starting_tags: HashSet<String>,
}

/// The live processes of this executor.
#[derive(Default)]
pub struct Registry {
    table: Mutex<Table>,
    /// Supervising threads that have not sent their `end` yet (shutdown waits for them).
    supervising: Mutex<usize>,
    ended: Condvar,
}

/// A place held for a process being started; given back when dropped unless it was filled.
pub struct Reservation<'a> {
    registry: &'a Registry,
    tag: Option<String>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut table = self.registry.lock();
        table.starting = table.starting.saturating_sub(1);
        if let Some(tag) = &self.tag {
            table.starting_tags.remove(tag);
        }
    }
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds a place for one more process (and its tag), or says which bound refuses it.
    pub fn reserve(&self, limit: usize, tag: Option<&str>) -> OpResult<Reservation<'_>> {
        let mut table = self.lock();
        if table.by_pid.len() + table.starting >= limit {
            return Err(OpError::new(
                ErrorKind::LimitReached,
                format!(
                    "this sandbox already runs {limit} live processes (its limit); end one first"
                ),
            ));
        }
        if let Some(tag) = tag {
            if table.starting_tags.contains(tag)
                || table.by_pid.values().any(|p| p.tag.as_deref() == Some(tag))
            {
                return Err(OpError::new(
                    ErrorKind::AlreadyExists,
                    format!("a live process with tag '{tag}' already runs"),
                ));
            }
            table.starting_tags.insert(tag.to_owned());
        }
        table.starting += 1;
        Ok(Reservation {
            registry: self,
            tag: tag.map(str::to_owned),
        })
    }

    /// Fills a reservation with the started process.
    fn insert(&self, reservation: Reservation<'_>, process: Arc<Proc>) {
        self.lock().by_pid.insert(process.pid, process);
        drop(reservation);
    }

    /// Forgets an ended process (before its `end` event, so its tag is free by then).
    fn remove(&self, pid: u32) {
        self.lock().by_pid.remove(&pid);
    }

    /// The live process with this pid.
    pub fn get(&self, pid: u32) -> OpResult<Arc<Proc>> {
        self.lock().by_pid.get(&pid).cloned().ok_or_else(|| {
            OpError::new(
                ErrorKind::NotFound,
                format!(
                    "no live process has pid {pid} (it ended, or was not started by proc.start)"
                ),
            )
        })
    }

    /// A supervising thread is about to start.
    fn supervisor_starts(&self) {
        *self
            .supervising
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += 1;
    }

    /// A supervising thread sent its `end` (or never started).
    fn supervisor_ended(&self) {
        let mut supervising = self
            .supervising
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *supervising = supervising.saturating_sub(1);
        self.ended.notify_all();
    }

    /// Waits until every live process has sent its `end`, or `limit` passed; how many have not.
    pub fn wait_ended(&self, limit: Duration) -> usize {
        let supervising = self
            .supervising
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *self
            .ended
            .wait_timeout_while(supervising, limit, |running| *running > 0)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }

    /// Every live process, by pid.
    pub fn list(&self) -> LiveListResult {
        let mut processes: Vec<LiveProcess> =
            self.lock().by_pid.values().map(|p| p.listed()).collect();
        processes.sort_by_key(|p| p.pid);
        LiveListResult { processes }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_count_against_the_bound_and_tags_are_unique() {
        let registry = Registry::default();
        let first = registry.reserve(2, Some("a")).expect("first");
        let dup = registry.reserve(2, Some("a")).err().expect("same tag");
        assert_eq!(dup.kind, ErrorKind::AlreadyExists);
        let second = registry.reserve(2, None).expect("second");
        let full = registry
            .reserve(2, Some("b"))
            .err()
            .expect("over the bound");
        assert_eq!(full.kind, ErrorKind::LimitReached);
        assert!(
            full.message.contains("2 live processes"),
            "{}",
            full.message
        );
        // A start that failed gives its place and its tag back.
        drop(first);
        let again = registry.reserve(2, Some("a")).expect("room and tag again");
        drop((second, again));
        assert_eq!(registry.lock().starting, 0);
        assert!(registry.lock().starting_tags.is_empty());
    }

    #[test]
    fn unknown_pids_are_not_found() {
        let e = Registry::default().get(42).err().expect("nothing runs");
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(Registry::default().list().processes.is_empty());
    }
}
