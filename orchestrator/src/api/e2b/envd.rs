//! envd, served by the node for the sandbox named in `E2b-Sandbox-Id`:
//! `filesystem.Filesystem/{Stat, MakeDir, Move, ListDir, Remove}` here, its watches in
//! [`super::watch`] and `process.Process/*` in [`super::process`], over the Connect protocol
//! (JSON or binary protobuf), `/health` and `/envs`; and what they share (the target sandbox
//! and its owner, router calls, Connect answers).
//!
//! Every decision is one or more tool calls through the router (`tools::invoke_in`) as the
//! sandbox's owner key, on the sandbox's policy: `Start` is `cmd.run`, `Stat` and `ListDir` are
//! `fs.list`, `MakeDir` is `fs.create_dir`, `Remove` is `fs.delete`, and `Move` is `fs.read`,
//! `fs.write` and `fs.delete` of one file. So an E2B call is decided, audited and held by the
//! kernel exactly like the same call on REST, gRPC or MCP, and a key bound to a security
//! context is confined by it here too.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use dispatcher::SandboxId;
use serde_json::{json, Value};
use uuid::Uuid;

use aegis_e2b::connect::{
    decode_unary, encode_unary, end_stream_frame, Code, Codec, ConnectError, ContentType,
    EndStream, Message, RpcKind,
};
use aegis_e2b::envd::filesystem::{
    EntryInfo, FileType, ListDirRequest, ListDirResponse, MakeDirRequest, MakeDirResponse,
    MoveRequest, MoveResponse, RemoveRequest, RemoveResponse, StatRequest, StatResponse,
};
use aegis_e2b::envd::headers as h;

use super::store;
use crate::caller::{Caller, Role};
use crate::sandboxes::E2B_HOME;
use crate::state::AppState;
use crate::tools::{CallError, ToolError};

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
/// envd call carries no API key, only the sandbox id and its access token).
#[derive(Clone)]
pub struct Target {
    pub id: SandboxId,
    pub caller: Caller,
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

/// Resolves `E2b-Sandbox-Id` and checks `X-Access-Token`; an unknown sandbox and a wrong or
/// missing token get the same answer, so neither tells whether the sandbox exists.
pub async fn target(state: &AppState, headers: &HeaderMap) -> Result<Target, ConnectError> {
    let raw = headers
        .get(h::SANDBOX_ID)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| refuse(Code::InvalidArgument, "missing E2b-Sandbox-Id header"))?;
    let token = headers
        .get(h::ACCESS_TOKEN)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let id = Uuid::parse_str(raw.trim())
        .map_err(|_| refuse(Code::NotFound, format!("sandbox {raw:?} not found")))?;
    let unauthorised = || {
        refuse(
            Code::Unauthenticated,
            format!("sandbox {id}: missing or wrong X-Access-Token (the envdAccessToken of its create answer)"),
        )
    };
    let row = store::envd_target(&state.pool, id)
        .await
        .map_err(db)?
        .ok_or_else(unauthorised)?;
    let expected = row.envd_access_token.as_deref().unwrap_or("");
    if expected.is_empty() || !same_secret(expected, token) {
        return Err(unauthorised());
    }
    check_user(headers)?;
    let caller = owner(state, &row).await?;
    // The dispatcher's sandbox now serving the id (a new one after each resume).
    Ok(Target {
        id: SandboxId(row.sandbox_id),
        caller,
    })
}

/// Refuses any user but the sandbox user: every command runs as uid 65534, and root is never
/// available (no sudo either: the image has no set-uid programs and the container drops every
/// capability).
pub fn check_user(headers: &HeaderMap) -> Result<(), ConnectError> {
    let Some(value) = headers.get(h::AUTHORIZATION) else {
        return Ok(());
    };
    let user = value
        .to_str()
        .map_err(|_| refuse(Code::InvalidArgument, "Authorization is not ASCII"))
        .and_then(|v| h::basic_user(v).map_err(|e| refuse(Code::InvalidArgument, e.to_string())))?;
    named_user(&user)
}

/// Refuses a named user other than the sandbox user.
pub fn named_user(user: &str) -> Result<(), ConnectError> {
    if user.is_empty() || user == SANDBOX_USER {
        Ok(())
    } else {
        Err(refuse(
            Code::PermissionDenied,
            format!(
                "user {user:?} is not available: this node runs everything in a sandbox as the \
                 unprivileged user `{SANDBOX_USER}` (no root, no sudo)"
            ),
        ))
    }
}

