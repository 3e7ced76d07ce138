//! Credentials out of everything a remote MCP server says.
//!
//! A server may repeat the node's credentials (its bearer token, a configured header value) in
//! anything it sends: a result, an error, a tool's name, description or schemas. What it says
//! reaches callers (also readonly keys listing tools), models and audit reasons, so every such
//! value passes through one [`Redactor`] where it enters the node (a listing when it is taken,
//! a result or an error when it arrives), before anything else sees it.
//!
//! Redaction works on values, never on a serialisation of them: a secret holding `"` or `\` is
//! escaped in JSON and would no longer match there. Inside each string (object keys too) it
//! finds a credential however a client could get it back:
//! - as it is;
//! - JSON-escaped (`\"`, `\\`, `\/`, `\u0022`, surrogate pairs), as in a JSON text inside a
//!   text;
//! - percent-encoded, wholly or in part, in either case of hex (`+` as a space when a
//!   credential holds one), and JSON-escaped inside percent-encoding or the reverse;
//! - in base64 (standard and URL-safe alphabets, padded or not) at any byte offset within the
//!   encoded bytes: the characters that carry the credential's bits are masked wherever they
//!   stand in a text, with the partial characters at either end;
//! - inside bytes: a string that is base64 as a whole (MCP's image, audio and blob content, a
//!   `blob` field, a `data:` URL) is decoded, its bytes redacted in all the forms above, and
//!   encoded again the same way.
//!
//! What is masked becomes [`MASK`]. A credential shorter than [`MIN_SECRET`] bytes is not
//! looked for (it would mask ordinary text).

use std::ops::Range;

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::engine::GeneralPurpose;
use base64::Engine as _;
use serde_json::{Map, Value};

/// What replaces a credential.
pub const MASK: &str = "***";
/// Shortest credential looked for, bytes.
pub const MIN_SECRET: usize = 4;
/// Shortest run of base64 characters that stands for a credential at an offset (shorter runs
/// would match ordinary base64 by chance).
const MIN_BASE64_RUN: usize = 6;
/// How deep base64 inside base64 is opened.
const MAX_BYTES_DEPTH: usize = 2;

/// A byte string to find, and whether a match reaches into the characters beside it.
#[derive(Debug, Clone, PartialEq)]
struct Needle {
    bytes: Vec<u8>,
    /// A base64 run whose first character before it also holds bits of the credential.
    partial_before: bool,
    /// A base64 run whose first character after it also holds bits of the credential.
    partial_after: bool,
}

/// A decoded reading of a text: its bytes, and for each byte where the unit of the original it
/// came from starts (an escape, or a byte as it is). Units tile the original in order, so a
/// unit ends where the next one starts. Four bytes per byte of the text, one view at a time.
struct View {
    bytes: Vec<u8>,
    starts: Vec<u32>,
    /// The original's length.
    total: usize,
}

impl View {
    /// The span of the original that the view's bytes `r` came from.
    fn origin(&self, r: Range<usize>) -> Range<usize> {
        let last = self.starts[r.end - 1];
        let end = self.starts[r.end..]
            .iter()
            .find(|&&s| s > last)
            .map_or(self.total, |&s| s as usize);
        self.starts[r.start] as usize..end
    }

    /// `inner` (a decoding of this view's bytes) as a view of the original.
    fn compose(&self, inner: View) -> View {
        let starts = inner
            .starts
            .iter()
            .map(|&at| self.starts[at as usize])
            .collect();
        View {
            bytes: inner.bytes,
            starts,
            total: self.total,
        }
    }
}

/// One way a text may have encoded a credential.
#[derive(Debug, Clone, Copy)]
enum Decoding {
    /// `%XX`; with `+` as a space when the flag is set.
    Percent(bool),
    /// JSON string escapes.
    Json,
}

