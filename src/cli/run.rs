//! `idem run` (one date, or a backfill with `--from/--to`) and `idem explain`: each builds
//! its run with [`job::plan`](crate::job::plan).

use std::sync::Arc;

use super::exec::{command_exit_code, stop_on_signals};
use super::output::{self, Format};
use super::{ExplainArgs, GlobalOptions, RunArgs, EXIT_OK};
use crate::error::{Error, Result};
use crate::job::{find_job, plan, Job, Overrides};
use crate::model::{RunRequest, Trigger};
use crate::processor::Registry;
use crate::runner::{Cancel, RunReport, StoreFailurePolicy};

impl RunArgs {
    /// The overrides the flags ask for; `default_trigger` when `--trigger` is not given.
    pub(super) fn overrides(&self, default_trigger: Trigger, cancel: Option<Cancel>) -> Overrides {
        Overrides {
            mode: self.mode,
            store_failure: self.on_store_failure,
            trigger: Some(self.trigger.unwrap_or(default_trigger)),
            scope: self.scope.clone(),
            run_id: self.run_id.clone(),
            cancel,
            spool: true,
            params: self.param.iter().cloned().collect(),
            connections: None,
        }
    }
}

/// The job and the request of `idem run`/`idem explain` for one date (before any store is
/// opened, so bad flags are reported as such).
fn prepare(args: &RunArgs, g: &GlobalOptions, overrides: &Overrides) -> Result<(Job, RunRequest)> {
    if args.from.is_some() || args.to.is_some() {
        return Err(Error::input(
            "--from/--to backfill a range with `idem run`; explain takes one --date",
        ));
    }
    let job = find_job(&args.job, &g.jobs_dir, &g.store)?;
    let date = job.run_date(
        args.date.as_deref(),
        args.scheduled_at.as_deref(),
        chrono::Utc::now(),
    )?;
    let request = overrides.request(&job, date)?;
    Ok((job, request))
}

/// `idem run JOB`: one date through the guards; a signal (SIGINT, SIGTERM, SIGHUP, …)
/// stops the processor and records the run as interrupted. A command job exits as
/// `idem exec` does (the program's status; [`command_exit_code`]).
pub(super) async fn run(args: &RunArgs, g: &GlobalOptions, registry: &Registry) -> Result<u8> {
    super::check_range(&args.from, &args.to)?;
    let cancel = stop_on_signals()?;
    let overrides = args.overrides(Trigger::Manual, Some(cancel.clone()));
    let (job, request) = prepare(args, g, &overrides)?;
    if let Some(path) = &args.metrics_file {
        let warehouse = job.warehouse_url(&g.store);
        super::refuse_to_overwrite("--metrics-file", path, &[], &[&g.store, &warehouse])?;
    }
    let plan = plan(&job, registry, &g.store, overrides).await?;
    let report = plan.runner.run(&*plan.processor, request).await?;
    output::print_report(&report, g.format);
    let code = if job.processor == crate::command::COMMAND_PROCESSOR {
        command_exit_code(&report, &cancel, args.skip_exit_code)
    } else if report.status == crate::model::RunStatus::Skipped {
        args.skip_exit_code.unwrap_or(EXIT_OK)
    } else {
        report.exit_code()
    };
    if let Some(path) = &args.metrics_file {
        super::metrics::write_atomically(path, &super::metrics::run_metrics(&report, code))?;
    }
    Ok(code)
}

