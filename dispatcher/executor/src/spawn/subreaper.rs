//! The sub-reaper: one per command, so that nothing a command starts outlives its call.
//!
//! For every `cmd.run` the executor asks its fork server (`forkserver.rs`) for a child; that
//! child (this module, never returning) is the command's sub-reaper, and its parent is the
//! executor (`CLONE_PARENT`), which reaps, signals and waits for it. The server clones it with
//! `CLONE_VM`: it is a process of its own (descriptors, working directory, credentials, Landlock
//! domain, signal mask, sub-reaper status) that shares the server's memory, so making it copies
//! no page tables, and ending it unmaps nothing (on virtual machines, where each page-table
//! change is costly, the copy, the faults after it and the unmapping at exit were a fifth of a
//! `cmd.run`'s CPU). Should the fork server be gone, the handler thread forks the sub-reaper
//! itself (the fallback, [`run_forked`]). Either way it is the executor's code, not a new
//! program: starting a static binary again costs more (on virtual machines every start of the
//! C library traps on `cpuid` a few dozen times). It runs as root with the executor's three
//! capabilities (SETUID, SETGID, KILL), not dumpable, so commands (the sandbox user) can
//! neither signal nor trace it.
//!
//! Sharing memory sets the rules of this module: everything is prepared by the parent
//! ([`Launch`]); the sub-reaper **allocates and frees nothing** (the server's allocator believes
//! it is alone), keeps its buffers on its own stack, makes its system calls through rustix or
//! `sys.rs` (never reading the C library's `errno`, which is shared too), touches no lock, no
//! standard stream and no logging, and ends with `exit_group`. Then it:
//!
//! 1. blocks the signals it waits for, marks itself `PR_SET_CHILD_SUBREAPER` (every orphan of
//!    the command's process tree is re-parented to it instead of escaping to PID 1: `setsid`
//!    and double forks included), enters the working directory the executor opened, and
//!    closes every descriptor it inherited but its own (so no other command's pipe is held);
//! 2. confines itself with the command's Landlock domain (built by the executor, `confine.rs`,
//!    and received as a descriptor), which the command inherits and cannot leave;
//! 3. starts the command (`vfork.rs`) as the sandbox user in its own process group, its stdout
//!    and stderr being the executor's pipes, and reports `started` (or why not) on the status
//!    pipe;
//! 4. waits for signals: SIGCHLD (reap), SIGTERM from the executor (passed on to the command's
//!    group), SIGUSR1 from the executor (kill the whole tree now);
//! 5. when the command's leader exits, kills every process left in its tree, generation by
//!    generation as they are re-parented to it, reaps them, and exits with the leader's status
//!    (the same exit code, or killed by the same signal), which is what the executor reports.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicI32;
use std::sync::Arc;

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions, WaitOptions};
use serde::{Deserialize, Serialize};

use crate::protocol::{Enforcement, ErrorKind};
use crate::spawn::sys::{self, ErrnoText, FixedText};
use crate::spawn::{confine, vfork};

/// Signal the executor sends to make the sub-reaper kill the whole tree at once.
pub const KILL_TREE: Signal = Signal::USR1;
/// Most kill-and-reap rounds before giving up on a tree that keeps growing.
const MAX_ROUNDS: usize = 10_000;
/// Exit code of a sub-reaper that failed before the command ran (it reported why).
const FAILED_BEFORE_START: i32 = 127;

/// Everything the sub-reaper needs to start and confine one command (sent to the fork server as
/// JSON, beside the descriptors of [`Child`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    /// Absolute path of the program.
    pub program: String,
    /// The full argv (`argv[0]` is the bare name).
    pub argv: Vec<String>,
    /// The working directory as the caller named it (for error messages).
    pub cwd_display: String,
    /// The complete environment.
    pub env: Vec<(String, String)>,
    /// The sandbox user.
    pub uid: u32,
    /// The sandbox group.
    pub gid: u32,
    /// Execution is restricted to granted files (for the error message of a refused exec).
    pub exec_restricted: bool,
    /// Refuse to start the command when the kernel enforced nothing.
    pub require_landlock: bool,
    /// stdin, stdout and stderr are a terminal's slave: start a session with it as the
    /// controlling terminal.
    #[serde(default)]
    pub pty: bool,
}

