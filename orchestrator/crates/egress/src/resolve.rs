//! Turning a host into the addresses we will connect to, once, with every address checked.
//!
//! The answer of [`Resolver::resolve`] is what the connection uses: callers pin it (reqwest's
//! `resolve_to_addrs`, the proxy's `TcpStream::connect`), so a name cannot resolve to a public
//! address for the check and a private one for the connection (DNS rebinding). If any address of
//! a name is blocked the whole name is refused: a name that mixes public and internal addresses
//! is either misconfigured or an attack. `egress.hosts` is a static map consulted first, like
//! /etc/hosts, for operators (an internal mirror's name) and for offline tests.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use super::address::{AddressPolicy, Blocked};

/// Why a host could not be turned into addresses we may contact.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The name did not resolve.
    #[error("cannot resolve `{host}`: {message}")]
    NotFound {
        /// The host.
        host: String,
        /// The resolver's words.
        message: String,
    },
    /// The name (or literal) resolved to a blocked address.
    #[error("`{host}` resolves to a blocked address: {blocked}")]
    Blocked {
        /// The host.
        host: String,
        /// The first blocked address.
        blocked: Blocked,
    },
}

/// Resolves names with the static map first, then the system resolver, and checks the answers.
#[derive(Debug, Clone, Default)]
pub struct Resolver {
    hosts: BTreeMap<String, Vec<IpAddr>>,
    policy: AddressPolicy,
}

impl Resolver {
    /// A resolver with a static map (lower-case names) and the address policy to apply.
    pub fn new(hosts: BTreeMap<String, Vec<IpAddr>>, policy: AddressPolicy) -> Self {
        Self { hosts, policy }
    }

    /// The address policy in force.
    pub fn policy(&self) -> &AddressPolicy {
        &self.policy
    }

    /// The checked socket addresses of `host` (a name or an IP literal, brackets allowed).
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, ResolveError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let name = bare.trim_end_matches('.').to_ascii_lowercase();
        let addresses: Vec<IpAddr> = if let Ok(ip) = bare.parse::<IpAddr>() {
            vec![ip]
        } else if let Some(fixed) = self.hosts.get(&name) {
            fixed.clone()
        } else {
            tokio::net::lookup_host((name.as_str(), port))
                .await
                .map_err(|e| ResolveError::NotFound {
                    host: host.to_owned(),
                    message: e.to_string(),
                })?
                .map(|sa| sa.ip())
                .collect()
        };
        if addresses.is_empty() {
            return Err(ResolveError::NotFound {
                host: host.to_owned(),
                message: "no addresses".to_owned(),
            });
        }
        for ip in &addresses {
            self.policy
                .check(*ip)
                .map_err(|blocked| ResolveError::Blocked {
                    host: host.to_owned(),
                    blocked,
                })?;
        }
        Ok(addresses
            .into_iter()
            .map(|ip| SocketAddr::new(ip, port))
            .collect())
    }
}
