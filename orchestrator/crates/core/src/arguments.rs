//! Tool arguments against their JSON Schema: what SDKs send, and what a refusal may say.
//!
//! Two rules live here so the router applies them once, for every door (REST, SEAL, MCP,
//! executions):
//!
//! - **Integral floats are integers where the schema says integer.** Python clients (and any
//!   JSON library that keeps numbers as doubles) send `30.0` for thirty. JSON Schema counts
//!   `30.0` as an integer, but handlers read arguments into Rust integers, which refuse a float.
//!   [`normalise_integers`] rewrites such numbers to integers where (and only where) the schema
//!   says `integer`, before validation; `30.5` stays a float and the validator refuses it.
//! - **A refusal never repeats a value.** An argument may hold a secret (a token in `content`,
//!   a password in `env_additions`), and validation messages travel to the caller, to logs and
//!   into the audit log's reason. [`describe_violation`] therefore says what the schema wanted and
//!   the JSON type that arrived, never the value; the JSON pointer says where.
//! - **An audit reason never carries a value either.** Policy refusals and tool errors explain
//!   themselves to the caller with the path or command they refused, which is what a caller
//!   needs; the audit log keeps them forever and is readable by more people, so [`scrub`] replaces
//!   every argument value (and every word of a multi-word value) in such a text by the JSON
//!   pointer it came from before the router stores it.

use serde_json::{Number, Value};

/// Deepest schema/instance nesting followed; deeper parts are left as they are.
const MAX_DEPTH: usize = 64;

/// Rewrites every number with a zero fraction (`30.0`, `-2.0`, `1e3`) to an integer where
/// `schema` says `integer` at that place; everything else is returned unchanged.
///
/// Followed: `properties`, `additionalProperties` and `patternProperties` (any pattern; the
/// validator still checks the name), `items`, `prefixItems`, `allOf` / `anyOf` / `oneOf`
/// branches and local `$ref`s (`#/...`).
pub fn normalise_integers(schema: &Value, instance: Value) -> Value {
    walk(schema, schema, instance, 0)
}

fn says_integer(schema: &Value) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "integer",
        Some(Value::Array(types)) => {
            types.iter().any(|t| t == "integer") && !types.iter().any(|t| t == "number")
        }
        _ => false,
    }
}

/// The integer a float stands for, when it has no fraction and fits an `i64` or `u64`.
fn integral(number: &Number) -> Option<Number> {
    if number.is_i64() || number.is_u64() {
        return None;
    }
    let f = number.as_f64()?;
    if !f.is_finite() || f.fract() != 0.0 {
        return None;
    }
    // 2^63 and 2^64 are exact doubles; the bounds are exclusive at the top.
    if (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&f) {
        Some(Number::from(f as i64))
    } else if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
        Some(Number::from(f as u64))
    } else {
        None
    }
}

fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(reference) => reference
            .strip_prefix('#')
            .and_then(|pointer| root.pointer(pointer))
            .unwrap_or(schema),
        None => schema,
    }
}

fn walk(root: &Value, schema: &Value, instance: Value, depth: usize) -> Value {
    if depth > MAX_DEPTH {
        return instance;
    }
    let schema = resolve(root, schema);
    let mut instance = match instance {
        Value::Number(n) if says_integer(schema) => match integral(&n) {
            Some(i) => Value::Number(i),
            None => Value::Number(n),
        },
        Value::Object(members) => {
            let properties = schema.get("properties");
            let additional = schema.get("additionalProperties").filter(|s| s.is_object());
            let pattern = schema
                .get("patternProperties")
                .and_then(Value::as_object)
                .filter(|p| p.len() == 1)
                .and_then(|p| p.values().next());
            Value::Object(
                members
                    .into_iter()
                    .map(|(key, value)| {
                        let sub = properties
                            .and_then(|p| p.get(&key))
                            .or(pattern)
                            .or(additional);
                        let value = match sub {
                            Some(sub) => walk(root, sub, value, depth + 1),
                            None => value,
                        };
                        (key, value)
                    })
                    .collect(),
            )
        }
        Value::Array(items) => {
            let prefix = schema.get("prefixItems").and_then(Value::as_array);
            let rest = schema.get("items").filter(|s| s.is_object());
            Value::Array(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, item)| match prefix.and_then(|p| p.get(i)).or(rest) {
                        Some(sub) => walk(root, sub, item, depth + 1),
                        None => item,
                    })
                    .collect(),
            )
        }
        other => other,
    };
    for combinator in ["allOf", "anyOf", "oneOf"] {
        if let Some(branches) = schema.get(combinator).and_then(Value::as_array) {
            for branch in branches {
                instance = walk(root, branch, instance, depth + 1);
            }
        }
    }
    instance
}

