//! Result delivery (`spec.execution.delivery`): an ended execution's result sent to webhook and
//! REST destinations, signed, retried, logged.
//!
//! When an execution ends, one `deliveries` row per destination whose condition matches is
//! written with the request already rendered (body, method, URL, headers), so every retry sends
//! the same bytes. Workers on every replica claim due rows with `FOR UPDATE SKIP LOCKED` and a
//! lease; a replica that dies mid-send leaves a row whose lease expires and another replica
//! sends it again (at least once: receivers deduplicate on `X-Aegis-Delivery`). Each attempt is a
//! row of `delivery_attempts`; a failed attempt is retried after `backoff_base_ms * 2^(n-1)`
//! (capped at `backoff_max_secs`) until `max_attempts`, then the delivery is `failed`.
//!
//! Every request carries `X-Aegis-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret,
//! "<t>.<body>")>`; the secret is named in the manifest (`config.secret`) and defined by the
//! node (`delivery.secrets`: name -> environment variable), never written in a manifest. Sends go
//! through the egress gates of `web.*` ([`crate::Egress::admit`]: blocked ranges checked
//! on every resolved address, pinned resolution, no redirects), and the denylist of the agent's
//! `spec.security.network` holds for them too, names and CIDR blocks, by address: what the
//! manifest says is never reachable is not reached on the agent's behalf. (Its allowlist and
//! mode bound what the agent reaches; the destinations are declared beside them by whoever
//! deployed it.)
//! Email and SMS are refused at deploy: this node has no SMTP or SMS client.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::Sha256;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The request header carrying the signature.
pub const SIGNATURE_HEADER: &str = "X-Aegis-Signature";
/// The request header carrying the delivery id (the same on every retry).
pub const DELIVERY_HEADER: &str = "X-Aegis-Delivery";

/// `delivery:` in the node configuration.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DeliveryConfig {
    /// Signing secrets by name (what a manifest's `config.secret` names) -> the environment
    /// variable holding the secret. Only names appear in manifests and in this file.
    pub secrets: BTreeMap<String, String>,
    /// Attempts per delivery, the first included.
    pub max_attempts: u32,
    /// Wait before the first retry, milliseconds; doubled on each further retry.
    pub backoff_base_ms: u64,
    /// Longest wait between two attempts, seconds.
    pub backoff_max_secs: u64,
    /// How often each replica looks for due deliveries, milliseconds.
    pub poll_interval_ms: u64,
    /// Time allowed for one attempt (connect, send, response head), seconds.
    pub timeout_secs: u64,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        Self {
            secrets: BTreeMap::new(),
            max_attempts: 5,
            backoff_base_ms: 1000,
            backoff_max_secs: 300,
            poll_interval_ms: 1000,
            timeout_secs: 10,
        }
    }
}

impl DeliveryConfig {
    /// The `delivery:` section on its own: attempts, waits and intervals of at least 1.
    pub fn check(&self) -> Result<(), aegis_core::settings::Invalid> {
        aegis_core::settings::at_least_one(&[
            ("max_attempts", u64::from(self.max_attempts)),
            ("backoff_max_secs", self.backoff_max_secs),
            ("poll_interval_ms", self.poll_interval_ms),
            ("timeout_secs", self.timeout_secs),
        ])
    }

    /// The value of the secret `name`, if the node defines it and its variable is set.
    fn secret(&self, name: &str) -> Option<String> {
        let var = self.secrets.get(name)?;
        std::env::var(var).ok().filter(|v| !v.is_empty())
    }

    /// Wait after failed attempt `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u64 << attempt.saturating_sub(1).min(30);
        Duration::from_millis(self.backoff_base_ms.saturating_mul(factor))
            .min(Duration::from_secs(self.backoff_max_secs))
    }
}

