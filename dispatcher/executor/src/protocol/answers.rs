//! The answers of the protocol: the response line around every result ([`Response`], read by
//! hand), the error kinds a caller can act on ([`ErrorKind`]), the ready line ([`Ready`]) and
//! the result of each operation the request side names.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Encoding, Enforcement};

/// One response line: `{"id":7,"ok":{...}}` or `{"id":7,"error":{"kind":..,"message":..}}`.
///
/// `T` is the result type of the operation that was asked for; a reader that does not know it
/// yet uses the default, [`serde_json::Value`], and converts later.
///
/// Read by hand ([`ResponseVisitor`]) rather than through `#[serde(flatten)]`: a flattened field
/// makes serde buffer the whole line into an intermediate tree first, so every byte of a large
/// result (a file's content, a command's output) was copied once more on the node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Response<T = serde_json::Value> {
    /// The request's `id` ([`UNATTRIBUTED_ID`] for the ready line and unreadable requests).
    pub id: u64,
    /// Either `ok` or `error`.
    #[serde(flatten)]
    pub outcome: Outcome<T>,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Response<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ResponseVisitor(std::marker::PhantomData))
    }
}

/// The keys of a response line (any other is skipped).
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum ResponseKey {
    Id,
    Ok,
    Error,
    #[serde(other)]
    Other,
}

/// Reads `{"id": N, "ok": ...}` or `{"id": N, "error": {...}}` in one pass; other keys are
/// skipped (as the flattened form did), a line with both `ok` and `error`, or neither, is refused.
struct ResponseVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for ResponseVisitor<T> {
    type Value = Response<T>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a response object with `id` and one of `ok` or `error`")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let mut id = None;
        let mut outcome = None;
        while let Some(key) = map.next_key::<ResponseKey>()? {
            match key {
                ResponseKey::Id if id.is_some() => return Err(A::Error::duplicate_field("id")),
                ResponseKey::Id => id = Some(map.next_value()?),
                ResponseKey::Ok | ResponseKey::Error if outcome.is_some() => {
                    return Err(A::Error::custom(
                        "a response carries exactly one of `ok` and `error`",
                    ))
                }
                ResponseKey::Ok => outcome = Some(Outcome::Ok(map.next_value()?)),
                ResponseKey::Error => outcome = Some(Outcome::Error(map.next_value()?)),
                ResponseKey::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(Response {
            id: id.ok_or_else(|| A::Error::missing_field("id"))?,
            outcome: outcome.ok_or_else(|| {
                A::Error::custom("a response carries one of `ok` and `error`; this has neither")
            })?,
        })
    }
}

impl<T> Response<T> {
    /// A success response.
    pub fn ok(id: u64, result: T) -> Self {
        Response {
            id,
            outcome: Outcome::Ok(result),
        }
    }

    /// A failure response.
    pub fn error(id: u64, kind: ErrorKind, message: impl Into<String>) -> Self {
        Response {
            id,
            outcome: Outcome::Error(ErrorBody {
                kind,
                message: message.into(),
            }),
        }
    }

    /// The result, or the error body.
    pub fn into_result(self) -> Result<T, ErrorBody> {
        match self.outcome {
            Outcome::Ok(result) => Ok(result),
            Outcome::Error(body) => Err(body),
        }
    }
}

/// The two shapes of a response, as the key `ok` or `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome<T> {
    /// The operation succeeded (a non-zero exit of `cmd.run` is a success).
    #[serde(rename = "ok")]
    Ok(T),
    /// The operation was refused or failed; nothing was changed unless the message says so.
    #[serde(rename = "error")]
    Error(ErrorBody),
}

/// The body of an error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Machine-readable category.
    pub kind: ErrorKind,
    /// Human-readable explanation naming the path or argument concerned.
    pub message: String,
}

/// Categories of failure. New kinds may be added; readers should map unknown ones to
/// [`ErrorKind::Unknown`] (which serde does for them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Malformed line, unknown op, bad parameter, invalid path syntax.
    InvalidRequest,
    /// The path lies outside the allowed roots, escapes them through `..` or a symlink, or is a
    /// root that may not be deleted.
    PathNotAllowed,
    /// The path (or a parent) does not exist.
    NotFound,
    /// Something already exists where a directory was to be created.
    AlreadyExists,
    /// A path component, or the target, is not a directory.
    NotADirectory,
    /// The target is a directory where a file was expected.
    IsADirectory,
    /// The target is neither a regular file nor a directory (FIFO, socket, device).
    NotARegularFile,
    /// A directory is not empty and `recursive` was not set.
    DirectoryNotEmpty,
    /// Content exceeds `max_file_bytes`.
    TooLarge,
    /// The filesystem is full (the workspace has a size limit).
    NoSpace,
    /// The file to be written has more than one hard link.
    HardLinkRefused,
    /// The edit's `old_string` does not occur.
    EditTargetNotFound,
    /// The edit's `old_string` occurs more than once.
    EditTargetAmbiguous,
    /// The sandbox user lacks permission.
    PermissionDenied,
    /// The program was found but could not be started.
    SpawnFailed,
    /// `argv[0]` is not in the configured `PATH`.
    CommandNotFound,
    /// Too many requests are in flight; retry later.
    Busy,
    /// A bound of the sandbox is reached (live processes, watches); the message names it.
    LimitReached,
    /// Another I/O failure; the message carries the OS error.
    Io,
    /// A bug in the executor (a handler panicked).
    Internal,
    /// A kind this version of the protocol types does not know.
    #[serde(other)]
    Unknown,
}

