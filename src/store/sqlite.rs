//! SQLite store (sqlx): the embedded default.
//!
//! The file is created and migrated on first use, in WAL mode with a busy timeout, so
//! several `idem` processes can share one file: a claim is one `INSERT … ON CONFLICT DO
//! UPDATE … WHERE expired RETURNING token` statement, which SQLite runs under its single
//! writer lock, so exactly one process wins. `finish` is one transaction.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Connection, Row};

use super::common::{cleanup_tables, statements, upsert_claim, CLEANUP_TABLES};
use super::event_keys::{self, Cursor, Found};
use super::migrations::{self, Migration, Schema};
use super::rows::{KeyRow, LeaseColumns, LeaseRow, RunRow, KEY_COLUMNS, RUN_COLUMNS};
use super::{
    lease_expiry, Capabilities, Claim, ClaimRequest, CleanupPolicy, CleanupReport, EventKeyStore,
    EventMark, EventVerdict, Finish, KeyLookup, Lease, LeaseHolder, LeaseStore, LedgerStore,
    MaintenanceStore, RunFilter, StoreBase,
};
use crate::error::{Error, Result};
use crate::model::{micros, time, KeyRecord, RunRecord, RunStatus};

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    url: String,
    events: Arc<EventWriter>,
    /// The pool's size: how many event batches go side by side.
    connections: usize,
    /// Closes the pool when the last clone of this store is dropped.
    _closer: Arc<crate::backend::sqlite::Closer>,
}

/// What the event-key batches of one store share: their turn at the write transaction, and
/// whether the last batch found none of its keys stored.
#[derive(Debug, Default)]
struct EventWriter {
    /// Held while a batch writes (its all-or-nothing insert, or `BEGIN IMMEDIATE` to
    /// `COMMIT`): this process's batches take turns here, in the order they asked,
    /// instead of in SQLite's busy handler (which sleeps whole milliseconds); other
    /// processes still wait on the database's lock. Reads do not take it.
    turn: tokio::sync::Mutex<()>,
    /// The last batch found none of its keys stored: the next one is tried as one
    /// all-or-nothing insert of every key (fresh keys come in runs), not read first.
    fresh: std::sync::atomic::AtomicBool,
}

