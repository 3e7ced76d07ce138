//! The live half of the protocol: processes that outlive the request that started them, and
//! directory watches. Both answer their starting request at once and then send **events**,
//! unsolicited lines tagged with the starting request's id:
//!
//! ```json
//! {"event":7,"kind":"data","stream":"stdout","data":"aGkK"}
//! {"event":7,"kind":"end","exit_code":0,"stdout_bytes":3,"stderr_bytes":0,"truncated":{"stdout":false,"stderr":false},"timed_out":false}
//! {"event":9,"kind":"fs","op":"create","path":"/workspace/a.txt","is_dir":false}
//! ```
//!
//! An event line always starts with `{"event":`, a response with `{"id":`, so a reader tells them
//! apart without parsing. Events of one process (or watch) are written in the order they
//! happened; the first may arrive before the starting request's own response, so a reader
//! registers interest in the id before sending the request. The id of a `proc.start` or
//! `fs.watch` must never be reused on the same stream (a monotonic counter does that).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Enforcement, ExecGrant, RunAs, Truncation};

/// Parameters of `proc.start`: a program started like `cmd.run` (same lookup, Landlock domain,
/// sub-reaper and process group), answered at once with its pid, its output sent as events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartParams {
    /// Program and arguments; `argv[0]` is a bare name looked up in the configured `PATH`.
    pub argv: Vec<String>,
    /// Working directory; default the workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Extra environment variables, added after `PATH`, `HOME` and `LANG` (and `TERM` with a PTY).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// A name to re-attach by, unique among the sandbox's live processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Give the process a stdin pipe fed by `proc.input` (else `/dev/null`). A PTY always
    /// takes input.
    #[serde(default)]
    pub stdin: bool,
    /// Run under a pseudo-terminal of this size (stdin, stdout and stderr are its slave; output
    /// comes as the `pty` stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    /// Wall-clock limit (SIGTERM, then SIGKILL after `grace_ms`); none: until it ends or is
    /// signalled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Delay between SIGTERM and SIGKILL on timeout; default 2000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_ms: Option<u64>,
    /// Bytes forwarded per stream; the rest is read, counted and reported at the end
    /// (`truncated`). Default and ceiling: the executor's `max_live_output_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// Programs the process and its descendants may execute (as for `cmd.run`).
    #[serde(default, skip_serializing_if = "ExecGrant::is_default")]
    pub exec: ExecGrant,
    /// Who the process runs as (as for `cmd.run`).
    #[serde(default, skip_serializing_if = "RunAs::is_user")]
    pub user: RunAs,
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    /// Columns (1..=1000).
    pub cols: u16,
    /// Rows (1..=1000).
    pub rows: u16,
}

/// Result of `proc.start`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartResult {
    /// The process's pid in the sandbox (what `ps` shows; also its process group).
    pub pid: u32,
    /// The tag it was started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// What the kernel enforced of its policy.
    pub landlock: Enforcement,
}

/// Parameters naming one live process (`proc.close_stdin`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcTarget {
    /// The pid `proc.start` answered.
    pub pid: u32,
}

/// Parameters of `proc.input`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputParams {
    /// The pid `proc.start` answered.
    pub pid: u32,
    /// The bytes, standard base64 (at most 1 MiB decoded).
    pub data: String,
}

/// Result of `proc.input`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputResult {
    /// Bytes written (all of them: a write that cannot finish in time is an error).
    pub written: u64,
}

/// Signals a live process may be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessSignal {
    /// SIGTERM to the process group (it may clean up; its tree goes when the leader exits).
    Term,
    /// SIGKILL to every process of its tree.
    Kill,
}

/// Parameters of `proc.signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalParams {
    /// The pid `proc.start` answered.
    pub pid: u32,
    /// Which signal.
    pub signal: ProcessSignal,
}

/// Parameters of `proc.resize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResizeParams {
    /// The pid `proc.start` answered (a PTY process).
    pub pid: u32,
    /// The new size.
    pub size: PtySize,
}

