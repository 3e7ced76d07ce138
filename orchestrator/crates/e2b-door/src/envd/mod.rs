//! envd, served by the node for the sandbox named in `E2b-Sandbox-Id`:
//! `filesystem.Filesystem/{Stat, MakeDir, Move, ListDir, Remove}` here, its watches in
//! [`watch`] and `process.Process/*` in [`process`], over the Connect protocol
//! (JSON or binary protobuf), `/health` and `/envs`; and what they share (the target sandbox
//! and its owner, router calls, Connect answers).
//!
//! Every decision is one or more tool calls through the router (`tools::invoke_in`) as the
//! sandbox's owner key, on the sandbox's policy: `Start` is `cmd.run`, `Stat` and `ListDir` are
//! `fs.list`, `MakeDir` is `fs.create_dir`, `Remove` is `fs.delete`, and `Move` is `fs.read`,
//! `fs.write` and `fs.delete` of a file, or of each file of a directory's tree. So an E2B call is decided, audited and held by the
//! kernel exactly like the same call on REST, gRPC or MCP, and a key bound to a security
//! context is confined by it here too.

pub mod process;
pub mod watch;

mod command;
mod entries;

/// How an E2B command becomes a `cmd.run` call (also for a template's server at create).
pub use command::{command_args, direct_line};

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use dispatcher::protocol::RunAs;
use dispatcher::SandboxId;
use serde_json::{json, Value};
use uuid::Uuid;

use aegis_e2b::connect::{
    decode_unary, encode_unary, end_stream_frame, Code, Codec, ConnectError, ContentType,
    EndStream, Message, RpcKind,
};
use aegis_e2b::envd::filesystem::{
    ListDirRequest, ListDirResponse, MakeDirRequest, MakeDirResponse, MoveRequest, MoveResponse,
    RemoveRequest, RemoveResponse, StatRequest, StatResponse,
};
use aegis_e2b::envd::headers as h;

use super::store;
use aegis_core::caller::{Caller, Role};
use aegis_sandboxes::E2B_HOME;
use aegis_tools::state::AppState;
use aegis_tools::tools::{CallError, ToolError};
use entries::{described, entry, join, list, lstat, stat, Listed};

/// Largest request message.
pub(crate) const MAX_MESSAGE: usize = 1024 * 1024;
/// Deepest `ListDir` walk, and most entries it returns.
const MAX_DEPTH: u32 = 16;
const MAX_ENTRIES: usize = 10_000;
/// Keepalive interval when the client names none.
pub(crate) const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(50);
/// The only user commands run as.
pub const SANDBOX_USER: &str = "user";

/// The sandbox an envd call is for and who acts: the owner key, rebuilt from its row (the
/// envd call carries no API key, only the sandbox id and its access token); and the sandbox's
/// own environment (`envVars` at create), which every command it runs starts with.
/// `user` is who the call acts as (`Authorization`'s user, or `/files`'s `username`): root
/// only in a sandbox that allows it ([`root_refused`] otherwise), added by [`call`] to every
/// tool call that takes a user.
#[derive(Clone)]
pub struct Target {
    pub id: SandboxId,
    pub caller: Caller,
    pub env: BTreeMap<String, String>,
    pub user: RunAs,
}

pub(crate) fn refuse(code: Code, message: impl Into<String>) -> ConnectError {
    ConnectError::new(code, message)
}

fn db(e: sqlx::Error) -> ConnectError {
    tracing::error!(error = %e, "E2B envd: database failure");
    refuse(Code::Unavailable, "the node's database is unavailable")
}

/// Compares two secrets in time independent of where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// What E2B's edge answers (502, or `unavailable` on a Connect call) for a sandbox that does
/// not run: killed, paused or past its timeout. SDKs from 2.5x tell a sandbox that is gone from
/// one they cannot reach by this phrase in the message (`SandboxNotRunningException`, and
/// `is_running()` false); every such answer here starts with it, our detail after.
pub const SANDBOX_NOT_FOUND: &str = "The sandbox was not found";

/// Why an envd call has no sandbox to act on.
pub enum Unserved {
    /// Refused: no such sandbox or a wrong token (told apart by nothing), a bad header, the
    /// owner key revoked, the database down.
    Refused(ConnectError),
    /// The caller's own sandbox (its token is right), but it does not run now: paused (a
    /// connect resumes it; envd calls never do, a request to a port does with `autoResume`), or past its timeout.
    /// As E2B's edge answers then: `unavailable`, which its SDK reports as the sandbox's
    /// timeout, and `/health` 502.
    NotRunning(ConnectError),
}