fn ts(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

// How SQLite stores instants (microseconds), days (text) and JSON (text).
type Run = RunRow<i64, String, String>;
type Key = KeyRow<i64, String, String>;
type LeaseCols = LeaseColumns<i64>;

impl SqliteStore {
    /// Opens `sqlite://PATH` (or `sqlite::memory:`), creating and migrating the file, with
    /// one connection unless the URL says `?max_connections=N` (SQLite has one writer at
    /// a time: in one process, statements take turns on the pool instead of in SQLite's
    /// busy handler).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_sized(url, crate::backend::PoolSize::ONE_RUN.sqlite).await
    }

    /// [`SqliteStore::connect`] with `connections` in the pool when the URL does not say.
    pub async fn connect_sized(url: &str, connections: u32) -> Result<Self> {
        let (driver_url, size) = crate::backend::take_max_connections(url)
            .map_err(|e| Error::config(format!("{url}: {e}")))?;
        let connections = size.unwrap_or(connections).max(1);
        let options = crate::backend::sqlite::connect_options(&driver_url)?
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(false);
        // A path that can never hold a ledger is a usage error (exit 2, even under
        // best_effort), not an outage: a folder, a file that is not a SQLite database
        // (SQLite says so when the pool's first connection sets WAL mode). A folder that
        // does not exist stays an outage (an unmounted volume comes back), and the message
        // names it.
        crate::backend::sqlite::check_database_file(url, options.get_filename())?;
        let folder = options
            .get_filename()
            .parent()
            .filter(|p| !p.as_os_str().is_empty() && !p.is_dir())
            .map(|p| format!(" (the folder {} does not exist)", p.display()));
        // Opening switches the file to WAL; two processes opening a new file at once can
        // find it locked for that switch, which SQLite's busy timeout does not cover: such
        // an open is tried again (for up to about 5 s) instead of failing the run.
        let policy = super::retry::Backoff {
            attempts: 40,
            base: std::time::Duration::from_millis(5),
            jitter: std::time::Duration::from_millis(20),
        };
        let pool = super::retry::retry(policy, |_| {
            let options = options.clone();
            async move {
                // No ping before each acquire: a SQLite connection is a file handle in this
                // process, and the ping is a round trip to its worker thread (a third of
                // the time an event batch took to begin its transaction).
                SqlitePoolOptions::new()
                    .max_connections(connections)
                    .test_before_acquire(false)
                    // A connection whose transaction could neither commit nor roll back (a
                    // full disk) is closed, not handed out again: sqlx would refuse its next
                    // BEGIN as nested, which is no statement's fault.
                    .before_acquire(|conn, _| {
                        let depth = <sqlx::sqlite::SqliteTransactionManager as sqlx::TransactionManager>::get_transaction_depth(conn);
                        Box::pin(async move { Ok(depth == 0) })
                    })
                    .min_connections(0)
                    .connect_with(options)
                    .await
                    .map_err(|e| match is_busy(&e) {
                        true => super::retry::Retry::Again(e),
                        false => super::retry::Retry::Stop(e),
                    })
            }
        })
        .await;
        let pool = match pool {
            Ok(pool) => pool,
            // A ledger on a read-only medium or mount (a copy handed over for reading, a
            // backup): opened read-only, so the commands that only read it (`runs`,
            // `report`, `explain`) work; a write is refused by SQLite.
            Err(e) if cannot_write(&e) && options.get_filename().is_file() => {
                Self::read_only_pool(options.get_filename(), connections)
                    .await
                    .map_err(|_| e)
                    .map_err(|e| Error::store(url, format!("cannot open sqlite database: {e}")))?
            }
            Err(e) => {
                if crate::backend::sqlite::is_not_a_database(&e) {
                    return Err(crate::backend::sqlite::not_a_database(
                        url,
                        options.get_filename(),
                    ));
                }
                let why = folder.unwrap_or_default();
                return Err(Error::store(
                    url,
                    format!("cannot open sqlite database{why}: {e}"),
                ));
            }
        };
        let store = SqliteStore {
            _closer: Arc::new(crate::backend::sqlite::Closer::new(&pool)),
            pool,
            url: url.to_string(),
            events: Arc::default(),
            connections: connections as usize,
        };
        store.migrate().await?;
        Ok(store)
    }

    /// A pool reading `path` without writing anything: read-only connections, and, when the
    /// file has no write-ahead log beside it (nothing committed is outside the main file),
    /// `immutable`, as SQLite cannot make the `-shm` file a WAL reader needs in a folder it
    /// may not write.
    async fn read_only_pool(
        path: &std::path::Path,
        connections: u32,
    ) -> std::result::Result<SqlitePool, sqlx::Error> {
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(path)
            .read_only(true)
            .create_if_missing(false)
            .immutable(!std::path::Path::new(&wal).exists())
            .busy_timeout(crate::backend::sqlite::BUSY_TIMEOUT);
        let pool = SqlitePoolOptions::new()
            .max_connections(connections)
            .min_connections(0)
            .connect_with(options)
            .await?;
        tracing::info!(
            "{}: opened read-only (it cannot be written here)",
            path.display()
        );
        Ok(pool)
    }

    /// The underlying pool (for the SQL processor when the warehouse is the store).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn err(&self, e: sqlx::Error) -> Error {
        let message = e.to_string();
        Error::from_sqlx(&self.url, "a statement", e, message)
    }

    async fn lease_row(&self, processor: &str, scope: &str) -> Result<Option<LeaseRow>> {
        let row: Option<LeaseCols> = sqlx::query_as(statements::READ)
            .bind(processor)
            .bind(scope)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        Ok(row.map(|r| r.0))
    }

    /// The error of a fenced operation on a lease that is no longer held with its token.
    async fn lease_lost(&self, lease: &Lease) -> Result<Error> {
        let row = self.lease_row(&lease.processor, &lease.scope).await?;
        Ok(lease.lost(row.and_then(|r| r.holder)))
    }
}

async fn apply_migrations(conn: &mut SqliteConnection) -> std::result::Result<(), sqlx::Error> {
    let version: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut *conn)
        .await?;
    for migration in migrations::pending(&migrations::SQLITE, version) {
        let statements = crate::backend::prepare(migration.sql, crate::backend::Dialect::Sqlite)
            .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
        for statement in &statements {
            sqlx::query(&statement.sql).execute(&mut *conn).await?;
        }
        // PRAGMA takes no bound parameter; the value is our own constant.
        let pragma = format!("PRAGMA user_version = {}", migration.version);
        sqlx::query(&pragma).execute(&mut *conn).await?;
    }
    Ok(())
}

