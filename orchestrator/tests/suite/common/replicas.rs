//! Replicas as real processes on one database (`orchestrator serve`, see [`super::binary`]),
//! for the tests of issue 23 that need real signals: SIGKILL, SIGSTOP/SIGCONT, SIGTERM.
//!
//! Each replica has a peer listener of its own, the shared cluster secret, a short
//! `dead_after` (3 s) and lease (2 s). One operator agent (`survivor`, busybox) serves the
//! sandboxes these tests make.

use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use super::binary::{self, free_port, Node};
use orchestrator::config::NodeConfig;

use super::agent::AgentManifest;
use super::rest::Rest;
use super::{TestDb, TEST_ADMIN_KEY};

/// The cluster secret every replica of these tests shares.
pub const SECRET: &str = "the-cluster-secret-shared-by-all-replicas";

/// One replica with extra environment `extra` (later entries win). Its ports are chosen again
/// when one was taken before it bound it.
pub async fn replica(db: &TestDb, extra: &[(&str, &str)]) -> Node {
    binary::start_fresh(db, || {
        let mut env = vec![
            (
                "ORCHESTRATOR__SANDBOX__DEAD_AFTER_SECS".to_owned(),
                "3".to_owned(),
            ),
            (
                "ORCHESTRATOR__SANDBOX__LEASE_SECS".to_owned(),
                "2".to_owned(),
            ),
            (
                "ORCHESTRATOR__CLUSTER__LISTEN".to_owned(),
                format!("127.0.0.1:{}", free_port()),
            ),
            (
                "ORCHESTRATOR__CLUSTER__SECRET".to_owned(),
                SECRET.to_owned(),
            ),
        ];
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        env
    })
    .await
}

/// The environment of a replica whose sandboxes outlive its stop (a rolling restart).
pub const KEEP: (&str, &str) = ("ORCHESTRATOR__SHUTDOWN__SANDBOXES", "keep");

/// An HTTP client with a generous timeout (a loaded machine), never a hang.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("http client")
}

/// The agent the sandboxes of these tests are made for.
pub fn agent() -> String {
    AgentManifest::new("survivor")
        .instruction("Work in the workspace.")
        .tools(&["cmd.run", "fs.read", "fs.write"])
        .cmd(&["cat", "echo", "sleep"], 30, "")
        .filesystem(&["/workspace"], &["/workspace"])
        .yaml()
}

/// The REST API of `node` as the administrator, with [`client`].
pub fn rest(node: &Node) -> Rest {
    Rest::new(client(), &node.base, TEST_ADMIN_KEY)
}

/// Deploys [`agent`] through `node` (once per database).
pub async fn deploy(node: &Node) {
    rest(node).deployed("/v1/agents", &agent()).await;
}

/// Makes an operator sandbox of the deployed agent through `node`; its id.
pub async fn make_sandbox(node: &Node) -> String {
    let (status, body) = rest(node)
        .send(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"agent": "survivor"})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    body["sandbox_id"].as_str().expect("sandbox id").to_owned()
}

/// Deploys the agent and makes an operator sandbox through `node`; its id.
pub async fn sandbox_on(node: &Node) -> String {
    deploy(node).await;
    make_sandbox(node).await
}

/// One tool call into `sandbox` through `base`: (HTTP status, body). A replica that does not
/// answer at all is status 0 with the error as the body.
pub async fn call(base: &str, sandbox: &str, name: &str, arguments: Value) -> (u16, Value) {
    let sent = client()
        .post(format!("{base}/v1/tools/call"))
        .bearer_auth(TEST_ADMIN_KEY)
        .json(&json!({"name": name, "arguments": arguments, "sandbox_id": sandbox}))
        .send()
        .await;
    match sent {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.json().await.unwrap_or(Value::Null))
        }
        Err(e) => (0, Value::String(format!("{base} did not answer: {e}"))),
    }
}

/// The tool's result when the call succeeded.
pub fn ok_result(answer: &(u16, Value)) -> Option<&Value> {
    (answer.0 == 200 && answer.1["isError"] == false).then(|| &answer.1["structuredContent"])
}

