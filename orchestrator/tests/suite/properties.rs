//! Property tests (a short fuzzing run on every `cargo test`) of the two parsers that read
//! untrusted text: the SEAL envelope / canonical-form parser and the manifest parser.
//!
//! Inputs are generated from a seeded PRNG, so a failure is reproducible: the panic message
//! names the seed and the case. `PROPERTY_CASES` (default 400) and `PROPERTY_SEED` (default
//! fixed) widen or vary the run, e.g. `PROPERTY_CASES=200000 cargo test -p orchestrator --test suite -- properties::`.
//!
//! Properties:
//! - any JSON value, written in any wire style (compact or spaced, raw UTF-8 or `\u` escapes,
//!   `\/`, upper-case hex, any member order), parses to a value whose canonical form is the
//!   same, numbers kept as written; for integer-only values that form equals serde_json's
//!   sorted compact output (an independent implementation of the same rules);
//! - an envelope signed over either escaping of its canonical form verifies, whatever wire style
//!   carried it, and fails with 1001 after any change to its payload;
//! - mutated envelope text (bytes flipped, inserted, deleted, truncated; deep nesting) never
//!   panics: it parses, or it is refused with 1000 and a message;
//! - mutated manifests (lines dropped, doubled, re-indented, characters flipped, values replaced
//!   by other YAML types) never panic, and every error has a message and a line within the text;
//!   every valid example round-trips through its export.

use crate::common::any_node;
use base64::Engine as _;
use ed25519_dalek::{Signer, SigningKey};
use orchestrator::manifest::{self, ManifestKind};
use orchestrator::seal::canonical::{
    parse_preserving, signed_message_with, to_canonical, Escaping, Json,
};
use orchestrator::seal::{Envelope, SealCode};

