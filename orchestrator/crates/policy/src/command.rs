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
/// runs (`LD_PRELOAD`, `PATH`) or configure a program to run another (`GIT_SSH_COMMAND`,
/// `PAGER`, `TAR_OPTIONS`) rather than change what it does.
const FORBIDDEN_ENV: &[&str] = &[
    "PATH",
    "IFS",
    "ENV",
    "BASH_ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "SHELL",
    "PAGER",
    "MANPAGER",
    "EDITOR",
    "VISUAL",
    "BROWSER",
    "LESSOPEN",
    "LESSCLOSE",
    "TAR_OPTIONS",
    "GZIP",
    "XZ_OPT",
    "ZSTD_CLEVEL",
    "GCONV_PATH",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "RESOLV_HOST_CONF",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONWARNINGS",
    "PYTHONBREAKPOINT",
    "PYTHONINSPECT",
    "PYTHONEXECUTABLE",
    "PYTHONUSERBASE",
    "PYTHONPLATLIBDIR",
    "PERL5LIB",
    "PERLLIB",
    "PERL5OPT",
    "PERL5DB",
    "RUBYOPT",
    "RUBYLIB",
    "NODE_OPTIONS",
    "NODE_PATH",
    "GIT_CONFIG",
    "GIT_CONFIG_COUNT",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_CONFIG_NOSYSTEM",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_PAGER",
    "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR",
    "GIT_ASKPASS",
    "SSH_ASKPASS",
    "GIT_EXTERNAL_DIFF",
    "GIT_EXEC_PATH",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_TEMPLATE_DIR",
    "GIT_PROXY_COMMAND",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
];

/// Prefixes of environment names refused like [`FORBIDDEN_ENV`]: the dynamic loader's, bash's
/// exported functions, git's numbered config entries (`GIT_CONFIG_KEY_0`, `GIT_CONFIG_VALUE_0`).
const FORBIDDEN_ENV_PREFIXES: &[&str] = &["LD_", "BASH_FUNC_", "GIT_CONFIG_"];

/// How a program's refused options are written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Syntax {
    /// GNU getopt: `-x` (clustered, value attached or next), `--long[=value]` and any unambiguous
    /// abbreviation of a long option (`--use-compress-prog`).
    Getopt,
    /// Like [`Syntax::Getopt`], and the first argument may be a cluster of option letters
    /// without a dash (`tar cIf prog a.tar`).
    GetoptDashlessFirst,
    /// Whole words only (`find -exec`).
    Words,
}

/// Options that make an allowed program execute code of the caller's choosing, or write where the
/// caller says (the kernel refuses such writes anyway; refusing here gives a clear message).
fn code_options(program: &str) -> Option<(Syntax, &'static [&'static str])> {
    let is_python = program == "python"
        || program.starts_with("python2")
        || program.starts_with("python3")
        || program.starts_with("pypy");
    Some(match program {
        _ if is_python => (Syntax::Getopt, &["-c", "-m"]),
        "perl" => (Syntax::Getopt, &["-e", "-E", "-M", "-m", "-d"]),
        "ruby" => (Syntax::Getopt, &["-e", "-r"]),
        "node" | "nodejs" => (
            Syntax::Getopt,
            &[
                "-e",
                "--eval",
                "-p",
                "--print",
                "-r",
                "--require",
                "--import",
                "--loader",
                "--experimental-loader",
            ],
        ),
        "sh" | "bash" | "dash" | "ash" | "zsh" | "ksh" | "mksh" => (Syntax::Getopt, &["-c"]),
        "find" => (
            Syntax::Words,
            &[
                "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fprint0", "-fprintf", "-fls",
                "-delete",
            ],
        ),
        "tar" => (
            Syntax::GetoptDashlessFirst,
            &[
                "--to-command",
                "--use-compress-program",
                "-I",
                "--checkpoint-action",
                "--info-script",
                "--new-volume-script",
                "-F",
                "--rsh-command",
                "--rmt-command",
            ],
        ),
        "sort" => (Syntax::Getopt, &["--compress-program", "-o", "--output"]),
        "split" => (Syntax::Getopt, &["--filter"]),
        "rsync" => (Syntax::Getopt, &["-e", "--rsh", "--rsync-path"]),
        "awk" | "gawk" | "mawk" => (Syntax::Getopt, &["-f", "--file"]),
        "sed" => (Syntax::Getopt, &["-f", "--file"]),
        "zip" => (Syntax::Getopt, &["-TT", "--unzip-command"]),
        "ssh" | "scp" | "sftp" => (Syntax::Getopt, &["-o", "-F", "-S"]),
        "wget" => (Syntax::Getopt, &["-e", "--execute", "--use-askpass"]),
        // Options of git subcommands; options before the subcommand are handled on their own.
        "git" => (
            Syntax::Getopt,
            &[
                "--upload-pack",
                "--receive-pack",
                "--exec",
                "--open-files-in-pager",
                "-O",
                "--config",
                "--template",
                "--ext-diff",
            ],
        ),
        _ => return None,
    })
}

