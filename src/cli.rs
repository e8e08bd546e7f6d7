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
use crate::job::{find_job, load_jobs, parse_duration, Job};
use crate::model::{parse_date, Mode, RunRequest, RunStatus, Trigger};
use crate::processor::Registry;
use crate::runner::{Explanation, RunReport, StoreFailurePolicy};
use crate::spool::Spool;
use crate::store::{
    self, BreakerConfig, CircuitBreakerStore, DynStore, RunFilter, UnavailableStore,
};

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
    /// Output format.
    #[arg(long, global = true, value_enum, default_value_t = Format::Human)]
    format: Format,
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
    Explain(RunArgs),
    /// Create or upgrade the store's tables.
    Migrate,
    /// List the jobs in the jobs folder.
    Jobs,
    /// Show recent runs from the ledger, newest first.
    Runs(RunsArgs),
    /// Forget the processing keys of a job (one scope, or all) so the next run is not skipped.
    Purge(PurgeArgs),
    /// Delete keys, ledger rows and expired leases older than the retention.
    Cleanup(CleanupArgs),
    /// Print the fingerprint of a set of trade events (NDJSON), as the Python services
    /// compute it: SHA-256 of the sorted event signatures.
    Fingerprint(FingerprintArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Job name (in --jobs-dir) or path to a job .toml file.
    job: String,
    /// The partition date, YYYY-MM-DD.
    #[arg(long)]
    date: String,
    /// Scope, when it is not just the date (default: the date).
    #[arg(long)]
    scope: Option<String>,
    /// Why the run starts.
    #[arg(long, value_enum, default_value_t = TriggerArg::Manual)]
    trigger: TriggerArg,
    /// Override the job's mode.
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// Override the job's store failure policy.
    #[arg(long, value_enum)]
    on_store_failure: Option<PolicyArg>,
    /// Run id to record (default: a new UUID).
    #[arg(long)]
    run_id: Option<String>,
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
    /// At most this many rows.
    #[arg(long, default_value_t = 20)]
    limit: usize,
}

#[derive(Debug, Args)]
struct PurgeArgs {
    /// Job name (the processor identity in the ledger).
    job: String,
    /// Only this date's scope.
    #[arg(long, conflicts_with_all = ["scope", "all"])]
    date: Option<String>,
    /// Only this scope.
    #[arg(long, conflicts_with = "all")]
    scope: Option<String>,
    /// Every scope of the job.
    #[arg(long)]
    all: bool,
}

#[derive(Debug, Args)]
struct CleanupArgs {
    /// Keep this much history (e.g. 30d).
    #[arg(long, default_value = "30d")]
    keep: String,
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
    init_logging();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_RUN_FAILED);
        }
    };
    let code = runtime.block_on(execute(cli, &registry));
    ExitCode::from(code)
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
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
        Error::Config(_) | Error::Unsupported { .. } => EXIT_USAGE,
        _ => EXIT_RUN_FAILED,
    }
}

