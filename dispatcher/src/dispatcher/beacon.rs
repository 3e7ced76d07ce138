//! Beacons: how a dispatcher tells every other database's reaper on the same Docker host that
//! its database still has a live instance.
//!
//! The reaper of one database judges its own objects against its rows, and can judge the objects
//! of a database of its own PostgreSQL cluster that was dropped. What it cannot see is another
//! cluster: after `docker-compose down -v` the database volume is gone, the new stack has a new
//! cluster, and the old stack's sandboxes would run forever. Docker is the only thing both
//! stacks share, so liveness is published there: every instance keeps one small labelled volume,
//! `aegis-beacon-<instance>-<beat>`, renewed every [`INTERVAL`] (a new volume, then the old one
//! removed, since Docker labels never change), whose `org.aegis.beat-at` label is the time of the
//! beat in Unix seconds. Volumes because they cost nothing (no process, no network) and survive
//! `down -v`, which removes only the volumes a compose file declares.
//!
//! The rule the reaper applies to a scope that is not its own (see `reaper.rs`): its objects are
//! removed when it has at least one beacon and its newest beacon is older than [`SILENT_AFTER`]
//! (or the judge's `dead_after` when longer). A scope with no beacon at all (made by a version
//! that did not beat) is never judged from outside, so two stacks on one host never remove each
//! other's live sandboxes: a live instance beats every 15 s, eight times inside the limit. The
//! beat times are the beaters' clocks, compared with the judge's: nodes sharing a Docker engine
//! are assumed to share a clock (one host). A node that stops with `shutdown.sandboxes: destroy`
//! removes its sandboxes and then its beacons; one that keeps its sandboxes keeps its beacon too,
//! so a restart within the limit finds them.

use std::collections::HashMap;
use std::sync::Weak;
use std::time::Duration;

use bollard::models::VolumeCreateRequest;

use super::Inner;
use crate::error::{engine, Result};
use crate::labels;

/// Time between two beats of one instance.
pub const INTERVAL: Duration = Duration::from_secs(15);

/// A scope whose newest beat is older than this (or than the judging node's `dead_after`, if
/// longer) is silent. Fixed rather than taken from the judge's `dead_after` alone: a node set to
/// reap its own dead instances after a second must not take every other stack for dead between
/// two beats. Eight missed beats.
pub const SILENT_AFTER: Duration = Duration::from_secs(120);

/// The `org.aegis.component` value of beacon volumes.
pub const COMPONENT: &str = "beacon";

/// Seconds since the Unix epoch (the host's clock: every reader is on the same host).
pub(crate) fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}

impl Inner {
    /// Publishes a fresh beacon, then removes this instance's older ones.
    pub(crate) async fn beat(&self) -> Result<()> {
        let now = chrono::Utc::now();
        let name = format!("aegis-beacon-{}-{}", self.instance, now.timestamp_millis());
        let mut volume_labels = HashMap::from([
            (labels::MANAGED.to_owned(), "true".to_owned()),
            (labels::INSTANCE.to_owned(), self.instance.to_string()),
            (labels::COMPONENT.to_owned(), COMPONENT.to_owned()),
            (labels::BEAT_AT.to_owned(), now.timestamp().to_string()),
        ]);
        volume_labels.extend(self.scope.labels());
        self.docker
            .create_volume(VolumeCreateRequest {
                name: Some(name.clone()),
                labels: Some(volume_labels),
                ..Default::default()
            })
            .await
            .map_err(engine("creating the beacon volume"))?;
        for old in self.own_beacons().await? {
            if old != name {
                if let Err(e) = self.remove_volume(&old).await {
                    tracing::debug!(volume = %old, error = %e, "old beacon not removed yet");
                }
            }
        }
        Ok(())
    }

    /// Removes every beacon of this instance (at a shutdown that leaves nothing to protect).
    pub(crate) async fn silence(&self) {
        match self.own_beacons().await {
            Ok(names) => {
                for name in names {
                    if let Err(e) = self.remove_volume(&name).await {
                        tracing::warn!(volume = %name, error = %e, "beacon not removed at shutdown");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list this instance's beacons"),
        }
    }

    /// True when another instance on this engine (any database) beat within [`SILENT_AFTER`],
    /// or when that cannot be told: what all nodes share (the executor volume) then stays.
    pub(crate) async fn others_alive(&self) -> bool {
        let filters = labels::managed_with([format!("{}={COMPONENT}", labels::COMPONENT)]);
        let Ok(volumes) = self.volumes_matching(&filters, "listing beacons").await else {
            return true;
        };
        let recent = now_secs() - SILENT_AFTER.as_secs() as i64;
        let me = self.instance.to_string();
        volumes.iter().any(|v| {
            v.labels.get(labels::INSTANCE) != Some(&me)
                && v.labels
                    .get(labels::BEAT_AT)
                    .and_then(|t| t.parse::<i64>().ok())
                    .is_some_and(|t| t >= recent)
        })
    }

    async fn own_beacons(&self) -> Result<Vec<String>> {
        let filters = labels::managed_with([
            format!("{}={COMPONENT}", labels::COMPONENT),
            format!("{}={}", labels::INSTANCE, self.instance),
        ]);
        let beacons = self
            .volumes_matching(&filters, "listing this instance's beacons")
            .await?;
        Ok(beacons.into_iter().map(|v| v.name).collect())
    }
}

/// Beats every [`INTERVAL`] until the dispatcher shuts down or is dropped.
pub(crate) fn spawn_periodic(weak: Weak<Inner>) {
    super::periodic::every(weak, INTERVAL, |inner| async move {
        if let Err(e) = inner.beat().await {
            tracing::warn!(error = %e, "beacon not renewed; other stacks on this host may take this node for dead after sandbox.dead_after_secs");
        }
    });
}
