//! In-memory store: for unit tests and library users who want no database.
//!
//! Correct across tasks and threads of one process (one mutex guards all state), gone when
//! the process exits.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::common::report_cleanup_done;
use super::event_keys::{self, StoredEvent};
use super::rows::LeaseRow;
use super::{
    lease_expiry, Capabilities, Claim, ClaimRequest, CleanupPolicy, CleanupReport, Cursor,
    EventKeyStore, EventMark, EventVerdict, Finish, KeyLookup, Lease, LeaseHolder, LeaseStore,
    LedgerStore, MaintenanceStore, RunFilter, StoreBase,
};
use crate::error::{Error, Result};
use crate::model::{micros, KeyKind, KeyRecord, RunRecord, RunStatus};
use crate::store::OpenLease;

#[derive(Debug, Default)]
struct State {
    leases: HashMap<(String, String), LeaseRow>,
    /// Of each lease: its last heartbeat (claim or renewal), the claiming host and pid.
    holders: HashMap<(String, String), (DateTime<Utc>, String, i64)>,
    keys: HashMap<(KeyKind, String), Vec<KeyRecord>>,
    runs: Vec<RunRecord>,
    events: HashMap<String, HashMap<String, DateTime<Utc>>>,
    /// Fingerprint, decision and expiry of the keys in `events` (a key absent from
    /// `events` is not marked, whatever this holds).
    event_rows: HashMap<(String, String), EventRow>,
    /// Named cursors by (namespace, name).
    cursors: HashMap<(String, String), Cursor>,
    /// Pending batches by id (as SQLite's and Postgres's `event_pending`): a key naming one
    /// still here is pending until its deadline, then dead; naming one gone, confirmed.
    pending: HashMap<u64, PendingRow>,
    /// The id the next pending batch gets (never given twice).
    next_pending: u64,
}

#[derive(Debug, Clone, Default)]
struct EventRow {
    fingerprint: Option<String>,
    decision: Option<serde_json::Value>,
    expires_at: Option<DateTime<Utc>>,
    /// The pending batch that marked it.
    pending: Option<u64>,
}

#[derive(Debug, Clone)]
struct PendingRow {
    namespace: String,
    marker: serde_json::Value,
    deadline: DateTime<Utc>,
}

impl State {
    /// Whether a key's mark expired before `before` (a key that never expires never has),
    /// or its pending batch's deadline passed before it unconfirmed.
    fn event_expired_before(&self, namespace: &str, key: &str, before: DateTime<Utc>) -> bool {
        let Some(row) = self
            .event_rows
            .get(&(namespace.to_string(), key.to_string()))
        else {
            return false;
        };
        row.expires_at.is_some_and(|at| at < before)
            || self.batch_of(row).is_some_and(|b| b.deadline < before)
    }

    /// The pending batch a key's row names, while it is unconfirmed.
    fn batch_of(&self, row: &EventRow) -> Option<&PendingRow> {
        row.pending.and_then(|id| self.pending.get(&id))
    }

    /// The stored, unexpired mark of a key.
    fn event(&self, namespace: &str, key: &str, now: DateTime<Utc>) -> Option<StoredEvent> {
        let first_seen = *self.events.get(namespace)?.get(key)?;
        let row = self
            .event_rows
            .get(&(namespace.to_string(), key.to_string()))
            .cloned()
            .unwrap_or_default();
        if row.expires_at.is_some_and(|at| at <= now) {
            return None;
        }
        let decision = match self.batch_of(&row) {
            Some(batch) if batch.deadline <= now => return None,
            Some(batch) => Some(batch.marker.clone()),
            None => row.decision,
        };
        Some(StoredEvent {
            fingerprint: row.fingerprint,
            decision,
            first_seen,
        })
    }
}

/// A store that keeps everything in process memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State half-updated in a way that
        // matters more than losing the whole store, so recover the guard.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn lease_lost(lease: &Lease, row: Option<&LeaseRow>) -> Error {
    lease.lost(row.and_then(|r| r.holder.clone()))
}

