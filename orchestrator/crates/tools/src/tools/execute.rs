//! `aegis.execute.intent`, `aegis.execute.status`, `aegis.execute.wait`: intent to execution.
//!
//! An intent runs as an execution of the built-in workflow `aegis-intent-pipeline`
//! (`orchestrator/builtin/intent-pipeline.yaml`, deployed into the caller's tenant by
//! `builtin::ensure`): the language's writer agent drafts a program, a syntax check runs in the
//! language's runtime image, the program runs there without network, and a failed check or a
//! non-zero exit goes back to the writer with the error, a bounded number of times. This module
//! only chooses the runtime, refuses what cannot run here (no image for the language on this
//! node, a persistent volume), starts the run as the caller through the workflow engine, and
//! reads its result; it is an ordinary workflow execution, visible to the `aegis.workflow.*`
//! tools under the same ownership rules.

use serde::Deserialize;
use serde_json::{json, Value};

use super::check_tenant;
use super::workflows::{load, start};
use super::{args, Handler, HandlerFuture, ToolContext, ToolError};
use aegis_engines::builtin::{self, INTENT_PIPELINE};
use aegis_engines::workflow::store::{self, WorkflowExecution};
use aegis_engines::workflow::RunRequest;

/// Seconds a program may run when the caller does not say.
const DEFAULT_TIMEOUT_SECS: u64 = 120;

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![
        ("aegis.execute.intent", intent),
        ("aegis.execute.status", status),
        ("aegis.execute.wait", wait),
    ]
}

/// How one language is checked and run: program, flags, and the runtime registry's names for it.
struct Language {
    name: &'static str,
    /// `language` values of `runtime-images/registry.yaml` that provide it, preferred first.
    runtimes: &'static [&'static str],
    program: &'static str,
    run_flag: &'static str,
    check: [&'static str; 3],
}

const LANGUAGES: &[Language] = &[
    Language {
        name: "python",
        runtimes: &["python"],
        program: "python3",
        run_flag: "-c",
        check: [
            "python3",
            "-c",
            "import ast, sys; ast.parse(sys.argv[1], 'intent.py')",
        ],
    },
    Language {
        name: "bash",
        runtimes: &["bash", "shell"],
        program: "bash",
        run_flag: "-c",
        check: ["bash", "-n", "-c"],
    },
    Language {
        name: "javascript",
        runtimes: &["javascript", "node", "nodejs"],
        program: "node",
        run_flag: "-e",
        check: [
            "node",
            "-e",
            "new (require('vm').Script)(process.argv[1], {filename: 'intent.js'})",
        ],
    },
];

/// The image that runs `lang` here: the first registered runtime for it whose image is present.
async fn runtime_image(ctx: &ToolContext<'_>, lang: &Language) -> Result<String, ToolError> {
    let registry = aegis_core::runtimes::registry().map_err(ToolError::internal)?;
    let candidates: Vec<&str> = lang
        .runtimes
        .iter()
        .flat_map(|l| {
            registry
                .runtimes
                .iter()
                .filter(move |r| r.language == *l)
                .map(|r| r.image.as_str())
        })
        .collect();
    if candidates.is_empty() {
        return Err(ToolError::new(
            "runtime_missing",
            format!(
                "no {} runtime is registered on this node (runtime-images/registry.yaml has no language {}); \
                 the intent cannot run",
                lang.name,
                lang.runtimes.join(" or ")
            ),
        ));
    }
    for image in &candidates {
        match ctx.state.docker.image_present(image).await {
            Ok(true) => return Ok((*image).to_owned()),
            Ok(false) => {}
            Err(e) => {
                return Err(ToolError::new(
                    "unavailable",
                    format!(
                        "cannot check the {} runtime image `{image}`: {e}",
                        lang.name
                    ),
                ))
            }
        }
    }
    Err(ToolError::new(
        "runtime_missing",
        format!(
            "the {} runtime is not installed on this node: image {} is not present (build it with \
             runtime-images/build.sh --only {}); the intent cannot run",
            lang.name,
            candidates
                .iter()
                .map(|i| format!("`{i}`"))
                .collect::<Vec<_>>()
                .join(" or "),
            lang.runtimes[0]
        ),
    ))
}

