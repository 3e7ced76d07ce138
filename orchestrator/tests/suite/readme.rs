//! README.md's fenced blocks, every one accounted for (issue 42: a new user followed the README
//! alone). A block is either runnable, marked `<!-- example: NAME -->` on the line before it and
//! run here (or in `cli`) against a node of the suite, or marked `<!-- not-run: REASON -->`
//! with why it cannot run offline in a test (a compose stack, a benchmark, a language model).
//! An unmarked block fails [`every_readme_block_is_run_or_says_why_not`], and so does a block
//! marked runnable that no test runs.
//!
//! Runnable blocks run as written: one bash process per group of blocks (`-euo pipefail`, so a
//! failing command fails the test; a `python` block is fed to `python3` from that same shell),
//! with the variables the README has the reader set once (`ORCHESTRATOR_URL`,
//! `ORCHESTRATOR_GRPC_URL`, `ORCHESTRATOR_KEY`) pointing at the test's node, and `orchestrator`
//! on `PATH` being the built binary. The node loads the security contexts of
//! `config/compose.yaml`, so a block naming a context the compose stack lacks fails here as it
//! did for the user (`no security context 'research-safe' exists`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::common::{self, TestApp, TestDb, TEST_ADMIN_KEY};

/// The runnable blocks and the test that runs each. A name marked in README.md but missing
/// here (or here but not in README.md) fails the accounting test, so no marked block is
/// silently left out.
const RUN_BY_TESTS: &[(&str, &str)] = &[
    ("sandbox", "cli::the_readme_examples_run_as_written"),
    ("agent", "cli::the_readme_examples_run_as_written"),
    (
        "seal",
        "readme::the_seal_and_mcp_examples_run_on_the_compose_contexts",
    ),
    (
        "mcp-key",
        "readme::the_seal_and_mcp_examples_run_on_the_compose_contexts",
    ),
    (
        "mcp-python",
        "readme::the_seal_and_mcp_examples_run_on_the_compose_contexts",
    ),
    (
        "workflow",
        "readme::the_workflow_example_runs_answered_and_followed",
    ),
    ("e2b-env", "readme::the_e2b_example_runs_with_the_sdk"),
    ("e2b-python", "readme::the_e2b_example_runs_with_the_sdk"),
];

/// What the line before a fenced block says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Mark {
    /// `<!-- example: NAME -->`: run by a test.
    Example(String),
    /// `<!-- not-run: REASON -->`: not run, for the reason given.
    NotRun(String),
    /// No marker.
    Unmarked,
}

/// One fenced block of README.md.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    /// 1-based line of the opening fence.
    pub line: usize,
    /// The info string after the fence (`sh`, `python`, ...).
    pub lang: String,
    /// The lines between the fences, each ending in `\n`.
    pub body: String,
    pub mark: Mark,
}

/// README.md of the repository.
pub(crate) fn readme() -> String {
    std::fs::read_to_string(repo().join("README.md")).expect("README.md")
}

/// The repository root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository root")
        .to_owned()
}

/// Reads a marker comment (`<!-- example: NAME -->`, `<!-- not-run: REASON -->`).
fn mark_of(line: &str) -> Mark {
    let inner = line
        .trim()
        .strip_prefix("<!--")
        .and_then(|l| l.strip_suffix("-->"))
        .map(str::trim);
    match inner {
        Some(i) if i.starts_with("example:") => {
            Mark::Example(i["example:".len()..].trim().to_owned())
        }
        Some(i) if i.starts_with("not-run:") => {
            Mark::NotRun(i["not-run:".len()..].trim().to_owned())
        }
        _ => Mark::Unmarked,
    }
}

/// Every fenced block, in order, with the mark on the last non-blank line before it. Panics on
/// a block that is never closed (the rest of the file would silently be code).
pub(crate) fn blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        if !trimmed.starts_with("```") {
            i += 1;
            continue;
        }
        let open = i;
        let lang = trimmed.trim_start_matches('`').trim().to_owned();
        let close = (open + 1..lines.len())
            .find(|&j| lines[j].trim() == "```")
            .unwrap_or_else(|| panic!("README.md line {}: the block is never closed", open + 1));
        let body: String = lines[open + 1..close]
            .iter()
            .map(|l| format!("{l}\n"))
            .collect();
        let mark = lines[..open]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map_or(Mark::Unmarked, |l| mark_of(l));
        out.push(Block {
            line: open + 1,
            lang,
            body,
            mark,
        });
        i = close + 1;
    }
    out
}

/// The block marked `<!-- example: NAME -->`.
pub(crate) fn example(text: &str, name: &str) -> Block {
    blocks(text)
        .into_iter()
        .find(|b| b.mark == Mark::Example(name.to_owned()))
        .unwrap_or_else(|| panic!("README.md has no <!-- example: {name} --> block"))
}

