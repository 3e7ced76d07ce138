//! The workers of one replica: claim, run, commit, under a lease.
//!
//! A listener task receives NOTIFYs on [`store::CHANNEL`] (run, signal, cancel, child ended) and
//! wakes the workers at once; without one they poll every `poll_interval_ms` (expired leases,
//! Human timeouts). A worker that claims an execution keeps it, state after state, until it
//! waits, ends, or is interrupted; a renewal task extends the lease meanwhile and interrupts the
//! worker when the lease is lost or cancellation is asked for.
//!
//! Per state: if an earlier attempt of this very visit was interrupted (`attempt > 1`), remove
//! what it started; run the state; record its output in `blackboard[STATE]`; take the first
//! transition whose condition matches, within `max_total_transitions` and the target's
//! `max_state_visits`; commit all of it in one transaction fenced by the lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::runtime::Runtime;
use super::states::{self, Cleanup, StateCtx, Step};
use super::store::{self, Commit, NewEvent, VolumeCommit, WorkflowExecution};
use super::{AgentHost, Workflows};
use aegis_manifest::{parse_duration, WorkflowView};
use aegis_sandboxes::Sandboxes;

/// Starts the listener and the workers of this replica; they stop when `shutdown` fires
/// (an execution being run is given back: its lease is released for another replica).
pub fn spawn_workers(
    workflows: Arc<Workflows>,
    host: Arc<dyn AgentHost>,
    sandboxes: Arc<Sandboxes>,
    shutdown: CancellationToken,
) -> Vec<JoinHandle<()>> {
    let settings = workflows.settings.clone();
    let rt = Arc::new(Runtime::new(workflows, host, sandboxes, shutdown));
    let mut tasks = vec![
        tokio::spawn(listen(rt.clone())),
        tokio::spawn(super::schedule::scheduler(
            rt.clone(),
            settings.poll_interval,
        )),
    ];
    for _ in 0..settings.workers.max(1) {
        tasks.push(tokio::spawn(work(rt.clone(), settings.poll_interval)));
    }
    tasks
}

/// Relays NOTIFYs: `cancel:<id>` interrupts that execution if it runs here; everything wakes
/// the idle workers.
async fn listen(rt: Arc<Runtime>) {
    loop {
        let mut listener = match sqlx::postgres::PgListener::connect_with(&rt.pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "workflow listener cannot connect; relying on polling");
                tokio::select! {
                    _ = rt.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(2)) => continue,
                }
            }
        };
        if let Err(e) = listener.listen(store::CHANNEL).await {
            tracing::warn!(error = %e, "workflow listener cannot LISTEN; relying on polling");
        }
        loop {
            let received = tokio::select! {
                _ = rt.shutdown.cancelled() => return,
                n = listener.recv() => n,
            };
            match received {
                Ok(n) => {
                    if let Some(id) = n
                        .payload()
                        .strip_prefix("cancel:")
                        .and_then(|s| Uuid::parse_str(s).ok())
                    {
                        rt.workflows.interrupt(id);
                    }
                    rt.workflows.wake.notify_waiters();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "workflow listener lost its connection; reconnecting");
                    break;
                }
            }
        }
    }
}

async fn work(rt: Arc<Runtime>, poll: Duration) {
    loop {
        let notified = rt.workflows.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if rt.shutdown.is_cancelled() {
            return;
        }
        let sent = std::time::Instant::now();
        match store::claim(&rt.pool, rt.me, rt.lease_ttl_secs).await {
            Ok(Some(row)) => {
                drive(&rt, row, sent).await;
                continue;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "could not claim workflow work"),
        }
        tokio::select! {
            _ = rt.shutdown.cancelled() => return,
            _ = &mut notified => {}
            _ = tokio::time::sleep(poll) => {}
        }
    }
}

