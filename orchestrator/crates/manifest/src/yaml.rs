//! YAML text to a JSON value, remembering where every node started.
//!
//! We do not deserialize manifests with serde: the schema and semantic stages work on a
//! `serde_json::Value` (the same shape a JSON body gives), and every error they find must name the
//! line the author wrote. So the loader drives yaml-rust2's event parser itself, builds the value,
//! and records for each node the position of its key (for mapping entries) or of its first token
//! (for sequence items and the root) under the node's JSON pointer.
//!
//! It is deliberately stricter than most YAML loaders, because a manifest that means something
//! other than what it seems to say is worse than one that is refused:
//! - plain scalars resolve with the YAML 1.2 core schema only (`yes`, `on` and `1_000` stay
//!   strings; `0x1F` and `0o17` are integers); infinite and NaN numbers are refused;
//! - duplicate keys, non-string keys, unknown tags and more than one document are errors;
//! - anchors, aliases and `<<` merge keys work, but alias expansion is capped so that a small
//!   text cannot expand into a huge value, and so is nesting depth: an alias counts every node
//!   it copies (as a value and as a mapping key alike) and may not carry the document past the
//!   depth limit, so chained anchors cannot build a value deeper than the loader itself accepts
//!   (the later stages, schema validation and serialisation, recurse over it).

use std::collections::HashMap;

use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, Parser, Tag};
use yaml_rust2::scanner::{Marker, ScanError, TScalarStyle};

use super::error::{ManifestError, ManifestErrors, Stage};
use super::pointer;

/// Largest manifest text accepted, in bytes.
pub const MAX_TEXT_BYTES: usize = 1024 * 1024;
/// Most nodes a document may expand to (aliases count every node they copy).
const MAX_NODES: usize = 100_000;
/// Deepest nesting of collections accepted.
const MAX_DEPTH: usize = 128;
/// The handle yaml-rust2 gives the standard `!!` tags.
const CORE_TAG_HANDLE: &str = "tag:yaml.org,2002:";

/// Where each node of a loaded document starts: JSON pointer to 1-based (line, column).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Positions(HashMap<String, (usize, usize)>);

impl Positions {
    /// The position recorded for exactly this pointer.
    pub fn get(&self, pointer: &str) -> Option<(usize, usize)> {
        self.0.get(pointer).copied()
    }

    /// The position of this pointer or, when it has none (a node that came from an alias or a
    /// merge, or one that does not exist), of its nearest ancestor that has one.
    pub fn locate(&self, pointer: &str) -> Option<(usize, usize)> {
        let mut current = pointer;
        loop {
            if let Some(position) = self.get(current) {
                return Some(position);
            }
            current = pointer::parent(current)?;
        }
    }

    /// Gives each error the line and column of its pointer.
    pub fn place(&self, errors: Vec<ManifestError>) -> Vec<ManifestError> {
        errors
            .into_iter()
            .map(|e| {
                if e.line.is_some() {
                    e
                } else {
                    let position = self.locate(&e.pointer);
                    e.at(position)
                }
            })
            .collect()
    }

    fn record(&mut self, pointer: &str, mark: Marker) {
        self.0
            .entry(pointer.to_owned())
            .or_insert((mark.line(), mark.col() + 1));
    }
}

/// A YAML document as a JSON value, with the positions of its nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// The document.
    pub value: Value,
    /// Where its nodes start.
    pub positions: Positions,
}

/// Parses one YAML (or JSON) document.
pub fn load(text: &str) -> Result<Loaded, ManifestErrors> {
    if text.len() > MAX_TEXT_BYTES {
        return Err(yaml_error(
            format!("the manifest is larger than {MAX_TEXT_BYTES} bytes"),
            Some((1, 1)),
        )
        .into());
    }
    let mut loader = Loader {
        parser: Parser::new_from_str(text),
        positions: Positions::default(),
        anchors: HashMap::new(),
        errors: Vec::new(),
        nodes: 0,
    };
    match loader.document() {
        Ok(value) if loader.errors.is_empty() => Ok(Loaded {
            value,
            positions: loader.positions,
        }),
        Ok(_) => Err(ManifestErrors::sorted(loader.errors)),
        Err(fatal) => {
            // A syntax error makes the rest of the text meaningless; earlier findings still
            // stand (they are above it).
            let mut errors = loader.errors;
            errors.push(fatal);
            Err(ManifestErrors::sorted(errors))
        }
    }
}

