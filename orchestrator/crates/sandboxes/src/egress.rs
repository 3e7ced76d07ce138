//! The egress proxies of this instance's networked sandboxes: the orchestrator's half of
//! [`dispatcher::network`].
//!
//! A sandbox whose manifest grants network (`spec.security.network`) is created on an internal
//! Docker network of its own; once that network exists the dispatcher asks [`ProxyHost::open`]
//! for a proxy on the network's gateway, then lets the host firewall admit only that proxy's
//! port from the network. The proxy's rules come from the agent version recorded in the
//! sandbox's labels (versions are immutable, and a changed `spec.security.network` needs a new
//! version), so the same rules are rebuilt when a restarted instance adopts the sandbox. The
//! proxy's address is what `cmd.run` hands commands as `HTTP_PROXY`/`HTTPS_PROXY`.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use dispatcher::network::EgressHost;
use dispatcher::{SandboxId, SandboxSpec};
use futures_util::future::BoxFuture;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::e2b_egress::{EgressGrants, SandboxRules};
use super::{AGENT_VERSION_LABEL, E2B_RUNTIME_LABEL};
use aegis_egress::proxy::{EgressProxy, ProxyScope};
use aegis_egress::{DomainEntry, DomainPolicy, DomainRule, Egress};
use aegis_manifest::AgentView;

/// Label of a workflow ContainerRun sandbox holding its proxy's domain rules: a JSON array of
/// `{"source": text, "allow": [entry, ...]}`, every rule narrowing (written only by
/// `workflow/states/container.rs`; an empty array or an unreadable label admits no host).
pub const WORKFLOW_NETWORK_LABEL: &str = "workflow_network";

/// The domain rules a [`WORKFLOW_NETWORK_LABEL`] carries; fails closed on anything unexpected.
fn workflow_domains(label: &str) -> Result<DomainPolicy, String> {
    let bad = |why: &str| format!("the sandbox's workflow network rules are unreadable: {why}");
    let rules: Vec<Value> = serde_json::from_str(label).map_err(|e| bad(&e.to_string()))?;
    let mut domains = DomainPolicy::default();
    if rules.is_empty() {
        return Err(bad("no rule"));
    }
    for rule in rules {
        let source = rule["source"]
            .as_str()
            .ok_or_else(|| bad("a rule has no source"))?;
        let allow = rule["allow"]
            .as_array()
            .ok_or_else(|| bad("a rule has no allow list"))?
            .iter()
            .map(|e| DomainEntry::parse(e.as_str().unwrap_or_default()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(&e))?;
        domains.push(DomainRule {
            source: source.to_owned(),
            allow: Some(allow),
            deny: Vec::new(),
            exempt: Vec::new(),
        });
    }
    Ok(domains)
}

/// Why this node cannot give sandboxes network ([`dispatcher::network::host_unready`]), probed
/// at most once a minute (deploys of networked agents ask; the probe starts a process).
pub async fn network_unavailable(engine: &dispatcher::DockerEngine) -> Option<String> {
    type Probe = tokio::sync::Mutex<Option<(std::time::Instant, Option<String>)>>;
    static LAST: std::sync::OnceLock<Probe> = std::sync::OnceLock::new();
    let mut last = LAST.get_or_init(Probe::default).lock().await;
    match &*last {
        Some((at, reason)) if at.elapsed() < std::time::Duration::from_secs(60) => reason.clone(),
        _ => {
            let reason = dispatcher::network::host_unready(engine).await;
            *last = Some((std::time::Instant::now(), reason.clone()));
            reason
        }
    }
}

/// Runs one [`EgressProxy`] per networked sandbox of this instance.
pub struct ProxyHost {
    egress: Arc<Egress>,
    pool: PgPool,
    /// What the operator grants E2B sandboxes (`e2b.egress`).
    e2b_grants: Arc<EgressGrants>,
    proxies: Mutex<HashMap<SandboxId, EgressProxy>>,
}

impl std::fmt::Debug for ProxyHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyHost")
            .field("proxies", &self.open_sandboxes().len())
            .finish_non_exhaustive()
    }
}

impl ProxyHost {
    /// Proxies under the node's egress rules, auditing into `pool`.
    pub fn new(egress: Arc<Egress>, pool: PgPool) -> Self {
        Self {
            egress,
            pool,
            e2b_grants: Arc::new(EgressGrants::default()),
            proxies: Mutex::new(HashMap::new()),
        }
    }

    /// The same host, E2B sandboxes' proxies bounded by `grants`.
    pub fn with_e2b_grants(mut self, grants: EgressGrants) -> Self {
        self.e2b_grants = Arc::new(grants);
        self
    }

