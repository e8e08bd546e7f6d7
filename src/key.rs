//! Processing keys: digests of canonical JSON.
//!
//! A content key must be the same for the same content whichever process, machine or day
//! computes it, so the JSON is canonical: object keys sorted, entity lists and row sets
//! sorted, no insignificant whitespace, and never a wall-clock value. The bytes are fed to
//! the digest as they are produced (no intermediate string), which keeps hashing close to
//! the raw digest's throughput.

use std::collections::BTreeMap;
use std::io::{self, Write};

use md5::Md5;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The digest behind processing keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum HashAlgorithm {
    /// MD5, 32 hex characters (as the BigQuery seed's `processing_key`).
    Md5,
    /// SHA-256, 64 hex characters.
    #[default]
    Sha256,
}

impl std::str::FromStr for HashAlgorithm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "md5" => Ok(HashAlgorithm::Md5),
            "sha256" => Ok(HashAlgorithm::Sha256),
            _ => Err(Error::config(format!(
                "unknown hash {s:?}: expected md5 or sha256"
            ))),
        }
    }
}

/// What a run would consume: entity ids, counts, a source checksum, rows from a query.
///
/// Two descriptions with the same fields and the same entities (in any order) produce the
/// same key.
///
/// ```
/// use idem::{Content, HashAlgorithm};
/// let a = Content::new().entities(["p2", "p1"]).field("source_rows", 450);
/// let b = Content::new().field("source_rows", 450).entities(["p1", "p2"]);
/// assert_eq!(
///     a.key("player_game_summary", "2025-11-18", HashAlgorithm::Md5),
///     b.key("player_game_summary", "2025-11-18", HashAlgorithm::Md5),
/// );
/// assert_eq!(a.key("p", "2025-11-18", HashAlgorithm::Md5).len(), 32);
/// ```
///
/// Each field is encoded canonically once, when it is added (sorting rows needs their
/// encoding anyway), so computing the key afterwards only streams those bytes into the
/// digest.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Content {
    fields: BTreeMap<String, Field>,
    entity_count: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
struct Field {
    value: Value,
    canonical: Vec<u8>,
}

impl Field {
    fn new(value: Value) -> Self {
        let mut canonical = Vec::new();
        write_canonical(&mut canonical, &value).expect("writing to a Vec cannot fail");
        Field { value, canonical }
    }
}

impl Content {
    /// An empty description.
    pub fn new() -> Self {
        Content::default()
    }

    /// The entities the run would process; order does not matter.
    pub fn entities<I, S>(mut self, ids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut ids: Vec<String> = ids.into_iter().map(Into::into).collect();
        ids.sort_unstable();
        self.entity_count = Some(ids.len() as i64);
        self.fields.insert(
            "entities".into(),
            Field::new(Value::Array(ids.into_iter().map(Value::String).collect())),
        );
        self
    }

    /// Rows describing the content (for example from a SQL query); row order does not
    /// matter, so rows are sorted by their canonical encoding.
    pub fn rows(mut self, rows: Vec<Value>) -> Self {
        let mut encoded: Vec<(Vec<u8>, Value)> = rows
            .into_iter()
            .map(|row| {
                let mut bytes = Vec::new();
                write_canonical(&mut bytes, &row).expect("writing to a Vec cannot fail");
                (bytes, row)
            })
            .collect();
        encoded.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        self.entity_count = Some(encoded.len() as i64);
        let total: usize = encoded.iter().map(|(b, _)| b.len() + 1).sum();
        let mut canonical = Vec::with_capacity(total + 2);
        canonical.push(b'[');
        let mut rows = Vec::with_capacity(encoded.len());
        for (i, (bytes, row)) in encoded.into_iter().enumerate() {
            if i > 0 {
                canonical.push(b',');
            }
            canonical.extend_from_slice(&bytes);
            rows.push(row);
        }
        canonical.push(b']');
        self.fields.insert(
            "rows".into(),
            Field {
                value: Value::Array(rows),
                canonical,
            },
        );
        self
    }

    /// A source checksum (for example a table's last-modified fingerprint).
    pub fn checksum(self, checksum: impl Into<String>) -> Self {
        self.field("checksum", checksum.into())
    }

