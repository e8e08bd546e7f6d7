//! SQLite store (sqlx): the embedded default.
//!
//! The file is created and migrated on first use, in WAL mode with a busy timeout, so
//! several `idem` processes can share one file: a claim is one `INSERT … ON CONFLICT DO
//! UPDATE … WHERE expired RETURNING token` statement, which SQLite runs under its single
//! writer lock, so exactly one process wins. `finish` is one transaction.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::sqlite::{SqliteConnection, SqlitePool, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{Connection, Row};

use super::{
    lease_expiry, Capabilities, Claim, ClaimRequest, CleanupPolicy, CleanupReport, EventKeyStore,
    Finish, KeyLookup, Lease, LeaseHolder, LeaseStore, LedgerStore, MaintenanceStore, RunFilter,
    StoreBase,
};
use crate::error::{Error, Result};
use crate::model::{micros, KeyKind, KeyRecord, Mode, RunRecord, RunStatus, SkipReason};

/// Schema migrations, applied in order; `PRAGMA user_version` records the last applied.
const MIGRATIONS: &[&str] = &[include_str!("../../migrations/sqlite/0001_init.sql")];

/// The SQLite store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    url: String,
}

fn ts(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

fn from_ts(v: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(v).unwrap_or_default()
}

fn date(s: &str) -> NaiveDate {
    NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap_or_default()
}

impl SqliteStore {
    /// Opens `sqlite://PATH` (or `sqlite::memory:`), creating and migrating the file.
    pub async fn connect(url: &str) -> Result<Self> {
        let options = crate::backend::sqlite::connect_options(url)?
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(false);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .min_connections(0)
            .connect_with(options)
            .await
            .map_err(|e| Error::store(url, format!("cannot open sqlite database: {e}")))?;
        let store = SqliteStore {
            pool,
            url: url.to_string(),
        };
        store.migrate().await?;
        Ok(store)
    }

    /// The underlying pool (for the SQL processor when the warehouse is the store).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn err(&self, e: sqlx::Error) -> Error {
        let message = e.to_string();
        Error::from_sqlx(&self.url, "a statement", e, message)
    }

    /// The error of the ledger insert: a taken run id is [`Error::DuplicateRunId`].
    fn run_insert_err(&self, e: sqlx::Error, run_id: &str) -> Error {
        match &e {
            sqlx::Error::Database(db) if db.is_unique_violation() => Error::DuplicateRunId {
                store: self.url.clone(),
                run_id: run_id.to_string(),
            },
            _ => self.err(e),
        }
    }

    async fn current_holder(&self, processor: &str, scope: &str) -> Result<Option<LeaseHolder>> {
        let row = sqlx::query(
            "SELECT holder_run_id, token, acquired_at, expires_at FROM processing_leases \
             WHERE processor_name = ?1 AND scope = ?2",
        )
        .bind(processor)
        .bind(scope)
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(row.and_then(|r| {
            let holder: Option<String> = r.get(0);
            holder.map(|run_id| LeaseHolder {
                run_id,
                token: r.get(1),
                acquired_at: from_ts(r.get(2)),
                expires_at: from_ts(r.get(3)),
            })
        }))
    }
}

async fn apply_migrations(conn: &mut SqliteConnection) -> std::result::Result<(), sqlx::Error> {
    let version: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut *conn)
        .await?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
        let statements = crate::backend::prepare(sql, crate::backend::Dialect::Sqlite)
            .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
        for statement in &statements {
            sqlx::query(&statement.sql).execute(&mut *conn).await?;
        }
        // PRAGMA takes no bound parameter; the value is our own constant.
        let pragma = format!("PRAGMA user_version = {}", i + 1);
        sqlx::query(&pragma).execute(&mut *conn).await?;
    }
    Ok(())
}

fn run_from_row(r: &SqliteRow) -> Result<RunRecord> {
    let output: Option<String> = r.get("output");
    Ok(RunRecord {
        run_id: r.get("run_id"),
        processor: r.get("processor_name"),
        scope: r.get("scope"),
        scope_date: date(r.get("scope_date")),
        trigger: r.get::<String, _>("trigger_source").parse()?,
        mode: r.get::<String, _>("mode").parse::<Mode>()?,
        started_at: from_ts(r.get("started_at")),
        finished_at: from_ts(r.get("finished_at")),
        duration_ms: r.get("duration_ms"),
        status: r.get::<String, _>("status").parse::<RunStatus>()?,
        skip_reason: r
            .get::<Option<String>, _>("skip_reason")
            .map(|s| SkipReason::parse(&s)),
        would_skip_reason: r
            .get::<Option<String>, _>("would_skip_reason")
            .map(|s| SkipReason::parse(&s)),
        previous_run_id: r.get("previous_run_id"),
        records_processed: r.get("records_processed"),
        processing_key: r.get("processing_key"),
        error: r.get("error"),
        output: output.and_then(|s| serde_json::from_str(&s).ok()),
    })
}