/// Deploy-time problems of `spec.execution.delivery` on this node, as (pointer, message):
/// transports this node lacks, and signing secrets it does not define.
pub fn check_manifest(manifest: &Value, config: &DeliveryConfig) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let Some(list) = manifest
        .pointer("/spec/execution/delivery/destinations")
        .and_then(Value::as_array)
    else {
        return problems;
    };
    for (i, d) in list.iter().enumerate() {
        let at = format!("/spec/execution/delivery/destinations/{i}");
        match d["type"].as_str() {
            Some(kind @ ("email" | "sms")) => problems.push((
                format!("{at}/type"),
                format!(
                    "`{kind}` delivery is not supported on this node (no {} client); use a \
                     webhook or rest destination",
                    if kind == "email" { "SMTP" } else { "SMS" }
                ),
            )),
            _ => {
                let secret = d.pointer("/config/secret").and_then(Value::as_str);
                match secret {
                    Some(name) if config.secret(name).is_none() => problems.push((
                        format!("{at}/config/secret"),
                        if config.secrets.contains_key(name) {
                            format!(
                                "signing secret `{name}` is configured but its environment \
                                 variable is not set on this node"
                            )
                        } else {
                            format!(
                                "signing secret `{name}` is not defined on this node \
                                 (delivery.secrets in the node configuration)"
                            )
                        },
                    )),
                    _ => {}
                }
                if let Some(headers) = d.pointer("/config/headers").and_then(Value::as_object) {
                    for name in headers.keys() {
                        let lower = name.to_ascii_lowercase();
                        if lower.starts_with("x-aegis-")
                            || matches!(lower.as_str(), "content-type" | "content-length" | "host")
                            || reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err()
                        {
                            problems.push((
                                format!("{at}/config/headers/{name}"),
                                format!(
                                    "header `{name}` cannot be set here: it is not a valid \
                                     header name or the node sets it"
                                ),
                            ));
                        }
                    }
                }
                if let Some(t) = d["transform"].as_str() {
                    if let Err(e) = aegis_core::render::render(t, &json!({})) {
                        problems.push((
                            format!("{at}/transform"),
                            format!("the transform is not a valid template: {e}"),
                        ));
                    }
                }
            }
        }
    }
    problems
}

/// Whether a destination's `condition` covers `status`: `on_success` is `completed`,
/// `on_failure` is `failed` or `timed_out`, `always` (default) is every end.
fn wanted(condition: Option<&str>, status: &str) -> bool {
    match condition.unwrap_or("always") {
        "on_success" => status == "completed",
        "on_failure" => matches!(status, "failed" | "timed_out"),
        _ => true,
    }
}

#[derive(sqlx::FromRow)]
struct EndedRow {
    tenant_id: String,
    agent_name: String,
    agent_version: String,
    status: String,
    last_output: Option<String>,
    last_error: Option<String>,
    manifest: Value,
}

/// Writes one pending delivery per destination of the execution's manifest whose condition
/// matches how it ended; returns how many. Called in the transaction that ends the execution,
/// so an end is never recorded without its deliveries.
pub async fn enqueue(
    conn: &mut sqlx::PgConnection,
    execution: Uuid,
    config: &DeliveryConfig,
) -> Result<usize, sqlx::Error> {
    let Some(ended): Option<EndedRow> = sqlx::query_as(
        "SELECT e.tenant_id, e.agent_name, e.agent_version, e.status, e.last_output, \
         e.last_error, v.manifest FROM executions e \
         JOIN definition_versions v ON v.id = e.agent_version_id WHERE e.id = $1",
    )
    .bind(execution)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(0);
    };
    let Some(list) = ended
        .manifest
        .pointer("/spec/execution/delivery/destinations")
        .and_then(Value::as_array)
    else {
        return Ok(0);
    };
    // The answer only when completed; a failed execution's last_output is a rejected attempt.
    let output = (ended.status == "completed")
        .then_some(ended.last_output.as_deref())
        .flatten();
    let mut queued = 0;
    for d in list {
        if !matches!(d["type"].as_str(), Some("webhook" | "rest"))
            || !wanted(d["condition"].as_str(), &ended.status)
        {
            continue;
        }
        let id = Uuid::new_v4();
        let name = d["name"].as_str().unwrap_or_default();
        let payload = json!({
            "delivery_id": id, "destination": name, "execution_id": execution,
            "agent": ended.agent_name, "agent_version": ended.agent_version,
            "status": ended.status, "output": output, "error": ended.last_error,
        });
        let (body, content_type, failure) = match d["transform"].as_str() {
            None => (payload.to_string(), "application/json", None),
            Some(t) => match aegis_core::render::render(t, &payload) {
                Ok(text) => {
                    let ct = if serde_json::from_str::<Value>(&text).is_ok() {
                        "application/json"
                    } else {
                        "text/plain; charset=utf-8"
                    };
                    (text, ct, None)
                }
                Err(e) => (String::new(), "", Some(format!("transform failed: {e}"))),
            },
        };
        let method = d
            .pointer("/config/method")
            .and_then(Value::as_str)
            .unwrap_or("POST");
        sqlx::query(
            "INSERT INTO deliveries (id, tenant_id, execution_id, destination, kind, url, method, \
             headers, secret_name, content_type, body, status, max_attempts, last_error) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
        )
        .bind(id)
        .bind(&ended.tenant_id)
        .bind(execution)
        .bind(name)
        .bind(d["type"].as_str().unwrap_or("webhook"))
        .bind(
            d.pointer("/config/url")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        )
        .bind(method)
        .bind(d.pointer("/config/headers").cloned().unwrap_or(json!({})))
        .bind(d.pointer("/config/secret").and_then(Value::as_str))
        .bind(content_type)
        .bind(&body)
        .bind(if failure.is_some() {
            "failed"
        } else {
            "pending"
        })
        .bind(config.max_attempts.max(1) as i32)
        .bind(failure)
        .execute(&mut *conn)
        .await?;
        queued += 1;
    }
    Ok(queued)
}

