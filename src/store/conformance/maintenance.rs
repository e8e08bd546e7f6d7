//! Maintenance: purge forgets on purpose, cleanup deletes exactly what is past retention.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::{acquired, finish_completed, key_record, now, request, run_record, unique};
use crate::model::KeyRecord;
use crate::model::{new_run_id, KeyKind, RunStatus};
use crate::store::{
    CleanupPolicy, CleanupProgress, CleanupProgressFn, CleanupReport, EventMark, Finish, KeyLookup,
    Lease, RunFilter, Store,
};

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

/// Cleanup deletes exactly the rows past retention, in batches: keys processed and leases
/// expired before the keys' cut-off, ledger rows started before the runs' cut-off unless a
/// kept key points at them, event keys that expired before the keys' cut-off; `dry_run`
/// reports the same counts and deletes nothing; a second cleanup finds nothing.
pub async fn cleanup_deletes_exactly_what_is_past_retention(store: &dyn Store) {
    let rows = RetentionRows::record(store).await;
    // Keys are kept 30 days, the ledger 10 (shorter, so a kept key can point at an old run).
    let policy = CleanupPolicy {
        keys_before: rows.ago(30),
        runs_before: rows.ago(10),
        leases_before: rows.ago(30),
        processor: Some(rows.p.clone()),
        batch: 2,
        dry_run: true,
        progress: None,
        now: rows.t,
    };
    let expected = CleanupReport {
        keys_deleted: 4,
        runs_deleted: 3,
        leases_deleted: 1,
        event_keys_deleted: 0,
    };
    dry_run_deletes_nothing(store, &rows, &policy, &expected).await;
    let real = cleanup_tells_its_progress(store, &policy, &expected).await;
    only_rows_past_retention_are_gone(store, &rows, &real).await;
    only_event_keys_expired_before_the_cut_off_go(store).await;
}

/// The rows [`cleanup_deletes_exactly_what_is_past_retention`] records, under one processor
/// of its own: five runs and their keys at various ages, an expired lease and a held one.
struct RetentionRows {
    p: String,
    t: DateTime<Utc>,
    run_b: String,
    run_d: String,
    all_keys: [String; 6],
    old_lease: Lease,
    live_run: String,
}

impl RetentionRows {
    async fn record(store: &dyn Store) -> RetentionRows {
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
        let [key_e0, key_e1, key_e2]: [String; 3] = key_e.try_into().expect("three keys");
        RetentionRows {
            p,
            t,
            run_b,
            run_d,
            all_keys: [key_a, key_b, key_d, key_e0, key_e1, key_e2],
            old_lease,
            live_run,
        }
    }

    fn ago(&self, days: i64) -> DateTime<Utc> {
        self.t - chrono::Duration::days(days)
    }

    /// Which of the recorded keys are still there, in recording order.
    async fn keys_present(&self, store: &dyn Store) -> Vec<Option<KeyRecord>> {
        let lookups: Vec<KeyLookup> = self
            .all_keys
            .iter()
            .map(|k| KeyLookup {
                key: k.to_string(),
                kind: KeyKind::Content,
                since: self.ago(60),
            })
            .collect();
        store.find_keys(&lookups).await.unwrap()
    }

