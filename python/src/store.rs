//! `pyidem.Store`: an open store, safe across `os.fork()`, closable, readable (`runs`).
//!
//! A store's connections belong to the process (and the Tokio runtime) that opened them:
//! a child made by `fork()` (gunicorn, Celery prefork, `multiprocessing`'s `fork`) that
//! used them would wait forever on sockets and threads it does not have. So a store
//! remembers the process it was opened in, and in any other process it opens itself again
//! at first use, leaving the parent's connections alone (the child never closes them: they
//! are the parent's). Processors and gates take their store through [`Store::current`], so
//! they follow.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::store::{BreakerConfig, DynStore, EventKeyStore, RunFilter};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use serde_json::Value;

use crate::{runtime, to_py_err, IdemError};

/// What a URL opened to.
#[derive(Clone)]
pub(crate) enum Opened {
    /// A store with leases and a ledger (SQLite, Postgres, BigQuery, memory), and the same
    /// behind the circuit breaker that runs use.
    Ledger {
        store: Arc<DynStore>,
        guarded: Arc<DynStore>,
    },
    /// Redis: event keys only.
    Events(Arc<dyn EventKeyStore>),
}

impl Opened {
    /// The store for event keys (any kind).
    pub(crate) fn event_keys(&self) -> Arc<dyn EventKeyStore> {
        match self {
            Opened::Ledger { store, .. } => store.clone(),
            Opened::Events(store) => store.clone(),
        }
    }