/// One live process, as `proc.live` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveProcess {
    /// Its pid in the sandbox.
    pub pid: u32,
    /// Its tag, if it was given one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The id of the `proc.start` request whose events it sends.
    pub events: u64,
    /// Its argv.
    pub argv: Vec<String>,
    /// Its working directory (absolute).
    pub cwd: String,
    /// The extra environment it was started with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Its terminal size, with a PTY.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    /// Whether it takes input.
    pub stdin: bool,
}

/// Result of `proc.live`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveListResult {
    /// Every live process, by pid.
    pub processes: Vec<LiveProcess>,
}

/// Parameters of `fs.watch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchParams {
    /// A directory beneath a read root.
    pub path: String,
    /// Watch its subdirectories too (and those created later).
    #[serde(default)]
    pub recursive: bool,
}

/// Result of `fs.watch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchResult {
    /// The watched directory, absolute.
    pub path: String,
    /// Directories watched now (1 unless `recursive`).
    pub directories: u64,
}

/// Parameters of `fs.unwatch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnwatchParams {
    /// The id of the `fs.watch` request.
    pub target: u64,
}

/// Result of `fs.unwatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnwatchResult {
    /// `false` when no such watch was running.
    pub removed: bool,
}

/// Parameters of `fs.watch_sync`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchSyncParams {
    /// The id of the `fs.watch` request.
    pub target: u64,
}

/// Result of `fs.watch_sync`: answered only after the watch has sent (as events, before this
/// answer on the same stream) every change the kernel had queued when the request came, so a
/// reader who asks after its own change and then reads the watch's events finds it there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchSyncResult {
    /// `false` when no such watch was running (or it ended meanwhile).
    pub synced: bool,
}

/// One event line: the id of the request that started the process or watch, and what happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The id of the `proc.start` or `fs.watch` request.
    pub event: u64,
    /// What happened.
    #[serde(flatten)]
    pub body: EventBody,
}

/// The prefix every serialized [`Event`] starts with (and no response does).
pub const EVENT_PREFIX: &[u8] = b"{\"event\":";

/// What an event says, tagged by `kind`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventBody {
    /// Output of a live process, in the order it was read.
    Data {
        /// Which stream.
        stream: OutputStream,
        /// The bytes, standard base64.
        data: String,
    },
    /// A live process ended; its last event.
    End(ProcessEnd),
    /// A change beneath a watched directory.
    Fs(FsEvent),
    /// A watch stopped (`fs.unwatch`, its directory removed, a failure); its last event.
    WatchEnd {
        /// Why.
        reason: String,
    },
    /// Bytes the server sent on a port connection (`port.open`), within the granted credit.
    PortData {
        /// The bytes, standard base64.
        data: String,
    },
    /// A port connection ended (the server closed it, `port.close`, or a failure); its last
    /// event.
    PortEnd {
        /// Why, when it was not a clean end.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A write stream (`fs.write_stream`) may be sent this many more payload bytes.
    Credit {
        /// The bytes granted.
        bytes: u64,
    },
}

/// An output stream of a live process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    /// Its stdout pipe.
    Stdout,
    /// Its stderr pipe.
    Stderr,
    /// Its terminal (stdout and stderr together).
    Pty,
}

/// How a live process ended. The default is an end nothing is known of (no status, no signal,
/// nothing written): the base of one whose real end was not observed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessEnd {
    /// Exit status when it exited; `null` when a signal ended it (or it was never reaped).
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Bytes it wrote to stdout (or its terminal), forwarded or not.
    pub stdout_bytes: u64,
    /// Bytes it wrote to stderr, forwarded or not.
    pub stderr_bytes: u64,
    /// Which streams went over `max_output_bytes` (the rest was counted, not sent).
    pub truncated: Truncation,
    /// Its `timeout_ms` expired.
    pub timed_out: bool,
    /// Why it ended abnormally (never reaped, the sandbox went away), for humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEvent {
    /// What happened.
    pub op: FsOp,
    /// The entry concerned, absolute (the watched directory itself for `overflow`).
    pub path: String,
    /// The entry is a directory.
    #[serde(default)]
    pub is_dir: bool,
}

