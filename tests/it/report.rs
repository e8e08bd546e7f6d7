//! `idem report` over synthetic ledgers written through the public Store API: figures and
//! verdicts on SQLite (always) and Postgres (`IDEM_TEST_POSTGRES_URL`), the edge cases
//! (empty ledger, one run, only failures, no scheduler runs) and the command line.

use std::sync::Arc;

use chrono::{DateTime, Duration, NaiveDate, TimeZone, Utc};
use idem::report::{self, OutputFormat, ProcessorReport, Report, ReportOptions, Source, Verdict};
use idem::store::conformance::{key_record, run_record};
use idem::store::{DynStore, Finish};
use idem::{KeyKind, KeyRecord, Mode, RunStatus, SkipReason, Trigger};

use crate::common;

/// The end of every synthetic period: midnight UTC, so day k of the history starts at
/// `UNTIL - k days`.
fn until() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap()
}

fn suffix() -> String {
    idem::new_run_id().replace('-', "")[..8].to_string()
}

/// One ledger row to write.
struct Run {
    processor: String,
    day: i64,
    start: Duration,
    seconds: f64,
    trigger: Trigger,
    mode: Mode,
    status: RunStatus,
    records: Option<i64>,
    skip: Option<SkipReason>,
    would_skip: Option<SkipReason>,
    content_key: bool,
}

impl Run {
    /// A completed scheduled run in enforce mode of `processor` for the scope of day `day`
    /// (days before `until()`), starting `start` into that day.
    fn new(processor: &str, day: i64, start: Duration, seconds: f64, records: i64) -> Run {
        Run {
            processor: processor.to_string(),
            day,
            start,
            seconds,
            trigger: Trigger::Scheduler,
            mode: Mode::Enforce,
            status: RunStatus::Completed,
            records: Some(records),
            skip: None,
            would_skip: None,
            content_key: false,
        }
    }
}

async fn write(store: &DynStore, run: Run) {
    let day_start = until() - Duration::days(run.day);
    let started = day_start + run.start;
    let finished = started + Duration::milliseconds((run.seconds * 1000.0) as i64);
    let scope_date: NaiveDate = day_start.date_naive();
    let scope = scope_date.format("%Y-%m-%d").to_string();
    let run_id = idem::new_run_id();
    let mut record = run_record(&run.processor, &scope, &run_id, run.status, finished);
    record.scope_date = scope_date;
    record.trigger = run.trigger;
    record.mode = run.mode;
    record.started_at = started;
    record.finished_at = finished;
    record.duration_ms = (run.seconds * 1000.0) as i64;
    record.records_processed = run.records;
    record.skip_reason = run.skip;
    record.would_skip_reason = run.would_skip;
    let mut keys = Vec::new();
    if run.status == RunStatus::Completed {
        let mut scope_key = key_record(
            &format!("scope-{}-{scope}-{run_id}", run.processor),
            KeyKind::Scope,
            &run.processor,
            &scope,
            &run_id,
            finished,
        );
        scope_key.scope_date = scope_date;
        keys.push(scope_key);
        if run.content_key {
            let mut content: KeyRecord = key_record(
                &format!("content-{}-{run_id}", run.processor),
                KeyKind::Content,
                &run.processor,
                &scope,
                &run_id,
                finished,
            );
            content.scope_date = scope_date;
            keys.push(content);
        }
    }
    store
        .finish(&Finish {
            run: record,
            keys,
            lease: None,
        })
        .await
        .expect("record a synthetic run");
}

fn hours(h: f64) -> Duration {
    Duration::milliseconds((h * 3_600_000.0) as i64)
}

