//! What an MCP client sees of a `code.run` result: a text a model reads (the code's stdout and
//! stderr, each rich result's text, the error with its traceback) and each plot as MCP image
//! content (`{"type": "image", "data": <base64>, "mimeType": "image/png"}`), beside the whole
//! result as `structuredContent`. Other tools' results are left as the router shaped them.

use serde_json::{json, Value};

use crate::tools::TEXT_COPY_MAX_BYTES;

/// The image formats of a code interpreter result MCP carries as image content.
const IMAGE_FORMATS: &[(&str, &str)] = &[("png", "image/png"), ("jpeg", "image/jpeg")];

/// `mcp` (the router's MCP result of a call of `tool`) with a `code.run` result's text and
/// images as content.
pub(super) fn with_images(tool: &str, mut mcp: Value) -> Value {
    if tool != "code.run" || mcp["isError"] != false {
        return mcp;
    }
    let result = &mcp["structuredContent"];
    let mut content = vec![json!({"type": "text", "text": readable(result)})];
    for item in result["results"].as_array().into_iter().flatten() {
        for (format, mime) in IMAGE_FORMATS {
            if let Some(data) = item[*format].as_str() {
                content.push(json!({"type": "image", "data": data, "mimeType": mime}));
            }
        }
    }
    mcp["content"] = Value::Array(content);
    mcp
}

/// The result as a model reads it, within the text copy's bound (the rest is said to be in
/// `structuredContent`).
fn readable(result: &Value) -> String {
    let mut text = String::new();
    let mut section = |name: &str, body: &str| {
        if !body.is_empty() {
            text.push_str(&format!("[{name}]\n{body}"));
            if !body.ends_with('\n') {
                text.push('\n');
            }
        }
    };
    section("stdout", result["stdout"].as_str().unwrap_or(""));
    section("stderr", result["stderr"].as_str().unwrap_or(""));
    for item in result["results"].as_array().into_iter().flatten() {
        let shown = ["text", "markdown"]
            .iter()
            .find_map(|k| item[*k].as_str())
            .unwrap_or("");
        let images: Vec<&str> = IMAGE_FORMATS
            .iter()
            .map(|(f, _)| *f)
            .chain(["svg"])
            .filter(|f| item.get(*f).is_some())
            .collect();
        let mut body = shown.to_owned();
        if !images.is_empty() {
            body.push_str(&format!(" ({} image attached)", images.join(", ")));
        }
        section("result", &body);
    }
    if let Some(error) = result["error"].as_object() {
        let name = error.get("name").and_then(Value::as_str).unwrap_or("");
        let value = error.get("value").and_then(Value::as_str).unwrap_or("");
        let traceback = error.get("traceback").and_then(Value::as_str).unwrap_or("");
        section("error", &format!("{name}: {value}\n{traceback}"));
    }
    if result["truncated"] == true {
        section("truncated", result["notice"].as_str().unwrap_or(""));
    }
    if text.is_empty() {
        text.push_str("(no output)\n");
    }
    if text.len() > TEXT_COPY_MAX_BYTES {
        let mut cut = TEXT_COPY_MAX_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("\n[the rest is in structuredContent]");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plot_is_image_content_beside_the_text() {
        let mcp = json!({"content": [{"type": "text", "text": "{...}"}], "isError": false,
            "structuredContent": {"stdout": "hi\n", "stderr": "", "error": null, "truncated": false,
                "results": [{"text": "<Figure>", "png": "iVBORw0K"}, {"text": "2", "is_main_result": true}]}});
        let out = with_images("code.run", mcp);
        let content = out["content"].as_array().expect("content");
        assert_eq!(content.len(), 2);
        assert_eq!(
            content[1],
            json!({"type": "image", "data": "iVBORw0K", "mimeType": "image/png"})
        );
        let text = content[0]["text"].as_str().expect("text");
        assert!(
            text.contains("[stdout]\nhi\n") && text.contains("<Figure> (png image attached)"),
            "{text}"
        );
        assert!(text.contains("[result]\n2\n"), "{text}");
    }

    #[test]
    fn other_tools_and_errors_are_left_alone() {
        let mcp = json!({"content": [{"type": "text", "text": "x"}], "isError": false, "structuredContent": {}});
        assert_eq!(with_images("cmd.run", mcp.clone()), mcp);
        let failed = json!({"content": [{"type": "text", "text": "error"}], "isError": true});
        assert_eq!(with_images("code.run", failed.clone()), failed);
    }
}
