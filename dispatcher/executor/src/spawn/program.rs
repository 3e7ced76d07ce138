//! Finding `argv[0]` in the configured `PATH`.
//!
//! `argv[0]` must be a bare name (the orchestrator's allowlist names programs, not paths), and it
//! is looked up only in the executor's configured `PATH`, never in a `PATH` the caller passes in
//! `env`. A candidate counts when it is a regular file (after following symlinks, as busybox
//! applets are) that the sandbox user may execute.

use rustix::fs::{Access, AtFlags, FileType, Mode, OFlags, CWD};

use crate::error::{OpError, OpResult};
use crate::protocol::ErrorKind;

/// Returns the absolute path of `name` in `search_path`.
pub fn find(name: &str, search_path: &str) -> OpResult<String> {
    if name.is_empty() {
        return Err(OpError::invalid("argv[0] is empty"));
    }
    if name.contains('/') {
        return Err(OpError::invalid(format!(
            "argv[0] '{name}' contains '/': give a bare program name, it is looked up in PATH"
        )));
    }
    if name == "." || name == ".." || name.contains('\0') {
        return Err(OpError::invalid(format!(
            "argv[0] '{}' is not a program name",
            name.escape_default()
        )));
    }
    for dir in search_path.split(':').filter(|d| d.starts_with('/')) {
        let Ok(dir_fd) = rustix::fs::openat(
            CWD,
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let Ok(stat) = rustix::fs::statat(&dir_fd, name, AtFlags::empty()) else {
            continue;
        };
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            continue;
        }
        if rustix::fs::accessat(&dir_fd, name, Access::EXEC_OK, AtFlags::EACCESS).is_ok() {
            return Ok(format!("{}/{name}", dir.trim_end_matches('/')));
        }
    }
    Err(OpError::new(
        ErrorKind::CommandNotFound,
        format!("command '{name}' was not found in PATH ({search_path})"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_slashes_are_refused() {
        assert_eq!(
            find("/bin/sh", "/bin").unwrap_err().kind,
            ErrorKind::InvalidRequest
        );
        assert_eq!(
            find("./x", "/bin").unwrap_err().kind,
            ErrorKind::InvalidRequest
        );
        assert_eq!(
            find("", "/bin").unwrap_err().kind,
            ErrorKind::InvalidRequest
        );
    }

    #[test]
    fn lookup_uses_the_given_path_only() {
        assert!(find("sh", "/bin:/usr/bin").unwrap().ends_with("/sh"));
        assert_eq!(
            find("sh", "relative:/nonexistent").unwrap_err().kind,
            ErrorKind::CommandNotFound
        );
    }
}
