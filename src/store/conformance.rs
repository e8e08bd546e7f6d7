//! The conformance suite every store must pass.
//!
//! Plain `pub async fn`s, each taking the capability it tests (`&dyn LeaseStore`,
//! `&dyn LedgerStore`, `&dyn EventKeyStore`, or the whole `&dyn Store`); each backend's
//! tests call every one of them directly (see `tests/conformance.rs`). What a backend
//! guarantees beyond one instance ([`Capabilities`](super::Capabilities)) decides what
//! [`capabilities_hold_across_instances`] asserts. Each check uses its own processor names, so the checks can
//! share one database and run in any order. Times are passed explicitly (`now`), so
//! expiry is tested without sleeping.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use serde_json::json;

use super::{
    Claim, ClaimRequest, CleanupPolicy, CleanupProgress, CleanupProgressFn, CleanupReport, Cursor,
    EventKeyStore, EventMark, EventVerdict, Finish, KeyLookup, Lease, LeaseStore, LedgerStore,
    RunFilter, Store,
};
use crate::error::Error;
use crate::model::{
    micros, new_run_id, KeyKind, KeyRecord, Mode, RunRecord, RunStatus, SkipReason, Trigger,
};

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &new_run_id()[..8])
}

fn now() -> DateTime<Utc> {
    micros(Utc::now())
}

fn day() -> NaiveDate {
    NaiveDate::from_ymd_opt(2025, 11, 18).expect("valid date")
}

fn request<'a>(
    processor: &'a str,
    scope: &'a str,
    run_id: &'a str,
    ttl_secs: u64,
    now: DateTime<Utc>,
) -> ClaimRequest<'a> {
    ClaimRequest {
        processor,
        scope,
        run_id,
        ttl: Duration::from_secs(ttl_secs),
        now,
    }
}

/// A ledger row for tests.
pub fn run_record(
    processor: &str,
    scope: &str,
    run_id: &str,
    status: RunStatus,
    at: DateTime<Utc>,
) -> RunRecord {
    RunRecord {
        run_id: run_id.to_string(),
        processor: processor.to_string(),
        scope: scope.to_string(),
        scope_date: day(),
        trigger: Trigger::Scheduler,
        mode: Mode::Enforce,
        started_at: micros(at - chrono::Duration::milliseconds(1500)),
        finished_at: micros(at),
        duration_ms: 1500,
        status,
        skip_reason: (status == RunStatus::Skipped).then_some(SkipReason::TimeWindow),
        would_skip_reason: None,
        previous_run_id: None,
        records_processed: (status == RunStatus::Completed).then_some(42),
        processing_key: Some("k".repeat(64)),
        error: (status == RunStatus::Failed).then(|| "boom".to_string()),
        output: Some(json!({"rows": 42, "note": "ok"})),
    }
}

/// A key row for tests.
pub fn key_record(
    key: &str,
    kind: KeyKind,
    processor: &str,
    scope: &str,
    run_id: &str,
    at: DateTime<Utc>,
) -> KeyRecord {
    KeyRecord {
        key: key.to_string(),
        kind,
        processor: processor.to_string(),
        scope: scope.to_string(),
        scope_date: day(),
        processed_at: micros(at),
        entity_count: Some(450),
        metadata: json!({"source": "test", "entities": 450}),
        run_id: run_id.to_string(),
    }
}

fn acquired(claim: Claim) -> Lease {
    match claim {
        Claim::Acquired(lease) => lease,
        Claim::Held(h) => panic!(
            "expected to acquire the lease, but run {} holds it",
            h.run_id
        ),
    }
}

async fn finish_completed(
    store: &dyn LedgerStore,
    lease: &Lease,
    keys: Vec<KeyRecord>,
    at: DateTime<Utc>,
) -> crate::Result<()> {
    store
        .finish(&Finish {
            run: run_record(
                &lease.processor,
                &lease.scope,
                &lease.run_id,
                RunStatus::Completed,
                at,
            ),
            keys,
            lease: Some(lease.clone()),
        })
        .await
}

/// A claim excludes other runs until the holder finishes; then the lease is free and the
/// next claim gets a larger token.
pub async fn claim_excludes_and_release_frees(store: &dyn Store) {
    let p = unique("claim");
    let t = now();
    let (a, b, c) = (new_run_id(), new_run_id(), new_run_id());
    let lease_a = acquired(
        store
            .claim(&request(&p, "2025-11-18", &a, 3600, t))
            .await
            .unwrap(),
    );
    assert_eq!(lease_a.run_id, a);
    match store
        .claim(&request(&p, "2025-11-18", &b, 3600, t))
        .await
        .unwrap()
    {
        Claim::Held(h) => {
            assert_eq!(h.run_id, a, "the holder is reported");
            assert_eq!(h.token, lease_a.token);
            assert_eq!(h.expires_at, lease_a.expires_at);
        }
        Claim::Acquired(_) => panic!("a second run acquired a held lease"),
    }
    let peek = store.lease_holder(&p, "2025-11-18", t).await.unwrap();
    assert_eq!(
        peek.map(|h| h.run_id),
        Some(a.clone()),
        "lease_holder peeks"
    );
    let later = lease_a.expires_at + chrono::Duration::seconds(1);
    assert!(store
        .lease_holder(&p, "2025-11-18", later)
        .await
        .unwrap()
        .is_none());
    // Another scope of the same processor is independent.
    acquired(
        store
            .claim(&request(&p, "2025-11-19", &b, 3600, t))
            .await
            .unwrap(),
    );

    finish_completed(store, &lease_a, vec![], t).await.unwrap();
    assert!(store
        .lease_holder(&p, "2025-11-18", t)
        .await
        .unwrap()
        .is_none());
    let lease_c = acquired(
        store
            .claim(&request(&p, "2025-11-18", &c, 3600, t))
            .await
            .unwrap(),
    );
    assert!(lease_c.token > lease_a.token, "fencing tokens grow");

    // A released lease frees the scope too, and releasing twice is a no-op.
    assert!(store.release(&lease_c, t).await.unwrap());
    assert!(!store.release(&lease_c, t).await.unwrap());
    acquired(
        store
            .claim(&request(&p, "2025-11-18", &b, 3600, t))
            .await
            .unwrap(),
    );
}

