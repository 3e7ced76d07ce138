//! Starting programs as the sandbox user, confined, and owning them until they end: the
//! machinery `cmd.run` and live processes share.
//!
//! `children.rs` owns every child process of the executor (it is PID 1, so orphans too),
//! `program.rs` finds `argv[0]` in the configured `PATH`, `grant.rs` turns the programs a
//! command may run into files, `confine.rs` builds its Landlock domain (`held.rs` keeps the
//! paths both open), `subreaper.rs` is the
//! per-command process that confines, starts and outlives the command, `forkserver.rs` the
//! small process that clones it (sharing its memory), `vfork.rs` starts the command from it,
//! `sys.rs` holds the raw system calls a sub-reaper makes without `errno`, and `capture.rs`
//! caps output while it streams.

pub mod capture;
pub mod children;
pub mod confine;
pub mod forkserver;
pub mod grant;
pub mod held;
pub mod program;
pub mod subreaper;
pub mod sys;
pub mod vfork;
