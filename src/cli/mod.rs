//! The `idem` command line, reusable from your own binary (the `cli` feature).
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
//! Exit codes ([`crate::model::exit`]): 0 completed or skipped (a skip is a success), 1 the
//! run failed, 2 bad usage, configuration or input, 3 store unavailable (under `strict`).
//!
//! This module holds the command line's top (`Cli`, the global options, the `Command`
//! enum) and the dispatch; each command (or family) has its module, which owns its clap
//! arguments and its work, and [`output`] does all the printing. The CLI owns the process's signals: it
//! turns SIGINT/SIGTERM into a [`Cancel`] the runner and the scheduler stop on.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::error::{Error, Result};
use crate::processor::Registry;
use crate::runner::Cancel;
use crate::store;

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
        $crate::cli::logs::stderr_line(format_args!($($arg)*));
    }};
}

mod cleanup;
mod exec;
mod feed;
mod files;
mod fingerprint;
mod gate;
mod jobs;
mod logs;
mod metrics;
pub mod output;
mod purge;
mod release;
mod report;
mod run;
mod runs;
mod schedule;
mod scheduler;
mod status;
mod status_html;

pub use crate::model::exit::{
    OK as EXIT_OK, RUN_FAILED as EXIT_RUN_FAILED, STORE_UNAVAILABLE as EXIT_STORE_UNAVAILABLE,
    USAGE as EXIT_USAGE,
};
pub use output::Format;

pub(crate) use cleanup::CleanupArgs;
pub(crate) use exec::ExecArgs;
use files::{missing_ledger, no_ledger_message, refuse_to_overwrite};
pub(crate) use fingerprint::FingerprintArgs;
pub(crate) use gate::GateArgs;
pub(crate) use jobs::MigrateArgs;
pub(crate) use purge::PurgeArgs;
pub(crate) use release::ReleaseArgs;
pub(crate) use report::ReportArgs;
use run::check_range;
pub(crate) use run::{ExplainArgs, RunArgs};
pub(crate) use runs::RunsArgs;
pub(crate) use schedule::ScheduleArgs;
pub(crate) use scheduler::SchedulerArgs;
pub(crate) use status::StatusArgs;

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
pub(crate) struct GlobalOptions {
    /// Store URL: sqlite://PATH, postgres://USER@HOST/DB, bigquery://PROJECT/DATASET, memory://
    /// (idem gate also redis://HOST[:PORT][/DB][?prefix=P], rediss:// for TLS)
    #[arg(long, global = true, env = "IDEM_STORE", default_value = store::DEFAULT_STORE_URL)]
    store: String,
    /// Folder with the job files (*.toml).
    #[arg(long, global = true, env = "IDEM_JOBS_DIR", default_value = "jobs")]
    jobs_dir: PathBuf,
    /// Output format (markdown: idem report only; html: idem report and idem status; ndjson
    /// and csv: idem gate only).
    #[arg(long = "format", global = true, value_enum, default_value_t = FormatArg::Human)]
    format_arg: FormatArg,
    /// `--format` for the commands other than report (set by `execute`).
    #[arg(skip = Format::Human)]
    format: Format,
    /// How standard error is written: `human` lines, or `json`, one object per line with
    /// `time`, `severity` and `message` (Cloud Logging, most collectors).
    #[arg(long, global = true, env = "IDEM_LOG_FORMAT", value_enum, default_value_t = logs::LogFormat::Human)]
    log_format: logs::LogFormat,
}

