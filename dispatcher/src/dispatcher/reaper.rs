//! The reaper: removes every container, volume and egress network (with its host firewall
//! rules and proxy) of this database's scope that has no live owner, whatever its status.
//!
//! It runs at start-up, before any sandbox is created, and then every `reap_interval`. It trusts
//! nothing held in memory: it lists Docker objects by label and judges each against Postgres.
//! An object is removed when
//!
//! - it names a sandbox that has no row here, or whose row is `destroyed` or `failed`;
//!   (a `checkpointed` row's container and workspace holder are kept whatever its instance:
//!   they are the saved sandbox, removed by its destroy);
//! - its row's instance is not live: stopped, or no heartbeat within `dead_after` (the row's
//!   instance, not the label's, because adoption moves a sandbox to another instance), unless
//!   it is a running sandbox a takeover adopts (`takeover.rs`: sessions' and operators', on an
//!   instance with a lease), which is left to the takeover;
//! - its row is stuck: `creating` or `destroying` without change for ten minutes;
//! - it carries no sandbox (the executor-install helper) and the instance that made it is dead.
//!
//! Objects without `org.aegis.managed=true` are never touched. Managed objects of another scope
//! (another database using the same engine) are judged only by that database's reaper, with one
//! exception: when they name a database of *this* PostgreSQL cluster that no longer exists (a
//! dropped test database) or that was recreated since (same name, new scope), no reaper could
//! ever judge them, so they are removed too; and when they belong to a scope whose instances
//! have all stopped beating (`beacon.rs`: it has beacons, and the newest is older than two
//! minutes or `dead_after`, whichever is longer), which is how the sandboxes of a stack whose database vanished with its volume
//! (`docker-compose down -v`, another cluster) are found. Before removing a sandbox's objects the
//! reaper claims its row with a conditional update, so it cannot race an adoption or a destroy
//! into removing something that was just taken over. Each removal is logged.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::{
    ListContainersOptionsBuilder, ListNetworksOptionsBuilder, ListVolumesOptionsBuilder,
};
use uuid::Uuid;

use super::{beacon, Dispatcher, Inner};
use crate::error::{engine, Result};
use crate::labels;
use crate::spec::SandboxId;
use crate::store::{self, RowSummary, SandboxState};

/// A `creating` or `destroying` row that has not changed for this long is stuck.
const STUCK_AFTER_SECS: f64 = 600.0;

/// What one reaper pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Containers removed.
    pub containers_removed: usize,
    /// Volumes removed.
    pub volumes_removed: usize,
    /// Egress networks removed (with their firewall rules).
    pub networks_removed: usize,
    /// Rows of dead instances closed because nothing of them was left in Docker.
    pub rows_closed: u64,
    /// Objects that could not be removed this time (retried next pass).
    pub failures: usize,
}

impl Dispatcher {
    /// Runs one reaper pass now (it also runs at start-up and periodically).
    pub async fn reap(&self) -> Result<ReapReport> {
        self.inner.reap().await
    }
}

/// The labelled Docker objects of this scope, by kind.
struct Managed {
    containers: Vec<Found>,
    volumes: Vec<Found>,
    networks: Vec<Found>,
}

/// One labelled Docker object.
struct Found {
    name: String,
    sandbox: Option<SandboxId>,
    instance: Option<Uuid>,
    running: bool,
}

impl Found {
    fn from_labels(name: String, labels: &HashMap<String, String>, running: bool) -> Self {
        Found {
            name,
            sandbox: labels.get(labels::SANDBOX).and_then(|s| s.parse().ok()),
            instance: labels.get(labels::INSTANCE).and_then(|s| s.parse().ok()),
            running,
        }
    }
}

impl Inner {
    /// Every container, running or not, whose labels match `filters`; `what` says in an error
    /// which listing failed.
    async fn containers_matching(
        &self,
        filters: &HashMap<String, Vec<String>>,
        what: &str,
    ) -> Result<Vec<bollard::models::ContainerSummary>> {
        self.docker
            .list_containers(Some(
                ListContainersOptionsBuilder::new()
                    .all(true)
                    .filters(filters)
                    .build(),
            ))
            .await
            .map_err(engine(what))
    }

