//! E2B's wire, without I/O: what the node needs to speak to E2B's SDKs unchanged.
//!
//! - [`envd`]: the messages of envd's `process.Process` and `filesystem.Filesystem` services,
//!   generated from `proto/e2b/envd/` (binary protobuf through prost, the proto3 JSON mapping
//!   through pbjson), the E2B-specific request headers envd reads, signed file URLs, and the
//!   pure parts of its plain HTTP `/files` route (query, upload metadata, upload answer).
//! - [`connect`]: the Connect protocol those services are served with: content types, unary
//!   bodies, enveloped streams (incremental decoding with a size bound), errors and their
//!   HTTP statuses.
//! - [`api`]: the control API's JSON bodies (`POST /sandboxes` and friends), its query strings
//!   (metadata filters, states, page tokens) and its error body, as E2B's SDK writes and parses
//!   them.
//!
//! Nothing here serves, stores or decides policy; the node's E2B routes do, with these types.
//!
//! What E2B's Python SDK expects of a server, beyond the types (checked against 2.45.1, the
//! version of the E2B commit whose tests we run, and 2.63.0; 2.63 creates and connects through
//! `/v2/sandboxes`, always secure, see [`api::NewSandbox`]):
//! - API key in `X-API-KEY`, and it must match `e2b_[0-9a-f]+` unless the user exports
//!   `E2B_VALIDATE_API_KEY=false`. Control errors are `{"code": <status>, "message"}`; the SDK
//!   shows `"<status>: <message>"`, treats 404 as "not found" (kill then returns false) and a
//!   409 on pause as "already paused".
//! - envd calls go to `E2B_SANDBOX_URL` + `/<package>.<Service>/<Method>` (plain string
//!   concatenation, so a path prefix works) with `E2b-Sandbox-Id`, `E2b-Sandbox-Port: 49983`,
//!   `X-Access-Token` for a secure sandbox, `Connect-Protocol-Version: 1`, and
//!   `Connect-Timeout-Ms` when the call has a timeout. JSON only, uncompressed, HTTP/1.1 on a
//!   plain `http://` URL. A stream's answer must be HTTP 200 with exactly
//!   `application/connect+json`; a unary error must be `application/json` with a string code.
//! - Start and Connect streams must open with the `start` event (the SDK fails otherwise) and
//!   carry `keepalive` events at the `Keepalive-Ping-Interval` (50 s) on idle.
//! - The SDK branches on codes: `not_found` (kill, exists), `already_exists` (make_dir),
//!   `invalid_argument`, `unauthenticated`, `unavailable` (reported as a sandbox timeout),
//!   `resource_exhausted`, `canceled` and `deadline_exceeded`.
//! - Signed file URLs are built with `urljoin(E2B_SANDBOX_URL, "/files")`, which drops any
//!   path prefix of that URL, and are fetched without the sandbox headers (see
//!   [`envd::signature`]).

pub mod api;
pub mod connect;
pub mod envd;
/// The `{"code", "message"}` error body both HTTP surfaces answer with (the control API and
/// envd's `/files`).
mod error_body;
mod query;
