//! PostgreSQL: the pool, the start-up connection with retries, and the migrations.
//!
//! Everything the orchestrator remembers lives here. Queries are checked at run time (`query_as` +
//! `FromRow`) so that building never needs a database. Migrations are embedded from `migrations/`
//! at compile time and applied at start; applying them twice is a no-op.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// A database failure as the driver reports it; the edges map it once (HTTP, SEAL, gRPC).
pub use sqlx::Error as DbError;
/// The migrations in `migrations/`, embedded in the binary.
/// The pool every service is given; the layers above name it through here, never `sqlx`.
pub use sqlx::PgPool;

pub static MIGRATOR: Migrator = sqlx::migrate!("../../../migrations");

/// A pooled connection idle at least this long is pinged before it is used (one idle for less
/// was pinged, and found working, when it was released that recently).
const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// The row `id` of `table` if it belongs to `tenant`, selected as `columns` into `T`: every
/// lookup of one tenant's row by its id scopes it the same way, so a row of another tenant is
/// as missing as one that never was. `table` and `columns` are the code's own text, never input.
pub async fn tenant_row<T>(
    pool: &PgPool,
    table: &'static str,
    columns: &'static str,
    tenant: &str,
    id: uuid::Uuid,
) -> Result<Option<T>, sqlx::Error>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    sqlx::query_as(&format!(
        "SELECT {columns} FROM {table} WHERE tenant_id = $1 AND id = $2"
    ))
    .bind(tenant)
    .bind(id)
    .fetch_optional(pool)
    .await
}

/// The newest rows of `tenant` in `table` (at most 1000), selected as `columns` into `T`; with
/// `live_status`, only those in that status and not yet expired (the `status` and `expires_at`
/// columns): SEAL sessions and approval requests are listed alike. `table` and `columns` are the
/// code's own text, never input.
pub async fn tenant_rows<T>(
    pool: &PgPool,
    table: &'static str,
    columns: &'static str,
    tenant: &str,
    live_status: Option<&'static str>,
) -> Result<Vec<T>, sqlx::Error>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    sqlx::query_as(&format!(
        "SELECT {columns} FROM {table} WHERE tenant_id = $1 \
         AND ($2::text IS NULL OR (status = $2 AND expires_at > now())) \
         ORDER BY created_at DESC LIMIT 1000"
    ))
    .bind(tenant)
    .bind(live_status)
    .fetch_all(pool)
    .await
}

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
        // sqlx pings a connection when it goes back to the pool (a broken one is closed there)
        // and, by default, again when it is taken out: a second round trip on every statement
        // of the hot path (the audit writer's batch, twice per tool call). Only a connection
        // idle long enough for the server to have gone meanwhile is pinged before use.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_IF_IDLE_FOR {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
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

impl DatabaseConfig {
    /// The `database:` section on its own: a usable URL, at least one connection.
    pub fn check(&self) -> Result<(), aegis_core::settings::Invalid> {
        check_database_url(&self.url).map_err(|m| aegis_core::settings::Invalid::new("url", m))?;
        aegis_core::settings::at_least_one(&[("max_connections", u64::from(self.max_connections))])
    }
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

/// Explains precisely which part of a PostgreSQL URL is wrong. Never echoes the password.
pub fn check_database_url(raw: &str) -> Result<(), String> {
    let url = url::Url::parse(raw).map_err(|e| match e {
        url::ParseError::RelativeUrlWithoutBase => {
            "expected a URL such as postgres://user:password@host:5432/database (no scheme found)"
                .to_owned()
        }
        url::ParseError::InvalidPort => "the port is not a number between 1 and 65535".to_owned(),
        url::ParseError::EmptyHost => "the host is empty".to_owned(),
        url::ParseError::InvalidIpv4Address | url::ParseError::InvalidIpv6Address => {
            "the host is not a valid IP address".to_owned()
        }
        other => format!("not a valid URL: {other}"),
    })?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Err(format!(
            "the scheme is `{}`; expected `postgres://` or `postgresql://`",
            url.scheme()
        ));
    }
    let has_host = url.host_str().is_some_and(|h| !h.is_empty());
    let has_socket_dir = url.query_pairs().any(|(k, _)| k == "host");
    if !has_host && !has_socket_dir {
        return Err("the host is missing (postgres://user@HOST:5432/database)".to_owned());
    }
    if url.port() == Some(0) {
        return Err("the port is 0; expected a number between 1 and 65535".to_owned());
    }
    let db = url.path().trim_start_matches('/');
    if db.is_empty() {
        return Err("the database name is missing (postgres://user@host:5432/DATABASE)".to_owned());
    }
    if db.contains('/') {
        return Err(format!(
            "the database name `{db}` contains `/`; expected a single path segment"
        ));
    }
    Ok(())
}
