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
use crate::error::OpError;
use crate::protocol::ErrorKind;
use crate::roots::Roots;

/// Capabilities the executor keeps: switching to the sandbox user and signalling its processes.
pub const KEPT_CAPABILITIES: CapabilitySet = CapabilitySet::SETUID
    .union(CapabilitySet::SETGID)
    .union(CapabilitySet::KILL);

/// [`crate::protocol::ROOT_CAPABILITIES`] as a set: what a root command and a root file
/// operation have, and what the executor keeps permitted (not effective) for them when its
/// config has `allow_root`.
pub const ROOT_CAPABILITIES: CapabilitySet = CapabilitySet::CHOWN
    .union(CapabilitySet::DAC_OVERRIDE)
    .union(CapabilitySet::FOWNER)
    .union(CapabilitySet::FSETID)
    .union(CapabilitySet::KILL)
    .union(CapabilitySet::SETGID)
    .union(CapabilitySet::SETUID)
    .union(CapabilitySet::NET_BIND_SERVICE)
    .union(CapabilitySet::SYS_CHROOT)
    .union(CapabilitySet::AUDIT_WRITE);

/// What the executor keeps in its permitted (and bounding) set: [`KEPT_CAPABILITIES`], plus
/// [`ROOT_CAPABILITIES`] for the root requests of a sandbox that allows them. Its effective set
/// is [`KEPT_CAPABILITIES`] whatever this is, but during a root request.
pub fn permitted_capabilities(config: &Config) -> CapabilitySet {
    if config.allow_root {
        KEPT_CAPABILITIES | ROOT_CAPABILITIES
    } else {
        KEPT_CAPABILITIES
    }
}

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
    let permitted = permitted_capabilities(config);
    if config.allow_root && !current.permitted.contains(ROOT_CAPABILITIES) {
        // A root command would start without the capabilities it was promised.
        return Err(PrivilegeError {
            step: "allow_root: the container did not grant every root capability",
            errno: rustix::io::Errno::PERM,
        });
    }
    let reduced = CapabilitySets {
        effective: current.effective & KEPT_CAPABILITIES,
        permitted: current.permitted & permitted,
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
        if permitted.contains(cap)
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
    if fsgid == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
        return enter_effective_identity(uid, gid);
    }
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

/// [`enter_sandbox_fs_identity`] where the kernel has no `setfsuid` (gVisor's): the thread's
/// *effective* uid and gid become `uid`/`gid` (a kernel checks file access with them, as with a
/// filesystem uid), the real and saved ids stay 0, and the effective capabilities, which the
/// kernel clears when the effective uid leaves 0, are raised again from the permitted set (only
/// [`KEPT_CAPABILITIES`] are left there). Per thread, as the filesystem ids are.
fn enter_effective_identity(uid: u32, gid: u32) -> Result<(), PrivilegeError> {
    let failed = |step: &'static str| PrivilegeError {
        step,
        errno: rustix::io::Errno::from_io_error(&std::io::Error::last_os_error())
            .unwrap_or(rustix::io::Errno::PERM),
    };
    if set_thread_effective_id(libc::SYS_setresgid, gid) != 0 {
        return Err(failed("setresgid (no setfsgid here)"));
    }
    if set_thread_effective_id(libc::SYS_setresuid, uid) != 0 {
        return Err(failed("setresuid (no setfsuid here)"));
    }
    let sets = step("read capabilities", rustix::thread::capabilities(None))?;
    step(
        "raise the kept capabilities",
        rustix::thread::set_capabilities(
            None,
            CapabilitySets {
                effective: sets.permitted & KEPT_CAPABILITIES,
                ..sets
            },
        ),
    )?;
    Ok(())
}

/// Sets the calling thread's effective uid or gid to `id` with the raw `setresuid` or
/// `setresgid` syscall (`call`), leaving the real and saved ids (-1): the C library's wrappers
/// would change every thread's credentials. Answers the syscall's result (0 when it worked; the
/// cause is then in `errno`).
fn set_thread_effective_id(call: libc::c_long, id: u32) -> libc::c_long {
    // SAFETY: setresuid/setresgid take three integer ids and change only the calling thread's
    // credentials; no memory is passed.
    unsafe {
        libc::syscall(
            call,
            -1 as libc::c_long,
            libc::c_long::from(id),
            -1 as libc::c_long,
        )
    }
}

