//! The dedup API over a store (seeds 001 and 004): [`Deduplicator`] takes each event's key
//! with an [`Extractor`], the fingerprint of its payload with a [`ContentHashExtractor`]
//! (the key fields excluded by default), its TTL (fixed, or per event type), and asks the
//! store's [`EventKeyStore::check_and_mark`] for a verdict per event, one round trip per
//! batch: `new` (first sighting, or the earlier mark expired), `replay` (same key, same
//! payload: the stored decision), `conflict` (same key, different payload: rejected, no
//! state changed). An event whose key or fingerprint cannot be taken is an
//! [`InvalidEvent`] in its place; it never fails the batch.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use idem::events::dedup::Deduplicator;
//! use idem::store::MemoryStore;
//! use serde_json::json;
//! let dedup = Deduplicator::new(Arc::new(MemoryStore::new()), "payments", ["id"]).unwrap();
//! let now = chrono::Utc::now();
//! let events = [json!({"id": 1, "amount": "10.00"}), json!({"id": 1, "amount": "10.00"}),
//!               json!({"id": 1, "amount": "99.00"}), json!({"amount": "1"})];
//! let verdicts: Vec<&str> = dedup.check_and_mark(&events, now).await.unwrap()
//!     .iter().map(|c| c.as_ref().map_or("invalid", |c| c.verdict.name())).collect();
//! assert_eq!(verdicts, ["new", "replay", "conflict", "invalid"]);
//! # })
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::extract::{
    CompositeExtractor, ContentHashExtractor, Extractor, FieldExtractor, FlatSpec,
};
use super::{EventError, FieldPath, InvalidEvent};
use crate::error::{Error, Result};
use crate::store::{EventKeyStore, EventMark, EventVerdict};

/// What joins the fields of a key of several ([`Deduplicator::new`]).
const KEY_SEPARATOR: &str = ":";

/// How long a mark lasts: the same for every event, or per event type.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Ttl {
    default: Option<Duration>,
    type_field: Option<FieldPath>,
    by_type: HashMap<String, Option<Duration>>,
}

impl Ttl {
    /// Marks never expire.
    pub fn never() -> Self {
        Ttl::default()
    }

    /// Every mark expires `ttl` after it is made.
    pub fn fixed(ttl: Duration) -> Self {
        Ttl {
            default: Some(ttl),
            ..Ttl::default()
        }
    }

    /// Per event type: the type is the string at `type_field` (e.g. `event_type`); a type
    /// in `by_type` gets its TTL (`None` = never expires), any other (or no type) `default`.
    pub fn per_type(
        type_field: &str,
        default: Option<Duration>,
        by_type: HashMap<String, Option<Duration>>,
    ) -> Result<Self> {
        Ok(Ttl {
            default,
            type_field: Some(FieldPath::parse(type_field)?),
            by_type,
        })
    }

    /// The TTL of `event`.
    pub fn of(&self, event: &Value) -> Option<Duration> {
        let event_type = self
            .type_field
            .as_ref()
            .and_then(|f| f.get(event))
            .and_then(Value::as_str);
        match event_type.and_then(|t| self.by_type.get(t)) {
            Some(ttl) => *ttl,
            None => self.default,
        }
    }
}

/// One event's key and verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// The event's key.
    pub key: String,
    /// What the store found.
    pub verdict: EventVerdict,
}

/// [`Deduplicator::filter_new`]'s result: the new events, and what was left out.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Filtered {
    /// The events seen for the first time, in input order.
    pub new: Vec<Value>,
    /// How many were replays.
    pub replays: usize,
    /// How many were conflicts.
    pub conflicts: usize,
    /// The events whose key or fingerprint could not be taken.
    pub invalid: Vec<InvalidEvent>,
}

/// Deduplicates events of one namespace on an event-key store.
#[derive(Debug, Clone)]
pub struct Deduplicator {
    pub(super) store: Arc<dyn EventKeyStore>,
    namespace: String,
    key: Arc<dyn Extractor>,
    fingerprint: Option<ContentHashExtractor>,
    ttl: Ttl,
    /// The key fields (top-level, when all are) and fingerprint for event lines taken
    /// without a `Value` ([`FlatSpec::mark`]); `None` when a custom key extractor, a
    /// fingerprint over nested fields or a per-type TTL needs the parsed event.
    flat: Option<FlatSpec>,
    /// The key's fields as given to [`Deduplicator::new`].
    key_fields: Vec<FieldPath>,
}

