//! What a run reports ([`RunReport`]), whether its outcome was recorded
//! ([`Recording`]), and what a run does when the store cannot be used
//! ([`StoreFailurePolicy`]).

use super::*;

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
    pub(super) fn new(request: &RunRequest, mode: Mode, started_at: DateTime<Utc>) -> Self {
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

    pub(super) fn ledger_row(&self, request: &RunRequest) -> RunRecord {
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
