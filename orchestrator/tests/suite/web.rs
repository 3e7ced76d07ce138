//! `web.fetch` and `web.search` against test servers this file starts on loopback.
//!
//! The allowed test site listens on 127.0.0.2, made reachable by the operator feature
//! `egress.allow_cidrs: [127.0.0.2/32]`; names come from `egress.hosts`. A "trap" listener on
//! 127.0.0.1 counts every connection it accepts: the refusals of loopback forms (plain,
//! IPv4-mapped IPv6, decimal, hexadecimal, `0.0.0.0`, a redirect) must leave it at zero, which
//! shows that the refusal happened before any packet was sent. Other blocked ranges are only
//! ever named in URLs that must be refused before connecting; nothing leaves the machine.

use crate::common;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::Query;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use common::net::{served_on_loopback, spawn_server};
use common::{test_config, TestApp, TestDb};
use orchestrator::caller::{Caller, SealScope, Tier};
use serde_json::{json, Value};
use tokio::net::TcpListener;

const CAP: u64 = 64 * 1024;

/// A listener on 127.0.0.1 that counts connections and answers nothing.
struct Trap {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

impl Trap {
    async fn start() -> Self {
        let (addr, accepted) = crate::common::net::trap().await;
        Self { addr, accepted }
    }

    fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// The allowed test site on 127.0.0.2.
async fn start_site(trap: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind 127.0.0.2 (loopback /8 is local on Linux)");
    let addr = listener.local_addr().expect("site addr");
    let port = addr.port();
    let redirect = |to: String| {
        move || {
            let to = to.clone();
            async move { (StatusCode::FOUND, [(header::LOCATION, to)]).into_response() }
        }
    };
    let app = Router::new()
        .route(
            "/page",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                    "<html><head><title>T</title></head><body><h1>Allowed site</h1>\
                     <p>Hello <a href=\"/next\">next page</a></p></body></html>",
                )
            }),
        )
        .route(
            "/big",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/plain")],
                    "x".repeat(CAP as usize * 4),
                )
            }),
        )
        .route(
            "/image",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "image/png")],
                    vec![0x89u8, b'P', b'N', b'G'],
                )
            }),
        )
        .route("/hop", get(redirect("/page".to_owned())))
        .route("/loop", get(redirect("/loop".to_owned())))
        .route(
            "/to-loopback",
            get(redirect(format!("http://127.0.0.1:{}/secret", trap.port()))),
        )
        .route(
            "/to-metadata",
            get(redirect(
                "http://169.254.169.254/latest/meta-data/".to_owned(),
            )),
        )
        .route(
            "/to-other",
            get(redirect(format!("http://other.test:{port}/page"))),
        )
        .route(
            "/to-ftp",
            get(redirect("ftp://www.site.test/file".to_owned())),
        );
    spawn_server(listener, app);
    addr
}

struct Setup {
    app: TestApp,
    site: SocketAddr,
    trap: Trap,
}

async fn setup(web: Option<Value>) -> Setup {
    let trap = Trap::start().await;
    let site = start_site(trap.addr).await;
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.egress.allow_cidrs = vec!["127.0.0.2/32".to_owned()];
    config.egress.max_body_bytes = CAP;
    let ip = |s: &str| -> IpAddr { s.parse().expect("ip") };
    config.egress.hosts = BTreeMap::from([
        ("site.test".to_owned(), vec![ip("127.0.0.2")]),
        ("www.site.test".to_owned(), vec![ip("127.0.0.2")]),
        ("other.test".to_owned(), vec![ip("127.0.0.2")]),
        ("internal.test".to_owned(), vec![ip("10.20.30.40")]),
        (
            "rebind.test".to_owned(),
            vec![ip("127.0.0.2"), ip("127.0.0.1")],
        ),
        ("metadata.test".to_owned(), vec![ip("169.254.169.254")]),
    ]);
    if let Some(web) = web {
        config.web = serde_json::from_value(web).expect("web config");
    }
    let mut app = TestApp::spawn_with(config).await;
    app.db = Some(db);
    Setup { app, site, trap }
}

