//! `code.run` and `code.contexts`: the code interpreter on our own doors. They act in the
//! caller's sandbox, which must run the code interpreter runtime (`code-interpreter:1`, whose
//! server speaks E2B's code-interpreter API on port 49999: `/execute`, `/contexts`).
//!
//! The router has decided the call like any sandbox tool (the tool in the manifest's
//! `spec.tools` or the security context, the sandbox the caller's own) and audits it: the
//! intent row carries the digest of the code, the completion row the digest of the result.
//! The server is reached only through the sandbox's executor: a port connection it opens
//! inside the sandbox to `127.0.0.1:49999` (`Dispatcher::open_port_anywhere`, the relay E2B's
//! port route uses, through the replica holding the sandbox when that is another), carrying one
//! HTTP/1.1 request ([`http`]). When nothing listens there, the handler
//! starts the runtime registry's `start` command line (the server, as the sandbox user, under
//! the sandbox's kernel-held rules; the only program these tools start, and it starts the
//! interpreters), and waits until its `/health` answers, as the registry's `ready` does.

mod http;
mod output;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use aegis_core::runtimes::Runtime;
use dispatcher::protocol::{ErrorKind, ExecGrant, StartParams};
use dispatcher::{DispatchError, PortBounds, SandboxId};
use serde::Deserialize;
use serde_json::{json, Value};

use super::dispatch::{dispatch_error, dispatcher_of, refused};
use super::{args, Handler, HandlerFuture, ToolContext, ToolError};
use http::{Exchange, HttpError};
use output::Collected;

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![("code.run", code_run), ("code.contexts", code_contexts)]
}

/// The interpreter server's port in the sandbox (E2B's).
pub const INTERPRETER_PORT: u16 = 49999;
/// The runtime language whose sandboxes have the interpreter server.
const INTERPRETER_LANGUAGE: &str = "code-interpreter";
/// The tag the started server carries among the sandbox's processes (`proc.list`).
const SERVER_TAG: &str = "code-interpreter-server";
/// Longest a start may take until `/health` answers (the Python kernel starts in seconds; a
/// loaded node is slower).
const READY_SECS: u64 = 90;
/// Bytes of an answer to a context call or a health check.
const CONTROL_BYTES: u64 = 1024 * 1024;
/// Bytes of one `/execute` answer read (the server sends at most 8 MiB of output per
/// execution, images included, plus its framing).
const EXECUTE_BYTES: u64 = 24 * 1024 * 1024;
/// Default `timeout_secs` of `code.run`.
const DEFAULT_TIMEOUT_SECS: u64 = 60;
/// Cap of stdout and of stderr per call (lowered by the sandbox policy's output ceiling).
const STREAM_CAP_BYTES: u64 = 1024 * 1024;
/// Programs the interpreter server runs besides itself (its kernels), granted beside the
/// policy's own programs when that policy lists programs (`java`: the image links it into
/// `PATH`, the grant follows the link to the JVM).
const INTERPRETERS: &[&str] = &["python3", "node", "java", "bash"];

/// One start of a sandbox's server at a time (two first calls must not race two servers).
static STARTING: LazyLock<Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>> =
    LazyLock::new(Mutex::default);

/// The sandbox of a call, with its interpreter server running.
struct Interpreter {
    sandbox: SandboxId,
    /// This call started the server.
    started: bool,
}

/// The sandbox's runtime, when it is the code interpreter; else a clear error naming it.
async fn runtime_of(
    ctx: &ToolContext<'_>,
    sandbox: SandboxId,
) -> Result<&'static Runtime, ToolError> {
    let info = dispatcher_of(ctx)?
        .get(sandbox)
        .await
        .map_err(dispatch_error)?;
    let registry = aegis_core::runtimes::registry()
        .map_err(|e| ToolError::new("unavailable", e.to_owned()))?;
    let mut of_image = registry.runtimes.iter().filter(|r| r.image == info.image);
    if let Some(found) = of_image
        .clone()
        .find(|r| r.language == INTERPRETER_LANGUAGE && r.start.is_some())
    {
        return Ok(found);
    }
    let named = of_image
        .next()
        .map(|r| format!("runtime {}:{}", r.language, r.version))
        .unwrap_or_else(|| "no runtime of the registry".to_owned());
    Err(ToolError::new(
        "no_interpreter",
        format!(
            "sandbox {sandbox} runs {} ({named}), which has no code interpreter: code.run and \
             code.contexts need a sandbox of the runtime `{INTERPRETER_LANGUAGE}:1` (REST \
             POST /v1/sandboxes {{\"runtime\": \"{INTERPRETER_LANGUAGE}\"}}, a manifest's \
             spec.runtime {{language: {INTERPRETER_LANGUAGE}, version: \"1\"}}, a security \
             context's runtime, or E2B's template code-interpreter-v1)",
            info.image
        ),
    ))
}

