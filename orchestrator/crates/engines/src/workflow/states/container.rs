//! `ContainerRun`, `ParallelContainerRun` and `System`: commands in hardened sandboxes, never on
//! the host.
//!
//! Each ContainerRun step gets a sandbox of its own from the dispatcher (the same hardening as
//! every agent sandbox: no privileges, no host paths, read-only root, limits clamped to the
//! node's ceilings), owned by (execution, state, visit). The argv runs through the sandbox's
//! executor with output capped like `cmd.run`; a failed attempt is retried after a doubling
//! backoff. System states run in one sandbox per execution from the node's System image, kept
//! across System states and destroyed when the execution ends or waits; a System state that
//! mounts volumes runs like a ContainerRun step instead, in a sandbox of its own.
//!
//! Volumes of the run (`workspaces`) are copied into a step's sandbox before its command and,
//! for read-write mounts, out of it after (whatever the exit code); a volume that cannot be
//! saved (over its size limit, replaced by a link) fails the step, naming it. A read-only
//! volume at `/workspace` leaves the command no write root there.
//!
//! Templates never become code (issue 20): a ContainerRun argv element is rendered into exactly
//! that element; a System `command` is read as POSIX words with every rendered value kept inside
//! the word it was written in ([`render::CommandText::argv`]); with `shell: true` (either kind)
//! the script `sh -c` runs is the template's own text and each value reaches it as an
//! environment variable it references ([`render::CommandText::shell`]). A template is rendered
//! once, so a value that looks like a template stays text.
//!
//! A step with `network_mode: bridge` never sees Docker's default bridge: it gets what an agent
//! sandbox with network gets ([`NetworkMode::Egress`]: an internal network of its own, its own
//! egress proxy, the host firewall), and the proxy admits the hosts of the step's
//! `network_allowlist` intersected with the workflow's `spec.network_allowlist`; with neither,
//! no host at all. The rules travel in the sandbox's labels ([`WORKFLOW_NETWORK_LABEL`]), which
//! only this module writes, so a restarted instance adopting the sandbox rebuilds the same
//! proxy.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dispatcher::protocol::{ExecGrant, Op, RunParams};
use dispatcher::{DispatchError, Limits, NetworkMode, Owner, OwnerKind, SandboxId, SandboxSpec};
use serde_json::{json, Value};
use uuid::Uuid;

use super::{StateCtx, Step};
use crate::workflow::runtime::Runtime;
use aegis_core::render::{self, VALUE_ENV_PREFIX};
use aegis_egress::DomainEntry;
use aegis_manifest::{parse_duration, parse_quantity};
use aegis_sandboxes::egress::WORKFLOW_NETWORK_LABEL;
use aegis_sandboxes::workspaces::{self, Workspace};

/// Grace between SIGTERM and SIGKILL when a step's command times out.
const KILL_GRACE_MS: u64 = 1000;

/// One container step, rendered and checked.
struct Container {
    name: String,
    image: String,
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    workdir: Option<String>,
    limits: Limits,
    network: NetworkMode,
    /// The proxy's domain rules ([`WORKFLOW_NETWORK_LABEL`]), when the step has network.
    domains: Option<String>,
    timeout: Duration,
    attempts: u32,
    backoff: Duration,
    /// The run's volumes this step mounts (`workspaces`).
    workspace: Option<Workspace>,
}