impl ErrorKind {
    /// The wire name, e.g. `"path_not_allowed"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::PathNotAllowed => "path_not_allowed",
            ErrorKind::NotFound => "not_found",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::NotADirectory => "not_a_directory",
            ErrorKind::IsADirectory => "is_a_directory",
            ErrorKind::NotARegularFile => "not_a_regular_file",
            ErrorKind::DirectoryNotEmpty => "directory_not_empty",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::HardLinkRefused => "hard_link_refused",
            ErrorKind::EditTargetNotFound => "edit_target_not_found",
            ErrorKind::EditTargetAmbiguous => "edit_target_ambiguous",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::SpawnFailed => "spawn_failed",
            ErrorKind::CommandNotFound => "command_not_found",
            ErrorKind::Busy => "busy",
            ErrorKind::LimitReached => "limit_reached",
            ErrorKind::Io => "io",
            ErrorKind::Internal => "internal",
            ErrorKind::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The ready line's result: `{"ready":true,"version":"0.1.0","protocol":1,"pid":1}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    /// Always `true`.
    pub ready: bool,
    /// The executor's package version.
    pub version: String,
    /// [`PROTOCOL_VERSION`] of the executor.
    pub protocol: u32,
    /// The executor's pid in its namespace (1 when it is the container's entrypoint).
    pub pid: u32,
    /// The kernel's Landlock ABI as seen inside the sandbox (0: no Landlock); what commands
    /// are confined with depends on it.
    #[serde(default)]
    pub landlock_abi: u32,
    /// The executor listens on its socket (`channel_dir` was configured and usable): the node
    /// may connect there instead of using the attach stream.
    #[serde(default)]
    pub channel: bool,
    /// What keeps requested paths beneath their roots in this sandbox.
    #[serde(default)]
    pub path_rules: PathRules,
}

/// The mechanism of the path rules: the kernel's `openat2(RESOLVE_BENEATH)`, or the executor's
/// own walk with `O_NOFOLLOW` beneath held descriptors where the kernel lacks it (gVisor).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PathRules {
    /// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`.
    #[default]
    Openat2,
    /// The userspace walk (`beneath.rs`).
    Walk,
}

/// The empty result of `ping`: `{}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Empty {}

/// Result of `fs.read`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadResult {
    /// The content returned, encoded as `encoding` says.
    pub content: String,
    /// `utf8` when the returned bytes are valid UTF-8, else `base64`.
    pub encoding: Encoding,
    /// Size of the whole file in bytes.
    pub size_bytes: u64,
    /// Number of lines returned; present only in line mode (`offset` or `limit` given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines_read: Option<u64>,
    /// `true` when the file holds more content after what was returned.
    pub truncated: bool,
}

/// Result of `fs.write`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteResult {
    /// Bytes written (the decoded content length).
    pub bytes_written: u64,
    /// `true` when the file did not exist before.
    pub created: bool,
}

/// The type of a directory entry, not following symlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryType {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (not followed).
    Symlink,
    /// A FIFO, socket or device.
    Other,
}

/// One entry of `fs.list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListEntry {
    /// The entry's name (not a path).
    pub name: String,
    /// Its type.
    #[serde(rename = "type")]
    pub entry_type: EntryType,
    /// Size in bytes for regular files; 0 for everything else.
    pub size_bytes: u64,
    /// Its permission bits (`st_mode & 0o7777`); absent when it could not be read (removed
    /// meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// Its last modification, in nanoseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_ns: Option<i64>,
    /// The size the inode itself reports (`st_size`), for every type: a directory's is the
    /// space its entries take, a symlink's the length of its target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inode_size: Option<u64>,
    /// A symlink's target as stored, not followed (lossy UTF-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_target: Option<String>,
    /// A regular file's user metadata ([`METADATA_XATTR_PREFIX`]), by key; empty when it has
    /// none or it could not be read.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// Result of `fs.list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListResult {
    /// Entries sorted by name, without `.` and `..`.
    pub entries: Vec<ListEntry>,
    /// `true` when the directory had more entries than the executor returns (10000).
    pub truncated: bool,
}

/// Result of `fs.create_dir`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateDirResult {
    /// `false` when the directory already existed.
    pub created: bool,
}

/// Result of `fs.delete`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteResult {
    /// Always `true`.
    pub deleted: bool,
}

/// Result of `fs.edit` and `fs.multi_edit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EditResult {
    /// Number of replacements made (1 for `fs.edit`, the number of edits for `fs.multi_edit`).
    pub replacements: u64,
}

