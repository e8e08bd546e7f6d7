//! Schedules: when a job fires, in which time zone, and which date a fire processes.
//!
//! A job's `schedule` is a cron expression read with [croner](https://docs.rs/croner):
//! standard 5-field crontab (`minute hour day-of-month month day-of-week`, where both `0`
//! and `7` are Sunday and `SUN`/`JAN` names, ranges, lists and steps work), the macros
//! `@yearly @annually @monthly @weekly @daily @midnight @hourly`, and 6- or 7-field
//! expressions that start with seconds (and end with years). The job's `timezone` (an IANA
//! name, default `UTC`) is the zone the expression is read in.
//!
//! **Daylight saving time: every wall-clock time the expression lists fires exactly once.**
//! The expression is matched against wall-clock (local) times; then, for every
//! expression alike (fixed times, lists, ranges, steps, wildcards):
//!
//! * a wall-clock time that a clock change skips (02:30 on the spring-forward day in Los
//!   Angeles) fires once, at the first instant after the gap (03:00 PDT); several listed
//!   times in one gap (`0,30 1 * * *` in London on 29 March) land on that same instant and
//!   fire there once, together;
//! * a wall-clock time that happens twice (01:30 on the fall-back day) fires once, on its
//!   first pass; the second pass of the repeated hour fires nothing (so `*/15 * * * *`
//!   pauses for that hour, and `30 1,2 * * *` fires 01:30 once and 02:30 once).
//!
//! No listed time is dropped and none fires twice, whichever fields hold lists, ranges or
//! steps: a scheduled date is never lost or doubled by a clock change.
//!
//! **Day of month and day of week** combine as in Vixie cron and cronie: when either field
//! starts with `*` (`*`, `*/2`), a day must match both; when both are restricted (`1,15`
//! and `MON`), a day matching either fires. `0 9 */2 * MON` fires on odd days that are
//! Mondays. An expression that can never fire (`0 9 31 2 *`) is refused.
//!
//! The *date* a fire processes is derived from the scheduled instant in the
//! job's zone ([`DateExpr`]), so a retry that lands after midnight still processes its
//! slot's date when it is given `--scheduled-at`.
//!
//! This module knows nothing of the runner or the stores. The CLI hands it
//! [`ScheduledJob`]s and prints what it returns; [`scheduler`] decides when `idem
//! scheduler` fires, and the CLI runs each fire.

