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

use std::collections::{BTreeMap, HashMap};
use std::process::Command;

use crate::common;
use crate::common::agent::AgentManifest;

use aegis_cli::seal_client::{SealClient, Transport};
use common::net::web_host;
use common::replicas::{seal_round, SecondEngine, SECRET};
use common::sandbox::AgentSandbox;
use common::{TestApp, TestDb};
use orchestrator::config::NodeConfig;
use reqwest::Method;
use serde_json::{json, Value};

/// The bound of each engine in this scenario: two live sandboxes.
const PER_ENGINE: u64 = 2;

fn replica(db: &TestDb, docker_host: Option<&str>) -> NodeConfig {
    let mut config = common::replicas::in_process(db, Some(SECRET));
    config.sandbox.max_per_engine = Some(PER_ENGINE);
    config.docker.host = docker_host.map(str::to_owned);
    config.seal.security_contexts = vec![common::replicas::ops_context()];
    // `allowed.test` is a host of this test on 127.0.0.2 (the networked agent's allowlist).
    config.egress.allow_cidrs = vec!["127.0.0.2/32".to_owned()];
    config.egress.hosts = BTreeMap::from([(
        "allowed.test".to_owned(),
        vec!["127.0.0.2".parse().expect("ip")],
    )]);
    config
}

/// A busybox agent with network granted to `allow` (host:port) only.
fn networked_agent(allow: &str) -> String {
    AgentManifest::new("fetcher")
        .instruction("Fetch things.")
        .tools(&["cmd.run"])
        .cmd(&["wget"], 20, "")
        .network("deny", "allowlist", &[allow])
        .yaml()
}

