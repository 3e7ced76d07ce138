//! Path policy: normalise a requested path and check it against a path allowlist.
//!
//! This is the policy half of the filesystem rule; the executor enforces the same roots again with
//! descriptor-relative resolution inside the container (the security half). Here we refuse what is
//! suspicious on its face: `..` components, NUL bytes, overlong paths, and paths outside every
//! allowed root compared component by component (`/workspacex` is not under `/workspace`).

/// Normalises `path` (relative paths are under `/workspace`); refuses `..` and malformed input.
/// The same rule as a security context's paths: one normaliser for both
/// (`aegis_seal::context::normalise_path`).
pub fn normalise(path: &str) -> Result<String, String> {
    aegis_core::normalise_path(path)
}

/// True when `path` (normalised) is `root` or lies below it, component-wise.
pub fn is_under(path: &str, root: &str) -> bool {
    let root = root.trim_end_matches('/');
    if root.is_empty() {
        return true;
    }
    path == root
        || path
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Normalises and checks `path` against `roots`; the error names the path and the roots.
pub fn check(path: &str, roots: &[String], access: &str) -> Result<String, String> {
    let normal = normalise(path)?;
    if roots.iter().any(|r| is_under(&normal, r)) {
        Ok(normal)
    } else {
        Err(format!(
            "`{path}` is outside the {access} allowlist ({})",
            if roots.is_empty() {
                "empty".to_owned()
            } else {
                roots.join(", ")
            }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_and_refuses_parent_steps() {
        assert_eq!(normalise("a/./b//c").unwrap(), "/workspace/a/b/c");
        assert_eq!(normalise("/workspace/").unwrap(), "/workspace");
        assert!(normalise("../etc/passwd").is_err());
        assert!(normalise("/workspace/a/../../etc").is_err());
        assert!(normalise("a\0b").is_err());
        assert!(normalise(&"a/".repeat(3000)).is_err());
    }

    #[test]
    fn roots_compare_by_component() {
        let roots = vec!["/workspace".to_owned()];
        assert!(check("/workspace/x", &roots, "read").is_ok());
        assert!(check("x", &roots, "read").is_ok());
        assert!(check("/workspacex/x", &roots, "read").is_err());
        assert!(check("/etc/passwd", &roots, "read").is_err());
        assert!(check("/proc/self/root/etc/passwd", &roots, "read").is_err());
        let out = vec!["/workspace/out".to_owned()];
        assert!(check("/workspace/out/a", &out, "write").is_ok());
        assert!(check("/workspace/outside", &out, "write").is_err());
    }
}
