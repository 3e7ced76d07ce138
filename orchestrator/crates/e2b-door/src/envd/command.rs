//! A `process.Process/Start` request as the `cmd.run` it becomes: a `bash -c` line with the
//! request's `envs`, the sandbox's `envVars` and its `cwd` written into it (values quoted),
//! and the environment names that would change which code runs refused.

use std::collections::BTreeMap;

use aegis_e2b::connect::{Code, ConnectError};
use serde_json::{json, Value};

use super::{absolute, refuse};

/// Characters that make a command line need a shell (with them it runs under `bash -c`).
pub(super) const SHELL_SYNTAX: &str = "|&;<>()$`\\\"'*?[]#~=%{}!\n\r\t";

/// The `cmd.run` arguments of an E2B command. The SDK sends `/bin/bash -l -c <line>`, and
/// `/bin/bash -i -l` for a terminal. With `unwrap` (a key confined by a security context) a
/// line without shell syntax runs as its own argv, so the policy sees the real program and a
/// key confined to some programs may run them; its environment and directory then go to the
/// policy as `env_additions` and `cwd`. Anything else runs under `bash -c`, which the policy
/// allows only where `bash -c` is granted (every unbound key's E2B sandbox, where each line
/// runs so). Such a line may set its own environment and directory, so the door writes them
/// into the line (`export NAME='value'`, `cd -- 'dir'`) and the policy decides it as it
/// decides any line: nothing is granted that the line could not do itself. Names no caller may
/// ever set (`LD_PRELOAD`, `BASH_ENV`, ...) are refused either way. `sandbox_env` is the
/// sandbox's own environment (`envVars` at create); the command's variables win over it.
pub fn command_args(
    config: &aegis_e2b::envd::process::ProcessConfig,
    sandbox_env: &BTreeMap<String, String>,
    unwrap: bool,
) -> Result<Value, ConnectError> {
    let program = config.cmd.rsplit('/').next().unwrap_or_default().to_owned();
    if program.is_empty() {
        return Err(refuse(Code::InvalidArgument, "process.cmd is empty"));
    }
    let mut envs = sandbox_env.clone();
    envs.extend(config.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
    for (name, value) in &envs {
        check_env(name, value)?;
    }
    let cwd = config.cwd.as_deref().map(absolute).transpose()?;
    let shell = matches!(program.as_str(), "bash" | "sh");
    let mut args = config.args.clone();
    // A terminal's interactive shell (`bash -i -l`): a line under `bash -c`, never unwrapped.
    let terminal =
        shell && args.iter().any(|a| a == "-i") && args.iter().all(|a| a == "-i" || a == "-l");
    if terminal {
        args = vec!["-c".to_owned(), format!("exec {program} -i")];
    }
    let line = match args.as_slice() {
        [l, c, line] if shell && l == "-l" && c == "-c" => Some(line.clone()),
        [c, line] if shell && c == "-c" => Some(line.clone()),
        _ => None,
    };
    let plain = line.as_ref().filter(|l| {
        unwrap && !terminal && !l.trim().is_empty() && !l.chars().any(|c| SHELL_SYNTAX.contains(c))
    });
    let mut call = match (plain, line.as_ref()) {
        (Some(plain), _) => json!({"command": plain, "args": []}),
        (None, Some(line)) => {
            let mut script = String::new();
            for (name, value) in &envs {
                script.push_str(&format!("export {name}={}\n", sh_quote(value)));
            }
            if let Some(dir) = &cwd {
                script.push_str(&format!("cd -- {} || exit 1\n", sh_quote(dir)));
            }
            script.push_str(line);
            return Ok(json!({"command": program, "args": ["-c", script]}));
        }
        (None, None) => json!({"command": program, "args": args}),
    };
    if let Some(cwd) = cwd {
        call["cwd"] = json!(cwd);
    }
    if !envs.is_empty() {
        call["env_additions"] = json!(envs);
    }
    Ok(call)
}

/// Shell builtins and reserved words: a line starting with one runs under `bash -c`, where it
/// means what the caller wrote (most are no program at all; `echo`, `printf`, `kill` and `pwd`
/// differ from their programs in options). `true` and `false` are not here: their programs do
/// exactly what the builtins do.
const SHELL_WORDS: &str = ": . [ [[ ]] { } ! alias bg bind break builtin caller case cd command \
    compgen complete compopt continue coproc declare dirs disown do done echo elif else enable esac \
    eval exec exit export fc fg fi for function getopts hash help history if in jobs kill let local \
    logout mapfile popd printf pushd pwd read readarray readonly return select set shift shopt \
    source suspend test then time times trap type typeset ulimit umask unalias unset until wait while";

/// The line of a `Start` that needs no shell, for a key not bound to a context: the SDK's
/// `bash [-l] -c <line>` where the line is words without shell syntax, starts with a program
/// (not a builtin, [`SHELL_WORDS`]), and the request sets no environment and no directory
/// (those would go to the policy as `env_additions` and `cwd`, which an unbound key's policy
/// does not grant; under `bash -c` the line sets them itself). Such a line runs as its own
/// argv: the same program bash would `exec` for it, without starting bash first (a bash start
/// in a sandbox costs about as much as the node's whole `cmd.run`), and the audit row names the
/// real program. `None`: it runs under `bash -c` as [`command_args`] writes it. The caller
/// still asks the sandbox's policy (`CommandPolicy::argv`) and falls back to the shell when the
/// program is not found, so the caller sees bash's own answer (exit 127, "command not found").
pub fn direct_line(
    config: &aegis_e2b::envd::process::ProcessConfig,
    sandbox_env: &BTreeMap<String, String>,
) -> Option<String> {
    let program = config.cmd.rsplit('/').next().unwrap_or_default();
    if !matches!(program, "bash" | "sh") || config.cwd.is_some() {
        return None;
    }
    if !config.envs.is_empty() || !sandbox_env.is_empty() {
        return None;
    }
    let line = match config.args.as_slice() {
        [l, c, line] if l == "-l" && c == "-c" => line,
        [c, line] if c == "-c" => line,
        _ => return None,
    };
    let first = line.split(' ').find(|w| !w.is_empty())?;
    let builtin = SHELL_WORDS.split_whitespace().any(|w| w == first);
    if builtin || line.chars().any(|c| SHELL_SYNTAX.contains(c)) {
        return None;
    }
    Some(line.trim().to_owned())
}

/// Refuses a variable that is not a POSIX name, one no caller may set, or a value with a NUL.
pub(super) fn check_env(name: &str, value: &str) -> Result<(), ConnectError> {
    let mut bytes = name.bytes();
    let posix = matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !posix {
        return Err(refuse(
            Code::InvalidArgument,
            format!("environment variable {name:?} is not a name ([A-Za-z_][A-Za-z0-9_]*)"),
        ));
    }
    if aegis_policy::command::CommandPolicy::forbidden_env(name) {
        return Err(refuse(
            Code::PermissionDenied,
            format!(
                "environment variable `{name}` may never be set (it changes which code runs, or \
                 makes a program run another)"
            ),
        ));
    }
    if value.contains('\0') {
        return Err(refuse(
            Code::InvalidArgument,
            format!("environment variable `{name}` holds a NUL byte"),
        ));
    }
    Ok(())
}

/// `text` as one word of a shell line: single-quoted, each `'` written as `'\''`.
pub(super) fn sh_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aegis_e2b::envd::process::ProcessConfig;

    fn sdk(line: &str) -> ProcessConfig {
        ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), line.into()],
            envs: Default::default(),
            cwd: None,
        }
    }

    #[test]
    fn plain_lines_of_programs_need_no_shell() {
        let none = BTreeMap::new();
        assert_eq!(direct_line(&sdk("true"), &none).as_deref(), Some("true"));
        assert_eq!(
            direct_line(&sdk(" python3 app.py  --port 8000"), &none).as_deref(),
            Some("python3 app.py  --port 8000")
        );
        let mut sh = sdk("ls /home/user");
        sh.cmd = "sh".into();
        sh.args.remove(0);
        assert_eq!(direct_line(&sh, &none).as_deref(), Some("ls /home/user"));
    }

    #[test]
    fn builtins_syntax_environment_and_directories_keep_the_shell() {
        let none = BTreeMap::new();
        for line in [
            "cd /tmp",
            "echo hi",
            "pwd",
            "exit 3",
            "export A",
            "echo $HOME",
            "ls *.py",
            "a=1 env",
            "ls; ls",
            "",
            "   ",
        ] {
            assert_eq!(direct_line(&sdk(line), &none), None, "{line:?}");
        }
        let mut with_env = sdk("env");
        with_env.envs.insert("A".into(), "1".into());
        assert_eq!(direct_line(&with_env, &none), None);
        let sandbox_env = BTreeMap::from([("B".to_owned(), "2".to_owned())]);
        assert_eq!(direct_line(&sdk("env"), &sandbox_env), None);
        let mut with_cwd = sdk("ls");
        with_cwd.cwd = Some("/tmp".into());
        assert_eq!(direct_line(&with_cwd, &none), None);
        let mut python = sdk("true");
        python.cmd = "python3".into();
        assert_eq!(direct_line(&python, &none), None);
        let mut login = sdk("true");
        login.args = vec!["-i".into(), "-l".into()];
        assert_eq!(direct_line(&login, &none), None);
    }
}
