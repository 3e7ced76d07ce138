//! `cmd.run` and `fs.*`: tools that run inside the caller's sandbox through the dispatcher.
//!
//! By the time a handler here runs, the router has checked the tool against the agent's manifest
//! and the paths and command against its allowlists. The handler translates the arguments to the
//! executor's protocol, applies the server ceilings (a caller may lower them, never raise them),
//! and shapes the executor's answer into the output the tool reference documents.

use std::collections::BTreeMap;

use dispatcher::protocol::{
    DeleteParams, Edit, EditParams, Encoding, ExecGrant, GlobParams, GrepParams, MultiEditParams,
    Op, PathParams, PtySize, ReadParams, RunAs, RunParams, WriteParams, WriteStreamParams,
};
use dispatcher::SandboxId;
use serde::Deserialize;
use serde_json::{json, Value};

use super::dispatch::{dispatch_error, dispatcher_of, executor_code, refused};
use super::live::sandbox_of;
use super::{args, Handler, HandlerFuture, ToolContext, ToolError};
use aegis_policy::paths;

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![
        ("cmd.run", cmd_run),
        ("fs.read", fs_read),
        ("fs.write", fs_write),
        ("fs.list", fs_list),
        ("fs.create_dir", fs_create_dir),
        ("fs.create.dir", fs_create_dir),
        ("fs.delete", fs_delete),
        ("fs.edit", fs_edit),
        ("fs.multi_edit", fs_multi_edit),
        ("fs.grep", fs_grep),
        ("fs.glob", fs_glob),
    ]
}

/// Sends one operation to the caller's sandbox and returns the executor's result object.
pub(super) async fn run(ctx: &ToolContext<'_>, op: Op) -> Result<Value, ToolError> {
    let id = sandbox_of(ctx)?;
    let response = dispatcher_of(ctx)?
        .call(id, op)
        .await
        .map_err(dispatch_error)?;
    response
        .into_result()
        .map_err(|e| ToolError::new(executor_code(e.kind.as_str()), e.message))
}

/// The normalised path the executor gets (policy already accepted it).
pub(super) fn path_of(p: &str) -> Result<String, ToolError> {
    paths::normalise(p).map_err(|m| ToolError::new("invalid_arguments", m))
}

#[derive(Deserialize)]
struct PathArg {
    path: String,
    /// Who performs it (`root` only where the sandbox allows root; the executor decides).
    #[serde(default)]
    user: RunAs,
}

fn fs_read<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            path: String,
            byte_offset: Option<u64>,
            max_bytes: Option<u64>,
            #[serde(default)]
            user: RunAs,
        }
        let a: A = args(a)?;
        let path = path_of(&a.path)?;
        if let Some(super::Transfer::Download(sink)) = ctx.take_transfer() {
            let (id, held) = transfer_target(ctx).await?;
            if !held {
                return super::transfer::read_forwarded(ctx, id, path, a.user, sink).await;
            }
            let out = dispatcher_of(ctx)?
                .read_stream(
                    id,
                    PathParams {
                        path: path.clone(),
                        user: a.user,
                    },
                    sink,
                )
                .await
                .map_err(refused)?;
            return Ok(
                json!({"status": "ok", "path": path, "size_bytes": out.size_bytes,
                             "bytes_read": out.bytes_read, "truncated": false}),
            );
        }
        let mut out = run(
            ctx,
            Op::FsRead(ReadParams {
                path: path.clone(),
                offset: None,
                limit: None,
                max_bytes: a.max_bytes,
                byte_offset: a.byte_offset,
                user: a.user,
            }),
        )
        .await?;
        let mut result = json!({
            "status": "ok", "path": path, "encoding": out["encoding"],
            "size_bytes": out["size_bytes"], "truncated": out["truncated"],
        });
        // Moved, not copied (`json!` would copy the file's content).
        result["content"] = out["content"].take();
        Ok(result)
    })
}

fn fs_write<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            path: String,
            content: String,
            #[serde(default)]
            encoding: Encoding,
            #[serde(default)]
            append: bool,
            #[serde(default)]
            metadata: BTreeMap<String, String>,
            #[serde(default)]
            user: RunAs,
        }
        let a: A = args(a)?;
        let path = path_of(&a.path)?;
        if let Some(super::Transfer::Upload(source)) = ctx.take_transfer() {
            let (id, held) = transfer_target(ctx).await?;
            if !held {
                return super::transfer::write_forwarded(ctx, id, path, a.metadata, a.user, source)
                    .await;
            }
            let params = WriteStreamParams {
                path: path.clone(),
                create_dirs: true,
                metadata: a.metadata,
                user: a.user,
            };
            let out = dispatcher_of(ctx)?
                .write_stream(id, params, source)
                .await
                .map_err(refused)?;
            return Ok(
                json!({"status": "ok", "path": path, "bytes_written": out.bytes_written,
                             "created": out.created}),
            );
        }
        let out = run(
            ctx,
            Op::FsWrite(WriteParams {
                path: path.clone(),
                content: a.content,
                encoding: a.encoding,
                create_dirs: true,
                append: a.append,
                metadata: a.metadata,
                user: a.user,
            }),
        )
        .await?;
        Ok(
            json!({"status": "ok", "path": path, "bytes_written": out["bytes_written"], "created": out["created"]}),
        )
    })
}

