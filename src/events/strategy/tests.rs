use super::stats::Latencies;
use super::*;
use crate::store::MemoryStore;
use async_trait::async_trait;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// A real memory store that fails with an outage while `down` is set, and counts the
/// calls that reached it.
#[derive(Debug, Default)]
struct Flaky {
    inner: MemoryStore,
    down: AtomicBool,
    calls: AtomicU64,
}

impl Flaky {
    fn call(&self) -> Result<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            Err(Error::store("flaky://", "connection refused"))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl StoreBase for Flaky {
    fn kind(&self) -> &'static str {
        "flaky"
    }
    fn location(&self) -> String {
        "flaky://".into()
    }
    fn capabilities(&self) -> crate::store::Capabilities {
        self.inner.capabilities()
    }
    async fn migrate(&self) -> Result<()> {
        self.call()
    }
}

/// Every event-key call counts, fails while `down` is set, and goes to the memory
/// store otherwise.
macro_rules! flaky {
    ($s:ident, $method:ident($($arg:expr),*)) => {{
        $s.call()?;
        $s.inner.$method($($arg),*).await
    }};
}
crate::forward_event_key_store!([] Flaky, flaky);

fn gate(store: Arc<Flaky>, strategy: Strategy) -> EventGate {
    let dedup = Deduplicator::new(store, "t", ["id"]).unwrap();
    EventGate::new(
        dedup,
        strategy,
        BreakerConfig {
            failure_threshold: 2,
            reset_timeout: Duration::from_millis(40),
        },
    )
}

fn names(admitted: &[std::result::Result<Admission, InvalidEvent>]) -> Vec<String> {
    admitted
        .iter()
        .map(|a| match a {
            Ok(a) if a.verified() => {
                format!("{}{}", a.verdict_name(), if a.passes { "+" } else { "-" })
            }
            Ok(a) => format!("unverified{}", if a.passes { "+" } else { "-" }),
            Err(_) => "invalid".into(),
        })
        .collect()
}

#[tokio::test]
async fn strategies_under_a_failing_store() {
    let events = [
        json!({"id": 1, "v": 1}),
        json!({"id": 1, "v": 1}),
        json!({"v": 2}),
    ];
    let now = Utc::now();
    let store = Arc::new(Flaky::default());
    store.down.store(true, Ordering::SeqCst);

    let strict = gate(store.clone(), Strategy::Strict);
    let e = strict.check_and_mark(&events, now).await.unwrap_err();
    assert!(e.is_store_failure(), "{e}");
    assert_eq!(strict.stats().store_errors, 1);
    assert_eq!(strict.stats().fallbacks, 0);

    for strategy in [Strategy::BestEffort, Strategy::LogOnly] {
        let g = gate(store.clone(), strategy);
        let out = g.check_and_mark(&events, now).await.unwrap();
        assert_eq!(
            names(&out),
            ["unverified+", "unverified+", "invalid"],
            "{strategy}"
        );
        let s = g.stats();
        assert_eq!(
            (
                s.checked,
                s.fallbacks,
                s.store_errors,
                s.extraction_failures
            ),
            (3, 2, 1, 1)
        );
        assert!((s.fallback_rate() - 2.0 / 3.0).abs() < 1e-9);
        assert!(!g.health().await.healthy);
    }
}

#[tokio::test]
async fn log_only_never_filters_but_counts() {
    let store = Arc::new(Flaky::default());
    let now = Utc::now();
    let events = vec![
        json!({"id": 1, "v": 1}),
        json!({"id": 1, "v": 1}),
        json!({"id": 1, "v": 2}),
        json!({"id": 2}),
    ];
    let log_only = gate(store.clone(), Strategy::LogOnly);
    let out = log_only.check_and_mark(&events, now).await.unwrap();
    assert_eq!(names(&out), ["new+", "replay+", "conflict+", "new+"]);
    let s = log_only.stats();
    assert_eq!(
        (s.unique, s.replays, s.conflicts, s.duplicates),
        (2, 1, 1, 2)
    );
    assert!((s.duplicate_rate() - 0.5).abs() < 1e-9);
    assert_eq!(s.batches, 1);
    assert!(s.p99_batch_latency_us >= s.avg_batch_latency_us || s.batches == 1);
    // The marks were made: a strict gate on the same store filters them now.
    let strict = gate(store, Strategy::Strict);
    assert_eq!(
        strict.filter(events, now).await.unwrap(),
        Vec::<Value>::new()
    );
}