/// The argv of a step and the environment variables that carry its values into a shell.
///
/// `command` is an array for ContainerRun steps (one template per argv element) and a string for
/// System states (one template read as POSIX words). With `shell: true` the whole command is one
/// script for `sh -c` whose values are referenced as `$AEGIS_VALUE_<n>`, never pasted in.
fn command(
    ctx: &StateCtx<'_>,
    step: &Value,
    field: &str,
) -> Result<(Vec<String>, BTreeMap<String, String>), String> {
    let at = |e: render::RenderError| format!("spec.states.{}.{field}command: {e}", ctx.name);
    let shell = step.get("shell").and_then(Value::as_bool).unwrap_or(false);
    let (argv, env) = match &step["command"] {
        Value::String(line) if shell => {
            let (script, env) = render::render_command(&[line], ctx.context)
                .map_err(at)?
                .shell();
            (vec!["sh".into(), "-c".into(), script], env)
        }
        Value::String(line) => {
            let rendered = render::render_command(&[line], ctx.context).map_err(at)?;
            if let Some(syntax) = rendered.shell_syntax() {
                return Err(format!(
                    "spec.states.{}.{field}command: {syntax} is shell syntax, but this command runs without a shell: add `shell: true`",
                    ctx.name
                ));
            }
            (rendered.argv().map_err(at)?, BTreeMap::new())
        }
        Value::Array(parts) => {
            let parts: Vec<&str> = parts
                .iter()
                .map(|p| p.as_str().unwrap_or_default())
                .collect();
            if shell {
                let (script, env) = render::render_command(&parts, ctx.context)
                    .map_err(at)?
                    .shell();
                (vec!["sh".into(), "-c".into(), script], env)
            } else {
                let mut argv = Vec::with_capacity(parts.len());
                for (i, part) in parts.iter().enumerate() {
                    argv.push(ctx.render(&format!("{field}command[{i}]"), part)?);
                }
                (argv, BTreeMap::new())
            }
        }
        _ => (Vec::new(), BTreeMap::new()),
    };
    if argv.first().is_none_or(|p| p.is_empty()) {
        return Err(format!(
            "spec.states.{}.{field}command: the command is empty",
            ctx.name
        ));
    }
    Ok((argv, env))
}

/// The domain rules of a networked step, as the label [`WORKFLOW_NETWORK_LABEL`] carries them:
/// a JSON array of `{source, allow}`, one per allowlist that applies (the workflow's
/// `spec.network_allowlist`, the step's `network_allowlist`); a host must pass every one. With
/// neither, one rule that admits nothing: a step asks for hosts by name, never by default.
async fn network_rules(ctx: &StateCtx<'_>, step: &Value, field: &str) -> Result<String, String> {
    let workflow = ctx.exec.workflow_name.as_str();
    let manifest = crate::workflow::store::manifest(&ctx.rt.pool, ctx.exec.workflow_version_id)
        .await
        .map_err(|e| format!("reading the manifest of workflow `{workflow}`: {e}"))?
        .unwrap_or(Value::Null);
    let mut rules = Vec::new();
    let lists = [
        (
            manifest.pointer("/spec/network_allowlist"),
            format!("network allowlist of workflow `{workflow}` (spec.network_allowlist)"),
        ),
        (
            step.get("network_allowlist"),
            format!(
                "network allowlist of workflow `{workflow}` (spec.states.{}.{field}network_allowlist)",
                ctx.name
            ),
        ),
    ];
    for (list, source) in lists {
        let Some(list) = list else { continue };
        let entries: Vec<String> = list
            .as_array()
            .ok_or_else(|| format!("{source}: not a list"))?
            .iter()
            .map(|e| e.as_str().unwrap_or_default().to_owned())
            .collect();
        for entry in &entries {
            DomainEntry::parse(entry).map_err(|e| format!("{source}: {e}"))?;
        }
        rules.push(json!({"source": source, "allow": entries}));
    }
    if rules.is_empty() {
        rules.push(json!({
            "source": format!(
                "ContainerRun network of workflow `{workflow}` (no network_allowlist in the step or the workflow admits no host)"
            ),
            "allow": [],
        }));
    }
    Ok(Value::Array(rules).to_string())
}

