//! A circuit breaker around any store, so a dead store is not hammered.
//!
//! After `failure_threshold` consecutive store failures the breaker *opens*: calls fail at
//! once with [`Error::CircuitOpen`] without touching the store. After `reset_timeout` it is
//! *half-open*: one call goes through; success closes the breaker, failure opens it again.
//! Only outages count ([`Error::is_outage`]): a lost lease, a duplicate run id or a
//! refused statement is the store working.
//!
//! The breaker never stands between a run and the recording of its result: `finish`,
//! `renew` and `release` always try the store, even while the breaker is open, and a
//! success closes it. Failing them fast would let a finished run's lease expire while
//! the store is healthy again, and the next run would redo the work.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Capabilities, EventKeyStore, LeaseStore, LedgerStore, MaintenanceStore, StoreBase};
use crate::error::{Error, Result};

/// Breaker settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker.
    pub failure_threshold: u32,
    /// How long it stays open before letting one probe through.
    pub reset_timeout: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 5,
            reset_timeout: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Default)]
struct BreakerState {
    consecutive_failures: u32,
    opened_at: Option<Instant>,
    probing: bool,
    total_failures: u64,
    rejected: u64,
    /// Failures counted towards `consecutive_failures` so far: a call that fails counts
    /// only when none was counted since it started, so calls running side by side that
    /// fail in one outage count once.
    counted: u64,
}

/// What a call was let through as.
#[derive(Debug, Clone, Copy)]
struct Ticket {
    /// The half-open breaker's one probe.
    probe: bool,
    /// `BreakerState::counted` when it started.
    counted: u64,
}

/// Observable breaker state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerPhase {
    /// Calls go through.
    Closed,
    /// Calls fail fast.
    Open,
    /// One probe may go through.
    HalfOpen,
}

/// Where the breaker reads the time: the monotonic clock, or in tests one moved by hand
/// (a test then never depends on how fast the machine runs it).
#[derive(Debug, Clone, Default)]
struct BreakerClock(Option<Arc<Mutex<Instant>>>);

impl BreakerClock {
    fn now(&self) -> Instant {
        match &self.0 {
            None => Instant::now(),
            Some(t) => *t.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }
}

/// A store wrapped in a circuit breaker.
#[derive(Debug)]
pub struct CircuitBreakerStore<S: StoreBase + ?Sized> {
    inner: Arc<S>,
    config: BreakerConfig,
    state: Mutex<BreakerState>,
    clock: BreakerClock,
}

impl<S: StoreBase + ?Sized> CircuitBreakerStore<S> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<S>, config: BreakerConfig) -> Self {
        CircuitBreakerStore {
            inner,
            config,
            state: Mutex::new(BreakerState::default()),
            clock: BreakerClock::default(),
        }
    }

    /// The breaker reading the time from `clock`, which the test moves.
    #[cfg(test)]
    fn with_clock(self, clock: Arc<Mutex<Instant>>) -> Self {
        CircuitBreakerStore {
            clock: BreakerClock(Some(clock)),
            ..self
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BreakerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The breaker's phase now.
    pub fn phase(&self) -> BreakerPhase {
        let s = self.lock();
        match s.opened_at {
            None => BreakerPhase::Closed,
            Some(t)
                if self.clock.now().saturating_duration_since(t) >= self.config.reset_timeout =>
            {
                BreakerPhase::HalfOpen
            }
            Some(_) => BreakerPhase::Open,
        }
    }

    /// Opens the breaker now, as after `failure_threshold` failures (say, when the store
    /// could not even be opened): calls fail fast until the reset timeout lets a probe
    /// through.
    pub fn trip(&self) {
        let mut s = self.lock();
        s.total_failures += 1;
        s.counted += 1;
        s.consecutive_failures += 1;
        s.opened_at = Some(self.clock.now());
    }

    /// Store failures seen since creation.
    pub fn total_failures(&self) -> u64 {
        self.lock().total_failures
    }

    /// Calls refused while open.
    pub fn rejected(&self) -> u64 {
        self.lock().rejected
    }

    fn before(&self) -> Result<Ticket> {
        let mut s = self.lock();
        let mut probe = false;
        if let Some(opened) = s.opened_at {
            let elapsed = self.clock.now().saturating_duration_since(opened);
            if elapsed < self.config.reset_timeout || s.probing {
                s.rejected += 1;
                return Err(Error::CircuitOpen {
                    store: self.inner.location(),
                    failures: s.consecutive_failures,
                    retry_in_ms: self
                        .config
                        .reset_timeout
                        .saturating_sub(elapsed)
                        .as_millis() as u64,
                });
            }
            s.probing = true;
            probe = true;
        }
        Ok(Ticket {
            probe,
            counted: s.counted,
        })
    }

    fn ticket(&self) -> Ticket {
        Ticket {
            probe: false,
            counted: self.lock().counted,
        }
    }

    fn after<T>(&self, result: Result<T>, ticket: Ticket) -> Result<T> {
        let mut s = self.lock();
        if ticket.probe {
            // Only the probe's own outcome ends the probe.
            s.probing = false;
        }
        match &result {
            Err(e) if e.is_outage() => {
                s.total_failures += 1;
                if ticket.counted == s.counted {
                    s.counted += 1;
                    s.consecutive_failures += 1;
                }
                if ticket.probe || s.consecutive_failures >= self.config.failure_threshold {
                    s.opened_at = Some(self.clock.now());
                }
            }
            _ => {
                s.consecutive_failures = 0;
                s.opened_at = None;
            }
        }
        result
    }

    /// A call that the open breaker refuses: `call` runs only when the breaker lets it.
    async fn guarded<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        let ticket = self.before()?;
        self.after(call.await, ticket)
    }

    /// A call that is always tried, even while the breaker is open (see the module docs);
    /// its outcome still counts.
    async fn always<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        let ticket = self.ticket();
        self.after(call.await, ticket)
    }
}

