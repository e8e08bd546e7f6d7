//! Declarative jobs: `jobs/*.toml`.
//!
//! ```toml
//! name = "daily_sales"           # unique
//! processor = "sql"              # built-in SQL processor, or a registered Rust processor
//! schedule = "0 9 * * *"         # optional cron (5 fields, 6/7 with seconds/years, @daily)
//! timezone = "Europe/Paris"      # IANA zone of the schedule and relative dates; default UTC
//! date = "yesterday"             # default date of `idem run JOB`
//! missed = "skip"                # idem scheduler: skip (default) or catch_up missed slots
//! catch_up_limit = 3             # with catch_up: at most this many missed slots fire
//! mode = "enforce"               # enforce | shadow | off
//! store_failure = "strict"       # strict | best_effort
//! [guards]
//! lease = "1h"                   # "0s" or "off" = no lease
//! time_window = "1h"             # "0s" or absent = off
//! content_hash = "24h"           # absent = off
//! hash = "sha256"                # or "md5"
//! [sql]
//! warehouse = "sqlite://demo.db" # default: the store's database
//! setup = "..."                  # or setup_file = "path.sql"
//! content = "SELECT ..."         # or content_file
//! process = "INSERT ..."         # or process_file
//! ```
//! Relative paths (files, `sqlite://` warehouses) resolve against the job file's folder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::guard::{ContentHashGuard, GuardStack, LeaseGuard, OnHeld, TimeWindowGuard};
use crate::key::HashAlgorithm;
use crate::model::Mode;
use crate::processor::{Processor, Registry};
use crate::runner::{Runner, StoreFailurePolicy};
use crate::sql::{open_warehouse, Params, SqlProcessor, SqlScripts};
use crate::store::DynStore;

/// The `[guards]` table.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct GuardsConfig {
    /// Guard order; default `["time_window", "content_hash", "lease"]` (cheap reads first;
    /// the lease re-checks them once claimed).
    pub order: Option<Vec<String>>,
    /// Lease duration; default `1h`; `"0s"`/`"off"` disables the lease.
    pub lease: Option<String>,
    /// `skip` (default) or `wait` when another run holds the lease.
    pub on_in_progress: Option<String>,
    /// Longest wait with `on_in_progress = "wait"`; default the lease duration.
    pub wait: Option<String>,
    /// Renew the lease while processing; default true.
    pub heartbeat: Option<bool>,
    /// Time window; absent or `"0s"` = off.
    pub time_window: Option<String>,
    /// Content window; absent = off.
    pub content_hash: Option<String>,
    /// `sha256` (default) or `md5`.
    pub hash: Option<String>,
}

/// The `[sql]` table.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SqlConfig {
    /// Warehouse URL; default the store's URL.
    pub warehouse: Option<String>,
    /// Idempotent statements run first.
    pub setup: Option<String>,
    /// File with the setup statements.
    pub setup_file: Option<PathBuf>,
    /// Query whose rows describe the content.
    pub content: Option<String>,
    /// File with the content query.
    pub content_file: Option<PathBuf>,
    /// The work.
    pub process: Option<String>,
    /// File with the work.
    pub process_file: Option<PathBuf>,
    /// Extra named parameters (`@name`), as strings.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
}

/// A job file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Unique name; the processor identity in the ledger.
    pub name: String,
    /// `sql` or a registered processor's name.
    pub processor: String,
    /// What the job does, for `idem jobs`.
    pub description: Option<String>,
    /// Cron expression (5 fields, or 6/7 with seconds and years, or an `@` macro).
    pub schedule: Option<String>,
    /// IANA time zone the schedule and relative dates are read in; default UTC.
    pub timezone: Option<String>,
    /// Default date of a run without `--date`: `YYYY-MM-DD`, `today`, `yesterday`, `today-N`.
    pub date: Option<String>,
    /// What `idem scheduler` does with slots it missed: `skip` (default) or `catch_up`.
    pub missed: Option<String>,
    /// With `missed = "catch_up"`: at most this many missed slots are fired (default 3).
    pub catch_up_limit: Option<u32>,
    /// `enforce` (default), `shadow` or `off`.
    pub mode: Option<String>,
    /// `strict` (default) or `best_effort`.
    pub store_failure: Option<String>,
    /// A completed run whose result cannot be recorded counts as failed (exit 3); default
    /// true under `store_failure = "strict"`, false under `best_effort`.
    pub strict_recording: Option<bool>,
    /// Guards.
    #[serde(default)]
    pub guards: GuardsConfig,
    /// SQL processor settings.
    pub sql: Option<SqlConfig>,
    /// Parameters handed to Rust processors (`RunRequest::params`).
    #[serde(default)]
    pub params: toml::Table,
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
}

