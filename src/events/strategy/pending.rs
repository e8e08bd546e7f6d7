//! A gate's pending marks: its batches' markers ([`PendingMarks`]) and the order they
//! mark their keys in ([`MarkTurn`]), and the wait for keys pending for another gate
//! (`settle_pending`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::store::{EventKeyStore, EventMark, EventVerdict, PendingBatch, TurnStarted};

/// Where a batch's pending marks go in the order of its gate's batches: after the batch
/// before it has marked its keys, or ended without marking (`after` answers), and before
/// the next one (`done`; a turn dropped unused is passed on in order, see `Drop`).
///
/// A batch that finds keys pending for another gate waits for that gate to confirm them,
/// which it does once their records are out, after every earlier batch of its own: were a
/// gate's batches marked in another order than their records are written, two gates
/// could each wait for the other for good. Marked in order, every wait is for a batch
/// marked earlier, and no wait goes round.
///
/// A store that keeps a row's order itself
/// ([`Capabilities::marks_ahead`](crate::store::Capabilities::marks_ahead)) lets a batch
/// mark before its turn has come, when the batch just before it is the last of the row
/// that marked: the order is the same, without one batch's round trip waiting for the
/// other's.
#[derive(Debug, Default)]
pub struct MarkTurn {
    after: Option<tokio::sync::oneshot::Receiver<()>>,
    done: Option<tokio::sync::oneshot::Sender<()>>,
    /// The row and the batch's place in it (`None`: a batch alone).
    place: Option<(Arc<str>, u64)>,
    /// Said once the batch before it may be waited for by this one asked ahead of its
    /// turn ([`BatchTurn::started`](crate::store::BatchTurn::started)).
    started_before: Option<tokio::sync::oneshot::Receiver<()>>,
    /// This batch's own such signal, for the batch after it (said when dropped at the
    /// latest).
    started: Arc<TurnStarted>,
    /// Its row's [`MarkTurns::stop_waiting`] (`None`: a batch alone, which always waits).
    stop: Option<CancellationToken>,
    /// Its row's [`MarkTurns::interrupted_by`] (`None`: a batch alone).
    interrupt: Option<CancellationToken>,
}

impl MarkTurn {
    /// The turns of a row of batches, each after the one before: give [`next_turn`](MarkTurns::next_turn)
    /// to each batch in order.
    pub fn row() -> MarkTurns {
        MarkTurns {
            last: None,
            last_started: None,
            row: uuid::Uuid::new_v4().to_string().into(),
            next: 0,
            stop: CancellationToken::new(),
            interrupt: CancellationToken::new(),
        }
    }

    /// Whether its row gave up waiting on other gates ([`MarkTurns::stop_waiting`]).
    pub(super) fn stop(&self) -> Option<&CancellationToken> {
        self.stop.as_ref()
    }

    /// Whether its row was interrupted ([`MarkTurns::interrupted_by`]).
    pub(super) fn interrupted(&self) -> Option<&CancellationToken> {
        self.interrupt.as_ref()
    }

    /// The row and the batch's place in it, as the store is told
    /// ([`PendingBatch::turn`](crate::store::PendingBatch::turn)), and its signal to the
    /// next batch ([`BatchTurn::started`](crate::store::BatchTurn::started)).
    pub(super) fn place(&self) -> Option<(Arc<str>, u64, Arc<TurnStarted>)> {
        self.place
            .as_ref()
            .map(|(row, place)| (row.clone(), *place, self.started.clone()))
    }

    /// Waits until the batch before it has said it may be waited for
    /// ([`BatchTurn::started`](crate::store::BatchTurn::started)): before asking ahead of
    /// its turn, holding nothing.
    pub(super) async fn wait_started(&mut self) {
        if let Some(before) = self.started_before.as_mut() {
            let _ = before.await;
            self.started_before = None;
        }
    }

    /// Whether a batch before it in its row may still be marking (its turn has not come).
    pub(super) fn is_waiting(&self) -> bool {
        self.after.is_some()
    }

    pub(super) async fn wait(&mut self) {
        if let Some(after) = self.after.as_mut() {
            // Dropped unsent (outside a runtime): go on all the same. Kept until it
            // answered, so a wait cancelled midway still passes the turn on in order.
            let _ = after.await;
            self.after = None;
        }
    }

    /// Passes the turn on: the batch has marked, or never will (a batch answered by a
    /// read), and the next batch's turn comes once the one before this one's has passed
    /// too (at once when this one waited for it), while this one waits for neither. A
    /// turn dropped unsent would let the next batch go at once, out of order.
    pub(super) fn pass_on(&mut self) {
        self.started.say();
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
    last_started: Option<tokio::sync::oneshot::Receiver<()>>,
    /// The row's own name (unique: a UUID).
    row: Arc<str>,
    /// The place of the next batch.
    next: u64,
    /// Cancelled by [`stop_waiting`](Self::stop_waiting).
    stop: CancellationToken,
    /// Cancelled with the token given to [`interrupted_by`](Self::interrupted_by).
    interrupt: CancellationToken,
}

impl MarkTurns {
    /// The turn of the next batch: after the one handed out before.
    pub fn next_turn(&mut self) -> MarkTurn {
        let (done, after) = tokio::sync::oneshot::channel();
        let (started, started_after) = tokio::sync::oneshot::channel();
        let place = self.next;
        self.next += 1;
        MarkTurn {
            after: self.last.replace(after),
            done: Some(done),
            place: Some((self.row.clone(), place)),
            started_before: self.last_started.replace(started_after),
            started: Arc::new(TurnStarted::to(started)),
            stop: Some(self.stop.clone()),
            interrupt: Some(self.interrupt.clone()),
        }
    }

