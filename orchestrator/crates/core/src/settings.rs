//! A refused setting of the node configuration, as the check beside each section's type reports
//! it. The configuration crate adds the section's name, the file line or environment variable
//! it came from, and the checks across sections.

/// One setting a section's own check refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The key within the section, dotted (`""` for the section as a whole).
    pub key: String,
    /// What is wrong, and what is expected instead.
    pub message: String,
}

impl Invalid {
    /// `key` refused with `message`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Refuses the first of `fields` (key, value) that is 0: counts, sizes and intervals that must
/// be at least 1.
pub fn at_least_one(fields: &[(&str, u64)]) -> Result<(), Invalid> {
    match fields.iter().find(|(_, v)| *v == 0) {
        Some((key, _)) => Err(Invalid::new(*key, "expected a whole number of at least 1")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_zero_is_named() {
        assert_eq!(at_least_one(&[("a", 1), ("b", 2)]), Ok(()));
        let e = at_least_one(&[("a", 1), ("b", 0), ("c", 0)]).unwrap_err();
        assert_eq!(e.key, "b");
        assert!(e.message.contains("at least 1"));
    }
}
