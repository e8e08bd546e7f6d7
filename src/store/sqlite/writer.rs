//! What the event-key writers of one store share: their turn at the write transaction,
//! the confirmations that ride in a writer's transaction ([`Riders`]), and the gates' rows
//! of batches ([`RowPlaces`]).

use std::sync::atomic::AtomicBool;

use super::*;

/// What the event-key batches of one store share: their turn at the write transaction,
/// whether the last batch found none of its keys stored, the confirmations waiting to ride
/// in a write, and the gates' rows of batches.
#[derive(Debug, Default)]
pub(super) struct EventWriter {
    /// Held while a batch writes (its all-or-nothing insert, or `BEGIN IMMEDIATE` to
    /// `COMMIT`): this process's batches take turns here, in the order they asked,
    /// instead of in SQLite's busy handler (which sleeps whole milliseconds); other
    /// processes still wait on the database's lock. Reads do not take it.
    turn: tokio::sync::Mutex<()>,
    /// The last batch found none of its keys stored: the next one is tried as one
    /// all-or-nothing insert of every key (fresh keys come in runs), not read first.
    pub(super) fresh: AtomicBool,
    /// The last batch marked found some of its keys stored and others not: the next one is
    /// not tried ahead of its turn (its all-or-nothing insert would most likely fail).
    pub(super) mixed: AtomicBool,
    /// Whole-batch confirmations waiting for a write transaction to ride in
    /// ([`Riders`]): the next writer to take the turn deletes their rows in its own
    /// transaction, so a confirmation costs no commit of its own while batches are marked.
    confirms: std::sync::Mutex<Vec<Rider>>,
    /// The rows of batches written here and their last place marked (marks ahead of a
    /// batch's turn).
    pub(super) rows: RowPlaces,
}

impl EventWriter {
    /// Waits for the writers' turn, in the order asked.
    pub(super) async fn take_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.turn.lock().await
    }

    /// Queues a whole-batch confirmation for the next writer's transaction.
    pub(super) fn queue(&self, rider: Rider) {
        lock(&self.confirms).push(rider);
    }
}

/// What a whole-batch confirmation hears: whether the batch's row was deleted, or why it
/// was not written.
pub(super) type Answer = std::result::Result<bool, String>;

/// What a confirmation that was never written hears.
pub(super) const UNWRITTEN: &str = "a pending batch's confirmation was never written";

/// A whole-batch confirmation waiting for a write transaction to ride in.
#[derive(Debug)]
pub(super) struct Rider {
    pub(super) namespace: String,
    pub(super) marker: String,
    /// Whether the batch's row was deleted, once the transaction committed; or why not.
    pub(super) done: tokio::sync::oneshot::Sender<Answer>,
}

/// The confirmations a writer took from the queue into its transaction: each answered
/// once it committed ([`answer`](Self::answer)), put back when the transaction was undone
/// ([`put_back`](Self::put_back)), or told the error when dropped unanswered (a
/// confirmation's own statement failed, or its caller went away).
pub(super) struct Riders {
    riders: Vec<Rider>,
    pub(super) error: String,
}

impl Riders {
    /// Every confirmation waiting now.
    pub(super) fn take(writer: &EventWriter) -> Self {
        let riders = std::mem::take(&mut *lock(&writer.confirms));
        Riders {
            riders,
            error: "the write transaction it was confirmed in failed".to_string(),
        }
    }

    /// Whether any confirmation waits.
    pub(super) fn is_empty(&self) -> bool {
        self.riders.is_empty()
    }

    /// The `?` of [`RIDERS_DELETE_SQL`]: their batches as `[namespace, marker]` pairs.
    pub(super) fn json(&self) -> String {
        let pairs: Vec<[&str; 2]> = self
            .riders
            .iter()
            .map(|r| [r.namespace.as_str(), r.marker.as_str()])
            .collect();
        serde_json::to_string(&pairs).unwrap_or_default()
    }

    /// The transaction committed: each hears whether its row was deleted (`rows`: what
    /// [`RIDERS_DELETE_SQL`] returned, among others of the same string).
    pub(super) fn answer(mut self, rows: &[sqlx::sqlite::SqliteRow]) {
        let deleted: HashSet<(String, String)> = rows
            .iter()
            .filter_map(|row| {
                let namespace: String = row.try_get("namespace").ok()?;
                let marker: String = row.try_get("marker").ok()?;
                Some((namespace, marker))
            })
            .collect();
        for r in self.riders.drain(..) {
            let found = deleted.contains(&(r.namespace, r.marker));
            let _ = r.done.send(Ok(found));
        }
    }

    /// The transaction was undone (refused, or failed): back in the queue, for the next
    /// writer or their own callers (they wait for the turn this writer still holds).
    pub(super) fn put_back(mut self, writer: &EventWriter) {
        lock(&writer.confirms).extend(self.riders.drain(..));
    }

    /// Every confirmation but those of batch `marker` of `namespace` back in the queue:
    /// the statement of that batch's own caller failed, which is its error only.
    pub(super) fn put_back_others(&mut self, writer: &EventWriter, namespace: &str, marker: &str) {
        let (own, others): (Vec<Rider>, Vec<Rider>) = self
            .riders
            .drain(..)
            .partition(|r| r.namespace == namespace && r.marker == marker);
        self.riders = own;
        lock(&writer.confirms).extend(others);
    }
}

impl Drop for Riders {
    fn drop(&mut self) {
        for r in self.riders.drain(..) {
            let _ = r.done.send(Err(self.error.clone()));
        }
    }
}

