//! Property tests (proptest) of the two pure policy functions every sandbox call goes through:
//! the argv policy (`policy::command`) and the path normaliser (`policy::paths`).
//!
//! A short run (a few thousand cases each) is part of the suite; raise `PROPTEST_CASES` for a
//! longer search. What must hold for any input:
//!
//! * neither function panics;
//! * an accepted argv starts with a bare, allowlisted program, contains no NUL, no loader name,
//!   and (without `allow_metacharacters`) came from a command without shell metacharacters;
//! * a refused option stays refused in every spelling getopt would accept: exact, with a value,
//!   abbreviated, clustered, or (tar) as dashless letters, wherever it stands;
//! * environment names that configure programs are refused even when allowlisted;
//! * a normalised path is absolute, canonical and a fixed point; an accepted path lies under an
//!   allowed root component-wise; any `..` is refused.

use orchestrator::policy::command::{CommandPolicy, METACHARACTERS};
use orchestrator::policy::paths;
use proptest::prelude::*;

fn policy(list: &[&str], metacharacters: bool) -> CommandPolicy {
    CommandPolicy {
        subcommand_allowlist: list.iter().map(|s| (*s).to_owned()).collect(),
        allow_metacharacters: metacharacters,
        env_allowlist: Vec::new(),
        any_program: false,
    }
}

const ALLOWLIST: &[&str] = &[
    "ls",
    "cat",
    "tar",
    "sort",
    "find",
    "git status",
    "git log",
    "python3",
    "sed",
    "split",
];

