//! A fault soak (issue 21.13): for a while, `idem run`, `idem scheduler` and `idem gate`
//! processes on one Postgres store are started side by side and killed at random moments
//! (SIGKILL and SIGTERM, from a seeded generator), while the store drops every connection
//! now and then (`pg_terminate_backend`). Then an invariant checker reads the ledger, the
//! keys and every output:
//!
//! * one completion per scope (the job has a 1 h time window: a scope completes once);
//! * no key without a completed run (keys are written with the completion, never alone);
//! * every event of the gate's input is reported `new` at least once, across every output
//!   (the killed gates' complete records and a last clean run), or it is not marked.
//!
//! `cargo test --test it soak::` runs a smoke of about 20 s (what CI runs);
//! `IDEM_SOAK_SECONDS=600 cargo test --release --test it soak:: -- --nocapture` soaks for ten
//! minutes. `IDEM_SOAK_SEED=N` replays a run (the seed is printed).

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common;

use common::Sandbox;

/// A small deterministic generator (xorshift), so a failing soak can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A process under test: what it is, and where its output goes (gates).
struct Proc {
    kind: &'static str,
    child: Child,
    started: Instant,
    /// Killed after this long (None: let it finish).
    kill_after: Option<(Duration, &'static str)>,
}

#[derive(Default, Debug)]
struct Figures {
    spawned: HashMap<&'static str, u64>,
    sigkill: u64,
    sigterm: u64,
    /// Connections `pg_terminate_backend` really ended (not attempts).
    connections_dropped: u64,
}

fn signal(child: &Child, which: &str) {
    let _ = std::process::Command::new("kill")
        .args([&format!("-{which}"), &child.id().to_string()])
        .status();
}

/// Complete NDJSON records of an output file (a record cut by a kill is not counted).
fn complete_records(path: &Path) -> Vec<Value> {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    complete
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn job(name: &str) -> String {
    format!(
        r#"
name = "{name}"
processor = "sql"
schedule = "* * * * * *"
timezone = "UTC"
[guards]
time_window = "1h"
lease = "2s"
[sql]
warehouse = "sqlite://wh.db"
setup = "CREATE TABLE IF NOT EXISTS out (run_id TEXT, day TEXT)"
process = """WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000) SELECT count(*) FROM c; INSERT INTO out VALUES (@run_id, @scope)"""
"#
    )
}

/// Drops every other connection to the soak's database: how many it dropped (0 when none
/// was open). Failing to reach the database to drop them fails the soak.
fn drop_connections(url: &str) -> u64 {
    let url = url.to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let pool = sqlx::PgPool::connect(&url)
            .await
            .expect("connect to drop the others' connections");
        let dropped: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
             AND backend_type = 'client backend'",
        )
        .fetch_all(&pool)
        .await
        .expect("pg_terminate_backend");
        pool.close().await;
        dropped.into_iter().filter(|d| *d).count() as u64
    })
}

/// (keys without a completed run, completions per scope) for processor `job`.
fn ledger_facts(url: &str, job: &str) -> (i64, HashMap<String, i64>) {
    let (url, job) = (url.to_string(), job.to_string());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let orphans: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM processing_keys k WHERE k.processor_name = $1 AND NOT EXISTS \
             (SELECT 1 FROM processing_runs r WHERE r.run_id = k.run_id AND r.status = 'completed')",
        )
        .bind(&job)
        .fetch_one(&pool)
        .await
        .unwrap();
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT scope, count(*) FROM processing_runs WHERE processor_name = $1 \
             AND status = 'completed' GROUP BY scope",
        )
        .bind(&job)
        .fetch_all(&pool)
        .await
        .unwrap();
        pool.close().await;
        (orphans, rows.into_iter().collect())
    })
}

