//! envd's `process.Process` service over the node's live processes.
//!
//! - `Start` is one router call of `cmd.run` with `background: true` (so the policy decision,
//!   the kernel grant and the start's audit row are the router's, as on every other door),
//!   then a stream of the process's events read from the one reader the node keeps for it
//!   (`LiveProcesses`): `start`, `data` as it comes, `keepalive` when idle, `end`. Reading
//!   output a started process writes is no new decision, so polls write no audit rows; the end
//!   gets its own row from the router's follower. A foreground `commands.run` is the same
//!   stream, which the SDK reads to its end. Closing the stream leaves the process running
//!   (until its end, its timeout, a signal, or its sandbox's end), as envd does.
//! - `Connect` streams the same process's events (by pid or tag) from a handle of its own on
//!   the dispatcher's feed, from the oldest output still buffered: any number of streams (the
//!   `Start` stream still open, other `Connect`s) follow one process at once, each getting every
//!   event, as envd's subscribers do. Only the `Start` stream reads the node's kept reader, so
//!   a `Connect` never takes another stream's output or its end.
//! - `List` is the executor's list of the sandbox's live processes (read-only).
//! - `SendInput`, `StreamInput` and `CloseStdin` are `proc.input`; `Update` (a terminal's
//!   size) is `proc.input` with `resize`; `SendSignal` is `proc.signal`.
//!
//! Events the node cannot give E2B's shape are not lost silently: output a slow reader missed
//! (the node's per-process buffer is bounded) is counted in the end event's `error`.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use axum::response::Response;
use dispatcher::{ProcessEvent as LiveEvent, ProcessHandle, ProcessSelector as LiveSelector};
use serde_json::{json, Value};

use aegis_e2b::connect::{
    end_stream_frame, message_frame, Code, Codec, ConnectError, EndStream, Message,
    RequestStreamDecoder, RpcKind,
};
use aegis_e2b::envd::headers as h;
use aegis_e2b::envd::process::{
    process_event, process_input, process_selector, stream_input_request, CloseStdinRequest,
    CloseStdinResponse, ConnectRequest, ConnectResponse, ListRequest, ListResponse, ProcessConfig,
    ProcessEvent, ProcessInfo, ProcessInput, ProcessSelector, SendInputRequest, SendInputResponse,
    SendSignalRequest, SendSignalResponse, Signal, StartRequest, StartResponse, StreamInputRequest,
    StreamInputResponse, UpdateRequest, UpdateResponse,
};

use super::command::{command_args, direct_line};
use super::{
    call, content_type, error_response, refuse, stream_error, stream_response, target, tool_error,
    try_start, unary, Target, DEFAULT_KEEPALIVE, MAX_MESSAGE,
};
use aegis_http::Connection;
use aegis_sandboxes::SandboxError;
use aegis_tools::state::AppState;
use aegis_tools::tools::control;
use aegis_tools::tools::Started;

/// Largest data event, as envd sends them.
const MAX_CHUNK: usize = 64 * 1024;

