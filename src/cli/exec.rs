//! `idem exec NAME [guards] -- PROGRAM ARGS…`: a crontab line's program behind the guards,
//! with no job file. It runs exactly as a command job called NAME would (the same ledger,
//! `runs` and `report`): the flags are written into a job in memory and validated as a
//! job file is. As a wrapper it passes on what a wrapper should: standard input, the
//! arguments as given, the signals it receives, and the program's exit status.

use super::parse_param;
use crate::model::Mode;
use crate::runner::StoreFailurePolicy;
use clap::Args;
use std::path::PathBuf;

use super::output::{self, Format};
use super::GlobalOptions;
use crate::command::signals;
use crate::error::{Error, Result};
use crate::job::{plan, Job, Overrides};
use crate::model::{exit, RunStatus, Trigger};
use crate::processor::Registry;
use crate::runner::{Cancel, RunReport};

impl ExecArgs {
    /// The job the flags describe, validated as a job file would be; errors name the flag.
    /// Relative dates are read in `--timezone`, else the machine's zone.
    fn job(&self) -> Result<Job> {
        if self.argv.first().is_none_or(|p| p.is_empty()) {
            return Err(Error::input(format!(
                "idem exec {}: the program is empty: give it after `--` \
                 (idem exec {} -- PROGRAM [ARGS…])",
                self.name, self.name
            )));
        }
        let zone = match &self.timezone {
            Some(tz) => tz.clone(),
            None => local_zone()?,
        };
        let mut guards = toml::Table::new();
        let put = |table: &mut toml::Table, key: &str, value: &Option<String>| {
            if let Some(v) = value {
                table.insert(key.to_string(), toml::Value::String(v.clone()));
            }
        };
        put(&mut guards, "time_window", &self.time_window);
        put(&mut guards, "content_hash", &self.content_hash);
        put(&mut guards, "lease", &self.lease);
        put(
            &mut guards,
            "on_change",
            &self.on_change.map(|c| c.as_str().to_string()),
        );
        let mut command = toml::Table::new();
        command.insert(
            "run".into(),
            toml::Value::Array(
                self.argv
                    .iter()
                    .map(|a| crate::command::ArgText(a.clone()).to_toml())
                    .collect(),
            ),
        );
        if let Some(content) = &self.content {
            let argv = shlex::split(content)
                .filter(|a| !a.is_empty())
                .ok_or_else(|| {
                    Error::input(format!(
                        "--content {content:?}: not a command line (unbalanced quotes?); it is \
                     split like a shell's words but no shell runs it"
                    ))
                })?;
            command.insert(
                "content".into(),
                toml::Value::Array(argv.into_iter().map(toml::Value::String).collect()),
            );
        }
        put(&mut command, "timeout", &self.timeout);
        put(&mut command, "grace", &self.grace);
        if self.keep_descendants {
            command.insert("keep_descendants".into(), toml::Value::Boolean(true));
        }
        let mut job = toml::Table::new();
        job.insert("name".into(), toml::Value::String(self.name.clone()));
        job.insert(
            "processor".into(),
            toml::Value::String(crate::command::COMMAND_PROCESSOR.into()),
        );
        job.insert(
            "date".into(),
            toml::Value::String(self.date.clone().unwrap_or_else(|| "today".into())),
        );
        job.insert("timezone".into(), toml::Value::String(zone.clone()));
        if !self.param.is_empty() {
            let params: toml::Table = self
                .param
                .iter()
                .map(|(k, v)| (k.clone(), toml::Value::String(v.clone())))
                .collect();
            job.insert("params".into(), toml::Value::Table(params));
        }
        job.insert("guards".into(), toml::Value::Table(guards));
        job.insert("command".into(), toml::Value::Table(command));
        let text = toml::to_string(&job)
            .map_err(|e| Error::input(format!("idem exec {}: {e}", self.name)))?;
        // A job "file" that names the command line: errors read `job file <idem exec NAME>: …`,
        // and the program runs in the current folder.
        let path = format!("<idem exec {}>", self.name);
        // Its dates are local; its program is looked for when the run starts, so a
        // program that is not there is a failed run (exit 127) in the ledger, as a
        // program that cannot start is (126).
        let adjust = |job: &mut Job| {
            if let Some(command) = job.command.as_mut() {
                command.date_zone = Some(zone);
                command.programs_at_run = true;
            }
        };
        Job::parse_adjusted(&text, std::path::Path::new(&path), adjust).map_err(|e| {
            let message = e
                .to_string()
                .replacen(
                    &format!("job file {path}"),
                    &format!("idem exec {}", self.name),
                    1,
                )
                .replace("[command] grace", "--grace")
                .replace("[guards] lease", "--lease");
            Error::config(message)
        })
    }
}

