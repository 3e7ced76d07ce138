//! E2B's current control API (issue 42): `POST /v2/sandboxes` with an `Idempotency-Key`, as
//! SDKs from 2.51 send it. A retried create with the same key makes one sandbox, never two,
//! also when the retries race; the same key with another body is refused; `POST
//! /v2/sandboxes/{id}/connect` takes an optional timeout.

use crate::common;

use std::collections::HashSet;

use common::{e2b_key, test_config, TestApp, TestDb};
use serde_json::{json, Value};

async fn rows(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM e2b_sandboxes")
        .fetch_one(&app.state.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_retried_v2_create_with_one_idempotency_key_makes_one_sandbox() {
    let db = TestDb::create().await;
    let app = TestApp::spawn_with(test_config(&db.url)).await;
    let key = app.create_key("v2-creator", "operator").await;
    let create = |idempotency: Option<&str>, body: Value| {
        let mut request = app
            .http
            .post(format!("{}/e2b/v2/sandboxes", app.http_base))
            .header("X-API-KEY", e2b_key(&key))
            .json(&body);
        if let Some(k) = idempotency {
            request = request.header("Idempotency-Key", k);
        }
        request.send()
    };
    let body = json!({"templateID": "base", "timeout": 60, "metadata": {"run": "1"}});

    // A retry after the first answered: the same sandbox, token and all.
    let first: Value = create(Some("create-1"), body.clone())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let again = create(Some("create-1"), body.clone()).await.unwrap();
    assert_eq!(again.status(), 201);
    let again: Value = again.json().await.unwrap();
    assert_eq!(first["sandboxID"], again["sandboxID"]);
    assert_eq!(first["envdAccessToken"], again["envdAccessToken"]);
    assert_eq!(rows(&app).await, 1);

    // Retries racing each other: one sandbox; the others get it or are told to wait.
    let racing = (0..4).map(|_| create(Some("create-2"), body.clone()));
    let mut ids = HashSet::new();
    for answer in futures_util::future::join_all(racing).await {
        let answer = answer.unwrap();
        match answer.status().as_u16() {
            201 => {
                let made: Value = answer.json().await.unwrap();
                ids.insert(made["sandboxID"].as_str().unwrap().to_owned());
            }
            409 => assert!(answer.text().await.unwrap().contains("still running")),
            other => panic!("{other}: {}", answer.text().await.unwrap()),
        }
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(rows(&app).await, 2, "two keys, two sandboxes");

    // The same key with another body, a malformed key: refused, nothing made.
    let other = create(
        Some("create-1"),
        json!({"templateID": "base", "timeout": 90}),
    )
    .await
    .unwrap();
    assert_eq!(other.status(), 422);
    assert!(other.text().await.unwrap().contains("another request body"));
    let malformed = create(Some("two words"), body.clone()).await.unwrap();
    assert_eq!(malformed.status(), 400);
    assert_eq!(rows(&app).await, 2);

    // Without a key every create is its own; v2's default timeout is five minutes.
    let plain: Value = create(None, json!({"templateID": "base"}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_ne!(plain["sandboxID"], first["sandboxID"]);
    let secs: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM end_at - started_at)::float8 FROM e2b_sandboxes \
         WHERE e2b_id::text = $1",
    )
    .bind(plain["sandboxID"].as_str().unwrap())
    .fetch_one(&app.state.pool)
    .await
    .unwrap();
    assert!((secs - 300.0).abs() < 5.0, "{secs}");

    // v2 connect: the timeout may be left out.
    let id = first["sandboxID"].as_str().unwrap();
    let connected = app
        .http
        .post(format!("{}/e2b/v2/sandboxes/{id}/connect", app.http_base))
        .header("X-API-KEY", e2b_key(&key))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        connected.status(),
        200,
        "{}",
        connected.text().await.unwrap()
    );
}
