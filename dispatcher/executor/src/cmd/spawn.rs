//! Starting the command from its sub-reaper: `clone(CLONE_VM | CLONE_VFORK)`, the identity
//! switch, then `execveat` on the program's descriptor.
//!
//! The sub-reaper is a fork of the executor, so a second `fork` would copy the executor's page
//! tables again only for `exec` to throw them away; this is what `posix_spawn` does instead: the
//! child borrows the sub-reaper's memory, and the sub-reaper is suspended until the child has
//! called `exec` (or died). The child therefore only makes raw system calls on values prepared
//! beforehand (no allocation, no lock, no Rust runtime), in this order:
//!
//! 1. an empty signal mask (the sub-reaper blocks the signals it waits for) and SIGPIPE back to
//!    its default action (the Rust runtime ignores it, and exec keeps an ignored signal ignored);
//! 2. no supplementary groups, then the sandbox group and user (`setgroups`, `setgid`,
//!    `setuid` as raw calls, which change this task only): no capability survives `setuid` away
//!    from root, and no-new-privileges stays set;
//! 3. its own process group;
//! 4. stdin `/dev/null`, stdout and stderr the executor's pipes;
//! 5. `chdir(".")` as the sandbox user, which checks it may use the working directory;
//! 6. `execveat(dir_fd, name)` from the program's directory, held open: the path is not walked
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
}

/// Everything the child reads, prepared before `clone` (the child allocates nothing).
struct Prepared {
    path: CString,
    dir_fd: c_int,
    name: CString,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    uid: u32,
    gid: u32,
    stdin: c_int,
    stdout: c_int,
    stderr: c_int,
    /// Write end of the error pipe (close-on-exec).
    error: c_int,
}

/// Stack of the child while it borrows the sub-reaper's memory (it only makes system calls).
const CHILD_STACK: usize = 64 * 1024;

/// Starts the command; its pid, or why it could not start (the `errno` of the failed step).
pub fn start(command: &Command<'_>) -> io::Result<i32> {
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
    let stdin = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let (error_read, error_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    use std::os::fd::AsRawFd;
    let prepared = Prepared {
        path,
        dir_fd,
        name,
        argv: null_terminated(&args),
        envp: null_terminated(&vars),
        uid: command.uid,
        gid: command.gid,
        stdin: stdin.as_raw_fd(),
        stdout: command.stdout,
        stderr: command.stderr,
        error: error_write.as_raw_fd(),
    };
    let mut stack = vec![0u8; CHILD_STACK];
    // The stack grows down: the child starts at the (16-byte aligned) top.
    let top = (stack.as_mut_ptr() as usize + CHILD_STACK) & !15;
    // SAFETY: `child` only makes system calls on `prepared`, which (with `stack`, `args`, `vars`
    // and the descriptors) outlives the call: CLONE_VFORK suspends this thread until the child
    // has exec'd or exited. SIGCHLD tells the sub-reaper's reaping when the command ends.
    let pid = unsafe {
        libc::clone(
            child,
            top as *mut c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::addr_of!(prepared) as *mut c_void,
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    drop(error_write);
    let mut errno = [0u8; 4];
    let mut got = 0;
    while got < errno.len() {
        match rustix::io::read(&error_read, &mut errno[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if got == 0 {
        return Ok(pid);
    }
    // The child failed before exec and is exiting: reap it here (its status says nothing more).
    let mut status = 0;
    // SAFETY: waits for our own child with a valid out pointer.
    unsafe {
        libc::waitpid(pid, &mut status, 0);
    }
    Err(io::Error::from_raw_os_error(i32::from_ne_bytes(errno)))
}

/// The child: raw system calls only (see the module documentation).
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` points to the parent's `Prepared`, alive and unchanged while the parent is
    // suspended (CLONE_VFORK). Every call below is a raw system call on prepared values.
    unsafe {
        let p = &*(arg as *const Prepared);
        let fail = |p: &Prepared| -> c_int {
            let errno = *libc::__errno_location();
            let bytes = errno.to_ne_bytes();
            libc::syscall(
                libc::SYS_write,
                p.error,
                bytes.as_ptr(),
                bytes.len() as libc::size_t,
            );
            libc::syscall(libc::SYS_exit_group, 127);
            127
        };
        let empty: libc::sigset_t = std::mem::zeroed();
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        if libc::syscall(
            libc::SYS_rt_sigaction,
            libc::SIGPIPE,
            std::ptr::addr_of!(default),
            std::ptr::null_mut::<libc::sigaction>(),
            std::mem::size_of::<u64>(),
        ) != 0
            || libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                std::ptr::addr_of!(empty),
                std::ptr::null_mut::<libc::sigset_t>(),
                std::mem::size_of::<u64>(),
            ) != 0
            || libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
            || libc::syscall(libc::SYS_setgid, p.gid) != 0
            || libc::syscall(libc::SYS_setuid, p.uid) != 0
            || libc::syscall(libc::SYS_setpgid, 0, 0) != 0
            || libc::syscall(libc::SYS_dup2, p.stdin, 0) < 0
            || libc::syscall(libc::SYS_dup2, p.stdout, 1) < 0
            || libc::syscall(libc::SYS_dup2, p.stderr, 2) < 0
            || libc::syscall(libc::SYS_chdir, c".".as_ptr()) != 0
        {
            return fail(p);
        }
        if p.dir_fd >= 0 {
            libc::syscall(
                libc::SYS_execveat,
                p.dir_fd,
                p.name.as_ptr(),
                p.argv.as_ptr(),
                p.envp.as_ptr(),
                0,
            );
            // A script cannot run from a close-on-exec descriptor (ENOENT): by its path.
            if *libc::__errno_location() != libc::ENOENT {
                return fail(p);
            }
        }
        libc::syscall(
            libc::SYS_execve,
            p.path.as_ptr(),
            p.argv.as_ptr(),
            p.envp.as_ptr(),
        );
        fail(p)
    }
}