/// The machine's time zone, as the `date` command reads it: `TZ` (an IANA name, `:NAME`,
/// or a path into a zoneinfo folder; empty is UTC), else `/etc/localtime` (a link into
/// the zoneinfo folder, or `/etc/timezone` beside it); UTC when neither is there.
fn local_zone() -> Result<String> {
    let valid = |name: &str| crate::schedule::parse_timezone(name).is_ok();
    if let Some(tz) = std::env::var_os("TZ") {
        let text = tz.to_string_lossy();
        let name = text.strip_prefix(':').unwrap_or(&text);
        if name.is_empty() {
            return Ok("UTC".into());
        }
        let name = match name.split_once("zoneinfo/") {
            Some((_, zone)) if name.starts_with('/') => zone,
            _ => name,
        };
        if valid(name) {
            return Ok(name.to_string());
        }
        return Err(Error::input(format!(
            "TZ={text:?}: not a time zone idem can read (an IANA name like Europe/Paris); \
             set TZ to one, or pass --timezone"
        )));
    }
    match iana_time_zone::get_timezone() {
        Ok(name) if valid(&name) => Ok(name),
        _ if !std::path::Path::new("/etc/localtime").exists() => Ok("UTC".into()),
        Ok(name) => Err(Error::input(format!(
            "the machine's time zone {name:?} (/etc/localtime) is not one idem can read; pass \
             --timezone or set TZ"
        ))),
        Err(e) => Err(Error::input(format!(
            "cannot tell the machine's time zone from /etc/localtime ({e}); pass --timezone \
             or set TZ"
        ))),
    }
}

/// `idem exec`: one run of the program through the guards, recorded like `idem run`'s.
pub(super) async fn exec(args: &ExecArgs, g: &GlobalOptions, registry: &Registry) -> Result<u8> {
    if let Some(path) = &args.metrics_file {
        super::refuse_to_overwrite("--metrics-file", path, &[], &[&g.store])?;
    }
    let job = args.job()?;
    let cancel = stop_on_signals()?;
    let overrides = Overrides {
        mode: args.mode,
        store_failure: args.on_store_failure,
        trigger: Some(args.trigger.unwrap_or(Trigger::Manual)),
        scope: args.scope.clone(),
        run_id: args.run_id.clone(),
        cancel: Some(cancel.clone()),
        spool: true,
        params: args.param.iter().cloned().collect(),
        connections: None,
    };
    let date = job.run_date(None, args.scheduled_at.as_deref(), chrono::Utc::now())?;
    let request = overrides.request(&job, date)?;
    let plan = plan(&job, registry, &g.store, overrides).await?;
    let report = plan.runner.run(&*plan.processor, request).await?;
    let code = command_exit_code(&report, &cancel, args.skip_exit_code);
    if !args.quiet {
        output::print_report(&report, g.format);
    } else if report.status == RunStatus::Failed {
        print_error_line(&report, g.format);
    }
    if let Some(path) = &args.metrics_file {
        super::metrics::write_atomically(path, &super::metrics::run_metrics(&report, code))?;
    }
    Ok(code)
}

/// `--quiet`'s one line for a failed run (the program's standard error went through
/// already: not its tail again).
fn print_error_line(report: &RunReport, format: Format) {
    let error = report.error.as_deref().unwrap_or("failed");
    let first = error
        .split("; last lines of its stderr:")
        .next()
        .unwrap_or(error)
        .lines()
        .next()
        .unwrap_or(error);
    let line = format!(
        "{} for {} failed: {first} (run id {})",
        report.job, report.scope, report.run_id
    );
    if format == Format::Json {
        output::print_json(&serde_json::json!({"error": line}));
    }
    output::print_error_line(line);
}

/// The exit status of a command job's run, as a wrapper gives it (`timeout(1)`): 0 when
/// it completed, `skip_code` (default 0) when skipped, the program's own status when it
/// failed (its code, 128+N for signal N, 124 past its timeout), 128+N when idem was
/// stopped by signal N, 3 when the result could not be recorded, else 1.
pub(super) fn command_exit_code(report: &RunReport, cancel: &Cancel, skip_code: Option<u8>) -> u8 {
    match report.status {
        RunStatus::Skipped => skip_code.unwrap_or(exit::OK),
        RunStatus::Completed => exit::OK,
        RunStatus::Failed if report.recording_failed() => exit::STORE_UNAVAILABLE,
        RunStatus::Failed => report
            .exit_status
            .or_else(|| {
                let signal = signals::number(cancel.reason()?)?;
                u8::try_from(128 + signal).ok()
            })
            .unwrap_or(exit::RUN_FAILED),
    }
}

