//! Regression tests of the core hardening (issue 7): each would have caught a way to
//! process a scope twice, to lose a finished run, to describe content for a run that is
//! skipped anyway, or to run work before rejecting bad input.
//!
//! Runner-level tests use a real SQLite store; where a store outage is needed, a wrapper
//! makes the real store fail on demand (fault injection, not a stand-in).

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use idem::guard::{GuardStack, LeaseGuard, TimeWindowGuard, Verdict};
use idem::store::breaker::BreakerPhase;
use idem::store::{
    BreakerConfig, Capabilities, CircuitBreakerStore, DynStore, Finish, RunFilter, StoreBase,
};
use idem::{
    async_trait, parse_date, BoxError, Content, Error, Outcome, Processor, RunRequest, RunStatus,
    Runner,
};

use crate::common;

use common::{toml_str, Sandbox};

async fn sqlite_store(prefix: &str) -> (Arc<DynStore>, Sandbox) {
    // The sandbox's folder goes with it at the end of the test.
    let sb = Sandbox::new(prefix);
    (idem::store::open(&sb.store).await.unwrap(), sb)
}

/// A real store that fails every call with an outage while `down` is set.
#[derive(Debug)]
struct Outage {
    inner: Arc<DynStore>,
    down: AtomicBool,
    failed: AtomicUsize,
}

impl Outage {
    fn check(&self) -> idem::Result<()> {
        if self.down.load(Ordering::SeqCst) {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return Err(Error::store("sqlite://outage", "connection refused"));
        }
        Ok(())
    }
}

#[async_trait]
impl StoreBase for Outage {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn location(&self) -> String {
        self.inner.location()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn migrate(&self) -> idem::Result<()> {
        self.check()?;
        self.inner.migrate().await
    }
}

/// Every call fails while `down` is set, and goes to the real store otherwise.
macro_rules! outage {
    ($s:ident, $method:ident($($arg:expr),*)) => {{
        $s.check()?;
        $s.inner.$method($($arg),*).await
    }};
}
idem::forward_store!([] Outage, outage);

/// Works until told to stop; counts what the runner asked of it.
#[derive(Default)]
struct Observed {
    prepared: AtomicUsize,
    described: AtomicUsize,
    processed: AtomicUsize,
    release: AtomicBool,
}

#[async_trait]
impl Processor for Observed {
    fn name(&self) -> &str {
        "observed"
    }
    async fn prepare(&self, _: &RunRequest) -> Result<(), BoxError> {
        self.prepared.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn describe(&self, _: &RunRequest) -> Result<Option<Content>, BoxError> {
        self.described.fetch_add(1, Ordering::SeqCst);
        Ok(Some(Content::new().entities(["a", "b"])))
    }
    async fn process(&self, _: &RunRequest) -> Result<Outcome, BoxError> {
        self.processed.fetch_add(1, Ordering::SeqCst);
        while !self.release.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(Outcome::records(2))
    }
}

/// Issue 7 item 2: a store outage of a few seconds during a long run opens the breaker;
/// once the store is back, the renewals and the finish still reach it (and close the
/// breaker), so the finished run is recorded instead of failing with exit 3 and being
/// redone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_outage_mid_run_does_not_keep_the_result_from_being_recorded() {
    let (real, _dir) = sqlite_store("idem-outage").await;
    let outage = Arc::new(Outage {
        inner: real.clone(),
        down: AtomicBool::new(false),
        failed: AtomicUsize::new(0),
    });
    let breaker = Arc::new(CircuitBreakerStore::new(
        outage.clone() as Arc<DynStore>,
        BreakerConfig {
            failure_threshold: 2,
            reset_timeout: Duration::from_secs(30),
        },
    ));
    let processor = Arc::new(Observed::default());
    let run = {
        let (store, p) = (breaker.clone() as Arc<DynStore>, processor.clone());
        tokio::spawn(async move {
            Runner::new(
                store,
                GuardStack::builder()
                    .guard(LeaseGuard::new(Duration::from_millis(900)))
                    .build(),
            )
            .run(
                &*p,
                RunRequest::new("observed", parse_date("2025-11-18").unwrap()),
            )
            .await
        })
    };
    while processor.processed.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The store goes away until two renewals failed: the breaker opens.
    outage.down.store(true, Ordering::SeqCst);
    while outage.failed.load(Ordering::SeqCst) < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(breaker.phase(), BreakerPhase::Open);
    // It is back well within the breaker's 30 s, and the work ends at once: the finish
    // reaches the store through the open breaker.
    outage.down.store(false, Ordering::SeqCst);
    processor.release.store(true, Ordering::SeqCst);
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.status, RunStatus::Completed, "{report:?}");
    assert!(report.recorded(), "{report:?}");
    assert_eq!(report.exit_code(), 0);
    assert_eq!(breaker.phase(), BreakerPhase::Closed, "a success closed it");
    let runs = real.runs(&RunFilter::default()).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, RunStatus::Completed);
}

