//! What to do when the store fails (seed 001's strategies), a circuit breaker so a dead
//! store is not hammered, and the numbers an operator watches: [`EventGate`] wraps a
//! [`Deduplicator`] with all three.
//!
//! * [`Strategy::Strict`]: a store error is an error; nothing of the batch is let through.
//! * [`Strategy::BestEffort`]: a store error lets the batch's events through as *new,
//!   unverified* ([`Admission::verdict`] is `None`) and counts them as `fallbacks`.
//! * [`Strategy::LogOnly`]: events are checked and marked as usual, but every one passes
//!   ([`Admission::passes`]); duplicates are only counted (and logged at debug level). A
//!   store error is handled as under `best_effort`. For measuring first.
//!
//! The breaker is the store's [`CircuitBreakerStore`]: after `failure_threshold` outages
//! in a row it opens and batches fail fast (so `best_effort` falls back at once instead of
//! waiting on timeouts); after `reset_timeout` one batch probes the store, and a success
//! closes it again.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use idem::events::dedup::Deduplicator;
//! use idem::events::strategy::{EventGate, Strategy};
//! use idem::store::{BreakerConfig, MemoryStore};
//! use serde_json::json;
//! let dedup = Deduplicator::new(Arc::new(MemoryStore::new()), "payments", ["id"]).unwrap();
//! let gate = EventGate::new(dedup, Strategy::LogOnly, BreakerConfig::default());
//! let events = [json!({"id": 1, "amount": "10.00"}), json!({"id": 1, "amount": "10.00"})];
//! let admitted = gate.check_and_mark(&events, chrono::Utc::now()).await.unwrap();
//! // log_only: the replay passes too, and is counted.
//! assert!(admitted.iter().all(|a| a.as_ref().unwrap().passes));
//! assert_eq!(gate.stats().duplicates, 1);
//! assert!(gate.health().await.healthy);
//! # })
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use super::dedup::Deduplicator;
use super::InvalidEvent;
use crate::error::{Error, Result};
use crate::store::breaker::BreakerPhase;
use crate::store::{
    BatchTurn, BreakerConfig, CircuitBreakerStore, Cursor, EventKeyStore, EventMark, EventVerdict,
    PendingBatch, StoreBase,
};

mod confirm;
mod pending;
mod prepare;
mod stats;

use pending::{is_settled, PendingMarks};
pub use pending::{MarkTurn, MarkTurns};
pub use prepare::PreparedBatch;
use stats::Recorder;
pub use stats::{BatchLatencyHistogram, DedupStats, Health, BATCH_LATENCY_BOUNDS};

/// What a store failure does to a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// A store error is an error: the caller sees it and nothing passes.
    #[default]
    Strict,
    /// A store error lets the events through, new but unverified, counted as fallbacks.
    BestEffort,
    /// Check and mark, but never filter: every valid event passes; duplicates are counted.
    /// A store error is a fallback, as under `best_effort`.
    LogOnly,
}

impl Strategy {
    /// `strict`, `best_effort` or `log_only`.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Strict => "strict",
            Strategy::BestEffort => "best_effort",
            Strategy::LogOnly => "log_only",
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Strategy {
    type Err = Error;

    /// `strict`, `best_effort` or `log_only` (`-` for `_` accepted).
    fn from_str(s: &str) -> Result<Self> {
        match s.replace('-', "_").as_str() {
            "strict" => Ok(Strategy::Strict),
            "best_effort" => Ok(Strategy::BestEffort),
            "log_only" => Ok(Strategy::LogOnly),
            _ => Err(Error::input(format!(
                "unknown strategy {s:?}: expected strict, best_effort or log_only"
            ))),
        }
    }
}

/// One valid event's outcome at the gate.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// The event's key.
    pub key: String,
    /// What the store found; `None` when the store could not be asked and the strategy let
    /// the event through unverified (a fallback).
    pub verdict: Option<EventVerdict>,
    /// Whether the event goes on: new (or unverified) events, and every event under
    /// `log_only`.
    pub passes: bool,
    /// A key this gate marked *pending* ([`EventGate::pending`]): the expiry its
    /// confirmation gives it (`None` inside: never), once its record is out.
    pub confirm: Option<Option<DateTime<Utc>>>,
    /// The batch (of this gate) whose pending mark the key carries, when `confirm` is
    /// set: a confirmation is per batch.
    pub pending_batch: Option<BatchRef>,
    /// For a key the store found new: the time it was marked at (the `now` of the store
    /// call that marked it), which [`EventGate::release`] needs to take that mark, and no
    /// later one, back.
    pub marked_at: Option<DateTime<Utc>>,
}

