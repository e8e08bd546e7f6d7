//! `idem scheduler`: fires the scheduled jobs at their times, each through the runner
//! `idem run` uses ([`job::plan`](crate::job::plan)).

use std::sync::Arc;

use super::{cancel_on_signals, scheduled_jobs, GlobalOptions, SchedulerArgs, EXIT_OK};
use crate::error::{Error, Result};
use crate::job::{plan, Job, Overrides, Plan};
use crate::model::duration::parse_duration;
use crate::model::{RunStatus, Trigger};
use crate::processor::Registry;
use crate::runner::Cancel;
use crate::schedule;
use crate::store::RunFilter;

/// `idem scheduler [JOB...] [--grace 30s]`: fires each job's slots through the runner
/// `idem run` uses (trigger scheduler, the date derived from the slot in the job's zone);
/// stops on SIGTERM/SIGINT after the grace period; exit 0.
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
    let mut targets = std::collections::HashMap::new();
    for (job, s) in jobs.into_iter().zip(&scheduled) {
        // The scheduler, not the runner, decides when a signal stops a run: after the
        // grace period, through StopOnShutdown and the `stop_runs` token.
        let overrides = Overrides {
            trigger: Some(Trigger::Scheduler),
            cancel: Some(stop_runs.clone()),
            spool: true,
            ..Overrides::default()
        };
        let Plan {
            job,
            runner,
            processor,
            overrides,
        } = plan(&job, registry, &g.store, overrides).await?;
        if matches!(s.missed, schedule::Missed::CatchUp { .. }) {
            let recent = runner
                .store()
                .runs(&RunFilter {
                    processor: Some(job.name.clone()),
                    scope: None,
                    status: None,
                    since: None,
                    limit: 1000,
                })
                .await?;
            if let Some(last) = recent.iter().find(|r| r.trigger == Trigger::Scheduler) {
                planner.resume_after(&job.name, last.started_at);
            }
        }
        let processor: Arc<dyn crate::processor::Processor> =
            Arc::new(sched::StopOnShutdown::new(processor, stop_rx.clone()));
        targets.insert(
            job.name.clone(),
            Plan {
                job,
                runner,
                processor,
                overrides,
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
    let fire = move |f: sched::Fire| {
        let targets = targets.clone();
        async move { fire_one(&targets, f).await }
    };
    let summary = sched::run_loop(&mut planner, clock, fire, shutdown, grace, stop_tx).await?;
    tracing::info!(
        target: "idem::scheduler",
        "scheduler stopped: {} fire(s), {} missed slot(s) dropped, {} interrupted",
        summary.fired,
        summary.dropped,
        summary.interrupted
    );
    Ok(EXIT_OK)
}

/// Runs one fire as `idem run JOB --date DATE --trigger scheduler` would, and logs one
/// line for it.
async fn fire_one(targets: &std::collections::HashMap<String, Plan>, f: schedule::scheduler::Fire) {
    let Some(t) = targets.get(&f.job) else {
        return;
    };
    let slot = if f.catch_up {
        format!("{} (catch-up)", f.local)
    } else {
        f.local.clone()
    };
    let request = match t.request(f.date) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(target: "idem::scheduler", "fire {} slot {slot} date {}: {e}", f.job, f.date);
            return;
        }
    };
    match t.runner.run(&*t.processor, request).await {
        Ok(report) => {
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
            let line = format!(
                "fire {} slot {slot} date {}: {outcome}; run {}",
                f.job, f.date, report.run_id
            );
            if report.status == RunStatus::Failed {
                tracing::warn!(target: "idem::scheduler", "{line}");
            } else {
                tracing::info!(target: "idem::scheduler", "{line}");
            }
        }
        Err(e) => tracing::error!(
            target: "idem::scheduler",
            "fire {} slot {slot} date {}: not run: {e}",
            f.job,
            f.date
        ),
    }
}
