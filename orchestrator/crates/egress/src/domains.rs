//! Which host names the outside-world tools may reach: the intersection of every allowlist that
//! applies to a call.
//!
//! A call can be bounded by the caller's SEAL security context (`domain_allowlist` of the
//! capabilities covering the tool) and by the agent manifest (`spec.security.network`). Each
//! bound is one [`DomainRule`]; a host passes when every rule admits it, so adding a rule can
//! only narrow. `*.example.org` matches subdomains of `example.org`, not the apex itself. The
//! same check runs on every redirect hop, so a permitted site cannot redirect a fetch elsewhere.
//!
//! A rule is checked twice per connection: [`DomainPolicy::check`] on the host as written (names
//! and address literals), before anything is resolved, and [`DomainPolicy::check_addresses`] on
//! every address the host resolved to, before anything is connected. The second pass is what
//! makes a CIDR entry of a denylist hold by address: `127.0.0.0/8` denied refuses
//! `http://127.0.0.2/` and equally a name that resolves into that block, whatever the node's
//! `egress.allow_cidrs` opened. CIDR entries of an allowlist stay literal-only (they admit an
//! address written in a URL, never a name), so the second pass can only refuse.

use std::net::IpAddr;

use ipnet::IpNet;

use super::address::unwrap_embedded_v4;
use aegis_manifest::{NetworkMode, NetworkPolicy};

/// One entry of an allowlist: a host pattern, optionally with a port, or a CIDR block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DomainEntry {
    /// `example.org` (exact) or `*.example.org` (strict subdomains); `port` when `host:port`.
    Host {
        /// Lower-case pattern without a trailing dot.
        pattern: String,
        /// The only port allowed, when given.
        port: Option<u16>,
    },
    /// An IP block. In an allowlist it admits URLs whose host is an address literal in it; in a
    /// denylist it also refuses every name that resolves into it ([`DomainEntry::covers`]).
    Cidr(IpNet),
}

impl DomainEntry {
    /// Parses `host`, `*.host`, `host:port` or `a.b.c.d/n`; unknown shapes are an error.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Ok(net) = text.parse::<IpNet>() {
            return Ok(DomainEntry::Cidr(net));
        }
        let (host, port) = match text.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (
                h,
                Some(
                    p.parse::<u16>()
                        .map_err(|_| format!("`{text}`: `{p}` is not a port"))?,
                ),
            ),
            _ => (text, None),
        };
        let pattern = match host.strip_prefix("*.") {
            Some(body) => format!("*.{}", normalise_host(body)),
            None => normalise_host(host),
        };
        let body = pattern.strip_prefix("*.").unwrap_or(&pattern);
        if body.is_empty() || body.contains('*') || body.contains('/') {
            return Err(format!(
                "`{text}` is not a host, `*.host`, `host:port` or CIDR"
            ));
        }
        Ok(DomainEntry::Host { pattern, port })
    }

    /// True when this entry admits `host` (lower case, no trailing dot) on `port`; a host
    /// entry without a port admits any port, or only `default_ports` when given.
    pub fn admits(&self, host: &str, port: u16, default_ports: Option<&[u16]>) -> bool {
        match self {
            DomainEntry::Cidr(_) => host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_ok_and(|ip| self.covers(ip)),
            DomainEntry::Host { pattern, port: p } => {
                let port_ok = match (p, default_ports) {
                    (Some(p), _) => *p == port,
                    (None, Some(defaults)) => defaults.contains(&port),
                    (None, None) => true,
                };
                if !port_ok {
                    return false;
                }
                aegis_core::domain_matches(pattern, host)
            }
        }
    }
}

/// A host name as the resolver will look it up, so a rule and a request match however either
/// was spelt: lower case, no trailing dot, and a name written in Unicode or percent-encoded as
/// its IDNA ASCII form (`bücher.example` is `xn--bcher-kva.example`, which is what URLs and
/// DNS carry). A rule written in Unicode used to miss the ASCII form a request carries, so a
/// denylist entry could be stepped around. A name that is not valid IDNA stays as it is
/// (lower-cased); no resolver finds it.
pub fn normalise_host(host: &str) -> String {
    let host = host.trim_end_matches('.');
    if !host.is_ascii() || host.contains('%') {
        if let Ok(url::Host::Domain(domain)) = url::Host::parse(host) {
            return domain.trim_end_matches('.').to_owned();
        }
    }
    host.to_ascii_lowercase()
}

