//! The way out of an E2B sandbox: what the operator grants a key (`e2b.egress` in the node
//! config), the sandbox's own rules (E2B's `allow_internet_access`, `network.allowOut` and
//! `denyOut`, changed live by `PUT /sandboxes/{id}/network`), and the two as the rules its
//! egress proxy applies to every connection.
//!
//! A connection passes when both admit it, and then the node's address checks
//! (`aegis_egress::Egress::admit`: loopback, private, link-local and cloud-metadata ranges stay
//! refused whatever either says). The operator's grant is an allowlist; the sandbox's rules
//! follow E2B: without `denyOut` everything is allowed, `allowOut` only lifts entries of
//! `denyOut` (allow takes precedence over deny), and `allow_internet_access: false` is
//! `denyOut: ["0.0.0.0/0"]`. So a key never reaches more than its grant, and an empty grant
//! (the default) leaves its sandboxes without network, whatever the SDK asks.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use aegis_core::settings::Invalid;
use aegis_egress::proxy::LiveRules;
use aegis_egress::{DomainEntry, DomainPolicy, DomainRule};
use dispatcher::SandboxId;

/// E2B's "all traffic" (`ctx.all_traffic`): in `denyOut`, every address, IPv6 included here.
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";
/// Most entries in one of `allowOut`, `denyOut` or a grant.
pub const MAX_ENTRIES: usize = 256;
/// The grant entry admitting any public host (on ports 80 and 443 unless a rule says more).
pub const ANY_HOST: &str = "*";

/// `e2b.egress` in the node configuration: what E2B sandboxes may reach, per API key.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EgressGrants {
    /// What the sandboxes of every key not named in `keys` may reach: host names
    /// (`pypi.org`, `*.pythonhosted.org`, optionally `:port`; without one, 80 and 443), CIDR
    /// blocks (address literals in them), or `*` for any public host. Empty (the default): no
    /// network.
    pub default: Vec<String>,
    /// Per API key id (a UUID, as `POST /v1/api-keys` answers it): replaces `default` for that
    /// key; an empty list gives it no network.
    pub keys: BTreeMap<String, Vec<String>>,
}

/// What the operator grants one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// No network at all.
    Nothing,
    /// Any public host (the address checks still hold).
    AnyHost,
    /// These entries only.
    Listed(Vec<DomainEntry>),
}

impl EgressGrants {
    /// Every entry is a host, `*.host`, `host:port`, CIDR block or `*`; every key a UUID.
    pub fn check(&self) -> Result<(), Invalid> {
        let list = |key: String, entries: &[String]| -> Result<(), Invalid> {
            if entries.len() > MAX_ENTRIES {
                return Err(Invalid::new(
                    key,
                    format!("{} entries; at most {MAX_ENTRIES}", entries.len()),
                ));
            }
            for (i, entry) in entries.iter().enumerate() {
                if entry.trim() != ANY_HOST {
                    parse_entry(entry).map_err(|m| {
                        Invalid::new(
                            format!("{key}[{i}]"),
                            format!("{m} (or `*` for any public host)"),
                        )
                    })?;
                }
            }
            Ok(())
        };
        list("egress.default".to_owned(), &self.default)?;
        for (id, entries) in &self.keys {
            if uuid::Uuid::parse_str(id).is_err() {
                return Err(Invalid::new(
                    format!("egress.keys.{id}"),
                    format!("`{id}` is not an API key id (a UUID, as POST /v1/api-keys answers)"),
                ));
            }
            list(format!("egress.keys.{id}"), entries)?;
        }
        Ok(())
    }

    /// What the key `key_id` is granted (its own list, else the default).
    pub fn grant_of(&self, key_id: &str) -> Grant {
        let entries = self
            .keys
            .iter()
            .find(|(id, _)| id.eq_ignore_ascii_case(key_id))
            .map_or(&self.default, |(_, e)| e);
        if entries.is_empty() {
            return Grant::Nothing;
        }
        if entries.iter().any(|e| e.trim() == ANY_HOST) {
            return Grant::AnyHost;
        }
        // Checked when the configuration was loaded; an entry that no longer parses admits
        // nothing.
        Grant::Listed(entries.iter().filter_map(|e| parse_entry(e).ok()).collect())
    }
}

