//! Dates a schedule can name: `YYYY-MM-DD`, `today`, `yesterday`, `today-N`.
//!
//! Relative dates are evaluated in the job's time zone, at the scheduled instant when there
//! is one (`--scheduled-at`), else at the clock: a fire at 00:05 in Los Angeles that is
//! retried at 00:40 still processes the slot's `yesterday` when the retry carries the
//! slot's instant.

use std::fmt;

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;

use crate::error::{Error, Result};

/// The first date idem accepts (every store can hold it).
pub const MIN_DATE: NaiveDate = NaiveDate::from_ymd_opt(1, 1, 1).expect("a valid date");
/// The last date idem accepts.
pub const MAX_DATE: NaiveDate = NaiveDate::from_ymd_opt(9999, 12, 31).expect("a valid date");

/// A date as a schedule names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DateExpr {
    /// A calendar date.
    Fixed(NaiveDate),
    /// `today` (0), `yesterday` (1), `today-N` (N) in the job's zone.
    DaysAgo(u32),
}

const EXPECTED: &str = "expected YYYY-MM-DD, today, yesterday or today-N";

fn out_of_range(s: &str) -> String {
    format!("bad date {s:?}: out of range: dates lie between {MIN_DATE} and {MAX_DATE}")
}

impl DateExpr {
    /// The date the value of `flag` (`--date today-2`) names in `tz` at `now`; a usage
    /// error naming the flag when it names none.
    pub fn resolve_flag(flag: &str, value: &str, tz: Tz, now: DateTime<Utc>) -> Result<NaiveDate> {
        DateExpr::parse(value)
            .and_then(|e| e.resolve(tz, now).map_err(|e| e.to_string()))
            .map_err(|e| Error::input(format!("{flag}: {e}")))
    }

    /// Parses a date expression; the error says what is expected (the caller names the
    /// flag or field).
    pub fn parse(s: &str) -> std::result::Result<DateExpr, String> {
        let t = s.trim();
        match t.to_ascii_lowercase().as_str() {
            "today" => return Ok(DateExpr::DaysAgo(0)),
            "yesterday" => return Ok(DateExpr::DaysAgo(1)),
            _ => {}
        }
        if let Some(n) = t.to_ascii_lowercase().strip_prefix("today-") {
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!(
                    "bad date {s:?}: {EXPECTED} (N a whole number of days)"
                ));
            }
            return n
                .parse::<u32>()
                .map(DateExpr::DaysAgo)
                .map_err(|_| out_of_range(s));
        }
        if t.starts_with('+') {
            return Err(format!(
                "bad date {s:?}: a date has no '+' sign ({EXPECTED}; write {:?})",
                t.trim_start_matches('+')
            ));
        }
        // A negative or long year parses, then is refused by range, not by shape.
        let digits = t.trim_start_matches(['+', '-']);
        let parts: Vec<&str> = digits.split('-').collect();
        let shaped = parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            && parts[1].len() == 2
            && parts[2].len() == 2
            && parts[0].len() >= 4;
        if !shaped {
            return Err(format!("bad date {s:?}: {EXPECTED}"));
        }
        let long_or_signed = parts[0].len() > 4 || digits.len() != t.len();
        if long_or_signed || parts[0] == "0000" {
            // Validate month and day anyway, so "-5000-13-45" is reported as malformed.
            let valid_shape = parts[1].parse::<u32>().is_ok_and(|m| (1..=12).contains(&m))
                && parts[2].parse::<u32>().is_ok_and(|d| (1..=31).contains(&d));
            return Err(if valid_shape {
                out_of_range(s)
            } else {
                format!("bad date {s:?}: not a calendar date ({EXPECTED})")
            });
        }
        crate::model::time::parse_day(t)
            .map(DateExpr::Fixed)
            .map_err(|_| format!("bad date {s:?}: not a calendar date ({EXPECTED})"))
    }

    /// The date in zone `tz` at instant `at`.
    pub fn resolve(&self, tz: Tz, at: DateTime<Utc>) -> Result<NaiveDate> {
        let date = match *self {
            DateExpr::Fixed(d) => Some(d),
            DateExpr::DaysAgo(n) => at
                .with_timezone(&tz)
                .date_naive()
                .checked_sub_days(chrono::Days::new(n.into())),
        };
        match date {
            Some(d) if (MIN_DATE..=MAX_DATE).contains(&d) => Ok(d),
            _ => Err(Error::config(out_of_range(&self.to_string()))),
        }
    }
}

