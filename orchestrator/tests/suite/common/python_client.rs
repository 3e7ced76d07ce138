//! The E2B SDK scenarios' runner: a Python client script from `tests/python/` run against a
//! node's E2B door with a node key in E2B's form, whose one JSON report on stdout is the
//! scenario's result. The E2B, ports and code-interpreter suites all drive their clients so;
//! [`report`] runs the other clients (MCP, SEAL) that take their arguments on the command line.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::{e2b_key, TestApp};

/// Longest a scenario may run.
const SCENARIO_LIMIT: Duration = Duration::from_secs(600);

/// What one run of a client script is given.
pub struct Scenario<'a> {
    /// The script (`concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/...")`).
    pub script: &'a str,
    /// Its arguments (the scenario's name, and what it takes).
    pub args: &'a [&'a str],
    /// The node whose control API the SDK calls (`E2B_API_URL`).
    pub api: &'a TestApp,
    /// The node envd's calls go to (`E2B_SANDBOX_URL`): the same node but in cluster tests.
    pub envd: &'a TestApp,
    /// The node API key the SDK presents.
    pub key: &'a str,
    /// A directory of SDKs installed with `pip install --target` to use instead of the pinned
    /// ones (`PYTHONPATH`).
    pub sdk_dir: Option<&'a Path>,
    /// More environment for the script.
    pub extra: &'a [(&'a str, String)],
    /// What a failure message adds (what the scenario needs installed).
    pub needs: &'a str,
}

impl<'a> Scenario<'a> {
    /// `script args...` against `node` alone (control API and envd), as `key`, with the pinned
    /// SDKs and no more environment; `needs` is what a failure message adds.
    pub fn on(
        node: &'a TestApp,
        script: &'a str,
        args: &'a [&'a str],
        key: &'a str,
        needs: &'a str,
    ) -> Self {
        Self {
            script,
            args,
            api: node,
            envd: node,
            key,
            sdk_dir: None,
            extra: &[],
            needs,
        }
    }
}

/// Runs the scenario and returns its JSON report; fails the test with the script's stderr when
/// it fails, or with its stdout when that is not one JSON value.
pub async fn run(s: Scenario<'_>) -> Value {
    let mut cmd = tokio::process::Command::new("python3");
    cmd.arg(s.script)
        .args(s.args)
        .env("E2B_API_URL", format!("{}/e2b", s.api.http_base))
        .env("E2B_SANDBOX_URL", format!("{}/e2b", s.envd.http_base))
        .env("E2B_API_KEY", e2b_key(s.key));
    if let Some(dir) = s.sdk_dir {
        cmd.env("PYTHONPATH", dir);
    }
    for (k, v) in s.extra {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(SCENARIO_LIMIT, cmd.output())
        .await
        .expect("the SDK scenario ends")
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "the scenario {} of {} failed ({}): {}",
        s.args.join(" "),
        s.script,
        s.needs,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "one JSON report expected ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Runs `python3 script args...` and returns its one JSON report on stdout; fails the test with
/// `failed` (what failed, and what it needs installed) and the script's stderr when it fails.
pub async fn report(script: &str, args: &[&str], failed: &str) -> Value {
    let out = tokio::process::Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .await
        .expect("python3 runs");
    super::json_of(out, failed)
}

/// A client report's three steps in a sandbox, which the MCP and SEAL Python clients report
/// alike: `write` of `text` succeeded, `read` gave `text` back and `run` printed it.
pub fn assert_wrote_read_and_ran(report: &Value, text: &str) {
    assert_eq!(report["write"]["isError"], false, "{report}");
    assert_eq!(
        report["read"]["structuredContent"]["content"], text,
        "{report}"
    );
    assert_eq!(
        report["run"]["structuredContent"]["stdout"], text,
        "{report}"
    );
}