/// What the forked sub-reaper owns: the plan, the Landlock ruleset and four or five descriptors.
pub struct Child {
    /// The command to start.
    pub plan: Plan,
    /// The command's Landlock domain, built by the executor.
    pub ruleset: confine::Prepared,
    /// The program's directory, opened `O_PATH` (the program is executed from it: no path walk).
    pub program_dir: Option<Arc<OwnedFd>>,
    /// The working directory (opened beneath its root by the executor).
    pub cwd: OwnedFd,
    /// Write end of the command's stdout pipe.
    pub stdout: OwnedFd,
    /// Write end of the command's stderr pipe.
    pub stderr: OwnedFd,
    /// Write end of the status pipe: one [`Handshake`] line.
    pub status: OwnedFd,
    /// The command's stdin (a live process's pipe or terminal); `/dev/null` when `None`.
    pub stdin: Option<OwnedFd>,
}

/// The one line the sub-reaper writes on its status descriptor.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Handshake {
    /// The command runs with this pid, confined this much.
    Started {
        /// The command's pid (also its process group).
        pid: i32,
        /// What the kernel enforced.
        landlock: Enforcement,
    },
    /// The command was not started.
    Failed {
        /// Why, as an error kind.
        kind: ErrorKind,
        /// Why, for humans.
        message: String,
    },
}

/// Everything a sub-reaper reads, prepared by its parent before the clone, so that the
/// sub-reaper allocates nothing and frees nothing: it may share its memory with the fork
/// server and the other sub-reapers (`forkserver.rs`), whose allocator does not know of it.
/// The descriptors are numbers in the sub-reaper's own table; whoever prepared this closes its
/// own copies (the [`Child`]) right after the clone.
pub struct Launch {
    /// The command, or why it cannot be prepared (a NUL byte).
    command: Result<vfork::Prepared, &'static str>,
    name: String,
    argv_empty: bool,
    program: String,
    cwd_display: String,
    exec_restricted: bool,
    require_landlock: bool,
    enforcement: Enforcement,
    status: RawFd,
    cwd: RawFd,
    ruleset: Option<RawFd>,
    program_dir: Option<RawFd>,
    stdout: RawFd,
    stderr: RawFd,
    stdin: Option<RawFd>,
    /// A descriptor of the parent's to close first thing (the fork server's socket: its death
    /// must be seen by the executor even while a sub-reaper starts).
    close_first: Option<RawFd>,
    /// The name to take (`/proc/PID/comm`): a clone of the fork server takes the executor's.
    comm: Option<CString>,
    /// The command's thread id while it borrows this sub-reaper's memory and stack (set by the
    /// kernel when it is made, zeroed when it has exec'd or died; see `vfork::launch`).
    pub command_borrowing: AtomicI32,
}

impl Launch {
    /// Prepares `child`'s command; `close_first` is closed first thing in the sub-reaper.
    pub fn prepare(child: &Child, close_first: Option<RawFd>, comm: Option<CString>) -> Launch {
        let plan = &child.plan;
        let program_dir = child.program_dir.as_deref().map(AsRawFd::as_raw_fd);
        let command = vfork::Prepared::new(&vfork::Command {
            program: &plan.program,
            at: program_dir
                .zip(plan.program.rsplit_once('/'))
                .map(|(fd, (_, name))| (fd, name)),
            argv: &plan.argv,
            env: &plan.env,
            uid: plan.uid,
            gid: plan.gid,
            stdout: child.stdout.as_raw_fd(),
            stderr: child.stderr.as_raw_fd(),
            stdin: child.stdin.as_ref().map(AsRawFd::as_raw_fd),
            session: plan.pty,
        })
        .map_err(|_| "a NUL byte");
        Launch {
            command,
            name: plan.argv.first().cloned().unwrap_or_default(),
            argv_empty: plan.argv.is_empty(),
            program: plan.program.clone(),
            cwd_display: plan.cwd_display.clone(),
            exec_restricted: plan.exec_restricted,
            require_landlock: plan.require_landlock,
            enforcement: child.ruleset.enforcement,
            status: child.status.as_raw_fd(),
            cwd: child.cwd.as_raw_fd(),
            ruleset: child.ruleset.fd.as_ref().map(AsRawFd::as_raw_fd),
            program_dir,
            stdout: child.stdout.as_raw_fd(),
            stderr: child.stderr.as_raw_fd(),
            stdin: child.stdin.as_ref().map(AsRawFd::as_raw_fd),
            close_first,
            comm,
            command_borrowing: AtomicI32::new(0),
        }
    }
}

