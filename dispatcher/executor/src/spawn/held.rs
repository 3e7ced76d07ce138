//! Paths held open (`O_PATH`) for the executor's life.
//!
//! Why: on a FUSE root filesystem every walk from `/` with the sandbox user's filesystem
//! identity costs a round trip to the daemon per component, and a command's set-up would pay it
//! again and again for the same files (its program, the files it may execute, its write roots,
//! its devices). Each user decides how a path is opened and whether it may be kept (the image is
//! read-only for granted files; write roots only while nothing unprivileged can move them).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};

/// Descriptors by path, kept once opened.
#[derive(Default)]
pub struct HeldPaths {
    paths: Mutex<HashMap<String, Arc<OwnedFd>>>,
}

impl HeldPaths {
    /// `path`'s descriptor if held, else `open()`'s, held from then on when `keep()` says so.
    /// `None` when it cannot be opened.
    pub fn get_or_open(
        &self,
        path: &str,
        open: impl FnOnce() -> Option<OwnedFd>,
        keep: impl FnOnce() -> bool,
    ) -> Option<Arc<OwnedFd>> {
        if let Some(fd) = self.lock().get(path) {
            return Some(fd.clone());
        }
        let fd = Arc::new(open()?);
        if keep() {
            self.lock().insert(path.to_owned(), fd.clone());
        }
        Some(fd)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<OwnedFd>>> {
        self.paths.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
