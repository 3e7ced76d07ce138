//! `aegis.agent.*` and `aegis.workflow.*` registry tools: validate, deploy, list, export, delete.
//!
//! Agents and workflows share one registry and one set of rules, so each tool here is a thin
//! wrapper choosing the manifest kind.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{args, Handler, HandlerFuture, ToolContext, ToolError};
use aegis_manifest::{
    self as manifest, Deployed, ManifestError, ManifestErrors, ManifestKind, NodeKnowledge,
    Validation,
};
use aegis_store::registry::{self, DeployMode, RegistryError, ScopeFilter};

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![
        ("aegis.agent.create", agent_create),
        ("aegis.agent.update", agent_update),
        ("aegis.agent.list", agent_list),
        ("aegis.agent.export", agent_export),
        ("aegis.agent.delete", agent_delete),
        ("aegis.workflow.create", workflow_create),
        ("aegis.workflow.update", workflow_update),
        ("aegis.workflow.list", workflow_list),
        ("aegis.workflow.validate", workflow_validate),
        ("aegis.workflow.export", workflow_export),
        ("aegis.workflow.delete", workflow_delete),
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
fn workflow_list<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            scope: Option<ListScope>,
        }
        super::check_tenant(ctx, &a)?;
        let a: A = args(a)?;
        list_in(ctx, ManifestKind::Workflow, ListScope::filter(a.scope)).await
    })
}
fn workflow_validate<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            manifest_yaml: String,
        }
        let a: A = args(a)?;
        let checked = check(ctx, ManifestKind::Workflow, &a.manifest_yaml).await?;
        Ok(validation_report(&checked))
    })
}
fn workflow_export<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(export(ctx, a, ManifestKind::Workflow))
}
fn workflow_delete<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(delete(ctx, a, ManifestKind::Workflow))
}

