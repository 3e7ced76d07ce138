//! Adapters: they parse requests, call the core, and map errors once. No policy lives here.

pub mod cluster;
pub mod console;
pub mod connection;
pub mod e2b;
pub mod grpc;
pub mod mcp;
pub mod request_id;
pub mod rest;
pub mod streaming;