    /// The run ids in the ledger under this processor, sorted.
    async fn ledger(&self, store: &dyn Store) -> Vec<String> {
        let mut ids: Vec<String> = store
            .runs(&RunFilter {
                processor: Some(self.p.clone()),
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
}

/// A dry run counts and deletes nothing.
async fn dry_run_deletes_nothing(
    store: &dyn Store,
    rows: &RetentionRows,
    policy: &CleanupPolicy,
    expected: &CleanupReport,
) {
    assert_eq!(store.cleanup(policy).await.unwrap(), *expected, "dry run");
    let found = rows.keys_present(store).await;
    assert!(
        found.iter().all(Option::is_some),
        "a dry run deletes nothing: {found:?}"
    );
    assert_eq!(rows.ledger(store).await.len(), 5);
}

/// The same counts for real, told batch by batch to the progress callback: counts that
/// never go down, each table's last word its count in the report. Returns the real policy
/// (without the callback) for the checks after it.
async fn cleanup_tells_its_progress(
    store: &dyn Store,
    policy: &CleanupPolicy,
    expected: &CleanupReport,
) -> CleanupPolicy {
    let heard = Arc::new(std::sync::Mutex::new(Vec::<CleanupProgress>::new()));
    let real = CleanupPolicy {
        dry_run: false,
        progress: Some(CleanupProgressFn::new({
            let heard = heard.clone();
            move |p| heard.lock().unwrap().push(p)
        })),
        ..policy.clone()
    };
    assert_eq!(store.cleanup(&real).await.unwrap(), *expected);
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
    CleanupPolicy {
        progress: None,
        ..real
    }
}

/// After the real cleanup: the old keys, runs and the expired lease are gone; the kept
/// key, the old run it points at, the recent run and the held lease stay; a second cleanup
/// finds nothing.
async fn only_rows_past_retention_are_gone(
    store: &dyn Store,
    rows: &RetentionRows,
    real: &CleanupPolicy,
) {
    let (p, t) = (&rows.p, rows.t);
    let found = rows.keys_present(store).await;
    let present: Vec<bool> = found.iter().map(Option::is_some).collect();
    assert_eq!(present, [false, true, true, false, false, false]);
    let mut kept = vec![rows.run_b.clone(), rows.run_d.clone()];
    kept.sort();
    assert_eq!(
        rows.ledger(store).await,
        kept,
        "the old run a kept key points at stays"
    );
    let holder = store.lease_holder(p, "live", t).await.unwrap();
    assert_eq!(holder.map(|h| h.run_id), Some(rows.live_run.clone()));
    // The expired lease's row is gone: claiming the scope again starts the fencing token
    // afresh (had the row stayed, the token would have grown).
    let again = acquired(
        store
            .claim(&request(p, "old", &new_run_id(), 60, t))
            .await
            .unwrap(),
    );
    assert_eq!(
        again.token, rows.old_lease.token,
        "the expired lease's row is deleted"
    );
    // Nothing is left to delete.
    assert_eq!(store.cleanup(real).await.unwrap(), CleanupReport::default());
}

/// Event keys belong to no processor: only a cleanup of every processor deletes them,
/// and only those whose expiry passed before the cut-off. A key that never expires (the
/// gate's default) is never deleted, however old: a payment seen 31 days ago must stay
/// a replay (issue 21.2). (Instants in 1970, before any other check's rows.)
async fn only_event_keys_expired_before_the_cut_off_go(store: &dyn Store) {
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
    // Pending batches (where the store confirms them): one never confirmed, dead since
    // day 1, goes; one confirmed, its keys never expiring, stays.
    // A third, still pending (its deadline, day 3, after the cut-off at day 2: a live
    // gate's unconfirmed marks), stays whatever the cut-off.
    let (dead, kept, live) = (unique("dead"), unique("kept"), unique("live"));
    let pending = store.capabilities().confirms_pending;
    if pending {
        for (key, marker, timeout) in [
            (&dead, r#"{"idem_pending":"dead/0"}"#, day),
            (&kept, r#"{"idem_pending":"kept/0"}"#, day),
            (&live, r#"{"idem_pending":"live/0"}"#, day * 3),
        ] {
            let batch = crate::store::PendingBatch {
                marker,
                timeout,
                turn: None,
            };
            store
                .check_and_mark_pending(&ns, &[EventMark::key(key)], epoch(0), batch, None)
                .await
                .unwrap();
        }
        store
            .confirm_pending_batch(
                &ns,
                r#"{"idem_pending":"kept/0"}"#,
                &[(kept.clone(), None)],
                true,
            )
            .await
            .unwrap();
    }
    let every = CleanupPolicy {
        batch: 1,
        dry_run: true,
        ..CleanupPolicy::before(epoch(2))
    };
    let counted = store.cleanup(&every).await.unwrap();
    assert_eq!(
        counted.event_keys_deleted,
        1 + u64::from(pending),
        "{counted:?}"
    );
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
    if pending {
        // Asked while the dead batch was still pending: its key is gone, the confirmed stays.
        let seen = store
            .is_duplicate(
                &ns,
                &[dead, kept, live],
                epoch(0) + chrono::Duration::hours(1),
            )
            .await
            .unwrap();
        assert_eq!(
            seen,
            [false, true, true],
            "the dead batch's key goes, the confirmed and the still pending stay"
        );
    }
}

/// A key carries its own retention: cleanup deletes a key only once it is older than the
/// cut-off *and* past its `keep_until`. Four keys processed 40 days ago under a 30-day
/// cut-off: one its guard still needs (kept until tomorrow) stays with its ledger row, one
/// kept until 5 days ago goes, one written before keys carried a retention (`None`) goes by
/// the cut-off alone, one kept [`KEEP_FOREVER`](crate::model::KEEP_FOREVER) stays; a recent
/// key past its own retention stays (younger than the cut-off). The dry run counts the same.
pub async fn cleanup_keeps_a_key_until_its_own_retention(store: &dyn Store) {
    let p = unique("keep-until");
    let t = now();
    let ago = |days: i64| t - chrono::Duration::days(days);
    let cases = [
        ("needed", ago(40), Some(t + chrono::Duration::days(1)), true),
        ("done", ago(40), Some(ago(5)), false),
        ("legacy", ago(40), None, false),
        ("forever", ago(40), Some(crate::model::KEEP_FOREVER), true),
        ("recent", ago(2), Some(ago(1)), true),
    ];
    let mut written = Vec::new();
    for (name, at, keep_until, _) in &cases {
        let run = new_run_id();
        let key = unique(name);
        let mut record = key_record(&key, KeyKind::Scope, &p, name, &run, *at);
        record.keep_until = keep_until.map(crate::model::micros);
        store
            .finish(&Finish {
                run: run_record(&p, name, &run, RunStatus::Completed, *at),
                keys: vec![record.clone()],
                lease: None,
            })
            .await
            .unwrap();
        written.push((record, run));
    }
    let policy = CleanupPolicy {
        processor: Some(p.clone()),
        now: t,
        ..CleanupPolicy::before(ago(30))
    };
    let expected = cases.iter().filter(|c| !c.3).count() as u64;
    let counted = store
        .cleanup(&CleanupPolicy {
            dry_run: true,
            ..policy.clone()
        })
        .await
        .unwrap();
    assert_eq!(counted.keys_deleted, expected, "dry run: {counted:?}");
    let done = store.cleanup(&policy).await.unwrap();
    assert_eq!(done.keys_deleted, expected, "{done:?}");
    let lookups: Vec<KeyLookup> = written
        .iter()
        .map(|(k, _)| KeyLookup {
            key: k.key.clone(),
            kind: KeyKind::Scope,
            since: ago(60),
        })
        .collect();
    let found = store.find_keys(&lookups).await.unwrap();
    let runs: Vec<String> = store
        .runs(&RunFilter {
            processor: Some(p.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    for ((name, _, _, kept), (found, (written, run))) in
        cases.iter().zip(found.iter().zip(&written))
    {
        assert_eq!(found.is_some(), *kept, "key {name}: {found:?}");
        if let Some(found) = found {
            assert_eq!(found, written, "key {name} reads back as written");
        }
        assert_eq!(
            runs.contains(run),
            *kept,
            "ledger row of key {name}: {runs:?}"
        );
    }
}
