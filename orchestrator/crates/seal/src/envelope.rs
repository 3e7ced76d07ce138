//! The SEAL envelope: parsing the wire object, and the checks that need nothing but the envelope
//! itself and a public key (freshness, Ed25519 signature).
//!
//! The envelope is parsed from the raw request text with the lexeme-preserving parser of
//! [`super::canonical`], because the signature is over canonical bytes rebuilt from the parsed
//! value, never over the HTTP body (which Python sends with `", "` separators and
//! `ensure_ascii=True`). Every structural problem is a 1000 `MALFORMED_ENVELOPE` that names the
//! field; a signature that does not verify is 1001; a timestamp outside the window is 1003
//! (the RFC has no dedicated code; both SDK verifiers use 1003, and the message says how far off
//! the clock was).
//!
//! What this module does not do: find the session, verify the token, or remember signatures for
//! replay protection. Those need state and belong to the gateway. A replay cache can key on
//! [`Envelope::signature`]: Ed25519 is deterministic and the strict Base64 decoding here admits
//! exactly one text per signature, so a replayed envelope has a byte-identical signature.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use chrono::DateTime;
use ed25519_dalek::{Signature, VerifyingKey};
use serde_json::{json, Value};

use super::canonical::{parse_preserving, signed_message, signed_message_with, Escaping, Json};
use super::error::{SealCode, SealError, PROTOCOL};

/// DER prefix of an Ed25519 SubjectPublicKeyInfo (`SEQUENCE { SEQUENCE { OID 1.3.101.112 },
/// BIT STRING }`); the raw 32-byte key follows it.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// A parsed, structurally valid SEAL envelope (notes §1.1).
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// Always `seal/v1` once parsed.
    pub protocol: String,
    /// The compact JWT from attestation.
    pub security_token: String,
    /// Standard Base64 of the 64-byte Ed25519 signature, as received.
    pub signature: String,
    /// The MCP JSON-RPC message, numbers kept as written.
    pub payload: Json,
    /// The ISO 8601 timestamp as received.
    pub timestamp: String,
    /// `timestamp` as Unix seconds, fraction dropped: the integer that was signed.
    pub unix_secs: i64,
}

fn malformed(message: impl Into<String>) -> SealError {
    SealError::new(SealCode::MalformedEnvelope, message)
}

fn string_field<'a>(object: &'a Json, field: &str) -> Result<&'a str, SealError> {
    match object.get(field) {
        None => Err(malformed(format!("the envelope has no `{field}` field"))),
        Some(Json::String(s)) => Ok(s),
        Some(_) => Err(malformed(format!(
            "the envelope's `{field}` must be a string"
        ))),
    }
}

/// Parses an RFC 3339 UTC timestamp (any number of fraction digits, `Z` or `+00:00`) into Unix
/// seconds, fraction dropped.
fn parse_timestamp(text: &str) -> Result<i64, SealError> {
    let parsed = DateTime::parse_from_rfc3339(text).map_err(|e| {
        malformed(format!(
            "the envelope's `timestamp` `{text}` is not an RFC 3339 time ({e}); \
             expected e.g. 2026-02-17T14:32:01.583Z"
        ))
    })?;
    if parsed.offset().local_minus_utc() != 0 {
        return Err(malformed(format!(
            "the envelope's `timestamp` `{text}` is not in UTC; end it with `Z` or `+00:00`"
        )));
    }
    Ok(parsed.timestamp())
}

/// Checks that `payload` looks like an MCP JSON-RPC request, as the TypeScript verifier does.
fn check_payload(payload: &Json) -> Result<(), SealError> {
    if !matches!(payload, Json::Object(_)) {
        return Err(malformed("the envelope's `payload` must be a JSON object"));
    }
    match payload.get("jsonrpc") {
        Some(Json::String(_)) => {}
        Some(_) => return Err(malformed("`payload.jsonrpc` must be a string")),
        None => return Err(malformed("`payload` has no `jsonrpc` field")),
    }
    match payload.get("method") {
        Some(Json::String(_)) => {}
        Some(_) => return Err(malformed("`payload.method` must be a string")),
        None => return Err(malformed("`payload` has no `method` field")),
    }
    match payload.get("id") {
        Some(Json::String(_) | Json::Number(_)) => {}
        Some(_) => return Err(malformed("`payload.id` must be a string or a number")),
        None => return Err(malformed("`payload` has no `id` field")),
    }
    match payload.get("params") {
        None | Some(Json::Object(_)) => Ok(()),
        Some(_) => Err(malformed("`payload.params` must be an object")),
    }
}