impl DomainEntry {
    /// True when this is a CIDR entry containing `address`, also when the address is an IPv6
    /// form carrying an IPv4 one (`::ffff:127.0.0.2` is in `127.0.0.0/8`), so the spelling of an
    /// address cannot step around a block. Host entries cover no address.
    pub fn covers(&self, address: IpAddr) -> bool {
        match self {
            DomainEntry::Cidr(net) => {
                net.contains(&address) || net.contains(&unwrap_embedded_v4(address))
            }
            DomainEntry::Host { .. } => false,
        }
    }
}

/// One bound on hosts, with where it came from (for error messages).
#[derive(Debug, Clone)]
pub struct DomainRule {
    /// `security context `x``, `manifest of agent `y``, ...
    pub source: String,
    /// Admitted entries (empty admits nothing); `None` admits every host not denied.
    pub allow: Option<Vec<DomainEntry>>,
    /// Refused entries (manifest `denylist`), checked before `allow`.
    pub deny: Vec<DomainEntry>,
    /// Entries that lift `deny` (E2B's `allowOut`, which takes precedence over `denyOut`): a
    /// host they admit as written, or an address a CIDR of theirs covers, is not refused by
    /// this rule's denylist. They admit nothing `allow` does not.
    pub exempt: Vec<DomainEntry>,
}

impl DomainRule {
    /// An agent manifest's `spec.security.network` as a rule: `none` admits nothing, `deny` only
    /// the allowlist, `allow` everything but the denylist (narrowed to the allowlist when one is
    /// given). The one reading of that section, for `web.*` and the sandbox egress proxy alike.
    pub fn of_network(agent: &str, network: &NetworkPolicy) -> Result<Self, String> {
        let parse = |list: &[String]| -> Result<Vec<DomainEntry>, String> {
            list.iter()
                .map(|e| {
                    DomainEntry::parse(e)
                        .map_err(|m| format!("agent `{agent}`: spec.security.network {m}"))
                })
                .collect()
        };
        let allow = parse(&network.allowlist)?;
        let deny = parse(&network.denylist)?;
        let allow = match network.mode {
            NetworkMode::None => Some(Vec::new()),
            NetworkMode::Deny => Some(allow),
            NetworkMode::Allow if allow.is_empty() => None,
            NetworkMode::Allow => Some(allow),
        };
        Ok(DomainRule {
            source: format!("network policy of agent `{agent}` (spec.security.network)"),
            allow,
            deny,
            exempt: Vec::new(),
        })
    }
}

/// Every rule that applies to one call; no rule means any host (addresses are still checked).
#[derive(Debug, Clone, Default)]
pub struct DomainPolicy {
    rules: Vec<DomainRule>,
    default_ports: Option<Vec<u16>>,
}

/// A host refused by a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct DomainRefused {
    /// The refused host.
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// Which rule refused it.
    pub source_name: String,
    /// When the refusal is by address: the resolved address a deny CIDR covers, and the entry.
    pub address: Option<(IpAddr, IpNet)>,
}

impl DomainRefused {
    fn describe(&self) -> String {
        match &self.address {
            None => format!(
                "host `{}` (port {}) is not allowed by the {}",
                self.host, self.port, self.source_name
            ),
            Some((ip, net)) => format!(
                "host `{}` (port {}) resolves to {ip}, which the {} denies ({net})",
                self.host, self.port, self.source_name
            ),
        }
    }

    /// Stable code: `domain_not_allowed` for the host as written, `address_denied` when a
    /// resolved address falls in a denied CIDR block.
    pub fn code(&self) -> &'static str {
        if self.address.is_some() {
            "address_denied"
        } else {
            "domain_not_allowed"
        }
    }
}

impl DomainPolicy {
    /// Adds a rule (narrows the policy).
    pub fn push(&mut self, rule: DomainRule) {
        self.rules.push(rule);
    }

    /// Restricts entries that name no port to `ports` (the egress proxy uses 80 and 443, so an
    /// allowlisted web host does not open its SSH or database port).
    pub fn with_default_ports(mut self, ports: &[u16]) -> Self {
        self.default_ports = Some(ports.to_vec());
        self
    }