fn holds(row: Option<&LeaseRow>, lease: &Lease) -> bool {
    matches!(row, Some(r) if r.token == lease.token && r.holder.as_deref() == Some(lease.run_id.as_str()))
}

#[async_trait]
impl StoreBase for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn location(&self) -> String {
        "memory://".into()
    }

    /// Nothing beyond this instance; pending marks are confirmed.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            confirms_pending: true,
            ..Capabilities::NONE
        }
    }

    async fn migrate(&self) -> Result<()> {
        Ok(())
    }
}

#[async_trait]
impl LeaseStore for MemoryStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim> {
        let now = micros(request.now);
        let mut state = self.lock();
        let id = (request.processor.to_string(), request.scope.to_string());
        let row = state.leases.get(&id);
        if let Some(holder) = row.and_then(|r| r.held_at(now)) {
            return Ok(Claim::Held(holder));
        }
        let token = row.map(|r| r.token + 1).unwrap_or(1);
        let expires_at = lease_expiry(now, request.ttl);
        state.holders.insert(
            id.clone(),
            (
                now,
                crate::model::host_name().to_string(),
                i64::from(std::process::id()),
            ),
        );
        state.leases.insert(
            id,
            LeaseRow {
                holder: Some(request.run_id.to_string()),
                token,
                acquired_at: now,
                expires_at,
            },
        );
        Ok(request.acquired(token, now, expires_at))
    }

    async fn lease_holder(
        &self,
        processor: &str,
        scope: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<LeaseHolder>> {
        let state = self.lock();
        Ok(state
            .leases
            .get(&(processor.to_string(), scope.to_string()))
            .and_then(|r| r.held_at(now)))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration, now: DateTime<Utc>) -> Result<Lease> {
        let mut state = self.lock();
        let id = (lease.processor.clone(), lease.scope.clone());
        let row = state.leases.get_mut(&id);
        match row {
            Some(r) if r.token == lease.token && r.holder.as_deref() == Some(&lease.run_id) => {
                r.expires_at = lease_expiry(now, ttl);
                let renewed = Lease {
                    expires_at: r.expires_at,
                    ..lease.clone()
                };
                if let Some(h) = state.holders.get_mut(&id) {
                    h.0 = micros(now);
                }
                Ok(renewed)
            }
            other => Err(lease_lost(lease, other.map(|r| &*r))),
        }
    }

    async fn release(&self, lease: &Lease, now: DateTime<Utc>) -> Result<bool> {
        let mut state = self.lock();
        let id = (lease.processor.clone(), lease.scope.clone());
        if !holds(state.leases.get(&id), lease) {
            return Ok(false);
        }
        let r = state.leases.get_mut(&id).expect("checked above");
        r.holder = None;
        r.expires_at = micros(now);
        Ok(true)
    }

    async fn open_leases(&self, processor: Option<&str>) -> Result<Vec<OpenLease>> {
        let state = self.lock();
        let mut open: Vec<OpenLease> = state
            .leases
            .iter()
            .filter(|((p, _), _)| processor.is_none_or(|want| want == p))
            .filter_map(|(id, r)| {
                let holder = state.holders.get(id);
                Some(OpenLease {
                    processor: id.0.clone(),
                    scope: id.1.clone(),
                    run_id: r.holder.clone()?,
                    token: r.token,
                    acquired_at: r.acquired_at,
                    expires_at: r.expires_at,
                    heartbeat_at: holder.map(|h| h.0),
                    host: holder.map(|h| h.1.clone()),
                    pid: holder.map(|h| h.2),
                })
            })
            .collect();
        open.sort_by(|a, b| {
            (b.acquired_at, &a.processor, &a.scope).cmp(&(a.acquired_at, &b.processor, &b.scope))
        });
        Ok(open)
    }

    async fn claim_and_find(
        &self,
        request: &crate::store::ClaimRequest<'_>,
        _lookups: &[crate::store::KeyLookup],
    ) -> crate::error::Result<(
        crate::store::Claim,
        Option<Vec<Option<crate::model::KeyRecord>>>,
    )> {
        crate::store::fallback::claim_alone(self, request).await
    }
}

