//! Event-level idempotency: identities and fingerprints of single events.
//!
//! idem's guards work per scope (a job and a date). Jobs that ingest event streams or
//! files also need to recognise one event, or one set of events, seen before. This module
//! holds the pure parts of that, which need no store:
//!
//! * [`fingerprint()`]: one SHA-256 value for a set of trade events, byte-compatible with
//!   the Python services that already compute it (seed 000), so a Rust service and a
//!   Python one agree on "the same events";
//! * [`extract`]: how one event's identity (its dedup key) is taken from it: a field, a
//!   composite of fields, a content hash, a time bucket of the event's own timestamp;
//! * [`dedup`]: the one part that needs a store — [`dedup::Deduplicator`] checks and marks
//!   events on an [`EventKeyStore`](crate::store::EventKeyStore): new, replay (same key,
//!   same payload) or conflict (same key, different payload), with TTLs.
//!
//! Every problem with an event is an [`EventError`] naming the field; lists of events wrap
//! it in an [`InvalidEvent`] naming the event's position, so a bad line in a file of a
//! million is found at once.

pub mod cache;
pub mod dedup;
pub mod extract;
pub mod fingerprint;
pub mod strategy;
pub mod stream;

pub use extract::{
    CompositeExtractor, ContentHashExtractor, Extractor, FieldExtractor, FieldPath,
    TimeBucketExtractor,
};
pub use fingerprint::{fingerprint, fingerprint_json, signature_json, EventSignature};

/// What is wrong with one event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// The event is not a JSON object (or not JSON at all).
    #[error("not a JSON object: {message}")]
    Malformed {
        /// The parser's message.
        message: String,
    },
    /// A field the event needs is absent (`null` is a [`EventError::WrongType`]).
    #[error("field `{field}` is missing")]
    MissingField {
        /// The field, as a dotted path for nested fields.
        field: String,
    },
    /// A field holds the wrong kind of JSON value.
    #[error("field `{field}` is {found}, expected {expected}")]
    WrongType {
        /// The field.
        field: String,
        /// What it must be (`a string`, `an integer`…).
        expected: &'static str,
        /// What it is (`a number`, `null`…).
        found: &'static str,
    },
    /// A field has the right kind but an unusable value.
    #[error("field `{field}` is invalid: {reason}")]
    InvalidField {
        /// The field.
        field: String,
        /// Why, quoting the value.
        reason: String,
    },
}

impl EventError {
    /// The field the error is about, if it is about one.
    pub fn field(&self) -> Option<&str> {
        match self {
            EventError::Malformed { .. } => None,
            EventError::MissingField { field }
            | EventError::WrongType { field, .. }
            | EventError::InvalidField { field, .. } => Some(field),
        }
    }

    /// Places the error at the `position`-th event (1-based) of a list.
    pub fn at(self, position: usize) -> InvalidEvent {
        InvalidEvent {
            position,
            error: self,
        }
    }
}

/// An [`EventError`] at a position in a list of events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event {position}: {error}")]
pub struct InvalidEvent {
    /// 1-based position of the event in the list given.
    pub position: usize,
    /// What is wrong with it.
    #[source]
    pub error: EventError,
}

/// How a JSON value's kind is named in error messages.
pub(crate) fn json_kind_of_raw(raw: &str) -> &'static str {
    // `not json` starts like `null`: name the kind only of what is JSON.
    if serde_json::from_str::<serde::de::IgnoredAny>(raw).is_err() {
        return "text that is not JSON";
    }
    match raw.as_bytes().first() {
        Some(b'"') => "a string",
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        Some(b'-' | b'0'..=b'9') => "a number",
        _ => "not a value",
    }
}