impl Unserved {
    fn into_error(self) -> ConnectError {
        match self {
            Unserved::Refused(e) | Unserved::NotRunning(e) => e,
        }
    }
}

/// Resolves `E2b-Sandbox-Id` and checks `X-Access-Token`; an unknown sandbox and a wrong or
/// missing token get the same answer, so neither tells whether the sandbox exists.
pub async fn target(state: &AppState, headers: &HeaderMap) -> Result<Target, ConnectError> {
    resolve(state, headers).await.map_err(Unserved::into_error)
}

/// [`target`], telling a sandbox that does not run now ([`Unserved::NotRunning`]) apart.
pub async fn resolve(state: &AppState, headers: &HeaderMap) -> Result<Target, Unserved> {
    let refused = Unserved::Refused;
    let raw = headers
        .get(h::SANDBOX_ID)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            refused(refuse(
                Code::InvalidArgument,
                "missing E2b-Sandbox-Id header",
            ))
        })?;
    let token = headers
        .get(h::ACCESS_TOKEN)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let id = Uuid::parse_str(raw.trim())
        .map_err(|_| refused(refuse(Code::NotFound, format!("sandbox {raw:?} not found"))))?;
    let unauthorised = || {
        refused(refuse(
            Code::Unauthenticated,
            format!("sandbox {id}: missing or wrong X-Access-Token (the envdAccessToken of its create answer)"),
        ))
    };
    let row = store::envd_target(&state.pool, id)
        .await
        .map_err(|e| refused(db(e)))?
        .ok_or_else(unauthorised)?;
    let expected = row.envd_access_token.as_deref().unwrap_or("");
    if expected.is_empty() || !same_secret(expected, token) {
        return Err(unauthorised());
    }
    if !row.serving {
        return Err(Unserved::NotRunning(refuse(
            Code::Unavailable,
            if row.paused {
                format!(
                    "{SANDBOX_NOT_FOUND}: sandbox {id} is paused; connect() resumes it (envd calls do not wake it; with autoResume, a request to one of its ports does)"
                )
            } else {
                format!("{SANDBOX_NOT_FOUND}: sandbox {id} is not running; it was killed or reached its timeout")
            },
        )));
    }
    let user = check_user(headers).map_err(refused)?;
    if user == RunAs::Root && !row.root_allowed {
        return Err(refused(root_refused(
            &row.isolation,
            row.key_context.is_some(),
        )));
    }
    let caller = owner(state, &row).await.map_err(refused)?;
    // The dispatcher's sandbox now serving the id (a new one after each resume).
    Ok(Target {
        id: SandboxId(row.sandbox_id),
        caller,
        env: row.env_vars.0,
        user,
    })
}

/// The user `Authorization` names (none: the sandbox user); any but `user` and `root` refused.
pub fn check_user(headers: &HeaderMap) -> Result<RunAs, ConnectError> {
    let Some(value) = headers.get(h::AUTHORIZATION) else {
        return Ok(RunAs::User);
    };
    let user = value
        .to_str()
        .map_err(|_| refuse(Code::InvalidArgument, "Authorization is not ASCII"))
        .and_then(|v| h::basic_user(v).map_err(|e| refuse(Code::InvalidArgument, e.to_string())))?;
    named_user(&user)
}

/// The user a name stands for: `user` (or none) the sandbox user, `root` root (which the
/// sandbox must allow: [`root_refused`]); any other name refused.
pub fn named_user(user: &str) -> Result<RunAs, ConnectError> {
    match user {
        "" | SANDBOX_USER => Ok(RunAs::User),
        "root" => Ok(RunAs::Root),
        _ => Err(refuse(
            Code::PermissionDenied,
            format!(
                "user {user:?} is not available: this node runs a sandbox's commands as the \
                 unprivileged user `{SANDBOX_USER}`, or as `root` in a gVisor-class sandbox"
            ),
        )),
    }
}

/// Why root is refused in a sandbox of class `isolation` (`bound`: its owner key is bound to a
/// security context), and how to get it.
pub fn root_refused(isolation: &str, bound: bool) -> ConnectError {
    let why = if isolation == "gvisor" && bound {
        "its owner key is bound to a security context, whose sandboxes never run as root (root's \
         capabilities would void the context's confinement inside the sandbox)"
            .to_owned()
    } else {
        format!(
            "it runs in the {isolation} isolation class (runc on the host's kernel, where uid 0 \
             would be the host kernel's root), so everything in it runs as the unprivileged user \
             `{SANDBOX_USER}` (no root, no sudo). Root is offered only in gVisor-class sandboxes, \
             whose kernel is gVisor's own: the node's operator runs a template in gVisor with \
             sandbox.runtime_isolation (`base: gvisor`) or sandbox.isolation: gvisor"
        )
    };
    refuse(
        Code::PermissionDenied,
        format!("user \"root\" is not available in this sandbox: {why}"),
    )
}

