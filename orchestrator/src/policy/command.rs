//! `cmd.run` policy: from a command line to an argv the sandbox may run, or a refusal that says why.
//!
//! There is no shell anywhere on this path. The command is split into words with POSIX quoting
//! rules and nothing is expanded. Shell metacharacters are refused by default so an agent that
//! expects a shell learns at once that it has none. `argv[0]` must be a bare program name on the
//! subcommand allowlist; an entry of several words (`git status`) pins the leading arguments.
//!
//! Allowed programs can still run other code through some of their options (`find -exec`,
//! `python3 -c`, `git -c core.pager=...`, `tar --to-command`). Those options are refused unless an
//! allowlist entry names the program together with that option (`python3 -c`), which makes the
//! grant explicit. Programs whose whole purpose is to run another program (`env`, `xargs`,
//! `timeout`, `nice`, `sh`, `busybox`, ...) are only runnable when listed themselves, which the
//! allowlist rule already ensures. The container remains the security boundary either way.

/// Characters a shell would interpret. Refused in `command` unless the capability allows them.
pub const METACHARACTERS: &[char] = &[';', '|', '&', '$', '`', '<', '>', '(', ')', '\n', '\r'];

/// Environment names never accepted from a caller, even when allowlisted: they change which code
/// runs (`LD_PRELOAD`, `PATH`) rather than what it does.
const FORBIDDEN_ENV: &[&str] = &[
    "PATH",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "IFS",
    "BASH_ENV",
    "ENV",
    "PYTHONSTARTUP",
    "NODE_OPTIONS",
    "PERL5OPT",
    "GIT_CONFIG_PARAMETERS",
];

/// Options that make an allowed program execute code of the caller's choosing.
const CODE_OPTIONS: &[(&[&str], &[&str])] = &[
    (&["python", "python3", "python3.11"], &["-c"]),
    (&["perl"], &["-e", "-E"]),
    (&["ruby"], &["-e"]),
    (&["node", "nodejs"], &["-e", "--eval", "-p", "--print"]),
    (&["sh", "bash", "dash", "ash", "zsh", "ksh"], &["-c"]),
    (
        &["find"],
        &[
            "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fprintf", "-fls", "-delete",
        ],
    ),
    (
        &["git"],
        &[
            "-c",
            "--config-env",
            "--exec-path",
            "-C",
            "--upload-pack",
            "--receive-pack",
            "--git-dir",
            "--work-tree",
        ],
    ),
    (
        &["tar"],
        &[
            "--to-command",
            "--use-compress-program",
            "-I",
            "--checkpoint-action",
            "--info-script",
            "--new-volume-script",
            "-F",
        ],
    ),
    (&["rsync"], &["-e", "--rsh"]),
    (&["awk", "gawk", "mawk"], &["-f", "--file"]),
    (&["sed"], &["-f", "--file"]),
];

/// A refusal, with a stable code and a message that names the offending part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CommandRefusal {
    /// `metacharacter`, `parse`, `not_bare`, `not_allowlisted`, `code_option`, `env_not_allowed`, `empty`.
    pub code: &'static str,
    /// Explanation for the caller (and the model).
    pub message: String,
}

fn refuse(code: &'static str, message: String) -> CommandRefusal {
    CommandRefusal { code, message }
}

/// What the manifest (and security context) allow for `cmd.run`.
#[derive(Debug, Clone, Default)]
pub struct CommandPolicy {
    /// Allowlist entries, each one or more words.
    pub subcommand_allowlist: Vec<String>,
    /// Pass metacharacters through as literal bytes instead of refusing them.
    pub allow_metacharacters: bool,
    /// Environment variable names a caller may set.
    pub env_allowlist: Vec<String>,
    /// Any bare program name passes the allowlist step (a SEAL context that grants `cmd.run`
    /// without a `command_allowlist`); metacharacters and code-running options still apply.
    pub any_program: bool,
}

