//! Starting the command from its sub-reaper: `clone(CLONE_VM | CLONE_VFORK)`, the identity
//! switch, then `execveat` on the program's descriptor.
//!
//! The sub-reaper is a fork of the executor, so a second `fork` would copy the executor's page
//! tables again only for `exec` to throw them away; this is what `posix_spawn` does instead: the
//! child borrows the sub-reaper's memory, and the sub-reaper is suspended until the child has
//! called `exec` (or died). The child therefore only makes raw system calls on values prepared
//! beforehand (no allocation, no lock, no Rust runtime).
//!
//! Signals follow `posix_spawn`'s rule, because a child that shares the parent's memory must
//! never run the parent's signal handlers: a handler run there would work on the parent's data
//! (and stack) while the parent is suspended mid-call, and the handlers of the executor (the
//! Rust runtime's stack-overflow guard among them) assume they run in the executor. So the
//! parent blocks **every** signal around the `clone` (the child starts with that mask) and
//! restores its own mask as soon as `clone` returns; in the child, with everything still
//! blocked, every disposition goes back to its default before anything is unblocked. The child
//! then, in this order:
//!
//! 1. resets every signal's disposition to `SIG_DFL`: caught ones (a handler must never run
//!    here, and `exec` would reset them anyway) and ignored ones (`exec` keeps an ignored signal
//!    ignored: SIGPIPE, which the Rust runtime ignores, or anything the executor inherited);
//! 2. no supplementary groups, then the sandbox group and user (`setgroups`, `setgid`,
//!    `setuid` as raw calls, which change this task only): no capability survives `setuid` away
//!    from root, and no-new-privileges stays set;
//! 3. its own process group; with a terminal, its own session instead (a session leader leads
//!    its process group too);
//! 4. stdin `/dev/null` (or the pipe a live process is fed through), stdout and stderr the
//!    executor's pipes, or all three the terminal, which then becomes the controlling terminal;
//! 5. `chdir(".")` as the sandbox user, which checks it may use the working directory;
//! 6. an empty signal mask, the command's, as the last step before `exec`: a signal that arrives
//!    from here on meets only default actions;
//! 7. `execveat(dir_fd, name)` from the program's directory, held open: the path is not walked
//!    from `/` on the image's filesystem (each component a FUSE round trip on overlay storage),
//!    and the process is named after `name` as with `execve`; a script (`#!`), which cannot be
//!    run through a close-on-exec descriptor, falls back to `execve(path)`.
//!
//! A failure writes its `errno` on a close-on-exec pipe and exits 127; the parent reads the pipe
//! (EOF: `exec` succeeded) and reaps such a child itself.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::AtomicI32;

#[cfg(test)]
use crate::spawn::sys::SIGSET_SIZE;
use crate::spawn::sys::{self, KernelSigset};

/// What to start.
pub struct Command<'a> {
    /// Absolute path of the program (used for scripts and without a directory descriptor).
    pub program: &'a str,
    /// The program's directory opened `O_PATH`, when available, and its name in it.
    pub at: Option<(RawFd, &'a str)>,
    /// The full argv.
    pub argv: &'a [String],
    /// The complete environment.
    pub env: &'a [(String, String)],
    /// The sandbox user.
    pub uid: u32,
    /// The sandbox group.
    pub gid: u32,
    /// Becomes the command's stdout.
    pub stdout: RawFd,
    /// Becomes the command's stderr.
    pub stderr: RawFd,
    /// Becomes the command's stdin (`/dev/null` when `None`).
    pub stdin: Option<RawFd>,
    /// Start a new session with stdin as its controlling terminal (a PTY's slave).
    pub session: bool,
}

/// Everything the child reads, prepared before `clone` (the child allocates nothing, and
/// neither does [`launch`]: a sub-reaper that shares the fork server's memory must not).
pub struct Prepared {
    path: CString,
    dir_fd: c_int,
    name: CString,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    /// Own the text `argv` and `envp` point to (moving a `CString` leaves its text in place).
    _text: (Vec<CString>, Vec<CString>),
    uid: u32,
    gid: u32,
    /// `-1`: the caller's descriptor 0, which is `/dev/null` (see [`launch`]).
    stdin: c_int,
    stdout: c_int,
    stderr: c_int,
    session: bool,
}

