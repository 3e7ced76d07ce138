//! Warm pools for E2B templates (issue 47): a node keeps started sandboxes of exactly the shape
//! an E2B create asks for (`e2b.pool`), hands one to each create in milliseconds, and what
//! makes a sandbox someone's (its E2B id, envd token, metadata, env vars, timeout, owner key)
//! is given after the hand-out, so a pooled sandbox is exactly its creator's and never another
//! key's; no pooled sandbox is ever handed out twice, even to creates racing for the same pool.

use crate::common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{e2b_key, test_config, TestApp, TestDb};
use serde_json::{json, Value};

const POOL: &str = "e2b:base";

/// The ids of the idle sandboxes of the E2B pool, once it holds `want`.
async fn pooled(app: &TestApp, want: usize) -> HashSet<String> {
    let dispatcher = app.state.sandboxes.dispatcher().unwrap();
    let every = Duration::from_millis(200);
    common::eventually(
        "the pool never held enough",
        Duration::from_secs(120),
        every,
        || {
            let idle = dispatcher.pool_sizes().get(POOL).copied().unwrap_or(0);
            async move {
                if idle < want {
                    return Err(format!("{idle} of {want}"));
                }
                let ids: Vec<String> = sqlx::query_scalar(
                "SELECT id::text FROM sandboxes WHERE owner_kind = 'pool' AND state = 'running'",
            )
            .fetch_all(&app.state.pool)
            .await
            .unwrap();
                Ok(ids.into_iter().collect())
            }
        },
    )
    .await
}

#[tokio::test]
async fn a_pooled_e2b_sandbox_is_exactly_its_creator_s_and_never_handed_out_twice() {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.e2b.pool.insert("base".to_owned(), 2);
    config.sandbox.max_sandboxes_per_api_key = 20;
    let app = TestApp::spawn_with(config).await;
    let (a, b) = (
        app.create_key("pool-a", "operator").await,
        app.create_key("pool-b", "operator").await,
    );
    let before = pooled(&app, 2).await;

    // Two keys through E2B's own SDK: each gets a pooled sandbox and only its own settings.
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/e2b_pool_client.py"
    );
    let needs = "the e2b package, which scripts/test.sh installs";
    let report = common::python_client::run(common::python_client::Scenario {
        extra: &[("E2B_KEY_A", e2b_key(&a)), ("E2B_KEY_B", e2b_key(&b))],
        ..common::python_client::Scenario::on(&app, script, &[], &a, needs)
    })
    .await;
    for (who, timeout) in [("a", 120), ("b", 240)] {
        let got = &report[who];
        assert_eq!(got["stdout"], format!("{who}:/home/user"), "{report}");
        assert_eq!(got["metadata"], json!({"owner": who}), "{report}");
        let id = app.e2b_sandbox(got["id"].as_str().unwrap()).await;
        assert!(before.contains(&id), "{who}'s sandbox {id} was not pooled");
        let (owner, token_len, secs): (String, i32, f64) = sqlx::query_as(
            "SELECT owner_key_id, length(envd_access_token), \
             extract(epoch FROM end_at - started_at)::float8 \
             FROM e2b_sandboxes WHERE sandbox_id::text = $1",
        )
        .bind(&id)
        .fetch_one(&app.state.pool)
        .await
        .unwrap();
        let key_id: String = app
            .one(
                "SELECT id::text FROM api_keys WHERE name = $1",
                format!("pool-{who}"),
            )
            .await;
        assert_eq!(owner, key_id, "{who}'s sandbox belongs to its key");
        assert!(token_len > 16);
        assert!((secs - f64::from(timeout)).abs() < 5.0, "{who}: {secs} s");
    }
    let tokens = app
        .count("SELECT count(DISTINCT envd_access_token) FROM e2b_sandboxes")
        .await;
    assert_eq!(tokens, 2, "each pooled sandbox has a token of its own");
    let stats = app
        .state
        .sandboxes
        .dispatcher()
        .unwrap()
        .pool_stats_by_pool();
    assert_eq!(stats[POOL].hits, 2, "{stats:?}");

    // Creates racing for a refilled pool of two: six sandboxes, six different containers,
    // at most two of them from the pool, none handed out twice.
    let refilled = pooled(&app, 2).await;
    let c = app.create_key("pool-c", "operator").await;
    let creates = (0..6).map(|_| {
        app.http
            .post(format!("{}/e2b/sandboxes", app.http_base))
            .header("X-API-KEY", e2b_key(&c))
            .json(&json!({"templateID": "base", "timeout": 60}))
            .send()
    });
    let mut ids = HashSet::new();
    for answer in futures_util::future::join_all(creates).await {
        let answer = answer.unwrap();
        assert_eq!(answer.status(), 201);
        let body: Value = answer.json().await.unwrap();
        ids.insert(app.e2b_sandbox(body["sandboxID"].as_str().unwrap()).await);
    }
    assert_eq!(ids.len(), 6, "six creates, six sandboxes");
    let from_pool = ids.intersection(&refilled).count();
    assert!(from_pool <= 2, "{from_pool} from a pool of two");
    let owners: Vec<(String, String)> =
        sqlx::query_as("SELECT owner_kind, owner_id FROM sandboxes WHERE id::text = ANY($1)")
            .bind(ids.iter().cloned().collect::<Vec<_>>())
            .fetch_all(&app.state.pool)
            .await
            .unwrap();
    assert_eq!(owners.len(), 6);
    assert!(
        owners.iter().all(|(kind, _)| kind == "operator"),
        "{owners:?}"
    );
    let stats = app
        .state
        .sandboxes
        .dispatcher()
        .unwrap()
        .pool_stats_by_pool();
    assert_eq!(
        stats[POOL].hits + stats[POOL].misses,
        8,
        "every create of the template counted: {stats:?}"
    );

    // The node's metrics report the pool's hand-outs.
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains(&format!(
            "aegis_pool_acquisitions_by_pool_total{{pool=\"{POOL}\",result=\"hit\"}}"
        )),
        "{metrics}"
    );
}