/// The credentials of one server's connection, and how to take them out of what it says.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// The credentials' bytes, longest first.
    secrets: Vec<Vec<u8>>,
    /// The credentials and their base64 runs at every offset, in both alphabets.
    needles: Vec<Needle>,
    /// A credential holds a space, so a `+` of form encoding may stand for one.
    plus_is_space: bool,
}

impl Redactor {
    /// A redactor of `secrets` (shorter than [`MIN_SECRET`] bytes: ignored).
    pub fn new<I, S>(secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        let mut secrets: Vec<Vec<u8>> = secrets
            .into_iter()
            .map(|s| s.as_ref().to_vec())
            .filter(|s| s.len() >= MIN_SECRET)
            .collect();
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        let mut needles: Vec<Needle> = Vec::new();
        for secret in &secrets {
            let plain = Needle {
                bytes: secret.clone(),
                partial_before: false,
                partial_after: false,
            };
            for needle in std::iter::once(plain).chain(base64_runs(secret)) {
                if !needles.contains(&needle) {
                    needles.push(needle);
                }
            }
        }
        let plus_is_space = secrets.iter().any(|s| s.contains(&b' '));
        Self {
            secrets,
            needles,
            plus_is_space,
        }
    }

    /// The redactor of a connection's credential headers: every value, and the token of an
    /// `Authorization: Bearer <token>` alone.
    pub fn for_headers(headers: &reqwest::header::HeaderMap) -> Self {
        let mut secrets: Vec<Vec<u8>> = Vec::new();
        for value in headers.values() {
            let bytes = value.as_bytes();
            secrets.push(bytes.to_vec());
            secrets.push(bytes.trim_ascii().to_vec());
            if bytes.len() > 7 && bytes[..7].eq_ignore_ascii_case(b"bearer ") {
                secrets.push(bytes[7..].trim_ascii().to_vec());
            }
        }
        Self::new(secrets)
    }

    /// True when there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// `text` with every form of every credential masked.
    pub fn text(&self, text: &str) -> String {
        if self.is_empty() {
            return text.to_owned();
        }
        match self.bytes(text.as_bytes(), 0) {
            Some(clean) => String::from_utf8_lossy(&clean).into_owned(),
            None => text.to_owned(),
        }
    }

