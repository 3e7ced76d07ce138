//! Reaching a sandbox that another live instance holds.
//!
//! A sandbox's executor stream is held by the instance that made (or adopted) it. Any other
//! instance of the same database that is asked to call into it finds the holder in the
//! sandbox's row and hands the call to a [`Forwarder`] (set in
//! [`DispatcherConfig::forwarder`](crate::DispatcherConfig::forwarder)): the orchestrator's
//! authenticated peer channel, which asks the holder to run it with
//! [`Dispatcher::call_held`](crate::Dispatcher::call_held) and returns the executor's answer as
//! if it were local. The decision to make the call (policy, audit) was taken by the instance the
//! caller reached; the holder only relays it to the executor, and never forwards it again.
//! Without a forwarder such a call fails with `SandboxNotFound { attached_elsewhere: true }`.

use std::time::Duration;

use futures_util::future::BoxFuture;
use sandbox_executor::protocol::{Op, Response};
use uuid::Uuid;

use crate::error::Result;
use crate::id::SandboxId;

/// Carries a call to the instance holding the sandbox; set by the orchestrator.
pub trait Forwarder: Send + Sync + std::fmt::Debug {
    /// Runs `op` in sandbox `id` through instance `holder`, which holds its stream, within
    /// `deadline`; the executor's response, or why the holder could not be asked.
    fn forward(
        &self,
        holder: Uuid,
        id: SandboxId,
        op: Op,
        deadline: Duration,
    ) -> BoxFuture<'_, Result<Response>>;
}
