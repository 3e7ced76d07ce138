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
//!
//! Templates that fill a command ([`render_command`]) never become code: while one renders,
//! the registry's escape function (applied by Handlebars to every value an expression or a
//! helper outputs, never to the template's own text) sets each value aside and leaves a marker
//! in its place. The template's text alone is then read as POSIX words ([`CommandText::argv`],
//! each value filling part of one argument, no expansion) or handed to a shell with every
//! value as an environment variable the script only references ([`CommandText::shell`]), so
//! no value is ever parsed as words, quotes or shell syntax. Expressions that would bypass the
//! escape (`{{{x}}}`, `{{&x}}`), partials and decorators are refused in such templates.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::LazyLock;

use handlebars::template::{Template, TemplateElement};
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
    h.register_escape_fn(escape);
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

/// Opens a value's marker in a command template's rendered text (a private-use character that
/// a template's own text may not contain, so only the escape function writes one).
const OPEN: char = '\u{E000}';
/// Closes a value's marker.
const CLOSE: char = '\u{E001}';
/// Prefix of the environment variables that carry a shell command's values.
pub const VALUE_ENV_PREFIX: &str = "AEGIS_VALUE_";

thread_local! {
    /// The values of the command template being rendered on this thread, if one is: set only
    /// for the duration of one synchronous `render_template` call by [`Collecting`].
    static COLLECTED: RefCell<Option<Vec<String>>> = const { RefCell::new(None) };
}

/// The registry's escape function: output is plain text (no HTML escaping) except while a
/// command template renders on this thread, when each non-empty value is set aside and its
/// index is written between [`OPEN`] and [`CLOSE`] instead. An empty value leaves nothing,
/// like a missing one (Handlebars does not call the escape function for a missing value).
fn escape(value: &str) -> String {
    COLLECTED.with(|c| match c.borrow_mut().as_mut() {
        None => value.to_owned(),
        Some(_) if value.is_empty() => String::new(),
        Some(values) => {
            values.push(value.to_owned());
            format!("{OPEN}{}{CLOSE}", values.len() - 1)
        }
    })
}

/// Collects values into the thread-local for as long as it lives (also through a panic).
struct Collecting;

impl Collecting {
    fn start(values: Vec<String>) -> Self {
        COLLECTED.with(|c| *c.borrow_mut() = Some(values));
        Collecting
    }

    fn finish(self) -> Vec<String> {
        COLLECTED
            .with(|c| c.borrow_mut().take())
            .unwrap_or_default()
    }
}

impl Drop for Collecting {
    fn drop(&mut self) {
        COLLECTED.with(|c| *c.borrow_mut() = None);
    }
}

/// A command template rendered with its values kept apart: the template's own text, with a
/// marker where each value goes, and the values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CommandText {
    text: String,
    values: Vec<String>,
}

/// Renders command templates: each part is one template; parts are joined with single spaces
/// (a ContainerRun argv run with `shell: true`).
pub fn render_command<S: AsRef<str>>(
    parts: &[S],
    context: &Value,
) -> Result<CommandText, RenderError> {
    let mut out = CommandText::default();
    for (i, part) in parts.iter().enumerate() {
        let template = part.as_ref();
        check_command_template(template)?;
        if i > 0 {
            out.text.push(' ');
        }
        if !template.contains("{{") {
            out.text.push_str(template);
            continue;
        }
        let collecting = Collecting::start(std::mem::take(&mut out.values));
        let rendered = ENGINE.render_template(template, context);
        out.values = collecting.finish();
        out.text
            .push_str(&rendered.map_err(|e| RenderError(e.to_string()))?);
    }
    Ok(out)
}

/// Refuses what would let a value (or text posing as a marker) past the escape function:
/// `{{{x}}}`, `{{&x}}`, partials, decorators, the marker characters. Checked when a run starts
/// and again when the command renders.
pub fn check_command_template(template: &str) -> Result<(), RenderError> {
    if template.contains([OPEN, CLOSE]) {
        return Err(RenderError(
            "a command template may not contain the characters U+E000 or U+E001".to_owned(),
        ));
    }
    if !template.contains("{{") {
        return Ok(());
    }
    let compiled = Template::compile(template).map_err(|e| RenderError(e.to_string()))?;
    check_elements(&compiled)
}

