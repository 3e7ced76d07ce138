//! The manifest JSON Schemas and the schema stage of parsing.
//!
//! The schemas are hand-written files under `schemas/` (DESIGN.md §5: not derived from Rust
//! types), embedded at build time so the binary serves and enforces exactly what it was built
//! with. Each is parsed and compiled once, on first use.
//!
//! The validator's raw messages print whole instances and schema fragments; an author needs the
//! path, the line and one sentence. So every violation is turned into a [`ManifestError`] here:
//! an unknown key points at the key itself, a missing key at where it should be (the pointer
//! names the key, the line is that of the object that lacks it), and a
//! value that fails a `pattern` is explained with the description of the schema definition it
//! failed (which says in words what the pattern means).

use std::sync::LazyLock;

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::{Draft, ValidationError, Validator};
use serde_json::Value;

use super::error::{ManifestError, Stage};
use super::{pointer, ManifestKind};

/// Keys of the schemas this module serves, as used by `aegis.schema.get`.
pub const SCHEMA_KEYS: &[&str] = &["agent/manifest/v1", "workflow/manifest/v1"];

static AGENT_SCHEMA: LazyLock<Value> = LazyLock::new(|| {
    serde_json::from_str(include_str!("../../../../schemas/agent/manifest/v1.json"))
        .expect("schemas/agent/manifest/v1.json is valid JSON (checked by a unit test)")
});

static WORKFLOW_SCHEMA: LazyLock<Value> = LazyLock::new(|| {
    serde_json::from_str(include_str!(
        "../../../../schemas/workflow/manifest/v1.json"
    ))
    .expect("schemas/workflow/manifest/v1.json is valid JSON (checked by a unit test)")
});

static AGENT_VALIDATOR: LazyLock<Validator> = LazyLock::new(|| compile(&AGENT_SCHEMA));
static WORKFLOW_VALIDATOR: LazyLock<Validator> = LazyLock::new(|| compile(&WORKFLOW_SCHEMA));

fn compile(schema: &Value) -> Validator {
    jsonschema::options()
        .with_draft(Draft::Draft202012)
        .build(schema)
        .expect("embedded manifest schemas compile (checked by a unit test)")
}

/// The embedded schema with this key (`agent/manifest/v1` or `workflow/manifest/v1`).
pub fn schema(key: &str) -> Option<&'static Value> {
    match key {
        "agent/manifest/v1" => Some(&AGENT_SCHEMA),
        "workflow/manifest/v1" => Some(&WORKFLOW_SCHEMA),
        _ => None,
    }
}

/// The schema document of a manifest kind.
pub(crate) fn document(kind: ManifestKind) -> &'static Value {
    match kind {
        ManifestKind::Agent => &AGENT_SCHEMA,
        ManifestKind::Workflow => &WORKFLOW_SCHEMA,
    }
}

/// Every schema violation of `value`, without positions.
pub(crate) fn validate(kind: ManifestKind, value: &Value) -> Vec<ManifestError> {
    // A manifest of the other kind would fail on nearly every key; say the one thing that matters.
    if let Some(found) = value.get("kind").and_then(Value::as_str) {
        let other = match kind {
            ManifestKind::Agent => ManifestKind::Workflow,
            ManifestKind::Workflow => ManifestKind::Agent,
        };
        if found == other.as_str() {
            return vec![ManifestError::new(
                Stage::Schema,
                "/kind",
                format!(
                    "this is a {found} manifest; expected kind `{}` here",
                    kind.as_str()
                ),
            )];
        }
    }
    let validator: &Validator = match kind {
        ManifestKind::Agent => &AGENT_VALIDATOR,
        ManifestKind::Workflow => &WORKFLOW_VALIDATOR,
    };
    let schema = document(kind);
    let mut empty = Vec::new();
    let mut errors = Vec::new();
    for error in validator.iter_errors(value) {
        if matches!(error.kind(), ValidationErrorKind::MinLength { .. }) {
            empty.push(error.instance_path().as_str().to_owned());
        }
        let is_pattern = matches!(error.kind(), ValidationErrorKind::Pattern { .. });
        errors.extend(
            describe(schema, &error)
                .into_iter()
                .map(|e| (e, is_pattern)),
        );
    }
    // An empty string also fails the pattern of a non-blank string; "must not be empty" says it.
    errors
        .into_iter()
        .filter(|(e, is_pattern)| !(*is_pattern && empty.contains(&e.pointer)))
        .map(|(e, _)| e)
        .collect()
}