/// One matching line of `fs.grep`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepMatch {
    /// Absolute path of the file.
    pub file: String,
    /// 1-based line number.
    pub line: u64,
    /// The line without its newline, lossily decoded, cut to 2000 bytes.
    pub text: String,
}

/// Result of `fs.grep`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepResult {
    /// Matches in path order, then line order.
    pub matches: Vec<GrepMatch>,
    /// `true` when a bound stopped the search early or cut a file short.
    pub truncated: bool,
    /// Number of files whose content was searched.
    pub files_scanned: u64,
    /// The time limit stopped the search (the matches found so far are returned).
    #[serde(default)]
    pub timed_out: bool,
}

/// Result of `fs.glob`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobResult {
    /// Absolute paths of matching entries (files, directories, symlinks), sorted.
    pub matches: Vec<String>,
    /// `true` when a bound stopped the walk early.
    pub truncated: bool,
}

/// Which output streams were cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Truncation {
    /// stdout produced more than `max_stdout_bytes`.
    pub stdout: bool,
    /// stderr produced more than `max_stderr_bytes`.
    pub stderr: bool,
}

/// Result of `cmd.run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResult {
    /// Exit status when the process exited; `null` when a signal ended it.
    pub exit_code: Option<i32>,
    /// Number of the signal that ended the process, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The kept stdout bytes, encoded as `stdout_encoding` says.
    pub stdout: String,
    /// `utf8` or `base64`.
    pub stdout_encoding: Encoding,
    /// The kept stderr bytes, encoded as `stderr_encoding` says.
    pub stderr: String,
    /// `utf8` or `base64`.
    pub stderr_encoding: Encoding,
    /// Total bytes the process wrote to stdout (kept or not).
    pub stdout_bytes: u64,
    /// Total bytes the process wrote to stderr (kept or not).
    pub stderr_bytes: u64,
    /// Which streams were cut.
    pub truncated: Truncation,
    /// Wall-clock time from spawn to result.
    pub duration_ms: u64,
    /// The timeout expired and the process group was signalled.
    pub timed_out: bool,
    /// A `cancel` request ended the process group.
    pub cancelled: bool,
    /// What the kernel enforced of the command's policy (execute, write, connect, signals).
    #[serde(default)]
    pub landlock: Enforcement,
}

/// Result of `cancel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelResult {
    /// `true` when a running `cmd.run` with that id was found and is being stopped.
    pub cancelled: bool,
}

/// What a listed process is to the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessRole {
    /// Started (directly or not) by a command.
    Command,
    /// The executor itself (PID 1).
    Executor,
    /// A per-command sub-reaper (the executor binary in `--supervise` mode).
    SubReaper,
}

/// One process of `proc.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Pid in the sandbox's pid namespace.
    pub pid: u32,
    /// Parent pid.
    pub ppid: u32,
    /// The kernel's short name (`comm`, at most 15 bytes).
    pub name: String,
    /// The command line, arguments joined by spaces (empty for zombies).
    pub command: String,
    /// Real uid.
    pub uid: u32,
    /// One-letter kernel state (`R`, `S`, `Z`, ...).
    pub state: String,
    /// CPU time used (user + system), milliseconds.
    pub cpu_time_ms: u64,
    /// `cpu_time_ms` over the process's lifetime, percent of one core (a lifetime average, not
    /// an instantaneous sample).
    pub cpu_percent: f64,
    /// Resident set size, bytes.
    pub memory_rss_bytes: u64,
    /// TCP ports (IPv4 and IPv6) the process listens on, ascending.
    pub listening_ports: Vec<u16>,
    /// What the process is.
    pub role: ProcessRole,
}

/// Result of `proc.list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcListResult {
    /// Matching processes by pid, at most `limit`.
    pub processes: Vec<ProcessInfo>,
    /// Number of processes that matched the filters.
    pub total: u64,
    /// Number of processes examined (after `include_internal`).
    pub scanned: u64,
    /// `true` when more processes matched than were returned.
    pub truncated: bool,
}

/// Result of `logs.read`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogsReadResult {
    /// The selected lines (or fields), oldest first, lossily decoded, each cut to 8 KiB.
    pub lines: Vec<String>,
    /// Lines examined, from the end of the file backwards.
    pub lines_scanned: u64,
    /// Examined lines that passed the filter (and had the JSON field, when one was asked for).
    pub lines_matched: u64,
    /// Lines returned.
    pub lines_returned: u64,
    /// Filtered lines left out because they were not JSON or lacked `json_field`.
    pub json_missing: u64,
    /// `true` when the file holds earlier lines that were not examined, or a bound cut the result.
    pub truncated: bool,
    /// Size of the file, bytes.
    pub size_bytes: u64,
}

/// Result of `env.get`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvGetResult {
    /// Variables by name; masked values read `***MASKED***`.
    pub variables: BTreeMap<String, String>,
    /// Names whose values were masked, sorted.
    pub masked: Vec<String>,
    /// Requested `keys` that are not defined, sorted.
    pub missing: Vec<String>,
    /// `environment` or the `.env` file's absolute path.
    pub source: String,
}
