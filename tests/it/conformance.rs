//! The store conformance suite (`idem::store::conformance`) against every backend.
//!
//! Memory and SQLite always run. Backends behind a service run when their URL is set and
//! skip with a message otherwise: `IDEM_TEST_POSTGRES_URL` (a database the tests may fill),
//! `IDEM_TEST_BIGQUERY_URL` (see docs/contributing.md), `IDEM_TEST_REDIS_URL` (`redis://HOST:PORT`: a
//! Redis holding event keys only, so it runs the event-key checks; each test uses a fresh
//! key prefix and deletes its keys after).

use std::sync::Arc;

use idem::store::{conformance, DynStore, EventKeyStore, StoreBase};

use crate::common;

/// The event-key checks ([`EventKeyStore`]), one `#[tokio::test]` each — the only list of
/// them. Expanded inside a backend's module, where `event_store()` opens its store through
/// `open_event_keys` (the path `idem gate` takes) and may return a guard that cleans up.
macro_rules! event_key_checks {
    ($($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                if let Some((s, _cleanup)) = event_store().await {
                    conformance::$check(&*s).await
                }
            }
        )*
    };
}

/// Every event-key check, for a backend module that defines `event_store()`.
macro_rules! all_event_key_checks {
    () => {
        event_key_checks!(
            event_keys_batch,
            event_dedup_replay_and_conflict,
            event_dedup_ttl,
            event_dedup_real_ttl,
            event_dedup_in_batch,
            event_dedup_large_batch,
            event_dedup_after_fresh_batches,
            event_dedup_after_replayed_batches,
            event_cursor,
            event_unmark,
            event_pending,
            event_pending_batches,
            event_all_marked,
            event_marks_ahead,
        );

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn event_pending_batches_are_whole() {
            if let Some((a, b, _cleanup)) = event_store_pair().await {
                conformance::event_pending_batches_are_whole(&*a, &*b).await
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn result_cache() {
            if let Some((s, _cleanup)) = event_store().await {
                crate::conformance::result_cache_check(s).await
            }
        }
    };
}

/// The store `url` names behind the wrappers `idem gate` puts in front of it: a breaker in
/// front of a store opened on first use ([`idem::store::ReopeningEventStore`]).
fn wrapped(url: &str) -> Arc<dyn EventKeyStore> {
    let reopening: Arc<dyn EventKeyStore> = Arc::new(idem::store::ReopeningEventStore::new(url));
    Arc::new(idem::store::CircuitBreakerStore::new(
        reopening,
        idem::store::BreakerConfig::default(),
    ))
}

/// [`wrapped`], with the store behind opened (a check's timing starts with its first call,
/// which would otherwise open and migrate the store).
async fn wrapped_open(url: &str) -> Arc<dyn EventKeyStore> {
    let store = wrapped(url);
    store
        .is_duplicate("open", &[], chrono::Utc::now())
        .await
        .expect("open the store behind the wrappers");
    store
}

/// The wrappers answer what the store they wrap answers: its kind and capabilities
/// (whether pending marks are confirmed, how many batches run side by side), before the
/// store is open too (a gate decides both when it starts).
async fn wrappers_answer_as_the_store(url: &str) {
    let direct = idem::store::open_event_keys(url)
        .await
        .expect("open the store");
    let reopening = idem::store::ReopeningEventStore::new(url);
    assert_eq!(reopening.kind(), direct.kind(), "before the store is open");
    assert_eq!(
        reopening.capabilities(),
        direct.capabilities(),
        "before the store is open"
    );
    reopening
        .is_duplicate("wrappers", &["k".to_string()], chrono::Utc::now())
        .await
        .expect("open the store behind the wrapper");
    let wrapped = wrapped(url);
    wrapped
        .is_duplicate("wrappers", &["k".to_string()], chrono::Utc::now())
        .await
        .expect("open the store behind the wrappers");
    for (name, store) in [
        ("reopening", &reopening as &dyn EventKeyStore),
        ("breaker and reopening", &*wrapped),
    ] {
        assert_eq!(store.kind(), direct.kind(), "{name}");
        assert_eq!(store.capabilities(), direct.capabilities(), "{name}");
    }
}

/// The result cache (seed 000) on a store: a retry with the same events (in another
/// order) returns the stored result without calling the closure; other events for the same
/// request id call it again; a failed call is not cached; `clear` removes the entry (not on
/// BigQuery, which keeps it until its TTL).
async fn result_cache_check(store: Arc<dyn EventKeyStore>) {
    use idem::events::cache::{CacheOrigin, ResultCache};
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let cache = ResultCache::new(store.clone(), format!("cache-{}", idem::new_run_id()));
    let calls = AtomicUsize::new(0);
    let work = |result: serde_json::Value| {
        let calls = &calls;
        move || async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(result)
        }
    };
    let events = [
        json!({"account_id": "a1", "side": "buy", "price": "10.50", "quantity": 3}),
        json!({"account_id": "a2", "side": "sell", "price": "9.00", "quantity": 1}),
    ];
    let reordered = [events[1].clone(), events[0].clone()];
    let changed = [events[0].clone()];

    let first = cache
        .cached("req-1", &events, work(json!({"sequences": [1, 2]})))
        .await
        .unwrap();
    assert_eq!(first, json!({"sequences": [1, 2]}));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The retry, same events in another order: the stored result, no call.
    let (again, origin) = cache
        .cached_with_origin("req-1", &reordered, work(json!("not called")))
        .await
        .unwrap();
    assert_eq!((again, origin), (first.clone(), CacheOrigin::Hit));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "a retry does not call again"
    );
    // Other events for the same request: called again, and cached apart.
    let other = cache
        .cached("req-1", &changed, work(json!({"sequences": []})))
        .await
        .unwrap();
    assert_eq!(other, json!({"sequences": []}));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "other events call again");
    let cached_other = cache
        .cached("req-1", &changed, work(json!("not called")))
        .await
        .unwrap();
    assert_eq!(cached_other, other);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // A failure is not cached: the next call runs the work.
    let failed = cache
        .cached("req-2", &events, || async {
            Err(idem::Error::input("the algorithm failed"))
        })
        .await;
    assert!(failed.is_err());
    let retried = cache
        .cached("req-2", &events, work(json!("second try")))
        .await
        .unwrap();
    assert_eq!(retried, json!("second try"));
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    // Cleared on completion.
    if store.kind() == "bigquery" {
        assert!(matches!(
            cache.clear("req-1", &events).await,
            Err(idem::Error::Unsupported { .. })
        ));
        return;
    }
    assert!(cache.clear("req-1", &events).await.unwrap());
    assert!(!cache.clear("req-1", &events).await.unwrap());
    let recomputed = cache
        .cached("req-1", &events, work(json!("after clear")))
        .await
        .unwrap();
    assert_eq!(recomputed, json!("after clear"));
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

