//! What every handler is given: the configuration, the roots held open, the spawning machinery
//! and the tables of what outlives a request. Built once at start-up by `server.rs`; the
//! handlers (`cmd/`, `fs/`, `live/`, `proc/`) depend on it and on nothing of the server.

use std::sync::Arc;

use crate::config::Config;
use crate::output::Events;
use crate::roots::Roots;
use crate::running::{Ports, Processes, Watches};
use crate::spawn;
use crate::spawn::children::Children;

/// Everything a handler needs.
pub struct Context {
    /// The validated configuration.
    pub config: Config,
    /// The allowed roots, held open.
    pub roots: Roots,
    /// Running commands and the reaper.
    pub children: Arc<Children>,
    /// Programs resolved for the kernel-held execute rules (cached).
    pub grants: spawn::grant::Grants,
    /// Write roots and devices of the Landlock rules that cannot move, held open.
    pub held: spawn::confine::Held,
    /// The kernel's Landlock ABI (0: none).
    pub landlock_abi: u32,
    /// Makes the sub-reapers (forked at start, before any thread).
    pub fork_server: spawn::forkserver::ForkServer,
    /// Where live processes and watches send their events: the channel followed now.
    pub events: Events,
    /// Live processes (`proc.*`).
    pub live: Processes,
    /// Directory watches (`fs.watch`).
    pub watches: Watches,
    /// Port connections (`port.*`).
    pub ports: Ports,
    /// Files moving as blocks (`fs.write_stream`, `fs.read_stream`).
    pub transfers: crate::transfers::Transfers,
}
