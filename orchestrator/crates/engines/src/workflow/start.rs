//! Starting a run: everything is checked before anything is stored.
//!
//! The workflow version must exist; the input must satisfy `metadata.input_schema`; run-time
//! blackboard overrides may not touch reserved keys; every agent an `Agent`/`ParallelAgents`
//! state (or its judges) names must be deployed and every `Subworkflow` target must exist; the
//! run's volumes must be mountable (`workspaces::problems`); and fields this node does not
//! implement are refused by name rather than ignored. Then the row
//! and its first events are written in one transaction. Subworkflow states start their children
//! through the same function.

use serde_json::{json, Map, Value};
use sqlx::PgPool;
use uuid::Uuid;

use super::{is_reserved_key, object, store, WorkflowError};
use aegis_core::render;
use aegis_egress::DomainEntry;
use aegis_manifest::{ManifestKind, WorkflowView};
use aegis_store::registry::{self, RegistryError};

/// What a caller asks to run.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    /// Workflow name or id.
    pub name: String,
    /// Version (default latest).
    pub version: Option<String>,
    /// Input, validated against `metadata.input_schema`.
    pub input: Value,
    /// Blackboard overrides (reserved keys refused).
    pub blackboard: Option<Map<String, Value>>,
    /// Natural-language intent.
    pub intent: Option<String>,
}

/// Who starts, and the node limits that apply.
pub(super) struct Starter<'a> {
    pub tenant: &'a str,
    pub caller_kind: &'a str,
    pub caller_id: &'a str,
    /// The starter's rights, kept with the execution (see `workflow::ceiling`).
    pub ceiling: Option<&'a Value>,
    pub allow_network_modes: &'a [String],
    pub max_execution_secs: u64,
    /// Largest size limit of a workflow volume, MiB (`volumes.max_size_mb`).
    pub volume_max_mb: u64,
}

/// Validates and stores a run; `parent` links a Subworkflow child to (execution, state, visit).
pub(super) async fn start(
    pool: &PgPool,
    who: &Starter<'_>,
    req: RunRequest,
    parent: Option<(Uuid, &str, i32)>,
) -> Result<Uuid, WorkflowError> {
    let def = registry::get(
        pool,
        who.tenant,
        ManifestKind::Workflow,
        &req.name,
        req.version.as_deref(),
    )
    .await?;
    let view = WorkflowView(&def.manifest);
    if let Some(schema) = view.input_schema() {
        check_input(schema, &req.input)?;
    }
    let overrides = req.blackboard.unwrap_or_default();
    check_overrides(&view, &overrides)?;
    let problems = runnable(pool, who, &def.manifest).await?;
    if !problems.is_empty() {
        return Err(WorkflowError::NotRunnable(problems));
    }

    let id = Uuid::new_v4();
    let blackboard = initial_blackboard(&def, id, overrides, &req.input, &req.intent);
    store::insert(
        pool,
        &store::NewExecution {
            id,
            tenant: who.tenant,
            workflow_id: def.id,
            workflow_version_id: def.version_id,
            workflow_name: &def.name,
            workflow_version: &def.version,
            parent,
            initial_state: view.initial_state(),
            blackboard: &blackboard,
            input: &req.input,
            intent: req.intent.as_deref(),
            caller_kind: who.caller_kind,
            caller_id: who.caller_id,
            ceiling: who.ceiling,
            max_secs: who.max_execution_secs,
        },
    )
    .await?;
    Ok(id)
}

/// Checking the input against `metadata.input_schema`: every error, each prefixed with where
/// in the input it is.
fn check_input(schema: &Value, input: &Value) -> Result<(), WorkflowError> {
    let validator = jsonschema::validator_for(schema).map_err(|e| {
        WorkflowError::NotRunnable(vec![format!("metadata.input_schema does not compile: {e}")])
    })?;
    let errors: Vec<String> = validator
        .iter_errors(input)
        .map(|e| {
            let path = e.instance_path().to_string();
            format!("{}: {e}", if path.is_empty() { "(input)" } else { &path })
        })
        .collect();
    if !errors.is_empty() {
        return Err(WorkflowError::InvalidInput(errors));
    }
    Ok(())
}

/// Checking the run-time blackboard overrides: no reserved key, and every key the templates
/// read that no state writes is given.
fn check_overrides(
    view: &WorkflowView<'_>,
    overrides: &Map<String, Value>,
) -> Result<(), WorkflowError> {
    let reserved: Vec<String> = overrides
        .keys()
        .filter(|k| is_reserved_key(k))
        .cloned()
        .collect();
    if !reserved.is_empty() {
        return Err(WorkflowError::ReservedKeys(reserved));
    }
    let missing: Vec<String> = aegis_manifest::run_supplied_keys(view.0)
        .into_iter()
        .filter(|key| !overrides.contains_key(key))
        .map(|key| {
            format!(
                "blackboard key `{key}` is read by this workflow's templates and written by none \
                 of its states: give it when starting the run (`blackboard: {{\"{key}\": ...}}`)"
            )
        })
        .collect();
    if !missing.is_empty() {
        return Err(WorkflowError::NotRunnable(missing));
    }
    Ok(())
}