/// Issue 7 item 3: a run id reused (as orchestrators do, across retries and jobs) never
/// makes a finished run unrecordable: it is recorded under a derived id, with its keys,
/// and its lease is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_run_id_is_recorded_under_a_derived_id() {
    let (store, _dir) = sqlite_store("idem-runid").await;
    let guards = || {
        GuardStack::builder()
            .guard(TimeWindowGuard::new(Duration::from_secs(3600)))
            .guard(LeaseGuard::new(Duration::from_secs(60)))
            .build()
    };
    let p = Observed::default();
    p.release.store(true, Ordering::SeqCst);
    let mut reports = Vec::new();
    for day in ["2025-11-18", "2025-11-19"] {
        let mut request = RunRequest::new("observed", parse_date(day).unwrap());
        request.run_id = "scheduled__2025-11-19T00:00:00".into();
        let r = Runner::new(store.clone(), guards())
            .run(&p, request)
            .await
            .unwrap();
        assert_eq!(r.status, RunStatus::Completed, "{r:?}");
        assert!(r.recorded(), "{r:?}");
        reports.push(r);
    }
    assert_eq!(reports[0].run_id, "scheduled__2025-11-19T00:00:00");
    assert!(
        reports[1]
            .run_id
            .starts_with("scheduled__2025-11-19T00:00:00."),
        "{}",
        reports[1].run_id
    );
    let runs = store.runs(&RunFilter::default()).await.unwrap();
    assert_eq!(runs.len(), 2);
    // The second run's keys are written (under its derived id): the time window skips it.
    let again = Runner::new(store.clone(), guards())
        .run(
            &p,
            RunRequest::new("observed", parse_date("2025-11-19").unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(again.status, RunStatus::Skipped);
    assert_eq!(
        again.previous_run.unwrap().run_id,
        reports[1].run_id,
        "the key points at the derived id"
    );
    assert!(store
        .lease_holder("observed", "2025-11-19", Utc::now())
        .await
        .unwrap()
        .is_none());
}

/// Issue 7 item 12: a run skipped by the time window (or the lease) neither prepares the
/// processor (a SQL job's setup) nor describes its content (the content query); explain
/// prepares only when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cheap_skip_neither_prepares_nor_describes() {
    let (store, _dir) = sqlite_store("idem-phases").await;
    let runner = Runner::new(
        store.clone(),
        GuardStack::builder()
            .guard(TimeWindowGuard::new(Duration::from_secs(3600)))
            .guard(idem::guard::ContentHashGuard::new(
                Duration::from_secs(86_400),
                idem::HashAlgorithm::Sha256,
            ))
            .guard(LeaseGuard::new(Duration::from_secs(60)))
            .build(),
    );
    let p = Observed::default();
    p.release.store(true, Ordering::SeqCst);
    let day = parse_date("2025-11-18").unwrap();
    let first = runner
        .run(&p, RunRequest::new("observed", day))
        .await
        .unwrap();
    assert_eq!(first.status, RunStatus::Completed);
    assert!(first.processing_key.is_some());
    let counts = |p: &Observed| {
        (
            p.prepared.load(Ordering::SeqCst),
            p.described.load(Ordering::SeqCst),
            p.processed.load(Ordering::SeqCst),
        )
    };
    assert_eq!(counts(&p), (1, 1, 1));
    let second = runner
        .run(&p, RunRequest::new("observed", day))
        .await
        .unwrap();
    assert_eq!(second.status, RunStatus::Skipped);
    assert_eq!(second.skip_reason.unwrap().as_str(), "time_window");
    assert_eq!(
        counts(&p),
        (1, 1, 1),
        "the skip prepared and described nothing"
    );

    // explain describes (it shows the content key) but prepares nothing unless asked.
    let other = RunRequest::new("observed", parse_date("2025-11-19").unwrap());
    let e = runner.explain(&p, &other).await.unwrap();
    assert_eq!(e.decision, "run");
    assert_eq!(counts(&p), (1, 2, 1));
    runner.explain_with(&p, &other, true).await.unwrap();
    assert_eq!(counts(&p), (2, 3, 1));
}

