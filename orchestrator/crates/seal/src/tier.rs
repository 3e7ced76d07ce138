//! The caller tiers of the tool reference: a security context names the tier of its sessions,
//! and the orchestrator's router compares it with each tool's.

use serde::{Deserialize, Serialize};

/// Access tiers of the tool reference, ordered: a caller may call tools of its tier and below.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Tools every agent may use (fs, cmd, read-only aegis tools).
    User,
    /// Tools that change the registry (create/update agents and workflows).
    System,
    /// Tools that delete or reveal node internals.
    Operator,
}

impl Tier {
    /// The lowercase name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::User => "user",
            Tier::System => "system",
            Tier::Operator => "operator",
        }
    }
}

impl std::str::FromStr for Tier {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "user" => Ok(Tier::User),
            "system" => Ok(Tier::System),
            "operator" => Ok(Tier::Operator),
            other => Err(format!(
                "unknown tier `{other}`; expected user, system or operator"
            )),
        }
    }
}
