//! The operator CLI (`orchestrator agent|run|logs|sandbox|tools|keys|audit ...`) driven as a
//! user drives it: the built binary, against a real service on its own database, with the
//! scripted model of `common::fake_llm` where an agent runs. Also the README's marked examples
//! (`<!-- example: NAME -->` before a fenced block), run as written by bash.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::fake_llm::{answer, tool_calls, FakeLlm};
use common::{TestApp, TestDb, TEST_ADMIN_KEY};
use serde_json::{json, Value};

/// The repository root (README.md, schemas/).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate is in the workspace")
        .to_owned()
}

/// A home without credentials files, so a developer's own never leaks into a test.
fn empty_home() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// Runs the binary with `args` against `app` with `key` (None: no key at all).
async fn cli_with(app: &TestApp, key: Option<&str>, args: &[&str], stdin: Option<&str>) -> Output {
    let home = empty_home();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"));
    command
        .args(args)
        .current_dir(repo())
        .env("ORCHESTRATOR_URL", &app.http_base)
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path())
        .env_remove("ORCHESTRATOR_API_KEY")
        .env_remove("ORCHESTRATOR_CREDENTIALS")
        .env_remove("ORCHESTRATOR_CONFIG")
        .env_remove("DATABASE_URL")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    match key {
        Some(k) => command.env("ORCHESTRATOR_KEY", k),
        None => command.env_remove("ORCHESTRATOR_KEY"),
    };
    let mut child = command.spawn().expect("the binary starts");
    if let Some(mut pipe) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        if let Some(text) = stdin {
            pipe.write_all(text.as_bytes()).await.expect("stdin");
        }
    }
    child.wait_with_output().await.expect("the binary ends")
}

/// Runs the binary as admin.
async fn cli(app: &TestApp, args: &[&str]) -> Output {
    cli_with(app, Some(TEST_ADMIN_KEY), args, None).await
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// Asserts success and returns stdout.
#[track_caller]
fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Asserts the exit code and returns stderr.
#[track_caller]
fn fails_with(out: &Output, code: i32) -> String {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stderr)
}

