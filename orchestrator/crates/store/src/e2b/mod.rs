//! The rows of the E2B door (`orchestrator/crates/e2b-door`): its sandboxes, what their
//! timeout does, their logs and the idempotency keys of v2 creates (`sandboxes`), snapshots
//! (`snapshots`) and usage samples (`metrics`). The door decides and serves; these functions
//! only read and write the rows.

pub mod metrics;
pub mod sandboxes;
pub mod snapshots;