    /// Where the proxy of sandbox `id` listens, if this instance runs one.
    pub fn addr(&self, id: SandboxId) -> Option<SocketAddr> {
        self.proxies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .map(EgressProxy::addr)
    }

    /// The rules of the agent version a sandbox was made for (or of its workflow step).
    async fn domains_of(&self, spec: &SandboxSpec) -> Result<DomainPolicy, String> {
        if let Some(label) = spec.labels.get(WORKFLOW_NETWORK_LABEL) {
            return workflow_domains(label);
        }
        let version = spec
            .labels
            .get(AGENT_VERSION_LABEL)
            .and_then(|v| Uuid::parse_str(v).ok())
            .ok_or("the sandbox names no agent version, so it has no network policy")?;
        let row: Option<(String, Value)> = sqlx::query_as(
            "SELECT d.name, v.manifest FROM definition_versions v \
             JOIN definitions d ON d.id = v.definition_id WHERE v.id = $1",
        )
        .bind(version)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| format!("reading agent version {version}: {e}"))?;
        let (agent, manifest) = row.ok_or(format!("agent version {version} does not exist"))?;
        let mut domains = DomainPolicy::default();
        domains.push(DomainRule::of_network(
            &agent,
            &AgentView(&manifest).network(),
        )?);
        Ok(domains)
    }
}

/// The environment `cmd.run` gives commands of a sandbox whose proxy listens on `addr`: both
/// spellings clients read, and an empty `NO_PROXY` (nothing is reachable without the proxy).
pub fn proxy_env(addr: SocketAddr) -> BTreeMap<String, String> {
    let url = format!("http://{addr}");
    [
        ("HTTP_PROXY", url.as_str()),
        ("HTTPS_PROXY", &url),
        ("http_proxy", &url),
        ("https_proxy", &url),
        ("NO_PROXY", ""),
        ("no_proxy", ""),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

impl EgressHost for ProxyHost {
    fn open<'a>(
        &'a self,
        id: SandboxId,
        spec: &'a SandboxSpec,
        gateway: IpAddr,
    ) -> BoxFuture<'a, Result<u16, String>> {
        Box::pin(async move {
            let bind = SocketAddr::new(gateway, 0);
            // An E2B sandbox's rules change while it runs; they are read for each connection.
            let started = if spec.labels.contains_key(E2B_RUNTIME_LABEL) {
                let rules = SandboxRules::new(self.pool.clone(), id, self.e2b_grants.clone());
                EgressProxy::start_live(
                    bind,
                    id.to_string(),
                    Arc::new(rules),
                    self.egress.clone(),
                    self.pool.clone(),
                )
                .await
            } else {
                let domains = self.domains_of(spec).await?;
                EgressProxy::start(
                    bind,
                    ProxyScope {
                        sandbox: id.to_string(),
                        domains,
                    },
                    self.egress.clone(),
                    self.pool.clone(),
                )
                .await
            };
            let proxy = started.map_err(|e| {
                format!(
                    "{e} (the proxy binds the network's gateway address, so the orchestrator must \
                     run in the Docker host's network namespace: see README, Sandbox egress)"
                )
            })?;
            let port = proxy.addr().port();
            // A proxy still open for this id (an adoption) is replaced and stops when dropped.
            self.proxies
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, proxy);
            Ok(port)
        })
    }

    fn close(&self, id: SandboxId) {
        let removed = self
            .proxies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if let Some(proxy) = removed {
            proxy.stop();
            tracing::debug!(sandbox = %id, "egress proxy stopped");
        }
    }

    fn open_sandboxes(&self) -> Vec<SandboxId> {
        self.proxies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workflow_rules_narrow_and_fail_closed() {
        let label = r#"[{"source":"wf","allow":["a.test","*.b.test:8443"]},{"source":"step","allow":["a.test"]}]"#;
        let domains = workflow_domains(label).expect("rules");
        assert!(domains.check("a.test", 443).is_ok());
        assert!(domains.check("x.b.test", 8443).is_err());
        let none = workflow_domains(r#"[{"source":"none","allow":[]}]"#).expect("rules");
        assert!(none.check("a.test", 443).is_err());
        for bad in [
            "[]",
            "{}",
            "[{\"source\":\"x\"}]",
            "[{\"source\":\"x\",\"allow\":[\"a.*\"]}]",
        ] {
            assert!(workflow_domains(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn commands_get_both_spellings_and_an_empty_no_proxy() {
        let env = proxy_env("172.30.0.1:41000".parse().expect("addr"));
        assert_eq!(env["HTTP_PROXY"], "http://172.30.0.1:41000");
        assert_eq!(env["https_proxy"], "http://172.30.0.1:41000");
        assert_eq!(env["NO_PROXY"], "");
        assert_eq!(env.len(), 6);
    }
}