#[async_trait]
impl LedgerStore for MemoryStore {
    async fn find_keys(&self, lookups: &[KeyLookup]) -> Result<Vec<Option<KeyRecord>>> {
        let state = self.lock();
        Ok(lookups
            .iter()
            .map(|l| {
                state
                    .keys
                    .get(&(l.kind, l.key.clone()))
                    .and_then(|rows| {
                        rows.iter()
                            .filter(|r| r.processed_at >= l.since)
                            .max_by_key(|r| r.processed_at)
                    })
                    .cloned()
            })
            .collect())
    }

    async fn finish(&self, finish: &Finish) -> Result<()> {
        let mut state = self.lock();
        // Every check before any change: the finish is all or nothing.
        if let Some(lease) = &finish.lease {
            let row = state
                .leases
                .get(&(lease.processor.clone(), lease.scope.clone()));
            if !holds(row, lease) {
                return Err(lease_lost(lease, row));
            }
        }
        if state.runs.iter().any(|r| r.run_id == finish.run.run_id) {
            return Err(Error::DuplicateRunId {
                store: "memory://".into(),
                run_id: finish.run.run_id.clone(),
            });
        }
        if let Some(lease) = &finish.lease {
            let id = (lease.processor.clone(), lease.scope.clone());
            let r = state.leases.get_mut(&id).expect("checked above");
            r.holder = None;
            r.expires_at = micros(finish.run.finished_at);
        }
        if finish.run.status == RunStatus::Completed {
            for k in &finish.keys {
                let mut k = k.clone();
                k.processed_at = micros(k.processed_at);
                state
                    .keys
                    .entry((k.kind, k.key.clone()))
                    .or_default()
                    .push(k);
            }
        }
        let mut run = finish.run.clone();
        run.started_at = micros(run.started_at);
        run.finished_at = micros(run.finished_at);
        state.runs.push(run);
        Ok(())
    }

    async fn runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>> {
        let state = self.lock();
        let mut rows: Vec<RunRecord> = state
            .runs
            .iter()
            .filter(|r| filter.processor.as_ref().is_none_or(|p| &r.processor == p))
            .filter(|r| filter.scope.as_ref().is_none_or(|s| &r.scope == s))
            .filter(|r| filter.status.is_none_or(|s| r.status == s))
            .filter(|r| filter.since.is_none_or(|t| r.started_at >= t))
            .filter(|r| filter.trigger.is_none_or(|t| r.trigger == t))
            .filter(|r| filter.run_id.as_ref().is_none_or(|id| &r.run_id == id))
            .filter(|r| {
                filter
                    .except_skip_reason
                    .as_ref()
                    .is_none_or(|x| r.skip_reason.as_ref() != Some(x))
            })
            .cloned()
            .collect();
        rows.sort_by(|a, b| {
            b.started_at
                .cmp(&a.started_at)
                .then_with(|| b.run_id.cmp(&a.run_id))
        });
        if filter.limit > 0 {
            rows.truncate(filter.limit);
        }
        Ok(rows)
    }

    async fn find_keys_and_holder(
        &self,
        lookups: &[crate::store::KeyLookup],
        _processor: &str,
        _scope: &str,
        _now: chrono::DateTime<chrono::Utc>,
    ) -> crate::error::Result<(
        Vec<Option<crate::model::KeyRecord>>,
        Option<Option<crate::store::LeaseHolder>>,
    )> {
        crate::store::fallback::keys_alone(self, lookups).await
    }