fn key_from_row(r: &SqliteRow) -> Result<KeyRecord> {
    let metadata: Option<String> = r.get("metadata");
    Ok(KeyRecord {
        key: r.get("processing_key"),
        kind: KeyKind::parse(r.get("kind"))?,
        processor: r.get("processor_name"),
        scope: r.get("scope"),
        scope_date: date(r.get("scope_date")),
        processed_at: from_ts(r.get("processed_at")),
        entity_count: r.get("entity_count"),
        metadata: metadata
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(serde_json::Value::Null),
        run_id: r.get("run_id"),
    })
}

const RUN_COLUMNS: &str = "run_id, processor_name, scope, scope_date, trigger_source, mode, \
    started_at, finished_at, duration_ms, status, skip_reason, would_skip_reason, \
    previous_run_id, records_processed, processing_key, error, output";

#[async_trait]
impl StoreBase for SqliteStore {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    fn describe(&self) -> String {
        self.url.clone()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::SHARED
    }

    async fn migrate(&self) -> Result<()> {
        let target = MIGRATIONS.len() as i64;
        let version: i64 = sqlx::query_scalar("PRAGMA user_version")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        if version >= target {
            return Ok(());
        }
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
impl LeaseStore for SqliteStore {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim> {
        let now = micros(request.now);
        let expires_at = lease_expiry(now, request.ttl);
        for _ in 0..3 {
            let token: Option<i64> = sqlx::query_scalar(
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
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
            if let Some(token) = token {
                return Ok(request.acquired(token, now, expires_at));
            }
            // Held: say by whom. It may have been released in between; then claim again.
            if let Some(holder) = self
                .current_holder(request.processor, request.scope)
                .await?
            {
                if holder.expires_at > now {
                    return Ok(Claim::Held(holder));
                }
            }
        }
        Err(Error::store(
            &self.url,
            "lease claim did not settle after 3 attempts",
        ))
    }

    async fn lease_holder(
        &self,
        processor: &str,
        scope: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<LeaseHolder>> {
        Ok(self
            .current_holder(processor, scope)
            .await?
            .filter(|h| h.expires_at > now))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration, now: DateTime<Utc>) -> Result<Lease> {
        let expires_at = lease_expiry(now, ttl);
        let done = sqlx::query(
            "UPDATE processing_leases SET expires_at = ?1 \
             WHERE processor_name = ?2 AND scope = ?3 AND token = ?4 AND holder_run_id = ?5",
        )
        .bind(ts(expires_at))
        .bind(&lease.processor)
        .bind(&lease.scope)
        .bind(lease.token)
        .bind(&lease.run_id)
        .execute(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        if done.rows_affected() == 1 {
            return Ok(Lease {
                expires_at,
                ..lease.clone()
            });
        }
        let holder = self.current_holder(&lease.processor, &lease.scope).await?;
        Err(lease.lost(holder.map(|h| h.run_id)))
    }

    async fn release(&self, lease: &Lease, now: DateTime<Utc>) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE processing_leases SET holder_run_id = NULL, expires_at = ?1 \
             WHERE processor_name = ?2 AND scope = ?3 AND token = ?4 AND holder_run_id = ?5",
        )
        .bind(ts(micros(now)))
        .bind(&lease.processor)
        .bind(&lease.scope)
        .bind(lease.token)
        .bind(&lease.run_id)
        .execute(&self.pool)
        .await
        .map_err(|e| self.err(e))?;
        Ok(done.rows_affected() == 1)
    }
}

#[async_trait]
impl LedgerStore for SqliteStore {
    async fn find_keys(&self, lookups: &[KeyLookup]) -> Result<Vec<Option<KeyRecord>>> {
        let mut out = Vec::with_capacity(lookups.len());
        for l in lookups {
            let row = sqlx::query(
                "SELECT processing_key, kind, processor_name, scope, scope_date, processed_at, \
                        entity_count, metadata, run_id \
                 FROM processing_keys \
                 WHERE processing_key = ?1 AND kind = ?2 AND processed_at >= ?3 \
                 ORDER BY processed_at DESC, id DESC LIMIT 1",
            )
            .bind(&l.key)
            .bind(l.kind.as_str())
            .bind(ts(l.since))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
            out.push(row.as_ref().map(key_from_row).transpose()?);
        }
        Ok(out)
    }

    async fn finish(&self, finish: &Finish) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(|e| self.err(e))?;
        if let Some(lease) = &finish.lease {
            let done = sqlx::query(
                "UPDATE processing_leases SET holder_run_id = NULL, expires_at = ?1 \
                 WHERE processor_name = ?2 AND scope = ?3 AND token = ?4 AND holder_run_id = ?5",
            )
            .bind(ts(micros(finish.run.finished_at)))
            .bind(&lease.processor)
            .bind(&lease.scope)
            .bind(lease.token)
            .bind(&lease.run_id)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
            if done.rows_affected() != 1 {
                tx.rollback().await.map_err(|e| self.err(e))?;
                let holder = self.current_holder(&lease.processor, &lease.scope).await?;
                return Err(lease.lost(holder.map(|h| h.run_id)));
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
        .bind(run.scope_date.format("%Y-%m-%d").to_string())
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
        .map_err(|e| self.run_insert_err(e, &run.run_id))?;
        if run.status == RunStatus::Completed {
            for k in &finish.keys {
                sqlx::query(
                    "INSERT INTO processing_keys (processing_key, kind, processor_name, scope, \
                       scope_date, processed_at, entity_count, metadata, run_id) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                )
                .bind(&k.key)
                .bind(k.kind.as_str())
                .bind(&k.processor)
                .bind(&k.scope)
                .bind(k.scope_date.format("%Y-%m-%d").to_string())
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
        // bound.
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM processing_runs \
             WHERE (?1 IS NULL OR processor_name = ?1) AND (?2 IS NULL OR scope = ?2) \
               AND (?3 IS NULL OR status = ?3) AND (?4 IS NULL OR started_at >= ?4) \
             ORDER BY started_at DESC, run_id DESC LIMIT ?5"
        );
        let rows = sqlx::query(&sql)
            .bind(&filter.processor)
            .bind(&filter.scope)
            .bind(filter.status.map(|s| s.as_str()))
            .bind(filter.since.map(ts))
            .bind(if filter.limit == 0 {
                -1
            } else {
                filter.limit as i64
            })
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        rows.iter().map(run_from_row).collect()
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
        const TABLES: [(&str, &str); 4] = [
            (
                "processing_keys",
                "processed_at < ?1 AND (?2 IS NULL OR processor_name = ?2) AND ?3 IS NOT NULL",
            ),
            (
                "processing_runs",
                "started_at < ?1 AND (?2 IS NULL OR processor_name = ?2) AND run_id NOT IN \
                 (SELECT run_id FROM processing_keys WHERE processed_at >= ?3)",
            ),
            (
                "processing_leases",
                "expires_at < ?1 AND (?2 IS NULL OR processor_name = ?2) AND ?3 IS NOT NULL",
            ),
            (
                "event_keys",
                "first_seen < ?1 AND ?2 IS NULL AND ?3 IS NOT NULL",
            ),
        ];
        let cutoffs = [
            policy.keys_before,
            policy.runs_before,
            policy.leases_before,
            policy.keys_before,
        ];
        let mut counts = [0u64; 4];
        for (i, (table, condition)) in TABLES.iter().enumerate() {
            if policy.dry_run {
                let sql = format!("SELECT count(*) FROM {table} WHERE {condition}");
                let n: i64 = sqlx::query_scalar::<_, i64>(&sql)
                    .bind(ts(cutoffs[i]))
                    .bind(policy.processor.as_deref())
                    .bind(ts(policy.keys_before))
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?;
                counts[i] = n as u64;
                continue;
            }
            // One bounded batch per statement, each its own transaction.
            let sql = format!(
                "DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {condition} LIMIT ?4)"
            );
            loop {
                let done = sqlx::query(&sql)
                    .bind(ts(cutoffs[i]))
                    .bind(policy.processor.as_deref())
                    .bind(ts(policy.keys_before))
                    .bind(policy.limit())
                    .execute(&self.pool)
                    .await
                    .map_err(|e| self.err(e))?
                    .rows_affected();
                counts[i] += done;
                if done < policy.limit() as u64 {
                    break;
                }
            }
        }
        Ok(CleanupReport {
            keys_deleted: counts[0],
            runs_deleted: counts[1],
            leases_deleted: counts[2],
            event_keys_deleted: counts[3],
        })
    }
}

#[async_trait]
impl EventKeyStore for SqliteStore {
    async fn mark_event_keys(
        &self,
        namespace: &str,
        keys: &[String],
        now: DateTime<Utc>,
    ) -> Result<Vec<bool>> {
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        let mut tx = conn.begin().await.map_err(|e| self.err(e))?;
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            let done = sqlx::query(
                "INSERT INTO event_keys (namespace, event_key, first_seen) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (namespace, event_key) DO NOTHING",
            )
            .bind(namespace)
            .bind(k)
            .bind(ts(now))
            .execute(&mut *tx)
            .await
            .map_err(|e| self.err(e))?;
            out.push(done.rows_affected() == 1);
        }
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(out)
    }
}
