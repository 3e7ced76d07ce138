//! The registry of agents and workflows in PostgreSQL.
//!
//! A definition is a name of one kind (agent or workflow) with a stable id; its versions are
//! manifests kept forever. A deployed version is immutable, and a row is never rewritten (the
//! database refuses it): deploying the same name and version again is refused unless `force`,
//! and with `force` a different manifest becomes a new *revision* of that version (a new row,
//! revision + 1) while the same manifest changes nothing. Lookups by version take its highest
//! revision; an execution points at the exact row it ran and records its revision and
//! [`manifest_digest`], so what it ran never changes under it and stays retrievable. Deleting
//! hides the definition from new work but keeps every row, so executions that reference it stay
//! intact. Every write is one transaction: a failed deploy leaves nothing behind. Workflows have
//! a scope (`scope.rs`): lookups and listings see the caller's tenant's definitions and every
//! global workflow.

mod scope;
mod search;

pub use scope::{change_scope, Scope, ScopeChange, ScopeFilter};
pub use search::{search, SearchHit, SearchPage, SearchQuery, BUILTIN_LABEL};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use aegis_manifest::{ManifestKind, ParsedManifest};

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Nothing with that id or name.
    #[error("{kind} `{what}` not found")]
    NotFound {
        /// `agent` or `workflow`.
        kind: &'static str,
        /// The id or name asked for.
        what: String,
    },
    /// The version is already deployed and `force` was not given.
    #[error("{kind} `{name}` version {version} is already deployed; deployed versions are immutable (deploy a new version, or use force to add a new revision of this one: the deployed revisions stay as they are)")]
    VersionExists {
        /// `agent` or `workflow`.
        kind: &'static str,
        name: String,
        version: String,
    },
    /// `force` would change a deployed agent version's `spec.security.network`: the rules of
    /// its sandboxes' egress proxies come from the version, so they change only with a new one.
    #[error(
        "agent `{name}` version {version}: spec.security.network differs from the deployed \
         version's, and a version's network policy never changes (not even with force); deploy \
         it as a new version"
    )]
    NetworkPolicyChanged { name: String, version: String },
    /// A scope change to the scope the definition already has.
    #[error("workflow `{name}` is already {scope} scoped; nothing to change")]
    SameScope {
        name: String,
        /// Its current scope.
        scope: Scope,
    },
    /// Another definition already has this name at the target scope.
    #[error(
        "another {scope} workflow is already named `{name}`; rename or delete one of them first"
    )]
    NameCollision {
        name: String,
        /// The target scope.
        scope: Scope,
        /// The definition holding the name, when known.
        existing: Option<Uuid>,
    },
    /// A revision was asked for without the version it belongs to.
    #[error("a revision is a revision of one version: give the version too")]
    RevisionWithoutVersion,
    /// Database failure.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Whether a deploy may create a new definition or must find an existing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeployMode {
    /// Create the definition if needed, add the version.
    Create,
    /// The definition must exist already.
    Update,
}

/// The result of a deploy.
#[derive(Debug, Clone, Serialize)]
pub struct Deployed {
    /// Definition id (stable across versions).
    pub id: Uuid,
    pub name: String,
    /// Version deployed.
    pub version: String,
    /// The revision of that version now current (1 for a new version).
    pub revision: i32,
    /// [`manifest_digest`] of the deployed manifest.
    pub manifest_digest: String,
    /// True when `force` added a new revision to an existing version (the earlier revisions
    /// and the executions that ran them are untouched).
    pub replaced: bool,
    /// True when `force` deployed exactly the manifest of the current revision: nothing was
    /// stored.
    pub unchanged: bool,
}

