//! BigQuery store (gcp-bigquery-client): the production warehouse.
//!
//! URL: `bigquery://PROJECT/DATASET[?endpoint=http://HOST:PORT&location=US&partition_expiration_days=N&timeout=5m]`.
//! Without an endpoint (and without `IDEM_BIGQUERY_ENDPOINT`) the store talks to Google
//! with Application Default Credentials; with one it talks to an emulator with no
//! credentials. See `docs/bigquery.md` for setup, IAM, costs and the exact concurrency
//! guarantee; the short version follows.
//!
//! BigQuery has no row locks, runs at most two mutating DML statements (UPDATE, DELETE,
//! MERGE) per table at once with 20 more queued, bills at least 10 MB per query, and keeps
//! streamed rows (`insertAll`) out of reach of DML for about 30 minutes. So:
//!
//! * **Append-only keys and ledger, written with DML `INSERT`** (never streaming), so purge
//!   and cleanup can `DELETE` at once. Keys are never updated; a lookup reads the latest row
//!   per key. INSERTs do not take part in mutating-DML conflicts or queues.
//! * **One query per guard decision**: [`LedgerStore::find_keys`] sends every lookup as one
//!   `ARRAY<STRUCT>` parameter and answers them all in one statement ([`FIND_KEYS_SQL`]),
//!   which filters on the partition column (`processed_at`) with the oldest window start,
//!   so partitions older than the longest window are never read, and on the clustering
//!   column (`processing_key IN UNNEST(@keys)`) so only the blocks holding the keys are.
//! * **Claims without a lock**: a lease row is read; when free, the claim is a single
//!   `UPDATE … WHERE token = @seen AND (free or expired)` — compare-and-set on the fencing
//!   token, judged by `numDmlAffectedRows`. It is always an UPDATE (a missing row is first
//!   created *free* with `INSERT … WHERE NOT EXISTS`) because BigQuery only detects
//!   conflicts between statements that modify existing rows: two concurrent insert-only
//!   statements both commit. A concurrent-update conflict on the claim means another
//!   statement on the lease table committed first: the claim is lost, the lease is read
//!   again and the run sees `in_progress` (never a run failure).
//! * **Leases sharded over 16 tables** ([`LEASE_TABLES`], chosen by [`lease_shard`]), since
//!   BigQuery's DML queues and conflicts are per table: a fleet of runs firing at once
//!   spreads its claims and releases over 16 queues. A statement refused for a full queue
//!   (or a rate limit) did not run and is sent again with backoff (`QUOTA_RETRIES`);
//!   quota and conflict errors that outlast their retries are reported as such, never as
//!   the store being unavailable. See docs/bigquery.md, "Fleets".
//! * **`finish` is not atomic** (the emulator ignores parameters in multi-statement
//!   scripts, and BigQuery has no cross-statement locks anyway). It runs in an order that
//!   keeps the guarantees: first the fence (`UPDATE … WHERE token = @t AND holder_run_id =
//!   @r`; 0 rows ⇒ [`Error::LeaseLost`] and nothing is written), which for a completed run
//!   keeps the lease held a while longer; then the ledger row; then the keys; and only then
//!   the release, so a run that claims the scope next re-checks and sees the keys. A crash
//!   in between leaves a ledger row without keys — the next run processes again — never a
//!   key without its ledger row, never a key from a run whose lease was taken over.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::common::cleanup_tables;
use super::event_keys::{self, Found};
use super::migrations::{self, Migration, Schema};
use super::retry::{retry, Backoff, Retry};
use super::rows::{
    key_from_record, lease_from_record, run_from_record, LeaseRow, KEY_COLUMNS, LEASE_COLUMNS,
    RUN_COLUMNS,
};
use super::{
    lease_expiry, Capabilities, Claim, ClaimRequest, CleanupPolicy, CleanupReport, EventKeyStore,
    EventMark, EventVerdict, Finish, KeyLookup, Lease, LeaseHolder, LeaseStore, LedgerStore,
    MaintenanceStore, PartitionExpiration, RunFilter, StoreBase, MAX_PARTITION_EXPIRATION_DAYS,
};
use crate::error::{Error, Result};
use crate::model::{micros, time, KeyRecord, RunRecord, RunStatus};

use crate::backend::bigquery::{
    date, int64, opt_int64, opt_string, string, string_array, struct_array, timestamp,
    timestamp_text, ApiError, BigQueryUrl, Connection, FaultHook, Param, QueryOutput,
};

/// The tables the migrations ([`migrations::BIGQUERY`]) create. BigQuery keeps no version
/// record: a dataset holding them all is at the latest version, which one `tables.list`
/// call (not billed) tells. A migration that only alters a table must add a marker to
/// this check.
pub fn tables() -> impl Iterator<Item = &'static str> {
    [
        "processing_keys",
        "processing_runs",
        "processing_leases",
        "event_keys",
    ]
    .into_iter()
    .chain(LEASE_TABLES)
}

/// The lease tables (migration 0004): a lease lives in `processing_leases_NN`, NN =
/// [`lease_shard`] of its processor and scope. BigQuery's DML limits are per table (2
/// mutating statements running, 20 queued) and concurrent mutating statements conflict
/// per table, so 16 tables take 16 times the claims, renewals and releases at once.
/// `processing_leases` (schema 1) is no longer written; cleanup still empties it.
pub const LEASE_TABLES: [&str; 16] = [
    "processing_leases_00",
    "processing_leases_01",
    "processing_leases_02",
    "processing_leases_03",
    "processing_leases_04",
    "processing_leases_05",
    "processing_leases_06",
    "processing_leases_07",
    "processing_leases_08",
    "processing_leases_09",
    "processing_leases_10",
    "processing_leases_11",
    "processing_leases_12",
    "processing_leases_13",
    "processing_leases_14",
    "processing_leases_15",
];

/// The lease table of (processor, scope): an index into [`LEASE_TABLES`], from the first
/// four bytes of SHA-256(processor NUL scope), so it is the same for every idem process
/// and version.
pub fn lease_shard(processor: &str, scope: &str) -> usize {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(processor.as_bytes());
    hash.update([0u8]);
    hash.update(scope.as_bytes());
    let digest = hash.finalize();
    let n = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    n as usize % LEASE_TABLES.len()
}

/// The partitioned tables (partition expiration applies to these).
const PARTITIONED_TABLES: &[&str] = &["processing_keys", "processing_runs", "event_keys"];

