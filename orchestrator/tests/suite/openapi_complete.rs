//! The OpenAPI document is complete (issue 42): every operation in the node's `/openapi.json`
//! has a schema for its request body and for each JSON response body, never `{}` or an object
//! without properties, so a client generated from it sees the shapes the handlers use; and the
//! answers of live calls match what the document says of them, with no undocumented field.

use crate::common::agent::AgentManifest;
use crate::common::workflow::workflow_manifest;
use std::collections::BTreeSet;
use std::time::Duration;

use aegis_cli::seal_client::{SealClient, Transport};
use reqwest::{Method, RequestBuilder};
use serde_json::{json, Value};

use crate::common::fake_llm::{answer, FakeLlm, Step};
use crate::common::{test_config, TestApp, TestDb};

/// Where a body schema says nothing: `(operation, place)` pairs, e.g.
/// `("POST /v1/security-contexts", "request application/json")`.
fn empty_bodies(doc: &Value) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let Some(paths) = doc["paths"].as_object() else {
        return vec![("/openapi.json".into(), "no paths".into())];
    };
    for (path, item) in paths {
        let Some(item) = item.as_object() else {
            continue;
        };
        for (method, op) in item {
            if !["get", "put", "post", "delete", "patch", "head", "options"]
                .contains(&method.as_str())
            {
                continue;
            }
            let operation = format!("{} {path}", method.to_uppercase());
            if let Some(body) = op.get("requestBody") {
                check_content(doc, body, "request", &operation, &mut found);
            }
            let Some(responses) = op["responses"].as_object() else {
                found.push((operation.clone(), "no responses".into()));
                continue;
            };
            for (status, response) in responses {
                let place = format!("response {status}");
                let success = status.starts_with('2') && status != "204";
                if success && response.get("content").is_none() {
                    found.push((operation.clone(), format!("{place}: no content at all")));
                    continue;
                }
                check_content(doc, response, &place, &operation, &mut found);
            }
        }
    }
    found
}

/// Each media type of a request or response: JSON ones must have a schema that says something.
fn check_content(
    doc: &Value,
    body: &Value,
    place: &str,
    operation: &str,
    found: &mut Vec<(String, String)>,
) {
    let Some(content) = body["content"].as_object() else {
        return;
    };
    for (media, entry) in content {
        let place = format!("{place} {media}");
        match entry.get("schema") {
            None => found.push((operation.into(), format!("{place}: no schema"))),
            Some(schema) => {
                if let Some(why) = says_nothing(doc, schema, 0) {
                    found.push((operation.into(), format!("{place}: {why}")));
                }
            }
        }
    }
}