/// Turns one validator error into one or more manifest errors.
fn describe(schema: &Value, error: &ValidationError<'_>) -> Vec<ManifestError> {
    let at = error.instance_path().as_str().to_owned();
    let instance = error.instance();
    let one = |message: String| vec![ManifestError::new(Stage::Schema, at.clone(), message)];
    match error.kind() {
        ValidationErrorKind::AdditionalProperties { unexpected }
        | ValidationErrorKind::UnevaluatedProperties { unexpected } => unexpected
            .iter()
            .map(|key| {
                ManifestError::new(
                    Stage::Schema,
                    pointer::join(&at, key),
                    unknown_key_message(schema, error, key),
                )
            })
            .collect(),
        ValidationErrorKind::Required { property } => {
            // Named by the pointer of the missing key; its line is the enclosing object's.
            let key = property
                .as_str()
                .map_or_else(|| property.to_string(), str::to_owned);
            vec![ManifestError::new(
                Stage::Schema,
                pointer::join(&at, &key),
                format!("missing required key `{key}`"),
            )]
        }
        ValidationErrorKind::FalseSchema => {
            let key = at.rsplit('/').next().unwrap_or_default();
            one(format!(
                "`{key}` is not allowed here{}",
                false_schema_reason(error)
            ))
        }
        ValidationErrorKind::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(t) => t.to_string(),
                TypeKind::Multiple(ts) => {
                    let names: Vec<String> = ts.iter().map(|t| t.to_string()).collect();
                    names.join(" or ")
                }
            };
            one(format!(
                "expected {}, found {}",
                article(&expected),
                type_name(instance)
            ))
        }
        ValidationErrorKind::Enum { options } => {
            let list = match options.as_ref() {
                Value::Array(items) => items.iter().map(show).collect::<Vec<_>>().join(", "),
                other => show(other),
            };
            one(format!("{} is not one of: {list}", show(instance)))
        }
        ValidationErrorKind::Constant { expected_value } => one(format!(
            "must be {}, found {}",
            show(expected_value),
            show(instance)
        )),
        ValidationErrorKind::Not { .. } if own_description(schema, error).is_some() => {
            // A forbidden combination: the `not` schema says why in its own description.
            one(own_description(schema, error)
                .unwrap_or_default()
                .to_owned())
        }
        ValidationErrorKind::Pattern { .. } | ValidationErrorKind::Not { .. } => {
            let meaning = definition_description(schema, error)
                .map(|d| format!(": expected {}", lowercase_first(d)))
                .unwrap_or_else(|| match error.kind() {
                    ValidationErrorKind::Pattern { pattern } => {
                        format!(" does not match the pattern `{pattern}`")
                    }
                    _ => " is not allowed here".to_owned(),
                });
            one(format!("{} is not valid{meaning}", show(instance)))
        }
        _ => one(bound_message(error).unwrap_or_else(|| shorten(&error.masked().to_string()))),
    }
}

/// The message of a size or range bound the value breaks (lengths, counts, uniqueness,
/// numeric limits); `None` for an error of another kind.
fn bound_message(error: &ValidationError<'_>) -> Option<String> {
    let instance = error.instance();
    let message = match error.kind() {
        ValidationErrorKind::MinLength { limit } => Counted::Characters.at_least(*limit),
        ValidationErrorKind::MaxLength { limit } => Counted::Characters.at_most(*limit),
        ValidationErrorKind::MinItems { limit } => Counted::Items.at_least(*limit),
        ValidationErrorKind::MaxItems { limit: 0 } => {
            format!("must be empty here{}", false_schema_reason(error))
        }
        ValidationErrorKind::MaxItems { limit } => Counted::Items.at_most(*limit),
        ValidationErrorKind::MinProperties { limit } => Counted::Entries.at_least(*limit),
        ValidationErrorKind::MaxProperties { limit } => Counted::Entries.at_most(*limit),
        ValidationErrorKind::UniqueItems => "items must be unique".to_owned(),
        ValidationErrorKind::Minimum { limit } => {
            format!("{} is below the minimum {limit}", show(instance))
        }
        ValidationErrorKind::Maximum { limit } => {
            format!("{} is above the maximum {limit}", show(instance))
        }
        ValidationErrorKind::ExclusiveMinimum { limit } => {
            format!("{} must be greater than {limit}", show(instance))
        }
        ValidationErrorKind::ExclusiveMaximum { limit } => {
            format!("{} must be less than {limit}", show(instance))
        }
        _ => return None,
    };
    Some(message)
}

/// What a size bound counts: a string's characters, a list's items or an object's entries; one
/// wording for the lower and upper bounds of all three.
#[derive(Clone, Copy)]
enum Counted {
    Characters,
    Items,
    Entries,
}

impl Counted {
    fn at_least(self, limit: u64) -> String {
        match (self, limit) {
            (Counted::Items, 1) => "must not be an empty list".to_owned(),
            (_, 1) => "must not be empty".to_owned(),
            (Counted::Characters, _) => format!("must be at least {limit} characters long"),
            (_, _) => format!("must have at least {limit} {}", self.noun()),
        }
    }

    fn at_most(self, limit: u64) -> String {
        match self {
            Counted::Characters => format!("must be at most {limit} characters long"),
            _ => format!("must have at most {limit} {}", self.noun()),
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Counted::Characters => "characters",
            Counted::Items => "items",
            Counted::Entries => "entries",
        }
    }
}

