//! The fork server ("zygote"): a small single-threaded process that makes the sub-reapers.
//!
//! Why: every `cmd.run` needs a sub-reaper (`subreaper.rs`), a copy of the executor. Forking the
//! executor itself, a multi-threaded process with dozens of request threads, copies its page
//! tables, write-protects all of its memory and shoots down every CPU's TLB, and every later
//! write of any thread takes a copy-on-write fault: under load that was the largest CPU cost of
//! a `cmd.run` (about 1.1 ms of CPU per call, in the request threads). A process forked from the
//! executor at start, before any thread exists, and idle since, is cheap to fork: few page
//! tables, one thread, nothing to shoot down.
//!
//! How:
//!
//! * [`ForkServer::start`] runs on the executor's main thread before the reaper or any request
//!   thread exists (so after the privilege drop: the server inherits the reduced capabilities,
//!   no-new-privs, the non-dumpable flag and the sandbox user's fsuid). Its only link to the
//!   executor is an inherited `socketpair(AF_UNIX, SOCK_SEQPACKET)`: no path, no abstract name,
//!   nothing another process can connect to. It points its standard streams at `/dev/null`,
//!   closes every other descriptor, blocks every signal, dies with the executor's main thread
//!   (`PR_SET_PDEATHSIG`), and exits when the executor's end of the socket closes.
//! * Per command the executor sends one message: the [`Plan`] as JSON and, by `SCM_RIGHTS`, the
//!   status, stdout and stderr write ends, the working directory, the Landlock ruleset and the
//!   program's directory. The server clones with `CLONE_VM | CLONE_PARENT | SIGCHLD`, so the
//!   sub-reaper shares the server's memory (no page tables copied, nothing unmapped when it
//!   ends: see `Running::clone_subreaper`) and its parent is the **executor**, which reaps,
//!   signals and waits for it exactly as when it forked it itself (`children.rs`); the server
//!   answers with the pid or an errno. The server keeps each sub-reaper's stack and prepared
//!   launch until the kernel zeroes the sub-reaper's word at its exit (`CLONE_CHILD_CLEARTID`),
//!   and the command's likewise while it borrows that stack before its `exec`. The exchange runs
//!   outside the children registry's lock (`Children::spawn_with`), so the reaper and other
//!   commands are never held up behind it; a sub-reaper that exits before its pid is registered
//!   is kept by the reaper as an early exit. A mutex here keeps one request on the socket at a
//!   time (one clone of a small process is quick, so one channel is enough).
//! * The child runs nothing but the sub-reaper body ([`subreaper::run`]), with the
//!   ruleset as a descriptor enforced by `landlock_restrict_self` (`confine::enforce`); how much
//!   is enforced was computed by the executor from the kernel's ABI (`confine::enforcement_for`).
//!   The server itself is never confined and never runs a command.
//!
//! Who can reach it: commands run as the sandbox user without capabilities, in a Landlock domain
//! scoped for signals; the server is root, not dumpable and outside every domain, so a command
//! can neither signal nor trace it (EPERM), and it holds no descriptor a command could inherit.
//!
//! When it is gone (killed, or it failed to start), the executor logs it once and forks the
//! sub-reaper from the handler thread as before ([`SpawnError::Unavailable`]); so does a request
//! too large for one message ([`MAX_MESSAGE`]: an argv and environment that large are rare).
//! Should the server die between its clone and its answer, the executor cannot tell whether a
//! sub-reaper was made: that request fails (`spawn_failed`) rather than risk starting the
//! command twice, and such a sub-reaper, unknown to the registry, is reaped as an orphan.