    /// Every volume whose labels match `filters`; `what` says in an error which listing failed.
    pub(super) async fn volumes_matching(
        &self,
        filters: &HashMap<String, Vec<String>>,
        what: &str,
    ) -> Result<Vec<bollard::models::Volume>> {
        let options = ListVolumesOptionsBuilder::new().filters(filters).build();
        let listed = self.docker.list_volumes(Some(options)).await;
        Ok(listed.map_err(engine(what))?.volumes.unwrap_or_default())
    }

    /// Every network whose labels match `filters`; `what` says in an error which listing failed.
    async fn networks_matching(
        &self,
        filters: &HashMap<String, Vec<String>>,
        what: &str,
    ) -> Result<Vec<bollard::models::Network>> {
        let options = ListNetworksOptionsBuilder::new().filters(filters).build();
        self.docker
            .list_networks(Some(options))
            .await
            .map_err(engine(what))
    }

    pub(crate) async fn reap(self: &Arc<Self>) -> Result<ReapReport> {
        let mut report = ReapReport::default();
        let mut live = store::live_instances(&self.pg, self.config.dead_after).await?;
        // This instance is running this code: it is alive whatever its heartbeat says.
        live.insert(self.instance);

        let Managed {
            containers,
            volumes,
            networks,
        } = self.managed_objects().await?;

        let ids: Vec<Uuid> = containers
            .iter()
            .chain(&volumes)
            .chain(&networks)
            .filter_map(|f| f.sandbox.map(|s| s.0))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let rows = store::summaries(&self.pg, &ids).await?;
        // Per sandbox: None = leave alone, Some(reason) = remove (row claimed or absent).
        let mut decided: HashMap<SandboxId, Option<String>> = HashMap::new();

        for found in &containers {
            let Some(reason) = self.verdict(found, &rows, &live, &mut decided).await? else {
                continue;
            };
            match self.remove_container(&found.name).await {
                Ok(()) => {
                    report.containers_removed += 1;
                    tracing::info!(container = %found.name, sandbox = ?found.sandbox.map(|s| s.to_string()), %reason, "reaper removed container");
                }
                Err(e) => {
                    report.failures += 1;
                    tracing::warn!(container = %found.name, error = %e, "reaper could not remove container; will retry");
                }
            }
        }
        for found in &volumes {
            let Some(reason) = self.verdict(found, &rows, &live, &mut decided).await? else {
                continue;
            };
            match self.remove_volume(&found.name).await {
                Ok(()) => {
                    report.volumes_removed += 1;
                    tracing::info!(volume = %found.name, sandbox = ?found.sandbox.map(|s| s.to_string()), %reason, "reaper removed volume");
                }
                Err(e) => {
                    report.failures += 1;
                    tracing::warn!(volume = %found.name, error = %e, "reaper could not remove volume; will retry");
                }
            }
        }
        // After the containers: a network cannot go while a container is attached to it.
        for found in &networks {
            let Some(reason) = self.verdict(found, &rows, &live, &mut decided).await? else {
                continue;
            };
            if let (Some(host), Some(id)) = (&self.config.egress_host, found.sandbox) {
                host.close(id);
            }
            match crate::network::remove_on(&self.docker, &found.name, true).await {
                Ok(_) => {
                    report.networks_removed += 1;
                    tracing::info!(network = %found.name, sandbox = ?found.sandbox.map(|s| s.to_string()), %reason, "reaper removed egress network");
                }
                Err(e) => {
                    report.failures += 1;
                    tracing::warn!(network = %found.name, error = %e, "reaper could not remove egress network; will retry");
                }
            }
        }
        self.mark_reaped(&decided, &rows).await?;

        let present: Vec<Uuid> = ids;
        report.rows_closed = store::close_vanished(&self.pg, &live, &present, &self.engine).await?;
        self.reap_dropped_databases(&mut report).await?;
        self.reap_silent_scopes(&mut report).await?;
        self.sweep_channel_dirs().await;
        self.prune_broken().await;
        if report != ReapReport::default() {
            tracing::info!(
                containers = report.containers_removed,
                volumes = report.volumes_removed,
                networks = report.networks_removed,
                rows_closed = report.rows_closed,
                failures = report.failures,
                "reaper pass"
            );
        }
        Ok(report)
    }

