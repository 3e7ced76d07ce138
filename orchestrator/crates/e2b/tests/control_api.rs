//! The control API's bodies and query strings as E2B's Python SDK writes and parses them,
//! written by hand from its generated client and the OpenAPI spec, and the refusals of
//! malformed input.

use std::collections::BTreeMap;

use aegis_e2b::api::{
    idempotency_key, AutoResume, LogLevel, OnTimeout, PauseMode, SandboxSnapshotRequest,
    DEFAULT_TIMEOUT_SECS, DEFAULT_TIMEOUT_SECS_V2,
};
use aegis_e2b::api::{
    parse_body, parse_metadata_filter, parse_optional_body, parse_sandbox_ids, ApiError,
    ConnectSandbox, Cursor, Limits, ListQuery, ListedSandbox, LogsDirection, LogsQuery,
    MetricsQuery, NetworkConfig, NewSandbox, Order, Sandbox, SandboxDetail, SandboxForkRequest,
    SandboxForkResult, SandboxLifecycle, SandboxMetric, SandboxPauseRequest, SandboxRefreshRequest,
    SandboxState, SandboxTimeoutRequest, SandboxesWithMetrics, SnapshotInfo, SnapshotsQuery,
    ENVD_VERSION,
};
use chrono::{DateTime, TimeZone, Utc};
use serde_json::{json, Value};

const MAX: usize = 64 * 1024;

fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn reads_the_create_request_the_sdk_sends() {
    // Sandbox.create("base", timeout=300, metadata=..., envs=..., secure=True): the SDK always
    // sends metadata and envVars (empty when unset), secure and allow_internet_access.
    let sent = json!({
        "templateID": "base", "timeout": 300, "secure": true, "allow_internet_access": true,
        "metadata": {"user": "abc"}, "envVars": {"FOO": "bar"}
    });
    let req: NewSandbox = parse_body(sent.to_string().as_bytes(), MAX).unwrap();
    assert_eq!(req.template_id, "base");
    assert_eq!(req.timeout_secs(DEFAULT_TIMEOUT_SECS), 300);
    assert_eq!(req.secure, Some(true));
    assert_eq!(req.allow_internet_access, Some(true));
    assert_eq!(req.metadata, Some(map(&[("user", "abc")])));
    assert_eq!(req.env_vars, Some(map(&[("FOO", "bar")])));
    req.check(&Limits::default()).unwrap();
    assert!(req.extensions().is_empty());
    assert_eq!(serde_json::to_value(&req).unwrap(), sent, "round trip");

    // With a network, a pause lifecycle and fields a newer SDK may add.
    let sent = json!({
        "templateID": "base", "timeout": 60, "autoPause": true,
        "network": {"allowOut": ["example.com"], "denyOut": ["0.0.0.0/0"], "allowPublicTraffic": false},
        "mcp": null, "someFutureField": {"x": 1}
    });
    let req: NewSandbox = parse_body(sent.to_string().as_bytes(), MAX).unwrap();
    let network = req.network.clone().unwrap();
    assert_eq!(
        network.allow_out.as_deref(),
        Some(&["example.com".to_string()][..])
    );
    assert_eq!(network.allow_public_traffic, Some(false));
    assert_eq!(req.mcp, None, "null is absent");
    // autoPause alone leaves the kind of snapshot to the node (the filesystem only); memory
    // asked for explicitly is an extension to refuse.
    assert!(req.extensions().is_empty());
    let fs_only = NewSandbox {
        auto_pause_memory: Some(false),
        ..req.clone()
    };
    assert!(fs_only.extensions().is_empty());
    let memory = NewSandbox {
        auto_pause_memory: Some(true),
        ..req.clone()
    };
    assert_eq!(memory.extensions(), vec!["autoPauseMemory"]);
    let every = json!({
        "templateID": "base", "autoResume": {"enabled": true}, "mcp": {"github": {}},
        "iam": {"tokens": {"t": {"audience": "a", "tokenType": "jwt"}}},
        "volumeMounts": [{"name": "v", "path": "/data"}],
        "network": {"egressProxy": {"address": "p:1080"}, "rules": {"a.com": [{}]}, "maskRequestHost": "x"}
    });
    let req: NewSandbox = parse_body(every.to_string().as_bytes(), MAX).unwrap();
    assert_eq!(
        req.extensions(),
        vec![
            "mcp",
            "iam",
            "volumeMounts",
            "network.egressProxy",
            "network.rules",
        ]
    );
    // No timeout: the route's default, 15 s (v1) or 300 s (v2).
    let bare: NewSandbox = parse_body(br#"{"templateID":"base"}"#, MAX).unwrap();
    assert_eq!(bare.timeout_secs(DEFAULT_TIMEOUT_SECS), 15);
    assert_eq!(bare.timeout_secs(DEFAULT_TIMEOUT_SECS_V2), 300);

    // SDK 2.63's POST /v2/sandboxes body for Sandbox.create("base"): no `secure`, and the
    // generated model fills its defaults in.
    let v2 = br#"{"templateID": "base", "timeout": 300, "autoPause": false, "autoPauseMemory": true, "metadata": {}, "envVars": {}}"#;
    let req: NewSandbox = parse_body(v2, MAX).unwrap();
    assert_eq!((req.secure, req.auto_pause), (None, Some(false)));
    assert!(
        req.extensions().is_empty(),
        "memory matters only when pausing"
    );
    req.check(&Limits::default()).unwrap();
    // autoResume (offered: traffic wakes the sandbox) only on a sandbox its timeout pauses,
    // never with a pause asked to keep the files only, as E2B's SDKs and API say.
    let wakes: NewSandbox = parse_body(
        br#"{"templateID": "base", "autoPause": true, "autoResume": {"enabled": true}}"#,
        MAX,
    )
    .unwrap();
    assert!(wakes.auto_resume() && wakes.extensions().is_empty());
    wakes.check(&Limits::default()).unwrap();
    let no_pause = NewSandbox {
        auto_pause: Some(false),
        ..wakes.clone()
    };
    let e = no_pause.check(&Limits::default()).unwrap_err();
    assert!(e.code == 400 && e.message.contains("autoPause"), "{e:?}");
    let fs_only = NewSandbox {
        auto_pause_memory: Some(false),
        ..wakes.clone()
    };
    let e = fs_only.check(&Limits::default()).unwrap_err();
    assert!(
        e.code == 400 && e.message.contains("autoPauseMemory"),
        "{e:?}"
    );
    let off = NewSandbox {
        auto_resume: Some(AutoResume { enabled: false }),
        auto_pause: None,
        ..wakes
    };
    assert!(!off.auto_resume());
    off.check(&Limits::default()).unwrap();
    // maskRequestHost (offered): a host, optionally :port, ${PORT} standing for the port.
    for (mask, good) in [
        ("custom-host.example.com:${PORT}", true),
        ("localhost", true),
        ("", false),
        ("a b", false),
        ("x\r\nX-Injected: 1", false),
        ("${HOST}", false),
    ] {
        let req: NewSandbox = parse_body(
            json!({"templateID": "base", "network": {"maskRequestHost": mask}})
                .to_string()
                .as_bytes(),
            MAX,
        )
        .unwrap();
        assert_eq!(req.host_mask(), Some(mask));
        assert!(req.extensions().is_empty());
        assert_eq!(req.check(&Limits::default()).is_ok(), good, "{mask:?}");
    }
    assert_eq!(idempotency_key("retry-1").unwrap(), "retry-1");
    for bad in ["", "Retry", "a b", &"a".repeat(256)] {
        assert!(idempotency_key(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn refuses_bad_create_requests_naming_the_field() {
    let cases: [(&[u8], &str); 8] = [
        (
            br#"{"templateID": 5}"#,
            "invalid JSON body at `templateID`: invalid type: integer `5`, expected a string",
        ),
        (br#"{"templateID": "base", "timeout": -1}"#, "at `timeout`"),
        (br#"{"templateID": "base", "timeout": 1.5}"#, "at `timeout`"),
        (
            br#"{"templateID": "base", "metadata": {"user": 7}}"#,
            "at `metadata.user`",
        ),
        (
            br#"{"templateID": "base", "network": {"allowOut": "x"}}"#,
            "at `network.allowOut`",
        ),
        (br#"{"timeout": 30}"#, "missing field `templateID`"),
        (
            br#"{"templateID": "base"} {}"#,
            "invalid JSON body: trailing characters",
        ),
        (b"  ", "request body is empty"),
    ];
    for (body, want) in cases {
        let err = parse_body::<NewSandbox>(body, MAX).unwrap_err();
        assert_eq!(err.code, 400, "{err}");
        assert!(
            err.message.contains(want),
            "{}: {}",
            String::from_utf8_lossy(body),
            err.message
        );
    }
    let err = parse_body::<NewSandbox>(&[b' '; 100], 99).unwrap_err();
    assert_eq!(err.code, 413);

    let limits = Limits::default();
    let check = |req: serde_json::Value| {
        let req: NewSandbox = parse_body(req.to_string().as_bytes(), MAX).unwrap();
        req.check(&limits).unwrap_err().message
    };
    assert!(check(json!({"templateID": ""})).contains("templateID must be 1 to 128 bytes"));
    assert!(check(json!({"templateID": "base;rm"})).contains("only letters, digits"));
    assert!(check(json!({"templateID": "base", "timeout": 86401}))
        .contains("longer than this node's limit"));
    assert!(check(json!({"templateID": "base", "envVars": {"1X": "v"}}))
        .contains("not a variable name"));
    assert!(
        check(json!({"templateID": "base", "envVars": {"X": "a\u{0}b"}})).contains("without NUL")
    );
    let many: BTreeMap<String, String> = (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
    assert!(check(json!({"templateID": "base", "metadata": many})).contains("65 entries"));
    assert!(
        check(json!({"templateID": "base", "metadata": {"k": "v".repeat(1025)}}))
            .contains("metadata.k")
    );
}

#[test]
fn answers_shaped_as_the_sdk_parses_them() {
    // Create/connect: templateID, sandboxID, clientID and envdVersion are required by the SDK.
    let created = Sandbox {
        template_id: "base".into(),
        sandbox_id: "sbx1".into(),
        alias: None,
        client_id: "node".into(),
        envd_version: ENVD_VERSION.into(),
        envd_access_token: Some("tok".into()),
        traffic_access_token: None,
        domain: None,
    };
    assert_eq!(
        serde_json::to_value(&created).unwrap(),
        json!({"templateID": "base", "sandboxID": "sbx1", "clientID": "node",
               "envdVersion": "0.6.4", "envdAccessToken": "tok"})
    );
    let back: Sandbox = parse_body(&serde_json::to_vec(&created).unwrap(), MAX).unwrap();
    assert_eq!(back, created);

    let detail = SandboxDetail {
        sandbox: ListedSandbox {
            template_id: "base".into(),
            alias: Some("base".into()),
            sandbox_id: "sbx1".into(),
            client_id: "node".into(),
            started_at: at("2024-01-02T03:04:05Z"),
            end_at: at("2024-01-02T03:09:05Z"),
            cpu_count: 2,
            memory_mb: 512,
            disk_size_mb: 1024,
            metadata: Some(map(&[("user", "abc")])),
            state: SandboxState::Running,
            envd_version: ENVD_VERSION.into(),
            envd_unresponsive_at_pause: None,
            volume_mounts: None,
        },
        envd_access_token: None,
        allow_internet_access: None,
        domain: None,
        network: Some(NetworkConfig::default()),
        lifecycle: Some(SandboxLifecycle {
            auto_resume: false,
            on_timeout: OnTimeout::Kill,
        }),
        pause_mode: None,
        egress_grant: None,
    };
    let v = serde_json::to_value(&detail).unwrap();
    assert_eq!(
        v,
        json!({"templateID": "base", "alias": "base", "sandboxID": "sbx1", "clientID": "node",
               "startedAt": "2024-01-02T03:04:05Z", "endAt": "2024-01-02T03:09:05Z",
               "envdVersion": "0.6.4", "allowInternetAccess": null, "cpuCount": 2,
               "memoryMB": 512, "diskSizeMB": 1024, "metadata": {"user": "abc"},
               "state": "running", "network": {},
               "lifecycle": {"autoResume": false, "onTimeout": "kill"}})
    );
    assert_eq!(serde_json::from_value::<SandboxDetail>(v).unwrap(), detail);
    // A paused sandbox tells newer SDKs what its pause kept.
    let paused = SandboxDetail {
        pause_mode: Some(PauseMode::Filesystem),
        ..detail.clone()
    };
    assert_eq!(
        serde_json::to_value(&paused).unwrap()["pauseMode"],
        "filesystem"
    );
    let mut missing = serde_json::to_value(&detail).unwrap();
    missing.as_object_mut().unwrap().remove("endAt");
    let err = serde_json::from_value::<SandboxDetail>(missing).unwrap_err();
    assert!(err.to_string().contains("endAt"), "{err}");

    let listed = ListedSandbox {
        template_id: "base".into(),
        alias: None,
        sandbox_id: "sbx2".into(),
        client_id: "node".into(),
        started_at: at("2024-01-02T03:04:05.250Z"),
        end_at: at("2024-01-02T03:09:05Z"),
        cpu_count: 1,
        memory_mb: 256,
        disk_size_mb: 512,
        metadata: None,
        state: SandboxState::Paused,
        envd_version: ENVD_VERSION.into(),
        envd_unresponsive_at_pause: None,
        volume_mounts: None,
    };
    let v = serde_json::to_value(&listed).unwrap();
    assert_eq!(v["startedAt"], "2024-01-02T03:04:05.250Z");
    assert_eq!(v["state"], "paused");
    assert_eq!(serde_json::from_value::<ListedSandbox>(v).unwrap(), listed);
    // The SDK parses dates with dateutil's isoparse: an offset is fine for it and for us.
    let offset = json!({"templateID": "b", "sandboxID": "s", "clientID": "c",
        "startedAt": "2024-01-02T04:04:05+01:00", "endAt": "2024-01-02T04:04:05+01:00",
        "cpuCount": 1, "memoryMB": 1, "diskSizeMB": 1, "state": "running", "envdVersion": "0.6.4"});
    let parsed: ListedSandbox = serde_json::from_value(offset).unwrap();
    assert_eq!(parsed.started_at, at("2024-01-02T03:04:05Z"));
    let mut unknown_state = serde_json::to_value(&listed).unwrap();
    unknown_state["state"] = json!("stopped");
    assert!(serde_json::from_value::<ListedSandbox>(unknown_state).is_err());
}

#[test]
fn small_bodies() {
    // set_timeout and connect require `timeout`.
    let t: SandboxTimeoutRequest = parse_body(br#"{"timeout": 120}"#, MAX).unwrap();
    assert_eq!(t.timeout, 120);
    let err = parse_body::<SandboxTimeoutRequest>(b"{}", MAX).unwrap_err();
    assert!(err.message.contains("missing field `timeout`"), "{err}");
    let c: ConnectSandbox = parse_body(br#"{"timeout": 300}"#, MAX).unwrap();
    assert_eq!(c.required_timeout().unwrap(), 300);
    // v2 (SDK 2.63, connect(on_resume="fresh")): memory false, timeout optional.
    let c: ConnectSandbox = parse_body(br#"{"timeout": 300, "memory": false}"#, MAX).unwrap();
    assert_eq!(c.memory, Some(false));
    let c: ConnectSandbox = parse_body(b"{}", MAX).unwrap();
    assert!(c
        .required_timeout()
        .unwrap_err()
        .message
        .contains("missing field `timeout`"));

    let r: SandboxRefreshRequest = parse_optional_body(b"", MAX).unwrap();
    assert_eq!(r.duration, None);
    let r: SandboxRefreshRequest = parse_body(br#"{"duration": 3601}"#, MAX).unwrap();
    assert!(r.check().unwrap_err().message.contains("3601"));

    // pause: the SDK sends {"memory": true} by default; an absent body keeps memory too.
    let p: SandboxPauseRequest = parse_body(br#"{"memory": false}"#, MAX).unwrap();
    assert!(!p.keeps_memory());
    let p: SandboxPauseRequest = parse_optional_body(b"", MAX).unwrap();
    assert!(p.keeps_memory());
    let p: SandboxPauseRequest =
        parse_body(br#"{"memory": false, "requireHealthyGuest": true}"#, MAX).unwrap();
    assert_eq!(p.require_healthy_guest, Some(true));
    let s: SandboxSnapshotRequest = parse_body(br#"{"memory": false}"#, MAX).unwrap();
    assert_eq!((s.name, s.memory), (None, Some(false)));

    let f: SandboxForkRequest = parse_body(br#"{"timeout": 60, "count": 3}"#, MAX).unwrap();
    assert_eq!(f.count().unwrap(), 3);
    for bad in [r#"{"count": 0}"#, r#"{"count": 101}"#] {
        let f: SandboxForkRequest = parse_body(bad.as_bytes(), MAX).unwrap();
        assert!(f.count().unwrap_err().message.contains("1 to 100"), "{bad}");
    }
    assert_eq!(SandboxForkRequest::default().count().unwrap(), 1);
    let results = vec![SandboxForkResult::failed(ApiError::new(503, "no capacity"))];
    assert_eq!(
        serde_json::to_value(&results).unwrap(),
        json!([{"error": {"code": 503, "message": "no capacity"}}])
    );

    let snap = SnapshotInfo {
        snapshot_id: "snap1:default".into(),
        names: vec!["snap1:default".into()],
    };
    assert_eq!(
        serde_json::to_value(&snap).unwrap(),
        json!({"snapshotID": "snap1:default", "names": ["snap1:default"]})
    );

    let metric = SandboxMetric {
        timestamp: Utc.timestamp_opt(1_704_164_645, 0).unwrap(),
        timestamp_unix: 1_704_164_645,
        cpu_count: 2,
        cpu_used_pct: 12.5,
        mem_used: 1 << 20,
        mem_total: 1 << 30,
        mem_cache: 4096,
        disk_used: 1 << 21,
        disk_total: 1 << 31,
    };
    let v = serde_json::to_value(&metric).unwrap();
    for key in [
        "timestamp",
        "timestampUnix",
        "cpuCount",
        "cpuUsedPct",
        "memUsed",
        "memTotal",
        "memCache",
        "diskUsed",
        "diskTotal",
    ] {
        assert!(v.get(key).is_some(), "{key} missing from {v}");
    }
    let all = SandboxesWithMetrics {
        sandboxes: [("sbx1".to_string(), metric)].into(),
    };
    assert_eq!(
        serde_json::to_value(&all).unwrap()["sandboxes"]["sbx1"]["cpuUsedPct"],
        12.5
    );

    // The error body: the SDK reads `message` and shows "<status>: <message>".
    let err = ApiError::new(404, "sandbox sbx9 not found").with_error_code("sandbox_not_found");
    let v: Value = serde_json::from_slice(&err.to_json()).unwrap();
    assert_eq!(
        v,
        json!({"code": 404, "message": "sandbox sbx9 not found", "error_code": "sandbox_not_found"})
    );
    assert_eq!(err.to_string(), "404: sandbox sbx9 not found");
}

#[test]
fn reads_the_listing_query_the_sdk_sends() {
    // Sandbox.list(query=SandboxQuery(metadata={"user": "a b&c", "app": "prod"},
    // state=["running", "paused"], started_after=...), limit=10, next_token=...): the SDK
    // quotes each key and value, urlencodes the pairs, and httpx encodes that as `metadata`.
    let token = Cursor {
        at: at("2024-01-02T03:04:05.123456Z"),
        id: "sbx-42".into(),
    }
    .encode();
    let raw = format!(
        "metadata=user%3Da%252520b%252526c%26app%3Dprod&state=running%2Cpaused\
         &order=asc&startedAfter=2024-01-02T03%3A04%3A05.123456%2B00%3A00&template=base\
         &nextToken={token}&limit=10&someFutureParam=1"
    );
    let q = ListQuery::parse_v2(&raw).unwrap();
    assert_eq!(q.metadata, map(&[("user", "a b&c"), ("app", "prod")]));
    assert_eq!(
        q.states,
        Some(vec![SandboxState::Running, SandboxState::Paused])
    );
    assert_eq!(q.order, Order::Asc);
    assert_eq!(q.started_after, Some(at("2024-01-02T03:04:05.123456Z")));
    assert_eq!(q.template.as_deref(), Some("base"));
    assert_eq!(q.next_token.as_ref().unwrap().id, "sbx-42");
    assert_eq!(q.limit, 10);
    assert!(q.matches_metadata(&map(&[("user", "a b&c"), ("app", "prod"), ("x", "y")])));
    assert!(!q.matches_metadata(&map(&[("user", "a b&c")])));
    assert!(q.includes_state(SandboxState::Paused));

    // The same filter as a framework hands the decoded parameter over.
    assert_eq!(
        parse_metadata_filter("user=a%2520b%2526c&app=prod").unwrap(),
        q.metadata
    );

    // Defaults: newest first, 100 a page, every state.
    let q = ListQuery::parse_v2("").unwrap();
    assert_eq!(
        (q.order, q.limit, q.states.clone()),
        (Order::Desc, 100, None)
    );
    assert!(q.includes_state(SandboxState::Running) && q.matches_metadata(&BTreeMap::new()));

    // v1: running sandboxes, metadata only.
    let q = ListQuery::parse_v1("metadata=user%3Dabc&limit=5").unwrap();
    assert_eq!(q.metadata, map(&[("user", "abc")]));
    assert!(!q.includes_state(SandboxState::Paused));
}

#[test]
fn refuses_malformed_listing_queries() {
    let cases = [
        ("metadata=user%3Da%25zz", "metadata: malformed %-escape"),
        (
            "metadata=user%3Da%2525zz",
            "metadata value: malformed %-escape",
        ),
        ("metadata=user%3D%25FF", "not UTF-8"),
        ("metadata=%3Dv", "metadata: empty key"),
        (
            "metadata=a%3D1%26a%3D2",
            "key \"a\" is given more than once",
        ),
        ("limit=0", "limit must be an integer from 1 to 100"),
        ("limit=101", "limit must be"),
        ("limit=ten", "limit must be"),
        ("limit=1&limit=2", "\"limit\" is given more than once"),
        ("state=stopped", "\"stopped\" is not a state"),
        ("order=up", "order must be asc or desc"),
        ("startedAfter=yesterday", "RFC 3339"),
        ("nextToken=bm90LWEtdG9rZW4", "nextToken is not a page token"),
        ("bad=%G1", "malformed %-escape"),
    ];
    for (raw, want) in cases {
        let err = ListQuery::parse_v2(raw).unwrap_err();
        assert_eq!(err.code, 400);
        assert!(err.message.contains(want), "{raw}: {}", err.message);
    }
    let many: Vec<String> = (0..65).map(|i| format!("p{i}=1")).collect();
    assert!(ListQuery::parse_v2(&many.join("&"))
        .unwrap_err()
        .message
        .contains("more than 64"));
    let long = format!("template={}", "x".repeat(20_000));
    assert!(ListQuery::parse_v2(&long)
        .unwrap_err()
        .message
        .contains("longer than"));
}

#[test]
fn page_tokens() {
    let c = Cursor {
        at: at("2024-01-02T03:04:05.123456Z"),
        id: "sbx_1.a-b".into(),
    };
    assert_eq!(Cursor::decode(&c.encode()).unwrap(), c);
    // Newest first: the next page holds older items, and on a tie, smaller ids.
    assert!(c.admits(Order::Desc, at("2024-01-02T03:04:05Z"), "zzz"));
    assert!(c.admits(Order::Desc, c.at, "sbx_1.a-a"));
    assert!(!c.admits(Order::Desc, c.at, &c.id));
    assert!(c.admits(Order::Asc, c.at, "sbx_1.a-c"));
    assert!(!c.admits(Order::Asc, at("2024-01-01T00:00:00Z"), "zzz"));
    // Forged tokens: a bad id, a bad time, no separator, not base64.
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    for forged in [
        b64("1:../x"),
        b64("x:sbx"),
        b64("sbx"),
        b64("1:"),
        "%%%".to_string(),
        "A".repeat(600),
    ] {
        assert!(Cursor::decode(&forged).is_err(), "{forged}");
    }
    let q = SnapshotsQuery::parse(&format!(
        "sandboxID=sbx1&name=my-snap&limit=5&nextToken={}",
        c.encode()
    ))
    .unwrap();
    assert_eq!(q.sandbox_id.as_deref(), Some("sbx1"));
    assert_eq!(q.next_token, Some(c));
}

#[test]
fn metrics_and_logs_queries() {
    let q = MetricsQuery::parse("start=1704164645&end=1704164700").unwrap();
    assert_eq!((q.start, q.end), (Some(1_704_164_645), Some(1_704_164_700)));
    assert!(MetricsQuery::parse("start=10&end=5")
        .unwrap_err()
        .message
        .contains("start is after end"));
    assert!(MetricsQuery::parse("start=-1").is_err());
    assert_eq!(parse_sandbox_ids("a,b,a").unwrap(), vec!["a", "b"]);
    assert!(parse_sandbox_ids("a,,b").is_err());
    let many: Vec<String> = (0..101).map(|i| format!("s{i}")).collect();
    assert!(parse_sandbox_ids(&many.join(",")).is_err());

    let q =
        LogsQuery::parse("cursor=1704164645000&limit=50&direction=backward&level=warn&search=boom")
            .unwrap();
    assert_eq!(q.cursor, Some(1_704_164_645_000));
    assert_eq!(
        (q.limit, q.direction, q.level),
        (50, LogsDirection::Backward, Some(LogLevel::Warn))
    );
    assert_eq!(q.search.as_deref(), Some("boom"));
    assert_eq!(LogsQuery::parse("").unwrap().limit, 1000);
    for bad in ["limit=1001", "direction=up", "level=trace", "cursor=-5"] {
        assert!(LogsQuery::parse(bad).is_err(), "{bad}");
    }
    assert!(LogsQuery::parse(&format!("search={}", "x".repeat(257))).is_err());
}