/// [`call`] that must succeed: its result, or the test fails with the whole answer.
pub async fn call_ok(base: &str, sandbox: &str, name: &str, arguments: Value) -> Value {
    let answer = call(base, sandbox, name, arguments).await;
    match ok_result(&answer) {
        Some(result) => result.clone(),
        None => panic!("{name} into {sandbox} through {base} failed: {answer:?}"),
    }
}

/// What `fs.read` of `path` in `sandbox` through `base` gives as its content; the call must
/// succeed.
pub async fn read_file(base: &str, sandbox: &str, path: &str) -> Value {
    let read = call_ok(
        base,
        sandbox,
        "fs.read",
        serde_json::json!({ "path": path }),
    )
    .await;
    read["content"].clone()
}

/// `fs.write` of `content` to `path` in `sandbox` through `base`, which must succeed.
pub async fn write_file(base: &str, sandbox: &str, path: &str, content: &str) {
    let arguments = serde_json::json!({ "path": path, "content": content });
    call_ok(base, sandbox, "fs.write", arguments).await;
}

/// Destroys `sandbox` through `base` as the administrator; the answer must be a success.
pub async fn destroyed(base: &str, sandbox: &str) {
    let (status, body) = Rest::new(client(), base, TEST_ADMIN_KEY)
        .send(Method::DELETE, &format!("/v1/sandboxes/{sandbox}"), None)
        .await;
    assert!((200..300).contains(&status), "{body}");
}

/// `(instance_id, epoch, state)` of a sandbox's row.
pub async fn holder(pool: &sqlx::PgPool, sandbox: &str) -> (uuid::Uuid, i64, String) {
    sqlx::query_as("SELECT instance_id, epoch, state FROM sandboxes WHERE id = $1::uuid")
        .bind(sandbox)
        .fetch_one(pool)
        .await
        .expect("sandbox row")
}

/// Sends `sig` (`-KILL`, `-STOP`, ...) to the replica's process.
pub fn signal(node: &Node, sig: &str) {
    binary::send_signal(&node.child, sig);
}

/// The audit chain, verified in full through `base`, is valid.
pub async fn audit_valid(base: &str) {
    let verify = Rest::new(client(), base, TEST_ADMIN_KEY)
        .get_value("/v1/audit/verify?full=true")
        .await;
    assert_eq!(verify["valid"], true, "{verify}");
}

/// Destroys `sandbox` through `base`; then nothing of it is left in Docker (`docker` runs the
/// CLI against its engine).
pub async fn destroy_leaving_nothing(base: &str, sandbox: &str, docker: &[&str]) {
    destroyed(base, sandbox).await;
    let label = format!("label=org.aegis.sandbox={sandbox}");
    let lines = |args: &[&str]| {
        let mut all: Vec<&str> = docker.to_vec();
        all.extend_from_slice(args);
        super::docker_lines(&all)
    };
    assert!(lines(&["ps", "-aq", "--filter", &label]).is_empty());
    assert!(lines(&["volume", "ls", "-q", "--filter", &label]).is_empty());
}

/// The config of an in-process replica (`TestApp`) on `db`: with `secret`, a peer listener on a
/// free port and that cluster secret; without, no peer listener.
pub fn in_process(db: &TestDb, secret: Option<&str>) -> NodeConfig {
    let mut config = super::test_config(&db.url);
    if let Some(secret) = secret {
        config.cluster.listen = Some("127.0.0.1:0".parse().expect("addr"));
        config.cluster.secret = Some(secret.to_owned());
    }
    config
}

