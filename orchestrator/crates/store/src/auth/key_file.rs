//! The admin key kept in a file (`auth.admin_key_file`): written once, mode 0600, at the first
//! start that has no configured key, so that a compose stack's key survives restarts and
//! `orchestrator admin-key` can print it again (a key printed once in a log is lost with it).

use std::io::Write;
use std::path::{Path, PathBuf};

/// Why the key file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file or its directory could not be read, created or written.
    #[error("admin key file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file holds something that is not one key.
    #[error("admin key file {path}: {reason}; fix it, or delete it to have the next start generate a new key")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The key in the file, or None when there is no file.
pub fn read(path: &Path) -> Result<Option<String>, KeyFileError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(KeyFileError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    let key = text.trim();
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err(KeyFileError::Malformed {
            path: path.to_owned(),
            reason: "expected exactly one key (`aok_...`)".into(),
        });
    }
    super::check_shape(key).map_err(|reason| KeyFileError::Malformed {
        path: path.to_owned(),
        reason,
    })?;
    Ok(Some(key.to_owned()))
}

/// Writes `key` to a new file readable by its owner only (0600; the directory is created 0700
/// when missing). Returns the key the file holds: `key`, or the one another replica wrote first.
pub fn create(path: &Path, key: &str) -> Result<String, KeyFileError> {
    let io = |source| KeyFileError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir).map_err(io)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(mut file) => {
            file.write_all(format!("{key}\n").as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(io)?;
            Ok(key.to_owned())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            read(path)?.ok_or_else(|| KeyFileError::Malformed {
                path: path.to_owned(),
                reason: "it vanished while being created".into(),
            })
        }
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_written_private_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state").join("admin-key");
        assert!(read(&path).unwrap().is_none());
        let key = super::super::generate().unwrap();
        assert_eq!(create(&path, &key).unwrap(), key);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        assert_eq!(read(&path).unwrap().as_deref(), Some(key.as_str()));
        // A second writer gets the first key, not its own.
        let other = super::super::generate().unwrap();
        assert_eq!(create(&path, &other).unwrap(), key);
        std::fs::write(&path, "not a key\n").unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(
            e.contains("exactly one key") && e.contains("delete it"),
            "{e}"
        );
    }
}