/// Calls a tool through the REST door as the admin operator; returns the MCP-shaped body.
async fn call(s: &Setup, name: &str, args: Value) -> Value {
    let (status, body) = s.app.call_tool(name, args).await;
    assert_eq!(status, 200, "{body}");
    body
}

fn error_code(body: &Value) -> &str {
    body["structuredContent"]["error"]["code"]
        .as_str()
        .unwrap_or("(no error)")
}

#[tokio::test]
async fn fetches_an_allowed_site_and_converts_html_to_markdown() {
    let s = setup(None).await;
    let url = format!("http://site.test:{}/page", s.site.port());
    let body = call(&s, "web.fetch", json!({"url": url})).await;
    assert_eq!(body["isError"], false, "{body}");
    let out = &body["structuredContent"];
    assert_eq!(out["status"], 200);
    assert_eq!(out["format"], "markdown");
    assert_eq!(out["content_type"], "text/html; charset=utf-8");
    assert_eq!(out["truncated"], false);
    let content = out["content"].as_str().expect("content");
    assert!(content.contains("# Allowed site"), "{content}");
    assert!(content.contains("[next page](/next)"), "{content}");
    assert!(!content.contains("<p>"), "{content}");

    let raw = call(&s, "web.fetch", json!({"url": url, "to_markdown": false})).await;
    assert_eq!(raw["structuredContent"]["format"], "text");
    assert!(raw["structuredContent"]["content"]
        .as_str()
        .is_some_and(|c| c.contains("<h1>Allowed site</h1>")));

    // A redirect inside the allowed site is followed and reported.
    let hop = call(
        &s,
        "web.fetch",
        json!({"url": format!("http://site.test:{}/hop", s.site.port())}),
    )
    .await;
    assert_eq!(hop["isError"], false, "{hop}");
    assert_eq!(
        hop["structuredContent"]["redirects"],
        json!([format!("http://site.test:{}/page", s.site.port())])
    );
    assert_eq!(s.trap.connections(), 0);
}