impl Deduplicator {
    /// Keyed by `key_fields` (dotted paths; several are joined with `:`), fingerprinted by
    /// the payload without the key fields (SHA-256 of its canonical JSON), never expiring.
    pub fn new<I, S>(store: Arc<dyn EventKeyStore>, namespace: &str, key_fields: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let fields: Vec<String> = key_fields
            .into_iter()
            .map(|f| f.as_ref().to_string())
            .collect();
        let key: Arc<dyn Extractor> = match fields.as_slice() {
            [] => return Err(Error::config("a dedup key needs at least one field")),
            [one] => Arc::new(FieldExtractor::new(one)?),
            many => Arc::new(CompositeExtractor::new(many, KEY_SEPARATOR)?),
        };
        let fingerprint = Some(ContentHashExtractor::new().exclude(&fields)?);
        let key_fields = fields
            .iter()
            .map(|f| FieldPath::parse(f))
            .collect::<Result<Vec<_>>>()?;
        Ok(Deduplicator {
            store,
            namespace: namespace.to_string(),
            key,
            flat: FlatSpec::new(&key_fields, KEY_SEPARATOR, fingerprint.as_ref()),
            fingerprint,
            ttl: Ttl::never(),
            key_fields,
        })
    }

    /// Another key extractor (the fingerprint spec stays as it is).
    pub fn key_extractor(mut self, key: impl Extractor + 'static) -> Self {
        self.key = Arc::new(key);
        self.flat = None;
        self.key_fields.clear();
        self
    }

    /// The payload fingerprint (`None`: no fingerprint, so never a conflict).
    pub fn fingerprint(mut self, spec: Option<ContentHashExtractor>) -> Self {
        self.fingerprint = spec;
        self.flat = self.flat_spec();
        self
    }

    fn flat_spec(&self) -> Option<FlatSpec> {
        if self.key_fields.is_empty() || self.ttl.type_field.is_some() {
            return None;
        }
        FlatSpec::new(&self.key_fields, KEY_SEPARATOR, self.fingerprint.as_ref())
    }