/// A batch of a gate that marks keys pending, and a key's place in it
/// ([`Admission::pending_batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchRef {
    /// The batch's number in its gate.
    pub n: u64,
    /// How many keys it found new: a confirmation of all of them confirms the batch whole.
    pub new_keys: usize,
    /// This key's place among them (`0..new_keys`, in input order): a confirmation that
    /// holds every place once holds every key the batch found new, which it can tell
    /// without comparing keys.
    pub place: usize,
}

/// The pending marks of one batch, to confirm once its records are out
/// ([`EventGate::confirmations`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Confirmation {
    /// The batch's marker (compact JSON).
    pub marker: String,
    /// Its new keys and the expiry each gets when confirmed (`None`: never).
    pub keys: Vec<(String, Option<DateTime<Utc>>)>,
    /// Whether `keys` are every key the batch found new (a store may then confirm the
    /// batch at once rather than key by key).
    pub whole: bool,
}

impl Admission {
    /// `new`, `replay` or `conflict`; an unverified event is `new`.
    pub fn verdict_name(&self) -> &'static str {
        self.verdict.as_ref().map_or("new", EventVerdict::name)
    }

    /// Whether the store was asked (false for a fallback).
    pub fn verified(&self) -> bool {
        self.verdict.is_some()
    }
}

/// A [`Deduplicator`] with a failure [`Strategy`], a circuit breaker and [`DedupStats`].
///
/// Cloning is cheap, and the clones share the breaker and the counters (so a batch's store
/// call can run in a task of its own).
#[derive(Debug, Clone)]
pub struct EventGate {
    dedup: Deduplicator,
    breaker: Arc<CircuitBreakerStore<dyn EventKeyStore>>,
    strategy: Strategy,
    recorder: Arc<Mutex<Recorder>>,
    pending: Option<Arc<PendingMarks>>,
}

fn phase_name(phase: BreakerPhase) -> &'static str {
    match phase {
        BreakerPhase::Closed => "closed",
        BreakerPhase::Open => "open",
        BreakerPhase::HalfOpen => "half_open",
    }
}

impl EventGate {
    /// Wraps `dedup`'s store in a breaker configured by `breaker`.
    pub fn new(dedup: Deduplicator, strategy: Strategy, breaker: BreakerConfig) -> Self {
        let breaker = Arc::new(CircuitBreakerStore::new(dedup.store.clone(), breaker));
        EventGate {
            dedup,
            breaker,
            strategy,
            recorder: Arc::new(Mutex::new(Recorder::default())),
            pending: None,
        }
    }

    /// Marks new keys *pending* for `timeout`: a key this gate finds new is marked with a
    /// marker of its own and an expiry `timeout` away, and keeps it until
    /// [`confirm`](Self::confirm) (called once the key's record is out) gives it its real
    /// TTL. A gate that dies before (SIGKILL, power loss, a connection lost mid-batch)
    /// leaves marks that expire after `timeout`, and the next gate reports those events
    /// `new`: an event is reported `new` at least once, or it is not marked. A key pending
    /// for *another* gate is waited on (re-checked until that gate confirms it, then a
    /// replay, or until it expires, then new here). Only on a store whose
    /// [`Capabilities::confirms_pending`](crate::store::Capabilities::confirms_pending) is true; otherwise the gate is returned as is.
    pub fn pending(mut self, timeout: Duration) -> Self {
        if !self.dedup.store.capabilities().confirms_pending {
            return self;
        }
        self.pending = Some(Arc::new(PendingMarks {
            token: crate::new_run_id(),
            batches: AtomicU64::new(0),
            timeout: timeout.max(Duration::from_millis(1)),
            settled: Default::default(),
            said_waiting: Default::default(),
        }));
        self
    }

    /// Whether this gate marks keys pending ([`pending`](Self::pending)).
    pub fn marks_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Moves the named cursor of the gate's namespace to `to` (never backwards).
    pub async fn advance_cursor(&self, name: &str, to: &Cursor) -> Result<()> {
        self.breaker
            .advance_cursor(self.dedup.namespace(), name, to)
            .await
    }

    /// The strategy.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The deduplicator (namespace, extractors, TTL).
    pub fn deduplicator(&self) -> &Deduplicator {
        &self.dedup
    }