    async fn find_keys_recording_skip(
        &self,
        lookups: &[crate::store::KeyLookup],
        now: chrono::DateTime<chrono::Utc>,
        peek: bool,
        skip: &crate::store::SkipOnHit,
    ) -> crate::error::Result<(
        Vec<Option<crate::model::KeyRecord>>,
        Option<Option<crate::store::LeaseHolder>>,
        bool,
    )> {
        crate::store::fallback::read_without_recording(self, lookups, now, peek, skip).await
    }
}

#[async_trait]
impl MaintenanceStore for MemoryStore {
    async fn purge(&self, processor: &str, scope: Option<&str>) -> Result<u64> {
        let mut state = self.lock();
        let mut deleted = 0u64;
        for rows in state.keys.values_mut() {
            let before = rows.len();
            rows.retain(|k| !(k.processor == processor && scope.is_none_or(|s| k.scope == s)));
            deleted += (before - rows.len()) as u64;
        }
        state.keys.retain(|_, rows| !rows.is_empty());
        Ok(deleted)
    }

    async fn cleanup(&self, policy: &CleanupPolicy) -> Result<CleanupReport> {
        // One lock: the batch size has no meaning in memory.
        let mut state = self.lock();
        let mine = |processor: &str| policy.processor.as_deref().is_none_or(|p| p == processor);
        let expired = |k: &KeyRecord| k.keep_until.is_none_or(|until| until < policy.now);
        let old_key =
            |k: &KeyRecord| mine(&k.processor) && k.processed_at < policy.keys_before && expired(k);
        let kept_runs: std::collections::HashSet<String> = state
            .keys
            .values()
            .flatten()
            .filter(|k| k.processed_at >= policy.keys_before || !expired(k))
            .map(|k| k.run_id.clone())
            .collect();
        let old_run = |r: &RunRecord| {
            mine(&r.processor)
                && r.started_at < policy.runs_before
                && !kept_runs.contains(&r.run_id)
        };
        let old_lease = |(p, _): &(String, String), l: &LeaseRow| {
            mine(p) && l.expires_at < policy.leases_before
        };
        let all_events = policy.processor.is_none();
        let report = CleanupReport {
            keys_deleted: state.keys.values().flatten().filter(|k| old_key(k)).count() as u64,
            runs_deleted: state.runs.iter().filter(|r| old_run(r)).count() as u64,
            leases_deleted: state.leases.iter().filter(|(k, l)| old_lease(k, l)).count() as u64,
            event_keys_deleted: if all_events {
                state
                    .events
                    .iter()
                    .flat_map(|(ns, seen)| seen.keys().map(move |k| (ns, k)))
                    .filter(|(ns, k)| state.event_expired_before(ns, k, policy.keys_before))
                    .count() as u64
            } else {
                0
            },
        };
        if policy.dry_run {
            drop(state);
            report_cleanup_done(policy, &report);
            return Ok(report);
        }
        for rows in state.keys.values_mut() {
            rows.retain(|k| !old_key(k));
        }
        state.keys.retain(|_, rows| !rows.is_empty());
        state.runs.retain(|r| !old_run(r));
        state.leases.retain(|k, l| !old_lease(k, l));
        if all_events {
            let gone: Vec<(String, String)> = state
                .events
                .iter()
                .flat_map(|(ns, seen)| seen.keys().map(move |k| (ns.clone(), k.clone())))
                .filter(|(ns, k)| state.event_expired_before(ns, k, policy.keys_before))
                .collect();
            for (ns, k) in gone {
                if let Some(seen) = state.events.get_mut(&ns) {
                    seen.remove(&k);
                }
                state.event_rows.remove(&(ns, k));
            }
            // After their keys (a key whose batch is gone reads as confirmed).
            let before = policy.keys_before;
            state.pending.retain(|_, b| b.deadline >= before);
        }
        drop(state);
        report_cleanup_done(policy, &report);
        Ok(report)
    }

    /// No partitions.
    async fn partition_expiration(
        &self,
    ) -> crate::error::Result<Option<Vec<crate::store::PartitionExpiration>>> {
        Ok(None)
    }

