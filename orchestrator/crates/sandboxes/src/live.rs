//! Background processes started through the router (`cmd.run` with `background: true`): the
//! one reader each process's output is read from between calls, so `proc.output` returns every
//! byte once and in order.
//!
//! The dispatcher keeps each process's events in a bounded ring and reports what a slow reader
//! missed; this registry only keeps the reader (`ProcessHandle`) between tool calls, by sandbox
//! and pid. Running processes are bounded by the executor (`max_live_processes` per sandbox);
//! a process's entry goes once its end was read, and a sandbox's entries when the sandbox is
//! destroyed. Ended processes nobody read to the end are kept for a later read, at most
//! [`MAX_ENDED_KEPT`] per sandbox (the oldest go first). A replica that did not start a process (after a restart) attaches a new reader on
//! first use, from the output still buffered.
//!
//! It also keeps the polling directory watchers of E2B's SDK (`CreateWatcher`, then
//! `GetWatcherEvents` until `RemoveWatcher`): at most [`MAX_WATCHERS`] per sandbox, each
//! removed (and its executor watch with it) when removed by name or when its sandbox goes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dispatcher::{Dispatcher, ProcessHandle, ProcessSelector, SandboxId, WatchHandle};

/// Most polling watchers one sandbox may hold at once.
pub const MAX_WATCHERS: usize = 16;

/// One polling watcher, drained by the calls that read it (one at a time).
pub type Watcher = Arc<tokio::sync::Mutex<WatchHandle>>;

/// Ended processes whose end nobody read, kept per sandbox beyond which the oldest are dropped.
pub const MAX_ENDED_KEPT: usize = 32;

/// One process's reader, shared by the calls that read it (one at a time).
pub type Reader = Arc<tokio::sync::Mutex<ProcessHandle>>;

/// The readers of this instance's background processes.
#[derive(Default)]
pub struct LiveProcesses {
    readers: Mutex<HashMap<(SandboxId, u32), Kept>>,
    watchers: Mutex<HashMap<(SandboxId, String), Watcher>>,
    next_watcher: std::sync::atomic::AtomicU64,
}

/// One kept reader, with the tag it is also found by until its end was read.
struct Kept {
    tag: Option<String>,
    reader: Reader,
    /// When its process ended (told by whoever follows it to its end), if it has.
    ended: Option<std::time::Instant>,
}

impl LiveProcesses {
    /// Keeps the reader of a process just started.
    pub fn keep(&self, sandbox: SandboxId, handle: ProcessHandle) -> Reader {
        let (pid, tag) = (handle.pid(), handle.tag().map(str::to_owned));
        let reader = Arc::new(tokio::sync::Mutex::new(handle));
        self.lock().insert(
            (sandbox, pid),
            Kept {
                tag,
                reader: Arc::clone(&reader),
                ended: None,
            },
        );
        reader
    }

    /// The reader of the process `select` names in `sandbox`: the kept one, else a new one
    /// attached through the dispatcher (which refuses a process the sandbox does not have).
    pub async fn reader(
        &self,
        dispatcher: &Dispatcher,
        sandbox: SandboxId,
        select: ProcessSelector,
    ) -> dispatcher::Result<Reader> {
        // A kept reader answers for its process until its end was read, even once the
        // executor has forgotten the process (it ended).
        let kept = self.lock().iter().find_map(|((s, pid), kept)| {
            let hit = *s == sandbox
                && match &select {
                    ProcessSelector::Pid(wanted) => pid == wanted,
                    ProcessSelector::Tag(wanted) => kept.tag.as_ref() == Some(wanted),
                };
            hit.then(|| Arc::clone(&kept.reader))
        });
        if let Some(reader) = kept {
            return Ok(reader);
        }
        // Not started here (or by another instance before a restart): the dispatcher resolves
        // it; a reader kept meanwhile for the same pid wins, so two readers never split one
        // process's output.
        let handle = dispatcher.attach_process(sandbox, select).await?;
        let (pid, tag) = (handle.pid(), handle.tag().map(str::to_owned));
        let mut readers = self.lock();
        let kept = readers.entry((sandbox, pid)).or_insert_with(|| Kept {
            tag,
            reader: Arc::new(tokio::sync::Mutex::new(handle)),
            ended: None,
        });
        Ok(Arc::clone(&kept.reader))
    }

    /// Notes that a process ended (its end may still be unread), and drops the oldest ended
    /// entries of its sandbox beyond [`MAX_ENDED_KEPT`].
    pub fn mark_ended(&self, sandbox: SandboxId, pid: u32) {
        let mut readers = self.lock();
        if let Some(kept) = readers.get_mut(&(sandbox, pid)) {
            kept.ended = Some(std::time::Instant::now());
        }
        let mut ended: Vec<((SandboxId, u32), std::time::Instant)> = readers
            .iter()
            .filter(|((s, _), _)| *s == sandbox)
            .filter_map(|(key, kept)| Some((*key, kept.ended?)))
            .collect();
        if ended.len() > MAX_ENDED_KEPT {
            ended.sort_by_key(|(_, at)| *at);
            for (key, _) in &ended[..ended.len() - MAX_ENDED_KEPT] {
                readers.remove(key);
            }
        }
    }

    /// Forgets a process whose end was read.
    pub fn ended(&self, sandbox: SandboxId, pid: u32) {
        self.lock().remove(&(sandbox, pid));
    }

    /// Forgets every process and watcher of a sandbox that is gone.
    pub fn forget_sandbox(&self, sandbox: SandboxId) {
        self.lock().retain(|(s, _), _| *s != sandbox);
        self.watchers_lock().retain(|(s, _), _| *s != sandbox);
    }

    /// Keeps a new polling watcher of `sandbox` and names it; refused (with the bound) when
    /// the sandbox already holds [`MAX_WATCHERS`], and the watch is then dropped.
    pub fn keep_watcher(&self, sandbox: SandboxId, handle: WatchHandle) -> Result<String, usize> {
        let mut watchers = self.watchers_lock();
        if watchers.keys().filter(|(s, _)| *s == sandbox).count() >= MAX_WATCHERS {
            return Err(MAX_WATCHERS);
        }
        let n = self
            .next_watcher
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("w{n}");
        watchers.insert(
            (sandbox, id.clone()),
            Arc::new(tokio::sync::Mutex::new(handle)),
        );
        Ok(id)
    }

    /// The polling watcher `id` of `sandbox` (another sandbox's watcher is not found).
    pub fn watcher(&self, sandbox: SandboxId, id: &str) -> Option<Watcher> {
        self.watchers_lock()
            .get(&(sandbox, id.to_owned()))
            .map(Arc::clone)
    }

    /// Removes a polling watcher (its watch ends once no call reads it); whether it existed.
    pub fn remove_watcher(&self, sandbox: SandboxId, id: &str) -> bool {
        self.watchers_lock()
            .remove(&(sandbox, id.to_owned()))
            .is_some()
    }

    fn watchers_lock(&self) -> std::sync::MutexGuard<'_, HashMap<(SandboxId, String), Watcher>> {
        self.watchers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(SandboxId, u32), Kept>> {
        self.readers.lock().unwrap_or_else(|p| p.into_inner())
    }
}
