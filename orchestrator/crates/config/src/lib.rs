//! The node configuration: one YAML file, every value overridable from the environment.
//!
//! Loading is strict on purpose. An operator who misspells a key or gives a port as a word should
//! learn it at start, with the key and the line, rather than run with a silent default. The file is
//! deserialized first on its own (so serde_yaml can report lines), then environment overrides are
//! merged in and the result is checked once more (so an override is blamed on its variable).
//!
//! Overrides: `ORCHESTRATOR__<SECTION>__<KEY>=value` for any key (double underscores separate
//! levels, the value is read as a YAML scalar), plus the conventional `DATABASE_URL`,
//! `DOCKER_HOST`, `ORCHESTRATOR_ADMIN_KEY`, `SANDBOX_EXECUTOR_BIN` and `SANDBOX_CHANNEL_DIR`.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use aegis_core::settings::{at_least_one, Invalid};

/// The `volumes:` section lives with the volumes it configures.
pub use aegis_sandboxes::volumes::VolumesConfig;
/// The database section and the URL redaction live with the pool they configure.
pub use aegis_store::database::{check_database_url, redact_url, DatabaseConfig};

mod load;
mod sandbox;
mod validate;

pub use load::{ConfigError, LoadedConfig};
pub use sandbox::SandboxConfig;
pub use validate::MAX_E2B_POOL;

/// Prefix of the generic environment overrides.
pub const ENV_PREFIX: &str = "ORCHESTRATOR__";

/// The whole node configuration.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// Listening addresses.
    pub server: ServerConfig,
    /// PostgreSQL connection.
    pub database: DatabaseConfig,
    /// Container engine connection.
    pub docker: DockerConfig,
    pub log: LogConfig,
    /// Operator authentication.
    pub auth: AuthConfig,
    /// Sandboxes: executor, ceilings, warm pool.
    pub sandbox: SandboxConfig,
    /// The SEAL gateway: token lifetime, freshness window, security contexts.
    pub seal: SealConfig,
    /// Language model providers and model aliases.
    pub llm: aegis_llm::LlmConfig,
    /// Agent executions: server ceilings.
    pub executions: ExecutionsConfig,
    /// Workflow executions: workers, leases, limits.
    pub workflows: WorkflowsConfig,
    /// The audit log: how often its head is written to the log.
    pub audit: AuditConfig,
    /// How the orchestrator reaches the outside world (`web.*`): address exceptions, static
    /// hosts, body cap, timeouts.
    pub egress: aegis_egress::EgressConfig,
    /// `web.search` providers.
    pub web: aegis_egress::search::WebConfig,
    /// The MCP endpoint (`/mcp`): allowed hosts and origins, session idle time.
    pub mcp: McpConfig,
    /// External MCP servers whose tools manifests offer as `mcp:<server>[/<tool>]`: name,
    /// Streamable HTTP URL (reached under the egress rules), credentials by variable name.
    pub mcp_servers: Vec<aegis_egress::mcp_servers::McpServerConfig>,
    /// Persistent agent volumes (`spec.volumes`) and workflow volumes (`spec.storage`): size
    /// ceiling, default lifetime, sweep.
    pub volumes: VolumesConfig,
    /// Agent memory across executions (`spec.execution.memory`): note size, notes per memory,
    /// recall budget ceiling.
    pub memory: aegis_store::memory::MemoryConfig,
    /// Result delivery (`spec.execution.delivery`): signing secrets, retries, polling.
    pub delivery: aegis_egress::delivery::DeliveryConfig,
    /// `/metrics` (Prometheus text format).
    pub metrics: MetricsConfig,
    /// What a stopping node does with its sandboxes.
    pub shutdown: ShutdownConfig,
    /// The replicas of one database reaching each other: where this one listens for its peers
    /// and the secret they share.
    pub cluster: ClusterConfig,
    /// The E2B door: how long snapshots are kept and how many each key may hold.
    pub e2b: E2bConfig,
}

/// How replicas of one database reach each other, so that a call for a sandbox another replica
/// holds is carried to it. Off (no listener) unless `listen` is set.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Where this replica listens for its peers (`10.0.0.5:8090`; port 0 picks one). A separate
    /// listener from the callers' HTTP and gRPC ports, so it can be kept off the callers'
    /// network; every request on it must carry the shared secret's signature anyway.
    pub listen: Option<std::net::SocketAddr>,
    /// The URL peers use to reach `listen` (`http://replica-a:8090`); defaults to
    /// `http://<listen>` when that is a concrete address, and is required when it is not
    /// (`0.0.0.0`).
    pub advertise: Option<String>,
    /// The secret every replica shares (at least 32 bytes), which signs each forwarded call
    /// (HMAC-SHA256 over a timestamp, a nonce and the body). Also `ORCHESTRATOR__CLUSTER__SECRET`.
    pub secret: Option<String>,
}

