//! idem's log events to Python's `logging`, on the logger `pyidem`, each with its fields
//! and the fields of the run it belongs to (`job`, `scope`, `run_id`, `trigger`) as the
//! record's attributes (`extra`).
//!
//! Why a layer of our own on `tracing-subscriber` rather than `pyo3-log`: the library
//! logs with `tracing`, whose bridge to the `log` crate (what `pyo3-log` forwards) writes
//! the fields into the message text, and `pyo3-log`'s `kv` feature (fields as `extra`)
//! needs pyo3 0.26. A `tracing_subscriber::Layer` sees the fields and the spans they sit
//! in; handing a record to `logging` is two calls (`makeRecord`, `handle`).
//!
//! Cost: the level `logging` would let through is read from Python at each call into the
//! package (`refresh`), so an event below it costs an atomic load, without the GIL.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::PyDict;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

/// The Python logger's name: the package's import name.
pub(crate) const LOGGER: &str = "pyidem";

/// The lowest `logging` level the logger handles now (`refresh`); 0 lets all through.
static THRESHOLD: AtomicU8 = AtomicU8::new(u8::MAX);

/// Set while the process forks: no event goes to Python (the forking thread holds the
/// GIL and waits for SQLite's threads, which must not wait for the GIL).
static SUSPENDED: AtomicBool = AtomicBool::new(false);

/// Stops (or starts again) handing events to Python.
pub(crate) fn suspend(on: bool) {
    SUSPENDED.store(on, Ordering::SeqCst);
}

fn python_level(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        Level::TRACE => 5,
    }
}

fn logger(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static LOGGER_OBJECT: GILOnceCell<PyObject> = GILOnceCell::new();
    LOGGER_OBJECT
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(
                py.import("logging")?
                    .call_method1("getLogger", (LOGGER,))?
                    .unbind(),
            )
        })
        .map(|l| l.bind(py))
}

/// Reads the level the `pyidem` logger handles now (its effective level, or above
/// `logging.disable`'s), so events below it are dropped without the GIL.
pub(crate) fn refresh(py: Python<'_>) {
    let level = (|| -> PyResult<u8> {
        let logger = logger(py)?;
        let effective: i64 = logger.call_method0("getEffectiveLevel")?.extract()?;
        let disabled: i64 = logger
            .getattr("manager")?
            .getattr("disable")?
            .extract()
            .unwrap_or(0);
        Ok(effective.max(disabled + 1).clamp(0, 255) as u8)
    })()
    .unwrap_or(u8::MAX);
    THRESHOLD.store(level, Ordering::Relaxed);
}

/// Installs the layer as the process's `tracing` subscriber (once; a subscriber set
/// already is left alone).
pub(crate) fn install(py: Python<'_>) {
    refresh(py);
    let _ =
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(PythonLogging));
}

/// A field's value as Python will get it.
enum FieldValue {
    Str(String),
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
}

#[derive(Default)]
struct Fields {
    message: Option<String>,
    fields: Vec<(&'static str, FieldValue)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, FieldValue::Str(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, FieldValue::Int(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, FieldValue::UInt(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, FieldValue::Float(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, FieldValue::Bool(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, FieldValue::Str(format!("{value:?}")));
    }
}

impl Fields {
    fn put(&mut self, field: &Field, value: FieldValue) {
        if field.name() == "message" {
            self.message = Some(match value {
                FieldValue::Str(s) => s,
                _ => String::new(),
            });
            return;
        }
        match self.fields.iter_mut().find(|(k, _)| *k == field.name()) {
            Some((_, v)) => *v = value,
            None => self.fields.push((field.name(), value)),
        }
    }
}

/// The `LogRecord` attributes `extra` may not replace: a field of that name is passed as
/// `idem_<name>`.
const RESERVED: &[&str] = &[
    "args",
    "asctime",
    "created",
    "exc_info",
    "exc_text",
    "filename",
    "funcName",
    "levelname",
    "levelno",
    "lineno",
    "message",
    "module",
    "msecs",
    "msg",
    "name",
    "pathname",
    "process",
    "processName",
    "relativeCreated",
    "stack_info",
    "taskName",
    "thread",
    "threadName",
];

struct PythonLogging;

impl<S> Layer<S> for PythonLogging
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        // Asked at each event (`enabled`): the Python level may change at any time.
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        // Spans always (their fields go with the events inside them, whatever their
        // level); events only at a level the Python logger handles.
        metadata.is_span() || python_level(metadata.level()) >= THRESHOLD.load(Ordering::Relaxed)
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
                values.record(fields);
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let metadata = event.metadata();
        let level = python_level(metadata.level());
        if level < THRESHOLD.load(Ordering::Relaxed) || SUSPENDED.load(Ordering::SeqCst) {
            return;
        }
        let mut own = Fields::default();
        event.record(&mut own);
        // The spans' fields first (outermost first), the event's own over them.
        let mut all: Vec<(&'static str, FieldValue)> = Vec::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(fields) = span.extensions().get::<Fields>() {
                    for (k, v) in &fields.fields {
                        all.retain(|(name, _)| name != k);
                        all.push((k, clone_value(v)));
                    }
                }
            }
        }
        for (k, v) in own.fields {
            all.retain(|(name, _)| *name != k);
            all.push((k, v));
        }
        let message = own.message.unwrap_or_default();
        // SAFETY: a plain query of the interpreter's state, allowed without the GIL.
        if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
            return;
        }
        Python::with_gil(|py| {
            let _ = emit(py, level, metadata, &message, &all);
        });
    }
}

fn clone_value(v: &FieldValue) -> FieldValue {
    match v {
        FieldValue::Str(s) => FieldValue::Str(s.clone()),
        FieldValue::Int(i) => FieldValue::Int(*i),
        FieldValue::UInt(u) => FieldValue::UInt(*u),
        FieldValue::Float(f) => FieldValue::Float(*f),
        FieldValue::Bool(b) => FieldValue::Bool(*b),
    }
}

fn emit(
    py: Python<'_>,
    level: u8,
    metadata: &Metadata<'_>,
    message: &str,
    fields: &[(&'static str, FieldValue)],
) -> PyResult<()> {
    let logger = logger(py)?;
    if !logger.call_method1("isEnabledFor", (level,))?.is_truthy()? {
        return Ok(());
    }
    let extra = PyDict::new(py);
    for (k, v) in fields {
        let key = if RESERVED.contains(k) {
            format!("idem_{k}")
        } else {
            (*k).to_string()
        };
        match v {
            FieldValue::Str(s) => extra.set_item(key, s)?,
            FieldValue::Int(i) => extra.set_item(key, i)?,
            FieldValue::UInt(u) => extra.set_item(key, u)?,
            FieldValue::Float(f) => extra.set_item(key, f)?,
            FieldValue::Bool(b) => extra.set_item(key, b)?,
        }
    }
    extra.set_item("idem_target", metadata.target())?;
    let record = logger.call_method1(
        "makeRecord",
        (
            LOGGER,
            level,
            metadata.file().unwrap_or("(idem)"),
            metadata.line().unwrap_or(0),
            message,
            pyo3::types::PyTuple::empty(py),
            py.None(),
            py.None(),
            extra,
        ),
    )?;
    logger.call_method1("handle", (record,))?;
    Ok(())
}
