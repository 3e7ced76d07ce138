//! The file transfers in progress (`transfer.rs` runs them): what the channel's reader hands
//! them (blocks, acks, cancels, the channel's end) without waiting, and what their handler
//! threads wait on. Apart from the handlers so the context can hold the table.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::output::Output;
use crate::protocol::{IDLE_LIMIT, WINDOW};

/// What one transfer has: blocks received and not yet written (uploads), credit (downloads),
/// whether it ended or was abandoned.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) blocks: VecDeque<Vec<u8>>,
    /// Payload bytes in `blocks`.
    pub(crate) queued: u64,
    /// The upload's end block came.
    pub(crate) ended: bool,
    /// Why the transfer must stop (cancel, channel closed, credit overrun).
    pub(crate) abandoned: Option<String>,
    /// Bytes a download may send before the next ack.
    pub(crate) credit: u64,
}

/// One transfer in progress, shared by its handler thread and the channel's reader.
pub(crate) struct Transfer {
    state: Mutex<State>,
    changed: Condvar,
    /// The channel its request came on: its blocks and credit go there, and its end abandons
    /// the transfer.
    channel: Arc<Output>,
}

impl Transfer {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn abandon(&self, why: String) {
        let mut state = self.lock();
        state.abandoned.get_or_insert(why);
        drop(state);
        self.changed.notify_all();
    }

    /// Waits until `ready` holds, the transfer was abandoned (its reason) or [`IDLE_LIMIT`]
    /// passed without a change.
    pub(crate) fn wait(
        &self,
        what: &str,
        mut ready: impl FnMut(&State) -> bool,
    ) -> Result<MutexGuard<'_, State>, String> {
        let mut state = self.lock();
        let mut since = Instant::now();
        loop {
            if let Some(why) = &state.abandoned {
                return Err(why.clone());
            }
            if ready(&state) {
                return Ok(state);
            }
            let left = IDLE_LIMIT.saturating_sub(since.elapsed());
            if left.is_zero() {
                return Err(format!("no {what} came for {}s", IDLE_LIMIT.as_secs()));
            }
            let (next, timeout) = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner);
            state = next;
            if !timeout.timed_out() {
                since = Instant::now();
            }
        }
    }
}

/// The transfers in progress, by request id.
#[derive(Default)]
pub struct Transfers {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    running: HashMap<u64, Arc<Transfer>>,
    /// Transfer requests cancelled while in flight but before their handler registered them
    /// (the cancel came on the reader thread first): they start abandoned. The server forgets
    /// a mark when its request finishes, so a mark never reaches a later request of the same id.
    cancelled_early: HashSet<u64>,
}

impl Transfers {
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn begin(&self, id: u64, channel: &Arc<Output>) -> Registered<'_> {
        let mut table = self.lock();
        let abandoned = table
            .cancelled_early
            .remove(&id)
            .then(|| "the node cancelled the transfer".to_owned());
        let transfer = Arc::new(Transfer {
            state: Mutex::new(State {
                credit: WINDOW,
                abandoned,
                ..State::default()
            }),
            changed: Condvar::new(),
            channel: Arc::clone(channel),
        });
        table.running.insert(id, Arc::clone(&transfer));
        Registered {
            transfers: self,
            id,
            transfer,
        }
    }

    /// A block from the node, handed over without waiting (the reader thread calls this); an
    /// empty block ends the upload. A block of a transfer that is over is dropped.
    pub fn deliver(&self, id: u64, payload: Vec<u8>) {
        let Some(transfer) = self.lock().running.get(&id).cloned() else {
            return;
        };
        let mut state = transfer.lock();
        if payload.is_empty() {
            state.ended = true;
        } else {
            state.queued += payload.len() as u64;
            if state.queued > WINDOW {
                state.abandoned.get_or_insert_with(|| {
                    format!("the node sent more than the {WINDOW} bytes of credit it had")
                });
                state.blocks.clear();
            } else {
                state.blocks.push_back(payload);
            }
        }
        drop(state);
        transfer.changed.notify_all();
    }

    /// `fs.stream_ack`: a download may send `bytes` more. Unknown targets are ignored (the
    /// download may have just ended).
    pub fn ack(&self, target: u64, bytes: u64) {
        if let Some(transfer) = self.lock().running.get(&target).cloned() {
            let mut state = transfer.lock();
            state.credit = state.credit.saturating_add(bytes).min(WINDOW);
            drop(state);
            transfer.changed.notify_all();
        }
    }

    /// `cancel` of a transfer: whether one had that id. `in_flight` says the request `target`
    /// is a transfer that is in flight: one not registered yet is then marked, so that it starts
    /// abandoned rather than running until its idle limit.
    pub fn cancel(&self, target: u64, in_flight: bool) -> bool {
        let mut table = self.lock();
        let found = table.running.get(&target).cloned();
        match &found {
            Some(transfer) => {
                drop(table);
                transfer.abandon("the node cancelled the transfer".to_owned());
                true
            }
            None if in_flight => {
                table.cancelled_early.insert(target);
                true
            }
            None => false,
        }
    }

    /// The request `id` finished: a cancel mark its handler never took is dropped.
    pub fn forget(&self, id: u64) {
        self.lock().cancelled_early.remove(&id);
    }

    /// The channel `channel` ended: every transfer that came on it stops.
    pub fn channel_closed(&self, channel: &Arc<Output>) {
        let ended: Vec<Arc<Transfer>> = self
            .lock()
            .running
            .values()
            .filter(|t| Arc::ptr_eq(&t.channel, channel))
            .cloned()
            .collect();
        for transfer in ended {
            transfer.abandon("the channel of the transfer closed".to_owned());
        }
    }
}

/// A transfer in the table for as long as its handler runs.
pub(crate) struct Registered<'a> {
    transfers: &'a Transfers,
    id: u64,
    pub(crate) transfer: Arc<Transfer>,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.transfers.lock().running.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel() -> Arc<Output> {
        Arc::new(Output::new(Box::new(std::io::sink())))
    }

    #[test]
    fn a_cancel_before_the_handler_registers_its_transfer_is_not_lost() {
        let transfers = Transfers::default();
        // The reader thread saw the cancel while the request was in flight, unregistered.
        assert!(
            transfers.cancel(7, true),
            "an in-flight transfer counts as cancelled"
        );
        let registered = transfers.begin(7, &channel());
        let why = registered
            .transfer
            .wait("block", |_| false)
            .err()
            .expect("the transfer starts abandoned, without waiting for its idle limit");
        assert_eq!(why, "the node cancelled the transfer");
    }

    #[test]
    fn a_mark_never_reaches_a_later_request_with_the_same_id() {
        let transfers = Transfers::default();
        assert!(transfers.cancel(9, true));
        // Its handler failed before registering (a refused path); the request finished.
        transfers.forget(9);
        let registered = transfers.begin(9, &channel());
        assert!(registered.transfer.lock().abandoned.is_none());
        drop(registered);
        // Not in flight: nothing to cancel, nothing marked.
        assert!(!transfers.cancel(9, false));
        assert!(transfers
            .begin(9, &channel())
            .transfer
            .lock()
            .abandoned
            .is_none());
    }

    #[test]
    fn a_cancel_of_a_registered_transfer_abandons_it() {
        let transfers = Transfers::default();
        let registered = transfers.begin(3, &channel());
        assert!(transfers.cancel(3, true));
        assert!(registered.transfer.wait("block", |_| false).is_err());
        drop(registered);
        assert!(
            !transfers.cancel(3, false),
            "gone from the table once its handler ended"
        );
    }
}
