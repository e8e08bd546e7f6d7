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
use super::rows::{KeyRow, LeaseColumns, LeaseRow, RunRow, KEY_COLUMNS, RUN_COLUMNS};
use super::{
    lease_expiry, redact_url, Capabilities, Claim, ClaimRequest, CleanupPolicy, CleanupReport,
    EventKeyStore, EventMark, EventVerdict, Finish, KeyLookup, Lease, LeaseHolder, LeaseStore,
    LedgerStore, MaintenanceStore, PendingBatch, RunFilter, StoreBase,
};
use crate::backend::postgres::{connect_options, sqlx_message, ACQUIRE_TIMEOUT};
use crate::error::{Error, Result};
use crate::model::{micros, KeyRecord, RunRecord, RunStatus};

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
    /// The URL without its password.
    url: crate::backend::RedactedUrl,
    /// What the last batch of event keys found ([`BatchShape`]): which statement the next
    /// one tries first. Shared by the clones, so by the batches in flight.
    last_batch: Arc<AtomicU8>,
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
        let mut options = connect_options(&driver_url)?;
        if pooler == Pooler::Transaction {
            // No statement cache: a cached statement would be looked for on whichever
            // server connection the pooler hands out next.
            options = options.statement_cache_capacity(0);
        }
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .min_connections(0)
            .acquire_timeout(ACQUIRE_TIMEOUT)
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
            url: crate::backend::RedactedUrl::new(url),
            last_batch: Arc::new(AtomicU8::new(BatchShape::Fresh as u8)),
        })
    }

    /// The underlying pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A pooled connection, once it is this caller's turn (see `turns`).
    async fn turn(&self) -> std::result::Result<Turn, sqlx::Error> {
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
                Err(sqlx::Error::PoolTimedOut)
                    if asked.elapsed() < FULL_WAIT && self.server_is_full().await => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether a direct connection attempt is refused as a transient condition of the
    /// server: its connection limit reached (`53300`), or starting up (`57P03`).
    async fn server_is_full(&self) -> bool {
        let attempt = tokio::time::timeout(
            Duration::from_secs(2),
            PgConnection::connect_with(&self.options),
        )
        .await;
        match attempt {
            Ok(Err(sqlx::Error::Database(db))) => {
                matches!(db.code().as_deref(), Some("53300" | "57P03"))
            }
            Ok(Ok(conn)) => {
                // Room again: the pool's next try gets in.
                let _ = conn.close().await;
                true
            }
            _ => false,
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
        let message = sqlx_message(&e);
        Error::from_sqlx(&self.url, "a statement", e, message)
    }

    /// After a pool timeout, one direct connection attempt says why (refused, unknown
    /// host, bad password, no such database …).
    async fn diagnose(&self, e: sqlx::Error) -> Error {
        if !matches!(e, sqlx::Error::PoolTimedOut) {
            return self.err(e);
        }
        let attempt = tokio::time::timeout(
            Duration::from_secs(2),
            PgConnection::connect_with(&self.options),
        )
        .await;
        match attempt {
            // The server answered and refused (a refused port, a certificate that does
            // not verify, a password): said as it is, with no timeout to wait out.
            Ok(Err(cause)) => Error::store(&self.url, format!("cannot connect: {cause}")),
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                self.err(e)
            }
            Err(_) => Error::store(
                &self.url,
                format!(
                    "cannot connect within {} s: the server does not answer",
                    ACQUIRE_TIMEOUT.as_secs()
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

    async fn schema_version(&self) -> std::result::Result<i32, sqlx::Error> {
        let version: std::result::Result<Option<i32>, sqlx::Error> =
            sqlx::query_scalar("SELECT max(version) FROM idem_schema_migrations")
                .fetch_one(&mut self.turn().await?)
                .await;
        match version {
            Ok(v) => Ok(v.unwrap_or(0)),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(UNDEFINED_TABLE) => {
                Ok(0)
            }
            Err(e) => Err(e),
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
                format!("migration failed: {}", sqlx_message(&e)),
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
    /// keys in byte order, so they cannot deadlock).
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
impl LeaseStore for PostgresStore {
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
                    "INSERT INTO processing_leases AS l \
               (processor_name, scope, holder_run_id, token, acquired_at, expires_at) \
             VALUES ($1, $2, $3, 1, $4, $5) \
             ON CONFLICT (processor_name, scope) DO UPDATE SET \
               holder_run_id = EXCLUDED.holder_run_id, \
               token = l.token + 1, \
               acquired_at = EXCLUDED.acquired_at, \
               expires_at = EXCLUDED.expires_at \
             WHERE l.holder_run_id IS NULL OR l.expires_at <= EXCLUDED.acquired_at \
             RETURNING token",
                )
                .bind(request.processor)
                .bind(request.scope)
                .bind(request.run_id)
                .bind(now)
                .bind(expires_at)
                .fetch_optional(&mut self.conn().await?)
                .await
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
        let expires_at = lease_expiry(micros(now), ttl);
        let done = statements::update(statements::RENEW, expires_at, lease)
            .execute(&mut self.conn().await?)
            .await
            .map_err(|e| self.err(e))?;
        if done.rows_affected() == 1 {
            return Ok(Lease {
                expires_at,
                ..lease.clone()
            });
        }
        Err(self.lease_lost(lease).await)
    }

    async fn release(&self, lease: &Lease, now: DateTime<Utc>) -> Result<bool> {
        let done = statements::update(statements::RELEASE, micros(now), lease)
            .execute(&mut self.conn().await?)
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
impl LedgerStore for PostgresStore {
    async fn find_keys(&self, lookups: &[KeyLookup]) -> Result<Vec<Option<KeyRecord>>> {
        let mut out: Vec<Option<KeyRecord>> = vec![None; lookups.len()];
        if lookups.is_empty() {
            return Ok(out);
        }
        let keys: Vec<&str> = lookups.iter().map(|l| l.key.as_str()).collect();
        let kinds: Vec<&str> = lookups.iter().map(|l| l.kind.as_str()).collect();
        let since: Vec<DateTime<Utc>> = lookups.iter().map(|l| l.since).collect();
        // One round trip: the lookups as parallel arrays, the latest row of each by a
        // LATERAL index scan of (processing_key, kind, processed_at).
        let rows = sqlx::query(&format!(
            "SELECT l.ord, k.* \
             FROM UNNEST($1::text[], $2::text[], $3::timestamptz[]) \
                  WITH ORDINALITY AS l(key, kind, since, ord) \
             CROSS JOIN LATERAL ( \
               SELECT {KEY_COLUMNS} FROM processing_keys p \
               WHERE p.processing_key = l.key AND p.kind = l.kind AND p.processed_at >= l.since \
               ORDER BY p.processed_at DESC, p.id DESC LIMIT 1) k"
        ))
        .bind(&keys)
        .bind(&kinds)
        .bind(&since)
        .fetch_all(&mut self.conn().await?)
        .await
        .map_err(|e| self.err(e))?;
        for row in &rows {
            let ord: i64 = row.get("ord");
            if let Some(slot) = usize::try_from(ord - 1).ok().and_then(|i| out.get_mut(i)) {
                *slot = Some(Key::from_row(row).map_err(|e| self.err(e))?.0);
            }
        }
        Ok(out)
    }

    async fn finish(&self, finish: &Finish) -> Result<()> {
        let mut conn = self.conn().await?;
        let mut tx = conn.begin().await.map_err(|e| self.err(e))?;
        if let Some(lease) = &finish.lease {
            let done =
                statements::update(statements::RELEASE, micros(finish.run.finished_at), lease)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| self.err(e))?;
            if done.rows_affected() != 1 {
                tx.rollback().await.map_err(|e| self.err(e))?;
                // The connection goes back before the lease is read on one of its own.
                drop(conn);
                return Err(self.lease_lost(lease).await);
            }
        }
        let run = &finish.run;
        sqlx::query(&format!(
            "INSERT INTO processing_runs ({RUN_COLUMNS}) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)"
        ))
        .bind(&run.run_id)
        .bind(&run.processor)
        .bind(&run.scope)
        .bind(run.scope_date)
        .bind(run.trigger.as_str())
        .bind(run.mode.as_str())
        .bind(micros(run.started_at))
        .bind(micros(run.finished_at))
        .bind(run.duration_ms)
        .bind(run.status.as_str())
        .bind(run.skip_reason.as_ref().map(|r| r.as_str()))
        .bind(run.would_skip_reason.as_ref().map(|r| r.as_str()))
        .bind(&run.previous_run_id)
        .bind(run.records_processed)
        .bind(&run.processing_key)
        .bind(&run.error)
        .bind(&run.output)
        .execute(&mut *tx)
        .await
        .map_err(|e| statements::run_insert_error(&self.url, &run.run_id, e, |e| self.err(e)))?;
        if run.status == RunStatus::Completed && !finish.keys.is_empty() {
            let k = &finish.keys;
            sqlx::query(&format!(
                "INSERT INTO processing_keys ({KEY_COLUMNS}) \
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], \
                   $5::date[], $6::timestamptz[], $7::int8[], $8::jsonb[], $9::text[])"
            ))
            .bind(k.iter().map(|k| k.key.as_str()).collect::<Vec<_>>())
            .bind(k.iter().map(|k| k.kind.as_str()).collect::<Vec<_>>())
            .bind(k.iter().map(|k| k.processor.as_str()).collect::<Vec<_>>())
            .bind(k.iter().map(|k| k.scope.as_str()).collect::<Vec<_>>())
            .bind(k.iter().map(|k| k.scope_date).collect::<Vec<_>>())
            .bind(k.iter().map(|k| micros(k.processed_at)).collect::<Vec<_>>())
            .bind(k.iter().map(|k| k.entity_count).collect::<Vec<_>>())
            .bind(k.iter().map(|k| k.metadata.clone()).collect::<Vec<_>>())
            .bind(k.iter().map(|k| k.run_id.as_str()).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
        }
        tx.commit().await.map_err(|e| self.err(e))
    }

    async fn runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>> {
        // Only the filters given become conditions (better plans than `$n IS NULL OR …`);
        // every value is bound.
        let mut conditions: Vec<String> = Vec::new();
        let mut args = PgArguments::default();
        let bind_err = |e: BoxDynError| Error::store(&self.url, e);
        if let Some(p) = &filter.processor {
            args.add(p.as_str()).map_err(bind_err)?;
            conditions.push(format!("processor_name = ${}", args.len()));
        }
        if let Some(s) = &filter.scope {
            args.add(s.as_str()).map_err(bind_err)?;
            conditions.push(format!("scope = ${}", args.len()));
        }
        if let Some(s) = filter.status {
            args.add(s.as_str()).map_err(bind_err)?;
            conditions.push(format!("status = ${}", args.len()));
        }
        if let Some(t) = filter.since {
            args.add(t).map_err(bind_err)?;
            conditions.push(format!("started_at >= ${}", args.len()));
        }
        if let Some(t) = filter.trigger {
            args.add(t.as_str()).map_err(bind_err)?;
            conditions.push(format!("trigger_source = ${}", args.len()));
        }
        if let Some(id) = &filter.run_id {
            args.add(id.as_str()).map_err(bind_err)?;
            conditions.push(format!("run_id = ${}", args.len()));
        }
        if let Some(r) = &filter.except_skip_reason {
            args.add(r.as_str().to_string()).map_err(bind_err)?;
            conditions.push(format!(
                "(skip_reason IS NULL OR skip_reason <> ${})",
                args.len()
            ));
        }
        let mut sql = format!("SELECT {RUN_COLUMNS} FROM processing_runs");
        if !conditions.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&conditions.join(" AND "));
        }
        sql.push_str(" ORDER BY started_at DESC, run_id DESC");
        if filter.limit > 0 {
            args.add(filter.limit as i64).map_err(bind_err)?;
            let _ = write!(sql, " LIMIT ${}", args.len());
        }
        let rows: Vec<Run> = sqlx::query_as_with(&sql, args)
            .fetch_all(&mut self.conn().await?)
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
impl MaintenanceStore for PostgresStore {
    async fn purge(&self, processor: &str, scope: Option<&str>) -> Result<u64> {
        let done = match scope {
            Some(scope) => {
                sqlx::query("DELETE FROM processing_keys WHERE processor_name = $1 AND scope = $2")
                    .bind(processor)
                    .bind(scope)
                    .execute(&mut self.conn().await?)
                    .await
            }
            None => {
                sqlx::query("DELETE FROM processing_keys WHERE processor_name = $1")
                    .bind(processor)
                    .execute(&mut self.conn().await?)
                    .await
            }
        }
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }

    async fn cleanup(&self, policy: &CleanupPolicy) -> Result<CleanupReport> {
        // $1 the table's cut-off, $2 the processor (or NULL = all), $3 the keys' cut-off
        // (a ledger row a kept key points at stays: a NOT IN over the kept keys' run
        // ids, evaluated once per statement rather than once per row), $4 the batch size.
        const CONDITIONS: [&str; 4] = [
            "processed_at < $1 AND ($2::text IS NULL OR processor_name = $2) AND $3::timestamptz IS NOT NULL",
            "started_at < $1 AND ($2::text IS NULL OR processor_name = $2) AND run_id NOT IN \
                 (SELECT run_id FROM processing_keys WHERE processed_at >= $3)",
            "expires_at < $1 AND ($2::text IS NULL OR processor_name = $2) AND $3::timestamptz IS NOT NULL",
            // Expired, or of a pending batch whose deadline passed unconfirmed.
            "(expires_at < $1 OR (pending, first_seen) IN \
                   (SELECT id, first_seen FROM event_pending WHERE deadline < $1)) \
                 AND $2::text IS NULL AND $3::timestamptz IS NOT NULL",
        ];
        cleanup_tables(
            policy,
            true,
            |i, cutoff| async move {
                let sql = format!(
                    "SELECT count(*) FROM {} WHERE {}",
                    CLEANUP_TABLES[i], CONDITIONS[i]
                );
                let n: i64 = statements::cleanup(&sql, cutoff, policy.processor.as_deref(), policy.keys_before)
                    .fetch_one(&mut self.conn().await?)
                    .await
                    .and_then(|row| row.try_get(0))
                    .map_err(|e| self.err(e))?;
                Ok(n as u64)
            },
            // One bounded batch per statement, each its own transaction.
            |i, cutoff| async move {
                let (table, condition) = (CLEANUP_TABLES[i], CONDITIONS[i]);
                let sql = format!(
                    "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE {condition} LIMIT $4))"
                );
                let deleted = statements::cleanup(&sql, cutoff, policy.processor.as_deref(), policy.keys_before)
                    .bind(policy.limit())
                    .execute(&mut self.conn().await?)
                    .await
                    .map_err(|e| self.err(e))?
                    .rows_affected();
                if table == "event_keys"
                    && policy.processor.is_none()
                    && deleted < policy.limit() as u64
                {
                    // After the last batch of keys: the rows of dead pending batches none
                    // of whose keys is left, each probed through the first-seen index (a
                    // batch's keys share its first-seen time; a per-row probe, not a join
                    // the planner could run as a scan of every key). Never before their
                    // keys: a key whose batch row is gone reads as confirmed.
                    sqlx::query(
                        "DELETE FROM event_pending d WHERE d.deadline < $1 AND ( \
                           SELECT 1 FROM event_keys e WHERE e.first_seen = d.first_seen \
                             AND e.namespace = d.namespace AND e.pending = d.id LIMIT 1) IS NULL",
                    )
                    .bind(cutoff)
                    .execute(&mut self.conn().await?)
                    .await
                    .map_err(|e| self.err(e))?;
                }
                Ok(deleted)
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

/// The batch a statement marks keys for, registered first: with a pending marker ($7, the deadline $8) one row of `event_pending` (migration 0008),
/// whose id the batch's keys carry in `pending` until the confirmation deletes that row;
/// without one ($7 NULL), nothing, and the keys carry NULL. Only when the statement will
/// insert a key (`$when`): a batch row no key names would wait for the cleanup.
macro_rules! batch_cte {
    ($when:literal) => {
        concat!(
            "batch AS (
  INSERT INTO event_pending (namespace, marker, first_seen, deadline)
  SELECT $1, $7, $6, $8 WHERE $7::text IS NOT NULL AND ",
            $when,
            "
  RETURNING id
)"
        )
    };
}

/// The row of key `i.event_key` of namespace $1 (`s`, expired or not) looked up through the
/// primary key (`LATERAL … LIMIT 1` is never turned into a join the planner could choose to
/// run as a scan of the table, e.g. on statistics taken while it was still small), with
/// its pending batch's row (`p`: present while the batch is unconfirmed).
macro_rules! stored_row {
    () => {
        "CROSS JOIN LATERAL (
    SELECT s.event_key, s.fingerprint, s.decision, s.first_seen, s.expires_at, s.pending
    FROM event_keys s
    WHERE s.namespace = $1 AND s.event_key = i.event_key
    LIMIT 1
  ) s
  LEFT JOIN event_pending p ON p.id = s.pending AND p.first_seen = s.first_seen"
    };
}

/// In one statement: reads the stored rows of keys unexpired at $6, and marks the first
/// occurrence of each other key (absent, or expired: the upsert's WHERE). A stored key is
/// never sent to the upsert: `ON CONFLICT DO UPDATE` locks the row it conflicts with even
/// when its WHERE is false, a write (and WAL) per replayed key. `found` is false for a key
/// that neither was marked nor is visible to the statement's snapshot (a concurrent batch
/// committed it meanwhile): read again with [`EVENTS_READ_SQL`]. Keys are inserted in the
/// order they were sent (byte order), whatever the plan. A key is expired when its expiry
/// or its unconfirmed batch's deadline has passed; a key of an unconfirmed batch reads as
/// that batch's marker.
const EVENTS_MARK_SQL: &str = concat!(
    "WITH input AS (
  SELECT * FROM UNNEST($2::text[], $3::text[], $4::text[], $5::timestamptz[])
    WITH ORDINALITY AS i(event_key, fingerprint, decision, expires_at, n)
), stored AS (
  SELECT s.event_key, s.fingerprint, COALESCE(p.marker, s.decision::text) AS decision,
         s.first_seen
  FROM input i ",
    stored_row!(),
    "
  WHERE (s.expires_at IS NULL OR s.expires_at > $6) AND (p.deadline IS NULL OR p.deadline > $6)
), ",
    batch_cte!(
        "EXISTS (SELECT 1 FROM input i
    WHERE NOT EXISTS (SELECT 1 FROM stored s WHERE s.event_key = i.event_key))"
    ),
    ", marked AS (
  INSERT INTO event_keys AS e
    (namespace, event_key, first_seen, fingerprint, decision, expires_at, pending)
  SELECT $1, event_key, $6, fingerprint, decision::jsonb, expires_at, (SELECT id FROM batch)
  FROM input i
  WHERE NOT EXISTS (SELECT 1 FROM stored s WHERE s.event_key = i.event_key)
  ORDER BY i.n
  ON CONFLICT (namespace, event_key) DO UPDATE SET
    first_seen = EXCLUDED.first_seen, fingerprint = EXCLUDED.fingerprint,
    decision = EXCLUDED.decision, expires_at = EXCLUDED.expires_at, pending = EXCLUDED.pending
  WHERE e.expires_at <= $6
     OR EXISTS (SELECT 1 FROM event_pending d
                WHERE d.id = e.pending AND d.first_seen = e.first_seen AND d.deadline <= $6)
  RETURNING e.event_key
)
SELECT i.event_key, m.event_key IS NOT NULL AS new, s.event_key IS NOT NULL AS found,
       s.fingerprint, s.decision, s.first_seen
FROM input i
LEFT JOIN marked m ON m.event_key = i.event_key
LEFT JOIN stored s ON s.event_key = i.event_key"
);

/// The first try of a batch without a cursor, in one statement: looks up the row of every
/// key ($2, in byte order) through the primary key, expired or not, and when none has
/// expired inserts every key it did not find, with a plain `INSERT` in the order sent.
/// [`EVENTS_MARK_SQL`]'s `ON CONFLICT` costs a speculative insertion per row (an index probe
/// before the insert and a WAL record to confirm it after) and one result row per key; this
/// returns one row (how many it inserted) and the stored rows. A key whose row another
/// transaction commits meanwhile fails the insert (unique violation, 23505) and the whole
/// statement with it, and a found row that has expired needs the upsert's take-over: both
/// are left to [`EVENTS_MARK_SQL`], this having written nothing.
const EVENTS_INSERT_SQL: &str = concat!(
    "WITH input AS (
  SELECT * FROM UNNEST($2::text[], $3::text[], $4::text[], $5::timestamptz[])
    WITH ORDINALITY AS i(event_key, fingerprint, decision, expires_at, n)
), existing AS (
  SELECT s.event_key, s.fingerprint, COALESCE(p.marker, s.decision::text) AS decision,
         s.first_seen, (s.expires_at <= $6 OR p.deadline <= $6) AS expired
  FROM input i ",
    stored_row!(),
    "
), ",
    batch_cte!(
        "NOT EXISTS (SELECT 1 FROM existing x WHERE x.expired)
    AND EXISTS (SELECT 1 FROM input i
      WHERE NOT EXISTS (SELECT 1 FROM existing x WHERE x.event_key = i.event_key))"
    ),
    ", inserted AS (
  INSERT INTO event_keys
    (namespace, event_key, first_seen, fingerprint, decision, expires_at, pending)
  SELECT $1, event_key, $6, fingerprint, decision::jsonb, expires_at, (SELECT id FROM batch)
  FROM input i
  WHERE NOT EXISTS (SELECT 1 FROM existing x WHERE x.event_key = i.event_key)
    AND NOT EXISTS (SELECT 1 FROM existing x WHERE x.expired)
  ORDER BY i.n
  RETURNING 1
)
SELECT (SELECT count(*) FROM inserted) AS inserted, x.event_key, x.fingerprint,
       x.decision, x.first_seen, x.expired
FROM (SELECT 1) AS one LEFT JOIN existing x ON true"
);

/// The stored rows of keys $2 (expired at $3 or not), looked up one key at a time through
/// the primary key (as in [`EVENTS_MARK_SQL`]): the first try of a batch when a batch of
/// the same stream found every key stored. A read, so nothing to write when every key is
/// found unexpired; otherwise the batch goes to [`EVENTS_INSERT_SQL`]. `expired` is NULL
/// for a key that never expires.
const EVENTS_LOOKUP_SQL: &str = concat!(
    "SELECT s.event_key, s.fingerprint, COALESCE(p.marker, s.decision::text) AS decision,
       s.first_seen, (s.expires_at <= $3 OR p.deadline <= $3) AS expired
FROM UNNEST($2::text[]) AS i(event_key) ",
    stored_row!()
);

/// Deletes the rows of keys $2 (only those first seen at $3, unless $3 is NULL), locking
/// them first in key order (`FOR UPDATE` under `ORDER BY`; `event_key` compares as bytes,
/// migration 0006): the order every mark locks its keys in, so a delete and a batch
/// taking over expired keys wait for each other instead of deadlocking. A row another
/// batch took over meanwhile (a new first-seen time) is re-checked under its lock and
/// stays.
const EVENTS_FORGET_SQL: &str = "\
DELETE FROM event_keys e USING (
  SELECT event_key FROM event_keys
  WHERE namespace = $1 AND event_key = ANY($2::text[])
    AND ($3::timestamptz IS NULL OR first_seen = $3)
  ORDER BY event_key
  FOR UPDATE
) l
WHERE e.namespace = $1 AND e.event_key = l.event_key
  AND ($3::timestamptz IS NULL OR e.first_seen = $3)";

/// The unexpired rows of keys $2, looked up one key at a time (as in
/// [`EVENTS_LOOKUP_SQL`]; `event_key = ANY($2)` let the planner scan the namespace).
const EVENTS_READ_SQL: &str = concat!(
    "SELECT s.event_key, s.fingerprint, COALESCE(p.marker, s.decision::text) AS decision,
       s.first_seen
FROM UNNEST($2::text[]) AS i(event_key) ",
    stored_row!(),
    "
WHERE (s.expires_at IS NULL OR s.expires_at > $3) AND (p.deadline IS NULL OR p.deadline > $3)"
);

/// Appends `text` to a `COPY … FROM STDIN` (text format) row: backslash, tab, newline and
/// carriage return escaped.
fn copy_field(row: &mut String, text: &str) {
    if !text.contains(['\\', '\t', '\n', '\r']) {
        row.push_str(text);
        return;
    }
    for c in text.chars() {
        match c {
            '\\' => row.push_str("\\\\"),
            '\t' => row.push_str("\\t"),
            '\n' => row.push_str("\\n"),
            '\r' => row.push_str("\\r"),
            c => row.push(c),
        }
    }
}

/// Whether `e` says the connection could not be had or used (a connection exception, or
/// no error from the statement itself), rather than an answer to the statement.
fn connection_refused(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d.code().is_some_and(|c| c.starts_with("08")),
        sqlx::Error::RowNotFound
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::TypeNotFound { .. } => false,
        _ => true,
    }
}

/// An instant as `COPY` text (microseconds, UTC).
fn copy_instant(at: DateTime<Utc>) -> String {
    // The year unsigned and at least 4 digits: chrono's `%Y` signs years past 9999 (an
    // expiry saturated at the largest instant), which Postgres refuses.
    use chrono::Datelike;
    format!("{:04}{}", at.year(), at.format("-%m-%d %H:%M:%S%.6f+00"))
}

/// The `COPY` text of a batch's keys (`firsts`, in byte order), marked at `now` for
/// pending batch `pending` (or none).
fn copy_rows(
    namespace: &str,
    firsts: &[&EventMark],
    decisions: &[Option<String>],
    expiries: &[Option<DateTime<Utc>>],
    now: DateTime<Utc>,
    pending: Option<i64>,
) -> String {
    let mut head = String::with_capacity(namespace.len() + 1);
    copy_field(&mut head, namespace);
    head.push('\t');
    let mut tail = String::from("\t");
    tail.push_str(&copy_instant(now));
    tail.push('\t');
    let pending = pending.map_or_else(|| "\\N".to_string(), |id| id.to_string());
    let mut out = String::with_capacity(firsts.len() * (head.len() + 120));
    let mut last_expiry: Option<(DateTime<Utc>, String)> = None;
    for ((m, decision), expiry) in firsts.iter().zip(decisions).zip(expiries) {
        out.push_str(&head);
        copy_field(&mut out, &m.key);
        out.push_str(&tail);
        match &m.fingerprint {
            Some(f) => copy_field(&mut out, f),
            None => out.push_str("\\N"),
        }
        out.push('\t');
        match decision {
            Some(d) => copy_field(&mut out, d),
            None => out.push_str("\\N"),
        }
        out.push('\t');
        match expiry {
            Some(at) => {
                if last_expiry.as_ref().is_none_or(|(t, _)| t != at) {
                    last_expiry = Some((*at, copy_instant(*at)));
                }
                out.push_str(&last_expiry.as_ref().expect("set above").1);
            }
            None => out.push_str("\\N"),
        }
        out.push('\t');
        out.push_str(&pending);
        out.push('\n');
    }
    out
}

type EventRow = (String, Option<String>, Option<String>, DateTime<Utc>);

impl PostgresStore {
    /// [`EVENTS_FORGET_SQL`]: deletes the rows of `keys` (first seen at `first_seen`, if
    /// given); how many went.
    async fn delete_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        first_seen: Option<DateTime<Utc>>,
    ) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query(EVENTS_FORGET_SQL)
            .bind(namespace)
            .bind(keys)
            .bind(first_seen)
            .execute(&mut self.conn().await?)
            .await
            .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }

    async fn read_events(
        &self,
        namespace: &str,
        keys: &[&str],
        now: DateTime<Utc>,
    ) -> Result<Vec<EventRow>> {
        sqlx::query_as(EVENTS_READ_SQL)
            .bind(namespace)
            .bind(keys)
            .bind(micros(now))
            .fetch_all(&mut self.conn().await?)
            .await
            .map_err(|e| self.err(e))
    }
}

