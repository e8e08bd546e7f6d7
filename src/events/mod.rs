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

pub(crate) use crate::key::big_int_digits;

/// The first name an object of the JSON text `text` repeats, at any depth (`None` when
/// none does, or when `text` is not JSON). JSON parsers disagree on which of the values
/// counts (serde_json and Python keep the last, others the first), so such a line is
/// `invalid` rather than read one way here and another by its consumer.
pub(crate) fn repeated_name(text: &str) -> Option<String> {
    use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
    struct Walk(Option<String>);
    impl<'de> Deserialize<'de> for Walk {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(WalkVisitor)
        }
    }
    struct WalkVisitor;
    impl<'de> Visitor<'de> for WalkVisitor {
        type Value = Walk;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_bool<E>(self, _: bool) -> Result<Walk, E> {
            Ok(Walk(None))
        }
        fn visit_i64<E>(self, _: i64) -> Result<Walk, E> {
            Ok(Walk(None))
        }
        fn visit_u64<E>(self, _: u64) -> Result<Walk, E> {
            Ok(Walk(None))
        }
        fn visit_f64<E>(self, _: f64) -> Result<Walk, E> {
            Ok(Walk(None))
        }
        fn visit_str<E>(self, _: &str) -> Result<Walk, E> {
            Ok(Walk(None))
        }
        fn visit_unit<E>(self) -> Result<Walk, E> {
            Ok(Walk(None))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Walk, A::Error> {
            let mut found = None;
            while let Some(Walk(inner)) = seq.next_element::<Walk>()? {
                found = found.or(inner);
            }
            Ok(Walk(found))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Walk, A::Error> {
            let mut seen = std::collections::HashSet::new();
            let mut found = None;
            while let Some(name) = map.next_key::<String>()? {
                let Walk(inner) = map.next_value::<Walk>()?;
                found = found.or(inner);
                if found.is_none() && seen.contains(&name) {
                    found = Some(name);
                } else {
                    seen.insert(name);
                }
            }
            Ok(Walk(found))
        }
    }
    serde_json::from_str::<Walk>(text).ok().and_then(|w| w.0)
}

/// Parses an event line as JSON with numbers compared as Python's `json` compares them:
/// an integer beyond 64 bits is kept exactly ([`crate::key::BIG_INT_MARK`]), and a negative zero
/// (`-0`, `-0.0`) is the zero it equals. Lines without such numbers (nearly all) parse as
/// they are.
pub(crate) fn parse_event_line(text: &str) -> serde_json::Result<serde_json::Value> {
    match rewrite_exact_numbers(text) {
        None => serde_json::from_str(text),
        Some(rewritten) => serde_json::from_str(&rewritten),
    }
}

/// `text` with every integer token beyond 64 bits turned into a marked string and every
/// negative zero made positive; `None` when there is nothing to rewrite (or the text is
/// not JSON enough to scan: the parse then reports it).
fn rewrite_exact_numbers(text: &str) -> Option<String> {
    let b = text.as_bytes();
    // Quick exit: no run of 19+ digits and no `-0`.
    let mut run = 0usize;
    let mut maybe = false;
    for (i, &c) in b.iter().enumerate() {
        if c.is_ascii_digit() {
            run += 1;
            if run >= 19 || (c == b'0' && run == 1 && i > 0 && b[i - 1] == b'-') {
                maybe = true;
                break;
            }
        } else {
            run = 0;
        }
    }
    if !maybe {
        return None;
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut changed = false;
    let mut i = 0;
    let mut in_string = false;
    while i < b.len() {
        let c = b[i];
        if in_string {
            if c == b'\\' {
                // The backslash and the whole character it escapes.
                let end = if i + 1 < b.len() {
                    char_end(text, i + 1)
                } else {
                    b.len()
                };
                out.push_str(&text[i..end]);
                i = end;
                continue;
            }
            if c == b'"' {
                in_string = false;
            }
            let end = char_end(text, i);
            out.push_str(&text[i..end]);
            i = end;
            continue;
        }
        if c == b'"' {
            in_string = true;
            out.push('"');
            i += 1;
            continue;
        }
        if c == b'-' || c.is_ascii_digit() {
            let start = i;
            let mut j = i + 1;
            while j < b.len()
                && (b[j].is_ascii_digit() || matches!(b[j], b'.' | b'e' | b'E' | b'+' | b'-'))
            {
                j += 1;
            }
            let token = &text[start..j];
            let digits = token.strip_prefix('-').unwrap_or(token);
            let integer = !digits.is_empty() && digits.bytes().all(|d| d.is_ascii_digit());
            let mantissa_zero = digits
                .split(['e', 'E'])
                .next()
                .is_some_and(|m| !m.is_empty() && m.bytes().all(|d| d == b'0' || d == b'.'));
            if token.starts_with('-') && mantissa_zero {
                out.push_str(&token[1..]);
                changed = true;
            } else if integer && token.parse::<i64>().is_err() && token.parse::<u64>().is_err() {
                out.push('"');
                out.push_str("\\u0000int:");
                out.push_str(token);
                out.push('"');
                changed = true;
            } else {
                out.push_str(token);
            }
            i = j;
            continue;
        }
        let end = char_end(text, i);
        out.push_str(&text[i..end]);
        i = end;
    }
    changed.then_some(out)
}

/// Where the character starting at byte `i` of `text` ends (`i` is on a character
/// boundary: the scan above always steps over whole characters).
fn char_end(text: &str, i: usize) -> usize {
    i + text[i..].chars().next().map_or(1, char::len_utf8)
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

#[cfg(test)]
mod number_tests {
    use super::parse_event_line;
    use serde_json::json;

    /// A line with a number to rewrite and characters of every UTF-8 length, inside and
    /// outside strings and after a backslash, parses to what it says (or is refused as not
    /// JSON), never a panic and never a changed character.
    #[test]
    fn rewriting_numbers_keeps_every_character_whole() {
        let line = r#"{"é":"ü\\𞀠 హ","v":-0,"big":123456789012345678901234567890,"k":"\u00e9"}"#;
        let v = parse_event_line(line).unwrap();
        assert_eq!(v["é"], json!("ü\\𞀠 హ"));
        assert_eq!(v["v"], json!(0));
        assert_eq!(v["k"], json!("é"));
        for bad in [r#"V&-0\హᦛ"¥L𞀠:"#, "-0\\", "-0 é", "\"-0\\హ", "-0\"\\"] {
            assert!(parse_event_line(bad).is_err(), "{bad}");
        }
    }
}