impl Grant {
    /// True when the key's sandboxes have no network.
    pub fn is_nothing(&self) -> bool {
        matches!(self, Grant::Nothing)
    }

    /// The hosts the grant admits (`None`: every host; on the proxy's default ports unless an
    /// entry names one).
    fn allow(&self) -> Option<Vec<DomainEntry>> {
        match self {
            Grant::AnyHost => None,
            Grant::Nothing => Some(Vec::new()),
            Grant::Listed(entries) => Some(entries.clone()),
        }
    }

    /// The grant as the node reports it beside the sandbox's own rules.
    pub fn report(&self) -> Vec<String> {
        match self {
            Grant::Nothing => Vec::new(),
            Grant::AnyHost => vec![ANY_HOST.to_owned()],
            Grant::Listed(entries) => entries.iter().map(entry_text).collect(),
        }
    }
}

fn entry_text(entry: &DomainEntry) -> String {
    match entry {
        DomainEntry::Cidr(net) => net.to_string(),
        DomainEntry::Host {
            pattern,
            port: Some(p),
        } => format!("{pattern}:{p}"),
        DomainEntry::Host {
            pattern,
            port: None,
        } => pattern.clone(),
    }
}

/// One entry of E2B's lists or of a grant: a bare address is its own block (`8.8.8.8` denies
/// a name that resolves to it too), otherwise a host, `*.host`, `host:port` or CIDR block.
fn parse_entry(text: &str) -> Result<DomainEntry, String> {
    let text = text.trim();
    if text.is_empty() || text.len() > 253 {
        return Err(format!(
            "`{text}`: an entry is 1 to 253 characters (a host, `*.host`, `host:port`, an address or a CIDR block)"
        ));
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(DomainEntry::Cidr(ip.into()));
    }
    DomainEntry::parse(text)
}

/// A sandbox's own rules, as E2B's SDK sets them and reads them back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkRules {
    /// `allowOut`: entries that lift `denyOut`.
    pub allow_out: Vec<String>,
    /// `denyOut` (with `0.0.0.0/0` when `allow_internet_access` was false).
    pub deny_out: Vec<String>,
}

/// An entry of `allowOut`/`denyOut` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("network.{field}: {message}")]
pub struct RulesError {
    /// `allowOut[2]`, `denyOut`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl NetworkRules {
    /// The rules of a create or an update: `allow_internet_access: false` denies all traffic
    /// (E2B's meaning); every entry is checked.
    pub fn new(
        allow_out: Option<Vec<String>>,
        deny_out: Option<Vec<String>>,
        allow_internet_access: Option<bool>,
    ) -> Result<Self, RulesError> {
        let allow_out = allow_out.unwrap_or_default();
        let mut deny_out = deny_out.unwrap_or_default();
        for (field, list) in [("allowOut", &allow_out), ("denyOut", &deny_out)] {
            if list.len() > MAX_ENTRIES {
                return Err(RulesError {
                    field: field.to_owned(),
                    message: format!("{} entries; at most {MAX_ENTRIES}", list.len()),
                });
            }
            for (i, entry) in list.iter().enumerate() {
                parse_entry(entry).map_err(|message| RulesError {
                    field: format!("{field}[{i}]"),
                    message,
                })?;
            }
        }
        if allow_internet_access == Some(false) && !deny_out.iter().any(|d| is_all(d)) {
            deny_out.push(ALL_TRAFFIC.to_owned());
        }
        Ok(Self {
            allow_out,
            deny_out,
        })
    }

    /// True unless everything is denied and nothing allowed (then the sandbox needs no
    /// network, and a warm pool's sandbox serves it).
    pub fn admits_anything(&self) -> bool {
        !self.allow_out.is_empty() || !self.deny_out.iter().any(|d| is_all(d))
    }