impl ClusterConfig {
    /// The `cluster:` section on its own.
    pub fn check(&self) -> Result<(), Invalid> {
        let Some(listen) = self.listen else {
            if self.advertise.is_some() {
                return Err(Invalid::new("advertise", "is set but `listen` is not"));
            }
            return Ok(());
        };
        match &self.secret {
            None => {
                return Err(Invalid::new(
                    "secret",
                    "is required when `listen` is set: peers sign every forwarded call with it",
                ))
            }
            Some(secret) if secret.len() < 32 => {
                return Err(Invalid::new(
                    "secret",
                    format!(
                    "is {} bytes long; use at least 32 random bytes (e.g. `openssl rand -hex 32`)",
                    secret.len()
                ),
                ))
            }
            Some(_) => {}
        }
        match &self.advertise {
            Some(url) if !(url.starts_with("http://") || url.starts_with("https://")) => {
                Err(Invalid::new(
                    "advertise",
                    format!("`{url}` is not an http:// or https:// URL"),
                ))
            }
            None if listen.ip().is_unspecified() => Err(Invalid::new(
                "advertise",
                format!(
                    "is required when `listen` is {listen}: peers need an address they can reach"
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// Snapshots of the E2B door (a paused sandbox's saved files, `POST /sandboxes/{id}/snapshots`).
/// They live in PostgreSQL, so they are bounded per key and expire.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct E2bConfig {
    /// Seconds a snapshot (and a paused sandbox, whose files are one) is kept; the sweep
    /// deletes it after.
    pub snapshot_ttl_secs: u64,
    /// Snapshots one API key may hold (a paused sandbox counts as one).
    pub max_snapshots_per_api_key: u64,
    /// Bytes of snapshots one API key may hold (their archives together), MiB.
    pub max_snapshot_mb_per_api_key: u64,
    /// Warm pool per E2B template (a runtime, e.g. `base`): started sandboxes of exactly the
    /// shape an E2B create of that template asks for, handed out in milliseconds. A create by
    /// a key bound to a security context (other roots) does not match and is made fresh.
    pub pool: std::collections::BTreeMap<String, usize>,
    /// The `sandbox_domain` create and get answer: a sandbox's port is reached at
    /// `<port>-<sandbox id>.<domain>` on the node's HTTP port (`get_host`), so point a wildcard
    /// DNS entry `*.<domain>` at the node. `localhost` works locally: `*.localhost` resolves to
    /// the loopback address in browsers and curl. A port after a colon (`localhost:8080`) is
    /// reported as is and ignored when matching a request's `Host`.
    pub domain: String,
    /// Bytes one connection to a sandbox port may carry from its client (request bodies, or a
    /// WebSocket's client side), MiB: a request whose `Content-Length` is over it is refused
    /// (413), a connection that sends more is closed.
    pub port_max_request_mb: u64,
    /// Bytes one connection to a sandbox port may carry from the server (responses, or a
    /// WebSocket's server side), MiB; past it the connection is closed.
    pub port_max_response_mb: u64,
    /// What E2B sandboxes may reach, per API key (`default`, `keys`): the bound of whatever
    /// `allow_internet_access` and `network.allowOut`/`denyOut` ask. Empty (the default): E2B
    /// sandboxes have no network.
    pub egress: aegis_sandboxes::e2b_egress::EgressGrants,
}

impl Default for E2bConfig {
    fn default() -> Self {
        Self {
            snapshot_ttl_secs: 7 * 24 * 3600,
            max_snapshots_per_api_key: 20,
            max_snapshot_mb_per_api_key: 1024,
            pool: Default::default(),
            domain: "localhost".to_owned(),
            port_max_request_mb: 64,
            port_max_response_mb: 1024,
            egress: Default::default(),
        }
    }
}

impl E2bConfig {
    /// Every figure at least 1.
    pub fn check(&self) -> Result<(), Invalid> {
        at_least_one(&[
            ("snapshot_ttl_secs", self.snapshot_ttl_secs),
            ("max_snapshots_per_api_key", self.max_snapshots_per_api_key),
            (
                "max_snapshot_mb_per_api_key",
                self.max_snapshot_mb_per_api_key,
            ),
            ("port_max_request_mb", self.port_max_request_mb),
            ("port_max_response_mb", self.port_max_response_mb),
        ])?;
        self.egress.check()?;
        let host = self.domain.split(':').next().unwrap_or_default();
        if host.is_empty()
            || !host.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
        {
            return Err(Invalid::new(
                "domain",
                format!(
                    "{:?} is not a domain name (letters, digits, '-' and dots, optionally ':port')",
                    self.domain
                ),
            ));
        }
        Ok(())
    }
}

/// Settings of the Prometheus endpoint.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Serve `GET /metrics` on the HTTP listener, without a key (scrapers carry none; the series
    /// hold no tenant data). `false` answers 404 there.
    pub enabled: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// What happens at SIGTERM/SIGINT beyond draining requests.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// `destroy` (default): the node destroys every sandbox it holds before it exits, so a
    /// stopped node leaves no container behind. `keep`: they stay running for a replica or the
    /// restarted node to adopt (rolling restarts).
    pub sandboxes: ShutdownSandboxes,
}

/// The fate of a stopping node's sandboxes.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ShutdownSandboxes {
    /// Destroy them (and their volumes).
    #[default]
    Destroy,
    /// Leave them running for adoption.
    Keep,
}

/// Settings of the MCP Streamable HTTP endpoint.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// `Host` values (`name` or `name:port`) accepted on `/mcp`, against DNS rebinding; a
    /// node reached by another name must list it.
    pub allowed_hosts: Vec<String>,
    /// Browser `Origin`s accepted on `/mcp` (`scheme://host[:port]`, `:*` for any port);
    /// requests with any other Origin get 403. Requests without Origin (non-browser clients) pass.
    pub allowed_origins: Vec<String>,
    /// An MCP session (and its sandbox) ends after this long without a request, seconds.
    pub session_idle_secs: u64,
    /// The URL clients reach this node by (`https://node.example`), for the OAuth protected
    /// resource metadata; when unset it is derived from the request's Host.
    pub public_url: Option<String>,
}

impl McpConfig {
    /// The `mcp:` section on its own.
    pub fn check(&self) -> Result<(), Invalid> {
        at_least_one(&[("session_idle_secs", self.session_idle_secs)])
    }
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            allowed_origins: vec![
                "http://localhost:*".into(),
                "http://127.0.0.1:*".into(),
                "http://[::1]:*".into(),
            ],
            session_idle_secs: 600,
            public_url: None,
        }
    }
}

