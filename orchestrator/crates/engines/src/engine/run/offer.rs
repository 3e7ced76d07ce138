//! What an execution's model is offered and told: the tools (as functions, built-in and
//! external), the recalled memory, the prompt, the sandbox they run in, and one tool call
//! through the router.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aegis_core::caller::Caller;
use aegis_egress::mcp_servers;
use aegis_llm::ToolSpec;
use aegis_manifest::AgentView;
use dispatcher::{Owner, OwnerKind, SandboxId};
use serde_json::{json, Value};

use super::{render, Job};
use crate::call::{CallError, CallGate};
use crate::engine::store;
use crate::engine::validate::IterationResult;

impl Job {
    /// The memory section of this execution's prompt (`aegis_store::memory::prompt`): the notes of
    /// its memory that match `task` (the rendered prompt and the intent), within the manifest's
    /// `recall_tokens` capped by the node's `memory.max_recall_tokens`. `None` when memory is
    /// off, the budget is 0, nothing matches, or the memory cannot be read (said in the events:
    /// the execution goes on without it).
    pub(super) async fn recall_memory(&self, task: &str) -> Option<String> {
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

    /// The tools offered to the model: `spec.tools` (with memory on, also the memory tools)
    /// found in the catalog or listed now by an external MCP server, and visible to `caller`.
    /// A server that cannot be listed offers nothing this time (said in an event).
    pub(super) async fn offer(
        &self,
        view: &AgentView<'_>,
        caller: &Caller,
    ) -> Result<Offer, String> {
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
    pub(super) async fn prepare_sandbox(
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
    pub(super) async fn prompt(
        &self,
        view: &AgentView<'_>,
        offer: &Offer,
    ) -> Result<String, String> {
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

    /// Runs one tool call through the router; returns what the model reads back.
    pub(super) async fn tool_call(
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
                sandbox_id: None,
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
                    Ok(v) => for_the_model(tool, v),
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

/// A tool's result as the model reads it: its JSON, except that a `code.run` plot's image
/// bytes (base64 a chat model cannot look at, and which would fill its context) are replaced
/// by their size; the result stored and audited keeps them.
fn for_the_model(tool: &str, result: &Value) -> String {
    if tool != "code.run" {
        return result.to_string();
    }
    let mut shown = result.clone();
    for item in shown["results"].as_array_mut().into_iter().flatten() {
        for format in ["png", "jpeg"] {
            if let Some(data) = item.get(format).and_then(Value::as_str) {
                item[format] = json!(format!("<{format} image, {} bytes of base64>", data.len()));
            }
        }
    }
    shown.to_string()
}

/// OpenAI function names allow no dots: `fs.read` is offered as `fs__read`.
pub(super) fn function_name(tool: &str) -> String {
    match mcp_servers::split_name(tool) {
        Some((server, name)) => external_function_name(server, name),
        None => tool.replace('.', "__"),
    }
}

/// The tool a function name the model asked for stands for, as far as it can be told from the
/// name alone (for a name no tool of this execution has): `mcp_<server>__<tool>` is
/// `mcp:<server>/<tool>`, else `a__b` is `a.b`.
pub(super) fn asked_tool(function: &str) -> String {
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
pub(super) fn external_function_name(server: &str, tool: &str) -> String {
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

pub(super) fn refusal_code(e: &CallError) -> &'static str {
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
pub(super) struct Offer {
    /// Function name the model sees -> tool name.
    pub(super) functions: HashMap<String, String>,
    /// What the model is told of each tool.
    pub(super) specs: Vec<ToolSpec>,
    /// The tools' own names.
    pub(super) tool_names: Vec<String>,
    /// Memory is on and its tools are offered (the system message says so).
    pub(super) memory_on: bool,
}
