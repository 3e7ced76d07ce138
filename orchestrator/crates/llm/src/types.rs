//! The conversation as the execution engine sees it: messages, tool specs, tool calls, answers.
//!
//! These are our own types, independent of any provider's JSON: the engine builds them, stores
//! them in events and feeds them back, and only `wire` knows how OpenAI spells them.

use serde::{Deserialize, Serialize};

/// One chat-completion call: the conversation so far and the tools the model may call.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ChatRequest {
    /// The conversation, oldest first.
    pub messages: Vec<Message>,
    /// The tools offered; empty means a plain completion.
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// Sampling temperature asked by the agent (`spec.runtime.temperature`); it wins over the
    /// model's configured one, which applies when this is absent.
    #[serde(default)]
    pub temperature: Option<f64>,
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions from the operator or the agent's manifest.
    System,
    /// The task.
    User,
    /// The model.
    Assistant,
    /// A tool's result, answering one tool call.
    Tool,
}

/// One message of the conversation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Message {
    /// Its author.
    pub role: Role,
    /// The text; an assistant message that only calls tools may have none.
    #[serde(default)]
    pub content: Option<String>,
    /// The calls an assistant message makes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// On a tool message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        Self::text(Role::System, text)
    }

    /// A user message.
    pub fn user(text: impl Into<String>) -> Self {
        Self::text(Role::User, text)
    }

    /// An assistant message with text only.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::text(Role::Assistant, text)
    }

    /// The result of the tool call `call_id`.
    pub fn tool(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: Role::Tool,
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
        }
    }

    fn text(role: Role, text: impl Into<String>) -> Self {
        Self {
            role,
            content: Some(text.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolSpec {
    /// The tool's name (`fs.write`); names OpenAI would refuse are rewritten on the wire and
    /// mapped back in the answer, so the engine always sees this name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: serde_json::Value,
}

/// A call the model asked for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ToolCall {
    /// The provider's id for the call; the tool message answering it carries the same id.
    pub id: String,
    /// The tool's name as given in [`ToolSpec::name`].
    pub name: String,
    /// The arguments as JSON text, exactly as the model produced it (it may not parse).
    pub arguments: String,
}

/// The model's answer to one call.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatResponse {
    /// The assistant message (text, tool calls or both).
    pub message: Message,
    /// Why the model stopped (`stop`, `tool_calls`, `length`, ...), as the provider said it.
    pub finish_reason: Option<String>,
    /// Token counts (zeros when the provider reports none).
    pub usage: Usage,
    /// The model that answered, as the provider names it (the configured name when it does not).
    pub model: String,
    /// The provider's configured name.
    pub provider: String,
    /// How many HTTP attempts it took (1 when the first succeeded).
    pub attempts: u32,
}

/// Token counts of one call.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: u64,
    /// Tokens of the answer.
    pub completion_tokens: u64,
    /// Prompt and completion tokens together.
    pub total_tokens: u64,
}
