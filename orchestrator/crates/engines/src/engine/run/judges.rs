//! The judges of an execution: the validators of its answers (`spec.execution.validation`)
//! and of its tool calls (`tool_validation`, through [`ToolGate`]), each a child execution.

use std::time::Duration;

use aegis_core::caller::Caller;
use aegis_egress::mcp_servers;
use serde_json::{json, Value};

use super::Job;
use crate::call::CallGate;
use crate::engine::validate::IterationResult;
use crate::engine::{store, validate};

impl Job {
    /// The validators' verdict on an answer: `Ok` ends the execution completed with it; `Err`
    /// is the feedback for the next attempt (the answer is kept as the last output).
    pub(super) async fn judge_answer(
        &self,
        iteration: u32,
        validators: &[Value],
        result: &IterationResult,
        instruction: &str,
        caller: &Caller,
    ) -> Result<(), String> {
        let verdicts = self.validate(validators, result, instruction, caller).await;
        if !validators.is_empty() {
            self.event(
                "validation",
                json!({"iteration": iteration, "results": validate::to_json(&verdicts)}),
            )
            .await;
        }
        let Some(failed) = verdicts.iter().find(|v| !v.passed) else {
            self.event(
                "iteration_completed",
                json!({"iteration": iteration, "output": result.answer}),
            )
            .await;
            return Ok(());
        };
        let _ = sqlx::query("UPDATE executions SET last_output = $2 WHERE id = $1")
            .bind(self.id)
            .bind(&result.answer)
            .execute(&self.services.pool)
            .await;
        self.event(
            "iteration_failed",
            json!({"iteration": iteration, "reason": failed.feedback}),
        )
        .await;
        Err(format!(
            "validation `{}` failed: {}",
            failed.kind, failed.feedback
        ))
    }

    /// Runs the validators in order, judges as child executions; stops at the first failure.
    pub(super) async fn validate(
        &self,
        validators: &[Value],
        result: &IterationResult,
        task: &str,
        caller: &Caller,
    ) -> Vec<validate::Verdict> {
        let mut verdicts = Vec::new();
        for v in validators {
            let verdict = if validate::is_judge(v) {
                let input =
                    json!({"task": task, "output": result.answer, "criteria": v["criteria"]});
                self.judge(v, input, "judge the output", caller).await
            } else {
                validate::run(std::slice::from_ref(v), result).remove(0)
            };
            let passed = verdict.passed;
            verdicts.push(verdict);
            if !passed {
                break;
            }
        }
        verdicts
    }