/// The per-run check: every guard lookup of a run in one statement. `@lookups` is an
/// `ARRAY<STRUCT<pos INT64, key STRING, kind STRING, since TIMESTAMP>>`; `@keys` the
/// distinct keys; `@oldest_since` the earliest `since`. `processed_at` is the partition
/// column (`PARTITION BY DATE(processed_at)`), so the `k.processed_at >= @oldest_since`
/// filter prunes every partition older than the longest guard window; `processing_key`
/// is the first clustering column, so `IN UNNEST(@keys)` limits the blocks read.
/// `{keys}` is the fully qualified `processing_keys` table.
pub const FIND_KEYS_SQL: &str = "\
SELECT l.pos AS pos, k.processing_key, k.kind, k.processor_name, k.scope, k.scope_date, \
k.processed_at, k.entity_count, k.metadata, k.run_id
FROM {keys} AS k
JOIN UNNEST(@lookups) AS l
  ON k.processing_key = l.key AND k.kind = l.kind AND k.processed_at >= l.since
WHERE k.processed_at >= @oldest_since
  AND k.processing_key IN UNNEST(@keys)
QUALIFY ROW_NUMBER() OVER (PARTITION BY l.pos ORDER BY k.processed_at DESC, k.run_id DESC) = 1";

const LEASE_READ_SQL: &str = "\
SELECT {lease_columns} FROM {leases}
WHERE processor_name = @processor AND scope = @scope
ORDER BY token DESC LIMIT 1";

/// Creates a *free* lease row when none exists. An INSERT, so it never conflicts; two
/// concurrent ones may both insert, which is harmless: both rows are free with token 0,
/// and every later UPDATE matches (and rewrites) both alike.
const LEASE_CREATE_SQL: &str = "\
INSERT INTO {leases} (processor_name, scope, holder_run_id, token, acquired_at, expires_at)
SELECT @processor, @scope, NULL, 0, @now, @now
FROM UNNEST([1])
WHERE NOT EXISTS (SELECT 1 FROM {leases} WHERE processor_name = @processor AND scope = @scope)";

/// The claim: compare-and-set on the token seen, only when free or expired.
pub const LEASE_TAKE_SQL: &str = "\
UPDATE {leases}
SET holder_run_id = @run_id, token = token + 1, acquired_at = @now, expires_at = @expires_at
WHERE processor_name = @processor AND scope = @scope AND token = @token
  AND (holder_run_id IS NULL OR expires_at <= @now)";

const LEASE_RENEW_SQL: &str = "\
UPDATE {leases} SET expires_at = @expires_at
WHERE processor_name = @processor AND scope = @scope AND token = @token AND holder_run_id = @run_id";

/// The fence of a finish that writes keys: still the holder? Then hold the lease until
/// `@hold_until` at least, while the ledger row and keys are written.
const LEASE_HOLD_SQL: &str = "\
UPDATE {leases} SET expires_at = GREATEST(expires_at, @hold_until)
WHERE processor_name = @processor AND scope = @scope AND token = @token AND holder_run_id = @run_id";

const LEASE_RELEASE_SQL: &str = "\
UPDATE {leases} SET holder_run_id = NULL, expires_at = @now
WHERE processor_name = @processor AND scope = @scope AND token = @token AND holder_run_id = @run_id";

/// A run id is recorded once: the insert adds nothing when the id is already there.
/// `wide_number_mode => 'round'`: a JSON number beyond FLOAT64 precision is rounded rather
/// than failing the insert (BigQuery's default is to reject it).
const RUN_INSERT_SQL: &str = "\
INSERT INTO {runs} ({run_columns})
SELECT @run_id, @processor, @scope, @scope_date, @trigger_source, @mode, @started_at, \
@finished_at, @duration_ms, @status, @skip_reason, @would_skip_reason, @previous_run_id, \
@records_processed, @processing_key, @error, PARSE_JSON(@output, wide_number_mode => 'round')
FROM UNNEST([1])
WHERE NOT EXISTS (SELECT 1 FROM {runs} WHERE run_id = @run_id)";

const KEYS_INSERT_SQL: &str = "\
INSERT INTO {keys} ({key_columns})
SELECT r.processing_key, r.kind, r.processor_name, r.scope, r.scope_date, r.processed_at, \
r.entity_count, PARSE_JSON(r.metadata, wide_number_mode => 'round'), r.run_id
FROM UNNEST(@keys) AS r";

/// Ledger rows; `started_at` is the partition column, so `@since` prunes.
const RUNS_SQL: &str = "\
SELECT {run_columns} FROM {runs}
WHERE started_at >= @since
  AND (@processor IS NULL OR processor_name = @processor)
  AND (@scope IS NULL OR scope = @scope)
  AND (@status IS NULL OR status = @status)
  AND (@trigger IS NULL OR trigger_source = @trigger)
  AND (@except_skip IS NULL OR skip_reason IS NULL OR skip_reason <> @except_skip)
  AND (@run_id IS NULL OR run_id = @run_id)
ORDER BY started_at DESC, run_id DESC
LIMIT @limit";

const PURGE_SQL: &str = "\
DELETE FROM {keys} WHERE processor_name = @processor AND (@scope IS NULL OR scope = @scope)";

// The rows past retention, per table: @before the table's cut-off, @processor the only
// processor (NULL = all; event keys are then kept), @keys_before the keys' cut-off (a
// ledger row a kept key points at stays). Deleted with `DELETE FROM t WHERE ...`, counted
// with `SELECT COUNT(*) AS n FROM t WHERE ...`.
const CLEANUP_KEYS_SQL: &str = "{keys} WHERE processed_at < @before \
AND (@processor IS NULL OR processor_name = @processor)";
const CLEANUP_RUNS_SQL: &str = "{runs} WHERE started_at < @before \
AND (@processor IS NULL OR processor_name = @processor) \
AND run_id NOT IN (SELECT run_id FROM {keys} WHERE processed_at >= @keys_before)";
const CLEANUP_LEASES_SQL: &str = "{leases} WHERE expires_at < @before \
AND (@processor IS NULL OR processor_name = @processor)";
const CLEANUP_EVENTS_SQL: &str =
    "{events} WHERE expires_at IS NOT NULL AND expires_at < @before AND @processor IS NULL";

/// Checks and marks event keys, step 1: marks the first occurrence of each key (@marks)
/// that is absent or expired at @now, tagged with this call's batch id. (Two requests, not
/// one script: the emulator binds no parameters in scripts.)
const EVENTS_CHECK_SQL: &str = "\
MERGE {events} AS t
USING (SELECT m.event_key, m.fingerprint, m.decision, m.expires_at FROM UNNEST(@marks) AS m) AS s
ON t.namespace = @namespace AND t.event_key = s.event_key
WHEN MATCHED AND t.expires_at IS NOT NULL AND t.expires_at <= @now THEN
  UPDATE SET first_seen = @now, fingerprint = s.fingerprint, decision = s.decision,
    expires_at = s.expires_at, batch_id = @batch_id