/// Runs `f` with the calling thread's *effective* uid set to the sandbox user, then back to
/// root with the thread's capabilities and the sandbox user's filesystem identity as before.
///
/// For kernel objects charged to their creator's effective uid host-wide (inotify instances and
/// their watches count against `fs.inotify.max_user_*` of that uid in the initial user
/// namespace): made as root, a sandbox's watches would use up root's allowance on the whole
/// host, dockerd's and systemd's included; made as the sandbox user, they use that user's. A
/// thread that cannot get back is not left running: the process aborts.
pub fn charged_to_sandbox_user<T>(uid: u32, gid: u32, f: impl FnOnce() -> T) -> T {
    let set_euid = |euid: u32| set_thread_effective_id(libc::SYS_setresuid, euid);
    if set_euid(uid) != 0 {
        // Nothing changed: run as before (charged to root), which is only a weaker bound.
        crate::log_event!(
            "cannot take the sandbox user's uid for a kernel object: {}",
            std::io::Error::last_os_error()
        );
        return f();
    }
    let out = f();
    // Back to euid 0: the kernel gives the effective capabilities back from the permitted set,
    // and sets the filesystem uid to 0, which is put back to the sandbox user's.
    const FAILURE: &str = "a thread cannot return to the executor's identity";
    if set_euid(0) != 0 {
        abort_thread(FAILURE);
    }
    back_to_executor_identity(uid, gid, FAILURE);
    out
}

/// Puts the calling thread back into the identity the executor acts with between requests:
/// the sandbox user's filesystem ids and only [`KEPT_CAPABILITIES`] effective. A thread that
/// cannot get back is not left running (every later request of it would run with the wrong
/// identity): the process aborts, logging `failure`.
fn back_to_executor_identity(uid: u32, gid: u32, failure: &str) {
    let back = enter_sandbox_fs_identity(uid, gid).is_ok()
        && lower_effective().is_ok_and(|effective| effective == KEPT_CAPABILITIES);
    if !back {
        abort_thread(failure);
    }
}

/// Aborts the process for a thread whose identity could not be put back, logging `failure`
/// with the last OS error.
fn abort_thread(failure: &str) -> ! {
    crate::log_event!("fatal: {failure}: {}", std::io::Error::last_os_error());
    std::process::abort();
}

/// Sets the calling thread's effective capabilities to its permitted ones within
/// [`KEPT_CAPABILITIES`] (what the executor acts with between root requests); the new set.
/// Needed after an effective uid of 0 came back, which makes every permitted capability
/// effective again (the root ones too where `allow_root` keeps them permitted).
fn lower_effective() -> rustix::io::Result<CapabilitySet> {
    let sets = rustix::thread::capabilities(None)?;
    let effective = sets.permitted & KEPT_CAPABILITIES;
    rustix::thread::set_capabilities(None, CapabilitySets { effective, ..sets })?;
    Ok(effective)
}

/// The calling thread acting as root for one request of a sandbox that allows it (`user:
/// "root"`): filesystem (or, under gVisor, effective) uid and gid 0 and
/// [`ROOT_CAPABILITIES`] effective, so files it creates belong to root and the kernel checks
/// root's permissions. Dropping it puts the sandbox user's identity and the executor's
/// effective set back; a thread that cannot get back is not left running (abort).
pub struct AsRoot {
    uid: u32,
    gid: u32,
}

impl AsRoot {
    /// Takes root's identity on this thread. Only called for a config with `allow_root`,
    /// whose permitted set holds [`ROOT_CAPABILITIES`] (start-up checked it).
    pub fn enter(config: &Config) -> Result<AsRoot, PrivilegeError> {
        let guard = AsRoot {
            uid: config.uid,
            gid: config.gid,
        };
        // From here a failure still puts the sandbox user back (the guard's drop).
        enter_sandbox_fs_identity(0, 0)?;
        let sets = step("read capabilities", rustix::thread::capabilities(None))?;
        let effective = sets.permitted & (KEPT_CAPABILITIES | ROOT_CAPABILITIES);
        if !effective.contains(ROOT_CAPABILITIES) {
            return Err(PrivilegeError {
                step: "raise the root capabilities (not permitted: allow_root is off)",
                errno: rustix::io::Errno::PERM,
            });
        }
        step(
            "raise the root capabilities",
            rustix::thread::set_capabilities(None, CapabilitySets { effective, ..sets }),
        )?;
        Ok(guard)
    }
}

impl Drop for AsRoot {
    fn drop(&mut self) {
        // Every later request of this thread would run as root: never go on.
        back_to_executor_identity(
            self.uid,
            self.gid,
            "a thread cannot return from root to the sandbox user's identity",
        );
    }
}

/// Why a request asking for root is refused here, and how a sandbox gets root.
pub fn root_refused(config: &Config) -> OpError {
    OpError::new(
        ErrorKind::PermissionDenied,
        format!(
            "user \"root\" is not available in this sandbox: its executor runs every command and \
             file operation as uid {} (allow_root is off). Root is offered only in gVisor-class \
             sandboxes (sandbox.isolation or sandbox.runtime_isolation: gvisor), where uid 0 is \
             root of gVisor's own kernel, not of the host's; and there only to sandboxes that ask \
             for it (every E2B sandbox of a gVisor template does)",
            config.uid
        ),
    )
}

