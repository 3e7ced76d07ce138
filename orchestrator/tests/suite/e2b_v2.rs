//! E2B's current control API (issue 42): `POST /v2/sandboxes` with an `Idempotency-Key`, as
//! SDKs from 2.51 send it. A retried create with the same key makes one sandbox, never two,
//! also when the retries race; the same key with another body is refused; `POST
//! /v2/sandboxes/{id}/connect` takes an optional timeout.

use crate::common;
use crate::common::rest::JsonAnswer;

use std::collections::HashSet;

use common::{e2b_key, TestApp};
use serde_json::{json, Value};

#[tokio::test]
async fn a_retried_v2_create_with_one_idempotency_key_makes_one_sandbox() {
    let app = TestApp::spawn().await;
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
        .json_answer()
        .await;
    let again = create(Some("create-1"), body.clone()).await.unwrap();
    assert_eq!(again.status(), 201);
    let again: Value = again.json().await.unwrap();
    assert_eq!(first["sandboxID"], again["sandboxID"]);
    assert_eq!(first["envdAccessToken"], again["envdAccessToken"]);
    assert_eq!(app.count("SELECT count(*) FROM e2b_sandboxes").await, 1);

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
    assert_eq!(
        app.count("SELECT count(*) FROM e2b_sandboxes").await,
        2,
        "two keys, two sandboxes"
    );

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
    assert_eq!(app.count("SELECT count(*) FROM e2b_sandboxes").await, 2);

    // Without a key every create is its own; v2's default timeout is five minutes.
    let plain: Value = create(None, json!({"templateID": "base"}))
        .await
        .unwrap()
        .json_answer()
        .await;
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

/// What E2B's spec (HEAD's `spec/openapi.yml`, envd's `spec/envd/envd.yaml`) and its latest
/// SDK name beyond the served routes: the simple ones served (template aliases, the metrics of
/// several sandboxes, the network update), the others refused with 501 in
/// E2B's error shape naming what is not offered; a wrong method 405 and an unknown path 404 in
/// the same shape. And a sandbox gone is told the way E2B's edge tells it ("The sandbox was not
/// found", which SDKs from 2.5x read as `SandboxNotRunningException`).
#[tokio::test]
async fn the_rest_of_e2bs_api_is_served_or_refused_in_e2bs_error_shape() {
    let app = TestApp::spawn().await;
    let key = app.create_key("v2-spec", "operator").await;
    let call = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut request = app
            .http
            .request(method, format!("{}/e2b{path}", app.http_base))
            .header("X-API-KEY", e2b_key(&key));
        if let Some(body) = body {
            request = request.json(&body);
        }
        request.send()
    };
    use reqwest::Method as M;
    let answer = |response: reqwest::Response| async move {
        let status = response.status().as_u16();
        let body: Value = response.json().await.expect("a JSON body");
        (status, body)
    };

    // Refused: 501, E2B's {code, message}, naming the route and why.
    for (method, path, needle) in [
        (M::POST, "/v3/templates", "template build service"),
        (M::GET, "/templates", "runtimes"),
        (M::GET, "/templates/base", "runtimes"),
        (M::POST, "/templates/tags", "tags"),
        (M::GET, "/templates/base/tags/exists", "tags"),
        (
            M::GET,
            "/templates/x/builds/y/status",
            "template build service",
        ),
        (M::GET, "/default-templates", "runtimes"),
        (M::GET, "/teams", "E2B team"),
        (M::GET, "/teams/t/metrics", "E2B team"),
        (M::GET, "/api-keys", "/v1/api-keys"),
        (M::POST, "/access-tokens", "/v1/api-keys"),
        (M::POST, "/volumes", "no volumes"),
        (M::GET, "/secrets", "secrets"),
        (M::GET, "/nodes", "administration"),
        (M::POST, "/admin/teams/t/sandboxes/kill", "administration"),
        (M::POST, "/init", "E2B's own orchestrator"),
        (M::POST, "/files/compose", "no compose"),
        (M::GET, "/metrics", "get_metrics"),
    ] {
        let (status, body) = answer(call(method.clone(), path, None).await.unwrap()).await;
        assert_eq!(status, 501, "{method} {path}: {body}");
        assert_eq!(body["code"], 501, "{body}");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("{method} {path} is not offered")),
            "{message}"
        );
        assert!(message.contains(needle), "{method} {path}: {message}");
    }
    // A served path with another method, and a path E2B does not have either.
    let (status, body) = answer(call(M::PATCH, "/sandboxes", None).await.unwrap()).await;
    assert_eq!((status, &body["code"]), (405, &json!(405)), "{body}");
    let (status, body) = answer(call(M::GET, "/no/such/route", None).await.unwrap()).await;
    assert_eq!((status, &body["code"]), (404, &json!(404)), "{body}");
    assert!(common::json::text(&body["message"]).contains("GET /no/such/route"));

    // Template aliases (the SDK's Template.exists): a runtime, or the key's snapshot by name.
    let (status, body) = answer(call(M::GET, "/templates/aliases/base", None).await.unwrap()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"templateID": "base", "public": true}));
    let (status, body) = answer(
        call(M::GET, "/templates/aliases/no-such-template", None)
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, &body["code"]), (404, &json!(404)), "{body}");

    // A sandbox for the per-sandbox routes.
    let made: Value = call(
        M::POST,
        "/v2/sandboxes",
        Some(json!({"templateID": "base", "timeout": 60})),
    )
    .await
    .unwrap()
    .json_answer()
    .await;
    let id = made["sandboxID"].as_str().unwrap().to_owned();
    let token = made["envdAccessToken"].as_str().unwrap().to_owned();

    // The network update on a node that grants no egress (`e2b.egress` empty): asking for none
    // changes nothing and is accepted; asking for any is refused saying why (409); an entry
    // that is no host, address or block is refused naming it; another key's (or no) sandbox
    // is not found. (Granted egress: `e2b_egress::`.)
    for closed in [
        json!({"allow_internet_access": false}),
        json!({"denyOut": ["0.0.0.0/0"]}),
    ] {
        let response = call(
            M::PUT,
            &format!("/sandboxes/{id}/network"),
            Some(closed.clone()),
        )
        .await
        .unwrap();
        assert_eq!(response.status(), 204, "{closed}");
    }
    for open in [
        json!({}),
        json!({"allowOut": ["example.com"], "denyOut": ["0.0.0.0/0"]}),
        json!({"allow_internet_access": true}),
    ] {
        let (status, body) = answer(
            call(
                M::PUT,
                &format!("/sandboxes/{id}/network"),
                Some(open.clone()),
            )
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(status, 409, "{open}: {body}");
        assert!(
            common::json::text(&body["message"]).contains("grants this API key no egress"),
            "{body}"
        );
    }
    for (bad, field) in [
        (json!({"allowOut": ["a.*.test"]}), "allowOut[0]"),
        (json!({"denyOut": ["10.0.0.0/8", ""]}), "denyOut[1]"),
        (
            json!({"egressProxy": {"address": "p.test:1080"}}),
            "egressProxy",
        ),
        (json!({"rules": {"a.test": [{}]}}), "network.rules"),
    ] {
        let (status, body) = answer(
            call(
                M::PUT,
                &format!("/sandboxes/{id}/network"),
                Some(bad.clone()),
            )
            .await
            .unwrap(),
        )
        .await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains(field),
            "{bad}: {body}"
        );
    }
    let (status, _) = answer(
        call(
            M::PUT,
            &format!("/sandboxes/{}/network", uuid::Uuid::new_v4()),
            Some(json!({"allow_internet_access": false})),
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(status, 404);

    // Metrics of several sandboxes: the key's running ones, an unknown id left out.
    let other = uuid::Uuid::new_v4();
    let (status, body) = answer(
        call(
            M::GET,
            &format!("/sandboxes/metrics?sandbox_ids={id},{other}"),
            None,
        )
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let sandboxes = body["sandboxes"].as_object().unwrap();
    assert_eq!(sandboxes.len(), 1, "{body}");
    let metric = &sandboxes[&id];
    for field in ["timestampUnix", "cpuCount", "memTotal", "diskTotal"] {
        assert!(
            metric[field].as_u64().is_some_and(|n| n > 0),
            "{field}: {body}"
        );
    }
    let (status, _) = answer(call(M::GET, "/sandboxes/metrics", None).await.unwrap()).await;
    assert_eq!(status, 400);

    // Killed: envd's /health answers as E2B's edge, 502 "The sandbox was not found".
    let health = || {
        app.http
            .get(format!("{}/e2b/health", app.http_base))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token)
            .send()
    };
    assert_eq!(health().await.unwrap().status(), 204);
    let killed = call(M::DELETE, &format!("/sandboxes/{id}"), None)
        .await
        .unwrap();
    assert_eq!(killed.status(), 204);
    let (status, body) = answer(health().await.unwrap()).await;
    assert_eq!(status, 502, "{body}");
    assert!(
        common::json::text(&body["message"]).starts_with("The sandbox was not found"),
        "{body}"
    );
}

/// The deprecated `POST /sandboxes/{id}/resume` takes `autoPause` (E2B's `ResumedSandbox`) and
/// keeps it: the resumed sandbox's timeout pauses it; without the field, what its timeout did
/// stays.
#[tokio::test]
async fn a_resume_with_auto_pause_makes_the_timeout_pause() {
    let app = TestApp::spawn().await;
    let key = app.create_key("v2-resume", "operator").await;
    let call = |path: String, body: Option<Value>| {
        let mut request = match body {
            Some(body) => app
                .http
                .post(format!("{}/e2b{path}", app.http_base))
                .json(&body),
            None => app.http.get(format!("{}/e2b{path}", app.http_base)),
        };
        request = request.header("X-API-KEY", e2b_key(&key));
        request.send()
    };
    let made: Value = call(
        "/sandboxes".into(),
        Some(json!({"templateID": "base", "timeout": 60})),
    )
    .await
    .unwrap()
    .json_answer()
    .await;
    let id = made["sandboxID"].as_str().unwrap().to_owned();
    let on_timeout = || async {
        let detail: Value = call(format!("/sandboxes/{id}"), None)
            .await
            .unwrap()
            .json_answer()
            .await;
        detail["lifecycle"]["onTimeout"].clone()
    };
    assert_eq!(on_timeout().await, "kill");
    for (body, expected) in [
        (json!({"timeout": 60, "autoPause": true}), "pause"),
        (json!({"timeout": 60}), "pause"),
        (json!({"timeout": 60, "autoPause": false}), "kill"),
    ] {
        let paused = call(format!("/sandboxes/{id}/pause"), Some(json!({})))
            .await
            .unwrap();
        assert_eq!(paused.status(), 204, "{}", paused.text().await.unwrap());
        let resumed = call(format!("/sandboxes/{id}/resume"), Some(body.clone()))
            .await
            .unwrap();
        assert_eq!(resumed.status(), 201, "{}", resumed.text().await.unwrap());
        assert_eq!(on_timeout().await, expected, "{body}");
    }
}
