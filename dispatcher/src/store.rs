//! The `sandboxes` table: the dispatcher's durable record, written before Docker is touched.
//!
//! Every state change is a conditional `UPDATE ... WHERE state = ...`, so concurrent actors (a
//! destroy racing a create, the reaper racing an adoption, two instances adopting the same
//! sandbox) resolve in the database: exactly one of them sees its row change and acts. A row's
//! holder is `(instance_id, epoch)`: every write the holder makes says both, and every change of
//! holder bumps the epoch, so a replica that lost a sandbox (taken over while it stalled) writes
//! nothing (the lease and its fence: `dispatcher/lease.rs`). Queries are checked at run time so
//! building never needs a database.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::{Query, QueryScalar};
use sqlx::{PgPool, Postgres, Row};
use uuid::Uuid;

use crate::error::{db, Result};
use crate::spec::{Limits, NetworkMode, Owner, OwnerKind, SandboxId, SandboxSpec};

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// The row exists; Docker objects are being created.
    Creating,
    /// The executor answered its ready line; calls are served.
    Running,
    /// Its container is saved by the engine (processes and memory, `checkpoint.rs`) and
    /// stopped; no call reaches it until it is restored (back to `running`).
    Checkpointed,
    /// A destroy (or the reaper) is removing its Docker objects.
    Destroying,
    /// Its container and volume are gone.
    Destroyed,
    /// Creation failed, or the executor stream broke; `reason` says why.
    Failed,
}

impl SandboxState {
    /// The name stored in Postgres.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
            SandboxState::Checkpointed => "checkpointed",
            SandboxState::Destroying => "destroying",
            SandboxState::Destroyed => "destroyed",
            SandboxState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "creating" => SandboxState::Creating,
            "running" => SandboxState::Running,
            "checkpointed" => SandboxState::Checkpointed,
            "destroying" => SandboxState::Destroying,
            "destroyed" => SandboxState::Destroyed,
            "failed" => SandboxState::Failed,
            _ => return None,
        })
    }

    /// True for states in which nothing more will happen to the sandbox on its own.
    pub fn is_terminal(self) -> bool {
        matches!(self, SandboxState::Destroyed | SandboxState::Failed)
    }
}

/// The settings a sandbox was created with, as recorded in its row (`spec` column).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedSpec {
    /// Effective (clamped) limits.
    pub limits: Limits,
    /// Network access.
    pub network: NetworkMode,
    /// Executor read roots.
    pub read_roots: Vec<String>,
    /// Executor write roots.
    pub write_roots: Vec<String>,
    /// Whether the executor follows symlinks beneath its roots.
    #[serde(default = "crate::spec::follow_symlinks_by_default")]
    pub follow_symlinks: bool,
    /// Where the workspace volume is mounted (`None`: `/workspace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// Caller labels (for a pool sandbox: those of the spec it was handed out for).
    pub labels: BTreeMap<String, String>,
    /// Its isolation class (rows written before classes existed: `container`).
    #[serde(default)]
    pub isolation: crate::isolation::Isolation,
    /// Its requests may run as root ([`SandboxSpec::root_allowed`]: asked for, gVisor class).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_root: bool,
}

impl From<&SandboxSpec> for RecordedSpec {
    fn from(spec: &SandboxSpec) -> Self {
        RecordedSpec {
            limits: spec.limits,
            network: spec.network,
            read_roots: spec.read_roots.clone(),
            write_roots: spec.write_roots.clone(),
            follow_symlinks: spec.follow_symlinks,
            workspace: spec.workspace.clone(),
            labels: spec.labels.clone(),
            isolation: spec.isolation(),
            allow_root: spec.root_allowed(),
        }
    }
}

/// What operators see of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxInfo {
    /// The sandbox.
    pub id: SandboxId,
    /// Its tenant.
    pub tenant_id: String,
    /// The orchestrator instance holding its stream.
    pub instance_id: Uuid,
    /// Its runtime image.
    pub image: String,
    /// Its current owner.
    pub owner: Owner,
    /// Where it is in its life.
    pub state: SandboxState,
    /// Docker container name (`aegis-sbx-<id>`; each restore from a checkpoint moves it to a new
    /// one, `aegis-sbx-<id>-r<epoch>`).
    pub container_name: String,
    /// Workspace volume name (`aegis-ws-<id>`).
    pub volume_name: String,
    /// Limits, network, roots and labels it was created with (absent if unreadable).
    pub spec: Option<RecordedSpec>,
    /// Why it failed or was destroyed.
    pub reason: Option<String>,
    /// When the row was written.
    pub created_at: DateTime<Utc>,
    /// When its executor became ready.
    pub ready_at: Option<DateTime<Utc>>,
    /// When its Docker objects were removed.
    pub destroyed_at: Option<DateTime<Utc>>,
    /// The Docker engine it lives on (`<ID>@<name>:<data root>`; absent for rows from before
    /// several engines were tracked), so an operator sees where each sandbox runs.
    pub engine: Option<String>,
}