    /// The listing phase: this scope's managed containers, volumes and networks, read before
    /// anything is decided.
    async fn managed_objects(&self) -> Result<Managed> {
        let filters = labels::managed_with([format!("{}={}", labels::SCOPE, self.scope.label)]);
        let containers: Vec<Found> = self
            .containers_matching(&filters, "listing managed containers for the reaper")
            .await?
            .into_iter()
            .filter_map(|c| {
                let name = c
                    .names
                    .and_then(|n| n.into_iter().next())
                    .map(|n| n.trim_start_matches('/').to_owned())
                    .or(c.id)?;
                let running = c.state == Some(ContainerSummaryStateEnum::RUNNING);
                Some(Found::from_labels(
                    name,
                    &c.labels.unwrap_or_default(),
                    running,
                ))
            })
            .collect();
        let volumes: Vec<Found> = self
            .volumes_matching(&filters, "listing managed volumes for the reaper")
            .await?
            .into_iter()
            .map(|v| Found::from_labels(v.name, &v.labels, false))
            .collect();

        let networks: Vec<Found> = self
            .networks_matching(&filters, "listing managed networks for the reaper")
            .await?
            .into_iter()
            .filter_map(|n| {
                Some(Found::from_labels(
                    n.name?,
                    &n.labels.unwrap_or_default(),
                    false,
                ))
            })
            .collect();
        Ok(Managed {
            containers,
            volumes,
            networks,
        })
    }

    /// The recording phase, after the removals: each claimed row of a removed sandbox is
    /// released here, its streams closed, and marked destroyed with the reason.
    async fn mark_reaped(
        &self,
        decided: &HashMap<SandboxId, Option<String>>,
        rows: &HashMap<SandboxId, RowSummary>,
    ) -> Result<()> {
        for (id, reason) in decided {
            let Some(reason) = reason else { continue };
            if rows.contains_key(id) {
                if let Some(sandbox) = self.release(*id) {
                    sandbox.stream.close(&format!("sandbox reaped: {reason}"));
                }
                store::mark_destroyed(&self.pg, *id, &format!("reaped: {reason}")).await?;
            }
        }
        Ok(())
    }

    /// Decides about one object, claiming its sandbox's row the first time it is judged.
    async fn verdict(
        &self,
        found: &Found,
        rows: &HashMap<SandboxId, RowSummary>,
        live: &HashSet<Uuid>,
        decided: &mut HashMap<SandboxId, Option<String>>,
    ) -> Result<Option<String>> {
        let Some(sandbox) = found.sandbox else {
            // Not a sandbox object (the executor-install helper): its creator decides.
            return Ok(match found.instance {
                Some(instance) if live.contains(&instance) => None,
                Some(instance) => Some(format!("helper of dead instance {instance}")),
                None => Some("managed object without an owner label".to_owned()),
            });
        };
        if let Some(done) = decided.get(&sandbox) {
            return Ok(done.clone());
        }
        let verdict = match rows.get(&sandbox) {
            None => Some("no sandbox row in this database".to_owned()),
            Some(row) => {
                let reason = self.judge_row(found, sandbox, row, live);
                match reason {
                    Some(reason) if store::claim_reap(&self.pg, sandbox, row, &reason).await? => {
                        Some(reason)
                    }
                    // Someone else (adoption, destroy) changed the row since it was read.
                    Some(_) => None,
                    None => None,
                }
            }
        };
        decided.insert(sandbox, verdict.clone());
        Ok(verdict)
    }

