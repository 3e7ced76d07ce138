//! What an external tool's answer becomes before anyone reads it: bounded, text only.
//!
//! An MCP result (`content` blocks, optional `structuredContent`, `isError`) comes from a server
//! we do not control and goes to a model's context or a caller. It is cut to the server's
//! `max_result_bytes`: the structured content is kept whole when it fits (else left out), text
//! blocks are kept in order until the budget is spent (the last one cut at a character
//! boundary), and binary blocks (images, audio, blobs) are described, never passed on.
//! `truncated` says whether anything was cut or left out.

use serde_json::{json, Map, Value};

/// Bytes of an error result's text kept in the error message.
const ERROR_TEXT_MAX: usize = 4096;

/// A result, shaped.
#[derive(Debug, Clone, PartialEq)]
pub struct Shaped {
    /// The server said the tool failed (`isError: true`).
    pub is_error: bool,
    /// `{content, structuredContent?, truncated}` within the budget.
    pub output: Value,
    /// The text of the result's text blocks, at most a few KiB (for error messages).
    pub text: String,
}

/// Shapes `result` (an MCP `CallToolResult` as JSON) within `max` bytes.
pub fn shape(result: &Value, max: usize) -> Shaped {
    let mut budget = max;
    let mut truncated = false;
    let mut output = Map::new();

    if let Some(structured) = result.get("structuredContent") {
        let size = aegis_core::arguments::serialized_len(structured);
        if size <= budget {
            budget -= size;
            output.insert("structuredContent".to_owned(), structured.clone());
        } else {
            truncated = true;
            output.insert("structuredContentBytes".to_owned(), json!(size));
        }
    }

    let mut content = Vec::new();
    let mut text = String::new();
    let blocks = result
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut omitted = 0usize;
    for block in blocks {
        if budget == 0 {
            omitted += 1;
            truncated = true;
            continue;
        }
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "text" => {
                let full = block.get("text").and_then(Value::as_str).unwrap_or("");
                if text.len() < ERROR_TEXT_MAX {
                    text.push_str(cut(full, ERROR_TEXT_MAX - text.len()));
                }
                let kept = cut(full, budget);
                budget -= kept.len();
                if kept.len() < full.len() {
                    // Nothing after a cut block is passed on.
                    truncated = true;
                    budget = 0;
                }
                content.push(json!({"type": "text", "text": kept}));
            }
            "resource" => {
                let resource = block.get("resource").cloned().unwrap_or(Value::Null);
                let uri = resource.get("uri").cloned().unwrap_or(Value::Null);
                match resource.get("text").and_then(Value::as_str) {
                    Some(full) => {
                        let kept = cut(full, budget);
                        budget -= kept.len();
                        if kept.len() < full.len() {
                            truncated = true;
                            budget = 0;
                        }
                        content.push(json!({"type": "resource", "resource": {
                            "uri": uri, "mimeType": resource.get("mimeType"), "text": kept}}));
                    }
                    None => content.push(binary("resource", &resource, "blob")),
                }
            }
            "image" | "audio" => content.push(binary(kind, block, "data")),
            _ => {
                // resource_link and whatever a later revision adds: small metadata, kept whole
                // when it fits.
                let size = aegis_core::arguments::serialized_len(block);
                if size <= budget {
                    budget -= size;
                    content.push(block.clone());
                } else {
                    omitted += 1;
                    truncated = true;
                }
            }
        }
    }
    output.insert("content".to_owned(), Value::Array(content));
    if omitted > 0 {
        output.insert("omittedBlocks".to_owned(), json!(omitted));
    }
    output.insert("truncated".to_owned(), Value::Bool(truncated));
    Shaped {
        is_error: result.get("isError").and_then(Value::as_bool) == Some(true),
        output: Value::Object(output),
        text,
    }
}

/// A binary block described by its type, media type and size; its bytes are not passed on.
fn binary(kind: &str, block: &Value, field: &str) -> Value {
    let size = block.get(field).and_then(Value::as_str).map_or(0, str::len);
    json!({"type": kind, "mimeType": block.get("mimeType"), "omitted": true,
           "base64Bytes": size, "note": "binary content is not passed on"})
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub(crate) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_cut_to_the_budget_and_flagged() {
        let small = json!({"content": [{"type": "text", "text": "3"}], "structuredContent": {"result": "3"}});
        let shaped = shape(&small, 1024);
        assert!(!shaped.is_error);
        assert_eq!(
            shaped.output,
            json!({"structuredContent": {"result": "3"}, "content": [{"type": "text", "text": "3"}], "truncated": false})
        );

        let long = "é".repeat(100); // 200 bytes
        let big = json!({"content": [{"type": "text", "text": long}, {"type": "text", "text": "more"}],
                         "structuredContent": {"result": long}});
        let shaped = shape(&big, 101);
        assert_eq!(shaped.output["truncated"], true);
        assert!(shaped.output.get("structuredContent").is_none());
        assert_eq!(
            shaped.output["content"][0]["text"].as_str().unwrap().len(),
            100
        );
        assert_eq!(shaped.output["omittedBlocks"], 1);

        let image = json!({"content": [{"type": "image", "mimeType": "image/png", "data": "AAAA"}], "isError": true});
        let shaped = shape(&image, 1024);
        assert!(shaped.is_error);
        assert_eq!(shaped.output["content"][0]["omitted"], true);
        assert!(shaped.output["content"][0].get("data").is_none());
    }
}
