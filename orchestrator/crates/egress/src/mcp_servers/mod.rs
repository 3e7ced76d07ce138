//! External MCP servers: the operator's servers whose tools agents and callers may use.
//!
//! The node config declares each server (`mcp_servers`, [`config`]): a name, a Streamable HTTP
//! URL and its credentials' environment variables. This module is the client side. It keeps
//! one MCP session per server (rmcp's client over [`http::PinnedHttp`]), opened when first
//! needed and opened again when it has closed; every connection passes the egress gate first
//! (the URL's host resolved once, every address checked against the blocked ranges and
//! `egress.allow_cidrs`, the connection pinned to them), and every call checks the caller's
//! domain rules against that host and those addresses. It keeps each server's tool listing
//! (`tools/list`, all pages) for `tools_ttl_secs`, asks again when it is older or when a name
//! is not in it, and keeps an older listing when the server cannot be reached.
//!
//! Nothing here decides whether a call may run: the router does, as for every tool (catalog
//! lookup through `tools::external`, argument schema, tier, security context, audit). This
//! module only reaches the server and bounds what comes back ([`result`]): a call or a listing
//! never outlives the server's `timeout_secs`, a response is refused past
//! `max_response_bytes`, a result is cut to `max_result_bytes` and flagged.
//!
//! The session is the node's, shared by all callers: the server sees one client with the
//! node's credentials, whoever asked.

pub mod config;
pub mod http;
pub mod redact;
pub mod result;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransport, StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::ServiceExt;
use serde_json::{Map, Value};

pub use config::McpServerConfig;

use crate::{DomainPolicy, Egress, Refused};
use http::{HttpError, PinnedHttp};

pub use aegis_core::catalog::EXTERNAL_PREFIX as PREFIX;
/// Most tools taken from one server's listing.
const MAX_TOOLS_PER_SERVER: usize = 512;
/// Longest tool description kept, bytes.
const MAX_DESCRIPTION: usize = 2048;
/// A listing is not asked for again sooner than this after the last attempt.
const MIN_RELIST: Duration = Duration::from_secs(5);

/// Splits `mcp:<server>/<tool>` into its parts; `None` for any other shape.
pub fn split_name(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix(PREFIX)?;
    let (server, tool) = rest.split_once('/')?;
    (config::is_server_name(server) && !tool.is_empty()).then_some((server, tool))
}

/// The catalog name of `tool` of `server`.
pub fn full_name(server: &str, tool: &str) -> String {
    format!("{PREFIX}{server}/{tool}")
}

/// A tool of an external server, as its listing described it.
#[derive(Debug)]
pub struct RemoteTool {
    /// The server's name (`mcp_servers[].name`).
    pub server: String,
    /// The tool's name on that server.
    pub name: String,
    /// `mcp:<server>/<name>`.
    pub full_name: String,
    /// What the server says it does (cut to 2 KiB).
    pub description: String,
    /// Its argument schema, as listed.
    pub input_schema: Value,
    /// The argument schema, compiled once per listing.
    pub validator: Arc<jsonschema::Validator>,
}

/// Why a server could not be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum McpError {
    /// No server of that name is configured.
    #[error("this node has no MCP server `{0}`")]
    NoSuchServer(String),
    /// The egress gate refused the server's host (domain rules, blocked address, no answer).
    #[error("MCP server `{server}`: {message}")]
    Refused {
        /// The server.
        server: String,
        /// Stable code of the refusal (`address_blocked`, `domain_not_allowed`, ...).
        code: &'static str,
        /// The refusal.
        message: String,
    },
    /// A credential's environment variable is not set.
    #[error("MCP server `{server}`: the environment variable `{var}` holding its credential is not set on this node")]
    CredentialMissing {
        /// The server.
        server: String,
        /// The variable.
        var: String,
    },
    /// The server could not be reached or the connection failed.
    #[error("MCP server `{server}` cannot be reached: {message}")]
    Unreachable {
        /// The server.
        server: String,
        /// What failed.
        message: String,
    },
    /// The server refused the node's credentials.
    #[error("MCP server `{server}` refused the node's credentials: {message}")]
    Unauthorized {
        /// The server.
        server: String,
        /// The status and body start.
        message: String,
    },
    /// No answer in time.
    #[error("MCP server `{server}` did not answer {what} within {secs} s")]
    Timeout {
        /// The server.
        server: String,
        /// What was asked.
        what: &'static str,
        /// The limit.
        secs: u64,
    },
    /// A response over the byte cap.
    #[error("MCP server `{server}` sent a response larger than {max} bytes (max_response_bytes); nothing of it is used")]
    TooLarge {
        /// The server.
        server: String,
        /// The cap.
        max: u64,
    },
    /// The server answered with a JSON-RPC error (unknown tool, invalid arguments, ...).
    #[error("MCP server `{server}` answered with an error: {message}")]
    Protocol {
        /// The server.
        server: String,
        /// The JSON-RPC error code and message.
        message: String,
    },
}

