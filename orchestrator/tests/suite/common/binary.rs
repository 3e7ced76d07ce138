//! The orchestrator binary as a child process, for tests that need real signals (SIGTERM) and
//! real process output (stderr that is a pipe, not a terminal).

use std::process::Stdio;
use std::time::{Duration, Instant};

use super::{executor_bin, TestDb, TEST_ADMIN_KEY};

/// A free loopback port (bound and released; good enough for a test's own listener).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A started `orchestrator serve` on `db`, ready (its `/health/ready` answered 200).
pub struct Node {
    /// The child process.
    pub child: tokio::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its stderr, read as it comes (a full pipe would block the node's logging threads).
    stderr: Option<tokio::task::JoinHandle<String>>,
}

/// Starts the binary on `db` with extra environment `env`; waits until it is ready.
pub async fn start(db: &TestDb, env: &[(&str, &str)], capture_stderr: bool) -> Node {
    start_on(db, free_port(), env, capture_stderr).await
}

/// [`start`] on HTTP port `http`: what a test that restarts a node where its clients expect it
/// needs. `env` may set `ORCHESTRATOR_CONFIG` (it is unset otherwise).
pub async fn start_on(db: &TestDb, http: u16, env: &[(&str, &str)], capture_stderr: bool) -> Node {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"));
    command
        .env_remove("ORCHESTRATOR_CONFIG")
        .env("DATABASE_URL", &db.url)
        .env("ORCHESTRATOR_ADMIN_KEY", TEST_ADMIN_KEY)
        .env("ORCHESTRATOR__SANDBOX__EXECUTOR_PATH", executor_bin())
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .args([
            "serve",
            "--http",
            &format!("127.0.0.1:{http}"),
            "--grpc",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .stdout(Stdio::null())
        .stderr(if capture_stderr {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .kill_on_drop(true);
    let mut child = command.spawn().expect("orchestrator starts");
    let stderr = child.stderr.take().map(|mut pipe| {
        tokio::spawn(async move {
            let mut text = String::new();
            let _ = tokio::io::AsyncReadExt::read_to_string(&mut pipe, &mut text).await;
            text
        })
    });
    let base = format!("http://127.0.0.1:{http}");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("http client");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = client.get(format!("{base}/health/ready")).send().await {
            if r.status() == 200 {
                return Node {
                    child,
                    base,
                    stderr,
                };
            }
        }
        assert!(Instant::now() < deadline, "orchestrator never became ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Node {
    /// Sends SIGTERM and waits (bounded) for a clean exit; returns its stderr if captured.
    /// The wait covers the drain and the destruction of the node's sandboxes.
    pub async fn terminate(mut self) -> String {
        let pid = self.child.id().expect("child has a pid").to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "SIGTERM delivered");
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .expect("the node exits after SIGTERM")
            .expect("wait for the node");
        assert_eq!(status.code(), Some(0), "graceful exit");
        match self.stderr.take() {
            Some(reader) => reader.await.expect("stderr reader"),
            None => String::new(),
        }
    }
}