impl CommandPolicy {
    /// Splits `command`, appends `args`, and checks the result; returns the argv to run.
    pub fn argv(&self, command: &str, args: &[String]) -> Result<Vec<String>, CommandRefusal> {
        if command.contains('\0') || args.iter().any(|a| a.contains('\0')) {
            return Err(refuse("parse", "the command contains a NUL byte".into()));
        }
        if !self.allow_metacharacters {
            if let Some((pos, c)) = command
                .char_indices()
                .find(|(_, c)| METACHARACTERS.contains(c))
            {
                let shown = match c {
                    '\n' => "\\n".to_owned(),
                    '\r' => "\\r".to_owned(),
                    c => c.to_string(),
                };
                return Err(refuse(
                    "metacharacter",
                    format!(
                        "cmd.run runs no shell: `{shown}` at byte {pos} would need one (pipes, \
                         redirection, chaining and substitution are not available; run one program \
                         per call, or ask for allow_metacharacters to pass such bytes literally)"
                    ),
                ));
            }
        }
        let mut argv = shell_words::split(command)
            .map_err(|e| refuse("parse", format!("cannot split the command into words: {e}")))?;
        argv.extend(args.iter().cloned());
        let Some(program) = argv.first() else {
            return Err(refuse("empty", "the command is empty".into()));
        };
        if program.is_empty() || program.contains('/') {
            return Err(refuse(
                "not_bare",
                format!("`{program}` is not a bare program name; give the name only (it is looked up in the sandbox's PATH)"),
            ));
        }
        let entries: Vec<Vec<String>> = self
            .subcommand_allowlist
            .iter()
            .filter_map(|e| shell_words::split(e).ok())
            .filter(|e| !e.is_empty())
            .collect();
        let matches =
            |entry: &Vec<String>| argv.len() >= entry.len() && argv[..entry.len()] == entry[..];
        if !self.any_program && !entries.iter().any(matches) {
            let listed: Vec<&str> = self
                .subcommand_allowlist
                .iter()
                .map(String::as_str)
                .collect();
            return Err(refuse(
                "not_allowlisted",
                format!(
                    "`{}` is not on the subcommand allowlist ({})",
                    argv.iter().take(2).cloned().collect::<Vec<_>>().join(" "),
                    if listed.is_empty() {
                        "empty".to_owned()
                    } else {
                        listed.join(", ")
                    }
                ),
            ));
        }
        if let Some(option) = code_option(&argv) {
            let pinned = entries
                .iter()
                .any(|e| e.len() >= 2 && e[0] == *program && e[1..].iter().any(|w| w == option));
            if !pinned {
                return Err(refuse(
                    "code_option",
                    format!(
                        "`{program} {option}` would run code chosen by the caller; it is allowed only \
                         when the allowlist names `{program} {option}` explicitly"
                    ),
                ));
            }
        }
        Ok(argv)
    }

    /// Checks caller-supplied environment names against the allowlist.
    pub fn env<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Result<(), CommandRefusal> {
        for name in names {
            if FORBIDDEN_ENV.contains(&name) || name.starts_with("LD_") {
                return Err(refuse(
                    "env_not_allowed",
                    format!("environment variable `{name}` may never be set by a caller (it changes which code runs)"),
                ));
            }
            if !self.env_allowlist.iter().any(|n| n == name) {
                return Err(refuse(
                    "env_not_allowed",
                    format!("environment variable `{name}` is not on the env_allowlist"),
                ));
            }
        }
        Ok(())
    }
}

