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
//! warehouse = "sqlite://demo.db" # default: `default_warehouse_url` of the store
//! setup = "..."                  # or setup_file = "path.sql"
//! content = "SELECT ..."         # or content_file
//! process = "INSERT ..."         # or process_file
//! ```
//! Relative paths (files, `sqlite://` warehouses) resolve against the job file's folder.
//!
//! Loading validates everything that needs no database: the fields and durations, and for
//! SQL jobs the warehouse scheme and every script in its dialect, with its `@name`
//! parameters ([`Job::check`]). `run`/`explain` load only their job ([`find_job`]), so a
//! broken file never stops another job; `idem jobs` reports every bad file ([`scan_jobs`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::guard::{ContentHashGuard, GuardStack, LeaseGuard, OnHeld, TimeWindowGuard};
use crate::key::HashAlgorithm;
use crate::model::duration::{parse_duration_field, MIN_LEASE};
use crate::model::Mode;
use crate::processor::{Processor, Registry};
use crate::runner::{Runner, StoreFailurePolicy};
use crate::store::DynStore;
use crate::warehouse::{
    open_warehouse, warehouse_dialect, Params, SqlProcessor, SqlScripts, BUILTIN_PARAMS,
};

/// The `[guards]` table.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct GuardsConfig {
    /// Guard order; default `["time_window", "content_hash", "lease"]` (cheap reads first;
    /// the lease re-checks them once claimed).
    pub order: Option<Vec<String>>,
    /// Lease duration; default `1h`; `"0s"`/`"off"` disables the lease; at least
    /// [`MIN_LEASE`], at most [`MAX_DURATION`].
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
    /// Warehouse URL; default [`default_warehouse_url`] of the store (for a SQLite store a
    /// file of its own beside it).
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
    /// `sql`, `cleanup` (see [`crate::maintenance::cleanup`]) or a registered processor's name.
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

fn optional_duration(field: &str, value: &Option<String>) -> Result<Option<Duration>> {
    match value.as_deref() {
        None | Some("off") => Ok(None),
        Some(s) => {
            let d = parse_duration_field(&format!("guards.{field}"), s)?;
            Ok((!d.is_zero()).then_some(d))
        }
    }
}

/// Parses a cron expression (5 fields as crontab, 6/7 with seconds and years, or an `@`
/// macro); see [`crate::schedule`].
pub fn parse_cron(expr: &str) -> Result<crate::schedule::CronSchedule> {
    crate::schedule::parse_cron(expr)
}

