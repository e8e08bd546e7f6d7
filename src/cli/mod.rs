//! The `idem` command line, reusable from your own binary.
//!
//! Register your processors and hand over:
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     let registry = idem::Registry::new(); // .with(MyProcessor)
//!     idem::cli::main_with(registry)
//! }
//! ```
//!
//! Exit codes: 0 completed or skipped (a skip is a success), 1 the run failed, 2 bad
//! usage, configuration or input, 3 store unavailable (under `strict`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::error::{Error, Result};
use crate::job::{find_job, load_jobs, scan_jobs, Job};
use crate::model::duration::{parse_duration, parse_duration_field};
use crate::model::{Mode, RunRequest, RunStatus, Trigger};
use crate::processor::Registry;
use crate::runner::{Explanation, RunReport, StoreFailurePolicy};
use crate::schedule::{self, export, JobPlan, ScheduledJob};
use crate::store::spool::Spool;
use crate::store::{
    self, BreakerConfig, CircuitBreakerStore, DynStore, RunFilter, UnavailableStore,
};

/// `println!` that ignores a closed stdout (`idem runs | head -1`): a reader that went
/// away is not a crash, and the command's exit code stays its own.
macro_rules! outln {
    () => {{
        let _ = writeln!(std::io::stdout().lock());
    }};
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `eprintln!` that ignores a closed stderr.
macro_rules! errln {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// Exit code: completed or skipped.
pub const EXIT_OK: u8 = 0;
/// Exit code: the run failed.
pub const EXIT_RUN_FAILED: u8 = 1;
/// Exit code: bad usage, configuration or input.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the store is unavailable (strict policy).
pub const EXIT_STORE_UNAVAILABLE: u8 = 3;

/// Idempotent scheduled batch jobs: leases, time windows, content hashes and a run ledger.
///
/// Exit codes: 0 completed or skipped, 1 the run failed, 2 bad usage/config/input,
/// 3 store unavailable (strict).
#[derive(Debug, Parser)]
#[command(name = "idem", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    global: GlobalOptions,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args)]
struct GlobalOptions {
    /// Store URL: sqlite://PATH, postgres://USER@HOST/DB, bigquery://PROJECT/DATASET, memory://
    #[arg(long, global = true, env = "IDEM_STORE", default_value = store::DEFAULT_STORE_URL)]
    store: String,
    /// Folder with the job files (*.toml).
    #[arg(long, global = true, env = "IDEM_JOBS_DIR", default_value = "jobs")]
    jobs_dir: PathBuf,
    /// Output format (markdown and html: idem report only).
    #[arg(long = "format", global = true, value_enum, default_value_t = FormatArg::Human)]
    format_arg: FormatArg,
    /// `--format` for the commands other than report (set by `execute`).
    #[arg(skip = Format::Human)]
    format: Format,
}

/// The values of `--format`: every command takes human and json, `idem report` also
/// markdown and html.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FormatArg {
    Human,
    Json,
    Markdown,
    Html,
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Lines for people.
    Human,
    /// One JSON document for machines.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a job for a scope behind its guards, and record the outcome.
    Run(RunArgs),
    /// Show what a run would decide now and why, without running or claiming anything.
    Explain(ExplainArgs),
    /// Create or upgrade the store's tables.
    Migrate,
    /// List the jobs in the jobs folder, validating every file (exit 2 naming each bad one).
    Jobs,
    /// Show recent runs from the ledger, newest first.
    Runs(RunsArgs),
    /// Forget the processing keys of a job (one scope, or all) so the next run is not skipped.
    Purge(PurgeArgs),
    /// Delete keys, ledger rows and expired leases older than the retention.
    Cleanup(CleanupArgs),
    /// List the scheduled jobs and their next fire times; `schedule export` writes them
    /// out for cron or Cloud Scheduler.
    Schedule(ScheduleArgs),
    /// Print the fingerprint of a set of trade events (NDJSON), as the Python services
    /// compute it: SHA-256 of the sorted event signatures.
    Fingerprint(FingerprintArgs),
    /// Fire the scheduled jobs at their times, each through the guards like `idem run`
    /// (trigger scheduler), until SIGTERM or SIGINT.
    Scheduler(SchedulerArgs),
    /// Is the content hash worth it? Per job, from the ledger: duplicate and wasted runs,
    /// what the guards prevented (or would have, in shadow mode), and a verdict with its
    /// reasons.
    Report(ReportArgs),
}

#[derive(Debug, Args)]
struct SchedulerArgs {
    /// Only these jobs (names in --jobs-dir or paths to .toml files); default every job
    /// with a schedule.
    jobs: Vec<String>,
    /// After SIGTERM/SIGINT, how long running jobs may take to finish before they are
    /// stopped and recorded as interrupted (their leases released).
    #[arg(long, default_value = "30s")]
    grace: String,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
struct ScheduleArgs {
    /// Only this job (name in --jobs-dir or path to a .toml file).
    job: Option<String>,
    /// How many fire times to list per job.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=1000))]
    next: u16,
    /// List the fire times after this instant (RFC 3339) instead of after now.
    #[arg(long, value_name = "RFC3339")]
    after: Option<String>,
    #[command(subcommand)]
    command: Option<ScheduleCommand>,
}

#[derive(Debug, Subcommand)]
enum ScheduleCommand {
    /// Print the scheduled jobs as crontab lines or as gcloud commands (text).
    Export(ExportArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["crontab", "cloud_scheduler"])))]
struct ExportArgs {
    /// Only this job.
    job: Option<String>,
    /// Crontab lines: CRON_TZ, schedule, `idem run JOB --date EXPR --trigger scheduler`.
    #[arg(long)]
    crontab: bool,
    /// `gcloud` commands: a Cloud Run job per idem job and the Cloud Scheduler job that
    /// starts it.
    #[arg(long, value_name = "PROJECT/REGION")]
    cloud_scheduler: Option<String>,
    /// Crontab: the idem binary the lines run (cron's PATH is short; give a full path).
    #[arg(long, default_value = "idem")]
    idem_bin: String,
    /// Crontab: the folder each line runs in (default: the current folder).
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Crontab: each job appends its output to LOG_DIR/JOB.log.
    #[arg(long, default_value = "/var/log/idem")]
    log_dir: String,
    /// Cloud Scheduler: the container image (default REGION-docker.pkg.dev/PROJECT/idem/idem:latest).
    #[arg(long)]
    image: Option<String>,
    /// Cloud Scheduler: the service account that starts and runs the jobs
    /// (default idem@PROJECT.iam.gserviceaccount.com).
    #[arg(long)]
    service_account: Option<String>,
    /// Cloud Scheduler: the jobs folder inside the image.
    #[arg(long, default_value = "/app/jobs")]
    image_jobs_dir: String,
}

