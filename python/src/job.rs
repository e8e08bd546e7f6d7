//! Processors: a Python function run through the Rust library's own [`idem::Runner`], so
//! a run recorded from Python is the same row and the same keys as one recorded by
//! `idem run`.
//!
//! Threads: the runner runs on the module's Tokio runtime while the calling Python thread
//! waits with the GIL released. When the runner needs Python (the body, or the content
//! description), it sends the call back to the waiting thread, which runs it with the GIL,
//! in the caller's own thread (so signals, thread-locals and tracebacks are as the caller
//! expects) while the lease heartbeat goes on in the runtime. While waiting, the thread
//! checks Python's signals every 50 ms: a `KeyboardInterrupt` (or the SIGTERM exception
//! the package installs) cancels the run as `idem run` does on SIGINT/SIGTERM.
//!
//! Exceptions: the body's exception is recorded (the last lines of its traceback are the
//! ledger's error, the lease is released), then raised again, the same object with its
//! traceback; with `raise_on_failure=False` an `Exception` is left in the report instead.
//! A `BaseException` that is not an `Exception` (`SystemExit`, `KeyboardInterrupt`,
//! `GeneratorExit`) is always raised again.

use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::job::Job;
use idem::store::{DynStore, RunFilter};
use idem::{
    async_trait, BoxError, Cancel, Content, Outcome, Processor, RunRequest, RunStatus, SkipReason,
    Trigger,
};
use pyo3::exceptions::{PyException, PyKeyboardInterrupt, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::Value;
use tracing::Instrument;

use crate::convert::{to_json, to_json_or_err, to_py};
use crate::outcome::{records_of, PyContent, PyOutcome};
use crate::store::Store;
use crate::{runtime, to_py_err, Terminated};

/// What a processor body is called with.
#[pyclass(module = "pyidem._idem", frozen)]
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
        to_py(py, &self.params)
    }

    fn __repr__(&self) -> String {
        format!(
            "pyidem.Run(processor={:?}, scope={:?}, run_id={:?}, trigger={:?})",
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
        pyo3::types::PyString::new(py, "")
            .call_method1("join", (lines,))?
            .extract()
    })()
    .unwrap_or_else(|_| err.to_string());
    let lines: Vec<&str> = formatted.trim_end().lines().collect();
    let tail = &lines[lines.len().saturating_sub(LINES)..];
    tail.join("\n")
}

/// A Python processor's configuration: the job the runner is built from.
#[pyclass(module = "pyidem._idem", frozen)]
pub struct NativeJob {
    job: Job,
    version: String,
    store: Py<Store>,
    /// The job's runner on the store's current generation (made again after a fork), and
    /// the output of the last earlier run a skip returned, by its run id (a finished run's
    /// row does not change, and skips in a row mostly point at the same run). Both made
    /// again after a fork: the cache's lock is taken with the GIL released, so a thread of
    /// the parent could hold it at the instant of the fork.
    runner: Mutex<Option<RunnerSlot>>,
}

/// [`NativeJob::runner`]'s: the store's generation, the runner, the ledger, the cache.
type RunnerSlot = (u64, idem::Runner, Arc<DynStore>, Remembered);

type Remembered = Arc<Mutex<Option<(String, Option<Value>)>>>;

/// What one waiting call ended with.
struct Waited {
    result: Result<Value, idem::Error>,
    /// The exception that interrupted the run (a signal), raised again once recorded.
    interrupt: Option<PyErr>,
    /// The exception the body (or describe function) raised, recorded as the run's error.
    failure: Option<PyErr>,
    /// Why the body's output was not kept (not JSON).
    output_problem: Option<String>,
}

