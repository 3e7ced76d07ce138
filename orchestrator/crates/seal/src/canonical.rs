//! The bytes a SEAL client signs, rebuilt exactly from the request text.
//!
//! A client signs `json.dumps({"payload":…,"security_token":…,"timestamp":N}, sort_keys=True,
//! separators=(',',':'), ensure_ascii=False)` (notes §1.2), and the server must rebuild those
//! bytes from what arrived. Everything but numbers round-trips through serde_json unchanged, but
//! numbers do not: Python writes `1e-05` and `18446744073709551616` where serde_json would write
//! `0.00001` and `1.8446744073709552e+19`. serde_json's `arbitrary_precision` feature would fix
//! that but changes number handling for the whole crate, so this module has its own small parser
//! that keeps every number as the lexeme the client wrote. Clients put on the wire the same
//! number text they signed (Python's `repr`, JavaScript's `JSON.stringify`), so echoing the
//! lexeme reproduces their bytes.
//!
//! The parser is strict RFC 8259 JSON: no comments, no trailing commas, no `NaN`, no lone
//! surrogates (Python could not UTF-8-encode them to sign them), no duplicate keys (two readers
//! could disagree on which one counts), nesting at most [`MAX_DEPTH`], nothing after the value
//! but whitespace.

use std::fmt::Write as _;

/// Deepest nesting of arrays and objects accepted.
pub const MAX_DEPTH: usize = 64;

/// A parsed JSON value that remembers each number exactly as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Json {
    /// `null`
    Null,
    /// `true` or `false`
    Bool(bool),
    /// A number, as its original lexeme (`1e-05`, `-0.0`, `18446744073709551616`).
    Number(String),
    /// A string, unescaped.
    String(String),
    /// An array, in order.
    Array(Vec<Json>),
    /// An object, members in the order received (keys are unique).
    Object(Vec<(String, Json)>),
}

/// Why a text is not acceptable JSON; `offset` is the byte position of the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid JSON at byte {offset}: {message}")]
pub struct CanonError {
    /// Byte offset in the input.
    pub offset: usize,
    /// What was wrong there.
    pub message: String,
}

impl Json {
    /// The member `key` of an object (`None` for other values or a missing key).
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string content, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    /// The same value as a `serde_json::Value`, for code that works on ordinary JSON.
    ///
    /// Numbers go through serde_json's own parser, so they become what serde_json would have
    /// made of the text (`18446744073709551616` becomes an `f64`). A number serde_json cannot
    /// represent at all (an integer or exponent beyond the range of `f64`, which no SDK can
    /// produce) is passed on as a string holding its lexeme rather than being lost.
    pub fn to_value(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Number(lexeme) => serde_json::from_str::<serde_json::Number>(lexeme)
                .map(Value::Number)
                .unwrap_or_else(|_| Value::String(lexeme.clone())),
            Json::String(s) => Value::String(s.clone()),
            Json::Array(items) => Value::Array(items.iter().map(Json::to_value).collect()),
            Json::Object(members) => Value::Object(
                members
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_value()))
                    .collect(),
            ),
        }
    }
}

/// Parses `text` as one JSON value, keeping number lexemes; see the module doc for what is
/// refused.
pub fn parse_preserving(text: &str) -> Result<Json, CanonError> {
    let mut parser = Parser {
        text,
        bytes: text.as_bytes(),
        pos: 0,
    };
    parser.skip_ws();
    let value = parser.value(0)?;
    parser.skip_ws();
    if parser.pos != parser.bytes.len() {
        return Err(parser.error("unexpected text after the JSON value"));
    }
    Ok(value)
}

/// How non-ASCII text is written in the canonical form.
///
/// The notes' canonical form is `ensure_ascii=False` (raw UTF-8), which is what the SDKs sign.
/// But `json.dumps` defaults to `ensure_ascii=True`, and clients written from the RFC text rather
/// than the SDK (or an SDK version that forgot the flag) sign `\u00e9` escapes instead. Both
/// texts denote the same JSON, so the gateway accepts a signature over either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escaping {
    /// `ensure_ascii=False`: non-ASCII as raw UTF-8 (the notes' canonical form).
    Utf8,
    /// `ensure_ascii=True`: everything outside `0x20..=0x7e` as `\uXXXX` (lowercase hex,
    /// surrogate pairs above U+FFFF), except the short escapes `\n \r \t \b \f`.
    Ascii,
}

/// Serialises `json` as Python's `json.dumps(v, sort_keys=True, separators=(',',':'),
/// ensure_ascii=False)` does, byte for byte.
pub fn to_canonical(json: &Json) -> String {
    let mut out = String::new();
    write_canonical(json, &mut out, Escaping::Utf8);
    out
}