#[tokio::test]
async fn breaker_opens_fails_fast_half_opens_and_closes() {
    let store = Arc::new(Flaky::default());
    let g = gate(store.clone(), Strategy::BestEffort);
    let now = Utc::now();
    let batch = |id: i64| [json!({ "id": id })];
    assert_eq!(
        names(&g.check_and_mark(&batch(1), now).await.unwrap()),
        ["new+"]
    );
    assert_eq!(g.breaker_phase(), BreakerPhase::Closed);

    store.down.store(true, Ordering::SeqCst);
    for id in 2..=3 {
        let out = g.check_and_mark(&batch(id), now).await.unwrap();
        assert_eq!(names(&out), ["unverified+"]);
    }
    assert_eq!(g.breaker_phase(), BreakerPhase::Open);
    let calls = store.calls.load(Ordering::SeqCst);
    // Open: the batch falls back without reaching the store.
    let out = g.check_and_mark(&batch(4), now).await.unwrap();
    assert_eq!(names(&out), ["unverified+"]);
    assert_eq!(
        store.calls.load(Ordering::SeqCst),
        calls,
        "open breaker must not call the store"
    );
    let h = g.health().await;
    assert_eq!((h.healthy, h.breaker, h.latency_us), (false, "open", None));

    // The store comes back; after the reset timeout one probe goes through and closes it.
    store.down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(g.breaker_phase(), BreakerPhase::HalfOpen);
    let out = g
        .check_and_mark(&[json!({"id": 1}), json!({"id": 5})], now)
        .await
        .unwrap();
    assert_eq!(names(&out), ["replay-", "new+"]);
    assert_eq!(g.breaker_phase(), BreakerPhase::Closed);
    let s = g.stats();
    assert_eq!(
        (s.store_errors, s.fallbacks, s.unique, s.replays),
        (3, 3, 2, 1)
    );
    assert!(g.health().await.healthy);
}

#[test]
fn latency_buckets_bound_the_value() {
    for us in [0u64, 1, 7, 8, 9, 15, 16, 100, 1000, 12345, 1 << 40] {
        let b = Latencies::bucket(us);
        assert!(Latencies::upper(b) >= us, "{us}");
        assert!(b == 0 || Latencies::upper(b - 1) < us, "{us}");
    }
    let mut l = Latencies::default();
    for us in 1..=100 {
        l.record(Duration::from_micros(us * 10));
    }
    let p99 = l.quantile(0.99);
    assert!((990..=1100).contains(&p99), "{p99}");
    assert_eq!(l.average(), 505);
}

/// The event-key stores a released batch is tried on: memory, and SQLite in a file.
/// A folder of the tests', removed with it.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn release_stores() -> (Vec<(&'static str, Arc<dyn EventKeyStore>)>, TempDir) {
    let dir = TempDir(std::env::temp_dir().join(format!("idem-release-{}", crate::new_run_id())));
    #[allow(unused_mut)]
    let mut stores: Vec<(&'static str, Arc<dyn EventKeyStore>)> =
        vec![("memory", Arc::new(MemoryStore::new()))];
    #[cfg(feature = "sqlite")]
    {
        std::fs::create_dir_all(&dir.0).unwrap();
        let url = format!("sqlite://{}", dir.0.join("gate.db").display());
        stores.push(("sqlite", crate::store::open_event_keys(&url).await.unwrap()));
    }
    (stores, dir)
}

fn verdicts(admitted: &[std::result::Result<Admission, InvalidEvent>]) -> Vec<&'static str> {
    admitted
        .iter()
        .map(|a| a.as_ref().map_or("invalid", Admission::verdict_name))
        .collect()
}

