//! What a sandbox uses and what happened to it, on E2B's control API:
//!
//! - `GET /sandboxes/{id}/metrics`: one sample taken now from the sandbox container's cgroup
//!   (`Dispatcher::usage`: CPU over about a second, memory without page cache, and as disk the
//!   bytes in its workspace and `/tmp`, which are tmpfs). E2B keeps a series every few seconds;
//!   this node keeps none, so a range that does not reach the present is empty, and one that
//!   does gets the present sample.
//! - `GET /v2/sandboxes/{id}/logs` (and the deprecated v1 `GET /sandboxes/{id}/logs`, the same
//!   lines as text and entries): the sandbox's lifecycle as the node saw it (created from a
//!   snapshot, paused, resumed, snapshot taken, forked), from `e2b_sandbox_logs`. Commands'
//!   output is not logged: audit rows name no sandbox, and the executor's stderr is not kept.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use dispatcher::SandboxId;

use aegis_e2b::api::{
    ApiError, LogLevel, LogsDirection, LogsQuery, LogsV1Query, MetricsQuery, SandboxLog,
    SandboxLogEntry, SandboxLogs, SandboxLogsV2Response, SandboxMetric,
};

use super::control::{db, known, not_found, to_json, Key};
use super::store;
use super::Refusal;
use crate::state::AppState;

type Answer = Result<axum::response::Response, Refusal>;

/// Seconds a range may end before now and still get the present sample (the SDK asks with
/// whole seconds, from a clock that may lag the node's).
const SLACK_SECS: i64 = 10;

/// `GET /sandboxes/{id}/metrics`.
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
    if row.paused_snapshot.is_some() || !in_range {
        return Ok(to_json(StatusCode::OK, &Vec::<SandboxMetric>::new()));
    }
    let dispatcher = state
        .sandboxes
        .dispatcher()
        .map_err(|e| Refusal(ApiError::new(503, e.to_string())))?;
    let usage = dispatcher
        .usage(SandboxId(row.current))
        .await
        .map_err(|e| match e {
            dispatcher::DispatchError::SandboxNotFound { .. }
            | dispatcher::DispatchError::SandboxGone { .. } => not_found(&id),
            other => Refusal(ApiError::new(503, other.to_string())),
        })?;
    let sample = SandboxMetric {
        timestamp: now,
        timestamp_unix: now.timestamp(),
        cpu_count: usage.cpu_count,
        cpu_used_pct: usage.cpu_used_pct,
        mem_used: usage.mem_used,
        mem_total: usage.mem_total,
        mem_cache: usage.mem_cache,
        disk_used: usage.disk_used,
        disk_total: usage.disk_total,
    };
    Ok(to_json(StatusCode::OK, &vec![sample]))
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