/// Moves cursor ($1, $2) to position $3 (value $4) when $3 is after it.
async fn advance(
    conn: &mut sqlx::PgConnection,
    namespace: &str,
    name: &str,
    to: &Cursor,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO event_cursors AS c (namespace, name, position, value, updated_at) \
         VALUES ($1, $2, $3, $4::jsonb, now()) \
         ON CONFLICT (namespace, name) DO UPDATE SET \
           position = EXCLUDED.position, value = EXCLUDED.value, updated_at = EXCLUDED.updated_at \
         WHERE c.position COLLATE \"C\" < EXCLUDED.position COLLATE \"C\"",
    )
    .bind(namespace)
    .bind(name)
    .bind(&to.position)
    .bind(to.value_text())
    .execute(conn)
    .await?;
    Ok(())
}

impl PostgresStore {
    /// The first try of a batch without a cursor when the last batch found every key
    /// absent: its rows sent with `COPY` straight into `event_keys`, as a bulk load (rows
    /// written a page at a time, one WAL record per page rather than per row; the primary
    /// key's unique check is the lookup). A key stored, expired or not, fails the copy
    /// whole (unique violation): nothing is written, and `false` sends the batch on to
    /// [`EVENTS_INSERT_SQL`]. A pending batch's row (migration 0008) goes in the same
    /// transaction, so its keys are never seen without it.
    async fn copy_fresh(
        &self,
        namespace: &str,
        firsts: &[&EventMark],
        decisions: &[Option<String>],
        expiries: &[Option<DateTime<Utc>>],
        now: DateTime<Utc>,
        pending: Option<(&str, DateTime<Utc>)>,
    ) -> Result<bool> {
        const COPY: &str = "COPY event_keys (namespace, event_key, first_seen, fingerprint, \
                            decision, expires_at, pending) FROM STDIN";
        let now = micros(now);
        let copied = match pending {
            None => {
                let rows = copy_rows(namespace, firsts, decisions, expiries, now, None);
                async {
                    let mut conn = self.turn().await?;
                    let mut copy = conn.copy_in_raw(COPY).await?;
                    copy.send(rows.as_bytes()).await?;
                    copy.finish().await
                }
                .await
            }
            // The batch's row and its keys in one transaction (one commit to wait for).
            Some((marker, deadline)) => {
                async {
                    let mut conn = self.turn().await?;
                    let mut tx = conn.begin().await?;
                    let id: i64 = sqlx::query_scalar(
                        "INSERT INTO event_pending (namespace, marker, first_seen, deadline) \
                         VALUES ($1, $2, $3, $4) RETURNING id",
                    )
                    .bind(namespace)
                    .bind(marker)
                    .bind(now)
                    .bind(micros(deadline))
                    .fetch_one(&mut *tx)
                    .await?;
                    let rows = copy_rows(namespace, firsts, decisions, expiries, now, Some(id));
                    let mut copy = tx.copy_in_raw(COPY).await?;
                    copy.send(rows.as_bytes()).await?;
                    let n = copy.finish().await?;
                    tx.commit().await.map(|()| n)
                }
                .await
            }
        };
        match copied {
            Ok(_) => Ok(true),
            // A key is stored (or was committed meanwhile): nothing written.
            Err(sqlx::Error::Database(e))
                if e.kind() == sqlx::error::ErrorKind::UniqueViolation =>
            {
                Ok(false)
            }
            Err(e) => Err(self.err(e)),
        }
    }

