//! Keys from fields: one field by its path, or several joined by a separator.

use serde_json::Value;

use super::{paths, require_object, scalar_text, Extractor, FieldPath};
use crate::error::{Error, Result};
use crate::events::EventError;

/// The key is one field of the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldExtractor {
    path: FieldPath,
}

impl FieldExtractor {
    /// The field at dotted `path`.
    pub fn new(path: &str) -> Result<Self> {
        Ok(FieldExtractor {
            path: FieldPath::parse(path)?,
        })
    }
}

impl Extractor for FieldExtractor {
    fn extract(&self, event: &Value) -> Result<String, EventError> {
        require_object(event)?;
        scalar_text(&self.path, event)
    }
}

/// The key is several fields joined by a separator; a separator or backslash inside a
/// field's text is escaped with a backslash, so different events never share a key.
///
/// ```
/// use idem::events::{CompositeExtractor, Extractor};
/// use serde_json::json;
/// let key = CompositeExtractor::new(["a", "b"], ":").unwrap();
/// assert_eq!(key.extract(&json!({"a": "x", "b": 7})).unwrap(), "x:7");
/// assert_ne!(
///     key.extract(&json!({"a": "x:y", "b": "z"})).unwrap(),
///     key.extract(&json!({"a": "x", "b": "y:z"})).unwrap(),
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompositeExtractor {
    fields: Vec<FieldPath>,
    separator: String,
}

impl CompositeExtractor {
    /// The `fields` (dotted paths, in order) joined by `separator` (not empty, no
    /// backslash).
    pub fn new<I, S>(fields: I, separator: &str) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let fields = paths(fields)?;
        if fields.is_empty() {
            return Err(Error::config("a composite key needs at least one field"));
        }
        if separator.is_empty() || separator.contains('\\') {
            return Err(Error::config(format!(
                "composite key separator {separator:?} must be non-empty and without a backslash"
            )));
        }
        Ok(CompositeExtractor {
            fields,
            separator: separator.to_string(),
        })
    }
}

impl Extractor for CompositeExtractor {
    fn extract(&self, event: &Value) -> Result<String, EventError> {
        require_object(event)?;
        let mut key = String::new();
        for (i, path) in self.fields.iter().enumerate() {
            if i > 0 {
                key.push_str(&self.separator);
            }
            push_part(&mut key, &scalar_text(path, event)?, &self.separator);
        }
        Ok(key)
    }
}

/// Appends one part of a composite key, its separators and backslashes escaped.
pub(super) fn push_part(key: &mut String, part: &str, separator: &str) {
    if part.contains('\\') || part.contains(separator) {
        let escaped_sep = format!("\\{separator}");
        key.push_str(&part.replace('\\', "\\\\").replace(separator, &escaped_sep));
    } else {
        key.push_str(part);
    }
}
