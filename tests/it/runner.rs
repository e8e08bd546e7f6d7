//! The runner's behaviour through the public API, on the in-memory store: guards, modes,
//! keys only on success, the lease and its fencing, store failure policies.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::guard::{
    ContentHashGuard, Guard, GuardContext, GuardStack, LeaseGuard, TimeWindowGuard, Verdict,
};
use idem::store::{Claim, ClaimRequest, DynStore, MemoryStore, RunFilter, UnavailableStore};
use idem::{
    async_trait, parse_date, BoxError, Content, HashAlgorithm, Mode, Outcome, Processor,
    RunRequest, RunStatus, Runner, Skip, SkipReason, StoreFailurePolicy,
};
use tokio::sync::Mutex;

/// A processor whose content and result the test controls, counting its runs.
#[derive(Default)]
struct Scripted {
    entities: Mutex<Vec<String>>,
    fail: std::sync::atomic::AtomicBool,
    runs: AtomicUsize,
    /// Runs that got past the delay (a cancelled run never does).
    finished: AtomicUsize,
    delay: Duration,
    /// When set, processing waits for this instead of `delay`: the test says when it ends.
    release: Option<Arc<tokio::sync::Notify>>,
}

#[async_trait]
impl Processor for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    async fn describe(&self, _: &RunRequest) -> Result<Option<Content>, BoxError> {
        Ok(Some(
            Content::new().entities(self.entities.lock().await.clone()),
        ))
    }
    async fn process(&self, _: &RunRequest) -> Result<Outcome, BoxError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        match &self.release {
            Some(release) => release.notified().await,
            None => tokio::time::sleep(self.delay).await,
        }
        self.finished.fetch_add(1, Ordering::SeqCst);
        if self.fail.load(Ordering::SeqCst) {
            return Err("warehouse said no".into());
        }
        Ok(Outcome::records(self.entities.lock().await.len() as i64))
    }
}

fn store() -> Arc<DynStore> {
    Arc::new(MemoryStore::new())
}

fn request(scope: &str) -> RunRequest {
    RunRequest::new("summary", parse_date(scope).unwrap())
}

/// Runs `processor` for `day` in a task, behind a lease of `ttl` (heartbeat on).
fn spawn_leased_run(
    store: &Arc<DynStore>,
    processor: &Arc<Scripted>,
    ttl: Duration,
    day: &'static str,
) -> tokio::task::JoinHandle<idem::RunReport> {
    let (store, processor) = (store.clone(), processor.clone());
    tokio::spawn(async move {
        Runner::new(
            store,
            GuardStack::builder().guard(LeaseGuard::new(ttl)).build(),
        )
        .run(&*processor, request(day))
        .await
        .unwrap()
    })
}

/// Waits until `processor` has started processing (so its run holds the lease).
async fn started(processor: &Scripted) {
    while processor.runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn full_stack() -> GuardStack {
    GuardStack::builder()
        .guard(TimeWindowGuard::new(Duration::from_secs(3600)))
        .guard(ContentHashGuard::new(
            Duration::from_secs(86_400),
            HashAlgorithm::Md5,
        ))
        .guard(LeaseGuard::new(Duration::from_secs(600)))
        .build()
}

#[tokio::test]
async fn second_run_is_skipped_with_the_earlier_run_named() {
    let store = store();
    let runner = Runner::new(store.clone(), full_stack());
    let p = Scripted::default();
    *p.entities.lock().await = vec!["b".into(), "a".into()];
    let first = runner.run(&p, request("2025-11-18")).await.unwrap();
    assert_eq!(first.status, RunStatus::Completed);
    assert_eq!(first.records_processed, Some(2));
    assert_eq!(
        first.processing_key.as_ref().map(|k| k.len()),
        Some(32),
        "md5 key"
    );
    let second = runner.run(&p, request("2025-11-18")).await.unwrap();
    assert_eq!(second.status, RunStatus::Skipped);
    assert_eq!(second.skip_reason, Some(SkipReason::TimeWindow));
    assert_eq!(second.previous_run.as_ref().unwrap().run_id, first.run_id);
    assert!(second
        .detail
        .as_ref()
        .unwrap()
        .contains("within the 1h time window"));
    assert_eq!(p.runs.load(Ordering::SeqCst), 1);
    // Another date is not affected.
    let other = runner.run(&p, request("2025-11-19")).await.unwrap();
    assert_eq!(other.status, RunStatus::Completed);
    // The ledger has all three, and the skip frees the lease (next claim succeeds).
    let runs = store.runs(&RunFilter::default()).await.unwrap();
    assert_eq!(runs.len(), 3);
    let claim = store
        .claim(&ClaimRequest {
            processor: "summary",
            scope: "2025-11-18",
            run_id: "x",
            ttl: Duration::from_secs(1),
            now: chrono::Utc::now(),
        })
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Acquired(_)));
}