/// Words made of the characters that matter to the policy: dashes, quotes, metacharacters,
/// slashes, `=`, letters of refused options, spaces and a NUL now and then.
fn word() -> impl Strategy<Value = String> {
    proptest::string::string_regex(r#"[-a-zA-Z0-9 ./=_'"\\;|&$`<>()\n\x00:,]{0,24}"#)
        .expect("valid regex")
}

/// Refused options by program, as the rules name them, with how they are written.
const REFUSED: &[(&str, &str)] = &[
    ("tar", "--checkpoint-action"),
    ("tar", "--use-compress-program"),
    ("tar", "--to-command"),
    ("tar", "-I"),
    ("tar", "-F"),
    ("sort", "--compress-program"),
    ("sort", "-o"),
    ("sort", "--output"),
    ("python3", "-c"),
    ("python3", "-m"),
    ("sed", "-f"),
    ("split", "--filter"),
];

/// One spelling of `option` that getopt would read as that option.
fn spelling(option: &'static str) -> impl Strategy<Value = Vec<String>> {
    let long = option.strip_prefix("--").map(str::to_owned);
    let letter = option
        .strip_prefix('-')
        .filter(|l| l.len() == 1)
        .map(str::to_owned);
    (0usize..64, "[a-z]{0,3}", "[a-zA-Z0-9/]{1,8}", 0u8..4).prop_map(
        move |(cut, others, value, form)| match (&long, &letter) {
            (Some(name), _) => {
                let keep = 1 + cut % name.len();
                let abbreviated = &name[..keep];
                match form {
                    0 => vec![format!("--{abbreviated}")],
                    1 => vec![format!("--{abbreviated}={value}")],
                    2 => vec![format!("--{abbreviated}"), value],
                    _ => vec![format!("--{name}={value}")],
                }
            }
            (None, Some(l)) => {
                let others: String = others.chars().filter(|c| !"ocmfIF".contains(*c)).collect();
                match form {
                    0 => vec![format!("-{l}"), value],
                    1 => vec![format!("-{l}{value}")],
                    2 => vec![format!("-{others}{l}"), value],
                    _ => vec![format!("-{others}{l}{others}"), value],
                }
            }
            (None, None) => vec![option.to_owned()],
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000)
    ))]

    #[test]
    fn accepted_argv_is_always_bare_allowlisted_and_clean(
        command in word(),
        args in proptest::collection::vec(word(), 0..4),
        metacharacters in any::<bool>(),
    ) {
        let p = policy(ALLOWLIST, metacharacters);
        if let Ok(argv) = p.argv(&command, &args) {
            prop_assert!(!argv.is_empty());
            let program = &argv[0];
            prop_assert!(!program.is_empty() && !program.contains('/'), "{argv:?}");
            prop_assert!(
                ALLOWLIST.iter().any(|entry| {
                    let words: Vec<&str> = entry.split(' ').collect();
                    argv.len() >= words.len() && argv.iter().zip(&words).all(|(a, w)| a == w)
                }),
                "{argv:?} matches no entry"
            );
            prop_assert!(argv.iter().all(|a| !a.contains('\0')), "{argv:?}");
            prop_assert!(
                argv.iter().all(|a| !orchestrator::policy::command::names_a_loader(a)),
                "{argv:?}"
            );
            if !metacharacters {
                prop_assert!(!command.contains(METACHARACTERS), "{command:?}");
            }
            // The args are appended verbatim.
            prop_assert!(argv.ends_with(&args));
        }
    }

    #[test]
    fn refused_options_are_refused_in_every_spelling(
        (program, option, spelled) in proptest::sample::select(REFUSED)
            .prop_flat_map(|(program, option)| (Just(program), Just(option), spelling(option))),
        before in proptest::collection::vec("[a-z][a-z0-9.]{0,6}", 0..3),
        after in proptest::collection::vec("[a-z][a-z0-9.]{0,6}", 0..3),
    ) {
        let p = policy(&[program], true);
        let mut args: Vec<String> = Vec::new();
        if program == "tar" {
            args.push("-c".to_owned());
        }
        args.extend(before);
        args.extend(spelled.clone());
        args.extend(after);
        let refusal = p.argv(program, &args);
        prop_assert!(
            matches!(&refusal, Err(r) if r.code == "code_option"),
            "{program} {args:?} ({option} as {spelled:?}) passed: {refusal:?}"
        );
    }

    #[test]
    fn tar_option_letters_without_a_dash_are_options(
        before in "[ctxvz]{0,3}",
        letter in proptest::sample::select(&['I', 'F'][..]),
        after in "[fvz]{0,2}",
    ) {
        let p = policy(&["tar"], false);
        let cluster = format!("{before}{letter}{after}");
        let refusal = p.argv("tar", &[cluster.clone(), "prog".into(), "a.tar".into()]);
        prop_assert!(matches!(&refusal, Err(r) if r.code == "code_option"), "{cluster}: {refusal:?}");
    }

    #[test]
    fn environment_that_configures_programs_is_never_accepted(
        name in prop_oneof![
            Just("GIT_CONFIG_COUNT".to_owned()),
            "GIT_CONFIG_(KEY|VALUE)_[0-9]{1,3}",
            "LD_[A-Z_]{1,12}",
            "BASH_FUNC_[a-z]{1,8}%%",
            Just("GIT_SSH_COMMAND".to_owned()),
            Just("PAGER".to_owned()),
            Just("PYTHONPATH".to_owned()),
            Just("PYTHONWARNINGS".to_owned()),
            Just("PERL5LIB".to_owned()),
            Just("RUBYOPT".to_owned()),
            Just("GCONV_PATH".to_owned()),
            Just("SHELLOPTS".to_owned()),
            Just("PS4".to_owned()),
        ],
    ) {
        let p = CommandPolicy {
            env_allowlist: vec![name.clone()],
            ..policy(&["git"], false)
        };
        let verdict = p.env([name.as_str()]);
        prop_assert!(matches!(&verdict, Err(r) if r.code == "env_not_allowed"), "{name}: {verdict:?}");
    }

    #[test]
    fn normalised_paths_are_canonical_fixed_points(path in r"[a-z./\x00]{0,40}|/[a-z./]{0,40}") {
        match paths::normalise(&path) {
            Ok(normal) => {
                prop_assert!(normal.starts_with('/'), "{normal}");
                prop_assert!(!normal.contains('\0'));
                prop_assert!(normal == "/" || !normal.ends_with('/'), "{normal}");
                prop_assert!(
                    normal.split('/').skip(1).all(|c| !c.is_empty() && c != "." && c != "..")
                        || normal == "/",
                    "{normal}"
                );
                prop_assert_eq!(paths::normalise(&normal), Ok(normal.clone()));
                prop_assert!(!path.split('/').any(|c| c == ".."), "{path} was accepted");
            }
            Err(message) => prop_assert!(!message.is_empty()),
        }
    }

    #[test]
    fn accepted_paths_lie_under_a_root_component_wise(
        roots in proptest::collection::vec("/[a-z]{1,4}(/[a-z]{1,4}){0,2}", 1..3),
        path in r"(/[a-z]{1,4}){0,4}|[a-z]{1,4}(/[a-z]{1,4}){0,3}",
    ) {
        if let Ok(normal) = paths::check(&path, &roots, "read") {
            prop_assert!(
                roots.iter().any(|r| normal == *r || normal.starts_with(&format!("{r}/"))),
                "{normal} accepted under {roots:?}"
            );
        } else if let Ok(normal) = paths::normalise(&path) {
            prop_assert!(
                !roots.iter().any(|r| normal == *r || normal.starts_with(&format!("{r}/"))),
                "{normal} refused although under {roots:?}"
            );
        }
    }
}