impl fmt::Display for DateExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DateExpr::Fixed(d) => write!(f, "{}", crate::model::time::day_text(*d)),
            DateExpr::DaysAgo(0) => f.write_str("today"),
            DateExpr::DaysAgo(1) => f.write_str("yesterday"),
            DateExpr::DaysAgo(n) => write!(f, "today-{n}"),
        }
    }
}

/// How far before now a Kubernetes Job's scheduled minute may lie and still be taken as
/// its slot: retries of a CronJob's Job come within hours; a manual Job named like one
/// (`kubectl create job --from=cronjob/…`) would otherwise be dated by its name.
const JOB_NAME_SLOT_AGE: i64 = 7 * 24 * 60;

/// `--scheduled-at`: an RFC 3339 instant, or `cronjob:JOB_NAME`, the name of the Job a
/// Kubernetes CronJob made for one slot, which ends with the slot's minute since the Unix
/// epoch (`idem-daily-sales-29390430`; the exports pass the pod's
/// `batch.kubernetes.io/job-name` label). A Job not named so (made by hand), or one whose
/// minute lies more than a week back or in the future, has no slot: a warning, and the
/// clock (`now`) decides as without the flag.
pub fn scheduled_instant(value: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>> {
    let Some(name) = value.trim().strip_prefix("cronjob:") else {
        return super::parse_instant("--scheduled-at", value);
    };
    let slot = name
        .rsplit_once('-')
        .and_then(|(_, minute)| minute.parse::<i64>().ok())
        .and_then(|minute| minute.checked_mul(60))
        .and_then(|secs| DateTime::<Utc>::from_timestamp(secs, 0))
        .filter(|slot| {
            let age = (now - *slot).num_minutes();
            (-1..=JOB_NAME_SLOT_AGE).contains(&age)
        });
    match slot {
        Some(slot) => Ok(slot),
        None => {
            tracing::warn!(
                "--scheduled-at cronjob:{name}: not the Job of a CronJob's recent slot (its \
                 name should end with the slot's minute since the epoch); the date is \
                 evaluated now"
            );
            Ok(now)
        }
    }
}

/// The date a run processes.
///
/// The expression is `date_flag` (`--date`), else the job's `date` field, else `today`
/// when `scheduled_at` is given; it is evaluated in `tz` at `scheduled_at`
/// (`--scheduled-at`, RFC 3339) when given, else at `now`. Errors name the flag or field.
pub fn run_date(
    date_flag: Option<&str>,
    job_default: Option<&str>,
    scheduled_at: Option<&str>,
    tz: Tz,
    now: DateTime<Utc>,
) -> Result<NaiveDate> {
    let at = match scheduled_at {
        Some(s) => scheduled_instant(s, now)?,
        None => now,
    };
    let (label, expr) = match (date_flag, job_default, scheduled_at) {
        (Some(d), _, _) => ("--date", d),
        (None, Some(d), _) => ("date", d),
        (None, None, Some(_)) => ("--scheduled-at", "today"),
        (None, None, None) => {
            return Err(Error::config(
                "no date to run: pass --date (YYYY-MM-DD, today, yesterday or today-N) or \
                 --scheduled-at, or set date = \"yesterday\" (or another date) in the job file",
            ))
        }
    };
    let field = |e: String| {
        if label == "date" {
            Error::config(format!("job field date: {e}"))
        } else {
            Error::config(format!("{label}: {e}"))
        }
    };
    let parsed = DateExpr::parse(expr).map_err(field)?;
    parsed.resolve(tz, at).map_err(|e| field(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cronjobs_job_name_dates_its_retries_by_its_slot() {
        // A 23:30 Europe/Paris job for "today": its slot 2026-03-07T22:30:00Z is minute
        // 29548710. A retry three hours later (past midnight in Paris) still runs the 7th.
        let tz: Tz = "Europe/Paris".parse().unwrap();
        let slot = at("2026-03-07T22:30:00Z");
        assert_eq!(slot.timestamp() / 60, 29_548_710);
        let retry = slot + chrono::Duration::hours(3);
        let name = "cronjob:idem-late-report-29548710";
        let date = |flag: Option<&str>| run_date(Some("today"), None, flag, tz, retry).unwrap();
        assert_eq!(date(Some(name)).to_string(), "2026-03-07");
        assert_eq!(
            date(None).to_string(),
            "2026-03-08",
            "without it, the clock's date"
        );
        // A Job made by hand, or a minute from long ago or ahead: the clock decides.
        for manual in [
            "cronjob:idem-late-report-manual-x7k2",
            "cronjob:idem-late-report-1",
            "cronjob:idem-late-report-99999999999",
            "cronjob:",
        ] {
            assert_eq!(date(Some(manual)).to_string(), "2026-03-08", "{manual}");
        }
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn la() -> Tz {
        "America/Los_Angeles".parse().unwrap()
    }

    #[test]
    fn expressions_round_trip() {
        for s in [
            "today",
            "yesterday",
            "today-7",
            "2026-03-08",
            "0001-01-01",
            "9999-12-31",
        ] {
            assert_eq!(DateExpr::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(DateExpr::parse("today-1").unwrap(), DateExpr::DaysAgo(1));
        assert_eq!(DateExpr::parse("Yesterday").unwrap(), DateExpr::DaysAgo(1));
    }

    #[test]
    fn relative_dates_are_the_zones_dates() {
        // 2026-03-08 06:30 UTC is still 7 March (22:30 PST) in Los Angeles.
        let t = at("2026-03-08T06:30:00Z");
        let d = |e: &str, tz: Tz| {
            DateExpr::parse(e)
                .unwrap()
                .resolve(tz, t)
                .unwrap()
                .to_string()
        };
        assert_eq!(d("today", Tz::UTC), "2026-03-08");
        assert_eq!(d("today", la()), "2026-03-07");
        assert_eq!(d("yesterday", la()), "2026-03-06");
        assert_eq!(d("today-30", Tz::UTC), "2026-02-06");
        assert_eq!(d("2020-02-29", la()), "2020-02-29");
    }

    #[test]
    fn bad_and_out_of_range_dates_are_refused() {
        for bad in [
            "",
            "tomorrow",
            "today+1",
            "today-",
            "today-x",
            "2026-3-8",
            "2026-02-30",
            "08/03/2026",
        ] {
            let e = DateExpr::parse(bad).unwrap_err();
            assert!(
                e.contains("expected YYYY-MM-DD, today, yesterday or today-N")
                    || e.contains("not a calendar date"),
                "{bad}: {e}"
            );
        }
        for far in [
            "-5000-01-01",
            "0000-01-01",
            "10000-01-01",
            "today-99999999999",
        ] {
            let e = DateExpr::parse(far).unwrap_err();
            assert!(
                e.contains("out of range: dates lie between 0001-01-01 and 9999-12-31"),
                "{far}: {e}"
            );
        }
        // A plus sign is not a range problem (issue 21.11).
        let e = DateExpr::parse("+2026-01-01").unwrap_err();
        assert!(
            e.contains("bad date \"+2026-01-01\": a date has no '+' sign")
                && e.contains("write \"2026-01-01\""),
            "{e}"
        );
        let e = DateExpr::parse("today-4000000")
            .unwrap()
            .resolve(Tz::UTC, at("2026-01-01T00:00:00Z"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("out of range"), "{e}");
    }

    #[test]
    fn run_date_prefers_the_flag_then_the_job_then_the_scheduled_instant() {
        let now = at("2026-03-10T12:00:00Z");
        let d = |flag, job, sched| run_date(flag, job, sched, la(), now).map(|d| d.to_string());
        assert_eq!(
            d(Some("2026-01-02"), Some("yesterday"), None).unwrap(),
            "2026-01-02"
        );
        assert_eq!(d(None, Some("yesterday"), None).unwrap(), "2026-03-09");
        assert_eq!(
            d(Some("today"), Some("yesterday"), None).unwrap(),
            "2026-03-10"
        );
        // A retry at 00:40 the next day of a 23:50 fire still processes the fire's date.
        let sched = Some("2026-03-09T23:50:00-07:00");
        assert_eq!(d(None, None, sched).unwrap(), "2026-03-09");
        assert_eq!(d(None, Some("yesterday"), sched).unwrap(), "2026-03-08");
        let e = d(None, None, None).unwrap_err().to_string();
        assert!(e.contains("--date"), "{e}");
        let e = d(Some("soon"), None, None).unwrap_err().to_string();
        assert!(e.starts_with("--date: bad date \"soon\""), "{e}");
        let e = d(None, Some("soon"), None).unwrap_err().to_string();
        assert!(e.starts_with("job field date: bad date \"soon\""), "{e}");
        let e = d(None, None, Some("yesterday")).unwrap_err().to_string();
        assert!(e.starts_with("--scheduled-at \"yesterday\""), "{e}");
    }
}
