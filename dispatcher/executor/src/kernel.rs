//! What the kernel offers a sandbox's kernel-held rules, probed once the same way inside the
//! sandbox (the executor's ready line) and on the node at start (the dispatcher), so the two
//! can be compared: a seccomp profile could hide Landlock in the sandbox where the node sees it.

/// The kernel's Landlock ABI version as seen by this process; 0 when it has none (not built,
/// disabled at boot, or hidden by a seccomp filter).
pub fn landlock_abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_long = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the syscall only returns
    // the ABI version (or an error); it reads and writes no memory.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(abi).unwrap_or(0)
}
