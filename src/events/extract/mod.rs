//! Extractors: how an event's identity, the key it is deduplicated by, is taken from the
//! event (seed 001).
//!
//! * [`FieldExtractor`]: one field, by dotted path (`id`, `data.user.id`, `items.0.sku`);
//! * [`CompositeExtractor`]: several fields joined by a separator (`tenant:id`);
//! * [`ContentHashExtractor`]: a digest (SHA-256 by default, MD5 selectable) of the
//!   event's canonical JSON ([`crate::canonical_json`]: keys sorted, compact), restricted
//!   to an include list and without an exclude list, for events that carry no id;
//! * [`TimeBucketExtractor`]: another extractor's key prefixed with the time bucket of the
//!   event, so the same content is one event per bucket.
//!
//! Differences from the seed, on purpose:
//!
//! * the seed's time-window extractor buckets by the wall clock (`Utc::now()` at the
//!   moment of the check), so a retry that crosses a bucket boundary, or a replay of
//!   yesterday's file, gets a new key and is processed twice. Here the bucket comes from
//!   the **event's own timestamp**, so the same event always has the same key;
//! * the seed joins composite parts as they are, so `("a:b", "c")` and `("a", "b:c")`
//!   collide under `:`. Here a separator (or backslash) inside a part is escaped with a
//!   backslash; keys of parts without either are exactly the seed's;
//! * a missing, `null`, empty or structured (object/array) key field is an error naming
//!   the field instead of a key made from nothing, which would make unrelated events
//!   duplicates of each other.
//!
//! ```
//! use idem::events::{CompositeExtractor, Extractor, FieldExtractor};
//! use serde_json::json;
//! let event = json!({"id": "e-1", "tenant": {"name": "acme"}});
//! let by_id = FieldExtractor::new("id").unwrap();
//! assert_eq!(by_id.extract(&event).unwrap(), "e-1");
//! let by_tenant = CompositeExtractor::new(["tenant.name", "id"], ":").unwrap();
//! assert_eq!(by_tenant.extract(&event).unwrap(), "acme:e-1");
//! let err = FieldExtractor::new("user.id").unwrap().extract(&event).unwrap_err();
//! assert_eq!(err.to_string(), "field `user.id` is missing");
//! ```

use std::fmt;

use serde_json::{Map, Value};

use super::EventError;
use crate::error::{Error, Result};

// One file per kind of extractor (fields, content, time bucket), the normalization of an
// event before its digest, and the fast path of flat events; the trait and field paths
// they share are here.
mod content;
mod fields;
mod flat;
mod normalize;
#[cfg(test)]
mod tests;
mod time_bucket;

pub use content::ContentHashExtractor;
pub use fields::{CompositeExtractor, FieldExtractor};
pub(crate) use flat::FlatSpec;
pub use normalize::{normalize_amount, normalize_number_amount};
pub use time_bucket::TimeBucketExtractor;

/// Takes the identity of an event (a JSON value) as a string key.
pub trait Extractor: Send + Sync + fmt::Debug {
    /// The key of `event`, or an error naming the field that could not be used.
    fn extract(&self, event: &Value) -> Result<String, EventError>;
}

impl<E: Extractor + ?Sized> Extractor for Box<E> {
    fn extract(&self, event: &Value) -> Result<String, EventError> {
        (**self).extract(event)
    }
}

/// A dotted path to a field: `id`, `data.user.id`; a segment of digits also indexes an
/// array (`items.0.sku`). Field names that contain a dot cannot be addressed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldPath {
    text: String,
    segments: Vec<String>,
}

impl FieldPath {
    /// Parses a dotted path; an empty path or an empty segment (`a..b`) is an error.
    pub fn parse(path: &str) -> Result<Self> {
        let segments: Vec<String> = path.split('.').map(str::to_string).collect();
        if path.is_empty() || segments.iter().any(String::is_empty) {
            return Err(Error::config(format!(
                "field path {path:?} is not a dotted path like `id` or `data.user.id`"
            )));
        }
        Ok(FieldPath {
            text: path.to_string(),
            segments,
        })
    }

    /// The path as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The value at this path in `event`, if there is one.
    pub fn get<'v>(&self, event: &'v Value) -> Option<&'v Value> {
        self.segments.iter().try_fold(event, |v, segment| match v {
            Value::Object(map) => map.get(segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        })
    }

    fn missing(&self) -> EventError {
        EventError::MissingField {
            field: self.text.clone(),
        }
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for FieldPath {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        FieldPath::parse(s)
    }
}

fn paths<I, S>(fields: I) -> Result<Vec<FieldPath>>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    fields
        .into_iter()
        .map(|f| FieldPath::parse(f.as_ref()))
        .collect()
}

fn require_object(event: &Value) -> Result<&Map<String, Value>, EventError> {
    event.as_object().ok_or_else(|| EventError::Malformed {
        message: format!("found {}", kind(event)),
    })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The text of a scalar key field: a string as is, a number as JSON writes it, a boolean
/// as `true`/`false`.
fn scalar_text(path: &FieldPath, event: &Value) -> Result<String, EventError> {
    match path.get(event) {
        None => Err(path.missing()),
        Some(Value::String(s)) if s.is_empty() => Err(EventError::InvalidField {
            field: path.text.clone(),
            reason: "it is an empty string".into(),
        }),
        Some(Value::String(s)) => Ok(super::big_int_digits(s).unwrap_or(s).to_string()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(Value::Bool(b)) => Ok(b.to_string()),
        Some(other) => Err(EventError::WrongType {
            field: path.text.clone(),
            expected: "a string, number or boolean",
            found: kind(other),
        }),
    }
}
