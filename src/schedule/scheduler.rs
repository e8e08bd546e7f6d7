//! `idem scheduler`: a long-running loop that fires each scheduled job at its slots.
//!
//! The loop decides *when* to fire and *which date* a fire processes; the CLI decides *how*
//! (each fire goes through the same runner as `idem run`, with trigger `scheduler`, so two
//! schedulers, or a scheduler and manual runs, are kept apart by the guards: the lease and
//! the time window).
//!
//! * A slot is fired once its instant has passed; the date it processes is the job's
//!   `date` expression evaluated at the slot's instant in the job's zone (as
//!   `--scheduled-at` does), so a late fire still processes its slot's date.
//! * Daylight saving time is what [`CronSchedule::next_after`](super::CronSchedule) says:
//!   a fixed wall-clock time that happens twice fires once, one that does not happen fires
//!   at the first instant after the gap.
//! * **Missed slots** (the scheduler was down, or stalled): the latest due slot counts as on
//!   time while it is at most [`LATE_TOLERANCE`] late; every other due slot is missed.
//!   With `missed = "skip"` (the default) missed slots are dropped (one warning says how
//!   many) and the job fires at its next slot; with `missed = "catch_up"` missed slots are fired
//!   once per date they process (the newest slot of each), for the most recent
//!   `catch_up_limit` dates, oldest first (one at a time per job), and older ones are
//!   dropped. On start every job's missed slots are those after its last settled
//!   `scheduler` run in the ledger (none when it never ran under a scheduler: a first start
//!   fires no history); slots that fell due while the scheduler started are on time.
//!
//! The clock is injectable ([`Clock`]), and [`Planner`] is pure, so the decisions are
//! tested with a fake clock.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use serde::Serialize;

use crate::error::{BoxError, Error, Result};
use crate::key::Content;
use crate::model::{Outcome, RunRequest};
use crate::processor::Processor;

use super::{CronSchedule, DateExpr, ScheduledJob};

/// How late the latest due slot may be and still fire as on time (not missed).
pub const LATE_TOLERANCE: Duration = Duration::from_secs(60);

/// The default `catch_up_limit`.
pub const DEFAULT_CATCH_UP_LIMIT: u32 = 3;

/// The largest `catch_up_limit` (a bound against catch-up storms).
pub const MAX_CATCH_UP_LIMIT: u32 = 1000;

/// What the scheduler does with slots it missed (it was down or stalled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case", tag = "policy")]
pub enum Missed {
    /// Drop them; fire the next slot (the default).
    #[default]
    Skip,
    /// Fire the most recent `limit` of them, oldest first.
    CatchUp {
        /// At most this many missed dates are fired (one fire each).
        limit: u32,
    },
}

impl Missed {
    /// Reads the job fields `missed` (`skip` or `catch_up`) and `catch_up_limit`.
    pub fn parse(missed: Option<&str>, limit: Option<u32>) -> Result<Missed> {
        match (missed.map(str::trim), limit) {
            (None | Some("skip"), None) => Ok(Missed::Skip),
            (None | Some("skip"), Some(_)) => Err(Error::config(
                "catch_up_limit is set but missed is not \"catch_up\"",
            )),
            (Some("catch_up"), limit) => {
                let limit = limit.unwrap_or(DEFAULT_CATCH_UP_LIMIT);
                if !(1..=MAX_CATCH_UP_LIMIT).contains(&limit) {
                    return Err(Error::config(format!(
                        "catch_up_limit = {limit}: expected 1 to {MAX_CATCH_UP_LIMIT}"
                    )));
                }
                Ok(Missed::CatchUp { limit })
            }
            (Some(other), _) => Err(Error::config(format!(
                "missed = {other:?}: expected \"skip\" or \"catch_up\""
            ))),
        }
    }
}

/// The time, injectable so tests can use a fake clock.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> DateTime<Utc>;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// One fire: a job, the slot it fires for, and the date that slot processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fire {
    /// The job's name.
    pub job: String,
    /// The slot's instant.
    pub slot: DateTime<Utc>,
    /// The slot in the job's zone (`2026-03-08T03:00:00-07:00`).
    pub local: String,
    /// The date this slot processes (the job's date expression at the slot, in its zone).
    pub date: NaiveDate,
    /// A missed slot fired by `catch_up`.
    pub catch_up: bool,
}

/// Slots a tick dropped for one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// The job's name.
    pub job: String,
    /// How many slots were dropped.
    pub count: u64,
    /// The oldest and newest dropped slot.
    pub first: DateTime<Utc>,
    /// The newest dropped slot.
    pub last: DateTime<Utc>,
}