impl McpError {
    /// Stable code for tool results and audit rows.
    pub fn code(&self) -> &'static str {
        match self {
            McpError::NoSuchServer(_) => "mcp_server_unknown",
            McpError::Refused { code, .. } => code,
            McpError::CredentialMissing { .. } => "mcp_credentials_missing",
            McpError::Unreachable { .. } => "mcp_unreachable",
            McpError::Unauthorized { .. } => "mcp_unauthorized",
            McpError::Timeout { .. } => "mcp_timeout",
            McpError::TooLarge { .. } => "mcp_result_too_large",
            McpError::Protocol { .. } => "mcp_error",
        }
    }

    /// The error with `redactor`'s credentials taken out of every text that may hold the
    /// server's words (or a transport's account of them).
    pub fn redacted(self, redactor: &redact::Redactor) -> Self {
        match self {
            McpError::Refused {
                server,
                code,
                message,
            } => McpError::Refused {
                server,
                code,
                message: redactor.text(&message),
            },
            McpError::Unreachable { server, message } => McpError::Unreachable {
                server,
                message: redactor.text(&message),
            },
            McpError::Unauthorized { server, message } => McpError::Unauthorized {
                server,
                message: redactor.text(&message),
            },
            McpError::Protocol { server, message } => McpError::Protocol {
                server,
                message: redactor.text(&message),
            },
            // Only the node's own words (names from the config, numbers).
            e @ (McpError::NoSuchServer(_)
            | McpError::CredentialMissing { .. }
            | McpError::Timeout { .. }
            | McpError::TooLarge { .. }) => e,
        }
    }
}

/// One open session and what its connection was pinned to.
struct Session {
    service: RunningService<RoleClient, ClientConfig>,
    http: PinnedHttp,
    addrs: Vec<SocketAddr>,
}

/// The last listing of a server's tools.
#[derive(Default)]
struct Listing {
    tools: Arc<Vec<Arc<RemoteTool>>>,
    fetched_at: Option<Instant>,
    attempted_at: Option<Instant>,
    error: Option<McpError>,
}

/// One configured server.
struct Server {
    config: McpServerConfig,
    host: String,
    host_is_name: bool,
    port: u16,
    timeout: Duration,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    listing: Mutex<Listing>,
    relist: tokio::sync::Mutex<()>,
}

/// The node's external MCP servers.
pub struct McpServers {
    servers: BTreeMap<String, Arc<Server>>,
    egress: Arc<Egress>,
}

impl McpServers {
    /// The servers of a validated configuration (a URL that does not parse is left out, with
    /// an error in the log; config validation refuses it before this is reached).
    pub fn new(configs: &[McpServerConfig], egress: Arc<Egress>) -> Self {
        let mut servers = BTreeMap::new();
        for config in configs {
            let Ok(url) = url::Url::parse(&config.url) else {
                tracing::error!(server = %config.name, "mcp_servers: the URL does not parse; server left out");
                continue;
            };
            let (host, host_is_name) = match url.host() {
                Some(url::Host::Domain(d)) => (d.trim_end_matches('.').to_ascii_lowercase(), true),
                Some(url::Host::Ipv4(ip)) => (ip.to_string(), false),
                Some(url::Host::Ipv6(ip)) => (ip.to_string(), false),
                None => {
                    tracing::error!(server = %config.name, "mcp_servers: the URL has no host; server left out");
                    continue;
                }
            };
            for var in credential_vars(config) {
                if std::env::var_os(var).is_none() {
                    tracing::warn!(server = %config.name, variable = %var,
                        "mcp_servers: a credential's environment variable is not set; calls will fail until it is");
                }
            }
            servers.insert(
                config.name.clone(),
                Arc::new(Server {
                    host,
                    host_is_name,
                    port: url.port_or_known_default().unwrap_or(80),
                    timeout: Duration::from_secs(config.timeout_secs),
                    config: config.clone(),
                    session: tokio::sync::Mutex::new(None),
                    listing: Mutex::new(Listing::default()),
                    relist: tokio::sync::Mutex::new(()),
                }),
            );
        }
        Self { servers, egress }
    }

