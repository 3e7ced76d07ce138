//! The one error type every operation returns, and how OS errors map onto protocol kinds.
//!
//! Handlers build an [`OpError`] that already carries the wire [`ErrorKind`] and a message that
//! names the path or argument concerned, so the server only serializes it. OS errors are mapped in
//! one place ([`OpError::os`]) so that, say, `EXDEV` from `openat2` always reads as an escape.

use rustix::io::Errno;

use crate::protocol::ErrorKind;

/// A failed operation: the wire kind plus a human message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct OpError {
    /// The protocol category.
    pub kind: ErrorKind,
    /// The explanation sent to the caller.
    pub message: String,
}

/// Result of an operation.
pub type OpResult<T> = Result<T, OpError>;

impl OpError {
    /// An error of the given kind.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        OpError {
            kind,
            message: message.into(),
        }
    }

    /// `invalid_request` with a message.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    /// Maps an OS error met while doing `what` on `path` to a kind and a message.
    ///
    /// `EXDEV` and `ELOOP` come from `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` or
    /// `O_NOFOLLOW` refusing to leave the root or to follow a link, so they read as
    /// `path_not_allowed`.
    pub fn os(errno: Errno, what: &str, path: &str) -> Self {
        let (kind, detail) = match errno {
            Errno::NOENT => (ErrorKind::NotFound, "no such file or directory"),
            Errno::EXIST => (ErrorKind::AlreadyExists, "already exists"),
            Errno::NOTDIR => (
                ErrorKind::NotADirectory,
                "a path component is not a directory",
            ),
            Errno::ISDIR => (ErrorKind::IsADirectory, "is a directory"),
            Errno::XDEV => (
                ErrorKind::PathNotAllowed,
                "resolution would leave the allowed root (via '..' or a symlink)",
            ),
            Errno::LOOP => (
                ErrorKind::PathNotAllowed,
                "a symbolic link, magic link or link loop was refused",
            ),
            Errno::ACCESS | Errno::PERM => (
                ErrorKind::PermissionDenied,
                "permission denied for the sandbox user",
            ),
            Errno::NOTEMPTY => (ErrorKind::DirectoryNotEmpty, "directory is not empty"),
            Errno::NAMETOOLONG => (ErrorKind::InvalidRequest, "name too long"),
            Errno::FBIG => (ErrorKind::TooLarge, "file too large"),
            Errno::NOSPC | Errno::DQUOT => (
                ErrorKind::NoSpace,
                "no space left: the workspace is full (it has a size limit)",
            ),
            Errno::ROFS => (ErrorKind::PermissionDenied, "read-only file system"),
            _ => (ErrorKind::Io, ""),
        };
        let message = if detail.is_empty() {
            format!("{what} '{path}': {errno}")
        } else {
            format!("{what} '{path}': {detail}")
        };
        OpError { kind, message }
    }

    /// Like [`OpError::os`] for a `std::io::Error`.
    pub fn io(err: &std::io::Error, what: &str, path: &str) -> Self {
        match err.raw_os_error() {
            Some(code) => Self::os(Errno::from_raw_os_error(code), what, path),
            None => OpError::new(ErrorKind::Io, format!("{what} '{path}': {err}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_map_to_path_not_allowed() {
        let e = OpError::os(Errno::XDEV, "open", "../etc/passwd");
        assert_eq!(e.kind, ErrorKind::PathNotAllowed);
        assert!(e.message.contains("../etc/passwd"));
        assert_eq!(
            OpError::os(Errno::LOOP, "open", "l").kind,
            ErrorKind::PathNotAllowed
        );
        assert_eq!(
            OpError::os(Errno::NOENT, "open", "x").kind,
            ErrorKind::NotFound
        );
        assert_eq!(OpError::os(Errno::IO, "read", "x").kind, ErrorKind::Io);
    }
}
