//! The OpenAI chat-completions JSON: building the request body and reading the answer.
//!
//! OpenAI, Ollama's `/v1`, vLLM and llama.cpp's server all speak this shape, with small
//! differences this module absorbs: `content` may be null or missing, `tool_calls` may be absent
//! or null, `arguments` is usually JSON text but some servers send an object, ids may be missing,
//! and `usage` may be absent. Answers are read leniently as `serde_json::Value` for that reason.
//!
//! OpenAI only accepts function names matching `^[a-zA-Z0-9_-]{1,64}$`, and our tools are named
//! like `fs.write`; [`ToolNames`] rewrites such names on the way out and maps them back in the
//! answer, so the rest of the service only ever sees the catalog's names.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::config::ModelRef;
use super::types::{ChatRequest, Message, Role, ToolCall, Usage};

/// The part of an answer the client passes on.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub message: Message,
    pub finish_reason: Option<String>,
    pub usage: Usage,
    pub model: Option<String>,
}

/// The longest function name OpenAI accepts.
const MAX_NAME: usize = 64;

/// A two-way map between our tool names and names every provider accepts.
#[derive(Debug, Default)]
pub(crate) struct ToolNames {
    to_wire: HashMap<String, String>,
    from_wire: HashMap<String, String>,
}

impl ToolNames {
    /// Maps the names of the offered tools and of the calls already in the conversation.
    /// Names that are already acceptable keep themselves; the others get a sanitized name that
    /// collides with nothing (suffix `_2`, `_3`, ... when needed).
    pub fn for_request(request: &ChatRequest) -> Self {
        let mut names: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
        for m in &request.messages {
            names.extend(m.tool_calls.iter().map(|c| c.name.as_str()));
        }
        let mut map = Self::default();
        for &n in names.iter().filter(|n| is_acceptable(n)) {
            map.insert(n, n.to_owned());
        }
        for &n in names.iter().filter(|n| !is_acceptable(n)) {
            if map.to_wire.contains_key(n) {
                continue;
            }
            let base = sanitize(n);
            let mut candidate = base.clone();
            let mut k = 2;
            while map.from_wire.contains_key(&candidate) {
                let suffix = format!("_{k}");
                let keep = base.len().min(MAX_NAME - suffix.len());
                candidate = format!("{}{suffix}", &base[..keep]);
                k += 1;
            }
            map.insert(n, candidate);
        }
        map
    }

    fn insert(&mut self, ours: &str, wire: String) {
        self.from_wire.insert(wire.clone(), ours.to_owned());
        self.to_wire.insert(ours.to_owned(), wire);
    }

    fn wire<'a>(&'a self, ours: &'a str) -> &'a str {
        self.to_wire.get(ours).map_or(ours, String::as_str)
    }

    fn ours(&self, wire: &str) -> String {
        self.from_wire
            .get(wire)
            .cloned()
            .unwrap_or_else(|| wire.to_owned())
    }
}

fn is_acceptable(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Every other character becomes `_`; at most 64 (ASCII) characters.
fn sanitize(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(MAX_NAME)
        .collect();
    if s.is_empty() {
        s.push('_');
    }
    s
}

/// The body of `POST {base_url}/chat/completions`.
pub(crate) fn encode(model: &ModelRef, request: &ChatRequest, names: &ToolNames) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(model.model));
    body.insert(
        "messages".into(),
        request
            .messages
            .iter()
            .map(|m| encode_message(m, names))
            .collect(),
    );
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": names.wire(&t.name),
                        "description": t.description,
                        "parameters": t.parameters,
                    }
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        body.insert("tool_choice".into(), json!("auto"));
    }
    if let Some(t) = request.temperature.or(model.temperature) {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(n) = model.max_tokens {
        body.insert("max_tokens".into(), json!(n));
    }
    Value::Object(body)
}

fn encode_message(m: &Message, names: &ToolNames) -> Value {
    let text = || Value::String(m.content.clone().unwrap_or_default());
    match m.role {
        Role::System => json!({"role": "system", "content": text()}),
        Role::User => json!({"role": "user", "content": text()}),
        Role::Tool => json!({
            "role": "tool",
            "tool_call_id": m.tool_call_id.clone().unwrap_or_default(),
            "content": text(),
        }),
        Role::Assistant => {
            let mut o = Map::new();
            o.insert("role".into(), json!("assistant"));
            // Null content is how OpenAI spells "only tool calls"; a message with neither
            // gets an empty string, which every server accepts.
            let content = match (&m.content, m.tool_calls.is_empty()) {
                (Some(c), _) => json!(c),
                (None, false) => Value::Null,
                (None, true) => json!(""),
            };
            o.insert("content".into(), content);
            if !m.tool_calls.is_empty() {
                let calls: Vec<Value> = m
                    .tool_calls
                    .iter()
                    .map(|c| {
                        json!({
                            "id": c.id,
                            "type": "function",
                            "function": {"name": names.wire(&c.name), "arguments": c.arguments},
                        })
                    })
                    .collect();
                o.insert("tool_calls".into(), Value::Array(calls));
            }
            Value::Object(o)
        }
    }
}

