//! `fs.list`: the entries of one directory, typed without following symlinks.

use rustix::fs::{Dir, OFlags};

use crate::context::Context;
use crate::error::{OpError, OpResult};
use crate::fs::{file_type, stat_nofollow};
use crate::protocol::{EntryType, ListEntry, ListResult, PathParams};
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
        let (entry_type, size_bytes) = match stat {
            Ok(stat) => match file_type(&stat) {
                rustix::fs::FileType::RegularFile => {
                    (EntryType::File, u64::try_from(stat.st_size).unwrap_or(0))
                }
                rustix::fs::FileType::Directory => (EntryType::Directory, 0),
                rustix::fs::FileType::Symlink => (EntryType::Symlink, 0),
                _ => (EntryType::Other, 0),
            },
            // Removed meanwhile: list it as untyped.
            Err(_) => (EntryType::Other, 0),
        };
        entries.push(ListEntry {
            name,
            entry_type,
            size_bytes,
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(ListResult { entries, truncated })
}