impl Prepared {
    /// Turns `command` into C strings and pointer arrays; fails on a NUL byte.
    pub fn new(command: &Command<'_>) -> io::Result<Prepared> {
        let cstring = |s: &str| {
            CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
        };
        let path = cstring(command.program)?;
        let (dir_fd, name) = match command.at {
            Some((fd, name)) => (fd, cstring(name)?),
            None => (-1, CString::default()),
        };
        let args: Vec<CString> = command
            .argv
            .iter()
            .map(|a| cstring(a))
            .collect::<io::Result<_>>()?;
        let vars: Vec<CString> = command
            .env
            .iter()
            .map(|(k, v)| cstring(&format!("{k}={v}")))
            .collect::<io::Result<_>>()?;
        let null_terminated = |list: &[CString]| {
            list.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        Ok(Prepared {
            path,
            dir_fd,
            name,
            argv: null_terminated(&args),
            envp: null_terminated(&vars),
            _text: (args, vars),
            uid: command.uid,
            gid: command.gid,
            stdin: command.stdin.unwrap_or(-1),
            stdout: command.stdout,
            stderr: command.stderr,
            session: command.session,
        })
    }
}

/// Stack of the child while it borrows the sub-reaper's memory (it only makes system calls).
pub const CHILD_STACK: usize = 32 * 1024;

/// What the child reads: the prepared command and its error pipe.
struct ChildArgs<'a> {
    prepared: &'a Prepared,
    /// Where a command without a stdin of its own reads from.
    stdin: c_int,
    /// Write end of the error pipe (close-on-exec).
    error: c_int,
}

/// Every signal of the calling thread blocked until this is dropped, which restores the mask
/// it had (see the module documentation: the child of `clone` starts with every signal blocked).
struct AllSignalsBlocked {
    previous: KernelSigset,
}

impl AllSignalsBlocked {
    fn new() -> Result<Self, sys::Errno> {
        // SIGKILL and SIGSTOP are left out by the kernel.
        let previous = sys::sigprocmask(libc::SIG_SETMASK, &!0)?;
        Ok(Self { previous })
    }
}

impl Drop for AllSignalsBlocked {
    fn drop(&mut self) {
        let _ = sys::sigprocmask(libc::SIG_SETMASK, &self.previous);
    }
}

/// Starts the command; its pid, or why it could not start (the `errno` of the failed step).
/// Allocates: for tests and callers outside a sub-reaper. A command without a stdin of its own
/// reads `/dev/null`.
pub fn start(command: &Command<'_>) -> io::Result<i32> {
    let prepared = Prepared::new(command)?;
    let null = match command.stdin {
        Some(_) => None,
        None if sys::is_dev_null(0) => None,
        None => Some(rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?),
    };
    let mut stack = vec![std::mem::MaybeUninit::uninit(); CHILD_STACK];
    use std::os::fd::AsRawFd;
    let borrowing = AtomicI32::new(0);
    launch(
        &prepared,
        null.as_ref().map(AsRawFd::as_raw_fd),
        &mut stack,
        &borrowing,
    )
    .map_err(io::Error::from_raw_os_error)
}

