//! One `idem scheduler` with N command jobs (`run = ["true"]`) all due in the same second,
//! on SQLite and on Postgres (issue 32): every fire recorded, the fire lag (the slot to the
//! run's start, from the ledger), when the last run was recorded (after the slot), and the
//! scheduler's peak RSS.
//!
//! ```text
//! IDEM_TEST_POSTGRES_URL=postgres://USER@HOST/DB cargo bench --bench scheduler
//! ```
//!
//! `IDEM_BENCH_JOBS` (default `100,300,1000`) sets the sizes. Without a Postgres URL only
//! SQLite runs. The Postgres server's `max_connections` is printed beside its figures.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

const IDEM: &str = env!("CARGO_BIN_EXE_idem");

struct Figures {
    fired: usize,
    recorded: usize,
    completed: usize,
    lag_p50: f64,
    lag_p95: f64,
    last_recorded: f64,
    peak_rss_mib: f64,
}

fn idem(dir: &Path, store: &str, args: &[&str]) -> Command {
    let mut c = Command::new(IDEM);
    c.args(["--store", store, "--jobs-dir"])
        .arg(dir.join("jobs"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("IDEM_STORE")
        .stdin(Stdio::null());
    c
}

/// The child's peak resident set, in MiB, once it has exited (`wait4`'s `ru_maxrss`).
fn wait_peak_rss(pid: u32) -> f64 {
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter; pid is our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(r, pid as libc::pid_t, "wait4");
    usage.ru_maxrss as f64 / 1024.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

// The scheduler is waited for with `wait4` (for its own peak RSS), not `Child::wait`.
#[allow(clippy::zombie_processes)]
fn run(store: &str, jobs: usize, label: &str) -> Figures {
    let dir = std::env::temp_dir().join(format!(
        "idem-bench-scheduler-{label}-{jobs}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(dir.join("jobs")).unwrap();
    let prefix = format!("bench{}x{jobs}", &idem::new_run_id()[..6]);
    let status = idem(&dir, store, &["migrate"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "migrate {store}");
    // Due 5 s from now, at a whole second.
    let slot = Utc::now().timestamp() + 5;
    let second = slot.rem_euclid(60);
    for i in 0..jobs {
        std::fs::write(
            dir.join("jobs").join(format!("{prefix}-{i}.toml")),
            format!(
                "name = \"{prefix}-{i}\"\nprocessor = \"command\"\nschedule = \"{second} * * * * *\"\n\
                 [command]\nrun = [\"true\"]\n"
            ),
        )
        .unwrap();
    }
    let mut child = idem(&dir, store, &["scheduler"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    let reader = std::thread::spawn(move || {
        let mut log = String::new();
        let mut buf = [0u8; 65536];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            log.push_str(&String::from_utf8_lossy(&buf[..n]));
            let _ = tx.send(log.matches(" fire ").count());
        }
        log
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    while let Ok(fired) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        if fired >= jobs {
            break;
        }
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let peak_rss_mib = wait_peak_rss(child.id());
    let log = reader.join().unwrap();
    let out = idem(&dir, store, &["runs", "--limit", "0", "--format", "json"])
        .output()
        .unwrap();
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let slot = DateTime::from_timestamp(slot, 0).unwrap();
    let mine: Vec<&serde_json::Value> = runs
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["processor"].as_str().unwrap().starts_with(&prefix))
        .collect();
    let at = |r: &serde_json::Value, f: &str| -> f64 {
        let t: DateTime<Utc> = r[f].as_str().unwrap().parse().unwrap();
        (t - slot).num_microseconds().unwrap() as f64 / 1e6
    };
    let mut lags: Vec<f64> = mine.iter().map(|r| at(r, "started_at")).collect();
    lags.sort_by(f64::total_cmp);
    let last_recorded = mine
        .iter()
        .map(|r| at(r, "finished_at"))
        .fold(f64::NAN, f64::max);
    let _ = std::fs::remove_dir_all(&dir);
    Figures {
        fired: log.matches(" fire ").count(),
        recorded: mine.len(),
        completed: mine.iter().filter(|r| r["status"] == "completed").count(),
        lag_p50: percentile(&lags, 0.5),
        lag_p95: percentile(&lags, 0.95),
        last_recorded,
        peak_rss_mib,
    }
}

fn max_connections(url: &str) -> String {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(url).await.ok()?;
        sqlx::query_scalar::<_, String>("SHOW max_connections")
            .fetch_one(&mut conn)
            .await
            .ok()
    })
    .unwrap_or_else(|| "?".into())
}

fn main() {
    let sizes: Vec<usize> = std::env::var("IDEM_BENCH_JOBS")
        .unwrap_or_else(|_| "100,300,1000".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let mut stores = Vec::new();
    let sqlite_dir = std::env::temp_dir().join(format!("idem-bench-sched-{}", std::process::id()));
    std::fs::create_dir_all(&sqlite_dir).unwrap();
    stores.push(("sqlite".to_string(), String::new()));
    if let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") {
        stores.push((
            format!("postgres (max_connections {})", max_connections(&url)),
            url,
        ));
    }
    println!("| store | jobs | fired | recorded | completed | fire lag p50 | fire lag p95 | last recorded | peak RSS |");
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|");
    for (label, url) in &stores {
        for &jobs in &sizes {
            let store = if url.is_empty() {
                let file = sqlite_dir.join(format!("ledger-{jobs}.db"));
                format!("sqlite://{}", file.display())
            } else {
                url.clone()
            };
            let f = run(&store, jobs, label.split(' ').next().unwrap());
            println!(
                "| {label} | {jobs} | {} | {} | {} | {:.2} s | {:.2} s | {:.2} s | {:.0} MiB |",
                f.fired,
                f.recorded,
                f.completed,
                f.lag_p50,
                f.lag_p95,
                f.last_recorded,
                f.peak_rss_mib
            );
        }
    }
    let _ = std::fs::remove_dir_all(&sqlite_dir);
}
