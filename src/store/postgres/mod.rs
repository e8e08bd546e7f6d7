//! The Postgres store (sqlx).
//!
//! # Store
//!
//! `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE` (or `postgresql://…`). The schema
//! (`sql/migrations/postgres/`) is applied on first use and by `idem migrate`: when the database is
//! already migrated that costs one cheap query (`SELECT max(version) FROM
//! idem_schema_migrations`); otherwise the migrations run in one transaction under
//! `pg_advisory_xact_lock`, so several processes starting at once on a fresh database
//! migrate it exactly once.
//!
//! Concurrency: a claim is one `INSERT … ON CONFLICT (processor_name, scope) DO UPDATE …
//! WHERE <free or expired> RETURNING token` statement. Postgres runs it atomically per row
//! (a concurrent claimer waits for the row lock and re-checks the condition against the
//! committed row), so exactly one claimer wins across connections, pools and processes.
//! Renew, release and finish are fenced by the lease's token; `finish` writes the lease
//! release, the ledger row and (only for completed runs) the keys in one transaction.
//! Lease times are the clocks of the idem processes (`now` is passed in), as with every
//! store: keep the hosts that share a store NTP-synchronised.
//!
//! Connections: a small pool (4 connections) with a 5 s acquire timeout, so an
//! unreachable server fails fast with [`Error::StoreUnavailable`] (exit code 3 under the
//! `strict` policy) instead of hanging.
//!
//! TLS: sqlx's rustls, as the URL says (`sslmode=require|verify-ca|verify-full`,
//! `sslrootcert`, client certificates; see docs/postgres.md and `backend/postgres.rs`).
//!

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use serde_json::Value;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{Arguments, Connection, Executor, FromRow, Row};

use super::common::{cleanup_tables, statements, upsert_claim, CLEANUP_TABLES};
use super::event_keys::{self, Cursor, Found};
use super::migrations::{self, Migration, Schema};
use super::rows::{KeyRow, LeaseColumns, LeaseRow, OpenLeaseRow, RunRow, KEY_COLUMNS, RUN_COLUMNS};
use super::{
    lease_expiry, redact_url, BatchTurn, Capabilities, Claim, ClaimRequest, CleanupPolicy,
    CleanupReport, EventKeyStore, EventMark, EventVerdict, Finish, KeyLookup, Lease, LeaseHolder,
    LeaseStore, LedgerStore, MaintenanceStore, OpenLease, PendingBatch, RunFilter, StoreBase,
};
use crate::backend::postgres::{connect_options, sqlx_message};
use crate::error::{Error, Result};
use crate::model::{micros, KeyRecord, RunRecord, RunStatus};

mod event_sql;
mod events;
mod maintenance;
mod riders;
mod runs;

use event_sql::*;

/// The statements that read stored event keys with their unconfirmed batches, by name:
/// each takes the namespace ($1), the keys (`text[]`, $2) and the time now ($3). Public so
/// that tests can `EXPLAIN` them (their plans must not depend on the statistics of the
/// small `event_pending` table: tests/it/postgres.rs).
#[doc(hidden)]
pub const EVENT_KEY_READS: [(&str, &str); 2] =
    [("lookup", EVENTS_LOOKUP_SQL), ("read", EVENTS_READ_SQL)];

/// The statements that mark a batch of event keys, by name: each takes the namespace ($1),
/// the keys, fingerprints, decisions and expiries (arrays, $2–$5), the time now ($6), and
/// a pending batch's marker and deadline ($7, $8). Public so that tests can `EXPLAIN`
/// them (the work of one must grow with its keys, not with their square:
/// tests/it/postgres.rs).
#[doc(hidden)]
pub const EVENT_KEY_MARKS: [(&str, &str); 2] =
    [("insert", EVENTS_INSERT_SQL), ("mark", EVENTS_MARK_SQL)];

/// Advisory lock key taken while migrating (`idem` in ASCII, then `mig`).
const MIGRATION_LOCK: i64 = 0x6964_656d_006d_6967;

/// A pooled connection idle at least this long is pinged before use.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// How long a caller waits for a connection while the server refuses new ones for now (its
/// connection limit reached, or starting up), beyond the pool's acquire timeout.
const FULL_WAIT: Duration = Duration::from_secs(60);

