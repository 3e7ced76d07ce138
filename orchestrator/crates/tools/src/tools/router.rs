//! The one path every tool call takes: look up, validate, decide, run, audit, answer.
//!
//! REST `POST /v1/tools/call`, the REST deploy routes, SEAL envelopes and agent executions all end
//! here, so they share one catalog, one policy and one audit trail. Refusals before the handler
//! (unknown tool, invalid arguments, policy) are `CallError`s; failures inside a tool that ran are
//! `isError` results. Both are audited.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use super::{catalog, ToolContext};
use crate::state::AppState;
pub use aegis_core::arguments::serialized_len;
use aegis_core::caller::Caller;
pub use aegis_engines::call::{
    ArgViolation, CallError, CallGate, OutputChunk, OutputSink, ToolError, ToolOutcome,
    TEXT_COPY_MAX_BYTES,
};
use aegis_metrics::{self as metrics, Decision};
use aegis_policy as policy;
use aegis_store::audit::{self, Entry, EntryKind};
use dispatcher::SandboxId;

/// The audit reason code of a denial: the SEAL code for SEAL sessions, else the policy code.
fn reason_code(caller: &Caller, denial: &policy::Denial) -> String {
    match (&caller.seal, denial.seal_code) {
        (Some(_), Some(code)) => code.to_string(),
        _ => denial.code.to_owned(),
    }
}

/// Runs one tool call for `caller` (no sandbox: sandbox tools are refused).
pub async fn invoke(
    state: &AppState,
    caller: &Caller,
    name: &str,
    arguments: Value,
) -> Result<ToolOutcome, CallError> {
    invoke_in(state, caller, name, arguments, None).await
}

/// Runs one tool call for `caller`, in `sandbox` for `cmd.run` and `fs.*`. Every call is
/// counted here (tool, door, decision, latency), the one place all doors meet.
pub async fn invoke_in(
    state: &AppState,
    caller: &Caller,
    name: &str,
    arguments: Value,
    sandbox: Option<SandboxId>,
) -> Result<ToolOutcome, CallError> {
    invoke_gated(state, caller, name, arguments, sandbox, None).await
}

/// [`invoke_in`] with a gate that may still refuse the call after policy allowed it.
pub async fn invoke_gated(
    state: &AppState,
    caller: &Caller,
    name: &str,
    arguments: Value,
    sandbox: Option<SandboxId>,
    gate: Option<&dyn CallGate>,
) -> Result<ToolOutcome, CallError> {
    let call = Request {
        gate,
        ..Request::new(name, arguments, sandbox)
    };
    counted(state, caller, call).await
}

/// The process a background `cmd.run` started, handed back by [`invoke_started`]: its pid and
/// the node's kept reader of its output (which holds the output since the start), so a door
/// follows it without looking it up again.
pub struct Started {
    /// The process's pid in its sandbox.
    pub pid: u32,
    /// The reader `proc.output` also reads from (one reader per process, never split).
    pub reader: aegis_sandboxes::live::Reader,
}

/// Where a background `cmd.run`'s handler leaves its [`Started`] for [`invoke_started`].
pub(crate) type StartedSlot = std::sync::Mutex<Option<Started>>;

/// [`invoke_in`] for a background `cmd.run` (`background: true`): the same steps and rows, and
/// the process it started comes back beside the outcome (`None` when the call was not a
/// background `cmd.run` or started nothing).
pub async fn invoke_started(
    state: &AppState,
    caller: &Caller,
    arguments: Value,
    sandbox: Option<SandboxId>,
) -> Result<(ToolOutcome, Option<Started>), CallError> {
    let slot = StartedSlot::default();
    let call = Request {
        started: Some(&slot),
        ..Request::new("cmd.run", arguments, sandbox)
    };
    let outcome = counted(state, caller, call).await?;
    let started = slot
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok((outcome, started))
}

/// [`invoke_in`] in its streaming form: the same steps, rows and result, and a foreground
/// `cmd.run` sends its output to `output` as it comes (`tools/stream.rs`). A refusal comes back
/// before anything is sent, so a door can answer it as the call that does not stream would.
pub async fn invoke_streaming(
    state: &AppState,
    caller: &Caller,
    name: &str,
    arguments: Value,
    sandbox: Option<SandboxId>,
    output: OutputSink,
) -> Result<ToolOutcome, CallError> {
    let call = Request {
        output: Some(output),
        ..Request::new(name, arguments, sandbox)
    };
    counted(state, caller, call).await
}

