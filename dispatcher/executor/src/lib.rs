//! The sandbox executor: the small static program that performs `cmd.run` and `fs.*` inside a
//! sandbox container, as its PID 1, for the dispatcher on the other end of its stdin/stdout.
//!
//! Two audiences use this package. The dispatcher depends on it with `default-features = false`
//! and gets only [`protocol`], the wire types (serde only), with [`kernel`]'s Landlock probe and
//! [`encoding::encode`], the rule for bytes in JSON, which the node shares. The executor binary
//! is built with the default `executor` feature, which adds the modules below:
//!
//! * `server` — start-up, the request stream, dispatch and shutdown; `workers` — the reused
//!   threads requests run on;
//! * `identity` — privileges kept and dropped, the sandbox user's filesystem identity;
//! * `paths`, `roots` — lexical normalization and descriptor-relative resolution beneath roots
//!   (`openat2`, or `beneath`'s userspace walk where the kernel has none, as gVisor's);
//! * `fs` — one module per `fs.*` operation (`fs/watch.rs`: directory watches); `cmd` —
//!   `cmd.run`; `spawn` — starting confined programs, children and reaping; `live` — processes
//!   that outlive their request;
//! * `output` — the protocol's stdout, responses and events;
//! * `proc` — the process tools `proc.list`, `logs.read`, `env.get`; `port` — TCP connections to
//!   ports inside the sandbox, relayed over the channel;
//! * `config`, `error`, `encoding`, `frame`, `log` — the small shared pieces.
//!
//! Invariants: no requested path is opened except through `roots` (beneath a root: openat2, or
//! the `beneath` walk);
//! every file operation runs with the sandbox user's fsuid/fsgid; no command runs as root or
//! through a shell; one thread (the reaper) waits for children.

#![warn(missing_docs)]

pub mod kernel;
// Always: `encode` (bytes as JSON text) is shared with the node, which encodes the streaming
// form of `cmd.run` as the executor encodes its one-shot answer.
pub mod encoding;
pub mod protocol;

#[cfg(feature = "executor")]
pub mod beneath;
#[cfg(feature = "executor")]
pub mod channel;
#[cfg(feature = "executor")]
pub mod cmd;
#[cfg(feature = "executor")]
pub mod config;
#[cfg(feature = "executor")]
pub mod context;
#[cfg(feature = "executor")]
pub mod error;
#[cfg(feature = "executor")]
pub mod frame;
#[cfg(feature = "executor")]
pub mod fs;
#[cfg(feature = "executor")]
pub mod identity;
#[cfg(feature = "executor")]
pub mod live;
#[cfg(feature = "executor")]
pub mod log;
#[cfg(feature = "executor")]
pub mod output;
#[cfg(feature = "executor")]
pub mod paths;
#[cfg(feature = "executor")]
pub mod port;
#[cfg(feature = "executor")]
pub mod proc;
#[cfg(feature = "executor")]
pub mod roots;
#[cfg(feature = "executor")]
pub mod running;
#[cfg(feature = "executor")]
pub mod server;
#[cfg(feature = "executor")]
pub mod spawn;
#[cfg(feature = "executor")]
pub mod transfer;
#[cfg(feature = "executor")]
pub mod transfers;
#[cfg(feature = "executor")]
pub mod workers;

/// Runs the executor until its stdin closes; returns the process exit code.
#[cfg(feature = "executor")]
pub fn run() -> i32 {
    server::main()
}
