//! The job file's types: [`Job`], its `[guards]` ([`GuardsConfig`]) and `[sql]`
//! ([`SqlConfig`]) tables, read by serde into typed fields (modes, policies, durations,
//! hashes), and the checks that span several fields ([`Job::check`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::error::{Error, Result};
use crate::guard::{ContentHashGuard, GuardStack, LeaseGuard, OnHeld, TimeWindowGuard};
use crate::key::HashAlgorithm;
use crate::model::duration::{parse_duration_field, MIN_LEASE};
use crate::model::Mode;
use crate::runner::StoreFailurePolicy;
use crate::warehouse::{warehouse_dialect, SqlScripts, BUILTIN_PARAMS};

/// The lease of a job that does not set `guards.lease`.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(3600);

/// A guard named in `guards.order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GuardName {
    /// `time_window`.
    TimeWindow,
    /// `content_hash`.
    ContentHash,
    /// `lease`.
    Lease,
}

impl GuardName {
    /// The default order: cheap reads first; the lease re-checks them once claimed.
    pub const DEFAULT_ORDER: [GuardName; 3] = [
        GuardName::TimeWindow,
        GuardName::ContentHash,
        GuardName::Lease,
    ];

    /// The name in job files.
    pub fn as_str(self) -> &'static str {
        match self {
            GuardName::TimeWindow => "time_window",
            GuardName::ContentHash => "content_hash",
            GuardName::Lease => "lease",
        }
    }
}

impl fmt::Display for GuardName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `guards.on_in_progress`: what a run does when another run holds the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnInProgress {
    /// Skip (`in_progress`), the default.
    #[default]
    Skip,
    /// Wait for the lease, at most `guards.wait`.
    Wait,
}

/// The `[guards]` table.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct GuardsConfig {
    /// Guard order; default `["time_window", "content_hash", "lease"]` (cheap reads first;
    /// the lease re-checks them once claimed).
    #[serde(default, deserialize_with = "de::order")]
    pub order: Option<Vec<GuardName>>,
    /// Lease duration; `None` = the default ([`DEFAULT_LEASE`]); zero (`"0s"`/`"off"`)
    /// disables the lease; at least [`MIN_LEASE`], at most
    /// [`MAX_DURATION`](crate::model::duration::MAX_DURATION).
    #[serde(default, deserialize_with = "de::lease")]
    pub lease: Option<Duration>,
    /// `skip` (default) or `wait` when another run holds the lease.
    #[serde(default, deserialize_with = "de::on_in_progress")]
    pub on_in_progress: OnInProgress,
    /// Longest wait with `on_in_progress = "wait"`; default the lease duration.
    #[serde(default, deserialize_with = "de::wait")]
    pub wait: Option<Duration>,
    /// Renew the lease while processing; default true.
    pub heartbeat: Option<bool>,
    /// Time window; absent, `"0s"` or `"off"` = off (`None`).
    #[serde(default, deserialize_with = "de::time_window")]
    pub time_window: Option<Duration>,
    /// Content window; absent, `"0s"` or `"off"` = off (`None`).
    #[serde(default, deserialize_with = "de::content_hash")]
    pub content_hash: Option<Duration>,
    /// `sha256` (default) or `md5`.
    #[serde(default, deserialize_with = "de::hash")]
    pub hash: HashAlgorithm,
    /// What the time window does when the run within it had another version of the job
    /// (a command job's command changed): `skip` (default, with a warning) or `rerun`.
    #[serde(default)]
    pub on_change: crate::guard::OnChange,
}

/// The `[sql]` table.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SqlConfig {
    /// Warehouse URL; default [`default_warehouse_url`] of
    /// the store (for a SQLite store a file of its own beside it).
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

/// A job file (see the [module documentation](super) for the vocabulary).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Unique name; the processor identity in the ledger (`processor_name`).
    pub name: String,
    /// `sql`, `cleanup` (see [`crate::maintenance::cleanup`]) or a registered processor's
    /// name: the code that runs.
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
    /// With `missed = "catch_up"`: how long after a scheduler fire of a date failed the
    /// scheduler fires that date again (default 5m), up to 3 failed fires of the date.
    #[serde(default, deserialize_with = "de::refire_after")]
    pub refire_after: Option<Duration>,
    /// `enforce` (default), `shadow` or `off`.
    #[serde(default, deserialize_with = "de::mode")]
    pub mode: Mode,
    /// `strict` (default) or `best_effort`.
    #[serde(default, deserialize_with = "de::store_failure")]
    pub store_failure: StoreFailurePolicy,
    /// A completed run whose result cannot be recorded counts as failed (exit 3); default
    /// true under `store_failure = "strict"`, false under `best_effort`.
    pub strict_recording: Option<bool>,
    /// Guards.
    #[serde(default)]
    pub guards: GuardsConfig,
    /// SQL processor settings.
    pub sql: Option<SqlConfig>,
    /// Command job settings (`processor = "command"`).
    pub command: Option<crate::command::CommandConfig>,
    /// Parameters handed to Rust processors (`RunRequest::params`).
    #[serde(default)]
    pub params: toml::Table,
    /// The file it came from.
    #[serde(skip)]
    pub path: PathBuf,
}

