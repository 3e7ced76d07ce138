//! One execution's task: sandbox, iterations of the model/tool loop, validators, cleanup.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dispatcher::SandboxId;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

mod judges;
mod offer;
mod volumes;

use judges::ToolGate;
use offer::Offer;

use super::store;
use super::validate::IterationResult;
use crate::call::CallGate;
use aegis_config::ExecutionsConfig;
use aegis_core::caller::{Caller, CallerKind, Tier};
use aegis_llm::{ChatRequest, LlmClient, Message, Role, ToolSpec};
use aegis_manifest::AgentView;
use aegis_store::registry::Definition;

/// Everything the task needs.
pub(super) struct Job {
    pub services: super::Services,
    pub id: Uuid,
    pub tenant: String,
    pub def: Definition,
    pub input: Value,
    pub intent: Option<String>,
    pub token: CancellationToken,
    pub llm: Result<LlmClient, String>,
    pub config: ExecutionsConfig,
    /// The rights of whoever started it (none for an operator).
    pub ceiling: Option<super::Ceiling>,
    /// The LLM alias asked instead of the manifest's (a judge's validator named it).
    pub model: Option<String>,
    /// The workflow volumes its state mounts (`workspaces`), if it runs for a workflow state.
    pub workspace: Option<aegis_sandboxes::workspaces::Workspace>,
    /// Set once they were copied into the sandbox: only then are they saved from it.
    pub workspace_restored: std::sync::atomic::AtomicBool,
}

/// How an execution ended.
enum Outcome {
    Completed(String),
    Failed(String),
    Cancelled,
    TimedOut(Duration),
}

/// Renders an agent prompt through the shared Handlebars engine (`aegis_core::render`) with the
/// variables `{{instruction}}`, `{{intent}}`, `{{input}}` (a string as is, anything else as JSON)
/// and `{{input.KEY}}`.
pub fn render(
    template: &str,
    instruction: &str,
    intent: Option<&str>,
    input: &Value,
) -> Result<String, aegis_core::render::RenderError> {
    // `{{input}}` has always meant "the input as text"; Handlebars alone would print `[object]`.
    let template = input_expression().replace_all(template, "{{text input}}");
    let context =
        json!({"instruction": instruction, "intent": intent.unwrap_or_default(), "input": input});
    aegis_core::render::render(&template, &context)
}

fn input_expression() -> &'static regex::Regex {
    static RE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"\{\{\s*input\s*\}\}").expect("a constant pattern")
    });
    &RE
}

impl Job {
    async fn event(&self, kind: &str, payload: Value) {
        if let Err(e) = store::event(&self.services.pool, self.id, kind, payload).await {
            tracing::error!(execution = %self.id, error = %e, "could not record an execution event");
        }
    }

    /// Runs to the end, whatever happens, and always cleans up. Boxed with an explicit `Send`
    /// because judge validators start child executions, which makes the future recursive.
    pub fn run(self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(self.run_to_end())
    }

