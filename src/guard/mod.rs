//! Guards: composable "may this run proceed?" checks in front of a processor.
//!
//! Each guard does one thing and answers [`Verdict::Proceed`] or [`Verdict::Skip`] with a
//! typed reason. A [`GuardStack`] runs them in the configured order; in `enforce` mode the
//! first skip wins. Users write their own guards by implementing [`Guard`].
//!
//! A run decides in phases, so a skip is cheap: guards are asked in order, the keys the
//! guards of a phase need ([`Guard::lookups`]) are fetched in one store round trip (this
//! matters on BigQuery, where each query bills at least 10 MB), and the content key —
//! which may mean a warehouse query — is computed only when a guard that needs it is
//! reached, so a run the time window skips never describes its content.
//!
//! The lease is a guard too. Once a lease guard acquires the lease, every key-based guard
//! decides on keys read after the claim, whatever the order: the guards before the lease
//! are asked again and the guards after it read fresh keys. A run that completed between
//! another run's check and its claim (or while it waited for the lease) is then seen, so
//! a scope never runs twice.
//!
//! In enforce mode two more round trips go where the store can (BigQuery): the lease
//! holder is read with the first keys when a lease guard comes later, so a scope another
//! run holds skips `in_progress` before its content is described
//! ([`Guard::skip_when_held`]); and a guard that decides on one key's hit alone
//! ([`Guard::skips_on_hit`], the content hash) has its skip's ledger row recorded with the
//! read that finds the key.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::Result;
use crate::key::HashAlgorithm;
use crate::model::{KeyKind, KeyRecord, RunRequest, Skip, SkipReason};
use crate::store::{DynStore, KeyLookup, Lease, LeaseHolder};

mod decide;
pub(crate) use decide::Ask;

mod content_hash;
mod lease;
mod time_window;

pub use content_hash::ContentHashGuard;
pub use lease::{LeaseGuard, OnHeld};
pub use time_window::{OnChange, TimeWindowGuard};

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
    /// The guard could not decide (only from `explain`, for example when the content
    /// query needs the job's setup, which `explain` does not run unless asked).
    Unknown {
        /// Why.
        detail: String,
    },
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
    /// The content key, once a guard that needs one was reached ([`Guard::content_hash`]).
    pub content_key: Option<String>,
    /// True for `explain`: decide without side effects (no lease is claimed).
    pub dry_run: bool,
    /// True in shadow mode: a lease guard that finds the scope held proceeds anyway.
    pub shadow: bool,
    /// The processor's version (empty when it has none): the time window tells a run of
    /// changed code from a repeat.
    pub version: String,
    found: HashMap<(KeyKind, String), Option<KeyRecord>>,
    lease: Option<Lease>,
    /// Who held the lease when the keys of the phase before the lease guard were read,
    /// when the store read it with them ([`LedgerStore::find_keys_and_holder`]).
    ///
    /// [`LedgerStore::find_keys_and_holder`]: crate::store::LedgerStore::find_keys_and_holder
    holder_seen: Option<Option<LeaseHolder>>,
    /// The lookups to read right after a claim (the re-check), sent with the claim
    /// ([`LeaseStore::claim_and_find`](crate::store::LeaseStore::claim_and_find)).
    claim_lookups: Vec<KeyLookup>,
    /// Their answers, when the store read them with the claim.
    found_with_claim: Option<Vec<(KeyLookup, Option<KeyRecord>)>>,
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

    /// The kind of key this guard reads and how far back it looks (its window): a key the
    /// run writes is kept at least that long ([`KeyRecord::keep_until`]). `None` (the
    /// default) for a guard that reads no key.
    ///
    /// [`KeyRecord::keep_until`]: crate::model::KeyRecord::keep_until
    fn reads_keys(&self) -> Option<(KeyKind, std::time::Duration)> {
        None
    }

    /// The lookup whose hit alone decides this guard, and the reason it then skips with:
    /// the guard skips with `reason` (its previous run: the key's run) exactly when the
    /// key is found, and proceeds when it is not. In enforce mode a store may then record
    /// the skip with the read that finds the key
    /// ([`LedgerStore::find_keys_recording_skip`]), one round trip fewer. `None` (the
    /// default) for a guard that decides on anything else.
    ///
    /// [`LedgerStore::find_keys_recording_skip`]: crate::store::LedgerStore::find_keys_recording_skip
    fn skips_on_hit(&self, _ctx: &GuardContext<'_>) -> Option<(KeyLookup, SkipReason)> {
        None
    }

    /// For a lease guard: its verdict when the scope was seen held by `holder` in a read
    /// made before the guard was reached, if it would skip on that at once (no claim, no
    /// wait). In enforce mode the stack then skips there, without asking the guards in
    /// between (nor describing the content). `None` (the default): the guard is asked in
    /// turn.
    fn skip_when_held(&self, _ctx: &GuardContext<'_>, _holder: &LeaseHolder) -> Option<Verdict> {
        None
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
    /// The content key, when a guard needed one and it was computed.
    pub content: Option<ContentKey>,
}

