//! The ledger: keys written only on success, key windows, the run queries, strings that
//! round-trip, a taken run id refused.

use serde_json::json;

use super::{acquired, day, finish_completed, key_record, now, request, run_record, unique};
use crate::error::Error;
use crate::model::{micros, new_run_id, KeyKind, Mode, RunStatus, SkipReason, Trigger};
use crate::store::{Finish, KeyLookup, LedgerStore, RunFilter, Store};

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
