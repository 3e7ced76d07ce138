//! The sub-reaper: one per command, so that nothing a command starts outlives its call.
//!
//! For every `cmd.run` the executor asks its fork server (`forkserver.rs`) for a child; that
//! child (this module, never returning) is the command's sub-reaper, and its parent is the
//! executor (`CLONE_PARENT`), which reaps, signals and waits for it. Should the fork server be
//! gone, the handler thread forks the sub-reaper itself (the fallback, and how every sub-reaper
//! was made before the fork server: forking the multi-threaded executor copies its page tables
//! and makes every later write of every thread fault, which cost more CPU than anything else).
//! Either way it is a copy of the executor, not a new program: starting a static binary again
//! cost more still (on virtual machines every start of the C library traps on `cpuid` a few
//! dozen times), while a fork keeps every property the re-executed binary had. It runs as root
//! with the executor's three capabilities (SETUID, SETGID, KILL), not dumpable, so commands (the
//! sandbox user) can neither signal nor trace it. It touches no lock another thread may have
//! held (no standard streams, no logging): the C library's allocator is safe after `fork`, and
//! the fork server has one thread. Then it:
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

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use rustix::process::{Pid, Signal};
use serde::{Deserialize, Serialize};

use crate::protocol::{Enforcement, ErrorKind};
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

/// The body of the forked child: never returns (the process ends with the command's status,
/// or 127 after reporting why the command did not start).
pub fn run_forked(child: Child) -> ! {
    let code = catch_unwind(AssertUnwindSafe(|| run(child))).unwrap_or(FAILED_BEFORE_START);
    // SAFETY: ends this process at once, without running the parent's exit handlers or touching
    // the standard streams, whose locks another thread of the executor may have held.
    unsafe { libc::_exit(code) }
}

