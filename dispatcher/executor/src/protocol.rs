//! The wire protocol between the dispatcher and the in-container executor.
//!
//! This module is the contract. It compiles with only `serde` and `serde_json` (no syscalls), so
//! the dispatcher depends on this package with `default-features = false` and uses these types to
//! speak to the executor; the executor uses the same types, so the two sides cannot drift apart.
//!
//! The stream is newline-delimited JSON: one [`Request`] per line on the executor's stdin, one
//! [`Response`] per line on its stdout. Requests carry a caller-chosen `id` (`>= 1`); responses
//! carry the same `id` and may arrive in any order, because every request runs on its own thread.
//! Before reading anything the executor writes `{"id":0,"ok":{"ready":true,...}}` ([`Ready`]).
//! `README.md` beside `Cargo.toml` describes every operation's semantics in prose.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

mod answers;
mod live;
mod port;
mod transfer;
pub use answers::*;
pub use live::*;
pub use port::*;
pub use transfer::*;

/// Version of this protocol; bumped on any incompatible change. Reported in [`Ready`].
pub const PROTOCOL_VERSION: u32 = 1;

/// The `id` of the ready line, and of error responses to lines whose `id` could not be read.
pub const UNATTRIBUTED_ID: u64 = 0;

/// One request line: `{"id": 7, "op": "fs.read", "path": "src/main.rs"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Caller-chosen identifier, unique among requests in flight, `>= 1`.
    pub id: u64,
    /// The operation and its parameters, flattened beside `id`.
    #[serde(flatten)]
    pub op: Op,
}