use std::ffi::CStr;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::{
    recvmsg, sendmsg, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags,
    ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use rustix::process::{Pid, Signal};
use serde::{Deserialize, Serialize};

use crate::protocol::Enforcement;
use crate::spawn::confine;
use crate::spawn::subreaper::{self, Child, Plan};

/// Largest request sent to the server; a larger plan is forked directly. Well below the
/// socket's send buffer (about 200 KiB by default), which bounds one `SOCK_SEQPACKET` message.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Descriptors per request: status, stdout, stderr, cwd, ruleset, program directory, stdin.
const MAX_FDS: usize = 7;
/// How long the executor waits for the server's answer before giving it up (it answers in
/// microseconds; only a stopped or wedged server takes this long).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// The server's name in `/proc/PID/comm` (its sub-reapers take the executor's name back).
const SERVER_NAME: &CStr = c"fork-server";

/// What the executor sends, beside the descriptors.
#[derive(Serialize)]
struct Request<'a> {
    plan: &'a Plan,
    enforcement: Enforcement,
    /// A ruleset descriptor follows cwd (none without Landlock).
    ruleset: bool,
    /// A program directory descriptor comes next.
    program_dir: bool,
    /// A stdin descriptor comes last.
    stdin: bool,
}

/// [`Request`] as the server reads it.
#[derive(Deserialize)]
struct Received {
    plan: Plan,
    enforcement: Enforcement,
    ruleset: bool,
    program_dir: bool,
    stdin: bool,
}

/// Why [`ForkServer::spawn`] made no sub-reaper.
#[derive(Debug)]
pub enum SpawnError {
    /// The server is gone or cannot take this request; nothing was started: fork directly.
    Unavailable,
    /// The request reached the server and failed (its `clone`, or the server died during the
    /// request): report it, do not retry.
    Failed(io::Error),
}

/// The executor's handle on its fork server.
pub struct ForkServer {
    link: Mutex<Option<Link>>,
}

struct Link {
    socket: OwnedFd,
    pid: Pid,
}

impl ForkServer {
    /// Forks the server. Must run while the executor is single-threaded (see the module doc).
    pub fn start() -> io::Result<ForkServer> {
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        for timeout in [
            rustix::net::sockopt::Timeout::Recv,
            rustix::net::sockopt::Timeout::Send,
        ] {
            rustix::net::sockopt::set_socket_timeout(&ours, timeout, Some(REPLY_TIMEOUT))?;
        }
        let executor = rustix::process::getpid();
        // The sub-reapers take this name back from the server's.
        let name = rustix::thread::name().unwrap_or_default();
        // SAFETY: the process has one thread, so the child inherits no lock held elsewhere; the
        // child runs `serve`, which never returns into the caller's frames.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()),
            0 => {
                drop(ours);
                serve(theirs, executor, &name)
            }
            pid => {
                drop(theirs);
                let pid = Pid::from_raw(pid)
                    .ok_or_else(|| io::Error::other("fork returned an invalid pid"))?;
                Ok(ForkServer {
                    link: Mutex::new(Some(Link { socket: ours, pid })),
                })
            }
        }
    }

    /// No server: every sub-reaper is forked directly (when [`ForkServer::start`] failed).
    pub fn disabled() -> ForkServer {
        ForkServer {
            link: Mutex::new(None),
        }
    }

    /// The server's pid while it serves.
    pub fn pid(&self) -> Option<Pid> {
        self.lock().as_ref().map(|link| link.pid)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Link>> {
        self.link.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Has the server clone a sub-reaper for `child`, whose parent is this process; its pid.
    /// The caller keeps `child` (its descriptors were copied to the server) and drops it after.
    pub fn spawn(&self, child: &Child) -> Result<Pid, SpawnError> {
        let mut link = self.lock();
        let Some(current) = link.as_ref() else {
            return Err(SpawnError::Unavailable);
        };
        let message = serde_json::to_vec(&Request {
            plan: &child.plan,
            enforcement: child.ruleset.enforcement,
            ruleset: child.ruleset.fd.is_some(),
            program_dir: child.program_dir.is_some(),
            stdin: child.stdin.is_some(),
        })
        .map_err(|_| SpawnError::Unavailable)?;
        if message.len() > MAX_MESSAGE {
            return Err(SpawnError::Unavailable);
        }
        let mut fds: Vec<BorrowedFd<'_>> = vec![
            child.status.as_fd(),
            child.stdout.as_fd(),
            child.stderr.as_fd(),
            child.cwd.as_fd(),
        ];
        fds.extend(child.ruleset.fd.as_ref().map(AsFd::as_fd));
        fds.extend(child.program_dir.as_deref().map(AsFd::as_fd));
        fds.extend(child.stdin.as_ref().map(AsFd::as_fd));
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(SpawnError::Unavailable);
        }
        match sendmsg(
            &current.socket,
            &[IoSlice::new(&message)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(sent) if sent == message.len() => {}
            // Nothing was received, so nothing was started.
            Ok(sent) => {
                lose(
                    &mut link,
                    &format!("it took {sent} of {} bytes", message.len()),
                );
                return Err(SpawnError::Unavailable);
            }
            Err(errno) => {
                lose(&mut link, &format!("cannot send to it: {errno}"));
                return Err(SpawnError::Unavailable);
            }
        }
        let mut reply = [0u8; 4];
        let answer = loop {
            match rustix::io::read(&current.socket, &mut reply) {
                Err(Errno::INTR) => {}
                other => break other,
            }
        };
        let why = match answer {
            Ok(4) => {
                let value = i32::from_ne_bytes(reply);
                return match Pid::from_raw(value) {
                    Some(pid) => Ok(pid),
                    None => Err(SpawnError::Failed(io::Error::from_raw_os_error(
                        value.checked_neg().filter(|e| *e > 0).unwrap_or(libc::EIO),
                    ))),
                };
            }
            Ok(0) => "it ended during a request".to_owned(),
            Ok(n) => format!("it answered {n} bytes"),
            Err(Errno::AGAIN) => {
                // Stopped or wedged: make sure it is gone before forgetting it.
                let _ = rustix::process::kill_process(current.pid, Signal::KILL);
                format!("it did not answer within {REPLY_TIMEOUT:?}")
            }
            Err(errno) => format!("reading its answer failed: {errno}"),
        };
        lose(&mut link, &why);
        Err(SpawnError::Failed(io::Error::other(format!(
            "the fork server failed during the request ({why})"
        ))))
    }
}

