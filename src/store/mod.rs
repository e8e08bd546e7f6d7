//! The store abstraction: where leases, processing keys and the run ledger live.
//!
//! Capability traits — [`LeaseStore`], [`LedgerStore`], [`MaintenanceStore`],
//! [`EventKeyStore`], each on top of [`StoreBase`] — and [`Store`], their union (the
//! batch-job store), with one module per backend. A backend is chosen at
//! run time from a URL ([`open`]): `sqlite://path` (the embedded default), `postgres://…`,
//! `bigquery://project/dataset`, `memory://`. Every backend passes the same
//! [`conformance`] suite.
//!
//! Why these operations: a run first *looks up* the keys its guards need (one round trip,
//! [`LedgerStore::find_keys`]), *claims* a lease on (processor, scope) with an expiry and a
//! fencing token ([`LeaseStore::claim`]), and ends with [`LedgerStore::finish`], which records the
//! run, writes the keys only when it completed, and releases the lease — atomically where
//! the backend allows, and only if the lease's token is still current, so a run whose
//! lease expired and was taken over cannot record over the newer holder.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

pub use crate::backend::redact_url;
use crate::error::{Error, Result};
use crate::model::{KeyKind, KeyRecord, RunRecord, RunStatus, SkipReason, Trigger};
pub use event_keys::{BatchTurn, Cursor, EventMark, EventVerdict, PendingBatch, TurnStarted};

#[cfg(feature = "bigquery")]
pub mod bigquery;
pub mod breaker;
mod common;
pub mod conformance;
mod event_keys;
pub mod fallback;
mod forward;
pub mod memory;
pub mod migrations;
mod open;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
pub mod rows;
pub mod spool;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// The retry loop (it lives with the backends, which retry their own calls too).
pub use crate::backend::retry;
pub use crate::backend::PoolSize;
pub use breaker::{BreakerConfig, CircuitBreakerStore};
pub use memory::MemoryStore;
pub use open::{
    open, open_event_keys, open_sized, schema_state, ReopeningEventStore, SchemaState, Stores,
    UnavailableStore, DEFAULT_STORE_URL,
};

/// Every store trait, for calling store methods on a concrete store type:
/// `use idem::store::prelude::*;`.
pub mod prelude {
    pub use super::{EventKeyStore, LeaseStore, LedgerStore, MaintenanceStore, Store, StoreBase};
}

/// A store chosen at run time.
pub type DynStore = dyn Store;

/// A held lease on (processor, scope).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lease {
    /// Processor (job) name.
    pub processor: String,
    /// Scope.
    pub scope: String,
    /// The run holding it.
    pub run_id: String,
    /// Fencing token: strictly increases each time the lease changes hands.
    pub token: i64,
    /// When it was claimed.
    pub acquired_at: DateTime<Utc>,
    /// When it expires unless renewed.
    pub expires_at: DateTime<Utc>,
}

impl Lease {
    /// The error a fenced operation on this lease returns when its token is no longer
    /// current (`current_holder`: the run holding the lease now, if known).
    pub fn lost(&self, current_holder: Option<String>) -> Error {
        Error::LeaseLost {
            processor: self.processor.clone(),
            scope: self.scope.clone(),
            token: self.token,
            current_holder,
        }
    }
}

/// When a lease taken at `now` for `ttl` expires, at the microsecond precision every
/// store keeps.
pub fn lease_expiry(now: DateTime<Utc>, ttl: Duration) -> DateTime<Utc> {
    crate::model::micros(
        now + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::days(36500)),
    )
}

/// Who holds a lease another run wanted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeaseHolder {
    /// The holding run.
    pub run_id: String,
    /// Its fencing token.
    pub token: i64,
    /// When it claimed.
    pub acquired_at: DateTime<Utc>,
    /// When its lease expires.
    pub expires_at: DateTime<Utc>,
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The caller holds the lease now.
    Acquired(Lease),
    /// Another run holds an unexpired lease.
    Held(LeaseHolder),
}