    /// The row is interrupted once `stop` is cancelled (the gate was asked to stop: a
    /// signal): a batch of the row that waits on keys pending for another gate stops
    /// waiting and fails (its records cannot be written without their verdicts), so the
    /// stream ends there, its lines and the later ones without records and what they
    /// marked taken back, instead of waiting on until the other gate's marks expire.
    /// Batches that wait for nothing are written as before. Before the row's first turn.
    pub fn interrupted_by(mut self, stop: &CancellationToken) -> Self {
        self.interrupt = stop.child_token();
        self
    }

    /// The row's batches whose records will not be written (an earlier batch failed, or
    /// the output closed) stop waiting on keys pending for other gates: their calls end
    /// with those keys as they found them, and what they marked can be taken back at
    /// once. Waiting on could last until the other gate's marks expire, and that gate may
    /// itself be waiting on keys of this gate's failed batch (no wait goes round while
    /// every batch is written; a failed one never is).
    pub fn stop_waiting(&self) {
        self.stop.cancel();
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
    /// A batch waited on keys pending for another gate (said once a gate).
    pub(super) said_waiting: AtomicBool,
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

impl super::EventGate {
    /// Resolves the verdicts of a pending-marking call: a key pending for this gate (an
    /// earlier batch of it, whose record comes first) is a replay; a key pending for
    /// another gate is asked again, after a pause, until that gate confirmed it (a replay
    /// or conflict) or its mark expired (new here, pending for this gate). A key asked
    /// again is marked at the time of that call, which goes into `marked_at`. Once `stop`
    /// is cancelled ([`MarkTurns::stop_waiting`]: the batch will not be written), the
    /// verdicts are returned as they stand, keys pending for another gate among them.
    /// Once `interrupt` is ([`MarkTurns::interrupted_by`]: a signal), a batch still waiting
    /// fails with [`Error::Interrupted`].
    pub(super) async fn settle_pending(
        &self,
        p: &PendingMarks,
        batch: PendingBatch<'_>,
        marks: &[EventMark],
        mut verdicts: Vec<EventVerdict>,
        marked_at: &mut [DateTime<Utc>],
        (stop, interrupt): (Option<&CancellationToken>, Option<&CancellationToken>),
    ) -> Result<Vec<EventVerdict>> {
        let namespace = self.dedup.namespace();
        let mut pause = Duration::from_millis(50);
        loop {
            let mut waiting: Vec<usize> = Vec::new();
            for (i, v) in verdicts.iter_mut().enumerate() {
                if let EventVerdict::Replay {
                    decision: Some(d), ..
                } = v
                {
                    if p.is_mine(d) {
                        if let EventVerdict::Replay { decision, .. } = v {
                            *decision = None;
                        }
                    } else if is_pending_marker(d) {
                        waiting.push(i);
                    }
                }
            }
            if waiting.is_empty() {
                return Ok(verdicts);
            }
            if !p.said_waiting.swap(true, Ordering::Relaxed) {
                // Said once a gate: a wait can last the whole pending timeout. Not a
                // warning: two live gates on the same events wait on each other briefly.
                tracing::info!(
                    target: "idem::gate_wait",
                    "{} key(s) of a batch are pending for another gate (running, or dead \
                     since): waiting up to {} for it to confirm them or for their marks to \
                     expire",
                    waiting.len(),
                    humantime::format_duration(p.timeout)
                );
            }
            tracing::debug!(
                keys = waiting.len(),
                "keys pending for another gate: waiting for it to confirm them or for their marks to expire"
            );
            let never = CancellationToken::new();
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = stop.unwrap_or(&never).cancelled() => return Ok(verdicts),
                () = interrupt.unwrap_or(&never).cancelled() => {
                    self.take_back_new(marks, &verdicts, marked_at).await;
                    return Err(Error::Interrupted(format!(
                        "stopped while {} key(s) waited for another gate to confirm them \
                         (their marks expire within {}): this batch's lines and those after \
                         them have no record",
                        waiting.len(),
                        humantime::format_duration(p.timeout)
                    )));
                }
            }
            pause = (pause * 2).min(Duration::from_secs(1));
            let again: Vec<EventMark> = waiting.iter().map(|&i| marks[i].clone()).collect();
            let at = Utc::now();
            let answers = self
                .breaker
                .check_and_mark_pending(namespace, &again, at, batch, None)
                .await?;
            for (&i, v) in waiting.iter().zip(answers) {
                verdicts[i] = v;
                marked_at[i] = at;
            }
        }
    }

    /// Takes back what a batch that will not be written marked new (each key by the time
    /// its call marked it), so another gate does not wait on marks of a batch that failed;
    /// what cannot be taken back expires with the pending timeout.
    async fn take_back_new(
        &self,
        marks: &[EventMark],
        verdicts: &[EventVerdict],
        marked_at: &[DateTime<Utc>],
    ) {
        let mut by_time: Vec<(DateTime<Utc>, Vec<String>)> = Vec::new();
        for ((m, v), at) in marks.iter().zip(verdicts).zip(marked_at) {
            if !v.is_new() {
                continue;
            }
            match by_time.iter_mut().find(|(t, _)| t == at) {
                Some((_, keys)) => keys.push(m.key.clone()),
                None => by_time.push((*at, vec![m.key.clone()])),
            }
        }
        for (at, keys) in by_time {
            if let Err(e) = self.unmark(&keys, at).await {
                tracing::warn!(
                    "{} key(s) of a stopped batch stay marked pending until they expire: {e}",
                    keys.len()
                );
            }
        }
    }
}