/// Postgres `undefined_table`.
const UNDEFINED_TABLE: &str = "42P01";

/// The Postgres store.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// One permit per pooled connection: this process's statements take turns here, in
    /// the order they asked and without a deadline, before they ask the pool (whose acquire
    /// timeout then means what it says: no connection could be made). Many runs sharing a
    /// small pool (a scheduler's 1,000 jobs on 4 connections) wait their turn instead of
    /// failing as if the server were down.
    turns: Arc<tokio::sync::Semaphore>,
    /// What stands between idem and the server.
    pooler: Pooler,
    /// The pool's size: how many event batches go side by side.
    connections: usize,
    options: PgConnectOptions,
    /// How long a statement waits for a connection (the URL's `connect_timeout`).
    connect_timeout: Duration,
    /// The URL without its password.
    url: crate::backend::RedactedUrl,
    /// What the last batch of event keys found ([`BatchShape`]): which statement the next
    /// one tries first. Shared by the clones, so by the batches in flight.
    last_batch: Arc<AtomicU8>,
    /// Whole-batch confirmations waiting to ride in a pending batch's transaction
    /// (`riders`), shared by the clones.
    riders: Arc<riders::RideQueue>,
}

/// By hand: the pool and the connect options hold the password; the URL is redacted.
impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.url)
            .field("connections", &self.connections)
            .finish_non_exhaustive()
    }
}

/// What a batch of event keys found, as [`PostgresStore::mark_batch`] remembers it for the
/// next: every key absent (a fresh run of a stream: try a plain `INSERT` first), every key
/// stored and unexpired (a replay: try a read first), or anything else (the one statement
/// that does both).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(u8)]
enum BatchShape {
    Fresh = 0,
    Seen = 1,
    Mixed = 2,
}

impl BatchShape {
    fn of(found: usize, keys: usize) -> Self {
        match found {
            0 => BatchShape::Fresh,
            n if n == keys => BatchShape::Seen,
            _ => BatchShape::Mixed,
        }
    }

    fn load(cell: &AtomicU8) -> Self {
        match cell.load(Ordering::Relaxed) {
            0 => BatchShape::Fresh,
            1 => BatchShape::Seen,
            _ => BatchShape::Mixed,
        }
    }
}

