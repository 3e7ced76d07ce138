//! E2B's wire, without I/O: what the node needs to speak to E2B's SDKs unchanged.
//!
//! - [`envd`]: the messages of envd's `process.Process` and `filesystem.Filesystem` services,
//!   generated from `proto/e2b/envd/` (binary protobuf through prost, the proto3 JSON mapping
//!   through pbjson), and the E2B-specific request headers envd reads.
//! - [`connect`]: the Connect protocol those services are served with: content types, unary
//!   bodies, enveloped streams (incremental decoding with a size bound), errors and their
//!   HTTP statuses.
//! - [`api`]: the control API's JSON bodies (`POST /sandboxes` and friends), its query strings
//!   (metadata filters, states, page tokens) and its error body, as E2B's SDK writes and parses
//!   them.
//!
//! Nothing here serves, stores or decides policy; the node's E2B routes do, with these types.

pub mod api;
pub mod connect;
pub mod envd;
