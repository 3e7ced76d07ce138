//! Workflow scopes through the real service: `aegis.workflow.promote` / `demote` via the router,
//! the `scope` filter of `aegis.workflow.list`, the refusals (same scope, name collision, unknown
//! workflow, a caller below the operator tier), and the audit rows and scope history they leave.

use crate::common;
use crate::common::workflow::workflow_manifest;

use common::{test_config, TestApp, TestDb};
use orchestrator::caller::{Caller, CallerKind, Tier};
use orchestrator::tools::{self, CallError};
use reqwest::Method;
use serde_json::{json, Value};

fn workflow(name: &str) -> String {
    workflow_manifest(
        name,
        "DONE",
        "    DONE: {kind: System, command: \"echo done\", transitions: []}\n",
    )
}

async fn deploy(app: &TestApp, name: &str) -> String {
    let (_, out) = app
        .call_tool(
            "aegis.workflow.create",
            json!({"manifest_yaml": workflow(name)}),
        )
        .await;
    assert_eq!(out["isError"], false, "{out}");
    out["structuredContent"]["workflow_id"]
        .as_str()
        .expect("workflow_id")
        .to_owned()
}

/// The `{code, message, details}` of a call that is expected to fail inside its tool.
async fn failure(app: &TestApp, tool: &str, args: Value) -> Value {
    let (status, out) = app.call_tool(tool, args).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["isError"], true, "{tool} should fail: {out}");
    out["structuredContent"]["error"].clone()
}

