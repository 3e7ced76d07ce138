//! Workflow scopes: who can see a definition, and the one operation that changes it.
//!
//! A definition is `tenant` scoped (its own tenant sees it; every agent and, by default, every
//! workflow) or `global` (every tenant sees it; workflows only). A global workflow keeps its
//! `tenant_id`: that tenant still owns it and is the only one that may update, delete, promote or
//! demote it. Lookups by name prefer the caller's own definition over another tenant's global one,
//! so a global workflow never hides a tenant's own. Names are unique per tenant (both scopes) and
//! among global workflows; a promotion that would break the second rule is refused.
//!
//! Each change is one transaction that also writes a `definition_scope_changes` row, so the
//! history of who moved what, when, can never disagree with the current scope.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use super::RegistryError;
use aegis_core::caller::Caller;

/// Who can see a definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Its own tenant only (every definition starts here).
    Tenant,
    /// Every tenant of the node.
    Global,
}

impl Scope {
    /// The name stored in the database and used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Tenant => "tenant",
            Scope::Global => "global",
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<String> for Scope {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        match s.as_str() {
            "tenant" => Ok(Scope::Tenant),
            "global" => Ok(Scope::Global),
            other => Err(format!(
                "unknown scope `{other}`; expected tenant or global"
            )),
        }
    }
}

/// Which definitions a listing shows, relative to the caller's tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeFilter {
    /// The tenant's own definitions, whatever their scope.
    Owned,
    /// Global definitions only, whoever owns them.
    Global,
    /// Everything the tenant can use: its own and every global one.
    Visible,
}

impl ScopeFilter {
    /// The SQL condition on `definitions d` for tenant `$1`.
    pub(super) fn condition(self) -> &'static str {
        match self {
            ScopeFilter::Owned => "d.tenant_id = $1",
            ScopeFilter::Global => "d.scope = 'global'",
            ScopeFilter::Visible => "(d.tenant_id = $1 OR d.scope = 'global')",
        }
    }
}

/// The result of a promotion or demotion.
#[derive(Debug, Clone, Serialize)]
pub struct ScopeChange {
    /// Definition id.
    pub id: Uuid,
    pub name: String,
    /// Scope before the change.
    pub previous_scope: Scope,
    /// Scope after the change.
    pub new_scope: Scope,
}

/// Moves one of the caller's tenant's live workflows to `target` scope, recording who did it.
///
/// Refused when the workflow is unknown to (or not owned by) the caller's tenant, when it is
/// already in `target`, and when another global workflow already has its name.
pub async fn change_scope(
    pool: &PgPool,
    caller: &Caller,
    id_or_name: &str,
    target: Scope,
) -> Result<ScopeChange, RegistryError> {
    let id = Uuid::parse_str(id_or_name).ok();
    let mut tx = pool.begin().await?;
    #[derive(sqlx::FromRow)]
    struct Current {
        id: Uuid,
        name: String,
        #[sqlx(try_from = "String")]
        scope: Scope,
    }
    let row: Option<Current> = sqlx::query_as(
        "SELECT id, name, scope FROM definitions WHERE tenant_id = $1 AND kind = 'workflow' \
         AND deleted_at IS NULL AND (id = $2 OR ($2 IS NULL AND name = $3)) FOR UPDATE",
    )
    .bind(&caller.tenant)
    .bind(id)
    .bind(id_or_name)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(Current {
        id,
        name,
        scope: current,
    }) = row
    else {
        return Err(RegistryError::NotFound {
            kind: "workflow",
            what: id_or_name.to_owned(),
        });
    };
    if current == target {
        return Err(RegistryError::SameScope {
            name,
            scope: current,
        });
    }
    if target == Scope::Global {
        // Checked here for a clear answer; the unique index settles a race between tenants.
        let taken: Option<Uuid> = sqlx::query_scalar(
            "SELECT id FROM definitions WHERE kind = 'workflow' AND name = $1 \
             AND scope = 'global' AND deleted_at IS NULL",
        )
        .bind(&name)
        .fetch_optional(&mut *tx)
        .await?;
        if taken.is_some() {
            return Err(RegistryError::NameCollision {
                name,
                scope: target,
                existing: taken,
            });
        }
    }
    // Demoting needs no name check: the owner's per-tenant unique index already covers both scopes.
    let updated =
        sqlx::query("UPDATE definitions SET scope = $2, updated_at = now() WHERE id = $1")
            .bind(id)
            .bind(target.as_str())
            .execute(&mut *tx)
            .await;
    if let Err(sqlx::Error::Database(db)) = &updated {
        if db.is_unique_violation() {
            return Err(RegistryError::NameCollision {
                name,
                scope: target,
                existing: None,
            });
        }
    }
    updated?;
    sqlx::query(
        "INSERT INTO definition_scope_changes (id, definition_id, tenant_id, previous_scope, \
         new_scope, caller_kind, caller_id) VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(Uuid::new_v4())
    .bind(id)
    .bind(&caller.tenant)
    .bind(current.as_str())
    .bind(target.as_str())
    .bind(caller.kind.as_str())
    .bind(&caller.id)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(ScopeChange {
        id,
        name,
        previous_scope: current,
        new_scope: target,
    })
}
