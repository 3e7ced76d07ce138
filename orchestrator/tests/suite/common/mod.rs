//! The test harness: a real orchestrator, in-process, on random ports, with its own database.
//!
//! Every test gets a fresh database created on the PostgreSQL server named by `DATABASE_URL`
//! (scripts/test.sh provides one), so tests run in parallel without seeing each other's rows.
//! Nothing is mocked: the service talks to that PostgreSQL and to the local Docker engine.
#![allow(dead_code)]

pub mod agent;
pub mod binary;
pub mod fake_llm;
pub mod gvisor;
pub mod harness;
pub mod json;
pub mod mcp;
pub mod net;
pub mod proxy;
pub mod python_client;
pub mod refusal;
pub mod replicas;
pub mod rest;
pub mod sandbox;
pub mod workflow;

use std::net::SocketAddr;
use std::time::Duration;

use orchestrator::app::Application;
use orchestrator::config::NodeConfig;
use orchestrator::state::AppState;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The server that holds every test database; fails the test when unset.
pub fn admin_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set: the integration tests need a real PostgreSQL \
             (run them through scripts/test.sh, which starts one)"
        )
    })
}

/// A database of its own for one test; dropped (best effort) when the value is dropped.
pub struct TestDb {
    /// The database's URL.
    pub url: String,
    name: String,
}

impl TestDb {
    /// Creates `test_<random>` on the admin server.
    pub async fn create() -> Self {
        let admin = admin_url();
        let name = format!("test_{}", uuid::Uuid::new_v4().simple());
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&admin)
            .await
            .unwrap_or_else(|e| panic!("cannot reach the test PostgreSQL at DATABASE_URL: {e}"));
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&pool)
            .await
            .expect("create test database");
        pool.close().await;
        let mut url = url::Url::parse(&admin).expect("DATABASE_URL is a URL");
        url.set_path(&name);
        Self {
            url: url.to_string(),
            name,
        }
    }

    /// A pool on this test's database, for assertions on rows.
    pub async fn pool(&self) -> PgPool {
        PgPoolOptions::new()
            .max_connections(2)
            .connect(&self.url)
            .await
            .expect("connect test database")
    }
}

/// Removes every container, volume and egress network the dispatcher made for database `name`
/// (by label), so a test leaves no sandbox behind whatever it did.
pub fn remove_sandboxes_of(name: &str) {
    let label = format!("label=org.aegis.db-name={name}");
    let list = |args: &[&str]| -> Vec<String> {
        std::process::Command::new("docker")
            .args(args)
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let containers = list(&["ps", "-aq", "--filter", &label]);
    if !containers.is_empty() {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", "-v"])
            .args(&containers)
            .output();
    }
    let volumes = list(&["volume", "ls", "-q", "--filter", &label]);
    if !volumes.is_empty() {
        let _ = std::process::Command::new("docker")
            .args(["volume", "rm", "-f"])
            .args(&volumes)
            .output();
    }
    // Egress networks, with the host firewall rules tagged for them.
    let networks = list(&["network", "ls", "--format", "{{.Name}}", "--filter", &label]);
    for name in &networks {
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", name])
            .output();
        dispatcher::network::remove_rules(name);
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        remove_sandboxes_of(&self.name);
        let name = self.name.clone();
        run_to_end_in_drop(async move {
            if let Ok(pool) = PgPoolOptions::new()
                .max_connections(1)
                .connect(&admin_url())
                .await
            {
                let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&pool)
                    .await;
            }
        });
    }
}

/// Runs `cleanup` to its end from a `Drop`, best effort: on a thread of its own with a runtime
/// of its own, since a value may be dropped inside or outside a runtime.
pub fn run_to_end_in_drop(cleanup: impl std::future::Future<Output = ()> + Send + 'static) {
    let _ = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(cleanup);
    })
    .join();
}

/// A test configuration: loopback, random ports, the given database, quick start-up.
pub fn test_config(db_url: &str) -> NodeConfig {
    let mut c = NodeConfig::default();
    c.server.http = "127.0.0.1:0".parse().expect("addr");
    c.server.grpc = "127.0.0.1:0".parse().expect("addr");
    c.server.shutdown_grace_secs = 5;
    c.database.url = db_url.to_owned();
    c.database.connect_timeout_secs = 20;
    c.auth.admin_key = Some(TEST_ADMIN_KEY.to_owned());
    c.sandbox.executor_path = executor_bin().into();
    // The socket channel when the run asks for it (as `SANDBOX_CHANNEL_DIR` does for a node).
    c.sandbox.channel_dir = std::env::var_os("SANDBOX_CHANNEL_DIR")
        .filter(|dir| !dir.is_empty())
        .map(Into::into);
    c
}

