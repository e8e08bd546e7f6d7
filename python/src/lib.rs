//! `idem._idem`: the native half of the Python package (`python/idem/` is the other).
//!
//! A Python processor runs through the Rust library's own [`idem::Runner`]: the guards,
//! the lease, the ledger and the keys are the library's, so a run recorded from Python is
//! the same row and the same keys as one recorded by `idem run`.
//!
//! Threads: the runner runs on a Tokio runtime of this module while the calling Python
//! thread waits with the GIL released. When the runner needs Python (the body, or the
//! content description), it sends the call back to the waiting thread, which runs it with
//! the GIL, in the caller's own thread (so signals, thread-locals and tracebacks are as
//! the caller expects) while the lease heartbeat goes on in the runtime. While waiting,
//! the thread checks Python's signals every 50 ms: a `KeyboardInterrupt` (or the SIGTERM
//! exception the package installs) cancels the run as `idem run` does on SIGINT/SIGTERM.

use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::job::Job;
use idem::store::DynStore;
use idem::{async_trait, BoxError, Cancel, Content, Outcome, Processor, RunRequest, Trigger};
use pyo3::create_exception;
use pyo3::exceptions::{PyBaseException, PyException, PyKeyboardInterrupt, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value;

mod events;

create_exception!(
    _idem,
    IdemError,
    PyException,
    "An idem error (configuration, store)."
);
create_exception!(
    _idem,
    StoreError,
    IdemError,
    "The store could not be used (under the `strict` policy)."
);
create_exception!(
    _idem,
    Terminated,
    PyBaseException,
    "Raised in the main thread on SIGTERM while a run is in progress (idem installs the handler for the run's duration)."
);

/// The module's Tokio runtime, made again in a forked child (a runtime does not survive
/// `fork`; stores opened before the fork belong to the parent and must be opened again).
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: Mutex<Option<(u32, &'static tokio::runtime::Runtime)>> = Mutex::new(None);
    let mut slot = RT.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    match *slot {
        Some((p, rt)) if p == pid => rt,
        _ => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("idem-py")
                .enable_all()
                .build()
                .expect("a Tokio runtime");
            let rt: &'static tokio::runtime::Runtime = Box::leak(Box::new(rt));
            *slot = Some((pid, rt));
            rt
        }
    }
}

pub(crate) fn to_py_err(e: idem::Error) -> PyErr {
    if e.is_store_failure() {
        StoreError::new_err(e.to_string())
    } else {
        IdemError::new_err(e.to_string())
    }
}