/// What [`GuardStack::after_claim`] answers: the guards asked again, every guard read
/// after the claim, and the end of the phase read.
type AfterClaim<'s> = (Vec<&'s Arc<dyn Guard>>, Vec<&'s Arc<dyn Guard>>, usize);

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

    /// True when a guard of the stack takes the run's lease.
    pub fn takes_lease(&self) -> bool {
        self.guards.iter().any(|g| g.takes_lease())
    }

    /// The content digest the stack needs, if any guard needs one.
    pub fn content_hash(&self) -> Option<HashAlgorithm> {
        self.guards.iter().find_map(|g| g.content_hash())
    }

    /// How long the stack's guards need a key of `kind` ([`Guard::reads_keys`]): the
    /// longest window of those that read it, `None` when none does.
    pub fn window_of(&self, kind: KeyKind) -> Option<std::time::Duration> {
        self.guards
            .iter()
            .filter_map(|g| g.reads_keys())
            .filter(|(k, _)| *k == kind)
            .map(|(_, window)| window)
            .max()
    }

    /// Runs the guards in order and decides.
    ///
    /// Phases keep a skip cheap: guards are asked in order, and the store reads of each
    /// phase (the guards up to the next lease or content guard) are fetched in one round
    /// trip; the content key is computed (`content`, which may query a warehouse) only
    /// when a guard that needs it is reached, so in enforce mode a run skipped by an
    /// earlier guard never describes its content.
    ///
    /// Once a lease guard acquires the lease, every key-based guard, before it or after
    /// it, decides on keys read *after* the claim: the earlier ones are asked again, the
    /// later ones read for the first time. So whatever the order, a run that completed
    /// while this one was checking or waiting for the lease is seen and the scope is not
    /// processed twice.
    ///
    /// With `stop_at_first_skip` (enforce mode) evaluation stops at the first skip;
    /// otherwise (shadow, explain) every guard is evaluated and the first skip is
    /// reported. On error, a lease acquired so far is returned through `lease_out` so the
    /// caller can release it.
    ///
    /// In enforce mode (`stop_at_first_skip`, neither `dry_run` nor `shadow`), when a lease
    /// guard comes after a guard that needs the content, the lease holder is read with the
    /// first keys already (where the store can): a scope held by another run then skips
    /// `in_progress` there, without describing the content, if the lease guard skips on a
    /// held scope ([`Guard::skip_when_held`]). The skip reported is then `in_progress`
    /// even where the content guard would have skipped too; shadow mode and `explain`
    /// ask every guard in order, as before.
    pub async fn decide(
        &self,
        request: &RunRequest,
        store: &DynStore,
        now: DateTime<Utc>,
        content: &dyn ContentSource,
        options: DecideOptions,
        lease_out: &mut Option<Lease>,
    ) -> Result<Decision> {
        let ask = Ask {
            request,
            store,
            now,
            content,
            options,
            skip_row: None,
        };
        Ok(self.decide_recording(&ask, lease_out).await?.0)
    }
}

/// A content key computed for a run: the digest, and the number of entities or rows the
/// description listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentKey {
    /// The key (hex digest).
    pub key: String,
    /// Entities (or rows) in the description, when it lists them.
    pub entity_count: Option<i64>,
}

/// Why a content key could not be computed.
#[derive(Debug)]
pub enum ContentError {
    /// Describing the content failed (the processor's own error, as text); `explain`
    /// shows it as the content guard's verdict instead of failing.
    Unavailable(String),
    /// Anything else.
    Failed(crate::error::Error),
}

/// Computes the run's content key when the first guard that needs one is reached.
#[async_trait]
pub trait ContentSource: Send + Sync {
    /// The processor's version ([`Processor::version`](crate::processor::Processor::version)):
    /// a guard compares it with the one a key was written with. Empty by default.
    fn version(&self) -> String {
        String::new()
    }

    /// The content key with `algorithm`, or `None` when the processor describes no
    /// content.
    async fn content_key(
        &self,
        algorithm: HashAlgorithm,
    ) -> std::result::Result<Option<ContentKey>, ContentError>;
}

/// A [`ContentSource`] for stacks without a content guard, or for a key known up front.
#[derive(Debug, Clone, Default)]
pub struct KnownContent(pub Option<ContentKey>);

#[async_trait]
impl ContentSource for KnownContent {
    async fn content_key(
        &self,
        _: HashAlgorithm,
    ) -> std::result::Result<Option<ContentKey>, ContentError> {
        Ok(self.0.clone())
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
