//! The Redis store: event keys only ([`EventKeyStore`]), for many `idem gate` instances
//! sharing one Redis. It has no leases, ledger or maintenance, so it cannot be a run's
//! store ([`open`](super::open) refuses it; [`open_event_keys`](super::open_event_keys)
//! opens it).
//!
//! # Keys and values
//!
//! One string key per (namespace, event key): `PREFIX{NAMESPACE}:KEY`, the prefix from the
//! URL (`redis://HOST[:PORT][/DB]?prefix=P`, or `rediss://…` for TLS, see
//! [`crate::backend::redis`]; default `idem:ev:`). The namespace is a
//! Redis Cluster hash tag, so all keys of one namespace live in one slot and a batch can be
//! pipelined to one node; `%` and `}` in a namespace are percent-encoded so no namespace can
//! end the tag early or collide with another. The value is one compact line
//! `FIRST_SEEN:TTL:=FINGERPRINT` (microseconds; see `Header`), a newline, then the decision
//! as JSON (empty: none).
//!
//! # Why these commands
//!
//! [`check_and_mark`](EventKeyStore::check_and_mark) sends `SET key value NX [PX ttl] GET`
//! for the first occurrence of every key of the batch in one pipeline, one round trip:
//! Redis (≥ 7.0) sets the key when absent and answers nil, or sets nothing and answers the
//! stored value, atomically per key, so two processes marking the same key concurrently get
//! exactly one nil. The stored values decide replay vs conflict, as on the SQL stores.
//! A batch marked *pending* (`check_and_mark_pending`) is one transaction instead
//! (`MULTI`, the same `SET … NX GET` per key, `EXEC`; see `batch`): a pipeline is atomic
//! per command only, and two gates' batches of the same keys, interleaved, would each hold
//! some keys and wait for the other's.
//! [`record_decision`](EventKeyStore::record_decision) is a short Lua script that swaps
//! the decision part of the value and keeps the key's remaining TTL.
//!
//! # Expiry
//!
//! A mark with a TTL is set with `PX`, so Redis removes it by *its own clock*. The value
//! also carries the expiry by the caller's `now`, and a stored mark whose expiry is at or
//! before the `now` of a call counts as expired too (it is re-marked with a compare-and-set
//! script in a second round trip): a key is new again when either clock says it expired.
//! On hosts with synchronised clocks the two agree to within the clock skew.
//!
//! # Durability
//!
//! What survives a Redis crash depends on its persistence settings (AOF `everysec` can lose
//! about the last second of marks, RDB snapshots everything since the last snapshot), so
//! [`Capabilities::durable`] is false; see `docs/redis.md`.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use redis::aio::ConnectionManager;

use super::event_keys::{against_parts, parse_decision, Cursor, Found};
use super::{
    redact_url, Capabilities, EventKeyStore, EventMark, EventVerdict, PendingBatch, StoreBase,
};
use crate::backend::redis::{connect, error, parse_url};
use crate::error::{Error, Result};
use crate::model::micros;

mod batch;
mod scripts;
mod value;

use scripts::*;
use value::{batch_key, px, Encoder, Header, Stored};
pub use value::{cursor_key, redis_key};