    /// The configured servers' names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.servers.keys().cloned().collect()
    }

    /// A server's configuration.
    pub fn config(&self, server: &str) -> Option<&McpServerConfig> {
        self.servers.get(server).map(|s| &s.config)
    }

    /// The server's tools: the cached listing while it is fresh, else a new one. When the
    /// server cannot be listed, an older listing is kept and returned; with none, the error.
    pub async fn tools(&self, server: &str) -> Result<Arc<Vec<Arc<RemoteTool>>>, McpError> {
        let s = self.server(server)?;
        self.listing(&s, false).await
    }

    /// `mcp:<server>/<tool>` by name. A name missing from a listing older than a few seconds
    /// asks the server again (it may have gained the tool).
    pub async fn find(&self, full_name: &str) -> Result<Option<Arc<RemoteTool>>, McpError> {
        let Some((server, _)) = split_name(full_name) else {
            return Ok(None);
        };
        let s = self.server(server)?;
        let tools = self.listing(&s, false).await?;
        if let Some(t) = tools.iter().find(|t| t.full_name == full_name) {
            return Ok(Some(t.clone()));
        }
        let tools = self.listing(&s, true).await?;
        Ok(tools.iter().find(|t| t.full_name == full_name).cloned())
    }

    /// Lists every server once (at start), so the first callers find listings ready.
    pub async fn discover(&self) {
        for (name, server) in &self.servers {
            match self.listing(server, false).await {
                Ok(tools) => {
                    tracing::info!(server = %name, tools = tools.len(), "MCP server listed")
                }
                Err(e) => {
                    tracing::warn!(server = %name, error = %e, "MCP server not listed; asked again when needed")
                }
            }
        }
    }

    /// Calls `tool` of `server` with `arguments` (already checked against its schema by the
    /// router), under `domains` (the caller's domain rules), and shapes the result.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Map<String, Value>,
        domains: &DomainPolicy,
    ) -> Result<result::Shaped, McpError> {
        let s = self.server(server)?;
        domains
            .check(&s.host, s.port)
            .map_err(|r| refused(&s, Refused::Domain(r)))?;
        let session = self.session(&s).await?;
        domains
            .check_addresses(&s.host, s.port, session.addrs.iter().map(SocketAddr::ip))
            .map_err(|r| refused(&s, Refused::Domain(r)))?;
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = Some(arguments);
        let oversize_before = session.http.oversize_count();
        let answer =
            tokio::time::timeout(s.timeout, session.service.peer().call_tool(params)).await;
        let answer = match answer {
            Err(_) => {
                return Err(McpError::Timeout {
                    server: server.to_owned(),
                    what: "the call",
                    secs: s.config.timeout_secs,
                })
            }
            Ok(Err(e)) => {
                let e = service_error(&s, &session, oversize_before, e);
                self.forget_if_closed(&s, &session).await;
                return Err(e);
            }
            Ok(Ok(answer)) => answer,
        };
        let mut value = serde_json::to_value(&answer).map_err(|e| McpError::Protocol {
            server: server.to_owned(),
            message: format!("the result cannot be read: {e}"),
        })?;
        // What the server sends back never carries the node's credentials to the caller (a
        // failed call's text also becomes an audit reason): the whole result, every string of
        // it, is redacted here, as it arrives, before anything is cut, shaped or serialised.
        // Off the async workers: a result of several MiB takes a while to search.
        let redactor = session.http.redactor().clone();
        let value = tokio::task::spawn_blocking(move || {
            redactor.value(&mut value);
            value
        })
        .await
        .map_err(|e| McpError::Protocol {
            server: server.to_owned(),
            message: format!("the result could not be redacted: {e}"),
        })?;
        Ok(result::shape(
            &value,
            usize::try_from(s.config.max_result_bytes).unwrap_or(usize::MAX),
        ))
    }

    fn server(&self, name: &str) -> Result<Arc<Server>, McpError> {
        self.servers
            .get(name)
            .cloned()
            .ok_or_else(|| McpError::NoSuchServer(name.to_owned()))
    }

    async fn listing(
        &self,
        s: &Arc<Server>,
        force: bool,
    ) -> Result<Arc<Vec<Arc<RemoteTool>>>, McpError> {
        let ttl = Duration::from_secs(s.config.tools_ttl_secs);
        let cached = |listing: &Listing, force: bool| -> Option<Result<_, McpError>> {
            let fresh = listing.fetched_at.is_some_and(|t| t.elapsed() < ttl);
            let recent = listing
                .attempted_at
                .is_some_and(|t| t.elapsed() < MIN_RELIST);
            if (fresh && !force) || recent {
                return Some(match (&listing.error, listing.fetched_at) {
                    (Some(e), None) => Err(e.clone()),
                    _ => Ok(listing.tools.clone()),
                });
            }
            None
        };
        if let Some(answer) = cached(&lock(&s.listing), force) {
            return answer;
        }
        // One listing at a time per server; whoever waited uses the one just made.
        let _relisting = s.relist.lock().await;
        if let Some(answer) = cached(&lock(&s.listing), force) {
            return answer;
        }
        let listed = self.list_tools(s).await;
        let mut listing = lock(&s.listing);
        listing.attempted_at = Some(Instant::now());
        match listed {
            Ok(tools) => {
                listing.tools = Arc::new(tools);
                listing.fetched_at = listing.attempted_at;
                listing.error = None;
                Ok(listing.tools.clone())
            }
            Err(e) => {
                tracing::warn!(server = %s.config.name, error = %e, "cannot list the tools of an MCP server");
                listing.error = Some(e.clone());
                match listing.fetched_at {
                    Some(_) => Ok(listing.tools.clone()),
                    None => Err(e),
                }
            }
        }
    }

    /// `tools/list`, every page, on the server's session (a closed session is opened again,
    /// once: listing is safe to repeat).
    async fn list_tools(&self, s: &Arc<Server>) -> Result<Vec<Arc<RemoteTool>>, McpError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let session = self.session(s).await?;
            let oversize_before = session.http.oversize_count();
            let listed =
                tokio::time::timeout(s.timeout, session.service.peer().list_all_tools()).await;
            match listed {
                Err(_) => {
                    return Err(McpError::Timeout {
                        server: s.config.name.clone(),
                        what: "tools/list",
                        secs: s.config.timeout_secs,
                    })
                }
                Ok(Ok(tools)) => {
                    return Ok(remote_tools(&s.config.name, tools, session.http.redactor()))
                }
                Ok(Err(e)) => {
                    let e = service_error(s, &session, oversize_before, e);
                    let closed = self.forget_if_closed(s, &session).await;
                    if !(closed && attempt == 1) {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Drops `session` when its transport has ended, so the next use opens a new one; true
    /// when it was dropped.
    async fn forget_if_closed(&self, s: &Server, session: &Arc<Session>) -> bool {
        if !session.service.is_closed() {
            return false;
        }
        let mut slot = s.session.lock().await;
        if slot.as_ref().is_some_and(|open| Arc::ptr_eq(open, session)) {
            *slot = None;
        }
        true
    }

    /// The server's open session, or a new one: the egress gate, the credentials from the
    /// environment, then MCP's initialisation, all within the server's timeout.
    async fn session(&self, s: &Arc<Server>) -> Result<Arc<Session>, McpError> {
        let mut slot = s.session.lock().await;
        if let Some(open) = slot.as_ref() {
            if !open.service.is_closed() {
                return Ok(open.clone());
            }
        }
        *slot = None;
        let opened = tokio::time::timeout(s.timeout, self.open(s))
            .await
            .unwrap_or_else(|_| {
                Err(McpError::Timeout {
                    server: s.config.name.clone(),
                    what: "the connection and initialisation",
                    secs: s.config.timeout_secs,
                })
            })?;
        let opened = Arc::new(opened);
        *slot = Some(opened.clone());
        Ok(opened)
    }

    async fn open(&self, s: &Server) -> Result<Session, McpError> {
        let addrs = self
            .egress
            .admit(&DomainPolicy::default(), &s.host, s.port)
            .await
            .map_err(|r| refused(s, r))?;
        let headers = credential_headers(&s.config)?;
        let max_response = usize::try_from(s.config.max_response_bytes).unwrap_or(usize::MAX);
        let http = PinnedHttp::new(
            &s.host,
            s.host_is_name,
            &addrs,
            headers,
            self.egress.connect_timeout.min(s.timeout),
            max_response,
        )
        .map_err(|e| unreachable(s, e.to_string()))?;
        let oversize_before = http.oversize_count();
        let transport = StreamableHttpClientTransport::with_client(
            http.clone(),
            StreamableHttpClientTransportConfig::with_uri(s.config.url.clone()),
        );
        let identity = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("aegis-orchestrator", env!("CARGO_PKG_VERSION")),
        );
        let service = identity.serve(transport).await.map_err(|e| {
            if http.oversize_count() > oversize_before {
                return McpError::TooLarge {
                    server: s.config.name.clone(),
                    max: s.config.max_response_bytes,
                };
            }
            transport_error(s, &e, e.to_string()).redacted(http.redactor())
        })?;
        tracing::debug!(server = %s.config.name, "MCP session opened");
        Ok(Session {
            service,
            http,
            addrs,
        })
    }
}

/// A lock; a panic while holding it leaves plain data behind, still usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn credential_vars(config: &McpServerConfig) -> impl Iterator<Item = &String> {
    config
        .bearer_token_env
        .iter()
        .chain(config.headers_from_env.values())
}

