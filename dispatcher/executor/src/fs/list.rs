//! `fs.list`: the entries of one directory, typed without following symlinks, with what each
//! one's own stat says (mode, modification time, size), a symlink's target as stored, and a
//! regular file's user metadata (its `user.e2b.*` extended attributes).

use std::collections::BTreeMap;

use rustix::fd::BorrowedFd;
use rustix::fs::{Dir, Mode, OFlags, Stat};

use crate::context::Context;
use crate::error::{OpError, OpResult};
use crate::fs::{file_type, stat_nofollow};
use crate::protocol::{
    EntryType, ListEntry, ListResult, PathParams, MAX_METADATA_BYTES, METADATA_XATTR_PREFIX,
};
use crate::roots::Access;

/// Most entries returned.
pub const MAX_ENTRIES: usize = 10_000;

/// Runs `fs.list`.
pub fn run(ctx: &Context, params: PathParams) -> OpResult<ListResult> {
    let target = ctx.roots.resolve(&params.path, Access::Read)?;
    let fd = target.open(OFlags::RDONLY | OFlags::DIRECTORY)?;
    let mut dir = Dir::new(fd).map_err(|e| OpError::os(e, "cannot list", &target.display))?;
    let mut entries = Vec::new();
    let mut truncated = false;
    while let Some(entry) = dir.read() {
        let entry = entry.map_err(|e| OpError::os(e, "cannot list", &target.display))?;
        let raw = entry.file_name().to_bytes();
        if raw == b"." || raw == b".." {
            continue;
        }
        if entries.len() == MAX_ENTRIES {
            truncated = true;
            break;
        }
        let name = String::from_utf8_lossy(raw).into_owned();
        let stat = dir.fd().and_then(|fd| stat_nofollow(fd, entry.file_name()));
        let Ok(stat) = stat else {
            // Removed meanwhile: list it as untyped.
            entries.push(ListEntry {
                name,
                entry_type: EntryType::Other,
                size_bytes: 0,
                mode: None,
                modified_ns: None,
                inode_size: None,
                link_target: None,
                metadata: BTreeMap::new(),
            });
            continue;
        };
        let (entry_type, size_bytes) = match file_type(&stat) {
            rustix::fs::FileType::RegularFile => {
                (EntryType::File, u64::try_from(stat.st_size).unwrap_or(0))
            }
            rustix::fs::FileType::Directory => (EntryType::Directory, 0),
            rustix::fs::FileType::Symlink => (EntryType::Symlink, 0),
            _ => (EntryType::Other, 0),
        };
        // The link itself is read, never followed.
        let link_target = if entry_type == EntryType::Symlink {
            dir.fd()
                .and_then(|fd| rustix::fs::readlinkat(fd, entry.file_name(), Vec::new()))
                .ok()
                .map(|target| String::from_utf8_lossy(target.as_bytes()).into_owned())
        } else {
            None
        };
        let metadata = match (entry_type, dir.fd()) {
            (EntryType::File, Ok(fd)) => metadata_of(fd, entry.file_name()),
            _ => BTreeMap::new(),
        };
        entries.push(ListEntry {
            name,
            entry_type,
            size_bytes,
            mode: Some(stat.st_mode & 0o7777),
            modified_ns: modified_ns(&stat),
            inode_size: u64::try_from(stat.st_size).ok(),
            link_target,
            metadata,
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(ListResult { entries, truncated })
}

/// The user metadata of the regular file `name` in `dir` (its `user.e2b.*` extended
/// attributes), read through a descriptor opened without following a link (non-blocking, so a
/// file swapped for a FIFO meanwhile cannot hang the listing); none when it cannot be read.
pub(crate) fn metadata_of<P: rustix::path::Arg>(
    dir: BorrowedFd<'_>,
    name: P,
) -> BTreeMap<String, String> {
    let mut metadata = BTreeMap::new();
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let Ok(fd) = rustix::fs::openat(dir, name, flags, Mode::empty()) else {
        return metadata;
    };
    let mut names = vec![0u8; MAX_METADATA_BYTES];
    let Ok(len) = rustix::fs::flistxattr(&fd, &mut names[..]) else {
        return metadata;
    };
    let mut value = vec![0u8; MAX_METADATA_BYTES];
    for attribute in names[..len].split(|b| *b == 0) {
        let Some(key) = attribute.strip_prefix(METADATA_XATTR_PREFIX.as_bytes()) else {
            continue;
        };
        let (Ok(key), Ok(attribute)) = (std::str::from_utf8(key), std::str::from_utf8(attribute))
        else {
            continue;
        };
        if key.is_empty() {
            continue;
        }
        if let Ok(n) = rustix::fs::fgetxattr(&fd, attribute, &mut value[..]) {
            metadata.insert(
                key.to_owned(),
                String::from_utf8_lossy(&value[..n]).into_owned(),
            );
        }
    }
    metadata
}

/// The modification time of `stat`, in nanoseconds since the epoch.
fn modified_ns(stat: &Stat) -> Option<i64> {
    whole(stat.st_mtime)?
        .checked_mul(1_000_000_000)?
        .checked_add(whole(stat.st_mtime_nsec)?)
}

/// A stat field as an `i64` (their types vary by architecture).
fn whole<T: TryInto<i64>>(value: T) -> Option<i64> {
    value.try_into().ok()
}
