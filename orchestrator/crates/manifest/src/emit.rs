//! A JSON value back to YAML text, for export.
//!
//! Export must round-trip: loading the text again gives an equal value. So the emitter is written
//! against our own loader's rules rather than a general YAML library's: a string is left plain
//! only when [`resolve_plain`] would read it back as the same string (and a YAML 1.1 reader would
//! not take it for a boolean either), multi-line strings become literal blocks only when nothing
//! in them is ambiguous, and everything else is double-quoted with JSON-compatible escapes.
//! Output is block style with two-space indentation, keys in the value's order.

use serde_json::Value;

use super::yaml::resolve_plain;

/// Renders a value as one YAML document.
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => write_entries(&mut out, map, 0, false),
        Value::Array(items) if !items.is_empty() => write_items(&mut out, items, 0, false),
        scalar => {
            write_inline(&mut out, scalar, 0);
            out.push('\n');
        }
    }
    out
}

/// Keys written first, in this order, wherever they appear: the identity of a manifest and the
/// tag of a tagged object (`kind: System`, `condition: always`) read best before the rest.
const LEAD_KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "spec",
    "name",
    "type",
    "condition",
];

/// The entries of a map with [`LEAD_KEYS`] first, then the others in the map's order.
fn ordered(map: &serde_json::Map<String, Value>) -> Vec<(&String, &Value)> {
    let lead = |key: &str| LEAD_KEYS.iter().position(|k| *k == key);
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    // Stable: keys outside LEAD_KEYS keep their relative order.
    entries.sort_by_key(|(key, _)| lead(key).unwrap_or(LEAD_KEYS.len()));
    entries
}

/// Writes `key: value` lines at `indent`; when `inline_first`, the cursor already sits at
/// `indent` (after a `- `) and the first key is written without indentation.
fn write_entries(
    out: &mut String,
    map: &serde_json::Map<String, Value>,
    indent: usize,
    inline_first: bool,
) {
    for (i, (key, value)) in ordered(map).into_iter().enumerate() {
        if i > 0 || !inline_first {
            push_indent(out, indent);
        }
        write_string(out, key, indent, true);
        out.push(':');
        write_value(out, value, indent, false);
    }
}

/// Writes `- item` lines at `indent`, with the same `inline_first` convention.
fn write_items(out: &mut String, items: &[Value], indent: usize, inline_first: bool) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 || !inline_first {
            push_indent(out, indent);
        }
        out.push('-');
        write_value(out, item, indent, true);
    }
}

/// Writes the value after a `-` or a key's `:` at `indent`: a scalar on the same line; a
/// non-empty collection two columns deeper, starting on the same line after a `-`
/// (`inline_first`) and on the next one after a key.
fn write_value(out: &mut String, value: &Value, indent: usize, inline_first: bool) {
    let lead = if inline_first { ' ' } else { '\n' };
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push(lead);
            write_entries(out, map, indent + 2, inline_first);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push(lead);
            write_items(out, items, indent + 2, inline_first);
        }
        scalar => {
            out.push(' ');
            write_inline(out, scalar, indent);
            out.push('\n');
        }
    }
}

/// Writes a scalar or an empty collection on the current line.
fn write_inline(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let text = n.to_string();
            // serde_json prints whole floats as `1.0` and huge ones as `1e300`; both read back
            // as floats. Make sure a float never prints like an integer.
            if n.is_f64() && !text.contains(['.', 'e', 'E']) {
                out.push_str(&text);
                out.push_str(".0");
            } else {
                out.push_str(&text);
            }
        }
        Value::String(s) => write_string(out, s, indent, false),
        Value::Array(_) => out.push_str("[]"),
        Value::Object(_) => out.push_str("{}"),
    }
}

