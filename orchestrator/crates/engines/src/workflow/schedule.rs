//! `spec.default_schedule`: workflows that start themselves on a cron schedule.
//!
//! Every replica runs one scheduler task. Each pass it reads the live workflows whose latest
//! version has a schedule, and for each run that fell due since its previous pass it INSERTs
//! the row `(workflow, tick)` into `workflow_schedule_ticks`. The primary key lets one INSERT
//! win across the cluster, and only the winner starts the run (as the workflow's owner tenant,
//! caller kind `schedule`), then records the execution id, or why it could not start, on the
//! row. Ticks are exact cron instants (read in the schedule's IANA time zone), so replicas whose
//! passes interleave still name the same tick. A run is due at its tick plus the tick's jitter,
//! a delay of 0 to `jitter_seconds` derived from the workflow's id and the tick alone
//! (`Plan::delay`): every replica computes the same delay, so the jitter is decided once per
//! tick cluster-wide without storing it. A replica starts counting at its own start: ticks
//! missed while no replica ran are not caught up, and after a stall only the latest missed tick
//! runs.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::runtime::Runtime;
use super::start::{self, RunRequest, Starter};
use aegis_manifest::WorkflowView;
use aegis_store::registry::{self, ScheduledWorkflow};

/// Shortest sleep between passes (a schedule with a seconds field ticks every second).
const MIN_SLEEP: Duration = Duration::from_millis(10);

/// The scheduler of this replica; returns when the runtime shuts down.
pub(super) async fn scheduler(rt: Arc<Runtime>, poll: Duration) {
    let mut since = Utc::now();
    loop {
        let now = Utc::now();
        let mut next: Option<DateTime<Utc>> = None;
        match registry::scheduled_workflows(&rt.pool).await {
            Ok(workflows) => {
                for w in &workflows {
                    let Some(schedule) = WorkflowView(&w.manifest).default_schedule() else {
                        continue;
                    };
                    if !schedule.enabled {
                        continue;
                    }
                    let plan = match schedule.plan() {
                        Ok(plan) => plan,
                        Err(e) => {
                            // Validation refuses such manifests; one stored earlier is skipped.
                            tracing::warn!(workflow = %w.name, error = %e, "unusable default_schedule");
                            continue;
                        }
                    };
                    let seed = w.definition_id.to_string();
                    if let Some(due) = plan.due(&seed, since, now) {
                        fire(&rt, w, due.tick, schedule.input.clone()).await;
                    }
                    if let Some(upcoming) = plan.next(&seed, now) {
                        next = Some(next.map_or(upcoming.fire_at, |n| n.min(upcoming.fire_at)));
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not read scheduled workflows"),
        }
        since = now;
        // Wake for the next tick, but look again at least every poll period: a workflow
        // deployed meanwhile may tick sooner.
        let sleep = next
            .and_then(|n| (n - Utc::now()).to_std().ok())
            .unwrap_or(poll)
            .clamp(MIN_SLEEP, poll.max(MIN_SLEEP));
        tokio::select! {
            _ = rt.shutdown.cancelled() => return,
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

/// Claims the tick for this replica; the winner starts the run and records the outcome.
async fn fire(rt: &Runtime, w: &ScheduledWorkflow, tick: DateTime<Utc>, input: serde_json::Value) {
    let claimed = sqlx::query(
        "INSERT INTO workflow_schedule_ticks (definition_id, tick, tenant_id, instance_id) \
         VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
    )
    .bind(w.definition_id)
    .bind(tick)
    .bind(&w.tenant)
    .bind(rt.me)
    .execute(&rt.pool)
    .await;
    match claimed {
        Ok(r) if r.rows_affected() == 1 => {}
        Ok(_) => return, // another replica has this tick
        Err(e) => {
            tracing::warn!(workflow = %w.name, %tick, error = %e, "could not claim a schedule tick");
            return;
        }
    }
    let settings = &rt.workflows.settings;
    let caller_id = format!("schedule:{}", w.name);
    let started = start::start(
        &rt.pool,
        &Starter {
            tenant: &w.tenant,
            caller_kind: "schedule",
            caller_id: &caller_id,
            ceiling: None,
            allow_network_modes: &settings.allow_network_modes,
            max_execution_secs: settings.max_execution_secs,
            volume_max_mb: settings.volume_max_mb,
        },
        RunRequest {
            name: w.name.clone(),
            version: Some(w.version.clone()),
            input,
            blackboard: None,
            intent: None,
        },
        None,
    )
    .await;
    let (execution, error): (Option<Uuid>, Option<String>) = match started {
        Ok(id) => {
            rt.wake();
            (Some(id), None)
        }
        Err(e) => {
            tracing::warn!(workflow = %w.name, %tick, error = %e, "a scheduled run could not start");
            (None, Some(e.to_string()))
        }
    };
    if let Err(e) = sqlx::query(
        "UPDATE workflow_schedule_ticks SET execution_id = $3, error = $4 \
         WHERE definition_id = $1 AND tick = $2",
    )
    .bind(w.definition_id)
    .bind(tick)
    .bind(execution)
    .bind(error)
    .execute(&rt.pool)
    .await
    {
        tracing::warn!(workflow = %w.name, %tick, error = %e, "could not record a schedule tick's run");
    }
}
