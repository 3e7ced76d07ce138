//! What a caller may ask of a sandbox, and the server-side ceilings that bound it.
//!
//! A [`SandboxSpec`] deliberately has no field for privileged mode, host network, devices, binds or
//! capabilities: what cannot be expressed cannot be asked for. The orchestrator fills it from the
//! agent manifest (image from the runtime registry, limits from `spec.security.resources`, roots
//! from `spec.security.filesystem`); the dispatcher then lowers every limit to the configured
//! ceiling, so a manifest can ask for less than the operator allows, never more.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{DispatchError, Result};
use crate::labels::RESERVED_PREFIX;

pub use crate::id::SandboxId;

/// What kind of thing owns a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OwnerKind {
    /// An agent execution; destroyed when the execution ends.
    Execution,
    /// A SEAL session; destroyed when the session expires or is revoked.
    Session,
    /// An operator, through the admin API; destroyed on request.
    Operator,
    /// The warm pool, until the sandbox is handed out. Reserved: callers cannot ask for it.
    Pool,
    /// A workflow execution's state (`<execution>/<state>/<visit>`) or its runtime sandbox
    /// (`<execution>`); destroyed when the state or the execution ends, or when the state runs
    /// again after an interrupted attempt.
    Workflow,
}

impl OwnerKind {
    /// The name stored in Postgres and in the `org.aegis.owner-kind` label.
    pub fn as_str(self) -> &'static str {
        match self {
            OwnerKind::Execution => "execution",
            OwnerKind::Session => "session",
            OwnerKind::Operator => "operator",
            OwnerKind::Pool => "pool",
            OwnerKind::Workflow => "workflow",
        }
    }

    /// The inverse of [`OwnerKind::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "execution" => Some(OwnerKind::Execution),
            "session" => Some(OwnerKind::Session),
            "operator" => Some(OwnerKind::Operator),
            "pool" => Some(OwnerKind::Pool),
            "workflow" => Some(OwnerKind::Workflow),
            _ => None,
        }
    }
}

impl fmt::Display for OwnerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The owner of a sandbox: an execution id, a session id, an operator's key id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    /// What kind of owner.
    pub kind: OwnerKind,
    /// Its identifier, opaque to the dispatcher.
    pub id: String,
}

impl Owner {
    /// Shorthand constructor.
    pub fn new(kind: OwnerKind, id: impl Into<String>) -> Self {
        Owner {
            kind,
            id: id.into(),
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.id)
    }
}

/// Resource limits of one sandbox. Every field must be positive: Docker reads 0 as "unlimited".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Limits {
    /// Memory, bytes; swap is set to the same value so the sandbox cannot swap.
    pub memory_bytes: u64,
    /// CPU, in billionths of a CPU (1_000_000_000 = one CPU).
    pub nano_cpus: u64,
    /// Maximum number of processes and threads (fork bombs stop here).
    pub pids: u64,
    /// Size of the tmpfs at `/tmp`, bytes (counted against memory).
    pub tmpfs_bytes: u64,
    /// Size of the workspace, bytes: a disk fill by a command or by `fs.write` stops here
    /// (`ENOSPC`). The workspace is a size-limited tmpfs volume, so the container's memory limit
    /// is `memory_bytes + workspace_bytes` (see `hardening.rs`).
    #[serde(default = "default_workspace_bytes")]
    pub workspace_bytes: u64,
}

fn default_workspace_bytes() -> u64 {
    Limits::default().workspace_bytes
}