fn json_of(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// The script of one hello-world run: `echo Hello, NAME`, then the answer.
fn greeting(name: &str) -> Vec<common::fake_llm::Step> {
    vec![
        tool_calls(&[(
            "cmd__run",
            json!({"command": format!("echo Hello, {name}")}),
        )]),
        answer(&format!("Hello, {name}")),
    ]
}

async fn app_with_model(script: Vec<common::fake_llm::Step>) -> (TestApp, FakeLlm) {
    let fake = FakeLlm::start(script).await;
    let db = TestDb::create().await;
    let mut config = common::test_config(&db.url);
    config.llm = fake.config();
    let mut app = TestApp::spawn_with(config).await;
    app.db = Some(db);
    (app, fake)
}

/// The events of an execution as the REST API has them.
async fn events(app: &TestApp, id: &str) -> Vec<Value> {
    let page = app
        .get_value(&format!("/v1/executions/{id}/events?limit=500"))
        .await;
    page["events"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn agents_deploy_run_follow_and_logs() {
    let mut script = greeting("Ada");
    script.extend(greeting("Grace"));
    let (app, fake) = app_with_model(script).await;
    let manifest = repo().join("schemas/examples/valid/agent-hello-world.yaml");

    let out = ok(&cli(&app, &["agent", "deploy", &manifest.display().to_string()]).await);
    assert!(out.starts_with("deployed agent hello-world 1.0.0"), "{out}");
    let again = cli(&app, &["agent", "deploy", &manifest.display().to_string()]).await;
    assert!(fails_with(&again, 1).contains("409"));
    let listed = ok(&cli(&app, &["agent", "list"]).await);
    assert!(listed.starts_with("NAME"), "{listed}");
    assert!(listed.contains("hello-world"), "{listed}");
    let listed = json_of(&ok(&cli(&app, &["agent", "list", "--json"]).await));
    assert_eq!(listed[0]["name"], "hello-world", "{listed}");
    let exported = ok(&cli(&app, &["agent", "export", "hello-world"]).await);
    assert!(
        exported.contains("kind: Agent") && exported.contains("cmd.run"),
        "{exported}"
    );

    // run --follow: events live, then the final output; exit 0 because it completed.
    let out = cli(
        &app,
        &[
            "run",
            "hello-world",
            "--input",
            r#"{"name": "Ada"}"#,
            "--follow",
        ],
    )
    .await;
    let stdout = ok(&out);
    assert!(stdout.contains("execution_started"), "{stdout}");
    assert!(
        stdout.contains("console_output  exit_code=0 stdout=Hello, Ada"),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with("Hello, Ada"), "{stdout}");

    // run without --follow prints the id; logs --follow waits for the end; logs --json pages.
    let dir = tempfile::tempdir().expect("dir");
    let input = dir.path().join("input.json");
    std::fs::write(&input, r#"{"name": "Grace"}"#).expect("input file");
    let started = cli(
        &app,
        &[
            "run",
            "hello-world",
            "--input",
            &format!("@{}", input.display()),
        ],
    )
    .await;
    let id = ok(&started).trim().to_owned();
    uuid::Uuid::parse_str(&id).unwrap_or_else(|_| panic!("an execution id: {id}"));
    let followed = ok(&cli(&app, &["logs", &id, "--follow"]).await);
    assert!(followed.contains("Hello, Grace"), "{followed}");
    let logged = json_of(&ok(&cli(&app, &["logs", &id, "--json"]).await));
    let rest = events(&app, &id).await;
    assert_eq!(logged.as_array().map(Vec::len), Some(rest.len()));
    let console = rest
        .iter()
        .find(|e| e["event_type"] == "console_output")
        .expect("the command ran");
    assert_eq!(console["payload"]["stdout"], "Hello, Grace\n");
    assert_eq!(console["payload"]["exit_code"], 0);
    assert_eq!(fake.remaining(), 0);

    // Not found is 5; bad input is 2; the agent can be deleted.
    fails_with(&cli(&app, &["run", "nobody", "--follow"]).await, 5);
    let e = fails_with(
        &cli(&app, &["run", "hello-world", "--input", "{nope"]).await,
        2,
    );
    assert!(e.contains("--input: not valid JSON"), "{e}");
    fails_with(
        &cli(&app, &["logs", &uuid::Uuid::new_v4().to_string()]).await,
        5,
    );
    ok(&cli(&app, &["agent", "delete", "hello-world"]).await);
    fails_with(&cli(&app, &["agent", "get", "hello-world"]).await, 5);
}

#[tokio::test]
async fn sandboxes_from_a_runtime_exec_read_write_and_rm() {
    let app = TestApp::spawn().await;
    let id = ok(&cli(&app, &["sandbox", "create", "--runtime", "shell"]).await)
        .trim()
        .to_owned();
    uuid::Uuid::parse_str(&id).unwrap_or_else(|_| panic!("a sandbox id: {id}"));

    let listing = ok(&cli(&app, &["sandbox", "exec", &id, "--", "ls", "-la"]).await);
    assert!(listing.contains(" ."), "{listing}");
    // The command's own exit code comes back (ls of a missing path exits 2).
    let out = cli(&app, &["sandbox", "exec", &id, "--", "ls", "/no/such/dir"]).await;
    assert!(fails_with(&out, 2).contains("No such file"));

    ok(&cli(
        &app,
        &[
            "sandbox",
            "write",
            &id,
            "notes.txt",
            "--content",
            "first note",
        ],
    )
    .await);
    assert_eq!(
        ok(&cli(&app, &["sandbox", "read", &id, "notes.txt"]).await),
        "first note"
    );
    let piped = cli_with(
        &app,
        Some(TEST_ADMIN_KEY),
        &["sandbox", "write", &id, "/workspace/piped.txt"],
        Some("from stdin\n"),
    )
    .await;
    ok(&piped);
    assert_eq!(
        ok(&cli(&app, &["sandbox", "read", &id, "piped.txt"]).await),
        "from stdin\n"
    );
    let called = json_of(&ok(&cli(
        &app,
        &[
            "tools",
            "call",
            "cmd.run",
            r#"{"command": "wc -c piped.txt"}"#,
            "--sandbox",
            &id,
        ],
    )
    .await));
    assert_eq!(called["exit_code"], 0, "{called}");
    assert!(common::json::text(&called["stdout"]).starts_with("11 "));
    let listed = json_of(&ok(&cli(&app, &["sandbox", "list", "--json"]).await));
    assert!(
        listed
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["id"] == id.as_str()),
        "{listed}"
    );
    let table = ok(&cli(&app, &["sandbox", "list"]).await);
    assert!(
        table.contains(&id) && table.contains("aegis-runtime/shell:bookworm"),
        "{table}"
    );

    // A runtime sandbox with an allowlist refuses other programs (1, a refusal).
    let narrow = ok(&cli(
        &app,
        &["sandbox", "create", "--runtime", "shell", "--allow", "echo"],
    )
    .await)
    .trim()
    .to_owned();
    assert_eq!(
        ok(&cli(&app, &["sandbox", "exec", &narrow, "--", "echo", "hi"]).await),
        "hi\n"
    );
    let e = fails_with(
        &cli(&app, &["sandbox", "exec", &narrow, "--", "ls"]).await,
        1,
    );
    assert!(e.contains("command_not_allowed"), "{e}");

    ok(&cli(&app, &["sandbox", "rm", &id]).await);
    ok(&cli(&app, &["sandbox", "rm", &narrow]).await);
    fails_with(&cli(&app, &["sandbox", "exec", &id, "--", "ls"]).await, 5);
    let e = fails_with(
        &cli(&app, &["sandbox", "exec", "not-an-id", "--", "ls"]).await,
        2,
    );
    assert!(e.contains("not a sandbox id"), "{e}");

    // The route says what is wrong with the body.
    for (body, status, needle) in [
        (json!({"runtime": "cobol"}), 422, "known: busybox:1"),
        (json!({"runtime": "shell", "agent": "x"}), 400, "not both"),
        (json!({}), 400, "not neither"),
    ] {
        let r = app.post_json("/v1/sandboxes", &body).await;
        assert_eq!(r.status(), status, "{body}");
        let text = r.text().await.expect("body");
        assert!(text.contains(needle), "{body}: {text}");
    }
    let e = fails_with(
        &cli(&app, &["sandbox", "create", "--runtime", "cobol"]).await,
        1,
    );
    assert!(e.contains("unknown_runtime"), "{e}");
}

#[tokio::test]
async fn keys_audit_and_the_exit_codes_of_auth_and_reachability() {
    let app = TestApp::spawn().await;
    let secret = ok(&cli(&app, &["keys", "create", "ci-reader", "--role", "readonly"]).await)
        .trim()
        .to_owned();
    assert!(secret.starts_with("aok_"), "{secret}");
    let keys = json_of(&ok(&cli(&app, &["keys", "list", "--json"]).await));
    assert!(
        keys.as_array()
            .into_iter()
            .flatten()
            .any(|k| k["name"] == "ci-reader"),
        "{keys}"
    );
    assert!(ok(&cli(&app, &["keys", "list"]).await).contains("ci-reader"));

    // The readonly key reads, but may not manage keys or make sandboxes: 4.
    ok(&cli_with(&app, Some(&secret), &["tools", "list"], None).await);
    let e = fails_with(
        &cli_with(&app, Some(&secret), &["keys", "list"], None).await,
        4,
    );
    assert!(e.contains("403"), "{e}");
    fails_with(
        &cli_with(
            &app,
            Some(&secret),
            &["sandbox", "create", "--runtime", "shell"],
            None,
        )
        .await,
        4,
    );
    ok(&cli(&app, &["keys", "revoke", "ci-reader"]).await);
    let e = fails_with(
        &cli_with(&app, Some(&secret), &["tools", "list"], None).await,
        4,
    );
    assert!(e.contains("revoked"), "{e}");
    fails_with(&cli(&app, &["keys", "revoke", "ci-reader"]).await, 5);

    // No key anywhere: 4, naming every place a key can come from.
    let e = fails_with(&cli_with(&app, None, &["agent", "list"], None).await, 4);
    assert!(
        e.contains("--key") && e.contains("ORCHESTRATOR_KEY") && e.contains("credentials"),
        "{e}"
    );

    // A credentials file: used at 0600, refused when others may read it.
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("credentials");
    std::fs::write(&file, format!("# test\nkey = {TEST_ADMIN_KEY}\n")).expect("write");
    let with_file = |mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).expect("chmod");
        let path = file.display().to_string();
        let app = &app;
        async move { cli_with(app, None, &["agent", "list", "--credentials", &path], None).await }
    };
    let e = fails_with(&with_file(0o644).await, 4);
    assert!(e.contains("chmod 600"), "{e}");
    assert!(ok(&with_file(0o600).await).contains("no agents deployed"));

    // Nobody listening: 3. A bad flag: 2 (clap).
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args([
            "tools",
            "list",
            "--url",
            "http://127.0.0.1:9",
            "--key",
            TEST_ADMIN_KEY,
        ])
        .output()
        .await
        .expect("runs");
    assert!(fails_with(&out, 3).contains("cannot reach the node"));
    fails_with(&cli(&app, &["tools", "list", "--no-such-flag"]).await, 2);

    // The audit log saw all of it, and its chain holds.
    let rows = json_of(&ok(&cli(
        &app,
        &["audit", "list", "--tool", "api_key.create", "--json"],
    )
    .await));
    assert_eq!(rows["rows"].as_array().map(Vec::len), Some(1), "{rows}");
    assert!(ok(&cli(&app, &["audit", "list"]).await).contains("api_key.revoke"));
    let verified = ok(&cli(&app, &["audit", "verify", "--full"]).await);
    assert!(verified.starts_with("audit chain intact"), "{verified}");
}

/// The fenced block after `<!-- example: NAME -->` in README.md (`readme::blocks` reads them
/// all, and fails on a block that is neither run nor says why not).
fn readme_example(readme: &str, name: &str) -> String {
    crate::readme::example(readme, name).body
}

/// Runs a README block with bash in the repository root, `orchestrator` being the built binary.
async fn run_block(app: &TestApp, block: &str) -> Output {
    let path = crate::readme::path_with_the_binary();
    let home = empty_home();
    tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", block])
        .current_dir(repo())
        .env("PATH", path)
        .env("ORCHESTRATOR_URL", &app.http_base)
        .env("ORCHESTRATOR_KEY", TEST_ADMIN_KEY)
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path())
        .env_remove("DATABASE_URL")
        .env_remove("ORCHESTRATOR_CONFIG")
        .output()
        .await
        .expect("bash runs")
}

