//! The allowed roots, held open, and descriptor-relative resolution beneath them.
//!
//! Each root directory is opened once at start (`O_PATH | O_DIRECTORY`) and kept. A request path
//! is normalized and matched to a root by `paths.rs`; the remainder is then opened with
//! `openat2(root_fd, rel, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, so the kernel refuses any
//! resolution that would leave the root: `..` above it, absolute symlinks, relative symlinks
//! pointing out, symlinks swapped in during the call, and `/proc/self/...` magic links. Nothing in
//! the executor opens a requested path any other way.
//!
//! Where the kernel has no `openat2` (gVisor), the same resolution is the userspace walk of
//! `beneath.rs`, with the same refusals ([`path_rules`] says which one this executor uses).
//!
//! Invariant: every file operation starts from a [`Target`] produced here; operations on the final
//! component use `*at` syscalls on the parent descriptor with `AT_SYMLINK_NOFOLLOW`/`O_NOFOLLOW`.

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{openat2, Mode, OFlags, ResolveFlags, CWD};
use rustix::io::Errno;

use crate::config::Config;
use crate::error::{OpError, OpResult};
use crate::paths;
use crate::protocol::{ErrorKind, PathRules};

/// What an operation needs from the root it resolves under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A read root (reading ops, `cmd.run`'s `cwd`).
    Read,
    /// A write root (changing ops).
    Write,
    /// A root that is both (ops that read then rewrite, like `fs.edit`).
    ReadWrite,
}

/// One allowed root.
#[derive(Debug)]
pub struct Root {
    /// Normalized absolute path.
    pub path: String,
    fd: Option<OwnedFd>,
    readable: bool,
    writable: bool,
    /// How paths beneath it resolve: [`BENEATH`], plus `RESOLVE_NO_SYMLINKS` when the
    /// configuration refuses symlinks.
    resolve: ResolveFlags,
}

impl Root {
    fn allows(&self, access: Access) -> bool {
        match access {
            Access::Read => self.readable,
            Access::Write => self.writable,
            Access::ReadWrite => self.readable && self.writable,
        }
    }

    /// The root's directory descriptor, or an error when it could not be opened at start.
    pub fn fd(&self) -> OpResult<BorrowedFd<'_>> {
        self.fd.as_ref().map(|fd| fd.as_fd()).ok_or_else(|| {
            OpError::new(
                ErrorKind::NotFound,
                format!(
                    "allowed root '{}' does not exist in this sandbox",
                    self.path
                ),
            )
        })
    }
}

/// The set of allowed roots plus the workspace that relative paths start from.
#[derive(Debug)]
pub struct Roots {
    roots: Vec<Root>,
    workspace: String,
}

/// The flags every resolution uses.
pub const BENEATH: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

/// `openat2(dir, rel, flags | O_CLOEXEC, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`, retrying
/// the `EAGAIN` the kernel returns when a concurrent rename races a `..` lookup. `rel == ""` opens
/// `dir` itself.
pub fn open_beneath(
    dir: BorrowedFd<'_>,
    rel: &str,
    flags: OFlags,
    mode: Mode,
) -> rustix::io::Result<OwnedFd> {
    open_resolving(dir, rel, flags, mode, BENEATH)
}

/// [`open_beneath`] with explicit resolve flags (which always include [`BENEATH`]).
fn open_resolving(
    dir: BorrowedFd<'_>,
    rel: &str,
    flags: OFlags,
    mode: Mode,
    resolve: ResolveFlags,
) -> rustix::io::Result<OwnedFd> {
    if path_rules() == PathRules::Walk {
        let no_symlinks = resolve.contains(ResolveFlags::NO_SYMLINKS);
        return crate::beneath::open(dir, rel, flags, mode, no_symlinks);
    }
    let path = if rel.is_empty() { "." } else { rel };
    let mut attempts = 0;
    loop {
        match openat2(dir, path, flags | OFlags::CLOEXEC, mode, resolve | BENEATH) {
            Err(Errno::AGAIN) if attempts < 16 => attempts += 1,
            other => return other,
        }
    }
}

