//! Background processes through the router: `cmd.run` with `background: true` starts one
//! ([`start`], called by `cmd.run`'s handler after the same policy checks and with the same
//! environment, grant and output cap), and `proc.output`, `proc.input` and `proc.signal` act
//! on the processes of the caller's own sandbox, found by pid or tag (`proc.input` also
//! resizes a terminal).
//!
//! The start is the `cmd.run` call's own audit row; the end gets one more row (`cmd.run`,
//! reason code `process_ended`) written by a task that follows the process from its start, so
//! every background process leaves a start and an end in the chain, whoever reads its output.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use dispatcher::protocol::{ExecGrant, ProcessEnd, ProcessSignal, PtySize, StartParams};
use dispatcher::{ProcessEvent, ProcessSelector, SandboxId};
use serde::Deserialize;
use serde_json::{json, Value};

use super::dispatch::{dispatcher_of, refused};
use super::{args, Handler, HandlerFuture, ToolContext, ToolError};
use aegis_core::caller::Caller;
use aegis_store::audit::{self, Entry, EntryKind};

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![
        ("proc.output", proc_output),
        ("proc.input", proc_input),
        ("proc.signal", proc_signal),
    ]
}

/// What `cmd.run` with `background: true` asks for besides the command.
pub(super) struct Background {
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub tag: Option<String>,
    pub stdin: bool,
    pub pty: Option<PtySize>,
    pub timeout_secs: Option<u64>,
    pub max_output_bytes: u64,
    pub exec: ExecGrant,
    /// Who it runs as (`root` only where the sandbox allows root).
    pub user: dispatcher::protocol::RunAs,
}

/// Starts a background process in the caller's sandbox, keeps its reader for `proc.output`,
/// and follows it to its end for the end's audit row.
pub(super) async fn start(ctx: &ToolContext<'_>, b: Background) -> Result<Value, ToolError> {
    let sandbox = sandbox_of(ctx)?;
    let dispatcher = dispatcher_of(ctx)?;
    let handle = dispatcher
        .start_process(
            sandbox,
            StartParams {
                argv: b.argv.clone(),
                cwd: b.cwd,
                env: b.env,
                tag: b.tag,
                stdin: b.stdin,
                pty: b.pty,
                timeout_ms: b.timeout_secs.map(|s| s.saturating_mul(1000)),
                grace_ms: None,
                max_output_bytes: Some(b.max_output_bytes),
                exec: b.exec,
                user: b.user,
            },
        )
        .await
        .map_err(refused)?;
    let (pid, tag) = (handle.pid(), handle.tag().map(str::to_owned));
    let landlock = handle.landlock();
    let reader = ctx.state.sandboxes.live().keep(sandbox, handle);
    if let Some(slot) = ctx.started {
        *slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(super::Started { pid, reader });
    }
    // The end's audit row, from a handle of its own that skips the output.
    let follower = dispatcher
        .attach_process(sandbox, ProcessSelector::Pid(pid))
        .await;
    let pool = ctx.state.pool.clone();
    let caller = ctx.caller.clone();
    let sandboxes = ctx.state.sandboxes.clone();
    let program = b.argv.first().cloned().unwrap_or_default();
    let started = Instant::now();
    tokio::spawn(async move {
        let end = match follower {
            Ok(mut handle) => handle.wait_end().await,
            Err(e) => Some(ProcessEnd {
                exit_code: None,
                signal: None,
                stdout_bytes: 0,
                stderr_bytes: 0,
                truncated: Default::default(),
                timed_out: false,
                error: Some(format!("its end could not be followed: {e}")),
            }),
        };
        if let Some(end) = end {
            sandboxes.live().mark_ended(sandbox, pid);
            record_end(
                &pool,
                &caller,
                sandbox,
                pid,
                &program,
                &end,
                started.elapsed(),
            )
            .await;
        }
    });
    Ok(json!({
        "background": true,
        "pid": pid,
        "tag": tag,
        "landlock": landlock,
    }))
}