/// `POST /process.Process/{method}`.
pub async fn serve(
    state: AppState,
    method: &str,
    headers: HeaderMap,
    body: Bytes,
    cut: Option<Connection>,
) -> Response {
    match method {
        "Start" => start(state, headers, body, cut).await,
        "Connect" => connect(state, headers, body, cut).await,
        "List" => {
            unary(
                state,
                headers,
                body,
                |state, t, _: ListRequest| async move { list(&state, &t).await },
            )
            .await
        }
        "SendInput" => {
            unary(
                state,
                headers,
                body,
                |state, t, r: SendInputRequest| async move {
                    let mut args = selector(r.process.as_ref())?;
                    args["data"] = json!(input_text(r.input)?);
                    call(&state, &t, "proc.input", args).await?;
                    Ok(SendInputResponse {})
                },
            )
            .await
        }
        "CloseStdin" => {
            unary(
                state,
                headers,
                body,
                |state, t, r: CloseStdinRequest| async move {
                    let mut args = selector(r.process.as_ref())?;
                    args["close"] = json!(true);
                    call(&state, &t, "proc.input", args).await?;
                    Ok(CloseStdinResponse {})
                },
            )
            .await
        }
        "SendSignal" => {
            unary(
                state,
                headers,
                body,
                |state, t, r: SendSignalRequest| async move {
                    let mut args = selector(r.process.as_ref())?;
                    args["signal"] = json!(match Signal::try_from(r.signal) {
                        Ok(Signal::Sigkill) => "kill",
                        Ok(Signal::Sigterm) => "term",
                        _ => {
                            return Err(refuse(
                                Code::InvalidArgument,
                                format!(
                                    "signal {} is not served: SIGTERM (15) or SIGKILL (9)",
                                    r.signal
                                ),
                            ));
                        }
                    });
                    call(&state, &t, "proc.signal", args).await?;
                    Ok(SendSignalResponse {})
                },
            )
            .await
        }
        "Update" => {
            unary(
                state,
                headers,
                body,
                |state, t, r: UpdateRequest| async move {
                    let mut args = selector(r.process.as_ref())?;
                    let Some(size) = r.pty.and_then(|p| p.size) else {
                        // Nothing to change.
                        return Ok(UpdateResponse {});
                    };
                    args["resize"] = json!({"cols": size.cols, "rows": size.rows});
                    call(&state, &t, "proc.input", args).await?;
                    Ok(UpdateResponse {})
                },
            )
            .await
        }
        "StreamInput" => stream_input(state, headers, body).await,
        other => error_response(&refuse(
            Code::Unimplemented,
            format!("process.Process/{other} is not a method of envd's process service"),
        )),
    }
}

/// The `pid` or `tag` arguments of a router `proc.*` call.
fn selector(process: Option<&ProcessSelector>) -> Result<Value, ConnectError> {
    match process.and_then(|p| p.selector.as_ref()) {
        Some(process_selector::Selector::Pid(pid)) => Ok(json!({"pid": pid})),
        Some(process_selector::Selector::Tag(tag)) => Ok(json!({"tag": tag})),
        None => Err(refuse(
            Code::InvalidArgument,
            "process: name the process by pid or tag",
        )),
    }
}

/// Input bytes as the text `proc.input` writes (stdin and terminal input alike).
fn input_text(input: Option<ProcessInput>) -> Result<String, ConnectError> {
    let bytes = match input.and_then(|i| i.input) {
        Some(process_input::Input::Stdin(b) | process_input::Input::Pty(b)) => b,
        None => return Err(refuse(Code::InvalidArgument, "input is missing")),
    };
    String::from_utf8(bytes).map_err(|e| {
        refuse(
            Code::InvalidArgument,
            format!("input is not UTF-8 (this node writes text input only): {e}"),
        )
    })
}

/// The live processes of the sandbox, as its executor knows them. Their environment is not
/// reported (it holds the node's proxy settings, not the caller's).
async fn list(state: &AppState, t: &Target) -> Result<ListResponse, ConnectError> {
    let processes = control::list_processes(state, &t.caller, t.id)
        .await
        .map_err(|e| refuse(Code::Unavailable, format!("cannot list processes: {e}")))?;
    Ok(ListResponse {
        processes: processes
            .into_iter()
            .map(|p| {
                let mut argv = p.argv.into_iter();
                ProcessInfo {
                    config: Some(ProcessConfig {
                        cmd: argv.next().unwrap_or_default(),
                        args: argv.collect(),
                        envs: Default::default(),
                        cwd: Some(p.cwd),
                    }),
                    pid: p.pid,
                    tag: p.tag,
                }
            })
            .collect(),
    })
}

/// The keepalive interval the client asked for.
pub(super) fn keepalive_of(headers: &HeaderMap) -> Duration {
    headers
        .get(h::KEEPALIVE_PING_INTERVAL)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| h::keepalive_interval(v).ok())
        .unwrap_or(DEFAULT_KEEPALIVE)
}