const INFO_COLUMNS: &str = "id, tenant_id, instance_id, image, owner_kind, owner_id, state, \
     container_name, volume_name, spec, reason, created_at, ready_at, destroyed_at, engine";

fn info_from_row(row: &PgRow) -> std::result::Result<SandboxInfo, sqlx::Error> {
    let owner_kind: String = row.try_get("owner_kind")?;
    let state: String = row.try_get("state")?;
    let decode = |column: &str, value: &str| sqlx::Error::ColumnDecode {
        index: column.to_owned(),
        source: format!("unknown value '{value}'").into(),
    };
    let spec: serde_json::Value = row.try_get("spec")?;
    Ok(SandboxInfo {
        id: SandboxId(row.try_get("id")?),
        tenant_id: row.try_get("tenant_id")?,
        instance_id: row.try_get("instance_id")?,
        image: row.try_get("image")?,
        owner: Owner {
            kind: OwnerKind::parse(&owner_kind).ok_or_else(|| decode("owner_kind", &owner_kind))?,
            id: row.try_get("owner_id")?,
        },
        state: SandboxState::parse(&state).ok_or_else(|| decode("state", &state))?,
        container_name: row.try_get("container_name")?,
        volume_name: row.try_get("volume_name")?,
        spec: serde_json::from_value(spec).ok(),
        reason: row.try_get("reason")?,
        created_at: row.try_get("created_at")?,
        ready_at: row.try_get("ready_at")?,
        destroyed_at: row.try_get("destroyed_at")?,
        engine: row.try_get("engine")?,
    })
}

/// Decodes the rows of a `SELECT {INFO_COLUMNS}`.
fn infos(rows: &[PgRow]) -> Result<Vec<SandboxInfo>> {
    rows.iter()
        .map(info_from_row)
        .collect::<std::result::Result<_, _>>()
        .map_err(db("decoding a sandbox row"))
}

/// Who holds a row: `(instance_id, epoch)`, what every write of the holder says (module doc).
pub(crate) type Holder = (Uuid, i64);

/// A statement on the one row of sandbox `id` as held by `holder`: `$1` is the sandbox, `$2`
/// and `$3` its holder's instance and epoch; the statement's own values are bound after, from
/// `$4`.
fn held(sql: &str, id: SandboxId, (instance, epoch): Holder) -> Query<'_, Postgres, PgArguments> {
    sqlx::query(sql).bind(id.0).bind(instance).bind(epoch)
}

/// Runs a conditional UPDATE of one row: true when its conditions held and the row changed,
/// false when another actor changed it first.
async fn changed(
    update: Query<'_, Postgres, PgArguments>,
    pg: &PgPool,
    doing: &'static str,
) -> Result<bool> {
    let done = update.execute(pg).await.map_err(db(doing))?;
    Ok(done.rows_affected() == 1)
}

/// Runs an UPDATE that moves a row to a new epoch (`RETURNING epoch`): the new epoch, or
/// `None` when its conditions did not hold (another actor got the row first).
async fn new_epoch(
    claim: QueryScalar<'_, Postgres, i64, PgArguments>,
    pg: &PgPool,
    doing: &'static str,
) -> Result<Option<i64>> {
    claim.fetch_optional(pg).await.map_err(db(doing))
}

/// Which database the dispatcher records its sandboxes in, as stamped on Docker objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scope {
    /// `<database name>/<random id stamped at migration>`: the `org.aegis.scope` label.
    pub label: String,
    /// `current_database()`.
    pub database: String,
    /// The cluster's system identifier (`pg_control_system()`), if this role may read it.
    pub cluster: Option<String>,
}

impl Scope {
    /// The labels naming this scope, for every object the dispatcher creates.
    pub fn labels(&self) -> Vec<(String, String)> {
        let mut labels = vec![
            (crate::labels::SCOPE.to_owned(), self.label.clone()),
            (crate::labels::DB_NAME.to_owned(), self.database.clone()),
        ];
        if let Some(cluster) = &self.cluster {
            labels.push((crate::labels::DB_CLUSTER.to_owned(), cluster.clone()));
        }
        labels
    }
}

