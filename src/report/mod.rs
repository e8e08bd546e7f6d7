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
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::backend::redact_url;
use crate::error::{Error, Result};

mod render;

pub use render::{render, OutputFormat};

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

/// The names of the report queries, in report order.
pub const QUERY_NAMES: [&str; 7] = [
    "duplicates",
    "wasted",
    "savings",
    "effectiveness",
    "storage",
    "shadow",
    "daily",
];

/// The SQL text of report query `name` in `dialect`, with its parameters explained in the
/// comment at its top.
pub fn sql(name: &str, dialect: Dialect) -> Result<&'static str> {
    /// The report queries of one dialect, in [`QUERY_NAMES`] order, from `sql/reports/<dir>/`.
    macro_rules! queries {
        ($dir:literal) => {
            [
                include_str!(concat!("../../sql/reports/", $dir, "/duplicates.sql")),
                include_str!(concat!("../../sql/reports/", $dir, "/wasted.sql")),
                include_str!(concat!("../../sql/reports/", $dir, "/savings.sql")),
                include_str!(concat!("../../sql/reports/", $dir, "/effectiveness.sql")),
                include_str!(concat!("../../sql/reports/", $dir, "/storage.sql")),
                include_str!(concat!("../../sql/reports/", $dir, "/shadow.sql")),
                include_str!(concat!("../../sql/reports/", $dir, "/daily.sql")),
            ]
        };
    }
    const SQLITE: [&str; 7] = queries!("sqlite");
    const POSTGRES: [&str; 7] = queries!("postgres");
    const BIGQUERY: [&str; 7] = queries!("bigquery");
    let index = QUERY_NAMES.iter().position(|n| *n == name).ok_or_else(|| {
        Error::config(format!(
            "unknown report query {name:?}: expected one of {}",
            QUERY_NAMES.join(", ")
        ))
    })?;
    Ok(match dialect {
        Dialect::Sqlite => SQLITE[index],
        Dialect::Postgres => POSTGRES[index],
        Dialect::BigQuery => BIGQUERY[index],
    })
}

/// Query `name` in `dialect` with this report's values bound, ready to paste into a
/// console: for SQLite, `.parameter set` lines for the `sqlite3` shell before the query;
/// for Postgres, `PREPARE` / `EXECUTE` / `DEALLOCATE` for `psql`. The values stay
/// parameters either way.
pub fn sql_for_console(name: &str, dialect: Dialect, options: &ReportOptions) -> Result<String> {
    let text = sql(name, dialect)?.trim_end().trim_end_matches(';');
    let mut out = format!(
        "-- idem report --sql {name} --dialect {}: the {} days from {} to {}\n",
        dialect.as_str(),
        options.days,
        options.since().to_rfc3339(),
        options.until.to_rfc3339()
    );
    let extra = extra(name, options);
    match dialect {
        Dialect::Sqlite => {
            let job = match &options.job {
                // The shell evaluates the value as SQL: a quoted literal is text.
                Some(j) => format!("\"'{}'\"", j.replace('\'', "''").replace('"', "\\\"")),
                None => "NULL".to_string(),
            };
            out.push_str(".parameter init\n");
            out.push_str(&format!(
                ".parameter set ?1 {}\n",
                options.since().timestamp_micros()
            ));
            out.push_str(&format!(
                ".parameter set ?2 {}\n",
                options.until.timestamp_micros()
            ));
            out.push_str(&format!(".parameter set ?3 {job}\n"));
            match extra {
                Some(v) if name == "duplicates" => {
                    out.push_str(&format!(".parameter set ?4 {}\n", (v * 1e6) as i64))
                }
                Some(v) => out.push_str(&format!(".parameter set ?4 {v:?}\n")),
                None => {}
            }
            out.push_str(text);
            out.push_str(";\n");
        }
        Dialect::BigQuery => {
            let job = match &options.job {
                Some(j) => format!("'{}'", j.replace('\\', "\\\\").replace('\'', "\\'")),
                None => "NULL".to_string(),
            };
            out.push_str(&format!(
                "-- parameters: @since = TIMESTAMP '{}', @until = TIMESTAMP '{}', @job = {job}",
                options.since().to_rfc3339(),
                options.until.to_rfc3339()
            ));
            match extra {
                Some(v) if name == "duplicates" => {
                    out.push_str(&format!(", @window_seconds = {v:?}"))
                }
                Some(v) => out.push_str(&format!(", @max_stddev = {v:?}")),
                None => {}
            }
            out.push_str("\n-- (bq query --nouse_legacy_sql --parameter=NAME:TYPE:VALUE ...; replace {project}.{dataset})\n");
            out.push_str(text);
            out.push_str(";\n");
        }
        Dialect::Postgres => {
            let statement = format!("idem_report_{name}");
            let job = match &options.job {
                Some(j) => format!("'{}'", j.replace('\'', "''")),
                None => "NULL".to_string(),
            };
            let (types, extra_value) = match extra {
                Some(v) => ("timestamptz, timestamptz, text, float8", format!(", {v:?}")),
                None => ("timestamptz, timestamptz, text", String::new()),
            };
            out.push_str(&format!("PREPARE {statement} ({types}) AS\n{text};\n"));
            out.push_str(&format!(
                "EXECUTE {statement} ('{}', '{}', {job}{extra_value});\n",
                options.since().to_rfc3339(),
                options.until.to_rfc3339()
            ));
            out.push_str(&format!("DEALLOCATE {statement};\n"));
        }
    }
    Ok(out)
}

