//! One execution's task: sandbox, iterations of the model/tool loop, validators, cleanup.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dispatcher::{Owner, OwnerKind, SandboxId};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::validate::{self, IterationResult};
use super::{store, EngineConfig};
use crate::call::{CallError, CallGate};
use aegis_core::caller::{Caller, CallerKind, Tier};
use aegis_egress::mcp_servers;
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
    pub config: EngineConfig,
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

/// OpenAI function names allow no dots: `fs.read` is offered as `fs__read`.
fn function_name(tool: &str) -> String {
    match mcp_servers::split_name(tool) {
        Some((server, name)) => external_function_name(server, name),
        None => tool.replace('.', "__"),
    }
}

/// The tool a function name the model asked for stands for, as far as it can be told from the
/// name alone (for a name no tool of this execution has): `mcp_<server>__<tool>` is
/// `mcp:<server>/<tool>`, else `a__b` is `a.b`.
fn asked_tool(function: &str) -> String {
    let external = function
        .strip_prefix("mcp_")
        .and_then(|rest| rest.split_once("__"))
        .filter(|(server, tool)| {
            aegis_egress::mcp_servers::config::is_server_name(server) && !tool.is_empty()
        });
    match external {
        Some((server, tool)) => mcp_servers::full_name(server, tool),
        None => function.replace("__", "."),
    }
}

