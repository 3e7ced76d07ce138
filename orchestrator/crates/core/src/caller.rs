//! Who is calling: the identity every tool call and admin change is attributed to.
//!
//! Three kinds of caller reach the same router (operators with API keys, SEAL sessions, agent
//! executions); each carries a tier that bounds which tools it may call at all.

use serde::{Deserialize, Serialize};

/// Access tiers live with security contexts (a context names the tier of its sessions).
pub use aegis_seal::Tier;

/// Roles of operator API keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything, including key management.
    Admin,
    /// Deploy, call tools, manage sandboxes; no key management.
    Operator,
    /// Read-only views (lists, audit); no tool calls, no changes.
    Readonly,
}

impl Role {
    /// The lowercase name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Operator => "operator",
            Role::Readonly => "readonly",
        }
    }

    /// True when this role may change state (deploy, delete, call tools).
    pub fn may_write(self) -> bool {
        !matches!(self, Role::Readonly)
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "admin" => Ok(Role::Admin),
            "operator" => Ok(Role::Operator),
            "readonly" => Ok(Role::Readonly),
            other => Err(format!(
                "unknown role `{other}`; expected admin, operator or readonly"
            )),
        }
    }
}

/// What kind of principal made a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallerKind {
    /// An operator with an API key.
    ApiKey,
    /// A SEAL session.
    Session,
    /// An agent execution's inner loop.
    Execution,
    /// The orchestrator itself (bootstrap, reaper).
    System,
}

impl CallerKind {
    /// The name stored in the audit log.
    pub fn as_str(self) -> &'static str {
        match self {
            CallerKind::ApiKey => "api_key",
            CallerKind::Session => "session",
            CallerKind::Execution => "execution",
            CallerKind::System => "system",
        }
    }
}

/// The SEAL security context a session's calls are evaluated under.
#[derive(Clone)]
pub struct SealScope {
    /// The session's context.
    pub context: std::sync::Arc<aegis_seal::context::SecurityContext>,
    /// Shared rate-limit state.
    pub limiter: std::sync::Arc<aegis_seal::context::RateLimiter>,
    /// Rate-limit key (the session id).
    pub session_key: String,
    /// Contexts of whoever started this caller (an execution started by a session or by another
    /// execution): every call must pass them too, so a child never has more rights than its
    /// parent. Empty for SEAL sessions.
    pub ceilings: Vec<std::sync::Arc<aegis_seal::context::SecurityContext>>,
}

impl std::fmt::Debug for SealScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealScope")
            .field("context", &self.context.name)
            .field("session_key", &self.session_key)
            .finish_non_exhaustive()
    }
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Kind of principal.
    pub kind: CallerKind,
    /// Stable id: key id, session id, execution id.
    pub id: String,
    /// Human label (key name), for logs.
    pub label: String,
    /// The highest tier this caller may use.
    pub tier: Tier,
    /// The operator role, for API-key callers.
    pub role: Option<Role>,
    /// Tenant the caller acts in.
    pub tenant: String,
    /// For SEAL sessions: the security context that narrows every call.
    pub seal: Option<SealScope>,
}

impl Caller {
    /// An operator holding an API key: admin and operator keys reach the operator tier.
    pub fn operator(key_id: uuid::Uuid, name: &str, role: Role) -> Self {
        Self {
            kind: CallerKind::ApiKey,
            id: key_id.to_string(),
            label: name.to_owned(),
            tier: if role.may_write() {
                Tier::Operator
            } else {
                Tier::User
            },
            role: Some(role),
            tenant: crate::DEFAULT_TENANT.to_owned(),
            seal: None,
        }
    }

    /// The orchestrator acting on its own behalf.
    pub fn system() -> Self {
        Self {
            kind: CallerKind::System,
            id: "orchestrator".to_owned(),
            label: "orchestrator".to_owned(),
            tier: Tier::Operator,
            role: None,
            tenant: crate::DEFAULT_TENANT.to_owned(),
            seal: None,
        }
    }
}