    async fn run_to_end(self) {
        let view = AgentView(&self.def.manifest);
        let limits = view.execution();
        let budget = limits
            .execution_timeout
            .min(Duration::from_secs(self.config.max_execution_secs));
        if let Err(e) = store::transition(&self.services.pool, self.id, "running", None, None).await
        {
            tracing::error!(execution = %self.id, error = %e, "could not start an execution");
        }
        self.event("execution_started", json!({"agent": self.def.name, "version": self.def.version,
            "max_iterations": limits.max_iterations.min(self.config.max_iterations), "timeout_secs": budget.as_secs()})).await;
        let sandbox: Arc<Mutex<Option<SandboxId>>> = Arc::new(Mutex::new(None));

        let outcome = tokio::select! {
            _ = self.token.cancelled() => Outcome::Cancelled,
            r = tokio::time::timeout(budget, self.iterations(&sandbox)) => match r {
                Ok(o) => o,
                Err(_) => Outcome::TimedOut(budget),
            },
        };

        let held = sandbox.lock().ok().and_then(|s| *s);
        let mut outcome = outcome;
        if let Some(id) = held {
            // Persistent volumes go back to their rows before the sandbox goes; a volume over
            // its size_limit is not saved and fails an execution that would have completed.
            if let Err(reason) = self.save_volumes(id).await {
                if matches!(outcome, Outcome::Completed(_)) {
                    outcome = Outcome::Failed(reason);
                }
            }
            // So do the workflow volumes it mounted (a draft of its state's attempt).
            if let Err(reason) = self.save_workspace(id).await {
                if matches!(outcome, Outcome::Completed(_)) {
                    outcome = Outcome::Failed(reason);
                }
            }
        }
        if let Some(id) = held {
            let keep = matches!(outcome, Outcome::Failed(_)) && self.config.keep_failed_sandboxes;
            if keep {
                self.event("sandbox_kept", json!({"sandbox_id": id.0}))
                    .await;
            } else {
                match self.services.sandboxes.destroy(id).await {
                    Ok(()) => {
                        self.event("sandbox_destroyed", json!({"sandbox_id": id.0}))
                            .await
                    }
                    Err(e) => {
                        self.event(
                            "sandbox_destroy_failed",
                            json!({"sandbox_id": id.0, "error": e.to_string()}),
                        )
                        .await
                    }
                }
            }
        }
        let (status, output, error, kind, payload) = match &outcome {
            Outcome::Completed(answer) => (
                "completed",
                Some(answer.as_str()),
                None,
                "execution_completed",
                json!({"output": answer}),
            ),
            Outcome::Failed(reason) => (
                "failed",
                None,
                Some(reason.clone()),
                "execution_failed",
                json!({"reason": reason}),
            ),
            Outcome::Cancelled => (
                "cancelled",
                None,
                Some("cancelled".to_owned()),
                "execution_cancelled",
                json!({"by": "request"}),
            ),
            Outcome::TimedOut(after) => {
                let reason = format!("execution timed out after {} s", after.as_secs());
                (
                    "timed_out",
                    None,
                    Some(reason.clone()),
                    "execution_timed_out",
                    json!({"reason": reason}),
                )
            }
        };
        // Already ended (cancelled through another replica, say): nothing more to record.
        if let Err(e) = self
            .end(status, output, error.as_deref(), kind, payload)
            .await
        {
            tracing::error!(execution = %self.id, error = %e, "could not record the end of an execution")
        }
        self.services.executions.finished(self.id);
    }

