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
use std::time::Duration;

use chrono::DateTime;
use serde_json::{Map, Value};

use super::EventError;
use crate::error::{Error, Result};
use crate::key::{digest_value, HashAlgorithm};

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
fn push_part(key: &mut String, part: &str, separator: &str) {
    if part.contains('\\') || part.contains(separator) {
        let escaped_sep = format!("\\{separator}");
        key.push_str(&part.replace('\\', "\\\\").replace(separator, &escaped_sep));
    } else {
        key.push_str(part);
    }
}

/// The key fields and fingerprint of a [`Deduplicator`](super::dedup::Deduplicator) whose
/// fields are all top-level (its usual shape), for [`FlatSpec::mark`]: the key and
/// fingerprint of a flat event line straight from its text, without building a `Value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FlatSpec {
    /// The key's fields (top-level names), in order.
    pub key: Vec<String>,
    /// Their separator when there are several.
    pub separator: String,
    /// The fingerprint: its algorithm and the top-level fields it leaves out (`None`: no
    /// fingerprint).
    pub fingerprint: Option<(HashAlgorithm, Vec<String>)>,
}

/// A top-level field name of an event line, borrowed from the line when it has no escapes.
#[derive(serde::Deserialize)]
struct FlatName<'a>(#[serde(borrow)] std::borrow::Cow<'a, str>);

/// Whether `raw` (a JSON value's text) is written back unchanged by the canonical encoding:
/// `true`, `false`, `null`, a string without escapes, an integer of up to 18 digits
/// (not `-0`). Others (escapes, fractions, exponents, objects, arrays) are re-encoded.
fn canonical_as_written(raw: &str) -> bool {
    match raw.as_bytes() {
        [b'"', .., b'"'] => !raw.contains('\\'),
        b"true" | b"false" | b"null" => true,
        [b'-', b'0'] => false,
        bytes => {
            let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
            !digits.is_empty() && digits.len() <= 18 && digits.iter().all(u8::is_ascii_digit)
        }
    }
}

/// The top-level fields of a flat event line as (name, value text), sorted by name, a
/// repeated name keeping its last value (as a parsed `Value` does). Refused (an error)
/// when a name has escapes or a value is not written canonically (`canonical_as_written`).
/// A sorted `Vec`, not a map: one allocation a line.
struct FlatFields<'a>(Vec<(&'a str, &'a str)>);

impl<'de> serde::Deserialize<'de> for FlatFields<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = FlatFields<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                use serde::de::Error as _;
                let mut entries: Vec<(&'de str, &'de str)> =
                    Vec::with_capacity(map.size_hint().unwrap_or(8));
                while let Some(FlatName(name)) = map.next_key()? {
                    let value: &'de serde_json::value::RawValue = map.next_value()?;
                    let std::borrow::Cow::Borrowed(name) = name else {
                        return Err(A::Error::custom("a name with escapes"));
                    };
                    if !canonical_as_written(value.get()) {
                        return Err(A::Error::custom("a value the encoding rewrites"));
                    }
                    entries.push((name, value.get()));
                }
                // Stable: a repeated name's entries stay in line order, the last one kept.
                entries.sort_by(|a, b| a.0.cmp(b.0));
                let mut fields: Vec<(&'de str, &'de str)> = Vec::with_capacity(entries.len());
                for entry in entries {
                    match fields.last_mut() {
                        Some(last) if last.0 == entry.0 => *last = entry,
                        _ => fields.push(entry),
                    }
                }
                Ok(FlatFields(fields))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