/// JSON text → Python object (through the standard `json` module).
pub(crate) fn json_to_py(py: Python<'_>, value: &Value) -> PyResult<PyObject> {
    let text = serde_json::to_string(value).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

/// Python object → JSON (through `json.dumps`, `default=str` for dates and the like).
pub(crate) fn py_to_json(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("default", py.get_type::<pyo3::types::PyString>())?;
    let text: String = py
        .import("json")?
        .call_method("dumps", (obj,), Some(&kwargs))?
        .extract()?;
    serde_json::from_str(&text).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// An open store: SQLite, Postgres, BigQuery, memory (ledger and leases); Redis for event
/// keys only (`Gate`).
#[pyclass(module = "idem._idem", frozen)]
pub struct Store {
    pub(crate) url: String,
    pub(crate) ledger: Option<Arc<DynStore>>,
}

#[pymethods]
impl Store {
    /// The URL it was opened with.
    #[getter]
    fn url(&self) -> String {
        self.url.clone()
    }

    fn __repr__(&self) -> String {
        format!("idem.Store({:?})", redact(&self.url))
    }
}

fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

/// Opens the store at `url` (`sqlite:///path`, `postgres://…`, `bigquery://…`,
/// `memory://`, `redis://…`), releasing the GIL while it connects. Under
/// `store_failure="best_effort"` an unreachable store is not an error: runs go on
/// unguarded and say so (`store_errors`), as `idem run` does under that policy.
#[pyfunction]
#[pyo3(signature = (url, store_failure="strict"))]
fn open_store(py: Python<'_>, url: String, store_failure: &str) -> PyResult<Store> {
    let policy: idem::StoreFailurePolicy = store_failure
        .parse()
        .map_err(|e: idem::Error| PyValueError::new_err(e.to_string()))?;
    let is_redis = url.starts_with("redis://") || url.starts_with("rediss://");
    let ledger = if is_redis {
        // Checked now, so a bad URL fails here rather than at the first batch.
        py.allow_threads(|| runtime().block_on(idem::store::open_event_keys(&url)))
            .map_err(to_py_err)?;
        None
    } else {
        let inner: Arc<DynStore> = match py
            .allow_threads(|| runtime().block_on(idem::store::open(&url)))
        {
            Ok(store) => store,
            Err(e) if e.is_store_failure() && policy == idem::StoreFailurePolicy::BestEffort => {
                Arc::new(idem::store::UnavailableStore::new(&url, e.to_string()))
            }
            Err(e) => return Err(to_py_err(e)),
        };
        // As `idem run`: a store that failed twice is not tried again for 30 s.
        Some(Arc::new(idem::store::CircuitBreakerStore::new(
            inner,
            idem::store::BreakerConfig {
                failure_threshold: 2,
                reset_timeout: Duration::from_secs(30),
            },
        )) as Arc<DynStore>)
    };
    Ok(Store { url, ledger })
}

/// What a processor body is called with.
#[pyclass(module = "idem._idem", frozen)]
pub struct Run {
    #[pyo3(get)]
    processor: String,
    #[pyo3(get)]
    scope: String,
    #[pyo3(get)]
    run_id: String,
    #[pyo3(get)]
    trigger: String,
    date_text: String,
    params: Value,
}

#[pymethods]
impl Run {
    /// The partition date (`datetime.date`).
    #[getter]
    fn date<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("datetime")?
            .getattr("date")?
            .call_method1("fromisoformat", (self.date_text.clone(),))
    }

    /// The run's parameters (a dict).
    #[getter]
    fn params(&self, py: Python<'_>) -> PyResult<PyObject> {
        json_to_py(py, &self.params)
    }

    fn __repr__(&self) -> String {
        format!(
            "idem.Run(processor={:?}, scope={:?}, run_id={:?}, trigger={:?})",
            self.processor, self.scope, self.run_id, self.trigger
        )
    }
}

impl Run {
    fn of(request: &RunRequest) -> Run {
        Run {
            processor: request.processor.clone(),
            scope: request.scope.clone(),
            run_id: request.run_id.clone(),
            trigger: request.trigger.as_str().to_string(),
            date_text: request.scope_date.format("%Y-%m-%d").to_string(),
            params: request.params.clone(),
        }
    }
}

/// A call the runner makes into Python, answered by the waiting thread.
enum Call {
    Describe(
        RunRequest,
        tokio::sync::oneshot::Sender<Result<Option<Content>, String>>,
    ),
    Process(
        RunRequest,
        tokio::sync::oneshot::Sender<Result<Outcome, String>>,
    ),
}

enum Msg {
    Call(Call),
    Done(Result<Value, idem::Error>),
}

/// The Python processor as the runner sees it: each call goes to the waiting thread.
struct PyProcessor {
    name: String,
    version: String,
    describes: bool,
    tx: Mutex<mpsc::Sender<Msg>>,
}

impl PyProcessor {
    fn send(&self, call: Call) -> Result<(), BoxError> {
        self.tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Msg::Call(call))
            .map_err(|_| "the Python caller is gone".into())
    }
}

#[async_trait]
impl Processor for PyProcessor {
    fn name(&self) -> &str {
        &self.name
    }

    fn version(&self) -> String {
        self.version.clone()
    }

