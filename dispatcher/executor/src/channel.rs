//! The executor's socket: the node's direct channel, beside the attach stream.
//!
//! The node shares a directory of its own with the sandbox (a bind mount at `channel_dir`,
//! created by the node as root with mode 0700). At start, while its filesystem identity is still
//! root, the executor binds `executor.sock` there with mode 0600, so nothing running as the
//! sandbox user can reach it: the directory cannot be searched and the socket cannot be written,
//! which `connect` needs. The executor refuses a directory that is not root's or that others may
//! enter, and a connection from a peer that is not root (`SO_PEERCRED`), so a misconfigured
//! node falls back to the attach stream instead of opening a door.
//!
//! Each accepted connection is served like stdin (same framing, same requests), with its own
//! answers and, from then on, every event: a newer connection (a node adopting the sandbox)
//! replaces the previous one, which is shut down. The end of a connection stops only its
//! reader; the executor's life still ends with stdin.

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};

use rustix::fs::Mode;

/// The socket's name in the channel directory.
pub const SOCKET_NAME: &str = "executor.sock";

/// Why the channel could not be opened (the attach stream still serves).
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The directory is missing, not a directory, not root's, or open to others.
    #[error("channel directory {dir}: {why}")]
    Directory {
        /// The configured directory.
        dir: String,
        /// What is wrong with it.
        why: String,
    },
    /// Binding or restricting the socket failed.
    #[error("cannot bind {path}: {source}")]
    Bind {
        /// The socket's path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Binds the socket in `dir`; call before the filesystem identity becomes the sandbox user's.
pub fn bind(dir: &str) -> Result<UnixListener, ChannelError> {
    let refuse = |why: String| ChannelError::Directory {
        dir: dir.to_owned(),
        why,
    };
    let meta = std::fs::symlink_metadata(dir).map_err(|e| refuse(e.to_string()))?;
    if !meta.is_dir() {
        return Err(refuse("not a directory".to_owned()));
    }
    if meta.uid() != 0 || meta.mode() & 0o077 != 0 {
        return Err(refuse(format!(
            "owned by uid {} with mode {:o}; it must be root's with mode 0700",
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    let path = format!("{dir}/{SOCKET_NAME}");
    let failed = |source: std::io::Error| ChannelError::Bind {
        path: path.clone(),
        source,
    };
    // A socket file of a previous executor in this directory would make bind fail.
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(failed(e)),
    }
    // Born 0600: no moment where the socket is open to others.
    let old = rustix::process::umask(Mode::from_raw_mode(0o177));
    let listener = UnixListener::bind(&path);
    rustix::process::umask(old);
    let listener = listener.map_err(failed)?;
    rustix::fs::chmod(path.as_str(), Mode::from_raw_mode(0o600)).map_err(|e| failed(e.into()))?;
    Ok(listener)
}

/// The uid of the process that connected `stream` (`SO_PEERCRED`: fixed at `connect`).
fn peer_uid(stream: &UnixStream) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a plain struct we own, and
    // `len` back; the descriptor is borrowed from a live stream.
    let done = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    if done != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(std::io::Error::other("short SO_PEERCRED answer"));
    }
    Ok(cred.uid)
}

/// Accepts connections for the executor's life, handing each root peer to `serve` and shutting
/// the previous connection down; refuses other peers.
pub fn accept_loop(listener: UnixListener, mut serve: impl FnMut(UnixStream)) {
    let mut previous: Option<UnixStream> = None;
    for connection in listener.incoming() {
        let stream = match connection {
            Ok(stream) => stream,
            Err(e) => {
                crate::log_event!("channel: accept failed: {e}");
                // Out of descriptors and the like: do not spin.
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        match peer_uid(&stream) {
            Ok(0) => {}
            Ok(uid) => {
                crate::log_event!("channel: refused a connection from uid {uid}");
                continue;
            }
            Err(e) => {
                crate::log_event!("channel: cannot read a peer's credentials ({e}); refused");
                continue;
            }
        }
        if let Some(old) = previous.take() {
            let _ = old.shutdown(std::net::Shutdown::Both);
        }
        previous = stream.try_clone().ok();
        serve(stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;

    fn fresh_dir(mode: u32) -> String {
        let dir = std::env::temp_dir().join(format!(
            "executor-channel-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).expect("chmod");
        dir.to_string_lossy().into_owned()
    }

    #[test]
    fn a_directory_others_may_enter_is_refused_and_the_socket_is_born_0600() {
        assert!(
            rustix::process::getuid().is_root(),
            "the channel is root's: run this test as root"
        );
        let open = fresh_dir(0o755);
        assert!(matches!(bind(&open), Err(ChannelError::Directory { .. })));
        assert!(matches!(
            bind(&format!("{open}/missing")),
            Err(ChannelError::Directory { .. })
        ));
        let closed = fresh_dir(0o700);
        let _listener = bind(&closed).expect("bind in a 0700 root directory");
        let meta = std::fs::metadata(format!("{closed}/{SOCKET_NAME}")).expect("stat");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.uid(), 0);
        // Binding again (an executor restarted in the same directory) replaces the socket.
        let _again = bind(&closed).expect("bind again");
        let _ = std::fs::remove_dir_all(open);
        let _ = std::fs::remove_dir_all(closed);
    }

    #[test]
    fn the_sandbox_user_can_neither_reach_the_socket_nor_be_served_through_it() {
        assert!(
            rustix::process::getuid().is_root(),
            "this test switches uids as the executor does: run it as root"
        );
        let dir = fresh_dir(0o700);
        let listener = bind(&dir).expect("bind");
        let path = format!("{dir}/{SOCKET_NAME}");
        let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = std::sync::Arc::clone(&served);
        std::thread::spawn(move || {
            accept_loop(listener, |mut stream| {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = stream.write_all(b"served\n");
            })
        });
        // As the sandbox user (on a thread of its own: credentials are per thread), the
        // directory cannot be searched.
        let as_user = {
            let path = path.clone();
            move || {
                crate::identity::charged_to_sandbox_user(65534, 65534, || {
                    UnixStream::connect(&path).map(|_| ())
                })
            }
        };
        let refused = std::thread::spawn(as_user.clone()).join().expect("thread");
        assert_eq!(
            refused.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::PermissionDenied)
        );
        // Even with the directory and the socket opened up, a peer that is not root is not
        // served: the connection is closed without a byte.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let path_for_user = path.clone();
        let read_as_user = std::thread::spawn(move || {
            let stream = crate::identity::charged_to_sandbox_user(65534, 65534, || {
                UnixStream::connect(&path_for_user)
            });
            let mut stream = stream.expect("connect with the socket opened up");
            let mut got = Vec::new();
            stream.read_to_end(&mut got).map(|_| got)
        })
        .join()
        .expect("thread");
        assert_eq!(
            read_as_user.expect("read"),
            b"",
            "a non-root peer is refused"
        );
        assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 0);
        // Root is served.
        let mut root = UnixStream::connect(&path).expect("connect as root");
        let mut line = [0u8; 7];
        root.read_exact(&mut line).expect("read");
        assert_eq!(&line, b"served\n");
        assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 1);
        let _ = std::fs::remove_dir_all(dir);
    }
}