fn fs_list<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(path_call(ctx, a, Op::FsList, &["entries", "truncated"]))
}

fn fs_create_dir<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(path_call(ctx, a, Op::FsCreateDir, &["created"]))
}

/// An `fs.*` call on a path alone: `op` on the normalised path, answered with the path and the
/// executor's `fields`.
async fn path_call(
    ctx: &ToolContext<'_>,
    a: Value,
    op: fn(PathParams) -> Op,
    fields: &[&str],
) -> Result<Value, ToolError> {
    let a: PathArg = args(a)?;
    let path = path_of(&a.path)?;
    let params = PathParams {
        path: path.clone(),
        user: a.user,
    };
    let out = run(ctx, op(params)).await?;
    Ok(with_fields(
        json!({"status": "ok", "path": path}),
        &out,
        fields,
    ))
}

/// `answer` with the executor's `fields` of `out` added.
fn with_fields(mut answer: Value, out: &Value, fields: &[&str]) -> Value {
    for field in fields {
        answer[*field] = out[*field].clone();
    }
    answer
}

/// The caller's sandbox for a file transfer, and whether this node holds it (else the bytes go
/// through the node that does).
async fn transfer_target(ctx: &ToolContext<'_>) -> Result<(SandboxId, bool), ToolError> {
    let id = sandbox_of(ctx)?;
    let held = dispatcher_of(ctx)?
        .holds(id)
        .await
        .map_err(dispatch_error)?;
    Ok((id, held))
}

fn fs_delete<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            path: String,
            #[serde(default)]
            recursive: bool,
            #[serde(default)]
            user: RunAs,
        }
        let a: A = args(a)?;
        let path = path_of(&a.path)?;
        run(
            ctx,
            Op::FsDelete(DeleteParams {
                path: path.clone(),
                recursive: a.recursive,
                user: a.user,
            }),
        )
        .await?;
        Ok(json!({"status": "ok", "path": path}))
    })
}

fn fs_edit<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            path: String,
            target_content: String,
            replacement_content: String,
        }
        let a: A = args(a)?;
        let path = path_of(&a.path)?;
        run(
            ctx,
            Op::FsEdit(EditParams {
                path: path.clone(),
                old_string: a.target_content,
                new_string: a.replacement_content,
            }),
        )
        .await?;
        Ok(json!({"status": "ok", "path": path, "message": "replaced 1 occurrence"}))
    })
}

fn fs_multi_edit<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct E {
            target_content: String,
            replacement_content: String,
        }
        #[derive(Deserialize)]
        struct A {
            path: String,
            edits: Vec<E>,
        }
        let a: A = args(a)?;
        let path = path_of(&a.path)?;
        let count = a.edits.len();
        let edits = a
            .edits
            .into_iter()
            .map(|e| Edit {
                old_string: e.target_content,
                new_string: e.replacement_content,
            })
            .collect();
        run(
            ctx,
            Op::FsMultiEdit(MultiEditParams {
                path: path.clone(),
                edits,
            }),
        )
        .await?;
        Ok(json!({"status": "ok", "path": path, "applied": count}))
    })
}

fn fs_grep<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    let op = |pattern, path| {
        Op::FsGrep(GrepParams {
            pattern,
            path,
            ..GrepParams::default()
        })
    };
    Box::pin(search(ctx, a, op, &["files_scanned"]))
}

fn fs_glob<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    let op = |pattern, path| {
        Op::FsGlob(GlobParams {
            pattern,
            path: Some(path),
            max_matches: None,
        })
    };
    Box::pin(search(ctx, a, op, &[]))
}

/// `fs.grep` and `fs.glob`: `op` with the pattern and the normalised path, answered with the
/// matches, their count, whether they were cut, and the executor's `fields`.
async fn search(
    ctx: &ToolContext<'_>,
    a: Value,
    op: fn(String, String) -> Op,
    fields: &[&str],
) -> Result<Value, ToolError> {
    #[derive(Deserialize)]
    struct A {
        pattern: String,
        path: String,
    }
    let a: A = args(a)?;
    let path = path_of(&a.path)?;
    let out = run(ctx, op(a.pattern, path)).await?;
    let count = out["matches"].as_array().map_or(0, Vec::len);
    let answer = json!({"matches": out["matches"], "count": count, "truncated": out["truncated"]});
    Ok(with_fields(answer, &out, fields))
}