/// Ids of the live sandboxes (creating, running, checkpointed) recorded for `instance`.
pub(crate) async fn live_of_instance(pg: &PgPool, instance: Uuid) -> Result<Vec<SandboxId>> {
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM sandboxes WHERE instance_id = $1 \
         AND state IN ('creating', 'running', 'checkpointed')",
    )
    .bind(instance)
    .fetch_all(pg)
    .await
    .map_err(db("listing the live sandboxes of this instance"))?;
    Ok(ids.into_iter().map(SandboxId).collect())
}

/// Reads this database's scope.
pub(crate) async fn scope(pg: &PgPool) -> Result<Scope> {
    let row = sqlx::query("SELECT current_database() AS db, id FROM sandbox_scope")
        .fetch_one(pg)
        .await
        .map_err(db(
            "reading the sandbox scope (is migration 20261121000003 applied?)",
        ))?;
    let database: String = row.try_get("db").map_err(db("reading the sandbox scope"))?;
    let id: Uuid = row.try_get("id").map_err(db("reading the sandbox scope"))?;
    // Executable by PUBLIC by default; a locked-down role just loses the dropped-database rule.
    let cluster: Option<i64> =
        sqlx::query_scalar("SELECT system_identifier FROM pg_control_system()")
            .fetch_optional(pg)
            .await
            .unwrap_or(None);
    Ok(Scope {
        label: format!("{database}/{id}"),
        database,
        cluster: cluster.map(|c| c.to_string()),
    })
}

/// Names of the databases of this cluster (readable by every role).
pub(crate) async fn database_names(pg: &PgPool) -> Result<HashSet<String>> {
    let names: Vec<String> = sqlx::query_scalar("SELECT datname::text FROM pg_database")
        .fetch_all(pg)
        .await
        .map_err(db("listing the cluster's databases"))?;
    Ok(names.into_iter().collect())
}

/// Writes the row of a sandbox about to be created (state `creating`).
/// `engine`: the Docker engine it is created on (`placement.rs` counts rows by it).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn insert_creating(
    pg: impl sqlx::PgExecutor<'_>,
    id: SandboxId,
    instance: Uuid,
    engine: &str,
    spec: &SandboxSpec,
    owner: &Owner,
    container: &str,
    volume: &str,
) -> Result<()> {
    let recorded = serde_json::to_value(RecordedSpec::from(spec)).unwrap_or_default();
    sqlx::query(
        "INSERT INTO sandboxes (id, instance_id, image, owner_kind, owner_id, state, \
         container_name, volume_name, spec, engine) \
         VALUES ($1, $2, $3, $4, $5, 'creating', $6, $7, $8, $9)",
    )
    .bind(id.0)
    .bind(instance)
    .bind(&spec.image)
    .bind(owner.kind.as_str())
    .bind(&owner.id)
    .bind(container)
    .bind(volume)
    .bind(recorded)
    .bind(engine)
    .execute(pg)
    .await
    .map_err(db("recording a new sandbox"))?;
    Ok(())
}

/// The epoch of a row when it is written: its first holder is its creator.
pub(crate) const FIRST_EPOCH: i64 = 1;

/// `creating` -> `running` by its creator; false when someone else changed the row first (a
/// destroy, the reaper).
pub(crate) async fn mark_running(
    pg: &PgPool,
    id: SandboxId,
    me: Uuid,
    container_id: &str,
) -> Result<bool> {
    let sql = "UPDATE sandboxes SET state = 'running', container_id = $4, ready_at = now(), \
               updated_at = now() \
               WHERE id = $1 AND instance_id = $2 AND epoch = $3 AND state = 'creating'";
    let update = held(sql, id, (me, FIRST_EPOCH)).bind(container_id);
    changed(update, pg, "marking a sandbox running").await
}

/// `running` -> `checkpointed` by its holder `(me, epoch)`, before the engine saves it.
pub(crate) async fn mark_checkpointed(pg: &PgPool, id: SandboxId, holder: Holder) -> Result<bool> {
    let sql = "UPDATE sandboxes SET state = 'checkpointed', updated_at = now() \
               WHERE id = $1 AND instance_id = $2 AND epoch = $3 AND state = 'running'";
    changed(held(sql, id, holder), pg, "marking a sandbox checkpointed").await
}

