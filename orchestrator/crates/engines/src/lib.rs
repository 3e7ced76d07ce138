//! The two engines of the service and what they share: agent executions (`engine`: the model
//! and tool loop, validators, cancellation, recovery), workflow executions (`workflow`: durable
//! state machines in PostgreSQL on any replica), the vocabulary of one tool call (`call`, with
//! `ToolInvoker`, the router as they see it: the router lives above them), and the definitions
//! the node ships (`builtin`), and how both kinds of run are stored alike (`runs`). Neither
//! engine holds the application state: each gets its handles
//! (`engine::Services`, `workflow::AgentHost`).

pub mod builtin;
pub mod call;
pub mod engine;
pub mod runs;
pub mod workflow;
