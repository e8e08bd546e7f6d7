//! [`plan`]: the one place that turns a job, the registry, a store and the caller's
//! [`Overrides`] into a ready [`Runner`] and processor. `idem run` (and its backfill),
//! `idem explain` and `idem scheduler` all build their runs here.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};

use super::config::Job;
use crate::error::{Error, Result};
use crate::model::{Mode, RunRequest, Trigger};
use crate::processor::{Processor, Registry};
use crate::runner::{Cancel, Runner, StoreFailurePolicy};
use crate::store::spool::Spool;
use crate::store::{
    BreakerConfig, CircuitBreakerStore, DynStore, PoolSize, Stores, UnavailableStore,
};
use crate::warehouse::{SqlProcessor, Warehouses};

/// What the runs a process plans share: one store per store URL and one warehouse per
/// warehouse URL (a scheduler of 1,000 jobs on one store is one pool, not 1,000). Cheap to
/// clone; for one tokio runtime (see [`crate::backend::shared`]).
#[derive(Debug, Clone)]
pub struct Connections {
    /// The stores, by URL.
    pub stores: Stores,
    /// The warehouses, by URL.
    pub warehouses: Warehouses,
    /// The spools replayed already (once per process, not once per job).
    replayed: Arc<std::sync::Mutex<std::collections::HashSet<std::path::PathBuf>>>,
}

impl Connections {
    /// Nothing open yet; stores will have `size` connections when their URL does not say.
    pub fn new(size: PoolSize) -> Self {
        Connections {
            stores: Stores::new(size),
            warehouses: Warehouses::default(),
            replayed: Arc::default(),
        }
    }

    /// Whether `spool` is still to replay in this process (true once per spool).
    fn first_replay(&self, spool: &Spool) -> bool {
        let mut replayed = self.replayed.lock().unwrap_or_else(|e| e.into_inner());
        replayed.insert(spool.path().to_path_buf())
    }
}

/// What the caller changes of a job's settings, and how its runs are made.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// The mode instead of the job's.
    pub mode: Option<Mode>,
    /// The store failure policy instead of the job's.
    pub store_failure: Option<StoreFailurePolicy>,
    /// The trigger of the requests (default `manual`).
    pub trigger: Option<Trigger>,
    /// The scope of the requests, when it is not just the date.
    pub scope: Option<String>,
    /// The run id of the requests (default: a new UUID each).
    pub run_id: Option<String>,
    /// Stops a running processor when cancelled (the run is recorded as interrupted and
    /// its lease released).
    pub cancel: Option<Cancel>,
    /// Replay the spool of runs recorded while the store was unreachable, and spool this
    /// run's result when the store cannot take it (see [`Spool`]).
    pub spool: bool,
    /// Parameters over the job's `[params]` of the same name (`--param NAME=VALUE`), as
    /// strings.
    pub params: std::collections::BTreeMap<String, String>,
    /// The stores and warehouses this run shares with the process's other runs (`None`:
    /// its own, with one store connection).
    pub connections: Option<Connections>,
}

impl Overrides {
    /// The request for `job` on `date`, with the trigger, scope and run id asked for.
    pub fn request(&self, job: &Job, date: NaiveDate) -> Result<RunRequest> {
        job.check_param_names(self.params.keys())?;
        let mut request = RunRequest::new(job.name.clone(), date)
            .with_trigger(self.trigger.unwrap_or(Trigger::Manual))
            .with_params(job.params_json());
        if let serde_json::Value::Object(params) = &mut request.params {
            for (name, value) in &self.params {
                params.insert(name.clone(), serde_json::Value::String(value.clone()));
            }
        }
        if let Some(scope) = &self.scope {
            request = request.with_scope(scope.clone());
        }
        if let Some(id) = &self.run_id {
            request.run_id = id.clone();
        }
        request.validate()?;
        Ok(request)
    }

    /// The store failure policy in force for `job`.
    pub fn store_failure(&self, job: &Job) -> StoreFailurePolicy {
        self.store_failure.unwrap_or(job.store_failure)
    }
}

/// A run ready to go: the job, its runner and its processor.
#[derive(Clone)]
pub struct Plan {
    /// The job.
    pub job: Job,
    /// The runner, configured as the job and the overrides say.
    pub runner: Runner,
    /// The processor the job names.
    pub processor: Arc<dyn Processor>,
    /// The overrides it was planned with (they shape [`Plan::request`]).
    pub overrides: Overrides,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("job", &self.job.name)
            .field("processor", &self.processor.name())
            .finish_non_exhaustive()
    }
}

