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
//!
//! [`LedgerStore::find_keys`]: super::LedgerStore::find_keys

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
mod maintenance;
mod schema;
mod statements;

pub use leases::{lease_shard, LEASE_TABLES};
pub use schema::tables;
use statements::Statements;
pub use statements::{FIND_KEYS_SQL, LEASE_TAKE_SQL};

/// Default limit for one store statement, polling included.
const STORE_TIMEOUT: Duration = Duration::from_secs(300);

/// The BigQuery store.
#[derive(Debug)]
pub struct BigQueryStore {
    conn: Connection,
    url: String,
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