/// The JSON type name of a value, as a schema would name it.
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A validation error as a message without the offending value: what the schema wanted, and the
/// JSON type that was given.
pub fn describe_violation(error: &jsonschema::ValidationError<'_>) -> String {
    format!(
        "{} (got {})",
        error.masked_with("the value"),
        json_type(error.instance())
    )
}

/// Shortest value replaced wherever it occurs; shorter ones only when quoted (`` `ls` ``), so
/// that a one-letter argument does not garble every word of a message.
const MIN_BARE_LEN: usize = 4;

/// `text` with every string value of `args` (and each word of a value with spaces) replaced by
/// `<arg /pointer>`; numbers only where quoted. For audit reasons (module doc).
pub fn scrub(text: &str, args: &Value) -> String {
    let mut leaves = Vec::new();
    leaves_of(args, &mut String::new(), &mut leaves, 0);
    let mut candidates: Vec<(String, String)> = Vec::new();
    for (pointer, value) in leaves {
        if value.split_whitespace().nth(1).is_some() {
            for word in value.split_whitespace() {
                candidates.push((word.to_owned(), pointer.clone()));
            }
        }
        // A message may quote the value as JSON (a server echoing its arguments): a value with
        // `"`, `\` or a control character is escaped there and would not match as it is.
        let escaped = serde_json::to_string(&value).unwrap_or_default();
        if let Some(escaped) = escaped.strip_prefix('"').and_then(|e| e.strip_suffix('"')) {
            if escaped != value {
                candidates.push((escaped.to_owned(), pointer.clone()));
            }
        }
        candidates.push((value, pointer));
    }
    // Longest first, so a whole value is replaced before the words inside it.
    candidates.sort_by_key(|c| std::cmp::Reverse(c.0.len()));
    let mut out = text.to_owned();
    for (value, pointer) in candidates {
        if value.is_empty() {
            continue;
        }
        let marker = format!("<arg {}>", if pointer.is_empty() { "/" } else { &pointer });
        out = if value.chars().count() >= MIN_BARE_LEN {
            out.replace(&value, &marker)
        } else {
            out.replace(&format!("`{value}`"), &format!("`{marker}`"))
        };
    }
    out
}

fn leaves_of(value: &Value, pointer: &mut String, out: &mut Vec<(String, String)>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    let len = pointer.len();
    match value {
        Value::String(s) => out.push((pointer.clone(), s.clone())),
        Value::Number(n) => out.push((pointer.clone(), n.to_string())),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                pointer.push_str(&format!("/{i}"));
                leaves_of(item, pointer, out, depth + 1);
                pointer.truncate(len);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                pointer.push('/');
                pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                leaves_of(item, pointer, out, depth + 1);
                pointer.truncate(len);
            }
        }
        Value::Bool(_) | Value::Null => {}
    }
}

/// The length of a value's compact JSON, counted without building the string.
pub fn serialized_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail, and a `Value` always serialises.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// A lower bound of the length of a value's compact JSON, from one walk over its nodes (the text
/// is not escaped or copied): a string takes at least its bytes and two quotes, a number one
/// digit. Exact for a value without escapes or numbers beyond one digit.
pub fn json_len_lower_bound(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(_) => 1,
        Value::String(s) => s.len() + 2,
        Value::Array(items) => {
            2 + items.len().saturating_sub(1)
                + items.iter().map(json_len_lower_bound).sum::<usize>()
        }
        Value::Object(map) => {
            2 + map.len().saturating_sub(1)
                + map
                    .iter()
                    .map(|(k, v)| k.len() + 3 + json_len_lower_bound(v))
                    .sum::<usize>()
        }
    }
}

