//! `idem status`: the schedule and the ledger side by side. For a job with a schedule, the
//! scopes its schedule expected in a period (the same schedule, zone and `date` rule as
//! `idem schedule` and the scheduler), each with what the ledger says of it.
//!
//! A scope is:
//! * **completed** when a run of it completed, or a guard skipped one because the work
//!   was done (`time_window`, `content_hash`), whatever fired it (the scheduler, cron, a
//!   hand run, a backfill);
//! * **running** when its lease is held now;
//! * **failed** when its latest run failed (interrupted runs are recorded failed) and none
//!   completed;
//! * **missing** when none of that holds and its first slot is older than the tolerance;
//! * **not yet due** when its first slot is within the tolerance.
//!
//! Several slots can expect one scope (an hourly job with `date = "today"`): a scope is
//! listed once, due at its first slot.

use chrono::{DateTime, Duration as ChronoDuration, NaiveDate, TimeZone, Utc};
use chrono_tz::Tz;
use serde::Serialize;

use crate::error::Result;
use crate::model::{RunRecord, RunStatus, SkipReason};

use super::ScheduledJob;

/// What the ledger says of one expected scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeState {
    /// A run completed it (or a guard skipped a run because it was done).
    Completed,
    /// Its lease is held now.
    Running,
    /// A run held its lease and the lease expired without a result (the run was killed or
    /// its host lost), and none completed it since.
    Abandoned,
    /// Its latest run failed, and none completed.
    Failed,
    /// Nothing ran it, and its first slot is older than the tolerance.
    Missing,
    /// Its first slot is within the tolerance.
    NotYetDue,
}

impl ScopeState {
    /// The name `status` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeState::Completed => "completed",
            ScopeState::Running => "running",
            ScopeState::Abandoned => "abandoned",
            ScopeState::Failed => "failed",
            ScopeState::Missing => "missing",
            ScopeState::NotYetDue => "not_yet_due",
        }
    }

    /// Whether this scope makes `status` exit 1 (and `run --missing` run it).
    pub fn needs_attention(self) -> bool {
        matches!(
            self,
            ScopeState::Failed | ScopeState::Missing | ScopeState::Abandoned
        )
    }
}

/// One scope the schedule expected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExpectedScope {
    /// The scope (the date, `YYYY-MM-DD`).
    pub scope: String,
    /// Its date.
    pub date: NaiveDate,
    /// The first slot that expected it.
    pub due: DateTime<Utc>,
    /// What the ledger says.
    pub state: ScopeState,
    /// The run behind the state (the completed one, the latest failed one), if any.
    pub run_id: Option<String>,
}