/// The queue's lock (a panic elsewhere does not make it unusable: it holds no invariant).
fn lock(m: &std::sync::Mutex<Vec<Rider>>) -> std::sync::MutexGuard<'_, Vec<Rider>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The last place marked in each of the newest rows of batches this store has written
/// (`BatchTurn::row`; a gate's batches form one row), so that a batch asked ahead of its
/// turn is marked only right after the batch before it
/// ([`EventKeyStore::check_and_mark_pending_ahead`]). Read and moved by writers holding the
/// turn ([`EventWriter::turn`]), in the order they took it. A row is one gate's, in one
/// process, so this store's memory is where its order is kept: a row this store does not
/// know (another instance marked it, or it was pushed out by newer ones) answers "not
/// after", and its batch waits for its turn, which costs time, never order.
#[derive(Debug, Default)]
pub(super) struct RowPlaces(std::sync::Mutex<std::collections::VecDeque<(String, u64)>>);

impl RowPlaces {
    /// How many rows are kept (a process runs a few gates at once, rarely more).
    const KEPT: usize = 64;

    /// Whether `turn`'s place comes right after its row's last place marked.
    pub(super) fn follows(&self, turn: &BatchTurn<'_>) -> bool {
        let rows = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let last = rows.iter().find(|(row, _)| row == turn.row).map(|r| r.1);
        matches!((last, turn.place.checked_sub(1)), (Some(last), Some(before)) if last == before)
    }

    /// `turn`'s batch has marked (or has had its turn): its place is its row's last, never
    /// going back.
    pub(super) fn marked(&self, turn: &BatchTurn<'_>) {
        let mut rows = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match rows.iter().position(|(row, _)| row == turn.row) {
            Some(i) => rows[i].1 = rows[i].1.max(turn.place),
            None => {
                rows.push_front((turn.row.to_string(), turn.place));
                rows.truncate(Self::KEPT);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TurnStarted;

    fn turn(row: &str, place: u64) -> BatchTurn<'_> {
        BatchTurn {
            row,
            place,
            started: TurnStarted::nobody(),
        }
    }

    /// A place follows only the row's last place marked; a row pushed out by newer ones is
    /// one this store does not know, whose batches then wait for their turn.
    #[test]
    fn a_place_follows_only_its_rows_last_place_marked() {
        let rows = RowPlaces::default();
        assert!(!rows.follows(&turn("a", 0)), "nothing before place 0");
        assert!(!rows.follows(&turn("a", 1)), "a row not seen yet");
        rows.marked(&turn("a", 0));
        assert!(rows.follows(&turn("a", 1)));
        assert!(!rows.follows(&turn("a", 2)));
        assert!(!rows.follows(&turn("b", 1)), "another row");
        rows.marked(&turn("a", 3));
        rows.marked(&turn("a", 1));
        assert!(rows.follows(&turn("a", 4)), "a place never goes back");
        let newer: Vec<String> = (0..RowPlaces::KEPT).map(|n| format!("r{n}")).collect();
        for row in &newer {
            rows.marked(&turn(row, 0));
        }
        assert!(!rows.follows(&turn("a", 4)), "pushed out by newer rows");
        assert!(rows.follows(&turn(&newer[0], 1)));
    }

    /// A confirmation that rode in a batch's write which then failed (any failure, not
    /// only a refusal) goes back to the queue and is written on its own: before, it was
    /// told the batch's error, and its keys stayed pending for other gates to wait on
    /// until they expired.
    #[tokio::test]
    async fn a_confirmation_riding_in_a_failed_write_is_written_on_its_own() {
        use crate::store::{EventKeyStore, EventMark, PendingBatch};
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("events.db").display());
        let store = Arc::new(SqliteStore::connect_sized(&url, 2).await.unwrap());
        const FIRST: &str = r#"{"idem_pending":"gate/0"}"#;
        const SECOND: &str = r#"{"idem_pending":"gate/1"}"#;
        let batch = |marker| PendingBatch {
            marker,
            timeout: std::time::Duration::from_secs(600),
            turn: None,
        };
        let now = Utc::now();
        let first = store
            .check_and_mark_pending("t", &[EventMark::key("a")], now, batch(FIRST), None)
            .await
            .unwrap();
        assert_eq!(first, [EventVerdict::New]);
        // The second batch's write fails, as a full disk or a lock held past the busy
        // timeout would (not a refusal: no key of it is stored).
        sqlx::query(&format!(
            "CREATE TRIGGER fail_second BEFORE INSERT ON event_pending \
             WHEN NEW.marker = '{SECOND}' BEGIN SELECT RAISE(ABORT, 'no room'); END"
        ))
        .execute(&store.pool)
        .await
        .unwrap();
        // The second batch waits for the writers' turn first, then the first batch's
        // confirmation is queued: the second batch takes it into its write.
        let turn = store.events.take_turn().await;
        let carrier = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .check_and_mark_pending("t", &[EventMark::key("b")], now, batch(SECOND), None)
                    .await
            }
        });
        tokio::task::yield_now().await;
        let confirmation = tokio::spawn({
            let store = store.clone();
            async move {
                store
                    .confirm_pending_batch("t", FIRST, &[("a".to_string(), None)], true)
                    .await
            }
        });
        while lock(&store.events.confirms).is_empty() {
            tokio::task::yield_now().await;
        }
        drop(turn);
        let carried = carrier.await.unwrap();
        assert!(
            carried
                .as_ref()
                .is_err_and(|e| e.to_string().contains("no room")),
            "{carried:?}"
        );
        let confirmed = confirmation.await.unwrap();
        assert_eq!(
            confirmed.unwrap(),
            1,
            "the first batch confirmed on its own"
        );
        let found = store
            .check_and_mark("t", &[EventMark::key("a")], Utc::now())
            .await
            .unwrap();
        assert!(
            matches!(&found[..], [EventVerdict::Replay { decision: None, .. }]),
            "`a` confirmed, not pending: {found:?}"
        );
    }
}