fn cases() -> usize {
    std::env::var("PROPERTY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

fn seed() -> u64 {
    std::env::var("PROPERTY_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5ea1_0010)
}

/// Runs `property` on `cases()` inputs, naming seed and case on failure.
fn check(name: &str, property: impl Fn(&mut fastrand::Rng)) {
    let base = seed();
    for case in 0..cases() {
        let mut rng = fastrand::Rng::with_seed(base ^ (case as u64).wrapping_mul(0x9e37_79b9));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| property(&mut rng)));
        if let Err(e) = result {
            let text = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("property `{name}` failed at PROPERTY_SEED={base} case {case}: {text}");
        }
    }
}

const ALPHABET: &[char] = &[
    'a',
    'z',
    'A',
    '0',
    ' ',
    '"',
    '\\',
    '/',
    '\n',
    '\r',
    '\t',
    '\u{8}',
    '\u{c}',
    '\u{0}',
    '\u{1f}',
    '\u{7f}',
    'é',
    'ß',
    '日',
    '\u{2028}',
    '\u{fffd}',
    '\u{e000}',
    '😀',
    '\u{10ffff}',
    ':',
    ',',
    '{',
    '[',
];

fn string(rng: &mut fastrand::Rng) -> String {
    (0..rng.usize(0..12))
        .map(|_| ALPHABET[rng.usize(0..ALPHABET.len())])
        .collect()
}

fn number(rng: &mut fastrand::Rng, integers_only: bool) -> String {
    let mut n = String::new();
    if rng.bool() {
        n.push('-');
    }
    if rng.u8(0..4) == 0 {
        n.push('0');
    } else {
        n.push(char::from(b'1' + rng.u8(0..9)));
        for _ in 0..rng.usize(0..20) {
            n.push(char::from(b'0' + rng.u8(0..10)));
        }
    }
    if integers_only {
        if n == "-0" {
            n = "0".into();
        }
        // Stay within i64 so serde_json keeps it an integer.
        n.truncate(if n.starts_with('-') { 19 } else { 18 });
        return n;
    }
    if rng.bool() {
        n.push('.');
        for _ in 0..rng.usize(1..6) {
            n.push(char::from(b'0' + rng.u8(0..10)));
        }
    }
    if rng.u8(0..3) == 0 {
        n.push(if rng.bool() { 'e' } else { 'E' });
        match rng.u8(0..3) {
            0 => n.push('+'),
            1 => n.push('-'),
            _ => {}
        }
        n.push(char::from(b'0' + rng.u8(0..10)));
    }
    n
}

fn value(rng: &mut fastrand::Rng, depth: usize, integers_only: bool) -> Json {
    let leaf = depth >= 4 || rng.u8(0..3) == 0;
    match (leaf, rng.u8(0..6)) {
        (true, 0) => Json::Null,
        (true, 1) => Json::Bool(rng.bool()),
        (true, 2 | 3) => Json::Number(number(rng, integers_only)),
        (true, _) => Json::String(string(rng)),
        (false, 0..=2) => Json::Array(
            (0..rng.usize(0..4))
                .map(|_| value(rng, depth + 1, integers_only))
                .collect(),
        ),
        (false, _) => {
            let mut members: Vec<(String, Json)> = Vec::new();
            for _ in 0..rng.usize(0..5) {
                let key = string(rng);
                if members.iter().all(|(k, _)| *k != key) {
                    members.push((key, value(rng, depth + 1, integers_only)));
                }
            }
            Json::Object(members)
        }
    }
}

/// How a client might put a value on the wire.
#[derive(Clone, Copy)]
struct Style {
    spaced: bool,
    ascii: bool,
    escape_slash: bool,
    upper_hex: bool,
    shuffle: bool,
}

fn style(rng: &mut fastrand::Rng) -> Style {
    Style {
        spaced: rng.bool(),
        ascii: rng.bool(),
        escape_slash: rng.u8(0..4) == 0,
        upper_hex: rng.u8(0..4) == 0,
        shuffle: rng.bool(),
    }
}

fn write_string(s: &str, st: Style, out: &mut String) {
    let hex = |u: u32, out: &mut String| {
        if st.upper_hex {
            out.push_str(&format!("\\u{u:04X}"));
        } else {
            out.push_str(&format!("\\u{u:04x}"));
        }
    };
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if st.escape_slash => out.push_str("\\/"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => hex(c as u32, out),
            c if st.ascii && (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    hex(u32::from(*u), out);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_wire(v: &Json, st: Style, rng: &mut fastrand::Rng, out: &mut String) {
    let (comma, colon) = if st.spaced { (", ", ": ") } else { (",", ":") };
    match v {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => out.push_str(n),
        Json::String(s) => write_string(s, st, out),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(comma);
                }
                write_wire(item, st, rng, out);
            }
            out.push(']');
        }
        Json::Object(members) => {
            let mut order: Vec<usize> = (0..members.len()).collect();
            if st.shuffle {
                rng.shuffle(&mut order);
            }
            out.push('{');
            for (i, &m) in order.iter().enumerate() {
                if i > 0 {
                    out.push_str(comma);
                }
                write_string(&members[m].0, st, out);
                out.push_str(colon);
                write_wire(&members[m].1, st, rng, out);
            }
            out.push('}');
        }
    }
}

fn wire(v: &Json, st: Style, rng: &mut fastrand::Rng) -> String {
    let mut out = String::new();
    write_wire(v, st, rng, &mut out);
    out
}

#[test]
fn any_wire_style_parses_to_the_same_canonical_form() {
    check("canonical form is independent of the wire style", |rng| {
        let v = value(rng, 0, false);
        let expected = to_canonical(&v);
        let text = wire(&v, style(rng), rng);
        let parsed = parse_preserving(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(to_canonical(&parsed), expected, "{text}");
        // The canonical form is itself valid JSON with the same canonical form.
        let again = parse_preserving(&expected).unwrap();
        assert_eq!(to_canonical(&again), expected);
    });
}

#[test]
fn canonical_form_equals_serde_json_sorted_output_for_integers() {
    check("canonical form matches serde_json", |rng| {
        let v = value(rng, 0, true);
        let reference = serde_json::to_string(&v.to_value()).unwrap();
        assert_eq!(to_canonical(&v), reference);
    });
}

fn envelope_text(
    payload: &str,
    token: &str,
    signature: &str,
    timestamp: &str,
    spaced: bool,
) -> String {
    let (c, k) = if spaced { (", ", ": ") } else { (",", ":") };
    format!(
        "{{\"protocol\"{k}\"seal/v1\"{c}\"security_token\"{k}\"{token}\"{c}\"signature\"{k}\"{signature}\"{c}\"payload\"{k}{payload}{c}\"timestamp\"{k}\"{timestamp}\"}}"
    )
}

fn random_payload(rng: &mut fastrand::Rng) -> Json {
    Json::Object(vec![
        ("jsonrpc".into(), Json::String("2.0".into())),
        ("id".into(), Json::String(format!("req-{}", rng.u32(..)))),
        ("method".into(), Json::String("tools/call".into())),
        (
            "params".into(),
            Json::Object(vec![
                ("name".into(), Json::String("fs.write".into())),
                (
                    "arguments".into(),
                    Json::Object(vec![
                        ("content".into(), Json::String(string(rng))),
                        ("data".into(), value(rng, 1, false)),
                    ]),
                ),
            ]),
        ),
    ])
}

#[test]
fn envelopes_signed_over_either_escaping_verify_and_any_change_breaks_them() {
    check("signatures", |rng| {
        let mut seed = [0u8; 32];
        rng.fill(&mut seed);
        let key = SigningKey::from_bytes(&seed);
        let public = key.verifying_key().to_bytes();
        let payload = random_payload(rng);
        let token = "hdr.claims.sig";
        let escaping = if rng.bool() {
            Escaping::Ascii
        } else {
            Escaping::Utf8
        };
        let message = signed_message_with(&payload, token, 1_771_338_721, escaping);
        let signature =
            base64::engine::general_purpose::STANDARD.encode(key.sign(&message).to_bytes());
        let st = style(rng);
        let text = envelope_text(
            &wire(&payload, st, rng),
            token,
            &signature,
            "2026-02-17T14:32:01.583Z",
            st.spaced,
        );
        let env = Envelope::parse(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        env.verify_signature(&public)
            .unwrap_or_else(|e| panic!("{e}: {text}"));

        // Change the content: it no longer verifies.
        let mut changed = payload.clone();
        if let Json::Object(m) = &mut changed {
            m[1].1 = Json::String(format!("req-other-{}", rng.u32(..)));
        }
        let text = envelope_text(
            &wire(&changed, st, rng),
            token,
            &signature,
            "2026-02-17T14:32:01.583Z",
            st.spaced,
        );
        let env = Envelope::parse(&text).unwrap();
        assert_eq!(
            env.verify_signature(&public).unwrap_err().code,
            SealCode::InvalidSignature
        );
    });
}

fn mutate(rng: &mut fastrand::Rng, text: &str) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    for _ in 0..rng.usize(1..6) {
        if bytes.is_empty() {
            break;
        }
        let at = rng.usize(0..bytes.len());
        match rng.u8(0..5) {
            0 => bytes[at] = rng.u8(..),
            1 => bytes.insert(at, b"{}[]\",:\\0e-.nt \n"[rng.usize(0..16)]),
            2 => {
                bytes.remove(at);
            }
            3 => bytes.truncate(at),
            _ => {
                let end = (at + rng.usize(1..20)).min(bytes.len());
                let chunk = bytes[at..end].to_vec();
                bytes.splice(at..at, chunk);
            }
        }
    }
    bytes
}

#[test]
fn mutated_envelopes_never_panic_and_refusals_are_1000() {
    let key = SigningKey::from_bytes(&[7u8; 32]);
    let public = key.verifying_key().to_bytes();
    check("envelope robustness", |rng| {
        let payload = random_payload(rng);
        let message = signed_message_with(&payload, "t.t.t", 1_771_338_721, Escaping::Utf8);
        let signature =
            base64::engine::general_purpose::STANDARD.encode(key.sign(&message).to_bytes());
        let text = envelope_text(
            &to_canonical(&payload),
            "t.t.t",
            &signature,
            "2026-02-17T14:32:01.583Z",
            rng.bool(),
        );
        let bytes = mutate(rng, &text);
        let Ok(mutated) = String::from_utf8(bytes) else {
            return; // The transports refuse non-UTF-8 before the parser.
        };
        match Envelope::parse(&mutated) {
            Ok(env) => {
                let _ = env.verify_signature(&public);
                let _ = env.check_freshness(1_771_338_721, 30);
                let _ = env.tool_call();
            }
            Err(e) => {
                assert_eq!(e.code, SealCode::MalformedEnvelope, "{mutated}");
                assert!(!e.message.is_empty());
            }
        }
    });
    // Nesting far deeper than the limit is refused, not a stack overflow.
    for open in ["[", "{\"a\":"] {
        let deep = open.repeat(100_000);
        let e = Envelope::parse(&deep).unwrap_err();
        assert_eq!(e.code, SealCode::MalformedEnvelope);
    }
}

fn examples(dir: &str) -> Vec<(ManifestKind, String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas/examples");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root.join(dir)).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.ends_with(".yaml") {
            continue;
        }
        let kind = if name.starts_with("workflow") {
            ManifestKind::Workflow
        } else {
            ManifestKind::Agent
        };
        out.push((kind, name, std::fs::read_to_string(&path).unwrap()));
    }
    assert!(!out.is_empty());
    out
}