/// `checkpointed` -> `creating` held by `me` at a new epoch (a restore under way: the reaper
/// leaves a `creating` row of a live instance alone); the new epoch, or `None` when the row is
/// not checkpointed (restored or destroyed meanwhile).
pub(crate) async fn claim_restore(pg: &PgPool, id: SandboxId, me: Uuid) -> Result<Option<i64>> {
    let claim = sqlx::query_scalar(
        "UPDATE sandboxes SET state = 'creating', instance_id = $2, epoch = epoch + 1, \
         updated_at = now() WHERE id = $1 AND state = 'checkpointed' RETURNING epoch",
    );
    new_epoch(
        claim.bind(id.0).bind(me),
        pg,
        "claiming a checkpointed sandbox",
    )
    .await
}

/// A restore under way (`creating`, held by `(me, epoch)`) moves its sandbox into the new
/// container it starts from the checkpoint (`checkpoint.rs`); false when someone else changed
/// the row first (a destroy).
pub(crate) async fn move_container(
    pg: &PgPool,
    id: SandboxId,
    holder: Holder,
    container_name: &str,
    container_id: &str,
) -> Result<bool> {
    let sql = "UPDATE sandboxes SET container_name = $4, container_id = $5, updated_at = now() \
               WHERE id = $1 AND instance_id = $2 AND epoch = $3 AND state = 'creating'";
    let update = held(sql, id, holder)
        .bind(container_name)
        .bind(container_id);
    changed(update, pg, "moving a restored sandbox to its new container").await
}

/// `creating`|`checkpointed` -> `running` by `(me, epoch)`: a restore finished, or a checkpoint
/// that failed left the container running.
pub(crate) async fn mark_running_again(pg: &PgPool, id: SandboxId, holder: Holder) -> Result<bool> {
    let sql = "UPDATE sandboxes SET state = 'running', updated_at = now() \
               WHERE id = $1 AND instance_id = $2 AND epoch = $3 \
               AND state IN ('creating', 'checkpointed')";
    changed(held(sql, id, holder), pg, "marking a sandbox running again").await
}

/// `creating`|`running` -> `failed` with the reason, by its holder `(me, epoch)` only: a
/// replica whose stream broke because another one took the sandbox over changes nothing.
pub(crate) async fn mark_failed(
    pg: &PgPool,
    id: SandboxId,
    holder: Holder,
    reason: &str,
) -> Result<bool> {
    let sql = "UPDATE sandboxes SET state = 'failed', reason = $4, updated_at = now() \
               WHERE id = $1 AND instance_id = $2 AND epoch = $3 \
               AND state IN ('creating', 'running')";
    let update = held(sql, id, holder).bind(reason);
    changed(update, pg, "marking a sandbox failed").await
}

/// `running` -> `failed` as `lost` by whoever found it so (a takeover that found its container
/// gone or its engine unreachable): conditional on the row still being `(holder, epoch)`, so it
/// cannot undo a claim that happened meanwhile. Its callers get `SandboxGone` with the reason.
pub(crate) async fn mark_lost(
    pg: &PgPool,
    id: SandboxId,
    holder: Holder,
    reason: &str,
) -> Result<bool> {
    mark_failed(pg, id, holder, &format!("lost: {reason}")).await
}

/// The outcome of asking to destroy a sandbox's row.
pub(crate) enum DestroyClaim {
    /// No such row.
    Missing,
    /// Already destroyed: nothing to do.
    AlreadyDestroyed,
    /// The row is now `destroying` (or was already); remove these objects.
    Remove { container: String, volume: String },
}

/// Moves a row to `destroying` (from any state but `destroyed`).
pub(crate) async fn claim_destroy(pg: &PgPool, id: SandboxId) -> Result<DestroyClaim> {
    let row = sqlx::query(
        "WITH target AS (SELECT id, state AS before FROM sandboxes WHERE id = $1 FOR UPDATE) \
         UPDATE sandboxes s SET state = CASE WHEN t.before = 'destroyed' THEN 'destroyed' \
                                             ELSE 'destroying' END, \
                                updated_at = now() \
         FROM target t WHERE s.id = t.id \
         RETURNING t.before, s.container_name, s.volume_name",
    )
    .bind(id.0)
    .fetch_optional(pg)
    .await
    .map_err(db("claiming a sandbox for destruction"))?;
    let Some(row) = row else {
        return Ok(DestroyClaim::Missing);
    };
    let before: String = row.try_get("before").map_err(db("claiming a sandbox"))?;
    if before == "destroyed" {
        return Ok(DestroyClaim::AlreadyDestroyed);
    }
    Ok(DestroyClaim::Remove {
        container: row
            .try_get("container_name")
            .map_err(db("claiming a sandbox"))?,
        volume: row
            .try_get("volume_name")
            .map_err(db("claiming a sandbox"))?,
    })
}