/// The static executor the sandboxes run; fails the test with the build command when unset.
pub fn executor_bin() -> String {
    std::env::var("SANDBOX_EXECUTOR_BIN").unwrap_or_else(|_| {
        panic!(
            "SANDBOX_EXECUTOR_BIN is not set: build the static executor with \
             `CARGO_TARGET_DIR=target/executor RUSTFLAGS=\"-C target-feature=+crt-static\" cargo build \
             --release -p sandbox-executor --target x86_64-unknown-linux-gnu` (scripts/test.sh does this)"
        )
    })
}

/// The admin key every test instance is configured with.
pub const TEST_ADMIN_KEY: &str =
    "aok_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A running orchestrator and the clients to talk to it.
pub struct TestApp {
    /// `http://127.0.0.1:PORT`.
    pub http_base: String,
    /// The gRPC listener.
    pub grpc_addr: SocketAddr,
    /// The TLS listener, when the config set `server.tls`.
    pub tls_addr: Option<SocketAddr>,
    /// An HTTP client.
    pub http: reqwest::Client,
    /// The instance's shared state (pool, engine, ids).
    pub state: AppState,
    /// The database this instance uses (kept alive as long as the app).
    pub db: Option<TestDb>,
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), orchestrator::app::AppError>>>,
}

impl TestApp {
    /// Starts an instance on a fresh database.
    pub async fn spawn() -> Self {
        let db = TestDb::create().await;
        let config = test_config(&db.url);
        let mut app = Self::spawn_with(config).await;
        app.db = Some(db);
        app
    }

    /// Starts an instance with an explicit configuration.
    pub async fn spawn_with(config: NodeConfig) -> Self {
        let app = Application::build(config)
            .await
            .expect("application starts");
        let http_base = format!("http://{}", app.http_addr());
        let grpc_addr = app.grpc_addr();
        let tls_addr = app.tls_addr();
        let state = app.state().clone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(app.run(shutdown.clone()));
        Self {
            http_base,
            grpc_addr,
            tls_addr,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("http client"),
            state,
            db: None,
            shutdown,
            task: Some(task),
        }
    }

