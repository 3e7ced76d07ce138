//! `env.get`: the environment commands get, or a `.env` file, with secret values masked.
//!
//! Without `path` the variables are the ones every `cmd.run` starts with (`PATH`, `HOME`,
//! `LANG` from the configuration; a call's own `env` additions last only for that call). With
//! `path` a `.env` file is read through `roots` like `fs.read` and parsed (`KEY=value`, `export`
//! prefixes, `#` comments, single- and double-quoted values); a malformed line is an error that
//! names its number. Masking happens here, inside the sandbox, so a masked value never leaves
//! it: a variable whose name contains one of [`SECRET_MARKERS`] (case-insensitive) reads
//! [`MASK`] unless the caller, whose policy decides, asked for `unmask`.

use std::collections::BTreeMap;

use crate::context::Context;
use crate::error::{OpError, OpResult};
use crate::fs::{read_capped, require_regular, READ_FLAGS};
use crate::protocol::{EnvGetParams, EnvGetResult, ErrorKind};
use crate::roots::Access;

/// Name fragments that make a variable secret.
pub const SECRET_MARKERS: [&str; 7] = [
    "SECRET",
    "TOKEN",
    "PASSWORD",
    "KEY",
    "API_KEY",
    "PRIVATE",
    "CREDENTIAL",
];
/// What a masked value reads.
pub const MASK: &str = "***MASKED***";
/// Largest `.env` file read.
const MAX_DOTENV_BYTES: u64 = 1 << 20;

/// Runs `env.get`.
pub fn run(ctx: &Context, params: EnvGetParams) -> OpResult<EnvGetResult> {
    let (variables, source) = match &params.path {
        None => (commands_environment(ctx), "environment".to_owned()),
        Some(path) => {
            let target = ctx.roots.resolve(path, Access::Read)?;
            let fd = target.open(READ_FLAGS)?;
            require_regular(&fd, &target.display)?;
            let (bytes, more) = read_capped(fd, MAX_DOTENV_BYTES, &target.display)?;
            if more {
                return Err(OpError::new(
                    ErrorKind::TooLarge,
                    format!(
                        "'{}' is larger than {MAX_DOTENV_BYTES} bytes; not a .env file",
                        target.display
                    ),
                ));
            }
            let text = String::from_utf8(bytes)
                .map_err(|_| OpError::invalid(format!("'{}' is not UTF-8 text", target.display)))?;
            let parsed = parse_dotenv(&text)
                .map_err(|e| OpError::invalid(format!("'{}' {e}", target.display)))?;
            (parsed, target.display)
        }
    };
    Ok(select_and_mask(
        variables,
        params.keys.as_deref(),
        params.unmask,
        source,
    ))
}

/// The variables every command starts with (see `cmd/run.rs`).
fn commands_environment(ctx: &Context) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("PATH".to_owned(), ctx.config.path.clone()),
        ("HOME".to_owned(), ctx.config.home.clone()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
    ])
}

/// True when a variable's name marks its value as secret.
pub fn is_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_MARKERS.iter().any(|m| upper.contains(m))
}

fn select_and_mask(
    mut variables: BTreeMap<String, String>,
    keys: Option<&[String]>,
    unmask: bool,
    source: String,
) -> EnvGetResult {
    let mut missing = Vec::new();
    if let Some(keys) = keys {
        missing = keys
            .iter()
            .filter(|k| !variables.contains_key(*k))
            .cloned()
            .collect();
        missing.sort();
        missing.dedup();
        variables.retain(|name, _| keys.contains(name));
    }
    let mut masked = Vec::new();
    if !unmask {
        for (name, value) in &mut variables {
            if is_secret(name) {
                *value = MASK.to_owned();
                masked.push(name.clone());
            }
        }
    }
    EnvGetResult {
        variables,
        masked,
        missing,
        source,
    }
}

/// Parses a `.env` file; later definitions of a name win.
fn parse_dotenv(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut variables = BTreeMap::new();
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").map_or(line, str::trim_start);
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!("line {number}: expected NAME=value"));
        };
        let name = name.trim();
        let valid_name = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !valid_name {
            return Err(format!("line {number}: '{name}' is not a variable name"));
        }
        let value = parse_value(value.trim()).map_err(|e| format!("line {number}: {e}"))?;
        variables.insert(name.to_owned(), value);
    }
    Ok(variables)
}

fn parse_value(value: &str) -> Result<String, &'static str> {
    if let Some(rest) = value.strip_prefix('\'') {
        let end = rest.find('\'').ok_or("unterminated single quote")?;
        return Ok(rest[..end].to_owned());
    }
    if let Some(rest) = value.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = rest.chars();
        while let Some(c) = chars.next() {
            match c {
                '"' => return Ok(out),
                '\\' => match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some(other) => out.push(other),
                    None => break,
                },
                c => out.push(c),
            }
        }
        return Err("unterminated double quote");
    }
    // Unquoted: an inline comment starts at ` #`.
    let value = value.find(" #").map_or(value, |i| &value[..i]);
    Ok(value.trim_end().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_match_as_substrings_in_any_case() {
        for name in [
            "AWS_SECRET_ACCESS_KEY",
            "github_token",
            "DB_Password",
            "api_key",
            "PRIVATE_PEM",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "SSH_KEYFILE",
        ] {
            assert!(is_secret(name), "{name}");
        }
        for name in ["PATH", "HOME", "LANG", "DATABASE_HOST", "PORT"] {
            assert!(!is_secret(name), "{name}");
        }
    }

    #[test]
    fn dotenv_syntax() {
        let vars = parse_dotenv(
            "# comment\n\nexport A=1\nB = two words # note\nC=\"q \\\"x\\\"\\n\"\nD='a # b'\nA=3\nE=\n",
        )
        .unwrap();
        assert_eq!(vars["A"], "3");
        assert_eq!(vars["B"], "two words");
        assert_eq!(vars["C"], "q \"x\"\n");
        assert_eq!(vars["D"], "a # b");
        assert_eq!(vars["E"], "");
        assert_eq!(
            parse_dotenv("A=1\nnot a line\n").unwrap_err(),
            "line 2: expected NAME=value"
        );
        assert!(parse_dotenv("1X=1").unwrap_err().contains("line 1"));
        assert!(parse_dotenv("X=\"open")
            .unwrap_err()
            .contains("unterminated"));
    }

    #[test]
    fn masking_and_selection() {
        let vars = BTreeMap::from([
            ("API_KEY".to_owned(), "k".to_owned()),
            ("HOST".to_owned(), "h".to_owned()),
        ]);
        let r = select_and_mask(vars.clone(), None, false, "x".into());
        assert_eq!(r.variables["API_KEY"], MASK);
        assert_eq!(r.variables["HOST"], "h");
        assert_eq!(r.masked, vec!["API_KEY"]);
        let r = select_and_mask(vars.clone(), None, true, "x".into());
        assert_eq!(r.variables["API_KEY"], "k");
        assert!(r.masked.is_empty());
        let keys = ["HOST".to_owned(), "NOPE".to_owned()];
        let r = select_and_mask(vars, Some(&keys), false, "x".into());
        assert_eq!(r.variables.len(), 1);
        assert_eq!(r.missing, vec!["NOPE"]);
    }
}
