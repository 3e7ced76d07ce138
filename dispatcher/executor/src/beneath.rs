//! Resolution beneath a root without `openat2`: a component-by-component walk in userspace.
//!
//! Why: gVisor's kernel (runsc 2022) has no `openat2`, so `RESOLVE_BENEATH` cannot be asked of
//! it. The walk keeps the same rules by holding a descriptor for every directory it entered:
//!
//! * each component is opened with `openat(dir, name, O_NOFOLLOW)` from the directory above
//!   it, so the kernel never follows a link on its own;
//! * `..` pops the walk's own stack of descriptors (never the filesystem's `..`), and popping
//!   the root itself is refused with `EXDEV`, as `RESOLVE_BENEATH` does;
//! * a symbolic link is read (`readlinkat`) and its target walked by these same rules from the
//!   directory holding it: an absolute target is refused (`EXDEV`), a relative one climbing
//!   out is refused at the `..` that would leave; with `no_symlinks` any link is `ELOOP`
//!   (`RESOLVE_NO_SYMLINKS`); more than [`MAX_LINKS`] links is `ELOOP`;
//! * `/proc/.../fd` magic links read as absolute paths or as `pipe:[..]`-like names, so they are
//!   refused or not found, never followed (`RESOLVE_NO_MAGICLINKS`).
//!
//! A link swapped in during the walk changes nothing: what is opened is always a plain entry of
//! a directory already held, or a target read and walked by the same rules. The result is what
//! `openat2(dir, rel, flags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS [| RESOLVE_NO_SYMLINKS])`
//! gives, errors included, which the tests below check side by side on a kernel with both.

use std::collections::VecDeque;

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{fstat, openat, readlinkat, statat, AtFlags, FileType, Mode, OFlags};
use rustix::io::{Errno, Result};

/// Symbolic links one resolution may pass through (Linux's `MAXSYMLINKS`).
pub const MAX_LINKS: usize = 40;

/// Opens `rel` (no leading `/`; `""` is `dir` itself) beneath `dir` with `flags` and `mode`
/// (for `O_CREAT`), never resolving outside `dir`. `O_NOFOLLOW` in `flags` leaves a final link
/// unfollowed, as `openat2` does.
pub fn open(
    dir: BorrowedFd<'_>,
    rel: &str,
    flags: OFlags,
    mode: Mode,
    no_symlinks: bool,
) -> Result<OwnedFd> {
    let follow_last = !flags.contains(OFlags::NOFOLLOW);
    let mut held: Vec<OwnedFd> = vec![reopen(dir)?];
    let mut pending: VecDeque<String> = components(rel).collect();
    let mut links = 0usize;
    loop {
        let Some(name) = pending.pop_front() else {
            // Everything consumed: the target is the directory on top of the stack.
            return openat(top(&held), ".", flags | OFlags::CLOEXEC, mode);
        };
        if name == ".." {
            if held.len() == 1 {
                return Err(Errno::XDEV);
            }
            held.pop();
            continue;
        }
        let last = pending.is_empty();
        if !last {
            let fd = openat(
                top(&held),
                name.as_str(),
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            match FileType::from_raw_mode(fstat(&fd)?.st_mode) {
                FileType::Symlink => {
                    let target = link_target(top(&held), &name, no_symlinks, &mut links)?;
                    prepend(&mut pending, &target);
                }
                FileType::Directory => held.push(fd),
                _ => return Err(Errno::NOTDIR),
            }
            continue;
        }
        // The final component: opened without following; a link found there is followed by
        // the walk (unless the caller said O_NOFOLLOW), never by the kernel.
        let opened = openat(
            top(&held),
            name.as_str(),
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            mode,
        );
        let is_link = match &opened {
            Ok(fd) => {
                follow_last
                    && flags.contains(OFlags::PATH)
                    && FileType::from_raw_mode(fstat(fd)?.st_mode) == FileType::Symlink
            }
            Err(Errno::LOOP | Errno::NOTDIR) if follow_last => {
                statat(top(&held), name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink)
            }
            Err(_) => false,
        };
        if !is_link {
            return opened;
        }
        drop(opened);
        let target = link_target(top(&held), &name, no_symlinks, &mut links)?;
        prepend(&mut pending, &target);
    }
}

/// The descriptor on top of the walk's stack (the stack is never empty).
fn top(held: &[OwnedFd]) -> BorrowedFd<'_> {
    held.last()
        .map_or_else(|| unreachable!("the root is never popped"), AsFd::as_fd)
}