/// Runs a claimed execution (its claim sent at `claimed`) until it waits, ends or is
/// interrupted.
async fn drive(rt: &Arc<Runtime>, row: WorkflowExecution, claimed: std::time::Instant) {
    let id = row.id;
    let token = rt.shutdown.child_token();
    let lost = Arc::new(AtomicBool::new(false));
    rt.workflows.track(id, token.clone());
    let renewer = tokio::spawn(renew(
        rt.clone(),
        (id, row.lease_epoch),
        claimed,
        token.clone(),
        lost.clone(),
    ));
    let manifest = match store::manifest(&rt.pool, row.workflow_version_id).await {
        Ok(Some(m)) => m,
        Ok(None) => Value::Null,
        Err(e) => {
            tracing::warn!(execution = %id, error = %e, "could not load a workflow manifest");
            renewer.abort();
            rt.workflows.untrack(id);
            let _ = store::release(&rt.pool, id, (rt.me, row.lease_epoch)).await;
            return;
        }
    };
    let mut run = Run {
        rt,
        row,
        volumes: aegis_manifest::mounts_volumes(&manifest),
        manifest,
        token,
        lost,
    };
    while run.step().await {}
    renewer.abort();
    rt.workflows.untrack(id);
}

/// Renews the lease every third of its length; interrupts the run when the lease is lost or
/// cancellation was asked for, and when no renewal could be recorded for two thirds of the lease
/// (timed from when the last recorded one was sent): the lease expires a third later by the
/// database's clock, and only then may another replica claim the execution, so a worker that
/// cannot reach the database stops before anyone else starts (issue 23, fencing).
async fn renew(
    rt: Arc<Runtime>,
    (id, epoch): (Uuid, i64),
    claimed: std::time::Instant,
    token: CancellationToken,
    lost: Arc<AtomicBool>,
) {
    let ttl = Duration::from_secs(rt.lease_ttl_secs);
    let every = ttl / 3;
    let mut held_since = claimed;
    loop {
        tokio::time::sleep(every).await;
        let sent = std::time::Instant::now();
        let renewed = tokio::time::timeout(
            every,
            store::renew(&rt.pool, id, (rt.me, epoch), rt.lease_ttl_secs),
        )
        .await;
        match renewed {
            Ok(Ok(Some(false))) => held_since = sent,
            Ok(Ok(Some(true))) => {
                held_since = sent;
                token.cancel()
            }
            Ok(Ok(None)) => {
                lost.store(true, Ordering::SeqCst);
                token.cancel();
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(execution = %id, error = %e, "could not renew a workflow lease")
            }
            Err(_) => {
                tracing::warn!(execution = %id, "a workflow lease renewal got no answer in time")
            }
        }
        if held_since.elapsed() >= ttl * 2 / 3 {
            tracing::warn!(execution = %id, "no workflow lease renewal recorded for two thirds of the lease; the worker stops and leaves the execution to the next holder");
            lost.store(true, Ordering::SeqCst);
            token.cancel();
            return;
        }
    }
}

/// What a state that ran to its end hands the commit step.
struct Done {
    output: Value,
    /// Blackboard keys the state wrote itself (besides its output under its name).
    writes: Vec<(String, Value)>,
    /// The template context the state ran in.
    context: Value,
    /// Time the state worked, microseconds (recorded in its `state_exited` event).
    work_us: u64,
}

/// The first transition of `state` whose condition matches; `None` when the state has no
/// transitions (it ends the workflow); an error naming the conditions tried when none matches.
fn choose_transition<'b>(
    state: &str,
    body: &'b Value,
    output: &Value,
    ctx: &Value,
) -> Result<Option<(usize, &'b Value)>, String> {
    let Some(transitions) = body["transitions"].as_array().filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    if let Some(chosen) = transitions
        .iter()
        .enumerate()
        .find(|(_, t)| super::conditions::matches(t, output, ctx))
    {
        return Ok(Some(chosen));
    }
    let tried: Vec<&str> = transitions
        .iter()
        .filter_map(|t| t["condition"].as_str())
        .collect();
    let detail = output
        .get("error")
        .and_then(Value::as_str)
        .map(|e| format!("; the state reported: {e}"))
        .unwrap_or_default();
    Err(format!(
        "no transition of state `{state}` matched its output (conditions tried in order: {}){detail}",
        tried.join(", ")
    ))
}

/// The transition's `feedback` template, rendered with the state's output as `state_output`.
fn render_feedback(
    state: &str,
    index: usize,
    transition: &Value,
    ctx: &Value,
    output: &Value,
) -> Result<Option<String>, String> {
    let Some(template) = transition.get("feedback").and_then(Value::as_str) else {
        return Ok(None);
    };
    let mut fctx = ctx.clone();
    fctx["state_output"] = output.clone();
    aegis_core::render::render(template, &fctx)
        .map(Some)
        .map_err(|e| format!("spec.states.{state}.transitions[{index}].feedback: {e}"))
}