    async fn describe(&self, request: &RunRequest) -> Result<Option<Content>, BoxError> {
        if !self.describes {
            return Ok(None);
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.send(Call::Describe(request.clone(), reply))?;
        match answer.await {
            Ok(result) => result.map_err(Into::into),
            Err(_) => Err("the Python caller dropped the call".into()),
        }
    }

    async fn process(&self, request: &RunRequest) -> Result<Outcome, BoxError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.send(Call::Process(request.clone(), reply))?;
        match answer.await {
            Ok(result) => result.map_err(Into::into),
            Err(_) => Err("the Python caller dropped the call".into()),
        }
    }
}

/// The signal a Python exception stands for: `KeyboardInterrupt` is SIGINT, the package's
/// `Terminated` SIGTERM.
fn signal_of(py: Python<'_>, err: &PyErr) -> Option<&'static str> {
    if err.is_instance_of::<PyKeyboardInterrupt>(py) {
        Some("SIGINT")
    } else if err.is_instance_of::<Terminated>(py) {
        Some("SIGTERM")
    } else {
        None
    }
}

/// The error recorded for an exception: the last lines of its traceback.
fn traceback_tail(py: Python<'_>, err: &PyErr) -> String {
    const LINES: usize = 8;
    let formatted = (|| -> PyResult<String> {
        let lines = py.import("traceback")?.call_method1(
            "format_exception",
            (
                err.get_type(py),
                err.value(py),
                err.traceback(py).map(|t| t.into_any()),
            ),
        )?;
        let text: String = PyString_join(py, &lines)?;
        Ok(text)
    })()
    .unwrap_or_else(|_| err.to_string());
    let lines: Vec<&str> = formatted.trim_end().lines().collect();
    let tail = &lines[lines.len().saturating_sub(LINES)..];
    tail.join("\n")
}

#[allow(non_snake_case)]
fn PyString_join(py: Python<'_>, lines: &Bound<'_, PyAny>) -> PyResult<String> {
    pyo3::types::PyString::new(py, "")
        .call_method1("join", (lines,))?
        .extract()
}

/// A Python processor's configuration: the job the runner is built from.
#[pyclass(module = "idem._idem", frozen)]
pub struct NativeJob {
    job: Job,
    version: String,
    /// The job's runner, made once (each run clones it with its own cancellation).
    runner: idem::Runner,
}

/// What one waiting call ended with.
struct Waited {
    result: Result<Value, idem::Error>,
    /// The exception that interrupted the run (re-raised once it is recorded).
    interrupt: Option<PyErr>,
}

#[pymethods]
impl NativeJob {
    /// `guards` is the `[guards]` table of a job file, `settings` the job's top-level
    /// `mode`, `store_failure`, `strict_recording`, `date`, `timezone`.
    #[new]
    #[pyo3(signature = (name, store, guards, settings, version=String::new()))]
    fn new(
        py: Python<'_>,
        name: String,
        store: &Store,
        guards: &Bound<'_, PyDict>,
        settings: &Bound<'_, PyDict>,
        version: String,
    ) -> PyResult<Self> {
        let ledger = store.ledger.clone().ok_or_else(|| {
            IdemError::new_err(format!(
                "{} holds event keys only (idem.Gate); a processor needs a ledger store: sqlite, postgres, bigquery or memory",
                redact(&store.url)
            ))
        })?;
        let mut table = toml::Table::new();
        table.insert("name".into(), toml::Value::String(name.clone()));
        table.insert("processor".into(), toml::Value::String(name.clone()));
        for (k, v) in as_toml(py, settings)? {
            table.insert(k, v);
        }
        table.insert("guards".into(), toml::Value::Table(as_toml(py, guards)?));
        let text = toml::to_string(&table).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let job = Job::parse(&text, Path::new(&format!("<python processor {name}>")))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let runner = job.runner(ledger.clone()).map_err(to_py_err)?;
        Ok(NativeJob {
            job,
            version,
            runner,
        })
    }

    /// The job name.
    #[getter]
    fn name(&self) -> String {
        self.job.name.clone()
    }

    /// Runs `body` (and `describe`, when given) behind the guards; returns the report as
    /// a dict. Re-raises the `KeyboardInterrupt`/`Terminated` that interrupted it, after
    /// recording the run.
    #[pyo3(signature = (body, describe, date=None, scope=None, trigger=None, params=None, run_id=None))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        body: PyObject,
        describe: Option<PyObject>,
        date: Option<String>,
        scope: Option<String>,
        trigger: Option<String>,
        params: Option<&Bound<'_, PyAny>>,
        run_id: Option<String>,
    ) -> PyResult<PyObject> {
        let request = self.request(py, date, scope, trigger, params, run_id)?;
        let cancel = Cancel::new();
        let runner = self.runner.clone().cancel_on(cancel.clone());
        let (tx, rx) = mpsc::channel();
        let processor = PyProcessor {
            name: self.job.name.clone(),
            version: self.version.clone(),
            describes: describe.is_some(),
            tx: Mutex::new(tx.clone()),
        };
        runtime().spawn(async move {
            let result = runner
                .run(&processor, request)
                .await
                .map(|report| serde_json::to_value(&report).unwrap_or(Value::Null));
            let _ = tx.send(Msg::Done(result));
        });
        let waited = wait(py, rx, &cancel, &body, describe.as_ref());
        finish(py, waited)
    }

    /// What a run would do now (no body run, nothing claimed or recorded), as a dict.
    #[pyo3(signature = (describe, date=None, scope=None, params=None))]
    fn explain(
        &self,
        py: Python<'_>,
        describe: Option<PyObject>,
        date: Option<String>,
        scope: Option<String>,
        params: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyObject> {
        let request = self.request(py, date, scope, None, params, None)?;
        let cancel = Cancel::new();
        let runner = self.runner.clone();
        let (tx, rx) = mpsc::channel();
        let processor = PyProcessor {
            name: self.job.name.clone(),
            version: self.version.clone(),
            describes: describe.is_some(),
            tx: Mutex::new(tx.clone()),
        };
        runtime().spawn(async move {
            let result = runner
                .explain(&processor, &request)
                .await
                .map(|e| serde_json::to_value(&e).unwrap_or(Value::Null));
            let _ = tx.send(Msg::Done(result));
        });
        let none = py.None();
        let waited = wait(py, rx, &cancel, &none, describe.as_ref());
        finish(py, waited)
    }
    /// The benchmark's reference: `n` runs of a no-op Rust processor under this job's
    /// name, guards and store, through the library alone (one call, no Python per run).
    /// Seconds taken; the statuses counted in `counts`.
    #[pyo3(signature = (n, date))]
    fn _bench_rust(&self, py: Python<'_>, n: usize, date: String) -> PyResult<(f64, PyObject)> {
        let runner = self.runner.clone();
        let date = idem::parse_date(&date).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let noop = Noop(self.job.name.clone());
        let name = self.job.name.clone();
        let (secs, counts) = py
            .allow_threads(|| {
                runtime().block_on(async {
                    let mut counts = std::collections::BTreeMap::<String, u64>::new();
                    let started = std::time::Instant::now();
                    for _ in 0..n {
                        let report = runner
                            .run(&noop, RunRequest::new(name.clone(), date))
                            .await?;
                        *counts.entry(report.status.to_string()).or_default() += 1;
                    }
                    Ok::<_, idem::Error>((started.elapsed().as_secs_f64(), counts))
                })
            })
            .map_err(to_py_err)?;
        let counts = serde_json::to_value(counts).unwrap_or(Value::Null);
        Ok((secs, json_to_py(py, &counts)?))
    }
}

/// A processor that does nothing, for `NativeJob._bench_rust`.
struct Noop(String);

#[async_trait]
impl Processor for Noop {
    fn name(&self) -> &str {
        &self.0
    }
    async fn process(&self, _: &RunRequest) -> Result<Outcome, BoxError> {
        Ok(Outcome::records(0))
    }
}

impl NativeJob {
    fn request(
        &self,
        py: Python<'_>,
        date: Option<String>,
        scope: Option<String>,
        trigger: Option<String>,
        params: Option<&Bound<'_, PyAny>>,
        run_id: Option<String>,
    ) -> PyResult<RunRequest> {
        // An ISO date as it is; an expression (`yesterday`, `today-2`) in the job's zone.
        let date = match date.as_deref().map(idem::parse_date) {
            Some(Ok(date)) => date,
            _ => self
                .job
                .run_date(date.as_deref(), None, chrono::Utc::now())
                .map_err(|e| PyValueError::new_err(e.to_string()))?,
        };
        let mut request = RunRequest::new(self.job.name.clone(), date);
        if let Some(trigger) = trigger {
            let trigger: Trigger = trigger
                .parse()
                .map_err(|e: idem::Error| PyValueError::new_err(e.to_string()))?;
            request = request.with_trigger(trigger);
        }
        if let Some(params) = params {
            let value = py_to_json(py, params)?;
            if !value.is_object() {
                return Err(PyValueError::new_err("params must be a dict"));
            }
            request = request.with_params(value);
        }
        if let Some(scope) = scope {
            request = request.with_scope(scope);
        }
        if let Some(run_id) = run_id {
            request.run_id = run_id;
        }
        request
            .validate()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(request)
    }
}

fn as_toml(py: Python<'_>, dict: &Bound<'_, PyDict>) -> PyResult<toml::Table> {
    let value = py_to_json(py, dict.as_any())?;
    let Value::Object(map) = value else {
        return Err(PyValueError::new_err("expected a dict"));
    };
    let mut table = toml::Table::new();
    for (k, v) in map {
        let v = match v {
            Value::Null => continue,
            Value::Bool(b) => toml::Value::Boolean(b),
            Value::String(s) => toml::Value::String(s),
            Value::Number(n) if n.is_i64() => toml::Value::Integer(n.as_i64().unwrap_or(0)),
            Value::Number(n) => toml::Value::Float(n.as_f64().unwrap_or(0.0)),
            Value::Array(items) => toml::Value::Array(
                items
                    .into_iter()
                    .map(|i| match i {
                        Value::String(s) => toml::Value::String(s),
                        other => toml::Value::String(other.to_string()),
                    })
                    .collect(),
            ),
            Value::Object(_) => {
                return Err(PyValueError::new_err(format!("{k}: a nested table")));
            }
        };
        table.insert(k, v);
    }
    Ok(table)
}

/// Waits for the runner with the GIL released, answering its calls into Python with the
/// GIL held, and checking Python's signals between waits.
fn wait(
    py: Python<'_>,
    rx: mpsc::Receiver<Msg>,
    cancel: &Cancel,
    body: &PyObject,
    describe: Option<&PyObject>,
) -> Waited {
    let mut interrupt: Option<PyErr> = None;
    // `allow_threads` wants what it borrows `Sync`.
    let rx = Mutex::new(rx);
    loop {
        let msg = py.allow_threads(|| {
            rx.lock()
                .unwrap_or_else(|e| e.into_inner())
                .recv_timeout(Duration::from_millis(50))
        });
        match msg {
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if interrupt.is_none() {
                    if let Err(e) = py.check_signals() {
                        match signal_of(py, &e) {
                            Some(signal) => cancel.cancel(signal),
                            None => cancel.cancel("an exception in a signal handler"),
                        }
                        interrupt = Some(e);
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Waited {
                    result: Err(idem::Error::config("the runner stopped without a result")),
                    interrupt,
                };
            }
            Ok(Msg::Done(result)) => return Waited { result, interrupt },
            Ok(Msg::Call(Call::Describe(request, reply))) => {
                let answer = match (&interrupt, describe) {
                    (Some(e), _) => Err(format!(
                        "interrupted by {}",
                        signal_of(py, e).unwrap_or("an exception")
                    )),
                    (None, None) => Ok(None),
                    (None, Some(describe)) => match call_describe(py, describe, &request) {
                        Ok(content) => Ok(content),
                        Err(e) => {
                            if let Some(signal) = signal_of(py, &e) {
                                cancel.cancel(signal);
                                interrupt = Some(e);
                                Err(format!("interrupted by {signal}"))
                            } else {
                                Err(traceback_tail(py, &e))
                            }
                        }
                    },
                };
                let _ = reply.send(answer);
            }
            Ok(Msg::Call(Call::Process(request, reply))) => {
                let answer = match &interrupt {
                    Some(e) => Err(format!(
                        "interrupted by {}",
                        signal_of(py, e).unwrap_or("an exception")
                    )),
                    None => match call_body(py, body, &request) {
                        Ok(outcome) => Ok(outcome),
                        Err(e) => {
                            if let Some(signal) = signal_of(py, &e) {
                                // Recorded as `idem run` records a signal: failed,
                                // `interrupted by SIGTERM`, the lease released.
                                interrupt = Some(e);
                                Err(format!("interrupted by {signal}"))
                            } else {
                                Err(traceback_tail(py, &e))
                            }
                        }
                    },
                };
                let _ = reply.send(answer);
            }
        }
    }
}

fn finish(py: Python<'_>, waited: Waited) -> PyResult<PyObject> {
    let value = match waited.result {
        Ok(value) => value,
        Err(e) => {
            if let Some(interrupt) = waited.interrupt {
                return Err(interrupt);
            }
            return Err(to_py_err(e));
        }
    };
    if let Some(interrupt) = waited.interrupt {
        return Err(interrupt);
    }
    json_to_py(py, &value)
}

fn call_body(py: Python<'_>, body: &PyObject, request: &RunRequest) -> PyResult<Outcome> {
    let run = Py::new(py, Run::of(request))?;
    let result = body.call1(py, (run,))?;
    outcome_of(py, result.bind(py))
}

fn outcome_of(py: Python<'_>, result: &Bound<'_, PyAny>) -> PyResult<Outcome> {
    if result.is_none() {
        return Ok(Outcome::records(0));
    }
    if let Ok(outcome) = result.downcast::<PyOutcome>() {
        let outcome = outcome.get();
        let output = match &outcome.output {
            Some(o) => Some(py_to_json(py, o.bind(py))?),
            None => None,
        };
        return Ok(Outcome {
            records_processed: outcome.records,
            output,
        });
    }
    if let Ok(n) = result.extract::<i64>() {
        if !result.is_instance_of::<pyo3::types::PyBool>() {
            return Ok(Outcome::records(n));
        }
    }
    if result.hasattr("__await__").unwrap_or(false) {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "the processor body returned an awaitable: async def bodies are not supported; use a def that calls asyncio.run(...)",
        ));
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "the processor body must return idem.Outcome, an int (records) or None, not {}",
        result.get_type().name()?
    )))
}