/// `PRAGMA user_version` records the last migration applied; `BEGIN IMMEDIATE` is the lock.
#[async_trait]
impl Schema for SqliteStore {
    fn migrations(&self) -> &'static [Migration] {
        &migrations::SQLITE
    }

    async fn version(&self) -> Result<i64> {
        sqlx::query_scalar("PRAGMA user_version")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err(e))
    }

    async fn apply(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        // BEGIN IMMEDIATE takes the write lock first, so concurrent first uses of a new
        // file migrate once; the version is read again under the lock.
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .map_err(|e| self.err(e))?;
        let result = apply_migrations(&mut conn).await;
        match result {
            Ok(()) => {
                sqlx::query("COMMIT")
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| self.err(e))?;
                Ok(())
            }
            Err(e) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                Err(Error::store(&self.url, format!("migration failed: {e}")))
            }
        }
    }
}

#[async_trait]
impl StoreBase for SqliteStore {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    fn location(&self) -> String {
        self.url.clone()
    }

    /// Pending marks are confirmed; event batches run one per pooled connection (two for
    /// an event gate): one batch binds its statements, or reads its keys, while the other
    /// writes (writers take turns in the order they asked).
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            confirms_pending: true,
            batch_concurrency: self.connections,
            ..Capabilities::SHARED
        }
    }

    async fn migrate(&self) -> Result<()> {
        migrations::run(self).await
    }
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim> {
        let now = micros(request.now);
        let expires_at = lease_expiry(now, request.ttl);
        upsert_claim(
            &self.url,
            request,
            now,
            expires_at,
            || async {
                sqlx::query_scalar(
                    "INSERT INTO processing_leases \
               (processor_name, scope, holder_run_id, token, acquired_at, expires_at) \
             VALUES (?1, ?2, ?3, 1, ?4, ?5) \
             ON CONFLICT (processor_name, scope) DO UPDATE SET \
               holder_run_id = excluded.holder_run_id, \
               token = processing_leases.token + 1, \
               acquired_at = excluded.acquired_at, \
               expires_at = excluded.expires_at \
             WHERE processing_leases.holder_run_id IS NULL \
                OR processing_leases.expires_at <= excluded.acquired_at \
             RETURNING token",
                )
                .bind(request.processor)
                .bind(request.scope)
                .bind(request.run_id)
                .bind(ts(now))
                .bind(ts(expires_at))
                // Stepped to the end, not stopped at the returned row: the statement commits
                // when it finishes, and a commit that fails (a full disk) must fail the
                // claim. A row read before that is not a claim anyone else will see.
                .fetch_all(&self.pool)
                .await
                .map(|tokens: Vec<i64>| tokens.into_iter().next())
                .map_err(|e| self.err(e))
            },
            || self.lease_row(request.processor, request.scope),
        )
        .await
    }

    async fn lease_holder(
        &self,
        processor: &str,
        scope: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<LeaseHolder>> {
        let row = self.lease_row(processor, scope).await?;
        Ok(row.and_then(|r| r.held_at(now)))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration, now: DateTime<Utc>) -> Result<Lease> {
        let expires_at = lease_expiry(now, ttl);
        let done = statements::update(statements::RENEW, ts(expires_at), lease)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        if done.rows_affected() == 1 {
            return Ok(Lease {
                expires_at,
                ..lease.clone()
            });
        }
        Err(self.lease_lost(lease).await?)
    }

    async fn release(&self, lease: &Lease, now: DateTime<Utc>) -> Result<bool> {
        let done = statements::update(statements::RELEASE, ts(micros(now)), lease)
            .execute(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        Ok(done.rows_affected() == 1)
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
impl LedgerStore for SqliteStore {
    async fn find_keys(&self, lookups: &[KeyLookup]) -> Result<Vec<Option<KeyRecord>>> {
        let mut out = Vec::with_capacity(lookups.len());
        for l in lookups {
            let row: Option<Key> = sqlx::query_as(&format!(
                "SELECT {KEY_COLUMNS} FROM processing_keys \
                 WHERE processing_key = ?1 AND kind = ?2 AND processed_at >= ?3 \
                 ORDER BY processed_at DESC, id DESC LIMIT 1"
            ))
            .bind(&l.key)
            .bind(l.kind.as_str())
            .bind(ts(l.since))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
            out.push(row.map(|r| r.0));
        }
        Ok(out)
    }

    async fn finish(&self, finish: &Finish) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(|e| self.err(e))?;
        if let Some(lease) = &finish.lease {
            let done = statements::update(
                statements::RELEASE,
                ts(micros(finish.run.finished_at)),
                lease,
            )
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
            if done.rows_affected() != 1 {
                tx.rollback().await.map_err(|e| self.err(e))?;
                return Err(self.lease_lost(lease).await?);
            }
        }
        let run = &finish.run;
        sqlx::query(&format!(
            "INSERT INTO processing_runs ({RUN_COLUMNS}) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
        ))
        .bind(&run.run_id)
        .bind(&run.processor)
        .bind(&run.scope)
        .bind(time::day_text(run.scope_date))
        .bind(run.trigger.as_str())
        .bind(run.mode.as_str())
        .bind(ts(run.started_at))
        .bind(ts(run.finished_at))
        .bind(run.duration_ms)
        .bind(run.status.as_str())
        .bind(run.skip_reason.as_ref().map(|r| r.as_str().to_string()))
        .bind(
            run.would_skip_reason
                .as_ref()
                .map(|r| r.as_str().to_string()),
        )
        .bind(&run.previous_run_id)
        .bind(run.records_processed)
        .bind(&run.processing_key)
        .bind(&run.error)
        .bind(run.output.as_ref().map(|v| v.to_string()))
        .execute(&mut *tx)
        .await
        .map_err(|e| statements::run_insert_error(&self.url, &run.run_id, e, |e| self.err(e)))?;
        if run.status == RunStatus::Completed {
            for k in &finish.keys {
                sqlx::query(&format!(
                    "INSERT INTO processing_keys ({KEY_COLUMNS}) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
                ))
                .bind(&k.key)
                .bind(k.kind.as_str())
                .bind(&k.processor)
                .bind(&k.scope)
                .bind(time::day_text(k.scope_date))
                .bind(ts(k.processed_at))
                .bind(k.entity_count)
                .bind(k.metadata.to_string())
                .bind(&k.run_id)
                .execute(&mut *tx)
                .await
                .map_err(|e| self.err(e))?;
            }
        }
        tx.commit().await.map_err(|e| self.err(e))
    }

    async fn runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>> {
        // Optional filters as `(?n IS NULL OR col = ?n)`: one fixed statement, every value
        // bound. A run id given is a plain `run_id = ?8`, so the primary key finds the row
        // (the optional form scans the job's runs: a Python skip reads its earlier run).
        let by_id = if filter.run_id.is_some() {
            "run_id = ?8"
        } else {
            "?8 IS NULL"
        };
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM processing_runs \
             WHERE (?1 IS NULL OR processor_name = ?1) AND (?2 IS NULL OR scope = ?2) \
               AND (?3 IS NULL OR status = ?3) AND (?4 IS NULL OR started_at >= ?4) \
               AND (?6 IS NULL OR trigger_source = ?6) \
               AND (?7 IS NULL OR skip_reason IS NULL OR skip_reason <> ?7) \
               AND {by_id} \
             ORDER BY started_at DESC, run_id DESC LIMIT ?5"
        );
        let rows: Vec<Run> = sqlx::query_as(&sql)
            .bind(&filter.processor)
            .bind(&filter.scope)
            .bind(filter.status.map(|s| s.as_str()))
            .bind(filter.since.map(ts))
            .bind(if filter.limit == 0 {
                -1
            } else {
                filter.limit as i64
            })
            .bind(filter.trigger.map(|t| t.as_str()))
            .bind(
                filter
                    .except_skip_reason
                    .as_ref()
                    .map(|r| r.as_str().to_string()),
            )
            .bind(&filter.run_id)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        Ok(rows.into_iter().map(|r| r.0).collect())
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
impl MaintenanceStore for SqliteStore {
    async fn purge(&self, processor: &str, scope: Option<&str>) -> Result<u64> {
        let done = sqlx::query(
            "DELETE FROM processing_keys WHERE processor_name = ?1 AND (?2 IS NULL OR scope = ?2)",
        )
        .bind(processor)
        .bind(scope)
        .execute(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }

    async fn cleanup(&self, policy: &CleanupPolicy) -> Result<CleanupReport> {
        // ?1 the table's cut-off, ?2 the processor (or NULL = all), ?3 the keys' cut-off
        // (a ledger row a kept key points at stays: a NOT IN over the kept keys' run
        // ids, evaluated once per statement rather than once per row), ?4 the batch size.
        const CONDITIONS: [&str; 4] = [
            "processed_at < ?1 AND (?2 IS NULL OR processor_name = ?2) AND ?3 IS NOT NULL",
            "started_at < ?1 AND (?2 IS NULL OR processor_name = ?2) AND run_id NOT IN \
                 (SELECT run_id FROM processing_keys WHERE processed_at >= ?3)",
            "expires_at < ?1 AND (?2 IS NULL OR processor_name = ?2) AND ?3 IS NOT NULL",
            "expires_at IS NOT NULL AND expires_at < ?1 AND ?2 IS NULL AND ?3 IS NOT NULL",
        ];
        cleanup_tables(
            policy,
            true,
            |i, cutoff| async move {
                let sql = format!(
                    "SELECT count(*) FROM {} WHERE {}",
                    CLEANUP_TABLES[i], CONDITIONS[i]
                );
                let n: i64 = statements::cleanup(&sql, ts(cutoff), policy.processor.as_deref(), ts(policy.keys_before))
                    .fetch_one(&self.pool)
                    .await
                    .and_then(|row| row.try_get(0))
                    .map_err(|e| self.err(e))?;
                Ok(n as u64)
            },
            // One bounded batch per statement, each its own transaction.
            |i, cutoff| async move {
                let (table, condition) = (CLEANUP_TABLES[i], CONDITIONS[i]);
                let sql = format!(
                    "DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {condition} LIMIT ?4)"
                );
                Ok(statements::cleanup(&sql, ts(cutoff), policy.processor.as_deref(), ts(policy.keys_before))
                    .bind(policy.limit())
                    .execute(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?
                    .rows_affected())
            },
        )
        .await
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

/// Rows a statement of the batch marks or reads at most: its bound parameters (4 a row
/// marked) stay far below SQLite's limit (32,766), a batch of the gate's default size is
/// one statement, and the few statement shapes (one per chunk size) stay in sqlx's
/// statement cache.
const EVENT_CHUNK: usize = 1000;

/// `INSERT` marking `n` keys: namespace and `now` once, then four anonymous parameters a
/// row (key, fingerprint, decision, expiry), then `now` once more: a key found absent is
/// inserted, one that expired by `now` is taken over. A key stored and unexpired is left
/// alone (the upsert's WHERE) or, `all_or_nothing`, fails the whole statement: its
/// `event_key` would be set to NULL, which the column's NOT NULL refuses, and SQLite
/// undoes everything the statement did ([`refused`]). `WHERE true` tells SQLite's parser
/// that `ON` starts the upsert, not a join. Bound values, not a JSON array: SQLite's JSON
/// functions parsing the batch back were a third of the worker's time; and not six a row:
/// each bound text is copied twice on its way to SQLite. Anonymous `?`, not `?NNN`: sqlx
/// looks up each numbered parameter's name, which SQLite finds by a linear scan
/// (quadratic in the batch).
fn events_mark_sql(n: usize, all_or_nothing: bool) -> String {
    let mut sql = String::from(
        "INSERT INTO event_keys (namespace, event_key, first_seen, fingerprint, decision, expires_at) \
         SELECT ?, column1, ?, column2, column3, column4 FROM (VALUES ",
    );
    for i in 0..n {
        sql.push_str(if i > 0 { ",(?,?,?,?)" } else { "(?,?,?,?)" });
    }
    sql.push_str(
        ") WHERE true ON CONFLICT (namespace, event_key) DO UPDATE SET \
         first_seen = excluded.first_seen, fingerprint = excluded.fingerprint, \
         decision = excluded.decision, expires_at = excluded.expires_at",
    );
    sql.push_str(match all_or_nothing {
        true => {
            ", event_key = CASE WHEN event_keys.expires_at IS NOT NULL \
             AND event_keys.expires_at <= ? THEN event_keys.event_key END"
        }
        false => " WHERE event_keys.expires_at IS NOT NULL AND event_keys.expires_at <= ?",
    });
    sql
}

/// Whether `e` is an all-or-nothing insert ([`events_mark_sql`]) refusing a batch because
/// one of its keys is stored and unexpired.
fn refused(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.kind() == sqlx::error::ErrorKind::NotNullViolation)
}

/// The statements marking `n` keys, one per chunk of [`EVENT_CHUNK`].
fn mark_sqls(n: usize, all_or_nothing: bool) -> Vec<String> {
    (0..n)
        .step_by(EVENT_CHUNK)
        .map(|start| events_mark_sql((n - start).min(EVENT_CHUNK), all_or_nothing))
        .collect()
}

/// The statements reading `n` keys, one per chunk of [`EVENT_CHUNK`].
fn read_sqls(n: usize) -> Vec<String> {
    (0..n)
        .step_by(EVENT_CHUNK)
        .map(|start| events_read_batch_sql((n - start).min(EVENT_CHUNK)))
        .collect()
}

/// A bound [`events_read_batch_sql`].
type ReadQuery<'q> =
    sqlx::query::QueryScalar<'q, sqlx::Sqlite, String, sqlx::sqlite::SqliteArguments<'q>>;

/// `sqls` ([`read_sqls`] of `marks.len()`) bound to the keys of `marks` of `namespace` at
/// `now`.
fn read_queries<'q>(
    sqls: &'q [String],
    marks: &[&'q EventMark],
    namespace: &'q str,
    now: DateTime<Utc>,
) -> Vec<ReadQuery<'q>> {
    sqls.iter()
        .zip(marks.chunks(EVENT_CHUNK))
        .map(|(sql, chunk)| {
            let query = sqlx::query_scalar(sql).bind(namespace).bind(ts(now));
            chunk.iter().fold(query, |q, m| q.bind(m.key.as_str()))
        })
        .collect()
}

/// `sqls` ([`mark_sqls`] of `marks.len()`) bound to `marks` of `namespace` at `now`.
fn mark_queries<'q>(
    sqls: &'q [String],
    marks: &[&'q EventMark],
    namespace: &'q str,
    now: DateTime<Utc>,
) -> Vec<sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>> {
    sqls.iter()
        .zip(marks.chunks(EVENT_CHUNK))
        .map(|(sql, chunk)| {
            let query = sqlx::query(sql).bind(namespace).bind(ts(now));
            chunk
                .iter()
                .fold(query, |query, m| {
                    query
                        .bind(m.key.as_str())
                        .bind(m.fingerprint.as_deref())
                        .bind(event_keys::decision_text(m))
                        .bind(m.expires_at(now).map(ts))
                })
                .bind(ts(now))
        })
        .collect()
}

/// The unexpired rows of namespace `?` at `?` of `n` keys (`?`…), as one JSON array of
/// [key, fingerprint, decision, first_seen] (`[]` when none): one row back, not one per
/// key (sqlx passes each row from its SQLite worker thread as a message).
fn events_read_batch_sql(n: usize) -> String {
    let mut sql = String::from(
        "SELECT json_group_array(json_array(event_key, fingerprint, decision, first_seen)) \
         FROM event_keys WHERE namespace = ? AND (expires_at IS NULL OR expires_at > ?) \
         AND event_key IN (",
    );
    for i in 0..n {
        sql.push_str(if i > 0 { ",?" } else { "?" });
    }
    sql.push(')');
    sql
}

/// The unexpired rows of the keys in the JSON array ?2.
const EVENTS_READ_SQL: &str = "\
SELECT event_key, fingerprint, decision, first_seen FROM event_keys
WHERE namespace = ?1 AND event_key IN (SELECT value FROM json_each(?2))
  AND (expires_at IS NULL OR expires_at > ?3)";

/// The unexpired rows of `keys`.
async fn read_events(
    conn: &mut SqliteConnection,
    namespace: &str,
    keys: &[impl serde::Serialize],
    now: DateTime<Utc>,
) -> std::result::Result<Vec<(String, Option<String>, Option<String>, i64)>, sqlx::Error> {
    sqlx::query_as(EVENTS_READ_SQL)
        .bind(namespace)
        .bind(serde_json::to_string(keys).unwrap_or_default())
        .bind(ts(now))
        .fetch_all(conn)
        .await
}

/// Moves cursor (?1, ?2) to position ?3 (value ?4, at ?5) when ?3 is after it.
const CURSOR_ADVANCE_SQL: &str = "\
INSERT INTO event_cursors (namespace, name, position, value, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5)
ON CONFLICT (namespace, name) DO UPDATE SET
  position = excluded.position, value = excluded.value, updated_at = excluded.updated_at
WHERE event_cursors.position < excluded.position";

impl SqliteStore {
    async fn advance_in(
        &self,
        conn: &mut SqliteConnection,
        namespace: &str,
        name: &str,
        to: &Cursor,
    ) -> Result<()> {
        sqlx::query(CURSOR_ADVANCE_SQL)
            .bind(namespace)
            .bind(name)
            .bind(&to.position)
            .bind(to.value_text())
            .bind(ts(Utc::now()))
            .execute(conn)
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The stored, unexpired rows `queries` ([`read_queries`]) read on `conn`, added to
    /// `found`; returns their keys.
    async fn read_stored<'q>(
        &self,
        conn: &mut SqliteConnection,
        queries: Vec<ReadQuery<'q>>,
        found: &mut Found,
    ) -> Result<HashSet<String>> {
        let mut present = HashSet::new();
        for query in queries {
            let stored: String = query.fetch_one(&mut *conn).await.map_err(|e| self.err(e))?;
            let rows: Vec<(String, Option<String>, Option<String>, i64)> =
                serde_json::from_str(&stored).map_err(|e| {
                    Error::store(self.location(), format!("reading event keys back: {e}"))
                })?;
            for (key, fingerprint, decision, first_seen) in rows {
                let first_seen = DateTime::from_timestamp_micros(first_seen).unwrap_or_default();
                present.insert(key.clone());
                found.stored(key, fingerprint, decision, first_seen);
            }
        }
        Ok(present)
    }

    /// `check_and_mark`, and the cursor's advance in the same transaction.
    ///
    /// Without a cursor, a batch after one that found none of its keys stored is tried as
    /// one all-or-nothing insert of every key. Any other batch, or one that insert refused,
    /// reads its keys first, outside the write lock (a batch of replays writes nothing),
    /// then marks the absent ones in one write transaction that reads them again. Writers
    /// of this store take turns ([`EventWriter`]) and hold no connection while they wait
    /// for their turn, so turns and the pool never wait on each other.
    async fn mark_batch(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        cursor: Option<(&str, &Cursor)>,
    ) -> Result<Vec<EventVerdict>> {
        if marks.is_empty() {
            if let Some((name, to)) = cursor {
                let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
                self.advance_in(&mut conn, namespace, name, to).await?;
            }
            return Ok(Vec::new());
        }
        let firsts = event_keys::firsts(marks);
        if cursor.is_none() && self.events.fresh.load(Ordering::Relaxed) {
            // Bound before this batch's turn, so it binds while the batch before it writes.
            let sqls = mark_sqls(firsts.len(), true);
            let queries = mark_queries(&sqls, &firsts, namespace, now);
            let turn = self.events.turn.lock().await;
            let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
            let tried = async {
                if let [_] = queries.as_slice() {
                    // One statement is atomic alone: no BEGIN, no COMMIT.
                    for query in queries {
                        query.execute(&mut *conn).await?;
                    }
                    return Ok(());
                }
                let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
                for query in queries {
                    query.execute(&mut *tx).await?;
                }
                tx.commit().await
            }
            .await;
            drop(conn);
            drop(turn);
            match tried {
                Ok(()) => return Ok(event_keys::all_new(marks, &firsts, now)),
                // Some key is stored: nothing was written; the general way below.
                Err(e) if refused(&e) => self.events.fresh.store(false, Ordering::Relaxed),
                Err(e) => return Err(self.err(e)),
            }
        }
        let first_sqls = read_sqls(firsts.len());
        let mut found = Found::default();
        let present = {
            let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
            let reads = read_queries(&first_sqls, &firsts, namespace, now);
            self.read_stored(&mut conn, reads, &mut found).await?
        };
        let absent: Vec<&EventMark> = firsts
            .iter()
            .copied()
            .filter(|m| !present.contains(m.key.as_str()))
            .collect();
        if absent.is_empty() && cursor.is_none() {
            self.events.fresh.store(false, Ordering::Relaxed);
            return Ok(found.verdicts(marks, now));
        }
        // One write transaction (BEGIN IMMEDIATE: the write lock at once, waiting under the
        // busy timeout): read the absent keys again, then mark those still absent (or
        // expired: the upsert's WHERE). Under the lock nothing changes in between. One row
        // back per read, not one per key: sqlx passes each row from its SQLite worker
        // thread as a message, which dominated large batches.
        let again_sqls = read_sqls(absent.len());
        let again = read_queries(&again_sqls, &absent, namespace, now);
        let turn = self.events.turn.lock().await;
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.err(e))?;
        let present_now = self.read_stored(&mut tx, again, &mut found).await?;
        let batch: Vec<&EventMark> = absent
            .into_iter()
            .filter(|m| !present_now.contains(m.key.as_str()))
            .collect();
        let sqls = mark_sqls(batch.len(), false);
        for query in mark_queries(&sqls, &batch, namespace, now) {
            query.execute(&mut *tx).await.map_err(|e| self.err(e))?;
        }
        if let Some((name, to)) = cursor {
            self.advance_in(&mut tx, namespace, name, to).await?;
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        drop(conn);
        drop(turn);
        let none_stored = present.is_empty() && present_now.is_empty();
        self.events.fresh.store(none_stored, Ordering::Relaxed);
        if none_stored {
            return Ok(event_keys::all_new(marks, &firsts, now));
        }
        for m in batch {
            found.marked(m.key.clone());
        }
        Ok(found.verdicts(marks, now))
    }
}

#[async_trait]
impl EventKeyStore for SqliteStore {
    async fn check_and_mark(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
    ) -> Result<Vec<EventVerdict>> {
        self.mark_batch(namespace, marks, now, None).await
    }

    async fn check_and_mark_advancing(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        cursor: &str,
        to: &Cursor,
    ) -> Result<Vec<EventVerdict>> {
        self.mark_batch(namespace, marks, now, Some((cursor, to)))
            .await
    }

    async fn forget_event_keys(&self, namespace: &str, keys: &[String]) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(
            "DELETE FROM event_keys WHERE namespace = ?1 \
             AND event_key IN (SELECT value FROM json_each(?2))",
        )
        .bind(namespace)
        .bind(serde_json::to_string(keys).unwrap_or_default())
        .execute(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
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
        // One statement per distinct expiry (a gate's keys share one, or a few per event
        // type), the keys as a JSON array; in one write transaction.
        let mut groups: Vec<(Option<DateTime<Utc>>, Vec<&str>)> = Vec::new();
        for (key, at) in keys {
            match groups.iter_mut().find(|(g, _)| g == at) {
                Some((_, ks)) => ks.push(key),
                None => groups.push((*at, vec![key])),
            }
        }
        let turn = self.events.turn.lock().await;
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.err(e))?;
        let mut done = 0;
        for (at, ks) in groups {
            done += sqlx::query(
                "UPDATE event_keys SET decision = NULL, expires_at = ?3 \
                 WHERE namespace = ?1 AND decision = ?4 \
                 AND event_key IN (SELECT value FROM json_each(?2))",
            )
            .bind(namespace)
            .bind(serde_json::to_string(&ks).unwrap_or_default())
            .bind(at.map(ts))
            .bind(owner)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?
            .rows_affected();
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        drop(conn);
        drop(turn);
        Ok(done)
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
        let done = sqlx::query(
            "DELETE FROM event_keys WHERE namespace = ?1 AND first_seen = ?3 \
             AND event_key IN (SELECT value FROM json_each(?2))",
        )
        .bind(namespace)
        .bind(serde_json::to_string(keys).unwrap_or_default())
        .bind(ts(first_seen))
        .execute(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }

    async fn cursor(&self, namespace: &str, name: &str) -> Result<Option<Cursor>> {
        let row: Option<(String, String)> = sqlx::query_as(
            "SELECT position, value FROM event_cursors WHERE namespace = ?1 AND name = ?2",
        )
        .bind(namespace)
        .bind(name)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(row.map(|(position, value)| Cursor::from_stored(position, &value)))
    }

    async fn advance_cursor(&self, namespace: &str, name: &str, to: &Cursor) -> Result<()> {
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        self.advance_in(&mut conn, namespace, name, to).await
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
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        let rows = read_events(&mut conn, namespace, keys, now)
            .await
            .map_err(|e| self.err(e))?;
        Ok(event_keys::present(keys, rows.into_iter().map(|r| r.0)))
    }

    async fn record_decision(
        &self,
        namespace: &str,
        key: &str,
        decision: &serde_json::Value,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE event_keys SET decision = ?3 WHERE namespace = ?1 AND event_key = ?2",
        )
        .bind(namespace)
        .bind(key)
        .bind(decision.to_string())
        .execute(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected() > 0)
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
}

/// SQLITE_BUSY or SQLITE_LOCKED (any extended code): another connection holds the lock.
/// Whether SQLite could not open a file for writing (`SQLITE_CANTOPEN`, `SQLITE_READONLY`,
/// `SQLITE_PERM`): a read-only file, folder or mount.
fn cannot_write(e: &sqlx::Error) -> bool {
    let code = match e {
        sqlx::Error::Database(d) => d.code().and_then(|c| c.parse::<i32>().ok()),
        _ => None,
    };
    matches!(code.map(|c| c & 0xff), Some(3 | 8 | 14))
}

fn is_busy(e: &sqlx::Error) -> bool {
    let code = match e {
        sqlx::Error::Database(d) => d.code().and_then(|c| c.parse::<i32>().ok()),
        _ => None,
    };
    matches!(code.map(|c| c & 0xff), Some(5 | 6))
}
