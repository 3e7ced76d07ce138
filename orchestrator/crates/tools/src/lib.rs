//! The router and the tool handlers (`tools`), and the node's handles they run on (`state`:
//! `AppState`, composed once at start by the binary and cloned into every adapter). Everything
//! a tool call needs below the adapters: REST, SEAL and MCP only turn their requests into calls
//! of `tools::invoke*` and their answers back.

pub mod state;
pub mod tools;
