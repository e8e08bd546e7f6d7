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

use super::event_keys::{against, parse_decision, Cursor, Found, StoredEvent};
use super::{redact_url, Capabilities, EventKeyStore, EventMark, EventVerdict, StoreBase};
use crate::backend::redis::{connect, error, parse_url};
use crate::error::{Error, Result};
use crate::model::micros;

mod scripts;
mod value;

use scripts::*;
pub use value::{cursor_key, redis_key};
use value::{px, Encoder, Header, Stored};

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

    /// The verdicts of a batch without repeated keys straight from the answers, in input
    /// order (no bookkeeping per key); `None` when a stored mark expired by the caller's
    /// clock and must be re-marked first.
    fn direct_verdicts(
        &self,
        keys: &[String],
        marks: &[EventMark],
        answers: &[Option<Vec<u8>>],
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<EventVerdict>>> {
        let mut verdicts = Vec::with_capacity(marks.len());
        for ((m, key), answer) in marks.iter().zip(keys).zip(answers) {
            let Some(value) = answer else {
                verdicts.push(EventVerdict::New);
                continue;
            };
            let stored = self.decode(key, value)?;
            if stored.expired(now) {
                return Ok(None);
            }
            let row = StoredEvent {
                fingerprint: stored.header.fingerprint,
                decision: parse_decision(stored.decision),
                first_seen: DateTime::from_timestamp_micros(stored.header.first_seen)
                    .unwrap_or_default(),
            };
            verdicts.push(against(&row, m.fingerprint.as_deref()));
        }
        Ok(Some(verdicts))
    }

    fn found(found: &mut Found, key: &str, stored: Stored) {
        let first_seen =
            DateTime::from_timestamp_micros(stored.header.first_seen).unwrap_or_default();
        found.stored(
            key.to_string(),
            stored.header.fingerprint,
            stored.decision,
            first_seen,
        );
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
        if marks.is_empty() {
            return Ok(Vec::new());
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
        let mut encoder = Encoder::new(now);
        let values: Vec<Vec<u8>> = firsts.iter().map(|m| encoder.encode(m)).collect();
        let mut pipe = redis::Pipeline::with_capacity(firsts.len());
        for ((m, key), value) in firsts.iter().zip(&keys).zip(&values) {
            // SET key value NX [PX ms] GET, sized up front (no regrowth per argument).
            let mut cmd = redis::Cmd::with_capacity(7, key.len() + value.len() + 32);
            cmd.arg("SET").arg(key).arg(value).arg("NX");
            if let Some(ms) = px(m) {
                cmd.arg("PX").arg(ms);
            }
            cmd.arg("GET");
            pipe.add_command(cmd);
        }
        let mut conn = self.conn.clone();
        let answers: Vec<Option<Vec<u8>>> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| self.err("check_and_mark", e))?;
        if firsts.len() == marks.len() {
            if let Some(verdicts) = self.direct_verdicts(&keys, marks, &answers, now)? {
                return Ok(verdicts);
            }
        }
        let mut found = Found::default();
        let mut pending: Vec<(usize, Option<Vec<u8>>)> = answers.into_iter().enumerate().collect();
        for round in 0..=REMARK_ROUNDS {
            // nil: this call marked the key. A stored value expired by the caller's clock
            // (not yet by Redis's) is re-marked unless someone else re-marked it meanwhile;
            // after the last round the value read stands as stored.
            let mut retry: Vec<(usize, Vec<u8>)> = Vec::new();
            for (i, answer) in pending {
                match answer {
                    None => found.marked(firsts[i].key.clone()),
                    Some(value) => {
                        let stored = self.decode(&keys[i], &value)?;
                        if stored.expired(now) && round < REMARK_ROUNDS {
                            retry.push((i, value));
                        } else {
                            Self::found(&mut found, &firsts[i].key, stored);
                        }
                    }
                }
            }
            if retry.is_empty() {
                break;
            }
            let mut pipe = redis::pipe();
            for (i, value) in &retry {
                let ms = px(firsts[*i]).map(|ms| ms.to_string()).unwrap_or_default();
                pipe.cmd("EVAL")
                    .arg(REMARK_EXPIRED)
                    .arg(1)
                    .arg(&keys[*i])
                    .arg(value)
                    .arg(&values[*i])
                    .arg(ms);
            }
            let answers: Vec<Option<Vec<u8>>> = pipe
                .query_async(&mut conn)
                .await
                .map_err(|e| self.err("check_and_mark", e))?;
            pending = retry.iter().map(|(i, _)| *i).zip(answers).collect();
        }
        Ok(found.verdicts(marks, now))
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
        let mut pipe = redis::pipe();
        for key in &redis_keys {
            pipe.cmd("GET").arg(key);
        }
        let mut conn = self.conn.clone();
        let values: Vec<Option<Vec<u8>>> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| self.err("is_duplicate", e))?;
        values
            .iter()
            .zip(&redis_keys)
            .map(|(v, key)| match v {
                None => Ok(false),
                Some(v) => Ok(!self.decode(key, v)?.expired(now)),
            })
            .collect()
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

    async fn check_and_mark_pending(
        &self,
        namespace: &str,
        marks: &[crate::store::EventMark],
        now: chrono::DateTime<chrono::Utc>,
        batch: crate::store::PendingBatch<'_>,
        cursor: Option<(&str, &crate::store::Cursor)>,
    ) -> crate::error::Result<Vec<crate::store::EventVerdict>> {
        crate::store::fallback::pending_per_key(self, namespace, marks, now, batch, cursor).await
    }

    async fn confirm_pending_batch(
        &self,
        namespace: &str,
        marker: &str,
        keys: &[(String, Option<chrono::DateTime<chrono::Utc>>)],
        _whole: bool,
    ) -> crate::error::Result<u64> {
        crate::store::fallback::confirm_batch_per_key(self, namespace, marker, keys).await
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
