//! `idem report`, whole process, over a synthetic ledger of 1 M runs spread over 30 days
//! (50 jobs) and 300 k processing keys: SQLite always, Postgres with
//! `IDEM_TEST_POSTGRES_URL`. The ledger is written with bulk SQL (a recursive CTE on
//! SQLite, `generate_series` on Postgres) after the store created its schema; then the
//! release `idem report --format json` is timed for `--days 7` and `--days 30`.
//!
//! First, the report's cost against the history behind its period: `--days 7` on 3,000
//! recent runs alone and with 97,000 older runs (and their keys) behind them, with and
//! without `--all-keys` (`IDEM_BENCH_HISTORY_ONLY=1` stops there).
//!
//! `cargo bench --bench report` (`IDEM_BENCH_RUNS`, `IDEM_BENCH_KEYS` and
//! `IDEM_BENCH_REPEAT` change the size and the repetitions; `IDEM_BENCH_SQLITE=PATH`
//! keeps the SQLite file, and reuses it when it already holds the ledger). On Postgres the
//! rows are those of jobs named `bench_report_*`, replaced on each run, at dates (2027)
//! no test uses.

use std::process::Command;
use std::time::{Duration, Instant};

use sqlx::{Connection, Executor};

/// The period's end: every run is in the 30 days before it.
const UNTIL: &str = "2027-01-01T00:00:00Z";
/// `UNTIL` in microseconds since the epoch.
const UNTIL_MICROS: i64 = 1_798_761_600_000_000;
const DAY_MICROS: i64 = 86_400_000_000;
const JOBS: i64 = 50;

