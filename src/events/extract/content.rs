//! Keys from content: a digest of the event's canonical JSON, restricted to some fields
//! or without others, amounts normalized.

use serde_json::{Map, Value};

use super::normalize::{get_mut_at, insert_at, remove_at};
use super::normalize::{normalize_amount, normalize_number_amount};
use super::{kind, paths, require_object, Extractor, FieldPath};
use crate::error::Result;
use crate::events::EventError;
use crate::key::{digest_value, HashAlgorithm};

/// The key is a digest of the event's canonical JSON (object keys sorted, compact; see
/// [`crate::canonical_json`]), over the `include` fields (all when not set) minus the
/// `exclude` fields. Included fields that are absent are simply not in the digest; an
/// included path through an array (`items.0.sku`) keeps its value under objects keyed by
/// the path's segments.
///
/// ```
/// use idem::events::{ContentHashExtractor, Extractor};
/// use idem::HashAlgorithm;
/// use serde_json::json;
/// let key = ContentHashExtractor::new().exclude(["id", "timestamp"]).unwrap();
/// let a = json!({"id": 1, "timestamp": "2025-11-18T09:00:00Z", "amount": "10.00"});
/// let b = json!({"amount": "10.00", "id": 2, "timestamp": "2025-11-18T09:05:00Z"});
/// assert_eq!(key.extract(&a).unwrap(), key.extract(&b).unwrap());
/// assert_eq!(key.extract(&a).unwrap(), idem::digest_value(&json!({"amount": "10.00"}), HashAlgorithm::Sha256));
/// let md5 = ContentHashExtractor::new().algorithm(HashAlgorithm::Md5);
/// assert_eq!(md5.extract(&a).unwrap().len(), 32);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContentHashExtractor {
    pub(super) include: Option<Vec<FieldPath>>,
    pub(super) exclude: Vec<FieldPath>,
    pub(super) amounts: Vec<FieldPath>,
    pub(super) algorithm: HashAlgorithm,
}

impl ContentHashExtractor {
    /// All fields, SHA-256.
    pub fn new() -> Self {
        ContentHashExtractor::default()
    }

    /// Only these fields (dotted paths) count.
    pub fn include<I, S>(mut self, fields: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.include = Some(paths(fields)?);
        Ok(self)
    }

    /// These fields (dotted paths) do not count.
    pub fn exclude<I, S>(mut self, fields: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.exclude = paths(fields)?;
        Ok(self)
    }

    /// These fields (dotted paths) are money amounts: their value is replaced by its
    /// [`normalize_amount`] text before hashing, so `"100.5"`, `"$100.50"` and `100.50`
    /// are the same payload (seed 004: amounts "normalized to numeric scale 2"). A field
    /// that is absent or `null` stays as it is; one that is not an amount makes the event
    /// invalid ([`EventError::InvalidField`] naming it).
    pub fn normalize_amounts<I, S>(mut self, fields: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.amounts = paths(fields)?;
        Ok(self)
    }

    /// The digest: SHA-256 (default, 64 hex characters) or MD5 (32).
    pub fn algorithm(mut self, algorithm: HashAlgorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The part of `event` the digest covers.
    pub fn content(&self, event: &Value) -> Result<Value, EventError> {
        require_object(event)?;
        let mut content = match &self.include {
            None => event.clone(),
            Some(fields) => {
                let mut picked = Value::Object(Map::new());
                for path in fields {
                    if let Some(v) = path.get(event) {
                        insert_at(&mut picked, &path.segments, v.clone());
                    }
                }
                picked
            }
        };
        for path in &self.exclude {
            remove_at(&mut content, &path.segments);
        }
        for path in &self.amounts {
            if let Some(value) = get_mut_at(&mut content, &path.segments) {
                let text = match value {
                    Value::Null => continue,
                    Value::String(s) => match crate::events::big_int_digits(s) {
                        Some(digits) => normalize_number_amount(digits),
                        None => normalize_amount(s),
                    },
                    Value::Number(n) => normalize_number_amount(&n.to_string()),
                    other => {
                        return Err(EventError::WrongType {
                            field: path.text.clone(),
                            expected: "an amount (a string or a number)",
                            found: kind(other),
                        })
                    }
                };
                *value = Value::String(text.map_err(|reason| EventError::InvalidField {
                    field: path.text.clone(),
                    reason,
                })?);
            }
        }
        Ok(content)
    }
}

impl Extractor for ContentHashExtractor {
    fn extract(&self, event: &Value) -> Result<String, EventError> {
        // The usual dedup fingerprint (every field but some top-level ones): hashed in
        // place, without copying the event.
        if self.include.is_none()
            && self.amounts.is_empty()
            && self.exclude.iter().all(|p| p.segments.len() == 1)
        {
            let map = require_object(event)?;
            return Ok(crate::key::digest_object_without(
                map,
                |k| self.exclude.iter().any(|p| p.segments[0] == k),
                self.algorithm,
            ));
        }
        Ok(digest_value(&self.content(event)?, self.algorithm))
    }
}