#[async_trait]
impl<S: StoreBase + ?Sized> StoreBase for CircuitBreakerStore<S> {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn location(&self) -> String {
        self.inner.location()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn migrate(&self) -> Result<()> {
        self.guarded(self.inner.migrate()).await
    }
}

/// Every call goes through the breaker, except those that record what is already done:
/// `renew`, `release` and `finish` always try the store (see the module docs), and a
/// confirmation of pending event marks is owed for records already written.
macro_rules! through_breaker {
    ($s:ident, renew($($arg:expr),*)) => {
        $s.always($s.inner.renew($($arg),*)).await
    };
    ($s:ident, release($($arg:expr),*)) => {
        $s.always($s.inner.release($($arg),*)).await
    };
    ($s:ident, finish($($arg:expr),*)) => {
        $s.always($s.inner.finish($($arg),*)).await
    };
    ($s:ident, confirm_event_keys($($arg:expr),*)) => {
        $s.inner.confirm_event_keys($($arg),*).await
    };
    ($s:ident, confirm_pending_batch($($arg:expr),*)) => {
        $s.inner.confirm_pending_batch($($arg),*).await
    };
    ($s:ident, $method:ident($($arg:expr),*)) => {
        $s.guarded($s.inner.$method($($arg),*)).await
    };
}
crate::forward_lease_store!([S: LeaseStore + ?Sized] CircuitBreakerStore<S>, through_breaker);
crate::forward_ledger_store!([S: LedgerStore + ?Sized] CircuitBreakerStore<S>, through_breaker);
crate::forward_maintenance_store!(
    [S: MaintenanceStore + ?Sized] CircuitBreakerStore<S>,
    through_breaker
);
crate::forward_event_key_store!(
    [S: EventKeyStore + ?Sized] CircuitBreakerStore<S>,
    through_breaker
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Cursor, EventMark, EventVerdict, Lease, PendingBatch, UnavailableStore};
    use chrono::{DateTime, Utc};

    /// A clock the test moves, and the move.
    fn hand_clock() -> Arc<Mutex<Instant>> {
        Arc::new(Mutex::new(Instant::now()))
    }

    fn advance(clock: &Mutex<Instant>, by: Duration) {
        *clock.lock().unwrap() += by;
    }

    #[tokio::test]
    async fn opens_after_threshold_and_half_opens_after_timeout() {
        let clock = hand_clock();
        let breaker = CircuitBreakerStore::new(
            Arc::new(UnavailableStore::new(
                "unreachable://",
                "connection refused",
            )),
            BreakerConfig {
                failure_threshold: 3,
                reset_timeout: Duration::from_millis(50),
            },
        )
        .with_clock(clock.clone());
        for _ in 0..3 {
            let e = breaker.migrate().await.unwrap_err();
            assert!(matches!(e, Error::StoreUnavailable { .. }), "{e}");
        }
        assert_eq!(breaker.phase(), BreakerPhase::Open);
        let e = breaker.migrate().await.unwrap_err();
        assert!(matches!(e, Error::CircuitOpen { failures: 3, .. }), "{e}");
        assert_eq!(breaker.rejected(), 1);
        assert_eq!(breaker.total_failures(), 3);
        advance(&clock, Duration::from_millis(49));
        assert_eq!(breaker.phase(), BreakerPhase::Open);
        advance(&clock, Duration::from_millis(1));
        assert_eq!(breaker.phase(), BreakerPhase::HalfOpen);
        // The probe reaches the store (and fails): open again.
        let e = breaker.migrate().await.unwrap_err();
        assert!(matches!(e, Error::StoreUnavailable { .. }), "{e}");
        assert_eq!(breaker.phase(), BreakerPhase::Open);
        assert_eq!(breaker.total_failures(), 4);
    }

