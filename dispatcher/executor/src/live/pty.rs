//! A pseudo-terminal from the kernel: `/dev/ptmx` for the master, `TIOCGPTPEER` for the slave
//! (no path of `/dev/pts` is looked up), `TIOCSWINSZ` for its size. The master stays in the
//! executor (output, input, resize); the slave becomes the process's stdin, stdout, stderr and
//! controlling terminal (`spawn.rs`).

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

/// A new terminal of `size`: (master, non-blocking; slave).
pub fn open(size: PtySize) -> OpResult<(OwnedFd, OwnedFd)> {
    check_size(size)?;
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
    let slave = rustix::pty::ioctl_tiocgptpeer(&master, flags).map_err(|e| failed("open", e))?;
    resize(&master, size)?;
    let status = rustix::fs::fcntl_getfl(&master).map_err(|e| failed("configure", e))?;
    rustix::fs::fcntl_setfl(&master, status | OFlags::NONBLOCK)
        .map_err(|e| failed("configure", e))?;
    Ok((master, slave))
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
        let (master, slave) = open(PtySize {
            cols: 100,
            rows: 30,
        })
        .expect("a terminal");
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