    fn judge_row(
        &self,
        found: &Found,
        sandbox: SandboxId,
        row: &RowSummary,
        live: &HashSet<Uuid>,
    ) -> Option<String> {
        let owner_live = live.contains(&row.instance_id);
        match row.state {
            SandboxState::Destroyed | SandboxState::Failed => {
                Some(format!("sandbox is {}", row.state.as_str()))
            }
            // Saved by its engine (`checkpoint.rs`), whoever paused it: any replica driving
            // the engine may restore it, and its destroy removes it with its checkpoint.
            SandboxState::Checkpointed => None,
            // A takeover adopts it (or marks it lost): a survivor may keep serving it.
            SandboxState::Running
                if !owner_live
                    && self.lease.takes_over()
                    && row.owner_kind.is_some_and(store::adopted_on_takeover) =>
            {
                None
            }
            _ if !owner_live => Some(format!(
                "owner instance {} is dead (stopped, or no heartbeat within {:?})",
                row.instance_id, self.config.dead_after
            )),
            SandboxState::Creating | SandboxState::Destroying
                if row.idle_secs > STUCK_AFTER_SECS =>
            {
                Some(format!(
                    "stuck {} for {:.0} s",
                    row.state.as_str(),
                    row.idle_secs
                ))
            }
            SandboxState::Running
                if row.instance_id == self.instance
                    && !found.running
                    && found.name.starts_with("aegis-sbx-")
                    && self
                        .held(sandbox)
                        .is_none_or(|s| s.stream.closed_reason().is_some()) =>
            {
                Some("its container stopped".to_owned())
            }
            _ => None,
        }
    }

    /// Removes objects of databases of this cluster that no longer exist (a dropped test
    /// database) or that were recreated (same name, new scope): nobody can ever judge them.
    async fn reap_dropped_databases(&self, report: &mut ReapReport) -> Result<()> {
        let Some(cluster) = &self.scope.cluster else {
            return Ok(());
        };
        let filters = labels::managed_with([format!("{}={cluster}", labels::DB_CLUSTER)]);
        let containers = self
            .containers_matching(&filters, "listing managed containers of other databases")
            .await?
            .into_iter()
            .filter_map(|c| Some((c.id?, c.labels.unwrap_or_default())));
        let volumes = self
            .volumes_matching(&filters, "listing managed volumes of other databases")
            .await?
            .into_iter()
            .map(|v| (v.name, v.labels));
        let networks = self
            .networks_matching(&filters, "listing managed networks of other databases")
            .await?
            .into_iter()
            .filter_map(|n| Some((n.name?, n.labels.unwrap_or_default())));
        let foreign = |labels: &HashMap<String, String>| {
            labels.get(labels::SCOPE).map(String::as_str) != Some(self.scope.label.as_str())
        };
        let containers: Vec<_> = containers.filter(|(_, l)| foreign(l)).collect();
        let volumes: Vec<_> = volumes.filter(|(_, l)| foreign(l)).collect();
        let networks: Vec<_> = networks.filter(|(_, l)| foreign(l)).collect();
        if containers.is_empty() && volumes.is_empty() && networks.is_empty() {
            return Ok(());
        }
        let databases = store::database_names(&self.pg).await?;
        let orphaned = |labels: &HashMap<String, String>| -> Option<String> {
            let name = labels.get(labels::DB_NAME)?;
            if !databases.contains(name) {
                Some(format!("its database {name} no longer exists"))
            } else if *name == self.scope.database {
                Some(format!(
                    "it belongs to an earlier incarnation of database {name}"
                ))
            } else {
                None
            }
        };
        for (id, l) in &containers {
            let Some(reason) = orphaned(l) else { continue };
            match self.remove_container(id).await {
                Ok(()) => {
                    report.containers_removed += 1;
                    tracing::info!(container = %id, scope = ?l.get(labels::SCOPE), %reason, "reaper removed container");
                }
                Err(e) => {
                    report.failures += 1;
                    tracing::warn!(container = %id, error = %e, "reaper could not remove container; will retry");
                }
            }
        }
        for (name, l) in &volumes {
            let Some(reason) = orphaned(l) else { continue };
            match self.remove_volume(name).await {
                Ok(()) => {
                    report.volumes_removed += 1;
                    tracing::info!(volume = %name, scope = ?l.get(labels::SCOPE), %reason, "reaper removed volume");
                }
                Err(e) => {
                    report.failures += 1;
                    tracing::warn!(volume = %name, error = %e, "reaper could not remove volume; will retry");
                }
            }
        }
        for (name, l) in &networks {
            let Some(reason) = orphaned(l) else { continue };
            match crate::network::remove_on(&self.docker, name, true).await {
                Ok(_) => {
                    report.networks_removed += 1;
                    tracing::info!(network = %name, scope = ?l.get(labels::SCOPE), %reason, "reaper removed egress network");
                }
                Err(e) => {
                    report.failures += 1;
                    tracing::warn!(network = %name, error = %e, "reaper could not remove egress network; will retry");
                }
            }
        }
        Ok(())
    }