/// Two replicas on one database, each with its own warm pool of the template: creates racing
/// through both get as many different sandboxes, each pooled sandbox goes to one create only,
/// and neither replica hands out the other's idle ones (a replica's pool is its own; the
/// hand-out is a conditional UPDATE of the row, so a sandbox leaves a pool once).
#[tokio::test]
async fn pooled_sandboxes_are_never_handed_out_twice_across_replicas() {
    use common::replicas::{in_process, SECRET};

    let db = TestDb::create().await;
    let config = || {
        let mut config = in_process(&db, Some(SECRET));
        config.e2b.pool.insert("base".to_owned(), 2);
        config.sandbox.max_sandboxes_per_api_key = 20;
        config
    };
    let a = TestApp::spawn_with(config()).await;
    let b = TestApp::spawn_with(config()).await;
    let key = a.create_key("pool-racer", "operator").await;
    // Both pools full: four idle sandboxes, two held by each replica.
    let idle = |app: &TestApp| {
        app.state
            .sandboxes
            .dispatcher()
            .unwrap()
            .pool_sizes()
            .get(POOL)
            .copied()
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while idle(&a) < 2 || idle(&b) < 2 {
        assert!(Instant::now() < deadline, "the pools never filled");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let pooled: HashSet<String> = pooled(&a, 2).await;
    assert_eq!(
        pooled.len(),
        4,
        "two idle sandboxes per replica: {pooled:?}"
    );

    // Eight creates at once, alternating between the replicas.
    let creates = (0..8).map(|i| {
        let node = if i % 2 == 0 { &a } else { &b };
        node.http
            .post(format!("{}/e2b/sandboxes", node.http_base))
            .header("X-API-KEY", e2b_key(&key))
            .json(&json!({"templateID": "base", "timeout": 60, "metadata": {"n": i.to_string()}}))
            .send()
    });
    let mut ids = HashSet::new();
    for answer in futures_util::future::join_all(creates).await {
        let answer = answer.unwrap();
        assert_eq!(answer.status(), 201);
        let body: Value = answer.json().await.unwrap();
        ids.insert(a.e2b_sandbox(body["sandboxID"].as_str().unwrap()).await);
    }
    assert_eq!(ids.len(), 8, "eight creates, eight sandboxes");
    let from_pools = ids.intersection(&pooled).count();
    assert!(from_pools <= 4, "{from_pools} from two pools of two");
    // Each E2B sandbox names a different dispatcher sandbox, and each is its key's.
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT s.id::text, s.owner_kind FROM e2b_sandboxes e JOIN sandboxes s ON s.id = e.sandbox_id",
    )
    .fetch_all(&a.state.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 8, "{rows:?}");
    let distinct: HashSet<&String> = rows.iter().map(|(id, _)| id).collect();
    assert_eq!(distinct.len(), 8, "a sandbox handed out twice: {rows:?}");
    assert!(rows.iter().all(|(_, kind)| kind == "operator"), "{rows:?}");
    let (sa, sb) = (
        a.state.sandboxes.dispatcher().unwrap().pool_stats_by_pool(),
        b.state.sandboxes.dispatcher().unwrap().pool_stats_by_pool(),
    );
    assert_eq!(
        sa[POOL].hits + sa[POOL].misses + sb[POOL].hits + sb[POOL].misses,
        8,
        "every create counted once, on the replica that served it: {sa:?} {sb:?}"
    );
    assert_eq!(
        usize::try_from(sa[POOL].hits + sb[POOL].hits).unwrap(),
        from_pools,
        "the pools' hits are the pooled sandboxes handed out: {sa:?} {sb:?}"
    );
}
