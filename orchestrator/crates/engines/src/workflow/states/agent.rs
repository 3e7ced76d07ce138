//! `Agent` and `ParallelAgents`: child agent executions of the agent engine.
//!
//! Every child carries (workflow execution, state, visit), so a re-run after a crash cancels
//! what the interrupted attempt left running. An `Agent` state with `judges` runs each judge
//! agent on the answer (`{task, output}` or its `input_template`), combines their scores by
//! weight, and, below [`PASS_SCORE`], runs the agent again with the judges' reasoning appended,
//! up to `max_iterations`. `ParallelAgents` runs its agents at once and combines their
//! `{score, confidence}` answers by the consensus rules of the judge validators
//! (`engine::validate::consensus`). An `Agent` state's `volumes` are mounted into its agent's
//! sandbox (`workspaces`), each iteration seeing what the previous one left.

use std::time::Duration;

use serde_json::{json, Value};
use uuid::Uuid;

use super::{StateCtx, Step};
use crate::engine::{store as exec_store, validate, ExecuteRequest, WorkflowLink};
use aegis_sandboxes::workspaces::Workspace;

/// Weighted judge score an answer needs to be accepted.
pub(super) const PASS_SCORE: f64 = 0.7;
/// How often a child's status is read.
const POLL: Duration = Duration::from_millis(100);
/// Default wait for one agent when the state sets no timeout.
const DEFAULT_AGENT_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a child that mounts the run's volumes is given to stop after a cancel.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// How a child ended.
struct Child {
    id: Uuid,
    status: String,
    output: Option<String>,
    error: Option<String>,
}

/// The rendered `input` as the agent gets it: a JSON object when it parses as one, else text.
fn agent_input(text: String) -> Value {
    match serde_json::from_str::<Value>(&text) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::String(text),
    }
}

/// The answer as state output: parsed JSON when it is an object or array, else the text.
fn answer_value(text: &str) -> Value {
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(v @ (Value::Object(_) | Value::Array(_))) => v,
        _ => Value::String(text.to_owned()),
    }
}

