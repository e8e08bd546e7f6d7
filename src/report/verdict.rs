//! The verdict rules: keep or remove a content hash that is on; enable, consider or not
//! need one that is off, from three signals measured or estimated.

use super::figures::{ProcessorReport, Source, Verdict, MIN_ZERO_CHANGE_RUNS};
use super::options::{ReportOptions, ScaledThresholds};

/// How long the content hash must have prevented nothing before the report says remove.
pub const REMOVE_AFTER_DAYS: u32 = 28;

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

pub(super) fn decide(p: &mut ProcessorReport, options: &ReportOptions, t: &ScaledThresholds) {
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
