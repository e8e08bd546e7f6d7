//! What the backends share beyond the traits: the claim rounds of a store whose claim is
//! one conditional upsert, the cleanup walk over the four tables, and the statements the
//! sqlx stores share.

use std::future::Future;

use chrono::{DateTime, Utc};

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use super::retry::{retry, Backoff, Retry};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use super::rows::LeaseRow;
use super::CleanupReport;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use super::{Claim, ClaimRequest};
use super::{CleanupPolicy, CleanupProgress};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::error::Error;
use crate::error::Result;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
/// Claim rounds of an upsert claim: a lease released between the upsert and the read of
/// its holder is claimed again.
const UPSERT_CLAIM: Backoff = Backoff::immediate(3);

#[cfg(any(feature = "sqlite", feature = "postgres"))]
/// The claim of a store whose take is one statement (`INSERT … ON CONFLICT DO UPDATE …
/// WHERE free or expired RETURNING token`): `take()` runs it and gives the new token when
/// it won; otherwise `read()` says who holds the lease. `now` and `expires_at` are the
/// claim's times as stored.
pub(crate) async fn upsert_claim<T, R>(
    store: &str,
    request: &ClaimRequest<'_>,
    now: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    take: impl Fn() -> T,
    read: impl Fn() -> R,
) -> Result<Claim>
where
    T: Future<Output = Result<Option<i64>>>,
    R: Future<Output = Result<Option<LeaseRow>>>,
{
    let (take, read) = (&take, &read);
    retry(UPSERT_CLAIM, |_| async move {
        if let Some(token) = take().await? {
            return Ok(request.acquired(token, now, expires_at));
        }
        // Held: say by whom. It may have been released in between; then claim again.
        match read().await?.and_then(|r| r.held_at(now)) {
            Some(holder) => Ok(Claim::Held(holder)),
            None => Err(Retry::Again(Error::store(
                store,
                format!(
                    "lease claim did not settle after {} attempts",
                    UPSERT_CLAIM.attempts
                ),
            ))),
        }
    })
    .await
}

/// The tables a cleanup walks, in order, with what [`CleanupReport`] calls them.
pub(crate) const CLEANUP_TABLES: [&str; 4] = [
    "processing_keys",
    "processing_runs",
    "processing_leases",
    "event_keys",
];