/// The synthetic history; processor names end in `_{tag}` so several histories can share
/// a database.
async fn seed(store: &DynStore, tag: &str) {
    // needs: twelve scheduled runs a day on the day's scope, two hours apart, each 90 s
    // and processing nothing (the upstream table changes rarely).
    for day in 1..=7 {
        for i in 0..12 {
            let run = Run::new(
                &format!("needs_{tag}"),
                day,
                hours(1.0 + 2.0 * i as f64),
                90.0,
                0,
            );
            write(store, run).await;
        }
    }
    // steady: one scheduled run a day, records change every day.
    for day in 1..=7 {
        let run = Run::new(
            &format!("steady_{tag}"),
            day,
            hours(2.0),
            120.0,
            1000 + 10 * day,
        );
        write(store, run).await;
    }
    // borderline: one slow scheduled run a day, six of seven process nothing.
    for day in 1..=7 {
        let records = if day <= 6 { 0 } else { 40 };
        let run = Run::new(
            &format!("borderline_{tag}"),
            day,
            hours(3.0),
            600.0,
            records,
        );
        write(store, run).await;
    }
    // shadow: three runs a day in shadow mode; the content hash would have skipped the
    // second and third; on day 1 a fourth run 25 minutes after the third would have been
    // skipped by the time window.
    for day in 1..=7 {
        for (h, would) in [
            (6.0, None),
            (12.0, Some(SkipReason::DuplicateContentHash)),
            (18.0, Some(SkipReason::DuplicateContentHash)),
        ] {
            let mut run = Run::new(&format!("shadow_{tag}"), day, hours(h), 300.0, 200);
            run.mode = Mode::Shadow;
            run.would_skip = would;
            run.content_key = true;
            write(store, run).await;
        }
    }
    let mut late = Run::new(&format!("shadow_{tag}"), 1, hours(18.5), 300.0, 200);
    late.mode = Mode::Shadow;
    late.would_skip = Some(SkipReason::TimeWindow);
    late.content_key = true;
    write(store, late).await;
    // backfilled (issue 21.6): six quick scheduled runs that process nothing, and five
    // 3-hour backfills. Seed 002's Q2 counts scheduled runs only: 6 x 10 s = 1 minute
    // wasted, not 6 x the average of every completed run (491 minutes).
    for day in 1..=6 {
        write(
            store,
            Run::new(&format!("backfilled_{tag}"), day, hours(1.0), 10.0, 0),
        )
        .await;
    }
    for day in 8..=12 {
        let mut run = Run::new(
            &format!("backfilled_{tag}"),
            7,
            hours(2.0 + day as f64),
            10_800.0,
            5000,
        );
        run.trigger = Trigger::Backfill;
        write(store, run).await;
    }
    // few: five scheduled zero-record runs of an hour: at most 5, so none count (the
    // seed's HAVING zero_change_runs > 5).
    for day in 1..=5 {
        write(
            store,
            Run::new(&format!("few_{tag}"), day, hours(1.0), 3600.0, 0),
        )
        .await;
    }
    // hashed: content hash on for 30 days, one run a day with new content: it never
    // prevents anything.
    for day in 1..=30 {
        let mut run = Run::new(&format!("hashed_{tag}"), day, hours(4.0), 45.0, 500 + day);
        run.content_key = true;
        write(store, run).await;
    }
    // kept: content hash on; a daily run, and a second invocation 12 h later that the
    // content hash skips.
    for day in 1..=7 {
        let mut run = Run::new(&format!("kept_{tag}"), day, hours(5.0), 60.0, 300);
        run.content_key = true;
        write(store, run).await;
        let mut skipped = Run::new(&format!("kept_{tag}"), day, hours(17.0), 0.02, 0);
        skipped.status = RunStatus::Skipped;
        skipped.records = None;
        skipped.skip = Some(SkipReason::DuplicateContentHash);
        write(store, skipped).await;
    }
}

fn options(days: u32) -> ReportOptions {
    ReportOptions {
        until: until(),
        ..ReportOptions::last_days(days)
    }
}

fn find<'a>(report: &'a Report, job: &str) -> &'a ProcessorReport {
    report
        .processors
        .iter()
        .find(|p| p.job == job)
        .unwrap_or_else(|| panic!("no processor {job} in the report: {report:#?}"))
}

fn close(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() < 0.011,
        "expected {expected}, got {actual}"
    );
}

