//! `aegis.agent.search` and `aegis.workflow.search` through the real service and PostgreSQL:
//! a word of an instruction, a misspelt name, scores, label filters, pagination, and the
//! visibility rules of the list tools (another tenant's definitions are never found; its global
//! workflows only with `scope: visible`).

use crate::common;
use crate::common::agent::AgentManifest;
use crate::common::workflow::workflow_manifest;

use common::TestApp;
use serde_json::{json, Value};

fn agent(name: &str, description: &str, instruction: &str, labels: &str) -> String {
    AgentManifest::new(name)
        .metadata(&format!(
            "  description: \"{description}\"\n  labels: {labels}\n"
        ))
        .instruction(&format!("\"{instruction}\""))
        .yaml()
}

async fn deploy_agent(app: &TestApp, manifest: String) {
    app.tool_ok("aegis.agent.create", json!({"manifest_yaml": manifest}))
        .await;
}

fn names(out: &Value) -> Vec<String> {
    common::json::items(&out["results"])
        .iter()
        .map(|r| r["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn fleet(app: &TestApp) {
    deploy_agent(
        app,
        agent(
            "image-resizer",
            "Makes pictures smaller",
            "Scale every PNG in the workspace down to thumbnails.",
            "{team: media}",
        ),
    )
    .await;
    deploy_agent(
        app,
        agent(
            "ledger-clerk",
            "Books keeping",
            "Reconcile the invoices against the bank statement.",
            "{team: finance}",
        ),
    )
    .await;
    deploy_agent(
        app,
        agent(
            "report-writer",
            "Writes the weekly report",
            "Summarise the invoices of the week in a short report.",
            "{team: finance, tier: gold}",
        ),
    )
    .await;
}

/// What `aegis.<kind>.search` (`agent`, `workflow`) answers to `args`, which must succeed.
async fn search(app: &TestApp, kind: &str, args: Value) -> Value {
    app.tool_ok(&format!("aegis.{kind}.search"), args).await
}

#[tokio::test]
async fn an_agent_is_found_by_a_word_of_its_instruction_and_by_a_misspelt_name() {
    let app = TestApp::spawn().await;
    fleet(&app).await;

    // "thumbnails" occurs only in image-resizer's instruction.
    let out = search(&app, "agent", json!({"query": "thumbnail"})).await;
    assert_eq!(names(&out), vec!["image-resizer"], "{out}");
    assert_eq!(out["total"], 1);
    let score = out["results"][0]["score"].as_f64().expect("score");
    assert!(
        (0.5..=1.0).contains(&score),
        "a full-text hit scores 0.5..1: {out}"
    );
    assert_eq!(out["results"][0]["labels"]["team"], "media");

    // A misspelt name, found by trigram similarity alone (no word of it is in any manifest).
    let out = search(&app, "agent", json!({"query": "imge-resizr"})).await;
    assert_eq!(
        names(&out).first().map(String::as_str),
        Some("image-resizer"),
        "{out}"
    );
    assert!(!names(&out).contains(&"ledger-clerk".to_owned()), "{out}");

    // Stemming: "reconciling" finds "Reconcile".
    let out = search(&app, "agent", json!({"query": "reconciling"})).await;
    assert_eq!(names(&out), vec!["ledger-clerk"], "{out}");

    // Nothing relevant: no results, not an error.
    let out = search(&app, "agent", json!({"query": "submarine"})).await;
    assert_eq!(out["total"], 0, "{out}");
    assert!(names(&out).is_empty());
}

#[tokio::test]
async fn results_are_ranked_filtered_by_labels_and_paginated() {
    let app = TestApp::spawn().await;
    fleet(&app).await;

    // Both finance agents mention invoices; the report writer says "report" in its name too.
    let all = search(&app, "agent", json!({"query": "invoices report"})).await;
    assert_eq!(all["total"], 2, "{all}");
    assert_eq!(names(&all), vec!["report-writer", "ledger-clerk"], "{all}");
    let s0 = all["results"][0]["score"].as_f64().expect("score");
    let s1 = all["results"][1]["score"].as_f64().expect("score");
    assert!(s0 > s1, "sorted by score: {all}");

    // Pages of one, in the same order, with the same total.
    let p1 = search(
        &app,
        "agent",
        json!({"query": "invoices report", "limit": 1}),
    )
    .await;
    let p2 = search(
        &app,
        "agent",
        json!({"query": "invoices report", "limit": 1, "offset": 1}),
    )
    .await;
    let p3 = search(
        &app,
        "agent",
        json!({"query": "invoices report", "limit": 1, "offset": 2}),
    )
    .await;
    assert_eq!(names(&p1), vec!["report-writer"]);
    assert_eq!(names(&p2), vec!["ledger-clerk"]);
    assert!(names(&p3).is_empty());
    for p in [&p1, &p2, &p3] {
        assert_eq!(p["total"], 2, "{p}");
    }

    // Labels: all given pairs must match.
    let gold = search(
        &app,
        "agent",
        json!({"query": "invoices", "labels": {"team": "finance", "tier": "gold"}}),
    )
    .await;
    assert_eq!(names(&gold), vec!["report-writer"], "{gold}");
    let none = search(
        &app,
        "agent",
        json!({"query": "invoices", "labels": {"team": "media"}}),
    )
    .await;
    assert!(names(&none).is_empty(), "{none}");

    // A higher min_score drops the weaker match; a status other than active finds nothing.
    let strict = search(
        &app,
        "agent",
        json!({"query": "invoices report", "min_score": s1 + 0.001}),
    )
    .await;
    assert_eq!(names(&strict), vec!["report-writer"], "{strict}");
    let paused = search(
        &app,
        "agent",
        json!({"query": "invoices", "status": "paused"}),
    )
    .await;
    assert_eq!(paused["total"], 0);

    // Bad arguments are refused with the pointer.
    let (status, out) = app
        .call_tool("aegis.agent.search", json!({"query": "x", "limit": 0}))
        .await;
    assert_eq!(status, 422, "{out}");
    assert!(out.to_string().contains("/limit"), "{out}");
}

#[tokio::test]
async fn workflows_are_found_by_state_kind_and_another_tenants_definitions_stay_invisible() {
    let app = TestApp::spawn().await;
    fleet(&app).await;
    for (name, state) in [
        (
            "nightly-backup",
            "ARCHIVE: {kind: System, command: \"tar -cf /tmp/a /workspace\", transitions: []}",
        ),
        (
            "approval-gate",
            "ASK: {kind: Human, prompt: \"Ship the release?\", transitions: []}",
        ),
    ] {
        let manifest = workflow_manifest(
            name,
            state.split(':').next().unwrap_or_default(),
            &format!("    {state}\n"),
        );
        app.tool_ok("aegis.workflow.create", json!({"manifest_yaml": manifest}))
            .await;
    }
    // State kinds and prompts are searchable.
    let out = search(&app, "workflow", json!({"query": "human"})).await;
    assert_eq!(names(&out), vec!["approval-gate"], "{out}");
    let out = search(&app, "workflow", json!({"query": "release shipping"})).await;
    assert_eq!(names(&out), vec!["approval-gate"], "{out}");
    let out = search(&app, "workflow", json!({"query": "nightly bakup"})).await;
    assert_eq!(
        names(&out).first().map(String::as_str),
        Some("nightly-backup"),
        "{out}"
    );

    // Hand ledger-clerk and nightly-backup to another tenant (no API creates tenants yet);
    // nightly-backup becomes global there.
    let pool = app.db.as_ref().expect("db").pool().await;
    for sql in [
        "INSERT INTO tenants (id) VALUES ('other')",
        "UPDATE definitions SET tenant_id = 'other' WHERE name IN ('ledger-clerk', 'nightly-backup')",
        "UPDATE definitions SET scope = 'global' WHERE name = 'nightly-backup'",
        "UPDATE definition_versions v SET tenant_id = d.tenant_id FROM definitions d WHERE d.id = v.definition_id",
    ] {
        sqlx::query(sql).execute(&pool).await.expect(sql);
    }
    // The other tenant's agent is not found, even by its exact name or instruction.
    for q in [
        "ledger-clerk",
        "reconcile the invoices against the bank statement",
    ] {
        let out = search(&app, "agent", json!({"query": q})).await;
        assert!(
            !names(&out).contains(&"ledger-clerk".to_owned()),
            "{q}: {out}"
        );
    }
    // Naming another tenant is refused, as the list tools do.
    let (_, out) = app
        .call_tool(
            "aegis.agent.search",
            json!({"query": "invoices", "tenant_id": "other"}),
        )
        .await;
    assert_eq!(out["isError"], true, "{out}");
    assert_eq!(out["structuredContent"]["error"]["code"], "forbidden");

    // Its global workflow: not among our own, found with scope visible or global, as listed.
    let own = search(&app, "workflow", json!({"query": "nightly backup"})).await;
    assert!(names(&own).is_empty(), "{own}");
    for scope in ["visible", "global"] {
        let out = search(
            &app,
            "workflow",
            json!({"query": "nightly backup", "scope": scope}),
        )
        .await;
        assert_eq!(names(&out), vec!["nightly-backup"], "{scope}: {out}");
        assert_eq!(out["results"][0]["scope"], "global");
    }
}