/// The operations, tagged by `op`; parameters sit beside the tag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op")]
pub enum Op {
    /// Liveness check; answers `{}` ([`Empty`]).
    #[serde(rename = "ping")]
    Ping,
    /// Read a file ([`ReadResult`]).
    #[serde(rename = "fs.read")]
    FsRead(ReadParams),
    /// Write a whole file ([`WriteResult`]).
    #[serde(rename = "fs.write")]
    FsWrite(WriteParams),
    /// List a directory ([`ListResult`]).
    #[serde(rename = "fs.list")]
    FsList(PathParams),
    /// Create a directory and its missing parents ([`CreateDirResult`]).
    #[serde(rename = "fs.create_dir")]
    FsCreateDir(PathParams),
    /// Delete a file, symlink or directory ([`DeleteResult`]).
    #[serde(rename = "fs.delete")]
    FsDelete(DeleteParams),
    /// Replace one exact occurrence of a string ([`EditResult`]).
    #[serde(rename = "fs.edit")]
    FsEdit(EditParams),
    /// Apply several edits in order, all or nothing ([`EditResult`]).
    #[serde(rename = "fs.multi_edit")]
    FsMultiEdit(MultiEditParams),
    /// Search file contents with a regular expression ([`GrepResult`]).
    #[serde(rename = "fs.grep")]
    FsGrep(GrepParams),
    /// Find paths matching a glob ([`GlobResult`]).
    #[serde(rename = "fs.glob")]
    FsGlob(GlobParams),
    /// Run a program without a shell ([`RunResult`]).
    #[serde(rename = "cmd.run")]
    CmdRun(RunParams),
    /// Cancel a running `cmd.run` ([`CancelResult`]).
    #[serde(rename = "cancel")]
    Cancel(CancelParams),
    /// List the sandbox's processes ([`ProcListResult`]).
    #[serde(rename = "proc.list")]
    ProcList(ProcListParams),
    /// The filtered tail of a log file ([`LogsReadResult`]).
    #[serde(rename = "logs.read")]
    LogsRead(LogsReadParams),
    /// The commands' environment or a `.env` file, secrets masked ([`EnvGetResult`]).
    #[serde(rename = "env.get")]
    EnvGet(EnvGetParams),
    /// Start a live process; answers its pid, then sends events ([`StartResult`]).
    #[serde(rename = "proc.start")]
    ProcStart(StartParams),
    /// Write to a live process's stdin or terminal ([`InputResult`]).
    #[serde(rename = "proc.input")]
    ProcInput(InputParams),
    /// Close a live process's stdin pipe ([`Empty`]).
    #[serde(rename = "proc.close_stdin")]
    ProcCloseStdin(ProcTarget),
    /// Signal a live process ([`Empty`]).
    #[serde(rename = "proc.signal")]
    ProcSignal(SignalParams),
    /// Resize a live process's terminal ([`Empty`]).
    #[serde(rename = "proc.resize")]
    ProcResize(ResizeParams),
    /// List the live processes ([`LiveListResult`]).
    #[serde(rename = "proc.live")]
    ProcLive,
    /// Watch a directory; answers at once, then sends events ([`WatchResult`]).
    #[serde(rename = "fs.watch")]
    FsWatch(WatchParams),
    /// Stop a watch ([`UnwatchResult`]).
    #[serde(rename = "fs.unwatch")]
    FsUnwatch(UnwatchParams),
    /// Wait until a watch has sent every change queued so far ([`WatchSyncResult`]).
    #[serde(rename = "fs.watch_sync")]
    FsWatchSync(WatchSyncParams),
    /// Open a TCP connection to a port inside the sandbox; answers at once, then sends its
    /// bytes as events ([`PortOpenResult`]).
    #[serde(rename = "port.open")]
    PortOpen(PortOpenParams),
    /// Send bytes on a port connection ([`Empty`]).
    #[serde(rename = "port.write")]
    PortWrite(PortWriteParams),
    /// Grant a port connection more credit for its events ([`Empty`]).
    #[serde(rename = "port.ack")]
    PortAck(PortAckParams),
    /// Half-close or close a port connection ([`Empty`]).
    #[serde(rename = "port.close")]
    PortClose(PortCloseParams),
    /// Replace a file with the bytes of the blocks that follow ([`WriteResult`]; `transfer.rs`).
    #[serde(rename = "fs.write_stream")]
    FsWriteStream(WriteStreamParams),
    /// Send a file as blocks, then answer ([`ReadStreamResult`]; `transfer.rs`).
    #[serde(rename = "fs.read_stream")]
    FsReadStream(PathParams),
    /// Grant a read stream more credit ([`Empty`]; answered inline).
    #[serde(rename = "fs.stream_ack")]
    FsStreamAck(StreamAckParams),
}

impl Op {
    /// Who the operation runs as (the sandbox user for operations without a `user`).
    pub fn user(&self) -> RunAs {
        match self {
            Op::FsRead(p) => p.user,
            Op::FsWrite(p) => p.user,
            Op::FsList(p) | Op::FsCreateDir(p) | Op::FsReadStream(p) => p.user,
            Op::FsDelete(p) => p.user,
            Op::CmdRun(p) => p.user,
            Op::ProcStart(p) => p.user,
            Op::FsWriteStream(p) => p.user,
            _ => RunAs::User,
        }
    }

    /// The wire name of the operation (`"fs.read"`), for logs and messages.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Ping => "ping",
            Op::FsRead(_) => "fs.read",
            Op::FsWrite(_) => "fs.write",
            Op::FsList(_) => "fs.list",
            Op::FsCreateDir(_) => "fs.create_dir",
            Op::FsDelete(_) => "fs.delete",
            Op::FsEdit(_) => "fs.edit",
            Op::FsMultiEdit(_) => "fs.multi_edit",
            Op::FsGrep(_) => "fs.grep",
            Op::FsGlob(_) => "fs.glob",
            Op::CmdRun(_) => "cmd.run",
            Op::Cancel(_) => "cancel",
            Op::ProcList(_) => "proc.list",
            Op::LogsRead(_) => "logs.read",
            Op::EnvGet(_) => "env.get",
            Op::ProcStart(_) => "proc.start",
            Op::ProcInput(_) => "proc.input",
            Op::ProcCloseStdin(_) => "proc.close_stdin",
            Op::ProcSignal(_) => "proc.signal",
            Op::ProcResize(_) => "proc.resize",
            Op::ProcLive => "proc.live",
            Op::FsWatch(_) => "fs.watch",
            Op::FsUnwatch(_) => "fs.unwatch",
            Op::FsWatchSync(_) => "fs.watch_sync",
            Op::PortOpen(_) => "port.open",
            Op::PortWrite(_) => "port.write",
            Op::PortAck(_) => "port.ack",
            Op::PortClose(_) => "port.close",
            Op::FsWriteStream(_) => "fs.write_stream",
            Op::FsReadStream(_) => "fs.read_stream",
            Op::FsStreamAck(_) => "fs.stream_ack",
        }
    }
}