impl Envelope {
    /// Parses the request body text of an invocation. Every structural problem is a 1000 that
    /// names the field: not JSON (or duplicate keys), a missing or wrong-typed field, a protocol
    /// other than `seal/v1`, an empty token or signature, an unparseable or non-UTC timestamp, or
    /// a payload that is not an MCP request object. Unknown extra top-level fields are ignored.
    pub fn parse(body: &str) -> Result<Envelope, SealError> {
        let root = parse_preserving(body)
            .map_err(|e| malformed(format!("the envelope is not valid JSON: {e}")))?;
        if !matches!(root, Json::Object(_)) {
            return Err(malformed("the envelope must be a JSON object"));
        }
        let protocol = string_field(&root, "protocol")?;
        if protocol != PROTOCOL {
            return Err(malformed(format!(
                "unsupported protocol `{protocol}`; this gateway speaks `{PROTOCOL}`"
            ))
            .with_details(json!({"protocol": protocol})));
        }
        let security_token = string_field(&root, "security_token")?;
        if security_token.is_empty() {
            return Err(malformed("the envelope's `security_token` is empty"));
        }
        let signature = string_field(&root, "signature")?;
        if signature.is_empty() {
            return Err(malformed("the envelope's `signature` is empty"));
        }
        let timestamp = string_field(&root, "timestamp")?;
        let unix_secs = parse_timestamp(timestamp)?;
        let payload = root
            .get("payload")
            .ok_or_else(|| malformed("the envelope has no `payload` field"))?;
        check_payload(payload)?;
        Ok(Envelope {
            protocol: protocol.to_owned(),
            security_token: security_token.to_owned(),
            signature: signature.to_owned(),
            payload: payload.clone(),
            timestamp: timestamp.to_owned(),
            unix_secs,
        })
    }

    /// Refuses (1003) an envelope whose timestamp is more than `window_secs` from `now_unix`, in
    /// either direction; exactly `window_secs` off is accepted.
    pub fn check_freshness(&self, now_unix: i64, window_secs: i64) -> Result<(), SealError> {
        let skew = now_unix.saturating_sub(self.unix_secs);
        if skew.unsigned_abs() <= window_secs.unsigned_abs() {
            return Ok(());
        }
        let direction = if skew > 0 {
            format!("{skew} s in the past")
        } else {
            format!("{} s in the future", skew.unsigned_abs())
        };
        Err(SealError::new(
            SealCode::TokenExpired,
            format!(
                "timestamp outside the allowed window: `{}` is {direction}; \
                 the window is ±{window_secs} s (check the client's clock)",
                self.timestamp
            ),
        )
        .with_details(json!({
            "timestamp": self.timestamp,
            "skew_seconds": skew,
            "window_seconds": window_secs,
        })))
    }

    /// The exact bytes the client signed (notes §1.2).
    pub fn signed_message(&self) -> Vec<u8> {
        signed_message(&self.payload, &self.security_token, self.unix_secs)
    }