/// Whether sandbox `id` (the dispatcher's) may act as root, and its class, from its row.
pub async fn root_of(state: &AppState, id: SandboxId) -> Result<(bool, String), ConnectError> {
    store::root_of(&state.pool, id.0)
        .await
        .map_err(db)?
        .ok_or_else(|| refuse(Code::NotFound, format!("sandbox {id} not found")))
}

/// The owner key as a caller, with its security context when bound (as `auth::authenticate`
/// makes it from the key itself).
pub(crate) async fn owner(
    state: &AppState,
    row: &store::EnvdTarget,
) -> Result<Caller, ConnectError> {
    if row.key_revoked || row.key_expired {
        return Err(refuse(
            Code::Unauthenticated,
            "the API key that created this sandbox was revoked or has expired",
        ));
    }
    key_caller(
        state,
        row.key_id,
        &row.key_name,
        &row.key_role,
        row.key_context.as_deref(),
    )
    .await
    .map_err(|(code, message)| refuse(code, message))
}

/// An API key as a caller, with its security context when bound (as `auth::authenticate`
/// makes it from the key itself): the owner of an E2B sandbox, the maker of a preview URL.
pub(crate) async fn key_caller(
    state: &AppState,
    key_id: uuid::Uuid,
    key_name: &str,
    key_role: &str,
    key_context: Option<&str>,
) -> Result<Caller, (Code, String)> {
    let role: Role = key_role.parse().map_err(|_| {
        (
            Code::Unauthenticated,
            "the owner key has an unknown role".to_owned(),
        )
    })?;
    let mut caller = Caller::operator(key_id, key_name, role);
    if let Some(name) = key_context {
        let context = aegis_store::contexts::get(&state.pool, &caller.tenant, name)
            .await
            .map_err(|e| {
                (
                    Code::Unavailable,
                    format!("the owner key's security context `{name}` is unusable: {e}"),
                )
            })?;
        caller.tier = caller.tier.min(context.tier);
        caller.seal = Some(aegis_core::caller::SealScope {
            context: std::sync::Arc::new(context),
            limiter: state.api_keys.limiter(),
            session_key: format!("key:{key_id}"),
            ceilings: Vec::new(),
        });
    }
    Ok(caller)
}

/// A tool's refusal or failure as a Connect error the SDK understands.
pub(crate) fn tool_error(e: ToolError) -> ConnectError {
    let code = match e.code {
        "not_found" => Code::NotFound,
        "conflict" => Code::AlreadyExists,
        "path_not_allowed" | "permission_denied" | "command_not_allowed" | "env_not_allowed" => {
            Code::PermissionDenied
        }
        "invalid_arguments" | "invalid_target" | "command_not_found" => Code::InvalidArgument,
        "too_large" | "no_space" | "limit_reached" => Code::ResourceExhausted,
        "timeout" => Code::DeadlineExceeded,
        "sandbox_gone" => Code::Unavailable,
        _ => Code::Internal,
    };
    refuse(code, format!("{} ({})", e.message, e.code))
}

fn call_error(e: CallError) -> ConnectError {
    match e {
        CallError::Denied { denial, .. } => refuse(
            Code::PermissionDenied,
            format!("refused by policy ({}): {}", denial.code, denial.message),
        ),
        CallError::InvalidArguments { .. } => refuse(Code::InvalidArgument, e.to_string()),
        CallError::Audit(_) => refuse(Code::Unavailable, "the audit log is unavailable"),
        other => refuse(Code::Internal, other.to_string()),
    }
}

/// The tools that take a `user` (who performs them).
const TOOLS_WITH_USER: [&str; 6] = [
    "cmd.run",
    "fs.read",
    "fs.write",
    "fs.list",
    "fs.create_dir",
    "fs.delete",
];

/// `args` of `tool` acting as the target's user (root added where the tool takes a user).
fn as_user(target: &Target, tool: &str, mut args: Value) -> Value {
    if target.user == RunAs::Root && TOOLS_WITH_USER.contains(&tool) {
        args["user"] = json!("root");
    }
    args
}

/// One tool call on the target sandbox through the router, as the target's user.
pub async fn call(
    state: &AppState,
    target: &Target,
    tool: &str,
    args: Value,
) -> Result<Value, ConnectError> {
    try_call(state, target, tool, args)
        .await?
        .map_err(tool_error)
}

