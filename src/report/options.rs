//! What to report on, and the thresholds of the verdicts (per week, and scaled to the
//! period).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

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
    /// Storage figures over every key ever written (a scan of the whole key table), not
    /// only those since [`ReportOptions::keys_since`].
    pub all_keys: bool,
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
            all_keys: false,
        }
    }

    /// The period's start.
    pub fn since(&self) -> DateTime<Utc> {
        self.until - chrono::Duration::days(i64::from(self.days))
    }

    /// The oldest keys the storage figures count, so a report costs what its period holds,
    /// not the whole history: the period's start, or five weeks before its end when that is
    /// earlier (the verdict that removes the content hash asks whether it was on four weeks
    /// ago). `None` with [`ReportOptions::all_keys`]: every key.
    pub fn keys_since(&self) -> Option<DateTime<Utc>> {
        if self.all_keys {
            return None;
        }
        let look_back = self.until - chrono::Duration::days(i64::from(KEYS_LOOK_BACK_DAYS));
        Some(self.since().min(look_back))
    }

    /// [`ReportOptions::keys_since`] as the queries take it: the Unix epoch for every key.
    pub(super) fn keys_since_bound(&self) -> DateTime<Utc> {
        self.keys_since().unwrap_or(DateTime::UNIX_EPOCH)
    }
}

/// How far back the storage figures look at the least (see [`ReportOptions::keys_since`]):
/// the four weeks the content hash must have been on before the report suggests removing
/// it, and a week's margin for jobs that run weekly.
pub const KEYS_LOOK_BACK_DAYS: u32 = 35;

impl ReportOptions {}

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