/// Parses `90s`, `15m`, `1h`, `1h30m`, `2d`, `500ms`; `0s` is zero.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let bad = || {
        Error::config(format!(
            "bad duration {s:?}: expected a number with a unit, like 90s, 15m, 1h, 1h30m, 2d or 500ms"
        ))
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let secs = match unit {
            "ms" => {
                total += Duration::from_millis(n);
                continue;
            }
            "s" => n,
            "m" => n * 60,
            "h" => n * 3600,
            "d" => n * 86_400,
            _ => return Err(bad()),
        };
        total += Duration::from_secs(secs);
    }
    Ok(total)
}

fn optional_duration(field: &str, value: &Option<String>) -> Result<Option<Duration>> {
    match value.as_deref() {
        None | Some("off") => Ok(None),
        Some(s) => {
            let d = parse_duration(s).map_err(|e| Error::config(format!("guards.{field}: {e}")))?;
            Ok((!d.is_zero()).then_some(d))
        }
    }
}

/// Parses a cron expression (5 fields as crontab, 6/7 with seconds and years, or an `@`
/// macro); see [`crate::schedule`].
pub fn parse_cron(expr: &str) -> Result<crate::schedule::CronSchedule> {
    crate::schedule::parse_cron(expr)
}

fn read_sql(
    job_dir: &Path,
    inline: &Option<String>,
    file: &Option<PathBuf>,
    field: &str,
) -> Result<Option<String>> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(Error::config(format!(
            "[sql] sets both {field} and {field}_file; keep one"
        ))),
        (Some(s), None) => Ok(Some(s.clone())),
        (None, Some(f)) => {
            let path = job_dir.join(f);
            std::fs::read_to_string(&path)
                .map(Some)
                .map_err(|e| Error::config(format!("[sql].{field}_file {}: {e}", path.display())))
        }
        (None, None) => Ok(None),
    }
}