    /// Redacts every string of `value` in place, object keys included.
    pub fn value(&self, value: &mut Value) {
        if self.is_empty() {
            return;
        }
        match value {
            Value::String(s) => {
                if let Some(clean) = self.bytes(s.as_bytes(), 0) {
                    *s = String::from_utf8_lossy(&clean).into_owned();
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.value(v)),
            Value::Object(map) => {
                if map.keys().any(|k| self.bytes(k.as_bytes(), 0).is_some()) {
                    let mut clean = Map::new();
                    for (key, v) in std::mem::take(map) {
                        let mut key = self.text(&key);
                        // Two keys masked alike stay two entries.
                        let base = key.clone();
                        let mut n = 1;
                        while clean.contains_key(&key) {
                            n += 1;
                            key = format!("{base}#{n}");
                        }
                        clean.insert(key, v);
                    }
                    *map = clean;
                }
                map.values_mut().for_each(|v| self.value(v));
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// `bytes` with every form of every credential masked, or `None` when they hold none.
    fn bytes(&self, bytes: &[u8], depth: usize) -> Option<Vec<u8>> {
        if let Some(clean) = self.whole_base64(bytes, depth) {
            return Some(clean);
        }
        let spans = self.spans(bytes);
        if spans.is_empty() {
            return None;
        }
        let mut out = Vec::with_capacity(bytes.len());
        let mut at = 0;
        for span in spans {
            out.extend_from_slice(&bytes[at..span.start]);
            out.extend_from_slice(MASK.as_bytes());
            at = span.end;
        }
        out.extend_from_slice(&bytes[at..]);
        Some(out)
    }

    /// The spans of `bytes` that carry a credential, in order and merged.
    fn spans(&self, bytes: &[u8]) -> Vec<Range<usize>> {
        let mut spans = Vec::new();
        self.find(bytes, |r| r, &mut spans);
        // Decoded readings, one (or two, one inside the other) at a time; a text longer than
        // 4 GiB is not decoded (no server response is allowed to be that large).
        if u32::try_from(bytes.len()).is_err() {
            return merge(spans);
        }
        for first in self.decodings(bytes) {
            let Some(view) = decoded(bytes, first) else {
                continue;
            };
            self.find(&view.bytes, |r| view.origin(r), &mut spans);
            for second in self.decodings(&view.bytes) {
                if let Some(inner) = decoded(&view.bytes, second) {
                    let inner = view.compose(inner);
                    self.find(&inner.bytes, |r| inner.origin(r), &mut spans);
                }
            }
        }
        merge(spans)
    }

    /// The decodings that could change `bytes`.
    fn decodings(&self, bytes: &[u8]) -> Vec<Decoding> {
        let mut decodings = Vec::new();
        if bytes.contains(&b'%') {
            decodings.push(Decoding::Percent(false));
        }
        if self.plus_is_space && bytes.contains(&b'+') {
            decodings.push(Decoding::Percent(true));
        }
        if bytes.contains(&b'\\') {
            decodings.push(Decoding::Json);
        }
        decodings
    }

    /// Every needle in `text`, its span mapped to the original by `origin`.
    fn find(
        &self,
        text: &[u8],
        origin: impl Fn(Range<usize>) -> Range<usize>,
        out: &mut Vec<Range<usize>>,
    ) {
        for needle in &self.needles {
            let n = needle.bytes.len();
            if n == 0 || n > text.len() {
                continue;
            }
            let first = needle.bytes[0];
            let mut from = 0;
            while let Some(offset) = text[from..=text.len() - n].iter().position(|&b| b == first) {
                let start = from + offset;
                if text[start..start + n] == needle.bytes[..] {
                    let mut span = start..start + n;
                    if needle.partial_before
                        && span.start > 0
                        && is_base64_char(text[span.start - 1])
                    {
                        span.start -= 1;
                    }
                    if needle.partial_after
                        && span.end < text.len()
                        && is_base64_char(text[span.end])
                    {
                        span.end += 1;
                    }
                    out.push(origin(span));
                }
                from = start + 1;
                if from > text.len() - n {
                    break;
                }
            }
        }
    }

    /// When all of `bytes` is base64 (alone or as a `data:` URL) and its decoded bytes hold a
    /// credential: those bytes redacted, encoded again the same way.
    fn whole_base64(&self, bytes: &[u8], depth: usize) -> Option<Vec<u8>> {
        if depth >= MAX_BYTES_DEPTH {
            return None;
        }
        let (prefix, encoded) = match find_subslice(bytes, b";base64,") {
            Some(at) if bytes.starts_with(b"data:") => bytes.split_at(at + b";base64,".len()),
            _ => (&bytes[..0], bytes),
        };
        // Line breaks (MIME) are allowed and dropped.
        let compact: Vec<u8> = encoded
            .iter()
            .copied()
            .filter(|b| !b.is_ascii_whitespace())
            .collect();
        if compact.len() < 8 || !compact.iter().all(|&b| is_base64_char(b) || b == b'=') {
            return None;
        }
        let engines: [&GeneralPurpose; 4] =
            [&STANDARD, &URL_SAFE, &STANDARD_NO_PAD, &URL_SAFE_NO_PAD];
        for engine in engines {
            let Ok(decoded) = engine.decode(&compact) else {
                continue;
            };
            let clean = self.bytes(&decoded, depth + 1)?;
            // The media type of a `data:` URL is the server's words too.
            let mut out = self
                .bytes(prefix, depth + 1)
                .unwrap_or_else(|| prefix.to_vec());
            out.extend_from_slice(engine.encode(clean).as_bytes());
            return Some(out);
        }
        None
    }
}

/// The base64 runs of `secret` at each byte offset (0, 1, 2) in the encoded bytes, in both
/// alphabets: the characters whose six bits are all the secret's, flagged when a character
/// beside them holds some of its bits too.
fn base64_runs(secret: &[u8]) -> Vec<Needle> {
    let mut runs = Vec::new();
    for offset in 0..3usize {
        let mut padded = vec![0u8; offset];
        padded.extend_from_slice(secret);
        let bits_before = 8 * offset;
        let bits_end = 8 * padded.len();
        let first = bits_before.div_ceil(6);
        let end = bits_end / 6;
        if end <= first || end - first < MIN_BASE64_RUN {
            continue;
        }
        for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
            let encoded = engine.encode(&padded);
            let Some(run) = encoded.as_bytes().get(first..end) else {
                continue;
            };
            let needle = Needle {
                bytes: run.to_vec(),
                partial_before: bits_before % 6 != 0,
                partial_after: bits_end % 6 != 0,
            };
            if !runs.contains(&needle) {
                runs.push(needle);
            }
        }
    }
    runs
}

/// A base64 character of either alphabet.
fn is_base64_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_')
}

/// `bytes` decoded by `decoding`; `None` when they are too long to index with `u32`.
fn decoded(bytes: &[u8], decoding: Decoding) -> Option<View> {
    u32::try_from(bytes.len()).ok()?;
    Some(match decoding {
        Decoding::Percent(plus_is_space) => percent_decoded(bytes, plus_is_space),
        Decoding::Json => json_unescaped(bytes),
    })
}

/// The position `at` of a text known to be shorter than 4 GiB ([`decoded`]).
fn pos(at: usize) -> u32 {
    u32::try_from(at).unwrap_or(u32::MAX)
}

/// What one unit of an encoded text (an escape) decodes to: the bytes of at most one
/// character, and how many bytes of the text it took.
struct Unit {
    bytes: [u8; 4],
    len: usize,
    took: usize,
}

impl Unit {
    /// One byte, from `took` bytes of the text.
    fn byte(b: u8, took: usize) -> Unit {
        Unit {
            bytes: [b, 0, 0, 0],
            len: 1,
            took,
        }
    }

    /// A character's UTF-8 bytes, from `took` bytes of the text.
    fn char(c: char, took: usize) -> Unit {
        let mut bytes = [0u8; 4];
        let len = c.encode_utf8(&mut bytes).len();
        Unit { bytes, len, took }
    }
}

/// `bytes` decoded unit by unit into a [`View`], as both decodings walk a text: `escape` reads
/// the unit at the start of what is left (`None`: its first byte stands for itself), and each
/// byte it decodes to remembers where its unit starts.
fn decode_units(bytes: &[u8], escape: impl Fn(&[u8]) -> Option<Unit>) -> View {
    let mut out = Vec::with_capacity(bytes.len());
    let mut starts = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let unit = escape(&bytes[i..]).unwrap_or_else(|| Unit::byte(bytes[i], 1));
        for &b in &unit.bytes[..unit.len] {
            out.push(b);
            starts.push(pos(i));
        }
        i += unit.took;
    }
    View {
        bytes: out,
        starts,
        total: bytes.len(),
    }
}

/// `bytes` percent-decoded (`%XX` in either case; `+` as a space when `plus_is_space`).
fn percent_decoded(bytes: &[u8], plus_is_space: bool) -> View {
    decode_units(bytes, |rest| match rest {
        [b'%', high, low, ..] => hex_digit(*high)
            .zip(hex_digit(*low))
            .map(|(h, l)| Unit::byte(h << 4 | l, 3)),
        [b'+', ..] if plus_is_space => Some(Unit::byte(b' ', 1)),
        _ => None,
    })
}

/// The value of a hex digit of either case.
fn hex_digit(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// `bytes` with JSON string escapes undone (`\"`, `\\`, `\/`, `\n` and the like, `\uXXXX` and
/// surrogate pairs); anything else as it is.
fn json_unescaped(bytes: &[u8]) -> View {
    decode_units(bytes, |rest| match rest {
        [b'\\', ..] => json_escape(rest).map(|(c, len)| Unit::char(c, len)),
        _ => None,
    })
}

/// The character of the JSON escape at the start of `bytes` and its length.
fn json_escape(bytes: &[u8]) -> Option<(char, usize)> {
    let simple = match *bytes.get(1)? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let unit = |at: usize| {
                bytes.get(at..at + 4)?.iter().try_fold(0u32, |acc, &b| {
                    hex_digit(b).map(|d| acc << 4 | u32::from(d))
                })
            };
            let high = unit(2)?;
            if (0xD800..0xDC00).contains(&high) {
                if bytes.get(6..8) == Some(b"\\u") {
                    let low = unit(8)?;
                    if (0xDC00..0xE000).contains(&low) {
                        let c = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
                        return Some((char::from_u32(c)?, 12));
                    }
                }
                return None;
            }
            return Some((char::from_u32(high)?, 6));
        }
        _ => return None,
    };
    Some((simple, 2))
}

