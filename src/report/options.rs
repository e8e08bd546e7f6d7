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
