//! All the printing of the CLI: human lines, JSON documents (and the report's markdown
//! and HTML, rendered by [`crate::report`]). Commands compute; these functions print.

use std::io::Write;

use chrono::NaiveDate;

use crate::error::{Error, Result};
use crate::job::{Job, JobProblem};
use crate::model::{Mode, RunRecord, RunStatus};
use crate::runner::{Explanation, RunReport};
use crate::schedule::{BackfillSummary, JobPlan};
use crate::store::{CleanupPolicy, CleanupReport, PartitionExpiration};

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Lines for people.
    Human,
    /// One JSON document for machines.
    Json,
}

/// Prints `value` as one pretty JSON document on stdout, buffered (stdout is line
/// buffered: unbuffered, a document of 90,000 dates is a million writes).
pub(crate) fn print_json<T: serde::Serialize>(value: &T) {
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let _ = serde_json::to_writer_pretty(&mut out, value);
    let _ = writeln!(out);
    let _ = out.flush();
}

/// Writes `text` as is on stdout.
pub(crate) fn print_text(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// `error: MESSAGE` on stderr.
pub(crate) fn print_error_line(message: impl std::fmt::Display) {
    errln!("error: {message}");
}

/// A command's error: `error: …` on stderr, and with JSON output also
/// `{"error", "exit_code"}` on stdout.
pub(crate) fn print_error(e: &Error, code: u8, format: Format) {
    if format == Format::Json {
        let doc = serde_json::json!({"error": e.to_string(), "exit_code": code});
        outln!("{doc}");
    }
    errln!("error: {e}");
}

/// `idem migrate`.
pub(crate) fn print_migrated(store: &str, format: Format) {
    match format {
        Format::Json => print_json(&serde_json::json!({"store": store, "migrated": true})),
        Format::Human => outln!("migrated {store}"),
    }
}

/// `idem migrate --check`.
pub(crate) fn print_schema_state(store: &str, state: &crate::store::SchemaState, format: Format) {
    match format {
        Format::Json => print_json(&serde_json::json!({
            "store": store,
            "version": state.current,
            "latest": state.latest,
            "current": !state.is_behind(),
        })),
        Format::Human if state.is_behind() => outln!(
            "schema of {store}: behind, version {} of {} (run `idem migrate`)",
            state.current,
            state.latest
        ),
        Format::Human => outln!("schema of {store}: current, version {}", state.current),
    }
}

/// `idem run JOB --missing` with nothing to run, or with `--dry-run`.
pub(crate) fn print_missing(
    job: &str,
    since: &str,
    scopes: &[crate::schedule::status::ExpectedScope],
    dry_run: bool,
    format: Format,
) {
    if format == Format::Json {
        let list: Vec<_> = scopes
            .iter()
            .map(|s| serde_json::json!({"scope": s.scope, "state": s.state.as_str(), "due": s.due}))
            .collect();
        print_json(
            &serde_json::json!({"job": job, "since": since, "dry_run": dry_run, "would_run": list}),
        );
        return;
    }
    if scopes.is_empty() {
        outln!("nothing missing: every scope {job}'s schedule expected in the last {since} completed, is running or is not yet due");
        return;
    }
    for s in scopes {
        outln!("would run {job} for {} ({})", s.scope, s.state.as_str());
    }
}

/// `idem fingerprint`.
pub(crate) fn print_fingerprint(fingerprint: &str, events: usize, format: Format) {
    match format {
        Format::Json => {
            print_json(&serde_json::json!({"fingerprint": fingerprint, "events": events}))
        }
        Format::Human => outln!("{fingerprint}"),
    }
}

/// One recorded run as `idem runs` prints it (a line, newline included).
pub(crate) fn run_line(r: &RunRecord) -> String {
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
    format!(
        "{}  {:<9} {} {}  run {}  {} ms  {}\n",
        r.started_at.format("%Y-%m-%d %H:%M:%S"),
        r.status.as_str(),
        r.processor,
        r.scope,
        r.run_id,
        r.duration_ms,
        why
    )
}

/// `idem jobs` with invalid files: the valid jobs (human: only if any), every problem
/// and the summary on stderr.
pub(crate) fn print_job_problems(
    jobs: &[Job],
    problems: &[JobProblem],
    summary: &str,
    exit_code: u8,
    format: Format,
) -> Result<()> {
    match format {
        Format::Json => print_json(&serde_json::json!({
            "error": summary,
            "exit_code": exit_code,
            "problems": problems,
            "jobs": job_docs(jobs)?,
        })),
        Format::Human if !jobs.is_empty() => print_jobs(jobs, format)?,
        Format::Human => {}
    }
    for p in problems {
        errln!("error: {}", p.error);
    }
    errln!("error: {summary}");
    Ok(())
}

/// The end of a backfill: the summary line, or one JSON document with every run.
pub(crate) fn print_backfill(
    job: &str,
    (from, to): (NaiveDate, NaiveDate),
    summary: &BackfillSummary,
    failure: Option<&Error>,
    reports: &[RunReport],
    format: Format,
) {
    match format {
        Format::Json => print_json(&serde_json::json!({
            "job": job,
            "from": from,
            "to": to,
            "completed": summary.completed,
            "skipped": summary.skipped,
            "failed": summary.failed,
            "failed_dates": summary.failed_dates,
            "not_run": summary.not_run,
            "error": failure.map(|e| e.to_string()),
            "runs": reports,
        })),
        Format::Human => outln!("backfill {job} {from}..{to}: {}", summary.line()),
    }
}

/// `idem cleanup`: counts per table.
pub(crate) fn print_cleanup(
    store: &str,
    policy: &CleanupPolicy,
    report: &CleanupReport,
    partitions: Option<&[PartitionExpiration]>,
    format: Format,
) {
    let verb = if policy.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    match format {
        Format::Json => {
            let mut json = report.summary(policy);
            for (key, value) in [
                ("keys_deleted", report.keys_deleted),
                ("runs_deleted", report.runs_deleted),
                ("leases_deleted", report.leases_deleted),
                ("event_keys_deleted", report.event_keys_deleted),
            ] {
                json[key] = value.into();
            }
            if let Some(tables) = partitions {
                json["partition_expiration"] = partition_json(tables);
            }
            print_json(&json)
        }
        Format::Human => {
            let keys = crate::model::time::utc_text(policy.keys_before);
            let runs = crate::model::time::utc_text(policy.runs_before);
            outln!("{verb} from {store}:");
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
                "  event_keys        {:>10}  expired before {keys} (never one without a TTL)",
                report.event_keys_deleted
            );
            if let Some(tables) = partitions {
                outln!("partition expiration:");
                partition_lines(tables);
            }
        }
    }
}