/// Starts a prepared command on `stack` (the child's, while it borrows our memory); its pid,
/// or the `errno` of the step that failed. A command without a stdin of its own reads `null`,
/// or our descriptor 0, which must then be `/dev/null`. Allocates nothing and leaves `errno`
/// alone. `borrowing` holds the child's thread id from its creation until it has exec'd or
/// died (the kernel sets and zeroes it): while it is not zero, the child may still run on
/// `stack`, even if we were killed meanwhile.
pub fn launch(
    prepared: &Prepared,
    null: Option<RawFd>,
    stack: &mut [std::mem::MaybeUninit<u8>],
    borrowing: &AtomicI32,
) -> Result<i32, sys::Errno> {
    let (error_read, error_write) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| e.raw_os_error())?;
    use std::os::fd::AsRawFd;
    let args = ChildArgs {
        prepared,
        stdin: if prepared.stdin >= 0 {
            prepared.stdin
        } else {
            null.unwrap_or(0)
        },
        error: error_write.as_raw_fd(),
    };
    // The stack grows down: the child starts at the (16-byte aligned) top.
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    let blocked = AllSignalsBlocked::new()?;
    // SAFETY: `child` only makes system calls on `args`, which (with `stack`, `prepared` and the
    // descriptors) outlives the call: CLONE_VFORK suspends this thread until the child has
    // exec'd or exited. SIGCHLD tells the sub-reaper's reaping when the command ends. The C
    // library's `clone` sets `errno` only on failure, which is then reported as EAGAIN (the
    // shared `errno` may not be ours to read; see `sys.rs`).
    let pid = unsafe {
        libc::clone(
            child,
            top as *mut c_void,
            libc::CLONE_VM
                | libc::CLONE_VFORK
                | libc::CLONE_PARENT_SETTID
                | libc::CLONE_CHILD_CLEARTID
                | libc::SIGCHLD,
            std::ptr::addr_of!(args) as *mut c_void,
            borrowing.as_ptr(),
            std::ptr::null_mut::<c_void>(),
            borrowing.as_ptr(),
        )
    };
    // The child has exec'd or died: this thread's own mask comes back.
    drop(blocked);
    if pid < 0 {
        return Err(libc::EAGAIN);
    }
    drop(error_write);
    let mut errno = [0u8; 4];
    let mut got = 0;
    while got < errno.len() {
        match rustix::io::read(&error_read, &mut errno[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.raw_os_error()),
        }
    }
    if got == 0 {
        return Ok(pid);
    }
    // The child failed before exec and is exiting: reap it here (its status says nothing more).
    if let Some(child) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::waitpid(Some(child), rustix::process::WaitOptions::empty());
    }
    Err(i32::from_ne_bytes(errno))
}

