//! `aegis.agent.generate` and `aegis.workflow.generate`: a model drafts a manifest from a text,
//! and nothing but a manifest that passes our own validation comes out.
//!
//! The node's model client (the aliases agents use) writes a draft; every draft goes through the
//! same schema and semantic checks as a deploy (`definitions::check`, against this node's tools,
//! runtimes and the caller's registry). The errors, each with its JSON pointer and line, go back
//! to the model as the next message of the same conversation, until a draft is valid or
//! `max_attempts` (default [`DEFAULT_ATTEMPTS`], at most [`MAX_ATTEMPTS`]) drafts were refused.
//! The result is returned with every attempt's errors. It is deployed only when the caller asks
//! (`deploy: true`), and then through the router as `aegis.agent.create` /
//! `aegis.workflow.create`, so the caller's tier, the policy and the audit apply exactly as if it
//! had deployed the manifest itself.
//!
//! AEGIS answers these tools with an execution id to wait on; here the call returns when the
//! loop ends (it is bounded by the attempts and the model client's timeouts), so there is
//! nothing to poll.

use serde::Deserialize;
use serde_json::{json, Value};

use super::definitions::{check, error_details, warning_details};
use super::{args, Handler, ToolContext, ToolError};
use aegis_llm::{ChatRequest, Message};
use aegis_manifest::{ManifestErrors, ManifestKind};

/// Drafts a generator makes when the caller does not say.
pub const DEFAULT_ATTEMPTS: u32 = 3;
/// Most drafts one call may ask for.
pub const MAX_ATTEMPTS: u32 = 10;

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![
        ("aegis.agent.generate", |ctx, a| {
            Box::pin(generate(ctx, a, ManifestKind::Agent))
        }),
        ("aegis.workflow.generate", |ctx, a| {
            Box::pin(generate(ctx, a, ManifestKind::Workflow))
        }),
    ]
}

#[derive(Deserialize)]
struct A {
    input: String,
    #[serde(default)]
    deploy: bool,
    #[serde(default)]
    force: bool,
    max_attempts: Option<u32>,
    model: Option<String>,
}

const AGENT_EXAMPLE: &str = r#"apiVersion: 100monkeys.ai/v1
kind: Agent
metadata:
  name: csv-summarizer
  version: "1.0.0"
  description: "Summarises a CSV file"
  labels:
    team: data
spec:
  runtime:
    language: python
    version: "3.11"
  task:
    instruction: |
      Read the CSV file named in the input and summarise its columns.
"#;

const WORKFLOW_EXAMPLE: &str = r#"apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata:
  name: greet-and-check
  version: "1.0.0"
  description: "Writes a greeting and checks it"
spec:
  initial_state: WRITE
  states:
    WRITE:
      kind: Agent
      agent: writer
      input: "Greet {{input.name}}"
      transitions:
        - condition: on_success
          target: SHOW
    SHOW:
      kind: System
      command: "echo done"
      transitions: []
"#;