    /// How long marks last.
    pub fn ttl(mut self, ttl: Ttl) -> Self {
        self.ttl = ttl;
        self.flat = self.flat_spec();
        self
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub(super) fn mark(&self, event: &Value) -> std::result::Result<EventMark, EventError> {
        let key = self.key.extract(event)?;
        let fingerprint = match &self.fingerprint {
            Some(spec) => Some(spec.extract(event)?),
            None => None,
        };
        Ok(EventMark {
            key,
            fingerprint,
            ttl: self.ttl.of(event),
            decision: None,
        })
    }

    /// The mark of the event on `line` taken from its text, when its shape allows (see
    /// [`FlatSpec::mark`]); `None`: parse it and use [`mark`](Self::mark).
    pub(super) fn mark_line(&self, line: &str) -> Option<EventMark> {
        let (key, fingerprint) = self.flat.as_ref()?.mark(line)?;
        Some(EventMark {
            key,
            fingerprint,
            ttl: self.ttl.default,
            decision: None,
        })
    }

    /// The marks of the valid events, and per event its mark's index or its error.
    pub(super) fn marks(
        &self,
        events: &[Value],
    ) -> (
        Vec<EventMark>,
        Vec<std::result::Result<usize, InvalidEvent>>,
    ) {
        let mut marks = Vec::with_capacity(events.len());
        let slots = events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let mark = self.mark(e).map_err(|err| err.at(i + 1))?;
                marks.push(mark);
                Ok(marks.len() - 1)
            })
            .collect();
        (marks, slots)
    }

    /// Checks and marks a batch of events at `now`, in one store round trip: one result
    /// per event, in order.
    pub async fn check_and_mark(
        &self,
        events: &[Value],
        now: DateTime<Utc>,
    ) -> Result<Vec<std::result::Result<Checked, InvalidEvent>>> {
        let (marks, slots) = self.marks(events);
        let mut verdicts = self
            .store
            .check_and_mark(&self.namespace, &marks, now)
            .await?
            .into_iter()
            .map(Some)
            .collect::<Vec<_>>();
        Ok(slots
            .into_iter()
            .map(|slot| {
                let i = slot?;
                Ok(Checked {
                    key: marks[i].key.clone(),
                    verdict: verdicts[i].take().expect("one verdict per mark"),
                })
            })
            .collect())
    }

    /// Whether each event was seen and its mark has not expired (read-only).
    pub async fn is_duplicate(
        &self,
        events: &[Value],
        now: DateTime<Utc>,
    ) -> Result<Vec<std::result::Result<bool, InvalidEvent>>> {
        let (marks, slots) = self.marks(events);
        let keys: Vec<String> = marks.into_iter().map(|m| m.key).collect();
        let found = self.store.is_duplicate(&self.namespace, &keys, now).await?;
        Ok(slots.into_iter().map(|slot| Ok(found[slot?])).collect())
    }

    /// Marks events as seen (what [`check_and_mark`](Self::check_and_mark) does, keeping
    /// only whether each was new).
    pub async fn mark_seen(
        &self,
        events: &[Value],
        now: DateTime<Utc>,
    ) -> Result<Vec<std::result::Result<bool, InvalidEvent>>> {
        let checked = self.check_and_mark(events, now).await?;
        Ok(checked
            .into_iter()
            .map(|c| c.map(|c| c.verdict.is_new()))
            .collect())
    }

    /// Stores the decision of an event's first processing, returned to later replays;
    /// `false` when its key is not marked.
    pub async fn record_decision(&self, key: &str, decision: &Value) -> Result<bool> {
        self.store
            .record_decision(&self.namespace, key, decision)
            .await
    }

    /// Checks and marks a batch, keeping the new events only.
    pub async fn filter_new(&self, events: Vec<Value>, now: DateTime<Utc>) -> Result<Filtered> {
        let checked = self.check_and_mark(&events, now).await?;
        let mut out = Filtered::default();
        for (event, c) in events.into_iter().zip(checked) {
            match c.map(|c| c.verdict) {
                Ok(EventVerdict::New) => out.new.push(event),
                Ok(EventVerdict::Replay { .. }) => out.replays += 1,
                Ok(EventVerdict::Conflict { .. }) => out.conflicts += 1,
                Err(invalid) => out.invalid.push(invalid),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use serde_json::json;

    fn dedup() -> Deduplicator {
        Deduplicator::new(Arc::new(MemoryStore::new()), "t", ["id", "account"]).unwrap()
    }

    #[tokio::test]
    async fn replay_returns_the_decision_and_conflict_changes_nothing() {
        let d = dedup();
        let now = Utc::now();
        let a = json!({"id": 1, "account": "x", "amount": "1.00"});
        let same_payload_other_order = json!({"amount": "1.00", "account": "x", "id": 1});
        let changed = json!({"id": 1, "account": "x", "amount": "2.00"});
        let first = d
            .check_and_mark(std::slice::from_ref(&a), now)
            .await
            .unwrap();
        let key = first[0].as_ref().unwrap().key.clone();
        assert_eq!(key, "1:x");
        assert_eq!(first[0].as_ref().unwrap().verdict, EventVerdict::New);
        assert!(d.record_decision(&key, &json!("accepted")).await.unwrap());
        let later = d
            .check_and_mark(&[same_payload_other_order, changed.clone()], now)
            .await
            .unwrap();
        assert!(matches!(
            &later[0].as_ref().unwrap().verdict,
            EventVerdict::Replay { decision: Some(v), .. } if v == "accepted"
        ));
        assert_eq!(later[1].as_ref().unwrap().verdict.name(), "conflict");
        // The conflicting payload did not replace the original one.
        let again = d.check_and_mark(&[a], now).await.unwrap();
        assert_eq!(again[0].as_ref().unwrap().verdict.name(), "replay");
        assert_eq!(
            d.is_duplicate(&[changed, json!({"id": 2, "account": "x"})], now)
                .await
                .unwrap(),
            vec![Ok(true), Ok(false)]
        );
    }

    #[tokio::test]
    async fn per_type_ttl_and_filtering() {
        let ttl = Ttl::per_type(
            "event_type",
            Some(Duration::from_secs(60)),
            HashMap::from([("login".to_string(), Some(Duration::from_secs(1)))]),
        )
        .unwrap();
        let d = Deduplicator::new(Arc::new(MemoryStore::new()), "t", ["id"])
            .unwrap()
            .ttl(ttl);
        let now = Utc::now();
        let events = vec![
            json!({"id": "a", "event_type": "login"}),
            json!({"id": "b", "event_type": "trade"}),
            json!({"id": "a", "event_type": "login"}),
            json!({"event_type": "trade"}),
        ];
        let out = d.filter_new(events.clone(), now).await.unwrap();
        assert_eq!(out.new, events[..2]);
        assert_eq!((out.replays, out.conflicts), (1, 0));
        assert_eq!(out.invalid.len(), 1);
        assert_eq!(out.invalid[0].position, 4);
        assert_eq!(out.invalid[0].to_string(), "event 4: field `id` is missing");
        let later = now + chrono::Duration::seconds(2);
        let seen = d.mark_seen(&events[..2], later).await.unwrap();
        assert_eq!(
            seen,
            vec![Ok(true), Ok(false)],
            "login expired after 1s, trade not"
        );
    }
}