/// A lease its holder has not released: a run in progress (until `expires_at`), or, once
/// that has passed, a run that ended without a result (killed, or its host lost) —
/// *abandoned*. What `idem runs` and `idem status` show of runs not yet in the ledger.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpenLease {
    /// Processor (job) name.
    pub processor: String,
    /// Scope.
    pub scope: String,
    /// The holding run.
    pub run_id: String,
    /// The fencing token.
    pub token: i64,
    /// When the run claimed it (the run's start).
    pub acquired_at: DateTime<Utc>,
    /// When it expires unless renewed.
    pub expires_at: DateTime<Utc>,
    /// Its last renewal (the run's heartbeat), or its claim; `None` for a lease claimed
    /// by a build before schema 11.
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// The claiming process's host (`None` before schema 11).
    pub host: Option<String>,
    /// The claiming process's id (`None` before schema 11).
    pub pid: Option<i64>,
}

impl OpenLease {
    /// Whether its run is still in progress at `now` (else abandoned).
    pub fn running_at(&self, now: DateTime<Utc>) -> bool {
        self.expires_at > now
    }
}

/// A lease request.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// Processor (job) name.
    pub processor: &'a str,
    /// Scope.
    pub scope: &'a str,
    /// The claiming run.
    pub run_id: &'a str,
    /// How long the lease lasts unless renewed.
    pub ttl: Duration,
    /// The claim time (a lease expired at or before it may be taken over).
    pub now: DateTime<Utc>,
}

impl ClaimRequest<'_> {
    /// The claim's answer when it won: a lease with `token` from `acquired_at` to
    /// `expires_at`.
    pub fn acquired(
        &self,
        token: i64,
        acquired_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Claim {
        Claim::Acquired(Lease {
            processor: self.processor.to_string(),
            scope: self.scope.to_string(),
            run_id: self.run_id.to_string(),
            token,
            acquired_at,
            expires_at,
        })
    }
}

/// One key a guard wants to know about: the latest record of `key` of `kind` processed at
/// or after `since`.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyLookup {
    /// The key.
    pub key: String,
    /// Its kind.
    pub kind: KeyKind,
    /// Oldest `processed_at` that counts.
    pub since: DateTime<Utc>,
}

/// The end of a run, recorded by [`LedgerStore::finish`].
#[derive(Debug, Clone)]
pub struct Finish {
    /// The ledger row.
    pub run: RunRecord,
    /// Keys to write; only written when `run.status` is `completed`.
    pub keys: Vec<KeyRecord>,
    /// The lease to release; when present its token must still be current or nothing is
    /// written and [`Error::LeaseLost`] is returned.
    pub lease: Option<Lease>,
}

/// A skip a store may record with the read that decides it
/// ([`LedgerStore::find_keys_recording_skip`]): when the key of lookup `position` is found,
/// `run` is inserted with `previous_run_id` set to that key's run id, unless its run id is
/// in the ledger already. A lookup that finds nothing writes nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct SkipOnHit {
    /// The lookup (its position in the read) whose hit is the skip.
    pub position: usize,
    /// The ledger row of the skip; its `previous_run_id` is the hit's run id.
    pub run: RunRecord,
}

/// Filter for [`LedgerStore::runs`].
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    /// Only this processor.
    pub processor: Option<String>,
    /// Only this scope.
    pub scope: Option<String>,
    /// Only this status.
    pub status: Option<RunStatus>,
    /// Only runs started at or after.
    pub since: Option<DateTime<Utc>>,
    /// At most this many rows, newest first (0 = no limit).
    pub limit: usize,
    /// Only runs with this trigger.
    pub trigger: Option<Trigger>,
    /// Leave out runs skipped for this reason (e.g. the scheduler's last fire is not one
    /// that met another run's lease: that fire did not settle its slot).
    pub except_skip_reason: Option<SkipReason>,
    /// Only the run with this id.
    pub run_id: Option<String>,
}

