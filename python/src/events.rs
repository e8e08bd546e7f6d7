//! The event API: `fingerprint(events)` and `Gate.check_and_mark(events)`, the same
//! deduplicator and strategies as `idem gate`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use idem::events::dedup::{Deduplicator, Ttl};
use idem::events::strategy::{Admission, EventGate, Strategy};
use idem::events::ContentHashExtractor;
use idem::model::duration::parse_duration_field;
use idem::store::{BreakerConfig, EventKeyStore, EventVerdict};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;
use serde_json::Value;

use crate::{json_to_py, runtime, to_py_err, IdemError, Store};

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
#[pyclass(module = "idem._idem", frozen)]
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
    /// Not seen from Python: the gate that gave the verdict (`Gate::id`) and, for a key
    /// that gate marked pending, what `Gate.confirm` needs (`Admission::confirm`, the
    /// expiry confirming gives it, and `Admission::pending_batch`).
    gate: u64,
    confirm: Option<Option<DateTime<Utc>>>,
    pending_batch: Option<idem::events::strategy::BatchRef>,
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
#[pyclass(module = "idem._idem", frozen)]
pub struct Gate {
    gate: Arc<EventGate>,
    namespace: String,
    /// Tells this gate's verdicts from another's (`Gate.confirm`).
    id: u64,
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

fn duration_or_never(what: &str, text: &str) -> PyResult<Option<std::time::Duration>> {
    if matches!(text.trim(), "never" | "none") {
        return Ok(None);
    }
    let d = parse_duration_field(what, text).map_err(|e| PyValueError::new_err(e.to_string()))?;
    if d.is_zero() {
        return Err(PyValueError::new_err(format!(
            "{what} must be longer than 0 (or \"never\")"
        )));
    }
    Ok(Some(d))
}

#[pymethods]
impl Gate {
    /// `key`: the field(s) naming an event (dotted paths; several are joined with `:`).
    /// The fingerprint that tells a replay from a conflict is the payload without the key
    /// fields, or `fingerprint_fields` only, or without `exclude_fields` too. `ttl`:
    /// `"never"` (default) or a duration; `ttl_by_type` a TTL per value of `type_field`.
    /// `strategy`: `strict` (a store error raises), `best_effort` (events pass
    /// unverified) or `log_only` (every valid event passes; duplicates are counted).
    #[new]
    #[pyo3(signature = (store, namespace, key, *, fingerprint_fields=None, exclude_fields=None, normalize_amounts=None, ttl="never".to_string(), ttl_by_type=None, type_field="event_type".to_string(), strategy="strict".to_string(), pending_timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        store: &Store,
        namespace: String,
        key: &Bound<'_, PyAny>,
        fingerprint_fields: Option<Vec<String>>,
        exclude_fields: Option<Vec<String>>,
        normalize_amounts: Option<Vec<String>>,
        ttl: String,
        ttl_by_type: Option<HashMap<String, String>>,
        type_field: String,
        strategy: String,
        pending_timeout: Option<String>,
    ) -> PyResult<Self> {
        let keys: Vec<String> = match key.extract::<String>() {
            Ok(k) => k.split(',').map(|f| f.trim().to_string()).collect(),
            Err(_) => key.extract()?,
        };
        let keys = fields("key", keys)?;
        if namespace.is_empty() || namespace.chars().any(char::is_control) {
            return Err(PyValueError::new_err(
                "namespace must be printable text, not empty",
            ));
        }
        let strategy: Strategy = strategy
            .parse()
            .map_err(|e: idem::Error| PyValueError::new_err(e.to_string()))?;
        let bad = |e: idem::Error| PyValueError::new_err(e.to_string());
        let mut spec = ContentHashExtractor::new();
        spec = match (fingerprint_fields, exclude_fields) {
            (Some(only), _) => spec
                .include(fields("fingerprint_fields", only)?)
                .map_err(bad)?,
            (None, Some(without)) => {
                let mut all = keys.clone();
                all.extend(fields("exclude_fields", without)?);
                spec.exclude(all).map_err(bad)?
            }
            (None, None) => spec.exclude(&keys).map_err(bad)?,
        };
        if let Some(amounts) = normalize_amounts {
            spec = spec
                .normalize_amounts(fields("normalize_amounts", amounts)?)
                .map_err(bad)?;
        }
        let default = duration_or_never("ttl", &ttl)?;
        let ttl = match ttl_by_type {
            None => match default {
                None => Ttl::never(),
                Some(d) => Ttl::fixed(d),
            },
            Some(by_type) => {
                let mut map = HashMap::new();
                for (t, d) in by_type {
                    map.insert(t, duration_or_never("ttl_by_type", &d)?);
                }
                Ttl::per_type(&type_field, default, map).map_err(bad)?
            }
        };
        let url = store.url.clone();
        let opened: Arc<dyn EventKeyStore> = py
            .allow_threads(|| runtime().block_on(idem::store::open_event_keys(&url)))
            .map_err(to_py_err)?;
        let dedup = Deduplicator::new(opened, &namespace, &keys)
            .map_err(bad)?
            .fingerprint(Some(spec))
            .ttl(ttl);
        let mut gate = EventGate::new(dedup, strategy, BreakerConfig::default());
        if let Some(p) = pending_timeout {
            if let Some(d) = duration_or_never("pending_timeout", &p)? {
                gate = gate.pending(d);
            }
        }
        Ok(Gate {
            gate: Arc::new(gate),
            namespace,
            id: GATE_IDS.fetch_add(1, Ordering::Relaxed),
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
    fn check_and_mark(&self, py: Python<'_>, events: &Bound<'_, PyAny>) -> PyResult<Vec<Verdict>> {
        let events = events_of(py, events)?;
        let gate = self.gate.clone();
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
                    key: Some(a.key),
                    error: None,
                    gate: self.id,
                    confirm: a.confirm,
                    pending_batch: a.pending_batch,
                },
                Err(e) => Verdict {
                    verdict: "invalid",
                    key: None,
                    passes: false,
                    verified: false,
                    error: Some(e.to_string()),
                    gate: self.id,
                    confirm: None,
                    pending_batch: None,
                },
            })
            .collect())
    }

    /// Confirms the pending marks (`pending_timeout`) of the new keys among `verdicts`
    /// (what `check_and_mark` calls of this gate returned), once their events are handled,
    /// the GIL released: how many keys were confirmed. 0 without pending marks. Verdicts
    /// of another gate raise `ValueError`.
    fn confirm(&self, py: Python<'_>, verdicts: &Bound<'_, PyAny>) -> PyResult<u64> {
        let mut admissions = Vec::new();
        let mut seen = HashSet::new();
        for v in verdicts.try_iter()? {
            let v = v?;
            let v = v
                .downcast::<Verdict>()
                .map_err(|_| PyTypeError::new_err("confirm takes the Verdicts of check_and_mark"))?
                .get();
            if v.gate != self.id {
                return Err(PyValueError::new_err(
                    "confirm: a verdict of another gate (confirm on the gate that gave it)",
                ));
            }
            let (Some(key), Some(_), Some(batch)) = (&v.key, v.confirm, v.pending_batch) else {
                continue;
            };
            // The same verdict passed twice is confirmed once.
            if !seen.insert((batch, key.clone())) {
                continue;
            }
            admissions.push(Ok(Admission {
                key: key.clone(),
                verdict: Some(EventVerdict::New),
                passes: true,
                confirm: v.confirm,
                pending_batch: v.pending_batch,
            }));
        }
        let confirmations = self.gate.confirmations(&admissions);
        if confirmations.is_empty() {
            return Ok(0);
        }
        let gate = self.gate.clone();
        py.allow_threads(|| runtime().block_on(gate.confirm_keys(confirmations)))
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
        let stats = serde_json::to_value(self.gate.stats())
            .map_err(|e| IdemError::new_err(e.to_string()))?;
        json_to_py(py, &stats)
    }

    fn __repr__(&self) -> String {
        format!("idem.Gate(namespace={:?})", self.namespace)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fingerprint, m)?)?;
    m.add_class::<Gate>()?;
    m.add_class::<Verdict>()?;
    Ok(())
}
