//! `proc.list`, `logs.read` and `env.get`: the process tools, run inside the caller's sandbox.
//!
//! They let an agent debug what it started (which processes run, which ports they listen on,
//! what their logs say, what environment they see) without a shell. The router has already
//! checked the tool against the manifest or security context and `path` against the read
//! allowlist; the executor does the work as the sandbox user, beneath the allowed roots. Secret
//! masking happens in the executor, so a masked value never leaves the sandbox; whether a caller
//! may ask for values unmasked is the sandbox policy's `unmask_env`, decided here.

use dispatcher::protocol::{EnvGetParams, LogsReadParams, Op, ProcListParams};
use serde::Deserialize;
use serde_json::{json, Value};

use super::sandbox::{path_of, run};
use super::{args, Handler, HandlerFuture, ToolContext, ToolError};

pub(super) fn handlers() -> Vec<(&'static str, Handler)> {
    vec![
        ("proc.list", proc_list),
        ("logs.read", logs_read),
        ("env.get", env_get),
    ]
}

fn proc_list<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            name: Option<String>,
            port: Option<u16>,
            limit: Option<u32>,
            #[serde(default)]
            include_internal: bool,
        }
        let a: A = args(a)?;
        run(
            ctx,
            Op::ProcList(ProcListParams {
                name: a.name,
                port: a.port,
                limit: a.limit,
                include_internal: a.include_internal,
            }),
        )
        .await
    })
}

fn logs_read<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            path: String,
            lines: Option<u64>,
            filter: Option<String>,
            #[serde(default)]
            regex: bool,
            json_field: Option<String>,
        }
        let a: A = args(a)?;
        let path = path_of(&a.path)?;
        let mut out = run(
            ctx,
            Op::LogsRead(LogsReadParams {
                path: path.clone(),
                lines: a.lines,
                filter: a.filter,
                regex: a.regex,
                json_field: a.json_field,
            }),
        )
        .await?;
        out["path"] = json!(path);
        Ok(out)
    })
}

fn env_get<'a>(ctx: &'a ToolContext<'a>, a: Value) -> HandlerFuture<'a> {
    Box::pin(async move {
        #[derive(Deserialize)]
        struct A {
            path: Option<String>,
            keys: Option<Vec<String>>,
            mask_secrets: Option<bool>,
        }
        let a: A = args(a)?;
        let unmask = a.mask_secrets == Some(false);
        if unmask {
            let allowed = ctx.sandbox.as_ref().is_some_and(|(_, p)| p.unmask_env);
            if !allowed {
                return Err(ToolError::new(
                    "unmask_not_allowed",
                    "mask_secrets=false needs a policy that allows unmasking (agent manifest \
                     spec.security.unmask_env: true, or a SEAL capability with unmask_env: true)",
                ));
            }
        }
        let path = a.path.as_deref().map(path_of).transpose()?;
        run(
            ctx,
            Op::EnvGet(EnvGetParams {
                path,
                keys: a.keys,
                unmask,
            }),
        )
        .await
    })
}
