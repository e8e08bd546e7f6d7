//! One process, one store (issue 32): idem never touches a SQLite ledger with ordinary file
//! I/O beside SQLite's own connections (closing any descriptor of a file drops every POSIX
//! lock the process holds on it, SQLite's included), and a process opens one store per URL.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sqlx::Connection;

use crate::common;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-one-store-{name}-{}", idem::new_run_id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Whether another process can take SQLite's write lock on `db` right now (Python's
/// `sqlite3`, no busy wait): `Some(true)` it could, `Some(false)` the database is locked,
/// `None` python3 is not there.
fn another_process_can_write(db: &Path) -> Option<bool> {
    let script = "import sqlite3, sys\n\
                  c = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)\n\
                  try:\n    c.execute('BEGIN IMMEDIATE')\nexcept sqlite3.OperationalError as e:\n    \
                  print('locked:', e); sys.exit(3)\n\
                  c.execute('ROLLBACK')\nprint('took the write lock')\n";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(db)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    match out.status.code() {
        Some(0) => Some(true),
        Some(3) => Some(false),
        _ => panic!(
            "python3 sqlite3 check failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// The mechanism behind the lost commits of a 100-job scheduler on SQLite: while a
/// connection of this process holds the ledger's write lock, opening the ledger again in
/// this process (as each job of a scheduler did) must not release that lock. It did: the
/// open read the file's header with `std::fs`, and closing that descriptor dropped the
/// process's locks, letting a second writer in.
#[tokio::test]
async fn opening_a_ledger_again_keeps_the_write_lock_another_connection_holds() {
    let dir = temp_dir("lock");
    let db = dir.join("idem.db");
    let url = format!("sqlite://{}", db.display());
    let _store = idem::store::open(&url).await.expect("create the ledger");
    let mut writer = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut writer)
        .await
        .unwrap();
    let Some(before) = another_process_can_write(&db) else {
        common::skip("skipped opening_a_ledger_again_…: python3 is not installed".into());
        return;
    };
    assert!(
        !before,
        "a write transaction of this process locks out the others"
    );
    for _ in 0..3 {
        let _again = idem::store::open(&url)
            .await
            .expect("open the ledger again");
        assert_eq!(
            another_process_can_write(&db),
            Some(false),
            "opening the ledger again in this process released the write lock a connection \
             of this process holds: two writers could commit at once"
        );
    }
    sqlx::query("ROLLBACK").execute(&mut writer).await.unwrap();
    assert_eq!(another_process_can_write(&db), Some(true));
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a scheduler said of one fire: the job, the outcome's first word, the run id.
#[derive(Debug)]
struct FireLine {
    job: String,
    outcome: String,
    run_id: String,
}

/// The `fire JOB slot … date …: OUTCOME…; run ID` lines of a scheduler's log.
fn fire_lines(log: &str) -> Vec<FireLine> {
    log.lines()
        .filter_map(|line| {
            let rest = &line[line.find(" fire ")? + " fire ".len()..];
            let job = rest.split(' ').next()?.to_string();
            let outcome = rest
                .split(": ")
                .nth(1)?
                .split([',', ' '])
                .next()?
                .to_string();
            let run_id = line
                .rsplit("; run ")
                .next()?
                .split([';', ' '])
                .next()?
                .to_string();
            Some(FireLine {
                job,
                outcome,
                run_id,
            })
        })
        .collect()
}

/// `jobs` command jobs (`true`) of a scheduler, all due at the same second, a few seconds
/// from now: every fire is logged completed, and the ledger holds exactly those runs,
/// matched run id by run id.
fn a_scheduler_of_many_jobs_records_every_fire(store: &str, jobs: usize, round: usize) {
    use std::io::Read;
    let s = common::Sandbox::with_store("idem-one-store-sched", store);
    let prefix = format!("r{round}x{}", &idem::new_run_id()[..8]);
    let now = chrono::Utc::now().timestamp();
    let second = (now + 4).rem_euclid(60);
    for i in 0..jobs {
        s.write_job(
            &format!("{prefix}-{i}"),
            &format!(
                "name = \"{prefix}-{i}\"\nprocessor = \"command\"\nschedule = \"{second} * * * * *\"\n\
                 [command]\nrun = [\"true\"]\n"
            ),
        );
    }
    let mut child = s
        .command(&["scheduler"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start idem scheduler");
    // The log is read as it comes; the test waits for every job's fire line (a state),
    // at most two minutes.
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        let mut buf = [0u8; 8192];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.push_str(&String::from_utf8_lossy(&buf[..n]));
            let _ = tx.send(all.clone());
        }
        all
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(log) if fire_lines(&log).len() >= jobs => break,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    let log = reader.join().unwrap();
    assert!(status.success(), "scheduler exit {status}: {log}");
    let fires = fire_lines(&log);
    assert_eq!(fires.len(), jobs, "one fire line per job:\n{log}");
    let not_completed: Vec<&FireLine> = fires.iter().filter(|f| f.outcome != "completed").collect();
    assert!(
        not_completed.is_empty(),
        "fires not completed: {not_completed:?}\n{log}"
    );
    let (code, runs, err) = s.json(&["runs", "--limit", "0"]);
    assert_eq!(code, 0, "{err}");
    let ledger: std::collections::BTreeMap<String, (String, String)> = runs
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["processor"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{prefix}-"))
        })
        .map(|r| {
            (
                r["run_id"].as_str().unwrap().to_string(),
                (
                    r["processor"].as_str().unwrap().to_string(),
                    r["status"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect();
    let lost: Vec<&FireLine> = fires
        .iter()
        .filter(|f| ledger.get(&f.run_id) != Some(&(f.job.clone(), "completed".to_string())))
        .collect();
    assert!(
        lost.is_empty(),
        "{} run(s) logged completed have no completed ledger row: {lost:?}",
        lost.len()
    );
    assert_eq!(
        ledger.len(),
        jobs,
        "the ledger holds exactly the fires logged"
    );
}

/// Ten rounds, each its own scheduler process and ledger, five at a time: a round is
/// mostly the wait for its jobs' second, and rounds side by side add load, which is what
/// lost runs before.
#[test]
fn a_scheduler_of_150_jobs_on_sqlite_loses_no_committed_run_in_10_rounds() {
    for wave in [0..5, 5..10] {
        std::thread::scope(|scope| {
            for round in wave {
                scope.spawn(move || {
                    let dir = temp_dir("sched");
                    let store = format!("sqlite://{}", dir.join("idem.db").display());
                    a_scheduler_of_many_jobs_records_every_fire(&store, 150, round);
                    let _ = std::fs::remove_dir_all(&dir);
                });
            }
        });
    }
}

#[test]
fn a_scheduler_of_150_jobs_on_postgres_records_every_fire() {
    let Some(url) = common::postgres_url("a_scheduler_of_150_jobs_on_postgres_records_every_fire")
    else {
        return;
    };
    a_scheduler_of_many_jobs_records_every_fire(&url, 150, 0);
}

/// A 2 MiB tmpfs mounted for a test (unmounted on drop), or `None` after saying why it is
/// skipped (mounting needs root; CI runs as root, so it runs there).
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    fn mount(test: &str) -> Option<SmallDisk> {
        let dir = temp_dir("disk");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
            .arg(&dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(SmallDisk { dir }),
            other => {
                let why = match other {
                    Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
                    Err(e) => e.to_string(),
                };
                let _ = std::fs::remove_dir_all(&dir);
                common::skip(format!(
                    "skipped {test}: cannot mount a small tmpfs ({why})"
                ));
                None
            }
        }
    }

    /// Fills the disk: a file grows until the disk refuses.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.dir.join("filler")).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).and_then(|_| f.flush()).is_ok() {}
    }

    fn free(&self) {
        std::fs::remove_file(self.dir.join("filler")).unwrap();
    }

    /// Makes the disk read-only where the test sees it: a read-only bind mount of it over
    /// itself. Not `remount,ro` of the tmpfs: Linux refuses that ("mount point is busy")
    /// while any file of the disk is open for writing or deleted and not yet let go,
    /// which a SQLite file just closed by another thread can still be on a busy machine;
    /// a new bind mount has no writers of its own.
    fn read_only(&self) {
        for args in [&["--bind"][..], &["-o", "remount,bind,ro"][..]] {
            let out = Command::new("mount")
                .args(args)
                .arg(&self.dir)
                .arg(&self.dir)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "mount {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazily: a store's worker thread may still be closing its file as the test ends.
        // Until nothing is mounted there (a read-only bind mount lies over the tmpfs).
        for _ in 0..3 {
            let unmounted = Command::new("umount")
                .arg("-l")
                .arg(&self.dir)
                .stderr(std::process::Stdio::null())
                .status();
            if !unmounted.is_ok_and(|s| s.success()) {
                break;
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `idem --store STORE exec ARGS` in the sandbox (`exec` passes what follows `--` to the
/// program, so the store comes first).
fn exec(s: &common::Sandbox, args: &[&str]) -> Command {
    let mut c = Command::new(common::IDEM);
    c.args(["--store", &s.store, "exec"])
        .args(args)
        .current_dir(&s.dir)
        .env_remove("IDEM_STORE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    c
}

/// A full disk never lets a run in: three `idem exec` of one date started at once on a
/// ledger whose disk is full each exit 3 without starting the program (on main each took
/// the lease: the claim's row came back before its commit failed, and all three ran). Once
/// the disk has room, the date runs once.
#[test]
fn on_a_full_disk_no_exec_starts_its_program_and_each_says_the_store_is_unavailable() {
    let Some(disk) = SmallDisk::mount("on_a_full_disk_no_exec_starts_its_program…") else {
        return;
    };
    let store = format!("sqlite://{}", disk.dir.join("l.db").display());
    let s = common::Sandbox::with_store("idem-one-store-full", &store);
    assert!(s.idem(&["migrate"]).status.success());
    // The premise: SQLite holds no room of its own on the disk (a write-ahead log left
    // behind, already checkpointed, is reused in place: a claim would fit in it).
    assert_closed(&disk.dir.join("l.db"), "idem migrate");
    disk.fill();
    let children: Vec<_> = (0..3)
        .map(|i| {
            let marker = s.dir.join(format!("ran-{i}"));
            exec(
                &s,
                &[
                    "full",
                    "--date",
                    "2026-01-01",
                    "--lease",
                    "1m",
                    "--",
                    "touch",
                ],
            )
            .arg(&marker)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(3),
            "exit 3, store unavailable: {stderr}"
        );
        assert!(stderr.contains("unavailable"), "{stderr}");
    }
    for i in 0..3 {
        assert!(
            !s.dir.join(format!("ran-{i}")).exists(),
            "exec {i} started its program without a durable claim"
        );
    }
    disk.free();
    let out = exec(
        &s,
        &[
            "full",
            "--date",
            "2026-01-01",
            "--time-window",
            "1h",
            "--",
            "true",
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = exec(
        &s,
        &[
            "full",
            "--date",
            "2026-01-01",
            "--time-window",
            "1h",
            "--",
            "true",
        ],
    )
    .output()
    .unwrap();
    assert!(String::from_utf8_lossy(&again.stdout).contains("skipped"));
}

/// Asserts that nothing holds `db` open after `what`: no `-wal` or `-shm` file beside it.
fn assert_closed(db: &std::path::Path, what: &str) {
    for suffix in ["-wal", "-shm"] {
        let mut side = db.as_os_str().to_owned();
        side.push(suffix);
        assert!(
            !std::path::Path::new(&side).exists(),
            "{} is left beside the database after {what} exited",
            std::path::Path::new(&side).display()
        );
    }
}

/// Every command closes its SQLite ledger and warehouse before it exits: SQLite checkpoints
/// the write-ahead log into the database and removes it. On main the process exited while
/// the connections were still closing on their threads, and 8 of 10 commands left the
/// ledger's `-wal` and `-shm` files behind.
#[test]
fn every_command_closes_its_sqlite_files_before_it_exits() {
    let s = common::Sandbox::new("idem-one-store-closed");
    let ledger = s.dir.join("idem.db");
    s.write_job(
        "closed",
        "name = \"closed\"\nprocessor = \"sql\"\n[sql]\nwarehouse = \"sqlite://wh.db\"\n\
         process = \"CREATE TABLE IF NOT EXISTS t (d TEXT); INSERT INTO t VALUES (@scope)\"\n",
    );
    for round in 0..5 {
        let date = format!("2026-01-0{}", round + 1);
        for args in [
            vec!["migrate"],
            vec!["run", "closed", "--date", &date],
            vec!["runs", "--job", "closed"],
            vec!["report", "--job", "closed"],
        ] {
            let out = s.idem(&args);
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let what = format!("idem {}", args.join(" "));
            assert_closed(&ledger, &what);
            assert_closed(&s.dir.join("wh.db"), &what);
        }
    }
}

/// After a transaction that failed on a full disk, the store's pooled connection is not
/// handed out again in a state sqlx refuses: the next batch is an outage as long as the
/// disk is full, and works once it has room, on the same store.
#[tokio::test]
async fn a_store_recovers_from_a_full_disk_without_reopening() {
    let Some(disk) = SmallDisk::mount("a_store_recovers_from_a_full_disk_without_reopening") else {
        return;
    };
    let url = format!("sqlite://{}", disk.dir.join("l.db").display());
    let store = idem::store::open_event_keys(&url).await.unwrap();
    disk.fill();
    let marks = |n: usize| -> Vec<idem::store::EventMark> {
        (0..200)
            .map(|i| idem::store::EventMark::key(format!("k{n}-{i}-{}", "x".repeat(200))))
            .collect()
    };
    for n in 0..3 {
        let e = store
            .check_and_mark("full", &marks(n), chrono::Utc::now())
            .await
            .expect_err("a full disk fails the batch");
        assert!(
            e.is_outage(),
            "batch {n} on a full disk is an outage, not a refused statement: {e}"
        );
    }
    disk.free();
    let verdicts = store
        .check_and_mark("full", &marks(9), chrono::Utc::now())
        .await
        .expect("the same store works once the disk has room");
    assert!(verdicts.iter().all(|v| v.is_new()));
}

/// `n` concurrent `idem exec NAME-i --date D -- sleep SECS` on `store`; the exit codes and
/// stderr of those that did not exit 0.
fn concurrent_execs(s: &common::Sandbox, n: usize, secs: &str) -> Vec<(Option<i32>, String)> {
    let children: Vec<_> = (0..n)
        .map(|i| {
            exec(
                s,
                &[
                    &format!("budget-{i}"),
                    "--date",
                    "2026-01-01",
                    "--",
                    "sleep",
                    secs,
                ],
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start idem exec")
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .filter(|o| !o.status.success())
        .map(|o| {
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stderr).to_string(),
            )
        })
        .collect()
}

/// The connection budget: each `idem exec` holds one connection, and a server at its limit
/// is waited for, not an outage. 200 runs of 2 s at once on a server of 100 connections all
/// complete (on main each run held two and those past the limit exited 3, "too many
/// clients"), and so do 60 runs on a server of 12 connections, which must wait for
/// connections well past the 5 s connect timeout.
#[test]
fn runs_beyond_the_servers_connection_limit_wait_for_a_connection_and_none_exits_3() {
    let test = "runs_beyond_the_servers_connection_limit_wait_for_a_connection_and_none_exits_3";
    if common::postgres_url(test).is_none() {
        return;
    }
    for (connections, runs, secs) in [(100, 200, "2"), (12, 60, "1")] {
        let Some(server) = common::private_pg::PrivatePostgres::start(
            test,
            &[&format!("max_connections={connections}")],
        ) else {
            return;
        };
        let s = common::Sandbox::with_store("idem-one-store-budget", &server.url());
        assert!(s.idem(&["migrate"]).status.success());
        let failed = concurrent_execs(&s, runs, secs);
        assert!(
            failed.is_empty(),
            "{} of {runs} runs on a server of {connections} connections failed: {:?}",
            failed.len(),
            &failed[..failed.len().min(3)]
        );
        let (code, ledger, err) = s.json(&["runs", "--limit", "0", "--status", "completed"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(ledger.as_array().unwrap().len(), runs);
    }
}

/// PgBouncer in transaction mode (Debian's 1.18: no prepared statements across
/// transactions), `?pgbouncer=true` on the URL: 200 concurrent runs of 2 s through 20 server
/// connections all complete, each once in the ledger (on main they failed "prepared
/// statement sqlx_s_1 already exists", and PgBouncer refused sqlx's extra_float_digits).
#[test]
fn runs_through_pgbouncer_in_transaction_mode_all_complete() {
    let test = "runs_through_pgbouncer_in_transaction_mode_all_complete";
    if common::postgres_url(test).is_none() {
        return;
    }
    let Some(server) = common::private_pg::PrivatePostgres::start(test, &["max_connections=100"])
    else {
        return;
    };
    let Some(bouncer) = common::private_pg::PrivatePgBouncer::start(test, &server, 20) else {
        return;
    };
    let s = common::Sandbox::with_store("idem-one-store-pgbouncer", &bouncer.url());
    let out = s.idem(&["migrate"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let failed = concurrent_execs(&s, 200, "2");
    assert!(
        failed.is_empty(),
        "{} of 200 runs through PgBouncer failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    let (code, ledger, err) = s.json(&["runs", "--limit", "0", "--status", "completed"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(ledger.as_array().unwrap().len(), 200);

    // Two gates at once on the same events through the pooler, pending marks on: their
    // bulk copies, batches' rows and confirmations (statements committed asynchronously)
    // all go through it. Each key is new in exactly one gate, no confirmation is lost (a
    // third gate finds every key a replay at once, not pending), nothing is warned.
    const LINES: usize = 5_000;
    let input = s.dir.join("events.ndjson");
    let events: String = (0..LINES)
        .map(|i| format!("{{\"id\":\"e{i}\"}}\n"))
        .collect();
    std::fs::write(&input, events).unwrap();
    let gate = |n: usize| {
        let out = s.dir.join(format!("gate-{n}.ndjson"));
        let child = s
            .command(&[
                "gate",
                "--key",
                "id",
                "--namespace",
                "bouncer",
                "--batch",
                "100",
            ])
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(&out)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        (child, out)
    };
    let gates = [gate(0), gate(1)];
    let mut new = 0;
    for (child, out) in gates {
        let done = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&done.stderr);
        assert!(done.status.success(), "{stderr}");
        assert!(!stderr.contains("WARN"), "{stderr}");
        let records = std::fs::read_to_string(out).unwrap();
        new += records.matches("\"verdict\":\"new\"").count();
    }
    assert_eq!(new, LINES, "each key new in exactly one gate");
    let (third, out) = gate(2);
    let done = third.wait_with_output().unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let records = std::fs::read_to_string(out).unwrap();
    assert_eq!(records.matches("\"verdict\":\"replay\"").count(), LINES);
}

/// A ledger on a read-only mount, with no write-ahead log beside it (closed cleanly): the
/// commands that only read it work (`runs`, `report`), and a run is refused before its
/// program starts (it could not be recorded). Before, every open failed: SQLite could not
/// make the `-shm` file a WAL reader needs (exit 3, "unable to open database file").
#[test]
fn a_read_only_ledger_can_be_read_and_refuses_runs() {
    let Some(disk) = SmallDisk::mount("a_read_only_ledger_can_be_read_and_refuses_runs") else {
        return;
    };
    let store = format!("sqlite://{}", disk.dir.join("l.db").display());
    let s = common::Sandbox::with_store("idem-one-store-read-only", &store);
    let out = exec(&s, &["j", "--date", "2026-01-01", "--", "true"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Closed cleanly: the last connection checkpoints and removes the -wal and -shm.
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        use sqlx::{ConnectOptions, Connection};
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(disk.dir.join("l.db"))
            .connect()
            .await
            .unwrap();
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
    });
    for companion in ["l.db-wal", "l.db-shm"] {
        assert!(!disk.dir.join(companion).exists(), "{companion} left");
    }
    disk.read_only();
    let (code, runs, err) = s.json(&["runs"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "{runs}");
    assert_eq!(runs[0]["scope"], "2026-01-01");
    let report = s.idem(&["report"]);
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let marker = s.dir.join("ran");
    let out = exec(&s, &["j", "--date", "2026-01-02", "--", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!marker.exists(), "the program never started");
}

/// A ledger made by the idem of before the one version space (SQLite at version 5, the
/// last it had) is brought to the latest version on first open: the versions it did not
/// have are recorded (the blank ones only recorded), what it held is kept, and the store
/// works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_at_the_old_last_version_is_upgraded_and_kept() {
    use idem::store::migrations::SQLITE;
    let dir = temp_dir("upgrade");
    let db = dir.join("old.db");
    let url = format!("sqlite://{}", db.display());
    {
        let mut conn = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc"))
            .await
            .unwrap();
        for m in SQLITE.iter().filter(|m| m.version <= 5) {
            sqlx::raw_sql(m.sql).execute(&mut conn).await.unwrap();
        }
        sqlx::raw_sql(
            "PRAGMA user_version = 5; \
             INSERT INTO event_cursors VALUES ('ns', 'c', '00', '{}', 1)",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
    }
    let store = idem::store::open(&url).await.expect("open the old ledger");
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let version: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(version, idem::store::migrations::latest(&SQLITE));
    assert!(version >= 9, "{version}");
    let kept: i64 = sqlx::query_scalar("SELECT count(*) FROM event_cursors")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(kept, 1, "the cursor written before the upgrade is kept");
    conn.close().await.unwrap();
    idem::store::conformance::claim_excludes_and_release_frees(&*store).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// A ledger at version 10 (keys without their own retention) upgrades to 11: the key the
/// older build wrote is kept, reads back with no `keep_until`, and cleanup treats it as it
/// did (by the cut-off alone here: no job file); keys written after the upgrade carry and
/// keep their retention (the conformance check, on the upgraded file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_at_version_10_keeps_its_keys_and_then_keys_carry_their_retention() {
    use idem::store::migrations::SQLITE;
    use idem::store::{CleanupPolicy, KeyLookup};
    let dir = temp_dir("upgrade-10");
    let db = dir.join("old.db");
    let url = format!("sqlite://{}", db.display());
    let old = (chrono::Utc::now() - chrono::Duration::days(40)).timestamp_micros();
    {
        let mut conn = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc"))
            .await
            .unwrap();
        for m in SQLITE.iter().filter(|m| m.version <= 10) {
            sqlx::raw_sql(m.sql).execute(&mut conn).await.unwrap();
        }
        sqlx::raw_sql("PRAGMA user_version = 10")
            .execute(&mut conn)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO processing_keys (processing_key, kind, processor_name, scope, \
             scope_date, processed_at, entity_count, metadata, run_id) \
             VALUES ('old-key', 'scope', 'old_job', 's', '2025-11-18', ?1, NULL, '{}', 'old-run')",
        )
        .bind(old)
        .execute(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
    }
    let store = idem::store::open(&url).await.expect("open the old ledger");
    let lookup = [KeyLookup {
        key: "old-key".into(),
        kind: idem::KeyKind::Scope,
        since: chrono::Utc::now() - chrono::Duration::days(60),
    }];
    let found = store.find_keys(&lookup).await.unwrap();
    let key = found[0].as_ref().expect("the old key is kept");
    assert_eq!((key.run_id.as_str(), key.keep_until), ("old-run", None));
    let policy = CleanupPolicy {
        processor: Some("old_job".into()),
        ..CleanupPolicy::before(chrono::Utc::now() - chrono::Duration::days(30))
    };
    assert_eq!(store.cleanup(&policy).await.unwrap().keys_deleted, 1);
    idem::store::conformance::cleanup_keeps_a_key_until_its_own_retention(&*store).await;
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let version: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(version, idem::store::migrations::latest(&SQLITE));
    conn.close().await.unwrap();
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

/// A ledger at version 9 (pending marks kept on each key: the marker as the decision, the
/// shorter expiry) upgrades to the batch's own rows (migration 0010) without losing what a
/// gate of the old build left: its pending mark still reads pending and is confirmed by
/// its owner as before, a plain mark keeps its decision, and a batch marked after the
/// upgrade is confirmed whole by one row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_at_version_9_keeps_its_pending_marks_through_the_upgrade() {
    use idem::store::migrations::SQLITE;
    use idem::store::{EventMark, EventVerdict, PendingBatch};
    use serde_json::json;
    let dir = temp_dir("upgrade-9");
    let db = dir.join("old.db");
    let url = format!("sqlite://{}", db.display());
    let now = chrono::Utc::now();
    let old_marker = r#"{"idem_pending":"old-gate/0"}"#;
    {
        let mut conn = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc"))
            .await
            .unwrap();
        for m in SQLITE.iter().filter(|m| m.version <= 9) {
            sqlx::raw_sql(m.sql).execute(&mut conn).await.unwrap();
        }
        sqlx::raw_sql("PRAGMA user_version = 9")
            .execute(&mut conn)
            .await
            .unwrap();
        let at = now.timestamp_micros();
        sqlx::query(
            "INSERT INTO event_keys (namespace, event_key, first_seen, fingerprint, decision, expires_at) \
             VALUES ('ns', 'old-pending', ?1, NULL, ?2, ?3), ('ns', 'plain', ?1, NULL, '{\"ok\":1}', NULL)",
        )
        .bind(at)
        .bind(old_marker)
        .bind(at + 600_000_000)
        .execute(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
    }
    let store = idem::store::open(&url).await.expect("open the old ledger");
    let marks = [EventMark::key("old-pending"), EventMark::key("plain")];
    let decisions = |v: &[EventVerdict]| -> Vec<Option<serde_json::Value>> {
        v.iter()
            .map(|v| match v {
                EventVerdict::Replay { decision, .. } => decision.clone(),
                other => panic!("a replay, not {other:?}"),
            })
            .collect()
    };
    let v = store.check_and_mark("ns", &marks, now).await.unwrap();
    assert_eq!(
        decisions(&v),
        [
            Some(json!({"idem_pending": "old-gate/0"})),
            Some(json!({"ok": 1}))
        ],
        "the old gate's mark is still pending, the plain one keeps its decision"
    );
    let confirmed = store
        .confirm_event_keys("ns", &[("old-pending".to_string(), None)], old_marker)
        .await
        .unwrap();
    assert_eq!(confirmed, 1, "its owner confirms it as before");
    let v = store.check_and_mark("ns", &marks, now).await.unwrap();
    assert_eq!(decisions(&v), [None, Some(json!({"ok": 1}))]);
    // A batch of the new build: pending until confirmed whole, by one row.
    let new_marker = r#"{"idem_pending":"new-gate/0"}"#;
    let batch = PendingBatch {
        marker: new_marker,
        timeout: std::time::Duration::from_secs(30),
        turn: None,
    };
    let fresh = [EventMark::key("f1"), EventMark::key("f2")];
    let v = store
        .check_and_mark_pending("ns", &fresh, now, batch, None)
        .await
        .unwrap();
    assert!(v.iter().all(EventVerdict::is_new), "{v:?}");
    let v = store.check_and_mark("ns", &fresh, now).await.unwrap();
    let pending = Some(json!({"idem_pending": "new-gate/0"}));
    assert_eq!(decisions(&v), [pending.clone(), pending]);
    let keys: Vec<(String, Option<chrono::DateTime<chrono::Utc>>)> =
        vec![("f1".into(), None), ("f2".into(), None)];
    let done = store
        .confirm_pending_batch("ns", new_marker, &keys, true)
        .await
        .unwrap();
    assert_eq!(done, 2);
    let later = now + chrono::Duration::hours(1);
    let v = store.check_and_mark("ns", &fresh, later).await.unwrap();
    assert_eq!(
        decisions(&v),
        [None, None],
        "confirmed: plain marks for good"
    );
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM event_pending")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows, 0, "the confirmed batch's row is gone");
    conn.close().await.unwrap();
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}
