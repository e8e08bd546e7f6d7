//! The values that flow through idem: run requests, outcomes, verdicts and ledger rows.

pub mod duration;
pub mod time;

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The exit codes of the `idem` command (and of [`RunReport::exit_code`](crate::RunReport::exit_code)),
/// defined once.
pub mod exit {
    /// Completed or skipped (a skip is a success).
    pub const OK: u8 = 0;
    /// The run failed.
    pub const RUN_FAILED: u8 = 1;
    /// Bad usage, configuration or input.
    pub const USAGE: u8 = 2;
    /// The store is unavailable (strict policy), or a result could not be recorded.
    pub const STORE_UNAVAILABLE: u8 = 3;
}

/// `clap::ValueEnum` for a model enum, its values the names stored in the ledger
/// (`as_str`), without per-value help, so `--help` lists them as `[possible values: …]`.
#[cfg(feature = "cli")]
macro_rules! value_enum {
    ($ty:ty: $($variant:expr),+ $(,)?) => {
        impl clap::ValueEnum for $ty {
            fn value_variants<'a>() -> &'a [Self] {
                &[$($variant),+]
            }
            fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
                Some(clap::builder::PossibleValue::new(self.as_str()))
            }
        }
    };
}
#[cfg(feature = "cli")]
pub(crate) use value_enum;

#[cfg(feature = "cli")]
value_enum!(Trigger: Trigger::Scheduler, Trigger::Manual, Trigger::Pubsub, Trigger::Retry, Trigger::Backfill);
#[cfg(feature = "cli")]
value_enum!(Mode: Mode::Enforce, Mode::Shadow, Mode::Off);
#[cfg(feature = "cli")]
value_enum!(RunStatus: RunStatus::Completed, RunStatus::Failed, RunStatus::Skipped);

/// Why a run was started. Recorded in the ledger so reports can tell scheduled waste from
/// manual re-runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// Cron or Cloud Scheduler.
    Scheduler,
    /// A person ran it.
    Manual,
    /// A Pub/Sub message (or its redelivery).
    Pubsub,
    /// An automatic retry.
    Retry,
    /// A backfill over past scopes.
    Backfill,
}

impl Trigger {
    /// Every trigger, in documentation order.
    pub const ALL: [Trigger; 5] = [
        Trigger::Scheduler,
        Trigger::Manual,
        Trigger::Pubsub,
        Trigger::Retry,
        Trigger::Backfill,
    ];

    /// The name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Scheduler => "scheduler",
            Trigger::Manual => "manual",
            Trigger::Pubsub => "pubsub",
            Trigger::Retry => "retry",
            Trigger::Backfill => "backfill",
        }
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Trigger {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Trigger::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                Error::config(format!(
                    "unknown trigger {s:?}: expected scheduler, manual, pubsub, retry or backfill"
                ))
            })
    }
}

/// How guards act on a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Skip when a guard says so.
    #[default]
    Enforce,
    /// Evaluate every guard, record what would have been skipped, run anyway.
    Shadow,
    /// No guards; the run is still recorded in the ledger and its keys written.
    Off,
}

impl Mode {
    /// The name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
            Mode::Off => "off",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "enforce" => Ok(Mode::Enforce),
            "shadow" => Ok(Mode::Shadow),
            "off" => Ok(Mode::Off),
            _ => Err(Error::config(format!(
                "unknown mode {s:?}: expected enforce, shadow or off"
            ))),
        }
    }
}

/// One invocation of a processor for one scope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRequest {
    /// The processor identity the guards key on (for jobs: the job name).
    pub processor: String,
    /// The scope, usually the ISO partition date (`2025-11-18`).
    pub scope: String,
    /// The partition date the scope belongs to (ledger tables are partitioned by it).
    pub scope_date: NaiveDate,
    /// Free-form parameters handed to the processor.
    pub params: serde_json::Value,
    /// Why the run started.
    pub trigger: Trigger,
    /// Unique id of this invocation.
    pub run_id: String,
}

impl RunRequest {
    /// A request for `processor` on `date`, scope = the ISO date, manual trigger, a fresh
    /// run id.
    pub fn new(processor: impl Into<String>, date: NaiveDate) -> Self {
        RunRequest {
            processor: processor.into(),
            scope: crate::model::time::day_text(date),
            scope_date: date,
            params: serde_json::Value::Object(Default::default()),
            trigger: Trigger::Manual,
            run_id: new_timed_run_id(),
        }
    }

