//! The outside world: how the orchestrator itself reaches the Internet, and under which rules.
//!
//! `web.fetch` and `web.search` run here, in the orchestrator, never in a sandbox. Every
//! connection (a `web.fetch` hop, a sandbox's proxied connection, a result delivery) passes the
//! same gates, in one function, [`Egress::admit`]: the host as written must be admitted by every
//! domain rule that applies ([`domains`]), the name is resolved once and every address checked
//! against the blocked ranges ([`address`], [`resolve`]) and against the CIDR entries of every
//! denylist, and the connection is made to exactly the checked addresses, with redirects
//! followed by hand so each hop passes the gates again ([`fetch`]). No proxy is taken from the
//! environment. Fetched documents are turned into text under limits of their own ([`document`]).

pub mod address;
/// Result delivery (`spec.execution.delivery`): durable rows and a leased worker that signs and
/// sends them through [`Egress::admit`].
pub mod delivery;
pub mod document;
pub mod domains;
pub mod fetch;
/// The operator's external MCP servers: clients that reach out only through [`Egress::admit`].
pub mod mcp_servers;
pub mod proxy;
pub mod resolve;
pub mod search;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use address::{AddressPolicy, Blocked, BlockedClass};
pub use domains::{DomainEntry, DomainPolicy, DomainRefused, DomainRule};
pub use fetch::{FetchError, Fetched};
pub use resolve::{ResolveError, Resolver};

/// `egress:` in the node configuration.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// Internal ranges made reachable on purpose (an internal mirror), as CIDR blocks; each is
    /// logged at start. Cloud-metadata addresses stay blocked whatever is listed.
    pub allow_cidrs: Vec<String>,
    /// Static name -> addresses map consulted before DNS, like /etc/hosts.
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    /// Largest response body kept, bytes; longer bodies are cut and flagged `truncated`.
    pub max_body_bytes: u64,
    /// Most redirects followed by one fetch.
    pub max_redirects: u32,
    /// Time allowed to open a connection, seconds.
    pub connect_timeout_secs: u64,
    /// Time allowed for a whole fetch, redirects included, seconds.
    pub timeout_secs: u64,
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            allow_cidrs: Vec::new(),
            hosts: BTreeMap::new(),
            max_body_bytes: 2 * 1024 * 1024,
            max_redirects: 5,
            connect_timeout_secs: 10,
            timeout_secs: 30,
        }
    }
}

/// Why a target did not pass the gates of [`Egress::admit`].
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// A domain rule refused the host as written, or one of the addresses it resolved to.
    #[error(transparent)]
    Domain(DomainRefused),
    /// The host did not resolve, or resolved to a blocked range.
    #[error(transparent)]
    Resolve(ResolveError),
}

impl Refused {
    /// Stable code for tool results and audit rows.
    pub fn code(&self) -> &'static str {
        match self {
            Refused::Domain(refused) => refused.code(),
            Refused::Resolve(ResolveError::Blocked { .. }) => "address_blocked",
            Refused::Resolve(ResolveError::NotFound { .. }) => "name_not_resolved",
        }
    }
}

/// A configuration value that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("egress.{key}: {message}")]
pub struct EgressConfigError {
    /// The key under `egress`.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

/// The egress rules of this node, built once at start from [`EgressConfig`].
#[derive(Debug, Clone)]
pub struct Egress {
    /// Resolver with the address policy.
    pub resolver: Resolver,
    /// Body cap, bytes.
    pub max_body_bytes: u64,
    /// Redirect hop limit.
    pub max_redirects: u32,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Whole-fetch timeout.
    pub timeout: Duration,
}

impl Egress {
    /// The gates of one connection to `host:port`, in the one order every path out uses: the
    /// domain rules on the host as written, resolution with every address checked against the
    /// blocked ranges, then the domain rules' deny CIDRs on every resolved address. The answer is
    /// the only set of addresses the caller may connect to (pinned, so nothing resolves twice).
    pub async fn admit(
        &self,
        domains: &DomainPolicy,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, Refused> {
        domains.check(host, port).map_err(Refused::Domain)?;
        let addrs = self
            .resolver
            .resolve(host, port)
            .await
            .map_err(Refused::Resolve)?;
        domains
            .check_addresses(host, port, addrs.iter().map(SocketAddr::ip))
            .map_err(Refused::Domain)?;
        Ok(addrs)
    }

    /// Validates the configuration and builds the rules.
    pub fn from_config(config: &EgressConfig) -> Result<Self, EgressConfigError> {
        let mut exceptions = Vec::new();
        for (i, text) in config.allow_cidrs.iter().enumerate() {
            let net = text.parse().map_err(|e| EgressConfigError {
                key: format!("allow_cidrs[{i}]"),
                message: format!("`{text}` is not a CIDR block such as 10.1.2.0/24: {e}"),
            })?;
            exceptions.push(net);
        }
        for (key, value) in [
            ("max_body_bytes", config.max_body_bytes),
            ("connect_timeout_secs", config.connect_timeout_secs),
            ("timeout_secs", config.timeout_secs),
        ] {
            if value == 0 {
                return Err(EgressConfigError {
                    key: key.to_owned(),
                    message: "expected a whole number of at least 1".to_owned(),
                });
            }
        }
        let hosts = config
            .hosts
            .iter()
            .map(|(name, ips)| (name.trim_end_matches('.').to_ascii_lowercase(), ips.clone()))
            .collect();
        Ok(Self {
            resolver: Resolver::new(hosts, AddressPolicy::new(exceptions)),
            max_body_bytes: config.max_body_bytes,
            max_redirects: config.max_redirects,
            connect_timeout: Duration::from_secs(config.connect_timeout_secs),
            timeout: Duration::from_secs(config.timeout_secs),
        })
    }
}