/// A server-streaming call's opening: its codec, its one request message and its sandbox. A
/// refusal comes back as the response to send (an unknown codec as a plain error, the rest
/// as the stream's end).
async fn opened<M: Message + Default>(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Codec, M, Target), Response> {
    let codec = content_type(headers, RpcKind::Streaming).map_err(|e| error_response(&e))?;
    let request = one_request(codec, body).map_err(|e| stream_error(codec, &e))?;
    let target = target(state, headers)
        .await
        .map_err(|e| stream_error(codec, &e))?;
    Ok((codec, request, target))
}

/// The one request message of a server-streaming call.
fn one_request<M: Message>(codec: Codec, body: &[u8]) -> Result<M, ConnectError> {
    let mut decoder = RequestStreamDecoder::<M>::new(codec, MAX_MESSAGE);
    let mut messages = decoder.feed(body)?;
    decoder.finish()?;
    if messages.len() > 1 {
        return Err(refuse(
            Code::InvalidArgument,
            "a server-streaming call takes exactly one request message",
        ));
    }
    messages
        .pop()
        .ok_or_else(|| refuse(Code::InvalidArgument, "no request message in the body"))
}

async fn start(
    state: AppState,
    headers: HeaderMap,
    body: Bytes,
    cut: Option<Connection>,
) -> Response {
    let (codec, request, target) = match opened::<StartRequest>(&state, &headers, &body).await {
        Ok(opened) => opened,
        Err(refused) => return refused,
    };
    let confined = target.caller.seal.is_some();
    // A terminal is always a shell; a confined key's plain lines are unwrapped by `command_args`.
    let line = request
        .process
        .as_ref()
        .filter(|_| !confined && request.pty.is_none())
        .and_then(|config| direct_line(config, &target.env));
    let args = match start_args(&headers, request, &target.env, confined) {
        Ok(a) => a,
        Err(e) => return stream_error(codec, &e),
    };
    let keepalive = keepalive_of(&headers);
    stream(codec, cut, move |tx| async move {
        let started = match start_command(&state, &target, line, args).await {
            Ok(started) => started,
            Err(e) => {
                let _ = tx.send(end_stream_frame(&EndStream::failed(e))).await;
                return;
            }
        };
        let Started { pid, reader } = started;
        follow(
            &state,
            &target,
            pid,
            Source::Kept(reader),
            codec,
            keepalive,
            &tx,
            |event| StartResponse { event: Some(event) },
        )
        .await;
    })
}

/// Starts a `Start`'s command: a `line` that needs no shell ([`direct_line`]) as its own argv
/// when the sandbox's policy takes it so (`CommandPolicy::argv`, the check the router makes
/// again when it decides), else under `bash -c` (`shell`, the request's `cmd.run` arguments).
/// A direct program that is not found runs under `bash -c` after all, so the caller gets
/// bash's answer (exit 127, "command not found") as before; its failed start keeps its audit
/// row, as every call does.
async fn start_command(
    state: &AppState,
    target: &Target,
    line: Option<String>,
    shell: Value,
) -> Result<Started, ConnectError> {
    if let Some(direct) = match line {
        Some(line) => direct_args(state, target, &line, &shell).await,
        None => None,
    } {
        match try_start(state, target, direct).await? {
            Ok(started) => return Ok(started),
            Err(e) if e.code == "command_not_found" => {}
            Err(e) => return Err(tool_error(e)),
        }
    }
    try_start(state, target, shell).await?.map_err(tool_error)
}

/// `shell` with `line` as the command and no `bash -c`, when the sandbox's policy runs the
/// line as it is (any program, no code option, a bare name); `None` otherwise.
async fn direct_args(
    state: &AppState,
    target: &Target,
    line: &str,
    shell: &Value,
) -> Option<Value> {
    let policy = state.sandboxes.policy(&state.pool, target.id).await.ok()?;
    policy.command.argv(line, &[]).ok()?;
    let mut args = shell.clone();
    args["command"] = json!(line);
    args["args"] = json!([]);
    Some(args)
}

