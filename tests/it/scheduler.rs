//! `idem scheduler` as a user meets it: an every-second job fires and is recorded with
//! trigger `scheduler`, SIGTERM stops the loop cleanly (exit 0) after letting a running job
//! finish or, past the grace period, recording it as interrupted with its lease released;
//! two schedulers (and manual runs beside them) on one store never complete a scope twice.

use std::collections::BTreeMap;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common;

use common::Sandbox;

/// An every-second job named `name` whose `process` records the scope in `out` (in
/// `jobs/wh.db`) after `work` (SQL).
fn ticking_job(name: &str, extra: &str, work: &str) -> String {
    format!(
        r#"
name = "{name}"
processor = "sql"
schedule = "* * * * * *"
{extra}
[guards]
time_window = "1h"
[sql]
warehouse = "sqlite://wh.db"
setup = "CREATE TABLE IF NOT EXISTS out (job TEXT, day TEXT)"
process = """{work}; INSERT INTO out VALUES ('{name}', @scope)"""
"#
    )
}

/// A recursive count that keeps SQLite busy for about `n / 4_000_000` CPU seconds (SQLite
/// at -O1, Cargo.toml).
fn count_to(n: u64) -> String {
    format!("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n}) SELECT count(*) FROM c")
}

fn runs(s: &Sandbox, job: &str) -> Vec<Value> {
    let (code, v, err) = s.json(&["runs", "--job", job, "--limit", "0"]);
    assert_eq!(code, 0, "{err}");
    v.as_array().cloned().unwrap_or_default()
}

