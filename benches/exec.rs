//! `idem exec NAME -- true` against `true` alone, in the same run: what the guards cost a
//! crontab line (process start, the store's claim and record, the child's start and wait).
//!
//! ```text
//! cargo bench --bench exec
//! ```
//!
//! `IDEM_BENCH_RUNS` (default 200) invocations of each case, interleaved in rounds of ten;
//! the mean and median wall time per invocation and their ratio to `true` alone are
//! printed. The SQLite case is the embedded default (a new date each time, so nothing
//! skips: every run claims, runs and records); the memory case shows idem's own start.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const IDEM: &str = env!("CARGO_BIN_EXE_idem");

fn time(cmd: &mut Command) -> Duration {
    let start = Instant::now();
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("start");
    let took = start.elapsed();
    assert!(status.success(), "{cmd:?}: {status}");
    took
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn mean(v: &[Duration]) -> Duration {
    v.iter().sum::<Duration>() / v.len() as u32
}

fn main() {
    let runs: usize = std::env::var("IDEM_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let dir = std::env::temp_dir().join(format!("idem-bench-exec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite://{}", dir.join("idem.db").display());
    let status = Command::new(IDEM)
        .args(["migrate", "--store", &store])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let (mut alone, mut sqlite, mut memory) = (Vec::new(), Vec::new(), Vec::new());
    let day = chrono::NaiveDate::from_ymd_opt(2000, 1, 1).unwrap();
    for i in 0..runs {
        if i % 10 == 0 {
            // A warm-up of each, not counted: the page cache and the binary's pages.
            time(Command::new("true").current_dir(&dir));
        }
        alone.push(time(Command::new("true").current_dir(&dir)));
        let date = (day + chrono::Days::new(i as u64)).to_string();
        sqlite.push(time(
            Command::new(IDEM)
                .args(["exec", "bench", "--date", &date, "--time-window", "1h"])
                .args(["--store", &store, "--", "true"])
                .current_dir(&dir),
        ));
        memory.push(time(
            Command::new(IDEM)
                .args(["exec", "bench", "--date", &date, "--store", "memory://"])
                .args(["--", "true"])
                .current_dir(&dir),
        ));
    }
    let base = mean(&alone);
    println!("{runs} invocations each, interleaved:");
    for (name, v) in [
        ("true alone", &alone),
        ("idem exec (SQLite ledger) -- true", &sqlite),
        ("idem exec (memory store) -- true", &memory),
    ] {
        println!(
            "  {name:<36} mean {:>8.2} ms  median {:>8.2} ms  ratio to true alone {:>6.1}",
            mean(v).as_secs_f64() * 1e3,
            median(v.clone()).as_secs_f64() * 1e3,
            mean(v).as_secs_f64() / base.as_secs_f64()
        );
    }
    println!(
        "  overhead of idem exec on SQLite: {:.2} ms per invocation",
        (mean(&sqlite).as_secs_f64() - base.as_secs_f64()) * 1e3
    );
    let _ = std::fs::remove_dir_all(&dir);
}