/// Rows per delete statement in a cleanup, by default.
pub const DEFAULT_CLEANUP_BATCH: usize = 10_000;

/// How far a cleanup has got: what [`CleanupPolicy::progress`] is told after each batch
/// (each delete statement, or each table's count under `dry_run`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanupProgress {
    /// The table the batch came from (`processing_keys`, `processing_runs`,
    /// `processing_leases`, `event_keys`; walked in that order).
    pub table: &'static str,
    /// Rows deleted (or, under `dry_run`, counted) from this table so far.
    pub rows: u64,
    /// Rows over all tables so far.
    pub total: u64,
    /// This table is finished: `rows` is its final count, as the report will say.
    pub table_done: bool,
}

/// A callback told of a cleanup's progress ([`CleanupPolicy::progress`]), e.g. to draw a
/// progress bar. It runs on the cleanup's task between batches: keep it quick.
#[derive(Clone)]
pub struct CleanupProgressFn(Arc<dyn Fn(CleanupProgress) + Send + Sync>);

impl CleanupProgressFn {
    /// Wraps `f`.
    pub fn new(f: impl Fn(CleanupProgress) + Send + Sync + 'static) -> Self {
        CleanupProgressFn(Arc::new(f))
    }

    /// Tells the callback.
    pub fn call(&self, progress: CleanupProgress) {
        (self.0)(progress)
    }
}

impl Debug for CleanupProgressFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CleanupProgressFn(..)")
    }
}

/// Two callbacks are equal when they are the same one.
impl PartialEq for CleanupProgressFn {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }
}

/// What [`MaintenanceStore::cleanup`] deletes.
#[derive(Debug, Clone, PartialEq)]
pub struct CleanupPolicy {
    /// Processing keys processed before this instant are deleted once their own
    /// retention has passed too ([`KeyRecord::keep_until`](crate::model::KeyRecord::keep_until)
    /// before `now`; a key without one goes by this cut-off alone), and event keys whose
    /// expiry passed before it. An event key that never expires (a gate's default TTL) is
    /// never deleted, and event cursors never are: a guard or a gate still answers by them.
    pub keys_before: DateTime<Utc>,
    /// Ledger rows started before this instant are deleted, except a row that a kept key
    /// (one processed at or after `keys_before`, or kept until `now` or later) points at
    /// through its run id.
    pub runs_before: DateTime<Utc>,
    /// Leases (released or not) that expired before this instant are deleted.
    pub leases_before: DateTime<Utc>,
    /// Only this processor's keys, ledger rows and leases; event keys belong to no
    /// processor and are then left alone.
    pub processor: Option<String>,
    /// At most this many rows per delete statement, each its own transaction, so
    /// concurrent runs are never blocked for long (BigQuery deletes per table in one DML
    /// statement and ignores it). At least 1.
    pub batch: usize,
    /// Count what would be deleted; delete nothing.
    pub dry_run: bool,
    /// Told after each batch how far the cleanup has got (none by default).
    pub progress: Option<CleanupProgressFn>,
    /// When the cleanup runs: a processing key kept until this instant or later stays,
    /// whatever `keys_before` says.
    pub now: DateTime<Utc>,
}

impl CleanupPolicy {
    /// Everything older than `before` (keys also past their own retention at the current
    /// instant), in batches of [`DEFAULT_CLEANUP_BATCH`].
    pub fn before(before: DateTime<Utc>) -> Self {
        CleanupPolicy {
            keys_before: before,
            runs_before: before,
            leases_before: before,
            processor: None,
            batch: DEFAULT_CLEANUP_BATCH,
            dry_run: false,
            progress: None,
            now: Utc::now(),
        }
    }

