//! Preview URLs of our own sandboxes (issue 45): a REST runtime sandbox serves
//! `python3 -m http.server`, and a preview URL opens that port to a client without an API key,
//! through the query secret and then the cookie its first answer sets, until it is revoked or
//! expires; another sandbox's or another port's secret, a revoked or expired one, another key's
//! attempt to make one, and bad ports and lifetimes are refused; the rows are audited and go
//! with the sandbox.

use std::time::Duration;

use reqwest::header::{COOKIE, HOST, SET_COOKIE};
use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{test_config, TestApp, TestDb};

const DOMAIN: &str = "previews.test";

async fn sandbox(app: &TestApp, key: &str) -> String {
    let r = app
        .rest_as(key)
        .post_json(
            "/v1/sandboxes",
            &json!({"runtime": "base:bookworm", "allow": ["python3 -m"]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let body: Value = r.json().await.expect("json");
    body["sandbox_id"].as_str().expect("sandbox id").to_owned()
}

async fn preview(app: &TestApp, key: &str, sandbox: &str, body: Value) -> (u16, Value) {
    let r = app
        .rest_as(key)
        .post_json(&format!("/v1/sandboxes/{sandbox}/previews"), &body)
        .await;
    (r.status().as_u16(), r.json().await.expect("json"))
}

/// A client with no key: the node's address, the URL's host as `Host`.
struct Visit {
    status: u16,
    body: String,
    set_cookie: Option<String>,
}

async fn visit(app: &TestApp, url: &str, cookie: Option<&str>) -> Visit {
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let client = reqwest::Client::new();
    let mut request = client
        .get(format!("{}{path}", app.http_base))
        .header(HOST, host);
    if let Some(cookie) = cookie {
        request = request.header(COOKIE, cookie);
    }
    let r = request.send().await.expect("request sent");
    let status = r.status().as_u16();
    let set_cookie = r
        .headers()
        .get(SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Visit {
        status,
        body: r.text().await.unwrap_or_default(),
        set_cookie,
    }
}

/// The secret of a made preview's URL.
fn secret_of(made: &Value) -> String {
    made["url"]
        .as_str()
        .and_then(|u| u.split("aegis_preview=").nth(1))
        .unwrap_or_else(|| panic!("a secret: {made}"))
        .to_owned()
}

async fn count(app: &TestApp, sql: &str, sandbox: &str) -> i64 {
    app.one(sql, uuid::Uuid::parse_str(sandbox).expect("uuid"))
        .await
}

const PREVIEW_ROWS: &str = "SELECT count(*) FROM sandbox_previews WHERE sandbox_id = $1";

const PORT_ROWS: &str =
    "SELECT count(*) FROM audit_log WHERE action = 'sandbox.port' AND sandbox_id = $1";

#[tokio::test]
async fn a_preview_url_opens_one_port_until_revoked_or_expired_and_nothing_else() {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.e2b.domain = DOMAIN.to_owned();
    let app = TestApp::spawn_with(config).await;
    let owner = app.create_key("preview-owner", "operator").await;
    let other = app.create_key("preview-other", "operator").await;
    let a = sandbox(&app, &owner).await;
    let b = sandbox(&app, &owner).await;

    let r = app.rest_as(&owner).post_json("/v1/tools/call", &json!({"name": "cmd.run", "sandbox_id": a, "arguments": { "command": "python3 -m http.server 8000 --bind 127.0.0.1", "background": true}})).await;
    let started: Value = r.json().await.expect("json");
    assert!(
        started.get("error").is_none() && started["isError"] != json!(true),
        "server started: {started}"
    );

    // Another key may not make one for a sandbox it does not own: 404, no preview row.
    let (status, body) = preview(&app, &other, &a, json!({"port": 8000})).await;
    assert_eq!(status, 404, "{body}");
    let none = count(&app, PREVIEW_ROWS, &a).await;
    assert_eq!(none, 0);
    // Bad ports and lifetimes, each named.
    for (bad, says) in [
        (json!({"port": 0}), "port"),
        (json!({"port": 49983}), "port"),
        (json!({"port": 8000, "ttl_secs": 0}), "ttl_secs"),
        (json!({"port": 8000, "ttl_secs": 86401}), "ttl_secs"),
    ] {
        let (status, body) = preview(&app, &owner, &a, bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.to_string().contains(says), "{bad}: {body}");
    }

    let (status, made) = preview(&app, &owner, &a, json!({"port": 8000})).await;
    assert_eq!(status, 201, "{made}");
    let url = made["url"].as_str().expect("url").to_owned();
    assert!(
        url.starts_with(&format!("http://8000-{a}.{DOMAIN}/?aegis_preview=")),
        "{url}"
    );
    assert!(!url.contains(&owner), "the URL never carries the API key");
    let preview_id = made["id"].as_str().expect("id").to_owned();

    // The server is up within a while; then the page answers with no key at all.
    let mut page = visit(&app, &url, None).await;
    for _ in 0..100 {
        if page.status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        page = visit(&app, &url, None).await;
    }
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("Directory listing"), "{}", page.body);
    let cookie = page
        .set_cookie
        .clone()
        .expect("the first answer sets the cookie");
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    let cookie = cookie.split(';').next().expect("name=value").to_owned();
    // A relative link of the page: the cookie alone opens it.
    let linked = visit(&app, &format!("http://8000-{a}.{DOMAIN}/"), Some(&cookie)).await;
    assert_eq!(linked.status, 200, "{}", linked.body);
    let admitted_rows = count(&app, PORT_ROWS, &a).await;
    assert!(admitted_rows >= 1);

    // Without a secret, with a made-up one, another port's, another sandbox's: refused, and no
    // audit row (anyone can send these).
    // No secret: 403 saying the sandbox's ports need a preview (it is known, the caller just
    // holds none); by E2B's headers alike. A sandbox nobody knows stays E2B's 502 "not found".
    let bare = visit(&app, &format!("http://8000-{a}.{DOMAIN}/"), None).await;
    assert_eq!(bare.status, 403, "{}", bare.body);
    assert!(
        bare.body.contains("not an E2B sandbox") && bare.body.contains("preview URL"),
        "{}",
        bare.body
    );
    let by_headers = reqwest::Client::new()
        .get(format!("{}/e2b/", app.http_base))
        .header("E2b-Sandbox-Id", &a)
        .header("E2b-Sandbox-Port", "8000")
        .send()
        .await
        .expect("request sent");
    assert_eq!(by_headers.status(), 403);
    let (_, other_port) = preview(&app, &owner, &a, json!({"port": 8001})).await;
    let secret_8001 = secret_of(&other_port);
    let (_, of_b) = preview(&app, &owner, &b, json!({"port": 8000})).await;
    let secret_b = secret_of(&of_b);
    let unknown_sandbox = uuid::Uuid::new_v4();
    for (what, url, status, said) in [
        (
            "a sandbox nobody knows",
            format!("http://8000-{unknown_sandbox}.{DOMAIN}/"),
            502,
            "The sandbox was not found",
        ),
        (
            "a made-up secret",
            format!("http://8000-{a}.{DOMAIN}/?aegis_preview=00"),
            403,
            "",
        ),
        (
            "another port's secret",
            format!("http://8000-{a}.{DOMAIN}/?aegis_preview={secret_8001}"),
            403,
            "not for port 8000",
        ),
        (
            "another sandbox's secret",
            format!("http://8000-{a}.{DOMAIN}/?aegis_preview={secret_b}"),
            403,
            "",
        ),
    ] {
        let refused = visit(&app, &url, None).await;
        assert_eq!(refused.status, status, "{what}: {}", refused.body);
        assert!(refused.body.contains(said), "{what}: {}", refused.body);
    }
    assert_eq!(count(&app, PORT_ROWS, &a).await, admitted_rows);

    // The listing shows them, never a secret.
    let r = app
        .rest_as(&owner)
        .response(Method::GET, &format!("/v1/sandboxes/{a}/previews"), None)
        .await;
    assert_eq!(r.status(), 200);
    let listed: Value = r.json().await.expect("json");
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    assert!(!listed.to_string().contains(&secret_8001));
    assert!(!listed.to_string().contains("url"));
    assert_eq!(
        app.status_as(Method::GET, &format!("/v1/sandboxes/{a}/previews"), &other)
            .await,
        404
    );

    // Revoked (by the owner; the other key may not): neither the URL nor the cookie opens it
    // any more.
    let revoke = format!("/v1/sandboxes/{a}/previews/{preview_id}");
    for (key, status) in [(&other, 404), (&owner, 200)] {
        assert_eq!(app.status_as(Method::DELETE, &revoke, key).await, status);
    }
    let after = visit(&app, &url, None).await;
    assert_eq!(after.status, 403, "{}", after.body);
    assert!(after.body.contains("revoked"), "{}", after.body);
    let by_cookie = visit(&app, &format!("http://8000-{a}.{DOMAIN}/"), Some(&cookie)).await;
    assert_eq!(by_cookie.status, 403, "{}", by_cookie.body);

    // A short life ends by itself.
    let (status, short) = preview(&app, &owner, &a, json!({"port": 8000, "ttl_secs": 2})).await;
    assert_eq!(status, 201, "{short}");
    let short_url = short["url"].as_str().expect("url").to_owned();
    assert_eq!(visit(&app, &short_url, None).await.status, 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let expired = visit(&app, &short_url, None).await;
    assert_eq!(expired.status, 403, "{}", expired.body);
    assert!(expired.body.contains("expired"), "{}", expired.body);

    // Audited: each made and revoked preview, the other key's refused attempts.
    let admin_rows = |action: &'static str, outcome: &'static str| {
        let app = &app;
        let a = a.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM audit_log WHERE action = $1 AND sandbox_id = $2 \
                 AND decision = 'allowed' AND outcome = $3",
            )
            .bind(action)
            .bind(uuid::Uuid::parse_str(&a).expect("uuid"))
            .bind(outcome)
            .fetch_one(&app.state.pool)
            .await
            .expect("count")
        }
    };
    assert_eq!(admin_rows("sandbox.preview.create", "ok").await, 3);
    assert_eq!(admin_rows("sandbox.preview.revoke", "ok").await, 1);
    assert_eq!(admin_rows("sandbox.preview.create", "error").await, 1);
    assert_eq!(admin_rows("sandbox.preview.revoke", "error").await, 1);
    // The destroyed sandbox takes its previews with it.
    assert_eq!(
        app.status_as(Method::DELETE, &format!("/v1/sandboxes/{a}"), &owner)
            .await,
        200
    );
    let left = count(&app, PREVIEW_ROWS, &a).await;
    assert_eq!(left, 0);
    assert_eq!(
        app.status_as(Method::DELETE, &format!("/v1/sandboxes/{b}"), &owner)
            .await,
        200
    );
}