/// A value's compact JSON, written into a buffer sized for it up front: a large result (a file's
/// content) is not copied again each time a growing buffer doubles.
pub fn to_json_vec(value: &Value) -> Vec<u8> {
    let hint = json_len_lower_bound(value);
    // Room for a few escapes and longer numbers beyond the bound before the one regrowth.
    let mut out = Vec::with_capacity(hint.saturating_add(hint / 32).saturating_add(64));
    // A `Value` always serialises (its keys are strings), and writing to memory cannot fail.
    let _ = serde_json::to_writer(&mut out, value);
    out
}

/// A value's compact JSON when it is at most `max` bytes long; `None` as soon as it outgrows
/// that, so a large value is never serialised in full just to learn that it is too large.
pub fn to_json_within(value: &Value, max: usize) -> Option<String> {
    let least = json_len_lower_bound(value);
    if least > max {
        return None;
    }
    struct Bounded {
        out: Vec<u8>,
        max: usize,
    }
    impl std::io::Write for Bounded {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.out.len() + buf.len() > self.max {
                return Err(std::io::Error::other("over the bound"));
            }
            self.out.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut bounded = Bounded {
        out: Vec::with_capacity(least),
        max,
    };
    serde_json::to_writer(&mut bounded, value).ok()?;
    // serde_json writes UTF-8 only.
    String::from_utf8(bounded.out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "$defs": {"count": {"type": "integer"}},
            "properties": {
                "n": {"type": "integer"},
                "f": {"type": "number"},
                "either": {"type": ["integer", "string"]},
                "list": {"type": "array", "items": {"type": "integer"}},
                "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
                "nested": {"type": "object", "properties": {"deep": {"$ref": "#/$defs/count"}}},
                "any": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                "free": {},
            },
            "additionalProperties": {"type": "integer"}
        })
    }

    #[test]
    fn integral_floats_become_integers_only_where_the_schema_says_integer() {
        let given: Value = serde_json::from_str(
            r#"{"n": 30.0, "f": 2.0, "either": 4.0, "list": [1.0, 2.5, -3.0], "pair": [7.0, "x"],
               "nested": {"deep": 1e3}, "any": 5.0, "free": 6.0, "extra": 8.0, "half": 30.5}"#,
        )
        .unwrap();
        let out = normalise_integers(&schema(), given);
        assert!(out["n"].is_i64(), "{out}");
        assert_eq!(out["n"], 30);
        assert!(out["f"].is_f64(), "numbers stay numbers");
        assert_eq!(out["either"], 4);
        assert!(out["list"][0].is_i64() && out["list"][2].is_i64());
        assert!(
            out["list"][1].is_f64(),
            "a real fraction is left for the validator to refuse"
        );
        assert!(out["pair"][0].is_i64());
        assert_eq!(out["nested"]["deep"], 1000);
        assert!(out["nested"]["deep"].is_i64());
        assert!(out["any"].is_i64());
        assert!(out["free"].is_f64(), "no schema, no change");
        assert!(out["extra"].is_i64(), "additionalProperties schema applies");
        assert!(out["half"].is_f64());
    }

    #[test]
    fn huge_and_odd_numbers_are_left_alone() {
        let s = json!({"type": "integer"});
        for text in ["1e300", "-1e300", "18446744073709551616.0"] {
            let v: Value = serde_json::from_str(text).unwrap();
            assert!(normalise_integers(&s, v).is_f64(), "{text}");
        }
        let v: Value = serde_json::from_str("-0.0").unwrap();
        assert_eq!(normalise_integers(&s, v), json!(0));
        let v: Value = serde_json::from_str("9007199254740992.0").unwrap();
        assert_eq!(normalise_integers(&s, v), json!(9007199254740992i64));
    }

    #[test]
    fn violations_never_repeat_the_value() {
        let schema = json!({"type": "object", "properties": {
            "n": {"type": "integer"}, "s": {"type": "string", "maxLength": 3, "pattern": "^a"},
            "e": {"enum": ["x", "y"]}}, "additionalProperties": false});
        let validator = jsonschema::validator_for(&schema).unwrap();
        let secret = "sk-live-SECRET-0123456789";
        let args = json!({"n": secret, "s": secret, "e": secret});
        let messages: Vec<String> = validator
            .iter_errors(&args)
            .map(|e| describe_violation(&e))
            .collect();
        assert!(messages.len() >= 4, "{messages:?}");
        for m in &messages {
            assert!(!m.contains("SECRET"), "{m}");
        }
        assert!(
            messages
                .iter()
                .any(|m| m.contains("integer") && m.contains("got string")),
            "{messages:?}"
        );
    }

    #[test]
    fn scrub_replaces_values_and_words_by_their_pointer() {
        let args = serde_json::json!({
            "command": "cat /etc/shadow",
            "path": "/workspace/secret-token.txt",
            "timeout_secs": 30,
            "env": {"API_KEY": "sk-live-123456"}
        });
        let text = "command `cat` is not on the allowlist; path /workspace/secret-token.txt \
                    is outside; `30` too long; key sk-live-123456 leaked; /etc/shadow";
        let scrubbed = scrub(text, &args);
        for raw in [
            "/etc/shadow",
            "secret-token",
            "sk-live-123456",
            "`cat`",
            "`30`",
        ] {
            assert!(!scrubbed.contains(raw), "{raw} survived in {scrubbed}");
        }
        assert!(scrubbed.contains("`<arg /command>`"), "{scrubbed}");
        assert!(scrubbed.contains("<arg /path>"), "{scrubbed}");
        assert!(scrubbed.contains("<arg /env/API_KEY>"), "{scrubbed}");
        assert!(scrubbed.contains("`<arg /timeout_secs>`"), "{scrubbed}");
        // Short unquoted values do not garble the message.
        let short = scrub("is not allowed", &serde_json::json!({"a": "is"}));
        assert_eq!(short, "is not allowed");
        // A value quoted as JSON, where `"` and `\` are escaped.
        let args = serde_json::json!({"token": "pa\"ss\\word"});
        let echoed = format!(
            "server said: {}",
            serde_json::json!({"token": args["token"]})
        );
        let scrubbed = scrub(&echoed, &args);
        assert!(!scrubbed.contains("pa\\\"ss"), "{scrubbed}");
        assert!(scrubbed.contains("<arg /token>"), "{scrubbed}");
    }

    #[test]
    fn json_length_bound_is_exact_without_escapes_and_below_with_them() {
        let plain = json!({"a": [1, true, null, "xyz"], "bb": {"c": false}, "d": []});
        assert_eq!(json_len_lower_bound(&plain), serialized_len(&plain));
        assert_eq!(to_json_vec(&plain), serde_json::to_vec(&plain).unwrap());
        let escaped = json!({"text": "line\n\"quoted\"\u{1}", "n": 12345, "f": -1.5});
        assert!(json_len_lower_bound(&escaped) < serialized_len(&escaped));
        assert_eq!(to_json_vec(&escaped), serde_json::to_vec(&escaped).unwrap());
        let big = json!({"content": "x".repeat(100_000)});
        assert_eq!(to_json_within(&big, 16 * 1024), None);
    }

    #[test]
    fn json_within_a_bound_is_the_compact_text_and_nothing_beyond_it() {
        let value = json!({"b": [1, 2], "a": "é\n"});
        let text = value.to_string();
        assert_eq!(
            to_json_within(&value, text.len()).as_deref(),
            Some(text.as_str())
        );
        assert_eq!(text.len(), serialized_len(&value));
        assert_eq!(to_json_within(&value, text.len() - 1), None);
        let large = json!({"content": "x".repeat(100_000)});
        assert_eq!(to_json_within(&large, 16 * 1024), None);
        assert_eq!(to_json_within(&Value::Null, 0), None);
        assert_eq!(to_json_within(&Value::Null, 4).as_deref(), Some("null"));
    }
}
