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
    /// Dates to fire again ([`Planner::refire`]), at the next [`Planner::due`].
    refires: Vec<Fire>,
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
            refires: Vec::new(),
        })
    }

    /// Fires `job`'s `slot` again for `date` at the next [`Planner::due`], as a catch-up
    /// fire before the job's others: a date whose fire the ledger says ended failed or
    /// interrupted (a scheduler stopped mid-fire). Only for a `catch_up` job (a `skip`
    /// job's failed dates are reported, not fired again), once per date, and not when the
    /// same tick fires that date anyway.
    pub fn refire(&mut self, job: &str, slot: DateTime<Utc>, date: NaiveDate) {
        let Some(e) = self.entries.iter().find(|e| e.name == job) else {
            return;
        };
        if e.missed == Missed::Skip || self.refires.iter().any(|f| f.job == job && f.date == date) {
            return;
        }
        self.refires.push(Fire {
            job: job.to_string(),
            slot,
            local: slot.with_timezone(&e.tz).to_rfc3339(),
            date,
            catch_up: true,
        });
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
        let mut refires = std::mem::take(&mut self.refires);
        refires.sort_by_key(|f| f.date);
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
        // Dates fired again go first (they are older), unless this tick fires them anyway.
        refires.retain(|r| !due.fires.iter().any(|f| f.job == r.job && f.date == r.date));
        refires.append(&mut due.fires);
        due.fires = refires;
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

/// The longest the loop sleeps between ticks, even when no slot falls due sooner: each
/// tick beats its [`Heartbeat`], so a loop that stopped ticking is seen within
/// [`Beat::stale_after`] (a tick with nothing due only asks the planner).
pub const MAX_TICK: Duration = Duration::from_secs(10);

/// When the scheduler loop last ticked, and how soon it meant to tick again: what
/// `idem scheduler --listen`'s `/healthz` reads. Monotonic time, not the [`Clock`].
#[derive(Debug, Clone, Default)]
pub struct Heartbeat(Arc<std::sync::Mutex<Option<Beat>>>);

/// One tick of the loop.
#[derive(Debug, Clone, Copy)]
pub struct Beat {
    /// When it ticked.
    pub at: std::time::Instant,
    /// How long it then meant to sleep (at most [`MAX_TICK`]).
    pub sleep: Duration,
}

impl Heartbeat {
    /// The loop ticked now and sleeps at most `sleep`.
    pub fn beat(&self, sleep: Duration) {
        let beat = Beat {
            at: std::time::Instant::now(),
            sleep,
        };
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(beat);
    }

    /// The last tick; `None` before the loop began.
    pub fn last(&self) -> Option<Beat> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Beat {
    /// How long after this tick the loop counts as stalled: twice the sleep it meant, and
    /// at least 30 s (a busy machine, a slow planner pass).
    pub fn stale_after(&self) -> Duration {
        (self.sleep * 2).max(Duration::from_secs(30))
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
/// Each tick (at least every [`MAX_TICK`]) beats `heartbeat`.
pub async fn run_loop<F, Fut>(
    planner: &mut Planner,
    clock: Arc<dyn Clock>,
    fire: F,
    shutdown: impl Future<Output = &'static str>,
    grace: Duration,
    stop: tokio::sync::watch::Sender<Option<String>>,
    heartbeat: &Heartbeat,
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
            // Nothing fires again: idle until stopped (still ticking).
            .unwrap_or(MAX_TICK)
            .min(MAX_TICK);
        heartbeat.beat(sleep);
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
mod tests;
