//! The dispatcher owns every conversation with the container engine.
//!
//! The orchestrator never talks to Docker itself: it asks this crate for sandboxes and for the
//! engine's health. Keeping Docker behind one library boundary is what lets the rest of the service
//! stay ignorant of containers (and lets the security-relevant container settings live in one place).

mod engine;

pub use engine::{DockerEngine, EngineError};