/// The Redis event-key store.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    /// The URL without its password.
    url: String,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Opens `redis://HOST[:PORT][/DB][?prefix=P]` (or `rediss://…[&tls_ca=CA.pem]`, TLS)
    /// and checks it answers `PING`.
    pub async fn connect(url: &str) -> Result<Self> {
        let parsed = parse_url(url)?;
        let redacted = redact_url(url);
        let conn = connect(&parsed, &redacted).await?;
        let store = RedisStore {
            conn,
            prefix: parsed.prefix,
            url: redacted,
        };
        store.ping().await?;
        Ok(store)
    }

    /// The key prefix every key of this store starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `PING`: whether Redis answers (the store's health check).
    pub async fn ping(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map_err(|e| self.err("ping", e))?;
        Ok(())
    }

    /// The Redis key of (namespace, key): `PREFIX{NAMESPACE}:KEY`.
    pub fn redis_key(&self, namespace: &str, key: &str) -> String {
        redis_key(&self.prefix, namespace, key)
    }

    fn err(&self, operation: &str, e: redis::RedisError) -> Error {
        error(&self.url, operation, e)
    }

    fn decode(&self, key: &str, value: &[u8]) -> Result<Stored> {
        let text = std::str::from_utf8(value).ok();
        let parsed = text.and_then(|t| {
            let (head, decision) = t.split_once('\n')?;
            let header = Header::parse(head)?;
            let decision = (!decision.is_empty()).then(|| decision.to_string());
            Some(Stored { header, decision })
        });
        parsed.ok_or_else(|| Error::StoreRejected {
            store: self.url.clone(),
            operation: "an event key read".to_string(),
            message: format!(
                "key {key:?} holds a value idem did not write; give idem a key prefix of its own (?prefix=)"
            ),
            source: None,
        })
    }

    /// An answer of a script that is not the shape the script returns.
    fn bad_answer(&self, operation: &str, what: &str) -> Error {
        Error::store(
            &self.url,
            format!("redis {operation}: unexpected answer from the script: {what}"),
        )
    }

    /// The verdicts of a batch without repeated keys straight from the decoded answers,
    /// in input order (no bookkeeping per key); `None` when a stored mark is dead by the
    /// caller's clock (expired, or pending for a batch that died) and must be re-marked
    /// first.
    fn direct_verdicts(
        marks: &[EventMark],
        decoded: &[Option<Stored>],
        states: &States,
        now: DateTime<Utc>,
    ) -> Option<Vec<EventVerdict>> {
        let mut verdicts = Vec::with_capacity(marks.len());
        for (m, stored) in marks.iter().zip(decoded) {
            let Some(stored) = stored else {
                verdicts.push(EventVerdict::New);
                continue;
            };
            let decision = live(stored, states, now)?;
            verdicts.push(against_parts(
                stored.header.fingerprint.as_deref(),
                || parse_decision(decision),
                DateTime::from_timestamp_micros(stored.header.first_seen).unwrap_or_default(),
                m.fingerprint.as_deref(),
            ));
        }
        Some(verdicts)
    }

    /// The stored values of `keys` (`None`: absent), one pipeline of `GET`s.
    async fn get_all(
        &self,
        conn: &mut ConnectionManager,
        keys: &[String],
        operation: &'static str,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("GET").arg(key);
        }
        pipe.query_async(conn)
            .await
            .map_err(|e| self.err(operation, e))
    }

    /// Reads, in one `MGET`, the states of the pending batches that `stored` values name
    /// and `states` does not know yet.
    async fn learn<'a>(
        &self,
        conn: &mut ConnectionManager,
        namespace: &str,
        stored: impl Iterator<Item = &'a Stored>,
        states: &mut States,
    ) -> Result<()> {
        let mut missing: Vec<&str> = stored
            .filter_map(Stored::batch)
            .filter(|m| !states.contains_key(*m))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        missing.sort_unstable();
        missing.dedup();
        let mut cmd = redis::cmd("MGET");
        for marker in &missing {
            cmd.arg(batch_key(&self.prefix, namespace, marker));
        }
        let values: Vec<Option<String>> = cmd
            .query_async(conn)
            .await
            .map_err(|e| self.err("reading pending batches", e))?;
        for (marker, value) in missing.into_iter().zip(values) {
            let state = match value.as_deref() {
                Some("C") => BatchState::Confirmed,
                Some(v) => v
                    .strip_prefix('P')
                    .and_then(|v| v.split(':').next()?.parse().ok())
                    .map_or(BatchState::Dead, BatchState::Pending),
                None => BatchState::Dead,
            };
            states.insert(marker.to_string(), state);
        }
        Ok(())
    }

    /// `check_and_mark`; with `pending` (a batch) the keys it marks name the batch, whose
    /// key goes first in the same script. `ahead`: the batch is marked ahead of its turn
    /// (`check_and_mark_pending_ahead`), or not at all (`None`).
    async fn mark(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        pending: Option<PendingBatch<'_>>,
        ahead: bool,
    ) -> Result<Option<Vec<EventVerdict>>> {
        if marks.is_empty() {
            return Ok(Some(Vec::new()));
        }
        // The first occurrence of each key, in input order (Redis takes no locks, so unlike
        // the SQL stores there is no lock order to keep).
        let mut seen = std::collections::HashSet::with_capacity(marks.len());
        let firsts: Vec<&EventMark> = marks
            .iter()
            .filter(|m| seen.insert(m.key.as_str()))
            .collect();
        let keys: Vec<String> = firsts
            .iter()
            .map(|m| self.redis_key(namespace, &m.key))
            .collect();
        let mut encoder = Encoder::new(now).pending(pending.map(|b| b.marker));
        let values: Vec<Vec<u8>> = firsts.iter().map(|m| encoder.encode(m)).collect();
        let mut conn = self.conn.clone();
        let answers: Option<Vec<Option<Vec<u8>>>> = match pending {
            // A pending batch is marked whole, in one transaction (see `batch`).
            Some(batch) => {
                let keys = batch::Keys {
                    firsts: &firsts,
                    keys: &keys,
                    values: &values,
                };
                self.mark_pending(namespace, keys, batch, now, ahead)
                    .await?
            }
            None => {
                let mut pipe = redis::Pipeline::with_capacity(firsts.len());
                for ((m, key), value) in firsts.iter().zip(&keys).zip(&values) {
                    pipe.add_command(batch::set_nx_get(key, value, px(m)));
                }
                pipe.query_async(&mut conn)
                    .await
                    .map(Some)
                    .map_err(|e| self.err("check_and_mark", e))?
            }
        };
        // Refused, asked ahead of its turn: nothing of it stands.
        let Some(answers) = answers else {
            return Ok(None);
        };
        let decoded = answers
            .iter()
            .zip(&keys)
            .map(|(a, key)| a.as_ref().map(|v| self.decode(key, v)).transpose())
            .collect::<Result<Vec<_>>>()?;
        let mut states = States::new();
        self.learn(&mut conn, namespace, decoded.iter().flatten(), &mut states)
            .await?;
        if firsts.len() == marks.len() {
            if let Some(verdicts) = Self::direct_verdicts(marks, &decoded, &states, now) {
                return Ok(Some(verdicts));
            }
        }
        let mut found = Found::default();
        let mut waiting: Vec<(usize, Answer)> = answers
            .into_iter()
            .zip(decoded)
            .map(|(a, d)| a.zip(d))
            .enumerate()
            .collect();
        for round in 0..=REMARK_ROUNDS {
            // nil: this call marked the key. A stored value dead by the caller's clock (not
            // yet by Redis's, or pending for a batch that died) is re-marked unless someone
            // else re-marked it, or its batch came alive, meanwhile; after the last round
            // the value read stands as stored. Each with the batch its value names when
            // that batch is why it is dead.
            let mut retry: Vec<(usize, Vec<u8>, Option<String>)> = Vec::new();
            for (i, answer) in waiting {
                match answer {
                    None => found.marked(firsts[i].key.clone()),
                    Some((value, stored)) => match live(&stored, &states, now) {
                        None if round < REMARK_ROUNDS => {
                            let batch = (!stored.expired(now))
                                .then(|| stored.batch())
                                .flatten()
                                .map(str::to_string);
                            retry.push((i, value, batch));
                        }
                        decision => {
                            let first_seen =
                                DateTime::from_timestamp_micros(stored.header.first_seen)
                                    .unwrap_or_default();
                            let decision = match decision {
                                Some(d) => d.map(str::to_string),
                                // Dead still after the last round: stands as stored
                                // (a batch's key as its marker).
                                None => stored
                                    .batch()
                                    .map(str::to_string)
                                    .or_else(|| stored.decision.clone()),
                            };
                            found.stored(
                                firsts[i].key.clone(),
                                stored.header.fingerprint,
                                decision,
                                first_seen,
                            );
                        }
                    },
                }
            }
            if retry.is_empty() {
                break;
            }
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(REMARK_EXPIRED).arg(retry.len() * 2);
            for (i, _, batch) in &retry {
                cmd.arg(&keys[*i]);
                match batch {
                    Some(marker) => cmd.arg(batch_key(&self.prefix, namespace, marker)),
                    None => cmd.arg(&keys[*i]),
                };
            }
            for (i, value, _) in &retry {
                let ms = px(firsts[*i]).map(|ms| ms.to_string()).unwrap_or_default();
                cmd.arg(value).arg(&values[*i]).arg(ms);
            }
            cmd.arg(now.timestamp_micros());
            let answers: Vec<Option<Vec<u8>>> = cmd
                .query_async(&mut conn)
                .await
                .map_err(|e| self.err("check_and_mark", e))?;
            waiting = Vec::with_capacity(retry.len());
            for ((i, was, batch), answer) in retry.into_iter().zip(answers) {
                // The same value, found alive: its batch is read again.
                if let (Some(marker), Some(v)) = (&batch, &answer) {
                    if *v == was {
                        states.remove(marker);
                    }
                }
                let stored = match answer {
                    Some(v) => Some((self.decode(&keys[i], &v)?, v)),
                    None => None,
                };
                waiting.push((i, stored.map(|(s, v)| (v, s))));
            }
            let fresh = waiting
                .iter()
                .filter_map(|(_, a)| a.as_ref().map(|(_, s)| s));
            self.learn(&mut conn, namespace, fresh, &mut states).await?;
        }
        Ok(Some(found.verdicts(marks, now)))
    }
}

