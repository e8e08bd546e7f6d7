//! Claim (processor, scope) before processing, so a scope never runs twice at once.

use std::time::Duration;

use async_trait::async_trait;

use super::{ago, human_duration, Guard, GuardContext, Verdict};
use crate::error::Result;
use crate::model::{PreviousRun, Skip, SkipReason};
use crate::store::{Claim, ClaimRequest, LeaseHolder};

/// What a run does when another run holds the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnHeld {
    /// Skip with `in_progress` at once.
    Skip,
    /// Poll until the lease frees or `max` passes, then skip with `in_progress`.
    Wait {
        /// Longest wait.
        max: Duration,
    },
}

/// Claims a lease with an expiry; a concurrent run gets `in_progress`. A crashed run's
/// lease expires after `ttl`; a run whose lease expired and was taken over cannot record
/// its result (fencing token).
#[derive(Debug, Clone)]
pub struct LeaseGuard {
    ttl: Duration,
    on_held: OnHeld,
}

impl LeaseGuard {
    /// A lease guard with the given lease duration that skips when the scope is held.
    pub fn new(ttl: Duration) -> Self {
        LeaseGuard {
            ttl,
            on_held: OnHeld::Skip,
        }
    }

    /// Sets what happens when the scope is held.
    pub fn on_held(mut self, on_held: OnHeld) -> Self {
        self.on_held = on_held;
        self
    }

    /// The lease duration.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The skip for a held scope; `waited` is how long this run waited for it to free.
    fn held(
        &self,
        ctx: &GuardContext<'_>,
        holder: LeaseHolder,
        waited: Option<Duration>,
    ) -> Verdict {
        let waited = waited
            .map(|w| {
                format!(
                    ", after waiting {}",
                    human_duration(Duration::from_secs(w.as_secs_f64().round() as u64))
                )
            })
            .unwrap_or_default();
        Verdict::Skip(Skip {
            reason: SkipReason::InProgress,
            detail: format!(
                "run {} holds the lease on {} for {} since {} ({}), until {}{waited}",
                holder.run_id,
                ctx.request.processor,
                ctx.request.scope,
                crate::model::time::utc_text(holder.acquired_at),
                ago(ctx.now, holder.acquired_at),
                crate::model::time::utc_text(holder.expires_at),
            ),
            previous_run: Some(PreviousRun {
                run_id: holder.run_id,
                at: holder.acquired_at,
            }),
        })
    }
}

#[async_trait]
impl Guard for LeaseGuard {
    fn name(&self) -> &str {
        "lease"
    }

    fn takes_lease(&self) -> bool {
        true
    }

    /// Skips on a scope another run holds, unless it waits for the lease.
    fn skip_when_held(&self, ctx: &GuardContext<'_>, holder: &LeaseHolder) -> Option<Verdict> {
        (self.on_held == OnHeld::Skip && holder.run_id != ctx.request.run_id)
            .then(|| self.held(ctx, holder.clone(), None))
    }

    async fn check(&self, ctx: &mut GuardContext<'_>) -> Result<Verdict> {
        if ctx.dry_run {
            return Ok(
                match ctx
                    .store
                    .lease_holder(&ctx.request.processor, &ctx.request.scope, ctx.now)
                    .await?
                {
                    Some(holder) => self.held(ctx, holder, None),
                    None => Verdict::proceed(format!(
                        "scope is free; a run would hold it for up to {}",
                        human_duration(self.ttl)
                    )),
                },
            );
        }
        // The scope was seen held with the keys just read (one round trip fewer): skip
        // without claiming. A run that waits for the lease claims as usual.
        if let Some(Some(holder)) = ctx.holder_seen.take() {
            if holder.run_id != ctx.request.run_id && (self.on_held == OnHeld::Skip || ctx.shadow) {
                return Ok(self.held(ctx, holder, None));
            }
        }
        let started = std::time::Instant::now();
        let mut polls = 0u32;
        // The wait is cancelled from outside: the runner drops this future when its
        // cancellation token fires (SIGINT/SIGTERM, the scheduler's grace period end).
        loop {
            let now = if started.elapsed().is_zero() {
                ctx.now
            } else {
                crate::model::micros(chrono::Utc::now())
            };
            // Read after the claim, with it (the guard stack's re-check).
            let lookups = ctx.claim_lookups.clone();
            let (claim, found) = ctx
                .store
                .claim_and_find(
                    &ClaimRequest {
                        processor: &ctx.request.processor,
                        scope: &ctx.request.scope,
                        run_id: &ctx.request.run_id,
                        ttl: self.ttl,
                        now,
                    },
                    &lookups,
                )
                .await?;
            match claim {
                Claim::Acquired(lease) => {
                    ctx.found_with_claim =
                        found.map(|found| lookups.into_iter().zip(found).collect());
                    let detail = format!(
                        "lease acquired (token {}) until {}",
                        lease.token,
                        crate::model::time::utc_text(lease.expires_at)
                    );
                    ctx.set_lease(lease);
                    return Ok(Verdict::proceed(detail));
                }
                Claim::Held(holder) => match self.on_held {
                    OnHeld::Wait { max } if started.elapsed() < max && !ctx.shadow => {
                        if polls == 0 {
                            tracing::info!(
                                "run {} holds the lease on {} for {}: waiting up to {} for it",
                                holder.run_id,
                                ctx.request.processor,
                                ctx.request.scope,
                                human_duration(max)
                            );
                        }
                        // Back off (250 ms doubling to 30 s): on BigQuery every poll is a
                        // billed query.
                        let left = max.saturating_sub(started.elapsed());
                        let pause =
                            Duration::from_millis(250 << polls.min(7)).min(Duration::from_secs(30));
                        polls += 1;
                        tokio::time::sleep(left.min(pause)).await;
                    }
                    OnHeld::Wait { .. } if polls > 0 => {
                        return Ok(self.held(ctx, holder, Some(started.elapsed())))
                    }
                    _ => return Ok(self.held(ctx, holder, None)),
                },
            }
        }
    }
}