#[derive(Debug, Clone, Args)]
struct RunArgs {
    /// Job name (in --jobs-dir) or path to a job .toml file.
    job: String,
    /// The partition date: YYYY-MM-DD, today, yesterday or today-N (in the job's
    /// timezone); default the job's `date`.
    #[arg(long, allow_hyphen_values = true)]
    date: Option<String>,
    /// The instant the scheduler meant to fire (RFC 3339): relative dates are evaluated
    /// there instead of at the clock, so a late retry still processes its slot's date.
    #[arg(long, value_name = "RFC3339")]
    scheduled_at: Option<String>,
    /// Backfill: run every date from this one (YYYY-MM-DD, today, yesterday, today-N) ...
    #[arg(long, requires = "to", allow_hyphen_values = true, conflicts_with_all = ["date", "scheduled_at", "scope", "run_id"])]
    from: Option<String>,
    /// ... to this one, inclusive, each through the guards (trigger backfill).
    #[arg(long, requires = "from", allow_hyphen_values = true)]
    to: Option<String>,
    /// Backfill: run up to this many dates at once (1 to 32).
    #[arg(long, default_value_t = 1, requires = "from",
          value_parser = clap::value_parser!(u8).range(1..=32))]
    parallel: u8,
    /// Scope, when it is not just the date (default: the date).
    #[arg(long)]
    scope: Option<String>,
    /// Why the run starts [default: manual; backfill with --from/--to].
    #[arg(long, value_enum)]
    trigger: Option<TriggerArg>,
    /// Override the job's mode.
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// Override the job's store failure policy.
    #[arg(long, value_enum)]
    on_store_failure: Option<PolicyArg>,
    /// Run id to record (default: a new UUID), e.g. the orchestrator's. A run id names
    /// one invocation in the ledger; when this one is taken already (orchestrators reuse
    /// theirs across retries and tasks), the run is recorded as ID.<8 hex digits>.
    #[arg(long)]
    run_id: Option<String>,
}

#[derive(Debug, Args)]
struct ExplainArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Run the job's setup first (for SQL jobs whose content query needs the tables their
    /// setup creates); without it, explain changes nothing anywhere.
    #[arg(long)]
    with_setup: bool,
}

#[derive(Debug, Args)]
struct RunsArgs {
    /// Only this job.
    #[arg(long)]
    job: Option<String>,
    /// Only this scope.
    #[arg(long)]
    scope: Option<String>,
    /// Only this status.
    #[arg(long, value_enum)]
    status: Option<StatusArg>,
    /// At most this many rows (0 = all).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    limit: u32,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["date", "scope", "from", "all"])))]
struct PurgeArgs {
    /// Job name (in --jobs-dir) or path to a job .toml file; it must exist.
    job: String,
    /// Only this date's scope (YYYY-MM-DD, today, yesterday, today-N in the job's zone).
    #[arg(long, allow_hyphen_values = true, conflicts_with_all = ["scope", "all", "from"])]
    date: Option<String>,
    /// Only this scope.
    #[arg(long, conflicts_with_all = ["all", "from"])]
    scope: Option<String>,
    /// Every date's scope from this one ...
    #[arg(
        long,
        requires = "to",
        allow_hyphen_values = true,
        conflicts_with = "all"
    )]
    from: Option<String>,
    /// ... to this one, inclusive.
    #[arg(long, requires = "from", allow_hyphen_values = true)]
    to: Option<String>,
    /// Every scope of the job.
    #[arg(long)]
    all: bool,
    /// Do not ask (required when stdin is not a terminal).
    #[arg(long)]
    yes: bool,
}

#[derive(Debug, Args)]
struct CleanupArgs {
    /// Keep this much history (e.g. 30d; at most 36525d, 100 years).
    #[arg(long, default_value = "30d")]
    keep: String,
    /// Keep this much of the ledger; older rows go, except those a kept key points at.
    #[arg(long, default_value = "90d")]
    keep_runs: String,
    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// At most this many rows per delete statement (each its own transaction).
    #[arg(long, default_value_t = store::DEFAULT_CLEANUP_BATCH as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    batch: u64,
}

#[derive(Debug, Args)]
struct FingerprintArgs {
    /// NDJSON file of events, one JSON object a line (default: standard input).
    file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum TriggerArg {
    Scheduler,
    Manual,
    Pubsub,
    Retry,
    Backfill,
}

impl From<TriggerArg> for Trigger {
    fn from(t: TriggerArg) -> Trigger {
        match t {
            TriggerArg::Scheduler => Trigger::Scheduler,
            TriggerArg::Manual => Trigger::Manual,
            TriggerArg::Pubsub => Trigger::Pubsub,
            TriggerArg::Retry => Trigger::Retry,
            TriggerArg::Backfill => Trigger::Backfill,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ModeArg {
    Enforce,
    Shadow,
    Off,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Enforce => Mode::Enforce,
            ModeArg::Shadow => Mode::Shadow,
            ModeArg::Off => Mode::Off,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
#[value(rename_all = "snake_case")]
enum PolicyArg {
    Strict,
    BestEffort,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StatusArg {
    Completed,
    Failed,
    Skipped,
}

impl From<StatusArg> for RunStatus {
    fn from(s: StatusArg) -> RunStatus {
        match s {
            StatusArg::Completed => RunStatus::Completed,
            StatusArg::Failed => RunStatus::Failed,
            StatusArg::Skipped => RunStatus::Skipped,
        }
    }
}

/// Parses the process arguments, runs the command with `registry`'s processors available
/// to jobs, prints the result and returns the exit code.
pub fn main_with(registry: Registry) -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { EXIT_OK });
        }
    };
    init_logging(if matches!(cli.command, Command::Scheduler(_)) {
        // One line per fire.
        "warn,idem::scheduler=info"
    } else {
        "warn"
    });
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            errln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_RUN_FAILED);
        }
    };
    let code = runtime.block_on(execute(cli, &registry));
    ExitCode::from(code)
}

