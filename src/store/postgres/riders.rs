//! Whole-batch confirmations that ride in the transaction of a pending batch marked after
//! them, instead of a transaction, a round trip and a connection of their own.
//!
//! A gate confirms each batch once its records are out, while the batches after it are
//! being marked. A pending batch marked in a row ([`BatchTurn`]) opens a [`Carrier`]
//! before it asks for a connection; a confirmation that finds one open waits in the queue
//! ([`RideQueue::ride`]), and the carrier's last statement deletes the rows of every
//! confirmation waiting then ([`Carrier::take`]), in its own transaction. A confirmation
//! whose row that statement did not delete (gone already, or locked by another
//! transaction: skipped, never waited for), whose carrier's transaction failed, or that
//! waited too long for one ([`RIDE_WAIT`]) is written on its own, as it is when no carrier
//! is open.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::oneshot;

/// How long a confirmation waits in the queue for a carrier before it takes its rider
/// back and goes on its own (a carrier parked by its caller, or slow to reach its last
/// statement): long past the few milliseconds a batch takes, so a confirmation rides in
/// every case but those.
pub(super) const RIDE_WAIT: Duration = Duration::from_secs(2);

/// The confirmations waiting for a carrier, and how many carriers may still take them.
#[derive(Debug, Default)]
pub(super) struct RideQueue {
    state: Mutex<State>,
    /// How many confirmations a carrier's transaction wrote (for tests).
    carried: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Carriers open: pending batches in flight that have not reached their last statement.
    open: usize,
    waiting: Vec<Rider>,
    next: u64,
}

/// A whole-batch confirmation waiting for a carrier: told `()` once the carrier's
/// transaction committed with its row deleted; dropped unanswered, it goes on its own.
#[derive(Debug)]
struct Rider {
    id: u64,
    namespace: String,
    marker: String,
    done: oneshot::Sender<()>,
}

/// A confirmation's place in the queue ([`RideQueue::ride`]).
pub(super) struct Ride {
    id: u64,
    answer: oneshot::Receiver<()>,
}

impl RideQueue {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // It holds no invariant a panic elsewhere could break halfway.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens a carrier: a pending batch in a row, before it asks for its connection.
    pub(super) fn carrier(&self) -> Carrier<'_> {
        self.state().open += 1;
        Carrier {
            queue: self,
            open: true,
        }
    }

    /// Queues the confirmation of batch `marker`, when a carrier is open to take it.
    pub(super) fn ride(&self, namespace: &str, marker: &str) -> Option<Ride> {
        let mut state = self.state();
        if state.open == 0 {
            return None;
        }
        let (done, answer) = oneshot::channel();
        state.next += 1;
        let id = state.next;
        state.waiting.push(Rider {
            id,
            namespace: namespace.to_string(),
            marker: marker.to_string(),
            done,
        });
        Some(Ride { id, answer })
    }

    /// Whether `ride` was written by a carrier: waits for its answer, or up to
    /// [`RIDE_WAIT`] for a carrier to take it (then takes it back and says `false`; once
    /// taken, it waits for the carrier's transaction to end).
    pub(super) async fn carried(&self, ride: Ride) -> bool {
        let Ride { id, mut answer } = ride;
        match tokio::time::timeout(RIDE_WAIT, &mut answer).await {
            Ok(answered) => answered.is_ok(),
            Err(_) => !self.withdraw(id) && answer.await.is_ok(),
        }
    }

    /// Takes confirmation `id` out of the queue; `false` when a carrier took it already.
    fn withdraw(&self, id: u64) -> bool {
        let mut state = self.state();
        let before = state.waiting.len();
        state.waiting.retain(|r| r.id != id);
        state.waiting.len() < before
    }

    /// How many confirmations carriers wrote so far.
    #[cfg(test)]
    pub(super) fn carried_count(&self) -> u64 {
        self.carried.load(Ordering::Relaxed)
    }

    /// How many confirmations wait for a carrier now.
    #[cfg(test)]
    pub(super) fn waiting(&self) -> usize {
        self.state().waiting.len()
    }

    /// How many carriers are open now.
    #[cfg(test)]
    pub(super) fn open(&self) -> usize {
        self.state().open
    }
}

/// An open carrier ([`RideQueue::carrier`]): taken at its batch's last statement, or
/// dropped when the batch will not get there. The last carrier dropped untaken sends the
/// confirmations waiting on their own.
pub(super) struct Carrier<'a> {
    queue: &'a RideQueue,
    open: bool,
}

