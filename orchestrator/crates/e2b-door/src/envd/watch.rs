//! envd's directory watches over the executor's (`dispatcher.watch_dir`): the `WatchDir`
//! stream, and the polling watchers the synchronous SDK uses (`CreateWatcher`, then
//! `GetWatcherEvents` until `RemoveWatcher`). With `include_entry`, each event whose entry
//! still exists carries its `EntryInfo`, read by listing its directory (a router `fs.list`, one
//! per directory per poll or event); `allow_network_mounts` changes nothing (a sandbox has no
//! network mounts).
//!
//! A poll first syncs its watch (the executor's `fs.watch_sync`): what changed before the poll
//! is in its answer, never left for the next one, also beneath a directory made after the
//! watch started (the executor reports what such a directory already held when its own watch
//! came). The `WatchDir` stream sends events as they come and needs no sync.
//!
//! A watch reads what changes beneath a directory of the caller's own sandbox, what listing
//! it shows. So it is authorized, and its creation audited once, as a router `fs.list` of the
//! directory: the sandbox's read roots and a bound key's security context decide, and the
//! executor holds the watch to the read roots again. Polling watchers are bounded per sandbox
//! (`LiveProcesses`'s `MAX_WATCHERS`) and go with their sandbox. Events lost to a full buffer
//! or the kernel's queue are never skipped silently: the stream ends, or the poll fails, saying
//! so (watch again and list the directory).

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::Response;
use dispatcher::protocol::{FsEvent, FsOp};
use dispatcher::{WatchEvent, WatchHandle};
use serde_json::json;

use super::entries::entries_at;
use super::process::{keepalive_of, stream};
use super::{
    absolute, call, content_type, error_response, refuse, stream_error, target, unary, Target,
    MAX_MESSAGE,
};
use aegis_e2b::connect::{
    end_stream_frame, message_frame, Code, ConnectError, EndStream, RequestStreamDecoder, RpcKind,
};
use aegis_e2b::envd::filesystem::{
    watch_dir_response, CreateWatcherRequest, CreateWatcherResponse, EventType, FilesystemEvent,
    GetWatcherEventsRequest, GetWatcherEventsResponse, RemoveWatcherRequest, RemoveWatcherResponse,
    WatchDirRequest, WatchDirResponse,
};
use aegis_sandboxes::SandboxError;
use aegis_tools::state::AppState;
use aegis_tools::tools::control;

/// Most events one `GetWatcherEvents` returns (the rest wait for the next poll).
const MAX_POLLED: usize = 10_000;
/// Longest a poll waits for its watch to have sent what the kernel queued.
const SYNC_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// `POST /filesystem.Filesystem/{WatchDir, CreateWatcher, GetWatcherEvents, RemoveWatcher}`.
pub async fn serve(state: AppState, method: &str, headers: HeaderMap, body: Bytes) -> Response {
    match method {
        "WatchDir" => watch_dir(state, headers, body).await,
        "CreateWatcher" => {
            unary(
                state,
                headers,
                body,
                |state, t, r: CreateWatcherRequest| async move {
                    // `allow_network_mounts` changes nothing: a sandbox has no network mounts.
                    let handle = open(&state, &t, &r.path, r.recursive).await?;
                    let id = state
                        .sandboxes
                        .live()
                        .keep_watcher(t.id, handle)
                        .map_err(|max| {
                            refuse(
                                Code::ResourceExhausted,
                                format!(
                                    "this sandbox already has {max} watchers, the most it may \
                                     hold; remove one first"
                                ),
                            )
                        })?;
                    let watcher_id = if r.include_entry {
                        format!("{id}{WITH_ENTRIES}")
                    } else {
                        id
                    };
                    Ok(CreateWatcherResponse { watcher_id })
                },
            )
            .await
        }
        "GetWatcherEvents" => {
            unary(
                state,
                headers,
                body,
                |state, t, r: GetWatcherEventsRequest| async move {
                    let (id, with_entries) = watcher(&r.watcher_id);
                    poll(&state, &t, id, with_entries).await
                },
            )
            .await
        }
        "RemoveWatcher" => {
            unary(
                state,
                headers,
                body,
                |state, t, r: RemoveWatcherRequest| async move {
                    let (id, _) = watcher(&r.watcher_id);
                    if state.sandboxes.live().remove_watcher(t.id, id) {
                        Ok(RemoveWatcherResponse {})
                    } else {
                        Err(not_found(&r.watcher_id))
                    }
                },
            )
            .await
        }
        other => error_response(&refuse(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{other} is not a watch method"),
        )),
    }
}

/// The end of the id of a polling watcher whose events carry their entries (`include_entry`):
/// the node's watcher id says what the watcher was asked for, so nothing else keeps it.
const WITH_ENTRIES: &str = "+entries";