/// The signed message of notes §1.2:
/// `{"payload":<canonical payload>,"security_token":"<token>","timestamp":<unix seconds>}` as
/// UTF-8 bytes.
pub fn signed_message(payload: &Json, security_token: &str, unix_secs: i64) -> Vec<u8> {
    signed_message_with(payload, security_token, unix_secs, Escaping::Utf8)
}

/// [`signed_message`] with the given escaping of non-ASCII text.
pub fn signed_message_with(
    payload: &Json,
    security_token: &str,
    unix_secs: i64,
    escaping: Escaping,
) -> Vec<u8> {
    let mut out = String::from("{\"payload\":");
    write_canonical(payload, &mut out, escaping);
    out.push_str(",\"security_token\":");
    write_string(security_token, &mut out, escaping);
    // Writing to a String cannot fail.
    let _ = write!(out, ",\"timestamp\":{unix_secs}}}");
    out.into_bytes()
}

fn write_canonical(json: &Json, out: &mut String, escaping: Escaping) {
    match json {
        Json::Null => out.push_str("null"),
        Json::Bool(true) => out.push_str("true"),
        Json::Bool(false) => out.push_str("false"),
        Json::Number(lexeme) => out.push_str(lexeme),
        Json::String(s) => write_string(s, out, escaping),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out, escaping);
            }
            out.push(']');
        }
        Json::Object(members) => {
            // `str` ordering is byte order, which for UTF-8 is code-point order: Python's order.
            let mut sorted: Vec<&(String, Json)> = members.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            out.push('{');
            for (i, (key, value)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out, escaping);
                out.push(':');
                write_canonical(value, out, escaping);
            }
            out.push('}');
        }
    }
}