/// What happened to an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsOp {
    /// Created, or moved in.
    Create,
    /// Its content changed.
    Write,
    /// Deleted.
    Remove,
    /// Moved away (renamed).
    Rename,
    /// Its permissions, owner or times changed.
    Chmod,
    /// Events were lost (the kernel's queue overflowed, or a new directory was beyond the
    /// watch's bound and is not watched): what is in the directory must be looked at again.
    Overflow,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Op, Request, Response};
    use serde_json::json;

    #[test]
    fn every_event_starts_with_the_prefix_and_no_response_does() {
        let bodies = [
            EventBody::Data {
                stream: OutputStream::Pty,
                data: "aGk=".into(),
            },
            EventBody::End(ProcessEnd {
                exit_code: None,
                signal: Some(9),
                stdout_bytes: 1,
                stderr_bytes: 2,
                truncated: Truncation::default(),
                timed_out: false,
                error: None,
            }),
            EventBody::Fs(FsEvent {
                op: FsOp::Create,
                path: "/workspace/a".into(),
                is_dir: false,
            }),
            EventBody::WatchEnd {
                reason: "removed".into(),
            },
        ];
        for body in bodies {
            let event = Event { event: 7, body };
            let line = serde_json::to_vec(&event).unwrap();
            assert!(
                line.starts_with(EVENT_PREFIX),
                "{}",
                String::from_utf8_lossy(&line)
            );
            assert_eq!(serde_json::from_slice::<Event>(&line).unwrap(), event);
        }
        let response = serde_json::to_vec(&Response::ok(7, json!({"event": 1}))).unwrap();
        assert!(!response.starts_with(EVENT_PREFIX));
    }

    #[test]
    fn events_have_their_documented_shape() {
        let end = Event {
            event: 3,
            body: EventBody::End(ProcessEnd {
                exit_code: Some(0),
                signal: None,
                stdout_bytes: 3,
                stderr_bytes: 0,
                truncated: Truncation::default(),
                timed_out: false,
                error: None,
            }),
        };
        assert_eq!(
            serde_json::to_value(&end).unwrap(),
            json!({"event":3,"kind":"end","exit_code":0,"stdout_bytes":3,"stderr_bytes":0,
                   "truncated":{"stdout":false,"stderr":false},"timed_out":false})
        );
    }

    #[test]
    fn live_requests_parse_and_typos_are_refused() {
        let start: Request = serde_json::from_str(
            r#"{"id":2,"op":"proc.start","argv":["sh"],"tag":"t","stdin":true,"pty":{"cols":80,"rows":24}}"#,
        )
        .unwrap();
        match start.op {
            Op::ProcStart(p) => {
                assert_eq!(p.pty, Some(PtySize { cols: 80, rows: 24 }));
                assert!(p.stdin && p.timeout_ms.is_none());
                assert_eq!(p.exec, ExecGrant::ArgvZero);
            }
            other => panic!("wrong op {other:?}"),
        }
        let live: Request = serde_json::from_str(r#"{"id":3,"op":"proc.live"}"#).unwrap();
        assert_eq!(live.op, Op::ProcLive);
        let signal: Request =
            serde_json::from_str(r#"{"id":4,"op":"proc.signal","pid":9,"signal":"kill"}"#).unwrap();
        assert_eq!(
            signal.op,
            Op::ProcSignal(SignalParams {
                pid: 9,
                signal: ProcessSignal::Kill
            })
        );
        for bad in [
            r#"{"id":1,"op":"proc.start","argv":["sh"],"ptty":{"cols":1,"rows":1}}"#,
            r#"{"id":1,"op":"proc.signal","pid":9,"signal":"hup"}"#,
            r#"{"id":1,"op":"proc.resize","pid":9,"size":{"cols":1}}"#,
            r#"{"id":1,"op":"fs.watch","path":"a","recursve":true}"#,
        ] {
            assert!(serde_json::from_str::<Request>(bad).is_err(), "{bad}");
        }
    }
}
