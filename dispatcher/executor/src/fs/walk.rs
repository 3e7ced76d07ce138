//! A bounded, descriptor-based directory walk for `fs.grep` and `fs.glob`.
//!
//! Directories are entered only by `openat(parent_fd, name, O_DIRECTORY | O_NOFOLLOW)`, so the
//! walk never follows a symlink and therefore never leaves the directory it started from. Entries
//! are visited in name order (deterministic results), and the walk stops at a depth, an entry
//! count, or when the visitor says so; hitting a bound is reported, not hidden.

use std::ffi::CString;

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{Dir, FileType, Mode, OFlags};

use crate::fs::{file_type, stat_nofollow};

/// One entry met by the walk.
pub struct Entry<'a> {
    /// The directory holding the entry.
    pub dir: BorrowedFd<'a>,
    /// The entry's raw name, for `*at` calls.
    pub name: &'a CString,
    /// Its path relative to the walk's start, `/`-separated, lossily decoded.
    pub rel: &'a str,
    /// Its type, not following symlinks.
    pub file_type: FileType,
    /// 1 for entries directly in the start directory.
    pub depth: usize,
}

/// What the visitor wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Go on (and descend if the entry is a directory).
    Continue,
    /// Go on, but do not descend into this directory.
    Skip,
    /// End the walk.
    Stop,
}

/// Limits of one walk.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Deepest level entered.
    pub max_depth: usize,
    /// Most entries visited overall.
    pub max_entries: u64,
}

/// How the walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Entries visited.
    pub entries: u64,
    /// A limit was hit (or a directory could not be read) before the tree was exhausted.
    pub truncated: bool,
}

struct Frame {
    fd: OwnedFd,
    rel: String,
    entries: std::vec::IntoIter<(CString, FileType)>,
    depth: usize,
}

fn read_sorted(fd: &OwnedFd) -> rustix::io::Result<Vec<(CString, FileType)>> {
    let mut dir = Dir::read_from(fd)?;
    let mut out = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let kind = match entry.file_type() {
            FileType::Unknown => stat_nofollow(fd.as_fd(), name)
                .map(|s| file_type(&s))
                .unwrap_or(FileType::Unknown),
            kind => kind,
        };
        out.push((name.to_owned(), kind));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Walks the tree under `start` (a directory opened `O_RDONLY`), calling `visit` on each entry.
pub fn walk(start: OwnedFd, limits: Limits, mut visit: impl FnMut(&Entry<'_>) -> Step) -> Outcome {
    let mut outcome = Outcome {
        entries: 0,
        truncated: false,
    };
    let Ok(entries) = read_sorted(&start) else {
        outcome.truncated = true;
        return outcome;
    };
    let mut stack = vec![Frame {
        fd: start,
        rel: String::new(),
        entries: entries.into_iter(),
        depth: 1,
    }];
    while let Some(frame) = stack.last_mut() {
        let Some((name, kind)) = frame.entries.next() else {
            stack.pop();
            continue;
        };
        if outcome.entries >= limits.max_entries {
            outcome.truncated = true;
            break;
        }
        outcome.entries += 1;
        let lossy = String::from_utf8_lossy(name.to_bytes());
        let rel = if frame.rel.is_empty() {
            lossy.into_owned()
        } else {
            format!("{}/{lossy}", frame.rel)
        };
        let entry = Entry {
            dir: frame.fd.as_fd(),
            name: &name,
            rel: &rel,
            file_type: kind,
            depth: frame.depth,
        };
        match visit(&entry) {
            Step::Stop => {
                outcome.truncated = true;
                break;
            }
            Step::Skip => continue,
            Step::Continue => {}
        }
        if kind != FileType::Directory {
            continue;
        }
        if frame.depth >= limits.max_depth {
            outcome.truncated = true;
            continue;
        }
        let depth = frame.depth + 1;
        let opened = rustix::fs::openat(
            &frame.fd,
            name.as_c_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        );
        // A directory that vanished, became a symlink, or is unreadable by the sandbox user is
        // skipped; the results then may be incomplete, which `truncated` admits.
        let Ok(fd) = opened else {
            outcome.truncated = true;
            continue;
        };
        let Ok(entries) = read_sorted(&fd) else {
            outcome.truncated = true;
            continue;
        };
        stack.push(Frame {
            fd,
            rel,
            entries: entries.into_iter(),
            depth,
        });
    }
    outcome
}