    async fn set_partition_expiration(&self, _days: Option<u32>) -> crate::error::Result<()> {
        Err(crate::store::fallback::no_partitions(self))
    }
}

impl MemoryStore {
    /// `check_and_mark`; with `pending` (a marker and its deadline) the keys it marks are
    /// pending for one new batch, without their decisions.
    fn mark(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        pending: Option<(&str, DateTime<Utc>)>,
    ) -> Vec<EventVerdict> {
        let mut state = self.lock();
        let mut new = std::collections::HashSet::new();
        let mut stored = HashMap::new();
        let mut batch = None;
        for m in event_keys::firsts(marks) {
            if let Some(row) = state.event(namespace, &m.key, now) {
                stored.insert(m.key.clone(), row);
                continue;
            }
            if let (Some((marker, deadline)), None) = (pending, batch) {
                let id = state.next_pending;
                state.next_pending += 1;
                let marker = serde_json::from_str(marker)
                    .unwrap_or_else(|_| serde_json::Value::String(marker.to_string()));
                let row = PendingRow {
                    namespace: namespace.to_string(),
                    marker,
                    deadline,
                };
                state.pending.insert(id, row);
                batch = Some(id);
            }
            state
                .events
                .entry(namespace.to_string())
                .or_default()
                .insert(m.key.clone(), micros(now));
            let row = EventRow {
                fingerprint: m.fingerprint.clone(),
                decision: m.decision.clone().filter(|_| batch.is_none()),
                expires_at: m.expires_at(now),
                pending: batch,
            };
            state
                .event_rows
                .insert((namespace.to_string(), m.key.clone()), row);
            new.insert(m.key.clone());
        }
        event_keys::verdicts(marks, &new, &stored, now)
    }
}

#[async_trait]
impl EventKeyStore for MemoryStore {
    async fn check_and_mark(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
    ) -> Result<Vec<EventVerdict>> {
        Ok(self.mark(namespace, marks, now, None))
    }

    async fn is_duplicate(
        &self,
        namespace: &str,
        keys: &[String],
        now: DateTime<Utc>,
    ) -> Result<Vec<bool>> {
        let state = self.lock();
        Ok(keys
            .iter()
            .map(|k| state.event(namespace, k, now).is_some())
            .collect())
    }

    async fn check_all_marked(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<EventVerdict>>> {
        let state = self.lock();
        let mut stored = HashMap::new();
        for m in event_keys::firsts(marks) {
            let Some(row) = state.event(namespace, &m.key, now) else {
                return Ok(None);
            };
            stored.insert(m.key.clone(), row);
        }
        let new = std::collections::HashSet::new();
        Ok(Some(event_keys::verdicts(marks, &new, &stored, now)))
    }

    async fn record_decision(
        &self,
        namespace: &str,
        key: &str,
        decision: &serde_json::Value,
    ) -> Result<bool> {
        let mut state = self.lock();
        if !state
            .events
            .get(namespace)
            .is_some_and(|e| e.contains_key(key))
        {
            return Ok(false);
        }
        let row = state
            .event_rows
            .entry((namespace.to_string(), key.to_string()))
            .or_default();
        row.decision = Some(decision.clone());
        Ok(true)
    }

    async fn forget_event_keys(&self, namespace: &str, keys: &[String]) -> Result<u64> {
        let mut state = self.lock();
        let mut gone = 0;
        for key in keys {
            let removed = state
                .events
                .get_mut(namespace)
                .and_then(|seen| seen.remove(key))
                .is_some();
            state
                .event_rows
                .remove(&(namespace.to_string(), key.clone()));
            gone += u64::from(removed);
        }
        Ok(gone)
    }

    async fn confirm_event_keys(
        &self,
        namespace: &str,
        keys: &[(String, Option<DateTime<Utc>>)],
        owner: &str,
    ) -> Result<u64> {
        let owner: serde_json::Value = serde_json::from_str(owner).unwrap_or_default();
        let mut state = self.lock();
        let mut done = 0;
        for (key, expires_at) in keys {
            let marked = state
                .events
                .get(namespace)
                .is_some_and(|seen| seen.contains_key(key));
            let row = state
                .event_rows
                .get_mut(&(namespace.to_string(), key.clone()));
            if let Some(row) = row.filter(|r| marked && r.decision.as_ref() == Some(&owner)) {
                row.decision = None;
                row.expires_at = expires_at.map(micros);
                done += 1;
            }
        }
        Ok(done)
    }

    async fn unmark_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        first_seen: DateTime<Utc>,
    ) -> Result<u64> {
        let at = micros(first_seen);
        let mut state = self.lock();
        let mut gone = 0;
        for key in keys {
            let Some(seen) = state.events.get_mut(namespace) else {
                break;
            };
            if seen.get(key).is_some_and(|t| micros(*t) == at) {
                seen.remove(key);
                state
                    .event_rows
                    .remove(&(namespace.to_string(), key.clone()));
                gone += 1;
            }
        }
        Ok(gone)
    }

