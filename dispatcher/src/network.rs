//! Sandbox networks for egress: an internal Docker network per networked sandbox, whose only
//! way out is the orchestrator's egress proxy on the network's gateway address.
//!
//! `--internal` networks have no route out (Docker drops forwarding to and from the bridge), but
//! the host itself is still reachable on the gateway address, so every service the host binds
//! on all interfaces would be too. [`isolate_host`] closes that: on the bridge's interface the
//! host accepts TCP to the proxy's port and drops everything else (IPv4 and IPv6), and the
//! proxy's port is dropped on every other interface (other containers, host processes). The rules are
//! fail-closed: a sandbox whose network could not be isolated is not created. One network per
//! sandbox makes the listener a connection arrives on name its sandbox, with no identity to
//! spoof. Docker allocates each network a subnet from its address pools (an operator running
//! many networked sandboxes sizes `default-address-pools` accordingly).
//!
//! Names resolve nowhere inside such a sandbox: Docker's embedded DNS server answers only the
//! names of containers on the network (the sandbox's own) and forwards nothing from an
//! internal network; clients name hosts in their proxy requests and the proxy resolves them.
//!
//! The proxy itself is the orchestrator's business: the dispatcher calls an [`EgressHost`] to
//! start it once the network exists and to stop it when the sandbox goes, so the lifecycle
//! (row first, labelled objects, the reaper) covers the network like the container and volume.
//! Firewall rules carry the comment `aegis-egress:<network>` and are removed by that tag, so a
//! reaper that never knew the proxy's port still removes them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::process::Command;

use bollard::models::NetworkCreateRequest;
use bollard::Docker;
use futures_util::future::BoxFuture;

use crate::engine::DockerEngine;
use crate::error::is_not_found;
use crate::spec::{SandboxId, SandboxSpec};

/// The orchestrator's half of a sandbox network: the egress proxy that is its only way out.
/// Set in [`DispatcherConfig::egress_host`](crate::DispatcherConfig::egress_host); without it,
/// sandboxes asking for [`NetworkMode::Egress`](crate::NetworkMode::Egress) are refused.
pub trait EgressHost: Send + Sync + std::fmt::Debug {
    /// Starts the proxy of sandbox `id` (made for `spec`) listening on `gateway`, the host's
    /// address on the sandbox's network; returns the port it listens on.
    fn open<'a>(
        &'a self,
        id: SandboxId,
        spec: &'a SandboxSpec,
        gateway: IpAddr,
    ) -> BoxFuture<'a, Result<u16, String>>;
    /// Stops the proxy of sandbox `id`, if this process runs one (idempotent).
    fn close(&self, id: SandboxId);
    /// Sandboxes whose proxy this process runs; the reaper stops those whose sandbox is gone.
    fn open_sandboxes(&self) -> Vec<SandboxId>;
}

/// Why a sandbox network could not be made or removed.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// The Docker API refused.
    #[error("docker network {name}: {source}")]
    Docker {
        /// The network.
        name: String,
        /// Docker's error.
        source: bollard::errors::Error,
    },
    /// Docker did not report a usable gateway.
    #[error("docker network {name} has no IPv4 gateway")]
    NoGateway {
        /// The network.
        name: String,
    },
    /// The host firewall could not be changed.
    #[error("host firewall for {bridge}: {message}")]
    Firewall {
        /// The bridge interface.
        bridge: String,
        /// What failed.
        message: String,
    },
}

/// An internal network made for one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressNetwork {
    /// Docker network name.
    pub name: String,
    /// The Linux bridge interface (at most 15 characters).
    pub bridge: String,
    /// The host's address on the network: where the proxy listens.
    pub gateway: IpAddr,
}

pub use crate::id::network_name;

/// The bridge interface name for a network suffix: `aeg` + 12 characters.
fn bridge_name(suffix: &str) -> String {
    let clean: String = suffix
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(12)
        .collect();
    format!("aeg{clean}")
}

/// Creates the internal network `name` (bridge named from `suffix`), labelled with `labels`.
pub async fn create(
    engine: &DockerEngine,
    name: &str,
    suffix: &str,
    labels: HashMap<String, String>,
) -> Result<EgressNetwork, NetworkError> {
    create_on(engine.client(), name, suffix, labels).await
}

pub(crate) async fn create_on(
    docker: &Docker,
    name: &str,
    suffix: &str,
    labels: HashMap<String, String>,
) -> Result<EgressNetwork, NetworkError> {
    let bridge = bridge_name(suffix);
    let err = |source| NetworkError::Docker {
        name: name.to_owned(),
        source,
    };
    docker
        .create_network(NetworkCreateRequest {
            name: name.to_owned(),
            driver: Some("bridge".to_owned()),
            internal: Some(true),
            attachable: Some(false),
            enable_ipv6: Some(false),
            options: Some(HashMap::from([
                ("com.docker.network.bridge.name".to_owned(), bridge.clone()),
                // Sandboxes never talk to each other (one per network anyway).
                (
                    "com.docker.network.bridge.enable_icc".to_owned(),
                    "false".to_owned(),
                ),
            ])),
            labels: Some(labels),
            ..Default::default()
        })
        .await
        .map_err(err)?;
    match inspect_on(docker, name).await {
        Ok(Some(network)) => Ok(network),
        Ok(None) => Err(NetworkError::NoGateway {
            name: name.to_owned(),
        }),
        Err(e) => {
            let _ = docker.remove_network(name).await;
            Err(e)
        }
    }
}