/// What a pending batch's key says ([`batch_key`]).
#[derive(Debug, Clone, Copy)]
enum BatchState {
    /// Unconfirmed until this deadline (microseconds since the epoch).
    Pending(i64),
    Confirmed,
    /// Gone (its timeout passed unconfirmed) or not idem's.
    Dead,
}

/// One key's answer to a marking call, as sent back and decoded (`None`: the call marked
/// the key).
type Answer = Option<(Vec<u8>, Stored)>;

/// The states of the pending batches a call met, by marker.
type States = std::collections::HashMap<String, BatchState>;

/// The decision a stored value stands for at `now`: `None` when it is dead (expired by the
/// caller's clock, or naming a batch that died or whose deadline passed), else its
/// decision text (a pending batch's marker while pending; none once confirmed).
fn live<'a>(stored: &'a Stored, states: &States, now: DateTime<Utc>) -> Option<Option<&'a str>> {
    if stored.expired(now) {
        return None;
    }
    let Some(marker) = stored.batch() else {
        return Some(stored.decision.as_deref());
    };
    match states.get(marker).copied().unwrap_or(BatchState::Dead) {
        BatchState::Pending(deadline) if deadline > now.timestamp_micros() => Some(Some(marker)),
        BatchState::Confirmed => Some(None),
        _ => None,
    }
}

