//! Test harness: a fresh PostgreSQL database per test, the real Docker engine, the real executor.
//!
//! Nothing is mocked and nothing is skipped: a missing `DATABASE_URL`, Docker engine, executor
//! binary or test image fails the test with the command that provides it. Every test gets its own
//! database, hence its own scope label, so tests run in parallel without their reapers touching
//! each other's sandboxes. Dropping a [`TestEnv`] (also on panic) removes every container and
//! volume of its scope and drops its database.

#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use bollard::query_parameters::{
    ListContainersOptionsBuilder, ListVolumesOptionsBuilder, RemoveContainerOptionsBuilder,
};
use bollard::Docker;
use dispatcher::{labels, Dispatcher, DispatcherConfig, DockerEngine};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use uuid::Uuid;

/// The image every test sandbox runs.
pub const IMAGE: &str = "aegis-runtime/busybox:1";

const EXECUTOR_BUILD: &str = "CARGO_TARGET_DIR=target/executor \
    RUSTFLAGS=\"-C target-feature=+crt-static\" cargo build --release -p sandbox-executor \
    --target x86_64-unknown-linux-gnu at the repository's root, then export \
    SANDBOX_EXECUTOR_BIN=<root>/target/executor/x86_64-unknown-linux-gnu/release/sandbox-executor";

/// Awaits `fut` for at most `secs` seconds; panics naming `what` otherwise.
pub async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {secs} s: {what}"),
    }
}