impl PostgresStore {
    /// Opens `postgres://…` and migrates the schema (one cheap query when it is current),
    /// with one connection unless the URL says `?max_connections=N`.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_sized(url, crate::backend::PoolSize::ONE_RUN.postgres).await
    }

    /// [`PostgresStore::connect`] with `connections` in the pool when the URL does not say.
    pub async fn connect_sized(url: &str, connections: u32) -> Result<Self> {
        let store = Self::connect_lazy_sized(url, connections)?;
        store.migrate().await?;
        Ok(store)
    }

    /// A store whose pool connects on first use; nothing is migrated or checked.
    pub fn connect_lazy(url: &str) -> Result<Self> {
        Self::connect_lazy_sized(url, crate::backend::PoolSize::ONE_RUN.postgres)
    }

    /// [`PostgresStore::connect_lazy`] with `connections` in the pool when the URL does not
    /// say.
    pub fn connect_lazy_sized(url: &str, connections: u32) -> Result<Self> {
        let (driver_url, size) = crate::backend::take_max_connections(url)
            .map_err(|e| Error::config(format!("{}: {e}", redact_url(url))))?;
        let connections = size.unwrap_or(connections).max(1);
        let (driver_url, pooler) = Pooler::take(&driver_url)
            .map_err(|e| Error::config(format!("{}: {e}", redact_url(url))))?;
        let (mut options, connect_timeout) = connect_options(&driver_url)?;
        if pooler == Pooler::Transaction {
            // No statement cache: a cached statement would be looked for on whichever
            // server connection the pooler hands out next.
            options = options.statement_cache_capacity(0);
        }
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .min_connections(0)
            .acquire_timeout(connect_timeout)
            .idle_timeout(Duration::from_secs(120))
            // A connection used within the last second is live: no ping, so a busy caller
            // (batches of event keys) pays one round trip per call. One idle for longer
            // (say, across a long processing step) is pinged first, so a dropped
            // connection costs a reconnect rather than a failed call.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for < PING_AFTER_IDLE {
                        return Ok(true);
                    }
                    Ok(conn.ping().await.is_ok())
                })
            })
            .connect_lazy_with(options.clone());
        Ok(PostgresStore {
            pool,
            turns: Arc::new(tokio::sync::Semaphore::new(connections as usize)),
            pooler,
            connections: connections as usize,
            options,
            connect_timeout,
            url: crate::backend::RedactedUrl::new(url),
            last_batch: Arc::new(AtomicU8::new(BatchShape::Fresh as u8)),
            riders: Arc::default(),
        })
    }

    /// The underlying pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A pooled connection, once it is this caller's turn (see `turns`).
    async fn turn(&self) -> std::result::Result<Turn, NoTurn> {
        let turn = self
            .turns
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        let asked = std::time::Instant::now();
        loop {
            match self.pool.acquire().await {
                Ok(conn) => {
                    return Ok(Turn {
                        _turn: turn,
                        conn,
                        pinned: self.pooler == Pooler::Transaction,
                    })
                }
                // A server at its connection limit ("too many clients") refuses for now,
                // not for good: connections free up as other clients finish. The pool has
                // tried for its acquire timeout; this caller waits on, up to FULL_WAIT.
                // Anything else the attempt found is the answer (no second attempt to
                // say why: a server that does not answer is waited for once).
                Err(sqlx::Error::PoolTimedOut) if asked.elapsed() < FULL_WAIT => {
                    match self.probe().await {
                        Probe::Room | Probe::Full(_) => {}
                        found => return Err(NoTurn::Probed(found)),
                    }
                }
                Err(e) => return Err(NoTurn::Pool(e)),
            }
        }
    }

    /// One direct connection attempt, bounded by the connect timeout (at most 2 s), after
    /// the pool gave up.
    async fn probe(&self) -> Probe {
        let attempt = tokio::time::timeout(
            self.connect_timeout.min(Duration::from_secs(2)),
            PgConnection::connect_with(&self.options),
        )
        .await;
        match attempt {
            Ok(Ok(conn)) => {
                // Room again: the pool's next try gets in.
                let _ = conn.close().await;
                Probe::Room
            }
            Ok(Err(sqlx::Error::Database(db)))
                if matches!(db.code().as_deref(), Some("53300" | "57P03")) =>
            {
                Probe::Full(sqlx::Error::Database(db))
            }
            Ok(Err(cause)) => Probe::Refused(cause),
            Err(_) => Probe::Silent,
        }
    }

    /// [`PostgresStore::turn`], a failure said as the store's error.
    async fn conn(&self) -> Result<Turn> {
        match self.turn().await {
            Ok(turn) => Ok(turn),
            Err(e) => Err(self.diagnose(e).await),
        }
    }

    fn err(&self, e: sqlx::Error) -> Error {
        let message = sqlx_message(&e, self.connect_timeout);
        Error::from_sqlx(&self.url, "a statement", e, message)
    }

    /// Why no connection came: after a pool timeout, what one direct connection attempt
    /// found (refused, unknown host, bad password, no such database …), the attempt
    /// [`PostgresStore::turn`] made when it made one.
    async fn diagnose(&self, e: NoTurn) -> Error {
        let probe = match e {
            NoTurn::Pool(sqlx::Error::PoolTimedOut) => self.probe().await,
            NoTurn::Pool(e) => return self.err(e),
            NoTurn::Probed(probe) => probe,
        };
        match probe {
            // The server answered and refused (a refused port, a certificate that does
            // not verify, a password, still full): said as it is, with no timeout to wait
            // out.
            Probe::Refused(cause) | Probe::Full(cause) => {
                Error::store(&self.url, format!("cannot connect: {cause}"))
            }
            Probe::Room => self.err(sqlx::Error::PoolTimedOut),
            Probe::Silent => Error::store(
                &self.url,
                format!(
                    "cannot connect within {} s: the server does not answer",
                    self.connect_timeout.as_secs()
                ),
            ),
        }
    }

    async fn lease_row(&self, processor: &str, scope: &str) -> Result<Option<LeaseRow>> {
        let row: Option<LeaseCols> = sqlx::query_as(statements::READ)
            .bind(processor)
            .bind(scope)
            .fetch_optional(&mut self.conn().await?)
            .await
            .map_err(|e| self.err(e))?;
        Ok(row.map(|r| r.0))
    }

    async fn lease_lost(&self, lease: &Lease) -> Error {
        let row = self
            .lease_row(&lease.processor, &lease.scope)
            .await
            .ok()
            .flatten();
        lease.lost(row.and_then(|r| r.holder))
    }

    async fn schema_version(&self) -> std::result::Result<i32, NoTurn> {
        let version: std::result::Result<Option<i32>, sqlx::Error> =
            sqlx::query_scalar("SELECT max(version) FROM idem_schema_migrations")
                .fetch_one(&mut self.turn().await?)
                .await;
        match version {
            Ok(v) => Ok(v.unwrap_or(0)),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(UNDEFINED_TABLE) => {
                Ok(0)
            }
            Err(e) => Err(NoTurn::Pool(e)),
        }
    }
}