/// A library message about a Python processor's options in Python's words: the option
/// as the keyword argument it was given as, not a job file's field.
fn python_words(name: &str, message: &str) -> String {
    let message = message
        .strip_prefix(&format!("job file <python processor {name}>: "))
        .unwrap_or(message);
    let message = message.strip_prefix("guards.").unwrap_or(message);
    format!("pyidem.processor({name:?}): {message}")
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
        store: Py<Store>,
        guards: &Bound<'_, PyDict>,
        settings: &Bound<'_, PyDict>,
        version: String,
    ) -> PyResult<Self> {
        let (generation, ledger) = store.get().ledger(py)?;
        let mut table = toml::Table::new();
        table.insert("name".into(), toml::Value::String(name.clone()));
        table.insert("processor".into(), toml::Value::String(name.clone()));
        for (k, v) in as_toml(settings)? {
            table.insert(k, v);
        }
        table.insert("guards".into(), toml::Value::Table(as_toml(guards)?));
        let text = toml::to_string(&table).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let job = Job::parse(&text, Path::new(&format!("<python processor {name}>")))
            .map_err(|e| PyValueError::new_err(python_words(&name, &e.to_string())))?;
        let runner = job
            .runner(ledger.clone())
            .map_err(|e| PyValueError::new_err(python_words(&name, &e.to_string())))?;
        Ok(NativeJob {
            job,
            version,
            store,
            runner: Mutex::new(Some((generation, runner, ledger, Remembered::default()))),
        })
    }

    /// The job name.
    #[getter]
    fn name(&self) -> String {
        self.job.name.clone()
    }

    /// Runs `body` (and `describe`, when given) behind the guards; returns the report as
    /// a dict. Raises the body's exception once the run is recorded (an `Exception` only
    /// when `raise_on_failure`), and the `KeyboardInterrupt`/`Terminated` that
    /// interrupted it.
    #[pyo3(signature = (body, describe, date=None, scope=None, trigger=None, params=None, run_id=None, raise_on_failure=true))]
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
        raise_on_failure: bool,
    ) -> PyResult<PyObject> {
        let request = self.request(date, scope, trigger, params, run_id)?;
        let (runner, ledger, remembered) = self.runner(py)?;
        crate::log::refresh(py);
        let cancel = Cancel::new();
        let runner = runner.cancel_on(cancel.clone());
        let (processor, tx, rx) = self.processor(describe.is_some());
        let span = tracing::info_span!(
            "run",
            job = %request.processor,
            scope = %request.scope,
            run_id = %request.run_id,
            trigger = %request.trigger,
        );
        runtime().spawn(
            async move {
                let result = match runner.run(&processor, request).await {
                    Ok(mut report) => {
                        remembered_output(&ledger, Some(&remembered), &mut report).await;
                        Ok(serde_json::to_value(&report).unwrap_or(Value::Null))
                    }
                    Err(e) => Err(e),
                };
                let _ = tx.send(Msg::Done(result));
            }
            .instrument(span),
        );
        let waited = wait(py, rx, &cancel, &body, describe.as_ref());
        finish(py, waited, raise_on_failure)
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
        let request = self.request(date, scope, None, params, None)?;
        let (runner, _, _) = self.runner(py)?;
        crate::log::refresh(py);
        let cancel = Cancel::new();
        let (processor, tx, rx) = self.processor(describe.is_some());
        runtime().spawn(async move {
            let result = runner
                .explain(&processor, &request)
                .await
                .map(|e| serde_json::to_value(&e).unwrap_or(Value::Null));
            let _ = tx.send(Msg::Done(result));
        });
        let none = py.None();
        let waited = wait(py, rx, &cancel, &none, describe.as_ref());
        finish(py, waited, true)
    }

    /// The benchmark's reference: `n` runs of a no-op Rust processor under this job's
    /// name, guards and store, through the library alone (one call, no Python per run).
    /// Seconds taken; the statuses counted in `counts`. With `remember`, each skip reads
    /// the earlier run's output as `run()` does.
    #[pyo3(signature = (n, date, remember=false))]
    fn _bench_rust(
        &self,
        py: Python<'_>,
        n: usize,
        date: String,
        remember: bool,
    ) -> PyResult<(f64, PyObject)> {
        let (runner, ledger, _) = self.runner(py)?;
        let date = idem::parse_date(&date).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let noop = Noop(self.job.name.clone());
        let name = self.job.name.clone();
        let (secs, counts) = py
            .allow_threads(|| {
                runtime().block_on(async {
                    let mut counts = std::collections::BTreeMap::<String, u64>::new();
                    let started = std::time::Instant::now();
                    for _ in 0..n {
                        let mut report = runner
                            .run(&noop, RunRequest::new(name.clone(), date))
                            .await?;
                        if remember {
                            remembered_output(&ledger, None, &mut report).await;
                        }
                        *counts.entry(report.status.to_string()).or_default() += 1;
                    }
                    Ok::<_, idem::Error>((started.elapsed().as_secs_f64(), counts))
                })
            })
            .map_err(to_py_err)?;
        let counts = serde_json::to_value(counts).unwrap_or(Value::Null);
        Ok((secs, to_py(py, &counts)?))
    }
}