impl Job {
    /// Reads and validates a job file.
    pub fn load(path: &Path) -> Result<Job> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::config(format!("cannot read job file {}: {e}", path.display())))?;
        Job::parse(&text, path)
    }

    /// Parses and validates job TOML (`path` is used for messages and relative paths).
    pub fn parse(text: &str, path: &Path) -> Result<Job> {
        let mut job: Job = toml::from_str(text).map_err(|e| {
            Error::config(format!(
                "malformed job file {}: {}",
                path.display(),
                e.to_string().trim_end()
            ))
        })?;
        job.path = path.to_path_buf();
        job.validate()
            .map_err(|e| Error::config(format!("job file {}: {e}", path.display())))?;
        Ok(job)
    }

    fn validate(&self) -> Result<()> {
        if self.name.trim().is_empty() {
            return Err(Error::config("name is empty"));
        }
        if let Some(s) = &self.schedule {
            parse_cron(s).map_err(|e| Error::config(format!("schedule: {e}")))?;
        }
        if let Some(tz) = &self.timezone {
            crate::schedule::parse_timezone(tz)
                .map_err(|e| Error::config(format!("timezone: {e}")))?;
        }
        if let Some(d) = &self.date {
            crate::schedule::DateExpr::parse(d).map_err(|e| Error::config(format!("date: {e}")))?;
        }
        self.missed_policy()?;
        self.mode()?;
        self.store_failure()?;
        self.guard_stack()?;
        if self.processor == "sql" {
            let sql = self
                .sql
                .as_ref()
                .ok_or_else(|| Error::config("processor = \"sql\" needs a [sql] table"))?;
            if sql.process.is_none() && sql.process_file.is_none() {
                return Err(Error::config("[sql] needs process or process_file"));
            }
            self.scripts()?;
        } else if self.sql.is_some() {
            return Err(Error::config(format!(
                "[sql] is only for processor = \"sql\", but processor = {:?}",
                self.processor
            )));
        }
        Ok(())
    }

    /// The folder relative paths resolve against.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("."))
    }

    /// What `idem scheduler` does with missed slots (`missed`, `catch_up_limit`).
    pub fn missed_policy(&self) -> Result<crate::schedule::Missed> {
        crate::schedule::Missed::parse(self.missed.as_deref(), self.catch_up_limit)
    }

    /// The mode.
    pub fn mode(&self) -> Result<Mode> {
        self.mode
            .as_deref()
            .map_or(Ok(Mode::Enforce), Mode::from_str)
    }

    /// The store failure policy.
    pub fn store_failure(&self) -> Result<StoreFailurePolicy> {
        self.store_failure
            .as_deref()
            .map_or(Ok(StoreFailurePolicy::Strict), StoreFailurePolicy::from_str)
    }

    /// The lease duration, if the lease is on (default 1 h).
    pub fn lease_ttl(&self) -> Result<Option<Duration>> {
        match &self.guards.lease {
            None => Ok(Some(Duration::from_secs(3600))),
            some => optional_duration("lease", some),
        }
    }

    /// The guard stack the job asks for.
    pub fn guard_stack(&self) -> Result<GuardStack> {
        let g = &self.guards;
        let hash = g
            .hash
            .as_deref()
            .map_or(Ok(HashAlgorithm::Sha256), HashAlgorithm::from_str)
            .map_err(|e| Error::config(format!("guards.hash: {e}")))?;
        let time_window = optional_duration("time_window", &g.time_window)?;
        let content = optional_duration("content_hash", &g.content_hash)?;
        let lease = self.lease_ttl()?;
        let on_held = match g.on_in_progress.as_deref() {
            None | Some("skip") => OnHeld::Skip,
            Some("wait") => OnHeld::Wait {
                max: match &g.wait {
                    Some(w) => {
                        parse_duration(w).map_err(|e| Error::config(format!("guards.wait: {e}")))?
                    }
                    None => lease.unwrap_or(Duration::from_secs(3600)),
                },
            },
            Some(other) => {
                return Err(Error::config(format!(
                    "guards.on_in_progress = {other:?}: expected skip or wait"
                )))
            }
        };
        let order = g
            .order
            .clone()
            .unwrap_or_else(|| vec!["time_window".into(), "content_hash".into(), "lease".into()]);
        let mut seen = std::collections::HashSet::new();
        let mut builder = GuardStack::builder();
        for name in &order {
            if !seen.insert(name.as_str()) {
                return Err(Error::config(format!("guards.order names {name:?} twice")));
            }
            builder = match name.as_str() {
                "time_window" => builder.option_guard(time_window.map(TimeWindowGuard::new)),
                "content_hash" => builder.option_guard(content.map(|w| ContentHashGuard::new(w, hash))),
                "lease" => builder.option_guard(lease.map(|ttl| LeaseGuard::new(ttl).on_held(on_held))),
                other => {
                    return Err(Error::config(format!(
                        "guards.order: unknown guard {other:?} (expected time_window, content_hash, lease)"
                    )))
                }
            };
        }
        for (name, on) in [
            ("time_window", time_window.is_some()),
            ("content_hash", content.is_some()),
            ("lease", lease.is_some()),
        ] {
            if on && !seen.contains(name) {
                return Err(Error::config(format!(
                    "guards.{name} is set but guards.order leaves it out"
                )));
            }
        }
        Ok(builder.build())
    }

    fn scripts(&self) -> Result<SqlScripts> {
        let sql = self.sql.clone().unwrap_or_default();
        let dir = self.dir();
        Ok(SqlScripts {
            setup: read_sql(dir, &sql.setup, &sql.setup_file, "setup")?,
            content: read_sql(dir, &sql.content, &sql.content_file, "content")?,
            process: read_sql(dir, &sql.process, &sql.process_file, "process")?.unwrap_or_default(),
        })
    }

    /// The warehouse URL with a relative SQLite path resolved against the job's folder.
    pub fn warehouse_url(&self, store_url: &str) -> String {
        let url = self
            .sql
            .as_ref()
            .and_then(|s| s.warehouse.clone())
            .unwrap_or_else(|| store_url.to_string());
        match url.strip_prefix("sqlite://") {
            Some(path)
                if !path.starts_with('/')
                    && !path.starts_with(':')
                    && self.sql.as_ref().is_some_and(|s| s.warehouse.is_some()) =>
            {
                format!("sqlite://{}", self.dir().join(path).display())
            }
            _ => url,
        }
    }

    /// The processor: the built-in SQL one, or the registered one of that name.
    pub async fn processor(
        &self,
        registry: &Registry,
        store_url: &str,
    ) -> Result<Arc<dyn Processor>> {
        if self.processor == "sql" {
            let warehouse = open_warehouse(&self.warehouse_url(store_url)).await?;
            let params: Params = self
                .sql
                .as_ref()
                .map(|s| s.params.clone())
                .unwrap_or_default();
            return Ok(Arc::new(SqlProcessor::new(
                &self.name,
                warehouse,
                &self.scripts()?,
                params,
            )?));
        }
        registry.get(&self.processor).ok_or_else(|| {
            let known = registry.names();
            Error::config(format!(
                "job {}: unknown processor {:?} (registered: {}; built in: sql)",
                self.name,
                self.processor,
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ))
        })
    }

    /// A runner configured as the job says.
    pub fn runner(&self, store: Arc<DynStore>) -> Result<Runner> {
        let mut runner = Runner::new(store, self.guard_stack()?)
            .mode(self.mode()?)
            .store_failure_policy(self.store_failure()?)
            .heartbeat(self.guards.heartbeat.unwrap_or(true));
        if let Some(strict) = self.strict_recording {
            runner = runner.strict_recording(strict);
        }
        Ok(runner)
    }

    /// Request parameters as JSON.
    pub fn params_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.params).unwrap_or(serde_json::Value::Null)
    }
}