    /// The breaker's phase now.
    pub fn breaker_phase(&self) -> BreakerPhase {
        self.breaker.phase()
    }

    /// The store's URL (password removed).
    pub fn location(&self) -> String {
        self.breaker.location()
    }

    fn recorder(&self) -> std::sync::MutexGuard<'_, Recorder> {
        self.recorder.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The counters so far.
    pub fn stats(&self) -> DedupStats {
        let r = self.recorder();
        DedupStats {
            avg_batch_latency_us: r.latencies.average(),
            p99_batch_latency_us: r.latencies.quantile(0.99),
            ..r.stats.clone()
        }
    }

    /// The batch store-call durations so far, as a histogram.
    pub fn batch_latency_histogram(&self) -> BatchLatencyHistogram {
        let r = self.recorder();
        let mut cumulative = 0;
        let buckets = BATCH_LATENCY_BOUNDS
            .iter()
            .zip(r.latencies.coarse)
            .map(|(bound, n)| {
                cumulative += n;
                (*bound, cumulative)
            })
            .collect();
        BatchLatencyHistogram {
            buckets,
            sum_seconds: r.latencies.total_us as f64 / 1e6,
            count: r.latencies.count,
        }
    }

    /// Checks and marks a batch in one store round trip, as the strategy says: one result
    /// per event, in order (an [`InvalidEvent`] where the key or fingerprint could not be
    /// taken). `Err` only under `strict` when the store fails, or for an error that is not
    /// a store failure.
    ///
    /// When this returns `Ok`, every [`Admission`] with a verdict is recorded in the store
    /// (the store call returned), so a caller that reports results only after this returns
    /// never reports `new` for a key it did not record.
    pub async fn check_and_mark(
        &self,
        events: &[Value],
        now: DateTime<Utc>,
    ) -> Result<Vec<std::result::Result<Admission, InvalidEvent>>> {
        self.check_and_mark_advancing(events, now, None).await
    }

    /// The named cursor of the gate's namespace (through the breaker).
    pub async fn cursor(&self, name: &str) -> Result<Option<Cursor>> {
        self.breaker.cursor(self.dedup.namespace(), name).await
    }

    /// [`check_and_mark`](Self::check_and_mark), advancing cursor `advance.0` to
    /// `advance.1` with the batch's marks ([`EventKeyStore::check_and_mark_advancing`]).
    /// When the store call fails (a fallback), nothing is marked and the cursor stays.
    pub async fn check_and_mark_advancing(
        &self,
        events: &[Value],
        now: DateTime<Utc>,
        advance: Option<(&str, &Cursor)>,
    ) -> Result<Vec<std::result::Result<Admission, InvalidEvent>>> {
        self.admit(self.prepare(events), now, advance).await
    }

    /// Takes back the marks of `keys` made by a call at `first_seen` (its `now`), leaving
    /// any other mark of them alone (see [`EventKeyStore::unmark_event_keys`]): how many
    /// were deleted. Straight to the store, not through the breaker: used once, for a batch
    /// that was checked but whose verdicts nobody saw.
    pub async fn unmark(&self, keys: &[String], first_seen: DateTime<Utc>) -> Result<u64> {
        self.dedup
            .store
            .unmark_event_keys(self.dedup.namespace(), keys, first_seen)
            .await
    }

    /// Takes back the marks `admitted` made: the keys it found new are unmarked, so their
    /// events are `new` again at their next delivery (to this gate or another). For a
    /// batch whose handling failed: without it, a redelivery is a `replay` and does not
    /// pass (at once on this gate; on another, after the pending timeout or never).
    ///
    /// Only the marks those calls made are deleted (see
    /// [`EventKeyStore::unmark_event_keys`]): a mark made since by another gate, after
    /// this one expired, stays. Pending or confirmed alike, so release instead of
    /// confirming, not after. Straight to the store, not through the breaker. How many
    /// marks were deleted.
    pub async fn release(
        &self,
        admitted: &[std::result::Result<Admission, InvalidEvent>],
    ) -> Result<u64> {
        // One store call per marking time (one for a batch, a few when keys were asked
        // again while pending for another gate), each key once.
        let mut by_time: Vec<(DateTime<Utc>, Vec<String>)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for a in admitted.iter().flatten() {
            let (Some(EventVerdict::New), Some(at)) = (&a.verdict, a.marked_at) else {
                continue;
            };
            if !seen.insert((at, a.key.as_str())) {
                continue;
            }
            match by_time.iter_mut().find(|(t, _)| *t == at) {
                Some((_, keys)) => keys.push(a.key.clone()),
                None => by_time.push((at, vec![a.key.clone()])),
            }
        }
        let mut released = 0;
        for (at, keys) in by_time {
            released += self.unmark(&keys, at).await?;
        }
        Ok(released)
    }

