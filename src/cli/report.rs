//! `idem report`: is the content hash worth it?

use clap::Args;

use super::output;
use super::{input, FormatArg, GlobalOptions, EXIT_OK};
use crate::error::{Error, Result};
use crate::model::duration::parse_duration_field;
use crate::schedule;
use serde::Deserialize;
use std::path::{Path, PathBuf};

fn path_text(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// The `[report]` table of a config file: the flags' names with `_` for `-` (and the
/// JSON's names as aliases); every key optional, flags win.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReportTable {
    days: Option<u32>,
    window: Option<String>,
    duplicate_runs: Option<f64>,
    #[serde(alias = "identical_data_runs")]
    identical_runs: Option<f64>,
    minutes_wasted: Option<f64>,
    #[serde(alias = "high_confidence_prevents")]
    preventable_runs: Option<f64>,
    #[serde(alias = "min_completed_runs")]
    min_runs: Option<u64>,
    max_stddev: Option<f64>,
}

/// A config file: only its `[report]` table is read (and nothing else may be in it yet).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    report: ReportTable,
}

/// The config file's name looked for in the current directory without `--config`.
const DEFAULT_CONFIG: &str = "idem.toml";

/// The `[report]` table of `--config FILE`, or of ./idem.toml when it exists; the file
/// read, if any.
fn report_table(config: Option<&Path>) -> Result<(ReportTable, Option<PathBuf>)> {
    let path = match config {
        Some(p) => p.to_path_buf(),
        None if Path::new(DEFAULT_CONFIG).is_file() => PathBuf::from(DEFAULT_CONFIG),
        None => return Ok((ReportTable::default(), None)),
    };
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io("read", &path, e))?;
    let file: ConfigFile = toml::from_str(&text)
        .map_err(|e| Error::config(format!("config file {}: {e}", path.display())))?;
    Ok((file.report, Some(path)))
}

/// A threshold from its flag, else the config file's `[report]` key (`in_file` names it
/// in errors), else `default`.
fn report_threshold(
    flag: &str,
    value: Option<f64>,
    file_value: Option<f64>,
    in_file: &dyn Fn(&str) -> String,
    default: f64,
) -> Result<f64> {
    let ok = |v: f64| v.is_finite() && v >= 0.0;
    match (value, file_value) {
        (Some(v), _) if ok(v) => Ok(v),
        (Some(v), _) => Err(Error::input(format!(
            "bad --{flag} {v}: expected a number of 0 or more"
        ))),
        (None, Some(v)) if ok(v) => Ok(v),
        (None, Some(v)) => Err(Error::config(format!(
            "{}: bad value {v}: expected a number of 0 or more",
            in_file(&flag.replace('-', "_"))
        ))),
        (None, None) => Ok(default),
    }
}

/// `--job NAME` that no job file and no ledger row knows is a typo, not an empty period:
/// exit 2 naming the jobs there are.
async fn known_job(job: &str, store_url: &str, jobs_dir: &Path) -> Result<()> {
    let store = crate::store::open(store_url).await?;
    let ever = store
        .runs(&crate::store::RunFilter {
            processor: Some(job.to_string()),
            limit: 1,
            ..Default::default()
        })
        .await?;
    let files = crate::job::scan_jobs(jobs_dir, store_url)
        .map(|s| s.jobs.into_iter().map(|j| j.name).collect::<Vec<_>>())
        .unwrap_or_default();
    if !ever.is_empty() || files.iter().any(|f| f == job) {
        return Ok(());
    }
    let mut known: Vec<String> = store
        .runs(&crate::store::RunFilter {
            limit: 10_000,
            ..Default::default()
        })
        .await?
        .into_iter()
        .map(|r| r.processor)
        .chain(files)
        .collect();
    known.sort();
    known.dedup();
    Err(Error::input(format!(
        "--job {job:?}: no such job (no job file in {} and no run in the ledger); known: {}",
        jobs_dir.display(),
        if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        }
    )))
}