fn yaml_error(message: impl Into<String>, position: Option<(usize, usize)>) -> ManifestError {
    ManifestError::new(Stage::Yaml, "", message).at(position)
}

fn position(mark: Marker) -> Option<(usize, usize)> {
    Some((mark.line(), mark.col() + 1))
}

struct Loader<'a> {
    parser: Parser<std::str::Chars<'a>>,
    positions: Positions,
    /// Values of the anchors seen so far, by the parser's anchor id.
    anchors: HashMap<usize, Value>,
    /// Problems that do not stop parsing (duplicate keys, bad scalars, ...).
    errors: Vec<ManifestError>,
    nodes: usize,
}

impl Loader<'_> {
    fn next(&mut self) -> Result<(Event, Marker), ManifestError> {
        self.parser.next_token().map_err(scan_error)
    }

    /// Takes the next event, which must be `wanted`; else fails with `message` at its position.
    fn expect(&mut self, wanted: Event, message: &str) -> Result<(), ManifestError> {
        let (event, mark) = self.next()?;
        if event == wanted {
            Ok(())
        } else {
            Err(yaml_error(message, position(mark)))
        }
    }

    fn document(&mut self) -> Result<Value, ManifestError> {
        self.expect(Event::StreamStart, "expected the start of a YAML stream")?;
        let (event, mark) = self.next()?;
        match event {
            Event::DocumentStart => {}
            Event::StreamEnd => {
                return Err(yaml_error("the manifest is empty", position(mark)));
            }
            _ => return Err(yaml_error("expected a YAML document", position(mark))),
        }
        let (event, mark) = self.next()?;
        let value = self.node(event, mark, "", 0)?;
        self.expect(Event::DocumentEnd, "expected the end of the document")?;
        let (event, mark) = self.next()?;
        match event {
            Event::StreamEnd => Ok(value),
            _ => Err(yaml_error(
                "only one YAML document is allowed per manifest (found a second `---`)",
                position(mark),
            )),
        }
    }

    fn count(&mut self, nodes: usize, mark: Marker) -> Result<(), ManifestError> {
        self.nodes = self.nodes.saturating_add(nodes);
        if self.nodes > MAX_NODES {
            return Err(yaml_error(
                format!("the document expands to more than {MAX_NODES} nodes (too many aliases?)"),
                position(mark),
            ));
        }
        Ok(())
    }

    fn node(
        &mut self,
        event: Event,
        mark: Marker,
        at: &str,
        depth: usize,
    ) -> Result<Value, ManifestError> {
        if depth > MAX_DEPTH {
            return Err(yaml_error(
                format!("the document is nested deeper than {MAX_DEPTH} levels"),
                position(mark),
            ));
        }
        self.count(1, mark)?;
        let (value, anchor) = match event {
            Event::Scalar(text, style, anchor, tag) => {
                self.positions.record(at, mark);
                (self.scalar(&text, style, tag.as_ref(), at, mark), anchor)
            }
            Event::Alias(id) => {
                self.positions.record(at, mark);
                let Some((size, nesting)) = self.anchors.get(&id).map(measure) else {
                    return Err(yaml_error(
                        "this alias refers to a node that contains it",
                        position(mark),
                    ));
                };
                if depth + nesting > MAX_DEPTH {
                    return Err(yaml_error(
                        format!(
                            "this alias would nest the document deeper than {MAX_DEPTH} levels"
                        ),
                        position(mark),
                    ));
                }
                // Count before copying, so an alias bomb is stopped before it allocates.
                self.count(size, mark)?;
                let value = self.anchors.get(&id).cloned().unwrap_or(Value::Null);
                (value, 0)
            }
            Event::SequenceStart(anchor, tag) => {
                self.positions.record(at, mark);
                self.collection_tag(tag.as_ref(), "seq", at, mark);
                (self.sequence(at, depth)?, anchor)
            }
            Event::MappingStart(anchor, tag) => {
                self.collection_tag(tag.as_ref(), "map", at, mark);
                (self.mapping(at, mark, depth)?, anchor)
            }
            other => {
                return Err(yaml_error(
                    format!("unexpected YAML event {other:?}"),
                    position(mark),
                ))
            }
        };
        if anchor > 0 {
            self.anchors.insert(anchor, value.clone());
        }
        Ok(value)
    }

    fn sequence(&mut self, at: &str, depth: usize) -> Result<Value, ManifestError> {
        let mut items = Vec::new();
        loop {
            let (event, mark) = self.next()?;
            if event == Event::SequenceEnd {
                return Ok(Value::Array(items));
            }
            let item = pointer::join_index(at, items.len());
            items.push(self.node(event, mark, &item, depth + 1)?);
        }
    }

    fn mapping(&mut self, at: &str, start: Marker, depth: usize) -> Result<Value, ManifestError> {
        let mut map = Map::new();
        // Values of `<<` merge keys, applied once the explicit keys are known (they win).
        let mut merges: Vec<(Value, Marker)> = Vec::new();
        let mut first = true;
        loop {
            let (event, key_mark) = self.next()?;
            if first {
                // A block mapping's start marker sits on the `:` after its first key; the key's
                // own marker is where an author sees the mapping begin. (A flow mapping's start
                // is its `{`, before the first key.)
                let block = key_mark.line() == start.line() && key_mark.col() < start.col();
                self.positions
                    .record(at, if block { key_mark } else { start });
                first = false;
            }
            let (key, merge) = match event {
                Event::MappingEnd => break,
                Event::Scalar(text, style, _, tag) => {
                    let merge = style == TScalarStyle::Plain && tag.is_none() && text == "<<";
                    let value = self.scalar(&text, style, tag.as_ref(), at, key_mark);
                    (self.key_string(value, &text, key_mark), merge)
                }
                Event::Alias(id) => {
                    // A key is a copy too (and is printed when it is not a string): counted like
                    // any alias, so repeated alias keys cannot multiply a large anchor.
                    let size = self.anchors.get(&id).map_or(1, |v| measure(v).0);
                    self.count(size, key_mark)?;
                    let value = self.anchors.get(&id).cloned().unwrap_or(Value::Null);
                    let text = value.to_string();
                    (self.key_string(value, &text, key_mark), false)
                }
                _ => {
                    return Err(yaml_error(
                        "a mapping key must be a string, not a mapping or a sequence",
                        position(key_mark),
                    ))
                }
            };
            let (event, value_mark) = self.next()?;
            let Some(key) = key else {
                // Already reported; parse the value to stay in step with the parser.
                let scratch = pointer::join(at, "\u{0}invalid-key");
                self.node(event, value_mark, &scratch, depth + 1)?;
                continue;
            };
            let child = pointer::join(at, &key);
            if map.contains_key(&key) || (merge && !merges.is_empty()) {
                let first_line = self.positions.get(&child).map(|(line, _)| line);
                let mut message = format!("duplicate key `{key}`");
                if let Some(line) = first_line {
                    message.push_str(&format!(" (first defined at line {line})"));
                }
                self.errors.push(
                    ManifestError::new(Stage::Yaml, child.clone(), message).at(position(key_mark)),
                );
            }
            self.positions.record(&child, key_mark);
            let value = self.node(event, value_mark, &child, depth + 1)?;
            if merge {
                merges.push((value, key_mark));
            } else {
                map.insert(key, value);
            }
        }
        for (source, mark) in merges {
            let sources = match source {
                Value::Array(items) => items,
                other => vec![other],
            };
            for source in sources {
                let Value::Object(entries) = source else {
                    self.errors.push(
                        ManifestError::new(
                            Stage::Yaml,
                            pointer::join(at, "<<"),
                            "a `<<` merge key needs a mapping or a list of mappings",
                        )
                        .at(position(mark)),
                    );
                    continue;
                };
                for (key, value) in entries {
                    if !map.contains_key(&key) {
                        self.positions.record(&pointer::join(at, &key), mark);
                        map.insert(key, value);
                    }
                }
            }
        }
        Ok(Value::Object(map))
    }

    /// A mapping key must resolve to a string; anything else is reported and skipped.
    fn key_string(&mut self, value: Value, text: &str, mark: Marker) -> Option<String> {
        match value {
            Value::String(s) => Some(s),
            other => {
                let what = match other {
                    Value::Null => "null",
                    Value::Bool(_) => "a boolean",
                    Value::Number(_) => "a number",
                    _ => "not a string",
                };
                self.errors.push(yaml_error(
                    format!("mapping key `{text}` is {what}, not a string; quote it"),
                    position(mark),
                ));
                None
            }
        }
    }

    fn collection_tag(&mut self, tag: Option<&Tag>, expected: &str, at: &str, mark: Marker) {
        if let Some(tag) = tag {
            if !(tag.handle == CORE_TAG_HANDLE && tag.suffix == expected) {
                self.errors.push(
                    ManifestError::new(
                        Stage::Yaml,
                        at,
                        format!("unsupported tag `{}`", show_tag(tag)),
                    )
                    .at(position(mark)),
                );
            }
        }
    }

    fn scalar(
        &mut self,
        text: &str,
        style: TScalarStyle,
        tag: Option<&Tag>,
        at: &str,
        mark: Marker,
    ) -> Value {
        let resolved = match tag {
            None if style == TScalarStyle::Plain => resolve_plain(text),
            None => Ok(Value::String(text.to_owned())),
            Some(tag) if tag.handle == "!" && tag.suffix.is_empty() => {
                Ok(Value::String(text.to_owned()))
            }
            Some(tag) if tag.handle == CORE_TAG_HANDLE => {
                let wanted: fn(&Value) -> bool = match tag.suffix.as_str() {
                    "str" => return Value::String(text.to_owned()),
                    "null" => Value::is_null,
                    "bool" => Value::is_boolean,
                    "int" => |v| v.is_i64() || v.is_u64(),
                    "float" => Value::is_number,
                    _ => |_| false,
                };
                match resolve_plain(text) {
                    Ok(value) if wanted(&value) => Ok(value),
                    Ok(_) => Err(format!("`{text}` is not a valid `!!{}`", tag.suffix)),
                    Err(e) => Err(e),
                }
            }
            Some(tag) => Err(format!("unsupported tag `{}`", show_tag(tag))),
        };
        match resolved {
            Ok(value) => value,
            Err(message) => {
                self.errors
                    .push(ManifestError::new(Stage::Yaml, at, message).at(position(mark)));
                Value::Null
            }
        }
    }
}