/// Python's string encoder: with `ensure_ascii=False` it escapes `"`, `\` and C0 controls only;
/// with `ensure_ascii=True` also everything from 0x7f up.
fn write_string(s: &str, out: &mut String, escaping: Escaping) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if escaping == Escaping::Ascii && (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{:04x}", unit);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Refuses an object with a repeated key, in O(n log n) so a huge object cannot stall us.
fn check_unique_keys(members: &[(String, Json)], offsets: &[usize]) -> Result<(), CanonError> {
    let mut order: Vec<usize> = (0..members.len()).collect();
    order.sort_by(|&a, &b| members[a].0.cmp(&members[b].0).then(a.cmp(&b)));
    for pair in order.windows(2) {
        if members[pair[0]].0 == members[pair[1]].0 {
            return Err(CanonError {
                offset: offsets.get(pair[1]).copied().unwrap_or(0),
                message: format!("duplicate key `{}`", members[pair[1]].0),
            });
        }
    }
    Ok(())
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, message: impl Into<String>) -> CanonError {
        CanonError {
            offset: self.pos,
            message: message.into(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    /// Skips white space, then takes `byte` if it comes next.
    fn eat(&mut self, byte: u8) -> bool {
        self.skip_ws();
        let next = self.peek() == Some(byte);
        if next {
            self.pos += 1;
        }
        next
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn expect_literal(&mut self, literal: &str, value: Json) -> Result<Json, CanonError> {
        if self.bytes[self.pos..].starts_with(literal.as_bytes()) {
            self.pos += literal.len();
            Ok(value)
        } else {
            Err(self.error("expected a JSON value"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json, CanonError> {
        match self.peek() {
            None => Err(self.error("unexpected end of input")),
            Some(b'n') => self.expect_literal("null", Json::Null),
            Some(b't') => self.expect_literal("true", Json::Bool(true)),
            Some(b'f') => self.expect_literal("false", Json::Bool(false)),
            Some(b'"') => self.string().map(Json::String),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b'[') => self.array(depth + 1),
            Some(b'{') => self.object(depth + 1),
            Some(_) => Err(self.error("expected a JSON value")),
        }
    }

    fn check_depth(&self, depth: usize) -> Result<(), CanonError> {
        if depth > MAX_DEPTH {
            Err(self.error(format!("nesting deeper than {MAX_DEPTH} levels")))
        } else {
            Ok(())
        }
    }

    fn array(&mut self, depth: usize) -> Result<Json, CanonError> {
        self.check_depth(depth)?;
        self.pos += 1; // [
        let mut items = Vec::new();
        if self.eat(b']') {
            return Ok(Json::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Json::Array(items));
                }
                _ => return Err(self.error("expected `,` or `]` in an array")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json, CanonError> {
        self.check_depth(depth)?;
        self.pos += 1; // {
        let mut members: Vec<(String, Json)> = Vec::new();
        let mut key_offsets: Vec<usize> = Vec::new();
        if self.eat(b'}') {
            return Ok(Json::Object(members));
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(self.error("expected a string key in an object"));
            }
            key_offsets.push(self.pos);
            let key = self.string()?;
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(self.error("expected `:` after an object key"));
            }
            self.pos += 1;
            self.skip_ws();
            let value = self.value(depth)?;
            members.push((key, value));
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    check_unique_keys(&members, &key_offsets)?;
                    return Ok(Json::Object(members));
                }
                _ => return Err(self.error("expected `,` or `}` in an object")),
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Result<Json, CanonError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(self.error("a number may not have a leading zero"));
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.error("expected a digit")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(self.error("expected a digit after the decimal point"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.error("expected a digit in the exponent"));
            }
        }
        Ok(Json::Number(self.text[start..self.pos].to_owned()))
    }

    fn hex4(&mut self) -> Result<u32, CanonError> {
        let Some(hex) = self.text.get(self.pos..self.pos + 4) else {
            return Err(self.error("expected four hex digits after `\\u`"));
        };
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(self.error("expected four hex digits after `\\u`"));
        }
        let n = u32::from_str_radix(hex, 16).map_err(|_| self.error("bad `\\u` escape"))?;
        self.pos += 4;
        Ok(n)
    }

    fn string(&mut self) -> Result<String, CanonError> {
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            // Copy the run of plain characters in one go; the input is a &str, so any run that
            // stops at an ASCII byte ends on a character boundary.
            let run_start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            out.push_str(&self.text[run_start..self.pos]);
            match self.peek() {
                None => return Err(self.error("unterminated string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let escape = self.peek();
                    self.pos += 1;
                    match escape {
                        Some(b'"') => out.push('"'),
                        Some(b'\\') => out.push('\\'),
                        Some(b'/') => out.push('/'),
                        Some(b'b') => out.push('\u{08}'),
                        Some(b'f') => out.push('\u{0c}'),
                        Some(b'n') => out.push('\n'),
                        Some(b'r') => out.push('\r'),
                        Some(b't') => out.push('\t'),
                        Some(b'u') => {
                            let c = self.unicode_escape()?;
                            out.push(c);
                        }
                        _ => {
                            self.pos -= 1;
                            return Err(self.error("invalid escape in a string"));
                        }
                    }
                }
                Some(_) => return Err(self.error("control character in a string must be escaped")),
            }
        }
    }

    /// After `\u`: one code point, joining a surrogate pair; lone surrogates are refused.
    fn unicode_escape(&mut self) -> Result<char, CanonError> {
        let first = self.hex4()?;
        let code = match first {
            0xD800..=0xDBFF => {
                if !self.bytes[self.pos..].starts_with(b"\\u") {
                    return Err(self.error("unpaired surrogate in a `\\u` escape"));
                }
                self.pos += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(self.error("unpaired surrogate in a `\\u` escape"));
                }
                0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(self.error("unpaired surrogate in a `\\u` escape")),
            n => n,
        };
        char::from_u32(code).ok_or_else(|| self.error("invalid code point in a `\\u` escape"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        to_canonical(&parse_preserving(text).expect("valid JSON"))
    }

    /// The message of RFC appendix C.2 (its payload and token) signed at `unix_secs` (the RFC's
    /// is 1708261921): these bytes are checked here, and their signatures in `envelope`.
    pub(crate) fn rfc_c2_message(unix_secs: i64) -> Vec<u8> {
        let payload = parse_preserving(r#"{"jsonrpc": "2.0", "id": 1, "method": "test"}"#).unwrap();
        let token = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ0ZXN0In0.c2lnbmF0dXJl";
        signed_message(&payload, token, unix_secs)
    }

    #[test]
    fn rfc_c2_canonical_bytes() {
        let message = rfc_c2_message(1708261921);
        assert_eq!(
            String::from_utf8(message.clone()).unwrap(),
            r#"{"payload":{"id":1,"jsonrpc":"2.0","method":"test"},"security_token":"eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ0ZXN0In0.c2lnbmF0dXJl","timestamp":1708261921}"#
        );
        assert_eq!(message.len(), 148);
    }

    #[test]
    fn keys_sort_by_code_point_at_every_level_and_arrays_keep_order() {
        assert_eq!(
            canon(r#"{"b": {"z": 1, "a": [3, 1, {"y": 0, "x": 0}]}, "a": null, "B": true}"#),
            r#"{"B":true,"a":null,"b":{"a":[3,1,{"x":0,"y":0}],"z":1}}"#
        );
        // Code-point order: "é" (U+00E9) sorts after "z"; an astral key after U+FFFD.
        assert_eq!(
            canon(r#"{"é": 1, "z": 2, "😀": 3, "\ufffd": 4}"#),
            "{\"z\":2,\"é\":1,\"\u{fffd}\":4,\"😀\":3}"
        );
    }

    #[test]
    fn strings_escape_like_python_ensure_ascii_false() {
        assert_eq!(
            canon(r#"["é ü 日本 😀", "\u00e9", "\ud83d\ude00"]"#),
            "[\"é ü 日本 😀\",\"é\",\"😀\"]"
        );
        assert_eq!(
            canon(r#""quote \" backslash \\ slash \/ /""#),
            r#""quote \" backslash \\ slash / /""#
        );
        assert_eq!(
            canon(r#""\n\r\t\b\f\u0000\u0001\u001f\u007f\u2028""#),
            "\"\\n\\r\\t\\b\\f\\u0000\\u0001\\u001f\u{7f}\u{2028}\""
        );
        assert_eq!(canon(r#""\u001B""#), r#""\u001b""#);
    }

    #[test]
    fn numbers_keep_their_lexeme() {
        assert_eq!(
            canon("[1e-05, 1e-07, 18446744073709551616, 1.0, -0.0, 0, -12, 1E+2, 3.14159]"),
            "[1e-05,1e-07,18446744073709551616,1.0,-0.0,0,-12,1E+2,3.14159]"
        );
    }

    #[test]
    fn to_value_goes_through_serde_json() {
        let v = parse_preserving(r#"{"a": [1, 2.5, "x", null, true], "b": 18446744073709551616}"#)
            .unwrap()
            .to_value();
        assert_eq!(v["a"], serde_json::json!([1, 2.5, "x", null, true]));
        assert!(v["b"].is_f64());
        let huge = parse_preserving(&format!("[{}]", "9".repeat(400)))
            .unwrap()
            .to_value();
        assert_eq!(huge[0], serde_json::Value::String("9".repeat(400)));
    }

    #[test]
    fn refuses_what_is_not_strict_json() {
        let bad = [
            "",
            " ",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{a:1}",
            "01",
            "1.",
            ".5",
            "1e",
            "-",
            "+1",
            "NaN",
            "Infinity",
            "tru",
            "nul",
            "\"abc",
            "\"a\u{1}b\"",
            "\"tab\tin string\"",
            r#""\x41""#,
            r#""\u12""#,
            r#""\ud800""#,
            r#""\udc00""#,
            r#""\ud800\u0041""#,
            "{} {}",
            "[1] x",
            "// c\n1",
        ];
        for text in bad {
            assert!(parse_preserving(text).is_err(), "accepted {text:?}");
        }
    }

    #[test]
    fn refuses_duplicate_keys_at_any_depth() {
        let e = parse_preserving(r#"{"a": {"k": 1, "k": 2}}"#).unwrap_err();
        assert!(e.message.contains("duplicate key `k`"), "{e}");
        assert!(parse_preserving(r#"{"a": 1, "a": 1}"#).is_err());
        // Large objects are checked quickly, and the offset points at the second occurrence.
        let many: Vec<String> = (0..200_000).map(|i| format!("\"k{i}\":{i}")).collect();
        assert!(parse_preserving(&format!("{{{}}}", many.join(","))).is_ok());
        let text = format!("{{{},\"k7\":0}}", many.join(","));
        let e = parse_preserving(&text).unwrap_err();
        assert_eq!(e.offset, text.len() - 7);
        // Same key in different objects is fine.
        assert!(parse_preserving(r#"[{"a": 1}, {"a": 2}]"#).is_ok());
    }

    #[test]
    fn limits_depth() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse_preserving(&ok).is_ok());
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        let e = parse_preserving(&deep).unwrap_err();
        assert!(e.message.contains("nesting"), "{e}");
        let deep_objects = format!(
            "{}1{}",
            "{\"a\":".repeat(MAX_DEPTH + 1),
            "}".repeat(MAX_DEPTH + 1)
        );
        assert!(parse_preserving(&deep_objects).is_err());
        // Very deep input fails cleanly instead of overflowing the stack.
        let abyss = "[".repeat(1_000_000);
        assert!(parse_preserving(&abyss).is_err());
    }

    #[test]
    fn whitespace_around_and_inside_is_ignored() {
        assert_eq!(canon(" \r\n\t{ \"a\" : [ 1 , 2 ] } \n"), r#"{"a":[1,2]}"#);
    }

    #[test]
    fn get_and_as_str() {
        let v = parse_preserving(r#"{"a": "x", "b": 1}"#).unwrap();
        assert_eq!(v.get("a").and_then(Json::as_str), Some("x"));
        assert_eq!(v.get("b").and_then(Json::as_str), None);
        assert_eq!(v.get("c"), None);
        assert_eq!(Json::Null.get("a"), None);
    }
}
