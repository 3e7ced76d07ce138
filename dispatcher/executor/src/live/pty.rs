//! A pseudo-terminal from the kernel: `/dev/ptmx` for the master, `TIOCGPTPEER` for the slave
//! (no path of `/dev/pts` is looked up; where the kernel lacks it, gVisor's, `/dev/pts/<n>` by
//! the number `TIOCGPTN` gives), `TIOCSWINSZ` for its size. The master stays in the
//! executor (output, input, resize); the slave becomes the process's stdin, stdout, stderr and
//! controlling terminal (`spawn/vfork.rs`).
//!
//! The terminal is made as root (the handler thread's filesystem identity is switched for the
//! call) and its slave left mode 0600: devpts gives a new terminal the opener's filesystem uid
//! and gid, and a slave owned by the sandbox user could be opened by its `/dev/pts/N` name by any
//! other command of the sandbox, to read the keystrokes meant for this one. The process itself
//! uses the descriptors it was given and `/dev/tty`, which need no permission on the node.

use rustix::fd::OwnedFd;
use rustix::fs::OFlags;
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;

use crate::error::{OpError, OpResult};
use crate::protocol::{ErrorKind, PtySize};

/// Largest number of columns or rows accepted.
pub const MAX_CELLS: u16 = 1000;

/// Refuses a size of zero or over [`MAX_CELLS`].
pub fn check_size(size: PtySize) -> OpResult<()> {
    for (what, value) in [("cols", size.cols), ("rows", size.rows)] {
        if value == 0 || value > MAX_CELLS {
            return Err(OpError::invalid(format!(
                "pty.{what} must be between 1 and {MAX_CELLS}, not {value}"
            )));
        }
    }
    Ok(())
}

/// The thread's filesystem identity as root until dropped, then `(uid, gid)` again.
struct AsRoot {
    uid: u32,
    gid: u32,
}

impl AsRoot {
    fn enter(uid: u32, gid: u32) -> OpResult<AsRoot> {
        crate::identity::enter_sandbox_fs_identity(0, 0).map_err(|e| {
            OpError::new(
                ErrorKind::SpawnFailed,
                format!("cannot open a pseudo-terminal as root: {e}"),
            )
        })?;
        Ok(AsRoot { uid, gid })
    }
}

impl Drop for AsRoot {
    fn drop(&mut self) {
        if let Err(e) = crate::identity::enter_sandbox_fs_identity(self.uid, self.gid) {
            // Every later file operation of this thread would run as root: never go on.
            crate::log_event!("fatal: cannot return to the sandbox user's identity: {e}");
            std::process::abort();
        }
    }
}

/// A new terminal of `size`: (master, non-blocking; slave, root's, mode 0600). `owner` is the
/// calling thread's filesystem identity (the sandbox user's), restored before returning.
pub fn open(size: PtySize, owner: (u32, u32)) -> OpResult<(OwnedFd, OwnedFd)> {
    check_size(size)?;
    let as_root = AsRoot::enter(owner.0, owner.1)?;
    let failed = |what: &str, e: rustix::io::Errno| {
        OpError::new(
            ErrorKind::SpawnFailed,
            format!(
                "cannot {what} a pseudo-terminal: {}",
                std::io::Error::from(e)
            ),
        )
    };
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags).map_err(|e| failed("open", e))?;
    rustix::pty::unlockpt(&master).map_err(|e| failed("unlock", e))?;
    let slave = match rustix::pty::ioctl_tiocgptpeer(&master, flags) {
        Ok(slave) => slave,
        // gVisor (runsc 2022) has no TIOCGPTPEER: the slave by its number instead.
        Err(rustix::io::Errno::NOTTY) => open_by_number(&master).map_err(|e| failed("open", e))?,
        Err(e) => return Err(failed("open", e)),
    };
    rustix::fs::fchmod(&slave, rustix::fs::Mode::from_raw_mode(0o600))
        .map_err(|e| failed("protect", e))?;
    drop(as_root);
    resize(&master, size)?;
    let status = rustix::fs::fcntl_getfl(&master).map_err(|e| failed("configure", e))?;
    rustix::fs::fcntl_setfl(&master, status | OFlags::NONBLOCK)
        .map_err(|e| failed("configure", e))?;
    Ok((master, slave))
}

/// The slave of `master` by the number devpts gave it (`TIOCGPTN`): `/dev/pts/<n>`, opened
/// without following a link, as root (the caller's identity); devpts is the kernel's and
/// root's, so nothing the sandbox user does can put another file at that name.
fn open_by_number(master: &OwnedFd) -> rustix::io::Result<OwnedFd> {
    let name = rustix::pty::ptsname(master, Vec::new())?;
    let name = name.to_str().map_err(|_| rustix::io::Errno::INVAL)?;
    let plain = name
        .strip_prefix("/dev/pts/")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if !plain {
        return Err(rustix::io::Errno::INVAL);
    }
    rustix::fs::openat(
        rustix::fs::CWD,
        name,
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        rustix::fs::Mode::empty(),
    )
}

/// Sets the terminal's size.
pub fn resize(master: &OwnedFd, size: PtySize) -> OpResult<()> {
    rustix::termios::tcsetwinsize(
        master,
        Winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )
    .map_err(|e| {
        OpError::new(
            ErrorKind::Io,
            format!(
                "cannot set the terminal's size: {}",
                std::io::Error::from(e)
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_has_its_size_and_carries_bytes_both_ways() {
        let size = PtySize {
            cols: 100,
            rows: 30,
        };
        let (master, slave) = open(size, (0, 0)).expect("a terminal");
        let stat = rustix::fs::fstat(&slave).expect("the slave's node");
        assert_eq!((stat.st_uid, stat.st_mode & 0o777), (0, 0o600));
        let size = rustix::termios::tcgetwinsize(&slave).expect("its size");
        assert_eq!((size.ws_col, size.ws_row), (100, 30));
        resize(
            &master,
            PtySize {
                cols: 120,
                rows: 40,
            },
        )
        .expect("resize");
        let size = rustix::termios::tcgetwinsize(&slave).expect("its size");
        assert_eq!((size.ws_col, size.ws_row), (120, 40));
        assert!(rustix::termios::isatty(&slave));
        rustix::io::write(&slave, b"out").expect("write to the slave");
        let mut buf = [0u8; 16];
        let mut fds = [rustix::event::PollFd::new(
            &master,
            rustix::event::PollFlags::IN,
        )];
        rustix::event::poll(&mut fds, None).expect("poll");
        let n = rustix::io::read(&master, &mut buf).expect("read the master");
        assert_eq!(&buf[..n], b"out");
    }

    #[test]
    fn sizes_out_of_range_are_refused() {
        for (cols, rows) in [(0, 10), (10, 0), (1001, 10), (10, 1001)] {
            let e = check_size(PtySize { cols, rows }).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
        }
        check_size(PtySize {
            cols: 1,
            rows: 1000,
        })
        .expect("in range");
    }
}