    /// Sets the trigger.
    pub fn with_trigger(mut self, trigger: Trigger) -> Self {
        self.trigger = trigger;
        self
    }

    /// Sets a scope other than the ISO date (for example `2025-11-18/team=LAL`).
    pub fn with_scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = scope.into();
        self
    }

    /// Sets the parameters.
    pub fn with_params(mut self, params: serde_json::Value) -> Self {
        self.params = params;
        self
    }
}

/// The longest name, scope or run id idem accepts, in bytes.
pub const MAX_NAME_BYTES: usize = 1024;

/// Whether `c` is a control character: an ASCII or Unicode control (`char::is_control`),
/// or a bidirectional formatting character (U+061C, U+200E/F, U+202A–U+202E,
/// U+2066–U+2069), which reverses how the text around it is shown (a scope that reads
/// `2025-01-02` in `idem runs` but is another).
pub fn is_control(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
        )
}

/// Checks a name, scope or run id that will be stored: not empty, at most
/// [`MAX_NAME_BYTES`], and no control characters ([`is_control`], bidirectional ones too) (a NUL cannot be stored in Postgres
/// text, and none of them belongs in an identifier). `what` names it in the error.
pub fn validate_name(what: &str, value: &str) -> Result<()> {
    if value.trim().is_empty() {
        return Err(Error::input(format!("{what} is empty")));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(Error::input(format!(
            "{what} is {} bytes long; at most {MAX_NAME_BYTES} are allowed",
            value.len()
        )));
    }
    if let Some(c) = value.chars().find(|c| is_control(*c)) {
        return Err(Error::input(format!(
            "{what} {value:?} contains the control character {:?}; names, scopes and run ids cannot",
            c
        )));
    }
    Ok(())
}

impl RunRequest {
    /// Checks every value a store must accept, so bad input is refused before anything
    /// runs (rather than after the work, when the result cannot be recorded).
    pub fn validate(&self) -> Result<()> {
        validate_name("processor name", &self.processor)?;
        validate_name("scope", &self.scope)?;
        validate_name("run id", &self.run_id)?;
        check_date_range(self.scope_date)
    }
}

/// The dates every store can hold (BigQuery's DATE and ISO 8601's four-digit years).
pub const MIN_DATE: NaiveDate = match NaiveDate::from_ymd_opt(1, 1, 1) {
    Some(d) => d,
    None => panic!("0001-01-01 is a date"),
};

/// The last date every store can hold.
pub const MAX_DATE: NaiveDate = match NaiveDate::from_ymd_opt(9999, 12, 31) {
    Some(d) => d,
    None => panic!("9999-12-31 is a date"),
};

fn check_date_range(date: NaiveDate) -> Result<()> {
    if date < MIN_DATE || date > MAX_DATE {
        return Err(Error::input(format!(
            "date {date} is out of range: dates go from 0001-01-01 to 9999-12-31"
        )));
    }
    Ok(())
}

/// This machine's host name, as runs record who holds a lease (read once; `?` when it
/// cannot be read).
pub fn host_name() -> &'static str {
    static HOST: crate::per_process::PerProcess<String> =
        crate::per_process::PerProcess::new(|| {
            let mut buf = [0u8; 256];
            // SAFETY: the buffer is valid for its whole length; gethostname writes at most
            // that many bytes, NUL-terminated when it fits.
            let done = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
            let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
            match std::str::from_utf8(&buf[..end]) {
                Ok(name) if done == 0 && !name.is_empty() => name.to_string(),
                _ => "?".to_string(),
            }
        });
    HOST.get()
}