/// [`call`], with the tool's own failure (it was decided and ran, and failed) given back as
/// the tool said it, for a caller that answers some failures itself; refusals are errors.
async fn try_call(
    state: &AppState,
    target: &Target,
    tool: &str,
    args: Value,
) -> Result<Result<Value, ToolError>, ConnectError> {
    let args = as_user(target, tool, args);
    let outcome = aegis_tools::tools::invoke_in(state, &target.caller, tool, args, Some(target.id))
        .await
        .map_err(call_error)?;
    Ok(outcome.result)
}

/// A background `cmd.run` ([`try_call`]'s form): the router hands back the process it started
/// (`tools::invoke_started`: its pid and the node's kept reader of its output), so the door
/// follows that process without looking it up again. The tool's own failure comes back as the
/// tool said it; refusals are errors.
pub(crate) async fn try_start(
    state: &AppState,
    target: &Target,
    args: Value,
) -> Result<Result<aegis_tools::tools::Started, ToolError>, ConnectError> {
    let args = as_user(target, "cmd.run", args);
    let (outcome, started) =
        aegis_tools::tools::invoke_started(state, &target.caller, args, Some(target.id))
            .await
            .map_err(call_error)?;
    match outcome.result {
        Err(e) => Ok(Err(e)),
        Ok(_) => started
            .map(Ok)
            .ok_or_else(|| refuse(Code::Internal, "cmd.run started no process")),
    }
}

/// [`call`] for a whole file whose bytes travel beside the call (`files.rs`): one `fs.write`
/// or `fs.read` through the router, decided and audited once.
pub async fn call_transfer(
    state: &AppState,
    target: &Target,
    tool: &str,
    args: Value,
    transfer: aegis_tools::tools::Transfer,
) -> Result<Value, ConnectError> {
    let args = as_user(target, tool, args);
    let outcome = aegis_tools::tools::invoke_transfer(
        state,
        &target.caller,
        tool,
        args,
        Some(target.id),
        transfer,
    )
    .await
    .map_err(call_error)?;
    outcome.result.map_err(tool_error)
}

/// An E2B path made absolute: relative paths are under the user's home.
pub fn absolute(path: &str) -> Result<String, ConnectError> {
    if path.is_empty() {
        return Err(refuse(Code::InvalidArgument, "path is empty"));
    }
    let joined = if path.starts_with('/') {
        path.to_owned()
    } else if path == "~" {
        E2B_HOME.to_owned()
    } else {
        let rest = path.strip_prefix("~/").unwrap_or(path);
        format!("{E2B_HOME}/{rest}")
    };
    aegis_policy::paths::normalise(&joined).map_err(|m| refuse(Code::InvalidArgument, m))
}

fn unary_response<M: Message>(codec: Codec, message: &M) -> Response {
    match encode_unary(codec, message) {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(match codec {
                    Codec::Json => "application/json",
                    Codec::Proto => "application/proto",
                }),
            )],
            body,
        )
            .into_response(),
        Err(e) => error_response(&refuse(Code::Internal, e.to_string())),
    }
}

/// A unary call's error: its JSON with the code's HTTP status.
pub fn error_response(e: &ConnectError) -> Response {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(ConnectError::CONTENT_TYPE),
        )],
        e.to_json(),
    )
        .into_response()
}

pub(crate) fn content_type(headers: &HeaderMap, kind: RpcKind) -> Result<Codec, ConnectError> {
    let value = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    ContentType::negotiate(value, kind)
        .map(|c| c.codec)
        .map_err(|e| e.to_connect_error())
}

pub(crate) async fn unary<Req: Message, Resp: Message, F, Fut>(
    state: AppState,
    headers: HeaderMap,
    body: Bytes,
    run: F,
) -> Response
where
    F: FnOnce(AppState, Target, Req) -> Fut,
    Fut: std::future::Future<Output = Result<Resp, ConnectError>>,
{
    let codec = match content_type(&headers, RpcKind::Unary) {
        Ok(c) => c,
        Err(e) => return error_response(&e),
    };
    let request: Req = match decode_unary(codec, &body, MAX_MESSAGE) {
        Ok(r) => r,
        Err(e) => return error_response(&e.to_connect_error()),
    };
    let target = match target(&state, &headers).await {
        Ok(t) => t,
        Err(e) => return error_response(&e),
    };
    match run(state, target, request).await {
        Ok(answer) => unary_response(codec, &answer),
        Err(e) => error_response(&e),
    }
}

