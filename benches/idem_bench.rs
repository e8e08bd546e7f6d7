//! Benchmarks that print their figures (`cargo bench --bench idem_bench`).
//!
//! 1. Skip-decision latency of a whole `idem run` process on SQLite: the second and later
//!    runs of a job for one date are skipped; each process is timed wall-clock, next to
//!    the floors it cannot beat (spawning `idem --version`, and opening SQLite with sqlx
//!    plus one query in-process).
//! 2. Content-hash throughput: `Content::key` (the description's canonical JSON, encoded
//!    once when the description is built, streamed into SHA-256) against raw
//!    `sha2::Sha256::digest` over the same bytes; and, for honesty, the end-to-end cost of
//!    building the description (canonical encoding and sorting of the rows).
//! 3. What the report's indexes (migrations 0002 and 0004) cost the run path: two SQLite
//!    ledgers of 200 k runs, one with the indexes and one without them, and
//!    `idem run` processes alternating between them, on the completed path (a new date
//!    each time, so the run is recorded and enters the index) and on the skip path.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use idem::{Content, HashAlgorithm};
use serde_json::json;
use sha2::{Digest, Sha256};

const IDEM: &str = env!("CARGO_BIN_EXE_idem");

struct Stats {
    samples: Vec<Duration>,
}

impl Stats {
    fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        Stats { samples }
    }
    fn pct(&self, p: f64) -> f64 {
        let i = ((self.samples.len() as f64 - 1.0) * p).round() as usize;
        self.samples[i].as_secs_f64() * 1000.0
    }
    fn line(&self, what: &str) -> String {
        format!(
            "{what:<48} n={:<4} min {:>6.2} ms  median {:>6.2} ms  p90 {:>6.2} ms",
            self.samples.len(),
            self.pct(0.0),
            self.pct(0.5),
            self.pct(0.9)
        )
    }
}

fn time_process(args: &[&str], dir: &Path, n: usize, expect: Option<&str>) -> Stats {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let out = Command::new(IDEM)
            .args(args)
            .current_dir(dir)
            .output()
            .expect("spawn idem");
        samples.push(start.elapsed());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(e) = expect {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains(e), "expected {e:?} in {text}");
        }
    }
    Stats::new(samples)
}

