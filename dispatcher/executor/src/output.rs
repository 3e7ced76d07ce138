//! The protocol's output channels: whole lines, one writer at a time.
//!
//! An [`Output`] is one channel's writing half: the container's stdout (the attach stream) or a
//! connection on the executor's socket (`channel.rs`). Responses go back on the channel their
//! request came in on. Events (from the threads of live processes and watches) go to
//! [`Events`], which forwards them to the channel the dispatcher follows now: the newest socket
//! connection, or whichever channel last asked `proc.live` (an adopting dispatcher).
//!
//! A mutex per channel makes every line whole, so lines never interleave. A line waits at most
//! for the one being written: an event is one read of a pipe (64 KiB at most), so a response
//! never queues behind a process's whole output.

use std::io::{self, Write};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use serde::Serialize;

use crate::error::OpError;
use crate::protocol::{ErrorKind, Event, Response};

/// One channel's writing half.
pub struct Output {
    writer: Mutex<Box<dyn Write + Send>>,
}

impl Default for Output {
    fn default() -> Self {
        Output::new(Box::new(io::stdout()))
    }
}

impl Output {
    /// A channel writing to `writer` (unbuffered: each line is written and flushed whole).
    pub fn new(writer: Box<dyn Write + Send>) -> Self {
        Output {
            writer: Mutex::new(writer),
        }
    }

    /// Writes one response line.
    pub fn send<T: Serialize>(&self, response: &Response<T>) {
        let mut line = Vec::with_capacity(256);
        if let Err(e) = serde_json::to_writer(&mut line, response) {
            line.clear();
            let fallback: Response<()> = Response::error(
                response.id,
                ErrorKind::Internal,
                format!("cannot serialize the response: {e}"),
            );
            let _ = serde_json::to_writer(&mut line, &fallback);
        }
        self.line(line, || format!("response {}", response.id));
    }

    /// Writes one error response line.
    pub fn error(&self, id: u64, error: OpError) {
        self.send::<()>(&Response::error(id, error.kind, error.message));
    }

    /// Writes one event line.
    pub fn event(&self, event: &Event) {
        match serde_json::to_vec(event) {
            Ok(line) => self.line(line, || format!("event of {}", event.event)),
            Err(e) => crate::log_event!("cannot serialize an event of {}: {e}", event.event),
        }
    }

    /// Writes one block of transfer `id` (`protocol::transfer`), whole; an error means the
    /// channel is broken and the transfer must stop.
    pub fn block(&self, id: u64, payload: &[u8]) -> io::Result<()> {
        let header = crate::protocol::block_header(id, payload.len());
        let mut writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        writer.write_all(&header)?;
        writer.write_all(payload)?;
        writer.flush()
    }

    fn line(&self, mut line: Vec<u8>, what: impl FnOnce() -> String) {
        line.push(b'\n');
        let mut writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = writer.write_all(&line).and_then(|()| writer.flush()) {
            crate::log_event!("cannot write {}: {e}", what());
        }
    }
}

/// Where events go: the channel the dispatcher follows now.
pub struct Events {
    current: RwLock<Arc<Output>>,
}

impl Events {
    /// Events go to `first` until another channel is followed.
    pub fn new(first: Arc<Output>) -> Self {
        Events {
            current: RwLock::new(first),
        }
    }

    /// Sends later events to `channel`.
    pub fn follow(&self, channel: &Arc<Output>) {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if !Arc::ptr_eq(&current, channel) {
            *current = Arc::clone(channel);
        }
    }

    /// Writes one event line to the followed channel.
    pub fn event(&self, event: &Event) {
        let current = Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner));
        current.event(event);
    }
}
