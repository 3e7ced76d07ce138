//! `cmd.run` and `cancel`: spawning programs as the sandbox user and supervising them.
//!
//! `children.rs` owns every child process of the executor (it is PID 1, so orphans too),
//! `program.rs` finds `argv[0]` in the configured `PATH`, `grant.rs` turns the programs a
//! command may run into files, `confine.rs` builds its Landlock domain, `subreaper.rs` is the
//! per-command process that confines, starts and outlives the command, `forkserver.rs` the
//! small process that forks it, `spawn.rs` starts the
//! command from it, `capture.rs` caps output while it streams, and `run.rs` ties them together
//! for one request (and for a live process, `live/`).

pub mod capture;
pub mod children;
pub mod confine;
pub mod forkserver;
pub mod grant;
pub mod program;
pub mod run;
pub mod spawn;
pub mod subreaper;
