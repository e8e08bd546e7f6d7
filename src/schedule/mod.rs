//! Schedules: when a job fires, in which time zone, and which date a fire processes.
//!
//! A job's `schedule` is a cron expression read with [croner](https://docs.rs/croner):
//! standard 5-field crontab (`minute hour day-of-month month day-of-week`, where both `0`
//! and `7` are Sunday and `SUN`/`JAN` names, ranges, lists and steps work), the macros
//! `@yearly @annually @monthly @weekly @daily @midnight @hourly`, and 6- or 7-field
//! expressions that start with seconds (and end with years). The job's `timezone` (an IANA
//! name, default `UTC`) is the zone the expression is read in.
//!
//! **Daylight saving time is handled on purpose**, the way the Open Cron Pattern
//! Specification and Vixie cron handle it:
//!
//! * a fixed wall-clock time (single second, minute and hour, like `0 2 * * 0`) that a
//!   clock change skips fires once, at the first instant after the gap (02:30 on the
//!   spring-forward day in Los Angeles fires at 03:00 PDT);
//! * a fixed wall-clock time that happens twice (01:30 on the fall-back day) fires once,
//!   on its first pass;
//! * interval schedules (a wildcard or step in the second, minute or hour field, like
//!   `*/15 * * * *`) keep their interval in real time: they skip the wall-clock times that
//!   do not exist and fire in both passes of a repeated hour.
//!
//! Either way the *date* a fire processes is derived from the scheduled instant in the
//! job's zone ([`DateExpr`]), so a retry that lands after midnight still processes its
//! slot's date when it is given `--scheduled-at`.
//!
//! This module knows nothing of the runner or the stores. The CLI hands it
//! [`ScheduledJob`]s and prints what it returns; [`scheduler`] decides when `idem
//! scheduler` fires, and the CLI runs each fire.

mod backfill;
mod date;
pub mod export;
pub mod scheduler;

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, FixedOffset, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::Serialize;

use crate::error::{Error, Result};

pub use backfill::{backfill_dates, BackfillSummary, MAX_BACKFILL_DAYS};
pub use date::{run_date, DateExpr, MAX_DATE, MIN_DATE};
pub use scheduler::Missed;

/// A parsed cron expression.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    expr: String,
    /// The expression with macros expanded: 5, 6 or 7 fields.
    fields: Vec<String>,
    cron: Cron,
}

/// The macros and the 5-field expressions they stand for.
const MACROS: [(&str, &str); 7] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

/// Parses a cron expression: 5 fields as crontab, 6 with seconds first, 7 with seconds
/// first and years last, or one of the `@` macros.
pub fn parse_cron(expr: &str) -> Result<CronSchedule> {
    let bad = |why: String| Error::config(format!("invalid cron expression {expr:?}: {why}"));
    let trimmed = expr.trim();
    let expanded = if trimmed.starts_with('@') {
        MACROS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(trimmed))
            .map(|(_, five)| five.to_string())
            .ok_or_else(|| {
                bad(format!(
                    "unknown macro (expected one of {})",
                    MACROS.map(|(name, _)| name).join(", ")
                ))
            })?
    } else {
        trimmed.to_string()
    };
    let fields: Vec<String> = expanded.split_whitespace().map(str::to_string).collect();
    let (seconds, year) = match fields.len() {
        5 => (Seconds::Disallowed, Year::Disallowed),
        6 => (Seconds::Required, Year::Disallowed),
        7 => (Seconds::Required, Year::Required),
        n => {
            return Err(bad(format!(
                "{n} field(s); expected 5 (minute hour day-of-month month day-of-week), \
                 6 (with seconds first) or 7 (with seconds first and years last)"
            )))
        }
    };
    let cron = CronParser::builder()
        .seconds(seconds)
        .year(year)
        .build()
        .parse(&fields.join(" "))
        .map_err(|e| bad(lower_first(&e.to_string())))?;
    Ok(CronSchedule {
        expr: trimmed.to_string(),
        fields,
        cron,
    })
}

