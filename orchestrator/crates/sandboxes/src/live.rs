//! Background processes started through the router (`cmd.run` with `background: true`): the
//! one reader each process's output is read from between calls, so `proc.output` returns every
//! byte once and in order.
//!
//! The dispatcher keeps each process's events in a bounded ring and reports what a slow reader
//! missed; this registry only keeps the reader (`ProcessHandle`) between tool calls, by sandbox
//! and pid. It holds at most what the executor allows per sandbox (`max_live_processes`), loses
//! a process's entry once its end was read, and a sandbox's entries when the sandbox is
//! destroyed. A replica that did not start a process (after a restart) attaches a new reader on
//! first use, from the output still buffered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dispatcher::{Dispatcher, ProcessHandle, ProcessSelector, SandboxId};

/// One process's reader, shared by the calls that read it (one at a time).
pub type Reader = Arc<tokio::sync::Mutex<ProcessHandle>>;

/// The readers of this instance's background processes.
#[derive(Default)]
pub struct LiveProcesses {
    readers: Mutex<HashMap<(SandboxId, u32), Kept>>,
}

/// One kept reader, with the tag it is also found by until its end was read.
struct Kept {
    tag: Option<String>,
    reader: Reader,
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
        });
        Ok(Arc::clone(&kept.reader))
    }

    /// Forgets a process whose end was read.
    pub fn ended(&self, sandbox: SandboxId, pid: u32) {
        self.lock().remove(&(sandbox, pid));
    }

    /// Forgets every process of a sandbox that is gone.
    pub fn forget_sandbox(&self, sandbox: SandboxId) {
        self.lock().retain(|(s, _), _| *s != sandbox);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(SandboxId, u32), Kept>> {
        self.readers.lock().unwrap_or_else(|p| p.into_inner())
    }
}
