//! Placement: which Docker engine a new sandbox is created on.
//!
//! Each replica drives one engine (the one beside it, `docker.host`) and records that engine's
//! ID in its `node_instances` row; every sandbox row records the engine it was created on. So
//! what each engine carries is read from the table shared by all replicas: its live sandboxes
//! (creating, running, destroying; warm-pool ones included, they hold memory too) and the
//! memory they reserve (each container's limit: the processes' memory plus the workspace tmpfs,
//! see `hardening.rs`).
//!
//! A new sandbox goes to this replica's own engine while that has room (no hop, and the warm
//! pool beside it is used); when it is full, to the least loaded engine of the other live
//! replicas that take forwarded work (`peer_url`), through one of them, which then holds it.
//! Each engine's bound is that of the replicas driving it (`EngineLimit`), enforced when the
//! row is written: under a transaction-scoped advisory lock per engine, the live rows are
//! counted and the new one inserted, so two replicas filling one engine at once cannot both
//! take its last place. The caller's choice is only an ordering; the engine's own replica has
//! the last word, and a refusal sends the caller to the next engine.
//!
//! What stays cluster-wide: quotas (the sandbox service counts every replica's rows). What is
//! per engine: the warm pool (each replica keeps its own on its own engine), the reaper (it
//! lists its own engine's objects and closes only rows of its engine), egress networks, their
//! proxies and firewall rules (made by the replica that creates the sandbox, beside the engine
//! whose bridge they guard).

use std::time::Duration;

use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use crate::config::EngineLimit;
use crate::error::{db, DispatchError, Result};
use crate::spec::Limits;

/// Where a new sandbox may go, in the order to try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// This instance's own engine.
    Here,
    /// Another engine, through the live instance `instance` that drives it.
    Peer {
        /// The replica asked to create it (and then holding it).
        instance: Uuid,
        /// Its engine's ID.
        engine: String,
        /// Live sandboxes on that engine when looked at.
        live: i64,
    },
}

/// The memory a sandbox reserves on its engine: its container's memory limit.
pub(crate) fn reserved_bytes(limits: &Limits) -> u64 {
    limits.memory_bytes.saturating_add(limits.workspace_bytes)
}

/// Records that `instance` drives engine `engine`, so peers can place sandboxes on it.
pub(crate) async fn record_engine(pg: &PgPool, instance: Uuid, engine: &str) -> Result<()> {
    sqlx::query("UPDATE node_instances SET engine = $2 WHERE id = $1")
        .bind(instance)
        .bind(engine)
        .execute(pg)
        .await
        .map_err(db("recording the Docker engine this instance drives"))?;
    Ok(())
}

/// A live sandbox on another engine than this instance's, and who can act on it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Elsewhere {
    /// The instance holding it.
    pub holder: Uuid,
    /// Its engine.
    pub engine: String,
    /// A live replica driving that engine that takes forwarded work: the holder when it is
    /// alive, else the one that beat last; `None` when no replica drives it any more.
    pub via: Option<Uuid>,
}

/// Whether sandbox `id` (not yet destroyed) lives on another engine than `engine`, and who
/// can act on it there. `None`: it is on this engine, has no recorded engine, or is unknown.
pub(crate) async fn elsewhere(
    pg: &PgPool,
    id: crate::id::SandboxId,
    engine: &str,
    dead_after: Duration,
) -> Result<Option<Elsewhere>> {
    let row = sqlx::query(
        "SELECT s.instance_id, s.engine,            (SELECT n.id FROM node_instances n WHERE n.engine = s.engine               AND n.stopped_at IS NULL AND n.peer_url IS NOT NULL               AND n.heartbeat_at > now() - make_interval(secs => $3)             ORDER BY (n.id = s.instance_id) DESC, n.heartbeat_at DESC LIMIT 1) AS via          FROM sandboxes s          WHERE s.id = $1 AND s.engine IS NOT NULL AND s.engine <> $2 AND s.state <> 'destroyed'",
    )
    .bind(id.0)
    .bind(engine)
    .bind(dead_after.as_secs_f64())
    .fetch_optional(pg)
    .await
    .map_err(db("finding the engine of a sandbox"))?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some(Elsewhere {
        holder: row
            .try_get("instance_id")
            .map_err(db("reading a sandbox"))?,
        engine: row.try_get("engine").map_err(db("reading a sandbox"))?,
        via: row.try_get("via").map_err(db("reading a sandbox"))?,
    }))
}