/// Polls `check` every 100 ms until it returns true, for at most `secs` seconds.
pub async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if within(secs, what, check()).await {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("not true after {secs} s: {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The engine's list filter for objects carrying all the given labels (`key=value`).
fn label_filters(labels: &[&str]) -> HashMap<String, Vec<String>> {
    HashMap::from([(
        "label".to_owned(),
        labels.iter().map(|l| (*l).to_owned()).collect::<Vec<_>>(),
    )])
}

/// One test's database, engine and executor.
pub struct TestEnv {
    pub pg: PgPool,
    pub db_name: String,
    admin: PgConnectOptions,
    pub engine: DockerEngine,
    pub docker: Docker,
    pub executor: PathBuf,
    /// Containers the test made outside the dispatcher (removed at the end).
    pub extra_containers: Mutex<Vec<String>>,
    scope: Mutex<Option<String>>,
}

impl TestEnv {
    /// Creates the database, checks Docker, the image and the executor.
    pub async fn new() -> TestEnv {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "dispatcher=info".into()),
            )
            .with_test_writer()
            .try_init();

        let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
            panic!(
                "DATABASE_URL is not set: these tests need a PostgreSQL admin URL, e.g. \
                 DATABASE_URL=postgres://postgres@127.0.0.1:55432/postgres"
            )
        });
        let executor = PathBuf::from(std::env::var("SANDBOX_EXECUTOR_BIN").unwrap_or_else(|_| {
            panic!(
                "SANDBOX_EXECUTOR_BIN is not set: build the static executor with {EXECUTOR_BUILD}"
            )
        }));
        assert!(
            executor.is_file(),
            "SANDBOX_EXECUTOR_BIN={} does not exist: build it with {EXECUTOR_BUILD}",
            executor.display()
        );

        let engine = DockerEngine::connect(None).expect("Docker client could not be set up");
        if let Err(e) = engine.ping(Duration::from_secs(5)).await {
            panic!("these tests need a running Docker engine (is dockerd up, may this user use /var/run/docker.sock?): {e}");
        }
        let docker = engine
            .client()
            .clone()
            .negotiate_version()
            .await
            .expect("Docker API version negotiation failed");
        if docker.inspect_image(IMAGE).await.is_err() {
            panic!(
                "image {IMAGE} is missing: build it with `runtime-images/build.sh --only busybox`"
            );
        }

        let admin = PgConnectOptions::from_str(&url)
            .unwrap_or_else(|e| panic!("DATABASE_URL is not a PostgreSQL URL: {e}"))
            .disable_statement_logging();
        let db_name = format!("test_{}", Uuid::new_v4().simple());
        let mut conn = within(20, "connecting to DATABASE_URL", admin.connect())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to DATABASE_URL ({url}): {e}"));
        sqlx::query(&format!("CREATE DATABASE \"{db_name}\""))
            .execute(&mut conn)
            .await
            .expect("CREATE DATABASE failed");
        let _ = conn.close().await;

        let pg = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(admin.clone().database(&db_name))
            .await
            .expect("connecting to the test database failed");
        let migrations = Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
        let migrator = sqlx::migrate::Migrator::new(migrations)
            .await
            .expect("reading ../migrations failed");
        within(60, "applying migrations", migrator.run(&pg))
            .await
            .expect("applying migrations failed");

        TestEnv {
            pg,
            db_name,
            admin,
            engine,
            docker,
            executor,
            extra_containers: Mutex::new(Vec::new()),
            scope: Mutex::new(None),
        }
    }

    /// Registers an orchestrator instance with a fresh heartbeat.
    pub async fn new_instance(&self) -> Uuid {
        let id = Uuid::new_v4();
        self.on_instance(
            "INSERT INTO node_instances (id, hostname, version) VALUES ($1, 'test', 'test')",
            id,
        )
        .await;
        id
    }

    /// Runs `sql` with `$1` bound to `instance` (an instance's row, made or changed).
    pub async fn on_instance(&self, sql: &str, instance: Uuid) {
        sqlx::query(sql)
            .bind(instance)
            .execute(&self.pg)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Defaults for tests: short dead_after, no pool, long periodic reaper (tests call reap()).
    pub fn config(&self) -> DispatcherConfig {
        let mut config = DispatcherConfig::new(&self.executor);
        config.dead_after = Duration::from_secs(1);
        config.reap_interval = Duration::from_secs(3600);
        config.helper_image = Some(IMAGE.to_owned());
        // The socket channel when the run asks for it (as the orchestrator's setting does).
        config.channel_dir = std::env::var_os("SANDBOX_CHANNEL_DIR")
            .filter(|dir| !dir.is_empty())
            .map(std::path::PathBuf::from);
        config
    }

    /// Starts a dispatcher for `instance`.
    pub async fn start(&self, instance: Uuid, config: DispatcherConfig) -> Dispatcher {
        let dispatcher = within(
            60,
            "Dispatcher::start",
            Dispatcher::start(self.engine.clone(), self.pg.clone(), instance, config),
        )
        .await
        .expect("Dispatcher::start failed");
        *self.scope.lock().unwrap() = Some(dispatcher.scope().to_owned());
        dispatcher
    }

    /// A new environment with one instance and its dispatcher running on the test defaults;
    /// (the environment, the instance, its dispatcher).
    pub async fn with_dispatcher() -> (TestEnv, Uuid, Dispatcher) {
        let env = TestEnv::new().await;
        let (instance, dispatcher) = env.started().await;
        (env, instance, dispatcher)
    }

    /// A new instance and its dispatcher with the test defaults ([`TestEnv::config`]);
    /// (the instance, its dispatcher).
    pub async fn started(&self) -> (Uuid, Dispatcher) {
        let (instance, dispatcher, _) = self.started_with(|_| {}).await;
        (instance, dispatcher)
    }

    /// [`TestEnv::started`] with the defaults changed by `tune`; (the instance, its
    /// dispatcher, the configuration it runs with, for the next instance).
    pub async fn started_with(
        &self,
        tune: impl FnOnce(&mut DispatcherConfig),
    ) -> (Uuid, Dispatcher, DispatcherConfig) {
        let instance = self.new_instance().await;
        let mut config = self.config();
        tune(&mut config);
        let dispatcher = self.start(instance, config.clone()).await;
        (instance, dispatcher, config)
    }

    /// Makes `instance` look dead: its heartbeat an hour old (what a `kill -9` leaves).
    pub async fn silence(&self, instance: Uuid) {
        self.on_instance(
            "UPDATE node_instances SET heartbeat_at = now() - interval '1 hour' WHERE id = $1",
            instance,
        )
        .await;
    }

    /// Asserts that no container and no volume carries `label` (`key=value`).
    pub async fn assert_nothing_with(&self, label: &str) {
        let containers = self.containers_with(&[label]).await;
        assert!(
            containers.is_empty(),
            "container left behind: {containers:?}"
        );
        let volumes = self.volumes_with(&[label]).await;
        assert!(volumes.is_empty(), "volume left behind: {volumes:?}");
    }

    /// What Docker says of the container of sandbox `id`.
    pub async fn inspect(
        &self,
        id: dispatcher::SandboxId,
    ) -> bollard::models::ContainerInspectResponse {
        within(
            10,
            "inspect",
            self.docker
                .inspect_container(&format!("aegis-sbx-{id}"), None),
        )
        .await
        .expect("inspect")
    }

    /// Names of containers (any status) carrying all the given labels (`key=value`).
    pub async fn containers_with(&self, labels: &[&str]) -> Vec<String> {
        within(
            20,
            "listing containers",
            self.docker.list_containers(Some(
                ListContainersOptionsBuilder::new()
                    .all(true)
                    .filters(&label_filters(labels))
                    .build(),
            )),
        )
        .await
        .expect("listing containers failed")
        .into_iter()
        .filter_map(|c| c.names.and_then(|n| n.into_iter().next()))
        .map(|n| n.trim_start_matches('/').to_owned())
        .collect()
    }

    /// Names of volumes carrying all the given labels.
    pub async fn volumes_with(&self, labels: &[&str]) -> Vec<String> {
        within(
            20,
            "listing volumes",
            self.docker.list_volumes(Some(
                ListVolumesOptionsBuilder::new()
                    .filters(&label_filters(labels))
                    .build(),
            )),
        )
        .await
        .expect("listing volumes failed")
        .volumes
        .unwrap_or_default()
        .into_iter()
        .map(|v| v.name)
        .collect()
    }

    /// True when a container of that name exists (any status).
    pub async fn container_exists(&self, name: &str) -> bool {
        self.docker.inspect_container(name, None).await.is_ok()
    }

    /// True when a volume of that name exists.
    pub async fn volume_exists(&self, name: &str) -> bool {
        self.docker.inspect_volume(name).await.is_ok()
    }

    /// The row state of a sandbox.
    pub async fn row_state(&self, id: dispatcher::SandboxId) -> (String, Option<String>) {
        sqlx::query_as("SELECT state, reason FROM sandboxes WHERE id = $1")
            .bind(id.0)
            .fetch_one(&self.pg)
            .await
            .expect("reading a sandbox row failed")
    }
}