/// Starts `agent` on `input` for this state and waits for it (cancelled with the state).
async fn run_child(
    ctx: &StateCtx<'_>,
    agent: &str,
    input: Value,
    intent: Option<String>,
    role: &str,
    timeout: Duration,
    workspace: Option<Workspace>,
) -> Result<Child, String> {
    let mounts = workspace.is_some();
    let request = ExecuteRequest {
        agent: agent.to_owned(),
        version: None,
        input,
        intent,
        parent: None,
        workflow: Some(WorkflowLink {
            execution_id: ctx.exec.id,
            state: ctx.name.to_owned(),
            visit: ctx.visit,
            workspace,
        }),
        model: None,
    };
    let id = ctx
        .rt
        .host
        .start_agent(ctx.caller().await?, request)
        .await
        .map_err(|e| format!("agent `{agent}` could not start: {e}"))?;
    ctx.event(
        "child_started",
        json!({"kind": "agent", "agent": agent, "role": role, "execution_id": id, "visit": ctx.visit}),
    )
    .await;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match exec_store::get(&ctx.rt.pool, &ctx.exec.tenant_id, id).await {
            Ok(Some(e)) if exec_store::is_terminal(&e.status) => {
                ctx.event(
                    "child_finished",
                    json!({"kind": "agent", "agent": agent, "role": role, "execution_id": id, "status": e.status}),
                )
                .await;
                return Ok(Child {
                    id,
                    status: e.status,
                    output: e.last_output,
                    error: e.last_error,
                });
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(execution = %id, error = %e, "could not read a child execution")
            }
        }
        if tokio::time::Instant::now() >= deadline {
            ctx.rt
                .host
                .cancel_agent(ctx.exec.tenant_id.clone(), id)
                .await;
            if mounts {
                // What it leaves in the run's volumes is saved as it stops: wait for that, so
                // the state's commit takes all of it or (past the wait) none of it.
                stopped(ctx, id).await;
            }
            return Err(format!(
                "agent `{agent}` did not finish within {} s",
                timeout.as_secs()
            ));
        }
        tokio::select! {
            // The worker takes it from here: a cancel's clean-up of the state cancels (and
            // names) the child by its workflow link, and a re-run after a lost lease cancels
            // what this attempt left running.
            _ = ctx.token.cancelled() => return Err("interrupted".into()),
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// Waits (at most [`STOP_WAIT`]) for a cancelled child to record its end.
async fn stopped(ctx: &StateCtx<'_>, id: Uuid) {
    let deadline = tokio::time::Instant::now() + STOP_WAIT;
    while tokio::time::Instant::now() < deadline && !ctx.token.is_cancelled() {
        match exec_store::get(&ctx.rt.pool, &ctx.exec.tenant_id, id).await {
            Ok(Some(e)) if exec_store::is_terminal(&e.status) => return,
            Ok(None) => return,
            _ => {}
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What an `Agent` state's body asks for, rendered against the run's context.
struct AgentPlan {
    agent: String,
    input: String,
    intent: Option<String>,
    workspace: Option<Workspace>,
    judges: Vec<Value>,
    max_iterations: u64,
    timeout: Duration,
}

/// A step of its own: everything is rendered (and a template error fails the state) before any
/// child starts.
fn agent_plan(ctx: &StateCtx<'_>) -> Result<AgentPlan, String> {
    let body = ctx.body;
    let agent = ctx.render("agent", body["agent"].as_str().unwrap_or_default())?;
    let input = ctx.render("input", body["input"].as_str().unwrap_or_default())?;
    let intent = match body.get("intent").and_then(Value::as_str) {
        Some(t) => Some(ctx.render("intent", t)?),
        None => ctx.exec.intent.clone(),
    };
    // The state's volumes go into the agent's sandbox (not its judges').
    let workspace = ctx.workspace(body, "")?;
    let judges = body["judges"].as_array().cloned().unwrap_or_default();
    let max_iterations = if judges.is_empty() {
        1
    } else {
        body["max_iterations"].as_u64().unwrap_or(10).max(1)
    };
    let timeout = ctx.timeout.unwrap_or(DEFAULT_AGENT_TIMEOUT);
    Ok(AgentPlan {
        agent,
        input,
        intent,
        workspace,
        judges,
        max_iterations,
        timeout,
    })
}

/// `Agent`: one child, judged and refined when the state has judges.
pub(super) async fn agent(ctx: &StateCtx<'_>) -> Step {
    let plan = match agent_plan(ctx) {
        Ok(p) => p,
        Err(e) => return Step::Fail(e),
    };
    let mut feedback: Vec<String> = Vec::new();
    let mut last = json!({});
    for iteration in 1..=plan.max_iterations {
        let mut text = plan.input.clone();
        if !feedback.is_empty() {
            text.push_str("\n\n");
            text.push_str(&feedback.join("\n"));
        }
        let child = match run_child(
            ctx,
            &plan.agent,
            agent_input(text.clone()),
            plan.intent.clone(),
            "agent",
            plan.timeout,
            plan.workspace.clone(),
        )
        .await
        {
            Ok(c) => c,
            Err(e) => {
                return Step::Output(
                    json!({"status": "failed", "error": e, "iterations": iteration}),
                    Vec::new(),
                )
            }
        };
        let answer = child.output.clone().unwrap_or_default();
        if child.status != "completed" {
            return Step::Output(
                json!({"status": "failed", "execution_id": child.id, "agent_status": child.status,
                       "error": child.error, "output": answer_value(&answer), "iterations": iteration}),
                Vec::new(),
            );
        }
        if plan.judges.is_empty() {
            return Step::Output(
                json!({"status": "completed", "execution_id": child.id, "output": answer_value(&answer),
                       "iterations": iteration}),
                Vec::new(),
            );
        }
        let Judged {
            score,
            conf,
            passed,
            verdicts,
        } = match judge(ctx, &plan.judges, &text, &answer, plan.timeout).await {
            Ok(j) => j,
            Err(e) => return Step::Fail(e),
        };
        ctx.event(
            "judged",
            json!({"iteration": iteration, "score": score, "confidence": conf, "passed": passed, "judges": verdicts}),
        )
        .await;
        last = json!({"status": if passed { "completed" } else { "failed" }, "execution_id": child.id,
            "output": answer_value(&answer), "score": score, "confidence": conf, "iterations": iteration,
            "judges": verdicts, "validated": passed});
        if passed {
            break;
        }
        feedback.push(refinement(&verdicts, score));
    }
    Step::Output(last, Vec::new())
}

/// The judges' combined verdict on one answer.
struct Judged {
    score: f64,
    conf: f64,
    passed: bool,
    verdicts: Vec<Value>,
}

/// The judging phase of an iteration: every judge in turn on `answer` to `text`, combined as a
/// weighted average of their scores and confidences. Err: a judge's `input_template` did not
/// render (the state fails with it).
async fn judge(
    ctx: &StateCtx<'_>,
    judges: &[Value],
    text: &str,
    answer: &str,
    timeout: Duration,
) -> Result<Judged, String> {
    let mut verdicts = Vec::new();
    let (mut weighted, mut confidence, mut weights) = (0.0, 0.0, 0.0);
    for judge in judges {
        let name = judge["agent_id"].as_str().unwrap_or_default();
        let weight = judge["weight"].as_f64().unwrap_or(1.0);
        let judge_input = match judge.get("input_template").and_then(Value::as_str) {
            Some(t) => {
                let mut jctx = ctx.context.clone();
                jctx["output"] = json!(answer);
                jctx["task"] = json!(text);
                match aegis_core::render::render(t, &jctx) {
                    Ok(s) => agent_input(s),
                    Err(e) => return Err(format!("spec.states.{}.judges: {e}", ctx.name)),
                }
            }
            None => json!({"task": text, "output": answer}),
        };
        let verdict = run_child(
            ctx,
            name,
            judge_input,
            Some("judge the output".into()),
            "judge",
            timeout,
            None,
        )
        .await;
        let parsed = verdict
            .as_ref()
            .ok()
            .and_then(|c| c.output.as_deref())
            .and_then(validate::parse_judgement);
        match parsed {
            Some((score, conf, reasoning)) => {
                weighted += score * weight;
                confidence += conf * weight;
                weights += weight;
                verdicts.push(json!({"judge": name, "weight": weight, "score": score, "confidence": conf, "reasoning": reasoning}));
            }
            None => verdicts.push(
                json!({"judge": name, "weight": weight, "error": match &verdict {
                    Ok(c) => format!("no JSON judgement ({})", c.status),
                    Err(e) => e.clone(),
                }}),
            ),
        }
    }
    let score = if weights > 0.0 {
        weighted / weights
    } else {
        0.0
    };
    let conf = if weights > 0.0 {
        confidence / weights
    } else {
        0.0
    };
    Ok(Judged {
        score,
        conf,
        passed: weights > 0.0 && score >= PASS_SCORE,
        verdicts,
    })
}

/// What the next iteration is told after a failed judgement: the score and the judges' reasons.
fn refinement(verdicts: &[Value], score: f64) -> String {
    let reasons: Vec<String> = verdicts
        .iter()
        .filter_map(|v| {
            v["reasoning"]
                .as_str()
                .or(v["error"].as_str())
                .map(str::to_owned)
        })
        .collect();
    format!(
        "Validation failed with score {score:.2}. Reasoning: {}. Please refine your response.",
        reasons.join("; ")
    )
}

/// `ParallelAgents`: every agent at once, then consensus.
pub(super) async fn parallel(ctx: &StateCtx<'_>) -> Step {
    let agents = ctx.body["agents"].as_array().cloned().unwrap_or_default();
    let consensus = &ctx.body["consensus"];
    let strategy = consensus["strategy"].as_str().unwrap_or("weighted_average");
    let threshold = consensus["threshold"].as_f64().unwrap_or(0.7);
    let min_confidence = consensus["min_agreement_confidence"]
        .as_f64()
        .or_else(|| consensus["agreement"].as_f64())
        .unwrap_or(0.0);
    let required = consensus["min_judges_required"].as_u64().unwrap_or(1) as usize;
    let mut prepared = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        let name = match ctx.render(
            &format!("agents[{i}].agent"),
            a["agent"].as_str().unwrap_or_default(),
        ) {
            Ok(n) => n,
            Err(e) => return Step::Fail(e),
        };
        let input = match ctx.render(
            &format!("agents[{i}].input"),
            a["input"].as_str().unwrap_or_default(),
        ) {
            Ok(t) => agent_input(t),
            Err(e) => return Step::Fail(e),
        };
        let timeout = a["timeout_seconds"]
            .as_u64()
            .map(Duration::from_secs)
            .or(ctx.timeout)
            .unwrap_or(DEFAULT_AGENT_TIMEOUT);
        prepared.push((name, input, a["weight"].as_f64().unwrap_or(1.0), timeout));
    }
    let runs = prepared.iter().map(|(name, input, _, timeout)| {
        run_child(
            ctx,
            name,
            input.clone(),
            ctx.exec.intent.clone(),
            "parallel",
            *timeout,
            None,
        )
    });
    let results = futures_util::future::join_all(runs).await;
    let mut individual = Vec::new();
    let mut scores = Vec::new();
    let mut judgements = Vec::new();
    let (mut weighted, mut weight_sum) = (0.0, 0.0);
    for ((name, _, weight, _), result) in prepared.iter().zip(&results) {
        match result {
            Ok(child) => {
                let answer = child.output.clone().unwrap_or_default();
                let judged = validate::parse_judgement(&answer);
                if let Some((score, confidence, _)) = judged.as_ref().map(|j| (j.0, j.1, ())) {
                    scores.push(score);
                    judgements.push((score, confidence));
                    weighted += score * confidence * weight;
                    weight_sum += confidence * weight;
                }
                individual.push(json!({"agent": name, "execution_id": child.id, "status": child.status,
                    "output": answer_value(&answer), "weight": weight,
                    "score": judged.as_ref().map(|j| j.0), "confidence": judged.as_ref().map(|j| j.1),
                    "reasoning": judged.as_ref().map(|j| j.2.clone())}));
            }
            Err(e) => individual
                .push(json!({"agent": name, "status": "failed", "error": e, "weight": weight})),
        }
    }
    let (passed, score) = if judgements.len() < required.max(1) {
        (false, 0.0)
    } else if strategy == "weighted_average" {
        // Agent weights times self-confidence; the rest of the rule as the judge validators.
        let avg = if weight_sum > 0.0 {
            weighted / weight_sum
        } else {
            0.0
        };
        let conf = judgements.iter().map(|j| j.1).sum::<f64>() / judgements.len() as f64;
        (avg >= threshold && conf >= min_confidence, avg)
    } else {
        validate::consensus(strategy, &judgements, threshold, min_confidence)
    };
    let confidence = if judgements.is_empty() {
        0.0
    } else {
        judgements.iter().map(|j| j.1).sum::<f64>() / judgements.len() as f64
    };
    Step::Output(
        json!({
            "status": if passed { "completed" } else { "failed" },
            "consensus": {"score": score, "confidence": confidence, "strategy": strategy, "passed": passed,
                          "threshold": threshold},
            "score": score, "confidence": confidence,
            "individual_results": individual, "individual_scores": scores,
            "agents": prepared.iter().map(|p| p.0.clone()).collect::<Vec<_>>(),
        }),
        Vec::new(),
    )
}
