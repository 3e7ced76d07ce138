//! The protocol's stdout: whole lines, one writer at a time.
//!
//! Responses (from handler threads) and events (from the threads of live processes and watches)
//! share one stream; a mutex makes every line whole, so lines never interleave. A line waits at
//! most for the one being written: an event is one read of a pipe (64 KiB at most), so a
//! response never queues behind a process's whole output.

use std::io::{self, Write};
use std::sync::{Mutex, PoisonError};

use serde::Serialize;

use crate::error::OpError;
use crate::protocol::{ErrorKind, Event, Response};

/// The executor's stdout.
pub struct Output {
    stdout: Mutex<io::Stdout>,
}

impl Default for Output {
    fn default() -> Self {
        Output {
            stdout: Mutex::new(io::stdout()),
        }
    }
}

impl Output {
    /// Writes one response line.
    pub fn send<T: Serialize>(&self, response: &Response<T>) {
        let line = serde_json::to_vec(response).unwrap_or_else(|e| {
            let fallback: Response<()> = Response::error(
                response.id,
                ErrorKind::Internal,
                format!("cannot serialize the response: {e}"),
            );
            serde_json::to_vec(&fallback).unwrap_or_default()
        });
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

    fn line(&self, mut line: Vec<u8>, what: impl FnOnce() -> String) {
        line.push(b'\n');
        let stdout = self.stdout.lock().unwrap_or_else(PoisonError::into_inner);
        let mut handle = stdout.lock();
        if let Err(e) = handle.write_all(&line).and_then(|()| handle.flush()) {
            crate::log_event!("cannot write {}: {e}", what());
        }
    }
}