impl Plan {
    /// The request for `date` (see [`Overrides::request`]).
    pub fn request(&self, date: NaiveDate) -> Result<RunRequest> {
        self.overrides.request(&self.job, date)
    }
}

/// Turns `job` into a ready runner and processor: opens the store at `store_url` (under
/// `best_effort`, an unreachable store becomes an [`UnavailableStore`]; a store that failed
/// twice is not tried again for 30 s), replays the spool if asked, builds the processor
/// (the built-in SQL or cleanup one, or the one `registry` has under the job's
/// `processor`), and the runner with the job's guards, mode and policies, the overrides
/// applied.
pub async fn plan(
    job: &Job,
    registry: &Registry,
    store_url: &str,
    overrides: Overrides,
) -> Result<Plan> {
    let policy = overrides.store_failure(job);
    let connections = overrides
        .connections
        .clone()
        .unwrap_or_else(|| Connections::new(PoolSize::ONE_RUN));
    let store = open_store(&connections, store_url, policy).await?;
    let spool = overrides.spool.then(|| Spool::from_env(store_url));
    // A run that would spool its result when the store fails must be able to: said now,
    // before any work (exit 2), not when a finished run's result has nowhere to go.
    let spools = !job
        .strict_recording
        .unwrap_or(policy == StoreFailurePolicy::Strict);
    if let Some(spool) = spool.as_ref().filter(|_| spools) {
        spool.check().map_err(|e| {
            Error::input(format!(
                "job {}: the spool {} (IDEM_SPOOL_DIR) cannot be written: {e}; a result the store cannot take goes there (store_failure = \"best_effort\" or strict_recording = false)",
                job.name,
                spool.path().display()
            ))
        })?;
    }
    if let Some(spool) = spool.as_ref().filter(|s| connections.first_replay(s)) {
        replay_spool(spool, &*store).await;
    }
    // `--param` over `[sql.params]` too (they are bound into the job's SQL).
    let with_params = job.with_sql_params(&overrides.params)?;
    let processor = with_params
        .processor_in(registry, store_url, Some(store.clone()), &connections)
        .await?;
    let mut runner = job
        .runner(store)?
        .store_failure_policy(policy)
        .mode(overrides.mode.unwrap_or(job.mode));
    if let Some(spool) = spool {
        runner = runner.spool(spool);
    }
    if let Some(cancel) = &overrides.cancel {
        runner = runner.cancel_on(cancel.clone());
    }
    Ok(Plan {
        job: job.clone(),
        runner,
        processor,
        overrides,
    })
}

/// Opens the store for runs under `policy`, behind a circuit breaker.
async fn open_store(
    connections: &Connections,
    url: &str,
    policy: StoreFailurePolicy,
) -> Result<Arc<DynStore>> {
    let inner: Arc<DynStore> = match connections.stores.open(url).await {
        Ok(s) => s,
        Err(e) if e.is_store_failure() && policy == StoreFailurePolicy::BestEffort => {
            tracing::warn!("{e}; continuing without a store (best_effort)");
            let message = match e {
                Error::StoreUnavailable { message, .. } => message,
                other => other.to_string(),
            };
            Arc::new(UnavailableStore::new(url, message))
        }
        Err(e) => return Err(e),
    };
    // In one invocation a store that failed twice is not tried again.
    Ok(Arc::new(CircuitBreakerStore::new(
        inner,
        BreakerConfig {
            failure_threshold: 2,
            reset_timeout: Duration::from_secs(30),
        },
    )))
}

