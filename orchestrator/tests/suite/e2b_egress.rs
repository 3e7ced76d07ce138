//! The internet out of E2B sandboxes, under policy (issue 45), through E2B's own Python SDK
//! (unmodified; `tests/python/e2b_egress_client.py`): `network.allowOut`/`denyOut` and
//! `allow_internet_access` at create and live through `update_network`, bounded by what the
//! operator grants the key (`e2b.egress`), on the same per-sandbox network, audited proxy and
//! firewall agent sandboxes use.
//!
//! The hosts the sandboxes reach are served by the test on 127.0.0.2, made reachable by the
//! node's `egress.allow_cidrs` as an operator would for an internal mirror, and named by
//! `egress.hosts`; `meta.test` and `loop.test` resolve to the cloud-metadata address and to
//! loopback, which stay refused whatever is granted or asked.

use crate::common;

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use common::net::trap;
use common::{docker_lines, python_client, test_config, TestApp, TestDb};
use serde_json::Value;
use tokio::net::TcpListener;

use crate::e2b::ok;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/python/e2b_egress_client.py"
);

/// A host on 127.0.0.2 answering `text`, and how many requests reached it.
async fn serve(text: &'static str) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind 127.0.0.2");
    let addr = listener.local_addr().expect("addr");
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app = Router::new().route(
        "/",
        get(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async move { text }
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, hits)
}

/// A key made through REST: (secret, id).
async fn key(app: &TestApp, name: &str) -> (String, String) {
    let body = app
        .posted(
            "/v1/api-keys",
            serde_json::json!({"name": name, "role": "operator"}),
            201,
        )
        .await;
    (
        body["key"].as_str().expect("key").to_owned(),
        body["id"].as_str().expect("id").to_owned(),
    )
}

/// `[exit code, output]` of a fetch step.
fn fetched(report: &Value, step: &str) -> (i64, String) {
    let v = ok(report, step);
    (
        v[0].as_i64().unwrap_or(-1),
        v[1].as_str().unwrap_or_default().to_owned(),
    )
}

fn reached(report: &Value, step: &str, text: &str) {
    let (code, out) = fetched(report, step);
    assert_eq!(
        (code, out.as_str()),
        (0, format!("200 {text}").as_str()),
        "{step}"
    );
}

/// Refused by the sandbox's proxy with 403, the reason containing `why`.
fn refused_by_proxy(report: &Value, step: &str, why: &str) {
    let (code, out) = fetched(report, step);
    assert_eq!(code, 3, "{step}: {out}");
    assert!(out.starts_with("403 egress proxy:"), "{step}: {out}");
    assert!(out.contains(why), "{step}: {out} (wanted {why:?})");
}

/// A sandbox with no network: nothing to connect to (no proxy, no resolver).
fn unreachable(report: &Value, step: &str) {
    let (code, out) = fetched(report, step);
    assert_eq!(code, 4, "{step}: {out}");
    assert!(out.starts_with("error URLError"), "{step}: {out}");
}

/// The networks a sandbox's container is attached to.
fn networks_of(id: &str) -> Vec<String> {
    docker_lines(&[
        "inspect",
        "-f",
        "{{range $k, $v := .NetworkSettings.Networks}}{{$k}}\n{{end}}",
        &format!("aegis-sbx-{id}"),
    ])
}

async fn egress_rows(app: &TestApp, sandbox: &str, decision: &str) -> Vec<String> {
    let id = uuid::Uuid::parse_str(sandbox).expect("a sandbox id");
    sqlx::query_scalar(
        "SELECT reason FROM audit_log WHERE action = 'egress.connect' AND sandbox_id = $1 \
         AND decision = $2 ORDER BY seq",
    )
    .bind(id)
    .bind(decision)
    .fetch_all(&app.state.pool)
    .await
    .expect("audit rows")
}

/// The pool's idle sandboxes, once it holds one.
async fn pooled(app: &TestApp) -> HashSet<String> {
    let dispatcher = app.state.sandboxes.dispatcher().expect("dispatcher");
    let deadline = Instant::now() + Duration::from_secs(120);
    while dispatcher
        .pool_sizes()
        .get("e2b:base")
        .copied()
        .unwrap_or(0)
        < 1
    {
        assert!(Instant::now() < deadline, "the E2B pool never filled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT id::text FROM sandboxes WHERE owner_kind = 'pool' AND state = 'running'",
    )
    .fetch_all(&app.state.pool)
    .await
    .expect("pool rows");
    ids.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_sandboxes_reach_out_only_as_their_rules_and_the_operator_s_grant_allow() {
    let (allowed, allowed_hits) = serve("allowed host says hi").await;
    let (other, other_hits) = serve("other host says hi").await;
    let (loop_trap, trapped) = trap().await;

    // Keys first (the grant names them), then the node with its grant.
    let db = TestDb::create().await;
    let setup = TestApp::spawn_with(test_config(&db.url)).await;
    let (owner, _) = key(&setup, "egress-owner").await;
    let (closed, closed_id) = key(&setup, "egress-closed").await;
    setup.stop().await.expect("the setup node stops");

    let mut config = test_config(&db.url);
    config.egress.allow_cidrs = vec!["127.0.0.2/32".to_owned()];
    let ip = |s: &str| -> IpAddr { s.parse().expect("ip") };
    config.egress.hosts = BTreeMap::from([
        ("allowed.test".to_owned(), vec![ip("127.0.0.2")]),
        ("other.test".to_owned(), vec![ip("127.0.0.2")]),
        ("meta.test".to_owned(), vec![ip("169.254.169.254")]),
        ("loop.test".to_owned(), vec![ip("127.0.0.1")]),
    ]);
    // The operator grants both hosts, and even names the metadata address and loopback.
    config.e2b.egress.default = vec![
        format!("allowed.test:{}", allowed.port()),
        format!("other.test:{}", other.port()),
        "meta.test".to_owned(),
        "169.254.169.254".to_owned(),
        format!("loop.test:{}", loop_trap.port()),
    ];
    config.e2b.egress.keys = BTreeMap::from([(closed_id, Vec::new())]);
    config.e2b.pool.insert("base".to_owned(), 1);
    let mut app = TestApp::spawn_with(config).await;
    app.db = Some(db);
    let pool_before = pooled(&app).await;

    let needs = "E2B's SDK, which scripts/test.sh installs";
    let r = python_client::run(python_client::Scenario {
        extra: &[
            (
                "ALLOWED_URL",
                format!("http://allowed.test:{}/", allowed.port()),
            ),
            ("OTHER_URL", format!("http://other.test:{}/", other.port())),
            ("META_URL", "http://meta.test/latest/meta-data/".to_owned()),
            (
                "LOOP_URL",
                format!("http://loop.test:{}/", loop_trap.port()),
            ),
            (
                "E2B_CLOSED_KEY",
                orchestrator::api::e2b::keys::to_e2b_form(&closed),
            ),
        ],
        ..python_client::Scenario::on(&app, SCRIPT, &["egress"], &owner, needs)
    })
    .await;
    let ids = &r["ids"];
    let id = |name: &str| ids[name].as_str().expect("sandbox id").to_owned();

    // Allow one host, deny all: the one host through the sandbox's proxy, not the other.
    reached(&r, "a_allowed", "allowed host says hi");
    refused_by_proxy(&r, "a_other", "sandbox's network rules");
    // The same through a CONNECT tunnel (how https:// leaves).
    reached(&r, "a_tunnel_allowed", "allowed host says hi");
    let (code, out) = fetched(&r, "a_tunnel_other");
    assert_eq!(code, 3, "a_tunnel_other: {out}");
    assert!(out.contains("403"), "a_tunnel_other: {out}");
    assert_eq!(
        ok(&r, "a_info"),
        &serde_json::json!({"allow_internet_access": true,
            "network": {"allow_out": ["allowed.test"], "deny_out": ["0.0.0.0/0"]}})
    );
    let proxy = ok(&r, "a_proxy_env").as_str().unwrap_or_default();
    assert!(proxy.starts_with("http://"), "{proxy}");
    // Live update: the rule changes at once.
    ok(&r, "a_update");
    refused_by_proxy(&r, "a_updated_allowed", "sandbox's network rules");
    reached(&r, "a_updated_other", "other host says hi");
    assert_eq!(
        ok(&r, "a_updated_info")["network"],
        serde_json::json!({"allow_out": ["other.test"], "deny_out": ["0.0.0.0/0"]})
    );
    ok(&r, "a_clear");
    reached(&r, "a_cleared_allowed", "allowed host says hi");
    reached(&r, "a_cleared_other", "other host says hi");
    // Granted by the operator and denied by nothing, internal ranges stay refused.
    refused_by_proxy(&r, "a_meta", "metadata");
    refused_by_proxy(&r, "a_meta_literal", "metadata");
    refused_by_proxy(&r, "a_loop", "loopback");
    crate::e2b::refused(&r, "a_bad_update", "allowOut[0]");
    ok(&r, "a_off");
    refused_by_proxy(&r, "a_off_allowed", "sandbox's network rules");
    assert_eq!(
        ok(&r, "a_off_info"),
        &serde_json::json!({"allow_internet_access": false,
            "network": {"deny_out": ["0.0.0.0/0"]}})
    );

    // Deny by address, allow by name: allow wins where it covers.
    reached(&r, "b_allowed", "allowed host says hi");
    refused_by_proxy(&r, "b_other", "resolves to 127.0.0.2");
    // A pause and resume keep the rules (a new container, its own network and proxy).
    ok(&r, "b_pause");
    ok(&r, "b_resume");
    reached(&r, "b_resumed_allowed", "allowed host says hi");
    refused_by_proxy(&r, "b_resumed_other", "resolves to 127.0.0.2");
    assert_eq!(
        ok(&r, "b_resumed_info")["network"],
        serde_json::json!({"allow_out": ["allowed.test"], "deny_out": ["127.0.0.2/32"]})
    );

    ok(&r, "fork");
    reached(&r, "fork_allowed", "allowed host says hi");
    refused_by_proxy(&r, "fork_other", "resolves to 127.0.0.2");
    assert_eq!(egress_rows(&app, &id("fork"), "allowed").await.len(), 1);

    // Asking for the metadata address or loopback opens neither.
    refused_by_proxy(&r, "c_meta", "metadata");
    refused_by_proxy(&r, "c_meta_literal", "metadata");
    refused_by_proxy(&r, "c_loop", "loopback");
    assert_eq!(
        trapped.load(Ordering::SeqCst),
        0,
        "nothing reached loopback"
    );

    // No internet asked: no network, and none can be added.
    unreachable(&r, "d_allowed");
    assert_eq!(
        ok(&r, "d_info"),
        &serde_json::json!({"allow_internet_access": false,
            "network": {"deny_out": ["0.0.0.0/0"]}})
    );
    crate::e2b::refused(&r, "d_update", "made without a network");
    // A key granted nothing: no network whatever it asked, and none by update.
    unreachable(&r, "e_allowed");
    assert_eq!(ok(&r, "e_info")["allow_internet_access"], false);
    crate::e2b::refused(&r, "e_update", "grants this API key no egress");

    // Only networked sandboxes are made on a network of their own; the one that asked for
    // nothing came from the warm pool, the networked ones never do.
    for name in ["a", "c", "fork"] {
        assert!(
            !pool_before.contains(&id(name)),
            "{name} came from the pool"
        );
    }
    assert!(
        pool_before.contains(&id("d")),
        "the sandbox without egress is a pooled one"
    );
    let b_current = app.e2b_sandbox(&id("b")).await;
    assert_ne!(b_current, id("b"), "a resume makes a new container");
    assert_eq!(
        networks_of(&b_current),
        [format!("aegis-net-{b_current}")],
        "the resumed sandbox is on its own network again"
    );

    // One audit row per connection, with the sandbox's id, allowed and refused alike.
    let a_allowed = egress_rows(&app, &id("a"), "allowed").await;
    let a_denied = egress_rows(&app, &id("a"), "denied").await;
    assert_eq!(a_allowed.len(), 5, "{a_allowed:?}");
    assert_eq!(a_denied.len(), 7, "{a_denied:?}");
    assert!(
        a_allowed.iter().any(|row| row.starts_with(&format!(
            "sandbox {}: CONNECT allowed.test:{}",
            id("a"),
            allowed.port()
        ))),
        "{a_allowed:?}"
    );
    assert!(
        a_allowed[0].contains(&format!("allowed.test:{}", allowed.port())),
        "{a_allowed:?}"
    );
    let resumed = egress_rows(&app, &b_current, "allowed").await;
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(egress_rows(&app, &id("b"), "denied").await.len(), 1);
    assert_eq!(allowed_hits.load(Ordering::SeqCst), 6);
    assert_eq!(other_hits.load(Ordering::SeqCst), 2);

    // The resumed sandbox goes with its network and firewall rules.
    let r = app
        .http
        .delete(format!("{}/e2b/sandboxes/{}", app.http_base, id("b")))
        .header("X-API-KEY", common::e2b_key(&owner))
        .send()
        .await
        .expect("kill");
    assert_eq!(r.status(), 204);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = docker_lines(&[
            "network",
            "ls",
            "-q",
            "--filter",
            &format!("name=aegis-net-{b_current}"),
        ]);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the network outlived its sandbox"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
