//! Deduplicated events: replays and conflicts, expiry (simulated and real), repeats within
//! a batch, large batches.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{now, unique};
use crate::model::micros;
use crate::store::{EventKeyStore, EventMark, EventVerdict};

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

/// Batches after all-replayed batches (Postgres then first tries a read, falling back when
/// some key is absent or expired): replays keep their stored decision and first-seen time
/// whether their marks expire or not, a changed payload conflicts, an expired key among
/// stored ones and a fresh one are marked, and a fresh batch after the replays is new.
pub async fn event_dedup_after_replayed_batches(store: &dyn EventKeyStore) {
    let ns = unique("replayed");
    let t = now();
    let hour = Duration::from_secs(3600);
    let decision = serde_json::json!({"ok": true});
    let batch = [
        EventMark::key("a")
            .fingerprint("a")
            .decision(decision.clone()),
        EventMark::key("b").fingerprint("b").ttl(hour),
    ];
    let first = store.check_and_mark(&ns, &batch, t).await.unwrap();
    assert!(first.iter().all(EventVerdict::is_new), "{first:?}");
    // The same batch three times: every key stored, one never expiring, one expiring.
    for pass in 1..=3 {
        let at = t + chrono::Duration::seconds(pass);
        let again = store.check_and_mark(&ns, &batch, at).await.unwrap();
        assert_eq!(
            replayed(&again[0]),
            Some(Some(decision.clone())),
            "{again:?}"
        );
        assert_eq!(replayed(&again[1]), Some(None), "{again:?}");
        assert_eq!(seen_at(&again[0]), Some(t), "{again:?}");
        assert_eq!(seen_at(&again[1]), Some(t), "{again:?}");
    }
    // All stored, with a changed payload and a repeat.
    let at = t + chrono::Duration::seconds(5);
    let changed = store
        .check_and_mark(
            &ns,
            &[
                EventMark::key("a").fingerprint("x"),
                EventMark::key("b").fingerprint("b"),
                EventMark::key("b").fingerprint("b"),
            ],
            at,
        )
        .await
        .unwrap();
    let names: Vec<&str> = changed.iter().map(EventVerdict::name).collect();
    assert_eq!(names, ["conflict", "replay", "replay"], "{changed:?}");
    assert_eq!(
        conflicting(&changed[0]).as_deref(),
        Some("a"),
        "{changed:?}"
    );
    // Two hours on: every key stored, b expired; then c fresh beside a stored key.
    let later = t + chrono::Duration::hours(2);
    let third = store
        .check_and_mark(
            &ns,
            &[
                EventMark::key("a").fingerprint("a"),
                EventMark::key("b").fingerprint("b2").ttl(hour),
            ],
            later,
        )
        .await
        .unwrap();
    let names: Vec<&str> = third.iter().map(EventVerdict::name).collect();
    assert_eq!(names, ["replay", "new"], "{third:?}");
    assert_eq!(seen_at(&third[0]), Some(t), "{third:?}");
    let fourth = store
        .check_and_mark(
            &ns,
            &[
                EventMark::key("a").fingerprint("a"),
                EventMark::key("c").fingerprint("c"),
            ],
            later,
        )
        .await
        .unwrap();
    let names: Vec<&str> = fourth.iter().map(EventVerdict::name).collect();
    assert_eq!(names, ["replay", "new"], "{fourth:?}");
    // Replayed again (b and c now first seen at `later`, with the third batch's payloads),
    // then a batch of fresh keys.
    let check = later + chrono::Duration::seconds(1);
    let marks = [
        EventMark::key("b").fingerprint("b2"),
        EventMark::key("c").fingerprint("c"),
    ];
    for _ in 0..2 {
        let v = store.check_and_mark(&ns, &marks, check).await.unwrap();
        let seen: Vec<_> = v.iter().map(seen_at).collect();
        assert_eq!(seen, [Some(later), Some(later)], "{v:?}");
    }
    let fresh = store
        .check_and_mark(
            &ns,
            &[
                EventMark::key("d"),
                EventMark::key("e"),
                EventMark::key("d"),
            ],
            check,
        )
        .await
        .unwrap();
    let names: Vec<&str> = fresh.iter().map(EventVerdict::name).collect();
    assert_eq!(names, ["new", "new", "replay"], "{fresh:?}");
}

/// TTL on the real clock: a mark with a short ttl (1.1 s) is a duplicate, then, after
/// sleeping past it, new again. Every store passes this one; Redis expires marks by its own
/// clock (`PX`), which [`event_dedup_ttl`]'s moving `now` alone would not show. A store
/// that took longer than the ttl to answer the first calls (a busy machine) is tried again
/// with twice the ttl: "still a duplicate" only holds while the ttl has not passed.
pub async fn event_dedup_real_ttl(store: &dyn EventKeyStore) {
    let mut ttl = Duration::from_millis(1100);
    for _ in 0..5 {
        let ns = unique("realttl");
        let mark = [EventMark::key("k").fingerprint("a").ttl(ttl)];
        let started = std::time::Instant::now();
        let first = store.check_and_mark(&ns, &mark, now()).await.unwrap();
        assert_eq!(first, vec![EventVerdict::New]);
        let again = store.check_and_mark(&ns, &mark, now()).await.unwrap();
        let seen = store
            .is_duplicate(&ns, &["k".to_string()], now())
            .await
            .unwrap();
        if started.elapsed() >= ttl {
            ttl *= 2;
            continue;
        }
        assert_eq!(again[0].name(), "replay", "{again:?}");
        assert_eq!(seen, vec![true]);
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
        return;
    }
    panic!("the store never answered three calls within a ttl (last tried {ttl:?})");
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
