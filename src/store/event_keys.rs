//! Event keys with fingerprints, decisions and expiry: the types of
//! [`EventKeyStore::check_and_mark`](super::EventKeyStore::check_and_mark) and the verdict
//! rules every backend shares. A backend does two things in its one round trip — mark the
//! first occurrence of each key that is absent or expired, and read the stored row of
//! every other key — and [`verdicts`] turns those into one verdict per input position.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::model::micros;

/// One event key to check and mark.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventMark {
    /// The key.
    pub key: String,
    /// The fingerprint of the event's payload (`None`: never conflicts).
    pub fingerprint: Option<String>,
    /// How long the mark lasts (`None`: forever).
    pub ttl: Option<Duration>,
    /// The decision of the event's processing, returned to later replays.
    pub decision: Option<Value>,
}

impl EventMark {
    /// A bare key: no fingerprint, no expiry, no decision.
    pub fn key(key: impl Into<String>) -> Self {
        EventMark {
            key: key.into(),
            ..EventMark::default()
        }
    }

    /// With a payload fingerprint.
    pub fn fingerprint(mut self, fingerprint: impl Into<String>) -> Self {
        self.fingerprint = Some(fingerprint.into());
        self
    }

    /// Expiring `ttl` after it is marked.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// With the decision later replays return.
    pub fn decision(mut self, decision: Value) -> Self {
        self.decision = Some(decision);
        self
    }

    /// When a mark made at `now` expires (microsecond precision, like every stored instant).
    pub fn expires_at(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let ttl = chrono::Duration::from_std(self.ttl?).unwrap_or(chrono::Duration::MAX);
        Some(micros(
            now.checked_add_signed(ttl)
                .unwrap_or(DateTime::<Utc>::MAX_UTC),
        ))
    }
}

/// A batch whose new keys are marked *pending* until its records are out
/// ([`check_and_mark_pending`](super::EventKeyStore::check_and_mark_pending)).
#[derive(Debug, Clone, Copy)]
pub struct PendingBatch<'a> {
    /// The marker its keys carry until the batch is confirmed, as compact JSON text
    /// (`{"idem_pending": TOKEN}`, the token unique to the batch): a stored key found
    /// pending is a replay whose decision is this marker.
    pub marker: &'a str,
    /// How long its marks live unconfirmed: a batch never confirmed is taken over as new
    /// once this has passed.
    pub timeout: Duration,
    /// Its place in its gate's row of batches, which mark their keys in input order
    /// ([`MarkTurn`](crate::events::strategy::MarkTurn)); `None` outside a row (a batch
    /// asked alone, or asked again). A store whose
    /// [`Capabilities::marks_ahead`](super::Capabilities::marks_ahead) keeps each row's last
    /// place marked, so that a batch can mark ahead of its turn
    /// ([`check_and_mark_pending_ahead`](super::EventKeyStore::check_and_mark_pending_ahead)).
    pub turn: Option<BatchTurn<'a>>,
}

/// A batch's place in its gate's row of batches (see [`PendingBatch::turn`]).
#[derive(Debug, Clone, Copy)]
pub struct BatchTurn<'a> {
    /// The row: unique to one row of one gate.
    pub row: &'a str,
    /// The batch's place in it: 0, 1, 2, … in input order.
    pub place: u64,
    /// Said (by the store, as early as it can) once the batch after this one may ask
    /// ahead of its turn: a store that makes a batch asked ahead wait for the one before
    /// it to commit says it once this batch's transaction holds what the next one waits
    /// for; the gate says it anyway when the call returns.
    pub started: &'a TurnStarted,
}

/// The signal of [`BatchTurn::started`]: said once, by the first [`say`](Self::say).
#[derive(Debug, Default)]
pub struct TurnStarted(Option<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>>);

