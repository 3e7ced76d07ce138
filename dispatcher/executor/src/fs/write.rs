//! `fs.write`, and the replace-by-rename that `fs.edit` shares.
//!
//! A file is never written in place: the new content goes to a fresh temporary file created
//! `O_EXCL | O_NOFOLLOW` in the same directory (so it belongs to the sandbox user), which is then
//! `renameat`-ed over the final name. Renaming replaces the directory entry itself, so a symlink
//! or a hard link swapped in at the last moment is replaced, never written through. Before that,
//! the current entry is checked: a symlink, a directory, a special file or a file with more than
//! one hard link is refused, so a request never silently changes what another name points at.
//! A write's user metadata (`metadata`, E2B's file metadata) goes on the temporary file before
//! the rename, as `user.e2b.*` extended attributes, so the new content and its metadata
//! replace the old together.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat, XattrFlags};
use rustix::io::Errno;

use crate::context::Context;
use crate::encoding;
use crate::error::{OpError, OpResult};
use crate::fs::{create_dir, file_type, not_a_regular_file, stat_nofollow};
use crate::paths;
use crate::protocol::{
    ErrorKind, WriteParams, WriteResult, MAX_METADATA_BYTES, MAX_METADATA_KEY_BYTES,
    METADATA_XATTR_PREFIX,
};
use crate::roots::{Access, Target};

/// Runs `fs.write`.
pub fn run(ctx: &Context, params: WriteParams) -> OpResult<WriteResult> {
    let target = write_target(ctx, &params.path, &params.metadata)?;
    let bytes = encoding::decode(params.content, params.encoding, "content")?;
    if bytes.len() as u64 > ctx.config.max_file_bytes {
        return Err(OpError::new(
            ErrorKind::TooLarge,
            format!(
                "content for '{}' is {} bytes, more than the limit of {}",
                target.display,
                bytes.len(),
                ctx.config.max_file_bytes
            ),
        ));
    }
    let (parent, name, existing) = write_place(&target, params.create_dirs)?;
    if params.append {
        if existing.is_none() {
            return Err(OpError::new(
                ErrorKind::NotFound,
                format!(
                    "'{}' does not exist; append adds to an existing file",
                    target.display
                ),
            ));
        }
        append(
            parent.as_fd(),
            name,
            &bytes,
            &params.metadata,
            &target.display,
        )?;
        return Ok(WriteResult {
            bytes_written: bytes.len() as u64,
            created: false,
        });
    }
    let mode = existing.as_ref().map_or(0o644, |s| s.st_mode & 0o777);
    replace(
        parent.as_fd(),
        name,
        &bytes,
        mode,
        &params.metadata,
        &target.display,
    )?;
    Ok(WriteResult {
        bytes_written: bytes.len() as u64,
        created: existing.is_none(),
    })
}

/// What a whole-file write (`fs.write`, `fs.write_stream`) writes to: `path` resolved for
/// writing, refused when it is an allowed root itself or when `metadata` is not valid.
pub fn write_target<'r>(
    ctx: &'r Context,
    path: &str,
    metadata: &BTreeMap<String, String>,
) -> OpResult<Target<'r>> {
    let target = ctx.roots.resolve(path, Access::Write)?;
    if target.is_root() {
        return Err(OpError::new(
            ErrorKind::IsADirectory,
            format!("'{}' is an allowed root directory", target.display),
        ));
    }
    check_metadata(metadata)?;
    Ok(target)
}

/// Where a whole-file write puts its new file: the target's parent directory (made first when
/// `create_dirs`), the name in it, and what is at that name now ([`check_replaceable`]).
pub fn write_place<'t>(
    target: &'t Target<'_>,
    create_dirs: bool,
) -> OpResult<(OwnedFd, &'t str, Option<Stat>)> {
    let (parent_rel, name) = paths::split_parent(&target.rel);
    let parent = if create_dirs {
        create_dir::create_all(target, parent_rel)?.0
    } else {
        target.parent()?.0
    };
    let existing = check_replaceable(parent.as_fd(), name, &target.display)?;
    Ok((parent, name, existing))
}

