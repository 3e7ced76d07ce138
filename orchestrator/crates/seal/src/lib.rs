//! SEAL v1 (Signed Envelope Attestation Layer): the pure, transport-free core of the gateway.
//!
//! SEAL is how agents and programs outside the orchestrator call its tools: a client attests
//! with an ephemeral Ed25519 key and receives a security token bound to a security context;
//! each call then travels in an envelope signed with that key, so every call is attributable
//! and cannot be forged or altered on the way (`../shared/reference/seal-v1-notes.md`).
//!
//! This crate holds everything about SEAL that needs no I/O, so that the HTTP and gRPC
//! adapters, the session store and the tests share one implementation of the rules:
//!
//! - [`canonical`]: a lexeme-preserving JSON parser and the canonical bytes clients sign
//!   (Python's `json.dumps(sort_keys=True, separators=(',',':'), ensure_ascii=False)`);
//! - [`envelope`]: the wire envelope, freshness and Ed25519 signature checks, public-key
//!   decoding;
//! - [`token`]: issuing and verifying the security tokens (EdDSA, and RS256 from a configured
//!   key);
//! - [`context`]: security contexts, their validation and the policy evaluation with rate
//!   limits;
//! - [`error`]: the RFC's numeric codes, HTTP statuses and error bodies.
//!
//! Sessions, replay memory, audit records and the router live with the gateway; nothing here
//! knows about a database, a socket or a clock (callers pass `now`), which is what lets the
//! RFC's test vectors run as plain unit tests.

pub mod canonical;
pub mod context;
pub mod envelope;
pub mod error;
pub mod tier;
pub mod token;

pub use context::{Grant, RateLimiter, SecurityContext};
pub use envelope::Envelope;
pub use error::{SealCode, SealError};
pub use tier::Tier;
pub use token::{Claims, TokenIssuer};
