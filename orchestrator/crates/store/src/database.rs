//! PostgreSQL: the pool, the start-up connection with retries, and the migrations.
//!
//! Everything the orchestrator remembers lives here. Queries are checked at run time (`query_as` +
//! `FromRow`) so that building never needs a database. Migrations are embedded from `migrations/`
//! at compile time and applied at start; applying them twice is a no-op.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

/// The migrations in `migrations/`, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("../../../migrations");

/// Why the database could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL was refused by the driver (the config check should have caught it first).
    #[error("database URL rejected: {0}")]
    Url(#[source] sqlx::Error),
    /// Start-up gave up waiting for the database.
    #[error("database at {url} not reachable after {attempts} attempts over {waited:?}: {last}")]
    Unreachable {
        /// The URL, password redacted.
        url: String,
        /// How many connection attempts were made.
        attempts: u32,
        /// How long start-up waited.
        waited: Duration,
        /// The last driver error.
        last: String,
    },
    /// A migration failed to apply.
    #[error("applying migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Any other driver error.
    #[error("database error: {0}")]
    Sql(#[from] sqlx::Error),
}

/// Builds the pool and waits, with exponential backoff, until the database answers.
///
/// Each failed attempt is logged with the time until the next one, so an operator watching
/// `docker compose up` sees why the service is not ready yet.
pub async fn connect(config: &DatabaseConfig) -> Result<PgPool, StoreError> {
    let options: PgConnectOptions = config.url.parse().map_err(StoreError::Url)?;
    let pool = PgPoolOptions::new()
        .max_connections(config.max_connections)
        .acquire_timeout(Duration::from_secs(3))
        .connect_lazy_with(options);

    let started = tokio::time::Instant::now();
    let deadline = Duration::from_secs(config.connect_timeout_secs);
    let mut delay = Duration::from_millis(200);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match sqlx::query("SELECT 1").execute(&pool).await {
            Ok(_) => {
                tracing::info!(url = %redact_url(&config.url), attempts, "database reachable");
                return Ok(pool);
            }
            Err(e) if started.elapsed() + delay < deadline => {
                tracing::warn!(
                    url = %redact_url(&config.url),
                    attempt = attempts,
                    retry_in_ms = delay.as_millis() as u64,
                    error = %e,
                    "database not reachable yet; retrying"
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                return Err(StoreError::Unreachable {
                    url: redact_url(&config.url),
                    attempts,
                    waited: started.elapsed(),
                    last: e.to_string(),
                })
            }
        }
    }
}

/// Applies pending migrations; returns how many were newly applied.
pub async fn migrate(pool: &PgPool) -> Result<usize, StoreError> {
    let before = applied_versions(pool).await.unwrap_or_default();
    MIGRATOR.run(pool).await?;
    let after = applied_versions(pool).await?;
    let fresh = after.len().saturating_sub(before.len());
    tracing::info!(
        applied_now = fresh,
        total = after.len(),
        "migrations up to date"
    );
    Ok(fresh)
}

/// The versions recorded in sqlx's bookkeeping table (empty before the first migration).
pub async fn applied_versions(pool: &PgPool) -> Result<Vec<i64>, sqlx::Error> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !exists {
        return Ok(Vec::new());
    }
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
        .fetch_all(pool)
        .await
}

/// True when every embedded migration is recorded as applied.
pub async fn migrations_current(pool: &PgPool) -> Result<bool, sqlx::Error> {
    let applied = applied_versions(pool).await?;
    Ok(MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .all(|m| applied.contains(&m.version)))
}

/// PostgreSQL settings.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// `postgres://user:password@host:port/database`; usually given as `DATABASE_URL`.
    pub url: String,
    /// Upper bound of pooled connections.
    pub max_connections: u32,
    /// How long start-up keeps retrying an unreachable database before giving up.
    pub connect_timeout_secs: u64,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: "postgres://orchestrator:orchestrator@127.0.0.1:5432/orchestrator".to_owned(),
            max_connections: 10,
            connect_timeout_secs: 60,
        }
    }
}

/// Renders a URL with its password replaced, for logs.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        Ok(url) => url.to_string(),
        Err(_) => "<unparseable url>".to_owned(),
    }
}