/// The values of `--format`: every command takes human and json, `idem report` also
/// markdown and html.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum FormatArg {
    Human,
    Json,
    Markdown,
    Html,
    Ndjson,
    Csv,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a job for a scope behind its guards, and record the outcome.
    Run(RunArgs),
    /// Run a program behind the guards, as a command job NAME with no job file:
    /// `idem exec NAME --time-window 20h -- PROGRAM ARGS…` (recorded like `idem run`).
    Exec(ExecArgs),
    /// Show what a run would decide now and why, without running or claiming anything.
    Explain(ExplainArgs),
    /// Create or upgrade the store's tables (`--check`: only say whether they are current).
    ///
    /// `idem migrate --check` changes nothing and exits 1 while the schema is behind this
    /// idem: a deploy step or an init container waits on it (`--wait 10m`).
    Migrate(MigrateArgs),
    /// List the jobs in the jobs folder, validating every file (exit 2 naming each bad one).
    Jobs,
    /// Show recent runs from the ledger, newest first.
    Runs(RunsArgs),
    /// Which dates each schedule expected lately, and which completed, failed or are missing
    ///
    /// Exit 1 when any expected date failed or is missing; `idem run JOB --missing` runs
    /// exactly those.
    Status(StatusArgs),
    /// Forget the processing keys of a job (one scope, or all) so the next run is not skipped.
    Purge(PurgeArgs),
    /// Free the lease on a job's scope whose run is gone (killed, its machine lost), and
    /// record it.
    Release(ReleaseArgs),
    /// Delete keys, ledger rows and expired leases older than the retention.
    Cleanup(CleanupArgs),
    /// List the scheduled jobs and their next fire times; `schedule export` writes them
    /// out for cron, Cloud Scheduler or Kubernetes.
    Schedule(ScheduleArgs),
    /// Print the fingerprint of a set of trade events (NDJSON), as the Python services
    /// compute it: SHA-256 of the sorted event signatures.
    Fingerprint(FingerprintArgs),
    /// Fire the scheduled jobs at their times, each through the guards like `idem run`
    /// (trigger scheduler), until SIGTERM or SIGINT.
    ///
    /// Slots missed while no scheduler ran are dropped or caught up as each job's `missed`
    /// says. A `missed = "catch_up"` job's date whose fire failed, was abandoned (its lease
    /// expired without a result) or was never run is fired again: at start, and
    /// `refire_after` (a job field, default 5m) after a fire of it failed, until the ledger
    /// counts 3 failed scheduler fires of it (then `idem status` reports it and `idem run
    /// JOB --missing` runs it). See docs/scheduling.md.
    Scheduler(SchedulerArgs),
    /// Is the content hash worth it? Per job, from the ledger: duplicate and wasted runs,
    /// what the guards prevented (or would have, in shadow mode), and a verdict with its
    /// reasons.
    Report(ReportArgs),
    /// Idempotency gate for NDJSON events: one verdict per line (new, replay, conflict or
    /// invalid), marked durably in the store in batches.
    Gate(GateArgs),
}

/// `--param NAME=VALUE`.
fn parse_param(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() && !name.contains(char::is_whitespace) => {
            Ok((name.to_string(), value.to_string()))
        }
        _ => Err(format!(
            "{s:?}: expected NAME=VALUE (e.g. bucket=gs://exports)"
        )),
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
    // sqlx warns of every statement slower than 1 s with its whole text (the report's
    // queries over a large ledger are, by design): that is for `RUST_LOG=sqlx=warn`.
    logs::set(cli.global.log_format);
    init_logging(match &cli.command {
        // One line per fire.
        Command::Scheduler(_) => "warn,sqlx::query=error,sqlx::pool=error,idem::scheduler=info",
        // Only errors, and the warning that a changed command was skipped.
        Command::Exec(args) if args.quiet => "error,idem::changed=warn",
        // And the first wait on keys pending for another gate, which can be long.
        Command::Gate(_) => "warn,sqlx::query=error,sqlx::pool=error,idem::gate_wait=info",
        _ => "warn,sqlx::query=error,sqlx::pool=error",
    });
    // A wrapper passes its standard input on to the program it runs.
    if matches!(&cli.command, Command::Exec(_))
        || matches!(&cli.command, Command::Run(args) if args.from.is_none() && !args.missing)
    {
        crate::command::inherit_stdin();
    }
    // A command job's child writes to idem's standard output, unless idem's own output
    // there is a machine-readable report: then to its standard error.
    if !matches!(cli.global.format_arg, FormatArg::Human) {
        crate::command::reserve_stdout();
    }
    // `gate` prepares the next batch while a task of its own waits on the store (and the
    // Redis driver runs its connection): one worker thread beside the main one.
    let mut builder = if matches!(cli.command, Command::Gate(_)) {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(1);
        b
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            output::print_error_line(format_args!("cannot start the async runtime: {e}"));
            return ExitCode::from(EXIT_RUN_FAILED);
        }
    };
    let code = runtime.block_on(async {
        // As a container's entrypoint (PID 1), idem reaps what the container's processes
        // leave behind, as an init must.
        if std::process::id() == 1 {
            crate::command::reap_orphans();
        }
        let code = execute(cli, &registry).await;
        // The runner waits for the cancellation of an interrupted run's warehouse
        // statements; this catches any other (the runtime's tasks end with `main`).
        crate::backend::cancels_sent(std::time::Duration::from_secs(2)).await;
        // SQLite ledgers and warehouses checkpointed and closed, their `-wal` files gone.
        #[cfg(feature = "sqlite")]
        crate::backend::sqlite::closed(std::time::Duration::from_secs(10)).await;
        code
    });
    ExitCode::from(code)
}

