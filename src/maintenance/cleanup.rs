//! The built-in `cleanup` processor: [`MaintenanceStore::cleanup`](crate::store::MaintenanceStore::cleanup) as a
//! job, so the weekly cleanup runs through the guards and the ledger like any job.
//!
//! ```toml
//! name = "cleanup"
//! processor = "cleanup"
//! schedule = "0 2 * * 0"
//! timezone = "America/Los_Angeles"
//! [params]
//! keep = "30d"        # keys, leases and event keys older than this go (default 30d)
//! keep_runs = "90d"   # ledger rows older than this go, unless a kept key points at them (default 90d)
//! batch = 10000       # rows per delete statement (default 10000)
//! dry_run = false     # count only (default false)
//! ```
//! The cutoffs are measured back from the moment the run does the work, not from its
//! scope date: a late or repeated run never deletes more than the retention allows.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::error::{BoxError, Error, Result};
use crate::model::duration::parse_duration_field;
use crate::model::{Outcome, RunRequest};
use crate::processor::Processor;
use crate::store::{CleanupPolicy, CleanupReport, DynStore, DEFAULT_CLEANUP_BATCH};

/// The processor name jobs select it with: `processor = "cleanup"`.
pub const CLEANUP_PROCESSOR: &str = "cleanup";

/// The retention a `cleanup` job's `[params]` sets.
#[derive(Debug, Clone, PartialEq)]
pub struct CleanupSettings {
    /// Keys, leases and event keys older than this are deleted (`keep`, default 30d).
    pub keep: Duration,
    /// Ledger rows older than this are deleted, except those a kept key points at
    /// (`keep_runs`, default 90d).
    pub keep_runs: Duration,
    /// Rows per delete statement (`batch`, default [`DEFAULT_CLEANUP_BATCH`]).
    pub batch: usize,
    /// Count only (`dry_run`, default false).
    pub dry_run: bool,
}

impl CleanupSettings {
    /// Reads `keep`, `keep_runs`, `batch` and `dry_run` from a job's `[params]`; any other
    /// key, or a bad value, is an error naming the field.
    pub fn from_params(params: &toml::Table) -> Result<Self> {
        let mut settings = CleanupSettings {
            keep: Duration::from_secs(30 * 86_400),
            keep_runs: Duration::from_secs(90 * 86_400),
            batch: DEFAULT_CLEANUP_BATCH,
            dry_run: false,
        };
        for (key, value) in params {
            let field = format!("params.{key}");
            match (key.as_str(), value) {
                ("keep", toml::Value::String(s)) => {
                    settings.keep = parse_duration_field(&field, s)?
                }
                ("keep_runs", toml::Value::String(s)) => {
                    settings.keep_runs = parse_duration_field(&field, s)?
                }
                ("batch", toml::Value::Integer(n)) if (1..=1_000_000).contains(n) => {
                    settings.batch = *n as usize
                }
                ("batch", v) => {
                    return Err(Error::config(format!(
                        "{field}: expected an integer from 1 to 1000000, got {v}"
                    )))
                }
                ("dry_run", toml::Value::Boolean(b)) => settings.dry_run = *b,
                ("keep" | "keep_runs", v) => {
                    return Err(Error::config(format!(
                        "{field}: expected a duration string such as \"30d\", got {v}"
                    )))
                }
                ("dry_run", v) => {
                    return Err(Error::config(format!(
                        "{field}: expected true or false, got {v}"
                    )))
                }
                _ => {
                    return Err(Error::config(format!(
                        "{field}: unknown parameter of processor = \"cleanup\" \
                         (known: keep, keep_runs, batch, dry_run)"
                    )))
                }
            }
        }
        Ok(settings)
    }

    /// The policy for a run at `now`: everything past retention, every processor.
    pub fn policy(&self, now: chrono::DateTime<chrono::Utc>) -> Result<CleanupPolicy> {
        let cutoff = |d: Duration, field: &str| {
            chrono::Duration::from_std(d)
                .ok()
                .and_then(|d| now.checked_sub_signed(d))
                .ok_or_else(|| Error::config(format!("params.{field} is too long")))
        };
        Ok(CleanupPolicy {
            runs_before: cutoff(self.keep_runs, "keep_runs")?,
            batch: self.batch,
            dry_run: self.dry_run,
            now,
            ..CleanupPolicy::before(cutoff(self.keep, "keep")?)
        })
    }
}

/// How long a job's guards need its keys: a time window or content-hash window longer than
/// a cleanup's `keep` keeps that job's keys for the window instead.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GuardNeed {
    /// The job (its keys' processor name).
    pub processor: String,
    /// The longest of its guard windows.
    #[serde(with = "humantime_serde_secs")]
    pub keep: Duration,
    /// The field that asks for it: `guards.time_window` or `guards.content_hash`.
    pub field: &'static str,
}

mod humantime_serde_secs {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::short_duration(*d))
    }
}

/// What [`cleanup_keeping`] kept beyond the policy's cut-off, and why.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct KeptLonger {
    /// Jobs whose keys were kept for their guard window (longer than `keep`).
    pub jobs: Vec<GuardNeed>,
    /// When some job's window is longer than `keep`, keys of processors that no job file
    /// names (a Rust processor's, say) are kept as long as the longest window: this job's.
    pub others_as: Option<GuardNeed>,
}

