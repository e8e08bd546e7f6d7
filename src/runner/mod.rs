//! The runner: puts the guard stack in front of a processor and records the outcome.
//!
//! Order of a run: describe the content (when a guard needs a content key) → decide
//! (guards, one prefetch round trip, the lease) → skip, or process while a heartbeat
//! renews the lease → [`LedgerStore::finish`](crate::store::LedgerStore::finish): the ledger row, the
//! keys *only on success*, the lease release, in one transaction where the store allows.
//!
//! Store failures follow the [`StoreFailurePolicy`]: `strict` fails the run before
//! processing; `best_effort` runs anyway, warns and counts the failure in the report.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::{BoxError, Error, Result};
use crate::guard::{
    ContentError, ContentKey, ContentSource, DecideOptions, Decision, GuardStack, GuardVerdict,
};
use crate::key::scope_key;
use crate::key::HashAlgorithm;
use crate::model::{
    exit, micros, KeyKind, KeyRecord, Mode, Outcome, PreviousRun, RunRecord, RunRequest, RunStatus,
    Skip, SkipReason, Trigger,
};
use crate::processor::{ExitStatusError, Processor};
use crate::store::spool::Spool;
use crate::store::{DynStore, Finish, Lease};

pub use crate::cancel::Cancel;

/// What to do when the store cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreFailurePolicy {
    /// The run fails before processing, with a clear error (exit code 3).
    #[default]
    Strict,
    /// The run proceeds unguarded; the failure is logged and counted.
    BestEffort,
}

impl StoreFailurePolicy {
    /// The name in job files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreFailurePolicy::Strict => "strict",
            StoreFailurePolicy::BestEffort => "best_effort",
        }
    }
}

#[cfg(feature = "cli")]
crate::model::value_enum!(StoreFailurePolicy: StoreFailurePolicy::Strict, StoreFailurePolicy::BestEffort);

impl std::str::FromStr for StoreFailurePolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "strict" => Ok(StoreFailurePolicy::Strict),
            "best_effort" => Ok(StoreFailurePolicy::BestEffort),
            _ => Err(Error::config(format!(
                "unknown store failure policy {s:?}: expected strict or best_effort"
            ))),
        }
    }
}

/// Whether and how a run's result reached the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Recording {
    /// Not recorded: not attempted yet, or the store failed and the failure was tolerated
    /// (logged and counted in `store_errors`).
    #[default]
    NotRecorded,
    /// The ledger row (and keys on success) were written.
    Recorded,
    /// The run's lease expired and was taken over before it finished: no key was written;
    /// `recorded` tells whether its ledger row was.
    LeaseLost {
        /// The ledger row was written.
        recorded: bool,
    },
    /// The result could not be recorded and went to the local spool instead
    /// (`best_effort`); the next command that reaches the store records it.
    Spooled,
    /// The work ran but its result could not be recorded and the policy made that a
    /// failure (exit code 3).
    Failed,
}

impl Recording {
    /// True when the ledger row was written.
    pub fn recorded(self) -> bool {
        matches!(
            self,
            Recording::Recorded | Recording::LeaseLost { recorded: true }
        )
    }
}

/// The result of one run, as printed by `idem run`.
///
/// Serialized with the [`Recording`] spelled out as the booleans `recorded`, `lease_lost`,
/// `recording_failed` and `spooled`.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The run id.
    pub run_id: String,
    /// The job's name (the run's `processor_name` in the ledger).
    pub job: String,
    /// Scope.
    pub scope: String,
    /// Trigger.
    pub trigger: Trigger,
    /// Mode in force.
    pub mode: Mode,
    /// Final status.
    pub status: RunStatus,
    /// Why it was skipped.
    pub skip_reason: Option<SkipReason>,
    /// What would have skipped it (shadow mode).
    pub would_skip_reason: Option<SkipReason>,
    /// The earlier run a (would-be) skip points at.
    pub previous_run: Option<PreviousRun>,
    /// A sentence explaining the (would-be) skip.
    pub detail: Option<String>,
    /// Records processed.
    pub records_processed: Option<i64>,
    /// The content key.
    pub processing_key: Option<String>,
    /// The processor's output.
    pub output: Option<serde_json::Value>,
    /// The error, when failed.
    pub error: Option<String>,
    /// Every evaluated guard's verdict.
    pub guards: Vec<GuardVerdict>,
    /// Whether and how the result reached the ledger.
    pub recording: Recording,
    /// Store failures met on the way, each saying when (`checking the guards: …`,
    /// `recording the run: …`): tolerated under `best_effort`; under `strict` a failed
    /// recording also fails the command (exit 3).
    pub store_errors: Vec<String>,
    /// Start time.
    pub started_at: DateTime<Utc>,
    /// End time.
    pub finished_at: DateTime<Utc>,
    /// Duration in milliseconds.
    pub duration_ms: i64,
    /// The exit status a failed run's processor named
    /// ([`ExitStatusError`](crate::ExitStatusError)): a command job's program's own (its
    /// code, 128+N for signal N, 124 past its timeout), which the CLI exits with. Not in
    /// the JSON report.
    pub exit_status: Option<u8>,
}