/// The node's watcher id in an E2B watcher id, and whether its events carry their entries.
fn watcher(id: &str) -> (&str, bool) {
    match id.strip_suffix(WITH_ENTRIES) {
        Some(id) => (id, true),
        None => (id, false),
    }
}

/// Attaches to each event whose entry still exists its `EntryInfo` (what `include_entry`
/// asks); `paths` are the events' absolute paths. A removed or renamed-away entry has none.
async fn attach_entries(
    state: &AppState,
    t: &Target,
    events: &mut [FilesystemEvent],
    paths: &[String],
) {
    let present: Vec<String> = events
        .iter()
        .zip(paths)
        .filter(|(e, _)| {
            e.r#type != EventType::Remove as i32 && e.r#type != EventType::Rename as i32
        })
        .map(|(_, p)| p.clone())
        .collect();
    if present.is_empty() {
        return;
    }
    let found = entries_at(state, t, &present).await;
    for (event, path) in events.iter_mut().zip(paths) {
        if event.r#type != EventType::Remove as i32 && event.r#type != EventType::Rename as i32 {
            event.entry = found.get(path).cloned();
        }
    }
}

fn not_found(id: &str) -> ConnectError {
    refuse(
        Code::NotFound,
        format!("watcher {id:?} not found in this sandbox"),
    )
}

/// Authorizes (a router `fs.list` of the directory) and opens a watch.
async fn open(
    state: &AppState,
    t: &Target,
    path: &str,
    recursive: bool,
) -> Result<WatchHandle, ConnectError> {
    let path = absolute(path)?;
    call(state, t, "fs.list", json!({"path": path})).await?;
    control::watch_dir(state, &t.caller, t.id, &path, recursive)
        .await
        .map_err(|e| match &e {
            SandboxError::Dispatch(dispatcher::DispatchError::Refused {
                kind, message, ..
            }) => {
                let code = match kind.as_str() {
                    "not_found" => Code::NotFound,
                    "limit_reached" => Code::ResourceExhausted,
                    "path_not_allowed" | "permission_denied" => Code::PermissionDenied,
                    _ => Code::InvalidArgument,
                };
                refuse(code, format!("cannot watch {path:?}: {message}"))
            }
            _ => refuse(Code::Unavailable, format!("cannot watch {path:?}: {e}")),
        })
}

/// E2B's event of one change, named relative to the watched directory; `None` for an
/// overflow (events were lost).
fn event(watched: &str, fs: &FsEvent) -> Option<FilesystemEvent> {
    let kind = match fs.op {
        FsOp::Create => EventType::Create,
        FsOp::Write => EventType::Write,
        FsOp::Remove => EventType::Remove,
        FsOp::Rename => EventType::Rename,
        FsOp::Chmod => EventType::Chmod,
        FsOp::Overflow => return None,
    };
    let name = fs
        .path
        .strip_prefix(watched)
        .map(|rest| rest.trim_start_matches('/'))
        .unwrap_or(&fs.path);
    Some(FilesystemEvent {
        name: name.to_owned(),
        r#type: kind as i32,
        entry: None,
    })
}

fn lost(path: &str, what: &str) -> ConnectError {
    refuse(
        Code::DataLoss,
        format!(
            "the watch of {path:?} lost events ({what}); list the directory and watch it again"
        ),
    )
}

/// Drains a polling watcher: the events that have come, at most [`MAX_POLLED`].
async fn poll(
    state: &AppState,
    t: &Target,
    id: &str,
    with_entries: bool,
) -> Result<GetWatcherEventsResponse, ConnectError> {
    let live = state.sandboxes.live();
    let watcher = live.watcher(t.id, id).ok_or_else(|| not_found(id))?;
    let mut handle = watcher.lock().await;
    let watched = handle.path().to_owned();
    // Every change made before this poll is drained by it (the SDK polls right after its
    // own write returns), including what a directory made meanwhile beneath a recursive
    // watch holds. A sync that fails leaves what has come, as a poll without it would.
    if let Err(e) = handle.sync(SYNC_DEADLINE).await {
        tracing::debug!(watcher = id, error = %e, "a watcher's sync failed; polling what has come");
    }
    let mut events = Vec::new();
    let mut paths = Vec::new();
    while events.len() < MAX_POLLED {
        match handle.try_next() {
            None => break,
            Some(WatchEvent::Fs(fs)) => match event(&watched, &fs) {
                Some(e) => {
                    events.push(e);
                    paths.push(fs.path);
                }
                None => {
                    live.remove_watcher(t.id, id);
                    return Err(lost(&watched, "the kernel's queue overflowed"));
                }
            },
            Some(WatchEvent::Dropped { events: n }) => {
                live.remove_watcher(t.id, id);
                return Err(lost(&watched, &format!("{n} dropped between polls")));
            }
            Some(WatchEvent::End { reason }) => {
                live.remove_watcher(t.id, id);
                if events.is_empty() {
                    return Err(refuse(
                        Code::NotFound,
                        format!("watcher {id:?} ended: {reason}"),
                    ));
                }
                break;
            }
        }
    }
    drop(handle);
    if with_entries {
        attach_entries(state, t, &mut events, &paths).await;
    }
    Ok(GetWatcherEventsResponse { events })
}