/// The seed's decision thresholds, **per week** (the report scales them to its period),
/// and the other knobs of the verdicts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Thresholds {
    /// Q1: more duplicate runs outside the window than this (per week) ...
    pub duplicate_runs: f64,
    /// ... with more identical-data runs than this (per week) is a moderate signal.
    pub identical_data_runs: f64,
    /// Q2 (or measured shadow time): more minutes wasted than this per week is strong.
    pub minutes_wasted: f64,
    /// Q3 (or measured shadow skips): more preventable runs than this per week is strong.
    pub high_confidence_prevents: f64,
    /// Fewer completed runs than this in the period: not enough data.
    pub min_completed_runs: u64,
    /// Q3: repeats whose records processed vary by less than this standard deviation
    /// count as identical content.
    pub max_stddev: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            duplicate_runs: 50.0,
            identical_data_runs: 10.0,
            minutes_wasted: 30.0,
            high_confidence_prevents: 20.0,
            min_completed_runs: 5,
            max_stddev: 1.0,
        }
    }
}

/// How long the content hash must have prevented nothing before the report says remove.
pub const REMOVE_AFTER_DAYS: u32 = 28;

/// What to report on.
#[derive(Debug, Clone)]
pub struct ReportOptions {
    /// The period's length in days, ending at `until`.
    pub days: u32,
    /// The period's end (exclusive); usually now.
    pub until: DateTime<Utc>,
    /// Only this processor (job).
    pub job: Option<String>,
    /// The time window the guards use (Q1 counts duplicates outside it).
    pub window: Duration,
    /// Per-week thresholds.
    pub thresholds: Thresholds,
    /// The config file whose `[report]` table set some of these values, if any (shown in
    /// the report).
    pub config_file: Option<String>,
}

impl ReportOptions {
    /// The last `days` days up to now, every processor, a 1 h window, the seed's
    /// thresholds.
    pub fn last_days(days: u32) -> Self {
        ReportOptions {
            days,
            until: Utc::now(),
            job: None,
            window: Duration::from_secs(3600),
            thresholds: Thresholds::default(),
            config_file: None,
        }
    }

    /// The period's start.
    pub fn since(&self) -> DateTime<Utc> {
        self.until - chrono::Duration::days(i64::from(self.days))
    }
}

/// The period a report covers.
#[derive(Debug, Clone, Serialize)]
pub struct Period {
    /// Start (inclusive).
    pub since: DateTime<Utc>,
    /// End (exclusive).
    pub until: DateTime<Utc>,
    /// Length in days.
    pub days: u32,
}

/// Thresholds scaled from per week to the period.
#[derive(Debug, Clone, Serialize)]
pub struct ScaledThresholds {
    /// Q1 duplicate runs.
    pub duplicate_runs: f64,
    /// Q1 identical-data runs.
    pub identical_data_runs: f64,
    /// Q2 minutes wasted.
    pub minutes_wasted: f64,
    /// Q3 high-confidence prevents.
    pub high_confidence_prevents: f64,
    /// Completed runs needed for a verdict.
    pub min_completed_runs: u64,
    /// Q3 standard deviation bound.
    pub max_stddev: f64,
    /// The time window, in seconds.
    pub window_seconds: f64,
    /// The thresholds as given, per week.
    pub per_week: Thresholds,
    /// The config file read (its `[report]` table), if any.
    pub config_file: Option<String>,
}

/// A processor's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Content hash off: all three signals: enable it.
    Enable,
    /// Content hash off: some signals: worth a look (or a shadow run).
    Consider,
    /// Content hash off: no signal: the time window is enough.
    NotNeeded,
    /// Content hash on and it prevents runs: keep it.
    Keep,
    /// Content hash on and it prevented nothing for four weeks: remove it.
    Remove,
    /// Too little history to tell.
    NotEnoughData,
}

impl Verdict {
    /// The name in JSON and text output.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Enable => "enable",
            Verdict::Consider => "consider",
            Verdict::NotNeeded => "not_needed",
            Verdict::Keep => "keep",
            Verdict::Remove => "remove",
            Verdict::NotEnoughData => "not_enough_data",
        }
    }
}

