//! The validators of `spec.execution.validation`: deterministic checks of an iteration's result.
//!
//! `exit_code` checks the last `cmd.run` of the iteration, `regex` searches the answer (`stdout`)
//! or the commands' standard error (`stderr`), `json_schema` parses the answer as JSON and
//! validates it. Judge-based validators (`semantic`, `multi_judge`) are refused when an execution
//! starts, so no execution ever passes a validator that did not run.

use serde_json::{json, Value};

/// What an iteration produced, for the validators.
#[derive(Debug, Default, Clone)]
pub struct IterationResult {
    /// The model's final answer.
    pub answer: String,
    /// Exit code of the last `cmd.run`, if any ran.
    pub last_exit_code: Option<i64>,
    /// Standard error of every `cmd.run`, concatenated.
    pub stderr: String,
}

/// One validator's verdict.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Validator kind.
    pub kind: String,
    /// Passed?
    pub passed: bool,
    /// Feedback for the next iteration (and the event log).
    pub feedback: String,
}

/// Validator kinds this node runs (the judge kinds run child executions, see `run.rs`).
pub const SUPPORTED: &[&str] = &[
    "exit_code",
    "regex",
    "json_schema",
    "semantic",
    "multi_judge",
];

/// True for validators that run judge agents.
pub fn is_judge(validator: &Value) -> bool {
    matches!(validator["type"].as_str(), Some("semantic" | "multi_judge"))
}

/// A judge's answer: the first JSON object in its final text, `{score, confidence?, reasoning?}`.
pub fn parse_judgement(text: &str) -> Option<(f64, f64, String)> {
    let start = text.find('{')?;
    let end = text.rfind('}')?;
    let v: Value = serde_json::from_str(text.get(start..=end)?).ok()?;
    let score = v["score"].as_f64()?;
    let confidence = v["confidence"].as_f64().unwrap_or(1.0);
    let reasoning = v["reasoning"].as_str().unwrap_or_default().to_owned();
    Some((score, confidence, reasoning))
}

/// Combines judges' (score, confidence) under a consensus rule; returns (passed, summary).
pub fn consensus(
    rule: &str,
    judgements: &[(f64, f64)],
    min_score: f64,
    min_confidence: f64,
) -> (bool, f64) {
    let passes = |(s, c): &(f64, f64)| *s >= min_score && *c >= min_confidence;
    let n = judgements.len().max(1) as f64;
    match rule {
        "majority" => {
            let yes = judgements.iter().filter(|j| passes(j)).count() as f64;
            (yes * 2.0 > n, yes / n)
        }
        "unanimous" => (
            !judgements.is_empty() && judgements.iter().all(passes),
            judgements.iter().map(|j| j.0).fold(f64::INFINITY, f64::min),
        ),
        "best_of_n" => {
            let best = judgements
                .iter()
                .map(|j| j.0)
                .fold(f64::NEG_INFINITY, f64::max);
            (judgements.iter().any(passes), best)
        }
        _ => {
            // weighted_average: scores weighted by confidence.
            let weight: f64 = judgements.iter().map(|j| j.1).sum();
            let avg = if weight > 0.0 {
                judgements.iter().map(|j| j.0 * j.1).sum::<f64>() / weight
            } else {
                0.0
            };
            let conf = judgements.iter().map(|j| j.1).sum::<f64>() / n;
            (avg >= min_score && conf >= min_confidence, avg)
        }
    }
}

/// The kinds in `validators` this node cannot run.
pub fn unsupported(validators: &[Value]) -> Vec<String> {
    validators
        .iter()
        .filter_map(|v| v["type"].as_str())
        .filter(|k| !SUPPORTED.contains(k))
        .map(str::to_owned)
        .collect()
}