impl Default for Limits {
    /// 512 MiB, one CPU, 256 processes, 64 MiB of `/tmp`, 1 GiB of workspace (the manifest
    /// default, so that pool sandboxes serve agents that do not say otherwise).
    fn default() -> Self {
        Limits {
            memory_bytes: 512 * 1024 * 1024,
            nano_cpus: 1_000_000_000,
            pids: 256,
            tmpfs_bytes: 64 * 1024 * 1024,
            workspace_bytes: 1024 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// Each limit lowered to the ceiling's; a zero limit is refused (it would mean unlimited).
    pub fn clamp_to(&self, ceiling: &Limits) -> Result<Limits> {
        let check = |name: &str, v: u64| {
            if v == 0 {
                Err(DispatchError::InvalidSpec {
                    reason: format!("limits.{name} must be positive (0 would mean unlimited)"),
                })
            } else {
                Ok(v)
            }
        };
        Ok(Limits {
            memory_bytes: check("memory_bytes", self.memory_bytes)?.min(ceiling.memory_bytes),
            nano_cpus: check("nano_cpus", self.nano_cpus)?.min(ceiling.nano_cpus),
            pids: check("pids", self.pids)?.min(ceiling.pids),
            tmpfs_bytes: check("tmpfs_bytes", self.tmpfs_bytes)?.min(ceiling.tmpfs_bytes),
            workspace_bytes: check("workspace_bytes", self.workspace_bytes)?
                .min(ceiling.workspace_bytes),
        })
    }
}

/// Network access of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// No network interface but loopback (the default).
    #[default]
    None,
    /// Docker's default bridge: outbound access with no proxy, address rules or firewall.
    /// The orchestrator never asks for it (a workflow step's `network_mode: bridge` gets
    /// [`NetworkMode::Egress`], like an agent sandbox with network).
    Bridge,
    /// An internal network of the sandbox's own with no route out: its only way out is the
    /// egress proxy the network module's `EgressHost` starts on the network's gateway, and the
    /// host firewall admits nothing else.
    Egress,
}

impl NetworkMode {
    /// Docker's `HostConfig.NetworkMode` value for sandbox `id`.
    pub fn docker_mode(self, id: SandboxId) -> String {
        match self {
            NetworkMode::None => "none".to_owned(),
            NetworkMode::Bridge => "bridge".to_owned(),
            NetworkMode::Egress => crate::id::network_name(id),
        }
    }
}

/// Everything a caller decides about a new sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// Runtime image, already resolved through the registry; must exist on the engine.
    pub image: String,
    /// Who the sandbox belongs to.
    pub owner: Owner,
    /// Requested limits; lowered to the dispatcher's ceilings.
    pub limits: Limits,
    /// Network access.
    pub network: NetworkMode,
    /// Absolute paths under which the executor lets reading operations resolve.
    pub read_roots: Vec<String>,
    /// Absolute paths under which the executor lets changing operations resolve.
    pub write_roots: Vec<String>,
    /// Whether requested paths may pass through symlinks beneath a root (false when roots stand
    /// for narrower allowlist entries, such as a SEAL context's `/workspace/shared/*`).
    #[serde(default = "follow_symlinks_by_default")]
    pub follow_symlinks: bool,
    /// Where the sandbox's own volume is mounted and commands start (also their `HOME`);
    /// `None` is [`WORKSPACE`]. The E2B door sets `/home/user`, the directory E2B's SDK and
    /// its users expect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// Caller labels, recorded in Postgres (and on the container when it is created for this
    /// spec); keys under `org.aegis.` are reserved.
    pub labels: BTreeMap<String, String>,
    /// The isolation class asked for; `None`: the node's choice for the image
    /// ([`DispatcherConfig::isolation`](crate::DispatcherConfig)), set when it is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<crate::isolation::Isolation>,
    /// Asks that commands and file operations may run as root (`user: "root"`). Granted only
    /// in the gVisor class ([`SandboxSpec::root_allowed`]), where uid 0 is root of gVisor's
    /// kernel; a container-class sandbox that asks runs as today and refuses root requests
    /// with a message saying how to get it. E2B sandboxes ask (E2B's contract).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_root: bool,
}

pub(crate) fn follow_symlinks_by_default() -> bool {
    true
}

/// The workspace every sandbox mounts its volume at; relative paths resolve against it.
pub const WORKSPACE: &str = "/workspace";

impl SandboxSpec {
    /// A spec with default limits, no network and `/workspace` readable and writable.
    pub fn new(image: impl Into<String>, owner: Owner) -> Self {
        SandboxSpec {
            image: image.into(),
            owner,
            limits: Limits::default(),
            network: NetworkMode::None,
            read_roots: vec![WORKSPACE.to_owned()],
            write_roots: vec![WORKSPACE.to_owned()],
            follow_symlinks: true,
            workspace: None,
            labels: BTreeMap::new(),
            isolation: None,
            allow_root: false,
        }
    }

    /// The directory the sandbox's volume is mounted at (see [`SandboxSpec::workspace`]).
    pub fn workspace_dir(&self) -> &str {
        self.workspace.as_deref().unwrap_or(WORKSPACE)
    }

