//! Ownership of every child process: spawning, exit statuses, group signals, and reaping orphans.
//!
//! As PID 1 the executor inherits every orphan in the container and must reap them, but a blanket
//! `waitpid(-1)` would steal the exit status of a command another thread is supervising. So one
//! reaper thread does all waiting:
//!
//! 1. it blocks in `waitid(P_ALL, WEXITED | WNOWAIT)`, which reports a zombie without reaping it;
//! 2. it takes the registry lock and reaps every zombie with `waitpid(-1, WNOHANG)`;
//! 3. a reaped pid that belongs to a registered command has its status stored in that command's
//!    [`Slot`] and the supervising thread is woken through the slot's eventfd; any other pid was
//!    an orphan.
//!
//! The executor's direct child for a command is the command's sub-reaper (`subreaper.rs`), which
//! exits with the command's status after killing whatever the command left behind, so orphans of
//! commands never reach the executor. Forking happens under the same lock, and the pid is
//! registered before the lock is released, so the reaper can never reap a sub-reaper before it
//! is known, however fast it ends. Signals to a sub-reaper are sent under the lock and only while it is unreaped, so a
//! recycled pid is never signalled.

use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rustix::event::{eventfd, EventfdFlags};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions, WaitOptions, WaitStatus};

use crate::spawn::subreaper::KILL_TREE;

/// How to stop a running command (see [`Children::stop`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM to the command's process group.
    Terminate,
    /// SIGKILL to every process of the command's tree.
    Kill,
    /// SIGKILL to the sub-reaper itself.
    KillSubreaper,
}

/// How long the reaper sleeps when the executor has no children at all, before looking again for
/// orphans that were re-parented to it meanwhile.
const IDLE_RECHECK: Duration = Duration::from_millis(500);

/// One running command, shared by its supervising thread, the reaper and `cancel`.
#[derive(Debug)]
pub struct Slot {
    pid: Pid,
    request: u64,
    status: Mutex<Option<WaitStatus>>,
    cancel: AtomicBool,
    wake: OwnedFd,
}