    /// Tells [`CleanupPolicy::progress`], if any.
    pub(crate) fn report_progress(&self, progress: CleanupProgress) {
        if let Some(f) = &self.progress {
            f.call(progress);
        }
    }

    /// The batch size, at least 1, as an SQL `LIMIT`.
    pub fn limit(&self) -> i64 {
        i64::try_from(self.batch.max(1)).unwrap_or(i64::MAX)
    }
}

/// What [`MaintenanceStore::cleanup`] removed (or, under `dry_run`, would remove).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CleanupReport {
    /// Processing keys deleted.
    pub keys_deleted: u64,
    /// Ledger rows deleted.
    pub runs_deleted: u64,
    /// Released or expired leases deleted.
    pub leases_deleted: u64,
    /// Event keys deleted.
    pub event_keys_deleted: u64,
}

impl CleanupReport {
    /// Rows deleted over all tables.
    pub fn total(&self) -> u64 {
        self.keys_deleted + self.runs_deleted + self.leases_deleted + self.event_keys_deleted
    }

    /// The cleanup as JSON, as `idem cleanup --format json` prints it and the cleanup
    /// job records it: the policy's cut-offs and the rows per table.
    pub fn summary(&self, policy: &CleanupPolicy) -> serde_json::Value {
        serde_json::json!({
            "dry_run": policy.dry_run,
            "keys_before": policy.keys_before,
            "runs_before": policy.runs_before,
            "tables": {
                "processing_keys": self.keys_deleted,
                "processing_runs": self.runs_deleted,
                "processing_leases": self.leases_deleted,
                "event_keys": self.event_keys_deleted,
            },
        })
    }
}

/// What a backend guarantees beyond one instance in one process. The conformance suite
/// reads these: [`conformance::capabilities_hold_across_instances`] holds a backend to
/// exactly what it claims here.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Capabilities {
    /// Data survives the process.
    pub durable: bool,
    /// Claims stay correct across processes (not only across tasks of one process).
    pub cross_process: bool,
    /// [`EventKeyStore::confirm_event_keys`] works: the gate then marks keys *pending*
    /// until their records are written (docs/events.md, "Pending marks").
    pub confirms_pending: bool,
    /// How many [`EventKeyStore::check_and_mark`] calls on batches that share no key one
    /// caller may usefully have running at once: more than 1 where the store works on
    /// them side by side (Postgres and SQLite, one pooled connection each) or queues them
    /// in order on one connection (Redis); 1 where writers wait for each other anyway.
    pub batch_concurrency: usize,
    /// [`EventKeyStore::check_and_mark_pending_ahead`] can mark a gate's batch before its
    /// turn (the store keeps each row's last place marked, and checks it in the same
    /// atomic write): Postgres, Redis and SQLite. Elsewhere it always answers `None`
    /// ([`fallback::never_ahead`]) and the gate marks batch after batch.
    pub marks_ahead: bool,
}

impl Capabilities {
    /// A database shared by processes that keeps what it is given (SQLite, Postgres,
    /// BigQuery), one event batch at a time, without pending marks.
    pub const SHARED: Capabilities = Capabilities {
        durable: true,
        cross_process: true,
        confirms_pending: false,
        batch_concurrency: 1,
        marks_ahead: false,
    };
    /// Nothing beyond one instance (memory; a store that cannot be reached).
    pub const NONE: Capabilities = Capabilities {
        durable: false,
        cross_process: false,
        confirms_pending: false,
        batch_concurrency: 1,
        marks_ahead: false,
    };
}

/// What every store has: a name, a URL for messages, its guarantees and its schema.
#[async_trait]
pub trait StoreBase: Send + Sync + Debug + 'static {
    /// Short backend name (`sqlite`, `postgres`, `bigquery`, `memory`, `redis`).
    fn kind(&self) -> &'static str;

    /// The store's URL with any password removed, for messages.
    fn location(&self) -> String;

    /// What this backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// Creates or upgrades the schema. Idempotent; safe to call from several processes.
    async fn migrate(&self) -> Result<()>;
}