/// Walks the four tables of a cleanup ([`CLEANUP_TABLES`]): for each, `count(i, cutoff)`
/// under `dry_run`, else `delete(i, cutoff)` — once, or (`batched`) again while a batch
/// came back full, each batch its own statement. `cutoff` is the table's cut-off. After
/// each statement the policy's progress callback hears the counts so far.
pub(crate) async fn cleanup_tables<C, D>(
    policy: &CleanupPolicy,
    batched: bool,
    mut count: impl FnMut(usize, DateTime<Utc>) -> C,
    mut delete: impl FnMut(usize, DateTime<Utc>) -> D,
) -> Result<CleanupReport>
where
    C: Future<Output = Result<u64>>,
    D: Future<Output = Result<u64>>,
{
    let cutoffs = [
        policy.keys_before,
        policy.runs_before,
        policy.leases_before,
        policy.keys_before,
    ];
    let batch = u64::try_from(policy.limit()).unwrap_or(u64::MAX);
    let mut counts = [0u64; 4];
    let mut total = 0;
    for (i, cutoff) in cutoffs.into_iter().enumerate() {
        loop {
            let done = if policy.dry_run {
                count(i, cutoff).await?
            } else {
                delete(i, cutoff).await?
            };
            counts[i] += done;
            total += done;
            let table_done = policy.dry_run || !batched || done < batch;
            policy.report_progress(CleanupProgress {
                table: CLEANUP_TABLES[i],
                rows: counts[i],
                total,
                table_done,
            });
            if table_done {
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

/// Tells the policy's progress callback the final count of each table of `report` (for a
/// store that deletes everything at once).
pub(crate) fn report_cleanup_done(policy: &CleanupPolicy, report: &CleanupReport) {
    let mut total = 0;
    for (table, rows) in CLEANUP_TABLES.into_iter().zip([
        report.keys_deleted,
        report.runs_deleted,
        report.leases_deleted,
        report.event_keys_deleted,
    ]) {
        total += rows;
        policy.report_progress(CleanupProgress {
            table,
            rows,
            total,
            table_done: true,
        });
    }
}

/// Statements the sqlx stores share — the lease read, the fenced lease updates, the
/// cleanup binds — as one text for SQLite and Postgres (SQLite reads `$n` as the n-th
/// parameter too), and the ledger insert's error.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) mod statements {
    use sqlx::query::Query;
    use sqlx::{Database, Encode, IntoArguments, Type};

    use crate::error::Error;
    use crate::store::Lease;

    /// The error of a ledger insert: a taken run id is [`Error::DuplicateRunId`], anything
    /// else what `other` makes of it.
    pub(crate) fn run_insert_error(
        store: &str,
        run_id: &str,
        e: sqlx::Error,
        other: impl FnOnce(sqlx::Error) -> Error,
    ) -> Error {
        match &e {
            sqlx::Error::Database(db) if db.is_unique_violation() => Error::DuplicateRunId {
                store: store.to_string(),
                run_id: run_id.to_string(),
            },
            _ => other(e),
        }
    }

    /// Reads the lease on (`$1`, `$2`): [`LEASE_COLUMNS`](crate::store::rows::LEASE_COLUMNS).
    pub(crate) const READ: &str = "SELECT holder_run_id, token, acquired_at, expires_at \
        FROM processing_leases WHERE processor_name = $1 AND scope = $2";

    /// Extends the lease to `$1`, its heartbeat at `$6` (bound after [`update`]'s).
    pub(crate) const RENEW: &str = "UPDATE processing_leases SET expires_at = $1, renewed_at = $6 \
        WHERE processor_name = $2 AND scope = $3 AND token = $4 AND holder_run_id = $5";

    /// The leases not released ([`OPEN_LEASE_COLUMNS`](crate::store::rows::OPEN_LEASE_COLUMNS)),
    /// of processor `$1` (NULL: all), newest claim first.
    pub(crate) const OPEN_LEASES: &str = "SELECT processor_name, scope, holder_run_id, token, \
        acquired_at, expires_at, renewed_at, holder_host, holder_pid FROM processing_leases \
        WHERE holder_run_id IS NOT NULL AND ($1 IS NULL OR processor_name = $1) \
        ORDER BY acquired_at DESC, processor_name, scope";

    /// Releases the lease at `$1`.
    pub(crate) const RELEASE: &str =
        "UPDATE processing_leases SET holder_run_id = NULL, expires_at = $1 \
        WHERE processor_name = $2 AND scope = $3 AND token = $4 AND holder_run_id = $5";

    /// A cleanup statement over one table ([`super::cleanup_tables`]): `$1` the table's
    /// cut-off, `$2` the processor (or NULL = all), `$3` the keys' cut-off, `$4` the
    /// cleanup's now (a key kept until then or later stays; instants as the store keeps
    /// them); a delete binds its batch size as `$5` after these.
    pub(crate) fn cleanup<'q, DB, T>(
        sql: &'q str,
        cutoff: T,
        processor: Option<&'q str>,
        (keys_before, now): (T, T),
    ) -> Query<'q, DB, <DB as Database>::Arguments<'q>>
    where
        DB: Database,
        T: 'q + Encode<'q, DB> + Type<DB>,
        Option<&'q str>: Encode<'q, DB> + Type<DB>,
        <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    {
        sqlx::query(sql)
            .bind(cutoff)
            .bind(processor)
            .bind(keys_before)
            .bind(now)
    }

    /// `sql` ([`RENEW`] or [`RELEASE`]) for `lease` at `at` (as the store keeps instants):
    /// it changes one row when the lease is still held with its token, none otherwise.
    pub(crate) fn update<'q, DB, T>(
        sql: &'q str,
        at: T,
        lease: &'q Lease,
    ) -> Query<'q, DB, <DB as Database>::Arguments<'q>>
    where
        DB: Database,
        T: 'q + Encode<'q, DB> + Type<DB>,
        &'q String: Encode<'q, DB> + Type<DB>,
        i64: Encode<'q, DB> + Type<DB>,
        <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    {
        sqlx::query(sql)
            .bind(at)
            .bind(&lease.processor)
            .bind(&lease.scope)
            .bind(lease.token)
            .bind(&lease.run_id)
    }
}