#[tokio::test]
async fn every_blocked_address_class_is_refused_before_connecting() {
    let s = setup(None).await;
    let trap = s.trap.addr.port();
    let site = s.site.port();
    let cases = [
        // Loopback in every spelling; the trap listens there.
        (format!("http://127.0.0.1:{trap}/"), "loopback"),
        (format!("http://[::ffff:127.0.0.1]:{trap}/"), "loopback"),
        (format!("http://[::ffff:7f00:1]:{trap}/"), "loopback"),
        (format!("http://2130706433:{trap}/"), "loopback"),
        (format!("http://0x7f000001:{trap}/"), "loopback"),
        (format!("http://0177.0.0.1:{trap}/"), "loopback"),
        (format!("http://127.1:{trap}/"), "loopback"),
        (format!("http://[::1]:{trap}/"), "loopback"),
        (format!("http://0.0.0.0:{trap}/"), "unspecified"),
        (format!("http://localhost:{trap}/"), "loopback"),
        // A name that resolves to a private address, and one that mixes in loopback.
        (format!("http://internal.test:{site}/"), "private"),
        (format!("http://rebind.test:{trap}/"), "loopback"),
        // The other ranges, as literals (refused before any socket exists).
        ("http://10.1.2.3/".to_owned(), "private"),
        ("http://172.16.5.4/".to_owned(), "private"),
        ("http://192.168.0.1/".to_owned(), "private"),
        ("http://100.64.0.1/".to_owned(), "cgnat"),
        ("http://169.254.10.10/".to_owned(), "link_local"),
        (
            "http://169.254.169.254/latest/meta-data/".to_owned(),
            "cloud_metadata",
        ),
        ("http://[::ffff:a9fe:a9fe]/".to_owned(), "cloud_metadata"),
        (format!("http://metadata.test:{site}/"), "cloud_metadata"),
        ("http://224.0.0.1/".to_owned(), "multicast"),
        ("http://255.255.255.255/".to_owned(), "broadcast"),
        ("http://240.0.0.1/".to_owned(), "reserved"),
        ("http://[fd00::1]/".to_owned(), "unique_local"),
        ("http://[fe80::1]/".to_owned(), "link_local"),
        ("http://[ff02::1]/".to_owned(), "multicast"),
    ];
    for (url, class) in &cases {
        let body = call(&s, "web.fetch", json!({"url": url})).await;
        assert_eq!(body["isError"], true, "{url}: {body}");
        assert_eq!(error_code(&body), "address_blocked", "{url}: {body}");
        let message = body["structuredContent"]["error"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(
            message.contains(&format!("({class} range)")),
            "{url}: expected class {class}: {message}"
        );
    }
    assert_eq!(s.trap.connections(), 0, "a refused fetch reached the trap");

    // The audit log holds each refusal as a failed web.fetch.
    let pool = s.app.state.pool.clone();
    let (n,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM audit_log WHERE action = 'web.fetch' AND reason_code = 'address_blocked'",
    )
    .fetch_one(&pool)
    .await
    .expect("audit count");
    assert_eq!(n as usize, cases.len());
}

#[tokio::test]
async fn redirects_are_checked_on_every_hop() {
    let s = setup(None).await;
    let site = s.site.port();
    let at = |path: &str| json!({"url": format!("http://site.test:{site}{path}")});

    let body = call(&s, "web.fetch", at("/to-loopback")).await;
    assert_eq!(error_code(&body), "address_blocked", "{body}");
    assert!(body["structuredContent"]["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("127.0.0.1") && m.contains("loopback")));

    let body = call(&s, "web.fetch", at("/to-metadata")).await;
    assert_eq!(error_code(&body), "address_blocked", "{body}");

    let body = call(&s, "web.fetch", at("/to-ftp")).await;
    assert_eq!(error_code(&body), "scheme_not_allowed", "{body}");

    let body = call(&s, "web.fetch", at("/loop")).await;
    assert_eq!(error_code(&body), "too_many_redirects", "{body}");

    assert_eq!(s.trap.connections(), 0, "the redirect reached loopback");
}

#[tokio::test]
async fn a_body_larger_than_the_cap_is_truncated_and_flagged() {
    let s = setup(None).await;
    let body = call(
        &s,
        "web.fetch",
        json!({"url": format!("http://site.test:{}/big", s.site.port())}),
    )
    .await;
    let out = &body["structuredContent"];
    assert_eq!(body["isError"], false, "{body}");
    assert_eq!(out["truncated"], true);
    assert_eq!(out["bytes"], CAP);
    assert_eq!(out["content"].as_str().map(str::len), Some(CAP as usize));

    let image = call(
        &s,
        "web.fetch",
        json!({"url": format!("http://site.test:{}/image", s.site.port())}),
    )
    .await;
    assert_eq!(error_code(&image), "unsupported_content_type", "{image}");
}

#[tokio::test]
async fn other_schemes_and_bad_urls_are_refused() {
    let s = setup(None).await;
    for (url, code) in [
        ("file:///etc/passwd", "scheme_not_allowed"),
        ("gopher://site.test/", "scheme_not_allowed"),
        ("ftp://site.test/", "scheme_not_allowed"),
        ("not a url", "invalid_url"),
    ] {
        let body = call(&s, "web.fetch", json!({"url": url})).await;
        assert_eq!(error_code(&body), code, "{url}: {body}");
    }
}

/// A caller under a SEAL security context whose web capability admits `allow`.
async fn sealed_caller(allow: Value) -> Caller {
    let context = orchestrator::contexts::parse(&json!({
        "name": "web-reader",
        "description": "reads the test site",
        "capabilities": [{"tool_pattern": "web.*", "domain_allowlist": allow}],
    }))
    .expect("context parses");
    Caller {
        kind: orchestrator::caller::CallerKind::Session,
        id: uuid::Uuid::new_v4().to_string(),
        label: "test session".to_owned(),
        tier: Tier::User,
        role: None,
        tenant: "default".to_owned(),
        seal: Some(SealScope {
            context: Arc::new(context),
            limiter: Arc::new(orchestrator::seal::RateLimiter::new()),
            session_key: "test".to_owned(),
            ceilings: Vec::new(),
        }),
    }
}

#[tokio::test]
async fn the_security_contexts_domain_allowlist_bounds_every_hop() {
    let s = setup(None).await;
    let caller = sealed_caller(json!(["*.site.test"])).await;
    let site = s.site.port();
    let fetch = |url: String| {
        let caller = caller.clone();
        let state = s.app.state.clone();
        async move {
            orchestrator::tools::invoke(&state, &caller, "web.fetch", json!({"url": url})).await
        }
    };

    let ok = fetch(format!("http://www.site.test:{site}/page"))
        .await
        .expect("allowed");
    assert!(ok.result.is_ok(), "{:?}", ok.result);

    // `*.site.test` does not cover the apex: refused by policy before the tool runs.
    let apex = fetch(format!("http://site.test:{site}/page")).await;
    assert!(
        matches!(&apex, Err(orchestrator::tools::CallError::Denied { denial, .. }) if denial.code == "POLICY_VIOLATION_DOMAIN_NOT_ALLOWED"),
        "{apex:?}"
    );

    // An allowed host redirecting to a host outside the list: refused at the hop.
    let hop = fetch(format!("http://www.site.test:{site}/to-other"))
        .await
        .expect("ran");
    let err = hop.result.expect_err("refused at the redirect");
    assert_eq!(err.code, "domain_not_allowed", "{err:?}");
    assert!(err.message.contains("other.test"), "{}", err.message);
}

/// A SearXNG-shaped provider on loopback; answers the query `q` with a fixed result list.
async fn start_searxng() -> SocketAddr {
    let app = Router::new().route(
        "/search",
        get(|Query(q): Query<BTreeMap<String, String>>| async move {
            if q.get("format").map(String::as_str) != Some("json") {
                return StatusCode::BAD_REQUEST.into_response();
            }
            let query = q.get("q").cloned().unwrap_or_default();
            axum::Json(json!({"query": query, "results": [
                {"title": "Allowed one", "url": "https://www.site.test/a", "content": format!("about {query}")},
                {"title": "Apex", "url": "https://site.test/b", "content": "apex"},
                {"title": "Elsewhere", "url": "https://evil.example/c", "content": "no"},
                {"title": "Allowed two", "url": "http://docs.site.test/d", "content": "two"},
                {"title": "Not web", "url": "ftp://www.site.test/e", "content": "ftp"}
            ]}))
            .into_response()
        }),
    );
    served_on_loopback(app).await
}

/// A Brave-shaped provider that insists on its subscription token.
async fn start_brave(token: &'static str) -> SocketAddr {
    let app = Router::new().route(
        "/res/v1/web/search",
        get(move |headers: HeaderMap| async move {
            if headers
                .get("x-subscription-token")
                .and_then(|v| v.to_str().ok())
                != Some(token)
            {
                return Response::builder()
                    .status(StatusCode::UNAUTHORIZED)
                    .body(axum::body::Body::empty())
                    .unwrap_or_default();
            }
            axum::Json(json!({"web": {"results": [
                {"title": "B1", "url": "https://www.site.test/x", "description": "brave one"},
                {"title": "B2", "url": "https://evil.example/y", "description": "brave two"}
            ]}}))
            .into_response()
        }),
    );
    served_on_loopback(app).await
}

#[tokio::test]
async fn search_results_come_through_a_provider_filtered_by_the_allowlist() {
    let provider = start_searxng().await;
    let s = setup(Some(json!({"search_providers": [
        {"kind": "searxng", "url": format!("http://{provider}")}
    ]})))
    .await;

    // An operator has no domain bound: every http(s) result comes back, normalised.
    let body = call(&s, "web.search", json!({"query": "rust egress"})).await;
    let out = &body["structuredContent"];
    assert_eq!(out["provider"], "searxng", "{body}");
    assert_eq!(out["results"].as_array().map(Vec::len), Some(4), "{body}");
    assert_eq!(out["results"][0]["snippet"], "about rust egress");
    assert_eq!(out["filtered_out"], 1);

    // A session bound to `*.site.test` sees only the two subdomain results.
    let caller = sealed_caller(json!(["*.site.test"])).await;
    let outcome = orchestrator::tools::invoke(
        &s.app.state,
        &caller,
        "web.search",
        json!({"query": "rust"}),
    )
    .await
    .expect("allowed");
    let out = outcome.result.expect("search ran");
    let urls = common::json::present_strs(&out["results"], "url");
    assert_eq!(urls, ["https://www.site.test/a", "http://docs.site.test/d"]);
    assert_eq!(out["filtered_out"], 3);
}

#[tokio::test]
async fn the_brave_shape_sends_the_key_from_the_environment_and_falls_back_in_order() {
    const VAR: &str = "EGRESS_TEST_BRAVE_KEY";
    const TOKEN: &str = "brave-test-token";
    std::env::set_var(VAR, TOKEN);
    let brave = start_brave(TOKEN).await;
    let dead = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let dead_addr = dead.local_addr().expect("addr");
    drop(dead);
    let s = setup(Some(json!({"search_providers": [
        {"kind": "searxng", "url": format!("http://{dead_addr}"), "timeout_secs": 5},
        {"kind": "brave", "url": format!("http://{brave}/res/v1/web/search"), "api_key_env": VAR}
    ]})))
    .await;
    let body = call(&s, "web.search", json!({"query": "q", "max_results": 5})).await;
    let out = &body["structuredContent"];
    assert_eq!(out["provider"], "brave", "{body}");
    assert_eq!(out["results"][0]["snippet"], "brave one");
    assert_eq!(out["results"].as_array().map(Vec::len), Some(2));

    let none = setup(None).await;
    let body = call(&none, "web.search", json!({"query": "q"})).await;
    assert_eq!(error_code(&body), "not_configured", "{body}");
}

/// A site serving hostile documents on 127.0.0.2: deep nesting, a huge flat page, deep JSON.
async fn start_hostile_site() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.2:0")
        .await
        .expect("bind 127.0.0.2");
    let addr = listener.local_addr().expect("addr");
    let html = |body: String| {
        move || {
            let body = body.clone();
            async move { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body) }
        }
    };
    let nested =
        |levels: usize| format!("{}deep{}", "<div>".repeat(levels), "</div>".repeat(levels));
    let flat: String = (0..150_000)
        .map(|i| format!("<p>paragraph {i}</p>"))
        .collect();
    let json_deep = format!("{}1{}", "[".repeat(500_000), "]".repeat(500_000));
    let app = Router::new()
        .route("/deep-5000", get(html(nested(5_000))))
        .route("/deep-200000", get(html(nested(200_000))))
        .route("/unclosed", get(html("<span/>".repeat(300_000))))
        .route("/flat", get(html(flat)))
        .route("/ok", get(html(nested(50))))
        .route(
            "/deep.json",
            get(move || {
                let body = json_deep.clone();
                async move { ([(header::CONTENT_TYPE, "application/json")], body) }
            }),
        );
    spawn_server(listener, app);
    addr
}

/// Issue 20 #10, as the attack: pages that an agent allowed to fetch could be pointed at. Before,
/// 5,000 nested `<div>`s overflowed the stack during the HTML-to-Markdown conversion and
/// aborted the whole process (this test binary with it), and 200,000 levels held a worker for
/// minutes. Now each call answers within its bound, with a `document_too_deep` error or a
/// result, the raw text stays available, and the node is ready right after each one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_documents_get_an_error_and_the_node_stays_up() {
    let site = start_hostile_site().await;
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.egress.allow_cidrs = vec!["127.0.0.2/32".to_owned()];
    config.egress.max_body_bytes = 4 * 1024 * 1024;
    config.egress.hosts = BTreeMap::from([(
        "hostile.test".to_owned(),
        vec!["127.0.0.2".parse().expect("ip")],
    )]);
    let mut app = TestApp::spawn_with(config).await;
    app.db = Some(db);
    let port = site.port();
    let bound = std::time::Duration::from_secs(30);

    let fetch = |path: &str, to_markdown: bool| {
        let url = format!("http://hostile.test:{port}{path}");
        let app = &app;
        async move {
            let started = std::time::Instant::now();
            let (status, body) = tokio::time::timeout(
                bound,
                app.call_tool("web.fetch", json!({"url": url, "to_markdown": to_markdown})),
            )
            .await
            .unwrap_or_else(|_| panic!("{url}: no answer within {bound:?}"));
            assert_eq!(status, 200, "{url}: {body}");
            let ready = app.get("/health/ready").await;
            assert_eq!(ready.status(), 200, "{url}: not ready right after the call");
            (body, started.elapsed())
        }
    };

    for path in ["/deep-5000", "/deep-200000", "/unclosed"] {
        let (body, took) = fetch(path, true).await;
        assert_eq!(body["isError"], true, "{path}: {body}");
        assert_eq!(error_code(&body), "document_too_deep", "{path}: {body}");
        let message = body["structuredContent"]["error"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(
            message.contains("512 levels") && message.contains("to_markdown: false"),
            "{message}"
        );
        assert!(took < bound, "{path}: {took:?}");
        // The raw text is still there for whoever wants it.
        let (raw, _) = fetch(path, false).await;
        assert_eq!(raw["isError"], false, "{path}: {raw}");
        assert_eq!(raw["structuredContent"]["format"], "text");
    }

    // A huge flat page (3.3 MB, 150,000 paragraphs): converted, or stopped at the time limit,
    // within the call either way.
    let (body, _) = fetch("/flat", true).await;
    if body["isError"] == true {
        assert_eq!(error_code(&body), "document_timeout", "{body}");
    } else {
        let content = body["structuredContent"]["content"]
            .as_str()
            .unwrap_or_default();
        assert!(
            content.contains("paragraph 149999"),
            "{}",
            &content[content.len().saturating_sub(200)..]
        );
    }

    // A deep JSON document is returned as text, never parsed.
    let (body, _) = fetch("/deep.json", true).await;
    assert_eq!(body["isError"], false, "{body}");
    assert_eq!(body["structuredContent"]["format"], "text");
    assert_eq!(body["structuredContent"]["bytes"], 1_000_001);

    // Ordinary nesting still converts.
    let (body, _) = fetch("/ok", true).await;
    assert_eq!(body["isError"], false, "{body}");
    assert_eq!(body["structuredContent"]["content"], "deep");

    // Deeply nested JSON arguments are refused at the door with a clear answer, not parsed
    // into a stack overflow; the node stays ready.
    for levels in [200usize, 100_000] {
        let arguments = format!(
            "{{\"url\": \"http://hostile.test:{port}/ok\", \"x\": {}1{}}}",
            "[".repeat(levels),
            "]".repeat(levels)
        );
        let body = format!("{{\"name\": \"web.fetch\", \"arguments\": {arguments}}}");
        let r = tokio::time::timeout(
            bound,
            app.admin(reqwest::Method::POST, "/v1/tools/call")
                .header(header::CONTENT_TYPE, "application/json")
                .body(body)
                .send(),
        )
        .await
        .expect("answered in time")
        .expect("answered");
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        assert!((400..500).contains(&status), "{levels}: {status} {text}");
        assert!(text.contains("recursion limit"), "{levels}: {text}");
        let ready = app.get("/health/ready").await;
        assert_eq!(ready.status(), 200);
    }
}