/// `dir` as a descriptor of our own (`O_PATH`), so the stack owns every entry.
fn reopen(dir: BorrowedFd<'_>) -> Result<OwnedFd> {
    openat(
        dir,
        ".",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// The path components of `rel`, empty ones and `.` left out.
fn components(rel: &str) -> impl Iterator<Item = String> + '_ {
    rel.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(str::to_owned)
}

/// Puts a link's target in front of what is still to walk.
fn prepend(pending: &mut VecDeque<String>, target: &str) {
    let parts: Vec<String> = components(target).collect();
    for part in parts.into_iter().rev() {
        pending.push_front(part);
    }
}

/// Reads the link `name` in `dir` and checks it may be followed: links allowed, fewer than
/// [`MAX_LINKS`] so far, a relative target.
fn link_target(
    dir: BorrowedFd<'_>,
    name: &str,
    no_symlinks: bool,
    links: &mut usize,
) -> Result<String> {
    if no_symlinks {
        return Err(Errno::LOOP);
    }
    *links += 1;
    if *links > MAX_LINKS {
        return Err(Errno::LOOP);
    }
    let target = readlinkat(dir, name, Vec::new())?;
    let target = target.to_str().map_err(|_| Errno::INVAL)?.to_owned();
    if target.starts_with('/') {
        return Err(Errno::XDEV);
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{openat2, ResolveFlags, CWD};
    use std::os::unix::fs::symlink;

    /// A scratch directory of one test, removed when dropped.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn path(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A root `r` inside a scratch directory, with a secret beside it and links of every kind.
    fn tree() -> (Scratch, OwnedFd) {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let scratch =
            Scratch(std::env::temp_dir().join(format!("beneath-{}-{n}", std::process::id())));
        let base = scratch.path();
        std::fs::create_dir_all(base).expect("scratch dir");
        std::fs::write(base.join("secret"), "outside").expect("secret");
        let r = base.join("r");
        std::fs::create_dir_all(r.join("d/e")).expect("dirs");
        std::fs::write(r.join("d/e/f"), "inside").expect("file");
        symlink("d/e/f", r.join("rel")).expect("link");
        symlink("../secret", r.join("up")).expect("link");
        symlink("/etc/passwd", r.join("abs")).expect("link");
        symlink("../../d", r.join("d/e/back")).expect("link");
        symlink("loop", r.join("loop")).expect("link");
        symlink("missing", r.join("dangling")).expect("link");
        symlink("../../../secret", r.join("d/e/deep")).expect("link");
        let fd = openat(CWD, &r, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).expect("root");
        (scratch, fd)
    }

    /// What the kernel's openat2 answers, when it has it (the reference).
    fn kernel(root: &OwnedFd, rel: &str, flags: OFlags, no_symlinks: bool) -> Option<Result<()>> {
        let mut resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
        if no_symlinks {
            resolve |= ResolveFlags::NO_SYMLINKS;
        }
        let path = if rel.is_empty() { "." } else { rel };
        match openat2(root, path, flags | OFlags::CLOEXEC, Mode::empty(), resolve) {
            Err(Errno::NOSYS) => None,
            other => Some(other.map(drop)),
        }
    }

    #[test]
    fn the_walk_answers_as_openat2_beneath() {
        let (_scratch, root) = tree();
        let cases = [
            "",
            "d",
            "d/e/f",
            "rel",
            "up",
            "abs",
            "d/e/back/e/f",
            "d/e/deep",
            "loop",
            "dangling",
            "d/e/f/x",
            "nothing",
            "d/../d/e/f",
            "../secret",
        ];
        for flags in [
            OFlags::RDONLY,
            OFlags::PATH,
            OFlags::RDONLY | OFlags::NOFOLLOW,
        ] {
            for no_symlinks in [false, true] {
                for rel in cases {
                    let ours = open(root.as_fd(), rel, flags, Mode::empty(), no_symlinks).map(drop);
                    if let Some(theirs) = kernel(&root, rel, flags, no_symlinks) {
                        assert_eq!(
                            ours, theirs,
                            "{rel:?} flags {flags:?} no_symlinks {no_symlinks}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn escapes_are_refused_whatever_the_kernel() {
        let (_scratch, root) = tree();
        for rel in ["up", "abs", "d/e/deep", "../secret", "d/../../secret"] {
            let got = open(root.as_fd(), rel, OFlags::RDONLY, Mode::empty(), false);
            assert_eq!(got.map(drop), Err(Errno::XDEV), "{rel}");
        }
        assert_eq!(
            open(root.as_fd(), "rel", OFlags::RDONLY, Mode::empty(), true).map(drop),
            Err(Errno::LOOP)
        );
        let fd = open(root.as_fd(), "rel", OFlags::RDONLY, Mode::empty(), false).expect("inside");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut text).expect("read");
        assert_eq!(text, "inside");
    }

    #[test]
    fn creating_through_a_link_stays_beneath() {
        let (scratch, root) = tree();
        let create = OFlags::WRONLY | OFlags::CREATE;
        let mode = Mode::from_raw_mode(0o600);
        // A dangling relative link inside: created at its target, inside the root.
        open(root.as_fd(), "dangling", create, mode, false).expect("created");
        assert!(scratch.path().join("r/missing").exists());
        // A link out: refused, nothing made outside.
        symlink("../planted", scratch.path().join("r/out")).expect("link");
        assert_eq!(
            open(root.as_fd(), "out", create, mode, false).map(drop),
            Err(Errno::XDEV)
        );
        assert!(!scratch.path().join("planted").exists());
    }
}