/// The end row of a background process (the start is its `cmd.run` call's row).
async fn record_end(
    pool: &sqlx::PgPool,
    caller: &Caller,
    sandbox: SandboxId,
    pid: u32,
    program: &str,
    end: &ProcessEnd,
    ran: Duration,
) {
    let how = match (end.exit_code, end.signal, &end.error) {
        (_, _, Some(error)) => format!("its end was not observed: {error}"),
        (Some(code), _, _) => format!("exit code {code}"),
        (None, Some(signal), _) => format!("signal {signal}"),
        (None, None, None) => "no exit status".to_owned(),
    };
    let ok = end.exit_code == Some(0) && end.error.is_none();
    let result = serde_json::to_value(end).unwrap_or(Value::Null);
    let entry = Entry {
        kind: EntryKind::Tool,
        action: "cmd.run".to_owned(),
        allowed: true,
        reason_code: Some("process_ended".to_owned()),
        reason: Some(format!(
            "background process {pid} (`{program}`) in sandbox {} ended: {how}{}; stdout {} bytes, stderr {} bytes{}",
            sandbox.0,
            if end.timed_out { " (timed out)" } else { "" },
            end.stdout_bytes,
            end.stderr_bytes,
            if end.truncated.stdout || end.truncated.stderr {
                ", output capped"
            } else {
                ""
            },
        )),
        args_digest: audit::digest(&json!({"pid": pid, "sandbox": sandbox.0})),
        outcome: if ok { "ok" } else { "error" },
        result_digest: Some(audit::digest(&result)),
        duration_ms: ran.as_millis().min(i64::MAX as u128) as i64,
        sandbox_id: Some(sandbox.0),
    };
    if let Err(e) = audit::record(pool, caller, entry).await {
        tracing::error!(%pid, sandbox = %sandbox.0, error = %e,
            "the end of a background process could not be audited");
    }
}

#[derive(Deserialize)]
struct Target {
    pid: Option<u32>,
    tag: Option<String>,
}

impl Target {
    fn selector(&self) -> Result<ProcessSelector, ToolError> {
        match (self.pid, &self.tag) {
            (Some(pid), None) => Ok(ProcessSelector::Pid(pid)),
            (None, Some(tag)) => Ok(ProcessSelector::Tag(tag.clone())),
            _ => Err(ToolError::new(
                "invalid_arguments",
                "name the process by `pid` or by `tag`, not both",
            )),
        }
    }
}

/// The caller's sandbox, which the tools that run inside one need.
pub(super) fn sandbox_of(ctx: &ToolContext<'_>) -> Result<SandboxId, ToolError> {
    ctx.sandbox
        .as_ref()
        .map(|(id, _)| *id)
        .ok_or_else(|| ToolError::new("sandbox_required", "this tool runs inside a sandbox"))
}

fn proc_output<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            #[serde(flatten)]
            target: Target,
            #[serde(default)]
            wait_ms: u64,
            max_bytes: Option<usize>,
        }
        let a: A = args(a)?;
        let sandbox = sandbox_of(ctx)?;
        let reader = reader_of(ctx, sandbox, &a.target).await?;
        let live = ctx.state.sandboxes.live();
        let mut handle = reader.lock().await;
        let pid = handle.pid();
        let max = a.max_bytes.unwrap_or(64 * 1024);
        let (mut stdout, mut stderr, mut pty) = (Vec::new(), Vec::new(), Vec::new());
        let mut dropped = 0u64;
        let mut ended = None;
        let mut taken = 0usize;
        // The first event may be waited for; the rest are what has already come.
        let mut first = true;
        while taken < max && ended.is_none() {
            let event = if first && a.wait_ms > 0 {
                tokio::time::timeout(Duration::from_millis(a.wait_ms), handle.next())
                    .await
                    .ok()
                    .flatten()
            } else {
                handle.try_next()
            };
            first = false;
            let Some(event) = event else { break };
            match event {
                ProcessEvent::Stdout(b) => {
                    taken += b.len();
                    stdout.extend_from_slice(&b);
                }
                ProcessEvent::Stderr(b) => {
                    taken += b.len();
                    stderr.extend_from_slice(&b);
                }
                ProcessEvent::Pty(b) => {
                    taken += b.len();
                    pty.extend_from_slice(&b);
                }
                ProcessEvent::Dropped { bytes, .. } => dropped += bytes,
                ProcessEvent::End(end) => ended = Some(end),
            }
        }
        drop(handle);
        if ended.is_some() {
            live.ended(sandbox, pid);
        }
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        Ok(json!({
            "pid": pid,
            "stdout": text(stdout),
            "stderr": text(stderr),
            "pty": text(pty),
            "dropped_bytes": dropped,
            "more": taken >= max && ended.is_none(),
            "ended": ended.map(|e| json!({
                "exit_code": e.exit_code,
                "signal": e.signal,
                "stdout_bytes": e.stdout_bytes,
                "stderr_bytes": e.stderr_bytes,
                "truncated": e.truncated.stdout || e.truncated.stderr,
                "timed_out": e.timed_out,
                "error": e.error,
            })),
        }))
    })
}