/// The spans sorted, overlapping or touching ones joined.
fn merge(mut spans: Vec<Range<usize>>) -> Vec<Range<usize>> {
    spans.sort_by_key(|s| (s.start, s.end));
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(spans.len());
    for span in spans {
        match merged.last_mut() {
            Some(last) if span.start <= last.end => last.end = last.end.max(span.end),
            _ => merged.push(span),
        }
    }
    merged
}

/// Where `needle` first occurs in `haystack`.
fn find_subslice(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SECRET: &str = "team-1\"q\\z";

    /// `text` percent-encoded as a URL component (every byte but the unreserved ones).
    fn percent_encoded(text: &str) -> String {
        text.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    char::from(b).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    #[test]
    fn a_secret_with_quotes_and_backslashes_goes_in_every_form() {
        let r = Redactor::new([SECRET, "tok-abcdef"]);
        let mut v = json!({
            "text": format!("header was {SECRET}"),
            "nested": [{"k": format!("a{}b", percent_encoded(SECRET))}],
            "b64": STANDARD.encode(format!("x {SECRET} y")),
            "standalone": format!("auth {}", URL_SAFE_NO_PAD.encode(SECRET)),
            "tok-abcdef": "a key that is the token",
            "escaped": serde_json::to_string(&json!({"team": SECRET})).unwrap(),
        });
        r.value(&mut v);
        let out = v.to_string();
        assert!(!out.contains("team-1"), "{out}");
        assert!(!out.contains("tok-abcdef"), "{out}");
        assert!(!out.contains(&percent_encoded(SECRET)), "{out}");
        let decoded = STANDARD.decode(v["b64"].as_str().unwrap()).unwrap();
        assert_eq!(decoded, b"x *** y");
        assert_eq!(v["text"], "header was ***");
        assert_eq!(v["escaped"], "{\"team\":\"***\"}");
        assert_eq!(v["***"], "a key that is the token");
    }

    #[test]
    fn partial_and_mixed_encodings_are_found() {
        let r = Redactor::new([SECRET]);
        // Only the reserved bytes encoded, lower-case hex.
        assert_eq!(r.text("q=team-1%22q%5cz&x=1"), "q=***&x=1");
        // \u escapes.
        assert_eq!(r.text(r#"{"t":"team-1\u0022q\u005cz"}"#), r#"{"t":"***"}"#);
        // JSON-escaped, then percent-encoded (a JSON text in a query string).
        let nested = percent_encoded(&serde_json::to_string(SECRET).unwrap());
        assert!(!r.text(&nested).contains("team"), "{}", r.text(&nested));
        // Encoded twice.
        assert_eq!(r.text("q=team-1%2522q%255Cz"), "q=***");
        // A credential beyond ASCII, \u-escaped, and percent-encoded as UTF-8.
        let accented = Redactor::new(["clé-secrète"]);
        assert_eq!(accented.text(r#"["cl\u00e9-secr\u00E8te"]"#), r#"["***"]"#);
        assert_eq!(accented.text("k=cl%C3%A9-secr%c3%a8te."), "k=***.");
        // A space as `+` in a form.
        let spaced = Redactor::new(["two words here"]);
        assert_eq!(spaced.text("a=two+words+here&b"), "a=***&b");
    }

    #[test]
    fn base64_at_any_offset_inside_a_text_is_masked() {
        let r = Redactor::new([SECRET]);
        for prefix in ["", "a", "ab", "abc", "abcd"] {
            let bytes = format!("{prefix}{SECRET} and more");
            for engine in [&STANDARD, &URL_SAFE_NO_PAD] {
                let encoded = engine.encode(&bytes);
                let text = format!("token: {encoded}.");
                let clean = r.text(&text);
                assert!(clean.contains(MASK), "{prefix:?}: {clean}");
                // No run of the credential's own characters survives.
                for run in base64_runs(SECRET.as_bytes()) {
                    let run = String::from_utf8(run.bytes).unwrap();
                    assert!(!clean.contains(&run), "{prefix:?}: {clean}");
                }
            }
        }
    }

    #[test]
    fn bytes_in_base64_are_opened_redacted_and_encoded_again() {
        let r = Redactor::new([SECRET]);
        // Whole base64 whose bytes hold the secret escaped, at an offset no run covers.
        let json_bytes = serde_json::to_vec(&json!({"k": SECRET})).unwrap();
        let mut v = json!({
            "blob": STANDARD.encode(&json_bytes),
            "url": format!("data:image/png;base64,{}", STANDARD.encode([&b"\x89PNG"[..], SECRET.as_bytes()].concat())),
            "mime": STANDARD.encode(format!("{SECRET}{}", "x".repeat(80)))
                .as_bytes()
                .chunks(20)
                .map(|c| std::str::from_utf8(c).unwrap())
                .collect::<Vec<_>>()
                .join("\n"),
        });
        r.value(&mut v);
        let blob = STANDARD.decode(v["blob"].as_str().unwrap()).unwrap();
        assert_eq!(blob, br#"{"k":"***"}"#);
        let url = v["url"].as_str().unwrap();
        let png = STANDARD
            .decode(url.strip_prefix("data:image/png;base64,").unwrap())
            .unwrap();
        assert_eq!(png, b"\x89PNG***");
        let mut typed = json!(format!(
            "data:text/{SECRET};base64,{}",
            STANDARD.encode(SECRET)
        ));
        r.value(&mut typed);
        assert_eq!(
            typed,
            format!("data:text/***;base64,{}", STANDARD.encode(MASK))
        );
        let mime = STANDARD.decode(v["mime"].as_str().unwrap()).unwrap();
        assert!(mime.starts_with(b"***x"), "{mime:?}");
    }

    #[test]
    fn keys_masked_alike_stay_apart_and_headers_give_their_token() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            reqwest::header::HeaderValue::from_static("Bearer tok-12345"),
        );
        let r = Redactor::for_headers(&headers);
        // The whole header value, and the token alone.
        assert_eq!(r.text("Bearer tok-12345 / tok-12345"), "*** / ***");
        let mut v = json!({"a tok-12345": 1, "a %74ok-12345": 2});
        r.value(&mut v);
        assert_eq!(v, json!({"a ***": 2, "a ***#2": 1}));
    }

    #[test]
    fn ordinary_text_and_short_values_stay() {
        let r = Redactor::new(["abc", "longer-secret"]);
        assert_eq!(r.text("abc and friends"), "abc and friends");
        let mut v = json!({"data": STANDARD.encode(b"plain bytes here"), "q": "a%20b\\n"});
        let before = v.clone();
        r.value(&mut v);
        assert_eq!(v, before);
        assert!(Redactor::new(["abc"]).is_empty());
    }
}