/// One bash script of the named blocks in order, as a reader pastes them into one terminal:
/// shell blocks as they are, a `python` block fed to `python3` on its standard input.
fn script(text: &str, names: &[&str]) -> String {
    let mut script = String::new();
    for name in names {
        let block = example(text, name);
        match block.lang.as_str() {
            "sh" | "bash" | "" => script.push_str(&block.body),
            "python" => {
                assert!(
                    !block.body.contains("README_PYTHON"),
                    "the heredoc's end word occurs in block {name}"
                );
                script.push_str("python3 - <<'README_PYTHON'\n");
                script.push_str(&block.body);
                script.push_str("README_PYTHON\n");
            }
            other => panic!("README.md block {name} is `{other}`: no test can run it"),
        }
    }
    script
}

/// A working directory for the blocks: empty but for links to the repository's folders, so
/// `schemas/...` resolves as from the repository root while the files a block writes
/// (`release.yaml`, `seal-session.json`) land in a directory of the test's own.
fn workdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for entry in std::fs::read_dir(repo()).expect("repository root") {
        let entry = entry.expect("entry");
        if entry.file_type().is_ok_and(|t| t.is_dir()) && entry.file_name() != "target" {
            std::os::unix::fs::symlink(entry.path(), dir.path().join(entry.file_name()))
                .expect("link");
        }
    }
    dir
}

/// `PATH` with the built `orchestrator` binary's directory first, so a README block's
/// `orchestrator` is the binary under test.
pub(crate) fn path_with_the_binary() -> String {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_orchestrator"))
        .parent()
        .expect("binary dir")
        .to_owned();
    format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Runs the named blocks in one bash process against `app`, with a time bound; their stdout,
/// which must have succeeded (a failure shows both streams).
async fn run(app: &TestApp, names: &[&str]) -> String {
    let text = readme();
    let script = script(&text, names);
    let path = path_with_the_binary();
    let dir = workdir();
    let home = tempfile::tempdir().expect("home");
    let mut command = tokio::process::Command::new("bash");
    command
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("ORCHESTRATOR_URL", &app.http_base)
        .env("ORCHESTRATOR_GRPC_URL", format!("http://{}", app.grpc_addr))
        .env("ORCHESTRATOR_KEY", TEST_ADMIN_KEY)
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path())
        .kill_on_drop(true);
    for var in [
        "DATABASE_URL",
        "ORCHESTRATOR_CONFIG",
        "ORCHESTRATOR_API_KEY",
        "E2B_API_URL",
        "E2B_SANDBOX_URL",
        "E2B_API_KEY",
        "E2B_DOMAIN",
        "MCP_KEY",
        "SEAL_ATTESTATION_TOKEN",
        "SEAL_ATTESTATION_SECRET",
    ] {
        command.env_remove(var);
    }
    let out = tokio::time::timeout(Duration::from_secs(600), command.output())
        .await
        .unwrap_or_else(|_| panic!("README blocks {names:?} did not end within 600 s"))
        .expect("bash runs");
    succeeded(names, &out)
}

