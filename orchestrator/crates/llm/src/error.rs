//! Why a chat call failed, worded so it can become an execution's failure reason as is.
//!
//! No variant ever holds an API key: bodies and transport messages are redacted by the client
//! before they get here, and configuration errors name the variable, never its value.

use std::time::Duration;

/// A failed chat call (or a client that could not be built).
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The alias is not a key of `llm.models`.
    #[error("unknown model alias `{alias}` (known: {})", super::config::list(known.iter().map(String::as_str)))]
    UnknownAlias {
        /// What was asked for.
        alias: String,
        /// The configured aliases.
        known: Vec<String>,
    },
    /// The node config has no `llm.providers`.
    #[error(
        "no language model is configured on this node (its config has no `llm.providers`): add \
         an `llm:` section to the node config (examples/node-config.ollama.yaml); under docker \
         compose set ORCHESTRATOR_CONFIG_FILE in .env to ./config/compose.ollama.yaml or \
         ./config/compose.openai.yaml and run `up -d` again (README, \"A model for compose\")"
    )]
    NoProviders,
    /// The configuration cannot be used: no default alias, a missing key variable, an alias
    /// pointing nowhere. Names the key or variable, never a secret.
    #[error("LLM configuration: {0}")]
    Config(String),
    /// One attempt took longer than the provider's `timeout_secs`.
    #[error("LLM provider `{provider}` did not answer within {after:?}")]
    Timeout {
        /// The provider's configured name.
        provider: String,
        /// The per-attempt timeout.
        after: Duration,
    },
    /// The provider answered with an error status.
    #[error("LLM provider `{provider}` answered HTTP {status}: {body_excerpt}")]
    Http {
        /// The provider's configured name.
        provider: String,
        /// The HTTP status.
        status: u16,
        /// The start of the body (at most 500 characters, the API key redacted).
        body_excerpt: String,
    },
    /// The provider could not be reached, or the connection broke.
    #[error("LLM provider `{provider}` unreachable: {message}")]
    Transport {
        /// The provider's configured name.
        provider: String,
        /// What went wrong.
        message: String,
    },
    /// The provider answered 2xx with something that is not a chat completion.
    #[error("LLM provider `{provider}` sent an unusable answer: {message}")]
    BadResponse {
        /// The provider's configured name.
        provider: String,
        /// What was wrong with it.
        message: String,
    },
    /// Every attempt failed with a retryable error; `last` is the final one.
    #[error("LLM provider `{provider}` failed {attempts} attempts; last: {last}")]
    RetriesExhausted {
        /// The provider's configured name.
        provider: String,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        last: Box<LlmError>,
    },
}

impl LlmError {
    /// Whether another attempt might succeed: 408, 429, 5xx, timeouts and transport failures.
    /// Other 4xx mean the request itself is wrong and would fail again.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Timeout { .. } | Self::Transport { .. } => true,
            Self::Http { status, .. } => matches!(status, 408 | 429 | 500..=599),
            _ => false,
        }
    }
}