async fn container(ctx: &StateCtx<'_>, step: &Value, field: &str) -> Result<Container, String> {
    let f = |k: &str| format!("{field}{k}");
    let name = step
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or(ctx.name)
        .to_owned();
    let image = ctx.render(&f("image"), step["image"].as_str().unwrap_or_default())?;
    if image.trim().is_empty() {
        return Err(format!(
            "spec.states.{}.{}: the image is empty",
            ctx.name,
            f("image")
        ));
    }
    let (argv, values) = command(ctx, step, field)?;
    let mut env = BTreeMap::new();
    if let Some(map) = step.get("env").and_then(Value::as_object) {
        for (k, v) in map {
            if k.starts_with(VALUE_ENV_PREFIX) {
                return Err(format!(
                    "spec.states.{}.{}: names starting with {VALUE_ENV_PREFIX} are reserved (they carry a shell command's values)",
                    ctx.name,
                    f(&format!("env.{k}"))
                ));
            }
            env.insert(
                k.clone(),
                ctx.render(&f(&format!("env.{k}")), v.as_str().unwrap_or_default())?,
            );
        }
    }
    env.extend(values);
    let workdir = match step.get("workdir").and_then(Value::as_str) {
        Some(w) => Some(ctx.render(&f("workdir"), w)?),
        None => None,
    };
    let defaults = Limits::default();
    let resources = step.get("resources").cloned().unwrap_or(Value::Null);
    let limits = Limits {
        memory_bytes: resources
            .get("memory")
            .and_then(parse_quantity)
            .unwrap_or(defaults.memory_bytes),
        nano_cpus: resources
            .get("cpu")
            .and_then(Value::as_u64)
            .map(|m| m.saturating_mul(1_000_000))
            .filter(|n| *n > 0)
            .unwrap_or(defaults.nano_cpus),
        ..defaults
    };
    let ceiling = Duration::from_secs(ctx.rt.cmd_timeout_secs);
    let timeout = resources
        .get("timeout")
        .and_then(parse_duration)
        .or(ctx.timeout)
        .unwrap_or(ceiling)
        .min(ceiling);
    // `bridge` is the manifest's word for "has network"; what it gets is the egress network of
    // an agent sandbox, never Docker's default bridge.
    let (network, domains) = match step.get("network_mode").and_then(Value::as_str) {
        None | Some("none") => (NetworkMode::None, None),
        Some(mode @ "bridge") if ctx.rt.allow_network_modes.iter().any(|m| m == mode) => (
            NetworkMode::Egress,
            Some(network_rules(ctx, step, field).await?),
        ),
        Some(mode) => {
            return Err(format!(
                "spec.states.{}.{}: network_mode `{mode}` is not allowed on this node (workflows.allow_network_modes)",
                ctx.name,
                f("network_mode")
            ))
        }
    };
    let retry = step.get("retry").cloned().unwrap_or(Value::Null);
    let workspace = ctx.workspace(step, field)?;
    Ok(Container {
        name,
        image,
        argv,
        env,
        workdir,
        limits,
        network,
        domains,
        timeout,
        attempts: 1 + retry
            .get("max_attempts")
            .and_then(Value::as_u64)
            .unwrap_or(0) as u32,
        backoff: retry
            .get("backoff")
            .and_then(parse_duration)
            .unwrap_or(Duration::from_secs(1)),
        workspace,
    })
}

/// The command's result as the state output reports it.
struct Ran {
    exit_code: i64,
    stdout: Value,
    stderr: Value,
    truncated: bool,
    timed_out: bool,
    duration_ms: u64,
    /// Why the step's volumes could not be saved after the command ran: the step failed.
    volume_error: Option<String>,
}

/// Runs `argv` in sandbox `id`; `Err` when the call itself failed (sandbox gone, refused).
async fn exec(rt: &Runtime, id: SandboxId, c: &Container) -> Result<Ran, (bool, String)> {
    let d = rt
        .sandboxes
        .dispatcher()
        .map_err(|e| (false, e.to_string()))?;
    let cap = rt.max_output_bytes;
    let mut env = c.env.clone();
    if c.network == NetworkMode::Egress {
        // The sandbox's only way out: its own proxy (set last, so a manifest cannot point
        // clients elsewhere; there is nowhere else to go anyway).
        let proxy = rt.sandboxes.proxy_env(id);
        if proxy.is_empty() {
            return Err((
                false,
                "the step's egress proxy is not running here".to_owned(),
            ));
        }
        env.extend(proxy);
    }
    let started = Instant::now();
    let response = d
        .call(
            id,
            Op::CmdRun(RunParams {
                argv: c.argv.clone(),
                cwd: c.workdir.clone(),
                env,
                timeout_ms: c.timeout.as_millis() as u64,
                grace_ms: Some(KILL_GRACE_MS),
                max_stdout_bytes: cap,
                max_stderr_bytes: cap,
                // The workflow's author (an operator who deployed it) chose this command; the
                // kernel still confines its writes, connections and signals.
                exec: ExecGrant::Any,
                user: Default::default(),
            }),
        )
        .await
        .map_err(|e| {
            let gone = matches!(
                e,
                DispatchError::SandboxGone { .. } | DispatchError::SandboxNotFound { .. }
            );
            (gone, e.to_string())
        })?;
    let out = response.into_result().map_err(|e| {
        (
            false,
            format!("the sandbox refused the command: {}", e.message),
        )
    })?;
    Ok(Ran {
        exit_code: out["exit_code"].as_i64().unwrap_or(-1),
        stdout: out["stdout"].clone(),
        stderr: out["stderr"].clone(),
        truncated: out["truncated"]["stdout"] == true || out["truncated"]["stderr"] == true,
        timed_out: out["timed_out"] == true,
        duration_ms: out["duration_ms"]
            .as_u64()
            .unwrap_or(started.elapsed().as_millis() as u64),
        volume_error: None,
    })
}