/// A fresh random id (UUID v4), as run ids were before [`RunRequest::new`] made them
/// UUID v7; unique, and random from its first character (tests use slices of it as names).
pub fn new_run_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The run id [`RunRequest::new`] makes: a UUID v7, whose first 48 bits are the time it
/// was made (74 bits are random), so a ledger partitioned by start time finds the rows
/// that can carry it from about that time on ([`run_id_made_at`]).
fn new_timed_run_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Whether `id` has the form idem makes run ids in (a UUID v7, or v4 as before, in
/// lowercase hyphenated form): a run id idem made, new unless a caller reuses it.
pub fn is_made_run_id(id: &str) -> bool {
    uuid::Uuid::parse_str(id)
        .is_ok_and(|u| matches!(u.get_version_num(), 4 | 7) && u.hyphenated().to_string() == id)
}

/// When a run id [`RunRequest::new`] made was made: the time in its UUID v7. `None` for
/// any other id (a caller's, a derived one, a UUID v4).
pub fn run_id_made_at(id: &str) -> Option<DateTime<Utc>> {
    let u = uuid::Uuid::parse_str(id).ok()?;
    if u.get_version_num() != 7 || u.hyphenated().to_string() != id {
        return None;
    }
    let (secs, nanos) = u.get_timestamp()?.to_unix();
    DateTime::from_timestamp(i64::try_from(secs).ok()?, nanos)
}

/// A run id of its own for a run whose requested id is taken: `ID.` and 8 random hex
/// digits, so the caller's id stays recognisable in the ledger.
pub fn derive_run_id(taken: &str) -> String {
    format!(
        "{taken}.{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// Parses `YYYY-MM-DD` (years 0001 to 9999), with an error that names the bad value.
pub fn parse_date(s: &str) -> Result<NaiveDate> {
    let bad = |why: String| Error::input(format!("bad date {s:?}: {why} (expected YYYY-MM-DD)"));
    // Exactly four year digits: chrono alone also takes `-5000-01-01` and `12345-01-01`.
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' || !b[..4].iter().all(u8::is_ascii_digit) {
        return Err(bad("not a date".into()));
    }
    let date = crate::model::time::parse_day(s).map_err(|e| bad(e.to_string()))?;
    check_date_range(date).map_err(|e| bad(e.to_string()))?;
    Ok(date)
}

/// What a successful `process` returns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Records processed (written, updated, ...).
    pub records_processed: i64,
    /// Optional output recorded in the ledger.
    pub output: Option<serde_json::Value>,
}

impl Outcome {
    /// An outcome with `n` records processed.
    pub fn records(n: i64) -> Self {
        Outcome {
            records_processed: n,
            output: None,
        }
    }

    /// Adds output.
    pub fn with_output(mut self, output: serde_json::Value) -> Self {
        self.output = Some(output);
        self
    }
}

/// Final status of a run in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The processor succeeded.
    Completed,
    /// The processor (or the recording of its result) failed.
    Failed,
    /// A guard skipped the run.
    Skipped,
}

impl RunStatus {
    /// The name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Skipped => "skipped",
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunStatus {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "completed" => Ok(RunStatus::Completed),
            "failed" => Ok(RunStatus::Failed),
            "skipped" => Ok(RunStatus::Skipped),
            _ => Err(Error::config(format!("unknown run status {s:?}"))),
        }
    }
}

/// Why a guard skipped (or would have skipped) a run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// The same processor and scope completed within the time window.
    TimeWindow,
    /// Identical content was processed successfully within the content window.
    DuplicateContentHash,
    /// Another run holds the lease on this processor and scope.
    InProgress,
    /// A user-defined guard's reason.
    Custom(String),
}

impl SkipReason {
    /// The name stored in the ledger.
    pub fn as_str(&self) -> &str {
        match self {
            SkipReason::TimeWindow => "time_window",
            SkipReason::DuplicateContentHash => "duplicate_content_hash",
            SkipReason::InProgress => "in_progress",
            SkipReason::Custom(s) => s,
        }
    }