    /// Any other field.
    pub fn field(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.fields.insert(name.into(), Field::new(value.into()));
        self
    }

    /// Number of entities (or rows), when the description lists them.
    pub fn entity_count(&self) -> Option<i64> {
        self.entity_count
    }

    /// The description as a JSON object (keys sorted).
    pub fn to_value(&self) -> Value {
        Value::Object(
            self.fields
                .iter()
                .map(|(k, f)| (k.clone(), f.value.clone()))
                .collect(),
        )
    }

    /// The content key: digest of the canonical JSON of
    /// `{"content": …, "processor": …, "scope": …}`.
    pub fn key(&self, processor: &str, scope: &str, algorithm: HashAlgorithm) -> String {
        self.key_with_version(processor, scope, "", algorithm)
    }

    /// The content key of a given code version ([`Processor::version`]): digest of the
    /// canonical JSON of `{"content": …, "processor": …, "scope": …, "version": …}`, or
    /// exactly [`Content::key`] when the version is empty.
    ///
    /// ```
    /// use idem::{Content, HashAlgorithm::Sha256};
    /// let c = Content::new().entities(["p1"]);
    /// assert_eq!(c.key_with_version("p", "2025-11-18", "", Sha256), c.key("p", "2025-11-18", Sha256));
    /// assert_ne!(c.key_with_version("p", "2025-11-18", "v2", Sha256), c.key("p", "2025-11-18", Sha256));
    /// ```
    ///
    /// [`Processor::version`]: crate::Processor::version
    pub fn key_with_version(
        &self,
        processor: &str,
        scope: &str,
        version: &str,
        algorithm: HashAlgorithm,
    ) -> String {
        let mut w = DigestWriter::new(algorithm);
        // Keys in sorted order: content, processor, scope.
        w.put(b"{\"content\":{");
        for (i, (name, field)) in self.fields.iter().enumerate() {
            if i > 0 {
                w.put(b",");
            }
            write_string(&mut w, name).expect("digest writes cannot fail");
            w.put(b":");
            w.put(&field.canonical);
        }
        w.put(b"},\"processor\":");
        write_string(&mut w, processor).expect("digest writes cannot fail");
        w.put(b",\"scope\":");
        write_string(&mut w, scope).expect("digest writes cannot fail");
        if !version.is_empty() {
            w.put(b",\"version\":");
            write_string(&mut w, version).expect("digest writes cannot fail");
        }
        w.put(b"}");
        w.finish_hex()
    }
}

/// The time window guard's key of (processor, scope): SHA-256 of
/// `{"kind":"scope","processor":…,"scope":…}`.
pub fn scope_key(processor: &str, scope: &str) -> String {
    let value = serde_json::json!({"kind": "scope", "processor": processor, "scope": scope});
    digest_value(&value, HashAlgorithm::Sha256)
}

/// Digest of any JSON value's canonical encoding.
pub fn digest_value(value: &Value, algorithm: HashAlgorithm) -> String {
    let mut w = DigestWriter::new(algorithm);
    write_canonical(&mut w, value).expect("digest writes cannot fail");
    w.finish_hex()
}

/// [`digest_value`] of `map` without the entries whose key `skip` names, without copying
/// the object (the dedup fingerprint of an event without its key fields).
pub(crate) fn digest_object_without(
    map: &serde_json::Map<String, Value>,
    skip: impl Fn(&str) -> bool,
    algorithm: HashAlgorithm,
) -> String {
    let mut w = DigestWriter::new(algorithm);
    let mut entries: Vec<(&String, &Value)> = map.iter().filter(|(k, _)| !skip(k)).collect();
    if !entries.is_sorted_by(|a, b| a.0 <= b.0) {
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    }
    w.put(b"{");
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            w.put(b",");
        }
        write_string(&mut w, k).expect("digest writes cannot fail");
        w.put(b":");
        write_canonical(&mut w, v).expect("digest writes cannot fail");
    }
    w.put(b"}");
    w.finish_hex()
}

