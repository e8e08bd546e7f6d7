//! The figures of a report: per processor (runs, Q1-Q3, guard effectiveness, shadow
//! measurement, keys, days) and in all, and the verdict they lead to.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::options::ScaledThresholds;

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
    /// Runs holding their scope now, not recorded yet (from the leases not released).
    pub running_runs: i64,
    /// Runs whose lease expired without a result (killed, or their host lost).
    pub abandoned_runs: i64,
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
    /// The oldest keys these figures count: written since this instant (the period's
    /// start, or five weeks back when that is earlier), or null for every key
    /// (`--all-keys`). The per-processor storage figures count the same keys.
    pub keys_since: Option<DateTime<Utc>>,
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