/// How bytes are carried in a JSON string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// The string is the text itself (the bytes were valid UTF-8).
    #[default]
    Utf8,
    /// The string is standard base64 (RFC 4648, with padding) of the raw bytes.
    Base64,
}

/// Parameters of operations that take only a path (`fs.list`, `fs.create_dir`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathParams {
    /// Absolute path under an allowed root, or a path relative to the workspace.
    pub path: String,
    /// Who performs it: the sandbox user (default) or root, which only an executor whose
    /// config has `allow_root` accepts (gVisor-class sandboxes that asked for it).
    #[serde(default, skip_serializing_if = "RunAs::is_user")]
    pub user: RunAs,
}

/// Parameters of `fs.read`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadParams {
    /// The file to read.
    pub path: String,
    /// Number of lines to skip before the returned content (line mode when set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Maximum number of lines to return (line mode when set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Maximum bytes of content to return; capped by the executor's `max_file_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Byte mode: the bytes from this offset on, exactly (never cut at a character), so a
    /// file of any size is read in chunks of at most `max_bytes`; not with `offset`/`limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub byte_offset: Option<u64>,
    /// Who performs it: the sandbox user (default) or root, which only an executor whose
    /// config has `allow_root` accepts (gVisor-class sandboxes that asked for it).
    #[serde(default, skip_serializing_if = "RunAs::is_user")]
    pub user: RunAs,
}

/// Parameters of `fs.write`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteParams {
    /// The file to create or replace.
    pub path: String,
    /// The whole new content, encoded as `encoding` says.
    pub content: String,
    /// How `content` is encoded; default `utf8`.
    #[serde(default)]
    pub encoding: Encoding,
    /// Create missing parent directories; default `true`.
    #[serde(default = "default_true")]
    pub create_dirs: bool,
    /// Add `content` at the end of an existing regular file instead of replacing it (a file
    /// written in chunks); default `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub append: bool,
    /// User metadata kept with the file as extended attributes `user.e2b.<key>` (E2B's file
    /// metadata): a replaced file has exactly these (none of the old), an appended one gets
    /// these added. See [`METADATA_XATTR_PREFIX`] for the bounds.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Who performs it: the sandbox user (default) or root, which only an executor whose
    /// config has `allow_root` accepts (gVisor-class sandboxes that asked for it).
    #[serde(default, skip_serializing_if = "RunAs::is_user")]
    pub user: RunAs,
}

/// The extended attribute namespace of a file's user metadata (`fs.write` `metadata`, `fs.list`
/// `metadata`): `user.e2b.<key>`, where E2B's envd keeps it, so what a program in the sandbox
/// sets there is metadata too. Keys are 1 to [`MAX_METADATA_KEY_BYTES`] bytes without NUL,
/// values text without NUL, at most [`MAX_METADATA_BYTES`] of names and values in all.
pub const METADATA_XATTR_PREFIX: &str = "user.e2b.";
/// Longest metadata key: the xattr name limit (255) less the namespace.
pub const MAX_METADATA_KEY_BYTES: usize = 246;
/// Most bytes of one file's metadata, attribute names and values together.
pub const MAX_METADATA_BYTES: usize = 4096;