fn push_indent(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

/// Writes a string as a plain scalar, a literal block (values only) or a double-quoted scalar.
fn write_string(out: &mut String, s: &str, indent: usize, is_key: bool) {
    if is_plain_safe(s) {
        out.push_str(s);
    } else if !is_key && is_literal_safe(s) {
        write_literal(out, s, indent);
    } else {
        write_quoted(out, s);
    }
}

/// Words that YAML 1.1 readers (PyYAML, older tools) take for booleans or null; we read them as
/// strings, but an exported manifest should mean the same thing to every reader.
const YAML11_WORDS: &[&str] = &["y", "yes", "n", "no", "on", "off", "=", "<<"];

fn is_plain_safe(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if !(first.is_ascii_alphanumeric() || first == '_' || first == '/' || first == '.') {
        return false;
    }
    if s.ends_with([' ', ':']) || s.contains(": ") || s.contains(" #") {
        return false;
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_-./@+=,:() ".contains(c);
    if !s.chars().all(allowed) {
        return false;
    }
    if YAML11_WORDS.contains(&s.to_ascii_lowercase().as_str()) {
        return false;
    }
    // Anything that would resolve to null, a boolean or a number must be quoted; so must text
    // that looks numeric to YAML 1.1 readers (`1_000`, `12:30`, `0b1`).
    if s.starts_with(|c: char| c.is_ascii_digit() || c == '.') && s.contains(['_', ':']) {
        return false;
    }
    matches!(resolve_plain(s), Ok(Value::String(ref back)) if back == s)
}

fn is_literal_safe(s: &str) -> bool {
    s.contains('\n')
        && !s.starts_with([' ', '\t', '\n'])
        && s.chars()
            .all(|c| c == '\n' || c == '\t' || !needs_escape(c))
        && s.trim_end_matches('\n')
            .split('\n')
            .all(|line| line.is_empty() || !line.trim().is_empty())
}

fn write_literal(out: &mut String, s: &str, indent: usize) {
    let body = s.trim_end_matches('\n');
    let chomping = match s.len() - body.len() {
        0 => "|-",
        1 => "|",
        _ => "|+",
    };
    out.push_str(chomping);
    out.push('\n');
    for line in body.split('\n') {
        if !line.is_empty() {
            push_indent(out, indent + 2);
            out.push_str(line);
        }
        out.push('\n');
    }
    // Kept trailing newlines beyond the first are empty lines of the block.
    for _ in 1..(s.len() - body.len()) {
        out.push('\n');
    }
    // The caller adds the newline that ends the scalar's last line; take ours back.
    out.pop();
}

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{85}')
}

fn write_quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if needs_escape(c) => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::load;
    use serde_json::json;

    fn round_trip(value: &Value) {
        let text = to_yaml(value);
        let back = load(&text)
            .unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
            .value;
        assert_eq!(&back, value, "\n---\n{text}");
    }

    #[test]
    fn emits_readable_block_yaml() {
        // Keys in sorted order, so the text is the same whether or not serde_json keeps
        // insertion order.
        let value = json!({
            "apiVersion": "100monkeys.ai/v1",
            "metadata": {"labels": {}, "name": "hello", "version": "1.0.0"},
            "spec": {"list": [{"a": 1, "b": [true, null]}, [1, 2], []],
                "runtime": {"language": "python", "version": "3.11"},
                "task": {"instruction": "Write tests.\nRun them.\n"},
                "tools": ["fs.read", "cmd.run"]}
        });
        let text = to_yaml(&value);
        assert_eq!(
            text,
            "apiVersion: 100monkeys.ai/v1\n\
             metadata:\n  name: hello\n  labels: {}\n  version: 1.0.0\n\
             spec:\n\
             \x20 list:\n    - a: 1\n      b:\n        - true\n        - null\n    - - 1\n      - 2\n    - []\n\
             \x20 runtime:\n    language: python\n    version: \"3.11\"\n\
             \x20 task:\n    instruction: |\n      Write tests.\n      Run them.\n\
             \x20 tools:\n    - fs.read\n    - cmd.run\n"
        );
        round_trip(&value);
    }

    #[test]
    fn tricky_strings_round_trip() {
        let strings = [
            "",
            " ",
            "true",
            "True",
            "yes",
            "no",
            "on",
            "off",
            "y",
            "N",
            "null",
            "~",
            "1",
            "-1",
            "0x1F",
            "0o17",
            "1.5",
            ".5",
            "1e3",
            ".inf",
            ".nan",
            "1_000",
            "12:30",
            "3.11",
            "1.0.0",
            "a: b",
            "a #b",
            "#c",
            "- x",
            "-x",
            "{{input.x}}",
            "{a}",
            "[a]",
            "*a",
            "&a",
            "!a",
            "%a",
            "@a",
            "`a`",
            "'q'",
            "\"q\"",
            "a\\b",
            "tab\there",
            "cr\rhere",
            "nul\u{0}here",
            "line\u{2028}sep",
            "\u{feff}bom",
            "ünïcödé",
            "emoji 🦀",
            "a\nb",
            "a\nb\n",
            "a\nb\n\n\n",
            "\nleading",
            " lead\nx",
            "x\n  indented\n",
            "x\n \ny",
            "x\n\ny",
            "trailing \nx",
            "ends with space ",
            "<<",
            "=",
            "key:",
            "a:b",
            "/abs/path",
            "http://example.com/x?y=1#z",
            "5m",
            "512Mi",
            "-",
            "?",
            ":",
            "|",
            ">",
            "a|b",
            "a > b",
        ];
        for s in strings {
            round_trip(&json!({ "k": s }));
            round_trip(&json!([s]));
            round_trip(&json!({ s: "v" }));
        }
    }

    #[test]
    fn numbers_and_nesting_round_trip() {
        round_trip(
            &json!({"i": 1, "n": -5, "u": 18446744073709551615u64, "f": 1.0, "g": -0.5,
            "h": 1e300, "s": 1.5e-10, "z": 0.0}),
        );
        round_trip(&json!([[[]], [{}], {"a": [[1, {"b": {"c": [null]}}]]}]));
        round_trip(&json!("just a string"));
        round_trip(&json!(42));
    }
}