/// What `idem purge` did.
pub(crate) struct Purged<'a> {
    pub job: &'a str,
    pub label: &'a str,
    pub scopes: &'a Option<Vec<String>>,
    pub what: &'a str,
    pub deleted: u64,
    pub run_id: &'a str,
}

/// `idem purge`.
pub(crate) fn print_purged(p: &Purged<'_>, format: Format) {
    match format {
        Format::Json => print_json(&serde_json::json!({
            "job": p.job,
            "scope": p.label,
            "scopes": p.scopes,
            "keys_deleted": p.deleted,
            "run_id": p.run_id,
        })),
        Format::Human => {
            outln!("purged {} processing key(s) of {}", p.deleted, p.what);
            outln!("  recorded as run {} (skipped: purged)", p.run_id);
        }
    }
}

/// `idem explain NAME` of a job known only from the ledger.
pub(crate) fn print_ledger_explanation(
    job: &str,
    scope: &str,
    holder: Option<&crate::store::LeaseHolder>,
    completed: Option<&RunRecord>,
    now: chrono::DateTime<chrono::Utc>,
    format: Format,
) {
    let at = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M:%S UTC").to_string();
    if format == Format::Json {
        print_json(&serde_json::json!({
            "job": job,
            "scope": scope,
            "job_file": false,
            "lease": holder.map(|h| serde_json::json!({
                "run_id": h.run_id, "acquired_at": h.acquired_at, "expires_at": h.expires_at,
            })),
            "last_completed": completed.map(|r| serde_json::json!({
                "run_id": r.run_id, "finished_at": r.finished_at,
            })),
        }));
        return;
    }
    outln!(
        "{job} for {scope}: a job without a job file (an `idem exec` job); its guards are given on \
         each command line, so this is what the ledger says, not a decision"
    );
    match holder {
        Some(h) => outln!(
            "  lease           held by run {} since {}, until {} (idem release frees it if that run is gone)",
            h.run_id,
            at(h.acquired_at),
            at(h.expires_at)
        ),
        None => outln!("  lease           free"),
    }
    match completed {
        Some(r) => outln!(
            "  last completed  run {} at {} ({} ago)",
            r.run_id,
            at(r.finished_at),
            humantime::format_duration(
                (now - r.finished_at)
                    .to_std()
                    .map(|d| std::time::Duration::from_secs(d.as_secs()))
                    .unwrap_or_default()
            )
        ),
        None => outln!("  last completed  never"),
    }
}

/// `idem release`: the freed holder, or that no lease was held.
pub(crate) fn print_released(
    job: &str,
    scope: &str,
    holder: Option<&crate::store::LeaseHolder>,
    run_id: Option<&str>,
    format: Format,
) {
    match (format, holder) {
        (Format::Json, _) => print_json(&serde_json::json!({
            "job": job,
            "scope": scope,
            "released": holder.map(|h| serde_json::json!({
                "run_id": h.run_id,
                "token": h.token,
                "acquired_at": h.acquired_at,
                "expires_at": h.expires_at,
            })),
            "run_id": run_id,
        })),
        (Format::Human, None) => outln!("no lease held on {job} for {scope}: nothing to release"),
        (Format::Human, Some(h)) => {
            outln!(
                "released the lease on {job} for {scope} held by run {} (token {})",
                h.run_id,
                h.token
            );
            if let Some(id) = run_id {
                outln!("  run id: {id}");
            }
        }
    }
}