#[tokio::test]
async fn the_readme_examples_run_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");

    // The first tool call in a sandbox.
    let (app, fake) = app_with_model(greeting("Ada")).await;
    let out = ok(&run_block(&app, &readme_example(&readme, "sandbox")).await);
    assert!(out.contains("first note"), "{out}");
    assert!(
        out.contains("\"exit_code\": 0") && out.contains("10 notes.txt"),
        "{out}"
    );

    // The first agent: deploy hello-world, run it with a (scripted) model: it runs `echo`.
    let out = ok(&run_block(&app, &readme_example(&readme, "agent")).await);
    assert!(out.contains("deployed agent hello-world"), "{out}");
    assert!(out.contains("stdout=Hello, Ada"), "{out}");
    assert_eq!(fake.remaining(), 0);

    // Without a model the same example fails, saying so and how to fix it, as the README shows.
    let bare = TestApp::spawn().await;
    let out = run_block(&bare, &readme_example(&readme, "agent")).await;
    let e = fails_with(&out, 1);
    let said = "no language model is configured on this node";
    assert!(
        e.contains(said) && e.contains("ORCHESTRATOR_CONFIG_FILE"),
        "{e}"
    );
    assert!(readme.contains(said), "the README shows the message");
    // As the node prints it: the README's text block starts the message with the same words.
    let printed = e
        .split("ended failed: ")
        .nth(1)
        .and_then(|m| m.split(" (its config").next())
        .unwrap_or_default();
    assert!(
        !printed.is_empty() && readme.contains(&format!("ended failed: {printed}")),
        "the README's expected text differs from what the node prints: {printed}"
    );
}