/// This thread as root for one request ([`identity::AsRoot`]), or why not.
pub fn as_root(config: &Config) -> Result<AsRoot, OpError> {
    AsRoot::enter(config).map_err(|e| {
        OpError::new(
            ErrorKind::PermissionDenied,
            format!("cannot act as root: {e}"),
        )
    })
}

/// This process's pid as the ready line reports it.
pub fn own_pid() -> u32 {
    rustix::process::getpid().as_raw_pid().unsigned_abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's (real, effective, saved) uids and fsuid, from the kernel.
    fn ids() -> ([u32; 3], i64) {
        let (mut r, mut e, mut s) = (0, 0, 0);
        // SAFETY: getresuid with valid out pointers; setfsuid(-1) only reads.
        unsafe {
            libc::getresuid(&mut r, &mut e, &mut s);
            (
                [r, e, s],
                libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long),
            )
        }
    }

    #[test]
    fn a_kernel_object_is_made_as_the_sandbox_user_and_the_thread_comes_back() {
        assert_eq!(
            rustix::process::getuid().as_raw(),
            0,
            "this test switches uids as the executor does: run it as root"
        );
        // On a thread of its own: credentials are per thread.
        std::thread::spawn(|| {
            enter_sandbox_fs_identity(65534, 65534).expect("fs identity");
            // The executor's effective set between requests (`drop_privileges`).
            lower_effective().expect("capset");
            let before = ids();
            let caps = rustix::thread::capabilities(None)
                .expect("capget")
                .effective;
            let inside = charged_to_sandbox_user(65534, 65534, ids);
            assert_eq!(
                inside.0,
                [0, 65534, 0],
                "effective uid is the sandbox user's inside"
            );
            assert_eq!(ids(), before, "uids and fsuid come back");
            let after = rustix::thread::capabilities(None)
                .expect("capget")
                .effective;
            assert_eq!(after, caps, "effective capabilities come back");
        })
        .join()
        .expect("the test thread");
    }

    /// A config whose requests may run as root.
    fn root_config() -> Config {
        Config {
            allow_root: true,
            ..Config::default()
        }
    }

    /// Makes the calling (test) thread one of the executor's for `config`: the sandbox user's
    /// filesystem identity, the capabilities `config` permits, only the kept ones effective.
    fn become_executor_thread(config: &Config) {
        enter_sandbox_fs_identity(config.uid, config.gid).expect("fs identity");
        rustix::thread::set_capabilities(
            None,
            CapabilitySets {
                effective: KEPT_CAPABILITIES,
                permitted: permitted_capabilities(config),
                inheritable: CapabilitySet::empty(),
            },
        )
        .expect("capset");
    }

    #[test]
    fn a_root_request_acts_as_root_with_the_root_set_and_the_thread_comes_back() {
        assert_eq!(rustix::process::getuid().as_raw(), 0, "run as root");
        std::thread::spawn(|| {
            let config = root_config();
            let sets = rustix::thread::capabilities(None).expect("capget");
            // The executor's sets with allow_root: the root set permitted, KEPT effective.
            become_executor_thread(&config);
            assert!(sets.permitted.contains(permitted_capabilities(&config)));
            let before = ids();
            {
                let _root = AsRoot::enter(&config).expect("root");
                assert_eq!(ids().1, 0, "filesystem uid 0 inside");
                let effective = rustix::thread::capabilities(None)
                    .expect("capget")
                    .effective;
                assert_eq!(effective, KEPT_CAPABILITIES | ROOT_CAPABILITIES);
                assert!(!effective.contains(CapabilitySet::SYS_ADMIN));
            }
            assert_eq!(ids(), before, "the sandbox user's ids come back");
            let effective = rustix::thread::capabilities(None)
                .expect("capget")
                .effective;
            assert_eq!(
                effective, KEPT_CAPABILITIES,
                "only the kept set is effective"
            );
        })
        .join()
        .expect("the test thread");
    }

    #[test]
    fn root_is_refused_where_the_root_set_is_not_permitted() {
        assert_eq!(rustix::process::getuid().as_raw(), 0, "run as root");
        std::thread::spawn(|| {
            // The executor's sets without allow_root: only KEPT permitted.
            become_executor_thread(&Config::default());
            let before = ids();
            let refused = AsRoot::enter(&root_config());
            assert!(refused.is_err(), "root without the root set permitted");
            assert_eq!(ids(), before, "the thread is the sandbox user's again");
        })
        .join()
        .expect("the test thread");
    }
}