/// Parameters of `fs.delete`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteParams {
    /// The file, symlink or directory to delete (a symlink is deleted, never followed).
    pub path: String,
    /// Delete a non-empty directory with everything in it; default `false`.
    #[serde(default)]
    pub recursive: bool,
    /// Who performs it: the sandbox user (default) or root, which only an executor whose
    /// config has `allow_root` accepts (gVisor-class sandboxes that asked for it).
    #[serde(default, skip_serializing_if = "RunAs::is_user")]
    pub user: RunAs,
}

/// One exact-string replacement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    /// Text that must occur exactly once in the file (non-empty).
    pub old_string: String,
    /// Text that replaces it.
    pub new_string: String,
}

/// Parameters of `fs.edit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EditParams {
    /// The UTF-8 text file to edit.
    pub path: String,
    /// Text that must occur exactly once in the file (non-empty).
    pub old_string: String,
    /// Text that replaces it.
    pub new_string: String,
}

/// Parameters of `fs.multi_edit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MultiEditParams {
    /// The UTF-8 text file to edit.
    pub path: String,
    /// Edits applied in order, each to the result of the previous one.
    pub edits: Vec<Edit>,
}

/// Parameters of `fs.grep`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrepParams {
    /// A `regex`-crate pattern (linear time; no backreferences or look-around).
    pub pattern: String,
    /// A directory to search recursively, or a single file.
    pub path: String,
    /// Only files whose path relative to `path` (or, for a pattern without `/`, whose name)
    /// matches this glob.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include: Option<String>,
    /// Stop after this many matching lines; default 1000, at most 10000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_matches: Option<u64>,
    /// Search only this many leading bytes of each file; default 1 MiB, at most `max_file_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes_per_file: Option<u64>,
    /// Match case-insensitively; default `false`.
    #[serde(default)]
    pub case_insensitive: bool,
    /// Stop searching after this long (the result says `timed_out`); default and ceiling 30000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// Parameters of `fs.glob`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobParams {
    /// A relative glob (`**/*.rs`); `*` does not cross `/`, `**` does.
    pub pattern: String,
    /// The directory the pattern is relative to; default the workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Stop after this many matches; default 1000, at most 10000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_matches: Option<u64>,
}

/// Parameters of `cmd.run`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunParams {
    /// Program and arguments; `argv[0]` is a bare name looked up in the configured `PATH`.
    pub argv: Vec<String>,
    /// Working directory; default the workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Extra environment variables, added after `PATH`, `HOME` and `LANG`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Wall-clock limit; on expiry the process group gets SIGTERM, then SIGKILL after `grace_ms`.
    pub timeout_ms: u64,
    /// Delay between SIGTERM and SIGKILL on timeout or cancel; default 2000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_ms: Option<u64>,
    /// Bytes of stdout kept; the rest is drained and counted.
    pub max_stdout_bytes: u64,
    /// Bytes of stderr kept; the rest is drained and counted.
    pub max_stderr_bytes: u64,
    /// Programs the command and every process it starts may execute, enforced by the kernel
    /// (Landlock) in addition to the `argv[0]` lookup; default: `argv[0]` alone.
    #[serde(default, skip_serializing_if = "ExecGrant::is_default")]
    pub exec: ExecGrant,
    /// Who the command runs as: the sandbox user (default), or root where the executor's
    /// config has `allow_root` (uid 0 with [`ROOT_CAPABILITIES`]).
    #[serde(default, skip_serializing_if = "RunAs::is_user")]
    pub user: RunAs,
}

/// Which programs a command (and all its descendants) may execute. The kernel enforces it: an
/// option of a listed program that runs another program (`tar --checkpoint-action=exec=sh`)
/// fails with `EACCES` unless that program is granted too.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecGrant {
    /// Only the program `argv[0]` names (and the dynamic loader it needs).
    #[default]
    ArgvZero,
    /// These bare names, each looked up in the configured `PATH` like `argv[0]`, plus `argv[0]`.
    Only(Vec<String>),
    /// Any program: execution is not restricted (writes, connects and signals still are).
    Any,
}