// ---------------------------------------------------------------------------------------
// The command line
// ---------------------------------------------------------------------------------------

/// A SQL job on its own warehouse whose setup and process leave visible traces.
fn traced_job(name: &str, guards: &str) -> String {
    format!(
        r#"name = {name}
processor = "sql"
[guards]
{guards}
[sql]
warehouse = "sqlite://warehouse.db"
setup = "CREATE TABLE IF NOT EXISTS made_by_setup (x INTEGER); CREATE TABLE IF NOT EXISTS effects (day TEXT)"
content = "SELECT count(*) AS n FROM made_by_setup"
process = "INSERT INTO effects VALUES (@scope)"
"#,
        name = toml_str(name)
    )
}

fn table_exists(s: &Sandbox, table: &str) -> bool {
    let path = s.dir.join("jobs").join("warehouse.db");
    if !path.exists() {
        return false;
    }
    let url = format!("sqlite://{}", path.display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        )
        .bind(table)
        .fetch_one(&pool)
        .await
        .unwrap();
        n == 1
    })
}

fn ledger_len(s: &Sandbox) -> usize {
    let (code, runs, err) = s.json(&["runs", "--limit", "0"]);
    assert_eq!(code, 0, "{err}");
    runs.as_array().unwrap().len()
}

/// Issue 7 item 12: explain changes nothing anywhere unless asked to run the setup.
#[test]
fn explain_runs_no_setup_unless_asked() {
    let s = Sandbox::new("idem-hardening");
    s.write_job(
        "traced",
        &traced_job("traced", "content_hash = \"24h\"\ntime_window = \"1h\""),
    );
    let (code, e, err) = s.json(&["explain", "traced", "--date", "2025-11-18"]);
    assert_eq!(code, 0, "{e} {err}");
    assert!(!table_exists(&s, "made_by_setup"), "explain ran the setup");
    let content = e["guards"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["guard"] == "content_hash")
        .unwrap();
    assert_eq!(content["verdict"], "unknown", "{e}");
    assert!(
        content["detail"].as_str().unwrap().contains("--with-setup"),
        "{e}"
    );
    let (code, e, err) = s.json(&["explain", "traced", "--date", "2025-11-18", "--with-setup"]);
    assert_eq!(code, 0, "{e} {err}");
    assert!(table_exists(&s, "made_by_setup"));
    assert_eq!(e["decision"], "run");
    assert!(e["processing_key"].is_string(), "{e}");
    assert_eq!(ledger_len(&s), 0, "explain records nothing");
}

/// Issue 7 item 12: a time-window skip runs neither the setup nor the content query (a
/// content query that would now fail does not fail the skip).
#[test]
fn a_time_window_skip_runs_no_sql() {
    let s = Sandbox::new("idem-hardening");
    s.write_job(
        "traced",
        &traced_job("traced", "content_hash = \"24h\"\ntime_window = \"1h\""),
    );
    let (code, r, err) = s.json(&["run", "traced", "--date", "2025-11-18"]);
    assert_eq!(
        (code, r["status"].as_str()),
        (0, Some("completed")),
        "{r} {err}"
    );
    // Break the content query and the setup: a run that touched them would fail.
    std::fs::write(s.dir.join("jobs").join("warehouse.db"), b"not a database").unwrap();
    let (code, r, err) = s.json(&["run", "traced", "--date", "2025-11-18"]);
    assert_eq!(code, 0, "{r} {err}");
    assert_eq!(r["status"], "skipped");
    assert_eq!(r["skip_reason"], "time_window");
}