/// The state's `update_blackboard` writes, rendered after it ran (its output and
/// `state_output` in scope). A rendered text that is JSON is stored as that value.
fn blackboard_updates(
    manifest: &Value,
    state: &str,
    ctx: &Value,
    output: &Value,
) -> Result<Vec<(String, Value)>, String> {
    let updates = WorkflowView(manifest).blackboard_updates(state);
    if updates.is_empty() {
        return Ok(Vec::new());
    }
    let mut uctx = ctx.clone();
    uctx["state_output"] = output.clone();
    updates
        .into_iter()
        .map(|(key, template)| {
            let text = aegis_core::render::render(template, &uctx)
                .map_err(|e| format!("spec.states.{state}.update_blackboard.{key}: {e}"))?;
            let value = serde_json::from_str::<Value>(text.trim()).unwrap_or(Value::String(text));
            Ok((key.to_owned(), value))
        })
        .collect()
}

/// One claimed execution being advanced.
struct Run<'a> {
    rt: &'a Arc<Runtime>,
    row: WorkflowExecution,
    manifest: Value,
    /// Some state mounts the run's volumes: commits promote and end them (`workspaces`).
    volumes: bool,
    token: CancellationToken,
    lost: Arc<AtomicBool>,
}

/// How a state's run ended.
enum Ran {
    Step(Step),
    Interrupted,
    StateTimeout(Duration),
    ExecutionTimeout,
}

