//! The sandboxes' egress proxy: allowed hosts through CONNECT and plain HTTP, refusals by
//! domain, port and address, and one audit row per connection.
//!
//! Test hosts listen on 127.0.0.2 (made reachable with `egress.allow_cidrs`, as an operator
//! would for an internal mirror) and names come from `egress.hosts`; a trap on 127.0.0.1 shows
//! that refused targets never see a connection.

use crate::common;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::agent::AgentManifest;
use common::net::{counted_web_host, trap, web_host};
use common::sandbox::AgentSandbox;
use common::{test_config, TestApp, TestDb};
use orchestrator::egress::proxy::{EgressProxy, ProxyScope};
use orchestrator::egress::{DomainEntry, DomainPolicy, DomainRule};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Setup {
    app: TestApp,
    proxy: EgressProxy,
    allowed: SocketAddr,
    denied: SocketAddr,
    trap: SocketAddr,
    trapped: Arc<AtomicUsize>,
}

/// A node's configuration on `db` where each of `names` resolves to the test hosts' address
/// 127.0.0.2, which `egress.allow_cidrs` makes reachable.
fn config_with_hosts(db: &TestDb, names: &[&str]) -> orchestrator::config::NodeConfig {
    let mut config = test_config(&db.url);
    config.egress.allow_cidrs = vec!["127.0.0.2/32".to_owned()];
    let ip: IpAddr = "127.0.0.2".parse().expect("ip");
    config.egress.hosts = names
        .iter()
        .map(|name| ((*name).to_owned(), vec![ip]))
        .collect();
    config
}

/// An egress proxy of `app` on `bind` for sandbox `sandbox`, allowing the domain entries `allow`
/// (the network policy of an agent `test`).
async fn proxy_allowing(
    app: &TestApp,
    bind: SocketAddr,
    sandbox: &str,
    allow: &[String],
) -> EgressProxy {
    let mut domains = DomainPolicy::default();
    domains.push(DomainRule {
        source: "network policy of agent `test`".to_owned(),
        allow: Some(
            allow
                .iter()
                .map(|entry| DomainEntry::parse(entry).expect("entry"))
                .collect(),
        ),
        deny: vec![],
        exempt: Vec::new(),
    });
    let scope = ProxyScope {
        sandbox: sandbox.to_owned(),
        domains,
    };
    EgressProxy::start(
        bind,
        scope,
        app.state.egress.clone(),
        app.state.pool.clone(),
    )
    .await
    .unwrap_or_else(|e| panic!("proxy on {bind}: {e:?}"))
}

/// The port `app` serves HTTP on.
fn http_port(app: &TestApp) -> u16 {
    app.http_base
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("app port")
}

async fn setup() -> Setup {
    let allowed = web_host("allowed host says hi").await;
    let denied = web_host("denied host").await;
    let (trap, trapped) = trap().await;
    let db = TestDb::create().await;
    let mut config = config_with_hosts(&db, &["allowed.test", "denied.test"]);
    config.egress.hosts.insert(
        "sneaky.test".to_owned(),
        vec!["127.0.0.1".parse().expect("ip")],
    );
    let mut app = TestApp::spawn_with(config).await;
    app.db = Some(db);
    let allow = [
        format!("allowed.test:{}", allowed.port()),
        format!("sneaky.test:{}", trap.port()),
        "denied.test".to_owned(),
    ];
    let local = "127.0.0.1:0".parse().expect("addr");
    let proxy = proxy_allowing(&app, local, "test-sandbox", &allow).await;
    Setup {
        app,
        proxy,
        allowed,
        denied,
        trap,
        trapped,
    }
}

