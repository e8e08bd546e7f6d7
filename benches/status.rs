//! `idem status` over 1,000 scheduled jobs × 90 days of history (issue 37): a jobs folder
//! of 1,000 daily jobs and a ledger holding one completed run of every date their schedule
//! expected in the last 90 days (about 90,000 runs), written with bulk SQL after the store
//! created its schema. Then the release `idem status --since 90d --format json` is timed as
//! a whole process, next to its floors: a plain `SELECT count(*)` of the same rows (a
//! connection and one query, in-process) and `idem --version` (a process start).
//!
//! SQLite always, Postgres with `IDEM_TEST_POSTGRES_URL` (in a schema of its own, dropped
//! after). `cargo bench --bench status` (`IDEM_BENCH_JOBS`, `IDEM_BENCH_REPEAT`).

use std::process::Command;
use std::time::{Duration, Instant};

use chrono::{Duration as Days, TimeZone, Utc};
use sqlx::{Connection, Executor};

const DAY_MICROS: i64 = 86_400_000_000;

fn env_i64(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// The slots of a `0 6 * * *` schedule in the last 90 days, newest first, in microseconds.
fn slots() -> Vec<i64> {
    let now = Utc::now();
    let today = now.date_naive().and_hms_opt(6, 0, 0).unwrap();
    let mut slot = Utc.from_utc_datetime(&today);
    if slot > now {
        slot -= Days::days(1);
    }
    let from = now - Days::days(90);
    let mut out = Vec::new();
    while slot >= from {
        out.push(slot.timestamp_micros());
        slot -= Days::days(1);
    }
    out
}

fn write_jobs(dir: &std::path::Path, jobs: i64) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..jobs {
        let name = format!("bench_status_{i}");
        std::fs::write(
            dir.join(format!("{name}.toml")),
            format!(
                "name = \"{name}\"\nprocessor = \"command\"\nschedule = \"0 6 * * *\"\n\
                 date = \"yesterday\"\n[guards]\nlease = \"10m\"\ntime_window = \"20h\"\n\
                 [command]\nrun = [\"true\"]\n"
            ),
        )
        .unwrap();
    }
}

const RUN_COLUMNS: &str = "run_id, processor_name, scope, scope_date, trigger_source, mode, \
                           started_at, finished_at, duration_ms, status";

/// Run `i`: job `i % jobs`, the `i / jobs`-th slot before `newest` (a minute after it),
/// its scope the slot's day before. `at(e)` and `day(e)` are the dialect's timestamp and
/// `YYYY-MM-DD` of a microsecond expression, `date(e)` its date.
fn columns(
    jobs: i64,
    newest: i64,
    at: impl Fn(&str) -> String,
    day: impl Fn(&str) -> String,
    date: impl Fn(&str) -> String,
) -> String {
    let started = format!("({newest} - (i / {jobs}) * {DAY_MICROS} + 60000000)");
    let scope = format!("({newest} - (i / {jobs} + 1) * {DAY_MICROS})");
    format!(
        "'bench_status_' || (i % {jobs}), {}, {}, 'scheduler', 'enforce', {}, {}, 1000, \
         'completed'",
        day(&scope),
        date(&scope),
        at(&started),
        at(&format!("({started} + 1000000)")),
    )
}

async fn seed_sqlite(url: &str, jobs: i64, slots: &[i64]) -> i64 {
    let mut conn = sqlx::SqliteConnection::connect(url).await.expect("sqlite");
    let rows = jobs * slots.len() as i64;
    let day = |e: &str| format!("date({e} / 1000000, 'unixepoch')");
    let cols = columns(jobs, slots[0], |e| e.to_string(), day, day);
    let sql = format!(
        "INSERT INTO processing_runs ({RUN_COLUMNS}) \
         WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {last}) \
         SELECT 'r' || i, {cols} FROM n; ANALYZE;",
        last = rows - 1
    );
    conn.execute(sql.as_str()).await.expect("seed sqlite");
    rows
}

async fn seed_postgres(url: &str, jobs: i64, slots: &[i64]) -> i64 {
    let mut conn = sqlx::PgConnection::connect(url).await.expect("postgres");
    let rows = jobs * slots.len() as i64;
    let at = |e: &str| format!("to_timestamp({e} / 1e6)");
    let cols = columns(
        jobs,
        slots[0],
        at,
        |e| format!("to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD')", at(e)),
        |e| format!("({} AT TIME ZONE 'UTC')::date", at(e)),
    );
    let sql = format!(
        "INSERT INTO processing_runs ({RUN_COLUMNS}) \
         SELECT 'r' || i, {cols} FROM generate_series(0::bigint, {last}) AS n(i)",
        last = rows - 1
    );
    conn.execute(sql.as_str()).await.expect("seed postgres");
    conn.execute("VACUUM ANALYZE processing_runs")
        .await
        .expect("vacuum");
    rows
}