const REPLACEMENTS: &[&str] = &[
    "",
    "~",
    "null",
    "true",
    "0",
    "-1",
    "1e999",
    "\"\"",
    "[]",
    "{}",
    "[1, [2, [3]]]",
    "*a",
    "&a x",
    "!!binary aGk=",
    "|\n  x",
    "'it''s'",
    "\"\\u0000\"",
    "0x1F",
    ".inf",
    "9999999999999999999999",
];

fn mutate_manifest(rng: &mut fastrand::Rng, text: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for _ in 0..rng.usize(1..4) {
        if lines.is_empty() {
            break;
        }
        let at = rng.usize(0..lines.len());
        match rng.u8(0..6) {
            0 => {
                lines.remove(at);
            }
            1 => {
                let copy = lines[at].clone();
                lines.insert(at, copy);
            }
            2 => lines[at] = format!("{}{}", " ".repeat(rng.usize(0..5)), lines[at].trim_start()),
            3 => {
                let mut chars: Vec<char> = lines[at].chars().collect();
                if !chars.is_empty() {
                    let i = rng.usize(0..chars.len());
                    chars[i] = ['-', ':', '"', '\'', '[', '{', '#', '&', '*', '!', '\t', 'é']
                        [rng.usize(0..12)];
                }
                lines[at] = chars.into_iter().collect();
            }
            _ => {
                if let Some((key, _)) = lines[at].split_once(':') {
                    lines[at] =
                        format!("{key}: {}", REPLACEMENTS[rng.usize(0..REPLACEMENTS.len())]);
                }
            }
        }
    }
    lines.join("\n")
}