/// `POST /filesystem.Filesystem/{method}`.
pub async fn filesystem(
    State(state): State<AppState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match method.as_str() {
        "Stat" => {
            unary(
                state,
                headers,
                body,
                |state, t, r: StatRequest| async move {
                    let path = absolute(&r.path)?;
                    Ok(StatResponse {
                        entry: Some(stat(&state, &t, &path).await?),
                    })
                },
            )
            .await
        }
        "MakeDir" => {
            unary(
                state,
                headers,
                body,
                |state, t, r: MakeDirRequest| async move {
                    let path = absolute(&r.path)?;
                    let out = call(&state, &t, "fs.create_dir", json!({"path": path})).await?;
                    if out["created"] == false {
                        return Err(refuse(
                            Code::AlreadyExists,
                            format!("directory {path:?} already exists"),
                        ));
                    }
                    Ok(MakeDirResponse {
                        entry: Some(entry(&path, &Listed::assumed("directory", 0))),
                    })
                },
            )
            .await
        }
        "Remove" => {
            unary(
                state,
                headers,
                body,
                |state, t, r: RemoveRequest| async move {
                    let path = absolute(&r.path)?;
                    let removed = call(
                        &state,
                        &t,
                        "fs.delete",
                        json!({"path": path, "recursive": true}),
                    )
                    .await;
                    match removed {
                        // As envd's: removing what is not there is done, not an error.
                        Ok(_) => Ok(RemoveResponse {}),
                        Err(e) if e.code == Code::NotFound => Ok(RemoveResponse {}),
                        Err(e) => Err(e),
                    }
                },
            )
            .await
        }
        "Move" => {
            unary(
                state,
                headers,
                body,
                |state, t, r: MoveRequest| async move {
                    let from = absolute(&r.source)?;
                    let to = absolute(&r.destination)?;
                    move_entry(&state, &t, &from, &to).await
                },
            )
            .await
        }
        "ListDir" => {
            unary(
                state,
                headers,
                body,
                |state, t, r: ListDirRequest| async move {
                    let path = absolute(&r.path)?;
                    list_dir(&state, &t, &path, r.depth).await
                },
            )
            .await
        }
        "WatchDir" | "CreateWatcher" | "GetWatcherEvents" | "RemoveWatcher" => {
            watch::serve(state, &method, headers, body).await
        }
        other => error_response(&refuse(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{other} is not a method of envd's filesystem service"),
        )),
    }
}

/// Moves a file or a directory tree, composed of tool calls so that both paths pass the
/// policy: a file is read, written at the destination and deleted; a directory's whole tree is
/// looked at first (only directories and files no larger than one call moves, at most
/// [`MAX_ENTRIES`]), then its directories are made and its files copied, and the source is
/// removed only once all of it is in place, so a failure leaves the source whole (and perhaps
/// part of the copy). Unlike envd's rename it is not atomic.
async fn move_entry(
    state: &AppState,
    t: &Target,
    from: &str,
    to: &str,
) -> Result<MoveResponse, ConnectError> {
    let source = lstat(state, t, from).await?;
    match source.kind.as_str() {
        "file" => {
            copy_file(state, t, from, to, &source.metadata).await?;
            call(state, t, "fs.delete", json!({"path": from})).await?;
            let mut moved = Listed::assumed("file", source.size);
            moved.metadata = source.metadata;
            Ok(MoveResponse {
                entry: Some(entry(to, &moved)),
            })
        }
        "directory" => {
            move_tree(state, t, from, to).await?;
            Ok(MoveResponse {
                entry: Some(entry(to, &Listed::assumed("directory", 0))),
            })
        }
        _ => Err(refuse(
            Code::Unimplemented,
            format!("{from:?} is neither a regular file nor a directory; only those can be moved on this node"),
        )),
    }
}

/// Copies one file with its user metadata: read whole, then written at the destination.
async fn copy_file(
    state: &AppState,
    t: &Target,
    from: &str,
    to: &str,
    metadata: &BTreeMap<String, String>,
) -> Result<(), ConnectError> {
    let mut read = call(state, t, "fs.read", json!({"path": from})).await?;
    if read["truncated"] == true {
        return Err(refuse(
            Code::ResourceExhausted,
            format!("{from:?} is larger than the node's file size limit; it cannot be moved"),
        ));
    }
    let encoding = read["encoding"].as_str().unwrap_or("utf8").to_owned();
    let content = read["content"].take();
    let mut args = json!({"path": to, "content": content, "encoding": encoding});
    if !metadata.is_empty() {
        args["metadata"] = json!(metadata);
    }
    call(state, t, "fs.write", args).await?;
    Ok(())
}

