//! The orchestrator a benchmark measures: its own database on the server `DATABASE_URL` names
//! (created, then dropped), and a node served in this process on it, from a config the
//! benchmark adjusts (a warm pool, ...).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use orchestrator::app::Application;
use orchestrator::config::NodeConfig;
use orchestrator::state::AppState;
use sqlx::postgres::PgPoolOptions;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[path = "interrupt.rs"]
pub mod interrupt;
#[allow(dead_code)] // only the benchmarks that measure through E2B's SDK run a driver
#[path = "sdk_driver.rs"]
pub mod sdk_driver;

fn say(msg: impl std::fmt::Display) {
    eprintln!("[bench] {msg}");
}

/// The benchmark's own database on the admin server.
pub struct BenchDb {
    admin_url: String,
    /// The database's name, `bench_<run id>`.
    pub name: String,
    url: String,
}

impl BenchDb {
    /// Creates `bench_<run_id>` on the server `admin_url` names.
    pub async fn create(admin_url: &str, run_id: &str) -> Result<Self> {
        let name = format!("bench_{run_id}");
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(20))
            .connect(admin_url)
            .await
            .context("cannot reach PostgreSQL at DATABASE_URL")?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&pool)
            .await
            .context("CREATE DATABASE (the role in DATABASE_URL needs CREATEDB)")?;
        pool.close().await;
        let mut url = url::Url::parse(admin_url).context("DATABASE_URL is not a URL")?;
        url.set_path(&name);
        Ok(Self {
            admin_url: admin_url.to_owned(),
            name,
            url: url.to_string(),
        })
    }

    /// Its URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// [`BenchDb::create`] on the server `DATABASE_URL` names, with a run id of its own.
    #[allow(dead_code)] // the benchmarks with a run id of their own call `create`
    pub async fn from_env() -> Result<Self> {
        let admin = std::env::var("DATABASE_URL")
            .map_err(|_| anyhow!("set DATABASE_URL to a PostgreSQL that may CREATE DATABASE"))?;
        Self::create(&admin, &uuid::Uuid::new_v4().simple().to_string()).await
    }

    /// Drops it (also with connections still open).
    pub async fn drop(&self) {
        let dropped = async {
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .connect(&self.admin_url)
                .await?;
            sqlx::query(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .execute(&pool)
            .await?;
            pool.close().await;
            Ok::<_, sqlx::Error>(())
        };
        if let Err(e) = dropped.await {
            say(format!("could not drop database {}: {e}", self.name));
        }
    }
}