/// "unknown key `x`" with the allowed keys, or for a map whose keys follow a pattern, the
/// pattern they must match.
fn unknown_key_message(schema: &Value, error: &ValidationError<'_>, key: &str) -> String {
    // The keyword location ends in `additionalProperties`; its siblings `properties` and
    // `patternProperties` say what is allowed.
    let object = pointer::parent(error.schema_path().as_str()).and_then(|p| schema.pointer(p));
    let names = |keyword: &str| {
        object
            .and_then(|o| o.get(keyword))
            .and_then(Value::as_object)
            .map(|props| props.keys().map(String::as_str).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let (allowed, patterns) = (names("properties"), names("patternProperties"));
    if allowed.is_empty() && !patterns.is_empty() {
        let patterns: Vec<String> = patterns.iter().map(|p| format!("`{p}`")).collect();
        return format!(
            "invalid key `{key}`: keys here must match {}",
            patterns.join(" or ")
        );
    }
    match allowed.len() {
        1..=24 => format!("unknown key `{key}` (allowed: {})", allowed.join(", ")),
        _ => format!("unknown key `{key}`"),
    }
}

/// Why a key is refused by a `false` schema or an empty-list rule: these come from `if`/`then`
/// combinations, whose `if` says which other key forbids it.
fn false_schema_reason(error: &ValidationError<'_>) -> String {
    let path = error.schema_path().as_str();
    if path.contains("/then/") {
        " in combination with the other keys of this object".to_owned()
    } else {
        String::new()
    }
}

/// The `description` inside the failing keyword's own subschema (for `not`).
fn own_description<'s>(schema: &'s Value, error: &ValidationError<'_>) -> Option<&'s str> {
    schema
        .pointer(error.schema_path().as_str())?
        .get("description")?
        .as_str()
}

/// The `description` of the schema object that holds the failing keyword.
fn definition_description<'s>(schema: &'s Value, error: &ValidationError<'_>) -> Option<&'s str> {
    let mut path = pointer::parent(error.schema_path().as_str())?;
    // `not: {pattern}` fails at `.../not`; the description sits beside `not`.
    loop {
        let object = schema.pointer(path)?;
        if let Some(description) = object.get("description").and_then(Value::as_str) {
            return Some(description);
        }
        let last = path.rsplit('/').next()?;
        if !matches!(last, "not" | "allOf" | "anyOf" | "oneOf") && last.parse::<usize>().is_err() {
            return None;
        }
        path = pointer::parent(path)?;
    }
}

/// "A DNS-label-like name." -> "a DNS-label-like name", leaving acronyms ("JSON ...") alone.
fn lowercase_first(s: &str) -> String {
    let s = s.trim_end_matches('.');
    let first_word = s.split(' ').next().unwrap_or_default();
    let acronym = first_word.chars().count() > 1 && !first_word.chars().any(char::is_lowercase);
    let mut chars = s.chars();
    match chars.next() {
        Some(first) if !acronym => first.to_lowercase().chain(chars).collect(),
        _ => s.to_owned(),
    }
}

fn article(type_names: &str) -> String {
    let first = type_names.split(' ').next().unwrap_or_default();
    let word = if first.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    format!("{word} {type_names}")
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// A short rendering of a value for messages: scalars as they are, collections by kind.
fn show(value: &Value) -> String {
    match value {
        Value::String(s) => format!("`{}`", shorten(s)),
        Value::Array(_) => "a list".to_owned(),
        Value::Object(_) => "a mapping".to_owned(),
        other => format!("`{other}`"),
    }
}

fn shorten(s: &str) -> String {
    const MAX: usize = 120;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut}...")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn embedded_schemas_parse_and_compile() {
        for key in SCHEMA_KEYS {
            let schema = schema(key).expect("known key");
            assert_eq!(
                schema["$schema"],
                "https://json-schema.org/draft/2020-12/schema"
            );
            jsonschema::meta::validate(schema).expect("schema is valid against its meta-schema");
        }
        assert!(validate(ManifestKind::Agent, &json!({})).len() >= 4);
        assert!(schema("tools/cmd.run").is_none());
    }

    #[test]
    fn messages_point_at_keys_and_explain_patterns() {
        let errors = validate(
            ManifestKind::Agent,
            &json!({"apiVersion": "100monkeys.ai/v1", "kind": "Agent",
                "metadata": {"name": "Bad_Name", "version": "1.0.0", "colour": "red"},
                "spec": {"runtime": {"language": "python", "version": "3.11"}}}),
        );
        let find = |p: &str| {
            errors
                .iter()
                .find(|e| e.pointer == p)
                .unwrap_or_else(|| panic!("no error at {p}: {errors:?}"))
        };
        assert!(find("/metadata/colour")
            .message
            .starts_with("unknown key `colour` (allowed: "));
        assert!(
            find("/metadata/name").message.contains("DNS-label"),
            "{errors:?}"
        );
        assert_eq!(find("/spec/task").message, "missing required key `task`");
    }

    #[test]
    fn the_other_kind_is_one_clear_error() {
        let errors = validate(ManifestKind::Agent, &json!({"kind": "Workflow"}));
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].pointer, "/kind");
    }
}