    /// Records the end, its event (`kind`) and, in the same transaction, the deliveries of
    /// `spec.execution.delivery` (sent by `delivery::work` on any replica): whoever sees the
    /// execution ended sees its last events too. False when it had already ended.
    async fn end(
        &self,
        status: &str,
        output: Option<&str>,
        error: Option<&str>,
        kind: &str,
        payload: Value,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.services.pool.begin().await?;
        if !store::transition(&mut *tx, self.id, status, output, error).await? {
            return Ok(false);
        }
        let queued =
            aegis_egress::delivery::enqueue(&mut tx, self.id, &self.services.config.delivery)
                .await?;
        store::event_in(&mut tx, self.id, kind, payload).await?;
        if queued > 0 {
            store::event_in(
                &mut tx,
                self.id,
                "deliveries_queued",
                json!({"count": queued}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// The caller tool calls are made as: the execution, under the agent's security context and
    /// never above the rights of whoever started it (its ceiling).
    async fn caller(&self) -> Result<Caller, String> {
        let mut caller = Caller {
            kind: CallerKind::Execution,
            id: self.id.to_string(),
            label: self.def.name.clone(),
            tier: Tier::User,
            role: None,
            tenant: self.tenant.clone(),
            seal: None,
        };
        if let Some(name) = AgentView(&self.def.manifest).security_context() {
            let ctx = aegis_store::contexts::get(&self.services.pool, &self.tenant, name)
                .await
                .map_err(|e| format!("security context `{name}`: {e}"))?;
            caller.tier = ctx.tier;
            caller.seal = Some(aegis_core::caller::SealScope {
                context: Arc::new(ctx),
                limiter: Arc::new(aegis_seal::RateLimiter::new()),
                session_key: self.id.to_string(),
                ceilings: Vec::new(),
            });
        }
        if let Some(ceiling) = &self.ceiling {
            caller.tier = caller.tier.min(ceiling.tier);
            let mut inherited = ceiling.contexts.clone();
            match caller.seal.as_mut() {
                Some(scope) => scope.ceilings = inherited,
                None if !inherited.is_empty() => {
                    let context = inherited.remove(0);
                    caller.seal = Some(aegis_core::caller::SealScope {
                        context,
                        limiter: Arc::new(aegis_seal::RateLimiter::new()),
                        session_key: self.id.to_string(),
                        ceilings: inherited,
                    });
                }
                None => {}
            }
        }
        Ok(caller)
    }

    /// The agent loop, in its steps: what the model is offered ([`Job::offer`]), the sandbox
    /// with its volumes ([`Job::prepare_sandbox`]), the first prompt ([`Job::prompt`]), then up
    /// to `max_iterations` attempts ([`Job::attempt`]), each judged by the validators
    /// ([`Job::judge_answer`]); what failed is fed back into the next attempt.
    async fn iterations(&self, sandbox: &Arc<Mutex<Option<SandboxId>>>) -> Outcome {
        let llm = match &self.llm {
            Ok(c) => c.clone(),
            Err(reason) => {
                return Outcome::Failed(format!("no language model is configured: {reason}"))
            }
        };
        let view = AgentView(&self.def.manifest);
        let caller = match self.caller().await {
            Ok(c) => c,
            Err(e) => return Outcome::Failed(e),
        };
        let offer = match self.offer(&view, &caller).await {
            Ok(offer) => offer,
            Err(reason) => return Outcome::Failed(reason),
        };
        let sandbox_id = match self.prepare_sandbox(&offer, sandbox).await {
            Ok(id) => id,
            Err(reason) => return Outcome::Failed(reason),
        };
        let prompt = match self.prompt(&view, &offer).await {
            Ok(p) => p,
            Err(reason) => return Outcome::Failed(reason),
        };
        let limits = view.execution();
        let model = self.model.as_deref().unwrap_or(view.model());
        let alias = llm.aliases().iter().any(|a| a == model).then_some(model);
        let validators = self
            .def
            .manifest
            .pointer("/spec/execution/validation")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let max_iterations = limits.max_iterations.min(self.config.max_iterations).max(1);
        // spec.execution.tool_validation: judges asked before each tool call runs.
        let tool_validators = view.tool_validation();
        let instruction = view.instruction();
        let gate = |iteration: u32| {
            (!tool_validators.is_empty()).then(|| ToolGate {
                job: self,
                validators: &tool_validators,
                caller: &caller,
                task: instruction,
                tools: &offer.tool_names,
                iteration,
            })
        };

        let mut feedback: Vec<String> = Vec::new();
        for iteration in 1..=max_iterations {
            let _ = store::progress(
                &self.services.pool,
                self.id,
                iteration as i32,
                sandbox_id.map(|s| s.0),
            )
            .await;
            self.event("iteration_started", json!({"iteration": iteration}))
                .await;
            let step = Step {
                llm: &llm,
                alias,
                offer: &offer,
                caller: &caller,
                sandbox: sandbox_id,
                limits: &limits,
            };
            let result = match self
                .attempt(
                    iteration,
                    &step,
                    &prompt,
                    &feedback,
                    gate(iteration).as_ref().map(|g| g as &dyn CallGate),
                )
                .await
            {
                Attempt::Answered(result) => result,
                Attempt::Retry(reason) => {
                    feedback.push(reason);
                    continue;
                }
                Attempt::Fatal(reason) => return Outcome::Failed(reason),
            };
            match self
                .judge_answer(iteration, &validators, &result, instruction, &caller)
                .await
            {
                Ok(()) => return Outcome::Completed(result.answer),
                Err(reason) => feedback.push(reason),
            }
        }
        Outcome::Failed(format!(
            "maximum iterations ({max_iterations}) reached without passing validation"
        ))
    }

    /// One attempt within `iteration_timeout`: the system and user messages (the prompt with
    /// what failed before), then the model and its tool calls until it answers.
    async fn attempt(
        &self,
        iteration: u32,
        step: &Step<'_>,
        prompt: &str,
        feedback: &[String],
        gate: Option<&dyn CallGate>,
    ) -> Attempt {
        let mut user = prompt.to_owned();
        if !feedback.is_empty() {
            user.push_str("\n\n# Previous attempts\n");
            for (i, f) in feedback.iter().enumerate() {
                user.push_str(&format!("- attempt {}: {f}\n", i + 1));
            }
        }
        let mut system = format!(
            "You are the agent `{}`. Use the tools offered to complete the task. Tool results come back as \
             messages; a refused call will not succeed if retried unchanged. When done, answer with the result only.",
            self.def.name
        );
        if step.offer.memory_on {
            system.push_str(
                " You have a memory across executions: save what is worth knowing next time \
                 with aegis__memory__write (one fact per note) and search it with \
                 aegis__memory__recall.",
            );
        }
        let timeout = step.limits.iteration_timeout;
        let reason = match tokio::time::timeout(
            timeout,
            self.iteration(
                step.llm,
                step.alias,
                system,
                user,
                &step.offer.specs,
                &step.offer.functions,
                step.caller,
                step.sandbox,
                step.limits.llm_timeout,
                gate,
            ),
        )
        .await
        {
            Ok(Ok(result)) => return Attempt::Answered(result),
            Ok(Err(IterationError::Fatal(reason))) => return Attempt::Fatal(reason),
            Ok(Err(IterationError::Retry(reason))) => reason,
            Err(_) => format!(
                "iteration {iteration} timed out after {} s",
                timeout.as_secs()
            ),
        };
        self.event(
            "iteration_failed",
            json!({"iteration": iteration, "reason": reason}),
        )
        .await;
        Attempt::Retry(reason)
    }

    #[allow(clippy::too_many_arguments)]
    async fn iteration(
        &self,
        llm: &LlmClient,
        alias: Option<&str>,
        system: String,
        user: String,
        specs: &[ToolSpec],
        names: &HashMap<String, String>,
        caller: &Caller,
        sandbox: Option<SandboxId>,
        llm_timeout: Duration,
        gate: Option<&dyn CallGate>,
    ) -> Result<IterationResult, IterationError> {
        let mut messages = vec![
            Message {
                role: Role::System,
                content: Some(system),
                tool_calls: Vec::new(),
                tool_call_id: None,
            },
            Message {
                role: Role::User,
                content: Some(user),
                tool_calls: Vec::new(),
                tool_call_id: None,
            },
        ];
        let mut result = IterationResult::default();
        for round in 1..=self.config.max_tool_rounds {
            let request = ChatRequest {
                messages: messages.clone(),
                tools: specs.to_vec(),
                temperature: AgentView(&self.def.manifest).temperature(),
            };
            let response = match tokio::time::timeout(llm_timeout, llm.chat(alias, &request)).await
            {
                Err(_) => {
                    let reason = format!(
                        "the model did not answer within {} s",
                        llm_timeout.as_secs()
                    );
                    self.event("llm_call_failed", json!({"round": round, "error": reason}))
                        .await;
                    return Err(IterationError::Fatal(reason));
                }
                Ok(Err(e)) => {
                    let reason = format!("model provider failed: {e}");
                    self.event(
                        "llm_call_failed",
                        json!({"round": round, "error": e.to_string()}),
                    )
                    .await;
                    return Err(IterationError::Fatal(reason));
                }
                Ok(Ok(r)) => r,
            };
            self.event("llm_call", json!({
                "round": round, "provider": response.provider, "model": response.model, "attempts": response.attempts,
                "prompt_tokens": response.usage.prompt_tokens, "completion_tokens": response.usage.completion_tokens,
                "tool_calls": response.message.tool_calls.len(), "finish_reason": response.finish_reason,
            })).await;
            let calls = response.message.tool_calls.clone();
            messages.push(response.message.clone());
            if calls.is_empty() {
                result.answer = response.message.content.unwrap_or_default();
                return Ok(result);
            }
            for call in calls {
                let text = self
                    .tool_call(&call, names, caller, sandbox, gate, &mut result)
                    .await;
                messages.push(Message {
                    role: Role::Tool,
                    content: Some(text),
                    tool_calls: Vec::new(),
                    tool_call_id: Some(call.id.clone()),
                });
            }
        }
        Err(IterationError::Retry(format!(
            "the model used all {} tool rounds without answering",
            self.config.max_tool_rounds
        )))
    }
}

/// What every attempt of one execution runs with.
struct Step<'a> {
    llm: &'a LlmClient,
    /// The node's model alias the agent asks for, if it names one.
    alias: Option<&'a str>,
    offer: &'a Offer,
    caller: &'a Caller,
    sandbox: Option<SandboxId>,
    limits: &'a aegis_manifest::ExecutionLimits,
}

/// How one attempt ended.
enum Attempt {
    /// The model answered (the validators judge it next).
    Answered(IterationResult),
    /// Try again with this as feedback (timed out, or out of tool rounds).
    Retry(String),
    /// End the execution (the model provider failed).
    Fatal(String),
}

/// An iteration that did not produce an answer.
enum IterationError {
    /// Try another iteration (with this as feedback).
    Retry(String),
    /// End the execution (the model provider failed).
    Fatal(String),
}

#[cfg(test)]
mod tests {
    use super::offer::{asked_tool, function_name};
    use super::*;

    #[test]
    fn templates_render_instruction_intent_and_input() {
        let input = json!({"name": "Ada", "n": 3, "deep": {"x": "y"}});
        let out = render("{{instruction}} / {{intent}} / {{input.name}} {{input.n}} {{input.deep.x}} {{input.missing}}|{{other}}", "Greet", Some("be kind"), &input).unwrap();
        assert_eq!(out, "Greet / be kind / Ada 3 y |");
        assert_eq!(
            render("{{input}}", "", None, &json!("plain")).unwrap(),
            "plain"
        );
        assert_eq!(
            render("{{ input }}", "", None, &json!({"a": 1})).unwrap(),
            "{\"a\":1}"
        );
        assert!(render("{{#if}}", "", None, &input).is_err());
    }

    #[test]
    fn external_tools_get_function_names_models_accept() {
        assert_eq!(function_name("fs.read"), "fs__read");
        assert_eq!(function_name("mcp:tools/add"), "mcp_tools__add");
        assert_eq!(asked_tool("mcp_tools__add"), "mcp:tools/add");
        assert_eq!(asked_tool("fs__read"), "fs.read");
        let ok = |n: &str| {
            n.len() <= 64
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        let dotted = function_name("mcp:tools/a.b");
        let underscored = function_name("mcp:tools/a_b");
        assert!(ok(&dotted) && ok(&underscored));
        assert_ne!(dotted, underscored, "a rewritten name carries a digest");
        let long = function_name(&format!("mcp:tools/{}", "x".repeat(120)));
        assert!(ok(&long), "{long}");
        assert_ne!(
            long,
            function_name(&format!("mcp:tools/{}", "x".repeat(121)))
        );
    }
}
