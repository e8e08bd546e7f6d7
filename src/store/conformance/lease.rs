//! Leases: a claim excludes, an expired lease is taken over and fenced, one winner among
//! concurrent claims, renewal extends.

use std::sync::Arc;
use std::time::Duration;

use super::{acquired, finish_completed, key_record, now, request, unique};
use crate::error::Error;
use crate::model::{micros, new_run_id, KeyKind};
use crate::store::{Claim, ClaimRequest, KeyLookup, LeaseStore, RunFilter, Store};

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
/// over the new one, and its late finish writes nothing. A lease past its expiry that
/// nobody took over is still its run's: the finish is recorded with its keys.
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

    // A lease that expired but that nobody took over is still its run's: the run's finish
    // is recorded with its keys (a takeover, not the clock alone, fences a run out).
    let q = unique("expired-kept");
    let run = new_run_id();
    let kept = acquired(store.claim(&request(&q, "s", &run, 10, t0)).await.unwrap());
    let late = t0 + chrono::Duration::seconds(60);
    let key = unique("kept-key");
    finish_completed(
        store,
        &kept,
        vec![key_record(&key, KeyKind::Scope, &q, "s", &run, late)],
        late,
    )
    .await
    .expect("an expired lease nobody took over still finishes");
    let found = store
        .find_keys(&[KeyLookup {
            key,
            kind: KeyKind::Scope,
            since: t0 - chrono::Duration::days(1),
        }])
        .await
        .unwrap();
    assert!(found[0].is_some(), "its key is written");
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

/// The leases not released are the runs not recorded yet: a claim is listed with this
/// process's host and pid and its claim as heartbeat; a renewal moves the heartbeat and
/// the expiry; past its expiry the lease is still listed (the run is abandoned, not gone)
/// until another run takes it over; a released lease is not listed. Filtered by
/// processor, newest claim first.
pub async fn open_leases_are_the_runs_not_recorded_yet(store: &dyn LeaseStore) {
    let p = unique("open");
    let t0 = now();
    let (a, b) = (new_run_id(), new_run_id());
    let lease_a = acquired(store.claim(&request(&p, "a", &a, 10, t0)).await.unwrap());
    let t1 = t0 + chrono::Duration::seconds(1);
    let lease_b = acquired(store.claim(&request(&p, "b", &b, 10, t1)).await.unwrap());
    let open = store.open_leases(Some(&p)).await.unwrap();
    let runs: Vec<(&str, &str)> = open
        .iter()
        .map(|l| (l.scope.as_str(), l.run_id.as_str()))
        .collect();
    assert_eq!(runs, [("b", b.as_str()), ("a", a.as_str())], "newest first");
    let first = &open[1];
    assert_eq!(first.host.as_deref(), Some(crate::model::host_name()));
    assert_eq!(first.pid, Some(i64::from(std::process::id())));
    assert_eq!(
        (
            first.acquired_at,
            first.heartbeat_at,
            first.expires_at,
            first.token
        ),
        (
            micros(t0),
            Some(micros(t0)),
            lease_a.expires_at,
            lease_a.token
        )
    );
    assert!(first.running_at(t0) && !first.running_at(lease_a.expires_at));
    // A renewal is a heartbeat.
    let t2 = t0 + chrono::Duration::seconds(5);
    let renewed = store
        .renew(&lease_a, Duration::from_secs(10), t2)
        .await
        .unwrap();
    let open = store.open_leases(Some(&p)).await.unwrap();
    let first = open.iter().find(|l| l.scope == "a").expect("still open");
    assert_eq!(
        (first.heartbeat_at, first.expires_at),
        (Some(micros(t2)), renewed.expires_at)
    );
    // Released: not open. Expired without a release: open (abandoned).
    assert!(store.release(&lease_b, t2).await.unwrap());
    let open = store.open_leases(Some(&p)).await.unwrap();
    assert_eq!(open.len(), 1, "{open:?}");
    assert!(!open[0].running_at(renewed.expires_at + chrono::Duration::seconds(1)));
    assert!(
        store
            .open_leases(Some(&unique("other")))
            .await
            .unwrap()
            .is_empty(),
        "filtered by processor"
    );
    let all = store.open_leases(None).await.unwrap();
    assert!(all.iter().any(|l| l.run_id == a), "unfiltered: every job's");
}