fn run(child: Child) -> i32 {
    let Child {
        plan,
        ruleset,
        program_dir,
        cwd,
        stdout,
        stderr,
        status,
        stdin,
    } = child;
    let watched = watched_signals();
    // SAFETY: this process has one thread; the set is initialized.
    unsafe {
        libc::sigprocmask(libc::SIG_SETMASK, &watched, std::ptr::null_mut());
    }
    let mut status = std::fs::File::from(status);
    let report = |status: &mut std::fs::File, handshake: &Handshake| {
        let mut line = serde_json::to_vec(handshake).unwrap_or_default();
        line.push(b'\n');
        let _ = status.write_all(&line);
    };
    let fail = |status: &mut std::fs::File, kind: ErrorKind, message: String| {
        report(status, &Handshake::Failed { kind, message });
        FAILED_BEFORE_START
    };

    // Forked directly from the executor, our standard streams are its protocol stream: never
    // keep them. From the fork server they are `/dev/null` already, and opening it again would
    // walk `/` (on a FUSE root filesystem, a round trip to its daemon for `/`'s ACL).
    if !(0..=2).all(is_dev_null) {
        let Ok(null) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        else {
            return fail(
                &mut status,
                ErrorKind::SpawnFailed,
                "cannot open /dev/null".into(),
            );
        };
        for target in 0..=2 {
            // SAFETY: dup2 onto the standard descriptors of this single-threaded process.
            unsafe {
                libc::dup2(null.as_raw_fd(), target);
            }
        }
        drop(null);
    }

    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        return fail(
            &mut status,
            ErrorKind::SpawnFailed,
            format!("cannot become the command's sub-reaper: {e}"),
        );
    }
    if let Err(e) = rustix::process::fchdir(&cwd) {
        let name = plan.argv.first().map_or("", String::as_str);
        return fail(
            &mut status,
            ErrorKind::SpawnFailed,
            format!(
                "cannot start the sub-reaper for '{name}' in '{}': {}",
                plan.cwd_display,
                std::io::Error::from(e)
            ),
        );
    }
    drop(cwd);
    let landlock = match confine::enforce(ruleset) {
        Ok(enforcement) => enforcement,
        Err(e) => {
            return fail(
                &mut status,
                ErrorKind::SpawnFailed,
                format!("cannot confine the command with Landlock: {e}"),
            )
        }
    };
    // The ruleset's descriptor is closed by now; nothing else inherited stays open.
    let mut keep = vec![status.as_raw_fd(), stdout.as_raw_fd(), stderr.as_raw_fd()];
    keep.extend(program_dir.as_deref().map(AsRawFd::as_raw_fd));
    keep.extend(stdin.as_ref().map(AsRawFd::as_raw_fd));
    close_all_but(&keep);
    if landlock == Enforcement::None && plan.require_landlock {
        return fail(
            &mut status,
            ErrorKind::SpawnFailed,
            "the kernel enforces no Landlock rules here and this sandbox requires them; \
             the command was not started"
                .to_owned(),
        );
    }

    let Some(name) = plan.argv.first() else {
        return fail(
            &mut status,
            ErrorKind::InvalidRequest,
            "argv is empty".into(),
        );
    };
    let spawned = vfork::start(&vfork::Command {
        program: &plan.program,
        at: program_dir
            .as_deref()
            .zip(plan.program.rsplit_once('/'))
            .map(|(fd, (_, name))| (fd.as_raw_fd(), name)),
        argv: &plan.argv,
        env: &plan.env,
        uid: plan.uid,
        gid: plan.gid,
        stdout: stdout.as_raw_fd(),
        stderr: stderr.as_raw_fd(),
        stdin: stdin.as_ref().map(AsRawFd::as_raw_fd),
        session: plan.pty,
    });
    // Our copies of the output pipes (and of a terminal) would keep them open after the
    // command's tree is gone.
    drop(stdout);
    drop(stderr);
    drop(stdin);
    drop(program_dir);
    let leader = match spawned {
        Ok(pid) => pid,
        Err(e) => {
            let (kind, why) = match e.kind() {
                std::io::ErrorKind::NotFound => (ErrorKind::CommandNotFound, String::new()),
                std::io::ErrorKind::PermissionDenied if plan.exec_restricted => (
                    ErrorKind::PermissionDenied,
                    " (the sandbox's kernel policy allows executing only the allowlisted \
                     programs; a script's interpreter must be allowlisted too)"
                        .to_owned(),
                ),
                std::io::ErrorKind::PermissionDenied => {
                    (ErrorKind::PermissionDenied, String::new())
                }
                _ => (ErrorKind::SpawnFailed, String::new()),
            };
            return fail(
                &mut status,
                kind,
                format!("cannot start '{name}' ({}): {e}{why}", plan.program),
            );
        }
    };
    report(
        &mut status,
        &Handshake::Started {
            pid: leader,
            landlock,
        },
    );
    drop(status);

    let mut tree = Tree {
        leader,
        leader_status: None,
    };
    tree.supervise(&watched);
    tree.kill_all();
    // The leader is reaped by now; were it not (a tree that kept growing), report SIGKILL.
    exit_like(tree.leader_status.unwrap_or(libc::SIGKILL))
}

/// Closes every descriptor of this process except the standard ones and `keep`.
/// Whether descriptor `fd` is open on `/dev/null` (the character device 1:3).
pub(crate) fn is_dev_null(fd: RawFd) -> bool {
    // SAFETY: borrows a descriptor number only for the duration of one fstat.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fstat(fd).is_ok_and(|stat| {
        (stat.st_mode & libc::S_IFMT) == libc::S_IFCHR && stat.st_rdev == libc::makedev(1, 3)
    })
}

pub(crate) fn close_all_but(keep: &[RawFd]) {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter_map(|fd| u32::try_from(*fd).ok())
        .filter(|fd| *fd > 2)
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut from = 3u32;
    for fd in keep {
        if fd > from {
            // SAFETY: closes descriptors this process owns and no code here uses.
            unsafe {
                libc::close_range(from, fd - 1, 0);
            }
        }
        from = fd + 1;
    }
    // SAFETY: as above.
    unsafe {
        libc::close_range(from, u32::MAX, 0);
    }
}