/// The body of a sub-reaper forked from the executor (the fallback without a fork server):
/// points the standard streams, the executor's protocol stream, at `/dev/null`, then [`run`].
pub fn run_forked(launch: &Launch) -> ! {
    // Forked from the multi-threaded executor: the C library's allocator is safe after `fork`
    // (and this process has its own copy of the memory).
    if !(0..=2).all(sys::is_dev_null) {
        let Ok(null) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        else {
            report_failed(
                launch.status,
                ErrorKind::SpawnFailed,
                format_args!("cannot open /dev/null"),
            );
            sys::exit_group(FAILED_BEFORE_START)
        };
        for target in 0..=2 {
            // SAFETY: dup2 onto the standard descriptors of this single-threaded process.
            unsafe {
                libc::dup2(null.as_raw_fd(), target);
            }
        }
        drop(null);
    }
    // A panic must never unwind out of here: back in the caller's frames this child would go
    // on running the executor's code.
    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| supervise_command(launch)))
        .unwrap_or(FAILED_BEFORE_START);
    sys::exit_group(code)
}

/// The sub-reaper: never returns (the process ends with the command's status, or 127 after
/// reporting why the command did not start). Its standard streams must be `/dev/null`. It
/// allocates nothing, frees nothing and reads no `errno` (see [`Launch`]). Called from an
/// `extern "C"` entry, so a panic (there is none by design) aborts this process rather than
/// unwinding into the fork server's frames.
pub fn run(launch: &Launch) -> ! {
    sys::exit_group(supervise_command(launch))
}

/// Closes one descriptor of this process.
fn close(fd: RawFd) {
    if let Ok(fd) = u32::try_from(fd) {
        sys::close_range(fd, fd);
    }
}