#[tokio::test]
async fn content_hash_skips_identical_content_and_runs_changed_content() {
    let runner = Runner::new(
        store(),
        GuardStack::builder()
            .guard(ContentHashGuard::new(
                Duration::from_secs(86_400),
                HashAlgorithm::Sha256,
            ))
            .guard(LeaseGuard::new(Duration::from_secs(600)))
            .build(),
    );
    let p = Scripted::default();
    *p.entities.lock().await = vec!["p1".into(), "p2".into()];
    assert_eq!(
        runner.run(&p, request("2025-11-18")).await.unwrap().status,
        RunStatus::Completed
    );
    // Same entities in another order: same content.
    *p.entities.lock().await = vec!["p2".into(), "p1".into()];
    let dup = runner.run(&p, request("2025-11-18")).await.unwrap();
    assert_eq!(dup.status, RunStatus::Skipped);
    assert_eq!(dup.skip_reason, Some(SkipReason::DuplicateContentHash));
    // New entity: runs.
    p.entities.lock().await.push("p3".into());
    let changed = runner.run(&p, request("2025-11-18")).await.unwrap();
    assert_eq!(changed.status, RunStatus::Completed);
    assert_eq!(changed.records_processed, Some(3));
}

#[tokio::test]
async fn a_failed_run_writes_no_key_and_the_retry_runs() {
    let store = store();
    let runner = Runner::new(store.clone(), full_stack());
    let p = Scripted::default();
    p.fail.store(true, Ordering::SeqCst);
    let failed = runner.run(&p, request("2025-11-18")).await.unwrap();
    assert_eq!(failed.status, RunStatus::Failed);
    assert_eq!(failed.exit_code(), 1);
    assert_eq!(failed.error.as_deref(), Some("warehouse said no"));
    assert!(failed.recorded());
    p.fail.store(false, Ordering::SeqCst);
    let retry = runner.run(&p, request("2025-11-18")).await.unwrap();
    assert_eq!(
        retry.status,
        RunStatus::Completed,
        "no key blocked the retry"
    );
    let runs = store.runs(&RunFilter::default()).await.unwrap();
    assert_eq!(
        runs.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![RunStatus::Completed, RunStatus::Failed]
    );
}

#[tokio::test]
async fn shadow_mode_runs_and_records_the_would_skip_reason() {
    let store = store();
    let runner = Runner::new(store.clone(), full_stack()).mode(Mode::Shadow);
    let p = Scripted::default();
    runner.run(&p, request("2025-11-18")).await.unwrap();
    let second = runner.run(&p, request("2025-11-18")).await.unwrap();
    assert_eq!(second.status, RunStatus::Completed);
    assert_eq!(second.would_skip_reason, Some(SkipReason::TimeWindow));
    assert_eq!(second.guards.len(), 3, "shadow evaluates every guard");
    assert_eq!(p.runs.load(Ordering::SeqCst), 2);
    let row = &store.runs(&RunFilter::default()).await.unwrap()[0];
    assert_eq!(row.would_skip_reason, Some(SkipReason::TimeWindow));
    assert_eq!(row.mode, Mode::Shadow);
    assert!(row.previous_run_id.is_some());
}

#[tokio::test]
async fn off_mode_runs_without_guards_but_records() {
    let store = store();
    let runner = Runner::new(store.clone(), full_stack()).mode(Mode::Off);
    let p = Scripted::default();
    for _ in 0..2 {
        let r = runner.run(&p, request("2025-11-18")).await.unwrap();
        assert_eq!(r.status, RunStatus::Completed);
        assert!(r.guards.is_empty());
    }
    assert_eq!(store.runs(&RunFilter::default()).await.unwrap().len(), 2);
    // Turning guards on afterwards sees the history.
    let enforce = Runner::new(store, full_stack());
    let r = enforce.run(&p, request("2025-11-18")).await.unwrap();
    assert_eq!(r.skip_reason, Some(SkipReason::TimeWindow));
}

