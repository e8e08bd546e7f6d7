//! How a [`GuardStack`] decides a run, in named phases. For each guard in order, a
//! [`Walk`] asks:
//!
//! 1. [`held_early`](Walk::held_early): a lease guard further on was seen held in an
//!    earlier read, and every guard before it proceeded: it skips there.
//! 2. [`describe_content`](Walk::describe_content): the first guard that needs the content
//!    key has it computed (which may query a warehouse).
//! 3. [`read_phase`](Walk::read_phase): the keys of the guards up to the next lease or
//!    content guard, in one round trip (with the lease holder, and a skip's ledger row,
//!    where the store can).
//! 4. [`prepare_claim`](Walk::prepare_claim): a claim carries what its re-check reads.
//! 5. [`check`](Walk::check): the guard's verdict, recorded.
//! 6. [`recheck_after_claim`](Walk::recheck_after_claim): once the lease is taken, the
//!    earlier guards are asked again against keys read after the claim.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::{
    AfterClaim, ContentError, ContentSource, DecideOptions, Decision, Guard, GuardContext,
    GuardStack, GuardVerdict, Verdict,
};
use crate::error::Result;
use crate::model::{RunRecord, RunRequest};
use crate::store::{DynStore, KeyLookup, Lease, LeaseHolder, SkipOnHit};

/// What one decision is asked: the run, its store and time, how its content is described,
/// the options and, in enforce mode, the ledger row of a skip that a read may record
/// ([`GuardStack::decide_recording`]).
pub(crate) struct Ask<'a> {
    /// The run being decided.
    pub request: &'a RunRequest,
    /// The store.
    pub store: &'a DynStore,
    /// Decision time.
    pub now: DateTime<Utc>,
    /// The run's content, described when a guard needs its key.
    pub content: &'a dyn ContentSource,
    /// How to evaluate.
    pub options: DecideOptions,
    /// The run's ledger row as a skip (status, mode, times, ids).
    pub skip_row: Option<&'a RunRecord>,
}

/// What the walk does after a phase.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    /// On to the next phase (or guard).
    Go,
    /// The next guard: this one is done.
    Next,
    /// Decided: no more guards.
    Stop,
}

/// One decision in progress, guard by guard.
struct Walk<'s, 'a> {
    stack: &'s GuardStack,
    ask: &'a Ask<'a>,
    /// Enforce mode: stop at the first skip, neither dry run nor shadow.
    enforce: bool,
    ctx: GuardContext<'a>,
    decision: Decision,
    content_known: bool,
    /// Guards before this index have their lookups fetched in the current epoch.
    fetched: usize,
    /// The lease guard, and who held the scope, when the holder was read before it was
    /// next (enforce mode).
    held_early: Option<(usize, LeaseHolder)>,
    /// The skip row recorded with a read, and the guard whose hit it is.
    recorded: Option<(usize, RunRecord)>,
}

impl<'s, 'a> Walk<'s, 'a> {
    fn new(stack: &'s GuardStack, ask: &'a Ask<'a>) -> Self {
        let options = ask.options;
        Walk {
            stack,
            ask,
            enforce: options.stop_at_first_skip && !options.dry_run && !options.shadow,
            ctx: GuardContext {
                request: ask.request,
                store: ask.store,
                now: ask.now,
                content_key: None,
                dry_run: options.dry_run,
                shadow: options.shadow,
                version: ask.content.version(),
                found: HashMap::new(),
                lease: None,
                holder_seen: None,
                claim_lookups: Vec::new(),
                found_with_claim: None,
            },
            decision: Decision::default(),
            content_known: false,
            fetched: 0,
            held_early: None,
            recorded: None,
        }
    }

    /// Phase 1: every guard of the last phase proceeded, and a lease guard further on saw
    /// the scope held in its read: it skips there if it skips on that.
    fn held_early(&mut self, i: usize) -> Step {
        if i < self.fetched {
            return Step::Go;
        }
        let Some((l, holder)) = self.held_early.take() else {
            return Step::Go;
        };
        let lease_guard = &self.stack.guards[l];
        match lease_guard.skip_when_held(&self.ctx, &holder) {
            Some(Verdict::Skip(skip)) => {
                self.decision.skip.get_or_insert_with(|| skip.clone());
                self.decision.verdicts.push(GuardVerdict {
                    guard: lease_guard.name().to_string(),
                    verdict: Verdict::Skip(skip),
                });
                Step::Stop
            }
            _ => Step::Go,
        }
    }