/// `destroying` -> `destroyed`; keeps an earlier failure reason, else records `reason`.
pub(crate) async fn mark_destroyed(pg: &PgPool, id: SandboxId, reason: &str) -> Result<()> {
    sqlx::query(
        "UPDATE sandboxes SET state = 'destroyed', reason = COALESCE(reason, $2), \
         destroyed_at = now(), updated_at = now() WHERE id = $1 AND state <> 'destroyed'",
    )
    .bind(id.0)
    .bind(reason)
    .execute(pg)
    .await
    .map_err(db("marking a sandbox destroyed"))?;
    Ok(())
}

/// One sandbox's row.
pub(crate) async fn get(pg: &PgPool, id: SandboxId) -> Result<Option<SandboxInfo>> {
    let row = sqlx::query(&format!(
        "SELECT {INFO_COLUMNS} FROM sandboxes WHERE id = $1"
    ))
    .bind(id.0)
    .fetch_optional(pg)
    .await
    .map_err(db("reading a sandbox"))?;
    row.as_ref()
        .map(info_from_row)
        .transpose()
        .map_err(db("decoding a sandbox row"))
}

/// Every sandbox not yet destroyed or failed, oldest first.
pub(crate) async fn list_live(pg: &PgPool) -> Result<Vec<SandboxInfo>> {
    let rows = sqlx::query(&format!(
        "SELECT {INFO_COLUMNS} FROM sandboxes \
         WHERE state IN ('creating', 'running', 'checkpointed', 'destroying') ORDER BY created_at, id"
    ))
    .fetch_all(pg)
    .await
    .map_err(db("listing sandboxes"))?;
    infos(&rows)
}

/// Live sandboxes of one owner.
pub(crate) async fn owned_by(pg: &PgPool, owner: &Owner) -> Result<Vec<SandboxId>> {
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM sandboxes WHERE owner_kind = $1 AND owner_id = $2 \
         AND state IN ('creating', 'running', 'checkpointed') ORDER BY created_at",
    )
    .bind(owner.kind.as_str())
    .bind(&owner.id)
    .fetch_all(pg)
    .await
    .map_err(db("listing an owner's sandboxes"))?;
    Ok(ids.into_iter().map(SandboxId).collect())
}

/// Hands a pool sandbox to its owner; false if it is no longer an idle, running pool sandbox
/// held by `(me, epoch)`.
pub(crate) async fn reown_from_pool(
    pg: &PgPool,
    id: SandboxId,
    holder: Holder,
    owner: &Owner,
    labels: &BTreeMap<String, String>,
) -> Result<bool> {
    let labels = serde_json::to_value(labels).unwrap_or_default();
    let sql = "UPDATE sandboxes SET owner_kind = $4, owner_id = $5, \
               spec = jsonb_set(spec, '{labels}', $6), updated_at = now() \
               WHERE id = $1 AND instance_id = $2 AND epoch = $3 \
               AND owner_kind = 'pool' AND state = 'running'";
    let update = held(sql, id, holder)
        .bind(owner.kind.as_str())
        .bind(&owner.id)
        .bind(labels);
    changed(update, pg, "handing a pool sandbox to its owner").await
}

/// Running sandboxes held by `instance`, for adoption.
pub(crate) async fn running_of_instance(pg: &PgPool, instance: Uuid) -> Result<Vec<SandboxInfo>> {
    let rows = sqlx::query(&format!(
        "SELECT {INFO_COLUMNS} FROM sandboxes WHERE instance_id = $1 AND state = 'running' \
         ORDER BY created_at"
    ))
    .bind(instance)
    .fetch_all(pg)
    .await
    .map_err(db("listing an instance's sandboxes"))?;
    infos(&rows)
}

/// Moves a running sandbox from `previous` (a stopped instance, graceful hand-over) to `me`,
/// bumping its epoch; the new epoch, or `None` if another actor got it first.
pub(crate) async fn claim_adoption(
    pg: &PgPool,
    id: SandboxId,
    previous: Uuid,
    me: Uuid,
) -> Result<Option<i64>> {
    let claim = sqlx::query_scalar(
        "UPDATE sandboxes SET instance_id = $3, epoch = epoch + 1, updated_at = now() \
         WHERE id = $1 AND instance_id = $2 AND state = 'running' RETURNING epoch",
    );
    new_epoch(
        claim.bind(id.0).bind(previous).bind(me),
        pg,
        "adopting a sandbox",
    )
    .await
}