/// Leases on (processor, scope) with fencing tokens.
#[async_trait]
pub trait LeaseStore: StoreBase {
    /// Claims the lease on (processor, scope), taking over an expired one.
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim>;

    /// Who holds the lease on (processor, scope) at `now`, without claiming it (for
    /// `explain`). `None` when free or expired.
    async fn lease_holder(
        &self,
        processor: &str,
        scope: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<LeaseHolder>>;

    /// Extends a held lease to `now + ttl`. [`Error::LeaseLost`] when it was taken over.
    async fn renew(&self, lease: &Lease, ttl: Duration, now: DateTime<Utc>) -> Result<Lease>;

    /// Releases a lease without recording anything. Returns false when the lease was no
    /// longer held with this token (expired and taken over): nothing is changed then.
    async fn release(&self, lease: &Lease, now: DateTime<Utc>) -> Result<bool>;

    /// The leases not released, of `processor` or of all, newest claim first: runs in
    /// progress and runs abandoned ([`OpenLease`]). A claim records the claiming host and
    /// process and a renewal its time, so these say who runs what and its last heartbeat.
    async fn open_leases(&self, processor: Option<&str>) -> Result<Vec<OpenLease>>;

    /// [`claim`](Self::claim), and, when the lease is acquired, the latest key record per
    /// lookup *read after the claim* (as [`LedgerStore::find_keys`] answers), in one round
    /// trip where the backend can (BigQuery: one script). `None` for the keys means they
    /// were not read ([`fallback::claim_alone`]): the caller reads them itself.
    async fn claim_and_find(
        &self,
        request: &ClaimRequest<'_>,
        lookups: &[KeyLookup],
    ) -> Result<(Claim, Option<Vec<Option<KeyRecord>>>)>;
}

/// Processing keys and the run ledger.
#[async_trait]
pub trait LedgerStore: StoreBase {
    /// The latest key record per lookup (same order), or `None`.
    async fn find_keys(&self, lookups: &[KeyLookup]) -> Result<Vec<Option<KeyRecord>>>;

    /// [`find_keys`](Self::find_keys), and who holds the lease on (processor, scope) at
    /// `now` (as [`LeaseStore::lease_holder`] answers), in one round trip where the backend
    /// can (BigQuery: one query). The holder is `None` when it was not read
    /// ([`fallback::keys_alone`]), `Some(None)` when the scope is free or its lease expired.
    async fn find_keys_and_holder(
        &self,
        lookups: &[KeyLookup],
        processor: &str,
        scope: &str,
        now: DateTime<Utc>,
    ) -> Result<(Vec<Option<KeyRecord>>, Option<Option<LeaseHolder>>)>;

    /// [`find_keys`](Self::find_keys) (with the lease holder of `skip.run`'s processor and
    /// scope at `now`, as [`find_keys_and_holder`](Self::find_keys_and_holder) answers it,
    /// when `peek`), and, when the key of lookup `skip.position` is found, the skip's
    /// ledger row ([`SkipOnHit`]) in the same round trip where the backend can (BigQuery:
    /// one script). The last value is true when the row was recorded: false when the key
    /// was not found, when the run id is in the ledger already (the caller then records
    /// the skip itself, as [`finish`](Self::finish) does), or when the store does not
    /// record with the read ([`fallback::read_without_recording`]).
    ///
    /// The keys answered are the ones the row was decided on (one read), so the caller's
    /// guard sees exactly the key whose run id the row names.
    async fn find_keys_recording_skip(
        &self,
        lookups: &[KeyLookup],
        now: DateTime<Utc>,
        peek: bool,
        skip: &SkipOnHit,
    ) -> Result<(Vec<Option<KeyRecord>>, Option<Option<LeaseHolder>>, bool)>;

