//! The rights of whoever started a workflow execution, carried to every agent its states start.
//!
//! An agent execution started directly by a confined caller (a SEAL session, a key bound to a
//! security context, another execution) acts under that caller's contexts as well as its own
//! (`engine::Ceiling`). A workflow is started the same way but runs later, on any replica, so
//! the starter's tier and the names of its contexts are stored with the execution, and each
//! Agent state's caller is rebuilt from them: running a workflow never lifts a caller's limits.

use std::sync::Arc;

use serde_json::{json, Value};
use sqlx::PgPool;

use aegis_core::caller::{Caller, CallerKind, SealScope, Tier};

/// The ceiling `caller` imposes on what it starts, as stored with the execution; `None` for an
/// operator without a context (nothing to carry).
pub(crate) fn of(caller: &Caller) -> Option<Value> {
    if caller.tier >= Tier::Operator && caller.seal.is_none() {
        return None;
    }
    let contexts: Vec<&str> = caller
        .seal
        .as_ref()
        .map(|s| {
            std::iter::once(s.context.name.as_str())
                .chain(s.ceilings.iter().map(|c| c.name.as_str()))
                .collect()
        })
        .unwrap_or_default();
    Some(json!({"tier": caller.tier, "contexts": contexts}))
}

/// The caller an Agent state starts its agents as: the workflow execution, confined by the
/// stored ceiling. A context named there that can no longer be read refuses the start (fail
/// closed) with the reason.
pub(crate) async fn caller(
    pool: &PgPool,
    tenant: &str,
    execution: uuid::Uuid,
    label: String,
    ceiling: Option<&Value>,
) -> Result<Caller, String> {
    let mut caller = Caller {
        kind: CallerKind::Execution,
        id: execution.to_string(),
        label,
        tier: Tier::User,
        role: None,
        tenant: tenant.to_owned(),
        seal: None,
    };
    let Some(ceiling) = ceiling else {
        return Ok(caller);
    };
    let tier: Tier = ceiling["tier"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| format!("the stored ceiling of this execution is unreadable: {ceiling}"))?;
    caller.tier = caller.tier.min(tier);
    let mut contexts = Vec::new();
    for name in ceiling["contexts"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(Value::as_str)
    {
        let context = aegis_store::contexts::get(pool, tenant, name)
            .await
            .map_err(|e| {
                format!("security context `{name}` of whoever started this workflow: {e}")
            })?;
        contexts.push(Arc::new(context));
    }
    if !contexts.is_empty() {
        let context = contexts.remove(0);
        caller.seal = Some(SealScope {
            context,
            limiter: Arc::new(aegis_seal::RateLimiter::new()),
            session_key: execution.to_string(),
            ceilings: contexts,
        });
    }
    Ok(caller)
}