/// `idem explain JOB`: what a run would decide now, nothing run or claimed.
pub(super) async fn explain(
    args: &ExplainArgs,
    g: &GlobalOptions,
    registry: &Registry,
) -> Result<u8> {
    let run = args.run_args();
    let mut overrides = run.overrides(Trigger::Manual, None);
    // Explain needs the store as it is: never an unavailable stand-in, and no spool.
    overrides.store_failure = Some(StoreFailurePolicy::Strict);
    overrides.spool = false;
    let (job, request) = prepare(&run, g, &overrides)?;
    // Explain changes nothing: on a SQLite ledger not made yet, it judges against an empty
    // one in memory rather than create the file.
    let store = match super::missing_ledger(&g.store)? {
        Some(path) => {
            output::note(format_args!(
                "warning: {}; explaining against an empty ledger",
                super::no_ledger_message(&path)
            ));
            "memory://".to_string()
        }
        None => g.store.clone(),
    };
    let plan = plan(&job, registry, &store, overrides).await?;
    let explanation = plan
        .runner
        .explain_with(&*plan.processor, &request, args.with_setup)
        .await?;
    output::print_explanation(&explanation, g.format);
    Ok(EXIT_OK)
}

/// `idem run JOB --from D1 --to D2 [--parallel N]`: every date through the runner, as
/// `idem run` runs one, up to N at once (the lease keeps one run per scope); a progress bar
/// on a terminal, a line per date otherwise; a signal or a store error starts no new date
/// (running ones are recorded as interrupted by the runner); exit 1 if a date failed.
pub(super) async fn backfill(args: &RunArgs, g: &GlobalOptions, registry: &Registry) -> Result<u8> {
    let job = find_job(&args.job, &g.jobs_dir, &g.store)?;
    let dates = job.backfill_dates(
        args.from.as_deref().unwrap_or_default(),
        args.to.as_deref().unwrap_or_default(),
        chrono::Utc::now(),
    )?;
    // One token stops the running dates (the runner) and the dates after them (here).
    let cancel = stop_on_signals()?;
    let mut overrides = args.overrides(Trigger::Backfill, Some(cancel.clone()));
    // The dates run side by side share the store: a few connections for them all.
    if args.parallel > 1 {
        overrides.connections = Some(crate::job::Connections::new(crate::store::PoolSize::SHARED));
    }
    let requests = dates
        .iter()
        .map(|d| overrides.request(&job, *d))
        .collect::<Result<Vec<_>>>()?;
    let plan = plan(&job, registry, &g.store, overrides).await?;
    let bar = output::backfill_bar(dates.len(), g.format);
    let parallel = usize::from(args.parallel.max(1));
    let mut summary = crate::schedule::BackfillSummary::default();
    let mut reports = Vec::new();
    let mut failure = None;
    let mut pending = requests.into_iter();
    let mut running = tokio::task::JoinSet::new();
    loop {
        while running.len() < parallel && failure.is_none() && !cancel.is_cancelled() {
            let Some(request) = pending.next() else { break };
            let (runner, processor) = (plan.runner.clone(), Arc::clone(&plan.processor));
            running.spawn(async move {
                let date = request.scope_date;
                (date, runner.run(&*processor, request).await)
            });
        }
        let Some(joined) = running.join_next().await else {
            break;
        };
        bar.inc(1);
        match joined {
            Ok((date, Ok(report))) => {
                summary.add(
                    date,
                    report.status,
                    report.skip_reason.as_ref(),
                    report.exit_code(),
                );
                if g.format == Format::Human {
                    bar.suspend(|| output::print_backfill_line(&report));
                }
                reports.push((date, report));
            }
            Ok((_, Err(e))) => {
                failure.get_or_insert(e);
            }
            Err(e) => {
                failure.get_or_insert(Error::config(format!("a backfill date panicked: {e}")));
            }
        }
    }
    bar.finish_and_clear();
    // Dates never started, and those whose run ended in an error before it was recorded.
    summary.not_run = dates.len() - reports.len();
    summary.failed_dates.sort();
    reports.sort_by_key(|(date, _)| *date);
    let reports: Vec<RunReport> = reports.into_iter().map(|(_, r)| r).collect();
    output::print_backfill(
        &job.name,
        (dates[0], dates[dates.len() - 1]),
        &summary,
        failure.as_ref(),
        &reports,
        g.format,
    );
    match failure {
        Some(e) => Err(e),
        None => Ok(summary.exit_code()),
    }
}
