//! Manifest keys that change what an execution does (issue 13 item 5): each test deploys an
//! agent that uses the key, runs it against the scripted model (tests/suite/common/fake_llm.rs), real
//! PostgreSQL and Docker, and checks the effect from outside.

use crate::common;

use std::time::{Duration, Instant};

use common::agent::AgentManifest;
use common::fake_llm::{answer, tool_calls, Step};
use common::harness::{of_type, Harness, AGENTS};
use reqwest::Method;
use serde_json::{json, Value};

async fn harness(script: Vec<Step>) -> Harness {
    Harness::start(script).await
}

/// The judge the semantic validations here name.
fn judge() -> String {
    AgentManifest::new("gatekeeper")
        .instruction(
            "Judge the proposed tool call against the criteria; answer JSON {score, confidence, reasoning}.",
        )
        .yaml()
}

/// Deploys the judge, then `agent` with a semantic tool validation by it: its `criteria` (and
/// any more lines of the validation after them).
async fn deploy_judged(h: &Harness, agent: AgentManifest, criteria: &str) {
    h.deployed(AGENTS, &judge()).await;
    let validation = format!(
        "  execution:\n    tool_validation:\n      - type: semantic\n        \
         judge_agent: gatekeeper\n        criteria: {criteria}\n"
    );
    h.deployed(AGENTS, &agent.spec(&validation).yaml()).await;
}

#[tokio::test]
async fn tool_validation_refuses_a_call_and_the_model_reads_why() {
    let h = harness(vec![
        // The worker proposes a write; the judge refuses it.
        tool_calls(&[(
            "fs__write",
            json!({"path": "/workspace/notes.txt", "content": "x"}),
        )]),
        answer("{\"score\": 0.1, \"confidence\": 0.9, \"reasoning\": \"writing files is not part of this task\"}"),
        // The worker lists instead; the judge approves that.
        tool_calls(&[("fs__list", json!({"path": "/workspace"}))]),
        answer("{\"score\": 0.95, \"confidence\": 0.9, \"reasoning\": \"read-only\"}"),
        answer("listed"),
    ])
    .await;
    deploy_judged(
        &h,
        AgentManifest::new("worker")
            .instruction("Look around the workspace.")
            .tools(&["fs.write", "fs.list"]),
        "Only read; never write.\n        min_score: 0.8",
    )
    .await;
    let id = h.started("worker", json!({"input": {}})).await;
    let e = h.wait_end(&id, Duration::from_secs(90)).await;
    assert_eq!(e["status"], "completed", "{e}");
    assert_eq!(e["last_output"], "listed");

    let requests = h.llm.requests();
    // The judge saw the proposed call and the criteria.
    let judge_input = requests[1].to_string();
    assert!(
        judge_input.contains("proposed_tool_call")
            && judge_input.contains("fs.write")
            && judge_input.contains("never write"),
        "{judge_input}"
    );
    // The model read the refusal and its reasoning as the tool's answer.
    let tool_messages: Vec<&Value> = common::json::items(&requests[2]["messages"])
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(tool_messages.len(), 1, "{}", requests[2]);
    let refusal = tool_messages[0]["content"].as_str().unwrap();
    assert!(
        refusal.contains("tool_validation") && refusal.contains("not part of this task"),
        "{refusal}"
    );
    // The approved call ran: its answer is a listing, not a refusal.
    let listing = common::json::items(&requests[4]["messages"])
        .iter()
        .rfind(|m| m["role"] == "tool")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        !listing.contains("refused") && !listing.contains("failed"),
        "{listing}"
    );

    // The event log has both verdicts and the denied call.
    let events = h.events(&id).await;
    let verdicts = of_type(&events, "tool_validation");
    assert_eq!(verdicts.len(), 2, "{events:?}");
    assert_eq!(verdicts[0]["payload"]["passed"], false);
    assert_eq!(verdicts[1]["payload"]["passed"], true);
    let denied: Vec<&Value> = of_type(&events, "tool_call")
        .into_iter()
        .filter(|c| c["payload"]["decision"] == "denied")
        .collect();
    assert_eq!(denied.len(), 1, "{events:?}");
    assert_eq!(denied[0]["payload"]["reason"], "tool_validation");

    // And the audit log: one refused fs.write, with the judge's reasoning; no fs.write ran.
    let rows: Vec<(String, String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT action, decision, reason_code, reason FROM audit_log \
         WHERE caller_id = $1 AND action IN ('fs.write', 'fs.list') ORDER BY seq",
    )
    .bind(&id)
    .fetch_all(&h.app.state.pool)
    .await
    .unwrap();
    let writes: Vec<_> = rows.iter().filter(|r| r.0 == "fs.write").collect();
    assert_eq!(writes.len(), 1, "{rows:?}");
    assert_eq!(writes[0].1, "denied");
    assert_eq!(writes[0].2.as_deref(), Some("tool_validation"));
    assert!(writes[0]
        .3
        .as_deref()
        .unwrap_or_default()
        .contains("not part of this task"));
    assert!(rows.iter().any(|r| r.0 == "fs.list" && r.1 == "allowed"));
}