#[derive(sqlx::FromRow)]
struct Due {
    id: Uuid,
    execution_id: Uuid,
    url: String,
    method: String,
    headers: Value,
    secret_name: Option<String>,
    content_type: String,
    body: String,
    attempts: i32,
    max_attempts: i32,
}

/// `t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
pub fn signature(secret: &[u8], timestamp: i64, body: &str) -> String {
    // HMAC accepts keys of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("t={timestamp},v1={hex}")
}

/// One attempt: `Ok(status)` when the receiver answered, `Err(reason)` when it could not be
/// reached or the request could not be made.
async fn send(worker: &DeliveryWorker, due: &Due) -> Result<u16, String> {
    let config = &worker.config;
    let domains = denylist_of(&worker.pool, due.execution_id).await?;
    let (url, host, addrs) = crate::fetch::check_url(&worker.egress, &domains, &due.url)
        .await
        .map_err(|e| e.to_string())?;
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(worker.egress.connect_timeout)
        .timeout(Duration::from_secs(config.timeout_secs))
        .user_agent(concat!("aegis-orchestrator/", env!("CARGO_PKG_VERSION")));
    if matches!(url.host(), Some(url::Host::Domain(_))) {
        builder = builder.resolve_to_addrs(&host, &addrs);
    }
    let client = builder.build().map_err(|e| e.to_string())?;
    let method = reqwest::Method::from_bytes(due.method.as_bytes()).map_err(|e| e.to_string())?;
    let mut request = client
        .request(method, url)
        .header(reqwest::header::CONTENT_TYPE, &due.content_type)
        .header(DELIVERY_HEADER, due.id.to_string());
    if let Some(headers) = due.headers.as_object() {
        for (k, v) in headers {
            if let Some(v) = v.as_str() {
                request = request.header(k.as_str(), v);
            }
        }
    }
    if let Some(name) = &due.secret_name {
        let secret = config
            .secret(name)
            .ok_or_else(|| format!("signing secret `{name}` is no longer set on this node"))?;
        let now = chrono::Utc::now().timestamp();
        request = request.header(
            SIGNATURE_HEADER,
            signature(secret.as_bytes(), now, &due.body),
        );
    }
    let response = request.body(due.body.clone()).send().await.map_err(|e| {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            text.push_str(&format!(": {s}"));
            source = s.source();
        }
        text
    })?;
    Ok(response.status().as_u16())
}

