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
//!
//! Live processes and watches go the same way, as a [`Subscription`]: the holder starts (or
//! attaches to, or opens) it with
//! [`Dispatcher::subscribe_held`](crate::Dispatcher::subscribe_held) and streams the events of
//! its handle back; this instance fills a feed of its own from them (`relay.rs`), so the handle
//! the caller gets reads like a local one. Input, signals, terminal size and listings are plain
//! calls and forward as calls.
//!
//! A port connection goes the same way as a byte stream ([`Forwarder::open_port`]): the holder
//! opens the port on its executor and joins that connection to the stream, so the instance the
//! client reached (which admitted and audited it) reads and writes the server's bytes as if the
//! sandbox were its own.
//!
//! With several Docker engines (`placement.rs`) the same channel carries the two lifecycle
//! steps that must happen beside a sandbox's engine: its creation, on a replica driving the
//! engine chosen for it (which then holds it), and its destruction, by its holder.

use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use sandbox_executor::protocol::{Enforcement, Op, Response, StartParams};
use uuid::Uuid;

use crate::error::Result;
use crate::id::SandboxId;
use crate::live::{ProcessEvent, ProcessHandle, ProcessSelector, WatchEvent, WatchHandle};
use crate::spec::SandboxSpec;

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

    /// Opens `subscription` in sandbox `id` through instance `holder`: the holder's first answer
    /// within `deadline` (or its refusal, as the holder's dispatcher gave it), then its events
    /// for as long as they come. The stream ends after the last event (a process's or watch's
    /// end) or with one `Err` saying why no more can come (the holder stopped, the connection
    /// broke, the holder went silent), at once, never with a hang. Dropping the stream closes
    /// the subscription on the holder.
    fn subscribe(
        &self,
        holder: Uuid,
        id: SandboxId,
        subscription: Subscription,
        deadline: Duration,
    ) -> BoxFuture<'_, Result<(Opened, Relay)>>;

    /// Asks instance `target` to make a sandbox for `spec` (already validated here) on its own
    /// engine, from its warm pool or fresh, and to hold it; its id, or why not
    /// ([`DispatchError::NoRoom`](crate::DispatchError::NoRoom) when that engine is full).
    fn create(&self, target: Uuid, spec: SandboxSpec) -> BoxFuture<'_, Result<SandboxId>>;

    /// Asks instance `holder` to destroy sandbox `id`, which lives on its engine.
    fn destroy(&self, holder: Uuid, id: SandboxId) -> BoxFuture<'_, Result<()>>;

    /// Opens a TCP connection to `port` in sandbox `id` through instance `holder`, within
    /// `deadline`: a byte stream to the server there, or the holder's refusal as its dispatcher
    /// gave it (nothing listening: [`DispatchError::Refused`](crate::DispatchError::Refused)
    /// with kind `not_found`). A forwarder that carries no port connections says so.
    fn open_port(
        &self,
        holder: Uuid,
        id: SandboxId,
        port: u16,
        deadline: Duration,
    ) -> BoxFuture<'_, Result<PortStream>> {
        let _ = (holder, port, deadline);
        Box::pin(async move {
            Err(crate::DispatchError::SandboxNotFound {
                id,
                attached_elsewhere: true,
            })
        })
    }
}

/// A byte stream to a server in a sandbox another instance holds (see
/// [`Forwarder::open_port`]); dropping it closes the connection there.
pub type PortStream = Box<dyn PortIo>;

/// What a relayed port connection is: bytes both ways.
pub trait PortIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> PortIo for T {}

/// A live process or watch asked of the holder of its sandbox.
#[derive(Debug, Clone, PartialEq)]
pub enum Subscription {
    /// Start a process; its events from the very first.
    Start(StartParams),
    /// A new handle on a live process; its events from the oldest still buffered.
    Attach(ProcessSelector),
    /// Watch a directory; dropping the subscription removes the watch.
    Watch {
        /// The directory.
        path: String,
        /// Its subdirectories too.
        recursive: bool,
    },
}

impl Subscription {
    /// The operation's name in errors (`DispatchError::Refused::op`).
    pub fn op(&self) -> &'static str {
        match self {
            Subscription::Start(_) => "proc.start",
            Subscription::Attach(_) => "attach",
            Subscription::Watch { .. } => "fs.watch",
        }
    }
}

/// The holder's first answer to a [`Subscription`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// A process was started or attached to.
    Process {
        /// Its pid in the sandbox.
        pid: u32,
        /// Its tag.
        tag: Option<String>,
        /// What the kernel enforced (known to a start only).
        landlock: Option<Enforcement>,
    },
    /// A watch was opened.
    Watch {
        /// The watched directory, absolute.
        path: String,
    },
}

/// One event of a subscription, as the holder's handle read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Relayed {
    /// A live process's event.
    Process(ProcessEvent),
    /// A watch's event.
    Watch(WatchEvent),
}

/// A subscription's events after its first answer (see [`Forwarder::subscribe`]); an `Err` is
/// the last item and says why the events stopped.
pub type Relay = BoxStream<'static, std::result::Result<Relayed, String>>;

/// What the holder serves a peer's [`Subscription`] from: the handle whose events it relays.
#[derive(Debug)]
pub enum Subscribed {
    /// A live process's handle.
    Process(ProcessHandle),
    /// A watch's handle (dropping it removes the watch).
    Watch(WatchHandle),
}
