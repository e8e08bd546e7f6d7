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

use crate::error::{BoxError, Error, Result};
use crate::model::duration::parse_duration_field;
use crate::model::{Outcome, RunRequest};
use crate::processor::Processor;
use crate::store::{CleanupPolicy, DynStore, DEFAULT_CLEANUP_BATCH};

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
            ..CleanupPolicy::before(cutoff(self.keep, "keep")?)
        })
    }
}

/// Deletes what is past retention in the store it was given; records processed = rows
/// deleted, output = the counts per table and the cutoffs.
pub struct CleanupProcessor {
    name: String,
    store: Arc<DynStore>,
    settings: CleanupSettings,
}

impl CleanupProcessor {
    /// A cleanup of `store` under the job name `name`.
    pub fn new(name: &str, store: Arc<DynStore>, settings: CleanupSettings) -> Self {
        CleanupProcessor {
            name: name.to_string(),
            store,
            settings,
        }
    }
}

#[async_trait]
impl Processor for CleanupProcessor {
    fn name(&self) -> &str {
        &self.name
    }

    async fn process(&self, _request: &RunRequest) -> std::result::Result<Outcome, BoxError> {
        let policy = self.settings.policy(chrono::Utc::now())?;
        let report = self.store.cleanup(&policy).await?;
        Ok(
            Outcome::records(i64::try_from(report.total()).unwrap_or(i64::MAX))
                .with_output(report.summary(&policy)),
        )
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