    /// The rules as a rule of the proxy: deny what `denyOut` names (all traffic: IPv6 too),
    /// unless `allowOut` admits it; within `allow`, the grant's hosts (so a refusal by this
    /// rule is always one of the sandbox's own rules, never of the grant, which its own rule
    /// reports).
    fn rule(&self, allow: Option<Vec<DomainEntry>>) -> DomainRule {
        let parse = |list: &[String]| -> Vec<DomainEntry> {
            list.iter().filter_map(|e| parse_entry(e).ok()).collect()
        };
        let mut deny = parse(&self.deny_out);
        if self.deny_out.iter().any(|d| is_all(d)) {
            deny.extend(DomainEntry::parse("::/0"));
        }
        DomainRule {
            source: "sandbox's network rules (network.allowOut/denyOut)".to_owned(),
            allow,
            deny,
            exempt: parse(&self.allow_out),
        }
    }
}

fn is_all(entry: &str) -> bool {
    entry.trim() == ALL_TRAFFIC
}

/// What the proxy of a sandbox of a key granted `grant` with `rules` admits (`None` for rules:
/// none recorded, nothing admitted).
pub fn policy(grant: &Grant, rules: Option<&NetworkRules>) -> DomainPolicy {
    let mut domains = DomainPolicy::default();
    match rules {
        Some(rules) if !grant.is_nothing() => {
            let allow = grant.allow();
            domains.push(DomainRule {
                source: "operator's E2B egress grant for this API key (e2b.egress)".to_owned(),
                allow: allow.clone(),
                deny: Vec::new(),
                exempt: Vec::new(),
            });
            domains.push(rules.rule(allow));
        }
        _ => domains.push(DomainRule {
            source: if grant.is_nothing() {
                "operator's E2B egress grant for this API key (e2b.egress: none)"
            } else {
                "sandbox's network rules (none recorded)"
            }
            .to_owned(),
            allow: Some(Vec::new()),
            deny: Vec::new(),
            exempt: Vec::new(),
        }),
    }
    domains
}

/// The rules of one E2B sandbox's proxy, read from its row for every connection: an update
/// (on any replica) holds from the next connection, and a restarted instance that adopts the
/// sandbox needs nothing remembered.
pub struct SandboxRules {
    pool: PgPool,
    sandbox: SandboxId,
    grants: std::sync::Arc<EgressGrants>,
}

impl SandboxRules {
    /// The rules of `sandbox` (the dispatcher's id), under `grants`.
    pub fn new(pool: PgPool, sandbox: SandboxId, grants: std::sync::Arc<EgressGrants>) -> Self {
        Self {
            pool,
            sandbox,
            grants,
        }
    }
}