/// Runs the step in sandbox `id` between the restore and the save of its volumes: the command
/// finds what the last committed state (or this attempt) left, and what it leaves in read-write
/// mounts is this attempt's draft (`workspaces`). `Err` when the call itself failed.
async fn run_in(ctx: &StateCtx<'_>, id: SandboxId, c: &Container) -> Result<Ran, String> {
    let Some(ws) = &c.workspace else {
        return exec(ctx.rt, id, c).await.map_err(|(_, e)| e);
    };
    let d = ctx.rt.sandboxes.dispatcher().map_err(|e| e.to_string())?;
    let names: Vec<&str> = ws.mounts.iter().map(|m| m.name.as_str()).collect();
    match workspaces::restore(d, &ctx.rt.pool, id, ws).await {
        Ok(restored) => {
            ctx.event(
                "volumes_mounted",
                json!({"step": c.name, "volumes": names, "restored": restored}),
            )
            .await
        }
        Err(e) => {
            let reason = format!("could not mount the step's volumes: {e}");
            ctx.event("volumes_failed", json!({"step": c.name, "reason": reason}))
                .await;
            return Err(reason);
        }
    }
    let mut ran = exec(ctx.rt, id, c).await.map_err(|(_, e)| e)?;
    if ws.mounts.iter().any(|m| !m.read_only) {
        match workspaces::save(d, &ctx.rt.pool, id, ws).await {
            Ok(saved) => {
                let saved: Vec<Value> = saved
                    .iter()
                    .map(|(name, bytes)| json!({"name": name, "bytes": bytes}))
                    .collect();
                ctx.event("volumes_saved", json!({"step": c.name, "volumes": saved}))
                    .await;
            }
            Err(e) => {
                let reason = e.to_string();
                ctx.event("volumes_failed", json!({"step": c.name, "reason": reason}))
                    .await;
                ran.volume_error = Some(reason);
            }
        }
    }
    Ok(ran)
}

fn labels(ctx: &StateCtx<'_>, step: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("workflow_execution".to_owned(), ctx.exec.id.to_string()),
        ("workflow_state".to_owned(), ctx.name.to_owned()),
        ("workflow_visit".to_owned(), ctx.visit.to_string()),
        ("workflow_step".to_owned(), step.to_owned()),
    ])
}