/// `(name, scope)` of every workflow a listing shows.
async fn listed(app: &TestApp, args: Value) -> Vec<(String, String)> {
    let out = app.tool_ok("aegis.workflow.list", args).await;
    let mut rows: Vec<(String, String)> = common::json::items(&out["workflows"])
        .iter()
        .map(|w| {
            (
                w["name"].as_str().unwrap_or_default().to_owned(),
                w["scope"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    rows.sort();
    rows
}

fn pair(name: &str, scope: &str) -> (String, String) {
    (name.to_owned(), scope.to_owned())
}

#[tokio::test]
async fn promote_lists_as_global_refuses_a_second_promotion_and_demotes_back() {
    let app = TestApp::spawn().await;
    let id = deploy(&app, "release").await;
    deploy(&app, "local-only").await;

    // New workflows are tenant scoped; nothing is global yet.
    assert_eq!(
        listed(&app, json!({})).await,
        vec![pair("local-only", "tenant"), pair("release", "tenant")]
    );
    assert!(listed(&app, json!({"scope": "global"})).await.is_empty());

    let promoted = app
        .tool_ok("aegis.workflow.promote", json!({"name": "release"}))
        .await;
    assert_eq!(promoted["promoted"], true, "{promoted}");
    assert_eq!(promoted["workflow_id"], id.as_str());
    assert_eq!(promoted["name"], "release");
    assert_eq!(promoted["previous_scope"], "tenant");
    assert_eq!(promoted["new_scope"], "global");

    assert_eq!(
        listed(&app, json!({"scope": "global"})).await,
        vec![pair("release", "global")]
    );
    assert_eq!(
        listed(&app, json!({"scope": "visible"})).await,
        vec![pair("local-only", "tenant"), pair("release", "global")]
    );
    // The owner still lists, exports and runs it as its own.
    assert_eq!(
        listed(&app, json!({})).await,
        vec![pair("local-only", "tenant"), pair("release", "global")]
    );
    let exported = app
        .tool_ok("aegis.workflow.export", json!({"name": "release"}))
        .await;
    assert_eq!(exported["scope"], "global", "{exported}");
    let r = app
        .response(Method::GET, "/v1/workflows/release", None)
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["scope"], "global");

    // Promoting again names the current scope; so does demoting what is tenant scoped.
    let again = failure(&app, "aegis.workflow.promote", json!({"name": "release"})).await;
    assert_eq!(again["code"], "conflict", "{again}");
    assert!(
        common::json::text(&again["message"]).contains("already global scoped"),
        "{again}"
    );
    assert_eq!(again["details"]["current_scope"], "global");
    let local = failure(&app, "aegis.workflow.demote", json!({"name": "local-only"})).await;
    assert_eq!(local["code"], "conflict", "{local}");
    assert_eq!(local["details"]["current_scope"], "tenant");

    // The wrong direction is refused with the reason, not carried out.
    let backwards = failure(
        &app,
        "aegis.workflow.promote",
        json!({"name": "release", "target_scope": "tenant"}),
    )
    .await;
    assert_eq!(backwards["code"], "invalid_arguments", "{backwards}");
    assert!(
        common::json::text(&backwards["message"]).contains("aegis.workflow.demote"),
        "{backwards}"
    );

    // Demote by id, with the AEGIS compatibility arguments (ignored).
    let demoted = app.tool_ok("aegis.workflow.demote",
        json!({"name": id, "target_scope": "tenant", "roles": ["aegis:operator"], "user_id": "u1"}),
    )
    .await;
    assert_eq!(demoted["demoted"], true, "{demoted}");
    assert_eq!(demoted["previous_scope"], "global");
    assert_eq!(demoted["new_scope"], "tenant");
    assert!(listed(&app, json!({"scope": "global"})).await.is_empty());

    // Each change is in the scope history, in order, attributed to the admin key.
    let history: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT previous_scope, new_scope, caller_kind FROM definition_scope_changes \
         WHERE definition_id = $1::uuid ORDER BY changed_at, id",
    )
    .bind(&id)
    .fetch_all(&app.state.pool)
    .await
    .unwrap();
    assert_eq!(
        history,
        vec![
            ("tenant".into(), "global".into(), "api_key".into()),
            ("global".into(), "tenant".into(), "api_key".into()),
        ]
    );

    // The audit log has every call: intent and completion of the two successes, and the refusals.
    let audit = |tool: &'static str| {
        let app = &app;
        async move {
            let page = app
                .answered(Method::GET, &format!("/v1/audit?tool={tool}"), None, 200)
                .await;
            page["rows"]
                .as_array()
                .cloned()
                .unwrap_or_else(|| panic!("audit page without rows: {page}"))
        }
    };
    let promotes = audit("aegis.workflow.promote").await;
    let outcomes: Vec<&str> = promotes
        .iter()
        .map(|r| r["outcome"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        outcomes,
        ["running", "ok", "running", "error", "running", "error"],
        "{promotes:?}"
    );
    let demotes = audit("aegis.workflow.demote").await;
    let outcomes: Vec<&str> = demotes
        .iter()
        .map(|r| r["outcome"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        outcomes,
        ["running", "error", "running", "ok"],
        "{demotes:?}"
    );
}

#[tokio::test]
async fn an_unknown_workflow_is_not_found_and_callers_below_operator_are_refused() {
    let app = TestApp::spawn().await;
    deploy(&app, "guarded").await;

    for tool in ["aegis.workflow.promote", "aegis.workflow.demote"] {
        let e = failure(&app, tool, json!({"name": "no-such-workflow"})).await;
        assert_eq!(e["code"], "not_found", "{e}");
        assert!(e["message"].as_str().unwrap().contains("no-such-workflow"));
        let e = failure(
            &app,
            tool,
            json!({"name": "00000000-0000-4000-8000-000000000000"}),
        )
        .await;
        assert_eq!(e["code"], "not_found", "{e}");
    }
    // Another tenant cannot be named.
    let e = failure(
        &app,
        "aegis.workflow.promote",
        json!({"name": "guarded", "tenant_id": "elsewhere"}),
    )
    .await;
    assert_eq!(e["code"], "forbidden", "{e}");

    // A readonly key may not call tools at all.
    let readonly = app.create_key("viewer", "readonly").await;
    app.rest_as(&readonly)
        .posted(
            "/v1/tools/call",
            json!({"name": "aegis.workflow.promote", "arguments": {"name": "guarded"}}),
            403,
        )
        .await;

    // Callers of the user and system tiers (agents, SEAL sessions) reach the router and are
    // refused by its tier check, whatever roles they name in the arguments; the refusal is audited.
    for (tier, id) in [(Tier::User, "user-agent"), (Tier::System, "system-agent")] {
        let caller = Caller {
            kind: CallerKind::Execution,
            id: id.to_owned(),
            label: id.to_owned(),
            tier,
            role: None,
            tenant: orchestrator::DEFAULT_TENANT.to_owned(),
            seal: None,
        };
        let refused = tools::invoke(
            &app.state,
            &caller,
            "aegis.workflow.promote",
            json!({"name": "guarded", "roles": ["aegis:admin", "aegis:operator"]}),
        )
        .await;
        match refused {
            Err(CallError::Denied { denial, .. }) => assert_eq!(denial.code, "tier"),
            Err(other) => panic!("{id}: expected a tier denial, got {other}"),
            Ok(outcome) => panic!("{id}: promote ran: {:?}", outcome.result),
        }
        let denied: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM audit_log WHERE caller_id = $1 AND action = 'aegis.workflow.promote' \
             AND decision = 'denied' AND reason_code = 'tier'",
        )
        .bind(id)
        .fetch_one(&app.state.pool)
        .await
        .unwrap();
        assert_eq!(denied, 1, "{id}");
    }

    // Nothing changed.
    assert_eq!(
        listed(&app, json!({})).await,
        vec![pair("guarded", "tenant")]
    );
    let changes = app
        .count("SELECT count(*) FROM definition_scope_changes")
        .await;
    assert_eq!(changes, 0);
}

#[tokio::test]
async fn another_tenants_global_workflow_is_visible_but_not_ours_to_demote_and_its_name_is_taken() {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.workflows.system_image = Some("aegis-runtime/busybox:1".to_owned());
    config.workflows.poll_interval_ms = 200;
    let app = TestApp::spawn_with(config).await;
    let theirs = deploy(&app, "shared").await;
    // No API creates tenants yet: hand "shared" to a second tenant and make it global there.
    let pool = &app.state.pool;
    for sql in [
        "INSERT INTO tenants (id) VALUES ('other')",
        "UPDATE definitions SET tenant_id = 'other', scope = 'global' WHERE name = 'shared'",
        "UPDATE definition_versions SET tenant_id = 'other'",
    ] {
        sqlx::query(sql).execute(pool).await.unwrap();
    }

    // We see it when asking for global or visible workflows, not among our own.
    assert!(listed(&app, json!({})).await.is_empty());
    assert_eq!(
        listed(&app, json!({"scope": "global"})).await,
        vec![pair("shared", "global")]
    );
    assert_eq!(
        listed(&app, json!({"scope": "visible"})).await,
        vec![pair("shared", "global")]
    );
    let exported = app
        .tool_ok("aegis.workflow.export", json!({"name": "shared"}))
        .await;
    assert_eq!(exported["id"], theirs.as_str());
    // ...and can run it (its System state runs in a sandbox of ours).
    let started = app
        .tool_ok("aegis.workflow.run", json!({"name": "shared"}))
        .await;
    let execution = started["execution_id"].as_str().expect("execution_id");
    let ended = app
        .tool_ok(
            "aegis.workflow.wait",
            json!({"execution_id": execution, "timeout_seconds": 60, "poll_interval_seconds": 1}),
        )
        .await;
    assert_eq!(ended["status"], "completed", "{ended}");
    assert_eq!(ended["workflow_id"], theirs.as_str(), "{ended}");

    // We do not own it: neither demote nor promote finds it.
    let e = failure(&app, "aegis.workflow.demote", json!({"name": theirs})).await;
    assert_eq!(e["code"], "not_found", "{e}");

    // Our own workflow of the same name is ours to use, and shadows theirs for us...
    let ours = deploy(&app, "shared").await;
    let exported = app
        .tool_ok("aegis.workflow.export", json!({"name": "shared"}))
        .await;
    assert_eq!(exported["id"], ours.as_str());
    assert_eq!(exported["scope"], "tenant");
    assert_eq!(
        listed(&app, json!({"scope": "visible"})).await,
        vec![pair("shared", "global"), pair("shared", "tenant")]
    );

    // ...but cannot become global while theirs holds the name.
    let e = failure(&app, "aegis.workflow.promote", json!({"name": "shared"})).await;
    assert_eq!(e["code"], "conflict", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("already named"),
        "{e}"
    );
    assert_eq!(e["details"]["existing_workflow_id"], theirs.as_str());
    let scope: String = common::one(
        pool,
        "SELECT scope FROM definitions WHERE id = $1::uuid",
        &ours,
    )
    .await;
    assert_eq!(scope, "tenant");
}