/// Moves a running sandbox of a fenced or stopped holder to `me` (a takeover), bumping its
/// epoch: only if the row is still `(previous, epoch)` and that holder is still fenced or
/// stopped. The row condition is what serialises concurrent claimers (and a holder taking back
/// what it dropped): exactly one sees the row change. The new epoch, or `None`.
pub(crate) async fn claim_takeover(
    pg: &PgPool,
    id: SandboxId,
    (previous, epoch): Holder,
    me: Uuid,
) -> Result<Option<i64>> {
    let claim = sqlx::query_scalar(
        "UPDATE sandboxes SET instance_id = $4, epoch = epoch + 1, updated_at = now() \
         WHERE id = $1 AND instance_id = $2 AND epoch = $3 AND state = 'running' \
         AND EXISTS (SELECT 1 FROM node_instances n WHERE n.id = $2 \
                     AND (n.fenced_at IS NOT NULL OR n.stopped_at IS NOT NULL)) \
         RETURNING epoch",
    );
    let claim = claim.bind(id.0).bind(previous).bind(epoch).bind(me);
    new_epoch(claim, pg, "taking over a sandbox").await
}

/// Claims one sandbox of a stopped or fenced `previous` holder for `me` at once, for a call
/// that found its holder gone (`takeover.rs`, a rolling restart): the takeover pass's claim,
/// with its conditions (a running sandbox of an owner a takeover adopts, on `me`'s engine),
/// bumping the epoch. The new epoch, or `None` when it is not to be had.
pub(crate) async fn claim_handover(
    pg: &PgPool,
    id: SandboxId,
    previous: Uuid,
    me: Uuid,
    engine: &str,
) -> Result<Option<i64>> {
    let claim = sqlx::query_scalar(
        "UPDATE sandboxes SET instance_id = $3, epoch = epoch + 1, updated_at = now() \
         WHERE id = $1 AND instance_id = $2 AND state = 'running' \
         AND owner_kind IN ('session', 'operator') AND COALESCE(engine, $4) = $4 \
         AND EXISTS (SELECT 1 FROM node_instances n WHERE n.id = $2 \
                     AND (n.fenced_at IS NOT NULL OR n.stopped_at IS NOT NULL)) \
         RETURNING epoch",
    );
    let claim = claim.bind(id.0).bind(previous).bind(me).bind(engine);
    new_epoch(claim, pg, "taking over a sandbox of a stopped holder").await
}

/// Whether `instance` is recorded as stopped or fenced off (it holds nothing any more).
pub(crate) async fn holds_nothing(pg: &PgPool, instance: Uuid) -> Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM node_instances WHERE id = $1 \
                        AND (stopped_at IS NOT NULL OR fenced_at IS NOT NULL))",
    )
    .bind(instance)
    .fetch_one(pg)
    .await
    .map_err(db("reading a holder's state"))
}

/// Takes back a sandbox `me` dropped when its lease lapsed, if nobody claimed it meanwhile
/// (still `(me, epoch)` and running): the new epoch, or `None`.
pub(crate) async fn reclaim(pg: &PgPool, id: SandboxId, holder: Holder) -> Result<Option<i64>> {
    let claim = sqlx::query_scalar(
        "UPDATE sandboxes SET epoch = epoch + 1, updated_at = now() \
         WHERE id = $1 AND instance_id = $2 AND epoch = $3 AND state = 'running' RETURNING epoch",
    );
    let (me, epoch) = holder;
    let claim = claim.bind(id.0).bind(me).bind(epoch);
    new_epoch(claim, pg, "taking back a dropped sandbox").await
}

/// A sandbox's row with its epoch (for adoption, takeover and taking back).
pub(crate) struct HeldRow {
    /// The row.
    pub info: SandboxInfo,
    /// Its epoch when read.
    pub epoch: i64,
}