/// Runs the validators in order; stops at the first failure.
pub fn run(validators: &[Value], result: &IterationResult) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    for v in validators {
        let kind = v["type"].as_str().unwrap_or_default().to_owned();
        let (passed, feedback) = match kind.as_str() {
            "exit_code" => {
                let expected = v["expected"].as_i64().unwrap_or(0);
                match result.last_exit_code {
                    Some(code) if code == expected => {
                        (true, format!("exit code {code} as expected"))
                    }
                    Some(code) => (
                        false,
                        format!("the last command exited with {code}; expected {expected}"),
                    ),
                    None => (
                        false,
                        "no command ran in this iteration; an exit_code validator needs cmd.run"
                            .to_owned(),
                    ),
                }
            }
            "regex" => {
                let target = v["target"].as_str().unwrap_or("stdout");
                let hay = if target == "stderr" {
                    &result.stderr
                } else {
                    &result.answer
                };
                match regex::Regex::new(v["pattern"].as_str().unwrap_or_default()) {
                    Ok(re) if re.is_match(hay) => {
                        (true, format!("{target} matches /{}/", re.as_str()))
                    }
                    Ok(re) => (false, format!("{target} does not match /{}/", re.as_str())),
                    Err(e) => (false, format!("the validator's pattern is invalid: {e}")),
                }
            }
            "json_schema" => match serde_json::from_str::<Value>(result.answer.trim()) {
                Err(e) => (false, format!("the answer is not JSON: {e}")),
                Ok(answer) => match jsonschema::validator_for(&v["schema"]) {
                    Err(e) => (false, format!("the validator's schema is invalid: {e}")),
                    Ok(validator) => {
                        let errors: Vec<String> = validator
                            .iter_errors(&answer)
                            .map(|e| format!("{}: {e}", e.instance_path()))
                            .collect();
                        if errors.is_empty() {
                            (true, "the answer matches the schema".to_owned())
                        } else {
                            (
                                false,
                                format!(
                                    "the answer does not match the schema: {}",
                                    errors.join("; ")
                                ),
                            )
                        }
                    }
                },
            },
            other => (
                false,
                format!("validator `{other}` is not supported on this node"),
            ),
        };
        verdicts.push(Verdict {
            kind,
            passed,
            feedback,
        });
        if !passed {
            break;
        }
    }
    verdicts
}

/// Verdicts as event payload.
pub fn to_json(verdicts: &[Verdict]) -> Value {
    Value::Array(
        verdicts
            .iter()
            .map(|v| json!({"type": v.kind, "passed": v.passed, "feedback": v.feedback}))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validators_check_what_they_say() {
        let r = IterationResult {
            answer: "{\"n\": 3}".into(),
            last_exit_code: Some(0),
            stderr: "warn".into(),
        };
        let v = vec![
            json!({"type": "exit_code"}),
            json!({"type": "regex", "pattern": "\"n\""}),
            json!({"type": "regex", "pattern": "^warn$", "target": "stderr"}),
            json!({"type": "json_schema", "schema": {"type": "object", "required": ["n"]}}),
        ];
        assert!(run(&v, &r).iter().all(|x| x.passed));
        let bad = IterationResult {
            answer: "nope".into(),
            last_exit_code: Some(2),
            ..Default::default()
        };
        let out = run(&v, &bad);
        assert_eq!(out.len(), 1, "stops at the first failure");
        assert!(out[0].feedback.contains("exited with 2"));
        assert!(unsupported(&[json!({"type": "semantic"}), json!({"type": "regex"})]).is_empty());
        assert_eq!(unsupported(&[json!({"type": "telepathy"})]), ["telepathy"]);
        let judged = "verdict: {\"score\": 0.9, \"reasoning\": \"ok\"} done";
        assert_eq!(parse_judgement(judged), Some((0.9, 1.0, "ok".into())));
        assert!(parse_judgement("no json").is_none());
        assert!(consensus("weighted_average", &[(0.9, 1.0), (0.6, 1.0)], 0.7, 0.0).0);
        assert!(!consensus("unanimous", &[(0.9, 1.0), (0.6, 1.0)], 0.7, 0.0).0);
        assert!(consensus("majority", &[(0.9, 1.0), (0.8, 1.0), (0.1, 1.0)], 0.7, 0.0).0);
    }
}