fn script() -> String {
    format!(
        "{}/../scripts/lib/second_engine.sh",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// One second engine at a time in this test binary: a scenario's stop would pull it from
/// under another's.
static SECOND_ENGINE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The second engine, stopped (containers, networks, daemon, bridge, rules) when dropped.
pub struct SecondEngine {
    /// Its address, `unix://...`.
    pub host: String,
    /// Held while it runs (released after `Drop` stopped it).
    _alone: std::sync::MutexGuard<'static, ()>,
}

impl SecondEngine {
    /// Starts it with the busybox runtime loaded; `None` (with the script's reason printed)
    /// when a second daemon cannot run on this machine.
    pub fn start() -> Option<SecondEngine> {
        // A scenario that failed while holding it still stopped it (`Drop`).
        let alone = SECOND_ENGINE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = Command::new("bash")
            .args([script().as_str(), "start", "aegis-runtime/busybox:1"])
            .output()
            .expect("bash runs");
        if !out.status.success() {
            eprintln!(
                "SKIPPED: a second Docker daemon cannot start on this machine:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        let host = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(
            host.starts_with("unix://"),
            "the script prints its address: {host}"
        );
        Some(SecondEngine {
            host,
            _alone: alone,
        })
    }

    /// [`SecondEngine::start`] for a scenario that must not be skipped: fails loudly.
    pub fn start_or_fail() -> SecondEngine {
        Self::start().expect(
            "the second Docker engine must start on this machine (scripts/lib/second_engine.sh; \
             its reason is printed above)",
        )
    }

    /// `docker -H <second engine> args...`, its non-empty lines.
    pub fn lines(&self, args: &[&str]) -> Vec<String> {
        let out = super::docker_on(&self.host, args);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for SecondEngine {
    fn drop(&mut self) {
        let out = Command::new("bash")
            .args([script().as_str(), "stop"])
            .output();
        if let Ok(out) = out {
            if !out.status.success() {
                eprintln!(
                    "second engine did not stop cleanly:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

/// A SEAL session used through each replica of `through` (a file name and the replica's base
/// URL) in turn: each writes `/workspace/{name}.txt`, then reads back every file written so far
/// (`written`) with one `cat`. Without `patience` every write must succeed at once. With it, a
/// write may be refused (the holder of the session's sandbox was just killed) only with a clear
/// error naming the instance, each answer within 5 s, and the session goes on within `patience`.
pub async fn seal_round(
    saved: &aegis_cli::seal_client::SavedSession,
    through: &[(String, String)],
    written: &mut Vec<String>,
    patience: Option<Duration>,
) {
    use aegis_cli::seal_client::{SealClient, Transport};
    for (name, base) in through {
        let mut continued = saved.clone();
        continued.transport = Transport::Http(base.clone());
        let session = SealClient::from_saved(&continued).expect("session continued");
        let path = format!("/workspace/{name}.txt");
        let started = Instant::now();
        loop {
            let asked = Instant::now();
            let w = session
                .call_tool("fs.write", json!({"path": path, "content": name}))
                .await
                .expect("answered");
            let Some(patience) = patience else {
                assert_eq!(w["isError"], false, "{name}: {w}");
                break;
            };
            assert!(asked.elapsed() < Duration::from_secs(5), "{w}");
            if w["isError"] == false {
                break;
            }
            assert!(w.to_string().contains("instance"), "a clear error: {w}");
            assert!(
                started.elapsed() < patience,
                "the session never went on: {w}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        written.push(path);
        let r = session
            .call_tool("cmd.run", json!({"command": "cat", "args": written}))
            .await
            .expect("answered");
        assert_eq!(r["isError"], false, "{name}: {r}");
        let expected: String = written
            .iter()
            .map(|p| p.trim_start_matches("/workspace/").trim_end_matches(".txt"))
            .collect();
        assert_eq!(r["structuredContent"]["stdout"], expected, "{name}: {r}");
    }
}

/// The `ops` security context of the tests that continue one SEAL session through every
/// replica: busybox, the file tools under `/workspace` and `cat`, for workloads `test-*`.
pub fn ops_context() -> serde_json::Value {
    serde_json::json!({
        "name": "ops",
        "description": "a session used through every replica",
        "runtime": {"language": "busybox", "version": "1"},
        "capabilities": [
            {"tool_pattern": "fs.*", "path_allowlist": ["/workspace"]},
            {"tool_pattern": "cmd.run", "command_allowlist": ["cat"]}],
        "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}})
}
