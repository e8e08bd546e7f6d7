//! The event API: `fingerprint(events)` and `Gate.check_and_mark(events)`, the same
//! deduplicator and strategies as `idem gate`; `Gate.release` and `Gate.batch` for a
//! batch whose handling failed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use idem::events::dedup::{Deduplicator, Ttl};
use idem::events::strategy::{Admission, EventGate, Strategy};
use idem::events::{ContentHashExtractor, InvalidEvent};
use idem::store::{BreakerConfig, EventVerdict};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use serde_json::Value;

use crate::convert::{to_json_or_err, to_py};
use crate::store::{duration_arg, Store};
use crate::{runtime, to_py_err, IdemError};

/// The events as JSON values: each a JSON text (`str`/`bytes`) or a dict.
fn events_of(py: Python<'_>, events: &Bound<'_, PyAny>) -> PyResult<Vec<Value>> {
    let mut texts: Vec<Option<String>> = Vec::new();
    let mut objects = Vec::new();
    for event in events.try_iter()? {
        let event = event?;
        if let Ok(text) = event.extract::<String>() {
            texts.push(Some(text));
        } else if let Ok(bytes) = event.extract::<Vec<u8>>() {
            texts.push(Some(String::from_utf8_lossy(&bytes).into_owned()));
        } else {
            texts.push(None);
            objects.push(event);
        }
    }
    // The dicts through one json.dumps of them all (not one call each).
    let mut dumped = if objects.is_empty() {
        Vec::new()
    } else {
        match crate::py_to_json(py, PyList::new(py, objects)?.as_any())? {
            Value::Array(values) => values,
            _ => Vec::new(),
        }
    }
    .into_iter();
    Ok(texts
        .into_iter()
        .map(|t| match t {
            // A line that is not JSON stays a string: the deduplicator reports it invalid.
            Some(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
            None => dumped.next().unwrap_or(Value::Null),
        })
        .collect())
}

/// The fingerprint of a batch of events (JSON text or dicts), byte-equal to the seed's
/// Python service and to `idem fingerprint`.
#[pyfunction]
fn fingerprint(py: Python<'_>, events: &Bound<'_, PyAny>) -> PyResult<String> {
    let mut lines = Vec::new();
    for event in events.try_iter()? {
        let event = event?;
        lines.push(match event.extract::<String>() {
            Ok(text) => text,
            Err(_) => crate::py_to_json(py, &event)?.to_string(),
        });
    }
    py.allow_threads(|| idem::events::fingerprint_json(lines.iter()))
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// One event's verdict at the gate.
#[pyclass(module = "pyidem._idem", frozen)]
pub struct Verdict {
    /// `new`, `replay`, `conflict`, or `invalid` (no key or fingerprint could be taken).
    #[pyo3(get)]
    verdict: &'static str,
    /// The event's key (`None` when invalid).
    #[pyo3(get)]
    key: Option<String>,
    /// Whether the event goes on (new, unverified, or any valid one under `log_only`).
    #[pyo3(get)]
    passes: bool,
    /// Whether the store was asked (false for a `best_effort` fallback).
    #[pyo3(get)]
    verified: bool,
    /// Why the event is invalid.
    #[pyo3(get)]
    error: Option<String>,
    /// For a replay: the decision recorded for the key (`Gate.record`), if any.
    decision: Option<Value>,
    /// Not seen from Python: the gate that gave the verdict (`Gate::id`) and, for a key
    /// that gate marked, what `Gate.confirm` and `Gate.release` need.
    gate: u64,
    confirm: Option<Option<DateTime<Utc>>>,
    pending_batch: Option<idem::events::strategy::BatchRef>,
    marked_at: Option<DateTime<Utc>>,
}

impl Verdict {
    /// The admission this verdict came from, as `EventGate::confirm` and `release` take it.
    fn admission(&self) -> Option<Admission> {
        let key = self.key.clone()?;
        (self.verdict == "new" && self.verified).then_some(Admission {
            key,
            verdict: Some(EventVerdict::New),
            passes: true,
            confirm: self.confirm,
            pending_batch: self.pending_batch,
            marked_at: self.marked_at,
        })
    }
}

#[pymethods]
impl Verdict {
    fn __str__(&self) -> &'static str {
        self.verdict
    }

    fn __repr__(&self) -> String {
        format!(
            "idem.Verdict({:?}, key={:?}, passes={})",
            self.verdict, self.key, self.passes
        )
    }

    /// For a replay: the decision recorded with the key by `Gate.record` (JSON), or
    /// `None`.
    #[getter]
    fn decision(&self, py: Python<'_>) -> PyResult<PyObject> {
        match &self.decision {
            Some(d) => to_py(py, d),
            None => Ok(py.None()),
        }
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match other.extract::<String>() {
            Ok(s) => s == self.verdict,
            Err(_) => other
                .downcast::<Verdict>()
                .map(|o| {
                    let o = o.get();
                    o.verdict == self.verdict && o.key == self.key
                })
                .unwrap_or(false),
        }
    }
}
/// An idempotency gate over one namespace of an event-key store (SQLite, Postgres,
/// Redis, memory): what `idem gate` does, one batch per call.
#[pyclass(module = "pyidem._idem", frozen)]
pub struct Gate {
    store: Py<Store>,
    namespace: String,
    spec: GateSpec,
    /// The gate on the store's current generation (made again after a fork, with a new
    /// id: verdicts from before the fork belong to the parent's gate).
    state: Mutex<GateState>,
}

/// What a gate is made from, kept to make it again after a fork.
struct GateSpec {
    keys: Vec<String>,
    fingerprint: ContentHashExtractor,
    ttl: Ttl,
    strategy: Strategy,
    pending: Option<Duration>,
}

struct GateState {
    generation: u64,
    /// Tells this gate's verdicts from another's (`Gate.confirm`, `Gate.release`).
    id: u64,
    gate: Arc<EventGate>,
}

/// The next `Gate::id`.
static GATE_IDS: AtomicU64 = AtomicU64::new(1);

fn fields(what: &str, list: Vec<String>) -> PyResult<Vec<String>> {
    if list.is_empty() || list.iter().any(|f| f.trim().is_empty()) {
        return Err(PyValueError::new_err(format!(
            "{what}: give at least one field, none empty"
        )));
    }
    Ok(list)
}

/// A TTL: `"never"` (or `None`), or a duration longer than 0.
fn ttl_arg(what: &str, value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    let Some(value) = value else {
        return Ok(None);
    };
    if value.is_none() {
        return Ok(None);
    }
    if let Ok(text) = value.extract::<String>() {
        if matches!(text.trim(), "never" | "none") {
            return Ok(None);
        }
    }
    let d = duration_arg(what, value)?;
    if d.is_zero() {
        return Err(PyValueError::new_err(format!(
            "{what}: must be longer than 0 (or \"never\")"
        )));
    }
    Ok(Some(d))
}

impl GateSpec {
    fn build(&self, py: Python<'_>, store: &Store, namespace: &str) -> PyResult<(u64, EventGate)> {
        let (generation, opened) = store.current(py)?;
        let dedup = Deduplicator::new(opened.event_keys(), namespace, &self.keys)
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .fingerprint(Some(self.fingerprint.clone()))
            .ttl(self.ttl.clone());
        let mut gate = EventGate::new(dedup, self.strategy, BreakerConfig::default());
        if let Some(d) = self.pending {
            gate = gate.pending(d);
        }
        Ok((generation, gate))
    }
}

/// The verdicts of one gate among `verdicts`, as admissions (keys it marked new, each
/// once); `ValueError` for a verdict of another gate.
fn admissions_of(
    verdicts: &Bound<'_, PyAny>,
    gate: u64,
    what: &str,
) -> PyResult<Vec<Result<Admission, InvalidEvent>>> {
    let mut admissions = Vec::new();
    let mut seen = HashSet::new();
    for v in verdicts.try_iter()? {
        let v = v?;
        let v = v
            .downcast::<Verdict>()
            .map_err(|_| {
                PyTypeError::new_err(format!("{what} takes the Verdicts of check_and_mark"))
            })?
            .get();
        if v.gate != gate {
            return Err(PyValueError::new_err(format!(
                "{what}: a verdict of another gate, or of this one before a fork ({what} on the gate that gave it)"
            )));
        }
        let Some(a) = v.admission() else {
            continue;
        };
        // The same verdict passed twice counts once.
        if seen.insert((a.pending_batch.map(|b| b.n), a.marked_at, a.key.clone())) {
            admissions.push(Ok(a));
        }
    }
    Ok(admissions)
}

#[pymethods]
impl Gate {
    /// `key`: the field(s) naming an event (dotted paths; several are joined with `:`).
    /// The fingerprint that tells a replay from a conflict is the payload without the key
    /// fields, or `fingerprint_fields` only, or without `exclude_fields` too. `ttl`:
    /// `"never"` (default) or a duration (`"7d"`, seconds, a `datetime.timedelta`);
    /// `ttl_by_type` a TTL per value of `type_field`. `strategy`: `strict` (a store
    /// error raises), `best_effort` (events pass unverified) or `log_only` (every valid
    /// event passes; duplicates are counted). `pending_timeout`: see `confirm`.
    #[new]
    #[pyo3(
        signature = (store, namespace, key, *, fingerprint_fields=None, exclude_fields=None, normalize_amounts=None, ttl=None, ttl_by_type=None, type_field="event_type".to_string(), strategy="strict".to_string(), pending_timeout=None),
        text_signature = "(store, namespace, key, *, fingerprint_fields=None, exclude_fields=None, normalize_amounts=None, ttl='never', ttl_by_type=None, type_field='event_type', strategy='strict', pending_timeout=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        store: Py<Store>,
        namespace: String,
        key: &Bound<'_, PyAny>,
        fingerprint_fields: Option<Vec<String>>,
        exclude_fields: Option<Vec<String>>,
        normalize_amounts: Option<Vec<String>>,
        ttl: Option<&Bound<'_, PyAny>>,
        ttl_by_type: Option<HashMap<String, Bound<'_, PyAny>>>,
        type_field: String,
        strategy: String,
        pending_timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let keys: Vec<String> = match key.extract::<String>() {
            Ok(k) => k.split(',').map(|f| f.trim().to_string()).collect(),
            Err(_) => key.extract()?,
        };
        let keys = fields("key", keys)?;
        if namespace.is_empty() || namespace.chars().any(char::is_control) {
            return Err(PyValueError::new_err(
                "namespace: give printable text, not empty",
            ));
        }
        let strategy: Strategy = strategy.parse().map_err(|_| {
            PyValueError::new_err(format!(
                "strategy={strategy:?}: expected \"strict\", \"best_effort\" or \"log_only\""
            ))
        })?;
        let bad = |e: idem::Error| PyValueError::new_err(e.to_string());
        let mut fingerprint = ContentHashExtractor::new();
        fingerprint = match (fingerprint_fields, exclude_fields) {
            (Some(only), _) => fingerprint
                .include(fields("fingerprint_fields", only)?)
                .map_err(bad)?,
            (None, Some(without)) => {
                let mut all = keys.clone();
                all.extend(fields("exclude_fields", without)?);
                fingerprint.exclude(all).map_err(bad)?
            }
            (None, None) => fingerprint.exclude(&keys).map_err(bad)?,
        };
        if let Some(amounts) = normalize_amounts {
            fingerprint = fingerprint
                .normalize_amounts(fields("normalize_amounts", amounts)?)
                .map_err(bad)?;
        }
        let default = ttl_arg("ttl", ttl)?;
        let ttl = match ttl_by_type {
            None => match default {
                None => Ttl::never(),
                Some(d) => Ttl::fixed(d),
            },
            Some(by_type) => {
                let mut map = HashMap::new();
                for (t, d) in by_type {
                    map.insert(t, ttl_arg("ttl_by_type", Some(&d))?);
                }
                Ttl::per_type(&type_field, default, map).map_err(bad)?
            }
        };
        let spec = GateSpec {
            keys,
            fingerprint,
            ttl,
            strategy,
            pending: ttl_arg("pending_timeout", pending_timeout)?,
        };
        let (generation, gate) = spec.build(py, store.get(), &namespace)?;
        Ok(Gate {
            store,
            namespace,
            spec,
            state: Mutex::new(GateState {
                generation,
                id: GATE_IDS.fetch_add(1, Ordering::Relaxed),
                gate: Arc::new(gate),
            }),
        })
    }

    /// The namespace.
    #[getter]
    fn namespace(&self) -> String {
        self.namespace.clone()
    }

    /// Checks and marks a batch (JSON texts or dicts) in one store round trip, the GIL
    /// released: one `Verdict` per event, in order. With `pending_timeout`, the new keys
    /// are marked pending: pass the verdicts to `confirm` once the events are handled.
    /// If handling them fails, pass them to `release` (or use `batch`, which does both).
    fn check_and_mark(&self, py: Python<'_>, events: &Bound<'_, PyAny>) -> PyResult<Vec<Verdict>> {
        let events = events_of(py, events)?;
        let (id, gate) = self.current(py)?;
        crate::log::refresh(py);
        let admitted = py
            .allow_threads(|| {
                runtime()
                    .block_on(async move { gate.check_and_mark(&events, chrono::Utc::now()).await })
            })
            .map_err(to_py_err)?;
        Ok(admitted
            .into_iter()
            .map(|a| match a {
                Ok(a) => Verdict {
                    verdict: a.verdict_name(),
                    verified: a.verified(),
                    passes: a.passes,
                    decision: match &a.verdict {
                        Some(EventVerdict::Replay { decision, .. }) => decision.clone(),
                        _ => None,
                    },
                    key: Some(a.key),
                    error: None,
                    gate: id,
                    confirm: a.confirm,
                    pending_batch: a.pending_batch,
                    marked_at: a.marked_at,
                },
                Err(e) => Verdict {
                    verdict: "invalid",
                    key: None,
                    passes: false,
                    verified: false,
                    error: Some(e.to_string()),
                    decision: None,
                    gate: id,
                    confirm: None,
                    pending_batch: None,
                    marked_at: None,
                },
            })
            .collect())
    }

    /// Confirms the pending marks (`pending_timeout`) of the new keys among `verdicts`
    /// (what `check_and_mark` calls of this gate returned), once their events are handled,
    /// the GIL released: how many keys were confirmed. 0 without pending marks. Verdicts
    /// of another gate raise `ValueError`.
    fn confirm(&self, py: Python<'_>, verdicts: &Bound<'_, PyAny>) -> PyResult<u64> {
        let (id, gate) = self.current(py)?;
        let admissions = admissions_of(verdicts, id, "confirm")?;
        let confirmations = gate.confirmations(&admissions);
        if confirmations.is_empty() {
            return Ok(0);
        }
        crate::log::refresh(py);
        py.allow_threads(|| runtime().block_on(gate.confirm_keys(confirmations)))
            .map_err(to_py_err)
    }

    /// Takes back the marks of the new keys among `verdicts` (what `check_and_mark` calls
    /// of this gate returned), when handling their events failed: their next delivery is
    /// `new` again, on this gate and any other, at once. A mark made since by another
    /// gate (after this one expired) stays. Call it instead of `confirm`, not after. How
    /// many marks were taken back; the GIL released. Verdicts of another gate raise
    /// `ValueError`.
    fn release(&self, py: Python<'_>, verdicts: &Bound<'_, PyAny>) -> PyResult<u64> {
        let (id, gate) = self.current(py)?;
        let admissions = admissions_of(verdicts, id, "release")?;
        if admissions.is_empty() {
            return Ok(0);
        }
        crate::log::refresh(py);
        py.allow_threads(|| runtime().block_on(gate.release(&admissions)))
            .map_err(to_py_err)
    }

    /// A context manager for one batch: checks and marks `events` on entry and gives the
    /// verdicts; on a normal exit confirms them (`confirm`), on an exception releases
    /// them (`release`) and lets the exception go on, so the batch's events are `new`
    /// again at their next delivery:
    ///
    ///     with gate.batch(events) as verdicts:
    ///         handle([e for e, v in zip(events, verdicts) if v.passes])
    fn batch(slf: Py<Self>, events: PyObject) -> GateBatch {
        GateBatch {
            gate: slf,
            events,
            verdicts: Mutex::new(None),
        }
    }

    /// Stores `decision` (a JSON value) with the key of `verdict` (a `new` verdict of
    /// this gate, once its event is handled): what later replays of the key carry as
    /// `Verdict.decision`. `False` when the key is not marked (released, or expired).
    fn record(
        &self,
        py: Python<'_>,
        verdict: &Bound<'_, Verdict>,
        decision: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let v = verdict.get();
        let (id, gate) = self.current(py)?;
        if v.gate != id {
            return Err(PyValueError::new_err(
                "record: a verdict of another gate, or of this one before a fork",
            ));
        }
        let Some(key) = v.key.clone() else {
            return Err(PyValueError::new_err(
                "record: an invalid event's verdict has no key",
            ));
        };
        let decision = to_json_or_err(decision, "decision")?;
        crate::log::refresh(py);
        py.allow_threads(|| runtime().block_on(gate.record_decision(&key, &decision)))
            .map_err(to_py_err)
    }

    /// The events of the batch that pass (new ones), in order. With `pending_timeout`,
    /// nothing confirms their marks: use `check_and_mark` and `confirm` instead.
    fn filter<'py>(
        &self,
        py: Python<'py>,
        events: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let items: Vec<Bound<'py, PyAny>> = events.try_iter()?.collect::<PyResult<_>>()?;
        let verdicts = self.check_and_mark(py, PyList::new(py, &items)?.as_any())?;
        Ok(items
            .into_iter()
            .zip(verdicts)
            .filter(|(_, v)| v.passes)
            .map(|(e, _)| e)
            .collect())
    }

    /// The counters since the gate was made (checked, new, replays, conflicts, invalid,
    /// fallbacks, store errors, latencies), as a dict.
    fn stats(&self, py: Python<'_>) -> PyResult<PyObject> {
        let (_, gate) = self.current(py)?;
        let stats =
            serde_json::to_value(gate.stats()).map_err(|e| IdemError::new_err(e.to_string()))?;
        to_py(py, &stats)
    }

    fn __repr__(&self) -> String {
        format!("pyidem.Gate(namespace={:?})", self.namespace)
    }
}