/// What `/health` says.
enum Health {
    /// Nothing listens on the port.
    Down,
    /// The server answers but its default contexts are still starting.
    Starting,
    Ready,
}

/// A connection's bounds: one request out (its code is bounded by the tool's schema), and no
/// more answer than the largest an exchange reads (each exchange bounds its own answer below).
const STREAM_BOUNDS: PortBounds = PortBounds {
    to_server: EXECUTE_BYTES,
    to_client: EXECUTE_BYTES + CONTROL_BYTES,
};

async fn connect(
    ctx: &ToolContext<'_>,
    sandbox: SandboxId,
) -> Result<tokio::io::DuplexStream, ToolError> {
    dispatcher_of(ctx)?
        .open_port_anywhere(sandbox, INTERPRETER_PORT)
        .await
        .map(|opened| opened.into_stream(STREAM_BOUNDS))
        .map_err(refused)
}

async fn health(ctx: &ToolContext<'_>, sandbox: SandboxId) -> Result<Health, ToolError> {
    let opened = dispatcher_of(ctx)?
        .open_port_anywhere(sandbox, INTERPRETER_PORT)
        .await;
    let connection = match opened {
        Ok(c) => c.into_stream(STREAM_BOUNDS),
        Err(DispatchError::Refused {
            kind: ErrorKind::NotFound,
            ..
        }) => return Ok(Health::Down),
        Err(e) => return Err(refused(e)),
    };
    // A server that closes while starting up counts as starting.
    let Ok(exchange) = Exchange::send(connection, "GET", "/health", None, CONTROL_BYTES).await
    else {
        return Ok(Health::Starting);
    };
    Ok(if exchange.status == 200 {
        Health::Ready
    } else {
        Health::Starting
    })
}

/// The caller's sandbox with its server running: started when nothing listens (once, however
/// many calls come at the same time), then waited for until `/health` answers 200.
async fn interpreter(ctx: &ToolContext<'_>) -> Result<Interpreter, ToolError> {
    let (sandbox, policy) = ctx
        .sandbox
        .as_ref()
        .ok_or_else(|| ToolError::new("sandbox_required", "this tool runs inside a sandbox"))?;
    let sandbox = *sandbox;
    let runtime = runtime_of(ctx, sandbox).await?;
    if matches!(health(ctx, sandbox).await?, Health::Ready) {
        return Ok(Interpreter {
            sandbox,
            started: false,
        });
    }
    let gate = {
        let mut starting = STARTING.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(starting.entry(sandbox).or_default())
    };
    let held = gate.lock().await;
    let result = start_and_wait(ctx, sandbox, policy, runtime).await;
    drop(held);
    {
        let mut starting = STARTING.lock().unwrap_or_else(|p| p.into_inner());
        // Ours and the map's: nobody else waits on it.
        if Arc::strong_count(&gate) == 2 {
            starting.remove(&sandbox);
        }
    }
    result.map(|started| Interpreter { sandbox, started })
}

