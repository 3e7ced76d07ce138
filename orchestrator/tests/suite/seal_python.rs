//! The gateway driven by an independent Python client that follows the SEAL Python SDK's wire
//! contract (tests/python/seal_wire_client.py, using `cryptography` and `requests` as the SDK
//! does; scripts/test.sh installs them from PyPI).

use crate::common;

use common::{test_config, TestApp, TestDb};
use serde_json::json;

#[tokio::test]
async fn the_python_wire_client_attests_writes_reads_and_runs() {
    let db = TestDb::create().await;
    let mut config = test_config(&db.url);
    config.seal.security_contexts = vec![json!({
        "name": "python-sdk", "description": "what the Python client may do",
        "runtime": {"language": "busybox", "version": "1"},
        "capabilities": [
            {"tool_pattern": "fs.*", "path_allowlist": ["/workspace"]},
            {"tool_pattern": "cmd.run", "command_allowlist": ["cat"]}],
        "attestation": {"workload_patterns": ["python-*"], "allow_unverified": true}})];
    let app = TestApp::spawn_with(config).await;

    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/seal_wire_client.py"
    );
    let report = common::python_client::report(
        script,
        &[&app.http_base, "python-worker", "python-sdk"],
        "the Python client failed (needs `pip install cryptography requests`, which scripts/test.sh does)",
    )
    .await;
    common::python_client::assert_wrote_read_and_ran(&report, "héllo from python ✓\n");
    assert!(
        common::json::text(&report["refused"]).contains("SEAL Gateway Rejected"),
        "{report}"
    );

    // The calls are in the audit log under the Python client's session.
    let session = report["session_id"].as_str().unwrap();
    for (rows, expected) in [
        (
            "decision = 'allowed' AND kind = 'tool' AND outcome <> 'running'",
            3,
        ),
        ("decision = 'denied' AND reason_code = '2002'", 1),
    ] {
        let sql = format!("SELECT count(*) FROM audit_log WHERE caller_id = $1 AND {rows}");
        let counted: i64 = app.one(&sql, session).await;
        assert_eq!(counted, expected, "{rows}");
    }
}
