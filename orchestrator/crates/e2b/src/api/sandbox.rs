//! Sandboxes as the control API describes them: the create request (`NewSandbox`), the create,
//! connect and resume answer (`Sandbox`), the detail (`SandboxDetail`) and listing entry
//! (`ListedSandbox`), their state, lifecycle and network configuration, and the bounds a create
//! request is checked against.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::error::ApiError;

/// The header carrying the caller's API key on every control API call.
pub const API_KEY_HEADER: &str = "x-api-key";
/// The response header with the cursor of the next page, absent on the last page.
pub const NEXT_TOKEN_HEADER: &str = "x-next-token";
/// The response header with the number of running sandboxes matching a v2 listing's filters.
pub const TOTAL_RUNNING_HEADER: &str = "x-total-running";

/// The envd version a sandbox reports. The SDK turns features on by it: 0.3.0 stdin choice,
/// 0.4.0 default user (no `Authorization` header unless a user is named), 0.5.2 CloseStdin,
/// 0.5.7 octet-stream (and gzip) uploads, 0.6.2 file metadata (`X-Metadata-*`), 0.6.3 entries
/// in watch events, 0.6.4 watching network mounts. Below 0.1.0 the SDK refuses the sandbox.
/// Report a lower version to keep the SDK from using a feature the node does not serve.
pub const ENVD_VERSION: &str = "0.6.4";

/// Seconds a sandbox lives when the create request names no timeout (the API's default; the
/// SDK itself always sends one, 300 unless told otherwise).
pub const DEFAULT_TIMEOUT_SECS: u32 = 15;

/// Whether a sandbox runs or is paused (its state kept as a snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Running,
    Paused,
}

impl SandboxState {
    /// The state as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
        }
    }

    /// The state a query value names.
    pub fn parse(text: &str) -> Option<SandboxState> {
        match text {
            "running" => Some(SandboxState::Running),
            "paused" => Some(SandboxState::Paused),
            _ => None,
        }
    }
}

/// What happens when a sandbox's timeout passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    Kill,
    Pause,
}

/// `autoResume` of a create request: resume a paused sandbox when traffic reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AutoResume {
    pub enabled: bool,
}

/// A SOCKS5 proxy for a sandbox's egress (`network.egressProxy`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressProxy {
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// `network` of a create request and of a sandbox's detail.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_public_traffic: Option<bool>,
    /// CIDR blocks, addresses or domain names (`*.example.com`) the sandbox may reach; they
    /// win over `denyOut`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    /// CIDR blocks or addresses the sandbox may not reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<EgressProxy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
    /// Per-domain header rewrites of egress requests, kept as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<BTreeMap<String, Vec<serde_json::Value>>>,
}

/// A volume mounted into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    pub name: String,
    pub path: String,
}

/// `POST /sandboxes`: what the SDK's `Sandbox.create` sends. The SDK always sends
/// `templateID`, `timeout`, `secure`, `allow_internet_access`, `metadata` and `envVars` (the
/// last two possibly empty); the rest only when the caller set them.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds to live; [`DEFAULT_TIMEOUT_SECS`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
    /// Pause instead of kill when the timeout passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
    /// With `autoPause`: keep memory (true, E2B's default) or the filesystem only (false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_memory: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<AutoResume>,
    /// Every envd call must carry the sandbox's access token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure: Option<bool>,
    /// Spelled in snake case on the wire, unlike its neighbours.
    #[serde(
        rename = "allow_internet_access",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_internet_access: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// MCP servers to start in the sandbox (kept as sent; `null` is absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<serde_json::Value>,
    /// Workload identity tokens (kept as sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iam: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mounts: Option<Vec<VolumeMount>>,
}

/// Bounds of a create request: counts and sizes a node accepts. Named so that the node's
/// config can state its own; [`Limits::default`] is what the node uses unless told otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Longest timeout a sandbox may ask for, in seconds.
    pub max_timeout_secs: u32,
    pub max_metadata_entries: usize,
    pub max_metadata_key_bytes: usize,
    pub max_metadata_value_bytes: usize,
    pub max_env_vars: usize,
    pub max_env_value_bytes: usize,
    pub max_template_id_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_timeout_secs: 24 * 3600,
            max_metadata_entries: 64,
            max_metadata_key_bytes: 256,
            max_metadata_value_bytes: 1024,
            max_env_vars: 256,
            max_env_value_bytes: 32 * 1024,
            max_template_id_bytes: 128,
        }
    }
}

