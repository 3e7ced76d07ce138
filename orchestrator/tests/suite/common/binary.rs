//! The orchestrator binary as a child process, for tests that need real signals (SIGTERM) and
//! real process output (stderr that is a pipe, not a terminal).

use std::process::Stdio;
use std::sync::{Arc, Mutex};
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
    /// Its stderr so far, read as it comes (a full pipe would block the node's logging threads):
    /// what [`Node::terminate`] returns, and what a start that fails shows.
    stderr: Arc<Mutex<String>>,
    /// The reader of that pipe; ends when the node exits.
    reader: tokio::task::JoinHandle<()>,
}

/// How many times [`start`] tries fresh ports when the node exits because one was taken
/// (a port is free when chosen, but another process may bind it before the node does).
const PORT_TRIES: usize = 3;

/// How long a node may take to become ready: the migrations of a new database, the executor's
/// installation and the first Docker calls, on a machine every core of which may be busy.
const READY_WITHIN: Duration = Duration::from_secs(120);

/// Starts the binary on `db` with extra environment `env`; waits until it is ready. It picks
/// the HTTP and gRPC ports, and picks again when the node could not bind the ones it chose.
pub async fn start(db: &TestDb, env: &[(&str, &str)]) -> Node {
    start_fresh(db, || {
        env.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
    .await
}

/// [`start`] with an environment made anew for each try, for nodes that listen on more ports
/// of the test's choosing (a peer listener): `env` picks them again.
pub async fn start_fresh(db: &TestDb, env: impl Fn() -> Vec<(String, String)>) -> Node {
    let mut tries = 0;
    loop {
        tries += 1;
        let pairs = env();
        let borrowed: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        match launch(db, free_port(), &borrowed).await {
            Ok(node) => return node,
            Err(e) if tries < PORT_TRIES && e.output.contains("Address already in use") => {
                eprintln!("a port the test chose was taken before the node bound it; again");
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// [`start`] on HTTP port `http`: what a test that restarts a node where its clients expect it
/// needs. `env` may set `ORCHESTRATOR_CONFIG` (it is unset otherwise).
pub async fn start_on(db: &TestDb, http: u16, env: &[(&str, &str)]) -> Node {
    launch(db, http, env)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A node that ended before it was ready, with what it printed.
#[derive(Debug)]
struct Exited {
    status: String,
    output: String,
}

impl std::fmt::Display for Exited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the orchestrator exited ({}) before it was ready; its stderr:\n{}",
            self.status, self.output
        )
    }
}

async fn launch(db: &TestDb, http: u16, env: &[(&str, &str)]) -> Result<Node, Exited> {
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
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("orchestrator starts");
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut pipe = child.stderr.take().expect("stderr is piped");
    let reader = tokio::spawn({
        let stderr = stderr.clone();
        async move {
            let mut chunk = vec![0u8; 8192];
            while let Ok(n) = tokio::io::AsyncReadExt::read(&mut pipe, &mut chunk).await {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&chunk[..n]).into_owned();
                stderr.lock().expect("stderr buffer").push_str(&text);
            }
        }
    });
    let mut node = Node {
        child,
        base: format!("http://127.0.0.1:{http}"),
        stderr,
        reader,
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("http client");
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        let last = match client
            .get(format!("{}/health/ready", node.base))
            .send()
            .await
        {
            Ok(r) if r.status() == 200 => return Ok(node),
            Ok(r) => format!("{}: {}", r.status(), r.text().await.unwrap_or_default()),
            Err(e) => e.to_string(),
        };
        if let Ok(Some(status)) = node.child.try_wait() {
            // Everything it printed is in the buffer once the pipe is at its end.
            let _ = (&mut node.reader).await;
            return Err(Exited {
                status: status.to_string(),
                output: node.output(),
            });
        }
        assert!(
            Instant::now() < deadline,
            "the orchestrator was not ready within {READY_WITHIN:?}; its last readiness answer: \
             {last}; its stderr so far:\n{}",
            node.output()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends `sig` (`-KILL`, `-TERM`, `-STOP`, ...) to the running `child`; fails the test when it
/// is not delivered.
pub fn send_signal(child: &tokio::process::Child, sig: &str) {
    let pid = child.id().expect("the child is running").to_string();
    let sent = std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .expect("kill runs");
    assert!(sent.success(), "{sig} delivered to {pid}");
}

/// Kills the running `child` (SIGKILL, a crash) and waits until it is gone.
pub async fn crash(child: &mut tokio::process::Child) {
    send_signal(child, "-KILL");
    child.wait().await.expect("the killed child is reaped");
}

impl Node {
    /// Sends SIGTERM and waits (bounded) for a clean exit; returns what it printed on stderr.
    /// The wait covers the drain and the destruction of the node's sandboxes.
    pub async fn terminate(mut self) -> String {
        send_signal(&self.child, "-TERM");
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .expect("the node exits after SIGTERM")
            .expect("wait for the node");
        assert_eq!(status.code(), Some(0), "graceful exit");
        let _ = (&mut self.reader).await;
        self.output()
    }

    /// What the node printed on stderr so far.
    pub fn output(&self) -> String {
        self.stderr.lock().expect("stderr buffer").clone()
    }
}