impl LiveRules for SandboxRules {
    fn current(&self) -> Pin<Box<dyn Future<Output = Result<DomainPolicy, String>> + Send + '_>> {
        Box::pin(async move {
            let found = aegis_store::e2b::sandboxes::egress_of(&self.pool, self.sandbox.0)
                .await
                .map_err(|e| format!("the sandbox's network rules cannot be read: {e}"))?;
            let Some((key, rules)) = found else {
                return Err(
                    "the sandbox's network rules are not recorded (it is being made or has gone)"
                        .to_owned(),
                );
            };
            let rules = rules
                .map(|r| serde_json::from_value::<NetworkRules>(r.0))
                .transpose()
                .map_err(|e| format!("the sandbox's network rules are unreadable: {e}"))?;
            Ok(policy(&self.grants.grant_of(&key), rules.as_ref()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &[&str], deny: &[&str]) -> NetworkRules {
        NetworkRules::new(
            Some(allow.iter().map(|s| (*s).to_owned()).collect()),
            Some(deny.iter().map(|s| (*s).to_owned()).collect()),
            None,
        )
        .expect("rules")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn allow_lifts_deny_and_nothing_denied_admits_everything_granted() {
        let any = Grant::AnyHost;
        // No rules: everything.
        let p = policy(&any, Some(&rules(&[], &[])));
        assert!(p.check("example.org", 443).is_ok());
        assert!(p
            .check_addresses("example.org", 443, [ip("93.184.215.14")])
            .is_ok());
        // Deny all but one host and one address.
        let r = rules(&["api.example.org", "1.1.1.1"], &[ALL_TRAFFIC]);
        let p = policy(&any, Some(&r));
        assert!(p.check("api.example.org", 443).is_ok());
        assert!(p
            .check_addresses("api.example.org", 443, [ip("93.184.215.14")])
            .is_ok());
        assert!(p.check("1.1.1.1", 443).is_ok());
        assert!(p.check("8.8.8.8", 443).is_err());
        assert!(
            p.check("other.example.org", 443).is_ok(),
            "a name passes as written"
        );
        assert!(p
            .check_addresses("other.example.org", 443, [ip("93.184.215.14")])
            .is_err());
        assert!(
            p.check_addresses("v6.example.org", 443, [ip("2001:db8::1")])
                .is_err(),
            "all traffic is IPv6 too"
        );
        // Deny one address: by literal and by what a name resolves to.
        let p = policy(&any, Some(&rules(&[], &["8.8.8.8"])));
        assert!(p.check("8.8.8.8", 443).is_err());
        assert!(p.check_addresses("dns.test", 443, [ip("8.8.8.8")]).is_err());
        assert!(p.check_addresses("dns.test", 443, [ip("8.8.4.4")]).is_ok());
        // Internet off: everything denied.
        let off = NetworkRules::new(None, None, Some(false)).expect("rules");
        assert!(!off.admits_anything());
        assert!(policy(&any, Some(&off))
            .check_addresses("x.test", 443, [ip("93.184.215.14")])
            .is_err());
    }

    #[test]
    fn the_grant_bounds_whatever_the_sandbox_asks() {
        let grants = EgressGrants {
            default: vec!["*.pypi.org".into(), "files.test:8080".into()],
            keys: BTreeMap::from([
                ("00000000-0000-0000-0000-000000000001".into(), vec![]),
                (
                    "00000000-0000-0000-0000-000000000002".into(),
                    vec!["*".into()],
                ),
            ]),
        };
        grants.check().expect("valid");
        let listed = grants.grant_of("00000000-0000-0000-0000-000000000003");
        let p = policy(&listed, Some(&rules(&["evil.test"], &[])));
        assert!(p.check("www.pypi.org", 443).is_ok());
        assert!(p.check("files.test", 8080).is_ok());
        assert!(p.check("files.test", 443).is_err());
        assert!(
            p.check("evil.test", 443).is_err(),
            "allowOut opens nothing beyond the grant"
        );
        assert_eq!(listed.report(), ["*.pypi.org", "files.test:8080"]);
        let none = grants.grant_of("00000000-0000-0000-0000-000000000001");
        assert!(none.is_nothing());
        assert!(policy(&none, Some(&rules(&["www.pypi.org"], &[])))
            .check("www.pypi.org", 443)
            .is_err());
        assert_eq!(
            grants.grant_of("00000000-0000-0000-0000-000000000002"),
            Grant::AnyHost
        );
        assert!(policy(&Grant::AnyHost, None).check("x.test", 443).is_err());
        assert!(EgressGrants::default().grant_of("k").is_nothing());
    }

    #[test]
    fn bad_entries_are_named_with_their_place() {
        let e = NetworkRules::new(Some(vec!["ok.test".into(), "a.*.test".into()]), None, None)
            .expect_err("refused");
        assert_eq!(e.field, "allowOut[1]");
        let e = NetworkRules::new(None, Some(vec![String::new()]), None).expect_err("refused");
        assert_eq!(e.field, "denyOut[0]");
        let bad = EgressGrants {
            default: vec!["ok.test".into(), "host:http".into()],
            keys: BTreeMap::new(),
        };
        assert_eq!(bad.check().expect_err("refused").key, "egress.default[1]");
        let bad = EgressGrants {
            default: vec![],
            keys: BTreeMap::from([("ops".into(), vec![])]),
        };
        assert_eq!(bad.check().expect_err("refused").key, "egress.keys.ops");
    }
}
