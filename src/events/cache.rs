//! A result cache by (request_id, events fingerprint) on any event-key store (seed 000):
//! a retry of a request with the same events gets the stored result without running the
//! work again.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use idem::events::cache::ResultCache;
//! use idem::store::MemoryStore;
//! use serde_json::json;
//!
//! let cache = ResultCache::new(Arc::new(MemoryStore::new()), "detect");
//! let events = [json!({"account_id": "a1", "price": "10.5"})];
//! let first = cache.cached("req-1", &events, || async { Ok(json!(["seq-1"])) }).await.unwrap();
//! let again = cache.cached("req-1", &events, || async { unreachable!() }).await.unwrap();
//! assert_eq!(first, again);
//! # });
//! ```
//!
//! How it sits on the event-key table: one key per (request_id, fingerprint) — the
//! request id, `/`, and the fingerprint — in the cache's namespace, the result stored as
//! the key's decision (`{"result": …}`). So, as seed 000 keys its cache by the tuple, **the
//! same request id with other events is another entry**: the work runs again (a retry
//! whose events changed is new work, not a conflict), and both results stay cached.
//!
//! * `cached` marks the key first (one round trip). New: it runs the closure, stores the
//!   result and returns it. Marked with a result: the stored result, closure not called.
//!   Marked without a result (the first call failed, crashed, or is still running): the
//!   closure runs (again) and its result is stored — the cache saves repeated work, it is
//!   not a lock; use `idem run`'s leases when two workers must never run one request at
//!   once.
//! * A closure that fails: its error is returned and the mark is removed, so the next
//!   retry runs it again.
//! * Cleared by TTL ([`ResultCache::ttl`]; default 24 h, the store expires it) or on
//!   completion ([`ResultCache::clear`]: deletes the request's entry for those events).
//!   BigQuery keeps cached results until their TTL: it cannot delete single keys.
//!
//! The fingerprint is SHA-256 over the sorted content hashes of the events (each event's
//! canonical JSON, `ContentHashExtractor`), so the events' order and their fields' order
//! do not matter.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{ContentHashExtractor, Extractor};
use crate::error::{Error, Result};
use crate::store::{EventKeyStore, EventMark, EventVerdict};

/// Results by (request_id, events fingerprint) on an event-key store.
#[derive(Debug, Clone)]
pub struct ResultCache {
    store: Arc<dyn EventKeyStore>,
    namespace: String,
    ttl: Option<Duration>,
    /// The time a call marks its key at: now, or in tests a time the test moves.
    #[cfg(test)]
    now: Option<Arc<std::sync::Mutex<chrono::DateTime<Utc>>>>,
}

/// Where a [`ResultCache::cached_with_origin`] result came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOrigin {
    /// Stored by an earlier call: the closure was not called.
    Hit,
    /// Computed by this call (and now stored).
    Computed,
}

impl ResultCache {
    /// A cache in `namespace` of `store` (keep it apart from gate namespaces), TTL 24 h.
    pub fn new(store: Arc<dyn EventKeyStore>, namespace: impl Into<String>) -> Self {
        ResultCache {
            store,
            namespace: namespace.into(),
            ttl: Some(Duration::from_secs(24 * 3600)),
            #[cfg(test)]
            now: None,
        }
    }

    fn now(&self) -> chrono::DateTime<Utc> {
        #[cfg(test)]
        if let Some(now) = &self.now {
            return *now.lock().unwrap();
        }
        Utc::now()
    }

