//! What a sandbox uses and what happened to it, on E2B's control API:
//!
//! - `GET /sandboxes/{id}/metrics`: samples of the sandbox container's cgroup
//!   (`Dispatcher::usage`: CPU over about a second, memory without page cache, and as disk the
//!   bytes in its workspace and `/tmp`, which are tmpfs): as E2B, a series, one every 5 s
//!   ([`sample`], by the replica holding the sandbox, in `e2b_sandbox_metrics`, kept an hour),
//!   the ones in the asked range; and when the range reaches the present, one taken now.
//! - `GET /v2/sandboxes/{id}/logs` (and the deprecated v1 `GET /sandboxes/{id}/logs`, the same
//!   lines as text and entries): the sandbox's lifecycle as the node saw it (created from a
//!   snapshot, paused, resumed, snapshot taken, forked), from `e2b_sandbox_logs`. Commands'
//!   output is not logged: audit rows name no sandbox, and the executor's stderr is not kept.

use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use dispatcher::SandboxId;

use aegis_e2b::api::{
    ApiError, LogLevel, LogsDirection, LogsQuery, LogsV1Query, MetricsQuery, SandboxLog,
    SandboxLogEntry, SandboxLogs, SandboxLogsV2Response, SandboxMetric,
};

use super::{db, known, not_found, to_json, Key};
use crate::store;
use crate::Refusal;
use aegis_core::caller::Caller;
use aegis_store::e2b::metrics as samples;
use aegis_tools::state::AppState;
use aegis_tools::tools::control::{self, ControlError};
use tokio_util::sync::CancellationToken;

type Answer = Result<axum::response::Response, Refusal>;

/// Seconds a range may end before now and still get the present sample (the SDK asks with
/// whole seconds, from a clock that may lag the node's).
const SLACK_SECS: i64 = 10;

/// How often the holder of a running E2B sandbox samples its usage (E2B's bucket).
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How long samples are kept.
const KEPT_SECS: f64 = 3600.0;
/// Most sandboxes sampled at once.
const SAMPLED_AT_ONCE: usize = 16;

/// `GET /sandboxes/{id}/metrics`: the kept samples in the range, and a sample taken now when
/// the range reaches the present (so a sandbox just made has one).
pub async fn metrics(
    State(state): State<AppState>,
    Key(caller): Key,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Answer {
    let q = MetricsQuery::parse(query.as_deref().unwrap_or("")).map_err(Refusal)?;
    let row = known(&state, &caller, &id).await?;
    let now = Utc::now();
    let in_range = q.end.is_none_or(|e| now.timestamp() <= e + SLACK_SECS)
        && q.start.is_none_or(|s| now.timestamp() + SLACK_SECS >= s);
    let mut samples = kept(&state, row.sandbox_id, q.start, q.end).await?;
    if row.paused_snapshot.is_some() || !in_range {
        return Ok(to_json(StatusCode::OK, &samples));
    }
    let usage = control::usage(&state, &caller, SandboxId(row.current))
        .await
        .map_err(|e| match e {
            ControlError::Unknown(_) | ControlError::Refused(_) => not_found(&id),
            other => Refusal(ApiError::new(503, other.to_string())),
        })?;
    samples.push(metric(now, &usage));
    Ok(to_json(StatusCode::OK, &samples))
}

/// Most sandboxes one `GET /sandboxes/metrics` names (E2B's `maxItems`).
const MAX_METRICS_IDS: usize = 100;

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: the latest sample of each named sandbox the key
/// has running (`{"sandboxes": {id: metric}}`): the one its holder kept within the last
/// bucket, else one taken now; ids the key has no running sandbox under are left out, as E2B
/// answers only running sandboxes.
pub async fn metrics_of_many(
    State(state): State<AppState>,
    Key(caller): Key,
    RawQuery(query): RawQuery,
) -> Answer {
    use futures_util::StreamExt;
    let mut ids: Vec<String> = Vec::new();
    for (name, value) in url::form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()) {
        match name.as_ref() {
            "sandbox_ids" => ids.extend(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .map(str::to_owned),
            ),
            other => {
                return Err(Refusal(ApiError::bad_request(format!(
                    "unknown query parameter `{other}`: only `sandbox_ids` is taken"
                ))))
            }
        }
    }
    ids.sort();
    ids.dedup();
    if ids.is_empty() {
        return Err(Refusal(ApiError::bad_request(
            "sandbox_ids: name at least one sandbox (comma-separated)",
        )));
    }
    if ids.len() > MAX_METRICS_IDS {
        return Err(Refusal(ApiError::bad_request(format!(
            "sandbox_ids: {} sandboxes named; at most {MAX_METRICS_IDS} are taken at once",
            ids.len()
        ))));
    }
    let mut rows = Vec::new();
    for id in &ids {
        match super::running(&state, &caller, id).await {
            Ok(row) if super::state_of(&row) == aegis_e2b::api::SandboxState::Running => {
                rows.push(row)
            }
            Ok(_) | Err(Refusal(ApiError { code: 404, .. })) => {}
            Err(e) => return Err(e),
        }
    }
    let now = Utc::now();
    let since = now.timestamp() - SAMPLE_EVERY.as_secs() as i64 * 2;
    let mut out = serde_json::Map::new();
    let mut missing = Vec::new();
    for row in rows {
        match kept(&state, row.sandbox_id, Some(since), None).await?.pop() {
            Some(latest) => {
                out.insert(row.sandbox_id.to_string(), serde_json::json!(latest));
            }
            None => missing.push(row),
        }
    }
    let (state, caller) = (&state, &caller);
    let taken: Vec<(String, dispatcher::Usage)> = futures_util::stream::iter(missing)
        .map(|row| async move {
            control::usage(state, caller, SandboxId(row.current))
                .await
                .ok()
                .map(|u| (row.sandbox_id.to_string(), u))
        })
        .buffer_unordered(SAMPLED_AT_ONCE)
        .filter_map(std::future::ready)
        .collect()
        .await;
    for (id, usage) in taken {
        out.insert(id, serde_json::json!(metric(now, &usage)));
    }
    Ok(to_json(
        StatusCode::OK,
        &serde_json::json!({ "sandboxes": out }),
    ))
}