/// What one direct connection attempt found ([`PostgresStore::probe`]).
enum Probe {
    /// Connected: there is room again.
    Room,
    /// Refused for now: the server's connection limit reached (`53300`), or starting up
    /// (`57P03`).
    Full(sqlx::Error),
    /// Refused for good, as far as waiting goes: a refused port, a password, no such
    /// database …
    Refused(sqlx::Error),
    /// No answer within the connect timeout.
    Silent,
}

/// Why [`PostgresStore::turn`] gave no connection: the pool's error, or what the direct
/// attempt after a pool timeout found (kept, so that the error says it without a second
/// attempt).
enum NoTurn {
    Pool(sqlx::Error),
    Probed(Probe),
}

impl From<sqlx::Error> for NoTurn {
    fn from(e: sqlx::Error) -> Self {
        NoTurn::Pool(e)
    }
}

/// For the statements that run on a turn and say their own errors: what the attempt found,
/// as sqlx would have said it.
impl From<NoTurn> for sqlx::Error {
    fn from(e: NoTurn) -> Self {
        match e {
            NoTurn::Pool(e) | NoTurn::Probed(Probe::Refused(e) | Probe::Full(e)) => e,
            NoTurn::Probed(Probe::Room | Probe::Silent) => sqlx::Error::PoolTimedOut,
        }
    }
}

async fn apply_migrations(conn: &mut PgConnection) -> std::result::Result<(), sqlx::Error> {
    // Transaction-scoped: released by COMMIT or ROLLBACK, even if this process dies.
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *conn)
        .await?;
    // A `&str` without arguments runs as a simple query: several statements allowed.
    (&mut *conn)
        .execute(
            "CREATE TABLE IF NOT EXISTS idem_schema_migrations (\
               version    INTEGER     PRIMARY KEY, \
               name       TEXT        NOT NULL, \
               applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        )
        .await?;
    // Read again under the lock: another process may have migrated meanwhile.
    let current: i32 =
        sqlx::query_scalar("SELECT COALESCE(max(version), 0) FROM idem_schema_migrations")
            .fetch_one(&mut *conn)
            .await?;
    for migration in migrations::pending(&migrations::POSTGRES, current.into()) {
        // A version Postgres does not need is recorded, not sent.
        if !migration.is_blank() {
            (&mut *conn).execute(migration.sql).await?;
        }
        sqlx::query("INSERT INTO idem_schema_migrations (version, name) VALUES ($1, $2)")
            .bind(i32::try_from(migration.version).unwrap_or(i32::MAX))
            .bind(migration.name)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// What stands between idem and the Postgres server, from the URL's `pgbouncer`
/// parameter (which idem reads and sqlx never sees).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pooler {
    /// The server itself, or a pooler in session mode: a client keeps its server
    /// connection.
    None,
    /// A pooler in transaction mode (`?pgbouncer=true`: PgBouncer's `pool_mode =
    /// transaction`, before 1.21's prepared-statement support): a server connection is
    /// this client's only within a transaction. Every statement runs in a transaction of
    /// its own, and each transaction clears the prepared statements the server connection
    /// holds from other clients; no statement cache.
    Transaction,
}

impl Pooler {
    /// The URL without its `pgbouncer` parameter, and what it says.
    fn take(url: &str) -> std::result::Result<(String, Pooler), String> {
        let (url, value) = crate::backend::take_param(url, "pgbouncer");
        let pooler = match value.as_deref() {
            None | Some("false") => Pooler::None,
            Some("true") => Pooler::Transaction,
            Some(other) => {
                return Err(format!(
                    "pgbouncer={other:?}: expected true (a pooler in transaction mode) or false"
                ))
            }
        };
        Ok((url, pooler))
    }
}

/// A pooled connection and the caller's turn to use it (see `PostgresStore::turns`); both
/// go back when it is dropped.
///
/// As an executor (`&mut turn`), a statement outside a transaction runs as it is, or,
/// behind a transaction-mode pooler (`pinned`), in a transaction of its own: see
/// [`Pooler`].
struct Turn {
    // Dropped in this order: the connection goes back to the pool before the turn passes.
    conn: sqlx::pool::PoolConnection<sqlx::Postgres>,
    _turn: tokio::sync::OwnedSemaphorePermit,
    pinned: bool,
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turn")
            .field("pinned", &self.pinned)
            .finish()
    }
}

