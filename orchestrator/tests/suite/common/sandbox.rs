//! An agent's sandbox through the real service, for tests that call sandbox tools.

use reqwest::Method;
use serde_json::{json, Value};

use super::TestApp;

const IMAGE: &str = "aegis-runtime/busybox:1";

/// An agent's sandbox made through `POST /v1/sandboxes`, and tool calls in it through
/// `POST /v1/tools/call` with the admin key.
#[derive(Clone)]
pub struct AgentSandbox {
    http: reqwest::Client,
    base: String,
    key: String,
    /// The sandbox id.
    pub id: String,
}

impl AgentSandbox {
    /// Deploys `manifest` (an agent on the busybox runtime) and makes its sandbox.
    pub async fn start(app: &TestApp, manifest: String) -> AgentSandbox {
        Self::start_on(app, manifest, IMAGE).await
    }

    /// Deploys `manifest` (an agent whose runtime is `image`) and makes its sandbox.
    pub async fn start_on(app: &TestApp, manifest: String, image: &str) -> AgentSandbox {
        assert!(
            !super::docker_lines(&["images", "-q", image]).is_empty(),
            "image {image} is missing: run runtime-images/build.sh (scripts/test.sh does)"
        );
        let name = manifest
            .lines()
            .find_map(|l| l.trim().strip_prefix("name: "))
            .unwrap_or_default()
            .to_owned();
        app.deployed("/v1/agents", &manifest).await;
        let (status, body) = app
            .send(Method::POST, "/v1/sandboxes", Some(json!({"agent": name})))
            .await;
        assert_eq!(status, 201, "{body}");
        Self::of(app, body["sandbox_id"].as_str().unwrap())
    }

    /// The sandbox `id` (made earlier, possibly through another instance), reached through `app`.
    pub fn of(app: &TestApp, id: &str) -> AgentSandbox {
        AgentSandbox {
            http: reqwest::Client::new(),
            base: app.http_base.clone(),
            key: super::TEST_ADMIN_KEY.to_owned(),
            id: id.to_owned(),
        }
    }

    /// A sandbox `id` whose tool calls are made with `key` instead of the admin key.
    pub fn with_key(app: &TestApp, id: &str, key: &str) -> AgentSandbox {
        AgentSandbox {
            key: key.to_owned(),
            ..Self::of(app, id)
        }
    }

    /// One tool call in the sandbox: (HTTP status, body).
    pub async fn call(&self, name: &str, arguments: Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}/v1/tools/call", self.base))
            .bearer_auth(&self.key)
            .json(&json!({"name": name, "arguments": arguments, "sandbox_id": self.id}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    /// A call that must succeed; its `structuredContent`.
    pub async fn ok(&self, name: &str, arguments: Value) -> Value {
        let (status, out) = self.call(name, arguments.clone()).await;
        assert_eq!(status, 200, "{name} {arguments}: {out}");
        assert_eq!(out["isError"], false, "{name} {arguments}: {out}");
        out["structuredContent"].clone()
    }

    /// A call the router must refuse with `status` and `code`; the refusal.
    pub async fn refused(&self, name: &str, arguments: Value, status: u16, code: &str) -> Value {
        let (got, out) = self.call(name, arguments.clone()).await;
        assert_eq!(got, status, "{name} {arguments}: {out}");
        assert_eq!(out["code"], code, "{name} {arguments}: {out}");
        out
    }

    /// [`AgentSandbox::refused`] for each of `calls`: (tool, arguments, status, code).
    pub async fn refuses_each(&self, calls: Vec<(&str, Value, u16, &str)>) {
        for (name, arguments, status, code) in calls {
            self.refused(name, arguments, status, code).await;
        }
    }

    /// A call whose tool must fail with `code`.
    pub async fn tool_error(&self, name: &str, arguments: Value, code: &str) -> Value {
        let (status, out) = self.call(name, arguments.clone()).await;
        assert_eq!(status, 200, "{name} {arguments}: {out}");
        assert_eq!(out["isError"], true, "{name} {arguments}: {out}");
        assert_eq!(
            out["structuredContent"]["error"]["code"], code,
            "{name} {arguments}: {out}"
        );
        out
    }

    /// [`AgentSandbox::tool_error`] for each of `calls`: (tool, arguments, code).
    pub async fn tool_errors_each(&self, calls: Vec<(&str, Value, &str)>) {
        for (name, arguments, code) in calls {
            self.tool_error(name, arguments, code).await;
        }
    }

    /// Starts `cat` in the background with a stdin pipe, tagged `echoer`: it prints back what
    /// it is sent. The start's answer (with its `pid`).
    pub async fn start_echoer(&self) -> Value {
        let cat = json!({"command": "cat", "background": true, "stdin": true, "tag": "echoer"});
        self.ok("cmd.run", cat).await
    }

    /// Sends the echoer ([`AgentSandbox::start_echoer`], process `pid`) its last line, `bye`,
    /// and closes its input: it must print that and end with exit code 0. Its end.
    pub async fn end_echoer(&self, pid: u64) -> Value {
        let last = json!({"pid": pid, "data": "bye\n", "close": true});
        self.ok("proc.input", last).await;
        let (rest, ended) = self
            .read_to_end(json!({"tag": "echoer"}), std::time::Duration::from_secs(20))
            .await;
        assert_eq!(rest, "bye\n");
        assert_eq!(ended["exit_code"], 0, "{ended}");
        ended
    }

    /// Reads a process's output (`target` names it: `pid` or `tag`) until it ended, or fails the
    /// test once `within` passed: what came (stdout and terminal output), and its end.
    pub async fn read_to_end(&self, target: Value, within: std::time::Duration) -> (String, Value) {
        let deadline = std::time::Instant::now() + within;
        let mut text = String::new();
        loop {
            let mut args = target.clone();
            args["wait_ms"] = json!(500);
            let out = self.ok("proc.output", args).await;
            text.push_str(out["stdout"].as_str().unwrap_or_default());
            text.push_str(out["pty"].as_str().unwrap_or_default());
            if !out["ended"].is_null() {
                return (text, out["ended"].clone());
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never ended; so far: {text:?}"
            );
        }
    }

    /// The sandbox's container name.
    pub fn container(&self) -> String {
        format!("aegis-sbx-{}", self.id)
    }

    /// `docker inspect -f format` of the sandbox's container, trimmed.
    pub fn inspect(&self, format: &str) -> String {
        let out = std::process::Command::new("docker")
            .args(["inspect", "-f", format, &self.container()])
            .output()
            .expect("the docker CLI runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Runs `argv` in the sandbox's container with `docker exec` as the sandbox user (what agent
    /// code could do), for set-ups and checks from inside: (exit code, stdout).
    pub fn inside(&self, argv: &[&str]) -> (i32, String) {
        let container = self.container();
        let mut args = vec!["exec", "-u", "65534:65534", container.as_str()];
        args.extend_from_slice(argv);
        let out = std::process::Command::new("docker")
            .args(&args)
            .output()
            .expect("docker exec runs");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }
}