impl ExecGrant {
    /// True for the default grant (so it is left out of serialized requests).
    pub fn is_default(&self) -> bool {
        *self == ExecGrant::ArgvZero
    }
}

/// How much of the kernel-held policy the kernel enforced for one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    /// Every rule (execute, write, TCP connect, signal and abstract-socket scoping).
    Full,
    /// Some rules: the kernel's Landlock ABI lacks the newer ones (the ready line gives the ABI).
    Partial,
    /// None: the kernel has no Landlock and the sandbox was configured to run without it.
    #[default]
    None,
}

/// Parameters of `cancel`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelParams {
    /// The `id` of the `cmd.run` request to cancel.
    pub target: u64,
}

/// Parameters of `proc.list`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcListParams {
    /// Only processes whose name or command line contains this (case-insensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Only processes listening on this TCP port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Most processes returned; default 50, at most 200.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Also list the executor and its per-command sub-reapers (marked by `role`); default false.
    #[serde(default)]
    pub include_internal: bool,
}

/// Parameters of `logs.read`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsReadParams {
    /// The log file (under a read root).
    pub path: String,
    /// How many matching lines to return from the end; default 100, at most 5000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<u64>,
    /// Keep only lines containing this text (or matching it, with `regex`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Treat `filter` as a `regex`-crate pattern (linear time); default false (literal).
    #[serde(default)]
    pub regex: bool,
    /// Return this dot-path field (`a.b.0.c`) of each line parsed as JSON instead of the line;
    /// lines that are not JSON or lack the field are left out (and counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_field: Option<String>,
}

/// Parameters of `env.get`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvGetParams {
    /// A `.env` file (under a read root); absent: the environment commands get.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Only these variables; absent: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,
    /// Return secret-looking values as they are; the caller decides whether that is allowed.
    #[serde(default)]
    pub unmask: bool,
}

pub(crate) fn default_true() -> bool {
    true
}

/// Who performs a command or file operation.
///
/// Root exists only inside sandboxes whose kernel is not the host's (the gVisor class): there
/// uid 0 and its capabilities act on gVisor's kernel, which is the boundary, while in a
/// container-class sandbox they would act on the host's kernel. The executor refuses
/// [`RunAs::Root`] unless its config has `allow_root`, which the dispatcher sets only for
/// gVisor-class sandboxes whose spec asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunAs {
    /// The sandbox user (the executor's `uid`/`gid`), without capabilities.
    #[default]
    User,
    /// uid and gid 0 with [`ROOT_CAPABILITIES`] and nothing else.
    Root,
}

impl RunAs {
    /// True for the sandbox user (the default, left out of serialized requests).
    pub fn is_user(&self) -> bool {
        *self == RunAs::User
    }
}