fn init_logging(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if logs::is_json() {
        builder.event_format(logs::JsonLines).try_init()
    } else {
        builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .try_init()
    };
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
        // The gate's stdout carries its records: errors go to stderr only.
        FormatArg::Json if !matches!(cli.command, Command::Gate(_)) => Format::Json,
        _ => Format::Human,
    };
    let report = matches!(cli.command, Command::Report(_));
    let status = matches!(cli.command, Command::Status(_));
    match (cli.global.format_arg, report, status) {
        (FormatArg::Markdown, false, _) => {
            output::print_error_line("--format markdown is for idem report only");
            return EXIT_USAGE;
        }
        (FormatArg::Html, false, false) => {
            output::print_error_line("--format html is for idem report and idem status only");
            return EXIT_USAGE;
        }
        _ => {}
    }
    if let (FormatArg::Ndjson | FormatArg::Csv, false) = (
        cli.global.format_arg,
        matches!(cli.command, Command::Gate(_)),
    ) {
        output::print_error_line("--format ndjson and --format csv are for idem gate only");
        return EXIT_USAGE;
    }
    let format = cli.global.format;
    match dispatch(cli, registry).await {
        Ok(code) => code,
        Err(e) => {
            let code = exit_code_for(&e);
            output::print_error(&e, code, format);
            code
        }
    }
}

/// Runs the command; the command prints its result (through [`output`]) and returns the
/// exit code.
async fn dispatch(cli: Cli, registry: &Registry) -> Result<u8> {
    let g = cli.global;
    match cli.command {
        Command::Run(args) if args.from.is_some() => run::backfill(&args, &g, registry).await,
        Command::Run(args) if args.missing => run::missing(&args, &g, registry).await,
        Command::Run(args) => run::run(&args, &g, registry).await,
        Command::Exec(args) => exec::exec(&args, &g, registry).await,
        Command::Explain(args) => run::explain(&args, &g, registry).await,
        Command::Migrate(args) => jobs::migrate(&g, &args).await,
        Command::Jobs => jobs::jobs(&g, registry),
        Command::Runs(args) => runs::runs(args, &g).await,
        Command::Status(args) => status::status(&args, &g).await,
        Command::Purge(args) => purge::purge(args, &g).await,
        Command::Release(args) => release::release(&args, &g).await,
        Command::Schedule(args) => schedule::schedule(args, &g),
        Command::Fingerprint(args) => fingerprint::fingerprint(&args, &g),
        Command::Scheduler(args) => scheduler::scheduler(args, &g, registry).await,
        Command::Report(args) => report::report(args, &g).await,
        Command::Cleanup(args) => cleanup::cleanup(&args, &g).await,
        Command::Gate(args) => gate::gate(&args, &g).await,
    }
}

/// Listens for SIGTERM and SIGINT from now on (so a signal is never the default, fatal
/// one) and cancels the returned token with the first signal's name.
fn cancel_on_signals() -> Result<Cancel> {
    let cancel = Cancel::new();
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
        let on_signal = cancel.clone();
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            on_signal.cancel(name);
        });
    }
    #[cfg(not(unix))]
    {
        let on_signal = cancel.clone();
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            on_signal.cancel("SIGINT");
        });
    }
    Ok(cancel)
}

/// A command-line value's error (a parser that reports configuration errors, like
/// durations): the same message, as [`Error::Input`].
fn input(e: Error) -> Error {
    Error::input(e)
}

/// The jobs a schedule command works on: `names` only (each must have a schedule, and be
/// named once), or every job with a schedule.
fn scheduled_jobs(names: &[String], g: &GlobalOptions) -> Result<Vec<crate::job::Job>> {
    use crate::job::{find_job, load_jobs, Job};
    if names.is_empty() {
        return Ok(load_jobs(&g.jobs_dir, &g.store)?
            .into_iter()
            .filter(|j| j.schedule.is_some())
            .collect());
    }
    let mut jobs: Vec<Job> = Vec::new();
    for name in names {
        let job = find_job(name, &g.jobs_dir, &g.store)?;
        if job.schedule.is_none() {
            return Err(Error::config(format!(
                "job {} has no schedule (set schedule = \"...\" in {})",
                job.name,
                job.path.display()
            )));
        }
        if jobs.iter().any(|j| j.name == job.name) {
            return Err(Error::input(format!("job {} is named twice", job.name)));
        }
        jobs.push(job);
    }
    Ok(jobs)
}
