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
//! This module holds the clap types and the dispatch; each command (or family) has its
//! module, and [`output`] does all the printing. The CLI owns the process's signals: it
//! turns SIGINT/SIGTERM into a [`Cancel`] the runner and the scheduler stop on.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::error::{Error, Result};
use crate::model::{Mode, RunStatus, Trigger};
use crate::processor::Registry;
use crate::runner::{Cancel, StoreFailurePolicy};
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
mod fingerprint;
mod gate;
mod jobs;
mod logs;
mod metrics;
pub mod output;
mod purge;
mod report;
mod run;
mod runs;
mod schedule;
mod scheduler;

pub use crate::model::exit::{
    OK as EXIT_OK, RUN_FAILED as EXIT_RUN_FAILED, STORE_UNAVAILABLE as EXIT_STORE_UNAVAILABLE,
    USAGE as EXIT_USAGE,
};
pub use output::Format;

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
    /// Output format (markdown and html: idem report only; ndjson and csv: idem gate only).
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
    /// out for cron, Cloud Scheduler or Kubernetes.
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
    /// Idempotency gate for NDJSON events: one verdict per line (new, replay, conflict or
    /// invalid), marked durably in the store in batches.
    Gate(GateArgs),
}

#[derive(Debug, Args)]
pub(crate) struct SchedulerArgs {
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
pub(crate) struct ScheduleArgs {
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
pub(crate) enum ScheduleCommand {
    /// Print the scheduled jobs as crontab lines, gcloud commands or Kubernetes manifests
    /// (text).
    Export(ExportArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["crontab", "cloud_scheduler", "kubernetes", "kubernetes_scheduler"])))]
pub(crate) struct ExportArgs {
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
    /// Kubernetes: one batch/v1 CronJob per job (YAML for `kubectl apply -f -`).
    #[arg(long)]
    kubernetes: bool,
    /// Kubernetes: a Deployment of N `idem scheduler` replicas instead of CronJobs (the
    /// jobs' leases keep each slot to one run).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    kubernetes_scheduler: Option<u32>,
    /// Cloud Scheduler and Kubernetes: the image built from the Containerfile (Cloud
    /// Scheduler's default REGION-docker.pkg.dev/PROJECT/idem/idem:latest; required for
    /// Kubernetes).
    #[arg(long)]
    image: Option<String>,
    /// Cloud Scheduler: the service account that starts and runs the jobs
    /// (default idem@PROJECT.iam.gserviceaccount.com).
    #[arg(long)]
    service_account: Option<String>,
    /// Cloud Scheduler and Kubernetes: the jobs folder inside the image.
    #[arg(long, default_value = "/app/jobs")]
    image_jobs_dir: String,
    /// Cloud Scheduler and Kubernetes: read the store URL from this secret instead of
    /// printing it (Secret Manager secret for Cloud Run; Kubernetes Secret, key `url`,
    /// default idem-store).
    #[arg(long, value_name = "NAME")]
    store_secret: Option<String>,
    /// Kubernetes: the namespace of every object.
    #[arg(long)]
    namespace: Option<String>,
    /// Kubernetes: mount the jobs folder from this ConfigMap instead of the image's.
    #[arg(long, value_name = "NAME")]
    jobs_configmap: Option<String>,
    /// Kubernetes: the service account the pods run as (with Workload Identity, the one
    /// bound to a Google service account for BigQuery).
    #[arg(long, value_name = "NAME")]
    k8s_service_account: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub(crate) struct RunArgs {
    /// Job name (in --jobs-dir) or path to a job .toml file.
    job: String,
    /// The partition date: YYYY-MM-DD, today, yesterday or today-N (in the job's
    /// timezone); default the job's `date`.
    #[arg(long, allow_hyphen_values = true)]
    date: Option<String>,
    /// The instant the scheduler meant to fire (RFC 3339), or `cronjob:JOB_NAME` (the Job a
    /// Kubernetes CronJob made for a slot, named after its minute): relative dates are
    /// evaluated there instead of at the clock, so a late retry still processes its slot's
    /// date.
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
    trigger: Option<Trigger>,
    /// Override the job's mode.
    #[arg(long, value_enum)]
    mode: Option<Mode>,
    /// Override the job's store failure policy.
    #[arg(long, value_enum)]
    on_store_failure: Option<StoreFailurePolicy>,
    /// Run id to record (default: a new UUID), e.g. the orchestrator's. A run id names
    /// one invocation in the ledger; when this one is taken already (orchestrators reuse
    /// theirs across retries and tasks), the run is recorded as ID.<8 hex digits>.
    #[arg(long)]
    run_id: Option<String>,
    /// Exit with this status when the run is skipped (default 0).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8), conflicts_with = "from")]
    skip_exit_code: Option<u8>,
    /// Write the run's metrics to FILE in Prometheus text format (for node_exporter's
    /// textfile collector), atomically, when the run ends (not with --from/--to).
    #[arg(long, value_name = "FILE", conflicts_with = "from")]
    metrics_file: Option<PathBuf>,
    /// A parameter over the job's `[params]` of that name (repeatable): what
    /// `{param.NAME}` is in a command job's arguments, `RunRequest::params` in Rust.
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_param)]
    param: Vec<(String, String)>,
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