impl TurnStarted {
    /// A signal nobody waits for. It holds no lock: it is one for the whole process, and a
    /// lock held by a thread at the instant of a `fork` would stay held in the child.
    pub fn nobody() -> &'static TurnStarted {
        static NOBODY: TurnStarted = TurnStarted(None);
        &NOBODY
    }

    /// A signal whose receiver is `to`'s.
    pub fn to(to: tokio::sync::oneshot::Sender<()>) -> Self {
        TurnStarted(Some(std::sync::Mutex::new(Some(to))))
    }

    /// Says it (again: nothing).
    pub fn say(&self) {
        let Some(sender) = &self.0 else {
            return;
        };
        let sender = match sender.lock() {
            Ok(mut s) => s.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(s) = sender {
            let _ = s.send(());
        }
    }
}

impl PendingBatch<'_> {
    /// `mark` as the per-key pending mark: the marker as its decision, and the shorter of
    /// its own TTL and the batch's timeout (what
    /// [`confirm_event_keys`](super::EventKeyStore::confirm_event_keys) later replaces).
    pub fn per_key(&self, mark: &EventMark) -> EventMark {
        EventMark {
            key: mark.key.clone(),
            fingerprint: mark.fingerprint.clone(),
            ttl: Some(mark.ttl.map_or(self.timeout, |t| t.min(self.timeout))),
            decision: Some(
                serde_json::from_str(self.marker)
                    .unwrap_or_else(|_| Value::String(self.marker.to_string())),
            ),
        }
    }

    /// When a batch marked at `now` is taken over unconfirmed.
    pub fn deadline(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        EventMark::default()
            .ttl(self.timeout)
            .expires_at(now)
            .unwrap_or(now)
    }
}

/// What [`check_and_mark`](super::EventKeyStore::check_and_mark) found for one key.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum EventVerdict {
    /// First sighting (or the earlier mark expired): now marked.
    New,
    /// Seen with the same payload (or one without a fingerprint): the stored decision.
    Replay {
        /// The decision stored with the key, if any.
        decision: Option<Value>,
        /// When the key was marked.
        first_seen: DateTime<Utc>,
    },
    /// Seen with a different payload: rejected, nothing changed.
    Conflict {
        /// The fingerprint stored with the key.
        stored_fingerprint: String,
        /// When the key was marked.
        first_seen: DateTime<Utc>,
    },
}

impl EventVerdict {
    /// Whether the key was new.
    pub fn is_new(&self) -> bool {
        matches!(self, EventVerdict::New)
    }

    /// `new`, `replay` or `conflict`.
    pub fn name(&self) -> &'static str {
        match self {
            EventVerdict::New => "new",
            EventVerdict::Replay { .. } => "replay",
            EventVerdict::Conflict { .. } => "conflict",
        }
    }
}

/// A stored, unexpired event key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StoredEvent {
    pub fingerprint: Option<String>,
    pub decision: Option<Value>,
    pub first_seen: DateTime<Utc>,
}

/// The first occurrence of each key, in key (byte) order: what a backend marks, in an order
/// that makes two batches sharing keys lock them alike.
pub(crate) fn firsts(marks: &[EventMark]) -> Vec<&EventMark> {
    let mut seen = HashSet::with_capacity(marks.len());
    let mut out: Vec<&EventMark> = marks
        .iter()
        .filter(|m| seen.insert(m.key.as_str()))
        .collect();
    out.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    out
}

/// The verdict of `stored` for an event with fingerprint `fingerprint`.
pub(crate) fn against(stored: &StoredEvent, fingerprint: Option<&str>) -> EventVerdict {
    against_parts(
        stored.fingerprint.as_deref(),
        || stored.decision.clone(),
        stored.first_seen,
        fingerprint,
    )
}

/// [`against`] of a stored row's parts, borrowed where they lie (a database row): the
/// stored fingerprint is copied for a conflict only, and the decision made (`decision`)
/// for a replay only.
pub(crate) fn against_parts(
    stored_fingerprint: Option<&str>,
    decision: impl FnOnce() -> Option<Value>,
    first_seen: DateTime<Utc>,
    fingerprint: Option<&str>,
) -> EventVerdict {
    match (stored_fingerprint, fingerprint) {
        (Some(old), Some(new)) if old != new => EventVerdict::Conflict {
            stored_fingerprint: old.to_string(),
            first_seen,
        },
        _ => EventVerdict::Replay {
            decision: decision(),
            first_seen,
        },
    }
}

