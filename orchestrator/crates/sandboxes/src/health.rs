//! Liveness and readiness: what `/health/*` and the gRPC health service report.
//!
//! Ready means every dependency a tool call needs answers now: the database, the schema at the
//! version this binary expects, and the container engine. Each check has its own short timeout so
//! a hung dependency makes the answer "not ready" quickly instead of hanging the probe.

use std::time::Duration;

use serde::Serialize;

use aegis_store::database;

/// Time each readiness check may take.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// One dependency's state.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ComponentStatus {
    /// `ok` or `failing`.
    #[schema(value_type = String, example = "ok")]
    pub status: &'static str,
    /// Why it is failing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ComponentStatus {
    fn ok() -> Self {
        Self {
            status: "ok",
            error: None,
        }
    }

    fn failing(error: impl Into<String>) -> Self {
        Self {
            status: "failing",
            error: Some(error.into()),
        }
    }

    /// True when the component answers.
    pub fn is_ok(&self) -> bool {
        self.status == "ok"
    }
}

/// The readiness report, serialized as the body of `/health/ready`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Readiness {
    /// `ready` or `not_ready`.
    #[schema(value_type = String, example = "ready")]
    pub status: &'static str,
    /// Names of failing components, in a fixed order.
    #[schema(value_type = Vec<String>)]
    pub failing: Vec<&'static str>,
    /// Every component's state.
    pub checks: Checks,
}

/// Per-component states.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Checks {
    /// PostgreSQL answers a query.
    pub database: ComponentStatus,
    /// Every embedded migration is applied.
    pub migrations: ComponentStatus,
    /// The Docker engine answers a ping.
    pub docker: ComponentStatus,
    /// The dispatcher started (executor installed, reaper running).
    pub sandboxes: ComponentStatus,
    /// What the kernel holds of the command policy: Landlock's ABI and whether it is required.
    pub kernel_policy: crate::KernelPolicy,
    /// The replicas of this database as the table of instances shows them (informative: a peer
    /// that is gone never makes this replica unready; its sandboxes' callers get the error).
    pub cluster: Cluster,
}

/// The running replicas of this database, this one among them.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Cluster {
    /// `ok`, or `unknown` when the table could not be read in time.
    #[schema(value_type = String, example = "ok")]
    pub status: &'static str,
    /// Instances with a heartbeat within the last minute, oldest start first.
    pub replicas: Vec<Replica>,
}

/// One running instance of this database.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Replica {
    /// The instance (changes at every start).
    pub instance_id: uuid::Uuid,
    /// True for the replica answering this request.
    pub this: bool,
    /// Where peers reach it (`cluster.listen`); absent: it serves only the sandboxes it holds
    /// and forwards nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_url: Option<String>,
    /// The Docker engine it drives (`<ID>@<name>:<data root>`, dispatcher's placement); absent
    /// until its dispatcher reached the engine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Seconds since its last heartbeat.
    pub heartbeat_age_secs: f64,
    /// Sandboxes whose executor stream it holds.
    pub sandboxes_held: i64,
}

async fn replicas(pool: &sqlx::PgPool, this: Option<uuid::Uuid>) -> Cluster {
    let query = sqlx::query_as::<_, (uuid::Uuid, Option<String>, Option<String>, f64, i64)>(
        "SELECT n.id, n.peer_url, n.engine, extract(epoch FROM now() - n.heartbeat_at)::float8, \
                (SELECT count(*) FROM sandboxes s \
                  WHERE s.instance_id = n.id AND s.state IN ('creating', 'running')) \
           FROM node_instances n \
          WHERE n.stopped_at IS NULL AND n.heartbeat_at > now() - interval '1 minute' \
          ORDER BY n.started_at, n.id",
    )
    .fetch_all(pool);
    match tokio::time::timeout(CHECK_TIMEOUT, query).await {
        Ok(Ok(rows)) => Cluster {
            status: "ok",
            replicas: rows
                .into_iter()
                .map(|(id, peer_url, engine, age, held)| Replica {
                    instance_id: id,
                    this: Some(id) == this,
                    peer_url,
                    engine,
                    heartbeat_age_secs: age.max(0.0),
                    sandboxes_held: held,
                })
                .collect(),
        },
        _ => Cluster {
            status: "unknown",
            replicas: Vec::new(),
        },
    }
}

impl Readiness {
    /// True when nothing is failing.
    pub fn is_ready(&self) -> bool {
        self.failing.is_empty()
    }
}

/// Runs all checks concurrently, over what readiness reads: the pool, the Docker engine and
/// the sandbox service.
pub async fn check(
    pool: &sqlx::PgPool,
    docker: &dispatcher::DockerEngine,
    sandboxes: &crate::Sandboxes,
) -> Readiness {
    let db = async {
        let q = sqlx::query("SELECT 1").execute(pool);
        match tokio::time::timeout(CHECK_TIMEOUT, q).await {
            Err(_) => (
                ComponentStatus::failing(format!("no answer within {CHECK_TIMEOUT:?}")),
                ComponentStatus::failing("unknown: database unreachable"),
            ),
            Ok(Err(e)) => (
                ComponentStatus::failing(e.to_string()),
                ComponentStatus::failing("unknown: database unreachable"),
            ),
            Ok(Ok(_)) => {
                let m = tokio::time::timeout(CHECK_TIMEOUT, database::migrations_current(pool));
                let migrations = match m.await {
                    Ok(Ok(true)) => ComponentStatus::ok(),
                    Ok(Ok(false)) => ComponentStatus::failing("migrations pending"),
                    Ok(Err(e)) => ComponentStatus::failing(e.to_string()),
                    Err(_) => ComponentStatus::failing("migration check timed out"),
                };
                (ComponentStatus::ok(), migrations)
            }
        }
    };
    let docker = async {
        match docker.ping(CHECK_TIMEOUT).await {
            Ok(()) => ComponentStatus::ok(),
            Err(e) => ComponentStatus::failing(e.to_string()),
        }
    };
    let this = sandboxes.dispatcher().ok().map(|d| d.instance_id());
    let ((database, migrations), docker, cluster) = tokio::join!(db, docker, replicas(pool, this));
    let sandbox_service = match sandboxes.unavailable_reason() {
        None => ComponentStatus::ok(),
        Some(reason) => ComponentStatus::failing(reason),
    };
    let checks = Checks {
        database,
        migrations,
        docker,
        sandboxes: sandbox_service,
        kernel_policy: sandboxes.kernel_policy(),
        cluster,
    };
    let mut failing = Vec::new();
    for (name, c) in [
        ("database", &checks.database),
        ("migrations", &checks.migrations),
        ("docker", &checks.docker),
        ("sandboxes", &checks.sandboxes),
    ] {
        if !c.is_ok() {
            failing.push(name);
        }
    }
    Readiness {
        status: if failing.is_empty() {
            "ready"
        } else {
            "not_ready"
        },
        failing,
        checks,
    }
}