fn supervise_command(l: &Launch) -> i32 {
    if let Some(fd) = l.close_first {
        close(fd);
    }
    if let Some(comm) = &l.comm {
        let _ = rustix::thread::set_name(comm);
    }
    let watched = sys::sigset_of(&[libc::SIGCHLD, libc::SIGTERM, libc::SIGUSR1]);
    let _ = sys::sigprocmask(libc::SIG_SETMASK, &watched);
    let fail = |kind: ErrorKind, message: std::fmt::Arguments<'_>| {
        report_failed(l.status, kind, message);
        FAILED_BEFORE_START
    };

    // gVisor (runsc 2022) lets only its init process be a sub-reaper and answers EINVAL to any
    // other: there the command's orphans go to the executor (PID 1), which reaps them, and live
    // on in the sandbox after the call (ARCHITECTURE.md, "The gVisor class"). Any other error
    // fails the command as before. (Linux answers EINVAL to this call only on kernels before
    // 3.4, which have no sub-reapers either.)
    let marked = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
    if let Err(e) = marked.or_else(|e| {
        if e == rustix::io::Errno::INVAL {
            Ok(())
        } else {
            Err(e)
        }
    }) {
        return fail(
            ErrorKind::SpawnFailed,
            format_args!(
                "cannot become the command's sub-reaper: {}",
                ErrnoText(e.raw_os_error())
            ),
        );
    }
    // SAFETY: the working directory's descriptor, ours until closed just below.
    let cwd = unsafe { BorrowedFd::borrow_raw(l.cwd) };
    if let Err(e) = rustix::process::fchdir(cwd) {
        return fail(
            ErrorKind::SpawnFailed,
            format_args!(
                "cannot start the sub-reaper for '{}' in '{}': {}",
                l.name,
                l.cwd_display,
                ErrnoText(e.raw_os_error())
            ),
        );
    }
    close(l.cwd);
    let landlock = match l.ruleset {
        None => Enforcement::None,
        Some(ruleset) => {
            let enforced = confine::enforce(ruleset);
            close(ruleset);
            if let Err((step, e)) = enforced {
                return fail(
                    ErrorKind::SpawnFailed,
                    format_args!(
                        "cannot confine the command with Landlock: {step}: {}",
                        ErrnoText(e)
                    ),
                );
            }
            l.enforcement
        }
    };
    // The ruleset's descriptor is closed by now; nothing else inherited stays open.
    let keep = [
        Some(l.status),
        Some(l.stdout),
        Some(l.stderr),
        l.program_dir,
        l.stdin,
    ];
    close_all_but(&keep);
    if landlock == Enforcement::None && l.require_landlock {
        return fail(
            ErrorKind::SpawnFailed,
            format_args!(
                "the kernel enforces no Landlock rules here and this sandbox requires them; \
                 the command was not started"
            ),
        );
    }
    if l.argv_empty {
        return fail(ErrorKind::InvalidRequest, format_args!("argv is empty"));
    }
    let spawned = match &l.command {
        Ok(command) => {
            let mut stack = [std::mem::MaybeUninit::<u8>::uninit(); vfork::CHILD_STACK];
            vfork::launch(command, None, &mut stack, &l.command_borrowing).map_err(ErrnoText)
        }
        Err(why) => {
            return fail(
                ErrorKind::SpawnFailed,
                format_args!("cannot start '{}' ({}): {why}", l.name, l.program),
            )
        }
    };
    // Our copies of the output pipes (and of a terminal) would keep them open after the
    // command's tree is gone.
    for fd in [Some(l.stdout), Some(l.stderr), l.stdin, l.program_dir]
        .into_iter()
        .flatten()
    {
        close(fd);
    }
    let leader = match spawned {
        Ok(pid) => pid,
        Err(e) => {
            let (kind, why) = match e.0 {
                libc::ENOENT => (ErrorKind::CommandNotFound, ""),
                libc::EACCES | libc::EPERM if l.exec_restricted => (
                    ErrorKind::PermissionDenied,
                    " (the sandbox's kernel policy allows executing only the allowlisted \
                     programs; a script's interpreter must be allowlisted too)",
                ),
                libc::EACCES | libc::EPERM => (ErrorKind::PermissionDenied, ""),
                _ => (ErrorKind::SpawnFailed, ""),
            };
            return fail(
                kind,
                format_args!("cannot start '{}' ({}): {e}{why}", l.name, l.program),
            );
        }
    };
    report(
        l.status,
        &HandshakeLine::Started {
            pid: leader,
            landlock,
        },
    );
    close(l.status);

    let mut tree = Tree {
        leader,
        leader_status: None,
    };
    tree.supervise(&watched);
    tree.kill_all();
    // The leader is reaped by now; were it not (a tree that kept growing), report SIGKILL.
    exit_like(tree.leader_status.unwrap_or(libc::SIGKILL))
}

/// [`Handshake`] as the sub-reaper writes it: the message borrowed, not owned.
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum HandshakeLine<'a> {
    Started { pid: i32, landlock: Enforcement },
    Failed { kind: ErrorKind, message: &'a str },
}

/// Writes one handshake line on `status` (serde_json writes into the fixed buffer without
/// allocating).
fn report(status: RawFd, line: &HandshakeLine<'_>) {
    let mut text = FixedText::<{ 8 * 1024 }>::new();
    if serde_json::to_writer(&mut text, line).is_err() {
        return;
    }
    text.push(b"\n");
    // SAFETY: the status descriptor, ours until closed.
    let status = unsafe { BorrowedFd::borrow_raw(status) };
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        match rustix::io::write(status, rest) {
            Ok(0) | Err(_) => return,
            Ok(n) => rest = &rest[n..],
        }
    }
}

/// Reports why the command was not started.
fn report_failed(status: RawFd, kind: ErrorKind, message: std::fmt::Arguments<'_>) {
    let mut text = FixedText::<1024>::new(); // escaped, at most 6 KiB: the line fits
    let _ = std::fmt::Write::write_fmt(&mut text, message);
    report(
        status,
        &HandshakeLine::Failed {
            kind,
            message: text.as_str(),
        },
    );
}

/// Closes every descriptor of this process except the standard ones and `keep`.
pub(crate) fn close_all_but(keep: &[Option<RawFd>]) {
    // Sorted in place, without allocating (see [`Launch`]).
    let mut sorted = [u32::MAX; 8];
    let mut count = 0;
    for fd in keep.iter().flatten() {
        if let Ok(fd) = u32::try_from(*fd) {
            if fd > 2 && count < sorted.len() {
                sorted[count] = fd;
                count += 1;
            }
        }
    }
    let sorted = &mut sorted[..count];
    sorted.sort_unstable();
    let mut from = 3u32;
    for &fd in sorted.iter() {
        if fd > from {
            sys::close_range(from, fd - 1);
        }
        from = from.max(fd + 1);
    }
    sys::close_range(from, u32::MAX);
}

