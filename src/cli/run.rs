//! `idem run` (one date, or a backfill with `--from/--to`) and `idem explain`: each builds
//! its run with [`job::plan`](crate::job::plan).

use super::parse_param;
use crate::model::Mode;
use clap::Args;
use std::path::PathBuf;

use std::sync::Arc;

use super::exec::{command_exit_code, stop_on_signals};
use super::output::{self, Format};
use super::{GlobalOptions, EXIT_OK};
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
    if args.parallel > 1 {
        return Err(Error::input(
            "--parallel runs several dates at once: it goes with --from/--to or --missing",
        ));
    }
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
    let (job, request) = match prepare(&run, g, &overrides) {
        Ok(prepared) => prepared,
        // A job without a job file (an `idem exec` job): what the ledger knows of it.
        Err(e) if find_job(&args.job, &g.jobs_dir, &g.store).is_err() => {
            return super::release::explain_ledger_job(args, g, e).await;
        }
        Err(e) => return Err(e),
    };
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
    run_dates(job, dates, args, g, registry).await
}

/// `idem run JOB --missing [--since D] [--parallel N] [--dry-run]`: the scopes `idem
/// status` calls missing or failed, oldest first, as a backfill runs its dates.
pub(super) async fn missing(args: &RunArgs, g: &GlobalOptions, registry: &Registry) -> Result<u8> {
    let job = find_job(&args.job, &g.jobs_dir, &g.store)?;
    if job.schedule.is_none() {
        return Err(Error::config(format!(
            "job {} has no schedule: nothing is expected of it, so nothing is missing (run \
             dates with --date or --from/--to)",
            job.name
        )));
    }
    let since = args.since.as_deref().unwrap_or("7d");
    let (statuses, _) =
        super::status::statuses(std::slice::from_ref(&job.name), since, "1h", g).await?;
    let scopes: Vec<_> = statuses
        .into_iter()
        .flat_map(|s| s.scopes)
        .filter(|s| s.state.needs_attention())
        .collect();
    if args.dry_run || scopes.is_empty() {
        output::print_missing(&job.name, since, &scopes, args.dry_run, g.format);
        return Ok(EXIT_OK);
    }
    let dates = scopes.iter().map(|s| s.date).collect();
    run_dates(job, dates, args, g, registry).await
}

/// Runs `dates` (at least one, in order) through the job's runner, up to `--parallel` at
/// once.
async fn run_dates(
    job: crate::job::Job,
    dates: Vec<chrono::NaiveDate>,
    args: &RunArgs,
    g: &GlobalOptions,
    registry: &Registry,
) -> Result<u8> {
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

#[derive(Debug, Clone, Args)]
pub(crate) struct RunArgs {
    /// Job name (in --jobs-dir) or path to a job .toml file.
    pub(super) job: String,
    /// The partition date: YYYY-MM-DD, today, yesterday or today-N (in the job's
    /// timezone); default the job's `date`.
    #[arg(long, allow_hyphen_values = true)]
    pub(super) date: Option<String>,
    /// The instant the scheduler meant to fire (RFC 3339), or `cronjob:JOB_NAME` (the Job a
    /// Kubernetes CronJob made for a slot, named after its minute): relative dates are
    /// evaluated there instead of at the clock, so a late retry still processes its slot's
    /// date.
    #[arg(long, value_name = "RFC3339")]
    pub(super) scheduled_at: Option<String>,
    /// Backfill: run every date from this one (YYYY-MM-DD, today, yesterday, today-N) ...
    #[arg(long, requires = "to", allow_hyphen_values = true, conflicts_with_all = ["date", "scheduled_at", "scope", "run_id"])]
    pub(super) from: Option<String>,
    /// ... to this one, inclusive, each through the guards (trigger backfill).
    #[arg(long, requires = "from", allow_hyphen_values = true)]
    pub(super) to: Option<String>,
    /// Backfill or --missing: run up to this many dates at once (1 to 32).
    #[arg(long, default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=32))]
    pub(super) parallel: u8,
    /// Run the scopes `idem status` calls missing or failed for this job in the period
    /// (--since), oldest first, each through the guards (trigger backfill).
    #[arg(long, conflicts_with_all = ["date", "scheduled_at", "scope", "run_id", "from"])]
    pub(super) missing: bool,
    /// With --missing: the period to look back over, as `idem status --since` (default 7d).
    #[arg(long, value_name = "DURATION", requires = "missing")]
    pub(super) since: Option<String>,
    /// With --missing: list the scopes it would run, and run nothing.
    #[arg(long, requires = "missing")]
    pub(super) dry_run: bool,
    /// Scope, when it is not just the date (default: the date).
    #[arg(long)]
    pub(super) scope: Option<String>,
    /// Why the run starts [default: manual; backfill with --from/--to].
    #[arg(long, value_enum)]
    pub(super) trigger: Option<Trigger>,
    /// Override the job's mode.
    #[arg(long, value_enum)]
    pub(super) mode: Option<Mode>,
    /// Override the job's store failure policy.
    #[arg(long, value_enum)]
    pub(super) on_store_failure: Option<StoreFailurePolicy>,
    /// Run id to record (default: a new UUID), e.g. the orchestrator's. A run id names
    /// one invocation in the ledger; when this one is taken already (orchestrators reuse
    /// theirs across retries and tasks), the run is recorded as ID.<8 hex digits>.
    #[arg(long)]
    pub(super) run_id: Option<String>,
    /// Exit with this status when the run is skipped (default 0).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8), conflicts_with_all = ["from", "missing"])]
    pub(super) skip_exit_code: Option<u8>,
    /// Write the run's metrics to FILE in Prometheus text format (for node_exporter's
    /// textfile collector), atomically, when the run ends (not with --from/--to).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["from", "missing"])]
    pub(super) metrics_file: Option<PathBuf>,
    /// A parameter over the job's `[params]` of that name (repeatable): what
    /// `{param.NAME}` is in a command job's arguments, `RunRequest::params` in Rust.
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_param)]
    pub(super) param: Vec<(String, String)>,
}