/// The run's first blackboard, built once everything is checked: `spec.context`, the
/// overrides, `input`, `intent`, `workflow` and the workspace volume's id.
fn initial_blackboard(
    def: &registry::Definition,
    id: Uuid,
    overrides: Map<String, Value>,
    input: &Value,
    intent: &Option<String>,
) -> Value {
    let mut blackboard = object(
        def.manifest
            .pointer("/spec/context")
            .unwrap_or(&Value::Null),
    );
    blackboard.extend(overrides);
    blackboard.insert("input".into(), input.clone());
    blackboard.insert(
        "intent".into(),
        intent.clone().map(Value::String).unwrap_or(Value::Null),
    );
    // As AEGIS does (`workflow: {name, version, ...input}`), the run's input keys are also read
    // as `{{workflow.KEY}}`; the run's own facts win over an input key of the same name.
    let mut workflow = match input {
        Value::Object(fields) => fields.clone(),
        _ => serde_json::Map::new(),
    };
    for (key, value) in [
        ("name", json!(def.name)),
        ("version", json!(def.version)),
        ("execution_id", json!(id)),
        ("input", input.clone()),
    ] {
        workflow.insert(key.into(), value);
    }
    blackboard.insert("workflow".into(), Value::Object(workflow));
    if let Some(workspace) = def.manifest.pointer("/spec/storage/workspace") {
        let key = workspace
            .get("blackboard_key")
            .and_then(Value::as_str)
            .unwrap_or("workspace_volume_id");
        blackboard.insert(
            key.into(),
            aegis_sandboxes::workspaces::workspace_id(id).into(),
        );
    }
    Value::Object(blackboard)
}

/// Everything that keeps this manifest from running here, each naming the state and field.
async fn runnable(
    pool: &PgPool,
    who: &Starter<'_>,
    manifest: &Value,
) -> Result<Vec<String>, sqlx::Error> {
    let view = WorkflowView(manifest);
    let mut problems = aegis_sandboxes::workspaces::problems(manifest, who.volume_max_mb);
    if let Some(list) = manifest.pointer("/spec/network_allowlist") {
        problems.extend(allowlist_problems(list, "spec.network_allowlist"));
    }
    let mut agents: Vec<(String, String)> = Vec::new();
    let mut workflows: Vec<(String, String)> = Vec::new();
    for name in view.state_names() {
        let Some(state) = view.state(name) else {
            continue;
        };
        let at = |field: &str| format!("spec.states.{name}.{field}");
        if is_reserved_key(name) {
            problems.push(format!(
                "state name `{name}` is reserved (it would shadow the blackboard key of the same name)"
            ));
        }
        for unsupported in [
            "output_handler",
            "pre_execution_validator",
            "judges_for_parallel",
            "registry_credentials",
        ] {
            if state.get(unsupported).is_some() {
                problems.push(format!("{} is not supported on this node", at(unsupported)));
            }
        }
        match state.get("kind").and_then(Value::as_str).unwrap_or("") {
            "System" => problems.extend(command_problems(state, &at(""))),
            "Agent" => {
                if let Some(a) = state.get("agent").and_then(Value::as_str) {
                    agents.push((a.to_owned(), at("agent")));
                }
                for (i, j) in array(state, "judges").iter().enumerate() {
                    if let Some(a) = j.get("agent_id").and_then(Value::as_str) {
                        agents.push((a.to_owned(), at(&format!("judges[{i}].agent_id"))));
                    }
                }
            }
            "ParallelAgents" => {
                for (i, a) in array(state, "agents").iter().enumerate() {
                    if let Some(a) = a.get("agent").and_then(Value::as_str) {
                        agents.push((a.to_owned(), at(&format!("agents[{i}].agent"))));
                    }
                }
            }
            "ContainerRun" => {
                problems.extend(container_problems(state, &at(""), who.allow_network_modes))
            }
            "ParallelContainerRun" => {
                for (i, step) in array(state, "steps").iter().enumerate() {
                    problems.extend(container_problems(
                        step,
                        &at(&format!("steps[{i}].")),
                        who.allow_network_modes,
                    ));
                }
            }
            "Subworkflow" => {
                if let Some(w) = state.get("workflow_id").and_then(Value::as_str) {
                    workflows.push((w.to_owned(), at("workflow_id")));
                }
            }
            _ => {}
        }
    }
    // Every definition the states name must exist; an agent name rendered at run time is
    // checked when its state starts it.
    let named = agents
        .into_iter()
        .filter(|(agent, _)| !agent.contains("{{"))
        .map(|(agent, at)| (ManifestKind::Agent, agent, at))
        .chain(
            workflows
                .into_iter()
                .map(|(w, at)| (ManifestKind::Workflow, w, at)),
        );
    for (kind, name, at) in named {
        match registry::get(pool, who.tenant, kind, &name, None).await {
            Ok(_) => {}
            Err(RegistryError::NotFound { .. }) => problems.push(match kind {
                ManifestKind::Agent => format!("{at}: agent `{name}` is not deployed"),
                ManifestKind::Workflow => format!("{at}: workflow `{name}` does not exist"),
            }),
            Err(RegistryError::Db(e)) => return Err(e),
            Err(other) => problems.push(format!("{at}: {other}")),
        }
    }
    Ok(problems)
}

fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// What a ContainerRun step asks for that this node refuses (`at` ends with `.` or is empty).
fn container_problems(step: &Value, at: &str, allowed_networks: &[String]) -> Vec<String> {
    let field = |f: &str| field_at(at, f);
    let mut problems = Vec::new();
    if let Some(mode) = step.get("network_mode").and_then(Value::as_str) {
        if mode != "none" && !allowed_networks.iter().any(|m| m == mode) {
            problems.push(format!(
                "{}: network_mode `{mode}` is not allowed on this node (workflows.allow_network_modes)",
                field("network_mode")
            ));
        }
    }
    let networked = step
        .get("network_mode")
        .and_then(Value::as_str)
        .is_some_and(|m| m != "none");
    if let Some(list) = step.get("network_allowlist") {
        if !networked {
            problems.push(format!(
                "{}: a network allowlist needs `network_mode: bridge` (this step has no network)",
                field("network_allowlist")
            ));
        }
        problems.extend(allowlist_problems(list, &field("network_allowlist")));
    }
    problems.extend(command_problems(step, at));
    if step.get("image_pull_policy").and_then(Value::as_str) == Some("Always") {
        problems.push(format!(
            "{}: `Always` is not supported: this node never pulls images (use IfNotPresent or Never with a local image)",
            field("image_pull_policy")
        ));
    }
    if let Some(user) = step.get("run_as_user").and_then(Value::as_str) {
        if user != "65534" && user != "65534:65534" {
            problems.push(format!(
                "{}: commands always run as 65534:65534 in sandboxes; `{user}` cannot be honoured",
                field("run_as_user")
            ));
        }
    }
    problems
}

/// The path of field `f` of the step at `at` (which ends with `.` or is empty), as problems
/// name it (`f` alone when `at` is empty); both checks of a step name fields this way.
fn field_at(at: &str, f: &str) -> String {
    let at = at.trim_end_matches('.');
    if at.is_empty() {
        f.to_owned()
    } else {
        format!("{at}.{f}")
    }
}

/// What keeps a network allowlist (`at` names it) from being a proxy's rule.
fn allowlist_problems(list: &Value, at: &str) -> Vec<String> {
    let Some(entries) = list.as_array() else {
        return vec![format!(
            "{at}: a list of hosts, `*.domain`s, `host:port`s or CIDRs"
        )];
    };
    entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            DomainEntry::parse(e.as_str().unwrap_or_default())
                .err()
                .map(|m| format!("{at}[{i}]: {m}"))
        })
        .collect()
}

/// What in a System state's or a ContainerRun step's command and env could let a rendered value
/// become code, or collide with the variables that carry a shell's values (`at` ends with `.`
/// or is empty). A ContainerRun argv without `shell` renders each element into itself only, so
/// it is checked only when a shell reads it.
fn command_problems(step: &Value, at: &str) -> Vec<String> {
    let field = |f: &str| field_at(at, f);
    let mut problems = Vec::new();
    let shell = step.get("shell").and_then(Value::as_bool).unwrap_or(false);
    let templates: Vec<&str> = match &step["command"] {
        Value::String(line) if line.trim() != aegis_manifest::UPDATE_BLACKBOARD_COMMAND => {
            vec![line.as_str()]
        }
        Value::Array(parts) if shell => parts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    for template in &templates {
        if let Err(e) = render::check_command_template(template) {
            problems.push(format!("{}: {e}", field("command")));
        }
    }
    // A System command line without `shell`: its own text must read the same without a shell
    // (values are left out here: they are data wherever they are written).
    if let (Value::String(line), false, [_]) = (&step["command"], shell, templates.as_slice()) {
        // A template that needs the run's values to render is checked when it runs.
        if let Ok(r) = render::render_command(&[line], &Value::Null) {
            if let Some(syntax) = r.shell_syntax() {
                problems.push(format!(
                    "{}: {syntax} is shell syntax, but this command runs without a shell: add `shell: true`",
                    field("command")
                ));
            } else if let Err(e) = r.argv() {
                problems.push(format!("{}: {e}", field("command")));
            }
        }
    }
    if let Some(env) = step.get("env").and_then(Value::as_object) {
        for name in env
            .keys()
            .filter(|k| k.starts_with(render::VALUE_ENV_PREFIX))
        {
            problems.push(format!(
                "{}: names starting with {} are reserved (they carry a shell command's values)",
                field(&format!("env.{name}")),
                render::VALUE_ENV_PREFIX
            ));
        }
    }
    problems
}
