//! Several Docker engines (issue 23): three replicas on one database, two on the host's engine
//! and one on a second Docker daemon this test starts itself on this machine
//! (`scripts/lib/second_engine.sh`: its own data root, socket and bridge, the busybox runtime
//! loaded into it). Sandboxes are placed on the engine with room (`sandbox.max_per_engine`),
//! a full engine sends them to the other through the replica driving it, every sandbox is
//! served through every replica in turn, its container is on the engine its row names, a
//! reaper never judges another engine's rows, and nothing is left on either engine at the end.
//!
//! Skipped, with the reason, only when the second daemon cannot start here (not root, no
//! dockerd); the script says why.

use std::collections::HashMap;
use std::process::Command;

use crate::common;

use common::sandbox::AgentSandbox;
use common::{TestApp, TestDb};
use orchestrator::config::NodeConfig;
use reqwest::Method;
use serde_json::{json, Value};

const SECRET: &str = "the-cluster-secret-shared-by-all-replicas";

/// The bound of each engine in this scenario: two live sandboxes.
const PER_ENGINE: u64 = 2;

fn script() -> String {
    format!(
        "{}/../scripts/lib/second_engine.sh",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// The second engine, stopped (containers, networks, daemon, bridge, rules) when dropped.
struct SecondEngine {
    host: String,
}

impl SecondEngine {
    /// Starts it with the busybox runtime loaded; `None` (with the script's reason printed)
    /// when a second daemon cannot run on this machine.
    fn start() -> Option<SecondEngine> {
        let out = Command::new("bash")
            .args([script().as_str(), "start", "aegis-runtime/busybox:1"])
            .output()
            .expect("bash runs");
        if !out.status.success() {
            eprintln!(
                "SKIPPED engines::: a second Docker daemon cannot start on this machine:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        let host = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(
            host.starts_with("unix://"),
            "the script prints its address: {host}"
        );
        Some(SecondEngine { host })
    }

    /// `docker -H <second engine> args...`, its non-empty lines.
    fn lines(&self, args: &[&str]) -> Vec<String> {
        let out = Command::new("docker")
            .arg("-H")
            .arg(&self.host)
            .args(args)
            .output()
            .expect("docker runs");
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

fn replica(db: &TestDb, docker_host: Option<&str>) -> NodeConfig {
    let mut config = common::test_config(&db.url);
    config.cluster.listen = Some("127.0.0.1:0".parse().expect("addr"));
    config.cluster.secret = Some(SECRET.to_owned());
    config.sandbox.max_per_engine = Some(PER_ENGINE);
    config.docker.host = docker_host.map(str::to_owned);
    config
}

fn agent() -> String {
    "apiVersion: 100monkeys.ai/v1
kind: Agent
metadata:
  name: placed
  version: \"1.0.0\"
spec:
  runtime:
    language: busybox
    version: \"1\"
  task:
    instruction: Work in the workspace.
  tools: [cmd.run, fs.read, fs.write]
  builtin_dispatchers:
    - name: cmd
      capabilities:
        - name: cmd.run
          subcommand_allowlist: [cat, echo]
          timeout_seconds: 30
          max_output_bytes: 65536
  security:
    filesystem:
      read: [/workspace]
      write: [/workspace]
"
    .to_owned()
}

/// `POST /v1/sandboxes` for the agent through `app`: (status, body).
async fn create(app: &TestApp) -> (u16, Value) {
    let r = app
        .admin(Method::POST, "/v1/sandboxes")
        .json(&json!({"agent": "placed"}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

async fn created(app: &TestApp) -> String {
    let (status, body) = create(app).await;
    assert_eq!(status, 201, "{body}");
    body["sandbox_id"].as_str().expect("an id").to_owned()
}

/// The engine and holder a sandbox's row names.
async fn placed(app: &TestApp, id: &str) -> (String, uuid::Uuid, String) {
    sqlx::query_as("SELECT engine, instance_id, state FROM sandboxes WHERE id = $1::uuid")
        .bind(id)
        .fetch_one(&app.state.pool)
        .await
        .expect("a sandbox row")
}

fn engine_of(app: &TestApp) -> String {
    app.state
        .sandboxes
        .dispatcher()
        .expect("dispatcher up")
        .engine_id()
        .to_owned()
}

#[tokio::test]
async fn sandboxes_spread_over_two_engines_and_every_replica_serves_each() {
    let Some(second) = SecondEngine::start() else {
        return;
    };
    let db = TestDb::create().await;
    let a = TestApp::spawn_with(replica(&db, None)).await;
    let b = TestApp::spawn_with(replica(&db, None)).await;
    let c = TestApp::spawn_with(replica(&db, Some(&second.host))).await;
    let (first, other) = (engine_of(&a), engine_of(&c));
    assert_eq!(engine_of(&b), first, "A and B drive the host's engine");
    assert_ne!(first, other, "C drives another engine");
    // Every replica recorded the engine it drives, for its peers.
    let recorded: Vec<(uuid::Uuid, Option<String>)> =
        sqlx::query_as("SELECT id, engine FROM node_instances ORDER BY started_at")
            .fetch_all(&a.state.pool)
            .await
            .unwrap();
    let recorded: HashMap<_, _> = recorded.into_iter().collect();
    assert_eq!(
        recorded[&a.state.instance_id].as_deref(),
        Some(first.as_str())
    );
    assert_eq!(
        recorded[&c.state.instance_id].as_deref(),
        Some(other.as_str())
    );

    let r = a
        .admin(Method::POST, "/v1/agents")
        .body(agent())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());

    // Two through A and B fill the host's engine; the third, asked of A, goes to the second
    // engine through C, which holds it; the fourth, asked of C, stays there; the fifth finds
    // both engines full and nothing is made.
    let s1 = created(&a).await;
    let s2 = created(&b).await;
    let s3 = created(&a).await;
    let s4 = created(&c).await;
    let (status, full) = create(&b).await;
    assert_eq!(status, 503, "{full}");
    assert_eq!(full["code"], "no_engine_room", "{full}");
    let expect = [
        (&s1, &first, a.state.instance_id),
        (&s2, &first, b.state.instance_id),
        (&s3, &other, c.state.instance_id),
        (&s4, &other, c.state.instance_id),
    ];
    for (id, engine, holder) in expect {
        let (on, held_by, state) = placed(&a, id).await;
        assert_eq!(
            (&on, held_by, state.as_str()),
            (engine, holder, "running"),
            "{id}"
        );
        // Its container is on that engine and only there.
        let name = format!("aegis-sbx-{id}");
        let filter = format!("name={name}");
        let here = common::docker_lines(&["ps", "-q", "--filter", &filter]);
        let there = second.lines(&["ps", "-q", "--filter", &filter]);
        if engine == &first {
            assert_eq!(
                (here.len(), there.len()),
                (1, 0),
                "{id} on the host's engine"
            );
        } else {
            assert_eq!(
                (here.len(), there.len()),
                (0, 1),
                "{id} on the second engine"
            );
        }
    }
    let live: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sandboxes WHERE state IN ('creating', 'running', 'destroying')",
    )
    .fetch_one(&a.state.pool)
    .await
    .unwrap();
    assert_eq!(live, 4, "the refused creation left no row");

    // Every sandbox through every replica in turn: a file written through one is read and
    // run through the next, whichever engine the sandbox is on.
    let replicas = [("a", &a), ("b", &b), ("c", &c)];
    for id in [&s1, &s2, &s3, &s4] {
        for (i, (name, app)) in replicas.iter().enumerate() {
            let via = AgentSandbox::of(app, id);
            let path = format!("/workspace/{name}.txt");
            let wrote = via
                .ok(
                    "fs.write",
                    json!({"path": path, "content": format!("by {name}")}),
                )
                .await;
            assert_eq!(wrote["bytes_written"], 4, "{id} via {name}: {wrote}");
            let (next_name, next) = replicas[(i + 1) % replicas.len()];
            let read = AgentSandbox::of(next, id)
                .ok("cmd.run", json!({"command": "cat", "args": [path]}))
                .await;
            assert_eq!(read["stdout"], format!("by {name}"), "{id} via {next_name}");
        }
    }

    // A reaper judges only its own engine's rows: a dead instance of the second engine (made
    // up here, with a row whose container never existed) is judged by C's reaper, beside that
    // engine, which closes its row; A's, which cannot see that engine, leaves it alone.
    let ghost = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO node_instances (id, hostname, version, heartbeat_at, engine) \
         VALUES ($1, 'ghost', 'test', now() - interval '1 hour', $2)",
    )
    .bind(ghost)
    .bind(&other)
    .execute(&a.state.pool)
    .await
    .unwrap();
    let ghost_sandbox = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO sandboxes (id, instance_id, image, owner_kind, owner_id, state, \
         container_name, volume_name, spec, engine) VALUES ($1, $2, 'aegis-runtime/busybox:1', \
         'execution', 'ghost', 'running', $3, $4, '{}', $5)",
    )
    .bind(ghost_sandbox)
    .bind(ghost)
    .bind(format!("aegis-sbx-{ghost_sandbox}"))
    .bind(format!("aegis-ws-{ghost_sandbox}"))
    .bind(&other)
    .execute(&a.state.pool)
    .await
    .unwrap();
    let reap = |app: &TestApp| app.state.sandboxes.dispatcher().unwrap().clone();
    let report = reap(&a).reap().await.expect("A's reaper runs");
    assert_eq!(report.rows_closed, 0, "{report:?}");
    let ghost_id = ghost_sandbox.to_string();
    assert_eq!(
        placed(&a, &ghost_id).await.2,
        "running",
        "kept by A's reaper"
    );
    let report = reap(&c).reap().await.expect("C's reaper runs");
    assert_eq!(report.rows_closed, 1, "{report:?}");
    assert_eq!(
        placed(&a, &ghost_id).await.2,
        "destroyed",
        "closed by C's reaper"
    );
    for id in [&s3, &s4] {
        assert_eq!(placed(&a, id).await.2, "running", "{id} untouched");
    }

    // Destroyed through a replica that does not hold them (and, for s3 and s4, not beside
    // their engine): the holder removes the objects on its own engine.
    for (id, through) in [(&s1, &b), (&s2, &c), (&s3, &a), (&s4, &b)] {
        let r = through
            .admin(Method::DELETE, &format!("/v1/sandboxes/{id}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{id}: {}", r.text().await.unwrap());
        assert_eq!(placed(&a, id).await.2, "destroyed", "{id}");
    }
    // With room again, a creation through B lands on B's engine.
    let s5 = created(&b).await;
    assert_eq!(placed(&a, &s5).await.0, first);
    let r = c
        .admin(Method::DELETE, &format!("/v1/sandboxes/{s5}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());

    c.stop().await.expect("C stops");
    b.stop().await.expect("B stops");
    a.stop().await.expect("A stops");
    // Stopped, the replicas leave nothing of this database on either engine (their beacons
    // went with them).
    let name = url::Url::parse(&db.url)
        .expect("a URL")
        .path()
        .trim_start_matches('/')
        .to_owned();
    let label = format!("label=org.aegis.db-name={name}");
    for what in [
        vec!["ps", "-aq", "--filter", &label],
        vec!["volume", "ls", "-q", "--filter", &label],
        vec!["network", "ls", "-q", "--filter", &label],
    ] {
        assert_eq!(
            common::docker_lines(&what),
            Vec::<String>::new(),
            "{what:?} on the host's engine"
        );
        assert_eq!(
            second.lines(&what),
            Vec::<String>::new(),
            "{what:?} on the second engine"
        );
    }
    // C removed its executor volume from the second engine when it stopped (no other node
    // beats there); the host's engine keeps its own for other tests.
    assert_eq!(
        second.lines(&["volume", "ls", "-q", "--filter", "name=aegis-executor-"]),
        Vec::<String>::new(),
        "the second engine's executor volume"
    );
}