/// The bytes of a whole file moved by one `fs.write` or `fs.read` call ([`invoke_transfer`]).
#[derive(Debug)]
pub enum Transfer {
    /// An upload: the file's bytes, then [`dispatcher::UploadPiece::End`]; a source that
    /// closes without it abandons the write (nothing is written).
    Upload(tokio::sync::mpsc::Receiver<dispatcher::UploadPiece>),
    /// A download: the file's bytes are sent here as they are read.
    Download(tokio::sync::mpsc::Sender<bytes::Bytes>),
}

/// [`invoke_in`] for a whole file whose bytes travel beside the call: one `fs.write` (an
/// [`Transfer::Upload`]) or one `fs.read` (a [`Transfer::Download`]), looked up, validated,
/// decided and audited once like any call, however many blocks the file takes. The arguments
/// name the file (`path`; an upload's `content` is empty, its `metadata` as `fs.write`'s).
pub async fn invoke_transfer(
    state: &AppState,
    caller: &Caller,
    name: &str,
    arguments: Value,
    sandbox: Option<SandboxId>,
    transfer: Transfer,
) -> Result<ToolOutcome, CallError> {
    let fits = matches!(
        (name, &transfer),
        ("fs.write", Transfer::Upload(_)) | ("fs.read", Transfer::Download(_))
    );
    if !fits {
        return Err(CallError::Catalog(super::CatalogError(format!(
            "{name} moves no file as a transfer of this direction"
        ))));
    }
    let call = Request {
        transfer: Some(transfer),
        ..Request::new(name, arguments, sandbox)
    };
    counted(state, caller, call).await
}

/// Every call, counted (tool, door, decision, latency).
async fn counted(
    state: &AppState,
    caller: &Caller,
    call: Request<'_>,
) -> Result<ToolOutcome, CallError> {
    let started = Instant::now();
    let name = call.name;
    let result = route(state, caller, call, started).await;
    let decision = match &result {
        Ok(ToolOutcome { result: Ok(_), .. }) => Decision::Allowed,
        Ok(_)
        | Err(CallError::Audit(_) | CallError::Catalog(_) | CallError::Unavailable { .. }) => {
            Decision::Error
        }
        Err(_) => Decision::Refused,
    };
    metrics::tool_call(
        name,
        metrics::current_door(caller),
        decision,
        started.elapsed(),
    );
    result
}

/// The steps of a call, in order: [`lookup`], [`validated`], the one policy decision
/// (`policy::check_tool`), an operator's approval when a capability asks for one, the call's
/// sandbox and its allowlists ([`sandbox_for`]), the caller's memory for the memory tools
/// ([`memory_for`]), the agent's `tool_validation` gate; then the
/// handler runs between its intent and completion rows ([`run_audited`]). A refusal at any step
/// is audited here, once ([`refusal_entry`]), and returned.
async fn route(
    state: &AppState,
    caller: &Caller,
    request: Request<'_>,
    started: Instant,
) -> Result<ToolOutcome, CallError> {
    let Request {
        name,
        arguments,
        sandbox,
        gate,
        output,
        transfer,
        started: started_slot,
    } = request;
    let args_digest = audit::digest(&arguments);
    // Audit reasons never carry argument values (the caller still gets the full message).
    let raw_arguments = arguments.clone();
    let catalog = catalog()?;
    // A name the build does not have may be a tool of an external MCP server: an entry made
    // from its server's listing, for this call.
    let (external, unavailable) = if catalog.contains(name) {
        (None, None)
    } else {
        match super::external::lookup(state, name).await {
            Ok(found) => (found, None),
            Err(super::external::Unavailable(reason)) => (
                None,
                Some(CallError::Unavailable {
                    tool: name.to_owned(),
                    reason,
                }),
            ),
        }
    };
    let admitted = match unavailable {
        Some(refused) => Err(refused),
        None => {
            let found = Found {
                catalog: &catalog,
                external: external.as_ref(),
            };
            admit(found, state, caller, name, arguments, sandbox, gate).await
        }
    };
    let admitted = match admitted {
        Ok(admitted) => admitted,
        Err(refused) => {
            if let Some(entry) = refusal_entry(
                caller,
                name,
                &refused,
                &raw_arguments,
                &args_digest,
                sandbox.filter(|_| policy::needs_sandbox(name)),
                started,
            ) {
                audit::record(&state.pool, caller, entry)
                    .await
                    .map_err(CallError::Audit)?;
            }
            return Err(refused);
        }
    };
    let call = AuditedCall {
        name,
        args_digest: &args_digest,
        raw_arguments: &raw_arguments,
        started,
    };
    let ctx = ToolContext {
        state,
        caller,
        name,
        sandbox: admitted.sandbox,
        memory: admitted.memory,
        output,
        transfer: std::sync::Mutex::new(transfer),
        started: started_slot,
    };
    run_audited(&ctx, admitted.handler, admitted.arguments, call).await
}