/// [`digest_value`] of an object given as (name, value text) entries already in name
/// order, each name needing no escapes and each value's text canonical as it is (the flat
/// event lines of [`crate::events::extract`]'s fast path).
pub(crate) fn digest_raw_entries<'a>(
    entries: impl Iterator<Item = (&'a str, &'a str)>,
    algorithm: HashAlgorithm,
) -> String {
    let mut w = DigestWriter::new(algorithm);
    w.put(b"{");
    for (i, (name, raw)) in entries.enumerate() {
        if i > 0 {
            w.put(b",");
        }
        w.put(b"\"");
        w.put(name.as_bytes());
        w.put(b"\":");
        w.put(raw.as_bytes());
    }
    w.put(b"}");
    w.finish_hex()
}

/// The canonical encoding of a JSON value: object keys sorted, compact.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(&mut out, value).expect("writing to a Vec cannot fail");
    String::from_utf8(out).expect("JSON is UTF-8")
}

fn write_string<W: Write>(w: &mut W, s: &str) -> io::Result<()> {
    serde_json::to_writer(w, s).map_err(io::Error::other)
}

fn write_canonical<W: Write>(w: &mut W, value: &Value) -> io::Result<()> {
    match value {
        Value::Object(map) => {
            // Sort explicitly: serde_json's map keeps insertion order when a dependency
            // enables `preserve_order`.
            w.write_all(b"{")?;
            let sorted = map.keys().is_sorted();
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if !sorted {
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            }
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    w.write_all(b",")?;
                }
                write_string(w, k)?;
                w.write_all(b":")?;
                write_canonical(w, v)?;
            }
            w.write_all(b"}")
        }
        Value::Array(items) => {
            w.write_all(b"[")?;
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    w.write_all(b",")?;
                }
                write_canonical(w, v)?;
            }
            w.write_all(b"]")
        }
        Value::String(s) => match big_int_digits(s) {
            // An integer beyond 64 bits, kept exactly: the bare integer, as Python writes it.
            Some(digits) => w.write_all(digits.as_bytes()),
            None => write_string(w, s),
        },
        other => serde_json::to_writer(w, other).map_err(io::Error::other),
    }
}

enum Hasher {
    Md5(Md5),
    Sha256(Sha256),
}

/// Feeds bytes to a digest through a buffer, so many small writes cost one update each
/// 8 KiB.
struct DigestWriter {
    hasher: Hasher,
    /// Up to [`DIGEST_BUF`] bytes not hashed yet (most digests are of a few hundred
    /// bytes).
    buf: Vec<u8>,
}

const DIGEST_BUF: usize = 8192;

impl DigestWriter {
    fn new(algorithm: HashAlgorithm) -> Self {
        let hasher = match algorithm {
            HashAlgorithm::Md5 => Hasher::Md5(Md5::new()),
            HashAlgorithm::Sha256 => Hasher::Sha256(Sha256::new()),
        };
        DigestWriter {
            hasher,
            // Grows (by doubling) up to DIGEST_BUF for large contents only.
            buf: Vec::with_capacity(256),
        }
    }

    fn flush_buf(&mut self) {
        let bytes = &self.buf[..];
        match &mut self.hasher {
            Hasher::Md5(h) => h.update(bytes),
            Hasher::Sha256(h) => h.update(bytes),
        }
        self.buf.clear();
    }

    fn put(&mut self, bytes: &[u8]) {
        if self.buf.len() + bytes.len() > DIGEST_BUF {
            self.flush_buf();
            if bytes.len() >= DIGEST_BUF {
                match &mut self.hasher {
                    Hasher::Md5(h) => h.update(bytes),
                    Hasher::Sha256(h) => h.update(bytes),
                }
                return;
            }
        }
        self.buf.extend_from_slice(bytes);
    }

    fn finish_hex(mut self) -> String {
        self.flush_buf();
        match self.hasher {
            Hasher::Md5(h) => hex(&h.finalize()),
            Hasher::Sha256(h) => hex(&h.finalize()),
        }
    }
}

impl Write for DigestWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.put(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Lower-case hex of `bytes` (digests are shown this way everywhere).
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = Vec::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize]);
        s.push(DIGITS[(b & 15) as usize]);
    }
    String::from_utf8(s).expect("hex digits are ASCII")
}