impl Serialize for RunReport {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("RunReport", 23)?;
        s.serialize_field("run_id", &self.run_id)?;
        s.serialize_field("job", &self.job)?;
        s.serialize_field("scope", &self.scope)?;
        s.serialize_field("trigger", &self.trigger)?;
        s.serialize_field("mode", &self.mode)?;
        s.serialize_field("status", &self.status)?;
        s.serialize_field("skip_reason", &self.skip_reason)?;
        s.serialize_field("would_skip_reason", &self.would_skip_reason)?;
        s.serialize_field("previous_run", &self.previous_run)?;
        s.serialize_field("detail", &self.detail)?;
        s.serialize_field("records_processed", &self.records_processed)?;
        s.serialize_field("processing_key", &self.processing_key)?;
        s.serialize_field("output", &self.output)?;
        s.serialize_field("error", &self.error)?;
        s.serialize_field("guards", &self.guards)?;
        s.serialize_field("recorded", &self.recorded())?;
        s.serialize_field("lease_lost", &self.lease_lost())?;
        s.serialize_field("store_errors", &self.store_errors)?;
        s.serialize_field("recording_failed", &self.recording_failed())?;
        s.serialize_field("spooled", &self.spooled())?;
        s.serialize_field("started_at", &self.started_at)?;
        s.serialize_field("finished_at", &self.finished_at)?;
        s.serialize_field("duration_ms", &self.duration_ms)?;
        s.end()
    }
}

impl RunReport {
    fn new(request: &RunRequest, mode: Mode, started_at: DateTime<Utc>) -> Self {
        RunReport {
            run_id: request.run_id.clone(),
            job: request.processor.clone(),
            scope: request.scope.clone(),
            trigger: request.trigger,
            mode,
            status: RunStatus::Completed,
            skip_reason: None,
            would_skip_reason: None,
            previous_run: None,
            detail: None,
            records_processed: None,
            processing_key: None,
            output: None,
            error: None,
            guards: Vec::new(),
            recording: Recording::NotRecorded,
            store_errors: Vec::new(),
            started_at,
            finished_at: started_at,
            duration_ms: 0,
            exit_status: None,
        }
    }

    /// The CLI's exit code for this report: 0 completed or skipped, 1 failed (or the
    /// status the processor named: [`RunReport::exit_status`]), 3 the result could not be
    /// recorded under a strict policy.
    pub fn exit_code(&self) -> u8 {
        match self.status {
            RunStatus::Completed | RunStatus::Skipped => exit::OK,
            RunStatus::Failed if self.recording_failed() => exit::STORE_UNAVAILABLE,
            RunStatus::Failed => self.exit_status.unwrap_or(exit::RUN_FAILED),
        }
    }

    /// True when the ledger row (and keys) were written.
    pub fn recorded(&self) -> bool {
        self.recording.recorded()
    }

    /// True when the run's lease expired and was taken over before it finished.
    pub fn lease_lost(&self) -> bool {
        matches!(self.recording, Recording::LeaseLost { .. })
    }

    /// True when the work ran but its result could not be recorded and the policy made
    /// that a failure (exit code 3).
    pub fn recording_failed(&self) -> bool {
        self.recording == Recording::Failed
    }

    /// True when the result was written to the local spool instead of the store.
    pub fn spooled(&self) -> bool {
        self.recording == Recording::Spooled
    }

    fn ledger_row(&self, request: &RunRequest) -> RunRecord {
        RunRecord {
            run_id: self.run_id.clone(),
            processor: self.job.clone(),
            scope: self.scope.clone(),
            scope_date: request.scope_date,
            trigger: self.trigger,
            mode: self.mode,
            started_at: self.started_at,
            finished_at: self.finished_at,
            duration_ms: self.duration_ms,
            status: self.status,
            skip_reason: self.skip_reason.clone(),
            would_skip_reason: self.would_skip_reason.clone(),
            previous_run_id: self.previous_run.as_ref().map(|p| p.run_id.clone()),
            records_processed: self.records_processed,
            processing_key: self.processing_key.clone(),
            error: self.error.clone(),
            output: self.output.clone(),
        }
    }
}