pub(super) async fn report(args: ReportArgs, g: &GlobalOptions) -> Result<u8> {
    use crate::report::{self, Dialect, OutputFormat, ReportOptions, Thresholds};
    let (file, path) = report_table(args.config.as_deref())?;
    let in_file = |key: &str| format!("config file {}: [report] {key}", path_text(&path));
    let days = match (args.days, file.days) {
        (Some(d), _) => d,
        (None, Some(d)) if (1..=3660).contains(&d) => d,
        (None, Some(d)) => {
            return Err(Error::config(format!(
                "{}: bad value {d}: expected 1 to 3660 days",
                in_file("days")
            )))
        }
        (None, None) => 7,
    };
    let mut options = ReportOptions::last_days(days);
    if let Some(until) = &args.until {
        options.until = schedule::parse_instant("--until", until)?;
    }
    let first_day = chrono::NaiveDate::from_ymd_opt(1, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc());
    if first_day.is_some_and(|first| options.since() < first) {
        return Err(Error::input(format!(
            "--until {} with a period of {days} day(s) would start before 0001-01-01: \
             choose a later --until or fewer --days",
            crate::model::time::utc_text(options.until)
        )));
    }
    options.job = args.job.clone();
    options.all_keys = args.all_keys;
    options.window = match (&args.window, &file.window) {
        (Some(w), _) => parse_duration_field("--window", w).map_err(input)?,
        (None, Some(w)) => parse_duration_field(&in_file("window"), w)?,
        (None, None) => options.window,
    };
    let d = Thresholds::default();
    options.thresholds = Thresholds {
        duplicate_runs: report_threshold(
            "duplicate-runs",
            args.duplicate_runs,
            file.duplicate_runs,
            &in_file,
            d.duplicate_runs,
        )?,
        identical_data_runs: report_threshold(
            "identical-runs",
            args.identical_runs,
            file.identical_runs,
            &in_file,
            d.identical_data_runs,
        )?,
        minutes_wasted: report_threshold(
            "minutes-wasted",
            args.minutes_wasted,
            file.minutes_wasted,
            &in_file,
            d.minutes_wasted,
        )?,
        high_confidence_prevents: report_threshold(
            "preventable-runs",
            args.preventable_runs,
            file.preventable_runs,
            &in_file,
            d.high_confidence_prevents,
        )?,
        min_completed_runs: args
            .min_runs
            .or(file.min_runs)
            .unwrap_or(d.min_completed_runs),
        max_stddev: report_threshold(
            "max-stddev",
            args.max_stddev,
            file.max_stddev,
            &in_file,
            d.max_stddev,
        )?,
    };
    options.config_file = path.as_ref().map(|p| p.display().to_string());
    if let Some(path) = &args.output {
        super::refuse_to_overwrite("--output", path, &[], &[&g.store])?;
    }
    let text = if let Some(name) = &args.sql {
        let dialect = match &args.dialect {
            Some(d) => Dialect::parse(d)?,
            None => report::dialect_of_url(&g.store).map_err(|e| {
                Error::config(format!(
                    "{e}; name one with --dialect sqlite|postgres|bigquery"
                ))
            })?,
        };
        let sql = report::sql_for_console(name, dialect, &options)?;
        if g.format_arg == FormatArg::Json {
            // The SQL is text to paste; JSON callers get it whole, with what it is.
            let doc = serde_json::json!({ "query": name, "dialect": dialect.as_str(), "sql": sql });
            format!(
                "{}\n",
                serde_json::to_string_pretty(&doc).unwrap_or_default()
            )
        } else {
            sql
        }
    } else {
        let format = match g.format_arg {
            // ndjson and csv are refused before any command runs (idem gate only).
            FormatArg::Human | FormatArg::Ndjson | FormatArg::Csv => OutputFormat::Human,
            FormatArg::Json => OutputFormat::Json,
            FormatArg::Markdown => OutputFormat::Markdown,
            FormatArg::Html => OutputFormat::Html,
        };
        if let Some(path) = super::missing_ledger(&g.store)? {
            return Err(Error::input(super::no_ledger_message(&path)));
        }
        let report = report::run(&g.store, &options).await?;
        if let Some(job) = &args.job {
            if report.processors.is_empty() {
                known_job(job, &g.store, &g.jobs_dir).await?;
            }
        }
        report::render(&report, format)
    };
    match &args.output {
        Some(path) => {
            std::fs::write(path, text).map_err(|e| Error::io("write the report to", path, e))?;
            output::note(format_args!("wrote {}", path.display()));
        }
        None => output::print_text(&text),
    }
    Ok(EXIT_OK)
}

#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// A TOML file whose `[report]` table sets the thresholds, `days` and `window` (keys
    /// named like these flags); flags win over it. Default: ./idem.toml when it exists.
    #[arg(long, value_name = "FILE")]
    pub(super) config: Option<PathBuf>,
    /// Days of history to judge, ending now (thresholds are per week, scaled to this)
    /// [default: 7].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=3660))]
    pub(super) days: Option<u32>,
    /// Only this job (its processor name in the ledger).
    #[arg(long)]
    pub(super) job: Option<String>,
    /// Write the report to this file instead of standard output.
    #[arg(long)]
    pub(super) output: Option<PathBuf>,
    /// Print the SQL of one report query, ready to paste into a console, instead of
    /// running the report: duplicates, wasted, savings, effectiveness, storage, shadow or
    /// daily.
    #[arg(long, value_name = "NAME")]
    pub(super) sql: Option<String>,
    /// With --sql: the dialect, sqlite, postgres or bigquery (default: the store's).
    #[arg(long, requires = "sql")]
    pub(super) dialect: Option<String>,
    /// The end of the period (RFC 3339) instead of now.
    #[arg(long, value_name = "RFC3339")]
    pub(super) until: Option<String>,
    /// Count every key ever written in the storage figures (a scan of the whole key table);
    /// by default they count the keys written since the period's start, or five weeks
    /// back when that is earlier, so a report costs its period, not the history.
    #[arg(long)]
    pub(super) all_keys: bool,
    /// The time window of the jobs: Q1 counts duplicates outside it [default: 1h].
    #[arg(long)]
    pub(super) window: Option<String>,
    /// Q1 threshold per week: more duplicate runs outside the window than this ...
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) duplicate_runs: Option<f64>,
    /// ... with more identical-data runs than this is a moderate signal (per week).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) identical_runs: Option<f64>,
    /// Q2 threshold per week: more minutes wasted than this is a strong signal.
    #[arg(long, value_name = "MINUTES", allow_negative_numbers = true)]
    pub(super) minutes_wasted: Option<f64>,
    /// Q3 threshold per week: more high-confidence preventable runs than this is strong.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) preventable_runs: Option<f64>,
    /// Fewer completed runs than this in the period: not_enough_data.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) min_runs: Option<u64>,
    /// Q3: repeats whose records processed vary by less than this standard deviation
    /// count as identical content.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(super) max_stddev: Option<f64>,
}
