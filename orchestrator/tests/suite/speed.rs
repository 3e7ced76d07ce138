//! What the speed work must not break: concurrent calls share audit transactions without losing a
//! row or the chain's order, a chain writer whose remembered head went stale (another replica
//! appended) chains after the real head, and the SEAL gateway's caches never outlive a change
//! made through another replica (revocation, a context edit).

use crate::common;

use aegis_cli::seal_client::{SealClient, Transport};
use common::refusal::refused;
use common::{test_config, TestApp, TestDb};
use orchestrator::audit::{self, Entry, EntryKind};
use orchestrator::caller::{Caller, Role};
use reqwest::Method;
use serde_json::{json, Value};

/// seq, id, intent_id, outcome, chain_index.
type AuditRow = (i64, uuid::Uuid, Option<uuid::Uuid>, String, Option<i64>);

#[tokio::test]
async fn concurrent_calls_are_all_chained_in_order_and_verifiable() {
    let app = TestApp::spawn().await;
    let app = std::sync::Arc::new(app);
    let rounds = 4;
    let clients = 40;
    for _ in 0..rounds {
        let calls: Vec<_> = (0..clients)
            .map(|_| {
                let app = app.clone();
                tokio::spawn(async move { app.call_tool("aegis.runtime.list", json!({})).await })
            })
            .collect();
        for c in calls {
            let (status, body) = c.await.unwrap();
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["isError"], false, "{body}");
        }
    }

    // Every call left its intent and its completion, each completion after its intent.
    let rows: Vec<AuditRow> = sqlx::query_as(
        "SELECT seq, id, intent_id, outcome, chain_index FROM audit_log \
         WHERE action = 'aegis.runtime.list' ORDER BY seq",
    )
    .fetch_all(&app.state.pool)
    .await
    .unwrap();
    let intents: Vec<_> = rows.iter().filter(|r| r.2.is_none()).collect();
    let completions: Vec<_> = rows.iter().filter(|r| r.2.is_some()).collect();
    assert_eq!(intents.len(), rounds * clients);
    assert_eq!(completions.len(), rounds * clients);
    assert!(intents.iter().all(|r| r.3 == "running"));
    for c in &completions {
        let intent = intents
            .iter()
            .find(|i| Some(i.1) == c.2)
            .expect("the completion's intent exists");
        assert!(intent.0 < c.0, "completion before its intent: {c:?}");
    }

    // The whole chain: gap-free positions in `seq` order, and the hashes verify.
    assert_chain_whole(&app).await;
}

/// Positions 1..n in `seq` order, and a full verification that passes.
async fn assert_chain_whole(app: &TestApp) {
    let positions: Vec<Option<i64>> =
        sqlx::query_scalar("SELECT chain_index FROM audit_log ORDER BY seq")
            .fetch_all(&app.state.pool)
            .await
            .unwrap();
    for (i, p) in positions.iter().enumerate() {
        assert_eq!(*p, Some(i as i64 + 1), "chain position of row {i}");
    }
    let verified = app.get_value("/v1/audit/verify?full=true").await;
    assert_eq!(verified["valid"], true, "{verified}");
}

#[tokio::test]
async fn two_chain_writers_on_one_database_keep_one_chain() {
    let app = TestApp::spawn().await;
    // A second writer for the same database, as another replica has: the writers are keyed by
    // host, so the other spelling of the loopback host gets one of its own, with its own
    // remembered head that the first writer's rows make stale (and the other way round).
    let url = &app.db.as_ref().expect("the app's database").url;
    let other_url = if url.contains("127.0.0.1") {
        url.replace("127.0.0.1", "localhost")
    } else if url.contains("localhost") {
        url.replace("localhost", "127.0.0.1")
    } else {
        panic!("this test needs DATABASE_URL on 127.0.0.1 or localhost, not {url}");
    };
    let other = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&other_url)
        .await
        .expect("second pool");
    let caller = Caller::operator(uuid::Uuid::new_v4(), "writers", Role::Admin);
    let entry = |action: &str| Entry {
        kind: EntryKind::Tool,
        action: action.to_owned(),
        allowed: true,
        reason_code: None,
        reason: None,
        args_digest: "-".to_owned(),
        outcome: "ok",
        result_digest: None,
        duration_ms: 0,
        sandbox_id: None,
    };
    for round in 0..6 {
        let mut tasks = Vec::new();
        for i in 0..8 {
            let pool = if (round + i) % 2 == 0 {
                app.state.pool.clone()
            } else {
                other.clone()
            };
            let (caller, entry) = (caller.clone(), entry("writers.test"));
            tasks.push(tokio::spawn(async move {
                audit::record(&pool, &caller, entry).await
            }));
        }
        for t in tasks {
            t.await.unwrap().expect("row stored");
        }
    }
    let stored = app
        .count("SELECT count(*) FROM audit_log WHERE action = 'writers.test'")
        .await;
    assert_eq!(stored, 48);
    assert_chain_whole(&app).await;
}

fn context(tools: &str) -> Value {
    json!({"name": "cached", "description": "cache invalidation",
           "capabilities": [{"tool_pattern": tools}],
           "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}})
}

#[tokio::test]
async fn changes_made_through_another_replica_apply_to_the_next_call() {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.seal.security_contexts = vec![context("aegis.runtime.*")];
    let a = TestApp::spawn_with(config.clone()).await;
    let b = TestApp::spawn_with(config).await;

    for transport in [
        Transport::Http(a.http_base.clone()),
        Transport::Grpc(format!("http://{}", a.grpc_addr)),
    ] {
        // A context edit on replica B narrows what the session may call on replica A.
        b.posted("/v1/security-contexts", context("aegis.runtime.*"), 200)
            .await;
        let mut client = SealClient::new(transport.clone()).unwrap();
        client
            .attest("test-cache", "cached")
            .await
            .expect("attests");
        for _ in 0..3 {
            let out = client
                .call_tool("aegis.runtime.list", json!({}))
                .await
                .expect("allowed");
            assert_eq!(out["isError"], false, "{out}");
        }
        b.posted("/v1/security-contexts", context("aegis.agent.*"), 200)
            .await;
        let code = refused(client.call_tool("aegis.runtime.list", json!({})).await).0;
        assert!(code >= 1000, "a SEAL refusal code, got {code}");

        // A revocation on replica B refuses the session's next call on replica A (1006).
        b.posted("/v1/security-contexts", context("aegis.runtime.*"), 200)
            .await;
        let out = client
            .call_tool("aegis.runtime.list", json!({}))
            .await
            .expect("allowed again");
        assert_eq!(out["isError"], false, "{out}");
        let session = client.session_id().unwrap().to_owned();
        b.answered(
            Method::DELETE,
            &format!("/v1/seal/sessions/{session}"),
            None,
            200,
        )
        .await;
        assert_eq!(
            refused(client.call_tool("aegis.runtime.list", json!({})).await).0,
            1006
        );
    }
}