/// Finds a job by name in `jobs_dir`, or loads it from a `.toml` path.
pub fn find_job(name_or_path: &str, jobs_dir: &Path) -> Result<Job> {
    let as_path = Path::new(name_or_path);
    if name_or_path.ends_with(".toml") || as_path.components().count() > 1 {
        if !as_path.exists() {
            return Err(Error::config(format!(
                "job file {name_or_path} does not exist"
            )));
        }
        return Job::load(as_path);
    }
    let jobs = load_jobs(jobs_dir)?;
    let names: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
    jobs.into_iter()
        .find(|j| j.name == name_or_path)
        .ok_or_else(|| {
            Error::config(format!(
                "unknown job {name_or_path:?} in {} (known: {})",
                jobs_dir.display(),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ))
        })
}

/// Every `*.toml` job in a folder, sorted by name; duplicate names are an error.
pub fn load_jobs(jobs_dir: &Path) -> Result<Vec<Job>> {
    let entries = std::fs::read_dir(jobs_dir).map_err(|e| {
        Error::config(format!(
            "cannot read jobs folder {}: {e} (set --jobs-dir)",
            jobs_dir.display()
        ))
    })?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    let mut jobs: Vec<Job> = Vec::new();
    for p in paths {
        let job = Job::load(&p)?;
        if let Some(other) = jobs.iter().find(|j| j.name == job.name) {
            return Err(Error::config(format!(
                "job name {:?} is used by both {} and {}",
                job.name,
                other.path.display(),
                job.path.display()
            )));
        }
        jobs.push(job);
    }
    jobs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        for bad in ["", "h", "10", "1x", "-1h", "1.5h"] {
            let e = parse_duration(bad).unwrap_err().to_string();
            assert!(e.contains("bad duration"), "{bad}: {e}");
        }
    }

    #[test]
    fn cron_expressions() {
        assert!(parse_cron("0 9 * * *").is_ok());
        assert!(parse_cron("0 0 2 * * Sun").is_ok());
        let e = parse_cron("61 9 * * *").unwrap_err().to_string();
        assert!(e.contains("invalid cron expression \"61 9 * * *\""), "{e}");
    }

    #[test]
    fn validation_names_the_problem() {
        let p = Path::new("jobs/x.toml");
        let e = Job::parse("name = \"x\"\nprocessor = \"sql\"\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a [sql] table"), "{e}");
        let e = Job::parse(
            "name = \"x\"\nprocessor = \"p\"\n[guards]\ntime_window = \"1 hour\"\n",
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("guards.time_window") && e.contains("bad duration"),
            "{e}"
        );
        let e = Job::parse("name = \"x\"\nprocessor = \"p\"\ntypo = 1\n", p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("malformed job file") && e.contains("typo"),
            "{e}"
        );
        let e = Job::parse("name = \"x\"\nprocessor = \"p\"\nmode = \"loud\"\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown mode \"loud\""), "{e}");
        let e = Job::parse("name = \"x\"\nprocessor = \"p\"\n[guards]\ntime_window = \"1h\"\norder = [\"lease\"]\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("leaves it out"), "{e}");
    }

    #[test]
    fn default_stack_reads_first_and_claims_last() {
        let job = Job::parse(
            "name = \"x\"\nprocessor = \"p\"\n[guards]\ntime_window = \"1h\"\ncontent_hash = \"24h\"\nhash = \"md5\"\n",
            Path::new("x.toml"),
        )
        .unwrap();
        assert_eq!(
            job.guard_stack().unwrap().names(),
            vec!["time_window", "content_hash", "lease"]
        );
        let off = Job::parse(
            "name = \"x\"\nprocessor = \"p\"\n[guards]\nlease = \"0s\"\n",
            Path::new("x.toml"),
        )
        .unwrap();
        assert!(off.guard_stack().unwrap().is_empty());
    }
}