/// The scopes a job's schedule expects in `[from, now]`, oldest first, each with the
/// first slot that expects it. A fixed `date` expects one scope however many slots.
pub fn expected_scopes(
    job: &ScheduledJob,
    from: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Vec<(NaiveDate, DateTime<Utc>)>> {
    let tz = job.tz()?;
    let cron = job.cron()?;
    let date = job.date_expr()?;
    let mut out: Vec<(NaiveDate, DateTime<Utc>)> = Vec::new();
    let mut after = (from - ChronoDuration::nanoseconds(1)).with_timezone(&tz);
    while let Some(slot) = cron.next_after(&after) {
        let at = slot.with_timezone(&Utc);
        if at > now {
            break;
        }
        let scope = date.resolve(tz, at)?;
        if !out.iter().any(|(d, _)| *d == scope) {
            out.push((scope, at));
        }
        // A date expression changes its date at local midnight only: the next slot that
        // can expect another scope is the first after the next midnight (an every-second
        // schedule costs a step per day, not per slot).
        after = next_midnight(tz, slot.date_naive()) - ChronoDuration::nanoseconds(1);
        if after <= slot {
            after = slot;
        }
    }
    out.sort();
    Ok(out)
}

/// The first instant of the day after `day` in `tz` (an hour later where midnight does not
/// exist, as on a DST change at midnight).
fn next_midnight(tz: Tz, day: NaiveDate) -> DateTime<Tz> {
    let next = day
        .succ_opt()
        .unwrap_or(day)
        .and_hms_opt(0, 0, 0)
        .unwrap_or_default();
    tz.from_local_datetime(&next)
        .earliest()
        .or_else(|| {
            tz.from_local_datetime(&(next + ChronoDuration::hours(1)))
                .earliest()
        })
        .unwrap_or_else(|| tz.from_utc_datetime(&next))
}

/// The scopes `job`'s schedule expected in `[from, now]` ([`expected_scopes`]), each with
/// its state from `runs` (the job's runs, any order) and those of its runs. Leases are not
/// asked: a caller that wants `running` asks for the scopes not completed and calls them
/// [`ScopeState::Running`] when held (the lease comes before everything but completion).
pub fn expected_states<'a>(
    job: &ScheduledJob,
    from: DateTime<Utc>,
    now: DateTime<Utc>,
    runs: &[&'a RunRecord],
    tolerance: std::time::Duration,
) -> Result<Vec<(ExpectedScope, Vec<&'a RunRecord>)>> {
    let mut out = Vec::new();
    for (date, due) in expected_scopes(job, from, now)? {
        let scope = crate::model::time::day_text(date);
        let of_scope: Vec<&RunRecord> = runs.iter().copied().filter(|r| r.scope == scope).collect();
        let (state, run_id) = scope_state(&of_scope, false, due, tolerance, now);
        let expected = ExpectedScope {
            scope,
            date,
            due,
            state,
            run_id,
        };
        out.push((expected, of_scope));
    }
    Ok(out)
}

/// The state of `scope` from its runs (any order) and whether its lease is held now.
pub fn scope_state(
    runs: &[&RunRecord],
    leased: bool,
    due: DateTime<Utc>,
    tolerance: std::time::Duration,
    now: DateTime<Utc>,
) -> (ScopeState, Option<String>) {
    let newest = |status: RunStatus| {
        runs.iter()
            .filter(|r| r.status == status)
            .max_by_key(|r| r.started_at)
    };
    if let Some(done) = newest(RunStatus::Completed) {
        return (ScopeState::Completed, Some(done.run_id.clone()));
    }
    // A guard that skipped a run because the work was done vouches for it.
    let done_before = runs
        .iter()
        .filter(|r| {
            r.status == RunStatus::Skipped
                && matches!(
                    r.skip_reason,
                    Some(SkipReason::TimeWindow) | Some(SkipReason::DuplicateContentHash)
                )
        })
        .max_by_key(|r| r.started_at);
    if let Some(skip) = done_before {
        return (
            ScopeState::Completed,
            skip.previous_run_id.clone().or(Some(skip.run_id.clone())),
        );
    }
    if leased {
        return (ScopeState::Running, None);
    }
    let latest = runs
        .iter()
        .filter(|r| r.status != RunStatus::Skipped)
        .max_by_key(|r| r.started_at);
    if let Some(failed) = latest.filter(|r| r.status == RunStatus::Failed) {
        return (ScopeState::Failed, Some(failed.run_id.clone()));
    }
    let tolerance = ChronoDuration::from_std(tolerance).unwrap_or(ChronoDuration::MAX);
    match due.checked_add_signed(tolerance) {
        Some(overdue) if overdue <= now => (ScopeState::Missing, None),
        _ => (ScopeState::NotYetDue, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(schedule: &str, date: Option<&str>, tz: Option<&str>) -> ScheduledJob {
        ScheduledJob {
            name: "j".into(),
            schedule: schedule.into(),
            date: date.map(str::to_string),
            timezone: tz.map(str::to_string),
            ..Default::default()
        }
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn days(v: &[(NaiveDate, DateTime<Utc>)]) -> Vec<String> {
        v.iter().map(|(d, _)| d.to_string()).collect()
    }

    #[test]
    fn a_daily_job_expects_one_scope_per_slot_by_its_date_rule() {
        let j = job("0 6 * * *", Some("yesterday"), Some("Europe/Paris"));
        let got =
            expected_scopes(&j, at("2026-11-20T00:00:00Z"), at("2026-11-23T12:00:00Z")).unwrap();
        assert_eq!(
            days(&got),
            ["2026-11-19", "2026-11-20", "2026-11-21", "2026-11-22"]
        );
        // 06:00 in Paris is 05:00 UTC in November.
        assert_eq!(got[0].1, at("2026-11-20T05:00:00Z"));
        // The slot at `now` exactly is expected; one after it is not.
        let got =
            expected_scopes(&j, at("2026-11-20T00:00:00Z"), at("2026-11-20T05:00:00Z")).unwrap();
        assert_eq!(days(&got), ["2026-11-19"]);
    }

    #[test]
    fn many_slots_of_one_date_expect_it_once_due_at_the_first() {
        let j = job("* * * * * *", None, Some("America/Los_Angeles"));
        let got =
            expected_scopes(&j, at("2026-11-20T12:00:00Z"), at("2026-11-22T12:00:00Z")).unwrap();
        assert_eq!(days(&got), ["2026-11-20", "2026-11-21", "2026-11-22"]);
        // The 21st begins at 08:00 UTC in Los Angeles.
        assert_eq!(got[1].1, at("2026-11-21T08:00:00Z"));
        let fixed = job("0 * * * *", Some("2026-01-01"), None);
        let got = expected_scopes(
            &fixed,
            at("2026-11-20T00:00:00Z"),
            at("2026-11-22T00:00:00Z"),
        )
        .unwrap();
        assert_eq!(days(&got), ["2026-01-01"]);
    }

    fn run(status: RunStatus, reason: Option<SkipReason>, started: &str) -> RunRecord {
        RunRecord {
            run_id: format!("run-{started}"),
            processor: "j".into(),
            scope: "2026-11-20".into(),
            scope_date: NaiveDate::from_ymd_opt(2026, 11, 20).unwrap(),
            trigger: crate::model::Trigger::Scheduler,
            mode: crate::model::Mode::Enforce,
            started_at: at(started),
            finished_at: at(started),
            duration_ms: 0,
            status,
            skip_reason: reason,
            would_skip_reason: None,
            previous_run_id: None,
            records_processed: None,
            processing_key: None,
            error: None,
            output: None,
        }
    }

    #[test]
    fn a_scope_state_comes_from_its_runs_its_lease_and_the_clock() {
        let due = at("2026-11-20T06:00:00Z");
        let now = at("2026-11-20T08:00:00Z");
        let hour = std::time::Duration::from_secs(3600);
        let state = |runs: &[RunRecord], leased: bool, now| {
            let refs: Vec<&RunRecord> = runs.iter().collect();
            scope_state(&refs, leased, due, hour, now).0
        };
        let failed = run(RunStatus::Failed, None, "2026-11-20T06:00:01Z");
        let done = run(RunStatus::Completed, None, "2026-11-20T06:30:00Z");
        let busy = run(
            RunStatus::Skipped,
            Some(SkipReason::InProgress),
            "2026-11-20T06:00:02Z",
        );
        let window = run(
            RunStatus::Skipped,
            Some(SkipReason::TimeWindow),
            "2026-11-20T07:00:00Z",
        );
        assert_eq!(state(&[], false, now), ScopeState::Missing);
        assert_eq!(
            state(&[], false, at("2026-11-20T06:59:59Z")),
            ScopeState::NotYetDue
        );
        assert_eq!(state(&[], true, now), ScopeState::Running);
        assert_eq!(
            state(std::slice::from_ref(&failed), false, now),
            ScopeState::Failed
        );
        assert_eq!(
            state(std::slice::from_ref(&failed), true, now),
            ScopeState::Running,
            "a retry runs"
        );
        assert_eq!(
            state(&[failed.clone(), done.clone()], false, now),
            ScopeState::Completed
        );
        assert_eq!(state(&[window], false, now), ScopeState::Completed);
        // Met another run's lease, which then ended without a result: not done.
        assert_eq!(
            state(std::slice::from_ref(&busy), false, now),
            ScopeState::Missing
        );
        assert_eq!(state(&[busy, failed], false, now), ScopeState::Failed);
    }
}