/// One call as a door or service asks for it.
struct Request<'a> {
    name: &'a str,
    arguments: Value,
    sandbox: Option<SandboxId>,
    gate: Option<&'a dyn CallGate>,
    /// Where a streaming call's output goes.
    output: Option<OutputSink>,
    /// The bytes of a file transfer.
    transfer: Option<Transfer>,
    /// Where a background `cmd.run` leaves the process it started ([`invoke_started`]).
    started: Option<&'a StartedSlot>,
}

impl<'a> Request<'a> {
    /// A call with nothing beside it (no gate, output sink, transfer or started slot).
    fn new(name: &'a str, arguments: Value, sandbox: Option<SandboxId>) -> Self {
        Self {
            name,
            arguments,
            sandbox,
            gate: None,
            output: None,
            transfer: None,
            started: None,
        }
    }
}

/// A call every step allowed.
struct Admitted {
    /// Its tool's handler.
    handler: super::Handler,
    /// Its validated arguments.
    arguments: Value,
    /// Its sandbox and the policy it runs under (`cmd.run`, `fs.*`).
    sandbox: Option<(SandboxId, Arc<aegis_policy::SandboxPolicy>)>,
    /// The calling execution's memory (`aegis.memory.write|recall`).
    memory: Option<aegis_store::memory::Scope>,
}

/// Where step 1 looks: the built-in catalog, then the external tool found for this call.
#[derive(Clone, Copy)]
struct Found<'c> {
    catalog: &'c super::Catalog,
    external: Option<&'c super::ToolSpec>,
}

/// Steps 1 to 6 of [`route`]; the first refusal ends them.
async fn admit<'c>(
    found: Found<'c>,
    state: &AppState,
    caller: &Caller,
    name: &str,
    arguments: Value,
    sandbox: Option<SandboxId>,
    gate: Option<&dyn CallGate>,
) -> Result<Admitted, CallError> {
    let (tool, handler) = lookup(found, name)?;
    let arguments = validated(tool, name, arguments)?;
    let denied = |denial| CallError::Denied {
        tool: name.to_owned(),
        denial,
    };
    policy::check_tool(caller, tool, &arguments).map_err(denied)?;
    // Privileged calls (a capability with `require_approval`) wait here for an operator.
    let approval_timeout = state.config.seal.approval_timeout_secs;
    aegis_store::approvals::await_approval(&state.pool, approval_timeout, caller, name, &arguments)
        .await
        .map_err(denied)?;
    let in_sandbox = sandbox_for(state, caller, name, &arguments, sandbox)
        .await
        .map_err(denied)?;
    let memory = memory_for(state, caller, name).await.map_err(denied)?;
    // The agent's tool_validation judges, after every rule allowed the call and before it runs.
    if let Some(gate) = gate {
        gate.admit(name, &arguments).await.map_err(denied)?;
    }
    Ok(Admitted {
        handler,
        arguments,
        sandbox: in_sandbox,
        memory,
    })
}