/// A definition with its latest (or requested) version.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Definition {
    /// Definition id.
    pub id: Uuid,
    pub name: String,
    /// Who sees it: `tenant` (its own tenant) or `global` (every tenant; workflows only).
    #[sqlx(try_from = "String")]
    pub scope: Scope,
    /// This version.
    pub version: String,
    /// Which revision of the version this is (1, or more after forced redeploys that changed
    /// the manifest).
    pub revision: i32,
    /// `sha256:` of `manifest_yaml` ([`manifest_digest`]).
    pub manifest_digest: String,
    /// Id of this version's row (this revision's).
    pub version_id: Uuid,
    /// Manifest description.
    pub description: Option<String>,
    /// Manifest labels.
    pub labels: Value,
    /// The manifest as JSON.
    pub manifest: Value,
    /// The manifest as YAML (what export returns).
    pub manifest_yaml: String,
    /// When this revision was deployed.
    pub created_at: DateTime<Utc>,
    /// Rows are never rewritten: the time a row written before revisions existed was last
    /// overwritten, else `created_at`.
    pub updated_at: DateTime<Utc>,
    /// A workflow's `spec.default_schedule` as the scheduler reads it, with its next run
    /// ([`Definition::with_schedule`]); absent otherwise.
    #[sqlx(skip)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Value>,
}

impl Definition {
    /// Fills in [`Definition::schedule`] for a workflow with a schedule, as of now.
    pub fn with_schedule(mut self) -> Self {
        self.schedule = aegis_manifest::WorkflowView(&self.manifest)
            .schedule_status(&self.id.to_string(), Utc::now());
        self
    }
}

/// One version in a history listing.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct VersionInfo {
    pub version: String,
    /// Revision of the version.
    pub revision: i32,
    /// `sha256:` of the revision's manifest YAML ([`manifest_digest`]).
    pub manifest_digest: String,
    /// Row id.
    pub version_id: Uuid,
    /// When deployed.
    pub created_at: DateTime<Utc>,
    /// As [`Definition::updated_at`].
    pub updated_at: DateTime<Utc>,
}

/// The digest that names a manifest's content: `sha256:` and the hex SHA-256 of its normalised
/// YAML (what export returns, so anyone can recompute it). The YAML is emitted from the manifest's
/// JSON, so equal manifests have equal digests whatever the comments or layout of their source.
pub fn manifest_digest(yaml: &str) -> String {
    use std::fmt::Write;
    let hash = Sha256::digest(yaml.as_bytes());
    let mut out = String::with_capacity(7 + 2 * hash.len());
    out.push_str("sha256:");
    for byte in hash {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

impl RegistryError {
    /// Nothing of `kind` answers to `what` (an id or name, with the version asked for).
    fn not_found(kind: ManifestKind, what: String) -> Self {
        RegistryError::NotFound {
            kind: kind_str(kind),
            what,
        }
    }
}

fn kind_str(kind: ManifestKind) -> &'static str {
    match kind {
        ManifestKind::Agent => "agent",
        ManifestKind::Workflow => "workflow",
    }
}

/// Orders versions by semver precedence (release after its pre-releases), then revisions.
const LATEST_FIRST: &str = "v.v_major DESC, v.v_minor DESC, v.v_patch DESC, (v.v_pre = '') DESC, \
     v.v_pre DESC, v.revision DESC";

/// A live workflow whose latest version has `spec.default_schedule`.
#[derive(Debug, Clone)]
pub struct ScheduledWorkflow {
    /// Definition id (stable across versions).
    pub definition_id: Uuid,
    /// Owner tenant; scheduled runs are started as this tenant.
    pub tenant: String,
    /// Workflow name.
    pub name: String,
    /// The latest version, the one scheduled.
    pub version: String,
    /// Its manifest.
    pub manifest: Value,
}

/// Every live workflow (all tenants) whose latest version has a `spec.default_schedule`, for the
/// scheduler.
pub async fn scheduled_workflows(pool: &PgPool) -> Result<Vec<ScheduledWorkflow>, sqlx::Error> {
    let rows: Vec<(Uuid, String, String, String, Value)> = sqlx::query_as(&format!(
        "SELECT id, tenant_id, name, version, manifest FROM ( \
           SELECT DISTINCT ON (d.id) d.id, d.tenant_id, d.name, v.version, v.manifest \
           FROM definitions d JOIN definition_versions v ON v.definition_id = d.id \
           WHERE d.kind = 'workflow' AND d.deleted_at IS NULL \
           ORDER BY d.id, {LATEST_FIRST}) latest \
         WHERE manifest->'spec'->'default_schedule' IS NOT NULL"
    ))
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(definition_id, tenant, name, version, manifest)| ScheduledWorkflow {
                definition_id,
                tenant,
                name,
                version,
                manifest,
            },
        )
        .collect())
}

