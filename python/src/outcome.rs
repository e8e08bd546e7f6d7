//! What a processor body returns (`Outcome`) and what a describe function returns
//! (`Content`, whose key is the content hash guard's).

use idem::Content;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value;

use crate::convert::to_json_or_err;

/// A record count: an `int` from 0 to 2**63-1.
pub(crate) fn records_of(value: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    if value.is_instance_of::<pyo3::types::PyBool>()
        || !value.is_instance_of::<pyo3::types::PyInt>()
    {
        return Err(PyTypeError::new_err(format!(
            "{what}: give a count of records (an int), not {}",
            value.get_type().name()?
        )));
    }
    match value.extract::<i64>() {
        Ok(n) if n >= 0 => Ok(n),
        _ => Err(PyValueError::new_err(format!(
            "{what}={}: a count of records is from 0 to 2**63-1",
            value.repr()?
        ))),
    }
}

/// What a body returns: records processed and an optional JSON output for the ledger.
#[pyclass(name = "Outcome", module = "pyidem._idem", frozen)]
pub struct PyOutcome {
    #[pyo3(get)]
    pub(crate) records: i64,
    #[pyo3(get)]
    pub(crate) output: Option<PyObject>,
}

#[pymethods]
impl PyOutcome {
    /// `records`: how many records the run processed (an int from 0 to 2**63-1).
    /// `output`: a JSON value kept in the ledger (dicts with str keys, lists, str, int,
    /// finite float, bool, None; dates and times as ISO 8601 text, UUIDs as text).
    #[new]
    #[pyo3(signature = (records=None, output=None))]
    fn new(records: Option<&Bound<'_, PyAny>>, output: Option<PyObject>) -> PyResult<Self> {
        let records = match records {
            None => 0,
            Some(r) => records_of(r, "records")?,
        };
        Ok(PyOutcome { records, output })
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let output = match &self.output {
            Some(o) => o.bind(py).repr().map(|r| r.to_string()).unwrap_or_default(),
            None => "None".into(),
        };
        format!("pyidem.Outcome(records={}, output={output})", self.records)
    }
}

/// The content a run would consume, for the content hash guard: entity ids (any order),
/// rows (any order), a source checksum, other fields.
#[pyclass(name = "Content", module = "pyidem._idem", frozen)]
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
                Some(to_json_or_err(list.as_any(), "rows")?)
            }
        };
        let fields = match fields {
            None => Value::Object(Default::default()),
            Some(f) => to_json_or_err(f.as_any(), "Content")?,
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
    fn key(&self, processor: &str, scope: &str, hash: &str, version: &str) -> PyResult<String> {
        let algorithm: idem::HashAlgorithm = hash.parse().map_err(|_| {
            PyValueError::new_err(format!("hash={hash:?}: expected \"sha256\" or \"md5\""))
        })?;
        Ok(self
            .to_content()
            .key_with_version(processor, scope, version, algorithm))
    }
}

impl PyContent {
    pub(crate) fn to_content(&self) -> Content {
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
        content
    }
}