/// Where a verdict's figures come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// What guards did (skips) or would have done (shadow mode).
    Measured,
    /// Inferred from completed runs (Q1-Q3).
    Estimated,
}

/// Run counts of a processor in the period.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Runs {
    /// Every invocation.
    pub total_invocations: i64,
    /// Completed.
    pub completed_runs: i64,
    /// Failed.
    pub failed_runs: i64,
    /// Skipped by a guard.
    pub skipped_runs: i64,
    /// Run in shadow mode.
    pub shadow_runs: i64,
    /// Started by the scheduler and completed.
    pub scheduled_runs: i64,
    /// Average duration of completed runs, seconds (none without completed runs).
    pub avg_completed_seconds: Option<f64>,
}

/// Q1.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Duplicates {
    /// Completed runs whose scope's previous completed run finished more than the window
    /// earlier.
    pub duplicate_runs: i64,
    /// Of those, the runs that processed as many records as the previous one.
    pub identical_data_runs: i64,
    /// Average hours since the previous run's end.
    pub avg_hours_between_runs: Option<f64>,
}

/// Q2.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Wasted {
    /// Completed scheduled runs that processed zero records.
    pub zero_change_runs: i64,
    /// Their share of completed scheduled runs, percent.
    pub pct_wasted: f64,
    /// Their minutes at the average duration of completed scheduled runs; 0 unless there
    /// are more than [`MIN_ZERO_CHANGE_RUNS`] of them (seed 002's `HAVING`).
    pub minutes_wasted: f64,
    /// The average duration of completed scheduled runs, seconds.
    pub avg_scheduled_seconds: Option<f64>,
}

/// Q2 counts minutes wasted only for a processor with more zero-change scheduled runs than
/// this (seed 002: `HAVING zero_change_runs > 5`).
pub const MIN_ZERO_CHANGE_RUNS: i64 = 5;

/// Q3.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Savings {
    /// (scope, day) pairs completed more than once.
    pub dates_with_duplicates: i64,
    /// Repeats a content hash could have prevented.
    pub potential_prevented_runs: i64,
    /// Repeats whose records processed barely varied.
    pub high_confidence_prevents: i64,
}

/// What the guards prevented.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Effectiveness {
    /// Skipped with `duplicate_content_hash`.
    pub hash_prevented: i64,
    /// Skipped with `time_window`.
    pub window_prevented: i64,
    /// `hash_prevented` / invocations, percent.
    pub hash_prevention_pct: f64,
    /// `window_prevented` / invocations, percent.
    pub window_prevention_pct: f64,
    /// `hash_prevented` x average completed duration.
    pub hash_seconds_saved: f64,
    /// `window_prevented` x average completed duration.
    pub window_seconds_saved: f64,
}

/// Shadow-mode measurement: what each guard would have skipped.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Shadow {
    /// Runs in shadow mode.
    pub shadow_runs: i64,
    /// Per would-skip reason: runs and their own processing seconds.
    pub would_skip: BTreeMap<String, WouldSkip>,
    /// Runs the content hash would have skipped.
    pub content_hash_would_skip: i64,
    /// Their processing time, minutes.
    pub content_hash_minutes_saved: f64,
}

/// Runs one guard would have skipped in shadow mode.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WouldSkip {
    /// How many.
    pub runs: i64,
    /// Their own processing time, seconds.
    pub seconds: f64,
}

/// `processing_keys` of a processor.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Storage {
    /// Rows.
    pub total_keys: i64,
    /// Distinct keys.
    pub unique_keys: i64,
    /// Content-hash keys.
    pub content_keys: i64,
    /// Content-hash keys written in the period (the content hash is on).
    pub content_keys_in_period: i64,
    /// The oldest content key.
    pub oldest_content_key: Option<DateTime<Utc>>,
    /// The oldest key.
    pub oldest_key: Option<DateTime<Utc>>,
    /// The newest key.
    pub newest_key: Option<DateTime<Utc>>,
    /// Bytes the rows take (estimate).
    pub estimated_bytes: i64,
}

/// One processor's figures and verdict.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessorReport {
    /// Processor (job) name.
    pub job: String,
    /// The verdict.
    pub verdict: Verdict,
    /// `shadow` when the processor ran in shadow mode in the period, else `on` when
    /// content keys were written in the period, else `off`.
    pub content_hash: &'static str,
    /// Whether the verdict rests on measured or estimated figures.
    pub source: Source,
    /// Sentences with the figures behind the verdict.
    pub reasons: Vec<String>,
    /// Run counts.
    pub runs: Runs,
    /// Q1.
    pub duplicates: Duplicates,
    /// Q2.
    pub wasted: Wasted,
    /// Q3.
    pub savings: Savings,
    /// Guard effectiveness.
    pub effectiveness: Effectiveness,
    /// Shadow measurement.
    pub shadow: Shadow,
    /// Keys.
    pub storage: Storage,
    /// Runs per UTC day of the period (days without runs included, as zeros).
    pub daily: Vec<Day>,
}