#[derive(Debug, Args)]
pub(crate) struct ExplainArgs {
    /// Job name (in --jobs-dir) or path to a job .toml file.
    pub(super) job: String,
    /// The partition date: YYYY-MM-DD, today, yesterday or today-N (in the job's
    /// timezone); default the job's `date`.
    #[arg(long, allow_hyphen_values = true)]
    pub(super) date: Option<String>,
    /// The instant the scheduler meant to fire (RFC 3339): relative dates are evaluated
    /// there instead of at the clock.
    #[arg(long, value_name = "RFC3339")]
    pub(super) scheduled_at: Option<String>,
    /// Scope, when it is not just the date (default: the date).
    #[arg(long)]
    pub(super) scope: Option<String>,
    /// Explain under this mode instead of the job's.
    #[arg(long, value_enum)]
    pub(super) mode: Option<Mode>,
    /// Not for explain (which takes one --date): accepted only to say so.
    #[arg(long, hide = true, allow_hyphen_values = true)]
    pub(super) from: Option<String>,
    /// Not for explain: see --from.
    #[arg(long, hide = true, allow_hyphen_values = true)]
    pub(super) to: Option<String>,
    /// Run the job's setup first (for SQL jobs whose content query needs the tables their
    /// setup creates); without it, explain changes nothing in the warehouse.
    #[arg(long)]
    pub(super) with_setup: bool,
    /// A parameter over the job's `[params]` of that name (repeatable), as `idem run` takes.
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_param)]
    pub(super) param: Vec<(String, String)>,
}

impl ExplainArgs {
    /// The run `idem run` would make with the same flags.
    fn run_args(&self) -> RunArgs {
        RunArgs {
            job: self.job.clone(),
            date: self.date.clone(),
            scheduled_at: self.scheduled_at.clone(),
            from: self.from.clone(),
            to: self.to.clone(),
            parallel: 1,
            missing: false,
            since: None,
            dry_run: false,
            scope: self.scope.clone(),
            trigger: None,
            mode: self.mode,
            on_store_failure: None,
            run_id: None,
            metrics_file: None,
            param: self.param.clone(),
            skip_exit_code: None,
        }
    }
}

/// `--to` without `--from`: clap's `requires` is not checked when `--date` or `--scope`
/// (which conflict with `--from`) are given, so it is checked here, never ignored.
pub(super) fn check_range(from: &Option<String>, to: &Option<String>) -> Result<()> {
    if to.is_some() && from.is_none() {
        return Err(Error::input(
            "--to needs --from: a range of dates is --from D1 --to D2",
        ));
    }
    Ok(())
}
