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
use super::rows::{KeyRow, LeaseColumns, LeaseRow, OpenLeaseRow, RunRow, KEY_COLUMNS, RUN_COLUMNS};
use super::{
    lease_expiry, BatchTurn, Capabilities, Claim, ClaimRequest, CleanupPolicy, CleanupReport,
    EventKeyStore, EventMark, EventVerdict, Finish, KeyLookup, Lease, LeaseHolder, LeaseStore,
    LedgerStore, MaintenanceStore, OpenLease, PendingBatch, RunFilter, StoreBase,
};
use crate::error::{Error, Result};
use crate::model::{micros, time, KeyRecord, RunRecord, RunStatus};

mod event_sql;
mod events;
mod maintenance;
mod runs;
mod writer;

use writer::EventWriter;

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

    /// The schema version the file at `url` records (`PRAGMA user_version`), read without
    /// creating, migrating or writing anything: 0 when the file does not exist yet (`idem
    /// migrate --check`).
    pub(crate) async fn recorded_version(url: &str) -> Result<i64> {
        let (driver_url, _) = crate::backend::take_max_connections(url)
            .map_err(|e| Error::config(format!("{url}: {e}")))?;
        let options = crate::backend::sqlite::connect_options(&driver_url)?;
        let path = options.get_filename();
        if !path.exists() {
            return Ok(0);
        }
        crate::backend::sqlite::check_database_file(url, path)?;
        let pool = Self::read_only_pool(path, 1)
            .await
            .map_err(|e| Error::store(url, format!("cannot read sqlite database: {e}")))?;
        let version = sqlx::query_scalar("PRAGMA user_version")
            .fetch_one(&pool)
            .await
            .map_err(|e| Error::store(url, format!("cannot read the schema version: {e}")));
        pool.close().await;
        version
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
            marks_ahead: true,
            ..Capabilities::SHARED
        }
    }

    async fn migrate(&self) -> Result<()> {
        migrations::run(self).await
    }
}

/// Whether SQLite could not open a file for writing (`SQLITE_CANTOPEN`, `SQLITE_READONLY`,
/// `SQLITE_PERM`): a read-only file, folder or mount.
fn cannot_write(e: &sqlx::Error) -> bool {
    let code = match e {
        sqlx::Error::Database(d) => d.code().and_then(|c| c.parse::<i32>().ok()),
        _ => None,
    };
    matches!(code.map(|c| c & 0xff), Some(3 | 8 | 14))
}

/// SQLITE_BUSY or SQLITE_LOCKED (any extended code): another connection holds the lock.
fn is_busy(e: &sqlx::Error) -> bool {
    let code = match e {
        sqlx::Error::Database(d) => d.code().and_then(|c| c.parse::<i32>().ok()),
        _ => None,
    };
    matches!(code.map(|c| c & 0xff), Some(5 | 6))
}