#[async_trait]
impl StoreBase for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn location(&self) -> String {
        self.url.clone()
    }

    /// Shared by processes; not durable (depends on Redis persistence, see module docs).
    /// Pending marks are confirmed. Batches sent while others are still out queue behind
    /// them on the one connection, so Redis has the next one to work on as soon as it
    /// answered one (measured: 2 at once 0.91× raw pipelined `SET NX`, 3 and 4 about
    /// 1.05×, 1 0.78×).
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            durable: false,
            cross_process: true,
            confirms_pending: true,
            batch_concurrency: 4,
            marks_ahead: true,
        }
    }

    /// Nothing to migrate: a `PING`.
    async fn migrate(&self) -> Result<()> {
        self.ping().await
    }
}

#[async_trait]
impl EventKeyStore for RedisStore {
    async fn check_and_mark(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
    ) -> Result<Vec<EventVerdict>> {
        self.mark(namespace, marks, now, None, false)
            .await
            .map(Option::unwrap_or_default)
    }

    async fn forget_event_keys(&self, namespace: &str, keys: &[String]) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        let mut cmd = redis::cmd("DEL");
        for key in keys {
            cmd.arg(self.redis_key(namespace, key));
        }
        let mut conn = self.conn.clone();
        cmd.query_async::<u64>(&mut conn)
            .await
            .map_err(|e| self.err("forget_event_keys", e))
    }

    async fn unmark_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        first_seen: DateTime<Utc>,
    ) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        // The stored value begins `FIRST_SEEN:` (see `Header`).
        let head = format!("{}:", micros(first_seen).timestamp_micros());
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("EVAL")
                .arg(UNMARK)
                .arg(1)
                .arg(self.redis_key(namespace, key))
                .arg(&head);
        }
        let mut conn = self.conn.clone();
        let deleted: Vec<u64> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| self.err("unmark_event_keys", e))?;
        Ok(deleted.iter().sum())
    }

    async fn confirm_event_keys(
        &self,
        namespace: &str,
        keys: &[(String, Option<DateTime<Utc>>)],
        owner: &str,
    ) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        let now = Utc::now();
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(CONFIRM).arg(keys.len());
        for (key, _) in keys {
            cmd.arg(self.redis_key(namespace, key));
        }
        cmd.arg(owner);
        for (_, at) in keys {
            // The header's TTL field counts from first seen, which the script reads; the
            // key's own expiry counts from now.
            match at {
                None => cmd.arg("").arg(""),
                Some(at) => cmd
                    .arg(micros(*at).timestamp_micros().to_string())
                    .arg((*at - now).num_milliseconds().max(1).to_string()),
            };
        }
        let mut conn = self.conn.clone();
        cmd.query_async(&mut conn)
            .await
            .map_err(|e| self.err("confirm_event_keys", e))
    }

    async fn cursor(&self, namespace: &str, name: &str) -> Result<Option<Cursor>> {
        let mut conn = self.conn.clone();
        let value: Option<String> = redis::cmd("GET")
            .arg(cursor_key(&self.prefix, namespace, name))
            .query_async(&mut conn)
            .await
            .map_err(|e| self.err("cursor", e))?;
        Ok(value.map(|v| {
            let (position, json) = v.split_once('\n').unwrap_or((&v, ""));
            Cursor::from_stored(position.to_string(), json)
        }))
    }

    async fn advance_cursor(&self, namespace: &str, name: &str, to: &Cursor) -> Result<()> {
        let mut conn = self.conn.clone();
        redis::cmd("EVAL")
            .arg(ADVANCE_CURSOR)
            .arg(1)
            .arg(cursor_key(&self.prefix, namespace, name))
            .arg(&to.position)
            .arg(to.value_text())
            .query_async::<i64>(&mut conn)
            .await
            .map_err(|e| self.err("advance_cursor", e))?;
        Ok(())
    }

    async fn is_duplicate(
        &self,
        namespace: &str,
        keys: &[String],
        now: DateTime<Utc>,
    ) -> Result<Vec<bool>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let redis_keys: Vec<String> = keys.iter().map(|k| self.redis_key(namespace, k)).collect();
        let mut conn = self.conn.clone();
        let values = self.get_all(&mut conn, &redis_keys, "is_duplicate").await?;
        let decoded = values
            .iter()
            .zip(&redis_keys)
            .map(|(v, key)| v.as_ref().map(|v| self.decode(key, v)).transpose())
            .collect::<Result<Vec<_>>>()?;
        let mut states = States::new();
        self.learn(&mut conn, namespace, decoded.iter().flatten(), &mut states)
            .await?;
        Ok(decoded
            .iter()
            .map(|d| d.as_ref().is_some_and(|s| live(s, &states, now).is_some()))
            .collect())
    }

    async fn check_all_marked(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<EventVerdict>>> {
        let firsts = crate::store::event_keys::firsts(marks);
        if firsts.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let keys: Vec<String> = firsts
            .iter()
            .map(|m| self.redis_key(namespace, &m.key))
            .collect();
        let mut conn = self.conn.clone();
        let values = self.get_all(&mut conn, &keys, "check_all_marked").await?;
        let mut decoded = Vec::with_capacity(values.len());
        for (value, key) in values.iter().zip(&keys) {
            match value {
                Some(v) => decoded.push(self.decode(key, v)?),
                None => return Ok(None),
            }
        }
        let mut states = States::new();
        self.learn(&mut conn, namespace, decoded.iter(), &mut states)
            .await?;
        let mut found = Found::default();
        for (m, stored) in firsts.iter().zip(&decoded) {
            let Some(decision) = live(stored, &states, now) else {
                return Ok(None);
            };
            found.stored(
                m.key.clone(),
                stored.header.fingerprint.clone(),
                decision.map(str::to_string),
                DateTime::from_timestamp_micros(stored.header.first_seen).unwrap_or_default(),
            );
        }
        Ok(Some(found.verdicts(marks, now)))
    }

    async fn record_decision(
        &self,
        namespace: &str,
        key: &str,
        decision: &serde_json::Value,
    ) -> Result<bool> {
        let mut conn = self.conn.clone();
        let done: i64 = redis::cmd("EVAL")
            .arg(RECORD_DECISION)
            .arg(1)
            .arg(self.redis_key(namespace, key))
            .arg(decision.to_string())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.err("record_decision", e))?;
        Ok(done == 1)
    }

    async fn mark_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        now: chrono::DateTime<chrono::Utc>,
    ) -> crate::error::Result<Vec<bool>> {
        crate::store::fallback::mark_by_check(self, namespace, keys, now).await
    }

    /// The batch's pending state is one key of its own (`PREFIX{NAMESPACE}#pending:MARKER`) that its keys
    /// name; they carry their real expiry from the start.
    async fn check_and_mark_pending(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        batch: PendingBatch<'_>,
        cursor: Option<(&str, &Cursor)>,
    ) -> Result<Vec<EventVerdict>> {
        let verdicts = self
            .mark(namespace, marks, now, Some(batch), false)
            .await?
            .unwrap_or_default();
        if let Some((name, to)) = cursor {
            self.advance_cursor(namespace, name, to).await?;
        }
        Ok(verdicts)
    }

    /// The script that marks the batch first checks the row's last place marked (its own
    /// key, `turn_key`), in the same atomic run.
    async fn check_and_mark_pending_ahead(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        batch: PendingBatch<'_>,
    ) -> Result<Option<Vec<EventVerdict>>> {
        if batch.turn.is_none() {
            return Ok(None);
        }
        self.mark(namespace, marks, now, Some(batch), true).await
    }

    /// Whole: the batch's one key set confirmed, which confirms every key naming it. Some
    /// of its keys only: those stop naming it, the others stay pending.
    async fn confirm_pending_batch(
        &self,
        namespace: &str,
        marker: &str,
        keys: &[(String, Option<DateTime<Utc>>)],
        whole: bool,
    ) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        let mut conn = self.conn.clone();
        if whole {
            let done: u64 = redis::cmd("EVAL")
                .arg(CONFIRM_BATCH)
                .arg(1)
                .arg(batch_key(&self.prefix, namespace, marker))
                .query_async(&mut conn)
                .await
                .map_err(|e| self.err("confirm_pending_batch", e))?;
            return Ok(if done > 0 { keys.len() as u64 } else { 0 });
        }
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(CONFIRM_KEYS).arg(keys.len());
        for (key, _) in keys {
            cmd.arg(self.redis_key(namespace, key));
        }
        cmd.arg(format!("{}{marker}", value::PENDING));
        cmd.query_async(&mut conn)
            .await
            .map_err(|e| self.err("confirm_pending_batch", e))
    }

    async fn check_and_mark_advancing(
        &self,
        namespace: &str,
        marks: &[crate::store::EventMark],
        now: chrono::DateTime<chrono::Utc>,
        cursor: &str,
        to: &crate::store::Cursor,
    ) -> crate::error::Result<Vec<crate::store::EventVerdict>> {
        crate::store::fallback::mark_then_advance(self, namespace, marks, now, cursor, to).await
    }
}
