//! Sandbox networks for egress: an internal Docker network per networked sandbox, whose only
//! way out is the orchestrator's egress proxy on the network's gateway address.
//!
//! `--internal` networks have no route out (Docker drops forwarding to and from the bridge), but
//! the host itself is still reachable on the gateway address, so every service the host binds
//! on all interfaces would be too. [`isolate_host`] closes that: on the bridge's interface the
//! host accepts TCP to the proxy's port and drops everything else (IPv4 and IPv6). The rules are
//! fail-closed: a sandbox whose network could not be isolated is not created. One network per
//! sandbox makes the listener a connection arrives on name its sandbox, with no identity to
//! spoof. Docker allocates each network a subnet from its address pools (an operator running
//! many networked sandboxes sizes `default-address-pools` accordingly).

use std::collections::HashMap;
use std::net::IpAddr;
use std::process::Command;

use bollard::models::NetworkCreateRequest;

use crate::engine::DockerEngine;

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
    let docker = engine.client();
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
    let inspected = docker.inspect_network(name, None).await.map_err(err)?;
    let gateway = inspected
        .ipam
        .and_then(|ipam| ipam.config)
        .into_iter()
        .flatten()
        .filter_map(|c| c.gateway?.parse::<IpAddr>().ok())
        .find(IpAddr::is_ipv4);
    match gateway {
        Some(gateway) => Ok(EgressNetwork {
            name: name.to_owned(),
            bridge,
            gateway,
        }),
        None => {
            let _ = docker.remove_network(name).await;
            Err(NetworkError::NoGateway {
                name: name.to_owned(),
            })
        }
    }
}

/// The firewall rules of `network`: accept TCP to the proxy, drop the rest from the bridge.
fn rules(network: &EgressNetwork, proxy_port: u16) -> Vec<(&'static str, Vec<String>)> {
    let tag = format!("aegis-egress {}", network.name);
    let base = |extra: &[&str], target: &str| -> Vec<String> {
        let mut r: Vec<String> = vec!["INPUT".into(), "-i".into(), network.bridge.clone()];
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
        ("ip6tables", base(&[], "DROP")),
    ]
}

fn run(program: &str, args: &[String], bridge: &str) -> Result<(), NetworkError> {
    let out = Command::new(program)
        .arg("-w")
        .args(args)
        .output()
        .map_err(|e| NetworkError::Firewall {
            bridge: bridge.to_owned(),
            message: format!("cannot run {program}: {e}"),
        })?;
    if out.status.success() {
        Ok(())
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
pub fn isolate_host(network: &EgressNetwork, proxy_port: u16) -> Result<(), NetworkError> {
    let mut done = Vec::new();
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
            for (p, r) in done {
                let mut del = vec!["-D".to_owned()];
                del.extend(r);
                let _ = run(p, &del, &network.bridge);
            }
            return Err(e);
        }
        done.push((program, rule));
    }
    Ok(())
}

/// Removes the firewall rules of `network` (best effort) and the network itself.
pub async fn remove(
    engine: &DockerEngine,
    network: &EgressNetwork,
    proxy_port: Option<u16>,
) -> Result<(), NetworkError> {
    if let Some(port) = proxy_port {
        for (program, rule) in rules(network, port) {
            let mut args = vec!["-D".to_owned()];
            args.extend(rule);
            let _ = run(program, &args, &network.bridge);
        }
    }
    engine
        .client()
        .remove_network(&network.name)
        .await
        .map_err(|source| NetworkError::Docker {
            name: network.name.clone(),
            source,
        })
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
    }
}
