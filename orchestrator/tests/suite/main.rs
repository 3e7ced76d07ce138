//! The orchestrator's integration tests, in one binary: each module is one area, driven
//! through the real service (HTTP, gRPC, MCP, the CLI) against a real PostgreSQL (a database of
//! its own per test) and the local Docker engine; `common` is the shared harness.
//!
//! One binary instead of one per file: an edit rebuilds and links the service into one test
//! executable, not forty. Run one area or one test with a filter:
//! `cargo test -p orchestrator --test suite -- doors::` (see README, "The two commands").

mod common;

mod aegis_compat;
mod aegis_forms;
mod agent_memory;
mod approvals;
mod audit_intent;
mod audit_sandbox;
mod background;
mod cli;
mod cluster;
mod code_interpreter;
mod code_run;
mod console;
mod contracts;
mod control_plane;
mod crash;
mod doors;
mod e2b;
mod e2b_egress;
mod e2b_files;
mod e2b_memory;
mod e2b_pool;
mod e2b_ports;
mod e2b_v2;
mod egress;
mod engines;
mod executions;
mod generate;
mod gvisor;
mod gvisor_pause;
mod gvisor_root;
mod intent;
mod kernel_policy;
mod llm;
mod manifest_keys;
mod manifests;
mod mcp;
mod mcp_external;
mod openapi_complete;
mod ops;
mod ownership;
mod policy_properties;
mod previews;
mod process_tools;
mod properties;
mod readme;
mod sandboxes;
mod scoping;
mod seal;
mod seal_interop;
mod seal_paths;
mod seal_python;
mod search;
mod secrets;
mod security;
mod skeleton;
mod speed;
mod streaming;
mod takeover;
mod volume_attacks;
mod web;
mod workflow_injection;
mod workflow_schedule;
mod workflow_scope;
mod workflow_validation;
mod workflow_wakeup;
mod workflow_workspace;
mod workflows;
mod workflows_crash;