/// One UTC day of a processor's runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Day {
    /// `YYYY-MM-DD`.
    pub day: String,
    /// Completed runs.
    pub completed: i64,
    /// Failed runs.
    pub failed: i64,
    /// Skipped runs.
    pub skipped: i64,
    /// Skipped by the content hash.
    pub skipped_content_hash: i64,
    /// Skipped by the time window.
    pub skipped_time_window: i64,
    /// Runs a guard would have skipped (shadow mode).
    pub would_skip: i64,
}

/// Storage totals over every processor.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StorageTotals {
    /// Rows of `processing_keys`.
    pub total_keys: i64,
    /// Distinct keys.
    pub unique_keys: i64,
    /// Processors with keys.
    pub processors: i64,
    /// The oldest key.
    pub oldest_key: Option<DateTime<Utc>>,
    /// The newest key.
    pub newest_key: Option<DateTime<Utc>>,
    /// Bytes the rows take (estimate).
    pub estimated_bytes: i64,
    /// The same in MB.
    pub estimated_mb: f64,
    /// BigQuery only: the size of `processing_keys` the tables API reports (`numBytes`);
    /// null elsewhere or when the API does not say.
    pub table_bytes: Option<i64>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The store, password removed.
    pub store: String,
    /// The period.
    pub period: Period,
    /// The job the report was asked for (`--job`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Thresholds scaled to the period.
    pub thresholds: ScaledThresholds,
    /// Per processor with runs in the period, by name.
    pub processors: Vec<ProcessorReport>,
    /// `processing_keys` totals.
    pub storage: StorageTotals,
}

/// A cell of a query result.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    Int(i64),
    Float(f64),
    Text(String),
}

type Row = BTreeMap<String, Cell>;

fn int(row: &Row, name: &str) -> i64 {
    match row.get(name) {
        Some(Cell::Int(v)) => *v,
        Some(Cell::Float(v)) => *v as i64,
        _ => 0,
    }
}

fn float(row: &Row, name: &str) -> Option<f64> {
    match row.get(name) {
        Some(Cell::Int(v)) => Some(*v as f64),
        Some(Cell::Float(v)) => Some(*v),
        _ => None,
    }
}

fn text(row: &Row, name: &str) -> Option<String> {
    match row.get(name) {
        Some(Cell::Text(s)) => Some(s.clone()),
        _ => None,
    }
}

