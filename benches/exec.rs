//! What `idem exec NAME -- true` costs a crontab line, against the wrapper it replaces
//! (`flock -n LOCK true`, the floor) in the same run, and where idem's time goes.
//!
//! ```text
//! cargo bench --bench exec
//! ```
//!
//! `IDEM_BENCH_RUNS` (default 200) invocations of each case, interleaved (one of each in
//! turn, each round in another order, so a busy moment of the machine falls on every
//! case alike); the mean and median
//! wall time per invocation and the ratio of the medians to `flock -n` are printed. The
//! cases:
//!
//! * `true` alone, and `flock -n LOCK true`: the floor a wrapper is measured against;
//! * `idem --version`: idem's process start (the binary loaded, the arguments parsed);
//! * `idem exec` on the memory store: that, plus the runtime, the signal handlers, the job
//!   built and checked, the program and its watchdog started, the tree looked for, the
//!   run recorded in memory;
//! * `/bin/sh -c 'read l'` with nothing to read: what the watchdog process costs to start
//!   and end (part of the line above);
//! * `idem exec` on SQLite, a full run (a new date each time: the claim, the program, the
//!   record) and a skip (a date done already: one read, no program), the embedded default.
//!
//! `IDEM_BENCH_BEFORE=PATH` adds the idem cases run by another `idem` binary (an earlier
//! build, e.g. main's `target/release/idem` copied aside), interleaved with the rest, for a
//! before/after on one machine in one run. `IDEM_BENCH_BIN=PATH` runs this build's cases
//! from a copy (default: cargo's `target/release/idem`): put both copies in one folder,
//! since where a binary lies changes how fast it starts (on this project's machine a copy
//! in /tmp started 3–5 ms sooner than the same file in `target/release`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The idem binary of this build's cases.
fn idem() -> String {
    std::env::var("IDEM_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_idem").to_string())
}

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

/// `0..n` in an order drawn from `seed` (xorshift64 and Fisher–Yates: no crate needed).
fn shuffled(n: usize, seed: &mut u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        order.swap(i, (*seed % (i as u64 + 1)) as usize);
    }
    order
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let runs: usize = std::env::var("IDEM_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let dir = std::env::temp_dir().join(format!("idem-bench-exec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite://{}", dir.join("idem.db").display());
    let lock = dir.join("lock");
    let idem = idem();
    let status = Command::new(&idem)
        .args(["migrate", "--store", &store])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let before = std::env::var("IDEM_BENCH_BEFORE").ok();
    let exec_with = |bin: &str, name: &str, date: &str, store: &str| {
        let mut c = Command::new(bin);
        c.args(["exec", name, "--date", date, "--time-window", "20h"])
            .args(["--store", store, "--", "true"])
            .current_dir(&dir);
        c
    };
    let exec = |name: &str, date: &str, store: &str| exec_with(&idem, name, date, store);
    // The date the skips find done (each binary its own ledger: they may differ in schema).
    time(&mut exec("bench-skip", "1999-12-31", &store));
    let before_store = format!("sqlite://{}", dir.join("before.db").display());
    if let Some(bin) = &before {
        time(&mut exec_with(
            bin,
            "bench-skip",
            "1999-12-31",
            &before_store,
        ));
    }
    let day = chrono::NaiveDate::from_ymd_opt(2000, 1, 1).unwrap();
    let mut names = vec![
        "true alone",
        "flock -n LOCK true",
        "idem --version",
        "/bin/sh -c 'read l' (the watchdog)",
        "idem exec -- true, memory store",
        "idem exec -- true, SQLite, full run",
        "idem exec -- true, SQLite, skip",
    ];
    if before.is_some() {
        names.extend([
            "before: idem exec, memory store",
            "before: idem exec, SQLite, full run",
            "before: idem exec, SQLite, skip",
        ]);
    }
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..runs {
        let date = (day + chrono::Days::new(i as u64)).to_string();
        let mut cases = [
            Command::new("true"),
            {
                let mut c = Command::new("flock");
                c.arg("-n").arg(&lock).arg("true");
                c
            },
            {
                let mut c = Command::new(&idem);
                c.arg("--version");
                c
            },
            {
                let mut c = Command::new("/bin/sh");
                c.args(["-c", "read l || exit 0"]);
                c
            },
            exec("bench-memory", &date, "memory://"),
            exec("bench-full", &date, &store),
            exec("bench-skip", "1999-12-31", &store),
        ]
        .into_iter()
        .collect::<Vec<_>>();
        if let Some(bin) = &before {
            cases.extend([
                exec_with(bin, "bench-memory", &date, "memory://"),
                exec_with(bin, "bench-full", &date, &before_store),
                exec_with(bin, "bench-skip", "1999-12-31", &before_store),
            ]);
        }
        if i % 10 == 0 {
            // A warm-up of each, not counted: the page cache and the binary's pages.
            for c in cases.iter_mut() {
                time(c);
            }
            time(&mut exec("bench-warm", &date, &store));
        }
        // Each round in another order, so no case always follows the same one (a full
        // run's writes, or another idem process: either slows what comes next).
        for j in shuffled(cases.len(), &mut seed) {
            times[j].push(time(&mut cases[j]));
        }
    }
    let medians: Vec<Duration> = times.iter().map(|t| median(t.clone())).collect();
    let floor = medians[1];
    println!("{runs} invocations of each, interleaved:");
    for ((name, t), m) in names.iter().zip(&times).zip(&medians) {
        println!(
            "  {name:<38} mean {:>7.2} ms  median {:>7.2} ms  ratio to flock -n {:>5.1}",
            ms(mean(t)),
            ms(*m),
            m.as_secs_f64() / floor.as_secs_f64()
        );
    }
    let [alone, flock, version, watchdog, memory, full, skip] = medians[..7] else {
        unreachable!()
    };
    println!("where idem's time goes (differences of medians):");
    println!(
        "  process start (idem --version − true)                      {:>6.2} ms",
        ms(version.saturating_sub(alone))
    );
    println!(
        "  runtime, signals, job, program + watchdog, tree (memory − --version − true) {:>6.2} ms, of which the watchdog's /bin/sh ≈ {:.2} ms",
        ms(memory.saturating_sub(version).saturating_sub(alone)),
        ms(watchdog)
    );
    println!(
        "  the SQLite store: open, claim, record (full run − memory)  {:>6.2} ms",
        ms(full.saturating_sub(memory))
    );
    println!(
        "  a skip against a full run (skip − full run)                {:>6.2} ms",
        ms(skip) - ms(full)
    );
    println!(
        "  idem exec's overhead over flock -n: full run +{:.2} ms, skip +{:.2} ms",
        ms(full) - ms(flock),
        ms(skip) - ms(flock)
    );
    if let [b_memory, b_full, b_skip] = medians[7..] {
        println!(
            "  before → now (medians): memory store {:.2} → {:.2} ms, SQLite full run {:.2} → {:.2} ms, skip {:.2} → {:.2} ms",
            ms(b_memory),
            ms(memory),
            ms(b_full),
            ms(full),
            ms(b_skip),
            ms(skip)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