    #[tokio::test]
    async fn a_success_closes_the_breaker() {
        let breaker = CircuitBreakerStore::new(
            Arc::new(crate::store::MemoryStore::new()),
            BreakerConfig::default(),
        );
        assert!(breaker.find_keys(&[]).await.is_ok());
        assert_eq!(breaker.phase(), BreakerPhase::Closed);
        // A lost lease is the store working, not failing.
        let lease = Lease {
            processor: "p".into(),
            scope: "s".into(),
            run_id: "r".into(),
            token: 7,
            acquired_at: Utc::now(),
            expires_at: Utc::now(),
        };
        for _ in 0..10 {
            assert!(breaker
                .renew(&lease, Duration::from_secs(1), Utc::now())
                .await
                .is_err());
        }
        assert_eq!(breaker.phase(), BreakerPhase::Closed);
        assert_eq!(breaker.total_failures(), 0);
    }

    #[tokio::test]
    async fn calls_side_by_side_failing_in_one_outage_count_once_and_only_the_probe_ends_probing() {
        let clock = hand_clock();
        let breaker = CircuitBreakerStore::new(
            Arc::new(crate::store::MemoryStore::new()),
            BreakerConfig {
                failure_threshold: 2,
                reset_timeout: Duration::from_millis(30),
            },
        )
        .with_clock(clock.clone());
        let outage = || -> Result<()> { Err(Error::store("x://", "connection refused")) };
        // Three calls under way when the store goes: one failure towards the threshold.
        let tickets: Vec<Ticket> = (0..3).map(|_| breaker.before().unwrap()).collect();
        for t in tickets {
            assert!(breaker.after(outage(), t).is_err());
        }
        assert_eq!(breaker.phase(), BreakerPhase::Closed);
        assert_eq!(breaker.total_failures(), 3);
        // The next call that fails is a second failure in a row: open.
        let t = breaker.before().unwrap();
        let slow = breaker.ticket();
        assert!(breaker.after(outage(), t).is_err());
        assert_eq!(breaker.phase(), BreakerPhase::Open);
        advance(&clock, Duration::from_millis(30));
        // Half-open: one probe; a call from before (`slow`) ending meanwhile does not let
        // a second probe through.
        let probe = breaker.before().unwrap();
        assert!(probe.probe);
        assert!(breaker.after(outage(), slow).is_err());
        assert!(matches!(breaker.before(), Err(Error::CircuitOpen { .. })));
        // The probe fails: open again, whatever was counted meanwhile.
        assert!(breaker.after(outage(), probe).is_err());
        assert_eq!(breaker.phase(), BreakerPhase::Open);
        advance(&clock, Duration::from_millis(30));
        let probe = breaker.before().unwrap();
        assert!(breaker.after(Ok(()), probe).is_ok());
        assert_eq!(breaker.phase(), BreakerPhase::Closed);
    }

    /// A store that answers every event-key call with an empty success and logs which
    /// method was called: a wrapper in front of it must reach the same method.
    #[derive(Debug, Default)]
    struct Spy {
        calls: Mutex<Vec<&'static str>>,
    }

    impl Spy {
        fn log(&self, name: &'static str) {
            self.calls.lock().unwrap().push(name);
        }
    }

