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

/// Replaces the decision part of a value, keeping the key's TTL: 1 when the key exists.
const RECORD_DECISION: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local i = string.find(v, '\n', 1, true)
if not i then return redis.error_reply('value of ' .. KEYS[1] .. ' was not written by idem') end
redis.call('SET', KEYS[1], string.sub(v, 1, i) .. ARGV[1], 'KEEPTTL')
return 1
";

/// Re-marks a key whose stored value (ARGV[1]) expired by the caller's clock: sets ARGV[2]
/// (with PX ARGV[3] unless empty) when the key is gone or still holds ARGV[1] and answers
/// nil; otherwise answers the value someone else stored meanwhile.
const REMARK_EXPIRED: &str = r"
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return v end
if ARGV[3] == '' then
  redis.call('SET', KEYS[1], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return false
";

/// Deletes a key whose stored value begins with ARGV[1] (`FIRST_SEEN:`): 1 when deleted.
const UNMARK: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Confirms pending marks, one call for a batch's keys (one namespace: one hash slot):
/// for each KEYS[i] whose stored value's decision part is exactly ARGV[1] (the pending
/// marker), rewrites its header's TTL field for the expiry ARGV[2i] (microseconds since
/// the epoch; empty: never), clears the decision, and sets the key's expiry to PX
/// ARGV[2i+1] (empty: none). Answers how many were confirmed.
const CONFIRM: &str = r"
local n = 0
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  local nl = v and string.find(v, '\n', 1, true)
  if nl and string.sub(v, nl + 1) == ARGV[1] then
    local c1 = string.find(v, ':', 1, true)
    local c2 = c1 and string.find(v, ':', c1 + 1, true)
    if c2 and c2 < nl then
      local at, px = ARGV[2 * i], ARGV[2 * i + 1]
      local ttl = ''
      if at ~= '' then
        ttl = string.format('%d', tonumber(at) - tonumber(string.sub(v, 1, c1 - 1)))
      end
      local nv = string.sub(v, 1, c1) .. ttl .. string.sub(v, c2, nl)
      if px == '' then
        redis.call('SET', KEYS[i], nv)
      else
        redis.call('SET', KEYS[i], nv, 'PX', px)
      end
      n = n + 1
    end
  end
end
return n
";

/// Rounds of re-marking keys expired by the caller's clock before the last value read
/// stands as stored.
const REMARK_ROUNDS: usize = 3;

/// Moves a cursor (value `POSITION\nJSON`) to ARGV[1] (value ARGV[2]) when ARGV[1] is
/// after its stored position; positions are lowercase hex, so Lua's string order is
/// their byte order.
const ADVANCE_CURSOR: &str = r"
local v = redis.call('GET', KEYS[1])
if v then
  local p = string.match(v, '^[^\n]*')
  if not (p < ARGV[1]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1] .. '\n' .. ARGV[2])
return 1
";

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

/// The first line of a stored value: `FIRST_SEEN:TTL:FINGERPRINT`. `FIRST_SEEN` is
/// microseconds since the epoch; `TTL` the microseconds from it to the expiry by the
/// marking caller's clock (empty: never); `FINGERPRINT` empty when there is none, else `=`
/// and the fingerprint with `%` and newlines percent-encoded (so the line ends at the first
/// newline, where the decision begins). Compact on purpose: every byte is sent and stored
/// per key.
#[derive(Debug, PartialEq)]
struct Header {
    /// First seen, microseconds since the epoch.
    first_seen: i64,
    /// Expiry by the marking caller's clock, microseconds since the epoch.
    expires: Option<i64>,
    /// Payload fingerprint.
    fingerprint: Option<String>,
}

impl Header {
    fn parse(line: &str) -> Option<Header> {
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
struct Stored {
    header: Header,
    decision: Option<String>,
}

impl Stored {
    fn expired(&self, now: DateTime<Utc>) -> bool {
        self.header
            .expires
            .is_some_and(|e| e <= now.timestamp_micros())
    }
}

/// Writes stored values for the marks of one call: the parts every value of the call
/// shares (`FIRST_SEEN:`, and the TTL's text for the last TTL seen) are made once.
struct Encoder {
    now: DateTime<Utc>,
    /// `FIRST_SEEN:`.
    head: String,
    first_seen: i64,
    /// The last TTL encoded and its `TTL` text.
    ttl: Option<(std::time::Duration, String)>,
}

impl Encoder {
    fn new(now: DateTime<Utc>) -> Self {
        let first_seen = micros(now).timestamp_micros();
        Encoder {
            now,
            head: format!("{first_seen}:"),
            first_seen,
            ttl: None,
        }
    }

    fn encode(&mut self, m: &EventMark) -> Vec<u8> {
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
        if let Some(d) = &m.decision {
            let _ = serde_json::to_writer(&mut value, d);
        }
        value
    }
}

#[cfg(test)]
fn encode(m: &EventMark, now: DateTime<Utc>) -> Vec<u8> {
    Encoder::new(now).encode(m)
}

/// The longest `PX` sent (100 years): Redis refuses an expiry that overflows its clock.
const MAX_PX_MS: u128 = 100 * 365 * 24 * 3600 * 1000;

/// `PX` milliseconds for a mark (`None`: no expiry); at least 1, as Redis requires.
fn px(m: &EventMark) -> Option<u64> {
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
