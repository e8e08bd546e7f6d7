//! Event keys: marks per namespace, cursors, pending marks, taking marks back.

use std::time::Duration;

use serde_json::json;

use super::{now, unique};
use crate::error::Error;
use crate::store::{BatchTurn, Cursor, EventKeyStore, EventMark, EventVerdict, PendingBatch};

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

/// Pending marks (issue 21.1), on a store that [`confirms_pending`]: a mark made with a
/// marker decision and a short expiry answers later calls with that marker (so another
/// gate knows to wait); a confirmation by another owner changes nothing; the owner's
/// confirmation clears the marker and sets the real expiry (here: never); a pending mark
/// nobody confirmed expires and the next call takes it over as new.
///
/// [`confirms_pending`]: crate::store::Capabilities::confirms_pending
pub async fn event_pending(store: &dyn EventKeyStore) {
    if !store.capabilities().confirms_pending {
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

/// Pending marks by the batch ([`check_and_mark_pending`], [`confirm_pending_batch`]), on
/// a store that [`confirms_pending`]: a batch's new keys answer other calls with the
/// batch's marker until it is confirmed; confirming another batch changes nothing; once
/// confirmed they are plain marks with their real expiry (here one hour, and never) and
/// no decision; keys of a batch nobody confirmed expire with its timeout, are not
/// duplicates any more and are taken over as new (by a plain call too); with a cursor,
/// the cursor moves with the marks.
///
/// [`check_and_mark_pending`]: crate::store::EventKeyStore::check_and_mark_pending
/// [`confirm_pending_batch`]: crate::store::EventKeyStore::confirm_pending_batch
/// [`confirms_pending`]: crate::store::Capabilities::confirms_pending
pub async fn event_pending_batches(store: &dyn EventKeyStore) {
    if !store.capabilities().confirms_pending {
        return;
    }
    let ns = unique("batches");
    let t = now();
    let hour = Duration::from_secs(3600);
    let batch = |marker: &'static str| crate::store::PendingBatch {
        marker,
        timeout: Duration::from_secs(30),
        turn: None,
    };
    let (a, b) = (
        r#"{"idem_pending":"gate-a/0"}"#,
        r#"{"idem_pending":"gate-b/0"}"#,
    );
    let at = |s: i64| t + chrono::Duration::seconds(s);
    // A batch of fresh keys only first (Postgres tries its bulk path), whose marker the
    // next call uses again (a batch asked again, as a gate waiting on a key does).
    let v = store
        .check_and_mark_pending(
            &ns,
            &[EventMark::key("f1"), EventMark::key("f2")],
            t,
            batch(a),
            None,
        )
        .await
        .unwrap();
    assert_eq!(v, [EventVerdict::New, EventVerdict::New]);
    // Batches whose keys share their expiry (one hour; none) but not their values
    // (fingerprints): each key keeps its own (Redis's script gets a shared expiry once,
    // each key's value apart).
    for (c, ttl) in [
        (r#"{"idem_pending":"gate-c/0"}"#, Some(hour)),
        (r#"{"idem_pending":"gate-d/0"}"#, None),
    ] {
        let names = ["p", "q", "p"];
        let keys = names.map(|_| unique("g"));
        let marks: Vec<EventMark> = keys
            .iter()
            .map(EventMark::key)
            .zip(names)
            .map(|(m, f)| match ttl {
                Some(ttl) => m.fingerprint(f).ttl(ttl),
                None => m.fingerprint(f),
            })
            .collect();
        let v = store
            .check_and_mark_pending(&ns, &marks, t, batch(c), None)
            .await
            .unwrap();
        assert_eq!(v, [EventVerdict::New, EventVerdict::New, EventVerdict::New]);
        let expiry =
            ttl.map(|ttl| crate::model::micros(t + chrono::Duration::from_std(ttl).unwrap()));
        let confirmed: Vec<(String, Option<chrono::DateTime<chrono::Utc>>)> =
            keys.iter().map(|k| (k.clone(), expiry)).collect();
        store
            .confirm_pending_batch(&ns, c, &confirmed, true)
            .await
            .unwrap();
        let v = store
            .check_and_mark(
                &ns,
                &keys.clone().map(|k| EventMark::key(k).fingerprint("q")),
                at(1),
            )
            .await
            .unwrap();
        let stored: Vec<Option<&str>> = v
            .iter()
            .map(|v| match v {
                EventVerdict::Conflict {
                    stored_fingerprint, ..
                } => Some(stored_fingerprint.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(stored, [Some("p"), None, Some("p")], "ttl {ttl:?}: {v:?}");
        assert!(matches!(v[1], EventVerdict::Replay { .. }), "{v:?}");
    }
    store
        .check_and_mark(&ns, &[EventMark::key("old").fingerprint("x")], t)
        .await
        .unwrap();
    let marks = [
        EventMark::key("k1").fingerprint("x").ttl(hour),
        EventMark::key("k2")
            .fingerprint("x")
            .decision(json!({"ok": 1})),
        EventMark::key("old").fingerprint("x"),
    ];
    let v = store
        .check_and_mark_pending(&ns, &marks, t, batch(a), None)
        .await
        .unwrap();
    assert_eq!(v[..2], [EventVerdict::New, EventVerdict::New]);
    assert!(matches!(v[2], EventVerdict::Replay { .. }), "{v:?}");
    // Another batch sees the marker; the key is marked (a duplicate) meanwhile.
    let v = store
        .check_and_mark_pending(
            &ns,
            &[EventMark::key("k1").fingerprint("x")],
            at(1),
            batch(b),
            None,
        )
        .await
        .unwrap();
    let marker: serde_json::Value = serde_json::from_str(a).unwrap();
    assert!(
        matches!(&v[0], EventVerdict::Replay { decision: Some(d), .. } if *d == marker),
        "pending for batch a: {v:?}"
    );
    assert_eq!(
        store
            .is_duplicate(&ns, &["k1".to_string()], at(1))
            .await
            .unwrap(),
        [true]
    );
    // Confirming batch b (which marked nothing) leaves batch a pending.
    store
        .confirm_pending_batch(&ns, b, &[("k1".to_string(), None)], true)
        .await
        .unwrap();
    let v = store
        .check_and_mark(&ns, &[EventMark::key("k1")], at(2))
        .await
        .unwrap();
    assert!(
        matches!(&v[0], EventVerdict::Replay { decision: Some(d), .. } if *d == marker),
        "still pending for batch a: {v:?}"
    );
    // Some of batch a's keys confirmed: those only; f2 stays pending, then expires.
    let confirmed = store
        .confirm_pending_batch(&ns, a, &[("f1".to_string(), None)], false)
        .await
        .unwrap();
    assert_eq!(confirmed, 1, "f1 only");
    assert_eq!(
        store
            .is_duplicate(&ns, &["f1".to_string(), "f2".to_string()], at(40))
            .await
            .unwrap(),
        [true, false],
        "a key left out of a partial confirmation stays pending, and expires"
    );
    let confirmed = store
        .confirm_pending_batch(
            &ns,
            a,
            &[
                (
                    "k1".to_string(),
                    Some(crate::model::micros(t + chrono::Duration::hours(1))),
                ),
                ("k2".to_string(), None),
            ],
            true,
        )
        .await
        .unwrap();
    assert_eq!(confirmed, 2);
    // Long past the pending timeout: plain marks, with their own decision and expiry.
    let v = store
        .check_and_mark(
            &ns,
            &[
                EventMark::key("k1").fingerprint("x"),
                EventMark::key("k2").fingerprint("y"),
            ],
            at(60),
        )
        .await
        .unwrap();
    assert!(
        matches!(&v[0], EventVerdict::Replay { decision: None, .. }),
        "confirmed: {v:?}"
    );
    assert!(
        matches!(&v[1], EventVerdict::Conflict { stored_fingerprint, .. } if stored_fingerprint == "x"),
        "confirmed, fingerprint kept: {v:?}"
    );
    let v = store
        .check_and_mark(&ns, &[EventMark::key("k2")], at(61))
        .await
        .unwrap();
    assert!(
        matches!(&v[0], EventVerdict::Replay { decision: None, .. }),
        "a pending mark keeps no decision: {v:?}"
    );
    let later = t + chrono::Duration::hours(2);
    let v = store
        .check_and_mark(&ns, &[EventMark::key("k1"), EventMark::key("k2")], later)
        .await
        .unwrap();
    assert_eq!(
        v[0],
        EventVerdict::New,
        "k1's real expiry (one hour) passed"
    );
    assert!(
        matches!(v[1], EventVerdict::Replay { .. }),
        "k2 never expires: {v:?}"
    );

    // A batch nobody confirms: pending until its timeout, then gone.
    let c = r#"{"idem_pending":"gate-c/7"}"#;
    let v = store
        .check_and_mark_pending(
            &ns,
            &[EventMark::key("u1"), EventMark::key("u2")],
            t,
            batch(c),
            None,
        )
        .await
        .unwrap();
    assert_eq!(v, [EventVerdict::New, EventVerdict::New]);
    assert_eq!(
        store
            .is_duplicate(&ns, &["u1".to_string(), "u2".to_string()], at(29))
            .await
            .unwrap(),
        [true, true]
    );
    assert_eq!(
        store
            .is_duplicate(&ns, &["u1".to_string(), "u2".to_string()], at(31))
            .await
            .unwrap(),
        [false, false],
        "an unconfirmed batch's keys expire with its timeout"
    );
    let v = store
        .check_and_mark(&ns, &[EventMark::key("u1")], at(31))
        .await
        .unwrap();
    assert_eq!(v, [EventVerdict::New], "taken over by a plain call");
    let v = store
        .check_and_mark_pending(
            &ns,
            &[EventMark::key("u1"), EventMark::key("u2")],
            at(32),
            batch(b),
            None,
        )
        .await
        .unwrap();
    assert!(
        matches!(v[0], EventVerdict::Replay { decision: None, .. }),
        "{v:?}"
    );
    assert_eq!(v[1], EventVerdict::New, "taken over by another batch");
    assert_eq!(
        store
            .mark_event_keys(&ns, &["u2".to_string()], at(33))
            .await
            .unwrap(),
        [false],
        "pending for batch b"
    );

    // With a cursor: the marks and the cursor's advance together.
    let to = Cursor::at(&json!(5), &json!("e5")).unwrap();
    match store
        .check_and_mark_pending(&ns, &[EventMark::key("cur")], t, batch(a), Some(("c", &to)))
        .await
    {
        Err(crate::error::Error::Unsupported { .. }) => {}
        other => {
            assert_eq!(other.unwrap(), [EventVerdict::New]);
            assert_eq!(store.cursor(&ns, "c").await.unwrap(), Some(to));
        }
    }
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
            assert_eq!(
                store.capabilities().batch_concurrency,
                1,
                "runs calls side by side"
            );
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

/// Two gates' batches of the same keys, marked pending at the same time through two
/// handles on one store (two connections): one batch marks every key and the other finds
/// every key pending for it, never some of each. A batch split between two gates would
/// have each wait for the other to confirm (each confirms only once its records are out,
/// after its wait): neither would ever go on. The same when both take over the keys of a
/// batch that died. `a` and `b` may be one handle (a store only one process can open).
pub async fn event_pending_batches_are_whole(a: &dyn EventKeyStore, b: &dyn EventKeyStore) {
    if !a.capabilities().confirms_pending {
        return;
    }
    let batch = |marker: &'static str| crate::store::PendingBatch {
        marker,
        timeout: Duration::from_secs(30),
        turn: None,
    };
    let (ma, mb) = (
        r#"{"idem_pending":"whole-a/0"}"#,
        r#"{"idem_pending":"whole-b/0"}"#,
    );
    // Enough keys that two calls' statements would interleave if the store let them.
    let marks: Vec<EventMark> = (0..400)
        .map(|i| EventMark::key(format!("key-{i:04}")).fingerprint("x"))
        .collect();
    // The other gate's batch has them in the opposite order (its input came otherwise):
    // marked one by one, the two would meet in the middle.
    let reversed: Vec<EventMark> = marks.iter().rev().cloned().collect();
    for round in 0..12 {
        let ns = unique("whole");
        let t = now();
        if round % 2 == 1 {
            // The keys are pending for a gate that died an hour ago: both take them over
            // at once, and one takes them all.
            let dead = a
                .check_and_mark_pending(
                    &ns,
                    &marks,
                    t - chrono::Duration::hours(1),
                    batch(r#"{"idem_pending":"whole-dead/0"}"#),
                    None,
                )
                .await
                .unwrap();
            assert!(dead.iter().all(EventVerdict::is_new), "{dead:?}");
        }
        let (va, vb) = tokio::join!(
            a.check_and_mark_pending(&ns, &marks, t, batch(ma), None),
            b.check_and_mark_pending(&ns, &reversed, t, batch(mb), None),
        );
        let (va, vb) = (va.unwrap(), vb.unwrap());
        let new = |v: &[EventVerdict]| v.iter().filter(|v| v.is_new()).count();
        let (na, nb) = (new(&va), new(&vb));
        assert!(
            (na, nb) == (marks.len(), 0) || (na, nb) == (0, marks.len()),
            "round {round}: the batches split the keys ({na} new for a, {nb} for b)"
        );
        let (loser, winner) = if na > 0 { (&vb, ma) } else { (&va, mb) };
        let winner: serde_json::Value = serde_json::from_str(winner).unwrap();
        assert!(
            loser.iter().all(
                |v| matches!(v, EventVerdict::Replay { decision: Some(d), .. } if *d == winner)
            ),
            "round {round}: every key pending for the batch that marked it: {loser:?}"
        );
    }
}

/// A batch answered by a read ([`EventKeyStore::check_all_marked`]): when every key is
/// marked and alive, the verdicts [`EventKeyStore::check_and_mark`] gives the same batch
/// (a replay with its decision, a conflict, an in-batch repeat, a key pending for a batch
/// as a replay whose decision is the batch's marker); `None` when a key is absent,
/// expired, or pending past its batch's deadline, and then nothing is written. BigQuery
/// does not read ahead: `None` always.
pub async fn event_all_marked(store: &dyn EventKeyStore) {
    let ns = unique("all-marked");
    let t = now();
    let at = |s: i64| t + chrono::Duration::seconds(s);
    let marks = [
        EventMark::key("a")
            .fingerprint("fa")
            .decision(json!({"sent": 1})),
        EventMark::key("b").fingerprint("fb"),
        EventMark::key("short").ttl(Duration::from_secs(10)),
    ];
    store.check_and_mark(&ns, &marks, t).await.unwrap();
    let marker = r#"{"idem_pending":"conformance/1"}"#;
    let batch = PendingBatch {
        marker,
        timeout: Duration::from_secs(60),
        turn: None,
    };
    store
        .check_and_mark_pending(&ns, &[EventMark::key("p")], t, batch, None)
        .await
        .unwrap();
    let ask = [
        EventMark::key("a").fingerprint("fa"),
        EventMark::key("b").fingerprint("another"),
        EventMark::key("a"),
        EventMark::key("p"),
        EventMark::key("short"),
    ];
    let absent = [EventMark::key("a"), EventMark::key("x")];
    if store.kind() == "bigquery" {
        for batch in [&ask[..], &absent[..], &[]] {
            assert_eq!(
                store.check_all_marked(&ns, batch, at(1)).await.unwrap(),
                None
            );
        }
        return;
    }
    let read = store.check_all_marked(&ns, &ask, at(1)).await.unwrap();
    let read = read.expect("every key is marked and alive");
    assert!(
        matches!(&read[0], EventVerdict::Replay { decision: Some(d), .. } if *d == json!({"sent": 1})),
        "{read:?}"
    );
    assert!(
        matches!(&read[1], EventVerdict::Conflict { stored_fingerprint, .. } if stored_fingerprint == "fb")
    );
    assert!(matches!(&read[2], EventVerdict::Replay { .. }), "{read:?}");
    let pending: serde_json::Value = serde_json::from_str(marker).unwrap();
    assert!(
        matches!(&read[3], EventVerdict::Replay { decision: Some(d), .. } if *d == pending),
        "a pending key reads as a replay whose decision is its batch's marker: {read:?}"
    );
    assert!(matches!(&read[4], EventVerdict::Replay { .. }), "{read:?}");
    let marked = store.check_and_mark(&ns, &ask, at(1)).await.unwrap();
    assert_eq!(read, marked, "the verdicts check_and_mark gives");
    assert_eq!(
        store.check_all_marked(&ns, &[], at(1)).await.unwrap(),
        Some(Vec::new())
    );
    // Absent, expired, pending past its deadline: no answer, nothing written.
    assert_eq!(
        store.check_all_marked(&ns, &absent, at(1)).await.unwrap(),
        None
    );
    assert_eq!(
        store
            .is_duplicate(&ns, &["x".to_string()], at(1))
            .await
            .unwrap(),
        vec![false],
        "a read that found a key absent marked nothing"
    );
    let expired = [EventMark::key("a"), EventMark::key("short")];
    assert_eq!(
        store.check_all_marked(&ns, &expired, at(11)).await.unwrap(),
        None
    );
    let late = [EventMark::key("p")];
    assert_eq!(
        store.check_all_marked(&ns, &late, at(61)).await.unwrap(),
        None
    );
}

/// A gate's batches mark their keys in input order, ahead of their turn where the store
/// keeps the row's order ([`Capabilities::marks_ahead`](crate::store::Capabilities::marks_ahead)):
/// a batch asked ahead is marked only right after the row's last place marked, and (a
/// batch of fresh keys, the first pass's) only when none of its keys is stored; refused,
/// it has written nothing. A store that does not keep the order refuses every batch asked
/// ahead, and writes nothing.
pub async fn event_marks_ahead(store: &dyn EventKeyStore) {
    if !store.capabilities().confirms_pending {
        return;
    }
    let ns = unique("ahead");
    let t = now();
    let (row, other_row) = (unique("row"), unique("row"));
    let markers: Vec<String> = (0..8)
        .map(|n| format!(r#"{{"idem_pending":"ahead-gate/{n}"}}"#))
        .collect();
    let place = |n: u64| -> Vec<EventMark> {
        (0..3)
            .map(|i| EventMark::key(format!("k{n}-{i}")).ttl(Duration::from_secs(3600)))
            .collect()
    };
    let all_new = |v: &[EventVerdict]| v.iter().all(|v| *v == EventVerdict::New);
    let ahead = async |row: &str, n: u64, marks: &[EventMark]| {
        store
            .check_and_mark_pending_ahead(&ns, marks, t, in_row(&markers[n as usize], row, n))
            .await
            .unwrap()
    };
    let in_turn = async |n: u64, marks: &[EventMark]| {
        store
            .check_and_mark_pending(&ns, marks, t, in_row(&markers[n as usize], &row, n), None)
            .await
            .unwrap()
    };
    let stored = async |marks: &[EventMark]| {
        let keys: Vec<String> = marks.iter().map(|m| m.key.clone()).collect();
        store.is_duplicate(&ns, &keys, t).await.unwrap()
    };

    // Ahead in a row nothing of which has marked: refused, nothing written.
    assert_eq!(ahead(&row, 1, &place(1)).await, None);
    assert_eq!(stored(&place(1)).await, [false; 3]);
    // Place 0 in its turn.
    assert!(all_new(&in_turn(0, &place(0)).await));
    if !store.capabilities().marks_ahead {
        // Refused even right after the row's last place marked.
        assert_eq!(ahead(&row, 1, &place(1)).await, None, "{}", store.kind());
        assert_eq!(stored(&place(1)).await, [false; 3]);
        return;
    }
    // Place 2 before place 1: refused, nothing written.
    assert_eq!(ahead(&row, 2, &place(2)).await, None);
    assert_eq!(stored(&place(2)).await, [false; 3]);
    // Place 1 right after 0: marked ahead, its keys pending for its batch.
    let v = ahead(&row, 1, &place(1))
        .await
        .expect("marked ahead right after place 0");
    assert!(all_new(&v), "{v:?}");
    let again = store.check_and_mark(&ns, &place(1)[..1], t).await.unwrap();
    assert!(
        matches!(&again[0], EventVerdict::Replay { decision: Some(d), .. } if *d == serde_json::from_str::<serde_json::Value>(&markers[1]).unwrap()),
        "{again:?}"
    );
    // Place 2 now. Another row is a row of its own, where nothing has marked yet.
    let v = ahead(&row, 2, &place(2))
        .await
        .expect("place 2 after place 1");
    assert!(all_new(&v), "{v:?}");
    assert_eq!(ahead(&other_row, 1, &place(10)).await, None);
    assert_eq!(stored(&place(10)).await, [false; 3]);
    // Place 3 with a key stored (one of place 2's): refused whole, its fresh keys unwritten.
    let mut mixed = place(3);
    mixed.push(place(2)[1].clone());
    assert_eq!(ahead(&row, 3, &mixed).await, None);
    assert_eq!(stored(&place(3)).await, [false; 3]);
    // In its turn it is marked (its fresh keys new, the stored one found); after a place
    // marked in its turn, a batch of fresh keys goes ahead again.
    let v = in_turn(3, &mixed).await;
    assert!(all_new(&v[..3]) && v[3] != EventVerdict::New, "{v:?}");
    assert!(all_new(&in_turn(4, &place(4)).await));
    let v = ahead(&row, 5, &place(5))
        .await
        .expect("place 5 after place 4");
    assert!(all_new(&v), "{v:?}");
    // A place that has marked is not marked again ahead.
    assert_eq!(ahead(&row, 5, &place(6)).await, None);
    assert_eq!(stored(&place(6)).await, [false; 3]);
}

/// Batch `place` of `row`, marked `marker`.
fn in_row<'a>(marker: &'a str, row: &'a str, place: u64) -> PendingBatch<'a> {
    PendingBatch {
        marker,
        timeout: Duration::from_secs(60),
        turn: Some(BatchTurn {
            row,
            place,
            started: crate::store::TurnStarted::nobody(),
        }),
    }
}