fn time(row: &Row, name: &str) -> Option<DateTime<Utc>> {
    match row.get(name) {
        Some(Cell::Int(v)) => DateTime::from_timestamp_micros(*v),
        _ => None,
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn cells<R>(row: &R) -> Row
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> f64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    use sqlx::Column;
    let mut out = Row::new();
    for (i, column) in row.columns().iter().enumerate() {
        let cell = if let Ok(v) = row.try_get::<Option<i64>, _>(i) {
            v.map_or(Cell::Null, Cell::Int)
        } else if let Ok(v) = row.try_get::<Option<f64>, _>(i) {
            v.map_or(Cell::Null, Cell::Float)
        } else if let Ok(v) = row.try_get::<Option<String>, _>(i) {
            v.map_or(Cell::Null, Cell::Text)
        } else {
            Cell::Null
        };
        out.insert(column.name().to_string(), cell);
    }
    out
}

/// The extra parameter (after start, end, processor) of a query, if any.
fn extra(name: &str, options: &ReportOptions) -> Option<f64> {
    match name {
        "duplicates" => Some(options.window.as_secs_f64()),
        "savings" => Some(options.thresholds.max_stddev),
        _ => None,
    }
}

enum Conn {
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    #[cfg(feature = "bigquery")]
    Bigquery(
        Box<crate::backend::bigquery::Connection>,
        crate::backend::bigquery::BigQueryUrl,
    ),
}

async fn connect(url: &str) -> Result<Conn> {
    match dialect_of_url(url)? {
        #[cfg(feature = "sqlite")]
        Dialect::Sqlite => {
            // The store's own connect creates and migrates an empty ledger, so a report on a
            // fresh store says "no runs" rather than "no such table".
            let store = crate::store::sqlite::SqliteStore::connect(url).await?;
            Ok(Conn::Sqlite(store.pool().clone()))
        }
        #[cfg(feature = "postgres")]
        Dialect::Postgres => {
            let store = crate::store::postgres::PostgresStore::connect(url).await?;
            Ok(Conn::Postgres(store.pool().clone()))
        }
        #[cfg(feature = "bigquery")]
        Dialect::BigQuery => {
            use crate::backend::bigquery::{BigQueryUrl, Connection};
            use crate::store::bigquery::BigQueryStore;
            // Connecting migrates, so a fresh dataset has the tables (and no runs).
            BigQueryStore::connect(url).await?;
            let config = BigQueryUrl::parse(url)?;
            let conn = Connection::open(&config, Duration::from_secs(120))
                .await
                .map_err(|e| Error::store(redact_url(url), e))?;
            Ok(Conn::Bigquery(Box::new(conn), config))
        }
        #[allow(unreachable_patterns)]
        other => Err(Error::config(format!(
            "this build of idem has no {} support",
            other.as_str()
        ))),
    }
}

async fn query(conn: &Conn, url: &str, name: &str, options: &ReportOptions) -> Result<Vec<Row>> {
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    let fail = |e: sqlx::Error| {
        let message = e.to_string();
        Error::from_sqlx(
            &redact_url(url),
            &format!("the report query {name}"),
            e,
            message,
        )
    };
    match conn {
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(pool) => {
            let mut q = sqlx::query(sql(name, Dialect::Sqlite)?)
                .bind(options.since().timestamp_micros())
                .bind(options.until.timestamp_micros())
                .bind(options.job.clone());
            match extra(name, options) {
                // The SQLite window is in microseconds, like its timestamps.
                Some(v) if name == "duplicates" => q = q.bind((v * 1e6) as i64),
                Some(v) => q = q.bind(v),
                None => {}
            }
            let mut conn = pool.acquire().await.map_err(fail)?;
            // The report reads most of the ledger, on several connections at once: map the
            // file rather than copy it page by page into each one's small cache (most of the
            // time went to the kernel without this: 4.8 s of 9.4 over 1 M runs).
            sqlx::query("PRAGMA mmap_size = 1073741824")
                .execute(&mut *conn)
                .await
                .map_err(fail)?;
            let rows = q.fetch_all(&mut *conn).await.map_err(fail)?;
            Ok(rows.iter().map(cells).collect())
        }
        #[cfg(feature = "postgres")]
        Conn::Postgres(pool) => {
            let mut q = sqlx::query(sql(name, Dialect::Postgres)?)
                .bind(options.since())
                .bind(options.until)
                .bind(options.job.clone());
            if let Some(v) = extra(name, options) {
                q = q.bind(v);
            }
            let rows = q.fetch_all(pool).await.map_err(fail)?;
            Ok(rows.iter().map(cells).collect())
        }
        #[cfg(feature = "bigquery")]
        Conn::Bigquery(bq, config) => bigquery_query(bq, config, url, name, options).await,
        // A build without any SQL backend has no `Conn` to match: `connect` never makes one.
        #[allow(unreachable_patterns)]
        _ => unreachable!("no SQL backend in this build"),
    }
}

#[cfg(feature = "bigquery")]
async fn bigquery_query(
    bq: &crate::backend::bigquery::Connection,
    config: &crate::backend::bigquery::BigQueryUrl,
    url: &str,
    name: &str,
    options: &ReportOptions,
) -> Result<Vec<Row>> {
    use crate::backend::bigquery::{field_kind, opt_string, timestamp, Param};
    use gcp_bigquery_client::model::{
        query_parameter_type::QueryParameterType, query_parameter_value::QueryParameterValue,
    };
    let float = |name: &str, v: f64| Param {
        name: Some(name.to_string()),
        parameter_type: Some(QueryParameterType {
            array_type: None,
            struct_types: None,
            r#type: "FLOAT64".to_string(),
        }),
        parameter_value: Some(QueryParameterValue {
            array_values: None,
            struct_values: None,
            value: Some(format!("{v:?}")),
        }),
    };
    // Full-line comments are dropped: the emulator counts `@name` in comments as parameters.
    let text_sql = sql(name, Dialect::BigQuery)?
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("{project}", &config.project)
        .replace("{dataset}", &config.dataset);
    let mut params = vec![
        timestamp("since", options.since()),
        timestamp("until", options.until),
        opt_string("job", options.job.as_deref()),
    ];
    match extra(name, options) {
        Some(v) if name == "duplicates" => params.push(float("window_seconds", v)),
        Some(v) => params.push(float("max_stddev", v)),
        None => {}
    }
    let out = bq
        .query(&format!("the report query {name}"), &text_sql, params)
        .await
        .map_err(|e| Error::store(redact_url(url), e))?;
    let mut rows = Vec::new();
    for cells in &out.rows {
        let mut row = Row::new();
        for (field, value) in out.fields.iter().zip(cells) {
            let raw = match value {
                serde_json::Value::Null => None,
                serde_json::Value::String(s) => Some(s.clone()),
                other => Some(other.to_string()),
            };
            let cell = match (raw, field_kind(field)) {
                (None, _) => Cell::Null,
                (Some(s), "INT64") => s.parse().map(Cell::Int).unwrap_or(Cell::Text(s)),
                (Some(s), "FLOAT64" | "NUMERIC" | "BIGNUMERIC") => {
                    s.parse().map(Cell::Float).unwrap_or(Cell::Text(s))
                }
                (Some(s), _) => Cell::Text(s),
            };
            row.insert(field.name.clone(), cell);
        }
        rows.push(row);
    }
    Ok(rows)
}

fn by_processor(rows: &[Row]) -> BTreeMap<String, &Row> {
    rows.iter()
        .filter_map(|r| text(r, "processor_name").map(|p| (p, r)))
        .collect()
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
    #[cfg_attr(not(feature = "bigquery"), allow(unused_mut))]
    let mut report = assemble(redact_url(url), options, &results);
    #[cfg(feature = "bigquery")]
    #[allow(irrefutable_let_patterns)]
    if let Conn::Bigquery(bq, config) = &conn {
        let table = bq
            .rest(
                "report.storage",
                bq.client()
                    .table()
                    .get(&config.project, &config.dataset, "processing_keys", None),
            )
            .await;
        match table {
            Ok(t) => report.storage.table_bytes = t.num_bytes.and_then(|n| n.parse().ok()),
            Err(e) => tracing::warn!("the size of processing_keys is unknown: {e}"),
        }
    }
    Ok(report)
}

fn assemble(store: String, options: &ReportOptions, results: &BTreeMap<&str, Vec<Row>>) -> Report {
    let effectiveness = by_processor(&results["effectiveness"]);
    let duplicates = by_processor(&results["duplicates"]);
    let wasted = by_processor(&results["wasted"]);
    let savings = by_processor(&results["savings"]);
    let storage = by_processor(&results["storage"]);
    let scale = f64::from(options.days) / 7.0;
    let t = &options.thresholds;
    let thresholds = ScaledThresholds {
        duplicate_runs: t.duplicate_runs * scale,
        identical_data_runs: t.identical_data_runs * scale,
        minutes_wasted: t.minutes_wasted * scale,
        high_confidence_prevents: t.high_confidence_prevents * scale,
        min_completed_runs: t.min_completed_runs,
        max_stddev: t.max_stddev,
        window_seconds: options.window.as_secs_f64(),
        per_week: t.clone(),
        config_file: options.config_file.clone(),
    };
    let mut shadow: BTreeMap<String, Shadow> = BTreeMap::new();
    for row in &results["shadow"] {
        let Some(job) = text(row, "processor_name") else {
            continue;
        };
        let s = shadow.entry(job).or_default();
        let runs = int(row, "runs");
        let seconds = float(row, "duration_ms").unwrap_or(0.0) / 1000.0;
        s.shadow_runs += runs;
        if let Some(reason) = text(row, "would_skip_reason") {
            if reason == "duplicate_content_hash" {
                s.content_hash_would_skip += runs;
                s.content_hash_minutes_saved += seconds / 60.0;
            }
            s.would_skip.insert(reason, WouldSkip { runs, seconds });
        }
    }

    let mut daily: BTreeMap<String, BTreeMap<String, Day>> = BTreeMap::new();
    for row in &results["daily"] {
        let (Some(job), Some(day)) = (text(row, "processor_name"), text(row, "day")) else {
            continue;
        };
        let d = Day {
            day: day.clone(),
            completed: int(row, "completed"),
            failed: int(row, "failed"),
            skipped: int(row, "skipped"),
            skipped_content_hash: int(row, "skipped_content_hash"),
            skipped_time_window: int(row, "skipped_time_window"),
            would_skip: int(row, "would_skip"),
        };
        daily.entry(job).or_default().insert(day, d);
    }
    let days: Vec<String> = {
        let mut out = Vec::new();
        let mut d = options.since().date_naive();
        let last = (options.until - chrono::Duration::microseconds(1)).date_naive();
        while d <= last {
            out.push(crate::model::time::day_text(d));
            d = d.succ_opt().unwrap_or(last);
            if out.len() > 4000 {
                break;
            }
        }
        out
    };

    let mut processors = Vec::new();
    for (job, e) in &effectiveness {
        let mut per_day = daily.remove(job).unwrap_or_default();
        let series: Vec<Day> = days
            .iter()
            .map(|d| {
                per_day.remove(d).unwrap_or_else(|| Day {
                    day: d.clone(),
                    ..Day::default()
                })
            })
            .collect();
        let empty = Row::new();
        let d = duplicates.get(job).copied().unwrap_or(&empty);
        let w = wasted.get(job).copied().unwrap_or(&empty);
        let s = savings.get(job).copied().unwrap_or(&empty);
        let k = storage.get(job).copied().unwrap_or(&empty);
        let scheduled_runs = int(w, "scheduled_runs");
        let zero_change_runs = int(w, "zero_change_runs");
        let mut p = ProcessorReport {
            job: job.clone(),
            verdict: Verdict::NotEnoughData,
            content_hash: if int(e, "shadow_runs") > 0 {
                "shadow"
            } else if int(k, "content_keys_in_period") > 0 {
                "on"
            } else {
                "off"
            },
            source: Source::Estimated,
            reasons: Vec::new(),
            runs: Runs {
                total_invocations: int(e, "total_invocations"),
                completed_runs: int(e, "completed_runs"),
                failed_runs: int(e, "failed_runs"),
                skipped_runs: int(e, "skipped_runs"),
                shadow_runs: int(e, "shadow_runs"),
                scheduled_runs,
                avg_completed_seconds: float(e, "avg_completed_seconds"),
            },
            duplicates: Duplicates {
                duplicate_runs: int(d, "duplicate_runs"),
                identical_data_runs: int(d, "identical_data_runs"),
                avg_hours_between_runs: float(d, "avg_hours_between_runs"),
            },
            wasted: Wasted {
                zero_change_runs,
                pct_wasted: if scheduled_runs > 0 {
                    round1(100.0 * zero_change_runs as f64 / scheduled_runs as f64)
                } else {
                    0.0
                },
                minutes_wasted: float(w, "minutes_wasted").unwrap_or(0.0),
                avg_scheduled_seconds: float(w, "avg_duration_seconds"),
            },
            savings: Savings {
                dates_with_duplicates: int(s, "dates_with_duplicates"),
                potential_prevented_runs: int(s, "potential_prevented_runs"),
                high_confidence_prevents: int(s, "high_confidence_prevents"),
            },
            effectiveness: Effectiveness {
                hash_prevented: int(e, "hash_prevented"),
                window_prevented: int(e, "window_prevented"),
                hash_prevention_pct: float(e, "hash_prevention_pct").unwrap_or(0.0),
                window_prevention_pct: float(e, "window_prevention_pct").unwrap_or(0.0),
                hash_seconds_saved: float(e, "hash_seconds_saved").unwrap_or(0.0),
                window_seconds_saved: float(e, "window_seconds_saved").unwrap_or(0.0),
            },
            shadow: shadow.remove(job).unwrap_or_default(),
            storage: Storage {
                total_keys: int(k, "total_keys"),
                unique_keys: int(k, "unique_keys"),
                content_keys: int(k, "content_keys"),
                content_keys_in_period: int(k, "content_keys_in_period"),
                oldest_content_key: time(k, "oldest_content_key_at"),
                oldest_key: time(k, "oldest_key_at"),
                newest_key: time(k, "newest_key_at"),
                estimated_bytes: int(k, "estimated_bytes"),
            },
            daily: series,
        };
        p.shadow.content_hash_minutes_saved = round2(p.shadow.content_hash_minutes_saved);
        decide(&mut p, options, &thresholds);
        processors.push(p);
    }

    let mut totals = StorageTotals::default();
    for row in storage.values() {
        totals.total_keys += int(row, "total_keys");
        // Keys include the processor name, so distinct keys never repeat across processors.
        totals.unique_keys += int(row, "unique_keys");
        totals.processors += 1;
        totals.estimated_bytes += int(row, "estimated_bytes");
        totals.oldest_key = min_opt(totals.oldest_key, time(row, "oldest_key_at"));
        totals.newest_key = max_opt(totals.newest_key, time(row, "newest_key_at"));
    }
    totals.estimated_mb = round2(totals.estimated_bytes as f64 / (1024.0 * 1024.0));

    Report {
        store,
        period: Period {
            since: options.since(),
            until: options.until,
            days: options.days,
        },
        job: options.job.clone(),
        thresholds,
        processors,
        storage: totals,
    }
}

fn min_opt(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn max_opt(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// A threshold for people: whole numbers without decimals.
pub(crate) fn num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        format!("{v:.1}")
    }
}

fn signal(met: bool, strength: &str) -> String {
    if met {
        format!("{strength} signal")
    } else {
        "no signal".to_string()
    }
}

fn decide(p: &mut ProcessorReport, options: &ReportOptions, t: &ScaledThresholds) {
    let days = options.days;
    let window = humantime_secs(t.window_seconds);
    let shadow = p.shadow.shadow_runs > 0;

    if p.content_hash == "on" {
        p.source = Source::Measured;
        let e = &p.effectiveness;
        if e.hash_prevented > 0 {
            p.verdict = Verdict::Keep;
            p.reasons.push(format!(
                "the content hash prevented {} of {} invocations ({} %) in {days} days, saving {} s at the average completed duration",
                e.hash_prevented, p.runs.total_invocations, num(e.hash_prevention_pct), num(e.hash_seconds_saved)
            ));
            return;
        }
        let since_four_weeks = options.until - chrono::Duration::days(i64::from(REMOVE_AFTER_DAYS));
        let on_for_four_weeks = p
            .storage
            .oldest_content_key
            .is_some_and(|t| t <= since_four_weeks);
        if days >= REMOVE_AFTER_DAYS && on_for_four_weeks {
            p.verdict = Verdict::Remove;
            p.reasons.push(format!(
                "the content hash prevented none of {} invocations in {days} days (0 %) while writing {} content keys: it costs a lookup per run and storage, and saves nothing",
                p.runs.total_invocations, p.storage.content_keys_in_period
            ));
        } else {
            p.verdict = Verdict::NotEnoughData;
            p.reasons.push(format!(
                "the content hash prevented none of {} invocations in {days} days; removing it needs {REMOVE_AFTER_DAYS} days of it on and preventing nothing (try --days {REMOVE_AFTER_DAYS})",
                p.runs.total_invocations
            ));
        }
        return;
    }

    if p.runs.completed_runs < t.min_completed_runs as i64 {
        p.verdict = Verdict::NotEnoughData;
        p.source = if shadow {
            Source::Measured
        } else {
            Source::Estimated
        };
        p.reasons.push(format!(
            "only {} completed run(s) in {days} days ({} of {} invocations failed); a verdict needs at least {}",
            p.runs.completed_runs, p.runs.failed_runs, p.runs.total_invocations, t.min_completed_runs
        ));
        return;
    }

    let d = &p.duplicates;
    let moderate = d.duplicate_runs as f64 > t.duplicate_runs
        && d.identical_data_runs as f64 > t.identical_data_runs;
    p.reasons.push(format!(
        "{} duplicate run(s) outside the {window} window, {} with identical records (need > {} and > {} in {days} days): {}",
        d.duplicate_runs,
        d.identical_data_runs,
        num(t.duplicate_runs),
        num(t.identical_data_runs),
        signal(moderate, "moderate")
    ));

    let (minutes, prevents) = if shadow {
        p.source = Source::Measured;
        let s = &p.shadow;
        let minutes = s.content_hash_minutes_saved;
        let prevents = s.content_hash_would_skip;
        let strong_minutes = minutes > t.minutes_wasted;
        p.reasons.push(format!(
            "measured in shadow mode: the content hash would have skipped {prevents} of {} shadow run(s), saving {} minutes of their own processing time (need > {}): {}",
            s.shadow_runs, num(minutes), num(t.minutes_wasted), signal(strong_minutes, "strong")
        ));
        let strong_prevents = prevents as f64 > t.high_confidence_prevents;
        p.reasons.push(format!(
            "measured in shadow mode: {prevents} run(s) the content hash would have prevented (need > {}): {}",
            num(t.high_confidence_prevents),
            signal(strong_prevents, "strong")
        ));
        (strong_minutes, strong_prevents)
    } else {
        let w = &p.wasted;
        let strong_minutes = w.minutes_wasted > t.minutes_wasted;
        if p.runs.scheduled_runs == 0 {
            p.reasons.push(
                "no completed scheduled runs: nothing wasted on the schedule (Q2 counts scheduler runs only): no signal"
                    .to_string(),
            );
        } else {
            let below = if w.zero_change_runs <= MIN_ZERO_CHANGE_RUNS {
                format!(
                    " (no more than {MIN_ZERO_CHANGE_RUNS} such runs: not counted, as in seed 002)"
                )
            } else {
                String::new()
            };
            p.reasons.push(format!(
                "{} of {} scheduled run(s) processed zero records ({} %), {} minutes wasted at the scheduled runs' average duration of {} s{below} (need > {}): {}",
                w.zero_change_runs,
                p.runs.scheduled_runs,
                num(w.pct_wasted),
                num(w.minutes_wasted),
                num(w.avg_scheduled_seconds.unwrap_or(0.0)),
                num(t.minutes_wasted),
                signal(strong_minutes, "strong")
            ));
        }
        let s = &p.savings;
        let strong_prevents = s.high_confidence_prevents as f64 > t.high_confidence_prevents;
        p.reasons.push(format!(
            "{} run(s) repeated a scope on the same day, {} with records varying by less than {} (need > {}): {}",
            s.potential_prevented_runs,
            s.high_confidence_prevents,
            num(t.max_stddev),
            num(t.high_confidence_prevents),
            signal(strong_prevents, "strong")
        ));
        (strong_minutes, strong_prevents)
    };
    p.verdict = match (moderate, minutes, prevents) {
        (true, true, true) => Verdict::Enable,
        (false, false, false) => Verdict::NotNeeded,
        _ => Verdict::Consider,
    };
}

fn humantime_secs(secs: f64) -> String {
    let s = secs.round() as u64;
    if s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}
