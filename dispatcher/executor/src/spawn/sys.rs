//! Raw system calls that report their error as a value, never through `errno`.
//!
//! Why: a sub-reaper shares its memory with the fork server and with every other sub-reaper
//! (`forkserver.rs`), and so shares the C library's thread data, `errno` included. A failed call
//! of the C library writes `errno` there, where another process may overwrite it before it is
//! read. These calls return `-errno` from the kernel directly, as rustix does for the calls it
//! wraps; they are used for the few calls rustix does not wrap (signal masks and actions in the
//! kernel's layout, `execveat`, `landlock_restrict_self`, `close_range`).

use std::os::raw::c_long;

/// Whether descriptor `fd` is open on `/dev/null` (the character device 1:3): a sub-reaper
/// and a launched child both ask it of their standard descriptors. (Through rustix, which also
/// reports its error as a value.)
pub fn is_dev_null(fd: std::os::fd::RawFd) -> bool {
    // SAFETY: borrows a descriptor number only for the duration of one fstat.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fstat(fd).is_ok_and(|stat| {
        (stat.st_mode & libc::S_IFMT) == libc::S_IFCHR && stat.st_rdev == libc::makedev(1, 3)
    })
}

/// An `errno` value, as the kernel returned it.
pub type Errno = i32;

/// Makes system call `number` with up to six arguments; the result or the `errno`.
///
/// # Safety
///
/// The caller upholds what the kernel expects of the call: pointers valid for what the call
/// reads or writes, descriptors it may use.
#[inline]
pub unsafe fn call(number: c_long, args: [usize; 6]) -> Result<usize, Errno> {
    let ret = raw(number, args);
    if (-4095..0).contains(&ret) {
        Err(i32::try_from(-ret).unwrap_or(libc::EIO))
    } else {
        Ok(ret as usize)
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn raw(number: c_long, args: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the x86_64 Linux system call convention; the caller vouches for the arguments.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") number as isize => ret,
            in("rdi") args[0],
            in("rsi") args[1],
            in("rdx") args[2],
            in("r10") args[3],
            in("r8") args[4],
            in("r9") args[5],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

#[cfg(target_arch = "aarch64")]
#[inline]
unsafe fn raw(number: c_long, args: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the aarch64 Linux system call convention; the caller vouches for the arguments.
    unsafe {
        std::arch::asm!(
            "svc 0",
            in("x8") number,
            inlateout("x0") args[0] as isize => ret,
            in("x1") args[1],
            in("x2") args[2],
            in("x3") args[3],
            in("x4") args[4],
            in("x5") args[5],
            options(nostack),
        );
    }
    ret
}

/// The kernel's signal set (`_NSIG` = 64 bits), as `rt_sigprocmask`, `rt_sigaction` and
/// `rt_sigtimedwait` take it: the C library's `sigset_t` is 128 bytes and its `sigfillset`
/// leaves out the signals it reserves for itself.
pub type KernelSigset = u64;

/// Size argument of the `rt_sig*` calls.
pub const SIGSET_SIZE: usize = std::mem::size_of::<KernelSigset>();

/// The highest signal number (`_NSIG`).
pub const LAST_SIGNAL: i32 = 64;

/// The set holding exactly `signals`.
pub fn sigset_of(signals: &[i32]) -> KernelSigset {
    signals
        .iter()
        .filter(|s| (1..=LAST_SIGNAL).contains(*s))
        .fold(0, |set, s| set | (1u64 << (s - 1)))
}

/// The kernel's `struct sigaction` (the C library's has another layout); all zeros is
/// `SIG_DFL` with no flags and an empty mask.
#[repr(C)]
pub struct KernelSigaction {
    /// The handler (`SIG_DFL`, `SIG_IGN` or a function).
    pub handler: usize,
    /// `SA_*` flags.
    pub flags: u64,
    /// The restorer (unused with `SIG_DFL`).
    pub restorer: usize,
    /// Signals blocked while the handler runs.
    pub mask: KernelSigset,
}

/// `rt_sigprocmask(how, set)`: this thread's mask changed; the mask it had.
pub fn sigprocmask(how: i32, set: &KernelSigset) -> Result<KernelSigset, Errno> {
    let mut previous: KernelSigset = 0;
    // SAFETY: valid pointers to kernel-sized sets.
    unsafe {
        call(
            libc::SYS_rt_sigprocmask,
            [
                how as usize,
                std::ptr::from_ref(set) as usize,
                std::ptr::addr_of_mut!(previous) as usize,
                SIGSET_SIZE,
                0,
                0,
            ],
        )?;
    }
    Ok(previous)
}

/// Puts `signal`'s disposition back to its default.
pub fn default_action(signal: i32) -> Result<(), Errno> {
    let default = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: a valid kernel sigaction; no old action requested.
    unsafe {
        call(
            libc::SYS_rt_sigaction,
            [
                signal as usize,
                std::ptr::addr_of!(default) as usize,
                0,
                SIGSET_SIZE,
                0,
                0,
            ],
        )
    }
    .map(drop)
}

/// Waits until one of the (blocked) signals of `set` is pending and takes it; its number.
pub fn sigwait(set: &KernelSigset) -> Result<i32, Errno> {
    // SAFETY: a valid kernel-sized set; no info, no timeout.
    let signal = unsafe {
        call(
            libc::SYS_rt_sigtimedwait,
            [std::ptr::from_ref(set) as usize, 0, 0, SIGSET_SIZE, 0, 0],
        )
    }?;
    Ok(i32::try_from(signal).unwrap_or(0))
}

/// Closes descriptors `first..=last`.
pub fn close_range(first: u32, last: u32) {
    // SAFETY: closes descriptors of this process that no code here uses any more.
    let closed = unsafe {
        call(
            libc::SYS_close_range,
            [first as usize, last as usize, 0, 0, 0, 0],
        )
    };
    // gVisor (runsc 2022) reads `last` as a signed int, so `u32::MAX` is "below" `first` and
    // the call fails with EINVAL, closing nothing: the command would inherit the executor's
    // descriptors. The same range up to i32::MAX closes them all there.
    if closed.is_err() && last > i32::MAX as u32 && first <= i32::MAX as u32 {
        // SAFETY: as above.
        let _ = unsafe {
            call(
                libc::SYS_close_range,
                [first as usize, i32::MAX as usize, 0, 0, 0, 0],
            )
        };
    }
}

/// `landlock_restrict_self(ruleset, 0)`.
pub fn landlock_restrict_self(ruleset: i32) -> Result<(), Errno> {
    // SAFETY: takes a descriptor and a flags word; touches no memory.
    unsafe {
        call(
            libc::SYS_landlock_restrict_self,
            [ruleset as usize, 0, 0, 0, 0, 0],
        )
    }
    .map(drop)
}

/// Ends this process (its thread group) with `code`.
pub fn exit_group(code: i32) -> ! {
    // SAFETY: exit_group does not return.
    unsafe {
        let _ = call(libc::SYS_exit_group, [code as usize, 0, 0, 0, 0, 0]);
        libc::_exit(code)
    }
}

/// The C library's text for an `errno`, the way `std::io::Error` shows it, without allocating
/// (and without the C library's locale data, shared with other processes here).
pub struct ErrnoText(pub Errno);

impl std::fmt::Display for ErrnoText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self.0 {
            libc::EPERM => "Operation not permitted",
            libc::ENOENT => "No such file or directory",
            libc::ESRCH => "No such process",
            libc::EINTR => "Interrupted system call",
            libc::EIO => "Input/output error",
            libc::E2BIG => "Argument list too long",
            libc::ENOEXEC => "Exec format error",
            libc::EBADF => "Bad file descriptor",
            libc::ECHILD => "No child processes",
            libc::EAGAIN => "Resource temporarily unavailable",
            libc::ENOMEM => "Cannot allocate memory",
            libc::EACCES => "Permission denied",
            libc::EFAULT => "Bad address",
            libc::ENOTDIR => "Not a directory",
            libc::EISDIR => "Is a directory",
            libc::EINVAL => "Invalid argument",
            libc::ENFILE => "Too many open files in system",
            libc::EMFILE => "Too many open files",
            libc::ETXTBSY => "Text file busy",
            libc::ENOSPC => "No space left on device",
            libc::ELOOP => "Too many levels of symbolic links",
            libc::ENAMETOOLONG => "File name too long",
            libc::ENOSYS => "Function not implemented",
            libc::EOPNOTSUPP => "Operation not supported",
            libc::ELIBBAD => "Accessing a corrupted shared library",
            _ => "Unknown error",
        };
        write!(f, "{text} (os error {})", self.0)
    }
}

/// A line of text written into a fixed buffer (never allocating); what does not fit is cut.
pub struct FixedText<const N: usize> {
    bytes: [u8; N],
    len: usize,
}

impl<const N: usize> FixedText<N> {
    /// An empty text.
    pub fn new() -> Self {
        Self {
            bytes: [0; N],
            len: 0,
        }
    }

    /// What was written, cut at a character boundary.
    pub fn as_str(&self) -> &str {
        match std::str::from_utf8(&self.bytes[..self.len]) {
            Ok(text) => text,
            Err(e) => std::str::from_utf8(&self.bytes[..e.valid_up_to()]).unwrap_or(""),
        }
    }

    /// The raw bytes written so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Appends `bytes` (cut when full).
    pub fn push(&mut self, bytes: &[u8]) {
        let room = N - self.len;
        let take = bytes.len().min(room);
        self.bytes[self.len..self.len + take].copy_from_slice(&bytes[..take]);
        self.len += take;
    }
}

impl<const N: usize> Default for FixedText<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// What does not fit is cut, and reported as written: a handshake line is cut rather than lost.
impl<const N: usize> std::io::Write for FixedText<N> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.push(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<const N: usize> std::fmt::Write for FixedText<N> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write;

    #[test]
    fn errors_come_back_as_values() {
        // SAFETY: close of a descriptor that cannot be open.
        let closed = unsafe { call(libc::SYS_close, [1 << 30, 0, 0, 0, 0, 0]) };
        assert_eq!(closed, Err(libc::EBADF));
        // SAFETY: getpid takes no arguments.
        let pid = unsafe { call(libc::SYS_getpid, [0; 6]) };
        assert_eq!(pid, Ok(std::process::id() as usize));
    }

    #[test]
    fn errno_text_matches_the_standard_library() {
        for errno in [
            libc::ENOENT,
            libc::EACCES,
            libc::ENOTDIR,
            libc::E2BIG,
            libc::EPERM,
        ] {
            let mut ours = FixedText::<128>::new();
            write!(ours, "{}", ErrnoText(errno)).unwrap();
            assert_eq!(
                ours.as_str(),
                std::io::Error::from_raw_os_error(errno).to_string()
            );
        }
    }

    #[test]
    fn fixed_text_cuts_at_a_character_boundary() {
        let mut short = FixedText::<3>::new();
        short.push("abé".as_bytes()); // 'é' is two bytes: only one fits
        assert_eq!(short.as_str(), "ab");
        short.push(b"zz");
        assert_eq!(short.as_bytes().len(), 3);
    }

    #[test]
    fn signal_sets_have_one_bit_per_signal() {
        assert_eq!(sigset_of(&[libc::SIGHUP]), 1);
        assert_eq!(
            sigset_of(&[libc::SIGCHLD, libc::SIGUSR1]),
            (1 << 16) | (1 << 9)
        );
        assert_eq!(sigset_of(&[0, 65]), 0);
    }
}