/// The `cmd.run` arguments of a `StartRequest`: the command as [`command_args`] translates it
/// (with the sandbox's environment `env`), in the background, with its stdin, terminal and
/// tag, and the call's deadline as its timeout (within the policy's ceiling, applied by
/// `cmd.run`).
fn start_args(
    headers: &HeaderMap,
    request: StartRequest,
    env: &BTreeMap<String, String>,
    confined: bool,
) -> Result<Value, ConnectError> {
    let config = request
        .process
        .ok_or_else(|| refuse(Code::InvalidArgument, "process is missing"))?;
    let mut args = command_args(&config, env, confined)?;
    args["background"] = json!(true);
    if let Some(tag) = request.tag {
        args["tag"] = json!(tag);
    }
    if let Some(pty) = request.pty {
        let size = pty.size.unwrap_or_default();
        args["pty"] = json!({"cols": size.cols.max(1), "rows": size.rows.max(1)});
    } else if request.stdin.unwrap_or(true) {
        // Absent means an open stdin (clients older than envd 0.3.0).
        args["stdin"] = json!(true);
    }
    if let Some(limit) = aegis_e2b::connect::timeout(
        headers
            .get(aegis_e2b::connect::TIMEOUT_HEADER)
            .and_then(|v| v.to_str().ok()),
    )? {
        args["timeout_secs"] = json!(limit.as_secs().max(1));
    }
    Ok(args)
}

async fn connect(
    state: AppState,
    headers: HeaderMap,
    body: Bytes,
    cut: Option<Connection>,
) -> Response {
    let (codec, request, target) = match opened::<ConnectRequest>(&state, &headers, &body).await {
        Ok(opened) => opened,
        Err(refused) => return refused,
    };
    let select = match request.process.and_then(|p| p.selector) {
        Some(process_selector::Selector::Pid(pid)) => LiveSelector::Pid(pid),
        Some(process_selector::Selector::Tag(tag)) => LiveSelector::Tag(tag),
        None => {
            return stream_error(
                codec,
                &refuse(
                    Code::InvalidArgument,
                    "process: name the process by pid or tag",
                ),
            )
        }
    };
    // Resolved before the stream opens, so an unknown process is a plain not_found.
    let handle = match attach(&state, &target, select).await {
        Ok(handle) => handle,
        Err(e) => return stream_error(codec, &e),
    };
    let keepalive = keepalive_of(&headers);
    stream(codec, cut, move |tx| async move {
        let pid = handle.pid();
        let source = Source::Own(Box::new(handle));
        follow(
            &state,
            &target,
            pid,
            source,
            codec,
            keepalive,
            &tx,
            |event| ConnectResponse { event: Some(event) },
        )
        .await;
    })
}

/// A handle of its own on the process `select` names in the target sandbox (a `Connect`):
/// it reads every event from the oldest still buffered, whoever else follows the process.
async fn attach(
    state: &AppState,
    target: &Target,
    select: LiveSelector,
) -> Result<ProcessHandle, ConnectError> {
    let what = match &select {
        LiveSelector::Pid(pid) => format!("pid {pid}"),
        LiveSelector::Tag(tag) => format!("tag {tag:?}"),
    };
    control::attach_process(state, &target.caller, target.id, select)
        .await
        .map_err(|e| match e {
            SandboxError::Unavailable(_) => refuse(Code::Unavailable, e.to_string()),
            e => refuse(
                Code::NotFound,
                format!("process with {what} not found in this sandbox: {e}"),
            ),
        })
}

/// Where a stream reads a process's events from.
enum Source {
    /// The node's kept reader of a process this `Start` began (output read once, its entry
    /// forgotten once its end is read here).
    Kept(aegis_sandboxes::live::Reader),
    /// A `Connect`'s own handle.
    Own(Box<ProcessHandle>),
}

impl Source {
    async fn next(&mut self) -> Option<LiveEvent> {
        match self {
            // Held only while waiting for one event.
            Source::Kept(reader) => reader.lock().await.next().await,
            Source::Own(handle) => handle.next().await,
        }
    }
}

pub(super) type Sender = tokio::sync::mpsc::Sender<Vec<u8>>;

/// What a producer sends to cut its answer short instead of ending it: the connection is
/// dropped mid-answer (no frame is empty, so it cannot be mistaken for one), reset over
/// HTTP/1.x ([`Connection::reset_on_close`]). Used when the sandbox went away under a stream,
/// as a client of E2B sees its sandbox die (its edge drops the connection): the SDK takes the
/// drop for a transport failure, asks `/health`, hears 502, and reports the sandbox killed.
pub(super) const ABORT: Vec<u8> = Vec::new();