/// The deny entries of the execution's `spec.security.network` as the domain rules of its
/// deliveries (no allow part: see the module documentation). A manifest that cannot be read
/// fails the attempt rather than sending without its rules.
async fn denylist_of(pool: &PgPool, execution: Uuid) -> Result<crate::DomainPolicy, String> {
    let row: Option<(Value, String)> = sqlx::query_as(
        "SELECT v.manifest, e.agent_name FROM executions e \
         JOIN definition_versions v ON v.id = e.agent_version_id WHERE e.id = $1",
    )
    .bind(execution)
    .fetch_optional(pool)
    .await
    .map_err(|e| format!("could not read the network policy of execution {execution}: {e}"))?;
    let Some((manifest, agent)) = row else {
        return Err(format!(
            "execution {execution} no longer exists, so its network policy cannot be checked"
        ));
    };
    let mut domains = crate::DomainPolicy::default();
    let network = aegis_manifest::AgentView(&manifest).network();
    let rule = crate::DomainRule::of_network(&agent, &network)?;
    domains.push(crate::DomainRule {
        allow: None,
        ..rule
    });
    Ok(domains)
}

/// Claims due deliveries (pending and due, or sending with an expired lease), at most `limit`.
async fn claim(
    pool: &PgPool,
    me: Uuid,
    lease: Duration,
    limit: i64,
) -> Result<Vec<Due>, sqlx::Error> {
    sqlx::query_as(
        "UPDATE deliveries d SET status = 'sending', attempts = d.attempts + 1, lease_owner = $1, \
         lease_expires_at = now() + make_interval(secs => $2) \
         FROM (SELECT id FROM deliveries \
               WHERE (status = 'pending' AND next_attempt_at <= now()) \
                  OR (status = 'sending' AND lease_expires_at < now()) \
               ORDER BY next_attempt_at LIMIT $3 FOR UPDATE SKIP LOCKED) due \
         WHERE d.id = due.id \
         RETURNING d.id, d.execution_id, d.url, d.method, d.headers, d.secret_name, d.content_type, d.body, \
                   d.attempts, d.max_attempts",
    )
    .bind(me)
    .bind(lease.as_secs_f64())
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Records an attempt and the delivery's next state, if this replica still holds it.
async fn record(
    worker: &DeliveryWorker,
    due: &Due,
    outcome: &Result<u16, String>,
    took: Duration,
) -> Result<(), sqlx::Error> {
    let (code, error) = match outcome {
        Ok(code) if (200..300).contains(code) => (Some(i32::from(*code)), None),
        Ok(code) => (
            Some(i32::from(*code)),
            Some(format!("the receiver answered HTTP {code}")),
        ),
        Err(reason) => (None, Some(reason.clone())),
    };
    let status = match (&error, due.attempts >= due.max_attempts) {
        (None, _) => "delivered",
        (Some(_), true) => "failed",
        (Some(_), false) => "pending",
    };
    let wait = worker.config.backoff(due.attempts.max(1) as u32);
    let mut tx = worker.pool.begin().await?;
    let held = sqlx::query(
        "UPDATE deliveries SET status = $3, last_status_code = $4, last_error = $5, \
         next_attempt_at = now() + make_interval(secs => $6), lease_owner = NULL, \
         lease_expires_at = NULL, delivered_at = CASE WHEN $3 = 'delivered' THEN now() END, \
         updated_at = now() WHERE id = $1 AND lease_owner = $2",
    )
    .bind(due.id)
    .bind(worker.instance_id)
    .bind(status)
    .bind(code)
    .bind(&error)
    .bind(wait.as_secs_f64())
    .execute(&mut *tx)
    .await?;
    if held.rows_affected() == 1 {
        sqlx::query(
            "INSERT INTO delivery_attempts (delivery_id, attempt, status_code, error, duration_ms) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(due.id)
        .bind(due.attempts)
        .bind(code)
        .bind(&error)
        .bind(took.as_millis() as i64)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

/// What the delivery worker uses: the pool, its config section, the egress rules its requests
/// pass, and this instance's id (the owner of the leases it takes).
pub struct DeliveryWorker {
    pub pool: PgPool,
    /// `delivery.*`: poll interval, timeout, backoff.
    pub config: DeliveryConfig,
    /// Every attempt passes the node's egress gate, like `web.fetch`.
    pub egress: Arc<crate::Egress>,
    /// The owner of the leases this worker takes.
    pub instance_id: Uuid,
}

impl DeliveryWorker {
    /// Sends due deliveries every `delivery.poll_interval_ms` until shutdown.
    pub async fn work(self, shutdown: CancellationToken) {
        let every = Duration::from_millis(self.config.poll_interval_ms.max(10));
        // Long enough for one attempt and its bookkeeping.
        let lease = Duration::from_secs(self.config.timeout_secs.saturating_mul(2).max(5));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let batch = match claim(&self.pool, self.instance_id, lease, 16).await {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(error = %e, "could not claim deliveries");
                    continue;
                }
            };
            for due in batch {
                let started = Instant::now();
                let outcome = send(&self, &due).await;
                if let Err(e) = record(&self, &due, &outcome, started.elapsed()).await {
                    tracing::warn!(delivery = %due.id, error = %e, "could not record a delivery attempt");
                }
            }
        }
    }
}

/// One delivery and its attempts, as the log shows it.
#[derive(Debug, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct DeliveryRecord {
    /// Delivery id (the `X-Aegis-Delivery` header).
    pub id: Uuid,
    /// Destination name.
    pub destination: String,
    /// `webhook` or `rest`.
    pub kind: String,
    /// Target URL.
    pub url: String,
    /// HTTP method.
    pub method: String,
    /// `pending`, `sending`, `delivered` or `failed`.
    pub status: String,
    /// Attempts made.
    pub attempts: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// HTTP status of the last answer.
    pub last_status_code: Option<i32>,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// When it was queued.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When a 2xx answer came.
    pub delivered_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Every attempt: `{attempt, at, status_code, error, duration_ms}`.
    #[schema(value_type = Vec<Object>)]
    pub attempt_log: Value,
}

/// The deliveries of an execution, oldest first.
pub async fn list(pool: &PgPool, execution: Uuid) -> Result<Vec<DeliveryRecord>, sqlx::Error> {
    sqlx::query_as(
        "SELECT d.id, d.destination, d.kind, d.url, d.method, d.status, d.attempts, \
         d.max_attempts, d.last_status_code, d.last_error, d.created_at, d.delivered_at, \
         COALESCE((SELECT jsonb_agg(jsonb_build_object('attempt', a.attempt, 'at', a.at, \
           'status_code', a.status_code, 'error', a.error, 'duration_ms', a.duration_ms) \
           ORDER BY a.attempt) FROM delivery_attempts a WHERE a.delivery_id = d.id), '[]'::jsonb) \
           AS attempt_log \
         FROM deliveries d WHERE d.execution_id = $1 ORDER BY d.created_at, d.destination",
    )
    .bind(execution)
    .fetch_all(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_conditions_and_backoff() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let hex: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let s = signature(b"k", 17, "{}");
        assert!(s.starts_with("t=17,v1=") && s.len() == "t=17,v1=".len() + 64);
        assert_ne!(s, signature(b"k", 18, "{}"));
        assert!(wanted(None, "cancelled"));
        assert!(wanted(Some("on_success"), "completed"));
        assert!(!wanted(Some("on_success"), "failed"));
        assert!(wanted(Some("on_failure"), "timed_out"));
        assert!(!wanted(Some("on_failure"), "cancelled"));
        let c = DeliveryConfig {
            backoff_base_ms: 100,
            backoff_max_secs: 1,
            ..DeliveryConfig::default()
        };
        assert_eq!(c.backoff(1), Duration::from_millis(100));
        assert_eq!(c.backoff(3), Duration::from_millis(400));
        assert_eq!(c.backoff(30), Duration::from_secs(1));
    }

    #[test]
    fn unconfigured_destinations_are_refused() {
        let m = json!({"spec": {"execution": {"delivery": {"destinations": [
            {"name": "mail", "type": "email", "config": {}},
            {"name": "hook", "type": "webhook", "config": {"url": "http://x", "secret": "nope"}},
            {"name": "ok", "type": "rest", "config": {"url": "http://x"}},
        ]}}}});
        let problems = check_manifest(&m, &DeliveryConfig::default());
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].1.contains("not supported"));
        assert!(problems[1].0.ends_with("/config/secret"));
    }
}