/// One verdict per mark, given the keys this call marked (`new`) and the stored rows of the
/// others (`stored`), keys of `marks` only. A key in neither (its row vanished between the
/// two, e.g. a concurrent cleanup) is a replay without a decision: it was marked by someone.
pub(crate) fn verdicts(
    marks: &[EventMark],
    new: &HashSet<String>,
    stored: &HashMap<String, StoredEvent>,
    now: DateTime<Utc>,
) -> Vec<EventVerdict> {
    let vanished = || StoredEvent {
        fingerprint: None,
        decision: None,
        first_seen: micros(now),
    };
    if new.len() + stored.len() == marks.len() && new.iter().all(|k| !stored.contains_key(k)) {
        // As many keys found, each once, as marks: each key is once in the batch, so no
        // later occurrence is judged by an earlier one and nothing is kept per key (a
        // replayed batch of distinct keys, the common case, copied each stored row here).
        return marks
            .iter()
            .map(|m| {
                if new.contains(&m.key) {
                    return EventVerdict::New;
                }
                match stored.get(&m.key) {
                    Some(state) => against(state, m.fingerprint.as_deref()),
                    None => against(&vanished(), m.fingerprint.as_deref()),
                }
            })
            .collect();
    }
    let mut decided: HashMap<&str, StoredEvent> = HashMap::with_capacity(marks.len());
    marks
        .iter()
        .map(|m| {
            if let Some(earlier) = decided.get(m.key.as_str()) {
                return against(earlier, m.fingerprint.as_deref());
            }
            let (verdict, state) = if new.contains(&m.key) {
                let state = StoredEvent {
                    fingerprint: m.fingerprint.clone(),
                    decision: m.decision.clone(),
                    first_seen: micros(now),
                };
                (EventVerdict::New, state)
            } else {
                let state = stored.get(&m.key).cloned().unwrap_or_else(vanished);
                (against(&state, m.fingerprint.as_deref()), state)
            };
            decided.insert(m.key.as_str(), state);
            verdict
        })
        .collect()
}

/// What a backend found for the first occurrences of a batch: the keys it marked and the
/// stored rows of the others; [`Found::verdicts`] makes one verdict per mark.
#[derive(Debug, Default)]
pub(crate) struct Found {
    new: HashSet<String>,
    stored: HashMap<String, StoredEvent>,
}

impl Found {
    /// `key` was marked by this call.
    pub fn marked(&mut self, key: String) {
        self.new.insert(key);
    }

    /// `key` is stored, unexpired (the decision as text from a text/JSON column).
    pub fn stored(
        &mut self,
        key: String,
        fingerprint: Option<String>,
        decision: Option<String>,
        first_seen: DateTime<Utc>,
    ) {
        let row = StoredEvent {
            fingerprint,
            decision: parse_decision(decision.as_deref()),
            first_seen,
        };
        self.stored.insert(key, row);
    }

    /// One verdict per mark ([`verdicts`]).
    pub fn verdicts(&self, marks: &[EventMark], now: DateTime<Utc>) -> Vec<EventVerdict> {
        verdicts(marks, &self.new, &self.stored, now)
    }
}

/// The verdicts of `marks` when one call marked every one of `firsts` (their first
/// occurrences, [`firsts`]): `new` each, but for a key's later occurrences in the batch.
pub(crate) fn all_new(
    marks: &[EventMark],
    firsts: &[&EventMark],
    now: DateTime<Utc>,
) -> Vec<EventVerdict> {
    if firsts.len() == marks.len() {
        // Every key distinct: no bookkeeping per key.
        return marks.iter().map(|_| EventVerdict::New).collect();
    }
    let mut found = Found::default();
    for m in firsts {
        found.marked(m.key.clone());
    }
    found.verdicts(marks, now)
}