impl Slot {
    /// The pid of the command's sub-reaper (its own process group).
    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// The leader's exit status once the reaper has collected it.
    pub fn exit_status(&self) -> Option<WaitStatus> {
        *self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `cancel` asked for this command to stop.
    pub fn cancel_requested(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// The eventfd that becomes readable on exit or cancel.
    pub fn wake_fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// Resets the eventfd after a wake-up.
    pub fn clear_wake(&self) {
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(&self.wake, &mut buf);
    }

    fn notify(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

#[derive(Default)]
struct Registry {
    by_pid: HashMap<i32, Arc<Slot>>,
    by_request: HashMap<u64, Arc<Slot>>,
    /// `cmd.run` requests cancelled before their child was spawned.
    cancelled_early: HashSet<u64>,
    shutting_down: bool,
    /// Spawns under way (their pid is not registered yet).
    spawning: usize,
    /// Exit statuses the reaper collected, while spawns were under way, of pids it did not
    /// know: a child may exit before its spawner registers it. Emptied whenever no spawn is
    /// under way, so a status never waits for a pid reused later.
    early_exits: HashMap<i32, WaitStatus>,
}

/// Most early exits kept while spawns are under way (more are logged as orphans).
const MAX_EARLY_EXITS: usize = 4096;

/// The registry of running commands and the reaper that serves it.
#[derive(Default)]
pub struct Children {
    registry: Mutex<Registry>,
    spawned: Condvar,
}

impl Children {
    /// A registry with its reaper thread running.
    pub fn start() -> io::Result<Arc<Self>> {
        let children = Arc::new(Children::default());
        let reaper = Arc::clone(&children);
        std::thread::Builder::new()
            .name("reaper".into())
            .spawn(move || reaper.reap_forever())?;
        Ok(children)
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a child for request `request` with `start` (which returns its pid) and registers
    /// it. Returns `None`, starting nothing, when the request was cancelled before this point.
    ///
    /// `start` runs without the registry's lock (it is a round trip to the fork server, or a
    /// fork): the reaper, cancellations and other commands' exits are not held up behind it,
    /// which under load made whole sandboxes stall. A child that exits before it is registered
    /// is collected by the reaper into `early_exits` and found there.
    pub fn spawn_with(
        &self,
        request: u64,
        start: impl FnOnce() -> io::Result<Pid>,
    ) -> io::Result<Option<Arc<Slot>>> {
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        {
            let mut registry = self.lock();
            if registry.shutting_down {
                return Err(io::Error::other("the executor is shutting down"));
            }
            if registry.cancelled_early.remove(&request) {
                return Ok(None);
            }
            registry.spawning += 1;
        }
        let started = start();
        let mut registry = self.lock();
        registry.spawning -= 1;
        let pid = match started {
            Ok(pid) => pid,
            Err(e) => {
                if registry.spawning == 0 {
                    registry.early_exits.clear();
                }
                return Err(e);
            }
        };
        let slot = Arc::new(Slot {
            pid,
            request,
            status: Mutex::new(None),
            cancel: AtomicBool::new(false),
            wake,
        });
        match registry.early_exits.remove(&pid.as_raw_pid()) {
            Some(status) => {
                let _ = rustix::process::kill_process_group(pid, Signal::KILL);
                *slot.status.lock().unwrap_or_else(PoisonError::into_inner) = Some(status);
                slot.notify();
            }
            None => {
                registry.by_pid.insert(pid.as_raw_pid(), Arc::clone(&slot));
            }
        }
        registry.by_request.insert(request, Arc::clone(&slot));
        // Cancelled while it was being started: it stops as soon as it is supervised.
        if registry.cancelled_early.remove(&request) {
            slot.cancel.store(true, Ordering::SeqCst);
            slot.notify();
        }
        // `kill_all` ran meanwhile and could not see it.
        if registry.shutting_down {
            let _ = rustix::process::kill_process(pid, KILL_TREE);
        }
        if registry.spawning == 0 {
            registry.early_exits.clear();
        }
        drop(registry);
        self.spawned.notify_all();
        Ok(Some(slot))
    }

    /// Asks the command's sub-reaper to stop the command, if the sub-reaper has not been reaped:
    /// [`Stop::Terminate`] passes SIGTERM to the command's group, [`Stop::Kill`] kills the whole
    /// tree, [`Stop::KillSubreaper`] is the last resort should the sub-reaper not respond.
    pub fn stop(&self, slot: &Slot, stop: Stop) {
        let _registry = self.lock();
        if slot.exit_status().is_none() {
            let signal = match stop {
                Stop::Terminate => Signal::TERM,
                Stop::Kill => KILL_TREE,
                Stop::KillSubreaper => Signal::KILL,
            };
            let _ = rustix::process::kill_process(slot.pid, signal);
        }
    }

    /// Forgets the command's request id once its result has been built.
    pub fn release(&self, slot: &Arc<Slot>) {
        let mut registry = self.lock();
        if registry
            .by_request
            .get(&slot.request)
            .is_some_and(|s| Arc::ptr_eq(s, slot))
        {
            registry.by_request.remove(&slot.request);
        }
    }

    /// Asks the command of request `request` to stop; `false` if none is running. With
    /// `not_yet_spawned` (the caller knows the `cmd.run` is in flight), a request whose child does
    /// not exist yet is marked so that it never starts.
    pub fn cancel(&self, request: u64, not_yet_spawned: bool) -> bool {
        let mut registry = self.lock();
        match registry.by_request.get(&request) {
            Some(slot) if slot.exit_status().is_none() => {
                slot.cancel.store(true, Ordering::SeqCst);
                slot.notify();
                true
            }
            Some(_) => false,
            None if not_yet_spawned => {
                registry.cancelled_early.insert(request);
                true
            }
            None => false,
        }
    }

    /// Drops an early cancellation that was never consumed (the request ended before spawning).
    pub fn forget_request(&self, request: u64) {
        self.lock().cancelled_early.remove(&request);
    }

    /// Has every running command's tree killed by its sub-reaper and refuses new spawns.
    pub fn kill_all(&self) {
        let mut registry = self.lock();
        registry.shutting_down = true;
        for slot in registry.by_pid.values() {
            let _ = rustix::process::kill_process(slot.pid, KILL_TREE);
        }
    }

    fn reap_forever(&self) {
        loop {
            match rustix::process::waitid(
                WaitId::All,
                WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
            ) {
                Ok(_) => self.reap_zombies(),
                Err(Errno::INTR) => {}
                Err(Errno::CHILD) => {
                    let registry = self.lock();
                    let _ = self.spawned.wait_timeout(registry, IDLE_RECHECK);
                }
                Err(errno) => {
                    crate::log_event!("waitid failed: {errno}");
                    std::thread::sleep(IDLE_RECHECK);
                }
            }
        }
    }

    fn reap_zombies(&self) {
        let mut registry = self.lock();
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some((pid, status))) => match registry.by_pid.remove(&pid.as_raw_pid()) {
                    Some(slot) => {
                        // The sub-reaper is gone (it killed the command's tree before leaving);
                        // its own group holds nothing else, but make sure.
                        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
                        *slot.status.lock().unwrap_or_else(PoisonError::into_inner) = Some(status);
                        slot.notify();
                    }
                    None if registry.spawning > 0
                        && registry.early_exits.len() < MAX_EARLY_EXITS =>
                    {
                        registry.early_exits.insert(pid.as_raw_pid(), status);
                    }
                    None => crate::log_event!("reaped orphan pid {}", pid.as_raw_pid()),
                },
                Ok(None) | Err(Errno::CHILD) => return,
                Err(Errno::INTR) => {}
                Err(errno) => {
                    crate::log_event!("waitpid failed: {errno}");
                    return;
                }
            }
        }
    }
}
