//! `os.fork()` while other threads of the process are inside SQLite.
//!
//! A child made by `fork()` has one thread, and every lock as it was at that instant: a
//! SQLite connection worker of the parent holding one of SQLite's process-wide mutexes
//! (the allocator's, the file-lock table's) leaves it held forever in the child, whose
//! first SQLite call (opening its store again) then waits forever. So, as the C library
//! does for `malloc`, the forking thread takes every one of those mutexes just before the
//! fork (`os.register_at_fork(before=…)`, in `pyidem/__init__.py`) and both processes
//! release them just after. They are taken all or none with `sqlite3_mutex_try` and tried
//! again, so the forking thread never waits while holding one (no lock-order deadlock);
//! SQLite's threads do not need the GIL to let them go.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use libsqlite3_sys as ffi;
use pyo3::prelude::*;

/// The mutexes taken before the fork (addresses), released after it.
static HELD: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// SQLite's static mutexes: `SQLITE_MUTEX_STATIC_MAIN` (2) to `SQLITE_MUTEX_STATIC_VFS3`
/// (13).
const STATIC_MUTEXES: std::ops::RangeInclusive<i32> = 2..=13;

/// How long the forking thread tries before forking without them.
const PATIENCE: Duration = Duration::from_secs(5);

#[pyfunction]
pub(crate) fn _before_fork() {
    crate::log::suspend(true);
    let started = Instant::now();
    loop {
        let mut taken: Vec<*mut ffi::sqlite3_mutex> = Vec::new();
        let mut all = true;
        for id in STATIC_MUTEXES {
            // SAFETY: SQLite's public mutex API on its own static mutexes (allocating one
            // initialises SQLite if need be; a null pointer is skipped).
            let m = unsafe { ffi::sqlite3_mutex_alloc(id) };
            if m.is_null() || taken.contains(&m) {
                continue;
            }
            // SAFETY: as above; `try` never waits.
            if unsafe { ffi::sqlite3_mutex_try(m) } == ffi::SQLITE_OK {
                taken.push(m);
            } else {
                all = false;
                break;
            }
        }
        if all {
            *HELD.lock().unwrap_or_else(|e| e.into_inner()) =
                taken.into_iter().map(|m| m as usize).collect();
            return;
        }
        for m in taken.into_iter().rev() {
            // SAFETY: taken by this thread just above.
            unsafe { ffi::sqlite3_mutex_leave(m) };
        }
        if started.elapsed() > PATIENCE {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// After the fork, in the parent and in the child (where the forking thread is the one
/// thread left, and holds them still).
#[pyfunction]
pub(crate) fn _after_fork() {
    let held = std::mem::take(&mut *HELD.lock().unwrap_or_else(|e| e.into_inner()));
    for m in held.into_iter().rev() {
        // SAFETY: taken by this thread in `_before_fork`.
        unsafe { ffi::sqlite3_mutex_leave(m as *mut ffi::sqlite3_mutex) };
    }
    crate::log::suspend(false);
}
