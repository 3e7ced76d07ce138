//! What the service remembers, as rows in PostgreSQL: the pool and its migrations (`database`),
//! the hash-chained audit log (`audit`), API keys (`auth`), agents and workflows (`registry`),
//! security contexts (`contexts`), pending approvals (`approvals`), agent memory (`memory`), the
//! E2B door's sandboxes (`e2b`), the node's instances (`node_instances`), the MCP door's
//! sessions (`mcp_sessions`),
//! and the group commit both per-call writes share (`group_commit`).
//! Nothing here decides policy or runs a tool; the services above call these functions with the
//! pool they were given.

pub mod approvals;
pub mod audit;
pub mod auth;
pub mod console_sessions;
pub mod contexts;
pub mod database;
pub mod e2b;
pub mod group_commit;
pub mod mcp_sessions;
pub mod memory;
pub mod node_instances;
pub mod previews;
pub mod registry;