/// A streaming answer whose frames `produce` sends; [`ABORT`] cuts it, resetting `cut` (the
/// request's HTTP/1.x connection) when given.
pub(super) fn stream<F, Fut>(codec: Codec, cut: Option<Connection>, produce: F) -> Response
where
    F: FnOnce(Sender) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    crate::spawn_labelled(produce(tx));
    let body = futures_util::stream::unfold(Some((rx, cut)), |open| async move {
        let (mut rx, cut) = open?;
        let frame = rx.recv().await?;
        if frame.is_empty() {
            if let Some(connection) = &cut {
                connection.reset_on_close();
            }
            let cut = std::io::Error::other("the sandbox went away under this stream");
            return Some((Err(cut), None));
        }
        Some((Ok(Bytes::from(frame)), Some((rx, cut))))
    });
    stream_response(codec, Body::from_stream(body))
}

fn frame<M: Message>(
    codec: Codec,
    wrap: fn(ProcessEvent) -> M,
    event: process_event::Event,
) -> Vec<u8> {
    message_frame(codec, &wrap(ProcessEvent { event: Some(event) })).unwrap_or_default()
}

/// Streams a live process's events from `source`: `start`, output as it comes, `keepalive`
/// when idle, `end`, end of stream. Returns when the process ended or the client left (the
/// process keeps running then).
#[allow(clippy::too_many_arguments)]
async fn follow<M: Message>(
    state: &AppState,
    target: &Target,
    pid: u32,
    mut source: Source,
    codec: Codec,
    keepalive: Duration,
    tx: &Sender,
    wrap: fn(ProcessEvent) -> M,
) {
    use process_event::data_event::Output;
    let fail = |e: ConnectError| end_stream_frame(&EndStream::failed(e));
    let started = process_event::Event::Start(process_event::StartEvent { pid });
    if tx.send(frame(codec, wrap, started)).await.is_err() {
        return;
    }
    let mut dropped = 0u64;
    loop {
        let next = tokio::select! {
            event = tokio::time::timeout(keepalive, source.next()) => event,
            // The client left: the process keeps running.
            _ = tx.closed() => return,
        };
        let frames = match next {
            Err(_) => vec![frame(
                codec,
                wrap,
                process_event::Event::Keepalive(process_event::KeepAlive {}),
            )],
            Ok(None) => {
                let e = refuse(
                    Code::NotFound,
                    format!("process {pid}: its end was already read by another stream"),
                );
                let _ = tx.send(fail(e)).await;
                return;
            }
            Ok(Some(LiveEvent::Dropped { bytes, .. })) => {
                dropped += bytes;
                continue;
            }
            Ok(Some(LiveEvent::Stdout(b))) => data(codec, wrap, &b, Output::Stdout),
            Ok(Some(LiveEvent::Stderr(b))) => data(codec, wrap, &b, Output::Stderr),
            Ok(Some(LiveEvent::Pty(b))) => data(codec, wrap, &b, Output::Pty),
            Ok(Some(LiveEvent::End(end))) => {
                if matches!(source, Source::Kept(_)) {
                    state.sandboxes.live().ended(target.id, pid);
                }
                let last = if end.timed_out {
                    // The call's deadline (`Connect-Timeout-Ms`, the SDK's `timeout`) passed
                    // and the command was killed for it: as envd, the call fails so.
                    fail(refuse(
                        Code::DeadlineExceeded,
                        format!("process {pid} ran past the call's deadline and was killed"),
                    ))
                } else if gone(&end) {
                    ABORT
                } else {
                    let _ = tx.send(frame(codec, wrap, end_event(&end, dropped))).await;
                    end_stream_frame(&EndStream::ok())
                };
                let _ = tx.send(last).await;
                return;
            }
        };
        for f in frames {
            if tx.send(f).await.is_err() {
                return;
            }
        }
    }
}