/// On a skip by the time window or the content hash: the output of the run that made it
/// skip, read from the ledger, as the report's output (what the caller would have got
/// from running it). Left empty when it cannot be read (said in the log). With `cache`,
/// the output of the run the last skip pointed at is not read again.
async fn remembered_output(
    ledger: &Arc<DynStore>,
    cache: Option<&Remembered>,
    report: &mut idem::RunReport,
) {
    if report.status != RunStatus::Skipped
        || !matches!(
            report.skip_reason,
            Some(SkipReason::TimeWindow | SkipReason::DuplicateContentHash)
        )
    {
        return;
    }
    let Some(previous) = &report.previous_run else {
        return;
    };
    let lock = |c: &Remembered| c.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some((run_id, output)) = cache.and_then(lock) {
        if run_id == previous.run_id {
            report.output = output;
            return;
        }
    }
    let filter = RunFilter {
        processor: Some(report.job.clone()),
        run_id: Some(previous.run_id.clone()),
        limit: 1,
        ..RunFilter::default()
    };
    match ledger.runs(&filter).await {
        Ok(rows) => {
            report.output = rows.into_iter().next().and_then(|r| r.output);
            if let Some(c) = cache {
                *c.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((previous.run_id.clone(), report.output.clone()));
            }
        }
        Err(e) => tracing::warn!(
            previous_run = %previous.run_id,
            "could not read the output of the run that made this one skip: {e}"
        ),
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
    /// The processor the runner calls, and the channel its calls (and the result) come
    /// back to the waiting thread on.
    fn processor(&self, describes: bool) -> (PyProcessor, mpsc::Sender<Msg>, mpsc::Receiver<Msg>) {
        let (tx, rx) = mpsc::channel();
        let processor = PyProcessor {
            name: self.job.name.clone(),
            version: self.version.clone(),
            describes,
            tx: Mutex::new(tx.clone()),
        };
        (processor, tx, rx)
    }

    /// The runner on the store as this process may use it (built again after a fork).
    fn runner(&self, py: Python<'_>) -> PyResult<(idem::Runner, Arc<DynStore>, Remembered)> {
        let (generation, ledger) = self.store.get().ledger(py)?;
        let mut slot = self.runner.lock().unwrap_or_else(|e| e.into_inner());
        match &*slot {
            Some((g, runner, ledger, remembered)) if *g == generation => {
                Ok((runner.clone(), ledger.clone(), remembered.clone()))
            }
            _ => {
                let runner = self.job.runner(ledger.clone()).map_err(to_py_err)?;
                let remembered = Remembered::default();
                *slot = Some((
                    generation,
                    runner.clone(),
                    ledger.clone(),
                    remembered.clone(),
                ));
                Ok((runner, ledger, remembered))
            }
        }
    }

    fn request(
        &self,
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
                .map_err(|e| {
                    let message = e.to_string();
                    let message = message
                        .strip_prefix("--date: bad date ")
                        .map(|rest| format!("date={rest}"))
                        .unwrap_or(message);
                    PyValueError::new_err(message.replace(
                        "expected YYYY-MM-DD, today, yesterday or today-N",
                        "expected \"YYYY-MM-DD\", a datetime.date, \"today\", \"yesterday\" or \"today-N\"",
                    ))
                })?,
        };
        let mut request = RunRequest::new(self.job.name.clone(), date);
        if let Some(trigger) = trigger {
            let parsed: Trigger = trigger.parse().map_err(|_| {
                PyValueError::new_err(format!(
                    "trigger={trigger:?}: expected \"scheduler\", \"manual\", \"pubsub\", \"retry\" or \"backfill\""
                ))
            })?;
            request = request.with_trigger(parsed);
        }
        if let Some(params) = params {
            let value = to_json_or_err(params, "params")?;
            if !value.is_object() {
                return Err(PyTypeError::new_err(format!(
                    "params: give a dict, not {}",
                    params.get_type().name()?
                )));
            }
            request = request.with_params(value);
        }
        if let Some(scope) = scope {
            request = request.with_scope(scope);
        }
        if let Some(run_id) = run_id {
            request.run_id = run_id;
        }
        request.validate().map_err(|e| {
            let message = e.to_string();
            PyValueError::new_err(match message.as_str() {
                "scope is empty" => {
                    "scope: give a non-empty scope (or leave it out: the date)".to_string()
                }
                _ => message,
            })
        })?;
        Ok(request)
    }
}