fn cmd_run<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            command: String,
            #[serde(default)]
            args: Vec<String>,
            cwd: Option<String>,
            #[serde(default)]
            env_additions: BTreeMap<String, String>,
            timeout_secs: Option<u64>,
            max_output_bytes: Option<u64>,
            #[serde(default)]
            background: bool,
            tag: Option<String>,
            #[serde(default)]
            stdin: bool,
            pty: Option<PtySize>,
            #[serde(default)]
            user: RunAs,
        }
        let a: A = args(a)?;
        if !a.background && (a.tag.is_some() || a.stdin || a.pty.is_some()) {
            return Err(ToolError::new(
                "invalid_arguments",
                "`tag`, `stdin` and `pty` apply to a background command only (`background: true`)",
            ));
        }
        let (_, policy) = ctx
            .sandbox
            .as_ref()
            .ok_or_else(|| ToolError::new("sandbox_required", "cmd.run runs inside a sandbox"))?;
        // The router's policy check accepted this command line; split it the same way.
        let argv = policy
            .command
            .argv(&a.command, &a.args)
            .map_err(|r| ToolError::new("command_not_allowed", r.message))?;
        let timeout = a
            .timeout_secs
            .unwrap_or(policy.cmd_timeout_secs)
            .min(policy.cmd_timeout_secs);
        let cap = a
            .max_output_bytes
            .unwrap_or(policy.max_output_bytes)
            .min(policy.max_output_bytes);
        let cwd = a.cwd.as_deref().map(path_of).transpose()?;
        // The agent's `spec.env` first; the caller's allowlisted additions override it.
        if let Some(name) = policy
            .env
            .keys()
            .find(|n| aegis_policy::command::CommandPolicy::forbidden_env(n))
        {
            return Err(ToolError::new(
                "env_not_allowed",
                format!(
                    "the agent's spec.env sets `{name}`, which may never be set (it changes which \
                     code runs); remove it from the manifest and deploy a new version"
                ),
            ));
        }
        let mut env = policy.env.clone();
        env.extend(a.env_additions);
        if let Some((id, _)) = &ctx.sandbox {
            // A networked sandbox's only way out: its proxy (set last, so it wins).
            env.extend(ctx.state.sandboxes.proxy_env(*id));
        }
        // The same allowlist, held by the kernel for every process the command starts.
        let exec = match policy.command.programs() {
            Some(programs) => ExecGrant::Only(programs),
            None => ExecGrant::Any,
        };
        if a.background {
            return super::live::start(
                ctx,
                super::live::Background {
                    argv,
                    cwd,
                    env,
                    tag: a.tag,
                    stdin: a.stdin,
                    pty: a.pty,
                    // No deadline unless one is asked for (within the ceiling): a background
                    // process may serve until it is stopped or its sandbox goes.
                    timeout_secs: a.timeout_secs.map(|t| t.min(policy.cmd_timeout_secs)),
                    max_output_bytes: cap,
                    exec,
                    user: a.user,
                },
            )
            .await;
        }
        if let Some(output) = &ctx.output {
            // The streaming form: the same command, grant, timeout and cap, its output sent
            // as it comes and its result shaped below like the one-shot call's.
            let out = super::stream::run(
                ctx,
                super::stream::Foreground {
                    argv,
                    cwd,
                    env,
                    timeout_secs: timeout,
                    max_output_bytes: cap,
                    exec,
                    user: a.user,
                },
                output,
            )
            .await?;
            return Ok(cmd_result(&out, cap));
        }
        let out = run(
            ctx,
            Op::CmdRun(RunParams {
                argv,
                cwd,
                env,
                timeout_ms: timeout.saturating_mul(1000),
                grace_ms: None,
                max_stdout_bytes: cap,
                max_stderr_bytes: cap,
                exec,
                user: a.user,
            }),
        )
        .await?;
        Ok(cmd_result(&out, cap))
    })
}

/// `cmd.run`'s result from the executor's answer (or the streaming form's, shaped alike), so
/// both forms of a call answer the same.
fn cmd_result(out: &Value, cap: u64) -> Value {
    let truncated = out["truncated"]["stdout"] == true || out["truncated"]["stderr"] == true;
    let mut result = json!({
        "exit_code": out["exit_code"].as_i64().unwrap_or(-1),
        "signal": out["signal"],
        "stdout": out["stdout"], "stderr": out["stderr"],
        "stdout_encoding": out["stdout_encoding"], "stderr_encoding": out["stderr_encoding"],
        "stdout_bytes": out["stdout_bytes"], "stderr_bytes": out["stderr_bytes"],
        "truncated": truncated, "truncated_streams": out["truncated"],
        "duration_ms": out["duration_ms"], "timed_out": out["timed_out"],
    });
    if truncated {
        result["notice"] = json!(format!(
            "output capped at {cap} bytes per stream; stdout_bytes and stderr_bytes give the full sizes"
        ));
    }
    // Only the streaming form can miss output (a reader that fell behind the node's buffer).
    if let Some(dropped) = out.get("dropped_bytes") {
        result["dropped_bytes"] = dropped.clone();
    }
    result
}