impl NewSandbox {
    /// The timeout in force: the request's, or [`DEFAULT_TIMEOUT_SECS`].
    pub fn timeout_secs(&self) -> u32 {
        self.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS)
    }

    /// Refuses a request outside `limits` or with a malformed name, naming the field:
    /// template id (non-empty, at most `max_template_id_bytes`, letters, digits and `._:/-`),
    /// timeout, metadata (count, key and value sizes, keys non-empty) and environment variables
    /// (count, POSIX names, value sizes, no NUL byte).
    pub fn check(&self, limits: &Limits) -> Result<(), ApiError> {
        let id = &self.template_id;
        if id.is_empty() || id.len() > limits.max_template_id_bytes {
            return Err(ApiError::bad_request(format!(
                "templateID must be 1 to {} bytes",
                limits.max_template_id_bytes
            )));
        }
        if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b))
        {
            return Err(ApiError::bad_request(
                "templateID may contain only letters, digits and . _ : / -",
            ));
        }
        if self.timeout_secs() > limits.max_timeout_secs {
            return Err(ApiError::bad_request(format!(
                "timeout {} s is longer than this node's limit of {} s",
                self.timeout_secs(),
                limits.max_timeout_secs
            )));
        }
        if let Some(metadata) = &self.metadata {
            check_metadata(metadata, limits)?;
        }
        if let Some(env) = &self.env_vars {
            if env.len() > limits.max_env_vars {
                return Err(ApiError::bad_request(format!(
                    "envVars has {} entries; at most {} are accepted",
                    env.len(),
                    limits.max_env_vars
                )));
            }
            for (name, value) in env {
                if !is_env_name(name) {
                    return Err(ApiError::bad_request(format!(
                        "envVars: {:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)",
                        cut(name, 64)
                    )));
                }
                if value.len() > limits.max_env_value_bytes || value.contains('\0') {
                    return Err(ApiError::bad_request(format!(
                        "envVars.{name}: value must be at most {} bytes without NUL",
                        limits.max_env_value_bytes
                    )));
                }
            }
        }
        Ok(())
    }

    /// The fields this request sets that E2B offers and a node of ours may not: memory kept
    /// over a pause, resume on traffic, MCP servers, workload identity, volumes, a SOCKS5 egress
    /// proxy, egress header rules, a masked request host. The node refuses the ones it cannot
    /// honour rather than ignore them.
    pub fn extensions(&self) -> Vec<&'static str> {
        let mut set = Vec::new();
        if self.auto_pause == Some(true) && self.auto_pause_memory != Some(false) {
            set.push("autoPauseMemory");
        }
        if self.auto_resume.is_some_and(|a| a.enabled) {
            set.push("autoResume");
        }
        if self.mcp.as_ref().is_some_and(|v| !v.is_null()) {
            set.push("mcp");
        }
        if self.iam.as_ref().is_some_and(|v| !v.is_null()) {
            set.push("iam");
        }
        if self.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
            set.push("volumeMounts");
        }
        if let Some(network) = &self.network {
            if network.egress_proxy.is_some() {
                set.push("network.egressProxy");
            }
            if network.rules.as_ref().is_some_and(|r| !r.is_empty()) {
                set.push("network.rules");
            }
            if network.mask_request_host.is_some() {
                set.push("network.maskRequestHost");
            }
        }
        set
    }
}

fn check_metadata(metadata: &BTreeMap<String, String>, limits: &Limits) -> Result<(), ApiError> {
    if metadata.len() > limits.max_metadata_entries {
        return Err(ApiError::bad_request(format!(
            "metadata has {} entries; at most {} are accepted",
            metadata.len(),
            limits.max_metadata_entries
        )));
    }
    for (key, value) in metadata {
        if key.is_empty() || key.len() > limits.max_metadata_key_bytes {
            return Err(ApiError::bad_request(format!(
                "metadata keys must be 1 to {} bytes",
                limits.max_metadata_key_bytes
            )));
        }
        if value.len() > limits.max_metadata_value_bytes {
            return Err(ApiError::bad_request(format!(
                "metadata.{}: value is longer than {} bytes",
                cut(key, 64),
                limits.max_metadata_value_bytes
            )));
        }
    }
    Ok(())
}

fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The answer to create, connect and resume: which sandbox, and how to reach its envd.
/// `clientID` is deprecated but the SDK fails without it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub envd_version: String,
    /// Set for a secure sandbox: every envd call must carry it in `X-Access-Token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_access_token: Option<String>,
    /// Where the sandbox's ports are reached; unused by an SDK given `E2B_SANDBOX_URL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// A sandbox's lifecycle policy, as its detail reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxLifecycle {
    pub auto_resume: bool,
    pub on_timeout: OnTimeout,
}

/// `GET /sandboxes/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub started_at: DateTime<Utc>,
    /// When the sandbox's timeout passes.
    pub end_at: DateTime<Utc>,
    pub envd_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    /// Null when the request left it unset.
    #[serde(default)]
    pub allow_internet_access: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    pub state: SandboxState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<SandboxLifecycle>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mounts: Option<Vec<VolumeMount>>,
}

/// One entry of `GET /sandboxes` and `GET /v2/sandboxes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    pub started_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    pub cpu_count: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    pub state: SandboxState,
    pub envd_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mounts: Option<Vec<VolumeMount>>,
}
