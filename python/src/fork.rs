//! `os.fork()` while other threads of the process are inside SQLite.
//!
//! A child made by `fork()` has one thread, and every lock as it was at that instant: a
//! SQLite connection worker of the parent holding one of SQLite's process-wide mutexes
//! (the allocator's, the file-lock table's) leaves it held forever in the child, whose
//! first SQLite call (opening its store again) then waits forever. So, as the C library
//! does for `malloc`, the forking thread takes every one of those mutexes just before the
//! fork and both processes release them just after, in `pthread_atfork` handlers: they
//! run inside `fork()` itself, after Python's own `os.register_at_fork` hooks and before
//! any Python code runs again, so the GIL cannot pass to a thread that would then wait
//! for one of those mutexes (which a Python-level hook allowed: a deadlock). The mutexes
//! are taken all or none with `sqlite3_mutex_try` and tried again, so the forking thread
//! never waits while holding one (no lock-order deadlock); SQLite's threads do not need
//! the GIL to let them go.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use libsqlite3_sys as ffi;

/// SQLite's static mutexes: `SQLITE_MUTEX_STATIC_MAIN` (2) to `SQLITE_MUTEX_STATIC_VFS3`
/// (13).
const FIRST: i32 = 2;
const LAST: i32 = 13;
const COUNT: usize = (LAST - FIRST + 1) as usize;

/// The mutexes taken before the fork (addresses; 0: none), released after it. Atomics,
/// not a lock: a lock held by another thread at the fork would itself be copied held.
static HELD: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];

/// How long the forking thread tries before forking without them. Only a thread that
/// keeps one of them for good would make it give up; until then it forks as soon as it
/// holds all of them, so a long patience costs nothing. 5 s was short of what a busy
/// 2-core machine can need (CI, 2026-11-27, under two test streams and a build: a child
/// of `test_forking_while_another_thread_uses_sqlite` hung, and this or the runtime's lock
/// in `runtime()` was held at its fork).
const PATIENCE: Duration = Duration::from_secs(30);

extern "C" fn before_fork() {
    crate::log::suspend(true);
    let started = Instant::now();
    loop {
        let mut taken = 0;
        let mut all = true;
        for id in FIRST..=LAST {
            // SAFETY: SQLite's public mutex API on its own static mutexes (allocating one
            // initialises SQLite if need be; a null pointer is skipped).
            let m = unsafe { ffi::sqlite3_mutex_alloc(id) };
            if m.is_null()
                || HELD[..taken]
                    .iter()
                    .any(|h| h.load(Ordering::Relaxed) == m as usize)
            {
                continue;
            }
            // SAFETY: as above; `try` never waits.
            if unsafe { ffi::sqlite3_mutex_try(m) } == ffi::SQLITE_OK {
                HELD[taken].store(m as usize, Ordering::Relaxed);
                taken += 1;
            } else {
                all = false;
                break;
            }
        }
        if all {
            return;
        }
        release();
        if started.elapsed() > PATIENCE {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Releases what `before_fork` took (in the child, the forking thread is the one thread
/// left, and holds them still).
fn release() {
    for slot in HELD.iter().rev() {
        let m = slot.swap(0, Ordering::Relaxed);
        if m != 0 {
            // SAFETY: taken by this thread in `before_fork`.
            unsafe { ffi::sqlite3_mutex_leave(m as *mut ffi::sqlite3_mutex) };
        }
    }
}

extern "C" fn after_fork() {
    release();
    crate::log::suspend(false);
}

/// Installs the handlers, once per process (a flag, not a `Once`: no static of the
/// package is a lock, see [`idem::per_process`]).
pub(crate) fn install() {
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if !INSTALLED.swap(true, Ordering::SeqCst) {
        // SAFETY: registering plain `extern "C"` functions that touch only atomics and
        // SQLite's mutexes.
        unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork)) };
    }
}
