//! `idem report`: is the content hash worth it, per processor, measured from the ledger.
//!
//! The queries are the "Is This Needed?" and "Monitoring" queries of the design seed, over
//! `processing_runs` and `processing_keys`, kept per dialect as `.sql` files beside the
//! migrations (`sql/reports/<dialect>/*.sql`) with every value bound as a parameter:
//!
//! * `duplicates` (Q1): completed runs of a scope whose previous completed run finished
//!   more than the time window earlier, and how many processed identical record counts;
//! * `wasted` (Q2): completed scheduled runs that processed zero records, and the minutes
//!   they took at the processor's average duration of completed runs;
//! * `savings` (Q3): scopes completed more than once a day, and how many of those repeats
//!   had (nearly) the same record counts;
//! * `effectiveness`: invocations the content hash and the time window prevented, and the
//!   seconds that saved;
//! * `storage`: processing keys per processor, content keys written in the period;
//! * `shadow`: runs in shadow mode by the guard that would have skipped them, with their
//!   own durations.
//!
//! [`verdicts`](ProcessorReport::verdict) follow the seed's thresholds (per week, scaled
//! to the period); measured shadow figures replace the Q2/Q3 estimates when a processor ran
//! in shadow mode.

// A build with no SQL backend (`--features redis` alone) compiles the report but can run
// no query: the plumbing is unused there, not wrong.
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "bigquery")),
    allow(unused)
)]

use std::collections::BTreeMap;

use crate::backend::redact_url;
use crate::error::{Error, Result};

// The queries and their rows, the options, the figures assembled from the rows, the
// verdict rules, and the renderings each have a file.
mod assemble;
mod figures;
mod options;
mod queries;
mod render;
#[cfg(feature = "cli")]
pub(crate) use render::esc as html_escape;
mod rows;
mod verdict;

use assemble::assemble;
pub use figures::{
    Day, Duplicates, Effectiveness, Period, ProcessorReport, Report, Runs, Savings, Shadow, Source,
    Storage, StorageTotals, Verdict, Wasted, WouldSkip, MIN_ZERO_CHANGE_RUNS,
};
pub use options::{ReportOptions, ScaledThresholds, Thresholds};
#[cfg(feature = "bigquery")]
use queries::Conn;
use queries::{connect, query};
pub use queries::{sql, sql_for_console, QUERY_NAMES};
pub use render::{render, OutputFormat};
pub(crate) use verdict::num;
pub use verdict::REMOVE_AFTER_DAYS;

/// The SQL dialects the report queries exist in (BigQuery's queries are GoogleSQL with
/// named parameters; `{project}` and `{dataset}` stand for the store URL's validated ids;
/// SQLite's timestamps are INTEGER microseconds).
pub use crate::backend::Dialect;

/// The dialect of a store URL, for the report.
pub fn dialect_of_url(url: &str) -> Result<Dialect> {
    Dialect::of_url(url).ok_or_else(|| {
        Error::config(format!(
            "idem report reads the ledger with SQL: it needs a sqlite://, postgres:// or bigquery:// store, not {:?}",
            redact_url(url)
        ))
    })
}

/// Runs every report query against the ledger at `url` and decides the verdicts.
pub async fn run(url: &str, options: &ReportOptions) -> Result<Report> {
    if options.days == 0 {
        return Err(Error::config("--days must be at least 1"));
    }
    let conn = connect(url).await?;
    // The queries are independent: they run at once, on the pool's connections.
    let q = |name| query(&conn, url, name, options);
    let all = tokio::try_join!(
        q(QUERY_NAMES[0]),
        q(QUERY_NAMES[1]),
        q(QUERY_NAMES[2]),
        q(QUERY_NAMES[3]),
        q(QUERY_NAMES[4]),
        q(QUERY_NAMES[5]),
        q(QUERY_NAMES[6]),
    )?;
    let results = BTreeMap::from([
        (QUERY_NAMES[0], all.0),
        (QUERY_NAMES[1], all.1),
        (QUERY_NAMES[2], all.2),
        (QUERY_NAMES[3], all.3),
        (QUERY_NAMES[4], all.4),
        (QUERY_NAMES[5], all.5),
        (QUERY_NAMES[6], all.6),
    ]);
    let mut report = assemble(redact_url(url), options, &results);
    // Runs not in the ledger yet: the leases not released, running or abandoned.
    let store = crate::store::open(url).await?;
    let open = store.open_leases(options.job.as_deref()).await?;
    let now = chrono::Utc::now();
    for p in &mut report.processors {
        for lease in open.iter().filter(|l| l.processor == p.job) {
            if lease.running_at(now) {
                p.runs.running_runs += 1;
            } else {
                p.runs.abandoned_runs += 1;
            }
        }
    }
    #[cfg(feature = "bigquery")]
    #[allow(irrefutable_let_patterns)]
    if let Conn::Bigquery(bq, config) = &conn {
        let table = bq
            .rest("report.storage", || {
                bq.client()
                    .table()
                    .get(&config.project, &config.dataset, "processing_keys", None)
            })
            .await;
        match table {
            Ok(t) => report.storage.table_bytes = t.num_bytes.and_then(|n| n.parse().ok()),
            Err(e) => tracing::warn!("the size of processing_keys is unknown: {e}"),
        }
    }
    Ok(report)
}