/// How this executor keeps resolutions beneath their root, probed once: the kernel's
/// `openat2(RESOLVE_BENEATH)` where it has it, else the userspace walk of `beneath.rs` (gVisor's
/// kernel has no `openat2`). Both refuse the same paths; the ready line says which one holds.
pub fn path_rules() -> PathRules {
    static RULES: std::sync::OnceLock<PathRules> = std::sync::OnceLock::new();
    *RULES.get_or_init(|| {
        match openat2(
            CWD,
            ".",
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            BENEATH,
        ) {
            Err(Errno::NOSYS) => PathRules::Walk,
            _ => PathRules::Openat2,
        }
    })
}

/// `mkdir -p` of `rel` beneath `dir`, one component at a time, never leaving `dir`.
fn create_beneath(dir: BorrowedFd<'_>, rel: &str) -> rustix::io::Result<OwnedFd> {
    let mut current = open_beneath(dir, "", OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
    for component in rel.split('/').filter(|c| !c.is_empty()) {
        match rustix::fs::mkdirat(current.as_fd(), component, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e),
        }
        current = open_beneath(
            current.as_fd(),
            component,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
    }
    Ok(current)
}

impl Roots {
    /// Opens every configured root; a root that cannot be opened is logged and left unavailable.
    pub fn open(config: &Config) -> Self {
        let mut roots: Vec<Root> = Vec::new();
        let resolve = if config.follow_symlinks {
            BENEATH
        } else {
            BENEATH | ResolveFlags::NO_SYMLINKS
        };
        let all = config
            .read_roots
            .iter()
            .map(|p| (p, true, false))
            .chain(config.write_roots.iter().map(|p| (p, false, true)));
        for (path, readable, writable) in all {
            if let Some(existing) = roots.iter_mut().find(|r| &r.path == path) {
                existing.readable |= readable;
                existing.writable |= writable;
                continue;
            }
            let fd = match rustix::fs::openat(
                CWD,
                path.as_str(),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => Some(fd),
                Err(errno) => {
                    crate::log_event!("root {path} unavailable: {errno}");
                    None
                }
            };
            roots.push(Root {
                path: path.clone(),
                fd,
                readable,
                writable,
                resolve,
            });
        }
        Roots {
            roots,
            workspace: config.workspace.clone(),
        }
    }

    /// The workspace directory relative paths are taken from.
    pub fn workspace(&self) -> &str {
        &self.workspace
    }

    /// Creates the roots that lie inside the workspace but do not exist yet, and opens them.
    ///
    /// A fresh workspace volume is empty, so a manifest's `/workspace/out` cannot exist when the
    /// executor starts. Called after the filesystem identity is the sandbox user's (so the new
    /// directories belong to it) and before any agent code runs; every step is `mkdirat` plus
    /// `openat2(RESOLVE_BENEATH)` from the workspace, so nothing can redirect it outside.
    pub fn create_missing_in_workspace(&mut self) {
        let prefix = format!("{}/", self.workspace.trim_end_matches('/'));
        let missing: Vec<usize> = (0..self.roots.len())
            .filter(|&i| self.roots[i].fd.is_none() && self.roots[i].path.starts_with(&prefix))
            .collect();
        if missing.is_empty() {
            return;
        }
        let workspace = match rustix::fs::openat(
            CWD,
            self.workspace.as_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(errno) => {
                crate::log_event!("workspace {} unavailable: {errno}", self.workspace);
                return;
            }
        };
        for i in missing {
            let rel = self.roots[i].path[prefix.len()..].to_owned();
            match create_beneath(workspace.as_fd(), &rel) {
                Ok(fd) => {
                    crate::log_event!("created root {}", self.roots[i].path);
                    self.roots[i].fd = Some(fd);
                }
                Err(errno) => crate::log_event!("root {} not created: {errno}", self.roots[i].path),
            }
        }
    }

    /// The root whose path is exactly `path`, if any.
    pub fn root_at(&self, path: &str) -> Option<&Root> {
        self.roots.iter().find(|r| r.path == path)
    }

    /// Validates and normalizes `input`, and picks the root it falls under for `access`.
    pub fn resolve(&self, input: &str, access: Access) -> OpResult<Target<'_>> {
        let display = paths::normalize(&self.workspace, input)?;
        let candidates: Vec<&Root> = self.roots.iter().filter(|r| r.allows(access)).collect();
        let Some((index, rel)) =
            paths::select_root(candidates.iter().map(|r| r.path.as_str()), &display)
        else {
            let names: Vec<&str> = candidates.iter().map(|r| r.path.as_str()).collect();
            let verb = match access {
                Access::Read => "readable",
                Access::Write => "writable",
                Access::ReadWrite => "readable and writable",
            };
            return Err(OpError::new(
                ErrorKind::PathNotAllowed,
                format!(
                    "path '{input}' resolves to '{display}', which is outside the {verb} roots ({})",
                    names.join(", ")
                ),
            ));
        };
        Ok(Target {
            root: candidates[index],
            rel: rel.to_string(),
            display,
        })
    }

    /// Refuses deleting `display` when it is, or contains, an allowed root.
    pub fn guard_delete(&self, display: &str) -> OpResult<()> {
        match self
            .roots
            .iter()
            .find(|r| paths::is_within(display, &r.path))
        {
            Some(root) if root.path == display => Err(OpError::new(
                ErrorKind::PathNotAllowed,
                format!("'{display}' is an allowed root and cannot be deleted"),
            )),
            Some(root) => Err(OpError::new(
                ErrorKind::PathNotAllowed,
                format!(
                    "'{display}' contains the allowed root '{}' and cannot be deleted",
                    root.path
                ),
            )),
            None => Ok(()),
        }
    }
}