/// Step 1: the tool, from the catalog of what this node implements (built in, or listed by
/// one of its external MCP servers), and its handler (start-up checked that every catalog tool
/// has one, `check_handlers`; every external tool has the one of `tools::external`).
fn lookup<'c>(
    found: Found<'c>,
    name: &str,
) -> Result<(&'c super::ToolSpec, super::Handler), CallError> {
    if let Some(spec) = found.catalog.get(name) {
        let handler = super::handler(name).ok_or_else(|| {
            CallError::Catalog(super::CatalogError(format!("{name} has no handler")))
        })?;
        return Ok((spec, handler));
    }
    let spec = found.external.ok_or_else(|| CallError::UnknownTool {
        name: name.to_owned(),
    })?;
    Ok((spec, super::external::HANDLER))
}

/// Step 2: the arguments against the tool's schema (integers written as floats normalised
/// first), every violation with its pointer.
fn validated(tool: &super::ToolSpec, name: &str, arguments: Value) -> Result<Value, CallError> {
    let arguments = aegis_core::arguments::normalise_integers(&tool.input_schema, arguments);
    let violations: Vec<ArgViolation> = tool
        .validator
        .iter_errors(&arguments)
        .map(|e| ArgViolation {
            path: e.instance_path().to_string(),
            message: aegis_core::arguments::describe_violation(&e),
        })
        .collect();
    if violations.is_empty() {
        Ok(arguments)
    } else {
        Err(CallError::InvalidArguments {
            tool: name.to_owned(),
            violations,
        })
    }
}

/// Step 5: for `cmd.run` and `fs.*`, the sandbox named by the call, which must be the caller's
/// own (`policy::sandboxes`, on the owner the dispatcher recorded: another principal's sandbox
/// is "not found", like one that does not exist), and its allowlists (programs, paths) checked
/// against the arguments; other tools run without one.
async fn sandbox_for(
    state: &AppState,
    caller: &Caller,
    name: &str,
    arguments: &Value,
    sandbox: Option<SandboxId>,
) -> Result<Option<(SandboxId, Arc<aegis_policy::SandboxPolicy>)>, policy::Denial> {
    if !policy::needs_sandbox(name) {
        return Ok(None);
    }
    let refused = |code, message| policy::Denial {
        code,
        message,
        seal_code: None,
        retry_after_secs: None,
    };
    let Some(id) = sandbox else {
        return Err(refused(
            "sandbox_required",
            format!("`{name}` runs inside a sandbox: give sandbox_id"),
        ));
    };
    let owner = state.sandboxes.owner(id).await;
    let owner = owner.map_err(|e| refused("sandbox_unavailable", e.to_string()))?;
    policy::sandboxes::check_sandbox_access(
        caller,
        &owner,
        policy::sandboxes::SandboxAccess::Act,
        &id.to_string(),
    )?;
    let found = state.sandboxes.policy(&state.pool, id).await;
    let sandbox_policy = found.map_err(|e| refused("sandbox_unavailable", e.to_string()))?;
    policy::check_sandbox_call(name, arguments, &sandbox_policy)?;
    Ok(Some((id, sandbox_policy)))
}

/// Step 5b: for `aegis.memory.write|recall`, the calling execution's own memory
/// (`memory::Scope::of_caller`), which the policy requires (`policy::check_memory_call`); the
/// handler gets it, so no argument ever names a memory. Other tools have none.
async fn memory_for(
    state: &AppState,
    caller: &Caller,
    name: &str,
) -> Result<Option<aegis_store::memory::Scope>, policy::Denial> {
    if !aegis_store::memory::is_agent_tool(name) {
        return Ok(None);
    }
    let found = aegis_store::memory::Scope::of_caller(&state.pool, caller)
        .await
        .map_err(|e| policy::Denial {
            code: "memory_unavailable",
            message: format!("the caller's memory cannot be read: {e}"),
            seal_code: None,
            retry_after_secs: None,
        })?;
    policy::check_memory_call(name, caller, found.is_some())?;
    Ok(found)
}

