//! The rows of the E2B door (`orchestrator/crates/e2b-door`): its sandboxes, what their
//! timeout does, their logs and the idempotency keys of v2 creates (`sandboxes`), snapshots
//! (`snapshots`), usage samples (`metrics`) and who may open a sandbox's ports (`traffic`). The door decides and serves; these functions
//! only read and write the rows.

pub mod metrics;
pub mod sandboxes;
pub mod snapshots;
pub mod traffic;