/// Figures and verdicts of the synthetic history, on any store.
async fn check_history(url: &str, store: &DynStore) {
    let tag = suffix();
    seed(store, &tag).await;
    let week = report::run(url, &options(7)).await.expect("report");
    assert_eq!(week.period.days, 7);
    assert_eq!(week.period.since, until() - Duration::days(7));

    let needs = find(&week, &format!("needs_{tag}"));
    assert_eq!(needs.runs.total_invocations, 84);
    assert_eq!(needs.runs.completed_runs, 84);
    assert_eq!(needs.duplicates.duplicate_runs, 77, "11 repeats a day");
    assert_eq!(needs.duplicates.identical_data_runs, 77);
    close(needs.duplicates.avg_hours_between_runs.unwrap(), 1.975);
    assert_eq!(needs.runs.scheduled_runs, 84);
    assert_eq!(needs.wasted.zero_change_runs, 84);
    close(needs.wasted.minutes_wasted, 126.0);
    close(needs.wasted.pct_wasted, 100.0);
    assert_eq!(needs.savings.dates_with_duplicates, 7);
    assert_eq!(needs.savings.potential_prevented_runs, 77);
    assert_eq!(needs.savings.high_confidence_prevents, 77);
    assert_eq!(needs.verdict, Verdict::Enable, "{:#?}", needs.reasons);
    assert_eq!(needs.source, Source::Estimated);
    assert_eq!(needs.content_hash, "off");
    assert!(
        needs
            .reasons
            .iter()
            .any(|r| r.contains("126 minutes wasted")),
        "{:#?}",
        needs.reasons
    );

    let steady = find(&week, &format!("steady_{tag}"));
    assert_eq!(steady.duplicates.duplicate_runs, 0);
    assert_eq!(steady.wasted.zero_change_runs, 0);
    close(steady.wasted.minutes_wasted, 0.0);
    assert_eq!(steady.savings.potential_prevented_runs, 0);
    close(steady.runs.avg_completed_seconds.unwrap(), 120.0);
    assert_eq!(steady.verdict, Verdict::NotNeeded, "{:#?}", steady.reasons);

    let border = find(&week, &format!("borderline_{tag}"));
    assert_eq!(border.wasted.zero_change_runs, 6);
    close(border.wasted.minutes_wasted, 60.0);

    // Seed 002's Q2 on the same rows: scheduled runs' own durations, and the threshold.
    let backfilled = find(&week, &format!("backfilled_{tag}"));
    assert_eq!(backfilled.runs.completed_runs, 11);
    assert_eq!(backfilled.runs.scheduled_runs, 6);
    assert_eq!(backfilled.wasted.zero_change_runs, 6);
    close(backfilled.wasted.minutes_wasted, 1.0);
    close(backfilled.wasted.avg_scheduled_seconds.unwrap(), 10.0);
    assert_ne!(
        backfilled.verdict,
        Verdict::Enable,
        "{:#?}",
        backfilled.reasons
    );
    let few = find(&week, &format!("few_{tag}"));
    assert_eq!(few.wasted.zero_change_runs, 5);
    close(few.wasted.minutes_wasted, 0.0);
    assert!(
        few.reasons
            .iter()
            .any(|r| r.contains("not counted, as in seed 002")),
        "{:#?}",
        few.reasons
    );
    assert_eq!(border.duplicates.duplicate_runs, 0);
    assert_eq!(border.verdict, Verdict::Consider, "{:#?}", border.reasons);

    let shadow = find(&week, &format!("shadow_{tag}"));
    assert_eq!(shadow.source, Source::Measured);
    assert_eq!(shadow.shadow.shadow_runs, 22);
    assert_eq!(shadow.shadow.content_hash_would_skip, 14);
    close(shadow.shadow.content_hash_minutes_saved, 70.0);
    let window = &shadow.shadow.would_skip["time_window"];
    assert_eq!(window.runs, 1);
    close(window.seconds, 300.0);
    assert_eq!(shadow.shadow.would_skip["duplicate_content_hash"].runs, 14);
    // The estimates alone would say not_needed (no zero-record runs, 15 repeats); the
    // measured 70 minutes make it worth a look.
    assert_eq!(shadow.duplicates.duplicate_runs, 14);
    assert_eq!(shadow.savings.high_confidence_prevents, 15);
    close(shadow.wasted.minutes_wasted, 0.0);
    assert_eq!(shadow.verdict, Verdict::Consider, "{:#?}", shadow.reasons);
    assert!(shadow
        .reasons
        .iter()
        .any(|r| r.contains("measured in shadow mode")));

    let kept = find(&week, &format!("kept_{tag}"));
    assert_eq!(kept.content_hash, "on");
    assert_eq!(kept.runs.total_invocations, 14);
    assert_eq!(kept.effectiveness.hash_prevented, 7);
    close(kept.effectiveness.hash_prevention_pct, 50.0);
    close(kept.effectiveness.hash_seconds_saved, 420.0);
    assert_eq!(kept.verdict, Verdict::Keep, "{:#?}", kept.reasons);

    let hashed = find(&week, &format!("hashed_{tag}"));
    assert_eq!(hashed.content_hash, "on");
    assert_eq!(hashed.storage.content_keys_in_period, 7);
    assert_eq!(hashed.storage.content_keys, 30);
    assert_eq!(hashed.effectiveness.hash_prevented, 0);
    assert_eq!(
        hashed.verdict,
        Verdict::NotEnoughData,
        "one week cannot say remove"
    );

    let month = report::run(url, &options(28)).await.expect("report");
    let hashed = find(&month, &format!("hashed_{tag}"));
    assert_eq!(hashed.runs.total_invocations, 28);
    assert_eq!(hashed.storage.content_keys_in_period, 28);
    assert_eq!(hashed.verdict, Verdict::Remove, "{:#?}", hashed.reasons);
    // Scaled thresholds: 4 weeks of the needs history is only 84 runs against 4x50.
    close(month.thresholds.duplicate_runs, 200.0);
    assert_eq!(
        find(&month, &format!("needs_{tag}")).verdict,
        Verdict::Consider
    );

    // --job narrows the report to one processor.
    let one = report::run(
        url,
        &ReportOptions {
            job: Some(format!("steady_{tag}")),
            ..options(7)
        },
    )
    .await
    .expect("report");
    assert_eq!(one.processors.len(), 1);
    assert_eq!(one.processors[0].verdict, Verdict::NotNeeded);

    // Every rendering carries the verdicts.
    for format in [
        OutputFormat::Human,
        OutputFormat::Json,
        OutputFormat::Markdown,
    ] {
        let text = report::render(&week, format);
        assert!(text.contains(&format!("needs_{tag}")), "{text}");
        assert!(text.contains("not_needed"), "{text}");
    }
}