/// The command's process tree as the sub-reaper sees it: every reap goes through here, so the
/// leader's status is never lost, whoever collects it.
struct Tree {
    leader: i32,
    leader_status: Option<i32>,
}

impl Tree {
    /// Waits for the leader's exit, passing SIGTERM on and killing the tree on SIGUSR1.
    fn supervise(&mut self, watched: &sys::KernelSigset) {
        loop {
            self.reap(false);
            if self.leader_status.is_some() {
                return;
            }
            match sys::sigwait(watched) {
                Ok(libc::SIGTERM) => {
                    let _ = kill_group(self.leader, Signal::TERM);
                    let _ = kill_pid(self.leader, Signal::TERM);
                }
                Ok(libc::SIGUSR1) => self.kill_all(),
                _ => {}
            }
        }
    }

    /// Reaps exited children (the first wait blocking when `block`); false when there are none.
    fn reap(&mut self, block: bool) -> bool {
        let mut flags = if block {
            WaitOptions::empty()
        } else {
            WaitOptions::NOHANG
        };
        loop {
            match rustix::process::wait(flags) {
                // ECHILD: no children at all (EINTR cannot happen: signals are blocked).
                Err(_) => return false,
                Ok(None) => return true, // children remain, none exited yet
                Ok(Some((pid, status))) => {
                    if pid.as_raw_pid() == self.leader {
                        self.leader_status = Some(status.as_raw());
                    }
                }
            }
            flags = WaitOptions::NOHANG;
        }
    }

    /// True while this process has a child (running or not yet reaped).
    fn has_children(&self) -> bool {
        // WNOWAIT leaves any zombie to `reap`; ECHILD means none.
        rustix::process::waitid(
            WaitId::All,
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
        )
        .is_ok()
    }

    /// Kills the command's group and every process left under this sub-reaper, generation by
    /// generation as orphans are re-parented here, and reaps them all.
    fn kill_all(&mut self) {
        let me = rustix::process::getpid().as_raw_pid();
        for _ in 0..MAX_ROUNDS {
            // Every living descendant has a living ancestor chain up to here; with the leader
            // gone, no child means no descendant (the common case: skip the /proc scan).
            if !self.has_children() {
                return;
            }
            let _ = kill_group(self.leader, Signal::KILL);
            kill_children_of(me);
            if !self.reap(true) {
                return;
            }
        }
        // A tree still growing after MAX_ROUNDS: give up; the executor's reaper kills this
        // process group when it collects us.
    }
}

/// Sends SIGKILL to every process whose parent is `parent`, found in `/proc/<pid>/stat`
/// (read into fixed buffers: nothing allocated).
fn kill_children_of(parent: i32) {
    use rustix::fs::{Mode, OFlags};
    let Ok(proc_dir) = rustix::fs::open(
        c"/proc",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return;
    };
    let mut buffer = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut entries = rustix::fs::RawDir::new(&proc_dir, &mut buffer);
    while let Some(entry) = entries.next() {
        let Ok(entry) = entry else {
            return;
        };
        let name = entry.file_name().to_bytes();
        if name.is_empty() || !name.iter().all(u8::is_ascii_digit) || name.len() > 10 {
            continue;
        }
        let Some(pid) = std::str::from_utf8(name)
            .ok()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let mut path = [0u8; 24];
        path[..name.len()].copy_from_slice(name);
        path[name.len()..name.len() + 6].copy_from_slice(b"/stat\0");
        let Ok(path) = std::ffi::CStr::from_bytes_until_nul(&path) else {
            continue;
        };
        let Ok(stat) = rustix::fs::openat(
            &proc_dir,
            path,
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let mut text = [0u8; 1024];
        let Ok(read) = rustix::io::read(&stat, &mut text) else {
            continue;
        };
        if parent_in_stat(&text[..read]) == Some(parent) {
            let _ = kill_pid(pid, Signal::KILL);
        }
    }
}

/// The parent pid in a `/proc/<pid>/stat` line (`pid (comm) state ppid ...`; `comm` may hold
/// spaces and parentheses, so the fields are counted after the last `)`).
fn parent_in_stat(stat: &[u8]) -> Option<i32> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
}

