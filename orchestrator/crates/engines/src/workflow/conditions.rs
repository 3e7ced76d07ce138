//! Transition conditions: the closed set of named predicates of the workflow manifest, evaluated
//! on the output of the state that just ended.
//!
//! The predicates follow the AEGIS worker (see the workflow notes): `on_success` and
//! `on_failure` read `status`, the exit code or `overall_success`; score conditions read `score`
//! (or `final_score`); `input_equals*` read a Human state's `response`; `custom` is Handlebars
//! truthiness of an expression over the blackboard plus `state_output`.

use serde_json::Value;

fn exit_code(out: &Value) -> Option<i64> {
    out.get("exit_code")
        .and_then(Value::as_i64)
        .or_else(|| out.pointer("/output/exit_code").and_then(Value::as_i64))
}

fn status(out: &Value) -> Option<&str> {
    out.get("status").and_then(Value::as_str)
}

fn score(out: &Value) -> f64 {
    out.get("score")
        .and_then(Value::as_f64)
        .or_else(|| out.get("final_score").and_then(Value::as_f64))
        .unwrap_or(0.0)
}

fn number(t: &Value, key: &str, default: f64) -> f64 {
    t.get(key).and_then(Value::as_f64).unwrap_or(default)
}

fn response(out: &Value) -> Option<String> {
    out.get("response")
        .and_then(Value::as_str)
        .map(|s| s.trim().to_lowercase())
}