#[tokio::test]
async fn a_released_batch_is_new_again_on_the_same_gate_and_on_another() {
    let (stores, _dir) = release_stores().await;
    for (label, store) in stores {
        for pending in [None, Some(Duration::from_secs(300))] {
            let ns = format!("release-{}", crate::new_run_id());
            let make = || {
                let dedup = Deduplicator::new(store.clone(), &ns, ["id"]).unwrap();
                let gate = EventGate::new(dedup, Strategy::Strict, BreakerConfig::default());
                match pending {
                    Some(t) => gate.pending(t),
                    None => gate,
                }
            };
            let (gate, other) = (make(), make());
            let now = Utc::now();
            let handled = gate
                .check_and_mark(&[json!({"id": "c"})], now)
                .await
                .unwrap();
            gate.confirm(&handled).await.unwrap();
            // A batch whose handler failed: "a" and "b" new, "c" a replay of a handled
            // event (its mark is not this batch's to take back), one invalid event.
            let batch = [
                json!({"id": "a"}),
                json!({"id": "b"}),
                json!({"id": "c"}),
                json!({"no": "id"}),
                json!({"id": "a"}),
            ];
            let failed = gate.check_and_mark(&batch, now).await.unwrap();
            assert_eq!(
                verdicts(&failed),
                ["new", "new", "replay", "invalid", "replay"],
                "{label} {pending:?}"
            );
            // Unreleased, the redelivery would not pass on this gate.
            let again = gate.check_and_mark(&batch[..2], now).await.unwrap();
            assert_eq!(
                verdicts(&again),
                ["replay", "replay"],
                "{label} {pending:?}"
            );
            assert_eq!(
                gate.release(&failed).await.unwrap(),
                2,
                "{label} {pending:?}"
            );
            // The same admissions again: nothing left to take back.
            assert_eq!(
                gate.release(&failed).await.unwrap(),
                0,
                "{label} {pending:?}"
            );
            let redelivered = gate.check_and_mark(&batch[..3], now).await.unwrap();
            assert_eq!(
                verdicts(&redelivered),
                ["new", "new", "replay"],
                "{label} {pending:?}"
            );
            assert!(redelivered[..2].iter().all(|a| a.as_ref().unwrap().passes));
            gate.release(&redelivered).await.unwrap();
            // Another gate (another process) sees them new at once, without waiting
            // for a pending timeout.
            let elsewhere = other.check_and_mark(&batch[..3], now).await.unwrap();
            assert_eq!(
                verdicts(&elsewhere),
                ["new", "new", "replay"],
                "{label} {pending:?}"
            );
        }
    }
}

#[tokio::test]
async fn release_leaves_a_mark_made_after_the_released_one_expired() {
    let (stores, _dir) = release_stores().await;
    for (label, store) in stores {
        let ns = format!("release-{}", crate::new_run_id());
        let make = || {
            let dedup = Deduplicator::new(store.clone(), &ns, ["id"])
                .unwrap()
                .ttl(crate::events::dedup::Ttl::fixed(Duration::from_secs(60)));
            EventGate::new(dedup, Strategy::Strict, BreakerConfig::default())
        };
        let (late, taker) = (make(), make());
        let t0 = Utc::now();
        let event = [json!({"id": "k"})];
        let first = late.check_and_mark(&event, t0).await.unwrap();
        assert_eq!(verdicts(&first), ["new"], "{label}");
        // Past its TTL another gate marks it anew, then the first gate releases its own.
        let t1 = t0 + chrono::Duration::seconds(120);
        let taken = taker.check_and_mark(&event, t1).await.unwrap();
        assert_eq!(verdicts(&taken), ["new"], "{label}");
        assert_eq!(late.release(&first).await.unwrap(), 0, "{label}");
        let after = taker.check_and_mark(&event, t1).await.unwrap();
        assert_eq!(verdicts(&after), ["replay"], "{label}");
    }
}

