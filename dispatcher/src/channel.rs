//! The node's side of the direct channel: one directory per sandbox, shared by bind mount.
//!
//! With [`DispatcherConfig::channel_dir`](crate::DispatcherConfig) set, each sandbox gets
//! `<channel_dir>/<sandbox id>/`, created by this process with mode 0700 and mounted at
//! [`TARGET`] in the container; the executor binds `executor.sock` there while it is still
//! root, with mode 0600. A call then travels one Unix socket: no dockerd, no containerd-shim.
//!
//! What keeps it out of the agent's reach: the directory is root's with mode 0700 and the
//! socket root's with mode 0600, while commands run as uid 65534 without capabilities (and
//! `fs.*` runs with that user's filesystem identity), so they can neither search the directory
//! nor connect (which needs write permission on the socket); the executor also refuses a
//! directory open to others and peers that are not root. A sandbox sees only its own
//! directory, never `channel_dir`, another sandbox's or anything else of the node's.
//!
//! The path must be the same for this process and the Docker daemon (the daemon resolves the
//! bind source on its host): when the node runs in a container, `channel_dir` is a host
//! directory bind-mounted at the same path. Whenever the directory cannot be made or the socket
//! cannot be reached, the sandbox is served over the attach stream instead.

use std::path::{Path, PathBuf};

use crate::spec::SandboxId;

/// Where the sandbox's channel directory is mounted in the container.
pub(crate) const TARGET: &str = "/run/aegis-channel";
/// The executor's socket in that directory (the executor's `channel::SOCKET_NAME`).
const SOCKET: &str = "executor.sock";

/// The longest `base` whose sockets fit in a Unix socket address (108 bytes with its NUL,
/// after `/<sandbox id>/executor.sock`, 51 bytes).
pub const MAX_BASE_LEN: usize = 107 - 1 - 36 - 1 - SOCKET.len();

/// The channel directory of sandbox `id` under `base`.
pub(crate) fn dir_of(base: &Path, id: SandboxId) -> PathBuf {
    base.join(id.to_string())
}

/// The socket of sandbox `id` under `base`.
pub(crate) fn socket_of(base: &Path, id: SandboxId) -> PathBuf {
    dir_of(base, id).join(SOCKET)
}

/// Creates the directory of sandbox `id` (mode 0700, and `base` 0700 if it is missing);
/// `None` with a warning when it cannot be made (the sandbox then uses the attach stream).
pub(crate) fn prepare(base: &Path, id: SandboxId) -> Option<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = dir_of(base, id);
    if base.as_os_str().len() > MAX_BASE_LEN {
        tracing::warn!(sandbox = %id, dir = %base.display(), "the channel directory's path is longer than {MAX_BASE_LEN} bytes, too long for a socket address; the sandbox uses the attach stream");
        return None;
    }
    let made = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(base)
        .and_then(|()| std::fs::DirBuilder::new().mode(0o700).create(&dir))
        // The umask may have taken bits away, never added any; say 0700 exactly.
        .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)));
    match made {
        Ok(()) => Some(dir),
        Err(e) => {
            tracing::warn!(sandbox = %id, dir = %dir.display(), error = %e, "cannot make the sandbox's channel directory; it uses the attach stream");
            None
        }
    }
}

/// Removes the directory of the sandbox whose container is named `container`, if any.
pub(crate) fn remove(base: &Path, container: &str) {
    let Some(id) = container
        .strip_prefix("aegis-sbx-")
        .and_then(|id| id.parse::<SandboxId>().ok())
    else {
        return;
    };
    let dir = dir_of(base, id);
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(sandbox = %id, dir = %dir.display(), error = %e, "cannot remove the sandbox's channel directory")
        }
    }
}