fn call_describe(
    py: Python<'_>,
    describe: &PyObject,
    request: &RunRequest,
) -> PyResult<Option<Content>> {
    let run = Py::new(py, Run::of(request))?;
    let result = describe.call1(py, (run,))?;
    let result = result.bind(py);
    if result.is_none() {
        return Ok(None);
    }
    let content = result.downcast::<PyContent>().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(
            "a describe function must return idem.Content or None",
        )
    })?;
    Ok(Some(content.get().to_content(py)?))
}

/// What a body returns: records processed and an optional JSON output for the ledger.
#[pyclass(name = "Outcome", module = "idem._idem", frozen)]
pub struct PyOutcome {
    #[pyo3(get)]
    records: i64,
    #[pyo3(get)]
    output: Option<PyObject>,
}

#[pymethods]
impl PyOutcome {
    #[new]
    #[pyo3(signature = (records=0, output=None))]
    fn new(records: i64, output: Option<PyObject>) -> Self {
        PyOutcome { records, output }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let output = match &self.output {
            Some(o) => o.bind(py).repr().map(|r| r.to_string()).unwrap_or_default(),
            None => "None".into(),
        };
        format!("idem.Outcome(records={}, output={output})", self.records)
    }
}

/// The content a run would consume, for the content hash guard: entity ids (any order),
/// rows (any order), a source checksum, other fields.
#[pyclass(name = "Content", module = "idem._idem", frozen)]
pub struct PyContent {
    entities: Option<Vec<String>>,
    rows: Option<Value>,
    checksum: Option<String>,
    fields: Value,
}