/// How this replica advances workflow executions, and the node's limits on them.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WorkflowsConfig {
    /// Worker tasks of this replica; each advances one execution at a time.
    pub workers: u32,
    /// Lease of a claimed execution, seconds; renewed while a state runs. A replica that dies
    /// leaves its executions to others this long after its last renewal.
    pub lease_ttl_secs: u64,
    /// Fallback poll period, milliseconds (expired leases, Human timeouts); run, signal and
    /// cancel wake workers at once through LISTEN/NOTIFY.
    pub poll_interval_ms: u64,
    /// Longest workflow execution, seconds; past it the execution ends as timed_out.
    pub max_execution_secs: u64,
    /// Network modes ContainerRun steps may ask for besides `none` (e.g. `[bridge]`).
    pub allow_network_modes: Vec<String>,
    /// Image of the sandbox System states run in (default: the runtime registry's default).
    pub system_image: Option<String>,
}

impl WorkflowsConfig {
    /// The `workflows:` section on its own: workers, intervals and leases within bounds, known
    /// network modes.
    pub fn check(&self) -> Result<(), Invalid> {
        if self.workers == 0
            || self.lease_ttl_secs < 2
            || self.poll_interval_ms == 0
            || self.max_execution_secs == 0
        {
            return Err(Invalid::new(
                "",
                "workers, poll_interval_ms and max_execution_secs must be at least 1, lease_ttl_secs at least 2",
            ));
        }
        if let Some(mode) = self
            .allow_network_modes
            .iter()
            .find(|m| !matches!(m.as_str(), "none" | "bridge"))
        {
            return Err(Invalid::new(
                "allow_network_modes",
                format!("unknown network mode `{mode}`; expected none or bridge"),
            ));
        }
        Ok(())
    }
}

impl Default for WorkflowsConfig {
    fn default() -> Self {
        Self {
            workers: 8,
            lease_ttl_secs: 30,
            poll_interval_ms: 1000,
            max_execution_secs: 86_400,
            allow_network_modes: Vec::new(),
            system_image: None,
        }
    }
}

/// Audit log settings.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Seconds between the `audit chain head` log lines (count and head hash per tenant), which
    /// anchor the chain outside the database.
    pub anchor_log_interval_secs: u64,
}

impl AuditConfig {
    /// The `audit:` section on its own.
    pub fn check(&self) -> Result<(), Invalid> {
        if self.anchor_log_interval_secs == 0 {
            return Err(Invalid::new(
                "anchor_log_interval_secs",
                "expected a whole number of seconds, at least 1",
            ));
        }
        Ok(())
    }
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            anchor_log_interval_secs: 300,
        }
    }
}