/// Listens for every signal that would otherwise end idem ([`signals::handled`]), so none
/// ends it unrecorded. Each is forwarded, as it came, to the process group of the program
/// running (a command job); SIGHUP, SIGINT, SIGQUIT and SIGTERM also cancel the returned
/// token (the run stops and is recorded as interrupted, its lease released), and so does
/// any of them when no program runs to pass it to. The token's reason is the signal's name.
pub(super) fn stop_on_signals() -> Result<Cancel> {
    use tokio::signal::unix::{signal, SignalKind};
    let cancel = Cancel::new();
    for sig in signals::handled() {
        let mut stream = match signal(SignalKind::from_raw(sig)) {
            Ok(s) => s,
            Err(e) if signals::STOPPING.contains(&sig) => {
                return Err(Error::config(format!("cannot listen for signals: {e}")))
            }
            Err(e) => {
                tracing::debug!("not listening for {}: {e}", signals::name(sig));
                continue;
            }
        };
        let cancel = cancel.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                let stops = signals::STOPPING.contains(&sig);
                let forwarded = crate::command::forward_signal(sig, stops);
                if stops || !forwarded {
                    cancel.cancel(signals::name(sig));
                }
            }
        });
    }
    Ok(cancel)
}

#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    /// The job's name in the ledger (what `runs --job` and `report --job` take).
    pub(super) name: String,
    /// The program and its arguments, after `--`, passed as given: only `{date}`,
    /// `{scope}`, `{run_id}`, `{trigger}`, `{job}` and `{param.NAME}` are replaced (no
    /// shell reads them; other braces stay).
    #[arg(last = true, required = true, value_name = "PROGRAM ARGS",
          value_parser = clap::value_parser!(std::ffi::OsString))]
    pub(super) argv: Vec<std::ffi::OsString>,
    /// The partition date: YYYY-MM-DD, today, yesterday or today-N (in --timezone).
    #[arg(long, allow_hyphen_values = true, default_value = "today")]
    pub(super) date: Option<String>,
    /// The IANA time zone relative dates are read in [default: the machine's, as `date`
    /// reads it: TZ, else /etc/localtime].
    #[arg(long)]
    pub(super) timezone: Option<String>,
    /// Skip when the same date completed within this long (e.g. 20h).
    #[arg(long, value_name = "DURATION")]
    pub(super) time_window: Option<String>,
    /// Skip when identical content was processed within this long; needs --content.
    #[arg(long, value_name = "DURATION", requires = "content")]
    pub(super) content_hash: Option<String>,
    /// A command whose standard output is the content (split into words like a shell's,
    /// but no shell runs it: `--content 'ls -l /data/{date}'`).
    #[arg(long, value_name = "COMMAND", requires = "content_hash")]
    pub(super) content: Option<String>,
    /// How long the lease on the date lasts (renewed while the program runs).
    #[arg(long, value_name = "DURATION")]
    pub(super) lease: Option<String>,
    /// Stop the program, and what it started, after this long (from the start of the
    /// content command, when there is one): the run fails, exit 124.
    #[arg(long, value_name = "DURATION")]
    pub(super) timeout: Option<String>,
    /// Between SIGTERM and SIGKILL when the program is stopped [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub(super) grace: Option<String>,
    /// Leave the processes the program starts running when it exits (a daemon); by
    /// default idem stops them (SIGTERM, then SIGKILL after --grace) before it records.
    #[arg(long)]
    pub(super) keep_descendants: bool,
    /// When the run the time window finds had another command: skip (default, with a
    /// warning) or rerun.
    #[arg(long, value_enum, value_name = "WHAT")]
    pub(super) on_change: Option<crate::guard::OnChange>,
    /// Exit with this status when the run is skipped (default 0), so `idem exec … && next`
    /// can tell "ran now" from "already done".
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8))]
    pub(super) skip_exit_code: Option<u8>,
    /// Print nothing of idem's own when the run completes or is skipped, only its error
    /// line when it fails (the program's output and idem's warnings still show).
    #[arg(long, short)]
    pub(super) quiet: bool,
    /// enforce (default), shadow or off.
    #[arg(long, value_enum)]
    pub(super) mode: Option<Mode>,
    /// strict (default: the store unavailable is exit 3, nothing run) or best_effort (run
    /// unguarded and record later).
    #[arg(long, value_enum)]
    pub(super) on_store_failure: Option<StoreFailurePolicy>,
    /// Scope, when it is not just the date (default: the date).
    #[arg(long)]
    pub(super) scope: Option<String>,
    /// Why the run starts [default: manual].
    #[arg(long, value_enum)]
    pub(super) trigger: Option<Trigger>,
    /// The instant the scheduler meant to fire (RFC 3339): --date is evaluated there.
    #[arg(long, value_name = "RFC3339")]
    pub(super) scheduled_at: Option<String>,
    /// Run id to record (default: a new UUID).
    #[arg(long)]
    pub(super) run_id: Option<String>,
    /// A parameter for `{param.NAME}` in the program's arguments (repeatable).
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_param)]
    pub(super) param: Vec<(String, String)>,
    /// Write the run's metrics to FILE in Prometheus text format, atomically, at the end.
    #[arg(long, value_name = "FILE")]
    pub(super) metrics_file: Option<PathBuf>,
}