fn show_tag(tag: &Tag) -> String {
    if tag.handle == CORE_TAG_HANDLE {
        format!("!!{}", tag.suffix)
    } else {
        format!("{}{}", tag.handle, tag.suffix)
    }
}

fn scan_error(error: ScanError) -> ManifestError {
    let mark = error.marker();
    yaml_error(error.info().to_owned(), Some((mark.line(), mark.col() + 1)))
}

/// Nodes in `value` and how many levels it nests below itself (0 for a scalar). Anchored values
/// were built within [`MAX_DEPTH`], so the recursion is bounded.
fn measure(value: &Value) -> (usize, usize) {
    let children: Box<dyn Iterator<Item = &Value>> = match value {
        Value::Array(items) => Box::new(items.iter()),
        Value::Object(map) => Box::new(map.values()),
        _ => return (1, 0),
    };
    children.fold((1, 1), |(nodes, nesting), child| {
        let (n, d) = measure(child);
        (nodes + n, nesting.max(d + 1))
    })
}

/// Resolves a plain (unquoted) scalar with the YAML 1.2 core schema.
///
/// `Err` carries a message for values that YAML would accept but a manifest cannot hold (infinite
/// or NaN numbers, integers beyond 64 bits).
pub fn resolve_plain(text: &str) -> Result<Value, String> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Ok(Value::Null),
        "true" | "True" | "TRUE" => return Ok(Value::Bool(true)),
        "false" | "False" | "FALSE" => return Ok(Value::Bool(false)),
        _ => {}
    }
    let unsigned = text.strip_prefix(['-', '+']).unwrap_or(text);
    if matches!(unsigned, ".inf" | ".Inf" | ".INF") || matches!(text, ".nan" | ".NaN" | ".NAN") {
        return Err(format!(
            "`{text}` is not a finite number; manifests only hold finite numbers \
             (quote it for a string)"
        ));
    }
    if let Some(digits) = text.strip_prefix("0o") {
        if !digits.is_empty() && digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
            return radix_integer(text, digits, 8);
        }
    }
    if let Some(digits) = text.strip_prefix("0x") {
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return radix_integer(text, digits, 16);
        }
    }
    if !unsigned.is_empty() && unsigned.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(i) = text.parse::<i64>() {
            return Ok(Value::from(i));
        }
        if let Ok(u) = unsigned.parse::<u64>() {
            if !text.starts_with('-') {
                return Ok(Value::from(u));
            }
        }
        return Err(format!(
            "integer `{text}` does not fit in 64 bits (quote it for a string)"
        ));
    }
    if is_core_float(unsigned) {
        let parsed = normalise_float(text).parse::<f64>().ok();
        return match parsed.and_then(Number::from_f64) {
            Some(n) if parsed.is_some_and(f64::is_finite) => Ok(Value::Number(n)),
            _ => Err(format!(
                "`{text}` is out of range for a number (quote it for a string)"
            )),
        };
    }
    Ok(Value::String(text.to_owned()))
}