/// Server ceilings of agent executions; manifests can only lower them.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ExecutionsConfig {
    /// Model turns with tool calls allowed per iteration.
    pub max_tool_rounds: u32,
    /// Longest execution, seconds.
    pub max_execution_secs: u64,
    /// Most iterations per execution.
    pub max_iterations: u32,
    /// Keep the sandbox of a failed execution for inspection (still reaped with its instance).
    pub keep_failed_sandboxes: bool,
    /// Deepest chain of child executions (a top-level execution has depth 0).
    pub max_depth: u32,
    /// Most pending or running executions of one principal (the API key or session at the root
    /// of the tree, children included).
    pub max_concurrent_per_caller: u32,
    /// Most pending or running executions on this node.
    pub max_concurrent: u32,
    /// Tools whose calls `spec.execution.tool_validation` judges never see (AEGIS's
    /// `skip_judge`): an operator's choice, for calls cheap and harmless enough not to cost a
    /// judge each; a manifest cannot set it.
    pub skip_judge_tools: Vec<String>,
}

impl ExecutionsConfig {
    /// The `executions:` section on its own: bounds of at least 1. (`skip_judge_tools` is
    /// checked against the tool catalog, across sections.)
    pub fn check(&self) -> Result<(), Invalid> {
        if self.max_tool_rounds == 0 || self.max_iterations == 0 || self.max_execution_secs == 0 {
            return Err(Invalid::new(
                "",
                "max_tool_rounds, max_iterations and max_execution_secs must be at least 1",
            ));
        }
        at_least_one(&[
            (
                "max_concurrent_per_caller",
                u64::from(self.max_concurrent_per_caller),
            ),
            ("max_concurrent", u64::from(self.max_concurrent)),
        ])
    }
}

impl Default for ExecutionsConfig {
    fn default() -> Self {
        Self {
            max_tool_rounds: 20,
            max_execution_secs: 3600,
            max_iterations: 10,
            keep_failed_sandboxes: false,
            max_depth: 4,
            max_concurrent_per_caller: 16,
            max_concurrent: 64,
            skip_judge_tools: Vec::new(),
        }
    }
}

/// SEAL gateway settings.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SealConfig {
    /// Lifetime of a security token, seconds (at most 86400).
    pub token_ttl_secs: u64,
    /// How far an envelope's timestamp may be from now, seconds, either way.
    pub freshness_secs: u64,
    /// Attestation attempts allowed per workload per minute.
    pub attest_per_minute: u64,
    /// Attestation attempts allowed per source address per minute.
    pub attest_per_minute_per_source: u64,
    /// Attestation attempts allowed on the whole node per minute.
    pub attest_per_minute_node: u64,
    /// How long a call that needs human approval waits for a decision when its capability
    /// does not say, seconds.
    pub approval_timeout_secs: u64,
    /// Security contexts loaded at start (same shape as `POST /v1/security-contexts`).
    pub security_contexts: Vec<serde_json::Value>,
}

impl SealConfig {
    /// The `seal:` section on its own: rate limits of at least 1, token, approval and freshness
    /// windows within their bounds, security contexts that parse.
    pub fn check(&self) -> Result<(), Invalid> {
        at_least_one(&[
            ("attest_per_minute", self.attest_per_minute),
            (
                "attest_per_minute_per_source",
                self.attest_per_minute_per_source,
            ),
            ("attest_per_minute_node", self.attest_per_minute_node),
        ])?;
        if self.token_ttl_secs == 0 || self.token_ttl_secs > 86_400 {
            return Err(Invalid::new(
                "token_ttl_secs",
                "expected 1 to 86400 seconds (tokens never live longer than 24 h)",
            ));
        }
        if self.approval_timeout_secs == 0 || self.approval_timeout_secs > 86_400 {
            return Err(Invalid::new(
                "approval_timeout_secs",
                "expected 1 to 86400 seconds",
            ));
        }
        if self.freshness_secs == 0 || self.freshness_secs > 300 {
            return Err(Invalid::new("freshness_secs", "expected 1 to 300 seconds"));
        }
        for (i, context) in self.security_contexts.iter().enumerate() {
            if let Err(e) = aegis_store::contexts::parse(context) {
                return Err(Invalid::new(
                    format!("security_contexts[{i}]"),
                    e.to_string(),
                ));
            }
        }
        Ok(())
    }
}

impl Default for SealConfig {
    fn default() -> Self {
        Self {
            token_ttl_secs: 3600,
            freshness_secs: 30,
            attest_per_minute: 5,
            attest_per_minute_per_source: 30,
            attest_per_minute_node: 300,
            approval_timeout_secs: 300,
            security_contexts: Vec::new(),
        }
    }
}