#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    /// The job's name in the ledger (what `runs --job` and `report --job` take).
    name: String,
    /// The program and its arguments, after `--`, passed as given: only `{date}`,
    /// `{scope}`, `{run_id}`, `{trigger}`, `{job}` and `{param.NAME}` are replaced (no
    /// shell reads them; other braces stay).
    #[arg(last = true, required = true, value_name = "PROGRAM ARGS",
          value_parser = clap::value_parser!(std::ffi::OsString))]
    argv: Vec<std::ffi::OsString>,
    /// The partition date: YYYY-MM-DD, today, yesterday or today-N (in --timezone).
    #[arg(long, allow_hyphen_values = true, default_value = "today")]
    date: Option<String>,
    /// The IANA time zone relative dates are read in [default: the machine's, as `date`
    /// reads it: TZ, else /etc/localtime].
    #[arg(long)]
    timezone: Option<String>,
    /// Skip when the same date completed within this long (e.g. 20h).
    #[arg(long, value_name = "DURATION")]
    time_window: Option<String>,
    /// Skip when identical content was processed within this long; needs --content.
    #[arg(long, value_name = "DURATION", requires = "content")]
    content_hash: Option<String>,
    /// A command whose standard output is the content (split into words like a shell's,
    /// but no shell runs it: `--content 'ls -l /data/{date}'`).
    #[arg(long, value_name = "COMMAND", requires = "content_hash")]
    content: Option<String>,
    /// How long the lease on the date lasts (renewed while the program runs).
    #[arg(long, value_name = "DURATION")]
    lease: Option<String>,
    /// Stop the program, and what it started, after this long (from the start of the
    /// content command, when there is one): the run fails, exit 124.
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,
    /// Between SIGTERM and SIGKILL when the program is stopped [default: 30s].
    #[arg(long, value_name = "DURATION")]
    grace: Option<String>,
    /// Leave the processes the program starts running when it exits (a daemon); by
    /// default idem stops them (SIGTERM, then SIGKILL after --grace) before it records.
    #[arg(long)]
    keep_descendants: bool,
    /// When the run the time window finds had another command: skip (default, with a
    /// warning) or rerun.
    #[arg(long, value_enum, value_name = "WHAT")]
    on_change: Option<crate::guard::OnChange>,
    /// Exit with this status when the run is skipped (default 0), so `idem exec … && next`
    /// can tell "ran now" from "already done".
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8))]
    skip_exit_code: Option<u8>,
    /// Print nothing of idem's own when the run completes or is skipped, only its error
    /// line when it fails (the program's output and idem's warnings still show).
    #[arg(long, short)]
    quiet: bool,
    /// enforce (default), shadow or off.
    #[arg(long, value_enum)]
    mode: Option<Mode>,
    /// strict (default: the store unavailable is exit 3, nothing run) or best_effort (run
    /// unguarded and record later).
    #[arg(long, value_enum)]
    on_store_failure: Option<StoreFailurePolicy>,
    /// Scope, when it is not just the date (default: the date).
    #[arg(long)]
    scope: Option<String>,
    /// Why the run starts [default: manual].
    #[arg(long, value_enum)]
    trigger: Option<Trigger>,
    /// The instant the scheduler meant to fire (RFC 3339): --date is evaluated there.
    #[arg(long, value_name = "RFC3339")]
    scheduled_at: Option<String>,
    /// Run id to record (default: a new UUID).
    #[arg(long)]
    run_id: Option<String>,
    /// A parameter for `{param.NAME}` in the program's arguments (repeatable).
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_param)]
    param: Vec<(String, String)>,
    /// Write the run's metrics to FILE in Prometheus text format, atomically, at the end.
    #[arg(long, value_name = "FILE")]
    metrics_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct ExplainArgs {
    /// Job name (in --jobs-dir) or path to a job .toml file.
    job: String,
    /// The partition date: YYYY-MM-DD, today, yesterday or today-N (in the job's
    /// timezone); default the job's `date`.
    #[arg(long, allow_hyphen_values = true)]
    date: Option<String>,
    /// The instant the scheduler meant to fire (RFC 3339): relative dates are evaluated
    /// there instead of at the clock.
    #[arg(long, value_name = "RFC3339")]
    scheduled_at: Option<String>,
    /// Scope, when it is not just the date (default: the date).
    #[arg(long)]
    scope: Option<String>,
    /// Explain under this mode instead of the job's.
    #[arg(long, value_enum)]
    mode: Option<Mode>,
    /// Not for explain (which takes one --date): accepted only to say so.
    #[arg(long, hide = true, allow_hyphen_values = true)]
    from: Option<String>,
    /// Not for explain: see --from.
    #[arg(long, hide = true, allow_hyphen_values = true)]
    to: Option<String>,
    /// Run the job's setup first (for SQL jobs whose content query needs the tables their
    /// setup creates); without it, explain changes nothing in the warehouse.
    #[arg(long)]
    with_setup: bool,
    /// A parameter over the job's `[params]` of that name (repeatable), as `idem run` takes.
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_param)]
    param: Vec<(String, String)>,
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
fn check_range(from: &Option<String>, to: &Option<String>) -> Result<()> {
    if to.is_some() && from.is_none() {
        return Err(Error::input(
            "--to needs --from: a range of dates is --from D1 --to D2",
        ));
    }
    Ok(())
}

