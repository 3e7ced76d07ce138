//! Which executions a caller may act on: its own, and those its own started, unless it has the
//! operator tier.
//!
//! An execution records who started it (`caller_kind`, `caller_id`), its parent execution and
//! its principal: the API key or SEAL session at the root of its tree of child executions. A
//! caller that is not of the operator tier may read, wait for, cancel or remove an execution only
//! when one of these holds:
//! - an API key or session is the execution's principal (it started the tree it belongs to);
//! - the caller started the execution or one of its ancestors;
//! - the caller is an execution and is the execution itself or one of its ancestors.
//!
//! So an agent acts on its children (and theirs), never on its parent or siblings, and one
//! session or key never sees another's executions. The same rule serves `aegis.task.*`,
//! `aegis.agent.wait`/`logs`, REST `/v1/executions` and, when merged, the workflow tools.

use uuid::Uuid;

use super::Denial;
use aegis_core::caller::{Caller, CallerKind, Tier};

/// Who started one execution of a lineage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionOwner {
    /// The execution.
    pub id: Uuid,
    /// Kind of the caller that started it (`api_key`, `session`, `execution`, `system`).
    pub caller_kind: String,
    /// Id of that caller.
    pub caller_id: String,
}

/// An execution as scoping sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionScope {
    /// The principal at the root of its tree (`kind:id`), when recorded.
    pub principal: Option<String>,
    /// The execution first, then its parent, grandparent, ... (as far as they still exist).
    pub lineage: Vec<ExecutionOwner>,
}

/// The principal key (`kind:id`) of a caller that is not an execution.
pub fn principal_key(kind: &str, id: &str) -> String {
    format!("{kind}:{id}")
}

/// Decides whether `caller` may act on the execution described by `target` (module doc).
pub fn may_act_on(caller: &Caller, target: &ExecutionScope) -> Result<(), Denial> {
    if caller.tier >= Tier::Operator {
        return Ok(());
    }
    let kind = caller.kind.as_str();
    let is_principal = caller.kind != CallerKind::Execution
        && target.principal.as_deref() == Some(principal_key(kind, &caller.id).as_str());
    let started_one = target
        .lineage
        .iter()
        .any(|e| e.caller_kind == kind && e.caller_id == caller.id);
    let is_ancestor = caller.kind == CallerKind::Execution
        && target.lineage.iter().any(|e| e.id.to_string() == caller.id);
    if is_principal || started_one || is_ancestor {
        return Ok(());
    }
    let id = target
        .lineage
        .first()
        .map(|e| e.id.to_string())
        .unwrap_or_default();
    Err(Denial {
        code: "forbidden",
        message: format!(
            "execution {id} was not started by this caller (nor by an execution it started); \
             only its owner or an operator may act on it"
        ),
        seal_code: Some(2000),
        retry_after_secs: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(kind: CallerKind, id: &str, tier: Tier) -> Caller {
        Caller {
            kind,
            id: id.to_owned(),
            label: id.to_owned(),
            tier,
            role: None,
            tenant: "default".into(),
            seal: None,
        }
    }

    fn owner(id: Uuid, kind: &str, by: &str) -> ExecutionOwner {
        ExecutionOwner {
            id,
            caller_kind: kind.into(),
            caller_id: by.into(),
        }
    }

    #[test]
    fn owners_ancestors_and_operators_only() {
        let (root, child, grandchild) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        // session s1 started root; root started child; child started grandchild.
        let scope = ExecutionScope {
            principal: Some("session:s1".into()),
            lineage: vec![
                owner(grandchild, "execution", &child.to_string()),
                owner(child, "execution", &root.to_string()),
                owner(root, "session", "s1"),
            ],
        };
        let s1 = caller(CallerKind::Session, "s1", Tier::User);
        let s2 = caller(CallerKind::Session, "s2", Tier::User);
        let readonly = caller(CallerKind::ApiKey, "k", Tier::User);
        let operator = caller(CallerKind::ApiKey, "op", Tier::Operator);
        let root_exec = caller(CallerKind::Execution, &root.to_string(), Tier::User);
        let grandchild_exec = caller(CallerKind::Execution, &grandchild.to_string(), Tier::User);
        let stranger = caller(
            CallerKind::Execution,
            &Uuid::new_v4().to_string(),
            Tier::User,
        );
        assert!(may_act_on(&s1, &scope).is_ok());
        assert!(may_act_on(&operator, &scope).is_ok());
        assert!(may_act_on(&root_exec, &scope).is_ok());
        assert!(may_act_on(&grandchild_exec, &scope).is_ok(), "itself");
        assert_eq!(may_act_on(&s2, &scope).unwrap_err().code, "forbidden");
        assert!(may_act_on(&readonly, &scope).is_err());
        assert!(may_act_on(&stranger, &scope).is_err());
        // A child may not act on its parent.
        let parent_scope = ExecutionScope {
            principal: Some("session:s1".into()),
            lineage: vec![owner(root, "session", "s1")],
        };
        assert!(may_act_on(&grandchild_exec, &parent_scope).is_err());
        // An execution is never a principal, even with a matching string.
        let odd = ExecutionScope {
            principal: Some(format!("execution:{root}")),
            lineage: vec![owner(child, "session", "s9")],
        };
        assert!(may_act_on(&root_exec, &odd).is_err());
    }
}