fn as_toml(dict: &Bound<'_, PyDict>) -> PyResult<toml::Table> {
    let Value::Object(map) = to_json_or_err(dict.as_any(), "options")? else {
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
    let mut waited = Waited {
        result: Err(idem::Error::config("the runner stopped without a result")),
        interrupt: None,
        failure: None,
        output_problem: None,
    };
    // `allow_threads` wants what it borrows `Sync`.
    let rx = Mutex::new(rx);
    // The answer for a call made once the run was interrupted.
    let interrupted = |py: Python<'_>, e: &PyErr| {
        format!(
            "interrupted by {}",
            signal_of(py, e).unwrap_or("an exception")
        )
    };
    loop {
        let msg = py.allow_threads(|| {
            rx.lock()
                .unwrap_or_else(|e| e.into_inner())
                .recv_timeout(Duration::from_millis(50))
        });
        match msg {
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if waited.interrupt.is_none() {
                    if let Err(e) = py.check_signals() {
                        match signal_of(py, &e) {
                            Some(signal) => cancel.cancel(signal),
                            None => cancel.cancel("an exception in a signal handler"),
                        }
                        waited.interrupt = Some(e);
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return waited,
            Ok(Msg::Done(result)) => {
                waited.result = result;
                return waited;
            }
            Ok(Msg::Call(Call::Describe(request, reply))) => {
                let answer = match (&waited.interrupt, describe) {
                    (Some(e), _) => Err(interrupted(py, e)),
                    (None, None) => Ok(None),
                    (None, Some(describe)) => match call_describe(py, describe, &request) {
                        Ok(content) => Ok(content),
                        Err(e) => Err(waited.failed(py, cancel, e)),
                    },
                };
                let _ = reply.send(answer);
            }
            Ok(Msg::Call(Call::Process(request, reply))) => {
                let answer = match &waited.interrupt {
                    Some(e) => Err(interrupted(py, e)),
                    None => match call_body(py, body, &request) {
                        Ok((outcome, problem)) => {
                            waited.output_problem = problem;
                            Ok(outcome)
                        }
                        Err(e) => Err(waited.failed(py, cancel, e)),
                    },
                };
                let _ = reply.send(answer);
            }
        }
    }
}

impl Waited {
    /// Keeps the exception the body (or describe function) raised and says what the
    /// ledger records for it: `interrupted by SIGTERM` for a signal (as `idem run`
    /// records one, the lease released), else the traceback's last lines.
    fn failed(&mut self, py: Python<'_>, cancel: &Cancel, e: PyErr) -> String {
        match signal_of(py, &e) {
            Some(signal) => {
                cancel.cancel(signal);
                self.interrupt = Some(e);
                format!("interrupted by {signal}")
            }
            None => {
                let error = traceback_tail(py, &e);
                self.failure = Some(e);
                error
            }
        }
    }
}

fn finish(py: Python<'_>, waited: Waited, raise_on_failure: bool) -> PyResult<PyObject> {
    let Waited {
        result,
        interrupt,
        failure,
        output_problem,
    } = waited;
    let mut value = match result {
        Ok(value) => value,
        Err(e) => {
            if let Some(interrupt) = interrupt {
                return Err(interrupt);
            }
            let err = to_py_err(e);
            // Recording failed after the body failed: the store's error, caused by the
            // body's.
            if let Some(failure) = failure {
                err.set_cause(py, Some(failure));
            }
            return Err(err);
        }
    };
    if let Some(interrupt) = interrupt {
        return Err(interrupt);
    }
    if let Some(failure) = failure {
        if raise_on_failure || !failure.is_instance_of::<PyException>(py) {
            return Err(failure);
        }
    }
    if let (Some(problem), Value::Object(map)) = (output_problem, &mut value) {
        map.insert("output_warning".into(), Value::String(problem));
    }
    to_py(py, &value)
}

/// Runs the body: its outcome, and why its output was left out (not JSON), if it was.
fn call_body(
    py: Python<'_>,
    body: &PyObject,
    request: &RunRequest,
) -> PyResult<(Outcome, Option<String>)> {
    let run = Py::new(py, Run::of(request))?;
    let result = body.call1(py, (run,))?;
    outcome_of(result.bind(py))
}

fn outcome_of(result: &Bound<'_, PyAny>) -> PyResult<(Outcome, Option<String>)> {
    if result.is_none() {
        return Ok((Outcome::records(0), None));
    }
    if let Ok(outcome) = result.downcast::<PyOutcome>() {
        let outcome = outcome.get();
        // Output that is not JSON: the run completes without it (the work is done and
        // recorded), and the caller is warned, naming the value.
        let (output, problem) = match &outcome.output {
            None => (None, None),
            Some(o) => match to_json(o.bind(result.py())) {
                Ok(v) => (Some(v), None),
                Err(e) => (
                    None,
                    Some(format!(
                        "{}; the run is recorded with no output",
                        e.message("output")
                    )),
                ),
            },
        };
        return Ok((
            Outcome {
                records_processed: outcome.records,
                output,
            },
            problem,
        ));
    }
    if result.is_instance_of::<pyo3::types::PyInt>()
        && !result.is_instance_of::<pyo3::types::PyBool>()
    {
        return Ok((
            Outcome::records(records_of(result, "the body's return value")?),
            None,
        ));
    }
    if result.hasattr("__await__").unwrap_or(false) {
        return Err(PyTypeError::new_err(
            "the processor body returned an awaitable: async def bodies are not supported; use a def that calls asyncio.run(...)",
        ));
    }
    Err(PyTypeError::new_err(format!(
        "the processor body must return pyidem.Outcome, an int (records) or None, not {}",
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
        PyTypeError::new_err("a describe function must return pyidem.Content or None")
    })?;
    Ok(Some(content.get().to_content()))
}