mod backfill;
mod date;
pub mod export;
pub mod kubernetes;
pub mod scheduler;
pub mod status;

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use chrono::offset::LocalResult;
use chrono::{DateTime, FixedOffset, NaiveDate, NaiveDateTime, TimeZone, Timelike, Utc};
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
    // Vixie cron and cronie: a day field that starts with `*` makes the two day fields
    // one condition (both must match); croner only does so for a bare `*`.
    let first = if fields.len() == 5 { 0 } else { 1 };
    let (dom, dow) = (fields[first + 2].clone(), fields[first + 4].clone());
    let dom_and_dow = dom.starts_with('*') || dow.starts_with('*');
    let cron = CronParser::builder()
        .seconds(seconds)
        .year(year)
        .dom_and_dow(dom_and_dow)
        .build()
        .parse(&fields.join(" "))
        .map_err(|e| bad(lower_first(&e.to_string())))?;
    let schedule = CronSchedule {
        expr: trimmed.to_string(),
        fields,
        cron,
    };
    // A schedule that never fires (30 February, a past year) is a mistake, not a job.
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|n| n.and_utc());
    if epoch.and_then(|e| schedule.naive_next(&e, false)).is_none() {
        let f = &schedule.fields;
        let year = match f.get(6) {
            Some(y) => format!(", year {y:?}"),
            None => String::new(),
        };
        return Err(bad(format!(
            "it never fires (day-of-month {dom:?}, month {:?}, day-of-week {dow:?}{year}: \
             no such day)",
            f[first + 3]
        )));
    }
    Ok(schedule)
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
        let dow_extension = dow.contains(['#', '?', '+'])
            || dow == "L"
            || dow
                .as_bytes()
                .windows(2)
                .any(|w| w[0].is_ascii_digit() && w[1] == b'L');
        (!dom_extension && !dow_extension).then(|| five.join(" "))
    }

    /// The next wall-clock time the expression matches after (or at, with `inclusive`)
    /// the wall-clock time `local`, which is a local time written as UTC (no clock
    /// changes): the expression's own calendar, before any time zone.
    fn naive_next(&self, local: &DateTime<Utc>, inclusive: bool) -> Option<DateTime<Utc>> {
        self.cron.find_next_occurrence(local, inclusive).ok()
    }

    /// The first fire time strictly after `after`, in `after`'s zone; `None` when the
    /// expression never fires again (a past year).
    ///
    /// Every wall-clock time the expression matches fires once (see the module docs): a
    /// time in a gap at the first instant after the gap, a repeated time on its first pass.
    pub fn next_after<Z: TimeZone>(&self, after: &DateTime<Z>) -> Option<DateTime<Z>> {
        let tz = after.timezone();
        let local = after.naive_local().and_utc();
        // Wall-clock matches map to instants in order (a gap's times all to the instant
        // after it, a repeated time to its first pass), so the first match whose instant
        // is after `after` is the answer. A match at or before `after`'s wall-clock time
        // is never later than `after`; matches after it may be earlier (the first pass of
        // a repeated hour, when `after` is in the second) and are passed over.
        let mut cursor = local;
        let mut inclusive = false;
        loop {
            let m = self.naive_next(&cursor, inclusive)?;
            inclusive = false;
            cursor = m;
            if let Some(at) = first_instant_at_or_after(&tz, m.naive_utc()) {
                if at > *after {
                    return Some(at);
                }
            }
        }
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

/// The instant a wall-clock time `local` names in `tz`: itself when it exists once, its
/// first pass when it happens twice, the first instant after the gap when a clock change
/// skips it. `None` only past the end of time.
fn first_instant_at_or_after<Z: TimeZone>(tz: &Z, local: NaiveDateTime) -> Option<DateTime<Z>> {
    let mut t = local;
    // Gaps are whole minutes and at most a few hours (26 h in the worst historical case,
    // Samoa 2011); look a little further to be safe.
    for _ in 0..=(2 * 24 * 60) {
        match tz.from_local_datetime(&t) {
            LocalResult::Single(at) => return Some(at),
            LocalResult::Ambiguous(first, _) => return Some(first),
            LocalResult::None => {
                // Jump to the next whole minute: gaps start and end on whole minutes.
                let next_minute =
                    t.with_second(0)?.with_nanosecond(0)? + chrono::Duration::minutes(1);
                t = next_minute;
            }
        }
    }
    None
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
    /// Its `refire_after` (`None`: [`DEFAULT_REFIRE_AFTER`]).
    pub refire_after: Option<Duration>,
    /// Its `guards.time_window`, if on.
    pub time_window: Option<Duration>,
    /// Its mode (`enforce` unless the job says otherwise).
    pub mode: crate::model::Mode,
    /// A command job's `[command] timeout` (exports bound a run's time with it).
    pub timeout: Option<Duration>,
    /// A command job's `[command] grace` (SIGTERM → SIGKILL): how long idem may take to
    /// stop after its own SIGTERM, beyond recording the run.
    pub grace: Option<Duration>,
}

/// How long after a scheduler fire of a date failed a `catch_up` job's date is fired again,
/// unless the job's `refire_after` says otherwise.
pub const DEFAULT_REFIRE_AFTER: Duration = Duration::from_secs(300);

impl ScheduledJob {
    /// How long after a failed scheduler fire of a date it is fired again.
    pub fn refire_after(&self) -> Duration {
        self.refire_after.unwrap_or(DEFAULT_REFIRE_AFTER)
    }

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

    fn tz(name: &str) -> Tz {
        parse_timezone(name).unwrap()
    }

    /// Every wall-clock time an expression lists fires once on a clock-change day, for
    /// lists, ranges and steps in the minute and hour fields (issue 21.4).
    #[test]
    fn lists_ranges_and_steps_fire_each_wall_clock_time_once_across_dst() {
        let london = tz("Europe/London");
        // 29 March 2026: 01:00-02:00 does not exist in London.
        for expr in [
            "0,30 1 * * *",
            "15,45 1 * * *",
            "0-59/30 1 * * *",
            "*/30 1 * * *",
        ] {
            assert_eq!(
                fires_on(expr, london, "2026-03-29"),
                ["2026-03-29T02:00:00+01:00"],
                "{expr}: both gap times fire once, together, at the first instant after"
            );
        }
        // 25 October 2026: 01:00-02:00 happens twice in London.
        assert_eq!(
            fires_on("15,45 1 * * *", london, "2026-10-25"),
            ["2026-10-25T01:15:00+01:00", "2026-10-25T01:45:00+01:00"]
        );
        // Los Angeles: 02:30 is in the gap on 8 March, 01:30 is repeated on 1 November.
        assert_eq!(
            fires_on("30 1,2 * * *", la(), "2026-03-08"),
            ["2026-03-08T01:30:00-08:00", "2026-03-08T03:00:00-07:00"]
        );
        assert_eq!(
            fires_on("30 1,2 * * *", la(), "2026-11-01"),
            ["2026-11-01T01:30:00-07:00", "2026-11-01T02:30:00-08:00"]
        );
        assert_eq!(
            fires_on("30 1-3/2 * * *", la(), "2026-11-01"),
            ["2026-11-01T01:30:00-07:00", "2026-11-01T03:30:00-08:00"]
        );
        // Lord Howe moves by 30 minutes (02:00 -> 02:30 on 4 October 2026).
        assert_eq!(
            fires_on("0,15,45 2 * * *", tz("Australia/Lord_Howe"), "2026-10-04"),
            ["2026-10-04T02:30:00+11:00", "2026-10-04T02:45:00+11:00"]
        );
    }

    /// Intervals follow the same rule: a repeated hour fires once (its first pass), a
    /// skipped hour's times fire once at the first instant after the gap.
    #[test]
    fn interval_schedules_fire_each_wall_clock_time_once_across_dst() {
        let fall = parse_cron("0 * * * *")
            .unwrap()
            .upcoming(la(), utc("2026-11-01T07:30:00Z"), 3);
        assert_eq!(
            rfc(&fall),
            [
                "2026-11-01T01:00:00-07:00",
                "2026-11-01T02:00:00-08:00",
                "2026-11-01T03:00:00-08:00",
            ]
        );
        // Asked from inside the second pass, the next fire is the next new wall-clock time.
        let inside =
            parse_cron("*/15 * * * *")
                .unwrap()
                .upcoming(la(), utc("2026-11-01T09:20:00Z"), 1);
        assert_eq!(rfc(&inside), ["2026-11-01T02:00:00-08:00"]);
        let spring =
            parse_cron("30 * * * *")
                .unwrap()
                .upcoming(la(), utc("2026-03-08T09:00:00Z"), 3);
        assert_eq!(
            rfc(&spring),
            [
                "2026-03-08T01:30:00-08:00",
                "2026-03-08T03:00:00-07:00",
                "2026-03-08T03:30:00-07:00",
            ]
        );
    }

    /// Vixie cron / cronie: a day field starting with `*` ANDs the two day fields.
    #[test]
    fn day_fields_combine_as_in_cronie() {
        let days = |expr: &str, n| {
            parse_cron(expr)
                .unwrap()
                .upcoming(Tz::UTC, utc("2026-01-01T00:00:00Z"), n)
                .iter()
                .map(|t| t.date_naive().to_string())
                .collect::<Vec<_>>()
        };
        // Odd days that are Mondays (5 Jan is odd and a Monday; 12 Jan is even).
        assert_eq!(
            days("0 9 */2 * MON", 3),
            ["2026-01-05", "2026-01-19", "2026-02-09"]
        );
        // Both restricted: either matches.
        assert_eq!(
            days("0 9 1,15 * MON", 3),
            ["2026-01-01", "2026-01-05", "2026-01-12"]
        );
        // A bare star in one field: the other decides.
        assert_eq!(days("0 9 * * MON", 1), ["2026-01-05"]);
        assert_eq!(days("0 9 15 * *", 1), ["2026-01-15"]);
        // The 1st of a month that is a Sunday, Wednesday or Saturday (1 Jan 2026 is a Thursday).
        assert_eq!(days("0 9 1 * */3", 2), ["2026-02-01", "2026-03-01"]);
    }

    #[test]
    fn schedules_that_never_fire_are_refused() {
        for never in [
            "0 9 31 2 *",
            "0 0 30 2 *",
            "0 0 31 4,6,9,11 *",
            "0 0 0 31 2 * *",
        ] {
            let e = parse_cron(never).unwrap_err().to_string();
            assert!(e.contains("never fires"), "{never}: {e}");
        }
        // 29 February fires in leap years.
        let leap = parse_cron("0 0 29 2 *").unwrap();
        assert_eq!(
            rfc(&leap.upcoming(Tz::UTC, utc("2026-01-01T00:00:00Z"), 1)),
            ["2028-02-29T00:00:00+00:00"]
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
