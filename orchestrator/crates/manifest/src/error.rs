//! What a rejected manifest looks like to its author.
//!
//! Every problem is one [`ManifestError`] that names the stage that found it, the JSON pointer of
//! the offending node and, when the manifest came as text, the line (and column) where that node
//! starts. A manifest is rejected with all of its problems at once ([`ManifestErrors`]), ordered
//! by line, so an author fixes them in one pass instead of one per deploy.

use std::fmt;

use serde::Serialize;

/// The stage of parsing that found a problem. Later stages only run when earlier ones passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// The text is not YAML we accept (syntax, duplicate keys, multiple documents, ...).
    Yaml,
    /// The document does not satisfy the manifest's JSON Schema.
    Schema,
    /// The document is well-formed but inconsistent (unknown states, tools, runtimes, ...).
    Semantic,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Yaml => "yaml",
            Stage::Schema => "schema",
            Stage::Semantic => "semantic",
        })
    }
}

/// One problem found in a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
pub struct ManifestError {
    /// Which stage found it.
    pub stage: Stage,
    /// JSON pointer (RFC 6901) of the offending node; `""` is the whole document.
    pub pointer: String,
    /// 1-based line where the node starts, when the manifest came as text.
    pub line: Option<usize>,
    /// 1-based column where the node starts, when the manifest came as text.
    pub column: Option<usize>,
    /// What is wrong, in words an author can act on.
    pub message: String,
}

impl ManifestError {
    /// An error without a position; [`super::yaml::Positions::locate`] fills it in later.
    pub fn new(stage: Stage, pointer: impl Into<String>, message: impl Into<String>) -> Self {
        ManifestError {
            stage,
            pointer: pointer.into(),
            line: None,
            column: None,
            message: message.into(),
        }
    }

    /// The same error placed at a line and column.
    pub(crate) fn at(mut self, position: Option<(usize, usize)>) -> Self {
        if let Some((line, column)) = position {
            self.line = Some(line);
            self.column = Some(column);
        }
        self
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.stage) {
            (Some(line), Stage::Yaml) => match self.column {
                Some(column) => write!(f, "line {line}, column {column}: ")?,
                None => write!(f, "line {line}: ")?,
            },
            (Some(line), _) => write!(f, "line {line}: ")?,
            (None, _) => {}
        }
        if self.pointer.is_empty() {
            if self.stage != Stage::Yaml {
                f.write_str("(document): ")?;
            }
        } else {
            write!(f, "{}: ", self.pointer)?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found in a manifest, ordered by line (then pointer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(transparent)]
pub struct ManifestErrors(pub Vec<ManifestError>);

impl ManifestErrors {
    /// Sorts by position (errors without a line go last, by pointer) and drops exact repeats.
    pub(crate) fn sorted(mut errors: Vec<ManifestError>) -> Self {
        errors.sort_by(|a, b| {
            let key = |e: &ManifestError| (e.line.unwrap_or(usize::MAX), e.column.unwrap_or(0));
            key(a).cmp(&key(b)).then_with(|| a.pointer.cmp(&b.pointer))
        });
        errors.dedup();
        ManifestErrors(errors)
    }

    /// The stage of the first error (all errors of one rejection come from the same stage).
    pub fn stage(&self) -> Option<Stage> {
        self.0.first().map(|e| e.stage)
    }

    /// The errors as a slice.
    pub fn as_slice(&self) -> &[ManifestError] {
        &self.0
    }
}

impl fmt::Display for ManifestErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.len() {
            0 => f.write_str("invalid manifest"),
            1 => write!(f, "invalid manifest: {}", self.0[0]),
            n => {
                write!(f, "invalid manifest ({n} problems): ")?;
                for (i, error) in self.0.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{error}")?;
                }
                Ok(())
            }
        }
    }
}

impl From<ManifestError> for ManifestErrors {
    fn from(error: ManifestError) -> Self {
        ManifestErrors(vec![error])
    }
}

impl IntoIterator for ManifestErrors {
    type Item = ManifestError;
    type IntoIter = std::vec::IntoIter<ManifestError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_line_pointer_and_message() {
        let e = ManifestError::new(
            Stage::Semantic,
            "/spec/states/review/transitions/0/target",
            "unknown state `reveiw`",
        )
        .at(Some((12, 17)));
        assert_eq!(
            e.to_string(),
            "line 12: /spec/states/review/transitions/0/target: unknown state `reveiw`"
        );
        let y = ManifestError::new(Stage::Yaml, "", "bad indentation").at(Some((3, 2)));
        assert_eq!(y.to_string(), "line 3, column 2: bad indentation");
        let root = ManifestError::new(Stage::Schema, "", "missing required key `spec`");
        assert_eq!(root.to_string(), "(document): missing required key `spec`");
    }

    #[test]
    fn sorted_orders_by_line_and_drops_repeats() {
        let a = ManifestError::new(Stage::Schema, "/b", "x").at(Some((5, 1)));
        let b = ManifestError::new(Stage::Schema, "/a", "y").at(Some((2, 1)));
        let c = ManifestError::new(Stage::Schema, "/c", "z");
        let errors = ManifestErrors::sorted(vec![c.clone(), a.clone(), b.clone(), a.clone()]);
        assert_eq!(errors.0, vec![b, a, c]);
    }
}