/// The server's credential headers, read from the environment now (never stored elsewhere).
fn credential_headers(config: &McpServerConfig) -> Result<HeaderMap, McpError> {
    let read = |var: &String| {
        std::env::var(var)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| McpError::CredentialMissing {
                server: config.name.clone(),
                var: var.clone(),
            })
    };
    let value = |var: &String, text: String| {
        let mut v = HeaderValue::from_str(&text).map_err(|_| McpError::Unauthorized {
            server: config.name.clone(),
            message: format!("the value of `{var}` is not a valid HTTP header value"),
        })?;
        v.set_sensitive(true);
        Ok::<_, McpError>(v)
    };
    let mut headers = HeaderMap::new();
    if let Some(var) = &config.bearer_token_env {
        let token = read(var)?;
        headers.insert(
            reqwest::header::AUTHORIZATION,
            value(var, format!("Bearer {token}"))?,
        );
    }
    for (name, var) in &config.headers_from_env {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| McpError::Unauthorized {
            server: config.name.clone(),
            message: format!("`{name}` is not an HTTP header name"),
        })?;
        headers.insert(name, value(var, read(var)?)?);
    }
    Ok(headers)
}

fn refused(s: &Server, r: Refused) -> McpError {
    McpError::Refused {
        server: s.config.name.clone(),
        code: r.code(),
        message: r.to_string(),
    }
}

