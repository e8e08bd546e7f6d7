//! `pyidem._idem`: the native half of the Python package (`python/pyidem/` is the other).
//!
//! * [`job`]: processors, run through the Rust library's own [`idem::Runner`], and
//!   [`outcome`]: what their bodies return and describe;
//! * [`events`]: the event gate (`idem gate`'s, batch by batch);
//! * [`store`]: open stores, safe across `os.fork()`;
//! * [`convert`]: Python values ↔ JSON, refusing what JSON cannot hold;
//! * [`log`]: the library's `tracing` events to Python's `logging`;
//! * [`fork`]: SQLite's process-wide locks around `os.fork()`.

use pyo3::create_exception;
use pyo3::exceptions::{PyBaseException, PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::Value;

mod convert;
mod events;
mod fork;
mod job;
mod log;
mod outcome;
mod store;

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
    "Raised in the main thread on SIGTERM while a run is in progress (pyidem installs the handler for the run's duration)."
);

/// The module's Tokio runtime, made again in a forked child (a runtime does not survive
/// `fork`; the stores opened before the fork are opened again there, see [`store`]).
///
/// Lock-free ([`PerProcess`](idem::per_process::PerProcess)): callers come here with the
/// GIL released (inside `allow_threads`), so a lock taken here could be held by another
/// thread at the instant the main thread forks, and stay held for good in the child, whose
/// first call would then wait forever (a `std::sync::Mutex` here did that under load:
/// `test_forking_while_another_thread_uses_sqlite`). The parent's runtime, copied into a
/// child, is never dropped there.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: idem::per_process::PerProcess<tokio::runtime::Runtime> =
        idem::per_process::PerProcess::new(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("pyidem")
                .enable_all()
                .build()
                .expect("a Tokio runtime")
        });
    RT.get()
}

pub(crate) fn to_py_err(e: idem::Error) -> PyErr {
    if e.is_store_failure() {
        StoreError::new_err(e.to_string())
    } else {
        IdemError::new_err(e.to_string())
    }
}

/// Python object → JSON through `json.dumps(default=str)`: the gate's events, whose
/// keys and fingerprints were always taken that way (a `datetime` as `str()` gives it).
pub(crate) fn py_to_json(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    let kwargs = PyDict::new(py);
    kwargs.set_item("default", py.get_type::<pyo3::types::PyString>())?;
    let text: String = py
        .import("json")?
        .call_method("dumps", (obj,), Some(&kwargs))?
        .extract()?;
    serde_json::from_str(&text).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// `pyidem.scope_key(processor, scope)`: the scope key the ledger writes on success.
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
    m.add_class::<store::Store>()?;
    m.add_class::<job::Run>()?;
    m.add_class::<job::NativeJob>()?;
    m.add_class::<outcome::PyOutcome>()?;
    m.add_class::<outcome::PyContent>()?;
    m.add_function(wrap_pyfunction!(store::open_store, m)?)?;
    m.add_function(wrap_pyfunction!(scope_key, m)?)?;
    events::register(m)?;
    fork::install();
    // The exceptions as the package exports them (`pyidem.StoreError`): so they pickle
    // (a worker process's error reaches a `multiprocessing` parent).
    for name in ["IdemError", "StoreError", "Terminated"] {
        m.getattr(name)?.setattr("__module__", "pyidem")?;
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    log::install(py);
    Ok(())
}