/// Completed runs per scope.
fn completed_per_scope(runs: &[Value]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in runs.iter().filter(|r| r["status"] == "completed") {
        *out.entry(r["scope"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    out
}

fn scheduler(s: &Sandbox, args: &[&str]) -> Child {
    let mut all = vec!["scheduler"];
    all.extend(args);
    s.command(&all)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start idem scheduler")
}

fn sigterm(child: &Child) {
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
}

/// Waits for `child` to exit, at most `limit`; kills it (and fails) past that.
fn wait_exit(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "the scheduler did not stop within {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A process whose stderr is read as it is written, so a test can wait for a line (a
/// state) instead of sleeping; the pipe never fills.
struct Watched {
    child: Child,
    log: std::sync::Arc<std::sync::Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// A test that fails while its process runs leaves no process behind.
impl Drop for Watched {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Watched {
    /// Starts `command` with its stderr piped and read line by line.
    fn start(mut command: Command) -> Watched {
        use std::io::BufRead;
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start idem");
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let reader = {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
            })
        };
        Watched {
            child,
            log,
            reader: Some(reader),
        }
    }

    /// Waits (at most 60 s) until a line of the log satisfies `done`.
    fn wait_for_line(&mut self, what: &str, done: impl Fn(&str) -> bool) {
        let start = Instant::now();
        while !self.log.lock().unwrap().lines().any(&done) {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "exited ({status}) before {what}: {}",
                    self.log.lock().unwrap()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no {what} in 60 s: {}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then its exit code and whole stderr (at most `limit` to stop).
    fn stop(mut self, limit: Duration) -> (Option<i32>, String) {
        sigterm(&self.child);
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "it did not stop within {limit:?}: {}",
                    self.log.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        let log = self.log.lock().unwrap().clone();
        (status.code(), log)
    }
}

/// Polls until `done` holds for the job's runs (at most 60 s).
fn wait_for_runs(s: &Sandbox, job: &str, what: &str, done: impl Fn(&[Value]) -> bool) {
    let start = Instant::now();
    loop {
        let r = runs(s, job);
        if done(&r) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_every_second_job_fires_is_recorded_as_scheduler_runs_and_sigterm_stops_the_loop() {
    let s = Sandbox::new("idem-scheduler-tick");
    s.write_job("tick", &ticking_job("tick", "", "SELECT 1"));
    s.write_job(
        "manual",
        &ticking_job("manual", "", "SELECT 1").replace("schedule = \"* * * * * *\"", ""),
    );
    assert_eq!(s.idem(&["migrate"]).status.code(), Some(0));
    let child = scheduler(&s, &[]);
    wait_for_runs(&s, "tick", "three fires", |r| r.len() >= 3);
    sigterm(&child);
    let out = wait_exit(child, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(0), "{err}");

    let ledger = runs(&s, "tick");
    assert!(ledger.len() >= 3, "{ledger:?}");
    assert!(
        ledger.iter().all(|r| r["trigger"] == "scheduler"),
        "{ledger:?}"
    );
    // The date is the slot's date in the job's zone (UTC): the scope of every run.
    for r in &ledger {
        let started = r["started_at"].as_str().unwrap();
        assert_eq!(r["scope"].as_str().unwrap(), &started[..10], "{r}");
    }
    // The first fire of a day completes; the time window skips the later ones.
    let per_scope = completed_per_scope(&ledger);
    assert!(per_scope.values().all(|n| *n == 1), "{per_scope:?}");
    assert!(
        ledger
            .iter()
            .filter(|r| r["status"] == "skipped")
            .all(|r| r["skip_reason"] == "time_window"),
        "{ledger:?}"
    );
    assert_eq!(s.warehouse_days().len(), per_scope.len());
    // One log line per fire, naming the job, the slot, the date and the outcome.
    let fire_lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("fire tick slot"))
        .collect();
    assert_eq!(fire_lines.len(), ledger.len(), "{err}");
    assert!(
        fire_lines[0].contains(" date ") && fire_lines[0].contains(": completed, 1 record(s)"),
        "{err}"
    );
    assert!(err.contains("scheduler stopped:"), "{err}");
    // The job without a schedule never fired.
    assert!(runs(&s, "manual").is_empty());
}

/// Two schedulers on `store`, and `idem run` beside them, for about four seconds: each
/// scope completes once.
fn two_schedulers_never_complete_a_scope_twice(s: &Sandbox, job: &str) {
    s.write_job(job, &ticking_job(job, "", &count_to(300_000)));
    assert_eq!(s.idem(&["migrate"]).status.code(), Some(0));
    let a = scheduler(s, &[job]);
    let b = scheduler(s, &[job]);
    let path = s.dir.join("jobs").join(format!("{job}.toml"));
    let path = path.to_str().unwrap();
    let start = Instant::now();
    let mut manual = Vec::new();
    while start.elapsed() < Duration::from_secs(4) {
        let (code, v, err) = s.json(&["run", path, "--date", "today"]);
        assert!(code == 0, "{v} {err}");
        manual.push(v["status"].as_str().unwrap().to_string());
    }
    wait_for_runs(s, job, "fires of both schedulers", |r| {
        r.iter().filter(|r| r["trigger"] == "scheduler").count() >= 6
    });
    sigterm(&a);
    sigterm(&b);
    let (a, b) = (
        wait_exit(a, Duration::from_secs(30)),
        wait_exit(b, Duration::from_secs(30)),
    );
    for out in [&a, &b] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert!(
            err.contains(&format!("fire {job} slot")),
            "each scheduler fired: {err}"
        );
        // A fire waiting to try a held scope again stops waiting at SIGTERM: it neither
        // holds the shutdown for the grace period nor is recorded interrupted.
        assert!(
            !err.contains("grace period ended") && err.contains(", 0 interrupted"),
            "{err}"
        );
    }
    let ledger = runs(s, job);
    let per_scope = completed_per_scope(&ledger);
    assert!(
        per_scope.values().all(|n| *n == 1),
        "a scope completed twice: {per_scope:?} {ledger:?}"
    );
    assert!(!per_scope.is_empty(), "{ledger:?}");
    assert_eq!(
        s.warehouse_days().len(),
        per_scope.len(),
        "the work ran once per scope"
    );
    let scheduler_runs = ledger
        .iter()
        .filter(|r| r["trigger"] == "scheduler")
        .count();
    let manual_runs = ledger.iter().filter(|r| r["trigger"] == "manual").count();
    assert!(scheduler_runs >= 6, "{ledger:?}");
    assert_eq!(manual_runs, manual.len(), "{ledger:?}");
    for r in ledger.iter().filter(|r| r["status"] == "skipped") {
        assert!(
            r["skip_reason"] == "time_window" || r["skip_reason"] == "in_progress",
            "{r}"
        );
    }
}

#[test]
fn two_schedulers_and_manual_runs_on_one_sqlite_store_never_complete_a_scope_twice() {
    let s = Sandbox::new("idem-scheduler-two");
    two_schedulers_never_complete_a_scope_twice(&s, "twice");
}

#[test]
fn two_schedulers_and_manual_runs_on_postgres_never_complete_a_scope_twice() {
    let Some(url) = common::service_url(
        "IDEM_TEST_POSTGRES_URL",
        "two_schedulers_and_manual_runs_on_postgres_never_complete_a_scope_twice",
        common::POSTGRES_HOW,
    ) else {
        return;
    };
    let s = Sandbox::with_store("idem-scheduler-two-pg", &url);
    let job = format!("twice_{}", &idem::new_run_id()[..8]);
    two_schedulers_never_complete_a_scope_twice(&s, &job);
}

#[test]
fn sigterm_lets_a_running_job_finish_within_the_grace_period() {
    let s = Sandbox::new("idem-scheduler-grace");
    s.write_job("medium", &ticking_job("medium", "", &count_to(12_000_000)));
    assert_eq!(s.idem(&["migrate"]).status.code(), Some(0));
    let child = scheduler(&s, &["--grace", "120s"]);
    let start = Instant::now();
    loop {
        let (_, e, _) = s.json(&["explain", "medium", "--date", "today"]);
        if e["skip_reason"] == "in_progress" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never claimed: {e}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    sigterm(&child);
    let out = wait_exit(child, Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("SIGTERM received: no new fires; waiting up to 120s"),
        "{err}"
    );
    let ledger = runs(&s, "medium");
    let completed = completed_per_scope(&ledger);
    assert_eq!(completed.values().sum::<usize>(), 1, "{ledger:?}");
    assert!(ledger.iter().all(|r| r["status"] != "failed"), "{ledger:?}");
    assert_eq!(s.warehouse_days().len(), 1);
}

/// A process block that runs for many seconds.
const VERY_SLOW: u64 = 200_000_000;

#[test]
fn past_the_grace_period_a_running_job_is_recorded_interrupted_and_its_lease_released() {
    let s = Sandbox::new("idem-scheduler-interrupt");
    s.write_job("slow", &ticking_job("slow", "", &count_to(VERY_SLOW)));
    assert_eq!(s.idem(&["migrate"]).status.code(), Some(0));
    let child = scheduler(&s, &["slow", "--grace", "1s"]);
    let start = Instant::now();
    loop {
        let (_, e, _) = s.json(&["explain", "slow", "--date", "today"]);
        if e["skip_reason"] == "in_progress" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never claimed: {e}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let stopped = Instant::now();
    sigterm(&child);
    let out = wait_exit(child, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        stopped.elapsed() >= Duration::from_secs(1),
        "the grace period was waited"
    );
    assert!(err.contains("the 1s grace period ended"), "{err}");
    let ledger = runs(&s, "slow");
    let failed: Vec<&Value> = ledger.iter().filter(|r| r["status"] == "failed").collect();
    assert_eq!(failed.len(), 1, "{ledger:?}");
    assert_eq!(
        failed[0]["error"], "interrupted by SIGTERM: the scheduler's 1s grace period ended",
        "{ledger:?}"
    );
    assert_eq!(failed[0]["trigger"], "scheduler");
    assert!(
        ledger.iter().all(|r| r["status"] != "completed"),
        "{ledger:?}"
    );
    assert!(s.warehouse_days().is_empty(), "nothing half-written");
    let (_, e, _) = s.json(&["explain", "slow", "--date", "today"]);
    assert_eq!(e["decision"], "run", "the lease is released: {e}");
}

#[test]
fn past_the_grace_period_a_fire_waiting_for_the_lease_stops_too() {
    let s = Sandbox::new("idem-scheduler-wait");
    let job = ticking_job("slow", "", &count_to(VERY_SLOW)).replace(
        "time_window = \"1h\"",
        "lease = \"1h\"\non_in_progress = \"wait\"\nwait = \"1h\"",
    );
    s.write_job("slow", &job);
    assert_eq!(s.idem(&["migrate"]).status.code(), Some(0));
    // A manual run holds today's scope; every fire waits for it (up to an hour).
    let mut holder = s
        .command(&["run", "slow", "--date", "today", "--run-id", "the-holder"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        let (_, e, _) = s.json(&["explain", "slow", "--date", "today"]);
        if e["skip_reason"] == "in_progress" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never claimed: {e}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGTERM once a fire waits for the holder's lease (the lease guard says so).
    let mut command = s.command(&["scheduler", "slow", "--grace", "1s"]);
    command.env("RUST_LOG", "info");
    let mut scheduler = Watched::start(command);
    scheduler.wait_for_line("a fire waiting for the holder's lease", |l| {
        l.contains("run the-holder holds the lease on slow") && l.contains("waiting up to 1h")
    });
    let (code, err) = scheduler.stop(Duration::from_secs(15));
    assert_eq!(code, Some(0), "{err}");
    let ledger = runs(&s, "slow");
    let fires: Vec<&Value> = ledger
        .iter()
        .filter(|r| r["trigger"] == "scheduler")
        .collect();
    assert!(!fires.is_empty(), "{ledger:?}\n{err}");
    for r in &fires {
        assert_eq!(r["status"], "failed", "{ledger:?}");
        assert!(
            r["error"].as_str().unwrap().starts_with(
                "interrupted by SIGTERM: the scheduler's 1s grace period ended, before processing"
            ),
            "{ledger:?}"
        );
    }
    // They claimed nothing: the holder still holds the scope.
    let (_, e, _) = s.json(&["explain", "slow", "--date", "today"]);
    assert!(
        e["detail"]
            .as_str()
            .unwrap()
            .contains("run the-holder holds"),
        "{e}"
    );
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn bad_scheduler_input_exits_2_naming_what_is_wrong() {
    let s = Sandbox::new("idem-scheduler-bad");
    assert_eq!(s.idem(&["migrate"]).status.code(), Some(0));
    s.write_job(
        "plain",
        &ticking_job("plain", "", "SELECT 1").replace("schedule = \"* * * * * *\"", ""),
    );
    let out = s.idem(&["scheduler"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("has a schedule: nothing to fire"));
    let out = s.idem(&["scheduler", "plain"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("job plain has no schedule"));
    s.write_job(
        "late",
        &ticking_job("late", "missed = \"later\"", "SELECT 1"),
    );
    let out = s.idem(&["scheduler"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("late.toml")
            && err.contains("missed = \"later\": expected \"skip\" or \"catch_up\""),
        "{err}"
    );
    s.write_job(
        "late",
        &ticking_job(
            "late",
            "missed = \"catch_up\"\ncatch_up_limit = 0",
            "SELECT 1",
        ),
    );
    let out = s.idem(&["scheduler", "late"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("catch_up_limit = 0"));
    s.write_job("late", &ticking_job("late", "", "SELECT 1"));
    let out = s.idem(&["scheduler", "late", "--grace", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--grace: bad duration \"soon\""));
    assert!(runs(&s, "late").is_empty(), "nothing fired");
}

/// The scheduler's stderr once every one of `lines` has a line of its log containing it
/// (at most 60 s), then a SIGTERM.
fn run_until(s: &Sandbox, args: &[&str], lines: &[&str]) -> String {
    let mut all = vec!["scheduler"];
    all.extend(args);
    let mut scheduler = Watched::start(s.command(&all));
    for want in lines {
        scheduler.wait_for_line(want, |l| l.contains(want));
    }
    let (code, err) = scheduler.stop(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
    err
}

#[test]
fn on_restart_catch_up_fires_each_missed_date_once_and_skip_does_not() {
    let s = Sandbox::new("idem-scheduler-catch-up");
    s.write_job(
        "late",
        &ticking_job(
            "late",
            "missed = \"catch_up\"\ncatch_up_limit = 2",
            "SELECT 1",
        ),
    );
    s.write_job("lost", &ticking_job("lost", "", "SELECT 1"));
    assert_eq!(s.idem(&["migrate"]).status.code(), Some(0));
    // First start: no scheduler run in the ledger yet, so no history is fired.
    let first = run_until(&s, &[], &["fire late slot", "fire lost slot"]);
    assert!(!first.contains("(catch-up)"), "{first}");
    assert!(
        first.contains("scheduler started with 2 job(s): late (catch_up 2), lost"),
        "{first}"
    );
    wait_for_runs(&s, "late", "a fire", |r| !r.is_empty());
    // Down for several seconds: at least three slots are missed. Every one of them would
    // process today's date, which the first fire after the restart processes anyway: no
    // catch-up fire runs the same scope again beside it.
    std::thread::sleep(Duration::from_secs(4));
    let second = run_until(&s, &[], &["fire late slot", "fire lost slot"]);
    let fires_of = |log: &str, job: &str| {
        log.lines()
            .filter(|l| l.contains(&format!("fire {job} slot")))
            .count()
    };
    assert!(fires_of(&second, "late") >= 1, "{second}");
    // (A downtime across midnight UTC fires yesterday once as a catch-up: a distinct date.)
    let date_of = |l: &str| l.split(" date ").nth(1).map(|d| d[..10].to_string());
    let caught_up: Vec<_> = second
        .lines()
        .filter(|l| l.contains("fire late slot") && l.contains("(catch-up)"))
        .filter_map(date_of)
        .collect();
    let on_time: Vec<_> = second
        .lines()
        .filter(|l| l.contains("fire late slot") && !l.contains("(catch-up)"))
        .filter_map(date_of)
        .collect();
    assert!(
        caught_up.len() <= 1 && caught_up.iter().all(|d| !on_time.contains(d)),
        "missed slots of the date being fired are covered by that fire: {second}"
    );
    assert!(
        !second
            .lines()
            .any(|l| l.contains("fire lost slot") && l.contains("(catch-up)")),
        "a skip job fires no missed slot: {second}"
    );
    // Every fire is recorded, and no two fires of one scope ran at once.
    let late = runs(&s, "late");
    assert_eq!(
        late.len(),
        fires_of(&first, "late") + fires_of(&second, "late")
    );
    assert!(
        late.iter().all(|r| r["skip_reason"] != "in_progress"),
        "{late:?}"
    );
}

/// A scheduler SIGKILLed mid-fire leaves the slot's lease held by a dead run. The next
/// scheduler's fire of that slot meets the lease (`skipped (in_progress)`): that skip must
/// not settle the slot. The fire tries again when the dead lease expires and the date is
/// processed (issue 21.3a; on the old code the date was never processed).
#[test]
fn a_fire_that_meets_a_dead_schedulers_lease_runs_when_the_lease_expires() {
    let s = Sandbox::new("idem-scheduler-killed");
    // One slot, a few seconds from now.
    let slot = chrono::Utc::now() + chrono::Duration::seconds(3);
    let today = slot.date_naive().to_string();
    // The slot's first run says it started (the folder `started`, made atomically, with
    // its PID) and then works until it is killed; any other run completes at once. So the
    // scheduler is killed while the slot's run works, whatever the machine's speed (it was
    // killed 1.5 s after the slot, which a fast run had already finished).
    let job = |schedule: &str| {
        format!(
            r#"
name = "slow"
processor = "command"
schedule = "{schedule}"
timezone = "UTC"
date = "today"
missed = "catch_up"
[guards]
lease = "3s"
[command]
grace = "1s"
run = ["sh", "-c", "if [ {{date}} = {today} ] && mkdir started 2>/dev/null; then echo $$ > started/pid; exec sleep 300; fi; echo done"]
"#
        )
    };
    // An earlier scheduled fire in the ledger (so a restart catches up after it).
    s.write_job("slow", &job("0 0 1 1 *"));
    let (code, _, err) = s.json(&[
        "run",
        "slow",
        "--date",
        "2020-01-01",
        "--trigger",
        "scheduler",
    ]);
    assert_eq!(code, 0, "{err}");
    use chrono::{Datelike, Timelike};
    let schedule = format!(
        "{} {} {} {} {} *",
        slot.second(),
        slot.minute(),
        slot.hour(),
        slot.day(),
        slot.month()
    );
    s.write_job("slow", &job(&schedule));
    let mut first = scheduler(&s, &[]);
    // Killed while the slot's run works.
    // The program runs in the job file's folder.
    let pid_file = s.dir.join("jobs/started/pid");
    let waited = std::time::Instant::now();
    while !std::fs::read_to_string(&pid_file).is_ok_and(|p| p.ends_with('\n')) {
        assert!(
            waited.elapsed() < Duration::from_secs(120),
            "the slot's run never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    // The dead scheduler's program, if it outlived it.
    let program = std::fs::read_to_string(&pid_file).unwrap();
    let _ = Command::new("kill")
        .args(["-KILL", program.trim()])
        .stderr(Stdio::null())
        .status();
    assert!(
        !completed_per_scope(&runs(&s, "slow")).contains_key(&today),
        "the killed fire recorded nothing"
    );
    // The next scheduler fires the slot again; it meets the dead run's lease, and tries
    // again once the lease has expired.
    let second = scheduler(&s, &[]);
    wait_for_runs(&s, "slow", "the slot's date completed", |r| {
        completed_per_scope(r).get(&today) == Some(&1)
    });
    sigterm(&second);
    let out = wait_exit(second, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("skipped (in_progress)")
            && err.contains("tries again when that lease expires"),
        "{err}"
    );
    assert!(err.contains(&format!("date {today}: completed")), "{err}");
}

/// Issue 21.10: a scheduler whose store cannot be reached at start does not exit: a
/// `best_effort` + `catch_up` job (that cannot read its last fire) and a `strict` one are
/// logged, and the `best_effort` job's fires still run (their runs spooled for the store).
#[test]
fn a_store_down_at_start_stops_no_job() {
    let s = Sandbox::with_store(
        "idem-scheduler-store-down",
        "postgres://idem@127.0.0.1:1/nowhere?connect_timeout=1",
    );
    s.write_job(
        "lenient",
        &ticking_job(
            "lenient",
            "missed = \"catch_up\"\nstore_failure = \"best_effort\"",
            "SELECT 1",
        ),
    );
    s.write_job("picky", &ticking_job("picky", "", "SELECT 1"));
    let mut command = s.command(&["scheduler"]);
    command.env("IDEM_SPOOL_DIR", s.dir.join("spool"));
    let mut scheduler = Watched::start(command);
    // The best_effort job fires: its first fire's outcome is logged (the scheduler would
    // have exited at start on the old code).
    scheduler.wait_for_line("fire of the best_effort job", |l| {
        l.contains("fire lenient slot")
    });
    let (code, err) = scheduler.stop(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("scheduler started with 2 job(s)"), "{err}");
}

/// The last scheduled fire is asked of the store directly: a backfill of more than 1,000
/// dates after it (newer runs than any `runs` page the scheduler once read) does not hide
/// it, so the slots missed while no scheduler ran are still reported (issue 21.3c: on the
/// old code, which looked through the 1,000 newest runs only, the restart said nothing).
#[test]
fn a_backfill_of_1100_dates_does_not_hide_the_last_scheduled_fire() {
    let s = Sandbox::new("idem-scheduler-long-backfill");
    s.write_job("lost", &ticking_job("lost", "", "SELECT 1"));
    assert_eq!(s.idem(&["migrate"]).status.code(), Some(0));
    run_until(&s, &[], &["fire lost slot"]);
    wait_for_runs(&s, "lost", "a scheduled fire", |r| {
        r.iter().any(|r| r["trigger"] == "scheduler")
    });
    let out = s.idem(&[
        "run",
        "lost",
        "--from",
        "2021-01-01",
        "--to",
        "2024-01-05",
        "--parallel",
        "4",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = runs(&s, "lost");
    let backfilled = all.iter().filter(|r| r["trigger"] == "backfill").count();
    assert_eq!(backfilled, 1100);
    // Down for a few seconds: slots are missed, and the restart says so.
    std::thread::sleep(Duration::from_secs(3));
    let log = run_until(&s, &[], &["not fired (missed-fire policy)"]);
    assert!(
        log.lines()
            .any(|l| l.contains("missed") && l.contains("not fired (missed-fire policy)")),
        "{log}"
    );
}

/// A command job firing every second whose program, stopped by SIGTERM, takes a second
/// more and then writes when it ended (nanoseconds since the epoch) to `jobs/NAME.ended`.
fn slow_to_stop_job(name: &str) -> String {
    format!(
        r#"name = "{name}"
processor = "command"
schedule = "* * * * * *"
[guards]
time_window = "1h"
[command]
grace = "20s"
run = ["sh", "-c", "trap 'sleep 1; date +%s%N > {name}.ended; exit 0' TERM; touch {name}.started; while :; do sleep 0.1; done"]
"#
    )
}

#[test]
fn runs_stopped_at_once_in_one_scheduler_are_each_recorded_after_their_own_program_ended() {
    // Two runs interrupted together: each waits for its own program's stop. With one list
    // of stops for the whole process, the first run to wait took both; the second found
    // none, was recorded interrupted and its lease released while its program still ran.
    let s = Sandbox::new("idem-scheduler-own-stops");
    let names = ["stop-a", "stop-b", "stop-c"];
    for name in names {
        s.write_job(name, &slow_to_stop_job(name));
    }
    assert_eq!(s.idem(&["migrate"]).status.code(), Some(0));
    let mut args: Vec<&str> = names.to_vec();
    args.extend(["--grace", "1s"]);
    let child = scheduler(&s, &args);
    let jobs = s.dir.join("jobs");
    let start = Instant::now();
    while !names
        .iter()
        .all(|n| jobs.join(format!("{n}.started")).exists())
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the programs never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    sigterm(&child);
    let out = wait_exit(child, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(0), "{err}");
    for name in names {
        let ended = std::fs::read_to_string(jobs.join(format!("{name}.ended")))
            .unwrap_or_else(|e| panic!("{name} never ended ({e}): {err}"));
        let ended_ns: i64 = ended.trim().parse().unwrap();
        let ledger = runs(&s, name);
        let interrupted: Vec<&Value> = ledger.iter().filter(|r| r["status"] == "failed").collect();
        assert_eq!(interrupted.len(), 1, "{name}: {ledger:?}");
        let finished =
            chrono::DateTime::parse_from_rfc3339(interrupted[0]["finished_at"].as_str().unwrap())
                .unwrap();
        let finished_ns = finished.timestamp_nanos_opt().unwrap();
        assert!(
            finished_ns >= ended_ns,
            "{name}: recorded (and its lease released) {} ms before its program ended: {err}",
            (ended_ns - finished_ns) / 1_000_000
        );
    }
}

// `idem scheduler --listen ADDR`: /healthz, /readyz and /metrics over a real socket.

/// The address the scheduler logged as `listening on ADDR` (it binds port 0).
fn listening_on(scheduler: &mut Watched) -> std::net::SocketAddr {
    scheduler.wait_for_line("the listening address", |l| l.contains("listening on "));
    let log = scheduler.log.lock().unwrap().clone();
    let line = log.lines().find(|l| l.contains("listening on ")).unwrap();
    let addr = line.split("listening on ").nth(1).unwrap();
    addr.split_whitespace().next().unwrap().parse().unwrap()
}

/// One HTTP/1.1 request on a fresh connection: (status, content type, body).
fn http(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of headers: {response:?}"));
    let mut lines = head.lines();
    let status = lines.next().unwrap();
    assert!(status.starts_with("HTTP/1.1 "), "{status}");
    let code = status[9..12].parse().unwrap();
    let content_type = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    (code, content_type, body.to_string())
}

/// A sample of the text exposition format: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Reads the Prometheus text format strictly (no parser crate is in the tree): every
/// sample is `name{label="value",...} value` with a value that parses as f64, escapes in
/// label values are only `\\`, `\"` and `\n`, each family has one HELP and one TYPE line
/// (a known type) before its samples, and its samples follow its own TYPE line.
fn parse_metrics(text: &str) -> Vec<Sample> {
    fn is_name(s: &str) -> bool {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }
    let mut samples = Vec::new();
    let (mut helped, mut typed) = (
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
    );
    let mut family = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(is_name(name), "{line}");
            assert!(helped.insert(name.to_string()), "a second HELP: {line}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(is_name(name), "{line}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert!(helped.contains(name), "TYPE before HELP: {line}");
            assert!(typed.insert(name.to_string()), "a second TYPE: {line}");
            family = name.to_string();
            continue;
        }
        assert!(
            !line.starts_with('#') && !line.trim().is_empty(),
            "{line:?}"
        );
        let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("{line}"));
        let name = &line[..name_end];
        assert!(is_name(name), "{line}");
        assert_eq!(name, family, "a sample not after its own TYPE line: {line}");
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(inner) = rest.strip_prefix('{') {
            let mut chars = inner.char_indices().peekable();
            loop {
                let (start, c) = chars.next().unwrap_or_else(|| panic!("{line}"));
                if c == '}' {
                    rest = &inner[start + 1..];
                    break;
                }
                let eq = inner[start..].find('=').unwrap() + start;
                let key = &inner[start..eq];
                assert!(is_name(key), "label {key:?}: {line}");
                while chars.peek().is_some_and(|(i, _)| *i <= eq) {
                    chars.next();
                }
                assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "{line}");
                let mut value = String::new();
                loop {
                    match chars.next().unwrap_or_else(|| panic!("{line}")).1 {
                        '"' => break,
                        '\\' => match chars.next().unwrap().1 {
                            '\\' => value.push('\\'),
                            '"' => value.push('"'),
                            'n' => value.push('\n'),
                            other => panic!("escape \\{other}: {line}"),
                        },
                        c => value.push(c),
                    }
                }
                assert!(labels.insert(key.to_string(), value).is_none(), "{line}");
                if chars.peek().map(|(_, c)| *c) == Some(',') {
                    chars.next();
                }
            }
        }
        let value = rest.strip_prefix(' ').unwrap_or_else(|| panic!("{line}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|e| panic!("value {value:?} ({e}): {line}"));
        samples.push((name.to_string(), labels, value));
    }
    samples
}

/// The value of the sample `name` with these labels (0 when there is none).
fn metric(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .find(|(n, l, _)| {
            n == name
                && l.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map_or(0.0, |s| s.2)
}

fn scrape(addr: std::net::SocketAddr) -> Vec<Sample> {
    let (code, content_type, body) = http(addr, "GET", "/metrics");
    assert_eq!(code, 200, "{body}");
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    parse_metrics(&body)
}

/// An every-second job on a SQLite store, `--listen 127.0.0.1:0`: /healthz answers 200,
/// /metrics counts the fires as they happen and its completed count is the ledger's,
/// unknown paths are 404 and other methods 405; SIGTERM exits 0 and closes the port.
#[test]
fn listen_serves_health_and_metrics_fed_by_the_fires() {
    let s = Sandbox::new("idem-scheduler-listen");
    s.write_job("tick", &ticking_job("tick", "", "SELECT 1"));
    let mut scheduler = Watched::start(s.command(&["scheduler", "--listen", "127.0.0.1:0"]));
    let addr = listening_on(&mut scheduler);
    let (code, _, body) = http(addr, "GET", "/healthz");
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    // Every job's series are there from the start (at zero before its first fire).
    let first = scrape(addr);
    assert!(
        first
            .iter()
            .any(|(n, l, _)| n == "idem_scheduler_fires_total" && l["job"] == "tick"),
        "{first:?}"
    );
    assert_eq!(
        metric(
            &first,
            "idem_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    let mut samples = first;
    common::wait_until(
        "two fires counted in /metrics",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            samples = scrape(addr);
            metric(&samples, "idem_scheduler_fires_total", &[("job", "tick")]) >= 2.0
        },
    );
    // The first fire completes the day; later ones skip it (time_window): the completed
    // count is settled, and must be the ledger's.
    common::wait_until(
        "the first fire's run counted",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            samples = scrape(addr);
            metric(
                &samples,
                "idem_scheduler_completed_total",
                &[("job", "tick")],
            ) >= 1.0
        },
    );
    let ledger = runs(&s, "tick");
    let completed = ledger.iter().filter(|r| r["status"] == "completed").count();
    let skipped = ledger
        .iter()
        .filter(|r| r["status"] == "skipped" && r["skip_reason"] == "time_window")
        .count();
    assert_eq!(
        metric(
            &samples,
            "idem_scheduler_completed_total",
            &[("job", "tick")]
        ),
        completed as f64,
        "{ledger:?}"
    );
    assert_eq!(completed, 1, "{ledger:?}");
    // Skips counted by then are in the ledger (a run is recorded before it is counted).
    let counted_skips = metric(
        &samples,
        "idem_scheduler_skipped_total",
        &[("job", "tick"), ("reason", "time_window")],
    );
    assert!(
        counted_skips <= skipped as f64,
        "{counted_skips} > {skipped}"
    );
    assert_eq!(
        metric(&samples, "idem_scheduler_failed_total", &[("job", "tick")]),
        0.0
    );
    let last = metric(
        &samples,
        "idem_scheduler_last_completed_timestamp_seconds",
        &[("job", "tick")],
    );
    let now = chrono::Utc::now().timestamp() as f64;
    assert!(last > now - 120.0 && last <= now + 1.0, "{last} vs {now}");
    let lag = metric(
        &samples,
        "idem_scheduler_fire_lag_seconds",
        &[("job", "tick")],
    );
    assert!((0.0..60.0).contains(&lag), "{lag}");
    let (code, _, body) = http(addr, "GET", "/readyz");
    assert_eq!((code, body.as_str()), (200, "ready\n"));
    let probed = scrape(addr);
    assert_eq!(
        metric(&probed, "idem_scheduler_store_probe_success", &[]),
        1.0
    );
    assert!(metric(&probed, "idem_scheduler_store_probe_seconds", &[]) > 0.0);
    assert_eq!(http(addr, "GET", "/nope").0, 404);
    assert_eq!(http(addr, "POST", "/metrics").0, 405);
    let (code, err) = scheduler.stop(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let closed = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5));
    assert!(closed.is_err(), "{addr} still accepts connections");
}

/// `--listen nonsense` exits 2 saying what an address looks like; an address in use
/// (given through `IDEM_SCHEDULER_LISTEN`) exits 2 naming it, before any fire.
#[test]
fn a_bad_or_taken_listen_address_exits_naming_it() {
    let s = Sandbox::new("idem-scheduler-listen-bad");
    s.write_job("tick", &ticking_job("tick", "", "SELECT 1"));
    let out = s.idem(&["scheduler", "--listen", "nonsense"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--listen") && err.contains("nonsense") && err.contains("IP:PORT"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = s
        .command(&["scheduler"])
        .env("IDEM_SCHEDULER_LISTEN", &addr)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("fire tick"),
        "{err}"
    );
    assert!(runs(&s, "tick").is_empty());
}

/// /readyz asks the store at each request: on a private PostgreSQL server it answers 503
/// naming the store while the server is down (at start, and stopped later), and 200 once
/// it is up again.
#[test]
fn readyz_follows_the_store_down_and_up() {
    let test = "readyz_follows_the_store_down_and_up";
    if common::postgres_url(test).is_none() {
        return;
    }
    let Some(server) = common::private_pg::PrivatePostgres::start(test, &[]) else {
        return;
    };
    server.stop();
    let s = Sandbox::with_store("idem-scheduler-readyz", &server.url());
    s.write_job("tick", &ticking_job("tick", "", "SELECT 1"));
    let mut scheduler = Watched::start(s.command(&["scheduler", "--listen", "127.0.0.1:0"]));
    let addr = listening_on(&mut scheduler);
    let store = format!(
        "store postgres://postgres@127.0.0.1:{}/postgres",
        server.port
    );
    let readyz_until = |what: &str, want: u16| {
        let mut last = String::new();
        common::wait_until(
            what,
            Duration::from_secs(60),
            Duration::from_millis(200),
            || {
                let (code, _, body) = http(addr, "GET", "/readyz");
                last = body;
                code == want && (want == 200 || last.contains(&store))
            },
        );
        last
    };
    let down = readyz_until("/readyz 503 naming the store, down at start", 503);
    assert!(down.starts_with("not ready: "), "{down}");
    // The loop ticks whatever the store: alive, not ready.
    assert_eq!(http(addr, "GET", "/healthz").0, 200);
    server.start_again();
    assert_eq!(
        readyz_until("/readyz 200 once the store is up", 200),
        "ready\n"
    );
    server.stop();
    readyz_until("/readyz 503 naming the store, stopped", 503);
    let samples = scrape(addr);
    assert_eq!(
        metric(&samples, "idem_scheduler_store_probe_success", &[]),
        0.0
    );
    server.start_again();
    readyz_until("/readyz 200 once the store is back", 200);
    let (code, err) = scheduler.stop(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
}

/// A daily command job at `at` (UTC, to the second, date `today`, `missed = "catch_up"`),
/// with `top` more top-level lines, `guards` its `[guards]` lines and `command` its
/// `[command]` lines.
fn daily_job(
    name: &str,
    at: chrono::DateTime<chrono::Utc>,
    top: &str,
    guards: &str,
    command: &str,
) -> String {
    use chrono::Timelike;
    format!(
        r#"
name = "{name}"
processor = "command"
schedule = "{} {} {} * * *"
timezone = "UTC"
date = "today"
missed = "catch_up"
{top}
[guards]
{guards}
[command]
{command}
"#,
        at.second(),
        at.minute(),
        at.hour()
    )
}

/// A [`daily_job`] whose program writes `{scope}` to `started.txt`, waits for the file
/// `go-{scope}`, then writes `{scope}` to `done.txt` (in `dir`; paths absolute: a command
/// job runs in its job file's folder).
fn rollout_job(
    name: &str,
    at: chrono::DateTime<chrono::Utc>,
    dir: &std::path::Path,
    lease: &str,
) -> String {
    let d = dir.display();
    daily_job(
        name,
        at,
        "",
        &format!("lease = \"{lease}\"\ntime_window = \"20h\""),
        &format!(
            r#"run = ["sh", "-c", "echo {{scope}} >> {d}/started.txt; while [ ! -f {d}/go-{{scope}} ]; do sleep 0.05; done; echo {{scope}} >> {d}/done.txt"]
grace = "1s""#
        ),
    )
}

fn lines_of(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A job of `job`'s whose daily slot is due now, its yesterday completed by a settled
/// scheduler fire before the slot, so the slot is one replicas owe whenever they start (a
/// missed slot they catch up, or an on-time one: no race with their start-up). Returns
/// (yesterday, today) once the slot has passed.
fn slot_due_now(s: &Sandbox, job: &str, lease: &str) -> (String, String) {
    slot_due_now_of(s, job, |at| rollout_job(job, at, &s.dir, lease))
}

/// [`slot_due_now`] for the job file `make(slot)` writes.
fn slot_due_now_of(
    s: &Sandbox,
    job: &str,
    make: impl Fn(chrono::DateTime<chrono::Utc>) -> String,
) -> (String, String) {
    let now = chrono::Utc::now();
    let yesterday = (now - chrono::Duration::days(1)).date_naive().to_string();
    std::fs::write(s.dir.join(format!("go-{yesterday}")), "").unwrap();
    let write = |at| s.write_job(job, &make(at));
    write(now + chrono::Duration::days(2));
    let (code, _, err) = s.json(&["run", job, "--date", &yesterday, "--trigger", "scheduler"]);
    assert_eq!(code, 0, "{err}");
    let slot = chrono::Utc::now() + chrono::Duration::seconds(1);
    let slot = slot - chrono::Duration::nanoseconds(i64::from(chrono::Timelike::nanosecond(&slot)));
    write(slot);
    while chrono::Utc::now() <= slot {
        std::thread::sleep(Duration::from_millis(20));
    }
    (yesterday, slot.date_naive().to_string())
}

/// A rollout stops both scheduler replicas while a daily slot's fire runs: the fire is
/// recorded interrupted, and no later slot will process that date. Two new replicas read
/// the ledger on start, fire that date again, and complete it once (issue 37).
#[test]
fn new_scheduler_replicas_fire_again_a_date_whose_fire_a_rollout_interrupted() {
    let Some(url) = common::service_url(
        "IDEM_TEST_POSTGRES_URL",
        "new_scheduler_replicas_fire_again_a_date_whose_fire_a_rollout_interrupted",
        common::POSTGRES_HOW,
    ) else {
        return;
    };
    let s = Sandbox::with_store("idem-scheduler-rollout", &url);
    let job = format!("rollout_{}", &idem::new_run_id()[..8]);
    let (yesterday, today) = slot_due_now(&s, &job, "1m");
    let replica = || Watched::start(s.command(&["scheduler", &job, "--grace", "1s"]));
    let (a, b) = (replica(), replica());
    common::wait_until(
        "the slot's fire running",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || lines_of(&s.dir.join("started.txt")).contains(&today),
    );
    for (name, r) in [("a", a), ("b", b)] {
        let (code, log) = r.stop(Duration::from_secs(30));
        assert_eq!(code, Some(0), "replica {name}: {log}");
    }
    let ledger = runs(&s, &job);
    let of_today: Vec<&Value> = ledger
        .iter()
        .filter(|r| r["scope"] == today.as_str())
        .collect();
    assert!(
        of_today.iter().any(|r| r["status"] == "failed")
            && of_today.iter().all(|r| r["status"] != "completed"),
        "interrupted, not completed: {of_today:?}"
    );

    // The new replicas: the date is fired again and completes once.
    std::fs::write(s.dir.join(format!("go-{today}")), "").unwrap();
    let (c, d) = (replica(), replica());
    wait_for_runs(&s, &job, "the date completed", |r| {
        completed_per_scope(r).get(&today) == Some(&1)
    });
    for (name, r) in [("c", c), ("d", d)] {
        let (code, log) = r.stop(Duration::from_secs(30));
        assert_eq!(code, Some(0), "replica {name}: {log}");
    }
    assert_eq!(completed_per_scope(&runs(&s, &job)).get(&today), Some(&1));
    assert_eq!(
        lines_of(&s.dir.join("done.txt")),
        [yesterday, today.clone()],
        "the date's work done once"
    );
    assert_eq!(
        lines_of(&s.dir.join("started.txt"))
            .iter()
            .filter(|l| **l == today)
            .count(),
        2,
        "interrupted once, then run once"
    );
}

/// Both scheduler replicas SIGKILLed while a daily slot's fire runs: nothing records the
/// fire, its lease expires without a result and `idem runs` shows it abandoned. Two new
/// replicas read the leases on start, fire that date again and complete it once (issue 37).
#[test]
fn new_scheduler_replicas_fire_again_a_date_whose_fire_was_killed() {
    let Some(url) = common::service_url(
        "IDEM_TEST_POSTGRES_URL",
        "new_scheduler_replicas_fire_again_a_date_whose_fire_was_killed",
        common::POSTGRES_HOW,
    ) else {
        return;
    };
    let s = Sandbox::with_store("idem-scheduler-killed", &url);
    let job = format!("killed_{}", &idem::new_run_id()[..8]);
    let (yesterday, today) = slot_due_now(&s, &job, "3s");
    let replica = || Watched::start(s.command(&["scheduler", &job, "--grace", "1s"]));
    let (mut a, mut b) = (replica(), replica());
    common::wait_until(
        "the slot's fire running",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || lines_of(&s.dir.join("started.txt")).contains(&today),
    );
    for r in [&mut a, &mut b] {
        let _ = r.child.kill();
        let _ = r.child.wait();
    }
    let abandoned = || {
        let (code, v, err) = s.json(&["runs", "--job", &job, "--status", "abandoned"]);
        assert_eq!(code, 0, "{err}");
        v.as_array()
            .unwrap()
            .iter()
            .any(|r| r["scope"] == today.as_str())
    };
    common::wait_until(
        "the killed fire's lease expires",
        Duration::from_secs(60),
        Duration::from_millis(100),
        abandoned,
    );
    let of_today: Vec<Value> = runs(&s, &job)
        .into_iter()
        .filter(|r| r["scope"] == today.as_str())
        .collect();
    assert!(
        of_today
            .iter()
            .all(|r| r["status"] == "skipped" || r["status"] == "abandoned"),
        "the killed fire recorded nothing, it is abandoned (the other replica's fire may have been skipped): {of_today:?}"
    );

    std::fs::write(s.dir.join(format!("go-{today}")), "").unwrap();
    let (c, d) = (replica(), replica());
    wait_for_runs(&s, &job, "the date completed", |r| {
        completed_per_scope(r).get(&today) == Some(&1)
    });
    for (name, r) in [("c", c), ("d", d)] {
        let (code, log) = r.stop(Duration::from_secs(30));
        assert_eq!(code, Some(0), "replica {name}: {log}");
    }
    assert_eq!(completed_per_scope(&runs(&s, &job)).get(&today), Some(&1));
    assert!(!abandoned(), "taken over and completed");
    assert_eq!(
        lines_of(&s.dir.join("done.txt")),
        [yesterday, today],
        "the date's work done once"
    );
}

/// A [`daily_job`] (fired again 1 s after a failed fire) whose command fails for any date
/// but `pass` until its `succeed_at`-th attempt at that date, counted in
/// `started-NAME.txt`.
fn failing_job(
    name: &str,
    at: chrono::DateTime<chrono::Utc>,
    dir: &std::path::Path,
    pass: &str,
    succeed_at: usize,
) -> String {
    let d = dir.display();
    daily_job(
        name,
        at,
        "refire_after = \"1s\"",
        "time_window = \"20h\"",
        &format!(
            r#"run = ["sh", "-c", "echo {{scope}} >> {d}/started-{name}.txt; [ {{scope}} = {pass} ] || [ $(grep -c {{scope}} {d}/started-{name}.txt) -ge {succeed_at} ]"]"#
        ),
    )
}

/// A scheduler that keeps running fires a `catch_up` job's failed date again itself,
/// `refire_after` later, until it completes; and stops at the third failed fire of a date
/// that never completes, which stays failed for `idem status` (issue 37).
#[test]
fn a_running_scheduler_fires_a_failed_date_again_until_it_completes_at_most_three_times() {
    let s = Sandbox::new("idem-scheduler-refire");
    let yesterday = (chrono::Utc::now() - chrono::Duration::days(1))
        .date_naive()
        .to_string();
    // `mends` completes at its third attempt; `breaks` never does. Both fire at one slot.
    // Its yesterday settled by a scheduler fire too, so it owes the slot whenever the
    // scheduler starts (see `slot_due_now`).
    let later = chrono::Utc::now() + chrono::Duration::days(2);
    s.write_job(
        "breaks",
        &failing_job("breaks", later, &s.dir, &yesterday, 99),
    );
    let (code, _, err) = s.json(&[
        "run",
        "breaks",
        "--date",
        &yesterday,
        "--trigger",
        "scheduler",
    ]);
    assert_eq!(code, 0, "{err}");
    let (_, today) = slot_due_now_of(&s, "mends", |at| {
        s.write_job("breaks", &failing_job("breaks", at, &s.dir, &yesterday, 99));
        failing_job("mends", at, &s.dir, &yesterday, 3)
    });
    let mut scheduler = Watched::start(s.command(&["scheduler", "mends", "breaks"]));
    scheduler.wait_for_line("the third failed fire of breaks", |l| {
        l.contains("fire breaks slot")
            && l.contains(&format!("date {today}: failed"))
            && l.contains("not fired again: 3 failed scheduler fires")
    });
    wait_for_runs(&s, "mends", "mends completed", |r| {
        completed_per_scope(r).get(&today) == Some(&1)
    });
    let (code, log) = scheduler.stop(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{log}");

    let of_today = |job: &str| -> Vec<(String, String)> {
        let mut runs: Vec<(String, String)> = runs(&s, job)
            .into_iter()
            .filter(|r| r["scope"] == today.as_str())
            .map(|r| {
                assert_eq!(r["trigger"], "scheduler", "{r}");
                (
                    r["started_at"].as_str().unwrap().to_string(),
                    r["status"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        runs.sort();
        runs
    };
    let statuses =
        |job: &str| -> Vec<String> { of_today(job).into_iter().map(|(_, st)| st).collect() };
    assert_eq!(
        statuses("mends"),
        ["failed", "failed", "completed"],
        "{log}"
    );
    assert_eq!(statuses("breaks"), ["failed", "failed", "failed"], "{log}");
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("fire mends slot") && l.contains("; fired again in 1s"))
            .count(),
        2,
        "{log}"
    );
    // The fires again say so, and the last line counts them (two of each job).
    assert!(log.contains(", 4 fired again"), "{log}");
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("fire mends slot") && l.contains(" (fired again) date "))
            .count(),
        2,
        "{log}"
    );
    // The date that never completed is what `idem status` reports: exit 1, naming it.
    let out = s.idem(&["status", "breaks", "--since", "2d", "--format", "json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&today),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// On start, a `catch_up` job's date that no run processed although a scheduler fired the
/// job for an older date (a hole: the fire never reached the store, a replica stopped
/// before it ran) comes from the ledger and is fired, once; dates before the job's first
/// scheduler fire are not (issue 37).
#[test]
fn on_start_a_date_no_run_processed_between_scheduled_ones_is_fired_from_the_ledger() {
    let s = Sandbox::new("idem-scheduler-hole");
    let day = |n: i64| {
        (chrono::Utc::now() - chrono::Duration::days(n))
            .date_naive()
            .to_string()
    };
    let d = s.dir.display();
    s.write_job(
        "holes",
        &format!(
            r#"
name = "holes"
processor = "command"
schedule = "0 0 * * *"
timezone = "UTC"
date = "today"
missed = "catch_up"
catch_up_limit = 3
[guards]
time_window = "20h"
[command]
run = ["sh", "-c", "echo {{scope}} >> {d}/done.txt"]
"#
        ),
    );
    // Three days ago by hand (not a scheduler), two days ago and today by a scheduler:
    // yesterday is the hole.
    for (date, trigger) in [
        (day(3), "manual"),
        (day(2), "scheduler"),
        (day(0), "scheduler"),
    ] {
        let (code, _, err) = s.json(&["run", "holes", "--date", &date, "--trigger", trigger]);
        assert_eq!(code, 0, "{err}");
    }
    let mut scheduler = Watched::start(s.command(&["scheduler", "holes"]));
    scheduler.wait_for_line("the hole fired", |l| {
        l.contains("fire holes slot") && l.contains(&format!("date {}: completed", day(1)))
    });
    let (code, log) = scheduler.stop(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains(&format!(
            "job holes: {} was never run although a scheduler fired the job for an older date: firing it",
            day(1)
        )),
        "{log}"
    );
    assert_eq!(
        lines_of(&s.dir.join("done.txt")),
        [day(3), day(2), day(0), day(1)],
        "the hole run once, nothing else again: {log}"
    );
}