    /// Phase 2: the content key, when guard `i` is the first that needs it. Unavailable
    /// content is an unknown verdict in a dry run (`Next`), else the processor's error.
    async fn describe_content(&mut self, i: usize) -> Result<Step> {
        let guard = &self.stack.guards[i];
        let Some(algorithm) = guard.content_hash() else {
            return Ok(Step::Go);
        };
        if self.content_known {
            return Ok(Step::Go);
        }
        self.content_known = true;
        match self.ask.content.content_key(algorithm).await {
            Ok(key) => {
                self.ctx.content_key = key.as_ref().map(|k| k.key.clone());
                self.decision.content = key;
                Ok(Step::Go)
            }
            Err(ContentError::Unavailable(detail)) if self.ask.options.dry_run => {
                self.decision.verdicts.push(GuardVerdict {
                    guard: guard.name().to_string(),
                    verdict: Verdict::Unknown { detail },
                });
                Ok(Step::Next)
            }
            Err(ContentError::Unavailable(detail)) => Err(crate::error::Error::Processor {
                processor: self.ask.request.processor.clone(),
                source: detail.into(),
            }),
            Err(ContentError::Failed(e)) => Err(e),
        }
    }

    /// Phase 3: the keys of the phase that starts at guard `i` (up to the next lease or
    /// content guard), in one round trip. With them, where the store can: who holds the
    /// lease, when a lease guard comes next or (enforce mode) further on; and the ledger
    /// row of the skip the phase's first guard makes on a hit (enforce mode).
    async fn read_phase(&mut self, i: usize) -> Result<()> {
        let stack = self.stack;
        let guard = &stack.guards[i];
        if i < self.fetched || guard.takes_lease() {
            return Ok(());
        }
        let end = stack.phase_end(i, self.content_known);
        let phase: Vec<&Arc<dyn Guard>> = stack.guards[i..end].iter().collect();
        let unclaimed = self.ctx.lease.is_none();
        // The lease guard comes next: read who holds the lease with the keys.
        let next_is_lease = stack.guards.get(end).is_some_and(|g| g.takes_lease());
        let peek = !self.ask.options.dry_run && unclaimed && next_is_lease;
        // Enforce mode, a lease guard further on: read who holds it now, so a held scope
        // skips before the content is described.
        let early = (self.enforce && unclaimed && !next_is_lease)
            .then(|| stack.guards[end..].iter().position(|g| g.takes_lease()))
            .flatten()
            .map(|o| end + o);
        let template = self.ask.skip_row.filter(|_| self.enforce);
        let skip = match (template, &self.recorded, unclaimed) {
            (Some(template), None, true) => GuardStack::skip_row(&self.ctx, guard, template),
            _ => None,
        };
        self.ctx.holder_seen = None;
        let row = stack
            .prefetch_peeking(&mut self.ctx, &phase, peek || early.is_some(), skip)
            .await?;
        if let Some(row) = row {
            self.recorded = Some((i, row));
        }
        if let Some(l) = early {
            if let Some(Some(holder)) = self.ctx.holder_seen.take() {
                self.held_early = Some((l, holder));
            }
        }
        self.fetched = end;
        Ok(())
    }

    /// Phase 4: a lease guard about to claim carries the lookups its re-check will read,
    /// sent with the claim where the store can.
    fn prepare_claim(&mut self, i: usize) {
        if self.stack.guards[i].takes_lease()
            && self.ctx.lease.is_none()
            && !self.ask.options.dry_run
        {
            let (_, batch, _) = self
                .stack
                .after_claim(i, self.content_known, &self.decision);
            self.ctx.claim_lookups = GuardStack::lookups_of(&self.ctx, &batch);
            self.ctx.found_with_claim = None;
        }
    }

    /// Phase 5: guard `i`'s verdict, recorded (a lease taken is handed to `lease_out` at
    /// once, so an error still releases it). `Stop` at a skip in enforce mode; whether
    /// this guard took the lease.
    async fn check(&mut self, i: usize, lease_out: &mut Option<Lease>) -> Result<(Step, bool)> {
        let guard = &self.stack.guards[i];
        let had_lease = self.ctx.lease.is_some();
        let verdict = guard.check(&mut self.ctx).await;
        if self.ctx.lease.is_some() {
            *lease_out = self.ctx.lease.clone();
        }
        let verdict = verdict?;
        if let Some((at, row)) = &self.recorded {
            if *at == i && !is_recorded_skip(&verdict, row) {
                // A guard that broke its word (Guard::skips_on_hit): the run goes on, and
                // its recording meets the run id taken (a derived id is used).
                tracing::error!(
                    guard = guard.name(),
                    "the guard declared it skips on a hit, but answered {verdict:?}; run {} is recorded as skipped already",
                    self.ask.request.run_id
                );
                self.recorded = None;
            }
        }
        let claimed_now = !had_lease && self.ctx.lease.is_some();
        let skipped = matches!(verdict, Verdict::Skip(_));
        if let Verdict::Skip(skip) = &verdict {
            self.decision.skip.get_or_insert_with(|| skip.clone());
        }
        self.decision.verdicts.push(GuardVerdict {
            guard: guard.name().to_string(),
            verdict,
        });
        let step = match self.ask.options.stop_at_first_skip && skipped {
            true => Step::Stop,
            false => Step::Go,
        };
        Ok((step, claimed_now))
    }