    /// Keeps what a batch found, for the next to choose its first statement by.
    fn remember(&self, shape: BatchShape) {
        self.last_batch.store(shape as u8, Ordering::Relaxed);
    }

    /// `check_and_mark`, and the cursor's advance in the same transaction; with `pending`
    /// (a marker and its deadline) the keys it marks are pending for that batch.
    async fn mark_batch(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        cursor: Option<(&str, &Cursor)>,
        pending: Option<(&str, DateTime<Utc>)>,
    ) -> Result<Vec<EventVerdict>> {
        let (marker, deadline) = (pending.map(|p| p.0), pending.map(|p| micros(p.1)));
        if marks.is_empty() {
            if let Some((name, to)) = cursor {
                return self
                    .advance_cursor(namespace, name, to)
                    .await
                    .map(|()| Vec::new());
            }
            return Ok(Vec::new());
        }
        // One round trip (a transaction with the cursor). Repeats inside the batch are removed here and the keys sent in
        // byte order, the order the function scan inserts them in: two batches sharing
        // keys lock them in the same order, so they cannot deadlock.
        let firsts = event_keys::firsts(marks);
        let keys: Vec<&str> = firsts.iter().map(|m| m.key.as_str()).collect();
        let fingerprints: Vec<Option<&str>> =
            firsts.iter().map(|m| m.fingerprint.as_deref()).collect();
        // A pending batch's keys keep no decision (as a confirmed per-key pending mark).
        let decisions: Vec<Option<String>> = firsts
            .iter()
            .map(|m| event_keys::decision_text(m).filter(|_| pending.is_none()))
            .collect();
        let expiries: Vec<Option<DateTime<Utc>>> =
            firsts.iter().map(|m| m.expires_at(now)).collect();
        if cursor.is_none() {
            // The statement the last batch's shape suggests, when it can say alone.
            match BatchShape::load(&self.last_batch) {
                BatchShape::Fresh => {
                    if self
                        .copy_fresh(namespace, &firsts, &decisions, &expiries, now, pending)
                        .await?
                    {
                        return Ok(event_keys::all_new(marks, &firsts, now));
                    }
                }
                BatchShape::Seen => {
                    type Looked = (
                        String,
                        Option<String>,
                        Option<String>,
                        DateTime<Utc>,
                        Option<bool>,
                    );
                    let rows: Vec<Looked> = sqlx::query_as(EVENTS_LOOKUP_SQL)
                        .bind(namespace)
                        .bind(&keys)
                        .bind(micros(now))
                        .fetch_all(&mut self.conn().await?)
                        .await
                        .map_err(|e| self.err(e))?;
                    if rows.len() == firsts.len() && !rows.iter().any(|r| r.4 == Some(true)) {
                        let mut found = Found::default();
                        for (key, fingerprint, decision, first_seen, _) in rows {
                            found.stored(key, fingerprint, decision, first_seen);
                        }
                        return Ok(found.verdicts(marks, now));
                    }
                    // A key absent or expired: marked below.
                }
                BatchShape::Mixed => {}
            }
            // A plain insert first; the upsert below when it cannot say (nothing written).
            type Tried = (
                i64,
                Option<String>,
                Option<String>,
                Option<String>,
                Option<DateTime<Utc>>,
                Option<bool>,
            );
            let tried: std::result::Result<Vec<Tried>, sqlx::Error> =
                sqlx::query_as(EVENTS_INSERT_SQL)
                    .bind(namespace)
                    .bind(&keys)
                    .bind(&fingerprints)
                    .bind(&decisions)
                    .bind(&expiries)
                    .bind(micros(now))
                    .bind(marker)
                    .bind(deadline)
                    .fetch_all(&mut self.conn().await?)
                    .await;
            match tried {
                Ok(rows) if !rows.iter().any(|r| r.5 == Some(true)) => {
                    let inserted = rows.first().map_or(0, |r| r.0);
                    let mut found = Found::default();
                    let mut present = std::collections::HashSet::new();
                    for (_, key, fingerprint, decision, first_seen, _) in rows {
                        if let (Some(key), Some(first_seen)) = (key, first_seen) {
                            present.insert(key.clone());
                            found.stored(key, fingerprint, decision, first_seen);
                        }
                    }
                    // Each key was found (at most one row: the primary key) or inserted:
                    // the plain INSERT writes every row it is given or fails whole. The
                    // rows are committed by now, so a mismatch must not become an error
                    // that reports them to no one.
                    debug_assert_eq!(inserted as usize + present.len(), firsts.len());
                    self.remember(BatchShape::of(present.len(), firsts.len()));
                    if present.is_empty() {
                        return Ok(event_keys::all_new(marks, &firsts, now));
                    }
                    for m in firsts.iter().filter(|m| !present.contains(m.key.as_str())) {
                        found.marked(m.key.clone());
                    }
                    return Ok(found.verdicts(marks, now));
                }
                // A found key has expired: taken over by the upsert.
                Ok(_) => {}
                // Another transaction committed one of the keys meanwhile.
                Err(sqlx::Error::Database(e))
                    if e.kind() == sqlx::error::ErrorKind::UniqueViolation => {}
                Err(e) => return Err(self.err(e)),
            }
        }
        self.remember(BatchShape::Mixed);
        let query = sqlx::query_as(EVENTS_MARK_SQL)
            .bind(namespace)
            .bind(&keys)
            .bind(&fingerprints)
            .bind(&decisions)
            .bind(&expiries)
            .bind(micros(now))
            .bind(marker)
            .bind(deadline);
        type Marked = (
            String,
            bool,
            bool,
            Option<String>,
            Option<String>,
            Option<DateTime<Utc>>,
        );
        let rows: Vec<Marked> = match cursor {
            None => query.fetch_all(&mut self.conn().await?).await,
            Some((name, to)) => {
                // The marks and the cursor's advance commit together.
                let mut conn = self.conn().await?;
                let mut tx = conn.begin().await.map_err(|e| self.err(e))?;
                let rows = query.fetch_all(&mut *tx).await.map_err(|e| self.err(e))?;
                advance(&mut tx, namespace, name, to)
                    .await
                    .map_err(|e| self.err(e))?;
                tx.commit().await.map(|()| rows)
            }
        }
        .map_err(|e| self.err(e))?;
        let mut found = Found::default();
        let mut unseen = Vec::new();
        for (key, is_new, present, fingerprint, decision, first_seen) in rows {
            match (is_new, present, first_seen) {
                (true, _, _) => found.marked(key),
                (false, true, Some(first_seen)) => {
                    found.stored(key, fingerprint, decision, first_seen)
                }
                _ => unseen.push(key),
            }
        }
        if !unseen.is_empty() {
            // Rare: committed by a concurrent batch after this statement's snapshot.
            let refs: Vec<&str> = unseen.iter().map(String::as_str).collect();
            let mut missing: std::collections::HashSet<String> = unseen.iter().cloned().collect();
            for (key, fingerprint, decision, first_seen) in
                self.read_events(namespace, &refs, now).await?
            {
                missing.remove(&key);
                found.stored(key, fingerprint, decision, first_seen);
            }
            if !missing.is_empty() {
                // Rarer: gone again before the read (the other batch took its marks back,
                // or they expired): marked anew here, never answered as a replay of a
                // mark nobody holds.
                let again: Vec<EventMark> = firsts
                    .iter()
                    .filter(|m| missing.contains(&m.key))
                    .map(|m| (*m).clone())
                    .collect();
                let verdicts =
                    Box::pin(self.mark_batch(namespace, &again, now, None, pending)).await?;
                for (m, v) in again.into_iter().zip(verdicts) {
                    match v {
                        EventVerdict::New => found.marked(m.key),
                        EventVerdict::Replay {
                            decision,
                            first_seen,
                        } => found.stored(m.key, None, decision.map(|d| d.to_string()), first_seen),
                        EventVerdict::Conflict {
                            stored_fingerprint,
                            first_seen,
                        } => found.stored(m.key, Some(stored_fingerprint), None, first_seen),
                    }
                }
            }
        }
        Ok(found.verdicts(marks, now))
    }
}