    /// Checks and marks a batch, hands the admissions to `handle`, then settles the marks
    /// by its outcome: `Ok` confirms them ([`confirm`](Self::confirm), with pending
    /// marks), `Err` releases them ([`release`](Self::release)), so a failed batch's
    /// events are `new` again at their next delivery. The handler's outcome is returned;
    /// `Err` (the outer one) when the check, the confirmation or the release failed (the
    /// handler's own error is then logged).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use std::sync::Arc;
    /// use idem::events::dedup::Deduplicator;
    /// use idem::events::strategy::{EventGate, Strategy};
    /// use idem::store::{BreakerConfig, MemoryStore};
    /// use serde_json::json;
    /// let dedup = Deduplicator::new(Arc::new(MemoryStore::new()), "payments", ["id"]).unwrap();
    /// let gate = EventGate::new(dedup, Strategy::Strict, BreakerConfig::default());
    /// let events = [json!({"id": 1, "amount": "10.00"})];
    /// let now = chrono::Utc::now();
    /// let failed = gate
    ///     .handle(&events, now, async |_| Err::<(), _>("the warehouse is down"))
    ///     .await
    ///     .unwrap();
    /// assert!(failed.is_err());
    /// // Released: the redelivery is new, and handled this time.
    /// let handled = gate
    ///     .handle(&events, now, async |admitted| {
    ///         Ok::<_, String>(admitted.iter().filter(|a| a.as_ref().unwrap().passes).count())
    ///     })
    ///     .await
    ///     .unwrap();
    /// assert_eq!(handled, Ok(1));
    /// # })
    /// ```
    pub async fn handle<T, E: std::fmt::Display>(
        &self,
        events: &[Value],
        now: DateTime<Utc>,
        handle: impl AsyncFnOnce(
            &[std::result::Result<Admission, InvalidEvent>],
        ) -> std::result::Result<T, E>,
    ) -> Result<std::result::Result<T, E>> {
        let admitted = self.check_and_mark(events, now).await?;
        let outcome = handle(&admitted).await;
        let settled = match &outcome {
            Ok(_) => self.confirm(&admitted).await,
            Err(_) => self.release(&admitted).await,
        };
        match (settled, &outcome) {
            (Ok(_), _) => Ok(outcome),
            (Err(e), Err(handler)) => {
                tracing::warn!("the batch's handler failed ({handler}), and its marks could not be released: {e}");
                Err(e)
            }
            (Err(e), Ok(_)) => Err(e),
        }
    }

    /// Opens the breaker now (the store could not be opened): batches fall back at once
    /// until its reset timeout lets one try the store again.
    pub fn trip_breaker(&self) {
        self.breaker.trip();
    }

    /// How many [`admit`](Self::admit) calls on batches sharing no key are worth running at
    /// once: the store's [`Capabilities::batch_concurrency`](crate::store::Capabilities::batch_concurrency).
    pub fn batch_concurrency(&self) -> usize {
        self.breaker.capabilities().batch_concurrency.max(1)
    }

    /// [`check_and_mark_advancing`](Self::check_and_mark_advancing) of a prepared batch.
    pub async fn admit(
        &self,
        batch: PreparedBatch,
        now: DateTime<Utc>,
        advance: Option<(&str, &Cursor)>,
    ) -> Result<Vec<std::result::Result<Admission, InvalidEvent>>> {
        self.admit_in_turn(batch, now, advance, MarkTurn::default())
            .await
    }

