//! The identity of a sandbox and the Docker names derived from it. Kept apart from the spec so
//! that errors, the spec and the network code can all name a sandbox without importing each
//! other.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Identifies one sandbox: its row, its container (`aegis-sbx-<id>`) and its volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SandboxId(pub Uuid);

impl SandboxId {
    /// A fresh random id.
    pub fn new() -> Self {
        SandboxId(Uuid::new_v4())
    }
}

impl Default for SandboxId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for SandboxId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(SandboxId)
    }
}

impl From<Uuid> for SandboxId {
    fn from(id: Uuid) -> Self {
        SandboxId(id)
    }
}

/// The Docker network of sandbox `id`: `aegis-net-<id>`.
pub fn network_name(id: SandboxId) -> String {
    format!("aegis-net-{id}")
}
