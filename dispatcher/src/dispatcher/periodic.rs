//! The dispatcher's periodic chores (the reaper, the lease, the beacon): one loop that runs a
//! chore every period until the dispatcher shuts down or is dropped, holding the dispatcher only
//! while a chore runs, never across the wait.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::Inner;

/// Runs `chore` on the dispatcher every `period` (first after one period) until it shuts down
/// or is dropped.
pub(crate) fn every<F, Fut>(weak: Weak<Inner>, period: Duration, chore: F)
where
    F: Fn(Arc<Inner>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(inner) = weak.upgrade() else { return };
    let shutdown = inner.shutdown.clone();
    drop(inner);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            let Some(inner) = weak.upgrade() else { return };
            chore(inner).await;
        }
    });
}