/// What is due at an instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Due {
    /// Fires, per job oldest first.
    pub fires: Vec<Fire>,
    /// Missed slots not fired.
    pub dropped: Vec<Dropped>,
}

/// Consecutive due slots that process the same date.
#[derive(Debug, Clone)]
struct DateGroup {
    date: NaiveDate,
    newest: DateTime<Tz>,
    newest_but_one: Option<DateTime<Tz>>,
    slots: u64,
}

#[derive(Debug, Clone)]
struct Entry {
    name: String,
    cron: CronSchedule,
    tz: Tz,
    date: DateExpr,
    missed: Missed,
    /// Slots strictly after this instant have not been considered yet.
    after: DateTime<Utc>,
}

/// Decides which slots fire when: pure, driven by the instants it is given.
#[derive(Debug, Clone)]
pub struct Planner {
    entries: Vec<Entry>,
    created: DateTime<Utc>,
    /// Set by [`Planner::begin`]: (created, loop began), read by the first [`Planner::due`].
    starting: Option<(DateTime<Utc>, DateTime<Utc>)>,
}

impl Planner {
    /// A planner for `jobs` started at `now`: only slots after `now` are considered (see
    /// [`Planner::resume_after`] for catch-up on start).
    pub fn new(jobs: &[ScheduledJob], now: DateTime<Utc>) -> Result<Planner> {
        let entries = jobs
            .iter()
            .map(|job| {
                Ok(Entry {
                    name: job.name.clone(),
                    cron: job.cron()?,
                    tz: job.tz()?,
                    date: job.date_expr()?,
                    missed: job.missed,
                    after: now,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Planner {
            entries,
            created: now,
            starting: None,
        })
    }

    /// The job names, in order, with their missed-fire policy.
    pub fn jobs(&self) -> impl Iterator<Item = (&str, Missed)> {
        self.entries.iter().map(|e| (e.name.as_str(), e.missed))
    }

    /// The job's last fire was at `last_fire` (from the ledger), so the slots after it are
    /// missed ones the next [`Planner::due`] considers: a `catch_up` job fires them, a
    /// `skip` job drops them with the warning its policy promises. No effect when
    /// `last_fire` is not earlier than what is already considered.
    pub fn resume_after(&mut self, job: &str, last_fire: DateTime<Utc>) {
        for e in self.entries.iter_mut().filter(|e| e.name == job) {
            if last_fire < e.after {
                e.after = last_fire;
            }
        }
    }

    /// The loop begins at `now`: slots that fell due between [`Planner::new`] and `now`
    /// (while the scheduler connected to its stores) are on time, however slow that was.
    pub fn begin(&mut self, now: DateTime<Utc>) {
        self.starting = Some((self.created, now));
    }

    /// The slots due at `now` (their instant has passed), per the missed-fire policies;
    /// they are not considered again.
    ///
    /// Catch-up fires one slot per *date*: missed slots that would process the same date
    /// (a schedule finer than its scope, `0 * * * *` with `date = "today"`) are one fire,
    /// the newest of them, and a missed slot whose date the on-time fire processes is
    /// covered by it. Firing each would run the same scope several times at once, all but
    /// one skipping as `in_progress`. `catch_up_limit` counts those fires, not slots.
    pub fn due(&mut self, now: DateTime<Utc>) -> Result<Due> {
        let mut due = Due::default();
        let starting = self.starting.take();
        for e in &mut self.entries {
            if now <= e.after {
                continue;
            }
            let limit = match e.missed {
                Missed::Skip => 0,
                Missed::CatchUp { limit } => limit as usize,
            };
            // The due slots grouped by the date they process (slots come in time order, so
            // a date's slots are consecutive), newest groups only: enough to fire `limit`
            // missed dates and the on-time one, and to name the newest dropped slot.
            let keep = limit + 2;
            let mut groups: VecDeque<DateGroup> = VecDeque::with_capacity(keep + 1);
            let mut total: u64 = 0;
            let mut oldest = None;
            let mut cursor = e.after.with_timezone(&e.tz);
            while let Some(slot) = e.cron.next_after(&cursor) {
                if slot <= cursor || slot.with_timezone(&Utc) > now {
                    break;
                }
                total += 1;
                oldest.get_or_insert(slot.with_timezone(&Utc));
                let date = e.date.resolve(e.tz, slot.with_timezone(&Utc))?;
                match groups.back_mut() {
                    Some(g) if g.date == date => {
                        g.newest_but_one = Some(g.newest);
                        g.newest = slot;
                        g.slots += 1;
                    }
                    _ => {
                        if groups.len() == keep {
                            groups.pop_front();
                        }
                        groups.push_back(DateGroup {
                            date,
                            newest: slot,
                            newest_but_one: None,
                            slots: 1,
                        });
                    }
                }
                cursor = slot;
            }
            e.after = now;
            let Some(latest) = groups.back().map(|g| g.newest.with_timezone(&Utc)) else {
                continue;
            };
            let fell_due_while_starting =
                starting.is_some_and(|(created, began)| latest > created && latest <= began);
            let late = if fell_due_while_starting {
                Duration::ZERO
            } else {
                (now - latest).to_std().unwrap_or_default()
            };
            // The on-time fire, and the missed slots of its date that it covers (catch-up
            // only: under `skip` they are missed like any other).
            let mut on_time = None;
            let mut covered: u64 = 0;
            if late <= LATE_TOLERANCE {
                let g = groups.back_mut().expect("a latest slot has a group");
                on_time = Some((g.newest, g.date));
                if limit > 0 || g.slots == 1 {
                    covered = g.slots - 1;
                    groups.pop_back();
                } else {
                    // Skip: the older slots of this date stay missed.
                    g.slots -= 1;
                    g.newest = g.newest_but_one.expect("more than one slot");
                }
            }
            // `groups` now holds missed slots only (the most recent dates).
            let missed_total = total - u64::from(on_time.is_some()) - covered;
            let n_fire = groups.len().min(limit);
            let split = groups.len() - n_fire;
            let fired_slots: u64 = groups.range(split..).map(|g| g.slots).sum();
            let dropped = missed_total - fired_slots;
            if dropped > 0 {
                let last = groups
                    .get(split.wrapping_sub(1))
                    .map_or(latest, |g| g.newest.with_timezone(&Utc));
                due.dropped.push(Dropped {
                    job: e.name.clone(),
                    count: dropped,
                    first: oldest.unwrap_or(last),
                    last,
                });
            }
            let fires = groups
                .range(split..)
                .map(|g| (g.newest, g.date, true))
                .chain(on_time.map(|(slot, date)| (slot, date, false)));
            for (slot, date, catch_up) in fires {
                due.fires.push(Fire {
                    job: e.name.clone(),
                    slot: slot.with_timezone(&Utc),
                    local: slot.to_rfc3339(),
                    date,
                    catch_up,
                });
            }
        }
        Ok(due)
    }

    /// The next instant a slot falls due (the earliest over all jobs); `None` when no job
    /// fires again.
    pub fn next_wake(&self) -> Option<DateTime<Utc>> {
        self.entries
            .iter()
            .filter_map(|e| {
                e.cron
                    .next_after(&e.after.with_timezone(&e.tz))
                    .map(|t| t.with_timezone(&Utc))
            })
            .min()
    }
}

/// What a scheduler loop did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LoopSummary {
    /// Fires started.
    pub fired: u64,
    /// Missed slots dropped.
    pub dropped: u64,
    /// Fires still running when the grace period ended (they were told to stop).
    pub interrupted: u64,
}

/// Fires due slots until `shutdown` resolves (to the signal's name), then lets running
/// fires finish within `grace`; after it, `stop` is raised (the fires' processors, wrapped
/// in [`StopOnShutdown`], give up and their runs are recorded as interrupted) and the loop
/// waits for the fires to record that.
///
/// `fire` starts one fire; it is spawned on the runtime, so fires of different jobs (and
/// of the same job, when one outlasts the interval: the lease decides) run side by side.
pub async fn run_loop<F, Fut>(
    planner: &mut Planner,
    clock: Arc<dyn Clock>,
    fire: F,
    shutdown: impl Future<Output = &'static str>,
    grace: Duration,
    stop: tokio::sync::watch::Sender<Option<String>>,
) -> Result<LoopSummary>
where
    F: Fn(Fire) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut summary = LoopSummary::default();
    let mut running = tokio::task::JoinSet::new();
    planner.begin(clock.now());
    tokio::pin!(shutdown);
    let signal = loop {
        let due = planner.due(clock.now())?;
        for d in &due.dropped {
            summary.dropped += d.count;
            tracing::warn!(
                job = %d.job,
                "missed {} slot(s) from {} to {}: not fired (missed-fire policy)",
                d.count,
                d.first.to_rfc3339(),
                d.last.to_rfc3339()
            );
        }
        // One task per job: its fires of this tick one after the other, oldest first (a
        // catch-up's dates complete in order; jobs still run side by side).
        let mut by_job: Vec<(String, Vec<Fut>)> = Vec::new();
        for f in due.fires {
            summary.fired += 1;
            let job = f.job.clone();
            let started = fire(f);
            match by_job.iter_mut().find(|(j, _)| *j == job) {
                Some((_, fires)) => fires.push(started),
                None => by_job.push((job, vec![started])),
            }
        }
        for (_, fires) in by_job {
            running.spawn(async move {
                for f in fires {
                    f.await;
                }
            });
        }
        let sleep = planner
            .next_wake()
            .map(|t| (t - clock.now()).to_std().unwrap_or_default())
            // Nothing fires again: idle until stopped.
            .unwrap_or(Duration::from_secs(3600));
        tokio::select! {
            signal = &mut shutdown => break signal,
            _ = tokio::time::sleep(sleep) => {}
            Some(_) = running.join_next(), if !running.is_empty() => {}
        }
        // Every fire that ended is reaped now, not one per wake (a thousand fires ending
        // together would each cost a pass over the planner).
        while running.try_join_next().is_some() {}
    };
    while running.try_join_next().is_some() {}
    if !running.is_empty() {
        tracing::warn!(
            "{signal} received: no new fires; waiting up to {} for {} running fire(s)",
            humanize(grace),
            running.len()
        );
    }
    let deadline = tokio::time::sleep(grace);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            next = running.join_next() => if next.is_none() { break },
            _ = &mut deadline => {
                summary.interrupted = running.len() as u64;
                tracing::warn!(
                    "the {} grace period ended: stopping {} running fire(s); they are recorded as interrupted",
                    humanize(grace),
                    running.len()
                );
                let _ = stop.send(Some(format!(
                    "interrupted by {signal}: the scheduler's {} grace period ended",
                    humanize(grace)
                )));
                while running.join_next().await.is_some() {}
                break;
            }
        }
    }
    Ok(summary)
}