/// The owner key as a caller, with its security context when bound (as `auth::authenticate`
/// makes it from the key itself).
async fn owner(state: &AppState, row: &store::EnvdTarget) -> Result<Caller, ConnectError> {
    if row.key_revoked || row.key_expired {
        return Err(refuse(
            Code::Unauthenticated,
            "the API key that created this sandbox was revoked or has expired",
        ));
    }
    let role: Role = row
        .key_role
        .parse()
        .map_err(|_| refuse(Code::Unauthenticated, "the owner key has an unknown role"))?;
    let mut caller = Caller::operator(row.key_id, &row.key_name, role);
    if let Some(name) = &row.key_context {
        let context = crate::contexts::get(&state.pool, &caller.tenant, name)
            .await
            .map_err(|e| {
                refuse(
                    Code::Unavailable,
                    format!("the owner key's security context `{name}` is unusable: {e}"),
                )
            })?;
        caller.tier = caller.tier.min(context.tier);
        caller.seal = Some(crate::caller::SealScope {
            context: std::sync::Arc::new(context),
            limiter: state.api_keys.limiter(),
            session_key: format!("key:{}", row.key_id),
            ceilings: Vec::new(),
        });
    }
    Ok(caller)
}

/// A tool's refusal or failure as a Connect error the SDK understands.
fn tool_error(e: ToolError) -> ConnectError {
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

/// One tool call on the target sandbox through the router.
pub async fn call(
    state: &AppState,
    target: &Target,
    tool: &str,
    args: Value,
) -> Result<Value, ConnectError> {
    let outcome = crate::tools::invoke_in(state, &target.caller, tool, args, Some(target.id))
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
    crate::policy::paths::normalise(&joined).map_err(|m| refuse(Code::InvalidArgument, m))
}

fn split(path: &str) -> (&str, &str) {
    match path.rsplit_once('/') {
        Some(("", name)) => ("/", name),
        Some((parent, name)) => (parent, name),
        None => ("/", path),
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn entry(path: &str, kind: &str, size: u64) -> EntryInfo {
    let (_, name) = split(path);
    let (file_type, mode) = match kind {
        "file" => (FileType::File, 0o644),
        "directory" => (FileType::Directory, 0o755 | 0o040_000),
        "symlink" => (FileType::Symlink, 0o777),
        _ => (FileType::Unspecified, 0),
    };
    let mode = if file_type == FileType::File {
        mode | 0o100_000
    } else {
        mode
    };
    EntryInfo {
        name: name.to_owned(),
        r#type: file_type as i32,
        path: path.to_owned(),
        size: i64::try_from(size).unwrap_or(i64::MAX),
        mode: mode & 0o777,
        permissions: permissions(file_type, mode & 0o777),
        owner: SANDBOX_USER.to_owned(),
        group: SANDBOX_USER.to_owned(),
        modified_time: None,
        symlink_target: None,
        metadata: Default::default(),
    }
}

fn permissions(kind: FileType, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileType::Directory => 'd',
        FileType::Symlink => 'l',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// The entries of one directory (`fs.list`) as (name, type, size).
async fn list(
    state: &AppState,
    target: &Target,
    dir: &str,
) -> Result<Vec<(String, String, u64)>, ConnectError> {
    let out = call(state, target, "fs.list", json!({"path": dir})).await?;
    Ok(out["entries"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .map(|e| {
                    (
                        e["name"].as_str().unwrap_or_default().to_owned(),
                        e["type"].as_str().unwrap_or_default().to_owned(),
                        e["size_bytes"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

/// Stat by listing the parent; a path that is itself a root of the sandbox's policy (its
/// parent is outside) is a directory if it can be listed.
pub async fn stat(
    state: &AppState,
    target: &Target,
    path: &str,
) -> Result<EntryInfo, ConnectError> {
    let (parent, name) = split(path);
    if name.is_empty() {
        list(state, target, path).await?;
        return Ok(entry(path, "directory", 0));
    }
    match list(state, target, parent).await {
        Ok(entries) => entries
            .into_iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, kind, size)| entry(path, &kind, size))
            .ok_or_else(|| refuse(Code::NotFound, format!("path {path:?} does not exist"))),
        Err(e) if e.code == Code::PermissionDenied => {
            list(state, target, path).await?;
            Ok(entry(path, "directory", 0))
        }
        Err(e) => Err(e),
    }
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
                        entry: Some(entry(&path, "directory", 0)),
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
                    call(
                        &state,
                        &t,
                        "fs.delete",
                        json!({"path": path, "recursive": true}),
                    )
                    .await?;
                    Ok(RemoveResponse {})
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
                    move_file(&state, &t, &from, &to).await
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
            super::watch::serve(state, &method, headers, body).await
        }
        other => error_response(&refuse(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{other} is not a method of envd's filesystem service"),
        )),
    }
}

/// Moves one file: read, write at the destination, delete the source, each a tool call (so
/// both paths pass the policy). Directories cannot be moved yet.
async fn move_file(
    state: &AppState,
    t: &Target,
    from: &str,
    to: &str,
) -> Result<MoveResponse, ConnectError> {
    let source = stat(state, t, from).await?;
    if source.r#type != FileType::File as i32 {
        return Err(refuse(
            Code::Unimplemented,
            format!("{from:?} is not a regular file; only files can be moved on this node yet"),
        ));
    }
    let mut read = call(state, t, "fs.read", json!({"path": from})).await?;
    if read["truncated"] == true {
        return Err(refuse(
            Code::ResourceExhausted,
            format!("{from:?} is larger than the node's file size limit; it cannot be moved"),
        ));
    }
    let encoding = read["encoding"].as_str().unwrap_or("utf8").to_owned();
    let content = read["content"].take();
    call(
        state,
        t,
        "fs.write",
        json!({"path": to, "content": content, "encoding": encoding}),
    )
    .await?;
    call(state, t, "fs.delete", json!({"path": from})).await?;
    Ok(MoveResponse {
        entry: Some(entry(to, "file", source.size.max(0) as u64)),
    })
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
            for (name, kind, size) in list(state, t, &dir).await? {
                let full = join(&dir, &name);
                if kind == "directory" {
                    next.push(full.clone());
                }
                entries.push(entry(&full, &kind, size));
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
    Ok(ListDirResponse { entries })
}

/// `POST /process.Process/{method}` ([`super::process`]).
pub async fn process(
    State(state): State<AppState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    super::process::serve(state, &method, headers, body).await
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

/// The `cmd.run` arguments of an E2B command. The SDK sends `/bin/bash -l -c <line>`. With
/// `unwrap` (a key confined by a security context) a line without shell syntax runs as its own
/// argv, so the policy sees the real program and a key confined to some programs may run
/// them; anything else runs under `bash -c`, which the policy allows only where `bash -c` is
/// granted (every unbound key's E2B sandbox, where each line runs so).
pub fn command_args(
    config: &aegis_e2b::envd::process::ProcessConfig,
    unwrap: bool,
) -> Result<Value, ConnectError> {
    let program = config.cmd.rsplit('/').next().unwrap_or_default().to_owned();
    if program.is_empty() {
        return Err(refuse(Code::InvalidArgument, "process.cmd is empty"));
    }
    let mut args = config.args.clone();
    let shell = matches!(program.as_str(), "bash" | "sh");
    let mut envs = config.envs.clone();
    // A terminal's interactive shell (`bash -i -l`): a line under `bash -c`, which the policy
    // grants exactly where it grants any line. The terminal variables the SDK always sends
    // are set by that line (no environment is on an E2B sandbox's allowlist; any other
    // variable still goes to the policy).
    if shell && args.iter().any(|a| a == "-i") && args.iter().all(|a| a == "-i" || a == "-l") {
        let mut line = String::new();
        for name in ["TERM", "LANG", "LC_ALL", "COLORTERM"] {
            let plain = |v: &&String| {
                !v.is_empty()
                    && v.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
            };
            if let Some(value) = envs.get(name).filter(plain) {
                line.push_str(&format!("{name}={value} "));
                envs.remove(name);
            }
        }
        args = vec!["-c".to_owned(), format!("{line}exec {program} -i")];
    }
    let line = match args.as_slice() {
        [l, c, line] if shell && l == "-l" && c == "-c" => Some(line.clone()),
        [c, line] if shell && c == "-c" => Some(line.clone()),
        _ => None,
    };
    let plain = line.as_ref().filter(|l| {
        unwrap
            && !l.trim().is_empty()
            && !l
                .chars()
                .any(|c| "|&;<>()$`\\\"'*?[]#~=%{}!\n\r\t".contains(c))
    });
    let command = match plain {
        Some(line) => {
            args.clear();
            line.clone()
        }
        None => {
            if line.is_some() {
                args.retain(|a| a != "-l");
            }
            program
        }
    };
    let mut call = json!({"command": command, "args": args});
    if let Some(cwd) = &config.cwd {
        call["cwd"] = json!(absolute(cwd)?);
    }
    if !envs.is_empty() {
        call["env_additions"] = json!(envs);
    }
    Ok(call)
}

/// `GET /health`: envd answers 204 when it runs; here the node answers for the sandbox named in
/// `E2b-Sandbox-Id` (502 when it is not running), or for itself.
pub async fn health(State(state): State<AppState>, headers: HeaderMap) -> StatusCode {
    // The SDK's `is_running` reads 502 as "not running": a paused or killed sandbox.
    let named = headers
        .get(h::SANDBOX_ID)
        .and_then(|v| v.to_str().ok())
        .map(|raw| Uuid::parse_str(raw.trim()));
    match named {
        Some(Ok(id)) => match store::envd_target(&state.pool, id).await {
            Ok(Some(_)) => StatusCode::NO_CONTENT,
            Ok(None) => StatusCode::BAD_GATEWAY,
            Err(_) => StatusCode::SERVICE_UNAVAILABLE,
        },
        Some(Err(_)) => StatusCode::BAD_GATEWAY,
        None => StatusCode::NO_CONTENT,
    }
}

/// `GET /envs`: the environment commands start with (the sandbox's; nothing secret is in it).
pub async fn envs(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(e) = target(&state, &headers).await {
        return error_response(&e);
    }
    let env = json!({"HOME": E2B_HOME, "USER": SANDBOX_USER, "PWD": E2B_HOME});
    super::json_response(StatusCode::OK, env.to_string().into_bytes())
}

#[cfg(test)]
mod tests {
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
        let sdk = |line: &str| config("/bin/bash", &["-l", "-c", line]);
        // An unbound key's sandbox: every line under bash -c (the login flag dropped).
        assert_eq!(
            command_args(&sdk("echo a | wc"), false).unwrap(),
            json!({"command": "bash", "args": ["-c", "echo a | wc"]})
        );
        assert_eq!(
            command_args(&sdk("echo hi"), false).unwrap(),
            json!({"command": "bash", "args": ["-c", "echo hi"]})
        );
        // A confined key: a plain line is its own program, shell syntax stays under bash.
        assert_eq!(
            command_args(&sdk("echo hi"), true).unwrap(),
            json!({"command": "echo hi", "args": []})
        );
        for line in ["echo $HOME", "a && b", "cat x > y", "echo 'q'", "ls *"] {
            assert_eq!(
                command_args(&sdk(line), true).unwrap()["command"],
                "bash",
                "{line}"
            );
        }
        let mut with_cwd = config("python3", &["x.py"]);
        with_cwd.cwd = Some("work".into());
        with_cwd.envs.insert("A".into(), "1".into());
        assert_eq!(
            command_args(&with_cwd, true).unwrap(),
            json!({"command": "python3", "args": ["x.py"], "cwd": "/home/user/work",
                   "env_additions": {"A": "1"}})
        );
        assert!(command_args(&config("", &[]), false).is_err());
        // A terminal's shell.
        assert_eq!(
            command_args(&config("/bin/bash", &["-i", "-l"]), false).unwrap(),
            json!({"command": "bash", "args": ["-c", "exec bash -i"]})
        );
        let mut terminal = config("/bin/bash", &["-i", "-l"]);
        terminal.envs.insert("TERM".into(), "xterm-256color".into());
        terminal.envs.insert("LANG".into(), "C.UTF-8".into());
        terminal.envs.insert("LC_ALL".into(), "$(id)".into());
        assert_eq!(
            command_args(&terminal, false).unwrap(),
            json!({"command": "bash", "args": ["-c", "TERM=xterm-256color LANG=C.UTF-8 exec bash -i"],
                   "env_additions": {"LC_ALL": "$(id)"}})
        );
    }

    #[test]
    fn only_the_sandbox_user_is_accepted() {
        assert!(named_user("").is_ok());
        assert!(named_user("user").is_ok());
        let e = named_user("root").unwrap_err();
        assert_eq!(e.code, Code::PermissionDenied);
        assert!(e.message.contains("no root"));
        assert!(absolute("/etc/../x").is_err());
        assert_eq!(absolute("~/a").unwrap(), "/home/user/a");
        assert_eq!(absolute("a/b").unwrap(), "/home/user/a/b");
        assert!(same_secret("abc", "abc") && !same_secret("abc", "abd") && !same_secret("a", "ab"));
    }
}