fn sqlite() -> (tempdir::Dir, String) {
    let dir = tempdir::Dir::new();
    let url = format!("sqlite://{}", dir.0.join("ledger.db").display());
    (dir, url)
}

mod tempdir {
    /// A temp folder removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Self {
            let dir = std::env::temp_dir().join(format!("idem-report-{}", idem::new_run_id()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            Dir(dir)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

async fn open(url: &str) -> Arc<DynStore> {
    idem::store::open(url).await.expect("open the store")
}

#[tokio::test]
async fn sqlite_history_figures_and_verdicts() {
    let (_dir, url) = sqlite();
    let store = open(&url).await;
    check_history(&url, &*store).await;
}

#[tokio::test]
async fn postgres_history_figures_and_verdicts() {
    let Some(url) = common::service_url(
        "IDEM_TEST_POSTGRES_URL",
        "report::postgres_history_figures_and_verdicts",
        common::POSTGRES_HOW,
    ) else {
        return;
    };
    let store = open(&url).await;
    check_history(&url, &*store).await;
}

#[tokio::test]
async fn empty_ledger_has_no_processors_and_renders() {
    let (_dir, url) = sqlite();
    let report = report::run(&url, &options(7)).await.expect("report");
    assert!(report.processors.is_empty());
    assert_eq!(
        report.storage.table_bytes, None,
        "only BigQuery has a tables API"
    );
    assert_eq!(report.storage.total_keys, 0);
    assert_eq!(report.storage.oldest_key, None);
    let human = report::render(&report, OutputFormat::Human);
    assert!(human.contains("no runs recorded in the period"), "{human}");
    let json: serde_json::Value =
        serde_json::from_str(&report::render(&report, OutputFormat::Json)).unwrap();
    assert_eq!(json["processors"], serde_json::json!([]));
    assert_eq!(json["period"]["days"], 7);
}

#[tokio::test]
async fn single_run_only_failures_and_no_scheduler_runs() {
    let (_dir, url) = sqlite();
    let store = open(&url).await;
    write(&*store, Run::new("single", 1, hours(1.0), 30.0, 10)).await;
    // `idem purge` records itself in the ledger: not an invocation of the job.
    let mut purge = Run::new("single", 1, hours(2.0), 0.01, 0);
    purge.status = RunStatus::Skipped;
    purge.records = None;
    purge.mode = Mode::Off;
    purge.trigger = Trigger::Manual;
    purge.skip = Some(SkipReason::Custom("purged".into()));
    write(&*store, purge).await;
    for day in 1..=3 {
        let mut failed = Run::new("failing", day, hours(1.0), 12.0, 0);
        failed.status = RunStatus::Failed;
        failed.records = None;
        write(&*store, failed).await;
    }
    for day in 1..=7 {
        let mut manual = Run::new("manual", day, hours(9.0), 30.0, 0);
        manual.trigger = Trigger::Manual;
        write(&*store, manual).await;
    }
    let report = report::run(&url, &options(7)).await.expect("report");

    let single = find(&report, "single");
    assert_eq!(single.verdict, Verdict::NotEnoughData);
    assert_eq!(single.runs.total_invocations, 1, "the purge is not counted");
    assert_eq!(single.runs.skipped_runs, 0);
    assert_eq!(single.daily.iter().map(|d| d.skipped).sum::<i64>(), 0);
    assert!(
        single.reasons[0].contains("only 1 completed run"),
        "{:?}",
        single.reasons
    );

    let failing = find(&report, "failing");
    assert_eq!(failing.verdict, Verdict::NotEnoughData);
    assert_eq!(failing.runs.failed_runs, 3);
    assert_eq!(failing.runs.completed_runs, 0);
    assert_eq!(failing.runs.avg_completed_seconds, None);
    close(failing.effectiveness.hash_prevention_pct, 0.0);
    close(failing.wasted.minutes_wasted, 0.0);

    let manual = find(&report, "manual");
    assert_eq!(manual.runs.scheduled_runs, 0);
    close(manual.wasted.minutes_wasted, 0.0);
    close(manual.wasted.pct_wasted, 0.0);
    assert!(
        manual
            .reasons
            .iter()
            .any(|r| r.contains("no completed scheduled runs")),
        "{:?}",
        manual.reasons
    );
    assert_eq!(manual.verdict, Verdict::NotNeeded);

    // No NaN or infinity reaches the JSON (serde_json would write null for them).
    let json = report::render(&report, OutputFormat::Json);
    assert!(!json.contains("NaN") && !json.contains("inf"), "{json}");
}

#[test]
fn every_query_exists_in_every_dialect_and_binds_its_values() {
    use report::Dialect::{BigQuery, Postgres, Sqlite};
    for dialect in [Sqlite, Postgres, BigQuery] {
        for name in report::QUERY_NAMES {
            let sql = report::sql(name, dialect).unwrap();
            assert!(sql.contains("processing_"), "{name}");
            let extra = if name == "savings" {
                "@max_stddev"
            } else {
                "@window_seconds"
            };
            let (job, extra) = match dialect {
                Sqlite => ("?3", "?4"),
                Postgres => ("$3", "$4"),
                BigQuery => ("@job", extra),
            };
            assert!(sql.contains(job), "{name} binds the processor");
            if name == "duplicates" || name == "savings" {
                assert!(
                    sql.contains(extra),
                    "{name} binds the window or the deviation"
                );
            }
        }
    }
    let err = report::sql("nope", report::Dialect::Sqlite).unwrap_err();
    assert!(
        err.to_string().contains("unknown report query \"nope\""),
        "{err}"
    );
}

#[tokio::test]
async fn cli_report_json_markdown_output_file_and_sql() {
    let sandbox = common::Sandbox::new("idem-report-cli");
    let store = open(&sandbox.store).await;
    seed(&*store, "cli").await;
    let until = "2026-03-01T00:00:00Z";

    let (code, doc, stderr) = sandbox.json(&["report", "--until", until]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(doc["period"]["days"], 7);
    assert_eq!(doc["period"]["until"], "2026-03-01T00:00:00Z");
    let jobs: Vec<&str> = doc["processors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["job"].as_str().unwrap())
        .collect();
    assert_eq!(
        jobs,
        [
            "backfilled_cli",
            "borderline_cli",
            "few_cli",
            "hashed_cli",
            "kept_cli",
            "needs_cli",
            "shadow_cli",
            "steady_cli"
        ]
    );
    let needs = &doc["processors"][5];
    assert_eq!(needs["verdict"], "enable");
    assert_eq!(needs["source"], "estimated");
    assert_eq!(needs["duplicates"]["duplicate_runs"], 77);
    assert_eq!(needs["wasted"]["minutes_wasted"], 126.0);
    assert_eq!(needs["savings"]["high_confidence_prevents"], 77);
    assert!(needs["reasons"].as_array().unwrap().len() >= 3);
    assert_eq!(doc["processors"][6]["source"], "measured");
    assert_eq!(doc["processors"][6]["content_hash"], "shadow");
    assert_eq!(
        doc["processors"][6]["shadow"]["content_hash_would_skip"],
        14
    );

    // Thresholds from flags: with 200 minutes needed a week, needs loses its Q2 signal.
    let (code, doc, _) = sandbox.json(&[
        "report",
        "--until",
        until,
        "--job",
        "needs_cli",
        "--minutes-wasted",
        "200",
    ]);
    assert_eq!(code, 0);
    assert_eq!(doc["processors"].as_array().unwrap().len(), 1);
    assert_eq!(doc["processors"][0]["verdict"], "consider");

    // Markdown into a file.
    let file = sandbox.dir.join("report.md");
    let out = sandbox.idem(&[
        "report",
        "--until",
        until,
        "--format",
        "markdown",
        "--output",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty());
    let md = std::fs::read_to_string(&file).unwrap();
    assert!(md.contains("| needs_cli | `enable` |"), "{md}");
    assert!(md.contains("## hashed_cli: `not_enough_data`"), "{md}");

    // HTML: one self-contained page (nothing fetched), a table row and a chart per job.
    let page = sandbox.dir.join("report.html");
    let out = sandbox.idem(&[
        "report",
        "--until",
        until,
        "--format",
        "html",
        "--output",
        page.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert_eq!(html.matches("<svg").count(), 8, "one chart per job");
    assert!(
        html.contains("needs_cli</a></td><td><span class=\"badge\""),
        "{html}"
    );
    assert!(
        html.contains("2026-02-28: 12 completed"),
        "a bar per day with its count"
    );
    assert!(html.contains("2026-02-28: 3 would have been skipped (shadow)"));
    for fetch in ["<script", "<link", "src=", "url(", "@import"] {
        assert!(!html.contains(fetch), "the page fetches nothing: {fetch}");
    }
    assert_eq!(
        html.matches("http").count(),
        html.matches("http://www.w3.org/2000/svg").count()
    );
    if let Ok(keep) = std::env::var("IDEM_REPORT_HTML_OUT") {
        std::fs::copy(&page, keep).expect("copy the HTML report");
    }

    // The SQL, ready to paste, with this invocation's values as parameters.
    let out = sandbox.idem(&[
        "report", "--sql", "wasted", "--until", until, "--days", "28",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let sql = String::from_utf8(out.stdout).unwrap();
    assert!(sql.contains(".parameter set ?1 1769904000000000"), "{sql}");
    assert!(sql.contains(".parameter set ?3 NULL"), "{sql}");
    assert!(sql.contains("trigger_source = 'scheduler'"), "{sql}");
    let out = sandbox.idem(&["report", "--sql", "duplicates", "--dialect", "postgres"]);
    let sql = String::from_utf8(out.stdout).unwrap();
    assert!(
        sql.contains("PREPARE idem_report_duplicates (timestamptz, timestamptz, text, float8) AS"),
        "{sql}"
    );
    assert!(sql.contains(", NULL, 3600.0);"), "{sql}");
    let out = sandbox.idem(&["report", "--sql", "savings", "--dialect", "bigquery"]);
    let sql = String::from_utf8(out.stdout).unwrap();
    assert!(sql.contains("@job = NULL, @max_stddev = 1.0"), "{sql}");
    assert!(sql.contains("STDDEV_SAMP(records_processed)"), "{sql}");

    // Bad input: exit 2 with a sentence naming it.
    for (args, says) in [
        (
            vec!["report", "--sql", "nope"],
            "unknown report query \"nope\"",
        ),
        (vec!["report", "--days", "0"], "--days"),
        (vec!["report", "--minutes-wasted", "-3"], "--minutes-wasted"),
        (vec!["report", "--until", "yesterday"], "--until"),
        (vec!["runs", "--format", "markdown"], "for idem report only"),
    ] {
        let out = sandbox.idem(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn cli_report_thresholds_from_a_config_file() {
    let sandbox = common::Sandbox::new("idem-report-config");
    let store = open(&sandbox.store).await;
    seed(&*store, "cfg").await;
    let until = "2026-03-01T00:00:00Z";
    let report = |extra: &[&str]| {
        let mut args = vec!["report", "--until", until, "--job", "needs_cfg"];
        args.extend_from_slice(extra);
        let (code, doc, stderr) = sandbox.json(&args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
        doc
    };
    let write = |name: &str, text: &str| std::fs::write(sandbox.dir.join(name), text).unwrap();

    // Without a file: the defaults, and no config file named.
    let doc = report(&[]);
    assert_eq!(doc["processors"][0]["verdict"], "enable");
    assert_eq!(doc["thresholds"]["config_file"], serde_json::Value::Null);
    assert_eq!(doc["thresholds"]["per_week"]["minutes_wasted"], 30.0);

    // ./idem.toml is read when it exists: its values are used and stated in the report.
    write(
        "idem.toml",
        "[report]\nminutes_wasted = 200\nidentical_runs = 10\nmax_stddev = 1.5\n",
    );
    let doc = report(&[]);
    assert_eq!(doc["processors"][0]["verdict"], "consider");
    assert_eq!(doc["thresholds"]["config_file"], "idem.toml");
    assert_eq!(doc["thresholds"]["per_week"]["minutes_wasted"], 200.0);
    assert_eq!(doc["thresholds"]["minutes_wasted"], 200.0);
    assert_eq!(doc["thresholds"]["max_stddev"], 1.5);
    // A flag wins over the file.
    let doc = report(&["--minutes-wasted", "30"]);
    assert_eq!(doc["processors"][0]["verdict"], "enable");
    assert_eq!(doc["thresholds"]["minutes_wasted"], 30.0);

    // --config FILE instead of ./idem.toml; days and window too, and the JSON's names.
    write(
        "team.toml",
        "[report]\ndays = 14\nwindow = \"2h\"\nhigh_confidence_prevents = 1000\n",
    );
    let doc = report(&["--config", "team.toml"]);
    assert_eq!(doc["period"]["days"], 14);
    assert_eq!(doc["thresholds"]["window_seconds"], 7200.0);
    assert_eq!(
        doc["thresholds"]["per_week"]["high_confidence_prevents"],
        1000.0
    );
    assert_eq!(doc["thresholds"]["per_week"]["minutes_wasted"], 30.0);
    assert_eq!(doc["thresholds"]["config_file"], "team.toml");
    let doc = report(&["--config", "team.toml", "--days", "7"]);
    assert_eq!(doc["period"]["days"], 7);

    // Unknown keys, bad values and a missing file: exit 2 naming the file and the key.
    for (name, text, says) in [
        (
            "unknown.toml",
            "[report]\nminutes = 3\n",
            "unknown field `minutes`",
        ),
        (
            "negative.toml",
            "[report]\nminutes_wasted = -3\n",
            "[report] minutes_wasted: bad value -3",
        ),
        (
            "text.toml",
            "[report]\npreventable_runs = \"many\"\n",
            "preventable_runs",
        ),
        (
            "days.toml",
            "[report]\ndays = 0\n",
            "[report] days: bad value 0",
        ),
        (
            "window.toml",
            "[report]\nwindow = \"soon\"\n",
            "[report] window",
        ),
        (
            "table.toml",
            "[reports]\ndays = 7\n",
            "unknown field `reports`",
        ),
    ] {
        write(name, text);
        let out = sandbox.idem(&["report", "--until", until, "--config", name]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains(says), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("config file {name}")),
            "{name}: {stderr}"
        );
    }
    let out = sandbox.idem(&["report", "--config", "absent.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("absent.toml"));
    // A bad ./idem.toml fails too (it is read whenever it exists).
    write("idem.toml", "[report]\nnope = 1\n");
    let out = sandbox.idem(&["report", "--until", until]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("config file idem.toml"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bigquery_history_figures_and_verdicts() {
    let Some(url) = common::service_url(
        "IDEM_TEST_BIGQUERY_URL",
        "report::bigquery_history_figures_and_verdicts",
        common::BIGQUERY_HOW,
    ) else {
        return;
    };
    let store = open(&url).await;
    check_history(&url, &*store).await;
    // The tables API's size of processing_keys, next to the estimate.
    let report = report::run(&url, &options(7)).await.expect("report");
    // (The emulator answers numBytes 0; real BigQuery the table's size.)
    assert!(report.storage.table_bytes.is_some(), "{:?}", report.storage);
    assert!(report.storage.estimated_bytes > 0);
}

/// Issue 21.11: `--job` with a name nothing knows is a typo (exit 2, the known jobs named);
/// an `--until` whose period would start before year 1 is refused; the Markdown report
/// escapes job names so they cannot break its table.
#[tokio::test]
async fn cli_report_refuses_an_unknown_job_and_a_period_before_year_one_and_escapes_markdown() {
    let sandbox = common::Sandbox::new("idem-report-edges");
    let store = open(&sandbox.store).await;
    let odd = "a|b*c _<x>";
    write(&*store, Run::new(odd, 1, hours(1.0), 10.0, 0)).await;
    write(&*store, Run::new("daily_sales", 1, hours(1.0), 10.0, 5)).await;
    let until = "2026-03-01T00:00:00Z";
    let out = sandbox.idem(&["report", "--until", until, "--job", "daily_sale"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--job \"daily_sale\": no such job") && err.contains("daily_sales"),
        "{err}"
    );
    // A known job with no runs in the period is not an error.
    let out = sandbox.idem(&[
        "report",
        "--until",
        "2020-01-01T00:00:00Z",
        "--job",
        "daily_sales",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = sandbox.idem(&["report", "--until", "0001-01-03T00:00:00Z"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("would start before 0001-01-01"));
    let out = sandbox.idem(&["report", "--until", until, "--format", "markdown"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(md.contains("| a\\|b\\*c \\_&lt;x&gt; |"), "{md}");
    assert!(!md.contains(odd), "{md}");
}