    /// Phase 6: the lease guard `i` just claimed. Everything read before the claim is
    /// stale: the keys of the earlier guards and of the next phase are read again in one
    /// round trip (or were, with the claim), and the earlier guards asked again; one that
    /// now skips wins over the lease guard's proceed.
    async fn recheck_after_claim(&mut self, i: usize) -> Result<Step> {
        let stack = self.stack;
        self.ctx.found.clear();
        let (recheck, batch, end) = stack.after_claim(i, self.content_known, &self.decision);
        match self.ctx.found_with_claim.take() {
            // Read by the claim itself, after it took the lease.
            Some(found) => {
                for (l, f) in found {
                    self.ctx.found.insert((l.kind, l.key), f);
                }
            }
            None => stack.prefetch(&mut self.ctx, &batch).await?,
        }
        self.fetched = end;
        for g in recheck {
            if let Verdict::Skip(skip) = g.check(&mut self.ctx).await? {
                tracing::debug!(guard = g.name(), "re-check after claiming the lease skips");
                let verdicts = &mut self.decision.verdicts;
                if let Some(v) = verdicts.iter_mut().find(|v| v.guard == g.name()) {
                    v.verdict = Verdict::Skip(skip.clone());
                }
                if let Some(v) = verdicts.last_mut() {
                    v.verdict = Verdict::proceed("lease acquired, but an earlier guard now skips");
                }
                self.decision.skip.get_or_insert(skip);
                break;
            }
        }
        Ok(
            match self.ask.options.stop_at_first_skip && self.decision.skip.is_some() {
                true => Step::Stop,
                false => Step::Go,
            },
        )
    }

    /// The decision, with the lease taken, and the skip row recorded when it is the skip
    /// decided.
    fn finish(self) -> (Decision, Option<RunRecord>) {
        let mut decision = self.decision;
        decision.lease = self.ctx.lease;
        let recorded = self.recorded.map(|(_, row)| row).filter(|row| {
            decision
                .skip
                .as_ref()
                .is_some_and(|s| is_recorded_skip(&Verdict::Skip(s.clone()), row))
        });
        (decision, recorded)
    }
}

/// Whether `verdict` is the skip `row` records (its reason and previous run).
fn is_recorded_skip(verdict: &Verdict, row: &RunRecord) -> bool {
    matches!(verdict, Verdict::Skip(s)
        if Some(&s.reason) == row.skip_reason.as_ref()
            && s.previous_run.as_ref().map(|p| &p.run_id) == row.previous_run_id.as_ref())
}

impl GuardStack {
    /// [`decide`](Self::decide); with `ask.skip_row` (enforce mode), the ledger row of a skip
    /// by a guard that decides on a hit alone ([`Guard::skips_on_hit`]) is recorded with
    /// the read that finds the key, where the store can: `ask.skip_row` is the run's ledger
    /// row as a skip (status, mode, times, ids), and the row recorded, if one was, is
    /// answered with the decision, its reason, content key, previous run and finish time
    /// filled in.
    /// The walk is in [`Walk`]'s phases (this module's documentation).
    pub(crate) async fn decide_recording(
        &self,
        ask: &Ask<'_>,
        lease_out: &mut Option<Lease>,
    ) -> Result<(Decision, Option<RunRecord>)> {
        let mut walk = Walk::new(self, ask);
        let mut i = 0;
        while i < self.guards.len() {
            if walk.held_early(i) == Step::Stop {
                break;
            }
            if walk.describe_content(i).await? == Step::Next {
                i += 1;
                continue;
            }
            walk.read_phase(i).await?;
            walk.prepare_claim(i);
            let (step, claimed_now) = walk.check(i, lease_out).await?;
            if step == Step::Stop {
                break;
            }
            if claimed_now && walk.recheck_after_claim(i).await? == Step::Stop {
                break;
            }
            i += 1;
        }
        Ok(walk.finish())
    }

    /// Fetches, in one store round trip, the keys `guards` need; guards whose lookups
    /// were already fetched in this epoch are not asked again.
    pub(super) async fn prefetch(
        &self,
        ctx: &mut GuardContext<'_>,
        guards: &[&Arc<dyn Guard>],
    ) -> Result<()> {
        self.prefetch_peeking(ctx, guards, false, None)
            .await
            .map(|_| ())
    }