fn intent<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        check_tenant(ctx, &a)?;
        #[derive(Deserialize)]
        struct A {
            intent: String,
            inputs: Option<Value>,
            volume_id: Option<String>,
            language: Option<String>,
            timeout_seconds: Option<u64>,
        }
        let a: A = args(a)?;
        if a.intent.trim().is_empty() {
            return Err(ToolError::new(
                "invalid_arguments",
                "`intent` is blank: say what should be done",
            ));
        }
        if a.volume_id.is_some() {
            return Err(ToolError::new(
                "unsupported",
                "`volume_id`: the intent pipeline runs in an ephemeral workspace on this node; \
                 persistent volumes cannot be attached to it (omit volume_id)",
            ));
        }
        let name = a.language.as_deref().unwrap_or("python");
        let lang = LANGUAGES.iter().find(|l| l.name == name).ok_or_else(|| {
            ToolError::new(
                "invalid_arguments",
                format!("`language`: `{name}` is not one of python, javascript, bash"),
            )
        })?;
        let image = runtime_image(ctx, lang).await?;
        builtin::ensure(&ctx.state.pool, &ctx.caller.tenant)
            .await
            .map_err(ToolError::internal)?;
        let input = json!({
            "intent": a.intent,
            "language": lang.name,
            "agent": format!("aegis-intent-{}", lang.name),
            "image": image,
            "program": lang.program,
            "run_flag": lang.run_flag,
            "check_program": lang.check[0],
            "check_arg1": lang.check[1],
            "check_arg2": lang.check[2],
            "timeout_seconds": a.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECS),
            "inputs": a.inputs.unwrap_or_else(|| json!({})),
        });
        let request = RunRequest {
            name: INTENT_PIPELINE.to_owned(),
            version: None,
            input,
            blackboard: None,
            intent: Some(a.intent),
        };
        let id = start(ctx, request).await?;
        Ok(json!({
            "tool": "aegis.execute.intent", "pipeline_execution_id": id, "execution_id": id,
            "status": "started", "language": lang.name, "image": image,
            "stream_url": format!("/v1/workflows/executions/{id}/events?follow=true"),
        }))
    })
}

/// The pipeline's view of a run: running, or its result, or where and why it failed.
fn pipeline_status(e: &WorkflowExecution) -> Value {
    let duration_ms = match (e.started_at, e.ended_at) {
        (Some(s), Some(end)) => Some((end - s).num_milliseconds().max(0)),
        _ => None,
    };
    let drafts = e.visits.get("GENERATE").cloned().unwrap_or(json!(0));
    match e.status.as_str() {
        "completed" => {
            let run = e.blackboard.get("RUN").cloned().unwrap_or(Value::Null);
            json!({
                "status": "completed", "pipeline_execution_id": e.id,
                "final_result": run.get("stdout").cloned().unwrap_or(Value::Null),
                "exit_code": run.get("exit_code").cloned().unwrap_or(Value::Null),
                "stderr": run.get("stderr").cloned().unwrap_or(Value::Null),
                "code": e.final_output.as_ref().and_then(|o| o.get("code")).cloned().unwrap_or(Value::Null),
                "language": e.input.get("language").cloned().unwrap_or(Value::Null),
                "drafts": drafts, "duration_ms": duration_ms,
                // The shipped writer agent is always used; no agent is generated.
                "reused_existing_agent": true,
            })
        }
        s if store::is_terminal(s) => json!({
            "status": s, "pipeline_execution_id": e.id,
            "reason": e.error, "failed_at_state": e.current_state, "drafts": drafts,
            "duration_ms": duration_ms,
        }),
        _ => json!({
            "status": "running", "pipeline_execution_id": e.id,
            "current_state": e.current_state, "drafts": drafts,
        }),
    }
}

/// A pipeline execution the caller may see (any other workflow's execution is "not found").
async fn load_pipeline(ctx: &ToolContext<'_>, id: &str) -> Result<WorkflowExecution, ToolError> {
    let e = load(ctx, id).await?;
    if e.workflow_name != INTENT_PIPELINE {
        return Err(ToolError::new(
            "not_found",
            format!("{id} is not an intent pipeline execution"),
        ));
    }
    Ok(e)
}

fn status<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        check_tenant(ctx, &a)?;
        #[derive(Deserialize)]
        struct A {
            pipeline_execution_id: String,
        }
        let a: A = args(a)?;
        let e = load_pipeline(ctx, &a.pipeline_execution_id).await?;
        let mut v = pipeline_status(&e);
        v["tool"] = json!("aegis.execute.status");
        Ok(v)
    })
}

/// `aegis.workflow.wait` on a pipeline execution, with the pipeline's view added.
fn wait<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        let id = a["execution_id"].as_str().unwrap_or_default().to_owned();
        load_pipeline(ctx, &id).await?;
        let mut v = super::workflows::wait_for(ctx, a).await?;
        let e = load_pipeline(ctx, &id).await?;
        v["tool"] = json!("aegis.execute.wait");
        v["pipeline"] = pipeline_status(&e);
        Ok(v)
    })
}