    /// Parses a stored reason (unknown names become [`SkipReason::Custom`]).
    pub fn parse(s: &str) -> Self {
        match s {
            "time_window" => SkipReason::TimeWindow,
            "duplicate_content_hash" => SkipReason::DuplicateContentHash,
            "in_progress" => SkipReason::InProgress,
            other => SkipReason::Custom(other.to_string()),
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The earlier run a skip points at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviousRun {
    /// Its run id.
    pub run_id: String,
    /// When it completed (or, for a lease, when it claimed the scope).
    pub at: DateTime<Utc>,
}

/// A skip (or would-be skip) with its explanation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skip {
    /// Which guard and why.
    pub reason: SkipReason,
    /// The earlier run, when the guard knows it.
    pub previous_run: Option<PreviousRun>,
    /// A sentence for people.
    pub detail: String,
}

/// A row of `processing_runs`: one per invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Unique id of the invocation.
    pub run_id: String,
    /// Processor (job) name.
    pub processor: String,
    /// Scope.
    pub scope: String,
    /// Partition date.
    pub scope_date: NaiveDate,
    /// Why it started.
    pub trigger: Trigger,
    /// Guard mode in force.
    pub mode: Mode,
    /// Start time.
    pub started_at: DateTime<Utc>,
    /// End time.
    pub finished_at: DateTime<Utc>,
    /// `finished_at - started_at` in milliseconds.
    pub duration_ms: i64,
    /// Final status.
    pub status: RunStatus,
    /// Why it was skipped (status `skipped`).
    pub skip_reason: Option<SkipReason>,
    /// What would have skipped it (shadow mode).
    pub would_skip_reason: Option<SkipReason>,
    /// The earlier run the (would-be) skip points at.
    pub previous_run_id: Option<String>,
    /// Records processed (status `completed`).
    pub records_processed: Option<i64>,
    /// The content key, when the content hash guard computed one.
    pub processing_key: Option<String>,
    /// Error text (status `failed`).
    pub error: Option<String>,
    /// Processor output.
    pub output: Option<serde_json::Value>,
}

/// Which guard a processing key belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyKind {
    /// Key of (processor, scope): the time window guard's.
    Scope,
    /// Key of (processor, scope, content): the content hash guard's.
    Content,
}

impl KeyKind {
    /// The name stored in the `kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::Scope => "scope",
            KeyKind::Content => "content",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "scope" => Ok(KeyKind::Scope),
            "content" => Ok(KeyKind::Content),
            _ => Err(Error::config(format!("unknown key kind {s:?}"))),
        }
    }
}

/// A row of `processing_keys`, written only when a run succeeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// The key (hex digest).
    pub key: String,
    /// Which guard it serves.
    pub kind: KeyKind,
    /// Processor (job) name.
    pub processor: String,
    /// Scope.
    pub scope: String,
    /// Partition date.
    pub scope_date: NaiveDate,
    /// When the successful run recorded it.
    pub processed_at: DateTime<Utc>,
    /// Entities in the content, when known.
    pub entity_count: Option<i64>,
    /// Free-form metadata.
    pub metadata: serde_json::Value,
    /// The run that wrote it.
    pub run_id: String,
    /// Until when a guard may need it: when it was processed plus the longest window of
    /// the writing job's guards that read keys of its kind ([`KEEP_FOREVER`] for a window
    /// too long to add), its processing instant when no guard reads it. A cleanup deletes
    /// a key only once this has passed *and* the key is older than its `keep`, so a key
    /// carries its own retention and cleanup needs no job file to know it. `None`: written
    /// before keys carried it (schema 11); cleanup then keeps it as the job files say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_until: Option<DateTime<Utc>>,
}

/// The `keep_until` of a key no guard may ever stop needing: the last second of year
/// 9999, the latest instant every store keeps (BigQuery's `TIMESTAMP` ends there).
pub const KEEP_FOREVER: DateTime<Utc> = match DateTime::from_timestamp(253_402_300_799, 0) {
    Some(t) => t,
    None => DateTime::<Utc>::MIN_UTC,
};

/// A key's `keep_until` ([`KeyRecord::keep_until`]): `processed_at` plus `window`,
/// [`KEEP_FOREVER`] when that is past it; `processed_at` itself without a window.
pub fn keep_until(
    processed_at: DateTime<Utc>,
    window: Option<std::time::Duration>,
) -> DateTime<Utc> {
    let Some(window) = window else {
        return micros(processed_at);
    };
    chrono::Duration::from_std(window)
        .ok()
        .and_then(|w| processed_at.checked_add_signed(w))
        .map(micros)
        .filter(|t| *t < KEEP_FOREVER)
        .unwrap_or(KEEP_FOREVER)
}

/// Truncates a timestamp to whole microseconds, the precision every store keeps, so a
/// value read back compares equal to the value written.
pub fn micros(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}