fn env_i64(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// The columns of synthetic run `i` (of `runs`), in [`RUN_COLUMNS`] order after `run_id`,
/// as SQL over an integer `i`; `micros` is the run's start in microseconds since the epoch
/// and `at(e)` / `day(e)` / `hour(e)` / `date(e)` the dialect's timestamp, `YYYY-MM-DD`
/// text, `HH` text and date of a microsecond expression `e`. Job `i % 50`; half the jobs
/// have one scope per day, half one per hour; 80 % completed, 5 % failed, 15 % skipped
/// (time window, some content hash); 70 % scheduled; jobs 0-4 in shadow mode; records
/// processed cycle over 0..20 slowly, so neighbouring runs of a scope often match.
fn run_columns(
    runs: i64,
    at: impl Fn(&str) -> String,
    day: impl Fn(&str) -> String,
    hour: impl Fn(&str) -> String,
    date: impl Fn(&str) -> String,
) -> String {
    let step = 30 * DAY_MICROS / runs;
    let start = format!("({} + i * {step})", UNTIL_MICROS - 30 * DAY_MICROS);
    let duration = "(1000 + (i % 60) * 1000)";
    let finish = format!("({start} + 1000 * {duration})");
    let h = "(((i / 50) * 61) % 100)";
    format!(
        "'bench_report_' || (i % {JOBS}), \
         CASE WHEN i % {JOBS} < 25 THEN {d} ELSE {d} || 'T' || {hh} END, {date}, \
         CASE WHEN ((i / 50) * 7) % 10 < 7 THEN 'scheduler' ELSE 'manual' END, \
         CASE WHEN i % {JOBS} < 5 THEN 'shadow' ELSE 'enforce' END, \
         {started}, {finished}, {duration}, \
         CASE WHEN {h} < 80 THEN 'completed' WHEN {h} < 85 THEN 'failed' ELSE 'skipped' END, \
         CASE WHEN {h} < 85 THEN NULL WHEN {h} < 95 THEN 'time_window' \
              ELSE 'duplicate_content_hash' END, \
         CASE WHEN i % {JOBS} < 5 AND {h} < 30 THEN 'duplicate_content_hash' END, \
         CASE WHEN {h} < 80 THEN (i / ({JOBS} * 13)) % 20 END",
        d = day(&start),
        hh = hour(&start),
        date = date(&start),
        started = at(&start),
        finished = at(&finish),
    )
}

const RUN_COLUMNS: &str = "run_id, processor_name, scope, scope_date, trigger_source, mode, \
                           started_at, finished_at, duration_ms, status, skip_reason, \
                           would_skip_reason, records_processed";
const KEY_COLUMNS: &str = "processing_key, kind, processor_name, scope, scope_date, \
                           processed_at, entity_count, run_id";

async fn seed_sqlite(url: &str, runs: i64, keys: i64) {
    let mut conn = sqlx::SqliteConnection::connect(url).await.expect("sqlite");
    let have: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM processing_runs")
        .fetch_one(&mut conn)
        .await
        .expect("count");
    if have == runs {
        println!("sqlite: reusing the {have} runs already in the file");
        return;
    }
    let secs = |e: &str| format!("({e} / 1000000)");
    let columns = run_columns(
        runs,
        |e| e.to_string(),
        |e| format!("date({}, 'unixepoch')", secs(e)),
        |e| format!("strftime('%H', {}, 'unixepoch')", secs(e)),
        |e| format!("date({}, 'unixepoch')", secs(e)),
    );
    let sql = format!(
        "DELETE FROM processing_runs; DELETE FROM processing_keys; \
         INSERT INTO processing_runs ({RUN_COLUMNS}) \
         WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {last}) \
         SELECT 'r' || i, {columns} FROM n; \
         INSERT INTO processing_keys ({KEY_COLUMNS}) \
         WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {klast}) \
         SELECT 'k' || (i % {distinct}), CASE WHEN i % 3 = 0 THEN 'content' ELSE 'scope' END, \
                'bench_report_' || (i % {JOBS}), 's' || (i % 500), '2026-12-15', \
                {kstart} + i * {kstep}, i % 100, 'r' || i FROM n; \
         ANALYZE;",
        last = runs - 1,
        klast = keys - 1,
        distinct = keys * 5 / 6,
        kstart = UNTIL_MICROS - 30 * DAY_MICROS,
        kstep = 30 * DAY_MICROS / keys,
    );
    let t = Instant::now();
    conn.execute(sql.as_str()).await.expect("seed sqlite");
    println!(
        "sqlite: seeded {runs} runs and {keys} keys in {:.1?}",
        t.elapsed()
    );
}

async fn seed_postgres(url: &str, runs: i64, keys: i64) {
    let mut conn = sqlx::PgConnection::connect(url).await.expect("postgres");
    let at = |e: &str| format!("to_timestamp({e} / 1e6)");
    let columns = run_columns(
        runs,
        at,
        |e| format!("to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD')", at(e)),
        |e| format!("to_char({} AT TIME ZONE 'UTC', 'HH24')", at(e)),
        |e| format!("({} AT TIME ZONE 'UTC')::date", at(e)),
    );
    let sql = format!(
        "DELETE FROM processing_runs WHERE processor_name LIKE 'bench\\_report\\_%'; \
         DELETE FROM processing_keys WHERE processor_name LIKE 'bench\\_report\\_%'; \
         INSERT INTO processing_runs ({RUN_COLUMNS}) \
         SELECT 'bench-r' || i, {columns} FROM generate_series(0::bigint, {last}) AS n(i); \
         INSERT INTO processing_keys ({KEY_COLUMNS}) \
         SELECT 'k' || (i % {distinct}), CASE WHEN i % 3 = 0 THEN 'content' ELSE 'scope' END, \
                'bench_report_' || (i % {JOBS}), 's' || (i % 500), DATE '2026-12-15', \
                to_timestamp(({kstart} + i * {kstep}) / 1e6), i % 100, 'bench-r' || i \
         FROM generate_series(0::bigint, {klast}) AS n(i); \
         VACUUM ANALYZE processing_runs; VACUUM ANALYZE processing_keys;",
        last = runs - 1,
        klast = keys - 1,
        distinct = keys * 5 / 6,
        kstart = UNTIL_MICROS - 30 * DAY_MICROS,
        kstep = 30 * DAY_MICROS / keys,
    );
    let t = Instant::now();
    for statement in sql.split("; ") {
        conn.execute(statement).await.expect("seed postgres");
    }
    println!(
        "postgres: seeded {runs} runs and {keys} keys in {:.1?}",
        t.elapsed()
    );
}

/// Times `idem report` over `store` for `days`, `repeat` times; returns the times.
fn time_report(store: &str, days: u32, repeat: usize) -> Vec<Duration> {
    time_report_with(store, days, repeat, &[], JOBS as usize)
}

/// [`time_report`] with `extra` flags, expecting at least `jobs` jobs in the report.
fn time_report_with(
    store: &str,
    days: u32,
    repeat: usize,
    extra: &[&str],
    jobs: usize,
) -> Vec<Duration> {
    let exe = env!("CARGO_BIN_EXE_idem");
    let mut times = Vec::new();
    for _ in 0..repeat {
        let t = Instant::now();
        let out = Command::new(exe)
            .args([
                "--store", store, "--format", "json", "report", "--until", UNTIL,
            ])
            .args(["--days", &days.to_string()])
            .args(extra)
            .output()
            .expect("run idem report");
        let took = t.elapsed();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let found = doc["processors"].as_array().map_or(0, |p| p.len());
        assert!(found >= jobs, "{found} jobs in the report");
        times.push(took);
    }
    times.sort_unstable();
    times
}

fn print(store: &str, days: u32, times: &[Duration]) {
    println!(
        "{store:8} --days {days:2}: median {:.2} s (min {:.2}, max {:.2}, {} runs)",
        times[times.len() / 2].as_secs_f64(),
        times[0].as_secs_f64(),
        times[times.len() - 1].as_secs_f64(),
        times.len()
    );
}

/// A SQLite ledger of `recent` runs in the 7 days before `UNTIL` plus `old` runs spread
/// over the two years before its last 40 days, each run with one key (a third of them
/// content keys) at its start: the history a report of `--days 7` should not pay for.
async fn seed_history(url: &str, recent: i64, old: i64) {
    let mut conn = sqlx::SqliteConnection::connect(url).await.expect("sqlite");
    let recent_step = 7 * DAY_MICROS / recent.max(1);
    let old_step = 700 * DAY_MICROS / old.max(1);
    let start = format!(
        "CASE WHEN i < {recent} THEN {until} - 7 * {day} + i * {recent_step} \
              ELSE {until} - 40 * {day} - (i - {recent}) * {old_step} END",
        until = UNTIL_MICROS,
        day = DAY_MICROS,
    );
    let sql = format!(
        "INSERT INTO processing_runs ({RUN_COLUMNS}) \
         WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {last}) \
         SELECT 'h' || i, 'bench_report_' || (i % {JOBS}), 's' || (i % 997), '2026-12-15', \
                'scheduler', 'enforce', {start}, {start} + 2000000, 2000, \
                CASE WHEN i % 10 < 8 THEN 'completed' ELSE 'skipped' END, \
                CASE WHEN i % 10 < 8 THEN NULL ELSE 'time_window' END, NULL, i % 20 FROM n; \
         INSERT INTO processing_keys ({KEY_COLUMNS}) \
         WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {last}) \
         SELECT 'hk' || i, CASE WHEN i % 3 = 0 THEN 'content' ELSE 'scope' END, \
                'bench_report_' || (i % {JOBS}), 's' || (i % 997), '2026-12-15', {start}, \
                i % 100, 'h' || i FROM n; \
         ANALYZE;",
        last = recent + old - 1,
    );
    conn.execute(sql.as_str()).await.expect("seed the history");
}

/// Times `idem report --days 7` (and with `--all-keys`) on a ledger of 3,000 recent runs
/// alone and on one with 97,000 older runs behind them: the report's cost should follow
/// its period, not the history (issue 32).
fn history(rt: &tokio::runtime::Runtime, repeat: usize) {
    let recent = env_i64("IDEM_BENCH_RECENT_RUNS", 3_000);
    let old = env_i64("IDEM_BENCH_OLD_RUNS", 97_000);
    let dir = std::env::temp_dir().join(format!("idem-bench-history-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let _temp = TempDir(dir.clone());
    let mut medians = Vec::new();
    for (name, old) in [("recent only", 0), ("with history", old)] {
        let url = format!("sqlite://{}", dir.join(format!("{old}.db")).display());
        rt.block_on(async {
            idem::store::open(&url).await.expect("create the schema");
            seed_history(&url, recent, old).await;
        });
        for all_keys in [false, true] {
            let extra: &[&str] = if all_keys { &["--all-keys"] } else { &[] };
            let times = time_report_with(&url, 7, repeat, extra, 1);
            let median = times[times.len() / 2].as_secs_f64();
            println!(
                "history: {name:12} ({} runs){}: median {:.3} s (min {:.3}, max {:.3}, {} runs)",
                recent + old,
                if all_keys { " --all-keys" } else { "" },
                median,
                times[0].as_secs_f64(),
                times[times.len() - 1].as_secs_f64(),
                times.len()
            );
            medians.push(median);
        }
    }
    println!(
        "history: {} older runs cost the report {:.2}x (with --all-keys {:.2}x)",
        old,
        medians[2] / medians[0],
        medians[3] / medians[1]
    );
}

fn main() {
    let runs = env_i64("IDEM_BENCH_RUNS", 1_000_000);
    let keys = env_i64("IDEM_BENCH_KEYS", 300_000);
    let repeat = env_i64("IDEM_BENCH_REPEAT", 3) as usize;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (path, _temp) = match std::env::var("IDEM_BENCH_SQLITE") {
        Ok(p) if !p.is_empty() => (std::path::PathBuf::from(p), None),
        _ => {
            let dir =
                std::env::temp_dir().join(format!("idem-bench-report-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            (dir.join("ledger.db"), Some(TempDir(dir)))
        }
    };
    history(&rt, env_i64("IDEM_BENCH_HISTORY_REPEAT", 7) as usize);
    if std::env::var("IDEM_BENCH_HISTORY_ONLY").is_ok() {
        return;
    }
    let sqlite = format!("sqlite://{}", path.display());
    rt.block_on(async {
        idem::store::open(&sqlite)
            .await
            .expect("create the sqlite schema");
        seed_sqlite(&sqlite, runs, keys).await;
    });
    for days in [7, 30] {
        print("sqlite", days, &time_report(&sqlite, days, repeat));
    }
    let Some(pg) = std::env::var("IDEM_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
    else {
        println!("postgres: skipped, IDEM_TEST_POSTGRES_URL is not set");
        return;
    };
    rt.block_on(async {
        idem::store::open(&pg)
            .await
            .expect("create the postgres schema");
        seed_postgres(&pg, runs, keys).await;
    });
    for days in [7, 30] {
        print("postgres", days, &time_report(&pg, days, repeat));
    }
}

/// Removes the temporary SQLite folder at the end.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