/// The host firewall's INPUT rules.
fn input_rules() -> String {
    let out = Command::new("iptables")
        .args(["-w", "-S", "INPUT"])
        .output()
        .expect("iptables runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn agent() -> String {
    AgentManifest::new("placed")
        .instruction("Work in the workspace.")
        .tools(&["cmd.run", "fs.read", "fs.write"])
        .cmd(&["cat", "echo"], 30, "          max_output_bytes: 65536\n")
        .filesystem(&["/workspace"], &["/workspace"])
        .yaml()
}

/// `POST /v1/sandboxes` for the agent through `app`: (status, body).
async fn create(app: &TestApp) -> (u16, Value) {
    let r = app
        .post_json("/v1/sandboxes", &json!({"agent": "placed"}))
        .await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_spread_over_two_engines_and_every_replica_serves_each() {
    let Some(second) = SecondEngine::start() else {
        return;
    };
    let db = TestDb::create().await;
    let a = TestApp::spawn_with(replica(&db, None)).await;
    let b = TestApp::spawn_with(replica(&db, None)).await;
    let c = TestApp::spawn_with(replica(&db, Some(&second.host))).await;
    let (first, other) = (a.engine_id(), c.engine_id());
    assert_eq!(b.engine_id(), first, "A and B drive the host's engine");
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

    // Readiness lists each replica with the engine it drives.
    let ready: Value = a.get("/health/ready").await.json().await.unwrap();
    let listed: HashMap<String, String> = ready["checks"]["cluster"]["replicas"]
        .as_array()
        .unwrap_or_else(|| panic!("replicas listed: {ready}"))
        .iter()
        .map(|r| {
            (
                r["instance_id"].as_str().unwrap_or_default().to_owned(),
                r["engine"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(listed[&c.state.instance_id.to_string()], other, "{ready}");
    assert_eq!(listed[&b.state.instance_id.to_string()], first, "{ready}");

    a.deployed("/v1/agents", &agent()).await;

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
    let live = common::live_sandboxes(&a.state.pool).await;
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
        through
            .answered(Method::DELETE, &format!("/v1/sandboxes/{id}"), None, 200)
            .await;
        assert_eq!(placed(&a, id).await.2, "destroyed", "{id}");
    }
    // With room again, a creation through B lands on B's engine.
    let s5 = created(&b).await;
    assert_eq!(placed(&a, &s5).await.0, first);
    c.answered(Method::DELETE, &format!("/v1/sandboxes/{s5}"), None, 200)
        .await;

    // Egress per engine: a networked sandbox made through C lives on the second engine, on an
    // internal network of its own there, behind a proxy C runs on that network's gateway and
    // the host rules C set for its bridge. Through A, its command reaches the allowed host via
    // the proxy; direct, it reaches neither that host nor a container on the host's engine.
    let allowed = web_host("allowed host says hi").await;
    let allow = format!("allowed.test:{}", allowed.port());
    a.deployed("/v1/agents", &networked_agent(&allow)).await;
    let r = c
        .post_json("/v1/sandboxes", &json!({"agent": "fetcher"}))
        .await;
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, 201, "{body}");
    let net_id = body["sandbox_id"].as_str().expect("an id").to_owned();
    assert_eq!(placed(&a, &net_id).await.0, other);
    let network = format!("aegis-net-{net_id}");
    assert_eq!(
        second
            .lines(&[
                "network",
                "ls",
                "-q",
                "--filter",
                &format!("name={network}")
            ])
            .len(),
        1,
        "its network is on the second engine"
    );
    assert!(
        common::docker_lines(&[
            "network",
            "ls",
            "-q",
            "--filter",
            &format!("name={network}")
        ])
        .is_empty(),
        "and not on the host's"
    );
    let tag = format!("aegis-egress:{network}");
    assert_eq!(input_rules().matches(&tag).count(), 3, "{}", input_rules());
    let via_a = AgentSandbox::of(&a, &net_id);
    let fetched = via_a
        .ok(
            "cmd.run",
            json!({"command": format!("wget -q -O - http://allowed.test:{}/", allowed.port()),
                   "timeout_secs": 15}),
        )
        .await;
    assert_eq!(fetched["exit_code"], 0, "{fetched}");
    assert_eq!(fetched["stdout"], "allowed host says hi", "{fetched}");
    let listener = format!("aegis-engines-outside-{}", uuid::Uuid::new_v4().simple());
    let started = Command::new("docker")
        .args([
            "run",
            "-d",
            "--rm",
            "--name",
            &listener,
            "--user",
            "65534:65534",
            "--cap-drop",
            "ALL",
            "aegis-runtime/busybox:1",
            "sh",
            "-c",
            "while true; do echo reached | nc -l -p 8080; done",
        ])
        .output()
        .expect("docker runs");
    common::succeeded(started, "the listener did not start");
    let outside_ip = common::docker_lines(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        &listener,
    ])
    .concat();
    // A service of the host on every interface, tried on the network's gateway: the host rules
    // C set for this bridge drop it.
    let host_service = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("bind");
    let host_port = host_service.local_addr().expect("addr").port();
    let host_hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hits = host_hits.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = host_service.accept().await {
            hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(stream);
        }
    });
    let gateway = second
        .lines(&[
            "network",
            "inspect",
            "-f",
            "{{range .IPAM.Config}}{{.Gateway}}{{end}}",
            &network,
        ])
        .concat();
    assert!(
        gateway.starts_with("10.213."),
        "from the second engine's range: {gateway}"
    );
    for url in [
        format!("http://{outside_ip}:8080/"),
        format!("http://{gateway}:{host_port}/"),
    ] {
        let direct = via_a
            .ok(
                "cmd.run",
                json!({"command": format!("wget -Y off -T 3 -q -O - {url}"), "timeout_secs": 15}),
            )
            .await;
        assert_ne!(direct["exit_code"], 0, "direct to {url}: {direct}");
    }
    let logs = Command::new("docker")
        .args(["logs", &listener])
        .output()
        .expect("docker logs");
    let _ = Command::new("docker")
        .args(["rm", "-f", &listener])
        .output();
    assert!(
        logs.stdout.is_empty() && logs.stderr.is_empty(),
        "nothing arrived outside"
    );
    assert_eq!(
        host_hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing reached the host"
    );
    // Destroyed through B: C closes the proxy and removes the network and its rules.
    b.answered(
        Method::DELETE,
        &format!("/v1/sandboxes/{net_id}"),
        None,
        200,
    )
    .await;
    assert_eq!(input_rules().matches(&tag).count(), 0, "{}", input_rules());

    // A SEAL session attested through C gets its sandbox beside C's engine on its first call,
    // then is used through every replica in turn: each writes a file, and reads all so far.
    let mut client = SealClient::new(Transport::Http(c.http_base.clone())).expect("client");
    let attested = client
        .attest("test-worker-1", "ops")
        .await
        .expect("attests");
    assert_eq!(attested["status"], "success", "{attested}");
    let saved = client.save().expect("a session to continue");
    let mut written: Vec<String> = Vec::new();
    let through: Vec<(String, String)> = [("c", &c), ("a", &a), ("b", &b), ("c2", &c), ("a2", &a)]
        .iter()
        .map(|(name, app)| ((*name).to_owned(), app.http_base.clone()))
        .collect();
    seal_round(&saved, &through, &mut written, None).await;
    let session_sandboxes: Vec<(String, uuid::Uuid)> = sqlx::query_as(
        "SELECT engine, instance_id FROM sandboxes WHERE owner_kind = 'session' \
         AND state = 'running'",
    )
    .fetch_all(&a.state.pool)
    .await
    .unwrap();
    assert_eq!(
        session_sandboxes,
        vec![(other.clone(), c.state.instance_id)]
    );

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