/// `label=value` filter text.
pub fn label(key: &str, value: impl std::fmt::Display) -> String {
    format!("{key}={value}")
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        let scope = self.scope.lock().map(|s| s.clone()).unwrap_or(None);
        let extra = self
            .extra_containers
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default();
        let docker = self.docker.clone();
        let admin = self.admin.clone();
        let db_name = self.db_name.clone();
        // Drop cannot await: clean up on a thread with its own runtime, and wait for it.
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("cleanup runtime");
            rt.block_on(async move {
                let force = RemoveContainerOptionsBuilder::new().force(true).build();
                let mut containers = extra;
                let mut volumes = Vec::new();
                if let Some(scope) = scope {
                    let filters =
                        HashMap::from([("label".to_owned(), vec![label(labels::SCOPE, &scope)])]);
                    if let Ok(list) = docker
                        .list_containers(Some(
                            ListContainersOptionsBuilder::new()
                                .all(true)
                                .filters(&filters)
                                .build(),
                        ))
                        .await
                    {
                        containers.extend(list.into_iter().filter_map(|c| c.id));
                    }
                    if let Ok(list) = docker
                        .list_volumes(Some(
                            ListVolumesOptionsBuilder::new().filters(&filters).build(),
                        ))
                        .await
                    {
                        volumes
                            .extend(list.volumes.unwrap_or_default().into_iter().map(|v| v.name));
                    }
                }
                for c in containers {
                    let _ = docker.remove_container(&c, Some(force.clone())).await;
                }
                for v in volumes {
                    let _ = docker
                        .remove_volume(&v, None::<bollard::query_parameters::RemoveVolumeOptions>)
                        .await;
                }
                if let Ok(mut conn) = admin.connect().await {
                    let _ = sqlx::query(&format!(
                        "DROP DATABASE IF EXISTS \"{db_name}\" WITH (FORCE)"
                    ))
                    .execute(&mut conn)
                    .await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// An `fs.write` of `content` at `path` (parents made), as the tests write files.
pub fn write(path: &str, content: &str) -> dispatcher::protocol::Op {
    use dispatcher::protocol::{Encoding, Op, WriteParams};
    Op::FsWrite(WriteParams {
        path: path.to_owned(),
        content: content.to_owned(),
        encoding: Encoding::Utf8,
        create_dirs: true,
        append: false,
        metadata: Default::default(),
        user: Default::default(),
    })
}

/// An `fs.read` of the whole file at `path`.
pub fn read(path: &str) -> dispatcher::protocol::Op {
    use dispatcher::protocol::{Op, ReadParams};
    Op::FsRead(ReadParams {
        path: path.to_owned(),
        ..ReadParams::default()
    })
}

/// A `cmd.run` of `argv` stopped after `timeout_ms`, with 64 KiB per stream and a 500 ms grace.
pub fn run_for(argv: &[&str], timeout_ms: u64) -> dispatcher::protocol::Op {
    use dispatcher::protocol::{ExecGrant, Op, RunParams};
    Op::CmdRun(RunParams {
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        cwd: None,
        env: Default::default(),
        timeout_ms,
        grace_ms: Some(500),
        max_stdout_bytes: 64 * 1024,
        max_stderr_bytes: 64 * 1024,
        exec: ExecGrant::Any,
        user: Default::default(),
    })
}

/// The `ok` result of a response as `T`; panics with the request's id and the executor's error
/// otherwise.
pub fn ok<T: serde::de::DeserializeOwned>(response: dispatcher::protocol::Response) -> T {
    let id = response.id;
    match response.into_result() {
        Ok(value) => serde_json::from_value(value).expect("result has the documented shape"),
        Err(body) => panic!("request {id} failed: {}: {}", body.kind, body.message),
    }
}

/// Creates the sandbox of `spec` through `d` (within 60 s), which must succeed; its id.
pub async fn created(d: &Dispatcher, spec: dispatcher::SandboxSpec) -> dispatcher::SandboxId {
    within(60, "create", d.create(spec)).await.expect("create")
}

/// The `ok` result of `op` in sandbox `id` through `d` (called within `secs`, named `what` in
/// a failure), as `T`.
pub async fn called<T: serde::de::DeserializeOwned>(
    d: &Dispatcher,
    id: dispatcher::SandboxId,
    secs: u64,
    what: &str,
    op: dispatcher::protocol::Op,
) -> T {
    let response = within(secs, what, d.call(id, op))
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    ok(response)
}

/// An instance counts as alive for two minutes without a heartbeat: long enough for the next
/// instance to adopt its sandboxes rather than reap them.
pub fn adoptable(config: &mut DispatcherConfig) {
    config.dead_after = Duration::from_secs(120);
}

/// The spec of a sandbox on the test image for an execution `owner`.
pub fn spec(owner: &str) -> dispatcher::SandboxSpec {
    dispatcher::SandboxSpec::new(
        IMAGE,
        dispatcher::Owner::new(dispatcher::OwnerKind::Execution, owner),
    )
}

/// What `d` adopted of the sandboxes of the instance `previous` (within 30 s).
pub async fn adopted(d: &Dispatcher, previous: Uuid) -> dispatcher::AdoptReport {
    within(30, "adopt", d.adopt(previous)).await.expect("adopt")
}

/// Destroys each of `ids` through `d`, then shuts `d` down: the end of a test.
pub async fn finish(d: &Dispatcher, ids: &[dispatcher::SandboxId]) {
    for id in ids {
        destroyed(d, *id).await;
    }
    d.shutdown().await;
}

/// Destroys sandbox `id` through `d` (within 30 s), which must succeed.
pub async fn destroyed(d: &Dispatcher, id: dispatcher::SandboxId) {
    within(30, "destroy", d.destroy(id)).await.expect("destroy");
}
