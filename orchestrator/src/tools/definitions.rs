//! `aegis.agent.*` and `aegis.workflow.*` registry tools: validate, deploy, list, export, delete.
//!
//! Agents and workflows share one registry and one set of rules, so each tool here is a thin
//! wrapper choosing the manifest kind.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{args, Handler, HandlerFuture, ToolContext, ToolError};
use crate::manifest::{self, ManifestErrors, ManifestKind, NodeKnowledge, ParsedManifest};
use crate::registry::{self, DeployMode, RegistryError};

pub(super) fn handlers() -> Vec<(&'static str, &'static str, Handler)> {
    vec![
        (
            "aegis.agent.create",
            include_str!("../../../schemas/tools/aegis.agent.create.json"),
            agent_create,
        ),
        (
            "aegis.agent.update",
            include_str!("../../../schemas/tools/aegis.agent.update.json"),
            agent_update,
        ),
        (
            "aegis.agent.list",
            include_str!("../../../schemas/tools/aegis.agent.list.json"),
            agent_list,
        ),
        (
            "aegis.agent.export",
            include_str!("../../../schemas/tools/aegis.agent.export.json"),
            agent_export,
        ),
        (
            "aegis.agent.delete",
            include_str!("../../../schemas/tools/aegis.agent.delete.json"),
            agent_delete,
        ),
        (
            "aegis.workflow.create",
            include_str!("../../../schemas/tools/aegis.workflow.create.json"),
            workflow_create,
        ),
        (
            "aegis.workflow.update",
            include_str!("../../../schemas/tools/aegis.workflow.update.json"),
            workflow_update,
        ),
        (
            "aegis.workflow.list",
            include_str!("../../../schemas/tools/aegis.workflow.list.json"),
            workflow_list,
        ),
        (
            "aegis.workflow.validate",
            include_str!("../../../schemas/tools/aegis.workflow.validate.json"),
            workflow_validate,
        ),
        (
            "aegis.workflow.export",
            include_str!("../../../schemas/tools/aegis.workflow.export.json"),
            workflow_export,
        ),
        (
            "aegis.workflow.delete",
            include_str!("../../../schemas/tools/aegis.workflow.delete.json"),
            workflow_delete,
        ),
    ]
}

fn agent_create<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(deploy(ctx, a, ManifestKind::Agent, DeployMode::Create))
}
fn agent_update<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(deploy(ctx, a, ManifestKind::Agent, DeployMode::Update))
}
fn agent_list<'a>(ctx: &'a ToolContext<'a>, _: Value) -> HandlerFuture<'a> {
    Box::pin(list(ctx, ManifestKind::Agent))
}
fn agent_export<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(export(ctx, a, ManifestKind::Agent))
}
fn agent_delete<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(delete(ctx, a, ManifestKind::Agent))
}
fn workflow_create<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(deploy(ctx, a, ManifestKind::Workflow, DeployMode::Create))
}
fn workflow_update<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(deploy(ctx, a, ManifestKind::Workflow, DeployMode::Update))
}
fn workflow_list<'a>(ctx: &'a ToolContext<'a>, _: Value) -> HandlerFuture<'a> {
    Box::pin(list(ctx, ManifestKind::Workflow))
}
fn workflow_validate<'a>(_: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            manifest_yaml: String,
        }
        let a: A = args(a)?;
        Ok(validation_report(
            parse(ManifestKind::Workflow, &a.manifest_yaml).err(),
        ))
    })
}
fn workflow_export<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(export(ctx, a, ManifestKind::Workflow))
}
fn workflow_delete<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(delete(ctx, a, ManifestKind::Workflow))
}

/// The node facts semantic checks need: implemented tools and registered runtimes.
pub(crate) fn parse(kind: ManifestKind, text: &str) -> Result<ParsedManifest, ManifestErrors> {
    let tool_exists = |name: &str| super::catalog().is_ok_and(|c| c.contains(name));
    let runtime_known = |language: &str, version: &str| crate::runtimes::known(language, version);
    let node = NodeKnowledge {
        tool_exists: &tool_exists,
        runtime_known: &runtime_known,
    };
    manifest::parse(kind, text, &node)
}

/// `{valid, errors}` as the tool reference documents, plus structured details.
pub(crate) fn validation_report(errors: Option<ManifestErrors>) -> Value {
    match errors {
        None => json!({"valid": true, "errors": null}),
        Some(errs) => json!({
            "valid": false,
            "errors": errs.0.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "details": error_details(&errs),
        }),
    }
}