/// Operator authentication settings.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The first admin key (`aok_...`); usually given as `ORCHESTRATOR_ADMIN_KEY`. When absent and
    /// no admin key exists, one is generated and printed once at first start.
    pub admin_key: Option<String>,
    /// Where the admin key is kept when none is configured (compose: a file in a named volume):
    /// read at start and registered, or generated into it (0600) when missing;
    /// `orchestrator admin-key` prints it.
    pub admin_key_file: Option<PathBuf>,
}

/// Where the service listens.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// REST (operator API, SEAL over HTTP, health).
    pub http: SocketAddr,
    /// gRPC (SEAL gateway, health, reflection).
    pub grpc: SocketAddr,
    /// How long in-flight requests may take to finish after a shutdown signal.
    pub shutdown_grace_secs: u64,
    /// A second listener serving the HTTP port's routes over TLS, with the operator's
    /// certificate: E2B's `get_host` URLs are `https://<port>-<sandbox id>.<e2b.domain>`.
    /// Absent (the default): no TLS listener.
    pub tls: Option<TlsConfig>,
}

/// The TLS listener (`server.tls`): where, and the operator's PEM files. For sandbox ports the
/// certificate must name `*.<e2b.domain>` (one label: `<port>-<id>`); read once at start.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The address it listens on (e.g. `0.0.0.0:443`).
    pub listen: SocketAddr,
    /// The certificate chain, leaf first (PEM).
    pub cert_file: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

impl ServerConfig {
    /// The `server:` section on its own: each listener on an address of its own.
    pub fn check(&self) -> Result<(), Invalid> {
        if self.http.port() != 0 && self.http == self.grpc {
            return Err(Invalid::new(
                "grpc",
                format!("must differ from server.http ({})", self.http),
            ));
        }
        if let Some(tls) = &self.tls {
            if tls.listen.port() != 0 && (tls.listen == self.http || tls.listen == self.grpc) {
                return Err(Invalid::new(
                    "tls.listen",
                    format!(
                        "must differ from server.http and server.grpc ({})",
                        tls.listen
                    ),
                ));
            }
            for (key, path) in [
                ("tls.cert_file", &tls.cert_file),
                ("tls.key_file", &tls.key_file),
            ] {
                if path.as_os_str().is_empty() {
                    return Err(Invalid::new(key, "must name a PEM file"));
                }
            }
        }
        Ok(())
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            http: SocketAddr::from(([127, 0, 0, 1], 8088)),
            grpc: SocketAddr::from(([127, 0, 0, 1], 50051)),
            shutdown_grace_secs: 20,
            tls: None,
        }
    }
}

/// Docker engine settings.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DockerConfig {
    /// `unix:///var/run/docker.sock` or `tcp://host:port`; defaults to `DOCKER_HOST` or the local socket.
    pub host: Option<String>,
}

impl DockerConfig {
    /// The `docker:` section on its own: an address the engine client can use. The engine this
    /// replica drives is the one at that address (recorded by its ID in `node_instances`).
    pub fn check(&self) -> Result<(), Invalid> {
        let Some(host) = self.host.as_deref() else {
            return Ok(());
        };
        let ok = match host.split_once("://") {
            Some(("unix", path)) => path.starts_with('/'),
            Some(("tcp" | "http", rest)) => {
                !rest.is_empty() && !rest.contains('/') && rest.contains(':')
            }
            Some(_) => false,
            None => host.starts_with('/'),
        };
        if ok {
            Ok(())
        } else {
            Err(Invalid::new(
                "host",
                format!(
                    "`{host}` is not unix:///absolute/path, tcp://host:port or an absolute \
                     socket path"
                ),
            ))
        }
    }
}

/// Log output.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A `tracing` filter such as `info` or `orchestrator=debug,info`; `RUST_LOG` wins when set.
    pub level: String,
    /// `text` for people, `json` for log shippers.
    pub format: LogFormat,
}