/// Runs one step with its retries; returns the step's output object.
async fn run_step(ctx: &StateCtx<'_>, c: &Container) -> Value {
    let started = Instant::now();
    let mut last = json!({"status": "failed", "error": "not run"});
    for attempt in 1..=c.attempts {
        ctx.event(
            "container_run_started",
            json!({"step": c.name, "image": c.image, "attempt": attempt, "visit": ctx.visit}),
        )
        .await;
        let mut spec = SandboxSpec::new(c.image.clone(), ctx.owner());
        spec.limits = c.limits;
        spec.network = c.network;
        spec.labels = labels(ctx, &c.name);
        if c.workspace
            .as_ref()
            .is_some_and(Workspace::whole_workspace_read_only)
        {
            // A read-only volume at /workspace: commands write only /tmp (the kernel refuses the
            // rest), so nothing the step does there could even look kept.
            spec.write_roots = Vec::new();
        }
        if let Some(domains) = &c.domains {
            spec.labels
                .insert(WORKFLOW_NETWORK_LABEL.to_owned(), domains.clone());
        }
        let dispatcher = match ctx.rt.sandboxes.dispatcher() {
            Ok(d) => d,
            Err(e) => {
                return json!({"status": "failed", "error": e.to_string(), "attempts": attempt})
            }
        };
        let (retryable, result) = match dispatcher.acquire(spec).await {
            Err(DispatchError::ImageMissing { image }) => (
                false,
                Err(format!(
                    "image `{image}` is not present on this node (it is never pulled: build or load it first)"
                )),
            ),
            Err(e) => (true, Err(format!("could not create the container: {e}"))),
            Ok(id) => {
                let ran = run_in(ctx, id, c).await;
                if let Err(e) = dispatcher.destroy(id).await {
                    tracing::warn!(sandbox = %id, error = %e, "could not destroy a ContainerRun sandbox");
                }
                (true, ran)
            }
        };
        match result {
            Ok(ran) => {
                ctx.event(
                    "container_run_finished",
                    json!({"step": c.name, "attempt": attempt, "exit_code": ran.exit_code,
                        "duration_ms": ran.duration_ms, "truncated": ran.truncated, "timed_out": ran.timed_out}),
                )
                .await;
                let ok = ran.exit_code == 0 && ran.volume_error.is_none();
                last = json!({
                    "status": if ok { "success" } else { "failed" },
                    "exit_code": ran.exit_code, "stdout": ran.stdout, "stderr": ran.stderr,
                    "truncated": ran.truncated, "timed_out": ran.timed_out,
                    "duration_ms": started.elapsed().as_millis() as u64, "attempts": attempt,
                    "output": {"exit_code": ran.exit_code, "stdout": ran.stdout, "stderr": ran.stderr,
                               "duration_ms": ran.duration_ms, "attempts": attempt},
                });
                if let Some(error) = ran.volume_error {
                    // The command ran, but what it left could not be kept: no exit code may
                    // read as success (`exit_code_zero`, `on_success`); the code stays visible.
                    last["error"] = json!(error);
                    last["command_exit_code"] = json!(ran.exit_code);
                    last["exit_code"] = Value::Null;
                    last["output"]["exit_code"] = Value::Null;
                }
                if ok {
                    return last;
                }
            }
            Err(error) => {
                ctx.event(
                    "container_run_finished",
                    json!({"step": c.name, "attempt": attempt, "error": error}),
                )
                .await;
                last = json!({"status": "failed", "error": error, "attempts": attempt,
                    "duration_ms": started.elapsed().as_millis() as u64});
                if !retryable {
                    return last;
                }
            }
        }
        if attempt < c.attempts {
            let wait = c.backoff.saturating_mul(1 << (attempt - 1).min(10));
            tokio::select! {
                _ = ctx.token.cancelled() => return last,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
    last
}

/// `ContainerRun`.
pub(super) async fn container_run(ctx: &StateCtx<'_>) -> Step {
    match container(ctx, ctx.body, "").await {
        Ok(c) => Step::Output(run_step(ctx, &c).await, Vec::new()),
        Err(e) => Step::Output(json!({"status": "failed", "error": e}), Vec::new()),
    }
}

/// `ParallelContainerRun`: every step at once; `completion` decides the state's status.
pub(super) async fn parallel(ctx: &StateCtx<'_>) -> Step {
    let steps = ctx.body["steps"].as_array().cloned().unwrap_or_default();
    let completion = ctx.body["completion"].as_str().unwrap_or("all_succeed");
    let mut prepared = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        match container(ctx, step, &format!("steps[{i}].")).await {
            Ok(c) => prepared.push(c),
            Err(e) => return Step::Output(json!({"status": "failed", "error": e}), Vec::new()),
        }
    }
    let results = futures_util::future::join_all(prepared.iter().map(|c| run_step(ctx, c))).await;
    let succeeded: Vec<&str> = prepared
        .iter()
        .zip(&results)
        .filter(|(_, r)| r["exit_code"] == 0)
        .map(|(c, _)| c.name.as_str())
        .collect();
    let failed: Vec<&str> = prepared
        .iter()
        .zip(&results)
        .filter(|(_, r)| r["exit_code"] != 0)
        .map(|(c, _)| c.name.as_str())
        .collect();
    let overall_success = failed.is_empty();
    let success = match completion {
        "any_succeed" => !succeeded.is_empty(),
        "best_effort" => true,
        _ => overall_success,
    };
    let output: serde_json::Map<String, Value> = prepared
        .iter()
        .zip(&results)
        .map(|(c, r)| {
            (
                c.name.clone(),
                json!({"exit_code": r["exit_code"], "stdout": r["stdout"], "stderr": r["stderr"],
                       "duration_ms": r["duration_ms"], "status": r["status"], "error": r["error"]}),
            )
        })
        .collect();
    Step::Output(
        json!({
            "status": if success { "success" } else { "failed" },
            "overall_success": overall_success, "completion": completion,
            "succeeded": succeeded, "failed": failed, "output": output,
            "results": prepared.iter().zip(&results).map(|(c, r)| json!({"name": c.name, "result": r})).collect::<Vec<_>>(),
        }),
        Vec::new(),
    )
}

fn system_owner(execution: Uuid) -> Owner {
    Owner::new(OwnerKind::Workflow, execution.to_string())
}

/// Destroys the execution's System sandbox (if any); returns how many were destroyed.
pub(crate) async fn destroy_system_sandbox(rt: &Runtime, execution: Uuid) -> usize {
    rt.forget_system_sandbox(execution);
    match rt.sandboxes.dispatcher() {
        Ok(d) => d
            .destroy_owned_by(&system_owner(execution))
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(%execution, error = %e, "could not destroy a System sandbox");
                0
            }),
        Err(_) => 0,
    }
}