fn check_elements(template: &Template) -> Result<(), RenderError> {
    for element in &template.elements {
        match element {
            TemplateElement::HtmlExpression(_) => {
                return Err(RenderError(
                    "`{{{...}}}` and `{{&...}}` are not allowed in a command: every value is \
                     passed as data (write `{{...}}`)"
                        .to_owned(),
                ))
            }
            TemplateElement::PartialExpression(_)
            | TemplateElement::PartialBlock(_)
            | TemplateElement::DecoratorExpression(_)
            | TemplateElement::DecoratorBlock(_) => {
                return Err(RenderError(
                    "partials and decorators are not allowed in a command template".to_owned(),
                ))
            }
            TemplateElement::HelperBlock(block) => {
                for inner in [&block.template, &block.inverse].into_iter().flatten() {
                    check_elements(inner)?;
                }
            }
            TemplateElement::RawString(_)
            | TemplateElement::Expression(_)
            | TemplateElement::Comment(_) => {}
            // An element a later Handlebars adds is refused until it is known to escape.
            _ => {
                return Err(RenderError(
                    "this template construct is not allowed in a command".to_owned(),
                ))
            }
        }
    }
    Ok(())
}

impl CommandText {
    /// The values in the order they were rendered.
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// The argv of the command: the template's text split with POSIX word rules (quotes and
    /// backslashes of the template's own text apply; nothing is expanded), then every value
    /// put back into the word it sits in, as it is. A value therefore never adds, removes or
    /// splits an argument and is never interpreted; an empty value outside quotes leaves
    /// nothing (`"{{x}}"` gives an empty argument).
    pub fn argv(&self) -> Result<Vec<String>, RenderError> {
        let words = shell_words::split(&self.text).map_err(|e| {
            RenderError(format!(
                "the command is not a valid list of POSIX words ({e}): check its quotes"
            ))
        })?;
        words.iter().map(|w| self.fill(w)).collect()
    }