/// Starts the registry's `start` command line in `sandbox` as a kept live process: in a
/// readable root of the policy, with its environment (and, networked, its proxy), allowed to
/// run the interpreters beside the policy's own programs.
async fn start_server(
    ctx: &ToolContext<'_>,
    sandbox: SandboxId,
    policy: &aegis_policy::SandboxPolicy,
    runtime: &Runtime,
) -> Result<dispatcher::ProcessHandle, ToolError> {
    let line = runtime.start.as_deref().unwrap_or_default();
    // It runs in a readable root: the workspace, else the first root the policy has.
    let cwd = if policy.read_roots.iter().any(|r| r == dispatcher::WORKSPACE) {
        None
    } else {
        let root = policy.read_roots.first().ok_or_else(|| {
            ToolError::new(
                "path_not_allowed",
                format!(
                    "the policy of sandbox {sandbox} ({}) grants no readable root for the \
                     interpreter to run in; a security context's code.run capability with \
                     an empty path_allowlist grants none",
                    policy.agent
                ),
            )
        })?;
        Some(root.clone())
    };
    let argv: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
    // The kernels inherit the policy's environment (an agent's `spec.env`) and, in a
    // networked sandbox, its proxy.
    let mut env: BTreeMap<String, String> = policy.env.clone();
    env.extend(ctx.state.sandboxes.proxy_env(sandbox));
    let exec = match policy.command.programs() {
        None => ExecGrant::Any,
        Some(mut programs) => {
            for name in INTERPRETERS {
                if !programs.iter().any(|p| p == name) {
                    programs.push((*name).to_owned());
                }
            }
            ExecGrant::Only(programs)
        }
    };
    dispatcher_of(ctx)?
        .start_process(
            sandbox,
            StartParams {
                argv,
                cwd,
                env,
                tag: Some(SERVER_TAG.to_owned()),
                stdin: false,
                pty: None,
                timeout_ms: None,
                grace_ms: None,
                max_output_bytes: Some(64 * 1024),
                exec,
                user: Default::default(),
            },
        )
        .await
        .map_err(|e| {
            let e = refused(e);
            ToolError::new(
                e.code,
                format!(
                    "the code interpreter server (`{line}`) could not start: {}",
                    e.message
                ),
            )
        })
}