/// The first argument that is a code-running option of `argv[0]`, if any.
fn code_option(argv: &[String]) -> Option<&'static str> {
    let program = argv.first()?;
    let (_, options) = CODE_OPTIONS
        .iter()
        .find(|(names, _)| names.contains(&program.as_str()))?;
    for arg in &argv[1..] {
        for option in options.iter() {
            if arg == option || (option.starts_with("--") && arg.starts_with(&format!("{option}=")))
            {
                return Some(option);
            }
            // Clustered short options (`-lec`, `-Ifoo`): a single-dash word containing the letter.
            if option.len() == 2
                && !option.starts_with("--")
                && arg.starts_with('-')
                && !arg.starts_with("--")
            {
                let letter = &option[1..];
                if program != "find" && program != "git" && arg[1..].contains(letter) {
                    return Some(option);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(list: &[&str]) -> CommandPolicy {
        CommandPolicy {
            subcommand_allowlist: list.iter().map(|s| s.to_string()).collect(),
            allow_metacharacters: false,
            env_allowlist: vec!["LANG".into()],
            any_program: false,
        }
    }

    #[test]
    fn splits_with_quotes_and_appends_args_verbatim() {
        let p = policy(&["echo"]);
        let argv = p
            .argv("echo 'a b' \"c d\" e\\ f", &["$HOME".into()])
            .unwrap();
        assert_eq!(argv, ["echo", "a b", "c d", "e f", "$HOME"]);
    }

    #[test]
    fn refuses_every_metacharacter_unless_allowed() {
        let p = policy(&["echo"]);
        for cmd in [
            "echo a; id",
            "echo a | id",
            "echo a && id",
            "echo $(id)",
            "echo `id`",
            "echo > /tmp/x",
            "echo < x",
            "echo (a)",
            "echo a\nid",
        ] {
            let e = p.argv(cmd, &[]).unwrap_err();
            assert_eq!(e.code, "metacharacter", "{cmd}");
            assert!(e.message.contains("no shell"), "{cmd}");
        }
        let literal = CommandPolicy {
            allow_metacharacters: true,
            ..p
        };
        assert_eq!(
            literal.argv("echo 'a;b' '$x'", &[]).unwrap(),
            ["echo", "a;b", "$x"]
        );
    }

    #[test]
    fn program_must_be_bare_and_listed() {
        let p = policy(&["ls", "git status"]);
        assert_eq!(p.argv("/bin/ls", &[]).unwrap_err().code, "not_bare");
        assert_eq!(p.argv("./ls", &[]).unwrap_err().code, "not_bare");
        assert_eq!(
            p.argv("cat /etc/passwd", &[]).unwrap_err().code,
            "not_allowlisted"
        );
        assert!(p.argv("git status --short", &[]).is_ok());
        assert_eq!(p.argv("git push", &[]).unwrap_err().code, "not_allowlisted");
        assert_eq!(
            p.argv("git -c core.pager=id status", &[]).unwrap_err().code,
            "not_allowlisted"
        );
        assert_eq!(
            policy(&[]).argv("ls", &[]).unwrap_err().code,
            "not_allowlisted"
        );
    }

    #[test]
    fn wrappers_run_only_when_listed_themselves() {
        let p = policy(&["ls", "echo"]);
        for cmd in [
            "env ls",
            "xargs ls",
            "timeout 5 ls",
            "nice ls",
            "sh -c ls",
            "busybox sh",
            "bash -c 'ls'",
        ] {
            assert_eq!(
                p.argv(cmd, &[]).unwrap_err().code,
                "not_allowlisted",
                "{cmd}"
            );
        }
    }

    #[test]
    fn code_running_options_need_an_explicit_entry() {
        let p = policy(&["find", "git", "python3", "perl", "tar", "sh"]);
        for cmd in [
            "find . -exec id ;",
            "git -c core.pager=id log",
            "git --upload-pack=id fetch",
            "python3 -c 'import os'",
            "perl -le 'print 1'",
            "tar -xf a --to-command=id",
            "sh -c id",
        ] {
            let literal = CommandPolicy {
                allow_metacharacters: true,
                ..p.clone()
            };
            assert_eq!(
                literal.argv(cmd, &[]).unwrap_err().code,
                "code_option",
                "{cmd}"
            );
        }
        assert!(p.argv("find . -name x", &[]).is_ok());
        assert!(p.argv("python3 script.py", &[]).is_ok());
        let granted = policy(&["python3", "python3 -c"]);
        assert!(granted.argv("python3 -c 'import this'", &[]).is_ok());
    }

    #[test]
    fn environment_names_are_checked() {
        let p = policy(&["ls"]);
        assert!(p.env(["LANG"]).is_ok());
        assert_eq!(p.env(["LD_PRELOAD"]).unwrap_err().code, "env_not_allowed");
        assert_eq!(p.env(["PATH"]).unwrap_err().code, "env_not_allowed");
        assert_eq!(p.env(["SECRET"]).unwrap_err().code, "env_not_allowed");
        let lax = CommandPolicy {
            env_allowlist: vec!["PATH".into(), "LD_PRELOAD".into()],
            ..p
        };
        assert!(
            lax.env(["PATH"]).is_err() && lax.env(["LD_PRELOAD"]).is_err(),
            "never, even when listed"
        );
    }
}
