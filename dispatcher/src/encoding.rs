//! Command output as the executor carries it in JSON: UTF-8 text as is, anything else as
//! standard base64, and an incomplete character at the very end of output cut at its cap
//! dropped (an artefact of the cut). The rule is the executor's own (`encoding.rs`, linked here
//! without the rest of the executor); the node encodes the result of the streaming form of
//! `cmd.run` with it, so that result reads like the executor's one-shot answer.

pub use sandbox_executor::encoding::{base64_encode, encode};

/// Most bytes of each stream a one-shot `cmd.run` keeps, whatever it asks (the executor's
/// `cmd::run::MAX_KEPT_BYTES`); the streaming form keeps to it too.
pub const MAX_COMMAND_OUTPUT_BYTES: u64 = 16 * 1024 * 1024;
