//! Where the command line finds its API key: `--key`, `ORCHESTRATOR_KEY` (or the older
//! `ORCHESTRATOR_API_KEY`), else a credentials file that only its owner may read. The file is
//! read (and its mode checked) only when no key was given.
//!
//! The file (`$XDG_CONFIG_HOME/aegis-orchestrator/credentials`, else
//! `~/.config/aegis-orchestrator/credentials`, or `--credentials PATH`) holds `key = aok_...` and
//! optionally `url = http://...`; a lone `aok_...` line is read as the key. A file that group or
//! others may read is refused, not used: a key is as good as a password.

use std::path::{Path, PathBuf};

use super::error::CliError;

/// What a credentials file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The file it came from (for messages).
    pub path: PathBuf,
    /// The API key, if the file names one.
    pub key: Option<String>,
    /// The node URL, if the file names one.
    pub url: Option<String>,
}

/// The default credentials file, if a home or config directory is known.
pub fn default_path() -> Option<PathBuf> {
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".config"))
        })?;
    Some(config.join("aegis-orchestrator").join("credentials"))
}

/// Reads the credentials file: the given one (which must exist), else the default one if it
/// exists. Refuses files that group or others may read, and lines it does not understand.
pub fn load(explicit: Option<&Path>) -> Result<Option<Credentials>, CliError> {
    let path = match explicit {
        Some(p) => p.to_owned(),
        None => match default_path() {
            Some(p) if p.exists() => p,
            _ => return Ok(None),
        },
    };
    let shown = path.display();
    let meta = std::fs::metadata(&path)
        .map_err(|e| CliError::Auth(format!("credentials file {shown}: {e}")))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(CliError::Auth(format!(
                "credentials file {shown} has mode {mode:04o}: group or others may read the key in \
                 it, so it is not used; run `chmod 600 {shown}`"
            )));
        }
    }
    #[cfg(not(unix))]
    let _ = meta;
    let text = std::fs::read_to_string(&path)
        .map_err(|e| CliError::Auth(format!("credentials file {shown}: {e}")))?;
    parse(&path, &text).map(Some)
}

/// Parses `key = value` lines (`#` comments, blank lines); a bare `aok_...` line is the key.
pub fn parse(path: &Path, text: &str) -> Result<Credentials, CliError> {
    let mut out = Credentials {
        path: path.to_owned(),
        key: None,
        url: None,
    };
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with(aegis_proto::API_KEY_PREFIX) && !line.contains('=') {
            out.key = Some(line.to_owned());
            continue;
        }
        let Some((name, value)) = line.split_once('=').or_else(|| line.split_once(':')) else {
            return Err(CliError::Auth(format!(
                "credentials file {}, line {}: expected `key = aok_...` or `url = http://...`",
                path.display(),
                n + 1
            )));
        };
        let value = value.trim().trim_matches('"').to_owned();
        match name.trim() {
            "key" | "api_key" => out.key = Some(value),
            "url" => out.url = Some(value),
            other => {
                return Err(CliError::Auth(format!(
                    "credentials file {}, line {}: unknown setting `{other}` (known: key, url)",
                    path.display(),
                    n + 1
                )))
            }
        }
    }
    Ok(out)
}

/// The key to use: the one given (`--key`, `ORCHESTRATOR_KEY` or `ORCHESTRATOR_API_KEY`), else
/// the credentials file's; an error naming every source when none has one.
pub fn pick_key(given: Option<String>, file: Option<&Credentials>) -> Result<String, CliError> {
    let key = given
        .filter(|k| !k.trim().is_empty())
        .or_else(|| file.and_then(|f| f.key.clone()));
    match key {
        Some(k) => Ok(k.trim().to_owned()),
        None => {
            let file = file
                .map(|f| f.path.clone())
                .or_else(default_path)
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "~/.config/aegis-orchestrator/credentials".to_owned());
            Err(CliError::Auth(format!(
                "no API key: give --key, set ORCHESTRATOR_KEY, or write `key = aok_...` to {file} \
                 (mode 0600); under compose, `docker-compose exec orchestrator orchestrator \
                 admin-key` prints the admin key"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_with_pairs_or_a_bare_key_parse() {
        let p = Path::new("/c");
        let c = parse(p, "# mine\nkey = aok_abc\nurl=http://n:8088\n").unwrap();
        assert_eq!(c.key.as_deref(), Some("aok_abc"));
        assert_eq!(c.url.as_deref(), Some("http://n:8088"));
        let c = parse(p, "\naok_def\n").unwrap();
        assert_eq!(c.key.as_deref(), Some("aok_def"));
        let e = parse(p, "key = a\ncolour = blue\n").unwrap_err();
        assert!(
            e.to_string().contains("line 2: unknown setting `colour`"),
            "{e}"
        );
        assert_eq!(e.exit_code(), 4);
    }

    #[cfg(unix)]
    #[test]
    fn readable_files_are_refused_and_private_ones_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials");
        std::fs::write(&path, "key = aok_x\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load(Some(&path)).unwrap_err();
        assert!(e.to_string().contains("mode 0644"), "{e}");
        assert!(e.to_string().contains("chmod 600"), "{e}");
        assert_eq!(e.exit_code(), 4);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = load(Some(&path)).unwrap().unwrap();
        assert_eq!(c.key.as_deref(), Some("aok_x"));
        let e = load(Some(&dir.path().join("missing"))).unwrap_err();
        assert_eq!(e.exit_code(), 4);
    }

    #[test]
    fn a_given_key_wins_over_the_file() {
        let file = Credentials {
            path: "/c".into(),
            key: Some("aok_file".into()),
            url: None,
        };
        assert_eq!(
            pick_key(Some("aok_f".into()), Some(&file)).unwrap(),
            "aok_f"
        );
        assert_eq!(pick_key(Some(" ".into()), Some(&file)).unwrap(), "aok_file");
        let e = pick_key(None, None).unwrap_err();
        assert!(e.to_string().contains("ORCHESTRATOR_KEY"), "{e}");
        assert_eq!(e.exit_code(), 4);
    }
}