    /// `GET {base}{path}`.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{}", self.http_base, path))
            .send()
            .await
            .expect("request sent")
    }

    /// Polls `GET path` (an agent or workflow execution) with the admin key until its `status`
    /// is terminal, and returns that answer; panics after `within` with the last one.
    pub async fn until_ended(&self, path: &str, within: Duration) -> serde_json::Value {
        self.until(path, "ended", within, |e| {
            ["completed", "failed", "cancelled", "timed_out"]
                .contains(&e["status"].as_str().unwrap_or_default())
        })
        .await
    }

    /// Polls `GET path` (admin key; every answer must be a success) until `pred` holds on its
    /// JSON body, which is returned; fails the test, naming `what` and the last body, once
    /// `within` has passed.
    pub async fn until(
        &self,
        path: &str,
        what: &str,
        within: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = std::time::Instant::now() + within;
        loop {
            let asked = std::time::Instant::now();
            let r = match self.admin(reqwest::Method::GET, path).send().await {
                Ok(r) => r,
                // A poll the client gave up on (30 s) is asked again while the deadline allows:
                // under the whole suite's load one answer was once that slow. Said on stderr so
                // a slow node stays visible.
                Err(e) if e.is_timeout() && std::time::Instant::now() < deadline => {
                    eprintln!(
                        "GET {path} ({what}): no answer in {:?}; asking again",
                        asked.elapsed()
                    );
                    continue;
                }
                Err(e) => panic!("GET {path} ({what}): {e}"),
            };
            let status = r.status();
            let e: serde_json::Value = r.json().await.expect("a JSON answer");
            assert!(status.is_success(), "GET {path}: {status} {e}");
            if pred(&e) {
                return e;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{path} never {what}: {e}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A request builder with the admin key attached.
    pub fn admin(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.with_key(method, path, TEST_ADMIN_KEY)
    }

    /// A request builder with the given key attached.
    pub fn with_key(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
    ) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{}", self.http_base, path))
            .bearer_auth(key)
    }

    /// This instance's REST API as the administrator.
    pub fn rest(&self) -> rest::Rest {
        self.rest_as(TEST_ADMIN_KEY)
    }

    /// This instance's REST API as the holder of `key`.
    pub fn rest_as(&self, key: &str) -> rest::Rest {
        rest::Rest::new(self.http.clone(), &self.http_base, key)
    }

    /// `method path` as the administrator, with `body` as JSON when given: the response as it
    /// came.
    pub async fn response(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> reqwest::Response {
        self.rest().response(method, path, body).await
    }

    /// [`rest::Rest::cancel_execution`] as the administrator: the answer.
    pub async fn cancel_execution(&self, id: &str, status: u16) -> serde_json::Value {
        self.rest().cancel_execution(id, status).await
    }

    /// [`rest::Rest::posted`] as the administrator: the answer.
    pub async fn posted(
        &self,
        path: &str,
        body: serde_json::Value,
        status: u16,
    ) -> serde_json::Value {
        self.rest().posted(path, body, status).await
    }

    /// [`rest::Rest::started`] as the administrator: the new execution's id.
    pub async fn started(&self, path: &str, input: serde_json::Value) -> String {
        self.rest().started(path, input).await
    }

    /// `POST path` as the administrator with `body` as JSON: the response as it came.
    pub async fn post_json(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        self.rest().post_json(path, body).await
    }

    /// `method path` as the administrator, with `body` as JSON when given; (status, answer).
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        self.rest().send(method, path, body).await
    }

    /// [`TestApp::send`] whose answer must be JSON.
    pub async fn send_json(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        self.rest().send_json(method, path, body).await
    }

    /// The answer to `GET path` as the administrator (JSON), whatever its status.
    pub async fn get_value(&self, path: &str) -> serde_json::Value {
        self.rest().get_value(path).await
    }

    /// [`TestApp::send`] that must be answered with `status`; the answer.
    pub async fn answered(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
        status: u16,
    ) -> serde_json::Value {
        self.rest().answered(method, path, body, status).await
    }

    /// Destroys sandbox `id` as the administrator (`DELETE /v1/sandboxes/{id}`), which must be
    /// answered 200; the answer.
    pub async fn destroy_sandbox(&self, id: &str) -> serde_json::Value {
        let path = format!("/v1/sandboxes/{id}");
        self.answered(reqwest::Method::DELETE, &path, None, 200)
            .await
    }

    /// `POST path` with `manifest` as YAML (`content-type: application/yaml`) as the
    /// administrator, whose answer must be JSON; (status, answer).
    pub async fn post_yaml(&self, path: &str, manifest: &str) -> (u16, serde_json::Value) {
        let r = self
            .admin(reqwest::Method::POST, path)
            .header("content-type", "application/yaml")
            .body(manifest.to_owned())
            .send()
            .await
            .expect("request sent");
        let status = r.status().as_u16();
        (status, r.json().await.expect("a JSON answer"))
    }

    /// Deploys `manifest` to `path` as the administrator, which must be accepted (201); the
    /// answer.
    pub async fn deployed(&self, path: &str, manifest: &str) -> serde_json::Value {
        self.rest().deployed(path, manifest).await
    }

    /// The status of a request without a body as the holder of `key` (for routes whose answer
    /// a test checks only by its status).
    pub async fn status_as(&self, method: reqwest::Method, path: &str, key: &str) -> u16 {
        self.rest_as(key)
            .response(method, path, None)
            .await
            .status()
            .as_u16()
    }

    /// Asserts that an execution at `path` and its log (`path/events`) are answered `status`
    /// to the holder of `key` (one who may not see them: 403 or 404).
    pub async fn assert_run_hidden(&self, path: &str, key: &str, status: u16) {
        for path in [path.to_owned(), format!("{path}/events")] {
            let got = self.status_as(reqwest::Method::GET, &path, key).await;
            assert_eq!(got, status, "{path}");
        }
    }

    /// `POST /v1/tools/call` as admin; returns (status, body).
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        self.call_tool_as(TEST_ADMIN_KEY, name, arguments).await
    }

    /// `POST /v1/tools/call` as the holder of `key`; returns (status, body).
    pub async fn call_tool_as(
        &self,
        key: &str,
        name: &str,
        arguments: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let call = serde_json::json!({"name": name, "arguments": arguments});
        self.rest_as(key)
            .send_json(reqwest::Method::POST, "/v1/tools/call", Some(call))
            .await
    }

    /// A tool call as admin that must be answered 200; its `structuredContent`.
    pub async fn tool_result(&self, name: &str, arguments: serde_json::Value) -> serde_json::Value {
        let (status, out) = self.call_tool(name, arguments).await;
        assert_eq!(status, 200, "{name}: {out}");
        out["structuredContent"].clone()
    }

    /// A tool call as admin that must succeed (200, not `isError`); its `structuredContent`.
    pub async fn tool_ok(&self, name: &str, arguments: serde_json::Value) -> serde_json::Value {
        let (status, out) = self.call_tool(name, arguments).await;
        assert_eq!(status, 200, "{out}");
        assert_eq!(out["isError"], false, "{name}: {out}");
        out["structuredContent"].clone()
    }

    /// Creates an API key with `role` as admin and returns its secret.
    pub async fn create_key(&self, name: &str, role: &str) -> String {
        let r = self
            .response(
                reqwest::Method::POST,
                "/v1/api-keys",
                Some(&serde_json::json!({"name": name, "role": role})),
            )
            .await;
        assert_eq!(r.status(), 201);
        let body: serde_json::Value = r.json().await.expect("json");
        body["key"].as_str().expect("key in body").to_owned()
    }

    /// Creates an API key with `role` bound to the security context `context` as admin;
    /// returns (secret, id).
    pub async fn create_bound_key(
        &self,
        name: &str,
        role: &str,
        context: &str,
    ) -> (String, String) {
        let r = self
            .response(
                reqwest::Method::POST,
                "/v1/api-keys",
                Some(&serde_json::json!({"name": name, "role": role, "security_context": context})),
            )
            .await;
        assert_eq!(r.status(), 201);
        let body: serde_json::Value = r.json().await.expect("json");
        (
            body["key"].as_str().expect("key").to_owned(),
            body["id"].as_str().expect("id").to_owned(),
        )
    }

    /// The one number a query without parameters (`SELECT count(*) ...`) answers on this
    /// node's database.
    pub async fn count(&self, sql: &str) -> i64 {
        count(&self.state.pool, sql).await
    }

    /// The one value `sql` (one column of one row, with `$1` bound to `bind`) answers on this
    /// node's database; fails the test, naming the query, when there is none.
    pub async fn one<T, B>(&self, sql: &str, bind: B) -> T
    where
        T: Send + Unpin,
        (T,): for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
        B: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
    {
        one(&self.state.pool, sql, bind).await
    }

    /// Asserts that the number `sql` (`$1` bound to `bind`) answers on this node's database is
    /// `expected`; a failure names the query.
    pub async fn assert_counts<B>(&self, sql: &str, bind: B, expected: i64)
    where
        B: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
    {
        let counted: i64 = self.one(sql, bind).await;
        assert_eq!(counted, expected, "{sql}");
    }

    /// The dispatcher's sandbox that E2B id `e2b_id` stands for now (a resume moves an E2B
    /// sandbox to a new one).
    pub async fn e2b_sandbox(&self, e2b_id: &str) -> String {
        self.one(
            "SELECT sandbox_id::text FROM e2b_sandboxes WHERE e2b_id::text = $1",
            e2b_id,
        )
        .await
    }

    /// The id of the Docker engine this node's dispatcher drives.
    pub fn engine_id(&self) -> String {
        self.state
            .sandboxes
            .dispatcher()
            .expect("dispatcher up")
            .engine_id()
            .to_owned()
    }

    /// A gRPC channel to this instance.
    pub async fn grpc_channel(&self) -> tonic::transport::Channel {
        tonic::transport::Channel::from_shared(format!("http://{}", self.grpc_addr))
            .expect("uri")
            .connect()
            .await
            .expect("grpc connect")
    }

    /// Requests shutdown and waits for the instance to finish draining.
    pub async fn stop(mut self) -> Result<(), orchestrator::app::AppError> {
        self.shutdown.cancel();
        match self.task.take() {
            Some(t) => t.await.expect("server task"),
            None => Ok(()),
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Asks `probe` every `every` until it answers `Ok`, and returns that; fails the test with
/// `what` and the last `Err` (what the probe saw instead) once `within` has passed.
pub async fn eventually<T, Probe, Fut>(
    what: &str,
    within: Duration,
    every: Duration,
    mut probe: Probe,
) -> T
where
    Probe: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = std::time::Instant::now() + within;
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(seen) => assert!(std::time::Instant::now() < deadline, "{what}: {seen}"),
        }
        tokio::time::sleep(every).await;
    }
}