fn frame(codec: aegis_e2b::connect::Codec, event: watch_dir_response::Event) -> Vec<u8> {
    message_frame(codec, &WatchDirResponse { event: Some(event) }).unwrap_or_default()
}

/// `WatchDir`: `start` once the watch is in place, then each change, `keepalive` when idle;
/// it ends when the client leaves (the watch is removed) or the watch does.
async fn watch_dir(state: AppState, headers: HeaderMap, body: Bytes) -> Response {
    let codec = match content_type(&headers, RpcKind::Streaming) {
        Ok(c) => c,
        Err(e) => return error_response(&e),
    };
    let mut decoder = RequestStreamDecoder::<WatchDirRequest>::new(codec, MAX_MESSAGE);
    let request = match decoder.feed(&body).and_then(|mut m| {
        decoder.finish()?;
        m.pop()
            .ok_or_else(|| refuse(Code::InvalidArgument, "no WatchDirRequest in the body"))
    }) {
        Ok(r) => r,
        Err(e) => return stream_error(codec, &e),
    };
    let t = match target(&state, &headers).await {
        Ok(t) => t,
        Err(e) => return stream_error(codec, &e),
    };
    let mut handle = match open(&state, &t, &request.path, request.recursive).await {
        Ok(h) => h,
        Err(e) => return stream_error(codec, &e),
    };
    let keepalive = keepalive_of(&headers);
    // `allow_network_mounts` changes nothing: a sandbox has no network mounts.
    let with_entries = request.include_entry;
    stream(codec, None, move |tx| async move {
        let watched = handle.path().to_owned();
        let started = watch_dir_response::Event::Start(watch_dir_response::StartEvent {});
        if tx.send(frame(codec, started)).await.is_err() {
            return;
        }
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(keepalive, handle.next()) => next,
                // The client left: dropping the handle removes the watch.
                _ = tx.closed() => return,
            };
            let failed = |e: ConnectError| end_stream_frame(&EndStream::failed(e));
            let (out, last) = match next {
                Err(_) => (
                    frame(
                        codec,
                        watch_dir_response::Event::Keepalive(watch_dir_response::KeepAlive {}),
                    ),
                    false,
                ),
                Ok(Some(WatchEvent::Fs(fs))) => match event(&watched, &fs) {
                    Some(mut e) => {
                        if with_entries {
                            let paths = [fs.path.clone()];
                            attach_entries(&state, &t, std::slice::from_mut(&mut e), &paths).await;
                        }
                        (
                            frame(codec, watch_dir_response::Event::Filesystem(e)),
                            false,
                        )
                    }
                    None => (
                        failed(lost(&watched, "the kernel's queue overflowed")),
                        true,
                    ),
                },
                Ok(Some(WatchEvent::Dropped { events })) => (
                    failed(lost(
                        &watched,
                        &format!("{events} dropped: this stream fell behind"),
                    )),
                    true,
                ),
                Ok(Some(WatchEvent::End { reason })) => (
                    failed(refuse(
                        Code::Unavailable,
                        format!("the watch of {watched:?} ended: {reason}"),
                    )),
                    true,
                ),
                Ok(None) => (end_stream_frame(&EndStream::ok()), true),
            };
            if tx.send(out).await.is_err() || last {
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_named_beneath_the_watched_directory() {
        let fs = |op, path: &str| FsEvent {
            op,
            path: path.to_owned(),
            is_dir: false,
        };
        let e = event("/home/user/w", &fs(FsOp::Write, "/home/user/w/a/b.txt")).unwrap();
        assert_eq!(e.name, "a/b.txt");
        assert_eq!(e.r#type, EventType::Write as i32);
        let e = event("/home/user/w", &fs(FsOp::Rename, "/home/user/w/x")).unwrap();
        assert_eq!(e.r#type, EventType::Rename as i32);
        assert!(event("/home/user/w", &fs(FsOp::Overflow, "/home/user/w")).is_none());
    }

    #[test]
    fn a_watcher_id_says_whether_its_events_carry_entries() {
        assert_eq!(watcher("w3"), ("w3", false));
        assert_eq!(watcher(&format!("w3{WITH_ENTRIES}")), ("w3", true));
    }
}
