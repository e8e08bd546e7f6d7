//! The stored value of an event key (`FIRST_SEEN:TTL:=FINGERPRINT`, a newline, the
//! decision) and the Redis keys of a namespace.

use chrono::{DateTime, Utc};

use crate::model::micros;
use crate::store::EventMark;

/// The first line of a stored value: `FIRST_SEEN:TTL:FINGERPRINT`. `FIRST_SEEN` is
/// microseconds since the epoch; `TTL` the microseconds from it to the expiry by the
/// marking caller's clock (empty: never); `FINGERPRINT` empty when there is none, else `=`
/// and the fingerprint with `%` and newlines percent-encoded (so the line ends at the first
/// newline, where the decision begins). Compact on purpose: every byte is sent and stored
/// per key.
#[derive(Debug, PartialEq)]
pub(super) struct Header {
    /// First seen, microseconds since the epoch.
    pub(super) first_seen: i64,
    /// Expiry by the marking caller's clock, microseconds since the epoch.
    pub(super) expires: Option<i64>,
    /// Payload fingerprint.
    pub(super) fingerprint: Option<String>,
}

impl Header {
    pub(super) fn parse(line: &str) -> Option<Header> {
        let mut parts = line.splitn(3, ':');
        let first_seen: i64 = parts.next()?.parse().ok()?;
        let ttl = parts.next()?;
        let expires = if ttl.is_empty() {
            None
        } else {
            Some(first_seen.checked_add(ttl.parse().ok()?)?)
        };
        let fingerprint = match parts.next()? {
            "" => None,
            f => {
                let f = f.strip_prefix('=')?;
                Some(if f.contains('%') {
                    f.replace("%0A", "\n").replace("%25", "%")
                } else {
                    f.to_string()
                })
            }
        };
        Some(Header {
            first_seen,
            expires,
            fingerprint,
        })
    }
}

/// A stored value, decoded.
pub(super) struct Stored {
    pub(super) header: Header,
    pub(super) decision: Option<String>,
}

impl Stored {
    /// The marker of the pending batch the value names (its decision part is `@` and the
    /// marker, which no JSON text begins with).
    pub(super) fn batch(&self) -> Option<&str> {
        self.decision.as_deref()?.strip_prefix(PENDING)
    }

    pub(super) fn expired(&self, now: DateTime<Utc>) -> bool {
        self.header
            .expires
            .is_some_and(|e| e <= now.timestamp_micros())
    }
}

/// Writes stored values for the marks of one call: the parts every value of the call
/// shares (`FIRST_SEEN:`, and the TTL's text for the last TTL seen) are made once.
pub(super) struct Encoder {
    now: DateTime<Utc>,
    /// `FIRST_SEEN:`.
    head: String,
    pub(super) first_seen: i64,
    /// The last TTL encoded and its `TTL` text.
    ttl: Option<(std::time::Duration, String)>,
    /// The decision part of every value: `@` and a pending batch's marker (the marks'
    /// own decisions are not kept: a confirmed pending mark has none).
    pending: Option<String>,
}

impl Encoder {
    pub(super) fn new(now: DateTime<Utc>) -> Self {
        let first_seen = micros(now).timestamp_micros();
        Encoder {
            now,
            head: format!("{first_seen}:"),
            first_seen,
            ttl: None,
            pending: None,
        }
    }

    /// Values naming the pending batch `marker` instead of a decision.
    pub(super) fn pending(mut self, marker: Option<&str>) -> Self {
        self.pending = marker.map(|m| format!("{PENDING}{m}"));
        self
    }

    pub(super) fn encode(&mut self, m: &EventMark) -> Vec<u8> {
        let mut value = Vec::with_capacity(40 + m.fingerprint.as_ref().map_or(0, String::len));
        value.extend_from_slice(self.head.as_bytes());
        if let Some(ttl) = m.ttl {
            if self.ttl.as_ref().is_none_or(|(last, _)| *last != ttl) {
                let expires = m.expires_at(self.now).map_or(0, |e| e.timestamp_micros());
                let text = expires.saturating_sub(self.first_seen).to_string();
                self.ttl = Some((ttl, text));
            }
            if let Some((_, text)) = &self.ttl {
                value.extend_from_slice(text.as_bytes());
            }
        }
        value.push(b':');
        if let Some(f) = &m.fingerprint {
            value.push(b'=');
            if f.contains(['%', '\n']) {
                value.extend_from_slice(f.replace('%', "%25").replace('\n', "%0A").as_bytes());
            } else {
                value.extend_from_slice(f.as_bytes());
            }
        }
        value.push(b'\n');
        if let Some(batch) = &self.pending {
            value.extend_from_slice(batch.as_bytes());
        } else if let Some(d) = &m.decision {
            let _ = serde_json::to_writer(&mut value, d);
        }
        value
    }
}

#[cfg(test)]
pub(super) fn encode(m: &EventMark, now: DateTime<Utc>) -> Vec<u8> {
    Encoder::new(now).encode(m)
}