impl FlatSpec {
    /// The spec of `key` fields and a `fingerprint`, when every field of both is top-level
    /// and the fingerprint covers every field but some (no include list, no amounts).
    pub fn new(
        key: &[FieldPath],
        separator: &str,
        fingerprint: Option<&ContentHashExtractor>,
    ) -> Option<Self> {
        let top = |paths: &[FieldPath]| -> Option<Vec<String>> {
            paths
                .iter()
                .map(|p| (p.segments.len() == 1).then(|| p.segments[0].clone()))
                .collect()
        };
        let fingerprint = match fingerprint {
            None => None,
            Some(f) if f.include.is_none() && f.amounts.is_empty() => {
                Some((f.algorithm, top(&f.exclude)?))
            }
            Some(_) => return None,
        };
        Some(FlatSpec {
            key: top(key)?,
            separator: separator.to_string(),
            fingerprint,
        })
    }

    /// The key and fingerprint of the event on `line`, exactly as the extractors take them
    /// from its parsed `Value`, when the line is an object whose names have no escapes and
    /// whose values are all written canonically (see `canonical_as_written`) and the key's
    /// fields are plain strings, integers or booleans. `None`: anything else (also every
    /// line that is not such an object, or not JSON): take the `Value` path, which also
    /// names the problem.
    pub fn mark(&self, line: &str) -> Option<(String, Option<String>)> {
        let FlatFields(entries) = serde_json::from_str(line).ok()?;
        let field = |name: &str| -> Option<&str> {
            let i = entries.binary_search_by(|(n, _)| (*n).cmp(name)).ok()?;
            match entries[i].1 {
                "null" | "\"\"" => None,
                raw => Some(raw.strip_prefix('"').map_or(raw, |s| &s[..s.len() - 1])),
            }
        };
        let key = match self.key.as_slice() {
            [one] => field(one)?.to_string(),
            many => {
                let mut key = String::new();
                for (i, name) in many.iter().enumerate() {
                    if i > 0 {
                        key.push_str(&self.separator);
                    }
                    push_part(&mut key, field(name)?, &self.separator);
                }
                key
            }
        };
        let fingerprint = self.fingerprint.as_ref().map(|(algorithm, exclude)| {
            crate::key::digest_raw_entries(
                entries
                    .iter()
                    .filter(|(name, _)| !exclude.iter().any(|x| x == name))
                    .copied(),
                *algorithm,
            )
        });
        Some((key, fingerprint))
    }
}

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
    include: Option<Vec<FieldPath>>,
    exclude: Vec<FieldPath>,
    amounts: Vec<FieldPath>,
    algorithm: HashAlgorithm,
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
                    Value::String(s) => match super::big_int_digits(s) {
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

fn get_mut_at<'v>(target: &'v mut Value, segments: &[String]) -> Option<&'v mut Value> {
    let mut at = target;
    for segment in segments {
        at = match at {
            Value::Object(map) => map.get_mut(segment)?,
            Value::Array(items) => items.get_mut(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(at)
}

/// The canonical text of a money amount given as a JSON **number** (which may carry an
/// exponent: `1.005e2`), as [`normalize_amount`] writes it.
pub fn normalize_number_amount(text: &str) -> std::result::Result<String, String> {
    normalize(text, true)
}

/// The canonical text of a money amount (seed 004: "numeric scale 2"): an optional sign,
/// an optional `$`, digits with an optional fraction (and, for JSON numbers, an exponent:
/// see [`normalize_number_amount`]; a string such as `"1e2"` is refused),
/// written back as `[-]INTEGER.FRACTION` with no leading zeros and at least two fraction
/// digits. `"100.5"`, `"$100.50"`, `" 100.500 "`, `100.5` and `1.005e2` all give
/// `"100.50"`; `"-$0.00"` gives `"0.00"`.
///
/// Digits beyond the second decimal are **kept**, not rounded (`"100.505"` stays
/// `"100.505"`): rounding would make two different amounts the same payload and turn a
/// conflict into a replay. Thousands separators and other currencies are refused (is
/// `1,500` one and a half or fifteen hundred?).
///
/// ```
/// use idem::events::extract::normalize_amount;
/// assert_eq!(normalize_amount("$100.5").unwrap(), "100.50");
/// assert_eq!(normalize_amount("0100.500").unwrap(), "100.50");
/// assert_eq!(normalize_amount("100.505").unwrap(), "100.505");
/// assert!(normalize_amount("1,500").is_err());
/// ```
pub fn normalize_amount(text: &str) -> std::result::Result<String, String> {
    normalize(text, false)
}

fn normalize(text: &str, exponent_allowed: bool) -> std::result::Result<String, String> {
    let bad = |why: &str| format!("{text:?} is not an amount ({why})");
    let mut s = text.trim();
    let mut negative = false;
    if let Some(rest) = s.strip_prefix('-') {
        negative = true;
        s = rest;
    } else if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    s = s.strip_prefix('$').unwrap_or(s);
    let only_digits = "only digits, one `.`, an optional sign and `$` are allowed";
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(_) if !exponent_allowed => return Err(bad(only_digits)),
        Some(at) if !s[..at].bytes().all(|b| b.is_ascii_digit() || b == b'.') => {
            return Err(bad(only_digits))
        }
        Some(at) => {
            let exp: i32 = s[at + 1..]
                .parse()
                .ok()
                .filter(|e: &i32| e.abs() <= 64)
                .ok_or_else(|| bad("bad exponent"))?;
            (&s[..at], exp)
        }
        None => (s, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() && frac.is_empty() {
        return Err(bad("no digits"));
    }
    if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return Err(bad(
            "only digits, one `.`, an optional sign and `$` are allowed",
        ));
    }
    // All digits, and where the decimal point falls among them.
    let mut digits: Vec<u8> = int.bytes().chain(frac.bytes()).collect();
    let mut point = int.len() as i64 + exponent as i64;
    if point < 0 {
        let pad = (-point) as usize;
        digits.splice(0..0, std::iter::repeat_n(b'0', pad));
        point = 0;
    }
    let point = point as usize;
    if point > digits.len() {
        digits.resize(point, b'0');
    }
    let (int, frac) = digits.split_at(point);
    let int = match int.iter().position(|&b| b != b'0') {
        Some(first) => &int[first..],
        None => b"0".as_slice(),
    };
    let mut frac = frac.to_vec();
    while frac.len() > 2 && frac.last() == Some(&b'0') {
        frac.pop();
    }
    frac.resize(frac.len().max(2), b'0');
    let zero = int == b"0" && frac.iter().all(|&b| b == b'0');
    let mut out = String::with_capacity(int.len() + frac.len() + 2);
    if negative && !zero {
        out.push('-');
    }
    out.push_str(std::str::from_utf8(int).expect("ASCII digits"));
    out.push('.');
    out.push_str(std::str::from_utf8(&frac).expect("ASCII digits"));
    Ok(out)
}

fn insert_at(target: &mut Value, segments: &[String], value: Value) {
    let Some((last, parents)) = segments.split_last() else {
        return;
    };
    let mut at = target;
    for segment in parents {
        let map = at.as_object_mut().expect("built from objects");
        at = map
            .entry(segment.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if !at.is_object() {
            // A shorter included path already holds this whole value.
            return;
        }
    }
    at.as_object_mut()
        .expect("built from objects")
        .insert(last.clone(), value);
}

fn remove_at(target: &mut Value, segments: &[String]) {
    let Some((last, parents)) = segments.split_last() else {
        return;
    };
    let mut at = target;
    for segment in parents {
        at = match at {
            Value::Object(map) => match map.get_mut(segment) {
                Some(v) => v,
                None => return,
            },
            Value::Array(items) => {
                match segment.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                    Some(v) => v,
                    None => return,
                }
            }
            _ => return,
        };
    }
    match at {
        Value::Object(map) => {
            map.remove(last);
        }
        Value::Array(items) => {
            if let Some(i) = last.parse::<usize>().ok().filter(|i| *i < items.len()) {
                items.remove(i);
            }
        }
        _ => {}
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn field_paths_reach_nested_values_and_name_the_field_when_they_cannot() {
        let event = json!({"id": 42, "ok": true, "data": {"user": {"id": "u-1"}, "items": [{"sku": "s-9"}]},
                           "empty": "", "nothing": null, "list": [1]});
        let get = |p: &str| FieldExtractor::new(p).unwrap().extract(&event);
        assert_eq!(get("id").unwrap(), "42");
        assert_eq!(get("ok").unwrap(), "true");
        assert_eq!(get("data.user.id").unwrap(), "u-1");
        assert_eq!(get("data.items.0.sku").unwrap(), "s-9");
        assert_eq!(
            get("data.items.1.sku").unwrap_err(),
            EventError::MissingField {
                field: "data.items.1.sku".into()
            }
        );
        assert_eq!(
            get("data.user").unwrap_err().to_string(),
            "field `data.user` is an object, expected a string, number or boolean"
        );
        assert_eq!(
            get("nothing").unwrap_err().to_string(),
            "field `nothing` is null, expected a string, number or boolean"
        );
        assert_eq!(
            get("empty").unwrap_err().to_string(),
            "field `empty` is invalid: it is an empty string"
        );
        assert_eq!(get("list").unwrap_err().field(), Some("list"));
        assert!(matches!(
            FieldExtractor::new("id").unwrap().extract(&json!([1])),
            Err(EventError::Malformed { .. })
        ));
        for bad in ["", ".", "a..b", "a."] {
            assert!(FieldExtractor::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn composite_joins_in_order_and_escapes_the_separator() {
        let key = CompositeExtractor::new(["tenant", "user.id", "n"], "::").unwrap();
        assert_eq!(
            key.extract(&json!({"tenant": "acme", "user": {"id": "u1"}, "n": 3}))
                .unwrap(),
            "acme::u1::3"
        );
        let a = key
            .extract(&json!({"tenant": "a::b", "user": {"id": "c"}, "n": 1}))
            .unwrap();
        let b = key
            .extract(&json!({"tenant": "a", "user": {"id": "b::c"}, "n": 1}))
            .unwrap();
        assert_eq!(a, r"a\::b::c::1");
        assert_ne!(a, b);
        let c = key
            .extract(&json!({"tenant": "a\\", "user": {"id": "x"}, "n": 1}))
            .unwrap();
        assert_eq!(c, r"a\\::x::1");
        assert_eq!(
            key.extract(&json!({"tenant": "acme", "n": 3}))
                .unwrap_err()
                .to_string(),
            "field `user.id` is missing"
        );
        assert!(CompositeExtractor::new(Vec::<&str>::new(), ":").is_err());
        assert!(CompositeExtractor::new(["a"], "").is_err());
        assert!(CompositeExtractor::new(["a"], "\\").is_err());
    }

    #[test]
    fn content_hash_covers_included_minus_excluded_fields() {
        let event = json!({"id": "e1", "timestamp": "2025-11-18T09:00:00Z",
                           "amount": "10.00", "meta": {"source": "feed", "seq": 7}});
        let all = ContentHashExtractor::new();
        assert_eq!(
            all.extract(&event).unwrap(),
            crate::digest_value(&event, HashAlgorithm::Sha256)
        );
        let without = ContentHashExtractor::new()
            .exclude(["id", "timestamp", "meta.seq"])
            .unwrap();
        assert_eq!(
            without.content(&event).unwrap(),
            json!({"amount": "10.00", "meta": {"source": "feed"}})
        );
        let only = ContentHashExtractor::new()
            .include(["amount", "meta.source", "absent"])
            .unwrap()
            .algorithm(HashAlgorithm::Md5);
        assert_eq!(
            only.content(&event).unwrap(),
            json!({"amount": "10.00", "meta": {"source": "feed"}})
        );
        let md5 = only.extract(&event).unwrap();
        assert_eq!(md5.len(), 32);
        assert_eq!(
            md5,
            crate::digest_value(
                &json!({"amount": "10.00", "meta": {"source": "feed"}}),
                HashAlgorithm::Md5
            )
        );
        // Key order in the input does not matter; a changed value does.
        let reordered: Value = serde_json::from_str(
            r#"{"meta": {"seq": 8, "source": "feed"}, "amount": "10.00", "timestamp": "x", "id": "e2"}"#,
        )
        .unwrap();
        assert_eq!(
            without.extract(&reordered).unwrap(),
            without.extract(&event).unwrap()
        );
        let changed = json!({"amount": "10.01", "meta": {"source": "feed"}});
        assert_ne!(
            without.extract(&changed).unwrap(),
            without.extract(&event).unwrap()
        );
        assert!(matches!(
            all.extract(&json!("text")),
            Err(EventError::Malformed { .. })
        ));
    }

    #[test]
    fn time_bucket_uses_the_event_timestamp_not_the_clock() {
        let hourly = TimeBucketExtractor::new(
            "at",
            Duration::from_secs(3600),
            FieldExtractor::new("id").unwrap(),
        )
        .unwrap();
        // An event from 1970: with the seed's wall-clock bucket this would be "now".
        assert_eq!(
            hourly
                .extract(&json!({"at": "1970-01-01T01:30:00Z", "id": "a"}))
                .unwrap(),
            "1:a"
        );
        assert_eq!(
            hourly
                .extract(&json!({"at": "1969-12-31T23:59:59Z", "id": "a"}))
                .unwrap(),
            "-1:a"
        );
        let t = "2025-11-18T09:59:59.999999Z";
        let expected = DateTime::parse_from_rfc3339(t).unwrap().timestamp() / 3600;
        assert_eq!(
            hourly.extract(&json!({"at": t, "id": "a"})).unwrap(),
            format!("{expected}:a")
        );
        assert_eq!(
            hourly.extract(&json!({"id": "a"})).unwrap_err().to_string(),
            "field `at` is missing"
        );
        assert_eq!(
            hourly
                .extract(&json!({"at": 1763456400, "id": "a"}))
                .unwrap_err()
                .to_string(),
            "field `at` is a number, expected an RFC 3339 timestamp string"
        );
        assert_eq!(
            hourly
                .extract(&json!({"at": "yesterday", "id": "a"}))
                .unwrap_err()
                .field(),
            Some("at")
        );
        // The inner extractor's failure names its own field.
        assert_eq!(
            hourly.extract(&json!({"at": t})).unwrap_err().to_string(),
            "field `id` is missing"
        );
        assert!(
            TimeBucketExtractor::new("at", Duration::ZERO, ContentHashExtractor::new()).is_err()
        );
    }

    #[test]
    fn extractors_work_behind_a_box() {
        let boxed: Vec<Box<dyn Extractor>> = vec![
            Box::new(FieldExtractor::new("id").unwrap()),
            Box::new(ContentHashExtractor::new()),
        ];
        let event = json!({"id": "x"});
        assert_eq!(boxed[0].extract(&event).unwrap(), "x");
        assert_eq!(boxed[1].extract(&event).unwrap().len(), 64);
    }
}

#[cfg(test)]
mod amount_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_in_place_digest_equals_the_digest_of_the_content() {
        let events = [
            json!({"id": 1, "b": [1, {"z": 1, "a": null}], "a": "x", "é": 1.5}),
            json!({"z": 1, "id": "k", "customer_id": "c"}),
            json!({"id": 1}),
            json!({}),
        ];
        for exclude in [vec![], vec!["id"], vec!["id", "customer_id", "nope"]] {
            for algorithm in [HashAlgorithm::Sha256, HashAlgorithm::Md5] {
                let spec = ContentHashExtractor::new()
                    .exclude(&exclude)
                    .unwrap()
                    .algorithm(algorithm);
                for e in &events {
                    assert_eq!(
                        spec.extract(e).unwrap(),
                        digest_value(&spec.content(e).unwrap(), algorithm),
                        "{e} without {exclude:?}"
                    );
                }
                assert!(spec.extract(&json!([1])).is_err());
            }
        }
    }

    #[test]
    fn amounts_equal_as_numbers_are_one_text() {
        for (given, want) in [
            ("100.5", "100.50"),
            ("$100.50", "100.50"),
            ("100.500", "100.50"),
            ("0100.5", "100.50"),
            ("+$100.5", "100.50"),
            ("-$3.1", "-3.10"),
            ("-0", "0.00"),
            (".5", "0.50"),
            ("7", "7.00"),
            ("100.505", "100.505"),
        ] {
            assert_eq!(normalize_amount(given).unwrap(), want, "{given}");
        }
        // Exponents are a JSON number's notation, not an amount's text (issue 21.11).
        for (given, want) in [("1.005e2", "100.50"), ("5e-3", "0.005"), ("1e2", "100.00")] {
            assert_eq!(normalize_number_amount(given).unwrap(), want, "{given}");
            let e = normalize_amount(given).unwrap_err();
            assert!(e.contains("only digits, one `.`"), "{e}");
        }
        for bad in ["", "$", "1,500", "€5", "1.2.3", "12abc", "1e999"] {
            let e = normalize_amount(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn normalized_fingerprints_make_replays_of_equal_amounts() {
        let spec = ContentHashExtractor::new()
            .exclude(["id"])
            .unwrap()
            .normalize_amounts(["load_amount"])
            .unwrap();
        let fp = |v: Value| spec.extract(&v);
        let a = fp(json!({"id": 1, "load_amount": "100.5"})).unwrap();
        assert_eq!(fp(json!({"id": 2, "load_amount": "$100.50"})).unwrap(), a);
        assert_eq!(fp(json!({"id": 3, "load_amount": 100.50})).unwrap(), a);
        assert_ne!(fp(json!({"id": 4, "load_amount": "100.51"})).unwrap(), a);
        // Without the option the texts differ.
        let plain = ContentHashExtractor::new().exclude(["id"]).unwrap();
        assert_ne!(
            plain.extract(&json!({"load_amount": "100.5"})).unwrap(),
            plain.extract(&json!({"load_amount": "$100.50"})).unwrap()
        );
        assert_eq!(
            fp(json!({"load_amount": "ten"})).unwrap_err().to_string(),
            "field `load_amount` is invalid: \"ten\" is not an amount (only digits, one `.`, an optional sign and `$` are allowed)"
        );
        assert!(fp(json!({"load_amount": null})).is_ok());
        assert_eq!(
            fp(json!({"load_amount": [1]})).unwrap_err().to_string(),
            "field `load_amount` is an array, expected an amount (a string or a number)"
        );
    }
}

#[cfg(test)]
mod flat_tests {
    use super::*;

    /// Lines of every shape: plain ones (the fast path takes them) and ones it must leave
    /// to the `Value` path (escapes, fractions, exponents, `-0`, long integers, nesting,
    /// missing, null, empty or non-scalar key fields, not objects, not JSON).
    const LINES: &[&str] = &[
        r#"{"id":"a","v":1}"#,
        r#"{"v":1,"id":"a"}"#,
        r#"{"id":"a","v":1.0}"#,
        r#"{"id":"a","v":-0}"#,
        r#"{"id":"a","v":-12,"w":0}"#,
        r#"{"id":"b","v":"\u00e9"}"#,
        r#"{"id":"b","v":"é","w":"a/b"}"#,
        r#"{"id":"b","v":"a\/b"}"#,
        r#"{"id":"c","v":123456789012345678}"#,
        r#"{"id":"c","v":1234567890123456789}"#,
        r#"{"id":"c","v":123456789012345678901}"#,
        r#"{"id":"d","n":{"x":1,"a":2}}"#,
        r#"{"id":"e","v":true,"w":null,"x":false}"#,
        r#"{"id":"f\"q","v":1}"#,
        r#"{"i\u0064":"g","v":1}"#,
        r#"{"id":7,"v":"x","v":"y"}"#,
        r#"{"id":"a","v":1,"id":"b","v":2}"#,
        r#"{"id":true}"#,
        r#"{"id":null}"#,
        r#"{"id":""}"#,
        r#"{"id":[1]}"#,
        r#"{"v":1}"#,
        r#"{"id":"h","v":1e2}"#,
        r#"{"id":"x:y","customer_id":"z\\w"}"#,
        r#"{"id":"x","customer_id":"y:z"}"#,
        r#"{"id":"x","customer_id":5,"load_amount":"$1.00","time":"2000-01-01T00:00:00Z"}"#,
        r#"{ "id" : "spaced" , "v" : [ 1 , 2 ] }"#,
        r#"{}"#,
        r#"[1,2]"#,
        r#""id""#,
        r#"not json"#,
        r#"{"id":"k"} trailing"#,
    ];

    /// Whatever the fast path answers equals what the extractors take from the parsed
    /// event, for one key field, several, and the fingerprint in both algorithms.
    #[test]
    fn the_flat_mark_equals_the_extractors_whenever_it_answers() {
        let mut answered = 0;
        for (fields, algorithm) in [
            (vec!["id"], HashAlgorithm::Sha256),
            (vec!["id", "customer_id"], HashAlgorithm::Md5),
        ] {
            let paths: Vec<FieldPath> = fields
                .iter()
                .map(|f| FieldPath::parse(f).unwrap())
                .collect();
            let hash = ContentHashExtractor::new()
                .exclude(&fields)
                .unwrap()
                .algorithm(algorithm);
            let key: Box<dyn Extractor> = match fields.as_slice() {
                [one] => Box::new(FieldExtractor::new(one).unwrap()),
                many => Box::new(CompositeExtractor::new(many, ":").unwrap()),
            };
            let spec = FlatSpec::new(&paths, ":", Some(&hash)).unwrap();
            for line in LINES {
                let Some((k, f)) = spec.mark(line) else {
                    continue;
                };
                answered += 1;
                let event: Value = serde_json::from_str(line).unwrap();
                assert_eq!(k, key.extract(&event).unwrap(), "key of {line}");
                assert_eq!(
                    f.unwrap(),
                    hash.extract(&event).unwrap(),
                    "fingerprint of {line}"
                );
            }
        }
        assert!(answered >= 12, "the fast path took {answered} lines");
    }

    #[test]
    fn lines_the_fast_path_must_leave_to_the_value_path() {
        let paths = [FieldPath::parse("id").unwrap()];
        let hash = ContentHashExtractor::new().exclude(["id"]).unwrap();
        let spec = FlatSpec::new(&paths, ":", Some(&hash)).unwrap();
        for line in [
            r#"{"id":"a","v":1.0}"#,
            r#"{"id":"a","v":-0}"#,
            r#"{"id":"b","v":"\u00e9"}"#,
            r#"{"i\u0064":"g","v":1}"#,
            r#"{"id":"c","v":1234567890123456789}"#,
            r#"{"id":"d","n":{"x":1}}"#,
            r#"{"id":null}"#,
            r#"{"id":""}"#,
            r#"{"v":1}"#,
            r#"[1,2]"#,
            r#"{"id":"k"} trailing"#,
        ] {
            assert_eq!(spec.mark(line), None, "{line}");
        }
        // Nested key or fingerprint fields, an include list or amounts: no fast path.
        let nested = [FieldPath::parse("a.id").unwrap()];
        assert!(FlatSpec::new(&nested, ":", Some(&hash)).is_none());
        let amounts = ContentHashExtractor::new()
            .normalize_amounts(["v"])
            .unwrap();
        assert!(FlatSpec::new(&paths, ":", Some(&amounts)).is_none());
        let include = ContentHashExtractor::new().include(["v"]).unwrap();
        assert!(FlatSpec::new(&paths, ":", Some(&include)).is_none());
    }
}