fn kill_group(leader: i32, signal: Signal) -> rustix::io::Result<()> {
    let pid = Pid::from_raw(leader).ok_or(rustix::io::Errno::SRCH)?;
    rustix::process::kill_process_group(pid, signal)
}

fn kill_pid(pid: i32, signal: Signal) -> rustix::io::Result<()> {
    let pid = Pid::from_raw(pid).ok_or(rustix::io::Errno::SRCH)?;
    rustix::process::kill_process(pid, signal)
}

/// Ends this process the way the leader ended: same exit code, or killed by the same signal.
fn exit_like(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        return libc::WEXITSTATUS(status);
    }
    let signal = libc::WTERMSIG(status);
    // Reset the signal to its default action, unblock it and send it to this process; if that
    // does not end the process (a signal whose default is to ignore), we exit with 128 + signal.
    // `kill(getpid())` rather than `raise`: a sub-reaper comes from a raw `clone`, so the C
    // library's idea of its thread id is stale.
    let _ = sys::default_action(signal);
    let _ = sys::sigprocmask(libc::SIG_UNBLOCK, &sys::sigset_of(&[signal]));
    let me = rustix::process::getpid().as_raw_pid();
    // SAFETY: kill takes two integers; it touches no memory.
    let _ = unsafe { sys::call(libc::SYS_kill, [me as usize, signal as usize, 0, 0, 0, 0]) };
    128 + signal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_pid_is_read_after_the_command_name() {
        assert_eq!(parent_in_stat(b"42 (sh) S 7 42 42 0"), Some(7));
        assert_eq!(parent_in_stat(b"42 (a) b) (c) R 9 1 1"), Some(9));
        assert_eq!(parent_in_stat(b"garbage"), None);
    }

    #[test]
    fn the_borrowed_handshake_line_reads_back_as_the_handshake() {
        let mut text = FixedText::<512>::new();
        serde_json::to_writer(
            &mut text,
            &HandshakeLine::Failed {
                kind: ErrorKind::CommandNotFound,
                message: "cannot start 'a\"b' (/x): No such file or directory (os error 2)",
            },
        )
        .unwrap();
        match serde_json::from_slice::<Handshake>(text.as_bytes()).unwrap() {
            Handshake::Failed { kind, message } => {
                assert_eq!(kind, ErrorKind::CommandNotFound);
                assert!(message.starts_with("cannot start 'a\"b'"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let line = HandshakeLine::Started {
            pid: 5,
            landlock: Enforcement::Partial,
        };
        assert_eq!(
            serde_json::to_string(&line).unwrap(),
            serde_json::to_string(&Handshake::Started {
                pid: 5,
                landlock: Enforcement::Partial
            })
            .unwrap()
        );
    }

    #[test]
    fn every_descriptor_but_the_kept_ones_is_closed() {
        std::thread::spawn(|| {
            // A forked child does the closing, so this test process keeps its descriptors.
            let (a, b) = rustix::pipe::pipe().unwrap();
            let (c, d) = rustix::pipe::pipe().unwrap();
            // SAFETY: the child only closes descriptors, checks them and exits.
            match unsafe { libc::fork() } {
                0 => {
                    close_all_but(&[
                        Some(b.as_raw_fd()),
                        None,
                        Some(d.as_raw_fd()),
                        Some(b.as_raw_fd()),
                    ]);
                    let open = |fd: &OwnedFd| rustix::io::fcntl_getfd(fd).is_ok();
                    let ok = !open(&a) && open(&b) && !open(&c) && open(&d);
                    sys::exit_group(if ok { 0 } else { 1 })
                }
                pid => {
                    let mut status = 0;
                    // SAFETY: waits for our own child.
                    unsafe { libc::waitpid(pid, &mut status, 0) };
                    assert!(
                        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                        "{status}"
                    );
                }
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn handshake_lines_are_tagged() {
        let line = serde_json::to_string(&Handshake::Started {
            pid: 5,
            landlock: Enforcement::Full,
        })
        .unwrap();
        assert_eq!(line, r#"{"started":{"pid":5,"landlock":"full"}}"#);
    }
}
