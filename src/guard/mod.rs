//! Guards: composable "may this run proceed?" checks in front of a processor.
//!
//! Each guard does one thing and answers [`Verdict::Proceed`] or [`Verdict::Skip`] with a
//! typed reason. A [`GuardStack`] runs them in the configured order; in `enforce` mode the
//! first skip wins. Users write their own guards by implementing [`Guard`].
//!
//! Lookups are batched: before any guard decides, the stack asks every guard which keys it
//! needs ([`Guard::lookups`]) and fetches them all in one store round trip, so a run costs
//! one read however many guards it has (this matters on BigQuery, where each query bills
//! at least 10 MB).
//!
//! The lease is a guard too. When a lease guard acquires its lease *after* other guards
//! have already said proceed, the stack looks up their keys again and asks them once more:
//! a run that completed between the first check and the claim is then seen, so a scope
//! never runs twice because two runs checked before either claimed.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::Result;
use crate::key::HashAlgorithm;
use crate::model::{KeyKind, KeyRecord, RunRequest, Skip};
use crate::store::{DynStore, KeyLookup, Lease};

mod content_hash;
mod lease;
mod time_window;

pub use content_hash::ContentHashGuard;
pub use lease::{LeaseGuard, OnHeld};
pub use time_window::TimeWindowGuard;

/// A guard's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// Nothing against running.
    Proceed {
        /// Why, for people (`no completed run within 1h`).
        detail: String,
    },
    /// The run should be skipped.
    Skip(Skip),
}

impl Verdict {
    /// A proceed verdict with a detail.
    pub fn proceed(detail: impl Into<String>) -> Self {
        Verdict::Proceed {
            detail: detail.into(),
        }
    }
}

/// What a guard sees.
pub struct GuardContext<'a> {
    /// The run being decided.
    pub request: &'a RunRequest,
    /// The store.
    pub store: &'a DynStore,
    /// Decision time.
    pub now: DateTime<Utc>,
    /// The content key, when a guard asked for content ([`Guard::content_hash`]).
    pub content_key: Option<&'a str>,
    /// True for `explain`: decide without side effects (no lease is claimed).
    pub dry_run: bool,
    /// True in shadow mode: a lease guard that finds the scope held proceeds anyway.
    pub shadow: bool,
    found: HashMap<(KeyKind, String), Option<KeyRecord>>,
    lease: Option<Lease>,
}

impl GuardContext<'_> {
    /// The prefetched key record for a lookup this guard declared, if one matched.
    pub fn found(&self, kind: KeyKind, key: &str) -> Option<&KeyRecord> {
        self.found
            .get(&(kind, key.to_string()))
            .and_then(|k| k.as_ref())
    }

    /// The lease held by this run, if a lease guard acquired one.
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// Records the lease this run now holds (for lease guards).
    pub fn set_lease(&mut self, lease: Lease) {
        self.lease = Some(lease);
    }
}

/// A check in front of a processor.
#[async_trait]
pub trait Guard: Send + Sync + Debug {
    /// The guard's name in verdicts (`lease`, `time_window`, `content_hash`).
    fn name(&self) -> &str;

    /// Keys this guard needs looked up; fetched for all guards in one round trip.
    fn lookups(&self, _ctx: &GuardContext<'_>) -> Vec<KeyLookup> {
        Vec::new()
    }

    /// The digest this guard needs a content key computed with, if it needs one.
    fn content_hash(&self) -> Option<HashAlgorithm> {
        None
    }

    /// True for guards that take the run's lease (they are not re-checked).
    fn takes_lease(&self) -> bool {
        false
    }

    /// Decides. May use the prefetched keys, the store, or anything else.
    async fn check(&self, ctx: &mut GuardContext<'_>) -> Result<Verdict>;
}

/// One guard's verdict, as shown by `explain` and recorded in reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GuardVerdict {
    /// The guard.
    pub guard: String,
    /// Its answer.
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// The result of running a stack.
#[derive(Debug, Default)]
pub struct Decision {
    /// Every evaluated guard's verdict, in order.
    pub verdicts: Vec<GuardVerdict>,
    /// The first skip, if any.
    pub skip: Option<Skip>,
    /// The lease this run holds, if a lease guard acquired it.
    pub lease: Option<Lease>,
}

/// Guards in order. Build with [`GuardStack::builder`].
///
/// ```
/// use std::time::Duration;
/// use idem::guard::{GuardStack, LeaseGuard, TimeWindowGuard, ContentHashGuard};
/// use idem::HashAlgorithm;
/// let stack = GuardStack::builder()
///     .guard(TimeWindowGuard::new(Duration::from_secs(3600)))
///     .guard(LeaseGuard::new(Duration::from_secs(3600)))
///     .guard(ContentHashGuard::new(Duration::from_secs(86_400), HashAlgorithm::Sha256))
///     .build();
/// assert_eq!(stack.names(), vec!["time_window", "lease", "content_hash"]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct GuardStack {
    guards: Vec<Arc<dyn Guard>>,
}

/// Builds a [`GuardStack`].
#[derive(Debug, Default)]
pub struct GuardStackBuilder {
    guards: Vec<Arc<dyn Guard>>,
}

impl GuardStackBuilder {
    /// Appends a guard.
    pub fn guard(mut self, guard: impl Guard + 'static) -> Self {
        self.guards.push(Arc::new(guard));
        self
    }