/// Forgets the server (closing our end ends it, if it still runs) and says so, once.
fn lose(link: &mut Option<Link>, why: &str) {
    if let Some(gone) = link.take() {
        crate::log_event!(
            "fork server pid {} is gone ({why}); forking sub-reapers directly from now on",
            gone.pid.as_raw_pid()
        );
    }
}

/// The server's life: set-up, then one request at a time until the executor's end closes.
fn serve(socket: OwnedFd, executor: Pid, name: &CStr) -> ! {
    let code = catch_unwind(AssertUnwindSafe(|| {
        if !isolate(&socket, executor) {
            return 1;
        }
        serve_requests(&socket, name)
    }))
    .unwrap_or(1);
    // SAFETY: ends this process at once, without running the executor's exit handlers.
    unsafe { libc::_exit(code) }
}

/// Cuts the server off from everything but its socket (see the module doc); false if the
/// executor is already gone or a step failed.
fn isolate(socket: &OwnedFd, executor: Pid) -> bool {
    if rustix::process::set_parent_process_death_signal(Some(Signal::KILL)).is_err()
        || rustix::process::getppid() != Some(executor)
    {
        return false;
    }
    if rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .is_err()
    {
        return false;
    }
    // SAFETY: fills a local set and makes it this (single-threaded) process's signal mask;
    // SIGKILL and SIGSTOP cannot be blocked, everything else waits (nothing is ever delivered:
    // the sub-reapers set their own mask first thing).
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
    }
    let Ok(null) = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) else {
        return false;
    };
    for target in 0..=2 {
        // SAFETY: dup2 onto the standard descriptors of this single-threaded process.
        if unsafe { libc::dup2(null.as_raw_fd(), target) } < 0 {
            return false;
        }
    }
    drop(null);
    subreaper::close_all_but(&[Some(socket.as_raw_fd())]);
    let _ = rustix::thread::set_name(SERVER_NAME);
    true
}