WHEN NOT MATCHED THEN
  INSERT (namespace, event_key, first_seen, batch_id, fingerprint, decision, expires_at)
  VALUES (@namespace, s.event_key, @now, @batch_id, s.fingerprint, s.decision, s.expires_at)";

/// Step 2: the current unexpired row of every key: a row carrying this batch id is new.
const EVENTS_CHECKED_SQL: &str = "\
SELECT event_key, fingerprint, decision, first_seen, batch_id FROM {events}
WHERE namespace = @namespace AND event_key IN (SELECT m.event_key FROM UNNEST(@marks) AS m)
  AND (expires_at IS NULL OR expires_at > @now OR batch_id = @batch_id)
QUALIFY ROW_NUMBER() OVER (PARTITION BY event_key ORDER BY first_seen, batch_id) = 1";

/// The unexpired event keys among @keys.
const EVENTS_READ_SQL: &str = "\
SELECT DISTINCT event_key FROM {events}
WHERE namespace = @namespace AND event_key IN UNNEST(@keys)
  AND (expires_at IS NULL OR expires_at > @now)";

/// Stores the decision of a marked key.
const EVENTS_DECISION_SQL: &str = "\
UPDATE {events} SET decision = @decision WHERE namespace = @namespace AND event_key = @key";

/// A mutating statement that lost a concurrent-update conflict (BigQuery itself already
/// re-ran it up to three times) is sent again after a random pause that doubles from 50 ms
/// up to 1.6 s: 16 times in all, about 20 s. Under a fleet, the statements of other scopes
/// on the same lease table are what it conflicts with, so it soon gets through.
const CONFLICT_RETRIES: Backoff = Backoff {
    attempts: 16,
    base: Duration::from_millis(50),
    jitter: Duration::from_millis(100),
};
/// A statement BigQuery refused for a quota (the table's DML queue is full: "Too many DML
/// statements outstanding against table …"; a rate limit) did not run, so it is sent
/// again after a random pause that doubles from 0.2 s up to 6.4 s (plus up to 1 s): 40
/// times in all, about 4 minutes, then reported as a quota error (never as the store
/// being unavailable). A full queue holds 20 statements of about a second each, so
/// trying much more often only spends API calls.
const QUOTA_RETRIES: Backoff = Backoff {
    attempts: 40,
    base: Duration::from_millis(200),
    jitter: Duration::from_secs(1),
};
/// Claim rounds (read, then compare-and-set) before giving up; a round that lost a
/// concurrent-update conflict pauses as [`CONFLICT_RETRIES`] does before the next (one
/// whose compare-and-set merely found the row changed reads it again at once). The
/// conflicts of a fleet are mostly with other scopes' statements on the same lease table,
/// which do not hold this lease, so a claim keeps trying for about as long as
/// [`CONFLICT_RETRIES`] before it settles for `in_progress` ("unknown holder").
const CLAIM_ATTEMPTS: u32 = CONFLICT_RETRIES.attempts;
const CLAIM_ROUNDS: Backoff = Backoff {
    attempts: CLAIM_ATTEMPTS,
    ..CONFLICT_RETRIES
};

/// How long a finishing run keeps its lease at least while its ledger row and keys are
/// written (a crash right then blocks the scope this long, or until the lease's own expiry).
const FINISH_HOLD: Duration = Duration::from_secs(600);

/// Default limit for one store statement, polling included.
const STORE_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone)]
struct Statements {
    find_keys: String,
    /// The lease statements of each lease table, by shard.
    leases: Vec<LeaseStatements>,
    run_insert: String,
    keys_insert: String,
    runs: String,
    purge: String,
    cleanup: [String; 4],
    /// The lease cleanup of each lease table (the shards, then the schema-1 table).
    cleanup_leases: Vec<String>,
    events_check: String,
    events_checked: String,
    events_read: String,
    events_decision: String,
}

/// The lease statements on one lease table.
#[derive(Debug, Clone)]
struct LeaseStatements {
    read: String,
    create: String,
    take: String,
    renew: String,
    hold: String,
    release: String,
}

impl Statements {
    fn new(url: &BigQueryUrl) -> Self {
        let render = |sql: &str| {
            sql.replace("{run_columns}", RUN_COLUMNS)
                .replace("{key_columns}", KEY_COLUMNS)
                .replace("{lease_columns}", LEASE_COLUMNS)
                .replace("{keys}", &url.table("processing_keys"))
                .replace("{runs}", &url.table("processing_runs"))
                .replace("{events}", &url.table("event_keys"))
        };
        let leases = |table: &str| {
            let render = |sql: &str| render(sql).replace("{leases}", &url.table(table));
            LeaseStatements {
                read: render(LEASE_READ_SQL),
                create: render(LEASE_CREATE_SQL),
                take: render(LEASE_TAKE_SQL),
                renew: render(LEASE_RENEW_SQL),
                hold: render(LEASE_HOLD_SQL),
                release: render(LEASE_RELEASE_SQL),
            }
        };
        Statements {
            find_keys: render(FIND_KEYS_SQL),
            leases: LEASE_TABLES.iter().map(|t| leases(t)).collect(),
            run_insert: render(RUN_INSERT_SQL),
            keys_insert: render(KEYS_INSERT_SQL),
            runs: render(RUNS_SQL),
            purge: render(PURGE_SQL),
            cleanup: [
                render(CLEANUP_KEYS_SQL),
                render(CLEANUP_RUNS_SQL),
                render(CLEANUP_LEASES_SQL).replace("{leases}", &url.table("processing_leases")),
                render(CLEANUP_EVENTS_SQL),
            ],
            cleanup_leases: LEASE_TABLES
                .iter()
                .chain(["processing_leases"].iter())
                .map(|t| render(CLEANUP_LEASES_SQL).replace("{leases}", &url.table(t)))
                .collect(),
            events_check: render(EVENTS_CHECK_SQL),
            events_checked: render(EVENTS_CHECKED_SQL),
            events_read: render(EVENTS_READ_SQL),
            events_decision: render(EVENTS_DECISION_SQL),
        }
    }
}

/// The BigQuery store.
#[derive(Debug)]
pub struct BigQueryStore {
    conn: Connection,
    url: String,
    config: BigQueryUrl,
    sql: Statements,
}

fn render_migration(sql: &str, url: &BigQueryUrl) -> String {
    sql.replace("{project}", &url.project)
        .replace("{dataset}", &url.dataset)
}