    /// [`admit`](Self::admit), its keys marked in `turn`: with pending marks, after the
    /// batch before it has marked its own (see [`MarkTurn`]).
    pub async fn admit_in_turn(
        &self,
        batch: PreparedBatch,
        now: DateTime<Utc>,
        advance: Option<(&str, &Cursor)>,
        mut turn: MarkTurn,
    ) -> Result<Vec<std::result::Result<Admission, InvalidEvent>>> {
        let PreparedBatch { mut marks, slots } = batch;
        let invalid = slots.len() - marks.len();
        let namespace = self.dedup.namespace();
        // Pending marks, after a batch of settled replays: this one is read first, and when
        // it is settled too it is answered by that read, marking nothing, without waiting
        // for its turn (which it passes on). A replay pass's batches so run side by side
        // instead of one after the other; a batch that is not settled costs one read more
        // and goes down its turn.
        let read_ahead = match &self.pending {
            Some(p)
                if advance.is_none() && !marks.is_empty() && p.settled.load(Ordering::Relaxed) =>
            {
                let started = Instant::now();
                match self.breaker.check_all_marked(namespace, &marks, now).await {
                    Ok(Some(v)) if v.iter().all(is_settled) => Some((Ok(v), started)),
                    Ok(_) => {
                        p.settled.store(false, Ordering::Relaxed);
                        None
                    }
                    Err(e) => Some((Err(e), started)),
                }
            }
            _ => None,
        };
        // Pending marks on a store that keeps the row's order: marked ahead of its turn
        // when the batch before it has marked, else down its turn (below).
        let ahead = read_ahead.is_none()
            && advance.is_none()
            && !marks.is_empty()
            && self.pending.is_some()
            && turn.is_waiting()
            && self.breaker.capabilities().marks_ahead;
        if read_ahead.is_some() {
            turn.pass_on();
        } else if self.pending.is_some() && !ahead {
            turn.wait().await;
        }
        // Pending marks: the batch gets a marker of its own, and each key's real expiry is
        // kept for its confirmation.
        let pending = self
            .pending
            .as_ref()
            .filter(|_| read_ahead.is_none())
            .map(|p| (p, p.batches.fetch_add(1, Ordering::Relaxed)));
        let marker = pending.map(|(p, n)| p.marker(n));
        let confirm_at: Vec<Option<DateTime<Utc>>> = match &pending {
            None => Vec::new(),
            Some(_) => marks.iter().map(|m| m.expires_at(now)).collect(),
        };
        // When each key was marked: `now`, or later for a key asked again while it was
        // pending for another gate (`settle_pending`).
        let mut marked_at = vec![now; marks.len()];
        let outcome = if let Some((outcome, started)) = read_ahead {
            let mut r = self.recorder();
            r.latencies.record(started.elapsed());
            r.stats.batches += 1;
            outcome
        } else if marks.is_empty() && advance.is_none() {
            Ok(Vec::new())
        } else {
            let started = Instant::now();
            let outcome = match (pending, &marker) {
                (Some((p, _)), Some(marker)) => {
                    let place = turn.place();
                    let batch = PendingBatch {
                        marker,
                        timeout: p.timeout,
                        turn: place.as_ref().map(|(row, place, started)| BatchTurn {
                            row,
                            place: *place,
                            started,
                        }),
                    };
                    let mut marked = None;
                    if ahead {
                        // After the batch before it may be waited for (holding nothing).
                        turn.wait_started().await;
                        marked = self
                            .breaker
                            .check_and_mark_pending_ahead(namespace, &marks, now, batch)
                            .await
                            .transpose();
                    }
                    let marked = match marked {
                        Some(marked) => marked,
                        // Not ahead, or its turn had not come: down its turn.
                        None => {
                            turn.wait().await;
                            self.breaker
                                .check_and_mark_pending(namespace, &marks, now, batch, advance)
                                .await
                        }
                    };
                    // Marked (or refused): the next batch may mark its keys once every
                    // batch before this one has (at once when this one waited its turn),
                    // and may ask ahead at once (`pass_on` says so).
                    turn.pass_on();
                    // Keys asked again are no part of the row's order (see `settle_pending`).
                    let again = PendingBatch {
                        turn: None,
                        ..batch
                    };
                    let settled = match marked {
                        Ok(verdicts) => {
                            self.settle_pending(
                                p,
                                again,
                                &marks,
                                verdicts,
                                &mut marked_at,
                                (turn.stop(), turn.interrupted()),
                            )
                            .await
                        }
                        Err(e) => Err(e),
                    };
                    if let Ok(verdicts) = &settled {
                        let all = !verdicts.is_empty() && verdicts.iter().all(is_settled);
                        p.settled.store(all, Ordering::Relaxed);
                    }
                    settled
                }
                _ => match advance {
                    None => self.breaker.check_and_mark(namespace, &marks, now).await,
                    Some((name, to)) => {
                        self.breaker
                            .check_and_mark_advancing(namespace, &marks, now, name, to)
                            .await
                    }
                },
            };
            let mut r = self.recorder();
            r.latencies.record(started.elapsed());
            r.stats.batches += 1;
            outcome
        };
        let mut r = self.recorder();
        r.stats.checked += slots.len() as u64;
        r.stats.extraction_failures += invalid as u64;
        let verdicts = match outcome {
            Ok(v) => Some(v),
            Err(e) if e.is_store_failure() => {
                r.stats.store_errors += 1;
                if self.strategy == Strategy::Strict {
                    return Err(e);
                }
                if matches!(e, Error::CircuitOpen { .. }) {
                    // Said once when the breaker opened; not again for every batch.
                    tracing::debug!(
                        strategy = self.strategy.name(),
                        events = marks.len(),
                        "letting the batch through unverified: {e}"
                    );
                } else {
                    tracing::warn!(
                        strategy = self.strategy.name(),
                        events = marks.len(),
                        "store failed, letting the batch through unverified: {e}"
                    );
                }
                r.stats.fallbacks += marks.len() as u64;
                None
            }
            Err(e) => return Err(e),
        };
        // How many keys the batch found new (each once: a repeat is a replay of the first).
        let new_keys = verdicts
            .as_ref()
            .map_or(0, |v| v.iter().filter(|v| v.is_new()).count());
        let mut verdicts = verdicts.map(|v| v.into_iter().map(Some).collect::<Vec<_>>());
        let log_only = self.strategy == Strategy::LogOnly;
        let mut out = Vec::with_capacity(slots.len());
        // The next new key's place among the batch's new keys (`BatchRef::place`).
        let mut place = 0;
        for slot in slots {
            let i = match slot {
                Ok(i) => i,
                Err(invalid) => {
                    out.push(Err(invalid));
                    continue;
                }
            };
            let key = std::mem::take(&mut marks[i].key);
            let verdict = verdicts
                .as_mut()
                .map(|v| v[i].take().expect("one verdict per mark"));
            match &verdict {
                Some(EventVerdict::New) => r.stats.unique += 1,
                Some(EventVerdict::Replay { .. }) => {
                    r.stats.replays += 1;
                    r.stats.duplicates += 1;
                }
                Some(EventVerdict::Conflict { .. }) => {
                    r.stats.conflicts += 1;
                    r.stats.duplicates += 1;
                }
                None => {}
            }
            let new = verdict.as_ref().is_none_or(EventVerdict::is_new);
            if log_only && !new {
                tracing::debug!(
                    key,
                    verdict = verdict.as_ref().map(EventVerdict::name),
                    "log_only: duplicate let through"
                );
            }
            let confirm = match (&verdict, confirm_at.get(i)) {
                (Some(EventVerdict::New), Some(at)) => Some(*at),
                _ => None,
            };
            let marked = matches!(verdict, Some(EventVerdict::New)).then_some(marked_at[i]);
            let pending_batch = confirm.and(pending.map(|(_, n)| {
                place += 1;
                BatchRef {
                    n,
                    new_keys,
                    place: place - 1,
                }
            }));
            out.push(Ok(Admission {
                key,
                verdict,
                passes: new || log_only,
                confirm,
                pending_batch,
                marked_at: marked,
            }));
        }
        Ok(out)
    }

