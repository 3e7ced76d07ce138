//! `fs.delete`: remove a file, symlink or directory, recursively on request.
//!
//! The final component is removed with `unlinkat` on its parent descriptor, so a symlink is
//! removed itself and never followed. A recursive delete walks the tree by descriptors: each
//! subdirectory is opened `O_NOFOLLOW | O_DIRECTORY` relative to its parent's descriptor, so a
//! directory swapped for a symlink mid-walk is unlinked as a link rather than entered. An allowed
//! root, or a directory that contains one, is never deleted.

use std::ffi::CString;

use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::context::Context;
use crate::error::{OpError, OpResult};
use crate::fs::{file_type, stat_nofollow};
use crate::protocol::{DeleteParams, DeleteResult, ErrorKind};
use crate::roots::Access;

/// Deepest directory nesting a recursive delete descends into.
const MAX_DEPTH: usize = 1024;

/// Runs `fs.delete`.
pub fn run(ctx: &Context, params: DeleteParams) -> OpResult<DeleteResult> {
    let target = ctx.roots.resolve(&params.path, Access::Write)?;
    ctx.roots.guard_delete(&target.display)?;
    let (parent, name) = target.parent()?;
    let display = &target.display;
    let stat = stat_nofollow(parent.as_fd(), name)
        .map_err(|e| OpError::os(e, "cannot delete", display))?;
    if file_type(&stat) != FileType::Directory {
        rustix::fs::unlinkat(&parent, name, AtFlags::empty())
            .map_err(|e| OpError::os(e, "cannot delete", display))?;
        return Ok(DeleteResult { deleted: true });
    }
    match rustix::fs::unlinkat(&parent, name, AtFlags::REMOVEDIR) {
        Ok(()) => {}
        Err(Errno::NOTEMPTY) if params.recursive => remove_tree(parent.as_fd(), name, display)?,
        Err(Errno::NOTEMPTY) => {
            return Err(OpError::new(
                ErrorKind::DirectoryNotEmpty,
                format!("'{display}' is a non-empty directory; set recursive to delete it"),
            ))
        }
        Err(e) => return Err(OpError::os(e, "cannot delete", display)),
    }
    Ok(DeleteResult { deleted: true })
}

struct Frame {
    dir: Dir,
    name: CString,
    retries: u8,
}

/// Deletes directory `name` in `parent` and everything beneath it, without following symlinks.
fn remove_tree(parent: BorrowedFd<'_>, name: &str, display: &str) -> OpResult<()> {
    let fail = |e: Errno| OpError::os(e, "cannot delete", display);
    let name = CString::new(name).map_err(|_| OpError::invalid("path contains a NUL byte"))?;
    let mut stack = vec![Frame {
        dir: open_dir(parent, &name).map_err(fail)?,
        name,
        retries: 0,
    }];
    while let Some(frame) = stack.last_mut() {
        let Some(entry) = frame.dir.read() else {
            let done = stack
                .pop()
                .unwrap_or_else(|| unreachable!("stack is non-empty"));
            let holder = match stack.last() {
                Some(up) => up.dir.fd().map_err(fail)?,
                None => parent,
            };
            match rustix::fs::unlinkat(holder, done.name.as_c_str(), AtFlags::REMOVEDIR) {
                Ok(()) => continue,
                // Entries appeared while we walked: go round once more, a few times at most.
                Err(Errno::NOTEMPTY) if done.retries < 3 => {
                    let mut again = done;
                    again.dir.rewind();
                    again.retries += 1;
                    stack.push(again);
                    continue;
                }
                Err(e) => return Err(fail(e)),
            }
        };
        let entry = entry.map_err(fail)?;
        let child = entry.file_name();
        if child.to_bytes() == b"." || child.to_bytes() == b".." {
            continue;
        }
        let dir_fd = frame.dir.fd().map_err(fail)?;
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            FileType::Unknown => stat_nofollow(dir_fd, child)
                .map(|s| file_type(&s) == FileType::Directory)
                .unwrap_or(false),
            _ => false,
        };
        if !is_dir {
            match rustix::fs::unlinkat(dir_fd, child, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => continue,
                // Swapped for a directory since we read the entry: take the directory path.
                Err(Errno::ISDIR) => {}
                Err(e) => return Err(fail(e)),
            }
        }
        match open_dir(dir_fd, child) {
            Ok(dir) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(OpError::new(
                        ErrorKind::Io,
                        format!("'{display}' is nested deeper than {MAX_DEPTH} directories"),
                    ));
                }
                stack.push(Frame {
                    dir,
                    name: child.to_owned(),
                    retries: 0,
                });
            }
            // Swapped for a symlink or file meanwhile: remove the entry itself.
            Err(Errno::NOTDIR) | Err(Errno::LOOP) => {
                match rustix::fs::unlinkat(dir_fd, child, AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => {}
                    Err(e) => return Err(fail(e)),
                }
            }
            Err(Errno::NOENT) => {}
            Err(e) => return Err(fail(e)),
        }
    }
    Ok(())
}

fn open_dir<P: rustix::path::Arg>(parent: BorrowedFd<'_>, name: P) -> rustix::io::Result<Dir> {
    let fd = rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Dir::new(fd)
}
