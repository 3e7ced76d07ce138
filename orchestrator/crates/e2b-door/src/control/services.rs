//! The server an E2B template needs, started when a sandbox of it is made: the runtime
//! registry's `start` command line (the code interpreter's server on port 49999 for
//! `code-interpreter-v1`), in the background, then its `ready` command line in the foreground;
//! the create answers once `ready` exits 0, as E2B hands out a template's sandbox with its
//! server already listening. Both are `cmd.run` calls through the router as the owner key, on
//! the sandbox's own policy, translated as an E2B command is ([`crate::envd::command_args`]):
//! the same decision, audit rows and kernel-held rules as any command, run as the sandbox user.

use std::collections::BTreeMap;

use aegis_core::caller::Caller;
use aegis_core::runtimes::Runtime;
use aegis_e2b::connect::ConnectError;
use aegis_e2b::envd::process::ProcessConfig;
use aegis_sandboxes::E2B_HOME;
use aegis_tools::state::AppState;
use dispatcher::SandboxId;
use serde_json::json;

use crate::envd::{call, command_args, Target};

/// Longest the `ready` command may take (the Python kernel starts in a few seconds; a loaded
/// node is slower).
const READY_TIMEOUT_SECS: u64 = 120;

/// Why a template's server did not come up.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The router refused or failed the `start` command.
    #[error("the template's server (`{line}`) could not start: {error}")]
    Start { line: String, error: String },
    /// The `ready` command failed or said no.
    #[error("the template's server did not become ready (`{line}`): {detail}")]
    NotReady { line: String, detail: String },
}

/// The runtime a template name stands for: E2B's own name of one (`code-interpreter-v1`), else
/// a runtime of the registry (`base`, `python:3.11`).
pub fn template_runtime(name: &str) -> Result<&'static Runtime, aegis_sandboxes::SandboxError> {
    Runtime::of_e2b_template(name).map_or_else(|| aegis_sandboxes::find_runtime(name), Ok)
}

/// Starts `runtime`'s server in sandbox `id` (nothing when it has none) and waits until it is
/// ready. `env` is the sandbox's `envVars`, which the server (and so every kernel) inherits.
pub async fn start(
    state: &AppState,
    caller: &Caller,
    id: SandboxId,
    env: &BTreeMap<String, String>,
    runtime: &Runtime,
) -> Result<(), ServiceError> {
    let Some(line) = runtime.start.as_deref() else {
        return Ok(());
    };
    let target = Target {
        id,
        caller: caller.clone(),
        env: env.clone(),
        // A template's server runs as the sandbox user (E2B's start command runs as `user`).
        user: dispatcher::protocol::RunAs::User,
    };
    let confined = caller.seal.is_some();
    let mut args = args_of(line, env, confined).map_err(|e| ServiceError::Start {
        line: line.to_owned(),
        error: e.to_string(),
    })?;
    args["background"] = json!(true);
    args["tag"] = json!("e2b-template-server");
    call(state, &target, "cmd.run", args)
        .await
        .map_err(|e| ServiceError::Start {
            line: line.to_owned(),
            error: e.to_string(),
        })?;
    let Some(ready) = runtime.ready.as_deref() else {
        return Ok(());
    };
    let not_ready = |detail: String| ServiceError::NotReady {
        line: ready.to_owned(),
        detail,
    };
    let mut args = args_of(ready, env, confined).map_err(|e| not_ready(e.to_string()))?;
    args["timeout_secs"] = json!(READY_TIMEOUT_SECS);
    let out = call(state, &target, "cmd.run", args)
        .await
        .map_err(|e| not_ready(e.to_string()))?;
    if out["exit_code"].as_i64() == Some(0) {
        Ok(())
    } else {
        Err(not_ready(format!(
            "exit code {}, stderr: {}",
            out["exit_code"],
            out["stderr"].as_str().unwrap_or("").trim()
        )))
    }
}

/// The `cmd.run` arguments of a registry command line, run from the sandbox user's home.
fn args_of(
    line: &str,
    env: &BTreeMap<String, String>,
    confined: bool,
) -> Result<serde_json::Value, ConnectError> {
    let config = ProcessConfig {
        cmd: "/bin/bash".to_owned(),
        args: vec!["-l".to_owned(), "-c".to_owned(), line.to_owned()],
        envs: Default::default(),
        cwd: Some(E2B_HOME.to_owned()),
    };
    command_args(&config, env, confined)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_interpreter_template_is_its_runtime_and_base_stays_a_runtime() {
        let ci = template_runtime("code-interpreter-v1").expect("mapped");
        assert_eq!(ci.language, "code-interpreter");
        assert_eq!(
            template_runtime("base").expect("a runtime").language,
            "base"
        );
        assert!(template_runtime("no-such-template").is_err());
    }

    #[test]
    fn a_start_line_runs_as_its_own_words_for_a_confined_key_and_under_bash_otherwise() {
        let env = BTreeMap::from([("A".to_owned(), "1".to_owned())]);
        let line = "python3 /opt/aegis/code-interpreter/server.py";
        let confined = args_of(line, &env, true).expect("args");
        assert_eq!(confined["command"], line);
        assert_eq!(confined["env_additions"]["A"], "1");
        let open = args_of(line, &env, false).expect("args");
        assert_eq!(open["command"], "bash");
        let script = open["args"][1].as_str().expect("a script");
        assert!(script.contains("export A='1'") && script.ends_with(line));
    }
}
