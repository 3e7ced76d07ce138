//! The node at a glance: its dependencies' health, the replicas with their engines and
//! sandboxes, a few `/metrics` series, and the tools this key may call.

use axum::Extension;
use serde_json::{json, Value};

use super::{details, or_refused, rows_of, shown, table, Page};
use crate::api::console::rest::Rest;
use crate::api::console::session::Session;

/// `GET /console/node`: this instance, readiness (each dependency, the replicas of this database
/// and the engine each drives), the metrics at a glance (sandboxes, pool, engines, calls: the
/// series of `/metrics`), and the tools this key may call. Every figure is one REST already
/// serves: `/health/live`, `/health/ready`, `/metrics`, `GET /v1/tools`.
pub async fn node(s: Session, Extension(rest): Extension<Rest>) -> Page {
    let live = rest.get(&s.key, "/health/live").await?;
    let ready = rest.get(&s.key, "/health/ready").await?;
    let (metrics_status, metrics) = rest.text(&s.key, "/metrics").await?;
    let tools = rest.get(&s.key, "/v1/tools").await?;
    let mut body = String::from("<h1>Node</h1>");
    body += &details(&live.body, &["version", "instance_id", "status"]);
    let checks = &ready.body["checks"];
    body += &format!(
        "<h2>Readiness <span class=\"status\" id=\"ready\">{}</span></h2>",
        if ready.ok() { "ready" } else { "not ready" }
    );
    let components: Vec<Value> = ["database", "migrations", "docker", "sandboxes"]
        .iter()
        .map(|name| json!({"component": name, "status": checks[*name]["status"], "error": checks[*name]["error"]}))
        .collect();
    body += &table(
        "checks",
        &components,
        &[
            ("Component", "component"),
            ("Status", "status"),
            ("Error", "error"),
        ],
        None,
    );
    body += &details(checks, &["kernel_policy"]);
    body += "<h2>Replicas and their engines</h2>";
    body += &table(
        "replicas",
        &rows_of(&checks["cluster"]["replicas"]),
        &[
            ("Instance", "instance_id"),
            ("This one", "this"),
            ("Engine", "engine"),
            ("Peer URL", "peer_url"),
            ("Sandboxes held", "sandboxes_held"),
            ("Heartbeat age (s)", "heartbeat_age_secs"),
        ],
        None,
    );
    body += "<h2>Metrics at a glance</h2>";
    if metrics_status.is_success() {
        body += &table(
            "metrics",
            &glance(&metrics),
            &[("Series", "name"), ("Labels", "labels"), ("Value", "value")],
            None,
        );
    } else {
        body += &format!(
            "<p class=\"error refused\" role=\"alert\">REST refused: {} (<code>/metrics</code>)</p>",
            metrics_status.as_u16()
        );
    }
    body += "<h2>Tools this key may call</h2>";
    body += &or_refused(&tools, |b| {
        table(
            "tools",
            &rows_of(b),
            &[("Name", "name"), ("Tier", "tier"), ("Category", "category")],
            None,
        )
    });
    shown(&s, "Node", "/console/node", &body)
}

/// The series of `/metrics` an operator reads at a glance: the gauges of sandboxes, runs, the
/// warm pool, engines, replicas and database connections, and the counters of calls and pool
/// acquisitions; histogram buckets are left to Prometheus.
pub(super) const GLANCE: &[&str] = &[
    "aegis_sandboxes",
    "aegis_executions",
    "aegis_workflow_executions",
    "aegis_pool_idle_sandboxes",
    "aegis_pool_acquisitions_total",
    "aegis_engine_sandboxes",
    "aegis_engine_replicas",
    "aegis_cluster_replicas",
    "aegis_db_pool_connections",
    "aegis_forwarded_calls_total",
    "aegis_tool_calls_total",
    "aegis_seal_refusals_total",
    "aegis_audit_rows_written_total",
];

/// The samples of the [`GLANCE`] series in Prometheus text, in that order, as rows of
/// `name`, `labels`, `value`.
pub(super) fn glance(text: &str) -> Vec<Value> {
    let mut rows: Vec<(usize, Value)> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let order = GLANCE.iter().position(|g| *g == name)?;
            Some((
                order,
                json!({"name": name, "labels": labels, "value": value}),
            ))
        })
        .collect();
    rows.sort_by_key(|(order, _)| *order);
    rows.into_iter().map(|(_, row)| row).collect()
}

// ---------------------------------------------------------------- rendering helpers
