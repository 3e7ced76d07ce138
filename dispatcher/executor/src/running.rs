//! What outlives the request that started it: live processes (`proc.start`, by pid),
//! directory watches (`fs.watch`, by request id) and port connections (`port.open`, by request
//! id; their handlers are `port.rs`). The handlers in `live/` and `fs/watch.rs` fill
//! and consult these tables; the executor's [`Context`](crate::context::Context) holds one of
//! each, so shutdown can wait for every live process's `end`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rustix::fd::OwnedFd;

use crate::error::{OpError, OpResult};
use crate::protocol::{ErrorKind, LiveListResult, LiveProcess, PtySize};
use crate::spawn::children::Slot;

/// One live process.
pub struct Proc {
    /// The `proc.start` request whose id its events carry.
    pub events: u64,
    /// Its pid in the sandbox.
    pub pid: u32,
    /// Its tag.
    pub tag: Option<String>,
    /// What it runs.
    pub argv: Vec<String>,
    /// Its working directory.
    pub cwd: String,
    /// Its extra environment.
    pub env: BTreeMap<String, String>,
    /// Whether it was given a stdin pipe (or a terminal).
    pub takes_input: bool,
    pub(crate) slot: Arc<Slot>,
    /// The terminal's master (resize), with its current size.
    pub(crate) terminal: Option<(Arc<OwnedFd>, Mutex<PtySize>)>,
    /// Where input goes (stdin pipe's write end, or the terminal's master); `None` once closed.
    pub(crate) input: Mutex<Option<Arc<OwnedFd>>>,
    /// Serializes writers, so two inputs never interleave.
    pub(crate) writing: Mutex<()>,
}

impl Proc {
    fn listed(&self) -> LiveProcess {
        LiveProcess {
            pid: self.pid,
            tag: self.tag.clone(),
            events: self.events,
            argv: self.argv.clone(),
            cwd: self.cwd.clone(),
            env: self.env.clone(),
            pty: self
                .terminal
                .as_ref()
                .map(|(_, size)| *size.lock().unwrap_or_else(PoisonError::into_inner)),
            stdin: self.takes_input,
        }
    }
}

#[derive(Default)]
struct Table {
    by_pid: HashMap<u32, Arc<Proc>>,
    /// Processes being started (counted against the bound) and their tags.
    starting: usize,
    starting_tags: HashSet<String>,
}

/// The live processes of this executor.
#[derive(Default)]
pub struct Processes {
    table: Mutex<Table>,
    /// Supervising threads that have not sent their `end` yet (shutdown waits for them).
    supervising: Mutex<usize>,
    ended: Condvar,
}

/// A place held for a process being started; given back when dropped unless it was filled.
pub struct Reservation<'a> {
    registry: &'a Processes,
    tag: Option<String>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut table = self.registry.lock();
        table.starting = table.starting.saturating_sub(1);
        if let Some(tag) = &self.tag {
            table.starting_tags.remove(tag);
        }
    }
}

impl Processes {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds a place for one more process (and its tag), or says which bound refuses it.
    pub fn reserve(&self, limit: usize, tag: Option<&str>) -> OpResult<Reservation<'_>> {
        let mut table = self.lock();
        if table.by_pid.len() + table.starting >= limit {
            return Err(OpError::new(
                ErrorKind::LimitReached,
                format!(
                    "this sandbox already runs {limit} live processes (its limit); end one first"
                ),
            ));
        }
        if let Some(tag) = tag {
            if table.starting_tags.contains(tag)
                || table.by_pid.values().any(|p| p.tag.as_deref() == Some(tag))
            {
                return Err(OpError::new(
                    ErrorKind::AlreadyExists,
                    format!("a live process with tag '{tag}' already runs"),
                ));
            }
            table.starting_tags.insert(tag.to_owned());
        }
        table.starting += 1;
        Ok(Reservation {
            registry: self,
            tag: tag.map(str::to_owned),
        })
    }

    /// Fills a reservation with the started process.
    pub(crate) fn insert(&self, reservation: Reservation<'_>, process: Arc<Proc>) {
        self.lock().by_pid.insert(process.pid, process);
        drop(reservation);
    }

    /// Forgets an ended process (before its `end` event, so its tag is free by then).
    pub(crate) fn remove(&self, pid: u32) {
        self.lock().by_pid.remove(&pid);
    }

    /// The live process with this pid.
    pub fn get(&self, pid: u32) -> OpResult<Arc<Proc>> {
        self.lock().by_pid.get(&pid).cloned().ok_or_else(|| {
            OpError::new(
                ErrorKind::NotFound,
                format!(
                    "no live process has pid {pid} (it ended, or was not started by proc.start)"
                ),
            )
        })
    }

    /// A supervising thread is about to start.
    pub(crate) fn supervisor_starts(&self) {
        *self
            .supervising
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += 1;
    }

    /// A supervising thread sent its `end` (or never started).
    pub(crate) fn supervisor_ended(&self) {
        let mut supervising = self
            .supervising
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *supervising = supervising.saturating_sub(1);
        self.ended.notify_all();
    }

    /// Waits until every live process has sent its `end`, or `limit` passed; how many have not.
    pub fn wait_ended(&self, limit: Duration) -> usize {
        let supervising = self
            .supervising
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *self
            .ended
            .wait_timeout_while(supervising, limit, |running| *running > 0)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }

    /// Every live process, by pid.
    pub fn list(&self) -> LiveListResult {
        let mut processes: Vec<LiveProcess> =
            self.lock().by_pid.values().map(|p| p.listed()).collect();
        processes.sort_by_key(|p| p.pid);
        LiveListResult { processes }
    }
}

