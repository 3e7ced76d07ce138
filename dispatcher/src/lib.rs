//! The dispatcher owns every conversation with the container engine.
//!
//! The orchestrator never talks to Docker itself: it asks this crate for sandboxes and for the
//! engine's health. Keeping Docker behind one library boundary is what lets the rest of the service
//! stay ignorant of containers (and lets the security-relevant container settings live in one place:
//! [`hardening`](crate::hardening)).
//!
//! The crate knows nothing of HTTP, SEAL or policy: callers decide *whether* a call is allowed;
//! the dispatcher makes sure it runs inside a hardened, labelled, recorded sandbox. The map:
//!
//! - [`engine`](DockerEngine): the shared Docker handle;
//! - `spec`, `config`: what a caller may ask for, and the operator's ceilings;
//! - `install`: the executor binary, delivered through a read-only, content-addressed volume;
//! - `hardening`: the container settings of a sandbox, each with its reason;
//! - [`isolation`]: the class a sandbox runs in (runc on the host's kernel, or gVisor) and
//!   the operator's choice of it;
//! - `stream`: the multiplexed request stream over a container's attached stdin/stdout, and
//!   the events of live processes and watches;
//! - `live`: live processes (start, attach by pid or tag, input, signals, terminal size) and
//!   directory watches; `feed`: the bounded ring of events each of them has;
//! - [`Forwarder`] (`forward`): calls, live processes and watches of sandboxes another live
//!   instance holds, carried to it; `relay`: their events followed into feeds of this one;
//! - `dispatcher`: the lifecycle (create, call, destroy, adopt) and its ordering guarantees;
//! - [`network`]: a networked sandbox's internal Docker network, the host firewall that admits
//!   only its egress proxy, and the [`EgressHost`](network::EgressHost) hook that starts and
//!   stops that proxy (the orchestrator's);
//! - `placement`: which engine a new sandbox goes to when replicas drive several Docker
//!   engines, and each engine's bound;
//! - `pool`: the warm pool; `reaper`: removal of whatever has no live owner; `beacon`: the
//!   liveness every instance publishes in Docker for the reapers of other databases;
//! - `archive`: tar archives into and out of a live sandbox's workspace (persistent volumes);
//! - `store`: the `sandboxes` table; `kernel`: what the kernel offers the command policy;
//! - [`encoding`]: command output as the executor carries it in JSON (the node's streaming
//!   form of `cmd.run` answers with it).
//! - `usage`: a running sandbox's CPU, memory and workspace use, from its container's cgroup;
//!   [`cpu_groups`]: whether the node's own CPU group leaves its sandboxes their share.
//!
//! Invariants kept here: a sandbox's row exists before any of its Docker objects; every object
//! carries `org.aegis.managed`, scope, instance and sandbox labels; no sandbox has binds,
//! devices, privileges or capabilities beyond the executor's four; the reaper never touches an
//! object without the managed label, nor one of another scope unless that scope's database was
//! dropped from this cluster or its instances all stopped beating (`beacon`).

#![warn(missing_docs)]

mod archive;
pub mod budget;
pub mod channel;
mod config;
pub mod cpu_groups;
mod dispatcher;
pub mod encoding;
mod engine;
mod error;
mod feed;
mod forward;
pub mod hardening;
mod id;
mod install;
pub mod isolation;
pub mod kernel;
pub mod labels;
mod live;
pub mod network;
mod placement;
mod port;
mod port_stream;
mod relay;
mod spec;
mod store;
mod stream;
mod usage;
mod ustar;

pub use archive::{data_entries, DataEntry, DataKind};
pub use config::{DispatcherConfig, EngineLimit};
pub use dispatcher::pool::{PoolStats, POOL_OWNER_ID};
pub use dispatcher::reaper::ReapReport;
pub use dispatcher::{AdoptReport, Checkpointed, Dispatcher, Forked};
pub use engine::{DockerEngine, EngineError};
pub use error::{DispatchError, Result};
pub use forward::{
    Forwarder, Opened, PortIo, PortStream, Relay, Relayed, Subscribed, Subscription,
};
pub use install::{EXECUTOR_DIR, EXECUTOR_NAME};
pub use isolation::{Isolation, IsolationPolicy};
pub use live::{ProcessEvent, ProcessHandle, ProcessSelector, WatchEvent, WatchHandle};
pub use port::{OpenedPort, PortConnection, PortEvent, PortWriter};
pub use port_stream::PortBounds;
pub use spec::{Limits, NetworkMode, Owner, OwnerKind, SandboxId, SandboxSpec, WORKSPACE};
pub use store::{RecordedSpec, SandboxInfo, SandboxState};
pub use stream::{Transport, UploadPiece};
pub use usage::Usage;

/// The executor's wire protocol (requests, responses, results), re-exported so callers build
/// [`protocol::Op`] values without depending on the executor package themselves.
pub use sandbox_executor::protocol;