    fn same_as(&self, other: &Opened) -> bool {
        match (self, other) {
            (Opened::Ledger { store: a, .. }, Opened::Ledger { store: b, .. }) => Arc::ptr_eq(a, b),
            (Opened::Events(a), Opened::Events(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

struct State {
    /// The process that opened `opened`.
    pid: u32,
    /// `None` once closed.
    opened: Option<Opened>,
    /// Changes at each reopening (and at close): what holders of a store built from
    /// `opened` (a runner, a gate) compare to know theirs is stale.
    generation: u64,
}

/// An open store: SQLite, Postgres, BigQuery, memory (ledger and leases); Redis for event
/// keys only (`Gate`).
#[pyclass(module = "pyidem._idem", frozen)]
pub struct Store {
    url: String,
    policy: idem::StoreFailurePolicy,
    breaker: BreakerConfig,
    state: Mutex<State>,
}

/// A store URL without its secrets (`user:PASSWORD@`, `?password=`, tokens…): idem's
/// own redaction, so Python shows what the CLI shows.
pub(crate) fn redact(url: &str) -> String {
    idem::backend::redact_url(url)
}

fn is_redis(url: &str) -> bool {
    url.starts_with("redis://") || url.starts_with("rediss://")
}

impl Store {
    /// Opens `url`, the GIL released while it connects.
    fn connect(
        py: Python<'_>,
        url: &str,
        policy: idem::StoreFailurePolicy,
        breaker: BreakerConfig,
    ) -> PyResult<Opened> {
        if is_redis(url) {
            let store = py
                .allow_threads(|| runtime().block_on(idem::store::open_event_keys(url)))
                .map_err(to_py_err)?;
            return Ok(Opened::Events(store));
        }
        let store: Arc<DynStore> = match py
            // Every processor and gate given this store shares its pool: the size a
            // process of many runs gets (1 SQLite writer, 4 Postgres connections) unless the
            // URL says `?max_connections=N`.
            .allow_threads(|| {
                runtime().block_on(idem::store::open_sized(url, idem::store::PoolSize::SHARED))
            }) {
            Ok(store) => store,
            Err(e) if e.is_store_failure() && policy == idem::StoreFailurePolicy::BestEffort => {
                Arc::new(idem::store::UnavailableStore::new(url, e.to_string()))
            }
            Err(e) => return Err(to_py_err(e)),
        };
        let guarded: Arc<DynStore> = Arc::new(idem::store::CircuitBreakerStore::new(
            store.clone(),
            breaker,
        ));
        Ok(Opened::Ledger { store, guarded })
    }

    /// The store as this process may use it, with its generation: opened again when this
    /// is not the process that opened it (a `fork` child). `IdemError` once closed.
    pub(crate) fn current(&self, py: Python<'_>) -> PyResult<(u64, Opened)> {
        let pid = std::process::id();
        let stale = {
            let state = self.lock();
            match &state.opened {
                None => return Err(self.closed_error()),
                Some(opened) if state.pid == pid => return Ok((state.generation, opened.clone())),
                Some(opened) => opened.clone(),
            }
        };
        // A memory store is the process's own memory: the child has its copy.
        if self.url.starts_with("memory:") {
            let mut state = self.lock();
            state.pid = pid;
            return Ok((state.generation, stale));
        }
        // Opened without the lock held (the GIL is released while connecting).
        let fresh = Self::connect(py, &self.url, self.policy, self.breaker)?;
        if fresh.same_as(&stale) {
            // The library handed back the parent's store (one store per URL, kept since
            // before the fork): using it would hang.
            return Err(IdemError::new_err(format!(
                "{}: this store was opened in process {} before a fork and cannot be opened again here; open it after the fork",
                redact(&self.url),
                self.lock().pid
            )));
        }
        let mut state = self.lock();
        if state.opened.is_none() {
            return Err(self.closed_error());
        }
        if state.pid != pid {
            // The parent's connections are the parent's: not closed from here.
            std::mem::forget(state.opened.replace(fresh));
            state.pid = pid;
            state.generation += 1;
        }
        let opened = state.opened.clone().ok_or_else(|| self.closed_error())?;
        Ok((state.generation, opened))
    }

    /// The ledger store (behind its breaker), with its generation.
    pub(crate) fn ledger(&self, py: Python<'_>) -> PyResult<(u64, Arc<DynStore>)> {
        match self.current(py)? {
            (generation, Opened::Ledger { guarded, .. }) => Ok((generation, guarded)),
            (_, Opened::Events(_)) => Err(IdemError::new_err(format!(
                "{} holds event keys only (pyidem.Gate); processors and the run ledger need a sqlite, postgres, bigquery or memory store",
                redact(&self.url)
            ))),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn closed_error(&self) -> PyErr {
        IdemError::new_err(format!("{} is closed", redact(&self.url)))
    }
}

#[pymethods]
impl Store {
    /// The URL it was opened with.
    #[getter(url)]
    fn get_url(&self) -> String {
        self.url.clone()
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.lock().opened.is_none()
    }

    /// Closes the store: its connections are let go (once the processors and gates
    /// using it have finished their calls), and any later use raises `IdemError`.
    /// Closing twice is allowed.
    fn close(&self) {
        let mut state = self.lock();
        if state.pid == std::process::id() {
            drop(state.opened.take());
        } else {
            std::mem::forget(state.opened.take());
        }
        state.generation += 1;
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }

    /// The run ledger, newest first: the runs of `job` (and `scope`, `status`,
    /// `run_id`), at most `limit` (0: all), as `idem runs` lists them.
    #[pyo3(signature = (job=None, *, scope=None, status=None, run_id=None, limit=100))]
    fn runs(
        &self,
        py: Python<'_>,
        job: Option<String>,
        scope: Option<String>,
        status: Option<String>,
        run_id: Option<String>,
        limit: usize,
    ) -> PyResult<Vec<PyObject>> {
        let status = match status {
            None => None,
            Some(s) => Some(
                serde_json::from_value::<idem::RunStatus>(Value::String(s.clone())).map_err(
                    |_| {
                        PyValueError::new_err(format!(
                            "status={s:?}: expected \"completed\", \"skipped\" or \"failed\""
                        ))
                    },
                )?,
            ),
        };
        let (_, ledger) = self.ledger(py)?;
        let filter = RunFilter {
            processor: job,
            scope,
            status,
            run_id,
            limit,
            ..RunFilter::default()
        };
        crate::log::refresh(py);
        let rows = py
            .allow_threads(|| runtime().block_on(ledger.runs(&filter)))
            .map_err(to_py_err)?;
        let record = py.import("pyidem")?.getattr("RunRecord")?;
        rows.into_iter()
            .map(|row| {
                let mut value = serde_json::to_value(&row).unwrap_or(Value::Null);
                if let Value::Object(map) = &mut value {
                    map.insert("job".into(), Value::String(row.processor.clone()));
                }
                Ok(record
                    .call1((crate::convert::to_py(py, &value)?,))?
                    .unbind())
            })
            .collect()
    }

    fn __repr__(&self) -> String {
        let closed = if self.lock().opened.is_none() {
            ", closed"
        } else {
            ""
        };
        format!("pyidem.Store({:?}{closed})", redact(&self.url))
    }

    /// Not picklable: a store is connections (open it again in the other process).
    fn __reduce__(&self) -> PyResult<()> {
        Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "a pyidem.Store cannot be pickled (it is open connections): call pyidem.open_store({:?}) in the other process",
            redact(&self.url)
        )))
    }
}

/// A duration given as text (`"30s"`), seconds, or a `datetime.timedelta`.
pub(crate) fn duration_arg(what: &str, value: &Bound<'_, PyAny>) -> PyResult<Duration> {
    let bad = |detail: String| PyValueError::new_err(format!("{what}={detail}"));
    if let Ok(text) = value.extract::<String>() {
        return idem::model::duration::parse_duration_field(what, &text)
            .map_err(|e| bad(format!("{text:?}: {}", strip_field(what, &e.to_string()))));
    }
    let seconds: f64 = if value.hasattr("total_seconds")? {
        value.call_method0("total_seconds")?.extract()?
    } else if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "{what}: give a duration (\"30s\", seconds or a datetime.timedelta), not a bool"
        )));
    } else {
        value.extract().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "{what}: give a duration (\"30s\", seconds or a datetime.timedelta), not {}",
                value
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(bad(format!("{seconds}: a duration is 0 or more seconds")));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// A library message about `what` without its own `what: bad duration "x": ` head.
pub(crate) fn strip_field(what: &str, message: &str) -> String {
    let message = message
        .strip_prefix(&format!("{what}: "))
        .unwrap_or(message);
    match message.strip_prefix("bad duration ") {
        Some(rest) => rest
            .split_once(": ")
            .map(|(_, why)| why.to_string())
            .unwrap_or_else(|| rest.to_string()),
        None => message.to_string(),
    }
}

/// Opens the store at `url` (`sqlite:///path`, `postgres://…`, `bigquery://…`,
/// `memory://`, `redis://…`), releasing the GIL while it connects. Under
/// `store_failure="best_effort"` an unreachable store is not an error: runs go on
/// unguarded and say so (`store_errors`), as `idem run` does under that policy.
/// `breaker_failures` store failures in a row open the circuit breaker: the store is not
/// asked again for `breaker_reset` (runs under `best_effort` go on unguarded at once).
#[pyfunction]
#[pyo3(signature = (url, *, store_failure="strict", breaker_failures=2, breaker_reset=None))]
pub(crate) fn open_store(
    py: Python<'_>,
    url: String,
    store_failure: &str,
    breaker_failures: i64,
    breaker_reset: Option<&Bound<'_, PyAny>>,
) -> PyResult<Store> {
    let policy: idem::StoreFailurePolicy = store_failure.parse().map_err(|_| {
        PyValueError::new_err(format!(
            "store_failure={store_failure:?}: expected \"strict\" or \"best_effort\""
        ))
    })?;
    if !(1..=1_000_000).contains(&breaker_failures) {
        return Err(PyValueError::new_err(format!(
            "breaker_failures={breaker_failures}: give a count of 1 or more"
        )));
    }
    let reset = match breaker_reset {
        None => Duration::from_secs(30),
        Some(value) => duration_arg("breaker_reset", value)?,
    };
    let breaker = BreakerConfig {
        failure_threshold: breaker_failures as u32,
        reset_timeout: reset,
    };
    crate::log::refresh(py);
    let opened = Store::connect(py, &url, policy, breaker)?;
    Ok(Store {
        url,
        policy,
        breaker,
        state: Mutex::new(State {
            pid: std::process::id(),
            opened: Some(opened),
            generation: 0,
        }),
    })
}