/// Why a body schema says nothing of its shape, or `None` when it does. References are followed;
/// an array says something when its items do; `oneOf`/`anyOf` when every non-null branch does.
fn says_nothing(doc: &Value, schema: &Value, depth: usize) -> Option<String> {
    if depth > 16 {
        return None; // a recursive schema has a shape
    }
    if let Some(reference) = schema["$ref"].as_str() {
        let pointer = reference.trim_start_matches('#');
        return match doc.pointer(pointer) {
            Some(target) => {
                says_nothing(doc, target, depth + 1).map(|why| format!("{reference}: {why}"))
            }
            None => Some(format!("dangling reference {reference}")),
        };
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(branches) = schema[key].as_array() {
            return branches
                .iter()
                .filter(|b| b["type"] != "null")
                .find_map(|b| says_nothing(doc, b, depth + 1))
                .map(|why| format!("{key} branch: {why}"));
        }
    }
    if let Some(parts) = schema["allOf"].as_array() {
        let all_empty = parts
            .iter()
            .all(|p| says_nothing(doc, p, depth + 1).is_some());
        return all_empty.then(|| "allOf of empty parts".into());
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if types.contains(&"array") {
        return match schema.get("items") {
            Some(items) => says_nothing(doc, items, depth + 1).map(|why| format!("items: {why}")),
            None => Some("array without items".into()),
        };
    }
    let has_properties = schema["properties"]
        .as_object()
        .is_some_and(|p| !p.is_empty());
    let has_map = schema["additionalProperties"].is_object()
        && schema["additionalProperties"]
            .as_object()
            .is_some_and(|m| !m.is_empty());
    if types.contains(&"object") || types.is_empty() {
        if has_properties || has_map {
            return None;
        }
        if types.iter().any(|t| *t != "object" && *t != "null") {
            return None; // e.g. ["string", "object"]: a scalar form is named
        }
        if types.is_empty() && (schema.get("enum").is_some() || schema.get("const").is_some()) {
            return None;
        }
        return Some(if types.is_empty() {
            "empty schema {}".into()
        } else {
            "object without properties".into()
        });
    }
    None
}

/// The node's live document.
async fn document(app: &TestApp) -> Value {
    let r = app.get("/openapi.json").await;
    assert_eq!(r.status(), 200);
    r.json().await.expect("/openapi.json is JSON")
}

#[tokio::test]
async fn every_operation_documents_its_bodies() {
    let app = TestApp::spawn().await;
    let doc = document(&app).await;
    let found = empty_bodies(&doc);
    assert!(
        found.is_empty(),
        "operations whose body schema says nothing:\n{}",
        found
            .iter()
            .map(|(op, place)| format!("  {op}: {place}"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // The user's report: the security context's body names its fields.
    let body = &doc["paths"]["/v1/security-contexts"]["post"]["requestBody"]["content"]
        ["application/json"]["schema"];
    let context = resolve(&doc, body);
    for field in ["name", "description", "capabilities", "tier", "attestation"] {
        assert!(
            context["properties"][field].is_object(),
            "POST /v1/security-contexts request lacks `{field}`: {context}"
        );
    }

    // The check can fail: with the one schema the user saw as `{}` emptied again, it names that
    // operation and place, and nothing else.
    let mut broken = doc.clone();
    broken["paths"]["/v1/security-contexts"]["post"]["requestBody"]["content"]
        ["application/json"]["schema"] = json!({});
    assert_eq!(
        empty_bodies(&broken),
        vec![(
            "POST /v1/security-contexts".to_owned(),
            "request application/json: empty schema {}".to_owned()
        )]
    );
    let mut broken = doc.clone();
    broken["paths"]["/v1/approvals/{id}"]["get"]["responses"]["200"]["content"]
        ["application/json"]["schema"] = json!({"type": "object"});
    assert_eq!(
        empty_bodies(&broken),
        vec![(
            "GET /v1/approvals/{id}".to_owned(),
            "response 200 application/json: object without properties".to_owned()
        )]
    );
}

/// A schema with its reference followed (one level: the components are flat).
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(r) => doc
            .pointer(r.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("dangling {r}")),
        None => schema,
    }
}

/// Keys of `value` that `schema` does not name (JSON pointers): a field the handler sends but
/// the document does not describe. Objects described by no properties at all (free-form
/// values such as an execution's `input`) and maps (`additionalProperties`) take any key.
fn undocumented(doc: &Value, schema: &Value, value: &Value, at: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            let mut named = serde_json::Map::new();
            let mut map: Option<Value> = None;
            let mut open = false;
            gather(doc, schema, &mut named, &mut map, &mut open, 0);
            for (key, field) in fields {
                let here = format!("{at}/{key}");
                if let Some(sub) = named.get(key) {
                    undocumented(doc, sub, field, &here, out);
                } else if let Some(sub) = &map {
                    undocumented(doc, sub, field, &here, out);
                } else if !open {
                    out.push(here);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = items_of(doc, schema, 0) {
                for (i, item) in items.iter().enumerate() {
                    undocumented(doc, &item_schema, item, &format!("{at}/{i}"), out);
                }
            }
        }
        _ => {}
    }
}

/// The properties a schema names for an object (through `$ref`, `allOf`, `oneOf`, `anyOf`),
/// its map schema, and whether it is free-form.
fn gather(
    doc: &Value,
    schema: &Value,
    named: &mut serde_json::Map<String, Value>,
    map: &mut Option<Value>,
    open: &mut bool,
    depth: usize,
) {
    if depth > 16 {
        *open = true;
        return;
    }
    if let Some(target) = schema["$ref"]
        .as_str()
        .and_then(|r| doc.pointer(r.trim_start_matches('#')))
    {
        return gather(doc, target, named, map, open, depth + 1);
    }
    let mut composed = false;
    for key in ["allOf", "oneOf", "anyOf"] {
        for part in schema[key].as_array().into_iter().flatten() {
            composed = true;
            gather(doc, part, named, map, open, depth + 1);
        }
    }
    if let Some(properties) = schema["properties"].as_object() {
        for (k, v) in properties {
            named.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    match &schema["additionalProperties"] {
        Value::Object(m) if !m.is_empty() => *map = Some(Value::Object(m.clone())),
        Value::Bool(true) | Value::Object(_) => *open = true,
        _ => {}
    }
    let may_be_object = match &schema["type"] {
        Value::Null => true,
        Value::String(t) => t == "object",
        Value::Array(ts) => ts.iter().any(|t| t == "object"),
        _ => false,
    };
    if may_be_object
        && !composed
        && schema.get("properties").is_none()
        && schema["additionalProperties"] != json!(false)
    {
        *open = true;
    }
}

/// The schema of an array's items (through `$ref` and the array branch of `oneOf`/`anyOf`).
fn items_of(doc: &Value, schema: &Value, depth: usize) -> Option<Value> {
    if depth > 16 {
        return None;
    }
    if let Some(target) = schema["$ref"]
        .as_str()
        .and_then(|r| doc.pointer(r.trim_start_matches('#')))
    {
        return items_of(doc, target, depth + 1);
    }
    if let Some(items) = schema.get("items") {
        return Some(items.clone());
    }
    ["allOf", "oneOf", "anyOf"].iter().find_map(|key| {
        schema[*key]
            .as_array()?
            .iter()
            .find_map(|part| items_of(doc, part, depth + 1))
    })
}

/// What is wrong with `value` as an instance of `schema` (a schema of `doc`, its references
/// into `doc`'s components): JSON Schema violations, then undocumented fields.
fn mismatches(doc: &Value, schema: &Value, value: &Value) -> Vec<String> {
    let root = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": doc["components"],
        "allOf": [schema],
    });
    let validator = match jsonschema::validator_for(&root) {
        Ok(v) => v,
        Err(e) => return vec![format!("the documented schema does not compile: {e}")],
    };
    let mut found: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{} at `{}`", e, e.instance_path()))
        .collect();
    let mut extra = Vec::new();
    undocumented(doc, schema, value, "", &mut extra);
    found.extend(
        extra
            .into_iter()
            .map(|p| format!("undocumented field `{p}`")),
    );
    found
}

/// Calls on a live node, each checked against the node's own document: the request body sent
/// against the documented request schema, the answer against the response documented for its
/// status (which must be documented).
struct Live<'a> {
    app: &'a TestApp,
    doc: Value,
    /// `METHOD /template status` of every answer checked.
    checked: BTreeSet<String>,
}

impl<'a> Live<'a> {
    async fn new(app: &'a TestApp) -> Self {
        Live {
            app,
            doc: document(app).await,
            checked: BTreeSet::new(),
        }
    }

    /// A request to `path` (matching the document's `template`) with the admin key.
    fn admin(&self, method: Method, path: &str) -> RequestBuilder {
        self.app.admin(method, path)
    }

    /// A request without any key (the SEAL routes).
    fn bare(&self, method: Method, path: &str) -> RequestBuilder {
        self.app
            .http
            .request(method, format!("{}{}", self.app.http_base, path))
    }

    /// Sends `request` with the JSON `body` (checked against the request schema), returns the
    /// answer's status and JSON after checking it.
    async fn json(&mut self, template: &str, request: RequestBuilder, body: Value) -> (u16, Value) {
        let request = request.json(&body).build().expect("request builds");
        let op = format!("{} {template}", request.method());
        let schema = self.doc["paths"][template][request.method().as_str().to_lowercase()]
            ["requestBody"]["content"]["application/json"]["schema"]
            .clone();
        assert!(!schema.is_null(), "{op}: no JSON request body documented");
        let wrong = mismatches(&self.doc, &schema, &body);
        assert!(
            wrong.is_empty(),
            "{op}: a valid request does not match its documented body:\n  {}\n{body:#}",
            wrong.join("\n  ")
        );
        self.send(template, request).await
    }

    /// Sends `request` (no body, or one not in JSON) and checks the answer.
    async fn call(&mut self, template: &str, request: RequestBuilder) -> (u16, Value) {
        let request = request.build().expect("request builds");
        self.send(template, request).await
    }

    async fn send(&mut self, template: &str, request: reqwest::Request) -> (u16, Value) {
        let method = request.method().as_str().to_lowercase();
        let op = format!("{} {template}", request.method());
        let r = self.app.http.execute(request).await.expect("request sent");
        let status = r.status().as_u16();
        let text = r.text().await.expect("an answer");
        let body: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{op} {status}: not JSON ({e}): {text}"));
        let documented = &self.doc["paths"][template][&method]["responses"][status.to_string()];
        assert!(
            documented.is_object(),
            "{op}: answered {status}, which the document does not list: {body}"
        );
        let schema = &documented["content"]["application/json"]["schema"];
        assert!(
            !schema.is_null(),
            "{op} {status}: no JSON schema documented for the answer {body}"
        );
        let wrong = mismatches(&self.doc, schema, &body);
        assert!(
            wrong.is_empty(),
            "{op} {status}: the answer does not match the document:\n  {}\n{body:#}",
            wrong.join("\n  ")
        );
        self.checked.insert(format!("{op} {status}"));
        (status, body)
    }
}

fn agent() -> String {
    AgentManifest::new("shape-checker")
        .metadata("  description: Answers whatever it is asked.\n")
        .runtime("python", "3.11")
        .instruction("Answer the question.")
        .tools(&["aegis.schema.get"])
        .yaml()
}

fn workflow() -> String {
    workflow_manifest(
        "ask-once",
        "ASK",
        "    ASK:
      kind: Human
      prompt: Go on?
      transitions:
        - {condition: always, target: NOTE}
    NOTE:
      kind: System
      command: update_blackboard
      update_blackboard: {note: \"went on\"}
      transitions: []
",
    )
}

/// A node with one SEAL context any `test-*` workload may enter, and one whose calls of
/// `aegis.tools.search` wait for an operator. Its model answers the first execution and never
/// answers the second, so that one is still running when it is cancelled (a model that answered
/// nothing let it fail first, and the cancel then met a documented 409 instead of the 200).
async fn node(db: &TestDb, llm: &FakeLlm) -> TestApp {
    let mut config = test_config(&db.url);
    config.llm = llm.config();
    config.seal.security_contexts = vec![json!({
        "name": "waits", "description": "asks an operator first",
        "capabilities": [
            {"tool_pattern": "aegis.tools.search", "require_approval": true, "approval_timeout_secs": 60},
            {"tool_pattern": "aegis.agent.list"}],
        "attestation": {"workload_patterns": ["test-*"], "allow_unverified": true}})];
    TestApp::spawn_with(config).await
}

#[tokio::test]
async fn live_answers_match_the_document() {
    let db = TestDb::create().await;
    let llm = FakeLlm::start(vec![answer("shapes"), Step::Hang]).await;
    let app = node(&db, &llm).await;
    let mut live = Live::new(&app).await;

    // Health, schemas, tools, audit, keys.
    for template in [
        "/health/live",
        "/health/ready",
        "/v1/tools",
        "/v1/audit",
        "/v1/audit/head",
    ] {
        let request = live.admin(Method::GET, template);
        live.call(template, request).await;
    }
    let request = live.admin(Method::GET, "/v1/audit/verify?full=true");
    live.call("/v1/audit/verify", request).await;
    let request = live.admin(Method::GET, "/v1/schemas/agent/manifest/v1");
    live.call("/v1/schemas/{key}", request).await;
    let request = live.admin(Method::POST, "/v1/tools/call");
    let (status, called) = live
        .json(
            "/v1/tools/call",
            request,
            json!({"name": "aegis.schema.get", "arguments": {"key": "workflow/manifest/v1"}}),
        )
        .await;
    assert_eq!(status, 200, "{called}");
    let request = live.admin(Method::POST, "/v1/tools/call");
    let (status, failed) = live
        .json(
            "/v1/tools/call",
            request,
            json!({"name": "aegis.agent.export", "arguments": {"name": "nobody"}}),
        )
        .await;
    assert_eq!(
        (status, &failed["isError"]),
        (200, &json!(true)),
        "{failed}"
    );
    let request = live.admin(Method::POST, "/v1/api-keys");
    let (status, key) = live
        .json(
            "/v1/api-keys",
            request,
            json!({"name": "reader", "role": "readonly"}),
        )
        .await;
    assert_eq!(status, 201, "{key}");
    let request = live.admin(Method::GET, "/v1/api-keys");
    live.call("/v1/api-keys", request).await;
    let key_id = key["id"].as_str().expect("key id").to_owned();
    let request = live.admin(Method::DELETE, &format!("/v1/api-keys/{key_id}"));
    live.call("/v1/api-keys/{id}", request).await;

    // Definitions.
    for (template, manifest) in [("/v1/agents", agent()), ("/v1/workflows", workflow())] {
        let request = live
            .admin(Method::POST, template)
            .header("content-type", "application/yaml")
            .body(manifest.clone());
        let (status, body) = live.call(template, request).await;
        assert_eq!(status, 201, "{body}");
        let request = live
            .admin(Method::POST, &format!("{template}?force=true"))
            .header("content-type", "application/yaml")
            .body(manifest.clone());
        let (status, body) = live.call(template, request).await;
        assert_eq!((status, &body["unchanged"]), (200, &json!(true)), "{body}");
        let request = live.admin(Method::GET, template);
        live.call(template, request).await;
    }
    // Two notes in the agent's memory (as `aegis.memory.write` leaves them), so a listing shows
    // notes and one can be erased alone.
    let notes = [uuid::Uuid::new_v4(), uuid::Uuid::new_v4()];
    for (note, tags) in notes.iter().zip([json!(["shape"]), json!([])]) {
        sqlx::query(
            "INSERT INTO agent_memories (id, tenant_id, agent_name, owner, content, tags) \
             VALUES ($1, $2, 'shape-checker', '*', $3, $4)",
        )
        .bind(note)
        .bind(orchestrator::DEFAULT_TENANT)
        .bind(format!("note {note}"))
        .bind(tags)
        .execute(&app.state.pool)
        .await
        .expect("a note is stored");
    }
    for (path, template) in [
        ("/v1/agents/shape-checker", "/v1/agents/{id}"),
        (
            "/v1/agents/shape-checker/versions",
            "/v1/agents/{id}/versions",
        ),
        ("/v1/workflows/ask-once", "/v1/workflows/{id}"),
        (
            "/v1/workflows/ask-once/versions",
            "/v1/workflows/{id}/versions",
        ),
        (
            "/v1/agents/shape-checker/memories",
            "/v1/agents/{id}/memories",
        ),
    ] {
        let request = live.admin(Method::GET, path);
        let (status, body) = live.call(template, request).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let request = live.admin(
        Method::DELETE,
        &format!("/v1/agents/shape-checker/memories/{}", notes[0]),
    );
    let (status, body) = live
        .call("/v1/agents/{id}/memories/{note_id}", request)
        .await;
    assert_eq!((status, &body["erased"]), (200, &json!(1)), "{body}");
    let request = live.admin(Method::DELETE, "/v1/agents/shape-checker/memories");
    let (status, body) = live.call("/v1/agents/{id}/memories", request).await;
    assert_eq!((status, &body["erased"]), (200, &json!(1)), "{body}");

    // An agent execution: it ends (the model answers), its log and deliveries are read, then
    // it is removed; a second one, whose model never answers, is cancelled while it runs.
    let request = live.admin(Method::POST, "/v1/agents/shape-checker/execute");
    let (status, started) = live
        .json(
            "/v1/agents/{id}/execute",
            request,
            json!({"input": {"question": "shape?"}, "intent": "check shapes"}),
        )
        .await;
    assert_eq!(status, 201, "{started}");
    let id = started["execution_id"].as_str().expect("id").to_owned();
    app.until_ended(&format!("/v1/executions/{id}"), Duration::from_secs(120))
        .await;
    for (path, template) in [
        (format!("/v1/executions/{id}"), "/v1/executions/{id}"),
        (
            format!("/v1/executions/{id}/events"),
            "/v1/executions/{id}/events",
        ),
        (
            format!("/v1/executions/{id}/deliveries"),
            "/v1/executions/{id}/deliveries",
        ),
        ("/v1/executions".to_owned(), "/v1/executions"),
    ] {
        let request = live.admin(Method::GET, &path);
        let (status, body) = live.call(template, request).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let request = live.admin(Method::DELETE, &format!("/v1/executions/{id}"));
    let (status, body) = live.call("/v1/executions/{id}", request).await;
    assert_eq!(status, 200, "{body}");
    let request = live.admin(Method::POST, "/v1/agents/shape-checker/execute");
    let (_, started) = live
        .json("/v1/agents/{id}/execute", request, json!({"input": {}}))
        .await;
    let id = started["execution_id"].as_str().expect("id").to_owned();
    let request = live.admin(Method::POST, &format!("/v1/executions/{id}/cancel"));
    let (status, body) = live.call("/v1/executions/{id}/cancel", request).await;
    assert_eq!(status, 200, "cancelled while its model is silent: {body}");

    // A workflow execution waits for a human, is signalled, ends, and is removed; another is
    // cancelled while it waits.
    let request = live.admin(Method::POST, "/v1/workflows/ask-once/run");
    let (status, started) = live
        .json(
            "/v1/workflows/{name}/run",
            request,
            json!({"input": {"what": "shapes"}}),
        )
        .await;
    assert_eq!(status, 201, "{started}");
    let id = started["execution_id"].as_str().expect("id").to_owned();
    let path = format!("/v1/workflows/executions/{id}");
    app.until(&path, "waits", Duration::from_secs(60), |e| {
        e["status"] == "waiting"
    })
    .await;
    let request = live.admin(Method::POST, &format!("{path}/signal"));
    let (status, body) = live
        .json(
            "/v1/workflows/executions/{id}/signal",
            request,
            json!({"response": "yes"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    app.until_ended(&path, Duration::from_secs(60)).await;
    for (path, template) in [
        (path.clone(), "/v1/workflows/executions/{id}"),
        (
            format!("{path}/events"),
            "/v1/workflows/executions/{id}/events",
        ),
        (
            "/v1/workflows/executions".to_owned(),
            "/v1/workflows/executions",
        ),
    ] {
        let request = live.admin(Method::GET, &path);
        let (status, body) = live.call(template, request).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    let request = live.admin(Method::DELETE, &path);
    let (status, body) = live.call("/v1/workflows/executions/{id}", request).await;
    assert_eq!(status, 200, "{body}");
    let request = live.admin(Method::POST, "/v1/workflows/ask-once/run");
    let (_, started) = live
        .json("/v1/workflows/{name}/run", request, json!({}))
        .await;
    let path = format!(
        "/v1/workflows/executions/{}",
        started["execution_id"].as_str().expect("id")
    );
    app.until(&path, "waits", Duration::from_secs(60), |e| {
        e["status"] == "waiting"
    })
    .await;
    let request = live.admin(Method::POST, &format!("{path}/cancel"));
    let (status, body) = live
        .call("/v1/workflows/executions/{id}/cancel", request)
        .await;
    assert_eq!(status, 200, "{body}");

    // Security contexts and their tokens; the one the user reported sends every field.
    let context = json!({
        "name": "shapes", "description": "every field set",
        "capabilities": [{"tool_pattern": "fs.*", "path_allowlist": ["/workspace"],
                          "rate_limit": {"calls": 5, "per_seconds": 60}, "max_response_size": 65536,
                          "require_approval": true, "approval_timeout_secs": 30, "unmask_env": true},
                         {"tool_pattern": "cmd.run", "command_allowlist": ["echo"],
                          "subcommand_allowlist": ["git status"]},
                         {"tool_pattern": "web.fetch", "domain_allowlist": ["example.org"]}],
        "deny_list": ["fs.delete"], "tier": "user",
        "runtime": {"language": "python", "version": "3.11"},
        "attestation": {"workload_patterns": ["ci-*"], "enrolment_secret": "0123456789abcdef0123",
                        "allow_unverified": false}});
    let request = live.admin(Method::POST, "/v1/security-contexts");
    let (status, body) = live.json("/v1/security-contexts", request, context).await;
    assert_eq!(status, 200, "{body}");
    let request = live.admin(Method::POST, "/v1/security-contexts");
    let (status, body) = live
        .json(
            "/v1/security-contexts",
            request,
            json!({"name": "least", "description": "only what is required", "capabilities": []}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let request = live.admin(Method::GET, "/v1/security-contexts");
    live.call("/v1/security-contexts", request).await;
    let request = live.admin(Method::GET, "/v1/security-contexts/shapes");
    let (_, shown) = live.call("/v1/security-contexts/{name}", request).await;
    assert_eq!(shown["attestation"]["enrolment_secret"], "set", "{shown}");
    let tokens = "/v1/security-contexts/{name}/attestation-tokens";
    let request = live.admin(
        Method::POST,
        "/v1/security-contexts/shapes/attestation-tokens",
    );
    let (status, body) = live
        .json(
            tokens,
            request,
            json!({"workload_id": "ci-1", "ttl_secs": 600}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let request = live.admin(
        Method::GET,
        "/v1/security-contexts/shapes/attestation-tokens",
    );
    live.call(tokens, request).await;
    let request = live.admin(Method::DELETE, "/v1/security-contexts/least");
    live.call("/v1/security-contexts/{name}", request).await;

    // SEAL: attest (admitted and refused), the session's tools, an invoke, a call that waits
    // for approval (listed, read, approved), and the operator's view of the session.
    let request = live.bare(Method::POST, "/v1/seal/attest");
    let (status, body) = live
        .json(
            "/v1/seal/attest",
            request,
            json!({"public_key": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                   "workload_id": "nobody", "security_context": "waits"}),
        )
        .await;
    assert_eq!(status, 401, "{body}");
    let mut client = SealClient::new(Transport::Http(app.http_base.clone())).expect("client");
    let attest = json!({"public_key": client.public_key_b64(), "workload_id": "test-shapes",
                        "security_context": "waits"});
    let request = live.bare(Method::POST, "/v1/seal/attest");
    let (status, attested) = live.json("/v1/seal/attest", request, attest).await;
    assert_eq!(status, 200, "{attested}");
    let token = attested["security_token"]
        .as_str()
        .expect("token")
        .to_owned();
    let session = attested["session_id"].as_str().expect("session").to_owned();
    client.set_token(token.clone());
    let request = live.bare(
        Method::GET,
        &format!("/v1/seal/tools?security_token={token}"),
    );
    live.call("/v1/seal/tools", request).await;
    let request = live.bare(Method::GET, "/v1/seal/tools");
    let (status, _) = live.call("/v1/seal/tools", request).await;
    assert_eq!(status, 401);
    let envelope = client
        .envelope(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": "aegis.agent.list", "arguments": {}}}),
            chrono::Utc::now(),
        )
        .expect("envelope");
    let request = live.bare(Method::POST, "/v1/seal/invoke");
    let (status, body) = live
        .json("/v1/seal/invoke", request, envelope.clone())
        .await;
    assert_eq!(status, 200, "{body}");
    let request = live.bare(Method::POST, "/v1/seal/invoke");
    let (status, body) = live.json("/v1/seal/invoke", request, envelope).await;
    assert_eq!(status, 401, "a replay is refused: {body}");
    for verdict in ["approve", "reject"] {
        let waiting = tokio::spawn(async move {
            let answer = client
                .call_tool("aegis.tools.search", json!({"query": "schema"}))
                .await;
            (client, answer)
        });
        let pending = app
            .until(
                "/v1/approvals",
                "lists the waiting call",
                Duration::from_secs(30),
                |l| l.as_array().is_some_and(|l| !l.is_empty()),
            )
            .await;
        let approval = pending[0]["id"].as_str().expect("approval id").to_owned();
        let request = live.admin(Method::GET, "/v1/approvals");
        live.call("/v1/approvals", request).await;
        let request = live.admin(Method::GET, &format!("/v1/approvals/{approval}"));
        let (_, shown) = live.call("/v1/approvals/{id}", request).await;
        assert_eq!(shown["arguments"]["query"], "schema", "{shown}");
        let template = format!("/v1/approvals/{{id}}/{verdict}");
        let request = live.admin(Method::POST, &format!("/v1/approvals/{approval}/{verdict}"));
        let (status, body) = live
            .json(&template, request, json!({"note": "shapes only"}))
            .await;
        assert_eq!(status, 200, "{body}");
        let (back, answer) = waiting.await.expect("the waiting call ends");
        assert_eq!(answer.is_ok(), verdict == "approve", "{answer:?}");
        client = back;
        // Decided: a second decision is a documented 409, and the list of pending ones is
        // empty again before the next round.
        let request = live.admin(Method::POST, &format!("/v1/approvals/{approval}/{verdict}"));
        let (status, body) = live.json(&template, request, json!({})).await;
        assert_eq!(status, 409, "already decided: {body}");
    }
    let request = live.admin(Method::GET, "/v1/seal/sessions");
    live.call("/v1/seal/sessions", request).await;
    let request = live.admin(Method::GET, &format!("/v1/seal/sessions/{session}"));
    live.call("/v1/seal/sessions/{id}", request).await;
    let request = live.admin(Method::DELETE, &format!("/v1/seal/sessions/{session}"));
    let (_, revoked) = live.call("/v1/seal/sessions/{id}", request).await;
    assert_eq!(revoked["state"], "revoked", "{revoked}");

    // Sandboxes: one made from a runtime, listed and destroyed; an unknown one is a
    // documented 404.
    let request = live.admin(Method::POST, "/v1/sandboxes");
    let (status, made) = live
        .json("/v1/sandboxes", request, json!({"runtime": "busybox"}))
        .await;
    assert_eq!(status, 201, "{made}");
    let sandbox = made["sandbox_id"].as_str().expect("sandbox id").to_owned();
    let request = live.admin(Method::GET, "/v1/sandboxes");
    live.call("/v1/sandboxes", request).await;
    // A preview of one of its ports: made, listed, revoked.
    let previews = format!("/v1/sandboxes/{sandbox}/previews");
    let request = live.admin(Method::POST, &previews);
    let (status, preview) = live
        .json(
            "/v1/sandboxes/{id}/previews",
            request,
            json!({"port": 8000, "ttl_secs": 60}),
        )
        .await;
    assert_eq!(status, 201, "{preview}");
    let preview = preview["id"].as_str().expect("preview id").to_owned();
    let request = live.admin(Method::GET, &previews);
    live.call("/v1/sandboxes/{id}/previews", request).await;
    let request = live.admin(Method::DELETE, &format!("{previews}/{preview}"));
    let (status, body) = live
        .call("/v1/sandboxes/{id}/previews/{preview_id}", request)
        .await;
    assert_eq!(status, 200, "{body}");
    let request = live.admin(Method::DELETE, &format!("/v1/sandboxes/{sandbox}"));
    let (status, body) = live.call("/v1/sandboxes/{id}", request).await;
    assert_eq!(status, 200, "{body}");
    let request = live.admin(
        Method::DELETE,
        &format!("/v1/sandboxes/{}", uuid::Uuid::new_v4()),
    );
    let (status, _) = live.call("/v1/sandboxes/{id}", request).await;
    assert_eq!(status, 404);

    // The definitions go last (the executions above named them).
    for path in ["/v1/agents/shape-checker", "/v1/workflows/ask-once"] {
        let template = if path.starts_with("/v1/agents") {
            "/v1/agents/{id}"
        } else {
            "/v1/workflows/{id}"
        };
        let request = live.admin(Method::DELETE, path);
        let (status, body) = live.call(template, request).await;
        assert_eq!(status, 200, "{path}: {body}");
    }

    // Every JSON operation of the document had a success answer checked, except those named
    // here with the reason.
    let not_here = [
        // Prometheus text, not JSON (`ops::metrics_parse_as_prometheus_text_and_move_with_calls`).
        "GET /metrics",
    ];
    let mut unchecked = Vec::new();
    for (path, item) in live.doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("operations").keys() {
            let op = format!("{} {path}", method.to_uppercase());
            let answered = live
                .checked
                .iter()
                .any(|c| c.starts_with(&format!("{op} 2")));
            if !answered && !not_here.contains(&op.as_str()) {
                unchecked.push(op);
            }
        }
    }
    assert!(
        unchecked.is_empty(),
        "operations no live success answer was checked for: {unchecked:?}"
    );
}