    /// Removes the objects of other scopes whose instances all stopped beating (see
    /// `beacon.rs`): containers, then networks, then volumes, beacons last.
    async fn reap_silent_scopes(&self, report: &mut ReapReport) -> Result<()> {
        let silent = self.silent_scopes().await?;
        if silent.is_empty() {
            return Ok(());
        }
        let filters = labels::managed_with([]);
        let of_silent = |l: &HashMap<String, String>| of_silent_scope(&silent, l);
        let containers: Vec<(String, (String, String))> = self
            .containers_matching(&filters, "listing managed containers of silent scopes")
            .await?
            .into_iter()
            .filter_map(|c| {
                let reason = of_silent(c.labels.as_ref()?)?;
                Some((c.id?, reason))
            })
            .collect();
        // Checked again now: an instance of that scope that started since the first look keeps
        // everything of its scope.
        let still_silent = self.silent_scopes().await?;
        let keep = |scope: &str| !still_silent.contains_key(scope);
        for (id, (scope, reason)) in &containers {
            if keep(scope) {
                continue;
            }
            match self.remove_container(id).await {
                Ok(()) => {
                    report.containers_removed += 1;
                    tracing::info!(container = %id, %reason, "reaper removed container");
                }
                Err(e) => {
                    report.failures += 1;
                    tracing::warn!(container = %id, error = %e, "reaper could not remove container; will retry");
                }
            }
        }
        let networks = self
            .networks_matching(&filters, "listing managed networks of silent scopes")
            .await?;
        for n in networks {
            let (Some(name), Some((scope, reason))) =
                (n.name, n.labels.as_ref().and_then(of_silent))
            else {
                continue;
            };
            if keep(&scope) {
                continue;
            }
            match self.docker.remove_network(&name).await {
                Ok(()) => tracing::info!(network = %name, %reason, "reaper removed network"),
                Err(e) => {
                    report.failures += 1;
                    tracing::warn!(network = %name, error = %e, "reaper could not remove network; will retry");
                }
            }
        }
        let volumes = self.silent_volumes(&filters, &silent).await?;
        for (_, name, (scope, reason)) in &volumes {
            if keep(scope) {
                continue;
            }
            match self.remove_volume(name).await {
                Ok(()) => {
                    report.volumes_removed += 1;
                    tracing::info!(volume = %name, %reason, "reaper removed volume");
                }
                Err(e) => {
                    report.failures += 1;
                    tracing::warn!(volume = %name, error = %e, "reaper could not remove volume; will retry");
                }
            }
        }
        Ok(())
    }

    /// The volumes of silent scopes, each with whether it is a beacon, its name and (scope,
    /// reason), beacons last.
    async fn silent_volumes(
        &self,
        filters: &HashMap<String, Vec<String>>,
        silent: &HashMap<String, i64>,
    ) -> Result<Vec<(bool, String, (String, String))>> {
        let mut volumes: Vec<(bool, String, (String, String))> = self
            .volumes_matching(filters, "listing managed volumes of silent scopes")
            .await?
            .into_iter()
            .filter_map(|v| {
                let reason = of_silent_scope(silent, &v.labels)?;
                let beacon =
                    v.labels.get(labels::COMPONENT).map(String::as_str) == Some(beacon::COMPONENT);
                Some((beacon, v.name, reason))
            })
            .collect();
        // Beacons last: while anything of the scope is left, the next pass can still judge it.
        volumes.sort_by_key(|(beacon, _, _)| *beacon);
        Ok(volumes)
    }