impl BigQueryStore {
    /// Opens `bigquery://PROJECT/DATASET[?…]`. One cheap check (`tables.list`, not billed)
    /// tells whether the tables exist; when one is missing the dataset and tables are
    /// created ([`StoreBase::migrate`]).
    pub async fn connect(url: &str) -> Result<Self> {
        let store = Self::connect_lazy(url).await?;
        migrations::run(&store).await?;
        Ok(store)
    }

    /// Opens the store without checking or creating anything (nothing is sent to the API).
    pub async fn connect_lazy(url: &str) -> Result<Self> {
        let config = BigQueryUrl::parse(url)?;
        let conn = Connection::open(&config, STORE_TIMEOUT)
            .await
            .map_err(|e| Error::store(url, e))?;
        Ok(BigQueryStore {
            conn,
            url: url.to_string(),
            sql: Statements::new(&config),
            config,
        })
    }

    /// Installs a test seam called before every statement (see [`FaultHook`]); the
    /// emulator cannot produce real concurrent-update conflicts, so tests inject them here.
    pub fn with_fault_hook(mut self, hook: FaultHook) -> Self {
        self.conn.set_fault_hook(hook);
        self
    }

    /// The parsed URL.
    pub fn config(&self) -> &BigQueryUrl {
        &self.config
    }

    /// The per-run check statement as sent (see [`FIND_KEYS_SQL`]).
    pub fn find_keys_sql(&self) -> &str {
        &self.sql.find_keys
    }

    /// Statements (API round trips) sent so far.
    pub fn api_calls(&self) -> u64 {
        self.conn.calls()
    }

    /// A failed call: [`Error::StoreUnavailable`] when BigQuery could not be reached or
    /// could not answer, [`Error::StoreRejected`] when it refused the statement.
    fn err(&self, e: ApiError) -> Error {
        if e.is_outage() {
            let message = e.to_string();
            Error::store_source(&self.url, message, e)
        } else {
            Error::StoreRejected {
                store: self.url.clone(),
                operation: format!("the {} statement", e.operation),
                message: e.to_string(),
                source: Some(Box::new(e)),
            }
        }
    }

    fn bad_row(&self, operation: &str, e: String) -> Error {
        Error::store(
            &self.url,
            format!("bigquery {operation}: unexpected result row: {e}"),
        )
    }

    /// Sends one statement; a quota answer ([`ApiError::is_quota`]: the statement did not
    /// run) is sent again as [`QUOTA_RETRIES`] says, then reported as a quota error.
    async fn send(
        &self,
        operation: &str,
        sql: &str,
        params: &[Param],
    ) -> std::result::Result<QueryOutput, ApiError> {
        let started = Instant::now();
        let sent = AtomicU32::new(0);
        let sent = &sent;
        retry(QUOTA_RETRIES, |attempt| async move {
            sent.store(attempt + 1, Ordering::Relaxed);
            match self.conn.query(operation, sql, params.to_vec()).await {
                Ok(out) => Ok(out),
                Err(e) if e.is_quota() => {
                    tracing::debug!("{e}; sending it again after a pause");
                    Err(Retry::Again(e))
                }
                Err(e) => Err(Retry::Stop(e)),
            }
        })
        .await
        .map_err(|e| {
            if e.is_quota() {
                e.after_retries(
                    "BigQuery quota exceeded",
                    sent.load(Ordering::Relaxed),
                    started.elapsed(),
                )
            } else {
                e
            }
        })
    }

    async fn query(&self, operation: &str, sql: &str, params: Vec<Param>) -> Result<QueryOutput> {
        self.send(operation, sql, &params)
            .await
            .map_err(|e| self.err(e))
    }

    /// A mutating statement (UPDATE/DELETE) whose effect does not depend on what it lost
    /// to: sent again after a concurrent-update conflict ([`CONFLICT_RETRIES`]), then
    /// reported as a conflict. Returns the rows affected.
    async fn mutate(&self, operation: &str, sql: &str, params: Vec<Param>) -> Result<u64> {
        let params = &params;
        let started = Instant::now();
        let sent = AtomicU32::new(0);
        let sent = &sent;
        let out = retry(CONFLICT_RETRIES, |attempt| async move {
            sent.store(attempt + 1, Ordering::Relaxed);
            match self.send(operation, sql, params).await {
                Ok(out) => Ok(out),
                Err(e) if e.is_concurrent_update() => {
                    tracing::debug!("{e}; sending it again");
                    Err(Retry::Again(e))
                }
                Err(e) => Err(Retry::Stop(e)),
            }
        })
        .await
        .map_err(|e| {
            let e = if e.is_concurrent_update() {
                e.after_retries(
                    "BigQuery concurrent-update conflict",
                    sent.load(Ordering::Relaxed),
                    started.elapsed(),
                )
            } else {
                e
            };
            self.err(e)
        })?;
        out.affected(operation).map_err(|e| self.err(e))
    }

    /// The rows past retention of cleanup table `i` ([`super::common::CLEANUP_TABLES`]),
    /// one `{table} WHERE …` per BigQuery table: the leases are in the lease shards and
    /// the schema-1 `processing_leases`.
    fn cleanup_rows(&self, i: usize) -> Vec<&String> {
        if i == 2 {
            self.sql.cleanup_leases.iter().collect()
        } else {
            vec![&self.sql.cleanup[i]]
        }
    }

    /// The lease statements of (processor, scope)'s lease table.
    fn leases(&self, processor: &str, scope: &str) -> &LeaseStatements {
        &self.sql.leases[lease_shard(processor, scope)]
    }

    /// `ALTER TABLE … SET OPTIONS (partition_expiration_days = N | NULL)` on each
    /// partitioned table. DDL options cannot be bound as parameters: `days` is an integer,
    /// checked to be from 1 to [`MAX_PARTITION_EXPIRATION_DAYS`].
    async fn alter_partition_expiration(&self, operation: &str, days: Option<u32>) -> Result<()> {
        let days = match days {
            Some(d) if (1..=MAX_PARTITION_EXPIRATION_DAYS).contains(&d) => d.to_string(),
            Some(d) => {
                return Err(Error::input(format!(
                    "partition expiration must be from 1 to {MAX_PARTITION_EXPIRATION_DAYS} days, got {d}"
                )))
            }
            None => "NULL".to_string(),
        };
        for table in PARTITIONED_TABLES {
            // Event keys are partitioned by first sighting, but a key's life is its TTL (a
            // gate's default is never): expiring their partitions would let a 31-day-old
            // payment through again, so they expire only by `idem cleanup`, by TTL.
            let days = if *table == "event_keys" {
                "NULL"
            } else {
                days.as_str()
            };
            let sql = format!(
                "ALTER TABLE {} SET OPTIONS (partition_expiration_days = {days})",
                self.config.table(table)
            );
            self.query(operation, &sql, Vec::new()).await?;
        }
        Ok(())
    }