/// Answers requests until the executor's end closes; the exit code.
fn serve_requests(socket: &OwnedFd, name: &CStr) -> i32 {
    let mut buffer = vec![0u8; MAX_MESSAGE];
    let mut running = Running::default();
    loop {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = match recvmsg(
            socket,
            &mut [IoSliceMut::new(&mut buffer)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(received) => received,
            Err(Errno::INTR) => continue,
            Err(_) => return 1,
        };
        let mut fds: Vec<OwnedFd> = Vec::with_capacity(MAX_FDS);
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = message {
                fds.extend(rights);
            }
        }
        if received.bytes == 0 && fds.is_empty() {
            return 0; // the executor closed its end
        }
        running.sweep();
        let answer = if received
            .flags
            .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC)
        {
            -libc::EMSGSIZE
        } else {
            match child_from(&buffer[..received.bytes.min(buffer.len())], fds) {
                Some(child) => running.clone_subreaper(child, socket, name),
                None => -libc::EINVAL,
            }
        };
        match rustix::net::send(socket, &answer.to_ne_bytes(), SendFlags::NOSIGNAL) {
            Ok(_) => {}
            Err(_) => return 1,
        }
    }
}

/// Stack of a sub-reaper (it runs [`subreaper::run`], which keeps its buffers on the stack:
/// the command's own start-up stack, a handshake line and a directory listing), beside a guard
/// page below it.
const SUBREAPER_STACK: usize = 256 * 1024;
/// The guard page under each stack: an overflow faults instead of writing another's memory.
const GUARD: usize = 4096;

/// Stacks kept for reuse once their sub-reaper has ended: a fresh mapping costs a zero-filled
/// page fault for each page touched and an unmapping at the end, per command.
const KEPT_STACKS: usize = 16;

/// The sub-reapers that share this process's memory, and what they read in it.
#[derive(Default)]
struct Running {
    subreapers: Vec<Shared>,
    /// Stacks of ended sub-reapers, ready for the next ones (at most [`KEPT_STACKS`]).
    spare: Vec<Stack>,
}

/// One sub-reaper's share of this process's memory: its stack and its [`subreaper::Launch`],
/// kept until the kernel says it is gone.
struct Shared {
    /// Set non-zero before the clone; the kernel zeroes it when the sub-reaper has exited
    /// (`CLONE_CHILD_CLEARTID`), and only then are its stack and launch freed.
    alive: Box<AtomicI32>,
    stack: Stack,
    /// Read by the sub-reaper; freed with it. Its `command_borrowing` word is the command's
    /// likewise: while the command borrows the stack before its `exec` (its sub-reaper killed
    /// mid-start, say), the stack stays.
    launch: Box<subreaper::Launch>,
}

impl Shared {
    fn gone(&self) -> bool {
        self.alive.load(Ordering::Acquire) == 0
            && self.launch.command_borrowing.load(Ordering::Acquire) == 0
    }
}

/// An anonymous mapping with a guard page at its low end.
struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