fn init_logging(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

fn exit_code_for(e: &Error) -> u8 {
    match e {
        e if e.is_store_failure() => EXIT_STORE_UNAVAILABLE,
        e if e.is_usage() => EXIT_USAGE,
        _ => EXIT_RUN_FAILED,
    }
}

/// Runs a parsed command; returns the exit code (errors are printed as `error: …`).
pub async fn execute(mut cli: Cli, registry: &Registry) -> u8 {
    cli.global.format = match cli.global.format_arg {
        FormatArg::Json => Format::Json,
        _ => Format::Human,
    };
    if let (FormatArg::Markdown | FormatArg::Html, false) = (
        cli.global.format_arg,
        matches!(cli.command, Command::Report(_)),
    ) {
        errln!("error: --format markdown and --format html are for idem report only");
        return EXIT_USAGE;
    }
    let format = cli.global.format;
    match dispatch(cli, registry).await {
        Ok(code) => code,
        Err(e) => {
            let code = exit_code_for(&e);
            if format == Format::Json {
                let doc = serde_json::json!({"error": e.to_string(), "exit_code": code});
                outln!("{doc}");
            }
            errln!("error: {e}");
            code
        }
    }
}

async fn open_store(url: &str, policy: StoreFailurePolicy) -> Result<Arc<DynStore>> {
    let inner: Arc<DynStore> = match store::open(url).await {
        Ok(s) => s,
        Err(e) if e.is_store_failure() && policy == StoreFailurePolicy::BestEffort => {
            tracing::warn!("{e}; continuing without a store (best_effort)");
            let message = match e {
                Error::StoreUnavailable { message, .. } => message,
                other => other.to_string(),
            };
            Arc::new(UnavailableStore::new(url, message))
        }
        Err(e) => return Err(e),
    };
    // In one CLI invocation a store that failed twice is not tried again.
    Ok(Arc::new(CircuitBreakerStore::new(
        inner,
        BreakerConfig {
            failure_threshold: 2,
            reset_timeout: Duration::from_secs(30),
        },
    )))
}

/// Records results spooled while the store was unreachable; problems are warnings (the
/// command goes on, and the spool keeps what was not recorded).
async fn replay_spool(spool: &Spool, store: &DynStore) {
    if !spool.path().exists() {
        return;
    }
    match spool.replay(store).await {
        Ok(r) if r.remaining > 0 => tracing::warn!(
            "{} spooled run(s) still wait in {}",
            r.remaining,
            spool.path().display()
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("spooled runs not recorded yet: {e}"),
    }
}

fn print_json<T: serde::Serialize>(value: &T) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer_pretty(&mut out, value);
    let _ = writeln!(out);
}

async fn dispatch(cli: Cli, registry: &Registry) -> Result<u8> {
    let g = cli.global;
    match cli.command {
        Command::Run(args) if args.from.is_some() => run_backfill(&args, &g, registry).await,
        Command::Run(args) => {
            let (job, request) = prepare(&args, &g)?;
            let (runner, processor) = job_runner(&job, &args, &g, registry).await?;
            let report = runner.run(&*processor, request).await?;
            print_report(&report, g.format);
            Ok(report.exit_code())
        }
        Command::Explain(ExplainArgs {
            run: args,
            with_setup,
        }) => {
            let (job, request) = prepare(&args, &g)?;
            let store = open_store(&g.store, StoreFailurePolicy::Strict).await?;
            let processor = job.processor(registry, &g.store).await?;
            let mut runner = job.runner(store)?;
            if let Some(mode) = args.mode {
                runner = runner.mode(mode.into());
            }
            let explanation = runner
                .explain_with(&*processor, &request, with_setup)
                .await?;
            print_explanation(&explanation, g.format);
            Ok(EXIT_OK)
        }
        Command::Migrate => {
            let store = store::open(&g.store).await?;
            store.migrate().await?;
            match g.format {
                Format::Json => {
                    print_json(&serde_json::json!({"store": store.describe(), "migrated": true}))
                }
                Format::Human => outln!("migrated {}", store.describe()),
            }
            Ok(EXIT_OK)
        }
        Command::Jobs => {
            // Every file is validated and every problem reported, not just the first.
            let scan = scan_jobs(&g.jobs_dir, &g.store)?;
            if scan.problems.is_empty() {
                print_jobs(&scan.jobs, g.format)?;
                return Ok(EXIT_OK);
            }
            let summary = format!(
                "{} of {} job file(s) in {} are invalid",
                scan.problems.len(),
                scan.problems.len() + scan.jobs.len(),
                g.jobs_dir.display()
            );
            match g.format {
                Format::Json => print_json(&serde_json::json!({
                    "error": summary,
                    "exit_code": EXIT_USAGE,
                    "problems": scan.problems,
                    "jobs": job_docs(&scan.jobs)?,
                })),
                Format::Human if !scan.jobs.is_empty() => print_jobs(&scan.jobs, g.format)?,
                Format::Human => {}
            }
            for p in &scan.problems {
                eprintln!("error: {}", p.error);
            }
            eprintln!("error: {summary}");
            Ok(EXIT_USAGE)
        }
        Command::Runs(args) => {
            let store = store::open(&g.store).await?;
            replay_spool(&Spool::from_env(&g.store), &*store).await;
            let runs = store
                .runs(&RunFilter {
                    processor: args.job,
                    scope: args.scope,
                    status: args.status.map(Into::into),
                    since: None,
                    limit: args.limit as usize,
                })
                .await?;
            match g.format {
                Format::Json => print_json(&runs),
                Format::Human => {
                    if runs.is_empty() {
                        outln!("no runs recorded in {}", store.describe());
                    }
                    for r in &runs {
                        let why = r
                            .skip_reason
                            .as_ref()
                            .map(|s| s.to_string())
                            .or_else(|| {
                                r.would_skip_reason
                                    .as_ref()
                                    .map(|s| format!("would skip: {s}"))
                            })
                            .or_else(|| r.error.clone())
                            .unwrap_or_default();
                        outln!(
                            "{}  {:<9} {} {}  run {}  {} ms  {}",
                            r.started_at.format("%Y-%m-%d %H:%M:%S"),
                            r.status.as_str(),
                            r.processor,
                            r.scope,
                            r.run_id,
                            r.duration_ms,
                            why
                        );
                    }
                }
            }
            Ok(EXIT_OK)
        }
        Command::Purge(args) => purge_command(args, &g).await,
        Command::Schedule(args) => schedule_command(args, &g),
        Command::Fingerprint(args) => {
            let (fingerprint, events) = fingerprint_events(args.file.as_deref())?;
            match g.format {
                Format::Json => {
                    print_json(&serde_json::json!({"fingerprint": fingerprint, "events": events}))
                }
                Format::Human => println!("{fingerprint}"),
            }
            Ok(EXIT_OK)
        }
        Command::Scheduler(args) => scheduler_command(args, &g, registry).await,
        Command::Report(args) => report_command(args, &g).await,
        Command::Cleanup(args) => {
            // Bounded by MAX_DURATION, so the cutoff is always a valid time.
            let keep = parse_duration_field("--keep", &args.keep)?;
            let before = chrono::Duration::from_std(keep)
                .ok()
                .and_then(|keep| chrono::Utc::now().checked_sub_signed(keep))
                .ok_or_else(|| Error::config(format!("--keep {:?} is too long", args.keep)))?;
            let store = store::open(&g.store).await?;
            cleanup_command(&*store, before, &args, g.format).await
        }
    }
}

fn prepare(args: &RunArgs, g: &GlobalOptions) -> Result<(Job, RunRequest)> {
    if args.from.is_some() {
        return Err(Error::config(
            "--from/--to backfill a range with `idem run`; explain takes one --date",
        ));
    }
    let job = find_job(&args.job, &g.jobs_dir, &g.store)?;
    let date = schedule::run_date(
        args.date.as_deref(),
        job.date.as_deref(),
        args.scheduled_at.as_deref(),
        scheduled_job(&job)?.tz()?,
        chrono::Utc::now(),
    )?;
    let request = request_for(args, &job, date)?;
    Ok((job, request))
}

/// The request `idem run` makes for one date.
fn request_for(args: &RunArgs, job: &Job, date: chrono::NaiveDate) -> Result<RunRequest> {
    let default_trigger = if args.from.is_some() {
        Trigger::Backfill
    } else {
        Trigger::Manual
    };
    let mut request = RunRequest::new(job.name.clone(), date)
        .with_trigger(args.trigger.map_or(default_trigger, Into::into))
        .with_params(job.params_json());
    if let Some(scope) = &args.scope {
        request = request.with_scope(scope.clone());
    }
    if let Some(id) = &args.run_id {
        request.run_id = id.clone();
    }
    request.validate()?;
    Ok(request)
}

/// The runner and processor `idem run` uses for a job: the store (with the job's failure
/// policy or `--on-store-failure`), the spool replayed, interruptible, `--mode` applied.
async fn job_runner(
    job: &Job,
    args: &RunArgs,
    g: &GlobalOptions,
    registry: &Registry,
) -> Result<(crate::runner::Runner, Arc<dyn crate::processor::Processor>)> {
    let policy = match args.on_store_failure {
        Some(PolicyArg::Strict) => StoreFailurePolicy::Strict,
        Some(PolicyArg::BestEffort) => StoreFailurePolicy::BestEffort,
        None => job.store_failure()?,
    };
    let store = open_store(&g.store, policy).await?;
    let spool = Spool::from_env(&g.store);
    replay_spool(&spool, &*store).await;
    let processor = job
        .processor_with_store(registry, &g.store, Some(store.clone()))
        .await?;
    let mut runner = job
        .runner(store)?
        .store_failure_policy(policy)
        .interruptible(true)
        .spool(spool);
    if let Some(mode) = args.mode {
        runner = runner.mode(mode.into());
    }
    Ok((runner, processor))
}

/// `idem run JOB --from D1 --to D2 [--parallel N]`: every date through the runner, as
/// `idem run` runs one, up to N at once (the lease keeps one run per scope); a progress bar
/// on a terminal, a line per date otherwise; a signal or a store error starts no new date
/// (running ones are recorded as interrupted by the runner); exit 1 if a date failed.
async fn run_backfill(args: &RunArgs, g: &GlobalOptions, registry: &Registry) -> Result<u8> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let job = find_job(&args.job, &g.jobs_dir, &g.store)?;
    let dates = schedule::backfill_dates(
        args.from.as_deref().unwrap_or_default(),
        args.to.as_deref().unwrap_or_default(),
        scheduled_job(&job)?.tz()?,
        chrono::Utc::now(),
    )?;
    let requests = dates
        .iter()
        .map(|d| request_for(args, &job, *d))
        .collect::<Result<Vec<_>>>()?;
    let (runner, processor) = job_runner(&job, args, g, registry).await?;
    // The runner stops a run on SIGINT/SIGTERM; this flag stops the dates after it (a
    // signal between two dates would otherwise be swallowed by the runner's handler).
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown_signal().await;
            stop.store(true, Ordering::SeqCst);
        }
    });
    let bar = backfill_bar(dates.len(), g.format);
    let parallel = usize::from(args.parallel.max(1));
    let mut summary = schedule::BackfillSummary::default();
    let mut reports = Vec::new();
    let mut failure = None;
    let mut pending = requests.into_iter();
    let mut running = tokio::task::JoinSet::new();
    loop {
        while running.len() < parallel && failure.is_none() && !stop.load(Ordering::SeqCst) {
            let Some(request) = pending.next() else { break };
            let (runner, processor) = (runner.clone(), processor.clone());
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
                    bar.suspend(|| print_backfill_line(&report));
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
    watcher.abort();
    // Dates never started, and those whose run ended in an error before it was recorded.
    summary.not_run = dates.len() - reports.len();
    summary.failed_dates.sort();
    reports.sort_by_key(|(date, _)| *date);
    let reports: Vec<RunReport> = reports.into_iter().map(|(_, r)| r).collect();
    let (from, to) = (dates[0], dates[dates.len() - 1]);
    match g.format {
        Format::Json => print_json(&serde_json::json!({
            "job": job.name,
            "from": from,
            "to": to,
            "completed": summary.completed,
            "skipped": summary.skipped,
            "failed": summary.failed,
            "failed_dates": summary.failed_dates,
            "not_run": summary.not_run,
            "error": failure.as_ref().map(|e| e.to_string()),
            "runs": reports,
        })),
        Format::Human => println!("backfill {} {from}..{to}: {}", job.name, summary.line()),
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(summary.exit_code()),
    }
}

/// The backfill's progress bar: drawn on stderr when it is a terminal (human output),
/// hidden otherwise.
fn backfill_bar(dates: usize, format: Format) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if format != Format::Human || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(dates as u64),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} dates  {elapsed_precise}")
    {
        bar.set_style(style);
    }
    bar
}