    async fn tables_exist(&self) -> Result<bool> {
        use gcp_bigquery_client::table::ListOptions;
        let mut found: Vec<String> = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let mut options = ListOptions::default().max_results(1000);
            if let Some(token) = page.take() {
                options = options.page_token(token);
            }
            let list = self
                .conn
                .rest(
                    "migrate.check",
                    self.conn.client().table().list(
                        &self.config.project,
                        &self.config.dataset,
                        options,
                    ),
                )
                .await;
            let list = match list {
                Ok(list) => list,
                Err(e) if e.is_not_found() => return Ok(false),
                Err(e) => return Err(self.err(e)),
            };
            found.extend(
                list.tables
                    .unwrap_or_default()
                    .into_iter()
                    .map(|t| t.table_reference.table_id),
            );
            match list.next_page_token {
                Some(token) if !token.is_empty() => page = Some(token),
                _ => break,
            }
        }
        Ok(tables().all(|t| found.iter().any(|f| f == t)))
    }

    /// Whether `event_keys` has the columns of migration 0003 (event dedup).
    async fn event_dedup_columns_exist(&self) -> Result<bool> {
        let table = self
            .conn
            .rest(
                "migrate.check",
                self.conn.client().table().get(
                    &self.config.project,
                    &self.config.dataset,
                    "event_keys",
                    None,
                ),
            )
            .await
            .map_err(|e| self.err(e))?;
        let fields = table.schema.fields.unwrap_or_default();
        Ok(fields.iter().any(|f| f.name == "expires_at"))
    }

    async fn ensure_dataset(&self) -> Result<()> {
        use gcp_bigquery_client::model::dataset::Dataset;
        let (project, dataset) = (&self.config.project, &self.config.dataset);
        match self
            .conn
            .rest(
                "migrate.dataset",
                self.conn.client().dataset().get(project, dataset),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(self.err(e)),
        }
        let mut new = Dataset::new(project, dataset);
        if let Some(location) = &self.config.location {
            new = new.location(location);
        }
        match self
            .conn
            .rest("migrate.dataset", self.conn.client().dataset().create(new))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_already_exists() => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }

    async fn lease_row(
        &self,
        operation: &str,
        processor: &str,
        scope: &str,
    ) -> Result<Option<LeaseRow>> {
        let out = self
            .query(
                operation,
                &self.leases(processor, scope).read,
                vec![string("processor", processor), string("scope", scope)],
            )
            .await?;
        let row = out.records().next();
        row.map(|r| lease_from_record(&r))
            .transpose()
            .map_err(|e| self.bad_row(operation, e))
    }

    async fn lease_lost(&self, lease: &Lease) -> Error {
        let holder = match self
            .lease_row("lease_holder", &lease.processor, &lease.scope)
            .await
        {
            Ok(row) => row.and_then(|r| r.holder),
            Err(e) => {
                tracing::warn!("could not read the lease holder: {e}");
                None
            }
        };
        lease.lost(holder)
    }

    fn fenced_params(lease: &Lease) -> Vec<Param> {
        vec![
            string("processor", &lease.processor),
            string("scope", &lease.scope),
            int64("token", lease.token),
            string("run_id", &lease.run_id),
        ]
    }
}

/// No version record: the tables all there is the latest version; no lock either: every
/// statement is idempotent, and a table created meanwhile by another process is fine.
#[async_trait]
impl Schema for BigQueryStore {
    fn migrations(&self) -> &'static [Migration] {
        migrations::BIGQUERY
    }

    async fn version(&self) -> Result<i64> {
        Ok(if !self.tables_exist().await? {
            0
        } else if self.event_dedup_columns_exist().await? {
            migrations::latest(migrations::BIGQUERY)
        } else {
            1
        })
    }

    async fn apply(&self) -> Result<()> {
        self.ensure_dataset().await?;
        // Every migration, every time: the DDL is idempotent (`IF NOT EXISTS`).
        for migration in migrations::pending(migrations::BIGQUERY, 0) {
            let script = render_migration(migration.sql, &self.config);
            for statement in crate::backend::prepare(&script, crate::backend::Dialect::BigQuery)? {
                match self
                    .conn
                    .query("migrate.create_table", &statement.sql, Vec::new())
                    .await
                {
                    Ok(_) => {}
                    // Another process created it between IF NOT EXISTS and the create.
                    Err(e) if e.is_already_exists() => {}
                    Err(e) => return Err(self.err(e)),
                }
            }
        }
        if let Some(days) = self.config.partition_expiration_days {
            self.alter_partition_expiration("migrate.partition_expiration", Some(days))
                .await?;
        }
        Ok(())
    }
}

#[async_trait]
impl StoreBase for BigQueryStore {
    fn kind(&self) -> &'static str {
        "bigquery"
    }

    fn location(&self) -> String {
        self.url.clone()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::SHARED
    }

    /// Creates what is missing and sets the partition expiration, even when the tables
    /// exist (the DDL is idempotent), so a changed `partition_expiration_days` applies.
    async fn migrate(&self) -> Result<()> {
        self.apply().await
    }
}