    /// Checks and marks a batch, keeping the events that pass, in input order.
    pub async fn filter(&self, events: Vec<Value>, now: DateTime<Utc>) -> Result<Vec<Value>> {
        let admitted = self.check_and_mark(&events, now).await?;
        Ok(events
            .into_iter()
            .zip(admitted)
            .filter(|(_, a)| a.as_ref().is_ok_and(|a| a.passes))
            .map(|(e, _)| e)
            .collect())
    }

    /// Stores the decision of an event's first processing (through the breaker).
    pub async fn record_decision(&self, key: &str, decision: &Value) -> Result<bool> {
        self.breaker
            .record_decision(self.dedup.namespace(), key, decision)
            .await
    }

    /// Asks the store a read (through the breaker, so an open breaker is reported without
    /// touching the store).
    pub async fn health(&self) -> Health {
        let started = Instant::now();
        let probe = self
            .breaker
            .is_duplicate(
                self.dedup.namespace(),
                &["idem-health-probe".to_string()],
                Utc::now(),
            )
            .await;
        let refused = matches!(probe, Err(Error::CircuitOpen { .. }));
        Health {
            healthy: probe.is_ok(),
            store: self.location(),
            breaker: phase_name(self.breaker.phase()),
            latency_us: (!refused).then(|| started.elapsed().as_micros() as u64),
            error: probe.err().map(|e| e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests;
