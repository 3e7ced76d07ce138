//! The smaller bodies of the control API: timeouts and refreshes, connect and resume, pause,
//! snapshots, forks, network updates, metrics and logs.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ApiError as E};
use super::sandbox::Sandbox;

/// Longest refresh the API accepts, in seconds.
pub const MAX_REFRESH_SECS: u32 = 3600;
/// Most forks one request may ask for.
pub const MAX_FORK_COUNT: u32 = 100;

/// `POST /sandboxes/{id}/timeout`: the sandbox ends `timeout` seconds from now (replacing the
/// previous end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxTimeoutRequest {
    pub timeout: u32,
}

/// `POST /sandboxes/{id}/connect`: resume if paused, and make it live at least `timeout`
/// seconds from now (a connect only extends, never shortens). `POST /v2/sandboxes/{id}/connect`
/// (later SDKs) sends the same body with `timeout` optional (300 when absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ConnectSandbox {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
    /// Later SDKs: false asks to resume from the filesystem only (a fresh boot), which is what
    /// this node's resume always is; absent or true asks for memory too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

impl ConnectSandbox {
    /// The v1 route's timeout, which it requires.
    pub fn required_timeout(&self) -> Result<u32, ApiError> {
        self.timeout
            .ok_or_else(|| E::bad_request("invalid JSON body: missing field `timeout`"))
    }
}

/// `POST /sandboxes/{id}/refreshes`: keep the sandbox alive `duration` more seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SandboxRefreshRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<u32>,
}

impl SandboxRefreshRequest {
    /// Refuses a duration above [`MAX_REFRESH_SECS`].
    pub fn check(&self) -> Result<(), ApiError> {
        match self.duration {
            Some(d) if d > MAX_REFRESH_SECS => Err(E::bad_request(format!(
                "duration {d} s is longer than {MAX_REFRESH_SECS} s"
            ))),
            _ => Ok(()),
        }
    }
}

/// `POST /sandboxes/{id}/resume` (deprecated in favour of connect).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumedSandbox {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`. The SDK sends `{"memory": true}` unless told to keep the
/// filesystem only; absent means true.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxPauseRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
    /// Later SDKs (`strict`): refuse to pause when the sandbox's envd does not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_healthy_guest: Option<bool>,
}

impl SandboxPauseRequest {
    /// Whether the caller asked for memory to be kept (E2B's default).
    pub fn keeps_memory(&self) -> bool {
        self.memory.unwrap_or(true)
    }
}

/// `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SandboxSnapshotRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Later SDKs: false takes the filesystem only; absent or true asks for memory too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

/// A snapshot, as created and as listed by `GET /snapshots`. Its id is what a create
/// request's `templateID` names to start a sandbox from it (and what
/// `DELETE /templates/{id}` removes: the SDK deletes snapshots through the templates route).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
}

/// `POST /sandboxes/{id}/fork`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SandboxForkRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
}

impl SandboxForkRequest {
    /// The number of forks asked for (1 when absent); refuses 0 and more than
    /// [`MAX_FORK_COUNT`].
    pub fn count(&self) -> Result<u32, ApiError> {
        match self.count.unwrap_or(1) {
            n @ 1..=MAX_FORK_COUNT => Ok(n),
            n => Err(E::bad_request(format!(
                "count {n} is out of range; 1 to {MAX_FORK_COUNT} forks may be asked for"
            ))),
        }
    }
}

/// One fork's outcome: exactly one of the sandbox or the error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxForkResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ApiError>,
}

impl SandboxForkResult {
    /// A fork that started.
    pub fn started(sandbox: Sandbox) -> Self {
        SandboxForkResult {
            sandbox: Some(sandbox),
            error: None,
        }
    }

    /// A fork that did not.
    pub fn failed(error: ApiError) -> Self {
        SandboxForkResult {
            sandbox: None,
            error: Some(error),
        }
    }
}

/// `PUT /sandboxes/{id}/network`: replaces the egress rules; an omitted field clears its rule.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxNetworkUpdateConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<BTreeMap<String, Vec<serde_json::Value>>>,
    #[serde(
        rename = "allow_internet_access",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_internet_access: Option<bool>,
}

/// One sample of `GET /sandboxes/{id}/metrics` (every field required by the SDK).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxMetric {
    /// Deprecated in favour of `timestampUnix`, but still required.
    pub timestamp: DateTime<Utc>,
    /// Seconds since the epoch.
    pub timestamp_unix: i64,
    pub cpu_count: u32,
    /// Percent of the sandbox's CPUs used.
    pub cpu_used_pct: f32,
    pub mem_used: u64,
    pub mem_total: u64,
    /// Page cache, in bytes.
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// `GET /sandboxes/metrics?sandbox_ids=...`: the latest sample of each sandbox, by id.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SandboxesWithMetrics {
    pub sandboxes: BTreeMap<String, SandboxMetric>,
}

/// A log line's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    /// The level a query value names.
    pub fn parse(text: &str) -> Option<LogLevel> {
        match text {
            "debug" => Some(LogLevel::Debug),
            "info" => Some(LogLevel::Info),
            "warn" => Some(LogLevel::Warn),
            "error" => Some(LogLevel::Error),
            _ => None,
        }
    }
}

/// One structured log entry of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxLogEntry {
    pub timestamp: DateTime<Utc>,
    pub message: String,
    pub level: LogLevel,
    pub fields: BTreeMap<String, String>,
}

/// One log line of a sandbox as the v1 route gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxLog {
    pub timestamp: DateTime<Utc>,
    pub line: String,
}

/// `GET /sandboxes/{id}/logs` (v1): the lines, and the same as structured entries.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxLogs {
    pub logs: Vec<SandboxLog>,
    pub log_entries: Vec<SandboxLogEntry>,
}

/// `GET /v2/sandboxes/{id}/logs`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SandboxLogsV2Response {
    pub logs: Vec<SandboxLogEntry>,
}