fn unreachable(s: &Server, message: String) -> McpError {
    McpError::Unreachable {
        server: s.config.name.clone(),
        message,
    }
}

/// The HTTP failure somewhere in `e`'s causes, if the transport reported one.
fn http_failure(e: &(dyn std::error::Error + 'static)) -> Option<HttpError> {
    let mut current = Some(e);
    while let Some(error) = current {
        if let Some(found) = error.downcast_ref::<HttpError>() {
            return Some(found.clone());
        }
        if let Some(StreamableHttpError::Client(found)) =
            error.downcast_ref::<StreamableHttpError<HttpError>>()
        {
            return Some(found.clone());
        }
        current = error.source();
    }
    None
}

/// A transport failure named by what the HTTP layer saw, if it saw anything.
fn transport_error(s: &Server, e: &(dyn std::error::Error + 'static), text: String) -> McpError {
    match http_failure(e) {
        Some(HttpError::TooLarge { .. }) => McpError::TooLarge {
            server: s.config.name.clone(),
            max: s.config.max_response_bytes,
        },
        Some(HttpError::Status { status, body }) if status == 401 || status == 403 => {
            McpError::Unauthorized {
                server: s.config.name.clone(),
                message: HttpError::Status { status, body }.to_string(),
            }
        }
        Some(failure) => unreachable(s, failure.to_string()),
        None => unreachable(s, text),
    }
}

/// The failure of a request on an open session, redacted of the session's credentials.
fn service_error(s: &Server, session: &Session, oversize_before: u64, e: ServiceError) -> McpError {
    if session.http.oversize_count() > oversize_before {
        return McpError::TooLarge {
            server: s.config.name.clone(),
            max: s.config.max_response_bytes,
        };
    }
    let error = match e {
        ServiceError::McpError(error) => McpError::Protocol {
            server: s.config.name.clone(),
            message: format!("{} ({})", error.message, error.code.0),
        },
        ServiceError::Timeout { .. } => McpError::Timeout {
            server: s.config.name.clone(),
            what: "the call",
            secs: s.config.timeout_secs,
        },
        other => transport_error(s, &other, other.to_string()),
    };
    error.redacted(session.http.redactor())
}

/// A listing's tools as catalog candidates: names the catalog can carry, schemas that
/// compile, descriptions cut; anything else is left out with a warning.
///
/// A listing is the server's words too, shown to every caller that may list tools (readonly
/// keys included): each listed tool is redacted of the node's credentials whole (every string
/// and key of it: name, title, description, input and output schemas, annotations, whatever
/// a later revision adds) before any of it is read, and a tool whose name held one is left out.
fn remote_tools(
    server: &str,
    listed: Vec<rmcp::model::Tool>,
    redactor: &redact::Redactor,
) -> Vec<Arc<RemoteTool>> {
    if listed.len() > MAX_TOOLS_PER_SERVER {
        tracing::warn!(
            server,
            listed = listed.len(),
            kept = MAX_TOOLS_PER_SERVER,
            "MCP server lists more tools than are kept"
        );
    }
    let mut tools: Vec<Arc<RemoteTool>> = Vec::new();
    for tool in listed.into_iter().take(MAX_TOOLS_PER_SERVER) {
        let Some(tool) = redacted_tool(server, tool, redactor) else {
            continue;
        };
        let name = tool.name.to_string();
        let name_ok = !name.is_empty()
            && name.len() <= 128
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c));
        if !name_ok || tools.iter().any(|t| t.name == name) {
            tracing::warn!(server, tool = %name.chars().take(64).collect::<String>(),
                "MCP tool left out: its name is not 1-128 of [A-Za-z0-9_-./] or is listed twice");
            continue;
        }
        let input_schema = Value::Object((*tool.input_schema).clone());
        let validator = match jsonschema::validator_for(&input_schema) {
            Ok(v) => Arc::new(v),
            Err(e) => {
                tracing::warn!(server, tool = %name, error = %e, "MCP tool left out: its input schema does not compile");
                continue;
            }
        };
        let description = tool.description.as_deref().unwrap_or_default();
        let description = result::cut(description, MAX_DESCRIPTION).to_owned();
        tools.push(Arc::new(RemoteTool {
            server: server.to_owned(),
            full_name: full_name(server, &name),
            name,
            description,
            input_schema,
            validator,
        }));
    }
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    tools
}