/// Moves the directory `from` to `to`, which must not exist yet (see [`move_entry`]).
async fn move_tree(state: &AppState, t: &Target, from: &str, to: &str) -> Result<(), ConnectError> {
    if to == from || to.starts_with(&format!("{from}/")) {
        return Err(refuse(
            Code::InvalidArgument,
            format!("cannot move {from:?} into itself ({to:?})"),
        ));
    }
    match lstat(state, t, to).await {
        Ok(_) => {
            return Err(refuse(
                Code::AlreadyExists,
                format!("{to:?} already exists"),
            ))
        }
        Err(e) if e.code == Code::NotFound => {}
        Err(e) => return Err(e),
    }
    let max_file = state.config.sandbox.max_file_bytes;
    // The tree, relative to `from` ("" is `from` itself): directories in walk order, files.
    let mut dirs = vec![String::new()];
    let mut files = Vec::new();
    let mut next = 0;
    while let Some(rel) = dirs.get(next).cloned() {
        next += 1;
        let dir = if rel.is_empty() {
            from.to_owned()
        } else {
            join(from, &rel)
        };
        for listed in list(state, t, &dir).await? {
            let child = if rel.is_empty() {
                listed.name.clone()
            } else {
                join(&rel, &listed.name)
            };
            match listed.kind.as_str() {
                "directory" => dirs.push(child),
                "file" if listed.size <= max_file => files.push((child, listed.metadata)),
                "file" => {
                    return Err(refuse(
                        Code::ResourceExhausted,
                        format!("{:?} is larger than the node's file size limit; {from:?} cannot be moved", join(from, &child)),
                    ))
                }
                _ => {
                    return Err(refuse(
                        Code::Unimplemented,
                        format!("{:?} is neither a regular file nor a directory; {from:?} cannot be moved on this node", join(from, &child)),
                    ))
                }
            }
            if dirs.len() + files.len() > MAX_ENTRIES {
                return Err(refuse(
                    Code::ResourceExhausted,
                    format!("{from:?} holds more than {MAX_ENTRIES} entries; it cannot be moved on this node"),
                ));
            }
        }
    }
    for rel in &dirs {
        let dir = if rel.is_empty() {
            to.to_owned()
        } else {
            join(to, rel)
        };
        call(state, t, "fs.create_dir", json!({"path": dir})).await?;
    }
    for (rel, metadata) in &files {
        copy_file(state, t, &join(from, rel), &join(to, rel), metadata).await?;
    }
    call(
        state,
        t,
        "fs.delete",
        json!({"path": from, "recursive": true}),
    )
    .await?;
    Ok(())
}

async fn list_dir(
    state: &AppState,
    t: &Target,
    path: &str,
    depth: u32,
) -> Result<ListDirResponse, ConnectError> {
    let depth = depth.max(1);
    if depth > MAX_DEPTH {
        return Err(refuse(
            Code::InvalidArgument,
            format!("depth {depth} is deeper than {MAX_DEPTH}"),
        ));
    }
    let mut entries = Vec::new();
    let mut level = vec![path.to_owned()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in level {
            for listed in list(state, t, &dir).await? {
                let full = join(&dir, &listed.name);
                if listed.kind == "directory" {
                    next.push(full.clone());
                }
                entries.push(described(state, t, &full, &listed).await);
                if entries.len() > MAX_ENTRIES {
                    return Err(refuse(
                        Code::ResourceExhausted,
                        format!("more than {MAX_ENTRIES} entries under {path:?}; list less deep"),
                    ));
                }
            }
        }
        level = next;
    }
    // In the order envd walks: depth first, each directory's entries by name (comparing the
    // paths component by component puts a directory's entries right after it).
    entries.sort_by(|a, b| a.path.split('/').cmp(b.path.split('/')));
    Ok(ListDirResponse { entries })
}

/// `POST /process.Process/{method}` ([`process`]).
pub async fn process(
    State(state): State<AppState>,
    Path(method): Path<String>,
    version: axum::http::Version,
    connection: Option<axum::Extension<axum::extract::ConnectInfo<aegis_http::Connection>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    // Over HTTP/1.x a cut stream must reset its connection (see `process::ABORT`); over
    // HTTP/2 the failing body resets its own stream.
    let cut = connection
        .filter(|_| version < axum::http::Version::HTTP_2)
        .map(|axum::Extension(axum::extract::ConnectInfo(c))| c);
    process::serve(state, &method, headers, body, cut).await
}

/// Errors of a streaming call before its stream opened are still answered as a stream: HTTP
/// 200 with one end-stream envelope holding the error (what Connect clients expect).
pub(crate) fn stream_error(codec: Codec, e: &ConnectError) -> Response {
    stream_response(
        codec,
        Body::from(end_stream_frame(&EndStream::failed(e.clone()))),
    )
}

pub(crate) fn stream_response(codec: Codec, body: Body) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(match codec {
                Codec::Json => "application/connect+json",
                Codec::Proto => "application/connect+proto",
            }),
        )],
        body,
    )
        .into_response()
}