/// Options git accepts before its subcommand that change nothing about what runs; every other
/// one (`-c`, `-C`, `--git-dir`, `--exec-path`, `-p`, `--config-env`, ...) is refused.
const GIT_SAFE_GLOBAL_OPTIONS: &[&str] = &[
    "--no-pager",
    "-P",
    "--no-replace-objects",
    "--literal-pathspecs",
    "--glob-pathspecs",
    "--noglob-pathspecs",
    "--icase-pathspecs",
    "--no-optional-locks",
    "--no-advice",
];

/// Git subcommands whose `-u` names the program run on the other end (`--upload-pack`).
const GIT_UPLOAD_PACK_SHORT: &[&str] = &["clone", "fetch", "pull", "ls-remote", "archive"];

/// A refusal, with a stable code and a message that names the offending part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CommandRefusal {
    /// `metacharacter`, `parse`, `not_bare`, `not_allowlisted`, `code_option`, `loader`,
    /// `env_not_allowed`, `empty`.
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
        if let Some(arg) = argv.iter().find(|a| names_a_loader(a)) {
            return Err(refuse(
                "loader",
                format!(
                    "`{arg}` names the dynamic loader, which runs any file it is given; it is \
                     never allowed as a program or an argument"
                ),
            ));
        }
        if let Some(option) = code_option(&argv) {
            let pinned = entries
                .iter()
                .any(|e| e.len() >= 2 && e[0] == *program && e[1..].contains(&option));
            if !pinned {
                return Err(refuse(
                    "code_option",
                    format!(
                        "`{program} {option}` would run code chosen by the caller (or write where \
                         the caller says); it is allowed only when the allowlist names \
                         `{program} {option}` explicitly"
                    ),
                ));
            }
        }
        Ok(argv)
    }

    /// The programs this policy lets a command execute, for the kernel-held rules in the
    /// sandbox: the first word of every allowlist entry; `None` when any program may run.
    pub fn programs(&self) -> Option<Vec<String>> {
        if self.any_program {
            return None;
        }
        let mut programs: Vec<String> = Vec::new();
        for entry in &self.subcommand_allowlist {
            if let Some(first) = shell_words::split(entry)
                .ok()
                .and_then(|words| words.into_iter().next())
            {
                if !first.is_empty() && !first.contains('/') && !programs.contains(&first) {
                    programs.push(first);
                }
            }
        }
        Some(programs)
    }

    /// True for names no one may set: they change which code runs, or make a program run
    /// another (`LD_PRELOAD`, `BASH_ENV`, ...). The manifest's `spec.env` is held to it too.
    pub fn forbidden_env(name: &str) -> bool {
        FORBIDDEN_ENV.contains(&name) || FORBIDDEN_ENV_PREFIXES.iter().any(|p| name.starts_with(p))
    }

    /// Checks caller-supplied environment names against the allowlist.
    pub fn env<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Result<(), CommandRefusal> {
        for name in names {
            if Self::forbidden_env(name) {
                return Err(refuse(
                    "env_not_allowed",
                    format!(
                        "environment variable `{name}` may never be set by a caller (it changes \
                         which code runs, or makes a program run another)"
                    ),
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

/// True when some piece of `arg` (split at `=`, `,`, `:` and spaces) has a dynamic loader's
/// file name (`ld-linux-x86-64.so.2`, `/lib/ld-musl-x86_64.so.1`, `ld.so`).
pub fn names_a_loader(arg: &str) -> bool {
    arg.split(['=', ',', ':', ' ', '\t'])
        .map(|piece| piece.rsplit('/').next().unwrap_or(piece))
        .any(|name| {
            name.starts_with("ld-linux")
                || name.starts_with("ld-musl")
                || name == "ld.so"
                || name.starts_with("ld.so.")
                || name.starts_with("ld64.so")
        })
}

/// The first code-running option of `argv[0]` found in `argv`, as the rule names it.
fn code_option(argv: &[String]) -> Option<String> {
    let program = argv.first()?.as_str();
    let mut args = &argv[1..];
    if program == "git" {
        let (global, rest) = git_global_options(args);
        if let Some(option) = global {
            return Some(option.to_owned());
        }
        args = rest;
        let subcommand = args.first().map(String::as_str).unwrap_or_default();
        if GIT_UPLOAD_PACK_SHORT.contains(&subcommand)
            && args[1..]
                .iter()
                .any(|a| a == "-u" || (a.starts_with("-u") && !a.starts_with("--")))
        {
            return Some("--upload-pack".to_owned());
        }
    }
    let (syntax, options) = code_options(program)?;
    for (index, arg) in args.iter().enumerate() {
        let dashless_cluster =
            syntax == Syntax::GetoptDashlessFirst && index == 0 && !arg.starts_with('-');
        for option in options {
            let hit = match syntax {
                Syntax::Words => arg == option,
                Syntax::Getopt | Syntax::GetoptDashlessFirst => {
                    getopt_matches(arg, option, dashless_cluster)
                }
            };
            if hit {
                return Some((*option).to_owned());
            }
        }
    }
    None
}

/// Does `arg` use the getopt option `option` (`-x` or `--long`)?
fn getopt_matches(arg: &str, option: &str, dashless_cluster: bool) -> bool {
    if let Some(long) = option.strip_prefix("--") {
        let Some(given) = arg.strip_prefix("--") else {
            return false;
        };
        let name = given.split('=').next().unwrap_or_default();
        // The option itself, or any abbreviation getopt_long would take for it.
        return !name.is_empty() && long.starts_with(name);
    }
    let letters = &option[1..];
    if letters.len() > 1 {
        // A multi-letter single-dash option (`zip -TT`): the word itself, or with a value.
        return arg == option || arg.starts_with(option);
    }
    if dashless_cluster {
        return arg.contains(letters);
    }
    // Short options cluster (`-lec`, `-Ifoo`): a single-dash word containing the letter.
    arg.starts_with('-') && !arg.starts_with("--") && arg[1..].contains(letters)
}

/// Git's options before the subcommand: the first one that is not harmless, and the rest of argv
/// from the subcommand on.
fn git_global_options(args: &[String]) -> (Option<&str>, &[String]) {
    for (index, arg) in args.iter().enumerate() {
        if !arg.starts_with('-') {
            return (None, &args[index..]);
        }
        if !GIT_SAFE_GLOBAL_OPTIONS.contains(&arg.as_str()) {
            let name = arg.split('=').next().unwrap_or_default();
            return (Some(name), &args[index..]);
        }
    }
    (None, &[])
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

    #[test]
    fn review_gaps_are_refused() {
        let p = CommandPolicy {
            allow_metacharacters: true,
            ..policy(&[
                "tar",
                "sort",
                "find",
                "python3",
                "git",
                "git status",
                "split",
                "ls",
            ])
        };
        for cmd in [
            // GNU long-option abbreviations and values attached.
            "tar -cf a.tar --checkpoint=1 --checkpoint-act=exec=id x",
            "tar -cf a.tar --use-compress-prog=id x",
            "tar --to-comm=id -xf a.tar",
            // Option letters without a dash.
            "tar cIf id a.tar x",
            "tar xFf id a.tar",
            // sort runs a compressor and writes where -o says.
            "sort --compress-program=id big",
            "sort --compress-prog id big",
            "sort -o /etc/passwd x",
            "sort -uo out x",
            "sort --output=out x",
            // find writes and runs.
            "find . -fprint0 out",
            "find . -fls out",
            "find . -execdir id ;",
            "find . -okdir id ;",
            // python runs modules.
            "python3 -m http.server",
            "python3 -Im pip",
            // git options before the subcommand, and subcommand options that run programs.
            "git -p status",
            "git --paginate log",
            "git --exec-path=/tmp status",
            "git -C /etc status",
            "git --git-dir=/x log",
            "git fetch -u id origin",
            "git grep -Oid x",
            "git diff --ext-diff",
            "split --filter=id big",
        ] {
            assert_eq!(p.argv(cmd, &[]).unwrap_err().code, "code_option", "{cmd}");
        }
        for cmd in [
            "tar xzf a.tar",
            "tar -tvf a.tar",
            "tar --to-stdout -xf a.tar",
            "sort -n x",
            "find . -name '*.rs' -print",
            "git --no-pager log",
            "git status --short",
            "git add -u",
            "python3 script.py",
        ] {
            assert!(p.argv(cmd, &[]).is_ok(), "{cmd}");
        }
        // The loader is refused wherever it is named.
        for cmd in [
            "ls /lib64/ld-linux-x86-64.so.2",
            "tar -cf a.tar --use=/lib/ld-musl-x86_64.so.1",
            "find . -name ld.so",
        ] {
            assert_eq!(p.argv(cmd, &[]).unwrap_err().code, "loader", "{cmd}");
        }
        assert_eq!(
            policy(&["ld-linux-x86-64.so.2"])
                .argv("ld-linux-x86-64.so.2 /bin/sh", &[])
                .unwrap_err()
                .code,
            "loader"
        );
        // An explicit entry still grants an option, abbreviated or not.
        let granted = policy(&["sort", "sort -o"]);
        assert!(granted.argv("sort -o out x", &[]).is_ok());
    }

    #[test]
    fn environment_that_configures_programs_is_refused() {
        let lax = CommandPolicy {
            env_allowlist: [
                "GIT_CONFIG_COUNT",
                "GIT_CONFIG_KEY_0",
                "GIT_CONFIG_VALUE_0",
                "GIT_SSH_COMMAND",
                "PAGER",
                "PYTHONPATH",
                "PYTHONWARNINGS",
                "PERL5LIB",
                "RUBYOPT",
                "GCONV_PATH",
                "SHELLOPTS",
                "PS4",
                "TAR_OPTIONS",
                "BASH_FUNC_ls%%",
                "GIT_AUTHOR_NAME",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            ..policy(&["git"])
        };
        for name in &lax.env_allowlist {
            let verdict = lax.env([name.as_str()]);
            if name == "GIT_AUTHOR_NAME" {
                assert!(verdict.is_ok(), "{name}");
            } else {
                assert_eq!(verdict.unwrap_err().code, "env_not_allowed", "{name}");
            }
        }
    }

    #[test]
    fn programs_for_the_kernel_are_the_entries_first_words() {
        let p = policy(&["git status", "git log", "ls", "python3 -c"]);
        assert_eq!(
            p.programs(),
            Some(vec![
                "git".to_owned(),
                "ls".to_owned(),
                "python3".to_owned()
            ])
        );
        let any = CommandPolicy {
            any_program: true,
            ..p
        };
        assert_eq!(any.programs(), None);
    }
}
