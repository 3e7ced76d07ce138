//! Lexical path handling: validation, normalization and the choice of root.
//!
//! This is the pure half of path resolution (no syscalls, fully unit-tested). A requested path is
//! checked for NUL bytes and length limits, made absolute against the workspace, and cleaned of
//! `.`, `..` and empty components *lexically*; then the longest allowed root that is a
//! component-wise prefix is chosen (`/workspacex` is not under `/workspace`). What remains is a
//! relative path with no `..`, which `roots.rs` hands to `openat2(RESOLVE_BENEATH)`: the kernel,
//! not this module, is what keeps symlinks from leaving the root.

use crate::error::OpError;
use crate::protocol::ErrorKind;

/// Longest path accepted, in bytes (Linux `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest component accepted, in bytes (Linux `NAME_MAX`).
pub const MAX_COMPONENT_BYTES: usize = 255;

/// Validates `input` and returns it as an absolute, normalized path.
///
/// Relative inputs are taken relative to `base` (the workspace). `..` that would climb above `/`
/// is refused rather than clamped, since no honest request needs it.
pub fn normalize(base: &str, input: &str) -> Result<String, OpError> {
    if input.is_empty() {
        return Err(OpError::invalid("path is empty"));
    }
    if input.contains('\0') {
        return Err(OpError::invalid(format!(
            "path '{}' contains a NUL byte",
            input.escape_default()
        )));
    }
    if input.len() > MAX_PATH_BYTES {
        return Err(OpError::invalid(format!(
            "path is {} bytes long, more than {MAX_PATH_BYTES}",
            input.len()
        )));
    }
    if let Some(long) = input.split('/').find(|c| c.len() > MAX_COMPONENT_BYTES) {
        return Err(OpError::invalid(format!(
            "path component '{}...' is {} bytes long, more than {MAX_COMPONENT_BYTES}",
            &long[..floor_char_boundary(long, 32)],
            long.len()
        )));
    }
    let joined;
    let full = if input.starts_with('/') {
        input
    } else {
        joined = format!("{base}/{input}");
        &joined
    };
    let mut parts: Vec<&str> = Vec::new();
    for component in full.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(OpError::new(
                        ErrorKind::PathNotAllowed,
                        format!("path '{input}' climbs above '/'"),
                    ));
                }
            }
            name => parts.push(name),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// The largest index `<= max` that is a char boundary of `s`, to cut text without splitting a
/// UTF-8 sequence.
pub fn floor_char_boundary(s: &str, max: usize) -> usize {
    if max >= s.len() {
        return s.len();
    }
    (0..=max)
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0)
}

/// Whether normalized `path` equals `root` or lies beneath it, component-wise.
pub fn is_within(root: &str, path: &str) -> bool {
    root == "/"
        || path == root
        || (path.starts_with(root) && path.as_bytes().get(root.len()) == Some(&b'/'))
}

/// The part of normalized `path` below `root` (`""` for the root itself); `path` must be within.
pub fn relative_to<'p>(root: &str, path: &'p str) -> &'p str {
    if root == "/" {
        &path[1..]
    } else if path.len() == root.len() {
        ""
    } else {
        &path[root.len() + 1..]
    }
}

/// Picks the longest root that contains normalized `path`; returns its index and the remainder.
pub fn select_root<'r, 'p>(
    roots: impl IntoIterator<Item = &'r str>,
    path: &'p str,
) -> Option<(usize, &'p str)> {
    roots
        .into_iter()
        .enumerate()
        .filter(|(_, root)| is_within(root, path))
        .max_by_key(|(_, root)| root.len())
        .map(|(index, root)| (index, relative_to(root, path)))
}

/// Splits a non-empty relative path into its parent part (maybe `""`) and its final component.
pub fn split_parent(rel: &str) -> (&str, &str) {
    match rel.rfind('/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => ("", rel),
    }
}

/// Joins a normalized absolute path and a relative one for display.
pub fn join(base: &str, rel: &str) -> String {
    match (base, rel) {
        (_, "") => base.to_string(),
        ("/", _) => format!("/{rel}"),
        _ => format!("{base}/{rel}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WS: &str = "/workspace";

    #[test]
    fn relative_paths_are_taken_from_the_workspace() {
        assert_eq!(normalize(WS, "a.txt").unwrap(), "/workspace/a.txt");
        assert_eq!(
            normalize(WS, "./src//lib/../main.rs").unwrap(),
            "/workspace/src/main.rs"
        );
        assert_eq!(normalize(WS, ".").unwrap(), "/workspace");
        assert_eq!(normalize(WS, "/workspace/").unwrap(), "/workspace");
    }

    #[test]
    fn dot_dot_is_applied_lexically() {
        assert_eq!(normalize(WS, "../etc/passwd").unwrap(), "/etc/passwd");
        assert_eq!(
            normalize(WS, "/workspace/../workspacex/a").unwrap(),
            "/workspacex/a"
        );
        assert_eq!(
            normalize(WS, "/../etc").unwrap_err().kind,
            ErrorKind::PathNotAllowed
        );
        assert_eq!(
            normalize(WS, "../../../x").unwrap_err().kind,
            ErrorKind::PathNotAllowed
        );
    }

    #[test]
    fn malformed_paths_are_invalid_requests() {
        for bad in ["", "a\0b", &"x/".repeat(2100), &"n".repeat(256)] {
            let err = normalize(WS, bad).unwrap_err();
            assert_eq!(err.kind, ErrorKind::InvalidRequest, "{bad:?}");
        }
        assert!(normalize(WS, "a\0b").unwrap_err().message.contains("NUL"));
        assert!(normalize(WS, &"n".repeat(255)).is_ok());
        let multibyte = "é".repeat(200);
        assert!(normalize(WS, &multibyte)
            .unwrap_err()
            .message
            .contains("400 bytes"));
    }

    #[test]
    fn roots_match_component_wise() {
        assert!(is_within("/workspace", "/workspace"));
        assert!(is_within("/workspace", "/workspace/a"));
        assert!(!is_within("/workspace", "/workspacex/a"));
        assert!(!is_within("/workspace", "/workspacex"));
        assert!(!is_within("/workspace/a", "/workspace"));
        assert!(is_within("/", "/etc"));
    }

    #[test]
    fn the_longest_root_wins() {
        let roots = ["/workspace", "/workspace/cache", "/tmp"];
        assert_eq!(select_root(roots, "/workspace/cache/x"), Some((1, "x")));
        assert_eq!(select_root(roots, "/workspace/cachex"), Some((0, "cachex")));
        assert_eq!(select_root(roots, "/workspace/cache"), Some((1, "")));
        assert_eq!(select_root(roots, "/tmp/a/b"), Some((2, "a/b")));
        assert_eq!(select_root(roots, "/workspacex/a"), None);
        assert_eq!(select_root(roots, "/etc/passwd"), None);
        assert_eq!(select_root(["/"], "/etc/passwd"), Some((0, "etc/passwd")));
        assert_eq!(select_root(["/"], "/"), Some((0, "")));
    }

    #[test]
    fn parents_split_at_the_last_slash() {
        assert_eq!(split_parent("a/b/c"), ("a/b", "c"));
        assert_eq!(split_parent("c"), ("", "c"));
        assert_eq!(join("/workspace", ""), "/workspace");
        assert_eq!(join("/", "etc"), "/etc");
        assert_eq!(join("/workspace", "a/b"), "/workspace/a/b");
    }
}