/// Stores a validated manifest as a version of its definition.
pub async fn deploy(
    pool: &PgPool,
    tenant: &str,
    parsed: &ParsedManifest,
    mode: DeployMode,
    force: bool,
) -> Result<Deployed, RegistryError> {
    let kind = kind_str(parsed.kind);
    let mut tx = pool.begin().await?;
    // One deploy per name at a time, so "exists?" and "insert" cannot interleave.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(format!("{tenant}/{kind}/{}", parsed.name))
        .execute(&mut *tx)
        .await?;
    let id = definition_for(&mut tx, tenant, kind, parsed, mode).await?;
    let version = parsed.version.to_string();
    let digest = manifest_digest(&parsed.yaml);
    let (revision, replaced) =
        match revision_for(&mut tx, id, parsed, &version, &digest, force).await? {
            Revision::New { revision, replaced } => (revision, replaced),
            Revision::Unchanged(revision) => {
                // The same manifest again: nothing to store, nothing changes.
                return Ok(Deployed {
                    id,
                    name: parsed.name.clone(),
                    version,
                    revision,
                    manifest_digest: digest,
                    replaced: false,
                    unchanged: true,
                });
            }
        };
    insert_version(&mut tx, tenant, id, parsed, &version, revision, &digest).await?;
    sqlx::query("UPDATE definitions SET updated_at = now() WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Deployed {
        id,
        name: parsed.name.clone(),
        version,
        revision,
        manifest_digest: digest,
        replaced,
        unchanged: false,
    })
}

/// The definition a deploy adds a version to (under the deploy's lock): the live one of that
/// name, or, for a create, a new one; an update of a name that is not there is refused.
async fn definition_for(
    conn: &mut sqlx::PgConnection,
    tenant: &str,
    kind: &'static str,
    parsed: &ParsedManifest,
    mode: DeployMode,
) -> Result<Uuid, RegistryError> {
    let existing: Option<Uuid> = sqlx::query_scalar(
        "SELECT id FROM definitions WHERE tenant_id = $1 AND kind = $2 AND name = $3 AND deleted_at IS NULL",
    )
    .bind(tenant)
    .bind(kind)
    .bind(&parsed.name)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(match (existing, mode) {
        (Some(id), _) => id,
        (None, DeployMode::Update) => {
            return Err(RegistryError::NotFound {
                kind,
                what: parsed.name.clone(),
            })
        }
        (None, DeployMode::Create) => {
            let id = Uuid::new_v4();
            sqlx::query(
                "INSERT INTO definitions (id, tenant_id, kind, name) VALUES ($1, $2, $3, $4)",
            )
            .bind(id)
            .bind(tenant)
            .bind(kind)
            .bind(&parsed.name)
            .execute(&mut *conn)
            .await?;
            id
        }
    })
}

/// What deploying a version comes to against the revisions already stored.
enum Revision {
    /// A revision to store: the first, or (forced) the next one, which replaces the current.
    New { revision: i32, replaced: bool },
    /// The current revision is this very manifest.
    Unchanged(i32),
}

