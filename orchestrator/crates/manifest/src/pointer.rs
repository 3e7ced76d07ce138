//! JSON pointers (RFC 6901), the one way every stage names a node of a manifest.
//!
//! The YAML loader records positions under pointers, the schema validator reports pointers, and
//! the semantic checks build them; keeping the escaping in one place keeps the three in step.

/// Appends one reference token (a key or an index) to a pointer, escaping `~` and `/`.
pub fn join(pointer: &str, token: &str) -> String {
    let mut out = String::with_capacity(pointer.len() + token.len() + 1);
    out.push_str(pointer);
    out.push('/');
    for c in token.chars() {
        match c {
            '~' => out.push_str("~0"),
            '/' => out.push_str("~1"),
            c => out.push(c),
        }
    }
    out
}

/// Appends an array index to a pointer.
pub fn join_index(pointer: &str, index: usize) -> String {
    format!("{pointer}/{index}")
}

/// The string member `key` of an object node; empty when it is absent or no string (the schema
/// stage reports those, so later stages read on).
pub fn member_str<'v>(node: &'v serde_json::Value, key: &str) -> &'v str {
    node.get(key)
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
}

/// The pointer of the parent node, or `None` for the root.
pub fn parent(pointer: &str) -> Option<&str> {
    pointer.rfind('/').map(|i| &pointer[..i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_walks_up() {
        assert_eq!(
            join("/labels", "team.example/owner"),
            "/labels/team.example~1owner"
        );
        assert_eq!(join("", "a~b"), "/a~0b");
        assert_eq!(join_index("/spec/tools", 3), "/spec/tools/3");
        assert_eq!(parent("/spec/tools/3"), Some("/spec/tools"));
        assert_eq!(parent("/spec"), Some(""));
        assert_eq!(parent(""), None);
    }
}