/// Whether each of `keys` is among `found`.
pub(crate) fn present(keys: &[String], found: impl IntoIterator<Item = String>) -> Vec<bool> {
    let found: HashSet<String> = found.into_iter().collect();
    keys.iter().map(|k| found.contains(k)).collect()
}

/// A decision as stored in a text column.
pub(crate) fn decision_text(m: &EventMark) -> Option<String> {
    m.decision.as_ref().map(Value::to_string)
}

/// A decision read from a text column, borrowed where it lies (unparseable text is kept as
/// a JSON string).
pub(crate) fn parse_decision(text: Option<&str>) -> Option<Value> {
    text.map(|t| serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.to_string())))
}

/// A named cursor's position (seed 003): the (timestamp, id) of the last event a stream
/// got past, every event at or before it in that order having been marked.
///
/// Timestamps are JSON integers (e.g. Unix seconds or milliseconds) or RFC 3339 strings
/// (compared as microseconds since the epoch): one stream uses one form. Ids are JSON
/// integers (compared as numbers, before every string) or strings (compared byte-wise).
/// [`Cursor::position`] encodes the pair as lowercase hex whose byte order is the
/// (timestamp, id) order, so every store compares positions as plain text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Cursor {
    /// The last timestamp, as the event had it.
    pub last_timestamp: Value,
    /// The last id, as the event had it.
    pub last_id: Value,
    /// The sortable encoding of (timestamp, id).
    pub position: String,
}

/// An i64 as 16 hex digits in numeric order.
fn sortable_i64(n: i64) -> String {
    format!("{:016x}", (n as u64) ^ (1u64 << 63))
}

impl Cursor {
    /// The cursor at an event's `timestamp` and `id`; `Err` says why they cannot be
    /// ordered.
    pub fn at(timestamp: &Value, id: &Value) -> std::result::Result<Cursor, String> {
        let ts = match timestamp {
            Value::Number(n) => n.as_i64().ok_or_else(|| {
                format!("timestamp {n} is not an integer (give integers or RFC 3339 text)")
            })?,
            Value::String(s) => DateTime::parse_from_rfc3339(s)
                .map_err(|e| format!("timestamp {s:?} is not RFC 3339: {e}"))?
                .timestamp_micros(),
            other => {
                return Err(format!(
                    "timestamp {other} is neither an integer nor RFC 3339 text"
                ))
            }
        };
        let mut position = sortable_i64(ts);
        match id {
            Value::Number(n) => {
                let n = n
                    .as_i64()
                    .ok_or_else(|| format!("id {n} is not an integer or a string"))?;
                position.push('0');
                position.push_str(&sortable_i64(n));
            }
            Value::String(s) => {
                position.push('1');
                for b in s.as_bytes() {
                    position.push_str(&format!("{b:02x}"));
                }
            }
            other => return Err(format!("id {other} is neither an integer nor a string")),
        }
        Ok(Cursor {
            last_timestamp: timestamp.clone(),
            last_id: id.clone(),
            position,
        })
    }

    /// The cursor an event's `timestamp_field` and `id_field` give.
    pub fn of_event(
        event: &Value,
        timestamp_field: &str,
        id_field: &str,
    ) -> std::result::Result<Cursor, String> {
        let field = |name: &str| {
            event
                .get(name)
                .filter(|v| !v.is_null())
                .ok_or_else(|| format!("field `{name}` (--order-by) is missing"))
        };
        Cursor::at(field(timestamp_field)?, field(id_field)?)
    }

    /// The (timestamp, id) as JSON text, for a store's text column.
    pub(crate) fn value_text(&self) -> String {
        serde_json::json!({"last_timestamp": self.last_timestamp, "last_id": self.last_id})
            .to_string()
    }

    /// A cursor read back from a store: its position and [`Cursor::value_text`].
    pub(crate) fn from_stored(position: String, text: &str) -> Cursor {
        let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        Cursor {
            last_timestamp: v.get("last_timestamp").cloned().unwrap_or(Value::Null),
            last_id: v.get("last_id").cloned().unwrap_or(Value::Null),
            position,
        }
    }
}