/// The network `name` as it exists now (`None`: no such network).
pub(crate) async fn inspect_on(
    docker: &Docker,
    name: &str,
) -> Result<Option<EgressNetwork>, NetworkError> {
    let inspected = match docker.inspect_network(name, None).await {
        Ok(n) => n,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(source) => {
            return Err(NetworkError::Docker {
                name: name.to_owned(),
                source,
            })
        }
    };
    let bridge = inspected
        .options
        .as_ref()
        .and_then(|o| o.get("com.docker.network.bridge.name").cloned())
        .unwrap_or_else(|| bridge_name(name.trim_start_matches("aegis-net-")));
    let gateway = inspected
        .ipam
        .and_then(|ipam| ipam.config)
        .into_iter()
        .flatten()
        .filter_map(|c| c.gateway?.parse::<IpAddr>().ok())
        .find(IpAddr::is_ipv4)
        .ok_or_else(|| NetworkError::NoGateway {
            name: name.to_owned(),
        })?;
    Ok(Some(EgressNetwork {
        name: name.to_owned(),
        bridge,
        gateway,
    }))
}

/// The comment every firewall rule of network `name` carries (no spaces: `iptables -S` prints
/// it unquoted, so rules can be found and deleted by it).
fn tag(name: &str) -> String {
    format!("aegis-egress:{name}")
}

/// The firewall rules of `network`: accept TCP to the proxy, drop the rest from the bridge, and
/// drop connections to the proxy that come from anywhere but the bridge (another container, a
/// host process), so that the listener a connection arrives on still names its sandbox.
fn rules(network: &EgressNetwork, proxy_port: u16) -> Vec<(&'static str, Vec<String>)> {
    let tag = tag(&network.name);
    let base = |extra: &[&str], target: &str| -> Vec<String> {
        let mut r: Vec<String> = vec!["INPUT".into()];
        if extra.first() != Some(&"!") {
            r.extend(["-i".into(), network.bridge.clone()]);
        }
        r.extend(extra.iter().map(|s| (*s).to_owned()));
        r.extend([
            "-m".into(),
            "comment".into(),
            "--comment".into(),
            tag.clone(),
            "-j".into(),
            target.into(),
        ]);
        r
    };
    let gateway = network.gateway.to_string();
    let port = proxy_port.to_string();
    vec![
        ("iptables", base(&[], "DROP")),
        (
            "iptables",
            base(&["-p", "tcp", "-d", &gateway, "--dport", &port], "ACCEPT"),
        ),
        (
            "iptables",
            base(
                &[
                    "!",
                    "-i",
                    &network.bridge,
                    "-p",
                    "tcp",
                    "-d",
                    &gateway,
                    "--dport",
                    &port,
                ],
                "DROP",
            ),
        ),
        ("ip6tables", base(&[], "DROP")),
    ]
}

