//! Keys per time bucket: another extractor's key prefixed with the bucket of the event's
//! own timestamp.

use std::time::Duration;

use chrono::DateTime;
use serde_json::Value;

use super::{kind, require_object, Extractor, FieldPath};
use crate::error::{Error, Result};
use crate::events::EventError;

/// Another extractor's key prefixed with the time bucket of the **event's own
/// timestamp**: `{bucket}:{key}`, where `bucket` is the number of whole `width`s since
/// 1970-01-01T00:00:00Z (the seed's format). The seed took the bucket from the wall
/// clock, so a retry in the next bucket got a new key; here the same event always gets
/// the same key, whenever it is checked.
///
/// ```
/// use std::time::Duration;
/// use idem::events::{ContentHashExtractor, Extractor, TimeBucketExtractor};
/// use serde_json::json;
/// let inner = ContentHashExtractor::new().exclude(["timestamp"]).unwrap();
/// let hourly = TimeBucketExtractor::new("timestamp", Duration::from_secs(3600), inner).unwrap();
/// let at = |t: &str| hourly.extract(&json!({"timestamp": t, "amount": 5})).unwrap();
/// assert_eq!(at("2025-11-18T09:10:00Z"), at("2025-11-18T10:59:59+01:00"));
/// assert_ne!(at("2025-11-18T09:10:00Z"), at("2025-11-18T10:00:00Z"));
/// assert!(at("2025-11-18T09:10:00Z").starts_with("489849:"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeBucketExtractor<E> {
    field: FieldPath,
    width_micros: i64,
    inner: E,
}

impl<E: Extractor> TimeBucketExtractor<E> {
    /// Buckets of `width` (at least a microsecond) by the RFC 3339 timestamp at `field`.
    pub fn new(field: &str, width: Duration, inner: E) -> Result<Self> {
        let width_micros = i64::try_from(width.as_micros())
            .ok()
            .filter(|w| *w > 0)
            .ok_or_else(|| {
                Error::config(format!(
                    "time bucket width {width:?} must be between 1µs and 292,000 years"
                ))
            })?;
        Ok(TimeBucketExtractor {
            field: FieldPath::parse(field)?,
            width_micros,
            inner,
        })
    }

    /// The bucket number of `event`: whole widths since the Unix epoch.
    pub fn bucket(&self, event: &Value) -> Result<i64, EventError> {
        require_object(event)?;
        let text = match self.field.get(event) {
            None => return Err(self.field.missing()),
            Some(Value::String(s)) => s,
            Some(other) => {
                return Err(EventError::WrongType {
                    field: self.field.text.clone(),
                    expected: "an RFC 3339 timestamp string",
                    found: kind(other),
                })
            }
        };
        let at = DateTime::parse_from_rfc3339(text).map_err(|_| EventError::InvalidField {
            field: self.field.text.clone(),
            reason: format!(
                "{text:?} is not an RFC 3339 time with a UTC offset (e.g. 2025-11-18T09:00:00Z)"
            ),
        })?;
        Ok(at.timestamp_micros().div_euclid(self.width_micros))
    }
}

impl<E: Extractor> Extractor for TimeBucketExtractor<E> {
    fn extract(&self, event: &Value) -> Result<String, EventError> {
        let bucket = self.bucket(event)?;
        Ok(format!("{bucket}:{}", self.inner.extract(event)?))
    }
}
