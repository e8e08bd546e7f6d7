//! Confirming a gate's pending marks once their records are out ([`Confirmation`]), and
//! counting the keys a late confirmation left unconfirmed.

use super::*;

impl EventGate {
    /// Confirms the pending marks of the keys `admitted` found new, once their records
    /// are out ([`pending`](Self::pending)): how many were confirmed. Straight to the
    /// store (not through the breaker).
    pub async fn confirm(
        &self,
        admitted: &[std::result::Result<Admission, InvalidEvent>],
    ) -> Result<u64> {
        self.confirm_keys(self.confirmations(admitted)).await
    }

    /// What [`confirm`](Self::confirm) sends for `admitted`: per batch, its marker and
    /// its new keys with their real expiries (one batch for the admissions of one call).
    pub fn confirmations(
        &self,
        admitted: &[std::result::Result<Admission, InvalidEvent>],
    ) -> Vec<Confirmation> {
        self.group_confirmations(admitted.iter().filter_map(|a| {
            let a = a.as_ref().ok()?;
            confirmable(a).map(|(batch, at)| (batch, at, a.key.clone()))
        }))
    }

    /// [`confirmations`](Self::confirmations), each key moved out of its admission (left
    /// empty) rather than copied: for admissions whose keys are not read again (a batch's
    /// records written).
    pub fn take_confirmations(
        &self,
        admitted: &mut [std::result::Result<Admission, InvalidEvent>],
    ) -> Vec<Confirmation> {
        self.group_confirmations(admitted.iter_mut().filter_map(|a| {
            let a = a.as_mut().ok()?;
            confirmable(a).map(|(batch, at)| (batch, at, std::mem::take(&mut a.key)))
        }))
    }

    /// Groups confirmable keys (their batch, their real expiry, the key) by batch, each key
    /// once (by its place in its batch: the same admission passed twice counts once).
    fn group_confirmations(
        &self,
        keys: impl Iterator<Item = (BatchRef, Option<DateTime<Utc>>, String)>,
    ) -> Vec<Confirmation> {
        let Some(p) = &self.pending else {
            return Vec::new();
        };
        // Per batch: its confirmation, and which of its places it holds.
        let mut out: Vec<(BatchRef, Confirmation, Vec<bool>)> = Vec::new();
        for (batch, at, key) in keys {
            let i = match out.iter().position(|(b, ..)| b.n == batch.n) {
                Some(i) => i,
                None => {
                    out.push((
                        batch,
                        Confirmation {
                            marker: p.marker(batch.n),
                            keys: Vec::with_capacity(batch.new_keys),
                            whole: false,
                        },
                        vec![false; batch.new_keys],
                    ));
                    out.len() - 1
                }
            };
            let (_, c, held) = &mut out[i];
            match held.get_mut(batch.place) {
                Some(true) => {}
                Some(held) => {
                    *held = true;
                    c.keys.push((key, at));
                }
                // A place the batch does not have (an admission put together by hand): sent,
                // but the batch is not confirmed whole through it.
                None => c.keys.push((key, at)),
            }
        }
        out.into_iter()
            .map(|(batch, mut c, held)| {
                // Whole when it holds every place: every key the batch found new, each once
                // (so that a store confirming the batch at once counts its keys right).
                c.whole = c.keys.len() == batch.new_keys && held.iter().all(|h| *h);
                c
            })
            .collect()
    }

    /// Confirms these batches' pending marks (see [`confirm`](Self::confirm)): how many
    /// keys were confirmed. A batch whose confirmation fails does not stop the others; its
    /// keys are counted in `confirm_failures`, and the first such error is the answer.
    pub async fn confirm_keys(&self, batches: Vec<Confirmation>) -> Result<u64> {
        if self.pending.is_none() {
            return Ok(0);
        }
        let mut confirmed = 0;
        let mut failed = None;
        for c in batches.iter().filter(|c| !c.keys.is_empty()) {
            let mut again = true;
            let done = loop {
                match self
                    .dedup
                    .store
                    .confirm_pending_batch(self.dedup.namespace(), &c.marker, &c.keys, c.whole)
                    .await
                {
                    // Asked once more when the store failed (busy past its timeout, a
                    // connection lost): an unconfirmed batch's keys stay pending, and other
                    // gates wait on them until they expire. Asking twice is harmless: only
                    // marks still naming the batch are confirmed.
                    Err(e) if again && e.is_store_failure() => {
                        tracing::debug!("confirming a pending batch failed ({e}); asking again");
                        again = false;
                        tokio::time::sleep(CONFIRM_AGAIN_AFTER).await;
                    }
                    done => break done,
                }
            };
            let done = match done {
                Ok(done) => done,
                Err(e) => {
                    // Its records are out, its marks stay pending until they expire: the
                    // next reader after that finds these events `new` again.
                    self.recorder().stats.confirm_failures += distinct(&c.keys) as u64;
                    failed.get_or_insert(e);
                    continue;
                }
            };
            confirmed += done;
            // A store confirms only marks still naming the batch: fewer than its keys when
            // the pending timeout passed first (the records took longer than it to be
            // written), and those keys are `new` again for the next reader. Counted only
            // then: with as many confirmed as keys sent, none was lost.
            let lost = if done >= c.keys.len() as u64 {
                0
            } else {
                (distinct(&c.keys) as u64).saturating_sub(done)
            };
            if lost > 0 {
                let first = {
                    let mut r = self.recorder();
                    r.stats.unconfirmed += lost;
                    r.stats.unconfirmed == lost
                };
                // Once per gate: a stalled reader would otherwise get a warning per batch
                // (the stats, and the gate's summary, count them all).
                if first {
                    let timeout = self.pending.as_ref().map(|p| p.timeout).unwrap_or_default();
                    tracing::warn!(
                        "{lost} new key(s) of a batch were confirmed after the pending timeout \
                         ({}) had passed: their marks expired, and the next run reports those \
                         events `new` again; raise the pending timeout (--pending-timeout) \
                         above the time a batch's records take to be written (counted in \
                         `unconfirmed`, warned once)",
                        humantime::format_duration(timeout)
                    );
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(confirmed),
        }
    }
}

/// How long a gate waits before asking the store again for a confirmation that failed.
const CONFIRM_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

/// An admission's batch and the expiry its confirmation gives its key, when it is a key
/// its gate marked pending and found new.
fn confirmable(a: &Admission) -> Option<(BatchRef, Option<DateTime<Utc>>)> {
    match (&a.verdict, a.confirm, a.pending_batch) {
        (Some(EventVerdict::New), Some(at), Some(batch)) => Some((batch, at)),
        _ => None,
    }
}

/// How many different keys `keys` holds.
fn distinct<T>(keys: &[(String, T)]) -> usize {
    keys.iter()
        .map(|(k, _)| k.as_str())
        .collect::<std::collections::HashSet<&str>>()
        .len()
}