impl LogConfig {
    /// The `log:` section on its own: a level the subscriber accepts.
    pub fn check(&self) -> Result<(), Invalid> {
        tracing_subscriber::EnvFilter::try_new(&self.level).map_err(|e| {
            Invalid::new(
                "level",
                format!("expected a tracing filter such as `info` or `orchestrator=debug`: {e}"),
            )
        })?;
        Ok(())
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".to_owned(),
            format: LogFormat::Text,
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Reads the file (if any), applies environment overrides from `env`, and validates values.
pub fn load(
    path: Option<&std::path::Path>,
    env: &[(String, String)],
) -> Result<LoadedConfig, ConfigError> {
    let loaded = load::read(path, env)?;
    validate::validate(&loaded)?;
    Ok(loaded)
}

/// A copy of the configuration with every secret replaced, for display.
pub fn redacted(config: &NodeConfig) -> NodeConfig {
    let mut shown = config.clone();
    shown.database.url = redact_url(&shown.database.url);
    if shown.auth.admin_key.is_some() {
        shown.auth.admin_key = Some("***".to_owned());
    }
    for context in &mut shown.seal.security_contexts {
        aegis_seal::context::redact_definition(context);
    }
    if shown.cluster.secret.is_some() {
        shown.cluster.secret = Some("***".to_owned());
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::line_of_key;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut f, text.as_bytes()).expect("write");
        f
    }

    /// The error of loading a config file that holds `text` (the test fails if it loads).
    fn load_error(text: &str) -> String {
        let f = write(text);
        load(Some(f.path()), &[]).unwrap_err().to_string()
    }

    /// Asserts that a config file holding `text` is refused with an error naming each of
    /// `needles` (the key, its line, what was wrong).
    fn refused(text: &str, needles: &[&str]) {
        let err = load_error(text);
        for needle in needles {
            assert!(err.contains(needle), "{text}: {err} (wanted {needle:?})");
        }
    }

    #[test]
    fn the_e2b_egress_grant_is_checked_with_key_and_line() {
        refused(
            "e2b:\n  egress:\n    default:\n      - pypi.org\n      - \"a.*.org\"\n",
            &["e2b.egress.default[1]", "line 5", "a.*.org"],
        );
        refused(
            "e2b:\n  egress:\n    keys:\n      ops: [pypi.org]\n",
            &["e2b.egress.keys.ops", "not an API key id"],
        );
        refused(
            "e2b:\n  egress:\n    allow: [x]\n",
            &["unknown field `allow`"],
        );
        let f = write(
            "e2b:\n  egress:\n    default: [\"*\"]\n    keys:\n      \
             00000000-0000-0000-0000-00000000000a: []\n",
        );
        let config = load(Some(f.path()), &[]).expect("a valid grant");
        let grants = &config.config.e2b.egress;
        assert!(grants
            .grant_of("00000000-0000-0000-0000-00000000000A")
            .is_nothing());
        assert_eq!(
            grants.grant_of("another"),
            aegis_sandboxes::e2b_egress::Grant::AnyHost
        );
    }

    #[test]
    fn the_cluster_listener_needs_a_long_secret_and_a_reachable_address() {
        refused("cluster:\n  listen: 127.0.0.1:0\n", &["cluster.secret"]);
        refused(
            "cluster:\n  listen: 127.0.0.1:0\n  secret: short\n",
            &["at least 32"],
        );
        let secret = "s".repeat(32);
        refused(
            &format!("cluster:\n  listen: 0.0.0.0:8090\n  secret: {secret}\n"),
            &["cluster.advertise"],
        );
        refused("cluster:\n  advertise: http://a:1\n", &["`listen` is not"]);
        let f = write(&format!(
            "cluster:\n  listen: 127.0.0.1:0\n  secret: {secret}\n"
        ));
        let loaded = load(Some(f.path()), &[]).expect("valid");
        assert_eq!(
            redacted(&loaded.config).cluster.secret.as_deref(),
            Some("***")
        );
    }

    #[test]
    fn the_pool_refill_delay_is_bounded_and_named_when_refused() {
        let delay = |text: &str| {
            let f = write(text);
            load(Some(f.path()), &[]).map(|l| l.config.sandbox.pool_refill_delay_ms)
        };
        assert_eq!(delay("sandbox: {}\n").expect("default"), 250);
        assert_eq!(
            delay("sandbox:\n  pool_refill_delay_ms: 0\n").expect("valid"),
            0
        );
        let err = delay("sandbox:\n  pool_refill_delay_ms: 60000\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("sandbox.pool_refill_delay_ms"), "{err}");
        assert!(err.contains("at most 5000"), "{err}");
    }

    #[test]
    fn the_lease_stays_inside_dead_after_by_a_margin() {
        let lease = |text: &str| {
            let f = write(text);
            load(Some(f.path()), &[]).map(|l| l.config.sandbox.lease())
        };
        // Unset (0): two thirds of dead_after, even for one second.
        assert_eq!(
            lease("sandbox:\n  dead_after_secs: 30\n").expect("valid"),
            std::time::Duration::from_secs(20)
        );
        assert_eq!(
            lease("sandbox:\n  dead_after_secs: 1\n").expect("valid"),
            std::time::Duration::from_nanos(666_666_666)
        );
        assert_eq!(
            lease("sandbox:\n  dead_after_secs: 4\n  lease_secs: 3\n").expect("valid"),
            std::time::Duration::from_secs(3)
        );
        for bad in [
            "sandbox:\n  dead_after_secs: 4\n  lease_secs: 4\n",
            "sandbox:\n  dead_after_secs: 30\n  lease_secs: 23\n",
        ] {
            let err = lease(bad).unwrap_err().to_string();
            assert!(err.contains("sandbox.lease_secs"), "{bad}: {err}");
            assert!(err.contains("three quarters of dead_after_secs"), "{err}");
        }
    }

    #[test]
    fn an_engine_bound_and_the_engine_address_are_checked() {
        refused(
            "sandbox:\n  max_per_engine: 0\n",
            &["sandbox.max_per_engine"],
        );
        refused(
            "sandbox:\n  max_memory_mb: 512\n  max_memory_per_engine_mb: 256\n",
            &["sandbox.max_memory_per_engine_mb"],
        );
        for host in [
            "docker.sock",
            "ssh://h",
            "tcp://",
            "tcp://h:1/x",
            "unix://relative",
        ] {
            refused(&format!("docker:\n  host: \"{host}\"\n"), &["docker.host"]);
        }
        let f = write(
            "sandbox:\n  max_per_engine: 8\n  max_memory_per_engine_mb: 4096\n\
             docker:\n  host: unix:///run/aegis-engine2/docker.sock\n",
        );
        let loaded = load(Some(f.path()), &[]).expect("valid");
        assert_eq!(loaded.config.sandbox.max_per_engine, Some(8));
        for host in ["tcp://10.0.0.2:2375", "/var/run/docker.sock"] {
            let f = write(&format!("docker:\n  host: \"{host}\"\n"));
            load(Some(f.path()), &[]).unwrap_or_else(|e| panic!("{host}: {e}"));
        }
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        refused(
            "server:\n  http: 127.0.0.1:1\n  grcp: 127.0.0.1:2\n",
            &["grcp", "line 3"],
        );
    }

    #[test]
    fn runtime_aliases_map_to_installed_runtimes_and_name_key_and_line() {
        let f = write("sandbox:\n  runtime_aliases:\n    \"python:3.10\": \"python:3.11\"\n");
        let loaded = load(Some(f.path()), &[]).expect("valid");
        assert_eq!(
            loaded.config.sandbox.runtime_alias("python", "3.10"),
            Some(("python".to_owned(), "3.11".to_owned()))
        );
        assert_eq!(loaded.config.sandbox.runtime_alias("python", "3.9"), None);
        for (entry, says) in [
            (
                "\"python:3.10\": \"python:2.7\"",
                "not an installed runtime",
            ),
            ("\"python:3.11\": \"python:3.11\"", "cannot replace it"),
            ("python3.10: \"python:3.11\"", "not `language:version`"),
        ] {
            let err = load_error(&format!(
                "sandbox:\n  require_landlock: true\n  runtime_aliases:\n    {entry}\n"
            ));
            assert!(err.contains("sandbox.runtime_aliases"), "{err}");
            assert!(err.contains("line 4"), "{err}");
            assert!(err.contains(says), "{err}");
        }
    }

    #[test]
    fn wrong_type_names_key_and_line() {
        let text = "database:\n  max_connections: many\n";
        refused(text, &["database.max_connections", "line 2"]);
    }

    #[test]
    fn bad_value_names_key_line_and_expectation() {
        let text = "database:\n  url: postgres://u@h:5432/db\n  max_connections: 0\n";
        refused(text, &["database.max_connections", "line 3", "at least 1"]);
    }

    #[test]
    fn an_empty_admin_key_variable_means_unset_and_the_key_file_is_a_key() {
        let env = vec![
            ("ORCHESTRATOR_ADMIN_KEY".to_owned(), String::new()),
            (
                "ORCHESTRATOR__AUTH__ADMIN_KEY_FILE".to_owned(),
                "/var/lib/orchestrator/admin-key".to_owned(),
            ),
        ];
        let loaded = load(None, &env).expect("valid");
        assert_eq!(loaded.config.auth.admin_key, None);
        assert_eq!(
            loaded.config.auth.admin_key_file,
            Some(PathBuf::from("/var/lib/orchestrator/admin-key"))
        );
    }

    #[test]

    fn volume_and_delivery_settings_are_checked() {
        let err = load_error("executions:\n  skip_judge_tools: [fs.read, fs.teleport]\n");
        assert!(
            err.contains("executions.skip_judge_tools") && err.contains("fs.teleport"),
            "{err}"
        );
        let err = load_error("delivery:\n  max_attempts: 0\n");
        assert!(err.contains("delivery.max_attempts"), "{err}");
        let err = load_error("volumes:\n  max_size_mb: 0\n");
        assert!(err.contains("volumes.max_size_mb"), "{err}");
        let f =
            write("delivery:\n  secrets: {hook: HOOK_SECRET}\nvolumes:\n  default_ttl_hours: 2\n");
        let loaded = load(Some(f.path()), &[]).unwrap();
        assert_eq!(loaded.config.delivery.secrets["hook"], "HOOK_SECRET");
        assert_eq!(loaded.config.volumes.default_ttl_hours, 2);
    }

    #[test]
    fn env_overrides_win_and_are_blamed() {
        let f = write("server:\n  http: 127.0.0.1:1\n");
        let env = vec![
            (
                "ORCHESTRATOR__SERVER__HTTP".to_owned(),
                "127.0.0.1:9".to_owned(),
            ),
            ("DATABASE_URL".to_owned(), "postgres://a@b:1/c".to_owned()),
        ];
        let loaded = load(Some(f.path()), &env).expect("valid");
        assert_eq!(loaded.config.server.http.port(), 9);
        assert_eq!(loaded.config.database.url, "postgres://a@b:1/c");

        let env = vec![("ORCHESTRATOR__SERVER__HTTPS".to_owned(), "x".to_owned())];
        let err = load(None, &env).unwrap_err().to_string();
        assert!(err.contains("ORCHESTRATOR__SERVER__HTTPS"), "{err}");
        assert!(err.contains("server.https"), "{err}");

        let env = vec![(
            "ORCHESTRATOR__SERVER__HTTP".to_owned(),
            "nowhere".to_owned(),
        )];
        let err = load(None, &env).unwrap_err().to_string();
        assert!(err.contains("ORCHESTRATOR__SERVER__HTTP"), "{err}");
    }

    #[test]
    fn database_url_parts_are_named() {
        let cases = [
            ("mysql://u@h:1/db", "scheme"),
            ("postgres://u@h:notaport/db", "port"),
            ("postgres://u@h:5432/", "database name"),
            ("postgres://u@:5432/db", "host"),
            ("localhost:5432/db", "scheme"),
            ("just words", "no scheme"),
        ];
        for (url, part) in cases {
            let err = check_database_url(url).unwrap_err();
            assert!(err.contains(part), "{url}: {err}");
        }
        assert!(check_database_url("postgresql://u:p@127.0.0.1:5432/db").is_ok());
    }

    #[test]
    fn lines_of_list_items_and_their_keys_are_found() {
        let text = "log:\n  level: info\nmcp_servers:\n  - name: a\n    url: http://a/mcp\n  - name: b\n    # comment\n    url: http://b/mcp\negress:\n  allow_cidrs:\n  - 10.0.0.0/8\n  - bad\n";
        assert_eq!(line_of_key(text, "log.level"), Some(2));
        assert_eq!(line_of_key(text, "mcp_servers[0]"), Some(4));
        assert_eq!(line_of_key(text, "mcp_servers[0].url"), Some(5));
        assert_eq!(line_of_key(text, "mcp_servers[1].name"), Some(6));
        assert_eq!(line_of_key(text, "mcp_servers[1].url"), Some(8));
        assert_eq!(line_of_key(text, "mcp_servers[2].url"), None);
        assert_eq!(line_of_key(text, "egress.allow_cidrs[1]"), Some(12));
        assert_eq!(line_of_key(text, "egress.timeout_secs"), None);
    }

    #[test]
    fn mcp_servers_are_validated_with_key_and_line() {
        let err =
            load_error("mcp_servers:\n  - name: tools\n    url: http://169.254.169.254/mcp\n");
        assert!(
            err.contains("mcp_servers[0].url")
                && err.contains("line 3")
                && err.contains("cloud_metadata"),
            "{err}"
        );
        let err =
            load_error("mcp_servers:\n  - name: tools\n    url: http://x/mcp\n    token: abc\n");
        assert!(err.contains("token") && err.contains("line 4"), "{err}");
        let f = write(
            "egress:\n  allow_cidrs: [127.0.0.1/32]\nmcp_servers:\n  - name: tools\n    url: http://127.0.0.1:9/mcp\n    bearer_token_env: TOOLS_TOKEN\n",
        );
        let loaded = load(Some(f.path()), &[]).expect("a loopback server opened by allow_cidrs");
        assert_eq!(loaded.config.mcp_servers[0].timeout_secs, 30);
        // From the environment (a YAML flow sequence), blamed on the variable.
        let env = vec![(
            "ORCHESTRATOR__MCP_SERVERS".to_owned(),
            "[{name: tools, url: 'http://10.1.2.3/mcp'}]".to_owned(),
        )];
        let err = load(None, &env).unwrap_err().to_string();
        assert!(
            err.contains("mcp_servers[0].url") && err.contains("ORCHESTRATOR__MCP_SERVERS"),
            "{err}"
        );
    }

    #[test]
    fn redaction_hides_password() {
        assert_eq!(
            redact_url("postgres://u:secret@h:1/db"),
            "postgres://u:***@h:1/db"
        );
    }
}
