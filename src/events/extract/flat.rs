//! The fast path of a flat event: its key and fingerprint read from the line's text,
//! without building a `Value`, when the text says the same as the `Value` would.

use super::content::ContentHashExtractor;
use super::fields::push_part;
use super::FieldPath;
use crate::error::Result;
use crate::key::HashAlgorithm;

/// The key fields and fingerprint of a [`Deduplicator`] whose
/// fields are all top-level (its usual shape), for [`FlatSpec::mark`]: the key and
/// fingerprint of a flat event line straight from its text, without building a `Value`.
///
/// [`Deduplicator`]: crate::events::dedup::Deduplicator
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
                entries.sort_by(|a, b| a.0.cmp(b.0));
                if entries.windows(2).any(|w| w[0].0 == w[1].0) {
                    // A repeated name makes the line invalid: the `Value` path says so.
                    return Err(A::Error::custom("a repeated name"));
                }
                Ok(FlatFields(entries))
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

#[cfg(test)]
mod flat_tests {
    use serde_json::Value;

    use super::*;
    use crate::events::extract::{CompositeExtractor, Extractor, FieldExtractor};

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
        assert!(answered >= 11, "the fast path took {answered} lines");
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
            // A repeated name: the line is invalid, which the `Value` path says.
            r#"{"id":"a","v":1,"id":"b","v":2}"#,
            r#"{"id":"a","v":1,"v":1}"#,
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