#[derive(Debug, Args)]
pub(crate) struct RunsArgs {
    /// Only this job.
    #[arg(long)]
    job: Option<String>,
    /// Only this scope.
    #[arg(long)]
    scope: Option<String>,
    /// Only this status.
    #[arg(long, value_enum)]
    status: Option<RunStatus>,
    /// At most this many rows (0 = all).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    limit: u32,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["date", "scope", "from", "all"])))]
pub(crate) struct PurgeArgs {
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
pub(crate) struct CleanupArgs {
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
    /// BigQuery only: instead of deleting, let BigQuery drop partitions older than this
    /// (whole days, e.g. 30d; `none` to stop expiring) on the partitioned tables, then
    /// report each table's expiration (a plain `idem cleanup` reports it too).
    #[arg(long, value_name = "DAYS", conflicts_with = "dry_run")]
    set_partition_expiration: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct FingerprintArgs {
    /// NDJSON file of events, one JSON object a line (`-` or none: standard input).
    file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub(crate) struct GateArgs {
    /// The event's key: a field, or several separated by commas (`id,customer_id`: their
    /// values joined with `:`); dotted paths for nested ones.
    #[arg(long, value_name = "FIELD[,FIELD...]")]
    key: String,
    /// Fingerprint only these fields of the payload (default: every field but the key's).
    #[arg(long, value_name = "F,..", conflicts_with = "exclude_fields")]
    fingerprint_fields: Option<String>,
    /// Fingerprint the payload without these fields (in addition to the key's).
    #[arg(long, value_name = "F,..")]
    exclude_fields: Option<String>,
    /// Money amounts in these fields are compared as numbers of scale 2 ("100.5",
    /// "$100.50" and 100.50 are the same payload).
    #[arg(long, value_name = "F,..")]
    normalize_amounts: Option<String>,
    /// How long a mark lasts (e.g. 24h, 7d; `never`: forever).
    #[arg(long, default_value = "never")]
    ttl: String,
    /// The namespace of the keys in the store (separate gates, separate keys).
    #[arg(long, default_value = "gate")]
    namespace: String,
    /// NDJSON input (`-` or none: standard input).
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// Where the records go (`-` or none: standard output).
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Lines per batch: one store round trip each.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch: u32,
    /// What a store failure does: strict (exit 3), best_effort (let the lines through as
    /// new, unverified), log_only (never filter: every line passes; store failures as
    /// best_effort).
    #[arg(long, default_value = "strict")]
    strategy: String,
    /// A named cursor in the store (seed 003): events at or before it in --order-by order
    /// are skipped without a store lookup (`before_cursor`); it advances with each batch's
    /// marks.
    #[arg(long, value_name = "NAME", requires = "order_by")]
    cursor: Option<String>,
    /// The timestamp field and the id field that order the input (with --cursor).
    #[arg(long, value_name = "TIMESTAMP,ID", requires = "cursor")]
    order_by: Option<String>,
    /// Write the gate's metrics to FILE in Prometheus text format (for node_exporter's
    /// textfile collector), atomically: every 10 s while running and at the end.
    #[arg(long, value_name = "FILE")]
    metrics_file: Option<PathBuf>,
    /// The summary on standard error: `human` (one line) or `json` (one JSON document).
    #[arg(long, value_name = "FORMAT", default_value = "human", value_parser = ["human", "json"])]
    stats_format: String,
    /// A key found new stays *pending* until its record is written; a gate that dies first
    /// (SIGKILL, power loss, a lost connection) leaves marks that expire after this, and
    /// the next run reports those events `new`. `0s` turns it off (marks are final at once).
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pending_timeout: String,
    /// The longest line taken, in bytes: a longer one gets an `invalid` record naming its
    /// length and is read past without being held in memory (batches are bounded in
    /// bytes too, so memory does not grow with line length).
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    max_line_bytes: u64,
}

#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// A TOML file whose `[report]` table sets the thresholds, `days` and `window` (keys
    /// named like these flags); flags win over it. Default: ./idem.toml when it exists.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Days of history to judge, ending now (thresholds are per week, scaled to this)
    /// [default: 7].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=3660))]
    days: Option<u32>,
    /// Only this job (its processor name in the ledger).
    #[arg(long)]
    job: Option<String>,
    /// Write the report to this file instead of standard output.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Print the SQL of one report query, ready to paste into a console, instead of
    /// running the report: duplicates, wasted, savings, effectiveness, storage, shadow or
    /// daily.
    #[arg(long, value_name = "NAME")]
    sql: Option<String>,
    /// With --sql: the dialect, sqlite, postgres or bigquery (default: the store's).
    #[arg(long, requires = "sql")]
    dialect: Option<String>,
    /// The end of the period (RFC 3339) instead of now.
    #[arg(long, value_name = "RFC3339")]
    until: Option<String>,
    /// Count every key ever written in the storage figures (a scan of the whole key table);
    /// by default they count the keys written since the period's start, or five weeks
    /// back when that is earlier, so a report costs its period, not the history.
    #[arg(long)]
    all_keys: bool,
    /// The time window of the jobs: Q1 counts duplicates outside it [default: 1h].
    #[arg(long)]
    window: Option<String>,
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
        _ => "warn,sqlx::query=error,sqlx::pool=error",
    });
    // A wrapper passes its standard input on to the program it runs.
    if matches!(&cli.command, Command::Exec(_))
        || matches!(&cli.command, Command::Run(args) if args.from.is_none())
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
    if let (FormatArg::Markdown | FormatArg::Html, false) = (
        cli.global.format_arg,
        matches!(cli.command, Command::Report(_)),
    ) {
        output::print_error_line("--format markdown and --format html are for idem report only");
        return EXIT_USAGE;
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
        Command::Run(args) => run::run(&args, &g, registry).await,
        Command::Exec(args) => exec::exec(&args, &g, registry).await,
        Command::Explain(args) => run::explain(&args, &g, registry).await,
        Command::Migrate => jobs::migrate(&g).await,
        Command::Jobs => jobs::jobs(&g, registry),
        Command::Runs(args) => runs::runs(args, &g).await,
        Command::Purge(args) => purge::purge(args, &g).await,
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
/// For commands that only read the ledger (`runs`, `report`): the path of a `sqlite://`
/// store whose file does not exist. That is a mistake (a typo in `--store`, the wrong
/// directory) or a ledger not made yet, never one to create: opening it would leave an
/// empty database behind.
fn missing_ledger(url: &str) -> Result<Option<std::path::PathBuf>> {
    #[cfg(feature = "sqlite")]
    if crate::backend::Backend::of(url) == Some(crate::backend::Backend::Sqlite) {
        let options = crate::backend::sqlite::connect_options(url)?;
        let path = options.get_filename();
        if !path.as_os_str().is_empty()
            && path != std::path::Path::new(":memory:")
            && !path.exists()
        {
            return Ok(Some(path.to_path_buf()));
        }
    }
    Ok(None)
}

/// What [`missing_ledger`] found, in words.
fn no_ledger_message(path: &std::path::Path) -> String {
    format!(
        "no ledger at {}: the file does not exist (check --store or IDEM_STORE; idem \
         creates the ledger on the first `idem run` or `idem migrate`)",
        path.display()
    )
}

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

/// Refuses an output file (`flag`) that cannot be written or would destroy something,
/// before anything runs (exit 2, nothing done): a folder, a file in a folder that does not
/// exist or cannot be written, any file of a SQLite database — the main file of an
/// existing one (a ledger or a warehouse) or its `-wal`, `-shm` or `-journal`, and every
/// file of the SQLite databases `databases` name (the store, a job's warehouse) even
/// before they exist — or one of `inputs` (the same file under any name).
pub(crate) fn refuse_to_overwrite(
    flag: &str,
    path: &std::path::Path,
    inputs: &[&std::path::Path],
    databases: &[&str],
) -> Result<()> {
    if path.is_dir() {
        return Err(Error::input(format!(
            "{flag} {}: that is a folder; name a file",
            path.display()
        )));
    }
    if path.file_name().is_none() {
        return Err(Error::input(format!(
            "{flag} {}: not a file name",
            path.display()
        )));
    }
    // Metrics are written to a temporary file renamed over the target: a device (say
    // /dev/full) would be replaced by a plain file, not written.
    if flag == "--metrics-file" && path.exists() && !path.is_file() {
        return Err(Error::input(format!(
            "{flag} {}: not a regular file (the metrics replace it whole, by a rename)",
            path.display()
        )));
    }
    if let Some(database) = database_of(path, databases) {
        let what = if same_file(path, &database) {
            "that file is a SQLite database".to_string()
        } else {
            format!(
                "that file belongs to the SQLite database {}",
                database.display()
            )
        };
        return Err(Error::input(format!(
            "{flag} {}: {what} (a ledger or a warehouse); writing there would destroy it. \
             Write to another file",
            path.display(),
        )));
    }
    if let Some(input) = inputs.iter().find(|input| same_file(path, input)) {
        return Err(Error::input(format!(
            "{flag} {}: that is the same file as {}, which this command also reads or \
             writes; writing there would destroy it. Write to another file",
            path.display(),
            input.display()
        )));
    }
    let folder = match path.parent() {
        Some(f) if !f.as_os_str().is_empty() => f,
        _ => std::path::Path::new("."),
    };
    if !folder.is_dir() {
        return Err(Error::input(format!(
            "{flag} {}: the folder {} does not exist",
            path.display(),
            folder.display()
        )));
    }
    writable(path, folder).map_err(|e| {
        Error::input(format!(
            "{flag} {}: cannot be written ({e}); nothing was run",
            path.display()
        ))
    })
}

/// Whether `path` can be written: an existing file opened for writing (not truncated),
/// else a file created in its folder and removed again.
fn writable(path: &std::path::Path, folder: &std::path::Path) -> std::io::Result<()> {
    if path.exists() {
        return std::fs::OpenOptions::new().write(true).open(path).map(drop);
    }
    let probe = folder.join(format!(".idem-probe.{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(&probe)
}

/// The SQLite database `path` is a file of, if any: an existing database itself, the
/// `-wal`, `-shm` or `-journal` of an existing one, or any of these files of the SQLite
/// databases `urls` name (existing or not).
fn database_of(path: &std::path::Path, urls: &[&str]) -> Option<std::path::PathBuf> {
    const COMPANIONS: [&str; 4] = ["", "-wal", "-shm", "-journal"];
    #[cfg(feature = "sqlite")]
    {
        use crate::backend::sqlite::is_sqlite_database;
        if is_sqlite_database(path) {
            return Some(path.to_path_buf());
        }
        let name = path.file_name()?.to_string_lossy().into_owned();
        for suffix in &COMPANIONS[1..] {
            if let Some(stem) = name.strip_suffix(suffix) {
                let main = path.with_file_name(stem);
                if !stem.is_empty() && is_sqlite_database(&main) {
                    return Some(main);
                }
            }
        }
        for url in urls
            .iter()
            .filter(|u| crate::backend::Backend::of(u) == Some(crate::backend::Backend::Sqlite))
        {
            let Ok(options) = crate::backend::sqlite::connect_options(url) else {
                continue;
            };
            let main = options.get_filename().to_path_buf();
            for suffix in COMPANIONS {
                let mut file = main.clone().into_os_string();
                file.push(suffix);
                if same_file(path, std::path::Path::new(&file)) {
                    return Some(main);
                }
            }
        }
    }
    #[cfg(not(feature = "sqlite"))]
    let _ = (path, urls, COMPANIONS);
    None
}

/// Whether two paths name one file: the same device and inode when both exist, else the
/// same absolute path.
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return x.dev() == y.dev() && x.ino() == y.ino();
        }
    }
    let absolute = |p: &std::path::Path| {
        std::path::absolute(p)
            .ok()
            .map(|p| p.components().collect::<std::path::PathBuf>())
    };
    absolute(a).is_some_and(|x| Some(x) == absolute(b))
}