impl<'a> Carrier<'a> {
    /// Closes the carrier and takes every confirmation waiting now.
    pub(super) fn take(mut self) -> Riders<'a> {
        self.open = false;
        let mut state = self.queue.state();
        state.open -= 1;
        Riders {
            queue: self.queue,
            riders: std::mem::take(&mut state.waiting),
        }
    }
}

impl Drop for Carrier<'_> {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        let mut state = self.queue.state();
        state.open -= 1;
        if state.open == 0 {
            // No carrier left to take them: each goes on its own (dropped unanswered).
            state.waiting.clear();
        }
    }
}

/// The confirmations a carrier took into its transaction: those whose rows it deleted are
/// answered once it committed ([`Riders::answer`]); the others, and all of them when it
/// did not commit (dropped), go on their own.
pub(super) struct Riders<'a> {
    queue: &'a RideQueue,
    riders: Vec<Rider>,
}

impl Riders<'_> {
    /// Whether none was taken.
    pub(super) fn is_empty(&self) -> bool {
        self.riders.is_empty()
    }

    /// Their batches' namespaces and markers, in the same order (two arrays to bind).
    pub(super) fn batches(&self) -> (Vec<&str>, Vec<&str>) {
        self.riders
            .iter()
            .map(|r| (r.namespace.as_str(), r.marker.as_str()))
            .unzip()
    }

    /// The carrier's transaction committed having deleted the rows of `deleted`
    /// (namespace, marker): those confirmations are done, the others go on their own.
    /// Each row deleted answers one confirmation: of two confirmations of the same batch
    /// (a caller that asked twice at once), the second goes on its own and finds nothing,
    /// as it would have without riding.
    pub(super) fn answer(mut self, deleted: &[(String, String)]) {
        let mut deleted: Vec<&(String, String)> = deleted.iter().collect();
        for r in std::mem::take(&mut self.riders) {
            let Some(i) = deleted
                .iter()
                .position(|(n, m)| *n == r.namespace && *m == r.marker)
            else {
                continue;
            };
            // A confirmation no longer waiting (its caller gone) leaves the row's answer
            // to another of the same batch.
            if r.done.send(()).is_ok() {
                deleted.swap_remove(i);
                self.queue.carried.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_confirmation_rides_only_while_a_carrier_is_open() {
        let queue = RideQueue::default();
        assert!(queue.ride("n", "a").is_none(), "no carrier: on its own");
        let carrier = queue.carrier();
        let ride = queue.ride("n", "a").expect("a carrier is open");
        let riders = carrier.take();
        assert_eq!(riders.batches(), (vec!["n"], vec!["a"]));
        assert!(queue.ride("n", "b").is_none(), "the carrier was taken");
        riders.answer(&[("n".to_string(), "a".to_string())]);
        assert!(queue.carried(ride).await);
        assert_eq!(queue.carried_count(), 1);
    }

    #[tokio::test]
    async fn a_confirmation_whose_row_was_not_deleted_goes_on_its_own() {
        let queue = RideQueue::default();
        let carrier = queue.carrier();
        let (a, b) = (queue.ride("n", "a").unwrap(), queue.ride("n", "b").unwrap());
        carrier.take().answer(&[("n".to_string(), "b".to_string())]);
        assert!(!queue.carried(a).await, "a's row was not deleted");
        assert!(queue.carried(b).await);
    }

    #[tokio::test]
    async fn each_row_deleted_answers_one_confirmation_of_its_batch() {
        let queue = RideQueue::default();
        let carrier = queue.carrier();
        let (gone, twice, again) = (
            queue.ride("n", "a").unwrap(),
            queue.ride("n", "a").unwrap(),
            queue.ride("n", "a").unwrap(),
        );
        drop(gone);
        carrier.take().answer(&[("n".to_string(), "a".to_string())]);
        assert!(queue.carried(twice).await, "the first still waiting");
        assert!(
            !queue.carried(again).await,
            "on its own: the row answered once"
        );
        assert_eq!(queue.carried_count(), 1);
    }

    #[tokio::test]
    async fn a_carrier_that_does_not_commit_sends_its_riders_on_their_own() {
        let queue = RideQueue::default();
        let carrier = queue.carrier();
        let ride = queue.ride("n", "a").unwrap();
        drop(carrier.take());
        assert!(!queue.carried(ride).await);
        assert_eq!(queue.carried_count(), 0);
    }

    #[tokio::test]
    async fn the_last_carrier_dropped_untaken_sends_the_waiting_on_their_own() {
        let queue = RideQueue::default();
        let (first, second) = (queue.carrier(), queue.carrier());
        let ride = queue.ride("n", "a").unwrap();
        drop(first);
        assert_eq!(queue.waiting(), 1, "the second carrier may still take it");
        drop(second);
        assert_eq!((queue.waiting(), queue.open()), (0, 0));
        assert!(!queue.carried(ride).await);
    }

    /// A carrier that never gets to its last statement (parked by its caller) keeps a
    /// confirmation waiting no longer than `RIDE_WAIT`, on tokio's paused clock.
    #[tokio::test(start_paused = true)]
    async fn a_confirmation_waits_for_a_carrier_no_longer_than_ride_wait() {
        let queue = RideQueue::default();
        let parked = queue.carrier();
        let ride = queue.ride("n", "a").unwrap();
        let started = tokio::time::Instant::now();
        assert!(!queue.carried(ride).await);
        assert_eq!(started.elapsed(), RIDE_WAIT);
        assert_eq!(queue.waiting(), 0, "taken back");
        drop(parked);
    }
}

/// On a real server (`IDEM_TEST_POSTGRES_URL`): a confirmation asked while a pending batch
/// is on its way is written by that batch's transaction, or on its own when the batch's
/// transaction does not commit. The batch is held at its `COPY` by another transaction
/// that inserted its first key, uncommitted, and rolls it back once the confirmation
/// waits in the queue.
#[cfg(test)]
mod on_a_server {
    use std::time::Duration;

    use chrono::Utc;
    use sqlx::Connection;

    use super::super::PostgresStore;
    use crate::store::{
        BatchTurn, EventKeyStore, EventMark, EventVerdict, PendingBatch, TurnStarted,
    };

    struct Scene {
        store: PostgresStore,
        url: String,
        namespace: String,
        row: String,
    }

    async fn scene(name: &str) -> Option<Scene> {
        let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") else {
            eprintln!("skipped: IDEM_TEST_POSTGRES_URL is not set");
            return None;
        };
        // A batch asked ahead waits for the one before it no longer than half the
        // session's `deadlock_timeout`: a minute here, so that the batches these tests
        // hold never give up on a busy machine.
        let sep = if url.contains('?') { '&' } else { '?' };
        let patient = format!("{url}{sep}options=-c%20deadlock_timeout%3D120s");
        let store = PostgresStore::connect_sized(&patient, 4).await.unwrap();
        let timeout: String = sqlx::query_scalar("SHOW deadlock_timeout")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(timeout, "2min");
        let namespace = format!(
            "riders-{name}-{}-{}",
            std::process::id(),
            Utc::now().timestamp_micros()
        );
        let row = format!("{namespace}/row");
        Some(Scene {
            store,
            url,
            namespace,
            row,
        })
    }

    fn marks(keys: &[&str]) -> Vec<EventMark> {
        keys.iter()
            .map(|k| EventMark::key(*k).ttl(Duration::from_secs(3600)))
            .collect()
    }

    fn marker(scene: &Scene, place: u64) -> String {
        format!(r#"{{"idem_pending":"{}/{place}"}}"#, scene.namespace)
    }

    /// Batch 0 of the row, in its turn: keys `a1`, `a2`, new.
    async fn mark_first(scene: &Scene) {
        let marker = marker(scene, 0);
        let batch = PendingBatch {
            marker: &marker,
            timeout: Duration::from_secs(600),
            turn: Some(BatchTurn {
                row: &scene.row,
                place: 0,
                started: TurnStarted::nobody(),
            }),
        };
        let verdicts = scene
            .store
            .check_and_mark_pending(
                &scene.namespace,
                &marks(&["a1", "a2"]),
                Utc::now(),
                batch,
                None,
            )
            .await
            .unwrap();
        assert_eq!(verdicts, vec![EventVerdict::New; 2]);
    }

    async fn pending_rows(scene: &Scene, marker: &str) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM event_pending WHERE namespace = $1 AND marker = $2",
        )
        .bind(&scene.namespace)
        .bind(marker)
        .fetch_one(scene.store.pool())
        .await
        .unwrap()
    }

    /// A transaction holding `key` inserted and not committed: a batch with that key waits
    /// for it at its `COPY` (the key's unique check) until it is rolled back.
    struct Holder {
        conn: sqlx::PgConnection,
        pid: i32,
    }

    async fn hold(scene: &Scene, key: &str) -> Holder {
        let mut conn = sqlx::PgConnection::connect(&scene.url).await.unwrap();
        sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
        sqlx::query(
            "INSERT INTO event_keys (namespace, event_key, first_seen) VALUES ($1, $2, now())",
        )
        .bind(&scene.namespace)
        .bind(key)
        .execute(&mut conn)
        .await
        .unwrap();
        let pid = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        Holder { conn, pid }
    }

    impl Holder {
        /// Until a batch waits for this transaction (only this test's batches can: the key
        /// is in its namespace).
        async fn waited_for(&self, scene: &Scene) {
            until_a_backend(scene, "$1 = ANY(pg_blocking_pids(pid))", self.pid).await;
        }

        async fn release(mut self) {
            sqlx::query("ROLLBACK")
                .execute(&mut self.conn)
                .await
                .unwrap();
        }
    }

    /// Until some backend of the server matches `condition` (of `pid`, its `$1`).
    async fn until_a_backend(scene: &Scene, condition: &str, pid: i32) {
        let mut watcher = sqlx::PgConnection::connect(&scene.url).await.unwrap();
        let sql = format!("SELECT count(*) FROM pg_stat_activity WHERE {condition}");
        loop {
            let found: i64 = sqlx::query_scalar(&sql)
                .bind(pid)
                .fetch_one(&mut watcher)
                .await
                .unwrap();
            if found > 0 {
                return;
            }
            tokio::task::yield_now().await;
        }
    }

    type Marking = tokio::task::JoinHandle<crate::Result<Option<Vec<EventVerdict>>>>;

    /// Batch `place` of `keys`, asked ahead of its turn or in it (verdicts `None`: refused
    /// ahead of its turn), as a task.
    fn mark(scene: &Scene, place: u64, ahead: bool, keys: &[&str]) -> Marking {
        let (store, namespace, row) = (
            scene.store.clone(),
            scene.namespace.clone(),
            scene.row.clone(),
        );
        let (marks, marker) = (marks(keys), marker(scene, place));
        tokio::spawn(async move {
            let batch = PendingBatch {
                marker: &marker,
                timeout: Duration::from_secs(600),
                turn: Some(BatchTurn {
                    row: &row,
                    place,
                    started: TurnStarted::nobody(),
                }),
            };
            let now = Utc::now();
            if ahead {
                store
                    .check_and_mark_pending_ahead(&namespace, &marks, now, batch)
                    .await
            } else {
                store
                    .check_and_mark_pending(&namespace, &marks, now, batch, None)
                    .await
                    .map(Some)
            }
        })
    }

    /// The whole confirmation of batch `place` (its keys `of`), as a task, once it waits
    /// in the queue (not at a connection's turn, nor written on its own): within a
    /// minute, or the test fails rather than hangs.
    async fn confirm_queued(
        scene: &Scene,
        place: u64,
        of: &[&str],
    ) -> tokio::task::JoinHandle<crate::Result<u64>> {
        let confirming = {
            let (store, namespace) = (scene.store.clone(), scene.namespace.clone());
            let marker = marker(scene, place);
            let keys: Vec<(String, Option<chrono::DateTime<Utc>>)> =
                of.iter().map(|k| (k.to_string(), None)).collect();
            tokio::spawn(async move {
                store
                    .confirm_pending_batch(&namespace, &marker, &keys, true)
                    .await
            })
        };
        let queued = tokio::time::timeout(Duration::from_secs(60), async {
            while scene.store.riders.waiting() == 0 && !confirming.is_finished() {
                tokio::task::yield_now().await;
            }
        });
        assert!(
            queued.await.is_ok() && scene.store.riders.waiting() == 1,
            "the confirmation did not wait for the batch on its way"
        );
        confirming
    }

    /// Batch `place` (`keys`, asked ahead of its turn or in it) marked while the batch at
    /// `confirmed` (its keys `of`) is confirmed whole: its verdicts (`None`: refused ahead
    /// of its turn) and what the confirmation answered.
    async fn mark_while_confirming(
        scene: &Scene,
        place: u64,
        ahead: bool,
        keys: &[&str],
        confirmed: u64,
        of: &[&str],
    ) -> (Option<Vec<EventVerdict>>, u64) {
        let holder = hold(scene, keys[0]).await;
        let marking = mark(scene, place, ahead, keys);
        holder.waited_for(scene).await;
        assert_eq!(scene.store.riders.open(), 1, "the batch on its way carries");
        let confirming = confirm_queued(scene, confirmed, of).await;
        holder.release().await;
        let verdicts = marking.await.unwrap().unwrap();
        let confirmed = confirming.await.unwrap().unwrap();
        assert_eq!(scene.store.riders.waiting(), 0);
        (verdicts, confirmed)
    }

    /// Batch 2, asked ahead, waits for batch 1's transaction (its lock) and moves the row
    /// after it, from the place batch 1 committed, which its statement's snapshot, taken
    /// before batch 1 committed, does not hold; the confirmation of batch 0 rides in it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_asked_ahead_moves_the_row_after_the_one_before_it_commits() {
        let Some(scene) = scene("wait").await else {
            return;
        };
        mark_first(&scene).await;
        let (one, two) = (hold(&scene, "b1").await, hold(&scene, "c1").await);
        let first = mark(&scene, 1, false, &["b1", "b2"]);
        one.waited_for(&scene).await;
        let second = mark(&scene, 2, true, &["c1", "c2"]);
        two.waited_for(&scene).await;
        let confirming = confirm_queued(&scene, 0, &["a1", "a2"]).await;
        // Batch 2 takes the confirmation and waits for batch 1, still held at its COPY.
        two.release().await;
        while scene.store.riders.waiting() > 0 {
            tokio::task::yield_now().await;
        }
        // A batch waiting for another than the holder: batch 2 for batch 1.
        until_a_backend(
            &scene,
            "cardinality(pg_blocking_pids(pid)) > 0 AND NOT $1 = ANY(pg_blocking_pids(pid))",
            one.pid,
        )
        .await;
        assert!(!second.is_finished(), "batch 2 waits for batch 1");
        one.release().await;
        let new = |n| Some(vec![EventVerdict::New; n]);
        assert_eq!(first.await.unwrap().unwrap(), new(2));
        assert_eq!(second.await.unwrap().unwrap(), new(2), "not refused");
        assert_eq!(confirming.await.unwrap().unwrap(), 2);
        assert_eq!(scene.store.riders.carried_count(), 1);
        assert_eq!(pending_rows(&scene, &marker(&scene, 0)).await, 0);
        let place: i64 = sqlx::query_scalar("SELECT place FROM event_turns WHERE row_id = $1")
            .bind(&scene.row)
            .fetch_one(scene.store.pool())
            .await
            .unwrap();
        assert_eq!(place, 2, "the row's last place");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_confirmation_rides_in_the_batch_on_its_way_in_its_turn_or_ahead() {
        let Some(scene) = scene("ride").await else {
            return;
        };
        let (first, second, third) = (marker(&scene, 0), marker(&scene, 1), marker(&scene, 2));
        let new = |n| Some(vec![EventVerdict::New; n]);
        mark_first(&scene).await;
        // In its turn: batch 1 carries batch 0's confirmation.
        let (verdicts, confirmed) =
            mark_while_confirming(&scene, 1, false, &["b1", "b2", "b3"], 0, &["a1", "a2"]).await;
        assert_eq!((verdicts, confirmed), (new(3), 2));
        assert_eq!(scene.store.riders.carried_count(), 1, "written by batch 1");
        assert_eq!(pending_rows(&scene, &first).await, 0, "batch 0 confirmed");
        assert_eq!(pending_rows(&scene, &second).await, 1, "batch 1 pending");
        // Ahead of its turn: batch 2 carries batch 1's.
        let (verdicts, confirmed) =
            mark_while_confirming(&scene, 2, true, &["c1"], 1, &["b1", "b2", "b3"]).await;
        assert_eq!((verdicts, confirmed), (new(1), 3));
        assert_eq!(scene.store.riders.carried_count(), 2, "written by batch 2");
        assert_eq!(pending_rows(&scene, &second).await, 0, "batch 1 confirmed");
        assert_eq!(pending_rows(&scene, &third).await, 1, "batch 2 pending");
        // A batch confirmed already: nothing left to confirm, by either way.
        let (verdicts, confirmed) =
            mark_while_confirming(&scene, 3, true, &["d1"], 1, &["b1", "b2", "b3"]).await;
        assert_eq!((verdicts, confirmed), (new(1), 0));
        assert_eq!(scene.store.riders.carried_count(), 2);
    }

    /// A batch asked ahead of a turn that is not next is refused: its transaction, rolled
    /// back, deletes nothing, and the confirmation it carried is written on its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_confirmation_whose_carrier_is_refused_is_written_on_its_own() {
        let Some(scene) = scene("refused").await else {
            return;
        };
        let first = marker(&scene, 0);
        mark_first(&scene).await;
        // Place 5 asked ahead while the row's last place is 0.
        let (verdicts, confirmed) =
            mark_while_confirming(&scene, 5, true, &["x1", "x2"], 0, &["a1", "a2"]).await;
        assert_eq!((verdicts, confirmed), (None, 2));
        assert_eq!(scene.store.riders.carried_count(), 0, "written on its own");
        assert_eq!(pending_rows(&scene, &first).await, 0, "batch 0 confirmed");
        assert_eq!(
            pending_rows(&scene, &marker(&scene, 5)).await,
            0,
            "rolled back"
        );
    }
}
