//! A gate's pending marks: its batches' markers ([`PendingMarks`]) and the order they
//! mark their keys in ([`MarkTurn`]).

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use serde_json::Value;

/// Where a batch's pending marks go in the order of its gate's batches: after the batch
/// before it has marked its keys, or ended without marking (`after` answers), and before
/// the next one (`done`; a turn dropped unused is passed on in order, see `Drop`).
///
/// A batch that finds keys pending for another gate waits for that gate to confirm them,
/// which it does once their records are out, after every earlier batch of its own: were a
/// gate's batches marked in another order than their records are written, two gates
/// could each wait for the other for good. Marked in order, every wait is for a batch
/// marked earlier, and no wait goes round.
#[derive(Debug, Default)]
pub struct MarkTurn {
    after: Option<tokio::sync::oneshot::Receiver<()>>,
    done: Option<tokio::sync::oneshot::Sender<()>>,
}

impl MarkTurn {
    /// The turns of a row of batches, each after the one before: give [`next_turn`](MarkTurns::next_turn)
    /// to each batch in order.
    pub fn row() -> MarkTurns {
        MarkTurns { last: None }
    }

    pub(super) async fn wait(&mut self) {
        if let Some(after) = self.after.as_mut() {
            // Dropped unsent (outside a runtime): go on all the same. Kept until it
            // answered, so a wait cancelled midway still passes the turn on in order.
            let _ = after.await;
            self.after = None;
        }
    }

    pub(super) fn done(&mut self) {
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
    }

    /// Passes the turn on without marking (a batch answered by a read): the next batch
    /// still marks after the one before this one, but this one waits for neither. A turn
    /// dropped unsent would let the next batch go at once, out of order.
    pub(super) fn pass_on(&mut self) {
        match (self.after.take(), self.done.take()) {
            (Some(after), Some(done)) => {
                // Outside a runtime (a turn dropped there) nothing can wait: both go.
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        let _ = after.await;
                        let _ = done.send(());
                    });
                }
            }
            (None, Some(done)) => {
                let _ = done.send(());
            }
            _ => {}
        }
    }
}

/// A turn dropped unused (its batch's call cancelled, or it marked nothing) is passed on,
/// not dropped: the batch after it still waits for the one before it.
impl Drop for MarkTurn {
    fn drop(&mut self) {
        self.pass_on();
    }
}

/// A row of [`MarkTurn`]s (see [`MarkTurn::row`]).
#[derive(Debug)]
pub struct MarkTurns {
    last: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl MarkTurns {
    /// The turn of the next batch: after the one handed out before.
    pub fn next_turn(&mut self) -> MarkTurn {
        let (done, after) = tokio::sync::oneshot::channel();
        MarkTurn {
            after: self.last.replace(after),
            done: Some(done),
        }
    }
}

/// How a gate marks keys pending (see [`EventGate::pending`]).
#[derive(Debug)]
pub(super) struct PendingMarks {
    /// The gate's token: a batch's marker is `{"idem_pending": "TOKEN/N"}`, N the batch's
    /// number, so a key pending for an earlier batch of this gate is told from one pending
    /// for another gate.
    pub(super) token: String,
    /// The number of the next batch.
    pub(super) batches: AtomicU64,
    /// How long a pending mark lives unconfirmed.
    pub(super) timeout: Duration,
    /// The last batch marked was settled replays only ([`is_settled`]): the next is first
    /// read ([`EventKeyStore::check_all_marked`](crate::store::EventKeyStore::check_all_marked)),
    /// and answered without its turn when it is settled too.
    pub(super) settled: AtomicBool,
}

impl PendingMarks {
    /// Batch `n`'s marker, as the stores keep it (compact JSON).
    pub(super) fn marker(&self, n: u64) -> String {
        serde_json::json!({ PENDING_FIELD: format!("{}/{n}", self.token) }).to_string()
    }

    /// Whether a stored decision is the marker of a batch of this gate.
    pub(super) fn is_mine(&self, decision: &Value) -> bool {
        decision
            .get(PENDING_FIELD)
            .and_then(Value::as_str)
            .and_then(|t| t.strip_prefix(self.token.as_str()))
            .is_some_and(|rest| rest.starts_with('/'))
    }
}

/// The name of the pending marker's one field.
pub(super) const PENDING_FIELD: &str = "idem_pending";

/// Whether a verdict needs no turn: a replay against a mark that is pending for no batch
/// (of this gate or another), or a conflict (which never waits either: `settle_pending`
/// waits on replays only). A batch of such verdicts marks nothing and waits for no one,
/// so it cannot be part of a wait between gates ([`MarkTurn`]).
pub(super) fn is_settled(verdict: &crate::store::EventVerdict) -> bool {
    match verdict {
        crate::store::EventVerdict::New => false,
        crate::store::EventVerdict::Replay { decision, .. } => {
            !decision.as_ref().is_some_and(is_pending_marker)
        }
        crate::store::EventVerdict::Conflict { .. } => true,
    }
}

/// Whether a stored decision is some gate's pending marker.
pub(super) fn is_pending_marker(decision: &Value) -> bool {
    decision
        .as_object()
        .is_some_and(|o| o.len() == 1 && o.get(PENDING_FIELD).is_some_and(Value::is_string))
}