#[tokio::test]
async fn handle_confirms_on_success_and_releases_on_failure() {
    let (stores, _dir) = release_stores().await;
    for (label, store) in stores {
        let ns = format!("handle-{}", crate::new_run_id());
        let make = || {
            let dedup = Deduplicator::new(store.clone(), &ns, ["id"]).unwrap();
            EventGate::new(dedup, Strategy::Strict, BreakerConfig::default())
                .pending(Duration::from_secs(300))
        };
        let (gate, other) = (make(), make());
        let now = Utc::now();
        let events = [json!({"id": 1}), json!({"id": 2})];
        let failed = gate
            .handle(&events, now, async |admitted| {
                assert_eq!(verdicts(admitted), ["new", "new"]);
                Err::<(), _>("the warehouse timed out")
            })
            .await
            .unwrap();
        assert_eq!(failed, Err("the warehouse timed out"), "{label}");
        let handled = gate
            .handle(&events, now, async |admitted| {
                Ok::<_, String>(verdicts(admitted))
            })
            .await
            .unwrap();
        assert_eq!(handled, Ok(vec!["new", "new"]), "{label}");
        // Confirmed: another gate finds them handled at once (a pending mark would
        // keep it waiting for 300 s).
        let elsewhere = other.check_and_mark(&events, now).await.unwrap();
        assert_eq!(verdicts(&elsewhere), ["replay", "replay"], "{label}");
    }
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_store_down_at_the_start_is_used_once_it_is_there() {
    // SQLite in a folder that does not exist yet: an outage (a volume not mounted), not
    // a usage error. Under best_effort the gate lets events through unverified, and
    // once the folder is there (and the breaker's timeout passed) it checks them again.
    let dir = std::env::temp_dir().join(format!("idem-reopen-{}", crate::new_run_id()));
    let url = format!("sqlite://{}", dir.join("gate.db").display());
    let store = Arc::new(crate::store::ReopeningEventStore::new(&url));
    let dedup = Deduplicator::new(store.clone(), "ns", ["id"]).unwrap();
    let breaker = crate::store::BreakerConfig {
        failure_threshold: 1,
        reset_timeout: Duration::from_millis(50),
    };
    let gate = EventGate::new(dedup, Strategy::BestEffort, breaker);
    let events = [serde_json::json!({"id": "a"})];
    let first = gate.check_and_mark(&events, Utc::now()).await.unwrap();
    let a = first[0].as_ref().unwrap();
    assert!(!a.verified(), "let through unverified: {a:?}");
    assert!(
        store.capabilities().confirms_pending,
        "known before it is open"
    );
    std::fs::create_dir_all(&dir).unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    let again = gate.check_and_mark(&events, Utc::now()).await.unwrap();
    let a = again[0].as_ref().unwrap();
    assert!(a.verified(), "checked by the store now: {a:?}");
    assert_eq!(a.verdict_name(), "new");
    assert_eq!(store.kind(), "sqlite");
    let third = gate.check_and_mark(&events, Utc::now()).await.unwrap();
    assert_eq!(third[0].as_ref().unwrap().verdict_name(), "replay");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// With pending marks, after a batch of settled replays, the next batch of settled
/// replays is answered by a read without waiting for its turn (a replay pass's batches
/// run side by side), and passes its turn on: the batch after it still waits for the one
/// before it. A batch with a key pending goes down its turn again.
#[tokio::test]
async fn settled_replays_are_read_without_their_turn_which_they_pass_on() {
    let store = Arc::new(MemoryStore::new());
    let ns = "settled";
    let now = Utc::now();
    let keys: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
    store.mark_event_keys(ns, &keys, now).await.unwrap();
    let dedup = Deduplicator::new(store.clone(), ns, ["id"]).unwrap();
    let gate = EventGate::new(dedup, Strategy::Strict, BreakerConfig::default())
        .pending(Duration::from_secs(30));
    let batch = |ids: &[&str]| {
        let events: Vec<Value> = ids.iter().map(|id| json!({ "id": id })).collect();
        gate.prepare(&events)
    };
    let replays = |admitted: Vec<std::result::Result<Admission, InvalidEvent>>| {
        admitted
            .iter()
            .map(|a| a.as_ref().unwrap().verdict_name())
            .collect::<Vec<_>>()
    };
    // The first batch goes down its turn (nothing read yet): settled, so the next reads.
    let first = gate
        .admit_in_turn(batch(&["a", "b"]), now, None, MarkTurn::default())
        .await
        .unwrap();
    assert_eq!(replays(first), ["replay", "replay"]);

    let mut row = MarkTurn::row();
    let mut before = row.next_turn(); // a batch still marking, never done until below
    let this = row.next_turn();
    let mut after = row.next_turn();
    let read = tokio::time::timeout(
        Duration::from_secs(30),
        gate.admit_in_turn(batch(&["c", "d"]), now, None, this),
    )
    .await
    .expect("a batch of settled replays does not wait for the batch before it")
    .unwrap();
    assert_eq!(replays(read), ["replay", "replay"]);
    // Its turn was passed on, not dropped: the next batch still waits for `before`.
    let mut waiting = Box::pin(after.wait());
    assert!(
        futures_util::poll!(waiting.as_mut()).is_pending(),
        "the batch after it waits for the batch before it"
    );
    before.pass_on();
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the batch before it done: the next goes");

    // A key pending (for another gate): the batch goes down its turn, and is marked.
    let other = crate::store::PendingBatch {
        marker: r#"{"idem_pending":"another-gate/0"}"#,
        timeout: Duration::from_secs(30),
        turn: None,
    };
    store
        .check_and_mark_pending(ns, &[crate::store::EventMark::key("e")], now, other, None)
        .await
        .unwrap();
    let mut row = MarkTurn::row();
    let mut before = row.next_turn();
    let this = row.next_turn();
    let call = gate.admit_in_turn(batch(&["a", "e"]), now, None, this);
    let mut call = Box::pin(call);
    assert!(
        futures_util::poll!(call.as_mut()).is_pending(),
        "a batch with a pending key waits for its turn"
    );
    before.pass_on();
    drop(call);
}

/// A turn dropped unused (its batch's call cancelled while it waited) is passed on in
/// order: the batch after it still waits for the batch before it, then goes.
#[tokio::test]
async fn a_turn_dropped_unused_is_passed_on_in_order() {
    let mut row = MarkTurn::row();
    let mut first = row.next_turn();
    let mut second = row.next_turn();
    let mut third = row.next_turn();
    {
        let mut waiting = Box::pin(second.wait());
        assert!(futures_util::poll!(waiting.as_mut()).is_pending());
    }
    drop(second);
    let mut waiting = Box::pin(third.wait());
    assert!(
        futures_util::poll!(waiting.as_mut()).is_pending(),
        "the third waits for the first, not for the dropped second"
    );
    first.pass_on();
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the first done: the third goes");
}

#[tokio::test]
async fn a_confirmation_is_whole_only_with_each_new_key_of_its_batch() {
    let store = Arc::new(MemoryStore::new());
    let dedup = Deduplicator::new(store, "whole", ["id"]).unwrap();
    let gate = EventGate::new(dedup, Strategy::Strict, BreakerConfig::default())
        .pending(Duration::from_secs(300));
    let batch = [json!({"id": "a"}), json!({"id": "b"}), json!({"id": "c"})];
    let admitted = gate.check_and_mark(&batch, Utc::now()).await.unwrap();
    let whole = |admitted: &[std::result::Result<Admission, InvalidEvent>]| {
        let c = gate.confirmations(admitted);
        assert_eq!(c.len(), 1);
        c[0].whole
    };
    assert!(whole(&admitted));
    assert!(!whole(&admitted[..2]), "a key missing");
    // As many admissions as new keys, one twice and one missing: not whole.
    let twice = [
        admitted[0].clone(),
        admitted[1].clone(),
        admitted[1].clone(),
    ];
    assert!(!whole(&twice));
    let places: Vec<usize> = admitted
        .iter()
        .map(|a| a.as_ref().unwrap().pending_batch.unwrap().place)
        .collect();
    assert_eq!(places, [0, 1, 2], "each new key's place in its batch");
    assert_eq!(
        gate.confirmations(&twice)[0].keys.len(),
        2,
        "a key passed twice is sent once"
    );
    let mut all_twice = admitted.clone();
    all_twice.extend(admitted.iter().cloned());
    assert!(whole(&all_twice));
    // Taken, not copied: the same confirmation, the admissions' keys left empty.
    let mut taken = admitted.clone();
    let c = gate.take_confirmations(&mut taken);
    let copied = gate.confirmations(&admitted);
    assert_eq!((c.len(), c[0].whole), (1, true));
    assert_eq!(
        (&c[0].marker, &c[0].keys),
        (&copied[0].marker, &copied[0].keys)
    );
    assert!(taken.iter().all(|a| a.as_ref().unwrap().key.is_empty()));
    // Confirmed twice over: three keys, none lost (no `unconfirmed`).
    assert_eq!(gate.confirm(&all_twice).await.unwrap(), 3);
    assert_eq!(gate.stats().unconfirmed, 0);
}