/// The audit row of a refusal before the handler ran (none for the node's own failures: the
/// audit log or the catalog unavailable).
fn refusal_entry(
    caller: &Caller,
    name: &str,
    refused: &CallError,
    raw_arguments: &Value,
    args_digest: &str,
    sandbox: Option<SandboxId>,
    started: Instant,
) -> Option<Entry> {
    let (code, reason) = match refused {
        CallError::UnknownTool { .. } => ("unknown_tool".to_owned(), refused.to_string()),
        CallError::InvalidArguments { .. } => ("invalid_arguments".to_owned(), refused.to_string()),
        CallError::Denied { denial, .. } => (reason_code(caller, denial), denial.message.clone()),
        CallError::Unavailable { .. } => ("tool_unavailable".to_owned(), refused.to_string()),
        CallError::Audit(_) | CallError::Catalog(_) => return None,
    };
    Some(Entry {
        sandbox_id: sandbox.map(|s| s.0),
        ..Entry::denied(
            EntryKind::Tool,
            name,
            code,
            aegis_core::arguments::scrub(&reason, raw_arguments),
            args_digest.to_owned(),
            started.elapsed(),
        )
    })
}

/// What the audit rows of an admitted call need to know of it.
struct AuditedCall<'a> {
    name: &'a str,
    args_digest: &'a str,
    /// The arguments as received, to scrub their values out of error reasons.
    raw_arguments: &'a Value,
    started: Instant,
}

/// Step 7: the intent row exists before the tool runs; if this future is dropped (client gone,
/// execution cancelled), the audit task completes it as `cancelled`. The completion row records
/// the outcome; the result is withheld when it cannot be written.
async fn run_audited(
    ctx: &ToolContext<'_>,
    handler: super::Handler,
    arguments: Value,
    call: AuditedCall<'_>,
) -> Result<ToolOutcome, CallError> {
    let call_audit = audit::begin_call(
        &ctx.state.pool,
        ctx.caller,
        ctx.state.instance_id,
        call.name,
        call.args_digest,
        ctx.sandbox.as_ref().map(|(id, _)| id.0),
        call.started,
    )
    .await
    .map_err(CallError::Audit)?;
    let ran = Instant::now();
    let result = handler(ctx, arguments).await;
    let duration_ms = ran.elapsed().as_millis() as u64;
    // The result is serialised once: its digest is taken over this text, and the doors send it.
    let canonical = result.as_ref().ok().map(|v| Arc::new(audit::canonical(v)));
    let completion = match &result {
        Ok(_) => audit::Completion {
            outcome: "ok",
            reason_code: None,
            reason: None,
            result_digest: canonical
                .as_deref()
                .map(|text| audit::digest_of_canonical(text)),
        },
        Err(e) => audit::Completion {
            outcome: "error",
            reason_code: Some(e.code.to_owned()),
            reason: Some(aegis_core::arguments::scrub(&e.message, call.raw_arguments)),
            result_digest: None,
        },
    };
    call_audit
        .complete(completion)
        .await
        .map_err(CallError::Audit)?;
    Ok(ToolOutcome {
        result,
        duration_ms,
        canonical,
    })
}

/// The services below the router (the agent loop, the SEAL gateway) reach it through this.
impl aegis_engines::call::ToolInvoker for AppState {
    fn invoke<'a>(
        &'a self,
        caller: &'a aegis_core::caller::Caller,
        tool: &'a str,
        arguments: serde_json::Value,
        sandbox: Option<dispatcher::SandboxId>,
        gate: Option<&'a dyn aegis_engines::call::CallGate>,
    ) -> futures_util::future::BoxFuture<
        'a,
        Result<aegis_engines::call::ToolOutcome, aegis_engines::call::CallError>,
    > {
        Box::pin(invoke_gated(self, caller, tool, arguments, sandbox, gate))
    }

    fn invoke_streaming<'a>(
        &'a self,
        caller: &'a aegis_core::caller::Caller,
        tool: &'a str,
        arguments: serde_json::Value,
        sandbox: Option<dispatcher::SandboxId>,
        output: OutputSink,
    ) -> futures_util::future::BoxFuture<
        'a,
        Result<aegis_engines::call::ToolOutcome, aegis_engines::call::CallError>,
    > {
        Box::pin(invoke_streaming(
            self, caller, tool, arguments, sandbox, output,
        ))
    }

    fn offered<'a>(
        &'a self,
        entry: &'a str,
    ) -> futures_util::future::BoxFuture<'a, Result<Vec<aegis_core::catalog::ToolSpec>, String>>
    {
        Box::pin(super::external::offered(self, entry))
    }
}