impl Run<'_> {
    fn visit(&self, state: &str) -> i32 {
        self.row.visits[state].as_i64().unwrap_or(1) as i32
    }

    fn context(&self, state: &str, visit: i32) -> Value {
        let mut ctx = self.row.blackboard.clone();
        if let Some(map) = ctx.as_object_mut() {
            map.insert(
                "state".into(),
                json!({"name": state, "visit": visit, "feedback": self.row.state_feedback}),
            );
            map.insert("execution".into(), json!({"id": self.row.id}));
            map.insert("blackboard".into(), self.row.blackboard.clone());
        }
        ctx
    }

    /// Advances one state; false when this worker is done with the execution.
    async fn step(&mut self) -> bool {
        let state = self.row.current_state.clone();
        let view = WorkflowView(&self.manifest);
        let Some(body) = view.state(&state).cloned() else {
            return self
                .fail(
                    format!(
                        "state `{state}` is not in workflow {} {} (was the version replaced?)",
                        self.row.workflow_name, self.row.workflow_version
                    ),
                    Vec::new(),
                )
                .await;
        };
        let visit = self.visit(&state);
        if self.row.cancel_requested || (self.token.is_cancelled() && self.interrupt_is_cancel()) {
            return self.cancelled(&state, visit, &body).await;
        }
        if self.token.is_cancelled() {
            return self.give_up().await;
        }
        if Utc::now() >= self.row.deadline {
            return self.execution_timeout(&state, visit, &body).await;
        }
        let resumed = self.row.waiting_for.is_some();
        if !resumed && self.row.attempt > 1 {
            let removed = states::cleanup(
                self.rt,
                &self.row,
                &state,
                visit,
                Some(&body),
                Cleanup::Retry,
            )
            .await;
            self.event(NewEvent::state(
                "state_retried",
                &state,
                json!({"visit": visit, "attempt": self.row.attempt, "removed": removed}),
            ))
            .await;
        }
        let context = self.context(&state, visit);
        let (ran, work_us) = self.run_state(&state, visit, &body, &context).await;
        self.settle(ran, &state, visit, &body, context, work_us)
            .await
    }

    /// Running the state's work, the one step that can be interrupted: under its own `timeout`
    /// and the execution's deadline, whichever is nearer. Also gives the time it took, µs.
    async fn run_state(
        &self,
        state: &str,
        visit: i32,
        body: &Value,
        context: &Value,
    ) -> (Ran, u64) {
        let timeout = body.get("timeout").and_then(parse_duration);
        let kind = body["kind"].as_str().unwrap_or_default().to_owned();
        // Human and Subworkflow states enforce their own timeout while waiting.
        let run_budget = match kind.as_str() {
            "Human" | "Subworkflow" => None,
            _ => timeout,
        };
        let remaining = (self.row.deadline - Utc::now())
            .to_std()
            .unwrap_or(Duration::ZERO);
        let work_started = Instant::now();
        let ran = {
            let ctx = StateCtx {
                rt: self.rt,
                exec: &self.row,
                manifest: &self.manifest,
                name: state,
                visit,
                body,
                context,
                token: &self.token,
                timeout,
            };
            let budget = run_budget.map_or(remaining, |t| t.min(remaining));
            tokio::select! {
                _ = self.token.cancelled() => Ran::Interrupted,
                r = tokio::time::timeout(budget, states::run(&ctx)) => match r {
                    Ok(step) => Ran::Step(step),
                    Err(_) if run_budget.is_some_and(|t| t <= remaining) => Ran::StateTimeout(run_budget.unwrap_or(budget)),
                    Err(_) => Ran::ExecutionTimeout,
                },
            }
        };
        // A state whose work ended as its worker was interrupted (it saw the cancel itself and
        // returned, or both were ready in the same poll) is interrupted: an accepted cancel
        // ends the run cancelled, never with the state's late result, and a lost lease or a
        // shutdown records nothing for the next holder to contradict.
        let ran = match ran {
            Ran::Step(_) if self.token.is_cancelled() => Ran::Interrupted,
            other => other,
        };
        (ran, work_started.elapsed().as_micros() as u64)
    }

    /// What the state's work came to, applied: cancel or give up, fail (after its cleanup),
    /// park, or complete the state with its output.
    async fn settle(
        &mut self,
        ran: Ran,
        state: &str,
        visit: i32,
        body: &Value,
        context: Value,
        work_us: u64,
    ) -> bool {
        let rt = self.rt;
        match ran {
            Ran::Interrupted => {
                if self.interrupt_is_cancel() {
                    self.cancelled(state, visit, body).await
                } else {
                    self.give_up().await
                }
            }
            Ran::ExecutionTimeout => self.execution_timeout(state, visit, body).await,
            Ran::StateTimeout(after) => {
                states::cleanup(rt, &self.row, state, visit, Some(body), Cleanup::End).await;
                self.fail(
                    format!(
                        "state `{state}` timed out after {} s (its `timeout`)",
                        after.as_secs()
                    ),
                    Vec::new(),
                )
                .await
            }
            Ran::Step(Step::Fail(reason)) => {
                states::cleanup(rt, &self.row, state, visit, Some(body), Cleanup::End).await;
                self.fail(reason, Vec::new()).await
            }
            Ran::Step(Step::Wait {
                waiting_for,
                wake_at,
                events,
            }) => self.park(state, waiting_for, wake_at, events).await,
            Ran::Step(Step::Output(output, writes)) => {
                let done = Done {
                    output,
                    writes,
                    context,
                    work_us,
                };
                self.completed_state(state, visit, body, done).await
            }
        }
    }

    /// True when the interruption is a cancel request (not a lost lease or a shutdown).
    fn interrupt_is_cancel(&self) -> bool {
        !self.lost.load(Ordering::SeqCst) && !self.rt.shutdown.is_cancelled()
    }

    async fn event(&self, e: NewEvent) {
        let lease = (self.rt.me, self.row.lease_epoch);
        store::record(&self.rt.pool, self.row.id, lease, &e).await;
    }

    /// Lease lost or shutting down: leave everything to the next holder (it cleans up).
    async fn give_up(&self) -> bool {
        if !self.lost.load(Ordering::SeqCst) {
            if let Err(e) = store::release(
                &self.rt.pool,
                self.row.id,
                (self.rt.me, self.row.lease_epoch),
            )
            .await
            {
                tracing::warn!(execution = %self.row.id, error = %e, "could not release a workflow lease");
            }
        }
        false
    }

    /// A state produced its output: the commit step, in named parts. [`Self::record_output`]
    /// puts the output and its `update_blackboard` writes on the blackboard; [`choose_transition`]
    /// takes the first transition whose condition matches (none at all: the workflow is done);
    /// [`Self::within_limits`] checks `max_total_transitions` and the target's `max_state_visits`;
    /// [`render_feedback`] renders the transition's feedback; [`Self::commit_transition`] commits
    /// all of it, with the events, in one transaction fenced by the lease. A refusal at any
    /// part fails the execution with the events gathered so far.
    async fn completed_state(&mut self, state: &str, visit: i32, body: &Value, done: Done) -> bool {
        let mut events = vec![NewEvent::state(
            "state_exited",
            state,
            json!({"visit": visit, "status": done.output.get("status"), "output_digest": aegis_store::audit::digest(&done.output),
                   "work_us": done.work_us}),
        )];
        let ctx = match self.record_output(state, visit, &done, &mut events) {
            Ok(ctx) => ctx,
            Err(reason) => return self.fail(reason, events).await,
        };
        let output = done.output;
        let (index, transition) = match choose_transition(state, body, &output, &ctx) {
            Ok(Some(chosen)) => chosen,
            Ok(None) => return self.finish_completed(state, output, events).await,
            Err(reason) => return self.fail(reason, events).await,
        };
        // `target: ~` (AEGIS): taking this transition ends the run here, completed.
        if transition["target"].is_null() {
            events.push(NewEvent::state(
                "transition_taken",
                state,
                json!({"from": state, "to": null, "condition": transition["condition"], "index": index}),
            ));
            return self.finish_completed(state, output, events).await;
        }
        let target = transition["target"].as_str().unwrap_or_default().to_owned();
        let next_visit = match self.within_limits(state, &target) {
            Ok(next_visit) => next_visit,
            Err(reason) => return self.fail(reason, events).await,
        };
        let feedback = match render_feedback(state, index, transition, &ctx, &output) {
            Ok(feedback) => feedback,
            Err(reason) => return self.fail(reason, events).await,
        };
        events.push(NewEvent::state(
            "transition_taken",
            state,
            json!({"from": state, "to": target, "condition": transition["condition"], "index": index, "feedback": feedback}),
        ));
        events.push(NewEvent::state(
            "state_entered",
            &target,
            json!({"visit": next_visit, "from": state}),
        ));
        self.commit_transition(target, next_visit, feedback, events)
            .await
    }

    /// The state's output (under its name) and its own writes go on the blackboard, then the
    /// manifest's `update_blackboard` templates are rendered against that; returns the context
    /// the transitions are chosen in. The blackboard is kept even when rendering fails, so the
    /// failed execution shows what the state produced.
    fn record_output(
        &mut self,
        state: &str,
        visit: i32,
        done: &Done,
        events: &mut Vec<NewEvent>,
    ) -> Result<Value, String> {
        let mut blackboard = self.row.blackboard.clone();
        let mut ctx = done.context.clone();
        for target in [&mut blackboard, &mut ctx] {
            if let Some(map) = target.as_object_mut() {
                map.insert(state.to_owned(), done.output.clone());
                for (k, v) in &done.writes {
                    map.insert(k.clone(), v.clone());
                }
            }
        }
        let updates = blackboard_updates(&self.manifest, state, &ctx, &done.output);
        let updates = match updates {
            Ok(updates) => updates,
            Err(reason) => {
                self.row.blackboard = blackboard;
                return Err(reason);
            }
        };
        if !updates.is_empty() {
            let keys: Vec<&String> = updates.iter().map(|(k, _)| k).collect();
            events.push(NewEvent::state(
                "blackboard_updated",
                state,
                json!({"visit": visit, "keys": keys}),
            ));
            if let (Some(map), Some(cmap)) = (blackboard.as_object_mut(), ctx.as_object_mut()) {
                for (k, v) in updates {
                    cmap.insert(k.clone(), v.clone());
                    map.insert(k, v);
                }
            }
            if let Some(map) = ctx.as_object_mut() {
                map.insert("blackboard".into(), blackboard.clone());
            }
        }
        self.row.blackboard = blackboard;
        Ok(ctx)
    }

    /// Entering `target` stays within `max_total_transitions` (at most 100) and the target's
    /// `max_state_visits` (default 5, at most 20); returns the visit it would be.
    fn within_limits(&self, state: &str, target: &str) -> Result<i32, String> {
        let view = WorkflowView(&self.manifest);
        let max_total = view.max_total_transitions().min(100) as i32;
        if self.row.transition_count + 1 > max_total {
            return Err(format!(
                "max_total_transitions ({max_total}) reached: state `{state}` could not go on to `{target}`"
            ));
        }
        let max_visits = view
            .state(target)
            .and_then(|s| s.get("max_state_visits"))
            .and_then(Value::as_i64)
            .unwrap_or(5)
            .min(20) as i32;
        let next_visit = self.visit_count(target) + 1;
        if next_visit > max_visits {
            return Err(format!(
                "max_state_visits ({max_visits}) of state `{target}` reached: entering it from `{state}` would be visit {next_visit}"
            ));
        }
        Ok(next_visit)
    }

    /// Commits the move to `target` (fenced by the lease); true when this worker goes on with it.
    async fn commit_transition(
        &mut self,
        target: String,
        next_visit: i32,
        feedback: Option<String>,
        events: Vec<NewEvent>,
    ) -> bool {
        let mut visits = self.row.visits.clone();
        visits[target.as_str()] = json!(next_visit);
        // The state being left: its volume drafts become the run's volumes with this commit.
        let left = self.row.current_state.clone();
        let left_visit = self.visit(&left);
        let committed = store::commit(
            &self.rt.pool,
            &Commit {
                current_state: &target,
                visits: &visits,
                transition_count: self.row.transition_count + 1,
                entered: true,
                feedback: feedback.as_deref(),
                volumes: self.volumes.then_some(VolumeCommit {
                    promote: Some((left.as_str(), left_visit, self.row.attempt)),
                }),
                ..self.held_commit("running", events)
            },
        )
        .await;
        match committed {
            Ok(true) => {
                self.row.current_state = target;
                self.row.visits = visits;
                self.row.transition_count += 1;
                self.row.state_feedback = feedback;
                self.row.attempt = 1;
                self.row.waiting_for = None;
                self.row.signal = None;
                self.row.state_entered_at = Utc::now();
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!(execution = %self.row.id, error = %e, "could not commit a workflow state");
                self.give_up().await
            }
        }
    }

    /// A commit of this execution by its lease holder that leaves the row as it stands (no
    /// transition, wait or end; the lease kept) and records `events`: each of the worker's
    /// commits (a transition, a park, the end) states only what it changes.
    fn held_commit<'a>(&'a self, status: &'a str, events: Vec<NewEvent>) -> Commit<'a> {
        Commit {
            id: self.row.id,
            me: self.rt.me,
            epoch: self.row.lease_epoch,
            status,
            current_state: &self.row.current_state,
            visits: &self.row.visits,
            transition_count: self.row.transition_count,
            blackboard: &self.row.blackboard,
            entered: false,
            feedback: None,
            waiting_for: None,
            wake_at: None,
            final_output: None,
            error: None,
            release: false,
            ttl_secs: self.rt.lease_ttl_secs,
            events,
            wake_parent: None,
            volumes: None,
        }
    }

    fn visit_count(&self, state: &str) -> i32 {
        self.row.visits[state].as_i64().unwrap_or(0) as i32
    }

    /// Parks the execution (no lease held) until an answer, a child's end or `wake_at`.
    async fn park(
        &mut self,
        state: &str,
        waiting_for: &'static str,
        wake_at: Option<DateTime<Utc>>,
        events: Vec<NewEvent>,
    ) -> bool {
        // A parked execution holds no sandbox.
        states::destroy_system_sandbox(self.rt, self.row.id).await;
        let wake_at = Some(wake_at.map_or(self.row.deadline, |w| w.min(self.row.deadline)));
        let committed = store::commit(
            &self.rt.pool,
            &Commit {
                current_state: state,
                waiting_for: Some(waiting_for),
                wake_at,
                release: true,
                ..self.held_commit("waiting", events)
            },
        )
        .await;
        if let Err(e) = committed {
            tracing::warn!(execution = %self.row.id, error = %e, "could not park a workflow execution");
            return self.give_up().await;
        }
        if waiting_for == "subworkflow" {
            // The child may have ended before the parent was parked: then nobody would wake it.
            let visit = self.visit(state);
            if let Ok(Some(child)) = store::child_of(&self.rt.pool, self.row.id, state, visit).await
            {
                if store::is_terminal(&child.status) {
                    let _ = sqlx::query(
                        "UPDATE workflow_executions SET wake_at = now() WHERE id = $1 AND status = 'waiting'",
                    )
                    .bind(self.row.id)
                    .execute(&self.rt.pool)
                    .await;
                    self.rt.wake();
                }
            }
        }
        false
    }

    async fn cancelled(&mut self, state: &str, visit: i32, body: &Value) -> bool {
        let removed =
            states::cleanup(self.rt, &self.row, state, visit, Some(body), Cleanup::End).await;
        let events = vec![NewEvent::state(
            "execution_cancelled",
            state,
            json!({"by": "request", "removed": removed, "final_blackboard": self.row.blackboard}),
        )];
        self.end(
            "cancelled",
            Some("cancelled".to_owned()),
            None,
            events,
            false,
        )
        .await
    }

    async fn execution_timeout(&mut self, state: &str, visit: i32, body: &Value) -> bool {
        states::cleanup(self.rt, &self.row, state, visit, Some(body), Cleanup::End).await;
        let reason = format!(
            "execution timeout (workflows.max_execution_secs = {} s) reached in state `{state}`",
            self.rt.max_execution_secs
        );
        let events = vec![NewEvent::state(
            "execution_timed_out",
            state,
            json!({"reason": reason, "final_blackboard": self.row.blackboard}),
        )];
        self.end("timed_out", Some(reason), None, events, false)
            .await
    }

    async fn fail(&mut self, reason: String, mut events: Vec<NewEvent>) -> bool {
        events.push(NewEvent::state(
            "execution_failed",
            &self.row.current_state,
            json!({"reason": reason, "final_blackboard": self.row.blackboard}),
        ));
        self.end("failed", Some(reason), None, events, false).await
    }

    async fn finish_completed(
        &mut self,
        state: &str,
        output: Value,
        mut events: Vec<NewEvent>,
    ) -> bool {
        let template = self.manifest.pointer("/metadata/output_template").cloned();
        let final_output = match template.as_ref().and_then(Value::as_object) {
            None => output,
            Some(fields) => {
                let ctx = self.context(state, self.visit(state));
                let mut out = serde_json::Map::new();
                for (k, t) in fields {
                    match aegis_core::render::render(t.as_str().unwrap_or_default(), &ctx) {
                        Ok(s) => {
                            out.insert(k.clone(), Value::String(s));
                        }
                        Err(e) => {
                            return self
                                .fail(format!("metadata.output_template.{k}: {e}"), events)
                                .await
                        }
                    }
                }
                Value::Object(out)
            }
        };
        // The output contract: a run whose final output breaks `metadata.output_schema` has not
        // done what the workflow promises, so it fails (the output it made is in the event).
        if let Some(schema) = WorkflowView(&self.manifest).output_schema() {
            if let Err(e) = super::contract::check_output(schema, &final_output) {
                events.push(NewEvent::state(
                    "output_rejected",
                    state,
                    json!({"reason": e.to_string(), "final_output": final_output}),
                ));
                return self.fail(e.to_string(), events).await;
            }
        }
        events.push(NewEvent::state(
            "execution_completed",
            state,
            json!({"final_output": final_output, "final_blackboard": self.row.blackboard}),
        ));
        self.end("completed", None, Some(final_output), events, true)
            .await
    }

    /// Ends the execution: destroys its System sandbox, commits the end (the last state's
    /// volume drafts count when `promote`, and the run's volumes end with it), wakes a parent.
    async fn end(
        &mut self,
        status: &str,
        error: Option<String>,
        final_output: Option<Value>,
        events: Vec<NewEvent>,
        promote: bool,
    ) -> bool {
        states::destroy_system_sandbox(self.rt, self.row.id).await;
        let last = self.row.current_state.clone();
        let visit = self.visit(&last);
        let committed = store::commit(
            &self.rt.pool,
            &Commit {
                final_output: final_output.as_ref(),
                error: error.as_deref(),
                release: true,
                wake_parent: self.row.parent_execution_id,
                volumes: self.volumes.then_some(VolumeCommit {
                    promote: promote.then_some((last.as_str(), visit, self.row.attempt)),
                }),
                ..self.held_commit(status, events)
            },
        )
        .await;
        if let Err(e) = committed {
            tracing::warn!(execution = %self.row.id, error = %e, "could not record the end of a workflow execution");
            return self.give_up().await;
        }
        false
    }
}