/// Sends `head` to the proxy and reads everything it answers until it closes.
async fn exchange(proxy: SocketAddr, head: &str) -> String {
    let mut s = TcpStream::connect(proxy).await.expect("connect proxy");
    s.write_all(head.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The egress proxy's audit rows for sandbox `sandbox` so far: (decision, reason code, reason).
async fn audit_rows(app: &TestApp, sandbox: &str) -> Vec<(String, Option<String>, String)> {
    sqlx::query_as(
        "SELECT decision, reason_code, reason FROM audit_log \
         WHERE action = 'egress.connect' AND caller_id = $1 ORDER BY seq",
    )
    .bind(format!("sandbox:{sandbox}"))
    .fetch_all(&app.state.pool)
    .await
    .expect("audit rows")
}

/// [`audit_rows`] once there are `n` of them, or after 5 s, whatever there is.
async fn wait_for_rows(
    app: &TestApp,
    sandbox: &str,
    n: usize,
) -> Vec<(String, Option<String>, String)> {
    // Rows are written when a connection ends; poll until the expected number is there.
    for _ in 0..200 {
        let rows = audit_rows(app, sandbox).await;
        if rows.len() >= n {
            return rows;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    audit_rows(app, sandbox).await
}

#[tokio::test]
async fn plain_http_and_connect_reach_the_allowed_host_only() {
    let s = setup().await;
    let port = s.allowed.port();
    let proxy = s.proxy.addr();

    // Plain HTTP, absolute form, through a standard client configured with the proxy.
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(format!("http://{proxy}")).expect("proxy url"))
        .build()
        .expect("client");
    let text = client
        .get(format!("http://allowed.test:{port}/"))
        .send()
        .await
        .expect("through the proxy")
        .text()
        .await
        .expect("body");
    assert_eq!(text, "allowed host says hi");

    // CONNECT: a tunnel, then HTTP inside it.
    let answer = exchange(
        proxy,
        &format!(
            "CONNECT allowed.test:{port} HTTP/1.1\r\nHost: allowed.test:{port}\r\n\r\n\
             GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 200 Connection Established"),
        "{answer}"
    );
    assert!(answer.ends_with("allowed host says hi"), "{answer}");

    // Each refused with its status (403: no tunnel) and, where it says why, the reason.
    let own = s.app.http_base.trim_start_matches("http://").to_owned();
    let denied = s.denied.port();
    for (what, head, status, reason) in [
        (
            "another host",
            format!("CONNECT denied.test:{denied} HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 403",
            "not allowed",
        ),
        (
            "the allowed host on another port",
            "CONNECT allowed.test:22 HTTP/1.1\r\n\r\n".to_owned(),
            "HTTP/1.1 403",
            "",
        ),
        // An entry without a port admits 80/443 only; the denied host listens elsewhere.
        (
            "plain HTTP to another host",
            format!("GET http://denied.test:{denied}/ HTTP/1.1\r\nHost: denied.test\r\n\r\n"),
            "HTTP/1.1 403",
            "",
        ),
        // Allowed by name, but the name resolves to loopback: the address check refuses it.
        (
            "a name resolving to loopback",
            format!("CONNECT sneaky.test:{} HTTP/1.1\r\n\r\n", s.trap.port()),
            "HTTP/1.1 403",
            "loopback",
        ),
        // Address literals and the orchestrator's own port are not on the list either.
        (
            "the orchestrator's own address",
            format!("CONNECT {own} HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 403",
            "",
        ),
        ("garbage", "HELLO\r\n\r\n".to_owned(), "HTTP/1.1 400", ""),
    ] {
        let answer = exchange(proxy, &head).await;
        assert!(answer.starts_with(status), "{what}: {answer}");
        assert!(answer.contains(reason), "{what}: {answer}");
    }
    assert_eq!(s.trapped.load(Ordering::SeqCst), 0);

    // One audit row per connection, with the decision, host, port and bytes.
    let rows = wait_for_rows(&s.app, "test-sandbox", 8).await;
    assert_eq!(rows.len(), 8, "{rows:?}");
    let allowed: Vec<_> = rows.iter().filter(|r| r.0 == "allowed").collect();
    assert_eq!(allowed.len(), 2, "{rows:?}");
    for row in &allowed {
        assert!(row.2.contains(&format!("allowed.test:{port}")), "{row:?}");
        assert!(row.2.contains("bytes received"), "{row:?}");
        assert!(!row.2.contains(" 0 bytes received"), "{row:?}");
    }
    // A refusal is recorded after its answer is sent, so rows need not follow request order.
    let mut codes: Vec<_> = rows.iter().filter_map(|r| r.1.as_deref()).collect();
    codes.sort_unstable();
    assert_eq!(
        codes,
        [
            "address_blocked",
            "bad_request",
            "domain_not_allowed",
            "domain_not_allowed",
            "domain_not_allowed",
            "domain_not_allowed",
        ]
    );
}

/// Removes the test's network and firewall rules whatever happened.
struct NetworkGuard {
    network: dispatcher::network::EgressNetwork,
    engine: dispatcher::DockerEngine,
}

impl Drop for NetworkGuard {
    fn drop(&mut self) {
        let network = self.network.clone();
        let engine = self.engine.clone();
        common::run_to_end_in_drop(async move {
            let _ = dispatcher::network::remove(&engine, &network.name).await;
        });
    }
}

/// Runs `script` in a hardened busybox container on `network`; returns its output.
fn run_in_container(network: &str, proxy: SocketAddr, script: &str) -> String {
    let image =
        std::env::var("SANDBOX_TEST_IMAGE").unwrap_or_else(|_| "aegis-runtime/busybox:1".into());
    let out = std::process::Command::new("docker")
        .args(["run", "--rm", "--network", network])
        .args(["--cap-drop", "ALL", "--security-opt", "no-new-privileges"])
        .args(["--user", "65534:65534", "--read-only"])
        .args(["--label", "org.aegis.test=egress"])
        .arg("-e")
        .arg(format!("http_proxy=http://{proxy}"))
        .args([&image, "sh", "-c", script])
        .output()
        .expect("docker run (the egress tests need a Docker engine)");
    common::succeeded(out, "container failed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_network_reaches_the_allowed_host_through_the_proxy_and_nothing_else() {
    let allowed = web_host("allowed host says hi").await;
    let denied = web_host("denied host").await;
    // A service of the Docker host on every interface, as a database or an agent might be.
    let (host_service, host_hits) = common::net::counting_listener("0.0.0.0:0").await;
    let host_port = host_service.port();

    let db = TestDb::create().await;
    let config = config_with_hosts(&db, &["allowed.test", "denied.test"]);
    let mut app = TestApp::spawn_with(config).await;
    app.db = Some(db);
    let app_port = http_port(&app);

    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let name = format!("aegis-egress-test-{suffix}");
    let network = dispatcher::network::create(
        &app.state.docker,
        &name,
        &suffix,
        std::collections::HashMap::from([("org.aegis.test".to_owned(), "egress".to_owned())]),
    )
    .await
    .expect("internal network");
    let proxy = proxy_allowing(
        &app,
        SocketAddr::new(network.gateway, 0),
        "docker-sandbox",
        &[format!("allowed.test:{}", allowed.port())],
    )
    .await;
    let guard = NetworkGuard {
        network: network.clone(),
        engine: app.state.docker.clone(),
    };
    dispatcher::network::isolate_host(&network, proxy.addr().port()).expect("host isolated");

    // Busybox's nc speaks to the proxy the way an HTTP client configured with HTTP_PROXY
    // does (absolute-form GET, CONNECT), and tries the host directly.
    let gw = network.gateway;
    let pp = proxy.addr().port();
    let (a, d, h, p) = (allowed.port(), denied.port(), host_port, app_port);
    // Busybox nc stops after one read once its input ends, so the input stays open a moment:
    // long enough for a tunnel's second answer (the page) to follow the first (200).
    let via = |name: &str, request: String| {
        format!("echo '== {name}'; (printf '{request}'; sleep 2) | nc -w 3 {gw} {pp} 2>&1; echo; ")
    };
    let direct = |name: &str, port: u16| {
        format!("echo '== {name}'; echo x | nc -w 3 {gw} {port} 2>&1; echo; ")
    };
    let script = [
        via(
            "allowed",
            format!("GET http://allowed.test:{a}/ HTTP/1.0\\r\\nHost: allowed.test:{a}\\r\\n\\r\\n"),
        ),
        via(
            "allowed_tunnel",
            format!("CONNECT allowed.test:{a} HTTP/1.1\\r\\n\\r\\nGET / HTTP/1.1\\r\\nHost: allowed.test\\r\\nConnection: close\\r\\n\\r\\n"),
        ),
        via("other", format!("CONNECT denied.test:{d} HTTP/1.1\\r\\n\\r\\n")),
        via(
            "host_via_proxy",
            format!("GET http://{gw}:{h}/ HTTP/1.0\\r\\n\\r\\n"),
        ),
        via("app_via_proxy", format!("CONNECT 127.0.0.1:{p} HTTP/1.1\\r\\n\\r\\n")),
        direct("host_direct", h),
        direct("app_direct", p),
    ]
    .concat();
    // Blocking `docker run` on a thread of its own: the proxy and test hosts keep running.
    let (net_name, proxy_addr) = (name.clone(), proxy.addr());
    let out = tokio::task::spawn_blocking(move || run_in_container(&net_name, proxy_addr, &script))
        .await
        .expect("container run");
    let section = |name: &str| crate::common::section(&out, name);
    let allowed_plain = section("allowed");
    assert!(allowed_plain.starts_with("HTTP/1.0 200 OK"), "{out}");
    assert!(allowed_plain.contains("allowed host says hi"), "{out}");
    let tunnel = section("allowed_tunnel");
    assert!(
        tunnel.starts_with("HTTP/1.1 200 Connection Established"),
        "{out}"
    );
    assert!(tunnel.contains("allowed host says hi"), "{out}");
    for refused in ["other", "host_via_proxy", "app_via_proxy"] {
        let text = section(refused);
        assert!(text.starts_with("HTTP/1.1 403"), "{refused}: {out}");
    }
    for unreachable in ["host_direct", "app_direct"] {
        let text = section(unreachable);
        assert!(!text.contains("HTTP/"), "{unreachable}: {out}");
        assert!(
            text.contains("timed out") || text.contains("can't connect"),
            "{unreachable}: {out}"
        );
    }
    // Checked from the other side too: the host's service never saw a connection.
    assert_eq!(host_hits.load(Ordering::SeqCst), 0);

    // Every attempt that reached the proxy is in the audit log with its decision; the direct
    // ones were dropped by the host firewall before any listener saw them.
    let rows = wait_for_rows(&app, "docker-sandbox", 5).await;
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert_eq!(
        rows.iter().filter(|r| r.0 == "allowed").count(),
        2,
        "{rows:?}"
    );
    assert!(rows
        .iter()
        .any(|r| r.0 == "allowed" && r.2.contains(&format!("allowed.test:{}", allowed.port()))));
    assert!(rows
        .iter()
        .filter(|r| r.0 == "denied")
        .all(|r| r.1.as_deref() == Some("domain_not_allowed")));
    drop(proxy);
    drop(guard);
}

/// A test host on 127.0.0.2 that counts the connections it accepts.
async fn start_counted_host(text: &'static str) -> (SocketAddr, Arc<AtomicUsize>) {
    counted_web_host(SocketAddr::from(([127, 0, 0, 2], 0)), text).await
}

fn firewall_rules() -> String {
    let out = std::process::Command::new("iptables")
        .args(["-w", "-S", "INPUT"])
        .output()
        .expect("iptables runs (the egress tests need root)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A listener on port 8080 in a busybox container on a bridge network of its own (made and
/// removed by the test): somewhere a sandbox could only reach by being forwarded out.
struct OutsideListener {
    network: String,
    container: String,
    ip: String,
}

impl OutsideListener {
    fn start() -> Self {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let network = format!("aegis-egress-outside-{suffix}");
        let container = format!("aegis-egress-outside-{suffix}");
        let image = std::env::var("SANDBOX_TEST_IMAGE")
            .unwrap_or_else(|_| "aegis-runtime/busybox:1".into());
        let (made, _) = common::docker_out(&[
            "network",
            "create",
            "--label",
            "org.aegis.test=egress",
            &network,
        ]);
        assert!(made, "test network created");
        let mut listener = Self {
            network,
            container,
            ip: String::new(),
        };
        let (ran, _) = common::docker_out(&[
            "run",
            "-d",
            "--rm",
            "--label",
            "org.aegis.test=egress",
            "--network",
            &listener.network,
            "--name",
            &listener.container,
            "--user",
            "65534:65534",
            "--cap-drop",
            "ALL",
            &image,
            "sh",
            "-c",
            "while true; do echo reached | nc -l -p 8080; done",
        ]);
        assert!(ran, "outside listener started");
        let (_, ip) = common::docker_out(&[
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &listener.container,
        ]);
        assert!(!ip.is_empty(), "outside listener has an address");
        listener.ip = ip;
        listener
    }

    /// What the listener printed: the requests it received.
    fn received(&self) -> String {
        let out = std::process::Command::new("docker")
            .args(["logs", &self.container])
            .output()
            .expect("docker logs");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )
    }
}

impl Drop for OutsideListener {
    fn drop(&mut self) {
        let _ = common::docker_out(&["rm", "-f", &self.container]);
        let _ = common::docker_out(&["network", "rm", &self.network]);
    }
}

/// A busybox agent with network granted to one host:port only.
fn networked_agent(name: &str, version: &str, allow: &str) -> String {
    AgentManifest::new(name)
        .version(version)
        .instruction("Fetch things.")
        .tools(&["cmd.run"])
        .cmd(&["wget", "nslookup", "cat"], 20, "")
        .network("deny", "allowlist", &[allow])
        .yaml()
}

/// The whole path through the real service: an agent whose manifest allows one test host gets
/// a sandbox on an internal network of its own; `cmd.run` there reaches that host through the
/// sandbox's proxy (busybox wget honours `http_proxy`), and is refused for another test host,
/// the Docker host's address and the orchestrator's own port; nothing goes direct, no name
/// resolves inside, every attempt is audited, and destroying the sandbox leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_sandbox_reaches_only_its_allowlist_through_its_own_proxy() {
    let (allowed, allowed_hits) = start_counted_host("allowed host says hi").await;
    let (other, other_hits) = start_counted_host("other host").await;
    let (host_service, host_hits) = common::net::counting_listener("0.0.0.0:0").await;
    let host_port = host_service.port();

    let db = TestDb::create().await;
    let mut config = config_with_hosts(&db, &["allowed.test", "other.test"]);
    // The orchestrator's own port on every interface, so the sandbox could try it directly.
    config.server.http = "0.0.0.0:0".parse().expect("addr");
    let mut app = TestApp::spawn_with(config).await;
    app.db = Some(db);
    let app_port = http_port(&app);
    app.http_base = format!("http://127.0.0.1:{app_port}");

    let allow = format!("allowed.test:{}", allowed.port());
    let r = app
        .admin(reqwest::Method::POST, "/v1/agents")
        .body(networked_agent("fetcher", "1.0.0", &allow))
        .send()
        .await
        .expect("deploy");
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    // The allowlist of a deployed version cannot change, not even with force.
    let r = app
        .admin(reqwest::Method::POST, "/v1/agents?force=true")
        .body(networked_agent("fetcher", "1.0.0", "other.test:80"))
        .send()
        .await
        .expect("redeploy");
    let status = r.status();
    let body = r.text().await.unwrap_or_default();
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("spec.security.network"), "{body}");
    assert!(body.contains("new version"), "{body}");

    let r = app
        .response(
            reqwest::Method::POST,
            "/v1/sandboxes",
            Some(&serde_json::json!({"agent": "fetcher"})),
        )
        .await;
    let status = r.status();
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(status, 201, "{body}");
    let id = body["sandbox_id"].as_str().expect("sandbox id").to_owned();
    let network = format!("aegis-net-{id}");
    let tag = format!("aegis-egress:{network}");

    // Its own internal network, labelled as the sandbox's, and the firewall rules for it.
    let (found, internal) = common::docker_out(&[
        "network",
        "inspect",
        "-f",
        "{{.Internal}} {{index .Labels \"org.aegis.sandbox\"}}",
        &network,
    ]);
    assert!(found, "network {network} exists");
    assert_eq!(internal, format!("true {id}"));
    let (_, attached) = common::docker_out(&[
        "inspect",
        "-f",
        "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}",
        &format!("aegis-sbx-{id}"),
    ]);
    assert_eq!(
        attached.trim(),
        network,
        "the sandbox is on its network only"
    );
    let rules = firewall_rules();
    assert_eq!(rules.matches(&tag).count(), 3, "{rules}");
    let gateway = common::docker_out(&[
        "network",
        "inspect",
        "-f",
        "{{range .IPAM.Config}}{{.Gateway}}{{end}}",
        &network,
    ])
    .1;

    let run = |command: String| {
        let app = &app;
        let id = id.clone();
        async move {
            let r = app.response(reqwest::Method::POST, "/v1/tools/call", Some(&serde_json::json!({"name": "cmd.run", "sandbox_id": id, "arguments": {"command": command, "timeout_secs": 15}}))).await;
            let body: serde_json::Value = r.json().await.expect("json");
            assert_eq!(body["isError"], false, "{command}: {body}");
            body["structuredContent"].clone()
        }
    };

    // The proxy settings are in the command environment, NO_PROXY empty.
    let environ = run("cat /proc/self/environ".into()).await;
    let environ = environ["stdout"].as_str().unwrap_or_default().to_owned();
    let vars: Vec<&str> = environ.split('\0').collect();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        let var = vars
            .iter()
            .find(|v| v.starts_with(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} missing: {environ:?}"));
        assert!(
            var.starts_with(&format!("{name}=http://{gateway}:")),
            "{var}"
        );
    }
    assert!(vars.contains(&"NO_PROXY="), "{environ:?}");
    assert!(vars.contains(&"no_proxy="), "{environ:?}");
    // The proxy serves its sandbox only: from the host (or any other interface) it is dropped.
    let proxy_addr: SocketAddr = vars
        .iter()
        .find_map(|v| v.strip_prefix("HTTP_PROXY=http://"))
        .and_then(|a| a.parse().ok())
        .expect("proxy address");
    let from_host = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        TcpStream::connect(proxy_addr),
    )
    .await;
    assert!(
        !matches!(from_host, Ok(Ok(_))),
        "the host reached the sandbox's proxy"
    );

    // Allowed: through the proxy.
    let ok = run(format!(
        "wget -q -O - http://allowed.test:{}/",
        allowed.port()
    ))
    .await;
    assert_eq!(ok["exit_code"], 0, "{ok}");
    assert_eq!(ok["stdout"], "allowed host says hi", "{ok}");
    // Refused by the proxy: another test host, the Docker host, the orchestrator's port.
    for url in [
        format!("http://other.test:{}/", other.port()),
        format!("http://{gateway}:{host_port}/"),
        format!("http://127.0.0.1:{app_port}/health/live"),
    ] {
        let out = run(format!("wget -q -O - {url}")).await;
        assert_ne!(out["exit_code"], 0, "{url}: {out}");
        assert!(
            out["stderr"].as_str().unwrap_or_default().contains("403"),
            "{url}: {out}"
        );
    }
    // Nothing direct: no proxy (-Y off) means the host firewall drops it; no route out at all.
    for port in [host_port, app_port] {
        let out = run(format!("wget -Y off -T 3 -q -O - http://{gateway}:{port}/")).await;
        assert_ne!(out["exit_code"], 0, "direct to {port}: {out}");
    }
    // Beyond the host: a listener in a container on another network this test made.
    let outside = OutsideListener::start();
    let out = run(format!(
        "wget -Y off -T 3 -q -O - http://{}:8080/",
        outside.ip
    ))
    .await;
    assert_ne!(out["exit_code"], 0, "direct to another network: {out}");
    assert!(outside.received().is_empty(), "nothing arrived outside");
    // No resolver for outside names: only the proxy knows allowed.test.
    let ns = run("nslookup allowed.test".into()).await;
    assert_ne!(ns["exit_code"], 0, "{ns}");
    assert_eq!(allowed_hits.load(Ordering::SeqCst), 1);
    assert_eq!(other_hits.load(Ordering::SeqCst), 0);
    assert_eq!(host_hits.load(Ordering::SeqCst), 0);

    // Every attempt that reached the proxy is audited with its decision.
    let rows = wait_for_rows(&app, &id, 4).await;
    assert_eq!(rows.len(), 4, "{rows:?}");
    let allowed_rows: Vec<_> = rows.iter().filter(|r| r.0 == "allowed").collect();
    assert_eq!(allowed_rows.len(), 1, "{rows:?}");
    assert!(allowed_rows[0].2.contains(&allow), "{rows:?}");
    assert!(allowed_rows[0].2.contains("bytes received"), "{rows:?}");
    let denied: Vec<_> = rows.iter().filter(|r| r.0 == "denied").collect();
    assert_eq!(denied.len(), 3, "{rows:?}");
    assert!(denied
        .iter()
        .all(|r| r.1.as_deref() == Some("domain_not_allowed")));
    for needle in [
        format!("`other.test` (port {})", other.port()),
        format!("`{gateway}` (port {host_port})"),
        format!("`127.0.0.1` (port {app_port})"),
    ] {
        assert!(
            denied.iter().any(|r| r.2.contains(&needle)),
            "{needle}: {rows:?}"
        );
    }

    // Destroyed: network, rules and proxy gone with the container.
    app.destroy_sandbox(&id).await;
    assert!(
        !common::docker_out(&["network", "inspect", &network]).0,
        "network removed"
    );
    assert!(!firewall_rules().contains(&tag), "rules removed");
    let sid: dispatcher::SandboxId = dispatcher::SandboxId(id.parse().expect("uuid"));
    assert!(
        app.state.sandboxes.proxy_env(sid).is_empty(),
        "proxy stopped"
    );
}

/// Leftovers of a crash: an egress network of this database with no sandbox row, and its
/// firewall rule, are removed by the reaper.
#[tokio::test]
async fn the_reaper_removes_orphaned_egress_networks_and_their_rules() {
    let app = common::TestApp::spawn().await;
    let dispatcher = app.state.sandboxes.dispatcher().expect("dispatcher");
    let orphan = uuid::Uuid::new_v4();
    let name = format!("aegis-net-{orphan}");
    let bridge = format!("aeg{}", &orphan.simple().to_string()[..12]);
    let db_name = app
        .db
        .as_ref()
        .and_then(|d| d.url.rsplit('/').next().map(str::to_owned))
        .expect("db name");
    let (made, _) = common::docker_out(&[
        "network",
        "create",
        "--internal",
        "-o",
        &format!("com.docker.network.bridge.name={bridge}"),
        "--label",
        "org.aegis.managed=true",
        "--label",
        &format!("org.aegis.scope={}", dispatcher.scope()),
        "--label",
        &format!("org.aegis.db-name={db_name}"),
        "--label",
        &format!("org.aegis.sandbox={orphan}"),
        &name,
    ]);
    assert!(made, "network created");
    let tag = format!("aegis-egress:{name}");
    let added = std::process::Command::new("iptables")
        .args(["-w", "-I", "INPUT", "1", "-i", &bridge, "-m", "comment"])
        .args(["--comment", &tag, "-j", "DROP"])
        .status()
        .expect("iptables runs");
    assert!(added.success());

    let report = dispatcher.reap().await.expect("reaper pass");
    assert_eq!(report.networks_removed, 1, "{report:?}");
    assert!(
        !common::docker_out(&["network", "inspect", &name]).0,
        "network removed"
    );
    assert!(!firewall_rules().contains(&tag), "rule removed");
}

/// `cmd.run` in sandbox `id` through the REST API; the tool's structured result.
async fn cmd_run(app: &TestApp, id: &str, command: &str) -> serde_json::Value {
    let r = app.response(reqwest::Method::POST, "/v1/tools/call", Some(&serde_json::json!({"name": "cmd.run", "sandbox_id": id, "arguments": {"command": command, "timeout_secs": 15}}))).await;
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(body["isError"], false, "{command}: {body}");
    body["structuredContent"].clone()
}

/// A graceful restart keeps a networked sandbox: the new instance adopts it with a proxy of its
/// own, the firewall admits the new proxy's port only, and the allowlist still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_instance_adopts_a_networked_sandbox_with_a_new_proxy() {
    let (allowed, allowed_hits) = start_counted_host("allowed host says hi").await;
    let (other, other_hits) = start_counted_host("other host").await;
    let db = TestDb::create().await;
    let config = || {
        let mut config = config_with_hosts(&db, &["allowed.test", "other.test"]);
        // A rolling restart keeps the sandboxes (the default destroys them at SIGTERM).
        config.shutdown.sandboxes = orchestrator::config::ShutdownSandboxes::Keep;
        config
    };
    let app = TestApp::spawn_with(config()).await;
    let allow = format!("allowed.test:{}", allowed.port());
    let id = AgentSandbox::start(&app, networked_agent("keeper", "1.0.0", &allow))
        .await
        .id;
    let url = format!("http://allowed.test:{}/", allowed.port());
    let first = cmd_run(&app, &id, &format!("wget -q -O - {url}")).await;
    assert_eq!(first["stdout"], "allowed host says hi", "{first}");
    let tag = format!("aegis-egress:aegis-net-{id}");
    let accept_rule = |rules: &str| -> String {
        rules
            .lines()
            .find(|l| l.contains(&tag) && l.contains("ACCEPT"))
            .unwrap_or_else(|| panic!("no ACCEPT rule for {tag}: {rules}"))
            .to_owned()
    };
    let before = accept_rule(&firewall_rules());
    app.stop().await.expect("graceful stop");

    let app = TestApp::spawn_with(config()).await;
    let again = cmd_run(&app, &id, &format!("wget -q -O - {url}")).await;
    assert_eq!(again["exit_code"], 0, "{again}");
    assert_eq!(again["stdout"], "allowed host says hi", "{again}");
    let refused = cmd_run(
        &app,
        &id,
        &format!("wget -q -O - http://other.test:{}/", other.port()),
    )
    .await;
    assert_ne!(refused["exit_code"], 0, "{refused}");
    let rules = firewall_rules();
    assert_eq!(
        rules.matches(&tag).count(),
        3,
        "ACCEPT from the bridge, DROP the rest, DROP from elsewhere: {rules}"
    );
    let after = accept_rule(&rules);
    assert_ne!(before, after, "the rule names the new proxy's port");
    assert_eq!(allowed_hits.load(Ordering::SeqCst), 2);
    assert_eq!(other_hits.load(Ordering::SeqCst), 0);

    app.destroy_sandbox(&id).await;
    assert!(!firewall_rules().contains(&tag), "rules removed");
    drop(app);
    drop(db);
}

/// A host on `ip:80` that counts the connections it accepts (port 80: an agent in mode `allow`
/// without an allowlist reaches ports 80 and 443 only).
/// Binding port 80 needs root, as the egress tests run.
async fn start_counted_host_at(ip: IpAddr, text: &'static str) -> Arc<AtomicUsize> {
    counted_web_host(SocketAddr::new(ip, 80), text).await.1
}

/// Issue 20 #1, as the attack: an agent in network mode `allow` whose denylist holds a CIDR
/// block, on a node whose `egress.allow_cidrs` opens a wider internal range. The literal address
/// in the block was refused before; a name that resolves into it went through, both through the
/// sandbox's egress proxy and through `web.fetch`. Now every path refuses it by address: the
/// sandbox's command gets a 403 from the proxy, the model gets an `address_denied` tool error,
/// and the host in the denied block never sees a connection, while a name resolving next to the
/// block (same node exception, not denied) is still reached through both paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_cidr_holds_for_names_that_resolve_into_it_on_every_path() {
    use common::fake_llm::{answer, tool_calls, FakeLlm};

    // Two loopback addresses of this machine, one inside the denied block, one beside it.
    let salt = uuid::Uuid::new_v4().as_bytes()[0] % 250 + 2;
    let victim_ip: IpAddr = format!("127.77.1.{salt}").parse().expect("ip");
    let fine_ip: IpAddr = format!("127.77.2.{salt}").parse().expect("ip");
    let victim_hits = start_counted_host_at(victim_ip, "internal secret").await;
    let fine_hits = start_counted_host_at(fine_ip, "public page").await;

    let llm = FakeLlm::start(vec![
        tool_calls(&[(
            "web__fetch",
            serde_json::json!({"url": "http://victim.test/"}),
        )]),
        tool_calls(&[(
            "web__fetch",
            serde_json::json!({"url": "http://fine.test/"}),
        )]),
        answer("done"),
    ])
    .await;
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.llm = llm.config();
    config.egress.allow_cidrs = vec!["127.77.0.0/16".to_owned()];
    config.egress.hosts = BTreeMap::from([
        ("victim.test".to_owned(), vec![victim_ip]),
        ("fine.test".to_owned(), vec![fine_ip]),
    ]);
    let mut app = TestApp::spawn_with(config).await;
    app.db = Some(db);

    let manifest = AgentManifest::new("open-net")
        .instruction("Fetch things.")
        .tools(&["cmd.run", "web.fetch"])
        .cmd(&["wget"], 20, "")
        .network("allow", "denylist", &["127.77.1.0/24"])
        .yaml();
    // The sandbox path: wget inside the agent's sandbox goes through its egress proxy.
    let id = AgentSandbox::start(&app, manifest).await.id;
    let by_literal = cmd_run(&app, &id, &format!("wget -q -O - http://{victim_ip}/")).await;
    let by_name = cmd_run(&app, &id, "wget -q -O - http://victim.test/").await;
    let beside = cmd_run(&app, &id, "wget -q -O - http://fine.test/").await;
    for (what, out) in [("literal", &by_literal), ("name", &by_name)] {
        assert_ne!(out["exit_code"], 0, "{what}: {out}");
        assert_eq!(out["stdout"], "", "{what}: nothing came back: {out}");
        assert!(
            out["stderr"].as_str().unwrap_or_default().contains("403"),
            "{what}: the proxy refused: {out}"
        );
    }
    assert_eq!(beside["exit_code"], 0, "{beside}");
    assert_eq!(beside["stdout"], "public page", "{beside}");
    // The proxy's audit rows name the refusal by address.
    let rows = audit_rows(&app, &id).await;
    assert!(
        rows.iter().any(|r| r.1.as_deref() == Some("address_denied")
            && r.2.contains(&format!("resolves to {victim_ip}"))
            && r.2.contains("127.77.1.0/24")),
        "{rows:?}"
    );

    // The web.fetch path: the agent's model asks for the same name, then for the one beside it.
    let execution = app
        .started("/v1/agents/open-net/execute", serde_json::json!({}))
        .await;
    let ended = app
        .until_ended(
            &format!("/v1/executions/{execution}"),
            std::time::Duration::from_secs(90),
        )
        .await;
    assert_eq!(ended["status"], "completed", "{ended}");
    // What the model was given back for each call: the last message of the next request.
    let requests = llm.requests();
    assert_eq!(requests.len(), 3, "{requests:?}");
    let tool_result = |i: usize| -> String {
        requests[i]["messages"]
            .as_array()
            .and_then(|m| m.last())
            .map(|m| m["content"].to_string())
            .unwrap_or_default()
    };
    let refused = tool_result(1);
    assert!(refused.contains("address_denied"), "{refused}");
    assert!(
        refused.contains(&format!("resolves to {victim_ip}")),
        "{refused}"
    );
    assert!(!refused.contains("internal secret"), "{refused}");
    let fetched = tool_result(2);
    assert!(fetched.contains("public page"), "{fetched}");

    // Checked from the other side: the denied block never saw a connection.
    assert_eq!(victim_hits.load(Ordering::SeqCst), 0);
    assert_eq!(fine_hits.load(Ordering::SeqCst), 2);

    app.destroy_sandbox(&id).await;
}