    /// Other scopes that have beacons, none of them younger than `SILENT_AFTER` (or `dead_after`
    /// when longer): scope -> seconds since the newest beat. A scope without any beacon is never
    /// listed.
    async fn silent_scopes(&self) -> Result<HashMap<String, i64>> {
        let filters =
            labels::managed_with([format!("{}={}", labels::COMPONENT, beacon::COMPONENT)]);
        let beacons = self.volumes_matching(&filters, "listing beacons").await?;
        let mut newest: HashMap<String, i64> = HashMap::new();
        for v in beacons {
            let Some(scope) = v.labels.get(labels::SCOPE) else {
                continue;
            };
            if *scope == self.scope.label {
                continue;
            }
            // An unreadable beat counts as a beat now: when unsure, the scope is alive.
            let at = v
                .labels
                .get(labels::BEAT_AT)
                .and_then(|t| t.parse::<i64>().ok())
                .unwrap_or_else(beacon::now_secs);
            let e = newest.entry(scope.clone()).or_insert(at);
            *e = (*e).max(at);
        }
        let now = beacon::now_secs();
        let dead = self.config.dead_after.max(beacon::SILENT_AFTER).as_secs() as i64;
        Ok(newest
            .into_iter()
            .map(|(scope, at)| (scope, now - at))
            .filter(|(_, quiet)| *quiet > dead)
            .collect())
    }

    /// Removes channel directories whose sandbox container no longer exists (removed by a
    /// reaper pass of another scope, or by hand), leaving those younger than a minute: a
    /// sandbox being created has its directory before its container.
    async fn sweep_channel_dirs(&self) {
        let Some(base) = &self.config.channel_dir else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(base) else {
            return;
        };
        let old: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > Duration::from_secs(60))
            })
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| name.parse::<SandboxId>().is_ok())
            .collect();
        if old.is_empty() {
            return;
        }
        let filters = HashMap::from([("name".to_owned(), vec!["aegis-sbx-".to_owned()])]);
        let Ok(containers) = self
            .containers_matching(&filters, "listing sandbox containers for the channel sweep")
            .await
        else {
            return;
        };
        let existing: HashSet<String> = containers
            .into_iter()
            .flat_map(|c| c.names.unwrap_or_default())
            .map(|n| n.trim_start_matches('/').to_owned())
            .collect();
        for name in old {
            let container = format!("aegis-sbx-{name}");
            if !existing.contains(&container) {
                crate::channel::remove(base, &container);
            }
        }
    }

    /// Forgets held sandboxes whose stream broke and whose row is finished.
    async fn prune_broken(&self) {
        let broken: Vec<SandboxId> = self
            .sandboxes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| s.stream.closed_reason().is_some())
            .map(|s| s.id)
            .collect();
        for id in broken {
            if let Ok(Some(info)) = store::get(&self.pg, id).await {
                if info.state.is_terminal() {
                    self.release(id);
                }
            }
        }
        // Proxies of sandboxes finished elsewhere (destroyed through another instance).
        if let Some(host) = &self.config.egress_host {
            for id in host.open_sandboxes() {
                if self.held(id).is_some() {
                    continue;
                }
                if let Ok(info) = store::get(&self.pg, id).await {
                    if info.is_none_or(|i| i.state.is_terminal()) {
                        host.close(id);
                    }
                }
            }
        }
    }
}

/// Runs the reaper every `reap_interval` until the dispatcher is dropped or shut down.
pub(crate) fn spawn_periodic(weak: Weak<Inner>) {
    let Some(inner) = weak.upgrade() else { return };
    let interval = inner.config.reap_interval.max(Duration::from_secs(1));
    drop(inner);
    super::periodic::every(weak, interval, |inner| async move {
        if let Err(e) = inner.reap().await {
            tracing::warn!(error = %e, "reaper pass failed; retrying next period");
        }
    });
}

/// (scope, reason) of an object of a silent scope, from its labels; none for other objects.
fn of_silent_scope(
    silent: &HashMap<String, i64>,
    l: &HashMap<String, String>,
) -> Option<(String, String)> {
    let scope = l.get(labels::SCOPE)?;
    let quiet = silent.get(scope)?;
    Some((
        scope.clone(),
        format!(
            "no instance of its database {} has been alive for {quiet} s (scope {scope})",
            l.get(labels::DB_NAME).map_or("?", String::as_str)
        ),
    ))
}
