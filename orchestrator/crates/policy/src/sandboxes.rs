//! Whose sandbox it is: the one rule for which caller may see, act in or destroy a sandbox.
//!
//! A sandbox belongs to the principal that made it: the API key (REST `POST /v1/sandboxes`,
//! E2B creates, an MCP conversation's sandbox), the SEAL session, the agent execution or the
//! workflow run. Every door hands the router or its listing the id a caller named; this rule,
//! asked with the owner the dispatcher recorded (never one the caller says), is what keeps one
//! principal out of another's sandbox. Admin keys (not bound to a context) may also see every
//! sandbox and destroy it, to clean up; acting inside one stays its owner's.

use aegis_core::caller::{Caller, CallerKind, Role};

use crate::Denial;

/// Who made a sandbox, as the dispatcher recorded it when it handed the sandbox out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxOwner {
    /// The owner kind the dispatcher stores: `operator`, `session`, `execution`, `workflow`
    /// or `pool`.
    pub kind: String,
    /// Its id: key id, session id, execution id, `<execution>[/<state>/<visit>]`.
    pub id: String,
    /// For a session sandbox the node made for an MCP conversation: the API key that opened
    /// it (the session row itself holds no key).
    pub key: Option<String>,
}

/// What a caller wants to do with a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxAccess {
    /// See it in a listing.
    See,
    /// Run a tool in it: commands, files, processes, watches, attaching to its streams.
    Act,
    /// Destroy it.
    Destroy,
}

/// True when `caller` is the principal that made the sandbox.
pub fn owns(caller: &Caller, owner: &SandboxOwner) -> bool {
    match caller.kind {
        CallerKind::System => true,
        CallerKind::ApiKey => {
            (owner.kind == "operator" && owner.id == caller.id)
                || (owner.kind == "session" && owner.key.as_deref() == Some(caller.id.as_str()))
        }
        CallerKind::Session => owner.kind == "session" && owner.id == caller.id,
        CallerKind::Execution => {
            (owner.kind == "execution" && owner.id == caller.id)
                || (owner.kind == "workflow"
                    && owner
                        .id
                        .strip_prefix(caller.id.as_str())
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/')))
        }
    }
}

/// An unbound admin key: it may see and destroy any sandbox of its tenant.
fn is_admin(caller: &Caller) -> bool {
    caller.kind == CallerKind::ApiKey && caller.role == Some(Role::Admin) && caller.seal.is_none()
}

/// May `caller` do `access` to the sandbox `id` that `owner` made? Another principal's sandbox
/// is refused exactly like a sandbox that does not exist (`sandbox {id} not found`), so a
/// caller learns nothing of sandboxes it may not use.
pub fn check_sandbox_access(
    caller: &Caller,
    owner: &SandboxOwner,
    access: SandboxAccess,
    id: &str,
) -> Result<(), Denial> {
    if owns(caller, owner) {
        return Ok(());
    }
    if is_admin(caller) && matches!(access, SandboxAccess::See | SandboxAccess::Destroy) {
        return Ok(());
    }
    Err(Denial {
        code: "sandbox_unavailable",
        message: format!("sandbox {id} not found"),
        seal_code: None,
        retry_after_secs: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aegis_core::caller::Tier;

    fn caller(kind: CallerKind, id: &str, role: Option<Role>) -> Caller {
        Caller {
            kind,
            id: id.to_owned(),
            label: id.to_owned(),
            tier: Tier::Operator,
            role,
            tenant: aegis_core::DEFAULT_TENANT.to_owned(),
            seal: None,
        }
    }

    fn owner(kind: &str, id: &str, key: Option<&str>) -> SandboxOwner {
        SandboxOwner {
            kind: kind.to_owned(),
            id: id.to_owned(),
            key: key.map(str::to_owned),
        }
    }

    #[test]
    fn a_key_acts_only_in_its_own_sandboxes() {
        let a = caller(CallerKind::ApiKey, "key-a", Some(Role::Operator));
        let b = caller(CallerKind::ApiKey, "key-b", Some(Role::Operator));
        let made_by_a = owner("operator", "key-a", None);
        assert!(check_sandbox_access(&a, &made_by_a, SandboxAccess::Act, "s").is_ok());
        for access in [
            SandboxAccess::See,
            SandboxAccess::Act,
            SandboxAccess::Destroy,
        ] {
            let refused = check_sandbox_access(&b, &made_by_a, access, "s").unwrap_err();
            assert_eq!(refused.message, "sandbox s not found");
        }
    }

    #[test]
    fn an_mcp_conversation_s_sandbox_is_its_key_s() {
        let a = caller(CallerKind::ApiKey, "key-a", Some(Role::Operator));
        let b = caller(CallerKind::ApiKey, "key-b", Some(Role::Operator));
        let session = owner("session", "row-1", Some("key-a"));
        assert!(owns(&a, &session));
        assert!(!owns(&b, &session));
        // A SEAL session's sandbox (no key) is nobody's key's.
        assert!(!owns(&a, &owner("session", "row-1", None)));
        assert!(owns(
            &caller(CallerKind::Session, "row-1", None),
            &owner("session", "row-1", None)
        ));
    }

    #[test]
    fn an_execution_owns_its_sandbox_and_its_workflow_states_not_a_prefix_lookalike() {
        let e = caller(CallerKind::Execution, "exec-1", None);
        assert!(owns(&e, &owner("execution", "exec-1", None)));
        assert!(owns(&e, &owner("workflow", "exec-1/build/1", None)));
        assert!(owns(&e, &owner("workflow", "exec-1", None)));
        assert!(!owns(&e, &owner("workflow", "exec-10/build/1", None)));
        assert!(!owns(&e, &owner("execution", "exec-2", None)));
        assert!(!owns(&e, &owner("operator", "exec-1", None)));
    }

    #[test]
    fn an_admin_sees_and_destroys_but_acts_only_in_its_own() {
        let admin = caller(CallerKind::ApiKey, "admin", Some(Role::Admin));
        let other = owner("execution", "exec-1", None);
        assert!(check_sandbox_access(&admin, &other, SandboxAccess::See, "s").is_ok());
        assert!(check_sandbox_access(&admin, &other, SandboxAccess::Destroy, "s").is_ok());
        assert!(check_sandbox_access(&admin, &other, SandboxAccess::Act, "s").is_err());
        let readonly = caller(CallerKind::ApiKey, "ro", Some(Role::Readonly));
        assert!(check_sandbox_access(&readonly, &other, SandboxAccess::See, "s").is_err());
    }
}