    async fn cursor(&self, namespace: &str, name: &str) -> Result<Option<Cursor>> {
        Ok(self
            .lock()
            .cursors
            .get(&(namespace.to_string(), name.to_string()))
            .cloned())
    }

    async fn advance_cursor(&self, namespace: &str, name: &str, to: &Cursor) -> Result<()> {
        let mut state = self.lock();
        let slot = state
            .cursors
            .entry((namespace.to_string(), name.to_string()))
            .or_insert_with(|| to.clone());
        if *slot < *to {
            *slot = to.clone();
        }
        Ok(())
    }

    async fn mark_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        now: chrono::DateTime<chrono::Utc>,
    ) -> crate::error::Result<Vec<bool>> {
        crate::store::fallback::mark_by_check(self, namespace, keys, now).await
    }

    /// Marking in memory is one short lock: a gate's batches mark one after another.
    async fn check_and_mark_pending_ahead(
        &self,
        _namespace: &str,
        _marks: &[crate::store::EventMark],
        _now: chrono::DateTime<chrono::Utc>,
        _batch: crate::store::PendingBatch<'_>,
    ) -> crate::error::Result<Option<Vec<crate::store::EventVerdict>>> {
        crate::store::fallback::never_ahead()
    }

    /// The batch's pending state is kept once (as SQLite's and Postgres's rows).
    async fn check_and_mark_pending(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        batch: crate::store::PendingBatch<'_>,
        cursor: Option<(&str, &Cursor)>,
    ) -> Result<Vec<EventVerdict>> {
        let verdicts = self.mark(
            namespace,
            marks,
            now,
            Some((batch.marker, batch.deadline(now))),
        );
        if let Some((name, to)) = cursor {
            self.advance_cursor(namespace, name, to).await?;
        }
        Ok(verdicts)
    }

    /// Whole: the batch's state dropped, which confirms every key still naming it. Some
    /// of its keys only: those stop naming it.
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
        let marker: serde_json::Value = serde_json::from_str(marker)
            .unwrap_or_else(|_| serde_json::Value::String(marker.to_string()));
        let mut state = self.lock();
        let ids: Vec<u64> = state
            .pending
            .iter()
            .filter(|(_, b)| b.namespace == namespace && b.marker == marker)
            .map(|(id, _)| *id)
            .collect();
        if whole {
            for id in &ids {
                state.pending.remove(id);
            }
            return Ok(if ids.is_empty() { 0 } else { keys.len() as u64 });
        }
        let mut done = 0;
        for (key, _) in keys {
            let row = state
                .event_rows
                .get_mut(&(namespace.to_string(), key.clone()));
            if let Some(row) = row.filter(|r| r.pending.is_some_and(|id| ids.contains(&id))) {
                row.pending = None;
                done += 1;
            }
        }
        Ok(done)
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
