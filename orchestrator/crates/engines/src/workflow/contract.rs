//! The output contract of a workflow: `metadata.output_schema` checked against the final output.
//!
//! A workflow that declares an output schema promises its callers (a parent's Subworkflow state,
//! a delivery, a client reading `final_output`) a shape. A run whose final output breaks that
//! promise is not `completed`: it fails, and its reason names every violation by JSON pointer
//! and by what the schema expected (and the JSON type it got), never by the value itself, as
//! argument violations are described (`arguments.rs`). The schema was compiled once at deploy
//! time (`manifest/semantic.rs`), so a compile error here means the stored row is not one this
//! node deployed; it fails the run too, saying so.

use serde_json::Value;

/// Why a final output was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    /// `metadata.output_schema` does not compile (checked at deploy, so only a row written
    /// around the registry gets here).
    #[error("metadata.output_schema does not compile: {0}")]
    Schema(String),
    /// The final output breaks the schema: one entry per violation, `pointer: expectation`.
    #[error("the final output does not match metadata.output_schema: {}", .0.join("; "))]
    Violated(Vec<String>),
}

/// Checks `output` against `schema`; every violation is named by its JSON pointer (`/` for the
/// output as a whole) and the expectation it failed.
pub fn check_output(schema: &Value, output: &Value) -> Result<(), ContractError> {
    let validator =
        jsonschema::validator_for(schema).map_err(|e| ContractError::Schema(e.to_string()))?;
    let violations: Vec<String> = validator
        .iter_errors(output)
        .map(|e| {
            let pointer = e.instance_path().as_str().to_owned();
            let at = if pointer.is_empty() { "/" } else { &pointer };
            format!("{at}: {}", aegis_core::arguments::describe_violation(&e))
        })
        .collect();
    if violations.is_empty() {
        Ok(())
    } else {
        Err(ContractError::Violated(violations))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_matching_output_passes() {
        let schema = json!({"type": "object", "required": ["result"],
            "properties": {"result": {"type": "string"}}});
        check_output(&schema, &json!({"result": "ok"})).expect("matches");
    }

    #[test]
    fn violations_name_the_pointer_and_the_expectation_not_the_value() {
        let schema = json!({"type": "object", "required": ["result", "count"],
            "properties": {"result": {"type": "string", "pattern": "^[0-9]+$"}}});
        let err = check_output(&schema, &json!({"result": "secret-word"})).unwrap_err();
        let ContractError::Violated(v) = &err else {
            panic!("{err}")
        };
        assert_eq!(v.len(), 2, "{v:?}");
        let text = err.to_string();
        assert!(text.contains("/result: "), "{text}");
        assert!(text.contains("^[0-9]+$"), "{text}");
        assert!(
            text.contains("/: \"count\" is a required property"),
            "{text}"
        );
        assert!(!text.contains("secret-word"), "{text}");
    }

    #[test]
    fn a_schema_that_does_not_compile_is_said() {
        let err = check_output(&json!({"type": 7}), &json!({})).unwrap_err();
        assert!(matches!(err, ContractError::Schema(_)), "{err}");
    }
}