impl PartialOrd for Cursor {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Cursor {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.position.cmp(&other.position)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_occurrence_decides_and_later_ones_compare_against_it() {
        let now = DateTime::from_timestamp(1_000, 0).unwrap();
        let marks = [
            EventMark::key("a")
                .fingerprint("x")
                .decision(Value::from(1)),
            EventMark::key("a").fingerprint("x"),
            EventMark::key("a").fingerprint("y"),
            EventMark::key("b"),
        ];
        let new: HashSet<String> = ["a".to_string()].into();
        let stored = HashMap::from([(
            "b".to_string(),
            StoredEvent {
                fingerprint: Some("z".into()),
                decision: None,
                first_seen: now,
            },
        )]);
        let v = verdicts(&marks, &new, &stored, now);
        assert_eq!(v[0], EventVerdict::New);
        assert_eq!(
            v[1],
            EventVerdict::Replay {
                decision: Some(Value::from(1)),
                first_seen: now
            }
        );
        assert!(
            matches!(&v[2], EventVerdict::Conflict { stored_fingerprint, .. } if stored_fingerprint == "x")
        );
        assert!(matches!(v[3], EventVerdict::Replay { .. }));
        assert_eq!(firsts(&marks).len(), 2);
    }

    #[test]
    fn a_batch_of_distinct_keys_is_judged_as_one_with_repeats_would_judge_it() {
        let now = DateTime::from_timestamp(1_000, 0).unwrap();
        let then = DateTime::from_timestamp(500, 0).unwrap();
        let stored = |fingerprint: &str, decision: Option<Value>| StoredEvent {
            fingerprint: Some(fingerprint.into()),
            decision,
            first_seen: then,
        };
        let found = HashMap::from([
            ("same".to_string(), stored("x", Some(Value::from(7)))),
            ("changed".to_string(), stored("x", None)),
        ]);
        let new: HashSet<String> = ["fresh".to_string()].into();
        let distinct = [
            EventMark::key("same").fingerprint("x"),
            EventMark::key("fresh").fingerprint("x"),
            EventMark::key("changed").fingerprint("y"),
        ];
        let replay = EventVerdict::Replay {
            decision: Some(Value::from(7)),
            first_seen: then,
        };
        let conflict = EventVerdict::Conflict {
            stored_fingerprint: "x".into(),
            first_seen: then,
        };
        let fast = verdicts(&distinct, &new, &found, now);
        assert_eq!(fast, [replay.clone(), EventVerdict::New, conflict.clone()]);
        // The same keys with a repeat of each (the path that keeps state per key): the
        // first occurrences get the same verdicts.
        let repeated: Vec<EventMark> = distinct.iter().chain(&distinct).cloned().collect();
        let slow = verdicts(&repeated, &new, &found, now);
        assert_eq!(slow[..3], fast[..]);
        assert_eq!(
            slow[3..],
            [
                replay,
                EventVerdict::Replay {
                    decision: None,
                    first_seen: micros(now)
                },
                conflict
            ]
        );
    }

    #[test]
    fn cursor_positions_sort_as_timestamp_then_id() {
        use serde_json::json;
        let c = |t: Value, i: Value| Cursor::at(&t, &i).unwrap();
        let ordered = [
            c(json!(-5), json!("z")),
            c(json!(9), json!(2)),
            c(json!(9), json!(10)),
            c(json!(9), json!("")),
            c(json!(9), json!("a")),
            c(json!(9), json!("ab")),
            c(json!(9), json!("b")),
            c(json!(10), json!(1)),
        ];
        assert!(ordered.windows(2).all(|w| w[0] < w[1]));
        assert!(
            c(json!("2024-01-01T00:00:00Z"), json!(1))
                < c(json!("2024-01-01T01:00:00+00:30"), json!(0))
        );
        assert!(Cursor::at(&json!(1.5), &json!(1)).is_err());
        assert!(Cursor::at(&json!(1), &json!(null)).is_err());
        let back = Cursor::from_stored(ordered[4].position.clone(), &ordered[4].value_text());
        assert_eq!(back, ordered[4]);
    }
}