/// A lease past its expiry is taken over; the late holder can neither finish nor release
/// over the new one, and its late finish writes nothing.
pub async fn expired_lease_is_taken_over_and_fenced(store: &dyn Store) {
    let p = unique("expiry");
    let t0 = now();
    let (slow, fresh) = (new_run_id(), new_run_id());
    let old = acquired(store.claim(&request(&p, "s", &slow, 10, t0)).await.unwrap());
    // Before expiry: held.
    let t1 = t0 + chrono::Duration::seconds(9);
    assert!(matches!(
        store
            .claim(&request(&p, "s", &fresh, 10, t1))
            .await
            .unwrap(),
        Claim::Held(_)
    ));
    // After expiry: taken over.
    let t2 = t0 + chrono::Duration::seconds(11);
    let new = acquired(
        store
            .claim(&request(&p, "s", &fresh, 10, t2))
            .await
            .unwrap(),
    );
    assert!(new.token > old.token);

    let key = unique("key");
    let late = finish_completed(
        store,
        &old,
        vec![key_record(&key, KeyKind::Content, &p, "s", &slow, t2)],
        t2,
    )
    .await;
    match late {
        Err(Error::LeaseLost {
            token,
            current_holder,
            ..
        }) => {
            assert_eq!(token, old.token);
            assert_eq!(current_holder.as_deref(), Some(fresh.as_str()));
        }
        other => panic!("late finish must be rejected with LeaseLost, got {other:?}"),
    }
    assert!(
        !store.release(&old, t2).await.unwrap(),
        "late release is a no-op"
    );
    let found = store
        .find_keys(&[KeyLookup {
            key: key.clone(),
            kind: KeyKind::Content,
            since: t0 - chrono::Duration::days(1),
        }])
        .await
        .unwrap();
    assert_eq!(found, vec![None], "a fenced finish writes no key");
    let runs = store
        .runs(&RunFilter {
            processor: Some(p.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(runs.is_empty(), "a fenced finish writes no run row");
    // The new holder still finishes normally.
    finish_completed(
        store,
        &new,
        vec![key_record(&key, KeyKind::Content, &p, "s", &fresh, t2)],
        t2,
    )
    .await
    .unwrap();
}

/// Many runs claiming one scope at once: exactly one wins.
pub async fn concurrent_claims_have_one_winner(store: Arc<dyn LeaseStore>) {
    let p = unique("race");
    let t = now();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let store = store.clone();
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            let run = new_run_id();
            store
                .claim(&ClaimRequest {
                    processor: &p,
                    scope: "2025-11-18",
                    run_id: &run,
                    ttl: Duration::from_secs(60),
                    now: t,
                })
                .await
        }));
    }
    let mut winners = 0;
    let mut holders = std::collections::HashSet::new();
    for task in tasks {
        match task.await.expect("task panicked").expect("claim failed") {
            Claim::Acquired(l) => {
                winners += 1;
                holders.insert(l.run_id);
            }
            Claim::Held(h) => {
                holders.insert(h.run_id);
            }
        }
    }
    assert_eq!(winners, 1, "exactly one concurrent claim wins");
    assert_eq!(holders.len(), 1, "every loser names the single winner");
}

