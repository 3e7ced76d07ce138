//! Isolation classes: which kernel a sandbox's code talks to.
//!
//! `container` is runc on the host's kernel, hardened by `hardening.rs` and the executor's
//! Landlock domain. `gvisor` runs the same container under gVisor's `runsc`: the sandbox's
//! system calls are served by gVisor's own kernel (the Sentry), so a host kernel bug is no longer
//! one system call away. The class is the operator's decision: a node default, overridden per
//! runtime image ([`IsolationPolicy`]), recorded in the sandbox's row. A sandbox of a class its
//! engine cannot run is refused before any row or object exists, never run in another class.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The name under which Docker must list gVisor's runtime (`docker info` Runtimes).
pub const GVISOR_RUNTIME: &str = "runsc";

/// How a sandbox is isolated from the host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// runc on the host's kernel (Docker's default runtime).
    #[default]
    Container,
    /// gVisor: the container under `runsc`, with a kernel of its own.
    Gvisor,
}

impl Isolation {
    /// Its name in config, rows and answers.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Container => "container",
            Isolation::Gvisor => "gvisor",
        }
    }

    /// The Docker runtime (`HostConfig.runtime`) it needs; `None`: the engine's default.
    pub fn docker_runtime(self) -> Option<&'static str> {
        match self {
            Isolation::Container => None,
            Isolation::Gvisor => Some(GVISOR_RUNTIME),
        }
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The operator's choice of class: a default, and overrides per runtime image.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IsolationPolicy {
    /// The class of a sandbox whose image has no override.
    pub default: Isolation,
    /// Image -> class (the node config names runtimes; the node maps them to their images).
    pub by_image: BTreeMap<String, Isolation>,
}

impl IsolationPolicy {
    /// The class of a sandbox of `image` that did not ask for one.
    pub fn of_image(&self, image: &str) -> Isolation {
        self.by_image.get(image).copied().unwrap_or(self.default)
    }
}

/// Why this engine cannot run `isolation`, said so an operator can act; `None` when it can.
/// `runtimes` are the names the engine lists (`docker info` Runtimes).
pub fn missing_runtime(isolation: Isolation, runtimes: &[String]) -> Option<String> {
    let needed = isolation.docker_runtime()?;
    if runtimes.iter().any(|r| r == needed) {
        return None;
    }
    Some(format!(
        "this node's Docker engine has no `{needed}` runtime (it lists: {}), so it cannot run \
         {isolation} sandboxes; install gVisor (Debian: `apt-get install runsc`) and register it \
         in the engine's daemon.json as \"runtimes\": {{\"{needed}\": {{\"path\": \
         \"/usr/bin/runsc\", \"runtimeArgs\": [\"--platform=ptrace\", \"--network=none\"]}}}}, \
         then restart dockerd (or set sandbox.isolation: container)",
        if runtimes.is_empty() {
            "none".to_owned()
        } else {
            runtimes.join(", ")
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_read_and_print_in_lowercase() {
        let g: Isolation = serde_json::from_str("\"gvisor\"").expect("reads");
        assert_eq!(g, Isolation::Gvisor);
        assert_eq!(
            serde_json::to_string(&Isolation::Container).expect("writes"),
            "\"container\""
        );
        assert!(serde_json::from_str::<Isolation>("\"kata\"").is_err());
        assert_eq!(Isolation::Gvisor.docker_runtime(), Some("runsc"));
        assert_eq!(Isolation::Container.docker_runtime(), None);
    }

    #[test]
    fn an_image_override_beats_the_default() {
        let policy = IsolationPolicy {
            default: Isolation::Container,
            by_image: BTreeMap::from([("img:g".to_owned(), Isolation::Gvisor)]),
        };
        assert_eq!(policy.of_image("img:g"), Isolation::Gvisor);
        assert_eq!(policy.of_image("img:other"), Isolation::Container);
    }

    #[test]
    fn a_missing_runtime_names_what_to_install() {
        let runc = vec!["runc".to_owned(), "io.containerd.runc.v2".to_owned()];
        assert_eq!(missing_runtime(Isolation::Container, &runc), None);
        let why = missing_runtime(Isolation::Gvisor, &runc).expect("refused");
        assert!(why.contains("apt-get install runsc"), "{why}");
        assert!(why.contains("daemon.json"), "{why}");
        assert!(why.contains("runc, io.containerd.runc.v2"), "{why}");
        let with = vec!["runc".to_owned(), "runsc".to_owned()];
        assert_eq!(missing_runtime(Isolation::Gvisor, &with), None);
    }
}