/// A cleanup that never deletes a key a job's guard still needs: processing keys of a job
/// whose `time_window` or `content_hash` is longer than the policy's `keys_before` allows
/// are kept for that window. First one pass per job of `needs` deletes only that job's keys
/// older than its own cut-off (the earlier of the policy's and its window's); then one pass
/// deletes everything else past retention, keys older than the longest such window (all
/// processors; event keys by their own expiry), ledger rows and leases as the policy says
/// (a kept key keeps its run). A dry run counts the same keys; its count of ledger rows
/// leaves out rows whose keys only the per-job passes would delete.
pub async fn cleanup_keeping(
    store: &DynStore,
    policy: &CleanupPolicy,
    needs: &[GuardNeed],
    now: DateTime<Utc>,
) -> Result<(CleanupReport, KeptLonger)> {
    let cutoff = |need: &GuardNeed| {
        chrono::Duration::from_std(need.keep)
            .ok()
            .and_then(|d| now.checked_sub_signed(d))
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    };
    let longer: Vec<&GuardNeed> = needs
        .iter()
        .filter(|n| cutoff(n) < policy.keys_before)
        .collect();
    let Some(longest) = longer.iter().copied().min_by_key(|n| cutoff(n)) else {
        return Ok((store.cleanup(policy).await?, KeptLonger::default()));
    };
    let earliest = cutoff(longest);
    let keys_only = |processor: &str, keys_before: DateTime<Utc>| CleanupPolicy {
        keys_before,
        runs_before: DateTime::<Utc>::MIN_UTC,
        leases_before: DateTime::<Utc>::MIN_UTC,
        processor: Some(processor.to_string()),
        progress: None,
        ..policy.clone()
    };
    let mut keys = 0;
    for need in needs {
        let own = cutoff(need).min(policy.keys_before);
        if own <= earliest {
            continue;
        }
        keys += store
            .cleanup(&keys_only(&need.processor, own))
            .await?
            .keys_deleted;
        if policy.dry_run {
            // Counted again by the pass below: take them out.
            keys -= store
                .cleanup(&keys_only(&need.processor, earliest))
                .await?
                .keys_deleted;
        }
    }
    let mut report = store
        .cleanup(&CleanupPolicy {
            keys_before: earliest,
            ..policy.clone()
        })
        .await?;
    report.keys_deleted += keys;
    Ok((
        report,
        KeptLonger {
            jobs: longer.into_iter().cloned().collect(),
            others_as: Some(longest.clone()),
        },
    ))
}

/// A duration as cleanup messages show it: `40d`, `36h`, `90m`, `45s`.
pub fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Deletes what is past retention in the store it was given, keeping what the guards of
/// the jobs beside its job file need ([`cleanup_keeping`]); records processed = rows
/// deleted, output = the counts per table, the cutoffs and what was kept longer.
pub struct CleanupProcessor {
    name: String,
    store: Arc<DynStore>,
    settings: CleanupSettings,
    needs: Option<GuardNeeds>,
}

/// Reads the guard windows the cleanup must keep keys for (and why it could not, if so),
/// at each run: job files change between runs.
pub type GuardNeeds = Arc<dyn Fn() -> (Vec<GuardNeed>, Option<String>) + Send + Sync>;

impl CleanupProcessor {
    /// A cleanup of `store` under the job name `name`.
    pub fn new(name: &str, store: Arc<DynStore>, settings: CleanupSettings) -> Self {
        CleanupProcessor {
            name: name.to_string(),
            store,
            settings,
            needs: None,
        }
    }

    /// Keeps the keys the guards need, as `needs` reads them at each run (the jobs of the
    /// cleanup job's own folder, when it runs from a job file: `crate::job::guard_needs`).
    pub fn keeping_for(mut self, needs: GuardNeeds) -> Self {
        self.needs = Some(needs);
        self
    }
}

#[async_trait]
impl Processor for CleanupProcessor {
    fn name(&self) -> &str {
        &self.name
    }

    async fn process(&self, _request: &RunRequest) -> std::result::Result<Outcome, BoxError> {
        let now = chrono::Utc::now();
        let policy = self.settings.policy(now)?;
        let needs = match &self.needs {
            Some(read) => read().0,
            None => Vec::new(),
        };
        let (report, kept) = cleanup_keeping(&*self.store, &policy, &needs, now).await?;
        let mut output = report.summary(&policy);
        output["kept_longer"] = serde_json::to_value(&kept)?;
        Ok(Outcome::records(i64::try_from(report.total()).unwrap_or(i64::MAX)).with_output(output))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(s: &str) -> toml::Table {
        s.parse().unwrap()
    }

    #[test]
    fn params_are_read_with_defaults_and_bad_ones_name_the_field() {
        let d = CleanupSettings::from_params(&toml::Table::new()).unwrap();
        assert_eq!(d.keep, Duration::from_secs(30 * 86_400));
        assert_eq!(d.keep_runs, Duration::from_secs(90 * 86_400));
        let s = CleanupSettings::from_params(&params("keep = \"7d\"\nbatch = 5")).unwrap();
        assert_eq!(s.keep, Duration::from_secs(7 * 86_400));
        assert_eq!(s.batch, 5);
        for (bad, needle) in [
            ("keep = \"soon\"", "params.keep"),
            ("keep = 30", "params.keep"),
            ("keep_runs = \"x\"", "params.keep_runs"),
            ("batch = 0", "params.batch"),
            ("days = 3", "params.days: unknown parameter"),
        ] {
            let e = CleanupSettings::from_params(&params(bad))
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }
}