/// A node that knows every tool and runtime, for parsing manifests where what the node has is
/// not the question (schema and manifest-internal checks only).
pub fn any_node() -> orchestrator::manifest::NodeKnowledge<'static> {
    orchestrator::manifest::NodeKnowledge {
        tool_exists: &|_| true,
        runtime_known: &|_, _| true,
        default_command_allowlist: &|_| None,
        runs_in_sandbox: &orchestrator::policy::needs_sandbox,
        runtime_alias: &|_, _| None,
        runtime_versions: &orchestrator::runtimes::versions,
        mcp_servers: &[],
    }
}

/// The one number a query without parameters (`SELECT count(*) ...`) answers on `pool`.
pub async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// How many sandbox rows on `pool` are not destroyed (creating, running or being destroyed).
pub async fn live_sandboxes(pool: &PgPool) -> i64 {
    count(
        pool,
        "SELECT count(*) FROM sandboxes WHERE state IN ('creating', 'running', 'destroying')",
    )
    .await
}

/// The one value `sql` (one column of one row, with `$1` bound to `bind`) answers on `pool`;
/// fails the test, naming the query, when there is none.
pub async fn one<T, B>(pool: &PgPool, sql: &str, bind: B) -> T
where
    T: Send + Unpin,
    (T,): for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
    B: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
{
    sqlx::query_scalar(sql)
        .bind(bind)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The section `name` of a probe script's output: the lines after `== name` up to the next
/// `== ` header; fails the test, with the whole output, when there is none.
pub fn section(out: &str, name: &str) -> String {
    let marker = format!("== {name}\n");
    let start = out
        .find(&marker)
        .unwrap_or_else(|| panic!("no section {name} in:\n{out}"))
        + marker.len();
    let rest = &out[start..];
    rest[..rest.find("\n== ").unwrap_or(rest.len())].to_owned()
}

/// Runs the node's own CLI (the `orchestrator` binary) with `args` and `env`, without
/// `DATABASE_URL`; it must succeed; what it printed, as JSON.
pub async fn cli_json(args: &[String], env: &[(&str, &str)]) -> serde_json::Value {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args(args)
        .envs(env.iter().copied())
        .env_remove("DATABASE_URL")
        .output()
        .await
        .expect("the orchestrator binary runs");
    json_of(out, &format!("{args:?}"))
}

/// What a finished command printed, as JSON; fails the test with `failed` (what failed, and
/// what it needs) and the command's stderr when it did not succeed.
pub fn json_of(out: std::process::Output, failed: &str) -> serde_json::Value {
    serde_json::from_str(&succeeded(out, failed)).expect("one JSON report")
}

/// What a finished command printed on stdout; fails the test with `failed` (what failed) and
/// the command's stderr when it did not succeed.
pub fn succeeded(out: std::process::Output, failed: &str) -> String {
    assert!(
        out.status.success(),
        "{failed}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What `docker -H <host> <args>` did (a second engine's CLI); fails the test when the CLI
/// cannot run.
pub fn docker_on(host: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new("docker")
        .arg("-H")
        .arg(host)
        .args(args)
        .output()
        .expect("docker runs")
}

/// The value of the series `series` (its name and labels as `/metrics` prints them) in the
/// Prometheus text `metrics`; 0 when the series is not there.
pub fn metric(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_default()
}

/// `docker <args>`: whether it succeeded, and what it printed on stdout, trimmed.
pub fn docker_out(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .expect("docker CLI runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
    )
}

/// The non-empty lines `docker <args>` printed (empty when it printed nothing).
pub fn docker_lines(args: &[&str]) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .expect("docker CLI runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect()
}

/// A node API key in the form E2B's SDK demands (`e2b_` + hex), which the node reads back.
pub fn e2b_key(key: &str) -> String {
    orchestrator::api::e2b::keys::to_e2b_form(key)
}

/// A request to E2B's control API (`/e2b{path}`) as the holder of `key` (sent in E2B's form).
pub fn e2b_control(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    key: &str,
) -> reqwest::RequestBuilder {
    app.http
        .request(method, format!("{}/e2b{path}", app.http_base))
        .header("X-API-KEY", e2b_key(key))
}

/// A `base` sandbox made through E2B's control API as `key` (raw HTTP, `secure`, 300 s):
/// (E2B id, envd access token, the dispatcher's sandbox id).
pub async fn e2b_base_sandbox(app: &TestApp, key: &str) -> (String, String, String) {
    let r = e2b_control(app, reqwest::Method::POST, "/sandboxes", key)
        .json(&serde_json::json!({"templateID": "base", "timeout": 300, "secure": true}))
        .send()
        .await
        .expect("request sent");
    assert_eq!(r.status(), 201);
    let body: serde_json::Value = r.json().await.expect("json");
    let e2b_id = body["sandboxID"].as_str().expect("sandboxID").to_owned();
    let token = body["envdAccessToken"]
        .as_str()
        .expect("envdAccessToken")
        .to_owned();
    let current = app.e2b_sandbox(&e2b_id).await;
    (e2b_id, token, current)
}