#[test]
fn fault_soak_keeps_every_invariant() {
    let Some(shared) = common::postgres_url("fault_soak_keeps_every_invariant") else {
        return;
    };
    // A database of its own: the soak drops every connection to its database, and the
    // other integration tests run beside it in this process.
    let scratch = common::PgScratch::database(&shared, "idem_soak");
    let url = scratch.url.clone();
    let seconds: u64 = std::env::var("IDEM_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("IDEM_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("soak: {seconds} s, seed {seed} (IDEM_SOAK_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let sb = Sandbox::with_store("idem-soak", &url);
    let name = format!("soak_{}", &idem::new_run_id()[..8]);
    sb.write_job(&name, &job(&name));
    assert_eq!(sb.idem(&["migrate"]).status.code(), Some(0));

    // The gate's input: 3,000 events, a third of them redelivered.
    let input = sb.dir.join("events.ndjson");
    let namespace = format!("soak-{}", &idem::new_run_id()[..8]);
    let mut lines = String::new();
    let mut keys: HashSet<String> = HashSet::new();
    for i in 0..3000u64 {
        let k = if i % 3 == 2 { rng.below(i) } else { i };
        keys.insert(format!("ev{k}"));
        lines.push_str(&format!("{{\"id\":\"ev{k}\",\"amount\":{k}}}\n"));
    }
    std::fs::write(&input, lines).unwrap();
    let gate_args = |out: &Path| -> Vec<String> {
        [
            "gate",
            "--key",
            "id",
            "--namespace",
            &namespace,
            "--batch",
            "100",
            "--pending-timeout",
            "1s",
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };

    // Many dates, so runs keep finding work to do (and to be killed in) all soak long.
    let first_day = chrono::NaiveDate::from_ymd_opt(2026, 1, 1).unwrap();
    let dates: Vec<String> = (0..(seconds * 4).max(40))
        .map(|d| (first_day + chrono::Duration::days(d as i64)).to_string())
        .collect();
    let mut figures = Figures::default();
    let mut running: Vec<Proc> = Vec::new();
    let mut gate_outputs: Vec<PathBuf> = Vec::new();
    let started = Instant::now();
    let mut n = 0u64;
    // The soak lasts `seconds`, and longer (up to a minute more) until a connection was
    // really dropped, a process killed and a scope completed, so a short soak is a soak too.
    let enough = |f: &Figures| {
        f.connections_dropped > 0
            && f.sigkill + f.sigterm > 0
            && !ledger_facts(&url, &name).1.is_empty()
    };
    while started.elapsed() < Duration::from_secs(seconds)
        || (started.elapsed() < Duration::from_secs(seconds + 60) && !enough(&figures))
    {
        // Keep a few processes going.
        while running.len() < 4 {
            n += 1;
            let kill_after = match rng.below(4) {
                0 => None,
                1 => Some((Duration::from_millis(rng.below(1500)), "TERM")),
                _ => Some((Duration::from_millis(rng.below(1500)), "KILL")),
            };
            let (kind, args): (&'static str, Vec<String>) = match rng.below(5) {
                0 | 1 => (
                    "run",
                    vec![
                        "run".into(),
                        name.clone(),
                        "--date".into(),
                        dates[rng.below(dates.len() as u64) as usize].clone(),
                    ],
                ),
                2 => (
                    "scheduler",
                    vec!["scheduler".into(), "--grace".into(), "1s".into()],
                ),
                _ => {
                    let out = sb.dir.join(format!("gate-{n}.ndjson"));
                    gate_outputs.push(out.clone());
                    ("gate", gate_args(&out))
                }
            };
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let child = sb
                .command(&refs)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start idem");
            *figures.spawned.entry(kind).or_default() += 1;
            running.push(Proc {
                kind,
                child,
                started: Instant::now(),
                kill_after,
            });
        }
        if rng.below(40) == 0 {
            figures.connections_dropped += drop_connections(&url);
        }
        for p in &mut running {
            if let Some((after, sig)) = p.kill_after {
                if p.started.elapsed() >= after {
                    signal(&p.child, sig);
                    if sig == "KILL" {
                        figures.sigkill += 1;
                    } else {
                        figures.sigterm += 1;
                    }
                    p.kill_after = None;
                }
            }
            // A scheduler is stopped after a while even when it drew no kill.
            if p.kind == "scheduler"
                && p.kill_after.is_none()
                && p.started.elapsed() > Duration::from_secs(3)
            {
                signal(&p.child, "TERM");
                figures.sigterm += 1;
                p.kill_after = Some((Duration::MAX, "TERM"));
            }
        }
        running.retain_mut(|p| !matches!(p.child.try_wait(), Ok(Some(_))));
        std::thread::sleep(Duration::from_millis(20));
    }
    for mut p in running {
        signal(&p.child, "TERM");
        let deadline = Instant::now() + Duration::from_secs(20);
        while p.child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = p.child.kill();
        let _ = p.child.wait();
    }

    // A last clean gate run (it waits out the killed gates' pending marks).
    let last = sb.dir.join("gate-last.ndjson");
    let args = gate_args(&last);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = sb.command(&refs).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        complete_records(&last).len(),
        3000,
        "the last clean gate reports every line"
    );
    gate_outputs.push(last);

    // The faults happened: else the invariants below hold trivially.
    assert!(
        figures.connections_dropped > 0,
        "no connection was dropped in {seconds} s: {figures:?}"
    );
    assert!(
        figures.sigkill + figures.sigterm > 0,
        "no process was killed: {figures:?}"
    );

    // The invariants.
    let (orphans, completions) = ledger_facts(&url, &name);
    // Work was done through the faults: a soak where nothing completes proves nothing.
    assert!(
        !completions.is_empty(),
        "no scope completed in {seconds} s: {figures:?}"
    );
    assert_eq!(orphans, 0, "keys without a completed run");
    for (scope, n) in &completions {
        assert_eq!(
            *n, 1,
            "scope {scope} completed {n} times inside its time window"
        );
    }
    let mut reported_new: HashSet<String> = HashSet::new();
    let mut records = 0;
    for path in &gate_outputs {
        for r in complete_records(path) {
            records += 1;
            if r["verdict"] == "new" {
                reported_new.insert(r["key"].as_str().unwrap_or_default().to_string());
            }
        }
    }
    let lost: Vec<&String> = keys.difference(&reported_new).collect();
    assert!(
        lost.is_empty(),
        "{} event(s) marked and never reported new: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    let (_, runs, _) = sb.json(&["runs", "--job", &name, "--limit", "0"]);
    let mut by_status: HashMap<String, u64> = HashMap::new();
    for r in runs.as_array().unwrap() {
        let status = match (r["status"].as_str(), r["error"].as_str()) {
            (Some("failed"), Some(e)) if e.contains("interrupted") => "interrupted".to_string(),
            (Some(s), _) => s.to_string(),
            _ => "?".to_string(),
        };
        *by_status.entry(status).or_default() += 1;
    }
    eprintln!(
        "soak: {} s, seed {seed}: spawned {:?}; {} SIGKILL, {} SIGTERM, {} connection drops; \
         runs by status {:?}; {} scopes completed once each; {} gate outputs, {records} records, \
         all {} events reported new at least once; 0 keys without a completed run",
        started.elapsed().as_secs(),
        figures.spawned,
        figures.sigkill,
        figures.sigterm,
        figures.connections_dropped,
        by_status,
        completions.len(),
        gate_outputs.len(),
        keys.len()
    );
}