    /// True when no rule bounds the hosts.
    pub fn is_unbounded(&self) -> bool {
        self.rules.is_empty()
    }

    /// Decides `host` on `port` under every rule.
    pub fn check(&self, host: &str, port: u16) -> Result<(), DomainRefused> {
        let host = normalise_host(host);
        for rule in &self.rules {
            let defaults = self.default_ports.as_deref();
            let exempt = rule.exempt.iter().any(|e| e.admits(&host, port, None));
            let denied = !exempt && rule.deny.iter().any(|e| e.admits(&host, port, None));
            let admitted = match &rule.allow {
                Some(allow) => allow.iter().any(|e| e.admits(&host, port, defaults)),
                None => defaults.is_none_or(|d| d.contains(&port)),
            };
            if denied || !admitted {
                return Err(DomainRefused {
                    host,
                    port,
                    source_name: rule.source.clone(),
                    address: None,
                });
            }
        }
        Ok(())
    }

    /// Refuses `host` when any address it resolved to lies in a CIDR entry of a rule's denylist.
    /// Runs after resolution and before connecting, on the very addresses the connection will
    /// use, so a name cannot reach what the same address written as a literal could not.
    pub fn check_addresses(
        &self,
        host: &str,
        port: u16,
        addresses: impl IntoIterator<Item = IpAddr> + Clone,
    ) -> Result<(), DomainRefused> {
        let host_written = normalise_host(host);
        for rule in &self.rules {
            if rule
                .exempt
                .iter()
                .any(|e| e.admits(&host_written, port, None))
            {
                continue;
            }
            for ip in addresses.clone() {
                if rule.exempt.iter().any(|e| e.covers(ip)) {
                    continue;
                }
                let Some(DomainEntry::Cidr(net)) = rule.deny.iter().find(|e| e.covers(ip)) else {
                    continue;
                };
                return Err(DomainRefused {
                    host: normalise_host(host),
                    port,
                    source_name: rule.source.clone(),
                    address: Some((ip, *net)),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_and_a_host_match_however_either_was_spelt() {
        let deny = DomainEntry::parse("bücher.example").unwrap();
        let wild = DomainEntry::parse("*.BÜCHER.example.").unwrap();
        for host in [
            "xn--bcher-kva.example",
            "BÜCHER.example",
            "b%C3%BCcher.example",
        ] {
            let host = normalise_host(host);
            assert!(deny.admits(&host, 443, None), "{host}");
            assert!(wild.admits(&format!("www.{host}"), 443, None), "{host}");
        }
        assert_eq!(normalise_host("Example.COM."), "example.com");
        assert_eq!(normalise_host("127.0.0.1"), "127.0.0.1");
    }

    fn rule(source: &str, allow: &[&str]) -> DomainRule {
        DomainRule {
            source: source.into(),
            allow: Some(
                allow
                    .iter()
                    .map(|e| DomainEntry::parse(e).expect("entry"))
                    .collect(),
            ),
            deny: vec![],
            exempt: vec![],
        }
    }

    #[test]
    fn wildcards_match_subdomains_not_the_apex() {
        let mut p = DomainPolicy::default();
        p.push(rule("a", &["*.example.org"]));
        assert!(p.check("www.example.org", 443).is_ok());
        assert!(p.check("a.b.example.org", 443).is_ok());
        assert!(p.check("example.org", 443).is_err());
        assert!(p.check("badexample.org", 443).is_err());
        assert!(p.check("example.org.evil.net", 443).is_err());
    }

    #[test]
    fn rules_intersect_and_ports_bind() {
        let mut p = DomainPolicy::default();
        p.push(rule("context", &["*.example.org", "docs.rs"]));
        p.push(rule("manifest", &["api.example.org:443", "docs.rs"]));
        assert!(p.check("api.example.org", 443).is_ok());
        assert!(p.check("api.example.org", 80).is_err());
        assert!(p.check("www.example.org", 443).is_err());
        assert!(p.check("docs.rs", 80).is_ok());
        assert!(p.check("docs.rs", 22).is_ok());
        let proxy = p.clone().with_default_ports(&[80, 443]);
        assert!(proxy.check("docs.rs", 22).is_err());
        assert!(proxy.check("docs.rs", 443).is_ok());
        let refused = p.check("crates.io", 443).expect_err("refused");
        assert_eq!(refused.source_name, "context");
    }

    #[test]
    fn deny_cidrs_hold_for_resolved_addresses_and_every_spelling() {
        let network = NetworkPolicy {
            mode: NetworkMode::Allow,
            allowlist: vec![],
            denylist: vec!["127.0.0.0/8".into(), "fd00::/8".into()],
        };
        let mut p = DomainPolicy::default();
        p.push(DomainRule::of_network("a", &network).expect("rule"));
        let ip = |s: &str| -> IpAddr { s.parse().expect("ip") };
        // As written: the literal is refused, in its IPv4-mapped spelling too; a name passes.
        assert!(p.check("127.0.0.2", 80).is_err());
        assert!(p.check("::ffff:127.0.0.2", 80).is_err());
        assert!(p.check("[::ffff:7f00:2]", 80).is_err());
        assert!(p.check("internal.test", 80).is_ok());
        // Resolved: a name landing in a denied block is refused with the address and entry.
        let refused = p
            .check_addresses("internal.test", 80, [ip("93.184.215.14"), ip("127.0.0.2")])
            .expect_err("denied by address");
        assert_eq!(refused.code(), "address_denied");
        assert_eq!(
            refused.address,
            Some((ip("127.0.0.2"), "127.0.0.0/8".parse().expect("net")))
        );
        assert!(
            refused.to_string().contains("resolves to 127.0.0.2"),
            "{refused}"
        );
        assert!(p
            .check_addresses("x.test", 80, [ip("::ffff:127.0.0.9")])
            .is_err());
        assert!(p.check_addresses("x.test", 80, [ip("fd00::5")]).is_err());
        assert!(p
            .check_addresses("x.test", 80, [ip("93.184.215.14")])
            .is_ok());
        // An allowlist CIDR never admits or refuses a name by its addresses.
        let mut q = DomainPolicy::default();
        q.push(rule("allow", &["10.0.0.0/8", "site.test"]));
        assert!(q
            .check_addresses("site.test", 80, [ip("127.0.0.1")])
            .is_ok());
        assert!(q.check("10.1.2.3", 80).is_ok());
        assert!(q.check("other.test", 80).is_err());
    }

    #[test]
    fn exempt_entries_lift_the_denylist_by_name_and_by_address() {
        let entry = |e: &str| DomainEntry::parse(e).expect("entry");
        let mut p = DomainPolicy::default();
        p.push(DomainRule {
            source: "rules".into(),
            allow: None,
            deny: vec![entry("0.0.0.0/0"), entry("blocked.test")],
            exempt: vec![
                entry("api.test"),
                entry("1.1.1.0/24"),
                entry("blocked.test"),
            ],
        });
        let ip = |s: &str| -> IpAddr { s.parse().expect("ip") };
        // A name it admits passes whatever it resolves to; an address its block covers too.
        assert!(p.check("api.test", 443).is_ok());
        assert!(p.check_addresses("api.test", 443, [ip("8.8.8.8")]).is_ok());
        assert!(p.check("1.1.1.1", 443).is_ok());
        assert!(p.check_addresses("x.test", 443, [ip("1.1.1.7")]).is_ok());
        assert!(p.check("blocked.test", 443).is_ok(), "allow wins over deny");
        // Anything else the denylist covers stays refused, by literal and by address.
        assert!(p.check("8.8.8.8", 443).is_err());
        assert!(p
            .check_addresses("x.test", 443, [ip("1.1.1.7"), ip("8.8.8.8")])
            .is_err());
        // Exempt entries admit nothing an allowlist does not.
        let mut q = DomainPolicy::default();
        q.push(DomainRule {
            source: "grant".into(),
            allow: Some(vec![entry("site.test")]),
            deny: vec![],
            exempt: vec![entry("api.test")],
        });
        assert!(q.check("api.test", 443).is_err());
    }

    #[test]
    fn bad_entries_are_named() {
        assert!(DomainEntry::parse("a.*.org").is_err());
        assert!(DomainEntry::parse("host:http").is_err());
        assert_eq!(
            DomainEntry::parse("10.0.0.0/8").expect("cidr"),
            DomainEntry::Cidr("10.0.0.0/8".parse().expect("net"))
        );
    }
}