/// A failed or skipped run is recorded in the ledger, writes no key, and frees the lease.
pub async fn keys_only_on_success(store: &dyn Store) {
    let p = unique("fail");
    let t = now();
    let run = new_run_id();
    let lease = acquired(store.claim(&request(&p, "s", &run, 60, t)).await.unwrap());
    let key = unique("k");
    store
        .finish(&Finish {
            run: run_record(&p, "s", &run, RunStatus::Failed, t),
            keys: vec![key_record(&key, KeyKind::Scope, &p, "s", &run, t)],
            lease: Some(lease),
        })
        .await
        .unwrap();
    let found = store
        .find_keys(&[KeyLookup {
            key: key.clone(),
            kind: KeyKind::Scope,
            since: t - chrono::Duration::hours(1),
        }])
        .await
        .unwrap();
    assert_eq!(found, vec![None], "a failed run writes no key");
    let runs = store
        .runs(&RunFilter {
            processor: Some(p.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, RunStatus::Failed);
    assert_eq!(runs[0].error.as_deref(), Some("boom"));
    // The retry can claim at once.
    acquired(
        store
            .claim(&request(&p, "s", &new_run_id(), 60, t))
            .await
            .unwrap(),
    );

    // A skipped run without a lease is recorded too.
    let skipped = new_run_id();
    store
        .finish(&Finish {
            run: run_record(&p, "s", &skipped, RunStatus::Skipped, t),
            keys: vec![],
            lease: None,
        })
        .await
        .unwrap();
    let runs = store
        .runs(&RunFilter {
            processor: Some(p.clone()),
            status: Some(RunStatus::Skipped),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].skip_reason, Some(SkipReason::TimeWindow));
}

/// Lookups honour `since`, kind, and return the latest row per key, in request order.
pub async fn key_windows_and_latest_row(store: &dyn Store) {
    let p = unique("window");
    let t0 = now() - chrono::Duration::hours(2);
    let t1 = t0 + chrono::Duration::minutes(90);
    let (scope_key, content_key) = (unique("scope"), unique("content"));
    for (at, run) in [(t0, new_run_id()), (t1, new_run_id())] {
        let lease = acquired(store.claim(&request(&p, "s", &run, 60, at)).await.unwrap());
        finish_completed(
            store,
            &lease,
            vec![
                key_record(&scope_key, KeyKind::Scope, &p, "s", &run, at),
                key_record(&content_key, KeyKind::Content, &p, "s", &run, at),
            ],
            at,
        )
        .await
        .unwrap();
    }
    let lookups = vec![
        KeyLookup {
            key: content_key.clone(),
            kind: KeyKind::Content,
            since: t0 - chrono::Duration::hours(24),
        },
        KeyLookup {
            key: scope_key.clone(),
            kind: KeyKind::Scope,
            since: t1 + chrono::Duration::seconds(1),
        },
        KeyLookup {
            key: scope_key.clone(),
            kind: KeyKind::Content,
            since: t0 - chrono::Duration::hours(24),
        },
        KeyLookup {
            key: scope_key.clone(),
            kind: KeyKind::Scope,
            since: t1,
        },
    ];
    let found = store.find_keys(&lookups).await.unwrap();
    assert_eq!(found.len(), 4);
    let latest = found[0].as_ref().expect("content key within 24h");
    assert_eq!(latest.processed_at, micros(t1), "the latest row wins");
    assert_eq!(latest.entity_count, Some(450));
    assert_eq!(latest.metadata, json!({"source": "test", "entities": 450}));
    assert_eq!(latest.scope_date, day());
    assert!(found[1].is_none(), "outside the window");
    assert!(found[2].is_none(), "kinds do not mix");
    assert_eq!(
        found[3].as_ref().map(|k| k.processed_at),
        Some(micros(t1)),
        "`since` is inclusive"
    );
    assert!(store.find_keys(&[]).await.unwrap().is_empty());
}

/// The ledger keeps every field and filters, orders and limits.
pub async fn ledger_queries(store: &dyn LedgerStore) {
    let p = unique("ledger");
    let t = now();
    let mut ids: Vec<String> = Vec::new();
    for (i, status) in [
        RunStatus::Completed,
        RunStatus::Skipped,
        RunStatus::Failed,
        RunStatus::Completed,
    ]
    .into_iter()
    .enumerate()
    {
        let id = new_run_id();
        let mut run = run_record(
            &p,
            "s",
            &id,
            status,
            t + chrono::Duration::seconds(i as i64),
        );
        if status == RunStatus::Completed && i == 3 {
            run.would_skip_reason = Some(SkipReason::DuplicateContentHash);
            run.previous_run_id = Some(ids[0].clone());
            run.mode = Mode::Shadow;
            run.trigger = Trigger::Backfill;
        }
        store
            .finish(&Finish {
                run,
                keys: vec![],
                lease: None,
            })
            .await
            .unwrap();
        ids.push(id);
    }
    let all = store
        .runs(&RunFilter {
            processor: Some(p.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>(),
        ids.iter().rev().cloned().collect::<Vec<_>>(),
        "newest first"
    );
    let newest = &all[0];
    let mut expected = run_record(
        &p,
        "s",
        &ids[3],
        RunStatus::Completed,
        t + chrono::Duration::seconds(3),
    );
    expected.would_skip_reason = Some(SkipReason::DuplicateContentHash);
    expected.previous_run_id = Some(ids[0].clone());
    expected.mode = Mode::Shadow;
    expected.trigger = Trigger::Backfill;
    assert_eq!(newest, &expected, "every field round-trips");

    let completed = store
        .runs(&RunFilter {
            processor: Some(p.clone()),
            status: Some(RunStatus::Completed),
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0].run_id, ids[3]);
    let since = store
        .runs(&RunFilter {
            processor: Some(p.clone()),
            since: Some(t + chrono::Duration::seconds(2) - chrono::Duration::milliseconds(1500)),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(since.len(), 2);
    let other_scope = store
        .runs(&RunFilter {
            processor: Some(p.clone()),
            scope: Some("other".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(other_scope.is_empty());
    // The scheduler's question at start (issue 21.3c): its newest fire that settled its
    // slot, asked of the store, not found among the newest rows. A newer skip that met
    // another run's lease does not count; the newer backfill is another trigger.
    let met_a_lease = new_run_id();
    let mut run = run_record(
        &p,
        "s",
        &met_a_lease,
        RunStatus::Skipped,
        t + chrono::Duration::seconds(4),
    );
    run.skip_reason = Some(SkipReason::InProgress);
    store
        .finish(&Finish {
            run,
            keys: vec![],
            lease: None,
        })
        .await
        .unwrap();
    let ask = |trigger, except| {
        let p = p.clone();
        async move {
            store
                .runs(&RunFilter {
                    processor: Some(p),
                    trigger: Some(trigger),
                    except_skip_reason: except,
                    limit: 1,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.run_id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(ask(Trigger::Scheduler, None).await, [met_a_lease]);
    assert_eq!(
        ask(Trigger::Scheduler, Some(SkipReason::InProgress)).await,
        [ids[2].clone()]
    );
    assert_eq!(
        ask(Trigger::Backfill, Some(SkipReason::InProgress)).await,
        [ids[3].clone()]
    );
    assert!(ask(Trigger::Manual, None).await.is_empty());
    let by_id = store
        .runs(&RunFilter {
            run_id: Some(ids[1].clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(by_id.len(), 1);
    assert_eq!(by_id[0].run_id, ids[1]);
    // A run id is recorded once.
    let dup = store
        .finish(&Finish {
            run: run_record(&p, "s", &ids[0], RunStatus::Completed, t),
            keys: vec![],
            lease: None,
        })
        .await;
    assert!(dup.is_err(), "recording a run id twice is an error");
}

/// Names and scopes with quotes, semicolons, SQL comments and unicode round-trip.
pub async fn strings_round_trip(store: &dyn Store) {
    let p = format!(
        "it's; \"x\" -- DROP TABLE processing_runs; — ünïcødé 🎉 {}",
        unique("q")
    );
    let scope = "2025-11-18'; DELETE FROM processing_keys; --/ñ";
    let t = now();
    let run = new_run_id();
    let lease = acquired(store.claim(&request(&p, scope, &run, 60, t)).await.unwrap());
    assert_eq!(lease.processor, p);
    let key = unique("key'\"");
    let mut k = key_record(&key, KeyKind::Content, &p, scope, &run, t);
    k.metadata = json!({"quote": "it's \"fine\"", "emoji": "🎉", "nested": {"b": [1, 2]}});
    finish_completed(store, &lease, vec![k.clone()], t)
        .await
        .unwrap();
    let found = store
        .find_keys(&[KeyLookup {
            key,
            kind: KeyKind::Content,
            since: t,
        }])
        .await
        .unwrap();
    assert_eq!(found, vec![Some(k)]);
    let runs = store
        .runs(&RunFilter {
            processor: Some(p.clone()),
            scope: Some(scope.to_string()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].processor, p);
    assert_eq!(runs[0].scope, scope);
}

/// Purge forgets a processor's keys on purpose; cleanup deletes what is old.
pub async fn purge_and_cleanup(store: &dyn Store) {
    let p = unique("purge");
    let t = now();
    let k1 = unique("k1");
    let k2 = unique("k2");
    for (scope, key) in [("a", &k1), ("b", &k2)] {
        let run = new_run_id();
        let lease = acquired(store.claim(&request(&p, scope, &run, 60, t)).await.unwrap());
        finish_completed(
            store,
            &lease,
            vec![key_record(key, KeyKind::Scope, &p, scope, &run, t)],
            t,
        )
        .await
        .unwrap();
    }
    let lookup = |key: &str| KeyLookup {
        key: key.to_string(),
        kind: KeyKind::Scope,
        since: t - chrono::Duration::days(1),
    };
    assert_eq!(store.purge(&p, Some("a")).await.unwrap(), 1);
    let found = store.find_keys(&[lookup(&k1), lookup(&k2)]).await.unwrap();
    assert!(found[0].is_none() && found[1].is_some());
    assert_eq!(store.purge(&p, None).await.unwrap(), 1);
    assert!(store.find_keys(&[lookup(&k2)]).await.unwrap()[0].is_none());

    // Cleanup: rows older than the cut-off go, newer ones stay.
    let q = unique("cleanup");
    let old = t - chrono::Duration::days(40);
    let (old_run, new_run) = (new_run_id(), new_run_id());
    let (old_key, new_key) = (unique("old"), unique("new"));
    for (run, key, at) in [(&old_run, &old_key, old), (&new_run, &new_key, t)] {
        store
            .finish(&Finish {
                run: run_record(&q, "s", run, RunStatus::Completed, at),
                keys: vec![key_record(key, KeyKind::Content, &q, "s", run, at)],
                lease: None,
            })
            .await
            .unwrap();
    }
    // Only this check's rows: the checks share a database and run side by side.
    let report = store
        .cleanup(&CleanupPolicy {
            processor: Some(q.clone()),
            ..CleanupPolicy::before(t - chrono::Duration::days(30))
        })
        .await
        .unwrap();
    assert!(
        report.keys_deleted >= 1 && report.runs_deleted >= 1,
        "{report:?}"
    );
    let found = store
        .find_keys(&[
            KeyLookup {
                key: old_key,
                kind: KeyKind::Content,
                since: old - chrono::Duration::days(1),
            },
            KeyLookup {
                key: new_key,
                kind: KeyKind::Content,
                since: old - chrono::Duration::days(1),
            },
        ])
        .await
        .unwrap();
    assert!(found[0].is_none(), "old key cleaned up");
    assert!(found[1].is_some(), "recent key kept");
    let runs = store
        .runs(&RunFilter {
            processor: Some(q),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].run_id, new_run);
}

/// Event keys: first sighting true, later (and in-batch repeats) false, per namespace.
pub async fn event_keys_batch(store: &dyn EventKeyStore) {
    let ns = unique("events");
    let t = now();
    let keys: Vec<String> = ["a", "b", "a", "c'; --", "ü"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let first = store.mark_event_keys(&ns, &keys, t).await.unwrap();
    assert_eq!(first, vec![true, true, false, true, true]);
    let again = store
        .mark_event_keys(&ns, &["b".to_string(), "d".to_string()], t)
        .await
        .unwrap();
    assert_eq!(again, vec![false, true]);
    let other_ns = unique("events");
    let other = store
        .mark_event_keys(&other_ns, &["a".to_string()], t)
        .await
        .unwrap();
    assert_eq!(other, vec![true], "namespaces are independent");
    assert!(store.mark_event_keys(&ns, &[], t).await.unwrap().is_empty());
}

/// Cursors (seed 003): absent until the first advance; advance with a batch's marks (both
/// recorded), never backwards; ties on the timestamp ordered by the id; per namespace and
/// name. A store without cursors (BigQuery) says `Unsupported` for each method.
pub async fn event_cursor(store: &dyn EventKeyStore) {
    let ns = unique("cursor");
    let t = now();
    let at = |ts: serde_json::Value, id: serde_json::Value| Cursor::at(&ts, &id).unwrap();
    if store.kind() == "bigquery" {
        let unsupported = |e: Error| matches!(e, Error::Unsupported { .. });
        assert!(unsupported(store.cursor(&ns, "c").await.unwrap_err()));
        let to = at(json!(1), json!("a"));
        assert!(unsupported(
            store.advance_cursor(&ns, "c", &to).await.unwrap_err()
        ));
        return;
    }
    assert_eq!(store.cursor(&ns, "c").await.unwrap(), None);
    let first = at(json!(10), json!("b"));
    let verdicts = store
        .check_and_mark_advancing(&ns, &[EventMark::key("10:b")], t, "c", &first)
        .await
        .unwrap();
    assert_eq!(verdicts, vec![EventVerdict::New]);
    assert_eq!(store.cursor(&ns, "c").await.unwrap(), Some(first.clone()));
    assert_eq!(
        store
            .is_duplicate(&ns, &["10:b".to_string()], t)
            .await
            .unwrap(),
        vec![true],
        "the marks are recorded with the cursor"
    );
    // Never backwards: same timestamp, smaller id; an earlier timestamp.
    for behind in [at(json!(10), json!("a")), at(json!(9), json!("z"))] {
        store.advance_cursor(&ns, "c", &behind).await.unwrap();
        assert_eq!(store.cursor(&ns, "c").await.unwrap(), Some(first.clone()));
    }
    let tie = at(json!(10), json!("c"));
    store
        .check_and_mark_advancing(&ns, &[], t, "c", &tie)
        .await
        .unwrap();
    assert_eq!(store.cursor(&ns, "c").await.unwrap(), Some(tie.clone()));
    let text = at(json!("2024-05-01T10:00:00Z"), json!(42));
    store.advance_cursor(&ns, "other", &text).await.unwrap();
    assert_eq!(store.cursor(&ns, "other").await.unwrap(), Some(text));
    assert_eq!(store.cursor(&ns, "c").await.unwrap(), Some(tie));
    assert_eq!(store.cursor(&unique("cursor"), "c").await.unwrap(), None);
}

fn replayed(v: &EventVerdict) -> Option<Option<serde_json::Value>> {
    match v {
        EventVerdict::Replay { decision, .. } => Some(decision.clone()),
        _ => None,
    }
}

fn conflicting(v: &EventVerdict) -> Option<String> {
    match v {
        EventVerdict::Conflict {
            stored_fingerprint, ..
        } => Some(stored_fingerprint.clone()),
        _ => None,
    }
}

/// Dedup: new, then replay with the stored decision, conflict on another payload (which
/// changes nothing: the original fingerprint and decision stay); no fingerprint on either
/// side never conflicts; `record_decision` sets what later replays return.
pub async fn event_dedup_replay_and_conflict(store: &dyn EventKeyStore) {
    let ns = unique("dedup");
    let t = now();
    let decision = serde_json::json!({"status": "accepted", "amount": "100.50", "n": [1, 2]});
    let first = store
        .check_and_mark(
            &ns,
            &[
                EventMark::key("k1")
                    .fingerprint("f1")
                    .decision(decision.clone()),
                EventMark::key("k2").fingerprint("f2"),
                EventMark::key("k3"),
            ],
            t,
        )
        .await
        .unwrap();
    assert!(first.iter().all(EventVerdict::is_new), "{first:?}");
    let later = t + chrono::Duration::seconds(5);
    let second = store
        .check_and_mark(
            &ns,
            &[
                EventMark::key("k1").fingerprint("f1"),
                EventMark::key("k2")
                    .fingerprint("other")
                    .decision(serde_json::json!("no")),
                EventMark::key("k3").fingerprint("any"),
                EventMark::key("k1"),
            ],
            later,
        )
        .await
        .unwrap();
    assert_eq!(
        replayed(&second[0]),
        Some(Some(decision.clone())),
        "{second:?}"
    );
    match &second[0] {
        EventVerdict::Replay { first_seen, .. } => assert_eq!(*first_seen, micros(t)),
        other => panic!("{other:?}"),
    }
    assert_eq!(conflicting(&second[1]).as_deref(), Some("f2"), "{second:?}");
    assert_eq!(
        replayed(&second[2]),
        Some(None),
        "no stored fingerprint: replay"
    );
    assert_eq!(
        replayed(&second[3]),
        Some(Some(decision)),
        "no fingerprint: replay"
    );
    // The conflict changed nothing: f2 still stands, without a decision.
    let third = store
        .check_and_mark(&ns, &[EventMark::key("k2").fingerprint("f2")], later)
        .await
        .unwrap();
    assert_eq!(replayed(&third[0]), Some(None), "{third:?}");
    let recorded = store
        .record_decision(&ns, "k2", &serde_json::json!({"ok": true}))
        .await
        .unwrap();
    assert!(recorded);
    assert!(!store
        .record_decision(&ns, "absent", &serde_json::json!(1))
        .await
        .unwrap());
    let fourth = store
        .check_and_mark(&ns, &[EventMark::key("k2").fingerprint("f2")], later)
        .await
        .unwrap();
    assert_eq!(
        replayed(&fourth[0]),
        Some(Some(serde_json::json!({"ok": true})))
    );
    let other_ns = unique("dedup");
    let other = store
        .check_and_mark(&other_ns, &[EventMark::key("k2").fingerprint("x")], later)
        .await
        .unwrap();
    assert_eq!(other, vec![EventVerdict::New], "namespaces are independent");
    assert!(store.check_and_mark(&ns, &[], t).await.unwrap().is_empty());
}

/// TTL: a key is a duplicate until `expires_at`, then new again (re-marked with the new
/// fingerprint and expiry); a key without ttl never expires. `now` moves instead of sleeping.
pub async fn event_dedup_ttl(store: &dyn EventKeyStore) {
    let ns = unique("ttl");
    let t = now();
    let hour = Duration::from_secs(3600);
    let marks = [
        EventMark::key("short").fingerprint("a").ttl(hour),
        EventMark::key("forever").fingerprint("a"),
    ];
    assert!(store
        .check_and_mark(&ns, &marks, t)
        .await
        .unwrap()
        .iter()
        .all(EventVerdict::is_new));
    let keys = vec![
        "short".to_string(),
        "forever".to_string(),
        "never".to_string(),
    ];
    let just_before = t + chrono::Duration::seconds(3599);
    let at_expiry = t + chrono::Duration::seconds(3600);
    assert_eq!(
        store.is_duplicate(&ns, &keys, just_before).await.unwrap(),
        vec![true, true, false]
    );
    assert_eq!(
        store.is_duplicate(&ns, &keys, at_expiry).await.unwrap(),
        vec![false, true, false],
        "expired at expires_at"
    );
    let before = store
        .check_and_mark(
            &ns,
            &[EventMark::key("short").fingerprint("b")],
            just_before,
        )
        .await
        .unwrap();
    assert!(conflicting(&before[0]).is_some(), "{before:?}");
    let after = store
        .check_and_mark(
            &ns,
            &[
                EventMark::key("short").fingerprint("b").ttl(hour),
                EventMark::key("forever").fingerprint("b"),
            ],
            at_expiry,
        )
        .await
        .unwrap();
    assert_eq!(after[0], EventVerdict::New, "expired: new again");
    assert!(conflicting(&after[1]).is_some(), "{after:?}");
    let later = at_expiry + chrono::Duration::seconds(60);
    let again = store
        .check_and_mark(&ns, &[EventMark::key("short").fingerprint("b")], later)
        .await
        .unwrap();
    match &again[0] {
        EventVerdict::Replay { first_seen, .. } => assert_eq!(*first_seen, micros(at_expiry)),
        other => panic!("re-marked with the new fingerprint and time: {other:?}"),
    }
    // mark_event_keys sees expiry too.
    let far = t + chrono::Duration::days(2);
    assert_eq!(
        store
            .mark_event_keys(&ns, &["short".to_string(), "forever".to_string()], far)
            .await
            .unwrap(),
        vec![true, false]
    );
    assert!(store.is_duplicate(&ns, &[], t).await.unwrap().is_empty());
}

/// When a key was first seen, for a replay or conflict (`None` for `new`).
fn seen_at(v: &EventVerdict) -> Option<DateTime<Utc>> {
    match v {
        EventVerdict::Replay { first_seen, .. } | EventVerdict::Conflict { first_seen, .. } => {
            Some(*first_seen)
        }
        EventVerdict::New => None,
    }
}

/// A batch after all-fresh batches (SQLite then tries a batch as all fresh and Postgres
/// first tries a plain insert, both falling back when some key is stored or expired):
/// fresh, stored, expired and repeated keys in one batch get their verdicts, and the
/// attempt that could not mark the batch whole left nothing behind.
pub async fn event_dedup_after_fresh_batches(store: &dyn EventKeyStore) {
    let ns = unique("fresh");
    let t = now();
    let hour = Duration::from_secs(3600);
    let first = store
        .check_and_mark(
            &ns,
            &[
                EventMark::key("a").fingerprint("a"),
                EventMark::key("short").fingerprint("s").ttl(hour),
            ],
            t,
        )
        .await
        .unwrap();
    assert!(first.iter().all(EventVerdict::is_new), "{first:?}");
    // All fresh, with repeats inside the batch.
    let second = store
        .check_and_mark(
            &ns,
            &[
                EventMark::key("b").fingerprint("b"),
                EventMark::key("c").fingerprint("c"),
                EventMark::key("b").fingerprint("b"),
                EventMark::key("c").fingerprint("other"),
            ],
            t,
        )
        .await
        .unwrap();
    let names: Vec<&str> = second.iter().map(EventVerdict::name).collect();
    assert_eq!(names, ["new", "new", "replay", "conflict"], "{second:?}");
    // Two hours on: d fresh, a and b stored (b with another payload), short expired.
    let later = t + chrono::Duration::hours(2);
    let third = store
        .check_and_mark(
            &ns,
            &[
                EventMark::key("d").fingerprint("d"),
                EventMark::key("a").fingerprint("a"),
                EventMark::key("b").fingerprint("changed"),
                EventMark::key("short").fingerprint("s2").ttl(hour),
                EventMark::key("d").fingerprint("d"),
            ],
            later,
        )
        .await
        .unwrap();
    let names: Vec<&str> = third.iter().map(EventVerdict::name).collect();
    assert_eq!(
        names,
        ["new", "replay", "conflict", "new", "replay"],
        "{third:?}"
    );
    assert_eq!(seen_at(&third[1]), Some(t), "{third:?}");
    assert_eq!(conflicting(&third[2]).as_deref(), Some("b"), "{third:?}");
    assert_eq!(seen_at(&third[4]), Some(later), "{third:?}");
    // The conflict changed nothing; d and short were marked once, at `later`, with the
    // third batch's payloads; nothing else was marked.
    let check = later + chrono::Duration::seconds(1);
    let fourth = store
        .check_and_mark(
            &ns,
            &[
                EventMark::key("b").fingerprint("b"),
                EventMark::key("d").fingerprint("d"),
                EventMark::key("short").fingerprint("s2"),
                EventMark::key("e").fingerprint("e"),
            ],
            check,
        )
        .await
        .unwrap();
    let names: Vec<&str> = fourth.iter().map(EventVerdict::name).collect();
    assert_eq!(names, ["replay", "replay", "replay", "new"], "{fourth:?}");
    let seen: Vec<_> = fourth.iter().map(seen_at).collect();
    assert_eq!(
        seen,
        [Some(t), Some(later), Some(later), None],
        "{fourth:?}"
    );
}

/// Pending marks (issue 21.1), on a store that [`confirms_pending`]: a mark made with a
/// marker decision and a short expiry answers later calls with that marker (so another
/// gate knows to wait); a confirmation by another owner changes nothing; the owner's
/// confirmation clears the marker and sets the real expiry (here: never); a pending mark
/// nobody confirmed expires and the next call takes it over as new.
///
/// [`confirms_pending`]: super::EventKeyStore::confirms_pending
pub async fn event_pending(store: &dyn EventKeyStore) {
    if !store.confirms_pending() {
        return;
    }
    let ns = unique("pending");
    let t = now();
    let pending = Duration::from_secs(30);
    let (mine, theirs) = (
        json!({"idem_pending": "gate-a"}),
        json!({"idem_pending": "gate-b"}),
    );
    let mark = |k: &str, owner: &serde_json::Value| {
        EventMark::key(k)
            .fingerprint("x")
            .ttl(pending)
            .decision(owner.clone())
    };
    let v = store
        .check_and_mark(&ns, &[mark("a", &mine), mark("b", &mine)], t)
        .await
        .unwrap();
    assert_eq!(v, [EventVerdict::New, EventVerdict::New]);
    // Another gate sees the marker: the key is pending, not confirmed.
    let later = t + chrono::Duration::seconds(1);
    let v = store
        .check_and_mark(&ns, &[mark("a", &theirs)], later)
        .await
        .unwrap();
    assert!(
        matches!(&v[0], EventVerdict::Replay { decision: Some(d), .. } if *d == mine),
        "{v:?}"
    );
    // A confirmation by the wrong owner does nothing.
    let keys = vec![("a".to_string(), None), ("b".to_string(), None)];
    assert_eq!(
        store
            .confirm_event_keys(&ns, &keys, &theirs.to_string())
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .confirm_event_keys(&ns, &keys[..1], &mine.to_string())
            .await
            .unwrap(),
        1
    );
    // Confirmed: no marker, and no expiry (long after the pending timeout it is a replay).
    let much_later = t + chrono::Duration::days(3);
    let v = store
        .check_and_mark(&ns, &[mark("a", &theirs), mark("b", &theirs)], much_later)
        .await
        .unwrap();
    assert!(
        matches!(&v[0], EventVerdict::Replay { decision: None, .. }),
        "a confirmed mark lasts: {v:?}"
    );
    // `b` was never confirmed: its pending mark expired and is taken over.
    assert_eq!(
        v[1],
        EventVerdict::New,
        "an unconfirmed pending mark expires"
    );
    // Confirming `b` as its first owner now does nothing: the mark is gate-b's.
    assert_eq!(
        store
            .confirm_event_keys(&ns, &keys[1..], &mine.to_string())
            .await
            .unwrap(),
        0
    );
}

/// Taking back marks ([`EventKeyStore::unmark_event_keys`]): only the marks made at the
/// given first-seen instant go; a mark made at another instant (another caller's, after
/// the first one expired) and other keys stay. A store without it must not run calls side
/// by side.
pub async fn event_unmark(store: &dyn EventKeyStore) {
    let ns = unique("unmark");
    let t = now();
    let hour = Duration::from_secs(3600);
    let keys = |ks: &[&str]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
    let marks = [
        EventMark::key("a").fingerprint("x").ttl(hour),
        EventMark::key("b").fingerprint("x").ttl(hour),
        EventMark::key("c").fingerprint("x"),
    ];
    store.check_and_mark(&ns, &marks, t).await.unwrap();
    // `a` expires and another caller marks it anew.
    let later = t + chrono::Duration::seconds(3600);
    let again = store
        .check_and_mark(
            &ns,
            &[EventMark::key("a").fingerprint("y").ttl(hour)],
            later,
        )
        .await
        .unwrap();
    assert_eq!(again[0], EventVerdict::New);
    let unmarked = match store.unmark_event_keys(&ns, &keys(&["a", "b"]), t).await {
        Err(crate::error::Error::Unsupported { .. }) => {
            assert_eq!(store.batch_concurrency(), 1, "runs calls side by side");
            return;
        }
        other => other.unwrap(),
    };
    assert_eq!(unmarked, 1, "b only: a holds a later mark");
    let at = later + chrono::Duration::seconds(1);
    assert_eq!(
        store
            .is_duplicate(&ns, &keys(&["a", "b", "c"]), at)
            .await
            .unwrap(),
        vec![true, false, true]
    );
    // `b` is new again. Of a, b, c, only c still holds its mark from `t`.
    let b = store
        .check_and_mark(&ns, &[EventMark::key("b").fingerprint("z")], at)
        .await
        .unwrap();
    assert_eq!(b[0], EventVerdict::New);
    assert_eq!(
        store
            .unmark_event_keys(&ns, &keys(&["a", "b", "c"]), t)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .is_duplicate(&ns, &keys(&["a", "b", "c"]), at)
            .await
            .unwrap(),
        vec![true, true, false]
    );
    assert_eq!(
        store
            .unmark_event_keys(&ns, &keys(&["a"]), later)
            .await
            .unwrap(),
        1
    );
    assert_eq!(store.unmark_event_keys(&ns, &[], t).await.unwrap(), 0);
}

/// TTL on the real clock: a mark with a short ttl (1.1 s) is a duplicate, then, after
/// sleeping past it, new again. Every store passes this one; Redis expires marks by its own
/// clock (`PX`), which [`event_dedup_ttl`]'s moving `now` alone would not show.
pub async fn event_dedup_real_ttl(store: &dyn EventKeyStore) {
    let ns = unique("realttl");
    let ttl = Duration::from_millis(1100);
    let mark = [EventMark::key("k").fingerprint("a").ttl(ttl)];
    let first = store.check_and_mark(&ns, &mark, now()).await.unwrap();
    assert_eq!(first, vec![EventVerdict::New]);
    let again = store.check_and_mark(&ns, &mark, now()).await.unwrap();
    assert_eq!(again[0].name(), "replay", "{again:?}");
    assert_eq!(
        store
            .is_duplicate(&ns, &["k".to_string()], now())
            .await
            .unwrap(),
        vec![true]
    );
    tokio::time::sleep(ttl + Duration::from_millis(250)).await;
    assert_eq!(
        store
            .is_duplicate(&ns, &["k".to_string()], now())
            .await
            .unwrap(),
        vec![false],
        "expired after its ttl"
    );
    let changed = [EventMark::key("k").fingerprint("b").ttl(ttl)];
    let later = store.check_and_mark(&ns, &changed, now()).await.unwrap();
    assert_eq!(later, vec![EventVerdict::New], "expired: new again");
}

/// In-batch duplicates: the first occurrence decides, later ones replay or conflict
/// against it — also when the first occurrence re-marks an expired key.
pub async fn event_dedup_in_batch(store: &dyn EventKeyStore) {
    let ns = unique("inbatch");
    let t = now();
    let d = serde_json::json!({"first": true});
    let v = store
        .check_and_mark(
            &ns,
            &[
                EventMark::key("x").fingerprint("1").decision(d.clone()),
                EventMark::key("y").fingerprint("1"),
                EventMark::key("x").fingerprint("1"),
                EventMark::key("x").fingerprint("2"),
                EventMark::key("y"),
            ],
            t,
        )
        .await
        .unwrap();
    assert_eq!(v[0], EventVerdict::New);
    assert_eq!(v[1], EventVerdict::New);
    assert_eq!(replayed(&v[2]), Some(Some(d)), "{v:?}");
    assert_eq!(conflicting(&v[3]).as_deref(), Some("1"), "{v:?}");
    assert_eq!(replayed(&v[4]), Some(None), "{v:?}");
    let dup = store
        .is_duplicate(&ns, &["x".to_string(), "y".to_string()], t)
        .await
        .unwrap();
    assert_eq!(dup, vec![true, true]);
}

/// One batch of 1000 keys (half already marked, some repeated): one verdict each, right.
pub async fn event_dedup_large_batch(store: &dyn EventKeyStore) {
    let ns = unique("large");
    let t = now();
    let old: Vec<EventMark> = (0..500)
        .map(|i| EventMark::key(format!("key-{i:04}")).fingerprint(format!("f{i}")))
        .collect();
    let v = store.check_and_mark(&ns, &old, t).await.unwrap();
    assert!(v.iter().all(EventVerdict::is_new));
    let marks: Vec<EventMark> = (0..1000)
        .map(|i| {
            let i = if i % 10 == 9 { i - 1 } else { i };
            let fingerprint = if i % 4 == 0 {
                "changed".to_string()
            } else {
                format!("f{i}")
            };
            EventMark::key(format!("key-{i:04}")).fingerprint(fingerprint)
        })
        .collect();
    let v = store.check_and_mark(&ns, &marks, t).await.unwrap();
    assert_eq!(v.len(), 1000);
    for (j, verdict) in v.iter().enumerate() {
        let i = if j % 10 == 9 { j - 1 } else { j };
        let expected = if j % 10 == 9 {
            // A repeat of i's mark (same fingerprint) inside the batch.
            if i < 500 && i % 4 == 0 {
                "conflict"
            } else {
                "replay"
            }
        } else if i >= 500 {
            "new"
        } else if i % 4 == 0 {
            "conflict"
        } else {
            "replay"
        };
        assert_eq!(verdict.name(), expected, "position {j}: {verdict:?}");
    }
    let keys: Vec<String> = (0..1000).map(|i| format!("key-{i:04}")).collect();
    let dup = store.is_duplicate(&ns, &keys, t).await.unwrap();
    for (i, d) in dup.iter().enumerate() {
        assert_eq!(*d, i < 500 || i % 10 != 9, "key {i}");
    }
}

/// Renewal extends a held lease; a taken-over lease cannot be renewed.
pub async fn renew_extends_lease(store: &dyn LeaseStore) {
    let p = unique("renew");
    let t0 = now();
    let run = new_run_id();
    let lease = acquired(store.claim(&request(&p, "s", &run, 10, t0)).await.unwrap());
    let t1 = t0 + chrono::Duration::seconds(8);
    let renewed = store
        .renew(&lease, Duration::from_secs(10), t1)
        .await
        .unwrap();
    assert_eq!(
        renewed.expires_at,
        micros(t1 + chrono::Duration::seconds(10))
    );
    assert_eq!(renewed.token, lease.token);
    // Past the original expiry but inside the renewed one: still held.
    let t2 = t0 + chrono::Duration::seconds(12);
    assert!(matches!(
        store
            .claim(&request(&p, "s", &new_run_id(), 10, t2))
            .await
            .unwrap(),
        Claim::Held(_)
    ));
    let t3 = t1 + chrono::Duration::seconds(11);
    let other = new_run_id();
    acquired(
        store
            .claim(&request(&p, "s", &other, 10, t3))
            .await
            .unwrap(),
    );
    match store.renew(&renewed, Duration::from_secs(10), t3).await {
        Err(Error::LeaseLost { current_holder, .. }) => {
            assert_eq!(current_holder.as_deref(), Some(other.as_str()))
        }
        other => panic!("renewing a lost lease must fail with LeaseLost, got {other:?}"),
    }
}

/// A finish whose run id is already in the ledger is refused with
/// [`Error::DuplicateRunId`] (not a store failure), writes no key and keeps the lease; the
/// same finish under another run id then succeeds with the same lease.
pub async fn taken_run_id_is_refused_and_changes_nothing(store: &dyn Store) {
    let (first, second) = (unique("first"), unique("second"));
    let run_id = unique("orchestrator-run");
    let at = now();
    store
        .finish(&Finish {
            run: run_record(&first, "s", &run_id, RunStatus::Completed, at),
            keys: vec![key_record(
                &unique("k"),
                KeyKind::Scope,
                &first,
                "s",
                &run_id,
                at,
            )],
            lease: None,
        })
        .await
        .expect("first run recorded");
    let lease = acquired(
        store
            .claim(&request(&second, "s", &run_id, 600, at))
            .await
            .unwrap(),
    );
    let key = unique("second-key");
    let mut finish = Finish {
        run: run_record(&second, "s", &run_id, RunStatus::Completed, at),
        keys: vec![key_record(&key, KeyKind::Scope, &second, "s", &run_id, at)],
        lease: Some(lease.clone()),
    };
    match store.finish(&finish).await {
        Err(e @ Error::DuplicateRunId { .. }) => assert!(!e.is_store_failure(), "{e}"),
        other => panic!("a taken run id must be refused with DuplicateRunId, got {other:?}"),
    }
    let lookup = KeyLookup {
        key: key.clone(),
        kind: KeyKind::Scope,
        since: at - chrono::Duration::hours(1),
    };
    assert_eq!(
        store
            .find_keys(std::slice::from_ref(&lookup))
            .await
            .unwrap(),
        vec![None],
        "no key of the refused finish"
    );
    let holder = store.lease_holder(&second, "s", now()).await.unwrap();
    assert_eq!(
        holder.map(|h| (h.run_id, h.token)),
        Some((run_id.clone(), lease.token)),
        "the lease is still held"
    );
    let derived = format!("{run_id}.1");
    finish.run.run_id = derived.clone();
    for k in &mut finish.keys {
        k.run_id = derived.clone();
    }
    store
        .finish(&finish)
        .await
        .expect("recorded under another id");
    let found = store.find_keys(&[lookup]).await.unwrap();
    assert_eq!(
        found[0].as_ref().map(|k| k.run_id.as_str()),
        Some(derived.as_str())
    );
    assert!(store
        .lease_holder(&second, "s", now())
        .await
        .unwrap()
        .is_none());
    let runs = store
        .runs(&RunFilter {
            processor: Some(second.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].run_id, derived);
}

/// Cleanup deletes exactly the rows past retention, in batches: keys processed and leases
/// expired before the keys' cut-off, ledger rows started before the runs' cut-off unless a
/// kept key points at them, event keys that expired before the keys' cut-off; `dry_run`
/// reports the same counts and deletes nothing; a second cleanup finds nothing.
pub async fn cleanup_deletes_exactly_what_is_past_retention(store: &dyn Store) {
    let p = unique("retain");
    let t = now();
    let ago = |days: i64| t - chrono::Duration::days(days);
    let record = |run: &str, status: RunStatus, keys: Vec<&str>, at: DateTime<Utc>| {
        let run = run.to_string();
        let p = p.clone();
        let keys: Vec<String> = keys.into_iter().map(str::to_string).collect();
        async move {
            store
                .finish(&Finish {
                    run: run_record(&p, "s", &run, status, at),
                    keys: keys
                        .iter()
                        .map(|k| key_record(k, KeyKind::Content, &p, "s", &run, at))
                        .collect(),
                    lease: None,
                })
                .await
                .unwrap();
        }
    };
    // Keys are kept 30 days, the ledger 10 (shorter, so a kept key can point at an old run).
    let (run_a, run_b, run_c, run_d, run_e) = (
        new_run_id(),
        new_run_id(),
        new_run_id(),
        new_run_id(),
        new_run_id(),
    );
    let (key_a, key_b, key_d) = (unique("a"), unique("b"), unique("d"));
    let key_e: Vec<String> = (0..3).map(|i| unique(&format!("e{i}"))).collect();
    // Old run, old key: both go.
    record(&run_a, RunStatus::Completed, vec![&key_a], ago(40)).await;
    // Run past the ledger's retention whose key is kept: both stay.
    record(&run_b, RunStatus::Completed, vec![&key_b], ago(20)).await;
    // Failed run past the ledger's retention, no key: it goes.
    record(&run_c, RunStatus::Failed, vec![], ago(20)).await;
    // Recent: stays.
    record(&run_d, RunStatus::Completed, vec![&key_d], ago(5)).await;
    // Old, three keys (more than one batch of 2).
    record(
        &run_e,
        RunStatus::Completed,
        key_e.iter().map(String::as_str).collect(),
        ago(50),
    )
    .await;
    // A lease that expired 40 days ago goes; a held one stays.
    let old_lease = acquired(
        store
            .claim(&request(&p, "old", &new_run_id(), 60, ago(40)))
            .await
            .unwrap(),
    );
    let live_run = new_run_id();
    acquired(
        store
            .claim(&request(&p, "live", &live_run, 3600, t))
            .await
            .unwrap(),
    );
    let policy = CleanupPolicy {
        keys_before: ago(30),
        runs_before: ago(10),
        leases_before: ago(30),
        processor: Some(p.clone()),
        batch: 2,
        dry_run: true,
        progress: None,
    };
    let expected = CleanupReport {
        keys_deleted: 4,
        runs_deleted: 3,
        leases_deleted: 1,
        event_keys_deleted: 0,
    };
    let lookups = |keys: &[&String]| {
        keys.iter()
            .map(|k| KeyLookup {
                key: k.to_string(),
                kind: KeyKind::Content,
                since: ago(60),
            })
            .collect::<Vec<_>>()
    };
    let all_keys = [&key_a, &key_b, &key_d, &key_e[0], &key_e[1], &key_e[2]];
    let ledger = || {
        let p = p.clone();
        async move {
            let mut ids: Vec<String> = store
                .runs(&RunFilter {
                    processor: Some(p),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.run_id)
                .collect();
            ids.sort();
            ids
        }
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };

    // A dry run counts and deletes nothing.
    assert_eq!(store.cleanup(&policy).await.unwrap(), expected, "dry run");
    let found = store.find_keys(&lookups(&all_keys)).await.unwrap();
    assert!(
        found.iter().all(Option::is_some),
        "a dry run deletes nothing: {found:?}"
    );
    assert_eq!(ledger().await.len(), 5);

    // The same counts for real, told batch by batch to the progress callback: counts that
    // never go down, each table's last word its count in the report.
    let heard = Arc::new(std::sync::Mutex::new(Vec::<CleanupProgress>::new()));
    let real = CleanupPolicy {
        dry_run: false,
        progress: Some(CleanupProgressFn::new({
            let heard = heard.clone();
            move |p| heard.lock().unwrap().push(p)
        })),
        ..policy.clone()
    };
    assert_eq!(store.cleanup(&real).await.unwrap(), expected);
    let heard = std::mem::take(&mut *heard.lock().unwrap());
    assert!(
        heard.windows(2).all(|w| w[1].total >= w[0].total),
        "{heard:?}"
    );
    let finals: Vec<(&str, u64)> = heard
        .iter()
        .filter(|p| p.table_done)
        .map(|p| (p.table, p.rows))
        .collect();
    assert_eq!(
        finals,
        [
            ("processing_keys", expected.keys_deleted),
            ("processing_runs", expected.runs_deleted),
            ("processing_leases", expected.leases_deleted),
            ("event_keys", expected.event_keys_deleted),
        ],
        "{heard:?}"
    );
    assert_eq!(heard.last().map(|p| p.total), Some(expected.total()));
    if matches!(store.kind(), "sqlite" | "postgres") {
        // Batches of 2: told after each, the last one short (here empty).
        let keys: Vec<u64> = heard
            .iter()
            .filter(|p| p.table == "processing_keys")
            .map(|p| p.rows)
            .collect();
        assert_eq!(keys, [2, 4, 4], "{heard:?}");
    }
    let real = CleanupPolicy {
        progress: None,
        ..real
    };
    let found = store.find_keys(&lookups(&all_keys)).await.unwrap();
    let present: Vec<bool> = found.iter().map(Option::is_some).collect();
    assert_eq!(present, [false, true, true, false, false, false]);
    assert_eq!(
        ledger().await,
        sorted(vec![run_b.clone(), run_d.clone()]),
        "the old run a kept key points at stays"
    );
    let holder = store.lease_holder(&p, "live", t).await.unwrap();
    assert_eq!(holder.map(|h| h.run_id), Some(live_run));
    // The expired lease's row is gone: claiming the scope again starts the fencing token
    // afresh (had the row stayed, the token would have grown).
    let again = acquired(
        store
            .claim(&request(&p, "old", &new_run_id(), 60, t))
            .await
            .unwrap(),
    );
    assert_eq!(
        again.token, old_lease.token,
        "the expired lease's row is deleted"
    );
    // Nothing is left to delete.
    assert_eq!(
        store.cleanup(&real).await.unwrap(),
        CleanupReport::default()
    );

    // Event keys belong to no processor: only a cleanup of every processor deletes them,
    // and only those whose expiry passed before the cut-off. A key that never expires (the
    // gate's default) is never deleted, however old: a payment seen 31 days ago must stay
    // a replay (issue 21.2). (Instants in 1970, before any other check's rows.)
    let ns = unique("ns");
    let epoch = |days: i64| DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::days(days);
    let day = std::time::Duration::from_secs(86_400);
    let (expired, forever, later) = (unique("expired"), unique("forever"), unique("later"));
    store
        .check_and_mark(
            &ns,
            &[
                EventMark::key(&expired).ttl(day),
                EventMark::key(&forever),
                EventMark::key(&later).ttl(day * 5),
            ],
            epoch(0),
        )
        .await
        .unwrap();
    let every = CleanupPolicy {
        batch: 1,
        dry_run: true,
        ..CleanupPolicy::before(epoch(2))
    };
    let counted = store.cleanup(&every).await.unwrap();
    assert_eq!(counted.event_keys_deleted, 1, "{counted:?}");
    let done = store
        .cleanup(&CleanupPolicy {
            dry_run: false,
            ..every
        })
        .await
        .unwrap();
    assert_eq!(done, counted);
    // Asked at a time when all three were live: the expired one's row is gone.
    let seen = store
        .is_duplicate(
            &ns,
            &[expired, forever, later],
            epoch(0) + chrono::Duration::hours(1),
        )
        .await
        .unwrap();
    assert_eq!(
        seen,
        [false, true, true],
        "only the key that expired before the cut-off is deleted; one without expiry and \
         one still live stay"
    );
}

/// What the backend's [`Capabilities`](super::Capabilities) promise, across instances
/// opened on the same `url`: with `cross_process`, a lease claimed through one instance is
/// held for the other; with `durable`, a run recorded through an instance that is then
/// dropped is in the ledger of one opened afterwards. A backend promising neither (the
/// memory store) is not held to either.
pub async fn capabilities_hold_across_instances(url: &str) {
    let first = super::open(url).await.expect("open the store");
    let second = super::open(url).await.expect("open the store again");
    let capabilities = first.capabilities();
    assert_eq!(capabilities, second.capabilities());
    let p = unique("instances");
    let t = now();
    let run = new_run_id();
    let lease = acquired(first.claim(&request(&p, "s", &run, 60, t)).await.unwrap());
    if capabilities.cross_process {
        match second
            .claim(&request(&p, "s", &new_run_id(), 60, t))
            .await
            .unwrap()
        {
            Claim::Held(h) => assert_eq!(h.run_id, run, "the other instance sees the holder"),
            Claim::Acquired(_) => panic!("two instances on one url both acquired a lease"),
        }
    }
    finish_completed(&*first, &lease, vec![], t).await.unwrap();
    drop(first);
    drop(second);
    if capabilities.durable {
        let third = super::open(url).await.expect("open the store once more");
        let runs = third
            .runs(&RunFilter {
                processor: Some(p.clone()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(
            runs.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(),
            [run.as_str()],
            "a recorded run outlives the instance that recorded it"
        );
    }
}