fn radix_integer(text: &str, digits: &str, radix: u32) -> Result<Value, String> {
    u64::from_str_radix(digits, radix)
        .map(Value::from)
        .map_err(|_| format!("integer `{text}` does not fit in 64 bits (quote it for a string)"))
}

/// `( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?`, the core schema's float
/// without its sign.
fn is_core_float(s: &str) -> bool {
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", frac)) => !frac.is_empty() && digits(frac),
        Some((int, frac)) => digits(int) && digits(frac),
        None => !mantissa.is_empty() && digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    mantissa_ok && exponent_ok
}

/// Rewrites a core-schema float so that Rust's parser takes it: `1.e5` -> `1.0e5`,
/// `+.5` -> `+0.5`.
fn normalise_float(text: &str) -> String {
    let (sign, rest) = match text.as_bytes().first() {
        Some(b'-') | Some(b'+') => text.split_at(1),
        _ => ("", text),
    };
    let mut out = String::with_capacity(text.len() + 2);
    out.push_str(sign);
    if rest.starts_with('.') {
        out.push('0');
    }
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '.' && !chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('0');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn value(text: &str) -> Value {
        load(text).expect("loads").value
    }

    fn errors(text: &str) -> Vec<ManifestError> {
        load(text).expect_err("refused").0
    }

    #[test]
    fn builds_json_and_records_lines_of_keys_and_items() {
        let text = "# a comment\n\
                    apiVersion: 100monkeys.ai/v1\n\
                    spec:\n\
                    \x20 tools: [fs.read, cmd.run]\n\
                    \x20 states:\n\
                    \x20   review:\n\
                    \x20     transitions:\n\
                    \x20       - condition: always\n\
                    \x20         target: done\n\
                    \x20       -\n\
                    \x20         condition: on_failure\n";
        let loaded = load(text).expect("loads");
        assert_eq!(
            loaded.value,
            json!({"apiVersion": "100monkeys.ai/v1", "spec": {"tools": ["fs.read", "cmd.run"],
                "states": {"review": {"transitions": [
                    {"condition": "always", "target": "done"}, {"condition": "on_failure"}]}}}})
        );
        let p = &loaded.positions;
        assert_eq!(p.get(""), Some((2, 1)));
        assert_eq!(p.get("/apiVersion"), Some((2, 1)));
        assert_eq!(p.get("/spec"), Some((3, 1)));
        assert_eq!(p.get("/spec/tools"), Some((4, 3)));
        assert_eq!(p.get("/spec/tools/1"), Some((4, 20)));
        assert_eq!(p.get("/spec/states/review"), Some((6, 5)));
        assert_eq!(p.get("/spec/states/review/transitions/0"), Some((8, 11)));
        assert_eq!(
            p.get("/spec/states/review/transitions/0/target"),
            Some((9, 11))
        );
        assert_eq!(p.get("/spec/states/review/transitions/1"), Some((11, 11)));
        assert_eq!(p.locate("/spec/states/review/nope/deeper"), Some((6, 5)));
    }

    #[test]
    fn resolves_scalars_with_the_core_schema() {
        let v = value(
            "a: ~\nb:\nc: null\nd: true\ne: False\nf: yes\ng: on\nh: 42\ni: -7\nj: 0x1F\nk: 0o17\n\
             l: 1.5\nm: .5\nn: 1e3\no: -1.25E-2\np: '42'\nq: \"true\"\nr: 1_000\ns: 3.11\nt: 1.\n\
             u: 18446744073709551615\nv: !!str 12\nw: 0777\nx: +12\n",
        );
        assert_eq!(
            v,
            json!({"a": null, "b": null, "c": null, "d": true, "e": false, "f": "yes", "g": "on",
                "h": 42, "i": -7, "j": 31, "k": 15, "l": 1.5, "m": 0.5, "n": 1000.0,
                "o": -0.0125, "p": "42", "q": "true", "r": "1_000", "s": 3.11, "t": 1.0,
                "u": 18446744073709551615u64, "v": "12", "w": 777, "x": 12})
        );
        assert!(v["n"].is_f64());
    }

    #[test]
    fn refuses_non_finite_and_oversized_numbers() {
        for text in [
            "a: .inf",
            "a: -.Inf",
            "a: .nan",
            "a: 1e999",
            "a: 99999999999999999999",
        ] {
            let errs = errors(text);
            assert_eq!(errs.len(), 1, "{text}");
            assert_eq!(errs[0].stage, Stage::Yaml);
            assert_eq!(errs[0].pointer, "/a");
            assert_eq!(errs[0].line, Some(1));
        }
        assert_eq!(value("a: '.inf'"), json!({"a": ".inf"}));
    }

    #[test]
    fn anchors_aliases_and_merge_keys() {
        let v = value(
            "base: &b {kind: System, command: make}\n\
             copy: *b\n\
             list: &l [1, 2]\n\
             again: *l\n\
             merged:\n\
             \x20 <<: *b\n\
             \x20 command: test\n",
        );
        assert_eq!(v["copy"], json!({"kind": "System", "command": "make"}));
        assert_eq!(v["again"], json!([1, 2]));
        assert_eq!(v["merged"], json!({"kind": "System", "command": "test"}));
        let loaded = load("a: &x 1\nb:\n  <<: {c: 2}\n").expect("loads");
        assert_eq!(loaded.positions.get("/b/c"), Some((3, 3)));
    }

    #[test]
    fn refuses_duplicate_keys_at_the_second_key() {
        let errs = errors("metadata:\n  name: a\n  version: '1.0.0'\n  name: b\n");
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].pointer, "/metadata/name");
        assert_eq!(errs[0].line, Some(4));
        assert_eq!(errs[0].column, Some(3));
        assert!(
            errs[0].message.contains("first defined at line 2"),
            "{}",
            errs[0].message
        );
        // Every duplicate is reported, not only the first.
        assert_eq!(errors("a: 1\na: 2\nb: 1\nb: 2\n").len(), 2);
    }

    #[test]
    fn refuses_non_string_keys_tags_and_extra_documents() {
        let errs = errors("1: a\ntrue: b\n? [x]\n: c\n");
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert_eq!(errs[0].line, Some(1));
        assert!(errs[0].message.contains("not a string"));
        let errs = errors("a: !custom x\n");
        assert!(errs[0].message.contains("unsupported tag `!custom`"));
        let errs = errors("a: 1\n---\nb: 2\n");
        assert_eq!(errs[0].line, Some(2));
        assert!(errs[0].message.contains("only one YAML document"));
        let errs = errors("# nothing\n");
        assert!(errs[0].message.contains("empty"));
    }

    #[test]
    fn syntax_errors_carry_line_and_column() {
        let errs = errors("a: 1\nb: [1, 2\nc: 3\n");
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].stage, Stage::Yaml);
        assert_eq!(errs[0].line, Some(3));
        assert!(errs[0].column.is_some());
        let errs = errors("a: 1\n  b: 2\n");
        assert_eq!((errs[0].line, errs[0].column), (Some(2), Some(4)));
    }

    #[test]
    fn json_is_yaml() {
        let loaded =
            load("{\n  \"a\": [1, 2.5, null, true],\n  \"b\": {\"c\": \"d\"}\n}\n").expect("loads");
        assert_eq!(
            loaded.value,
            json!({"a": [1, 2.5, null, true], "b": {"c": "d"}})
        );
        assert_eq!(loaded.positions.get("/b/c"), Some((3, 9)));
    }

    #[test]
    fn alias_bombs_and_deep_nesting_are_cut_off() {
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..8 {
            let p = i - 1;
            bomb.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let errs = errors(&bomb);
        assert!(errs[0].message.contains("nodes"), "{errs:?}");
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(errors(&deep)[0].message.contains("nested"));
    }

    /// Anchors chained through aliases would each add up to the depth limit; the alias that
    /// would carry the value past it is refused.
    #[test]
    fn aliases_cannot_nest_past_the_depth_limit() {
        let mut text = format!("a0: &a0 {}x{}\n", "[".repeat(100), "]".repeat(100));
        for i in 1..4 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} {}*a{p}{}\n",
                "[".repeat(100),
                "]".repeat(100)
            ));
        }
        let errs = errors(&text);
        assert!(errs[0].message.contains("alias would nest"), "{errs:?}");
        assert_eq!(errs[0].line, Some(2), "{errs:?}");
        // Within the limit, an alias still expands.
        let fine = format!("a: &a {}x{}\nb: *a\n", "[".repeat(60), "]".repeat(60));
        assert!(load(&fine).is_ok());
    }

    /// A large anchor used as many mapping keys is counted each time, not copied for free.
    #[test]
    fn alias_keys_count_towards_the_node_limit() {
        let items = vec!["x"; 5_000].join(", ");
        let mut text = format!("big: &big [{items}]\nm:\n");
        for i in 0..100 {
            text.push_str(&format!("  ? *big\n  : {i}\n"));
        }
        let started = std::time::Instant::now();
        let errs = errors(&text);
        assert!(errs.iter().any(|e| e.message.contains("nodes")), "{errs:?}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    /// Pathological texts at the size limit are refused quickly, not parsed to the end.
    #[test]
    fn hostile_texts_at_the_size_limit_end_quickly() {
        let half = MAX_TEXT_BYTES / 2;
        for text in [
            "[".repeat(half),
            "{a: ".repeat(half / 4),
            format!("{}x", "- ".repeat(half / 2)),
            (0..half / 8)
                .map(|i| format!("k{i}: v\n"))
                .collect::<String>(),
        ] {
            let started = std::time::Instant::now();
            let _ = load(&text);
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "{}...: {:?}",
                &text[..20],
                started.elapsed()
            );
        }
        assert!(load(&"x".repeat(MAX_TEXT_BYTES + 1)).is_err());
    }
}