/// Deciding the revision is a step of its own: a deployed version is refused unless forced,
/// kept as it is when the manifest is the same, and an agent's network policy may not change.
async fn revision_for(
    conn: &mut sqlx::PgConnection,
    id: Uuid,
    parsed: &ParsedManifest,
    version: &str,
    digest: &str,
    force: bool,
) -> Result<Revision, RegistryError> {
    let kind = kind_str(parsed.kind);
    // The current (highest) revision of this version, if it is deployed.
    let current: Option<(i32, String, Value)> = sqlx::query_as(
        "SELECT revision, manifest_digest, manifest FROM definition_versions \
         WHERE definition_id = $1 AND version = $2 ORDER BY revision DESC LIMIT 1",
    )
    .bind(id)
    .bind(version)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(match current {
        None => Revision::New {
            revision: 1,
            replaced: false,
        },
        Some(_) if !force => {
            return Err(RegistryError::VersionExists {
                kind,
                name: parsed.name.clone(),
                version: version.to_owned(),
            })
        }
        Some((revision, stored_digest, _)) if stored_digest == digest => {
            Revision::Unchanged(revision)
        }
        Some((revision, _, stored)) => {
            const NETWORK: &str = "/spec/security/network";
            if parsed.kind == ManifestKind::Agent
                && stored.pointer(NETWORK) != parsed.value.pointer(NETWORK)
            {
                return Err(RegistryError::NetworkPolicyChanged {
                    name: parsed.name.clone(),
                    version: version.to_owned(),
                });
            }
            Revision::New {
                revision: revision + 1,
                replaced: true,
            }
        }
    })
}