#[async_trait]
impl LeaseStore for BigQueryStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim> {
        let now = micros(request.now);
        let expires_at = lease_expiry(now, request.ttl);
        let mut conflicts = 0;
        for attempt in 0..CLAIM_ATTEMPTS {
            let row = self
                .lease_row("claim.read", request.processor, request.scope)
                .await?;
            let seen = match &row {
                Some(r) => {
                    if let Some(holder) = r.held_at(now) {
                        return Ok(Claim::Held(holder));
                    }
                    r.token
                }
                None => {
                    self.query(
                        "claim.create",
                        &self.leases(request.processor, request.scope).create,
                        vec![
                            string("processor", request.processor),
                            string("scope", request.scope),
                            timestamp("now", now),
                        ],
                    )
                    .await?;
                    0
                }
            };
            let taken = self
                .send(
                    "claim.take",
                    &self.leases(request.processor, request.scope).take,
                    &[
                        string("processor", request.processor),
                        string("scope", request.scope),
                        string("run_id", request.run_id),
                        int64("token", seen),
                        timestamp("now", now),
                        timestamp("expires_at", expires_at),
                    ],
                )
                .await;
            match taken {
                Ok(out) => {
                    if out.affected("claim.take").map_err(|e| self.err(e))? >= 1 {
                        return Ok(request.acquired(seen + 1, now, expires_at));
                    }
                    // Another claim changed the row since it was read: read it again.
                }
                Err(e) if e.is_concurrent_update() => {
                    // Another statement on the lease table committed first; this claim
                    // did not. Read again: usually that was a competing claim (held).
                    tracing::info!("{e}: the claim lost a concurrent update");
                    conflicts += 1;
                    if attempt + 1 < CLAIM_ATTEMPTS {
                        tokio::time::sleep(CLAIM_ROUNDS.pause(attempt)).await;
                    }
                }
                Err(e) => return Err(self.err(e)),
            }
        }
        let row = self
            .lease_row("claim.read", request.processor, request.scope)
            .await?;
        if let Some(holder) = row.as_ref().and_then(|r| r.held_at(now)) {
            return Ok(Claim::Held(holder));
        }
        if conflicts > 0 {
            // Lost every round to concurrent updates of the lease table without anyone
            // holding this lease now: still "someone else was writing", not a failure.
            return Ok(Claim::Held(LeaseHolder {
                run_id: format!(
                    "unknown (the claim lost {conflicts} concurrent update conflict(s) on {})",
                    LEASE_TABLES[lease_shard(request.processor, request.scope)]
                ),
                token: row.map_or(0, |r| r.token),
                acquired_at: now,
                expires_at: now,
            }));
        }
        Err(Error::store(
            &self.url,
            format!("lease claim did not settle after {CLAIM_ATTEMPTS} attempts"),
        ))
    }

    async fn lease_holder(
        &self,
        processor: &str,
        scope: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<LeaseHolder>> {
        Ok(self
            .lease_row("lease_holder", processor, scope)
            .await?
            .and_then(|r| r.held_at(now)))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration, now: DateTime<Utc>) -> Result<Lease> {
        let expires_at = lease_expiry(micros(now), ttl);
        let mut params = Self::fenced_params(lease);
        params.push(timestamp("expires_at", expires_at));
        let sql = &self.leases(&lease.processor, &lease.scope).renew;
        if self.mutate("renew", sql, params).await? >= 1 {
            return Ok(Lease {
                expires_at,
                ..lease.clone()
            });
        }
        Err(self.lease_lost(lease).await)
    }

    async fn release(&self, lease: &Lease, now: DateTime<Utc>) -> Result<bool> {
        let mut params = Self::fenced_params(lease);
        params.push(timestamp("now", micros(now)));
        Ok(self
            .mutate(
                "release",
                &self.leases(&lease.processor, &lease.scope).release,
                params,
            )
            .await?
            >= 1)
    }
}

#[async_trait]
impl LedgerStore for BigQueryStore {
    async fn find_keys(&self, lookups: &[KeyLookup]) -> Result<Vec<Option<KeyRecord>>> {
        let mut out = vec![None; lookups.len()];
        let Some(oldest) = lookups.iter().map(|l| micros(l.since)).min() else {
            return Ok(out);
        };
        let mut keys: Vec<String> = lookups.iter().map(|l| l.key.clone()).collect();
        keys.sort();
        keys.dedup();
        let rows = lookups
            .iter()
            .enumerate()
            .map(|(i, l)| {
                vec![
                    Some(i.to_string()),
                    Some(l.key.clone()),
                    Some(l.kind.as_str().to_string()),
                    Some(timestamp_text(micros(l.since))),
                ]
            })
            .collect();
        let result = self
            .query(
                "find_keys",
                &self.sql.find_keys,
                vec![
                    struct_array(
                        "lookups",
                        &[
                            ("pos", "INT64"),
                            ("key", "STRING"),
                            ("kind", "STRING"),
                            ("since", "TIMESTAMP"),
                        ],
                        rows,
                    ),
                    string_array("keys", &keys),
                    timestamp("oldest_since", oldest),
                ],
            )
            .await?;
        for r in result.records() {
            let pos = r.i64("pos").map_err(|e| self.bad_row("find_keys", e))?;
            let slot = usize::try_from(pos)
                .ok()
                .and_then(|p| out.get_mut(p))
                .ok_or_else(|| self.bad_row("find_keys", format!("position {pos} out of range")))?;
            *slot = Some(key_from_record(&r).map_err(|e| self.bad_row("find_keys", e))?);
        }
        Ok(out)
    }