/// `tool` with every string and key of it redacted; `None` (with a warning) when its name held
/// a credential or it no longer reads as a tool.
fn redacted_tool(
    server: &str,
    tool: rmcp::model::Tool,
    redactor: &redact::Redactor,
) -> Option<rmcp::model::Tool> {
    if redactor.is_empty() {
        return Some(tool);
    }
    let mut value = match serde_json::to_value(&tool) {
        Ok(value) => value,
        Err(e) => {
            tracing::warn!(server, error = %e, "MCP tool left out: its listing cannot be read");
            return None;
        }
    };
    redactor.value(&mut value);
    if value.get("name").and_then(Value::as_str) != Some(&*tool.name) {
        tracing::warn!(
            server,
            "MCP tool left out: its name repeats the node's credential for this server"
        );
        return None;
    }
    match serde_json::from_value(value) {
        Ok(clean) => Some(clean),
        Err(e) => {
            tracing::warn!(server, tool = %tool.name, error = %e,
                "MCP tool left out: its listing no longer reads as a tool once redacted");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_into_server_and_tool() {
        assert_eq!(
            split_name("mcp:gmail/send_email"),
            Some(("gmail", "send_email"))
        );
        assert_eq!(split_name("mcp:gh/repos/list"), Some(("gh", "repos/list")));
        assert_eq!(split_name("mcp:gmail"), None);
        assert_eq!(split_name("mcp:aegis.agent.search"), None);
        assert_eq!(split_name("mcp:Gmail/x"), None);
        assert_eq!(split_name("mcp:gmail/"), None);
        assert_eq!(split_name("fs.read"), None);
    }
}