/// Records results spooled while the store was unreachable; problems are warnings (the
/// command goes on, and the spool keeps what was not recorded).
pub async fn replay_spool(spool: &Spool, store: &DynStore) {
    if !spool.path().exists() {
        return;
    }
    match spool.replay(store).await {
        Ok(r) if r.remaining > 0 => tracing::warn!(
            "{} spooled run(s) still wait in {}",
            r.remaining,
            spool.path().display()
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("spooled runs not recorded yet: {e}"),
    }
}

impl Job {
    /// The date of a run: `date` (an expression), else the job's `date`, evaluated in the
    /// job's zone at `scheduled_at` (RFC 3339) or `now`.
    pub fn run_date(
        &self,
        date: Option<&str>,
        scheduled_at: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<NaiveDate> {
        crate::schedule::run_date(
            date,
            self.date.as_deref(),
            scheduled_at,
            self.scheduled()?.tz()?,
            now,
        )
    }

    /// The dates of a backfill from `from` to `to` (expressions in the job's zone at `now`).
    pub fn backfill_dates(
        &self,
        from: &str,
        to: &str,
        now: DateTime<Utc>,
    ) -> Result<Vec<NaiveDate>> {
        crate::schedule::backfill_dates(from, to, self.scheduled()?.tz()?, now)
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

    /// Whether the job's processor exists: built in (`sql`, `cleanup`) or in `registry`.
    pub fn check_processor(&self, registry: &Registry) -> Result<()> {
        let builtin = [
            crate::maintenance::cleanup::CLEANUP_PROCESSOR,
            crate::command::COMMAND_PROCESSOR,
            "sql",
        ];
        if builtin.contains(&self.processor.as_str()) || registry.get(&self.processor).is_some() {
            return Ok(());
        }
        Err(self.unknown_processor(registry))
    }

    fn unknown_processor(&self, registry: &Registry) -> Error {
        let known = registry.names();
        Error::config(format!(
            "job {}: unknown processor {:?} (registered: {}; built in: sql, command, cleanup)",
            self.name,
            self.processor,
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ))
    }

    /// [`Job::processor`], with the store a `cleanup` job cleans (`None`: open `store_url`).
    pub async fn processor_with_store(
        &self,
        registry: &Registry,
        store_url: &str,
        store: Option<Arc<DynStore>>,
    ) -> Result<Arc<dyn Processor>> {
        let connections = Connections::new(PoolSize::ONE_RUN);
        self.processor_in(registry, store_url, store, &connections)
            .await
    }

    /// [`Job::processor_with_store`], opening a SQL job's warehouse (and a `cleanup` job's
    /// store) among `connections`.
    async fn processor_in(
        &self,
        registry: &Registry,
        store_url: &str,
        store: Option<Arc<DynStore>>,
        connections: &Connections,
    ) -> Result<Arc<dyn Processor>> {
        if self.processor == crate::maintenance::cleanup::CLEANUP_PROCESSOR {
            let settings = crate::maintenance::cleanup::CleanupSettings::from_params(&self.params)
                .map_err(|e| Error::config(format!("job file {}: {e}", self.path.display())))?;
            let store = match store {
                Some(store) => store,
                None => connections.stores.open(store_url).await?,
            };
            let processor =
                crate::maintenance::cleanup::CleanupProcessor::new(&self.name, store, settings);
            return Ok(Arc::new(match self.path.parent() {
                Some(dir) => {
                    let dir = dir.to_path_buf();
                    processor.keeping_for(Arc::new(move || super::guard_needs(&dir)))
                }
                None => processor,
            }));
        }
        if self.processor == crate::command::COMMAND_PROCESSOR {
            let spec = self
                .command_spec()
                .map_err(|e| Error::config(format!("job file {}: {e}", self.path.display())))?;
            return Ok(Arc::new(crate::command::CommandProcessor::new(
                &self.name, spec,
            )));
        }
        if self.processor == "sql" {
            self.check(store_url)?;
            let warehouse = connections
                .warehouses
                .open(&self.warehouse_url(store_url))
                .await?;
            return Ok(Arc::new(SqlProcessor::new(
                &self.name,
                warehouse,
                &self.scripts()?,
                self.sql_params(),
            )?));
        }
        registry
            .get(&self.processor)
            .ok_or_else(|| self.unknown_processor(registry))
    }

    /// A runner configured as the job says (its guards, mode, store failure policy,
    /// heartbeat and recording); [`plan`] adds the overrides.
    pub fn runner(&self, store: Arc<DynStore>) -> Result<Runner> {
        let mut runner = Runner::new(store, self.guard_stack()?)
            .mode(self.mode)
            .store_failure_policy(self.store_failure)
            .heartbeat(self.guards.heartbeat.unwrap_or(true));
        if let Some(strict) = self.strict_recording {
            runner = runner.strict_recording(strict);
        }
        Ok(runner)
    }
}
