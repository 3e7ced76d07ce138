//! The kernel-held half of the command policy: a Landlock domain around every command.
//!
//! The orchestrator's argv policy is the first line and explains its refusals; it cannot know
//! every option of every program. This domain makes the policy hold for whatever the command and
//! its descendants do, whichever option they were given:
//!
//! * **execute** only the granted files (programs and their dynamic loaders, see `grant.rs`);
//! * **write** (create, remove, rename, truncate, write) only beneath the write roots and `/tmp`,
//!   plus writing to `/dev/null`-like character devices;
//! * **connect** TCP only when the sandbox has egress;
//! * **signal** and connect to abstract unix sockets only within the command's own domain: a
//!   command cannot signal the executor, its sub-reaper or another command.
//!
//! Reading is not restricted here (the path allowlist for `fs.*` reads is the executor's roots;
//! commands need the image's libraries and data).
//!
//! Rules are requested at ABI 6 in best-effort mode: on an older kernel what it lacks is left
//! out and the result says `partial`; on a kernel without Landlock, `none`, which the sub-reaper
//! refuses unless the sandbox was configured to run without Landlock.

use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};
use std::os::fd::{OwnedFd, RawFd};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::protocol::Enforcement;
use crate::spawn::held::HeldPaths;
use crate::spawn::sys;

/// The newest ABI whose rights we request and have tested.
const TARGET_ABI: ABI = ABI::V6;
/// [`TARGET_ABI`] as the kernel numbers it.
const TARGET_ABI_VERSION: u32 = TARGET_ABI as u32;
/// Character devices a command may open for writing (sinks and sources, never storage).
/// `/dev/tty` is the controlling terminal only (a live process under a PTY opens it).
const WRITABLE_DEVICES: [&str; 4] = ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"];
/// Scratch space every command may write to, in addition to the write roots.
const SCRATCH: &str = "/tmp";

/// What the domain of one command allows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confinement {
    /// Files that may be executed; `None`: execution is not restricted.
    pub exec: Option<Vec<String>>,
    /// Directories beneath which writing is allowed (the sandbox's write roots).
    pub write_roots: Vec<String>,
    /// TCP connect allowed (the sandbox has egress).
    pub egress: bool,
}

/// The kernel's Landlock ABI (the one probe, shared with the node: [`crate::kernel`]).
pub use crate::kernel::landlock_abi as kernel_abi;

/// A command's Landlock ruleset, built but not enforced: its descriptor (none without Landlock)
/// and what enforcing it will achieve. A plain descriptor, so that it can be passed to the fork
/// server over a unix socket (`forkserver.rs`) as well as inherited by a direct fork.
#[derive(Debug)]
pub struct Prepared {
    /// The ruleset descriptor; `None` when the kernel has no Landlock.
    pub fd: Option<OwnedFd>,
    /// What enforcing `fd` achieves on this kernel.
    pub enforcement: Enforcement,
}

/// The write roots and devices of the rules, held open while no sandbox user can move them.
///
/// Why: opening `/tmp` or `/dev/null` walks from `/`, and with the sandbox user's filesystem
/// identity every walk checks that user's right to search `/`. On a FUSE root filesystem
/// (fuse-overlayfs, the storage driver of rootless and some virtualised hosts) the kernel then
/// asks the daemon for `/`'s ACL each time: six round trips per command for the default roots
/// and devices, about 0.2 ms of the daemon's CPU, and the handler thread blocked meanwhile.
///
/// A path is held when nothing the sandbox user can do changes what it names: each directory
/// above it belongs to root and is writable by nobody else (a command runs as the sandbox user,
/// without capabilities, so it can neither rename those directories' entries nor change their
/// modes). Any other root, a write root beneath the workspace for instance, is opened again for
/// every command without following symlinks, as before, so a directory the agent replaced by a
/// symlink cannot carry the rule elsewhere.
#[derive(Default)]
pub struct Held {
    paths: HeldPaths,
}

impl Held {
    /// `path` opened `O_PATH` without following symlinks (`directory`: it must be one); held
    /// when it is stable (see [`Held`]). `None` when it cannot be opened.
    fn open(&self, path: &str, directory: bool) -> Option<Arc<OwnedFd>> {
        self.paths.get_or_open(
            path,
            || open_no_symlinks(path, directory),
            || ancestors_fixed(path),
        )
    }
}

/// Whether every directory above absolute `path` is root's and writable by root only, so that
/// no unprivileged process can replace `path` or anything on the way to it.
fn ancestors_fixed(path: &str) -> bool {
    use rustix::fs::{statat, AtFlags, CWD};
    if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
        return false;
    }
    let mut above = std::path::Path::new(path).parent();
    while let Some(dir) = above {
        let Ok(stat) = statat(CWD, dir, AtFlags::SYMLINK_NOFOLLOW) else {
            return false;
        };
        let is_dir = (stat.st_mode & libc::S_IFMT) == libc::S_IFDIR;
        if !is_dir || stat.st_uid != 0 || stat.st_mode & 0o022 != 0 {
            return false;
        }
        above = dir.parent();
    }
    true
}

/// Builds the command's Landlock ruleset without enforcing it: the executor does this in its
/// handler thread, the sub-reaper then enforces it on itself with [`enforce`].
/// `open` gives the granted files opened (`O_PATH`), `None` for one that cannot be; `held`
/// keeps the write roots and devices that cannot move; `abi` is [`kernel_abi`], from which the
/// enforcement is known in advance (see [`enforcement_for`]).
pub fn prepare(
    confinement: &Confinement,
    abi: u32,
    open: impl Fn(&str) -> Option<Arc<OwnedFd>>,
    held: &Held,
) -> Result<Prepared, String> {
    let created = build(confinement, open, held).map_err(|e| e.to_string())?;
    let fd: Option<OwnedFd> = created.into();
    let enforcement = if fd.is_some() {
        enforcement_for(abi)
    } else {
        Enforcement::None
    };
    Ok(Prepared { fd, enforcement })
}