/// Whether `instance` drove engine `engine` (or recorded none: it predates engines, or never
/// reached its engine), so that its sandboxes may be adopted here.
pub(crate) async fn drives_engine(pg: &PgPool, instance: Uuid, engine: &str) -> Result<bool> {
    let recorded: Option<Option<String>> =
        sqlx::query_scalar("SELECT engine FROM node_instances WHERE id = $1")
            .bind(instance)
            .fetch_optional(pg)
            .await
            .map_err(db("reading the engine of an instance"))?;
    Ok(match recorded {
        Some(Some(theirs)) => theirs == engine,
        _ => true,
    })
}

/// The engines a sandbox may be created on, in order: this instance's own first, then the
/// engines of other live replicas that take forwarded work, least loaded first (fewest live
/// sandboxes, then least memory reserved). `forwarding`: whether this instance can reach peers
/// at all; without it only its own engine is offered.
pub(crate) async fn targets(
    pg: &PgPool,
    engine: &str,
    dead_after: Duration,
    forwarding: bool,
) -> Result<Vec<Target>> {
    let mut out = vec![Target::Here];
    if !forwarding {
        return Ok(out);
    }
    // One replica per other engine: the one that beat last.
    let rows = sqlx::query(
        "WITH engines AS ( \
           SELECT DISTINCT ON (engine) engine, id FROM node_instances \
           WHERE stopped_at IS NULL AND engine IS NOT NULL AND engine <> $1 \
             AND peer_url IS NOT NULL AND heartbeat_at > now() - make_interval(secs => $2) \
           ORDER BY engine, heartbeat_at DESC) \
         SELECT e.engine, e.id, count(s.id) AS live, \
           COALESCE(sum((s.spec->'limits'->>'memory_bytes')::bigint \
                      + COALESCE((s.spec->'limits'->>'workspace_bytes')::bigint, 0)), 0)::bigint \
             AS reserved \
         FROM engines e LEFT JOIN sandboxes s ON s.engine = e.engine \
           AND s.state IN ('creating', 'running', 'destroying') \
         GROUP BY e.engine, e.id \
         ORDER BY live, reserved, e.engine",
    )
    .bind(engine)
    .bind(dead_after.as_secs_f64())
    .fetch_all(pg)
    .await
    .map_err(db("reading the load of the cluster's engines"))?;
    for row in rows {
        out.push(Target::Peer {
            engine: row.try_get("engine").map_err(db("reading an engine"))?,
            instance: row.try_get("id").map_err(db("reading an engine"))?,
            live: row.try_get("live").map_err(db("reading an engine"))?,
        });
    }
    Ok(out)
}

/// Within the transaction that writes a new sandbox's row: refuses it when engine `engine`
/// has no room left under `limit` for a sandbox reserving `reserving` bytes. Holds the engine's
/// advisory lock until the transaction ends, so the count and the insert are one step.
pub(crate) async fn admit(
    tx: &mut PgConnection,
    engine: &str,
    limit: &EngineLimit,
    reserving: u64,
) -> Result<()> {
    if limit.sandboxes.is_none() && limit.memory_bytes.is_none() {
        return Ok(());
    }
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('aegis-engine:' || $1, 0))")
        .bind(engine)
        .execute(&mut *tx)
        .await
        .map_err(db("locking the engine's placement"))?;
    let (live, reserved): (i64, i64) = sqlx::query_as(
        "SELECT count(*), COALESCE(sum((spec->'limits'->>'memory_bytes')::bigint \
           + COALESCE((spec->'limits'->>'workspace_bytes')::bigint, 0)), 0)::bigint \
         FROM sandboxes WHERE engine = $1 AND state IN ('creating', 'running', 'destroying')",
    )
    .bind(engine)
    .fetch_one(&mut *tx)
    .await
    .map_err(db("counting the engine's live sandboxes"))?;
    let live = u64::try_from(live).unwrap_or(0);
    let reserved = u64::try_from(reserved).unwrap_or(0);
    if let Some(max) = limit.sandboxes {
        if live >= max {
            return Err(DispatchError::NoRoom {
                detail: format!("engine {engine} has {live} live sandbox(es) (limit {max})"),
            });
        }
    }
    if let Some(max) = limit.memory_bytes {
        if reserved.saturating_add(reserving) > max {
            return Err(DispatchError::NoRoom {
                detail: format!(
                    "engine {engine} has {reserved} bytes of memory reserved; {reserving} more \
                     would pass its limit of {max}"
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_reserves_its_memory_and_its_workspace() {
        let limits = Limits {
            memory_bytes: 512,
            nano_cpus: 1,
            pids: 1,
            tmpfs_bytes: 64,
            workspace_bytes: 1024,
        };
        assert_eq!(reserved_bytes(&limits), 1536);
        let huge = Limits {
            memory_bytes: u64::MAX,
            ..limits
        };
        assert_eq!(reserved_bytes(&huge), u64::MAX);
    }
}
