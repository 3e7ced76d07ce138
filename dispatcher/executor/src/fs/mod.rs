//! The `fs.*` operations, one file each, plus the helpers they share.
//!
//! Every operation resolves its path through `roots.rs` (openat2 beneath an allowed root) and then
//! works only with descriptors: `*at` syscalls on the parent directory for the final component,
//! never following a symlink there when changing anything. All of this runs on threads whose
//! filesystem uid/gid are the sandbox user's (see `identity.rs`), so the kernel applies that
//! user's permissions and new files belong to it.

pub mod create_dir;
pub mod delete;
pub mod edit;
pub mod glob;
pub mod grep;
pub mod list;
pub mod read;
pub mod walk;
pub mod watch;
pub mod write;

use std::fs::File;
use std::io::Read;

use rustix::fd::{BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, OFlags, Stat};

use crate::error::{OpError, OpResult};
use crate::protocol::ErrorKind;

/// Flags for opening a file to read its content: no blocking on FIFOs, no controlling tty.
pub const READ_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);

/// The type bits of a stat.
pub fn file_type(stat: &Stat) -> FileType {
    FileType::from_raw_mode(stat.st_mode)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub fn stat_nofollow<P: rustix::path::Arg>(
    dir: BorrowedFd<'_>,
    name: P,
) -> rustix::io::Result<Stat> {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
}

/// Checks that an opened descriptor is a regular file, naming `display` otherwise.
pub fn require_regular(fd: &OwnedFd, display: &str) -> OpResult<Stat> {
    let stat = rustix::fs::fstat(fd).map_err(|e| OpError::os(e, "cannot stat", display))?;
    match file_type(&stat) {
        FileType::RegularFile => Ok(stat),
        other => Err(not_a_regular_file(other, display)),
    }
}

/// The refusal of a file operation on `display`, which is of type `found` (a directory or any
/// other type that is not a regular file).
pub fn not_a_regular_file(found: FileType, display: &str) -> OpError {
    match found {
        FileType::Directory => OpError::new(
            ErrorKind::IsADirectory,
            format!("'{display}' is a directory"),
        ),
        other => OpError::new(
            ErrorKind::NotARegularFile,
            format!("'{display}' is not a regular file ({other:?})"),
        ),
    }
}

/// Reads at most `max` bytes; the flag says whether the file had more.
pub fn read_capped(fd: OwnedFd, max: u64, display: &str) -> OpResult<(Vec<u8>, bool)> {
    let mut bytes = Vec::new();
    File::from(fd)
        .take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| OpError::io(&e, "cannot read", display))?;
    let more = bytes.len() as u64 > max;
    if more {
        bytes.truncate(usize::try_from(max).unwrap_or(usize::MAX));
    }
    Ok((bytes, more))
}

/// The byte offset of the first `\n` in `bytes`.
pub fn find_newline(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b == b'\n')
}
