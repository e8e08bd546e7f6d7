//! `idem report`: is the content hash worth it?

use super::output;
use super::{input, FormatArg, GlobalOptions, ReportArgs, EXIT_OK};
use crate::error::{Error, Result};
use crate::model::duration::parse_duration_field;
use crate::schedule;

fn report_threshold(flag: &str, value: Option<f64>, default: f64) -> Result<f64> {
    match value {
        None => Ok(default),
        Some(v) if v.is_finite() && v >= 0.0 => Ok(v),
        Some(v) => Err(Error::input(format!(
            "bad --{flag} {v}: expected a number of 0 or more"
        ))),
    }
}

pub(super) async fn report(args: ReportArgs, g: &GlobalOptions) -> Result<u8> {
    use crate::report::{self, Dialect, OutputFormat, ReportOptions, Thresholds};
    let mut options = ReportOptions::last_days(args.days);
    if let Some(until) = &args.until {
        options.until = schedule::parse_instant("--until", until)?;
    }
    options.job = args.job.clone();
    options.window = parse_duration_field("--window", &args.window).map_err(input)?;
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
            std::fs::write(path, text).map_err(|e| Error::io("write the report to", path, e))?;
            output::note(format_args!("wrote {}", path.display()));
        }
        None => output::print_text(&text),
    }
    Ok(EXIT_OK)
}
