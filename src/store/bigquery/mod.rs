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
//! * **Claims without a lock**: the claim is one script (one job, `scripts.rs`), not a
//!   transaction, so each of its statements commits by itself and is queued or re-run by
//!   BigQuery, never cancelled. Unless the lease is held and unexpired, a missing row is
//!   created *free* with `INSERT … WHERE NOT EXISTS` (two claims of a new scope may each
//!   create one: INSERTs never conflict), then one UPDATE takes *every* row of the scope
//!   with one new token above all of theirs, only if *no* row of the scope is held and
//!   unexpired in its snapshot. Overlapping UPDATEs of a lease table conflict and BigQuery
//!   re-runs the later one on the new data, so exactly one of the UPDATEs that see a scope
//!   free changes it. The script reads back the row with the highest token (the run won
//!   when it names its run id) with the guards' keys read after the claim
//!   ([`LeaseStore::claim_and_find`]). A claim that conflicts is sent again and then sees
//!   the lease held: `in_progress`, never a run failure. The check before the claim reads
//!   the lease row too ([`LedgerStore::find_keys_and_holder`]), so a held scope skips
//!   without any DML. docs/bigquery.md, "Why two runs never both hold a scope", argues it
//!   from the documented rules; `tests/common/bq_model.rs` models them.
//! * **Leases sharded over 16 tables** ([`LEASE_TABLES`], chosen by [`lease_shard`]), since
//!   BigQuery's DML queues and conflicts are per table: a fleet of runs firing at once
//!   spreads its claims and releases over 16 queues. A statement refused for a full queue
//!   (or a rate limit) did not run and is sent again with backoff (the connection's
//!   `QUOTA_RETRIES`, for every BigQuery call); quota and conflict errors that outlast their retries are reported as such, never as
//!   the store being unavailable. See docs/bigquery.md, "Fleets".
//! * **`finish` is one script, not a transaction** (one job): a lease that expires soon
//!   is extended first (fenced: `token` and holder); only while it is held for at least
//!   two more minutes are the ledger row and the keys inserted (each only if not there
//!   yet, so a finish sent again writes nothing twice), then the lease is released
//!   (fenced). Each statement is queued by BigQuery like any DML; a transaction would be
//!   cancelled by a conflicting claim of another scope on the same lease table. Keys are
//!   visible before the lease is free, never after ([`Error::LeaseLost`] when the fence
//!   failed; a run id recorded for another run writes nothing).
//!   Scripts bind no query parameters on the emulator, so their values are literals
//!   built in one place (`literals`: plain strings quoted, any other base64-encoded).
//!
//! [`LedgerStore::find_keys`]: super::LedgerStore::find_keys
//! [`LedgerStore::find_keys_and_holder`]: super::LedgerStore::find_keys_and_holder
//! [`LeaseStore::claim_and_find`]: super::LeaseStore::claim_and_find

use std::time::Duration;

use async_trait::async_trait;

use super::migrations::{self, Schema};
use super::{Capabilities, StoreBase};
use crate::error::{Error, Result};

use crate::backend::bigquery::{BigQueryUrl, Connection, FaultHook};

// One concern a file: `client` sends a statement (quota and conflict retries, errors),
// `statements` holds every statement and renders it for the dataset, `schema` creates and
// checks the tables, and one file per capability implements its trait.
mod client;
mod event_keys;
mod leases;
mod ledger;
mod literals;
mod maintenance;
mod schema;
mod scripts;
mod statements;

pub use schema::tables;
pub use schema::{lease_shard, LEASE_TABLES};
use statements::Statements;
pub use statements::FIND_KEYS_SQL;

/// Default limit for one store statement, polling included.
const STORE_TIMEOUT: Duration = Duration::from_secs(300);

/// The BigQuery store.
#[derive(Debug)]
pub struct BigQueryStore {
    conn: Connection,
    url: crate::backend::RedactedUrl,
    config: BigQueryUrl,
    sql: Statements,
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
            url: crate::backend::RedactedUrl::new(url),
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
}

#[async_trait]
impl StoreBase for BigQueryStore {
    fn kind(&self) -> &'static str {
        "bigquery"
    }

    fn location(&self) -> String {
        self.url.to_string()
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