#[test]
fn mutated_manifests_never_panic_and_errors_point_into_the_text() {
    let sources: Vec<(ManifestKind, String, String)> = examples("valid")
        .into_iter()
        .chain(examples("invalid"))
        .collect();
    check("manifest robustness", |rng| {
        let (kind, name, text) = &sources[rng.usize(0..sources.len())];
        let mutated = mutate_manifest(rng, text);
        let line_count = mutated.lines().count().max(1);
        if let Err(errors) = manifest::parse(*kind, &mutated, &any_node()) {
            assert!(!errors.0.is_empty(), "{name}: an error without errors");
            for e in &errors.0 {
                assert!(!e.message.is_empty(), "{name}: empty message");
                if let Some(line) = e.line {
                    assert!(
                        (1..=line_count + 1).contains(&line),
                        "{name}: line {line} outside 1..={line_count}\n{mutated}"
                    );
                }
            }
        }
    });
}

#[test]
fn valid_examples_round_trip_through_their_export() {
    for (kind, name, text) in examples("valid") {
        let parsed =
            manifest::parse(kind, &text, &any_node()).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let again = manifest::parse(kind, &parsed.yaml, &any_node())
            .unwrap_or_else(|e| panic!("{name} export: {e:?}"));
        assert_eq!(again.value, parsed.value, "{name}");
    }
}
