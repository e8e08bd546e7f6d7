//! Batches in flight: their store calls running side by side on keys they do not share,
//! and taking back the marks of batches whose records will not be written.

use std::collections::VecDeque;

use chrono::{DateTime, Utc};

use super::read::Pending;
use crate::error::{Error, Result};
use crate::events::strategy::{Admission, EventGate};
use crate::events::InvalidEvent;
use crate::store::{Cursor, EventVerdict};

/// Batches whose records will not be written (the output closed, or an earlier batch's
/// store call failed under `strict`): their calls are let finish rather than cut off, and
/// the keys they marked new are forgotten again, so the same input again says `new` for
/// those lines, not `replay` for lines nobody was told were new.
pub(super) async fn take_back(gate: &EventGate, in_flight: VecDeque<InFlight>) {
    let mut left = Untaken::default();
    for f in in_flight {
        // A call the stream made itself (`--cursor`, an empty batch) is written at once.
        let Some(now) = f.marked_at else {
            continue;
        };
        let outcome = match f.call {
            Call::Running(call) => joined(call.await),
            Call::Done(outcome) => outcome,
        };
        if let Ok(admitted) = outcome {
            left.add(unmark_new(gate, &admitted, now).await);
        }
    }
    left.warn();
}

/// Takes back the marks of the keys a call at `now` found new: `Err` with how many keys
/// stay marked when the store refused.
pub(super) async fn unmark_new(
    gate: &EventGate,
    admitted: &Admitted,
    now: DateTime<Utc>,
) -> std::result::Result<(), (usize, Error)> {
    let marked: Vec<String> = admitted
        .iter()
        .filter_map(|a| match a {
            Ok(a) if matches!(a.verdict, Some(EventVerdict::New)) => Some(a.key.clone()),
            _ => None,
        })
        .collect();
    if marked.is_empty() {
        return Ok(());
    }
    gate.unmark(&marked, now)
        .await
        .map(|_| ())
        .map_err(|e| (marked.len(), e))
}

/// Keys that could not be unmarked.
#[derive(Default)]
pub(super) struct Untaken {
    left: usize,
    error: Option<Error>,
}

impl Untaken {
    pub(super) fn add(&mut self, outcome: std::result::Result<(), (usize, Error)>) {
        if let Err((n, e)) = outcome {
            self.left += n;
            self.error = Some(e);
        }
    }

    pub(super) fn warn(self) {
        if let Some(e) = self.error {
            tracing::warn!(
                "{} key(s) were marked new by batches whose records were not written, and \
                 could not be unmarked ({e}): the same input again says `replay` for them",
                self.left
            );
        }
    }
}

/// The keys of a batch in flight, hashed (two keys with the same hash only make a batch
/// wait when it need not).
#[derive(Default)]
pub(super) struct KeySet(std::collections::HashSet<u64, std::hash::BuildHasherDefault<Hashed>>);

/// The hasher of a set of hashes: a value is its own hash (the default hasher would hash
/// each one again, on every insert and lookup).
#[derive(Default)]
struct Hashed(u64);

impl std::hash::Hasher for Hashed {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl KeySet {
    pub(super) fn of<'k>(keys: impl Iterator<Item = &'k str>) -> Self {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let hasher = BuildHasherDefault::<DefaultHasher>::default();
        KeySet(keys.map(|k| hasher.hash_one(k)).collect())
    }

    pub(super) fn shares(&self, other: &KeySet) -> bool {
        let (small, large) = if self.0.len() <= other.0.len() {
            (&self.0, &other.0)
        } else {
            (&other.0, &self.0)
        };
        small.iter().any(|k| large.contains(k))
    }
}

pub(super) type Admitted = Vec<std::result::Result<Admission, InvalidEvent>>;

/// A batch whose store call was made: running as a task of its own, or returned.
pub(super) enum Call {
    Running(tokio::task::JoinHandle<Result<Admitted>>),
    Done(Result<Admitted>),
}

/// The outcome of a store call's task.
fn joined(
    outcome: std::result::Result<Result<Admitted>, tokio::task::JoinError>,
) -> Result<Admitted> {
    match outcome {
        Ok(admitted) => admitted,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(Error::input(format!("the store call stopped: {e}"))),
    }
}

/// A batch between its store call and its records.
pub(super) struct InFlight {
    pub(super) pending: Vec<Pending>,
    pub(super) lines: u64,
    pub(super) blank: u64,
    /// The keys its store call marks (empty when the stream made the call itself).
    pub(super) keys: KeySet,
    /// The `now` of its store call, when it runs as a task of its own (what the marks it
    /// makes hold as first seen).
    pub(super) marked_at: Option<DateTime<Utc>>,
    /// With pending marks and a cursor: where the cursor moves once the batch's records
    /// are out and confirmed (never before: a crash in between must leave the batch's
    /// lines ahead of the cursor, to be checked again).
    pub(super) advance: Option<(String, Cursor)>,
    pub(super) call: Call,
}

/// A batch whose store call returned.
pub(super) struct Finished {
    pub(super) pending: Vec<Pending>,
    pub(super) lines: u64,
    pub(super) blank: u64,
    pub(super) admitted: Vec<std::result::Result<Admission, InvalidEvent>>,
}

impl InFlight {
    /// Whether its store call returned.
    pub(super) fn is_done(&self) -> bool {
        match &self.call {
            Call::Done(_) => true,
            Call::Running(call) => call.is_finished(),
        }
    }

    /// Waits for its store call to return, keeping the outcome: `false` when it failed.
    pub(super) async fn settle(&mut self) -> bool {
        if let Call::Running(call) = &mut self.call {
            self.call = Call::Done(joined(call.await));
        }
        matches!(self.call, Call::Done(Ok(_)))
    }

    /// Waits for the store call; a store error (under `strict`) is returned as it is.
    pub(super) async fn finish(self) -> Result<Finished> {
        let admitted = match self.call {
            Call::Done(admitted) => admitted?,
            Call::Running(call) => joined(call.await)?,
        };
        Ok(Finished {
            pending: self.pending,
            lines: self.lines,
            blank: self.blank,
            admitted,
        })
    }
}