/// Runs a parsed command; returns the exit code (errors are printed as `error: …`).
pub async fn execute(cli: Cli, registry: &Registry) -> u8 {
    let format = cli.global.format;
    match dispatch(cli, registry).await {
        Ok(code) => code,
        Err(e) => {
            let code = exit_code_for(&e);
            if format == Format::Json {
                let doc = serde_json::json!({"error": e.to_string(), "exit_code": code});
                println!("{doc}");
            }
            eprintln!("error: {e}");
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
        Command::Run(args) => {
            let (job, request) = prepare(&args, &g)?;
            let policy = match args.on_store_failure {
                Some(PolicyArg::Strict) => StoreFailurePolicy::Strict,
                Some(PolicyArg::BestEffort) => StoreFailurePolicy::BestEffort,
                None => job.store_failure()?,
            };
            let store = open_store(&g.store, policy).await?;
            let spool = Spool::from_env(&g.store);
            replay_spool(&spool, &*store).await;
            let processor = job.processor(registry, &g.store).await?;
            let mut runner = job
                .runner(store)?
                .store_failure_policy(policy)
                .interruptible(true)
                .spool(spool);
            if let Some(mode) = args.mode {
                runner = runner.mode(mode.into());
            }
            let report = runner.run(&*processor, request).await?;
            print_report(&report, g.format);
            Ok(report.exit_code())
        }
        Command::Explain(args) => {
            let (job, request) = prepare(&args, &g)?;
            let store = open_store(&g.store, StoreFailurePolicy::Strict).await?;
            let processor = job.processor(registry, &g.store).await?;
            let mut runner = job.runner(store)?;
            if let Some(mode) = args.mode {
                runner = runner.mode(mode.into());
            }
            let explanation = runner.explain(&*processor, &request).await?;
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
                Format::Human => println!("migrated {}", store.describe()),
            }
            Ok(EXIT_OK)
        }
        Command::Jobs => {
            let jobs = load_jobs(&g.jobs_dir)?;
            print_jobs(&jobs, g.format)?;
            Ok(EXIT_OK)
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
                    limit: args.limit,
                })
                .await?;
            match g.format {
                Format::Json => print_json(&runs),
                Format::Human => {
                    if runs.is_empty() {
                        println!("no runs recorded in {}", store.describe());
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
                        println!(
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
        Command::Purge(args) => {
            let scope = match (&args.date, &args.scope, args.all) {
                (Some(d), _, _) => Some(parse_date(d)?.format("%Y-%m-%d").to_string()),
                (None, Some(s), _) => Some(s.clone()),
                (None, None, true) => None,
                (None, None, false) => {
                    return Err(Error::config("purge needs --date, --scope or --all"))
                }
            };
            let store = store::open(&g.store).await?;
            let deleted = store.purge(&args.job, scope.as_deref()).await?;
            match g.format {
                Format::Json => print_json(
                    &serde_json::json!({"job": args.job, "scope": scope, "keys_deleted": deleted}),
                ),
                Format::Human => println!(
                    "purged {deleted} processing key(s) of {} ({})",
                    args.job,
                    scope.as_deref().unwrap_or("all scopes")
                ),
            }
            Ok(EXIT_OK)
        }
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
        Command::Cleanup(args) => {
            let keep = parse_duration(&args.keep)?;
            let before = chrono::Utc::now()
                - chrono::Duration::from_std(keep)
                    .map_err(|e| Error::config(format!("--keep: {e}")))?;
            let store = store::open(&g.store).await?;
            let report = store.cleanup(before).await?;
            match g.format {
                Format::Json => print_json(&report),
                Format::Human => println!(
                    "deleted {} key(s), {} run(s), {} lease(s), {} event key(s) older than {}",
                    report.keys_deleted,
                    report.runs_deleted,
                    report.leases_deleted,
                    report.event_keys_deleted,
                    before.format("%Y-%m-%d %H:%M:%S UTC")
                ),
            }
            Ok(EXIT_OK)
        }
    }
}

fn prepare(args: &RunArgs, g: &GlobalOptions) -> Result<(Job, RunRequest)> {
    let date = parse_date(&args.date)?;
    let job = find_job(&args.job, &g.jobs_dir)?;
    let mut request = RunRequest::new(job.name.clone(), date)
        .with_trigger(args.trigger.into())
        .with_params(job.params_json());
    if let Some(scope) = &args.scope {
        if scope.trim().is_empty() {
            return Err(Error::config("--scope is empty"));
        }
        request = request.with_scope(scope.clone());
    }
    if let Some(id) = &args.run_id {
        request.run_id = id.clone();
    }
    Ok((job, request))
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
    println!("{line}");
    println!("  run id: {}", report.run_id);
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
        println!("  {label}: {reason}{detail}");
    }
    if let Some(prev) = &report.previous_run {
        println!(
            "  previous run: {} at {}",
            prev.run_id,
            prev.at.format("%Y-%m-%d %H:%M:%S UTC")
        );
    }
    if let Some(key) = &report.processing_key {
        println!("  processing key: {key}");
    }
    if let Some(error) = &report.error {
        println!("  error: {error}");
    }
    for e in &report.store_errors {
        println!("  store error (tolerated): {e}");
    }
    if report.spooled {
        println!("  warning: the store is unreachable; this run is spooled locally and recorded when it is back");
    } else if !report.recorded {
        println!("  warning: this run is not recorded in the ledger");
    }
}

fn print_explanation(e: &Explanation, format: Format) {
    if format == Format::Json {
        print_json(e);
        return;
    }
    match (&e.skip_reason, e.decision) {
        (Some(reason), "skip") => println!("{} for {} would be skipped ({reason})", e.job, e.scope),
        (Some(reason), _) => println!(
            "{} for {} would run ({} mode; would skip: {reason})",
            e.job, e.scope, e.mode
        ),
        (None, _) => println!("{} for {} would run", e.job, e.scope),
    }
    if let Some(detail) = &e.detail {
        println!("  why: {detail}");
    }
    if e.mode == Mode::Off {
        println!("  mode off: no guard is evaluated");
    }
    for v in &e.guards {
        match &v.verdict {
            crate::guard::Verdict::Proceed { detail } => {
                println!("  {:<13} proceed  {detail}", v.guard)
            }
            crate::guard::Verdict::Skip(s) => {
                println!("  {:<13} skip     {}: {}", v.guard, s.reason, s.detail)
            }
        }
    }
    if let Some(key) = &e.processing_key {
        println!("  processing key: {key}");
    }
}

fn print_jobs(jobs: &[Job], format: Format) -> Result<()> {
    if format == Format::Json {
        let docs: Vec<serde_json::Value> = jobs
            .iter()
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
            .collect::<Result<_>>()?;
        print_json(&docs);
        return Ok(());
    }
    if jobs.is_empty() {
        println!("no jobs found");
    }
    for j in jobs {
        println!(
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