#[pymethods]
impl PyContent {
    #[new]
    #[pyo3(signature = (entities=None, rows=None, checksum=None, **fields))]
    fn new(
        py: Python<'_>,
        entities: Option<&Bound<'_, PyAny>>,
        rows: Option<&Bound<'_, PyAny>>,
        checksum: Option<String>,
        fields: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let entities = match entities {
            None => None,
            Some(e) => {
                let mut ids = Vec::new();
                for item in e.try_iter()? {
                    let item = item?;
                    ids.push(match item.extract::<String>() {
                        Ok(s) => s,
                        Err(_) => item.str()?.to_string(),
                    });
                }
                Some(ids)
            }
        };
        let rows = match rows {
            None => None,
            Some(r) => {
                let list = PyList::new(py, r.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
                Some(py_to_json(py, list.as_any())?)
            }
        };
        let fields = match fields {
            None => Value::Object(Default::default()),
            Some(f) => py_to_json(py, f.as_any())?,
        };
        Ok(PyContent {
            entities,
            rows,
            checksum,
            fields,
        })
    }

    /// The content key a processor of that name computes for this content on `scope`
    /// (`sha256` or `md5`), byte-identical to the Rust library's.
    #[pyo3(signature = (processor, scope, hash="sha256", version=""))]
    fn key(
        &self,
        py: Python<'_>,
        processor: &str,
        scope: &str,
        hash: &str,
        version: &str,
    ) -> PyResult<String> {
        let algorithm: idem::HashAlgorithm = hash
            .parse()
            .map_err(|e: idem::Error| PyValueError::new_err(e.to_string()))?;
        Ok(self
            .to_content(py)?
            .key_with_version(processor, scope, version, algorithm))
    }
}

impl PyContent {
    fn to_content(&self, _py: Python<'_>) -> PyResult<Content> {
        let mut content = Content::new();
        if let Some(ids) = &self.entities {
            content = content.entities(ids.iter().cloned());
        }
        if let Some(Value::Array(rows)) = &self.rows {
            content = content.rows(rows.clone());
        }
        if let Some(c) = &self.checksum {
            content = content.checksum(c.clone());
        }
        if let Value::Object(map) = &self.fields {
            for (k, v) in map {
                content = content.field(k.clone(), v.clone());
            }
        }
        Ok(content)
    }
}

/// `idem.scope_key(processor, scope)`: the scope key the ledger writes on success.
#[pyfunction]
fn scope_key(processor: &str, scope: &str) -> String {
    idem::scope_key(processor, scope)
}

#[pymodule]
fn _idem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("IdemError", py.get_type::<IdemError>())?;
    m.add("StoreError", py.get_type::<StoreError>())?;
    m.add("Terminated", py.get_type::<Terminated>())?;
    m.add_class::<Store>()?;
    m.add_class::<Run>()?;
    m.add_class::<NativeJob>()?;
    m.add_class::<PyOutcome>()?;
    m.add_class::<PyContent>()?;
    m.add_function(wrap_pyfunction!(open_store, m)?)?;
    m.add_function(wrap_pyfunction!(scope_key, m)?)?;
    events::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
