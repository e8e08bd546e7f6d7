//! Schedules as a user meets them: `idem schedule`, relative `--date`s, `--scheduled-at`,
//! the job fields `schedule`/`timezone`/`date`, and the crontab and Cloud Scheduler exports
//! (golden files under tests/golden/; `IDEM_UPDATE_GOLDEN=1` rewrites them).

use std::process::{Command, Output, Stdio};

use serde_json::Value;

use crate::common;

use common::{export, golden, Sandbox, IDEM};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A job whose `process` appends the scope to `out` in `jobs/wh.db`.
fn recording_job(name: &str, extra: &str) -> String {
    format!(
        r#"
name = "{name}"
processor = "sql"
{extra}
[sql]
warehouse = "sqlite://wh.db"
setup = "CREATE TABLE IF NOT EXISTS out (job TEXT, day TEXT)"
process = "INSERT INTO out VALUES ('{name}', @scope)"
"#
    )
}

fn runs(s: &Sandbox) -> Vec<Value> {
    let (code, v, err) = s.json(&["runs"]);
    assert_eq!(code, 0, "{err}");
    v.as_array().cloned().unwrap_or_default()
}

#[test]
fn schedule_lists_fire_times_in_the_jobs_zone_and_utc_across_both_dst_changes() {
    let s = Sandbox::new("idem-sched-list");
    s.write_job(
        "cleanup",
        &recording_job(
            "cleanup",
            "schedule = \"0 2 * * 0\"\ntimezone = \"America/Los_Angeles\"\ndate = \"yesterday\"",
        ),
    );
    s.write_job("manual", &recording_job("manual", ""));
    let (code, v, err) = s.json(&["schedule", "--after", "2026-03-01T12:00:00Z", "--next", "2"]);
    assert_eq!(code, 0, "{err}");
    let plans = v.as_array().unwrap();
    assert_eq!(plans.len(), 1, "only scheduled jobs are listed: {v}");
    assert_eq!(plans[0]["job"], "cleanup");
    assert_eq!(plans[0]["timezone"], "America/Los_Angeles");
    let fires: Vec<(&str, &str, &str)> = plans[0]["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["local"].as_str().unwrap(),
                f["utc"].as_str().unwrap(),
                f["date"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        fires,
        [
            // 02:00 does not exist on 8 March: the first instant after the gap.
            (
                "2026-03-08T03:00:00-07:00",
                "2026-03-08T10:00:00Z",
                "2026-03-07"
            ),
            (
                "2026-03-15T02:00:00-07:00",
                "2026-03-15T09:00:00Z",
                "2026-03-14"
            ),
        ]
    );
    let (code, v, err) = s.json(&[
        "schedule",
        "cleanup",
        "--after",
        "2026-10-31T12:00:00Z",
        "--next",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");
    let utc: Vec<&str> = v[0]["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["utc"].as_str().unwrap())
        .collect();
    // 1 November: 02:00 PST once, after the repeated 01:00 hour.
    assert_eq!(utc, ["2026-11-01T10:00:00Z", "2026-11-08T10:00:00Z"]);

    let out = s.idem(&["schedule", "--after", "2026-03-01T12:00:00Z", "--next", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "cleanup  schedule \"0 2 * * 0\"  timezone America/Los_Angeles  date yesterday\n  \
         2026-03-08 03:00:00 -07:00 PDT = 2026-03-08 10:00:00 UTC  date 2026-03-07\n"
    );

    let out = s.idem(&["schedule", "manual"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("job manual has no schedule"),
        "{}",
        stderr(&out)
    );
    let out = s.idem(&["schedule", "--after", "yesterday"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--after \"yesterday\""),
        "{}",
        stderr(&out)
    );
}

#[test]
fn sunday_is_0_or_7_and_bad_schedule_or_timezone_fails_at_load_naming_the_field() {
    let s = Sandbox::new("idem-sched-load");
    s.write_job("sun0", &recording_job("sun0", "schedule = \"0 6 * * 0\""));
    s.write_job("sun7", &recording_job("sun7", "schedule = \"0 6 * * 7\""));
    s.write_job("mon", &recording_job("mon", "schedule = \"0 6 * * 1\""));
    // 2026-01-01 is a Thursday.
    let (code, v, err) = s.json(&["schedule", "--after", "2026-01-01T00:00:00Z", "--next", "1"]);
    assert_eq!(code, 0, "{err}");
    let first = |job: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|p| p["job"] == job)
            .map(|p| p["next"][0]["utc"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(first("sun0"), "2026-01-04T06:00:00Z");
    assert_eq!(first("sun7"), "2026-01-04T06:00:00Z");
    assert_eq!(first("mon"), "2026-01-05T06:00:00Z");

    for (file, extra, expect) in [
        (
            "badtz",
            "timezone = \"Mars/Olympus\"",
            "timezone: unknown time zone \"Mars/Olympus\"",
        ),
        (
            "badcron",
            "schedule = \"0 6 * * 8\"",
            "schedule: invalid cron expression \"0 6 * * 8\"",
        ),
        (
            "baddate",
            "date = \"tomorrow\"",
            "date: bad date \"tomorrow\": expected YYYY-MM-DD",
        ),
    ] {
        let bad = Sandbox::new("idem-sched-bad");
        bad.write_job(file, &recording_job(file, extra));
        let out = bad.idem(&["jobs"]);
        assert_eq!(out.status.code(), Some(2), "{file}");
        let e = stderr(&out);
        assert!(
            e.contains(&format!("{file}.toml")) && e.contains(expect),
            "{file}: {e}"
        );
    }
}

#[test]
fn relative_dates_and_the_jobs_default_date_are_the_jobs_zones_dates() {
    let s = Sandbox::new("idem-sched-dates");
    // UTC+14: its date is ahead of UTC's most of the day.
    let job = s.write_job(
        "kiri",
        &recording_job(
            "kiri",
            "timezone = \"Pacific/Kiritimati\"\ndate = \"yesterday\"",
        ),
    );
    let tz: chrono_tz::Tz = "Pacific/Kiritimati".parse().unwrap();
    let expect = |expr: &str| {
        let now = chrono::Utc::now();
        idem::schedule::run_date(Some(expr), None, None, tz, now)
            .unwrap()
            .to_string()
    };
    let job = job.to_str().unwrap();
    for (args, expr) in [
        (vec!["run", job], "yesterday"),
        (vec!["run", job, "--date", "today"], "today"),
        (vec!["run", job, "--date", "today-3"], "today-3"),
    ] {
        let before = expect(expr);
        let (code, v, err) = s.json(&args);
        let after = expect(expr);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert_eq!(v["status"], "completed", "{v}");
        let scope = v["scope"].as_str().unwrap();
        assert!(
            scope == before || scope == after,
            "{args:?}: {scope} vs {before}"
        );
    }
    // The scheduled instant decides, not the clock: 06:30 UTC on 9 March is 20:30 on
    // 9 March in Kiritimati, so `yesterday` is 8 March.
    let (code, v, err) = s.json(&["run", job, "--scheduled-at", "2026-03-09T06:30:00Z"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["scope"], "2026-03-08");
    let (code, v, err) = s.json(&[
        "run",
        job,
        "--date",
        "today",
        "--scheduled-at",
        "2026-03-09T10:30:00Z",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["scope"], "2026-03-10");
}

#[test]
fn a_missing_or_bad_date_exits_2_naming_the_flag_and_runs_nothing() {
    let s = Sandbox::new("idem-sched-baddate");
    let job = s.write_job("plain", &recording_job("plain", ""));
    let job = job.to_str().unwrap();
    for (args, expect) in [
        (vec!["run", job], "pass --date"),
        (vec!["explain", job], "pass --date"),
        (
            vec!["run", job, "--date", "tomorrow"],
            "--date: bad date \"tomorrow\"",
        ),
        (
            vec!["run", job, "--date", "today-x"],
            "--date: bad date \"today-x\"",
        ),
        (
            vec!["run", job, "--date", "2026-02-30"],
            "--date: bad date \"2026-02-30\"",
        ),
        (
            vec!["run", job, "--date=-5000-01-01"],
            "out of range: dates lie between 0001-01-01 and 9999-12-31",
        ),
        (vec!["run", job, "--date", "10000-01-01"], "out of range"),
        (vec!["run", job, "--date", "0000-12-31"], "out of range"),
        (vec!["run", job, "--date", "today-9999999"], "out of range"),
        (
            vec!["run", job, "--scheduled-at", "2026-03-09"],
            "--scheduled-at \"2026-03-09\"",
        ),
    ] {
        let out = s.idem(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(expect), "{args:?}: {}", stderr(&out));
    }
    assert!(runs(&s).is_empty(), "nothing is recorded");
    assert!(
        !s.dir.join("jobs/wh.db").exists(),
        "no SQL ran against the warehouse"
    );
}

fn golden_jobs(s: &Sandbox) {
    s.write_job(
        "cleanup",
        &recording_job(
            "weekly_cleanup",
            "schedule = \"0 2 * * 0\"\ntimezone = \"America/Los_Angeles\"\ndate = \"yesterday\"",
        ),
    );
    s.write_job(
        "sales",
        &recording_job(
            "daily_sales",
            "schedule = \"@daily\"\ndate = \"today-1\"\n[guards]\nlease = \"10m\"",
        ),
    );
    s.write_job(
        "events",
        &recording_job(
            "hourly_events",
            "schedule = \"0 5 * * * MON-FRI\"\ntimezone = \"Europe/Paris\"\n[guards]\nlease = \"2h\"",
        ),
    );
    s.write_job("adhoc", &recording_job("adhoc", ""));
}

#[test]
fn crontab_export_equals_the_golden_file() {
    let s = Sandbox::new("idem-sched-golden-cron");
    golden_jobs(&s);
    // A percent-encoded database name: cron would cut the line at a bare %. The password
    // is not printed (a crontab line is shown by `ps`): the header says where it goes.
    let out = export(
        &s.dir,
        "postgres://idem:p%40ss@db.internal/idem%5Fprod",
        &[
            "--crontab",
            "--workdir",
            "/srv/idem",
            "--idem-bin",
            "/usr/local/bin/idem",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    golden("crontab.txt", &stdout(&out));
    let only = export(
        &s.dir,
        "sqlite://idem.db",
        &["daily_sales", "--crontab", "--workdir", "/srv/idem"],
    );
    assert_eq!(only.status.code(), Some(0), "{}", stderr(&only));
    assert_eq!(
        stdout(&only).matches("CRON_TZ=").count(),
        1,
        "{}",
        stdout(&only)
    );
    // JSON callers get the same text, whole, in one document.
    let json = export(
        &s.dir,
        "sqlite://idem.db",
        &[
            "daily_sales",
            "--crontab",
            "--workdir",
            "/srv/idem",
            "--format",
            "json",
        ],
    );
    assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
    let v: serde_json::Value = serde_json::from_str(&stdout(&json)).expect("one JSON document");
    assert_eq!(v["export"], "crontab");
    assert_eq!(v["text"].as_str(), Some(stdout(&only).as_str()));
}

#[test]
fn cloud_scheduler_export_equals_the_golden_file() {
    let s = Sandbox::new("idem-sched-golden-gcp");
    golden_jobs(&s);
    let out = export(
        &s.dir,
        "postgres://idem@10.0.0.5/idem",
        &["--cloud-scheduler", "my-project/us-central1"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    golden("cloud-scheduler.sh", &stdout(&out));
}

#[test]
fn exports_refuse_what_their_target_cannot_do() {
    let s = Sandbox::new("idem-sched-refuse");
    s.write_job(
        "nolease",
        &recording_job(
            "nolease",
            "schedule = \"0 6 * * *\"\n[guards]\nlease = \"off\"",
        ),
    );
    s.write_job(
        "secs",
        &recording_job("secs", "schedule = \"*/10 * * * * *\""),
    );
    s.write_job(
        "migrate",
        &recording_job("migrate", "schedule = \"0 6 * * *\""),
    );
    for (args, store, expect) in [
        (
            vec!["migrate", "--cloud-scheduler", "p/r"],
            "postgres://h/db",
            "the script's own `idem migrate` step",
        ),
        (
            vec!["nolease", "--cloud-scheduler", "p/r"],
            "postgres://h/db",
            "has no lease",
        ),
        (
            vec!["secs", "--cloud-scheduler", "p/r"],
            "postgres://h/db",
            "uses seconds, years or extensions",
        ),
        (
            vec!["secs", "--crontab"],
            "sqlite://idem.db",
            "uses seconds, years or extensions",
        ),
        (
            vec!["nolease", "--cloud-scheduler", "p/r"],
            "sqlite://idem.db",
            "keeps no disk",
        ),
        (
            vec!["nolease", "--cloud-scheduler", "just-a-project"],
            "postgres://h/db",
            "expected PROJECT/REGION",
        ),
    ] {
        let out = export(&s.dir, store, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(expect), "{args:?}: {}", stderr(&out));
        assert!(
            stdout(&out).is_empty(),
            "{args:?}: nothing printed on error"
        );
    }
}

/// The crontab line runs as written under `sh`: cron removes the backslash of `\%` and
/// hands the rest to `sh -c`. The folder's name has a `%`, so the escape is exercised.
#[test]
fn an_exported_crontab_line_runs_under_sh() {
    let s = Sandbox::new("idem-sched%cron");
    s.write_job(
        "kiri",
        &recording_job(
            "kiri",
            "schedule = \"0 6 * * *\"\ntimezone = \"Pacific/Kiritimati\"\ndate = \"yesterday\"",
        ),
    );
    let logs = s.dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let out = export(
        &s.dir,
        "sqlite://idem.db",
        &[
            "--crontab",
            "--idem-bin",
            IDEM,
            "--log-dir",
            logs.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let line = text
        .lines()
        .skip_while(|l| *l != "CRON_TZ=Pacific/Kiritimati")
        .nth(1)
        .unwrap_or_else(|| panic!("no line after CRON_TZ: {text}"));
    let fields: Vec<&str> = line.splitn(6, ' ').collect();
    assert_eq!(fields[..5], ["0", "6", "*", "*", "*"], "{line}");
    assert!(
        fields[5].contains("\\%"),
        "the % in the folder is escaped: {line}"
    );
    let command = fields[5].replace("\\%", "%");
    let tz: chrono_tz::Tz = "Pacific/Kiritimati".parse().unwrap();
    let yesterday = || {
        idem::schedule::run_date(Some("yesterday"), None, None, tz, chrono::Utc::now())
            .unwrap()
            .to_string()
    };
    let before = yesterday();
    let status = Command::new("sh")
        .arg("-c")
        .arg(&command)
        .current_dir(std::env::temp_dir())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .status()
        .expect("run sh");
    let after = yesterday();
    assert!(status.success(), "{command}");
    let log = std::fs::read_to_string(logs.join("kiri.log")).expect("the line appends to its log");
    assert!(
        log.starts_with(&format!("completed kiri for {before}"))
            || log.starts_with(&format!("completed kiri for {after}")),
        "{log}"
    );
    let recorded = runs(&s);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0]["trigger"], "scheduler");
    assert_eq!(recorded[0]["status"], "completed");
}

/// A job whose `process` is `process` (plus a record of the scope in `out`).
fn job_with_process(name: &str, extra: &str, process: &str) -> String {
    format!(
        r#"
name = "{name}"
processor = "sql"
{extra}
[sql]
warehouse = "sqlite://wh.db"
setup = "CREATE TABLE IF NOT EXISTS out (job TEXT, day TEXT)"
process = """INSERT INTO out VALUES ('{name}', @scope); {process}"""
"#
    )
}

#[test]
fn a_backfill_runs_each_date_through_the_guards_and_sums_up() {
    let s = Sandbox::new("idem-sched-backfill");
    // Fails on 2 January only (SQLite integer overflow), after inserting: the insert is
    // rolled back with it.
    let job = s.write_job(
        "fill",
        &job_with_process(
            "fill",
            "[guards]\ntime_window = \"1h\"",
            "SELECT abs(-9223372036854775807 - 1) WHERE @scope = '2026-01-02'",
        ),
    );
    let job = job.to_str().unwrap();
    let (code, first, err) = s.json(&["run", job, "--date", "2026-01-01"]);
    assert_eq!(
        (code, first["status"].as_str()),
        (0, Some("completed")),
        "{err}"
    );

    let (code, v, err) = s.json(&["run", job, "--from", "2026-01-01", "--to", "2026-01-04"]);
    assert_eq!(code, 1, "a failed date fails the backfill: {v} {err}");
    assert_eq!(v["completed"], 2, "{v}");
    assert_eq!(v["skipped"], serde_json::json!({"time_window": 1}), "{v}");
    assert_eq!(v["failed"], 1, "{v}");
    assert_eq!(v["failed_dates"], serde_json::json!(["2026-01-02"]), "{v}");
    let statuses: Vec<(&str, &str)> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["scope"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        statuses,
        [
            ("2026-01-01", "skipped"),
            ("2026-01-02", "failed"),
            ("2026-01-03", "completed"),
            ("2026-01-04", "completed"),
        ]
    );
    assert_eq!(
        s.warehouse_days(),
        ["2026-01-01", "2026-01-03", "2026-01-04"]
    );
    let ledger = runs(&s);
    let backfill = ledger.iter().filter(|r| r["trigger"] == "backfill").count();
    assert_eq!((ledger.len(), backfill), (5, 4), "{ledger:?}");

    // Again: the done dates are skipped with their reason; the failed one is retried.
    let out = s.idem(&["run", job, "--from", "2026-01-01", "--to", "2026-01-04"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains("skipped fill for 2026-01-03 (time_window)"),
        "{text}"
    );
    assert!(text.contains("failed fill for 2026-01-02: "), "{text}");
    assert!(
        text.ends_with(
            "backfill fill 2026-01-01..2026-01-04: 0 completed, 3 skipped (time_window 3), 1 failed (2026-01-02)\n"
        ),
        "{text}"
    );

    for (args, expect) in [
        (
            vec!["run", job, "--from", "2026-01-04", "--to", "2026-01-01"],
            "is after --to",
        ),
        (
            vec!["run", job, "--from", "2026-01-01", "--to", "10000-01-01"],
            "--to: bad date",
        ),
        (vec!["run", job, "--from", "2026-01-01"], "--to"),
        (
            vec![
                "run",
                job,
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-02",
                "--date",
                "2026-01-01",
            ],
            "--date",
        ),
        (
            vec!["explain", job, "--from", "2026-01-01", "--to", "2026-01-02"],
            "explain takes one --date",
        ),
    ] {
        let out = s.idem(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(expect), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(runs(&s).len(), 9, "bad backfills record nothing");
}

/// A process block that runs for many seconds (a recursive count).
const VERY_SLOW: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000000) SELECT count(*) FROM c";

#[test]
fn sigterm_stops_a_backfill_records_the_running_date_as_interrupted_and_runs_no_more() {
    let s = Sandbox::new("idem-sched-backfill-term");
    let job = s.write_job("slow", &job_with_process("slow", "", VERY_SLOW));
    let job = job.to_str().unwrap().to_string();
    let (code, _, err) = s.json(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    let child = s
        .json_command(&["run", &job, "--from", "2025-11-18", "--to", "2025-11-20"])
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    loop {
        let (_, e, _) = s.json(&["explain", &job, "--date", "2025-11-18"]);
        if e["skip_reason"] == "in_progress" {
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "the first date never claimed: {e}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let (code, v, err) = common::wait(child);
    assert_eq!(code, 1, "{v} {err}");
    assert_eq!(v["failed"], 1, "{v}");
    assert_eq!(v["not_run"], 2, "{v}");
    assert_eq!(v["runs"][0]["error"], "interrupted by SIGTERM", "{v}");
    let ledger = runs(&s);
    assert_eq!(
        ledger.len(),
        1,
        "only the interrupted date is recorded: {ledger:?}"
    );
    assert!(s.warehouse_days().is_empty(), "nothing half-written");
    let (_, e, _) = s.json(&["explain", &job, "--date", "2025-11-18"]);
    assert_eq!(e["decision"], "run", "the lease is released: {e}");
}

#[test]
fn a_daily_two_thirty_job_fires_exactly_once_on_each_2026_dst_day_in_los_angeles() {
    let s = Sandbox::new("idem-sched-dst");
    s.write_job(
        "daily",
        &recording_job(
            "daily",
            "schedule = \"30 2 * * *\"\ntimezone = \"America/Los_Angeles\"",
        ),
    );
    let local_times = |after: &str| {
        let (code, v, err) = s.json(&["schedule", "daily", "--after", after, "--next", "3"]);
        assert_eq!(code, 0, "{err}");
        v[0]["next"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["local"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    // 8 March: 02:30 does not exist; it fires once, at 03:00 PDT, the first instant after.
    assert_eq!(
        local_times("2026-03-07T12:00:00Z"),
        [
            "2026-03-08T03:00:00-07:00",
            "2026-03-09T02:30:00-07:00",
            "2026-03-10T02:30:00-07:00"
        ]
    );
    // 1 November: 02:30 comes once, after the repeated 01:00 hour.
    assert_eq!(
        local_times("2026-10-31T12:00:00Z"),
        [
            "2026-11-01T02:30:00-08:00",
            "2026-11-02T02:30:00-08:00",
            "2026-11-03T02:30:00-08:00"
        ]
    );
}

#[test]
fn a_parallel_backfill_completes_every_date_exactly_once_and_sums_up() {
    let s = Sandbox::new("idem-sched-backfill-par");
    let slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 300000) SELECT count(*) FROM c";
    let job = s.write_job(
        "par",
        &job_with_process("par", "[guards]\ntime_window = \"1h\"", slow),
    );
    let job = job.to_str().unwrap();
    let (code, _, err) = s.json(&["run", job, "--date", "2026-02-03"]);
    assert_eq!(code, 0, "{err}");

    let range = [
        "--from",
        "2026-02-01",
        "--to",
        "2026-02-08",
        "--parallel",
        "4",
    ];
    let mut args = vec!["run", job];
    args.extend(range);
    let (code, v, err) = s.json(&args);
    assert_eq!(code, 0, "{v} {err}");
    assert_eq!(v["completed"], 7, "{v}");
    assert_eq!(v["skipped"], serde_json::json!({"time_window": 1}), "{v}");
    assert_eq!(v["failed"], 0, "{v}");
    assert_eq!(v["not_run"], 0, "{v}");
    let scopes: Vec<&str> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["scope"].as_str().unwrap())
        .collect();
    let expect: Vec<String> = (1..=8).map(|d| format!("2026-02-0{d}")).collect();
    assert_eq!(scopes, expect, "one report per date, in date order");
    assert_eq!(
        s.warehouse_days(),
        expect,
        "every date written exactly once"
    );
    let ledger = runs(&s);
    let completed: Vec<&str> = ledger
        .iter()
        .filter(|r| r["status"] == "completed")
        .map(|r| r["scope"].as_str().unwrap())
        .collect();
    assert_eq!(completed.len(), 8, "{ledger:?}");

    // Again, in plain lines: every date skipped, nothing written twice.
    let out = s.idem(&args);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("skipped par for "))
            .count(),
        8,
        "{text}"
    );
    assert!(
        text.ends_with("backfill par 2026-02-01..2026-02-08: 0 completed, 8 skipped (time_window 8), 0 failed\n"),
        "{text}"
    );
    assert_eq!(s.warehouse_days(), expect);

    for bad in ["0", "33"] {
        let out = s.idem(&[
            "run",
            job,
            "--from",
            "2026-02-01",
            "--to",
            "2026-02-02",
            "--parallel",
            bad,
        ]);
        assert_eq!(out.status.code(), Some(2), "--parallel {bad}");
        assert!(stderr(&out).contains("--parallel"), "{}", stderr(&out));
    }
}

#[test]
fn sigterm_stops_a_parallel_backfill_records_every_running_date_as_interrupted() {
    let s = Sandbox::new("idem-sched-backfill-par-term");
    let job = s.write_job("slow", &job_with_process("slow", "", VERY_SLOW));
    let job = job.to_str().unwrap().to_string();
    let (code, _, err) = s.json(&["migrate"]);
    assert_eq!(code, 0, "{err}");
    let child = s
        .json_command(&[
            "run",
            &job,
            "--from",
            "2025-11-18",
            "--to",
            "2025-11-21",
            "--parallel",
            "2",
        ])
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    for date in ["2025-11-18", "2025-11-19"] {
        loop {
            let (_, e, _) = s.json(&["explain", &job, "--date", date]);
            if e["skip_reason"] == "in_progress" {
                break;
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(20),
                "{date} never claimed: {e}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let (code, v, err) = common::wait(child);
    assert_eq!(code, 1, "{v} {err}");
    assert_eq!(v["failed"], 2, "{v}");
    assert_eq!(v["not_run"], 2, "no new date started: {v}");
    for i in 0..2 {
        assert_eq!(v["runs"][i]["error"], "interrupted by SIGTERM", "{v}");
    }
    assert_eq!(runs(&s).len(), 2, "only the running dates are recorded");
    assert!(s.warehouse_days().is_empty(), "nothing half-written");
    for date in ["2025-11-18", "2025-11-19"] {
        let (_, e, _) = s.json(&["explain", &job, "--date", date]);
        assert_eq!(e["decision"], "run", "the lease of {date} is released: {e}");
    }
}