/// True when transition `t` (its `condition` and parameters) matches `out`; `context` is the
/// render context of `custom` expressions.
pub fn matches(t: &Value, out: &Value, context: &Value) -> bool {
    let condition = t.get("condition").and_then(Value::as_str).unwrap_or("");
    match condition {
        "always" => true,
        "on_success" => {
            matches!(status(out), Some("completed" | "success"))
                || exit_code(out) == Some(0)
                || out.get("overall_success") == Some(&Value::Bool(true))
        }
        "on_failure" => {
            matches!(status(out), Some("failed" | "error"))
                || exit_code(out).is_some_and(|c| c != 0)
                || out.get("overall_success") == Some(&Value::Bool(false))
        }
        "exit_code_zero" => exit_code(out) == Some(0),
        "exit_code_non_zero" => exit_code(out).is_some_and(|c| c != 0),
        "exit_code" => exit_code(out).is_some() && exit_code(out) == t["value"].as_i64(),
        "score_above" => score(out) > number(t, "threshold", 0.0),
        "score_below" => score(out) < number(t, "threshold", 1.0),
        "score_between" => {
            let s = score(out);
            s >= number(t, "min", 0.0) && s <= number(t, "max", 1.0)
        }
        "confidence_above" => out
            .get("confidence")
            .and_then(Value::as_f64)
            .is_some_and(|c| c > number(t, "threshold", 0.0)),
        "score_and_confidence_above" => {
            let threshold = number(t, "threshold", 0.0);
            score(out) > threshold
                && out
                    .get("confidence")
                    .and_then(Value::as_f64)
                    .is_some_and(|c| c > threshold)
        }
        "consensus" => {
            let s = out.pointer("/consensus/score").and_then(Value::as_f64);
            let c = out.pointer("/consensus/confidence").and_then(Value::as_f64);
            match (s, c) {
                (Some(s), Some(c)) => {
                    s >= number(t, "threshold", 0.0) && c >= number(t, "agreement", 0.0)
                }
                _ => false,
            }
        }
        "all_approved" | "any_rejected" => {
            let threshold = number(t, "threshold", 0.8);
            let scores: Vec<f64> = out
                .get("individual_scores")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default();
            if condition == "all_approved" {
                !scores.is_empty() && scores.iter().all(|s| *s >= threshold)
            } else {
                scores.iter().any(|s| *s < threshold)
            }
        }
        "input_equals" => {
            out.get("response").and_then(Value::as_str) == t.get("value").and_then(Value::as_str)
        }
        "input_equals_yes" => {
            response(out).is_some_and(|r| matches!(r.as_str(), "yes" | "y" | "1"))
        }
        "input_equals_no" => response(out).is_some_and(|r| matches!(r.as_str(), "no" | "n" | "0")),
        "custom" => {
            let mut ctx = context.clone();
            if let Some(map) = ctx.as_object_mut() {
                map.insert("state_output".to_owned(), out.clone());
            }
            aegis_core::render::truthy(t["expression"].as_str().unwrap_or_default(), &ctx)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(t: Value, out: Value) -> bool {
        matches(&t, &out, &json!({"flag": true}))
    }

    #[test]
    fn every_condition_reads_what_the_notes_say() {
        assert!(m(json!({"condition": "always"}), json!({})));
        assert!(m(
            json!({"condition": "on_success"}),
            json!({"status": "success"})
        ));
        assert!(m(
            json!({"condition": "on_success"}),
            json!({"exit_code": 0})
        ));
        assert!(m(
            json!({"condition": "on_success"}),
            json!({"overall_success": true})
        ));
        assert!(!m(
            json!({"condition": "on_success"}),
            json!({"status": "failed", "exit_code": 2})
        ));
        assert!(m(
            json!({"condition": "on_failure"}),
            json!({"exit_code": 2})
        ));
        assert!(m(
            json!({"condition": "on_failure"}),
            json!({"overall_success": false})
        ));
        assert!(m(
            json!({"condition": "exit_code_zero"}),
            json!({"output": {"exit_code": 0}})
        ));
        assert!(m(
            json!({"condition": "exit_code_non_zero"}),
            json!({"exit_code": 3})
        ));
        assert!(m(
            json!({"condition": "exit_code", "value": 3}),
            json!({"exit_code": 3})
        ));
        assert!(!m(
            json!({"condition": "exit_code", "value": 3}),
            json!({"exit_code": 4})
        ));
        assert!(m(
            json!({"condition": "score_above", "threshold": 0.5}),
            json!({"score": 0.6})
        ));
        assert!(m(
            json!({"condition": "score_below", "threshold": 0.5}),
            json!({"final_score": 0.4})
        ));
        assert!(m(
            json!({"condition": "score_between", "min": 0.4, "max": 0.6}),
            json!({"score": 0.6})
        ));
        assert!(m(
            json!({"condition": "confidence_above", "threshold": 0.5}),
            json!({"confidence": 0.9})
        ));
        assert!(!m(
            json!({"condition": "score_and_confidence_above", "threshold": 0.5}),
            json!({"score": 0.9, "confidence": 0.4})
        ));
        assert!(m(
            json!({"condition": "consensus", "threshold": 0.7, "agreement": 0.5}),
            json!({"consensus": {"score": 0.8, "confidence": 0.6}})
        ));
        assert!(m(
            json!({"condition": "all_approved"}),
            json!({"individual_scores": [0.9, 0.8]})
        ));
        assert!(!m(
            json!({"condition": "all_approved"}),
            json!({"individual_scores": []})
        ));
        assert!(m(
            json!({"condition": "any_rejected"}),
            json!({"individual_scores": [0.9, 0.2]})
        ));
        assert!(m(
            json!({"condition": "input_equals", "value": "ship"}),
            json!({"response": "ship"})
        ));
        assert!(m(
            json!({"condition": "input_equals_yes"}),
            json!({"response": " Yes "})
        ));
        assert!(m(
            json!({"condition": "input_equals_no"}),
            json!({"response": "n"})
        ));
        assert!(!m(
            json!({"condition": "input_equals_no"}),
            json!({"response": "maybe"})
        ));
        assert!(m(
            json!({"condition": "custom", "expression": "state_output.ok"}),
            json!({"ok": true})
        ));
        assert!(m(
            json!({"condition": "custom", "expression": "{{flag}}"}),
            json!({})
        ));
        assert!(!m(
            json!({"condition": "custom", "expression": "state_output.ok"}),
            json!({"ok": false})
        ));
    }
}