    /// The lookups of `guards` (lease guards have none).
    fn lookups_of(ctx: &GuardContext<'_>, guards: &[&Arc<dyn Guard>]) -> Vec<KeyLookup> {
        guards
            .iter()
            .filter(|g| !g.takes_lease())
            .flat_map(|g| g.lookups(ctx))
            .collect()
    }

    /// [`prefetch`](Self::prefetch); with `peek`, the lease holder is read in the same
    /// round trip where the store can (a lease guard comes later: a held scope then
    /// skips without a claim). With `skip`, the ledger row of the skip the first guard of
    /// `guards` makes on a hit is recorded with the read where the store can (see
    /// [`Guard::skips_on_hit`]): the answer is that row, with its previous run, when it
    /// was recorded.
    async fn prefetch_peeking(
        &self,
        ctx: &mut GuardContext<'_>,
        guards: &[&Arc<dyn Guard>],
        peek: bool,
        skip: Option<(KeyLookup, RunRecord)>,
    ) -> Result<Option<RunRecord>> {
        let lookups = Self::lookups_of(ctx, guards);
        if lookups.is_empty() {
            return Ok(None);
        }
        let skip = skip.and_then(|(lookup, run)| {
            let position = lookups.iter().position(|l| *l == lookup)?;
            Some(SkipOnHit { position, run })
        });
        let mut recorded = None;
        let found = if let Some(skip) = skip {
            let (found, holder, was_recorded) = ctx
                .store
                .find_keys_recording_skip(&lookups, ctx.now, peek, &skip)
                .await?;
            if peek {
                ctx.holder_seen = holder;
            }
            if was_recorded {
                let previous = found
                    .get(skip.position)
                    .and_then(|k| k.as_ref())
                    .map(|k| k.run_id.clone());
                recorded = Some(RunRecord {
                    previous_run_id: previous,
                    ..skip.run
                });
            }
            found
        } else if peek {
            let (found, holder) = ctx
                .store
                .find_keys_and_holder(
                    &lookups,
                    &ctx.request.processor,
                    &ctx.request.scope,
                    ctx.now,
                )
                .await?;
            ctx.holder_seen = holder;
            found
        } else {
            ctx.store.find_keys(&lookups).await?
        };
        for (l, f) in lookups.into_iter().zip(found) {
            ctx.found.insert((l.kind, l.key), f);
        }
        Ok(recorded)
    }

    /// The skip row to record with the read of the phase that starts with `guard`, when
    /// that guard decides on a hit alone ([`Guard::skips_on_hit`]): `template` with the
    /// reason, the content key and the finish time filled in.
    fn skip_row(
        ctx: &GuardContext<'_>,
        guard: &Arc<dyn Guard>,
        template: &RunRecord,
    ) -> Option<(KeyLookup, RunRecord)> {
        let (lookup, reason) = guard.skips_on_hit(ctx)?;
        let finished_at = crate::model::micros(Utc::now());
        Some((
            lookup,
            RunRecord {
                skip_reason: Some(reason),
                processing_key: ctx.content_key.clone(),
                previous_run_id: None,
                finished_at,
                duration_ms: (finished_at - template.started_at).num_milliseconds(),
                ..template.clone()
            },
        ))
    }

    /// The guards read again right after a claim by the lease guard at `i`: the earlier
    /// key guards that did not skip, and the next phase.
    fn after_claim<'s>(
        &'s self,
        i: usize,
        content_known: bool,
        decision: &Decision,
    ) -> AfterClaim<'s> {
        let end = self.phase_end(i + 1, content_known);
        let recheck: Vec<&Arc<dyn Guard>> = self.guards[..i]
            .iter()
            .filter(|g| !g.takes_lease())
            .filter(|g| {
                decision
                    .verdicts
                    .iter()
                    .any(|v| v.guard == g.name() && !matches!(v.verdict, Verdict::Skip(_)))
            })
            .collect();
        let mut batch = recheck.clone();
        batch.extend(self.guards[i + 1..end].iter());
        (recheck, batch, end)
    }

    /// The index just past the phase that starts at `from`: a phase ends before a lease
    /// guard and before a guard that needs a content key not computed yet, because the
    /// reads after those must wait for them.
    fn phase_end(&self, from: usize, content_known: bool) -> usize {
        let mut end = from;
        while let Some(g) = self.guards.get(end) {
            if g.takes_lease() || (g.content_hash().is_some() && !content_known) {
                break;
            }
            end += 1;
        }
        end
    }
}