/// A line on stderr (`wrote FILE`, `purge cancelled: nothing deleted`).
pub(crate) fn note(message: impl std::fmt::Display) {
    errln!("{message}");
}

pub(crate) fn print_plans(plans: &[JobPlan], format: Format) {
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
                crate::model::time::utc_text(f.utc),
                f.date
            );
        }
    }
}

pub(crate) fn print_report(report: &RunReport, format: Format) {
    if format == Format::Json {
        print_json(report);
        return;
    }
    outln!("{}", status_line(report, false));
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
            crate::model::time::utc_text(prev.at)
        );
    }
    if let Some(key) = &report.processing_key {
        outln!("  processing key: {key}");
    }
    if let Some(error) = &report.error {
        outln!("  error: {error}");
    }
    for e in &report.store_errors {
        outln!("  store error while {e}");
    }
    if report.spooled() {
        outln!("  warning: the store is unreachable; this run is spooled locally and recorded when it is back");
    } else if !report.recorded() {
        outln!("  warning: this run is not recorded in the ledger");
    }
}

pub(crate) fn print_explanation(e: &Explanation, format: Format) {
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

pub(crate) fn job_docs(jobs: &[Job]) -> Result<Vec<serde_json::Value>> {
    jobs.iter()
        .map(|j| {
            Ok(serde_json::json!({
                "name": j.name,
                "processor": j.processor,
                "schedule": j.schedule,
                "mode": j.mode.as_str(),
                "guards": j.guard_stack()?.names(),
                "path": j.path,
                "description": j.description,
            }))
        })
        .collect()
}

pub(crate) fn print_jobs(jobs: &[Job], format: Format) -> Result<()> {
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
            j.mode.as_str(),
            j.schedule.as_deref().unwrap_or("-"),
            j.guard_stack()?.names().join(", "),
            j.path.display()
        );
    }
    Ok(())
}

/// The backfill's progress bar: drawn on stderr when it is a terminal (human output),
/// hidden otherwise.
pub(crate) fn backfill_bar(dates: usize, format: Format) -> indicatif::ProgressBar {
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

/// `idem cleanup --set-partition-expiration`: each partitioned table's expiration.
pub(crate) fn print_partition_expiration(
    store: &str,
    tables: &[PartitionExpiration],
    format: Format,
) {
    match format {
        Format::Json => print_json(&serde_json::json!({
            "partition_expiration": partition_json(tables),
        })),
        Format::Human => {
            outln!("partition expiration on {store}:");
            partition_lines(tables);
        }
    }
}

/// `{table: days or null}`.
fn partition_json(tables: &[PartitionExpiration]) -> serde_json::Value {
    tables
        .iter()
        .map(|t| (t.table.to_string(), serde_json::json!(t.days)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// `  TABLE  after N days` / `never` / `not reported (…)`, one line a table.
fn partition_lines(tables: &[PartitionExpiration]) {
    for t in tables {
        let text = match (t.partitioned, t.days) {
            (_, Some(days)) => format!("partitions expire after {days} days"),
            (true, None) => "partitions never expire".to_string(),
            (false, None) => "no partitioning reported for the table".to_string(),
        };
        outln!("  {:<17} {text}", t.table);
    }
}

/// The cleanup's progress bar: drawn on stderr when it is a terminal (human output), `None`
/// otherwise. `total` is the number of rows the cleanup is expected to delete (a count
/// taken just before); the bar grows if more turn up meanwhile.
pub(crate) fn cleanup_bar(total: u64, format: Format) -> Option<indicatif::ProgressBar> {
    if !progress_on_terminal(format) {
        return None;
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{bar:30} {pos}/{len} rows  {msg}  {elapsed_precise}",
    ) {
        bar.set_style(style);
    }
    Some(bar)
}

/// Whether progress is drawn: human output to a terminal (stderr).
pub(crate) fn progress_on_terminal(format: Format) -> bool {
    use std::io::IsTerminal;
    format == Format::Human && std::io::stderr().is_terminal()
}

/// `completed JOB for SCOPE: N record(s) in M ms`, `skipped … (reason)`, `failed …` (with
/// `: error` when `with_error`).
fn status_line(report: &RunReport, with_error: bool) -> String {
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
            if let Some(error) = report.error.as_ref().filter(|_| with_error) {
                line.push_str(&format!(": {error}"));
            }
        }
    }
    line
}

/// One date of a backfill.
pub(crate) fn print_backfill_line(report: &RunReport) {
    outln!("{}", status_line(report, true));
}

/// `idem gate`'s spinner over the lines read, on a terminal only (stderr).
pub(crate) fn gate_bar() -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {pos} lines ({per_sec}): {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    Some(bar)
}

/// `idem gate`'s summary, on stderr (stdout carries the records).
pub(crate) fn print_gate_summary(line: &str) {
    errln!("{line}");
}