/// The config a benchmark's node starts from: HTTP and gRPC on free loopback ports, a short
/// shutdown grace, the database at `db_url`, the executor at `executor`, and a new admin key
/// (returned too, for the benchmark's own requests).
pub fn bench_config(db_url: &str, executor: &Path) -> Result<(NodeConfig, String)> {
    let admin_key = format!(
        "aok_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let mut c = NodeConfig::default();
    c.server.http = "127.0.0.1:0".parse()?;
    c.server.grpc = "127.0.0.1:0".parse()?;
    c.server.shutdown_grace_secs = 5;
    c.database.url = db_url.to_owned();
    c.auth.admin_key = Some(admin_key.clone());
    c.sandbox.executor_path = executor.to_path_buf();
    Ok((c, admin_key))
}

/// The node `c` describes, built (not serving yet), with its handles; refused when it cannot
/// run sandboxes, which is what every benchmark measures.
pub async fn built_node(c: NodeConfig) -> Result<(Application, AppState)> {
    let app = Application::build(c)
        .await
        .context("the orchestrator did not start")?;
    let state = app.state().clone();
    if let Some(reason) = state.sandboxes.unavailable_reason() {
        bail!("sandboxes are unavailable: {reason}");
    }
    Ok((app, state))
}

/// The scope the node's sandbox containers are labelled with, for a benchmark's clean-up by
/// label after the node stopped; `None` when it has no dispatcher.
#[allow(dead_code)] // only the benchmarks with raw Docker baselines clean up by label
pub fn label_scope(state: &AppState) -> Option<String> {
    state
        .sandboxes
        .dispatcher()
        .map(|d| d.scope().to_owned())
        .ok()
}

/// An admin REST request `method path` on the node at `base` with the admin key `key`, its
/// body added by `body`: the JSON body of a 2xx answer (null when it is none); any other
/// answer fails naming the request, its status and its body.
#[allow(dead_code)] // only the benchmarks that call REST through their own client use it
pub async fn admin_rest(
    http: &reqwest::Client,
    (base, key): (&str, &str),
    method: reqwest::Method,
    path: &str,
    body: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
) -> Result<serde_json::Value> {
    let req = http
        .request(method.clone(), format!("{base}{path}"))
        .bearer_auth(key);
    let r = body(req).send().await?;
    let status = r.status();
    let text = r.text().await?;
    if !status.is_success() {
        bail!("{method} {path}: {status}: {text}");
    }
    Ok(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
}

/// An orchestrator instance served in this process.
pub struct RunningApp {
    /// The node's handles.
    pub state: AppState,
    /// `http://<its HTTP address>`.
    pub http_base: String,
    /// Its admin key.
    pub admin_key: String,
    /// A client with a generous timeout.
    pub http: reqwest::Client,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), orchestrator::app::AppError>>,
}

impl RunningApp {
    /// Starts a node on `db` with the executor at `executor`, its config adjusted by `adjust`
    /// (a warm pool, ...); calls reach the executors over their socket unless
    /// `BENCH_CHANNEL=attach` asks for Docker's attach stream, for an A/B.
    pub async fn start(
        db: &BenchDb,
        executor: &Path,
        adjust: impl FnOnce(&mut NodeConfig),
    ) -> Result<Self> {
        let (mut c, admin_key) = bench_config(db.url(), executor)?;
        c.database.connect_timeout_secs = 20;
        // The direct channel (a socket per sandbox; the node is this root process on the Docker
        // host) unless BENCH_CHANNEL=attach asks for Docker's attach stream, for an A/B.
        let attach = std::env::var("BENCH_CHANNEL").is_ok_and(|c| c == "attach");
        say(format!(
            "calls reach the executors over {}",
            if attach {
                "the attach stream (BENCH_CHANNEL=attach)"
            } else {
                "their socket"
            }
        ));
        c.sandbox.channel_dir = (!attach).then(|| {
            let unique = uuid::Uuid::new_v4().simple().to_string();
            std::path::PathBuf::from(format!("/run/aegis-bench/{}", &unique[..8]))
        });
        adjust(&mut c);
        let (app, state) = built_node(c).await?;
        let http_base = format!("http://{}", app.http_addr());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(app.run(shutdown.clone()));
        Ok(Self {
            state,
            http_base,
            admin_key,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()?,
            shutdown,
            task,
        })
    }
    /// Stops it (its warm pool drained, its sandboxes destroyed), waiting at most 90 s.
    pub async fn stop(self) {
        self.shutdown.cancel();
        match tokio::time::timeout(Duration::from_secs(90), self.task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => say(format!("orchestrator stopped with an error: {e}")),
            Ok(Err(e)) => say(format!("orchestrator task failed: {e}")),
            Err(_) => say("orchestrator did not stop within 90 s"),
        }
    }
}

/// What a benchmark that serves a node takes from its environment: the PostgreSQL server
/// `DATABASE_URL` names (its role may CREATE DATABASE) and the static executor
/// `SANDBOX_EXECUTOR_BIN` names. `script`, the script that provides both, is named when one is
/// missing.
pub fn node_environment(script: &str) -> Result<(String, PathBuf)> {
    let admin_url = std::env::var("DATABASE_URL")
        .map_err(|_| anyhow!("DATABASE_URL is not set ({script} provides one)"))?;
    let executor =
        PathBuf::from(std::env::var("SANDBOX_EXECUTOR_BIN").map_err(|_| {
            anyhow!("SANDBOX_EXECUTOR_BIN is not set ({script} builds the executor)")
        })?);
    Ok((admin_url, executor))
}

/// Serves a node on a database of its own (made on the server `DATABASE_URL` names, dropped
/// afterwards whatever happened), with the executor `SANDBOX_EXECUTOR_BIN` names and its config
/// adjusted by `adjust`, runs `measure` against it until that ends or the benchmark is
/// interrupted, then stops the node (which destroys its sandboxes). `script` is the script
/// that provides the environment, named when something is missing.
#[allow(dead_code)] // the benchmarks that clean up more than this (bench.rs) serve their own
pub async fn serve_and_measure<T>(
    script: &str,
    adjust: impl FnOnce(&mut NodeConfig),
    measure: impl AsyncFnOnce(&RunningApp) -> Result<T>,
) -> Result<T> {
    let (admin_url, executor) = node_environment(script)?;
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let db = BenchDb::create(&admin_url, &run_id).await?;
    say(format!("database {} created", db.name));
    let outcome = async {
        let app = RunningApp::start(&db, &executor, adjust).await?;
        let measured = tokio::select! {
            r = measure(&app) => r,
            why = interrupt::interrupted() => Err(anyhow!("interrupted by {why}")),
        };
        say("stopping the orchestrator (destroys its sandboxes)");
        app.stop().await;
        measured
    }
    .await;
    db.drop().await;
    say(format!("database {} dropped", db.name));
    outcome
}

impl RunningApp {
    /// A new operator key named `name` (the key itself).
    #[allow(dead_code)] // not every benchmark makes keys
    pub async fn operator_key(&self, name: &str) -> Result<String> {
        let created = self
            .http
            .post(format!("{}/v1/api-keys", self.http_base))
            .bearer_auth(&self.admin_key)
            .json(&serde_json::json!({"name": name, "role": "operator"}))
            .send()
            .await?;
        if !created.status().is_success() {
            bail!("creating the benchmark's key: {}", created.text().await?);
        }
        Ok(created.json::<serde_json::Value>().await?["key"]
            .as_str()
            .context("no key in the answer")?
            .to_owned())
    }
}
