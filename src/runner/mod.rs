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

mod explain;
mod record;
mod report;

use explain::Describe;
pub use explain::Explanation;
use record::completed_keys;
pub use report::{Recording, RunReport, StoreFailurePolicy};

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
                (processed_at, entity_count),
                &processor.version(),
                &self.guards,
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
                &crate::guard::Ask {
                    request,
                    store: &*self.store,
                    now: report.started_at,
                    content,
                    options: DecideOptions {
                        stop_at_first_skip: self.mode == Mode::Enforce,
                        dry_run: false,
                        shadow: self.mode == Mode::Shadow,
                    },
                    skip_row: skip_row.as_ref(),
                },
                &mut lease_out,
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