#[tokio::test]
async fn input_data_is_the_input_when_none_is_given() {
    let h = harness(vec![answer("one"), answer("two")]).await;
    h.deployed(
        AGENTS,
        &AgentManifest::new("greeter")
            .instruction("Greet.")
            .task(
                "    prompt_template: \"Hello {{input.name}} from {{input.city}}\"\n    \
                 input_data:\n      name: Ada\n      city: London\n",
            )
            .yaml(),
    )
    .await;
    let first = h.started("greeter", json!({})).await;
    h.wait_end(&first, Duration::from_secs(30)).await;
    let second = h
        .started("greeter", json!({"input": {"name": "Grace"}}))
        .await;
    h.wait_end(&second, Duration::from_secs(30)).await;
    let requests = h.llm.requests();
    assert!(
        requests[0].to_string().contains("Hello Ada from London"),
        "{}",
        requests[0]
    );
    assert!(
        requests[1].to_string().contains("Hello Grace from London"),
        "{}",
        requests[1]
    );
}

fn volume_agent(name: &str, volumes: &str) -> String {
    AgentManifest::new(name)
        .instruction("Keep notes.")
        .spec("  tools: [fs.write, fs.read]\n  volumes:\n")
        .spec(volumes)
        .yaml()
}

/// The text of the last tool message the model was sent in request `n`.
fn last_tool_message(requests: &[Value], n: usize) -> String {
    common::json::items(&requests[n]["messages"])
        .iter()
        .rfind(|m| m["role"] == "tool")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_persistent_volume_survives_two_executions_until_it_expires() {
    let read = || tool_calls(&[("fs__read", json!({"path": "/workspace/data/note.txt"}))]);
    let h = Harness::builder(vec![
        tool_calls(&[(
            "fs__write",
            json!({"path": "/workspace/data/note.txt", "content": "kept across runs"}),
        )]),
        answer("written"),
        read(),
        answer("read"),
        read(),
        answer("gone"),
        // The small volume: a write over its size_limit.
        tool_calls(&[(
            "fs__write",
            json!({"path": "/workspace/small/big.txt", "content": "x".repeat(16 * 1024)}),
        )]),
        answer("wrote too much"),
    ])
    .start_tuned(|c| c.volumes.sweep_interval_secs = 1)
    .await;
    // The older spellings (mount_point, size_limit_mb) are read as mount_path and size_limit.
    h.deployed(
        AGENTS,
        &volume_agent(
            "notes",
            "    - name: data
      storage_class: persistent
      mount_point: /workspace/data
      access_mode: read-write
      size_limit_mb: 1
      ttl_hours: 1
",
        ),
    )
    .await;
    let first = h.started("notes", json!({})).await;
    let e = h.wait_end(&first, Duration::from_secs(60)).await;
    assert_eq!(e["status"], "completed", "{e}");
    let events = h.events(&first).await;
    assert_eq!(of_type(&events, "volumes_saved").len(), 1, "{events:?}");

    let second = h.started("notes", json!({})).await;
    let e = h.wait_end(&second, Duration::from_secs(60)).await;
    assert_eq!(e["status"], "completed", "{e}");
    let requests = h.llm.requests();
    let content = last_tool_message(&requests, 3);
    assert!(content.contains("kept across runs"), "{content}");

    // One row, owned by the admin key that ran both, expiring in about an hour.
    let pool = &h.app.state.pool;
    let (owner, hours): (String, f64) = sqlx::query_as(
        "SELECT owner, EXTRACT(EPOCH FROM expires_at - now())::float8 / 3600 FROM agent_volumes",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(owner.starts_with("key:") || owner.contains(':'), "{owner}");
    assert!(hours > 0.5 && hours <= 1.0, "{hours}");

    // Expired: the sweep deletes it, and the next execution starts with an empty directory.
    sqlx::query("UPDATE agent_volumes SET expires_at = now() - interval '1 second'")
        .execute(pool)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = crate::common::count(pool, "SELECT count(*) FROM agent_volumes").await;
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the expired volume was not swept"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let third = h.started("notes", json!({})).await;
    let e = h.wait_end(&third, Duration::from_secs(60)).await;
    assert_eq!(e["status"], "completed", "{e}");
    let content = last_tool_message(&h.llm.requests(), 5);
    assert!(!content.contains("kept across runs"), "{content}");

    // Over the size limit: not saved, and the execution fails saying why.
    h.deployed(
        AGENTS,
        &volume_agent(
            "tiny",
            "    - name: small
      storage_class: persistent
      mount_path: /workspace/small
      access_mode: read-write
      size_limit: 4Ki
",
        ),
    )
    .await;
    let fourth = h.started("tiny", json!({})).await;
    let e = h.wait_end(&fourth, Duration::from_secs(60)).await;
    assert_eq!(e["status"], "failed", "{e}");
    assert!(
        common::json::text(&e["last_error"]).contains("size_limit"),
        "{e}"
    );
    let saved = crate::common::count(
        pool,
        "SELECT count(*) FROM agent_volumes WHERE name = 'small'",
    )
    .await;
    assert_eq!(saved, 0);
}

/// A webhook receiver that answers 500 to the first request and 200 to the rest, recording
/// each request's headers and body.
struct Receiver {
    url: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(axum::http::HeaderMap, String)>>>,
    _server: tokio::task::JoinHandle<()>,
}

async fn receiver() -> Receiver {
    use axum::http::{HeaderMap, StatusCode};
    let seen: std::sync::Arc<std::sync::Mutex<Vec<(HeaderMap, String)>>> = Default::default();
    let record = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: String| {
            let record = record.clone();
            async move {
                let mut seen = record.lock().unwrap();
                seen.push((headers, body));
                if seen.len() == 1 {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Receiver {
        url,
        seen,
        _server: server,
    }
}

fn hmac_hex(secret: &[u8], message: &str) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
    mac.update(message.as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn a_webhook_delivery_is_signed_retried_after_a_500_and_logged() {
    let secret = format!("s3cret-{}", uuid::Uuid::new_v4());
    let var = format!("AEGIS_TEST_DELIVERY_{}", uuid::Uuid::new_v4().simple());
    std::env::set_var(&var, &secret);
    let rx = receiver().await;
    let h = Harness::builder(vec![answer("the result")])
        .start_tuned(|c| {
            c.egress.allow_cidrs = vec!["127.0.0.1/32".to_owned()];
            c.delivery.secrets = [("hook".to_owned(), var.clone())].into();
            c.delivery.poll_interval_ms = 50;
            c.delivery.backoff_base_ms = 50;
        })
        .await;
    let manifest = |destinations: &str| {
        AgentManifest::new("reporter")
            .instruction("Report.")
            .spec(&format!(
                "  execution:\n    delivery:\n      destinations:\n{destinations}"
            ))
            .yaml()
    };
    // What this node cannot serve is refused at deploy, with the place.
    let (status, body) = h
        .deploy(
            AGENTS,
            &manifest(
                "        - name: mail
          type: email
          config: {to: ops@example.com}
",
            ),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("not supported"), "{body}");
    let (status, body) = h
        .deploy(
            AGENTS,
            &manifest(&format!(
                "        - name: hook
          type: webhook
          config: {{url: \"{}\", secret: undefined-secret}}
",
                rx.url
            )),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.to_string().contains("undefined-secret")
            && body.to_string().contains("delivery.secrets"),
        "{body}"
    );

    h.deployed(
        AGENTS,
        &manifest(&format!(
            "        - name: hook
          type: webhook
          condition: on_success
          config:
            url: \"{}\"
            secret: hook
            headers: {{X-Team: blue}}
        - name: alarm
          type: rest
          condition: on_failure
          config: {{url: \"{}\", method: PUT, secret: hook}}
",
            rx.url, rx.url
        )),
    )
    .await;
    let id = h.started("reporter", json!({})).await;
    let e = h.wait_end(&id, Duration::from_secs(30)).await;
    assert_eq!(e["status"], "completed", "{e}");

    // The log: delivered on the second attempt, after a 500.
    let deadline = Instant::now() + Duration::from_secs(30);
    let log = loop {
        let log = h
            .app
            .answered(
                Method::GET,
                &format!("/v1/executions/{id}/deliveries"),
                None,
                200,
            )
            .await;
        if log["deliveries"][0]["status"] == "delivered" {
            break log;
        }
        assert!(Instant::now() < deadline, "not delivered: {log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let deliveries = log["deliveries"].as_array().unwrap();
    assert_eq!(
        deliveries.len(),
        1,
        "only the on_success destination: {log}"
    );
    let d = &deliveries[0];
    assert_eq!(d["destination"], "hook");
    assert_eq!(d["attempts"], 2, "{d}");
    assert_eq!(d["attempt_log"][0]["status_code"], 500, "{d}");
    assert_eq!(d["attempt_log"][1]["status_code"], 200, "{d}");

    // The receiver saw the same signed request twice; the signature checks out.
    let seen = rx.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    for (headers, body) in &seen {
        assert_eq!(body, &seen[0].1, "every retry sends the same body");
        assert_eq!(
            headers["x-aegis-delivery"].to_str().unwrap(),
            d["id"].as_str().unwrap()
        );
        assert_eq!(headers["x-team"], "blue");
        let signature = headers["x-aegis-signature"].to_str().unwrap();
        let (t, v1) = signature
            .strip_prefix("t=")
            .and_then(|rest| rest.split_once(",v1="))
            .unwrap_or_else(|| panic!("signature format: {signature}"));
        assert_eq!(v1, hmac_hex(secret.as_bytes(), &format!("{t}.{body}")));
        assert_ne!(v1, hmac_hex(b"another secret", &format!("{t}.{body}")));
    }
    let payload: Value = serde_json::from_str(&seen[0].1).unwrap();
    assert_eq!(payload["status"], "completed");
    assert_eq!(payload["output"], "the result");
    assert_eq!(payload["execution_id"], id.as_str());
    // A delivery that a replica which died was sending (its lease has expired) is claimed and
    // sent by this one.
    let orphan = uuid::Uuid::new_v4();
    sqlx::query(
        "INSERT INTO deliveries (id, tenant_id, execution_id, destination, kind, url, method, \
         headers, secret_name, content_type, body, status, attempts, max_attempts, lease_owner, \
         lease_expires_at) VALUES ($1, 'default', $2::uuid, 'hook', 'webhook', $3, 'POST', '{}', \
         'hook', 'application/json', '{\"replayed\":true}', 'sending', 1, 5, $4, \
         now() - interval '1 second')",
    )
    .bind(orphan)
    .bind(&id)
    .bind(&rx.url)
    .bind(uuid::Uuid::new_v4())
    .execute(&h.app.state.pool)
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, attempts): (String, i32) =
            sqlx::query_as("SELECT status, attempts FROM deliveries WHERE id = $1")
                .bind(orphan)
                .fetch_one(&h.app.state.pool)
                .await
                .unwrap();
        if status == "delivered" {
            assert_eq!(attempts, 2);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the orphaned delivery stayed {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(rx
        .seen
        .lock()
        .unwrap()
        .iter()
        .any(|(_, body)| body == "{\"replayed\":true}"));

    // The secret never reaches the database.
    let stored = "SELECT count(*) FROM deliveries \
                  WHERE body LIKE '%' || $1 || '%' OR headers::text LIKE '%' || $1 || '%'";
    h.app.assert_counts(stored, &secret, 0).await;
}

#[tokio::test]
async fn keys_this_node_does_not_support_are_refused_with_the_reason() {
    let h = harness(Vec::new()).await;
    let base = |runtime_extra: &str, spec_extra: &str| {
        format!(
            "apiVersion: 100monkeys.ai/v1
kind: Agent
metadata:
  name: refused
  version: \"1.0.0\"
spec:
  runtime:
    language: busybox
    version: \"1\"
{runtime_extra}  task:
    instruction: Nothing.
{spec_extra}"
        )
    };
    for (manifest, pointer, says) in [
        (
            base("    image_pull_policy: Always\n", ""),
            "/spec/runtime/image_pull_policy",
            "never pulls",
        ),
        (
            base("    isolation: firecracker\n", ""),
            "/spec/runtime/isolation",
            "only `docker` and `inherit`",
        ),
        (
            base(
                "",
                "  execution:\n    memory: {enabled: true, remember: forever}\n",
            ),
            "/spec/execution/memory",
            "remember",
        ),
        (
            base("", "  tools: [\"mcp:github\"]\n"),
            "/spec/tools/0",
            "no external MCP servers",
        ),
    ] {
        let (status, body) = h.deploy(AGENTS, &manifest).await;
        assert_eq!(status, 422, "{manifest}\n{body}");
        let text = body.to_string();
        assert!(
            text.contains(pointer) && text.contains(says),
            "{manifest}\n{body}"
        );
    }
    // `memory: false` (no memory, as AEGIS's hello-world template writes) is the default.
    let (status, body) = h
        .deploy(
            AGENTS,
            &base("", "  execution:\n    memory: false\n")
                .replace("name: refused", "name: forgetful"),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    // The supported values still deploy; volumes without a sandbox tool deploy with a warning.
    let (status, body) = h
        .deploy(AGENTS, &base(
            "    image_pull_policy: Never\n    isolation: docker\n",
            "  volumes:\n    - {name: data, storage_class: persistent, mount_path: /workspace/data, access_mode: read-write, size_limit: 1Mi}\n",
        ))
        .await;
    assert_eq!(status, 201, "{body}");
    let warning = &body["warnings"][0];
    assert_eq!(warning["pointer"], "/spec/volumes", "{body}");
    assert!(
        common::json::text(&warning["message"]).contains("no effect"),
        "{body}"
    );
}

#[tokio::test]
async fn tools_the_node_marks_skip_judge_are_not_judged() {
    let h = Harness::builder(vec![
        tool_calls(&[("fs__list", json!({"path": "/workspace"}))]),
        answer("done"),
    ])
    .start_tuned(|c| c.executions.skip_judge_tools = vec!["fs.list".to_owned()])
    .await;
    deploy_judged(
        &h,
        AgentManifest::new("lister")
            .instruction("List the workspace.")
            .tools(&["fs.list"]),
        "Anything goes.",
    )
    .await;
    let id = h.started("lister", json!({})).await;
    let e = h.wait_end(&id, Duration::from_secs(60)).await;
    assert_eq!(e["status"], "completed", "{e}");
    assert_eq!(e["last_output"], "done");
    assert_eq!(h.llm.requests().len(), 2, "no judge was asked");
    assert!(of_type(&h.events(&id).await, "tool_validation").is_empty());
}