    /// How long a cached result lasts (`None`: until [`clear`](Self::clear)).
    pub fn ttl(mut self, ttl: Option<Duration>) -> Self {
        self.ttl = ttl;
        self
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The fingerprint of a set of events: SHA-256 (64 hex digits) of their sorted content
    /// hashes — the same for the same events in any order.
    pub fn fingerprint(events: &[Value]) -> Result<String> {
        let hasher = ContentHashExtractor::new();
        let mut hashes = events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                hasher
                    .extract(e)
                    .map_err(|err| Error::input(format!("event {}: {err}", i + 1)))
            })
            .collect::<Result<Vec<String>>>()?;
        hashes.sort_unstable();
        let mut sha = Sha256::new();
        for h in &hashes {
            sha.update(h.as_bytes());
            sha.update(b"\n");
        }
        Ok(format!("{:x}", sha.finalize()))
    }

    fn key(request_id: &str, fingerprint: &str) -> String {
        format!("{request_id}/{fingerprint}")
    }

    /// The cached result of `request_id` for `events`, or `work()`'s, stored for the next
    /// call (see the module's documentation).
    pub async fn cached<F, Fut>(&self, request_id: &str, events: &[Value], work: F) -> Result<Value>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Value>>,
    {
        Ok(self.cached_with_origin(request_id, events, work).await?.0)
    }

    /// [`cached`](Self::cached), saying whether the result was a hit.
    pub async fn cached_with_origin<F, Fut>(
        &self,
        request_id: &str,
        events: &[Value],
        work: F,
    ) -> Result<(Value, CacheOrigin)>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Value>>,
    {
        let key = Self::key(request_id, &Self::fingerprint(events)?);
        let mut mark = EventMark::key(key.clone());
        mark.ttl = self.ttl;
        let verdict = self
            .store
            .check_and_mark(&self.namespace, std::slice::from_ref(&mark), self.now())
            .await?
            .pop()
            .ok_or_else(|| Error::store(self.store.location(), "no verdict for a cache key"))?;
        if let EventVerdict::Replay {
            decision: Some(stored),
            ..
        } = &verdict
        {
            if let Some(result) = stored.get("result") {
                return Ok((result.clone(), CacheOrigin::Hit));
            }
        }
        match work().await {
            Ok(result) => {
                self.store
                    .record_decision(&self.namespace, &key, &json!({ "result": result }))
                    .await?;
                Ok((result, CacheOrigin::Computed))
            }
            Err(e) => {
                if verdict.is_new() {
                    // Best effort: a store that cannot delete keeps the bare mark, which
                    // the next call treats as "no result" and runs the work again.
                    let _ = self.store.forget_event_keys(&self.namespace, &[key]).await;
                }
                Err(e)
            }
        }
    }

    /// Clears the cached result of `request_id` for `events` (on completion): `true` when
    /// there was one.
    pub async fn clear(&self, request_id: &str, events: &[Value]) -> Result<bool> {
        let key = Self::key(request_id, &Self::fingerprint(events)?);
        Ok(self
            .store
            .forget_event_keys(&self.namespace, &[key])
            .await?
            > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    #[test]
    fn fingerprint_ignores_event_and_field_order() {
        let a = json!({"x": 1, "y": "b"});
        let b = json!({"z": [1, 2]});
        let one = ResultCache::fingerprint(&[a.clone(), b.clone()]).unwrap();
        let two = ResultCache::fingerprint(&[b, json!({"y": "b", "x": 1})]).unwrap();
        assert_eq!(one, two);
        assert_eq!(one.len(), 64);
        assert_ne!(one, ResultCache::fingerprint(&[a]).unwrap());
    }

    #[tokio::test]
    async fn a_result_expires_with_its_ttl() {
        let now = Arc::new(std::sync::Mutex::new(Utc::now()));
        let cache = ResultCache {
            now: Some(now.clone()),
            ..ResultCache::new(Arc::new(MemoryStore::new()), "c")
                .ttl(Some(Duration::from_millis(30)))
        };
        let events = [json!({"id": 1})];
        let first = cache
            .cached("r", &events, || async { Ok(json!(1)) })
            .await
            .unwrap();
        *now.lock().unwrap() += chrono::Duration::milliseconds(29);
        let hit = cache
            .cached_with_origin("r", &events, || async { Ok(json!(2)) })
            .await
            .unwrap();
        assert_eq!((first, hit.1), (json!(1), CacheOrigin::Hit));
        *now.lock().unwrap() += chrono::Duration::milliseconds(31);
        let later = cache
            .cached_with_origin("r", &events, || async { Ok(json!(3)) })
            .await
            .unwrap();
        assert_eq!(later, (json!(3), CacheOrigin::Computed));
    }
}