/// Starts the server unless another call did meanwhile, then waits for it; true when this
/// call started it.
async fn start_and_wait(
    ctx: &ToolContext<'_>,
    sandbox: SandboxId,
    policy: &aegis_policy::SandboxPolicy,
    runtime: &Runtime,
) -> Result<bool, ToolError> {
    let mut process = match health(ctx, sandbox).await? {
        Health::Ready => return Ok(false),
        Health::Starting => None,
        Health::Down => Some(start_server(ctx, sandbox, policy, runtime).await?),
    };
    let ready = async {
        loop {
            if matches!(health(ctx, sandbox).await?, Health::Ready) {
                return Ok::<(), ToolError>(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let not_ready = |detail: String| {
        ToolError::new(
            "interpreter_unavailable",
            format!(
                "the code interpreter server of sandbox {sandbox} {detail}; its log is \
                 /tmp/aegis-ci/server.log in the sandbox"
            ),
        )
    };
    let ended = async {
        match process.as_mut() {
            Some(handle) => handle.wait_end().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        waited = tokio::time::timeout(Duration::from_secs(READY_SECS), ready) => match waited {
            Ok(answered) => answered?,
            Err(_) => return Err(not_ready(format!("did not answer /health within {READY_SECS} s"))),
        },
        end = ended => {
            let how = end.map_or_else(
                || "its end was not observed".to_owned(),
                |e| format!("exit code {:?}, signal {:?}{}", e.exit_code, e.signal,
                    e.error.map(|m| format!(", {m}")).unwrap_or_default()),
            );
            return Err(not_ready(format!("ended before it was ready ({how})")));
        }
    }
    let started = process.is_some();
    if let Some(handle) = process {
        // Kept like a background command's, so `proc.list` and `proc.output` (tag
        // `code-interpreter-server`) show it.
        ctx.state.sandboxes.live().keep(sandbox, handle);
    }
    Ok(started)
}

/// A tool error for an exchange that failed.
fn exchange_error(e: HttpError) -> ToolError {
    ToolError::new("interpreter_unavailable", e.to_string())
}

/// A tool error for a refusal the server answered with `status` and `body`.
fn refusal(status: u16, body: &[u8]) -> ToolError {
    let text = String::from_utf8_lossy(body).trim().to_owned();
    let code = match status {
        400 => "invalid_arguments",
        404 => "not_found",
        429 => "limit_reached",
        _ => "interpreter_error",
    };
    ToolError::new(
        code,
        format!("the code interpreter answered {status}: {text}"),
    )
}

/// One request to the server whose whole answer is read; its JSON (or null when empty).
async fn control(
    ctx: &ToolContext<'_>,
    at: &Interpreter,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Value, ToolError> {
    let connection = connect(ctx, at.sandbox).await?;
    let exchange = Exchange::send(connection, method, path, body, CONTROL_BYTES)
        .await
        .map_err(exchange_error)?;
    let status = exchange.status;
    let bytes = exchange.body().await.map_err(exchange_error)?;
    if status != 200 {
        return Err(refusal(status, &bytes));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        ToolError::new(
            "interpreter_error",
            format!("the code interpreter's answer to {method} {path} is not JSON: {e}"),
        )
    })
}

fn code_run<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            code: String,
            language: Option<String>,
            context_id: Option<String>,
            #[serde(default)]
            env_vars: BTreeMap<String, String>,
            timeout_secs: Option<u64>,
        }
        let a: A = args(a)?;
        if a.context_id.is_some() && a.language.is_some() {
            return Err(ToolError::new(
                "invalid_arguments",
                "give context_id or language, not both: a context has its own language",
            ));
        }
        let (_, policy) = ctx
            .sandbox
            .as_ref()
            .ok_or_else(|| ToolError::new("sandbox_required", "code.run runs inside a sandbox"))?;
        let timeout = a
            .timeout_secs
            .unwrap_or(DEFAULT_TIMEOUT_SECS)
            .min(policy.cmd_timeout_secs)
            .max(1);
        let cap =
            usize::try_from(STREAM_CAP_BYTES.min(policy.max_output_bytes)).unwrap_or(usize::MAX);
        let language = match &a.context_id {
            Some(_) => None,
            None => Some(a.language.unwrap_or_else(|| "python".to_owned())),
        };
        let at = interpreter(ctx).await?;
        let mut body = json!({"code": a.code, "env_vars": a.env_vars});
        match (&a.context_id, &language) {
            (Some(id), _) => body["context_id"] = json!(id),
            (None, Some(language)) => body["language"] = json!(language),
            (None, None) => {}
        }
        let connection = connect(ctx, at.sandbox).await?;
        let mut exchange =
            Exchange::send(connection, "POST", "/execute", Some(&body), EXECUTE_BYTES)
                .await
                .map_err(exchange_error)?;
        if exchange.status != 200 {
            let status = exchange.status;
            let bytes = exchange.body().await.map_err(exchange_error)?;
            return Err(refusal(status, &bytes));
        }
        let mut collected = Collected::new(cap);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        let timed_out = loop {
            match tokio::time::timeout_at(deadline, exchange.next_line()).await {
                Err(_) => break Some(timeout),
                Ok(Ok(Some(line))) => {
                    collected.take(&line);
                    if collected.ended {
                        break None;
                    }
                }
                Ok(Ok(None)) => break None,
                Ok(Err(HttpError::TooLarge(bound))) => {
                    collected.cut(&format!(
                        "the answer passed {bound} bytes; the rest was dropped and the execution interrupted"
                    ));
                    break None;
                }
                Ok(Err(e)) => return Err(exchange_error(e)),
            }
        };
        // Closing the connection is what interrupts an execution still running (the server
        // notices at its next keepalive line and interrupts the kernel).
        drop(exchange);
        let mut out = collected.finish(timed_out, a.context_id.as_deref(), language.as_deref());
        out["server_started"] = json!(at.started);
        Ok(out)
    })
}

fn code_contexts<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            action: String,
            language: Option<String>,
            cwd: Option<String>,
            context_id: Option<String>,
        }
        let a: A = args(a)?;
        let at = interpreter(ctx).await?;
        let id = a.context_id.as_deref().unwrap_or_default();
        let mut out = match a.action.as_str() {
            "list" => {
                let listed = control(ctx, &at, "GET", "/contexts", None).await?;
                json!({"action": "list", "contexts": listed})
            }
            "create" => {
                let mut body =
                    json!({"language": a.language.unwrap_or_else(|| "python".to_owned())});
                if let Some(cwd) = a.cwd {
                    body["cwd"] = json!(cwd);
                }
                let made = control(ctx, &at, "POST", "/contexts", Some(&body)).await?;
                json!({"action": "create", "context": made})
            }
            "restart" => {
                control(ctx, &at, "POST", &format!("/contexts/{id}/restart"), None).await?;
                json!({"action": "restart", "context_id": id})
            }
            "remove" => {
                control(ctx, &at, "DELETE", &format!("/contexts/{id}"), None).await?;
                json!({"action": "remove", "context_id": id})
            }
            other => {
                return Err(ToolError::new(
                    "invalid_arguments",
                    format!("action `{other}` is not one of list, create, restart, remove"),
                ))
            }
        };
        out["server_started"] = json!(at.started);
        Ok(out)
    })
}
