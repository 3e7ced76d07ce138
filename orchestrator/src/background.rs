//! The instance's background tasks, and how a stopping instance ends each of them.
//!
//! A stopping instance goes through these phases, in this order ([`crate::app::Application::run`]):
//!
//! 1. **Servers**: REST, MCP and gRPC stop accepting and drain in-flight requests within
//!    `server.shutdown_grace_secs`; what is left after that is cut. The peer listener
//!    (`cluster.listen`) serves on: its forwarded live processes and watches end here, its
//!    forwarded calls are served until phase 6.
//! 2. **Periodic work** ([`Background::stop_periodic`]): the heartbeat, the session and volume
//!    sweepers, the E2B sweep (timeouts: kills and auto-pauses; expired snapshots) and usage
//!    sampler, the delivery worker and the first listing of the external MCP servers are cut
//!    where they stand. Each writes one statement (an auto-pause: one transaction) at a
//!    time, and what a cut delivery attempt held comes back to a worker when its lease runs out.
//! 3. **Workflow workers** ([`Background::stop_workflows`]): told to stop, then awaited for a
//!    bounded time; a state's commit is one fenced transaction, so a worker cut after that still
//!    leaves its execution for another replica to take over when the lease ends.
//! 4. **Listeners** ([`Background::stop_listeners`]): the audit head anchor and the API-key cache's
//!    notification listener, last, since they only read and log.
//! 5. **Agent executions**: each is stopped and recorded as interrupted (`Engine::stop_all`).
//! 6. **Sandboxes**: destroyed, or left running for the next instance to adopt
//!    (`shutdown.sandboxes`); kept ones only once the calls in flight into them have ended,
//!    new ones being refused as "stopping" (peers then adopt the sandbox and call again).
//! 7. **The stop is recorded** (`node_instances.stopped_at`), the peer listener stops and the
//!    pool is closed.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::state::AppState;

/// How long stopping workflow workers may take before they are left to their leases.
const WORKFLOW_STOP: Duration = Duration::from_secs(10);

/// The tasks an instance runs beside its servers, grouped by how they stop.
pub struct Background {
    /// Cut in phase 2.
    periodic: Vec<JoinHandle<()>>,
    /// Stopped in phase 3, with their own token (they outlive `shutdown` on purpose).
    workflow_stop: CancellationToken,
    workflow_workers: Vec<JoinHandle<()>>,
    /// Cut in phase 4.
    listeners: Vec<JoinHandle<()>>,
}

impl Background {
    /// Starts every background task of the instance; they watch `shutdown` (the workflow
    /// workers a token of their own, so they can be stopped after the servers).
    pub fn spawn(state: &AppState, shutdown: &CancellationToken) -> Self {
        let periodic = vec![
            tokio::spawn(heartbeat(state.clone(), shutdown.clone())),
            tokio::spawn(sweep_sessions(state.clone(), shutdown.clone())),
            tokio::spawn(crate::api::e2b::timeouts::sweep_periodically(
                state.clone(),
                shutdown.clone(),
            )),
            tokio::spawn(crate::api::e2b::control::observe::sample_periodically(
                state.clone(),
                shutdown.clone(),
            )),
            tokio::spawn(sweep_volumes(
                state.pool.clone(),
                Duration::from_secs(state.config.volumes.sweep_interval_secs.max(1)),
                shutdown.clone(),
            )),
            tokio::spawn(
                crate::delivery::DeliveryWorker {
                    pool: state.pool.clone(),
                    config: state.config.delivery.clone(),
                    egress: state.egress.clone(),
                    instance_id: state.instance_id,
                }
                .work(shutdown.clone()),
            ),
            // The external MCP servers listed once; callers never wait for it.
            tokio::spawn({
                let servers = state.mcp_servers.clone();
                async move { servers.discover().await }
            }),
        ];
        let workflow_stop = CancellationToken::new();
        let workflow_workers = crate::workflow::spawn_workers(
            state.workflows.clone(),
            std::sync::Arc::new(state.clone()),
            state.sandboxes.clone(),
            workflow_stop.clone(),
        );
        let listeners = vec![
            tokio::spawn(crate::auth::key_cache::listen(
                state.pool.clone(),
                state.api_keys.clone(),
                shutdown.clone(),
            )),
            tokio::spawn(crate::audit::log_head_periodically(
                state.pool.clone(),
                Duration::from_secs(state.config.audit.anchor_log_interval_secs),
                shutdown.clone(),
            )),
        ];
        Self {
            periodic,
            workflow_stop,
            workflow_workers,
            listeners,
        }
    }

    /// Phase 2: cuts the periodic tasks.
    pub fn stop_periodic(&mut self) {
        for task in self.periodic.drain(..) {
            task.abort();
        }
    }

    /// Phase 3: stops the workflow workers and waits for them, at most [`WORKFLOW_STOP`].
    pub async fn stop_workflows(&mut self) {
        self.workflow_stop.cancel();
        let workers = std::mem::take(&mut self.workflow_workers);
        if tokio::time::timeout(WORKFLOW_STOP, futures_util::future::join_all(workers))
            .await
            .is_err()
        {
            tracing::warn!(
                "workflow workers still busy after {}s; their executions return to the pool when their leases end",
                WORKFLOW_STOP.as_secs()
            );
        }
    }

    /// Phase 4: cuts the listeners.
    pub fn stop_listeners(&mut self) {
        for task in self.listeners.drain(..) {
            task.abort();
        }
    }
}

/// Tells peers this instance is alive (`node_instances.heartbeat_at`), every quarter of the
/// lease, when no dispatcher runs: a running dispatcher renews the heartbeat itself, as the
/// lease on its sandboxes (`dispatcher/lease.rs`), and a second writer could keep an instance
/// looking alive while its dispatcher cannot renew.
async fn heartbeat(state: AppState, shutdown: CancellationToken) {
    if state.sandboxes.dispatcher().is_ok() {
        return;
    }
    let every = (state.config.sandbox.lease() / 4).max(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        if let Err(e) = aegis_store::node_instances::heartbeat(&state.pool, state.instance_id).await
        {
            tracing::warn!(error = %e, "heartbeat not recorded");
        }
    }
}

/// Ends the sandboxes of revoked and expired SEAL sessions, every 30 s.
async fn sweep_sessions(state: AppState, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(30)) => {}
        }
        state.gateway.sweep(&state.gateway_services()).await;
    }
}

/// Deletes expired agent volumes (`volumes::sweep`) and workflow volumes (`workspaces::sweep`)
/// every `volumes.sweep_interval_secs`.
async fn sweep_volumes(
    pool: crate::database::PgPool,
    every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        match crate::volumes::sweep(&pool).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(volumes = n, "expired agent volumes deleted"),
            Err(e) => tracing::warn!(error = %e, "could not sweep expired agent volumes"),
        }
        match crate::workspaces::sweep(&pool).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(rows = n, "expired workflow volumes deleted"),
            Err(e) => tracing::warn!(error = %e, "could not sweep expired workflow volumes"),
        }
    }
}