    /// Verifies the Ed25519 signature over the canonical message with the session's key.
    /// A signature that is not strict standard Base64 of 64 bytes is 1000; one that does not
    /// verify (or a key that is not a valid curve point) is 1001.
    pub fn verify_signature(&self, public_key: &[u8; 32]) -> Result<(), SealError> {
        let raw = STANDARD.decode(&self.signature).map_err(|e| {
            malformed(format!(
                "the envelope's `signature` is not standard Base64 ({e})"
            ))
        })?;
        let bytes: [u8; 64] = raw.as_slice().try_into().map_err(|_| {
            malformed(format!(
                "the envelope's `signature` decodes to {} bytes; an Ed25519 signature has 64",
                raw.len()
            ))
        })?;
        let invalid = || {
            SealError::new(
                SealCode::InvalidSignature,
                "signature verification failed: the envelope was not signed by this session's \
                 key, or was changed after signing",
            )
        };
        let key = VerifyingKey::from_bytes(public_key).map_err(|_| invalid())?;
        let signature = Signature::from_bytes(&bytes);
        let message = self.signed_message();
        if key.verify_strict(&message, &signature).is_ok() {
            return Ok(());
        }
        // A client that signed with `ensure_ascii=True` escaped its non-ASCII text (and DEL);
        // only then can the escaped form differ.
        if message.iter().any(|&b| b > 0x7e) {
            let escaped = signed_message_with(
                &self.payload,
                &self.security_token,
                self.unix_secs,
                Escaping::Ascii,
            );
            if key.verify_strict(&escaped, &signature).is_ok() {
                return Ok(());
            }
        }
        Err(invalid())
    }

    /// The payload's `id` (string or number), for the response and error bodies.
    pub fn request_id(&self) -> Option<Value> {
        self.payload.get("id").map(Json::to_value)
    }

    /// The JSON-RPC method (`tools/call`, `tools/list`, ...).
    pub fn method(&self) -> &str {
        self.payload
            .get("method")
            .and_then(Json::as_str)
            .unwrap_or("")
    }

    /// For `tools/call`: the tool name and its arguments (`{}` when the call has none).
    /// `None` for other methods or when `params.name` is not a string.
    pub fn tool_call(&self) -> Option<(String, Value)> {
        if self.method() != "tools/call" {
            return None;
        }
        let params = self.payload.get("params")?;
        let name = params.get("name")?.as_str()?.to_owned();
        let arguments = params
            .get("arguments")
            .map(Json::to_value)
            .unwrap_or_else(|| json!({}));
        Some((name, arguments))
    }
}

/// Decodes a client's Ed25519 public key. Accepted forms: standard Base64 of the raw 32 bytes
/// (what the SDKs send), URL-safe Base64 without padding, Base64 of the 44-byte SPKI DER, a PEM
/// `PUBLIC KEY` block holding that DER, and 64 hex digits. The key must be a valid, non-weak
/// curve point. Anything else is 3002 with a message that lists the accepted forms.
pub fn decode_public_key(b64: &str) -> Result<[u8; 32], SealError> {
    let text = b64.trim();
    let candidate = raw_key_bytes(text).ok_or_else(|| {
        SealError::new(
            SealCode::AttestationFailed,
            "the public key is not an Ed25519 key in a known encoding; send standard Base64 of \
             the raw 32-byte key (44 characters), or Base64/PEM SPKI DER, or 64 hex digits",
        )
    })?;
    match VerifyingKey::from_bytes(&candidate) {
        Ok(key) if !key.is_weak() => Ok(candidate),
        _ => Err(SealError::new(
            SealCode::AttestationFailed,
            "the public key is not a usable Ed25519 key (not a valid curve point, or of small \
             order)",
        )),
    }
}

fn raw_key_bytes(text: &str) -> Option<[u8; 32]> {
    if let Some(body) = text
        .strip_prefix("-----BEGIN PUBLIC KEY-----")
        .and_then(|rest| rest.trim_end().strip_suffix("-----END PUBLIC KEY-----"))
    {
        let joined: String = body.split_whitespace().collect();
        return STANDARD
            .decode(joined)
            .ok()
            .and_then(|der| from_der_or_raw(&der));
    }
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        let mut out = [0u8; 32];
        for (i, pair) in text.as_bytes().chunks(2).enumerate() {
            let pair = std::str::from_utf8(pair).ok()?;
            out[i] = u8::from_str_radix(pair, 16).ok()?;
        }
        return Some(out);
    }
    STANDARD
        .decode(text)
        .ok()
        .or_else(|| URL_SAFE_NO_PAD.decode(text).ok())
        .and_then(|bytes| from_der_or_raw(&bytes))
}