/// Storing the version row, once its revision is decided.
async fn insert_version(
    conn: &mut sqlx::PgConnection,
    tenant: &str,
    id: Uuid,
    parsed: &ParsedManifest,
    version: &str,
    revision: i32,
    digest: &str,
) -> Result<(), sqlx::Error> {
    let labels = serde_json::to_value(&parsed.labels).unwrap_or(Value::Null);
    sqlx::query(
        "INSERT INTO definition_versions (id, definition_id, tenant_id, version, v_major, v_minor, \
         v_patch, v_pre, description, labels, manifest, manifest_yaml, revision, manifest_digest) \
         VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14)",
    )
    .bind(Uuid::new_v4())
    .bind(id)
    .bind(tenant)
    .bind(version)
    .bind(parsed.version.major as i64)
    .bind(parsed.version.minor as i64)
    .bind(parsed.version.patch as i64)
    .bind(parsed.version.pre.as_str())
    .bind(&parsed.description)
    .bind(&labels)
    .bind(&parsed.value)
    .bind(&parsed.yaml)
    .bind(revision)
    .bind(digest)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Finds a live definition by id or name, at `version` (its current revision) or its latest
/// version: the tenant's own first, else a global one.
pub async fn get(
    pool: &PgPool,
    tenant: &str,
    kind: ManifestKind,
    id_or_name: &str,
    version: Option<&str>,
) -> Result<Definition, RegistryError> {
    get_revision(pool, tenant, kind, id_or_name, version, None).await
}

/// As [`get`], and with `revision` that revision of `version` (any revision stays retrievable:
/// it is what some execution may have run).
pub async fn get_revision(
    pool: &PgPool,
    tenant: &str,
    kind: ManifestKind,
    id_or_name: &str,
    version: Option<&str>,
    revision: Option<i32>,
) -> Result<Definition, RegistryError> {
    if revision.is_some() && version.is_none() {
        return Err(RegistryError::RevisionWithoutVersion);
    }
    let id = Uuid::parse_str(id_or_name).ok();
    let sql = format!(
        "SELECT d.id, d.name, d.scope, v.version, v.revision, v.manifest_digest, \
         v.id AS version_id, v.description, v.labels, v.manifest, v.manifest_yaml, v.created_at, \
         v.updated_at \
         FROM definitions d JOIN definition_versions v ON v.definition_id = d.id \
         WHERE {visible} AND d.kind = $2 AND d.deleted_at IS NULL \
         AND (d.id = $3 OR ($3 IS NULL AND d.name = $4)) AND ($5::text IS NULL OR v.version = $5) \
         AND ($6::int IS NULL OR v.revision = $6) \
         ORDER BY (d.tenant_id = $1) DESC, {LATEST_FIRST} LIMIT 1",
        visible = ScopeFilter::Visible.condition(),
    );
    sqlx::query_as(&sql)
        .bind(tenant)
        .bind(kind_str(kind))
        .bind(id)
        .bind(id_or_name)
        .bind(version)
        .bind(revision)
        .fetch_optional(pool)
        .await?
        .ok_or_else(|| {
            let what = match (version, revision) {
                (Some(v), Some(r)) => format!("{id_or_name}@{v} revision {r}"),
                (Some(v), None) => format!("{id_or_name}@{v}"),
                _ => id_or_name.to_owned(),
            };
            RegistryError::not_found(kind, what)
        })
}

/// Every live definition of a kind that the tenant owns, with its latest version, by name.
pub async fn list(
    pool: &PgPool,
    tenant: &str,
    kind: ManifestKind,
) -> Result<Vec<Definition>, RegistryError> {
    list_in(pool, tenant, kind, ScopeFilter::Owned).await
}

/// Every live definition of a kind that `filter` selects for the tenant, with its latest
/// version, by name (the tenant's own before another tenant's global one of the same name).
pub async fn list_in(
    pool: &PgPool,
    tenant: &str,
    kind: ManifestKind,
    filter: ScopeFilter,
) -> Result<Vec<Definition>, RegistryError> {
    let sql = format!(
        "SELECT DISTINCT ON (d.name, d.tenant_id <> $1, d.id) d.id, d.name, d.scope, v.version, \
         v.revision, v.manifest_digest, v.id AS version_id, v.description, v.labels, v.manifest, \
         v.manifest_yaml, v.created_at, v.updated_at \
         FROM definitions d JOIN definition_versions v ON v.definition_id = d.id \
         WHERE {condition} AND d.kind = $2 AND d.deleted_at IS NULL \
         ORDER BY d.name, d.tenant_id <> $1, d.id, {LATEST_FIRST}",
        condition = filter.condition(),
    );
    Ok(sqlx::query_as(&sql)
        .bind(tenant)
        .bind(kind_str(kind))
        .fetch_all(pool)
        .await?)
}

/// Every version of a live definition and every revision of each, latest first.
pub async fn versions(
    pool: &PgPool,
    tenant: &str,
    kind: ManifestKind,
    id_or_name: &str,
) -> Result<Vec<VersionInfo>, RegistryError> {
    let head = get(pool, tenant, kind, id_or_name, None).await?;
    let sql = format!(
        "SELECT v.version, v.revision, v.manifest_digest, v.id AS version_id, v.created_at, \
         v.updated_at FROM definition_versions v \
         WHERE v.definition_id = $1 ORDER BY {LATEST_FIRST}"
    );
    Ok(sqlx::query_as(&sql).bind(head.id).fetch_all(pool).await?)
}

/// Hides a definition (all versions) from new work; returns its id.
pub async fn delete(
    pool: &PgPool,
    tenant: &str,
    kind: ManifestKind,
    id_or_name: &str,
) -> Result<Uuid, RegistryError> {
    let id = Uuid::parse_str(id_or_name).ok();
    sqlx::query_scalar(
        "UPDATE definitions SET deleted_at = now() WHERE tenant_id = $1 AND kind = $2 \
         AND deleted_at IS NULL AND (id = $3 OR ($3 IS NULL AND name = $4)) RETURNING id",
    )
    .bind(tenant)
    .bind(kind_str(kind))
    .bind(id)
    .bind(id_or_name)
    .fetch_optional(pool)
    .await?
    .ok_or_else(|| RegistryError::not_found(kind, id_or_name.to_owned()))
}
