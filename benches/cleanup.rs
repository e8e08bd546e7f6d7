//! `idem cleanup` beside live runs: 1 M expired processing keys (seeded with one bulk
//! `INSERT … SELECT`, not through the API) are cleaned by an `idem cleanup` process while a
//! loop of `idem run` processes completes fresh scopes of another job on the same store.
//! Prints the cleanup's wall time and the runs' wall times during it, next to the same
//! runs without a cleanup (target: no run delayed more than 1 s).
//!
//! `cargo bench --bench cleanup` (SQLite; Postgres too when `IDEM_TEST_POSTGRES_URL` is
//! set: the bench creates and drops a database of its own beside the one named, so the
//! cleanup touches nothing else). `IDEM_BENCH_KEYS` (default 1000000) changes the number
//! of keys, `IDEM_BENCH_BATCH` passes `--batch` (default: the built-in batch size).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection;

const IDEM: &str = env!("CARGO_BIN_EXE_idem");
/// Runs timed without a cleanup beside them.
const BASELINE_RUNS: usize = 30;
/// The target: no run slower than the slowest run without a cleanup by more than this.
const TARGET: Duration = Duration::from_secs(1);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// Wall times, sorted.
struct Times(Vec<Duration>);

impl Times {
    fn new(mut v: Vec<Duration>) -> Self {
        v.sort();
        Times(v)
    }
    fn median(&self) -> Duration {
        self.0[self.0.len() / 2]
    }
    fn max(&self) -> Duration {
        *self.0.last().unwrap()
    }
    fn line(&self) -> String {
        format!(
            "n={:<4} median {:>7.1} ms  longest {:>7.1} ms",
            self.0.len(),
            ms(self.median()),
            ms(self.max())
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A sandbox: a jobs folder with one SQL job on a SQLite warehouse, run against `store`.
struct Bench {
    dir: PathBuf,
    store: String,
    next_day: u32,
}

impl Bench {
    fn new(dir: PathBuf, store: String) -> Self {
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        std::fs::write(
            dir.join("jobs/live.toml"),
            r#"
name = "live"
processor = "sql"
[guards]
time_window = "1h"
[sql]
warehouse = "sqlite://warehouse.db"
setup = "CREATE TABLE IF NOT EXISTS out (day TEXT)"
process = "INSERT INTO out SELECT @scope"
"#,
        )
        .unwrap();
        let bench = Bench {
            dir,
            store,
            next_day: 0,
        };
        bench.idem(&["migrate"]).wait_ok();
        bench
    }

    fn idem(&self, args: &[&str]) -> Child {
        Command::new(IDEM)
            .arg("--store")
            .arg(&self.store)
            .args(args)
            .current_dir(&self.dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn idem")
    }

    /// One `idem run` of a scope never run before (it completes), timed.
    fn run_once(&mut self) -> Duration {
        let day = chrono::NaiveDate::from_ymd_opt(2000, 1, 1).unwrap()
            + chrono::Duration::days(i64::from(self.next_day));
        self.next_day += 1;
        let date = day.format("%Y-%m-%d").to_string();
        let start = Instant::now();
        let out = self.idem(&["run", "live", "--date", &date]).wait_ok();
        let took = start.elapsed();
        assert!(out.contains("completed"), "{out}");
        took
    }
}

trait WaitOk {
    fn wait_ok(self) -> String;
}

impl WaitOk for Child {
    fn wait_ok(self) -> String {
        let out = self.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// One bulk statement: `keys` processing keys of processor `old`, processed in 2020.
async fn seed(store: &str, keys: usize) -> Result<(), sqlx::Error> {
    if let Some(path) = store.strip_prefix("sqlite://") {
        let mut db = sqlx::SqliteConnection::connect(&format!("sqlite://{path}")).await?;
        sqlx::query(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1) \
             INSERT INTO processing_keys (processing_key, kind, processor_name, scope, \
                 scope_date, processed_at, entity_count, run_id) \
             SELECT 'old-' || i, 'scope', 'old', 's' || i, '2020-01-01', \
                 1577836800000000 + i, 1, 'old-run-' || i FROM n",
        )
        .bind(keys as i64)
        .execute(&mut db)
        .await?;
    } else {
        let mut db = sqlx::PgConnection::connect(store).await?;
        sqlx::query(
            "INSERT INTO processing_keys (processing_key, kind, processor_name, scope, \
                 scope_date, processed_at, entity_count, run_id) \
             SELECT 'old-' || i, 'scope', 'old', 's' || i, DATE '2020-01-01', \
                 TIMESTAMPTZ '2020-01-01 00:00:00+00' + i * INTERVAL '1 microsecond', 1, \
                 'old-run-' || i FROM generate_series(1, $1::bigint) AS i",
        )
        .bind(keys as i64)
        .execute(&mut db)
        .await?;
        sqlx::query("ANALYZE processing_keys")
            .execute(&mut db)
            .await?;
    }
    Ok(())
}

fn bench(rt: &tokio::runtime::Runtime, name: &str, dir: &Path, store: String, keys: usize) {
    let batch = std::env::var("IDEM_BENCH_BATCH").ok();
    let mut b = Bench::new(dir.to_path_buf(), store);
    let start = Instant::now();
    rt.block_on(seed(&b.store, keys)).expect("seed");
    let seeded = start.elapsed();
    // Warm up (the warehouse's table, the page cache), then the runs alone.
    for _ in 0..3 {
        b.run_once();
    }
    let alone = Times::new((0..BASELINE_RUNS).map(|_| b.run_once()).collect());

    let mut args = vec!["--format", "json", "cleanup", "--keep", "30d"];
    if let Some(batch) = &batch {
        args.extend(["--batch", batch]);
    }
    let start = Instant::now();
    let mut cleanup = b.idem(&args);
    let mut during = Vec::new();
    let took = loop {
        during.push(b.run_once());
        if cleanup.try_wait().unwrap().is_some() {
            break start.elapsed();
        }
    };
    let report: serde_json::Value = serde_json::from_str(&cleanup.wait_ok()).unwrap();
    let deleted = report["keys_deleted"].as_u64().unwrap_or(0);
    assert_eq!(deleted as usize, keys, "{report}");
    let during = Times::new(during);
    let delay = during.max().saturating_sub(alone.max());
    println!(
        "{name}: {keys} expired keys (seeded by one INSERT … SELECT in {:.1} s), batch {}",
        seeded.as_secs_f64(),
        batch.as_deref().unwrap_or("default (10000)")
    );
    println!(
        "  idem cleanup                 {:>7.2} s  ({deleted} keys deleted, {:.0} keys/s)",
        took.as_secs_f64(),
        deleted as f64 / took.as_secs_f64()
    );
    println!("  idem run, no cleanup beside  {}", alone.line());
    println!("  idem run, during the cleanup {}", during.line());
    println!(
        "  ratio during/alone: median {:.2}, longest {:.2}; longest run delayed {:.0} ms \
         beyond the longest alone (target ≤ {} ms: {})",
        ms(during.median()) / ms(alone.median()),
        ms(during.max()) / ms(alone.max()),
        ms(delay),
        TARGET.as_millis(),
        if delay <= TARGET { "met" } else { "MISSED" }
    );
}

/// A database of the bench's own on the server of `url`: (its URL, its name).
fn own_database(rt: &tokio::runtime::Runtime, url: &str) -> Result<(String, String), String> {
    let mut own = url::Url::parse(url).map_err(|e| e.to_string())?;
    let name = format!("idem_cleanup_bench_{}", std::process::id());
    own.set_path(&name);
    rt.block_on(async {
        let mut admin = sqlx::PgConnection::connect(url).await?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .map(|_| ())
    })
    .map_err(|e| e.to_string())?;
    Ok((own.to_string(), name))
}

fn drop_database(rt: &tokio::runtime::Runtime, url: &str, name: &str) {
    let dropped = rt.block_on(async {
        let mut admin = sqlx::PgConnection::connect(url).await?;
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut admin)
            .await
    });
    if let Err(e) = dropped {
        eprintln!("could not drop {name}: {e}");
    }
}

fn main() {
    let keys = env_usize("IDEM_BENCH_KEYS", 1_000_000);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let root = std::env::temp_dir().join(format!("idem-cleanup-bench-{}", std::process::id()));
    let dir = root.join("sqlite");
    bench(
        &rt,
        "sqlite",
        &dir,
        format!("sqlite://{}", dir.join("idem.db").display()),
        keys,
    );
    match std::env::var("IDEM_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    {
        None => println!("postgres: skipped (set IDEM_TEST_POSTGRES_URL)"),
        Some(url) => match own_database(&rt, &url) {
            Err(e) => println!("postgres: skipped (cannot create a database of its own: {e})"),
            Ok((own, name)) => {
                bench(&rt, "postgres", &root.join("postgres"), own, keys);
                drop_database(&rt, &url, &name);
            }
        },
    }
    let _ = std::fs::remove_dir_all(&root);
}