fn watched_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialize and fill a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGCHLD, libc::SIGTERM, libc::SIGUSR1] {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

/// The command's process tree as the sub-reaper sees it: every reap goes through here, so the
/// leader's status is never lost, whoever collects it.
struct Tree {
    leader: i32,
    leader_status: Option<i32>,
}

impl Tree {
    /// Waits for the leader's exit, passing SIGTERM on and killing the tree on SIGUSR1.
    fn supervise(&mut self, watched: &libc::sigset_t) {
        loop {
            self.reap(false);
            if self.leader_status.is_some() {
                return;
            }
            // SAFETY: waits for one of the blocked signals in `watched`; no info is requested.
            let signal = unsafe { libc::sigwaitinfo(watched, std::ptr::null_mut()) };
            match signal {
                libc::SIGTERM => {
                    let _ = kill_group(self.leader, Signal::TERM);
                    let _ = kill_pid(self.leader, Signal::TERM);
                }
                libc::SIGUSR1 => self.kill_all(),
                _ => {}
            }
        }
    }

    /// Reaps exited children (the first wait blocking when `block`); false when there are none.
    fn reap(&mut self, block: bool) -> bool {
        let mut flags = if block { 0 } else { libc::WNOHANG };
        loop {
            let mut status = 0;
            // SAFETY: waitpid with a valid out pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, flags) };
            if pid < 0 {
                return false; // ECHILD: no children at all (EINTR cannot happen: signals are blocked).
            }
            if pid == 0 {
                return true; // children remain, none exited yet
            }
            if pid == self.leader {
                self.leader_status = Some(status);
            }
            flags = libc::WNOHANG;
        }
    }

    /// True while this process has a child (running or not yet reaped).
    fn has_children(&self) -> bool {
        // SAFETY: waitid with a valid out pointer; WNOWAIT leaves any zombie to `reap`.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            ) == 0
        }
    }

    /// Kills the command's group and every process left under this sub-reaper, generation by
    /// generation as orphans are re-parented here, and reaps them all.
    fn kill_all(&mut self) {
        let me = std::process::id();
        for _ in 0..MAX_ROUNDS {
            // Every living descendant has a living ancestor chain up to here; with the leader
            // gone, no child means no descendant (the common case: skip the /proc scan).
            if !self.has_children() {
                return;
            }
            let _ = kill_group(self.leader, Signal::KILL);
            for pid in children_of(me) {
                let _ = kill_pid(pid, Signal::KILL);
            }
            if !self.reap(true) {
                return;
            }
        }
        // A tree still growing after MAX_ROUNDS: give up; the executor's reaper kills this
        // process group when it collects us.
    }
}

/// Pids whose parent is `parent`, from `/proc/<pid>/stat`.
fn children_of(parent: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if parent_in_stat(&stat) == Some(parent) {
            found.push(pid);
        }
    }
    found
}

/// The parent pid in a `/proc/<pid>/stat` line (`pid (comm) state ppid ...`; `comm` may hold
/// spaces and parentheses, so the fields are counted after the last `)`).
fn parent_in_stat(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
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
    // SAFETY: resets one signal to its default action, unblocks it and sends it to this
    // (single-threaded) process; if that does not end the process (a signal whose default is to
    // ignore), we exit with 128 + signal. `kill(getpid())` rather than `raise`: a child of the
    // fork server comes from a raw `clone`, so the C library's idea of its thread id is stale.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), signal);
    }
    128 + signal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_pid_is_read_after_the_command_name() {
        assert_eq!(parent_in_stat("42 (sh) S 7 42 42 0"), Some(7));
        assert_eq!(parent_in_stat("42 (a) b) (c) R 9 1 1"), Some(9));
        assert_eq!(parent_in_stat("garbage"), None);
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