/// Reads a 2xx answer. The error says what is missing, never quotes the body.
pub(crate) fn decode(body: &[u8], names: &ToolNames) -> Result<Decoded, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        let what = err
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| err.to_string(), str::to_owned);
        return Err(format!("an error in a success answer: {what}"));
    }
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or("no `choices[0]`")?;
    let msg = choice
        .get("message")
        .filter(|m| m.is_object())
        .ok_or("no `choices[0].message`")?;
    let content = match msg.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        // Content parts (`[{"type":"text","text":...}]`): keep the text.
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
        ),
        Some(_) => return Err("`choices[0].message.content` is neither text nor null".into()),
    };
    let mut tool_calls = Vec::new();
    match msg.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(calls)) => {
            for (i, c) in calls.iter().enumerate() {
                tool_calls.push(decode_call(i, c, names)?);
            }
        }
        Some(_) => return Err("`choices[0].message.tool_calls` is not a list".into()),
    }
    let finish_reason = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let usage = decode_usage(v.get("usage"));
    let model = v.get("model").and_then(Value::as_str).map(str::to_owned);
    Ok(Decoded {
        message: Message {
            role: Role::Assistant,
            content,
            tool_calls,
            tool_call_id: None,
        },
        finish_reason,
        usage,
        model,
    })
}

fn decode_call(i: usize, c: &Value, names: &ToolNames) -> Result<ToolCall, String> {
    let f = c
        .get("function")
        .ok_or_else(|| format!("`tool_calls[{i}]` has no `function`"))?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| format!("`tool_calls[{i}].function` has no `name`"))?;
    let arguments = match f.get("arguments") {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    let id = c
        .get("id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map_or_else(|| format!("call_{}", i + 1), str::to_owned);
    Ok(ToolCall {
        id,
        name: names.ours(name),
        arguments,
    })
}

fn decode_usage(u: Option<&Value>) -> Usage {
    let n = |k: &str| u.and_then(|u| u.get(k)).and_then(Value::as_u64);
    let prompt_tokens = n("prompt_tokens").unwrap_or(0);
    let completion_tokens = n("completion_tokens").unwrap_or(0);
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: n("total_tokens").unwrap_or(prompt_tokens + completion_tokens),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ToolSpec;

    fn spec(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: json!({"type": "object"}),
        }
    }

    #[test]
    fn names_openai_refuses_are_mapped_both_ways() {
        let req = ChatRequest {
            messages: vec![],
            tools: vec![spec("fs.write"), spec("fs_write"), spec("cmd-run")],
            temperature: None,
        };
        let names = ToolNames::for_request(&req);
        assert_eq!(names.wire("fs_write"), "fs_write");
        assert_eq!(names.wire("cmd-run"), "cmd-run");
        let w = names.wire("fs.write").to_owned();
        assert_eq!(w, "fs_write_2");
        assert_eq!(names.ours(&w), "fs.write");
        assert_eq!(names.ours("unknown"), "unknown");
        let long = "a.".repeat(40);
        let req = ChatRequest {
            messages: vec![],
            tools: vec![spec(&long)],
            temperature: None,
        };
        assert_eq!(ToolNames::for_request(&req).wire(&long).len(), 64);
    }

    #[test]
    fn lenient_answers_are_read() {
        let body = json!({
            "choices": [{
                "message": {"role": "assistant", "tool_calls": [
                    {"function": {"name": "x", "arguments": {"a": 1}}}
                ]},
                "finish_reason": null
            }]
        });
        let d = decode(body.to_string().as_bytes(), &ToolNames::default()).expect("decoded");
        assert_eq!(d.message.content, None);
        assert_eq!(d.message.tool_calls[0].id, "call_1");
        assert_eq!(d.message.tool_calls[0].arguments, r#"{"a":1}"#);
        assert_eq!(d.usage, Usage::default());
        assert_eq!(d.model, None);

        let bad = decode(b"{\"choices\": []}", &ToolNames::default()).expect_err("no choice");
        assert!(bad.contains("choices[0]"), "{bad}");
    }
}
