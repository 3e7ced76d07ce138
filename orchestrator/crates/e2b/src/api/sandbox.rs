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

/// Seconds a sandbox lives when a `POST /sandboxes` request names no timeout (older SDKs
/// always send one, 300 unless told otherwise).
pub const DEFAULT_TIMEOUT_SECS: u32 = 15;
/// Seconds a sandbox lives when a `POST /v2/sandboxes` request names no timeout.
pub const DEFAULT_TIMEOUT_SECS_V2: u32 = 300;

/// The optional header of `POST /v2/sandboxes` that makes a retried create return the first
/// one's sandbox: 1 to 255 of `[a-z0-9-]`.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// Reads an `Idempotency-Key` value.
pub fn idempotency_key(value: &str) -> Result<&str, ApiError> {
    let ok = (1..=255).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(value)
    } else {
        Err(ApiError::bad_request(
            "Idempotency-Key must be 1 to 255 lowercase letters, digits and hyphens",
        ))
    }
}

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

/// `POST /sandboxes` and `POST /v2/sandboxes`: what the SDK's `Sandbox.create` sends. SDKs up
/// to 2.45 use the first and always send `templateID`, `timeout`, `secure`,
/// `allow_internet_access`, `metadata` and `envVars` (the last two possibly empty). Later ones
/// use the second, whose body has no `secure` (every v2 sandbox is secure: it answers with
/// an `envdAccessToken`, and every envd call must carry it) and whose `timeout` and
/// `allow_internet_access` are sent only when the caller set them. The rest only when set.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds to live; absent: [`DEFAULT_TIMEOUT_SECS`] (v1) or [`DEFAULT_TIMEOUT_SECS_V2`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
    /// Pause instead of kill when the timeout passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
    /// With `autoPause`: keep memory (true) or the filesystem only (false); absent, the kind is
    /// the node's (E2B's own takes memory, this node the filesystem only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_memory: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<AutoResume>,
    /// Every envd call must carry the sandbox's access token (v1 only; v2 always is).
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
    /// The timeout in force: the request's, or the route's default ([`DEFAULT_TIMEOUT_SECS`]
    /// or [`DEFAULT_TIMEOUT_SECS_V2`]).
    pub fn timeout_secs(&self, default: u32) -> u32 {
        self.timeout.unwrap_or(default)
    }

    /// Refuses a request outside `limits` or with a malformed name, naming the field:
    /// template id (non-empty, at most `max_template_id_bytes`, letters, digits and `._:/-`),
    /// timeout, metadata (count, key and value sizes, keys non-empty) and environment variables
    /// (count, POSIX names, value sizes, no NUL byte).
    pub fn check(&self, limits: &Limits) -> Result<(), ApiError> {
        // As E2B's SDKs refuse it before sending: traffic wakes only a sandbox its timeout
        // pauses, and (E2B's API) never one whose pause was asked to keep the files only.
        if self.auto_resume() {
            if self.auto_pause != Some(true) {
                return Err(ApiError::bad_request(
                    "autoResume: needs autoPause (lifecycle on_timeout \"pause\"): traffic \
                     wakes a sandbox its timeout paused",
                ));
            }
            if self.auto_pause_memory == Some(false) {
                return Err(ApiError::bad_request(
                    "autoResume: cannot be combined with autoPauseMemory: false (E2B resumes a \
                     filesystem-only pause only on an explicit connect)",
                ));
            }
        }
        if let Some(mask) = self.host_mask() {
            // A host, optionally `:port`, where `${PORT}` stands for the port asked for.
            let plain = mask.replace("${PORT}", "1");
            if mask.is_empty()
                || mask.len() > 255
                || !plain
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-.:".contains(&b))
            {
                return Err(ApiError::bad_request(format!(
                    "network.maskRequestHost: {mask:?} is not a host name, optionally with \
                     :port, where ${{PORT}} stands for the sandbox port asked for"
                )));
            }
        }
        let timeout = self.timeout.unwrap_or(0);
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
        if timeout > limits.max_timeout_secs {
            return Err(ApiError::bad_request(format!(
                "timeout {timeout} s is longer than this node's limit of {} s",
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

    /// Whether traffic to the sandbox's ports resumes it while it is paused (`autoResume:
    /// {enabled: true}`). A pause here keeps the files only, whatever was asked: the wake
    /// brings them back and starts the template's server, as a `connect()` does; processes
    /// started before the pause do not come back.
    pub fn auto_resume(&self) -> bool {
        self.auto_resume.is_some_and(|a| a.enabled)
    }

    /// `network.maskRequestHost`: the `Host` a sandbox's servers see on requests to its ports,
    /// `${PORT}` standing for the port (E2B's placeholder), instead of the name the client used.
    pub fn host_mask(&self) -> Option<&str> {
        self.network.as_ref()?.mask_request_host.as_deref()
    }

    /// The fields this request sets that E2B offers and a node of ours may not: memory kept
    /// over a pause, MCP servers, workload identity, volumes, a SOCKS5 egress proxy, egress
    /// header rules. The node refuses the ones it cannot honour rather
    /// than ignore them. `autoPause` without `autoPauseMemory` leaves the kind of snapshot to
    /// the node (the SDK sends the field only when its caller chose `keep_memory`), which keeps
    /// memory for gVisor sandboxes and the filesystem for the others; an explicit `autoPauseMemory: true` is listed here, and the door
    /// refuses it unless the template runs in the gVisor class (whose pause keeps memory,
    /// `control::create_row`). `autoResume` is
    /// offered (a request to a port wakes the sandbox), see [`NewSandbox::auto_resume`].
    pub fn extensions(&self) -> Vec<&'static str> {
        let mut set = Vec::new();
        if self.auto_pause == Some(true) && self.auto_pause_memory == Some(true) {
            set.push("autoPauseMemory");
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

/// What a paused sandbox's latest pause saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PauseMode {
    /// Memory and filesystem: a resume continues where it stopped.
    Full,
    /// The filesystem only: a resume boots afresh from it (the only kind this node takes).
    Filesystem,
}

/// One entry of `GET /sandboxes` and `GET /v2/sandboxes`, and the core of a sandbox's detail.
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
    /// When the sandbox's timeout passes.
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
    /// Newer SDKs: the snapshot a paused sandbox resumes from was taken while its envd did not
    /// answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_unresponsive_at_pause: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mounts: Option<Vec<VolumeMount>>,
}

/// `GET /sandboxes/{id}`: the listing entry and what only the detail tells.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    #[serde(flatten)]
    pub sandbox: ListedSandbox,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    /// Null when the create request left it unset.
    #[serde(default)]
    pub allow_internet_access: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<SandboxLifecycle>,
    /// Newer SDKs: set for a paused sandbox once its pause finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_mode: Option<PauseMode>,
    /// Not E2B's: what the node's operator lets this sandbox reach at most (`*`: any public
    /// host), the bound of `network.allowOut`/`denyOut`; SDKs ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_grant: Option<Vec<String>>,
}
