//! The one template engine of the service: Handlebars, for workflow states and agent prompts.
//!
//! Workflow manifests (`{{STATE.output}}`, `{{workflow.input.x}}`, `{{intent}}`, `#if`, helpers)
//! and agent `prompt_template`s render through the same registry, so a template means the same
//! thing wherever it is written. Output is plain text, never HTML-escaped (templates build
//! prompts and commands, not web pages). A missing path renders as an empty string, as in
//! Handlebars.js; a template that does not parse is an error that names the problem.
//!
//! Helpers (those of the AEGIS worker): `length`, `upper`, `lower`, `trim`, `json`, `first_line`,
//! `default`, plus `text` (a string as is, anything else as JSON) and `code` (the body of the
//! first Markdown code fence of a model's answer, or the whole answer when it has none).

use std::sync::LazyLock;

use handlebars::{handlebars_helper, Handlebars};
use serde_json::Value;

/// Why a template could not be rendered.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[error("template error: {0}")]
pub struct RenderError(pub String);

/// A value as text: strings as they are, null as nothing, anything else as JSON.
pub fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

handlebars_helper!(length: |v: Json| match v {
    Value::Array(a) => a.len(),
    Value::Object(o) => o.len(),
    Value::String(s) => s.chars().count(),
    _ => 0,
});
/// The body of the first Markdown code fence (```lang ... ```) in `answer`, or `answer` itself
/// trimmed when it has none: models wrap code and manifests in fences even when told not to.
pub fn fenced_block(answer: &str) -> &str {
    let Some(start) = answer.find("```") else {
        return answer.trim();
    };
    let after = &answer[start + 3..];
    // The rest of the opening line is the language tag.
    let body = after.find('\n').map(|i| &after[i + 1..]).unwrap_or("");
    match body.find("```") {
        Some(end) => body[..end].trim_end(),
        None => body.trim_end(),
    }
}

handlebars_helper!(code: |v: Json| fenced_block(&text_of(v)).to_owned());
handlebars_helper!(upper: |v: Json| text_of(v).to_uppercase());
handlebars_helper!(lower: |v: Json| text_of(v).to_lowercase());
handlebars_helper!(trim: |v: Json| text_of(v).trim().to_owned());
handlebars_helper!(json: |v: Json| v.to_string());
handlebars_helper!(text: |v: Json| text_of(v));
handlebars_helper!(first_line: |v: Json| text_of(v).lines().next().unwrap_or_default().to_owned());
handlebars_helper!(default: |v: Json, fallback: Json| {
    let empty = match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        _ => false,
    };
    if empty { fallback.clone() } else { v.clone() }
});

static ENGINE: LazyLock<Handlebars<'static>> = LazyLock::new(|| {
    let mut h = Handlebars::new();
    h.register_escape_fn(handlebars::no_escape);
    h.register_helper("length", Box::new(length));
    h.register_helper("upper", Box::new(upper));
    h.register_helper("code", Box::new(code));
    h.register_helper("lower", Box::new(lower));
    h.register_helper("trim", Box::new(trim));
    h.register_helper("json", Box::new(json));
    h.register_helper("text", Box::new(text));
    h.register_helper("first_line", Box::new(first_line));
    h.register_helper("default", Box::new(default));
    h
});

/// Renders `template` against `context`.
pub fn render(template: &str, context: &Value) -> Result<String, RenderError> {
    if !template.contains("{{") {
        return Ok(template.to_owned());
    }
    ENGINE
        .render_template(template, context)
        .map_err(|e| RenderError(e.to_string()))
}

/// Handlebars truthiness of `expression` (the `custom` transition condition): renders
/// `{{#if EXPR}}true{{/if}}`; a template error counts as false, as in AEGIS.
pub fn truthy(expression: &str, context: &Value) -> bool {
    let inner = expression
        .trim()
        .trim_start_matches("{{")
        .trim_end_matches("}}")
        .trim();
    render(&format!("{{{{#if {inner}}}}}true{{{{/if}}}}"), context)
        .map(|s| s == "true")
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_takes_the_first_fence_body_or_the_whole_answer() {
        assert_eq!(fenced_block("print(1)\n"), "print(1)");
        assert_eq!(
            fenced_block("Here:\n```python\nprint(1)\nprint(2)\n```\nDone."),
            "print(1)\nprint(2)"
        );
        assert_eq!(fenced_block("```\necho hi\n"), "echo hi");
        let ctx = serde_json::json!({"A": {"output": "```bash\necho hi\n```"}});
        assert_eq!(render("{{code A.output}}", &ctx).unwrap(), "echo hi");
    }
    use serde_json::json;

    #[test]
    fn paths_helpers_and_blocks_render() {
        let ctx = json!({"A": {"output": "Hello\nworld", "n": [1, 2, 3], "obj": {"k": 1}},
                         "workflow": {"input": {"lang": "rust"}}, "intent": "do it", "empty": ""});
        assert_eq!(
            render(
                "{{first_line A.output}}|{{upper workflow.input.lang}}|{{length A.n}}|{{intent}}",
                &ctx
            )
            .unwrap(),
            "Hello|RUST|3|do it"
        );
        assert_eq!(render("{{json A.obj}}", &ctx).unwrap(), "{\"k\":1}");
        assert_eq!(
            render("{{default empty \"none\"}} {{default missing \"x\"}}", &ctx).unwrap(),
            "none x"
        );
        assert_eq!(
            render(
                "{{#if A.n}}yes{{else}}no{{/if}}{{#if missing}}!{{/if}}",
                &ctx
            )
            .unwrap(),
            "yes"
        );
        assert_eq!(render("<&>{{trim \"  a \"}}", &ctx).unwrap(), "<&>a");
        assert_eq!(render("{{missing.path}}", &ctx).unwrap(), "");
        assert!(render("{{#if}}", &ctx).is_err());
        assert!(truthy("A.obj.k", &ctx));
        assert!(truthy("{{A.obj}}", &ctx));
        assert!(!truthy("A.nothing", &ctx));
        assert!(!truthy("#broken", &ctx));
    }
}