    /// Records the end of a run: the ledger row, the keys when it completed, the lease
    /// release. See [`Finish`].
    ///
    /// `Ok` means the run is recorded. An error means the ledger row and keys were *not*
    /// recorded: transactional stores roll back; a store that cannot write them in one
    /// transaction (BigQuery) must return `Ok` once the row and keys are written even if releasing the lease then fails (the lease
    /// expires), so the runner never reports a recorded run as unrecorded.
    async fn finish(&self, finish: &Finish) -> Result<()>;

    /// Ledger rows, newest first.
    async fn runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>>;
}

/// Deleting on purpose (purge) and past retention (cleanup).
#[async_trait]
pub trait MaintenanceStore: StoreBase {
    /// Deletes the processing keys of a processor (and scope, when given) on purpose, so
    /// the next run is not skipped. Returns the rows deleted.
    async fn purge(&self, processor: &str, scope: Option<&str>) -> Result<u64>;

    /// Deletes (or under `dry_run` counts) keys, ledger rows, leases and event keys past
    /// retention, as [`CleanupPolicy`] says, in bounded batches.
    async fn cleanup(&self, policy: &CleanupPolicy) -> Result<CleanupReport>;

    /// The partition expiration of each partitioned table, as the database reports it;
    /// `None` for a store whose tables have no partitions (all but BigQuery).
    async fn partition_expiration(&self) -> Result<Option<Vec<PartitionExpiration>>>;

    /// Lets the database drop partitions older than `days` (`None`: never) on the
    /// partitioned tables, instead of deleting their rows by DML. [`Error::Input`] on a
    /// store without partitions ([`fallback::no_partitions`]).
    async fn set_partition_expiration(&self, days: Option<u32>) -> Result<()>;
}

/// Longest partition expiration that can be set, in days (100 years).
pub const MAX_PARTITION_EXPIRATION_DAYS: u32 = 36_500;

/// One table's partition expiration ([`MaintenanceStore::partition_expiration`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartitionExpiration {
    /// The table.
    pub table: &'static str,
    /// Whether the database reports the table as partitioned (the BigQuery emulator
    /// reports no partitioning at all, so neither an expiration).
    pub partitioned: bool,
    /// Partitions older than this many days are dropped; `None` when they never expire
    /// (or nothing is reported).
    pub days: Option<f64>,
}

impl PartitionExpiration {
    /// From the table's `timePartitioning` (present when partitioned) and its
    /// `expirationMs` text.
    pub fn from_api(table: &'static str, partitioning: Option<Option<&str>>) -> Self {
        PartitionExpiration {
            table,
            partitioned: partitioning.is_some(),
            days: partitioning
                .flatten()
                .and_then(|ms| ms.parse::<u64>().ok())
                .filter(|&ms| ms > 0)
                .map(|ms| ms as f64 / 86_400_000.0),
        }
    }
}

/// Event-level dedup: which event keys of a namespace were seen. A backend may implement
/// this (and [`StoreBase`]) alone, without leases or a ledger.
///
/// The trait has no default methods, so a method added here does not compile until every
/// backend and every wrapper says what it does: a backend states each one, calling
/// [`fallback`] where it has nothing better of its own; a wrapper forwards all of them
/// with [`forward_event_key_store!`](crate::forward_event_key_store), stating only what it
/// changes. (A default would let a wrapper that forgot a method fall back to it silently:
/// the breaker once skipped Postgres's bulk mark that way.)
#[async_trait]
pub trait EventKeyStore: StoreBase {
    /// Checks and marks a batch of event keys of a namespace, atomically per key and in one
    /// round trip on the SQL stores; `result[i]` is the verdict for `marks[i]`.
    ///
    /// A key absent, or expired (`expires_at <= now`), is [`EventVerdict::New`] and is
    /// (re)marked with its fingerprint, decision and expiry (`now + ttl`; no ttl = never).
    /// A key present and unexpired is [`EventVerdict::Replay`] (with the stored decision)
    /// when the fingerprints agree or either is absent, [`EventVerdict::Conflict`] when
    /// both are known and differ; neither changes any state. A key repeated inside the
    /// batch: its first occurrence decides, later ones are replays/conflicts against it.
    async fn check_and_mark(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
    ) -> Result<Vec<EventVerdict>>;