/// The warehouse of a `processor = "sql"` job without `[sql].warehouse`.
///
/// For a SQLite store it is a file of its own beside the store file, named after it with
/// `-warehouse` before the extension (`sqlite://idem.db` → `sqlite://idem-warehouse.db`,
/// `sqlite:///var/lib/idem/store.sqlite` → `sqlite:///var/lib/idem/store-warehouse.sqlite`;
/// a `?query` is kept). SQLite lets one writer at a time into a file: a long `process` in
/// the store's own file would hold that lock for the whole transaction, and every other
/// run (claims, recording, on any scope of any job) would wait for it. An in-memory SQLite
/// store (`sqlite://:memory:`) keeps its URL. Any other store (Postgres, BigQuery) is its
/// own default warehouse, as their writers do not block each other that way.
pub fn default_warehouse_url(store_url: &str) -> String {
    let Some(rest) = store_url.strip_prefix("sqlite://") else {
        return store_url.to_string();
    };
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    if path.is_empty() || path.starts_with(':') {
        return store_url.to_string();
    }
    let p = Path::new(path);
    let (Some(stem), Some(parent)) = (p.file_stem(), p.parent()) else {
        return store_url.to_string();
    };
    let mut name = stem.to_os_string();
    name.push("-warehouse");
    if let Some(ext) = p.extension() {
        name.push(".");
        name.push(ext);
    }
    let mut url = format!("sqlite://{}", parent.join(name).display());
    if let Some(q) = query {
        url.push('?');
        url.push_str(q);
    }
    url
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
        if self.processor == crate::maintenance::cleanup::CLEANUP_PROCESSOR {
            crate::maintenance::cleanup::CleanupSettings::from_params(&self.params)?;
            if optional_duration("content_hash", &self.guards.content_hash)?.is_some() {
                return Err(Error::config(
                    "guards.content_hash is set but processor = \"cleanup\" has no content \
                     to hash; remove guards.content_hash",
                ));
            }
        }
        if self.processor == "sql" {
            let sql = self
                .sql
                .as_ref()
                .ok_or_else(|| Error::config("processor = \"sql\" needs a [sql] table"))?;
            if sql.process.is_none() && sql.process_file.is_none() {
                return Err(Error::config("[sql] needs process or process_file"));
            }
            let content_window = optional_duration("content_hash", &self.guards.content_hash)?;
            if content_window.is_some() && sql.content.is_none() && sql.content_file.is_none() {
                return Err(Error::config(
                    "guards.content_hash is set but [sql] has no content (or content_file): \
                     there are no rows to hash; add a content query or remove guards.content_hash",
                ));
            }
            if let Some(key) = sql
                .params
                .keys()
                .find(|k| BUILTIN_PARAMS.contains(&k.as_str()))
            {
                return Err(Error::config(format!(
                    "[sql.params] sets {key:?}, a built-in parameter (@{}); choose another name",
                    BUILTIN_PARAMS.join(", @")
                )));
            }
            let scripts = self.scripts()?;
            // With an explicit warehouse the dialect is known now; otherwise it depends on
            // the store (see `Job::check`).
            if let Some(url) = &sql.warehouse {
                self.check_scripts(&scripts, &self.resolve_warehouse(url), "[sql].warehouse")?;
            }
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
        let ttl = match &self.guards.lease {
            None => return Ok(Some(Duration::from_secs(3600))),
            some => optional_duration("lease", some)?,
        };
        match ttl {
            Some(t) if t < MIN_LEASE => Err(Error::config(format!(
                "guards.lease = {:?} is too short: the minimum is 1s (the heartbeat renews the lease every third of its duration); use \"0s\" or \"off\" for no lease",
                self.guards.lease.as_deref().unwrap_or_default()
            ))),
            t => Ok(t),
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
        let wait = match &g.wait {
            Some(w) => Some(parse_duration_field("guards.wait", w)?),
            None => None,
        };
        let on_held = match g.on_in_progress.as_deref() {
            None | Some("skip") => OnHeld::Skip,
            Some("wait") => OnHeld::Wait {
                max: wait.unwrap_or(lease.unwrap_or(Duration::from_secs(3600))),
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

    /// Checks what depends on where the job runs, without touching any database: for a
    /// `processor = "sql"` job, that its warehouse URL (the `[sql].warehouse`, or the
    /// default for `store_url`, see [`Job::warehouse_url`]) has a supported scheme and that
    /// every script reads in that warehouse's dialect with only known `@name` parameters.
    /// [`find_job`] and [`load_jobs`] call it; errors name the job file and the field.
    pub fn check(&self, store_url: &str) -> Result<()> {
        if self.processor != "sql" {
            return Ok(());
        }
        let field = if self.sql.as_ref().is_some_and(|s| s.warehouse.is_some()) {
            "[sql].warehouse".to_string()
        } else {
            format!(
                "[sql].warehouse is not set, so the default for the store {} applies",
                crate::backend::redact_url(store_url)
            )
        };
        self.scripts()
            .and_then(|scripts| {
                self.check_scripts(&scripts, &self.warehouse_url(store_url), &field)
            })
            .map_err(|e| Error::config(format!("job file {}: {e}", self.path.display())))
    }

    fn check_scripts(&self, scripts: &SqlScripts, warehouse_url: &str, field: &str) -> Result<()> {
        let dialect =
            warehouse_dialect(warehouse_url).map_err(|e| Error::config(format!("{field}: {e}")))?;
        let params = self
            .sql
            .as_ref()
            .map(|s| s.params.clone())
            .unwrap_or_default();
        scripts.prepare(dialect, &params)?;
        Ok(())
    }

    /// A `sqlite://` warehouse path relative to the job's folder made absolute.
    fn resolve_warehouse(&self, url: &str) -> String {
        match url.strip_prefix("sqlite://") {
            Some(path) if !path.starts_with('/') && !path.starts_with(':') => {
                format!("sqlite://{}", self.dir().join(path).display())
            }
            _ => url.to_string(),
        }
    }

    /// Where the job's SQL runs: `[sql].warehouse` (a relative SQLite path resolved
    /// against the job's folder), else [`default_warehouse_url`] of the store.
    pub fn warehouse_url(&self, store_url: &str) -> String {
        match self.sql.as_ref().and_then(|s| s.warehouse.as_deref()) {
            Some(url) => self.resolve_warehouse(url),
            None => default_warehouse_url(store_url),
        }
    }

    /// The processor: the built-in SQL or cleanup one, or the registered one of that name.
    /// A `cleanup` job cleans the store at `store_url`, opened here; use
    /// [`Job::processor_with_store`] to hand it an open one.
    pub async fn processor(
        &self,
        registry: &Registry,
        store_url: &str,
    ) -> Result<Arc<dyn Processor>> {
        self.processor_with_store(registry, store_url, None).await
    }

    /// [`Job::processor`], with the store a `cleanup` job cleans (`None`: open `store_url`).
    pub async fn processor_with_store(
        &self,
        registry: &Registry,
        store_url: &str,
        store: Option<Arc<DynStore>>,
    ) -> Result<Arc<dyn Processor>> {
        if self.processor == crate::maintenance::cleanup::CLEANUP_PROCESSOR {
            let settings = crate::maintenance::cleanup::CleanupSettings::from_params(&self.params)
                .map_err(|e| Error::config(format!("job file {}: {e}", self.path.display())))?;
            let store = match store {
                Some(store) => store,
                None => crate::store::open(store_url).await?,
            };
            return Ok(Arc::new(
                crate::maintenance::cleanup::CleanupProcessor::new(&self.name, store, settings),
            ));
        }
        if self.processor == "sql" {
            self.check(store_url)?;
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
                "job {}: unknown processor {:?} (registered: {}; built in: sql, cleanup)",
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

/// Finds a job by name in `jobs_dir`, or loads it from a `.toml` path, and validates it for
/// `store_url` ([`Job::load`], then [`Job::check`]).
///
/// Only what is needed is read, so a broken job file never stops another job: first
/// `JOBS_DIR/NAME.toml` (when its `name` is NAME); otherwise the file whose `name` is NAME,
/// found by reading only the `name` key of each `*.toml`. Only that file is fully loaded
/// and validated. `idem jobs` ([`scan_jobs`]) validates every file (and reports a name
/// used by two files, where this takes `NAME.toml`).
pub fn find_job(name_or_path: &str, jobs_dir: &Path, store_url: &str) -> Result<Job> {
    let job = find_job_file(name_or_path, jobs_dir)?;
    job.check(store_url)?;
    Ok(job)
}

fn find_job_file(name_or_path: &str, jobs_dir: &Path) -> Result<Job> {
    let as_path = Path::new(name_or_path);
    if name_or_path.ends_with(".toml") || as_path.components().count() > 1 {
        if !as_path.exists() {
            return Err(Error::config(format!(
                "job file {name_or_path} does not exist"
            )));
        }
        return Job::load(as_path);
    }
    // The file named after the job, when it is that job (a file that cannot even be read
    // as TOML is reported: it is most likely the one meant).
    let named = jobs_dir.join(format!("{name_or_path}.toml"));
    if named.is_file() && read_job_name(&named)?.as_deref() == Some(name_or_path) {
        return Job::load(&named);
    }
    let mut names = Vec::new();
    let mut unreadable = Vec::new();
    let mut found: Vec<PathBuf> = Vec::new();
    for path in job_files(jobs_dir)? {
        match read_job_name(&path) {
            Ok(Some(name)) if name == name_or_path => found.push(path),
            Ok(Some(name)) => names.push(name),
            Ok(None) => unreadable.push(format!("{}: no name", path.display())),
            Err(e) => unreadable.push(e.to_string()),
        }
    }
    match found.as_slice() {
        [one] => Job::load(one),
        [] => {
            names.sort();
            let mut message = format!(
                "unknown job {name_or_path:?} in {} (known: {})",
                jobs_dir.display(),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            );
            if !unreadable.is_empty() {
                message.push_str(&format!(
                    "; {} file(s) could not be read: {}",
                    unreadable.len(),
                    unreadable.join("; ")
                ));
            }
            Err(Error::config(message))
        }
        [first, second, ..] => Err(duplicate_name(name_or_path, first, second)),
    }
}

fn duplicate_name(name: &str, first: &Path, second: &Path) -> Error {
    Error::config(format!(
        "job name {name:?} is used by both {} and {}",
        first.display(),
        second.display()
    ))
}

/// The `name` of a job file, reading nothing else of it (`None` when it has none).
fn read_job_name(path: &Path) -> Result<Option<String>> {
    #[derive(Deserialize)]
    struct NameOnly {
        name: Option<toml::Value>,
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::config(format!("cannot read job file {}: {e}", path.display())))?;
    let doc: NameOnly = toml::from_str(&text).map_err(|e| {
        Error::config(format!(
            "malformed job file {}: {}",
            path.display(),
            e.to_string().trim_end()
        ))
    })?;
    Ok(doc.name.and_then(|v| v.as_str().map(str::to_string)))
}

/// The `*.toml` files of a folder, sorted.
fn job_files(jobs_dir: &Path) -> Result<Vec<PathBuf>> {
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
    Ok(paths)
}

/// A job file that failed validation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JobProblem {
    /// The file.
    pub path: PathBuf,
    /// What is wrong (the message names the file and the field).
    pub error: String,
}

/// Every job file of a folder: the valid jobs (sorted by name) and every problem.
#[derive(Debug, Clone, Default)]
pub struct JobScan {
    /// The jobs that loaded and validated.
    pub jobs: Vec<Job>,
    /// One entry per invalid file, in file order (a name used twice is a problem of the
    /// second file).
    pub problems: Vec<JobProblem>,
}

/// Loads and validates every `*.toml` job in a folder for `store_url`, collecting every
/// problem instead of stopping at the first; fails only when the folder cannot be read.
pub fn scan_jobs(jobs_dir: &Path, store_url: &str) -> Result<JobScan> {
    let mut scan = JobScan::default();
    for path in job_files(jobs_dir)? {
        let job = match Job::load(&path).and_then(|job| job.check(store_url).map(|()| job)) {
            Ok(job) => job,
            Err(e) => {
                scan.problems.push(JobProblem {
                    path,
                    error: e.to_string(),
                });
                continue;
            }
        };
        if let Some(other) = scan.jobs.iter().find(|j| j.name == job.name) {
            scan.problems.push(JobProblem {
                error: duplicate_name(&job.name, &other.path, &job.path).to_string(),
                path,
            });
            continue;
        }
        scan.jobs.push(job);
    }
    scan.jobs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(scan)
}

/// Every `*.toml` job in a folder, sorted by name, validated for `store_url`; any invalid
/// file (or a name used twice) is an error listing every problem.
pub fn load_jobs(jobs_dir: &Path, store_url: &str) -> Result<Vec<Job>> {
    let scan = scan_jobs(jobs_dir, store_url)?;
    match scan.problems.as_slice() {
        [] => Ok(scan.jobs),
        [one] => Err(Error::config(&one.error)),
        many => Err(Error::config(format!(
            "{} invalid job files in {}:\n  {}",
            many.len(),
            jobs_dir.display(),
            many.iter()
                .map(|p| p.error.as_str())
                .collect::<Vec<_>>()
                .join("\n  ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::duration::{parse_duration, MAX_DURATION};

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172_800));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("36525d").unwrap(), MAX_DURATION);
        for bad in ["", "h", "10", "1x", "-1h", "1 fortnight"] {
            let e = parse_duration(bad).unwrap_err().to_string();
            assert!(e.contains("bad duration"), "{bad}: {e}");
        }
    }

    #[test]
    fn overflowing_durations_are_errors_not_panics() {
        for huge in [
            "99999999d",
            "18446744073709551615s1s",
            "5124095576030432h",
            "36526d",
            "18446744073709551615s",
        ] {
            let e = parse_duration(huge).unwrap_err().to_string();
            assert!(
                e.contains("is too long: the maximum is 100 years"),
                "{huge}: {e}"
            );
        }
        // Every field says which one it is, and `now ± MAX_DURATION` is a valid time.
        for field in ["lease", "time_window", "content_hash", "wait"] {
            let toml = format!(
                "name = \"x\"\nprocessor = \"p\"\n[guards]\non_in_progress = \"wait\"\n{field} = \"99999999d\"\n"
            );
            let e = Job::parse(&toml, Path::new("jobs/x.toml"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("jobs/x.toml")
                    && e.contains(&format!(
                        "guards.{field}: duration \"99999999d\" is too long"
                    )),
                "{e}"
            );
        }
        let max = chrono::Duration::from_std(MAX_DURATION).unwrap();
        let now = chrono::Utc::now();
        assert!(chrono::Datelike::year(&(now + max)) < 9999);
        assert!(now.checked_sub_signed(max).is_some());
    }

    #[test]
    fn a_lease_too_short_for_the_heartbeat_is_rejected_with_the_minimum() {
        let job = |lease: &str| {
            Job::parse(
                &format!("name = \"x\"\nprocessor = \"p\"\n[guards]\nlease = \"{lease}\"\n"),
                Path::new("x.toml"),
            )
        };
        let e = job("999ms").unwrap_err().to_string();
        assert!(
            e.contains("guards.lease = \"999ms\" is too short: the minimum is 1s"),
            "{e}"
        );
        assert_eq!(
            job("1s").unwrap().lease_ttl().unwrap(),
            Some(Duration::from_secs(1))
        );
        assert_eq!(job("0s").unwrap().lease_ttl().unwrap(), None);
        assert_eq!(job("off").unwrap().lease_ttl().unwrap(), None);
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
            "name = \"x\"\nprocessor = \"p\"\n[guards]\ntime_window = \"1 fortnight\"\n",
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

    /// A fresh folder for job files.
    fn jobs_dir(files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("idem-jobs-{}", crate::new_run_id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        dir
    }

    const GOOD: &str = "name = \"good\"\nprocessor = \"p\"\n";

    #[test]
    fn find_job_reads_only_what_it_needs() {
        let dir = jobs_dir(&[
            ("good.toml", GOOD),
            ("broken.toml", "name = \"broken\"\nprocessor = \"sql\n"),
            (
                "invalid.toml",
                "name = \"invalid\"\nprocessor = \"p\"\n[guards]\nlease = \"soon\"\n",
            ),
            ("other_file.toml", "name = \"renamed\"\nprocessor = \"p\"\n"),
        ]);
        let store = "sqlite://idem.db";
        assert_eq!(find_job("good", &dir, store).unwrap().name, "good");
        // Found by its `name` key although the file is called otherwise.
        let renamed = find_job("renamed", &dir, store).unwrap();
        assert!(renamed.path.ends_with("other_file.toml"));
        // The invalid job itself is still reported with its file and field.
        let e = find_job("invalid", &dir, store).unwrap_err().to_string();
        assert!(
            e.contains("invalid.toml") && e.contains("guards.lease"),
            "{e}"
        );
        let e = find_job("broken", &dir, store).unwrap_err().to_string();
        assert!(
            e.contains("malformed job file") && e.contains("broken.toml"),
            "{e}"
        );
        // An unknown job lists the known names and says which files could not be read.
        let e = find_job("nope", &dir, store).unwrap_err().to_string();
        assert!(e.contains("unknown job \"nope\""), "{e}");
        assert!(e.contains("known: good, invalid, renamed"), "{e}");
        assert!(
            e.contains("1 file(s) could not be read") && e.contains("broken.toml"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn scan_jobs_reports_every_bad_file() {
        let dir = jobs_dir(&[
            ("a.toml", GOOD),
            ("b.toml", "name = \"b\"\nprocessor = \"sql\n"),
            (
                "c.toml",
                "name = \"c\"\nprocessor = \"p\"\n[guards]\nlease = \"99999999d\"\n",
            ),
            ("d.toml", GOOD),
        ]);
        let scan = scan_jobs(&dir, "sqlite://idem.db").unwrap();
        assert_eq!(scan.jobs.len(), 1);
        let problems: Vec<(String, &str)> = scan
            .problems
            .iter()
            .map(|p| {
                (
                    p.path.file_name().unwrap().to_string_lossy().into_owned(),
                    p.error.as_str(),
                )
            })
            .collect();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].0 == "b.toml" && problems[0].1.contains("malformed job file"));
        assert!(problems[1].0 == "c.toml" && problems[1].1.contains("guards.lease"));
        assert!(problems[2].0 == "d.toml" && problems[2].1.contains("used by both"));
        let e = load_jobs(&dir, "sqlite://idem.db").unwrap_err().to_string();
        assert!(e.starts_with("3 invalid job files in"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn sql_job(extra_guards: &str, sql: &str) -> String {
        format!("name = \"s\"\nprocessor = \"sql\"\n[guards]\n{extra_guards}\n[sql]\n{sql}\n")
    }

    #[test]
    fn sql_is_validated_at_load_naming_the_file_and_the_field() {
        let p = Path::new("jobs/s.toml");
        let load = |toml: &str, store: &str| {
            Job::parse(toml, p)
                .and_then(|j| j.check(store).map(|()| j))
                .map_err(|e| e.to_string())
        };
        let store = "sqlite://idem.db";
        // An unknown parameter, in each script.
        for field in ["setup", "content", "process"] {
            let mut sql = String::from("process = \"SELECT 1\"\n");
            if field == "process" {
                sql.clear();
            }
            sql.push_str(&format!("{field} = \"SELECT @scope, @typo\"\n"));
            let e = load(&sql_job("", &sql), store).unwrap_err();
            assert!(
                e.contains("jobs/s.toml")
                    && e.contains(&format!("[sql].{field} uses unknown parameter @typo")),
                "{e}"
            );
            assert!(
                e.contains("known: @scope, @scope_date, @run_id, @trigger"),
                "{e}"
            );
        }
        // [sql.params] keys and the built-ins are known.
        load(
            &sql_job("", "process = \"SELECT @scope, @scope_date, @run_id, @trigger, @region\"\n[sql.params]\nregion = \"eu\""),
            store,
        )
        .unwrap();
        let e = load(
            &sql_job("", "process = \"SELECT 1\"\n[sql.params]\nscope = \"x\""),
            store,
        )
        .unwrap_err();
        assert!(
            e.contains("[sql.params] sets \"scope\", a built-in parameter"),
            "{e}"
        );
        // SQL the scanner cannot read, in the warehouse's dialect.
        let e = load(&sql_job("", "process = \"SELECT 'oops\""), store).unwrap_err();
        assert!(
            e.contains("[sql].process: unterminated string starting at line 1, column 8"),
            "{e}"
        );
        let pg = "warehouse = \"postgres://u@h/db\"\nprocess = \"SELECT $f$ @nope $f$, @scope\"";
        load(&sql_job("", pg), store).unwrap();
        let sqlite = "warehouse = \"sqlite://w.db\"\nprocess = \"SELECT $f$ @nope $f$, @scope\"";
        let e = load(&sql_job("", sqlite), store).unwrap_err();
        assert!(e.contains("unknown parameter @nope"), "{e}");
        // The default warehouse takes the store's dialect.
        let e = load(
            &sql_job("", "process = \"SELECT `a\\\\` , @scope\""),
            "bigquery://p/d",
        )
        .unwrap_err();
        assert!(e.contains("[sql].process: unterminated"), "{e}");
        load(&sql_job("", "process = \"SELECT `a\\\\` , @scope\""), store).unwrap();
        // content_hash needs a content query.
        let e = load(
            &sql_job("content_hash = \"24h\"", "process = \"SELECT 1\""),
            store,
        )
        .unwrap_err();
        assert!(
            e.contains("jobs/s.toml")
                && e.contains("guards.content_hash is set but [sql] has no content"),
            "{e}"
        );
        load(
            &sql_job(
                "content_hash = \"24h\"",
                "content = \"SELECT 1\"\nprocess = \"SELECT 1\"",
            ),
            store,
        )
        .unwrap();
        // Unsupported warehouse schemes, explicit or by default.
        let e = load(
            &sql_job("", "warehouse = \"mysql://h/db\"\nprocess = \"SELECT 1\""),
            store,
        )
        .unwrap_err();
        assert!(
            e.contains("jobs/s.toml")
                && e.contains("[sql].warehouse: unsupported warehouse url \"mysql://h/db\""),
            "{e}"
        );
        let e = load(&sql_job("", "process = \"SELECT 1\""), "memory://").unwrap_err();
        assert!(
            e.contains("[sql].warehouse is not set")
                && e.contains("unsupported warehouse url \"memory://\""),
            "{e}"
        );
    }

    #[test]
    fn a_sqlite_store_defaults_the_warehouse_to_a_file_of_its_own() {
        assert_eq!(
            default_warehouse_url("sqlite://idem.db"),
            "sqlite://idem-warehouse.db"
        );
        assert_eq!(
            default_warehouse_url("sqlite:///var/lib/idem/store.sqlite?mode=rwc"),
            "sqlite:///var/lib/idem/store-warehouse.sqlite?mode=rwc"
        );
        assert_eq!(
            default_warehouse_url("sqlite://data/idem"),
            "sqlite://data/idem-warehouse"
        );
        assert_eq!(
            default_warehouse_url("sqlite://:memory:"),
            "sqlite://:memory:"
        );
        assert_eq!(
            default_warehouse_url("postgres://u@h/db"),
            "postgres://u@h/db"
        );
        let job = Job::parse(
            &sql_job("", "process = \"SELECT 1\""),
            Path::new("jobs/s.toml"),
        )
        .unwrap();
        assert_eq!(
            job.warehouse_url("sqlite://idem.db"),
            "sqlite://idem-warehouse.db"
        );
        let job = Job::parse(
            &sql_job("", "warehouse = \"sqlite://w.db\"\nprocess = \"SELECT 1\""),
            Path::new("jobs/s.toml"),
        )
        .unwrap();
        assert_eq!(job.warehouse_url("sqlite://idem.db"), "sqlite://jobs/w.db");
    }
}