fn skip_latency() {
    let dir = std::env::temp_dir().join(format!("idem-bench-{}", idem::new_run_id()));
    std::fs::create_dir_all(dir.join("jobs")).unwrap();
    std::fs::write(
        dir.join("jobs/window.toml"),
        r#"
name = "window"
processor = "sql"
[guards]
time_window = "1h"
[sql]
warehouse = "sqlite://warehouse.db"
process = "CREATE TABLE IF NOT EXISTS t (d TEXT); INSERT INTO t VALUES (@scope)"
"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("jobs/content.toml"),
        r#"
name = "content"
processor = "sql"
[guards]
time_window = "0s"
content_hash = "24h"
[sql]
warehouse = "sqlite://warehouse.db"
setup = "CREATE TABLE IF NOT EXISTS src (d TEXT, v INTEGER); INSERT INTO src SELECT '2025-11-18', 1 WHERE NOT EXISTS (SELECT 1 FROM src)"
content = "SELECT v FROM src WHERE d = @scope"
process = "SELECT 1"
"#,
    )
    .unwrap();
    // A content query that takes about half a second (a recursive count): a time-window
    // skip must not run it, so it costs what a skip without a content query costs.
    std::fs::write(
        dir.join("jobs/slow_content.toml"),
        r#"
name = "slow_content"
processor = "sql"
[guards]
time_window = "1h"
content_hash = "24h"
[sql]
warehouse = "sqlite://warehouse.db"
setup = "CREATE TABLE IF NOT EXISTS slow_src (d TEXT)"
content = "SELECT count(*) AS n FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000000) SELECT x FROM c)"
process = "INSERT INTO slow_src VALUES (@scope)"
"#,
    )
    .unwrap();
    let store = format!("sqlite://{}", dir.join("idem.db").display());
    let base = ["--store", store.as_str(), "--jobs-dir", "jobs"];
    let run = |job: &'static str| {
        let mut a = vec!["run", job, "--date", "2025-11-18"];
        a.extend(base);
        a
    };
    // First runs complete (and create the files).
    time_process(&run("window"), &dir, 1, Some("completed"));
    time_process(&run("content"), &dir, 1, Some("completed"));
    let first_slow = time_process(&run("slow_content"), &dir, 1, Some("completed"));
    let n = 200;
    let version = time_process(&["--version"], &dir, n, None);
    let floor = {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut samples = Vec::new();
        for _ in 0..n {
            let start = Instant::now();
            rt.block_on(async {
                let pool = sqlx::SqlitePool::connect(&store).await.unwrap();
                let _: i64 = sqlx::query_scalar("SELECT count(*) FROM processing_runs")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                pool.close().await;
            });
            samples.push(start.elapsed());
        }
        Stats::new(samples)
    };
    // The three skips are timed in turn, one sample each per round, so drift in the
    // machine's load (or the ledger growing) hits them alike and their ratio is fair.
    let (mut window, mut content, mut slow) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        window.extend(
            time_process(
                &run("window"),
                &dir,
                1,
                Some("skipped window for 2025-11-18 (time_window)"),
            )
            .samples,
        );
        content.extend(
            time_process(
                &run("content"),
                &dir,
                1,
                Some("skipped content for 2025-11-18 (duplicate_content_hash)"),
            )
            .samples,
        );
        slow.extend(
            time_process(
                &run("slow_content"),
                &dir,
                1,
                Some("skipped slow_content for 2025-11-18 (time_window)"),
            )
            .samples,
        );
    }
    let (window, content, slow) = (Stats::new(window), Stats::new(content), Stats::new(slow));
    println!("== skip-decision latency, whole process, SQLite store ==");
    println!("{}", version.line("floor: spawn `idem --version`"));
    println!(
        "{}",
        floor.line("floor: sqlx open SQLite + 1 query (in-process)")
    );
    println!("{}", window.line("`idem run` skipped by time_window"));
    println!(
        "{}",
        content.line("`idem run` skipped by content hash (SQL content)")
    );
    println!(
        "{}",
        slow.line("`idem run` skipped by time_window, slow content")
    );
    println!(
        "  (its first, completed run took {:.0} ms: the content query it skips)",
        first_slow.pct(0.5)
    );
    let ratio = slow.pct(0.5) / window.pct(0.5);
    println!(
        "time-window skip with a slow content query / without one: {ratio:.2} (target ~1.0, the content query is not run): {}",
        if ratio <= 1.2 { "met" } else { "NOT met" }
    );
    println!(
        "target: skipped run <= 5 ms wall per process -> median {:.2} ms: {}",
        window.pct(0.5),
        if window.pct(0.5) <= 5.0 {
            "met"
        } else {
            "NOT met"
        }
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn hash_throughput() {
    // A content description like a query's rows: 200k rows of mixed values.
    let rows: Vec<serde_json::Value> = (0..200_000)
        .map(|i| {
            let team = ["LAL", "BOS", "GSW", "NYK"][i % 4];
            json!({
                "player_id": format!("player-{i:07}"),
                "team": team,
                "points": (i * 7) % 51,
                "minutes": ((i * 13) % 48) as f64 + 0.5,
                "note": "starter; \"quoted\" — ünïcødé",
            })
        })
        .collect();
    let owned = rows.clone();
    let build_start = Instant::now();
    let content = Content::new().rows(owned).field("source_rows", 200_000);
    let build = build_start.elapsed().as_secs_f64();
    // The exact bytes Content::key digests.
    let canonical = format!(
        r#"{{"content":{},"processor":{},"scope":{}}}"#,
        idem::canonical_json(&content.to_value()),
        serde_json::to_string("player_game_summary").unwrap(),
        serde_json::to_string("2025-11-18").unwrap()
    );
    let expected = Sha256::digest(canonical.as_bytes());
    let key = content.key("player_game_summary", "2025-11-18", HashAlgorithm::Sha256);
    assert_eq!(
        key,
        expected
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>(),
        "same bytes"
    );
    let bytes = canonical.len() as f64;
    let rounds = 20;
    let mut best_raw = f64::MAX;
    let mut best_idem = f64::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        std::hint::black_box(Sha256::digest(std::hint::black_box(canonical.as_bytes())));
        best_raw = best_raw.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        std::hint::black_box(content.key(
            "player_game_summary",
            "2025-11-18",
            HashAlgorithm::Sha256,
        ));
        best_idem = best_idem.min(t.elapsed().as_secs_f64());
    }
    let mb = |secs: f64| bytes / secs / 1e6;
    println!(
        "== content-hash throughput ({:.1} MB of canonical JSON, best of {rounds}) ==",
        bytes / 1e6
    );
    println!(
        "raw sha2::Sha256::digest on the canonical bytes   {:>8.1} MB/s",
        mb(best_raw)
    );
    println!(
        "idem Content::key (canonical bytes -> SHA-256)     {:>8.1} MB/s",
        mb(best_idem)
    );
    println!(
        "end to end: build the description from 200k rows (canonical encoding, row sort) {:>6.1} MB/s ({:.0} ms)",
        mb(build),
        build * 1000.0
    );
    let ratio = best_raw / best_idem;
    println!(
        "ratio idem/raw {ratio:.2} (target >= 0.8): {}",
        if ratio >= 0.8 { "met" } else { "NOT met" }
    );
}