/// How a transaction begins behind a transaction-mode pooler: it clears the prepared
/// statements a previous client of that server connection left (sqlx names its statements
/// per client connection, and a client's statements outlive its transactions on the
/// server), in the same round trip.
const PINNED_BEGIN: &str = "BEGIN; DEALLOCATE ALL";

impl Turn {
    /// A transaction on this connection (behind a transaction-mode pooler, one that starts
    /// by clearing other clients' prepared statements: [`PINNED_BEGIN`]).
    async fn begin(
        &mut self,
    ) -> std::result::Result<sqlx::Transaction<'_, sqlx::Postgres>, sqlx::Error> {
        match self.pinned {
            true => self.conn.begin_with(PINNED_BEGIN).await,
            false => self.conn.begin().await,
        }
    }
}

impl<'c> sqlx::Executor<'c> for &'c mut Turn {
    type Database = sqlx::Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> futures_util::stream::BoxStream<
        'e,
        std::result::Result<
            sqlx::Either<sqlx::postgres::PgQueryResult, sqlx::postgres::PgRow>,
            sqlx::Error,
        >,
    >
    where
        'c: 'e,
        E: 'q + sqlx::Execute<'q, sqlx::Postgres>,
    {
        use futures_util::{StreamExt, TryStreamExt};
        if !self.pinned {
            return (&mut *self.conn).fetch_many(query);
        }
        // Collected inside the transaction, then streamed: the statements idem sends here
        // return a few rows at most. The transaction keeps one server connection from the
        // statement's parse to its execution (sqlx parses and executes in two round trips,
        // each ending with a Sync that would otherwise hand the server connection to
        // another client).
        let all = async move {
            let mut tx = self.conn.begin_with(PINNED_BEGIN).await?;
            let items: Vec<_> = (&mut *tx).fetch_many(query).try_collect().await?;
            tx.commit().await?;
            Ok(items)
        };
        futures_util::stream::once(all)
            .flat_map(|all| match all {
                Ok(items) => futures_util::stream::iter(items.into_iter().map(Ok)).left_stream(),
                Err(e) => futures_util::stream::once(async move { Err(e) }).right_stream(),
            })
            .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> futures_util::future::BoxFuture<
        'e,
        std::result::Result<Option<sqlx::postgres::PgRow>, sqlx::Error>,
    >
    where
        'c: 'e,
        E: 'q + sqlx::Execute<'q, sqlx::Postgres>,
    {
        use futures_util::FutureExt;
        if !self.pinned {
            return (&mut *self.conn).fetch_optional(query);
        }
        async move {
            let mut tx = self.conn.begin_with(PINNED_BEGIN).await?;
            let row = (&mut *tx).fetch_optional(query).await?;
            tx.commit().await?;
            Ok(row)
        }
        .boxed()
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [sqlx::postgres::PgTypeInfo],
    ) -> futures_util::future::BoxFuture<
        'e,
        std::result::Result<sqlx::postgres::PgStatement<'q>, sqlx::Error>,
    >
    where
        'c: 'e,
    {
        (&mut *self.conn).prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> futures_util::future::BoxFuture<
        'e,
        std::result::Result<sqlx::Describe<sqlx::Postgres>, sqlx::Error>,
    >
    where
        'c: 'e,
    {
        (&mut *self.conn).describe(sql)
    }
}

impl std::ops::Deref for Turn {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for Turn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

// How Postgres stores instants, days and JSON: natively.
type Run = RunRow<DateTime<Utc>, NaiveDate, Value>;
type Key = KeyRow<DateTime<Utc>, NaiveDate, Value>;
type LeaseCols = LeaseColumns<DateTime<Utc>>;

/// `idem_schema_migrations` records the migrations applied; `pg_advisory_xact_lock` is the
/// lock.
#[async_trait]
impl Schema for PostgresStore {
    fn migrations(&self) -> &'static [Migration] {
        &migrations::POSTGRES
    }

    async fn version(&self) -> Result<i64> {
        match self.schema_version().await {
            Ok(v) => Ok(v.into()),
            Err(e) => Err(self.diagnose(e).await),
        }
    }

    async fn apply(&self) -> Result<()> {
        let mut conn = self.conn().await?;
        let mut tx = conn.begin().await.map_err(|e| self.err(e))?;
        if let Err(e) = apply_migrations(&mut tx).await {
            let _ = tx.rollback().await;
            return Err(Error::store(
                &self.url,
                format!(
                    "migration failed: {}",
                    sqlx_message(&e, self.connect_timeout)
                ),
            ));
        }
        tx.commit().await.map_err(|e| self.err(e))
    }
}

#[async_trait]
impl StoreBase for PostgresStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn location(&self) -> String {
        self.url.to_string()
    }

    /// Pending marks are confirmed (by the batch); event batches on keys they do not
    /// share run in transactions side by side, one per pooled connection (each locks its
    /// keys in byte order, so they cannot deadlock); a gate's batches mark ahead of their
    /// turn (`event_turns`, migration 0012).
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// A server that takes the connection and never answers (a port whose connections
    /// wait in the listen backlog) is given up on after the URL's `connect_timeout`, not
    /// the default 5 s, and the error says so. On tokio's paused clock: it moves on only
    /// when nothing else can, so the wait measured is the store's own.
    #[tokio::test(start_paused = true)]
    async fn a_server_that_does_not_answer_is_given_up_on_after_connect_timeout() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        let url = format!("postgres://idem@127.0.0.1:{port}/idem?connect_timeout=1");
        let store = super::PostgresStore::connect_lazy(&url).unwrap();
        let started = tokio::time::Instant::now();
        let Err(e) = store.conn().await else {
            panic!("a connection from a server that never answers");
        };
        let waited = started.elapsed();
        let e = e.to_string();
        assert!(
            e.contains("cannot connect within 1 s: the server does not answer"),
            "{e}"
        );
        // The pool's wait, then one direct attempt of at most as long (whether the server
        // is only full, which says why it failed too): 2 s and tokio's rounding up to the
        // millisecond, where it was 5 + 2 + 2 s without the parameter and 1 + 1 + 1 s
        // with two attempts. (sqlx counts the pool's deadline on the wall clock, which
        // moves on while tokio's is paused: its part is a little under 1 s on a busy
        // machine, so the attempt's 1 s is the bound below.)
        assert!(
            waited >= Duration::from_secs(1) && waited < Duration::from_millis(2500),
            "{waited:?}: {e}"
        );
        drop(silent);
    }

    /// The pool and the connect options hold the password; `{:?}` of the store or of the
    /// warehouse never shows it (nothing is connected: the server is not needed).
    #[tokio::test]
    async fn debug_never_shows_the_password() {
        for url in [
            "postgres://idem:s3cret@127.0.0.1:1/idem",
            "postgres://idem@127.0.0.1:1/idem?password=s3cret",
        ] {
            let store = super::PostgresStore::connect_lazy(url).unwrap();
            let shown = format!("{store:?}");
            assert!(
                !shown.contains("s3cret") && shown.contains("***"),
                "{shown}"
            );
        }
    }
}