    async fn finish(&self, finish: &Finish) -> Result<()> {
        let run = &finish.run;
        let writes_keys = run.status == RunStatus::Completed && !finish.keys.is_empty();
        // 1. The fence: nothing is written for a run whose lease was taken over. A run
        //    that writes keys keeps its lease (held a little longer) until they are
        //    written, so a run claiming the scope after it re-checks and sees them; any
        //    other run releases at once. A lease that is held for FINISH_HOLD more anyway
        //    needs no fence: it cannot have been taken over (a claim takes only an expired
        //    lease) and stays held while the keys are written — one mutating statement
        //    less per run, which is what a fleet is short of.
        let hold = chrono::Duration::from_std(FINISH_HOLD).unwrap_or_default();
        let fence = finish
            .lease
            .as_ref()
            .filter(|l| !writes_keys || l.expires_at < run.finished_at + hold);
        if let Some(lease) = fence {
            let statements = self.leases(&lease.processor, &lease.scope);
            let mut params = Self::fenced_params(lease);
            let (operation, sql) = if writes_keys {
                params.push(timestamp(
                    "hold_until",
                    micros(
                        run.finished_at
                            + chrono::Duration::from_std(FINISH_HOLD).unwrap_or_default(),
                    ),
                ));
                ("finish.fence", &statements.hold)
            } else {
                params.push(timestamp("now", micros(run.finished_at)));
                ("finish.release", &statements.release)
            };
            if self.mutate(operation, sql, params).await? == 0 {
                return Err(self.lease_lost(lease).await);
            }
        }
        // 2. The ledger row (once per run id).
        let inserted = self
            .query(
                "finish.run",
                &self.sql.run_insert,
                vec![
                    string("run_id", &run.run_id),
                    string("processor", &run.processor),
                    string("scope", &run.scope),
                    date("scope_date", run.scope_date),
                    string("trigger_source", run.trigger.as_str()),
                    string("mode", run.mode.as_str()),
                    timestamp("started_at", micros(run.started_at)),
                    timestamp("finished_at", micros(run.finished_at)),
                    int64("duration_ms", run.duration_ms),
                    string("status", run.status.as_str()),
                    opt_string("skip_reason", run.skip_reason.as_ref().map(|r| r.as_str())),
                    opt_string(
                        "would_skip_reason",
                        run.would_skip_reason.as_ref().map(|r| r.as_str()),
                    ),
                    opt_string("previous_run_id", run.previous_run_id.as_deref()),
                    opt_int64("records_processed", run.records_processed),
                    opt_string("processing_key", run.processing_key.as_deref()),
                    opt_string("error", run.error.as_deref()),
                    opt_string(
                        "output",
                        run.output.as_ref().map(|v| v.to_string()).as_deref(),
                    ),
                ],
            )
            .await?
            .affected("finish.run")
            .map_err(|e| self.err(e))?;
        if inserted == 0 {
            return Err(Error::DuplicateRunId {
                store: self.url.clone(),
                run_id: run.run_id.clone(),
            });
        }
        // 3. The keys, only for a completed run.
        if writes_keys {
            let rows = finish
                .keys
                .iter()
                .map(|k| {
                    vec![
                        Some(k.key.clone()),
                        Some(k.kind.as_str().to_string()),
                        Some(k.processor.clone()),
                        Some(k.scope.clone()),
                        Some(time::day_text(k.scope_date)),
                        Some(timestamp_text(micros(k.processed_at))),
                        k.entity_count.map(|n| n.to_string()),
                        Some(k.metadata.to_string()),
                        Some(k.run_id.clone()),
                    ]
                })
                .collect();
            self.query(
                "finish.keys",
                &self.sql.keys_insert,
                vec![struct_array(
                    "keys",
                    &[
                        ("processing_key", "STRING"),
                        ("kind", "STRING"),
                        ("processor_name", "STRING"),
                        ("scope", "STRING"),
                        ("scope_date", "DATE"),
                        ("processed_at", "TIMESTAMP"),
                        ("entity_count", "INT64"),
                        ("metadata", "STRING"),
                        ("run_id", "STRING"),
                    ],
                    rows,
                )],
            )
            .await?;
            // 4. Now the keys are visible: release.
            if let Some(lease) = &finish.lease {
                let mut params = Self::fenced_params(lease);
                params.push(timestamp("now", micros(run.finished_at)));
                // The result is recorded whatever happens here, so this cannot fail the
                // finish; a lease not released expires by itself.
                match self
                    .mutate(
                        "finish.release",
                        &self.leases(&lease.processor, &lease.scope).release,
                        params,
                    )
                    .await
                {
                    Ok(0) => tracing::warn!(
                        "run {}: the lease on {}/{} was taken over while its result was being recorded (finishing took longer than {:?})",
                        run.run_id,
                        lease.processor,
                        lease.scope,
                        FINISH_HOLD
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(
                        "run {} is recorded, but its lease could not be released; it expires by {}: {e}",
                        run.run_id,
                        time::utc_text(
                            (run.finished_at + chrono::Duration::from_std(FINISH_HOLD).unwrap_or_default())
                                .max(lease.expires_at)
                        )
                    ),
                }
            }
        }
        Ok(())
    }

    async fn runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>> {
        let since = filter
            .since
            .map(micros)
            .unwrap_or_else(|| DateTime::from_timestamp_micros(0).unwrap_or_default());
        let limit = if filter.limit == 0 {
            i64::MAX
        } else {
            i64::try_from(filter.limit).unwrap_or(i64::MAX)
        };
        let out = self
            .query(
                "runs",
                &self.sql.runs,
                vec![
                    timestamp("since", since),
                    opt_string("processor", filter.processor.as_deref()),
                    opt_string("scope", filter.scope.as_deref()),
                    opt_string("status", filter.status.map(|s| s.as_str())),
                    opt_string("trigger", filter.trigger.map(|t| t.as_str())),
                    opt_string(
                        "except_skip",
                        filter.except_skip_reason.as_ref().map(|r| r.as_str()),
                    ),
                    opt_string("run_id", filter.run_id.as_deref()),
                    int64("limit", limit),
                ],
            )
            .await?;
        out.records()
            .map(|r| run_from_record(&r).map_err(|e| self.bad_row("runs", e)))
            .collect()
    }
}

#[async_trait]
impl MaintenanceStore for BigQueryStore {
    async fn purge(&self, processor: &str, scope: Option<&str>) -> Result<u64> {
        self.mutate(
            "purge",
            &self.sql.purge,
            vec![string("processor", processor), opt_string("scope", scope)],
        )
        .await
    }

    async fn cleanup(&self, policy: &CleanupPolicy) -> Result<CleanupReport> {
        // BigQuery deletes each table's rows in one DML statement (no LIMIT in DML; its
        // DML does not lock out the runs' inserts), so `batch` does not apply.
        const OPERATIONS: [&str; 4] = [
            "cleanup.keys",
            "cleanup.runs",
            "cleanup.leases",
            "cleanup.event_keys",
        ];
        let params = |cutoff: DateTime<Utc>| {
            vec![
                timestamp("before", micros(cutoff)),
                opt_string("processor", policy.processor.as_deref()),
                timestamp("keys_before", micros(policy.keys_before)),
            ]
        };
        let params = &params;
        cleanup_tables(
            policy,
            false,
            |i, cutoff| async move {
                let operation = OPERATIONS[i];
                let sql = match self.cleanup_rows(i).as_slice() {
                    [rows] => format!("SELECT COUNT(*) AS n FROM {rows}"),
                    tables => format!(
                        "SELECT COUNT(*) AS n FROM ({})",
                        tables
                            .iter()
                            .map(|rows| format!("SELECT 1 FROM {rows}"))
                            .collect::<Vec<_>>()
                            .join(" UNION ALL ")
                    ),
                };
                let out = self.query(operation, &sql, params(cutoff)).await?;
                let n = out
                    .records()
                    .next()
                    .map(|r| r.i64("n"))
                    .transpose()
                    .map_err(|e| self.bad_row(operation, e))?
                    .unwrap_or(0);
                Ok(u64::try_from(n).unwrap_or(0))
            },
            |i, cutoff| async move {
                let mut deleted = 0;
                for rows in self.cleanup_rows(i) {
                    let sql = format!("DELETE FROM {rows}");
                    deleted += self.mutate(OPERATIONS[i], &sql, params(cutoff)).await?;
                }
                Ok(deleted)
            },
        )
        .await
    }

    /// Each partitioned table's `timePartitioning.expirationMs`, by `tables.get` (not
    /// billed).
    async fn partition_expiration(&self) -> Result<Option<Vec<PartitionExpiration>>> {
        let mut found = Vec::with_capacity(PARTITIONED_TABLES.len());
        for table in PARTITIONED_TABLES {
            let got = self
                .conn
                .rest(
                    "cleanup.partition_expiration",
                    self.conn.client().table().get(
                        &self.config.project,
                        &self.config.dataset,
                        table,
                        None,
                    ),
                )
                .await
                .map_err(|e| self.err(e))?;
            let partitioning = got.time_partitioning.as_ref();
            found.push(PartitionExpiration::from_api(
                table,
                partitioning.map(|p| p.expiration_ms.as_deref()),
            ));
        }
        Ok(Some(found))
    }