/// How an integer too large for 64 bits is held in a parsed event: a string made of this
/// marker (which no JSON text can produce by accident: it starts with a NUL) and the
/// integer's digits. The canonical encoding writes it back as the bare integer, so two such
/// integers compare exactly, as Python's `json` compares them (serde_json alone would read
/// both as the same `f64`).
pub(crate) const BIG_INT_MARK: &str = "\u{0}int:";

/// The digits of a big integer held under [`BIG_INT_MARK`], if `s` is one.
pub(crate) fn big_int_digits(s: &str) -> Option<&str> {
    s.strip_prefix(BIG_INT_MARK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_is_digest_of_canonical_json() {
        let c = Content::new().entities(["b", "a"]).field("n", 2);
        let expected_json =
            r#"{"content":{"entities":["a","b"],"n":2},"processor":"p","scope":"2025-11-18"}"#;
        let expected = hex(&Sha256::digest(expected_json.as_bytes()));
        assert_eq!(c.key("p", "2025-11-18", HashAlgorithm::Sha256), expected);
        let expected_md5 = hex(&Md5::digest(expected_json.as_bytes()));
        assert_eq!(c.key("p", "2025-11-18", HashAlgorithm::Md5), expected_md5);
        assert_eq!(expected_md5.len(), 32);
        assert_eq!(expected.len(), 64);
    }

    #[test]
    fn a_version_is_part_of_the_key_and_an_empty_one_changes_nothing() {
        let c = Content::new().entities(["b", "a"]).field("n", 2);
        let base = r#"{"content":{"entities":["a","b"],"n":2},"processor":"p","scope":"s""#;
        assert_eq!(
            c.key_with_version("p", "s", "", HashAlgorithm::Sha256),
            hex(&Sha256::digest(format!("{base}}}").as_bytes())),
            "no version: the key of before versions"
        );
        assert_eq!(
            c.key_with_version("p", "s", "", HashAlgorithm::Sha256),
            c.key("p", "s", HashAlgorithm::Sha256)
        );
        assert_eq!(
            c.key_with_version("p", "s", "v2", HashAlgorithm::Md5),
            hex(&Md5::digest(
                format!(r#"{base},"version":"v2"}}"#).as_bytes()
            ))
        );
        assert_ne!(
            c.key_with_version("p", "s", "v2", HashAlgorithm::Sha256),
            c.key_with_version("p", "s", "v3", HashAlgorithm::Sha256)
        );
    }

    #[test]
    fn order_independent_but_content_sensitive() {
        let rows_a = vec![json!({"id": 1, "v": "x"}), json!({"v": "y", "id": 2})];
        let rows_b = vec![json!({"id": 2, "v": "y"}), json!({"id": 1, "v": "x"})];
        let a = Content::new()
            .rows(rows_a)
            .key("p", "s", HashAlgorithm::Sha256);
        let b = Content::new()
            .rows(rows_b)
            .key("p", "s", HashAlgorithm::Sha256);
        assert_eq!(a, b);
        let c = Content::new()
            .rows(vec![json!({"id": 1, "v": "x"}), json!({"id": 2, "v": "z"})])
            .key("p", "s", HashAlgorithm::Sha256);
        assert_ne!(a, c);
        // Same content, other scope or processor: other key.
        let d = Content::new().rows(vec![json!({"id": 1, "v": "x"})]).key(
            "p",
            "t",
            HashAlgorithm::Sha256,
        );
        let e = Content::new().rows(vec![json!({"id": 1, "v": "x"})]).key(
            "q",
            "t",
            HashAlgorithm::Sha256,
        );
        assert_ne!(d, e);
    }

    #[test]
    fn long_strings_cross_the_buffer_boundary() {
        let long = "é".repeat(10_000);
        let c = Content::new().field("blob", long.clone());
        let json = format!(
            r#"{{"content":{{"blob":{}}},"processor":"p","scope":"s"}}"#,
            serde_json::to_string(&long).unwrap()
        );
        assert_eq!(
            c.key("p", "s", HashAlgorithm::Sha256),
            hex(&Sha256::digest(json.as_bytes()))
        );
    }

    #[test]
    fn canonical_sorts_nested_keys() {
        assert_eq!(
            canonical_json(&json!({"b": {"z": 1, "a": [true, null]}, "a": "x"})),
            r#"{"a":"x","b":{"a":[true,null],"z":1}}"#
        );
    }
}