/// The decision `explain` shows: every guard's verdict, nothing run or claimed.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// Processor (job) name.
    pub job: String,
    /// Scope.
    pub scope: String,
    /// Mode in force.
    pub mode: Mode,
    /// `run` or `skip` (in shadow mode a skip is reported as `run`, with the would-skip).
    pub decision: &'static str,
    /// The first skip reason in guard order.
    pub skip_reason: Option<SkipReason>,
    /// Its explanation.
    pub detail: Option<String>,
    /// The earlier run it points at.
    pub previous_run: Option<PreviousRun>,
    /// The content key, when computed.
    pub processing_key: Option<String>,
    /// Every guard's verdict.
    pub guards: Vec<GuardVerdict>,
}

/// The runner's [`ContentSource`]: prepares the processor (once) and describes the
/// content when the first guard that needs a content key asks.
struct Describe<'a> {
    processor: &'a dyn Processor,
    request: &'a RunRequest,
    with_prepare: bool,
    prepared: tokio::sync::OnceCell<()>,
    /// The exit status a failed description named ([`ExitStatusError`]).
    failed_status: std::sync::OnceLock<u8>,
}

impl<'a> Describe<'a> {
    fn new(processor: &'a dyn Processor, request: &'a RunRequest, with_prepare: bool) -> Self {
        Describe {
            processor,
            request,
            with_prepare,
            prepared: tokio::sync::OnceCell::new(),
            failed_status: std::sync::OnceLock::new(),
        }
    }

    async fn prepare(&self) -> std::result::Result<(), BoxError> {
        if !self.with_prepare {
            return Ok(());
        }
        self.prepared
            .get_or_try_init(|| self.processor.prepare(self.request))
            .await
            .map(|_| ())
    }
}

#[async_trait::async_trait]
impl ContentSource for Describe<'_> {
    fn version(&self) -> String {
        self.processor.version()
    }

    async fn content_key(
        &self,
        algorithm: HashAlgorithm,
    ) -> std::result::Result<Option<ContentKey>, ContentError> {
        let described = async {
            self.prepare().await?;
            self.processor.describe(self.request).await
        };
        let described = described.await;
        if let Err(e) = &described {
            if let Some(status) = ExitStatusError::status_of(&**e) {
                let _ = self.failed_status.set(status);
            }
        }
        match described {
            Ok(content) => Ok(content.map(|content| ContentKey {
                key: content.key_with_version(
                    &self.request.processor,
                    &self.request.scope,
                    &self.processor.version(),
                    algorithm,
                ),
                entity_count: content.entity_count(),
            })),
            Err(e) if self.with_prepare => Err(ContentError::Unavailable(e.to_string())),
            Err(e) => Err(ContentError::Unavailable(format!(
                "the content could not be described: {e} (explain does not run the job's setup; add --with-setup to run it first)"
            ))),
        }
    }
}

/// Runs processors behind guards.
#[derive(Debug, Clone)]
pub struct Runner {
    store: Arc<DynStore>,
    guards: GuardStack,
    mode: Mode,
    policy: StoreFailurePolicy,
    strict_recording: Option<bool>,
    heartbeat: bool,
    cancel: Option<Cancel>,
    spool: Option<Spool>,
}

fn now() -> DateTime<Utc> {
    micros(Utc::now())
}

impl Runner {
    /// A runner over `store` with `guards`, enforce mode, strict store policy, heartbeat on.
    pub fn new(store: Arc<DynStore>, guards: GuardStack) -> Self {
        Runner {
            store,
            guards,
            mode: Mode::Enforce,
            policy: StoreFailurePolicy::Strict,
            strict_recording: None,
            heartbeat: true,
            cancel: None,
            spool: None,
        }
    }