/// The pid `target` names in the caller's sandbox (a tag is resolved by the dispatcher).
async fn pid_of(
    ctx: &ToolContext<'_>,
    sandbox: SandboxId,
    target: &Target,
) -> Result<u32, ToolError> {
    if let (Some(pid), None) = (target.pid, &target.tag) {
        return Ok(pid);
    }
    let pid = reader_of(ctx, sandbox, target).await?.lock().await.pid();
    Ok(pid)
}

/// The node's one reader of the process `target` names in the caller's sandbox (kept since its
/// start, or attached now), shared with every other call that reads it.
async fn reader_of(
    ctx: &ToolContext<'_>,
    sandbox: SandboxId,
    target: &Target,
) -> Result<aegis_sandboxes::live::Reader, ToolError> {
    let dispatcher = dispatcher_of(ctx)?;
    ctx.state
        .sandboxes
        .live()
        .reader(dispatcher, sandbox, target.selector()?)
        .await
        .map_err(refused)
}

fn proc_input<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            #[serde(flatten)]
            target: Target,
            #[serde(default)]
            data: String,
            #[serde(default)]
            close: bool,
            resize: Option<PtySize>,
        }
        let a: A = args(a)?;
        let sandbox = sandbox_of(ctx)?;
        let pid = pid_of(ctx, sandbox, &a.target).await?;
        let dispatcher = dispatcher_of(ctx)?;
        if let Some(size) = a.resize {
            if size.cols == 0 || size.rows == 0 {
                return Err(ToolError::new(
                    "invalid_arguments",
                    "resize: `cols` and `rows` must be at least 1",
                ));
            }
            dispatcher
                .resize_pty(sandbox, pid, size)
                .await
                .map_err(refused)?;
        }
        let written = if a.data.is_empty() {
            0
        } else {
            dispatcher
                .send_input(sandbox, pid, a.data.as_bytes())
                .await
                .map_err(refused)?
        };
        if a.close {
            dispatcher
                .close_stdin(sandbox, pid)
                .await
                .map_err(refused)?;
        }
        Ok(json!({"pid": pid, "written": written, "closed": a.close,
                  "resized": a.resize.is_some()}))
    })
}

fn proc_signal<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            #[serde(flatten)]
            target: Target,
            signal: String,
        }
        let a: A = args(a)?;
        let signal = match a.signal.as_str() {
            "term" => ProcessSignal::Term,
            "kill" => ProcessSignal::Kill,
            other => {
                return Err(ToolError::new(
                    "invalid_arguments",
                    format!("unknown signal `{other}`; expected term or kill"),
                ))
            }
        };
        let sandbox = sandbox_of(ctx)?;
        let pid = pid_of(ctx, sandbox, &a.target).await?;
        let dispatcher = dispatcher_of(ctx)?;
        dispatcher
            .signal_process(sandbox, pid, signal)
            .await
            .map_err(refused)?;
        Ok(json!({"pid": pid, "signal": a.signal}))
    })
}