    #[async_trait]
    impl StoreBase for Spy {
        fn kind(&self) -> &'static str {
            "spy"
        }
        fn location(&self) -> String {
            "spy://".into()
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                confirms_pending: true,
                batch_concurrency: 7,
                marks_ahead: true,
                ..Capabilities::SHARED
            }
        }
        async fn migrate(&self) -> Result<()> {
            Ok(())
        }
    }

    #[async_trait]
    impl EventKeyStore for Spy {
        async fn check_and_mark(
            &self,
            _: &str,
            _: &[EventMark],
            _: DateTime<Utc>,
        ) -> Result<Vec<EventVerdict>> {
            self.log("check_and_mark");
            Ok(vec![])
        }
        async fn is_duplicate(&self, _: &str, _: &[String], _: DateTime<Utc>) -> Result<Vec<bool>> {
            self.log("is_duplicate");
            Ok(vec![])
        }
        async fn check_all_marked(
            &self,
            _: &str,
            _: &[EventMark],
            _: DateTime<Utc>,
        ) -> Result<Option<Vec<EventVerdict>>> {
            self.log("check_all_marked");
            Ok(None)
        }
        async fn record_decision(&self, _: &str, _: &str, _: &serde_json::Value) -> Result<bool> {
            self.log("record_decision");
            Ok(true)
        }
        async fn mark_event_keys(
            &self,
            _: &str,
            _: &[String],
            _: DateTime<Utc>,
        ) -> Result<Vec<bool>> {
            self.log("mark_event_keys");
            Ok(vec![])
        }
        async fn forget_event_keys(&self, _: &str, _: &[String]) -> Result<u64> {
            self.log("forget_event_keys");
            Ok(0)
        }
        async fn confirm_event_keys(
            &self,
            _: &str,
            _: &[(String, Option<DateTime<Utc>>)],
            _: &str,
        ) -> Result<u64> {
            self.log("confirm_event_keys");
            Ok(0)
        }
        async fn check_and_mark_pending(
            &self,
            _: &str,
            _: &[EventMark],
            _: DateTime<Utc>,
            _: PendingBatch<'_>,
            _: Option<(&str, &Cursor)>,
        ) -> Result<Vec<EventVerdict>> {
            self.log("check_and_mark_pending");
            Ok(vec![])
        }
        async fn check_and_mark_pending_ahead(
            &self,
            _: &str,
            _: &[EventMark],
            _: DateTime<Utc>,
            _: PendingBatch<'_>,
        ) -> Result<Option<Vec<EventVerdict>>> {
            self.log("check_and_mark_pending_ahead");
            Ok(None)
        }
        async fn confirm_pending_batch(
            &self,
            _: &str,
            _: &str,
            _: &[(String, Option<DateTime<Utc>>)],
            _: bool,
        ) -> Result<u64> {
            self.log("confirm_pending_batch");
            Ok(0)
        }
        async fn unmark_event_keys(&self, _: &str, _: &[String], _: DateTime<Utc>) -> Result<u64> {
            self.log("unmark_event_keys");
            Ok(0)
        }
        async fn cursor(&self, _: &str, _: &str) -> Result<Option<Cursor>> {
            self.log("cursor");
            Ok(None)
        }
        async fn advance_cursor(&self, _: &str, _: &str, _: &Cursor) -> Result<()> {
            self.log("advance_cursor");
            Ok(())
        }
        async fn check_and_mark_advancing(
            &self,
            _: &str,
            _: &[EventMark],
            _: DateTime<Utc>,
            _: &str,
            _: &Cursor,
        ) -> Result<Vec<EventVerdict>> {
            self.log("check_and_mark_advancing");
            Ok(vec![])
        }
    }

    /// Every event-key call on the breaker reaches the same method of the store behind
    /// it, and the breaker answers the store's facts: none falls back to the trait's
    /// default (the bulk mark of Postgres was skipped that way).
    #[tokio::test]
    async fn every_event_key_call_reaches_the_same_method_behind_the_breaker() {
        let spy = Arc::new(Spy::default());
        let b = CircuitBreakerStore::new(spy.clone(), BreakerConfig::default());
        let (ns, now, keys) = ("ns", Utc::now(), vec!["k".to_string()]);
        let marks = vec![EventMark::key("k")];
        let cursor = Cursor::at(&serde_json::json!(1), &serde_json::json!(1)).unwrap();
        let batch = PendingBatch {
            marker: "{}",
            timeout: Duration::from_secs(1),
            turn: None,
        };
        let confirms = vec![("k".to_string(), None)];
        b.check_and_mark(ns, &marks, now).await.unwrap();
        b.is_duplicate(ns, &keys, now).await.unwrap();
        b.check_all_marked(ns, &marks, now).await.unwrap();
        b.record_decision(ns, "k", &serde_json::json!(1))
            .await
            .unwrap();
        b.mark_event_keys(ns, &keys, now).await.unwrap();
        b.forget_event_keys(ns, &keys).await.unwrap();
        b.confirm_event_keys(ns, &confirms, "o").await.unwrap();
        b.check_and_mark_pending(ns, &marks, now, batch, Some(("c", &cursor)))
            .await
            .unwrap();
        b.check_and_mark_pending_ahead(ns, &marks, now, batch)
            .await
            .unwrap();
        b.confirm_pending_batch(ns, "{}", &confirms, true)
            .await
            .unwrap();
        b.unmark_event_keys(ns, &keys, now).await.unwrap();
        b.cursor(ns, "c").await.unwrap();
        b.advance_cursor(ns, "c", &cursor).await.unwrap();
        b.check_and_mark_advancing(ns, &marks, now, "c", &cursor)
            .await
            .unwrap();
        assert_eq!(
            *spy.calls.lock().unwrap(),
            [
                "check_and_mark",
                "is_duplicate",
                "check_all_marked",
                "record_decision",
                "mark_event_keys",
                "forget_event_keys",
                "confirm_event_keys",
                "check_and_mark_pending",
                "check_and_mark_pending_ahead",
                "confirm_pending_batch",
                "unmark_event_keys",
                "cursor",
                "advance_cursor",
                "check_and_mark_advancing",
            ]
        );
        assert_eq!(b.capabilities(), spy.capabilities());
    }
}