    /// Whether each key is marked and unexpired at `now` (read-only, one round trip).
    async fn is_duplicate(
        &self,
        namespace: &str,
        keys: &[String],
        now: DateTime<Utc>,
    ) -> Result<Vec<bool>>;

    /// The verdicts [`check_and_mark`](Self::check_and_mark) would give a batch none of
    /// whose keys is new, read without writing anything: `Some` when every key of `marks`
    /// is stored and alive at `now` (each a replay or a conflict; a key pending for a batch
    /// is a replay whose decision is the batch's marker), `None` when some key is absent or
    /// dead. One round trip where the store answers; [`fallback::never_all_marked`]
    /// (BigQuery, where a read is a billed job) always says `None`. A gate answers a batch
    /// of settled replays this way without waiting for its turn to mark
    /// ([`EventGate::admit_in_turn`](crate::events::strategy::EventGate::admit_in_turn)).
    async fn check_all_marked(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<EventVerdict>>>;

    /// Stores the decision of a marked key's first processing (what later replays
    /// return); `false` when the key is not marked.
    async fn record_decision(
        &self,
        namespace: &str,
        key: &str,
        decision: &serde_json::Value,
    ) -> Result<bool>;

    /// Marks event keys of a namespace as seen (no fingerprint, never expiring), in one
    /// round trip; `true` at position `i` means `keys[i]` was new (first sighting, or its
    /// earlier mark had expired), `false` that it was seen before (or earlier in the same
    /// batch).
    async fn mark_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        now: DateTime<Utc>,
    ) -> Result<Vec<bool>>;

    /// Deletes event keys of a namespace (their marks, fingerprints and decisions), in one
    /// round trip: how many were marked. A store that cannot answers
    /// [`Error::Unsupported`].
    async fn forget_event_keys(&self, namespace: &str, keys: &[String]) -> Result<u64>;

    /// Confirms pending marks: for each `(key, expires_at)` whose stored decision is
    /// exactly `owner` (the pending marker its marking call stored as the decision), clears
    /// the decision and sets the expiry (`None`: never); any other mark of the key (taken
    /// over after the pending one expired, or confirmed already) is left alone. One round
    /// trip; how many were confirmed.
    async fn confirm_event_keys(
        &self,
        namespace: &str,
        keys: &[(String, Option<DateTime<Utc>>)],
        owner: &str,
    ) -> Result<u64>;

    /// [`check_and_mark`](Self::check_and_mark) of a batch whose new keys are marked
    /// *pending* (docs/events.md, "Pending marks"), with the cursor's advance when given
    /// (as [`check_and_mark_advancing`](Self::check_and_mark_advancing)). `marks` carry
    /// their real TTL, which a key gets once
    /// [`confirm_pending_batch`](Self::confirm_pending_batch) confirms the batch (their
    /// decisions are not kept: a confirmed key has none); until then a key this call
    /// marked is found pending (a replay whose decision is `batch.marker`), and once
    /// `batch.timeout` has passed unconfirmed it is expired.
    ///
    /// [`fallback::pending_per_key`]: each key carries the pending state itself, the
    /// marker as its decision and the shorter of its TTL and the timeout
    /// ([`PendingBatch::per_key`]), replaced key by key when confirmed: every new key
    /// written twice. Every store that confirms keeps it once for the batch instead
    /// (Postgres and SQLite: one row per batch; Redis: one key; memory: one entry), so a
    /// confirmation is one write, not one per key.
    async fn check_and_mark_pending(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        batch: PendingBatch<'_>,
        cursor: Option<(&str, &Cursor)>,
    ) -> Result<Vec<EventVerdict>>;