    /// Appends a guard when `Some`.
    pub fn option_guard<G: Guard + 'static>(self, guard: Option<G>) -> Self {
        match guard {
            Some(g) => self.guard(g),
            None => self,
        }
    }

    /// Appends a shared guard.
    pub fn shared(mut self, guard: Arc<dyn Guard>) -> Self {
        self.guards.push(guard);
        self
    }

    /// The stack.
    pub fn build(self) -> GuardStack {
        GuardStack {
            guards: self.guards,
        }
    }
}

impl GuardStack {
    /// A builder.
    pub fn builder() -> GuardStackBuilder {
        GuardStackBuilder::default()
    }

    /// Guard names in order.
    pub fn names(&self) -> Vec<&str> {
        self.guards.iter().map(|g| g.name()).collect()
    }

    /// True when there is no guard.
    pub fn is_empty(&self) -> bool {
        self.guards.is_empty()
    }

    /// The content digest the stack needs, if any guard needs one.
    pub fn content_hash(&self) -> Option<HashAlgorithm> {
        self.guards.iter().find_map(|g| g.content_hash())
    }

    async fn prefetch(&self, ctx: &mut GuardContext<'_>, guards: &[Arc<dyn Guard>]) -> Result<()> {
        let lookups: Vec<KeyLookup> = guards.iter().flat_map(|g| g.lookups(ctx)).collect();
        if lookups.is_empty() {
            return Ok(());
        }
        let found = ctx.store.find_keys(&lookups).await?;
        for (l, f) in lookups.into_iter().zip(found) {
            ctx.found.insert((l.kind, l.key), f);
        }
        Ok(())
    }

    /// Runs the guards. With `stop_at_first_skip` (enforce mode) evaluation stops at the
    /// first skip; otherwise (shadow, explain) every guard is evaluated and the first skip
    /// is reported. On error, a lease acquired so far is in the error path's hands: it is
    /// returned to the caller through `lease_out` so it can be released.
    pub async fn decide(
        &self,
        request: &RunRequest,
        store: &DynStore,
        now: DateTime<Utc>,
        content_key: Option<&str>,
        options: DecideOptions,
        lease_out: &mut Option<Lease>,
    ) -> Result<Decision> {
        let mut ctx = GuardContext {
            request,
            store,
            now,
            content_key,
            dry_run: options.dry_run,
            shadow: options.shadow,
            found: HashMap::new(),
            lease: None,
        };
        self.prefetch(&mut ctx, &self.guards).await?;
        let mut decision = Decision::default();
        for (i, guard) in self.guards.iter().enumerate() {
            let had_lease = ctx.lease.is_some();
            let verdict = guard.check(&mut ctx).await;
            if ctx.lease.is_some() {
                *lease_out = ctx.lease.clone();
            }
            let mut verdict = verdict?;
            // A lease taken after other guards said proceed: ask those again.
            if !had_lease && ctx.lease.is_some() && matches!(verdict, Verdict::Proceed { .. }) {
                let earlier: Vec<Arc<dyn Guard>> = self.guards[..i]
                    .iter()
                    .filter(|g| !g.takes_lease())
                    .cloned()
                    .collect();
                if !earlier.is_empty() {
                    self.prefetch(&mut ctx, &earlier).await?;
                    for g in &earlier {
                        if let Verdict::Skip(skip) = g.check(&mut ctx).await? {
                            tracing::debug!(
                                guard = g.name(),
                                "re-check after claiming the lease skips"
                            );
                            if let Some(v) =
                                decision.verdicts.iter_mut().find(|v| v.guard == g.name())
                            {
                                v.verdict = Verdict::Skip(skip.clone());
                            }
                            verdict =
                                Verdict::proceed("lease acquired, but an earlier guard now skips");
                            if decision.skip.is_none() {
                                decision.skip = Some(skip);
                            }
                            break;
                        }
                    }
                }
            }
            if let Verdict::Skip(skip) = &verdict {
                if decision.skip.is_none() {
                    decision.skip = Some(skip.clone());
                }
            }
            decision.verdicts.push(GuardVerdict {
                guard: guard.name().to_string(),
                verdict,
            });
            if options.stop_at_first_skip && decision.skip.is_some() {
                break;
            }
        }
        decision.lease = ctx.lease;
        Ok(decision)
    }
}

/// How [`GuardStack::decide`] evaluates.
#[derive(Debug, Clone, Copy, Default)]
pub struct DecideOptions {
    /// Stop at the first skip (enforce).
    pub stop_at_first_skip: bool,
    /// Decide without side effects (explain).
    pub dry_run: bool,
    /// Shadow mode.
    pub shadow: bool,
}

/// Formats a duration like `1h`, `90m`, `45s`.
pub fn human_duration(d: std::time::Duration) -> String {
    let s = d.as_secs();
    if s > 0 && s.is_multiple_of(86_400) {
        format!("{}d", s / 86_400)
    } else if s > 0 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s > 0 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else if s > 0 {
        format!("{s}s")
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Formats how long ago `then` was, relative to `now`.
pub fn ago(now: DateTime<Utc>, then: DateTime<Utc>) -> String {
    let secs = (now - then).num_seconds().max(0) as u64;
    if secs < 120 {
        format!("{secs}s ago")
    } else if secs < 7200 {
        format!("{}m ago", secs / 60)
    } else {
        format!("{}h{}m ago", secs / 3600, (secs % 3600) / 60)
    }
}
