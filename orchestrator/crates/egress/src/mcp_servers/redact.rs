//! Credentials out of everything a remote MCP server says.
//!
//! A server may repeat the node's credentials (its bearer token, a configured header value) in
//! anything it sends: a result, an error, a tool's name, description or input schema. What it
//! says reaches callers (also readonly keys listing tools), models and audit reasons, so every
//! such value passes through one [`Redactor`] before anything else sees it. Redaction works on
//! values, never on their serialisation: a secret holding `"` or `\` is escaped in JSON and
//! would no longer match there. Inside a string it also catches the encodings a client can
//! undo: JSON-escaped, percent-encoded and base64 (standard and URL-safe, with and without
//! padding); a string that is itself base64 (MCP's image, audio and blob content) is decoded,
//! redacted and encoded again.

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine as _;
use serde_json::Value;

/// What replaces a credential.
pub const MASK: &str = "***";

/// The credentials of one server's connection, and how to take them out of what it says.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// Each credential in every form it may take in a text, longest first.
    forms: Vec<String>,
    /// The credentials' bytes, for decoded base64 content.
    raw: Vec<Vec<u8>>,
}

impl Redactor {
    /// A redactor of `secrets` (shorter than 4 bytes: ignored, they would mask ordinary text).
    pub fn new<I, S>(secrets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut forms = Vec::new();
        let mut raw = Vec::new();
        for secret in secrets {
            let secret = secret.as_ref();
            if secret.len() < 4 {
                continue;
            }
            raw.push(secret.as_bytes().to_vec());
            let escaped = serde_json::to_string(secret).unwrap_or_default();
            let escaped = escaped
                .strip_prefix('"')
                .and_then(|e| e.strip_suffix('"'))
                .unwrap_or(secret)
                .to_owned();
            let bytes = secret.as_bytes();
            for form in [
                secret.to_owned(),
                escaped,
                percent_encoded(secret),
                STANDARD.encode(bytes),
                STANDARD_NO_PAD.encode(bytes),
                URL_SAFE.encode(bytes),
                URL_SAFE_NO_PAD.encode(bytes),
            ] {
                if form.len() >= 4 && !forms.contains(&form) {
                    forms.push(form);
                }
            }
        }
        // Longest first: a form that contains another is masked whole.
        forms.sort_by_key(|f| std::cmp::Reverse(f.len()));
        raw.sort_by_key(|r| std::cmp::Reverse(r.len()));
        Self { forms, raw }
    }

    /// True when there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// `text` with every form of every credential masked.
    pub fn text(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for form in &self.forms {
            if out.contains(form.as_str()) {
                out = out.replace(form.as_str(), MASK);
            }
        }
        if let Some(decoded) = self.base64_redacted(&out) {
            return decoded;
        }
        out
    }

    /// Redacts every string of `value` in place, object keys included.
    pub fn value(&self, value: &mut Value) {
        if self.is_empty() {
            return;
        }
        match value {
            Value::String(s) => {
                let clean = self.text(s);
                if clean != *s {
                    *s = clean;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.value(v)),
            Value::Object(map) => {
                let dirty: Vec<String> = map
                    .keys()
                    .filter(|k| self.text(k) != **k)
                    .cloned()
                    .collect();
                for key in dirty {
                    if let Some(v) = map.remove(&key) {
                        map.insert(self.text(&key), v);
                    }
                }
                map.values_mut().for_each(|v| self.value(v));
            }
            _ => {}
        }
    }

    /// When `text` is base64 (as MCP carries bytes) whose bytes hold a credential: the bytes
    /// with it masked, encoded again the same way.
    fn base64_redacted(&self, text: &str) -> Option<String> {
        if text.len() < 8 || text.len() % 4 == 1 {
            return None;
        }
        let engines: [&base64::engine::GeneralPurpose; 4] =
            [&STANDARD, &URL_SAFE, &STANDARD_NO_PAD, &URL_SAFE_NO_PAD];
        for engine in engines {
            let Ok(bytes) = engine.decode(text) else {
                continue;
            };
            let masked = self.bytes(&bytes)?;
            return Some(engine.encode(masked));
        }
        None
    }

    /// `bytes` with every credential masked, or `None` when they hold none.
    fn bytes(&self, bytes: &[u8]) -> Option<Vec<u8>> {
        let mut out = bytes.to_vec();
        let mut changed = false;
        for secret in &self.raw {
            while let Some(at) = out
                .windows(secret.len())
                .position(|w| w == secret.as_slice())
            {
                out.splice(at..at + secret.len(), MASK.bytes());
                changed = true;
            }
        }
        changed.then_some(out)
    }
}

/// `text` percent-encoded as a URL component (every byte but the unreserved ones).
fn percent_encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SECRET: &str = "team-1\"q\\z";

    #[test]
    fn a_secret_with_quotes_and_backslashes_goes_in_every_form() {
        let r = Redactor::new([SECRET, "tok-abcdef"]);
        let mut v = json!({
            "text": format!("header was {SECRET}"),
            "nested": [{"k": format!("a{}b", percent_encoded(SECRET))}],
            "b64": STANDARD.encode(format!("x {SECRET} y")),
            "standalone": format!("auth {}", URL_SAFE_NO_PAD.encode(SECRET)),
            "tok-abcdef": "a key that is the token",
        });
        r.value(&mut v);
        let out = v.to_string();
        assert!(!out.contains("team-1"), "{out}");
        assert!(!out.contains("tok-abcdef"), "{out}");
        assert!(!out.contains(&percent_encoded(SECRET)), "{out}");
        let decoded = STANDARD.decode(v["b64"].as_str().unwrap()).unwrap();
        assert_eq!(decoded, b"x *** y");
        assert_eq!(v["text"], "header was ***");
        // The escaped form, as it would appear inside a serialised text.
        let escaped = serde_json::to_string(&json!({"a": SECRET})).unwrap();
        assert!(!r.text(&escaped).contains("team-1"));
    }

    #[test]
    fn ordinary_text_and_short_values_stay() {
        let r = Redactor::new(["abc", "longer-secret"]);
        assert_eq!(r.text("abc and friends"), "abc and friends");
        let mut v = json!({"data": STANDARD.encode(b"plain bytes here")});
        let before = v.clone();
        r.value(&mut v);
        assert_eq!(v, before);
    }
}