/// What the best-effort ruleset of [`build`] achieves on a kernel of Landlock ABI `abi`: every
/// right and scope requested exists from [`TARGET_ABI`] on; below it the crate leaves out what
/// the kernel lacks (some right or scope is always missing then: partial); ABI 0 is no Landlock.
/// This is the `landlock` crate's `RulesetStatus`, known before enforcing, so that the process
/// that enforces (a child of the fork server) needs no `RulesetCreated`.
pub fn enforcement_for(abi: u32) -> Enforcement {
    match abi {
        0 => Enforcement::None,
        abi if abi < TARGET_ABI_VERSION => Enforcement::Partial,
        _ => Enforcement::Full,
    }
}

/// Confines the calling process, and everything it starts afterwards, with the ruleset
/// descriptor of a [`Prepared`]: no-new-privs (already set by the executor; the kernel requires
/// it without CAP_SYS_ADMIN), then `landlock_restrict_self(fd, 0)`, which is what the crate's
/// `RulesetCreated::restrict_self` does. Allocates nothing and reads no `errno` (a sub-reaper
/// calls it while sharing the fork server's memory): a failure is the step and its `errno`.
pub fn enforce(ruleset: RawFd) -> Result<(), (&'static str, sys::Errno)> {
    rustix::thread::set_no_new_privs(true).map_err(|e| ("no_new_privs", e.raw_os_error()))?;
    sys::landlock_restrict_self(ruleset).map_err(|e| ("landlock_restrict_self", e))
}

fn build(
    c: &Confinement,
    open: impl Fn(&str) -> Option<Arc<OwnedFd>>,
    held: &Held,
) -> Result<RulesetCreated, landlock::RulesetError> {
    let write = AccessFs::from_write(ABI::V3);
    let file_write = AccessFs::WriteFile | AccessFs::Truncate;
    let mut handled = write;
    if c.exec.is_some() {
        handled |= AccessFs::Execute;
    }
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(handled)?
        .scope(Scope::from_all(TARGET_ABI))?;
    if !c.egress {
        ruleset = ruleset.handle_access(AccessNet::ConnectTcp)?;
    }
    let mut created = ruleset.create()?;
    // A path that cannot be opened (a write root not created yet, a granted program removed)
    // simply gets no rule: what does not exist cannot be written beneath or executed.
    for path in c.exec.iter().flatten() {
        if let Some(fd) = open(path) {
            created = created.add_rule(PathBeneath::new(&*fd, AccessFs::Execute))?;
        }
    }
    for root in c.write_roots.iter().map(String::as_str).chain([SCRATCH]) {
        if let Some(fd) = held.open(root, true) {
            created = created.add_rule(PathBeneath::new(&*fd, write))?;
        }
    }
    for device in WRITABLE_DEVICES {
        if let Some(fd) = held.open(device, false) {
            created = created.add_rule(PathBeneath::new(&*fd, file_write))?;
        }
    }
    Ok(created)
}

/// Opens `path` as `O_PATH` without following any symlink on the way, so an agent that
/// replaced a directory of a write root with a symlink cannot move the rule elsewhere.
fn open_no_symlinks(path: &str, directory: bool) -> Option<OwnedFd> {
    use rustix::fs::{openat2, Mode, OFlags, ResolveFlags, CWD};
    let kind = if directory {
        OFlags::DIRECTORY
    } else {
        OFlags::empty()
    };
    openat2(
        CWD,
        path,
        OFlags::PATH | OFlags::CLOEXEC | kind,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confinement_round_trips_as_json() {
        let c = Confinement {
            exec: Some(vec!["/usr/bin/ls".into()]),
            write_roots: vec!["/workspace".into()],
            egress: false,
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Confinement>(&text).unwrap(), c);
    }

    #[test]
    fn only_paths_under_root_only_directories_are_held() {
        // `/` is root's and 0755 wherever these tests run; `/tmp` is writable by everyone.
        assert!(ancestors_fixed("/tmp"));
        assert!(ancestors_fixed("/dev/null"));
        assert!(!ancestors_fixed("/tmp/anything"));
        assert!(!ancestors_fixed("relative/path"));
        assert!(!ancestors_fixed("/tmp/../etc"));
    }

    #[test]
    fn a_root_an_agent_could_replace_is_opened_again_and_a_symlink_refused() {
        let base = std::env::temp_dir().join(format!("held-{}", std::process::id()));
        let root = base.join("out");
        std::fs::create_dir_all(&root).unwrap();
        let path = root.to_str().unwrap().to_owned();
        let held = Held::default();
        assert!(held.open(&path, true).is_some());
        // Under /tmp (world-writable): not held, so a swap is seen by the next command.
        std::fs::rename(&root, base.join("moved")).unwrap();
        std::os::unix::fs::symlink("/etc", &root).unwrap();
        assert!(
            held.open(&path, true).is_none(),
            "a symlinked root must get no rule"
        );
        // A stable path is held: the same descriptor every time.
        let first = held.open("/tmp", true).unwrap();
        let again = held.open("/tmp", true).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert!(held.open("/dev/null", false).is_some());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn enforcement_follows_the_kernel_abi() {
        assert_eq!(enforcement_for(0), Enforcement::None);
        assert_eq!(enforcement_for(1), Enforcement::Partial);
        assert_eq!(enforcement_for(5), Enforcement::Partial);
        assert_eq!(enforcement_for(6), Enforcement::Full);
        assert_eq!(enforcement_for(7), Enforcement::Full);
    }
}