/// The standing instructions: what to write, what this node offers, an example that validates.
fn system_prompt(kind: ManifestKind) -> String {
    let runtimes = aegis_core::runtimes::registry()
        .map(|r| {
            r.runtimes
                .iter()
                .map(|r| format!("{} {}", r.language, r.version))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let tools = super::catalog()
        .map(|c| {
            c.iter()
                .map(|t| t.name.clone())
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let (what, example, extra) = match kind {
        ManifestKind::Agent => (
            "an Agent manifest",
            AGENT_EXAMPLE,
            format!(
                "spec.runtime names one of these runtimes (language and version): {runtimes}. \
                 spec.tools, when present, lists tool names from: {tools}."
            ),
        ),
        ManifestKind::Workflow => (
            "a Workflow manifest",
            WORKFLOW_EXAMPLE,
            "State kinds: Agent, ParallelAgents, ContainerRun, ParallelContainerRun, System, Human, \
             Subworkflow. Agent states name agents that are deployed already."
                .to_owned(),
        ),
    };
    format!(
        "You write {what} for the AEGIS orchestrator (apiVersion 100monkeys.ai/v1) from a \
         description. Answer with the YAML manifest only, nothing before or after it. Names are \
         lower case with digits and dashes; versions are quoted semver strings. {extra}\n\n\
         A valid example:\n{example}"
    )
}

/// The errors of a refused draft, one line each with pointer and line, for the model.
fn feedback(errs: &ManifestErrors) -> String {
    let mut text = String::from(
        "That manifest is invalid. Fix every error below and answer with the whole corrected \
         manifest only.\n",
    );
    for e in &errs.0 {
        let pointer = if e.pointer.is_empty() {
            "(document)"
        } else {
            &e.pointer
        };
        match e.line {
            Some(line) => text.push_str(&format!(
                "- {pointer} (line {line}, {}): {}\n",
                e.stage, e.message
            )),
            None => text.push_str(&format!("- {pointer} ({}): {}\n", e.stage, e.message)),
        }
    }
    text
}

async fn generate(ctx: &ToolContext<'_>, a: Value, kind: ManifestKind) -> Result<Value, ToolError> {
    super::check_tenant(ctx, &a)?;
    let a: A = args(a)?;
    if a.input.trim().is_empty() {
        return Err(ToolError::new(
            "invalid_arguments",
            "`input` is blank: describe what the manifest should do",
        ));
    }
    let llm = ctx.state.executions.llm().map_err(|reason| {
        ToolError::new(
            "unavailable",
            format!(
                "no language model is configured on this node (llm in the node config): {reason}"
            ),
        )
    })?;
    if let Some(model) = &a.model {
        if !llm.aliases().iter().any(|m| m == model) {
            return Err(ToolError::new(
                "invalid_arguments",
                format!(
                    "`model`: `{model}` is not a model alias of this node (configured: {})",
                    llm.aliases().join(", ")
                ),
            ));
        }
    }
    let max_attempts = a
        .max_attempts
        .unwrap_or(DEFAULT_ATTEMPTS)
        .clamp(1, MAX_ATTEMPTS);
    let (tool, create) = match kind {
        ManifestKind::Agent => ("aegis.agent.generate", "aegis.agent.create"),
        ManifestKind::Workflow => ("aegis.workflow.generate", "aegis.workflow.create"),
    };
    let mut messages = vec![
        Message::system(system_prompt(kind)),
        Message::user(a.input.clone()),
    ];
    let mut attempts = Vec::new();
    for attempt in 1..=max_attempts {
        let answer = llm
            .chat(
                a.model.as_deref(),
                &ChatRequest {
                    messages: messages.clone(),
                    tools: Vec::new(),
                    temperature: None,
                },
            )
            .await
            .map_err(|e| {
                ToolError::new(
                    "model_error",
                    format!("the model failed on draft {attempt}: {e}"),
                )
                .with_details(json!({"attempts": attempts}))
            })?;
        let text = answer.message.content.unwrap_or_default();
        let draft = aegis_core::render::fenced_block(&text).to_owned();
        let checked = check(ctx, kind, &draft).await?;
        match checked.manifest {
            Ok(parsed) => {
                attempts.push(json!({"attempt": attempt, "valid": true, "errors": []}));
                let mut out = json!({
                    "tool": tool, "status": "completed", "valid": true,
                    "manifest_yaml": draft, "name": parsed.name,
                    "version": parsed.version.to_string(), "attempts": attempts,
                    "warnings": warning_details(&checked.warnings), "deployed": false,
                });
                if a.deploy {
                    out["deployment"] = deploy(ctx, create, &draft, a.force).await?;
                    out["deployed"] = json!(true);
                }
                return Ok(out);
            }
            Err(errs) => {
                attempts.push(json!({
                    "attempt": attempt, "valid": false, "errors": error_details(&errs),
                }));
                messages.push(Message::assistant(text));
                messages.push(Message::user(feedback(&errs)));
            }
        }
    }
    Err(ToolError::new(
        "generation_failed",
        format!(
            "no valid {} manifest after {max_attempts} draft(s); the errors of each are in details",
            kind.as_str()
        ),
    )
    .with_details(json!({"attempts": attempts})))
}

/// Deploys through the router as the caller, so tier, policy and audit are those of a deploy.
async fn deploy(
    ctx: &ToolContext<'_>,
    tool: &str,
    manifest_yaml: &str,
    force: bool,
) -> Result<Value, ToolError> {
    let outcome = super::invoke(
        ctx.state,
        ctx.caller,
        tool,
        json!({"manifest_yaml": manifest_yaml, "force": force}),
    )
    .await
    .map_err(|e| {
        ToolError::new(
            "deploy_refused",
            format!("the manifest is valid but {tool} was refused: {e}"),
        )
    })?;
    outcome.result.map_err(|e| ToolError {
        code: e.code,
        message: format!("the manifest is valid but {tool} failed: {}", e.message),
        details: e.details,
    })
}