/// `GET /health`: envd answers 204 while its sandbox runs, and E2B's edge 502 once it is gone
/// (how the SDK's `is_running` and its reading of a dropped stream tell a dead sandbox). So:
/// 204 for a running sandbox named with its access token (or for the node itself, when no
/// sandbox is named), 502 for one that is gone, past its timeout, unknown, or named without
/// its token (the same answer, so the probe tells nothing about another key's sandbox).
pub async fn health(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if !headers.contains_key(h::SANDBOX_ID) {
        return StatusCode::NO_CONTENT.into_response();
    }
    match resolve(&state, &headers).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(Unserved::NotRunning(e)) => {
            super::api_error(aegis_e2b::api::ApiError::new(502, e.message))
        }
        Err(Unserved::Refused(e)) if e.code == Code::Unavailable => error_response(&e),
        Err(Unserved::Refused(_)) => super::api_error(aegis_e2b::api::ApiError::new(
            502,
            format!("{SANDBOX_NOT_FOUND}: no running sandbox with this id and access token (killed, past its timeout, or unknown)"),
        )),
    }
}

/// `GET /envs`: the environment commands start with (the sandbox's `envVars` and where it
/// runs; nothing of the node's is in it).
pub async fn envs(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let target = match target(&state, &headers).await {
        Ok(t) => t,
        Err(e) => return error_response(&e),
    };
    let mut env = json!(target.env);
    env["HOME"] = json!(E2B_HOME);
    env["USER"] = json!(SANDBOX_USER);
    env["PWD"] = json!(E2B_HOME);
    super::json_response(StatusCode::OK, env.to_string().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::command::{command_args, sh_quote};
    use super::entries::resolve_link;
    use super::*;
    use aegis_e2b::envd::process::ProcessConfig;

    fn config(cmd: &str, args: &[&str]) -> ProcessConfig {
        ProcessConfig {
            cmd: cmd.into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            envs: Default::default(),
            cwd: None,
        }
    }

    #[test]
    fn command_lines_become_cmd_run_arguments() {
        let none = BTreeMap::new();
        let args = |c: &ProcessConfig, unwrap: bool| command_args(c, &none, unwrap);
        let sdk = |line: &str| config("/bin/bash", &["-l", "-c", line]);
        // An unbound key's sandbox: every line under bash -c (the login flag dropped).
        assert_eq!(
            args(&sdk("echo a | wc"), false).unwrap(),
            json!({"command": "bash", "args": ["-c", "echo a | wc"]})
        );
        assert_eq!(
            args(&sdk("echo hi"), false).unwrap(),
            json!({"command": "bash", "args": ["-c", "echo hi"]})
        );
        // A confined key: a plain line is its own program, shell syntax stays under bash.
        assert_eq!(
            args(&sdk("echo hi"), true).unwrap(),
            json!({"command": "echo hi", "args": []})
        );
        for line in ["echo $HOME", "a && b", "cat x > y", "echo 'q'", "ls *"] {
            assert_eq!(args(&sdk(line), true).unwrap()["command"], "bash", "{line}");
        }
        let mut with_cwd = config("python3", &["x.py"]);
        with_cwd.cwd = Some("work".into());
        with_cwd.envs.insert("A".into(), "1".into());
        assert_eq!(
            args(&with_cwd, true).unwrap(),
            json!({"command": "python3", "args": ["x.py"], "cwd": "/home/user/work",
                   "env_additions": {"A": "1"}})
        );
        assert!(args(&config("", &[]), false).is_err());
        // A terminal's shell, never unwrapped.
        assert_eq!(
            args(&config("/bin/bash", &["-i", "-l"]), false).unwrap(),
            json!({"command": "bash", "args": ["-c", "exec bash -i"]})
        );
        assert_eq!(
            args(&config("/bin/bash", &["-i", "-l"]), true).unwrap(),
            json!({"command": "bash", "args": ["-c", "exec bash -i"]})
        );
        let mut terminal = config("/bin/bash", &["-i", "-l"]);
        terminal.envs.insert("TERM".into(), "xterm-256color".into());
        terminal.envs.insert("LC_ALL".into(), "$(id)".into());
        terminal.cwd = Some("/".into());
        assert_eq!(
            args(&terminal, false).unwrap(),
            json!({"command": "bash", "args": ["-c",
                "export LC_ALL='$(id)'\nexport TERM='xterm-256color'\ncd -- '/' || exit 1\nexec bash -i"]})
        );
    }

    #[test]
    fn a_line_sets_its_own_environment_and_directory() {
        let mut sandbox = BTreeMap::new();
        sandbox.insert("FOO".to_owned(), "from the sandbox".to_owned());
        sandbox.insert("ONLY".to_owned(), "sandbox".to_owned());
        let mut run = config("/bin/bash", &["-l", "-c", "echo $FOO"]);
        run.envs.insert("FOO".into(), "it's mine".into());
        run.cwd = Some("sub dir".into());
        // The command's variables win over the sandbox's; values are quoted, never run.
        assert_eq!(
            command_args(&run, &sandbox, false).unwrap(),
            json!({"command": "bash", "args": ["-c",
                "export FOO='it'\\''s mine'\nexport ONLY='sandbox'\ncd -- '/home/user/sub dir' || exit 1\necho $FOO"]})
        );
        // A confined key's plain line: the policy decides its variables and directory.
        let mut plain = config("/bin/bash", &["-l", "-c", "echo hi"]);
        plain.envs.insert("A".into(), "1".into());
        assert_eq!(
            command_args(&plain, &sandbox, true).unwrap(),
            json!({"command": "echo hi", "args": [],
                   "env_additions": {"A": "1", "FOO": "from the sandbox", "ONLY": "sandbox"}})
        );
        // Names no one may set, and names that are not names, are refused either way.
        for unwrap in [false, true] {
            let mut bad = config("/bin/bash", &["-l", "-c", "true"]);
            bad.envs.insert("LD_PRELOAD".into(), "/tmp/x.so".into());
            assert_eq!(
                command_args(&bad, &BTreeMap::new(), unwrap)
                    .unwrap_err()
                    .code,
                Code::PermissionDenied
            );
            let mut odd = config("/bin/bash", &["-l", "-c", "true"]);
            odd.envs.insert("A;rm -rf".into(), "1".into());
            assert_eq!(
                command_args(&odd, &BTreeMap::new(), unwrap)
                    .unwrap_err()
                    .code,
                Code::InvalidArgument
            );
        }
        assert_eq!(sh_quote("a'b"), "'a'\\''b'");
    }

    #[test]
    fn symlinks_resolve_lexically_and_entries_report_their_stat() {
        assert_eq!(resolve_link("/home/user/d", "f.txt"), "/home/user/d/f.txt");
        assert_eq!(resolve_link("/home/user/d", "../e/./g"), "/home/user/e/g");
        assert_eq!(resolve_link("/home/user/d", "/etc/passwd"), "/etc/passwd");
        assert_eq!(resolve_link("/", "../../x"), "/x");
        let listed = Listed::of(&json!({"name": "d", "type": "directory", "size_bytes": 0,
            "mode": 0o700, "modified_ns": 1_500_000_000_250_000_000i64, "inode_size": 60}));
        let info = entry("/home/user/d", &listed);
        assert_eq!((info.size, info.mode), (60, 0o700));
        assert_eq!(info.permissions, "drwx------");
        let at = info.modified_time.unwrap();
        assert_eq!((at.seconds, at.nanos), (1_500_000_000, 250_000_000));
        let file = Listed::of(&json!({"name": "f", "type": "file", "size_bytes": 3,
            "inode_size": 3, "metadata": {"author": "mish"}}));
        let info = entry("/home/user/f", &file);
        assert_eq!(
            (info.size, info.mode, info.permissions.as_str()),
            (3, 0o644, "-rw-r--r--")
        );
        assert_eq!(
            info.metadata.get("author").map(String::as_str),
            Some("mish")
        );
        assert!(info.modified_time.is_none());
    }

    #[test]
    fn the_sandbox_user_and_root_are_named_and_root_is_refused_with_how() {
        assert_eq!(named_user("").unwrap(), RunAs::User);
        assert_eq!(named_user("user").unwrap(), RunAs::User);
        assert_eq!(named_user("root").unwrap(), RunAs::Root);
        let e = named_user("admin").unwrap_err();
        assert_eq!(e.code, Code::PermissionDenied);
        let e = root_refused("container", false);
        assert_eq!(e.code, Code::PermissionDenied);
        for needed in [
            "container isolation class",
            "no root",
            "gVisor",
            "runtime_isolation",
        ] {
            assert!(e.message.contains(needed), "`{needed}` in {}", e.message);
        }
        let e = root_refused("gvisor", true);
        assert!(e.message.contains("security context"), "{}", e.message);
        assert!(absolute("/etc/../x").is_err());
        assert_eq!(absolute("~/a").unwrap(), "/home/user/a");
        assert_eq!(absolute("a/b").unwrap(), "/home/user/a/b");
        assert!(same_secret("abc", "abc") && !same_secret("abc", "abd") && !same_secret("a", "ab"));
    }
}