/// Each manifest error as `{stage, path, line, column, message}`.
pub(crate) fn error_details(errs: &ManifestErrors) -> Value {
    Value::Array(
        errs.0
            .iter()
            .map(|e| {
                json!({
                    "stage": format!("{:?}", e.stage).to_lowercase(),
                    "path": e.pointer,
                    "line": e.line,
                    "column": e.column,
                    "message": e.message,
                })
            })
            .collect(),
    )
}

fn kind_name(kind: ManifestKind) -> &'static str {
    match kind {
        ManifestKind::Agent => "agent",
        ManifestKind::Workflow => "workflow",
    }
}

pub(crate) fn registry_error(e: RegistryError) -> ToolError {
    match e {
        RegistryError::NotFound { .. } => ToolError::new("not_found", e.to_string()),
        RegistryError::VersionExists { .. } => ToolError::new("conflict", e.to_string()),
        RegistryError::Db(e) => ToolError::internal(e),
    }
}

async fn deploy(
    ctx: &ToolContext<'_>,
    a: Value,
    kind: ManifestKind,
    mode: DeployMode,
) -> Result<Value, ToolError> {
    #[derive(Deserialize)]
    struct A {
        manifest_yaml: String,
        #[serde(default)]
        force: bool,
    }
    let a: A = args(a)?;
    let parsed = parse(kind, &a.manifest_yaml).map_err(|errs| {
        ToolError::new(
            "invalid_manifest",
            format!("the {} manifest is invalid: {errs}", kind_name(kind)),
        )
        .with_details(error_details(&errs))
    })?;
    let d = registry::deploy(&ctx.state.pool, &ctx.caller.tenant, &parsed, mode, a.force)
        .await
        .map_err(registry_error)?;
    let id_key = match kind {
        ManifestKind::Agent => "agent_id",
        ManifestKind::Workflow => "workflow_id",
    };
    Ok(json!({
        id_key: d.id,
        "deployed": true,
        "name": d.name,
        "version": d.version,
        "replaced": d.replaced,
    }))
}

async fn list(ctx: &ToolContext<'_>, kind: ManifestKind) -> Result<Value, ToolError> {
    let defs = registry::list(&ctx.state.pool, &ctx.caller.tenant, kind)
        .await
        .map_err(registry_error)?;
    Ok(match kind {
        ManifestKind::Agent => json!({"agents": defs.iter().map(|d| json!({
            "id": d.id, "name": d.name, "version": d.version, "status": "active",
            "description": d.description, "labels": d.labels,
        })).collect::<Vec<_>>()}),
        ManifestKind::Workflow => json!({"workflows": defs.iter().map(|d| json!({
            "id": d.id, "name": d.name, "version": d.version,
            "initial_state": d.manifest["spec"]["initial_state"],
            "description": d.description, "labels": d.labels,
        })).collect::<Vec<_>>()}),
    })
}

async fn export(ctx: &ToolContext<'_>, a: Value, kind: ManifestKind) -> Result<Value, ToolError> {
    #[derive(Deserialize)]
    struct A {
        name: String,
        version: Option<String>,
    }
    let a: A = args(a)?;
    let d = registry::get(
        &ctx.state.pool,
        &ctx.caller.tenant,
        kind,
        &a.name,
        a.version.as_deref(),
    )
    .await
    .map_err(registry_error)?;
    Ok(json!({"manifest_yaml": d.manifest_yaml, "id": d.id, "name": d.name, "version": d.version}))
}

async fn delete(ctx: &ToolContext<'_>, a: Value, kind: ManifestKind) -> Result<Value, ToolError> {
    let (key, target) = match kind {
        ManifestKind::Agent => ("agent_id", a["agent_id"].as_str()),
        ManifestKind::Workflow => ("name", a["name"].as_str()),
    };
    let target = target
        .ok_or_else(|| ToolError::new("invalid_arguments", format!("`{key}` is required")))?;
    let id = registry::delete(&ctx.state.pool, &ctx.caller.tenant, kind, target)
        .await
        .map_err(registry_error)?;
    let id_key = match kind {
        ManifestKind::Agent => "agent_id",
        ManifestKind::Workflow => "workflow_id",
    };
    Ok(json!({id_key: id, "deleted": true}))
}