/// Listens for SIGTERM and SIGINT from now on (unlike [`shutdown_signal`], which starts
/// listening when first polled); resolves to the first signal's name.
fn shutdown_listener(
) -> Result<std::pin::Pin<Box<dyn std::future::Future<Output = &'static str> + Send>>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let listen = |kind| {
            signal(kind).map_err(|e| Error::config(format!("cannot listen for signals: {e}")))
        };
        let (mut term, mut int) = (
            listen(SignalKind::terminate())?,
            listen(SignalKind::interrupt())?,
        );
        Ok(Box::pin(async move {
            tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            }
        }))
    }
    #[cfg(not(unix))]
    {
        Ok(Box::pin(async {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }))
    }
}

/// What one scheduled job needs to fire: its file, the `idem run` arguments a fire stands
/// for, the runner and the processor (stopped when the grace period ends).
struct FireTarget {
    job: Job,
    args: RunArgs,
    runner: crate::runner::Runner,
    processor: Arc<dyn crate::processor::Processor>,
}

/// `idem scheduler [JOB...] [--grace 30s]`: fires each job's slots through the runner
/// `idem run` uses (trigger scheduler, the date derived from the slot in the job's zone);
/// stops on SIGTERM/SIGINT after the grace period; exit 0.
async fn scheduler_command(
    args: SchedulerArgs,
    g: &GlobalOptions,
    registry: &Registry,
) -> Result<u8> {
    use schedule::scheduler::{self as sched, Clock};
    let grace = parse_duration(&args.grace).map_err(|e| Error::config(format!("--grace: {e}")))?;
    let jobs: Vec<Job> = if args.jobs.is_empty() {
        load_jobs(&g.jobs_dir, &g.store)?
            .into_iter()
            .filter(|j| j.schedule.is_some())
            .collect()
    } else {
        let mut jobs = Vec::new();
        for name in &args.jobs {
            let job = find_job(name, &g.jobs_dir, &g.store)?;
            if job.schedule.is_none() {
                return Err(Error::config(format!(
                    "job {} has no schedule (set schedule = \"...\" in {})",
                    job.name,
                    job.path.display()
                )));
            }
            if jobs.iter().any(|j: &Job| j.name == job.name) {
                return Err(Error::config(format!("job {} is named twice", job.name)));
            }
            jobs.push(job);
        }
        jobs
    };
    if jobs.is_empty() {
        return Err(Error::config(format!(
            "no job in {} has a schedule: nothing to fire",
            g.jobs_dir.display()
        )));
    }
    let scheduled = jobs.iter().map(scheduled_job).collect::<Result<Vec<_>>>()?;
    // Listen before anything fires, so a signal is never the default (fatal) one.
    let shutdown = shutdown_listener()?;
    let clock: Arc<dyn Clock> = Arc::new(sched::SystemClock);
    let mut planner = sched::Planner::new(&scheduled, clock.now())?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(None::<String>);
    let mut targets = std::collections::HashMap::new();
    for (job, s) in jobs.into_iter().zip(&scheduled) {
        let run_args = RunArgs {
            job: job.name.clone(),
            date: None,
            scheduled_at: None,
            from: None,
            to: None,
            parallel: 1,
            scope: None,
            trigger: Some(TriggerArg::Scheduler),
            mode: None,
            on_store_failure: None,
            run_id: None,
        };
        let (runner, processor) = job_runner(&job, &run_args, g, registry).await?;
        // The scheduler, not the runner, decides when a signal stops a run: after the
        // grace period, through StopOnShutdown.
        let runner = runner.interruptible(false);
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
            FireTarget {
                job,
                args: run_args,
                runner,
                processor,
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
async fn fire_one(
    targets: &std::collections::HashMap<String, FireTarget>,
    f: schedule::scheduler::Fire,
) {
    let Some(t) = targets.get(&f.job) else {
        return;
    };
    let slot = if f.catch_up {
        format!("{} (catch-up)", f.local)
    } else {
        f.local.clone()
    };
    let request = match request_for(&t.args, &t.job, f.date) {
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

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

fn print_backfill_line(report: &RunReport) {
    let mut line = format!("{} {} for {}", report.status, report.job, report.scope);
    match report.status {
        RunStatus::Completed => line.push_str(&format!(
            ": {} record(s) in {} ms",
            report.records_processed.unwrap_or(0),
            report.duration_ms
        )),
        RunStatus::Skipped => {
            if let Some(reason) = &report.skip_reason {
                line.push_str(&format!(" ({reason})"));
            }
        }
        RunStatus::Failed => {
            if let Some(error) = &report.error {
                line.push_str(&format!(": {error}"));
            }
        }
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
}

/// `idem cleanup`: keys, leases and event keys older than `before` (`--keep`), ledger rows
/// older than `--keep-runs` that no kept key points at, in batches; counts per table.
async fn cleanup_command(
    store: &DynStore,
    before: chrono::DateTime<chrono::Utc>,
    args: &CleanupArgs,
    format: Format,
) -> Result<u8> {
    // Bounded by MAX_DURATION, so the cutoff is always a valid time.
    let keep_runs = parse_duration_field("--keep-runs", &args.keep_runs)?;
    let runs_before = chrono::Duration::from_std(keep_runs)
        .ok()
        .and_then(|keep| chrono::Utc::now().checked_sub_signed(keep))
        .ok_or_else(|| Error::config(format!("--keep-runs {:?} is too long", args.keep_runs)))?;
    let policy = store::CleanupPolicy {
        runs_before,
        batch: args.batch as usize,
        dry_run: args.dry_run,
        ..store::CleanupPolicy::before(before)
    };
    let report = store.cleanup(&policy).await?;
    let verb = if args.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    match format {
        Format::Json => print_json(&serde_json::json!({
            "dry_run": args.dry_run,
            "keys_before": policy.keys_before,
            "runs_before": policy.runs_before,
            "tables": {
                "processing_keys": report.keys_deleted,
                "processing_runs": report.runs_deleted,
                "processing_leases": report.leases_deleted,
                "event_keys": report.event_keys_deleted,
            },
            "keys_deleted": report.keys_deleted,
            "runs_deleted": report.runs_deleted,
            "leases_deleted": report.leases_deleted,
            "event_keys_deleted": report.event_keys_deleted,
        })),
        Format::Human => {
            let keys = policy.keys_before.format("%Y-%m-%d %H:%M:%S UTC");
            let runs = policy.runs_before.format("%Y-%m-%d %H:%M:%S UTC");
            outln!("{verb} from {}:", store.describe());
            outln!(
                "  processing_keys   {:>10}  processed before {keys}",
                report.keys_deleted
            );
            outln!(
                "  processing_runs   {:>10}  started before {runs}, no kept key pointing at them",
                report.runs_deleted
            );
            outln!(
                "  processing_leases {:>10}  expired before {keys}",
                report.leases_deleted
            );
            outln!(
                "  event_keys        {:>10}  first seen before {keys}",
                report.event_keys_deleted
            );
        }
    }
    Ok(EXIT_OK)
}

/// `idem purge JOB (--date D | --scope S | --from D1 --to D2 | --all) [--yes]`: deletes the
/// job's processing keys for those scopes, after asking on a terminal, and records the purge
/// in the ledger as one run of the job: trigger `manual`, status `skipped`, skip reason
/// `purged`, mode `off`, scope the purged scope (`D1..D2` for a range, `*` for `--all`),
/// `output.purge` = what was purged and how many keys.
async fn purge_command(args: PurgeArgs, g: &GlobalOptions) -> Result<u8> {
    use std::io::IsTerminal;
    let job = find_job(&args.job, &g.jobs_dir, &g.store)?;
    let tz = scheduled_job(&job)?.tz()?;
    let now = chrono::Utc::now();
    let today = schedule::DateExpr::DaysAgo(0).resolve(tz, now)?;
    // (the ledger scope, its date, the key scopes to purge: None = all)
    let (label, scope_date, scopes): (String, chrono::NaiveDate, Option<Vec<String>>) =
        match (&args.date, &args.scope, &args.from, &args.to) {
            (Some(d), _, _, _) => {
                let date = schedule::DateExpr::parse(d)
                    .and_then(|e| e.resolve(tz, now).map_err(|e| e.to_string()))
                    .map_err(|e| Error::config(format!("--date: {e}")))?;
                let scope = date.format("%Y-%m-%d").to_string();
                (scope.clone(), date, Some(vec![scope]))
            }
            (None, Some(scope), _, _) => (scope.clone(), today, Some(vec![scope.clone()])),
            (None, None, Some(from), Some(to)) => {
                let dates = schedule::backfill_dates(from, to, tz, now)?;
                let (first, last) = (dates[0], dates[dates.len() - 1]);
                (
                    format!("{first}..{last}"),
                    first,
                    Some(
                        dates
                            .iter()
                            .map(|d| d.format("%Y-%m-%d").to_string())
                            .collect(),
                    ),
                )
            }
            _ => ("*".to_string(), today, None),
        };
    // The ledger row is validated before anything is deleted (a control character in
    // --scope is refused here).
    let request = RunRequest::new(job.name.clone(), scope_date)
        .with_trigger(Trigger::Manual)
        .with_scope(label.clone());
    request.validate()?;
    let what = match &scopes {
        None => format!("every scope of {}", job.name),
        Some(s) if s.len() == 1 => format!("{} for {}", job.name, s[0]),
        Some(s) => format!("{} for {} date(s) {label}", job.name, s.len()),
    };
    if !args.yes {
        if !std::io::stdin().is_terminal() {
            return Err(Error::config(format!(
                "purge deletes the processing keys of {what}, and stdin is not a terminal to \
                 ask on: add --yes to purge without asking"
            )));
        }
        errln!(
            "purge the processing keys of {what} in {}? The next runs of those scopes will \
             not be skipped and will redo the work. [y/N] ",
            g.store
        );
        let mut answer = String::new();
        let _ = std::io::stdin().read_line(&mut answer);
        if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            errln!("purge cancelled: nothing deleted");
            return Ok(EXIT_RUN_FAILED);
        }
    }
    let store = store::open(&g.store).await?;
    let started_at = chrono::Utc::now();
    let mut deleted = 0;
    match &scopes {
        None => deleted += store.purge(&job.name, None).await?,
        Some(list) => {
            for scope in list {
                deleted += store.purge(&job.name, Some(scope)).await?;
            }
        }
    }
    let finished_at = chrono::Utc::now();
    let run = crate::model::RunRecord {
        run_id: request.run_id.clone(),
        processor: job.name.clone(),
        scope: label.clone(),
        scope_date,
        trigger: Trigger::Manual,
        mode: Mode::Off,
        started_at,
        finished_at,
        duration_ms: (finished_at - started_at).num_milliseconds(),
        status: RunStatus::Skipped,
        skip_reason: Some(crate::model::SkipReason::Custom("purged".into())),
        would_skip_reason: None,
        previous_run_id: None,
        records_processed: None,
        processing_key: None,
        error: None,
        output: Some(serde_json::json!({"purge": {
            "scope": label,
            "scopes": scopes.as_ref().map_or(0, Vec::len),
            "all": scopes.is_none(),
            "keys_deleted": deleted,
        }})),
    };
    store
        .finish(&store::Finish {
            run,
            keys: Vec::new(),
            lease: None,
        })
        .await?;
    match g.format {
        Format::Json => print_json(&serde_json::json!({
            "job": job.name,
            "scope": label,
            "scopes": scopes,
            "keys_deleted": deleted,
            "run_id": request.run_id,
        })),
        Format::Human => {
            outln!("purged {deleted} processing key(s) of {what}");
            outln!("  recorded as run {} (skipped: purged)", request.run_id);
        }
    }
    Ok(EXIT_OK)
}

/// What the schedule module needs of a job.
fn scheduled_job(job: &Job) -> Result<ScheduledJob> {
    Ok(ScheduledJob {
        name: job.name.clone(),
        schedule: job.schedule.clone().unwrap_or_default(),
        timezone: job.timezone.clone(),
        date: job.date.clone(),
        lease: job.lease_ttl()?,
        path: job.path.clone(),
        missed: job.missed_policy()?,
    })
}

/// The jobs `idem schedule` works on: `name` only (it must have a schedule), or every job
/// with a schedule.
fn scheduled_jobs(name: Option<&str>, g: &GlobalOptions) -> Result<Vec<ScheduledJob>> {
    let jobs = match name {
        Some(name) => {
            let job = find_job(name, &g.jobs_dir, &g.store)?;
            if job.schedule.is_none() {
                return Err(Error::config(format!(
                    "job {} has no schedule (set schedule = \"...\" in {})",
                    job.name,
                    job.path.display()
                )));
            }
            vec![job]
        }
        None => load_jobs(&g.jobs_dir, &g.store)?,
    };
    jobs.iter()
        .filter(|j| j.schedule.is_some())
        .map(scheduled_job)
        .collect()
}

fn schedule_command(args: ScheduleArgs, g: &GlobalOptions) -> Result<u8> {
    if let Some(ScheduleCommand::Export(e)) = args.command {
        let jobs = scheduled_jobs(e.job.as_deref(), g)?;
        let text = match &e.cloud_scheduler {
            Some(target) => export::cloud_scheduler(
                &jobs,
                &export::CloudSchedulerOptions::new(
                    target,
                    &g.store,
                    e.image.clone(),
                    e.service_account.clone(),
                    &e.image_jobs_dir,
                )?,
            )?,
            None => {
                let workdir = match e.workdir {
                    Some(w) => w,
                    None => std::env::current_dir()
                        .map_err(|err| Error::config(format!("--workdir: {err}")))?,
                };
                export::crontab(
                    &jobs,
                    &export::CrontabOptions {
                        bin: e.idem_bin.clone(),
                        store: g.store.clone(),
                        jobs_dir: g.jobs_dir.display().to_string(),
                        workdir: workdir.display().to_string(),
                        log_dir: e.log_dir.clone(),
                    },
                )?
            }
        };
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        return Ok(EXIT_OK);
    }
    let after = match &args.after {
        Some(a) => schedule::parse_instant("--after", a)?,
        None => chrono::Utc::now(),
    };
    let jobs = scheduled_jobs(args.job.as_deref(), g)?;
    let plans = schedule::plan(&jobs, after, args.next.into())?;
    print_plans(&plans, g.format);
    Ok(EXIT_OK)
}

fn print_plans(plans: &[JobPlan], format: Format) {
    if format == Format::Json {
        print_json(&plans);
        return;
    }
    let mut out = std::io::stdout().lock();
    if plans.is_empty() {
        let _ = writeln!(out, "no job has a schedule");
    }
    for p in plans {
        let _ = writeln!(
            out,
            "{}  schedule {:?}  timezone {}  date {}",
            p.job, p.schedule, p.timezone, p.date
        );
        if p.next.is_empty() {
            let _ = writeln!(out, "  never fires again");
        }
        for f in &p.next {
            let _ = writeln!(
                out,
                "  {} {} {} = {}  date {}",
                f.local.format("%Y-%m-%d %H:%M:%S"),
                f.local.format("%:z"),
                f.zone_abbreviation,
                f.utc.format("%Y-%m-%d %H:%M:%S UTC"),
                f.date
            );
        }
    }
}

fn print_report(report: &RunReport, format: Format) {
    if format == Format::Json {
        print_json(report);
        return;
    }
    let mut line = format!("{} {} for {}", report.status, report.job, report.scope);
    match report.status {
        RunStatus::Completed => {
            line.push_str(&format!(
                ": {} record(s) in {} ms",
                report.records_processed.unwrap_or(0),
                report.duration_ms
            ));
        }
        RunStatus::Skipped => {
            if let Some(reason) = &report.skip_reason {
                line.push_str(&format!(" ({reason})"));
            }
        }
        RunStatus::Failed => {}
    }
    outln!("{line}");
    outln!("  run id: {}", report.run_id);
    if let Some(detail) = &report.detail {
        let label = if report.status == RunStatus::Skipped {
            "why"
        } else {
            "would skip"
        };
        let reason = report
            .would_skip_reason
            .as_ref()
            .map(|r| format!("{r}: "))
            .unwrap_or_default();
        outln!("  {label}: {reason}{detail}");
    }
    if let Some(prev) = &report.previous_run {
        outln!(
            "  previous run: {} at {}",
            prev.run_id,
            prev.at.format("%Y-%m-%d %H:%M:%S UTC")
        );
    }
    if let Some(key) = &report.processing_key {
        outln!("  processing key: {key}");
    }
    if let Some(error) = &report.error {
        outln!("  error: {error}");
    }
    for e in &report.store_errors {
        outln!("  store error (tolerated): {e}");
    }
    if report.spooled {
        outln!("  warning: the store is unreachable; this run is spooled locally and recorded when it is back");
    } else if !report.recorded {
        outln!("  warning: this run is not recorded in the ledger");
    }
}

fn print_explanation(e: &Explanation, format: Format) {
    if format == Format::Json {
        print_json(e);
        return;
    }
    match (&e.skip_reason, e.decision) {
        (Some(reason), "skip") => outln!("{} for {} would be skipped ({reason})", e.job, e.scope),
        (Some(reason), _) => outln!(
            "{} for {} would run ({} mode; would skip: {reason})",
            e.job,
            e.scope,
            e.mode
        ),
        (None, _) => outln!("{} for {} would run", e.job, e.scope),
    }
    if let Some(detail) = &e.detail {
        outln!("  why: {detail}");
    }
    if e.mode == Mode::Off {
        outln!("  mode off: no guard is evaluated");
    }
    for v in &e.guards {
        match &v.verdict {
            crate::guard::Verdict::Proceed { detail } => {
                outln!("  {:<13} proceed  {detail}", v.guard)
            }
            crate::guard::Verdict::Skip(s) => {
                outln!("  {:<13} skip     {}: {}", v.guard, s.reason, s.detail)
            }
            crate::guard::Verdict::Unknown { detail } => {
                outln!("  {:<13} unknown  {detail}", v.guard)
            }
        }
    }
    if let Some(key) = &e.processing_key {
        outln!("  processing key: {key}");
    }
}

fn job_docs(jobs: &[Job]) -> Result<Vec<serde_json::Value>> {
    jobs.iter()
        .map(|j| {
            Ok(serde_json::json!({
                "name": j.name,
                "processor": j.processor,
                "schedule": j.schedule,
                "mode": j.mode()?.as_str(),
                "guards": j.guard_stack()?.names(),
                "path": j.path,
                "description": j.description,
            }))
        })
        .collect()
}

fn print_jobs(jobs: &[Job], format: Format) -> Result<()> {
    if format == Format::Json {
        print_json(&job_docs(jobs)?);
        return Ok(());
    }
    if jobs.is_empty() {
        outln!("no jobs found");
    }
    for j in jobs {
        outln!(
            "{:<24} processor={:<10} mode={:<8} schedule={:<14} guards=[{}]  {}",
            j.name,
            j.processor,
            j.mode()?.as_str(),
            j.schedule.as_deref().unwrap_or("-"),
            j.guard_stack()?.names().join(", "),
            j.path.display()
        );
    }
    Ok(())
}

#[derive(Debug, Args)]
struct ReportArgs {
    /// Days of history to judge, ending now (thresholds are per week, scaled to this).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=3660))]
    days: u32,
    /// Only this job (its processor name in the ledger).
    #[arg(long)]
    job: Option<String>,
    /// Write the report to this file instead of standard output.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Print the SQL of one report query, ready to paste into a console, instead of
    /// running the report: duplicates, wasted, savings, effectiveness, storage or shadow.
    #[arg(long, value_name = "NAME")]
    sql: Option<String>,
    /// With --sql: the dialect, sqlite or postgres (default: the store's).
    #[arg(long, requires = "sql")]
    dialect: Option<String>,
    /// The end of the period (RFC 3339) instead of now.
    #[arg(long, value_name = "RFC3339")]
    until: Option<String>,
    /// The time window of the jobs: Q1 counts duplicates outside it.
    #[arg(long, default_value = "1h")]
    window: String,
    /// Q1 threshold per week: more duplicate runs outside the window than this ...
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    duplicate_runs: Option<f64>,
    /// ... with more identical-data runs than this is a moderate signal (per week).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    identical_runs: Option<f64>,
    /// Q2 threshold per week: more minutes wasted than this is a strong signal.
    #[arg(long, value_name = "MINUTES", allow_negative_numbers = true)]
    minutes_wasted: Option<f64>,
    /// Q3 threshold per week: more high-confidence preventable runs than this is strong.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    preventable_runs: Option<f64>,
    /// Fewer completed runs than this in the period: not_enough_data.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    min_runs: Option<u64>,
    /// Q3: repeats whose records processed vary by less than this standard deviation
    /// count as identical content.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    max_stddev: Option<f64>,
}

fn report_threshold(flag: &str, value: Option<f64>, default: f64) -> Result<f64> {
    match value {
        None => Ok(default),
        Some(v) if v.is_finite() && v >= 0.0 => Ok(v),
        Some(v) => Err(Error::config(format!(
            "bad --{flag} {v}: expected a number of 0 or more"
        ))),
    }
}

async fn report_command(args: ReportArgs, g: &GlobalOptions) -> Result<u8> {
    use crate::report::{self, Dialect, OutputFormat, ReportOptions, Thresholds};
    let mut options = ReportOptions::last_days(args.days);
    if let Some(until) = &args.until {
        options.until = schedule::parse_instant("--until", until)?;
    }
    options.job = args.job.clone();
    options.window = parse_duration_field("--window", &args.window)?;
    let d = Thresholds::default();
    options.thresholds = Thresholds {
        duplicate_runs: report_threshold("duplicate-runs", args.duplicate_runs, d.duplicate_runs)?,
        identical_data_runs: report_threshold(
            "identical-runs",
            args.identical_runs,
            d.identical_data_runs,
        )?,
        minutes_wasted: report_threshold("minutes-wasted", args.minutes_wasted, d.minutes_wasted)?,
        high_confidence_prevents: report_threshold(
            "preventable-runs",
            args.preventable_runs,
            d.high_confidence_prevents,
        )?,
        min_completed_runs: args.min_runs.unwrap_or(d.min_completed_runs),
        max_stddev: report_threshold("max-stddev", args.max_stddev, d.max_stddev)?,
    };
    let text = if let Some(name) = &args.sql {
        let dialect = match &args.dialect {
            Some(d) => Dialect::parse(d)?,
            None => report::dialect_of_url(&g.store).map_err(|e| {
                Error::config(format!("{e}; name one with --dialect sqlite|postgres"))
            })?,
        };
        report::sql_for_console(name, dialect, &options)?
    } else {
        let format = match g.format_arg {
            FormatArg::Human => OutputFormat::Human,
            FormatArg::Json => OutputFormat::Json,
            FormatArg::Markdown => OutputFormat::Markdown,
            FormatArg::Html => OutputFormat::Html,
        };
        let report = report::run(&g.store, &options).await?;
        report::render(&report, format)
    };
    match &args.output {
        Some(path) => {
            std::fs::write(path, text).map_err(|e| {
                Error::config(format!(
                    "cannot write the report to {}: {e}",
                    path.display()
                ))
            })?;
            errln!("wrote {}", path.display());
        }
        None => {
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
        }
    }
    Ok(EXIT_OK)
}

/// `idem fingerprint`: reads NDJSON events (blank lines skipped) from `file` or standard
/// input; a line that is not an event is an error naming the line and the field.
fn fingerprint_events(file: Option<&std::path::Path>) -> Result<(String, usize)> {
    use std::io::BufRead;
    let (name, reader): (String, Box<dyn BufRead>) = match file {
        Some(path) => {
            let f = std::fs::File::open(path)
                .map_err(|e| Error::config(format!("cannot read {}: {e}", path.display())))?;
            (
                path.display().to_string(),
                Box::new(std::io::BufReader::with_capacity(1 << 16, f)),
            )
        }
        None => ("standard input".into(), Box::new(std::io::stdin().lock())),
    };
    let mut signatures = Vec::new();
    for (i, line) in reader.split(b'\n').enumerate() {
        let at = || format!("{name} line {}", i + 1);
        let line = line.map_err(|e| Error::config(format!("cannot read {}: {e}", at())))?;
        let line = std::str::from_utf8(&line)
            .map_err(|_| Error::config(format!("{}: not UTF-8 text", at())))?;
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        let signature = crate::events::EventSignature::from_json(line)
            .map_err(|e| Error::config(format!("{}: {e}", at())))?;
        signatures.push(signature);
    }
    Ok((crate::events::fingerprint(&signatures), signatures.len()))
}