#[async_trait]
impl EventKeyStore for PostgresStore {
    /// The plain batch mark (no fingerprint, decision or TTL) keeps its own statement, as
    /// fast as a hand-written batch insert: `check_and_mark` joins back to the stored rows
    /// for replay/conflict, which a yes/no answer does not need.
    async fn mark_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        now: DateTime<Utc>,
    ) -> Result<Vec<bool>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // One round trip. Repeats inside the batch are removed here and the keys sent in
        // byte order, the order the function scan inserts them in: two batches sharing
        // keys lock them in the same order, so they cannot deadlock. RETURNING gives the
        // keys that were new, or whose earlier mark had expired (then re-marked, forever);
        // the first occurrence of each in the input is the one marked new.
        let mut unique: Vec<&str> = keys.iter().map(String::as_str).collect();
        unique.sort_unstable();
        unique.dedup();
        let now = micros(now);
        let new: Vec<String> = sqlx::query_scalar(
            "INSERT INTO event_keys AS e (namespace, event_key, first_seen) \
             SELECT $1, k, $3 FROM UNNEST($2::text[]) AS t(k) \
             ON CONFLICT (namespace, event_key) DO UPDATE SET \
               first_seen = EXCLUDED.first_seen, fingerprint = NULL, decision = NULL, \
               expires_at = NULL, pending = NULL \
             WHERE (e.expires_at IS NOT NULL AND e.expires_at <= EXCLUDED.first_seen) \
                OR EXISTS (SELECT 1 FROM event_pending d \
                           WHERE d.id = e.pending AND d.first_seen = e.first_seen \
                             AND d.deadline <= EXCLUDED.first_seen) \
             RETURNING event_key",
        )
        .bind(namespace)
        .bind(&unique)
        .bind(now)
        .fetch_all(&mut self.conn().await?)
        .await
        .map_err(|e| self.err(e))?;
        let mut new: std::collections::HashSet<&str> = new.iter().map(String::as_str).collect();
        Ok(keys.iter().map(|k| new.remove(k.as_str())).collect())
    }

    async fn check_and_mark(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
    ) -> Result<Vec<EventVerdict>> {
        self.mark_batch(namespace, marks, now, None, None).await
    }

    async fn check_and_mark_advancing(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        cursor: &str,
        to: &Cursor,
    ) -> Result<Vec<EventVerdict>> {
        self.mark_batch(namespace, marks, now, Some((cursor, to)), None)
            .await
    }

    /// The batch's pending state is one row of `event_pending` (migration 0008), which its
    /// keys name; they carry their real expiry and decision from the start.
    async fn check_and_mark_pending(
        &self,
        namespace: &str,
        marks: &[EventMark],
        now: DateTime<Utc>,
        batch: PendingBatch<'_>,
        cursor: Option<(&str, &Cursor)>,
    ) -> Result<Vec<EventVerdict>> {
        self.mark_batch(
            namespace,
            marks,
            now,
            cursor,
            Some((batch.marker, batch.deadline(now))),
        )
        .await
    }

    /// One row deleted: the batch's keys that still name it are confirmed at once (their
    /// real expiry and decision were stored with them).
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
        let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        // One transaction with `synchronous_commit` off: a confirmation lost to a server
        // crash leaves the batch unconfirmed, its keys expire with its timeout and are
        // reported `new` again (at least once, never lost), so it need not wait for a WAL
        // flush of its own. Whole: the batch's one row goes. Some of its keys only: those
        // keys stop naming it (looked up one at a time), the others stay pending.
        let confirm = || async {
            let mut conn = self.turn().await?;
            let mut tx = conn.begin().await?;
            sqlx::query("SET LOCAL synchronous_commit = off")
                .execute(&mut *tx)
                .await?;
            let done = if whole {
                let done =
                    sqlx::query("DELETE FROM event_pending WHERE namespace = $1 AND marker = $2")
                        .bind(namespace)
                        .bind(marker)
                        .execute(&mut *tx)
                        .await?;
                if done.rows_affected() > 0 {
                    keys.len() as u64
                } else {
                    0
                }
            } else {
                sqlx::query(
                    "UPDATE event_keys e SET pending = NULL \
                     FROM UNNEST($3::text[]) AS k(event_key), event_pending p \
                     WHERE p.namespace = $1 AND p.marker = $2 \
                       AND e.namespace = $1 AND e.event_key = k.event_key \
                       AND e.pending = p.id AND e.first_seen = p.first_seen",
                )
                .bind(namespace)
                .bind(marker)
                .bind(&names)
                .execute(&mut *tx)
                .await?
                .rows_affected()
            };
            tx.commit().await.map(|()| done)
        };
        // Owed for records already written: asked again (a connection lost, a pool busy
        // under load) before the keys are left to expire.
        let mut pause = Duration::from_millis(100);
        let mut tries = 0;
        loop {
            tries += 1;
            match confirm().await {
                Ok(n) => return Ok(n),
                Err(e) if tries < 4 && connection_refused(&e) => {
                    tracing::debug!("confirming a pending batch again: {e}");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                Err(e) => return Err(self.err(e)),
            }
        }
    }

    async fn forget_event_keys(&self, namespace: &str, keys: &[String]) -> Result<u64> {
        self.delete_event_keys(namespace, keys, None).await
    }

    async fn unmark_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        first_seen: DateTime<Utc>,
    ) -> Result<u64> {
        self.delete_event_keys(namespace, keys, Some(micros(first_seen)))
            .await
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
        // One statement: keys and expiries as parallel arrays; the rows still carrying
        // this gate's pending mark are locked in key order (the order every mark locks
        // them in, so no deadlock with a batch taking them over) and then updated through
        // their row ids (a TID scan). Joining the update to the locked rows by key let the
        // planner scan the whole namespace once per batch: 7 times slower at 600 k keys.
        let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        let expiries: Vec<Option<DateTime<Utc>>> =
            keys.iter().map(|(_, at)| at.map(micros)).collect();
        let done = sqlx::query(
            "WITH c AS ( \
               SELECT l.ctid AS row_id, k.expires_at \
               FROM unnest($2::text[], $3::timestamptz[]) AS k(event_key, expires_at) \
               JOIN event_keys l ON l.namespace = $1 AND l.event_key = k.event_key \
               WHERE l.decision = $4::jsonb \
               ORDER BY k.event_key FOR UPDATE OF l) \
             UPDATE event_keys e SET decision = NULL, expires_at = c.expires_at \
             FROM c WHERE e.ctid = c.row_id AND e.decision = $4::jsonb",
        )
        .bind(namespace)
        .bind(&names)
        .bind(&expiries)
        .bind(owner)
        .execute(&mut self.conn().await?)
        .await
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected())
    }

    async fn cursor(&self, namespace: &str, name: &str) -> Result<Option<Cursor>> {
        let row: Option<(String, String)> = sqlx::query_as(
            "SELECT position, value::text FROM event_cursors WHERE namespace = $1 AND name = $2",
        )
        .bind(namespace)
        .bind(name)
        .fetch_optional(&mut self.conn().await?)
        .await
        .map_err(|e| self.err(e))?;
        Ok(row.map(|(position, value)| Cursor::from_stored(position, &value)))
    }

    async fn advance_cursor(&self, namespace: &str, name: &str, to: &Cursor) -> Result<()> {
        let mut conn = self.conn().await?;
        advance(&mut conn, namespace, name, to)
            .await
            .map_err(|e| self.err(e))
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
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let rows = self.read_events(namespace, &refs, now).await?;
        Ok(event_keys::present(keys, rows.into_iter().map(|r| r.0)))
    }

    async fn record_decision(
        &self,
        namespace: &str,
        key: &str,
        decision: &serde_json::Value,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE event_keys SET decision = $3::text::jsonb \
             WHERE namespace = $1 AND event_key = $2",
        )
        .bind(namespace)
        .bind(key)
        .bind(decision.to_string())
        .execute(&mut self.conn().await?)
        .await
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected() > 0)
    }
}

#[cfg(test)]
mod tests {
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
