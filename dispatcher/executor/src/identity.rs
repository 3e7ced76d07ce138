//! Privileges: what the executor keeps, what it drops at start, and the sandbox user's identity
//! for file operations.
//!
//! The executor stays uid 0 for its whole life so that agent processes (the sandbox user) can
//! neither signal nor trace it; the container leaves it only SETUID, SETGID, KILL and CHOWN. At
//! start, before any thread exists (capabilities, groups and fs ids are per-thread in the kernel
//! and are inherited by threads created later), it:
//!
//! 1. gives the root-owned workspace to the sandbox user (the one use of CAP_CHOWN),
//! 2. drops CAP_CHOWN and everything else but SETUID/SETGID/KILL from its effective, permitted
//!    and inheritable sets, tries the bounding set (needs CAP_SETPCAP, which Docker's `cap_drop:
//!    ALL` removes, so that step is best effort and logged), clears the ambient set,
//! 3. clears supplementary groups, sets no-new-privs and makes itself non-dumpable,
//! 4. switches its *filesystem* uid/gid to the sandbox user with raw `setfsuid`/`setfsgid`, so
//!    every file it creates belongs to that user and every permission check is that user's,
//!    while its real/effective uid stays 0.
//!
//! Commands drop to the sandbox user fully in the child (see `cmd/run.rs`).

use rustix::fd::BorrowedFd;
use rustix::fs::{AtFlags, FileType};
use rustix::process::DumpableBehavior;
use rustix::thread::{CapabilitySet, CapabilitySets};

use crate::config::Config;
use crate::roots::Roots;

/// Capabilities the executor keeps: switching to the sandbox user and signalling its processes.
pub const KEPT_CAPABILITIES: CapabilitySet = CapabilitySet::SETUID
    .union(CapabilitySet::SETGID)
    .union(CapabilitySet::KILL);

/// A start-up step that must succeed failed.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {errno}")]
pub struct PrivilegeError {
    /// What was being done.
    pub step: &'static str,
    /// The OS error.
    pub errno: rustix::io::Errno,
}

fn step<T>(step: &'static str, result: rustix::io::Result<T>) -> Result<T, PrivilegeError> {
    result.map_err(|errno| PrivilegeError { step, errno })
}

/// Performs the start-up privilege changes; must run before any other thread is spawned.
pub fn drop_privileges(config: &Config, roots: &Roots) -> Result<(), PrivilegeError> {
    if let Some(workspace) = roots.root_at(&config.workspace) {
        if let Ok(fd) = workspace.fd() {
            give_to_sandbox_user(fd, &config.workspace, config)?;
        }
    }

    let current = step("read capabilities", rustix::thread::capabilities(None))?;
    let reduced = CapabilitySets {
        effective: current.effective & KEPT_CAPABILITIES,
        permitted: current.permitted & KEPT_CAPABILITIES,
        inheritable: CapabilitySet::empty(),
    };
    step(
        "drop capabilities",
        rustix::thread::set_capabilities(None, reduced),
    )?;
    let mut bounding_refused = false;
    for bit in 0..64u32 {
        let Some(cap) = CapabilitySet::from_bits(1u64 << bit) else {
            continue;
        };
        if KEPT_CAPABILITIES.contains(cap)
            || !rustix::thread::capability_is_in_bounding_set(cap).unwrap_or(false)
        {
            continue;
        }
        if rustix::thread::remove_capability_from_bounding_set(cap).is_err() {
            bounding_refused = true;
        }
    }
    if bounding_refused {
        crate::log_event!(
            "bounding set left as the container set it (no CAP_SETPCAP); effective and permitted sets reduced"
        );
    }
    // EINVAL on kernels without ambient capabilities: nothing to clear then.
    let _ = rustix::thread::clear_ambient_capability_set();
    step("setgroups([])", rustix::thread::set_thread_groups(&[]))?;
    step("no_new_privs", rustix::thread::set_no_new_privs(true))?;
    step(
        "PR_SET_DUMPABLE 0",
        rustix::process::set_dumpable_behavior(DumpableBehavior::NotDumpable),
    )?;
    let pid = rustix::process::getpid();
    if pid.as_raw_pid() != 1 {
        // Outside PID 1 (tests, `docker run --init`), become the reaper of our descendants anyway.
        step(
            "PR_SET_CHILD_SUBREAPER",
            rustix::process::set_child_subreaper(Some(pid)),
        )?;
    }
    enter_sandbox_fs_identity(config.uid, config.gid)
}

fn give_to_sandbox_user(
    fd: BorrowedFd<'_>,
    path: &str,
    config: &Config,
) -> Result<(), PrivilegeError> {
    let stat = step("stat workspace", rustix::fs::fstat(fd))?;
    if stat.st_uid != 0 || FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return Ok(());
    }
    step(
        "chown workspace",
        rustix::fs::chownat(
            fd,
            "",
            Some(rustix::fs::Uid::from_raw(config.uid)),
            Some(rustix::fs::Gid::from_raw(config.gid)),
            AtFlags::EMPTY_PATH,
        ),
    )?;
    crate::log_event!("chowned {path} to {}:{}", config.uid, config.gid);
    Ok(())
}

/// Sets the calling thread's filesystem uid and gid (per-thread; threads spawned afterwards
/// inherit them). Raw syscalls, so no libc wrapper can broadcast them to other threads.
pub fn enter_sandbox_fs_identity(uid: u32, gid: u32) -> Result<(), PrivilegeError> {
    // SAFETY: setfsgid/setfsuid take one integer and touch only the calling thread's credentials.
    // Calling them again with an invalid id (-1) changes nothing and returns the current value,
    // which is how the kernel lets a caller check that the first call took effect.
    let (fsgid, fsuid) = unsafe {
        libc::syscall(libc::SYS_setfsgid, libc::c_long::from(gid));
        libc::syscall(libc::SYS_setfsuid, libc::c_long::from(uid));
        (
            libc::syscall(libc::SYS_setfsgid, -1 as libc::c_long),
            libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long),
        )
    };
    if fsgid != libc::c_long::from(gid) {
        return Err(PrivilegeError {
            step: "setfsgid",
            errno: rustix::io::Errno::PERM,
        });
    }
    if fsuid != libc::c_long::from(uid) {
        return Err(PrivilegeError {
            step: "setfsuid",
            errno: rustix::io::Errno::PERM,
        });
    }
    Ok(())
}

/// This process's pid as the ready line reports it.
pub fn own_pid() -> u32 {
    rustix::process::getpid().as_raw_pid().unsigned_abs()
}