fn run(program: &str, args: &[String], bridge: &str) -> Result<String, NetworkError> {
    let out = Command::new(program)
        .arg("-w")
        .args(args)
        .output()
        .map_err(|e| NetworkError::Firewall {
            bridge: bridge.to_owned(),
            message: format!("cannot run {program}: {e}"),
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(NetworkError::Firewall {
            bridge: bridge.to_owned(),
            message: format!(
                "{program} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

/// Makes the host unreachable from `network` except TCP to `proxy_port` on the gateway.
/// Each rule is inserted at the top of INPUT (the ACCEPT last, so it sits above the DROP).
/// Runs `iptables`: call it off the async threads (`spawn_blocking`).
pub fn isolate_host(network: &EgressNetwork, proxy_port: u16) -> Result<(), NetworkError> {
    for (program, rule) in rules(network, proxy_port) {
        let mut args = vec!["-I".to_owned()];
        args.extend(rule.iter().cloned());
        args.insert(2, "1".to_owned());
        if let Err(e) = run(program, &args, &network.bridge) {
            // No IPv6 firewall on this host: the network has no IPv6 either; anything else
            // undoes what was done and fails.
            if program == "ip6tables" {
                tracing::warn!(error = %e, "ip6tables unavailable; the egress network has IPv6 disabled");
                continue;
            }
            remove_rules(&network.name);
            return Err(e);
        }
    }
    Ok(())
}

/// Removes every firewall rule tagged for network `name` (best effort; logged). Runs
/// `iptables`: call it off the async threads.
pub fn remove_rules(name: &str) {
    let tag = tag(name);
    for program in ["iptables", "ip6tables"] {
        let listed = match run(program, &["-S".to_owned(), "INPUT".to_owned()], name) {
            Ok(listed) => listed,
            Err(e) => {
                if program == "iptables" {
                    tracing::warn!(error = %e, network = %name, "cannot list the host firewall rules of an egress network");
                }
                continue;
            }
        };
        for line in listed.lines() {
            // `iptables -S` quotes comments with punctuation; the tag has no spaces.
            let words: Vec<&str> = line
                .split_whitespace()
                .map(|w| w.trim_matches('"'))
                .collect();
            if words.first() != Some(&"-A") || !words.contains(&tag.as_str()) {
                continue;
            }
            let mut args = vec!["-D".to_owned()];
            args.extend(words[1..].iter().map(|w| (*w).to_owned()));
            if let Err(e) = run(program, &args, name) {
                tracing::warn!(error = %e, network = %name, "cannot remove a host firewall rule of an egress network");
            }
        }
    }
}

/// Why this process cannot give a sandbox network, if it visibly cannot (`None`: it may; a
/// creation still fails closed on anything this does not see). Two cheap probes of what
/// [`isolate_host`] and the proxy need: `iptables -S INPUT` runs (the binary is there, and the
/// process may read the host firewall: root, CAP_NET_ADMIN), and the bridge interface of
/// Docker's default `bridge` network is one of this process's interfaces (it is in the Docker
/// host's network namespace, where sandbox networks' gateways are; skipped when there is no
/// such network). Blocking work runs off the async threads.
pub async fn host_unready(engine: &DockerEngine) -> Option<String> {
    let firewall = tokio::task::spawn_blocking(|| {
        run("iptables", &["-S".to_owned(), "INPUT".to_owned()], "-").err()
    })
    .await
    .ok()
    .flatten();
    if let Some(NetworkError::Firewall { message, .. }) = firewall {
        return Some(format!(
            "the host firewall cannot be changed from this process ({message}); it needs the \
             iptables program, root and CAP_NET_ADMIN in the Docker host's network namespace"
        ));
    }
    let bridge = engine
        .client()
        .inspect_network("bridge", None)
        .await
        .ok()?
        .options?
        .get("com.docker.network.bridge.name")?
        .clone();
    let interfaces = std::fs::read_to_string("/proc/self/net/dev").ok()?;
    let here = interfaces
        .lines()
        .filter_map(|l| l.split_once(':'))
        .any(|(name, _)| name.trim() == bridge);
    (!here).then(|| {
        format!(
            "this process is not in the Docker host's network namespace (Docker's bridge \
             `{bridge}` is not among its interfaces), so no egress proxy can listen on a sandbox \
             network's gateway"
        )
    })
}

/// Removes network `name` (its containers must be gone) and its firewall rules; a network
/// already gone is fine. Returns whether the network existed.
pub async fn remove(engine: &DockerEngine, name: &str) -> Result<bool, NetworkError> {
    remove_on(engine.client(), name, true).await
}

/// [`remove`]; firewall rules are looked for only when the network existed or `had_rules`
/// (listing them costs two process starts, not worth it for sandboxes that never had any).
pub(crate) async fn remove_on(
    docker: &Docker,
    name: &str,
    had_rules: bool,
) -> Result<bool, NetworkError> {
    let existed = match docker.remove_network(name).await {
        Ok(()) => true,
        Err(e) if is_not_found(&e) => false,
        Err(source) => {
            return Err(NetworkError::Docker {
                name: name.to_owned(),
                source,
            })
        }
    };
    if existed || had_rules {
        let n = name.to_owned();
        let _ = tokio::task::spawn_blocking(move || remove_rules(&n)).await;
    }
    Ok(existed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_names_fit_the_kernel_limit() {
        let name = bridge_name("0f3a9c2e-77aa-4bd1-9e2f-123456789abc");
        assert_eq!(name, "aeg0f3a9c2e77aa");
        assert!(name.len() <= 15);
    }

    #[test]
    fn the_accept_rule_names_gateway_and_port() {
        let net = EgressNetwork {
            name: "n".into(),
            bridge: "aegx".into(),
            gateway: "172.18.0.1".parse().expect("ip"),
        };
        let r = rules(&net, 4711);
        assert!(r[1]
            .1
            .join(" ")
            .contains("-p tcp -d 172.18.0.1 --dport 4711"));
        assert!(r[0].1.join(" ").ends_with("-j DROP"));
        assert!(r[2]
            .1
            .join(" ")
            .starts_with("INPUT ! -i aegx -p tcp -d 172.18.0.1 --dport 4711"));
        assert!(r[0].1.contains(&"aegis-egress:n".to_owned()));
        assert_eq!(
            network_name(SandboxId(uuid::Uuid::nil())),
            "aegis-net-00000000-0000-0000-0000-000000000000"
        );
    }
}