fn humanize(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// A processor that gives up (with the message sent on the channel) once the scheduler's
/// grace period ends, so the runner records the run as failed and releases its lease.
pub struct StopOnShutdown {
    inner: Arc<dyn Processor>,
    stop: tokio::sync::watch::Receiver<Option<String>>,
}

impl StopOnShutdown {
    /// Wraps `inner`; it stops once `stop` carries a message.
    pub fn new(
        inner: Arc<dyn Processor>,
        stop: tokio::sync::watch::Receiver<Option<String>>,
    ) -> Self {
        StopOnShutdown { inner, stop }
    }

    async fn stopped(&self) -> BoxError {
        let mut rx = self.stop.clone();
        let message = rx
            .wait_for(Option::is_some)
            .await
            .map(|m| m.clone().unwrap_or_default());
        match message {
            Ok(message) => message.into(),
            // The sender is gone: never stop.
            Err(_) => std::future::pending().await,
        }
    }
}

#[async_trait]
impl Processor for StopOnShutdown {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn prepare(&self, request: &RunRequest) -> std::result::Result<(), BoxError> {
        tokio::select! {
            r = self.inner.prepare(request) => r,
            e = self.stopped() => Err(e),
        }
    }

    async fn describe(
        &self,
        request: &RunRequest,
    ) -> std::result::Result<Option<Content>, BoxError> {
        tokio::select! {
            r = self.inner.describe(request) => r,
            e = self.stopped() => Err(e),
        }
    }

    fn version(&self) -> String {
        self.inner.version()
    }

    async fn process(&self, request: &RunRequest) -> std::result::Result<Outcome, BoxError> {
        tokio::select! {
            r = self.inner.process(request) => r,
            e = self.stopped() => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::parse_instant;

    fn utc(s: &str) -> DateTime<Utc> {
        parse_instant("--after", s).unwrap()
    }

    fn job(name: &str, schedule: &str, tz: &str, missed: Missed) -> ScheduledJob {
        ScheduledJob {
            name: name.into(),
            schedule: schedule.into(),
            timezone: Some(tz.into()),
            missed,
            ..Default::default()
        }
    }

    fn slots(due: &Due) -> Vec<String> {
        due.fires.iter().map(|f| f.slot.to_rfc3339()).collect()
    }

    #[test]
    fn an_on_time_slot_fires_once_with_its_zones_date() {
        let mut p = Planner::new(
            &[ScheduledJob {
                date: Some("yesterday".into()),
                ..job("daily", "0 9 * * *", "America/Los_Angeles", Missed::Skip)
            }],
            utc("2026-03-06T12:00:00Z"),
        )
        .unwrap();
        assert_eq!(p.next_wake(), Some(utc("2026-03-06T17:00:00Z")));
        assert_eq!(p.due(utc("2026-03-06T16:59:59Z")).unwrap(), Due::default());
        let due = p.due(utc("2026-03-06T17:00:00.200Z")).unwrap();
        assert_eq!(slots(&due), ["2026-03-06T17:00:00+00:00"]);
        assert_eq!(due.fires[0].local, "2026-03-06T09:00:00-08:00");
        assert_eq!(due.fires[0].date.to_string(), "2026-03-05");
        assert!(!due.fires[0].catch_up);
        assert!(due.dropped.is_empty());
        // Not again.
        assert_eq!(p.due(utc("2026-03-06T17:00:30Z")).unwrap(), Due::default());
        assert_eq!(p.next_wake(), Some(utc("2026-03-07T17:00:00Z")));
    }

    #[test]
    fn after_a_stall_skip_drops_the_missed_slots_and_fires_the_next_one() {
        let mut p = Planner::new(
            &[job("hourly", "0 * * * *", "UTC", Missed::Skip)],
            utc("2026-01-01T10:30:00Z"),
        )
        .unwrap();
        // Stalled until 13:10: 11:00, 12:00 and 13:00 are all missed (13:00 is 10 min late).
        let due = p.due(utc("2026-01-01T13:10:00Z")).unwrap();
        assert!(due.fires.is_empty(), "{due:?}");
        assert_eq!(
            due.dropped,
            [Dropped {
                job: "hourly".into(),
                count: 3,
                first: utc("2026-01-01T11:00:00Z"),
                last: utc("2026-01-01T13:00:00Z"),
            }]
        );
        assert_eq!(p.next_wake(), Some(utc("2026-01-01T14:00:00Z")));
        // A short stall: the latest slot is still on time, the older one is dropped.
        let due = p.due(utc("2026-01-01T15:00:40Z")).unwrap();
        assert_eq!(slots(&due), ["2026-01-01T15:00:00+00:00"]);
        assert_eq!(due.dropped[0].count, 1);
        assert_eq!(due.dropped[0].first, utc("2026-01-01T14:00:00Z"));
    }

    #[test]
    fn after_a_stall_catch_up_fires_the_most_recent_missed_slots_oldest_first_within_the_bound() {
        let mut p = Planner::new(
            &[job(
                "daily",
                "0 6 * * *",
                "UTC",
                Missed::CatchUp { limit: 2 },
            )],
            utc("2026-01-01T05:30:00Z"),
        )
        .unwrap();
        // Stalled until 4 January 07:10: the 1st to the 4th are missed (the 4th by 70 min).
        let due = p.due(utc("2026-01-04T07:10:00Z")).unwrap();
        assert_eq!(
            slots(&due),
            ["2026-01-03T06:00:00+00:00", "2026-01-04T06:00:00+00:00"]
        );
        assert!(due.fires.iter().all(|f| f.catch_up));
        assert_eq!(due.dropped[0].count, 2);
        assert_eq!(due.dropped[0].first, utc("2026-01-01T06:00:00Z"));
        assert_eq!(due.dropped[0].last, utc("2026-01-02T06:00:00Z"));
        // Two missed and one on time: the bound counts missed slots only.
        let due = p.due(utc("2026-01-07T06:00:05Z")).unwrap();
        assert_eq!(
            slots(&due),
            [
                "2026-01-05T06:00:00+00:00",
                "2026-01-06T06:00:00+00:00",
                "2026-01-07T06:00:00+00:00"
            ]
        );
        assert_eq!(
            due.fires
                .iter()
                .map(|f| f.date.to_string())
                .collect::<Vec<_>>(),
            ["2026-01-05", "2026-01-06", "2026-01-07"]
        );
        assert_eq!(
            due.fires.iter().map(|f| f.catch_up).collect::<Vec<_>>(),
            [true, true, false]
        );
        assert!(due.dropped.is_empty());
    }

    #[test]
    fn catch_up_fires_once_per_date_when_the_schedule_is_finer_than_the_scope() {
        // Hourly slots, each processing today's date: after a stall every missed slot of
        // one date is one fire (the newest), never several fires of one scope at once.
        let mut p = Planner::new(
            &[job(
                "hourly",
                "0 * * * *",
                "UTC",
                Missed::CatchUp { limit: 3 },
            )],
            utc("2026-01-01T10:30:00Z"),
        )
        .unwrap();
        let due = p.due(utc("2026-01-01T13:10:00Z")).unwrap();
        assert_eq!(slots(&due), ["2026-01-01T13:00:00+00:00"]);
        assert!(due.fires[0].catch_up);
        assert!(due.dropped.is_empty(), "{due:?}");
        // The on-time fire covers the missed slots of its own date.
        let due = p.due(utc("2026-01-01T16:00:05Z")).unwrap();
        assert_eq!(slots(&due), ["2026-01-01T16:00:00+00:00"]);
        assert!(!due.fires[0].catch_up);
        assert!(due.dropped.is_empty(), "{due:?}");
        // Across midnight: one catch-up fire for the 1st, the on-time one for the 2nd.
        let due = p.due(utc("2026-01-02T02:00:10Z")).unwrap();
        assert_eq!(
            due.fires
                .iter()
                .map(|f| (f.slot.to_rfc3339(), f.date.to_string(), f.catch_up))
                .collect::<Vec<_>>(),
            [
                (
                    "2026-01-01T23:00:00+00:00".into(),
                    "2026-01-01".into(),
                    true
                ),
                (
                    "2026-01-02T02:00:00+00:00".into(),
                    "2026-01-02".into(),
                    false
                ),
            ]
        );
        assert!(due.dropped.is_empty(), "{due:?}");

        // Every second, a fixed date: a ten-second stall is one fire, and the bound
        // counts dates, so older dates beyond it are dropped with all their slots.
        let mut p = Planner::new(
            &[ScheduledJob {
                date: Some("2025-11-18".into()),
                ..job(
                    "secondly",
                    "* * * * * *",
                    "UTC",
                    Missed::CatchUp { limit: 1 },
                )
            }],
            utc("2026-01-01T00:00:00Z"),
        )
        .unwrap();
        let due = p.due(utc("2026-01-01T00:00:10.5Z")).unwrap();
        assert_eq!(slots(&due), ["2026-01-01T00:00:10+00:00"]);
        assert!(due.dropped.is_empty(), "{due:?}");
        let mut p = Planner::new(
            &[job(
                "twice_a_day",
                "0 */12 * * *",
                "UTC",
                Missed::CatchUp { limit: 1 },
            )],
            utc("2026-01-01T00:30:00Z"),
        )
        .unwrap();
        // Slots on the 1st (12:00), 2nd (00:00, 12:00), 3rd (00:00, 12:00), 4th (00:00,
        // an hour late): all missed; the bound keeps one date, the 4th.
        let due = p.due(utc("2026-01-04T01:00:00Z")).unwrap();
        assert_eq!(slots(&due), ["2026-01-04T00:00:00+00:00"]);
        assert_eq!(due.fires[0].date.to_string(), "2026-01-04");
        assert!(due.fires[0].catch_up);
        assert_eq!(due.dropped.len(), 1);
        assert_eq!(due.dropped[0].count, 5);
        assert_eq!(due.dropped[0].first, utc("2026-01-01T12:00:00Z"));
        assert_eq!(due.dropped[0].last, utc("2026-01-03T12:00:00Z"));
    }

    #[test]
    fn on_start_catch_up_fires_missed_slots_and_skip_drops_them_with_a_warning() {
        let now = utc("2026-01-05T10:00:00Z");
        let jobs = [
            ScheduledJob {
                date: Some("yesterday".into()),
                ..job("c", "0 6 * * *", "UTC", Missed::CatchUp { limit: 3 })
            },
            job("s", "0 6 * * *", "UTC", Missed::Skip),
        ];
        let mut p = Planner::new(&jobs, now).unwrap();
        let last = utc("2026-01-01T06:00:01Z");
        p.resume_after("c", last);
        p.resume_after("s", last);
        let due = p.due(now).unwrap();
        let fired: Vec<(&str, String)> = due
            .fires
            .iter()
            .map(|f| (f.job.as_str(), f.date.to_string()))
            .collect();
        // 2, 3, 4 and 5 January were missed; the bound keeps the three most recent.
        assert_eq!(
            fired,
            [
                ("c", "2026-01-02".to_string()),
                ("c", "2026-01-03".to_string()),
                ("c", "2026-01-04".to_string())
            ]
        );
        // `skip` drops its four missed slots, and says so (issue 21.3b).
        let dropped: Vec<(&str, u64)> = due
            .dropped
            .iter()
            .map(|d| (d.job.as_str(), d.count))
            .collect();
        assert_eq!(dropped, [("c", 1), ("s", 4)]);
        assert_eq!(p.next_wake(), Some(utc("2026-01-06T06:00:00Z")));
    }

    /// A slot that falls due while the scheduler connects to its stores at start fires on
    /// time, however long the connect took (issue 21.10).
    #[test]
    fn a_slot_due_during_a_slow_start_is_on_time() {
        let created = utc("2026-01-05T05:59:00Z");
        let jobs = [job("s", "0 6 * * *", "UTC", Missed::Skip)];
        let mut p = Planner::new(&jobs, created).unwrap();
        // The stores took five minutes to answer.
        let began = utc("2026-01-05T06:04:00Z");
        p.begin(began);
        let due = p.due(began).unwrap();
        assert_eq!(due.fires.len(), 1, "{due:?}");
        assert!(!due.fires[0].catch_up && due.dropped.is_empty(), "{due:?}");
        // Without the slow start it would have been missed.
        let mut q = Planner::new(&jobs, created).unwrap();
        let due = q.due(began).unwrap();
        assert!(due.fires.is_empty() && due.dropped.len() == 1, "{due:?}");
    }

    /// Wakes the planner at each slot (as the loop does) from `start` to `end`; the fires.
    fn drive(p: &mut Planner, start: &str, end: &str) -> Vec<Fire> {
        let end = utc(end);
        let mut fires = Vec::new();
        let mut now = utc(start);
        loop {
            fires.extend(p.due(now).unwrap().fires);
            match p.next_wake() {
                Some(t) if t <= end => now = t + chrono::Duration::milliseconds(3),
                _ => return fires,
            }
        }
    }

    #[test]
    fn a_daily_two_thirty_fires_once_on_each_2026_dst_day_with_a_fake_clock() {
        let mut p = Planner::new(
            &[job("d", "30 2 * * *", "America/Los_Angeles", Missed::Skip)],
            utc("2026-03-06T00:00:00Z"),
        )
        .unwrap();
        let fires = drive(&mut p, "2026-03-06T00:00:00Z", "2026-03-10T00:00:00Z");
        let local: Vec<(&str, String)> = fires
            .iter()
            .map(|f| (f.local.as_str(), f.date.to_string()))
            .collect();
        assert_eq!(
            local,
            [
                ("2026-03-06T02:30:00-08:00", "2026-03-06".to_string()),
                ("2026-03-07T02:30:00-08:00", "2026-03-07".to_string()),
                // 02:30 does not exist: the first instant after the gap, once.
                ("2026-03-08T03:00:00-07:00", "2026-03-08".to_string()),
                ("2026-03-09T02:30:00-07:00", "2026-03-09".to_string()),
            ]
        );
        let mut p = Planner::new(
            &[job("d", "30 1 * * *", "America/Los_Angeles", Missed::Skip)],
            utc("2026-10-31T00:00:00Z"),
        )
        .unwrap();
        let fires = drive(&mut p, "2026-10-31T00:00:00Z", "2026-11-03T00:00:00Z");
        let local: Vec<&str> = fires.iter().map(|f| f.local.as_str()).collect();
        // 01:30 happens twice on 1 November: it fires on the first pass only.
        assert_eq!(
            local,
            [
                "2026-10-31T01:30:00-07:00",
                "2026-11-01T01:30:00-07:00",
                "2026-11-02T01:30:00-08:00",
            ]
        );
    }

    #[test]
    fn every_second_fires_each_second() {
        let mut p = Planner::new(
            &[job("s", "* * * * * *", "UTC", Missed::Skip)],
            utc("2026-01-01T00:00:00.500Z"),
        )
        .unwrap();
        let fires = drive(&mut p, "2026-01-01T00:00:00.500Z", "2026-01-01T00:00:03Z");
        assert_eq!(
            fires
                .iter()
                .map(|f| f.slot.to_rfc3339())
                .collect::<Vec<_>>(),
            [
                "2026-01-01T00:00:01+00:00",
                "2026-01-01T00:00:02+00:00",
                "2026-01-01T00:00:03+00:00"
            ]
        );
    }

    #[test]
    fn missed_policy_fields_are_validated() {
        assert_eq!(Missed::parse(None, None).unwrap(), Missed::Skip);
        assert_eq!(Missed::parse(Some("skip"), None).unwrap(), Missed::Skip);
        assert_eq!(
            Missed::parse(Some("catch_up"), None).unwrap(),
            Missed::CatchUp {
                limit: DEFAULT_CATCH_UP_LIMIT
            }
        );
        assert_eq!(
            Missed::parse(Some("catch_up"), Some(7)).unwrap(),
            Missed::CatchUp { limit: 7 }
        );
        let e = |m: Option<&str>, l| Missed::parse(m, l).unwrap_err().to_string();
        assert!(e(Some("later"), None).contains("missed = \"later\": expected"));
        assert!(e(None, Some(3)).contains("catch_up_limit is set but missed is not"));
        assert!(e(Some("catch_up"), Some(0)).contains("catch_up_limit = 0: expected 1 to 1000"));
    }

    struct Fixed(DateTime<Utc>);
    impl Clock for Fixed {
        fn now(&self) -> DateTime<Utc> {
            self.0
        }
    }

    /// Catch-up fires of one job run one at a time, oldest date first, even when an older
    /// date takes longer; another job's fires run beside them (issue 21.3d: they ran
    /// concurrently and finished newest first).
    #[tokio::test]
    async fn catch_up_fires_of_a_job_complete_oldest_first_one_at_a_time() {
        let now = utc("2026-01-05T10:00:00Z");
        let clock = Arc::new(Fixed(now));
        let jobs = [
            ScheduledJob {
                date: Some("yesterday".into()),
                ..job("c", "0 6 * * *", "UTC", Missed::CatchUp { limit: 4 })
            },
            ScheduledJob {
                date: Some("yesterday".into()),
                ..job("d", "0 6 * * *", "UTC", Missed::CatchUp { limit: 4 })
            },
        ];
        let mut p = Planner::new(&jobs, now).unwrap();
        p.resume_after("c", utc("2026-01-01T06:00:01Z"));
        p.resume_after("d", utc("2026-01-01T06:00:01Z"));
        let (stop_tx, _) = tokio::sync::watch::channel(None::<String>);
        let log = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let overlapped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let fire = {
            let (log, running, overlapped) = (log.clone(), running.clone(), overlapped.clone());
            move |f: Fire| {
                let (log, running, overlapped) = (log.clone(), running.clone(), overlapped.clone());
                async move {
                    use std::sync::atomic::Ordering::SeqCst;
                    if f.job == "c" && running.fetch_add(1, SeqCst) > 0 {
                        overlapped.store(true, SeqCst);
                    }
                    // The oldest date is the slowest: out of order if they ran at once.
                    let ms = match f.date.to_string().as_str() {
                        "2026-01-01" | "2026-01-02" => 120,
                        "2026-01-03" => 60,
                        _ => 0,
                    };
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    log.lock().unwrap().push(format!("{} {}", f.job, f.date));
                    if f.job == "c" {
                        running.fetch_sub(1, SeqCst);
                    }
                }
            }
        };
        let shutdown = async {
            tokio::time::sleep(Duration::from_millis(800)).await;
            "SIGTERM"
        };
        let summary = run_loop(
            &mut p,
            clock,
            fire,
            shutdown,
            Duration::from_secs(5),
            stop_tx,
        )
        .await
        .unwrap();
        assert_eq!(summary.fired, 8);
        assert!(!overlapped.load(std::sync::atomic::Ordering::SeqCst));
        let log = log.lock().unwrap().clone();
        let of = |job: &str| -> Vec<String> {
            log.iter()
                .filter(|l| l.starts_with(job))
                .map(|l| l[2..].to_string())
                .collect()
        };
        let dates = ["2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"];
        assert_eq!(of("c"), dates);
        assert_eq!(of("d"), dates);
        // The two jobs ran side by side: d's first date finished before c's last.
        let pos = |l: &str| log.iter().position(|x| x == l).unwrap();
        assert!(pos("d 2026-01-01") < pos("c 2026-01-04"), "{log:?}");
    }

    #[tokio::test]
    async fn the_loop_fires_due_slots_and_stops_running_fires_after_the_grace_period() {
        // A fake clock just after a slot: that slot fires at once; the loop then waits.
        let clock = Arc::new(Fixed(utc("2026-01-01T06:00:00.100Z")));
        let mut p = Planner::new(
            &[job("j", "0 6 * * *", "UTC", Missed::Skip)],
            utc("2026-01-01T05:59:59Z"),
        )
        .unwrap();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(None::<String>);
        let (fired_tx, mut fired_rx) = tokio::sync::mpsc::unbounded_channel();
        let fire = move |f: Fire| {
            let mut stop = stop_rx.clone();
            let fired = fired_tx.clone();
            async move {
                let _ = fired.send(f.slot);
                // A fire that runs until told to stop.
                let message = stop.wait_for(Option::is_some).await.unwrap().clone();
                let _ = fired.send(utc("2000-01-01T00:00:00Z"));
                assert!(message.unwrap().starts_with("interrupted by SIGTERM"));
            }
        };
        let shutdown = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            "SIGTERM"
        };
        let summary = run_loop(
            &mut p,
            clock,
            fire,
            shutdown,
            Duration::from_millis(50),
            stop_tx,
        )
        .await
        .unwrap();
        assert_eq!(fired_rx.recv().await, Some(utc("2026-01-01T06:00:00Z")));
        assert_eq!(fired_rx.recv().await, Some(utc("2000-01-01T00:00:00Z")));
        assert_eq!(
            summary,
            LoopSummary {
                fired: 1,
                dropped: 0,
                interrupted: 1
            }
        );
    }
}
