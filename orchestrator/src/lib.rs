//! The orchestrator service: configuration, start-up, adapters (REST, gRPC) and the core they share.
//!
//! See ARCHITECTURE.md at the repository root for the map of modules and the invariants.

pub mod api;
pub mod app;
pub mod config;
pub mod health;
pub mod shutdown;
pub mod state;
pub mod store;
pub mod telemetry;