#[tokio::test]
async fn concurrent_runs_one_processes_the_others_are_in_progress() {
    let store = store();
    let runner = Arc::new(Runner::new(store.clone(), full_stack()));
    // The one that processes holds on until the other seven have ended.
    let release = Arc::new(tokio::sync::Notify::new());
    let p = Arc::new(Scripted {
        release: Some(release.clone()),
        ..Default::default()
    });
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (runner, p) = (runner.clone(), p.clone());
        tasks.spawn(async move { runner.run(&*p, request("2025-11-18")).await.unwrap() });
    }
    let mut statuses = Vec::new();
    while let Some(r) = tasks.join_next().await {
        let r = r.unwrap();
        statuses.push((r.status, r.skip_reason));
        if statuses.len() == 7 {
            release.notify_one();
        }
    }
    assert_eq!(
        p.runs.load(Ordering::SeqCst),
        1,
        "processed exactly once: {statuses:?}"
    );
    assert_eq!(
        statuses
            .iter()
            .filter(|s| s.0 == RunStatus::Completed)
            .count(),
        1
    );
    assert_eq!(
        statuses
            .iter()
            .filter(|s| s.1 == Some(SkipReason::InProgress))
            .count(),
        7,
        "{statuses:?}"
    );
}

#[tokio::test]
async fn a_run_that_completes_while_another_checks_is_seen_after_the_claim() {
    // Time window checked first, lease last: a run that completes between another run's
    // first check and its claim must still make that run skip.
    let store = store();
    let stack = GuardStack::builder()
        .guard(TimeWindowGuard::new(Duration::from_secs(3600)))
        .guard(RaceMaker {
            store: store.clone(),
        })
        .guard(LeaseGuard::new(Duration::from_secs(600)))
        .build();
    let runner = Runner::new(store.clone(), stack);
    let p = Scripted::default();
    let r = runner.run(&p, request("2025-11-18")).await.unwrap();
    assert_eq!(r.status, RunStatus::Skipped, "{r:?}");
    assert_eq!(r.skip_reason, Some(SkipReason::TimeWindow));
    assert_eq!(p.runs.load(Ordering::SeqCst), 0);
}

/// A custom guard that lets another run complete the same scope while it is evaluated.
#[derive(Debug)]
struct RaceMaker {
    store: Arc<DynStore>,
}

#[async_trait]
impl Guard for RaceMaker {
    fn name(&self) -> &str {
        "race_maker"
    }
    async fn check(&self, ctx: &mut GuardContext<'_>) -> idem::Result<Verdict> {
        if ctx.lease().is_none() {
            let other = Runner::new(self.store.clone(), GuardStack::default());
            let r = other
                .run(&Scripted::default(), request("2025-11-18"))
                .await?;
            assert_eq!(r.status, RunStatus::Completed);
        }
        Ok(Verdict::proceed("nothing against it"))
    }
}

#[tokio::test]
async fn a_custom_guard_can_skip() {
    #[derive(Debug)]
    struct Weekends;
    #[async_trait]
    impl Guard for Weekends {
        fn name(&self) -> &str {
            "no_weekends"
        }
        async fn check(&self, ctx: &mut GuardContext<'_>) -> idem::Result<Verdict> {
            use chrono::Datelike;
            Ok(match ctx.request.scope_date.weekday() {
                chrono::Weekday::Sat | chrono::Weekday::Sun => Verdict::Skip(Skip {
                    reason: SkipReason::Custom("weekend".into()),
                    previous_run: None,
                    detail: "no games on weekends".into(),
                }),
                _ => Verdict::proceed("weekday"),
            })
        }
    }
    let store = store();
    let runner = Runner::new(store.clone(), GuardStack::builder().guard(Weekends).build());
    let r = runner
        .run(&Scripted::default(), request("2025-11-22"))
        .await
        .unwrap();
    assert_eq!(r.skip_reason, Some(SkipReason::Custom("weekend".into())));
    let row = &store.runs(&RunFilter::default()).await.unwrap()[0];
    assert_eq!(
        row.skip_reason.as_ref().map(|r| r.as_str()),
        Some("weekend")
    );
}

#[tokio::test]
async fn strict_policy_fails_before_processing_when_the_store_is_down() {
    let down: Arc<DynStore> = Arc::new(UnavailableStore::new(
        "postgres://db:5432/x",
        "connection refused",
    ));
    let p = Scripted::default();
    let err = Runner::new(down, full_stack())
        .run(&p, request("2025-11-18"))
        .await
        .unwrap_err();
    assert!(err.is_store_failure());
    assert!(
        err.to_string()
            .contains("store postgres://db:5432/x unavailable: connection refused"),
        "{err}"
    );
    assert_eq!(p.runs.load(Ordering::SeqCst), 0, "nothing ran");
}