const GATE: &str = r#"apiVersion: 100monkeys.ai/v1
kind: Workflow
metadata: {name: gate, version: "1.0.0"}
spec:
  initial_state: BUILD
  states:
    BUILD:
      kind: ContainerRun
      name: build
      image: aegis-runtime/busybox:1
      command: ["echo", "built {{input.tag}}"]
      transitions: [{condition: on_success, target: APPROVE}]
    APPROVE:
      kind: Human
      prompt: "Ship {{trim BUILD.stdout}}?"
      timeout: 10m
      default_response: "no"
      transitions:
        - {condition: input_equals_yes, target: SHIP}
        - {condition: input_equals_no, target: STOP}
    SHIP: {kind: System, command: "echo shipping {{input.tag}}", transitions: []}
    STOP: {kind: System, command: "echo stopped", transitions: []}
"#;

#[tokio::test]
async fn workflows_deploy_run_signal_follow_and_cancel() {
    let db = TestDb::create().await;
    let mut config = common::test_config(&db.url);
    config.workflows.system_image = Some("aegis-runtime/busybox:1".to_owned());
    let mut app = TestApp::spawn_with(config).await;
    app.db = Some(db);

    let deployed = cli_with(
        &app,
        Some(TEST_ADMIN_KEY),
        &["workflow", "deploy", "-"],
        Some(GATE),
    )
    .await;
    assert!(ok(&deployed).starts_with("deployed workflow gate 1.0.0"));
    let listed = ok(&cli(&app, &["workflow", "list"]).await);
    assert!(
        listed.contains("SCOPE") && listed.contains("gate"),
        "{listed}"
    );

    let run_gate = |input: &'static str| {
        let app = &app;
        async move {
            let args = ["workflow", "run", "gate", "--input", input];
            ok(&cli(app, &args).await).trim().to_owned()
        }
    };
    let id = run_gate(r#"{"tag": "v1"}"#).await;
    // Waits in the Human state: a signal before then is refused (409, exit 1); poll the log.
    let mut waiting = false;
    for _ in 0..480 {
        let log = ok(&cli(&app, &["logs", &id]).await);
        if log.contains("human_input_requested [APPROVE]") {
            assert!(log.contains("Ship built v1?"), "{log}");
            waiting = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(waiting, "the execution never reached the Human state");
    ok(&cli(&app, &["workflow", "signal", &id, "--response", "yes"]).await);
    let followed = ok(&cli(&app, &["logs", &id, "--follow"]).await);
    assert!(followed.contains("[SHIP]"), "{followed}");
    let again = cli(&app, &["workflow", "signal", &id, "--response", "yes"]).await;
    assert!(fails_with(&again, 1).contains("409"));

    // A second run, cancelled while it waits: following it then ends with exit 1.
    let id = run_gate(r#"{"tag": "v2"}"#).await;
    ok(&cli(&app, &["workflow", "cancel", &id]).await);
    let e = fails_with(&cli(&app, &["logs", &id, "--follow"]).await, 1);
    assert!(e.contains("ended cancelled"), "{e}");
    ok(&cli(&app, &["workflow", "delete", "gate"]).await);
    fails_with(&cli(&app, &["workflow", "export", "gate"]).await, 5);
}

#[tokio::test]
async fn the_admin_key_file_is_generated_once_kept_and_printed() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("state").join("admin-key");
    let db = TestDb::create().await;
    let mut config = common::test_config(&db.url);
    config.auth.admin_key = None;
    config.auth.admin_key_file = Some(file.clone());
    let app = TestApp::spawn_with(config.clone()).await;
    let key = std::fs::read_to_string(&file).expect("the key file was written");
    let key = key.trim().to_owned();
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    ok(&cli_with(&app, Some(&key), &["keys", "list"], None).await);
    // The file works as a credentials file (a bare key, mode 0600), as compose uses it.
    let listed = cli_with(
        &app,
        None,
        &["keys", "list", "--credentials", &file.display().to_string()],
        None,
    )
    .await;
    assert!(ok(&listed).contains("bootstrap-admin"));
    app.stop().await.expect("stops");

    // A restart keeps the key; `admin-key` prints it from the node's configuration.
    let app = TestApp::spawn_with(config).await;
    ok(&cli_with(&app, Some(&key), &["keys", "list"], None).await);
    let printed = tokio::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .arg("admin-key")
        .env("ORCHESTRATOR__AUTH__ADMIN_KEY_FILE", &file)
        .env("ORCHESTRATOR_ADMIN_KEY", "")
        .env_remove("ORCHESTRATOR_CONFIG")
        .env_remove("DATABASE_URL")
        .output()
        .await
        .expect("runs");
    // Exactly the key and a newline, with no terminal: `KEY=$(... admin-key)` captures a key
    // that works. The README's commands run it without a terminal too (`exec -T`), which also
    // keeps a terminal's carriage return out of the capture.
    assert_eq!(ok(&printed), format!("{key}\n"));
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    for line in readme
        .lines()
        .filter(|l| l.contains("orchestrator admin-key"))
    {
        if line.contains("exec ") {
            assert!(
                line.contains("exec -T "),
                "README runs admin-key needing a terminal: {line}"
            );
        }
    }
    let missing = tokio::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .arg("admin-key")
        .env(
            "ORCHESTRATOR__AUTH__ADMIN_KEY_FILE",
            dir.path().join("none"),
        )
        .env_remove("ORCHESTRATOR_ADMIN_KEY")
        .env_remove("ORCHESTRATOR_CONFIG")
        .env_remove("DATABASE_URL")
        .output()
        .await
        .expect("runs");
    assert!(fails_with(&missing, 1).contains("writes it at its first start"));
    drop(app);
    drop(db);
}
