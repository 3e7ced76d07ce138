//! What the kernel offers the sandboxes' kernel-held command policy.
//!
//! Sandboxes share the host's kernel, so the node can tell at start whether the executor will be
//! able to confine commands with Landlock. The executor reports the same from inside every
//! sandbox (its ready line), which the dispatcher checks too: a seccomp profile could hide
//! Landlock in the sandbox even where the node sees it.

/// The kernel's Landlock ABI as seen by the node: the executor's own probe (one copy).
pub use sandbox_executor::kernel::landlock_abi;