fn from_der_or_raw(bytes: &[u8]) -> Option<[u8; 32]> {
    match bytes.len() {
        32 => bytes.try_into().ok(),
        44 if bytes[..12] == ED25519_SPKI_PREFIX => bytes[12..].try_into().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::tests::rfc_c2_message;
    use ed25519_dalek::{Signer, SigningKey};

    const C1_SECRET: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    const C1_PUBLIC_B64: &str = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
    const V1_TOKEN: &str = "eyJhbGciOiJFZERTQSIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ0ZXN0LWFnZW50LTEyMyIsInNjcCI6InJlYWQtb25seS1yZXNlYXJjaCIsIndpZCI6ImRvY2tlcjovL3Rlc3QiLCJpYXQiOjE3MDgyNjE5MjEsImV4cCI6MTcwODI2NTUyMX0.signature_placeholder";
    const V1_PAYLOAD: &str = r#"{"jsonrpc":"2.0","id":"req-test-001","method":"tools/call","params":{"name":"fs.read","arguments":{"path":"/workspace/test.txt"}}}"#;

    fn hex32(text: &str) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }

    fn c1_key() -> SigningKey {
        SigningKey::from_bytes(&hex32(C1_SECRET))
    }

    fn c1_public() -> [u8; 32] {
        decode_public_key(C1_PUBLIC_B64).unwrap()
    }

    fn sha256_hex(bytes: &[u8]) -> String {
        use sha2::Digest;
        sha2::Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn envelope_json(token: &str, signature: &str, payload: &str, timestamp: &str) -> String {
        format!(
            r#"{{"protocol": "seal/v1", "security_token": "{token}", "signature": "{signature}", "payload": {payload}, "timestamp": "{timestamp}"}}"#
        )
    }

    /// Builds and signs an envelope as the Python SDK does, for `unix_secs`.
    fn signed_envelope(key: &SigningKey, token: &str, payload: &str, timestamp: &str) -> String {
        let unix = parse_timestamp(timestamp).unwrap();
        let message = signed_message(&parse_preserving(payload).unwrap(), token, unix);
        let sig = STANDARD.encode(key.sign(&message).to_bytes());
        envelope_json(token, &sig, payload, timestamp)
    }

    #[test]
    fn c1_ed25519_vector_verifies() {
        let key = c1_key();
        let public = key.verifying_key();
        assert_eq!(STANDARD.encode(public.to_bytes()), C1_PUBLIC_B64);
        assert_eq!(
            public.to_bytes(),
            hex32("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
        );
        let sig = STANDARD
            .decode("5VZDAMNgrHKQhuLMgG6CioSHfx645dl02HPgZSJJAVVfuIIVkKM7rMYeOXAc+bRr0lv18FlbviRlUUFDjnoQCw==")
            .unwrap();
        let sig = Signature::from_slice(&sig).unwrap();
        assert_eq!(key.sign(b""), sig);
        assert!(public.verify_strict(b"", &sig).is_ok());
    }

    #[test]
    fn c2_signature_with_c1_key() {
        // (timestamp, SHA-256 of the message, its signature with the C.1 key): the RFC's
        // timestamp, and a second one.
        let vectors = [
            (
                1708261921,
                "f49043299f12f278397fa2502fb1566432c506c83a162bc271b3666f8618b837",
                "xsXhC8K7RAOQCHv3t5gSqF6yZ2Slz5jYV829jP6aZ8JFuZy1V5Qk1/q2gjBgS9DHp6fIKhSSpSjh+g6wXtU1BQ==",
            ),
            (
                1771338721,
                "9ac57c1e814eb8618edb7de3b5199fb05d95369ddc223253d4e7c559ca22032a",
                "+rPLyaiWuUf4qpH5Ie5Ft6kF6JAUYUOg53coP8OxZFgzqdWpbMpG7FFr3RqlWh8x+8fHFYmjBBrVDoGZ0FWWBw==",
            ),
        ];
        for (unix_secs, digest, signature) in vectors {
            let message = rfc_c2_message(unix_secs);
            assert_eq!(sha256_hex(&message), digest, "at {unix_secs}");
            let signed = STANDARD.encode(c1_key().sign(&message).to_bytes());
            assert_eq!(signed, signature, "at {unix_secs}");
        }
    }

    #[test]
    fn vector1_canonical_message_and_signature_with_both_timestamps() {
        let payload = parse_preserving(V1_PAYLOAD).unwrap();
        let at_rfc_integer = signed_message(&payload, V1_TOKEN, 1708261921);
        assert_eq!(
            String::from_utf8(at_rfc_integer.clone()).unwrap(),
            format!(
                r#"{{"payload":{{"id":"req-test-001","jsonrpc":"2.0","method":"tools/call","params":{{"arguments":{{"path":"/workspace/test.txt"}},"name":"fs.read"}}}},"security_token":"{V1_TOKEN}","timestamp":1708261921}}"#
            )
        );
        assert_eq!(at_rfc_integer.len(), 387);
        assert_eq!(
            sha256_hex(&at_rfc_integer),
            "50fb4c4ea42d5da99c880a714d4e2a1fca97d1d6e3f2cd42e6d3c0a4f8219f0e"
        );

        // The ISO timestamp the vector gives is really 1771338721; the envelope path uses it.
        let sig_iso = "lGV64vx5+YO6VNOqb4jvHX0Q5aNxdxcoRt+onxpgB6T4zSBiAv2XYrKo1P+DT+tNrH5Ce9qt32/dvU3oeWToDg==";
        let env = Envelope::parse(&envelope_json(
            V1_TOKEN,
            sig_iso,
            V1_PAYLOAD,
            "2026-02-17T14:32:01.000Z",
        ))
        .unwrap();
        assert_eq!(env.unix_secs, 1771338721);
        assert_eq!(
            sha256_hex(&env.signed_message()),
            "c615789048ac7bd1e1a3ed20df077f1f7dddda9d4b998a9e21b2dddf793c88c7"
        );
        env.verify_signature(&c1_public()).unwrap();
        env.check_freshness(1771338721 + 30, 30).unwrap();

        // The RFC's integer: verify the computed signature over those bytes directly.
        let sig_rfc = "+fYPYqJqonlj29Zk2C+FV54nYaaGCvQ4y0Pt9JYlTfX943l/diPADP3sQHrFn2lOeA0j1OEn2oX01zKiPQ1+DA==";
        assert_eq!(
            STANDARD.encode(c1_key().sign(&at_rfc_integer).to_bytes()),
            sig_rfc
        );
        let rfc_env = Envelope {
            unix_secs: 1708261921,
            signature: sig_rfc.into(),
            ..env.clone()
        };
        rfc_env.verify_signature(&c1_public()).unwrap();
        // The same signature does not hold for the other timestamp.
        let swapped = Envelope {
            signature: sig_rfc.into(),
            ..env
        };
        assert_eq!(
            swapped.verify_signature(&c1_public()).unwrap_err().code,
            SealCode::InvalidSignature
        );
    }

    #[test]
    fn vector2_tampered_payload_is_1001() {
        let sig_iso = "lGV64vx5+YO6VNOqb4jvHX0Q5aNxdxcoRt+onxpgB6T4zSBiAv2XYrKo1P+DT+tNrH5Ce9qt32/dvU3oeWToDg==";
        let tampered = V1_PAYLOAD.replace("/workspace/test.txt", "/etc/passwd");
        let env = Envelope::parse(&envelope_json(
            V1_TOKEN,
            sig_iso,
            &tampered,
            "2026-02-17T14:32:01.000Z",
        ))
        .unwrap();
        let e = env.verify_signature(&c1_public()).unwrap_err();
        assert_eq!(e.code, SealCode::InvalidSignature);
        assert!(e.message.contains("signature verification failed"));
    }

    #[test]
    fn wrong_key_is_1001() {
        let text = signed_envelope(&c1_key(), "t.t.t", V1_PAYLOAD, "2026-02-17T14:32:01.583Z");
        let env = Envelope::parse(&text).unwrap();
        env.verify_signature(&c1_public()).unwrap();
        let other = SigningKey::from_bytes(&[7u8; 32])
            .verifying_key()
            .to_bytes();
        assert_eq!(
            env.verify_signature(&other).unwrap_err().code,
            SealCode::InvalidSignature
        );
    }

    #[test]
    fn python_wire_body_verifies_with_preserved_numbers() {
        // What `requests` sends: ", " / ": " separators, ASCII escapes; the client signed the
        // compact, raw-UTF-8, sorted form with the same number text.
        let payload = r#"{"jsonrpc": "2.0", "id": "req-00ff", "method": "tools/call", "params": {"name": "fs.write", "arguments": {"path": "caf\u00e9/\u65e5.txt", "content": "a\nb \"q\"", "ratio": 1e-05, "big": 18446744073709551616, "neg": -0.0}}}"#;
        let text = signed_envelope(&c1_key(), "tok", payload, "2026-02-17T14:32:01.123456Z");
        let env = Envelope::parse(&text).unwrap();
        let message = String::from_utf8(env.signed_message()).unwrap();
        assert!(
            message.contains(r#""big":18446744073709551616"#),
            "{message}"
        );
        assert!(message.contains(r#""ratio":1e-05"#), "{message}");
        assert!(message.contains(r#""path":"café/日.txt""#), "{message}");
        assert!(message.contains(r#""content":"a\nb \"q\"""#), "{message}");
        env.verify_signature(&c1_public()).unwrap();
        let (name, args) = env.tool_call().unwrap();
        assert_eq!(name, "fs.write");
        assert_eq!(args["path"], "café/日.txt");
        assert_eq!(env.request_id(), Some(json!("req-00ff")));
        assert_eq!(env.method(), "tools/call");
    }

    #[test]
    fn signatures_over_either_escaping_of_non_ascii_text_verify() {
        // What Python signs with `ensure_ascii` on and off for the same payload (checked against
        // CPython's json.dumps: with it on, 0x7f and astral characters are escaped too).
        let payload = r#"{"jsonrpc":"2.0","id":"r1","method":"tools/call","params":{"name":"fs.write","arguments":{"path":"/workspace/café/😀\u007f.txt","content":"日本"}}}"#;
        let parsed = parse_preserving(payload).unwrap();
        let utf8 = String::from_utf8(signed_message(&parsed, "tok", 1771338721)).unwrap();
        let ascii = String::from_utf8(signed_message_with(
            &parsed,
            "tok",
            1771338721,
            Escaping::Ascii,
        ))
        .unwrap();
        assert!(utf8.contains("café/😀\u{7f}.txt"), "{utf8}");
        assert!(
            ascii.contains(r#"caf\u00e9/\ud83d\ude00\u007f.txt"#),
            "{ascii}"
        );
        assert!(ascii.contains(r#""content":"\u65e5\u672c""#), "{ascii}");
        assert!(ascii.is_ascii());
        for message in [utf8, ascii] {
            let sig = STANDARD.encode(c1_key().sign(message.as_bytes()).to_bytes());
            let env = Envelope::parse(&envelope_json(
                "tok",
                &sig,
                payload,
                "2026-02-17T14:32:01.000Z",
            ))
            .unwrap();
            env.verify_signature(&c1_public()).unwrap();
            let tampered = Envelope::parse(&envelope_json(
                "tok",
                &sig,
                &payload.replace("日本", "日本!"),
                "2026-02-17T14:32:01.000Z",
            ))
            .unwrap();
            assert_eq!(
                tampered.verify_signature(&c1_public()).unwrap_err().code,
                SealCode::InvalidSignature
            );
        }
    }

    #[test]
    fn python_generated_vector_verifies() {
        // Made by the Python SDK's exact calls (C.1 key): `json.dumps(env, allow_nan=False)` on
        // the wire, the canonical form signed. Escapes, astral keys, 0x7f, U+2028 and Python
        // float/int reprs all have to round-trip for the signature to hold.
        let body = r#"{"protocol": "seal/v1", "security_token": "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ0ZXN0In0.c2lnbmF0dXJl", "signature": "ezMmaKxDo0Xm/wXq1CJIz67qK2aL6sHkdvPbGT11EOAtfFamdL6pO5dD7zsXsGhR35yL8+euszX5FC8yuDbWAg==", "payload": {"jsonrpc": "2.0", "id": "req-0123456789abcdef", "method": "tools/call", "params": {"name": "fs.write", "arguments": {"path": "caf\u00e9/\ud83d\ude00 \u2028.txt", "content": "line1\nq\"b\\s/\u0000\u001f\u007f\t\b\f\r", "ratio": 1e-05, "small": 1e-07, "big": 18446744073709551616, "neg": -0.0, "f": 1.5, "list": [3, {"z": 1, "a": null, "\u00e9": true, "Z": false}], "\ud7ff": 1, "\ud800\udc00": 2, "\ufffd": 3}}}, "timestamp": "2026-02-17T14:32:01.583Z"}"#;
        let env = Envelope::parse(body).unwrap();
        let message = env.signed_message();
        assert_eq!(message.len(), 442);
        assert_eq!(
            sha256_hex(&message),
            "4389c5bffdb1508a5cd88d19f673e0393544f71e176b91389e1ec0e0e792fbbe"
        );
        env.verify_signature(&c1_public()).unwrap();
    }

    #[test]
    fn timestamps_parse_in_every_sdk_shape() {
        for (text, unix) in [
            ("2026-02-17T14:32:01.000Z", 1771338721),
            ("2026-02-17T14:32:01.999Z", 1771338721),
            ("2026-02-17T14:32:01.123456Z", 1771338721),
            ("2026-02-17T14:32:01Z", 1771338721),
            ("2026-02-17T14:32:01.583+00:00", 1771338721),
            ("2024-02-18T13:12:01.000Z", 1708261921),
        ] {
            assert_eq!(parse_timestamp(text).unwrap(), unix, "{text}");
        }
        for text in [
            "2026-02-17 14:32",
            "1708261921",
            "2026-02-17T14:32:01",
            "2026-02-17T15:32:01+01:00",
            "",
        ] {
            assert_eq!(
                parse_timestamp(text).unwrap_err().code,
                SealCode::MalformedEnvelope,
                "{text}"
            );
        }
    }

    #[test]
    fn freshness_window_is_inclusive_both_ways() {
        let text = signed_envelope(&c1_key(), "t", V1_PAYLOAD, "2026-02-17T14:32:01.000Z");
        let env = Envelope::parse(&text).unwrap();
        let ts = env.unix_secs;
        env.check_freshness(ts, 30).unwrap();
        env.check_freshness(ts + 30, 30).unwrap();
        env.check_freshness(ts - 30, 30).unwrap();
        let stale = env.check_freshness(ts + 31, 30).unwrap_err();
        assert_eq!(stale.code, SealCode::TokenExpired);
        assert!(stale.message.contains("outside the allowed window"));
        assert!(
            stale.message.contains("31 s in the past"),
            "{}",
            stale.message
        );
        let future = env.check_freshness(ts - 31, 30).unwrap_err();
        assert_eq!(future.code, SealCode::TokenExpired);
        assert!(
            future.message.contains("31 s in the future"),
            "{}",
            future.message
        );
        assert_eq!(
            env.check_freshness(i64::MIN, 30).unwrap_err().code,
            SealCode::TokenExpired
        );
        assert_eq!(
            env.check_freshness(i64::MAX, 30).unwrap_err().code,
            SealCode::TokenExpired
        );
    }

    #[test]
    fn structural_problems_are_1000_naming_the_field() {
        let good = envelope_json("t", "s", V1_PAYLOAD, "2026-02-17T14:32:01.000Z");
        assert!(Envelope::parse(&good).is_ok());
        let cases: Vec<(String, &str)> = vec![
            ("not json".into(), "not valid JSON"),
            ("[]".into(), "JSON object"),
            (good.replace("seal/v1", "seal/v2"), "unsupported protocol"),
            (good.replace(r#""protocol": "seal/v1", "#, ""), "`protocol`"),
            (
                good.replace(r#""security_token": "t""#, r#""security_token": 5"#),
                "`security_token`",
            ),
            (
                good.replace(r#""security_token": "t""#, r#""security_token": """#),
                "`security_token` is empty",
            ),
            (good.replace(r#""signature": "s", "#, ""), "`signature`"),
            (
                good.replace("2026-02-17T14:32:01.000Z", "yesterday"),
                "`timestamp`",
            ),
            (
                good.replace(V1_PAYLOAD, "[]"),
                "`payload` must be a JSON object",
            ),
            (good.replace(V1_PAYLOAD, "{}"), "`jsonrpc`"),
            (
                good.replace(r#""jsonrpc":"2.0""#, r#""jsonrpc":2"#),
                "`payload.jsonrpc`",
            ),
            (
                good.replace(r#""method":"tools/call""#, r#""method":null"#),
                "`payload.method`",
            ),
            (
                good.replace(r#""id":"req-test-001""#, r#""id":null"#),
                "`payload.id`",
            ),
            (good.replace(r#""id":"req-test-001","#, ""), "no `id`"),
            (
                good.replace(
                    r#""params":{"name":"fs.read","arguments":{"path":"/workspace/test.txt"}}"#,
                    r#""params":[1]"#,
                ),
                "`payload.params`",
            ),
            (
                good.replace(
                    r#""protocol": "seal/v1","#,
                    r#""protocol": "seal/v1", "protocol": "seal/v1","#,
                ),
                "duplicate key",
            ),
        ];
        for (text, needle) in cases {
            let e = Envelope::parse(&text).unwrap_err();
            assert_eq!(e.code, SealCode::MalformedEnvelope, "{text}");
            assert!(
                e.message.contains(needle),
                "{needle:?} not in {:?}",
                e.message
            );
        }
        // A numeric id and extra top-level fields are fine.
        let numeric = good.replace(r#""id":"req-test-001""#, r#""id":7"#);
        let env =
            Envelope::parse(&numeric.replace("{\"protocol\"", "{\"x\": 1, \"protocol\"")).unwrap();
        assert_eq!(env.request_id(), Some(json!(7)));
    }

    #[test]
    fn bad_signature_encoding_is_1000() {
        for sig in [
            "not base64!",
            "AAAA",
            // URL-safe alphabet and missing padding are not standard Base64.
            "-_-_",
            "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo",
        ] {
            let env = Envelope::parse(&envelope_json("t", sig, V1_PAYLOAD, "2026-02-17T14:32:01Z"))
                .unwrap();
            assert_eq!(
                env.verify_signature(&c1_public()).unwrap_err().code,
                SealCode::MalformedEnvelope,
                "{sig}"
            );
        }
    }

    #[test]
    fn tool_call_extraction() {
        let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        let env = Envelope::parse(&envelope_json("t", "s", list, "2026-02-17T14:32:01Z")).unwrap();
        assert_eq!(env.method(), "tools/list");
        assert_eq!(env.tool_call(), None);
        let bare = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"aegis.agent.list"}}"#;
        let env = Envelope::parse(&envelope_json("t", "s", bare, "2026-02-17T14:32:01Z")).unwrap();
        assert_eq!(
            env.tool_call(),
            Some(("aegis.agent.list".into(), json!({})))
        );
        let nameless = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#;
        let env =
            Envelope::parse(&envelope_json("t", "s", nameless, "2026-02-17T14:32:01Z")).unwrap();
        assert_eq!(env.tool_call(), None);
    }

    #[test]
    fn public_keys_in_every_accepted_form() {
        let raw = c1_public();
        let spki: Vec<u8> = ED25519_SPKI_PREFIX
            .iter()
            .chain(raw.iter())
            .copied()
            .collect();
        let pem = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            STANDARD.encode(&spki)
        );
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        for form in [
            C1_PUBLIC_B64.to_owned(),
            URL_SAFE_NO_PAD.encode(raw),
            STANDARD.encode(&spki),
            pem,
            hex.clone(),
            hex.to_uppercase(),
        ] {
            assert_eq!(decode_public_key(&form).unwrap(), raw, "{form}");
        }
        for bad in [
            "",
            "abc",
            &STANDARD.encode([1u8; 31]),
            &STANDARD.encode([1u8; 64]),
            &"zz".repeat(32),
            // The identity point is of small order.
            &STANDARD.encode({
                let mut id = [0u8; 32];
                id[0] = 1;
                id
            }),
        ] {
            let e = decode_public_key(bad).unwrap_err();
            assert_eq!(e.code, SealCode::AttestationFailed, "{bad}");
        }
    }
}