/// Issue 7 item 7: dates no store can hold are refused before any work, exit 2, nothing
/// recorded and nothing run.
#[test]
fn out_of_range_dates_are_refused_before_any_work() {
    let s = Sandbox::new("idem-hardening");
    s.write_job("traced", &traced_job("traced", "time_window = \"1h\""));
    for date in [
        "-5000-01-01",
        "+12345-01-01",
        "0000-12-31",
        "10000-01-01",
        "2025-02-30",
        "25-11-18",
    ] {
        let out = s.idem(&["run", "traced", &format!("--date={date}")]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{date}: {err}");
        assert!(err.contains("bad date"), "{date}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert!(!table_exists(&s, "effects"), "no SQL ran");
    assert_eq!(ledger_len(&s), 0);
}

/// Issue 7 item 10: input errors are exit 2 (never 3, never a panic) and name the problem.
#[test]
fn bad_names_and_limits_are_usage_errors() {
    let s = Sandbox::new("idem-hardening");
    s.write_job("traced", &traced_job("traced", "time_window = \"1h\""));
    s.write_job(
        "nul",
        &traced_job("nul\u{0}name", "time_window = \"1h\"").replace("traced", "nul"),
    );
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["run", "traced", "--date", "2025-11-18", "--scope", "a\tb"],
            "control character",
        ),
        (
            vec![
                "run",
                "traced",
                "--date",
                "2025-11-18",
                "--run-id",
                "x\u{7}",
            ],
            "control character",
        ),
        (
            vec!["run", "nul.toml", "--date", "2025-11-18"],
            "control character",
        ),
        // Bidirectional controls reverse how `idem runs` shows the text around them.
        (
            vec![
                "run",
                "traced",
                "--date",
                "2025-11-18",
                "--scope",
                "2025-11-18\u{202E}",
            ],
            "control character",
        ),
        (
            vec![
                "run",
                "traced",
                "--date",
                "2025-11-18",
                "--run-id",
                "r\u{2066}x",
            ],
            "control character",
        ),
        (
            vec!["gate", "--key", "id", "--namespace", "n\u{200F}"],
            "control character",
        ),
        (vec!["runs", "--limit", "99999999999"], "--limit"),
        (vec!["runs", "--limit", "-1"], "-1"),
    ];
    for (args, says) in cases {
        let mut args = args;
        let nul_path;
        if args[1] == "nul.toml" {
            nul_path = s.dir.join("jobs").join("nul.toml").display().to_string();
            args[1] = &nul_path;
        }
        let out = s.idem(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(!table_exists(&s, "effects"), "no SQL ran");
}

/// Issue 7 item 10: `idem runs | head -1` is not a crash: a reader that goes away ends the
/// output quietly and the command keeps its exit code.
#[test]
fn a_closed_stdout_is_not_a_crash() {
    let s = Sandbox::new("idem-hardening");
    // Enough ledger rows that the output cannot fit in the pipe's buffer.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = idem::store::open(&s.store).await.unwrap();
        let at = Utc::now();
        for i in 0..1500 {
            let mut run = idem::store::conformance::run_record(
                "piped",
                &format!("2025-11-{:02}", i % 28 + 1),
                &format!("run-{i}"),
                RunStatus::Completed,
                at,
            );
            run.error = Some("x".repeat(40));
            store
                .finish(&Finish {
                    run,
                    keys: Vec::new(),
                    lease: None,
                })
                .await
                .unwrap();
        }
    });
    for format in ["human", "json"] {
        let mut child = s
            .command(&["runs", "--limit", "0", "--format", format])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Read one line, then close the pipe, as `head -1` does.
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 64];
        let _ = std::io::Read::read(&mut stdout, &mut first).unwrap();
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{format}: {err}");
        assert_eq!(out.status.code(), Some(0), "{format}: {err}");
    }
    // And through a real shell pipeline.
    let script = format!(
        "{} runs --limit 0 --store {} | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}",
        common::IDEM,
        s.store
    );
    let out = Command::new("bash").arg("-c").arg(script).output().unwrap();
    let status = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        status.trim(),
        "0",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::io::stdout().flush();
}

/// Issue 7 item 12: the verdicts explain shows for an unknown content are marked so.
#[test]
fn unknown_verdict_serialises_as_unknown() {
    let v = Verdict::Unknown { detail: "d".into() };
    assert_eq!(
        serde_json::to_value(&v).unwrap(),
        serde_json::json!({"verdict": "unknown", "detail": "d"})
    );
}