fn lower_first(s: &str) -> String {
    let mut chars = s.trim_end_matches('.').chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

impl CronSchedule {
    /// The expression as written.
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The expression in classic 5-field crontab form (what cron and Cloud Scheduler
    /// accept): macros expanded; a seconds field of `0` and a years field of `*` dropped.
    /// `None` when it needs seconds or years, or croner's extensions (`L`, `W`, `#`, `?`),
    /// that crontab cannot say.
    pub fn crontab_fields(&self) -> Option<String> {
        let f = &self.fields;
        let five = match f.len() {
            5 => &f[..],
            6 | 7 if f[0] == "0" && f.get(6).is_none_or(|y| y == "*") => &f[1..6],
            _ => return None,
        };
        // Day of month has no names, so any letter is an extension (L, W); day of week
        // has names (SUN, WED, ...) but not `#`, `?` or a trailing `L` after a digit.
        let dom_extension = five[2].chars().any(|c| c.is_ascii_alphabetic() || c == '?');
        let dow = five[4].to_ascii_uppercase();
        let dow_extension = dow.contains(['#', '?'])
            || dow == "L"
            || dow
                .as_bytes()
                .windows(2)
                .any(|w| w[0].is_ascii_digit() && w[1] == b'L');
        (!dom_extension && !dow_extension).then(|| five.join(" "))
    }

    /// The first fire time strictly after `after`, in `after`'s zone; `None` when the
    /// expression never fires again (a past year, or 30 February).
    pub fn next_after<Z: TimeZone>(&self, after: &DateTime<Z>) -> Option<DateTime<Z>> {
        self.cron.find_next_occurrence(after, false).ok()
    }

    /// The next `n` fire times strictly after `after`, in zone `tz`.
    pub fn upcoming(&self, tz: Tz, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Tz>> {
        let mut out = Vec::with_capacity(n);
        let mut cursor = after.with_timezone(&tz);
        while out.len() < n {
            match self.next_after(&cursor) {
                Some(t) if t > cursor => {
                    cursor = t;
                    out.push(t);
                }
                _ => break,
            }
        }
        out
    }
}

/// Parses an IANA time zone name (`America/Los_Angeles`, `UTC`).
pub fn parse_timezone(name: &str) -> Result<Tz> {
    Tz::from_str(name.trim()).map_err(|_| {
        Error::config(format!(
            "unknown time zone {name:?}: expected an IANA name such as UTC, Europe/Paris or \
             America/Los_Angeles"
        ))
    })
}

/// Parses an RFC 3339 instant (`2026-03-08T10:00:00Z`, `2026-03-08T02:00:00-08:00`) given
/// to `flag`.
pub fn parse_instant(flag: &str, value: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(value.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            Error::config(format!(
                "{flag} {value:?}: {e} (expected an RFC 3339 instant such as 2026-03-08T10:00:00Z)"
            ))
        })
}

/// What the schedule commands need to know of a job (the CLI builds it from the job file).
#[derive(Debug, Clone, Default)]
pub struct ScheduledJob {
    /// The job's name.
    pub name: String,
    /// Its `schedule`, as written.
    pub schedule: String,
    /// Its `timezone`, if set (default UTC).
    pub timezone: Option<String>,
    /// Its default `date` expression, if set.
    pub date: Option<String>,
    /// Its lease, if on.
    pub lease: Option<Duration>,
    /// The job file.
    pub path: PathBuf,
    /// What `idem scheduler` does with slots it missed.
    pub missed: Missed,
}

impl ScheduledJob {
    /// The job's zone.
    pub fn tz(&self) -> Result<Tz> {
        match &self.timezone {
            None => Ok(Tz::UTC),
            Some(name) => parse_timezone(name)
                .map_err(|e| Error::config(format!("job {}: timezone: {e}", self.name))),
        }
    }

    /// The job's schedule, parsed.
    pub fn cron(&self) -> Result<CronSchedule> {
        parse_cron(&self.schedule)
            .map_err(|e| Error::config(format!("job {}: schedule: {e}", self.name)))
    }

    /// The date expression a scheduled fire runs with: the job's `date`, else `today`.
    pub fn date_expr(&self) -> Result<DateExpr> {
        match &self.date {
            None => Ok(DateExpr::DaysAgo(0)),
            Some(d) => DateExpr::parse(d)
                .map_err(|e| Error::config(format!("job {}: date = {d:?}: {e}", self.name))),
        }
    }
}

/// One fire time, in the job's zone and in UTC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FireTime {
    /// In the job's zone, with its offset.
    pub local: DateTime<FixedOffset>,
    /// The zone's abbreviation then (`PST`, `PDT`, `UTC`).
    pub zone_abbreviation: String,
    /// The same instant in UTC.
    pub utc: DateTime<Utc>,
    /// The date a fire at this instant processes (the job's date expression there).
    pub date: chrono::NaiveDate,
}

/// A job's schedule and its next fire times.
#[derive(Debug, Clone, Serialize)]
pub struct JobPlan {
    /// The job.
    pub job: String,
    /// The expression as written.
    pub schedule: String,
    /// The IANA zone.
    pub timezone: String,
    /// The date expression each fire runs with.
    pub date: String,
    /// The next fire times.
    pub next: Vec<FireTime>,
}

/// Each job's next `n` fire times strictly after `after`, in job order.
pub fn plan(jobs: &[ScheduledJob], after: DateTime<Utc>, n: usize) -> Result<Vec<JobPlan>> {
    jobs.iter()
        .map(|job| {
            let tz = job.tz()?;
            let cron = job.cron()?;
            let date = job.date_expr()?;
            let next = cron
                .upcoming(tz, after, n)
                .into_iter()
                .map(|t| {
                    Ok(FireTime {
                        local: t.fixed_offset(),
                        zone_abbreviation: t.format("%Z").to_string(),
                        utc: t.with_timezone(&Utc),
                        date: date.resolve(tz, t.with_timezone(&Utc))?,
                    })
                })
                .collect::<Result<_>>()?;
            Ok(JobPlan {
                job: job.name.clone(),
                schedule: job.schedule.clone(),
                timezone: tz.name().to_string(),
                date: date.to_string(),
                next,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{Datelike, Timelike, Weekday};

    fn utc(s: &str) -> DateTime<Utc> {
        parse_instant("--after", s).unwrap()
    }

    fn la() -> Tz {
        parse_timezone("America/Los_Angeles").unwrap()
    }

    fn rfc(ts: &[DateTime<Tz>]) -> Vec<String> {
        ts.iter().map(|t| t.to_rfc3339()).collect()
    }

    #[test]
    fn sunday_is_0_and_7_monday_is_1() {
        let after = utc("2026-01-01T00:00:00Z"); // a Thursday
        for expr in ["0 6 * * 0", "0 6 * * 7", "0 6 * * SUN", "0 6 * * sun"] {
            let next = parse_cron(expr).unwrap().upcoming(Tz::UTC, after, 3);
            assert_eq!(
                rfc(&next),
                [
                    "2026-01-04T06:00:00+00:00",
                    "2026-01-11T06:00:00+00:00",
                    "2026-01-18T06:00:00+00:00"
                ],
                "{expr}"
            );
        }
        let monday = parse_cron("0 6 * * 1").unwrap().upcoming(Tz::UTC, after, 2);
        assert!(
            monday.iter().all(|t| t.weekday() == Weekday::Mon),
            "{monday:?}"
        );
        assert_eq!(monday[0].day(), 5);
        let weekdays = parse_cron("0 6 * * MON-FRI")
            .unwrap()
            .upcoming(Tz::UTC, after, 5);
        assert_eq!(
            weekdays.iter().map(|t| t.weekday()).collect::<Vec<_>>(),
            [
                Weekday::Thu,
                Weekday::Fri,
                Weekday::Mon,
                Weekday::Tue,
                Weekday::Wed
            ]
        );
        let weekend = parse_cron("0 6 * * 6-7")
            .unwrap()
            .upcoming(Tz::UTC, after, 2);
        assert_eq!(
            weekend.iter().map(|t| t.weekday()).collect::<Vec<_>>(),
            [Weekday::Sat, Weekday::Sun]
        );
    }

    #[test]
    fn ranges_lists_steps_names_and_macros() {
        let after = utc("2026-01-01T00:00:00Z");
        let every_20 = parse_cron("*/20 9-10 * * *")
            .unwrap()
            .upcoming(Tz::UTC, after, 7);
        assert_eq!(
            every_20
                .iter()
                .map(|t| (t.hour(), t.minute()))
                .collect::<Vec<_>>(),
            [
                (9, 0),
                (9, 20),
                (9, 40),
                (10, 0),
                (10, 20),
                (10, 40),
                (9, 0)
            ]
        );
        let list = parse_cron("15,45 1 1 JAN,jul *")
            .unwrap()
            .upcoming(Tz::UTC, after, 3);
        assert_eq!(
            rfc(&list),
            [
                "2026-01-01T01:15:00+00:00",
                "2026-01-01T01:45:00+00:00",
                "2026-07-01T01:15:00+00:00"
            ]
        );
        for (m, first) in [
            ("@yearly", "2027-01-01T00:00:00+00:00"),
            ("@annually", "2027-01-01T00:00:00+00:00"),
            ("@monthly", "2026-02-01T00:00:00+00:00"),
            ("@weekly", "2026-01-04T00:00:00+00:00"),
            ("@daily", "2026-01-02T00:00:00+00:00"),
            ("@midnight", "2026-01-02T00:00:00+00:00"),
            ("@hourly", "2026-01-01T01:00:00+00:00"),
            ("@DAILY", "2026-01-02T00:00:00+00:00"),
        ] {
            let next = parse_cron(m).unwrap().upcoming(Tz::UTC, after, 1);
            assert_eq!(rfc(&next), [first], "{m}");
        }
    }

    #[test]
    fn seconds_and_years() {
        let after = utc("2026-01-01T00:00:00Z");
        let secs = parse_cron("*/10 * * * * *")
            .unwrap()
            .upcoming(Tz::UTC, after, 2);
        assert_eq!(
            rfc(&secs),
            ["2026-01-01T00:00:10+00:00", "2026-01-01T00:00:20+00:00"]
        );
        let years = parse_cron("0 0 12 1 1 * 2028")
            .unwrap()
            .upcoming(Tz::UTC, after, 2);
        assert_eq!(rfc(&years), ["2028-01-01T12:00:00+00:00"]);
    }

    #[test]
    fn bad_expressions_name_the_expression() {
        for bad in [
            "61 9 * * *",
            "0 6 * * 8",
            "0 25 * * *",
            "* * *",
            "@fortnightly",
            "0 6 * * FUNDAY",
            "",
            "1 2 3 4 5 6 7 8",
        ] {
            let e = parse_cron(bad).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("invalid cron expression {bad:?}: ")),
                "{e}"
            );
        }
    }

    #[test]
    fn crontab_fields_drop_zero_seconds_and_any_year() {
        let f = |e: &str| parse_cron(e).unwrap().crontab_fields();
        assert_eq!(f("0 2 * * 0").as_deref(), Some("0 2 * * 0"));
        assert_eq!(f("@weekly").as_deref(), Some("0 0 * * 0"));
        assert_eq!(f("0 0 2 * * SUN").as_deref(), Some("0 2 * * SUN"));
        assert_eq!(f("0 0 2 * * SUN *").as_deref(), Some("0 2 * * SUN"));
        assert_eq!(f("*/10 * * * * *"), None);
        assert_eq!(f("0 0 2 * * SUN 2027"), None);
        assert_eq!(f("0 6 * JUL WED,SAT").as_deref(), Some("0 6 * JUL WED,SAT"));
        for extension in [
            "0 6 L * *",
            "0 6 15W * *",
            "0 6 ? * MON",
            "0 6 * * 5L",
            "0 6 * * FRI#2",
        ] {
            assert_eq!(f(extension), None, "{extension}");
        }
    }

    /// `0 2 * * 0` in Los Angeles across both 2026 clock changes (8 March: 02:00 does not
    /// exist; 1 November: 01:00-02:00 happens twice, 02:00 once).
    #[test]
    fn weekly_two_am_across_both_2026_dst_changes_in_los_angeles() {
        let cron = parse_cron("0 2 * * 0").unwrap();
        let spring = cron.upcoming(la(), utc("2026-02-25T00:00:00Z"), 4);
        assert_eq!(
            rfc(&spring),
            [
                "2026-03-01T02:00:00-08:00",
                "2026-03-08T03:00:00-07:00", // 02:00 is skipped by the clock: first instant after
                "2026-03-15T02:00:00-07:00",
                "2026-03-22T02:00:00-07:00",
            ]
        );
        let fall = cron.upcoming(la(), utc("2026-10-20T00:00:00Z"), 3);
        assert_eq!(
            rfc(&fall),
            [
                "2026-10-25T02:00:00-07:00",
                "2026-11-01T02:00:00-08:00", // once, after the repeated hour
                "2026-11-08T02:00:00-08:00",
            ]
        );
    }

    fn fires_on(cron: &str, tz: Tz, day: &str) -> Vec<String> {
        let date = crate::model::time::parse_day(day).unwrap();
        let after = utc(&format!("{}T00:00:00Z", date.pred_opt().unwrap()));
        parse_cron(cron)
            .unwrap()
            .upcoming(tz, after, 10)
            .into_iter()
            .filter(|t| t.date_naive() == date)
            .map(|t| t.to_rfc3339())
            .collect()
    }

    #[test]
    fn daily_fixed_times_fire_exactly_once_on_each_2026_dst_day() {
        // 02:30 does not exist on 8 March: it fires once, at the first instant after the gap.
        assert_eq!(
            fires_on("30 2 * * *", la(), "2026-03-08"),
            ["2026-03-08T03:00:00-07:00"]
        );
        assert_eq!(
            fires_on("30 2 * * *", la(), "2026-11-01"),
            ["2026-11-01T02:30:00-08:00"]
        );
        // 01:30 happens twice on 1 November: it fires once, on the first pass.
        assert_eq!(
            fires_on("30 1 * * *", la(), "2026-11-01"),
            ["2026-11-01T01:30:00-07:00"]
        );
        assert_eq!(
            fires_on("30 1 * * *", la(), "2026-03-08"),
            ["2026-03-08T01:30:00-08:00"]
        );
        // The days around keep their time.
        assert_eq!(
            fires_on("30 2 * * *", la(), "2026-03-09"),
            ["2026-03-09T02:30:00-07:00"]
        );
    }

    #[test]
    fn interval_schedules_keep_real_time_across_the_repeated_hour() {
        let fires = parse_cron("0 * * * *")
            .unwrap()
            .upcoming(la(), utc("2026-11-01T07:30:00Z"), 4);
        assert_eq!(
            rfc(&fires),
            [
                "2026-11-01T01:00:00-07:00",
                "2026-11-01T01:00:00-08:00",
                "2026-11-01T02:00:00-08:00",
                "2026-11-01T03:00:00-08:00",
            ]
        );
    }

    #[test]
    fn time_zones_are_iana_names() {
        assert_eq!(parse_timezone("UTC").unwrap(), Tz::UTC);
        assert_eq!(
            parse_timezone("Europe/Paris").unwrap().name(),
            "Europe/Paris"
        );
        let e = parse_timezone("Mars/Olympus").unwrap_err().to_string();
        assert!(e.contains("unknown time zone \"Mars/Olympus\""), "{e}");
    }

    #[test]
    fn plan_lists_local_and_utc_with_each_fire_date() {
        let job = ScheduledJob {
            name: "cleanup".into(),
            schedule: "0 2 * * 0".into(),
            timezone: Some("America/Los_Angeles".into()),
            date: Some("yesterday".into()),
            ..Default::default()
        };
        let plans = plan(&[job], utc("2026-03-02T00:00:00Z"), 1).unwrap();
        let fire = &plans[0].next[0];
        assert_eq!(fire.local.to_rfc3339(), "2026-03-08T03:00:00-07:00");
        assert_eq!(fire.zone_abbreviation, "PDT");
        assert_eq!(fire.utc.to_rfc3339(), "2026-03-08T10:00:00+00:00");
        assert_eq!(fire.date.to_string(), "2026-03-07");
        assert_eq!(plans[0].date, "yesterday");
    }
}