/// Returns the stat of what is at `name` now (`None` if nothing), refusing anything that must not
/// be replaced: symlinks, directories, special files, files with several hard links.
pub fn check_replaceable(dir: BorrowedFd<'_>, name: &str, display: &str) -> OpResult<Option<Stat>> {
    let stat = match stat_nofollow(dir, name) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(OpError::os(e, "cannot inspect", display)),
    };
    match file_type(&stat) {
        FileType::RegularFile if stat.st_nlink > 1 => Err(OpError::new(
            ErrorKind::HardLinkRefused,
            format!(
                "'{display}' has {} hard links; refusing to write a file that other names share",
                stat.st_nlink
            ),
        )),
        FileType::RegularFile => Ok(Some(stat)),
        FileType::Symlink => Err(OpError::new(
            ErrorKind::PathNotAllowed,
            format!("'{display}' is a symbolic link; refusing to write through or over it"),
        )),
        other => Err(not_a_regular_file(other, display)),
    }
}

/// Appends to the regular file `name` in `dir`: opened without following a link, and checked
/// again once open (a regular file with one name), so nothing planted between the check and
/// the open is written through.
fn append(
    dir: BorrowedFd<'_>,
    name: &str,
    bytes: &[u8],
    metadata: &BTreeMap<String, String>,
    display: &str,
) -> OpResult<()> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::APPEND | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| OpError::os(e, "cannot open for appending", display))?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| OpError::os(e, "cannot inspect", display))?;
    if file_type(&stat) != FileType::RegularFile || stat.st_nlink != 1 {
        return Err(OpError::new(
            ErrorKind::NotARegularFile,
            format!("'{display}' changed into something other than a regular file with one name"),
        ));
    }
    set_metadata(&fd, metadata, display)?;
    File::from(fd)
        .write_all(bytes)
        .map_err(|e| OpError::io(&e, "cannot write", display))
}

/// Refuses metadata outside the bounds of [`METADATA_XATTR_PREFIX`].
pub fn check_metadata(metadata: &BTreeMap<String, String>) -> OpResult<()> {
    let mut total = 0usize;
    for (key, value) in metadata {
        if key.is_empty() || key.len() > MAX_METADATA_KEY_BYTES || key.contains('\0') {
            return Err(OpError::new(
                ErrorKind::InvalidRequest,
                format!("metadata keys are 1 to {MAX_METADATA_KEY_BYTES} bytes without NUL"),
            ));
        }
        if value.contains('\0') {
            return Err(OpError::new(
                ErrorKind::InvalidRequest,
                format!("the metadata value of {key:?} holds a NUL byte"),
            ));
        }
        total += METADATA_XATTR_PREFIX.len() + key.len() + value.len();
    }
    if total > MAX_METADATA_BYTES {
        return Err(OpError::new(
            ErrorKind::InvalidRequest,
            format!("metadata is larger than {MAX_METADATA_BYTES} bytes in all"),
        ));
    }
    Ok(())
}

/// Keeps `metadata` on the open file `fd` as `user.e2b.*` extended attributes.
fn set_metadata(fd: impl AsFd, metadata: &BTreeMap<String, String>, display: &str) -> OpResult<()> {
    for (key, value) in metadata {
        let attribute = format!("{METADATA_XATTR_PREFIX}{key}");
        rustix::fs::fsetxattr(
            &fd,
            attribute.as_str(),
            value.as_bytes(),
            XattrFlags::empty(),
        )
        .map_err(|e| {
            if e == rustix::io::Errno::OPNOTSUPP {
                // gVisor before 2025 keeps no extended attributes on files its gofer serves
                // from the host (the workspace volume among them).
                OpError::os(
                    e,
                    "cannot keep metadata (this sandbox's filesystem has no extended attributes) on",
                    display,
                )
            } else {
                OpError::os(e, "cannot keep metadata on", display)
            }
        })?;
    }
    Ok(())
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The start and end of the temporary files [`replace`] makes.
const TEMP_PREFIX: &str = ".sbx-write-";
const TEMP_SUFFIX: &str = ".tmp";

/// Whether `name` is one of the temporary files [`replace`] writes and renames over its final
/// name (a watch reports their changes under that name: `fs/watch.rs`).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX) && name.ends_with(TEMP_SUFFIX)
}