impl Stack {
    fn map(size: usize) -> io::Result<Stack> {
        let len = size + GUARD;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it yet.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Stack { base, len };
        // SAFETY: the lowest page of the mapping we own.
        if unsafe { libc::mprotect(base, GUARD, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The initial stack pointer (the stack grows down), 16-byte aligned.
    fn top(&self) -> *mut libc::c_void {
        ((self.base as usize + self.len) & !15) as *mut libc::c_void
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used by anyone (see `Running::sweep`).
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

impl Running {
    /// Frees what the sub-reapers that have exited used.
    fn sweep(&mut self) {
        let mut index = 0;
        while index < self.subreapers.len() {
            if self.subreapers[index].gone() {
                let ended = self.subreapers.swap_remove(index);
                if self.spare.len() < KEPT_STACKS {
                    self.spare.push(ended.stack);
                }
            } else {
                index += 1;
            }
        }
    }

    /// Clones the sub-reaper as a child of the executor that shares this process's memory;
    /// its pid, or `-errno`.
    ///
    /// Why shared memory: a forked sub-reaper copies this process's page tables, faults in
    /// every page it touches, and unmaps all of it when it exits; on virtual machines, where
    /// each page-table change is costly, that was a fifth of a `cmd.run`'s CPU. A clone with
    /// `CLONE_VM` does none of it. It is still its own process (own descriptors, working
    /// directory, credentials, Landlock domain, signal handling, sub-reaper status); it only
    /// reads its [`subreaper::Launch`] and writes its own stack, and allocates nothing
    /// (`subreaper::run`), so this process's single-threaded allocator is never raced.
    fn clone_subreaper(&mut self, child: Child, socket: &OwnedFd, name: &CStr) -> i32 {
        let stack = match self
            .spare
            .pop()
            .map_or_else(|| Stack::map(SUBREAPER_STACK), Ok)
        {
            Ok(stack) => stack,
            Err(e) => return -e.raw_os_error().unwrap_or(libc::ENOMEM),
        };
        let launch = Box::new(subreaper::Launch::prepare(
            &child,
            Some(socket.as_raw_fd()),
            (!name.is_empty()).then(|| name.to_owned()),
        ));
        let alive = Box::new(AtomicI32::new(1));
        // SAFETY: the child starts in `enter` on its own stack and reads `launch`, both kept
        // alive until the kernel zeroes `alive` at its exit (`sweep`); it never returns from
        // `enter` (it ends with `exit_group`). CLONE_PARENT makes it the executor's child, as
        // a fork of this server was.
        let pid = unsafe {
            libc::clone(
                enter,
                stack.top(),
                libc::CLONE_VM | libc::CLONE_PARENT | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD,
                std::ptr::from_ref::<subreaper::Launch>(&launch) as *mut libc::c_void,
                std::ptr::null_mut::<libc::pid_t>(),
                std::ptr::null_mut::<libc::c_void>(),
                alive.as_ptr(),
            )
        };
        if pid < 0 {
            // `errno` is shared with the sub-reapers, which never write it (their calls report
            // errors as values) but for a failed clone of a command: read at once.
            let errno = io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            self.spare.push(stack);
            return -errno;
        }
        // Our copies of the descriptors; the sub-reaper has its own.
        drop(child);
        self.subreapers.push(Shared {
            alive,
            stack,
            launch,
        });
        pid
    }
}

/// Where a sub-reaper cloned by [`Running::clone_subreaper`] starts.
extern "C" fn enter(launch: *mut libc::c_void) -> libc::c_int {
    // SAFETY: the `Launch` the server keeps until this process has exited.
    let launch = unsafe { &*(launch as *const subreaper::Launch) };
    subreaper::run(launch)
}

/// The sub-reaper's [`Child`] from one request; `None` for a malformed one (its descriptors
/// are closed).
fn child_from(bytes: &[u8], fds: Vec<OwnedFd>) -> Option<Child> {
    let received: Received = serde_json::from_slice(bytes).ok()?;
    let expected = 4
        + usize::from(received.ruleset)
        + usize::from(received.program_dir)
        + usize::from(received.stdin);
    if fds.len() != expected {
        return None;
    }
    let mut fds = fds.into_iter();
    let (status, stdout, stderr, cwd) = (fds.next()?, fds.next()?, fds.next()?, fds.next()?);
    let ruleset = if received.ruleset { fds.next() } else { None };
    let program_dir = if received.program_dir {
        Some(Arc::new(fds.next()?))
    } else {
        None
    };
    let stdin = if received.stdin { fds.next() } else { None };
    Some(Child {
        plan: received.plan,
        ruleset: confine::Prepared {
            fd: ruleset,
            enforcement: received.enforcement,
        },
        program_dir,
        cwd,
        stdout,
        stderr,
        status,
        stdin,
    })
}
