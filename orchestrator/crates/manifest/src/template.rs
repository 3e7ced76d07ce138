//! Finding the names a Handlebars template refers to, so a typo in a state name is caught at
//! deploy time rather than rendered as an empty string halfway through a run.
//!
//! This is not a template engine: it only tokenizes `{{ ... }}` expressions far enough to list
//! the path expressions in them (`input.language`, `review.output`, `blackboard.X.output`), and
//! says which of them sit inside an `#each`/`#with` block, where paths are relative to a changed
//! context and cannot be checked.

/// One path expression found in a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRef {
    /// The whole `{{ ... }}` expression it came from, for messages.
    pub expression: String,
    /// Its segments: `review.output.text` -> `["review", "output", "text"]`.
    pub segments: Vec<String>,
    /// True inside an `#each` or `#with` block (the path may be relative to another context).
    pub scoped: bool,
}

/// Every path expression in `text`, in order.
pub fn path_refs(text: &str) -> Vec<PathRef> {
    let mut refs = Vec::new();
    // Open blocks, true for those that change the context (each, with).
    let mut blocks: Vec<bool> = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let escaped = rest[..start].ends_with('\\');
        let after = &rest[start..];
        let (close, open_len) = if after.starts_with("{{{") {
            ("}}}", 3)
        } else if after.starts_with("{{!--") {
            ("--}}", 5)
        } else {
            ("}}", 2)
        };
        let Some(end) = after[open_len..].find(close) else {
            break;
        };
        let expression = &after[..open_len + end + close.len()];
        let inner = &after[open_len..open_len + end];
        rest = &after[open_len + end + close.len()..];
        if escaped || open_len == 5 {
            continue;
        }
        let inner = inner.trim_start_matches('~').trim_end_matches('~').trim();
        let scoped = blocks.iter().any(|changes| *changes);
        let (kind, body) = match inner.chars().next() {
            Some(c @ ('#' | '/' | '^' | '!' | '>' | '&')) => (Some(c), inner[1..].trim()),
            _ => (None, inner),
        };
        let tokens = tokenize(body);
        let paths: &[String] = match kind {
            Some('!') | Some('>') => continue,
            Some('/') => {
                blocks.pop();
                continue;
            }
            Some('#') => {
                let helper = tokens.first().map(String::as_str).unwrap_or_default();
                blocks.push(matches!(helper, "each" | "with"));
                tokens.get(1..).unwrap_or_default()
            }
            Some('^') => tokens.get(1..).unwrap_or_default(),
            _ if tokens.len() == 1 => &tokens,
            // `{{helper arg1 arg2}}`: the helper's name is not a path.
            _ => tokens.get(1..).unwrap_or_default(),
        };
        for token in paths {
            if let Some(segments) = path_segments(token) {
                refs.push(PathRef {
                    expression: expression.to_owned(),
                    segments,
                    scoped,
                });
            }
        }
    }
    refs
}

/// Splits an expression body into tokens: words, quoted strings, with `(`, `)` and hash
/// arguments (`key=value` keeps only `value`) taken apart.
fn tokenize(body: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut current = String::new();
    let mut quote: Option<char> = None;
    let mut bracket = false;
    // The first word of a subexpression `(helper arg)` names a helper, not a path.
    let mut helper_next = false;
    let flush = |current: &mut String, tokens: &mut Vec<String>, helper_next: &mut bool| {
        if !current.is_empty() {
            let token = std::mem::take(current);
            if !std::mem::take(helper_next) {
                tokens.push(token);
            }
        }
    };
    for c in body.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => {
                current.push(c);
                quote = None;
                flush(&mut current, &mut tokens, &mut helper_next);
            }
            (Some(_), c) => current.push(c),
            (None, '"' | '\'') if current.is_empty() => {
                quote = Some(c);
                current.push(c);
            }
            (None, '[') => {
                bracket = true;
                current.push(c);
            }
            (None, ']') => {
                bracket = false;
                current.push(c);
            }
            (None, c) if bracket => current.push(c),
            (None, '(') => {
                flush(&mut current, &mut tokens, &mut helper_next);
                helper_next = true;
            }
            (None, c) if c.is_whitespace() || c == ')' => {
                flush(&mut current, &mut tokens, &mut helper_next)
            }
            (None, '=') => current.clear(),
            (None, c) => current.push(c),
        }
    }
    flush(&mut current, &mut tokens, &mut helper_next);
    tokens
}

/// The segments of a path token, or `None` for literals (strings, numbers, booleans).
fn path_segments(token: &str) -> Option<Vec<String>> {
    let first = token.chars().next()?;
    if first == '"' || first == '\'' || first.is_ascii_digit() || first == '-' {
        return None;
    }
    if matches!(
        token,
        "true" | "false" | "null" | "undefined" | "else" | "as"
    ) || token.starts_with('|')
    {
        return None;
    }
    let mut segments = Vec::new();
    let mut current = String::new();
    let mut bracket = false;
    for c in token.chars() {
        match c {
            '[' if !bracket => bracket = true,
            ']' if bracket => bracket = false,
            '.' | '/' if !bracket => {
                if !current.is_empty() {
                    segments.push(std::mem::take(&mut current));
                } else if c == '.' {
                    // `../` and `./` parents
                    current.push('.');
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        segments.push(current);
    }
    (!segments.is_empty()).then_some(segments)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(text: &str) -> Vec<(Vec<String>, bool)> {
        path_refs(text)
            .into_iter()
            .map(|r| (r.segments, r.scoped))
            .collect()
    }

    fn p(segments: &[&str]) -> (Vec<String>, bool) {
        (segments.iter().map(|s| s.to_string()).collect(), false)
    }

    #[test]
    fn finds_paths_in_plain_helper_and_block_expressions() {
        assert_eq!(
            paths("Review {{ review.output }} and {{{input.inputs_json}}} for {{intent}}"),
            vec![
                p(&["review", "output"]),
                p(&["input", "inputs_json"]),
                p(&["intent"])
            ]
        );
        assert_eq!(
            paths("{{keys blackboard.WRITE.output}}"),
            vec![p(&["blackboard", "WRITE", "output"])]
        );
        assert_eq!(
            paths("{{#if intent}}Task: {{intent}}{{else}}none{{/if}} {{json (lookup states.a \"x\")}}"),
            vec![p(&["intent"]), p(&["intent"]), p(&["states", "a"])]
        );
        assert_eq!(
            paths("{{~state.feedback~}}"),
            vec![p(&["state", "feedback"])]
        );
        assert_eq!(
            paths("{{eq input.mode 'fast' 3 true}}"),
            vec![p(&["input", "mode"])]
        );
        assert_eq!(
            paths("{{log level=input.level}}"),
            vec![p(&["input", "level"])]
        );
    }

    #[test]
    fn skips_comments_escapes_partials_and_marks_scoped_paths() {
        assert!(paths("{{! REVIEW.output }} {{!-- x.y --}} \\{{NOT.this}} {{> part}}").is_empty());
        assert_eq!(
            paths("{{#each input.items}}{{name.first}}{{/each}}{{done.output}}"),
            vec![
                p(&["input", "items"]),
                (vec!["name".into(), "first".into()], true),
                p(&["done", "output"]),
            ]
        );
        assert_eq!(
            paths("{{this.x}} {{@index}}"),
            vec![p(&["this", "x"]), p(&["@index"])]
        );
        assert_eq!(paths("unclosed {{ a.b"), vec![]);
    }
}