/// A request path resolved to a root and a remainder beneath it.
#[derive(Debug)]
pub struct Target<'r> {
    /// The root it falls under.
    pub root: &'r Root,
    /// The normalized remainder below the root (`""` for the root itself); no `.` or `..`.
    pub rel: String,
    /// The normalized absolute path, for messages and results.
    pub display: String,
}

impl Target<'_> {
    /// Whether the target is the root directory itself.
    pub fn is_root(&self) -> bool {
        self.rel.is_empty()
    }

    /// Opens the target beneath its root.
    pub fn open(&self, flags: OFlags) -> OpResult<OwnedFd> {
        open_resolving(
            self.root.fd()?,
            &self.rel,
            flags,
            Mode::empty(),
            self.root.resolve,
        )
        .map_err(|e| OpError::os(e, "cannot open", &self.display))
    }

    /// Opens a relative path (a prefix of `rel`, or `rel` plus more) beneath the same root.
    pub fn open_rel(&self, rel: &str, flags: OFlags) -> OpResult<OwnedFd> {
        open_resolving(
            self.root.fd()?,
            rel,
            flags,
            Mode::empty(),
            self.root.resolve,
        )
        .map_err(|e| OpError::os(e, "cannot open", &paths::join(&self.root.path, rel)))
    }

    /// Opens the parent directory (`O_PATH`) and returns it with the final component's name.
    /// Fails on the root itself, which has no parent inside the root.
    pub fn parent(&self) -> OpResult<(OwnedFd, &str)> {
        if self.is_root() {
            return Err(OpError::new(
                ErrorKind::PathNotAllowed,
                format!("'{}' is an allowed root itself", self.display),
            ));
        }
        let (parent, name) = paths::split_parent(&self.rel);
        let fd = self.open_rel(parent, OFlags::PATH | OFlags::DIRECTORY)?;
        Ok((fd, name))
    }

    /// The display path of a path relative to the target's root.
    pub fn root_display(&self, rel: &str) -> String {
        paths::join(&self.root.path, rel)
    }

    /// The display path of a path relative to this target.
    pub fn child_display(&self, rel: &str) -> String {
        paths::join(&self.display, rel)
    }
}