/// The child: raw system calls only (see the module documentation), each reporting its error
/// as a value (the `errno` of the C library is shared with other processes here).
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` points to the parent's `ChildArgs`, alive and unchanged while the parent is
    // suspended (CLONE_VFORK). Every call below is a raw system call on prepared values.
    unsafe {
        let a = &*(arg as *const ChildArgs<'_>);
        let p = a.prepared;
        let fail = |errno: sys::Errno| -> c_int {
            let bytes = errno.to_ne_bytes();
            let _ = sys::call(
                libc::SYS_write,
                [
                    a.error as usize,
                    bytes.as_ptr() as usize,
                    bytes.len(),
                    0,
                    0,
                    0,
                ],
            );
            sys::exit_group(127)
        };
        // Every signal is blocked (the parent's doing): no handler of the parent can run while
        // the dispositions are put back to their defaults.
        for signal in 1..=sys::LAST_SIGNAL {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue; // always default, and the kernel refuses to set them
            }
            if let Err(e) = sys::default_action(signal) {
                return fail(e);
            }
        }
        let steps = || -> Result<(), sys::Errno> {
            let call = |n: libc::c_long, a0: usize, a1: usize, a2: usize| {
                sys::call(n, [a0, a1, a2, 0, 0, 0])
            };
            call(libc::SYS_setgroups, 0, 0, 0)?;
            call(libc::SYS_setgid, p.gid as usize, 0, 0)?;
            call(libc::SYS_setuid, p.uid as usize, 0, 0)?;
            if p.session {
                call(libc::SYS_setsid, 0, 0, 0)?;
            } else {
                call(libc::SYS_setpgid, 0, 0, 0)?;
            }
            call(libc::SYS_dup2, a.stdin as usize, 0, 0)?;
            call(libc::SYS_dup2, p.stdout as usize, 1, 0)?;
            call(libc::SYS_dup2, p.stderr as usize, 2, 0)?;
            if p.session {
                call(libc::SYS_ioctl, 0, libc::TIOCSCTTY as usize, 0)?;
            }
            call(libc::SYS_chdir, c".".as_ptr() as usize, 0, 0)?;
            // The command's mask, last: from here on a signal meets only default actions.
            sys::sigprocmask(libc::SIG_SETMASK, &0)?;
            Ok(())
        };
        if let Err(e) = steps() {
            return fail(e);
        }
        if p.dir_fd >= 0 {
            let tried = sys::call(
                libc::SYS_execveat,
                [
                    p.dir_fd as usize,
                    p.name.as_ptr() as usize,
                    p.argv.as_ptr() as usize,
                    p.envp.as_ptr() as usize,
                    0,
                    0,
                ],
            );
            // A script cannot run from a close-on-exec descriptor (ENOENT): by its path.
            match tried {
                Err(libc::ENOENT) => {}
                Err(e) => return fail(e),
                Ok(_) => return fail(libc::EIO),
            }
        }
        let tried = sys::call(
            libc::SYS_execve,
            [
                p.path.as_ptr() as usize,
                p.argv.as_ptr() as usize,
                p.envp.as_ptr() as usize,
                0,
                0,
                0,
            ],
        );
        fail(tried.err().unwrap_or(libc::EIO))
    }
}

#[cfg(test)]
mod tests {
    //! The signal rule of the module documentation, checked on real children. Starting a
    //! command switches its identity (`setgroups`, `setgid`, `setuid`), so these tests need
    //! root, as the executor has in its container. Each runs on a thread of its own, whose
    //! signal mask (and seccomp filter) no other test shares.

    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicI32, Ordering};

    fn require_root() {
        assert_eq!(
            rustix::process::getuid().as_raw(),
            0,
            "these tests start commands as the executor does (setgroups, setgid, setuid): run \
             them as root"
        );
    }

    /// Runs `body` on a fresh thread and passes its panic on as it was.
    fn on_own_thread(body: impl FnOnce() + Send + 'static) {
        if let Err(panic) = std::thread::spawn(body).join() {
            std::panic::resume_unwind(panic);
        }
    }

    /// This thread's signal mask, as the kernel holds it.
    fn thread_mask() -> KernelSigset {
        let mut mask: KernelSigset = 0;
        // SAFETY: reads this thread's mask into a valid kernel-sized set.
        let done = unsafe {
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_BLOCK,
                std::ptr::null::<KernelSigset>(),
                std::ptr::addr_of_mut!(mask),
                SIGSET_SIZE,
            )
        };
        assert_eq!(done, 0, "{}", io::Error::last_os_error());
        mask
    }

    /// The exit status of child `pid`.
    fn wait_for(pid: i32) -> c_int {
        let mut status = 0;
        // SAFETY: waits for our own child with a valid out pointer.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(waited, pid, "{}", io::Error::last_os_error());
        status
    }

    /// Starts `argv` as root through [`start`], its output on a pipe; pid (or why not) and the
    /// read end.
    fn start_piped(argv: &[&str]) -> (io::Result<i32>, std::fs::File) {
        let (read, write) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("a pipe");
        let argv: Vec<String> = argv.iter().map(|a| (*a).to_owned()).collect();
        let started = start(&Command {
            program: &format!("/bin/{}", argv[0]),
            at: None,
            argv: &argv,
            env: &[],
            uid: 0,
            gid: 0,
            stdout: write.as_raw_fd(),
            stderr: write.as_raw_fd(),
            stdin: None,
            session: false,
        });
        (started, std::fs::File::from(read))
    }

    #[test]
    fn a_command_starts_with_default_dispositions_and_an_empty_mask() {
        require_root();
        on_own_thread(|| {
            // The parent ignores SIGUSR2 (process-wide) and blocks SIGTERM (this thread):
            // neither reaches the command, and the parent's own mask is as it was afterwards.
            // SAFETY: changes a disposition no other test relies on, and this thread's mask.
            let previous = unsafe {
                let previous = libc::signal(libc::SIGUSR2, libc::SIG_IGN);
                let mut term: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut term);
                libc::sigaddset(&mut term, libc::SIGTERM);
                libc::pthread_sigmask(libc::SIG_BLOCK, &term, std::ptr::null_mut());
                previous
            };
            let before = thread_mask();
            let (started, mut out) = start_piped(&["cat", "/proc/self/status"]);
            let after = thread_mask();
            // SAFETY: puts back the disposition changed above.
            unsafe {
                libc::signal(libc::SIGUSR2, previous);
            }
            let pid = started.expect("cat starts");
            let mut status = String::new();
            out.read_to_string(&mut status).expect("cat's output");
            assert_eq!(wait_for(pid), 0, "{status}");
            assert_eq!(
                before, after,
                "the parent's mask is restored after the spawn"
            );
            assert_ne!(before & (1 << (libc::SIGTERM - 1)), 0);
            for field in ["SigBlk", "SigIgn", "SigCgt"] {
                let line = status
                    .lines()
                    .find(|l| l.starts_with(field))
                    .unwrap_or_else(|| panic!("no {field} in {status}"));
                assert!(
                    line.ends_with("0000000000000000"),
                    "the command starts with {line}"
                );
            }
        });
    }

    /// Where the SIGSYS handler below ran (0: nowhere).
    static HANDLER_RAN_IN: AtomicI32 = AtomicI32::new(0);

    extern "C" fn record_sigsys(_: c_int) {
        // SAFETY: getpid as a raw call, async-signal-safe.
        let pid = unsafe { libc::syscall(libc::SYS_getpid) } as i32;
        HANDLER_RAN_IN.store(pid, Ordering::SeqCst);
    }

    /// `AUDIT_ARCH_X86_64` (not in the libc crate).
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;

    /// Makes every `setgroups` of this thread and its children raise SIGSYS (seccomp
    /// `SECCOMP_RET_TRAP`): a signal the child raises itself, at a known step before `exec`.
    fn trap_setgroups() {
        let stmt = |code: u32, k: u32| libc::sock_filter {
            code: code as u16,
            jt: 0,
            jf: 0,
            k,
        };
        let jeq = |k: u32, jf: u8| libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf,
            k,
        };
        let mut program = [
            stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4), // arch
            jeq(AUDIT_ARCH_X86_64, 3),
            stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0), // syscall number
            jeq(libc::SYS_setgroups as u32, 1),
            stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_TRAP),
            stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
        ];
        let fprog = libc::sock_fprog {
            len: program.len() as u16,
            filter: program.as_mut_ptr(),
        };
        // SAFETY: no_new_privs and a seccomp filter on this thread only (no TSYNC), from a
        // valid program that outlives the call.
        unsafe {
            assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
            assert_eq!(
                libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    std::ptr::addr_of!(fprog)
                ),
                0,
                "{}",
                io::Error::last_os_error()
            );
        }
    }

    #[test]
    fn a_handler_of_the_parent_never_runs_in_the_child() {
        require_root();
        on_own_thread(|| {
            // SAFETY: a handler for SIGSYS, which nothing else in these tests raises; the
            // process made not dumpable so the child's default action (a core dump of memory
            // it shares with us) writes nothing; both undone below.
            let previous = unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = record_sigsys as extern "C" fn(c_int) as usize;
                libc::sigemptyset(&mut action.sa_mask);
                let mut previous: libc::sigaction = std::mem::zeroed();
                assert_eq!(libc::sigaction(libc::SIGSYS, &action, &mut previous), 0);
                assert_eq!(libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0), 0);
                previous
            };
            trap_setgroups();
            let (started, _out) = start_piped(&["true"]);
            // SAFETY: puts back what was changed above.
            unsafe {
                libc::sigaction(libc::SIGSYS, &previous, std::ptr::null_mut());
                libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
            }
            assert_eq!(
                HANDLER_RAN_IN.load(Ordering::SeqCst),
                0,
                "the parent's SIGSYS handler ran in the child, on memory it shares with the parent"
            );
            // The signal met its default action: the child died of it before `exec`.
            let pid = started.expect("the child was made (and died before exec)");
            let status = wait_for(pid);
            assert!(
                libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSYS,
                "status {status:#x}"
            );
        });
    }
}