fn median(mut times: Vec<Duration>) -> (f64, f64, f64) {
    times.sort_unstable();
    let s = |d: Duration| d.as_secs_f64() * 1000.0;
    (
        s(times[times.len() / 2]),
        s(times[0]),
        s(times[times.len() - 1]),
    )
}

/// Times `idem status` over `store`, checking every job is there and nothing missing.
fn time_status(store: &str, jobs_dir: &std::path::Path, jobs: i64, repeat: usize) -> Vec<Duration> {
    let exe = env!("CARGO_BIN_EXE_idem");
    (0..repeat)
        .map(|_| {
            let t = Instant::now();
            let out = Command::new(exe)
                .args(["--store", store, "--jobs-dir"])
                .arg(jobs_dir)
                .args(["--format", "json", "status", "--since", "90d"])
                .output()
                .expect("run idem status");
            let took = t.elapsed();
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
            assert_eq!(doc["jobs"].as_array().map(Vec::len), Some(jobs as usize));
            assert_eq!(doc["ok"], true, "every expected date completed");
            took
        })
        .collect()
}

fn time_floor(rt: &tokio::runtime::Runtime, url: &str, repeat: usize) -> Vec<Duration> {
    let since = (Utc::now() - Days::days(91)).timestamp_micros();
    (0..repeat)
        .map(|_| {
            rt.block_on(async {
                let t = Instant::now();
                let n: i64 = if url.starts_with("sqlite") {
                    let mut c = sqlx::SqliteConnection::connect(url).await.unwrap();
                    sqlx::query_scalar("SELECT count(*) FROM processing_runs WHERE started_at >= ?")
                        .bind(since)
                        .fetch_one(&mut c)
                        .await
                        .unwrap()
                } else {
                    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
                    sqlx::query_scalar(
                        "SELECT count(*) FROM processing_runs WHERE started_at >= to_timestamp($1 / 1e6)",
                    )
                    .bind(since as f64)
                    .fetch_one(&mut c)
                    .await
                    .unwrap()
                };
                assert!(n > 0);
                t.elapsed()
            })
        })
        .collect()
}

fn report(store: &str, rows: i64, status: Vec<Duration>, floor: Vec<Duration>, start: f64) {
    let (s, smin, smax) = median(status);
    let (f, _, _) = median(floor);
    println!(
        "{store:8} {rows} runs: idem status median {s:.0} ms (min {smin:.0}, max {smax:.0}); \
         floor SELECT count(*) {f:.1} ms, process start {start:.1} ms; target <= 1000 ms: {}",
        if s <= 1000.0 { "met" } else { "MISSED" }
    );
}

fn main() {
    let jobs = env_i64("IDEM_BENCH_JOBS", 1000);
    let repeat = env_i64("IDEM_BENCH_REPEAT", 5) as usize;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let dir = std::env::temp_dir().join(format!("idem-bench-status-{}", std::process::id()));
    let jobs_dir = dir.join("jobs");
    write_jobs(&jobs_dir, jobs);
    let slots = slots();
    let (start, _, _) = median(
        (0..repeat)
            .map(|_| {
                let t = Instant::now();
                Command::new(env!("CARGO_BIN_EXE_idem"))
                    .arg("--version")
                    .output()
                    .unwrap();
                t.elapsed()
            })
            .collect(),
    );
    let sqlite = format!("sqlite://{}", dir.join("ledger.db").display());
    let rows = rt.block_on(async {
        idem::store::open(&sqlite).await.expect("the sqlite schema");
        seed_sqlite(&sqlite, jobs, &slots).await
    });
    let status = time_status(&sqlite, &jobs_dir, jobs, repeat);
    report(
        "sqlite",
        rows,
        status,
        time_floor(&rt, &sqlite, repeat),
        start,
    );
    match std::env::var("IDEM_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => {
            let schema = format!("idem_bench_status_{}", std::process::id());
            let sep = if url.contains('?') { '&' } else { '?' };
            let scoped = format!("{url}{sep}options[search_path]={schema}");
            rt.block_on(async {
                let mut c = sqlx::PgConnection::connect(&url).await.expect("postgres");
                c.execute(format!("CREATE SCHEMA {schema}").as_str())
                    .await
                    .unwrap();
            });
            let rows = rt.block_on(async {
                idem::store::open(&scoped)
                    .await
                    .expect("the postgres schema");
                seed_postgres(&scoped, jobs, &slots).await
            });
            let status = time_status(&scoped, &jobs_dir, jobs, repeat);
            report(
                "postgres",
                rows,
                status,
                time_floor(&rt, &scoped, repeat),
                start,
            );
            rt.block_on(async {
                let mut c = sqlx::PgConnection::connect(&url).await.expect("postgres");
                c.execute(format!("DROP SCHEMA {schema} CASCADE").as_str())
                    .await
                    .unwrap();
            });
        }
        _ => println!("postgres: skipped, IDEM_TEST_POSTGRES_URL is not set"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