/// The serde readers of the typed fields. A bad value is reported with the message the
/// field's own parser gives (naming the field), marked with [`de::BAD_VALUE`] so loading
/// tells it apart from malformed TOML.
pub(super) mod de {
    use super::*;

    /// Starts the serde message of a bad field value.
    pub(in crate::job) const BAD_VALUE: &str = "\u{1}bad value: ";

    fn bad<E: serde::de::Error>(e: impl fmt::Display) -> E {
        E::custom(format_args!("{BAD_VALUE}{e}"))
    }

    /// Reads a string and parses it with `parse`.
    fn parsed<'de, D, T>(d: D, parse: impl FnOnce(&str) -> Result<T>) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
    {
        let s = String::deserialize(d)?;
        parse(&s).map_err(bad)
    }

    /// A window: zero or `"off"` is `None` (off).
    fn window<'de, D: Deserializer<'de>>(d: D, field: &str) -> Result<Option<Duration>, D::Error> {
        parsed(d, |s| match s {
            "off" => Ok(None),
            s => Ok(Some(parse_duration_field(field, s)?).filter(|d| !d.is_zero())),
        })
    }

    pub fn time_window<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        window(d, "guards.time_window")
    }

    pub fn content_hash<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        window(d, "guards.content_hash")
    }

    /// At least a second: a failed fire is not fired again at once.
    pub fn refire_after<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        parsed(d, |s| {
            let after = parse_duration_field("refire_after", s)?;
            if after < Duration::from_secs(1) {
                return Err(Error::config(format!(
                    "refire_after = {s:?} is too short: the minimum is 1s"
                )));
            }
            Ok(Some(after))
        })
    }

    pub fn wait<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        parsed(d, |s| parse_duration_field("guards.wait", s).map(Some))
    }

    /// The lease: `"off"` or zero is `Some(ZERO)` (off; absent is the default lease).
    pub fn lease<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        parsed(d, |s| {
            let ttl = match s {
                "off" => Duration::ZERO,
                s => parse_duration_field("guards.lease", s)?,
            };
            if !ttl.is_zero() && ttl < MIN_LEASE {
                return Err(Error::config(format!(
                    "guards.lease = {s:?} is too short: the minimum is 1s (the heartbeat renews the lease every third of its duration); use \"0s\" or \"off\" for no lease"
                )));
            }
            Ok(Some(ttl))
        })
    }

    pub fn on_in_progress<'de, D: Deserializer<'de>>(d: D) -> Result<OnInProgress, D::Error> {
        parsed(d, |s| match s {
            "skip" => Ok(OnInProgress::Skip),
            "wait" => Ok(OnInProgress::Wait),
            other => Err(Error::config(format!(
                "guards.on_in_progress = {other:?}: expected skip or wait"
            ))),
        })
    }

    pub fn hash<'de, D: Deserializer<'de>>(d: D) -> Result<HashAlgorithm, D::Error> {
        parsed(d, |s| {
            HashAlgorithm::from_str(s).map_err(|e| Error::config(format!("guards.hash: {e}")))
        })
    }

    pub fn order<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<GuardName>>, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        names
            .iter()
            .map(|name| {
                GuardName::DEFAULT_ORDER
                    .into_iter()
                    .find(|g| g.as_str() == name)
                    .ok_or_else(|| {
                        bad(format_args!(
                            "guards.order: unknown guard {name:?} (expected time_window, content_hash, lease)"
                        ))
                    })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    pub fn mode<'de, D: Deserializer<'de>>(d: D) -> Result<Mode, D::Error> {
        parsed(d, Mode::from_str)
    }

    pub fn store_failure<'de, D: Deserializer<'de>>(d: D) -> Result<StoreFailurePolicy, D::Error> {
        parsed(d, StoreFailurePolicy::from_str)
    }
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
    let Some(rest) = crate::backend::Backend::sqlite_path(store_url) else {
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
    /// Checks what spans several fields (the fields themselves were checked as they were
    /// read).
    pub(super) fn validate(&self) -> Result<()> {
        if self.name.trim().is_empty() {
            return Err(Error::config("name is empty"));
        }
        super::validate_name(&self.name).map_err(|e| Error::config(format!("name: {e}")))?;
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
        if self.missed_policy()? == crate::schedule::Missed::Skip && self.refire_after.is_some() {
            return Err(Error::config(
                "refire_after is set but missed is not \"catch_up\" (a skip job's failed dates are not fired again)",
            ));
        }
        self.guard_stack()?;
        if self.processor == crate::maintenance::cleanup::CLEANUP_PROCESSOR {
            crate::maintenance::cleanup::CleanupSettings::from_params(&self.params)?;
            if self.guards.content_hash.is_some() {
                return Err(Error::config(
                    "guards.content_hash is set but processor = \"cleanup\" has no content \
                     to hash; remove guards.content_hash",
                ));
            }
        }
        if self.processor == crate::command::COMMAND_PROCESSOR {
            let spec = self.command_spec()?;
            if self.guards.heartbeat.unwrap_or(true) {
                spec.check_lease(self.lease_ttl(), "[command] grace", "[guards] lease")?;
            }
            if self.guards.content_hash.is_some()
                && self.command.as_ref().is_some_and(|c| c.content.is_none())
            {
                return Err(Error::config(
                    "guards.content_hash is set but [command] has no content command: there \
                     is nothing to hash; add content = [\"program\", ...] (its standard output \
                     is the content) or remove guards.content_hash",
                ));
            }
        } else if self.command.is_some() {
            return Err(Error::config(format!(
                "[command] is set but processor = {:?}; a command job says processor = \"command\"",
                self.processor
            )));
        }
        if self.processor == "sql" {
            let sql = self
                .sql
                .as_ref()
                .ok_or_else(|| Error::config("processor = \"sql\" needs a [sql] table"))?;
            if sql.process.is_none() && sql.process_file.is_none() {
                return Err(Error::config("[sql] needs process or process_file"));
            }
            if self.guards.content_hash.is_some()
                && sql.content.is_none()
                && sql.content_file.is_none()
            {
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

    /// The lease duration, if the lease is on (default [`DEFAULT_LEASE`]).
    pub fn lease_ttl(&self) -> Option<Duration> {
        match self.guards.lease {
            None => Some(DEFAULT_LEASE),
            Some(ttl) => Some(ttl).filter(|t| !t.is_zero()),
        }
    }

    /// The guard stack the job asks for.
    pub fn guard_stack(&self) -> Result<GuardStack> {
        let g = &self.guards;
        let lease = self.lease_ttl();
        let on_held = match g.on_in_progress {
            OnInProgress::Skip => OnHeld::Skip,
            OnInProgress::Wait => OnHeld::Wait {
                max: g.wait.unwrap_or(lease.unwrap_or(DEFAULT_LEASE)),
            },
        };
        let order = g
            .order
            .clone()
            .unwrap_or_else(|| GuardName::DEFAULT_ORDER.to_vec());
        let mut seen = std::collections::HashSet::new();
        let mut builder = GuardStack::builder();
        for name in order {
            if !seen.insert(name) {
                return Err(Error::config(format!(
                    "guards.order names {:?} twice",
                    name.as_str()
                )));
            }
            builder = match name {
                GuardName::TimeWindow => builder.option_guard(
                    g.time_window
                        .map(|w| TimeWindowGuard::new(w).on_change(g.on_change)),
                ),
                GuardName::ContentHash => {
                    builder.option_guard(g.content_hash.map(|w| ContentHashGuard::new(w, g.hash)))
                }
                GuardName::Lease => {
                    builder.option_guard(lease.map(|ttl| LeaseGuard::new(ttl).on_held(on_held)))
                }
            };
        }
        for (name, on) in [
            (GuardName::TimeWindow, g.time_window.is_some()),
            (GuardName::ContentHash, g.content_hash.is_some()),
            (GuardName::Lease, lease.is_some()),
        ] {
            if on && !seen.contains(&name) {
                return Err(Error::config(format!(
                    "guards.{name} is set but guards.order leaves it out"
                )));
            }
        }
        Ok(builder.build())
    }

    /// The SQL scripts of a `processor = "sql"` job, read from their files if need be.
    pub(super) fn scripts(&self) -> Result<SqlScripts> {
        let sql = self.sql.clone().unwrap_or_default();
        let dir = self.dir();
        Ok(SqlScripts {
            setup: read_sql(dir, &sql.setup, &sql.setup_file, "setup")?,
            content: read_sql(dir, &sql.content, &sql.content_file, "content")?,
            process: read_sql(dir, &sql.process, &sql.process_file, "process")?.unwrap_or_default(),
        })
    }

    /// The validated `[command]` of a command job.
    pub fn command_spec(&self) -> Result<crate::command::CommandSpec> {
        let config = self.command.as_ref().ok_or_else(|| {
            Error::config("processor = \"command\" needs a [command] table with run = [...]")
        })?;
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        crate::command::CommandSpec::new(config, &dir, &self.params)
    }

    /// Checks what depends on where the job runs, without touching any database: for a
    /// `processor = "sql"` job, that its warehouse URL (the `[sql].warehouse`, or the
    /// default for `store_url`, see [`Job::warehouse_url`]) has a supported scheme and that
    /// every script reads in that warehouse's dialect with only known `@name` parameters.
    /// [`find_job`](super::find_job) and [`load_jobs`](super::load_jobs) call it; errors
    /// name the job file and the field.
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
        scripts.prepare(dialect, &self.sql_params())?;
        Ok(())
    }

    /// The `[sql.params]`.
    /// Refuses a `--param` name the job has in neither `[params]` nor `[sql.params]`
    /// (a typo would otherwise run the job with its default, silently).
    pub fn check_param_names<'a>(&self, names: impl IntoIterator<Item = &'a String>) -> Result<()> {
        let sql = self.sql_params();
        for name in names {
            if !self.params.contains_key(name) && !sql.contains_key(name) {
                let mut known: Vec<&str> = self
                    .params
                    .keys()
                    .chain(sql.keys())
                    .map(String::as_str)
                    .collect();
                known.sort_unstable();
                known.dedup();
                return Err(Error::input(format!(
                    "--param {name}: job {} has no parameter {name:?} (its parameters: {}; \
                     set them in [params] or [sql.params] of {})",
                    self.name,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    },
                    self.path.display()
                )));
            }
        }
        Ok(())
    }

    /// The job with `overrides` (`--param NAME=VALUE`) over its `[sql.params]` of the same
    /// names; unknown names are refused ([`Job::check_param_names`]).
    pub fn with_sql_params(&self, overrides: &BTreeMap<String, String>) -> Result<Job> {
        self.check_param_names(overrides.keys())?;
        let mut job = self.clone();
        if let Some(sql) = job.sql.as_mut() {
            for (name, value) in overrides {
                if let Some(slot) = sql.params.get_mut(name) {
                    slot.clone_from(value);
                }
            }
        }
        Ok(job)
    }

    pub(super) fn sql_params(&self) -> BTreeMap<String, String> {
        self.sql
            .as_ref()
            .map(|s| s.params.clone())
            .unwrap_or_default()
    }

    /// A `sqlite://` warehouse path relative to the job's folder made absolute.
    fn resolve_warehouse(&self, url: &str) -> String {
        match crate::backend::Backend::sqlite_path(url) {
            Some(path) if !path.starts_with('/') && !path.starts_with(':') => {
                format!("sqlite://{}", self.dir().join(path).display())
            }
            _ => url.to_string(),
        }
    }

    /// Where the job's SQL runs: `[sql].warehouse` (a relative SQLite path resolved
    /// against the job's folder), else
    /// [`default_warehouse_url`] of the store.
    pub fn warehouse_url(&self, store_url: &str) -> String {
        match self.sql.as_ref().and_then(|s| s.warehouse.as_deref()) {
            Some(url) => self.resolve_warehouse(url),
            None => default_warehouse_url(store_url),
        }
    }

    /// Request parameters as JSON.
    pub fn params_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.params).unwrap_or(serde_json::Value::Null)
    }

    /// What the schedule module needs of the job.
    pub fn scheduled(&self) -> Result<crate::schedule::ScheduledJob> {
        let (timeout, grace) = if self.command.is_some() {
            let spec = self.command_spec()?;
            (spec.timeout(), Some(spec.grace()))
        } else {
            (None, None)
        };
        Ok(crate::schedule::ScheduledJob {
            name: self.name.clone(),
            schedule: self.schedule.clone().unwrap_or_default(),
            timezone: self.timezone.clone(),
            date: self.date.clone(),
            lease: self.lease_ttl(),
            path: self.path.clone(),
            missed: self.missed_policy()?,
            refire_after: self.refire_after,
            time_window: self.guards.time_window,
            mode: self.mode,
            timeout,
            grace,
        })
    }
}