    /// A `semantic` or `multi_judge` validator: each judge agent runs as a child execution on
    /// `input` (`{task, output, criteria}` after an iteration, `{task, proposed_tool_call,
    /// criteria, ...}` before a tool call) and must answer `{score, confidence, reasoning}` as JSON.
    pub(super) async fn judge(
        &self,
        v: &Value,
        input: Value,
        intent: &str,
        caller: &Caller,
    ) -> validate::Verdict {
        let kind = v["type"].as_str().unwrap_or("semantic").to_owned();
        let judges: Vec<String> = match kind.as_str() {
            "semantic" => v["judge_agent"]
                .as_str()
                .map(|s| vec![s.to_owned()])
                .unwrap_or_default(),
            _ => v["judges"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|j| j.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
        };
        let min_score = v["min_score"].as_f64().unwrap_or(0.7);
        let min_confidence = v["min_confidence"].as_f64().unwrap_or(0.0);
        let timeout = Duration::from_secs(v["timeout_seconds"].as_u64().unwrap_or(300));
        // Judges are children: they start as this execution, under its rights.
        let mut judgements = Vec::new();
        let mut notes = Vec::new();
        for judge in &judges {
            match self
                .ask_judge(judge, v, input.clone(), intent, caller, timeout)
                .await
            {
                Ok((score, confidence, reasoning)) => {
                    notes.push(format!(
                        "`{judge}`: score {score:.2}, confidence {confidence:.2}: {reasoning}"
                    ));
                    judgements.push((score, confidence));
                }
                Err(note) => notes.push(note),
            }
        }
        let required = v["min_judges_required"].as_u64().unwrap_or(1) as usize;
        let (passed, summary) = if judgements.len() < required.max(1) {
            (false, 0.0)
        } else {
            validate::consensus(
                v["consensus"].as_str().unwrap_or("weighted_average"),
                &judgements,
                min_score,
                min_confidence,
            )
        };
        validate::Verdict {
            kind,
            passed,
            feedback: format!(
                "{} judge(s) answered, score {summary:.2} (needs {min_score:.2}); {}",
                judgements.len(),
                notes.join("; ")
            ),
        }
    }

    /// One judge run as a child execution of this one on `input`, waited for up to `timeout`
    /// (then cancelled): its score, confidence and reasoning, or the note saying why there are
    /// none.
    async fn ask_judge(
        &self,
        judge: &str,
        v: &Value,
        input: Value,
        intent: &str,
        caller: &Caller,
        timeout: Duration,
    ) -> Result<(f64, f64, String), String> {
        // The node's own judge (older `semantic` validations) is deployed when first needed.
        if judge == crate::builtin::SEMANTIC_JUDGE {
            crate::builtin::ensure_judge(&self.services.pool, &self.tenant)
                .await
                .map_err(|e| format!("judge `{judge}` could not be deployed: {e}"))?;
        }
        let request = crate::engine::ExecuteRequest {
            agent: judge.to_owned(),
            version: None,
            input,
            intent: Some(intent.to_owned()),
            parent: Some(self.id),
            workflow: None,
            model: v["model"].as_str().map(str::to_owned),
        };
        let child = self
            .services
            .executions
            .start(&self.services, caller, request)
            .await
            .map_err(|e| format!("judge `{judge}` could not start: {e}"))?;
        self.event(
            "child_execution_started",
            json!({"judge": judge, "execution_id": child}),
        )
        .await;
        let deadline = tokio::time::Instant::now() + timeout;
        let ended = loop {
            match store::get(&self.services.pool, &self.tenant, child).await {
                Ok(Some(e)) if store::is_terminal(&e.status) => break Some(e),
                _ if tokio::time::Instant::now() >= deadline => break None,
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let Some(e) = ended else {
            let _ = self
                .services
                .executions
                .cancel(&self.services, &self.tenant, child)
                .await;
            return Err(format!(
                "judge `{judge}` did not finish within {} s",
                timeout.as_secs()
            ));
        };
        self.event(
            "child_execution_completed",
            json!({"judge": judge, "execution_id": child, "status": e.status}),
        )
        .await;
        e.last_output
            .as_deref()
            .and_then(validate::parse_judgement)
            .ok_or_else(|| format!("judge `{judge}` gave no JSON judgement ({})", e.status))
    }
}

/// The judges of `spec.execution.tool_validation`, asked before each tool call of one
/// iteration: every validator in order must pass, else the call is refused with the judges'
/// reasoning, which the model reads as the tool's answer.
pub(super) struct ToolGate<'a> {
    pub(super) job: &'a Job,
    pub(super) validators: &'a [Value],
    pub(super) caller: &'a Caller,
    pub(super) task: &'a str,
    pub(super) tools: &'a [String],
    pub(super) iteration: u32,
}

impl CallGate for ToolGate<'_> {
    fn admit<'a>(
        &'a self,
        tool: &'a str,
        arguments: &'a Value,
    ) -> futures_util::future::BoxFuture<'a, Result<(), aegis_policy::Denial>> {
        Box::pin(async move {
            let skip = &self.job.services.config.executions.skip_judge_tools;
            // An external server's `skip_judge` covers all its tools.
            let server_skips = mcp_servers::split_name(tool)
                .and_then(|(server, _)| self.job.services.mcp_servers.config(server))
                .is_some_and(|c| c.skip_judge);
            if server_skips || skip.iter().any(|t| t == tool) {
                return Ok(());
            }
            for v in self.validators {
                let input = json!({
                    "task": self.task,
                    "proposed_tool_call": {"name": tool, "arguments": arguments},
                    "criteria": v["criteria"],
                    "available_tools": self.tools,
                    "iteration_number": self.iteration,
                    "validation_context": "pre_tool_call",
                });
                let verdict = self
                    .job
                    .judge(v, input, "judge the proposed tool call", self.caller)
                    .await;
                self.job
                    .event(
                        "tool_validation",
                        json!({"tool": tool, "passed": verdict.passed, "feedback": verdict.feedback}),
                    )
                    .await;
                if !verdict.passed {
                    return Err(aegis_policy::Denial {
                        code: "tool_validation",
                        message: format!(
                            "the tool_validation judge refused this call: {}",
                            verdict.feedback
                        ),
                        seal_code: None,
                        retry_after_secs: None,
                    });
                }
            }
            Ok(())
        })
    }
}