/// An end the node did not see happen: the sandbox's executor stream closed under the
/// process (its sandbox was killed or died), which is the only way an end carries no status.
fn gone(end: &dispatcher::protocol::ProcessEnd) -> bool {
    end.exit_code.is_none() && end.signal.is_none() && end.error.is_some()
}

fn data<M: Message>(
    codec: Codec,
    wrap: fn(ProcessEvent) -> M,
    bytes: &[u8],
    output: fn(Vec<u8>) -> process_event::data_event::Output,
) -> Vec<Vec<u8>> {
    bytes
        .chunks(MAX_CHUNK)
        .map(|chunk| {
            frame(
                codec,
                wrap,
                process_event::Event::Data(process_event::DataEvent {
                    output: Some(output(chunk.to_vec())),
                }),
            )
        })
        .collect()
}

/// E2B's end event of a process's end: a signal is exit code -1 and `signal: <name>`; what
/// the node knows beyond that (a timeout, capped or missed output, an end not observed) is
/// its `error`.
pub fn end_event(end: &dispatcher::protocol::ProcessEnd, dropped: u64) -> process_event::Event {
    let exit_code = end.exit_code.unwrap_or(-1);
    let status = match (end.exit_code, end.signal) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(9)) => "signal: killed".to_owned(),
        (None, Some(15)) => "signal: terminated".to_owned(),
        (None, Some(n)) => format!("signal: {n}"),
        (None, None) => "unknown".to_owned(),
    };
    let mut notes = Vec::new();
    if let Some(error) = &end.error {
        notes.push(format!("its end was not observed: {error}"));
    }
    if end.timed_out {
        notes.push("the command ran past its timeout and was killed".to_owned());
    }
    if end.truncated.stdout || end.truncated.stderr {
        notes.push(format!(
            "output capped: the node passes at most the first bytes of each stream ({} of stdout, {} of stderr were written)",
            end.stdout_bytes, end.stderr_bytes
        ));
    }
    if dropped > 0 {
        notes.push(format!(
            "{dropped} bytes of output were dropped: this stream fell behind the node's buffer"
        ));
    }
    process_event::Event::End(process_event::EndEvent {
        exit_code,
        exited: end.exit_code.is_some(),
        status,
        error: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

/// `StreamInput`: the whole client stream (a start naming the process, then data), each data
/// message one `proc.input` call in order, once the stream has ended.
async fn stream_input(state: AppState, headers: HeaderMap, body: Bytes) -> Response {
    let codec = match content_type(&headers, RpcKind::Streaming) {
        Ok(c) => c,
        Err(e) => return error_response(&e),
    };
    let mut decoder = RequestStreamDecoder::<StreamInputRequest>::new(codec, MAX_MESSAGE);
    let messages = match decoder
        .feed(&body)
        .and_then(|m| decoder.finish().map(|()| m))
    {
        Ok(m) => m,
        Err(e) => return stream_error(codec, &e),
    };
    let target = match target(&state, &headers).await {
        Ok(t) => t,
        Err(e) => return stream_error(codec, &e),
    };
    let mut process: Option<Value> = None;
    for message in messages {
        match message.event {
            Some(stream_input_request::Event::Start(s)) => match selector(s.process.as_ref()) {
                Ok(p) => process = Some(p),
                Err(e) => return stream_error(codec, &e),
            },
            Some(stream_input_request::Event::Data(d)) => {
                let Some(mut args) = process.clone() else {
                    let e = refuse(
                        Code::InvalidArgument,
                        "StreamInput: a data message came before the start naming the process",
                    );
                    return stream_error(codec, &e);
                };
                let text = match input_text(d.input) {
                    Ok(t) => t,
                    Err(e) => return stream_error(codec, &e),
                };
                args["data"] = json!(text);
                if let Err(e) = call(&state, &target, "proc.input", args).await {
                    return stream_error(codec, &e);
                }
            }
            Some(stream_input_request::Event::Keepalive(_)) | None => {}
        }
    }
    let mut frames = message_frame(codec, &StreamInputResponse {}).unwrap_or_default();
    frames.extend(end_stream_frame(&EndStream::ok()));
    stream_response(codec, Body::from(frames))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dispatcher::protocol::ProcessEnd;

    fn ended(exit_code: Option<i32>, signal: Option<i32>) -> ProcessEnd {
        ProcessEnd {
            exit_code,
            signal,
            stdout_bytes: 3,
            stderr_bytes: 0,
            truncated: Default::default(),
            timed_out: false,
            error: None,
        }
    }

    #[test]
    fn ends_read_as_envd_reports_them() {
        let end = |e: process_event::Event| match e {
            process_event::Event::End(end) => end,
            other => panic!("{other:?}"),
        };
        let e = end(end_event(&ended(Some(3), None), 0));
        assert_eq!(
            (e.exit_code, e.exited, e.status.as_str()),
            (3, true, "exit status 3")
        );
        assert_eq!(e.error, None);
        let e = end(end_event(&ended(None, Some(9)), 0));
        assert_eq!(
            (e.exit_code, e.exited, e.status.as_str()),
            (-1, false, "signal: killed")
        );
        let mut timed = ended(None, Some(9));
        timed.timed_out = true;
        let e = end(end_event(&timed, 7));
        let error = e.error.unwrap();
        assert!(
            error.contains("timeout") && error.contains("7 bytes"),
            "{error}"
        );
    }

    #[test]
    fn output_streams_in_frames_of_at_most_64_kib() {
        use aegis_e2b::connect::ResponseStreamDecoder;
        use process_event::data_event::Output;
        let bytes = vec![7u8; MAX_CHUNK + 10];
        let mut body = data(
            Codec::Proto,
            |event| StartResponse { event: Some(event) },
            &bytes,
            Output::Stdout,
        )
        .concat();
        body.extend(end_stream_frame(&EndStream::ok()));
        let mut decoder = ResponseStreamDecoder::<StartResponse>::new(Codec::Proto, 2 * MAX_CHUNK);
        let items = decoder.feed(&body).unwrap();
        decoder.finish().unwrap();
        let sizes: Vec<usize> = items
            .into_iter()
            .filter_map(|item| match item {
                aegis_e2b::connect::StreamItem::Message(StartResponse {
                    event:
                        Some(ProcessEvent {
                            event:
                                Some(process_event::Event::Data(process_event::DataEvent {
                                    output: Some(Output::Stdout(b)),
                                })),
                        }),
                }) => Some(b.len()),
                _ => None,
            })
            .collect();
        assert_eq!(sizes, [MAX_CHUNK, 10]);
    }

    #[test]
    fn start_requests_become_background_cmd_run_calls() {
        let config = ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), "echo hi".into()],
            envs: Default::default(),
            cwd: None,
        };
        let request = |stdin: Option<bool>| StartRequest {
            process: Some(config.clone()),
            pty: None,
            tag: Some("t".into()),
            stdin,
        };
        let mut headers = HeaderMap::new();
        headers.insert(aegis_e2b::connect::TIMEOUT_HEADER, "5000".parse().unwrap());
        let args = start_args(&headers, request(Some(false)), &BTreeMap::new(), false).unwrap();
        assert_eq!(
            args,
            json!({"command": "bash", "args": ["-c", "echo hi"], "background": true,
                   "tag": "t", "timeout_secs": 5})
        );
        assert_eq!(
            start_args(&headers, request(None), &BTreeMap::new(), false).unwrap()["stdin"],
            true
        );
        let mut pty = request(Some(true));
        pty.pty = Some(aegis_e2b::envd::process::Pty {
            size: Some(aegis_e2b::envd::process::pty::Size { cols: 80, rows: 24 }),
        });
        let args = start_args(&HeaderMap::new(), pty, &BTreeMap::new(), false).unwrap();
        assert_eq!(args["pty"], json!({"cols": 80, "rows": 24}));
        assert!(args.get("stdin").is_none());
        assert!(start_args(
            &HeaderMap::new(),
            StartRequest::default(),
            &BTreeMap::new(),
            false
        )
        .is_err());
        assert!(selector(None).is_err());
        assert_eq!(
            input_text(Some(ProcessInput {
                input: Some(process_input::Input::Stdin(b"ab".to_vec()))
            }))
            .unwrap(),
            "ab"
        );
    }
}