/// How a request reaches a running watch's thread: `fs.unwatch` through `stop`, `fs.watch_sync`
/// through `sync` (an eventfd each, polled by the thread beside its inotify descriptor).
pub struct WatchControl {
    /// Written to stop the watch.
    pub stop: OwnedFd,
    /// Written to ask for a sync.
    pub sync: OwnedFd,
    /// (syncs asked for, syncs the thread has finished), each counted up to the latest.
    synced: Mutex<(u64, u64)>,
    changed: Condvar,
}

impl WatchControl {
    /// The control of a watch whose thread polls `stop` and `sync`.
    pub fn new(stop: OwnedFd, sync: OwnedFd) -> Self {
        WatchControl {
            stop,
            sync,
            synced: Mutex::new((0, 0)),
            changed: Condvar::new(),
        }
    }

    fn counts(&self) -> MutexGuard<'_, (u64, u64)> {
        self.synced.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a ticket for a sync (to be waited for with [`WatchControl::wait_synced`]).
    pub fn ask_sync(&self) -> u64 {
        let mut counts = self.counts();
        counts.0 += 1;
        counts.0
    }

    /// The latest ticket asked for: what a thread about to read its queue will have served.
    pub fn asked(&self) -> u64 {
        self.counts().0
    }

    /// The thread has sent everything queued when ticket `upto` was asked.
    pub fn synced(&self, upto: u64) {
        let mut counts = self.counts();
        counts.1 = counts.1.max(upto);
        drop(counts);
        self.changed.notify_all();
    }

    /// Waits until ticket `ticket` was served, at most `limit`; whether it was.
    pub fn wait_synced(&self, ticket: u64, limit: Duration) -> bool {
        let counts = self.counts();
        let (counts, _) = self
            .changed
            .wait_timeout_while(counts, limit, |c| c.1 < ticket)
            .unwrap_or_else(PoisonError::into_inner);
        counts.1 >= ticket
    }
}

/// The running watches, by the id of their `fs.watch` request (`None` while one is being set
/// up).
#[derive(Default)]
pub struct Watches {
    watches: Mutex<HashMap<u64, Option<Arc<WatchControl>>>>,
}

impl Watches {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<u64, Option<Arc<WatchControl>>>> {
        self.watches.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a port connection's reader may still send, and whether it was closed.
pub struct Credit {
    /// Bytes it may send before the next ack.
    pub available: u64,
    /// `port.close` (both ways) came.
    pub closed: bool,
}

/// One port connection (`port.open`), shared by its reader thread and the requests on it.
pub struct Connection {
    /// The port in the sandbox.
    pub port: u16,
    /// The TCP connection to it (loopback).
    pub stream: TcpStream,
    /// The credit the node granted.
    pub credit: Mutex<Credit>,
    /// Signalled when credit is granted or the connection closed.
    pub granted: Condvar,
    /// Serializes writers, so two writes never interleave.
    pub writing: Mutex<()>,
}

impl Connection {
    /// Its credit, locked.
    pub fn credit(&self) -> MutexGuard<'_, Credit> {
        self.credit.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for credit, and says how much up to `most`; `None` once the connection was closed.
    pub fn wait_credit(&self, most: usize) -> Option<usize> {
        let mut credit = self.credit();
        loop {
            if credit.closed {
                return None;
            }
            if credit.available > 0 {
                return Some(usize::try_from(credit.available).unwrap_or(most).min(most));
            }
            credit = self
                .granted
                .wait(credit)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// The open port connections, by the id of their `port.open`.
#[derive(Default)]
pub struct Ports {
    table: Mutex<HashMap<u64, Arc<Connection>>>,
}

impl Ports {
    /// The table, locked.
    pub fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Connection>>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Ports {
    /// The connection `port.open` request `target` made.
    pub fn get(&self, target: u64) -> OpResult<Arc<Connection>> {
        self.lock().get(&target).cloned().ok_or_else(|| {
            OpError::new(
                ErrorKind::NotFound,
                format!("no port connection was opened by request {target} (or it ended)"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_count_against_the_bound_and_tags_are_unique() {
        let registry = Processes::default();
        let first = registry.reserve(2, Some("a")).expect("first");
        let dup = registry.reserve(2, Some("a")).err().expect("same tag");
        assert_eq!(dup.kind, ErrorKind::AlreadyExists);
        let second = registry.reserve(2, None).expect("second");
        let full = registry
            .reserve(2, Some("b"))
            .err()
            .expect("over the bound");
        assert_eq!(full.kind, ErrorKind::LimitReached);
        assert!(
            full.message.contains("2 live processes"),
            "{}",
            full.message
        );
        // A start that failed gives its place and its tag back.
        drop(first);
        let again = registry.reserve(2, Some("a")).expect("room and tag again");
        drop((second, again));
        assert_eq!(registry.lock().starting, 0);
        assert!(registry.lock().starting_tags.is_empty());
    }

    #[test]
    fn unknown_pids_are_not_found() {
        let e = Processes::default().get(42).err().expect("nothing runs");
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(Processes::default().list().processes.is_empty());
    }
}
