//! Python values ↔ JSON, without `json.dumps(default=str)`: a value JSON cannot hold is an
//! error naming where it is (`output["stats"]["ratio"]: nan is not JSON`), never its
//! `str()` (`'<Thing object at 0x…>'`).
//!
//! What converts: `None`, `bool`, `int` (within 64 bits), finite `float`, `str`, dicts
//! with `str` keys, lists and tuples; and, as ISO 8601 text, `datetime.datetime` (an aware
//! one keeps its UTC offset), `datetime.date` and `datetime.time`; `uuid.UUID` as its
//! text. Anything else (NaN, ±inf, `set`, `bytes`, `Decimal`, other objects, non-`str`
//! keys) is refused.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use serde_json::{Map, Number, Value};

/// Why a value is not JSON: where (`["a"][0]`, after the caller's name) and what.
#[derive(Debug)]
pub(crate) struct NotJson {
    pub(crate) path: String,
    pub(crate) reason: String,
    /// A type JSON has no place for (`TypeError`), rather than a value out of range
    /// (`ValueError`: NaN, a huge int).
    pub(crate) wrong_type: bool,
}

impl NotJson {
    /// `what["a"][0]: reason`.
    pub(crate) fn message(&self, what: &str) -> String {
        format!("{what}{}: {}", self.path, self.reason)
    }

    /// A `TypeError` (a type JSON has no place for) or `ValueError` (NaN, a huge int).
    pub(crate) fn into_err(self, what: &str) -> PyErr {
        let message = self.message(what);
        if self.wrong_type {
            PyTypeError::new_err(message)
        } else {
            PyValueError::new_err(message)
        }
    }
}

/// The `datetime` and `uuid` types, looked up once.
struct Types {
    datetime: Py<PyType>,
    date: Py<PyType>,
    time: Py<PyType>,
    uuid: Py<PyType>,
}

fn types(py: Python<'_>) -> PyResult<&Types> {
    static TYPES: GILOnceCell<Types> = GILOnceCell::new();
    TYPES.get_or_try_init(py, || {
        let datetime = py.import("datetime")?;
        let get = |m: &Bound<'_, PyModule>, name: &str| -> PyResult<Py<PyType>> {
            Ok(m.getattr(name)?.downcast_into::<PyType>()?.unbind())
        };
        Ok(Types {
            datetime: get(&datetime, "datetime")?,
            date: get(&datetime, "date")?,
            time: get(&datetime, "time")?,
            uuid: get(&py.import("uuid")?, "UUID")?,
        })
    })
}

/// `obj` as JSON, or where and why it is not.
pub(crate) fn to_json(obj: &Bound<'_, PyAny>) -> Result<Value, NotJson> {
    let mut path = String::new();
    convert(obj, &mut path, 0)
}

/// [`to_json`], a Python error naming `what` when the value is not JSON.
pub(crate) fn to_json_or_err(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    to_json(obj).map_err(|e| e.into_err(what))
}

/// Nesting deeper than this is refused (a structure that refers to itself).
const MAX_DEPTH: usize = 200;

fn not_json(path: &str, reason: impl Into<String>) -> NotJson {
    NotJson {
        path: path.to_string(),
        reason: reason.into(),
        wrong_type: false,
    }
}

fn wrong_type(path: &str, reason: impl Into<String>) -> NotJson {
    NotJson {
        wrong_type: true,
        ..not_json(path, reason)
    }
}

fn convert(obj: &Bound<'_, PyAny>, path: &mut String, depth: usize) -> Result<Value, NotJson> {
    if depth > MAX_DEPTH {
        return Err(not_json(
            path,
            format!("nested more than {MAX_DEPTH} levels deep (does it contain itself?)"),
        ));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.downcast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(s) = obj.downcast::<PyString>() {
        return s
            .to_cow()
            .map(|s| Value::String(s.into_owned()))
            .map_err(|_| not_json(path, "a str that is not valid UTF-8 (lone surrogates)"));
    }
    if obj.is_instance_of::<PyInt>() {
        if let Ok(n) = obj.extract::<i64>() {
            return Ok(Value::from(n));
        }
        if let Ok(n) = obj.extract::<u64>() {
            return Ok(Value::from(n));
        }
        return Err(not_json(
            path,
            format!("{} does not fit in 64 bits", repr(obj)),
        ));
    }
    if let Ok(f) = obj.downcast::<PyFloat>() {
        let v = f.value();
        return Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| not_json(path, format!("{} is not JSON (NaN or infinite)", repr(obj))));
    }
    if let Ok(d) = obj.downcast::<PyDict>() {
        let mut map = Map::with_capacity(d.len());
        for (k, v) in d.iter() {
            let Ok(key) = k.downcast::<PyString>().map(|k| k.to_string()) else {
                return Err(wrong_type(
                    path,
                    format!(
                        "key {} ({}): JSON object keys are str",
                        repr(&k),
                        type_name(&k)
                    ),
                ));
            };
            let len = path.len();
            path.push_str(&format!("[{key:?}]"));
            let value = convert(&v, path, depth + 1)?;
            path.truncate(len);
            map.insert(key, value);
        }
        return Ok(Value::Object(map));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let mut items = Vec::new();
        for (i, item) in obj
            .try_iter()
            .map_err(|_| not_json(path, "unreadable"))?
            .enumerate()
        {
            let item = item.map_err(|e| not_json(path, e.to_string()))?;
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            items.push(convert(&item, path, depth + 1)?);
            path.truncate(len);
        }
        return Ok(Value::Array(items));
    }
    let py = obj.py();
    if let Ok(t) = types(py) {
        let is = |ty: &Py<PyType>| obj.is_instance(ty.bind(py)).unwrap_or(false);
        // datetime before date: a datetime is a date.
        if is(&t.datetime) || is(&t.date) || is(&t.time) {
            return obj
                .call_method0("isoformat")
                .and_then(|s| s.extract::<String>())
                .map(Value::String)
                .map_err(|e| not_json(path, e.to_string()));
        }
        if is(&t.uuid) {
            return obj
                .str()
                .map(|s| Value::String(s.to_string()))
                .map_err(|e| not_json(path, e.to_string()));
        }
    }
    Err(wrong_type(
        path,
        format!("a {} is not JSON ({})", type_name(obj), repr(obj)),
    ))
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "value".into())
}

/// A short `repr()` for messages.
fn repr(obj: &Bound<'_, PyAny>) -> String {
    let text = obj
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "?".into());
    if text.chars().count() > 60 {
        format!("{}…", text.chars().take(60).collect::<String>())
    } else {
        text
    }
}

/// JSON → Python (`dict`, `list`, `str`, `int`, `float`, `bool`, `None`).
pub(crate) fn to_py(py: Python<'_>, value: &Value) -> PyResult<PyObject> {
    Ok(match value {
        Value::Null => py.None(),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any().unbind(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any().unbind()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any().unbind()
            } else {
                n.as_f64()
                    .unwrap_or(f64::NAN)
                    .into_pyobject(py)?
                    .into_any()
                    .unbind()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any().unbind(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any().unbind()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, v) in map {
                dict.set_item(k, to_py(py, v)?)?;
            }
            dict.into_any().unbind()
        }
    })
}
