//! The `idem` command as a user runs it, on the embedded SQLite store: whole processes,
//! real files, exit codes and JSON output.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common;

use common::{Sandbox, IDEM};

/// The warehouse helper of the SQLite tests: runs statements against `jobs/DB`.
impl Sandbox {
    fn sql(&self, db: &str, statements: &str) {
        let path = self.dir.join("jobs").join(db);
        let ok = Command::new("sqlite3")
            .arg(&path)
            .arg(statements)
            .status()
            .map(|s| s.success());
        if ok.ok() != Some(true) {
            // No sqlite3 binary: use the idem library's SQL processor instead.
            let url = format!("sqlite://{}", path.display());
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let w = idem::warehouse::open_warehouse(&url).await.unwrap();
                let st =
                    idem::backend::prepare(statements, idem::backend::Dialect::Sqlite).unwrap();
                w.execute(&st, &Default::default()).await.unwrap();
            });
        }
    }
}

fn sales_job(name: &str, guards: &str, process: &str) -> String {
    format!(
        r#"
name = "{name}"
processor = "sql"
[guards]
{guards}
[sql]
warehouse = "sqlite://warehouse.db"
setup = """
CREATE TABLE IF NOT EXISTS src (day TEXT, item TEXT, qty INTEGER);
CREATE TABLE IF NOT EXISTS out (day TEXT PRIMARY KEY, qty INTEGER);
"""
content = "SELECT item, qty FROM src WHERE day = @scope"
process = """{process}"""
"#
    )
}

const GOOD_PROCESS: &str = "DELETE FROM out WHERE day = @scope; INSERT INTO out SELECT day, SUM(qty) FROM src WHERE day = @scope GROUP BY day";

fn status(v: &Value) -> &str {
    v["status"].as_str().unwrap_or("?")
}

