//! The orchestrator service: configuration, start-up, adapters (REST, gRPC) and the core they share.
//!
//! See ARCHITECTURE.md at the repository root for the map of modules and the invariants.

pub mod api;
pub mod app;
pub mod background;
pub mod cluster;
/// Manifests without I/O live in their own crate (`orchestrator/crates/manifest`, the bottom
/// layer); re-exported so the service's modules name them as before.
pub use aegis_manifest as manifest;
/// SEAL v1 without I/O lives in its own crate (`orchestrator/crates/seal`, the bottom layer);
/// re-exported here so the service's modules and its tests name it as before.
pub use aegis_seal as seal;
pub mod shutdown;
pub mod telemetry;

/// The node configuration (assembled from each crate's section) and the metrics registry.
pub use aegis_config as config;
/// The vocabulary every layer shares (caller, tool catalog metadata, arguments, templates,
/// runtimes) and the policy decision live in pure crates below the service
/// (`orchestrator/crates/core`, `orchestrator/crates/policy`); re-exported so the service's
/// modules name them as before.
pub use aegis_core::{arguments, caller, catalog, render, runtimes, DEFAULT_TENANT};
/// The outside world under rules (and the external MCP servers reached through it), and the
/// model client, in their own crates (`orchestrator/crates/egress`, `orchestrator/crates/llm`).
pub use aegis_egress::{self as egress, delivery, mcp_servers};
/// The two engines (agent executions, workflows) with the call vocabulary and the shipped
/// definitions, and the SEAL gateway, in their own crates.
pub use aegis_engines::{builtin, call, engine, runs, workflow};
pub use aegis_gateway as gateway;
pub use aegis_llm as llm;
pub use aegis_metrics as metrics;
pub use aegis_policy as policy;
/// Sandboxes under their policy, agent and workflow volumes, and readiness, in their own crate
/// (`orchestrator/crates/sandboxes`).
pub use aegis_sandboxes::{self as sandboxes, health, volumes, workspaces};
/// The rows in PostgreSQL (pool and migrations, audit chain, keys, registry, contexts,
/// approvals, memory) live in the storage crate (`orchestrator/crates/store`); re-exported so
/// the service's modules name them as before.
pub use aegis_store::{approvals, audit, auth, contexts, database, memory, registry};
/// The router, the tool handlers and the node's handles they run on.
pub use aegis_tools::{state, tools};

/// mimalloc for every binary that links the orchestrator (the service, its tests and benchmarks,
/// so they measure what runs): its thread-local free lists cost a fraction of glibc's arenas
/// for the small, short-lived allocations of a request.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