fn metric(at: DateTime<Utc>, usage: &dispatcher::Usage) -> SandboxMetric {
    SandboxMetric {
        timestamp: at,
        timestamp_unix: at.timestamp(),
        cpu_count: usage.cpu_count,
        cpu_used_pct: usage.cpu_used_pct,
        mem_used: usage.mem_used,
        mem_total: usage.mem_total,
        mem_cache: usage.mem_cache,
        disk_used: usage.disk_used,
        disk_total: usage.disk_total,
    }
}

/// The kept samples of sandbox `id` from `start` to `end` (seconds since the epoch), oldest
/// first.
async fn kept(
    state: &AppState,
    id: uuid::Uuid,
    start: Option<i64>,
    end: Option<i64>,
) -> Result<Vec<SandboxMetric>, Refusal> {
    let at = |secs: Option<i64>| secs.and_then(|s| DateTime::<Utc>::from_timestamp(s, 0));
    let rows = samples::kept(&state.pool, id, at(start), at(end))
        .await
        .map_err(db)?;
    let unsigned = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(rows
        .into_iter()
        .map(|k| {
            let f = &k.figures;
            SandboxMetric {
                timestamp: k.at,
                timestamp_unix: k.at.timestamp(),
                cpu_count: u32::try_from(f.cpu_count).unwrap_or(0),
                cpu_used_pct: f.cpu_used_pct as f32,
                mem_used: unsigned(f.mem_used),
                mem_total: unsigned(f.mem_total),
                mem_cache: unsigned(f.mem_cache),
                disk_used: unsigned(f.disk_used),
                disk_total: unsigned(f.disk_total),
            }
        })
        .collect())
}

