//! `idem scheduler`: fires the scheduled jobs at their times, each through the runner
//! `idem run` uses ([`job::plan`](crate::job::plan)).

use clap::Args;

use std::net::SocketAddr;
use std::sync::Arc;

use super::{cancel_on_signals, scheduled_jobs, GlobalOptions, EXIT_OK};
use crate::error::{Error, Result};
use crate::job::{plan, Connections, Job, Overrides, Plan};
use crate::model::duration::parse_duration;
use crate::model::{RunStatus, SkipReason, Trigger};
use crate::processor::Registry;
use crate::runner::Cancel;
use crate::schedule;
use crate::store::{PoolSize, RunFilter};

mod listen;

use listen::{FireOutcome, Metrics};

/// `idem scheduler [JOB...] [--grace 30s] [--listen ADDR]`: fires each job's slots through
/// the runner `idem run` uses (trigger scheduler, the date derived from the slot in the
/// job's zone); serves its health and metrics on ADDR; stops on SIGTERM/SIGINT after the
/// grace period; exit 0.
pub(super) async fn scheduler(
    args: SchedulerArgs,
    g: &GlobalOptions,
    registry: &Registry,
) -> Result<u8> {
    use schedule::scheduler::{self as sched, Clock};
    let grace = parse_duration(&args.grace).map_err(|e| Error::input(format!("--grace: {e}")))?;
    let jobs = scheduled_jobs(&args.jobs, g)?;
    if jobs.is_empty() {
        return Err(Error::config(format!(
            "no job in {} has a schedule: nothing to fire",
            g.jobs_dir.display()
        )));
    }
    let scheduled = jobs
        .iter()
        .map(Job::scheduled)
        .collect::<Result<Vec<_>>>()?;
    // Listen before anything fires, so a signal is never the default (fatal) one.
    let cancel = cancel_on_signals()?;
    let signalled = cancel.clone();
    let metrics = Arc::new(Metrics::new(scheduled.iter().map(|j| j.name.as_str())));
    let heartbeat = sched::Heartbeat::default();
    let connections = Connections::new(PoolSize::SHARED);
    // Bound before the jobs are planned (a port in use exits here, before any fire), and
    // served until the scheduler is signalled.
    let health = match args.listen {
        Some(addr) => {
            let listener = listen::bind(addr).await?;
            let health = Arc::new(listen::Health {
                metrics: metrics.clone(),
                heartbeat: heartbeat.clone(),
                started: Default::default(),
                connections: connections.clone(),
                store_url: g.store.clone(),
                probe_job: scheduled[0].name.clone(),
            });
            listen::serve(listener, health.clone(), signalled.clone());
            Some(health)
        }
        None => None,
    };
    let shutdown = async move { cancel.cancelled().await };
    let clock: Arc<dyn Clock> = Arc::new(sched::SystemClock);
    let mut planner = sched::Planner::new(&scheduled, clock.now())?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(None::<String>);
    // What a fire does besides processing (waiting for the lease, the job's setup and
    // content queries, the store) stops at the grace period's end too: the runners'
    // cancellation token is cancelled with the stop message.
    let stop_runs = Cancel::new();
    {
        let (mut stop_rx, stop_runs) = (stop_rx.clone(), stop_runs.clone());
        tokio::spawn(async move {
            if let Ok(message) = stop_rx.wait_for(Option::is_some).await {
                let message = message.clone().unwrap_or_default();
                let reason = message.strip_prefix("interrupted by ").unwrap_or(&message);
                // Once per scheduler process, at its end: leaking the reason is fine.
                stop_runs.cancel(Box::leak(reason.to_string().into_boxed_str()));
            }
        });
    }
    // The scheduler, not the runner, decides when a signal stops a run: after the grace
    // period, through StopOnShutdown and the `stop_runs` token. Every job shares one store
    // (and one warehouse per warehouse URL): one pool, not one per job.
    let overrides = Overrides {
        trigger: Some(Trigger::Scheduler),
        cancel: Some(stop_runs.clone()),
        spool: true,
        connections: Some(connections),
        ..Overrides::default()
    };
    // Every job is planned at once (the store is opened once, by the first; the others
    // wait for it), and a signal during startup stops the scheduler there.
    let started = tokio::select! {
        started = start_jobs(jobs, registry, &g.store, &overrides) => started,
        _ = signalled.cancelled() => {
            tracing::info!(target: "idem::scheduler", "scheduler stopped by {} during startup: nothing fired", signalled.reason().unwrap_or("a signal"));
            return Ok(EXIT_OK);
        }
    };
    if let Some(health) = &health {
        health
            .started
            .store(true, std::sync::atomic::Ordering::Release);
    }
    let mut targets = std::collections::HashMap::new();
    for (job, planned) in started {
        let name = job.name.clone();
        if let Some(Started {
            last_fire: Some(last),
            ..
        }) = &planned
        {
            planner.resume_after(&name, *last);
        }
        for r in planned.iter().flat_map(|p| &p.refires) {
            if r.failed == 0 && r.why == NEVER_RUN {
                tracing::info!(target: "idem::scheduler", "job {name}: {} {NEVER_RUN} although a scheduler fired the job for an older date: firing it", r.date);
            } else {
                tracing::info!(target: "idem::scheduler", "job {name}: the fire of {} {} ({} failed scheduler fire(s) so far): firing it again", r.date, r.why, r.failed);
            }
            planner.refire(&name, r.slot, r.date);
        }
        let stop_rx = stop_rx.clone();
        targets.insert(
            name,
            Target {
                job,
                registry: registry.clone(),
                store_url: g.store.clone(),
                overrides: overrides.clone(),
                plan: tokio::sync::OnceCell::new_with(
                    planned.map(|p| wrap(p.plan, stop_rx.clone())),
                ),
                stop: stop_rx,
                draining: signalled.clone(),
                refiring: Default::default(),
                refired: Default::default(),
            },
        );
    }
    let names: Vec<String> = planner
        .jobs()
        .map(|(name, missed)| match missed {
            schedule::Missed::Skip => name.to_string(),
            schedule::Missed::CatchUp { limit } => format!("{name} (catch_up {limit})"),
        })
        .collect();
    tracing::info!(target: "idem::scheduler", "scheduler started with {} job(s): {}", names.len(), names.join(", "));
    let targets = Arc::new(targets);
    let all = targets.clone();
    let fire = move |f: sched::Fire| {
        let (targets, metrics) = (targets.clone(), metrics.clone());
        async move { fire_one(&targets, &metrics, f).await }
    };
    let summary = sched::run_loop(
        &mut planner,
        clock,
        fire,
        shutdown,
        grace,
        stop_tx,
        &heartbeat,
    )
    .await?;
    let refired: u64 = all
        .values()
        .map(|t| t.refired.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    tracing::info!(
        target: "idem::scheduler",
        "scheduler stopped: {} fire(s), {} missed slot(s) dropped, {} interrupted{}",
        summary.fired,
        summary.dropped,
        summary.interrupted,
        if refired > 0 { format!(", {refired} fired again") } else { String::new() }
    );
    Ok(EXIT_OK)
}

/// A job planned at start, its last fire that settled a slot, and the dates to fire
/// again (their fires ended failed or interrupted).
struct Started {
    plan: Plan,
    last_fire: Option<chrono::DateTime<chrono::Utc>>,
    refires: Vec<Refire>,
}

/// How many failed scheduler fires of one date the scheduler fires again after (at its
/// start, or `refire_after` a fire failed): past that, the date stays failed for `idem
/// status`, `idem run --missing` and a person.
pub(crate) const MAX_FIRE_ATTEMPTS: usize = 3;

/// Why a date no run processed is fired at start.
const NEVER_RUN: &str = "was never run";

/// A date to fire again, its first slot, how many scheduler fires of it failed, and why
/// (for the log).
struct Refire {
    date: chrono::NaiveDate,
    slot: chrono::DateTime<chrono::Utc>,
    failed: usize,
    why: &'static str,
}

/// The dates of `job` in its catch-up window (the last `catch_up_limit` days; none for a
/// `skip` job, whose failed dates are only logged) that the ledger says failed, were
/// abandoned or are missing: the latest run of the date failed (an interrupted fire is
/// recorded failed), or its lease expired without a result (the process SIGKILLed, its
/// node lost), and none completed, whichever replica ran it; or no run processed a slot
/// older than a minute although a scheduler fired the job before it. Those with [`MAX_FIRE_ATTEMPTS`] failed scheduler
/// fires stay failed, with a warning.
async fn failed_dates(job: &Job, store: &crate::store::DynStore) -> Result<Vec<Refire>> {
    use crate::schedule::status::{expected_states, ScopeState};
    let scheduled = job.scheduled()?;
    let days = match scheduled.missed {
        schedule::Missed::CatchUp { limit } => i64::from(limit),
        schedule::Missed::Skip => 1,
    };
    let now = chrono::Utc::now();
    let from = now - chrono::Duration::days(days);
    let runs = store
        .runs(&RunFilter {
            processor: Some(job.name.clone()),
            since: Some(from - chrono::Duration::days(1)),
            limit: 0,
            ..RunFilter::default()
        })
        .await?;
    let runs: Vec<&crate::model::RunRecord> = runs.iter().collect();
    let mut out = Vec::new();
    // Slots within a minute are the planner's to fire on time.
    let tolerance = schedule::scheduler::LATE_TOLERANCE;
    let states = expected_states(&scheduled, from, now, &runs, tolerance)?;
    let open = store.open_leases(Some(&job.name)).await?;
    let abandoned = |scope: &str| open.iter().any(|l| l.scope == scope && !l.running_at(now));
    // A hole: a slot no run processed although a scheduler fired the job for an older date (a
    // fire that could not reach the store, a replica stopped before it ran). A job
    // that never ran under a scheduler before a slot owes no history.
    let fired_before = |date| {
        runs.iter()
            .any(|r| r.trigger == Trigger::Scheduler && r.scope_date < date)
    };
    for (scope, of) in states {
        let lost = scope.state != ScopeState::Completed && abandoned(&scope.scope);
        let hole = scope.state == ScopeState::Missing
            && scheduled.missed != schedule::Missed::Skip
            && fired_before(scope.date);
        if scope.state != ScopeState::Failed && !lost && !hole {
            continue;
        }
        let (date, slot) = (scope.date, scope.due);
        let failed = of
            .iter()
            .filter(|r| {
                r.trigger == Trigger::Scheduler && r.status == crate::model::RunStatus::Failed
            })
            .count();
        if scheduled.missed == schedule::Missed::Skip {
            tracing::warn!(target: "idem::scheduler", "job {}: the fire of {date} ended failed, interrupted or abandoned; missed = \"skip\": not fired again (idem run {} --missing)", job.name, job.name);
        } else if failed >= MAX_FIRE_ATTEMPTS {
            tracing::warn!(target: "idem::scheduler", "job {}: {date}: {}", job.name, not_fired_again(failed, &job.name));
        } else {
            let why = if hole {
                NEVER_RUN
            } else if lost {
                "was abandoned (its lease expired without a result)"
            } else {
                "ended failed or interrupted"
            };
            out.push(Refire {
                date,
                slot,
                failed,
                why,
            });
        }
    }
    Ok(out)
}

/// Plans every job side by side (on the shared store of `overrides`), and reads where each
/// left off. A job that cannot be planned (its store unreachable) does not stop the others:
/// it is planned again at its next fire; jobs that failed for one reason are logged once.
async fn start_jobs(
    jobs: Vec<Job>,
    registry: &Registry,
    store_url: &str,
    overrides: &Overrides,
) -> Vec<(Job, Option<Started>)> {
    let mut planning = tokio::task::JoinSet::new();
    for (i, job) in jobs.into_iter().enumerate() {
        let (registry, store_url, overrides) =
            (registry.clone(), store_url.to_string(), overrides.clone());
        planning.spawn(async move {
            let started = start_job(&job, &registry, &store_url, overrides).await;
            (i, job, started)
        });
    }
    let mut started = Vec::new();
    let mut failed: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    while let Some(joined) = planning.join_next().await {
        match joined {
            Ok((i, job, Ok(s))) => started.push((i, job, Some(s))),
            Ok((i, job, Err(e))) => {
                failed
                    .entry(e.to_string())
                    .or_default()
                    .push(job.name.clone());
                started.push((i, job, None));
            }
            Err(e) => tracing::error!(target: "idem::scheduler", "planning a job panicked: {e}"),
        }
    }
    for (error, mut names) in failed {
        names.sort();
        tracing::error!(
            target: "idem::scheduler",
            "{} job(s) cannot start: {error}; their fires try again ({})",
            names.len(),
            names.join(", ")
        );
    }
    started.sort_by_key(|(i, _, _)| *i);
    started.into_iter().map(|(_, job, s)| (job, s)).collect()
}

/// Plans one job and reads its last scheduler fire that settled its slot (not one that met
/// another run's lease): slots after it were missed while no scheduler ran, caught up or
/// dropped with a warning as the job's `missed` says. Asked of the store directly, whatever
/// else (backfills, manual runs) the ledger holds since.
async fn start_job(
    job: &Job,
    registry: &Registry,
    store_url: &str,
    overrides: Overrides,
) -> Result<Started> {
    let plan = plan(job, registry, store_url, overrides).await?;
    let last = plan
        .runner
        .store()
        .runs(&RunFilter {
            processor: Some(job.name.clone()),
            trigger: Some(Trigger::Scheduler),
            except_skip_reason: Some(SkipReason::InProgress),
            limit: 1,
            ..RunFilter::default()
        })
        .await;
    let last_fire = match last {
        Ok(runs) => runs.first().map(|r| r.started_at),
        Err(e) => {
            let missed = job.scheduled().map(|s| s.missed);
            tracing::warn!(
                target: "idem::scheduler",
                "job {}: cannot read its last scheduled fire ({e}); slots missed before now are not {}",
                job.name,
                match missed { Ok(schedule::Missed::Skip) => "reported", _ => "caught up" }
            );
            None
        }
    };
    let refires = match failed_dates(job, &**plan.runner.store()).await {
        Ok(dates) => dates,
        Err(e) => {
            tracing::warn!(target: "idem::scheduler", "job {}: cannot read its failed dates ({e}): none fired again", job.name);
            Vec::new()
        }
    };
    Ok(Started {
        plan,
        last_fire,
        refires,
    })
}

/// A job the scheduler fires: its plan (made at start, or at its first fire when its store
/// could not be reached at start).
struct Target {
    job: Job,
    registry: Registry,
    store_url: String,
    overrides: Overrides,
    plan: tokio::sync::OnceCell<Plan>,
    stop: tokio::sync::watch::Receiver<Option<String>>,
    /// Cancelled at SIGTERM/SIGINT (no new fires): a fire waiting to try a held scope
    /// again stops waiting then, rather than holding the shutdown for the grace period.
    draining: Cancel,
    /// The dates a failed fire waits to fire again: one wait per date, however many of
    /// the job's fires of that date fail meanwhile.
    refiring: std::sync::Mutex<std::collections::HashSet<chrono::NaiveDate>>,
    /// How many times a failed fire was fired again (for the scheduler's last line).
    refired: std::sync::atomic::AtomicU64,
}

fn wrap(p: Plan, stop: tokio::sync::watch::Receiver<Option<String>>) -> Plan {
    let processor: Arc<dyn crate::processor::Processor> =
        Arc::new(schedule::scheduler::StopOnShutdown::new(p.processor, stop));
    Plan { processor, ..p }
}

/// How long to wait before a fire that met another run's lease tries again: until the
/// lease expires (its holder may be dead: a scheduler killed mid-fire), at least 1 s, at
/// most 60 s between looks (a live holder that releases early is seen soon).
fn retry_wait(expires_at: Option<chrono::DateTime<chrono::Utc>>) -> std::time::Duration {
    let until = expires_at
        .map(|t| (t - chrono::Utc::now()).to_std().unwrap_or_default())
        .unwrap_or(std::time::Duration::from_secs(5));
    until
        .saturating_add(std::time::Duration::from_millis(200))
        .clamp(
            std::time::Duration::from_secs(1),
            std::time::Duration::from_secs(60),
        )
}

/// After a scheduler fire of `scope` failed: how long until this scheduler fires it again
/// (the job's `refire_after`), or why it does not, as the end of the fire's log line: a
/// `skip` job (nothing said), or the date failed in [`MAX_FIRE_ATTEMPTS`] scheduler fires
/// (counted in the ledger, whichever replica fired them), or the ledger cannot say.
async fn refire_after(
    t: &Target,
    p: &Plan,
    scope: &str,
) -> std::result::Result<std::time::Duration, String> {
    let scheduled = t.job.scheduled().map_err(|_| String::new())?;
    if scheduled.missed == schedule::Missed::Skip {
        return Err(String::new());
    }
    let failed = failed_fires(t, p, scope).await?;
    if failed >= MAX_FIRE_ATTEMPTS {
        return Err(format!("; {}", not_fired_again(failed, &t.job.name)));
    }
    Ok(scheduled.refire_after())
}

/// What the log says of a date past [`MAX_FIRE_ATTEMPTS`] failed scheduler fires.
fn not_fired_again(failed: usize, job: &str) -> String {
    format!(
        "not fired again: {failed} failed scheduler fires (idem status; idem run {job} --missing)"
    )
}

/// How many scheduler fires of `scope` the ledger records failed, or why it cannot say
/// (as the end of a fire's log line).
async fn failed_fires(t: &Target, p: &Plan, scope: &str) -> std::result::Result<usize, String> {
    Ok(p.runner
        .store()
        .runs(&RunFilter {
            processor: Some(t.job.name.clone()),
            scope: Some(scope.to_string()),
            trigger: Some(Trigger::Scheduler),
            status: Some(RunStatus::Failed),
            limit: 0,
            ..RunFilter::default()
        })
        .await
        .map_err(|e| format!("; not fired again: the ledger cannot say how often it failed ({e})"))?
        .len())
}

/// Runs one fire as `idem run JOB --date DATE --trigger scheduler` would, and logs one
/// line for it. A fire that meets another run's lease (`skipped (in_progress)`) has not
/// settled its slot: the holder may be a run whose scheduler was killed. It tries again
/// when the lease expires or is released, until it runs or is skipped for another reason
/// (the holder completed it: `time_window`), or the scheduler stops. Each run's outcome
/// is counted in `metrics`.
async fn fire_one(
    targets: &std::collections::HashMap<String, Target>,
    metrics: &Metrics,
    f: schedule::scheduler::Fire,
) {
    let Some(t) = targets.get(&f.job) else {
        return;
    };
    metrics.fired(
        &f.job,
        (chrono::Utc::now() - f.slot).to_std().unwrap_or_default(),
    );
    let mut stop = t.stop.clone();
    // A run that failed or could not run once the grace period ended was stopped by it.
    let failed = |stop: &tokio::sync::watch::Receiver<Option<String>>| {
        let outcome = if stop.borrow().is_some() {
            FireOutcome::Interrupted
        } else {
            FireOutcome::Failed
        };
        metrics.outcome(&f.job, outcome);
    };
    let mut slot = if f.catch_up {
        format!("{} (catch-up)", f.local)
    } else {
        f.local.clone()
    };
    let planned = t
        .plan
        .get_or_try_init(|| async {
            crate::job::plan(&t.job, &t.registry, &t.store_url, t.overrides.clone())
                .await
                .map(|p| wrap(p, t.stop.clone()))
        })
        .await;
    let p = match planned {
        Ok(p) => p,
        Err(e) => {
            failed(&stop);
            tracing::error!(target: "idem::scheduler", "fire {} slot {slot} date {}: not run: {e}", f.job, f.date);
            return;
        }
    };
    loop {
        let request = match p.request(f.date) {
            Ok(r) => r,
            Err(e) => {
                failed(&stop);
                tracing::error!(target: "idem::scheduler", "fire {} slot {slot} date {}: {e}", f.job, f.date);
                return;
            }
        };
        let report = match p.runner.run(&*p.processor, request).await {
            Ok(report) => report,
            Err(e) => {
                failed(&stop);
                tracing::error!(
                    target: "idem::scheduler",
                    "fire {} slot {slot} date {}: not run: {e}",
                    f.job,
                    f.date
                );
                return;
            }
        };
        let outcome = match report.status {
            RunStatus::Completed => format!(
                "completed, {} record(s) in {} ms",
                report.records_processed.unwrap_or(0),
                report.duration_ms
            ),
            RunStatus::Skipped => format!(
                "skipped ({})",
                report
                    .skip_reason
                    .as_ref()
                    .map_or("unknown", |r| r.as_str())
            ),
            RunStatus::Failed => format!(
                "failed: {}",
                report.error.as_deref().unwrap_or("unknown error")
            ),
        };
        match report.status {
            RunStatus::Completed => {
                metrics.outcome(&f.job, FireOutcome::Completed(report.finished_at))
            }
            RunStatus::Skipped => {
                let reason = report
                    .skip_reason
                    .as_ref()
                    .map_or("unknown", |r| r.as_str());
                metrics.outcome(&f.job, FireOutcome::Skipped(reason.to_string()))
            }
            RunStatus::Failed => failed(&stop),
        }
        let in_progress = report.skip_reason == Some(SkipReason::InProgress);
        let stopping = stop.borrow().is_some() || t.draining.is_cancelled();
        // A fire that failed while this scheduler runs on is fired again by it (a `catch_up`
        // job, a bounded number of times); one its shutdown stopped is left to the next
        // replica's start.
        let refire = match report.status {
            RunStatus::Failed if !stopping => match refire_after(t, p, &report.scope).await {
                // One wait per date: a failed fire of a date another fire already waits
                // to fire again leaves it to that one.
                Ok(_) if !reserve(&t.refiring, f.date) => {
                    Err("; fired again by the refire of this date already waiting".into())
                }
                other => other,
            },
            _ => Err(String::new()),
        };
        let then = if in_progress {
            "; tries again when that lease expires or is released".to_string()
        } else {
            match &refire {
                Ok(wait) => format!("; fired again in {}", humantime::format_duration(*wait)),
                Err(why) => why.clone(),
            }
        };
        let line = format!(
            "fire {} slot {slot} date {}: {outcome}; run {}{then}",
            f.job, f.date, report.run_id,
        );
        if report.status == RunStatus::Failed {
            tracing::warn!(target: "idem::scheduler", "{line}");
        } else {
            tracing::info!(target: "idem::scheduler", "{line}");
        }
        if stopping {
            return;
        }
        let refiring = !in_progress && refire.is_ok();
        let wait = if in_progress {
            let holder = p
                .runner
                .store()
                .lease_holder(&report.job, &report.scope, chrono::Utc::now())
                .await
                .ok()
                .flatten();
            retry_wait(holder.map(|h| h.expires_at))
        } else if let Ok(wait) = refire {
            wait
        } else {
            return;
        };
        let woke = tokio::select! {
            _ = tokio::time::sleep(wait) => true,
            _ = stop.wait_for(Option::is_some) => false,
            _ = t.draining.cancelled() => false,
        };
        if refiring {
            release(&t.refiring, f.date);
        }
        if !woke {
            return;
        }
        if refiring {
            // Fired again only while the ledger still allows it: other fires of the date
            // (its next slots, another replica) may have failed meanwhile.
            match failed_fires(t, p, &report.scope).await {
                Ok(n) if n < MAX_FIRE_ATTEMPTS => {}
                Ok(n) => {
                    tracing::warn!(target: "idem::scheduler", "fire {} date {}: {}", f.job, f.date, not_fired_again(n, &f.job));
                    return;
                }
                Err(why) => {
                    tracing::warn!(target: "idem::scheduler", "fire {} date {}{why}", f.job, f.date);
                    return;
                }
            }
            slot = format!("{} (fired again)", f.local);
            t.refired.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Marks `date` as waiting to be fired again; false when it already was.
fn reserve(
    refiring: &std::sync::Mutex<std::collections::HashSet<chrono::NaiveDate>>,
    date: chrono::NaiveDate,
) -> bool {
    refiring
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(date)
}

/// `date` no longer waits to be fired again.
fn release(
    refiring: &std::sync::Mutex<std::collections::HashSet<chrono::NaiveDate>>,
    date: chrono::NaiveDate,
) {
    refiring
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&date);
}

#[derive(Debug, Args)]
pub(crate) struct SchedulerArgs {
    /// Only these jobs (names in --jobs-dir or paths to .toml files); default every job
    /// with a schedule.
    pub(super) jobs: Vec<String>,
    /// After SIGTERM/SIGINT, how long running jobs may take to finish before they are
    /// stopped and recorded as interrupted (their leases released).
    #[arg(long, default_value = "30s")]
    pub(super) grace: String,
    /// Serve health and metrics over HTTP/1.1 on ADDR, an IP:PORT such as 0.0.0.0:9090
    /// (port 0: any free port, logged as "listening on IP:PORT").
    ///
    /// GET /healthz: 200 while the scheduler loop ticks, 503 once it has stalled.
    ///
    /// GET /readyz: 200 once the jobs are planned and the store answers a query within 2 s
    /// (asked at each request), 503 naming the store's error otherwise.
    ///
    /// GET /metrics: Prometheus text format (fires, completed, skipped, failed and
    /// interrupted runs per job, last completion time, fire lag, store probe).
    ///
    /// Bound before anything fires (an address in use exits 2); closed on SIGTERM/SIGINT.
    /// Not served by default.
    #[arg(long, env = "IDEM_SCHEDULER_LISTEN", value_name = "ADDR", value_parser = parse_listen)]
    pub(super) listen: Option<SocketAddr>,
}

/// `--listen`: an IP address and a port.
fn parse_listen(s: &str) -> std::result::Result<SocketAddr, String> {
    s.trim().parse().map_err(|_| {
        format!("expected IP:PORT, such as 127.0.0.1:9090, 0.0.0.0:9090 or [::]:9090 (got {s:?})")
    })
}