#[test]
fn concurrent_processes_one_completes_the_others_are_in_progress() {
    let s = Sandbox::new("idem-cli");
    // A process block that takes a while (a recursive count, ~2 s) so most runs start
    // while the winner works.
    let slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 16000000) SELECT count(*) FROM c";
    s.write_job(
        "slow",
        &sales_job("slow", "lease = \"1m\"\ntime_window = \"1h\"", slow),
    );
    // Create the store and warehouse first so the runs race on the claim, not on setup.
    let (code, _, _) = s.json(&["migrate"]);
    assert_eq!(code, 0);
    for round in 0..3 {
        let date = format!("2025-11-{:02}", 10 + round);
        let children: Vec<_> = (0..8)
            .map(|_| {
                s.command(&["run", "slow", "--date", &date, "--format", "json"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut statuses = Vec::new();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert_eq!(
                out.status.code(),
                Some(0),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            statuses.push((
                v["status"].as_str().unwrap().to_string(),
                v["skip_reason"].clone(),
                v["run_id"].clone(),
                v["previous_run"]["run_id"].clone(),
            ));
        }
        let winners: Vec<&Value> = statuses
            .iter()
            .filter(|s| s.0 == "completed")
            .map(|s| &s.2)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {statuses:?}");
        assert!(
            statuses
                .iter()
                .filter(|s| s.1 == "time_window")
                .all(|s| &s.3 == winners[0]),
            "round {round}: a late skip names another run than the one that completed: {statuses:?}"
        );
        // Skipped while the winner works (`in_progress`), or, for a process that starts
        // late on a busy machine and reaches the scope after the winner finished, by the
        // time window: never run twice.
        let skipped = statuses
            .iter()
            .filter(|s| s.0 == "skipped" && (s.1 == "in_progress" || s.1 == "time_window"))
            .count();
        assert_eq!(
            skipped, 7,
            "round {round}: the other 7 skip with in_progress (or time_window, late): {statuses:?}"
        );
    }
}

/// A process block that runs for many seconds (a recursive count).
const VERY_SLOW: &str = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000000) SELECT count(*) FROM c";

/// Starts `idem run slow --date 2025-11-18 ARGS` (a job with `guards` and a very slow
/// process) and returns once it holds the lease, as `explain` shows. The caller waits for
/// (or kills) the returned child.
#[allow(clippy::zombie_processes)]
fn start_slow_run(s: &Sandbox, guards: &str, args: &[&str]) -> std::process::Child {
    s.write_job("slow", &sales_job("slow", guards, VERY_SLOW));
    s.json(&["migrate"]);
    let mut all = vec!["run", "slow", "--date", "2025-11-18"];
    all.extend(args);
    let mut child = s
        .command(&all)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        let (_, e, _) = s.json(&["explain", "slow", "--date", "2025-11-18"]);
        if e["skip_reason"] == "in_progress" {
            return child;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the run never claimed: {e}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_killed_run_blocks_with_in_progress_until_its_lease_expires() {
    let s = Sandbox::new("idem-cli");
    let mut child = start_slow_run(&s, "lease = \"3s\"", &[]);
    // SIGKILL: no chance to release the lease or record anything.
    child.kill().unwrap();
    child.wait().unwrap();
    let killed_at = Instant::now();
    s.write_job("slow", &sales_job("slow", "lease = \"3s\"", GOOD_PROCESS));
    let (code, blocked, _) = s.json(&["run", "slow", "--date", "2025-11-18"]);
    assert_eq!(code, 0);
    assert_eq!(blocked["skip_reason"], "in_progress", "{blocked}");
    assert!(
        blocked["detail"]
            .as_str()
            .unwrap()
            .contains("holds the lease"),
        "{blocked}"
    );
    // Once the lease expired (`runs` shows the killed run abandoned), the next run
    // completes.
    common::wait_until(
        "the killed run's lease expires",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let (_, v, _) = s.json(&["runs", "--job", "slow", "--status", "abandoned"]);
            v.as_array().is_some_and(|a| !a.is_empty())
        },
    );
    assert!(
        killed_at.elapsed() >= Duration::from_secs(2),
        "the 3 s lease held"
    );
    let (code, r, err) = s.json(&["run", "slow", "--date", "2025-11-18"]);
    assert_eq!((code, status(&r)), (0, "completed"), "{r} {err}");
}

#[test]
fn sigterm_releases_the_lease_and_records_an_interrupted_run() {
    let s = Sandbox::new("idem-cli");
    let child = start_slow_run(&s, "lease = \"1h\"", &["--format", "json"]);
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "failed");
    assert_eq!(v["error"], "interrupted by SIGTERM");
    // The lease is free at once, not after an hour.
    let (_, e, _) = s.json(&["explain", "slow", "--date", "2025-11-18"]);
    assert_eq!(e["decision"], "run", "{e}");
}

/// Sends `signal` (`TERM`, `INT`) to `child`.
fn kill(signal: &str, child: &std::process::Child) {
    assert!(Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success());
}

/// What a run waiting for a held lease says when its wait begins (at `info`, which
/// [`WAITING_LOG`] turns on).
const WAITING: &str = "waiting up to";
const WAITING_LOG: &str = "warn,idem::guard::lease=info";

#[test]
fn a_signal_stops_a_run_waiting_for_the_lease_at_once_and_claims_nothing() {
    let s = Sandbox::new("idem-cli");
    let guards = "lease = \"1h\"\non_in_progress = \"wait\"\nwait = \"8s\"";
    let mut holder = start_slow_run(&s, guards, &["--run-id", "the-holder"]);
    for signal in ["TERM", "INT"] {
        let mut waiter = s
            .command(&["run", "slow", "--date", "2025-11-18", "--format", "json"])
            .env("RUST_LOG", WAITING_LOG)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // In its wait: it said so (not a guess of how long starting takes).
        let mut watch = common::StderrWatch::of(&mut waiter);
        watch.until(WAITING);
        let signalled = Instant::now();
        kill(signal, &waiter);
        let out = waiter.wait_with_output().unwrap();
        let took = signalled.elapsed();
        let stderr = watch.rest();
        assert!(
            took < Duration::from_secs(2),
            "SIG{signal} stops the wait at once, not after the 8s wait: took {took:?}\n{stderr}"
        );
        // As an interrupted run: failed, exit 1, recorded, saying why.
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["status"], "failed", "{v}");
        assert!(
            v["error"].as_str().unwrap().starts_with(&format!(
                "interrupted by SIG{signal}, before processing: after "
            )),
            "{v}"
        );
        assert_eq!(v["recorded"], true, "{v}");
        // It claimed nothing: the holder still holds the scope.
        let (_, e, _) = s.json(&["explain", "slow", "--date", "2025-11-18"]);
        assert_eq!(e["skip_reason"], "in_progress", "{e}");
        assert!(
            e["detail"]
                .as_str()
                .unwrap()
                .contains("run the-holder holds"),
            "{e}"
        );
    }
    // A backfill's dates wait through the same runner: Ctrl-C stops them as promptly.
    let mut backfill = s
        .command(&[
            "run",
            "slow",
            "--from",
            "2025-11-18",
            "--to",
            "2025-11-18",
            "--format",
            "json",
        ])
        .env("RUST_LOG", WAITING_LOG)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut watch = common::StderrWatch::of(&mut backfill);
    watch.until(WAITING);
    let signalled = Instant::now();
    kill("INT", &backfill);
    let out = backfill.wait_with_output().unwrap();
    let stderr = watch.rest();
    assert!(
        signalled.elapsed() < Duration::from_secs(2),
        "{:?}\n{stderr}",
        signalled.elapsed()
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["runs"][0]["error"]
            .as_str()
            .unwrap()
            .starts_with("interrupted by SIGINT, before processing: after "),
        "{v}"
    );
    // Without a signal the wait ends with a skip that says it waited.
    s.write_job(
        "slow",
        &sales_job(
            "slow",
            "lease = \"1h\"\non_in_progress = \"wait\"\nwait = \"1s\"",
            VERY_SLOW,
        ),
    );
    let (code, v, _) = s.json(&["run", "slow", "--date", "2025-11-18"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["skip_reason"], "in_progress", "{v}");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .ends_with(", after waiting 1s"),
        "{v}"
    );
    kill("TERM", &holder);
    holder.wait().unwrap();
}

#[test]
fn shadow_mode_completes_and_records_the_would_skip_reason() {
    let s = Sandbox::new("idem-cli");
    s.write_job(
        "sales",
        &sales_job(
            "sales",
            "time_window = \"1h\"\ncontent_hash = \"24h\"",
            GOOD_PROCESS,
        ),
    );
    s.json(&["run", "sales", "--date", "2025-11-18", "--mode", "shadow"]);
    let (code, second, _) = s.json(&["run", "sales", "--date", "2025-11-18", "--mode", "shadow"]);
    assert_eq!(code, 0);
    assert_eq!(status(&second), "completed");
    assert_eq!(second["would_skip_reason"], "time_window");
    assert_eq!(second["skip_reason"], Value::Null);
    let (_, runs, _) = s.json(&["runs", "--job", "sales"]);
    assert_eq!(runs[0]["would_skip_reason"], "time_window");
    assert_eq!(runs[0]["mode"], "shadow");
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn bad_input_names_the_problem_exits_2_and_records_nothing() {
    let s = Sandbox::new("idem-cli");
    s.write_job(
        "sales",
        &sales_job("sales", "time_window = \"1h\"", GOOD_PROCESS),
    );

    let out = s.idem(&["run", "nope", "--date", "2025-11-18"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("error: unknown job \"nope\""),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("known: sales"), "{}", stderr(&out));

    let out = s.idem(&["run", "sales", "--date", "2025-13-45"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("bad date \"2025-13-45\""),
        "{}",
        stderr(&out)
    );

    let out = s.idem(&["run", "sales"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "missing --date is a usage error"
    );

    let broken = s.write_job("broken", "name = \"broken\"\nprocessor = \"sql\n");
    let out = s.idem(&["run", broken.to_str().unwrap(), "--date", "2025-11-18"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("malformed job file"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_file(&broken).unwrap();

    let cron = s.write_job(
        "cron",
        "name = \"cron\"\nprocessor = \"x\"\nschedule = \"61 * * * *\"\n",
    );
    let out = s.idem(&["jobs"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("invalid cron expression \"61 * * * *\""),
        "{}",
        stderr(&out)
    );
    std::fs::remove_file(&cron).unwrap();

    let unknown = s.write_job("rust", "name = \"rust\"\nprocessor = \"not_registered\"\n");
    let out = s.idem(&["run", "rust", "--date", "2025-11-18"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unknown processor \"not_registered\""),
        "{}",
        stderr(&out)
    );
    // `idem jobs` validates every file: a processor this binary lacks is a problem there too.
    let out = s.idem(&["jobs"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr(&out).contains("rust.toml")
            && stderr(&out).contains("unknown processor \"not_registered\""),
        "{}",
        stderr(&out)
    );
    std::fs::remove_file(&unknown).unwrap();

    // JSON callers get the error as JSON too.
    let (code, v, _) = s.json(&["run", "nope", "--date", "2025-11-18"]);
    assert_eq!(code, 2);
    assert_eq!(v["exit_code"], 2);

    // Nothing was recorded by any of these.
    let (_, runs, _) = s.json(&["runs"]);
    assert_eq!(runs.as_array().map(|r| r.len()), Some(0), "{runs}");
}

#[test]
fn an_unreachable_store_exits_3_under_strict_and_runs_under_best_effort() {
    let s = Sandbox::new("idem-cli");
    s.write_job(
        "sales",
        &sales_job("sales", "time_window = \"1h\"", GOOD_PROCESS),
    );
    let bad_store = "sqlite:///nonexistent-dir/sub/idem.db";
    let mut c = s.command_with_store(&["run", "sales", "--date", "2025-11-18"], bad_store);
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("error: store sqlite:///nonexistent-dir/sub/idem.db unavailable"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("the folder /nonexistent-dir/sub does not exist"),
        "{}",
        stderr(&out)
    );
    // Nothing ran: the job's warehouse was not even opened.
    assert!(!s.dir.join("jobs/warehouse.db").exists());

    let out = s
        .command_with_store(
            &[
                "run",
                "sales",
                "--date",
                "2025-11-18",
                "--on-store-failure",
                "best_effort",
                "--format",
                "json",
            ],
            bad_store,
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "completed");
    assert_eq!(v["recorded"], false);
    assert!(!v["store_errors"].as_array().unwrap().is_empty());
    assert!(
        stderr(&out).contains("WARN"),
        "best_effort warns: {}",
        stderr(&out)
    );
}

#[test]
fn purge_forgets_keys_so_the_next_run_is_not_skipped() {
    let s = Sandbox::new("idem-cli");
    s.write_job(
        "sales",
        &sales_job("sales", "time_window = \"1h\"", GOOD_PROCESS),
    );
    s.json(&["run", "sales", "--date", "2025-11-18"]);
    let (code, purged, _) = s.json(&["purge", "sales", "--date", "2025-11-18", "--yes"]);
    assert_eq!(code, 0);
    assert_eq!(purged["keys_deleted"], 1);
    let (_, again, _) = s.json(&["run", "sales", "--date", "2025-11-18"]);
    assert_eq!(status(&again), "completed");
    let out = s.idem(&["purge", "sales", "--yes"]);
    assert_eq!(out.status.code(), Some(2), "purge needs a scope or --all");
}

#[test]
fn help_lists_commands_and_exit_codes() {
    let out = Command::new(IDEM).arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in [
        "run", "explain", "migrate", "jobs", "runs", "purge", "cleanup",
    ] {
        assert!(
            text.contains(&format!("  {cmd} ")),
            "--help lists {cmd}: {text}"
        );
    }
    assert!(
        text.contains("Exit codes: 0 completed or skipped, 1 the run failed"),
        "{text}"
    );
    let out = Command::new(IDEM).args(["run", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--date <DATE>") && text.contains("--trigger <TRIGGER>"),
        "{text}"
    );
}

#[test]
fn best_effort_spools_a_result_the_store_missed_and_the_ledger_catches_up() {
    let s = Sandbox::new("idem-cli");
    s.write_job(
        "sales",
        &sales_job("sales", "time_window = \"1h\"", GOOD_PROCESS),
    );
    // A store whose folder does not exist yet: unreachable now, reachable later.
    let later = s.dir.join("later");
    let store = format!("sqlite://{}", later.join("idem.db").display());
    let out = s
        .command_with_store(
            &[
                "run",
                "sales",
                "--date",
                "2025-11-18",
                "--on-store-failure",
                "best_effort",
                "--format",
                "json",
            ],
            &store,
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let first: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(first["status"], "completed");
    assert_eq!(first["recorded"], false);
    assert_eq!(first["spooled"], true, "{first}");

    // The store comes back: the next run records the spooled one first, so its time
    // window sees it.
    std::fs::create_dir_all(&later).unwrap();
    let out = s
        .command_with_store(
            &["run", "sales", "--date", "2025-11-18", "--format", "json"],
            &store,
        )
        .output()
        .unwrap();
    let second: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(second["skip_reason"], "time_window", "{second}");
    assert_eq!(second["previous_run"]["run_id"], first["run_id"]);
    let out = s
        .command_with_store(&["runs", "--format", "json"], &store)
        .output()
        .unwrap();
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "recorded once: {runs}");
    assert!(ids.contains(&first["run_id"].as_str().unwrap()));
    // The spool is empty now.
    let spool = s.dir.join(".idem-spool");
    let left: Vec<_> = std::fs::read_dir(&spool)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "ndjson"))
        .collect();
    assert!(left.is_empty(), "spool emptied");
}

/// A run that would spool its result when the store fails, with a spool that cannot be
/// written (IDEM_SPOOL_DIR names a file), is refused before any work: exit 2 naming the
/// spool, nothing processed. Before, it ran, and a result the store missed was lost
/// (issue 33, item 9: output paths are checked before any work). A strict run, which
/// never spools, is not concerned.
#[test]
fn a_spool_that_cannot_be_written_is_refused_before_a_best_effort_run_does_any_work() {
    let s = Sandbox::new("idem-cli");
    s.write_job(
        "sales",
        &sales_job("sales", "time_window = \"1h\"", GOOD_PROCESS),
    );
    let not_a_folder = s.dir.join("spool-is-a-file");
    std::fs::write(&not_a_folder, "").unwrap();
    for spool in [not_a_folder.clone(), not_a_folder.join("below")] {
        let out = s
            .command(&[
                "run",
                "sales",
                "--date",
                "2025-11-18",
                "--on-store-failure",
                "best_effort",
            ])
            .env("IDEM_SPOOL_DIR", &spool)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("IDEM_SPOOL_DIR") && err.contains("is not a folder"),
            "{err}"
        );
        assert!(
            !s.dir.join("jobs/warehouse.db").exists(),
            "the warehouse not even opened: {err}"
        );
    }
    let (code, runs, err) = s.json(&["runs"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(runs, serde_json::json!([]), "nothing ran, nothing recorded");
    let out = s
        .command(&["run", "sales", "--date", "2025-11-18", "--format", "json"])
        .env("IDEM_SPOOL_DIR", &not_a_folder)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (out.status.code(), status(&v)),
        (Some(0), "completed"),
        "{v}"
    );
}

/// The rows of a query on a SQLite file, read with idem's own SQLite warehouse: each row's
/// values as plain JSON in the order of their column names, joined by `|`; rows joined by
/// newlines.
fn sqlite_values(path: &std::path::Path, sql: &str) -> String {
    let url = format!("sqlite://{}", path.display());
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let w = idem::warehouse::open_warehouse(&url).await.unwrap();
        let statement = &idem::backend::prepare(sql, idem::backend::Dialect::Sqlite).unwrap()[0];
        let rows = w.query(statement, &Default::default()).await.unwrap();
        rows.iter()
            .map(|r| {
                let mut cells: Vec<(&String, String)> = r
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k, v.to_string()))
                    .collect();
                cells.sort();
                let cells: Vec<String> = cells.into_iter().map(|(_, v)| v).collect();
                cells.join("|")
            })
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// Issue 7, item 4: a backfill of the README demo job started as 19 separate `idem run`
/// processes at once (one per date, all on the same SQLite warehouse): every run
/// completes, each date once, and the demo's setup fills the source table once.
#[test]
fn a_concurrent_backfill_of_the_demo_job_completes_every_date_once() {
    let s = Sandbox::new("idem-cli");
    let demo = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/jobs/daily_sales.toml"
    ))
    .expect("read the demo job");
    s.write_job("daily_sales", &demo);
    s.json(&["migrate"]);
    let dates: Vec<String> = (1..=19).map(|d| format!("2025-11-{d:02}")).collect();
    let children: Vec<_> = dates
        .iter()
        .map(|date| {
            s.json_command(&["run", "daily_sales", "--date", date])
                .spawn()
                .expect("spawn idem run")
        })
        .collect();
    for (date, child) in dates.iter().zip(children) {
        let (code, doc, stderr) = common::wait(child);
        assert_eq!(code, 0, "{date}: {doc}\n{stderr}");
        assert_eq!(status(&doc), "completed", "{date}: {doc}\n{stderr}");
        assert_eq!(doc["scope"], date.as_str());
    }
    let (_, runs, _) = s.json(&["runs", "--job", "daily_sales", "--limit", "100"]);
    let mut scopes: Vec<&str> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["status"], "completed", "{r}");
            r["scope"].as_str().unwrap()
        })
        .collect();
    scopes.sort_unstable();
    assert_eq!(scopes, dates, "one completed run per date: {runs}");
    assert_eq!(
        sqlite_values(
            &s.dir.join("jobs").join("demo.db"),
            "SELECT (SELECT count(*) FROM raw_sales) AS a, \
             (SELECT count(DISTINCT sale_date) FROM daily_sales) AS b, \
             (SELECT count(*) FROM daily_sales) AS c",
        ),
        "360|19|57",
        "the source filled once (30 days x 3 stores x 4 sales), 19 days x 3 stores of totals"
    );
}

/// Issue 7, item 6: the job's SQL is part of the content key. A bug fixed in `process`
/// runs again on the same date within the content window (it used to be skipped as
/// `duplicate_content_hash`, so the fixed SQL never ran); so does a changed
/// `[sql.params]`; the unchanged job is still skipped.
#[test]
fn editing_the_job_sql_or_params_reruns_unchanged_content() {
    let s = Sandbox::new("idem-cli");
    let guards = "time_window = \"0s\"\ncontent_hash = \"24h\"";
    let buggy = "DELETE FROM out WHERE day = @scope; INSERT INTO out SELECT day, COUNT(*) FROM src WHERE day = @scope GROUP BY day";
    let job = s.write_job("sales", &sales_job("sales", guards, buggy));
    s.sql("warehouse.db", "CREATE TABLE IF NOT EXISTS src (day TEXT, item TEXT, qty INTEGER); INSERT INTO src VALUES ('2025-11-18','a',2),('2025-11-18','b',3)");
    let total = || {
        sqlite_values(
            &s.dir.join("jobs").join("warehouse.db"),
            "SELECT qty FROM out WHERE day = '2025-11-18'",
        )
    };
    let (_, first, _) = s.run(&job, "2025-11-18");
    assert_eq!(status(&first), "completed", "{first}");
    assert_eq!(total(), "2", "the bug: a count, not a sum");
    let (_, same, _) = s.json(&["run", "sales", "--date", "2025-11-18"]);
    assert_eq!(same["skip_reason"], "duplicate_content_hash", "{same}");

    // The fix: same source rows, the fixed SQL runs.
    std::fs::write(&job, sales_job("sales", guards, GOOD_PROCESS)).unwrap();
    let (code, fixed, stderr) = s.run(&job, "2025-11-18");
    assert_eq!(code, 0, "{fixed}\n{stderr}");
    assert_eq!(status(&fixed), "completed", "{fixed}");
    assert_ne!(fixed["processing_key"], first["processing_key"]);
    assert_eq!(total(), "5", "the fixed SQL ran");
    let (_, again, _) = s.run(&job, "2025-11-18");
    assert_eq!(again["skip_reason"], "duplicate_content_hash", "{again}");
    assert_eq!(again["processing_key"], fixed["processing_key"]);

    // Whitespace around statements is not an edit.
    std::fs::write(
        &job,
        sales_job("sales", guards, &format!("\n  {GOOD_PROCESS} ;\n\n")),
    )
    .unwrap();
    let (_, spaced, _) = s.run(&job, "2025-11-18");
    assert_eq!(spaced["skip_reason"], "duplicate_content_hash", "{spaced}");

    // A changed [sql.params] value is.
    let with_param = |v: &str| {
        format!(
            "{}\n[sql.params]\nlabel = \"{v}\"\n",
            sales_job("sales", guards, GOOD_PROCESS)
        )
    };
    std::fs::write(&job, with_param("one")).unwrap();
    let (_, one, _) = s.run(&job, "2025-11-18");
    assert_eq!(status(&one), "completed", "{one}");
    std::fs::write(&job, with_param("two")).unwrap();
    let (_, two, _) = s.run(&job, "2025-11-18");
    assert_eq!(status(&two), "completed", "{two}");
    let (_, two_again, _) = s.run(&job, "2025-11-18");
    assert_eq!(
        two_again["skip_reason"], "duplicate_content_hash",
        "{two_again}"
    );
}

#[test]
fn overflowing_durations_exit_2_naming_the_field_and_run_nothing() {
    let s = Sandbox::new("idem-cli");
    for keep in ["99999999d", "18446744073709551615s1s", "5124095576030432h"] {
        let out = s.idem(&["cleanup", "--keep", keep]);
        assert_eq!(out.status.code(), Some(2), "{keep}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("error: --keep: duration \"{keep}\" is too long")),
            "{}",
            stderr(&out)
        );
    }
    let out = s.idem(&["cleanup", "--keep", "30d"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for (field, value) in [
        ("lease", "5124095576030432h"),
        ("time_window", "18446744073709551615s1s"),
        ("content_hash", "99999999d"),
    ] {
        s.write_job(
            "sales",
            &sales_job("sales", &format!("{field} = \"{value}\""), GOOD_PROCESS),
        );
        let out = s.idem(&["run", "sales", "--date", "2025-11-18"]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("guards.{field}: duration \"{value}\" is too long")),
            "{}",
            stderr(&out)
        );
    }
    s.write_job(
        "sales",
        &sales_job("sales", "lease = \"500ms\"", GOOD_PROCESS),
    );
    let out = s.idem(&["run", "sales", "--date", "2025-11-18"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("guards.lease = \"500ms\" is too short: the minimum is 1s"),
        "{}",
        stderr(&out)
    );
    assert!(!s.dir.join("jobs/warehouse.db").exists(), "nothing ran");
    let (_, runs, _) = s.json(&["runs"]);
    assert_eq!(runs.as_array().map(|r| r.len()), Some(0), "{runs}");
}

#[test]
fn an_invalid_job_file_does_not_stop_another_job_and_jobs_reports_every_bad_file() {
    let s = Sandbox::new("idem-cli");
    s.write_job(
        "sales",
        &sales_job("sales", "time_window = \"1h\"", GOOD_PROCESS),
    );
    // Found by its name although the file is called otherwise.
    s.write_job(
        "renamed_file",
        &sales_job("other", "time_window = \"1h\"", GOOD_PROCESS),
    );
    let broken = s.write_job("broken", "name = \"broken\"\nprocessor = \"sql\n");
    let typo = s.write_job(
        "typo",
        &sales_job(
            "typo",
            "",
            "INSERT INTO out SELECT @scope, SUM(qty) FROM src WHERE day = @scop",
        ),
    );
    let lease = s.write_job(
        "lease",
        "name = \"lease\"\nprocessor = \"p\"\n[guards]\nlease = \"forever\"\n",
    );

    let (code, r, err) = s.json(&["run", "sales", "--date", "2025-11-18"]);
    assert_eq!((code, status(&r)), (0, "completed"), "{r} {err}");
    let (code, r, err) = s.json(&["run", "other", "--date", "2025-11-18"]);
    assert_eq!((code, status(&r)), (0, "completed"), "{r} {err}");
    let out = s.idem(&["explain", "sales", "--date", "2025-11-18"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // `idem jobs` lists the good ones and names every bad file with its problem.
    let out = s.idem(&["jobs"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    for (path, problem) in [
        (&broken, "malformed job file"),
        (&typo, "[sql].process uses unknown parameter @scop"),
        (&lease, "guards.lease: bad duration \"forever\""),
    ] {
        let line = err
            .lines()
            .find(|l| l.contains(path.to_str().unwrap()))
            .unwrap_or_else(|| panic!("{} is reported: {err}", path.display()));
        assert!(
            line.starts_with("error: ") && line.contains(problem),
            "{line}"
        );
    }
    assert!(err.contains("3 of 5 job file(s)"), "{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("sales") && text.contains("other"), "{text}");
    let (code, v, _) = s.json(&["jobs"]);
    assert_eq!(code, 2);
    assert_eq!(v["exit_code"], 2);
    assert_eq!(v["problems"].as_array().unwrap().len(), 3, "{v}");
    assert_eq!(v["jobs"].as_array().unwrap().len(), 2, "{v}");
}

#[test]
fn an_unknown_parameter_exits_2_before_the_store_is_touched() {
    let s = Sandbox::new("idem-cli");
    s.write_job(
        "sales",
        &sales_job(
            "sales",
            "time_window = \"1h\"",
            "DELETE FROM out WHERE day = @scope; INSERT INTO out VALUES (@scope, @qty)",
        ),
    );
    for command in ["run", "explain"] {
        let out = s.idem(&[command, "sales", "--date", "2025-11-18"]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("sales.toml: [sql].process uses unknown parameter @qty"),
            "{}",
            stderr(&out)
        );
    }
    // Neither the store nor the warehouse was opened.
    assert!(!s.dir.join("idem.db").exists());
    assert!(!s.dir.join("jobs/warehouse.db").exists());
    // content_hash without a content query is caught the same way.
    s.write_job(
        "nohash",
        "name = \"nohash\"\nprocessor = \"sql\"\n[guards]\ncontent_hash = \"24h\"\n[sql]\nprocess = \"SELECT 1\"\n",
    );
    let out = s.idem(&["run", "nohash", "--date", "2025-11-18"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("guards.content_hash is set but [sql] has no content"),
        "{}",
        stderr(&out)
    );
    assert!(!s.dir.join("idem.db").exists());
}

/// Rows of `query` in the SQLite file at `path`.
fn sqlite_rows(path: &std::path::Path, query: &str) -> Result<Vec<Value>, String> {
    let url = format!("sqlite://{}", path.display());
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let w = idem::warehouse::open_warehouse(&url)
            .await
            .map_err(|e| e.to_string())?;
        let st = idem::backend::prepare(query, idem::backend::Dialect::Sqlite).unwrap();
        w.query(&st[0], &Default::default()).await
    })
}

/// Whether another connection holds the write lock of the SQLite file `path`: a `BEGIN
/// IMMEDIATE` that may not wait is refused.
fn write_locked(path: &Path) -> bool {
    use sqlx::{ConnectOptions, Connection};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(path)
            .busy_timeout(Duration::ZERO)
            .connect()
            .await
            .unwrap();
        let locked = sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .is_err();
        if !locked {
            sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
        }
        let _ = conn.close().await;
        locked
    })
}

#[test]
fn a_job_without_warehouse_keeps_its_data_out_of_the_store_file_so_a_slow_process_blocks_no_claim()
{
    let s = Sandbox::new("idem-cli");
    // No `warehouse`: the SQL runs in the store's default warehouse. The process writes
    // first (so it holds the warehouse's write lock) and then counts for a long time on
    // one date, briefly on the others.
    let job = |name: &str| {
        format!(
            r#"
name = "{name}"
processor = "sql"
[sql]
setup = "CREATE TABLE IF NOT EXISTS out (day TEXT PRIMARY KEY, n INTEGER)"
process = """
DELETE FROM out WHERE day = @scope;
INSERT INTO out SELECT @scope, (SELECT count(*) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < CASE WHEN @scope = '2025-11-18' THEN 500000000 ELSE 10 END) SELECT x FROM c))
"""
"#
        )
    };
    s.write_job("slow", &job("slow"));
    // Another job with a warehouse of its own.
    s.write_job(
        "other",
        &sales_job("other", "time_window = \"1h\"", GOOD_PROCESS),
    );
    let (code, first, err) = s.json(&["run", "slow", "--date", "2025-11-01"]);
    assert_eq!((code, status(&first)), (0, "completed"), "{first} {err}");

    let mut slow = s
        .json_command(&["run", "slow", "--date", "2025-11-18"])
        .spawn()
        .unwrap();
    let start = Instant::now();
    while s.json(&["explain", "slow", "--date", "2025-11-18"]).1["skip_reason"] != "in_progress" {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the slow run never claimed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Until it is in its process: the DELETE takes the warehouse's write lock at once.
    let warehouse = s.dir.join("idem-warehouse.db");
    common::wait_until(
        "the slow run holds the warehouse's write lock",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || write_locked(&warehouse),
    );
    let running = |slow: &mut std::process::Child| slow.try_wait().unwrap().is_none();

    // Meanwhile another job completes: its lease and ledger live in the store file,
    // which the slow process does not lock.
    let (code, other, err) = s.json(&["run", "other", "--date", "2025-11-18"]);
    assert_eq!((code, status(&other)), (0, "completed"), "{other} {err}");
    assert!(
        running(&mut slow),
        "the other job completed while the slow run works"
    );
    // Another scope of the same job claims its lease at once and waits its turn for the
    // warehouse (SQLite has one writer per file), not for the store.
    let second = s
        .json_command(&["run", "slow", "--date", "2025-11-19"])
        .spawn()
        .unwrap();
    let start = Instant::now();
    while s.json(&["explain", "slow", "--date", "2025-11-19"]).1["skip_reason"] != "in_progress" {
        assert!(
            start.elapsed() < Duration::from_secs(10) && running(&mut slow),
            "the second scope claims while the slow run works"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(running(&mut slow));
    let (code, runs, _) = s.json(&["runs"]);
    assert_eq!(code, 0, "the ledger answers meanwhile: {runs}");
    // The slow run ends (killed: its transaction rolls back); the second one completes.
    slow.kill().unwrap();
    slow.wait().unwrap();
    let (code, second, err) = common::wait(second);
    assert_eq!((code, status(&second)), (0, "completed"), "{second} {err}");

    // The job's table is in idem-warehouse.db beside the store, not in the store file.
    let rows = sqlite_rows(
        &s.dir.join("idem-warehouse.db"),
        "SELECT day FROM out ORDER BY day",
    )
    .unwrap();
    assert_eq!(
        rows,
        vec![
            serde_json::json!({"day": "2025-11-01"}),
            serde_json::json!({"day": "2025-11-19"})
        ]
    );
    let e = sqlite_rows(&s.dir.join("idem.db"), "SELECT day FROM out").unwrap_err();
    assert!(e.contains("no such table: out"), "{e}");
}

#[test]
fn reading_commands_refuse_a_missing_ledger_and_name_the_filters_that_matched_nothing() {
    let s = Sandbox::new("idem-cli-missing-ledger");
    let typo = s.dir.join("idme.db");
    let typo_url = format!("sqlite://{}", typo.display());
    // `report` refuses; `runs` lists nothing (nothing is recorded there) and warns.
    for (args, code) in [
        (&["report"][..], 2),
        (&["runs"][..], 0),
        (&["runs", "--format", "json"][..], 0),
    ] {
        let out = s.command_with_store(args, &typo_url).output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("no ledger at {}", typo.display()))
                && stderr(&out).contains("does not exist"),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(!typo.exists(), "{args:?} left an empty ledger behind");
    }
    let out = s
        .command_with_store(&["runs", "--format", "json"], &typo_url)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");

    // An existing ledger without the asked-for runs says which filter matched nothing.
    assert_eq!(s.idem(&["migrate"]).status.code(), Some(0));
    let out = s.idem(&["runs", "--job", "nosuch", "--status", "failed"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("no runs of job \"nosuch\" with status failed recorded in"),
        "{text}"
    );
    // `report --job` with a name no job file and no run knows is a typo: exit 2, naming it.
    let out = s.idem(&["report", "--job", "nosuch"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--job \"nosuch\": no such job"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty(), "a refused report printed a report");
}

/// Every file under `dir`, relative, sorted (the jobs' own `.toml` files included).
fn files_in(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn commands_that_only_look_create_nothing_and_never_overwrite_or_misread_what_they_are_given() {
    let s = Sandbox::new("idem-cli-look");
    s.write_job(
        "sales",
        &sales_job("sales", "time_window = \"1h\"", GOOD_PROCESS),
    );
    let before = files_in(&s.dir);

    // explain judges against an empty ledger and an empty warehouse: no file appears.
    let out = s.idem(&["explain", "sales", "--date", "2025-11-18"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("would run"));
    assert!(stderr(&out).contains("explaining against an empty ledger"));
    // cleanup of a ledger that is not there has nothing to clean, and makes no ledger.
    for args in [&["cleanup", "--dry-run"][..], &["cleanup"][..]] {
        let out = s.idem(args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(stderr(&out).contains("no ledger at"), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("nothing to clean"),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(files_in(&s.dir), before, "a look created files");

    // A range needs both ends: --to is never ignored beside --date, --scope or --all.
    for args in [
        &["run", "sales", "--date", "2025-11-18", "--to", "2025-11-20"][..],
        &[
            "purge",
            "sales",
            "--date",
            "2025-11-18",
            "--to",
            "2025-11-20",
            "--yes",
        ][..],
        &["purge", "sales", "--all", "--to", "2025-11-20", "--yes"][..],
    ] {
        let out = s.idem(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("--to needs --from"),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(files_in(&s.dir), before, "a refused command created files");

    // A store path that cannot hold a ledger is a usage error, even under best_effort:
    // the job never runs unguarded.
    std::fs::write(s.dir.join("notes.txt"), "not a database").unwrap();
    for (store, says) in [
        ("sqlite://".to_string(), "no file path"),
        (format!("sqlite://{}", s.dir.display()), "is a folder"),
        (
            format!("sqlite://{}", s.dir.join("notes.txt").display()),
            "is not a SQLite database",
        ),
    ] {
        let out = s
            .command_with_store(
                &[
                    "run",
                    "sales",
                    "--date",
                    "2025-11-18",
                    "--on-store-failure",
                    "best_effort",
                ],
                &store,
            )
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{store}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{store}: {}", stderr(&out));
    }
    assert!(s.warehouse_days().is_empty());

    // The report never writes over a database, the ledger least of all.
    let (code, _, err) = s.json(&["run", "sales", "--date", "2025-11-18"]);
    assert_eq!(code, 0, "{err}");
    let ledger = s.dir.join("idem.db");
    let out = s.idem(&["report", "--output", ledger.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is a SQLite database"),
        "{}",
        stderr(&out)
    );
    let (code, runs, _) = s.json(&["runs"]);
    assert_eq!((code, runs.as_array().map(Vec::len)), (0, Some(1)));

    // Text outputs honour --format json as one document.
    let (code, v, err) = s.json(&["report", "--sql", "wasted", "--dialect", "postgres"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        (v["query"].as_str(), v["dialect"].as_str()),
        (Some("wasted"), Some("postgres"))
    );
    assert!(v["sql"].as_str().unwrap().contains("processing_runs"));
    // The help names every report query and dialect.
    let help = String::from_utf8(s.idem(&["report", "--help"]).stdout).unwrap();
    for name in idem::report::QUERY_NAMES {
        assert!(help.contains(name), "{name} missing from report --help");
    }
    assert!(help.contains("bigquery"), "{help}");
    // Text that is not JSON is named as such.
    let out = s
        .command(&["fingerprint", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(b"not json\n")?;
            c.wait_with_output()
        })
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("line 1: not a JSON object: found text that is not JSON"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn jobs_and_run_agree_which_file_holds_a_name_used_twice() {
    let s = Sandbox::new("idem-cli-clash");
    // `a.toml` sorts first, but `sales.toml` is the file `idem run sales` takes.
    s.write_job(
        "a",
        &sales_job("sales", "time_window = \"1h\"", GOOD_PROCESS),
    );
    s.write_job(
        "sales",
        &sales_job("sales", "time_window = \"2h\"", GOOD_PROCESS),
    );
    let (code, v, _) = s.json(&["jobs"]);
    assert_eq!(code, 2, "{v}");
    let problem = v["problems"][0]["path"].as_str().unwrap_or_default();
    assert!(problem.ends_with("a.toml"), "{v}");
    assert!(
        v["problems"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("is used by both")),
        "{v}"
    );
    let kept = v["jobs"][0]["path"].as_str().unwrap_or_default();
    assert!(kept.ends_with("sales.toml"), "{v}");
    let (code, run, err) = s.json(&["explain", "sales", "--date", "2025-11-18"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        run.to_string().contains("2h"),
        "run takes sales.toml: {run}"
    );
}

#[test]
fn run_metrics_file_has_status_duration_records_and_skip_reason() {
    let s = Sandbox::new("cli-metrics");
    s.write_job(
        "sales",
        &sales_job("sales", "time_window = \"1h\"", GOOD_PROCESS),
    );
    let prom = s.dir.join("run.prom");
    let prom_arg = prom.to_str().unwrap();
    let read = || std::fs::read_to_string(&prom).unwrap();
    let (code, first, _) = s.json(&[
        "run",
        "sales",
        "--date",
        "2025-11-18",
        "--metrics-file",
        prom_arg,
    ]);
    assert_eq!(code, 0, "{first}");
    let text = read();
    for line in text.lines() {
        assert!(
            line.starts_with("# HELP ")
                || line.starts_with("# TYPE ")
                || line.starts_with("idem_run_"),
            "{line}"
        );
    }
    let status = first["status"].as_str().unwrap();
    assert!(
        text.contains(&format!("status=\"{status}\",skip_reason=\"\"")),
        "{text}"
    );
    assert!(text.contains("idem_run_success{job=\"sales\",scope=\"2025-11-18\"} 1\n"));
    assert!(text.contains("idem_run_duration_seconds{job=\"sales\",scope=\"2025-11-18\"} "));
    let records = first["records_processed"].as_i64().unwrap_or(0);
    assert!(
        text.contains(&format!(
            "idem_run_records_processed{{job=\"sales\",scope=\"2025-11-18\"}} {records}\n"
        )),
        "{text}"
    );
    // The same date again: skipped, the reason as a label.
    let (code, again, _) = s.json(&[
        "run",
        "sales",
        "--date",
        "2025-11-18",
        "--metrics-file",
        prom_arg,
    ]);
    assert_eq!(code, 0, "{again}");
    let reason = again["skip_reason"].as_str().expect("skipped");
    assert!(
        read().contains(&format!("status=\"skipped\",skip_reason=\"{reason}\"")),
        "{}",
        read()
    );
}

#[test]
fn param_overrides_sql_params_and_an_unknown_param_is_refused() {
    let s = Sandbox::new("cli-params");
    s.write_job(
        "regions",
        r#"
name = "regions"
processor = "sql"
[guards]
time_window = "1h"
[sql]
warehouse = "sqlite://warehouse.db"
setup = "CREATE TABLE IF NOT EXISTS seen (day TEXT, region TEXT)"
process = "INSERT INTO seen VALUES (@scope, @region)"
[sql.params]
region = "eu"
"#,
    );
    let regions = |s: &Sandbox| -> Vec<String> {
        let db = s.dir.join("jobs/warehouse.db");
        let url = format!("sqlite://{}", db.display());
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            let w = idem::warehouse::open_warehouse(&url).await.unwrap();
            let st = idem::backend::prepare(
                "SELECT day || '/' || region AS r FROM seen ORDER BY day",
                idem::backend::Dialect::Sqlite,
            )
            .unwrap();
            w.query(&st[0], &Default::default())
                .await
                .unwrap()
                .iter()
                .map(|r| r["r"].as_str().unwrap().to_string())
                .collect()
        })
    };
    let out = s.idem(&["run", "regions", "--date", "2025-11-18"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = s.idem(&[
        "run",
        "regions",
        "--date",
        "2025-11-19",
        "--param",
        "region=us",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(regions(&s), ["2025-11-18/eu", "2025-11-19/us"]);
    // A name the job does not have: a typo, refused before anything runs.
    let out = s.idem(&[
        "run",
        "regions",
        "--date",
        "2025-11-20",
        "--param",
        "regoin=us",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--param regoin") && stderr(&out).contains("region"),
        "{}",
        stderr(&out)
    );
    assert_eq!(regions(&s).len(), 2, "nothing ran");
}

#[test]
fn log_format_json_writes_every_stderr_line_as_an_object_with_severity() {
    let s = Sandbox::new("cli-json-logs");
    let lines = |out: &Output| -> Vec<Value> {
        stderr(out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
            .collect()
    };
    // An error of idem's own.
    let out = s.idem(&[
        "--log-format",
        "json",
        "run",
        "nope",
        "--date",
        "2025-11-18",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let errors = lines(&out);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0]["severity"], "ERROR");
    assert!(errors[0]["message"].as_str().unwrap().contains("nope"));
    assert!(chrono::DateTime::parse_from_rfc3339(errors[0]["time"].as_str().unwrap()).is_ok());
    // Log events with the run's fields, through the environment variable.
    let out = s
        .command(&["exec", "logged", "--date", "2025-11-18", "--", "false"])
        .env("IDEM_LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let events = lines(&out);
    let requested = events
        .iter()
        .find(|e| e["message"] == "run requested")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(requested["severity"], "INFO");
    assert_eq!(requested["job"], "logged");
    assert_eq!(requested["scope"], "2025-11-18");
    assert!(
        events.iter().any(|e| e["severity"] == "WARNING"),
        "the failure is a warning: {events:?}"
    );
}

#[test]
fn a_metrics_file_that_cannot_be_written_is_refused_before_the_run() {
    // Found bad after the run completed, a metrics file used to turn a done run into exit
    // 2 ("nothing was run"); a -wal of the job's warehouse was written over.
    let s = Sandbox::new("cli-metrics-refused");
    s.write_job(
        "sales",
        &sales_job("sales", "time_window = \"1h\"", GOOD_PROCESS),
    );
    let warehouse_wal = s.dir.join("jobs/warehouse.db-wal");
    let ledger_shm = s.dir.join("idem.db-shm");
    let cases = [
        (s.dir.clone(), "is a folder"),
        (warehouse_wal.clone(), "SQLite database"),
        (ledger_shm, "SQLite database"),
        (PathBuf::from("/dev/null"), "not a regular file"),
    ];
    for (path, what) in &cases {
        let out = s.idem(&[
            "run",
            "sales",
            "--date",
            "2025-11-18",
            "--metrics-file",
            path.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2), "{path:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(what), "{path:?}: {}", stderr(&out));
        assert!(
            !s.dir.join("idem.db").exists(),
            "{path:?}: nothing ran, nothing was recorded"
        );
    }
    assert!(!warehouse_wal.exists());
    let out = s.idem(&["run", "sales", "--date", "2025-11-18"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn processes_opening_a_new_sqlite_ledger_at_once_all_get_it() {
    // The first open of a file switches it to WAL; processes racing for that switch used
    // to fail with "database is locked" (exit 3) instead of waiting their turn.
    for round in 0..10 {
        let s = Sandbox::new("idem-cli-first-open");
        s.write_job(
            "sales",
            &sales_job("sales", "time_window = \"1h\"", GOOD_PROCESS),
        );
        let children: Vec<_> = (0..12)
            .map(|i| {
                let args: &[&str] = if i % 3 == 0 {
                    &["migrate"]
                } else {
                    &["run", "sales", "--date", "2025-11-18"]
                };
                s.command(args)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert_eq!(
                out.status.code(),
                Some(0),
                "round {round}: {}",
                stderr(&out)
            );
        }
        let (_, runs, _) = s.json(&["runs", "--status", "completed"]);
        assert_eq!(
            runs.as_array().map(Vec::len),
            Some(1),
            "round {round}: {runs}"
        );
    }
}

/// A reused `--run-id` is settled before the work runs (issue 21.5): the id the SQL sees as
/// `@run_id` is the id the ledger records, for the first run and for the one whose id was
/// taken (renamed to a derived one before it started, not after).
#[test]
fn a_reused_run_id_is_settled_before_the_sql_sees_it() {
    let s = Sandbox::new("idem-run-id");
    s.write_job(
        "stamp",
        r#"
name = "stamp"
processor = "sql"
[sql]
warehouse = "sqlite://wh.db"
setup = "CREATE TABLE IF NOT EXISTS out (day TEXT)"
process = "INSERT INTO out VALUES (@run_id)"
"#,
    );
    let mut recorded = Vec::new();
    for date in ["2026-01-01", "2026-01-02"] {
        let (code, report, err) =
            s.json(&["run", "stamp", "--date", date, "--run-id", "nightly-7"]);
        assert_eq!(code, 0, "{err}");
        recorded.push(report["run_id"].as_str().unwrap().to_string());
    }
    assert_eq!(recorded[0], "nightly-7");
    assert!(
        recorded[1].starts_with("nightly-7.") && recorded[1].len() > "nightly-7.".len(),
        "{recorded:?}"
    );
    // The ledger has the same ids, and so does what the SQL wrote.
    let (_, runs, _) = s.json(&["runs", "--job", "stamp", "--limit", "0"]);
    let mut in_ledger: Vec<String> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect();
    in_ledger.sort();
    let mut seen_by_sql = s.warehouse_days();
    seen_by_sql.sort();
    let mut expected = recorded.clone();
    expected.sort();
    assert_eq!(in_ledger, expected);
    assert_eq!(seen_by_sql, expected, "@run_id is the ledger's id");
}

/// A SQLite ledger made by the build before the SQL moved to `sql/` (tests/fixtures, made
/// with `idem exec fixture --date 2025-11-18 --time-window 1h -- true` and one gate line)
/// opens with this one: `migrate` has nothing to do, its run and its keys still count.
#[test]
fn a_ledger_made_before_the_sql_moved_to_sql_opens_and_its_keys_still_count() {
    let s = Sandbox::new("idem-cli-old-ledger");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ledger-before-sql-move.db"),
        s.dir.join("idem.db"),
    )
    .unwrap();
    assert_eq!(s.idem(&["migrate"]).status.code(), Some(0));
    let (code, v, err) = s.json(&["runs", "--job", "fixture"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v[0]["status"], "completed");
    // The gate's key is still marked: the same line is a replay.
    let out = s
        .command(&["gate", "--key", "id", "--format", "ndjson"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(b"{\"id\":\"e1\",\"amount\":1}\n")?;
            child.wait_with_output()
        })
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"verdict\":\"replay\""),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A daily job whose slot is twelve hours from now (so no slot comes or goes while the test
/// runs), whose command fails until the file `ok` exists in the sandbox (a command job
/// runs in its job file's folder: the paths are absolute).
fn status_job(s: &Sandbox, name: &str) {
    let hour = (chrono::Utc::now() + chrono::Duration::hours(12)).format("%H");
    s.write_job(
        name,
        &format!(
            r#"
name = "{name}"
processor = "command"
schedule = "0 {hour} * * *"
date = "yesterday"
[guards]
lease = "10m"
time_window = "20h"
[command]
run = ["sh", "-c", "test -f {dir}/ok && echo {{scope}} >> {dir}/done-{name}.txt"]
"#,
            dir = s.dir.display()
        ),
    );
}

/// The scopes `run --missing --dry-run --format json` lists.
fn would_run(doc: &Value) -> Vec<&str> {
    doc["would_run"]
        .as_array()
        .expect("would_run")
        .iter()
        .map(|s| s["scope"].as_str().unwrap())
        .collect()
}

fn scopes_in(doc: &Value, job: &str, state: &str) -> Vec<String> {
    let jobs = doc["jobs"].as_array().expect("jobs");
    let job = jobs.iter().find(|j| j["job"] == job).expect("the job");
    job["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == state)
        .map(|s| s["scope"].as_str().unwrap().to_string())
        .collect()
}

/// `idem status` puts the schedule and the ledger side by side: a date never run is
/// missing and a failed one failed (exit 1, both named); `run --missing --dry-run` lists
/// exactly those, `run --missing` runs exactly those (no other date again), and then
/// `status` exits 0. An `idem exec` job is listed from the ledger with its last run.
#[test]
fn status_names_missing_and_failed_dates_and_run_missing_runs_exactly_those() {
    let s = Sandbox::new("idem-status");
    status_job(&s, "nightly");
    let since = ["--since", "4d"];
    let (code, doc, err) = s.json(&["status", "nightly", since[0], since[1]]);
    assert_eq!(code, 1, "nothing ran yet: {doc}\n{err}");
    let expected = scopes_in(&doc, "nightly", "missing");
    assert_eq!(expected.len(), 4, "four daily slots in four days: {doc}");
    // The newest ran, the second failed (no `ok` file yet), the rest never ran.
    std::fs::write(s.dir.join("ok"), "").unwrap();
    let run_date = |d: &str| s.idem(&["run", "nightly", "--date", d]).status.code();
    assert_eq!(run_date(&expected[3]), Some(0));
    std::fs::remove_file(s.dir.join("ok")).unwrap();
    assert_eq!(run_date(&expected[1]), Some(1));
    let exec = s.idem(&["exec", "adhoc", "--time-window", "1h", "--", "true"]);
    assert_eq!(exec.status.code(), Some(0), "{}", stderr(&exec));

    let (code, doc, err) = s.json(&["status", since[0], since[1]]);
    assert_eq!(code, 1, "{doc}\n{err}");
    assert_eq!(doc["ok"], false);
    assert_eq!(
        scopes_in(&doc, "nightly", "completed"),
        [expected[3].clone()]
    );
    assert_eq!(scopes_in(&doc, "nightly", "failed"), [expected[1].clone()]);
    assert_eq!(
        scopes_in(&doc, "nightly", "missing"),
        [expected[0].clone(), expected[2].clone()]
    );
    let adhoc = doc["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"] == "adhoc");
    let adhoc = adhoc.expect("the exec job, known from the ledger");
    assert_eq!(
        (adhoc["kind"].as_str(), adhoc["last_run"]["status"].as_str()),
        (Some("ledger"), Some("completed"))
    );
    // The human view: one line per job, the grid oldest first, what needs attention named.
    let out = s.idem(&["status", "nightly", since[0], since[1]]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.starts_with("nightly  !✗!✓ "), "{text}");
    assert!(text.contains(&format!("failed {}", expected[1])), "{text}");
    assert!(
        text.contains(&format!("2 missing: {}, {}", expected[0], expected[2])),
        "{text}"
    );

    // The same grid as a page: a cell per expected date, its state and run on hover
    // (.ci/report-screenshot.sh renders it in Chromium: IDEM_STATUS_HTML_OUT).
    let out = s.idem(&["status", since[0], since[1], "--format", "html"]);
    assert_eq!(out.status.code(), Some(1));
    let html = String::from_utf8_lossy(&out.stdout).to_string();
    if let Some(path) = std::env::var_os("IDEM_STATUS_HTML_OUT") {
        std::fs::write(path, &html).unwrap();
    }
    for (state, n) in [("completed", 1), ("failed", 1), ("missing", 2)] {
        let cell = format!("data-state=\"{state}\"");
        assert_eq!(html.matches(&cell).count(), n, "{state}: {html}");
    }
    assert!(
        html.contains(&format!("nightly {}: failed, due ", expected[1])),
        "{html}"
    );
    assert!(html.contains("<th class=\"job\">adhoc</th>"), "{html}");
    assert_eq!(s.idem(&["runs", "--format", "html"]).status.code(), Some(2));

    // A name no job file has and the ledger never saw: a usage error naming it.
    let out = s.idem(&["status", "nightly_typo"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unknown job \"nightly_typo\""),
        "{}",
        stderr(&out)
    );

    // Metrics for an alert rule.
    let prom = s.dir.join("status.prom");
    let out = s.idem(&[
        "status",
        since[0],
        since[1],
        "--metrics-file",
        prom.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let metrics = std::fs::read_to_string(&prom).unwrap();
    for line in [
        "idem_job_missing_scopes{job=\"nightly\"} 2\n",
        "idem_job_failed_scopes{job=\"nightly\"} 1\n",
        "idem_job_running{job=\"nightly\"} 0\n",
        "# TYPE idem_job_last_success_timestamp_seconds gauge\n",
    ] {
        assert!(metrics.contains(line), "{line}: {metrics}");
    }

    let (code, doc, err) = s.json(&["run", "nightly", "--missing", "--since", "4d", "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    let listed = would_run(&doc);
    assert_eq!(
        listed,
        [&expected[0], &expected[1], &expected[2]],
        "oldest first"
    );
    let done = std::fs::read_to_string(s.dir.join("done-nightly.txt")).unwrap();
    assert_eq!(done, format!("{}\n", expected[3]), "a dry run runs nothing");

    std::fs::write(s.dir.join("ok"), "").unwrap();
    let out = s.idem(&[
        "run",
        "nightly",
        "--missing",
        "--since",
        "4d",
        "--parallel",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut done: Vec<String> = std::fs::read_to_string(s.dir.join("done-nightly.txt"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    done.sort();
    assert_eq!(
        done, expected,
        "each date ran once: the three needed, and the first run's"
    );
    let (code, doc, err) = s.json(&["status", "nightly", since[0], since[1]]);
    assert_eq!(code, 0, "{doc}\n{err}");
    assert_eq!(scopes_in(&doc, "nightly", "completed"), expected);
    let (code, _, _) = s.json(&["run", "nightly", "--missing", "--since", "4d"]);
    assert_eq!(code, 0, "nothing missing: nothing run");
}

/// A scope whose lease is held now is `running`, not missing, and `run --missing` leaves
/// it alone.
/// On a host that only wraps cron lines in `idem exec` (no jobs folder), `idem status`
/// lists the ledger's jobs with a note, names a date whose last run failed and exits 1,
/// so an alert on its exit code hears of a failed cron line; a later completed run of
/// that date clears it (exit 0).
#[test]
fn status_without_a_jobs_folder_names_a_failed_exec_date() {
    let s = Sandbox::new("idem-status-exec");
    let _ = std::fs::remove_dir_all(s.dir.join("jobs"));
    let exec = |program: &str| {
        let out = s.idem(&["exec", "backup", "--date", "2026-01-02", "--", program]);
        out.status.code()
    };
    assert_eq!(exec("false"), Some(1));
    let ok = s.idem(&["exec", "sync", "--date", "2026-01-02", "--", "true"]);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    let (code, doc, err) = s.json(&["status"]);
    assert_eq!(code, 1, "{doc}\n{err}");
    assert!(err.contains("no jobs folder"), "{err}");
    let job = |doc: &Value, name: &str| {
        doc["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["job"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} not listed: {doc}"))
    };
    assert_eq!(
        job(&doc, "backup")["failed"],
        serde_json::json!(["2026-01-02"])
    );
    assert_eq!(job(&doc, "sync")["failed"], serde_json::json!([]));
    let text = String::from_utf8_lossy(&s.idem(&["status"]).stdout).to_string();
    assert!(text.contains("failed 2026-01-02"), "{text}");
    // Run again and completed: nothing needs attention.
    assert_eq!(exec("true"), Some(0));
    let (code, doc, err) = s.json(&["status"]);
    assert_eq!(code, 0, "{doc}\n{err}");
    assert_eq!(job(&doc, "backup")["failed"], serde_json::json!([]));
}

#[test]
fn status_shows_a_running_scope_as_running() {
    let s = Sandbox::new("idem-status-running");
    let hour = (chrono::Utc::now() + chrono::Duration::hours(12)).format("%H");
    s.write_job(
        "slow",
        &format!(
            r#"
name = "slow"
processor = "command"
schedule = "0 {hour} * * *"
date = "yesterday"
[guards]
lease = "10m"
[command]
run = ["sh", "-c", "echo started >&2; while [ ! -f {dir}/go ]; do sleep 0.05; done"]
"#,
            dir = s.dir.display()
        ),
    );
    let (_, doc, _) = s.json(&["status", "slow", "--since", "2d"]);
    let scopes = scopes_in(&doc, "slow", "missing");
    let newest = scopes.last().expect("a scope").clone();
    let mut child = s
        .command(&["run", "slow", "--date", &newest])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The program printed: it runs, so the lease is held.
    common::StderrWatch::of(&mut child).until("started");
    let (code, doc, err) = s.json(&["status", "slow", "--since", "2d"]);
    assert_eq!(
        scopes_in(&doc, "slow", "running"),
        std::slice::from_ref(&newest),
        "{doc}\n{err}"
    );
    assert_eq!(code, 1, "the older scope is still missing");
    let (_, doc, _) = s.json(&["run", "slow", "--missing", "--since", "2d", "--dry-run"]);
    let listed = would_run(&doc);
    assert!(!listed.contains(&newest.as_str()), "{doc}");
    std::fs::write(s.dir.join("go"), "").unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// A run SIGKILLed while it holds its scope leaves only its lease (no row, no key): `idem
/// release` frees it for a job without a job file (an `idem exec` job), only when asked
/// with --yes (no terminal here), and records it; the next run of the scope then runs at
/// once instead of waiting out the lease. `purge` takes an exec job's name too.
#[test]
fn release_frees_a_dead_runs_lease_and_purge_takes_an_exec_jobs_name() {
    let s = Sandbox::new("idem-release");
    let date = "2025-11-18";
    let exec = |name: &str, program: &[&str]| {
        let mut args = vec!["exec", name, "--date", date, "--time-window", "20h"];
        args.extend(["--lease", "1h", "--"]);
        args.extend(program);
        s.command(&args)
    };
    let mut held = exec(
        "nightly_export",
        &["sh", "-c", "echo started >&2; exec sleep 120"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    common::StderrWatch::of(&mut held).until("started");
    kill("KILL", &held);
    let _ = held.wait();
    let out = exec("nightly_export", &["true"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.starts_with("skipped nightly_export for 2025-11-18 (in_progress)"),
        "{text}"
    );

    // explain takes the exec job's name: the ledger's view (the dead run's lease).
    let (code, doc, err) = s.json(&["explain", "nightly_export", "--date", date]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(doc["job_file"], false, "{doc}");
    let holder = doc["lease"]["run_id"].as_str().expect("held").to_string();
    // No terminal to ask on: refused, nothing freed.
    let release = ["release", "nightly_export", "--date", date];
    let out = s.idem(&release);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("add --yes"), "{}", stderr(&out));
    let (code, doc, err) = s.json(&[&release[..], &["--yes"]].concat());
    assert_eq!(code, 0, "{doc}\n{err}");
    let freed = doc["released"]["run_id"]
        .as_str()
        .expect("the dead run's lease")
        .to_string();
    assert_eq!(freed, holder);
    // Recorded: a skipped run of the scope, reason `released`, pointing at the dead run.
    let (_, runs, _) = s.json(&["runs", "--job", "nightly_export"]);
    let row = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["skip_reason"]["custom"] == "released");
    let row = row.expect("the release in the ledger");
    assert_eq!(row["previous_run_id"], freed.as_str());
    assert_eq!(row["run_id"], doc["run_id"]);
    let (_, doc, _) = s.json(&["explain", "nightly_export", "--date", date]);
    assert_eq!(doc["lease"], Value::Null, "{doc}");
    // Nothing held any more: said, exit 0.
    let (code, doc, _) = s.json(&[&release[..], &["--yes"]].concat());
    assert_eq!((code, doc["released"].clone()), (0, Value::Null));
    let out = exec("nightly_export", &["true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.starts_with("completed nightly_export for 2025-11-18"),
        "{text}"
    );

    // purge by the exec job's name: the next run is not skipped.
    let out = s.idem(&["purge", "nightly_export", "--date", date, "--yes"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = exec("nightly_export", &["true"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.starts_with("completed nightly_export"), "{text}");
    // A name neither a job file nor the ledger knows, holding nothing: a usage error.
    let out = s.idem(&["release", "nosuch", "--scope", "x", "--yes"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nor has the ledger any run of \"nosuch\""),
        "{}",
        stderr(&out)
    );
}

/// `purge` and `release` of a name no job file has, where no ledger exists yet: a usage
/// error, and no ledger file made by asking.
#[test]
fn purge_and_release_of_an_unknown_name_create_no_ledger() {
    let s = Sandbox::new("idem-release-none");
    for args in [
        &["purge", "nosuch", "--date", "2025-01-01", "--yes"][..],
        &["release", "nosuch", "--scope", "x", "--yes"],
    ] {
        let out = s.idem(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(!s.dir.join("idem.db").exists(), "{args:?} made a ledger");
    }
}

/// A run is visible from the moment it holds its scope (issue 37.1): a running `idem exec`
/// is listed `running` by `idem runs` (human and JSON) with its host, its pid and its last
/// heartbeat; SIGKILLed, it is shown `abandoned` once its lease expired, `runs --status`
/// selects either, and `idem status` exits 1 naming the abandoned scope. The next run
/// takes the scope over and completes it.
#[test]
fn a_running_exec_is_listed_running_and_a_killed_one_abandoned_once_its_lease_expired() {
    let s = Sandbox::new("idem-open-runs");
    let date = "2025-11-18";
    // The day before, completed: the job is in the report's period.
    let out = s.idem(&["exec", "long_export", "--date", "2025-11-17", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let pid_file = s.dir.join("program.pid");
    let script = format!(
        "echo $$ > {}; echo started >&2; exec sleep 60",
        pid_file.display()
    );
    let mut held = s
        .command(&[
            "exec",
            "long_export",
            "--date",
            date,
            "--lease",
            "2s",
            "--grace",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::StderrWatch::of(&mut held).until("started");
    let open = |status: &str| -> Vec<Value> {
        let (code, v, err) = s.json(&["runs", "--status", status]);
        assert_eq!(code, 0, "{err}");
        v.as_array().unwrap().clone()
    };
    let running = open("running");
    assert_eq!(running.len(), 1, "{running:?}");
    let run = &running[0];
    assert_eq!(run["status"], "running", "{run}");
    assert_eq!(run["processor"], "long_export");
    assert_eq!(run["scope"], date);
    assert_eq!(run["pid"], u64::from(held.id()), "{run}");
    assert!(!run["host"].as_str().unwrap_or("").is_empty(), "{run}");
    assert!(run["heartbeat_at"].is_string(), "{run}");
    let run_id = run["run_id"].as_str().unwrap().to_string();
    let text = stdout(&s.idem(&["runs"]));
    assert!(
        text.contains(&format!("running   long_export {date}  run {run_id}  "))
            && text.contains(&format!(":{}", held.id())),
        "{text}"
    );
    assert_eq!(open("completed").len(), 1, "the day before only");

    kill("KILL", &held);
    let _ = held.wait();
    let program = std::fs::read_to_string(&pid_file).unwrap();
    let _ = Command::new("kill").arg(program.trim()).status();
    common::wait_until(
        "the killed run's lease expires",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || !open("abandoned").is_empty(),
    );
    let abandoned = open("abandoned");
    assert_eq!(abandoned[0]["run_id"], run_id.as_str(), "{abandoned:?}");
    assert!(open("running").is_empty());
    let out = s.idem(&["status", "long_export"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("abandoned {date}")),
        "{}",
        stdout(&out)
    );
    let (code, report, err) = s.json(&["report"]);
    assert_eq!(code, 0, "{err}");
    let runs = &report["processors"][0]["runs"];
    assert_eq!(
        (
            &runs["completed_runs"],
            &runs["running_runs"],
            &runs["abandoned_runs"]
        ),
        (&Value::from(1), &Value::from(0), &Value::from(1)),
        "{report}"
    );

    // The next run takes the expired lease over and completes the date.
    let out = s.idem(&["exec", "long_export", "--date", date, "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(open("abandoned").is_empty());
    let (code, v, err) = s.json(&["runs"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v[0]["status"], "completed", "{v}");
    let out = s.idem(&["status", "long_export"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}