/// Runs per ledger in [`report_index_cost`] (`IDEM_BENCH_LEDGER_RUNS`).
fn ledger_runs() -> i64 {
    std::env::var("IDEM_BENCH_LEDGER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000)
}

fn report_index_cost() {
    let runs = ledger_runs();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let root = std::env::temp_dir().join(format!("idem-bench-index-{}", idem::new_run_id()));
    let mut ledgers = Vec::new();
    for (name, keep_index) in [("with", true), ("without", false)] {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        std::fs::write(
            dir.join("jobs/daily.toml"),
            r#"
name = "daily"
processor = "sql"
[guards]
time_window = "1h"
[sql]
warehouse = "sqlite://warehouse.db"
process = "CREATE TABLE IF NOT EXISTS t (d TEXT); INSERT INTO t VALUES (@scope)"
"#,
        )
        .unwrap();
        let store = format!("sqlite://{}", dir.join("idem.db").display());
        time_process(&["--store", &store, "migrate"], &dir, 1, None);
        rt.block_on(async {
            use sqlx::{Connection, Executor};
            let mut conn = sqlx::SqliteConnection::connect(&store).await.unwrap();
            // Completed runs of 50 jobs over ~2 years of hourly scopes, as a busy ledger.
            let sql = format!(
                "INSERT INTO processing_runs (run_id, processor_name, scope, scope_date, \
                 trigger_source, mode, started_at, finished_at, duration_ms, status, \
                 records_processed) \
                 WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {last}) \
                 SELECT 'r' || i, 'job_' || (i % 50), 's' || (i / 50), '2025-01-01', \
                 'scheduler', 'enforce', 1700000000000000 + i * 3600000000, \
                 1700000000000000 + i * 3600000000 + 5000000, 5000, \
                 CASE WHEN i % 10 < 8 THEN 'completed' ELSE 'skipped' END, i % 20 FROM n; \
                 {drop} ANALYZE;",
                last = runs - 1,
                drop = if keep_index {
                    ""
                } else {
                    "DROP INDEX processing_runs_completed; DROP INDEX processing_runs_report;"
                },
            );
            conn.execute(sql.as_str()).await.unwrap();
        });
        ledgers.push((dir, store));
    }
    let n = 100;
    let (mut completed, mut skipped) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    let date = |i: usize| {
        (chrono::NaiveDate::from_ymd_opt(2020, 1, 1).unwrap() + chrono::Days::new(i as u64))
            .to_string()
    };
    for i in 0..n {
        for (k, (dir, store)) in ledgers.iter().enumerate() {
            let d = date(i);
            let args = [
                "run",
                "daily",
                "--date",
                &d,
                "--store",
                store,
                "--jobs-dir",
                "jobs",
            ];
            completed[k].extend(time_process(&args, dir, 1, Some("completed")).samples);
            skipped[k].extend(time_process(&args, dir, 1, Some("(time_window)")).samples);
        }
    }
    let [with_c, without_c] = completed.map(Stats::new);
    let [with_s, without_s] = skipped.map(Stats::new);
    println!("== the report indexes' cost on the run path (SQLite, {runs} runs in the ledger) ==");
    println!(
        "{}",
        with_c.line("completed `idem run`, with the report indexes")
    );
    println!("{}", without_c.line("completed `idem run`, without them"));
    println!(
        "{}",
        with_s.line("skipped `idem run`, with the report indexes")
    );
    println!("{}", without_s.line("skipped `idem run`, without them"));
    println!(
        "with / without the report indexes, median: completed {:.2}, skipped {:.2} (target ~1.0)",
        with_c.pct(0.5) / without_c.pct(0.5),
        with_s.pct(0.5) / without_s.pct(0.5)
    );
    let _ = std::fs::remove_dir_all(&root);
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing useful: run both.
    hash_throughput();
    skip_latency();
    report_index_cost();
}
