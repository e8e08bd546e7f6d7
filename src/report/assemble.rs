//! From the query results to the figures of each processor and the totals.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::figures::{
    Day, Duplicates, Effectiveness, Period, ProcessorReport, Report, Runs, Savings, Shadow, Source,
    Storage, StorageTotals, Verdict, Wasted, WouldSkip,
};
use super::options::{ReportOptions, ScaledThresholds};
use super::rows::{by_processor, float, int, text, time, Row};
use super::verdict::decide;

/// The report from the query results: the thresholds scaled to the period, then per
/// processor with runs its figures and verdict, then the storage totals.
pub(super) fn assemble(
    store: String,
    options: &ReportOptions,
    results: &BTreeMap<&str, Vec<Row>>,
) -> Report {
    let effectiveness = by_processor(&results["effectiveness"]);
    let duplicates = by_processor(&results["duplicates"]);
    let wasted = by_processor(&results["wasted"]);
    let savings = by_processor(&results["savings"]);
    let storage = by_processor(&results["storage"]);
    let thresholds = scaled_thresholds(options);
    let mut shadow = shadow_by_processor(&results["shadow"]);
    let mut daily = daily_by_processor(&results["daily"]);
    let days = period_days(options);

    let mut processors = Vec::new();
    for (job, e) in &effectiveness {
        let series = daily_series(daily.remove(job).unwrap_or_default(), &days);
        let empty = Row::new();
        let rows = ProcessorRows {
            effectiveness: e,
            duplicates: duplicates.get(job).copied().unwrap_or(&empty),
            wasted: wasted.get(job).copied().unwrap_or(&empty),
            savings: savings.get(job).copied().unwrap_or(&empty),
            storage: storage.get(job).copied().unwrap_or(&empty),
        };
        let mut p = processor_figures(job, &rows, shadow.remove(job).unwrap_or_default(), series);
        p.shadow.content_hash_minutes_saved = round2(p.shadow.content_hash_minutes_saved);
        decide(&mut p, options, &thresholds);
        processors.push(p);
    }

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
        storage: StorageTotals {
            keys_since: options.keys_since(),
            ..storage_totals(&storage)
        },
    }
}

/// The per-week thresholds scaled to the period's days.
fn scaled_thresholds(options: &ReportOptions) -> ScaledThresholds {
    let scale = f64::from(options.days) / 7.0;
    let t = &options.thresholds;
    ScaledThresholds {
        duplicate_runs: t.duplicate_runs * scale,
        identical_data_runs: t.identical_data_runs * scale,
        minutes_wasted: t.minutes_wasted * scale,
        high_confidence_prevents: t.high_confidence_prevents * scale,
        min_completed_runs: t.min_completed_runs,
        max_stddev: t.max_stddev,
        window_seconds: options.window.as_secs_f64(),
        per_week: t.clone(),
        config_file: options.config_file.clone(),
    }
}

/// The `shadow` query's rows, per processor: what each guard would have skipped.
fn shadow_by_processor(rows: &[Row]) -> BTreeMap<String, Shadow> {
    let mut shadow: BTreeMap<String, Shadow> = BTreeMap::new();
    for row in rows {
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
    shadow
}

/// The `daily` query's rows, per processor and day.
fn daily_by_processor(rows: &[Row]) -> BTreeMap<String, BTreeMap<String, Day>> {
    let mut daily: BTreeMap<String, BTreeMap<String, Day>> = BTreeMap::new();
    for row in rows {
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
    daily
}

/// Every UTC day of the period, `YYYY-MM-DD`.
fn period_days(options: &ReportOptions) -> Vec<String> {
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
}

/// A processor's days, one for every day of the period (zeros where it had no runs).
fn daily_series(mut per_day: BTreeMap<String, Day>, days: &[String]) -> Vec<Day> {
    days.iter()
        .map(|d| {
            per_day.remove(d).unwrap_or_else(|| Day {
                day: d.clone(),
                ..Day::default()
            })
        })
        .collect()
}

/// The rows of one processor, one per query (an empty row where a query has none).
struct ProcessorRows<'a> {
    effectiveness: &'a Row,
    duplicates: &'a Row,
    wasted: &'a Row,
    savings: &'a Row,
    storage: &'a Row,
}

/// One processor's figures, read from its rows; the verdict is still to be decided.
fn processor_figures(
    job: &str,
    rows: &ProcessorRows,
    shadow: Shadow,
    daily: Vec<Day>,
) -> ProcessorReport {
    let (e, d, w, s, k) = (
        rows.effectiveness,
        rows.duplicates,
        rows.wasted,
        rows.savings,
        rows.storage,
    );
    let scheduled_runs = int(w, "scheduled_runs");
    let zero_change_runs = int(w, "zero_change_runs");
    ProcessorReport {
        job: job.to_string(),
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
            running_runs: 0,
            abandoned_runs: 0,
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
        shadow,
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
        daily,
    }
}

/// The storage totals over every processor with keys.
fn storage_totals(storage: &BTreeMap<String, &Row>) -> StorageTotals {
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
    totals
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