impl Gate {
    /// This gate's id and its `EventGate` on the store as this process may use it.
    fn current(&self, py: Python<'_>) -> PyResult<(u64, Arc<EventGate>)> {
        let (generation, _) = self.store.get().current(py)?;
        {
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.generation == generation {
                return Ok((state.id, state.gate.clone()));
            }
        }
        let (generation, gate) = self.spec.build(py, self.store.get(), &self.namespace)?;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.generation != generation {
            *state = GateState {
                generation,
                id: GATE_IDS.fetch_add(1, Ordering::Relaxed),
                gate: Arc::new(gate),
            };
        }
        Ok((state.id, state.gate.clone()))
    }
}

/// `Gate.batch(events)`: checks and marks on entry; confirms on a normal exit, releases
/// on an exception.
#[pyclass(module = "pyidem._idem", frozen)]
pub struct GateBatch {
    gate: Py<Gate>,
    events: PyObject,
    verdicts: Mutex<Option<Py<PyList>>>,
}

#[pymethods]
impl GateBatch {
    fn __enter__(&self, py: Python<'_>) -> PyResult<Py<PyList>> {
        let verdicts = self.gate.get().check_and_mark(py, self.events.bind(py))?;
        let list = PyList::new(
            py,
            verdicts
                .into_iter()
                .map(|v| Py::new(py, v))
                .collect::<PyResult<Vec<_>>>()?,
        )?
        .unbind();
        *self.verdicts.lock().unwrap_or_else(|e| e.into_inner()) = Some(list.clone_ref(py));
        Ok(list)
    }

    /// Confirms (no exception) or releases (an exception, which goes on); the exception
    /// of a failed release is raised, the handler's as its context.
    #[pyo3(signature = (*exc))]
    fn __exit__(&self, py: Python<'_>, exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        let Some(verdicts) = self
            .verdicts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return Ok(false);
        };
        let failed = exc.get_item(0).map(|t| !t.is_none()).unwrap_or(false);
        let gate = self.gate.get();
        if failed {
            gate.release(py, verdicts.bind(py).as_any())?;
        } else {
            gate.confirm(py, verdicts.bind(py).as_any())?;
        }
        Ok(false)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fingerprint, m)?)?;
    m.add_class::<Gate>()?;
    m.add_class::<GateBatch>()?;
    m.add_class::<Verdict>()?;
    Ok(())
}
