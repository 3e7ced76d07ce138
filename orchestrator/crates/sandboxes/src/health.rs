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
    let ((database, migrations), docker) = tokio::join!(db, docker);
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