#[tokio::test]
async fn best_effort_runs_unguarded_and_counts_the_failures() {
    let down: Arc<DynStore> = Arc::new(UnavailableStore::new("sqlite://x.db", "disk I/O error"));
    let p = Scripted::default();
    let r = Runner::new(down, full_stack())
        .store_failure_policy(StoreFailurePolicy::BestEffort)
        .run(&p, request("2025-11-18"))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Completed);
    assert_eq!(r.exit_code(), 0);
    assert!(!r.recorded());
    assert_eq!(
        r.store_errors.len(),
        2,
        "guard check and recording: {:?}",
        r.store_errors
    );
    assert_eq!(p.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_run_whose_lease_was_taken_over_cannot_record_its_result() {
    let store = store();
    // Short lease, no heartbeat: the slow run's lease expires and a second run takes over.
    let slow_runner = Runner::new(
        store.clone(),
        GuardStack::builder()
            .guard(LeaseGuard::new(Duration::from_millis(300)))
            .build(),
    )
    .heartbeat(false);
    let release = Arc::new(tokio::sync::Notify::new());
    let slow = Arc::new(Scripted {
        release: Some(release.clone()),
        ..Default::default()
    });
    let slow_task = {
        let slow = slow.clone();
        tokio::spawn(async move {
            slow_runner
                .run(&*slow, request("2025-11-18"))
                .await
                .unwrap()
        })
    };
    started(&slow).await;
    // Past the 300 ms lease, while the slow run still works (until it is released).
    while store
        .lease_holder("summary", "2025-11-18", chrono::Utc::now())
        .await
        .unwrap()
        .is_some()
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let fast_runner = Runner::new(store.clone(), full_stack());
    let fast = fast_runner
        .run(&Scripted::default(), request("2025-11-18"))
        .await
        .unwrap();
    assert_eq!(fast.status, RunStatus::Completed, "{fast:?}");
    release.notify_one();
    let late = slow_task.await.unwrap();
    assert_eq!(late.status, RunStatus::Failed);
    assert!(late.lease_lost());
    assert_eq!(late.exit_code(), 1);
    assert!(
        late.error.as_ref().unwrap().contains("lost"),
        "{:?}",
        late.error
    );
    // The ledger: the newer run completed, the late one failed; the newer run's key stands.
    let runs = store.runs(&RunFilter::default()).await.unwrap();
    let by_id = |id: &str| runs.iter().find(|r| r.run_id == id).unwrap().status;
    assert_eq!(by_id(&fast.run_id), RunStatus::Completed);
    assert_eq!(by_id(&late.run_id), RunStatus::Failed);
    let again = fast_runner
        .run(&Scripted::default(), request("2025-11-18"))
        .await
        .unwrap();
    assert_eq!(
        again.previous_run.unwrap().run_id,
        fast.run_id,
        "the key is the newer run's"
    );
}

#[tokio::test]
async fn heartbeat_keeps_a_slow_run_s_lease() {
    let store = store();
    let ttl = Duration::from_secs(3);
    let runner = Runner::new(
        store.clone(),
        GuardStack::builder().guard(LeaseGuard::new(ttl)).build(),
    );
    let release = Arc::new(tokio::sync::Notify::new());
    let slow = Arc::new(Scripted {
        release: Some(release.clone()),
        ..Default::default()
    });
    let task = spawn_leased_run(&store, &slow, ttl, "2025-11-18");
    started(&slow).await;
    // Until the lease outlived its first expiry: only renewals keep it that long (a
    // renewal sets its expiry a lease duration after itself).
    loop {
        let open = store.open_leases(Some("summary")).await.unwrap();
        let lease = &open[0];
        assert!(lease.running_at(chrono::Utc::now()), "{lease:?}");
        if lease.expires_at - lease.acquired_at >= chrono::Duration::from_std(ttl * 2).unwrap() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let during = runner
        .run(&Scripted::default(), request("2025-11-18"))
        .await
        .unwrap();
    assert_eq!(
        during.skip_reason,
        Some(SkipReason::InProgress),
        "renewed lease still held"
    );
    release.notify_one();
    assert_eq!(task.await.unwrap().status, RunStatus::Completed);
}

#[tokio::test]
async fn explain_claims_nothing_and_shows_every_guard() {
    let store = store();
    let runner = Runner::new(store.clone(), full_stack());
    let p = Scripted::default();
    let before = runner.explain(&p, &request("2025-11-18")).await.unwrap();
    assert_eq!(before.decision, "run");
    assert_eq!(before.guards.len(), 3);
    runner.run(&p, request("2025-11-18")).await.unwrap();
    let after = runner.explain(&p, &request("2025-11-18")).await.unwrap();
    assert_eq!(after.decision, "skip");
    assert_eq!(after.skip_reason, Some(SkipReason::TimeWindow));
    let verdicts: Vec<&str> = after
        .guards
        .iter()
        .map(|g| match g.verdict {
            Verdict::Proceed { .. } => "proceed",
            Verdict::Skip(_) => "skip",
            Verdict::Unknown { .. } => "unknown",
        })
        .collect();
    assert_eq!(verdicts, vec!["skip", "skip", "proceed"]);
    assert!(store
        .lease_holder("summary", "2025-11-18", chrono::Utc::now())
        .await
        .unwrap()
        .is_none());
    assert_eq!(p.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn on_in_progress_wait_runs_after_the_holder_finishes() {
    use idem::guard::OnHeld;
    let store = store();
    let holder = Arc::new(Scripted {
        delay: Duration::from_millis(400),
        ..Default::default()
    });
    let first = spawn_leased_run(&store, &holder, Duration::from_secs(60), "2025-11-18");
    started(&holder).await;
    let waiting = Runner::new(
        store.clone(),
        GuardStack::builder()
            .guard(TimeWindowGuard::new(Duration::from_secs(3600)))
            .guard(
                LeaseGuard::new(Duration::from_secs(60)).on_held(OnHeld::Wait {
                    max: Duration::from_secs(10),
                }),
            )
            .build(),
    );
    let p = Scripted::default();
    let r = waiting.run(&p, request("2025-11-18")).await.unwrap();
    let first = first.await.unwrap();
    assert_eq!(first.status, RunStatus::Completed);
    // It waited for the lease, then the re-check saw the holder's completed run.
    assert_eq!(r.skip_reason, Some(SkipReason::TimeWindow), "{r:?}");
    assert_eq!(r.previous_run.unwrap().run_id, first.run_id);
    assert_eq!(p.runs.load(Ordering::SeqCst), 0);

    // A wait that runs out skips with in_progress.
    let release = Arc::new(tokio::sync::Notify::new());
    let slow = Arc::new(Scripted {
        release: Some(release.clone()),
        ..Default::default()
    });
    let holder_task = spawn_leased_run(&store, &slow, Duration::from_secs(60), "2025-11-19");
    started(&slow).await;
    let impatient = Runner::new(
        store,
        GuardStack::builder()
            .guard(
                LeaseGuard::new(Duration::from_secs(60)).on_held(OnHeld::Wait {
                    max: Duration::from_millis(300),
                }),
            )
            .build(),
    );
    let r = impatient
        .run(&Scripted::default(), request("2025-11-19"))
        .await
        .unwrap();
    assert_eq!(r.skip_reason, Some(SkipReason::InProgress));
    release.notify_one();
    holder_task.await.unwrap();
}

#[tokio::test]
async fn a_lease_lost_while_processing_stops_the_processor() {
    let store = store();
    // Never released: it ends only if the run stops it.
    let slow = Arc::new(Scripted {
        release: Some(Arc::new(tokio::sync::Notify::new())),
        ..Default::default()
    });
    let task = spawn_leased_run(&store, &slow, Duration::from_millis(300), "2025-11-18");
    started(&slow).await;
    // Another run, whose clock says the lease expired, takes it over.
    let takeover = store
        .claim(&ClaimRequest {
            processor: "summary",
            scope: "2025-11-18",
            run_id: "newer",
            ttl: Duration::from_secs(600),
            now: chrono::Utc::now() + chrono::Duration::seconds(10),
        })
        .await
        .unwrap();
    assert!(matches!(takeover, Claim::Acquired(_)));
    let r = task.await.unwrap();
    assert_eq!(slow.runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        slow.finished.load(Ordering::SeqCst),
        0,
        "the processor was stopped at the next heartbeat, not left to finish"
    );
    assert_eq!(r.status, RunStatus::Failed);
    assert!(r.lease_lost());
    assert!(
        r.error.as_ref().unwrap().contains("while processing"),
        "{:?}",
        r.error
    );
}