/// Samples the usage of every running E2B sandbox this instance holds (at most
/// [`SAMPLED_AT_ONCE`] at a time), each stored under its 5 s bucket (a second sample in the
/// same bucket is dropped), and forgets samples older than an hour. Returns how many were
/// stored.
pub async fn sample(state: &AppState) -> Result<usize, sqlx::Error> {
    use futures_util::StreamExt;
    let held = samples::held_by(&state.pool, state.instance_id).await?;
    let system = Caller::system();
    let system = &system;
    let taken: Vec<(uuid::Uuid, dispatcher::Usage)> = futures_util::stream::iter(held)
        .map(|(e2b_id, current)| async move {
            control::usage(state, system, SandboxId(current))
                .await
                .ok()
                .map(|u| (e2b_id, u))
        })
        .buffer_unordered(SAMPLED_AT_ONCE)
        .filter_map(std::future::ready)
        .collect()
        .await;
    let mut stored = 0;
    for (e2b_id, u) in &taken {
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let sample = samples::Figures {
            cpu_count: i32::try_from(u.cpu_count).unwrap_or(i32::MAX),
            cpu_used_pct: f64::from(u.cpu_used_pct),
            mem_used: clamp(u.mem_used),
            mem_total: clamp(u.mem_total),
            mem_cache: clamp(u.mem_cache),
            disk_used: clamp(u.disk_used),
            disk_total: clamp(u.disk_total),
        };
        if samples::insert(&state.pool, *e2b_id, &sample).await? {
            stored += 1;
        }
    }
    samples::forget_older_than(&state.pool, KEPT_SECS).await?;
    Ok(stored)
}

/// Runs [`sample`] every [`SAMPLE_EVERY`] until `shutdown`.
pub async fn sample_periodically(state: AppState, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(SAMPLE_EVERY) => {}
        }
        if let Err(e) = sample(&state).await {
            tracing::warn!(error = %e, "could not sample the usage of E2B sandboxes");
        }
    }
}

/// `GET /v2/sandboxes/{id}/logs`.
pub async fn logs(
    State(state): State<AppState>,
    Key(caller): Key,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Answer {
    let q = LogsQuery::parse(query.as_deref().unwrap_or("")).map_err(Refusal)?;
    let uuid = known(&state, &caller, &id).await?.sandbox_id;
    let from: Option<DateTime<Utc>> = q.cursor.and_then(DateTime::<Utc>::from_timestamp_millis);
    let backward = q.direction == LogsDirection::Backward;
    // Level and search are applied after reading, so read a bounded surplus.
    let lines = store::logs(&state.pool, uuid, from, backward, 10_000)
        .await
        .map_err(db)?;
    let logs: Vec<SandboxLogEntry> = lines
        .into_iter()
        .filter_map(|l| {
            let level = LogLevel::parse(&l.level)?;
            let wanted = q.level.is_none_or(|min| level >= min)
                && q.search
                    .as_ref()
                    .is_none_or(|s| l.message.contains(s.as_str()));
            wanted.then_some(SandboxLogEntry {
                timestamp: l.at,
                message: l.message,
                level,
                fields: l.fields.0,
            })
        })
        .take(q.limit as usize)
        .collect();
    Ok(to_json(StatusCode::OK, &SandboxLogsV2Response { logs }))
}

/// `GET /sandboxes/{id}/logs` (v1, which E2B deprecates for v2): the same lines, oldest first
/// from `start`, each also as text (`message key=value ...`).
pub async fn logs_v1(
    State(state): State<AppState>,
    Key(caller): Key,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Answer {
    let q = LogsV1Query::parse(query.as_deref().unwrap_or("")).map_err(Refusal)?;
    let uuid = known(&state, &caller, &id).await?.sandbox_id;
    let from: Option<DateTime<Utc>> = q.start.and_then(DateTime::<Utc>::from_timestamp_millis);
    let lines = store::logs(&state.pool, uuid, from, false, i64::from(q.limit))
        .await
        .map_err(db)?;
    let mut out = SandboxLogs::default();
    for l in lines {
        let Some(level) = LogLevel::parse(&l.level) else {
            continue;
        };
        let mut line = l.message.clone();
        for (k, v) in &l.fields.0 {
            line.push_str(&format!(" {k}={v}"));
        }
        out.logs.push(SandboxLog {
            timestamp: l.at,
            line,
        });
        out.log_entries.push(SandboxLogEntry {
            timestamp: l.at,
            message: l.message,
            level,
            fields: l.fields.0,
        });
    }
    Ok(to_json(StatusCode::OK, &out))
}