    /// Checks what can be checked without Docker and clamps the limits.
    pub(crate) fn validated(&self, ceiling: &Limits) -> Result<SandboxSpec> {
        let invalid = |reason: String| Err(DispatchError::InvalidSpec { reason });
        if self.image.trim().is_empty() {
            return invalid("image is empty".into());
        }
        if self.owner.kind == OwnerKind::Pool {
            return invalid("owner kind 'pool' is reserved for the warm pool".into());
        }
        if self.owner.id.is_empty() {
            return invalid("owner id is empty".into());
        }
        if let Some(dir) = &self.workspace {
            let plain = dir.len() > 1
                && dir.starts_with('/')
                && dir
                    .split('/')
                    .skip(1)
                    .all(|c| !c.is_empty() && c != "." && c != "..")
                && !dir.contains('\0');
            if !plain {
                return invalid(format!(
                    "workspace '{dir}' is not a plain absolute directory path"
                ));
            }
        }
        for root in self.read_roots.iter().chain(&self.write_roots) {
            if !root.starts_with('/') || root.contains('\0') {
                return invalid(format!("root '{root}' is not an absolute path"));
            }
        }
        for key in self.labels.keys() {
            if key.starts_with(RESERVED_PREFIX) {
                return invalid(format!(
                    "label '{key}' uses the reserved prefix '{RESERVED_PREFIX}'"
                ));
            }
        }
        Ok(SandboxSpec {
            limits: self.limits.clamp_to(ceiling)?,
            ..self.clone()
        })
    }

    /// True when a sandbox created for `self` serves `other` exactly (same image, limits,
    /// network and roots): the condition for handing out a pooled sandbox.
    pub(crate) fn same_sandbox_as(&self, other: &SandboxSpec) -> bool {
        self.image == other.image
            && self.limits == other.limits
            && self.network == other.network
            && self.read_roots == other.read_roots
            && self.write_roots == other.write_roots
            && self.follow_symlinks == other.follow_symlinks
            && self.workspace == other.workspace
            && self.isolation == other.isolation
            && self.allow_root == other.allow_root
    }

    /// The class it runs in (the node's default when it was never resolved).
    pub fn isolation(&self) -> crate::isolation::Isolation {
        self.isolation.unwrap_or_default()
    }

    /// Whether its requests may run as root: it asked ([`SandboxSpec::allow_root`]) and runs
    /// in the gVisor class. Never for a container-class sandbox: its uid 0 would be the host
    /// kernel's.
    pub fn root_allowed(&self) -> bool {
        self.allow_root && self.isolation() == crate::isolation::Isolation::Gvisor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_elsewhere_must_be_a_plain_absolute_path() {
        let mut spec = SandboxSpec::new("img", Owner::new(OwnerKind::Execution, "x"));
        assert_eq!(spec.workspace_dir(), WORKSPACE);
        spec.workspace = Some("/home/user".into());
        let ok = spec.validated(&Limits::default()).expect("valid");
        assert_eq!(ok.workspace_dir(), "/home/user");
        for bad in [
            "home/user",
            "/",
            "/home/../etc",
            "/home//user",
            "/home/./u",
            "/a\0b",
        ] {
            spec.workspace = Some(bad.into());
            assert!(spec.validated(&Limits::default()).is_err(), "{bad}");
        }
        // A pooled sandbox with another workspace does not serve this spec.
        let plain = SandboxSpec::new("img", Owner::new(OwnerKind::Execution, "x"));
        let mut home = plain.clone();
        home.workspace = Some("/home/user".into());
        assert!(!plain.same_sandbox_as(&home));
    }

    #[test]
    fn limits_are_lowered_never_raised() {
        let ceiling = Limits {
            memory_bytes: 100,
            nano_cpus: 10,
            pids: 5,
            tmpfs_bytes: 7,
            workspace_bytes: 20,
        };
        let asked = Limits {
            memory_bytes: 1000,
            nano_cpus: 1,
            pids: 50,
            tmpfs_bytes: 3,
            workspace_bytes: 30,
        };
        let got = asked.clamp_to(&ceiling).unwrap();
        assert_eq!(
            got,
            Limits {
                memory_bytes: 100,
                nano_cpus: 1,
                pids: 5,
                tmpfs_bytes: 3,
                workspace_bytes: 20,
            }
        );
        let zero = Limits { pids: 0, ..asked };
        assert!(zero.clamp_to(&ceiling).is_err());
    }

    #[test]
    fn reserved_labels_and_pool_owner_are_refused() {
        let mut spec = SandboxSpec::new("img", Owner::new(OwnerKind::Operator, "op"));
        assert!(spec.validated(&Limits::default()).is_ok());
        spec.labels
            .insert("org.aegis.managed".into(), "false".into());
        assert!(spec.validated(&Limits::default()).is_err());
        let pool = SandboxSpec::new("img", Owner::new(OwnerKind::Pool, "x"));
        assert!(pool.validated(&Limits::default()).is_err());
        let mut rel = SandboxSpec::new("img", Owner::new(OwnerKind::Session, "s"));
        rel.read_roots.push("workspace".into());
        assert!(rel.validated(&Limits::default()).is_err());
    }
}