/// The capabilities a root command (and a root file operation) has, by name: Docker's default
/// set for a root container less `MKNOD` (device nodes), `NET_RAW` (raw sockets past the
/// egress proxy), `SETFCAP` and `SETPCAP` (file capabilities and the bounding set). Nothing
/// that reaches past the sandbox's mounts or network: no `SYS_ADMIN` (mount), `SYS_PTRACE`
/// (the executor is not dumpable), `SYS_MODULE`, `NET_ADMIN` or `DAC_READ_SEARCH`.
pub const ROOT_CAPABILITIES: [&str; 10] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "AUDIT_WRITE",
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(line: &str) -> Request {
        serde_json::from_str(line).unwrap()
    }

    #[test]
    fn the_user_is_the_sandbox_user_unless_root_is_named() {
        let run = parse(
            r#"{"id":1,"op":"cmd.run","argv":["id"],"timeout_ms":1,"max_stdout_bytes":1,"max_stderr_bytes":1}"#,
        );
        assert_eq!(run.op.user(), RunAs::User);
        assert!(
            !serde_json::to_string(&run).unwrap().contains("user"),
            "the default is left out of the line"
        );
        let root = parse(
            r#"{"id":2,"op":"cmd.run","argv":["id"],"timeout_ms":1,"max_stdout_bytes":1,"max_stderr_bytes":1,"user":"root"}"#,
        );
        assert_eq!(root.op.user(), RunAs::Root);
        assert!(serde_json::to_string(&root)
            .unwrap()
            .contains(r#""user":"root""#));
        for line in [
            r#"{"id":3,"op":"proc.start","argv":["sh"],"user":"root"}"#,
            r#"{"id":4,"op":"fs.write","path":"a","content":"x","user":"root"}"#,
            r#"{"id":5,"op":"fs.write_stream","path":"a","user":"root"}"#,
            r#"{"id":6,"op":"fs.read","path":"a","user":"root"}"#,
            r#"{"id":7,"op":"fs.read_stream","path":"a","user":"root"}"#,
            r#"{"id":8,"op":"fs.list","path":"a","user":"root"}"#,
            r#"{"id":9,"op":"fs.create_dir","path":"a","user":"root"}"#,
            r#"{"id":10,"op":"fs.delete","path":"a","user":"root"}"#,
        ] {
            assert_eq!(parse(line).op.user(), RunAs::Root, "{line}");
        }
        // Only the two names; and only where an operation takes a user.
        for line in [
            r#"{"id":11,"op":"fs.write","path":"a","content":"x","user":"admin"}"#,
            r#"{"id":12,"op":"fs.write","path":"a","content":"x","user":0}"#,
            r#"{"id":13,"op":"fs.edit","path":"a","old_string":"x","new_string":"y","user":"root"}"#,
            r#"{"id":14,"op":"proc.signal","pid":1,"signal":"kill","user":"root"}"#,
        ] {
            assert!(
                serde_json::from_str::<Request>(line).is_err(),
                "{line} must be refused"
            );
        }
    }

    #[test]
    fn requests_parse_with_flattened_params() {
        assert_eq!(
            parse(r#"{"id":1,"op":"ping"}"#),
            Request {
                id: 1,
                op: Op::Ping
            }
        );
        let req = parse(r#"{"id":2,"op":"fs.read","path":"a.txt","limit":10}"#);
        assert_eq!(
            req.op,
            Op::FsRead(ReadParams {
                path: "a.txt".into(),
                limit: Some(10),
                ..ReadParams::default()
            })
        );
        let req =
            parse(r#"{"id":3,"op":"fs.write","path":"b","content":"aGk=","encoding":"base64"}"#);
        match req.op {
            Op::FsWrite(p) => {
                assert_eq!(p.encoding, Encoding::Base64);
                assert!(p.create_dirs, "create_dirs defaults to true");
            }
            other => panic!("wrong op {other:?}"),
        }
        let req = parse(
            r#"{"id":4,"op":"cmd.run","argv":["id","-u"],"timeout_ms":1000,
                "max_stdout_bytes":10,"max_stderr_bytes":10,"env":{"A":"b"}}"#,
        );
        match req.op {
            Op::CmdRun(p) => {
                assert_eq!(p.argv, vec!["id", "-u"]);
                assert_eq!(p.env.get("A").map(String::as_str), Some("b"));
                assert_eq!(p.grace_ms, None);
            }
            other => panic!("wrong op {other:?}"),
        }
    }

    #[test]
    fn unknown_ops_and_fields_are_refused() {
        assert!(serde_json::from_str::<Request>(r#"{"id":1,"op":"fs.nope","path":"a"}"#).is_err());
        assert!(serde_json::from_str::<Request>(
            r#"{"id":1,"op":"fs.delete","path":"a","recursve":true}"#
        )
        .is_err());
        assert!(serde_json::from_str::<Request>(r#"{"id":1,"op":"fs.list"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"ping"}"#).is_err());
    }

    #[test]
    fn requests_round_trip() {
        let req = Request {
            id: 9,
            op: Op::FsMultiEdit(MultiEditParams {
                path: "x".into(),
                edits: vec![Edit {
                    old_string: "a".into(),
                    new_string: "b".into(),
                }],
            }),
        };
        let line = serde_json::to_string(&req).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&line).unwrap(),
            json!({"id":9,"op":"fs.multi_edit","path":"x","edits":[{"old_string":"a","new_string":"b"}]})
        );
        assert_eq!(parse(&line), req);
    }

    #[test]
    fn responses_have_ok_or_error_beside_id() {
        let ok = Response::ok(5, CreateDirResult { created: true });
        assert_eq!(
            serde_json::to_value(&ok).unwrap(),
            json!({"id":5,"ok":{"created":true}})
        );
        let err: Response<Empty> = Response::error(6, ErrorKind::PathNotAllowed, "nope");
        assert_eq!(
            serde_json::to_value(&err).unwrap(),
            json!({"id":6,"error":{"kind":"path_not_allowed","message":"nope"}})
        );
        let back: Response =
            serde_json::from_str(r#"{"id":6,"error":{"kind":"brand_new","message":"m"}}"#).unwrap();
        assert_eq!(back.into_result().unwrap_err().kind, ErrorKind::Unknown);
        let typed: Response<ListResult> = serde_json::from_str(
            r#"{"id":7,"ok":{"entries":[{"name":"a","type":"symlink","size_bytes":0}],"truncated":false}}"#,
        )
        .unwrap();
        let list = typed.into_result().unwrap();
        assert_eq!(list.entries[0].entry_type, EntryType::Symlink);
    }

    #[test]
    fn responses_are_read_in_one_pass_and_refuse_ambiguity() {
        // Key order does not matter, unknown keys are skipped, `null` is a result like any other.
        let back: Response = serde_json::from_str(r#"{"ok":null,"extra":[1],"id":3}"#).unwrap();
        assert_eq!(back, Response::ok(3, serde_json::Value::Null));
        // An escaped key is still the key.
        let back: Response = serde_json::from_str(r#"{"\u0069d":4,"ok":{}}"#).unwrap();
        assert_eq!(back.id, 4);
        for (line, why) in [
            (
                r#"{"id":1,"ok":{},"error":{"kind":"io","message":"m"}}"#,
                "exactly one",
            ),
            (r#"{"id":1}"#, "neither"),
            (r#"{"ok":{}}"#, "missing field `id`"),
            (r#"{"id":1,"id":2,"ok":{}}"#, "duplicate field `id`"),
            (r#"{"id":-1,"ok":{}}"#, "invalid value"),
            (r#"[1,2]"#, "invalid type"),
        ] {
            let err = serde_json::from_str::<Response>(line)
                .unwrap_err()
                .to_string();
            assert!(err.contains(why), "{line}: {err}");
        }
    }

    #[test]
    fn error_kind_names_match_serde() {
        for kind in [
            ErrorKind::InvalidRequest,
            ErrorKind::HardLinkRefused,
            ErrorKind::EditTargetAmbiguous,
            ErrorKind::CommandNotFound,
            ErrorKind::NotARegularFile,
        ] {
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::String(kind.as_str().to_string())
            );
        }
    }

    #[test]
    fn run_result_omits_absent_signal() {
        let r = RunResult {
            exit_code: Some(0),
            signal: None,
            stdout: "hi\n".into(),
            stdout_encoding: Encoding::Utf8,
            stderr: String::new(),
            stderr_encoding: Encoding::Utf8,
            stdout_bytes: 3,
            stderr_bytes: 0,
            truncated: Truncation::default(),
            duration_ms: 1,
            timed_out: false,
            cancelled: false,
            landlock: Enforcement::Full,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert!(v.get("signal").is_none());
        assert_eq!(v["truncated"], json!({"stdout":false,"stderr":false}));
        assert_eq!(v["stdout_encoding"], json!("utf8"));
    }
}
