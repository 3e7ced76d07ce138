//! Language models, reached through the OpenAI chat-completions API with tool calling.
//!
//! One wire protocol covers OpenAI, Ollama's `/v1`, vLLM and llama.cpp's server, so there is one
//! client and no per-vendor code. The node config lists providers (where, which key variable,
//! timeouts, retries) and model aliases; manifests name an alias. The execution engine calls
//! [`LlmClient::chat`] with the conversation and the tools the agent may use, and gets the
//! assistant message back in our own types ([`Message`], [`ToolCall`]), or an [`LlmError`] that
//! is the execution's failure reason as is: a provider that is down fails the call after its
//! retries and timeouts, it never hangs it.
//!
//! - `config`: the `llm:` node config section and its checks.
//! - `types`: the conversation types the engine works with.
//! - `wire`: how those types look in OpenAI's JSON, and back.
//! - `client`: alias resolution, the HTTP attempt, retries, key handling.
//! - `error`: why a call failed.

mod client;
mod config;
mod error;
mod types;
mod wire;

pub use client::LlmClient;
pub use config::{LlmConfig, ModelRef, ProviderConfig};
pub use error::LlmError;
pub use types::{ChatRequest, ChatResponse, Message, Role, ToolCall, ToolSpec, Usage};