/// One `#[tokio::test]` per conformance check for a full store backend (leases, ledger,
/// maintenance; the event-key checks through [`all_event_key_checks`]) — the only list of the
/// checks. `$url` is an async expression giving the store's URL as `Option<String>`
/// (None = skip; the expression already said why).
macro_rules! conformance_tests {
    ($backend:ident, $url:expr) => {
        mod $backend {
            use super::*;

            async fn url() -> Option<String> {
                $url
            }

            async fn store() -> Option<Arc<DynStore>> {
                let url = url().await?;
                Some(idem::store::open(&url).await.expect("open the store"))
            }

            async fn event_store() -> Option<(Arc<dyn EventKeyStore>, ())> {
                let url = url().await?;
                let store = idem::store::open_event_keys(&url)
                    .await
                    .expect("open the event-key store");
                Some((store, ()))
            }

            /// Two handles on one store (two connections); one handle twice for a store
            /// that lives in its process only (memory).
            async fn event_store_pair(
            ) -> Option<(Arc<dyn EventKeyStore>, Arc<dyn EventKeyStore>, ())> {
                let url = url().await?;
                let a = idem::store::open_event_keys(&url)
                    .await
                    .expect("open the event-key store");
                let b = match a.kind() {
                    "memory" => a.clone(),
                    _ => idem::store::open_event_keys(&url)
                        .await
                        .expect("open the event-key store again"),
                };
                Some((a, b, ()))
            }

            all_event_key_checks!();

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn wrappers_answer_as_the_store() {
                if let Some(url) = url().await {
                    crate::conformance::wrappers_answer_as_the_store(&url).await
                }
            }

            /// The event-key checks through the wrappers `idem gate` puts in front of a
            /// store (a breaker in front of a store opened on first use): a method a
            /// wrapper does not forward falls back to the trait's default and fails here.
            mod through_wrappers {
                use super::*;

                async fn event_store() -> Option<(Arc<dyn EventKeyStore>, ())> {
                    Some((crate::conformance::wrapped_open(&url().await?).await, ()))
                }

                async fn event_store_pair(
                ) -> Option<(Arc<dyn EventKeyStore>, Arc<dyn EventKeyStore>, ())> {
                    let (a, b, ()) = super::event_store_pair().await?;
                    let wrap = |s: Arc<dyn EventKeyStore>| -> Arc<dyn EventKeyStore> {
                        Arc::new(idem::store::CircuitBreakerStore::new(
                            s,
                            idem::store::BreakerConfig::default(),
                        ))
                    };
                    Some((wrap(a), wrap(b), ()))
                }

                all_event_key_checks!();
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn claim_excludes_and_release_frees() {
                if let Some(s) = store().await {
                    conformance::claim_excludes_and_release_frees(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn expired_lease_is_taken_over_and_fenced() {
                if let Some(s) = store().await {
                    conformance::expired_lease_is_taken_over_and_fenced(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_claims_have_one_winner() {
                if let Some(s) = store().await {
                    conformance::concurrent_claims_have_one_winner(s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn keys_only_on_success() {
                if let Some(s) = store().await {
                    conformance::keys_only_on_success(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn key_windows_and_latest_row() {
                if let Some(s) = store().await {
                    conformance::key_windows_and_latest_row(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn ledger_queries() {
                if let Some(s) = store().await {
                    conformance::ledger_queries(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn strings_round_trip() {
                if let Some(s) = store().await {
                    conformance::strings_round_trip(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn purge_and_cleanup() {
                if let Some(s) = store().await {
                    conformance::purge_and_cleanup(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn renew_extends_lease() {
                if let Some(s) = store().await {
                    conformance::renew_extends_lease(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn taken_run_id_is_refused_and_changes_nothing() {
                if let Some(s) = store().await {
                    conformance::taken_run_id_is_refused_and_changes_nothing(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cleanup_deletes_exactly_what_is_past_retention() {
                if let Some(s) = store().await {
                    conformance::cleanup_deletes_exactly_what_is_past_retention(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn open_leases_are_the_runs_not_recorded_yet() {
                if let Some(s) = store().await {
                    conformance::open_leases_are_the_runs_not_recorded_yet(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cleanup_keeps_a_key_until_its_own_retention() {
                if let Some(s) = store().await {
                    conformance::cleanup_keeps_a_key_until_its_own_retention(&*s).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn capabilities_hold_across_instances() {
                if let Some(url) = url().await {
                    conformance::capabilities_hold_across_instances(&url).await
                }
            }
        }
    };
}

conformance_tests!(memory, Some("memory://".to_string()));

conformance_tests!(sqlite, {
    // A fresh file per test: the tests of one backend run in parallel. Under the target
    // folder's own tmp (Cargo's CARGO_TARGET_TMPDIR), not /tmp: one folder per test and
    // run would pile up there, with nothing to remove them.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("idem-conformance-{}", idem::new_run_id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    Some(format!("sqlite://{}", dir.join("store.db").display()))
});

// A database the tests may fill; every check uses its own processor names, so the checks
// share it.
conformance_tests!(
    postgres,
    common::service_url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres conformance check",
        common::POSTGRES_HOW,
    )
);

// The emulator (see docs/bigquery.md). The dataset and tables are created on first use;
// every check uses its own processor names, so the checks share them.
#[cfg(feature = "bigquery")]
conformance_tests!(
    bigquery,
    common::service_url(
        "IDEM_TEST_BIGQUERY_URL",
        "bigquery conformance check",
        common::BIGQUERY_HOW,
    )
);

// Redis holds event keys only: the event-key checks, each under a fresh key prefix whose
// keys are deleted when the test ends (passed or not).
#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use common::redis::{fresh_prefix_url, PrefixCleanup};

    fn url() -> Option<String> {
        common::redis_url("redis conformance check")
    }

    async fn event_store() -> Option<(Arc<dyn EventKeyStore>, PrefixCleanup)> {
        let (url, cleanup) = fresh_prefix_url(&url()?);
        let store = idem::store::open_event_keys(&url)
            .await
            .expect("open the redis store");
        assert_eq!(store.kind(), "redis");
        Some((store, cleanup))
    }

    /// Two handles (two connections) under one fresh prefix.
    async fn event_store_pair() -> Option<(
        Arc<dyn EventKeyStore>,
        Arc<dyn EventKeyStore>,
        PrefixCleanup,
    )> {
        let (url, cleanup) = fresh_prefix_url(&url()?);
        let open = || idem::store::open_event_keys(&url);
        let (a, b) = (
            open().await.expect("open the redis store"),
            open().await.expect("open the redis store again"),
        );
        Some((a, b, cleanup))
    }

    all_event_key_checks!();

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wrappers_answer_as_the_store() {
        if let Some(url) = url() {
            let (url, _cleanup) = fresh_prefix_url(&url);
            crate::conformance::wrappers_answer_as_the_store(&url).await
        }
    }

    /// The event-key checks through the wrappers (see the SQL backends' modules).
    mod through_wrappers {
        use super::*;

        async fn event_store() -> Option<(Arc<dyn EventKeyStore>, PrefixCleanup)> {
            let (url, cleanup) = fresh_prefix_url(&super::url()?);
            Some((crate::conformance::wrapped_open(&url).await, cleanup))
        }

        async fn event_store_pair() -> Option<(
            Arc<dyn EventKeyStore>,
            Arc<dyn EventKeyStore>,
            PrefixCleanup,
        )> {
            let (url, cleanup) = fresh_prefix_url(&super::url()?);
            Some((
                crate::conformance::wrapped_open(&url).await,
                crate::conformance::wrapped_open(&url).await,
                cleanup,
            ))
        }

        all_event_key_checks!();
    }

    /// Redis expires a mark by its own clock: with the caller's `now` frozen, the mark is
    /// still gone after its ttl (a SQL store, told the same `now`, would replay).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ttl_expires_by_the_redis_clock() {
        use idem::store::{EventMark, EventVerdict};
        let Some((s, _cleanup)) = event_store().await else {
            return;
        };
        let frozen = chrono::Utc::now();
        let mark = [EventMark::key("k").ttl(std::time::Duration::from_millis(300))];
        assert_eq!(
            s.check_and_mark("clock", &mark, frozen).await.unwrap(),
            vec![EventVerdict::New]
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        assert_eq!(
            s.check_and_mark("clock", &mark, frozen).await.unwrap(),
            vec![EventVerdict::New]
        );
    }

    /// A pending batch at `place` in the row `row`, marked `marker`.
    fn in_row(marker: &str, place: u64) -> idem::store::PendingBatch<'_> {
        idem::store::PendingBatch {
            marker,
            timeout: std::time::Duration::from_secs(60),
            turn: Some(idem::store::BatchTurn {
                row: "row",
                place,
                started: idem::store::TurnStarted::nobody(),
            }),
        }
    }

    /// A pending batch refused (asked ahead of its turn) deletes the keys its transaction
    /// set. A key naming it all the same (the undoing lost with its connection) is dead to
    /// any other batch (the batch's own key was never set: new there), and the batch's own
    /// when it asks again in its turn: new, not a replay of itself.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keys_a_refused_batch_left_are_dead_to_others_and_its_own() {
        use idem::store::redis::redis_key;
        use idem::store::{EventMark, EventVerdict, PendingBatch};
        use std::time::Duration;
        let Some((s, cleanup)) = event_store().await else {
            return;
        };
        let mut raw = ::redis::Client::open(cleanup.url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let t = chrono::Utc::now();
        let key = |k: &str| redis_key(&cleanup.prefix, "left", k);
        let marks = |keys: &[&str]| -> Vec<EventMark> {
            keys.iter()
                .map(|k| EventMark::key(*k).ttl(Duration::from_secs(3600)))
                .collect()
        };
        let ours = r#"{"idem_pending":"left/1"}"#;
        let (a, b) = (marks(&["a", "b"]), marks(&["b"]));
        assert_eq!(
            s.check_and_mark_pending_ahead("left", &a, t, in_row(ours, 1))
                .await
                .unwrap(),
            None
        );
        let exists: usize = ::redis::cmd("EXISTS")
            .arg(key("a"))
            .arg(key("b"))
            .query(&mut raw)
            .unwrap();
        assert_eq!(exists, 0, "a refused batch's keys stay in Redis");
        // What an undoing lost would leave: both keys naming our batch.
        let left = format!("{}:3600000000:\n@{ours}", t.timestamp_micros());
        for k in ["a", "b"] {
            let _: () = ::redis::cmd("SET")
                .arg(key(k))
                .arg(&left)
                .arg("PX")
                .arg(3_600_000)
                .query(&mut raw)
                .unwrap();
        }
        let theirs = r#"{"idem_pending":"other/0"}"#;
        let other = PendingBatch {
            marker: theirs,
            timeout: Duration::from_secs(60),
            turn: None,
        };
        assert_eq!(
            s.check_and_mark_pending("left", &b, t, other, None)
                .await
                .unwrap(),
            [EventVerdict::New],
            "a key naming a batch never set is dead"
        );
        let v = s
            .check_and_mark_pending("left", &a, t, in_row(ours, 0), None)
            .await
            .unwrap();
        assert_eq!(v[0], EventVerdict::New, "the batch's own key: {v:?}");
        assert!(
            matches!(&v[1], EventVerdict::Replay { decision: Some(d), .. } if *d == serde_json::from_str::<serde_json::Value>(theirs).unwrap()),
            "the key the other batch took: {v:?}"
        );
    }

    /// Keys expired by Redis's clock but not yet removed (Redis removes them when next
    /// touched, or by sampling) are new to a pending batch, which so marks every key new
    /// and moves its row on: the next batch is marked ahead of its turn, not refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keys_expired_not_yet_removed_are_new_and_move_the_row() {
        use idem::store::{EventMark, EventVerdict};
        use std::time::Duration;
        let Some((s, _cleanup)) = event_store().await else {
            return;
        };
        let keys = |from: usize, ttl: Duration| -> Vec<EventMark> {
            (from..from + 200)
                .map(|i| EventMark::key(format!("k{i}")).ttl(ttl))
                .collect()
        };
        let short = keys(0, Duration::from_millis(1));
        let marked = s
            .check_and_mark("lazy", &short, chrono::Utc::now())
            .await
            .unwrap();
        assert!(marked.iter().all(|v| *v == EventVerdict::New));
        // Past their 1 ms by Redis's clock: most are still in its table.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t = chrono::Utc::now();
        let long = Duration::from_secs(3600);
        let v = s
            .check_and_mark_pending(
                "lazy",
                &keys(0, long),
                t,
                in_row(r#"{"idem_pending":"lazy/0"}"#, 0),
                None,
            )
            .await
            .unwrap();
        assert!(v.iter().all(|v| *v == EventVerdict::New), "{v:?}");
        let ahead = s
            .check_and_mark_pending_ahead(
                "lazy",
                &keys(1000, long),
                t,
                in_row(r#"{"idem_pending":"lazy/1"}"#, 1),
            )
            .await
            .unwrap();
        assert!(
            ahead
                .as_ref()
                .is_some_and(|v| v.iter().all(|v| *v == EventVerdict::New)),
            "place 1 right after place 0, which marked every key new: {ahead:?}"
        );
    }

    /// A Redis user that may not run `INFO` (ACL `-@dangerous` is common) still marks
    /// pending batches, in its turn and ahead of it: `INFO` only corrects the count of new
    /// keys for keys Redis expired meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_user_without_info_marks_pending_batches() {
        use idem::store::{EventMark, EventVerdict};
        use std::time::Duration;
        let Some(base) = url() else { return };
        /// A Redis ACL user of the test's own, deleted on drop.
        struct User(::redis::Connection, String);
        impl Drop for User {
            fn drop(&mut self) {
                let _: ::redis::RedisResult<i64> = ::redis::cmd("ACL")
                    .arg("DELUSER")
                    .arg(&self.1)
                    .query(&mut self.0);
            }
        }
        let name = format!("idem-test-{}", idem::new_run_id());
        let mut admin = ::redis::Client::open(base.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let _: () = ::redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&name)
            .arg("on")
            .arg(">pw")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .arg("-@dangerous")
            .query(&mut admin)
            .unwrap();
        let _user = User(admin, name.clone());
        let mut limited = url::Url::parse(&base).unwrap();
        limited.set_username(&name).unwrap();
        limited.set_password(Some("pw")).unwrap();
        let (url, _cleanup) = fresh_prefix_url(limited.as_str());
        let s = idem::store::open_event_keys(&url).await.unwrap();
        let keys = |from: usize| -> Vec<EventMark> {
            (from..from + 50)
                .map(|i| EventMark::key(format!("k{i}")).ttl(Duration::from_secs(60)))
                .collect()
        };
        let t = chrono::Utc::now();
        let all_new = |v: &[EventVerdict]| v.iter().all(|v| *v == EventVerdict::New);
        let v = s
            .check_and_mark_pending(
                "acl",
                &keys(0),
                t,
                in_row(r#"{"idem_pending":"acl/0"}"#, 0),
                None,
            )
            .await
            .unwrap();
        assert!(all_new(&v), "{v:?}");
        let ahead = s
            .check_and_mark_pending_ahead(
                "acl",
                &keys(100),
                t,
                in_row(r#"{"idem_pending":"acl/1"}"#, 1),
            )
            .await
            .unwrap();
        assert!(
            ahead.as_ref().is_some_and(|v| all_new(v)),
            "place 1 right after place 0: {ahead:?}"
        );
    }

    /// A run's store cannot be Redis: `open` says it holds event keys only.
    #[tokio::test]
    async fn open_refuses_redis_as_a_run_store() {
        let Some(url) = url() else { return };
        let e = idem::store::open(&url).await.unwrap_err();
        assert!(e.is_usage(), "{e}");
        assert!(e.to_string().contains("event keys only"), "{e}");
    }

    /// A TCP proxy to Redis that the test stops and starts on the same port.
    struct Proxy {
        port: u16,
        target: String,
        tasks: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    }

    impl Proxy {
        async fn start(port: u16, target: &str) -> Proxy {
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .expect("bind the proxy");
            let port = listener.local_addr().unwrap().port();
            let tasks = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let (shared, target_addr) = (tasks.clone(), target.to_string());
            let accept = tokio::spawn(async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    let target_addr = target_addr.clone();
                    let copy = tokio::spawn(async move {
                        if let Ok(mut server) = tokio::net::TcpStream::connect(&target_addr).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    shared.lock().unwrap().push(copy);
                }
            });
            tasks.lock().unwrap().push(accept);
            Proxy {
                port,
                target: target.to_string(),
                tasks,
            }
        }

        /// Closes the listener and every proxied connection.
        fn stop(&self) {
            for task in self.tasks.lock().unwrap().drain(..) {
                task.abort();
            }
        }
    }

    /// Redis goes away (a proxy the test controls is stopped): calls fail as outages, a
    /// circuit breaker around the store opens; when Redis is back the connection manager
    /// reconnects, the breaker closes after its probe, and the marks made before are there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn outage_opens_the_breaker_and_recovery_closes_it() {
        use idem::store::{BreakerConfig, CircuitBreakerStore, EventMark, EventVerdict};
        use std::time::{Duration, Instant};
        let Some(url) = url() else { return };
        let parsed = url::Url::parse(&url).unwrap();
        let target = format!(
            "{}:{}",
            parsed.host_str().unwrap(),
            parsed.port().unwrap_or(6379)
        );
        let proxy = Proxy::start(0, &target).await;
        let (proxied, _cleanup) = common::redis::fresh_prefix_url(&url);
        let mut proxied = url::Url::parse(&proxied).unwrap();
        proxied.set_port(Some(proxy.port)).unwrap();
        let store = idem::store::open_event_keys(proxied.as_str())
            .await
            .unwrap();
        let config = BreakerConfig {
            failure_threshold: 2,
            reset_timeout: Duration::from_millis(500),
        };
        let breaker = CircuitBreakerStore::new(store, config);
        let now = chrono::Utc::now;
        let mark = |k: &str| [EventMark::key(k).fingerprint("x")];
        let first = breaker.check_and_mark("outage", &mark("a"), now()).await;
        assert_eq!(first.unwrap(), vec![EventVerdict::New]);

        proxy.stop();
        let mut errors = Vec::new();
        for _ in 0..4 {
            let e = breaker
                .check_and_mark("outage", &mark("b"), now())
                .await
                .unwrap_err();
            assert!(e.is_outage(), "{e}");
            errors.push(e.to_string());
        }
        assert!(
            errors.last().unwrap().contains("circuit breaker open"),
            "{errors:?}"
        );

        let restarted = Proxy::start(proxy.port, &proxy.target).await;
        let deadline = Instant::now() + Duration::from_secs(15);
        let verdicts = loop {
            match breaker.check_and_mark("outage", &mark("b"), now()).await {
                Ok(v) => break v,
                Err(e) => {
                    assert!(e.is_outage(), "{e}");
                    assert!(Instant::now() < deadline, "no recovery: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        assert_eq!(verdicts, vec![EventVerdict::New]);
        assert_eq!(breaker.phase(), idem::store::breaker::BreakerPhase::Closed);
        let again = breaker
            .check_and_mark("outage", &mark("a"), now())
            .await
            .unwrap();
        assert_eq!(
            again[0].name(),
            "replay",
            "marks made before the outage stay"
        );
        restarted.stop();
    }

    /// Nothing listening: the store is unavailable (an outage, for the failure policy and
    /// the breaker), not a panic or a usage error.
    #[tokio::test]
    async fn unreachable_redis_is_an_outage() {
        let e = idem::store::open_event_keys("redis://127.0.0.1:1")
            .await
            .unwrap_err();
        assert!(e.is_outage(), "{e}");
        assert!(e.to_string().contains("unavailable"), "{e}");
    }

    /// Something that is not Redis answers (a web server): the store is unavailable, and
    /// the error says the server did not speak Redis's protocol, not a parser's bytes.
    #[tokio::test]
    async fn a_server_that_is_not_redis_is_named_so() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let mut buf = [0u8; 1024];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                    .await;
            }
        });
        let e = idem::store::open_event_keys(&format!("redis://127.0.0.1:{port}/0"))
            .await
            .unwrap_err();
        server.abort();
        assert!(e.is_store_failure(), "{e}");
        assert!(
            e.to_string()
                .contains("did not answer in the Redis protocol"),
            "{e}"
        );
    }
}