/// The node facts semantic checks need: implemented tools, registered runtimes, the node's
/// runtime aliases, default `cmd.run` allowlists and external MCP servers.
fn node_knowledge<R>(
    config: &aegis_config::NodeConfig,
    f: impl FnOnce(&NodeKnowledge<'_>) -> R,
) -> R {
    let tool_exists = |name: &str| super::catalog().is_ok_and(|c| c.contains(name));
    let runtime_known =
        |language: &str, version: &str| aegis_core::runtimes::known(language, version);
    let default_command_allowlist = |language: &str| {
        config
            .sandbox
            .default_command_allowlists
            .get(language)
            .cloned()
    };
    let mcp_servers: Vec<String> = config.mcp_servers.iter().map(|s| s.name.clone()).collect();
    f(&NodeKnowledge {
        tool_exists: &tool_exists,
        runtime_known: &runtime_known,
        default_command_allowlist: &default_command_allowlist,
        runs_in_sandbox: &aegis_policy::needs_sandbox,
        runtime_alias: &|language, version| config.sandbox.runtime_alias(language, version),
        runtime_versions: &aegis_core::runtimes::versions,
        mcp_servers: &mcp_servers,
    })
}

/// Validates one manifest file without a database, as `orchestrator validate` does: the kind
/// comes from its `kind` key, tools and runtimes from this build, and references to other
/// definitions are not checked (there is no registry to check them against).
pub fn validate_offline(
    text: &str,
    config: &aegis_config::NodeConfig,
) -> Result<(ManifestKind, Validation), ManifestErrors> {
    let kind = manifest::kind_of(text).ok_or_else(|| {
        ManifestErrors(vec![ManifestError::new(
            manifest::Stage::Schema,
            "/kind",
            "`kind` must be `Agent` or `Workflow`",
        )])
    })?;
    Ok((
        kind,
        node_knowledge(config, |node| {
            manifest::parse_checked(kind, text, node, None)
        }),
    ))
}

/// The caller's registry as validation sees it: deployed agents and workflows (by name and id,
/// workflows with the children their blocking Subworkflow states wait for).
async fn deployed(ctx: &ToolContext<'_>) -> Result<Deployed, ToolError> {
    let mut deployed = Deployed::new();
    let pool = &ctx.state.pool;
    let tenant = &ctx.caller.tenant;
    for agent in registry::list(pool, tenant, ManifestKind::Agent)
        .await
        .map_err(registry_error)?
    {
        deployed.add_agent(&agent.id.to_string(), &agent.name);
    }
    // Listed own-first per name; added in reverse so that, for a name another tenant's global
    // workflow shares, the tenant's own (what the name resolves to) is added last and wins.
    let visible = registry::list_in(pool, tenant, ManifestKind::Workflow, ScopeFilter::Visible)
        .await
        .map_err(registry_error)?;
    for workflow in visible.into_iter().rev() {
        deployed.add_workflow(&workflow.id.to_string(), &workflow.name, &workflow.manifest);
    }
    Ok(deployed)
}

/// Validates against the node and the caller's registry: errors and warnings.
pub(crate) async fn check(
    ctx: &ToolContext<'_>,
    kind: ManifestKind,
    text: &str,
) -> Result<Validation, ToolError> {
    let deployed = deployed(ctx).await?;
    let mut checked = node_knowledge(&ctx.state.config, |node| {
        manifest::parse_checked(kind, text, node, Some(&deployed))
    });
    // Delivery destinations this node cannot serve (email, undefined signing secrets).
    if let (ManifestKind::Agent, Ok(parsed)) = (kind, &checked.manifest) {
        let problems =
            aegis_egress::delivery::check_manifest(&parsed.value, &ctx.state.config.delivery);
        // A grant of network this node cannot honour: said now, not first when a sandbox fails.
        if manifest::AgentView(&parsed.value).network_egress() {
            let name = parsed.name.clone();
            if let Some(why) = aegis_sandboxes::egress::network_unavailable(&ctx.state.docker).await
            {
                checked.warnings.push(ManifestError::new(
                    manifest::Stage::Semantic,
                    "/spec/security/network",
                    format!(
                        "agent `{name}` grants network, but this node cannot give a sandbox \
                         network, so creating its sandboxes will fail: {why} (README, Sandbox egress)"
                    ),
                ));
            }
        }
        manifest::refuse_after(&mut checked, text, problems);
    }
    Ok(checked)
}

/// `{valid, errors, warnings}` as the tool reference documents, plus structured details.
pub(crate) fn validation_report(checked: &Validation) -> Value {
    let warnings = warning_details(&checked.warnings);
    match &checked.manifest {
        Ok(_) => json!({"valid": true, "errors": null, "warnings": warnings}),
        Err(errs) => json!({
            "valid": false,
            "errors": errs.0.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "details": error_details(errs),
            "warnings": warnings,
        }),
    }
}

/// Each warning as `{pointer, line, message}`.
pub(crate) fn warning_details(warnings: &[ManifestError]) -> Value {
    Value::Array(
        warnings
            .iter()
            .map(|w| json!({"pointer": w.pointer, "line": w.line, "message": w.message}))
            .collect(),
    )
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

/// The `scope` argument of the workflow list and the searches: whose definitions to include
/// besides the caller's own.
#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum ListScope {
    Global,
    Visible,
}

impl ListScope {
    /// The registry's filter for a `scope` argument (the caller's own when absent).
    pub(super) fn filter(scope: Option<ListScope>) -> ScopeFilter {
        match scope {
            None => ScopeFilter::Owned,
            Some(ListScope::Global) => ScopeFilter::Global,
            Some(ListScope::Visible) => ScopeFilter::Visible,
        }
    }
}

/// The id of a definition named by UUID or by name (latest version), for list filters.
pub(crate) async fn definition_id(
    ctx: &ToolContext<'_>,
    kind: aegis_manifest::ManifestKind,
    name_or_id: &str,
) -> Result<uuid::Uuid, ToolError> {
    if let Ok(id) = uuid::Uuid::parse_str(name_or_id) {
        return Ok(id);
    }
    Ok(
        aegis_store::registry::get(&ctx.state.pool, &ctx.caller.tenant, kind, name_or_id, None)
            .await
            .map_err(registry_error)?
            .id,
    )
}

/// [`definition_id`] of a list filter that may be absent.
pub(crate) async fn definition_id_of(
    ctx: &ToolContext<'_>,
    kind: aegis_manifest::ManifestKind,
    name_or_id: Option<String>,
) -> Result<Option<uuid::Uuid>, ToolError> {
    match name_or_id {
        Some(name_or_id) => Ok(Some(definition_id(ctx, kind, &name_or_id).await?)),
        None => Ok(None),
    }
}

pub fn registry_error(e: RegistryError) -> ToolError {
    match e {
        RegistryError::NotFound { .. } => ToolError::new("not_found", e.to_string()),
        RegistryError::VersionExists { .. } | RegistryError::NetworkPolicyChanged { .. } => {
            ToolError::new("conflict", e.to_string())
        }
        RegistryError::SameScope { scope, .. } => {
            ToolError::new("conflict", e.to_string()).with_details(json!({"current_scope": scope}))
        }
        RegistryError::NameCollision {
            scope, existing, ..
        } => ToolError::new("conflict", e.to_string())
            .with_details(json!({"scope": scope, "existing_workflow_id": existing})),
        RegistryError::RevisionWithoutVersion => ToolError::new("invalid_arguments", e.to_string()),
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
    let checked = check(ctx, kind, &a.manifest_yaml).await?;
    let warnings = warning_details(&checked.warnings);
    let parsed = checked.manifest.map_err(|errs| {
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
        "revision": d.revision,
        "manifest_digest": d.manifest_digest,
        "replaced": d.replaced,
        "unchanged": d.unchanged,
        "warnings": warnings,
    }))
}

async fn list(ctx: &ToolContext<'_>, kind: ManifestKind) -> Result<Value, ToolError> {
    list_in(ctx, kind, ScopeFilter::Owned).await
}

async fn list_in(
    ctx: &ToolContext<'_>,
    kind: ManifestKind,
    filter: ScopeFilter,
) -> Result<Value, ToolError> {
    let defs = registry::list_in(&ctx.state.pool, &ctx.caller.tenant, kind, filter)
        .await
        .map_err(registry_error)?;
    Ok(match kind {
        ManifestKind::Agent => json!({"agents": defs.iter().map(|d| json!({
            "id": d.id, "name": d.name, "version": d.version, "status": "active",
            "type": manifest::AgentView(&d.manifest).agent_type(),
            "description": d.description, "labels": d.labels,
        })).collect::<Vec<_>>()}),
        ManifestKind::Workflow => json!({"workflows": defs.into_iter().map(|d| {
            let d = d.with_schedule();
            json!({
                "id": d.id, "name": d.name, "version": d.version,
                "initial_state": d.manifest["spec"]["initial_state"], "scope": d.scope,
                "description": d.description, "labels": d.labels, "schedule": d.schedule,
            })
        }).collect::<Vec<_>>()}),
    })
}

async fn export(ctx: &ToolContext<'_>, a: Value, kind: ManifestKind) -> Result<Value, ToolError> {
    #[derive(Deserialize)]
    struct A {
        name: String,
        version: Option<String>,
        revision: Option<i32>,
    }
    let a: A = args(a)?;
    let d = registry::get_revision(
        &ctx.state.pool,
        &ctx.caller.tenant,
        kind,
        &a.name,
        a.version.as_deref(),
        a.revision,
    )
    .await
    .map_err(registry_error)?;
    Ok(json!({
        "manifest_yaml": d.manifest_yaml, "id": d.id, "name": d.name, "version": d.version,
        "revision": d.revision, "manifest_digest": d.manifest_digest, "scope": d.scope,
    }))
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
