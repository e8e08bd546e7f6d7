//! The end of a run: its outcome recorded (the ledger row, keys only on success, the
//! lease released), the run id settled, and what a lost lease or a store that fails
//! leaves behind.

use super::*;

impl Runner {
    /// A skip whose ledger row the store recorded with the guards' read
    /// ([`LedgerStore::find_keys_recording_skip`](crate::store::LedgerStore::find_keys_recording_skip)):
    /// the report takes the row's finish time, and is recorded.
    pub(super) fn recorded_with_read(
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
    pub(super) async fn record(
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
    /// will record. An id in the form idem makes is not looked up when it is new: a UUID
    /// v7 from [`RunRequest::new`] made in the last 10 minutes, or a v4 as before. A ledger that cannot be read leaves the id as it is (the
    /// finish still derives one if it turns out taken).
    pub(super) async fn settle_run_id(&self, mut request: RunRequest) -> RunRequest {
        // A UUID v7 holds the time it was made: one made within the last 10 minutes is
        // this run's (or a caller's new one); an older one is a caller reusing it, looked
        // up from a day before that time. A v4 has no time: taken as new, as before.
        let made_at = crate::model::run_id_made_at(&request.run_id);
        let recent = made_at.is_some_and(|at| Utc::now() - at < chrono::Duration::minutes(10));
        if recent || (made_at.is_none() && crate::model::is_made_run_id(&request.run_id)) {
            return request;
        }
        let taken = self
            .store
            .runs(&crate::store::RunFilter {
                run_id: Some(request.run_id.clone()),
                since: made_at.map(|at| at - chrono::Duration::days(1)),
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
    pub(super) async fn finish_unique(
        &self,
        finish: &mut Finish,
        report: &mut RunReport,
    ) -> Result<()> {
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
    pub(super) async fn record_lease_lost(
        &self,
        e: Error,
        report: &mut RunReport,
        request: &RunRequest,
    ) {
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
    pub(super) fn record_store_failure(
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

/// The keys a completed run writes: its scope key, and its content key when it has one.
/// Their metadata holds the processor's version when it has one, so a later skip can tell
/// that the code (a command job's command, a SQL job's SQL) changed since; each is kept
/// as long as `guards` read its kind ([`KeyRecord::keep_until`]).
pub(super) fn completed_keys(
    request: &RunRequest,
    report: &RunReport,
    mode: Mode,
    (processed_at, entity_count): (DateTime<Utc>, Option<i64>),
    version: &str,
    guards: &GuardStack,
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
        keep_until: Some(crate::model::keep_until(
            processed_at,
            guards.window_of(kind),
        )),
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