/// Stdout of a run that succeeded; the failure shows both streams.
fn succeeded(names: &[&str], out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "README blocks {names:?} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A node on a database of its own with the security contexts of `config/compose.yaml`.
async fn compose_like_node() -> TestApp {
    let compose = orchestrator::config::load(Some(&repo().join("config/compose.yaml")), &[])
        .expect("config/compose.yaml loads")
        .config;
    let db = TestDb::create().await;
    let mut config = common::test_config(&db.url);
    config.seal.security_contexts = compose.seal.security_contexts;
    let mut app = TestApp::spawn_with(config).await;
    app.db = Some(db);
    app
}

#[test]
fn every_readme_block_is_run_or_says_why_not() {
    let text = readme();
    let all = blocks(&text);
    assert!(all.len() > 10, "README.md has {} blocks?", all.len());
    let mut problems = Vec::new();
    let mut marked = BTreeSet::new();
    for block in &all {
        match &block.mark {
            Mark::Unmarked => problems.push(format!(
                "line {} (```{}): no <!-- example: NAME --> or <!-- not-run: REASON --> on the line before",
                block.line, block.lang
            )),
            Mark::NotRun(reason) if reason.is_empty() => {
                problems.push(format!("line {}: not-run without a reason", block.line));
            }
            Mark::NotRun(_) => {}
            Mark::Example(name) => {
                if !marked.insert(name.clone()) {
                    problems.push(format!("line {}: example {name} marked twice", block.line));
                }
                if !RUN_BY_TESTS.iter().any(|(n, _)| n == name) {
                    problems.push(format!(
                        "line {}: example {name} is run by no test (add it to RUN_BY_TESTS and run it)",
                        block.line
                    ));
                }
                if !matches!(block.lang.as_str(), "sh" | "bash" | "python") {
                    problems.push(format!(
                        "line {}: example {name} is ```{}: only sh, bash and python run",
                        block.line, block.lang
                    ));
                }
            }
        }
    }
    for (name, test) in RUN_BY_TESTS {
        if !marked.contains(*name) {
            problems.push(format!(
                "{test} runs example {name}, which README.md no longer marks"
            ));
        }
    }
    assert!(problems.is_empty(), "README.md:\n{}", problems.join("\n"));
}

#[test]
fn the_marker_reader_tells_the_three_cases_apart() {
    let text = "a\n\n<!-- example: one -->\n```sh\necho 1\n```\n<!-- not-run: needs X -->\n\n```yaml\nk: v\n```\ntext\n```text\nout\n```\n";
    let all = blocks(text);
    assert_eq!(all.len(), 3);
    assert_eq!(all[0].mark, Mark::Example("one".into()));
    assert_eq!((all[0].line, all[0].body.as_str()), (4, "echo 1\n"));
    assert_eq!(all[1].mark, Mark::NotRun("needs X".into()));
    assert_eq!(all[1].lang, "yaml");
    assert_eq!(all[2].mark, Mark::Unmarked);
}

#[test]
fn every_compose_config_defines_the_readme_contexts_alike() {
    let load = |name: &str| {
        orchestrator::config::load(Some(&repo().join("config").join(name)), &[])
            .unwrap_or_else(|e| panic!("config/{name}: {e}"))
            .config
            .seal
            .security_contexts
    };
    let shipped = load("compose.yaml");
    assert!(
        shipped.iter().any(|c| c["name"] == "research-safe"),
        "config/compose.yaml lacks the context README's examples name"
    );
    for other in ["compose.ollama.yaml", "compose.openai.yaml"] {
        assert_eq!(
            load(other),
            shipped,
            "config/{other} differs from compose.yaml"
        );
    }
    // Every context a README block names (a CLI flag, a key's binding) is one the compose
    // stack has.
    let text = readme();
    let mut named = 0;
    for block in blocks(&text) {
        let flags = block.body.split("--context ").skip(1);
        let bindings = block.body.split("\"security_context\": \"").skip(1);
        for part in flags.chain(bindings) {
            named += 1;
            let name = part
                .split(|c: char| c.is_whitespace() || c == '"')
                .next()
                .unwrap_or_default();
            assert!(
                shipped.iter().any(|c| c["name"] == name),
                "README.md line {}: context {name} is not in config/compose.yaml",
                block.line
            );
        }
    }
    assert!(
        named >= 5,
        "README's blocks name {named} contexts: the reader above misses them"
    );
}

#[tokio::test]
async fn the_seal_and_mcp_examples_run_on_the_compose_contexts() {
    let app = compose_like_node().await;

    // SEAL: a token, attestation over HTTP, a write and a read in the session's sandbox, a
    // second token and attestation over gRPC, the session's tools.
    let out = run(&app, &["seal"]).await;
    assert!(out.contains("\"a,b\\n1,2\\n\""), "fs.read's content: {out}");
    assert!(out.contains("fs.read") && !out.contains("cmd.run"), "{out}");

    // MCP: a key bound to research-safe, then the official SDK lists, writes, reads, is refused.
    let out = run(&app, &["mcp-key", "mcp-python"]).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].contains("'fs.read'") && lines[0].contains("'fs.write'"),
        "{out}"
    );
    assert!(
        !lines[0].contains("cmd.run") && !lines[0].contains("fs.delete"),
        "{out}"
    );
    assert_eq!(lines[1], "hello", "{out}");
    assert_eq!(lines[2], "True", "{out}");
}

#[tokio::test]
async fn the_workflow_example_runs_answered_and_followed() {
    let app = compose_like_node().await;
    let out = run(&app, &["workflow"]).await;
    // The live stream saw the Human gate; the last answer is the completed run.
    assert!(out.contains("human_input_requested"), "{out}");
    assert!(out.contains("Ship built v1.2?"), "{out}");
    let last = out
        .rsplit_once("\n{")
        .map(|(_, json)| format!("{{{json}"))
        .unwrap_or_default();
    let status: serde_json::Value = serde_json::from_str(&last)
        .unwrap_or_else(|e| panic!("the last answer is jq's object ({e}): {out}"));
    assert_eq!(status["status"], "completed", "{out}");
    assert_eq!(status["current_state"], "SHIP", "{out}");
    assert!(
        status["final_output"].to_string().contains("shipping v1.2"),
        "{out}"
    );
}

#[tokio::test]
async fn the_e2b_example_runs_with_the_sdk() {
    let app = compose_like_node().await;
    let out = run(&app, &["e2b-env", "e2b-python"]).await;
    // `print` of a command's stdout adds a blank line after its own newline.
    assert_eq!(
        out.lines().filter(|l| !l.is_empty()).collect::<Vec<_>>(),
        ["42", "['/home/user/data/in.csv']"],
        "{out}"
    );
}