/// Writes `bytes` to a temporary file beside `name`, with `metadata`, and renames it over
/// `name`.
pub fn replace(
    dir: BorrowedFd<'_>,
    name: &str,
    bytes: &[u8],
    mode: u32,
    metadata: &BTreeMap<String, String>,
    display: &str,
) -> OpResult<()> {
    let mut temp = Temp::create(dir, display)?;
    temp.write(bytes)?;
    temp.commit(name, mode, metadata)
}

/// A fresh temporary file beside a name, created `O_EXCL | O_NOFOLLOW` (so it belongs to the
/// sandbox user), which becomes the name only by [`Temp::commit`]; dropped uncommitted, it is
/// removed, so a write that fails part way leaves the old file as it was and no half file.
pub struct Temp<'d> {
    dir: BorrowedFd<'d>,
    name: String,
    file: Option<File>,
    display: String,
}

impl<'d> Temp<'d> {
    /// Creates the temporary file in `dir`; `display` names the final path in errors.
    pub fn create(dir: BorrowedFd<'d>, display: &str) -> OpResult<Self> {
        loop {
            let candidate = format!(
                "{TEMP_PREFIX}{}-{}{TEMP_SUFFIX}",
                std::process::id(),
                TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            match rustix::fs::openat(
                dir,
                candidate.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            ) {
                Ok(fd) => {
                    return Ok(Temp {
                        dir,
                        name: candidate,
                        file: Some(File::from(fd)),
                        display: display.to_owned(),
                    })
                }
                Err(Errno::EXIST) => continue,
                Err(e) => {
                    return Err(OpError::os(
                        e,
                        "cannot create a temporary file beside",
                        display,
                    ))
                }
            }
        }
    }

    /// Appends `bytes` to the temporary file.
    pub fn write(&mut self, bytes: &[u8]) -> OpResult<()> {
        let Some(file) = self.file.as_mut() else {
            return Err(OpError::new(
                ErrorKind::Internal,
                format!("the temporary file of '{}' is closed", self.display),
            ));
        };
        file.write_all(bytes)
            .map_err(|e| OpError::io(&e, "cannot write", &self.display))
    }

    /// Sets the mode and `metadata` and renames the temporary file over `name`.
    pub fn commit(
        mut self,
        name: &str,
        mode: u32,
        metadata: &BTreeMap<String, String>,
    ) -> OpResult<()> {
        let Some(file) = self.file.take() else {
            return Err(OpError::new(
                ErrorKind::Internal,
                format!("the temporary file of '{}' is closed", self.display),
            ));
        };
        rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))
            .map_err(|e| OpError::os(e, "cannot set the mode of", &self.display))?;
        set_metadata(&file, metadata, &self.display)?;
        drop(file);
        rustix::fs::renameat(self.dir, self.name.as_str(), self.dir, name)
            .map_err(|e| OpError::os(e, "cannot replace", &self.display))?;
        // Renamed: nothing is left to remove.
        self.name.clear();
        Ok(())
    }
}

impl Drop for Temp<'_> {
    fn drop(&mut self) {
        drop(self.file.take());
        if !self.name.is_empty() {
            let _ = rustix::fs::unlinkat(self.dir, self.name.as_str(), AtFlags::empty());
        }
    }
}