/// The execution's System sandbox: the one this replica made, else a new one (whatever another
/// replica left is destroyed first: its commands belong to an interrupted attempt).
async fn system_sandbox(ctx: &StateCtx<'_>) -> Result<SandboxId, String> {
    if let Some(id) = ctx.rt.system_sandbox(ctx.exec.id) {
        return Ok(id);
    }
    destroy_system_sandbox(ctx.rt, ctx.exec.id).await;
    let d = ctx.rt.sandboxes.dispatcher().map_err(|e| e.to_string())?;
    let mut spec = SandboxSpec::new(ctx.rt.system_image.clone(), system_owner(ctx.exec.id));
    spec.labels = BTreeMap::from([
        ("workflow_execution".to_owned(), ctx.exec.id.to_string()),
        ("workflow_role".to_owned(), "system".to_owned()),
    ]);
    let id = d.acquire(spec).await.map_err(|e| match e {
        DispatchError::ImageMissing { image } => format!(
            "the System image `{image}` is not present on this node (workflows.system_image)"
        ),
        other => format!("could not create the System sandbox: {other}"),
    })?;
    ctx.rt.remember_system_sandbox(ctx.exec.id, id);
    Ok(id)
}

/// `System`: the command in the execution's System sandbox (`update_blackboard`: nothing). The
/// command line is read as POSIX words with each rendered value inside its word, and run
/// without a shell unless the state says `shell: true` (see [`command`]).
pub(super) async fn system(ctx: &StateCtx<'_>) -> Step {
    // The older AEGIS form of `update_blackboard`: nothing runs, the worker writes the keys.
    if ctx.body["command"].as_str().map(str::trim)
        == Some(aegis_manifest::UPDATE_BLACKBOARD_COMMAND)
    {
        return Step::Output(
            json!({"status": "completed", "exit_code": 0, "stdout": "", "stderr": ""}),
            Vec::new(),
        );
    }
    let mut step = json!({
        "name": ctx.name,
        "image": ctx.rt.system_image,
        "command": ctx.body["command"].as_str().unwrap_or_default(),
    });
    for key in ["env", "workdir", "shell", "volumes"] {
        if let Some(v) = ctx.body.get(key) {
            step[key] = v.clone();
        }
    }
    let c = match container(ctx, &step, "").await {
        Ok(c) => c,
        Err(e) => return Step::Output(json!({"status": "failed", "error": e}), Vec::new()),
    };
    if c.workspace.is_some() {
        // Volumes get a sandbox of this visit's own, so the run's System sandbox never holds
        // a stale copy of them.
        return Step::Output(run_step(ctx, &c).await, Vec::new());
    }
    let mut retried = false;
    loop {
        let id = match system_sandbox(ctx).await {
            Ok(id) => id,
            Err(e) => return Step::Output(json!({"status": "failed", "error": e}), Vec::new()),
        };
        match exec(ctx.rt, id, &c).await {
            Ok(ran) => {
                let ok = ran.exit_code == 0;
                return Step::Output(
                    json!({
                        "status": if ok { "success" } else { "failed" },
                        "exit_code": ran.exit_code, "stdout": ran.stdout, "stderr": ran.stderr,
                        "truncated": ran.truncated, "timed_out": ran.timed_out, "duration_ms": ran.duration_ms,
                        "output": {"exit_code": ran.exit_code, "stdout": ran.stdout, "stderr": ran.stderr,
                                   "duration_ms": ran.duration_ms},
                    }),
                    Vec::new(),
                );
            }
            // A sandbox this replica remembered was destroyed meanwhile: make a new one, once.
            Err((true, _)) if !retried => {
                retried = true;
                ctx.rt.forget_system_sandbox(ctx.exec.id);
            }
            Err((_, e)) => {
                return Step::Output(json!({"status": "failed", "error": e}), Vec::new())
            }
        }
    }
}