/// The longest `PX` sent (100 years): Redis refuses an expiry that overflows its clock.
pub(super) const MAX_PX_MS: u128 = 100 * 365 * 24 * 3600 * 1000;

/// `PX` milliseconds for a mark (`None`: no expiry); at least 1, as Redis requires.
pub(super) fn px(m: &EventMark) -> Option<u64> {
    m.ttl.map(|ttl| ttl.as_millis().clamp(1, MAX_PX_MS) as u64)
}

/// The Redis key of (namespace, key) under `prefix`: `PREFIX{NAMESPACE}:KEY`, with `%` and
/// `}` of the namespace percent-encoded so it cannot end the hash tag or collide.
pub fn redis_key(prefix: &str, namespace: &str, key: &str) -> String {
    if namespace.contains(['%', '}']) {
        let ns = namespace.replace('%', "%25").replace('}', "%7D");
        format!("{prefix}{{{ns}}}:{key}")
    } else {
        format!("{prefix}{{{namespace}}}:{key}")
    }
}

/// The Redis key of a namespace's named cursor: `PREFIX{NAMESPACE}#cursor:NAME`, in the
/// namespace's slot and apart from every event key (those have `}:` after the tag).
pub fn cursor_key(prefix: &str, namespace: &str, name: &str) -> String {
    let event = redis_key(prefix, namespace, "");
    format!("{}#cursor:{name}", &event[..event.len() - 1])
}

/// What begins the decision part of a value naming its pending batch.
pub(super) const PENDING: char = '@';

/// The Redis key of a pending batch of a namespace: `PREFIX{NAMESPACE}#pending:MARKER`, in
/// the namespace's slot and apart from every event key and cursor. Its value is
/// `P` + the deadline (microseconds since the epoch, the marking caller's clock) + `:` +
/// the longest `PX` of its keys (empty: a key never expires) while pending, with the
/// batch's timeout as its own expiry; `C` once confirmed, living as long as its longest
/// key. Gone: the batch died unconfirmed.
pub fn batch_key(prefix: &str, namespace: &str, marker: &str) -> String {
    let event = redis_key(prefix, namespace, "");
    format!("{}#pending:{marker}", &event[..event.len() - 1])
}

/// The key of a gate's row of batches (`PREFIX{NAMESPACE}#turn:ROW`): the last place in
/// the row that marked its keys (in the namespace's slot, beside its batches' keys).
pub fn turn_key(prefix: &str, namespace: &str, row: &str) -> String {
    let event = redis_key(prefix, namespace, "");
    format!("{}#turn:{row}", &event[..event.len() - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_put_the_namespace_in_a_hash_tag_that_cannot_be_closed_early() {
        assert_eq!(
            redis_key("idem:ev:", "orders", "o-1"),
            "idem:ev:{orders}:o-1"
        );
        // Without escaping, ("a}:b", "c") and ("a", "b}:c") would share a key.
        assert_ne!(redis_key("p:", "a}:b", "c"), redis_key("p:", "a", "b}:c"));
        assert_eq!(redis_key("p:", "a}%", "k"), "p:{a%7D%25}:k");
    }

    #[test]
    fn values_round_trip_and_ttls_fit_redis() {
        let now = DateTime::from_timestamp(1_700_000_000, 123_456_000).unwrap();
        let m = EventMark::key("k")
            .fingerprint("f\n\"x")
            .decision(serde_json::json!({"a": "line\nbreak"}))
            .ttl(std::time::Duration::from_secs(60));
        let value = encode(&m, now);
        let (head, decision) = std::str::from_utf8(&value)
            .unwrap()
            .split_once('\n')
            .unwrap();
        assert_eq!(head, "1700000000123456:60000000:=f%0A\"x");
        let header = Header::parse(head).unwrap();
        assert_eq!(header.fingerprint.as_deref(), Some("f\n\"x"));
        assert_eq!(header.first_seen, now.timestamp_micros());
        assert_eq!(header.expires, Some(now.timestamp_micros() + 60_000_000));
        let bare = encode(&EventMark::key("k"), now);
        assert_eq!(bare, b"1700000000123456::\n");
        let header = Header::parse("1:: 2%25").unwrap_or(Header {
            first_seen: 0,
            expires: None,
            fingerprint: None,
        });
        assert_eq!(
            header.first_seen, 0,
            "a fingerprint without '=' is not idem's"
        );
        let header = Header::parse("1::=a%25%0Ab:c").unwrap();
        assert_eq!(header.fingerprint.as_deref(), Some("a%\nb:c"));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(decision).unwrap(),
            serde_json::json!({"a": "line\nbreak"})
        );
        assert_eq!(px(&m), Some(60_000));
        assert_eq!(px(&EventMark::key("k")), None);
        assert_eq!(
            px(&EventMark::key("k").ttl(std::time::Duration::ZERO)),
            Some(1)
        );
        let forever = EventMark::key("k").ttl(std::time::Duration::MAX);
        assert_eq!(px(&forever), Some(MAX_PX_MS as u64));
    }
}
