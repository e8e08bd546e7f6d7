//! Backfills: `idem run JOB --from D1 --to D2` runs every date of a range, each through the
//! guards like a single `idem run`, and sums up what happened.
//!
//! The CLI owns the loop (it holds the runner); this module owns the range and the tally,
//! so both stay testable without a store.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::model::{RunStatus, SkipReason};

use super::DateExpr;

/// The longest range one backfill may cover (about 100 years of days): a typo such as
/// `--from 0001-01-01` should not start three million runs.
pub const MAX_BACKFILL_DAYS: i64 = 36_600;

/// Resolves `--from` and `--to` (date expressions, in `tz` at `now`) into the inclusive
/// list of dates, oldest first. Errors name the flag.
pub fn backfill_dates(from: &str, to: &str, tz: Tz, now: DateTime<Utc>) -> Result<Vec<NaiveDate>> {
    let resolve = |flag: &str, s: &str| {
        DateExpr::parse(s)
            .map_err(|e| Error::config(format!("{flag}: {e}")))?
            .resolve(tz, now)
            .map_err(|e| Error::config(format!("{flag}: {e}")))
    };
    let (first, last) = (resolve("--from", from)?, resolve("--to", to)?);
    if first > last {
        return Err(Error::config(format!(
            "--from {first} is after --to {last}: a range goes from the older date to the newer"
        )));
    }
    let days = (last - first).num_days() + 1;
    if days > MAX_BACKFILL_DAYS {
        return Err(Error::config(format!(
            "--from {first} --to {last} covers {days} dates; a range covers at most \
             {MAX_BACKFILL_DAYS} (split it into several)"
        )));
    }
    Ok(first.iter_days().take(days as usize).collect())
}

/// What a backfill did.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct BackfillSummary {
    /// Dates that completed.
    pub completed: usize,
    /// Dates skipped, by reason (`time_window`, `duplicate_content_hash`, `in_progress`).
    pub skipped: BTreeMap<String, usize>,
    /// Dates that failed.
    pub failed: usize,
    /// The failed dates.
    pub failed_dates: Vec<NaiveDate>,
    /// Dates not run because the backfill was stopped (signal or store error).
    pub not_run: usize,
    /// The worst exit code of a date (0, 1, or 3 when a result could not be recorded).
    #[serde(skip)]
    pub worst_exit: u8,
}

impl BackfillSummary {
    /// Counts one date's outcome; `exit_code` is that run's own exit code.
    pub fn add(
        &mut self,
        date: NaiveDate,
        status: RunStatus,
        skip_reason: Option<&SkipReason>,
        exit_code: u8,
    ) {
        match status {
            RunStatus::Completed => self.completed += 1,
            RunStatus::Skipped => {
                let reason = skip_reason.map_or("unknown", |r| r.as_str());
                *self.skipped.entry(reason.to_string()).or_default() += 1;
            }
            RunStatus::Failed => {
                self.failed += 1;
                self.failed_dates.push(date);
            }
        }
        self.worst_exit = self.worst_exit.max(exit_code);
    }

    /// Dates skipped, all reasons together.
    pub fn skipped_total(&self) -> usize {
        self.skipped.values().sum()
    }

    /// 0 when no date failed, 1 when one did (3 when a result could not be recorded).
    pub fn exit_code(&self) -> u8 {
        if self.failed > 0 {
            self.worst_exit.max(crate::model::exit::RUN_FAILED)
        } else {
            self.worst_exit
        }
    }

    /// `3 completed, 2 skipped (time_window 1, in_progress 1), 1 failed`.
    pub fn line(&self) -> String {
        let mut line = format!(
            "{} completed, {} skipped",
            self.completed,
            self.skipped_total()
        );
        if !self.skipped.is_empty() {
            let reasons: Vec<String> = self
                .skipped
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect();
            line.push_str(&format!(" ({})", reasons.join(", ")));
        }
        line.push_str(&format!(", {} failed", self.failed));
        if !self.failed_dates.is_empty() {
            let dates: Vec<String> = self.failed_dates.iter().map(|d| d.to_string()).collect();
            line.push_str(&format!(" ({})", dates.join(", ")));
        }
        if self.not_run > 0 {
            line.push_str(&format!(", {} not run", self.not_run));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-03-10T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn ranges_are_inclusive_and_relative_dates_work() {
        let d = backfill_dates("2025-11-28", "2025-12-02", Tz::UTC, now()).unwrap();
        let s: Vec<String> = d.iter().map(|d| d.to_string()).collect();
        assert_eq!(
            s,
            [
                "2025-11-28",
                "2025-11-29",
                "2025-11-30",
                "2025-12-01",
                "2025-12-02"
            ]
        );
        assert_eq!(
            backfill_dates("today-2", "yesterday", Tz::UTC, now())
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            backfill_dates("2026-01-01", "2026-01-01", Tz::UTC, now())
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn bad_ranges_name_the_flag() {
        let e = |f: &str, t: &str| {
            backfill_dates(f, t, Tz::UTC, now())
                .unwrap_err()
                .to_string()
        };
        assert!(
            e("2026-01-02", "2026-01-01").contains("--from 2026-01-02 is after --to 2026-01-01")
        );
        assert!(e("soon", "2026-01-01").starts_with("--from: bad date \"soon\""));
        assert!(e("2026-01-01", "10000-01-01").starts_with("--to: bad date"));
        assert!(e("0001-01-01", "9999-12-31").contains("a range covers at most 36600"));
    }

    #[test]
    fn the_summary_counts_by_reason_and_fails_when_a_date_failed() {
        let d = |s: &str| crate::model::time::parse_day(s).unwrap();
        let mut sum = BackfillSummary::default();
        sum.add(d("2026-01-01"), RunStatus::Completed, None, 0);
        sum.add(
            d("2026-01-02"),
            RunStatus::Skipped,
            Some(&SkipReason::TimeWindow),
            0,
        );
        sum.add(
            d("2026-01-03"),
            RunStatus::Skipped,
            Some(&SkipReason::TimeWindow),
            0,
        );
        sum.add(
            d("2026-01-04"),
            RunStatus::Skipped,
            Some(&SkipReason::InProgress),
            0,
        );
        assert_eq!(sum.exit_code(), 0);
        sum.add(d("2026-01-05"), RunStatus::Failed, None, 1);
        assert_eq!(sum.exit_code(), 1);
        assert_eq!(
            sum.line(),
            "1 completed, 3 skipped (in_progress 1, time_window 2), 1 failed (2026-01-05)"
        );
    }
}