    /// Sets the mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the store failure policy.
    pub fn store_failure_policy(mut self, policy: StoreFailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// When true, a completed run whose result cannot be recorded (store unreachable at
    /// the end) is reported as failed, exit code 3. Default: true under the `strict`
    /// store policy, false under `best_effort` (logged and counted instead).
    pub fn strict_recording(mut self, strict: bool) -> Self {
        self.strict_recording = Some(strict);
        self
    }

    /// When `cancel` is cancelled during processing, the processor is stopped, the run
    /// recorded as failed (`interrupted by REASON`) and the lease released, so the next run
    /// need not wait for the lease to expire. Cancelled before processing (waiting for the
    /// lease, in the setup or content query, between store retries), the run stops at once,
    /// claims nothing and is recorded as failed (`interrupted by REASON, before processing: …`).
    /// Either way the runner waits (up to 2 s) until the cancellation of the warehouse
    /// statements it dropped was sent ([`crate::backend::cancels_sent`]). The library installs no signal handler: the
    /// CLI cancels on SIGINT/SIGTERM. None by default.
    pub fn cancel_on(mut self, cancel: Cancel) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// Runs on without a cancellation token (see [`Runner::cancel_on`]).
    pub fn without_cancel(mut self) -> Self {
        self.cancel = None;
        self
    }

    /// When true (the default), a held lease is renewed every third of its duration while
    /// the processor works, so only a crashed or stalled run loses it.
    pub fn heartbeat(mut self, on: bool) -> Self {
        self.heartbeat = on;
        self
    }

    /// Where results go when the store cannot take them and recording is not strict, so
    /// the ledger catches up later (see [`Spool`]). Off by default; the CLI sets it.
    pub fn spool(mut self, spool: Spool) -> Self {
        self.spool = Some(spool);
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<DynStore> {
        &self.store
    }

    /// Explains what a run would do now, without running the processor, preparing it (a
    /// SQL job's `setup`) or claiming the lease: nothing changes anywhere. A content query
    /// that needs the setup's tables shows the content guard as unknown instead of
    /// failing.
    pub async fn explain(
        &self,
        processor: &dyn Processor,
        request: &RunRequest,
    ) -> Result<Explanation> {
        self.explain_with(processor, request, false).await
    }

    /// [`Runner::explain`], running the processor's [`prepare`](Processor::prepare) first
    /// when `with_setup` is true.
    pub async fn explain_with(
        &self,
        processor: &dyn Processor,
        request: &RunRequest,
        with_setup: bool,
    ) -> Result<Explanation> {
        let decision = if self.mode == Mode::Off {
            Decision::default()
        } else {
            let content = Describe::new(processor, request, with_setup);
            self.guards
                .decide(
                    request,
                    &*self.store,
                    now(),
                    &content,
                    DecideOptions {
                        stop_at_first_skip: false,
                        dry_run: true,
                        shadow: self.mode == Mode::Shadow,
                    },
                    &mut None,
                )
                .await?
        };
        let skip = decision.skip;
        Ok(Explanation {
            job: request.processor.clone(),
            scope: request.scope.clone(),
            mode: self.mode,
            decision: if skip.is_some() && self.mode == Mode::Enforce {
                "skip"
            } else {
                "run"
            },
            skip_reason: skip.as_ref().map(|s| s.reason.clone()),
            detail: skip.as_ref().map(|s| s.detail.clone()),
            previous_run: skip.and_then(|s| s.previous_run),
            processing_key: decision.content.map(|c| c.key),
            guards: decision.verdicts,
        })
    }

    /// Runs `processor` for `request` behind the guards and records the outcome.
    ///
    /// Returns `Err` only when the run could not be attempted: a store failure under
    /// `strict` ([`Error::is_store_failure`]) or bad configuration. A failing processor
    /// gives `Ok` with status `failed`.
    ///
    /// The steps: decide (the guards), then either record a skip, or process and record
    /// the outcome with the keys of a success.
    pub async fn run(&self, processor: &dyn Processor, request: RunRequest) -> Result<RunReport> {
        // The stops this run sends (its statements' cancels, its program's tree) are its
        // own to wait for: another run in the process never takes them.
        crate::backend::with_own_cancels(self.run_guarded(processor, request)).await
    }

    async fn run_guarded(
        &self,
        processor: &dyn Processor,
        request: RunRequest,
    ) -> Result<RunReport> {
        request.validate()?;
        let request = self.settle_run_id(request).await;
        let started_at = now();
        let mut report = RunReport::new(&request, self.mode, started_at);
        tracing::info!(
            job = %request.processor,
            scope = %request.scope,
            run_id = %request.run_id,
            trigger = %request.trigger,
            mode = %self.mode,
            "run requested"
        );
        let content = Describe::new(processor, &request, true);
        // Deciding may wait: for the lease (`on_in_progress = "wait"`), for the job's setup
        // and content queries, for store retries. A cancellation stops all of it.
        let deciding = std::time::Instant::now();
        let decided = {
            let decide = self.decide(&request, &content, &mut report);
            match &self.cancel {
                None => Ok(decide.await),
                Some(cancel) => tokio::select! {
                    biased;
                    reason = cancel.cancelled() => Err(reason),
                    decided = decide => Ok(decided),
                },
            }
        };
        let (decision, recorded) = match decided {
            Ok(decided) => match decided? {
                Decided::Go(decision, recorded) => (decision, recorded),
                Decided::Failed(lease) => {
                    report.exit_status = content.failed_status.get().copied();
                    crate::backend::cancels_sent(CANCEL_SEND_TIMEOUT).await;
                    return Ok(self.record(report, &request, lease, Vec::new()).await);
                }
            },
            Err(reason) => {
                return Ok(self
                    .interrupted_deciding(report, &request, reason, deciding.elapsed())
                    .await)
            }
        };
        report.guards = decision.verdicts;
        let lease = decision.lease;
        let entity_count = decision.content.as_ref().and_then(|c| c.entity_count);
        report.processing_key = decision.content.map(|c| c.key);
        if let Some(skip) = decision.skip {
            if self.note_skip(skip, &request, &mut report) {
                if let Some(row) = recorded {
                    // Recorded with the guards' read (enforce mode, no lease taken).
                    return Ok(self.recorded_with_read(report, &request, *row));
                }
                return Ok(self.record(report, &request, lease, Vec::new()).await);
            }
        }
        let processed = self
            .process(processor, &request, &content, lease.clone())
            .await;
        // An interrupted processor's statements are cancelled on the warehouse (Postgres)
        // in the background: wait (bounded) until the cancel is sent, so a run recorded as
        // interrupted, its lease released, leaves nothing running behind it.
        crate::backend::cancels_sent(CANCEL_SEND_TIMEOUT).await;
        match processed {
            Ok(Outcome {
                records_processed,
                output,
            }) => {
                report.status = RunStatus::Completed;
                report.records_processed = Some(records_processed);
                report.output = output;
            }
            Err(e) => {
                report.status = RunStatus::Failed;
                report.exit_status = ExitStatusError::status_of(&*e);
                report.error = Some(e.to_string());
            }
        }
        let processed_at = now();
        match &report.error {
            None => tracing::info!(
                job = %request.processor,
                scope = %request.scope,
                records = report.records_processed.unwrap_or(0),
                "processed"
            ),
            Some(e) => {
                tracing::warn!(job = %request.processor, scope = %request.scope, "failed: {e}")
            }
        }
        let keys = if report.status == RunStatus::Completed {
            completed_keys(
                &request,
                &report,
                self.mode,
                processed_at,
                entity_count,
                &processor.version(),
            )
        } else {
            Vec::new()
        };
        Ok(self.record(report, &request, lease, keys).await)
    }

    /// Asks the guards (none in mode `off`). A content that cannot be described fails the
    /// run (to be recorded, with the lease if one was taken); a store failure fails the
    /// call under `strict` and runs unguarded under `best_effort`.
    async fn decide(
        &self,
        request: &RunRequest,
        content: &Describe<'_>,
        report: &mut RunReport,
    ) -> Result<Decided> {
        if self.mode == Mode::Off || self.guards.is_empty() {
            return Ok(Decided::Go(Decision::default(), None));
        }
        let mut lease_out = None;
        // In enforce mode a skip decided on one read may be recorded with it: the ledger row
        // `record` would write for the skip, the guards filling in what they decide.
        let skip_row = (self.mode == Mode::Enforce).then(|| {
            let mut skipped = report.clone();
            skipped.status = RunStatus::Skipped;
            skipped.ledger_row(request)
        });
        let decided = self
            .guards
            .decide_recording(
                request,
                &*self.store,
                report.started_at,
                content,
                DecideOptions {
                    stop_at_first_skip: self.mode == Mode::Enforce,
                    dry_run: false,
                    shadow: self.mode == Mode::Shadow,
                },
                &mut lease_out,
                skip_row.as_ref(),
            )
            .await;
        match decided {
            Ok((d, recorded)) => Ok(Decided::Go(d, recorded.map(Box::new))),
            Err(Error::Processor { source, .. }) => {
                // Preparing or describing the content failed: a failed run, recorded (the
                // lease, if one was taken, is released by the recording).
                report.status = RunStatus::Failed;
                report.error = Some(format!("describing the content failed: {source}"));
                Ok(Decided::Failed(lease_out))
            }
            Err(e) => {
                if let Some(lease) = lease_out {
                    if let Err(release) = self.store.release(&lease, now()).await {
                        tracing::warn!(
                            "could not release the lease after a guard error: {release}"
                        );
                    }
                }
                match (e.is_store_failure(), self.policy) {
                    (true, StoreFailurePolicy::BestEffort) => {
                        tracing::warn!(
                            "store failure while checking guards; running unguarded (best_effort): {e}"
                        );
                        report
                            .store_errors
                            .push(format!("checking the guards: {e}"));
                        Ok(Decided::Go(Decision::default(), None))
                    }
                    _ => Err(e),
                }
            }
        }
    }

    /// A cancellation stopped the run while it was deciding (waiting for the lease, for the
    /// job's setup or content query, for the store): the run fails, `interrupted by
    /// REASON`, and nothing is claimed. A claim that committed as it was being dropped is
    /// found (the lease held under this run's id) and released with the recording.
    async fn interrupted_deciding(
        &self,
        mut report: RunReport,
        request: &RunRequest,
        reason: &'static str,
        waited: Duration,
    ) -> RunReport {
        tracing::warn!(
            "{reason} received while checking the guards: stopping before processing, nothing claimed"
        );
        crate::backend::cancels_sent(CANCEL_SEND_TIMEOUT).await;
        let holder = if self.guards.takes_lease() {
            self.store
                .lease_holder(&request.processor, &request.scope, now())
                .await
        } else {
            Ok(None)
        };
        let lease = match holder {
            Ok(Some(holder)) if holder.run_id == request.run_id => Some(Lease {
                processor: request.processor.clone(),
                scope: request.scope.clone(),
                run_id: holder.run_id,
                token: holder.token,
                acquired_at: holder.acquired_at,
                expires_at: holder.expires_at,
            }),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!("could not check for a lease to release: {e}");
                None
            }
        };
        report.status = RunStatus::Failed;
        report.error = Some(format!(
            "interrupted by {reason}, before processing: after {:.1}s checking the guards (waiting for the lease, the job's setup or content query, or the store); nothing was processed",
            waited.as_secs_f64()
        ));
        self.record(report, request, lease, Vec::new()).await
    }

    /// Notes a guard's skip in the report; true when the run is skipped (enforce mode),
    /// false when it goes on (shadow: a would-skip).
    fn note_skip(&self, skip: Skip, request: &RunRequest, report: &mut RunReport) -> bool {
        let Skip {
            reason,
            previous_run,
            detail,
        } = skip;
        report.previous_run = previous_run;
        report.detail = Some(detail);
        tracing::info!(
            job = %request.processor,
            scope = %request.scope,
            reason = %reason,
            "{} {}",
            if self.mode == Mode::Enforce { "skip:" } else { "would skip (shadow):" },
            report.detail.as_deref().unwrap_or_default()
        );
        if self.mode == Mode::Enforce {
            report.status = RunStatus::Skipped;
            report.skip_reason = Some(reason);
            return true;
        }
        report.would_skip_reason = Some(reason);
        false
    }

    async fn process(
        &self,
        processor: &dyn Processor,
        request: &RunRequest,
        content: &Describe<'_>,
        lease: Option<Lease>,
    ) -> std::result::Result<Outcome, BoxError> {
        let work = async {
            content.prepare().await?;
            processor.process(request).await
        };
        let work = async {
            let Some(cancel) = &self.cancel else {
                return work.await;
            };
            tokio::select! {
                result = work => result,
                signal = cancel.cancelled() => {
                    if signal.starts_with("SIG") && !signal.contains(' ') {
                        tracing::warn!("{signal} received: stopping the processor and releasing the lease");
                    } else {
                        // A reason, not a bare signal (the scheduler's grace period ended).
                        tracing::warn!("stopping the processor and releasing the lease: {signal}");
                    }
                    Err(format!("interrupted by {signal}").into())
                }
            }
        };
        let Some(lease) = lease.filter(|_| self.heartbeat) else {
            return work.await;
        };
        // The heartbeat runs beside the work (one select, both polled), so a slow renewal
        // never stalls the processor. If the lease is lost, the processor is stopped: a
        // newer run owns the scope now.
        tokio::select! {
            result = work => result,
            lost = self.heartbeat_until_lost(lease) => Err(lost.into()),
        }
    }

    /// Renews `lease` every third of its duration; returns only when it was lost.
    async fn heartbeat_until_lost(&self, mut lease: Lease) -> String {
        let ttl = (lease.expires_at - lease.acquired_at)
            .to_std()
            .unwrap_or(Duration::from_secs(60));
        let every = (ttl / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(every).await;
            match self.store.renew(&lease, ttl, now()).await {
                Ok(renewed) => lease = renewed,
                Err(e @ Error::LeaseLost { .. }) => {
                    tracing::error!("{e}: stopping the processor");
                    return format!("{e} while processing; the processor was stopped");
                }
                Err(e) if now() >= lease.expires_at => {
                    tracing::error!(
                        "could not renew the lease, which expired at {}: {e}",
                        lease.expires_at
                    );
                }
                Err(e) => tracing::warn!(
                    "could not renew the lease (expires at {}): {e}",
                    lease.expires_at
                ),
            }
        }
    }

    /// A skip whose ledger row the store recorded with the guards' read
    /// ([`LedgerStore::find_keys_recording_skip`](crate::store::LedgerStore::find_keys_recording_skip)):
    /// the report takes the row's finish time, and is recorded.
    fn recorded_with_read(
        &self,
        mut report: RunReport,
        request: &RunRequest,
        row: RunRecord,
    ) -> RunReport {
        report.finished_at = row.finished_at;
        report.duration_ms = row.duration_ms;
        report.recording = Recording::Recorded;
        let written = report.ledger_row(request);
        if written != row {
            tracing::error!(
                "run {}: the skip recorded with the read differs from the report: {row:?} vs {written:?}",
                report.run_id
            );
        }
        report
    }

    /// Writes the ledger row (and keys, and the lease release); never fails the caller:
    /// problems are reflected in the report ([`RunReport::recording`]).
    async fn record(
        &self,
        mut report: RunReport,
        request: &RunRequest,
        lease: Option<Lease>,
        keys: Vec<KeyRecord>,
    ) -> RunReport {
        report.finished_at = now();
        report.duration_ms = (report.finished_at - report.started_at).num_milliseconds();
        let mut finish = Finish {
            run: report.ledger_row(request),
            keys,
            lease: lease.clone(),
        };
        match self.finish_unique(&mut finish, &mut report).await {
            Ok(()) => report.recording = Recording::Recorded,
            Err(e @ Error::LeaseLost { .. }) => {
                self.record_lease_lost(e, &mut report, request).await
            }
            Err(e) => self.record_store_failure(e, &mut report, &finish, lease.as_ref()),
        }
        report
    }

    /// A run id the caller chose (`--run-id`, an orchestrator's id reused across retries)
    /// that the ledger holds already is replaced by a derived one *before* anything runs, so
    /// the processor (SQL's `@run_id`, a command's `IDEM_RUN_ID`) sees the id the ledger
    /// will record. An id in the form idem makes ([`crate::new_run_id`], a random UUID) is
    /// not looked up: it is new. A ledger that cannot be read leaves the id as it is (the
    /// finish still derives one if it turns out taken).
    async fn settle_run_id(&self, mut request: RunRequest) -> RunRequest {
        let generated = uuid::Uuid::parse_str(&request.run_id).is_ok_and(|u| {
            u.get_version_num() == 4 && u.hyphenated().to_string() == request.run_id
        });
        if generated {
            return request;
        }
        let taken = self
            .store
            .runs(&crate::store::RunFilter {
                run_id: Some(request.run_id.clone()),
                limit: 1,
                ..Default::default()
            })
            .await;
        if taken.is_ok_and(|runs| !runs.is_empty()) {
            let derived = crate::model::derive_run_id(&request.run_id);
            tracing::warn!(
                "run id {:?} is already recorded; this run is {derived:?}",
                request.run_id
            );
            request.run_id = derived;
        }
        request
    }

    /// [`LedgerStore::finish`](crate::store::LedgerStore::finish); a run id recorded already is
    /// replaced by a derived one and the finish tried again.
    async fn finish_unique(&self, finish: &mut Finish, report: &mut RunReport) -> Result<()> {
        let result = self.store.finish(finish).await;
        let Err(Error::DuplicateRunId { run_id, .. }) = &result else {
            return result;
        };
        // A run id names one invocation, but callers may reuse theirs (an orchestrator's id
        // across retries and jobs): record this run under a derived, unique id rather than
        // lose it.
        let derived = crate::model::derive_run_id(run_id);
        tracing::warn!(
            "run id {run_id:?} is already recorded; this run is recorded as {derived:?}"
        );
        report.run_id = derived.clone();
        finish.run.run_id = derived.clone();
        for k in &mut finish.keys {
            k.run_id = derived.clone();
        }
        self.store.finish(finish).await
    }

    /// The lease expired and a newer run took it over: a completed run fails (its keys are
    /// not written), and the ledger row alone is recorded.
    async fn record_lease_lost(&self, e: Error, report: &mut RunReport, request: &RunRequest) {
        tracing::error!("{e}: this run's result is not recorded over the newer run");
        if report.status == RunStatus::Completed {
            report.status = RunStatus::Failed;
            report.error = Some(format!(
                "{e}: the work ran, but its lease expired and was taken over, so its keys were not recorded"
            ));
        }
        let run = report.ledger_row(request);
        let recorded = match self
            .store
            .finish(&Finish {
                run,
                keys: Vec::new(),
                lease: None,
            })
            .await
        {
            Ok(()) => true,
            Err(e) => {
                report.store_errors.push(format!("recording the run: {e}"));
                false
            }
        };
        report.recording = Recording::LeaseLost { recorded };
    }

    /// The store could not take the result: under strict recording a completed run fails
    /// (exit 3); otherwise the result is spooled, when a spool is set.
    fn record_store_failure(
        &self,
        e: Error,
        report: &mut RunReport,
        finish: &Finish,
        lease: Option<&Lease>,
    ) {
        tracing::warn!("could not record run {}: {e}", report.run_id);
        report.store_errors.push(format!("recording the run: {e}"));
        report.recording = Recording::NotRecorded;
        // The store just failed: releasing the lease would most likely fail too (after
        // another timeout). It expires on its own.
        let locked_until = lease
            .map(|l| {
                format!(
                    "; the scope stays locked until its lease expires at {}",
                    crate::model::time::utc_text(l.expires_at)
                )
            })
            .unwrap_or_default();
        let strict = self
            .strict_recording
            .unwrap_or(self.policy == StoreFailurePolicy::Strict);
        if !strict {
            if let Some(spool) = &self.spool {
                match spool.push(&finish.run, &finish.keys) {
                    Ok(()) => {
                        report.recording = Recording::Spooled;
                        tracing::warn!(
                            "run {} spooled to {}; it is recorded when the store is back",
                            report.run_id,
                            spool.path().display()
                        );
                    }
                    Err(e) => tracing::error!(
                        "could not spool run {} to {}: {e}",
                        report.run_id,
                        spool.path().display()
                    ),
                }
            }
        }
        if strict && report.status == RunStatus::Completed {
            report.status = RunStatus::Failed;
            report.recording = Recording::Failed;
            report.error = Some(format!(
                "the work completed but its result could not be recorded, so no key was written and the next run will redo it{locked_until}: {e}"
            ));
        }
    }
}

/// How long an interrupted run waits for the cancellation of its warehouse statements to
/// be sent ([`crate::backend::cancels_sent`]).
const CANCEL_SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// What [`Runner::decide`] leaves the run with.
enum Decided {
    /// Go on with this decision (skip or run), and the skip's ledger row when the store
    /// recorded it with the guards' read.
    Go(Decision, Option<Box<RunRecord>>),
    /// The run failed before processing; record it (releasing this lease).
    Failed(Option<Lease>),
}

/// The keys a completed run writes: its scope key, and its content key when it has one.
/// Their metadata holds the processor's version when it has one, so a later skip can tell
/// that the code (a command job's command, a SQL job's SQL) changed since.
fn completed_keys(
    request: &RunRequest,
    report: &RunReport,
    mode: Mode,
    processed_at: DateTime<Utc>,
    entity_count: Option<i64>,
    version: &str,
) -> Vec<KeyRecord> {
    let mut metadata = serde_json::json!({
        "trigger": request.trigger,
        "records_processed": report.records_processed,
        "mode": mode,
    });
    if !version.is_empty() {
        metadata["version"] = serde_json::Value::String(version.to_string());
    }
    let key = |key: String, kind: KeyKind| KeyRecord {
        key,
        kind,
        processor: request.processor.clone(),
        scope: request.scope.clone(),
        scope_date: request.scope_date,
        processed_at,
        entity_count,
        metadata: metadata.clone(),
        run_id: request.run_id.clone(),
    };
    let mut keys = vec![key(
        scope_key(&request.processor, &request.scope),
        KeyKind::Scope,
    )];
    if let Some(content) = &report.processing_key {
        keys.push(key(content.clone(), KeyKind::Content));
    }
    keys
}