    /// The first piece of shell syntax in the template's own text, if any: an operator (`|`,
    /// `&`, `;`, `<`, `>`, parentheses, backquotes) outside quotes, an expansion (`$NAME`,
    /// `${...}`, `$(...)`) outside single quotes, or a first word that only a shell runs (a
    /// builtin such as `exit` or `cd`, a `NAME=value` assignment). Values are never looked at
    /// (they are markers here). A command run without a shell is refused when it has any, since
    /// it would silently do something else than it reads (`a && b` would pass `&&` to `a`).
    pub fn shell_syntax(&self) -> Option<String> {
        const BUILTINS: [&str; 20] = [
            "exit", "cd", "export", "set", "unset", "source", ".", "eval", "exec", "if", "for",
            "while", "until", "case", "alias", "trap", "read", "ulimit", "umask", "[[",
        ];
        let mut chars = self.text.chars().peekable();
        let (mut single, mut double) = (false, false);
        while let Some(c) = chars.next() {
            match c {
                '\\' if !single => {
                    chars.next();
                }
                '\'' if !double => single = !single,
                '"' if !single => double = !double,
                '$' if !single
                    && chars.peek().is_some_and(|n| {
                        n.is_ascii_alphanumeric() || "_{(@*#?!$-".contains(*n)
                    }) =>
                {
                    return Some(format!(
                        "`${}` (an expansion)",
                        chars.peek().copied().unwrap_or_default()
                    ));
                }
                '`' if !single => return Some("`` ` `` (command substitution)".to_owned()),
                '|' | '&' | ';' | '<' | '>' | '(' | ')' if !single && !double => {
                    return Some(format!("`{c}` (an operator)"));
                }
                _ => {}
            }
        }
        let first = shell_words::split(&self.text).ok()?.into_iter().next()?;
        if BUILTINS.contains(&first.as_str()) {
            return Some(format!("`{first}` (a shell builtin)"));
        }
        let assignment = first.split_once('=').is_some_and(|(name, _)| {
            !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        assignment.then(|| format!("`{first}` (a variable assignment)"))
    }

    /// Replaces the markers in `word` by their values.
    fn fill(&self, word: &str) -> Result<String, RenderError> {
        let mut out = String::with_capacity(word.len());
        let mut rest = word;
        while let Some(start) = rest.find(OPEN) {
            out.push_str(&rest[..start]);
            let after = &rest[start + OPEN.len_utf8()..];
            let end = after.find(CLOSE).ok_or_else(|| bad_marker(word))?;
            let value = after[..end]
                .parse::<usize>()
                .ok()
                .and_then(|i| self.values.get(i))
                .ok_or_else(|| bad_marker(word))?;
            out.push_str(value);
            rest = &after[end + CLOSE.len_utf8()..];
        }
        if rest.contains(CLOSE) {
            return Err(bad_marker(word));
        }
        out.push_str(rest);
        Ok(out)
    }

    /// A script for `sh -c` and the environment it needs: the template's text as written, with
    /// each value replaced by a reference to the variable `AEGIS_VALUE_<n>` that holds it
    /// (`"${AEGIS_VALUE_0}"` in plain text and inside `$(...)`, `${AEGIS_VALUE_0}` inside
    /// double quotes, `'"${AEGIS_VALUE_0}"'` inside single quotes). The shell never parses a
    /// value: an expansion's result is not read again for quotes, `;`, `$(...)` or backquotes
    /// in any context, and the quoting chosen from the template's text keeps it one word.
    pub fn shell(&self) -> (String, BTreeMap<String, String>) {
        #[derive(Clone, Copy, PartialEq)]
        enum Ctx {
            Plain,
            Subst(u32),
            Backquote,
            Double,
            Single,
        }
        let mut stack = vec![Ctx::Plain];
        let mut env = BTreeMap::new();
        let mut script = String::with_capacity(self.text.len());
        let mut chars = self.text.chars().peekable();
        while let Some(c) = chars.next() {
            let top = stack.last().copied().unwrap_or(Ctx::Plain);
            if c == OPEN {
                let mut index = String::new();
                for d in chars.by_ref() {
                    if d == CLOSE {
                        break;
                    }
                    index.push(d);
                }
                let name = format!("{VALUE_ENV_PREFIX}{index}");
                if let Some(value) = index.parse::<usize>().ok().and_then(|i| self.values.get(i)) {
                    env.insert(name.clone(), value.clone());
                }
                script.push_str(&match top {
                    Ctx::Double => format!("${{{name}}}"),
                    Ctx::Single => format!("'\"${{{name}}}\"'"),
                    _ => format!("\"${{{name}}}\""),
                });
                continue;
            }
            script.push(c);
            match (top, c) {
                (Ctx::Single, '\'') => {
                    stack.pop();
                }
                (Ctx::Single, _) => {}
                (_, '\\') => {
                    if let Some(next) = chars.next_if(|n| *n != OPEN) {
                        script.push(next);
                    }
                }
                (Ctx::Double, '"') | (Ctx::Backquote, '`') => {
                    stack.pop();
                }
                (Ctx::Plain | Ctx::Subst(_), '\'') => stack.push(Ctx::Single),
                (Ctx::Plain | Ctx::Subst(_) | Ctx::Backquote, '"') => stack.push(Ctx::Double),
                (_, '`') => stack.push(Ctx::Backquote),
                (_, '$') if chars.peek() == Some(&'(') => {
                    chars.next();
                    script.push('(');
                    stack.push(Ctx::Subst(0));
                }
                (Ctx::Subst(depth), '(') => {
                    stack.pop();
                    stack.push(Ctx::Subst(depth + 1));
                }
                (Ctx::Subst(0), ')') => {
                    stack.pop();
                }
                (Ctx::Subst(depth), ')') => {
                    stack.pop();
                    stack.push(Ctx::Subst(depth - 1));
                }
                _ => {}
            }
        }
        (script, env)
    }
}

fn bad_marker(word: &str) -> RenderError {
    RenderError(format!(
        "internal: a value marker in `{}` is malformed",
        word.replace([OPEN, CLOSE], "?")
    ))
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

    const ATTACK: &str = "v1; echo INJ$((6*7)) `echo BT` $(id) 'q' \"d\" \\ {{x}}";

    #[test]
    fn command_values_fill_one_argument_and_are_never_words_or_quotes() {
        let ctx = json!({"input": {"tag": ATTACK, "empty": "", "list": ["a b", "c"]}});
        let argv = |t: &str| {
            render_command(&[t], &ctx)
                .and_then(|c| c.argv())
                .expect("argv")
        };
        assert_eq!(
            argv("echo shipping {{input.tag}}"),
            vec!["echo", "shipping", ATTACK]
        );
        assert_eq!(
            argv("tool --tag={{input.tag}} '{{input.tag}}' \"x {{input.tag}}\""),
            vec![
                "tool".to_owned(),
                format!("--tag={ATTACK}"),
                ATTACK.to_owned(),
                format!("x {ATTACK}")
            ]
        );
        // An empty value leaves nothing unless quoted, like a missing one.
        assert_eq!(
            argv("a {{input.empty}} {{input.none}} \"{{input.empty}}\" b"),
            vec!["a", "", "b"]
        );
        // Block helpers and `each`: every item is a value of its own.
        assert_eq!(
            argv("ls {{#each input.list}}{{this}} {{/each}}{{#if input.tag}}-l{{/if}}"),
            vec!["ls", "a b", "c", "-l"]
        );
        assert_eq!(argv("echo {{upper input.list.[1]}}"), vec!["echo", "C"]);
        // A helper's output is a value too: one argument, never split or read as syntax.
        assert_eq!(
            argv("echo {{upper input.tag}} {{first_line input.tag}}"),
            vec![
                "echo".to_owned(),
                ATTACK.to_uppercase(),
                ATTACK.lines().next().unwrap_or_default().to_owned()
            ]
        );
        // A value holding a template is not rendered again.
        assert_eq!(
            argv("echo {{input.tag}}").last().map(String::as_str),
            Some(ATTACK)
        );
    }

    #[test]
    fn shell_syntax_in_the_template_is_found_and_values_are_not_looked_at() {
        let ctx = json!({"v": "a && b $(c) `d` ; e > f"});
        let syntax = |t: &str| render_command(&[t], &ctx).expect("renders").shell_syntax();
        for t in [
            "a && b",
            "sleep 1; echo x",
            "echo $HOME",
            "echo \"${X}\"",
            "echo `id`",
            "cat < f",
            "exit 1",
            "cd /tmp",
            "FOO=1 env",
            "echo \"$(id)\"",
        ] {
            assert!(syntax(t).is_some(), "{t}");
        }
        for t in [
            "echo {{v}}",
            "echo '{{v}}' '&&' '$HOME' \\; a\\|b",
            "curl https://x.test/?a=b",
            "echo \"price: 5 $\" 'x;y'",
            "printf %s=%s a b",
        ] {
            assert_eq!(syntax(t), None, "{t}");
        }
    }

    #[test]
    fn command_templates_refuse_what_bypasses_the_escape() {
        let ctx = json!({"x": "a;b"});
        for t in [
            "echo {{{x}}}",
            "echo {{&x}}",
            "echo {{> p}}",
            "{{#if x}}{{{x}}}{{/if}}",
        ] {
            assert!(render_command(&[t], &ctx).is_err(), "{t}");
        }
        assert!(render_command(&["echo \u{E000}0\u{E001}"], &ctx).is_err());
        assert!(render_command(&["echo 'open"], &ctx)
            .expect("renders")
            .argv()
            .is_err());
        // Elsewhere the registry still renders plain text, triple-stash included.
        assert_eq!(render("{{{x}}} {{x}}", &ctx).expect("plain"), "a;b a;b");
    }

    #[test]
    fn shell_scripts_reference_values_instead_of_containing_them() {
        let ctx = json!({"t": ATTACK});
        let (script, env) = render_command(
            &[
                "echo",
                "{{t}}",
                "\"in $(echo {{t}}) {{t}}\"",
                "'{{t}}'",
                "`echo {{t}}`",
            ],
            &ctx,
        )
        .expect("renders")
        .shell();
        assert_eq!(
            script,
            "echo \"${AEGIS_VALUE_0}\" \"in $(echo \"${AEGIS_VALUE_1}\") ${AEGIS_VALUE_2}\" \
             ''\"${AEGIS_VALUE_3}\"'' `echo \"${AEGIS_VALUE_4}\"`"
        );
        assert_eq!(env.len(), 5);
        assert!(env.values().all(|v| v == ATTACK));
        assert!(!script.contains("INJ"));
    }

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