/// `mcp:<server>/<tool>` as a function name models accept (`[A-Za-z0-9_-]`, at most 64):
/// `mcp_<server>__<tool>` with other characters as `_`; a longer one is cut and ends with a
/// digest of the full name, so two tools never share a function name.
fn external_function_name(server: &str, tool: &str) -> String {
    let clean: String = tool
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = format!("mcp_{server}__{clean}");
    if name.len() <= 64 && !tool.contains(['.', '/']) {
        return name;
    }
    let digest = aegis_store::audit::digest_text(&mcp_servers::full_name(server, tool));
    let tail = digest.trim_start_matches("sha256:").get(..8).unwrap_or("0");
    // Every character is ASCII here, so any byte index is a character boundary.
    let keep = name.len().min(64 - tail.len() - 1);
    format!("{}_{tail}", &name[..keep])
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

    /// Who owns this execution's volumes: its tenant, agent and root principal.
    async fn volume_owner(&self) -> Result<String, String> {
        match store::principal_of(&self.services.pool, self.id).await {
            Ok(Some((principal, _))) => Ok(principal),
            Ok(None) => Err("the execution's row is gone".to_owned()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// What the volume functions use of the node.
    fn volume_store(&self) -> aegis_sandboxes::volumes::VolumeStore<'_> {
        aegis_sandboxes::volumes::VolumeStore {
            pool: &self.services.pool,
            sandboxes: &self.services.sandboxes,
            config: &self.services.config.volumes,
            longest_execution: std::time::Duration::from_secs(
                self.services.config.executions.max_execution_secs,
            ),
        }
    }

    /// Makes the directories of `spec.volumes` and copies in the persistent ones' content.
    async fn restore_volumes(&self, sandbox: SandboxId) -> Result<(), String> {
        let volumes = aegis_sandboxes::volumes::of_manifest(&self.def.manifest);
        if volumes.is_empty() {
            return Ok(());
        }
        let owner = self.volume_owner().await?;
        let holder = aegis_sandboxes::volumes::Holder {
            tenant: &self.tenant,
            agent_id: self.def.id,
            owner: &owner,
        };
        match aegis_sandboxes::volumes::restore(&self.volume_store(), sandbox, &holder, &volumes)
            .await
        {
            Ok(restored) => {
                let names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
                self.event(
                    "volumes_mounted",
                    json!({"volumes": names, "restored": restored}),
                )
                .await;
                Ok(())
            }
            Err(e) => {
                let reason = format!("could not mount spec.volumes: {e}");
                self.event("volumes_failed", json!({"reason": reason}))
                    .await;
                Err(reason)
            }
        }
    }

    /// Copies the persistent volumes out of the sandbox into their rows.
    async fn save_volumes(&self, sandbox: SandboxId) -> Result<(), String> {
        let volumes = aegis_sandboxes::volumes::of_manifest(&self.def.manifest);
        if !volumes.iter().any(|v| v.persistent) {
            return Ok(());
        }
        let owner = self.volume_owner().await?;
        let holder = aegis_sandboxes::volumes::Holder {
            tenant: &self.tenant,
            agent_id: self.def.id,
            owner: &owner,
        };
        match aegis_sandboxes::volumes::save(
            &self.volume_store(),
            sandbox,
            &holder,
            &volumes,
            self.id,
        )
        .await
        {
            Ok(saved) => {
                let saved: Vec<Value> = saved
                    .iter()
                    .map(|(name, bytes)| json!({"name": name, "bytes": bytes}))
                    .collect();
                self.event("volumes_saved", json!({"volumes": saved})).await;
                Ok(())
            }
            Err(e) => {
                let reason = e.to_string();
                self.event("volumes_failed", json!({"reason": reason}))
                    .await;
                Err(reason)
            }
        }
    }

    /// Copies the workflow volumes its state mounts into the sandbox.
    async fn restore_workspace(&self, sandbox: SandboxId) -> Result<(), String> {
        let Some(ws) = &self.workspace else {
            return Ok(());
        };
        let dispatcher = self
            .services
            .sandboxes
            .dispatcher()
            .map_err(|e| format!("could not mount the workflow's volumes: {e}"))?;
        let names: Vec<&str> = ws.mounts.iter().map(|m| m.name.as_str()).collect();
        match aegis_sandboxes::workspaces::restore(dispatcher, &self.services.pool, sandbox, ws)
            .await
        {
            Ok(restored) => {
                self.workspace_restored
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                self.event(
                    "workflow_volumes_mounted",
                    json!({"volumes": names, "restored": restored, "state": ws.state}),
                )
                .await;
                Ok(())
            }
            Err(e) => {
                let reason = format!("could not mount the workflow's volumes: {e}");
                self.event("workflow_volumes_failed", json!({"reason": reason}))
                    .await;
                Err(reason)
            }
        }
    }

    /// Copies the read-write workflow volumes out of the sandbox (if they were copied in).
    async fn save_workspace(&self, sandbox: SandboxId) -> Result<(), String> {
        let Some(ws) = &self.workspace else {
            return Ok(());
        };
        if !ws.mounts.iter().any(|m| !m.read_only)
            || !self
                .workspace_restored
                .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(());
        }
        let dispatcher = self
            .services
            .sandboxes
            .dispatcher()
            .map_err(|e| e.to_string())?;
        match aegis_sandboxes::workspaces::save(dispatcher, &self.services.pool, sandbox, ws).await
        {
            Ok(saved) => {
                let saved: Vec<Value> = saved
                    .iter()
                    .map(|(name, bytes)| json!({"name": name, "bytes": bytes}))
                    .collect();
                self.event("workflow_volumes_saved", json!({"volumes": saved}))
                    .await;
                Ok(())
            }
            Err(e) => {
                let reason = e.to_string();
                self.event("workflow_volumes_failed", json!({"reason": reason}))
                    .await;
                Err(reason)
            }
        }
    }

    /// The memory section of this execution's prompt (`aegis_store::memory::prompt`): the notes of
    /// its memory that match `task` (the rendered prompt and the intent), within the manifest's
    /// `recall_tokens` capped by the node's `memory.max_recall_tokens`. `None` when memory is
    /// off, the budget is 0, nothing matches, or the memory cannot be read (said in the events:
    /// the execution goes on without it).
    async fn recall_memory(&self, task: &str) -> Option<String> {
        let scope = match aegis_store::memory::Scope::resolve(
            &self.services.pool,
            &self.tenant,
            &self.def.name,
            &self.def.manifest,
            self.id,
        )
        .await
        {
            Ok(scope) => scope?,
            Err(e) => {
                self.event("memory_recall_failed", json!({"reason": e.to_string()}))
                    .await;
                return None;
            }
        };
        let cap = self.services.config.memory.max_recall_tokens;
        let budget = u64::from(scope.spec.recall_tokens).min(cap) as usize;
        if budget == 0 {
            return None;
        }
        // The task's words rank the notes (the store keeps their distinct words, bounded).
        let mut query = task.to_owned();
        if let Some(intent) = &self.intent {
            query.push(' ');
            query.push_str(intent);
        }
        let ranked = match aegis_store::memory::store::recall(
            &self.services.pool,
            &scope,
            Some(&query),
            50,
            false,
        )
        .await
        {
            Ok((_, notes)) => notes,
            Err(e) => {
                self.event("memory_recall_failed", json!({"reason": e.to_string()}))
                    .await;
                return None;
            }
        };
        let recalled = aegis_store::memory::prompt::section(&ranked, budget);
        self.event(
            "memory_recalled",
            json!({"notes": recalled.notes, "estimated_tokens": recalled.tokens,
                "budget_tokens": budget, "matched": ranked.len()}),
        )
        .await;
        (!recalled.section.is_empty()).then_some(recalled.section)
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

    /// The tools offered to the model: `spec.tools` (with memory on, also the memory tools)
    /// found in the catalog or listed now by an external MCP server, and visible to `caller`.
    /// A server that cannot be listed offers nothing this time (said in an event).
    async fn offer(&self, view: &AgentView<'_>, caller: &Caller) -> Result<Offer, String> {
        let catalog = aegis_core::catalog::catalog().map_err(|e| e.to_string())?;
        let mut external = Vec::new();
        for entry in view
            .tools()
            .iter()
            .filter(|t| t.starts_with(mcp_servers::PREFIX))
        {
            match self.services.tools.offered(entry).await {
                Ok(found) => external.extend(found),
                Err(reason) => {
                    self.event(
                        "tools_unavailable",
                        json!({"entry": entry, "reason": reason}),
                    )
                    .await
                }
            }
        }
        let mut wanted = view.tools();
        if view.memory().is_some() {
            for tool in aegis_store::memory::MEMORY_TOOLS {
                if !wanted.iter().any(|t| t == tool) {
                    wanted.push(tool.to_owned());
                }
            }
        }
        let offered: Vec<&aegis_core::catalog::ToolSpec> = wanted
            .iter()
            .filter_map(|name| catalog.get(name))
            .chain(external.iter())
            .filter(|t| aegis_policy::may_see(caller, t))
            .collect();
        Ok(Offer {
            functions: offered
                .iter()
                .map(|t| (function_name(&t.name), t.name.clone()))
                .collect(),
            specs: offered
                .iter()
                .map(|t| ToolSpec {
                    name: function_name(&t.name),
                    description: t.description.clone(),
                    parameters: t.input_schema.clone(),
                })
                .collect(),
            tool_names: offered.iter().map(|t| t.name.clone()).collect(),
            memory_on: view.memory().is_some()
                && offered
                    .iter()
                    .any(|t| aegis_store::memory::MEMORY_TOOLS.contains(&t.name.as_str())),
        })
    }

    /// The execution's sandbox, made when an offered tool runs in one (`cmd.run`, `fs.*`),
    /// with the agent's volumes and the workflow's volumes copied in; recorded in `sandbox` at
    /// once, so that it is destroyed whatever happens next.
    async fn prepare_sandbox(
        &self,
        offer: &Offer,
        sandbox: &Arc<Mutex<Option<SandboxId>>>,
    ) -> Result<Option<SandboxId>, String> {
        if offer
            .tool_names
            .iter()
            .any(|t| aegis_policy::needs_sandbox(t))
        {
            let owner = Owner::new(OwnerKind::Execution, self.id.to_string());
            let (id, _) = self
                .services
                .sandboxes
                .create_for_definition(&self.services.pool, &self.def, owner)
                .await
                .map_err(|e| format!("could not create the sandbox: {e}"))?;
            if let Ok(mut s) = sandbox.lock() {
                *s = Some(id);
            }
            let _ = store::progress(&self.services.pool, self.id, 0, Some(id.0)).await;
            self.event("sandbox_created", json!({"sandbox_id": id.0}))
                .await;
        }
        let sandbox_id = sandbox.lock().ok().and_then(|s| *s);
        if let Some(id) = sandbox_id {
            self.restore_volumes(id).await?;
            self.restore_workspace(id).await?;
        } else if let Some(ws) = &self.workspace {
            // Nothing to mount them in; the agent could not touch files anyway.
            let names: Vec<&str> = ws.mounts.iter().map(|m| m.name.as_str()).collect();
            self.event(
                "workflow_volumes_not_mounted",
                json!({"volumes": names, "reason": "the agent offers no tool that runs in a sandbox (fs.*, cmd.run), so it gets no sandbox to mount them in"}),
            )
            .await;
        }
        Ok(sandbox_id)
    }

    /// The task as the model first reads it: the prompt template rendered, then what the agent
    /// remembers of earlier executions that matches it, read only when it may read its memory
    /// itself (a security context may withhold the tools).
    async fn prompt(&self, view: &AgentView<'_>, offer: &Offer) -> Result<String, String> {
        let template = view
            .prompt_template()
            .unwrap_or("{{instruction}}\n\nInput:\n{{input}}");
        let mut prompt = render(
            template,
            view.instruction(),
            self.intent.as_deref(),
            &self.input,
        )
        .map_err(|e| format!("spec.task.prompt_template: {e}"))?;
        if offer.tool_names.iter().any(|t| t == "aegis.memory.recall") {
            if let Some(section) = self.recall_memory(&prompt).await {
                prompt.push_str("\n\n");
                prompt.push_str(&section);
            }
        }
        Ok(prompt)
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

    /// The validators' verdict on an answer: `Ok` ends the execution completed with it; `Err`
    /// is the feedback for the next attempt (the answer is kept as the last output).
    async fn judge_answer(
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
    async fn validate(
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
    async fn judge(
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
            // The node's own judge (older `semantic` validations) is deployed when first needed.
            if judge == crate::builtin::SEMANTIC_JUDGE {
                if let Err(e) =
                    crate::builtin::ensure_judge(&self.services.pool, &self.tenant).await
                {
                    notes.push(format!("judge `{judge}` could not be deployed: {e}"));
                    continue;
                }
            }
            let request = super::ExecuteRequest {
                agent: judge.clone(),
                version: None,
                input: input.clone(),
                intent: Some(intent.to_owned()),
                parent: Some(self.id),
                workflow: None,
                model: v["model"].as_str().map(str::to_owned),
            };
            let child = match self
                .services
                .executions
                .start(&self.services, caller, request)
                .await
            {
                Ok(id) => id,
                Err(e) => {
                    notes.push(format!("judge `{judge}` could not start: {e}"));
                    continue;
                }
            };
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
                notes.push(format!(
                    "judge `{judge}` did not finish within {} s",
                    timeout.as_secs()
                ));
                continue;
            };
            self.event(
                "child_execution_completed",
                json!({"judge": judge, "execution_id": child, "status": e.status}),
            )
            .await;
            match e.last_output.as_deref().and_then(validate::parse_judgement) {
                Some((score, confidence, reasoning)) => {
                    notes.push(format!(
                        "`{judge}`: score {score:.2}, confidence {confidence:.2}: {reasoning}"
                    ));
                    judgements.push((score, confidence));
                }
                None => notes.push(format!(
                    "judge `{judge}` gave no JSON judgement ({})",
                    e.status
                )),
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

    /// Runs one tool call through the router; returns what the model reads back.
    async fn tool_call(
        &self,
        call: &aegis_llm::ToolCall,
        names: &HashMap<String, String>,
        caller: &Caller,
        sandbox: Option<SandboxId>,
        gate: Option<&dyn CallGate>,
        result: &mut IterationResult,
    ) -> String {
        let Some(tool) = names.get(&call.name) else {
            let text = format!(
                "Tool `{}` is not available to this agent. Do not retry it.",
                asked_tool(&call.name)
            );
            self.event(
                "tool_call",
                json!({"tool": call.name, "decision": "denied", "reason": "not offered"}),
            )
            .await;
            // A refused call is audited like every other, though it never reached the router:
            // the model asked for a tool this agent (or whoever started it) was not given.
            let asked: String = asked_tool(&call.name).chars().take(200).collect();
            let arguments = serde_json::from_str::<Value>(&call.arguments)
                .unwrap_or_else(|_| Value::String(call.arguments.clone()));
            let entry = aegis_store::audit::Entry {
                kind: aegis_store::audit::EntryKind::Tool,
                action: asked,
                allowed: false,
                reason_code: Some("tool_not_offered".to_owned()),
                reason: Some("the tool is not offered to this execution".to_owned()),
                args_digest: aegis_store::audit::digest(&arguments),
                outcome: "denied",
                result_digest: None,
                duration_ms: 0,
            };
            if let Err(e) = aegis_store::audit::record(&self.services.pool, caller, entry).await {
                tracing::warn!(execution = %self.id, error = %e, "cannot audit a refused tool call");
            }
            return text;
        };
        let args: Value = match serde_json::from_str(&call.arguments) {
            Ok(v) => v,
            Err(e) => {
                self.event(
                    "tool_call",
                    json!({"tool": tool, "decision": "denied", "reason": "arguments are not JSON"}),
                )
                .await;
                return format!(
                    "The arguments of `{tool}` are not valid JSON ({e}); send a JSON object."
                );
            }
        };
        match self
            .services
            .tools
            .invoke(caller, tool, args, sandbox, gate)
            .await
        {
            Ok(outcome) => {
                if tool == "cmd.run" {
                    if let Ok(v) = &outcome.result {
                        result.last_exit_code = v["exit_code"].as_i64();
                        if let Some(err) = v["stderr"].as_str() {
                            result.stderr.push_str(err);
                        }
                        let excerpt = |s: &str| s.chars().take(4096).collect::<String>();
                        self.event("console_output", json!({"stdout": excerpt(v["stdout"].as_str().unwrap_or_default()),
                            "stderr": excerpt(v["stderr"].as_str().unwrap_or_default()), "exit_code": v["exit_code"]})).await;
                    }
                }
                let mcp = outcome.to_mcp();
                let digest = aegis_store::audit::digest(&mcp);
                let (decision, error) = match &outcome.result {
                    Ok(_) => ("allowed", None),
                    Err(e) => ("allowed", Some(e.code)),
                };
                self.event(
                    "tool_call",
                    json!({"tool": tool, "decision": decision, "error": error,
                    "result_digest": digest, "duration_ms": outcome.duration_ms}),
                )
                .await;
                match &outcome.result {
                    Ok(v) => v.to_string(),
                    Err(e) => format!("Tool `{tool}` failed ({}): {}", e.code, e.message),
                }
            }
            Err(e) => {
                let (code, message) = match &e {
                    CallError::Denied { denial, .. } => {
                        (denial.code.to_owned(), denial.message.clone())
                    }
                    other => (refusal_code(other).to_owned(), other.to_string()),
                };
                self.event(
                    "tool_call",
                    json!({"tool": tool, "decision": "denied", "reason": code, "message": message}),
                )
                .await;
                format!("Tool `{tool}` was refused ({code}): {message}. Do not retry this call unchanged.")
            }
        }
    }
}

/// The judges of `spec.execution.tool_validation`, asked before each tool call of one
/// iteration: every validator in order must pass, else the call is refused with the judges'
/// reasoning, which the model reads as the tool's answer.
struct ToolGate<'a> {
    job: &'a Job,
    validators: &'a [Value],
    caller: &'a Caller,
    task: &'a str,
    tools: &'a [String],
    iteration: u32,
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

fn refusal_code(e: &CallError) -> &'static str {
    match e {
        CallError::UnknownTool { .. } => "unknown_tool",
        CallError::InvalidArguments { .. } => "invalid_arguments",
        CallError::Denied { .. } => "denied",
        CallError::Audit(_) => "audit_unavailable",
        CallError::Catalog(_) => "catalog",
        CallError::Unavailable { .. } => "tool_unavailable",
    }
}

/// An iteration that did not produce an answer.
/// The tools one execution is offered, in the forms each side needs.
struct Offer {
    /// Function name the model sees -> tool name.
    functions: HashMap<String, String>,
    /// What the model is told of each tool.
    specs: Vec<ToolSpec>,
    /// The tools' own names.
    tool_names: Vec<String>,
    /// Memory is on and its tools are offered (the system message says so).
    memory_on: bool,
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

enum IterationError {
    /// Try another iteration (with this as feedback).
    Retry(String),
    /// End the execution (the model provider failed).
    Fatal(String),
}

#[cfg(test)]
mod tests {
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