    async fn set_partition_expiration(&self, days: Option<u32>) -> Result<()> {
        self.alter_partition_expiration("cleanup.partition_expiration", days)
            .await
    }
}

#[async_trait]
impl EventKeyStore for BigQueryStore {
    async fn check_and_mark(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
    ) -> Result<Vec<EventVerdict>> {
        if marks.is_empty() {
            return Ok(Vec::new());
        }
        let rows = event_keys::firsts(marks)
            .into_iter()
            .map(|m| {
                vec![
                    Some(m.key.clone()),
                    m.fingerprint.clone(),
                    event_keys::decision_text(m),
                    m.expires_at(now).map(timestamp_text),
                ]
            })
            .collect();
        let fields = [
            ("event_key", "STRING"),
            ("fingerprint", "STRING"),
            ("decision", "STRING"),
            ("expires_at", "TIMESTAMP"),
        ];
        let batch = crate::model::new_run_id();
        let params = vec![
            struct_array("marks", &fields, rows),
            string("namespace", namespace),
            timestamp("now", micros(now)),
            string("batch_id", &batch),
        ];
        self.query("check_and_mark", &self.sql.events_check, params.clone())
            .await?;
        let out = self
            .query("check_and_mark.read", &self.sql.events_checked, params)
            .await?;
        let mut found = Found::default();
        for r in out.records() {
            let read = || -> std::result::Result<_, String> {
                Ok((
                    r.str("event_key")?,
                    r.opt_str("fingerprint")?,
                    r.opt_str("decision")?,
                    r.timestamp("first_seen")?,
                    r.str("batch_id")?,
                ))
            };
            let (key, fingerprint, decision, first_seen, batch_id) =
                read().map_err(|e| self.bad_row("check_and_mark.read", e))?;
            if batch_id == batch {
                found.marked(key);
            } else {
                found.stored(key, fingerprint, decision, first_seen);
            }
        }
        Ok(found.verdicts(marks, now))
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
        let out = self
            .query(
                "is_duplicate",
                &self.sql.events_read,
                vec![
                    string_array("keys", keys),
                    string("namespace", namespace),
                    timestamp("now", micros(now)),
                ],
            )
            .await?;
        let found: Vec<String> = out
            .records()
            .map(|r| r.str("event_key"))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| self.bad_row("is_duplicate", e))?;
        Ok(event_keys::present(keys, found))
    }

    async fn record_decision(
        &self,
        namespace: &str,
        key: &str,
        decision: &serde_json::Value,
    ) -> Result<bool> {
        let params = vec![
            string("namespace", namespace),
            string("key", key),
            string("decision", &decision.to_string()),
        ];
        let n = self
            .mutate("record_decision", &self.sql.events_decision, params)
            .await?;
        Ok(n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Quota answers and conflicts that outlast their retries are reported as what they
    /// are, refused by a working BigQuery, never as the store being unavailable.
    #[tokio::test]
    async fn quota_and_conflict_errors_are_not_outages() {
        let store = BigQueryStore::connect_lazy("bigquery://p/d?endpoint=http://127.0.0.1:9")
            .await
            .unwrap();
        let quota = ApiError::dml_queue_full("claim.take", "p:d.processing_leases_03", 20)
            .after_retries("BigQuery quota exceeded", 60, Duration::from_secs(190));
        assert!(quota.is_quota() && !quota.is_outage());
        let e = store.err(quota);
        assert!(!e.is_outage(), "{e:?}");
        assert!(matches!(e, Error::StoreRejected { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "store bigquery://p/d?endpoint=http://127.0.0.1:9 rejected the claim.take statement: \
             bigquery claim.take failed: HTTP 400 (resourcesExceeded): BigQuery quota exceeded: \
             Resources exceeded during query execution: Too many DML statements outstanding \
             against table p:d.processing_leases_03, limit is 20. (sent 60 time(s) over 190.0s)"
        );
        let conflict = ApiError::concurrent_update("finish.release", "p:d.processing_leases_03")
            .after_retries(
                "BigQuery concurrent-update conflict",
                16,
                Duration::from_secs(20),
            );
        let e = store.err(conflict);
        assert!(matches!(e, Error::StoreRejected { .. }), "{e:?}");
        assert!(e.to_string().contains("BigQuery concurrent-update conflict: Could not serialize access to table p:d.processing_leases_03 due to concurrent update (sent 16 time(s) over 20.0s)"), "{e}");
        for reason in ["rateLimitExceeded", "quotaExceeded"] {
            let e = ApiError::new(
                "x",
                crate::backend::bigquery::ErrorShape::Http(403),
                Some(reason),
                "Exceeded rate limits",
            );
            assert!(e.is_quota() && !e.is_outage(), "{reason}");
        }
        let down = ApiError::new(
            "x",
            crate::backend::bigquery::ErrorShape::Http(503),
            Some("backendError"),
            "down",
        );
        assert!(!down.is_quota() && down.is_outage());
    }

    #[test]
    fn lease_shards_spread_and_are_stable() {
        let mut counts = [0usize; 16];
        for i in 0..1600 {
            counts[lease_shard(
                &format!("job{}", i % 50),
                &format!("2025-01-{:02}", i / 50 + 1),
            )] += 1;
        }
        assert!(counts.iter().all(|&n| n > 50), "{counts:?}");
        // Stable across processes and versions: a changed hash would split a lease.
        assert_eq!(
            lease_shard("player_game_summary", "2025-11-18"),
            lease_shard("player_game_summary", "2025-11-18")
        );
        assert_ne!(lease_shard("a", "bc"), lease_shard("ab", "c"));
    }

    #[test]
    fn statements_are_qualified_and_parameterised() {
        let url = BigQueryUrl::parse("bigquery://proj-1/ds_1").unwrap();
        let sql = Statements::new(&url);
        assert!(sql
            .find_keys
            .contains("FROM `proj-1.ds_1.processing_keys` AS k"));
        assert!(sql
            .find_keys
            .contains("WHERE k.processed_at >= @oldest_since"));
        for s in [
            &sql.find_keys,
            &sql.run_insert,
            &sql.runs,
            &sql.leases[15].take,
        ] {
            assert!(!s.contains('{'), "unrendered placeholder in {s}");
        }
        let ddl = render_migration(migrations::BIGQUERY[0].sql, &url);
        assert!(ddl.contains("`proj-1.ds_1.processing_keys`"));
        assert!(ddl.contains(
            "PARTITION BY DATE(processed_at)\nCLUSTER BY processing_key, processor_name"
        ));
        let statements = crate::backend::prepare(&ddl, crate::backend::Dialect::BigQuery).unwrap();
        assert_eq!(statements.len(), 4, "0001 creates the four schema-1 tables");
        assert!(statements.iter().all(|s| s.params.is_empty()));
    }
}