/// Running sandboxes whose holder is fenced or stopped and whose owner lives outside any one
/// replica (sessions, operators and the E2B door's sandboxes): what a takeover adopts.
/// Executions, workflow states and the warm pool ran in the holder's process; theirs are left
/// to the reaper.
///
/// Only sandboxes on `engine` (or of no recorded engine): a replica can reattach only to
/// containers on the engine it drives.
pub(crate) async fn adoptable(pg: &PgPool, me: Uuid, engine: &str) -> Result<Vec<HeldRow>> {
    let rows = sqlx::query(&format!(
        "SELECT {}, s.epoch FROM sandboxes s JOIN node_instances n ON n.id = s.instance_id \
         WHERE s.state = 'running' AND s.instance_id <> $1 \
         AND s.owner_kind IN ('session', 'operator') \
         AND (n.fenced_at IS NOT NULL OR n.stopped_at IS NOT NULL) \
         AND COALESCE(s.engine, $2) = $2 ORDER BY s.created_at",
        INFO_COLUMNS
            .split(", ")
            .map(|c| format!("s.{c}"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .bind(me)
    .bind(engine)
    .fetch_all(pg)
    .await
    .map_err(db("listing the sandboxes of fenced instances"))?;
    rows.iter()
        .map(|row| {
            Ok(HeldRow {
                info: info_from_row(row)?,
                epoch: row.try_get("epoch")?,
            })
        })
        .collect::<std::result::Result<_, sqlx::Error>>()
        .map_err(db("decoding a sandbox row"))
}

/// True for owners a takeover adopts (see [`adoptable`]).
pub(crate) fn adopted_on_takeover(kind: OwnerKind) -> bool {
    matches!(kind, OwnerKind::Session | OwnerKind::Operator)
}

/// The outcome of a lease renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The heartbeat is recorded: nobody may take this instance for dead before `dead_after`.
    Renewed,
    /// A peer fenced this instance off (it was silent past `dead_after`): it holds nothing.
    Fenced,
    /// This instance is recorded as stopped.
    Stopped,
}

/// Renews `me`'s lease: the heartbeat, unless a peer fenced it off first. One UPDATE of the
/// instance's row, which a peer's fence ([`fence_silent`]) also updates, so the two are
/// serialised by the row lock and exactly one wins.
pub(crate) async fn renew(pg: &PgPool, me: Uuid) -> Result<Renewal> {
    let row: Option<(bool, bool)> = sqlx::query_as(
        "WITH r AS (UPDATE node_instances SET heartbeat_at = now() \
                    WHERE id = $1 AND stopped_at IS NULL AND fenced_at IS NULL RETURNING id) \
         SELECT EXISTS (SELECT 1 FROM r), \
                EXISTS (SELECT 1 FROM node_instances WHERE id = $1 AND stopped_at IS NOT NULL)",
    )
    .bind(me)
    .fetch_optional(pg)
    .await
    .map_err(db("renewing this instance's lease"))?;
    Ok(match row {
        Some((true, _)) => Renewal::Renewed,
        Some((false, true)) => Renewal::Stopped,
        _ => Renewal::Fenced,
    })
}

/// A fenced instance that is running again clears its fence and beats: from now on it counts
/// as alive, holding nothing it has not taken back ([`reclaim`]). False when it is stopped.
pub(crate) async fn rejoin(pg: &PgPool, me: Uuid) -> Result<bool> {
    let update = sqlx::query(
        "UPDATE node_instances SET fenced_at = NULL, heartbeat_at = now() \
         WHERE id = $1 AND stopped_at IS NULL",
    );
    changed(update.bind(me), pg, "rejoining after a fence").await
}

/// Fences off every other instance silent for longer than `dead_after` that still has live
/// sandboxes (by the database's clock); returns them. Conditional on the heartbeat in the same
/// UPDATE, so an instance whose renewal committed first is not fenced.
pub(crate) async fn fence_silent(pg: &PgPool, me: Uuid, dead_after: Duration) -> Result<Vec<Uuid>> {
    sqlx::query_scalar(
        "UPDATE node_instances n SET fenced_at = now() \
         WHERE n.id <> $1 AND n.stopped_at IS NULL AND n.fenced_at IS NULL \
         AND n.heartbeat_at <= now() - make_interval(secs => $2) \
         AND EXISTS (SELECT 1 FROM sandboxes s WHERE s.instance_id = n.id \
                     AND s.state IN ('creating', 'running', 'destroying')) \
         RETURNING n.id",
    )
    .bind(me)
    .bind(dead_after.as_secs_f64())
    .fetch_all(pg)
    .await
    .map_err(db("fencing off silent instances"))
}

/// `(instance_id, epoch, state)` of the given sandboxes.
pub(crate) async fn holders(
    pg: &PgPool,
    ids: &[Uuid],
) -> Result<HashMap<SandboxId, (Uuid, i64, SandboxState)>> {
    let rows: Vec<(Uuid, Uuid, i64, String)> =
        sqlx::query_as("SELECT id, instance_id, epoch, state FROM sandboxes WHERE id = ANY($1)")
            .bind(ids)
            .fetch_all(pg)
            .await
            .map_err(db("reading the holders of sandboxes"))?;
    Ok(rows
        .into_iter()
        .filter_map(|(id, instance, epoch, state)| {
            Some((
                SandboxId(id),
                (instance, epoch, SandboxState::parse(&state)?),
            ))
        })
        .collect())
}

/// Instances that are alive: not stopped, heartbeat younger than `dead_after` (by the
/// database's clock, so orchestrator clocks need not agree).
pub(crate) async fn live_instances(pg: &PgPool, dead_after: Duration) -> Result<HashSet<Uuid>> {
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM node_instances WHERE stopped_at IS NULL \
         AND heartbeat_at > now() - make_interval(secs => $1)",
    )
    .bind(dead_after.as_secs_f64())
    .fetch_all(pg)
    .await
    .map_err(db("listing live orchestrator instances"))?;
    Ok(ids.into_iter().collect())
}

/// The reaper's view of a row.
#[derive(Debug, Clone)]
pub(crate) struct RowSummary {
    pub instance_id: Uuid,
    pub state: SandboxState,
    /// Whose it is (a takeover adopts sessions' and operators' sandboxes).
    pub owner_kind: Option<OwnerKind>,
    /// Seconds since the row last changed (by the database's clock).
    pub idle_secs: f64,
}

/// Rows of the given sandboxes.
pub(crate) async fn summaries(pg: &PgPool, ids: &[Uuid]) -> Result<HashMap<SandboxId, RowSummary>> {
    let rows = sqlx::query(
        "SELECT id, instance_id, state, owner_kind, \
         EXTRACT(EPOCH FROM now() - updated_at)::float8 AS idle FROM sandboxes WHERE id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(pg)
    .await
    .map_err(db("reading sandbox rows for the reaper"))?;
    let mut out = HashMap::with_capacity(rows.len());
    for row in rows {
        let state: String = row.try_get("state").map_err(db("reading a row"))?;
        let Some(state) = SandboxState::parse(&state) else {
            continue;
        };
        let owner_kind: String = row.try_get("owner_kind").map_err(db("reading a row"))?;
        out.insert(
            SandboxId(row.try_get("id").map_err(db("reading a row"))?),
            RowSummary {
                instance_id: row.try_get("instance_id").map_err(db("reading a row"))?,
                state,
                owner_kind: OwnerKind::parse(&owner_kind),
                idle_secs: row.try_get("idle").map_err(db("reading a row"))?,
            },
        );
    }
    Ok(out)
}

/// Claims a row for reaping: any non-destroyed state -> `destroying`, provided the row still
/// looks as the reaper saw it (same instance, same state). False when someone else moved first.
pub(crate) async fn claim_reap(
    pg: &PgPool,
    id: SandboxId,
    seen: &RowSummary,
    reason: &str,
) -> Result<bool> {
    let update = sqlx::query(
        "UPDATE sandboxes SET state = 'destroying', \
         reason = CASE WHEN state = 'failed' THEN reason ELSE $4 END, updated_at = now() \
         WHERE id = $1 AND instance_id = $2 AND state = $3",
    )
    .bind(id.0)
    .bind(seen.instance_id)
    .bind(seen.state.as_str())
    .bind(format!("reaped: {reason}"));
    changed(update, pg, "claiming a sandbox for the reaper").await
}

/// Bookkeeping: rows still live whose instance is dead and whose Docker objects are all gone.
///
/// Only rows of `engine` (or of no recorded engine): a sandbox on another engine is absent from
/// this engine's listing whatever its state, and only a reaper beside that engine can judge it.
pub(crate) async fn close_vanished(
    pg: &PgPool,
    live: &HashSet<Uuid>,
    present: &[Uuid],
    engine: &str,
) -> Result<u64> {
    let live: Vec<Uuid> = live.iter().copied().collect();
    let done = sqlx::query(
        "UPDATE sandboxes SET state = 'destroyed', \
         reason = COALESCE(reason, 'reaped: owner instance dead, no container or volume left'), \
         destroyed_at = now(), updated_at = now() \
         WHERE state IN ('creating', 'running', 'destroying') \
         AND NOT (instance_id = ANY($1)) AND NOT (id = ANY($2)) \
         AND COALESCE(engine, $3) = $3",
    )
    .bind(&live)
    .bind(present)
    .bind(engine)
    .execute(pg)
    .await
    .map_err(db("closing rows of vanished sandboxes"))?;
    Ok(done.rows_affected())
}