    /// [`check_and_mark_pending`](Self::check_and_mark_pending) of a batch in a row
    /// (`batch.turn`) before its turn has come, while batches ahead of it in the row may
    /// still be marking: marks it, as `check_and_mark_pending` would, only when the batch
    /// just before it in its row is the last the store saw marked (so every batch before
    /// it has marked or never will, and the row's marks stay in input order), in the same
    /// atomic write that records its place; otherwise marks nothing (Redis: what it set
    /// named a batch never set, dead to every reader, and is deleted) and answers `None`
    /// (and then the gate waits for its turn). A store may say `None` whenever it cannot
    /// tell in one write: [`fallback::never_ahead`] always does
    /// ([`Capabilities::marks_ahead`] false). `None` too for a batch outside a row.
    async fn check_and_mark_pending_ahead(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        batch: PendingBatch<'_>,
    ) -> Result<Option<Vec<EventVerdict>>>;

    /// Confirms new keys of a batch marked by
    /// [`check_and_mark_pending`](Self::check_and_mark_pending) with `marker`, once their
    /// records are out: `keys` with their real expiries, `whole` when they are every key
    /// the batch found new. Those still carrying the batch's mark become plain marks (no
    /// marker, their real expiry); keys taken over meanwhile by another call, and the
    /// batch's other keys, are left alone. How many were confirmed (a store that keeps the
    /// state once per batch, confirming it whole: `keys.len()` when the batch was pending,
    /// else 0). [`fallback::confirm_batch_per_key`]:
    /// [`confirm_event_keys`](Self::confirm_event_keys) with the marker as owner, whole
    /// or not.
    async fn confirm_pending_batch(
        &self,
        namespace: &str,
        marker: &str,
        keys: &[(String, Option<DateTime<Utc>>)],
        whole: bool,
    ) -> Result<u64>;

    /// Takes back marks nobody was told about: deletes the marks of `keys` made at
    /// `first_seen` (by a [`check_and_mark`](Self::check_and_mark) whose `now` it was),
    /// and leaves any other mark of those keys alone (one another caller made after this
    /// one expired): how many were deleted. Needed by a store whose
    /// [`Capabilities::batch_concurrency`] is above 1; a store that cannot
    /// answers [`Error::Unsupported`].
    async fn unmark_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        first_seen: DateTime<Utc>,
    ) -> Result<u64>;

    /// The named cursor of a namespace (seed 003), `None` before its first advance. A
    /// store without cursors answers [`Error::Unsupported`].
    async fn cursor(&self, namespace: &str, name: &str) -> Result<Option<Cursor>>;

    /// Moves the named cursor to `to` when `to` is after it (never backwards: with two
    /// writers, the furthest position wins).
    async fn advance_cursor(&self, namespace: &str, name: &str, to: &Cursor) -> Result<()>;

    /// [`check_and_mark`](Self::check_and_mark), then
    /// [`advance_cursor`](Self::advance_cursor) to `to`: in one transaction on the SQL
    /// stores; [`fallback::mark_then_advance`] (Redis, memory) sends the advance once the
    /// marks returned, so the cursor never passes a key that is not marked.
    async fn check_and_mark_advancing(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        cursor: &str,
        to: &Cursor,
    ) -> Result<Vec<EventVerdict>>;
}

/// The batch-job store: leases, keys and ledger, maintenance and event keys. Implemented
/// by every type that implements the capability traits; object-safe: use
/// `Arc<dyn Store>` ([`DynStore`]).
pub trait Store: LeaseStore + LedgerStore + MaintenanceStore + EventKeyStore {}

impl<T: LeaseStore + LedgerStore + MaintenanceStore + EventKeyStore + ?Sized> Store for T {}
