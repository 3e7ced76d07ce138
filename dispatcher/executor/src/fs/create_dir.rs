//! `fs.create_dir`, and the `mkdir -p` walk that `fs.write` also uses for missing parents.
//!
//! Each component is created with `mkdirat` in a parent that was itself opened beneath the root,
//! and then the accumulated prefix is reopened from the root with `openat2(RESOLVE_BENEATH)`, so a
//! component that already exists as a symlink can lead only to a directory inside the root.

use rustix::fd::OwnedFd;
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::context::Context;
use crate::error::{OpError, OpResult};
use crate::protocol::{CreateDirResult, ErrorKind, PathParams};
use crate::roots::{Access, Target};

/// Runs `fs.create_dir`.
pub fn run(ctx: &Context, params: PathParams) -> OpResult<CreateDirResult> {
    let target = ctx.roots.resolve(&params.path, Access::Write)?;
    let (_, created) = create_all(&target, &target.rel)?;
    Ok(CreateDirResult { created })
}

/// Creates `rel` (relative to the target's root) and its missing parents; returns the directory
/// (`O_PATH`) and whether its last component was newly created.
pub fn create_all(target: &Target<'_>, rel: &str) -> OpResult<(OwnedFd, bool)> {
    let dir_flags = OFlags::PATH | OFlags::DIRECTORY;
    let mut current = target.open_rel("", dir_flags)?;
    let mut created = false;
    if rel.is_empty() {
        return Ok((current, created));
    }
    let mut end = 0;
    for component in rel.split('/') {
        end += component.len();
        let prefix = &rel[..end];
        let display = target.root_display(prefix);
        created = match rustix::fs::mkdirat(&current, component, Mode::from_raw_mode(0o755)) {
            Ok(()) => true,
            Err(Errno::EXIST) => false,
            Err(e) => return Err(OpError::os(e, "cannot create directory", &display)),
        };
        current = match target.open_rel(prefix, dir_flags) {
            Ok(fd) => fd,
            Err(e) if e.kind == ErrorKind::NotADirectory => {
                return Err(OpError::new(
                    ErrorKind::AlreadyExists,
                    format!("'{display}' exists and is not a directory"),
                ))
            }
            Err(e) => return Err(e),
        };
        end += 1;
    }
    Ok((current, created))
}
